"""SQL over a store from Python, safe to call while a run (in this kernel or another process) is going."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from . import _store as st


def _existing(store: str | Path) -> Path:
    path = Path(store).expanduser()
    st.check_store_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no store at {str(path)!r}; apply_llm(..., store=...) creates it")
    return path


def sql(store: str | Path, query: str, params: Any = None, *, wait: float = 60.0) -> pl.DataFrame | None:
    """Run `query` on the store and return the result as a polars frame (None for statements without rows).

    The file is opened only for this query; a run in progress holds it only
    between claims and commits, so this waits at most a moment.
    """
    with st.Store(_existing(store)).open(wait=wait) as con:
        relation = con.sql(query, params=params)
        return None if relation is None else relation.pl()


def progress(store: str | Path, table: str | None = None, *, wait: float = 60.0) -> pl.DataFrame:
    """Rows per status for every (table, step) in the store."""
    with st.Store(_existing(store)).open(wait=wait) as con:
        return st.status_counts(con, table)
