"""The batch sender: claimed rows go to the Message Batches API at half price, and come back whenever.

`submit` claims the selected rows, groups rows with identical requests under
one custom id, and sends them as batches within the API's limits; each batch
passes through the ledger's intent → confirm transactions (`_ledger/batches.py`).
`collect` is what any later run of the step does first, in any process: find
batches whose intent was recorded but never confirmed (`batches.list`), and
merge the results of every batch that has ended, matched by custom id.
`wait` polls until the step has no batch left processing.

A batch result becomes a result row exactly like an online answer
(`Recorder`), priced at the batch rate. `errored` items the row caused
(an invalid request) count as a failed attempt; the API's own errors,
`expired` and `canceled` items give the row back to be sent again. A batch
answer that does not match `output=` is not asked again (that would be
another batch): the row goes to NEEDS_REVIEW with the answer in `{step}_raw`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import anthropic
import polars as pl

from .._ledger import Ledger, Selection
from .._ledger.batches import BatchRecord, BatchRows
from .._ledger.claims import Claimant, is_abandoned, is_alive_here
from .._ledger.columns import RESULT_SCHEMA
from .._ledger.states import Outcome
from .._output import OutputError
from .._report import RunReport
from .._time import utcnow
from .api import REFUSAL, CallFailed, Kind, Reply, classify, reply_from
from .pacing import backoff
from .recorder import Recorder
from .scheduler import RunConfig

log = logging.getLogger("llmledger")

MAX_REQUESTS = 100_000  # the API's limits on one batch
MAX_BYTES = 256 * 1000 * 1000
AUTO_BATCH_ROWS = 10_000  # mode="auto" sends this many rows or more as batches
POLL_FIRST, POLL_MAX = 2.0, 60.0  # seconds between looks at a processing batch: growing to a minute
CREATE_TRIES = 6
_PERMANENT_ITEM_ERRORS = {"invalid_request_error", "not_found_error", "request_too_large"}


class BatchSender:
    def __init__(self, *, ledger: Ledger, table: str, step: str, cfg: RunConfig, client: anthropic.AsyncAnthropic,
                 claimant: Claimant, report: RunReport, stop_flag: threading.Event, batch_size: int = MAX_REQUESTS,
                 on_progress: Callable[[RunReport, int], None] | None = None,
                 stale_after: timedelta = timedelta(minutes=30)) -> None:
        self.ledger, self.table, self.step, self.cfg, self.client = ledger, table, step, cfg, client
        self.claimant, self.report, self.stop_flag, self.on_progress = claimant, report, stop_flag, on_progress
        self.batch_size, self.stale_after = min(batch_size, MAX_REQUESTS), stale_after

    # -- submitting -----------------------------------------------------------------------------------
    async def submit(self, selection: Selection) -> None:
        """Claim every selected row and send it in batches; rows with a stored identical answer reuse it."""
        recorder = Recorder(selection=selection, cfg=self.cfg, report=self.report, output=None)
        while selection.remaining > 0 and not self.stopped:
            rows = await asyncio.to_thread(self.ledger.claim, selection, self.batch_size, claimant=str(self.claimant),
                                           now=utcnow())
            reused = [r for r in rows if r["fingerprint"] in selection.known]
            if reused:  # answered already (another step, another table): nothing to send or pay
                known = selection.known
                results = [recorder.result(r, Reply(known[r["fingerprint"]].output, 0, 0,
                                                    known[r["fingerprint"]].stop_reason,
                                                    known[r["fingerprint"]].model), None, reused=True)
                           for r in reused]
                await asyncio.to_thread(self.ledger.commit, selection, self._frame(results, selection.key_types),
                                        now=utcnow())
            rest = [r for r in rows if r["fingerprint"] not in selection.known]
            for chunk in _chunks(rest, selection, self.batch_size, dedupe=self.cfg.dedupe):
                if self.stopped:
                    break
                await self._send(selection, chunk)
        await asyncio.to_thread(self.ledger.release, selection, claimant=str(self.claimant))

    async def _send(self, selection: Selection, chunk: list[tuple[str, dict[str, Any], list[dict[str, Any]]]]) -> None:
        """One batch: the intent, the API call, the confirmation (see `_ledger/batches.py`)."""
        intent = "b" + uuid.uuid4().hex[:12]
        layout = selection.layout
        requests, keys = [], []
        for n, (fingerprint, body, rows) in enumerate(chunk):
            custom_id = custom_id_of(intent, fingerprint, None if self.cfg.dedupe else n)
            requests.append({"custom_id": custom_id, "params": body})
            keys.extend({**{k: r[k] for k in layout.key}, "custom_id": custom_id} for r in rows)
        assigned = pl.from_dicts(keys, schema={**{k: selection.key_types[k] for k in layout.key},
                                               "custom_id": pl.String})
        size = sum(len(json.dumps(r)) for r in requests)
        model = chunk[0][1]["model"]
        await asyncio.to_thread(self.ledger.begin_batch, layout, assigned, intent=intent, claimant=str(self.claimant),
                                requests=len(requests), size=size, model=model, version=selection.version,
                                now=utcnow())
        batch_id = await self._create(requests, intent)
        if batch_id is None:
            return
        sent = await asyncio.to_thread(self.ledger.confirm_batch, layout.table, layout.step, intent=intent,
                                       batch_id=batch_id, now=utcnow())
        self.report.submitted += sent
        self.report.batches += 1
        if self.on_progress:
            self.on_progress(self.report, 0)

    async def _create(self, requests: list[dict[str, Any]], intent: str) -> str | None:
        """`batches.create`, retried on the API's transient errors; None when it did not happen (rows given back)."""
        for tries in range(CREATE_TRIES):
            try:
                batch = await self.client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
                return str(batch.id)
            except anthropic.APIConnectionError as exc:  # the API may or may not have it: look before trying again
                log.info("batch create: %s; looking for the batch", exc)
                found = await self._find([await self._intent(intent)], force=True)
                if found.get(intent):
                    return found[intent]
                failure = classify(exc)
            except anthropic.APIStatusError as exc:  # an error answer: the batch was not created
                failure = classify(exc)
            if failure.kind is not Kind.TRANSIENT:
                return await self._refused(intent, failure)
            self.report.retries += 1
            await asyncio.sleep(backoff(tries, base=self.cfg.retry.base_delay, cap=self.cfg.retry.max_delay,
                                        retry_after=failure.retry_after))
        return await self._refused(intent, failure)

    async def _refused(self, intent: str, failure: CallFailed) -> None:
        await asyncio.to_thread(self.ledger.abandon_batch, self.table, self.step, intent=intent,
                                note=f"not created: {failure}", now=utcnow())
        outcome = failure.stop or (Outcome.OUTAGE if failure.kind is Kind.TRANSIENT else Outcome.ERROR)
        self._stop(outcome, f"the API did not take the batch ({failure}); its rows are as they were. Run the "
                            "same call again to retry.")
        return None

    # -- collecting -----------------------------------------------------------------------------------
    async def collect(self) -> list[BatchRecord]:
        """Confirm or abandon unconfirmed intents, merge every ended batch; return the batches still open."""
        open_batches = await asyncio.to_thread(self.ledger.open_batches, self.table, self.step)
        intents = [b for b in open_batches if b.batch_id is None]
        if intents:
            found = await self._find(intents)
            for intent in intents:
                if intent.intent not in found:
                    continue
                if found[intent.intent] is None:
                    await asyncio.to_thread(self.ledger.abandon_batch, self.table, self.step, intent=intent.intent,
                                            note="the API has no batch for this intent: the run stopped before "
                                                 "sending it", now=utcnow())
                else:
                    await asyncio.to_thread(self.ledger.confirm_batch, self.table, self.step, intent=intent.intent,
                                            batch_id=found[intent.intent], now=utcnow())
            open_batches = await asyncio.to_thread(self.ledger.open_batches, self.table, self.step)
        still = []
        for record in open_batches:
            if self.stopped:
                still.append(record)
                continue
            if record.batch_id is None or not await self._merge_if_ended(record):
                still.append(record)
        self.report.in_batches = sum(b.rows for b in still)
        return still

    async def wait(self) -> None:
        """Poll until the step has no batch processing (or the run is stopped); merge each as it ends."""
        delay = POLL_FIRST
        while not self.stopped and await self.collect():
            await asyncio.to_thread(self.stop_flag.wait, delay)
            delay = min(delay * 1.5, POLL_MAX)

    async def _intent(self, intent: str) -> BatchRecord:
        found = await asyncio.to_thread(self.ledger.open_batches, self.table, self.step)
        return next(b for b in found if b.intent == intent)

    async def _find(self, intents: list[BatchRecord], *, force: bool = False) -> dict[str, str | None]:
        """For intents whose holder is gone: the API batch each became, or None when it never reached the API.

        A batch is recognised by being created (after its intent) with the intent's number of requests,
        and not being known to the store already; its results are later matched by custom id, whose
        prefix is the intent's, so a wrong guess can only give rows back, never write a wrong answer.
        """
        now = utcnow()
        pending = [b for b in intents if force or is_abandoned(b.claimant) or
                   (not is_alive_here(b.claimant) and now - b.created_at > self.stale_after)]
        if not pending:
            return {}
        known = await asyncio.to_thread(self.ledger.known_batch_ids)
        since = min(b.created_at for b in pending) - timedelta(minutes=5)
        candidates = []
        async for batch in self.client.messages.batches.list(limit=100):
            created = batch.created_at.astimezone(UTC).replace(tzinfo=None)
            if created < since:
                break
            if batch.id not in known:
                candidates.append((created, batch))
        found: dict[str, str | None] = {}
        for intent in sorted(pending, key=lambda b: b.created_at):
            match = next((b for created, b in sorted(candidates, key=lambda c: c[0])
                          if created >= intent.created_at - timedelta(seconds=60)
                          and _total(b.request_counts) == intent.requests), None)
            found[intent.intent] = None if match is None else str(match.id)
            candidates = [c for c in candidates if c[1] is not match]
        return found

    async def _merge_if_ended(self, record: BatchRecord) -> bool:
        """Merge the batch's results if it has ended; True when it is done with (merged or given back)."""
        assert record.batch_id is not None
        try:
            batch = await self.client.messages.batches.retrieve(record.batch_id)
        except anthropic.NotFoundError as exc:  # deleted, or another workspace's: its rows can only be sent again
            log.warning("batch %s: %s", record.batch_id, exc)
            rows = await asyncio.to_thread(self.ledger.batch_rows, record)
            back = await asyncio.to_thread(self.ledger.merge_batch, record, rows.layout, pl.DataFrame(), counts={},
                                           processing_status="not_found", ended_at=None, now=utcnow())
            self.report.returned += back or 0
            self.report.errors.append(f"the API has no batch {record.batch_id} (deleted, or another workspace's); "
                                      "its rows are as they were before it")
            return True
        except anthropic.APIError as exc:  # try again at the next look
            log.info("batch %s: %s", record.batch_id, exc)
            return False
        if batch.processing_status != "ended":
            return False
        rows = await asyncio.to_thread(self.ledger.batch_rows, record, inputs=self.cfg.validate is not None)
        counted = RunReport(table=self.table, step=self.step)  # counted in the run's report once merged
        results, counts = await self._results(record, rows, counted)
        ended = batch.ended_at.astimezone(UTC).replace(tzinfo=None) if batch.ended_at else None
        merged = await asyncio.to_thread(self.ledger.merge_batch, record, rows.layout,
                                         self._frame(results, rows.key_types), counts=counts,
                                         processing_status=batch.processing_status, ended_at=ended, now=utcnow())
        if merged is None:  # another run merged it meanwhile
            return True
        self.report.absorb(counted)
        self.report.collected += len(results)
        self.report.returned += merged
        if self.on_progress:
            self.on_progress(self.report, len(results))
        return True

    async def _results(self, record: BatchRecord, rows: BatchRows,
                       report: RunReport) -> tuple[list[dict[str, Any]], Counter[str]]:
        """Result rows for every row the batch answered or refused for its own reasons."""
        by_custom: dict[str, list[dict[str, Any]]] = {}
        version = record.version
        for row in rows.rows.iter_rows(named=True):
            by_custom.setdefault(row["custom_id"], []).append(
                {**row, "batch_id": record.batch_id, "version": version,
                 "fingerprint": fingerprint_of(row["custom_id"])})  # what was sent, whatever the row asks now
        request = rows.requests.get(version)
        output = request.output_spec() if request is not None else None
        selection = Selection(layout=rows.layout, version=version, requests=rows.requests,
                              work=pl.DataFrame(), params={}, key_types=rows.key_types, inputs=rows.inputs)
        recorder = Recorder(selection=selection, cfg=self.cfg, report=report, output=output)
        results: list[dict[str, Any]] = []
        counts: Counter[str] = Counter()
        async for item in await self.client.messages.batches.results(record.batch_id):  # type: ignore[arg-type]
            counts[item.result.type] += 1
            mine = by_custom.pop(item.custom_id, None)
            if not mine:
                continue  # not a row of ours any more
            reply, error = self._answer(item.result, mine[0]["version"], rows, recorder)
            if reply is None and error is None:
                continue  # expired, canceled, or the API's error: the row goes back to be sent again
            for n, row in enumerate(mine):
                results.append(recorder.result(row, reply, error, reused=n > 0))
        return results, counts

    def _answer(self, result: Any, version: str, rows: BatchRows,
                recorder: Recorder) -> tuple[Reply | None, str | None]:
        """(reply, None) an answer; (None, error) refused for the row's reasons; (reply, error) paid, needs a look;
        (None, None) not answered for the API's reasons."""
        if result.type == "succeeded":
            request = rows.requests.get(version)
            reply = reply_from(result.message, request.model if request else "", batch=True)
            if reply.stop_reason == "refusal":
                recorder.bill(reply)
                return None, REFUSAL
            output = request.output_spec() if request is not None else None
            if output is None:
                return reply, None
            try:
                return Reply(**{**reply.__dict__, "text": output.check(reply.text)}), None
            except OutputError as exc:
                return reply, (f"the answer does not match the output schema: {exc} (a batch answer is not asked "
                               "again; flag the row and rerun online with redo='flagged')")
        if result.type == "errored":
            error = result.error.error
            kind, message = str(getattr(error, "type", "api_error")), str(getattr(error, "message", ""))
            if kind in _PERMANENT_ITEM_ERRORS:
                return None, f"errored in the batch: {kind}: {message}"
            recorder.note_error(f"batch item {kind}: {message} (will be sent again)")
        return None, None

    # -- helpers --------------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.stop_flag.is_set() or self.report.outcome not in (Outcome.RUNNING, Outcome.PREPARING)

    def _stop(self, outcome: Outcome, message: str) -> None:
        if not self.stopped:
            self.report.outcome = outcome
            self.report.message = message

    @staticmethod
    def _frame(results: list[dict[str, Any]], key_types: dict[str, pl.DataType]) -> pl.DataFrame:
        return pl.from_dicts(results, schema=key_types | RESULT_SCHEMA) if results else pl.DataFrame(
            schema=key_types | RESULT_SCHEMA)


