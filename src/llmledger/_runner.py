"""The run loop: claim rows, send them concurrently, commit results in chunks.

One asyncio task owns the store (claims and commits, each in a worker thread
so requests keep flowing meanwhile); `concurrency` sender tasks own the
requests. Stopping (Ctrl-C, cancel, outage, bad credentials) always ends the
same way: commit what finished, give back the claims of what did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import polars as pl

from . import _store as st
from ._claims import Claimant, is_abandoned
from ._client import CallFailed, Kind, Pacer, Reply, backoff, cost_usd, send
from ._journal import Journal
from ._journal import pending as pending_journals
from ._journal import read as read_journal
from ._prompt import FINGERPRINT_COL, PROMPT_COL
from ._report import RunReport

log = logging.getLogger("llmledger")
ACTIVE: weakref.WeakSet[Runner] = weakref.WeakSet()


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry the API's own failures (429, 529, 5xx, timeouts, dropped connections).

    The circuit breaker trips when `outage_failures` transient failures in a row
    have happened and nothing succeeded for `outage_after` seconds.
    """

    base_delay: float = 1.0
    max_delay: float = 30.0
    outage_after: float = 60.0
    outage_failures: int = 10


@dataclass
class RunConfig:
    model: str
    system: str | None
    max_tokens: int
    chunk_size: int
    concurrency: int
    max_attempts: int
    redo: str  # "none" | "all" | "stale"
    commit_every: float
    retry: RetryPolicy
    request_options: dict[str, Any]
    dedupe: bool = True  # rows with identical requests share one call
    grace: float = 1.0  # seconds in-flight requests get to finish after an interrupt


