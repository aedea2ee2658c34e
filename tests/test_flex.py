"""OpenAI's flex processing as a mode (`mode="flex"`): online requests at the flex tier, priced at its rate, its
429 "Resource Unavailable" retried and never counted against a row; the tier is how a row is sent, not part of its
request, so flex and standard answers stand in for each other."""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report
from llmledger._exec.config import RetryPolicy

from .conftest import frame

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")
GPT = "openai:gpt-6.1-terra"  # a flex rate of 0.5 in prices.json
NO_FLEX = "openai:gpt-6.2-sol"  # its page names Batch only
FAST = RetryPolicy(base_delay=0.01, max_delay=0.05)


@pytest.fixture
def ask(sim: Simulator, store: Path) -> Any:
    oa = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")
    return functools.partial(apply_llm, client=oa, store=store, table="t", progress=False, model=GPT,
                             prompt="Summarize: {text}")  # fmt: skip


def bodies(sim: Simulator) -> list[dict[str, Any]]:
    return [e["body"] for e in sim.log() if e["status"] == 200]


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_flex_sends_at_the_flex_tier_prices_it_there_and_keeps_it_out_of_the_request(
    ask: Any, sim: Simulator, store: Path, api: str, tmp_path: Path
) -> None:
    out = ask(frame(10), "flexed", mode="flex", api=api)
    assert out["flexed_status"].to_list() == ["DONE"] * 10
    assert all(b["service_tier"] == "flex" for b in bodies(sim)) and len(bodies(sim)) == 10
    report = last_report()
    assert report is not None and report.mode == "flex" and report.flex_saved_usd > 0
    assert "flex prices" in report.avoided_reasons()
    elsewhere = tmp_path / "standard.duckdb"  # in this store, the same requests would reuse the flex answers
    ask(frame(10), "flexed", api=api, store=elsewhere)
    ((flexed,),) = llmledger.sql(store, "SELECT sum(flexed_cost_usd) FROM t").rows()
    ((standard,),) = llmledger.sql(elsewhere, "SELECT sum(flexed_cost_usd) FROM t").rows()
    assert flexed == pytest.approx(standard / 2), "the flex rate: half"
    assert report.flex_saved_usd == pytest.approx(standard - flexed)
    sim.reset_stats()
    again = ask(frame(10), "flexed", api=api)  # the same step, standard tier: nothing stale, nothing paid
    assert sim.stats()["paid"] == 0 and not again["flexed_stale"].any()
    stored = llmledger.sql(store, "SELECT request FROM llmledger_steps WHERE step = 'flexed'")["request"][0]
    assert "service_tier" not in stored


def test_resource_unavailable_is_retried_and_never_counts_against_a_row(ask: Any, sim: Simulator, store: Path) -> None:
    sim.configure(flex_unavailable=0.5, seed=3)
    out = ask(frame(20), "s", mode="flex", retry=FAST)
    assert out["s_status"].to_list() == ["DONE"] * 20
    assert sim.stats()["by_status"].get(429, 0) > 0
    assert llmledger.sql(store, "SELECT max(s_attempts) AS most, count(s_error) AS errors FROM t").rows() == [(1, 0)]
    report = last_report()
    assert report is not None and report.retries == sim.stats()["by_status"][429]
    assert sim.stats()["paid"] == 20, "a 429 is not charged, and each row paid once"


def test_flex_is_refused_where_there_is_none_and_writes_nothing(ask: Any, client: Any, store: Path) -> None:
    with pytest.raises(InvalidInputError, match="OpenAI's flex processing"):
        apply_llm(frame(2), "s", prompt="x {text}", client=client, store=store, progress=False, mode="flex")
    with pytest.raises(InvalidInputError, match=r"no flex processing for 'gpt-6\.2-sol'.*gpt-6\.1-terra"):
        ask(frame(2), "s", mode="flex", model=NO_FLEX)
    with pytest.raises(InvalidInputError, match="wait=False"):
        ask(frame(2), "s", mode="flex", wait=False)
    assert not store.exists()


def test_the_estimate_says_what_flex_would_cost(ask: Any, client: Any, store: Path) -> None:
    common = {"prompt": "Summarize: {text}", "store": store, "table": "t"}
    oa = ask.keywords["client"]
    got = llmledger.estimate(frame(20), "s", client=oa, model=GPT, **common)
    assert got["cost_usd_flex"][0] == pytest.approx(got["cost_usd"][0] / 2)
    assert llmledger.estimate(frame(20), "c", client=client, **common)["cost_usd_flex"][0] is None


def test_a_deadline_moves_the_rest_to_the_standard_tier_in_time(ask: Any, sim: Simulator, store: Path) -> None:
    """Flex has no capacity at all: the run tries it for a fifth of the time, then sends the rest at the standard
    tier and ends before the deadline, priced at the standard rate. (It takes about 4 s on an idle machine: the
    deadline leaves room for a CI machine running two suites at once, where it took 8.2 s of an 8 s deadline.)"""
    sim.configure(flex_unavailable=1.0)
    started = time.monotonic()
    out = ask(frame(30), "s", mode="flex", deadline=15.0, retry=FAST)
    assert time.monotonic() - started < 15.0 and out["s_status"].to_list() == ["DONE"] * 30
    report = last_report()
    assert report is not None and report.standard_for_deadline == 30 and report.flex_saved_usd == 0
    assert any("standard tier" in hint and "deadline" in hint for hint in report.hints())
    answered = [e["body"].get("service_tier") for e in sim.log() if e["status"] == 200]
    refused = [e["body"].get("service_tier") for e in sim.log() if e["status"] == 429]
    assert answered == [None] * 30 and refused and set(refused) == {"flex"}, "flex tried first, then standard"


def test_a_deadline_the_flex_pace_meets_keeps_every_row_at_flex(ask: Any, sim: Simulator) -> None:
    ask(frame(12), "s", mode="flex", deadline=timedelta(hours=1))
    report = last_report()
    assert report is not None and report.standard_for_deadline == 0
    assert all(b.get("service_tier") == "flex" for b in bodies(sim))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"deadline": 60.0}, "works with mode='batch'"),
        ({"mode": "flex", "deadline": -5}, "in the future"),
        ({"mode": "flex", "deadline": datetime(2020, 1, 1, tzinfo=UTC)}, "in the future"),
        ({"mode": "flex", "deadline": "tomorrow"}, "a datetime, a timedelta or seconds"),
        ({"mode": "batch", "deadline": datetime(9999, 12, 31, tzinfo=UTC)}, "at most 366 days from now"),
        ({"mode": "batch", "deadline": 1e12, "wait": False}, "at most 366 days from now"),
    ],
)
def test_a_bad_deadline_is_refused_and_writes_nothing(
    ask: Any, store: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ask(frame(2), "s", **options)
    assert not store.exists()
