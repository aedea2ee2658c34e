"""OpenAI models (`model="openai:..."`) behind the same ledger: the real `openai` SDK against the simulator's chat
completions route, which answers with OpenAI's bodies, errors and `x-ratelimit-*` headers. What every provider
promises alike (reruns, structured answers, refusals, the account's stop, retries) is in test_providers.py; this
file holds what is OpenAI's own: its body, provenance across providers, caching, its refusals of bad calls."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import (
    InvalidInputError,
    RequestRefused,
    RetryPolicy,
    Simulator,
    apply_llm,
    last_report,
    resume,
)
from llmledger._step.request import fingerprint

from .conftest import TEST_MODELS, frame, sql

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")

GPT = "openai:gpt-6.1-terra"
PROMPT = "Summarize: {text}"
FAST = RetryPolicy(base_delay=0.01, max_delay=0.05, outage_after=0.5, outage_failures=5)


@pytest.fixture
def oa(sim: Simulator) -> Any:
    return openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")


@pytest.fixture
def ask(oa: Any, store: Path) -> Any:
    """apply_llm on an OpenAI model, with the test client, store and table filled in."""
    return functools.partial(apply_llm, client=oa, store=store, table="t", progress=False, model=GPT)


def stored_bodies(sim: Simulator) -> list[dict[str, Any]]:
    return [entry["body"] for entry in sim.log() if entry["status"] == 200]


RESPONSES_MARK = {"llmledger_provider": "openai", "llmledger_api": "responses"}


def test_rows_are_answered_through_the_responses_api_and_a_rerun_pays_nothing(
    ask: Any, sim: Simulator, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = ask(frame(12), "s", prompt=PROMPT, system="Be brief.", max_tokens=40)
    assert out["s_status"].to_list() == ["DONE"] * 12
    assert sim.stats()["paid"] == 12
    body = stored_bodies(sim)[0]
    assert body["max_output_tokens"] == 40 and body["instructions"] == "Be brief." and body["store"] is False
    assert "messages" not in body and body["input"][-1]["role"] == "user"
    # each row's fingerprint is that of the body sent, with the provider and API it went to
    sent = {b["input"][-1]["content"]: fingerprint({**b, **RESPONSES_MARK}) for b in stored_bodies(sim)}
    rows = sql(store, "SELECT s_prompt, s_fingerprint::VARCHAR, s_model, s_cost_usd, s_stop_reason FROM t")
    assert {prompt: fp for prompt, fp, *_ in rows} == sent
    assert {r[2] for r in rows} == {"gpt-6.1-terra"} and all(r[3] > 0 for r in rows), "priced from prices.json"
    assert {r[4] for r in rows} == {"end_turn"}, "status 'completed' in the ledger's words"

    again = ask(frame(12), "s", prompt=PROMPT, system="Be brief.", max_tokens=40)
    assert sim.stats()["paid"] == 12 and again["s"].to_list() == out["s"].to_list()
    monkeypatch.setenv("OPENAI_BASE_URL", sim.base_url + "/v1")  # what the SDK itself reads
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    report = resume(store, "t", "s", progress=False)  # makes its own OpenAI client from the environment
    assert report.calls == 0


def test_a_step_moved_between_providers_is_stale_not_paid_and_moving_back_pays_nothing(
    ask: Any, sim: Simulator, store: Path, client: anthropic.AsyncAnthropic
) -> None:
    claude = functools.partial(apply_llm, client=client, store=store, table="t", progress=False, model="m")
    claude(frame(6), "s", prompt=PROMPT)
    with pytest.warns(llmledger.StaleAnswersWarning, match="6 DONE rows are stale"):
        out = ask(frame(6), "s", prompt=PROMPT)
    assert sim.stats()["paid"] == 6 and out["s_stale"].all(), "Claude's answers are not taken for GPT's"
    ask(frame(6), "s", prompt=PROMPT, redo="stale")
    assert sim.stats()["paid"] == 12
    assert sql(store, "SELECT DISTINCT s_model FROM t") == [("gpt-6.1-terra",)]
    with pytest.warns(llmledger.StaleAnswersWarning):
        claude(frame(6), "s", prompt=PROMPT)
    back = claude(frame(6), "s", prompt=PROMPT, redo="stale")
    assert sim.stats()["paid"] == 12 and not back["s_stale"].any(), "Claude's answers come back from the history"
    assert sql(store, "SELECT DISTINCT s_model FROM t") == [("m",)]


def test_resume_refuses_a_client_of_the_other_provider(ask: Any, store: Path, client: Any) -> None:
    ask(frame(3), "s", prompt=PROMPT)
    with pytest.raises(InvalidInputError, match=r"must be an openai\.AsyncOpenAI .*got AsyncAnthropic"):
        resume(store, "t", "s", client=client, progress=False)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_structured_answers_fill_the_same_struct_columns_with_one_retry(
    ask: Any, sim: Simulator, store: Path, api: str
) -> None:
    sim.configure(bad_json_once="number 1", bad_json="number 2")
    output = {"sentiment": Literal["positive", "negative", "neutral"], "score": int}
    out = ask(frame(4), "v", prompt=PROMPT, output=output, api=api)
    body = stored_bodies(sim)[0]
    conversation = "input" if api == "responses" else "messages"
    if api == "responses":  # text.format: the same strict schema, named
        assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["strict"]
    else:
        assert body["response_format"]["type"] == "json_schema" and body["response_format"]["json_schema"]["strict"]
    assert out["v_status"].to_list() == ["DONE", "DONE", "NEEDS_REVIEW", "DONE"]
    assert isinstance(out.schema["v"], pl.Struct) and {f.name for f in out.schema["v"].fields} == {"sentiment", "score"}
    assert sql(store, "SELECT count(*) FROM t WHERE v.sentiment IN ('positive', 'negative', 'neutral')") == [(3,)]
    asked = [b for b in stored_bodies(sim) if b[conversation][0]["content"] == "Summarize: hello message number 1"]
    assert len(asked) == 2 and "does not match the required JSON schema" in asked[1][conversation][-1]["content"]
    assert "does not match the output schema" in sql(store, "SELECT v_error FROM t WHERE id = 2")[0][0]


def test_chat_completions_when_asked_and_a_step_keeps_its_api_until_the_user_moves_it(
    ask: Any, sim: Simulator, store: Path
) -> None:
    """api="chat" sends Chat Completions; the step stays there when run again without api= (its answers are kept),
    and moving it to Responses makes them stale, reported and not paid."""
    ask(frame(6), "s", prompt=PROMPT, system="Be brief.", max_tokens=40, api="chat")
    body = stored_bodies(sim)[0]
    assert body["max_completion_tokens"] == 40 and "max_tokens" not in body, "OpenAI's own API gets its own field"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    sent = {
        b["messages"][-1]["content"]: fingerprint({**b, "llmledger_provider": "openai"}) for b in stored_bodies(sim)
    }
    assert dict(sql(store, "SELECT s_prompt, s_fingerprint::VARCHAR FROM t")) == sent
    ask(frame(6), "s", prompt=PROMPT, system="Be brief.", max_tokens=40)  # no api=: the step's own API
    assert sim.stats()["paid"] == 6 and last_report().calls == 0  # type: ignore[union-attr]
    with pytest.warns(llmledger.StaleAnswersWarning, match="6 DONE rows are stale"):
        moved = ask(frame(6), "s", prompt=PROMPT, system="Be brief.", max_tokens=40, api="responses")
    assert sim.stats()["paid"] == 6 and moved["s_stale"].all()
    ask(frame(6), "s", prompt=PROMPT, system="Be brief.", max_tokens=40, api="responses", redo="stale")
    assert sim.stats()["paid"] == 12 and "input" in stored_bodies(sim)[-1]


def test_an_option_the_model_refuses_stops_the_run_with_openais_reason(ask: Any, store: Path) -> None:
    with pytest.raises(RequestRefused, match=r"first 8 distinct requests alike.*does not support 0 with this model"):
        ask(frame(40), "s", prompt=PROMPT, request_options={"temperature": 0}, concurrency=1, api="chat")
    statuses = dict(sql(store, "SELECT s_status, count(*) FROM t GROUP BY ALL"))
    assert statuses == {"FAILED": 8, "NOT_STARTED": 32}, statuses
    fixed = ask(frame(40), "s", prompt=PROMPT, request_options={"temperature": 1}, api="chat")
    assert fixed["s_status"].to_list() == ["DONE"] * 40, "once the call is fixed, every row is sent"


def test_a_long_shared_prefix_is_cached_automatically_and_priced_as_cached(
    ask: Any, sim: Simulator, store: Path
) -> None:
    system = "You are a careful assistant. " * 400  # well over OpenAI's 1,024-token minimum
    ask(frame(6), "s", prompt=PROMPT, system=system, concurrency=1)
    rows = sql(
        store,
        "SELECT s_cache_read_tokens, s_input_tokens, s_output_tokens, s_cost_usd, s_cache_write_tokens FROM t "
        "ORDER BY id",
    )
    assert rows[0][0] == 0 and all(r[0] > 1024 and r[0] % 128 == 0 for r in rows[1:]), rows
    # GPT-6 models bill the first request's write of the prefix to the cache (1.25x input); the rest read it
    assert rows[0][4] == rows[1][0] and all(r[4] == 0 for r in rows[1:]), rows
    price = llmledger.prices().filter(model="gpt-6.1-terra").row(0, named=True)
    assert price["cache_write_5m"] == 1.25 * price["input"]
    for read, plain, out, cost, wrote in rows:
        expected = (plain * price["input"] + read * price["cache_read"] + wrote * price["cache_write_5m"]) / 1e6
        assert cost == pytest.approx(expected + out * price["output"] / 1e6)
    assert sim.stats()["cache_read_tokens"] == sum(r[0] for r in rows)
    assert sim.stats()["cache_write_tokens"] == rows[0][4]


def test_calls_an_openai_model_cannot_make_are_refused_before_anything_is_written(
    ask: Any, store: Path, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for options, says in [
        ({"mode": "batch", "batch_size": 60_000}, "at most 50,000 .OpenAI's API's limit"),
        ({"cache": "1h"}, "OpenAI.s API caches long prefixes by itself"),
        ({"request_options": {"max_tokens": 5}}, "pass max_tokens= instead"),
        ({"request_options": {"n": 2}}, "one answer per row"),
        ({"request_options": {"temperature": 3}}, "between 0.0 and 2.0"),
        ({"client": client}, "must be an openai.AsyncOpenAI"),
        ({"request_options": {"system": "Be brief."}}, "pass system= instead"),
        ({"request_options": {"llmledger_provider": "anthropic"}}, "pass model='openai:...' instead"),
        ({"model": "m", "request_options": {"llmledger_provider": "openai"}}, "llmledger's own"),
        ({"model": "OPENAI:gpt-6.1-terra"}, "lower case"),
        ({"model": "openai:"}, "no model id"),
        ({"model": "openai: gpt-6.1-terra"}, "no model id, or one with spaces"),
        ({"model": "gpt-6.1-terra "}, "spaces around it"),
    ]:
        with pytest.raises(InvalidInputError, match=says):
            ask(frame(2), "s", prompt=PROMPT, **options)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(InvalidInputError, match="OPENAI_API_KEY"):
        apply_llm(frame(2), "s", prompt=PROMPT, model=GPT, store=store, progress=False)
    assert not store.exists(), "nothing written"


def test_a_model_name_with_a_colon_is_a_model_name(client: Any, sim: Simulator, store: Path) -> None:
    """Only "openai:" and "anthropic:" choose a provider: Ollama's "llama3.2:3b" is a model id as it is."""
    sim.configure(models=(*TEST_MODELS, "llama3.2:3b"))
    apply_llm(frame(2), "s", prompt=PROMPT, model="llama3.2:3b", client=client, store=store, progress=False)
    apply_llm(frame(2), "c", prompt=PROMPT, model="anthropic:m", client=client, store=store, progress=False)
    models = {b["model"] for b in stored_bodies(sim)}
    assert models == {"llama3.2:3b", "m"}


