"""The simulator's input- and output-token buckets behave as the API's, and a run paces under them."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from llmledger import Simulator, last_report

from .conftest import frame

ARGS = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "Summarize: hello there"}]}


def test_an_output_token_bucket_reserves_max_tokens_and_refunds_the_rest() -> None:
    with Simulator(output_tokens_per_minute=6_000, token_burst=1.0) as sim:  # a bucket of 100 tokens
        client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        first = client.messages.with_raw_response.create(max_tokens=60, **ARGS)
        used = first.parse().usage.output_tokens
        assert used < 60
        headers = first.headers
        assert headers["anthropic-ratelimit-output-tokens-limit"] == "6000"
        assert int(headers["anthropic-ratelimit-output-tokens-remaining"]) % 1000 == 0, "rounded to 1,000"
        assert headers["anthropic-ratelimit-tokens-limit"] == "6000"
        client.messages.create(max_tokens=30, **ARGS)  # fits only because the first gave back what it did not use
        with pytest.raises(anthropic.RateLimitError, match="output tokens per minute") as info:
            client.messages.create(max_tokens=100, **ARGS)
        assert float(info.value.response.headers["retry-after"]) >= 1


def test_an_input_token_bucket_refuses_a_request_too_big_for_it_now() -> None:
    with Simulator(input_tokens_per_minute=600, token_burst=1.0) as sim:  # 10 input tokens a second
        client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.RateLimitError, match="input tokens per minute"):
            client.messages.create(max_tokens=5, model="m", messages=[{"role": "user", "content": "x" * 400}])


def test_a_run_under_an_output_token_limit_finishes_every_row_paying_each_once(
    run, sim: Simulator, store: Path
) -> None:
    sim.configure(output_tokens_per_minute=12_000, token_burst=2.0, latency=0.02)
    out = run(frame(60), "summary", prompt="Summarize: {text}", max_tokens=20, concurrency=8)
    assert out["summary_status"].to_list() == ["DONE"] * 60
    assert sim.stats()["paid"] == 60 and max(sim.paid_prompts().values()) == 1
    assert last_report().retries == sim.stats()["by_status"].get(429, 0)  # type: ignore[union-attr]
