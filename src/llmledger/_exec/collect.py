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

A result becomes a result row exactly like an online answer (`Recorder`),
priced at the batch rate: `errored` items the row caused (an invalid
request) count as a failed attempt; the API's own errors, `expired` and
`canceled` items give the row back to be sent again. A structured answer
that does not match `output=` is not asked again (that would be another
batch): the row goes to NEEDS_REVIEW with the answer in `{step}_raw`.
Failures to reach the API here never fail a run: the batch is looked at
again next time, and its results stay with the API meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import anthropic
import polars as pl

from llmledger._draw import rows as rows_text
from llmledger._exec.batch import fingerprint_of, result_frame
from llmledger._exec.client import NEVER_IN_THIS_SIMULATOR, REFUSAL, Reply, reply_from
from llmledger._exec.config import RunConfig
from llmledger._exec.reconcile import Reading, Reconciler, Undecided, tag_of
from llmledger._exec.recorder import Recorder
from llmledger._ledger import Ledger, Selection
from llmledger._ledger.batches import BatchChanged
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.liveness import is_abandoned, is_alive_here
from llmledger._ledger.states import Outcome
from llmledger._ledger.types import BatchRecord, BatchRows
from llmledger._report import RunReport
from llmledger._step.output import OutputError, OutputSpec
from llmledger._time import utcnow

log = logging.getLogger("llmledger")

POLL_FIRST, POLL_MAX = 2.0, 60.0  # seconds between looks at a processing batch: growing to a minute
ABANDON_AFTER = timedelta(seconds=20)  # an intent not found is given up only this long after it was made: a
# create the dead process had sent may still be being made
GIVE_UP_AFTER = 5  # failed looks in a row after which waiting for a batch stops (it says why, and what to do)
_PERMANENT_ITEM_ERRORS = {"invalid_request_error", "not_found_error", "request_too_large"}


