"""Exceptions users can catch.

    LedgerError                       every error llmledger raises on purpose
    ├── InvalidInputError             (also ValueError) the call was wrong; nothing was written
    │   ├── KeyColumnError            the key is missing, null, repeated, or does not fit the table
    │   ├── StepNameError             the step (or table) name is not a usable SQL identifier
    │   ├── PromptError               the template names an unknown column, or a prompt callable failed
    │   └── WhereClauseError          `where` does not parse or bind against the fact table
    ├── StoreError                    the store cannot be used as asked (not a ValueError: the call may be fine)
    │   ├── StoreNotFound             (also FileNotFoundError) no store at that path
    │   └── StoreBusy                 (also TimeoutError) another process held the store for too long
    └── RunStopped                    (also RuntimeError) the run stopped early: finished rows are committed,
        │                             the rest stay retryable, and calling again resumes
        ├── AuthenticationFailed      401/403: the API refused the credentials
        ├── SpendLimitReached         the account cannot spend more now (spend or usage limit, billing)
        ├── RetryRefused              the API said not to retry (`x-should-retry: false`) an error it
        │                             would otherwise retry
        ├── ModelNotFound             404: no such model (a typo, or retired); no row was marked failed
        └── OutageError               transient errors persisted, so the circuit breaker stopped the run

`InvalidInputError` means: fix the argument and call again. `StoreError` means:
the store is missing, busy, broken or written by a newer llmledger. `RunStopped`
means: the call was right but the run could not go on; nothing paid for is lost.
Every `RunStopped` carries the run's `report` (rows remaining, calls paid, ...).
"""

from __future__ import annotations


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


class OutageError(RunStopped):
    """Transient errors persisted across many rows, so the circuit breaker stopped the run."""


__all__ = [
    "AuthenticationFailed",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "OutageError",
    "PromptError",
    "RetryRefused",
    "RunStopped",
    "SpendLimitReached",
    "StepNameError",
    "StoreBusy",
    "StoreError",
    "StoreNotFound",
    "WhereClauseError",
]
