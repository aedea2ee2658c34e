"""Moving a ledger from one store to another: DuckDB to PostgreSQL when a team outgrows one machine, and back.

Everything a store holds comes along: every fact table with each step's
statuses, answers (structured ones as STRUCT on DuckDB, JSONB on PostgreSQL),
usage, cost, fingerprints, stored requests and flags; and the step
definitions, runs, history and Message Batches. Rows are read in chunks and
written in one transaction, so a copy that fails leaves the target as it was.
Copy while no run is in progress: journals of unfinished runs stay with the
source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmledger._ledger.columns import JSONB, output_as_text, output_from_text, step_columns
from llmledger._ledger.engine.dialect import dialect_of, nested
from llmledger._ledger.engine.shared import column_types, frames, registered, table_exists
from llmledger._ledger.open import locate, open_ledger, shown
from llmledger._ledger.prepare import create_fact_table
from llmledger._ledger.schema import (
    BATCHES_TABLE,
    HISTORY_TABLE,
    PACKS_TABLE,
    RUNS_TABLE,
    STEPS_TABLE,
    VERDICTS_TABLE,
    current_output_spec,
    ensure_step_columns,
    list_steps,
    migrate,
)
from llmledger._step.sqltext import q
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError

CHUNK_ROWS = 100_000
BOOKKEEPING = (STEPS_TABLE, RUNS_TABLE, HISTORY_TABLE, BATCHES_TABLE, VERDICTS_TABLE, PACKS_TABLE)
INCOMING = "llmledger_copy"


def copy(source: str | Path, target: str | Path) -> dict[str, int]:
    """Copy the whole ledger in `source` into `target`, a new DuckDB file or an empty PostgreSQL database.

    Returns the rows copied per table. The target must not hold a ledger yet (nothing is merged); a
    failed copy writes nothing.
    """
    src_at, dst_at = locate(source, must_exist=True), locate(target)
    if str(src_at) == str(dst_at):
        raise InvalidInputError(f"source and target are the same store ({shown(source)}); name another target")
    src, dst = open_ledger(src_at), open_ledger(dst_at)
    src.conn.transaction(lambda con: migrate(con, utcnow()), wait=60.0, exclusive=True)
    copied: dict[str, int] = {}

    def work(dcon: Any) -> None:
        if list_steps(dcon):
            raise InvalidInputError(
                f"the target {shown(target)} already holds a ledger; copy into a new DuckDB file "
                "or an empty PostgreSQL database"
            )
        migrate(dcon, utcnow())
        with src.conn.open(wait=60.0) as scon:
            for table in BOOKKEEPING:
                if table_exists(scon, table):
                    copied[table] = _copy_rows(scon, dcon, table, {})
            by_table: dict[str, tuple[list[str], list[str]]] = {}
            for table, step, key in list_steps(scon):
                if table_exists(scon, table):
                    by_table.setdefault(table, (key, []))[1].append(step)
            for table, (key, steps) in by_table.items():
                copied[table] = _copy_fact_table(scon, dcon, table, key, steps)

    try:
        dst.conn.transaction(work, wait=60.0, exclusive=True)
    except BaseException:
        dst.conn.remove()  # the empty folders made for a new file (the file appears only on a commit)
        raise
    return copied


def _copy_fact_table(scon: Any, dcon: Any, table: str, key: list[str], steps: list[str]) -> int:
    """Create `table` in the target with the source's columns (each step's output typed for the target's engine),
    then copy its rows."""
    types = column_types(scon, table)
    owned = {c for s in steps for c in step_columns(s)}
    portable = dialect_of(dcon).portable_type
    create_fact_table(dcon, table, {c: portable(t) for c, t in types.items() if c not in owned}, key)
    outputs: dict[str, tuple[str, str]] = {}  # output column -> (source type, target type)
    for step in steps:
        target_type = _output_type(scon, dcon, table, step, types[step])
        ensure_step_columns(dcon, table, step, target_type)
        outputs[step] = (types[step], target_type)
    return _copy_rows(scon, dcon, table, outputs)


def _output_type(scon: Any, dcon: Any, table: str, step: str, source_type: str) -> str:
    if source_type == "VARCHAR":
        return "VARCHAR"
    if dialect_of(dcon).structured_as_jsonb:
        return JSONB
    spec = current_output_spec(scon, table, step)
    return spec.sql_type if spec is not None else "VARCHAR"


def _copy_rows(scon: Any, dcon: Any, table: str, outputs: dict[str, tuple[str, str]]) -> int:
    """Copy every row of `table` chunk by chunk. UUIDs and structured values travel as text; the target turns
    them back into its own types."""
    source, target = column_types(scon, table), column_types(dcon, table)
    columns = [c for c in source if c in target]
    read = [f"{_as_text(scon, q(c), outputs[c][0] if c in outputs else source[c])} AS {q(c)}" for c in columns]
    write = [_from_text(f"i.{q(c)}", outputs[c][1] if c in outputs else target[c]) for c in columns]
    total = 0
    for chunk in frames(scon, f"SELECT {', '.join(read)} FROM {q(table)}", CHUNK_ROWS):
        with registered(dcon, INCOMING, chunk):
            dcon.execute(
                f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) "
                f"SELECT {', '.join(write)} FROM {INCOMING} AS i"
            )
        total += chunk.height
    return total


def _as_text(con: Any, expr: str, sql_type: str) -> str:
    """SQL reading a column for the copy: UUIDs and nested values as text, the rest as they are."""
    if sql_type == "UUID" or (nested(sql_type) and dialect_of(con).structured_as_jsonb):
        return f"CAST({expr} AS VARCHAR)"
    return output_as_text(expr, sql_type) if nested(sql_type) else expr


def _from_text(expr: str, sql_type: str) -> str:
    """SQL writing a copied value into a column of `sql_type` (the inverse of `_as_text`)."""
    if sql_type == "UUID":
        return f"CAST({expr} AS UUID)"
    return output_from_text(expr, sql_type) if nested(sql_type) else expr
