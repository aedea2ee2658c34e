"""SQL over a store from Python, safe to call while a run (in this kernel or another process) is going.

The file is opened only for one query; a run in progress holds it only
between claims and commits, so these wait at most a moment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from ._ledger import open_ledger
from ._ledger.connection import check_store_path


def _existing(store: str | Path) -> Path:
    path = Path(store).expanduser()
    check_store_path(path, must_exist=True)
    return path


def sql(store: str | Path, query: str, params: Any = None, *, wait: float = 60.0) -> pl.DataFrame | None:
    """Run `query` on the store and return the result as a polars frame (None for statements without rows)."""
    return open_ledger(_existing(store)).query(query, params, wait=wait)


def progress(store: str | Path, table: str | None = None) -> pl.DataFrame:
    """Rows per status for every (table, step) in the store."""
    return open_ledger(_existing(store)).counts(table)


def history(store: str | Path, table: str, step: str) -> pl.DataFrame:
    """The answers redos replaced for one step, oldest first (row key as JSON, output, fingerprint, tokens, times)."""
    return open_ledger(_existing(store)).history(table, step)
