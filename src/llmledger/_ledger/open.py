"""Opening a store: a `store=` argument checked and located, a ledger opened on it (DuckDB or PostgreSQL), and
what a call reads of a store before it writes anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from llmledger._ledger.types import Ledger, Store
from llmledger.errors import InvalidInputError, PromptError


def locate(store: str | Path, *, must_exist: bool = False) -> Store:
    """A `store=` argument as the ledger opens it, checked: a DuckDB file path, or a PostgreSQL URL as given.

    A path that is a directory or another kind of file is refused; with `must_exist`, so is a store
    without a ledger (for PostgreSQL this connects to find out).
    """
    from llmledger._ledger.engine.duckdb import check_store_path
    from llmledger._ledger.engine.pgcon import _psycopg
    from llmledger._ledger.engine.postgres import PgConnection, is_url, not_a_store, pg_url

    if is_url(store):
        _psycopg()
        url = pg_url(str(store))
        if must_exist:
            PgConnection(url).check(must_exist=True)
        return url
    if not isinstance(store, str | Path):
        raise InvalidInputError(f"store must be a DuckDB file path or a postgresql:// URL, got {store!r}")
    if isinstance(store, str) and "://" in store:  # another scheme; " postgresql://", "jdbc:postgresql://" too
        raise not_a_store(store.strip())
    path = Path(store).expanduser()
    check_store_path(path, must_exist=must_exist)
    return path


def expect_store(store: Store) -> Callable[[], None]:
    """For a background run about to create a DuckDB store: readers of this process wait for it (see
    `engine.duckdb.expect_creation`). Returns what to call once it exists, or the run ended; a no-op for a store
    that exists already, or a PostgreSQL one."""
    from llmledger._ledger.engine.duckdb import expect_creation

    if isinstance(store, Path) and not store.exists():
        return expect_creation(store)
    return lambda: None


def open_existing(store: str | Path) -> Ledger:
    """The ledger in `store`, which must hold one (StoreNotFound otherwise), checked on the connection it is
    then used through (a PostgreSQL store is not connected to twice)."""
    ledger = open_ledger(locate(store))
    ledger.conn.check(must_exist=True)
    return ledger


def shown(store: str | Path) -> str:
    """A store as messages name it: a PostgreSQL URL without its password, a path as it is."""
    from llmledger._ledger.engine.postgres import is_url, redacted

    return redacted(str(store)) if is_url(store) else str(store)


def short_name(store: str | Path) -> str:
    """A store as a title names it: a PostgreSQL URL without its password, a DuckDB file by its file name."""
    from llmledger._ledger.engine.postgres import is_url, redacted

    return redacted(str(store)) if is_url(store) else Path(store).name


def db_errors() -> tuple[type[Exception], ...]:
    """The database errors a command line reports as a message instead of a traceback (both engines')."""
    from llmledger._ledger.engine.shared import db_errors as engine_errors

    return engine_errors()


def known_steps(store: str | Path, table: str) -> list[str]:
    """The steps a store has on `table` (none when the store does not exist yet), without writing anything."""
    return known_table(store, table)[0]


class TableLook(NamedTuple):
    """What a store's table has, read before a call writes (`known_table`)."""

    steps: list[str]
    columns: list[str]
    key: list[str]
    batched: list[str]  # its steps with batches not merged yet (a call on another step need not look for them)


def known_table(store: str | Path, table: str) -> TableLook:
    """The steps, the columns and the key a store's `table` has (none when the store or table does not exist yet),
    read without writing anything: what a new step's name is checked against before a call writes, and the key a
    call on the table that names no key= and has no `id` column takes; and which of its steps have batches open,
    read in the same open of the store (each open of a DuckDB file costs 15-30 ms)."""
    from llmledger._ledger.batches import OPEN_STATES
    from llmledger._ledger.engine.shared import column_types, table_exists
    from llmledger._ledger.schema import BATCHES_TABLE, list_steps

    location = locate(store)
    if isinstance(location, Path) and not location.exists():
        return TableLook([], [], [], [])
    ledger = open_ledger(location)
    with ledger.conn.open(wait=60.0, read_only=True) as con:
        alike = [
            t
            for (t,) in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            ).fetchall()
            if t.lower() == table.lower() and t != table
        ]
        if alike:  # DuckDB takes them for one table, PostgreSQL for two: neither is what was meant
            raise InvalidInputError(
                f"table {table!r} differs only in case from the store's table {alike[0]!r}; "
                f"pass table={alike[0]!r}, or a name of its own"
            )
        # The columns first, then the steps. On PostgreSQL each read sees what is committed when it runs, and a
        # run that adds a step commits its columns and its definition together: read in this order, a step's
        # columns are never seen without the step (which made a second run starting the same new step at that
        # moment refuse it as a clash with "input columns").
        columns = list(column_types(con, table)) if table_exists(con, table) else []
        recorded = list_steps(con, table)
        batched = (
            [
                step
                for (step,) in con.execute(
                    f"SELECT DISTINCT step FROM {BATCHES_TABLE} WHERE table_name = ? AND state IN {OPEN_STATES}",
                    [table],
                ).fetchall()
            ]
            if table_exists(con, BATCHES_TABLE)
            else []
        )
    return TableLook([step for _, step, _ in recorded], columns, list(recorded[0][2]) if recorded else [], batched)


