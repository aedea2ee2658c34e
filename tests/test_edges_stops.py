"""Issue 17, stops and budgets: every stop keeps the answers already paid for; a step budget is one budget.

A stop for the account's reasons (spend cap, `x-should-retry: false`, an outage, credentials, a missing model)
used to cancel the requests in flight: the API billed their answers, the ledger never got them, and the next
run paid for them again. These tests start slow requests, make the simulator refuse every new one while those
complete (and are billed), and compare what the simulator billed with what the ledger kept.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import BaseModel

import llmledger
import llmledger._time
from llmledger import RetryPolicy, RunStopped, Simulator, apply_llm, last_report
from llmledger._ledger.liveness import host_name
from llmledger._time import utcnow

from .conftest import HELPERS, frame, journals_left, subprocess_env

ROWS, CONCURRENCY = 60, 16
FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, outage_after=0.01, outage_failures=3)

# What makes the simulator refuse every new request (the requests in flight are answered and billed), what lifts
# it again, and the error the run raises.
STOPS: dict[str, tuple[dict[str, Any], dict[str, Any], type[RunStopped]]] = {
    "spend_cap": (
        {"error_rate": 1.0, "error_status": "enforced_spend_limit_reached"},
        {"error_rate": 0.0},
        llmledger.SpendLimitReached,
    ),
    "should_retry_false": (
        {"error_rate": 1.0, "error_status": "no_retry"},
        {"error_rate": 0.0},
        llmledger.RetryRefused,
    ),
    "outage": (
        {"error_rate": 1.0, "error_status": {"status": 529, "retry_after": None}},
        {"error_rate": 0.0},
        llmledger.OutageError,
    ),
    "auth_401": ({"api_key": "another-key"}, {"api_key": None}, llmledger.AuthenticationFailed),
    "model_404": ({"error_rate": 1.0, "error_status": 404}, {"error_rate": 0.0}, llmledger.ModelNotFound),
}


def _fault_once_all_in_flight(sim: Simulator, fault: dict[str, Any], *, in_flight: int) -> threading.Thread:
    """Turn `fault` on as soon as `in_flight` requests are being answered: they complete, the next ones fail."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while sim.stats()["_concurrent"] < in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        sim.configure(**fault)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _settled(sim: Simulator) -> dict[str, Any]:
    """The simulator's stats once no request is being answered (a request the client gave up on is still
    answered, and billed, by the API)."""
    deadline = time.monotonic() + 10
    while sim.stats()["_concurrent"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return sim.stats()


def _done_prompts(store: Any) -> set[str]:
    rows = llmledger.sql(store, "SELECT text FROM messages WHERE summary_status = 'DONE'")
    return {f"Summarize: {text}" for text in rows["text"].to_list()}


def _check_stop_keeps_paid_answers(store: Any, sim: Simulator, client: anthropic.AsyncAnthropic, kind: str) -> None:
    fault, lifted, error = STOPS[kind]
    sim.configure(latency=0.3, jitter=1.5)
    df = frame(ROWS)
    watcher = _fault_once_all_in_flight(sim, fault, in_flight=CONCURRENCY)
    with pytest.raises(error):
        apply_llm(
            df,
            "summary",
            prompt="Summarize: {text}",
            store=store,
            table="messages",
            client=client,
            progress=False,
            concurrency=CONCURRENCY,
            retry=FAST,
        )
    watcher.join()
    stats = _settled(sim)
    billed = set(sim.paid_prompts())
    assert stats["paid"] == len(billed), "no row was paid twice"
    assert stats["paid"] >= CONCURRENCY, "the requests in flight when the stop came were answered and billed"
    assert _done_prompts(store) == billed, "every answer the API billed is in the ledger"
    statuses = llmledger.sql(store, "SELECT DISTINCT summary_status FROM messages")["summary_status"].to_list()
    assert set(statuses) <= {"DONE", "NOT_STARTED"}, "nothing FAILED, nothing left claimed"

    sim.configure(**lifted, latency=0.0, jitter=0.0)
    out = apply_llm(
        df,
        "summary",
        prompt="Summarize: {text}",
        store=store,
        table="messages",
        client=client,
        progress=False,
        concurrency=CONCURRENCY,
        retry=FAST,
    )
    assert out["summary_status"].to_list() == ["DONE"] * ROWS
    assert sim.stats()["paid"] == ROWS, "the rerun paid exactly the rows never billed"
    assert set(sim.paid_prompts().values()) == {1}


@pytest.mark.parametrize("kind", sorted(STOPS))
def test_every_stop_keeps_the_answers_in_flight_duckdb(
    kind: str, store: Path, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    _check_stop_keeps_paid_answers(store, sim, client, kind)


@pytest.mark.parametrize("kind", ["spend_cap", "outage"])
def test_every_stop_keeps_the_answers_in_flight_postgresql(
    kind: str, pg_url: str, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    _check_stop_keeps_paid_answers(pg_url, sim, client, kind)


class Tone(BaseModel):
    tone: str
    year: int


@pytest.mark.parametrize("stop", ["budget", "spend_cap"])
@pytest.mark.parametrize("engine", ["duckdb", "postgresql"])
def test_a_structured_row_owed_its_follow_up_is_released_when_the_run_stops(
    engine: str,
    stop: str,
    request: pytest.FixtureRequest,
    store: Path,
    sim: Simulator,
    client: anthropic.AsyncAnthropic,
) -> None:
    """Every first answer is bad JSON; the run stops (its budget, or the account's spend cap, which also
    refuses the follow-ups) while first answers are in flight: those rows go back as they were (not
    NEEDS_REVIEW "not retried: the run stopped"), and a rerun answers them."""
    target: Any = request.getfixturevalue("pg_url") if engine == "postgresql" else store
    llmledger.set_price("claude-stops-test", input=1000.0, output=1000.0)
    sim.configure(latency=0.2, jitter=0.6, bad_json_once="hello")
    df = frame(40)
    options: dict[str, Any] = dict(
        store=target,
        table="messages",
        client=client,
        progress=False,
        concurrency=8,
        model="claude-stops-test",
        output=Tone,
    )
    if stop == "budget":
        out = apply_llm(df, "summary", prompt="Summarize: {text}", max_cost_usd=0.5, **options)
        report = last_report()
        assert report is not None and report.outcome == "budget"
    else:
        watcher = _fault_once_all_in_flight(sim, STOPS["spend_cap"][0], in_flight=8)
        with pytest.raises(llmledger.SpendLimitReached):
            apply_llm(df, "summary", prompt="Summarize: {text}", **options)
        watcher.join()
        sim.configure(error_rate=0.0)
        out = llmledger.sql(target, "SELECT summary_status FROM messages")
    statuses = set(out["summary_status"].to_list())
    assert "NEEDS_REVIEW" not in statuses, llmledger.sql(
        target, "SELECT summary_error FROM messages WHERE summary_status = 'NEEDS_REVIEW'"
    )
    assert statuses <= {"DONE", "NOT_STARTED"}
    assert "NOT_STARTED" in statuses

    sim.configure(latency=0.0, jitter=0.0)
    out = apply_llm(df, "summary", prompt="Summarize: {text}", **options)
    assert out["summary_status"].to_list() == ["DONE"] * 40


# -- a step budget shared by concurrent runs -------------------------------------------------------------

RACE_MODEL, RACE_PRICE = "claude-budget-race", 1000.0  # $ per million tokens, in and out (budget_run.py's)


@pytest.mark.parametrize("engine", ["duckdb", "postgresql"])
def test_two_concurrent_runs_of_a_step_share_one_budget(
    engine: str, request: pytest.FixtureRequest, store: Path, sim: Simulator
) -> None:
    """Two processes run one step with max_cost_usd=X and budget_scope="step" at the same time.

    The bound: what the API billed is at most X plus, per run, one request of unknown cost (its first, sent
    before any answer of the step said what a request costs) and what answers cost above the average they
    were reserved at (about nothing here: every row's request is the same size give or take a digit). So
    billed <= X + 2 * (the dearest answer), for two runs. Before reservations each run had the whole budget
    to itself, and the two spent nearly 2X.
    """
    target = str(request.getfixturevalue("pg_url")) if engine == "postgresql" else str(store)
    budget, rows = 0.2, 120
    sim.configure(latency=0.25, jitter=0.1)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "budget_run.py"), target, str(rows), str(budget), "--concurrency", "3"],
            env=subprocess_env(sim.base_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert all("outcome budget" in out for out in outputs), outputs
    stats = _settled(sim)
    billed = (stats["input_tokens"] + stats["output_tokens"]) * RACE_PRICE / 1e6
    ledger = llmledger.sql(
        target,
        "SELECT sum(summary_cost_usd) AS spent, max(summary_cost_usd) AS dearest, "
        "count(summary_cost_usd) AS paid FROM messages",
    )
    spent, dearest, paid = ledger.row(0)
    twice = {prompt: n for prompt, n in sim.paid_prompts().items() if n > 1}
    journals = journals_left(store)
    assert paid == stats["paid"] and spent == pytest.approx(billed), (
        f"every billed answer is in the ledger: paid twice {twice}, journals left {journals}, runs said {outputs}"
    )
    assert billed <= budget + 2 * dearest, f"billed ${billed:.4f} on a budget of ${budget} (2 runs)"
    # Under it by at most what both runs held reserved ahead when both stopped: each reserves for every
    # worker's next request and a spare (3 + 1), beyond the one that did not fit.
    assert billed >= budget - 2 * (3 + 2) * dearest, "the budget is used, less at most what the runs held ahead"
    assert llmledger.sql(target, "SELECT count(*) AS n FROM llmledger_budget_reservations").item() == 0, (
        "each run dropped its reservation when it ended"
    )


def test_a_reservation_counts_while_its_holder_lives_and_not_after(run, sim: Simulator, store: Path) -> None:
    """Another host's fresh reservation takes the budget; a dead process's, or a stale one, is ignored."""
    import duckdb

    llmledger.set_price(RACE_MODEL, input=RACE_PRICE, output=RACE_PRICE)
    options: dict[str, Any] = dict(model=RACE_MODEL, max_cost_usd=0.05, budget_scope="step")
    run(frame(2), "summary", prompt="Summarize: {text}", **options)
    paid = sim.stats()["paid"]
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = f"{host_name()}/{finished.stdout.strip()}/deadrun"

    def hold(claimant: str, age_seconds: float) -> None:
        with duckdb.connect(str(store)) as con:
            con.execute("DELETE FROM llmledger_budget_reservations")
            con.execute(
                "INSERT INTO llmledger_budget_reservations VALUES ('messages', 'summary', ?, 1.0, ?)",
                [claimant, utcnow() - timedelta(seconds=age_seconds)],
            )

    hold("another-host/123/liverun", 5)
    run(frame(20), "summary", prompt="Summarize: {text}", **options)
    report = last_report()
    assert report is not None and report.outcome == "budget" and "reserved by other runs" in str(report.message)
    assert sim.stats()["paid"] == paid, "another host's live run holds the whole budget"

    for claimant, age in ((dead, 5), ("another-host/123/liverun", 3 * 3600)):
        hold(claimant, age)
        run(
            frame(20),
            "summary",
            prompt="Summarize: {text}",
            **{**options, "max_cost_usd": 0.05 + sim.stats()["paid"] * 0.02},
        )
        assert sim.stats()["paid"] > paid, f"{claimant}'s reservation is ignored (dead or stale)"
        paid = sim.stats()["paid"]


def test_a_reservation_is_judged_in_the_databases_clock_not_the_runs(
    run, sim: Simulator, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose clock ran 40 minutes ahead took another host's live reservation for stale (both were the
    process's clock), and the step spent past its budget. Reservations are written and judged in PostgreSQL's
    clock, like claims."""
    import psycopg

    llmledger.set_price(RACE_MODEL, input=RACE_PRICE, output=RACE_PRICE)
    options: dict[str, Any] = dict(model=RACE_MODEL, max_cost_usd=0.05, budget_scope="step", store=pg_url)
    run(frame(2), "summary", prompt="Summarize: {text}", **options)
    paid = sim.stats()["paid"]
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute(
            "INSERT INTO llmledger_budget_reservations VALUES ('messages', 'summary', "
            "'another-host/123/liverun', 1.0, now() AT TIME ZONE 'UTC')"
        )
    real = llmledger._time.utcnow
    for module in [m for name, m in sys.modules.items() if name.startswith("llmledger")]:
        if getattr(module, "utcnow", None) is real:
            monkeypatch.setattr(module, "utcnow", lambda: real() + timedelta(minutes=40))
    run(frame(20), "summary", prompt="Summarize: {text}", **{**options, "max_cost_usd": 0.05 + paid * 0.02})
    report = last_report()
    assert report is not None and report.outcome == "budget", report
    assert sim.stats()["paid"] == paid, "the other host's live reservation holds the budget, whatever our clock says"
