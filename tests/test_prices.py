"""Prices: list rates per model kept as data, aliases and snapshots, overrides, NULL (never a guess) when unknown."""

from __future__ import annotations

import json
import warnings
from importlib import resources
from pathlib import Path

import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, UnknownPriceWarning, last_report
from llmledger._step.prices import price_of

from .conftest import frame, sql


def _tokens(store: Path) -> tuple[int, int]:
    return sql(store, "SELECT sum(summary_input_tokens), sum(summary_output_tokens) FROM messages")[0]


def test_cost_is_tokens_times_the_list_price(run, store: Path) -> None:
    run(frame(20), "summary", prompt="Summarize: {text}", model="claude-haiku-4-5")
    tokens_in, tokens_out = _tokens(store)
    price = price_of("claude-haiku-4-5")
    assert price is not None
    expected = (tokens_in * price.input + tokens_out * price.output) / 1e6
    [(stored,)] = sql(store, "SELECT sum(summary_cost_usd) FROM messages")
    assert stored == pytest.approx(expected)
    assert last_report().cost_usd == pytest.approx(expected)  # type: ignore[union-attr]


def test_snapshots_and_aliases_share_their_models_price() -> None:
    data = json.loads(resources.files("llmledger").joinpath("prices.json").read_text())
    assert data["checked"] and data["unit"] == "USD per million tokens"
    for model, entry in data["models"].items():
        for alias in entry.get("aliases", []):
            assert price_of(alias) == price_of(model)
        assert price_of(f"{model}-20991231") == price_of(model), "an unlisted dated snapshot takes its id's rates"
    assert price_of("claude-haiku-4") is None, "no prefix guessing: claude-haiku-4 is not claude-haiku-4-5"


def test_an_unknown_model_gets_a_null_cost_and_one_warning(run, store: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(frame(5), "summary", prompt="Summarize: {text}", model="claude-from-the-future")
        run(frame(8), "summary", prompt="Summarize: {text}", model="claude-from-the-future")
    notes = [w for w in caught if issubclass(w.category, UnknownPriceWarning)]
    assert len(notes) == 1 and "set_price('claude-from-the-future'" in str(notes[0].message)
    assert sql(store, "SELECT count(*), count(summary_cost_usd), sum(summary_input_tokens) > 0 FROM messages") == [
        (8, 0, True)
    ], "tokens stored, cost NULL"
    assert last_report().cost_usd is None  # type: ignore[union-attr]


def test_set_price_overrides_and_prices_shows_it(run, store: Path) -> None:
    llmledger.set_price("claude-house-model", input=2.0, output=8.0)
    try:
        run(frame(4), "summary", prompt="Summarize: {text}", model="claude-house-model")
        tokens_in, tokens_out = _tokens(store)
        [(cost,)] = sql(store, "SELECT sum(summary_cost_usd) FROM messages")
        assert cost == pytest.approx((tokens_in * 2.0 + tokens_out * 8.0) / 1e6)
        row = llmledger.prices().filter(model="claude-house-model").row(0, named=True)
        assert (row["input"], row["cache_write_5m"], row["cache_read"], row["source"]) == (2.0, 2.5, 0.2, "set_price")
    finally:
        llmledger._step.prices._overrides.pop("claude-house-model", None)


def test_cache_tokens_and_the_batch_rate_are_priced() -> None:
    price = price_of("claude-haiku-4-5")
    assert price is not None
    online = price.cost(
        input_tokens=1000,
        output_tokens=100,
        cache_write_tokens=3000,
        cache_write_1h_tokens=1000,
        cache_read_tokens=5000,
    )
    assert online == pytest.approx(
        (
            1000 * price.input
            + 100 * price.output
            + 2000 * price.cache_write_5m
            + 1000 * price.cache_write_1h
            + 5000 * price.cache_read
        )
        / 1e6
    )
    assert price.cost(input_tokens=1000, output_tokens=100, batch=True) == pytest.approx(
        price.cost(input_tokens=1000, output_tokens=100) * price.batch
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "", "input": 1, "output": 1}, "model must be"),
        ({"model": "m", "input": -1, "output": 1}, "input must be a non-negative"),
        ({"model": "m", "input": 1, "output": "5"}, "output must be"),
    ],
)
def test_set_price_refuses_nonsense(kwargs, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        llmledger.set_price(**kwargs)


def test_the_default_model_has_a_price() -> None:
    assert price_of(llmledger.DEFAULT_MODEL) is not None


def test_reused_answers_cost_nothing(run, sim: Simulator, store: Path) -> None:
    import polars as pl

    run(pl.DataFrame({"id": [1, 2, 3], "text": ["same", "same", "other"]}), "summary", prompt="Summarize: {text}")
    assert sql(store, "SELECT id, summary_cost_usd > 0 FROM messages ORDER BY id") in (
        [(1, True), (2, False), (3, True)],
        [(1, False), (2, True), (3, True)],
    )


def test_a_long_prompt_tier_prices_the_whole_request_at_its_rates() -> None:
    price = price_of("claude-haiku-5-5")
    assert price is not None and price.long_prompt is not None and price.long_prompt_threshold == 100_000
    short = price.cost(input_tokens=90_000, output_tokens=1_000, cache_read_tokens=10_000)
    long = price.cost(input_tokens=90_000, output_tokens=1_000, cache_read_tokens=10_001)
    assert short == pytest.approx((90_000 * 0.1 + 1_000 * 0.5 + 10_000 * 0.01) / 1e6)
    assert long == pytest.approx((90_000 * 0.5 + 1_000 * 2.5 + 10_001 * 0.05) / 1e6), (
        "past 100,000 prompt tokens (cache reads count) every token is billed at the higher rates"
    )


def test_a_mistyped_model_is_warned_at_the_callers_line_and_refused_by_the_simulator_as_by_the_api(
    run, sim, store: Path
) -> None:
    """The unknown-price warning pointed into `_exec/recorder.py` and the simulator answered a typo; the API answers
    it with a 404. Now the warning names the user's line and the close model, and the run stops with
    ModelNotFound, no row marked failed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(llmledger.ModelNotFound):
            run(frame(3), "summary", prompt="Summarize: {text}", model="claude-haiku-4-55")
    notes = [w for w in caught if issubclass(w.category, UnknownPriceWarning)]
    assert len(notes) == 1 and notes[0].filename == __file__, [(w.filename, str(w.message)) for w in caught]
    assert "Did you mean 'claude-haiku-4-5'?" in str(notes[0].message)
    assert sim.stats()["paid"] == 0
    assert sql(store, "SELECT count(*) FILTER (WHERE summary_status = 'FAILED') FROM messages") == [(0,)]
    with pytest.raises(llmledger.ModelNotFound):  # a dated snapshot nobody released: priced, but no such model
        run(frame(3), "summary", prompt="Summarize: {text}", model="claude-haiku-4-5-20991231")
    out = run(frame(3), "summary", prompt="Summarize: {text}", model="claude-haiku-4-5-20251001")  # a real one
    assert out["summary_status"].to_list() == ["DONE"] * 3
