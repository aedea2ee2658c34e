"""The SQL behind a run's verbs, on either engine: claiming, committing, giving claims back, taking back the
claims of dead runs, merging journals.

Each function runs inside a transaction `ledger.SQLLedger` opened; none opens the store itself.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._ledger.columns import (
    ANSWERED,
    RESULT_SCHEMA,
    SIMULATOR,
    commit_assignments,
    lost_commit_sql,
    names,
    rejected_sql,
)
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.shared import column_types, one, registered
from llmledger._ledger.graph import StepGraph
from llmledger._ledger.history import SIMULATED, archive, redo_reason
from llmledger._ledger.journal import last_figures as last_journal_figures
from llmledger._ledger.journal import pack_records
from llmledger._ledger.journal import pending as pending_journals
from llmledger._ledger.journal import read as read_journal
from llmledger._ledger.liveness import Claimant, is_abandoned, is_alive_here
from llmledger._ledger.packs import record_packs
from llmledger._ledger.reuse import answers_to, upgrade_fingerprint
from llmledger._ledger.run_rows import raise_run
from llmledger._ledger.schema import (
    MIGRATIONS_TABLE,
    owned_columns,
    requests_by_version,
)
from llmledger._ledger.states import CLAIMABLE, prior_status_sql
from llmledger._ledger.survey import Layout, flag_sql
from llmledger._ledger.types import RunParams, Selection
from llmledger._step.request import RequestSpec, sql_literal
from llmledger._step.sqltext import q
from llmledger._time import utcnow

CLAIM_LOCK = 0x6C6C6D63  # "llmc": the PostgreSQL advisory lock that serialises a step's claims (`claim_twins`)
BATCH = "llmledger_batch"
WANTED = "llmledger_wanted"
RESULTS = "llmledger_results"


# -- the SQL of each verb --------------------------------------------------------------------------------


def claim_rows(con: Con, selection: Selection, batch: pl.DataFrame, *, claimant: str, now: datetime) -> pl.DataFrame:
    """Claim the rows of `batch` (keys) that may be claimed now.

    On PostgreSQL, where other processes claim at the same time, the rows are picked with
    `FOR UPDATE SKIP LOCKED`: a row another process is claiming this instant is left to it, not waited for.
    """
    layout = selection.layout
    flags = flag_sql(
        layout, selection.where, named=selection.named
    )  # its where= names rows: redo=True may replace a person's answers
    with registered(con, BATCH, batch):
        pick = f"{BATCH} AS i WHERE {layout.key_join('t', 'i')} AND {flags['current']} AND {flags['eligible']}"
        lock = dialect_of(con).row_lock
        if lock:  # take the rows from the table, skipping those another worker holds
            keys = ", ".join(f"t.{q(k)}" for k in layout.key)
            pick = (
                f"(SELECT {keys} FROM {q(layout.table)} AS t JOIN {pick.replace(' WHERE ', ' ON ', 1)} "
                f"{lock}) AS i WHERE {layout.key_join('t', 'i')}"
            )
        got = _claim(con, selection, pick, claimant=claimant, now=now)
    return batch.join(got, on=layout.key, how="inner", maintain_order="left")


def claim_open(con: Con, selection: Selection, n: int, *, claimant: str, now: datetime) -> pl.DataFrame:
    """PostgreSQL, open-ended: claim up to `n` of the step's current, eligible rows matching `where`, straight from
    the table (`FOR UPDATE SKIP LOCKED`). The status filter in front lets the status index find them."""
    layout = selection.layout
    flags = flag_sql(layout, selection.where, named=selection.named)
    keys = ", ".join(f"t.{q(k)}" for k in layout.key)
    statuses = ", ".join(f"'{s}'" for s in CLAIMABLE[selection.params["redo"]])
    got = _claim(
        con,
        selection,
        f"(SELECT {keys} FROM {q(layout.table)} AS t WHERE {layout.col('_status', 't')} "
        f"IN ({statuses}) AND {flags['current']} AND {flags['eligible']} AND "
        f"{flags['in_where']} LIMIT {int(n)} FOR UPDATE OF t SKIP LOCKED) AS i "
        f"WHERE {layout.key_join('t', 'i')}",
        claimant=claimant,
        now=now,
    )
    if selection.reuse and got.height:  # answers to identical requests, committed by anyone until now
        fresh = got.select(pl.col("fingerprint").alias("fp")).unique()
        selection.known.update(
            answers_to(con, layout, fresh.filter(~pl.col("fp").is_in(list(selection.known))), selection.source)
        )
    return got


def claim_twins(con: Con, selection: Selection, got: pl.DataFrame, *, claimant: str, now: datetime) -> pl.DataFrame:
    """Claim too every other row of the step this run may claim (current, eligible, matching `where`) whose
    request is identical to one of `got`'s, wherever it is in the table; return them.

    Rows with one request share one call within a run (the sender's dedupe). Claiming them together is what
    keeps two runs of a step from each paying for the same text: once one claim holds every twin, no other
    run can take one while the call is in flight, and after the commit they are DONE. Claims of a step are
    serialised (`CLAIM_LOCK` on PostgreSQL; DuckDB has one writing process), so two claims cannot each take
    half of a pair. On PostgreSQL the twins are found through the index on the request fingerprint.
    """
    if not got.height:
        return got
    layout = selection.layout
    flags = flag_sql(layout, selection.where, named=selection.named)
    keys = ", ".join(f"t.{q(k)}" for k in layout.key)
    lock = dialect_of(con).row_lock
    fps = got.select(pl.col("fingerprint").drop_nulls().unique().alias("fp"))
    if not fps.height:
        return got.clear()
    with registered(con, WANTED, fps):
        pick = (
            f"(SELECT {keys} FROM {q(layout.table)} AS t WHERE {layout.col('_request_fingerprint', 't')} IN "
            f"(SELECT CAST(w.fp AS UUID) FROM {WANTED} AS w) AND {flags['current']} AND {flags['eligible']} "
            f"AND {flags['in_where']}{lock}) AS i WHERE {layout.key_join('t', 'i')}"
        )
        return _claim(con, selection, pick, claimant=claimant, now=now)


def _claim(con: Con, selection: Selection, pick: str, *, claimant: str, now: datetime) -> pl.DataFrame:
    """Mark the rows `pick` selects (SQL: a FROM item `i` and its join to the fact table `t`) RUNNING for
    `claimant`, recording the status each had; return their keys, input columns and stored requests."""
    layout = selection.layout
    c = names(layout.step, "t")
    inputs = "".join(f"t.{q(col)} AS {q('input.' + col)}, " for col in selection.inputs)
    got: pl.DataFrame = con.sql(
        f"UPDATE {q(layout.table)} AS t SET {q(layout.step + '_status')} = 'RUNNING', "
        f"{q(layout.step + '_claimed_from')} = {c['_status']}, {q(layout.step + '_custom_id')} = NULL, "
        f"{q(layout.step + '_running_started_at')} = {clock(con)}, {q(layout.step + '_claimed_by')} = $claimant, "
        f"{q(layout.step + '_lease_until')} = {clock(con)} + $lease "
        f"FROM {pick} "
        f"RETURNING {', '.join('t.' + q(k) for k in layout.key)}, {inputs}{c['_prompt']} AS prompt, "
        f"{c['_request_fingerprint']}::VARCHAR AS fingerprint, {c['_version']} AS version, "
        f"{c['_attempts']} AS attempts, {c['_finished_at']} IS NOT NULL AND {c['_error']} IS NULL AS was_done",
        params={**selection.params, "now": now, "claimant": claimant, "lease": selection.lease},
    ).pl()
    return got.cast({k: selection.key_types[k] for k in layout.key})


def commit_results(
    con: Con,
    layout: Layout,
    results: pl.DataFrame,
    *,
    now: datetime,
    only_unfinished: bool = False,
    only_batch: str | None = None,
    only_claimed_by: str | None = None,
) -> None:
    """Write outputs and statuses of one chunk; archive the outputs that a redo replaces.

    `only_unfinished` (for journals of dead runs) leaves rows that are DONE or NEEDS_REVIEW by now
    untouched, so an old answer never overwrites a newer one. `only_batch` (a batch's results) writes
    only rows still SUBMITTED in that batch. `only_claimed_by` writes only rows that claimant still holds
    RUNNING: a chunk written again because its commit may have been lost (`Ledger.commit`'s `again`).
    """
    output_type = column_types(con, layout.table)[layout.step]
    with registered(con, RESULTS, results):
        c = names(layout.step, "t")
        guard = f" AND {c['_status']} IN ('RUNNING', 'NOT_STARTED', 'FAILED')" if only_unfinished else ""
        if only_batch is not None:
            guard += f" AND {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} = {sql_literal(only_batch)}"
        if only_claimed_by is not None:
            guard += f" AND {lost_commit_sql(layout.step, sql_literal(only_claimed_by))}"
        archive(
            con,
            layout,
            now=now,
            reason=redo_reason(layout),
            condition=f"({ANSWERED} OR {rejected_sql(layout.step)}){guard}",
            join=f"JOIN {RESULTS} AS i ON {layout.key_join()}",
            output_type=output_type,
        )
        con.execute(
            f"UPDATE {q(layout.table)} AS t SET {commit_assignments(layout.step, output_type)} "
            f"FROM {RESULTS} AS i WHERE {layout.key_join()}{guard}"
        )


def give_back(
    con: Con, layout: Layout, condition: str, params: dict[str, Any], *, status: str = "RUNNING"
) -> pl.DataFrame:
    """Return rows of `status` (RUNNING: claimed; SUBMITTED: in a batch) matching `condition` to the status they
    had before their claim, out of any batch intent (and, for SUBMITTED, out of their batch). Returns their keys."""
    c = names(layout.step)
    out_of_batch = f", {c['_batch_id']} = NULL" if status == "SUBMITTED" else ""
    keys = ", ".join(q(k) for k in layout.key) or "1 AS one"
    frame: pl.DataFrame = con.sql(
        f"UPDATE {q(layout.table)} SET {c['_status']} = {prior_status_sql(c)}, {c['_running_started_at']} = NULL, "
        f"{c['_claimed_by']} = NULL, {c['_claimed_from']} = NULL, {c['_custom_id']} = NULL{out_of_batch} "
        f"WHERE {c['_status']} = '{status}' AND ({condition}) RETURNING {keys}",
        params=params,
    ).pl()
    return frame


# What starting a row over clears: its answer and everything about it (the attempts go back to 0).
_ANSWER_SUFFIXES = (
    "",
    "_error",
    "_finished_at",
    "_input_tokens",
    "_output_tokens",
    "_cache_write_tokens",
    "_cache_read_tokens",
    "_latency_ms",
    "_cost_usd",
    "_stop_reason",
    "_model",
    "_source",
    "_fingerprint",
    "_raw",
    "_flag",
    "_flagged_at",
    "_flagged_by",
    "_batch_id",
    "_custom_id",
    "_claimed_from",
)


def start_over(con: Con, layout: Layout, condition: str, *, reason: str, now: datetime) -> int:
    """Put the step of rows matching `condition` back to NOT_STARTED, their answers copied to the history first
    with `reason` (SQL). Returns how many rows."""
    archive(con, layout, now=now, reason=reason, condition=condition)
    c = names(layout.step)
    sets = ", ".join(
        [f"{c['_status']} = 'NOT_STARTED'", f"{c['_attempts']} = 0", *(f"{c[s]} = NULL" for s in _ANSWER_SUFFIXES)]
    )
    return len(con.execute(f"UPDATE {q(layout.table)} AS t SET {sets} WHERE {condition} RETURNING 1").fetchall())


def set_aside_simulated(con: Con, layout: Layout, source: str | None, now: datetime) -> int:
    """For a run against a real endpoint: rows of the step whose answer the simulator made start over (their
    answers kept in the history as "simulated answer"), so they are asked for real and a simulated answer is
    never shown as a real one. A simulated run, or a caller that does not say (`source` None), leaves every
    answer alone. Returns how many rows."""
    if source is None or source == SIMULATOR:
        return 0
    c = names(layout.step, "t")
    return start_over(
        con,
        layout,
        f"{c['_source']} = '{SIMULATOR}' AND {c['_status']} IN ('DONE', 'NEEDS_REVIEW', 'FAILED')",
        reason=f"'{SIMULATED}'",
        now=now,
    )


def recover_claims(con: Con, layout: Layout, params: RunParams) -> int:
    """Give back claims whose holder is gone (this host) or that are older than `stale_before`.

    Rows claimed for a Message Batch (they have a custom id) are left to the batch's reconciliation:
    the API may have the batch, and giving them back would pay for them twice.
    """
    c = names(layout.step)
    holders = [
        row[0]
        for row in con.execute(
            f"SELECT DISTINCT {c['_claimed_by']} FROM {q(layout.table)} WHERE {c['_status']} = 'RUNNING'"
        ).fetchall()
    ]
    if not holders:
        return 0
    dead = [h for h in holders if h is None or is_abandoned(h)]
    alive = [h for h in holders if h is not None and is_alive_here(h)]
    return give_back(
        con,
        layout,
        f"{c['_custom_id']} IS NULL AND ({c['_claimed_by']} IS NULL "
        f"OR {c['_claimed_by']} IN (SELECT unnest(CAST($dead AS VARCHAR[]))) "
        f"OR ({lapsed_sql(con, c)} "
        f"AND {c['_claimed_by']} NOT IN (SELECT unnest(CAST($alive AS VARCHAR[])))))",
        {
            "dead": dead,
            "alive": alive,
            "stale_before": params.stale_before,
            "now": utcnow(),
            "max_attempts": params.max_attempts,
        },
    ).height


def clock(con: Con) -> str:
    """SQL for the time claims are written and judged by: the database's own clock on PostgreSQL, which every
    worker shares whatever its machine's clock says; on DuckDB (one file, one host) the process's `$now`."""
    return dialect_of(con).clock


def lapsed_sql(con: Con, c: dict[str, str]) -> str:
    """SQL: the row's claim has lapsed by its own lease (a claim from 0.6 has none: by `$stale_before`)."""
    return (
        f"CASE WHEN {c['_lease_until']} IS NULL THEN {c['_running_started_at']} < $stale_before "
        f"ELSE {c['_lease_until']} < {clock(con)} END"
    )


def gone_holders(con: Con, layout: Layout, stale_after: timedelta, now: datetime) -> list[str]:
    """Holders of the step's RUNNING rows that certainly no longer run: a process of this host that is gone
    (`is_abandoned`: by PID and start time), or a holder elsewhere whose claims were all not renewed for
    `stale_after` or have all lapsed by their own lease. Both are judged in the clock the claims were written
    in (`clock`: the database's on PostgreSQL), never the caller's. A holder alive on this host is never among
    them, however old its claims."""
    c = names(layout.step)
    rows = con.execute(
        f"SELECT {c['_claimed_by']}, coalesce(max({c['_running_started_at']}) < {clock(con)} - $stale_after, false) "
        f"OR coalesce(bool_and({c['_lease_until']} < {clock(con)}), false) FROM {q(layout.table)} "
        f"WHERE {c['_status']} = 'RUNNING' GROUP BY 1",
        {"stale_after": stale_after, "now": now},
    ).fetchall()
    return [
        holder
        for holder, old in rows
        if holder is not None and (is_abandoned(holder) or (not is_alive_here(holder) and old))
    ]


def merge_journals(
    con: Con, layout: Layout, store_path: Path, key_types: dict[str, pl.DataType]
) -> tuple[list[Path], int]:
    """Commit the answers that runs which died on this host journaled but did not commit.

    Returns the files to delete once the transaction has committed, and how many answers they held (the run
    reports them: they were paid for by the dead run, and are kept).
    """
    merged, answers = [], 0
    for path, holder in pending_journals(store_path, layout.table, layout.step):
        if is_abandoned(holder):
            results = read_journal(path, key_types | RESULT_SCHEMA, key=list(key_types))
            if results.height:
                results = results.with_columns(
                    pl.col("fingerprint").map_elements(upgrade_fingerprint, return_dtype=pl.String)
                )
                commit_results(con, layout, results, now=utcnow(), only_unfinished=True)
                answers += results.height
            record_packs(con, pack_records(path))
            dead = Claimant.parse(holder)
            figures = last_journal_figures(path)
            if dead is not None and figures:  # what the dead run paid after its last commit
                raise_run(con, dead.run_id, layout.table, layout.step, figures)
            merged.append(path)
    return merged, answers


def fed_layout(layout: Layout, graph: StepGraph) -> Layout:
    """The layout of a step that reads other steps: claimable only when they are fresh; stale when they move."""
    if not graph.upstream.get(layout.step):
        return layout
    return dataclasses.replace(layout, ready=graph.ready_sql(layout.step), stale=graph.stale_sql(layout.step))


def input_columns(con: Con, layout: Layout) -> list[str]:
    """The fact table's input columns (its key and what frames put there): what a `validate=` callable sees."""
    owned = owned_columns(con, layout.table, layout.step)
    return [c for c in column_types(con, layout.table) if c not in owned and c not in layout.key]


def requests_of(con: Con, layout: Layout) -> dict[str, RequestSpec]:
    return {v: RequestSpec.from_json(r) for v, r in requests_by_version(con, layout.table, layout.step).items()}


def from_legacy(con: Con) -> bool:
    return bool(one(con, f"SELECT count(*) FROM {MIGRATIONS_TABLE} WHERE llmledger = '0.1.0'")[0])


KEPT = "_kept"  # in `named_outputs`: the row's answer is one a person accepted or wrote
KEPT_FLAGGED = "_kept_flagged"  # and: it is flagged, yet redo='flagged' keeps it (a person wrote it)


def named_outputs(found: pl.DataFrame, step: str) -> pl.DataFrame:
    """The columns apply_llm appends: the answer, its status, and whether that DONE answer is stale (made for a
    request that has changed since: `redo='stale'` re-sends it)."""
    return found.select(
        pl.col("output").alias(step),
        pl.col("status").alias(f"{step}_status"),
        pl.col("stale").fill_null(False).alias(f"{step}_stale"),
        # not appended to the user's frame: which stale answers a person's verdict keeps (the run's report says so)
        *(
            (pl.col(name).fill_null(False) if name in found.columns else pl.lit(False)).alias(alias)
            for name, alias in (("kept", KEPT), ("kept_flagged", KEPT_FLAGGED))
        ),
    )
