"""The batch sender: claimed rows go to the provider's batch API (Anthropic's Message Batches, OpenAI's Batch
API: `batch_api.py`) at half the online price.

`BatchSender.submit` claims the selected rows and sends one request per
distinct request (rows with identical requests share it, also with a batch
still processing from an earlier call), in batches within the API's limits.
Each batch passes through the ledger's intent → confirm transactions
(`_ledger/batches.py`), so a batch the API took is never lost: a custom id
carries the intent and the fingerprint of the request it answers. What comes
back is merged by `BatchCollector` (`collect.py`, `merge.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import polars as pl

from llmledger._exec.apis import batch_api_for
from llmledger._exec.batch_requests import PACK_SUFFIX, Request, chunks
from llmledger._exec.client import CallFailed, Kind, known_reply
from llmledger._exec.config import RunConfig
from llmledger._exec.pacing import backoff
from llmledger._exec.reconcile import Undecided
from llmledger._exec.recorder import Recorder
from llmledger._ledger import Ledger, Selection
from llmledger._ledger.columns import RESULT_SCHEMA
from llmledger._ledger.liveness import Claimant
from llmledger._ledger.states import Outcome
from llmledger._report import RunReport
from llmledger._step.output import OutputSpec
from llmledger._time import utcnow

log = logging.getLogger("llmledger")

MAX_REQUESTS = 100_000  # the largest batch any API takes (Anthropic's; OpenAI's is half: `batch_api.py`)
AUTO_BATCH_ROWS = 10_000  # mode="auto" sends this many rows or more as batches
CLAIM_ROWS = 200_000  # rows one round claims at most when they are packed (a full batch of packs is more)
CREATE_TRIES = 6
AMBIGUOUS_STATUS = {500, 502, 503, 504}  # the API may have created the batch before failing
LOOKS = (2.0, 4.0, 8.0)  # seconds before each look for a batch whose create may have gone through


def custom_id_of(intent: str, fingerprint: str, n: int | None) -> str:
    """`<intent>-<fingerprint hex>[-<n>]`: at most 53 characters of [A-Za-z0-9_-], unique in its batch.

    The fingerprint of the request sent travels in the custom id, so a result is recorded as the
    answer to exactly that request even if the row's request was rendered anew while the batch ran.
    """
    return f"{intent}-{uuid.UUID(fingerprint).hex}" + ("" if n is None else f"-{n}")


def fingerprint_of(custom_id: str) -> str:
    return str(uuid.UUID(custom_id.split("-")[1]))


def result_frame(results: list[dict[str, Any]], key_types: dict[str, pl.DataType]) -> pl.DataFrame:
    schema = key_types | RESULT_SCHEMA
    return pl.from_dicts(results, schema=schema) if results else pl.DataFrame(schema=schema)


class BatchSender:
    def __init__(
        self,
        *,
        ledger: Ledger,
        cfg: RunConfig,
        client: Any,  # an anthropic.AsyncAnthropic, or an openai.AsyncOpenAI
        claimant: Claimant,
        report: RunReport,
        stop_flag: threading.Event,
        output: OutputSpec | None,
        find: Callable[[str], Any],
        mine: set[str],
        alone: set[str] | None = None,
        batch_size: int = MAX_REQUESTS,
        on_progress: Callable[[RunReport, int], None] | None = None,
    ) -> None:
        self.ledger, self.cfg, self.claimant = ledger, cfg, claimant
        self.api = batch_api_for(client, cfg.api)
        self.report, self.stop_flag, self.output, self.find = report, stop_flag, output, find
        self.mine = mine  # the intents this run sent, shared with the collector
        self.alone = set() if alone is None else alone  # fingerprints a pack did not answer: asked alone (the
        # collector adds them as it merges, so the rows it gives back go alone in the next round)
        self.batch_size, self.on_progress = min(batch_size, self.api.max_requests), on_progress

    @property
    def stopped(self) -> bool:
        return self.stop_flag.is_set() or self.report.outcome not in (Outcome.RUNNING, Outcome.PREPARING)

    async def submit(self, selection: Selection) -> None:
        """Claim every selected row and send it; rows with a stored identical answer reuse it, rows whose
        request is in a batch still processing join that batch."""
        recorder = Recorder(selection=selection, cfg=self.cfg, report=self.report, output=self.output)
        layout = selection.layout
        pending = {
            fingerprint_of(cid): (cid, bid)
            for cid, bid in (
                await asyncio.to_thread(self.ledger.requests_in_batches, layout.table, layout.step)
            ).items()
        }
        claim = min(self.batch_size * selection.rows_per_request, max(self.batch_size, CLAIM_ROWS))  # `batch_size`
        while selection.remaining > 0 and not self.stopped:  # counts requests: a pack is one
            rows = await asyncio.to_thread(
                self.ledger.claim,
                selection,
                claim,
                claimant=str(self.claimant),
                now=utcnow(),
            )
            known = selection.known
            reused = [r for r in rows if r["fingerprint"] in known]
            if reused:  # answered already (another step, another table): nothing to send or pay
                results = [recorder.result(r, known_reply(known[r["fingerprint"]]), None, reused=True) for r in reused]
                await asyncio.to_thread(
                    self.ledger.commit, selection, result_frame(results, selection.key_types), now=utcnow()
                )
            rest = [r for r in rows if r["fingerprint"] not in known]
            if self.cfg.dedupe and pending:
                rest = await self._attach(selection, rest, pending)
            unsendable: list[tuple[dict[str, Any], str]] = []
            batches = chunks(
                rest,
                selection,
                self.batch_size,
                max_bytes=self.api.max_bytes,
                dedupe=self.cfg.dedupe,
                files=self.cfg.attachments,
                unsendable=unsendable,
                alone=self.alone,
            )  # one batch's bodies in memory at a time (files: their bytes)
            while not self.stopped and (chunk := await asyncio.to_thread(next, batches, None)) is not None:
                sent = await self._send(selection, chunk)
                if sent is not None and self.cfg.dedupe:
                    pending.update({fp: (custom_id_of(sent[0], fp, None), sent[1]) for r in chunk for fp, _ in r.items})
            for row, error in unsendable:  # a file not as its request recorded it: the row goes back as it was
                self.report.unsent += 1
                self.report.unsent_why = error
                recorder.note_error(error, row)
        await asyncio.to_thread(self.ledger.release, selection, claimant=str(self.claimant))

    async def _attach(
        self, selection: Selection, rows: list[dict[str, Any]], pending: dict[str, tuple[str, str]]
    ) -> list[dict[str, Any]]:
        """Rows whose request a processing batch holds join it; returns the rows still to send."""
        by_batch: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            if row["fingerprint"] in pending:
                custom_id, batch_id = pending[row["fingerprint"]]
                by_batch.setdefault(batch_id, []).append(
                    {**{k: row[k] for k in selection.layout.key}, "custom_id": custom_id}
                )
        joined: set[str] = set()
        for batch_id, keys in by_batch.items():
            assigned = pl.from_dicts(keys, schema={**selection.key_types, "custom_id": pl.String})
            n = await asyncio.to_thread(
                self.ledger.attach_to_batch,
                selection.layout,
                assigned,
                batch_id=batch_id,
                claimant=str(self.claimant),
                validated=self.cfg.validate is not None,
                source=self.cfg.source,
            )
            if n:
                joined.update(k["custom_id"] for k in keys)
                self.mine.add(batch_id)
                self._count_sent(n)
            else:  # that batch is merged by now: forget it
                for fp in [fp for fp, (_, b) in pending.items() if b == batch_id]:
                    del pending[fp]
        return [r for r in rows if r["fingerprint"] not in pending or pending[r["fingerprint"]][0] not in joined]

    async def _send(self, selection: Selection, chunk: list[Request]) -> tuple[str, str] | None:
        """One batch: the intent, the API call, the confirmation. Returns (intent, batch id) once confirmed."""
        intent = "b" + uuid.uuid4().hex[:12]
        self.mine.add(intent)
        layout = selection.layout
        requests: list[dict[str, Any]] = []
        keys: list[Any] = []
        packs: list[dict[str, Any]] = []
        n = 0  # without dedupe, rows asking the same are told apart by their place
        for request in chunk:
            custom_ids = []
            for fingerprint, rows in request.items:
                custom_id = custom_id_of(intent, fingerprint, None if self.cfg.dedupe else n)
                n += 1
                custom_ids.append(custom_id)
                keys.extend({**{k: r[k] for k in layout.key}, "custom_id": custom_id} for r in rows)
            if request.pack is None:
                requests.append(self.api.line(custom_ids[0], request.body))
            else:
                pack_id = uuid.uuid4()
                requests.append(self.api.line(f"{intent}-{pack_id.hex}{PACK_SUFFIX}", request.body))
                packs.append(self._pack_record(selection, request, str(pack_id), requests[-1], custom_ids))
        assigned = pl.from_dicts(keys, schema={**selection.key_types, "custom_id": pl.String})
        size = sum(len(json.dumps(r)) for r in requests)
        await asyncio.to_thread(
            self.ledger.begin_batch,
            layout,
            assigned,
            intent=intent,
            claimant=str(self.claimant),
            requests=len(requests),
            size=size,
            model=chunk[0].body["model"],
            version=selection.version,
            validated=self.cfg.validate is not None,
            now=utcnow(),
            source=self.cfg.source,
            packs=packs,
            deadline=None
            if self.cfg.deadline is None
            else datetime.fromtimestamp(self.cfg.deadline, UTC).replace(tzinfo=None),
        )
        created = await self._create(requests, intent, layout.table, layout.step)
        if created is None:
            return None
        batch_id, found = created
        sent = await asyncio.to_thread(
            self.ledger.confirm_batch,
            layout.table,
            layout.step,
            intent=intent,
            batch_id=batch_id,
            now=utcnow(),
            adopted=found,
        )
        if sent is None:  # another run gave the intent up meanwhile (only after stale_after): say so
            self.report.note_error(
                f"batch {batch_id} was created after its intent {intent} was given up; its "
                "rows were sent again, so its answers are not used"
            )
            return None
        self.report.batches += 1
        self.report.batch_requests += len(requests)
        self._count_sent(sent)
        return intent, batch_id

    def _pack_record(
        self, selection: Selection, request: Request, pack_id: str, line: dict[str, Any], custom_ids: list[str]
    ) -> dict[str, Any]:
        """A pack's record for `llmledger_packs` as it is sent (its answer is added when the batch is merged)."""
        key = selection.layout.key
        keys = [r[key[0]] if len(key) == 1 else [r[k] for k in key] for _, (r, *_) in request.items]
        return {
            "pack_id": pack_id,
            "table_name": selection.layout.table,
            "step": selection.layout.step,
            "run_id": self.claimant.run_id,
            "rows": len(request.items),
            "row_keys": json.dumps(keys, ensure_ascii=False, default=str),
            "request": json.dumps(request.body, ensure_ascii=False),
            "model": request.body.get("model"),
            "custom_id": line["custom_id"],
            "custom_ids": json.dumps(custom_ids),
        }

    def _count_sent(self, rows: int) -> None:
        self.report.submitted += rows
        self.report.batch_pending += rows
        if self.on_progress:
            self.on_progress(self.report, 0)

    async def _create(
        self, requests: list[dict[str, Any]], intent: str, table: str, step: str
    ) -> tuple[str, bool] | None:
        """The batch's create call(s), retried on the API's transient errors: (batch id, whether it was found by
        looking), or None when it did not happen (rows given back) or cannot be told (left to the next call).

        A failure that may have come after the API created the batch (a dropped connection, a gateway's
        5xx) is followed by looking for it. The batch is created again only when every look succeeded and
        found nothing that could be it; a batch found is checked against its custom ids when it ends
        (`merge.py`). While a batch that could be it (or another intent's) is processing, the intent is
        left as it is, its rows RUNNING: the collector matches it once the custom ids show.
        """
        failure: CallFailed | None = None
        for tries in range(CREATE_TRIES):
            try:
                return await self.api.create(requests, intent), False
            except (self.api.connection_error, self.api.status_error) as exc:
                failure = self.api.classify(exc)
                ambiguous = isinstance(exc, self.api.connection_error) or (
                    getattr(exc, "status_code", None) in AMBIGUOUS_STATUS
                )
            if failure.kind is not Kind.TRANSIENT:
                await self._refused(intent, failure, table, step)
                return None
            self.report.retries += 1
            if ambiguous:
                for delay in LOOKS:
                    await asyncio.sleep(delay)
                    try:
                        found = await self.find(intent)
                    except Undecided as exc:  # a batch that may be this one is processing: never a second one
                        log.info("%s", exc)  # the intent stays; the collector matches it by its custom ids
                        return None
                    except self.api.error as exc:  # cannot tell: never risk a second batch
                        self._stop(
                            Outcome.OUTAGE,
                            f"could not tell whether the API took batch {intent} "
                            f"({failure}; then {exc}); the next call of the step looks "
                            "for it again, and sends its rows only if the API has not",
                        )
                        return None
                    if found:
                        return str(found), True
            else:
                await asyncio.sleep(
                    backoff(
                        tries,
                        base=self.cfg.retry.base_delay,
                        cap=self.cfg.retry.max_delay,
                        retry_after=failure.retry_after,
                    )
                )
        assert failure is not None
        await self._refused(intent, failure, table, step)
        return None

    async def _refused(self, intent: str, failure: CallFailed, table: str, step: str) -> None:
        await asyncio.to_thread(
            self.ledger.abandon_batch, table, step, intent=intent, note=f"not created: {failure}", now=utcnow()
        )
        outcome = failure.stop or (Outcome.OUTAGE if failure.kind is Kind.TRANSIENT else Outcome.ERROR)
        self._stop(
            outcome,
            f"the API did not take the batch ({failure}); its rows are as they were. Run the same call again to retry.",
        )
        return None

    def _stop(self, outcome: Outcome, message: str) -> None:
        if not self.stopped:
            self.report.outcome = outcome
            self.report.message = message
