"""One pass over the ledger that says, for every row of a frame, what the ledger holds for it.

The common case is a rerun of the same cell: the fact table holds the frame's
rows in the frame's order (they were inserted from it). Then the survey is two
sequential scans of different columns, with no join and no hash table: the
keys and copied inputs, compared with the frame slice by slice in polars and
dropped at once; then the per-row facts kept for the answer. When the orders
differ (a shuffled or filtered frame, a table fed by other frames) it falls
back to one hash join in DuckDB and puts the rows back in frame order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import duckdb
import polars as pl

from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.duckdb import JOIN_MEMORY_LIMIT, SCAN_MEMORY_LIMIT
from llmledger._ledger.engine.shared import arrow_batches, column_types, db_errors, memory_limited, registered
from llmledger._ledger.states import STATUSES, eligible_sql, kept_sql, stale_sql
from llmledger._ledger.where import check_where_shape
from llmledger._step.request import sql_literal
from llmledger._step.sqltext import q
from llmledger.errors import WhereClauseError

BATCH_ROWS = 250_000
STATUS_TYPE = pl.Enum(STATUSES)
FRAME = "llmledger_frame"
_FLAGS = ("current", "stale", "eligible", "in_where", "waiting", "kept", "kept_flagged")


@dataclass(frozen=True)
class Layout:
    """What a call needs to know about the fact table."""

    table: str
    step: str
    key: list[str]
    mirror: list[str]  # frame columns copied into the fact table
    ready: str = "true"  # SQL over `t`: the steps this step reads are fresh (graph.py)
    stale: str | None = None  # SQL over `t` for a step fed by others; None: the plain rule (states.py)

    def col(self, suffix: str, alias: str = "") -> str:
        return names(self.step, alias)[suffix]

    def key_join(self, left: str = "t", right: str = "i") -> str:
        return " AND ".join(f"{left}.{q(k)} = {right}.{q(k)}" for k in self.key)

    def key_json(self, alias: str = "t") -> str:
        """SQL: the row's key as compact JSON, `{"id":1}`, the same text on DuckDB and PostgreSQL."""
        parts = " || ',' || ".join(
            f"{sql_literal(json.dumps(k, ensure_ascii=False) + ':')} || CAST(to_json({alias}.{q(k)}) AS VARCHAR)"
            for k in self.key
        )
        return f"('{{' || {parts} || '}}')"


def flag_sql(layout: Layout, where: str | None, *, named: bool | None = None) -> dict[str, str]:
    """Per-row facts, as SQL over the fact table `t` (parameters: version, max_attempts, redo, run_started).
    `named`: the call's own where= names the rows (by default, when there is a `where`)."""
    col = names(layout.step)
    named = where is not None if named is None else named
    stale = layout.stale or stale_sql(col)
    kept = kept_sql(col)
    return {
        "current": f"coalesce({col['_version']} = $version, false)",
        "status": col["_status"],
        "stale": stale,
        "eligible": f"({eligible_sql(col, stale, named=named)} AND {layout.ready})",
        "waiting": f"(NOT {layout.ready} AND {col['_status']} IN ('NOT_STARTED', 'FAILED'))",
        "in_where": f"coalesce(({where}), false)" if where else "true",
        "output": col[""],
        # a person accepted or wrote the answer: every redo keeps it (states.eligible_sql), stale or not
        "kept": kept,
        # flagged, yet kept by redo='flagged': a person wrote the answer (a flag does not undo a correction)
        "kept_flagged": f"({col['_flag']} IS NOT NULL AND {kept})",
    }


def check_where(con: Con, table: str, where: str | None) -> None:
    """Bind `where` against the fact table without reading it, so a bad predicate fails before anything runs.

    Its shape is checked first (`where.py`): only one self-contained expression reaches the engine, and it is
    bound through a query with a parameter, which PostgreSQL (extended protocol) runs as one statement at most.
    """
    if not where:
        return
    check_where_shape(where)
    columns = list(column_types(con, table))  # before the query: a failed one aborts the transaction
    if dialect_of(con).statement_count(con, f"SELECT 1 WHERE ({where})") != 1:
        raise WhereClauseError(
            f"where={where!r} is more than one SQL statement; pass one predicate such as \"label = 'spam'\""
        )
    try:
        con.execute(f"SELECT $one FROM {q(table)} WHERE coalesce(({where}), false) LIMIT 0", {"one": 1}).fetchall()
    except db_errors() as exc:
        raise WhereClauseError(
            f"where={where!r} does not work on table {table!r}: "
            f"{str(exc).splitlines()[0]}. It is SQL over the fact table's columns: "
            f"{columns}"
        ) from None
    probe = f"SELECT ({where}) AS llmledger_where FROM {q(table)}"  # one expression now (checked above)
    kind = dialect_of(con).expression_type(con, probe)
    if kind not in ("BOOLEAN", '"NULL"'):
        raise WhereClauseError(
            f"where={where!r} is not a condition: its value is {kind}, not true or false "
            '(e.g. "label = \'spam\'" rather than "label")'
        )