def custom_id_of(intent: str, fingerprint: str, n: int | None) -> str:
    """`<intent>-<fingerprint hex>[-<n>]`: at most 53 characters of [A-Za-z0-9_-], unique in its batch.

    The fingerprint of the request sent travels in the custom id, so a result is recorded as the
    answer to exactly that request even if the row's request was rendered anew while the batch ran.
    """
    return f"{intent}-{uuid.UUID(fingerprint).hex}" + ("" if n is None else f"-{n}")


def fingerprint_of(custom_id: str) -> str:
    return str(uuid.UUID(custom_id.split("-")[1]))


def _total(counts: Any) -> int:
    return sum(int(getattr(counts, name, 0) or 0) for name in ("processing", "succeeded", "errored", "canceled",
                                                               "expired"))


def _chunks(rows: list[dict[str, Any]], selection: Selection, size: int, *,
            dedupe: bool) -> list[list[tuple[str, dict[str, Any], list[dict[str, Any]]]]]:
    """Claimed rows as batches of (fingerprint, body, rows) within the limits: with `dedupe`, one request per
    distinct request (its rows share the answer), else one per row."""
    groups: dict[Any, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {}
    for n, row in enumerate(rows):
        fp = row["fingerprint"] if dedupe else n
        if fp not in groups:
            groups[fp] = (row["fingerprint"], selection.requests[row["version"]].body(row["prompt"]), [])
        groups[fp][2].append(row)
    chunks: list[list[tuple[str, dict[str, Any], list[dict[str, Any]]]]] = [[]]
    weight = 0
    for group in groups.values():
        cost = len(json.dumps(group[1])) + 100
        if chunks[-1] and (len(chunks[-1]) >= size or weight + cost > MAX_BYTES * 0.95):
            chunks.append([])
            weight = 0
        chunks[-1].append(group)
        weight += cost
    return [c for c in chunks if c]
