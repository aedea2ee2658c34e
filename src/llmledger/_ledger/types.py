"""The values the ledger's verbs take and give: a step's definition, a run's parameters, the selection a run
works through, a known answer, and the `Ledger` protocol those verbs form. No SQL and no connection here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from llmledger._ledger.states import Redo
from llmledger._ledger.survey import Layout
from llmledger._step.apis import ANTHROPIC
from llmledger._step.request import RequestSpec, canonical_json

if TYPE_CHECKING:
    from llmledger._step.prompt import PromptPlan


@dataclass(frozen=True)
class StepDefinition:
    """A step as one apply_llm call defines it: its request and how its prompts are made."""

    table: str
    step: str
    key: list[str]
    request: RequestSpec
    prompt: PromptPlan
    skip_nulls: tuple[str, ...] = ()  # columns whose nulls leave a row unsent (not part of the request)

    @cached_property
    def version(self) -> str:
        """Changes whenever the request or the prompt's definition changes."""
        text = canonical_json(
            {
                "request": self.request.to_json(),
                "prompt": self.prompt.text,
                "kind": self.prompt.kind,
                "digest": self.prompt.digest,
            }
        )
        return hashlib.md5(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunParams:
    """What a run may take: the rules a claim checks, and `where`."""

    max_attempts: int
    redo: Redo
    run_started: datetime
    stale_before: datetime
    where: str | None = None
    # the call's own where= names rows (not only skip_nulls=True's nulls): redo=True may then replace answers a
    # person accepted or wrote (states.eligible_sql)
    named: bool = False
    # Where this run's answers come from (`answer_source`): "simulator" or an endpoint's base URL. Simulated
    # answers never stand in for a real run's. None (a caller that does not say; runs always say): reuses real
    # answers only, and sets no simulated answer aside.
    source: str | None = None
    # How long this run's claims stay its own without a renewal (its `stale_after`). Each claim records its own
    # lease end, in the database's clock, so another run (with another clock or stale_after) judges it by that.
    lease: timedelta = timedelta(minutes=30)
    # apply_llm on the default table: a frame that would change the inputs of rows already answered there (another
    # dataset with the same keys, most likely) is refused, nothing written, instead of making their answers stale
    guard_inputs: bool = False

    def sql(self, version: str) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "redo": self.redo.value,
            "run_started": self.run_started,
            "version": version,
        }


@dataclass(frozen=True)
class KnownAnswer:
    output: str
    stop_reason: str | None
    model: str


@dataclass(frozen=True)
class Chunk:
    """A chunk a run committed: its results (the key and `RESULT_SCHEMA`) and the packs that carried them
    (`packs.PACK_SCHEMA`), kept until a later transaction sees it landed, to be written again in case the store
    lost its commit (`again.write_again`)."""

    results: pl.DataFrame
    packs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Selection:
    """The rows one run set out to send, and what it needs to claim them."""

    layout: Layout
    version: str
    requests: dict[str, RequestSpec]
    work: pl.DataFrame  # the keys to claim, in order
    params: dict[str, Any]
    key_types: dict[str, pl.DataType]
    stale: int = 0  # DONE rows answered for another request (left alone unless redo="stale")
    running_elsewhere: int = 0
    needs_review: int = 0
    waiting: int = 0  # rows that need an answer but wait for the steps they read
    unprepared: int = 0  # rows without a request for the current definition (resume cannot send them)
    in_batches: int = 0  # rows in Message Batches still processing (SUBMITTED)
    done_skipped: int = 0  # DONE rows the run leaves alone (what they cost is what rerunning them would)
    average_paid: float = 0.0  # the step's average paid answer as prepared (0.0 when none): a DONE row's worth
    known: dict[str, KnownAnswer] = field(default_factory=dict)  # answers to identical requests, by fingerprint
    survey: pl.DataFrame | None = None  # status and output per frame row when prepared
    inputs: list[str] = field(default_factory=list)  # input columns claims return (as "input.<name>")
    cursor: int = 0  # rows of `work` gone through by claims (open-ended: rows claimed)
    # Open-ended (PostgreSQL, from the store alone): claims take any eligible row of the step that matches
    # `where` straight from the table, so no list of keys is held and rows that come back (a lapsed claim)
    # are found; `pending` is how many there were when selected. `reuse`: claims look up answers to
    # identical requests for what they claim (as `known`, which they extend).
    open_ended: bool = False
    pending: int = 0
    where: str | None = None
    named: bool = False  # RunParams.named
    reuse: bool = False
    lease: timedelta = timedelta(minutes=30)  # how long each claim stays the run's without renewal (RunParams)
    source: str | None = None  # the run's (RunParams.source)
    unsimulated: int = 0  # rows whose simulated answer this real run set aside, so they are asked for real
    recovered: int = 0  # answers a dead run of this host had journaled, committed by this selection
    dedupe: bool = True  # identical requests share one call; claims then take every twin of a row together

    @property
    def to_send(self) -> int:
        return self.pending if self.open_ended else self.work.height

    @property
    def remaining(self) -> int:
        return max(0, self.to_send - self.cursor)

    @property
    def rows_per_request(self) -> int:
        """Rows one request of the current version carries: 1, or its pack size (`rows_per_request=`)."""
        sent = self.requests.get(self.version)
        return sent.rows_per_request if sent is not None else 1


