"""The rules under the ledger and the senders, as pure functions: the shape of `where=`, how a refused row's status
and attempts move, what a 4xx/5xx means for a run, how long to wait, and how rows are drawn.

The fast tier (`pytest tests/unit`): no server, no subprocess, no store on disk.
"""

from __future__ import annotations

import email.utils
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmledger._draw import error_kind, rows
from llmledger._exec.apis.messages import classify
from llmledger._exec.client import Kind
from llmledger._exec.pacing import MAX_RETRY_AFTER, backoff, retry_after
from llmledger._ledger.states import Outcome, Status, attempts_after, status_after_failure
from llmledger._ledger.where import check_where_shape, where_shape_problem
from llmledger.errors import WhereClauseError

from . import UNIT


@pytest.mark.parametrize(
    "where",
    ["label = 'spam'", "id IN (3, 7)", "text = ')' AND (a OR b)", '"we;ird" = 1', "note = 'it''s -- fine'",
     "lower(text) LIKE '%win%' AND length(text) > 3", "text = 'pg_sleep(3)'", "CAST(id AS INT) IN (SELECT 1)",
     "NOT exists (SELECT 1) OR coalesce(a, b) = 1"],
)  # fmt: skip
def test_one_condition_is_one_self_contained_expression(where: str) -> None:
    assert where_shape_problem(where) is None
    check_where_shape(where)


@pytest.mark.parametrize(
    "where",
    ["1=1; DROP TABLE t", "1=1) OR (1=1", "a = 1 -- the rest", "a /* x */ = 1", "(a = 1", "a = $$x$$",
     "pg_sleep(3) IS NULL", "id IN (SELECT pg_catalog.pg_sleep(1))", '"pg_sleep" (1) IS NULL', "nextval('s') > 0",
     "id IN (FROM read_csv('/etc/passwd'))", "PG_ADVISORY_LOCK(1) IS NULL", "id IN (SELECT id FROM 'ids.csv')",
     "EXISTS (WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT 1 FROM r WHERE n < 0)"],
)  # fmt: skip
def test_a_where_that_could_escape_its_parentheses_is_refused(where: str) -> None:
    assert where_shape_problem(where) is not None
    with pytest.raises(WhereClauseError):
        check_where_shape(where)


@pytest.mark.parametrize(
    "where",
    ["CAST(price AS DECIMAL(10,2)) > 3", "price::NUMERIC(5) > 1", "price :: numeric ( 12 , 4 ) > 1",
     "CAST(name AS VARCHAR(20)) = 'a'", "TRY_CAST(name AS character varying(3)) = 'a'",
     "CAST(at AS TIMESTAMP(3)) > DATE '2020-01-01'"],
)  # fmt: skip
def test_a_type_with_modifiers_in_a_cast_is_no_function_call(where: str) -> None:
    assert where_shape_problem(where) is None


@pytest.mark.parametrize(
    ("where", "named"),
    [("length(repeat(text, 1000000000)) > 0", "repeat()"), ("length(lpad(text, 1000000000, 'x')) > 0", "lpad()"),
     ("rpad(text, 1000000000) <> ''", "rpad()"), ("id IN (SELECT * FROM range(1000000000000))", "range()"),
     ("id IN (SELECT generate_series(1, 1000000000000))", "generate_series()"),
     ("CAST(x AS pg_sleep(3)) IS NULL", "pg_sleep()"), ("x::DECIMAL(pg_sleep(3)) IS NULL", "DECIMAL()")],
)  # fmt: skip
def test_a_function_whose_result_can_grow_without_bound_is_refused(where: str, named: str) -> None:
    problem = where_shape_problem(where)
    assert problem is not None and named in problem
    with pytest.raises(WhereClauseError):
        check_where_shape(where)


@settings(UNIT)
@given(st.integers(0, 10), st.integers(1, 10))
def test_a_refused_row_needs_review_once_it_used_its_attempts(attempts: int, max_attempts: int) -> None:
    expected = Status.NEEDS_REVIEW if attempts >= max_attempts else Status.FAILED
    assert status_after_failure(attempts, max_attempts) is expected


