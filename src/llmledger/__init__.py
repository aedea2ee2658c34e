"""llmledger: run Claude over every row of a dataframe without ever paying twice for the same row.

from llmledger import apply_llm
out = apply_llm(df, "summary", prompt="Summarize: {text}", key="id", store="data/ledger.duckdb")
"""

from llmledger._exec.client import DEFAULT_MODEL
from llmledger._exec.config import RetryPolicy
from llmledger._ledger import DEFAULT_STORE, DEFAULT_TABLE
from llmledger._ledger.copy import copy
from llmledger._ledger.parquet import export, restore
from llmledger._ledger.query import accept, correct, flag, history, progress, reset, sql, undo_verdict, verdicts
from llmledger._ledger.states import Outcome, Redo, Status
from llmledger._report import PipelineReport, RunReport
from llmledger._run.api import apply_llm, apply_llm_async, resume
from llmledger._run.estimate import estimate
from llmledger._run.pipeline import pipeline
from llmledger._run.review import review
from llmledger._run.run import Run, last_report
from llmledger._run.worker import work
from llmledger._step.models import ModelRetiringWarning, models
from llmledger._step.prices import UnknownPriceWarning, prices, set_price
from llmledger._step.request import fingerprint
from llmledger._version import __version__
from llmledger._view.accuracy import Accuracy, accuracy
from llmledger._view.comparison import Comparison, compare
from llmledger._view.overview import StoreView, show
from llmledger.errors import (
    AuthenticationFailed,
    BudgetReachedWarning,
    CommitUnknown,
    InvalidInputError,
    KeyColumnError,
    LedgerError,
    ModelNotFound,
    OutageError,
    PromptError,
    RequestRefused,
    RetryRefused,
    RunningElsewhereWarning,
    RunStopped,
    SpendLimitReached,
    StaleAnswersWarning,
    StepNameError,
    StoreBusy,
    StoreError,
    StoreNotFound,
    WhereClauseError,
)
from llmledger.simulator import Simulator, simulate

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_STORE",
    "DEFAULT_TABLE",
    "Accuracy",
    "AuthenticationFailed",
    "BudgetReachedWarning",
    "CommitUnknown",
    "Comparison",
    "InvalidInputError",
    "KeyColumnError",
    "LedgerError",
    "ModelNotFound",
    "ModelRetiringWarning",
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
    "RunningElsewhereWarning",
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
    "accept",
    "accuracy",
    "apply_llm",
    "apply_llm_async",
    "compare",
    "copy",
    "correct",
    "estimate",
    "export",
    "fingerprint",
    "flag",
    "history",
    "last_report",
    "models",
    "pipeline",
    "prices",
    "progress",
    "reset",
    "restore",
    "resume",
    "review",
    "set_price",
    "show",
    "simulate",
    "sql",
    "undo_verdict",
    "verdicts",
    "work",
]
