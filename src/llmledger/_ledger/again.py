"""Writing again a chunk whose commit the store lost. DuckDB 2.0.1 can lose a committed transaction when two
processes take turns on one file: the call returns, and nothing of the transaction is kept. A run keeps the chunk it
committed last (`types.Chunk`) and each of its next transactions that depends on it (the next commit, a budget
reservation, the release) first writes it again, where its rows are still the run's claims."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import registered
from llmledger._ledger.packs import record_packs
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import Chunk
from llmledger._ledger.verbs import commit_results
from llmledger._step.sqltext import q

_AGAIN = "llmledger_written_again"


def write_again(con: Con, layout: Layout, claimant: str, chunk: Chunk, *, now: datetime) -> None:
    """Write a chunk committed earlier again, with its packs, where its rows are still RUNNING under the claimant
    that committed it: rows whose commit was lost. DuckDB 2.0.1 can lose a committed transaction when two processes
    take turns on one file (found by an attack on 2026-11-29: plain DuckDB, connect, insert, commit, close in two
    processes lost one insert in five runs); a chunk's answers, paid for, then stayed RUNNING and went back to
    NOT_STARTED at release, to be paid again. Where the commit landed its rows are DONE or FAILED by now: one look
    at the chunk's keys finds none held, and nothing is written.

    Only answers (DONE, NEEDS_REVIEW) are written again: a run never claims again a row it answered, but a worker
    claiming open-ended (PostgreSQL) may claim again a row it FAILED, and writing that failure onto the new claim
    would count its cost twice and end the claim while its request is in flight. The packs go with them (each in
    place of its record, if any): a packed answer's `{step}_pack` names its request in `llmledger_packs`.
    A shared budget's reservation is not settled again: the run's next reservation replaces it, after writing the
    chunk again itself, so it sees the chunk's cost as spent (settling again left the run reserving less than it
    would have, had the commit landed)."""
    answers = chunk.results.filter(pl.col("status").is_in(["DONE", "NEEDS_REVIEW"]))
    if not answers.height:
        return
    c = names(layout.step, "t")
    with registered(con, _AGAIN, answers.select(layout.key)):
        held = con.execute(
            f"SELECT count(*) FROM {q(layout.table)} AS t JOIN {_AGAIN} AS i ON {layout.key_join()} "
            f"WHERE {c['_status']} = 'RUNNING' AND {c['_claimed_by']} = $claimant",
            {"claimant": claimant},
        ).fetchone()
    if held and held[0]:
        commit_results(con, layout, answers, now=now, only_claimed_by=claimant)
        record_packs(con, chunk.packs)
