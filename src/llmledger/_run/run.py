"""A run from start to end: prepare (or resume), send, commit, report — in front or in the background.

`Run` is also the handle `apply_llm(..., background=True)` returns: the user
keeps working in other cells while it goes, and can look at `progress()`,
`wait()`, `cancel()` it (which stops like Ctrl-C) or show its dashboard. Its
report belongs to the handle; `last_report()` only ever shows the last run
this thread waited for, so background runs never race with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import polars as pl

from llmledger._exec.batch import AUTO_BATCH_ROWS
from llmledger._ledger import Ledger, Selection, open_ledger
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.liveness import Claimant
from llmledger._ledger.open import expect_store
from llmledger._ledger.states import Outcome, Redo
from llmledger._ledger.verbs import KEPT, KEPT_FLAGGED, named_outputs
from llmledger._report import PipelineReport, RunReport, Watcher
from llmledger._run.drive import run_batches, send_all
from llmledger._run.endpoints import compatible_note, gateway_note
from llmledger._run.frames import with_answers
from llmledger._run.loop import background_loop, run_blocking
from llmledger._run.plan import Plan, step_refusal
from llmledger._step.apis import batches_at
from llmledger._step.prices import price_of
from llmledger._time import utcnow
from llmledger.errors import (
    AuthenticationFailed,
    BudgetReachedWarning,
    InvalidInputError,
    ModelNotFound,
    OutageError,
    RequestRefused,
    RetryRefused,
    RunningElsewhereWarning,
    SpendLimitReached,
    StaleAnswersWarning,
    StoreBusy,
    warn,
)

_local = threading.local()
_STOPPED = {
    Outcome.AUTH: AuthenticationFailed,
    Outcome.OUTAGE: OutageError,
    Outcome.SPEND_LIMIT: SpendLimitReached,
    Outcome.RETRY_REFUSED: RetryRefused,
    Outcome.NO_MODEL: ModelNotFound,
    Outcome.BAD_REQUEST: RequestRefused,
}


def last_report() -> RunReport | PipelineReport | None:
    """The report of the last run this thread waited for (a foreground apply_llm, resume or apply_llm_async; after
    `pipeline()`, a `PipelineReport` of all its steps, with their totals).

    Background runs keep theirs on their handle (`run.report`).
    """
    return getattr(_local, "report", None)


def set_last_report(report: RunReport | PipelineReport) -> None:
    _local.report = report


def final_outcome(during: Outcome, *, foreground: bool, failed: bool) -> Outcome:
    """How a run ended, from what it was when sending stopped: RUNNING (no sender stopped it), or the reason a
    sender (or a cancel before sending) stopped it; `failed`: sending raised. A stop in the background is a
    cancel (`Run.cancel`), not a Ctrl-C; and a run that raised never says it is still going."""
    if failed:
        return during if during.stopped_early else Outcome.ERROR
    if during in (Outcome.PREPARING, Outcome.RUNNING):
        return Outcome.COMPLETED
    if during is Outcome.INTERRUPTED and not foreground:
        return Outcome.CANCELLED
    return during


# Makes what a run reports to (`_view.live.make_display`), from (progress wanted, the report, in the background).
Watch = Callable[[bool, RunReport, bool], Watcher]


class Run:
    """One apply_llm (or resume) call. In the background: `progress()`, `wait()`, `cancel()`, `result()`.

    It is handed `watch`, which makes its view: the run never imports one, so it runs the same under a
    notebook widget, a terminal bar, a worker or a test.
    """

    def __init__(self, plan: Plan, *, watch: Watch) -> None:
        self.plan = plan
        self._watch = watch
        self.stop_flag = threading.Event()
        rows = plan.frame.height if plan.frame is not None else 0
        self.report = RunReport(
            table=plan.table,
            step=plan.step,
            rows=rows,
            max_cost_usd=plan.cfg.max_cost_usd,
            simulated=plan.cfg.source == SIMULATOR,
            null_fields=plan.null_fields,
            null_rows=plan.null_rows,
            skip_nulls=plan.skip_nulls,
        )
        self.report.outcome = Outcome.PREPARING
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._display: Watcher | None = None
        self._store_made: Callable[[], None] = lambda: None  # see start_background

    # -- the handle -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def progress(self) -> pl.DataFrame:
        """This run's numbers so far, as a one-row frame."""
        return self.report.progress_frame()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run ends; return its frame (or raise what stopped it).

        Like `concurrent.futures.Future.result`, raises `TimeoutError` if the run still goes after `timeout`
        seconds; the run goes on.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.plan.table}.{self.plan.step} is still going after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    result = wait

    def cancel(self, timeout: float = 30.0) -> None:
        """Stop like Ctrl-C: commit what finished, release the other claims."""
        self.stop_flag.set()
        self._done.wait(timeout)

    def dashboard(self) -> Any:
        """The live dashboard widget (or None outside a notebook front end)."""
        return getattr(self._display, "widget", None)

    def _ipython_display_(self) -> None:
        watcher = self._display or self._watch(False, self.report, True)
        watcher.show(self.report, running=not self.done)

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<llmledger Run {self.plan.table}.{self.plan.step} ({state}): {self.report}>"

    # -- running ----------------------------------------------------------------------------------
    def start_background(self) -> Run:
        self._display = self._watch(self.plan.progress, self.report, True)  # in the caller's cell
        self._store_made = expect_store(self.plan.store)  # a reader right after this call waits for a new store
        self._thread = threading.Thread(target=self._background, name="llmledger-run", daemon=True)
        self._thread.start()
        return self

    def _background(self) -> None:
        try:
            with contextlib.suppress(BaseException):
                self.execute(foreground=False)
        finally:
            self._store_made()

    def execute(self, *, foreground: bool) -> Any:
        """Prepare, run and finish; keep the result or the error for `wait()`; return or raise it."""
        try:
            self._result = self._execute(foreground=foreground)
            return self._result
        except BaseException as exc:
            self._error = exc
            if self.report.outcome is Outcome.PREPARING and self._display is not None:  # it never started
                self.report.outcome, self.report.message = Outcome.ERROR, f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    self._display.close(self.report)
            raise
        finally:
            self._done.set()
            if foreground:
                set_last_report(self.report)

    def _execute(self, *, foreground: bool) -> Any:
        """The run in three phases: prepare (collect ended batches, record the frame, claim), send, finish (record,
        read the answers back, say what happened). How it ended is decided once, by `final_outcome`."""
        ledger = open_ledger(self.plan.store, should_stop=self.stop_flag.is_set)
        if self._display is None:
            self._display = self._watch(self.plan.progress, self.report, False)
        view_up = threading.Event()
        ledger.on_wait = self._waiting_note(view_up)
        with Claimant.new() as claimant:
            started = utcnow()
            interrupted = self._collect_ended_batches(ledger, claimant, foreground=foreground)
            selection, batch = self._prepare(ledger, started)
            self.report.outcome = Outcome.RUNNING
            self.report.started = time.monotonic()
            if selection.to_send or (batch and self.plan.wait):  # it will send: a killed run leaves its row
                selection.survey = None  # out of date once rows are sent (or batches merged); read back at the end
                self._record(ledger, selection, claimant, started, finished=False)
            self._display.start()
            view_up.set()
            failed = True
            try:
                interrupted = self._send(ledger, selection, claimant, batch, foreground=foreground) or interrupted
                failed = False
            finally:
                self._conclude(selection, foreground=foreground, failed=failed)
                self._record(ledger, selection, claimant, started)
            outputs = self._outputs(ledger, selection)
            if self.plan.redo is not Redo.NONE and self.report.done:  # answers replaced: what went stale downstream
                self.report.downstream_stale = ledger.downstream_stale(self.plan.table, self.plan.step)
        return self._finish(outputs, interrupted)

    def _waiting_note(self, view_up: threading.Event) -> Callable[[str], None]:
        """What the ledger calls while the store is held: said at once, in the view once it is up."""
        plan, display = self.plan, self._display
        assert display is not None

        def waiting(message: str) -> None:
            if view_up.is_set():
                display.note(message)
            elif plan.progress:
                print(f"llmledger: {message}", file=sys.stderr, flush=True)

        return waiting

    def _collect_ended_batches(self, ledger: Ledger, claimant: Claimant, *, foreground: bool) -> bool:
        """Prepare, first part: merge what the step's batches sent earlier hold, if they have ended (only the
        provider's own API, or a gateway to it, has batches). True when Ctrl-C interrupted it."""
        plan, report = self.plan, self.report
        if plan.endpoint is not None and not plan.gateway:  # batches only a gateway's call would collect
            through = [b for b in ledger.open_batches(plan.table, plan.step) if b.source == plan.cfg.source]
            if through:
                report.notes.append(
                    f"{sum(b.rows for b in through):,} rows wait in {len(through)} batch(es) sent through "
                    f"{plan.endpoint} as a gateway: pass gateway=True (--gateway) to collect them"
                )
        if not (
            plan.batches_open  # apply_llm's look at the store found some (resume's plan does not look: True)
            and batches_at(plan.provider, plan.endpoint, plan.gateway)
            and ledger.open_batches(plan.table, plan.step)
        ):
            return False
        display = self._display
        return self._run_async(
            lambda: run_batches(ledger, None, plan, claimant, report, self.stop_flag, display, wait=False),
            foreground=foreground,
        )

    def _prepare(self, ledger: Ledger, started: Any) -> tuple[Selection, bool]:
        """Prepare, second part: record the frame (apply_llm) or look at the store (resume), claim, count; the
        selection, and whether it goes in batches."""
        plan, report = self.plan, self.report
        params = plan.params(started)
        inputs = plan.cfg.validate is not None
        if plan.definition is not None and plan.frame is not None:
            selection = ledger.prepare(
                plan.definition, plan.frame, params, dedupe=plan.cfg.dedupe, source=plan.user_frame, inputs=inputs
            )
        else:
            selection = ledger.resume(plan.table, plan.step, params, dedupe=plan.cfg.dedupe, inputs=inputs)
        self._store_made()  # the store exists now, with the step: readers waiting for it go on
        sent = selection.requests.get(selection.version)
        problem = None if sent is None else step_refusal(plan, sent)
        if problem is not None:  # apply_llm moved the step to another server since this call looked
            raise InvalidInputError(problem)
        self._take_counts(selection)
        if plan.endpoint is not None and plan.gateway and selection.to_send:
            report.notes.append(gateway_note(plan.endpoint, plan.provider))
        elif plan.endpoint is not None and selection.to_send:
            priced = sent is not None and price_of(sent.model) is not None
            report.notes.append(
                compatible_note(plan.endpoint, plan.cfg.concurrency, priced=priced, provider=plan.provider)
            )
        done_before = selection.done_skipped - report.done  # not the rows just merged from batches
        budget = plan.cfg.max_cost_usd is not None
        average = selection.average_paid
        report.done_saved_usd = max(done_before, 0) * average
        report.done_before, report.review_before = max(0, done_before - selection.stale), selection.needs_review
        batch = plan.mode == "batch" or (plan.mode == "auto" and selection.to_send >= AUTO_BATCH_ROWS)
        report.mode = "batch" if batch else "flex" if plan.mode == "flex" else "online"
        if budget:  # what the step had spent, and what a request costs, as the run starts: the budget's start
            spent = ledger.spent(plan.table, plan.step) if plan.cfg.budget_scope == "step" else 0.0
            per_request = average * selection.rows_per_request  # a pack pays for its rows
            cfg = dataclasses.replace(plan.cfg, average_before_usd=per_request, spent_before_usd=spent)
            self.plan = dataclasses.replace(plan, cfg=cfg)
            report.spent_before_usd = spent
        return selection, batch

    def _send(self, ledger: Ledger, selection: Selection, claimant: Claimant, batch: bool, *, foreground: bool) -> bool:
        """Send: the claimed rows, online or in batches (and with wait=True, wait for the step's batches). True
        when Ctrl-C interrupted it; a sender that stops the run early says why in `report.outcome`."""
        plan, report, display = self.plan, self.report, self._display
        if self.stop_flag.is_set():  # cancelled before anything was sent
            report.outcome = Outcome.INTERRUPTED
            return False
        if batch and (selection.to_send or plan.wait):
            return self._run_async(
                lambda: run_batches(ledger, selection, plan, claimant, report, self.stop_flag, display, wait=plan.wait),
                foreground=foreground,
            )
        if selection.to_send:
            return self._run_async(
                lambda: send_all(ledger, selection, plan, claimant, report, self.stop_flag, display),
                foreground=foreground,
            )
        return False

    def _conclude(self, selection: Selection, *, foreground: bool, failed: bool) -> None:
        """Finish, first part: how the run ended, its time, and the view's last word."""
        report = self.report
        report.outcome = final_outcome(report.outcome, foreground=foreground, failed=failed)
        if report.collected and not selection.to_send:
            report.mode = "batch"  # all it paid for came from batches sent earlier
        report.seconds = time.monotonic() - report.started
        assert self._display is not None
        self._display.close(report)

    def _finish(self, outputs: Any, interrupted: bool) -> Any:
        """Finish, last part: the summary (or the warning a quiet run owes), then the answers, or the error that
        says why the run stopped early."""
        plan, report = self.plan, self.report
        assert self._display is not None
        if plan.progress or interrupted:  # after Ctrl-C the summary is the only word on what happened
            self._display.summary(report)
        elif outputs is not None:  # quiet, but stale answers are never passed off as fresh, nor missing ones
            if report.stale:  # as merely absent
                warn(report.stale_hint(), StaleAnswersWarning)
            if report.running_elsewhere:
                warn(report.elsewhere_hint(), RunningElsewhereWarning)
            if report.outcome is Outcome.BUDGET:  # rows left unanswered on purpose, which a quiet run must say
                warn(f"{report.message} {report.remaining:,} of {report.selected:,} selected rows were not sent.",
                     BudgetReachedWarning)  # fmt: skip
        if interrupted:
            raise KeyboardInterrupt(str(report))
        stopped = _STOPPED.get(report.outcome)
        if stopped is not None:
            raise stopped(
                f"{report.message} {report.remaining:,} of {report.selected:,} selected rows remain.", report=report
            )
        return report if outputs is None else outputs

    def _run_async(self, make: Any, *, foreground: bool) -> bool:
        """Run a coroutine on llmledger's loop; True when Ctrl-C interrupted it (foreground only)."""
        if foreground:
            return run_blocking(make, self.stop_flag.set)[1]
        asyncio.run_coroutine_threadsafe(make(), background_loop()).result()
        return False

    def _take_counts(self, selection: Selection) -> None:
        report = self.report
        report.selected = selection.to_send
        report.stale = selection.stale
        report.unsimulated = selection.unsimulated
        report.recovered = selection.recovered
        report.waiting = selection.waiting
        report.running_elsewhere = selection.running_elsewhere
        report.unprepared = selection.unprepared
        if self.plan.frame is None:
            report.rows = report.selected + report.running_elsewhere
        report.in_batches = selection.in_batches
        report.early_finished = report.done + report.failed + report.needs_review  # by batches merged first
        report.skipped = max(
            0, report.rows - report.selected - report.running_elsewhere - report.in_batches - report.early_finished
        )

    def _record(
        self, ledger: Ledger, selection: Selection, claimant: Claimant, started: Any, *, finished: bool = True
    ) -> None:
        """The run's row in llmledger_runs: written as it starts sending (outcome 'running', so a run that is
        killed still shows, with when it began), replaced with its figures when it ends."""
        report, plan = self.report, self.plan
        request = selection.requests.get(selection.version)
        row = {
            "run_id": claimant.run_id,
            "table_name": plan.table,
            "step": plan.step,
            "claimant": str(claimant),
            "model": request.model if request else None,
            "started_at": started,
            "finished_at": utcnow() if finished else None,
            "outcome": str(report.outcome),
            "rows_in_frame": report.rows,
            "rows_selected": report.selected,
            "stale": report.stale,
            **report.paid_figures(),
            "version": selection.version,
            "entry": plan.entry,
            "mode": report.mode,
        }
        try:
            ledger.record_run(row)
        except StoreBusy:
            report.message += " (the store stayed locked, so this run is missing from llmledger_runs)"

    def _outputs(self, ledger: Ledger, selection: Selection) -> Any:
        """The frame with the step's output and status appended (None for resume)."""
        plan = self.plan
        if plan.frame is None:
            return None
        step = plan.step
        if not selection.work.height and selection.survey is not None:  # nothing was sent: what prepare saw is current
            found = named_outputs(selection.survey, step)
        else:
            found = ledger.outputs(selection, plan.frame.select(selection.layout.key))
        stale, kept = found[f"{step}_stale"], found[KEPT]
        self.report.stale = int((stale & ~kept).sum())  # after the run: what a redo='stale' would re-send
        self.report.kept_stale = int((stale & kept).sum())  # and what it keeps: a person accepted or wrote them
        # rows still RUNNING now are another run's (this one gave its claims back): what the frame shows unanswered
        self.report.running_elsewhere = int((found[f"{step}_status"] == "RUNNING").sum())
        if plan.redo is Redo.FLAGGED:  # flags it did not act on: a person wrote those answers
            self.report.kept_flagged = int(found[KEPT_FLAGGED].sum())
        found = found.drop(KEPT, KEPT_FLAGGED)
        if found[step].dtype == pl.Null:  # no row has an answer yet, so nothing said its type
            found = found.with_columns(pl.col(step).cast(pl.String))
        return with_answers(plan, found)