LOCAL = "qwen3:8b"  # a model of a server speaking OpenAI's API, unpriced


def on_local(server: Simulator, rows: int, store: Path, **options: Any) -> pl.DataFrame:
    """apply_llm on the local model at `server` (an OpenAI-compatible one), which warns once that it has no price."""
    with pytest.warns(llmledger.UnknownPriceWarning):
        return apply_llm(
            frame(rows),
            "s",
            prompt=PROMPT,
            model=f"openai:{LOCAL}",
            base_url=server.server_url + "/v1",
            store=store,
            progress=False,
            **options,
        )


def test_an_openai_compatible_server_gets_max_tokens_and_names_itself(store: Path) -> None:
    with Simulator(compatible=True, models=(LOCAL,)) as local:
        out = on_local(local, 8, store, table="t", max_tokens=30)
        assert out["s_status"].to_list() == ["DONE"] * 8
        body = stored_bodies(local)[0]
        assert body["model"] == "qwen3:8b" and body["max_tokens"] == 30 and "max_completion_tokens" not in body
        request = json.loads(sql(store, "SELECT request FROM llmledger_steps")[0][0])
        assert request["llmledger_endpoint"] == local.server_url + "/v1"
        assert request["llmledger_provider"] == "openai"
        assert sql(store, "SELECT DISTINCT s_source, s_cost_usd FROM t") == [(local.server_url + "/v1", None)]
        assert "announces no rate limits" in " ".join(last_report().notes)  # type: ignore[union-attr]


