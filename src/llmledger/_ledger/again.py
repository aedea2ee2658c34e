"""Transactions the store lost, done again. DuckDB 2.0.1 can lose a committed transaction when two processes take turns
on one file: the call returns, and nothing of the transaction is kept (`Dialect.loses_commits`).

- A chunk of answers: a run keeps the chunks it committed and has not seen land (`types.Chunk`), and each of its
  next transactions that depends on them (the next claim, commit, budget reservation and the release) first writes
  them again, where their rows are still the run's claims (`write_again`).
- A claim: a run reads it back before it sends a row of it (`read_back`). A lost claim leaves its rows free, and
  another process claims and pays them while this one pays them too: every text twice, seen in CI with three
  `llmledger run` processes on one file.
- A batch's intent and its confirmation: read back and done again until seen (`until_landed`). A lost intent left
  a batch the API bills with no record, and its rows went back to be sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

import polars as pl

from llmledger._ledger.columns import lost_commit_sql
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import registered
from llmledger._ledger.packs import record_packs
from llmledger._ledger.survey import Layout, apart
from llmledger._ledger.types import Chunk, Selection
from llmledger._ledger.verbs import commit_results
from llmledger._step.sqltext import q
from llmledger.errors import StoreError

T = TypeVar("T")
READS = 3  # times a transaction the store lost is read back and done again, before the run gives it up
LOSES_COMMITS = (  # why a store did not keep a transaction, and how to avoid it: the end of each such StoreError
    "Another process taking turns on this DuckDB file loses its commits at times; one process per file, or "
    "PostgreSQL for several, avoids it"
)

_AGAIN = "llmledger_written_again"
_CLAIMED = "llmledger_claimed"


def write_again(con: Con, layout: Layout, claimant: str, chunks: Sequence[Chunk], *, now: datetime) -> list[Chunk]:
    """Write chunks committed earlier again, with their packs, where their rows are still as the claimant that
    committed them claimed them: rows whose commit was lost (`columns.lost_commit_sql`). A chunk's answers, paid for,
    otherwise stayed RUNNING and went back to NOT_STARTED at release, to be paid again; its failed tries' cost was
    counted nowhere, and a step budget let the run spend it again. Returns what it wrote again, each chunk cut to
    the rows it wrote: this transaction may be lost too, so the next one looks at them again. A chunk whose commit
    landed has none of its rows held that way (one look at its keys), and goes: nothing of it is written.

    Claims look first (`SQLLedger.claim`'s `again`), so a chunk that landed goes before the run can claim any of
    its rows again (a row reset meanwhile, found again as a twin or by a worker claiming open-ended on PostgreSQL):
    the old result, written onto the new claim, would undo the reset, end the claim while its request is in
    flight, and count a failed try's cost twice. A failure is written again only if the row's tries are one short
    of the chunk's (equal: it landed, and the row was claimed again since). The packs go with the rows (each in
    place of its record, if any): a packed answer's `{step}_pack` names its request in `llmledger_packs`.

    A shared budget's reservation is not settled again: the run's next reservation replaces it, after writing the
    chunks again itself, so it sees their cost as spent (settling again left the run reserving less than it would
    have, had the commit landed)."""
    written = []
    keys = ", ".join(f"i.{q(k)}" for k in layout.key)
    for chunk in chunks:
        with registered(con, _AGAIN, chunk.results.select([*layout.key, "status", "attempts"])):
            held = con.execute(
                f"SELECT {keys} FROM {q(layout.table)} AS t JOIN {_AGAIN} AS i ON {layout.key_join()} "
                f"WHERE {lost_commit_sql(layout.step, '$claimant')}",
                {"claimant": claimant},
            ).fetchall()
        if held:  # kept for the next look: only those rows (one reset meanwhile is no longer this chunk's)
            found = pl.DataFrame(held, schema={k: chunk.results.schema[k] for k in layout.key}, orient="row")
            rows = chunk.results.join(found, on=layout.key, how="semi")
            commit_results(con, layout, rows, now=now, only_claimed_by=claimant)
            record_packs(con, chunk.packs)
            written.append(Chunk(rows, chunk.packs))
    return written


def read_back(con: Con, selection: Selection, claimed: pl.DataFrame, *, claimant: str) -> list[int]:
    """Of the rows a claim by `claimant` took (`claimed`: their keys), the places (row numbers in `claimed`) of
    those the store holds as that claim. The others' claim was lost: another run may have claimed them meanwhile,
    and this run must not send them. The keys are matched in SQL, as the claim matched them (a NaN key is its own
    row there, and no Python value equals NaN)."""
    layout = selection.layout
    at = apart("at", layout.key)
    with registered(con, _CLAIMED, claimed.with_row_index(at)):
        held = con.execute(
            f"SELECT i.{q(at)} FROM {q(layout.table)} AS t JOIN {_CLAIMED} AS i ON {layout.key_join()} "
            f"WHERE {layout.col('_status', 't')} = 'RUNNING' AND {layout.col('_claimed_by', 't')} = $claimant",
            {"claimant": claimant},
        ).fetchall()
    return [place for (place,) in held]


def until_landed(
    db: Database, work: Callable[[Con], T], landed: Callable[[Con, T], bool], *, wait: float | None, lost: str
) -> T:
    """Run `work` in one transaction; on an engine that loses commits, read back in a transaction of its own whether
    it landed (`landed`, given what `work` returned), and run it again while not, up to `READS` times; returns what
    its last run returned. Never seen: a `StoreError` saying what was `lost` and what that means. `work` must be safe
    to run again once its transaction is lost: it finds the store as it was before it."""
    result = db.transaction(work, wait=wait)
    if not db.dialect.loses_commits:
        return result
    for _ in range(READS):

        def seen(con: Con, done: T = result) -> bool:
            return landed(con, done)

        if db.transaction(seen, wait=wait):
            return result
        result = db.transaction(work, wait=wait)
    raise StoreError(f"the store {db.path} did not keep {lost} ({READS + 1} tries). {LOSES_COMMITS}")
