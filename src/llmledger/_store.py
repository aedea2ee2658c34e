"""The ledger on disk: schema, upserts, claims and per-chunk commits in DuckDB.

DuckDB lets one process at a time open a file, so every function here runs
inside `Store.open()`, which holds the file only for one claim or one commit
and waits politely while someone else (the duckdb CLI, another notebook) has it.
Each write is one transaction: a row's output and its status land together.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from ._prompt import FINGERPRINT_COL, PROMPT_COL
from .errors import KeyColumnError, StoreError, WhereClauseError

STATUSES = ("NOT_STARTED", "RUNNING", "DONE", "FAILED", "NEEDS_REVIEW")
STEPS_TABLE = "llmledger_steps"
RUNS_TABLE = "llmledger_runs"
HISTORY_TABLE = "llmledger_history"
INCOMING = "llmledger_incoming"
_DUCKDB_MAGIC = b"DUCK"

# Per-step columns, in the order they are added. `{step}` itself holds the output.
STEP_COLUMNS: dict[str, str] = {
    "": "VARCHAR",
    "_status": "VARCHAR DEFAULT 'NOT_STARTED'",
    "_running_started_at": "TIMESTAMP",
    "_claimed_by": "VARCHAR",
    "_attempts": "INTEGER DEFAULT 0",
    "_error": "VARCHAR",
    "_finished_at": "TIMESTAMP",
    "_input_tokens": "BIGINT",
    "_output_tokens": "BIGINT",
    "_cost_usd": "DOUBLE",
    "_stop_reason": "VARCHAR",
    "_model": "VARCHAR",
    "_fingerprint": "VARCHAR",
}

_locks: dict[Path, threading.Lock] = {}
_locks_guard = threading.Lock()


def q(name: str) -> str:
    """Quote an identifier for DuckDB."""
    return '"' + name.replace('"', '""') + '"'


def step_columns(step: str) -> list[str]:
    return [step + suffix for suffix in STEP_COLUMNS]


def _is_lock_error(exc: Exception) -> bool:
    return "lock" in str(exc).lower()


def check_store_path(path: Path) -> None:
    """Refuse a path that exists but is not a DuckDB file, before DuckDB touches it."""
    if path.is_dir():
        raise StoreError(f"store {str(path)!r} is a directory; pass a file path such as "
                         f"{str(path / 'ledger.duckdb')!r}.")
    if path.exists() and path.stat().st_size > 0:
        with path.open("rb") as fh:
            head = fh.read(12)
        if head[8:12] != _DUCKDB_MAGIC:
            raise StoreError(f"store {str(path)!r} exists but is not a DuckDB database file; "
                             "pass a new path (it will be created) or an existing .duckdb ledger.")


class Store:
    """One DuckDB file, opened briefly for each transaction."""

    def __init__(self, path: str | Path, *, on_wait: Callable[[str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.path = Path(path).expanduser().resolve()
        self.on_wait = on_wait
        self.should_stop = should_stop
        with _locks_guard:
            self._lock = _locks.setdefault(self.path, threading.Lock())

    @contextlib.contextmanager
    def open(self, *, wait: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Open the file, waiting while another process holds it.

        `wait` bounds the wait in seconds (None: until `should_stop` says so, or forever).
        Raises `TimeoutError` when it gives up, so callers can keep their data.
        """
        with self._lock:
            con = self._connect(wait)
            try:
                yield con
            finally:
                con.close()

    def _connect(self, wait: float | None) -> duckdb.DuckDBPyConnection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        delay = 0.02
        told = False
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise StoreError(f"cannot open store {str(self.path)!r}: {exc}") from exc
                waited = time.monotonic() - start
                gave_up = waited >= wait if wait is not None else bool(self.should_stop and self.should_stop())
                if gave_up:
                    raise TimeoutError(f"store {str(self.path)!r} is locked by another process: {exc}") from exc
                if not told and waited > 1 and self.on_wait:
                    self.on_wait(f"waiting for {self.path.name}: {str(exc).split(':', 1)[-1].strip()}")
                    told = True
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)

    def transaction(self, work: Callable[[duckdb.DuckDBPyConnection], Any], *,
                    wait: float | None = None) -> Any:
        """Run `work` in one transaction, retrying on a write conflict.

        DuckDB reports a conflict on the statement, and a COMMIT after it would
        silently roll back, so the conflict is caught here and the work redone.
        """
        for attempt in range(20):
            with self.open(wait=wait) as con:
                con.execute("BEGIN TRANSACTION")
                try:
                    result = work(con)
                    con.execute("COMMIT")
                    return result
                except duckdb.TransactionException as exc:
                    con.execute("ROLLBACK")
                    if "conflict" not in str(exc).lower():
                        raise
                    time.sleep(0.01 * (attempt + 1))
                except BaseException:
                    with contextlib.suppress(duckdb.Error):
                        con.execute("ROLLBACK")
                    raise
        raise StoreError(f"store {str(self.path)!r}: gave up after 20 write conflicts")


