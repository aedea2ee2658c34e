"""Where rows live: the ledger, behind one small interface that speaks ledger verbs.

    prepare      record a step's definition, the frame's rows and their requests; select the work
    resume       select the work of a step from the store alone
    claim        mark up to n selected rows RUNNING for a run, returning their stored requests
    commit       write one chunk of results (outputs and statuses together) in one transaction
    release      give back the claims a run did not finish
    renew        mark a run's claims alive (a heartbeat, so they are not taken back by age)
    recover      give back claims whose holder is gone (prepare and resume do it first)
    outputs      the step's outputs and statuses for a frame, in frame order
    record_run   one row of llmledger_runs
    spent        what a step's answers cost, current and replaced (for a budget across runs)
    reserve_budget  reserve what a run is about to spend under a step's budget (shared by concurrent runs)
    begin_batch / confirm_batch / abandon_batch / reject_batch / attach_to_batch / open_batches /
    requests_in_batches / batch_rows / merge_batch
                 rows sent in Message Batches: the intent, the API's batch id, the merge (batches.py)
    counts / failures / history / query      what people look at
    flag / reset                             what people do to rows: mark answers for redo, start rows over

`open_ledger(store)` returns the one implementation of these verbs (`ledger.py`),
on a DuckDB file (`engine/duckdb.py`) or, for a `postgresql://` URL, on a PostgreSQL
database (`engine/postgres.py`): the SQL is written once. Claim liveness (`liveness.py`) and the
write-ahead journal (`journal.py`) live here too because both are about
rows in the store, not about talking to the API.
The values the verbs take are in `types.py`, opening a store in `open.py`; this module only re-exports them.
"""

from llmledger._ledger.open import (
    db_errors,
    known_steps,
    known_table,
    locate,
    open_existing,
    open_ledger,
    short_name,
    shown,
    stale_condition,
    stored_outputs,
    stored_requests,
)
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import (
    DEFAULT_STORE,
    DEFAULT_TABLE,
    Chunk,
    KnownAnswer,
    Ledger,
    RunParams,
    Selection,
    StepDefinition,
    Store,
)

__all__ = [
    "DEFAULT_STORE",
    "DEFAULT_TABLE",
    "Chunk",
    "KnownAnswer",
    "Layout",
    "Ledger",
    "RunParams",
    "Selection",
    "StepDefinition",
    "Store",
    "db_errors",
    "known_steps",
    "known_table",
    "locate",
    "open_existing",
    "open_ledger",
    "short_name",
    "shown",
    "stale_condition",
    "stored_outputs",
    "stored_requests",
]
