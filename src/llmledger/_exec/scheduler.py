"""The scheduler: claim ahead, queue, journal, commit in chunks, count.

One asyncio task owns the ledger (claims and commits, each in a worker thread
so requests keep flowing meanwhile); `concurrency` worker tasks take claimed
rows off the queue and hand them to the sender. Every answer is journaled the
moment it arrives and committed with its chunk. Stopping (Ctrl-C, cancel,
outage, a fatal API answer, the budget) always ends the same way: start no
request, take the answers already on their way (they are billed; Ctrl-C gives
them `grace`), commit what finished, give back the claims of what did not.
A step budget is shared with the step's other runs through reservations in
the ledger (`_ledger/budget.py`), made by the task that owns the ledger; what
a run may spend is `spending.py`'s, mixed into `Scheduler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._exec.client import Reply
from llmledger._exec.config import RunConfig
from llmledger._exec.online import OnlineSender
from llmledger._exec.packed import PackedSender
from llmledger._exec.recorder import Recorder
from llmledger._exec.spending import BudgetGuard
from llmledger._ledger import Chunk, Ledger, Selection
from llmledger._ledger.columns import RESULT_SCHEMA
from llmledger._ledger.journal import Journal
from llmledger._ledger.liveness import Claimant
from llmledger._ledger.states import Outcome
from llmledger._report import RunReport
from llmledger._time import utcnow
from llmledger.errors import CommitUnknown, StoreBusy, StoreError

ACTIVE: weakref.WeakSet[Scheduler] = weakref.WeakSet()
BUDGET_GRACE = 600.0  # seconds a stopped run waits for the answers already in flight
# Stops that wait for every request in flight: its answer is billed whatever stopped the run (the budget, the
# account's spend cap, `x-should-retry: false`, an outage, credentials or a missing model), and an answer not
# kept would be paid again by the next run. Ctrl-C waits `grace` only (the user wants out); a bug or a store
# error stops at once (nothing could be committed).
DRAINING = frozenset(
    {
        Outcome.BUDGET,
        Outcome.SPEND_LIMIT,
        Outcome.RETRY_REFUSED,
        Outcome.OUTAGE,
        Outcome.AUTH,
        Outcome.NO_MODEL,
        Outcome.BAD_REQUEST,
    }
)


class Scheduler(BudgetGuard):
    def __init__(
        self,
        *,
        ledger: Ledger,
        selection: Selection,
        cfg: RunConfig,
        client: Any,  # an anthropic.AsyncAnthropic, or an openai.AsyncOpenAI
        claimant: Claimant,
        report: RunReport,
        stop_flag: threading.Event,
        on_progress: Callable[[RunReport, int], None] | None = None,
    ) -> None:
        self.ledger, self.selection, self.cfg = ledger, selection, cfg
        self.claimant, self.report, self.stop_flag, self.on_progress = claimant, report, stop_flag, on_progress
        output = selection.requests[selection.version].output_spec() if selection.requests else None
        if output is not None and cfg.output_model is not None:
            output = dataclasses.replace(output, model=cfg.output_model)
        self.output = output
        self.recorder = Recorder(selection=selection, cfg=cfg, report=report, output=output)
        self.sender = OnlineSender(
            client,
            requests=selection.requests,
            known=selection.known,
            retry=cfg.retry,
            dedupe=cfg.dedupe,
            sink=self,
            output=output,
            concurrency=cfg.concurrency,
            adaptive=cfg.adaptive,
            attachments=cfg.attachments,
            service_tier=cfg.service_tier,
            deadline=cfg.deadline,
        )
        layout = selection.layout
        self.pack_size = selection.rows_per_request  # rows one request carries
        self.packer = PackedSender(self.sender, output=output, key=list(layout.key))
        self.journal = Journal(ledger.path, layout.table, layout.step, str(claimant))
        self.buffer: list[dict[str, Any]] = []
        self.packs: list[dict[str, Any]] = []  # pack records for the next commit
        self.packs_paid = (0, 0.0)  # packs of several rows answered, and what they cost (for the budget)
        self.unjournaled: list[dict[str, Any]] = []  # and those not yet in the journal
        # the chunks committed and not yet seen to land (the last one, and any the store lost): written again by
        # the next claim, commit, budget reservation or release, where their rows are still as this run claimed them
        # (`again.write_again`). Their journals are gone by then: a journal merged after a commit that landed
        # would count its failed tries' cost twice
        self.unlanded: list[Chunk] = []
        self.oldest: float | None = None
        self.stopping: Outcome | None = None
        self.in_flight = 0
        self.workers_done = False
        # A step's budget is shared with the step's other runs through reservations in the ledger (budget.py):
        # `held` is what the ledger holds reserved for this run; `committed` what of this run's spending the
        # fact table holds; `ask` a reservation the senders wait for; `first_ok` one request of unknown cost.
        self.shared_budget = cfg.max_cost_usd is not None and cfg.budget_scope == "step"
        self.budget_held = self.budget_committed = 0.0
        self.budget_ask = self.budget_first_ok = False
        ACTIVE.add(self)

    # -- the Sink the sender reports to (its `may_spend` is BudgetGuard's, spending.py) -------------------
    def stop(self, outcome: Outcome, message: str = "") -> None:
        if self.stopping is None:
            self.stopping = outcome
            self.report.outcome = outcome
            self.report.message = message
        self._wake.set()

    def note_unsent(self, message: str, row: dict[str, Any]) -> None:
        """A row the run gives back unsent (its file is not as recorded): the summary says why."""
        self.report.unsent += 1
        self.report.unsent_why = message
        self.recorder.note_error(message, row)

    def note_retry(self, message: str, row: dict[str, Any]) -> None:
        self.report.retries += 1
        self.recorder.note_error(message, row, retried=True)

    def set_in_flight(self, delta: int) -> None:
        self.in_flight += delta
        self.report.in_flight = self.in_flight
        self.report.binding_limit = self.sender.pacer.binding

    def bill(self, reply: Reply) -> float | None:
        return self.recorder.bill(reply)

    def note_pack(self, record: dict[str, Any]) -> None:
        """A request that carried rows together: recorded in llmledger_packs with the next commit, and journaled
        with the next answer."""
        layout = self.selection.layout
        if record["rows"] > 1 and record["cost_usd"] is not None:
            self.packs_paid = (self.packs_paid[0] + 1, self.packs_paid[1] + record["cost_usd"])
        record = {**record, "table_name": layout.table, "step": layout.step, "run_id": self.claimant.run_id}
        self.packs.append(record)
        self.unjournaled.append(record)

    def pace(self) -> tuple[int, int]:
        """(rows answered in this run, rows still to answer: unclaimed, queued and in flight)."""
        rep = self.report
        answered = rep.done + rep.failed + rep.needs_review - rep.early_finished
        return answered, self.selection.remaining + self.queue.qsize() + self.in_flight * self.pack_size

    def note_standard(self) -> None:
        self.report.standard_for_deadline += 1

    def record(self, row: dict[str, Any], reply: Reply | None, error: str | None, *, reused: bool) -> None:
        """Account for one answered (or refused) row, journal it, and buffer it for the next commit."""
        result = self.recorder.result(row, reply, error, reused=reused)
        packs, self.unjournaled = self.unjournaled, []
        self.journal.append(result, self.report.paid_figures(), packs or None)
        if self.oldest is None:
            self.oldest = time.monotonic()
        self.buffer.append(result)
        if len(self.buffer) >= self.cfg.chunk_size:
            self._wake.set()
        if self.on_progress:
            self.on_progress(self.report, 1)

    # -- running ------------------------------------------------------------------------------------------
    async def run(self) -> RunReport:
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._wake = asyncio.Event()
        started = time.monotonic()
        store_task = asyncio.create_task(self._store_loop())
        watcher = asyncio.create_task(self._watch_stop_flag())
        failure: BaseException | None = None
        workers = [asyncio.create_task(self._worker()) for _ in range(self.cfg.concurrency)]
        try:
            pending = set(workers)
            while pending and self.stopping is None:
                done, pending = await asyncio.wait(
                    pending | {store_task}, timeout=0.1, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(store_task)
                for task in done:
                    if task.exception() is not None:  # a bug or a store error: stop cleanly, then raise it
                        failure = task.exception()
                        self.stop(Outcome.ERROR, f"{type(failure).__name__}: {failure}")
                if store_task.done():
                    break
            # requests in flight are paid for: take their answers (a store that failed: to the journal, which the
            # next run merges; cancelled, they were paid and asked again)
            if pending and (self.stopping in DRAINING or isinstance(failure, StoreError)):
                deadline = time.monotonic() + BUDGET_GRACE
                while self.in_flight and time.monotonic() < deadline and not self.stop_flag.is_set():
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0)
            if pending:
                interrupted = self.stopping is Outcome.INTERRUPTED or self.stop_flag.is_set()
                grace = self.cfg.grace if interrupted else 0.0
                if grace:
                    _, pending = await asyncio.wait(pending, timeout=grace)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            self.workers_done = True
            self._wake.set()
            if not store_task.done():
                await store_task
            if failure is not None:
                raise failure
        finally:
            watcher.cancel()
            for task in workers:
                task.cancel()
            if not store_task.done():
                store_task.cancel()
            self.report.seconds = time.monotonic() - started
        return self.report

    async def _watch_stop_flag(self) -> None:
        while True:
            if self.stop_flag.is_set():
                self.stop(Outcome.INTERRUPTED, "interrupted: finished rows committed, claims released")
                return
            await asyncio.sleep(0.05)

    async def _worker(self) -> None:
        while self.stopping is None:
            row = await self.queue.get()
            if row is None:
                return
            if self.pack_size == 1:
                await self.sender.process(row)
                continue
            rows, last = [row], False  # a pack: what the queue holds now, up to its size (no waiting for more)
            while len(rows) < self.pack_size and not self.queue.empty():
                more = self.queue.get_nowait()
                if more is None:  # this worker's end: send what it took, then stop
                    last = True
                    break
                rows.append(more)
            await self.packer.process(rows)
            if last:
                return

    async def _store_loop(self) -> None:
        """Claim ahead and commit until the workers are done; then commit the rest and give back what is left.

        A stop does not end it: answers still arriving from requests in flight (the grace after Ctrl-C,
        a budget's last requests) are committed before the claims are released.
        """
        try:
            await self._claim_and_commit()
        finally:
            self.journal.rotate()
            self.report.released = await asyncio.to_thread(self._release)

    async def _claim_and_commit(self) -> None:
        low_water = max(self.cfg.concurrency, 1) * self.pack_size  # every worker can take a whole pack
        exhausted = False
        renewed = time.monotonic()
        while True:
            now = time.monotonic()
            if now - renewed >= self.cfg.renew_every:  # a heartbeat: claims queued or in flight are still ours
                renewed = now
                await asyncio.to_thread(self._renew)
            finishing = self.workers_done
            flush = bool(self.buffer) and (
                finishing
                or self.stopping is not None
                or len(self.buffer) >= self.cfg.chunk_size
                or (self.oldest is not None and now - self.oldest >= self.cfg.commit_every)
            )
            want = 0
            if not exhausted and self.stopping is None and self.queue.qsize() < low_water:
                want = max(self.cfg.chunk_size, 2 * low_water)
            reserve = self.budget_ask and self.stopping is None
            if reserve:
                await self._reserve()
            if flush:
                taken, journal = self._take_buffer()
                packs, self.packs = self.packs, []
                settled = await asyncio.to_thread(self._commit, taken, journal, self.report.paid_figures(), packs)
                self.budget_committed += settled  # in the fact table now, and out of the reservation
                self.budget_held = max(0.0, self.budget_held - settled)
            if want:
                for row in await asyncio.to_thread(self._claim, want):
                    self.queue.put_nowait(row)
                if self.selection.remaining <= 0:
                    exhausted = True
                    for _ in range(self.cfg.concurrency):
                        self.queue.put_nowait(None)
            if flush or want or reserve:
                continue
            if finishing and not self.buffer:
                break
            self._wake.clear()
            timeout = self.cfg.commit_every if self.buffer else 0.1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _take_buffer(self) -> tuple[list[dict[str, Any]], Path | None]:
        batch, self.buffer, self.oldest = self.buffer, [], None
        return batch, self.journal.rotate()

    def _commit(
        self, batch: list[dict[str, Any]], journal: Path | None, figures: dict[str, Any], packs: list[dict[str, Any]]
    ) -> float:
        """One chunk in one transaction, with the run's figures so far (`figures`, taken on the loop as the
        chunk was); its journal file goes once the commit is in. Returns what its answers cost when that left
        this run's budget reservation with them (0 otherwise)."""
        schema = {k: self.selection.key_types[k] for k in self.selection.layout.key} | RESULT_SCHEMA
        results = pl.from_dicts(batch, schema=schema)
        cost = sum(r["cost_usd"] or 0.0 for r in batch) if self.shared_budget else 0.0
        try:
            written = self.ledger.commit(
                self.selection,
                results,
                now=utcnow(),
                wait=None if self.stopping is None else 30.0,
                settled=(str(self.claimant), cost) if self.shared_budget else None,
                run=(self.claimant.run_id, figures),
                packs=packs,
                again=(str(self.claimant), self.unlanded) if self.unlanded else None,
            )
        except StoreBusy:
            self.report.message += (
                f" The store stayed locked; {len(batch)} answers are kept in {journal} and the next run merges them."
            )
            return 0.0
        except CommitUnknown:  # the next transaction writes the chunk again where it did not land (journal kept)
            self.unlanded = [*self.unlanded, Chunk(results, packs)]
            return 0.0
        if journal is not None:
            journal.unlink(missing_ok=True)
        self.unlanded = [*written, Chunk(results, packs)]
        return cost

    def _claim(self, n: int) -> list[dict[str, Any]]:
        try:
            return self.ledger.claim(self.selection, n, claimant=str(self.claimant), now=utcnow(), again=self.unlanded)
        except StoreBusy:  # only when stopping: nothing was claimed
            return []

    def _renew(self) -> None:
        with contextlib.suppress(StoreBusy):
            self.ledger.renew(self.selection, claimant=str(self.claimant), now=utcnow())

    def _release(self) -> int:
        try:
            return self.ledger.release(self.selection, claimant=str(self.claimant), again=self.unlanded)
        except StoreBusy:
            return 0

    def debug_state(self) -> dict[str, Any]:
        return {
            "doing": dict(self.sender.doing),
            "queue": self.queue.qsize(),
            "cursor": self.selection.cursor,
            "work": self.selection.to_send,
            "buffer": len(self.buffer),
            "stopping": self.stopping,
            "in_flight": self.in_flight,
            "twins": list(self.sender.twins)[:5],
            "pacer": self.sender.pacer.state(),
        }
