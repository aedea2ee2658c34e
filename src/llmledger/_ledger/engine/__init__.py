"""The only place that knows DuckDB from PostgreSQL.

- `dialect.py` names every way the ledger's SQL differs between them (`Dialect`: the claim's row lock, the
  clock, indexes, how a structured answer is kept, ...);
- `shared.py` holds what the ledger's statements call on a connection of either engine;
- `duckdb.py` opens a DuckDB file (one read-write process, held only to claim or commit);
- `postgres.py` opens a PostgreSQL database, and `pgcon.py` gives a psycopg 3 connection DuckDB's shape.

`Con` is that shape: what the ledger's SQL calls on a connection, whichever engine is behind it. `Database` is
what the ledger holds: a store it opens briefly, for one transaction at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from llmledger._ledger.engine.dialect import Dialect

T = TypeVar("T")


class Con(Protocol):
    """A connection as the ledger's statements use it: DuckDB's own, or `pgcon.PgCon`."""

    def execute(self, query: str, parameters: Any = None, /) -> Any: ...

    def sql(self, query: str, /, *, params: Any = None) -> Any: ...

    def register(self, name: str, frame: Any, /) -> Any: ...


class Database(Protocol):
    """A store: `duckdb.Connection` (one file) or `postgres.PgConnection` (one database)."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def path(self) -> Path: ...  # where this machine keeps the store's journal beside it

    on_wait: Callable[[str], None] | None

    def open(self, *, wait: float | None = None, read_only: bool = False) -> AbstractContextManager[Any]: ...

    def transaction(
        self,
        work: Callable[[Any], T],
        *,
        wait: float | None = None,
        commit: bool = True,
        exclusive: bool = False,
        read_only: bool = False,
        idempotent: bool = False,
    ) -> T: ...

    def exists(self) -> bool: ...

    def check(self, *, must_exist: bool = False) -> None: ...

    def remove(self) -> None: ...