def survey(
    con: Con,
    layout: Layout,
    frame: pl.DataFrame,
    *,
    fields: Sequence[str],
    params: dict[str, Any],
    where: str | None = None,
    named: bool | None = None,
    compare: bool = True,
    wrote: bool = False,
) -> pl.DataFrame:
    """`fields` of `flag_sql`, plus `exists` (and, with `compare`, `changed`), for every frame row in frame order.

    Read under a small memory limit, unless the transaction `wrote` rows (see `memory_limited`)."""
    flags = flag_sql(layout, where, named=named)
    exprs = {name: flags[name] for name in fields}
    parts: list[pl.DataFrame] = []
    with memory_limited(con, 0 if wrote else SCAN_MEMORY_LIMIT):
        aligned = _aligned_rows(con, layout, frame, compare)
        if aligned is not None:
            query = f"SELECT {_select_list(exprs)} FROM {q(layout.table)} AS t LIMIT {aligned[0]}"
            parts = [_facts(b) for b in arrow_batches(con.sql(query, params=_used(params, query)), BATCH_ROWS)]
    if aligned is None:
        found = _joined(con, layout, frame, exprs, params, compare, 0 if wrote else JOIN_MEMORY_LIMIT)
        return _structured(con, layout, found) if dialect_of(con).structured_as_jsonb and "output" in exprs else found
    present, changed = aligned
    found = pl.concat(parts, rechunk=False) if parts else _absent(0, exprs)
    found = found.with_columns(pl.lit(True).alias("exists"))
    if compare:
        changed_rows = pl.concat(changed) if changed else pl.Series([], dtype=pl.Boolean)
        found = found.with_columns(changed_rows.alias("changed"))
    if present < frame.height:
        missing = _absent(frame.height - present, exprs, compare)
        found = pl.concat([found, missing.select(found.columns)], how="vertical_relaxed", rechunk=False)
    return found


def _aligned_rows(con: Con, layout: Layout, frame: pl.DataFrame, compare: bool) -> tuple[int, list[pl.Series]] | None:
    """(rows the table holds of the frame, `changed` per slice) when the table holds the frame's rows first and in
    the frame's order; None otherwise (always on PostgreSQL, whose tables keep no order).

    Anything kept from an Arrow batch keeps the whole batch alive, so of this scan nothing is kept but the
    freshly computed `changed`.
    """
    if not dialect_of(con).ordered_scans:
        return None
    columns = [*layout.key, *(layout.mirror if compare else [])]
    query = f"SELECT {', '.join(q(c) for c in columns)} FROM {q(layout.table)} LIMIT {frame.height}"
    changed: list[pl.Series] = []
    pos = 0
    for batch in arrow_batches(con.sql(query), BATCH_ROWS):
        chunk = pl.from_arrow(batch)
        assert isinstance(chunk, pl.DataFrame)
        mine = frame.slice(pos, chunk.height)
        try:
            if not all(mine[k].eq_missing(chunk[k]).all() for k in layout.key):
                return None
            if compare:
                differs = pl.DataFrame([mine[c].ne_missing(chunk[c]).alias(c) for c in layout.mirror])
                changed.append(
                    differs.select(pl.any_horizontal(pl.all())).to_series()
                    if layout.mirror
                    else pl.repeat(False, chunk.height, eager=True)
                )
        except (pl.exceptions.PolarsError, TypeError):  # types polars will not compare: let SQL decide
            return None
        pos += chunk.height
    return pos, changed


def _facts(batch: Any) -> pl.DataFrame:
    part = pl.from_arrow(batch)
    assert isinstance(part, pl.DataFrame)
    part = part.rename({c: c[2:] for c in part.columns})
    return part.with_columns(pl.col("status").cast(STATUS_TYPE)) if "status" in part.columns else part


