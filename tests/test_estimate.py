"""estimate(): what an apply_llm call would send and cost, with nothing sent or written."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, last_report

from .conftest import sql

DATA = Path(__file__).resolve().parents[1] / "data" / "reviews.csv"
PROMPT = "Classify the sentiment of this product review as positive, negative or neutral. Review: {text}"


@pytest.fixture
def reviews() -> pl.DataFrame:
    return pl.read_csv(DATA)


def test_an_estimate_sends_and_writes_nothing(run, sim: Simulator, store: Path, reviews: pl.DataFrame) -> None:
    options = {"prompt": PROMPT, "key": "review_id", "store": store, "table": "messages", "max_tokens": 5}
    figures = llmledger.estimate(reviews, "sentiment", **options).row(0, named=True)
    assert not store.exists() and sim.stats()["requests"] == 0
    distinct = reviews.select(pl.format(PROMPT.replace("{text}", "{}"), "text")).n_unique()
    assert (figures["rows"], figures["to_send"], figures["calls"]) == (3000, 3000, distinct)
    assert figures["reused"] == 3000 - distinct and figures["output_basis"].startswith("a guess")

    run(reviews, "sentiment", **{k: v for k, v in options.items() if k not in ("store", "table")}, where="false")
    snapshot = sql(store, "SELECT * FROM messages ORDER BY review_id")
    again = llmledger.estimate(reviews, "sentiment", **options, model="claude-sonnet-4-6")
    assert again["calls"][0] == distinct
    assert sql(store, "SELECT * FROM messages ORDER BY review_id") == snapshot, "the store is left as it was"
    assert sql(store, "SELECT count(*) FROM llmledger_steps WHERE model = 'claude-sonnet-4-6'") == [(0,)]

    with pytest.raises(InvalidInputError, match="apply_llm's arguments"):
        llmledger.estimate(reviews, "sentiment", prompt=PROMPT, no_such_option=1)


def test_after_a_small_first_run_the_estimate_is_what_the_rest_costs(run, sim: Simulator, store: Path, client,
                                                                     reviews: pl.DataFrame) -> None:
    options = {"prompt": PROMPT, "key": "review_id", "max_tokens": 5}
    reviews = reviews.head(1_200)
    run(reviews, "sentiment", **options, where="review_id <= 50")
    figures = llmledger.estimate(reviews, "sentiment", **options, store=store, table="messages",
                                 client=client).row(0, named=True)  # the simulator's: its answers are done for it
    assert figures["output_basis"] == "the step's 50 answers so far" and figures["done"] == 50
    for_real = llmledger.estimate(reviews, "sentiment", **options, store=store, table="messages").row(0, named=True)
    assert (for_real["done"], for_real["calls"]) == (0, figures["calls"] + 50), \
        "for the real API (no client=), the simulated answers are to be asked again"
    run(reviews, "sentiment", **options)
    report = last_report()
    assert report is not None and report.calls == figures["calls"]
    assert abs(figures["cost_usd"] - report.cost_usd) <= 0.25 * report.cost_usd
    assert abs(figures["input_tokens"] - report.input_tokens) <= 0.25 * report.input_tokens
    assert figures["cost_usd_batch"] == pytest.approx(figures["cost_usd"] / 2)
