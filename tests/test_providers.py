"""The provider contract: what the ledger promises, held the same for each provider's API, with its real SDK
against the simulator (Anthropic's Messages API; OpenAI's Chat Completions for a model named "openai:...").

Each test runs once per provider; what only one provider does (OpenAI's body and caching, Anthropic's batches)
is tested in that provider's own files."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import ModelNotFound, RequestRefused, RetryPolicy, Simulator, SpendLimitReached, apply_llm, last_report
from llmledger._step.request import fingerprint

from .conftest import frame

FAST = RetryPolicy(base_delay=0.01, max_delay=0.05, outage_after=0.5, outage_failures=5)
PROMPT = "Summarize: {text}"


@dataclass(frozen=True)
class Provider:
    name: str
    model: str  # as model= names it
    client: Any
    account_stop: str  # the simulator fault by which the provider says the account cannot spend
    mark: dict[str, str]  # what the fingerprinted document adds to the body sent
    options: dict[str, Any]  # what apply_llm is told besides the model: api="chat" for Chat Completions

    def bodies(self, sim: Simulator) -> list[dict[str, Any]]:
        return [entry["body"] for entry in sim.log() if entry["status"] == 200]

    def row_text(self, body: dict[str, Any]) -> Any:
        """The row's own message in a body sent: the last of its `messages` (or Responses' `input`)."""
        return body.get("messages", body.get("input"))[-1]["content"]


# OpenAI's own API takes a new step through the Responses API; Chat Completions when asked (api="chat")
@pytest.fixture(params=["anthropic", "openai", "openai-chat"])
def provider(request: pytest.FixtureRequest, sim: Simulator) -> Provider:
    if request.param == "anthropic":
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
        return Provider("anthropic", "m", client, "enforced_spend_limit_reached", {}, {})
    openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")
    client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")
    if request.param == "openai-chat":
        chat = {"llmledger_provider": "openai"}
        return Provider("openai", "openai:gpt-6.1-terra", client, "insufficient_quota", chat, {"api": "chat"})
    mark = {"llmledger_provider": "openai", "llmledger_api": "responses"}
    return Provider("openai", "openai:gpt-6.1-terra", client, "insufficient_quota", mark, {})


@pytest.fixture
def ask(provider: Provider, target: Any) -> Any:
    """apply_llm with the provider's model and client, on each store engine."""
    return functools.partial(
        apply_llm,
        client=provider.client,
        model=provider.model,
        store=target,
        table="t",
        progress=False,
        **provider.options,
    )


def column(ask: Any, query: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in llmledger.sql(ask.keywords["store"], query).iter_rows()]


def test_a_rerun_pays_nothing_and_each_row_is_fingerprinted_by_the_body_it_was_sent(
    ask: Any, provider: Provider, sim: Simulator
) -> None:
    out = ask(frame(10, word="same").vstack(frame(2, start=10)), "s", prompt=PROMPT, system="Be brief.")
    assert out["s_status"].to_list() == ["DONE"] * 12 and sim.stats()["paid"] == 12
    sent = {provider.row_text(b): fingerprint({**b, **provider.mark}) for b in provider.bodies(sim)}
    stored = dict(column(ask, "SELECT s_prompt, s_fingerprint::VARCHAR FROM t"))
    assert stored == sent, "the fingerprint is the body sent, with the provider's mark"
    again = ask(frame(10, word="same").vstack(frame(2, start=10)), "s", prompt=PROMPT, system="Be brief.")
    assert sim.stats()["paid"] == 12 and again["s"].to_list() == out["s"].to_list()
    assert last_report().calls == 0  # type: ignore[union-attr]


def test_a_structured_answer_gets_one_retry_then_needs_review(ask: Any, sim: Simulator) -> None:
    sim.configure(bad_json_once="number 1", bad_json="number 2")
    out = ask(frame(4), "v", prompt=PROMPT, output={"company": str, "year": int})
    assert out["v_status"].to_list() == ["DONE", "DONE", "NEEDS_REVIEW", "DONE"]
    assert sorted(f.name for f in out.schema["v"].fields) == ["company", "year"]
    assert out["v"].struct.field("year").is_not_null().sum() == 3
    assert sim.stats()["paid"] == 6, "rows 1 and 2 were asked twice, the others once"