def _absent(n: int, exprs: dict[str, str], compare: bool = False) -> pl.DataFrame:
    """Survey rows for frame rows the table does not have yet."""

    def constant(name: str, value: bool | None, dtype: Any) -> pl.Series:
        return pl.repeat(value, n, dtype=dtype, eager=True).alias(name)

    types = {"status": STATUS_TYPE, "output": pl.Null()}  # the output's type is the step's: text or a Struct
    columns = [
        constant(name, False, pl.Boolean()) if name in _FLAGS else constant(name, None, types[name]) for name in exprs
    ]
    columns.append(constant("exists", False, pl.Boolean()))
    if compare:
        columns.append(constant("changed", False, pl.Boolean()))
    return pl.DataFrame(columns)


def _used(params: dict[str, Any], query: str) -> dict[str, Any]:
    """The parameters a query refers to (DuckDB refuses unused ones)."""
    return {name: value for name, value in params.items() if f"${name}" in query}


def _select_list(exprs: dict[str, str]) -> str:
    return ", ".join(f"{sql} AS {q('__' + name)}" for name, sql in exprs.items())


def _joined(
    con: Con,
    layout: Layout,
    frame: pl.DataFrame,
    exprs: dict[str, str],
    params: dict[str, Any],
    compare: bool,
    limit: int,
) -> pl.DataFrame:
    """The survey by one hash join, for frames whose order is not the table's."""
    mirror = layout.mirror if compare else []
    with registered(con, FRAME, frame.select([*layout.key, *mirror]).with_row_index("__row")):
        changed = " OR ".join(f"t.{q(c)} IS DISTINCT FROM i.{q(c)}" for c in mirror) or "false"
        inner = ", ".join(q(c) for c in [*layout.key, *mirror])
        outs = ", ".join(f"t.{q('__' + n)} AS {q(n)}" for n in exprs)
        query = (
            f"SELECT i.__row, {outs}, t.__exists IS NOT NULL AS {q('exists')}"
            + (f", coalesce(({changed}), false) AS changed" if compare else "")
            + f" FROM {FRAME} AS i LEFT JOIN (SELECT {inner}, true AS __exists, {_select_list(exprs)} "
            f"FROM {q(layout.table)} AS t) AS t ON {layout.key_join('t', 'i')}"
        )
        with memory_limited(con, limit):
            relation = con.sql(query, params=_used(params, query))
            batches = [cast(pl.DataFrame, pl.from_arrow(b)) for b in arrow_batches(relation, BATCH_ROWS)]
    found = pl.concat(batches, rechunk=False)
    found = found.with_columns(pl.col(f).fill_null(False) for f in _FLAGS if f in found.columns)
    if "status" in found.columns:
        found = found.with_columns(pl.col("status").cast(STATUS_TYPE))
    return _in_frame_order(found)


def _structured(con: Any, layout: Layout, found: pl.DataFrame) -> pl.DataFrame:
    """PostgreSQL keeps a structured answer as JSONB: give it the polars Struct the step's schema makes on DuckDB,
    converted by DuckDB itself, so a frame comes back the same from either store."""
    from llmledger._ledger.schema import current_output_spec

    spec = current_output_spec(con, layout.table, layout.step)
    if spec is None or column_types(con, layout.table).get(layout.step) != "JSONB":
        return found
    scratch = duckdb.connect()
    try:
        scratch.register("answers", found.select("output").to_arrow())
        output = scratch.sql(
            f"SELECT try_cast(try_cast(output AS JSON) AS {spec.sql_type}) AS output FROM answers"
        ).pl()["output"]
    finally:
        scratch.close()
    return found.with_columns(output)


def _in_frame_order(found: pl.DataFrame) -> pl.DataFrame:
    """Rows back in frame order: `__row` is a permutation, so one scatter and a gather per column do it
    (column by column, dropping each original, so two copies of the whole never coexist)."""
    n = found.height
    if found["__row"].is_sorted():
        return found.drop("__row")
    order = pl.zeros(n, dtype=pl.UInt32, eager=True).scatter(
        found["__row"], pl.int_range(0, n, dtype=pl.UInt32, eager=True)
    )
    found = found.drop("__row")
    columns = []
    for name in found.columns:
        columns.append(found[name].gather(order))
        found = found.drop(name)
    return pl.DataFrame(columns)
