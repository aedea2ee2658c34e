"""What a run shows: a live view in a notebook that becomes its summary, else one tqdm.auto bar and a line.

The live view is a single HTML widget redrawn a few times a second from the
run's report (so it never floods the cell output): the step's rows as a
stacked bar, pace, cost against budget and estimate, the rate limit that
binds, a sparkline of throughput and retries, errors by kind. When the run
ends the same output shows the summary, as plain HTML a saved notebook keeps,
and nothing else is printed. A kernel without a widget front end (nbconvert,
nbclient) shows a tqdm bar, then the summary view once; a terminal gets the
tqdm bar and the one-line summary.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Protocol

from ._report import RunReport
from ._view import (
    FAILURE_COLOUR,
    SEGMENTS,
    Timeline,
    badge,
    bar_html,
    errors_html,
    esc,
    figures_html,
    legend_html,
    panel_html,
    sparkline_svg,
)

REFRESH_SECONDS = 0.25


def _shell() -> Any:
    """The running IPython shell, if IPython is imported and running (never imports it)."""
    module = sys.modules.get("IPython")
    try:
        return module.get_ipython() if module is not None else None  # type: ignore[attr-defined]
    except AttributeError:
        return None


def in_kernel() -> bool:
    """True inside a Jupyter kernel (not a terminal IPython, not plain Python)."""
    return type(_shell()).__name__ == "ZMQInteractiveShell"


def widget_frontend() -> bool:
    """A kernel whose front end draws widgets: JupyterLab/Notebook set JPY_SESSION_NAME, VS Code VSCODE_PID.

    LLMLEDGER_PROGRESS=widget or =text forces the choice.
    """
    forced = os.environ.get("LLMLEDGER_PROGRESS", "").lower()
    if forced in ("widget", "text"):
        return forced == "widget" and in_kernel()
    return in_kernel() and bool(os.environ.get("JPY_SESSION_NAME") or os.environ.get("VSCODE_PID"))


def current_cell() -> int | None:
    """The execution count of the cell running now (None outside IPython)."""
    return getattr(_shell(), "execution_count", None)


class Display(Protocol):
    def start(self) -> None: ...
    def update(self, report: RunReport, n: int) -> None: ...
    def note(self, message: str) -> None: ...
    def close(self, report: RunReport) -> None: ...


class Silent:
    def start(self) -> None:
        pass

    def update(self, report: RunReport, n: int) -> None:
        pass

    def note(self, message: str) -> None:
        """progress=False (or --quiet) asked for silence: a passing note ("waiting for ledger.duckdb") is not news
        worth breaking it for; what the run ends with is in its report and its errors."""

    def close(self, report: RunReport) -> None:
        pass


class Bar:
    """One tqdm.auto bar over the rows a run sends."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        self._bar: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        from tqdm.auto import tqdm

        if self.report.selected:
            self._bar = tqdm(total=self.report.selected, desc=f"{self.report.table}.{self.report.step}", unit="row",
                             file=sys.stderr, dynamic_ncols=True, mininterval=REFRESH_SECONDS)

    def update(self, report: RunReport, n: int) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._bar.update(n)
            self._bar.set_postfix(failed=report.failed + report.needs_review, calls=report.calls,
                                  retries=report.retries, refresh=False)

    def note(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self, report: RunReport) -> None:
        if self._bar is not None:
            self._bar.close()


class Dashboard:
    """The live view of a run in a widget front end, redrawn in place; at the end it becomes the summary,
    as plain HTML in the same output (a widget's state is not saved with the notebook; HTML is)."""

    def __init__(self, report: RunReport) -> None:
        import ipywidgets
        from IPython.display import display

        self.report = report
        self.timeline = Timeline()
        self.widget = ipywidgets.HTML(value=run_html(report, live=True), layout=ipywidgets.Layout(width="100%"))
        self.widget.add_class("llmledger-dashboard")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notes: list[str] = []
        self._handle = display(self.widget, display_id=True)  # None outside IPython
        self.cell = current_cell()  # where it is shown

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refresh, name="llmledger-dashboard", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        r = self.report
        self.timeline.sample(r.done + r.failed + r.needs_review, r.retries)

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            self._sample()
            self.widget.value = run_html(self.report, timeline=self.timeline, notes=self._notes, live=True)

    def update(self, report: RunReport, n: int) -> None:
        pass  # the refresh thread redraws from the report

    def note(self, message: str) -> None:
        self._notes[:] = [message]

    def close(self, report: RunReport) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._sample()
        self._notes.clear()
        final = run_html(report, timeline=self.timeline, live=False)
        self.widget.value = final
        if self._handle is not None:  # the output becomes plain HTML: a saved notebook keeps the summary
            from IPython.display import HTML

            with contextlib.suppress(Exception):
                self._handle.update(HTML(final))


