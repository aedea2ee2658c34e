"""Exceptions users can catch.

    LedgerError                       every error llmledger raises on purpose
    ├── InvalidInputError             (also ValueError) the call was wrong; nothing was written
    │   ├── KeyColumnError            the key is missing, null, repeated, or does not fit the table
    │   ├── StepNameError             the step (or table) name is not a usable SQL identifier
    │   ├── PromptError               the template names an unknown column, or a prompt callable failed
    │   └── WhereClauseError          `where` does not parse or bind against the fact table
    ├── StoreError                    the store cannot be used as asked (not a ValueError: the call may be fine)
    │   ├── StoreNotFound             (also FileNotFoundError) no store at that path
    │   ├── StoreBusy                 (also TimeoutError) another process held the store for too long
    │   └── CommitUnknown             the connection to PostgreSQL was lost as a COMMIT went, and whether it
    │                                 landed cannot be known (the server restarted)
    └── RunStopped                    (also RuntimeError) the run stopped early: finished rows are committed,
        │                             the rest stay retryable, and calling again resumes
        ├── AuthenticationFailed      401/403: the API refused the credentials
        ├── SpendLimitReached         the account cannot spend more now (spend or usage limit, billing)
        ├── RetryRefused              the API said not to retry (`x-should-retry: false`) an error it
        │                             would otherwise retry
        ├── ModelNotFound             404: no such model (a typo, or retired); no row was marked failed
        ├── RequestRefused            the API refused the call's shape (the same 400 for the first
        │                             requests, none answered): fix the call's options
        └── OutageError               transient errors persisted, so the circuit breaker stopped the run

`InvalidInputError` means: fix the argument and call again. `StoreError` means:
the store is missing, busy, broken or written by a newer llmledger. `RunStopped`
means: the call was right but the run could not go on; nothing paid for is lost.
Every `RunStopped` carries the run's `report` (rows remaining, calls paid, ...).

Warnings (`warnings.warn`, shown once per place by Python's default filter) say what a run did that the user
should know but that is not an error: `StaleAnswersWarning` (answers returned for requests that have changed
since, when the run was quiet), `RunningElsewhereWarning` (rows returned without answers because another run is
answering them, when the run was quiet) and `llmledger.UnknownPriceWarning` (a model with no known price).
"""

from __future__ import annotations

import os
import sys
import warnings


class StaleAnswersWarning(UserWarning):
    """A quiet run (`progress=False`) returned DONE answers whose request has changed since they were made (the
    `{step}_stale` column says which); `redo='stale'` re-sends them."""


class RunningElsewhereWarning(UserWarning):
    """A quiet run (`progress=False`) returned rows that another run on the store is answering right now: they show
    RUNNING and no answer; the same call, once that run ends, returns their answers at no cost."""


class BudgetReachedWarning(UserWarning):
    """A quiet run (`progress=False`) stopped at its `max_cost_usd`: the rows it did not send are returned without
    an answer, as they were; a larger budget (or `resume`) goes on from there."""


def warn(message: str, category: type[Warning]) -> None:
    """`warnings.warn` pointing at the first caller outside llmledger (the user's cell or script), so the warning
    names the user's line, not an internal one."""
    here = os.path.dirname(os.path.abspath(__file__))
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level + 1)


class LedgerError(Exception):
    """Base class of every error llmledger raises on purpose."""


class InvalidInputError(LedgerError, ValueError):
    """An argument is wrong. Raised before anything is written to the store."""


class KeyColumnError(InvalidInputError):
    """The key column is missing, or has nulls or duplicates, or does not fit the table."""


class StepNameError(InvalidInputError):
    """The step name is not a usable SQL identifier, or its columns would be another step's or an input's."""


class PromptError(InvalidInputError):
    """The prompt template names an unknown column, or a prompt callable failed."""


class WhereClauseError(InvalidInputError):
    """The `where` predicate does not parse or bind against the fact table."""


class StoreError(LedgerError):
    """The store cannot be used: not a ledger, broken, or written by a newer llmledger."""


class StoreNotFound(StoreError, FileNotFoundError):
    """There is no store at the path given."""


class StoreBusy(StoreError, TimeoutError):
    """Another process held the store longer than the call was willing to wait."""


class CommitUnknown(StoreError):
    """The connection to a PostgreSQL store was lost while a COMMIT was on its way, and the server cannot say whether
    it landed: it restarted, and a crash forgets what it had not made durable (and may give its transaction id to
    another). A run keeps the answers in its journal and writes them again where they did not land; a verb such as
    `flag` or `reset` should be called again once the server is back, after checking what it holds."""


class RunStopped(LedgerError, RuntimeError):
    """The run stopped early. Finished rows are committed; the rest stay retryable."""

    def __init__(self, message: str, *, report: object | None = None) -> None:
        super().__init__(message)
        self.report = report


class AuthenticationFailed(RunStopped):
    """The API refused the credentials (401/403): no row was marked failed."""


class SpendLimitReached(RunStopped):
    """The account cannot spend more now (spend or contract limit, usage limit, billing): no row was marked failed.

    Retrying will not help until the limit is raised or resets; the message says which.
    """


class RetryRefused(RunStopped):
    """The API answered an error it would usually retry with `x-should-retry: false`: no row was marked failed."""


class ModelNotFound(RunStopped):
    """The API has no such model (a typo, or a retired model): every row would fail, so none is sent."""


class RequestRefused(RunStopped):
    """The API refused the same way (a 400) every distinct request the run sent, before answering any: the
    fault is the call's (its options, schema or model), not the rows', so the run stopped instead of failing
    every row. Fix the call and run it again."""


class OutageError(RunStopped):
    """Transient errors persisted across many rows, so the circuit breaker stopped the run."""


__all__ = [
    "AuthenticationFailed",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "OutageError",
    "PromptError",
    "RequestRefused",
    "RetryRefused",
    "RunStopped",
    "RunningElsewhereWarning",
    "SpendLimitReached",
    "StaleAnswersWarning",
    "StepNameError",
    "StoreBusy",
    "StoreError",
    "StoreNotFound",
    "WhereClauseError",
]
