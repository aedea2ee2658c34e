"""Exceptions users can catch.

Two families: `InvalidInputError` (the call was wrong: nothing was written,
fix the argument and call again) and `RunStopped` (the call was right but the
run could not go on: everything finished so far is committed, the rest of the
rows stay retryable, and calling again resumes).
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every error llmledger raises on purpose."""


class InvalidInputError(LedgerError, ValueError):
    """An argument is wrong. Raised before anything is written to the store."""


class KeyColumnError(InvalidInputError):
    """The key column is missing, or has nulls or duplicates."""


class StepNameError(InvalidInputError):
    """The step name is not a usable SQL identifier."""


class PromptError(InvalidInputError):
    """The prompt template names an unknown column, or a prompt callable failed."""


class WhereClauseError(InvalidInputError):
    """The `where` predicate does not parse or bind against the fact table."""


class StoreError(InvalidInputError):
    """The store path is not a DuckDB file, or the table does not fit the frame."""


class RunStopped(LedgerError, RuntimeError):
    """The run stopped early. Finished rows are committed; the rest stay retryable."""

    def __init__(self, message: str, *, report: object | None = None) -> None:
        super().__init__(message)
        self.report = report


class AuthenticationFailed(RunStopped):
    """The API refused the credentials (401/403): no row was marked failed."""


class OutageError(RunStopped):
    """Transient errors persisted across many rows, so the circuit breaker stopped the run."""


__all__ = [
    "AuthenticationFailed",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "OutageError",
    "PromptError",
    "RunStopped",
    "StepNameError",
    "StoreError",
    "WhereClauseError",
]