def stored_outputs(store: str | Path, table: str) -> dict[str, Any]:
    """Each step of a store's `table` and the structured output (`OutputSpec`) its current definition asks for,
    None for text answers; read without writing (a pipeline checks the fields its templates read against it)."""
    return {step: None if r is None else r.output_spec() for step, r in stored_requests(store, table).items()}


def stored_requests(store: str | Path, table: str) -> dict[str, Any]:
    """Each step of a store's `table` and the request (`RequestSpec`, without a row's message) its current
    definition sends, None for a step apply_llm has not prepared; read without writing."""
    from llmledger._ledger.engine.shared import table_exists
    from llmledger._ledger.schema import STEPS_TABLE, current_version, list_steps, schema_version
    from llmledger._step.request import RequestSpec

    location = locate(store)
    if isinstance(location, Path) and not location.exists():
        return {}
    ledger = open_ledger(location)
    with ledger.conn.open(wait=60.0, read_only=True) as con:
        if not table_exists(con, STEPS_TABLE) or schema_version(con) < 2:  # 0.1.0 stored no requests
            return {}
        found = {step: current_version(con, table, step) for _, step, _ in list_steps(con, table)}
    return {step: None if f is None else RequestSpec.from_json(f[1]) for step, f in found.items()}


def stale_condition(store: str | Path, table: str, step: str) -> str:
    """SQL over the fact table as `t`: the row's answer to `step` is stale, because its own request changed or
    because a step its prompt reads has a new answer since (what `redo="stale"` re-sends); read without writing."""
    from llmledger._ledger.graph import StepGraph

    with open_ledger(locate(store)).conn.open(wait=60.0, read_only=True) as con:
        return StepGraph.load(con, table, step).stale_sql(step)


def open_ledger(
    store: str | Path, *, on_wait: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None
) -> Ledger:
    from llmledger._step.prompt import RENDERING

    if RENDERING.get():
        raise PromptError(
            f"a callable prompt called llmledger on a store ({shown(store)}) while the run renders its rows: it "
            "runs inside the run's own transaction, so it would wait for itself for ever. Read what the prompt "
            "needs before the call (llmledger.sql(...) into a variable) and use that in the callable."
        )
    from llmledger._ledger.engine.duckdb import Connection
    from llmledger._ledger.engine.postgres import PgConnection, is_url
    from llmledger._ledger.ledger import SQLLedger

    if is_url(store):
        return SQLLedger(PgConnection(str(store), on_wait=on_wait, should_stop=should_stop))
    return SQLLedger(Connection(store, on_wait=on_wait, should_stop=should_stop))
