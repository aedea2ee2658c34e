"""One long-lived event loop in a daemon thread, shared by every run in the process.

Jupyter already runs a loop in the main thread, so `asyncio.run` cannot be
used there; and an `AsyncAnthropic` client keeps connections bound to the loop
that first used it, so each run getting a fresh loop would break a client
passed in twice. A single background loop avoids both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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


def run_blocking(make: Callable[[], Coroutine[Any, Any, T]], on_interrupt: Callable[[], None]) -> tuple[T, bool]:
    """Run a coroutine on the background loop and wait for it.

    A KeyboardInterrupt while waiting (Ctrl-C, the kernel's stop button) calls
    `on_interrupt` and keeps waiting for the coroutine to wind down; the
    second element of the result says whether that happened.
    """
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(), background_loop())
    interrupted = False
    while True:
        try:
            return future.result(timeout=0.1), interrupted
        except TimeoutError:
            continue
        except KeyboardInterrupt:
            interrupted = True
            on_interrupt()
