"""The only place that knows DuckDB from PostgreSQL: `duckdb.py` opens a DuckDB file (one read-write process,
held only to claim or commit) and `postgres.py` gives a psycopg 3 connection the same shape.

`Con` is that shape: what the ledger's SQL calls on a connection, whichever engine is behind it. A call only one
engine has is made after asking `duckdb.dialect(con)`.
"""

from __future__ import annotations

from typing import Any, Protocol


class Con(Protocol):
    """A connection as the ledger's statements use it: DuckDB's own, or `postgres.PgCon`."""

    def execute(self, query: str, parameters: Any = None, /) -> Any: ...

    def sql(self, query: str, /, *, params: Any = None) -> Any: ...

    def register(self, name: str, frame: Any, /) -> Any: ...
