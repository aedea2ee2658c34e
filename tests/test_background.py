"""Issue 3 in Python: background runs, apply_llm_async, calls under a running loop, sql() during a run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import Run, Simulator, apply_llm, apply_llm_async

from .conftest import frame, sql


def test_background_run_returns_at_once_and_can_be_watched(run, sim: Simulator, store: Path) -> None:
    sim.configure(latency=0.05)
    started = time.monotonic()
    handle = run(frame(200), "summary", prompt="Summarize: {text}", concurrency=4, background=True)
    assert isinstance(handle, Run)
    assert time.monotonic() - started < 1.0 and not handle.done

    seen = []
    while not handle.done:
        snapshot = handle.progress()
        assert snapshot.columns[:3] == ["table", "step", "outcome"]
        seen.append(snapshot["done"].item())
        if store.exists():  # SQL over the same store from this process while the run goes
            counts = llmledger.progress(store, "messages")
            assert counts["total"].item() == 200
            llmledger.sql(store, "SELECT count(*) AS n FROM messages WHERE summary_status = 'DONE'")
        time.sleep(0.2)
    out = handle.wait()
    assert out["summary_status"].to_list() == ["DONE"] * 200
    assert any(0 < n < 200 for n in seen), f"progress moved while it ran: {seen}"
    assert handle.progress()["outcome"].item() == "completed"
    assert sim.stats()["paid"] == 200


def test_cancel_commits_what_finished_and_releases_the_rest(run, sim: Simulator, store: Path) -> None:
    sim.configure(latency=0.2)
    handle = run(frame(300), "summary", prompt="Summarize: {text}", concurrency=4, background=True)
    while handle.report.done < 8:
        time.sleep(0.05)
    asked = time.monotonic()
    handle.cancel()
    assert time.monotonic() - asked < 3
    out = handle.result()
    statuses = out["summary_status"].value_counts().sort("summary_status")
    assert "RUNNING" not in statuses["summary_status"].to_list()
    done = out.filter(pl.col("summary_status") == "DONE").height
    assert done >= 8 and out.filter(pl.col("summary_status") == "NOT_STARTED").height == 300 - done
    assert handle.report.outcome == "cancelled"
    assert llmledger.sql(store, "SELECT count(*) AS n FROM messages WHERE summary_status = 'RUNNING'")["n"].item() == 0


def test_apply_llm_async_and_a_plain_call_inside_a_running_loop(run, client, sim: Simulator, store: Path) -> None:
    async def notebook_cell() -> tuple[pl.DataFrame, pl.DataFrame]:
        awaited = await apply_llm_async(
            frame(10),
            "summary",
            prompt="Summarize: {text}",
            client=client,
            store=store,
            table="messages",
            progress=False,
        )
        # a plain blocking call while this loop runs, as in a Jupyter cell
        plain = apply_llm(
            frame(12),
            "summary",
            prompt="Summarize: {text}",
            client=client,
            store=store,
            table="messages",
            progress=False,
        )
        return awaited, plain

    awaited, plain = asyncio.run(notebook_cell())
    assert awaited["summary_status"].to_list() == ["DONE"] * 10
    assert plain["summary_status"].to_list() == ["DONE"] * 12
    assert sim.stats()["paid"] == 12


def test_errors_of_a_background_run_surface_at_wait(run, sim: Simulator) -> None:
    sim.configure(api_key="other")
    handle = run(frame(5), "summary", prompt="Summarize: {text}", background=True)
    with pytest.raises(llmledger.AuthenticationFailed):
        handle.wait(timeout=30)


def test_summary_is_text_outside_a_notebook(run, capsys: pytest.CaptureFixture[str]) -> None:
    run(frame(3), "summary", prompt="Summarize: {text}", progress=True)
    out = capsys.readouterr().out
    assert out.startswith("messages.summary: 3 done · 0 failed")
    report = llmledger.last_report()
    assert report is not None and "data-status='DONE' data-count='3'" in report._repr_html_()


def test_sql_on_a_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no store at"):
        llmledger.sql(tmp_path / "nope.duckdb", "SELECT 1")


def test_a_background_run_never_changes_last_report(run, sim: Simulator) -> None:
    sim.configure(latency=0.05)
    handle = run(frame(60), "title", prompt="Title: {text}", concurrency=2, background=True)
    run(frame(5), "summary", prompt="Summarize: {text}")
    mine = llmledger.last_report()
    assert mine is not None and mine.step == "summary"
    handle.wait(timeout=60)
    assert llmledger.last_report() is mine, "the background run's report stays on its handle"
    assert handle.report.step == "title" and handle.report.done == 60


def test_answers_arriving_after_cancel_are_committed_not_lost(run, sim: Simulator, store: Path) -> None:
    """Requests in flight when a run is cancelled get a grace to finish; their answers are paid, so committed."""
    sim.configure(latency=0.6)
    handle = run(frame(200), "summary", prompt="Summarize: {text}", background=True, concurrency=8)
    deadline = time.monotonic() + 60  # cancel once requests are in flight (a fixed sleep raced a loaded machine)
    while sim.stats()["requests"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    handle.cancel()
    done = sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'")[0][0]
    assert done == handle.report.done == sim.stats()["paid"] > 0
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'RUNNING'") == [(0,)]


def test_a_reader_right_after_a_background_run_on_a_new_store_finds_it(
    client: Any, sim: Simulator, tmp_path: Path
) -> None:
    """Found in a trial: a reader called right after apply_llm(..., background=True) on a new store got
    StoreNotFound 12-17 times in 20. It now waits for the store the run is making."""
    for n in range(10):
        store = tmp_path / f"s{n}.duckdb"
        run = apply_llm(frame(50), "s", prompt="Summarize: {text}", store=store, table="t", client=client,
                        background=True, progress=False)  # fmt: skip
        assert llmledger.sql(store, "SELECT count(*) AS n FROM t")["n"][0] == 50
        run.wait()
