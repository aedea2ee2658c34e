"""Writing again chunks whose commit the store lost. DuckDB 2.0.1 can lose a committed transaction when two processes
take turns on one file: the call returns, and nothing of the transaction is kept. A run keeps the chunks it committed
and has not seen land (`types.Chunk`), and each of its next transactions that depends on them (the next commit, a
budget reservation, the release) first writes them again, where their rows are still the run's claims."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmledger._ledger.columns import lost_commit_sql, names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import one, registered
from llmledger._ledger.packs import record_packs
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import Chunk
from llmledger._ledger.verbs import commit_results
from llmledger._step.sqltext import q

_AGAIN = "llmledger_written_again"


def write_again(con: Con, layout: Layout, claimant: str, chunks: Sequence[Chunk], *, now: datetime) -> list[Chunk]:
    """Write chunks committed earlier again, with their packs, where their rows are still as the claimant that
    committed them claimed them: rows whose commit was lost (`columns.lost_commit_sql`). A chunk's answers, paid for,
    otherwise stayed RUNNING and went back to NOT_STARTED at release, to be paid again; its failed tries' cost was
    counted nowhere, and a step budget let the run spend it again. Returns the chunks written again: this
    transaction may be lost too, so the next one looks at them again. A chunk whose commit landed has none of its
    rows held that way (one look at its keys), and goes: nothing of it is written.

    A row the run claimed again after its commit landed (a twin, or a worker claiming open-ended on PostgreSQL
    a row it FAILED) is RUNNING under the run again, but its try is counted: writing the old result onto the new
    claim would count that try's cost twice and end the claim while its request is in flight. Its answer is
    written again only if the chunk answered it (a run never claims again a row it answered), a failure only if
    the row's tries are one short of the chunk's. The packs go with the rows (each in place of its record, if
    any): a packed answer's `{step}_pack` names its request in `llmledger_packs`.

    A shared budget's reservation is not settled again: the run's next reservation replaces it, after writing the
    chunks again itself, so it sees their cost as spent (settling again left the run reserving less than it would
    have, had the commit landed)."""
    written = []
    c, lost = names(layout.step, "t"), lost_commit_sql(layout.step)
    for chunk in chunks:
        with registered(con, _AGAIN, chunk.results.select([*layout.key, "status", "attempts"])):
            (held,) = one(
                con,
                f"SELECT count(*) FROM {q(layout.table)} AS t JOIN {_AGAIN} AS i ON {layout.key_join()} "
                f"WHERE {c['_status']} = 'RUNNING' AND {c['_claimed_by']} = $claimant AND {lost}",
                {"claimant": claimant},
            )
        if held:
            commit_results(con, layout, chunk.results, now=now, only_claimed_by=claimant)
            record_packs(con, chunk.packs)
            written.append(chunk)
    return written