class BatchCollector:
    def __init__(
        self,
        *,
        ledger: Ledger,
        table: str,
        step: str,
        cfg: RunConfig,
        client: anthropic.AsyncAnthropic,
        report: RunReport,
        stop_flag: threading.Event,
        version: str | None = None,
        output_model: Any = None,
        on_progress: Callable[[RunReport, int], None] | None = None,
        stale_after: timedelta = timedelta(minutes=30),
    ) -> None:
        self.ledger, self.table, self.step, self.cfg, self.client = ledger, table, step, cfg, client
        self.report, self.stop_flag, self.on_progress, self.stale_after = report, stop_flag, on_progress, stale_after
        self.version, self.output_model = version, output_model  # apply_llm's definition: its pydantic model
        self.returned: list[pl.DataFrame] = []  # keys of rows batches gave back during this run
        self.mine: set[str] = set()  # intents this run sent (the sender adds them)
        self.stuck: set[str] = set()  # batches no amount of waiting will merge (the API lost them; held)
        self.failures: Counter[str] = Counter()  # failed looks in a row, per intent
        self.due: float | None = None  # seconds until the next unfound intent may be given up
        self.reconciler = Reconciler(client)

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
            if record.source is None or record.source == self.cfg.source:
                mine.append(record)
            elif record.source == SIMULATOR:
                back = await asyncio.to_thread(
                    self.ledger.abandon_batch,
                    self.table,
                    self.step,
                    intent=record.intent,
                    now=utcnow(),
                    confirmed=record.batch_id is not None,
                    note="sent to the simulator; a run against the API does not keep simulated answers",
                )
                if back.height:
                    self.returned.append(back)
            else:
                foreign.append(record)
                if record.intent not in self.stuck:
                    self.stuck.add(record.intent)
                    self._note(
                        f"batch {record.batch_id or record.intent} ({record.rows:,} rows) was sent to "
                        f"{record.source}; a run against that endpoint collects it (or take its rows out "
                        "with llmledger.reset)"
                    )
        return mine, foreign

    def waiting_on(self, open_batches: list[BatchRecord]) -> bool:
        """Whether any of these batches is worth waiting for (not lost by the API, not held for validate=)."""
        return any(b.intent not in self.stuck for b in open_batches)

    async def wait(self, open_batches: list[BatchRecord]) -> None:
        """Poll until the step has no batch processing (or the run is stopped); merge each as it ends.

        `open_batches`: what `collect` just returned, so the first look is not taken twice.
        """
        delay = POLL_FIRST
        while not self.stopped and self.waiting_on(open_batches):
            due = self.due  # an unfound intent about to be given up: look again just then
            await asyncio.to_thread(self.stop_flag.wait, delay if due is None else min(delay, due + 0.1))
            delay = min(delay * 1.5, POLL_MAX)
            open_batches = await self.collect()

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
        except anthropic.APIError as exc:  # try again next time; the rows wait
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
                back = await asyncio.to_thread(
                    self.ledger.abandon_batch,
                    self.table,
                    self.step,
                    intent=intent.intent,
                    note="the API has no batch for this intent: the run stopped before sending it",
                    now=utcnow(),
                )
                if back.height:
                    self.returned.append(back)

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
        unsettled = await asyncio.to_thread(self.ledger.unsettled_batches)
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

    # -- merging ------------------------------------------------------------------------------------
    async def _merge_if_ended(self, record: BatchRecord) -> bool:
        """Merge the batch if it has ended; True when it is done with."""
        assert record.batch_id is not None
        rows = await asyncio.to_thread(self.ledger.batch_rows, record, inputs=self.cfg.validate is not None)
        if not rows.rows.height:  # every row was taken out of it (llmledger.reset): nothing to merge
            await asyncio.to_thread(
                self.ledger.abandon_batch,
                self.table,
                self.step,
                intent=record.intent,
                note="its rows were reset",
                now=utcnow(),
                confirmed=True,
            )
            return True
        if record.validated and self.cfg.validate is None:
            self.stuck.add(record.intent)
            self._note(
                f"batch {record.batch_id} was sent with validate=; collect it with the same validate= "
                "(apply_llm or llmledger.resume(..., validate=...)), so its answers are checked"
            )
            return False
        try:
            batch = await self.client.messages.batches.retrieve(record.batch_id)
        except anthropic.NotFoundError as exc:  # deleted, or another workspace's key: keep the rows, say what to do
            if record.source == SIMULATOR and NEVER_IN_THIS_SIMULATOR in str(exc):  # its simulator is gone
                back = await asyncio.to_thread(
                    self.ledger.abandon_batch,
                    self.table,
                    self.step,
                    intent=record.intent,
                    now=utcnow(),
                    confirmed=True,
                    note="sent to a simulator that is gone (it lives in its kernel or process)",
                )
                if back.height:
                    self.returned.append(back)
                    self._note(
                        f"{rows_text(back.height)} were in simulated batch {record.batch_id}, which ended "
                        "with the simulator that held it (a simulator lives in its kernel or process; "
                        "nothing was paid): they are asked again of this one"
                    )
                return True
            self.stuck.add(record.intent)
            self._note(
                f"the API has no batch {record.batch_id} for this API key (deleted, or another "
                f"workspace's); its rows stay SUBMITTED. To send them again: llmledger.reset(store, "
                f"{self.table!r}, {self.step!r}, where=\"{self.step}_batch_id = '{record.batch_id}'\")"
            )
            return False
        except anthropic.APIError as exc:
            self._failed([record], f"batch {record.batch_id}: {exc}")
            return False
        if batch.processing_status != "ended":
            return False
        counted = RunReport(table=self.table, step=self.step)  # into the run's report once merged
        try:
            results, counts, tags, unused = await self._results(record, rows, counted)
        except Exception as exc:  # a download cut short: the results stay with the API, try next time
            self._failed(
                [record], f"batch {record.batch_id}: downloading its results failed ({type(exc).__name__}: {exc})"
            )
            return False
        if record.adopted and record.intent not in tags and sum(counts.values()) > 0:  # a wrong guess: not ours
            self.reconciler.tags[record.batch_id] = frozenset(tags)
            await asyncio.to_thread(
                self.ledger.reject_batch, record, note=f"{record.batch_id} holds no custom id of this intent"
            )
            unsettled = await asyncio.to_thread(self.ledger.unsettled_batches)
            await self._hand_over(
                {r.intent: record.batch_id for r in unsettled if r.batch_id is None and r.intent in tags}, unsettled
            )
            return False
        ended = batch.ended_at.astimezone(UTC).replace(tzinfo=None) if batch.ended_at else None
        try:
            merged = await asyncio.to_thread(
                self.ledger.merge_batch,
                record,
                rows.layout,
                result_frame(results, rows.key_types),
                counts=counts,
                processing_status=batch.processing_status,
                ended_at=ended,
                now=utcnow(),
                expected_rows=rows.rows.height,
                unused=unused,
            )
        except BatchChanged:  # rows joined it meanwhile: merge it again at the next look, with them
            return False
        self.failures.pop(record.intent, None)
        if merged is None:  # another run merged it meanwhile
            return True
        self.report.absorb(counted)
        self.report.collected += len(results)
        self.report.returned += merged.height
        if record.intent in self.mine or record.batch_id in self.mine:
            self.report.batch_pending = max(0, self.report.batch_pending - len(results) - merged.height)
        if merged.height:
            self.returned.append(merged)
        if self.on_progress:
            self.on_progress(self.report, len(results))
        return True

    async def _results(
        self, record: BatchRecord, rows: BatchRows, report: RunReport
    ) -> tuple[list[dict[str, Any]], Counter[str], set[str], tuple[int, float]]:
        """Result rows for the rows the batch answered or refused for their own reasons; its counts; the intents
        its custom ids name (`reconcile.tag_of`); and the answers no row holds any more, with their cost."""
        by_custom: dict[str, list[dict[str, Any]]] = {}
        for row in rows.rows.iter_rows(named=True):
            by_custom.setdefault(row["custom_id"], []).append(
                {
                    **row,
                    "batch_id": record.batch_id,
                    "version": record.version,
                    "fingerprint": fingerprint_of(row["custom_id"]),
                }
            )  # what was sent, whatever the row asks now
        request = rows.requests.get(record.version)
        output = self.output_for(record.version, request.output_spec() if request is not None else None)
        selection = Selection(
            layout=rows.layout,
            version=record.version,
            requests=rows.requests,
            work=pl.DataFrame(),
            params={},
            key_types=rows.key_types,
            inputs=rows.inputs,
        )
        cfg = dataclasses.replace(self.cfg, source=record.source) if record.source else self.cfg  # where it was sent
        recorder = Recorder(selection=selection, cfg=cfg, report=report, output=output)
        results: list[dict[str, Any]] = []
        counts: Counter[str] = Counter()
        tags: set[str] = set()
        unused, unused_usd = 0, 0.0
        async for item in await self.client.messages.batches.results(record.batch_id):  # type: ignore[arg-type]
            counts[item.result.type] += 1
            tags.add(tag_of(item.custom_id))
            mine = by_custom.pop(item.custom_id, None)
            if not mine:  # no row holds this request any more (reset meanwhile): paid all the same
                if item.result.type == "succeeded" and item.custom_id.startswith(record.intent + "-"):
                    unused += 1
                    unused_usd += (
                        recorder.bill(reply_from(item.result.message, request.model if request else "", batch=True))
                        or 0.0
                    )
                continue
            reply, error = self._answer(item.result, request.model if request else "", output, recorder)
            if reply is None and error is None:
                continue  # expired, canceled, or the API's error: the row goes back to be sent again
            for n, row in enumerate(mine):
                results.append(recorder.result(row, reply, error, reused=n > 0))
        return results, counts, tags, (unused, unused_usd)

    @staticmethod
    def _answer(
        result: Any, model: str, output: OutputSpec | None, recorder: Recorder
    ) -> tuple[Reply | None, str | None]:
        """(reply, None) an answer; (None, error) refused for the row's reasons; (reply, error) paid, needs a look;
        (None, None) not answered for the API's reasons."""
        if result.type == "succeeded":
            reply = reply_from(result.message, model, batch=True)
            if reply.stop_reason == "refusal":
                recorder.bill(reply)
                return None, REFUSAL
            if output is None:
                return reply, None
            try:
                return dataclasses.replace(reply, text=output.check(reply.text)), None
            except OutputError as exc:
                return reply, (
                    f"the answer does not match the output schema: {exc} (a batch answer is not asked "
                    "again; flag the row and rerun online with redo='flagged')"
                )
        if result.type == "errored":
            error = result.error.error
            kind, message = str(getattr(error, "type", "api_error")), str(getattr(error, "message", ""))
            if kind in _PERMANENT_ITEM_ERRORS:
                return None, f"errored in the batch: {kind}: {message}"
            recorder.note_error(f"batch item {kind}: {message} (will be sent again)")
        return None, None

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