# -- schema --------------------------------------------------------------------------------------

def one(con: duckdb.DuckDBPyConnection, sql: str, params: Any = None) -> tuple[Any, ...]:
    """The single row of a query, fetched to the end: a half-read result blocks the connection."""
    return tuple(con.execute(sql, params).fetchall()[0])


def table_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(one(con, "SELECT count(*) FROM information_schema.tables WHERE table_name = ? "
                         "AND table_schema = 'main'", [table])[0])


def column_types(con: duckdb.DuckDBPyConnection, relation: str) -> dict[str, str]:
    rows = con.execute(f"DESCRIBE SELECT * FROM {q(relation)}").fetchall()
    return {r[0]: r[1] for r in rows}


def list_steps(con: duckdb.DuckDBPyConnection, table: str | None = None) -> list[tuple[str, str]]:
    """(table, step) pairs known to the store."""
    return [(t, s) for t, s, _ in list_steps_with_keys(con, table)]


def list_steps_with_keys(con: duckdb.DuckDBPyConnection,
                         table: str | None = None) -> list[tuple[str, str, list[str]]]:
    if not table_exists(con, STEPS_TABLE):
        return []
    sql = f"SELECT table_name, step, key FROM {STEPS_TABLE}"
    params: list[Any] = []
    if table:
        sql += " WHERE table_name = ?"
        params.append(table)
    return [(r[0], r[1], list(r[2])) for r in con.execute(sql + " ORDER BY created_at, step", params).fetchall()]


def _ensure_meta(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(f"""CREATE TABLE IF NOT EXISTS {STEPS_TABLE} (
        table_name VARCHAR, step VARCHAR, key VARCHAR[], created_at TIMESTAMP, model VARCHAR,
        prompt VARCHAR, system VARCHAR)""")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
        run_id VARCHAR, table_name VARCHAR, step VARCHAR, claimant VARCHAR, model VARCHAR,
        started_at TIMESTAMP, finished_at TIMESTAMP, outcome VARCHAR, rows_in_frame BIGINT,
        rows_selected BIGINT, done BIGINT, failed BIGINT, needs_review BIGINT, stale BIGINT,
        calls BIGINT, reused BIGINT, retries BIGINT, input_tokens BIGINT, output_tokens BIGINT, cost_usd DOUBLE)""")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (
        table_name VARCHAR, step VARCHAR, row_key VARCHAR, output VARCHAR, model VARCHAR,
        fingerprint VARCHAR, input_tokens BIGINT, output_tokens BIGINT, cost_usd DOUBLE,
        finished_at TIMESTAMP, replaced_at TIMESTAMP)""")


@dataclass
class Layout:
    """What a call needs to know about the fact table."""

    table: str
    step: str
    key: list[str]
    mirror: list[str]  # frame columns copied into the fact table

    def col(self, suffix: str) -> str:
        return q(self.step + suffix)

    @property
    def key_join(self) -> str:
        return " AND ".join(f"t.{q(k)} = i.{q(k)}" for k in self.key)

    @property
    def key_select(self) -> str:
        return ", ".join(f"t.{q(k)}" for k in self.key)

    def key_json(self, alias: str = "t") -> str:
        parts = ", ".join(f"{q(k)} := {alias}.{q(k)}" for k in self.key)
        return f"to_json(struct_pack({parts}))::VARCHAR"