def test_the_simulator_speaks_openais_api_to_the_openai_sdk(sim: Simulator) -> None:
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="k", max_retries=0)
    args: dict[str, Any] = {"model": "gpt-6.1-terra", "messages": [{"role": "user", "content": "hi"}]}
    sim.configure(rate_limit=10, tokens_per_minute=60_000)
    raw = client.chat.completions.with_raw_response.create(max_completion_tokens=100, **args)
    assert raw.headers["x-ratelimit-limit-requests"] == "600" and raw.headers["x-ratelimit-limit-tokens"] == "60000"
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s") and raw.headers["x-request-id"].startswith("req_")
    completion = raw.parse()
    assert completion.choices[0].message.content and completion.usage.prompt_tokens > 0
    thought = completion.usage.completion_tokens_details.reasoning_tokens
    assert thought > 0 and completion.usage.completion_tokens > thought, "a reasoning model thinks, and that is billed"
    cut = client.chat.completions.create(max_completion_tokens=thought, **args)
    assert cut.choices[0].message.content == "" and cut.choices[0].finish_reason == "length"
    for fault, error, code in [
        (429, openai.RateLimitError, "rate_limit_exceeded"),
        ("insufficient_quota", openai.RateLimitError, "insufficient_quota"),
        (401, openai.AuthenticationError, "invalid_api_key"),
        (500, openai.InternalServerError, None),
    ]:
        sim.configure(fail_next=[fault])
        with pytest.raises(error) as info:
            client.chat.completions.create(max_completion_tokens=10, **args)
        assert info.value.code == code
    with pytest.raises(openai.BadRequestError, match="max_tokens' is not supported with this model"):
        client.chat.completions.create(max_tokens=10, **args)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: top_k"):
        client.chat.completions.create(max_completion_tokens=10, extra_body={"top_k": 3}, **args)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(max_completion_tokens=10, model="gpt-nope", messages=args["messages"])


