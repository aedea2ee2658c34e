"""Preparing a step over a frame: the frame's rows and each row's current request, written into the ledger.

Work is proportional to what changed: new keys are inserted with their
rendered request, rows whose copied inputs changed are refreshed (and every
step's request for them marked for re-rendering), and only rows whose request
is not the current definition's are rendered again. A rerun of the same cell
writes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, cast

import polars as pl

from llmledger._ledger.columns import index_name, names, output_as_text, output_from_text
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.shared import column_types, one, registered, table_exists
from llmledger._ledger.history import archive
from llmledger._ledger.schema import LEGACY_FINGERPRINT_PREFIX, ensure_step_columns, list_steps
from llmledger._ledger.survey import Layout
from llmledger._step.request import sql_literal
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError, KeyColumnError

if TYPE_CHECKING:
    from llmledger._ledger.graph import StepGraph
    from llmledger._ledger.types import StepDefinition
    from llmledger._step.prompt import PromptPlan
    from llmledger._step.request import RequestSpec

INCOMING = "llmledger_incoming"
# Names of intermediate columns, beside the frame's own in the same SELECT: a frame column may be named anything
# but llmledger_... (refused up front), so a column `p` can never stand in for a row's prompt.
P, FP, UP, LEGACY = "llmledger_p", "llmledger_fp", "llmledger_up", "llmledger_legacy"
RENDERED = "llmledger_prompt"  # a chunk of prompts rendered in Python (PromptPlan.render_chunks)
_NUMERIC = {
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "UHUGEINT",
}
_SINGLE = {"FLOAT", "REAL"}  # DuckDB's two names for a 4-byte float (PostgreSQL's REAL)
# The values an integer column can hold (HUGEINT and UHUGEINT hold every integer a frame can).
_INTEGER_RANGES = {
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "UTINYINT": (0, 2**8 - 1),
    "USMALLINT": (0, 2**16 - 1),
    "UINTEGER": (0, 2**32 - 1),
    "UBIGINT": (0, 2**64 - 1),
}


def _fits(stored: str, incoming: str) -> bool:
    """Whether a frame column of type `incoming` can be stored in (and compared with) a column of type `stored`:
    the same type, any two integers, or a 4-byte float in a double (as 0.6.0 created Float32 columns added to a
    PostgreSQL table)."""
    return (
        stored == incoming
        or (stored in _NUMERIC and incoming in _NUMERIC)
        or (incoming in _SINGLE and stored in (*_SINGLE, "DOUBLE"))
    )


def establish_table(con: Con, layout: Layout, frame: pl.DataFrame) -> None:
    """Create or extend the fact table so it holds the frame's key and copied columns."""
    with registered(con, INCOMING, frame.head(0)):
        incoming = column_types(con, INCOMING)
    if not table_exists(con, layout.table):
        create_fact_table(con, layout.table, {c: incoming[c] for c in [*layout.key, *layout.mirror]}, layout.key)
    _check_recorded_key(con, layout)
    existing = column_types(con, layout.table)
    for k in layout.key:
        if k not in existing:
            raise KeyColumnError(
                f"table {layout.table!r} has no column {k!r}, so it cannot be keyed by it; "
                f"its columns are {list(existing)}. Pass the key it was built with, or a "
                "new table=."
            )
        if not _fits(existing[k], incoming[k]):
            raise KeyColumnError(
                f"key column {k!r} is {existing[k]} in table {layout.table!r} but "
                f"{incoming[k]} in the frame; cast it (e.g. pl.col({k!r}).cast(...))."
            )
        bounds = _INTEGER_RANGES.get(existing[k])
        if bounds is not None and incoming[k] in _NUMERIC and frame.height:
            low, high = bounds
            # Python ints (keys hold no nulls): compared without overflowing the column's own type
            smallest, largest = cast(int, frame[k].min()), cast(int, frame[k].max())
            if smallest < low or largest > high:
                raise KeyColumnError(
                    f"key column {k!r} is {existing[k]} in table {layout.table!r}, which cannot hold the frame's "
                    f"key {largest if largest > high else smallest} (it holds {low:,} to {high:,}); key this "
                    "frame's rows in a new table=."
                )
    for c in layout.mirror:
        if c not in existing:
            con.execute(f"ALTER TABLE {q(layout.table)} ADD COLUMN {q(c)} {incoming[c]}")
        elif not _fits(existing[c], incoming[c]):
            raise InvalidInputError(
                f"column {c!r} is {existing[c]} in table {layout.table!r} but {incoming[c]} in "
                f"the frame; cast it (e.g. pl.col({c!r}).cast(...)) or rename it."
            )


