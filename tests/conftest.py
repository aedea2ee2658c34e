"""Shared fixtures: a live simulator on 127.0.0.1, a real SDK client pointed at it, a store in tmp_path."""

from __future__ import annotations

import functools
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm

HELPERS = Path(__file__).parent / "helpers"
SMS_SPAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "sms_spam.tsv"


# Model ids tests invent (to change a request, or to price a model themselves): the simulator answers them as
# the API answers the models it has. Any other id it does not know a price for gets the API's 404.
TEST_MODELS = (
    "m",
    "m2",
    "claude-test-1",
    "claude-x",
    "claude-y",
    "claude-other",
    "claude-stops-test",
    "claude-house-model",
    "claude-budget-race",
    "claude-budget-test",
    "claude-from-the-future",
)


UNIT = Path(__file__).parent / "unit"


FLOORS = Path(__file__).parents[1] / ".ci" / "floors.txt"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`tests/unit/` is the fast tier: pure unit tests, marked `fast` (`pytest -m fast`). With LLMLEDGER_FLOORS=1
    (the lowest-versions pass of .ci/run), the tests .ci/floors.txt lists are left out: the others run every line
    of llmledger they run (`.ci/floors.py` says how that was found)."""
    for item in items:
        if UNIT in Path(item.path).parents:
            item.add_marker(pytest.mark.fast)
    if os.environ.get("LLMLEDGER_FLOORS") == "1":
        out = {line.strip() for line in FLOORS.read_text().splitlines() if line.strip() and line[0] != "#"}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in out])
        items[:] = [item for item in items if item.nodeid not in out]


@pytest.fixture(autouse=True)
def _named_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running test's id in LLMLEDGER_TEST_ID, which its subprocesses inherit: `.ci/floors.py` counts the lines
    of llmledger a CLI verb or worker runs as that test's (coverage's `context = ${LLMLEDGER_TEST_ID}`)."""
    monkeypatch.setenv("LLMLEDGER_TEST_ID", request.node.nodeid)
    # Each test starts as a fresh process would: the unknown-price warning comes once per model and process, so
    # an earlier test on the same xdist worker using a model would otherwise silence it here.
    monkeypatch.setattr("llmledger._step.prices._warned", set())


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(models=TEST_MODELS) as s:
        yield s


@pytest.fixture
def client(sim: Simulator) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")


