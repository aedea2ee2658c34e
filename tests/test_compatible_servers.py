"""Servers that speak the Messages API but are not Anthropic's (vLLM, Ollama, llama.cpp, a LiteLLM proxy), reached
with `base_url=`: the real SDK against the simulator answering as one (`compatible=True`: no rate-limit headers,
no Message Batches, no prompt caching), on its unmarked URL, so its answers are taken for that server's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report, resume
from llmledger.cli import main as cli

from .conftest import frame, sql

LOCAL = "qwen3:8b"  # the model a local server was started with (it knows no other)
PROMPT = "Summarise: {text}"


@pytest.fixture
def local() -> Any:
    with Simulator(compatible=True, models=(LOCAL,), api_key="llmledger-no-key") as server:
        yield server


@pytest.fixture
def other() -> Any:
    with Simulator(compatible=True, models=(LOCAL,)) as server:
        yield server


# the local model has no price: said once per process (the first test checks it), ignored elsewhere
pytestmark = pytest.mark.filterwarnings("ignore::llmledger.UnknownPriceWarning")


def ask(store: Path, server: Simulator, rows: int = 12, **options: Any) -> pl.DataFrame:
    return apply_llm(
        frame(rows),
        "s",
        prompt=PROMPT,
        model=options.pop("model", LOCAL),
        store=store,
        table="t",
        base_url=options.pop("base_url", server.server_url),
        progress=False,
        **options,
    )


def test_a_local_server_answers_and_each_answer_names_it(
    store: Path, local: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-not-for-other-servers")  # the server 401s any key but its own
    with pytest.warns(llmledger.UnknownPriceWarning, match=LOCAL):
        out = ask(store, local)
    assert out["s_status"].to_list() == ["DONE"] * 12
    assert local.stats()["paid"] == 12
    rows = sql(store, "SELECT s_source, s_cost_usd, s_prompt, s_fingerprint::VARCHAR FROM t")
    assert {r[0] for r in rows} == {local.server_url}
    assert {r[1] for r in rows} == {None}  # no price for the model: cost unknown, not 0
    (stored,) = sql(store, "SELECT request FROM llmledger_steps WHERE step = 's'")[0]
    request = json.loads(stored)
    assert request["llmledger_endpoint"] == local.server_url
    for _, _, prompt, fp in rows:  # the fingerprint covers the body and the server it went to
        body = {k: v for k, v in request.items() if k != "llmledger_endpoint"}
        body["messages"] = [{"role": "user", "content": prompt}]
        assert fp == llmledger.fingerprint({**body, "llmledger_endpoint": local.server_url})
        assert fp != llmledger.fingerprint(body)
    sent = local.log()[0]["body"]
    assert "llmledger_endpoint" not in sent  # bookkeeping, never sent
    assert last_report().mode == "online"
    said = [h for h in last_report().hints() if "is not Anthropic's API" in h]
    assert len(said) == 1 and "no rate limits" in said[0] and "cost NULL" in said[0]


@pytest.mark.parametrize("api", ["messages", "chat"])
def test_a_server_that_says_nothing_of_usage_leaves_tokens_and_cost_unknown_not_zero(
    store: Path, local: Simulator, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some servers answer without `usage`: the answer is kept, its tokens and cost are NULL (a cost of 0.0 would
    say it was free), even with a price set for the model. Before, such an answer cost $0.00 (chat) or failed."""
    pytest.importorskip("openai")
    monkeypatch.setattr("llmledger._step.prices._overrides", {})  # this test's price only (set_price is global)
    llmledger.set_price(LOCAL, input=1.0, output=2.0)
    local.configure(usage=False)
    model = LOCAL if api == "messages" else "openai:" + LOCAL
    url = local.server_url + ("/v1" if api == "chat" else "")
    out = ask(store, local, rows=4, model=model, base_url=url)
    assert out["s_status"].to_list() == ["DONE"] * 4 and out["s"].null_count() == 0
    rows = sql(store, "SELECT s_input_tokens, s_output_tokens, s_cost_usd FROM t")
    assert set(rows) == {(None, None, None)}
    report = last_report()
    assert report is not None and report.calls == 4 and report.cost_usd is None, "the run's cost is unknown too"
    assert report.uncounted == 4 and "usage unknown for 4" in str(report)


