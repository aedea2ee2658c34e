"""llmledger: run Claude over every row of a dataframe without ever paying twice for the same row.

    from llmledger import apply_llm
    out = apply_llm(df, "summary", prompt="Summarize: {text}", key="id", store="data/ledger.duckdb")
"""

from ._api import DEFAULT_STORE, DEFAULT_TABLE, apply_llm, apply_llm_async
from ._client import DEFAULT_MODEL
from ._query import progress, sql
from ._report import RunReport
from ._run import Run, last_report
from ._runner import RetryPolicy
from .errors import (
    AuthenticationFailed,
    InvalidInputError,
    KeyColumnError,
    LedgerError,
    OutageError,
    PromptError,
    RunStopped,
    StepNameError,
    StoreError,
    WhereClauseError,
)
from .simulator import Simulator

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_STORE",
    "DEFAULT_TABLE",
    "AuthenticationFailed",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "OutageError",
    "PromptError",
    "RetryPolicy",
    "Run",
    "RunReport",
    "RunStopped",
    "Simulator",
    "StepNameError",
    "StoreError",
    "WhereClauseError",
    "apply_llm",
    "apply_llm_async",
    "last_report",
    "progress",
    "sql",
]
