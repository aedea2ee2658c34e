"""The verbs people use on a ledger: what they look at (counts, the overview, history, SQL) and what they do to
rows (flag, reset). Mixed into `SQLLedger` like the batch and budget verbs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import polars as pl

from llmledger._ledger.compare import ComparisonData, read_comparison
from llmledger._ledger.counts import status_counts
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import table_exists, writes_refused
from llmledger._ledger.graph import StepGraph
from llmledger._ledger.history import side_by_side
from llmledger._ledger.overview import read_overview
from llmledger._ledger.schema import LATEST, list_steps, migrate, migrate_for_readers, schema_version
from llmledger._ledger.survey import Layout, check_where
from llmledger._ledger.types import Overview
from llmledger._ledger.verbs import gone_holders, start_over
from llmledger._step.request import sql_literal
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError, WhereClauseError

T = TypeVar("T")


class _Older(Exception):
    """The store is older than this llmledger: migrated before it is read (`LookVerbs._read`)."""


class LookVerbs:
    """What people look at and do (mixed into SQLLedger)."""

    conn: Database

    # -- what people look at -----------------------------------------------------------------------------
    # Readers open a DuckDB file read-only, so a store on a read-only medium or another user's can be read.
    def counts(self, table: str | None = None) -> pl.DataFrame:
        with self.conn.open(wait=60.0, read_only=True) as con:
            return status_counts(con, table)

    def compare(self, table: str, steps: list[str], where: str | None = None) -> ComparisonData:
        """Several steps' answers to the same rows, compared (`compare.py`)."""
        dialect = self.conn.dialect

        def work(con: Con) -> ComparisonData:  # one snapshot, that writes nothing whatever `where` calls
            if dialect.read_only_transactions:
                con.execute("SET TRANSACTION READ ONLY")
            return read_comparison(con, table, steps, where)

        try:
            return self.conn.transaction(work, wait=60.0, read_only=True, commit=False)
        except Exception as exc:
            if where and writes_refused(exc):
                raise WhereClauseError(
                    f"where={where!r} would write to the store (compare only reads): pass a condition that reads"
                ) from None
            raise

    def downstream_stale(self, table: str, step: str) -> dict[str, int]:
        """Stale rows, now, in every step that reads `step` (directly or through other steps)."""
        with self.conn.open(wait=60.0, read_only=True) as con:
            graph = StepGraph.load(con, table)
            below, grew = {step}, True
            while grew:
                found = {s for s, ups in graph.upstream.items() if below & set(ups)} - below
                below, grew = below | found, bool(found)
            below.discard(step)
            if not below:
                return {}
            counts = status_counts(con, table)
        return {
            r["step"]: int(r["stale"] or 0) for r in counts.iter_rows(named=True) if r["step"] in below and r["stale"]
        }

    def overview(self, table: str | None = None) -> Overview:
        with self.conn.open(wait=60.0, read_only=True) as con:
            return read_overview(con, table)

    def history(self, table: str, step: str, key: Any = None) -> pl.DataFrame:
        return self._read(lambda con: side_by_side(con, self._layout(con, table, step), key))

    def row_and_history(
        self, table: str, step: str, sql: str, params: Any, key: Any
    ) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """What the review view shows of one row: `sql` (a read of it) and the row's earlier answers (None when
        the store has no such step), in one transaction. Each key a person presses writes a verdict and reads the
        next row; opening a DuckDB file costs tens of milliseconds, and this read opened it three times."""
        dialect = self.conn.dialect

        def work(con: Con) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
            found = dialect.user_query(con, sql, params, write=False)
            try:
                earlier = side_by_side(con, self._layout(con, table, step), key)
            except InvalidInputError:
                earlier = None
            return (None if found is None else found.pl()), earlier

        return self._read(work)

    def migrated(self) -> None:
        migrate_for_readers(self.conn)

    def _read(self, work: Callable[[Con], T]) -> T:
        """Run `work` in one read-only transaction. A current store, the usual case, is opened once; an older one
        is brought to the current schema first (`migrate_for_readers`, which writes), then read."""

        snapshot = self.conn.dialect.read_only_transactions  # PostgreSQL: else each statement sees the latest commits

        def current(con: Con) -> T:
            if snapshot:  # one snapshot for the whole read: a row and its history as they stood together
                con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if schema_version(con) < LATEST:
                raise _Older
            return work(con)

        try:
            return self.conn.transaction(current, wait=60.0, read_only=True)
        except _Older:
            self.migrated()
            return self.conn.transaction(current, wait=60.0, read_only=True)

    # -- what people do to rows (flags and other verdicts: review.py) --------------------------------------
    def reset(
        self, table: str, step: str, *, where: str, now: datetime, running_stale_after: timedelta | None = None
    ) -> int:
        """Put the step of rows matching `where` back to NOT_STARTED; their answers go to the history first.

        Rows in a Message Batch (SUBMITTED) are taken out of it: the batch's answers to them are then not
        merged (the escape for a batch the API has lost). With `running_stale_after`, RUNNING rows whose holder is
        gone (`gone_holders`) are taken too.
        """

        def work(con: Con) -> int:
            layout = self._layout(con, table, step)
            check_where(con, table, where)
            gone = gone_holders(con, layout, running_stale_after, now) if running_stale_after is not None else []
            matching = (
                f"coalesce(({where}), false) AND ({layout.col('_status')} <> 'RUNNING' "
                f"OR ({layout.col('_custom_id')} IS NULL AND {layout.col('_claimed_by')} IN "
                f"({', '.join(sql_literal(h) for h in gone) or 'NULL'})))"
            )
            return start_over(con, layout, matching, reason="'reset'", now=now)

        return self.conn.transaction(work, wait=60.0, exclusive=True)

    def _layout(self, con: Con, table: str, step: str) -> Layout:
        migrate(con, utcnow())
        found = [key for t, s, key in list_steps(con, table) if s == step]
        if not found or not table_exists(con, table):
            known = [f"{t}.{s}" for t, s, _ in list_steps(con)]
            raise InvalidInputError(f"the store has no step {step!r} on table {table!r}; it has: {known or 'no steps'}")
        return Layout(table, step, found[0], [])

    def query(self, sql: str, params: Any = None, *, wait: float = 60.0, write: bool = False) -> pl.DataFrame | None:
        """Run `sql`, read-only unless `write` (so a store that cannot be written can be queried, and a statement
        that would change the ledger behind its back is refused unless asked for)."""

        dialect = self.conn.dialect

        def run(con: Any) -> pl.DataFrame | None:
            relation = dialect.user_query(con, sql, params, write=write)
            return None if relation is None else relation.pl()

        try:
            if dialect.read_only_transactions:
                return self.conn.transaction(run, wait=wait)
            with self.conn.open(wait=wait, read_only=not write) as con:
                return run(con)
        except Exception as exc:
            if not write and (writes_refused(exc) or "multiple commands into a prepared statement" in str(exc)):
                raise InvalidInputError(
                    f"this statement writes (to the store or a file), or is more than one, and "
                    f"llmledger.sql only reads one unless told: pass write=True (the CLI: "
                    f"--write) to run it ({sql.strip()[:80]!r}). Changing the "
                    "ledger's own columns by hand can break its promises: prefer flag(), "
                    "reset() and apply_llm(redo=...)."
                ) from None
            raise

    def steps(self, table: str | None = None) -> list[tuple[str, str, list[str]]]:
        with self.conn.open(wait=60.0, read_only=True) as con:
            return list_steps(con, table)
