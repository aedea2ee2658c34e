"""A PostgreSQL connection cut while its COMMIT is on the way: landed or not, the run neither writes twice nor stops.

Such a cut (a server crash, a network drop, a failover) leaves the client not knowing whether the transaction
committed. The cut here is made exactly there, on a real server: the session's own backend is terminated
(`pg_terminate_backend`) either just after the COMMIT was executed (it landed; the client sees the connection
drop) or just before (it did not land). A seeded share of every COMMIT of a whole run is cut so, and the run must
finish with every row answered once.

A crash as the COMMIT goes is another matter: recovery forgets what was not made durable, and may hand the same
transaction id to another client, whose fate `txid_status` would then report. There the answer is `CommitUnknown`,
never "landed" on another's word, except for work that may be done twice (a run's row, a heartbeat).
"""

from __future__ import annotations

import random
from typing import Any

import anthropic
import psycopg
import pytest

import llmledger
from llmledger import Simulator
from llmledger._ledger.engine.postgres import PgConnection

from .conftest import frame

pytestmark = pytest.mark.slow


class _CutAtCommit:
    """A psycopg connection whose COMMITs are cut (`cut()` says which, and whether after or before it lands)."""

    def __init__(self, raw: Any, admin_url: str, cut: Any) -> None:
        self._raw, self._admin_url, self._cut = raw, admin_url, cut

    def _terminate(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [self._raw.info.backend_pid])

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        how = self._cut() if query == "COMMIT" else None
        if callable(how):  # e.g. crash the server
            how()
        elif how == "after":
            self._raw.execute(query)
            self._terminate()
            return self._raw.execute("SELECT 1")  # the acknowledgement never arrives: the connection is gone
        if how == "before":
            self._terminate()
        return self._raw.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _cutting(monkeypatch: pytest.MonkeyPatch, admin_url: str, cut: Any) -> list[str]:
    """Have every PostgreSQL store connection cut its COMMITs as `cut()` says; returns the cuts made."""
    made: list[str] = []
    connect = PgConnection._connection

    def record() -> str | None:
        how = cut()
        if how:
            made.append(how)
        return how

    monkeypatch.setattr(
        PgConnection, "_connection", lambda self, wait: _CutAtCommit(connect(self, wait), admin_url, record)
    )
    return made


@pytest.mark.parametrize("landed", [True, False])
def test_a_transaction_cut_at_its_commit_is_written_once(
    pg_server: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE t (n int)")
    cuts = iter(["after" if landed else "before"])
    made = _cutting(monkeypatch, pg_server.url(), lambda: next(cuts, None))
    db = PgConnection(pg_url)
    calls = []

    def work(con: Any) -> str:
        calls.append(1)
        con.execute("INSERT INTO t VALUES (1)")
        return "the work's result"

    assert db.transaction(work, wait=30.0) == "the work's result"
    assert made == ["after" if landed else "before"]
    assert len(calls) == (1 if landed else 2), "landed: asked of the server, not redone; lost: redone"
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (1,)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_whose_commits_are_cut_at_random_finishes_and_pays_each_row_once(
    pg_server: Any, pg_url: str, sim: Simulator, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """About two COMMITs in five are cut, half after they landed: claims, answers, the run's row, the release."""
    rng = random.Random(seed)
    made = _cutting(monkeypatch, pg_server.url(), lambda: rng.choice(["after", "before", None, None, None]))
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
    rows = 40
    out = llmledger.apply_llm(
        frame(rows),
        "s",
        prompt="A: {text}",
        store=pg_url,
        table="t",
        client=client,
        progress=False,
        concurrency=4,
        chunk_size=5,
    )
    assert len(made) >= 2, f"seed {seed} cut only {made}"
    assert out["s_status"].to_list() == ["DONE"] * rows
    assert sim.stats()["paid"] == rows and max(sim.paid_prompts().values()) == 1
    status = llmledger.sql(pg_url, "SELECT s_status, count(*) FROM t GROUP BY 1").rows()
    assert status == [("DONE", rows)]
    runs = llmledger.sql(pg_url, "SELECT outcome, calls FROM llmledger_runs").rows()
    assert runs == [("completed", rows)], runs


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_commit_cut_by_a_crash_is_never_taken_as_landed_on_another_transactions_word(
    pg_server: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch, idempotent: bool
) -> None:
    """The server crashes as the COMMIT is sent, and after recovery another client commits first (taking, as found
    by an attack, the lost transaction's id). Not idempotent: `CommitUnknown`, and nothing written; idempotent:
    redone, written once."""
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("CREATE TABLE t (n int)")
        con.execute("CREATE TABLE other (n int)")
        con.execute("CHECKPOINT")

    def crash() -> None:
        pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "immediate", "-w", "stop")
        pg_server.start()
        with psycopg.connect(pg_url, autocommit=True) as other:
            for n in range(5):
                other.execute("INSERT INTO other VALUES (%s)", [n])

    cuts = iter([crash])
    _cutting(monkeypatch, pg_server.url(), lambda: next(cuts, None))
    db = PgConnection(pg_url)

    def work(con: Any) -> str:
        con.execute("INSERT INTO t VALUES (1)")
        return "written"

    if idempotent:
        assert db.transaction(work, wait=60.0, idempotent=True) == "written"
    else:
        with pytest.raises(llmledger.CommitUnknown, match="restarted"):
            db.transaction(work, wait=60.0)
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (1 if idempotent else 0,)


def test_a_chunk_whose_commit_a_crash_cut_is_written_again_and_the_run_finishes(
    pg_server: Any, pg_url: str, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server crashes as the second chunk's COMMIT is sent: `CommitUnknown` inside the run, which keeps the
    chunk and writes it again in its next transaction where it did not land. Every row ends DONE, paid once."""
    import llmledger._ledger.ledger as ledger_module

    chunks: list[int] = []
    commit_results = ledger_module.commit_results

    def counted(*args: Any, **kwargs: Any) -> Any:
        chunks.append(1)
        return commit_results(*args, **kwargs)

    def crash() -> None:
        pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "immediate", "-w", "stop")
        pg_server.start()

    crashed: list[int] = []

    def cut() -> Any:
        if len(chunks) == 2 and not crashed:  # the second chunk's transaction is committing
            crashed.append(1)
            return crash
        return None

    monkeypatch.setattr(ledger_module, "commit_results", counted)
    _cutting(monkeypatch, pg_server.url(), cut)
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
    rows = 30
    out = llmledger.apply_llm(
        frame(rows), "s", prompt="A: {text}", store=pg_url, table="t", client=client, progress=False, chunk_size=5
    )
    assert crashed, "the crash came"
    assert out["s_status"].to_list() == ["DONE"] * rows
    assert sim.stats()["paid"] == rows and max(sim.paid_prompts().values()) == 1
    assert llmledger.sql(pg_url, "SELECT s_status, count(*) FROM t GROUP BY 1").rows() == [("DONE", rows)]
