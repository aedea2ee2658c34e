"""The ledger on a real PostgreSQL server: the same calls as on DuckDB, and many workers sharing one step.

Workers are real processes (`llmledger worker`) with the real SDK against the simulator. Each gets its own
LLMLEDGER_HOSTNAME, as workers on separate machines have: none can see whether another's process is alive,
so a killed worker's rows come back only when its claims stop being renewed and lapse.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import psycopg
import pydantic
import pytest

import llmledger
from llmledger import Simulator, apply_llm

from .conftest import frame, subprocess_env

pytestmark = pytest.mark.slow


class Verdict(pydantic.BaseModel):
    label: str
    score: float


def _pg(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as con:
        return con.execute(query).fetchall()


def test_apply_llm_on_postgresql_answers_like_duckdb_and_never_pays_twice(
    pg_url: str, tmp_path: Path, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    df = frame(30).with_columns(pl.col("text").str.replace(r"number (\d)\d$", "number $1"))  # duplicate prompts
    distinct = df["text"].n_unique()
    results = {}
    for name, store in (("postgresql", pg_url), ("duckdb", tmp_path / "same.duckdb")):
        sim.reset_stats()
        text = apply_llm(
            df, "summary", prompt="Summarise: {text}", store=store, table="m", client=client, progress=False
        )
        assert sim.stats()["paid"] == distinct, "identical requests share one paid call on either store"
        typed = apply_llm(
            df, "verdict", prompt="Judge: {text}", output=Verdict, store=store, table="m", client=client, progress=False
        )
        fed = apply_llm(df, "why", prompt="Why {verdict.label}?", store=store, table="m", client=client, progress=False)
        sim.reset_stats()
        again = apply_llm(
            df, "summary", prompt="Summarise: {text}", store=store, table="m", client=client, progress=False
        )
        assert sim.stats()["paid"] == 0 and again.equals(text), "a rerun pays nothing and returns the same frame"
        results[name] = (text, typed, fed)
    for pg_frame, duck_frame in zip(results["postgresql"], results["duckdb"], strict=True):
        assert pg_frame.equals(duck_frame), "the same frame, Structs included, comes back from either store"
    assert results["postgresql"][1].schema["verdict"] == pl.Struct({"label": pl.String, "score": pl.Float64})

    # structured answers are JSONB, queryable with plain SQL
    rows = llmledger.sql(
        pg_url, "SELECT verdict->>'label' AS label, (verdict->>'score')::float AS score FROM m ORDER BY id LIMIT 2"
    )
    assert rows is not None
    expected = results["duckdb"][1]["verdict"].struct.unnest().head(2)
    assert rows.rows() == expected.rows()

    # flag, redo, history and status work unchanged
    # rows 1 and 2 have ten twins each (same text, same answer): flagging them flags the twins too
    assert llmledger.flag(pg_url, "m", "summary", where="id < 3", reason="too short") == 23
    sim.reset_stats()
    apply_llm(
        df,
        "summary",
        prompt="Summarise: {text}",
        store=pg_url,
        table="m",
        client=client,
        progress=False,
        redo="flagged",
    )
    assert sim.stats()["paid"] == 3, "three distinct requests"
    history = llmledger.history(pg_url, "m", "summary")
    assert sorted(history["id"].to_list()) == [0, 1, 2, *range(10, 30)]
    assert set(history["reason"].to_list()) == {"flagged: too short"}
    progress = llmledger.progress(pg_url, "m")
    assert progress.select("step", "total").rows() == [("summary", 30), ("verdict", 30), ("why", 30)]
    assert [r["DONE"] + r["stale"] for r in progress.iter_rows(named=True)] == [30, 30, 30]


def _worker(url: str, sim: Simulator, host: str, *, stale_after: float = 60.0) -> subprocess.Popen[str]:
    env = subprocess_env(sim.base_url) | {"ANTHROPIC_API_KEY": "test-key", "LLMLEDGER_HOSTNAME": host}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmledger",
            "worker",
            url,
            "--table",
            "m",
            "--step",
            "summary",
            "--concurrency",
            "4",
            "--chunk-size",
            "8",
            "--poll",
            "0.3",
            "--stale-after",
            str(stale_after),
            "--quiet",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _prepared(url: str, client: anthropic.AsyncAnthropic, rows: int) -> None:
    """The step recorded with every row's request, nothing sent: the work the workers share."""
    apply_llm(
        frame(rows),
        "summary",
        prompt="Summarise: {text}",
        store=url,
        table="m",
        client=client,
        where="false",
        progress=False,
    )


