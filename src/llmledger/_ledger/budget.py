"""A step's budget is one budget: every run of the step reserves in the ledger what it is about to spend.

`max_cost_usd` with `budget_scope="step"` used to be checked by each run against what the ledger held when
it started, so two runs of one step spent twice the budget (N workers, N times). Now a run holds a row in
`llmledger_budget_reservations`: dollars it has paid or is paying for that are not in the fact table yet
(answers in flight at the step's average, answers billed but not committed). Before it starts requests
it reserves, in one short transaction, against what the step has spent (the fact table, the history,
unused batch answers) plus every other live run's reservation; a commit moves an answer's cost from the
run's reservation into the fact table in the same transaction, so no other run ever sees it twice or not
at all; the run's end deletes its row. A row whose holder is gone (a dead process on this host; on
another host, not touched for `stale_after` by the database's clock) is ignored and deleted.

Reserving is serialised per step: a PostgreSQL advisory lock on the step, and on DuckDB (one writing
process per file) a lock in this process, because two transactions of one process could both read the
same room under MVCC and both take it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from llmledger._ledger.again import write_again
from llmledger._ledger.batches import OPEN_STATES
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import column_types, lock_step, one, table_exists
from llmledger._ledger.liveness import is_abandoned, is_alive_here
from llmledger._ledger.schema import BATCHES_TABLE, HISTORY_TABLE
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import BudgetLook, Chunk
from llmledger._ledger.verbs import clock
from llmledger._step.sqltext import q

RESERVATIONS_TABLE = "llmledger_budget_reservations"
ONLINE_SAMPLE = 10  # answers online before their average time stands for the step's
_PG_LOCK_CLASS = 0x6C6C6D62  # "llmb": advisory locks on a step's budget (the second key is the step's crc32)
_duckdb_lock = threading.Lock()


def _spent_sql(table: str, step: str, with_batches: bool) -> str:
    """The step's spending as one scalar query (the `spent` verb's sums, read in the same snapshot)."""
    unused = (
        (
            f" + (SELECT coalesce(sum(unused_cost_usd), 0) FROM {BATCHES_TABLE} WHERE table_name = $table "
            "AND step = $step)"
        )
        if with_batches
        else ""
    )
    return (
        f"(SELECT coalesce(sum({q(step + '_cost_usd')}), 0) FROM {q(table)}) + "
        f"(SELECT coalesce(sum(cost_usd), 0) FROM {HISTORY_TABLE} WHERE table_name = $table AND step = $step)" + unused
    )


def reserve(
    con: Any,
    table: str,
    step: str,
    *,
    claimant: str,
    need_usd: float,
    want_usd: float,
    budget_usd: float,
    now: datetime,
    stale_after: timedelta,
) -> BudgetLook:
    """Reserve for `claimant` at least `need_usd` and up to `want_usd`, within `budget_usd`; if even
    `need_usd` does not fit, leave its reservation as it is (it covers what it has in flight).

    Reservations are written and judged in the clock claims are (`verbs.clock`: PostgreSQL's own), so a worker
    whose clock is off neither drops a live run's reservation nor has its own dropped."""
    params = {"table": table, "step": step}
    with_batches = table_exists(con, BATCHES_TABLE)
    rows = con.execute(
        f"SELECT NULL, CAST({_spent_sql(table, step, with_batches)} AS DOUBLE), NULL "
        f"UNION ALL SELECT claimant, reserved_usd, coalesce(reserved_at < {clock(con)} - $stale_after, "
        f"false) FROM {RESERVATIONS_TABLE} WHERE table_name = $table AND step = $step",
        {**params, "now": now, "stale_after": stale_after},
    ).fetchall()
    spent = float(next(r[1] for r in rows if r[0] is None) or 0.0)
    others, held, gone = 0.0, 0.0, []
    for holder, reserved, old in rows:
        if holder is None:
            continue
        if holder == claimant:
            held = float(reserved or 0.0)
        elif is_abandoned(holder) or (not is_alive_here(holder) and old):
            gone.append(holder)
        else:
            others += float(reserved or 0.0)
    for holder in gone:
        con.execute(
            f"DELETE FROM {RESERVATIONS_TABLE} WHERE table_name = $table AND step = $step AND claimant = $claimant",
            {**params, "claimant": holder},
        )
    room = budget_usd - spent - others
    fits = need_usd <= room
    if fits:
        held = max(need_usd, min(want_usd, room))
        con.execute(
            f"DELETE FROM {RESERVATIONS_TABLE} WHERE table_name = $table AND step = $step AND claimant = $claimant",
            {**params, "claimant": claimant},
        )
        con.execute(
            f"INSERT INTO {RESERVATIONS_TABLE} VALUES ($table, $step, $claimant, $held, {clock(con)})",
            {**params, "claimant": claimant, "held": held, "now": now},
        )
    return BudgetLook(spent, others, held, fits)


def settle(con: Any, table: str, step: str, *, claimant: str, committed_usd: float, now: datetime) -> None:
    """In a commit's transaction: the committed answers' cost is in the fact table now, not reserved."""
    con.execute(
        f"UPDATE {RESERVATIONS_TABLE} SET reserved_usd = greatest(reserved_usd - $cost, 0), reserved_at = "
        f"{clock(con)} "
        "WHERE table_name = $table AND step = $step AND claimant = $claimant",
        {"table": table, "step": step, "claimant": claimant, "cost": committed_usd, "now": now},
    )


def drop(con: Any, claimant: str) -> None:
    """A run's end: what it reserved is committed or was never spent."""
    if table_exists(con, RESERVATIONS_TABLE):
        con.execute(f"DELETE FROM {RESERVATIONS_TABLE} WHERE claimant = ?", [claimant])


def touch(con: Any, claimant: str, now: datetime) -> None:
    """A heartbeat: the run holding these reservations is alive."""
    if table_exists(con, RESERVATIONS_TABLE):
        con.execute(
            f"UPDATE {RESERVATIONS_TABLE} SET reserved_at = {clock(con)} WHERE claimant = $claimant",
            {"now": now, "claimant": claimant},
        )


def average_paid_in(con: Con, table: str, step: str) -> float:
    """The step's average paid answer (what sending a DONE row again would cost), 0.0 when unknown: read in the
    prepare's transaction, as every open of a DuckDB file costs 15-30 ms."""
    cost, status = q(step + "_cost_usd"), q(step + "_status")
    value = one(con, f"SELECT avg({cost}) FROM {q(table)} WHERE {status} = 'DONE' AND {cost} > 0")[0]
    return float(value) if value is not None else 0.0


class BudgetVerbs:
    """The budget verbs of a ledger (mixed into SQLLedger)."""

    conn: Database

    def spent(self, table: str, step: str) -> float:
        """Dollars paid for the step's answers: those in the table, those replaced since (the history), and
        batch answers to rows taken out of their batch (reset) before it ended."""
        with self.conn.open(wait=60.0) as con:
            sql = _spent_sql(table, step, table_exists(con, BATCHES_TABLE))
            return float(one(con, f"SELECT CAST({sql} AS DOUBLE)", {"table": table, "step": step})[0] or 0.0)

    def online_seconds(self, table: str, step: str) -> float | None:
        """How long the step's answers took online, on average, in seconds (the API's time, retries apart); None
        before it has ONLINE_SAMPLE of them (a deadline then reckons with a generous default)."""
        latency, status, batch = (q(step + s) for s in ("_latency_ms", "_status", "_batch_id"))
        with self.conn.open(wait=30.0, read_only=True) as con:
            if step + "_latency_ms" not in column_types(con, table):
                return None
            count, mean = one(
                con,
                f"SELECT count({latency}), avg({latency}) FROM {q(table)} "
                f"WHERE {status} = 'DONE' AND {batch} IS NULL AND {latency} IS NOT NULL",
            )
        return float(mean) / 1000 if count >= ONLINE_SAMPLE and mean is not None else None

    def hasten_batches(self, table: str, step: str, deadline: datetime) -> None:
        """Give the step's open batches `deadline` (naive UTC) where theirs is later or none: a later call's tighter
        deadline binds the rows already in batches. A looser one never pushes theirs back (a script polling with
        `deadline="2h"` would otherwise never reach it)."""

        def work(con: Con) -> None:
            con.execute(
                f"UPDATE {BATCHES_TABLE} SET deadline = ? WHERE table_name = ? AND step = ? AND state IN {OPEN_STATES} "
                "AND coalesce(deadline > ?, true)",
                [deadline, table, step, deadline],
            )

        self.conn.transaction(work, wait=60.0)

    def reserve_budget(
        self,
        table: str,
        step: str,
        *,
        claimant: str,
        need_usd: float,
        want_usd: float,
        budget_usd: float,
        now: datetime,
        stale_after: timedelta,
        again: tuple[Layout, list[Chunk]] | None = None,
    ) -> BudgetLook:
        """One short transaction: see what the step has spent and others reserved; reserve what fits. `again`
        (the step's layout, the run's chunks not seen to land): written again first where the store lost their
        commit (`again.write_again`), or their cost would be neither spent nor reserved, and the run would go
        over."""

        def work(con: Con) -> BudgetLook:
            lock_step(con, _PG_LOCK_CLASS, table, step)
            if again is not None:
                write_again(con, again[0], claimant, again[1], now=now)
            return reserve(
                con,
                table,
                step,
                claimant=claimant,
                need_usd=need_usd,
                want_usd=want_usd,
                budget_usd=budget_usd,
                now=now,
                stale_after=stale_after,
            )

        if self.conn.dialect.advisory_locks:  # `lock_step` makes the runs take turns
            return self.conn.transaction(work, wait=60.0)
        with _duckdb_lock:  # no advisory locks: the threads of this process take turns (other processes
            return self.conn.transaction(work, wait=60.0)  # cannot write the file meanwhile)