def test_the_simulator_speaks_the_responses_api_to_the_openai_sdk(sim: Simulator) -> None:
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="k", max_retries=0)
    sim.configure(rate_limit=10, tokens_per_minute=60_000)
    raw = client.responses.with_raw_response.create(
        model="gpt-6.1-terra", input="hi", instructions="Be brief.", max_output_tokens=100, store=False
    )
    assert raw.headers["x-ratelimit-limit-requests"] == "600" and raw.headers["x-request-id"].startswith("req_")
    response = raw.parse()
    assert response.object == "response" and response.status == "completed" and response.output_text
    thought = response.usage.output_tokens_details.reasoning_tokens
    assert thought > 0 and response.usage.output_tokens > thought, "a reasoning model thinks, and that is billed"
    cut = client.responses.create(model="gpt-6.1-terra", input="hi", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens" and not cut.output_text
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    typed = client.responses.create(
        model="gpt-6.1-terra", input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": schema,
                                                            "strict": True}},
    )  # fmt: skip
    assert set(json.loads(typed.output_text)) == {"a"}
    sim.configure(refuse="refuse me")
    refused = client.responses.create(model="gpt-6.1-terra", input="please refuse me")
    assert [c.type for c in refused.output[-1].content] == ["refusal"]
    for bad, says in [
        ({"max_output_tokens": 10}, "Expected a value >= 16"),
        ({"temperature": 0.5}, "'temperature' is not supported with this model"),
        ({"extra_body": {"reasoning_effort": "low"}}, "Unknown parameter: 'reasoning_effort'"),
    ]:
        with pytest.raises(openai.BadRequestError, match=says):
            client.responses.create(model="gpt-6.1-terra", input="hi", **bad)
    sim.configure(fail_next=["insufficient_quota"])
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(model="gpt-6.1-terra", input="hi")
    assert info.value.code == "insufficient_quota"
    with Simulator(compatible=True) as other, pytest.raises(openai.NotFoundError):  # it speaks Chat Completions only
        openai.OpenAI(base_url=other.server_url + "/v1", api_key="k").responses.create(model="m", input="hi")