def _check_recorded_key(con: Con, layout: Layout) -> None:
    """Refuse keying a table's rows by other columns than its steps were run with. Rows are matched to the frame
    by key: under another key (unique in the frame, not in the table) one frame row would meet several stored
    rows, and a paid answer would be shown beside, or overwritten by, another row's inputs."""
    recorded = {tuple(key) for _, _, key in list_steps(con, layout.table)}
    for key in recorded:
        if set(key) != set(layout.key):
            raise KeyColumnError(
                f"table {layout.table!r} is keyed by {list(key)}, but this call passes key={list(layout.key)}: "
                f"rows are found by their key, so a table keeps the one it was built with. Pass key={list(key)}, "
                "or give rows keyed otherwise their own table=."
            )


def create_fact_table(con: Con, table: str, columns: dict[str, str], key: list[str]) -> None:
    """A new fact table with `columns` ({name: type}); on PostgreSQL with a unique index on the key, by which
    claims and commits find rows (DuckDB joins without one)."""
    con.execute(f"CREATE TABLE {q(table)} ({', '.join(f'{q(c)} {t}' for c, t in columns.items())})")
    if dialect_of(con).indexed:
        con.execute(f"CREATE UNIQUE INDEX {q(index_name(table, 'key'))} ON {q(table)} ({', '.join(q(k) for k in key)})")


def set_output_type(con: Con, layout: Layout, output_type: str, now: datetime) -> None:
    """Give the step its columns, its output column the type the step's output schema needs.

    When the type changes (text becomes structured, a schema gains a field), every stored answer is
    first copied to the history table as text, then converted where it fits the new type (NULL where
    it does not). Those rows are stale anyway: their requests asked for the old schema.
    """
    output_type = dialect_of(con).output_type(output_type)
    ensure_step_columns(con, layout.table, layout.step, output_type)
    current = column_types(con, layout.table)[layout.step]
    wanted = dialect_of(con).canonical_type(con, output_type)
    if current == wanted:
        return
    archive(con, layout, now=now, reason="'output type changed'", condition="true", output_type=current)
    col = q(layout.step)
    using = (
        output_as_text(col, current) if wanted == "VARCHAR" else output_from_text(output_as_text(col, current), wanted)
    )
    c = names(layout.step)
    lost = con.sql(
        f"SELECT {', '.join(q(k) for k in layout.key)} FROM {q(layout.table)} "
        f"WHERE {col} IS NOT NULL AND ({using}) IS NULL"
    ).pl()
    con.execute(f"ALTER TABLE {q(layout.table)} ALTER COLUMN {col} SET DATA TYPE {wanted} USING {using}")
    if lost.height:  # answers that do not fit the new type: kept in the history, and the rows report stale
        with registered(con, INCOMING, lost):
            con.execute(
                f"UPDATE {q(layout.table)} AS t SET {c['_fingerprint']} = NULL FROM {INCOMING} AS i "
                f"WHERE {layout.key_join('t', 'i')}"
            )


