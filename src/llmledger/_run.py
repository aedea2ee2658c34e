"""A run from start to end: prepare the ledger, send, commit, return the frame — in front or in the background.

`Run` is also the handle `apply_llm(..., background=True)` returns: the user
keeps working in other cells while it goes, and can look at `progress()`,
`wait()`, `cancel()` it (which stops like Ctrl-C) or show its dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import polars as pl

from . import _store as st
from ._claims import Claimant, is_abandoned
from ._client import Reply, bounded_timeout, default_client
from ._display import make_display, show_summary
from ._loop import background_loop, run_blocking
from ._prompt import FINGERPRINT_COL, PROMPT_COL
from ._report import RunReport
from ._runner import Outcome, RunConfig, Runner, merge_journals, utcnow
from .errors import AuthenticationFailed, InvalidInputError, OutageError

_last_report: RunReport | None = None


def last_report() -> RunReport | None:
    """The report of the most recent run to finish in this process."""
    return _last_report


@dataclass
class Plan:
    """A checked call: everything a run needs, nothing written yet."""

    df: Any  # what the user passed (returned in kind)
    frame: pl.DataFrame
    from_pandas: bool
    keys: list[str]
    table: str
    step: str
    where: str | None
    stale: timedelta
    cfg: RunConfig
    store: Path
    incoming: pl.DataFrame  # the frame's storable columns + prompt + fingerprint
    template_text: str
    client: anthropic.AsyncAnthropic | None
    progress: bool


class Run:
    """One apply_llm call. In the background: `progress()`, `wait()`, `cancel()`, `result()`."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.stop_flag = threading.Event()
        self.report = RunReport(table=plan.table, step=plan.step, rows=plan.frame.height)
        self.report.outcome = "preparing"
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._display: Any = None

    # -- the handle -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    def progress(self) -> pl.DataFrame:
        """This run's numbers so far, as a one-row frame."""
        return self.report.progress_frame()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run ends; return its frame (or raise what stopped it)."""
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
        from IPython.display import display

        widget = self.dashboard()
        if widget is not None and not self.done:
            display(widget)
        else:
            display(self.report)

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<llmledger Run {self.plan.table}.{self.plan.step} ({state}): {self.report}>"

    # -- running ----------------------------------------------------------------------------------
    def start_background(self) -> Run:
        self._display = make_display(self.plan.progress, self.report, background=True)  # in the caller's cell
        self._thread = threading.Thread(target=self._background, name="llmledger-run", daemon=True)
        self._thread.start()
        return self

    def _background(self) -> None:
        with contextlib.suppress(BaseException):
            self.execute(foreground=False)

    def execute(self, *, foreground: bool) -> Any:
        """Prepare, run and finish; store the result or the error for `wait()`; return or raise it."""
        try:
            self._result = self._execute(foreground=foreground)
            return self._result
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._done.set()

    def _execute(self, *, foreground: bool) -> Any:
        global _last_report
        plan, report = self.plan, self.report
        ledger = st.Store(plan.store, should_stop=self.stop_flag.is_set)
        if self._display is None:
            self._display = make_display(plan.progress, report)
        interrupted = False
        with Claimant.new() as claimant:
            started = utcnow()
            layout, work, counts, known = _prepare(ledger, plan, started)
            report.selected = work.height
            report.stale = counts["stale"] if plan.cfg.redo != "stale" else 0
            report.running_elsewhere = counts["running_elsewhere"]
            report.skipped = plan.frame.height - work.height - report.running_elsewhere
            report.outcome = "running"
            report.started = time.monotonic()
            self._display.start()
            ledger.on_wait = self._display.note
            try:
                if work.height:
                    def make() -> Any:
                        return _send_all(ledger, layout, work, plan, claimant, report, started, self.stop_flag,
                                         self._display, known)

                    if foreground:
                        _, interrupted = run_blocking(make, self.stop_flag.set)
                    else:
                        asyncio.run_coroutine_threadsafe(make(), background_loop()).result()
                if report.outcome == "running":
                    report.outcome = "completed"
                if report.outcome == "interrupted" and not foreground:
                    report.outcome = "cancelled"
            finally:
                report.seconds = time.monotonic() - report.started
                self._display.close(report)
                outputs = ledger.transaction(lambda con: _finish(con, layout, plan, report, claimant, started),
                                             wait=30.0)
        _last_report = report
        if plan.progress or interrupted:  # after Ctrl-C the summary is the only word on what happened
            show_summary(report)
        if interrupted:
            raise KeyboardInterrupt(str(report))
        if report.outcome == "auth":
            raise AuthenticationFailed(report.message, report=report)
        if report.outcome == "outage":
            raise OutageError(f"{report.message} {report.remaining:,} of {report.selected:,} selected rows remain.",
                              report=report)
        return _attach(plan, outputs)


# -- the steps of a run --------------------------------------------------------------------------------

def _prepare(ledger: st.Store, plan: Plan,
             started: Any) -> tuple[st.Layout, pl.DataFrame, dict[str, int], dict[str, Outcome]]:
    """One transaction: schema, new rows, journals of dead runs, abandoned claims, and what to send."""
    cfg, keys, frame = plan.cfg, plan.keys, plan.frame
    existed = ledger.path.exists()
    journals: list[Path] = []

    def work(con: Any) -> tuple[st.Layout, pl.DataFrame, dict[str, int], dict[str, Outcome]]:
        con.register(st.INCOMING, plan.incoming)
        owned = st.owned_columns(con, plan.table, plan.step)
        mirror = [c for c in plan.incoming.columns if c not in keys and c not in owned
                  and c not in (PROMPT_COL, FINGERPRINT_COL)]
        layout = st.Layout(table=plan.table, step=plan.step, key=keys, mirror=mirror)
        st.ensure_schema(con, layout, model=cfg.model, prompt=plan.template_text, system=cfg.system, now=started)
        st.upsert(con, layout)
        journals[:] = merge_journals(con, layout, ledger.path, {k: frame.schema[k] for k in keys})
        st.recover_claims(con, layout, max_attempts=cfg.max_attempts, stale_before=started - plan.stale,
                          is_abandoned=is_abandoned)
        params = {"max_attempts": cfg.max_attempts, "redo": cfg.redo, "run_started": started}
        rows, counts = st.select_work(con, layout, where=plan.where, params=params)
        con.unregister(st.INCOMING)
        known: dict[str, Outcome] = {}
        if cfg.dedupe and cfg.redo != "all" and rows.height:  # a redo asks for a fresh answer
            for r in st.known_answers(con, layout, rows).iter_rows(named=True):
                known[r["fingerprint"]] = (Reply(r["output"], 0, 0, r["stop_reason"], r["model"]), None)
        return layout, rows.cast({k: frame.schema[k] for k in keys}), counts, known

    try:
        result = ledger.transaction(work)
    except InvalidInputError:
        if not existed:  # a bad call leaves no file behind
            for leftover in (ledger.path, ledger.path.with_name(ledger.path.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        raise
    for path in journals:
        path.unlink(missing_ok=True)
    return result


async def _send_all(ledger: st.Store, layout: st.Layout, work: pl.DataFrame, plan: Plan, claimant: Claimant,
                    report: RunReport, started: Any, stop_flag: threading.Event, display: Any,
                    known: dict[str, Outcome]) -> RunReport:
    own = plan.client is None
    api = default_client() if own else plan.client
    api = api.with_options(max_retries=0, timeout=bounded_timeout(api.timeout, max_tokens=plan.cfg.max_tokens))
    try:
        runner = Runner(store=ledger, layout=layout, work=work, cfg=plan.cfg, client=api, claimant=claimant,
                        report=report, run_started=started, stop_flag=stop_flag, on_progress=display.update,
                        known=known)
        return await runner.run()
    finally:
        if own:
            await api.close()


def _finish(con: Any, layout: st.Layout, plan: Plan, report: RunReport, claimant: Claimant,
            started: Any) -> pl.DataFrame:
    st.record_run(con, {
        "run_id": claimant.run_id, "table_name": layout.table, "step": layout.step, "claimant": str(claimant),
        "model": plan.cfg.model, "started_at": started, "finished_at": utcnow(), "outcome": report.outcome,
        "rows_in_frame": report.rows, "rows_selected": report.selected, "done": report.done,
        "failed": report.failed, "needs_review": report.needs_review, "stale": report.stale,
        "calls": report.calls, "reused": report.reused, "retries": report.retries,
        "input_tokens": report.input_tokens, "output_tokens": report.output_tokens, "cost_usd": report.cost_usd,
    })
    return st.read_outputs(con, layout, plan.frame.select(plan.keys))


def _attach(plan: Plan, outputs: pl.DataFrame) -> Any:
    """The input rows in their order, with the step's output and status appended."""
    frame, keys, step = plan.frame, plan.keys, plan.step
    names = [step, f"{step}_status"]
    outputs = outputs.cast({k: frame.schema[k] for k in keys})
    joined = frame.select(keys).join(outputs, on=keys, how="left", maintain_order="left")
    if plan.from_pandas:
        out = plan.df.copy()
        for name in names:
            out[name] = joined[name].to_list()
        return out
    return pl.concat([frame.drop(names, strict=False), joined.select(names)], how="horizontal")
