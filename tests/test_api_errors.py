"""Errors the real API sends: spend limits and x-should-retry stop the run; 504/409 are retried; retry-after-ms."""

from __future__ import annotations

import time
from pathlib import Path

import anthropic
import pytest

import llmledger
from llmledger import RetryPolicy, RetryRefused, RunStopped, Simulator, SpendLimitReached, last_report

from .conftest import frame, sql

FAST = RetryPolicy(base_delay=0.01, max_delay=0.05, outage_after=0.5, outage_failures=5)


@pytest.mark.parametrize(
    ("fault", "error", "says"),
    [
        ("enforced_spend_limit_reached", SpendLimitReached, "enforced_spend_limit_reached"),
        ("contract_spend_limit_reached", SpendLimitReached, "contract_spend_limit_reached"),
        ("usage_limit", SpendLimitReached, "usage limits"),
        ("credit_balance", SpendLimitReached, "credit balance is too low"),
        (402, SpendLimitReached, r"402 \w+ \(billing_error\)"),
        ("no_retry", RetryRefused, "x-should-retry: false"),
        ({"status": 503, "should_retry": False}, RetryRefused, "503"),
    ],
)
def test_account_level_refusals_stop_the_run_with_nothing_failed(
    run, sim: Simulator, store: Path, fault, error, says
) -> None:
    run(frame(4), "summary", prompt="Summarize: {text}")
    sim.configure(fail_next=[fault])
    before = sim.stats()["requests"]
    with pytest.raises(error, match=says) as info:
        run(frame(40), "summary", prompt="Summarize: {text}", concurrency=1, retry=FAST)
    assert sim.stats()["requests"] - before == 1, "stops at the refusal: no retry, no other request"
    assert isinstance(info.value, RunStopped)
    assert "36 of 36 selected rows remain" in str(info.value)
    assert "(request req_sim_" in str(info.value), "the API's request id, for a support ticket"
    assert sql(store, "SELECT summary_status, count(*) FROM messages GROUP BY ALL ORDER BY ALL") == [
        ("DONE", 4),
        ("NOT_STARTED", 36),
    ], "no row is FAILED and no claim is left behind"
    assert sim.stats()["requests"] == 5, "the run stopped at the first refusal"

    out = run(frame(40), "summary", prompt="Summarize: {text}")  # the limit was raised: a plain rerun resumes
    assert out["summary_status"].to_list() == ["DONE"] * 40


@pytest.mark.parametrize("fault", [504, 409, 529, 500, 503, "retry_after_ms"])
def test_transient_statuses_are_retried_without_counting_against_the_row(
    run, sim: Simulator, store: Path, fault
) -> None:
    sim.configure(fail_next=[fault, fault])
    out = run(frame(3), "summary", prompt="Summarize: {text}", concurrency=1, retry=FAST)
    assert out["summary_status"].to_list() == ["DONE"] * 3
    assert sql(store, "SELECT max(summary_attempts) FROM messages") == [(1,)]
    assert last_report().retries == 2  # type: ignore[union-attr]


def test_retry_after_ms_is_honoured_to_the_millisecond(run, sim: Simulator) -> None:
    sim.configure(fail_next=[{"preset": "retry_after_ms", "retry_after_ms": 1500}])
    run(frame(1), "summary", prompt="Summarize: {text}", retry=FAST)
    log = sim.log()
    assert [r["status"] for r in log] == [429, 200]
    assert 1.45 <= log[1]["time"] - log[0]["time"] < 2.5


@pytest.mark.parametrize("header", [{"retry_after": "soon"}, {"retry_after": "inf"}, {"retry_after_ms": "nan"}])
def test_a_retry_after_that_is_no_usable_wait_neither_stops_nor_holds_the_run(
    run, sim: Simulator, store: Path, header: dict
) -> None:
    """A proxy's `retry-after: soon`, or a wait that never ends, falls back to the usual backoff."""
    sim.configure(fail_next=[{"status": 429, **header}])
    started = time.monotonic()
    out = run(frame(2), "summary", prompt="Summarize: {text}", concurrency=1, retry=FAST)
    assert out["summary_status"].to_list() == ["DONE"] * 2
    assert last_report().retries == 1  # type: ignore[union-attr]
    assert time.monotonic() - started < 30


def test_a_permanent_error_keeps_the_apis_words_and_request_id(run, sim: Simulator, store: Path) -> None:
    sim.configure(fail_next=[413])
    run(frame(1), "summary", prompt="Summarize: {text}")
    [(status, error)] = sql(store, "SELECT summary_status, summary_error FROM messages")
    assert status == "FAILED"
    assert error.startswith("413 ") and "request_too_large" in error and "(request req_sim_" in error


def test_the_simulator_sends_what_the_real_api_sends(sim: Simulator) -> None:
    client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
    args = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    sim.configure(fail_next=["enforced_spend_limit_reached"])
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(**args)
    exc = info.value
    assert getattr(exc, "error_code", "enforced_spend_limit_reached") == "enforced_spend_limit_reached"
    assert exc.body["error"]["details"] == {"error_code": "enforced_spend_limit_reached"}  # type: ignore[index]
    assert exc.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in exc.response.headers, "a spend limit does not clear by waiting a moment"
    assert exc.request_id and exc.request_id == exc.body["request_id"]  # type: ignore[index]
    for status, kind in [(504, "timeout_error"), (402, "billing_error"), (409, "conflict_error")]:
        sim.configure(fail_next=[status])
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(**args)
        assert info.value.status_code == status and info.value.body["error"]["type"] == kind  # type: ignore[index]
        assert info.value.response.headers["x-should-retry"] == ("false" if status == 402 else "true")
    sim.configure(fail_next=["retry_after_ms"])
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(**args)
    assert info.value.response.headers["retry-after-ms"] == "1500"
    with pytest.raises(ValueError, match="unknown simulator fault"):
        sim.configure(fail_next=["no_such_fault"])


def test_an_unknown_model_stops_the_run_instead_of_failing_every_row(run, sim: Simulator, store: Path) -> None:
    sim.configure(fail_next=[{"status": 404, "message": "model: claude-sonnet-9"}])
    with pytest.raises(llmledger.ModelNotFound, match=r"model: claude-sonnet-9.*Check model=") as info:
        run(frame(20), "summary", prompt="Summarize: {text}", concurrency=1)
    assert info.value.report.remaining == 20
    assert sql(store, "SELECT DISTINCT summary_status FROM messages") == [("NOT_STARTED",)]
