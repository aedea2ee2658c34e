"""One long-lived event loop in a daemon thread, shared by every run in the process.

Jupyter already runs a loop in the main thread, so `asyncio.run` cannot be
used there; and an `AsyncAnthropic` client keeps connections bound to the loop
that first used it, so each run getting a fresh loop would break a client
passed in twice. A single background loop avoids both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_guard = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _guard:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="llmledger-loop", daemon=True).start()
            _loop = loop
        return _loop


class _CtrlCStops:
    """While a foreground run waits for its coroutine, Ctrl-C (SIGINT) calls `stop` instead of raising.

    A KeyboardInterrupt lands on whatever line the waiting thread is on: found in a trial (a burst of SIGINTs at
    apply_llm), one between sending the coroutine to the loop and starting to wait for it, or inside the call
    that stops it, left the run's coroutine going on the loop with nobody waiting and nothing stopping it, still
    holding its rows, while the call had already raised. So the waiting thread takes no KeyboardInterrupt at all
    while the coroutine runs: the handler only notes the Ctrl-C and calls `stop` (once: a burst of them stops the
    run once, and `stop`'s own lock is never taken twice by this thread). Outside the main thread, or where SIGINT
    is ignored or left to the system, nothing changes.
    """

    def __init__(self, stop: Callable[[], None]) -> None:
        self.stop, self.noted = stop, False
        self.old: Any = None

    def __enter__(self) -> _CtrlCStops:
        if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
            self.old = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if not self.noted:
            self.noted = True
            self.stop()

    def __exit__(self, *exc: object) -> None:
        old, self.old = self.old, None
        if old is not None:
            signal.signal(signal.SIGINT, old)


def run_blocking(make: Callable[[], Coroutine[Any, Any, T]], on_interrupt: Callable[[], None]) -> tuple[T, bool]:
    """Run a coroutine on the background loop and wait for it.

    A Ctrl-C while it runs (the kernel's stop button, a burst of them) calls `on_interrupt` and keeps waiting
    for the coroutine to wind down; the second element of the result says whether that happened. One before
    the coroutine is sent raises KeyboardInterrupt as usual (nothing was started), one after it ended too
    (everything it did is done).
    """
    with _CtrlCStops(on_interrupt) as ctrl_c:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(), background_loop())
        interrupted = False
        while True:
            try:
                return future.result(timeout=0.1), interrupted or ctrl_c.noted
            except TimeoutError:
                continue
            except KeyboardInterrupt:  # raised some other way than by SIGINT (not in the main thread, say)
                interrupted = True
                on_interrupt()
