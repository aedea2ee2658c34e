"""llmledger: run Claude over every row of a dataframe without ever paying twice for the same row.

    from llmledger import apply_llm
    out = apply_llm(df, "summary", prompt="Summarize: {text}", key="id", store="data/ledger.duckdb")
"""

__version__ = "0.9.0"

from ._api import DEFAULT_STORE, DEFAULT_TABLE, apply_llm, apply_llm_async, resume
from ._copy import copy
from ._estimate import estimate
from ._exec.api import DEFAULT_MODEL
from ._exec.online import RetryPolicy
from ._ledger.states import Outcome, Redo, Status
from ._parquet import export, restore
from ._pipeline import pipeline
from ._prices import UnknownPriceWarning, prices, set_price
from ._query import flag, history, progress, reset, sql
from ._report import PipelineReport, RunReport
from ._request import fingerprint
from ._run import Run, last_report
from ._show import StoreView, show
from ._worker import work
from .errors import (
    AuthenticationFailed,
    InvalidInputError,
    KeyColumnError,
    LedgerError,
    ModelNotFound,
    OutageError,
    PromptError,
    RequestRefused,
    RetryRefused,
    RunStopped,
    SpendLimitReached,
    StaleAnswersWarning,
    StepNameError,
    StoreBusy,
    StoreError,
    StoreNotFound,
    WhereClauseError,
)
from .simulator import Simulator, simulate

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_STORE",
    "DEFAULT_TABLE",
    "AuthenticationFailed",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "ModelNotFound",
    "OutageError",
    "Outcome",
    "PipelineReport",
    "PromptError",
    "Redo",
    "RequestRefused",
    "RetryPolicy",
    "RetryRefused",
    "Run",
    "RunReport",
    "RunStopped",
    "Simulator",
    "SpendLimitReached",
    "StaleAnswersWarning",
    "Status",
    "StepNameError",
    "StoreBusy",
    "StoreError",
    "StoreNotFound",
    "StoreView",
    "UnknownPriceWarning",
    "WhereClauseError",
    "__version__",
    "apply_llm",
    "apply_llm_async",
    "copy",
    "estimate",
    "export",
    "fingerprint",
    "flag",
    "history",
    "last_report",
    "pipeline",
    "prices",
    "progress",
    "reset",
    "restore",
    "resume",
    "set_price",
    "show",
    "simulate",
    "sql",
    "work",
]