class Ledger(Protocol):
    path: Path
    conn: Any  # the store: an `engine.Database` (`engine.duckdb.Connection` or `engine.postgres.PgConnection`)
    on_wait: Callable[[str], None] | None

    def prepare(
        self,
        definition: StepDefinition,
        frame: pl.DataFrame,
        params: RunParams,
        *,
        dedupe: bool,
        source: pl.DataFrame | None = None,
        inputs: bool = False,
        rehearse: bool = False,
    ) -> Any: ...
    def resume(self, table: str, step: str, params: RunParams, *, dedupe: bool, inputs: bool = False) -> Selection: ...
    def claim(
        self, selection: Selection, n: int, *, claimant: str, now: datetime, again: list[Chunk] | None = None
    ) -> list[dict[str, Any]]: ...
    def commit(
        self,
        selection: Selection,
        results: pl.DataFrame,
        *,
        now: datetime,
        wait: float | None = None,
        settled: tuple[str, float] | None = None,
        run: tuple[str, dict[str, Any]] | None = None,
        packs: list[dict[str, Any]] | None = None,
        again: tuple[str, list[Chunk]] | None = None,
    ) -> list[Chunk]: ...
    def release(self, selection: Selection, *, claimant: str, again: list[Chunk] | None = None) -> int: ...
    def renew(self, selection: Selection, *, claimant: str, now: datetime) -> int: ...
    def recover(self, table: str, step: str, params: RunParams) -> int: ...
    def outputs(self, selection: Selection, frame: pl.DataFrame) -> pl.DataFrame: ...
    def record_run(self, row: dict[str, Any]) -> None: ...
    def spent(self, table: str, step: str) -> float: ...
    def online_seconds(self, table: str, step: str) -> float | None: ...
    def hasten_batches(self, table: str, step: str, deadline: datetime) -> None: ...
    def reserve_budget(
        self,
        table: str,
        step: str,
        *,
        claimant: str,
        need_usd: float,
        want_usd: float,
        budget_usd: float,
        now: datetime,
        stale_after: timedelta,
        again: tuple[Layout, list[Chunk]] | None = None,
    ) -> BudgetLook: ...
    def begin_batch(
        self,
        layout: Layout,
        assigned: pl.DataFrame,
        *,
        intent: str,
        claimant: str,
        requests: int,
        size: int,
        model: str,
        version: str,
        validated: bool,
        now: datetime,
        source: str | None = None,
        packs: list[dict[str, Any]] | None = None,
        deadline: datetime | None = None,
    ) -> None: ...
    def batch_packs(self, table: str, step: str, intent: str) -> dict[str, dict[str, Any]]: ...
    def confirm_batch(
        self, table: str, step: str, *, intent: str, batch_id: str, now: datetime, adopted: bool = False
    ) -> int | None: ...
    def reject_batch(self, batch: BatchRecord, *, note: str) -> int: ...
    def attach_to_batch(
        self,
        layout: Layout,
        assigned: pl.DataFrame,
        *,
        batch_id: str,
        claimant: str,
        validated: bool,
        source: str | None = None,
    ) -> int: ...
    def requests_in_batches(self, table: str, step: str) -> dict[str, str]: ...
    def abandon_batch(
        self, table: str, step: str, *, intent: str, note: str, now: datetime, confirmed: bool = False
    ) -> pl.DataFrame: ...
    def open_batches(self, table: str, step: str) -> list[BatchRecord]: ...
    def unsettled_batches(self) -> list[BatchRecord]: ...
    def known_batch_ids(self) -> set[str]: ...
    def batch_rows(self, batch: BatchRecord, *, inputs: bool = False) -> BatchRows: ...
    def merge_batch(
        self,
        batch: BatchRecord,
        layout: Layout,
        results: pl.DataFrame,
        *,
        counts: dict[str, int],
        processing_status: str,
        ended_at: datetime | None,
        now: datetime,
        expected_rows: int,
        unused: tuple[int, float] = (0, 0.0),
        run: tuple[str, dict[str, Any]] | None = None,
        packs: list[dict[str, Any]] | None = None,
    ) -> pl.DataFrame | None: ...
    def counts(self, table: str | None = None) -> pl.DataFrame: ...
    def compare(self, table: str, steps: list[str], where: str | None = None) -> Any: ...
    def overview(self, table: str | None = None) -> Overview: ...
    def downstream_stale(self, table: str, step: str) -> dict[str, int]: ...
    def history(self, table: str, step: str, key: Any = None) -> pl.DataFrame: ...
    def row_and_history(
        self, table: str, step: str, sql: str, params: Any, key: Any
    ) -> tuple[pl.DataFrame | None, pl.DataFrame | None]: ...
    def migrated(self) -> None: ...
    def flag(self, table: str, step: str, *, where: str, reason: str, by: str, now: datetime) -> int: ...
    def judge(
        self,
        table: str,
        step: str,
        *,
        verdict: str,
        by: str,
        now: datetime,
        key: Any = None,
        where: str | None = None,
        reason: str | None = None,
        answer: Any = None,
        seen: tuple[str | None, Any, str | None] | None = None,
    ) -> int: ...
    def verdicts(self, table: str | None = None, step: str | None = None) -> pl.DataFrame: ...
    def answers(self, table: str, steps: list[str]) -> pl.DataFrame: ...
    def undo_verdict(self, table: str, step: str, *, key: Any, by: str, now: datetime) -> str | None: ...
    def reset(
        self, table: str, step: str, *, where: str, now: datetime, running_stale_after: timedelta | None = None
    ) -> int: ...
    def query(
        self, sql: str, params: Any = None, *, wait: float = 60.0, write: bool = False
    ) -> pl.DataFrame | None: ...
    def steps(self, table: str | None = None) -> list[tuple[str, str, list[str]]]: ...