def test_a_budget_on_a_model_of_unknown_price_is_refused_before_paying(store: Path, local: Simulator) -> None:
    """Found in a trial: max_cost_usd on a `base_url=` model with no known price paid one request on each run, then
    stopped saying it could not count. Now nothing is sent, nothing written, and the error says how to price it."""
    with pytest.raises(InvalidInputError, match=r"max_cost_usd needs the price of model 'qwen3:8b'.*set_price"):
        ask(store, local, max_cost_usd=1.0)
    assert local.stats()["paid"] == 0 and not store.exists()
    ask(store, local)  # the step exists: resume with a budget is refused alike
    with pytest.raises(InvalidInputError, match="max_cost_usd needs the price"):
        resume(store, "t", "s", base_url=local.server_url, max_cost_usd=1.0, redo=True, progress=False)
    assert local.stats()["paid"] == 12


def test_a_budget_with_a_server_that_sends_no_usage_says_so(
    store: Path, local: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("llmledger._step.prices._overrides", {})
    llmledger.set_price(LOCAL, input=1.0, output=2.0)
    local.configure(usage=False)
    ask(store, local, max_cost_usd=1.0)
    report = last_report()
    assert report is not None and report.outcome == "budget" and local.stats()["paid"] == 1
    assert "without usage" in str(report.message) and "no known price" not in str(report.message)


def test_a_rerun_pays_nothing_and_another_server_makes_rows_stale_not_paid(
    store: Path, local: Simulator, other: Simulator
) -> None:
    ask(store, local)
    ask(store, local)
    assert local.stats()["paid"] == 12  # the rerun paid nothing
    with pytest.warns(llmledger.StaleAnswersWarning, match="12 DONE rows are stale"):
        out = ask(store, other, base_url=other.server_url)
    assert other.stats()["paid"] == 0
    assert out["s_stale"].to_list() == [True] * 12
    out = ask(store, other, base_url=other.server_url, redo="stale")
    assert other.stats()["paid"] == 12 and out["s_stale"].to_list() == [False] * 12
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {other.server_url}
    with pytest.warns(llmledger.StaleAnswersWarning):  # going back is a change too, reported
        ask(store, local)
    back = ask(store, local, redo="stale")  # and the first server's answers come back from the history, unpaid
    assert local.stats()["paid"] == 12 and back["s_stale"].to_list() == [False] * 12
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {local.server_url}


def test_a_client_names_its_server_as_base_url_does(store: Path, local: Simulator, other: Simulator) -> None:
    pointed = anthropic.AsyncAnthropic(base_url=local.server_url, api_key="llmledger-no-key")
    apply_llm(frame(6), "s", prompt=PROMPT, model=LOCAL, store=store, table="t", client=pointed, progress=False)
    assert local.stats()["paid"] == 6
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {local.server_url}
    apply_llm(frame(6), "s2", prompt=PROMPT, model=LOCAL, store=store, table="t", base_url=local.server_url,
              progress=False)  # fmt: skip
    assert local.stats()["paid"] == 6  # the same requests to the same server: reused
    apply_llm(frame(6), "s3", prompt=PROMPT, model=LOCAL, store=store, table="t", base_url=other.server_url,
              progress=False)  # fmt: skip
    assert other.stats()["paid"] == 6  # same body, other endpoint: asked, not reused


def test_a_server_named_by_anthropic_base_url_is_named_in_every_request(
    store: Path, local: Simulator, other: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ANTHROPIC_BASE_URL names a server as base_url= does: its answers are never served as another server's."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-set-with-the-url")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", other.server_url)
    ask(store, other, base_url=None)
    assert other.stats()["paid"] == 12
    (stored,) = sql(store, "SELECT request FROM llmledger_steps WHERE step = 's'")[0]
    assert json.loads(stored)["llmledger_endpoint"] == other.server_url
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {other.server_url}
    ask(store, other, base_url=other.server_url)  # the same server by argument: the same requests, nothing paid
    assert other.stats()["paid"] == 12
    monkeypatch.setenv("ANTHROPIC_BASE_URL", local.server_url)  # the step run later against another server
    monkeypatch.setenv("ANTHROPIC_API_KEY", "llmledger-no-key")
    with pytest.warns(llmledger.StaleAnswersWarning, match="12 DONE rows are stale"):
        out = ask(store, local, base_url=None)
    assert local.stats()["paid"] == 0 and out["s_stale"].to_list() == [True] * 12
    apply_llm(frame(12), "s", prompt=PROMPT, model=LOCAL, store=store, table="fresh", progress=False)
    assert local.stats()["paid"] == 12  # a new table is asked of this server, not served the other's answers
    client = anthropic.AsyncAnthropic(base_url=other.server_url, api_key="x")  # client= names its server too
    apply_llm(frame(12), "s", prompt=PROMPT, model=LOCAL, store=store, table="t3", client=client, progress=False)
    assert other.stats()["paid"] == 12  # the answers of the same requests to the same server, reused


def test_a_bad_anthropic_base_url_is_refused_naming_the_variable(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "localhost:8000")
    with pytest.raises(InvalidInputError, match="ANTHROPIC_BASE_URL must be the http"):
        apply_llm(frame(3), "s", prompt=PROMPT, store=store, progress=False)
    assert not store.exists()


def test_batches_are_refused_with_the_reason_and_auto_stays_online(
    store: Path, local: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidInputError, match="only Anthropic's and OpenAI's own APIs have"):
        ask(store, local, mode="batch")
    assert not store.exists()  # refused before anything is written
    monkeypatch.setattr("llmledger._run.run.AUTO_BATCH_ROWS", 1)  # auto would batch these rows on Anthropic's API
    ask(store, local, mode="auto")
    assert last_report().mode == "online" and local.stats()["requests"] == local.stats()["paid"] == 12


def test_resume_sends_only_to_the_server_the_requests_name(store: Path, local: Simulator, other: Simulator) -> None:
    ask(store, local, where="id < 4")
    assert local.stats()["paid"] == 4
    with pytest.raises(InvalidInputError, match=f"sends its requests to {local.server_url}"):
        resume(store, "t", "s", progress=False, client=anthropic.AsyncAnthropic(api_key="x"))
    with pytest.raises(InvalidInputError, match=f"pass base_url='{local.server_url}'"):
        resume(store, "t", "s", progress=False, base_url=other.server_url)
    assert other.stats()["requests"] == 0
    resume(store, "t", "s", progress=False, base_url=local.server_url)
    assert local.stats()["paid"] == 12
    assert cli(["run", str(store), "--table", "t", "--step", "s", "--base-url", local.server_url, "--quiet"]) == 0
    assert local.stats()["paid"] == 12  # nothing left


def test_the_cli_reads_a_servers_key_from_the_variable_it_is_told(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Simulator(compatible=True, models=(LOCAL,), api_key="secret-of-the-proxy") as proxy:
        ask(store, proxy, where="id < 2", api_key="secret-of-the-proxy")
        monkeypatch.setenv("PROXY_KEY", "secret-of-the-proxy")
        base = ["run", str(store), "--table", "t", "--step", "s", "--base-url", proxy.server_url, "--quiet"]
        assert cli([*base, "--api-key-env", "NOT_SET_ANYWHERE"]) != 0
        assert "NOT_SET_ANYWHERE" in capsys.readouterr().err
        assert cli([*base, "--api-key-env", "PROXY_KEY"]) == 0
        assert proxy.stats()["paid"] == 12


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base_url": "localhost:8000"}, "must be the http"),
        ({"base_url": "http://localhost:99999"}, "out of range"),
        ({"base_url": "http://localhost:abc"}, "must be the http"),
        ({"base_url": "http://localhost:8000\n"}, "control characters"),
        ({"base_url": "https://api.anthropic.com "}, "spaces"),
        ({"base_url": "http://:8000"}, "with a host"),
        ({"base_url": "http://localhost:8000/?key=x"}, "query"),
        ({"base_url": "http://localhost:8000", "mode": "auto", "wait": False}, "background=True"),
        ({"base_url": ""}, "non-empty string"),
        ({"api_key": 42}, "non-empty string"),
        ({"client": anthropic.AsyncAnthropic(api_key="x"), "base_url": "http://localhost:8000"}, "not both"),
        ({"client": anthropic.AsyncAnthropic(api_key="x"), "api_key": "k"}, "not both"),
    ],
)
def test_bad_server_options_are_refused_before_anything_is_written(
    store: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        apply_llm(frame(3), "s", prompt=PROMPT, store=store, progress=False, **options)
    assert not store.exists()


def test_secrets_in_a_url_are_refused_without_being_repeated(store: Path) -> None:
    for mode in ("batch", "online"):
        with pytest.raises(InvalidInputError) as refused:
            apply_llm(frame(3), "s", prompt=PROMPT, store=store, progress=False, mode=mode,
                      base_url="http://alice:hunter2@localhost:8000/v?token=SECRET")  # fmt: skip
        assert "api_key=" in str(refused.value)
        assert "hunter2" not in str(refused.value) and "SECRET" not in str(refused.value)
    assert not store.exists()


def test_the_environments_key_goes_only_to_anthropics_own_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmledger._run.endpoints import NO_KEY, client_for

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    mimic, endpoint = client_for(None, "http://evil.example.com/llmledger-simulator", None)  # not this machine's
    assert mimic.api_key == NO_KEY and endpoint == "http://evil.example.com/llmledger-simulator"
    own, endpoint = client_for(None, "https://api.anthropic.com/", None)
    assert own.api_key == "sk-ant-env" and endpoint is None


def test_an_estimate_on_another_server_offers_no_batch_price(store: Path) -> None:
    llmledger.set_price("local-priced", input=1.0, output=2.0)
    got = llmledger.estimate(frame(4), "s", prompt=PROMPT, model="local-priced", store=store,
                             base_url="http://localhost:8000")  # fmt: skip
    assert got["cost_usd"][0] > 0 and got["cost_usd_batch"][0] is None


def test_requests_at_once_follow_a_server_that_announces_no_limits(store: Path) -> None:
    """A server working on 4 requests at once, refusing beyond 4 more waiting: 32 at once would be refused over and
    over; the run finds the server's limit instead, and its 429s stay rare."""
    # each answer takes 0.2 s, so the server, not the client, is the bottleneck even on a loaded machine: with
    # 0.03 s a client sharing 2 cores with 3 other test workers could not keep 8 requests at the server, and the
    # fixed run was refused as rarely as the adaptive one (20 against 14 in one CI run); with 0.1 s a CI run under
    # the heaviest load saw 31 refusals of 151 for the adaptive run. At 0.2 s, beside three other test workers: 3
    # refusals of 123 adaptive, 116 to 124 fixed
    slow = {"compatible": True, "models": (LOCAL,), "capacity": 4, "queue_limit": 4, "latency": 0.2}
    with Simulator(**slow) as server:
        ask(store, server, rows=80, concurrency=32)
        adaptive = server.stats()
    with Simulator(**slow) as server:
        with pytest.MonkeyPatch.context() as patch:  # the same run with its adaptation turned off
            patch.setattr("llmledger._exec.online.AdaptiveLimit", lambda concurrency: None)
            apply_llm(frame(80), "s", prompt=PROMPT, model=LOCAL, store=store.with_name("fixed.duckdb"),
                      table="t", base_url=server.server_url, concurrency=32, progress=False)  # fmt: skip
        blunt = server.stats()
    assert adaptive["paid"] == blunt["paid"] == 80
    refused, blunt_refused = adaptive["by_status"].get(429, 0), blunt["by_status"].get(429, 0)
    # at most one request in ten refused (4 or 5 of 125 while the floors tier ran beside it); the point is the ratio
    assert refused <= 0.1 * adaptive["requests"], adaptive["by_status"]
    # a third or less of the fixed run's refusals (80 to 90 under the same load; benchmark (j) measures the ratio)
    assert blunt_refused >= 3 * max(refused, 1), (refused, blunt_refused)


def test_the_simulator_answers_as_such_a_server_does(local: Simulator) -> None:
    client = anthropic.Anthropic(base_url=local.server_url, api_key="llmledger-no-key")
    raw = client.messages.with_raw_response.create(
        model=LOCAL,
        max_tokens=20,
        system=[{"type": "text", "text": "long " * 2000, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}],
    )
    assert not [h for h in raw.headers if h.startswith("anthropic-ratelimit")]
    usage = raw.parse().usage
    assert not usage.cache_creation_input_tokens and not usage.cache_read_input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.list()
    with pytest.raises(anthropic.NotFoundError):  # it serves the model it was started with, no other
        client.messages.create(model="claude-haiku-4-5", max_tokens=5, messages=[{"role": "user", "content": "hi"}])


def test_a_server_that_is_not_running_fails_fast_and_says_so(store: Path) -> None:
    """Found in a trial: the docs' local-server line with no server running retried refused connections for 60 s,
    then stopped with an OutageError after saying the server "announces no rate limits"."""
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(llmledger.OutageError, match=r"nothing answers at http://127.0.0.1:\d+.*refused"):
        apply_llm(frame(5), "s", prompt=PROMPT, model=LOCAL, base_url=f"http://127.0.0.1:{port}", store=store,
                  progress=False)  # fmt: skip
    assert time.monotonic() - started < 20, "a refused connection is not an outage to wait out"
    assert sql(store, "SELECT count(*) FROM ledger WHERE s_status = 'NOT_STARTED'") == [(5,)]
