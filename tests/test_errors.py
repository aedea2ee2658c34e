"""Behaviour 5: errors are told apart by whose fault they are."""

from __future__ import annotations

import time
from pathlib import Path

import anthropic
import pytest

from llmledger import AuthenticationFailed, OutageError, RetryPolicy, Simulator, last_report

from .conftest import frame, sql

FAST = RetryPolicy(base_delay=0.01, max_delay=0.05, outage_after=0.5, outage_failures=5)


def test_a_bad_request_fails_only_that_row_and_the_run_goes_on(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 3")
    out = run(frame(10), "summary", prompt="Summarize: {text}")
    statuses = dict(zip(out["id"], out["summary_status"], strict=True))
    assert statuses.pop(3) == "FAILED"
    assert set(statuses.values()) == {"DONE"}
    assert sim.stats()["by_status"][400] == 1, "a 400 is not retried"
    [(attempts, error)] = sql(store, "SELECT summary_attempts, summary_error FROM messages WHERE id = 3")
    assert attempts == 1
    assert "400" in error and "poison" in error


def test_failed_rows_are_retried_by_a_plain_rerun_until_max_attempts(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 3")
    for expected_status, expected_attempts in [("FAILED", 1), ("FAILED", 2), ("NEEDS_REVIEW", 3)]:
        run(frame(5), "summary", prompt="Summarize: {text}", max_attempts=3)
        assert sql(store, "SELECT summary_status, summary_attempts FROM messages WHERE id = 3") == [
            (expected_status, expected_attempts)
        ]
    requests_before = sim.stats()["requests"]
    run(frame(5), "summary", prompt="Summarize: {text}", max_attempts=3)
    assert sim.stats()["requests"] == requests_before, "NEEDS_REVIEW rows are not sent by a plain rerun"
    assert sim.stats()["paid"] == 4


def test_transient_errors_are_retried_and_never_count_against_the_row(run, sim: Simulator, store: Path) -> None:
    sim.configure(fail_next=[529, 529, 500, 503, 429, 529, 502])  # seven in a row, each with retry-after: 1
    patient = RetryPolicy(base_delay=0.01, max_delay=0.05, outage_after=30, outage_failures=5)  # no breaker here
    out = run(frame(12), "summary", prompt="Summarize: {text}", retry=patient)
    assert out["summary_status"].to_list() == ["DONE"] * 12
    assert sql(store, "SELECT max(summary_attempts) FROM messages") == [(1,)]
    report = last_report()
    assert report is not None and report.retries == 7
    assert sim.stats()["paid"] == 12


def test_dropped_connections_are_retried(run, sim: Simulator) -> None:
    sim.configure(drop_next=4)
    out = run(frame(8), "summary", prompt="Summarize: {text}", retry=FAST)
    assert out["summary_status"].to_list() == ["DONE"] * 8
    assert sim.stats()["dropped"] == 4


def test_retry_after_is_honoured(run, sim: Simulator) -> None:
    sim.configure(fail_next=[429])  # the simulator says retry-after: 1
    run(frame(1), "summary", prompt="Summarize: {text}", retry=FAST)
    log = sim.log()
    assert [r["status"] for r in log] == [429, 200]
    assert log[1]["time"] - log[0]["time"] >= 0.95


def test_bad_credentials_stop_the_run_and_leave_every_row_retryable(run, sim: Simulator, store: Path) -> None:
    sim.configure(api_key="the-right-key")
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="ANTHROPIC_API_KEY"):
        run(frame(50), "summary", prompt="Summarize: {text}")
    assert time.monotonic() - started < 5
    assert sql(store, "SELECT DISTINCT summary_status FROM messages") == [("NOT_STARTED",)]
    assert sim.stats()["requests"] <= 16, "stops at the first 401, not after trying every row"

    sim.configure(api_key=None)
    out = run(frame(50), "summary", prompt="Summarize: {text}")
    assert out["summary_status"].to_list() == ["DONE"] * 50


def test_an_outage_trips_the_breaker_and_leaves_rows_not_started(run, sim: Simulator, store: Path) -> None:
    sim.configure(outage_for=60)
    started = time.monotonic()
    with pytest.raises(OutageError, match="30 of 30 selected rows remain") as info:
        run(frame(30), "summary", prompt="Summarize: {text}", retry=FAST)
    assert time.monotonic() - started < 10
    assert info.value.report.outcome == "outage"
    assert sql(store, "SELECT summary_status, count(*) FROM messages GROUP BY ALL") == [("NOT_STARTED", 30)]
    assert sim.stats()["paid"] == 0

    sim.configure(outage_until=0)
    out = run(frame(30), "summary", prompt="Summarize: {text}", retry=FAST)
    assert out["summary_status"].to_list() == ["DONE"] * 30


def test_a_refusal_fails_the_row(run, sim: Simulator, store: Path) -> None:
    sim.configure(refuse="number 2")
    out = run(frame(4), "summary", prompt="Summarize: {text}")
    assert out.filter(id=2)["summary_status"].item() == "FAILED"
    assert "refusal" in sql(store, "SELECT summary_error FROM messages WHERE id = 2")[0][0]
    report = last_report()
    assert report is not None and report.calls == sim.stats()["paid"] == 4, "a refusal is billed, so counted"
    assert report.input_tokens == sim.stats()["input_tokens"]


def test_the_sdk_sees_the_simulators_errors_as_the_real_apis(sim: Simulator) -> None:
    client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
    args = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    overloaded = getattr(anthropic, "OverloadedError", anthropic.InternalServerError)  # SDKs before 0.5x lack it
    for status, error in [(429, anthropic.RateLimitError), (529, overloaded), (500, anthropic.InternalServerError)]:
        sim.configure(fail_next=[status])
        with pytest.raises(error) as info:
            client.messages.create(**args)
        assert info.value.response.headers["retry-after"] == "1"
    sim.configure(poison="hi")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(**args)
    sim.configure(poison=None, drop_next=1)
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(**args)
    sim.configure(rate_limit=100)
    raw = client.messages.with_raw_response.create(**args)
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "6000"
    message = raw.parse()
    assert message.usage.input_tokens > 0 and message.content[0].text


def test_request_timeouts_are_bounded_but_never_lengthened() -> None:
    from llmledger._exec.client import bounded_timeout

    t = bounded_timeout(anthropic.Timeout(600, connect=5.0), max_tokens=1024)
    assert (t.read, t.connect, t.write, t.pool) == (102.4, 10.0, 30.0, 10.0)
    assert bounded_timeout(anthropic.Timeout(20.0), max_tokens=8192).read == 20.0, "a shorter client timeout stays"
    assert bounded_timeout(anthropic.Timeout(None), max_tokens=100).read == 60.0
