"""What the ledger's statements call on a connection, whichever engine is behind it: one row, a table's columns,
a frame registered under a name, a query's rows in chunks, the errors either engine raises, waiting for a store.

Each helper takes the connection the ledger's SQL runs on (`Con`) and asks its `dialect_of` where the engines
part; the engines' own modules (`duckdb.py`, `postgres.py`) open stores and run transactions.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import duckdb
import polars as pl

from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of


class Patience:
    """Trying again to open a store that another process holds (DuckDB) or that cannot be reached (PostgreSQL):
    backing off, saying so once after a second, giving up after `wait` seconds (None: when `should_stop` says)."""

    def __init__(
        self,
        wait: float | None,
        should_stop: Callable[[], bool] | None,
        on_wait: Callable[[str], None] | None,
        *,
        longest: float,
    ) -> None:
        self.wait, self.should_stop, self.on_wait, self.longest = wait, should_stop, on_wait, longest
        self.start, self.delay, self.told = time.monotonic(), 0.02, False

    @property
    def waited(self) -> float:
        return time.monotonic() - self.start

    def again(self, note: str) -> bool:
        """Pause before the next try and return True; False when it is time to give up."""
        waited = self.waited
        if waited >= self.wait if self.wait is not None else bool(self.should_stop and self.should_stop()):
            return False
        if not self.told and waited > 1 and self.on_wait:
            self.on_wait(note)
            self.told = True
        time.sleep(self.delay)
        self.delay = min(self.delay * 1.5, self.longest)
        return True


def writes_refused(exc: Exception) -> bool:
    """A statement that writes, run on a connection opened read-only."""
    text = str(exc).lower()
    return "read-only mode" in text or "read-only transaction" in text  # DuckDB, PostgreSQL


def db_errors() -> tuple[type[Exception], ...]:
    """The errors a statement of either engine raises. PostgreSQL's only once psycopg is imported (a PostgreSQL
    store was opened): before that none can have been raised, and importing it costs a DuckDB run 80 ms."""
    psycopg = sys.modules.get("psycopg")
    return (duckdb.Error,) if psycopg is None else (duckdb.Error, psycopg.Error)


def lock_step(con: Con, lock_class: int, table: str, step: str) -> None:
    """PostgreSQL: take the transaction-scoped advisory lock `lock_class` on one step (the second key is the
    step's crc32), so the transactions that take it run one at a time. On DuckDB, which has one writing
    process per file, nothing."""
    if dialect_of(con).advisory_locks:
        con.execute(
            "SELECT pg_advisory_xact_lock(CAST(? AS INTEGER), CAST(? AS INTEGER))",
            [lock_class, zlib.crc32(f"{table}\x00{step}".encode()) - 2**31],
        )


def one(con: Con, sql: str, params: Any = None) -> tuple[Any, ...]:
    """The single row of a query, fetched to the end: a half-read result blocks the connection."""
    return tuple(con.execute(sql, params).fetchall()[0])


def table_exists(con: Con, table: str) -> bool:
    return bool(
        one(
            con,
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ? AND table_schema = current_schema()",
            [table],
        )[0]
    )


def column_types(con: Con, relation: str) -> dict[str, str]:
    """Column name -> type (DuckDB's names on either engine: VARCHAR, BIGINT, ...)."""
    from llmledger._step.sqltext import q

    if dialect_of(con).name == "postgres":
        types: dict[str, str] = con.types(f"SELECT * FROM {q(relation)}")  # type: ignore[attr-defined]
        return types
    rows = con.execute(f"DESCRIBE SELECT * FROM {q(relation)}").fetchall()
    return {r[0]: r[1] for r in rows}


# Set by a DuckDB transaction retried because a read under a lowered limit ran out of room (`transaction`).
unlimited: contextvars.ContextVar[bool] = contextvars.ContextVar("llmledger_unlimited", default=False)


@contextlib.contextmanager
def memory_limited(con: Con, limit: int) -> Iterator[None]:
    """Run a full-table read under `limit` bytes (the pages it evicts are clean: reading them back is cheap).
    A `limit` of 0 is none: for a transaction that has written rows, whose changes cannot be evicted (a limit
    below them fails, which aborts the transaction, or leaves the read no room). PostgreSQL manages its own
    memory. What a read needs beside the pages varies by DuckDB version and by what the table's last writes
    left in memory, so a read that runs out of room is run again, whole, with no lowered limit (`unlimited`).

    The connection's own limit (LLMLEDGER_DUCKDB_MEMORY, else DuckDB's) is the ceiling: found in a trial, a scan
    raised a user's lower limit to `limit`. When that limit is `limit` or less, or cannot be read, it is kept."""
    if dialect_of(con).name == "postgres" or not limit or unlimited.get():
        yield
        return
    before = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    ceiling = size_in_bytes(str(before))
    if ceiling is None or limit >= ceiling:
        yield
        return
    con.execute(f"SET memory_limit = '{limit // 1_000_000}MB'")
    try:
        yield
    finally:  # after a failed statement the transaction is aborted: the connection, closed with it, drops the limit
        with contextlib.suppress(duckdb.Error):
            con.execute(f"SET memory_limit = '{before}'")


# DuckDB's units in the sizes it shows ("953.6 MiB") and takes ("4GB").
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1}
_UNITS |= {f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgtpe")}
_UNITS |= {f"{p}ib": 1024 ** (i + 1) for i, p in enumerate("kmgtpe")}


def size_in_bytes(text: str) -> float | None:
    """A memory size as DuckDB writes it ("953.6 MiB", "4GB"), in bytes; None for anything else."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    factor = None if found is None else _UNITS.get(found.group(2).lower())
    return None if found is None or factor is None else float(found.group(1)) * factor


def arrow_batches(relation: duckdb.DuckDBPyRelation, rows: int) -> Iterator[Any]:
    """A query's result as Arrow record batches, without materialising it whole (DuckDB 1.x and 2.x)."""
    if not isinstance(relation, duckdb.DuckDBPyRelation):  # PostgreSQL's rows are in memory already
        yield from relation.pl().to_arrow().to_batches(rows)
        return
    # DuckDB 2 deprecates fetch_arrow_reader for to_arrow_reader, which 1.x lacks
    read = getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
    try:
        yield from read(rows)
    except OSError as exc:  # Arrow's reader hands DuckDB's out-of-memory on as an OSError: give it back its kind,
        if "Out of Memory" in str(exc):  # which the transaction retries without the lowered limit (`unlimited`)
            raise duckdb.OutOfMemoryException(str(exc)) from exc
        raise


def result_frames(con: Any, query: str, params: dict[str, Any], rows: int) -> list[pl.DataFrame]:
    """A query's whole result as polars frames (none for no rows): DuckDB's Arrow batches of at most `rows`, or
    PostgreSQL's rows in one frame, sent as CSV and parsed by polars (`PgCon.frame`)."""
    if dialect_of(con).name == "postgres":
        found = con.frame(query, params)
        return [found] if found.height else []
    return [cast(pl.DataFrame, pl.from_arrow(b)) for b in arrow_batches(con.sql(query, params=params), rows)]


def frames(con: Any, query: str, rows: int) -> Iterator[pl.DataFrame]:
    """A query's rows as polars frames of at most `rows`, without holding the whole result (on PostgreSQL,
    through a server-side cursor)."""
    if dialect_of(con).name == "postgres":
        yield from con.chunks(query, rows)
        return
    for batch in arrow_batches(con.sql(query), rows):
        frame = pl.from_arrow(batch)
        assert isinstance(frame, pl.DataFrame)
        yield frame


@contextlib.contextmanager
def registered(con: Con, name: str, frame: pl.DataFrame) -> Iterator[None]:
    """`frame` queryable as `name` inside the block, without copying it.

    Handing DuckDB the polars frame itself makes polars convert every text column to Arrow's
    large strings first (a full copy); Arrow string views, which polars stores natively, DuckDB
    scans in place.
    """
    if dialect_of(con).name == "postgres":
        con.register(name, frame)
    else:
        con.register(name, frame.to_arrow(compat_level=pl.CompatLevel.newest()) if _STRING_VIEWS else frame)
    try:
        yield
    finally:  # never hide the error that ended the block behind "transaction aborted"
        with contextlib.suppress(*db_errors()):
            cast(duckdb.DuckDBPyConnection, con).unregister(name)


# Before 1.5, DuckDB pushed filters on a registered Arrow table into pyarrow, which has no kernels for views.
_STRING_VIEWS = tuple(int(p) for p in duckdb.__version__.split(".")[:2]) >= (1, 5)
