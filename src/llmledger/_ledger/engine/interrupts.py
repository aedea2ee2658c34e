"""Ctrl-C and a store: what keeps a KeyboardInterrupt from leaving a store's lock taken or DuckDB half-loaded.

Python raises KeyboardInterrupt in the main thread at whatever line it is on. Found in a trial (a burst of SIGINTs
at foreground apply_llm calls, issue 29): one landing as a `with` block on a DuckDB store ended left the store's
per-file lock taken for good (the next call in the process waited forever); DuckDB turned others into a bare
RuntimeError; and one during the first import of pyarrow broke every later read of the process.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import duckdb


class CtrlCHeld:
    """Ctrl-C held back in the main thread while a store is opened, used and closed; acted on as the block ends.

    Python raises KeyboardInterrupt at whatever line the main thread is on, and the lines that take a store's
    lock, open its file, close it and give the lock back are Python too. Found in a trial (a burst of SIGINTs at
    apply_llm): one landing as a `with` block on the store ended left the store's lock taken by a block that
    never finished, and the next call in the process waited for it for good. While held, a Ctrl-C is noted; one
    that would raise (Python's own handler) also interrupts the statement running (`con`, DuckDB stops it at
    once, `Connection.open` raises KeyboardInterrupt for it); as the block ends, with its file closed and its
    lock given back, the handler that was in place is called for it. Outside the main thread, or where SIGINT
    is ignored or left to the system, nothing changes.
    """

    def __init__(self) -> None:
        self.old: Any = None
        self.noted = False
        self.con: Any = None  # the connection whose statement a Ctrl-C interrupts

    def __enter__(self) -> CtrlCHeld:
        if threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT)):
            self.old = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.noted = True
        if self.con is not None and self.old is signal.default_int_handler:
            self.con.interrupt()

    def __exit__(self, *exc: object) -> None:
        old, self.old = self.old, None
        if old is not None:
            signal.signal(signal.SIGINT, old)
            if self.noted:
                old(signal.SIGINT, sys._getframe())


# What DuckDB raises (a RuntimeError) when a Ctrl-C reaches the main thread during a statement: it swallows the
# KeyboardInterrupt. `interrupts_kept` gives it back (and for DuckDB's InterruptException, see CtrlCHeld), so
# that a stopped call stops as on any other line.
_INTERRUPTED = "Query interrupted"


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    try:
        yield
    except (RuntimeError, duckdb.InterruptException) as exc:
        if isinstance(exc, RuntimeError) and str(exc) != _INTERRUPTED:
            raise
        raise KeyboardInterrupt from exc


def load_pyarrow() -> None:
    """Import pyarrow, which DuckDB reads and returns frames through, in a thread of its own, where no Ctrl-C lands.

    Found in a trial (a burst of SIGINTs at apply_llm): a Ctrl-C during the first import of pyarrow, DuckDB's own or
    Python's, left a half-made module behind (its submodules kept, not bound to the package made again), and every
    later read of the process failed ("module 'pyarrow' has no attribute 'lib'"). A Ctrl-C now stops the waiting
    for the import, not the import.
    """
    global _pyarrow_loaded
    if not _pyarrow_loaded:
        loader = threading.Thread(target=importlib.import_module, args=("pyarrow",), name="llmledger-import")
        loader.start()
        loader.join()
        _pyarrow_loaded = "pyarrow" in sys.modules


_pyarrow_loaded = False