def test_a_redo_of_a_done_row_counts_attempts_from_one_again() -> None:
    assert attempts_after(2, was_done=True) == 1
    assert attempts_after(2, was_done=False) == 3
    assert attempts_after(None, was_done=False) == 1


def _status_error(status: int, body: dict, headers: dict[str, str] | None = None) -> anthropic.APIStatusError:
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    response = httpx.Response(status, json=body, headers=headers or {}, request=request)
    return anthropic._client.AsyncAnthropic(api_key="k")._make_status_error("error", body=body, response=response)


def _body(kind: str, message: str, code: str | None = None) -> dict:
    error: dict = {"type": kind, "message": message}
    if code:
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error}


def test_an_overload_is_retried_after_what_the_api_asks() -> None:
    failed = classify(_status_error(529, _body("overloaded_error", "Overloaded"), {"retry-after": "3"}))
    assert failed.kind is Kind.TRANSIENT and failed.retry_after == 3.0


def test_a_spend_limit_stops_the_run_and_is_never_retried() -> None:
    failed = classify(
        _status_error(
            429, _body("rate_limit_error", "limit", "enforced_spend_limit_reached"), {"x-should-retry": "false"}
        )
    )
    assert failed.kind is Kind.FATAL and failed.stop is Outcome.SPEND_LIMIT


@pytest.mark.parametrize(("status", "stop"), [(401, Outcome.AUTH), (403, Outcome.AUTH), (404, Outcome.NO_MODEL)])
def test_credentials_and_a_missing_model_stop_the_run(status: int, stop: Outcome) -> None:
    failed = classify(_status_error(status, _body("error", "no")))
    assert failed.kind is Kind.FATAL and failed.stop is stop


def test_a_bad_request_is_the_rows_own_fault_and_a_retryable_one_told_not_to_retry_stops() -> None:
    assert classify(_status_error(400, _body("invalid_request_error", "prompt is too long"))).kind is Kind.PERMANENT
    refused = classify(_status_error(500, _body("api_error", "boom"), {"x-should-retry": "false"}))
    assert refused.kind is Kind.FATAL and refused.stop is Outcome.RETRY_REFUSED


def test_retry_after_prefers_milliseconds_then_seconds_then_a_date() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "2"}) == 2.0
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (retry_after({"retry-after": soon}) or 0) <= 31
    assert retry_after({"retry-after": "whenever"}) is None
    assert retry_after({}) is None


def test_no_retry_after_can_hold_a_request_for_good() -> None:
    assert retry_after({"retry-after": "inf"}) is None and retry_after({"retry-after-ms": "nan"}) is None
    assert retry_after({"retry-after": "1e9"}) == MAX_RETRY_AFTER
    assert retry_after({"retry-after": "-5"}) == 0.0
    assert retry_after({"retry-after-ms": "inf", "retry-after": "3"}) == 3.0


@settings(UNIT)
@given(st.integers(0, 30), st.floats(0.01, 5), st.floats(0.1, 60), st.none() | st.floats(0, 100))
def test_backoff_stays_under_its_cap_but_never_under_what_the_server_asked(
    attempt: int, base: float, cap: float, asked: float | None
) -> None:
    delay = backoff(attempt, base=base, cap=cap, retry_after=asked)
    assert delay >= (asked or 0.0)
    assert delay <= max(cap, asked or 0.0)


def test_rows_are_counted_in_words_and_errors_grouped_by_their_kind() -> None:
    assert rows(1) == "1 row" and rows(2_500) == "2,500 rows"
    assert error_kind("429 RateLimitError (rate_limit_error): slow down") == "429 RateLimitError (rate_limit_error)"
    assert error_kind("refusal: the model declined") == "refusal"


