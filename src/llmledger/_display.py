"""What a run shows while it goes: a live ipywidgets dashboard in a notebook, else one tqdm.auto bar.

The dashboard is a single HTML widget re-rendered a few times a second from
the run's report, so it never floods the cell output. A kernel without a
widget front end (nbconvert, nbclient, a plain console) gets the tqdm bar.
"""

from __future__ import annotations

import html
import os
import sys
import threading
from typing import Any, Protocol

from ._report import RunReport

REFRESH_SECONDS = 0.25


def in_kernel() -> bool:
    """True inside a Jupyter kernel (not a terminal IPython, not plain Python)."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except AttributeError:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def widget_frontend() -> bool:
    """A kernel whose front end draws widgets: JupyterLab/Notebook set JPY_SESSION_NAME, VS Code VSCODE_PID.

    LLMLEDGER_PROGRESS=widget or =text forces the choice.
    """
    forced = os.environ.get("LLMLEDGER_PROGRESS", "").lower()
    if forced in ("widget", "text"):
        return forced == "widget" and in_kernel()
    return in_kernel() and bool(os.environ.get("JPY_SESSION_NAME") or os.environ.get("VSCODE_PID"))


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
        print(message, file=sys.stderr)

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
    """A live HTML widget: counts by status, rows/s, tokens, dollars, elapsed, ETA, retries, last errors."""

    def __init__(self, report: RunReport) -> None:
        import ipywidgets
        from IPython.display import display

        self.report = report
        self.widget = ipywidgets.HTML(value=render_html(report), layout=ipywidgets.Layout(width="100%"))
        self.widget.add_class("llmledger-dashboard")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notes: list[str] = []
        display(self.widget)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refresh, name="llmledger-dashboard", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_SECONDS):
            self.widget.value = render_html(self.report, self._notes)

    def update(self, report: RunReport, n: int) -> None:
        pass  # the refresh thread redraws from the report

    def note(self, message: str) -> None:
        self._notes[:] = [message]

    def close(self, report: RunReport) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._notes.clear()
        self.widget.value = render_html(report)


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


def show_summary(report: RunReport) -> None:
    """The end-of-run summary: an HTML table in a notebook, text elsewhere."""
    if in_kernel():
        from IPython.display import display

        display(report)
    else:
        print(str(report))
    for hint in report.hints():
        print("  " + hint)


def render_html(report: RunReport, notes: list[str] | None = None) -> str:
    """The dashboard: one step's counts and rates, and the last few errors."""
    r = report
    cost = "n/a" if r.cost_usd is None else f"${r.cost_usd:,.4f}"
    eta = "—" if r.eta is None else f"{r.eta:,.0f}s"
    cells = [
        ("to send", f"{r.remaining:,}"), ("in flight", f"{r.in_flight:,}"), ("DONE", f"{r.done:,}"),
        ("FAILED", f"{r.failed:,}"), ("NEEDS_REVIEW", f"{r.needs_review:,}"), ("skipped", f"{r.skipped:,}"),
        ("stale", f"{r.stale:,}"), ("reused", f"{r.reused:,}"), ("rows/s", f"{r.rate:,.1f}"),
        ("calls", f"{r.calls:,}"), ("tokens in/out", f"{r.input_tokens:,} / {r.output_tokens:,}"),
        ("cost", cost), ("avoided", "n/a" if r.avoided_usd is None else f"${r.avoided_usd:,.4f}"),
        ("retries", f"{r.retries:,}"), ("elapsed", f"{r.elapsed:,.1f}s"), ("ETA", eta),
    ]
    if r.submitted or r.in_batches:
        cells[1:1] = [("in batches", f"{r.in_batches:,}")]
    head = "".join(f"<th style='padding:2px 8px'>{html.escape(k)}</th>" for k, _ in cells)
    body = "".join(f"<td style='padding:2px 8px;text-align:right' data-field='{html.escape(k)}'>{html.escape(v)}</td>"
                   for k, v in cells)
    errors = "".join(f"<li>{html.escape(e[:200])}</li>" for e in r.errors[-3:])
    extra = "".join(f"<div>{html.escape(n)}</div>" for n in notes or [])
    return (f"<div class='llmledger-status'><b>llmledger · {html.escape(r.table)}.{html.escape(r.step)}</b> "
            f"<span data-field='outcome'>{html.escape(r.outcome)}</span>"
            f"<table><tr>{head}</tr><tr>{body}</tr></table>{extra}"
            + (f"<div>last errors:<ul>{errors}</ul></div>" if errors else "") + "</div>")