def owned_columns(con: duckdb.DuckDBPyConnection, table: str, step: str) -> set[str]:
    """Columns the ledger owns for the table's steps (never copied from a frame)."""
    owned = set(step_columns(step))
    for _, other in list_steps(con, table):
        owned.update(step_columns(other))
    return owned


def ensure_schema(con: duckdb.DuckDBPyConnection, layout: Layout, *, model: str, prompt: str,
                  system: str | None, now: datetime) -> None:
    """Create or extend the fact table so it has the frame's columns and the step's columns."""
    _ensure_meta(con)
    incoming = column_types(con, INCOMING)
    wanted = [*layout.key, *layout.mirror]
    if not table_exists(con, layout.table):
        cols = ", ".join(f"{q(c)} {incoming[c]}" for c in wanted)
        con.execute(f"CREATE TABLE {q(layout.table)} ({cols})")
    existing = column_types(con, layout.table)
    for k in layout.key:
        if k not in existing:
            raise KeyColumnError(f"table {layout.table!r} has no column {k!r}, so it cannot be keyed by it; "
                                 f"its columns are {list(existing)}. Pass the key it was built with, or a "
                                 "new table=.")
        if existing[k] != incoming[k] and not _castable(incoming[k], existing[k]):
            raise KeyColumnError(f"key column {k!r} is {existing[k]} in table {layout.table!r} but "
                                 f"{incoming[k]} in the frame; cast it (e.g. pl.col({k!r}).cast(...)).")
    for c in layout.mirror:
        if c not in existing:
            con.execute(f"ALTER TABLE {q(layout.table)} ADD COLUMN {q(c)} {incoming[c]}")
    for suffix, sqltype in STEP_COLUMNS.items():
        name = layout.step + suffix
        if name not in existing:
            con.execute(f"ALTER TABLE {q(layout.table)} ADD COLUMN {q(name)} {sqltype}")
    known = one(con, f"SELECT count(*) FROM {STEPS_TABLE} WHERE table_name = ? AND step = ?",
                [layout.table, layout.step])[0]
    if not known:
        con.execute(f"INSERT INTO {STEPS_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [layout.table, layout.step, layout.key, now, model, prompt, system])


def _castable(src: str, dst: str) -> bool:
    numeric = re.compile(r"^(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?)$")
    return bool(numeric.match(src) and numeric.match(dst))


def upsert(con: duckdb.DuckDBPyConnection, layout: Layout) -> None:
    """Insert the frame's new keys as NOT_STARTED; refresh copied columns that changed."""
    t, cols = q(layout.table), [*layout.key, *layout.mirror]
    col_list = ", ".join(q(c) for c in cols)
    using = ", ".join(q(k) for k in layout.key)
    con.execute(f"INSERT INTO {t} ({col_list}) SELECT {col_list} FROM {INCOMING} "
                f"ANTI JOIN {t} USING ({using})")
    if layout.mirror:
        sets = ", ".join(f"{q(c)} = i.{q(c)}" for c in layout.mirror)
        changed = " OR ".join(f"t.{q(c)} IS DISTINCT FROM i.{q(c)}" for c in layout.mirror)
        con.execute(f"UPDATE {t} AS t SET {sets} FROM {INCOMING} AS i WHERE {layout.key_join} AND ({changed})")


# -- claims and selection --------------------------------------------------------------------------

def prior_status(layout: Layout) -> str:
    """The status a RUNNING row had before it was claimed, read from columns a claim never touches."""
    e, f, a = layout.col("_error"), layout.col("_finished_at"), layout.col("_attempts")
    return (f"CASE WHEN {e} IS NOT NULL THEN (CASE WHEN {a} >= $max_attempts THEN 'NEEDS_REVIEW' "
            f"ELSE 'FAILED' END) WHEN {f} IS NOT NULL THEN 'DONE' ELSE 'NOT_STARTED' END")


def _give_back(con: duckdb.DuckDBPyConnection, layout: Layout, condition: str, params: dict[str, Any]) -> int:
    """Return RUNNING rows matching `condition` to the status they had before their claim."""
    s, r, c = layout.col("_status"), layout.col("_running_started_at"), layout.col("_claimed_by")
    rows = con.execute(
        f"UPDATE {q(layout.table)} SET {s} = {prior_status(layout)}, {r} = NULL, {c} = NULL "
        f"WHERE {s} = 'RUNNING' AND ({condition}) RETURNING 1", params).fetchall()
    return len(rows)


def recover_claims(con: duckdb.DuckDBPyConnection, layout: Layout, *, max_attempts: int,
                   stale_before: datetime, is_abandoned: Callable[[str], bool]) -> int:
    """Give back claims whose holder is gone (this host) or that are older than `stale_before`."""
    s, c, r = layout.col("_status"), layout.col("_claimed_by"), layout.col("_running_started_at")
    holders = [row[0] for row in con.execute(
        f"SELECT DISTINCT {c} FROM {q(layout.table)} WHERE {s} = 'RUNNING'").fetchall()]
    if not holders:
        return 0
    dead = [h for h in holders if h is None or is_abandoned(h)]
    return _give_back(con, layout, f"{c} IS NULL OR list_contains($dead, {c}) OR {r} < $stale_before",
                      {"dead": dead, "stale_before": stale_before, "max_attempts": max_attempts})


def eligible(layout: Layout, alias: str = "t") -> str:
    """SQL predicate: the row may be claimed by this run now."""
    s, a, f, fp = (f"{alias}.{layout.col(x)}" for x in ("_status", "_attempts", "_finished_at", "_fingerprint"))
    return (f"({s} = 'NOT_STARTED' OR ({s} = 'FAILED' AND {a} < $max_attempts) "
            f"OR ($redo = 'all' AND {s} IN ('DONE', 'FAILED', 'NEEDS_REVIEW') "
            f"AND ({f} IS NULL OR {f} < $run_started)) "
            f"OR ($redo = 'stale' AND {s} = 'DONE' AND {fp} IS DISTINCT FROM i.{FINGERPRINT_COL}))")


def select_work(con: duckdb.DuckDBPyConnection, layout: Layout, *, where: str | None,
                params: dict[str, Any]) -> tuple[pl.DataFrame, dict[str, int]]:
    """The frame's rows this run should send, and counts of those it leaves alone."""
    t = q(layout.table)
    using = ", ".join(q(k) for k in layout.key)
    keys = ", ".join(f"i.{q(k)}" for k in layout.key)
    narrow = ""
    if where:
        narrow = f"SEMI JOIN (SELECT {using} FROM {t} WHERE ({where})) AS w USING ({using})"
        columns = list(column_types(con, layout.table))
        try:
            one(con, f"SELECT count(*) FROM {t} WHERE ({where})")
        except duckdb.Error as exc:
            raise WhereClauseError(f"where={where!r} does not work on table {layout.table!r}: "
                                   f"{str(exc).splitlines()[0]}. It is SQL over the fact table's columns: "
                                   f"{columns}") from None
    s, fp = layout.col("_status"), layout.col("_fingerprint")
    joined = f"FROM {INCOMING} AS i JOIN {t} AS t ON {layout.key_join}"
    work = con.sql(
        f"SELECT {keys}, i.{PROMPT_COL}, i.{FINGERPRINT_COL}, t.{s} AS prior "
        f"FROM (SELECT * FROM {INCOMING} AS i {narrow}) AS i JOIN {t} AS t ON {layout.key_join} "
        f"WHERE {eligible(layout)}", params=params).pl()
    counts_row = one(con,
        f"SELECT count(*) FILTER (WHERE t.{s} = 'DONE' AND t.{fp} IS DISTINCT FROM i.{FINGERPRINT_COL}), "
        f"count(*) FILTER (WHERE t.{s} = 'RUNNING'), count(*) FILTER (WHERE t.{s} = 'NEEDS_REVIEW') "
        f"{joined}")
    stale, running, review = (int(x) for x in counts_row)
    return work, {"stale": stale, "running_elsewhere": running, "needs_review": review}


def known_answers(con: duckdb.DuckDBPyConnection, layout: Layout, work: pl.DataFrame) -> pl.DataFrame:
    """One stored DONE answer per fingerprint that `work` asks for: identical requests need no new call."""
    con.register("llmledger_wanted", work.select(FINGERPRINT_COL).unique())
    try:
        fp = layout.col("_fingerprint")
        return con.sql(
            f"SELECT t.{fp} AS fingerprint, any_value(t.{layout.col('')}) AS output, "
            f"any_value(t.{layout.col('_stop_reason')}) AS stop_reason, any_value(t.{layout.col('_model')}) AS model "
            f"FROM {q(layout.table)} AS t SEMI JOIN llmledger_wanted AS w ON t.{fp} = w.{FINGERPRINT_COL} "
            f"WHERE t.{layout.col('_status')} = 'DONE' GROUP BY t.{fp}").pl()
    finally:
        con.unregister("llmledger_wanted")


def claim(con: duckdb.DuckDBPyConnection, layout: Layout, batch: pl.DataFrame, *, claimant: str,
          now: datetime, params: dict[str, Any]) -> pl.DataFrame:
    """Mark the still-eligible rows of `batch` RUNNING for us; return them with their attempts."""
    con.register("llmledger_batch", batch)
    try:
        s, r, c = layout.col("_status"), layout.col("_running_started_at"), layout.col("_claimed_by")
        got = con.sql(
            f"UPDATE {q(layout.table)} AS t SET {s} = 'RUNNING', {r} = $now, {c} = $claimant "
            f"FROM llmledger_batch AS i WHERE {layout.key_join} AND {eligible(layout)} "
            f"RETURNING {layout.key_select}, t.{layout.col('_attempts')} AS attempts, "
            f"t.{layout.col('_finished_at')} IS NOT NULL AND t.{layout.col('_error')} IS NULL AS was_done",
            params={**params, "now": now, "claimant": claimant}).pl()
    finally:
        con.unregister("llmledger_batch")
    got = got.cast({k: batch.schema[k] for k in layout.key})
    return batch.join(got, on=layout.key, how="inner", maintain_order="left")


RESULT_SCHEMA = {
    "status": pl.String, "output": pl.String, "attempts": pl.Int32, "error": pl.String,
    "input_tokens": pl.Int64, "output_tokens": pl.Int64, "cost_usd": pl.Float64, "stop_reason": pl.String,
    "model": pl.String, "fingerprint": pl.String, "finished_at": pl.Datetime("us"),
}


def commit_results(con: duckdb.DuckDBPyConnection, layout: Layout, results: pl.DataFrame, *,
                   now: datetime, only_unfinished: bool = False) -> None:
    """Write outputs and statuses of one chunk; archive outputs that a redo replaces.

    `only_unfinished` (for journals of crashed runs) leaves rows that are
    DONE or NEEDS_REVIEW by now untouched, so an old answer never overwrites a newer one.
    """
    con.register("llmledger_results", results)
    try:
        t = q(layout.table)
        out = layout.col("")
        guard = f" AND t.{layout.col('_status')} IN ('RUNNING', 'NOT_STARTED', 'FAILED')" if only_unfinished else ""
        con.execute(
            f"INSERT INTO {HISTORY_TABLE} SELECT $table, $step, {layout.key_json()}, t.{out}, "
            f"t.{layout.col('_model')}, t.{layout.col('_fingerprint')}, t.{layout.col('_input_tokens')}, "
            f"t.{layout.col('_output_tokens')}, t.{layout.col('_cost_usd')}, t.{layout.col('_finished_at')}, "
            f"$now FROM {t} AS t JOIN llmledger_results AS i ON {layout.key_join} "
            f"WHERE i.status = 'DONE' AND t.{out} IS NOT NULL{guard}",
            {"table": layout.table, "step": layout.step, "now": now})
        done = "i.status = 'DONE'"
        sets = {
            "": f"CASE WHEN {done} THEN i.output ELSE t.{out} END",
            "_status": "i.status",
            "_running_started_at": "NULL",
            "_claimed_by": "NULL",
            "_attempts": "i.attempts",
            "_error": "i.error",
            "_finished_at": "i.finished_at",
            "_input_tokens": f"CASE WHEN {done} THEN i.input_tokens ELSE t.{layout.col('_input_tokens')} END",
            "_output_tokens": f"CASE WHEN {done} THEN i.output_tokens ELSE t.{layout.col('_output_tokens')} END",
            "_cost_usd": f"CASE WHEN {done} THEN i.cost_usd ELSE t.{layout.col('_cost_usd')} END",
            "_stop_reason": "i.stop_reason",
            "_model": "i.model",
            "_fingerprint": f"CASE WHEN {done} THEN i.fingerprint ELSE t.{layout.col('_fingerprint')} END",
        }
        assignments = ", ".join(f"{layout.col(k)} = {v}" for k, v in sets.items())
        con.execute(f"UPDATE {t} AS t SET {assignments} FROM llmledger_results AS i WHERE {layout.key_join}{guard}")
    finally:
        con.unregister("llmledger_results")


def release_claims(con: duckdb.DuckDBPyConnection, layout: Layout, *, claimant: str, max_attempts: int) -> int:
    return _give_back(con, layout, f"{layout.col('_claimed_by')} = $claimant",
                      {"claimant": claimant, "max_attempts": max_attempts})


def read_outputs(con: duckdb.DuckDBPyConnection, layout: Layout, keys: pl.DataFrame) -> pl.DataFrame:
    """The step's output and status for `keys`, in the order of `keys`."""
    con.register("llmledger_keys", keys)
    try:
        return con.sql(
            f"SELECT {', '.join(f'i.{q(k)}' for k in layout.key)}, t.{layout.col('')} AS {q(layout.step)}, "
            f"t.{layout.col('_status')} AS {q(layout.step + '_status')} "
            f"FROM llmledger_keys AS i JOIN {q(layout.table)} AS t ON {layout.key_join}").pl()
    finally:
        con.unregister("llmledger_keys")


def record_run(con: duckdb.DuckDBPyConnection, row: dict[str, Any]) -> None:
    _ensure_meta(con)
    names = list(row)
    con.execute(f"INSERT INTO {RUNS_TABLE} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                list(row.values()))


def status_counts(con: duckdb.DuckDBPyConnection, table: str | None = None) -> pl.DataFrame:
    """Rows per status, for every (table, step) in the store."""
    frames = []
    for tbl, step in list_steps(con, table):
        if not table_exists(con, tbl):
            continue
        s = q(step + "_status")
        frames.append(con.sql(
            f"SELECT '{tbl}' AS \"table\", '{step}' AS step, "
            + ", ".join(f"count(*) FILTER (WHERE {s} = '{st}')::BIGINT AS {st}" for st in STATUSES)
            + f", count(*)::BIGINT AS total FROM {q(tbl)}").pl())
    if not frames:
        return pl.DataFrame(schema={"table": pl.String, "step": pl.String,
                                    **{st: pl.Int64 for st in STATUSES}, "total": pl.Int64})
    return pl.concat(frames)


def failures(con: duckdb.DuckDBPyConnection, table: str, step: str, key: Sequence[str],
             limit: int = 5) -> list[tuple[str, str, str]]:
    """(row key as JSON, status, error) of the first FAILED / NEEDS_REVIEW rows."""
    s, e = q(step + "_status"), q(step + "_error")
    parts = ", ".join(f"{q(k)} := {q(k)}" for k in key)
    return [(r[0], r[1], r[2]) for r in con.execute(
        f"SELECT to_json(struct_pack({parts}))::VARCHAR, {s}, {e} FROM {q(table)} "
        f"WHERE {s} IN ('FAILED', 'NEEDS_REVIEW') ORDER BY {s}, {e} LIMIT {int(limit)}").fetchall()]
