"""A declared gateway (`gateway=True`): a URL that forwards to the provider's own API (a LiteLLM proxy, Portkey,
Helicone, Cloudflare AI Gateway). Its requests name it, as any server's do, and the run uses what the provider has
through it: batches at the batch price, prices, rate-limit headers when forwarded. The simulator's unmarked URL
plays the gateway: it answers as Anthropic's API does (headers, batches), under a URL that is not Anthropic's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report, resume
from llmledger.cli import main as cli

from .conftest import frame, sql

PROMPT = "Summarize: {text}"
MODEL = "claude-haiku-5-5"


@pytest.fixture
def gateway() -> Any:
    with Simulator(batch_delay=0.2) as server:
        yield server


def ask(store: Path, server: Simulator, rows: int = 12, **options: Any) -> Any:
    return apply_llm(frame(rows), "s", prompt=PROMPT, model=MODEL, store=store, table="t",
                     base_url=options.pop("base_url", server.server_url), progress=False, **options)  # fmt: skip


def test_a_gateway_sends_batches_at_the_batch_price_and_every_request_names_it(
    store: Path, gateway: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-forwarded")
    with pytest.raises(InvalidInputError, match="gateway=True"):  # a plain server has no batches
        ask(store, gateway, mode="batch")
    out = ask(store, gateway, mode="batch", gateway=True)
    assert out["s_status"].to_list() == ["DONE"] * 12
    stats = gateway.stats()
    assert stats["batches"] == 1 and stats["batch_paid"] == 12 and stats["paid"] == 12
    (stored,) = sql(store, "SELECT request FROM llmledger_steps WHERE step = 's'")[0]
    assert json.loads(stored)["llmledger_endpoint"] == gateway.server_url  # provenance: the gateway is named
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {gateway.server_url}
    price = llmledger.prices().filter(model=MODEL).row(0, named=True)
    for tokens_in, tokens_out, cost in sql(store, "SELECT s_input_tokens, s_output_tokens, s_cost_usd FROM t"):
        assert cost == pytest.approx(0.5 * (tokens_in * price["input"] + tokens_out * price["output"]) / 1e6)
    assert any("is a gateway to Anthropic's API" in note for note in last_report().notes)
    ask(store, gateway, gateway=True)  # a rerun pays nothing
    assert gateway.stats()["paid"] == 12


def test_the_gateway_gets_the_environments_key_and_a_plain_server_never_does(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-forwarded")
    with Simulator(api_key="sk-ant-forwarded") as forwarding:
        out = ask(store, forwarding, gateway=True)  # the gateway forwards the provider's key: it gets it
        assert out["s_status"].to_list() == ["DONE"] * 12
        with pytest.raises(llmledger.AuthenticationFailed):  # another server gets a placeholder, never the key
            apply_llm(frame(3), "other", prompt="Describe: {text}", model=MODEL, store=store, table="t",
                      base_url=forwarding.server_url, progress=False)  # fmt: skip


def test_batches_sent_through_a_gateway_are_collected_through_it_later(store: Path, gateway: Simulator) -> None:
    gateway.configure(batch_delay=1.0)
    ask(store, gateway, mode="batch", gateway=True, wait=False, api_key="k")
    assert sql(store, "SELECT count(*) FROM t WHERE s_status = 'SUBMITTED'") == [(12,)]
    forgot = resume(store, "t", "s", base_url=gateway.server_url, api_key="k", progress=False)  # gateway= left out
    assert any("pass gateway=True (--gateway) to collect them" in note for note in forgot.notes)
    report = resume(
        store, "t", "s", base_url=gateway.server_url, gateway=True, api_key="k", mode="batch", progress=False
    )
    assert report.done == 12 and sql(store, "SELECT count(*) FROM t WHERE s_status = 'DONE'") == [(12,)]
    assert gateway.stats()["batch_paid"] == 12 and gateway.stats()["paid"] == 12  # each row paid once, batched


def test_a_gateway_that_forwards_rate_limit_headers_is_paced_by_them(store: Path) -> None:
    with Simulator(rate_limit=40, latency=0.02) as server:  # Anthropic's headers, forwarded by the gateway
        ask(store, server, rows=40, gateway=True, concurrency=8, api_key="k")
        report = last_report()
        assert report is not None and report.binding_limit.startswith("requests")
        assert any("is a gateway to Anthropic's API" in note for note in report.notes)
        assert server.stats()["by_status"].get(429, 0) <= 2


def test_gateway_needs_a_server_and_a_bool(store: Path, gateway: Simulator) -> None:
    with pytest.raises(InvalidInputError, match="names none"):
        apply_llm(frame(3), "s", prompt=PROMPT, store=store, gateway=True, api_key="k", progress=False)
    with pytest.raises(InvalidInputError, match="gateway must be True or False"):
        ask(store, gateway, gateway="yes")
    assert not store.exists()


def test_the_cli_sends_through_a_gateway(store: Path, gateway: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-forwarded")
    ask(store, gateway, gateway=True, where="id < 4")
    base = ["run", str(store), "--table", "t", "--step", "s", "--base-url", gateway.server_url, "--quiet"]
    assert cli([*base, "--gateway", "--mode", "batch"]) == 0
    assert gateway.stats()["batch_paid"] == 8 and gateway.stats()["paid"] == 12
