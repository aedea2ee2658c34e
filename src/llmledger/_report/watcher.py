"""The `Watcher` a run reports to while it goes: a live widget, a tqdm bar, or nothing.

Its own module because it is the one seam between a run and what a person sees: `_run` and `_exec` report to a
Watcher they are handed, `_view.live` makes them, and neither side imports the other.
"""

from __future__ import annotations

from typing import Any, Protocol

from llmledger._report.run_report import RunReport


class Watcher(Protocol):
    """What a run reports to: a live widget, a tqdm bar, or nothing. `start` once the rows to send are known,
    `update` as answers land, `note` for a passing word ("waiting for the store"), `close` when it ends, then
    `summary` for the end in words (a live view that became the summary says nothing more); `show` draws a
    background run's handle."""

    widget: Any  # the view's widget, where it has one (a run handle in a notebook shows it)

    def start(self) -> None: ...

    def update(self, report: RunReport, n: int) -> None: ...

    def note(self, message: str) -> None: ...

    def close(self, report: RunReport) -> None: ...

    def summary(self, report: RunReport) -> None: ...

    def show(self, report: RunReport, *, running: bool) -> None:
        """A run's handle shown in a notebook: its live view while it runs, else its summary."""
        ...