def insert_rows(con: Con, layout: Layout, definition: StepDefinition, rows: pl.DataFrame, *, in_sql: bool) -> None:
    """Insert new keys as NOT_STARTED; with a SQL template, their requests are rendered in the same statement."""
    cols = [*layout.key, *layout.mirror]
    col_list = ", ".join(q(c) for c in cols)
    with registered(con, INCOMING, rows.select(cols)), _indexes_built_after(con, layout.table, rows.height):
        if in_sql:
            c = names(layout.step)
            prompt = definition.prompt.sql()
            fingerprint = definition.request.fingerprint_sql(P, dialect_of(con).json_string_sql)
            con.execute(
                f"INSERT INTO {q(layout.table)} ({col_list}, {c['_prompt']}, {c['_request_fingerprint']}, "
                f"{c['_version']}) SELECT {col_list}, {P}, {fingerprint}, "
                f"$version "
                f"FROM (SELECT {col_list}, {prompt} AS {P} FROM {INCOMING}) AS r",
                {"version": definition.version},
            )
        else:
            con.execute(f"INSERT INTO {q(layout.table)} ({col_list}) SELECT {col_list} FROM {INCOMING}")


# A PostgreSQL table this empty takes its first rows faster without indexes, which are built after them: 1,000,000
# rows went in in 5.7 s and their three indexes took 1.9 s, against 14.0 s inserting them into the indexed table.
BULK_ROWS = 10_000


@contextlib.contextmanager
def _indexes_built_after(con: Con, table: str, rows: int) -> Iterator[None]:
    """Within the transaction, drop the indexes of an empty PostgreSQL table about to take at least `BULK_ROWS`
    rows, and build them again once they are in, each from its own definition (a person's own index too). An
    index its definition does not rebuild whole is left in place: one a constraint owns, the table's replica
    identity, the one it is clustered on, one with a comment or in a tablespace of its own (an attack found the
    first two lost, or a publication's updates refused). The table is empty, so nothing another run reads is
    missing meanwhile; the DROP holds the table until the transaction ends. A failed build (a person's unique
    index) fails the transaction, which then leaves the table as it was."""
    if rows < BULK_ROWS or not dialect_of(con).indexed or one(con, f"SELECT EXISTS (SELECT 1 FROM {q(table)})")[0]:
        yield
        return
    found = con.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index AS i "
        "JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = $table::regclass "
        "AND NOT i.indisreplident AND NOT i.indisclustered AND c.reltablespace = 0 "
        "AND obj_description(i.indexrelid, 'pg_class') IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid)",
        {"table": q(table)},
    ).fetchall()
    for name, _ in found:
        con.execute(f"DROP INDEX {name}")
    yield
    for _, definition in found:
        con.execute(definition)


def refresh_rows(con: Con, layout: Layout, rows: pl.DataFrame) -> None:
    """Copy changed inputs into the ledger; every step's request for those rows must be rendered again."""
    steps = {s for _, s, _ in list_steps(con, layout.table)} | {layout.step}
    sets = [f"{q(c)} = i.{q(c)}" for c in layout.mirror]
    existing = column_types(con, layout.table)
    sets += [f"{q(s + '_version')} = NULL" for s in sorted(steps) if s + "_version" in existing]
    with registered(con, INCOMING, rows.select([*layout.key, *layout.mirror])):
        con.execute(
            f"UPDATE {q(layout.table)} AS t SET {', '.join(sets)} FROM {INCOMING} AS i "
            f"WHERE {layout.key_join('t', 'i')}"
        )


def render_rows(
    con: Con,
    layout: Layout,
    definition: StepDefinition,
    frame: pl.DataFrame,
    *,
    in_sql: bool,
    legacy_signature: str | None,
) -> None:
    """Write the current request of the frame's rows `frame` (key and inputs) into the ledger.

    `legacy_signature`: when the store came from llmledger 0.1.0, DONE rows whose old fingerprint
    matches this request under the old formula get the new fingerprint, so upgrading does not make
    every answer look stale.
    """
    c = names(layout.step, "t")
    version = {"version": definition.version}
    if in_sql:
        keys = frame.select(layout.key)
        with registered(con, INCOMING, keys):
            prompt = definition.prompt.sql("s")
            _update(
                con,
                layout,
                definition,
                legacy_signature,
                f"(SELECT {', '.join('s.' + q(k) for k in layout.key)}, {prompt} AS {P} "
                f"FROM {q(layout.table)} AS s WHERE EXISTS (SELECT 1 FROM {INCOMING} AS k "
                f"WHERE {layout.key_join('s', 'k')}))",
                "true",
                version,
            )
        return
    for chunk in definition.prompt.render_chunks(frame, layout.key):
        with registered(con, INCOMING, chunk):
            _update(
                con,
                layout,
                definition,
                legacy_signature,
                f"(SELECT {', '.join(q(k) for k in layout.key)}, {RENDERED} AS {P} FROM {INCOMING})",
                f"{c['_version']} IS DISTINCT FROM $version OR {c['_request_fingerprint']} IS DISTINCT FROM r.{FP}",
                version,
            )