def make_display(enabled: bool, report: RunReport, *, background: bool = False) -> Display:
    """The dashboard where widgets draw; else a tqdm bar, but not for a background run, whose
    bar would spill into whatever cell runs next (its `progress()` is there instead)."""
    if not enabled:
        return Silent()
    if widget_frontend():
        try:
            return Dashboard(report)
        except ImportError:
            pass
    return Silent() if background else Bar(report)


def show_summary(report: RunReport, shown: Display | None = None) -> None:
    """The end of a run in words: nothing more where the live view became the summary; the summary view in a
    notebook without widgets; the one-line summary (and what to do next) in a terminal."""
    if isinstance(shown, Dashboard):
        return
    if in_kernel():
        from IPython.display import display

        display(report)
        return
    print(str(report))
    for hint in report.hints():
        print("  " + hint)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


OUTCOME_COLOURS = {"preparing": "#757575", "running": SEGMENTS["RUNNING"].colour,
                   "completed": SEGMENTS["DONE"].colour, "interrupted": "#757575", "cancelled": "#757575",
                   "budget": SEGMENTS["NEEDS_REVIEW"].colour}


def run_html(report: RunReport, *, timeline: Timeline | None = None, notes: list[str] | None = None,
             live: bool = False) -> str:
    """One run at a glance: its step's rows as a bar, its pace, cost and errors; live, or as the summary."""
    r = report
    outcome = str(r.outcome)
    head = (f"<b>llmledger · {esc(r.table)}.{esc(r.step)}</b>"
            + badge(outcome, OUTCOME_COLOURS.get(outcome, FAILURE_COLOUR), field="outcome")
            + (badge(r.mode, "#607d8b") if r.mode == "batch" else "")
            + (badge("simulated answers", "#6d4c41", field="simulated") if r.simulated else ""))
    figures = [("sent", f"{r.sent:,} of {r.selected:,}")]
    if live:
        figures += [("rows/s", f"{r.rate:,.1f}"), ("ETA", "—" if r.eta is None else _duration(r.eta)),
                    ("elapsed", _duration(r.elapsed))]
        if r.in_batches or r.batch_pending:
            figures.append(("in batches", f"{max(r.in_batches, r.batch_pending):,}"))
    else:
        figures.append(("time", _duration(r.seconds)))
    figures += [("calls paid", f"{r.calls:,}"), ("reused", f"{r.reused:,}")]
    if r.retries:
        figures.append(("retries", f"{r.retries:,}" + (f" ({r.rate_limited:,} × 429)" if r.rate_limited else "")))
    cached = f" (cache: {r.cache_read_tokens:,} read)" if r.cache_read_tokens else ""
    figures.append(("tokens in / out", f"{r.input_tokens:,} / {r.output_tokens:,}{cached}"))
    figures.append(("cost", "n/a (no known price)" if r.cost_usd is None else f"${r.cost_usd:,.4f}"))
    if r.max_cost_usd is not None:
        spent = r.spent_before_usd + (r.cost_usd or 0.0)
        figures.append(("budget", f"${r.max_cost_usd:,.4f}" + (f" ({spent / r.max_cost_usd:.0%} used"
                        + (", with earlier runs of the step" if r.spent_before_usd else "") + ")"
                        if r.max_cost_usd else "")))
    projected = r.projected_usd
    if live and projected is not None:
        figures.append(("estimated total", f"${projected:,.4f}"))
    if live and r.binding_limit:
        figures.append(("rate limit", r.binding_limit))
    avoided = r.avoided_usd
    if not live and avoided:
        figures.append(("avoided", f"${avoided:,.4f} ({r.avoided_reasons()})"))
    bar = r.bar()
    body = bar_html(bar) + legend_html(bar) + figures_html(figures)
    if timeline is not None:
        rates, retries, seconds = timeline.series()
        body += f"<div>{sparkline_svg(rates, retries, seconds=seconds)}</div>"
    body += "".join(f"<div style='color:#757575'>{esc(n)}</div>" for n in notes or [])
    if r.message and not live:
        body += f"<div style='color:{FAILURE_COLOUR}'>{esc(r.message)}</div>"
    body += errors_html(r.error_lines())
    if not live:
        body += "".join(f"<div class='llmledger-hint' style='color:#555'>{esc(h)}</div>" for h in r.hints()
                        if h != r.message)
    return panel_html("llmledger-status" if live else "llmledger-summary", head, body)