def _done(url: str) -> int:
    try:
        return _pg(url, "SELECT count(*) FROM m WHERE summary_status = 'DONE'")[0][0]
    except psycopg.errors.UndefinedTable:  # not prepared yet
        return 0


def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _finish(workers: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for w in workers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0, out
        outputs.append(out)
    return outputs


def test_four_workers_share_a_step_and_a_late_one_joins_in(
    pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    rows = 240
    _prepared(pg_url, client, rows)
    sim.configure(latency=0.2)
    sim.reset_stats()
    workers = [_worker(pg_url, sim, f"machine-{i}") for i in range(3)]
    _wait_until(lambda: _done(pg_url) >= 24, 60, "the first answers")
    # The late worker must find work left however long its start takes on a loaded machine: answers slow down
    # until it holds a claim, then speed up again.
    sim.configure(latency=2.0)
    workers.append(_worker(pg_url, sim, "machine-late"))
    _wait_until(
        lambda: _pg(pg_url, "SELECT count(*) FROM m WHERE summary_claimed_by LIKE 'machine-late/%'")[0][0] > 0,
        90,
        "the late worker's first claim",
    )
    sim.configure(latency=0.2)
    _finish(workers)
    assert _done(pg_url) == rows
    assert sim.stats()["paid"] == rows, "no row was paid twice"
    assert _pg(pg_url, "SELECT count(*) FROM llmledger_history")[0][0] == 0, "no answer was ever overwritten"
    calls = dict(
        _pg(
            pg_url,
            "SELECT split_part(claimant, '/', 1), sum(calls) FROM llmledger_runs WHERE entry = 'resume' GROUP BY 1",
        )
    )
    assert sum(calls.values()) == rows
    assert all(calls.get(f"machine-{i}", 0) > 0 for i in range(3)), calls
    assert calls.get("machine-late", 0) > 0, f"the worker started late did work: {calls}"


def test_a_killed_workers_rows_are_finished_by_the_others_once_its_lease_lapses(
    pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    rows, stale_after = 200, 3.0
    _prepared(pg_url, client, rows)
    sim.configure(latency=0.1)
    sim.reset_stats()
    workers = [_worker(pg_url, sim, f"machine-{i}", stale_after=stale_after) for i in range(4)]
    victim = workers.pop(0)

    def held() -> list[int]:
        return [
            r[0]
            for r in _pg(
                pg_url, "SELECT id FROM m WHERE summary_status = 'RUNNING' AND summary_claimed_by LIKE 'machine-0/%'"
            )
        ]

    _wait_until(lambda: _done(pg_url) >= 30 and len(held()) > 0, 60, "the victim to hold claims")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    orphaned = held()
    killed_at = time.monotonic()
    assert orphaned, "the killed worker held rows"
    time.sleep(stale_after / 2)
    assert set(held()) == set(orphaned), "a lease that has not lapsed yet is not taken"
    _finish(workers)
    assert time.monotonic() - killed_at >= stale_after
    assert _done(pg_url) == rows, "every row is DONE, the killed worker's included"
    assert _pg(pg_url, "SELECT count(*) FROM llmledger_history")[0][0] == 0, "no row was answered twice"
    lost = sim.stats()["paid"] - rows
    # answered but not committed: the chunk of 8 it was committing when killed, and, on a loaded machine, answers
    # that came in while that commit was under way (the next chunk filling): at most two chunks
    assert 0 <= lost <= 4 + 2 * 8, (
        f"only what the killed worker had in flight (4) or answered but not committed yet "
        f"(a chunk being committed and the next filling, 16) is paid again; {lost} were"
    )


def test_a_run_survives_a_database_restart_without_losing_answers(
    pg_server: Any, pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    rows = 120
    sim.configure(latency=0.05)
    run = apply_llm(
        frame(rows),
        "summary",
        prompt="Summarise: {text}",
        store=pg_url,
        table="m",
        client=client,
        concurrency=4,
        chunk_size=10,
        progress=False,
        background=True,
    )
    _wait_until(lambda: _done(pg_url) >= 20, 60, "the first commits")
    pg_server.restart()  # every connection is cut; the server is down for a moment
    assert not run.done, "the restart came in the middle of the run"
    out = run.wait(timeout=120)
    assert run.report.outcome.value == "completed", run.report.message
    assert _done(pg_url) == rows and out["summary_status"].to_list() == ["DONE"] * rows
    assert sim.stats()["paid"] == rows, "answers that arrived while the database was down were kept, not re-bought"


def test_cli_reads_a_postgresql_store(pg_url: str, client: anthropic.AsyncAnthropic, sim: Simulator) -> None:
    apply_llm(frame(5), "summary", prompt="Summarise: {text}", store=pg_url, table="m", client=client, progress=False)
    env = subprocess_env(sim.base_url)
    out = subprocess.run(
        [sys.executable, "-m", "llmledger", "status", pg_url], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout and "5" in out.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "llmledger", "status", pg_url.rsplit("/", 1)[0] + "/nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "nope" in missing.stderr + missing.stdout


def test_a_store_url_without_psycopg_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(llmledger.StoreError, match=r"pip install 'llmledger\[postgresql\]'"):
        llmledger.progress("postgresql://nobody@127.0.0.1:1/none")


def test_copy_moves_a_ledger_to_postgresql_and_back_with_everything_in_it(
    pg_url: str, tmp_path: Path, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    duck, back = tmp_path / "first.duckdb", tmp_path / "back.duckdb"
    df = frame(20)

    def both(store: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
        text = apply_llm(
            df, "summary", prompt="Summarise: {text}", store=store, table="m", client=client, progress=False
        )
        typed = apply_llm(
            df, "verdict", prompt="Judge: {text}", output=Verdict, store=store, table="m", client=client, progress=False
        )
        return text, typed

    first = both(duck)
    llmledger.flag(duck, "m", "summary", where="id < 2", reason="vague")
    apply_llm(
        df, "summary", prompt="Summarise: {text}", store=duck, table="m", client=client, progress=False, redo="flagged"
    )
    llmledger.flag(duck, "m", "verdict", where="id = 5", reason="check me")  # a flag not acted on yet
    first = both(duck)
    usage = "SELECT sum(summary_cost_usd), sum(summary_input_tokens), count(verdict_flag) FROM m"

    copied = llmledger.copy(duck, pg_url)
    assert copied["m"] == 20 and copied["llmledger_history"] == 2
    cli = subprocess.run(
        [sys.executable, "-m", "llmledger", "copy", pg_url, str(back)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(sim.base_url),
    )
    assert cli.returncode == 0 and "m (20 rows)" in cli.stdout, cli.stderr
    for store in (pg_url, back):
        assert llmledger.progress(store).equals(llmledger.progress(duck))
        (cost, tokens, flags), (cost_there, tokens_there, flags_there) = (
            llmledger.sql(s, usage).row(0)  # type: ignore[union-attr]
            for s in (store, duck)
        )  # each engine sums the same costs in its own order: equal to the last bits of a double
        assert cost == pytest.approx(cost_there, rel=1e-12) and (tokens, flags) == (tokens_there, flags_there)
        assert llmledger.history(store, "m", "summary").equals(llmledger.history(duck, "m", "summary"))
        sim.reset_stats()
        again = both(store)
        assert sim.stats()["paid"] == 0, f"{store}: nothing copied is paid for again"
        assert again[0].equals(first[0]) and again[1].equals(first[1]), "the same answers, Structs included"
        apply_llm(
            df,
            "verdict",
            prompt="Judge: {text}",
            output=Verdict,
            store=store,
            table="m",
            client=client,
            progress=False,
            redo="flagged",
        )
        assert sim.stats()["paid"] == 1, "the flag came along"

    with pytest.raises(llmledger.InvalidInputError, match="already holds a ledger"):
        llmledger.copy(duck, back)


def test_bad_input_on_postgresql_writes_nothing(pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(llmledger.WhereClauseError, match="no_such_column"):
        apply_llm(
            frame(3),
            "summary",
            prompt="Summarise: {text}",
            store=pg_url,
            table="m",
            client=client,
            where="no_such_column > 1",
            progress=False,
        )
    tables = _pg(pg_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
    assert tables == [(0,)] and sim.stats()["requests"] == 0, "not even the bookkeeping tables were created"
    figures = llmledger.estimate(frame(3), "summary", prompt="Summarise: {text}", store=pg_url, table="m")
    assert figures.select("to_send", "calls").row(0) == (3, 3)
    assert _pg(pg_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'") == [(0,)]


def test_message_batches_on_postgresql(pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic) -> None:
    out = apply_llm(
        frame(12),
        "summary",
        prompt="Summarise: {text}",
        store=pg_url,
        table="m",
        client=client,
        mode="batch",
        progress=False,
    )
    assert out["summary_status"].to_list() == ["DONE"] * 12
    stats = sim.stats()
    assert (stats["batches"], stats["batch_paid"], stats["paid"]) == (1, 12, 12), "one batch; every row paid in it"
    assert _pg(pg_url, "SELECT state, succeeded FROM llmledger_batches") == [("merged", 12)]


def test_export_reads_a_postgresql_store(pg_url: str, tmp_path: Path, client: anthropic.AsyncAnthropic) -> None:
    apply_llm(frame(4), "summary", prompt="Summarise: {text}", store=pg_url, table="m", client=client, progress=False)
    folder = llmledger.export(pg_url, "m", tmp_path / "archive")
    exported = pl.read_parquet(folder / "m.parquet").sort("id")
    stored = llmledger.sql(pg_url, "SELECT summary FROM m ORDER BY id")
    assert stored is not None and exported["summary"].to_list() == stored["summary"].to_list()
    assert exported["summary_status"].to_list() == ["DONE"] * 4
    restored = tmp_path / "restored.duckdb"
    assert llmledger.restore(folder, restored) == "m"
    assert llmledger.progress(restored).equals(llmledger.progress(pg_url))
    with pytest.raises(llmledger.InvalidInputError, match="llmledger copy"):
        llmledger.restore(folder, pg_url)


def test_input_columns_of_every_kind_are_stored_as_on_duckdb(
    pg_url: str, tmp_path: Path, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    import datetime as dt

    df = pl.DataFrame(
        {
            "id": [1, 2, 3],
            "text": ["", None, 'comma, "quote"\nnew line é'],
            "score": [1.5, None, 1e-20],
            "ok": [True, None, False],
            "day": [dt.date(2026, 1, 2), None, dt.date(1999, 12, 31)],
            "at": [dt.datetime(2026, 1, 2, 3, 4, 5, 678901), None, dt.datetime(2000, 1, 1)],
            "tags": [["a", "b"], None, []],
            "vec": [[0.5, -1.25], [1e-9], None],
        }
    )
    stored = []
    for store in (pg_url, tmp_path / "kinds.duckdb"):
        sim.reset_stats()
        for _ in range(2):
            apply_llm(
                df,
                "summary",
                prompt="{text}|{score}|{ok}|{day} is 100% {text}",
                store=store,
                table="m",
                client=client,
                progress=False,
                system="Be 50% brief",
                where="text LIKE '%e%' OR true",
            )
        assert sim.stats()["paid"] == 3, "a % in a prompt, a system prompt or where= is just a character"
        found = llmledger.sql(
            store,
            'SELECT id, text, score, ok, day, "at", tags, vec, summary_prompt, '
            "CAST(summary_request_fingerprint AS VARCHAR) AS fp FROM m ORDER BY id",
        )
        assert found is not None
        stored.append(found)
    assert stored[0].equals(stored[1]), "the same values, prompts and fingerprints on either store"
    assert stored[0]["text"].to_list() == df["text"].to_list(), "an empty string stays empty, a null stays null"


def test_a_claim_skips_rows_another_worker_is_claiming_instead_of_waiting(
    pg_url: str, client: anthropic.AsyncAnthropic
) -> None:
    from llmledger._ledger import RunParams, open_ledger
    from llmledger._ledger.states import Redo
    from llmledger._time import utcnow

    _prepared(pg_url, client, 6)
    now = utcnow()
    ledger = open_ledger(pg_url)
    selection = ledger.resume("m", "summary", RunParams(3, Redo.NONE, now, now), dedupe=True)
    with psycopg.connect(pg_url) as other:  # another worker, mid-claim: rows 0-2 locked, not committed
        other.execute("SELECT id FROM m WHERE id < 3 FOR UPDATE").fetchall()
        started = time.monotonic()
        claimed = ledger.claim(selection, 6, claimant="h/1/r", now=utcnow())
        assert time.monotonic() - started < 5, "the claim did not wait for the other worker's locks"
        assert sorted(r["id"] for r in claimed) == [3, 4, 5], "locked rows are skipped, the rest claimed"


def test_a_worker_refuses_a_redo_it_would_repeat_forever(pg_url: str) -> None:
    with pytest.raises(llmledger.InvalidInputError, match="resume"):
        llmledger.work(pg_url, "m", "summary", redo=True)


def test_background_runs_of_one_frame_from_two_kernels_share_the_work(pg_url: str, sim: Simulator) -> None:
    rows = 120
    sim.configure(latency=0.05)
    runs = [
        apply_llm(
            frame(rows),
            "summary",
            prompt="Summarise: {text}",
            store=pg_url,
            table="m",
            client=anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key"),
            concurrency=4,
            chunk_size=8,
            progress=False,
            background=True,
        )
        for _ in range(2)
    ]
    for run in runs:
        run.wait(timeout=120)
    assert _done(pg_url) == rows and sim.stats()["paid"] == rows, "each row paid once between the two runs"
    calls = [run.report.calls for run in runs]
    assert sum(calls) == rows and min(calls) > 0, f"both runs sent rows: {calls}"


def test_every_spelling_of_a_postgresql_url_reaches_the_same_database(
    pg_url: str, tmp_path: Path, client: anthropic.AsyncAnthropic, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a trial: `POSTGRESQL://...` and SQLAlchemy's `postgresql+psycopg://...` made a local DuckDB file
    under a folder named like the URL (credentials in the path) and paid into it."""
    monkeypatch.chdir(tmp_path)
    rest = pg_url.split("://", 1)[1]
    for n, url in enumerate([f"POSTGRESQL://{rest}", f"postgresql+psycopg://{rest}", f"Postgres://{rest}"]):
        apply_llm(frame(4), "s", prompt="Summarise: {text}", store=url, table="m", client=client, progress=False)
        assert sim.stats()["paid"] == 4, f"{url.split('://')[0]}: the same store, nothing paid again (run {n})"
    assert list(tmp_path.iterdir()) == [], "no local file or folder was made"
    assert _pg(pg_url, "SELECT count(*) FROM m WHERE s_status = 'DONE'") == [(4,)]
