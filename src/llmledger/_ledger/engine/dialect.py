"""Every way the ledger's SQL differs between DuckDB and PostgreSQL, named in one place.

The ledger's statements are written once, in DuckDB's dialect (`postgres.PgCon` translates parameters and a few
spellings). What cannot be translated is a real difference between the engines: a claim locks rows on
PostgreSQL and not on a DuckDB file (one writer per file), a structured answer is a STRUCT column on DuckDB and
JSONB on PostgreSQL, only PostgreSQL needs indexes to find a row by key. Each such difference is an attribute or
a method of `Dialect`, so a reader of `verbs.py` sees `dialect.row_lock`, not `if postgres`, and a third engine
would be one more `Dialect` here.

`dialect_of(con)` gives the dialect of a connection handed to the ledger's SQL; a store's `Connection` or
`PgConnection` carries its own as `.dialect`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import duckdb

from llmledger._ledger.engine import Con
from llmledger._step.request import json_string_sql

JSONB = "JSONB"

# DuckDB types PostgreSQL lacks, as the PostgreSQL type that holds their values.
_TO_POSTGRES = {
    "TINYINT": "SMALLINT",
    "UTINYINT": "SMALLINT",
    "USMALLINT": "INTEGER",
    "UINTEGER": "BIGINT",
    "UBIGINT": "NUMERIC",
    "HUGEINT": "NUMERIC",
    "UHUGEINT": "NUMERIC",
    "FLOAT": "REAL",
    "BLOB": "BYTEA",
}

# PostgreSQL has no try_cast: structured answers are stored as JSONB through this (NULL for text that is not JSON).
_PG_JSONB_FUNCTION = """CREATE OR REPLACE FUNCTION llmledger_jsonb(answer TEXT) RETURNS JSONB
    LANGUAGE plpgsql IMMUTABLE AS $f$
    BEGIN RETURN answer::JSONB; EXCEPTION WHEN others THEN RETURN NULL; END $f$"""

_READS = {"SELECT", "EXPLAIN", "PRAGMA"}  # statement types llmledger.sql runs without write=True (DuckDB)


def nested(sql_type: str) -> bool:
    """A column type holding nested values (a struct, map, union or JSON)."""
    return sql_type.startswith(("STRUCT", "MAP", "UNION", "JSON"))


@dataclass(frozen=True)
class Dialect:
    """One engine's answers to the questions the ledger's SQL asks of it."""

    name: Literal["duckdb", "postgres"]
    clock: str
    """SQL for the time claims are written and judged by: the database's own clock on PostgreSQL, which every
    worker shares whatever its machine's clock says; on DuckDB (one file, one host) the process's `$now`."""
    row_lock: str
    """Appended to a claim's row pick: PostgreSQL's workers skip the rows another has locked; a DuckDB file has
    one writing process, so there is nothing to lock ("")."""
    claims_from_table: bool
    """A claim takes its rows straight from the table (PostgreSQL, under `row_lock`), so a run holds no list of
    keys to work through; on DuckDB a run lists the keys it will claim, chunk by chunk."""
    indexed: bool
    """Keys, statuses and fingerprints need indexes to be found without a scan (PostgreSQL); DuckDB joins and
    scans columnar data fast without them."""
    advisory_locks: bool
    """Transactions that must run one at a time take an advisory lock (PostgreSQL); a DuckDB file has none, and
    one writing process, so the threads of that process take turns under a lock of their own."""
    structured_as_jsonb: bool
    """A structured answer is one JSONB column (PostgreSQL, whose composite types would need a type per
    schema); on DuckDB it is a STRUCT typed by the step's output schema."""
    ordered_scans: bool
    """A plain scan returns rows in the order they were inserted (DuckDB), so a frame recorded in order can be
    matched to the table positionally, without a join."""
    writes_parquet: bool
    """The engine writes Parquet itself (DuckDB's COPY TO); PostgreSQL's rows are written chunk by chunk."""
    loses_commits: bool
    """A transaction whose COMMIT returned may yet be lost (DuckDB 2.0.1, when processes take turns on one file),
    so a run reads its claims back before it sends their rows and writes its chunks again until it sees them
    land (`again.py`); PostgreSQL keeps what it acknowledged."""
    read_only_transactions: bool
    """A read-only look is a read-only transaction (PostgreSQL); on DuckDB the file is opened read-only."""
    missing_text: str
    """SQL for a character no upstream value holds, standing for NULL in a digest (PostgreSQL's text cannot
    hold chr(0))."""
    setup: tuple[str, ...]
    """Statements a new store runs before its first migration."""

    def json_string_sql(self, expr: str) -> str:
        """SQL for the JSON string literal of text `expr`, byte-identical to Python's json.dumps."""
        return json_string_sql(expr) if self.name == "duckdb" else f"CAST(to_json(CAST({expr} AS TEXT)) AS TEXT)"

    def output_type(self, wanted: str) -> str:
        """The column type that keeps a step's answers of type `wanted` (VARCHAR or a STRUCT)."""
        return JSONB if self.structured_as_jsonb and wanted != "VARCHAR" else wanted

    def field_text_sql(self, column_sql: str, field: str) -> str:
        """SQL for one top-level field of a structured answer, as text (a STRUCT field on DuckDB, a JSONB key on
        PostgreSQL)."""
        name = "'" + field.replace("'", "''") + "'"
        if self.structured_as_jsonb:
            return f"({column_sql} ->> {name})"
        return f"CAST(struct_extract({column_sql}, {name}) AS VARCHAR)"

    def portable_type(self, sql_type: str) -> str:
        """An input column's type (DuckDB's spelling) as this engine can hold it: nested values as JSONB on
        PostgreSQL, as JSON text on DuckDB; DuckDB-only types as the PostgreSQL type that holds their values."""
        if nested(sql_type):
            return JSONB if self.structured_as_jsonb else "VARCHAR"
        if self.name == "postgres":
            return "VARCHAR" if sql_type.startswith("ENUM") else _TO_POSTGRES.get(sql_type, sql_type)
        return sql_type

    def canonical_type(self, con: Con, sql_type: str) -> str:
        """The engine's own spelling of a column type, for comparing a wanted type with the catalog's (on
        PostgreSQL the ledger's types are spelled as `column_types` reports them already)."""
        if self.name == "postgres":
            return sql_type
        return str(con.execute(f"SELECT typeof(CAST(NULL AS {sql_type}))").fetchall()[0][0])

    def expression_type(self, con: Con, query: str) -> str:
        """The type of the first column `query` returns (DuckDB's names), found without running it."""
        if self.name == "postgres":
            return str(next(iter(con.types(query).values())))  # type: ignore[attr-defined]
        return str(con.execute(f"DESCRIBE {query}").fetchall()[0][1])

    def statement_count(self, con: Con, sql: str) -> int:
        """How many statements `sql` is. PostgreSQL binds a query with parameters as one statement and refuses a
        second, so there it is 1; text DuckDB cannot even parse is 1 too (running it says why)."""
        if self.name == "postgres":
            return 1
        try:
            return len(con.extract_statements(sql))  # type: ignore[attr-defined]
        except duckdb.Error:
            return 1

    def user_query(self, con: Con, sql: str, params: Any, *, write: bool) -> Any:
        """Run a statement a person wrote; unless `write`, refuse anything but one statement that reads (a
        relation, or None for a statement that returns no rows)."""
        if self.name == "postgres":
            if not write:
                con.execute("SET TRANSACTION READ ONLY")
            return con.sql(sql, params=params, single=not write)  # type: ignore[call-arg]
        if not write and not all(_reads(s) for s in con.extract_statements(sql)):  # type: ignore[attr-defined]
            raise duckdb.InvalidInputException("read-only transaction")  # a write, a COPY TO, an EXPORT
        return con.sql(sql, params=params)