def render_dependent(
    con: Con,
    layout: Layout,
    plan: PromptPlan,
    version: str,
    request: RequestSpec,
    graph: StepGraph,
) -> int:
    """Render, in SQL over the stored answers, the requests of a step that reads other steps.

    Every row of the table is rendered; only rows whose request or upstream digest changed are
    written. Returns how many were.
    """
    c = names(layout.step)
    keys = ", ".join(f"t.{q(k)}" for k in layout.key)
    source = (
        f"SELECT {keys}, {plan.sql('t', graph.field_sql)} AS {P}, {graph.digest_sql(layout.step)} AS {UP} "
        f"FROM {q(layout.table)} AS t"
    )
    fingerprint = request.fingerprint_sql(P, dialect_of(con).json_string_sql)
    rows = con.execute(
        f"UPDATE {q(layout.table)} AS t SET {c['_prompt']} = r.{P}, {c['_request_fingerprint']} = r.{FP}, "
        f"{c['_version']} = $version, {c['_upstream_fingerprint']} = r.{UP} "
        f"FROM (SELECT *, {fingerprint} AS {FP} FROM ({source}) AS s) AS r "
        f"WHERE {layout.key_join('t', 'r')} AND (t.{c['_version']} IS DISTINCT FROM $version "
        f"OR t.{c['_request_fingerprint']} IS DISTINCT FROM r.{FP} "
        f"OR t.{c['_upstream_fingerprint']} IS DISTINCT FROM r.{UP}) RETURNING 1",
        {"version": version},
    ).fetchall()
    return len(rows)


def _update(
    con: Con,
    layout: Layout,
    definition: StepDefinition,
    legacy_signature: str | None,
    source: str,
    condition: str,
    params: dict[str, str],
) -> None:
    c = names(layout.step)
    sets = [f"{c['_prompt']} = r.{P}", f"{c['_request_fingerprint']} = r.{FP}", f"{c['_version']} = $version"]
    extra = ""
    if legacy_signature is not None:
        extra = f", md5('{LEGACY_FINGERPRINT_PREFIX}' || md5({sql_literal(legacy_signature)} || {P}))::UUID AS {LEGACY}"
        sets.append(
            f"{c['_fingerprint']} = CASE WHEN t.{c['_fingerprint']} = r.{LEGACY} THEN r.{FP} "
            f"ELSE t.{c['_fingerprint']} END"
        )
    fingerprint = definition.request.fingerprint_sql(P, dialect_of(con).json_string_sql)
    con.execute(
        f"UPDATE {q(layout.table)} AS t SET {', '.join(sets)} FROM "
        f"(SELECT *, {fingerprint} AS {FP}{extra} FROM {source} AS s) "
        "AS r "
        f"WHERE {layout.key_join('t', 'r')} AND ({condition})",
        params,
    )


def legacy_signature(definition: StepDefinition, migrated_from_legacy: bool) -> str | None:
    """0.1.0's fingerprint prefix for this request, when such fingerprints may be in the store.

    0.1.0 ignored request options, so an answer made with options cannot be vouched for: such calls
    leave old fingerprints alone (those rows report as stale).
    """
    request = definition.request
    if not migrated_from_legacy or request.options:
        return None
    return f"{request.model}\x1f{request.system or ''}\x1f{request.max_tokens}\x1f"


def frame_columns(frame: pl.DataFrame, key: Sequence[str], owned: set[str]) -> list[str]:
    """The frame columns copied into the fact table: storable, and not owned by a step."""
    return [c for c, t in frame.schema.items() if t != pl.Object and c not in key and c not in owned]