def test_a_refusal_is_paid_and_fails_the_row(ask: Any, sim: Simulator) -> None:
    sim.configure(refuse="number 2")
    out = ask(frame(4), "s", prompt=PROMPT)
    assert out["s_status"].to_list() == ["DONE", "DONE", "FAILED", "DONE"]
    assert "refusal" in column(ask, "SELECT s_error FROM t WHERE id = 2")[0][0]
    report = last_report()
    assert report is not None and report.calls == sim.stats()["paid"] == 4
    ((cost, tokens),) = column(ask, "SELECT s_cost_usd, s_input_tokens FROM t WHERE id = 2")
    assert tokens > 0, "the refusal was billed: its row says what it used"
    if report.cost_usd is not None:  # a priced model: and what it cost, as the run counted it
        assert cost > 0 and column(ask, "SELECT sum(s_cost_usd) FROM t")[0][0] == pytest.approx(report.cost_usd)


@pytest.mark.parametrize("provider", ["anthropic", "openai"], indirect=True)  # the API makes no difference here
def test_the_accounts_stop_stops_the_run_at_once_and_fails_no_row(ask: Any, provider: Provider, sim: Simulator) -> None:
    ask(frame(4), "s", prompt=PROMPT)
    sim.configure(fail_next=[provider.account_stop])
    started = time.monotonic()
    with pytest.raises(SpendLimitReached, match=provider.account_stop):
        ask(frame(40), "s", prompt=PROMPT, concurrency=1, retry=FAST)
    assert time.monotonic() - started < 5
    assert column(ask, "SELECT s_status, count(*) FROM t GROUP BY s_status ORDER BY s_status") == [
        ("DONE", 4),
        ("NOT_STARTED", 36),
    ]
    assert ask(frame(40), "s", prompt=PROMPT)["s_status"].to_list() == ["DONE"] * 40


@pytest.mark.parametrize("fault", [429, 500, 503])
@pytest.mark.parametrize("provider", ["anthropic", "openai"], indirect=True)  # the API makes no difference here
def test_rate_limits_and_server_errors_are_retried_without_counting_against_the_row(
    ask: Any, sim: Simulator, fault: int
) -> None:
    sim.configure(fail_next=[fault, fault])
    out = ask(frame(3), "s", prompt=PROMPT, concurrency=1, retry=FAST)
    assert out["s_status"].to_list() == ["DONE"] * 3
    assert column(ask, "SELECT max(s_attempts) FROM t") == [(1,)]
    assert last_report().retries == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("provider", ["anthropic", "openai"], indirect=True)  # the API makes no difference here
def test_a_model_the_api_does_not_have_stops_the_run(ask: Any, provider: Provider) -> None:
    model = provider.model.replace("gpt-6.1-terra", "gpt-nope") if provider.name == "openai" else "claude-nope"
    with pytest.raises(ModelNotFound, match="nope"):
        ask(frame(3), "s", prompt=PROMPT, model=model)


@pytest.mark.parametrize("provider", ["anthropic", "openai"], indirect=True)  # the API makes no difference here
def test_a_request_refused_alike_stops_the_run_with_the_apis_reason(ask: Any, sim: Simulator) -> None:
    sim.configure(poison="message")
    with pytest.raises(RequestRefused, match="first 8 distinct requests alike"):
        ask(frame(40), "s", prompt=PROMPT, concurrency=1)
    assert sim.stats()["requests"] == 8


@pytest.mark.parametrize("provider", ["anthropic", "openai"], indirect=True)  # the API makes no difference here
def test_each_answer_records_how_long_its_request_took(ask: Any, sim: Simulator) -> None:
    sim.configure(latency=0.05)
    df = pl.DataFrame({"id": [1, 2, 3], "text": ["same", "same", "other"]})
    ask(df, "s", prompt=PROMPT)
    ask(df, "c", prompt="Classify: {text}")
    rows = column(ask, "SELECT id, s_latency_ms FROM t ORDER BY id")
    paid = [latency for _, latency in rows if latency is not None]
    assert len(paid) == 2 and all(50 <= ms < 5_000 for ms in paid), "the two requests sent; the twin reused one"
    per_step = llmledger.compare(ask.keywords["store"], "t", ["s", "c"]).per_step
    assert per_step["latency_ms_per_row"].min() >= 50


def test_a_row_refused_then_answered_keeps_what_its_refusals_cost(ask: Any, sim: Simulator) -> None:
    """Found by attack: a row's paid refusals were summed on it, then overwritten by the answer that followed, so
    the fact table no longer added up to what the runs paid."""
    sim.configure(refuse="number 2")
    ask(frame(4), "s", prompt=PROMPT)
    sim.configure(refuse=None)
    out = ask(frame(4), "s", prompt=PROMPT)  # the FAILED row is asked again, and answered
    assert out["s_status"].to_list() == ["DONE"] * 4 and sim.stats()["paid"] == 5
    ((rows,),) = column(ask, "SELECT sum(s_input_tokens) FROM t")
    ((runs,),) = column(ask, "SELECT sum(input_tokens) FROM llmledger_runs")
    assert rows == runs, "the rows' tokens add up to the runs', the refusal's included"