Store = Path | str  # a DuckDB file, or a PostgreSQL URL ("postgresql://user@host:5432/db")
DEFAULT_STORE = "llmledger.duckdb"  # the store of a call that names none: a DuckDB file in the working folder
DEFAULT_TABLE = "ledger"  # the fact table of a call that names none


# -- what the batch, budget and overview verbs return ------------------------------------------------
@dataclass(frozen=True)
class BatchRecord:
    """One row of `llmledger_batches`: a batch this store sent (or meant to send)."""

    intent: str  # our id, the prefix of every custom id in the batch
    batch_id: str | None  # the API's id; None while only the intent is known
    table: str
    step: str
    claimant: str
    requests: int
    rows: int
    created_at: datetime
    state: str  # submitting, submitted, merged, abandoned
    version: str  # the step definition its requests were rendered for
    validated: bool  # sent by a run with validate=: merged only by a run that has it too
    adopted: bool  # its batch id was found by reconciliation, not told by the API: checked when merged
    rejected: list[str]  # batch ids reconciliation adopted wrongly (their results were another's)
    source: str | None = None  # where it was sent: "simulator" or the endpoint (None: sent before 0.8 recorded it)
    provider: str = ANTHROPIC  # whose batch API has it (its requests' provider): only that API's client reads it
    deadline: datetime | None = None  # when its rows must be answered by (UTC), if it was sent with a deadline


@dataclass
class BatchRows:
    """The rows a batch holds, with what merging its results needs."""

    layout: Layout
    rows: pl.DataFrame  # key columns, custom_id, attempts, was_done, input.<col>...
    requests: dict[str, RequestSpec]
    key_types: dict[str, pl.DataType]
    inputs: list[str]


@dataclass(frozen=True)
class BudgetLook:
    """What one reservation found and left: dollars the step has spent (in the ledger), reserved by other
    live runs, and now reserved by this run; `fits`: whether what the run needed could be reserved."""

    spent_usd: float
    others_usd: float
    held_usd: float
    fits: bool


@dataclass(frozen=True)
class ErrorKind:
    kind: str
    rows: int
    example_key: str  # the key of one row with this kind of error, as JSON
    example: str  # that row's whole error


@dataclass(frozen=True)
class Claims:
    """Rows one process holds (RUNNING), by its claim id (host/pid/run)."""

    claimed_by: str
    rows: int
    since: datetime | None  # the oldest claim (or lease renewal) among them


@dataclass
class StepOverview:
    table: str
    step: str
    counts: dict[str, int]  # by status, plus "stale", "waiting" (None-free) and "total"
    cost_usd: float = 0.0
    paid_rows: int = 0  # rows whose answer was paid for (reused answers cost 0)
    unpriced_rows: int = 0  # rows with an answer of no known cost (no price for the model, or no usage sent)
    spent_usd: float = 0.0  # what the step's runs paid in all (`llmledger_runs`): replaced answers, refusals too
    calls: int = 0  # the paid calls of those runs
    spent_unknown: bool = False  # some run paid calls of unknown cost (no known price, or no usage)
    claims: list[Claims] = field(default_factory=list)
    errors: list[ErrorKind] = field(default_factory=list)


@dataclass(frozen=True)
class BatchOverview:
    batch_id: str | None  # None while only the intent is recorded (being created)
    table: str
    step: str
    rows: int
    requests: int
    state: str
    processing_status: str | None
    submitted_at: datetime | None


@dataclass
class Overview:
    steps: list[StepOverview]
    batches: list[BatchOverview]
    tables: list[str]  # the store's tables but its bookkeeping (to name when it has no steps)
