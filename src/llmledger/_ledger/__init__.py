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

`open_ledger(store)` returns the one implementation of these verbs (`store.py`),
on a DuckDB file (`connection.py`) or, for a `postgresql://` URL, on a PostgreSQL
database (`postgres.py`): the SQL is written once. Claim liveness (`claims.py`) and the
write-ahead journal (`journal.py`) live here too because both are about
rows in the store, not about talking to the API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from .._request import RequestSpec, canonical_json
from ..errors import InvalidInputError
from .states import Redo
from .survey import Layout

if TYPE_CHECKING:
    from .._prompt import PromptPlan
    from .batches import BatchRecord, BatchRows
    from .budget import BudgetLook
    from .overview import Overview


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
        text = canonical_json({"request": self.request.to_json(), "prompt": self.prompt.text,
                               "kind": self.prompt.kind, "digest": self.prompt.digest})
        return hashlib.md5(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunParams:
    """What a run may take: the rules a claim checks, and `where`."""

    max_attempts: int
    redo: Redo
    run_started: datetime
    stale_before: datetime
    where: str | None = None
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
        return {"max_attempts": self.max_attempts, "redo": self.redo.value, "run_started": self.run_started,
                "version": version}


@dataclass(frozen=True)
class KnownAnswer:
    output: str
    stop_reason: str | None
    model: str


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
    reuse: bool = False
    lease: timedelta = timedelta(minutes=30)  # how long each claim stays the run's without renewal (RunParams)
    source: str | None = None  # the run's (RunParams.source)
    unsimulated: int = 0  # rows whose simulated answer this real run set aside, so they are asked for real
    dedupe: bool = True  # identical requests share one call; claims then take every twin of a row together

    @property
    def to_send(self) -> int:
        return self.pending if self.open_ended else self.work.height

    @property
    def remaining(self) -> int:
        return max(0, self.to_send - self.cursor)


class Ledger(Protocol):
    path: Path
    on_wait: Callable[[str], None] | None

    def prepare(self, definition: StepDefinition, frame: pl.DataFrame, params: RunParams, *,
                dedupe: bool, source: pl.DataFrame | None = None, inputs: bool = False,
                look: Callable[[Any, Selection], Any] | None = None) -> Any: ...
    def resume(self, table: str, step: str, params: RunParams, *, dedupe: bool,
               inputs: bool = False) -> Selection: ...
    def claim(self, selection: Selection, n: int, *, claimant: str, now: datetime) -> list[dict[str, Any]]: ...
    def commit(self, selection: Selection, results: pl.DataFrame, *, now: datetime,
               wait: float | None = None, settled: tuple[str, float] | None = None) -> None: ...
    def release(self, selection: Selection, *, claimant: str) -> int: ...
    def renew(self, selection: Selection, *, claimant: str, now: datetime) -> int: ...
    def recover(self, table: str, step: str, params: RunParams) -> int: ...
    def outputs(self, selection: Selection, frame: pl.DataFrame) -> pl.DataFrame: ...
    def record_run(self, row: dict[str, Any]) -> None: ...
    def spent(self, table: str, step: str) -> float: ...
    def reserve_budget(self, table: str, step: str, *, claimant: str, need_usd: float, want_usd: float,
                       budget_usd: float, now: datetime, stale_after: timedelta) -> BudgetLook: ...
    def begin_batch(self, layout: Layout, assigned: pl.DataFrame, *, intent: str, claimant: str, requests: int,
                    size: int, model: str, version: str, validated: bool, now: datetime,
                    source: str | None = None) -> None: ...
    def confirm_batch(self, table: str, step: str, *, intent: str, batch_id: str, now: datetime,
                      adopted: bool = False) -> int | None: ...
    def reject_batch(self, batch: BatchRecord, *, note: str) -> int: ...
    def attach_to_batch(self, layout: Layout, assigned: pl.DataFrame, *, batch_id: str, claimant: str,
                        validated: bool, source: str | None = None) -> int: ...
    def requests_in_batches(self, table: str, step: str) -> dict[str, str]: ...
    def abandon_batch(self, table: str, step: str, *, intent: str, note: str, now: datetime,
                      confirmed: bool = False) -> pl.DataFrame: ...
    def open_batches(self, table: str, step: str) -> list[BatchRecord]: ...
    def unsettled_batches(self) -> list[BatchRecord]: ...
    def known_batch_ids(self) -> set[str]: ...
    def batch_rows(self, batch: BatchRecord, *, inputs: bool = False) -> BatchRows: ...
    def merge_batch(self, batch: BatchRecord, layout: Layout, results: pl.DataFrame, *, counts: dict[str, int],
                    processing_status: str, ended_at: datetime | None, now: datetime, expected_rows: int,
                    unused: tuple[int, float] = (0, 0.0)) -> pl.DataFrame | None: ...
    def counts(self, table: str | None = None) -> pl.DataFrame: ...
    def overview(self, table: str | None = None) -> Overview: ...
    def downstream_stale(self, table: str, step: str) -> dict[str, int]: ...
    def history(self, table: str, step: str, key: Any = None) -> pl.DataFrame: ...
    def migrated(self) -> None: ...
    def flag(self, table: str, step: str, *, where: str, reason: str, by: str, now: datetime) -> int: ...
    def reset(self, table: str, step: str, *, where: str, now: datetime,
              running_stale_after: timedelta | None = None) -> int: ...
    def query(self, sql: str, params: Any = None, *, wait: float = 60.0) -> pl.DataFrame | None: ...
    def steps(self, table: str | None = None) -> list[tuple[str, str, list[str]]]: ...


Store = Path | str  # a DuckDB file, or a PostgreSQL URL ("postgresql://user@host:5432/db")


def locate(store: str | Path, *, must_exist: bool = False) -> Store:
    """A `store=` argument as the ledger opens it, checked: a DuckDB file path, or a PostgreSQL URL as given.

    A path that is a directory or another kind of file is refused; with `must_exist`, so is a store
    without a ledger (for PostgreSQL this connects to find out).
    """
    from .connection import check_store_path
    from .postgres import PgConnection, _psycopg, is_url

    if is_url(store):
        _psycopg()
        if must_exist:
            PgConnection(str(store)).check(must_exist=True)
        return str(store)
    if not isinstance(store, str | Path):
        raise InvalidInputError(f"store must be a DuckDB file path or a postgresql:// URL, got {store!r}")
    path = Path(store).expanduser()
    check_store_path(path, must_exist=must_exist)
    return path


def open_existing(store: str | Path) -> Ledger:
    """The ledger in `store`, which must hold one (StoreNotFound otherwise), checked on the connection it is
    then used through (a PostgreSQL store is not connected to twice)."""
    ledger = open_ledger(locate(store))
    ledger.conn.check(must_exist=True)  # type: ignore[attr-defined]
    return ledger


def shown(store: str | Path) -> str:
    """A store as messages name it: a PostgreSQL URL without its password, a path as it is."""
    from .postgres import is_url, redacted

    return redacted(str(store)) if is_url(store) else str(store)


def known_steps(store: str | Path, table: str) -> list[str]:
    """The steps a store has on `table` (none when the store does not exist yet), without writing anything."""
    return known_table(store, table)[0]


def known_table(store: str | Path, table: str) -> tuple[list[str], list[str]]:
    """The steps and the columns a store's `table` has (none when the store or table does not exist yet),
    read without writing anything: what a new step's name is checked against before a call writes."""
    from .connection import column_types, table_exists
    from .schema import list_steps

    location = locate(store)
    if isinstance(location, Path) and not location.exists():
        return [], []
    ledger = open_ledger(location)
    with ledger.conn.open(wait=60.0, read_only=True) as con:  # type: ignore[attr-defined]
        alike = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                           "current_schema()").fetchall() if t.lower() == table.lower() and t != table]
        if alike:  # DuckDB takes them for one table, PostgreSQL for two: neither is what was meant
            raise InvalidInputError(f"table {table!r} differs only in case from the store's table {alike[0]!r}; "
                                    f"pass table={alike[0]!r}, or a name of its own")
        steps = [step for _, step, _ in list_steps(con, table)]
        columns = list(column_types(con, table)) if table_exists(con, table) else []
    return steps, columns