def _reads(statement: Any) -> bool:
    """A DuckDB statement that only reads: EXPLAIN ANALYZE runs the statement it explains, so it is not one."""
    kind = str(statement.type).rsplit(".", 1)[-1]
    return kind in _READS and not (
        kind == "EXPLAIN" and re.match(r"\s*explain\s+analy[sz]e\b", statement.query, re.IGNORECASE)
    )


DUCKDB = Dialect(
    name="duckdb",
    clock="$now",
    row_lock="",
    claims_from_table=False,
    indexed=False,
    advisory_locks=False,
    structured_as_jsonb=False,
    ordered_scans=True,
    writes_parquet=True,
    loses_commits=True,
    read_only_transactions=False,
    missing_text="chr(0)",
    setup=(),
)

POSTGRES = Dialect(
    name="postgres",
    clock="(now() AT TIME ZONE 'UTC')",
    row_lock=" FOR UPDATE OF t SKIP LOCKED",
    claims_from_table=True,
    indexed=True,
    advisory_locks=True,
    structured_as_jsonb=True,
    ordered_scans=False,
    writes_parquet=False,
    loses_commits=False,
    read_only_transactions=True,
    missing_text="chr(1)",
    setup=(_PG_JSONB_FUNCTION,),
)

DIALECTS = {d.name: d for d in (DUCKDB, POSTGRES)}


def dialect_of(con: Any) -> Dialect:
    """The dialect of a connection handed to the ledger's SQL (DuckDB's own connections carry none)."""
    found = getattr(con, "dialect", DUCKDB)
    return found if isinstance(found, Dialect) else DUCKDB
