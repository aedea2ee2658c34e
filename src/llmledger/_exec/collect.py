"""The batch collector: what any run of a step does with the step's Message Batches, in any process.

`collect` looks at every batch of the step the store has not merged yet:
an intent never confirmed (its process died around `batches.create`) is
looked for with `batches.list` and confirmed, or given up when the API never
got it; a batch that has ended has its results merged, matched by custom id.
`wait` does that until nothing is processing. Which batch is whose is told by
the custom ids in its results (`reconcile.py`): a batch adopted on a guess
while processing is only taken as the intent's once its results carry the
intent's custom ids; otherwise it is rejected (and handed to the intent they
name, if any), so neither another intent's batch nor another store's of the
same size is ever mistaken for ours.

Merging an ended batch (a result row per answer, priced at the batch rate)
is `merge.py`'s, mixed into `BatchCollector`.
Failures to reach the API here never fail a run: the batch is looked at
again next time, and its results stay with the API meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import polars as pl

from llmledger._exec.apis import batch_api_for
from llmledger._exec.config import RunConfig
from llmledger._exec.merge import BatchMerger
from llmledger._exec.reconcile import Reading, Reconciler, Undecided
from llmledger._ledger import Ledger
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.liveness import is_abandoned, is_alive_here
from llmledger._ledger.states import Outcome
from llmledger._ledger.types import BatchRecord
from llmledger._report import RunReport
from llmledger._step.apis import shape_of
from llmledger._step.output import OutputSpec
from llmledger._time import utcnow

log = logging.getLogger("llmledger")

POLL_FIRST, POLL_MAX = 2.0, 60.0  # seconds between looks at a processing batch: growing to a minute
POLL_CANCELLED = 0.25  # and at a batch just asked to cancel, growing the same way
ABANDON_AFTER = timedelta(seconds=20)  # an intent not found is given up only this long after it was made: a
# create the dead process had sent may still be being made
GIVE_UP_AFTER = 5  # failed looks in a row after which waiting for a batch stops (it says why, and what to do)


class BatchCollector(BatchMerger):
    def __init__(
        self,
        *,
        ledger: Ledger,
        table: str,
        step: str,
        cfg: RunConfig,
        client: Any,  # an anthropic.AsyncAnthropic, or an openai.AsyncOpenAI
        report: RunReport,
        stop_flag: threading.Event,
        version: str | None = None,
        output_model: Any = None,
        on_progress: Callable[[RunReport, int], None] | None = None,
        stale_after: timedelta = timedelta(minutes=30),
        run_id: str | None = None,
    ) -> None:
        self.ledger, self.table, self.step, self.cfg = ledger, table, step, cfg
        self.run_id = run_id  # the run's row in llmledger_runs takes each merged batch's figures as it commits
        self.api = batch_api_for(client, cfg.api)
        self.report, self.stop_flag, self.on_progress, self.stale_after = report, stop_flag, on_progress, stale_after
        self.version, self.output_model = version, output_model  # apply_llm's definition: its pydantic model
        self.returned: list[pl.DataFrame] = []  # keys of rows batches gave back during this run
        self.mine: set[str] = set()  # intents this run sent (the sender adds them)
        self.alone: set[str] = set()  # fingerprints whose entry a pack did not answer: sent again alone
        self.stuck: set[str] = set()  # batches no amount of waiting will merge (the API lost them; held)
        self.failures: Counter[str] = Counter()  # failed looks in a row, per intent
        self.due: float | None = None  # seconds until the next unfound intent may be given up
        self.reconciler = Reconciler(self.api)

    @property
    def stopped(self) -> bool:
        return self.stop_flag.is_set() or self.report.outcome not in (Outcome.RUNNING, Outcome.PREPARING)

    def output_for(self, version: str, output: OutputSpec | None) -> OutputSpec | None:
        """The output spec answers to `version` are checked with: with apply_llm's pydantic model when current."""
        if output is not None and self.output_model is not None and version == self.version:
            return dataclasses.replace(output, model=self.output_model)
        return output

    async def collect(self) -> list[BatchRecord]:
        """Settle unconfirmed intents, merge every ended batch; return the batches still open."""
        self.due = None
        open_batches, foreign = await self._by_source()
        intents = [b for b in open_batches if b.batch_id is None]
        if intents:
            await self._settle(intents)
            open_batches, foreign = await self._by_source()
        still = list(foreign)
        for record in open_batches:
            if self.stopped or record.batch_id is None or not await self._merge_if_ended(record):
                still.append(record)
        self.report.in_batches = sum(b.rows for b in still if b not in foreign)  # another endpoint's: its own note
        return still

    async def _by_source(self) -> tuple[list[BatchRecord], list[BatchRecord]]:
        """The step's open batches sent where this run sends (to settle and merge), and those sent elsewhere.

        Only a client of the source a batch was sent to can find or read it, and its answers are that source's.
        A simulated batch met by a run against the API is given up (its rows go back as they were, unpaid: a
        simulated answer is never kept for such a run); another endpoint's is left for a run against it."""
        mine, foreign = [], []
        for record in await asyncio.to_thread(self.ledger.open_batches, self.table, self.step):
            if record.provider != self.api.provider:  # the step moved to another provider: its API keeps it
                foreign.append(record)
                self._leave(
                    record,
                    f"went to {shape_of(record.provider).own_api}'s batch API, and this run "
                    "sends to the other provider's: a run of the step on a model of that provider collects it "
                    "(its answers are kept then; they are paid for)",
                )
            elif record.source is None or record.source == self.cfg.source:
                mine.append(record)
            elif record.source == SIMULATOR:
                await self._give_back(
                    record,
                    "sent to the simulator; a run against the API does not keep simulated answers",
                    confirmed=record.batch_id is not None,
                )
            else:
                foreign.append(record)
                self._leave(
                    record,
                    f"was sent to {record.source}; a run against that endpoint collects it (or take its rows out "
                    "with llmledger.reset)",
                )
        return mine, foreign

    def _leave(self, record: BatchRecord, why: str) -> None:
        """Leave a batch this run cannot read to a run that can: not waited for, said once."""
        if record.intent not in self.stuck:
            self.stuck.add(record.intent)
            self._note(f"batch {record.batch_id or record.intent} ({record.rows:,} rows) {why}")

    def waiting_on(self, open_batches: list[BatchRecord]) -> bool:
        """Whether any of these batches is worth waiting for (not lost by the API, not held for validate=)."""
        return any(b.intent not in self.stuck for b in open_batches)

    async def wait(self, open_batches: list[BatchRecord], *, cancel_at: float | None = None) -> int:
        """Poll until the step has no batch processing (or the run is stopped); merge each as it ends.

        `open_batches`: what `collect` just returned, so the first look is not taken twice. `cancel_at` (a Unix
        time): a deadline's last moment for batches; then the API is asked to cancel those still processing (what
        they finished is merged, the rest comes back in `returned`, unpaid) and the wait goes on until they end.
        Returns how many batches were asked to cancel.
        """
        delay, cancelled = POLL_FIRST, 0
        while not self.stopped and self.waiting_on(open_batches):
            due = self.due  # an unfound intent about to be given up: look again just then
            if cancel_at is not None and not cancelled:  # and wake at the batches' last moment
                left = max(0.0, cancel_at - time.time())
                due = left if due is None else min(due, left)
            await asyncio.to_thread(self.stop_flag.wait, delay if due is None else min(delay, due + 0.05))
            delay = min(delay * 1.5, POLL_MAX)
            if cancel_at is not None and not cancelled and time.time() >= cancel_at and not self.stopped:
                cancelled = await self._cancel(open_batches)
                delay = POLL_CANCELLED  # a cancel ends a batch soon: its rows are wanted online
            open_batches = await self.collect()
        return cancelled

    async def _cancel(self, open_batches: list[BatchRecord]) -> int:
        """Ask the API to cancel each of these batches it has (an unconfirmed intent has none yet: its batch, if
        made, ends in its time and is merged by a later call); how many it was asked for."""
        asked = 0
        for record in open_batches:
            if record.batch_id is None or record.provider != self.api.provider:
                continue
            try:
                await self.api.cancel(record.batch_id)
                asked += 1
            except self.api.error as exc:  # ended meanwhile, or the API failed: it is merged as it ends
                log.info("could not cancel batch %s: %s", record.batch_id, exc)
        return asked

    # -- intents ------------------------------------------------------------------------------------
    async def _settle(self, intents: list[BatchRecord]) -> None:
        """Match each intent whose run is gone to its API batch (`reconcile.py`); give up one only when no batch
        that could be its own is unaccounted for, and not before ABANDON_AFTER (its create may be under way)."""
        now = utcnow()
        lost = [
            b
            for b in intents
            if b.intent in self.mine
            or is_abandoned(b.claimant)
            or (not is_alive_here(b.claimant) and now - b.created_at > self.stale_after)
        ]
        if not lost:
            return
        try:
            reading, unsettled = await self._read(lost)
        except self.api.error as exc:  # try again next time; the rows wait
            self._failed(lost, f"could not list batches to settle {len(lost)} unconfirmed one(s): {exc}")
            return
        await self._hand_over(reading.own, unsettled)
        for intent in lost:
            if intent.intent in reading.held:  # a batch that could be its own is processing: wait for its results
                log.info(
                    "intent %s waits for batch(es) %s to end to tell whose they are",
                    intent.intent,
                    ", ".join(reading.held[intent.intent]),
                )
            if intent.intent in reading.own or intent.intent in reading.held:
                continue  # confirmed just now, or waiting for a batch that could be its own to end
            batch_id = reading.guessed.get(intent.intent)
            if batch_id is not None:
                await asyncio.to_thread(
                    self.ledger.confirm_batch,
                    self.table,
                    self.step,
                    intent=intent.intent,
                    batch_id=batch_id,
                    now=utcnow(),
                    adopted=True,
                )
            elif now - intent.created_at < ABANDON_AFTER:  # it may still be being made
                left = (ABANDON_AFTER - (now - intent.created_at)).total_seconds()
                self.due = left if self.due is None else min(self.due, left)
            else:
                await self._give_back(
                    intent, "the API has no batch for this intent: the run stopped before sending it", confirmed=False
                )

    async def find(self, intent: str) -> str | None:
        """The API batch an intent of this run became, if the API has it (after an ambiguous create). Raises the
        API's error when it cannot be told, and `Undecided` while a batch that could be its own is processing
        and could as well be another intent's (the collector settles it once its custom ids show)."""
        mine = [
            b for b in await asyncio.to_thread(self.ledger.open_batches, self.table, self.step) if b.intent == intent
        ]
        if not mine or mine[0].batch_id is not None:  # another run found it meanwhile, by its custom ids
            return mine[0].batch_id if mine else None
        reading, unsettled = await self._read(mine)
        if intent in reading.own:
            await self._hand_over({intent: reading.own[intent]}, unsettled, confirm=False)
            return reading.own[intent]
        if intent in reading.held:
            raise Undecided(
                f"batch {intent}: its create may have gone through, and {len(reading.held[intent])} "
                "batch(es) still processing could be it or another's; it is matched by its custom "
                "ids once they end"
            )
        return reading.guessed.get(intent)

    async def _read(self, lost: list[BatchRecord]) -> tuple[Reading, list[BatchRecord]]:
        unsettled = await self._unsettled()
        known = await asyncio.to_thread(self.ledger.known_batch_ids)
        return await self.reconciler.read(lost, unsettled, known), unsettled

    async def _hand_over(self, own: dict[str, str], unsettled: list[BatchRecord], *, confirm: bool = True) -> None:
        """Each intent gets the batch its custom ids show is its own (any step's: its collector merges it),
        taken from an intent that adopted it on a guess."""
        waiting = {b.intent: b for b in unsettled if b.batch_id is None}
        for intent, batch_id in own.items():
            for holder in [b for b in unsettled if b.batch_id == batch_id and b.intent != intent]:
                await asyncio.to_thread(
                    self.ledger.reject_batch,
                    holder,
                    note=f"{batch_id} holds the custom ids of intent {intent}: handed to it",
                )
            record = waiting.get(intent)
            if confirm and record is not None:
                await asyncio.to_thread(
                    self.ledger.confirm_batch,
                    record.table,
                    record.step,
                    intent=intent,
                    batch_id=batch_id,
                    now=utcnow(),
                    adopted=True,
                )

    def _failed(self, records: list[BatchRecord], message: str) -> None:
        """A look at these batches failed; after GIVE_UP_AFTER in a row, waiting for them stops."""
        for record in records:
            self.failures[record.intent] += 1
            if self.failures[record.intent] >= GIVE_UP_AFTER:
                self.stuck.add(record.intent)
                self._note(
                    f"{message} ({GIVE_UP_AFTER} times in a row); its rows stay as they are and the next "
                    "call of the step looks again. If it never works (the API no longer has the results), "
                    f'llmledger.reset(store, {self.table!r}, {self.step!r}, where="{self.step}_batch_id = '
                    f"'{record.batch_id}'\") takes the rows out of it to be sent again"
                )
        log.info(message)

    def _note(self, message: str) -> None:
        """Something about a batch the user should know (shown with the run's summary), once."""
        log.info(message)
        if message not in self.report.notes:
            self.report.notes.append(message)
