"""The verbs of the `Ledger` interface, on an embedded DuckDB file or a PostgreSQL database.

Every verb is one transaction (`engine/duckdb.py` for DuckDB, `engine/postgres.py` for
PostgreSQL): a row's output and its status land together. A DuckDB file is
opened only for that transaction, so it is free for the duckdb CLI or another
notebook between claims and commits; PostgreSQL lets many processes claim and
commit side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import polars as pl

from llmledger._ledger.again import LOSES_COMMITS, READS, read_back, write_again
from llmledger._ledger.batches import BatchVerbs
from llmledger._ledger.budget import BudgetVerbs, drop, settle, touch
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import lock_step
from llmledger._ledger.looks import LookVerbs
from llmledger._ledger.packs import record_packs
from llmledger._ledger.review import ReviewVerbs
from llmledger._ledger.run_rows import raise_run, write_run
from llmledger._ledger.selection import SelectionVerbs
from llmledger._ledger.survey import Layout, survey
from llmledger._ledger.types import Chunk, RunParams, Selection
from llmledger._ledger.verbs import (
    CLAIM_LOCK,
    claim_open,
    claim_rows,
    claim_twins,
    clock,
    commit_results,
    give_back,
    named_outputs,
    recover_claims,
)
from llmledger._step.sqltext import q
from llmledger._time import utcnow
from llmledger.errors import StoreError


class SQLLedger(SelectionVerbs, BatchVerbs, BudgetVerbs, LookVerbs, ReviewVerbs):
    """A ledger in one DuckDB file (`Connection`) or one PostgreSQL database (`PgConnection`).

    `path` is the DuckDB file, or for PostgreSQL where this machine journals answers before they commit.
    """

    def __init__(self, conn: Database) -> None:
        self.conn = conn
        self.path = conn.path

    @property
    def on_wait(self) -> Callable[[str], None] | None:
        return self.conn.on_wait

    @on_wait.setter
    def on_wait(self, value: Callable[[str], None] | None) -> None:
        self.conn.on_wait = value

    # -- a run's transactions ----------------------------------------------------------------------------
    def claim(
        self, selection: Selection, n: int, *, claimant: str, now: datetime, again: list[Chunk] | None = None
    ) -> list[dict[str, Any]]:
        """Mark up to `n` rows of the selection RUNNING; return them with their stored requests. `again`: the run's
        chunks not seen to land, written again first where the store lost them, and left holding only those it
        wrote (`write_again`): a chunk seen to land goes before any of its rows can be claimed again."""
        start = selection.cursor
        claimed: list[dict[str, Any]] = []
        end = [start]
        unlanded: list[Chunk] = []

        def work(con: Con) -> None:
            claimed.clear()
            lock_step(con, CLAIM_LOCK, selection.layout.table, selection.layout.step)
            unlanded[:] = write_again(con, selection.layout, claimant, again or [], now=now)
            if selection.open_ended:
                got = claim_open(con, selection, n, claimant=claimant, now=now)
                twins = self._twins(con, selection, got, claimant=claimant, now=now)
                claimed.extend(pl.concat([got, twins]).iter_rows(named=True))
                end[0] = start + len(claimed) if got.height == n else max(selection.pending, start + len(claimed))
                return
            cursor = start
            while len(claimed) < n and cursor < selection.work.height:
                batch = selection.work.slice(cursor, n - len(claimed))
                got = claim_rows(con, selection, batch, claimant=claimant, now=now)
                claimed.extend(got.iter_rows(named=True))
                cursor += batch.height
                twins = self._twins(con, selection, got, claimant=claimant, now=now)
                claimed.extend(twins.iter_rows(named=True))
            end[0] = cursor

        self.conn.transaction(work)
        selection.cursor = end[0]
        if claimed and self.conn.dialect.loses_commits:
            claimed = self._read_back(selection, claimed, claimant=claimant, now=now, unlanded=unlanded)
        if again is not None:
            again[:] = unlanded
        return claimed

    def _read_back(
        self,
        selection: Selection,
        claimed: list[dict[str, Any]],
        *,
        claimant: str,
        now: datetime,
        unlanded: list[Chunk],
    ) -> list[dict[str, Any]]:
        """The claimed rows the store holds as this run's claims, read back in a transaction of their own: a claim
        the store lost (`Dialect.loses_commits`) left its rows free, and a row another run claimed meanwhile is
        that run's to pay. Rows left free are claimed again in that transaction and read back in the next, up to
        `READS` reads; a claim still not seen then stops the run with a `StoreError` (a store that loses three
        claims of a row in a row keeps nothing: giving its rows to later claims had the run claim forever; dropping
        them left them unanswered under a "completed" run). Each transaction writes the run's unlanded chunks again
        first, as the claim did (`write_again`)."""
        key = selection.layout.key
        schema = {k: selection.key_types[k] for k in key}
        sent: list[dict[str, Any]] = []
        pending = claimed
        for read in range(1, READS + 1):
            places = pl.DataFrame([[r[k] for k in key] for r in pending], schema=schema, orient="row")

            def work(con: Con, places: pl.DataFrame = places, last: bool = read == READS) -> tuple[list[int], Any]:
                unlanded[:] = write_again(con, selection.layout, claimant, unlanded, now=now)
                held = read_back(con, selection, places, claimant=claimant)
                lost = places.filter(~pl.int_range(pl.len()).is_in(held))
                if last or not lost.height:
                    return held, lost
                return held, claim_rows(con, selection, lost, claimant=claimant, now=now)

            held, after = self.conn.transaction(work)
            sent += [pending[at] for at in sorted(held)]
            if read == READS and after.height:  # `after`: the keys of the rows never seen held
                raise StoreError(
                    f"the store {self.conn.path} did not keep this run's claim of {after.height:,} rows ({READS} "
                    f"tries): they were not sent; run again, and the answers already paid for are kept. {LOSES_COMMITS}"
                )
            pending = list(after.iter_rows(named=True))
            if not pending:
                break
        return sent

    @staticmethod
    def _twins(con: Con, selection: Selection, got: pl.DataFrame, *, claimant: str, now: datetime) -> pl.DataFrame:
        """`claim_twins` when the run shares one call among identical requests (`dedupe`), else nothing."""
        if not selection.dedupe:
            return got.clear()
        return claim_twins(con, selection, got, claimant=claimant, now=now)

    def commit(
        self,
        selection: Selection,
        results: pl.DataFrame,
        *,
        now: datetime,
        wait: float | None = None,
        settled: tuple[str, float] | None = None,
        run: tuple[str, dict[str, Any]] | None = None,
        packs: list[dict[str, Any]] | None = None,
        again: tuple[str, list[Chunk]] | None = None,
    ) -> list[Chunk]:
        """One chunk of results. `settled` (claimant, dollars): those answers' cost leaves the claimant's budget
        reservation in the same transaction, as it enters the fact table. `run` (run id, figures): the run's row
        in llmledger_runs takes its figures so far with them, so a run killed later still shows what it paid.
        `packs`: the requests that carried rows together, whose answers these are (`packs.PACK_SCHEMA`).
        `again` (claimant, chunks): chunks committed before and not seen to land, written again where their rows
        are still as that claimant claimed them; returns those it wrote again (`again.write_again`)."""
        layout = selection.layout

        def work(con: Con) -> list[Chunk]:
            written = write_again(con, layout, *again, now=now) if again is not None else []
            commit_results(con, layout, results, now=now)
            record_packs(con, packs or [])
            if settled is not None:
                settle(con, layout.table, layout.step, claimant=settled[0], committed_usd=settled[1], now=now)
            if run is not None:
                raise_run(con, run[0], layout.table, layout.step, run[1])
            return written

        return self.conn.transaction(work, wait=wait)

    def release(self, selection: Selection, *, claimant: str, again: list[Chunk] | None = None) -> int:
        """Give back the run's unfinished claims, and drop its budget reservation (its answers are committed).
        `again`: the run's chunks not seen to land, written again first where the store lost them (`write_again`)."""
        layout = selection.layout

        def work(con: Con) -> int:
            write_again(con, layout, claimant, again or [], now=utcnow())
            drop(con, claimant)
            return give_back(
                con,
                layout,
                f"{layout.col('_claimed_by')} = $claimant AND {layout.col('_custom_id')} IS NULL",
                {"claimant": claimant, "max_attempts": selection.params["max_attempts"]},
            ).height

        return self.conn.transaction(work, wait=30.0, idempotent=True)  # each chunk looks before it writes

    def renew(self, selection: Selection, *, claimant: str, now: datetime) -> int:
        """Mark the claims this run still holds as alive now (so no other run takes them back by age)."""
        layout = selection.layout

        def work(con: Con) -> int:
            touch(con, claimant, now)  # and its budget reservation
            return len(
                con.execute(
                    f"UPDATE {q(layout.table)} SET {layout.col('_running_started_at')} = {clock(con)}, "
                    f"{layout.col('_lease_until')} = {clock(con)} + $lease WHERE "
                    f"{layout.col('_claimed_by')} = $claimant AND {layout.col('_status')} = 'RUNNING' RETURNING 1",
                    {"now": now, "claimant": claimant, "lease": selection.lease},
                ).fetchall()
            )

        return self.conn.transaction(work, wait=30.0, idempotent=True)

    def recover(self, table: str, step: str, params: RunParams) -> int:
        """Give back claims of runs that died on this host, and claims older than `params.stale_before`."""
        layout = Layout(table, step, [], [])
        return self.conn.transaction(lambda con: recover_claims(con, layout, params), wait=30.0, idempotent=True)

    def outputs(self, selection: Selection, frame: pl.DataFrame) -> pl.DataFrame:
        """`{step}`, `{step}_status` and `{step}_stale` for the frame's keys, in frame order, and `_kept`: the
        answer is one a person accepted or wrote (kept by every redo; the run's report counts those stale), and
        `_kept_flagged`: such an answer is flagged (redo='flagged' keeps it; the report says so)."""
        found = self.conn.transaction(
            lambda con: survey(
                con,
                selection.layout,
                frame,
                fields=("status", "output", "stale", "kept", "kept_flagged"),
                params={},
                compare=False,
            ),
            wait=30.0,
        )
        return named_outputs(found, selection.layout.step)

    def record_run(self, row: dict[str, Any]) -> None:
        """Write the run's row, replacing the one it wrote when it started (same run_id and step)."""

        self.conn.transaction(lambda con: write_run(con, row), wait=30.0, idempotent=True)
