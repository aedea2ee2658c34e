"""Which API batch a lost intent became, told by what identifies a batch: the custom ids it holds.

A run that dies around `batches.create` (or loses its answer) leaves an intent without a batch id.
Anthropic's `batches.list` shows each batch's id, creation time, status and request counts, nothing of what it
holds; its custom ids, each starting with the intent that sent it (`batch.custom_id_of`), show only in its
results, once it has ended. (An OpenAI batch names its intent in its metadata: `BatchInfo.intent` says whose it
is at once, ended or not.) Size and time alone once matched an intent to another intent's batch of the
same size, the rightful intent was given up and its rows were paid twice. So here:

- an ended batch is read: the intent its custom ids name owns it, even when another intent adopted it on a
  guess (it is handed over); a batch naming no intent of the store is someone else's, never adopted;
- a batch still processing is only a candidate for the intents that could have made it (as many requests,
  made after them and not hours later, never rejected by them): they are held, neither given up nor
  matched, until it ends and says whose it is, except when it is the only batch one intent could own and
  that intent the only one (of the whole store) that could own it: then it is adopted at once and checked
  when it ends;
- an intent is given up only when no batch that could be its own is unaccounted for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from llmledger._exec.batch_api import BatchApi, BatchInfo
from llmledger._ledger.types import BatchRecord

CLOCK_SLACK = timedelta(minutes=10)  # how far this machine's clock may be from the API's
CREATE_WINDOW = timedelta(hours=3)  # an intent's create (retries, timeouts, looks) is over well within this: a
# batch made later is not its own, so a stream of others' batches of its size cannot hold it forever


class Undecided(Exception):
    """A batch that could be the intent's is still processing and could as well be another intent's."""


@dataclass
class Reading:
    """What the API's batches say about the store's unsettled intents (keyed by intent)."""

    own: dict[str, str] = field(default_factory=dict)  # the batch whose custom ids name the intent
    guessed: dict[str, str] = field(default_factory=dict)  # the one processing batch only it could own
    held: dict[str, list[str]] = field(default_factory=dict)  # batches still open to doubt that could be its
    # an intent in none of these: the API has no batch that could be its own


def tag_of(custom_id: str) -> str:
    """The intent a custom id was sent by (`<intent>-<fingerprint>[-<n>]`)."""
    return custom_id.partition("-")[0]


def could_own(intent: BatchRecord, batch: BatchInfo) -> bool:
    """Whether `batch` may be the one `intent` meant to create, from what `batches.list` shows."""
    return (
        batch.requests == intent.requests
        and batch.id not in intent.rejected
        and intent.created_at - CLOCK_SLACK <= batch.created <= intent.created_at + CREATE_WINDOW + CLOCK_SLACK
    )


class Reconciler:
    """Reads the API's batches for a collector; remembers whose each ended batch is (that never changes)."""

    def __init__(self, api: BatchApi) -> None:
        self.api = api
        self.tags: dict[str, frozenset[str]] = {}  # ended batch → the intents its custom ids name

    async def read(self, lost: list[BatchRecord], unsettled: list[BatchRecord], known: set[str]) -> Reading:
        """Whose are the batches that could be `lost`'s (intents of one step to settle)?

        `unsettled`: every intent of the store still waiting for its batch and every batch adopted on a guess
        (`Ledger.unsettled_batches`); `known`: every batch id the store has. Raises the API's error when the
        batches cannot be listed; a batch whose results cannot be read stays in doubt.
        """
        reading = Reading()
        if not lost:
            return reading
        waiting = {b.intent: b for b in unsettled if b.batch_id is None} | {b.intent: b for b in lost}
        guessed = {b.batch_id for b in unsettled if b.batch_id is not None}
        since = min(b.created_at for b in lost) - CLOCK_SLACK
        in_doubt: list[BatchInfo] = []
        async for batch in self.api.list():
            if batch.created < since:
                break
            if batch.id in known and batch.id not in guessed:
                continue  # some intent's for sure
            if batch.intent is not None:  # it says whose it is (OpenAI's metadata), even before it counts its requests
                owner = waiting.get(batch.intent)
                if owner is not None and batch.id not in owner.rejected:
                    reading.own[owner.intent] = batch.id
                continue
            if not any(could_own(i, batch) for i in waiting.values()):
                continue
            tags = await self._tags(batch) if batch.ended else None
            if tags is None:  # processing, or its results could not be read: it may be anyone's
                in_doubt.append(batch)
                continue
            owner = next((waiting[t] for t in sorted(tags) if t in waiting), None)
            if owner is not None:  # whatever holds it now (a guess), it is this intent's
                reading.own[owner.intent] = batch.id
            # else: the intent that adopted it (checked when merged), or another store's or app's batch
        for intent in lost:
            if intent.intent in reading.own:
                continue
            mine = [b for b in in_doubt if could_own(intent, b)]
            if not mine:
                continue
            claimants = [i.intent for i in waiting.values() if i.intent not in reading.own and could_own(i, mine[0])]
            if len(mine) == 1 and mine[0].id not in guessed and claimants == [intent.intent]:
                reading.guessed[intent.intent] = mine[0].id
            else:  # more than one intent could own it, or it more than one batch: wait for the custom ids
                reading.held[intent.intent] = [b.id for b in mine]
        return reading

    async def _tags(self, batch: BatchInfo) -> frozenset[str] | None:
        """The intents an ended batch's custom ids name; None when its results cannot be read now."""
        if batch.id not in self.tags:
            try:
                self.tags[batch.id] = frozenset([tag_of(item.custom_id) async for item in self.api.results(batch.id)])
            except Exception:  # a download cut short, the API's error: the batch stays in doubt, read it next time
                return None
        return self.tags[batch.id]
