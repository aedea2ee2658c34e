"""Parquet in and out: a Parquet file as input, a ledger exported for archiving or a warehouse, and restored.

`export(store, table, folder)` writes the fact table and its bookkeeping, one
Parquet file each (as DuckDB's `EXPORT DATABASE` does):

    folder/<table>.parquet              the fact table: keys, inputs, every step's columns (STRUCTs kept)
    folder/llmledger_steps.parquet      the table's step definitions and their requests
    folder/llmledger_history.parquet    the answers redos replaced
    folder/llmledger_runs.parquet       one row per run

`restore(folder, store)` rebuilds that table in a store (new, or one without
that table) with statuses, outputs, usage, flags and history as they were, so
a rerun of the same cell pays nothing. A path with a suffix is one file instead,
in the format the suffix names: `.parquet` (any Parquet reader opens it), `.csv`
(structured answers as JSON text), `.jsonl` or `.ndjson` (JSON lines); any other
suffix is refused (`out.csv` once became a folder of Parquet files). The file
holds the fact table (every step's columns), or with `step=S` one step's view
(key, inputs, output, status, error, usage, cost).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from llmledger._ledger.columns import STEP_COLUMNS
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.duckdb import check_store_path, make_folders, remove_folders
from llmledger._ledger.engine.postgres import is_url
from llmledger._ledger.engine.shared import column_types, frames, table_exists
from llmledger._ledger.open import open_existing, open_ledger
from llmledger._ledger.schema import (
    HISTORY_TABLE,
    PACKS_TABLE,
    RUNS_TABLE,
    STEPS_TABLE,
    VERDICTS_TABLE,
    ensure_step_columns,
    list_steps,
    migrate,
    owned_columns,
)
from llmledger._step.prompt import template_fields
from llmledger._step.request import sql_literal
from llmledger._step.sqltext import q
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError, LedgerError

_BOOKKEEPING = (STEPS_TABLE, HISTORY_TABLE, RUNS_TABLE, VERDICTS_TABLE, PACKS_TABLE)  # each table's own rows go along
_STEP_VIEW = (
    "",
    "_status",
    "_error",
    "_attempts",
    "_input_tokens",
    "_output_tokens",
    "_cost_usd",
    "_model",
    "_finished_at",
    "_raw",
    "_flag",
)


def is_parquet_path(df: Any) -> bool:
    return isinstance(df, str | Path) and (str(df).endswith(".parquet") or any(c in str(df) for c in "*?["))


def read_parquet_input(
    path: str | Path, *, key: str | Sequence[str] | None, prompt: Any, where: str | None, every_column: bool = False
) -> pl.DataFrame:
    """The columns of a Parquet file (or glob) a step needs: its key, what the prompt and `where` name.

    A callable prompt (or a `validate=` callable, `every_column`) may read any column, so it gets them all.
    """
    try:
        lazy = pl.scan_parquet(str(path))
        names = list(lazy.collect_schema().names())
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise InvalidInputError(f"df={str(path)!r} could not be read as Parquet: {exc}") from None
    if callable(prompt) or every_column:
        return lazy.collect()
    wanted = [key] if isinstance(key, str) else list(key) if key is not None else ["id"]
    if isinstance(prompt, str):
        with contextlib.suppress(InvalidInputError):  # apply_llm reports a bad template itself
            wanted += template_fields(prompt)
    if where:
        wanted += [w.strip('"') for w in re.findall(r'"[^"]+"|[A-Za-z_][A-Za-z0-9_]*', where)]
    keep = [n for n in names if n in set(wanted)]
    return lazy.select(keep or names).collect()


@dataclass(frozen=True)
class Spelling:
    """How export's errors name its options: as the Python call takes them, or as `llmledger export` does (a shell
    user told to "pass overwrite=True" has nowhere to pass it)."""

    overwrite: str
    step: str


PYTHON = Spelling(overwrite="overwrite=True", step="export(step=...)")
COMMAND_LINE = Spelling(overwrite="--overwrite", step="--step")


def export(
    store: str | Path, table: str, path: str | Path, *, step: str | None = None, overwrite: bool = False
) -> Path:
    """Write `table` (with its steps' bookkeeping) to the folder `path`; to a `path` ending in `.parquet`, `.csv`,
    `.jsonl` or `.ndjson`, the table alone as one file of that format (or with `step=`, one step's view); any
    other suffix is refused, before anything is written.

    An existing file, or a folder export wrote before, is replaced only with `overwrite=True` (a folder holding
    anything else is never emptied). Returns the path written. See the module docstring for the layout.
    """
    return export_spelled(store, table, path, step=step, overwrite=overwrite, spelling=PYTHON)


def export_spelled(
    store: str | Path,
    table: str,
    path: str | Path,
    *,
    step: str | None = None,
    overwrite: bool = False,
    spelling: Spelling = PYTHON,
) -> Path:
    """`export`, its errors naming the options as `spelling` does (`llmledger export` passes COMMAND_LINE)."""
    if not isinstance(overwrite, bool):
        raise InvalidInputError(f"overwrite must be True or False, got {overwrite!r}")
    out = Path(path).expanduser()
    suffix = out.suffix.lower()
    if suffix and suffix not in (".parquet", *TEXT_FORMATS):  # found in a trial: out.csv became a folder of Parquet
        raise InvalidInputError(
            f"export writes a folder (a path without a suffix) or one file ending in .parquet, .csv, .jsonl or "
            f".ndjson; got {str(path)!r}. Nothing was written."
        )
    if step is not None and not suffix:
        raise InvalidInputError(
            f"{spelling.step} writes one file: pass a path ending in .parquet, .csv, .jsonl or .ndjson, "
            f"got {str(path)!r}"
        )
    ledger = open_existing(store)
    ledger.migrated()  # every column an export lists
    steps = {s: key for _, s, key in ledger.steps(table)}
    if not steps:
        raise InvalidInputError(f"the store has no table {table!r} with llmledger steps")
    if not is_url(store) and out.resolve() == Path(store).expanduser().resolve():
        raise InvalidInputError(f"{str(path)!r} is the store itself; export to another path")
    with ledger.conn.open(wait=60.0, read_only=True) as con:
        query = None  # one file's: a step's view, or the table alone
        if step is not None:  # one step's view, as one file
            if step not in steps:
                raise InvalidInputError(f"table {table!r} has no step {step!r}; it has {sorted(steps)}")
            owned = owned_columns(con, table, step)
            inputs = [c for c in column_types(con, table) if c not in owned]
            query = f"SELECT {', '.join(q(c) for c in [*inputs, *(step + s for s in _STEP_VIEW)])} FROM {q(table)}"
        elif suffix:  # the table alone, as one file of what the suffix names (a folder holds mixed schemas)
            if out.is_dir():
                raise InvalidInputError(
                    f"{str(out)!r} is a folder; pass a new file path ending in {suffix}, or a folder path (without "
                    "a suffix) for the table with its bookkeeping"
                )
            query = f"SELECT * FROM {q(table)}"
        if query is not None:
            _check_file(out, overwrite, spelling)
            _make_folder(out.parent, out)
            _copy(con, query, out)
            return out
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            exported = (
                out.is_dir()
                and (out / f"{STEPS_TABLE}.parquet").exists()
                and all(f.is_file() and f.suffix == ".parquet" for f in out.iterdir())
            )
            if not (overwrite and exported):
                raise InvalidInputError(
                    f"{str(out)!r} exists and is not an empty folder; export writes a folder of Parquet files (a "
                    "path ending in .parquet, .csv, .jsonl or .ndjson gets a single file). "
                    + (
                        f"Pass {spelling.overwrite} to replace that earlier export."
                        if exported
                        else "It is not a folder export wrote, so it is never emptied: choose another path."
                    )
                )
            for old in out.glob("*.parquet"):
                old.unlink()
        _make_folder(out, out)
        _copy(con, f"SELECT * FROM {q(table)}", out / f"{table}.parquet")
        for name in _BOOKKEEPING:
            if table_exists(con, name):
                _copy(
                    con,
                    f"SELECT * FROM {name} WHERE table_name = '{table.replace(chr(39), chr(39) * 2)}'",
                    out / f"{name}.parquet",
                )
    return out


def _check_file(out: Path, overwrite: bool, spelling: Spelling) -> None:
    if out.exists() and not overwrite:
        raise InvalidInputError(f"{str(out)!r} exists; pass {spelling.overwrite} to replace it, or choose a new path")
    if out.is_dir():
        raise InvalidInputError(f"{str(out)!r} is a folder; pass a file path ending in {out.suffix or '.parquet'}")


def restore(path: str | Path, store: str | Path) -> str:
    """Rebuild the table exported to the folder `path` in `store`; return the table's name.

    The store is created if missing; it must not have a table of that name already.
    """
    folder = Path(path).expanduser()
    facts = [p for p in folder.glob("*.parquet") if p.stem not in _BOOKKEEPING] if folder.is_dir() else []
    if len(facts) != 1 or not (folder / f"{STEPS_TABLE}.parquet").exists():
        raise InvalidInputError(
            f"{str(folder)!r} is not a folder written by llmledger.export (it needs one "
            f"<table>.parquet and {STEPS_TABLE}.parquet)"
        )
    table = facts[0].stem
    if is_url(store):
        raise InvalidInputError(
            "restore writes into a DuckDB file; to bring an export into PostgreSQL, restore it "
            "into a new .duckdb file, then: llmledger copy FILE postgresql://..."
        )
    target = Path(store).expanduser()
    check_store_path(target)
    made = make_folders(target)
    ledger = open_ledger(target)

    def work(con: Any) -> None:
        migrate(con, utcnow())
        if table_exists(con, table):
            raise InvalidInputError(f"store {str(target)!r} already has a table {table!r}; restore into another store")
        con.execute(f"CREATE TABLE {q(table)} AS SELECT * FROM read_parquet({sql_literal(str(facts[0]))})")
        for name in _BOOKKEEPING:
            part = folder / f"{name}.parquet"
            if part.exists():
                con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM read_parquet({sql_literal(str(part))})")
        types = column_types(con, table)
        for _, step, _ in list_steps(con, table):  # an export from an older llmledger lacks newer columns
            ensure_step_columns(con, table, step, types.get(step, STEP_COLUMNS[0].sql_type))
            for column in STEP_COLUMNS:  # Parquet keeps no column defaults; new rows need them
                if column.default is not None:
                    con.execute(
                        f"ALTER TABLE {q(table)} ALTER COLUMN {q(step + column.suffix)} SET DEFAULT {column.default}"
                    )

    try:
        ledger.conn.transaction(work, wait=60.0)
    except InvalidInputError:
        remove_folders(made)  # none when the store was there (the file appears only on a commit)
        raise
    return table


def _make_folder(folder: Path, out: Path) -> None:
    """Create the folder an export writes into: a path that cannot be written is the call's mistake."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot write the export to {str(out)!r}: {exc}") from None


def _copy(con: Any, query: str, path: Path) -> None:
    """Write a query's rows to a Parquet file; failing to write it (not to read the store) is the path's fault."""
    try:
        _write(con, query, path)
    except (OSError, duckdb.IOException) as exc:
        if isinstance(exc, LedgerError) or path.name not in str(exc):
            raise
        raise InvalidInputError(f"cannot write the export to {str(path)!r}: {exc}") from None


TEXT_FORMATS = (".csv", ".jsonl", ".ndjson")  # one file of text: structured answers as JSON text in a CSV


def _write_text(con: Any, query: str, path: Path) -> None:
    """A query's rows as CSV or JSON lines, by the file's suffix, chunk by chunk (as Parquet from PostgreSQL is):
    a table larger than memory is written too, the same way from either engine."""
    csv = path.suffix.lower() == ".csv"
    with path.open("wb") as out:
        header = csv
        for chunk in frames(con, query, 100_000):
            if csv:
                _as_cells(chunk).write_csv(out, include_header=header)
                header = False
            else:
                chunk.write_ndjson(out)
        if header:  # no rows: a CSV of the header alone
            empty = con.sql(f"SELECT * FROM ({query}) AS q LIMIT 0").pl()
            _as_cells(empty).write_csv(out)


def _as_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """A CSV cell holds text: a nested value (a structured answer's STRUCT, a list) as its JSON, not dropped."""
    nested = [c for c, t in frame.schema.items() if t.is_nested()]
    return frame.with_columns(
        pl.col(c).struct.json_encode()
        if isinstance(frame.schema[c], pl.Struct)
        else pl.col(c).map_elements(_json, return_dtype=pl.String)
        for c in nested
    )


def _json(value: Any) -> str:
    return json.dumps(value.to_list() if isinstance(value, pl.Series) else value, default=str)


def _write(con: Any, query: str, path: Path) -> None:
    """By DuckDB itself, or from PostgreSQL chunk by chunk (structured answers, JSONB there, as JSON text)."""
    if path.suffix.lower() in TEXT_FORMATS:
        _write_text(con, query, path)
        return
    if dialect_of(con).writes_parquet:
        con.execute(f"COPY ({query}) TO {sql_literal(str(path))} (FORMAT parquet)")
        return
    import pyarrow.parquet as pq

    writer = None
    try:
        for chunk in frames(con, query, 100_000):
            table = chunk.to_arrow()
            writer = writer or pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table)
        if writer is None:  # no rows: an empty file with the columns
            empty = con.sql(f"SELECT * FROM ({query}) AS q LIMIT 0").pl().to_arrow()
            writer = pq.ParquetWriter(str(path), empty.schema)
            writer.write_table(empty)
    finally:
        if writer is not None:
            writer.close()