def test_a_responses_run_is_paced_by_openais_headers(ask: Any, sim: Simulator) -> None:
    sim.configure(rate_limit=40, latency=0.01)
    ask(frame(60), "s", prompt=PROMPT, concurrency=16)
    report = last_report()
    assert report is not None and report.binding_limit.startswith("requests")
    assert sim.stats()["by_status"].get(429, 0) <= 3 and sim.stats()["paid"] == 60


def test_a_reasoning_model_that_thinks_away_its_max_tokens_stops_the_run_instead_of_showing_nothing(
    ask: Any, sim: Simulator, store: Path
) -> None:
    """GPT-6 models think before they answer, and the thinking counts toward max_completion_tokens: a bound of 16
    for a one-word answer leaves an empty answer, paid. No row shows that as DONE; the run stops once the first
    answers all came back so, and says what to change."""
    with pytest.raises(RequestRefused, match=r"spent all of max_tokens.*\{'reasoning': \{'effort': 'low'\}\}"):
        ask(frame(40), "s", prompt=PROMPT, max_tokens=16, concurrency=1)
    assert sim.stats()["paid"] == 3, "it stopped after three answers alike (each was paid for)"
    assert sql(store, "SELECT count(*) FROM t WHERE s_status = 'DONE'") == [(0,)]
    # each paid empty answer is on its row, with what it cost (found in a trial: NULL, the spend on no row)
    ((rows, on_rows),) = sql(store, "SELECT count(s_cost_usd), sum(s_cost_usd) FROM t")
    ((runs,),) = sql(store, "SELECT sum(cost_usd) FROM llmledger_runs")
    assert rows == 3 and on_rows == pytest.approx(runs) and runs > 0
    with pytest.raises(RequestRefused):  # many in flight at once: those answered after the stop are kept too
        ask(frame(40, start=100), "s2", prompt=PROMPT, max_tokens=16, concurrency=8)
    ((paid_rows, on_rows),) = sql(store, "SELECT count(s2_cost_usd), sum(s2_cost_usd) FROM t")
    ((runs,),) = sql(store, "SELECT sum(cost_usd) FROM llmledger_runs WHERE step = 's2'")
    assert paid_rows == sim.stats()["paid"] - 3 and on_rows == pytest.approx(runs)
    out = ask(frame(40), "s", prompt=PROMPT, max_tokens=16, request_options={"reasoning": {"effort": "none"}})
    assert out["s_status"].to_list() == ["DONE"] * 40 and all(out["s"].str.len_chars() > 0)
    used = sql(store, "SELECT max(s_output_tokens) FROM t WHERE id >= 3")[0][0]  # rows 0-2 add their refusals'
    assert 0 < used <= 16


def test_an_empty_answer_from_a_server_is_never_done(store: Path) -> None:
    """A server that answers 200 with an empty message (a gateway, a model that called a tool instead): the row is
    failed with the reason, never DONE with nothing in it."""
    with Simulator(compatible=True, models=(LOCAL,), responder=lambda prompt, system=None: "") as server:
        out = on_local(server, 3, store)
    assert out["s_status"].to_list() == ["FAILED"] * 3
    assert "returned an empty message" in sql(store, "SELECT s_error FROM ledger LIMIT 1")[0][0]


def _data_urls(sim: Simulator) -> list[tuple[str, str, bytes]]:
    """(part type, media type, bytes) of every file part the simulator was sent, online or in a batch file."""
    out = []
    for entry in sim.log():
        body = entry["body"]
        for part in body["messages" if "messages" in body else "input"][-1]["content"]:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "file"):
                url = part["image_url"]["url"] if kind == "image_url" else part["file"]["file_data"]
            elif kind in ("input_image", "input_file"):  # Responses' parts hold the URL at their top level
                url = part["image_url"] if kind == "input_image" else part["file_data"]
            else:
                continue
            media, _, data = url.removeprefix("data:").partition(";base64,")
            out.append((kind, media, base64.b64decode(data)))
    return out


FILE_PARTS = {  # API -> (an image's part, a PDF's part, a text part)
    "chat": ("image_url", "file", "text"),
    "responses": ("input_image", "input_file", "input_text"),
}