def _http_library() -> Any:
    """The HTTP library the anthropic SDK is built on (httpx, or its successor in newer SDKs)."""
    made = anthropic.DefaultAsyncHttpxClient
    name = next(c.__module__.split(".")[0] for c in made.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(name)


def real_api_client(sim: Simulator, **options: Any) -> anthropic.AsyncAnthropic:
    """A client of Anthropic's own API (its default URL) whose requests the simulator on `sim.port` answers: to
    llmledger it is the real API (its requests name no endpoint, its answers' source is that URL, batches are
    sent), answered offline."""
    library = _http_library()

    class ToSimulator(library.AsyncBaseTransport):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.inner = library.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=sim.port)
            return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    http_client = anthropic.DefaultAsyncHttpxClient(transport=ToSimulator())
    return anthropic.AsyncAnthropic(api_key="test-key", http_client=http_client, max_retries=0, **options)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One PostgreSQL server for the whole session (Debian's postgresql package, started in a temp dir)."""
    from .helpers.postgres import Server, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("needs PostgreSQL's server: apt-get install -y postgresql (.ci/run installs it)")
    pytest.importorskip("psycopg", reason="needs psycopg 3: pip install -e '.[dev]'")
    server = Server(bindir)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """A fresh, empty database on that server: the URL a user passes as store=."""
    return pg_server.new_database()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "test.duckdb"


@pytest.fixture(params=["duckdb", "postgresql"])
def target(request: pytest.FixtureRequest, store: Path) -> Any:
    """A store on each engine in turn: the DuckDB file of `store`, then a fresh PostgreSQL database."""
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else store


@pytest.fixture
def run(client: anthropic.AsyncAnthropic, store: Path) -> Any:
    """apply_llm with the test client, store and table filled in, and no progress bar."""
    return functools.partial(apply_llm, client=client, store=store, table="messages", progress=False)


def frame(n: int, *, start: int = 0, word: str = "hello") -> pl.DataFrame:
    return pl.DataFrame(
        {"id": list(range(start, start + n)), "text": [f"{word} message number {i}" for i in range(start, start + n)]}
    )


def in_a_batch(store: Path, table: str = "messages", step: str = "summary") -> bool:
    """Whether the ledger, read between another process's commits, has rows of the step in a batch: the moment
    to kill that process "while it waits for its batch" (a fixed 0.3 s after the API took the batch was too short
    for the ledger to record its id, on a loaded CI machine)."""
    try:
        found = llmledger.sql(store, f"SELECT count(*) AS n FROM {table} WHERE {step}_status = 'SUBMITTED'")
    except (llmledger.StoreNotFound, llmledger.InvalidInputError, duckdb.Error):  # not made yet, or its table
        return False
    return found is not None and found["n"].item() > 0


def sql(store: Path, query: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(store), read_only=True) as con:
        return con.execute(query).fetchall()


def hold_store(store: Path, seconds: float, *, read_only: bool = False) -> subprocess.Popen[str]:
    """Another process holding the DuckDB file `store` for `seconds` (read-only or read-write): a notebook with a
    connection left open. Returns once it holds the file."""
    script = (
        "import duckdb, sys, time; con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == 'ro'); "
        "print('held', flush=True); time.sleep(float(sys.argv[3]))"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(store), "ro" if read_only else "rw", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def subprocess_env(base_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ANTHROPIC_API_KEY", None)
    env["ANTHROPIC_BASE_URL"] = base_url
    env["OPENAI_BASE_URL"] = base_url + "/v1"  # the simulator's OpenAI routes, for a step on an OpenAI model
    env["OPENAI_API_KEY"] = "test-key"
    env["LLMLEDGER_TEST_KEY"] = "test-key"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def sigint_as_a_terminal_sends_it() -> None:
    """preexec_fn for a child a test will Ctrl-C: a suite started as a background job (`nohup ... &`) ignores
    SIGINT, and its children would inherit that; a user's terminal never does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def journals_left(store: Path) -> list[str]:
    """The journal files beside a DuckDB store (`journal_folder`): answers a commit could not put in the store,
    which the next run merges. A test that finds answers missing names them, to tell journaled from lost."""
    from llmledger._ledger.journal import journal_folder

    return sorted(p.name for p in journal_folder(Path(store)).glob("*"))


def helper_cmd(*args: str) -> list[str]:
    return [sys.executable, str(HELPERS / "run_step.py"), *args]


@pytest.fixture
def sms() -> pl.DataFrame:
    if not SMS_SPAM.exists():
        pytest.skip(f"{SMS_SPAM} is not here (it lives in the shared folder beside the project)")
    rows = [line.split("\t", 1) for line in SMS_SPAM.read_text(encoding="utf-8").splitlines() if "\t" in line]
    return pl.DataFrame({"label": [r[0] for r in rows], "text": [r[1] for r in rows]}).with_row_index("id")


@pytest.fixture(autouse=True)
def _dump_tasks_if_stuck(request: pytest.FixtureRequest) -> Iterator[None]:
    """Diagnostics: if a test runs for over 120 s, print the background loop's asyncio tasks."""
    import threading

    from llmledger._run import loop as _loop

    done = threading.Event()

    def watch() -> None:
        if not done.wait(120) and _loop._loop is not None:
            import asyncio

            print(f"\n--- {request.node.nodeid} is slow; llmledger loop tasks:", file=sys.stderr)
            for task in asyncio.all_tasks(_loop._loop):
                task.print_stack(file=sys.stderr)
            from llmledger._exec import scheduler

            for runner in list(scheduler.ACTIVE):
                print("scheduler", runner.debug_state(), "loop time", _loop._loop.time(), file=sys.stderr)
            import gc

            for obj in gc.get_objects():
                if isinstance(obj, Simulator):
                    log = obj.log()
                    print(
                        "sim",
                        obj.base_url,
                        obj.stats()["requests"],
                        obj.stats()["paid"],
                        "last:",
                        log[-3:] if log else None,
                        file=sys.stderr,
                    )

    threading.Thread(target=watch, daemon=True).start()
    yield
    done.set()
