"""Claude through Amazon Bedrock and Google Vertex AI, GPT through Azure OpenAI: the SDKs' own clients for them
(`AsyncAnthropicBedrock`, `AsyncAnthropicVertex`, `AsyncAzureOpenAI`) as `client=`, against the simulator's routes
for each platform (Bedrock's `/model/{id}/invoke` with SigV4-signed requests, Vertex AI's `:rawPredict`, Azure's
`/openai/deployments/{name}/chat/completions?api-version=`). Each platform is its own endpoint (provenance); the
answers are priced as the provider's. Azure's Batch API is driven; Bedrock's and Vertex AI's batch mechanisms are
not, so `mode="batch"` refuses there with why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report

from .conftest import frame, real_api_client, sql

PROMPT = "Summarize: {text}"


@pytest.fixture
def server() -> Any:
    with Simulator() as sim:
        yield sim


def vertex(sim: Simulator) -> Any:
    return anthropic.AsyncAnthropicVertex(region="us-east5", project_id="proj", access_token="tok",
                                          base_url=sim.server_url)  # fmt: skip


def bedrock(sim: Simulator) -> Any:
    pytest.importorskip("boto3", reason="Bedrock's client signs with botocore: pip install 'anthropic[bedrock]'")
    return anthropic.AsyncAnthropicBedrock(aws_access_key="AKIA-test", aws_secret_key="secret",
                                           aws_region="us-east-1", base_url=sim.server_url)  # fmt: skip


def azure(sim: Simulator) -> Any:
    openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")
    return openai.AsyncAzureOpenAI(azure_endpoint=sim.server_url, api_version="2024-10-21", api_key="k")


CLOUDS = {  # client maker, model= as the platform names it, the price table's model, the endpoint's path
    "vertex": (vertex, "claude-haiku-5-5", "claude-haiku-5-5", ""),
    "bedrock": (bedrock, "us.anthropic.claude-haiku-5-5", "claude-haiku-5-5", ""),
    "azure": (azure, "openai:gpt-6.1-terra", "gpt-6.1-terra", "/openai"),  # the deployment named after its model
}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_a_cloud_client_answers_online_names_its_endpoint_and_is_priced(
    cloud: str, server: Simulator, store: Path
) -> None:
    make, model, priced_as, path = CLOUDS[cloud]
    client = make(server)
    ask = {"prompt": PROMPT, "model": model, "client": client, "store": store, "table": "t", "progress": False}
    out = apply_llm(frame(8), "s", **ask)
    assert out["s_status"].to_list() == ["DONE"] * 8 and server.stats()["paid"] == 8
    (stored,) = sql(store, "SELECT request FROM llmledger_steps WHERE step = 's'")[0]
    named = f"{cloud}:{server.server_url}{path}"  # provenance: the platform, and its URL
    assert json.loads(stored)["llmledger_endpoint"] == named
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {named}
    price = llmledger.prices().filter(model=priced_as).row(0, named=True)
    for tokens_in, tokens_out, cost in sql(store, "SELECT s_input_tokens, s_output_tokens, s_cost_usd FROM t"):
        assert cost == pytest.approx((tokens_in * price["input"] + tokens_out * price["output"]) / 1e6)
    apply_llm(frame(8), "s", **ask)
    assert server.stats()["paid"] == 8 and last_report().calls == 0  # type: ignore[union-attr]
    if cloud == "azure":  # its Batch API is driven: test_azure_batches_answer_at_half_the_price
        return
    with pytest.raises(InvalidInputError, match=r"mode='batch'.*pass mode='online'"):
        apply_llm(frame(8), "b", **{**ask, "mode": "batch"})
    assert sql(store, "SELECT count(*) FROM llmledger_steps WHERE step = 'b'") == [(0,)]  # nothing written


def test_azure_batches_answer_at_half_the_price_and_a_rerun_pays_nothing(server: Simulator, store: Path) -> None:
    """Azure OpenAI's Batch API (a global batch deployment): the file and batch under `/openai/` with the
    api-version, lines naming `/chat/completions` and the deployment; the answers are Azure's (provenance), at
    half the online price; `mode="auto"` takes batches there too."""
    ask = {"prompt": PROMPT, "model": "openai:gpt-6.1-terra", "client": azure(server), "store": store, "table": "t",
           "progress": False}  # fmt: skip
    df = pl.DataFrame({"id": range(12), "text": [f"note {i % 10}" for i in range(12)]})  # 2 duplicates
    out = apply_llm(df, "s", mode="batch", **ask)
    assert out["s_status"].to_list() == ["DONE"] * 12
    stats = server.stats()
    assert stats["batches"] == 1 and stats["batch_paid"] == 10 and stats["paid"] == 10 and not server.log()
    named = f"azure:{server.server_url}/openai"
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {named}
    assert sql(store, "SELECT source, state FROM llmledger_batches") == [(named, "merged")]
    price = llmledger.prices().filter(model="gpt-6.1-terra").row(0, named=True)
    for tokens_in, tokens_out, cost in sql(store, "SELECT s_input_tokens, s_output_tokens, s_cost_usd FROM t"):
        assert cost == pytest.approx((tokens_in * price["input"] + tokens_out * price["output"]) / 2e6)
    apply_llm(df, "s", mode="batch", **ask)
    assert server.stats()["batches"] == 1 and server.stats()["paid"] == 10, "a rerun pays nothing"
    with pytest.raises(InvalidInputError, match="Azure OpenAI client is not supported yet"):
        apply_llm(df, "r", mode="batch", api="responses", **ask)
    openai = pytest.importorskip("openai")  # a step made with Responses elsewhere, then run through Azure's client
    own = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="k")
    apply_llm(df, "made", **{**ask, "client": own}, api="responses")
    with pytest.raises(InvalidInputError, match=r"made for OpenAI's Responses API.*api='chat'"):  # found by attack
        apply_llm(df, "made", **ask)


def test_clients_of_two_platforms_at_one_url_are_two_endpoints(server: Simulator, store: Path) -> None:
    """A proxy may give Vertex AI's client, Bedrock's and Anthropic's own the same URL: the platform is named with
    it, so no platform's answers stand in for another's."""
    ask = {"prompt": PROMPT, "store": store, "table": "t", "progress": False}
    apply_llm(frame(3), "s", model="claude-haiku-5-5", client=vertex(server), **ask)
    assert {r[0] for r in sql(store, "SELECT s_source FROM t")} == {f"vertex:{server.server_url}"}
    with pytest.raises(InvalidInputError, match="a vertex client, client="):  # only the platform's client reaches it
        llmledger.resume(store, "t", "s", base_url=server.server_url, progress=False)
    plain = anthropic.AsyncAnthropic(base_url=server.server_url, api_key="k")
    with pytest.warns(llmledger.StaleAnswersWarning, match="3 DONE rows are stale"):
        apply_llm(frame(3), "s", model="claude-haiku-5-5", client=plain, **ask)
    apply_llm(frame(3), "s2", model="claude-haiku-5-5", client=plain, **ask)  # a new step: asked, not reused
    assert server.stats()["paid"] == 6


def test_responses_through_azure_is_refused_up_front(server: Simulator, store: Path) -> None:
    with pytest.raises(InvalidInputError, match="Azure OpenAI client is not supported yet"):
        apply_llm(frame(3), "s", prompt=PROMPT, model="openai:gpt-6.1-terra", client=azure(server), store=store,
                  api="responses", progress=False)  # fmt: skip
    assert not store.exists()


def test_answers_from_a_cloud_are_not_served_as_anthropics(server: Simulator, store: Path) -> None:
    own = real_api_client(server)  # Anthropic's own API, answered by the simulator
    apply_llm(frame(4), "s", prompt=PROMPT, model="claude-haiku-5-5", client=own, store=store, table="t",
              progress=False)  # fmt: skip
    with pytest.warns(llmledger.StaleAnswersWarning, match="4 DONE rows are stale"):
        out = apply_llm(frame(4), "s", prompt=PROMPT, model="claude-haiku-5-5", client=vertex(server), store=store,
                        table="t", progress=False)  # fmt: skip
    assert out["s_stale"].all() and server.stats()["paid"] == 4
