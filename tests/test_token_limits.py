"""The simulator's input- and output-token buckets behave as the API's, and a run paces under them."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from llmledger import Simulator, last_report

from .conftest import frame

ARGS = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "Summarize: hello there"}]}


def test_an_output_token_bucket_reserves_max_tokens_and_refunds_the_rest() -> None:
    # A bucket of 100 output tokens refilled at 10 a minute (one every 6 s). The bucket of 100 refilled at 100 a
    # second this test had before was back to full within 0.1 s, so on a loaded machine the refusal below never
    # came: now the requests here may take a minute between them and every claim still holds.
    with Simulator(output_tokens_per_minute=10, token_burst=600) as sim:
        client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        first = client.messages.with_raw_response.create(max_tokens=90, **ARGS)  # reserves 90: 10 left
        used = first.parse().usage.output_tokens
        assert used < 60
        headers = first.headers
        assert headers["anthropic-ratelimit-output-tokens-limit"] == "10"
        assert int(headers["anthropic-ratelimit-output-tokens-remaining"]) % 1000 == 0, "rounded to 1,000"
        assert headers["anthropic-ratelimit-tokens-limit"] == "10"
        # 30 fits only because the first gave back the 90 - used it did not use (the refill: 20 tokens in 120 s)
        second = client.messages.create(max_tokens=30, **ARGS)
        # the whole bucket is short by what the two used (a few tokens, 6 s each to refill): refused, and told when
        short = used + second.usage.output_tokens
        with pytest.raises(anthropic.RateLimitError, match="output tokens per minute") as info:
            client.messages.create(max_tokens=100, **ARGS)
        assert 6 <= float(info.value.response.headers["retry-after"]) <= 6 * short + 1


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
