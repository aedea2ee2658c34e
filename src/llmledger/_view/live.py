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
from typing import Any

from llmledger._draw import (
    Timeline,
)
from llmledger._report import RunReport, Watcher, run_html

REFRESH_SECONDS = 0.25


def _shell() -> Any:
    """The running IPython shell, if IPython is imported and running (never imports it)."""
    module = sys.modules.get("IPython")
    try:
        return module.get_ipython() if module is not None else None
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


class Silent:
    """progress=False, or a background run outside a widget front end: nothing while it goes."""

    widget: Any = None

    def start(self) -> None:
        pass

    def update(self, report: RunReport, n: int) -> None:
        pass

    def note(self, message: str) -> None:
        """progress=False (or --quiet) asked for silence: a passing note ("waiting for ledger.duckdb") is not news
        worth breaking it for; what the run ends with is in its report and its errors."""

    def close(self, report: RunReport) -> None:
        pass

    def summary(self, report: RunReport) -> None:
        _summary(report)

    def show(self, report: RunReport, *, running: bool) -> None:
        _display(report)


class Bar(Silent):
    """One tqdm.auto bar over the rows a run sends; at the end, the summary as `Silent` gives it."""

    def __init__(self, report: RunReport) -> None:
        self.report = report
        self._bar: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        from tqdm.auto import tqdm

        if self.report.selected:
            self._bar = tqdm(
                total=self.report.selected,
                desc=f"{self.report.table}.{self.report.step}",
                unit="row",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=REFRESH_SECONDS,
            )

    def update(self, report: RunReport, n: int) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._bar.update(n)
            self._bar.set_postfix(
                failed=report.failed + report.needs_review, calls=report.calls, retries=report.retries, refresh=False
            )

    def note(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def close(self, report: RunReport) -> None:
        if self._bar is not None:
            self._bar.close()

    def summary(self, report: RunReport) -> None:
        _summary(report)

    def show(self, report: RunReport, *, running: bool) -> None:
        _display(report)


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

    def summary(self, report: RunReport) -> None:
        pass  # the live view became the summary, in place

    def show(self, report: RunReport, *, running: bool) -> None:
        if self.cell == current_cell():
            return  # the run's view is right above, in this very cell: not twice
        _display(self.widget if running else report)


def make_display(enabled: bool, report: RunReport, background: bool = False) -> Watcher:
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


def _summary(report: RunReport) -> None:
    """The end of a run in words where no live view became it: the summary view in a notebook without widgets;
    the one-line summary (and what to do next) in a terminal."""
    if in_kernel():
        _display(report)
        return
    print(str(report))
    for hint in report.hints():
        print("  " + hint)


def _display(obj: Any) -> None:
    from IPython.display import display

    display(obj)
