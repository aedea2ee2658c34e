"""Progress while a run goes: a tqdm.auto bar (a widget in Jupyter, text elsewhere)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from ._report import RunReport


class Progress:
    """Thread-safe progress bar over the rows a run sends; silent when disabled."""

    def __init__(self, *, total: int, label: str, enabled: bool) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if enabled and total:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=label, unit="row", file=sys.stderr, dynamic_ncols=True,
                             mininterval=0.25)

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

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
