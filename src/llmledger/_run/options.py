"""How a call runs, declared once: the options `apply_llm`, `resume`, `work` and the CLI's `run` and `worker` share.

`RunOptions` is the one place each of them has a type, a default and a check. The public functions repeat the
names in their signatures (so editors, type checkers and `help()` see them) with the defaults read here, which a
test holds equal; `plan.plan_options` derives from a checked `RunOptions` the ledger's view of a run
(`RunParams`) and the senders' (`RunConfig`); the CLI prints and uses the defaults read here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from llmledger._exec.batch import MAX_REQUESTS
from llmledger._exec.config import RetryPolicy
from llmledger._ledger.where import check_where_shape
from llmledger.errors import InvalidInputError

Validator = Callable[[dict[str, Any], Any], str | None]
RedoOption = bool | Literal["all", "stale", "flagged"]
ModeOption = Literal["online", "batch", "auto", "flex"]

MAX_CHUNK = 1_000_000_000  # rows in one claim: a claim's rows are sliced by polars, whose offsets are 64-bit
MAX_STALE_AFTER = timedelta(days=3650)  # a claim older than this is a dead run's in any case
MAX_DEADLINE = timedelta(days=366)  # a batch ends within a day; a deadline further off than this is a slip
MAX_CONCURRENCY = 1_000  # the SDK's connection pool holds 1,000; more would only queue inside it


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a call runs, whichever step it runs. Frozen: checked once (`checked`), then only read.

    The options that say what a step *is* (prompt, model, output, ...) belong to `apply_llm` alone: they become the
    step's recorded request. These say how the rows that need an answer get one, and may differ from call to call.
    """

    where: str | None = None  # a SQL predicate over the fact table narrowing the rows
    redo: RedoOption = False  # which answered rows are asked again
    chunk_size: int = 200  # rows claimed and committed together
    concurrency: int = 16  # requests in flight at once
    max_attempts: int = 3  # tries per row before it is NEEDS_REVIEW
    stale_after: timedelta | float = timedelta(minutes=30)  # a claim not renewed for this long is a dead run's
    client: Any = None  # an anthropic.AsyncAnthropic, openai.AsyncOpenAI, ... (None: the provider's own API)
    base_url: str | None = None  # another server that speaks the API
    api_key: str | None = None  # its key
    gateway: bool = False  # that server forwards to the provider's own API
    progress: bool = True  # show the live view and the summary
    retry: RetryPolicy | None = None  # how hard to retry the API's own failures (None: `RetryPolicy()`)
    commit_every: float = 0.5  # seconds between commits of answers
    dedupe: bool = True  # rows with identical requests share one call
    background: bool = False  # return a `Run` handle at once
    validate: Validator | None = None  # callable(row, output) -> None | reason to review
    max_cost_usd: float | None = None  # stop starting requests once this much is spent
    budget_scope: Literal["run", "step"] = "run"  # what the budget counts: this run, or every run of the step
    mode: ModeOption = "online"  # online requests, batches (half price), "auto", or OpenAI's "flex" processing
    wait: bool = True  # batches: wait for them to end
    batch_size: int | None = None  # requests per batch (None: the API's most)
    deadline: datetime | timedelta | float | None = None  # mode="flex": when the rows must be answered by

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> RunOptions:
        """The run options among a call's arguments, by name (the others are the caller's own)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in arguments.items() if name in names})

    @property
    def stale(self) -> timedelta:
        """`stale_after` as a timedelta (seconds are taken too); `checked` has made sure it is one."""
        if isinstance(self.stale_after, timedelta):
            return self.stale_after
        return timedelta(seconds=float(self.stale_after))

    def checked(self) -> RunOptions:
        """`self`, once every option has a value it may have; else an `InvalidInputError` naming the value.

        What needs the step's API or server (batches there, the most requests in a batch) is checked by
        `plan.plan_options`, which knows them.
        """
        for name in ("chunk_size", "concurrency", "max_attempts", "batch_size"):
            value = getattr(self, name)
            if name == "batch_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        if self.chunk_size > MAX_CHUNK:
            raise InvalidInputError(f"chunk_size must be at most {MAX_CHUNK:,} rows, got {self.chunk_size:,}")
        if self.concurrency > MAX_CONCURRENCY:
            raise InvalidInputError(
                f"concurrency={self.concurrency:,} is more requests at once than one process can keep "
                f"going (each is a connection); pass at most {MAX_CONCURRENCY:,}, or run several "
                "workers (llmledger worker) on a PostgreSQL store"
            )
        for name in ("dedupe", "wait", "gateway", "background"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.redo, bool) and self.redo not in ("all", "stale", "flagged"):  # "all" is True (CLI)
            raise InvalidInputError(f"redo must be False, True (or 'all'), 'stale' or 'flagged', got {self.redo!r}")
        where = self.where
        if where is not None and (not isinstance(where, str) or not where.strip()):
            raise InvalidInputError(f"where must be a SQL predicate string such as \"label = 'spam'\", got {where!r}")
        check_where_shape(where)
        every = self.commit_every
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every < float("inf"):  # NaN too
            raise InvalidInputError(f"commit_every must be a positive number of seconds, got {every!r}")
        check_max_cost(self.max_cost_usd)
        if self.budget_scope not in ("run", "step"):
            raise InvalidInputError(
                f"budget_scope must be 'run' (this run's spending) or 'step' (every run of the "
                f"step so far), got {self.budget_scope!r}"
            )
        if self.mode not in ("online", "batch", "auto", "flex"):
            raise InvalidInputError(
                f"mode must be 'online', 'batch' (batches, half price), 'auto' or 'flex' (OpenAI's flex processing: "
                f"online at the batch price, slower), got {self.mode!r}"
            )
        if self.mode in ("online", "flex") and (self.wait is False or self.batch_size is not None):
            raise InvalidInputError(
                f"{'wait=False' if self.wait is False else 'batch_size'} applies to mode='batch' or "
                "'auto' (batches); an online run that returns at once is "
                "apply_llm(..., background=True)"
            )
        if self.mode == "batch" and self.max_cost_usd is not None:
            raise InvalidInputError(
                "max_cost_usd works with mode='online' (a batch is paid when it ends, so a run "
                "cannot stop it at a budget); see what a batch would cost with "
                "llmledger.estimate(...) first, or pass mode='online'"
            )
        self._check_stale_after()
        self._check_deadline()
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise InvalidInputError(f"retry must be a llmledger.RetryPolicy, got {self.retry!r}")
        if self.validate is not None and not callable(self.validate):
            raise InvalidInputError(f"validate must be a callable(row, output) -> None | str, got {self.validate!r}")
        return self

    def _check_stale_after(self) -> None:
        value = self.stale_after
        try:
            seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
        except (TypeError, ValueError):
            seconds = float("nan")
        if isinstance(value, bool) or not 0 < seconds <= MAX_STALE_AFTER.total_seconds():  # NaN, inf, year 9999
            raise InvalidInputError(
                f"stale_after must be positive and at most {MAX_STALE_AFTER.days:,} days (seconds or a timedelta), "
                f"got {value!r}"
            )

    def _check_deadline(self) -> None:
        value = self.deadline
        if value is None:
            return
        if self.mode not in ("flex", "batch"):
            raise InvalidInputError(
                f"deadline= works with mode='batch' (batches, then online for the rows they have not answered in "
                f"time) and mode='flex' (the flex tier, then the standard one); mode={self.mode!r} has none. "
                "Nothing was written."
            )
        at = self.deadline_at
        if at is None:
            raise InvalidInputError(
                f"deadline must be a datetime, a timedelta or seconds from now, in the future, got {value!r}"
            )
        if at > time.time() + MAX_DEADLINE.total_seconds():
            raise InvalidInputError(
                f"deadline must be at most {MAX_DEADLINE.days} days from now (a batch ends within a day), got "
                f"{value!r}; to have no deadline, leave deadline out. Nothing was written."
            )

    @property
    def deadline_at(self) -> float | None:
        """`deadline` as a Unix time (a naive datetime is the local time), or None when it is none or not one."""
        value, now = self.deadline, time.time()
        try:
            if isinstance(value, datetime):
                at = value.timestamp()
            elif isinstance(value, timedelta):
                at = now + value.total_seconds()
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy's numbers too
                at = now + float(value)
            else:
                return None
        except (OverflowError, ValueError, OSError):
            return None
        return at if math.isfinite(at) and at > now else None

    @property
    def requests_per_batch(self) -> int:
        return MAX_REQUESTS if self.batch_size is None else self.batch_size


DEFAULTS = RunOptions()  # what a call that names none of them runs with (the CLI's defaults too)


def check_max_cost(cost: Any) -> None:
    """`max_cost_usd=`: None, or a positive, finite number of dollars."""
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 < cost < float("inf")
    ):
        raise InvalidInputError(f"max_cost_usd must be a positive number of dollars, got {cost!r}")