def stored_outputs(store: str | Path, table: str) -> dict[str, Any]:
    """Each step of a store's `table` and the structured output (`OutputSpec`) its current definition asks for,
    None for text answers; read without writing (a pipeline checks the fields its templates read against it)."""
    from .connection import table_exists
    from .schema import STEPS_TABLE, current_output_spec, list_steps

    location = locate(store)
    if isinstance(location, Path) and not location.exists():
        return {}
    ledger = open_ledger(location)
    with ledger.conn.open(wait=60.0, read_only=True) as con:  # type: ignore[attr-defined]
        if not table_exists(con, STEPS_TABLE):
            return {}
        return {step: current_output_spec(con, table, step) for _, step, _ in list_steps(con, table)}


def open_ledger(store: str | Path, *, on_wait: Callable[[str], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> Ledger:
    from .connection import Connection
    from .postgres import PgConnection, is_url
    from .store import SQLLedger

    if is_url(store):
        return SQLLedger(PgConnection(str(store), on_wait=on_wait, should_stop=should_stop))
    return SQLLedger(Connection(store, on_wait=on_wait, should_stop=should_stop))


__all__ = [
    "KnownAnswer",
    "Layout",
    "Ledger",
    "RunParams",
    "Selection",
    "StepDefinition",
    "Store",
    "known_table",
    "locate",
    "open_existing",
    "open_ledger",
]
