"""Opening a PostgreSQL ledger: the same verbs as on DuckDB, through a connection that speaks DuckDB's dialect.

The ledger's SQL (`verbs.py`, `survey.py`, `prepare.py`, ...) is written once.
`PgCon` gives a psycopg connection the few things that SQL expects of a
DuckDB connection: `$name` and `?` parameters, `con.sql(q).pl()`, and polars
frames registered under a name (here: a temporary table filled by COPY).
Where the two engines truly differ (JSON, regular expressions, the claim's
`FOR UPDATE SKIP LOCKED`), the SQL asks `dialect(con)`.

Many processes share one PostgreSQL ledger. Claims and commits touch rows
only, so they run side by side; preparing a step, migrating and the verbs
people call (flag, reset) take one advisory lock, so they happen one at a
time, as on a DuckDB file. A connection lost mid-transaction (a network cut,
a server restart) is opened again and the transaction redone, waiting as a
busy DuckDB file waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import polars as pl

from llmledger._ledger.engine.duckdb import Patience
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError, StoreBusy, StoreError, StoreNotFound

T = TypeVar("T")
URL_SCHEMES = ("postgresql://", "postgres://")
_LOCK_ID = 0x6C6C6D6C  # "llml": the advisory lock of prepare, migrations, flag and reset

# PostgreSQL type oid -> (DuckDB's name for the type, polars type): what column_types and .pl() report.
_TYPES: dict[int, tuple[str, Any]] = {
    16: ("BOOLEAN", pl.Boolean),
    20: ("BIGINT", pl.Int64),
    21: ("SMALLINT", pl.Int16),
    23: ("INTEGER", pl.Int32),
    25: ("VARCHAR", pl.String),
    1043: ("VARCHAR", pl.String),
    1042: ("VARCHAR", pl.String),
    19: ("VARCHAR", pl.String),
    700: ("REAL", pl.Float32),
    701: ("DOUBLE", pl.Float64),
    1700: ("DOUBLE", pl.Float64),
    1114: ("TIMESTAMP", pl.Datetime("us")),
    1184: ("TIMESTAMPTZ", pl.Datetime("us", "UTC")),
    1082: ("DATE", pl.Date),
    1083: ("TIME", pl.Time),
    1186: ("INTERVAL", pl.Duration("us")),
    2950: ("UUID", pl.String),
    114: ("JSON", pl.String),
    3802: ("JSONB", pl.String),
    17: ("BYTEA", pl.Binary),
    1009: ("VARCHAR[]", pl.List(pl.String)),
    1015: ("VARCHAR[]", pl.List(pl.String)),
    1016: ("BIGINT[]", pl.List(pl.Int64)),
    1007: ("INTEGER[]", pl.List(pl.Int32)),
    1005: ("SMALLINT[]", pl.List(pl.Int16)),
    1000: ("BOOLEAN[]", pl.List(pl.Boolean)),
    1021: ("REAL[]", pl.List(pl.Float32)),
    1022: ("DOUBLE[]", pl.List(pl.Float64)),
    1231: ("DOUBLE[]", pl.List(pl.Float64)),
    1115: ("TIMESTAMP[]", pl.List(pl.Datetime("us"))),
    1182: ("DATE[]", pl.List(pl.Date)),
}
# REAL, not DuckDB's other name FLOAT for it: a table created from these names would get PostgreSQL's FLOAT, which
# is double precision, and a Float32 column would then no longer match its own table.
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$([A-Za-z_]\w*)|\?|%|\bDOUBLE\b(?! PRECISION)")


def is_url(store: object) -> bool:
    return isinstance(store, str) and store.startswith(URL_SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for messages and journal folders."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def journal_base(url: str) -> Path:
    """Where runs on this machine journal answers for this database before they commit (see journal.py)."""
    digest = hashlib.md5(redacted(url).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "llmledger" / f"postgresql-{digest}" / "ledger"


# "not yet accepting connections": crash recovery (PostgreSQL 14+), as after a crash or `pg_ctl stop -m immediate`
_TRANSIENT = (
    "starting up",
    "shutting down",
    "in recovery",
    "not yet accepting connections",
    "not accepting connections",
    "connection slots",
    "too many connections",
)


def _refused_for_good(message: str) -> str | None:
    """The server's reason when it answered but refused the connection for good (no such database or role,
    a wrong password); None when it may yet accept one (down, restarting, full)."""
    fatal = message.split("FATAL:", 1)
    if len(fatal) < 2 or any(word in fatal[1] for word in _TRANSIENT):
        return None
    return fatal[1].strip().splitlines()[0]


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError("a PostgreSQL store needs psycopg 3: pip install 'llmledger[postgresql]'") from None
    return psycopg


def translate(sql: str, params: Any) -> tuple[str, Any]:
    """DuckDB's parameters (`$name`, `?`) as psycopg's (`%(name)s`, `%s`), and DuckDB type names as PostgreSQL's.

    `$name` is a parameter only with a dict of them, `?` only with a list (so PostgreSQL's own `?` operators
    work in a query with named ones). String literals and quoted names keep their text; with parameters,
    psycopg reads every `%`, so each is doubled (`LIKE 'a%'` stays what it says).
    """
    named, positional = isinstance(params, dict), isinstance(params, list | tuple)

    def swap(m: re.Match[str]) -> str:
        token = m.group(0)
        if token[0] in "'\"" or token == "%":
            return token.replace("%", "%%") if params is not None else token
        if m.group(1):
            return f"%({m.group(1)})s" if named else token
        if token == "?":
            return "%s" if positional else token
        return "DOUBLE PRECISION"  # the one type the ledger's DDL names that PostgreSQL spells otherwise

    return _TOKENS.sub(swap, sql), params


def _pg_type(dtype: pl.DataType) -> str:
    """The column type a polars column is registered with."""
    if dtype.is_integer():
        integers: dict[Any, str] = {
            pl.Int8: "SMALLINT",
            pl.Int16: "SMALLINT",
            pl.UInt8: "SMALLINT",
            pl.Int32: "INTEGER",
            pl.UInt16: "INTEGER",
        }
        return integers.get(dtype.base_type(), "BIGINT")
    if dtype == pl.Float32:
        return "REAL"
    if dtype.is_float():
        return "DOUBLE PRECISION"
    if dtype == pl.Boolean:
        return "BOOLEAN"
    if isinstance(dtype, pl.Datetime):
        return "TIMESTAMPTZ" if dtype.time_zone else "TIMESTAMP"
    simple = {pl.Date: "DATE", pl.Time: "TIME", pl.Binary: "BYTEA"}
    if dtype.base_type() in simple:
        return simple[dtype.base_type()]
    if isinstance(dtype, pl.List) and dtype.inner is not None and not dtype.inner.is_nested():
        return _pg_type(cast(pl.DataType, dtype.inner)) + "[]"
    if dtype.is_nested():
        return "JSONB"
    return "VARCHAR"  # strings, categoricals, enums, nulls (VARCHAR as the ledger's DDL says, so arrays compare)


_CSV_ROWS = 100_000
_BIGINT_MAX = 2**63 - 1


def _check_fits(frame: pl.DataFrame) -> None:
    """A UInt64 value above BIGINT's range, PostgreSQL's largest integer, or a NUL character, which its text cannot
    hold, refused with what to do (not psycopg's error from the middle of a COPY)."""
    for column, dtype in frame.schema.items():
        if dtype == pl.UInt64 and frame.height:
            largest = frame[column].max()
            if isinstance(largest, int) and largest > _BIGINT_MAX:
                raise InvalidInputError(
                    f"column {column!r} holds {largest}, above {_BIGINT_MAX:,}, the largest "
                    "integer PostgreSQL stores (BIGINT); cast it, e.g. "
                    f"pl.col({column!r}).cast(pl.String), or use a DuckDB store"
                )
        elif dtype == pl.String and frame.height:
            nul = frame[column].str.contains("\x00", literal=True)
            if nul.any():
                raise InvalidInputError(
                    f"column {column!r} holds a NUL character (\\x00) in {int(nul.sum()):,} row(s), e.g. "
                    f"{frame[column].filter(nul)[0][:60]!r}; PostgreSQL text cannot hold one. Remove it, "
                    f"e.g. pl.col({column!r}).str.replace_all('\\x00', ''), or use a DuckDB store"
                )


def _json_text(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _as_csv(dtype: pl.DataType) -> bool:
    """Whether polars writes this type as CSV text PostgreSQL reads back as the same value."""
    return (
        (dtype.is_numeric() and not dtype.is_decimal())
        or dtype in (pl.Boolean, pl.Date, pl.Null)
        or isinstance(dtype, pl.String | pl.Categorical | pl.Enum | pl.Datetime)
    )


class PgRelation:
    """The result of `PgCon.sql`: rows, turned into polars on demand."""

    def __init__(self, description: Any, rows: list[tuple[Any, ...]]) -> None:
        self.description, self.rows = description, rows

    def pl(self) -> pl.DataFrame:
        schema: dict[str, Any] = {}
        for d in self.description:  # PostgreSQL names unnamed columns alike ("sum", "sum"); polars needs them apart
            name, n = d.name, 1
            while name in schema:
                name, n = f"{d.name}_{n}", n + 1
            schema[name] = _TYPES.get(d.type_code, ("", pl.Object))[1]
        return pl.DataFrame(self.rows, schema=schema, orient="row")


class PgCon:
    """A psycopg connection with the parts of DuckDB's connection API the ledger's SQL uses."""

    dialect = "postgres"

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Any = None, *, single: bool = False) -> Any:
        """`single`: one statement only (a prepared statement, which PostgreSQL refuses to chain): for SQL a
        person wrote, so `COMMIT; DELETE ...` cannot step out of a read-only transaction."""
        cursor = self.raw.cursor()
        cursor.execute(*translate(sql, params), prepare=True if single else None)
        return cursor

    def sql(self, sql: str, params: Any = None, *, single: bool = False) -> PgRelation | None:
        cursor = self.execute(sql, params, single=single)
        if cursor.description is None:
            return None
        return PgRelation(cursor.description, cursor.fetchall())

    def chunks(self, sql: str, rows: int) -> Iterator[pl.DataFrame]:
        """A query's result as polars frames of at most `rows`, read through a server-side cursor."""
        with self.raw.cursor(name="llmledger_chunks", withhold=True) as cursor:
            cursor.execute(translate(sql, None)[0])
            while batch := cursor.fetchmany(rows):
                yield PgRelation(cursor.description, batch).pl()

    def types(self, relation_sql: str) -> dict[str, str]:
        """Column name -> DuckDB's name for its type, for the result of a query (nothing is read)."""
        cursor = self.execute(f"SELECT * FROM ({relation_sql}) AS r LIMIT 0")
        return {d.name: _TYPES.get(d.type_code, ("VARCHAR", None))[0] for d in cursor.description}

    def register(self, name: str, frame: pl.DataFrame) -> None:
        """`frame` as a temporary table `name` (until `unregister`), filled by COPY and analysed for the planner."""
        psycopg = _psycopg()
        _check_fits(frame)
        types = {c: _pg_type(t) for c, t in frame.schema.items()}
        cols = ", ".join(f"{q(c)} {t}" for c, t in types.items())
        self.raw.execute(f'DROP TABLE IF EXISTS pg_temp."{name}"')  # never a table of the user's
        self.raw.execute(f'CREATE TEMP TABLE "{name}" ({cols})')
        if frame.height:
            names = ", ".join(q(c) for c in frame.columns)
            if all(_as_csv(t) for t in frame.schema.values()):  # polars writes the CSV, PostgreSQL parses it
                # (both say NULL as an unquoted empty field and '' as a quoted one)
                query = f'COPY "{name}" ({names}) FROM STDIN (FORMAT csv)'
                with self.raw.cursor().copy(psycopg.sql.SQL(query)) as copy:
                    for part in frame.iter_slices(_CSV_ROWS):
                        copy.write(part.write_csv(include_header=False))
            else:
                nested = [c for c, t in types.items() if t == "JSONB"]
                rows = (
                    frame.with_columns(
                        pl.col(c).map_elements(_json_text, return_dtype=pl.String) for c in nested
                    ).iter_rows()
                    if nested
                    else frame.iter_rows()
                )
                with self.raw.cursor().copy(psycopg.sql.SQL(f'COPY "{name}" ({names}) FROM STDIN')) as copy:
                    for row in rows:
                        copy.write_row(row)
            self.raw.execute(f'ANALYZE "{name}"')

    def unregister(self, name: str) -> None:
        self.raw.execute(f'DROP TABLE IF EXISTS pg_temp."{name}"')


class PgConnection:
    """One PostgreSQL database (a URL), through one connection kept open and opened again when lost."""

    def __init__(
        self, url: str, *, on_wait: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None
    ) -> None:
        self.url = url
        self.name = redacted(url)
        self.path = journal_base(url)
        self.on_wait = on_wait
        self.should_stop = should_stop
        self._lock = threading.RLock()
        self._raw: Any = None

    def _connection(self, wait: float | None) -> Any:
        """The open connection, or a new one, waiting while the server cannot be reached."""
        psycopg = _psycopg()
        if self._raw is not None and not self._raw.closed:
            return self._raw
        patience = Patience(wait, self.should_stop, self.on_wait, longest=1.0)
        raw: Any = None
        while raw is None:
            try:
                raw = psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=10,
                    keepalives=1,
                    keepalives_idle=30,
                    keepalives_interval=10,
                    keepalives_count=3,
                )
            except psycopg.OperationalError as exc:
                refused = _refused_for_good(str(exc))
                if refused:
                    raise (StoreNotFound if "does not exist" in refused else StoreError)(
                        f"cannot open the PostgreSQL store {self.name}: {refused}"
                        + (" (create it first: createdb NAME)" if "database" in refused else "")
                    ) from None
                reason = str(exc).strip().splitlines()[-1]
                if not patience.again(f"waiting for PostgreSQL at {self.name}: {reason}"):
                    raise StoreBusy(
                        f"cannot reach the PostgreSQL store {self.name} (waited {patience.waited:.0f}s): {reason}"
                    ) from exc
        text = psycopg.types.string.TextLoader
        for name in ("uuid", "json", "jsonb"):  # as text, like the DuckDB side returns them
            raw.adapters.register_loader(name, text)
        raw.adapters.register_loader("numeric", psycopg.types.numeric.FloatLoader)
        self._raw = raw
        return raw

    def _drop(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        self._raw = None

    def exists(self) -> bool:
        """Whether the database holds a ledger (llmledger's bookkeeping tables)."""
        with self.open(wait=30.0) as con:
            return bool(
                con.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                    "current_schema() AND table_name = 'llmledger_steps'"
                ).fetchall()[0][0]
            )

    def remove(self) -> None:
        """Nothing to delete: the refused call's transaction was rolled back, so the database is as it was."""

    def check(self, *, must_exist: bool = False) -> None:
        if must_exist and not self.exists():
            raise StoreNotFound(f"no ledger in the PostgreSQL store {self.name}; apply_llm(..., store=...) creates one")

    @contextlib.contextmanager
    def open(self, *, wait: float | None = None, read_only: bool = False) -> Iterator[PgCon]:
        """The connection for statements outside a transaction (each one commits on its own)."""
        psycopg = _psycopg()
        with self._lock:
            raw = self._connection(wait)
            try:
                yield PgCon(raw)
            except psycopg.OperationalError as exc:
                self._drop()
                raise StoreError(f"lost the PostgreSQL store {self.name}: {str(exc).strip()}") from exc

    def transaction(
        self,
        work: Callable[[PgCon], T],
        *,
        wait: float | None = None,
        commit: bool = True,
        exclusive: bool = False,
        read_only: bool = False,
    ) -> T:
        """Run `work` in one transaction, redoing it after a serialization failure, a deadlock or a lost
        connection (`commit=False`: roll it back; `exclusive`: one such transaction at a time in the database;
        `read_only` is for a DuckDB file: the server decides what this role may do)."""
        psycopg = _psycopg()
        retry = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
        start = time.monotonic()
        for attempt in range(1000):
            with self._lock:
                raw = self._connection(None if wait is None else max(0.0, wait - (time.monotonic() - start)))
                ending = False
                try:
                    raw.execute("BEGIN")
                    if exclusive:
                        raw.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
                    result = work(PgCon(raw))
                    ending = True
                    raw.execute("COMMIT" if commit else "ROLLBACK")
                    return result
                except retry:
                    raw.execute("ROLLBACK")
                    if attempt >= 20:
                        raise
                    time.sleep(0.01 * (attempt + 1))
                except psycopg.OperationalError:
                    if not raw.broken:
                        with contextlib.suppress(psycopg.Error):
                            raw.execute("ROLLBACK")
                        raise
                    self._drop()  # the server went away: connect again and redo the transaction
                    if ending and commit:  # it may have committed: redoing it could write twice
                        raise StoreError(
                            f"lost the PostgreSQL store {self.name} while committing; whether the "
                            "transaction landed is unknown. Answers are kept in this machine's "
                            "journal, and the next run merges what did not land."
                        ) from None
                    if wait is not None and time.monotonic() - start > wait:
                        raise StoreBusy(
                            f"cannot reach the PostgreSQL store {self.name} (waited {time.monotonic() - start:.0f}s)"
                        ) from None
                    time.sleep(0.2)
                except BaseException:
                    with contextlib.suppress(psycopg.Error):
                        raw.execute("ROLLBACK")
                    raise
        raise StoreError(f"PostgreSQL store {self.name}: gave up after repeated conflicts")