Outcome = tuple[Reply | None, str | None]  # an answer, or the error of a permanent failure


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Runner:
    def __init__(self, *, store: st.Store, layout: st.Layout, work: pl.DataFrame, cfg: RunConfig,
                 client: anthropic.AsyncAnthropic, claimant: Claimant, report: RunReport,
                 run_started: datetime, stop_flag: threading.Event,
                 on_progress: Callable[[RunReport, int], None] | None = None,
                 known: dict[str, Outcome] | None = None) -> None:
        self.store, self.layout, self.work, self.cfg = store, layout, work, cfg
        self.client, self.claimant, self.report = client, claimant, report
        self.run_started = run_started
        self.stop_flag = stop_flag
        self.on_progress = on_progress
        self.pacer = Pacer()
        self.answers: dict[str, Outcome] = dict(known or {})
        self.twins: dict[str, asyncio.Future[Outcome | None]] = {}
        self.doing: dict[str, str] = {}
        ACTIVE.add(self)
        self.journal = Journal(store.path, layout.table, layout.step, str(claimant))
        self.cursor = 0
        self.buffer: list[dict[str, Any]] = []
        self.oldest: float | None = None
        self.stopping: str | None = None
        self.in_flight = 0
        self.senders_done = False
        self.transient_streak = 0
        self.last_success = time.monotonic()
        self.params = {"max_attempts": cfg.max_attempts, "redo": cfg.redo, "run_started": run_started}

    # -- control ---------------------------------------------------------------------------------
    def stop(self, outcome: str, message: str = "") -> None:
        if self.stopping is None:
            self.stopping = outcome
            self.report.outcome = outcome
            self.report.message = message
        self._wake.set()

    async def run(self) -> RunReport:
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._wake = asyncio.Event()
        started = time.monotonic()
        store_task = asyncio.create_task(self._store_loop())
        watcher = asyncio.create_task(self._watch_stop_flag())
        failure: BaseException | None = None
        senders = [asyncio.create_task(self._sender()) for _ in range(self.cfg.concurrency)]
        try:
            pending = set(senders)
            while pending and self.stopping is None:
                done, pending = await asyncio.wait(pending | {store_task}, timeout=0.1,
                                                   return_when=asyncio.FIRST_COMPLETED)
                pending.discard(store_task)
                for task in done:
                    if task.exception() is not None:  # a bug or a store error: stop cleanly, then raise it
                        failure = task.exception()
                        self.stop("error", f"{type(failure).__name__}: {failure}")
                if store_task.done():
                    break
            if pending:
                grace = self.cfg.grace if self.stopping == "interrupted" else 0.0
                if grace:
                    _, pending = await asyncio.wait(pending, timeout=grace)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            self.senders_done = True
            self._wake.set()
            if not store_task.done():
                await store_task
            if failure is not None:
                raise failure
        finally:
            watcher.cancel()
            for task in senders:
                task.cancel()
            if not store_task.done():
                store_task.cancel()
            self.report.seconds = time.monotonic() - started
        return self.report

    async def _watch_stop_flag(self) -> None:
        while True:
            if self.stop_flag.is_set():
                self.stop("interrupted", "interrupted: finished rows committed, claims released")
                return
            await asyncio.sleep(0.05)

    # -- the store side -------------------------------------------------------------------------
    async def _store_loop(self) -> None:
        low_water = max(self.cfg.concurrency, 1)
        exhausted = False
        while True:
            now = time.monotonic()
            finishing = self.senders_done or self.stopping is not None
            flush = bool(self.buffer) and (finishing or len(self.buffer) >= self.cfg.chunk_size or
                                           (self.oldest is not None and now - self.oldest >= self.cfg.commit_every))
            want = 0
            if not exhausted and self.stopping is None and self.queue.qsize() < low_water:
                want = max(self.cfg.chunk_size, 2 * self.cfg.concurrency)
            if flush or want:
                batch, journal = self._take_buffer() if flush else ([], None)
                claimed = await asyncio.to_thread(self._commit_and_claim, batch, want, journal)
                for row in claimed:
                    self.queue.put_nowait(row)
                if want and self.cursor >= self.work.height:
                    exhausted = True
                    for _ in range(self.cfg.concurrency):
                        self.queue.put_nowait(None)
                continue
            if finishing and not self.buffer:
                break
            self._wake.clear()
            timeout = self.cfg.commit_every if self.buffer else 0.1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self.report.released = await asyncio.to_thread(self._release)

    def _take_buffer(self) -> tuple[list[dict[str, Any]], Path | None]:
        batch, self.buffer, self.oldest = self.buffer, [], None
        return batch, self.journal.rotate()

    def _commit_and_claim(self, batch: list[dict[str, Any]], want: int,
                          journal: Path | None) -> list[dict[str, Any]]:
        results = self._results_frame(batch) if batch else None
        now = utcnow()
        claimed: list[dict[str, Any]] = []
        start_cursor = self.cursor

        def work(con: Any) -> None:
            self.cursor = start_cursor  # a retried transaction starts over
            claimed.clear()
            if results is not None:
                st.commit_results(con, self.layout, results, now=now)
            while want and len(claimed) < want and self.cursor < self.work.height:
                chunk = self.work.slice(self.cursor, want - len(claimed))
                got = st.claim(con, self.layout, chunk, claimant=str(self.claimant), now=now, params=self.params)
                claimed.extend(got.iter_rows(named=True))
                self.cursor += chunk.height

        try:
            self.store.transaction(work, wait=None if self.stopping is None else 30.0)
        except TimeoutError:
            self.cursor = start_cursor
            if journal is not None:
                self.report.message += (f" The store stayed locked; {len(batch)} answers are kept in {journal} "
                                        "and the next run merges them.")
            return []
        except BaseException:
            self.cursor = start_cursor
            raise
        if journal is not None:
            journal.unlink(missing_ok=True)
        return claimed

    def _release(self) -> int:
        try:
            return int(self.store.transaction(
                lambda con: st.release_claims(con, self.layout, claimant=str(self.claimant),
                                              max_attempts=self.cfg.max_attempts), wait=30.0))
        except TimeoutError:
            return 0

    def _results_frame(self, batch: list[dict[str, Any]]) -> pl.DataFrame:
        schema = {k: self.work.schema[k] for k in self.layout.key} | st.RESULT_SCHEMA
        return pl.from_dicts(batch, schema=schema)

    # -- the request side -----------------------------------------------------------------------
    async def _sender(self) -> None:
        while self.stopping is None:
            row = await self.queue.get()
            if row is None:
                return
            await self._process(row)

    async def _process(self, row: dict[str, Any]) -> None:
        """Answer one row, sharing one request among rows whose requests are identical."""
        fp = row[FINGERPRINT_COL]
        if self.cfg.dedupe:
            if fp in self.answers:
                self._record(row, *self.answers[fp], reused=True)
                return
            twin = self.twins.get(fp)
            if twin is not None:
                self._doing(f"waiting for twin {fp[:8]}")
                outcome = await asyncio.shield(twin)
                if outcome is not None:  # None: the twin was stopped, so this row is released too
                    self._record(row, *outcome, reused=True)
                return
            self.twins[fp] = asyncio.get_running_loop().create_future()
        outcome: Outcome | None = None
        try:
            outcome = await self._call(row)
            if outcome is not None:
                self._record(row, *outcome)
                if self.cfg.dedupe:
                    self.answers[fp] = outcome
        finally:
            future = self.twins.pop(fp, None)
            if future is not None and not future.done():
                future.set_result(outcome)

    async def _call(self, row: dict[str, Any]) -> Outcome | None:
        """Send until there is an answer or a permanent error; None when the run stops first."""
        cfg, tries = self.cfg, 0
        while self.stopping is None:
            self.in_flight += 1
            self.report.in_flight = self.in_flight
            retry_after: float | None = None
            self._doing(f"sending {row[PROMPT_COL]!r} (try {tries})")
            try:
                reply = await send(self.client, self.pacer, model=cfg.model, prompt=row[PROMPT_COL],
                                   system=cfg.system, max_tokens=cfg.max_tokens, extra=cfg.request_options)
                return reply, None
            except CallFailed as failure:
                if failure.kind is Kind.FATAL:
                    self.stop("auth", f"the API refused the credentials ({failure}); no row was marked "
                                      "failed. Check ANTHROPIC_API_KEY (or the client you passed) and run again.")
                    return None
                if failure.kind is Kind.PERMANENT:
                    return None, str(failure)
                self._transient(failure)
                retry_after = failure.retry_after
            finally:
                self.in_flight -= 1
                self.report.in_flight = self.in_flight
            if self.stopping is not None:
                return None
            self._doing(f"backoff {row[FINGERPRINT_COL][:8]} (try {tries})")
            await asyncio.sleep(backoff(tries, base=cfg.retry.base_delay, cap=cfg.retry.max_delay,
                                        retry_after=retry_after))
            tries += 1
        return None

    def _doing(self, what: str) -> None:
        """What each sender task awaits now: shown by `debug_state()` when a run looks stuck."""
        task = asyncio.current_task()
        if task is not None:
            self.doing[task.get_name()] = what

    def debug_state(self) -> dict[str, Any]:
        return {"doing": dict(self.doing), "queue": self.queue.qsize(), "cursor": self.cursor,
                "work": self.work.height, "buffer": len(self.buffer), "stopping": self.stopping,
                "in_flight": self.in_flight, "twins": list(self.twins)[:5],
                "pacer": (self.pacer.interval, self.pacer._next, self.pacer._paused_until)}

    def _transient(self, failure: CallFailed) -> None:
        log.info("transient failure, will retry: %s", failure)
        self.report.retries += 1
        self.transient_streak += 1
        self._note_error(str(failure))
        policy = self.cfg.retry
        quiet_for = time.monotonic() - self.last_success
        if self.transient_streak >= policy.outage_failures and quiet_for >= policy.outage_after:
            self.stop("outage", f"the API kept failing ({self.transient_streak} transient errors in a row, "
                                f"no success for {quiet_for:.0f}s; last: {failure}). Stopped cleanly; "
                                "unsent rows stay as they were. Run the same call again later to resume.")

    def _note_error(self, message: str) -> None:
        errors = self.report.errors
        errors.append(message)
        del errors[:-5]

    def _record(self, row: dict[str, Any], reply: Reply | None, error: str | None, *, reused: bool = False) -> None:
        cfg, rep = self.cfg, self.report
        attempts = 1 if row["was_done"] else int(row["attempts"] or 0) + 1
        result = {k: row[k] for k in self.layout.key}
        now = utcnow()
        if reply is not None and reused:  # an identical request was answered already: nothing to pay
            reply = dataclasses.replace(reply, input_tokens=0, output_tokens=0)
            rep.reused += 1
            rep.done += 1
            cost: float | None = 0.0
        elif reply is not None:
            self.transient_streak = 0
            self.last_success = time.monotonic()
            cost = cost_usd(reply.model, reply.input_tokens, reply.output_tokens)
            rep.calls += 1
            rep.done += 1
            rep.input_tokens += reply.input_tokens
            rep.output_tokens += reply.output_tokens
        if reply is not None:
            rep.cost_usd = None if cost is None or rep.cost_usd is None else rep.cost_usd + cost
            result.update(status="DONE", output=reply.text, attempts=attempts, error=None,
                          input_tokens=reply.input_tokens, output_tokens=reply.output_tokens, cost_usd=cost,
                          stop_reason=reply.stop_reason, model=reply.model, fingerprint=row[FINGERPRINT_COL],
                          finished_at=now)
        else:
            status = "NEEDS_REVIEW" if attempts >= cfg.max_attempts else "FAILED"
            if status == "FAILED":
                rep.failed += 1
            else:
                rep.needs_review += 1
            self._note_error(error or "")
            result.update(status=status, output=None, attempts=attempts, error=error, input_tokens=None,
                          output_tokens=None, cost_usd=None, stop_reason=None, model=cfg.model,
                          fingerprint=None, finished_at=now)
        self.journal.append(result)
        if self.oldest is None:
            self.oldest = time.monotonic()
        self.buffer.append(result)
        if len(self.buffer) >= cfg.chunk_size:
            self._wake.set()
        if self.on_progress:
            self.on_progress(rep, 1)


def merge_journals(con: Any, layout: st.Layout, store_path: Path, key_types: dict[str, Any]) -> list[Path]:
    """Commit the answers that runs which died on this host had journaled but not committed.

    Returns the files to delete once the transaction has committed.
    """
    merged = []
    for path, holder in pending_journals(store_path, layout.table, layout.step):
        if is_abandoned(holder):
            results = read_journal(path, key_types | st.RESULT_SCHEMA)
            if results.height:
                st.commit_results(con, layout, results, now=utcnow(), only_unfinished=True)
            merged.append(path)
    return merged
