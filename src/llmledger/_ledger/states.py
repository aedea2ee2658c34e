"""Row statuses, redo modes and run outcomes, and every rule about moving between them.

The status model, in one place (the README's table is written from this):

    NOT_STARTED ──claim──▶ RUNNING ──answer──▶ DONE
         ▲                    │    ──bad request / refusal──▶ FAILED (attempts < max_attempts)
         │                    │                         └──▶ NEEDS_REVIEW (attempts = max_attempts)
         └──release/recover───┘  (back to what the row was before its claim)
                              │
                              └──in a Message Batch──▶ SUBMITTED ──results──▶ DONE | FAILED | NEEDS_REVIEW
                                                           └──expired / canceled / the API's error──▶ back

A row sent in a Message Batch (`mode="batch"`) is claimed like any other,
its custom id recorded with the batch's intent (`llmledger_batches`), and
marked SUBMITTED together with its batch id once the API has the batch.
SUBMITTED rows belong to their batch, not to a process: no claim recovery
touches them, and whichever run looks next merges the batch's results.

A claim touches only the status and claim columns and records the status it
took the row from (`_claimed_from`), so giving a claim back restores exactly
what the row was (`prior_status_sql`).
Statuses are stored as these plain strings, so `WHERE summary_status = 'DONE'`
works from any SQL client.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    SUBMITTED = "SUBMITTED"  # in a Message Batch the API is processing
    DONE = "DONE"
    FAILED = "FAILED"
    NEEDS_REVIEW = "NEEDS_REVIEW"


class Redo(StrEnum):
    """What a run re-sends besides NOT_STARTED rows and FAILED rows with attempts left."""

    NONE = "none"  # nothing else
    ALL = "all"  # every matching row, even DONE or NEEDS_REVIEW (`redo=True`)
    STALE = "stale"  # DONE rows whose answer was made for another request (`redo="stale"`)
    FLAGGED = "flagged"  # rows a person flagged with llmledger.flag (`redo="flagged"`)

    @classmethod
    def from_argument(cls, redo: object) -> Redo:
        return {False: cls.NONE, True: cls.ALL, "all": cls.ALL, "stale": cls.STALE, "flagged": cls.FLAGGED}[redo]

    @property
    def reuses_answers(self) -> bool:
        """Whether DONE answers to identical requests may stand in: not with `redo=True`, which asks every row
        afresh. A `redo="flagged"` run reuses them for its other rows (NOT_STARTED ones, twins of answered ones:
        found by the explorer paying such a row twice); a flagged answer never stands in (`reuse.answers_to`)."""
        return self in (Redo.NONE, Redo.STALE, Redo.FLAGGED)


class Outcome(StrEnum):
    """How a run ended (stored in `llmledger_runs.outcome`)."""

    PREPARING = "preparing"
    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"  # Ctrl-C / the kernel's stop button
    CANCELLED = "cancelled"  # Run.cancel() of a background run
    OUTAGE = "outage"  # the circuit breaker tripped
    AUTH = "auth"  # 401/403
    SPEND_LIMIT = "spend_limit"  # the account cannot spend more
    RETRY_REFUSED = "retry_refused"  # x-should-retry: false on an otherwise transient error
    BUDGET = "budget"  # max_cost_usd was reached
    NO_MODEL = "no_model"  # 404: the API has no such model
    BAD_REQUEST = "bad_request"  # the API refused the request's shape alike for several rows, none answered
    ERROR = "error"  # a bug or a store failure

    @property
    def stopped_early(self) -> bool:
        return self not in (Outcome.PREPARING, Outcome.RUNNING, Outcome.COMPLETED)


STATUSES = tuple(s.value for s in Status)
# How `progress()`, `show()`, `llmledger status` and a run's bar count a step's rows: every row in exactly one.
# DONE rows whose answer is to an older request count as "stale", not DONE; NOT_STARTED and FAILED rows whose
# upstream steps are not fresh count as "waiting" (`status_counts`).
COUNTED = (*STATUSES, "stale", "waiting")
# The statuses a row may have to be eligible under each redo mode (what `eligible_sql` checks in full).
CLAIMABLE = {
    Redo.NONE.value: ("NOT_STARTED", "FAILED"),
    Redo.STALE.value: ("NOT_STARTED", "FAILED", "DONE"),
    Redo.ALL.value: ("NOT_STARTED", "FAILED", "DONE", "NEEDS_REVIEW"),
    Redo.FLAGGED.value: ("NOT_STARTED", "FAILED", "DONE", "NEEDS_REVIEW"),
}
STATUS_ENUM_SQL = "ENUM(" + ", ".join(f"'{s}'" for s in STATUSES) + ")"


def status_after_failure(attempts: int, max_attempts: int) -> Status:
    """A row whose request was refused for its own reasons (400, refusal) after `attempts` tries."""
    return Status.NEEDS_REVIEW if attempts >= max_attempts else Status.FAILED


def attempts_after(previous: int | None, *, was_done: bool) -> int:
    """A redo of a DONE row starts counting again; otherwise each answered or refused try counts once."""
    return 1 if was_done else int(previous or 0) + 1


def prior_status_sql(col: dict[str, str]) -> str:
    """SQL: the status a RUNNING row had before it was claimed (`$max_attempts` bound).

    Claims record it in `_claimed_from`; for claims taken before that column existed (schema 3) it is read
    back from the row's other columns (a claim touches only the status and claim columns).
    """
    return (
        f"coalesce({col['_claimed_from']}, CASE WHEN {col['_error']} IS NOT NULL THEN (CASE WHEN "
        f"{col['_attempts']} >= $max_attempts THEN 'NEEDS_REVIEW' ELSE 'FAILED' END) "
        f"WHEN {col['_finished_at']} IS NOT NULL THEN 'DONE' ELSE 'NOT_STARTED' END)"
    )


PERSON = "person"  # `{step}_source` of an answer a person wrote (a correction: review.py)


def kept_sql(col: dict[str, str]) -> str:
    """SQL: a person accepted or wrote the row's answer, so no redo replaces it but `redo=True` on rows the call
    names (a flag clears an acceptance, not a correction: `{step}_source` stays `person`)."""
    return f"({col['_verdict']} IS NOT NULL OR coalesce({col['_source']} = '{PERSON}', false))"


def eligible_sql(col: dict[str, str], stale: str | None = None, *, named: bool = False) -> str:
    """SQL: this run may claim the row now (`$max_attempts`, `$redo`, `$run_started` bound).

    A redo never takes a row this very run has finished (`_finished_at < $run_started`). `stale`:
    the staleness rule of a step fed by other steps (graph.py); the plain one otherwise. An answer a person
    accepted or wrote is kept by every redo but `redo=True` on rows the call names (`named`: it has `where=`).
    """
    s, a, f = col["_status"], col["_attempts"], col["_finished_at"]
    kept = kept_sql(col)
    return (
        f"({s} = 'NOT_STARTED' OR ({s} = 'FAILED' AND {a} < $max_attempts) "
        f"OR ($redo = 'all' AND {s} IN ('DONE', 'FAILED', 'NEEDS_REVIEW') AND ({f} IS NULL OR {f} < $run_started)"
        f"{'' if named else f' AND NOT {kept}'}) "
        f"OR ($redo = 'flagged' AND {col['_flag']} IS NOT NULL AND {s} NOT IN ('RUNNING', 'SUBMITTED') "
        f"AND ({f} IS NULL OR {f} < $run_started) AND NOT {kept}) "
        f"OR ($redo = 'stale' AND {stale or stale_sql(col)} AND NOT {kept}))"
    )


def stale_sql(col: dict[str, str]) -> str:
    """SQL: the row is DONE, but its answer was made for another request than the current one, or its inputs
    changed since (its request is to be rendered again: `_version` cleared)."""
    return (
        f"({col['_status']} = 'DONE' AND ({col['_fingerprint']} IS DISTINCT FROM {col['_request_fingerprint']}"
        f" OR {col['_version']} IS NULL))"
    )