def test_openais_resets_are_durations_and_its_limits_pace_requests() -> None:
    """OpenAI announces `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as durations."""
    from llmledger._exec.pacing import Pacer, _seconds_until

    assert [_seconds_until(d) for d in ("6m0s", "1s", "20ms", "1h2m3.5s")] == [360.0, 1.0, 0.02, 3723.5]
    assert _seconds_until("soon") is None
    pacer = Pacer()
    pacer.observe({"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "6000000"}, 80, 20)
    assert pacer.binding == "requests: 600/min" and pacer.interval == pytest.approx(1 / (600 / 60 * Pacer.SAFETY))
    pacer.observe({"x-ratelimit-limit-requests": "6000", "x-ratelimit-limit-tokens": "60000"})
    assert pacer.binding == "tokens: 60,000/min", "100 tokens a request (80 in, 20 out): 600 a minute binds"


def _openai_error(kind: str, code: str | None) -> dict:
    return {"error": {"type": kind, "code": code, "message": "what OpenAI said"}}


@pytest.mark.parametrize(
    ("status", "body", "kind", "stop"),
    [
        (429, _openai_error("insufficient_quota", "insufficient_quota"), "fatal", "spend_limit"),
        (429, _openai_error("requests", "rate_limit_exceeded"), "transient", None),
        (401, _openai_error("invalid_request_error", "invalid_api_key"), "fatal", "auth"),
        (404, _openai_error("invalid_request_error", "model_not_found"), "fatal", "no_model"),
        (400, _openai_error("invalid_request_error", None), "permanent", None),
        (503, _openai_error("server_error", None), "transient", None),
    ],
)
def test_openais_errors_are_classified_as_openai_documents_them(
    status: int, body: dict, kind: str, stop: str | None
) -> None:
    openai = pytest.importorskip("openai")
    from llmledger._exec.apis import chat

    base = openai._base_client
    sdk_httpx = getattr(base, "httpx2", None) or base.httpx  # the HTTP library the installed SDK is built on
    request = sdk_httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = sdk_httpx.Response(status, json=body, headers={"x-request-id": "req_1"}, request=request)
    error = openai.AsyncOpenAI(api_key="k")._make_status_error("error", body=body, response=response)
    failed = chat.classify(error)
    assert failed.kind.value == kind and (failed.stop.value if failed.stop else None) == stop
    assert "(request req_1)" in str(failed)


def _intent(name: str, requests: int, created: Any, rejected: tuple[str, ...] = ()) -> Any:
    from llmledger._ledger.types import BatchRecord

    return BatchRecord(name, None, "t", "s", "gone", requests, requests, created, "submitting", "v", False, False,
                       list(rejected))  # fmt: skip


def test_a_batch_that_names_its_intent_is_that_intents_before_it_counts_its_requests() -> None:
    """OpenAI's batch carries its intent in metadata and counts no request while it validates: it is matched by the
    name it carries, never by size (which would give the intent up, and its rows would be paid twice), and a batch
    naming another intent, or one the intent rejected, is not taken."""
    import asyncio
    from datetime import datetime, timedelta

    from llmledger._exec.batch_api import BatchInfo
    from llmledger._exec.reconcile import Reconciler

    now = datetime(2026, 11, 26, 12, 0)
    seen = [
        BatchInfo("batch_c", now, 0, False, "validating", intent="bother"),
        BatchInfo("batch_b", now, 0, False, "validating", intent="bmine"),
        BatchInfo("batch_a", now, 5, False, "in_progress", intent="brejected"),
    ]

    class Listed:
        async def list(self) -> Any:
            for batch in seen:
                yield batch

    mine, rejected = _intent("bmine", 5, now - timedelta(seconds=1)), _intent("brejected", 5, now, ("batch_a",))
    reading = asyncio.run(Reconciler(Listed()).read([mine, rejected], [mine, rejected], set()))  # type: ignore[arg-type]
    assert reading.own == {"bmine": "batch_b"} and not reading.guessed and not reading.held


def test_a_run_client_shares_one_verified_ssl_context_and_keeps_the_callers_own_http_client() -> None:
    """Each run gets its own pool but not its own certificate store: loading it cost ~25 ms of CPU per call."""
    import ssl

    from llmledger._run.drive import run_client

    client = anthropic.AsyncAnthropic(api_key="k")
    first, own = run_client(client)
    second, _ = run_client(client)
    assert own and first._client is not second._client and first._client is not client._client
    contexts = [c._client._transport._pool._ssl_context for c in (first, second)]
    assert contexts[0] is contexts[1], "one context for every run"
    assert contexts[0].verify_mode == ssl.CERT_REQUIRED and contexts[0].check_hostname
    assert contexts[0].cert_store_stats() == client._client._transport._pool._ssl_context.cert_store_stats()
    mine = anthropic.AsyncAnthropic(api_key="k", http_client=anthropic.DefaultAsyncHttpxClient(verify=False))
    assert run_client(mine) == (mine, False), "a client with an http_client of the caller's own is used as given"


def test_a_changed_ca_bundle_or_ssl_setting_builds_a_new_shared_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CA added to the bundle mid-session (a proxy's, say), or a keylog turned off, is honoured by the next call."""
    import certifi

    from llmledger._run import drive
    from llmledger._run.drive import shared_ssl_context

    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    first = shared_ssl_context(anthropic.DefaultAsyncHttpxClient)
    assert shared_ssl_context(anthropic.DefaultAsyncHttpxClient) is first
    bundle.write_bytes(bundle.read_bytes() + b"\n")
    second = shared_ssl_context(anthropic.DefaultAsyncHttpxClient)
    assert second is not first, "a rewritten bundle is read again"
    assert all(kept is not first for _, kept in drive._ssl_contexts.values()), "and replaces the old context"
    monkeypatch.setenv("SSLKEYLOGFILE", str(tmp_path / "keys.log"))
    assert shared_ssl_context(anthropic.DefaultAsyncHttpxClient) is not second


def test_an_openai_client_is_told_apart_as_isinstance_would_a_subclass_and_a_proxy_too() -> None:
    """The provider is told by the client's class without importing an SDK; instrumentation proxies (wrapt-style,
    reporting the wrapped `__class__`) pass the step's isinstance check, so they must be routed the same way."""
    import openai

    from llmledger._exec.client import is_openai_client

    real = openai.AsyncOpenAI(api_key="k")

    class Mine(openai.AsyncOpenAI):
        pass

    class Proxy:
        def __init__(self, wrapped: Any) -> None:
            self._wrapped = wrapped

        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return type(self._wrapped)

    assert isinstance(Proxy(real), openai.AsyncOpenAI)
    assert is_openai_client(real) and is_openai_client(Mine(api_key="k")) and is_openai_client(Proxy(real))
    assert not is_openai_client(anthropic.AsyncAnthropic(api_key="k")) and not is_openai_client(object())


def test_the_first_answer_lets_what_the_buckets_hold_start_at_once_up_to_a_second_of_the_pace() -> None:
    """A full bucket is spent at once, not spaced out: up to a second of the pace, less one request; a bucket
    that holds less (output tokens held at max_tokens from a request's start) gives less, and a pause none."""
    from llmledger._exec.pacing import Pacer

    full = {"anthropic-ratelimit-requests-limit": "2400", "anthropic-ratelimit-requests-remaining": "2399"}
    pacer = Pacer()
    pacer.observe(full)
    assert pacer.credit == 39, "a second of 2,400/min paced at 98%, less one"
    pacer.observe({**full, "anthropic-ratelimit-requests-remaining": "5"})
    assert pacer.credit == 39, "only the limits' first word gives a credit"
    tokens = {
        **full,
        "anthropic-ratelimit-output-tokens-limit": "80000",
        "anthropic-ratelimit-output-tokens-remaining": "10000",
    }
    pacer = Pacer()
    pacer.observe(tokens, 100, 50, reserved=1000)
    assert pacer.credit == 8, "10,000 output tokens at 97% hold 9 requests of max_tokens 1,000, less one"
    pacer = Pacer()
    pacer.observe({**full, "anthropic-ratelimit-requests-remaining": "0"})
    assert pacer.credit == 0