@pytest.mark.parametrize("api", sorted(FILE_PARTS))
@pytest.mark.parametrize("mode", ["online", "batch"])
def test_files_go_to_an_openai_model_as_data_urls_recorded_by_their_hash(
    ask: Any, sim: Simulator, store: Path, tmp_path: Path, mode: str, api: str
) -> None:
    """attach= on an OpenAI model: an image as an `image_url` part (Responses: `input_image`), a PDF as a `file`
    part (`input_file`), each a data URL of the file's bytes; the ledger records the hash in their place, so a rerun
    pays nothing and a changed file makes its row stale, as on Claude."""
    from llmledger.simulator import pdf, png

    ask = functools.partial(ask, api=api)
    image, document, text = FILE_PARTS[api]

    paths = [tmp_path / "scan.png", tmp_path / "invoice.pdf", tmp_path / "other.png"]
    paths[0].write_bytes(png(20, 10, seed=1))
    paths[1].write_bytes(pdf(["Invoice 7. Total: $70.00"]))
    paths[2].write_bytes(png(30, 10, seed=2))
    df = pl.DataFrame({"id": [0, 1, 2], "path": [str(p) for p in paths]})
    out = ask(df, "what", prompt="What is this?", attach="path", mode=mode)
    assert out["what_status"].to_list() == ["DONE"] * 3
    if mode == "online":
        sent = _data_urls(sim)
        assert sorted(sent) == sorted(
            [(image, "image/png", paths[0].read_bytes()), (document, "application/pdf", paths[1].read_bytes()),
             (image, "image/png", paths[2].read_bytes())]
        )  # fmt: skip
    else:
        assert sim.stats()["batches"] == 1 and sim.stats()["batch_paid"] == 3
    stored = [json.loads(p) for (p,) in sql(store, "SELECT what_prompt FROM t ORDER BY id")]
    digest = hashlib.sha256(paths[1].read_bytes()).hexdigest()
    named = {"filename": digest[:16] + ".pdf", "file_data": "data:application/pdf;base64,sha256:" + digest}
    assert stored[1][0] == ({"type": "file", "file": named} if api == "chat" else {"type": "input_file", **named})
    assert stored[0][-1] == {"type": text, "text": "What is this?"}
    usage = sql(store, "SELECT what_input_tokens FROM t ORDER BY id")
    assert usage[1][0] > 1600, "the PDF was read and billed as a page, not dropped"
    paid = sim.stats()["paid"]
    ask(df, "what", prompt="What is this?", attach="path", mode=mode)
    assert sim.stats()["paid"] == paid, "a rerun pays nothing"
    paths[2].write_bytes(png(31, 10, seed=3))
    with pytest.warns(llmledger.StaleAnswersWarning):
        ask(df, "what", prompt="What is this?", attach="path", mode=mode)
    assert sim.stats()["paid"] == paid


def test_an_estimate_counts_openais_automatic_caching_as_it_is_billed(ask: Any, oa: Any, store: Path) -> None:
    """A long system prompt is cached by OpenAI after the first call: the estimate prices it so (it once priced
    every call's prefix in full, several times the bill)."""
    system = "You are a careful assistant. " * 400  # well over OpenAI's 1,024-token minimum
    options = {"prompt": PROMPT, "system": system, "max_tokens": 40}
    ask(frame(5), "s", **options, concurrency=1)
    figures = llmledger.estimate(frame(45), "s", **options, model=GPT, store=store, table="t", client=oa).row(
        0, named=True
    )
    ask(frame(45), "s", **options, concurrency=1)
    report = last_report()
    assert report is not None and report.calls == figures["calls"] == 40 and report.cache_read_tokens > 0
    assert abs(figures["cost_usd"] - report.cost_usd) <= 0.25 * report.cost_usd, (figures["cost_usd"], report.cost_usd)


def test_an_openai_run_in_a_fresh_process_never_loads_the_anthropic_sdk(sim: Simulator, store: Path) -> None:
    """Each SDK is imported where a run sends with it: an OpenAI run neither pays a second's import of the other
    nor blocks llmledger's loop thread importing it."""
    import subprocess
    import sys

    code = (
        "import sys, polars as pl\n"
        "from llmledger import apply_llm\n"
        "df = pl.DataFrame({'id': [1, 2, 3], 'text': ['a', 'b', 'c']})\n"
        "out = apply_llm(df, 's', prompt='Say {text}', model='openai:gpt-6.1-terra',"
        f" base_url={sim.base_url + '/v1'!r}, api_key='k', store={str(store)!r}, progress=False)\n"
        "print(out['s_status'].to_list(), sorted(m for m in ('anthropic', 'openai') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['DONE', 'DONE', 'DONE'] ['openai']", result.stdout + result.stderr
