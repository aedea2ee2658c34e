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


def test_after_a_small_first_run_the_estimate_is_what_the_rest_costs(
    run, sim: Simulator, store: Path, client, reviews: pl.DataFrame
) -> None:
    options = {"prompt": PROMPT, "key": "review_id", "max_tokens": 5}
    reviews = reviews.head(1_200)
    run(reviews, "sentiment", **options, where="review_id <= 50")
    figures = llmledger.estimate(reviews, "sentiment", **options, store=store, table="messages", client=client).row(
        0, named=True
    )  # the simulator's: its answers are done for it
    assert figures["output_basis"] == "the step's 50 answers so far" and figures["done"] == 50
    for_real = llmledger.estimate(reviews, "sentiment", **options, store=store, table="messages").row(0, named=True)
    assert (for_real["done"], for_real["calls"]) == (0, figures["calls"] + 50), (
        "for the real API (no client=), the simulated answers are to be asked again"
    )
    run(reviews, "sentiment", **options)
    report = last_report()
    assert report is not None and report.calls == figures["calls"]
    assert abs(figures["cost_usd"] - report.cost_usd) <= 0.25 * report.cost_usd
    assert abs(figures["input_tokens"] - report.input_tokens) <= 0.25 * report.input_tokens
    assert figures["cost_usd_batch"] == pytest.approx(figures["cost_usd"] / 2)


def test_a_pipeline_is_estimated_as_a_whole_then_paid_as_estimated(
    client, sim: Simulator, store: Path, reviews: pl.DataFrame
) -> None:
    df = reviews.head(200)
    steps = {
        "extract": {
            "prompt": "Extract the product and sentiment from: {text}",
            "output": {"product": str, "sentiment": str},
        },
        "reply": {
            "prompt": "Write a reply to a {extract.sentiment} review of {extract.product}: {text}",
            "max_tokens": 60,
        },
    }
    common = {"key": "review_id", "store": store, "table": "reviews", "client": client}
    figures = llmledger.estimate(df, steps, **common)
    assert not store.exists() and sim.stats()["requests"] == 0, "nothing sent or written"
    assert figures["step"].to_list() == ["extract", "reply", "total"]
    extract, reply, total = figures.iter_rows(named=True)
    distinct = df["text"].n_unique()
    assert extract["calls"] == distinct and extract["waiting"] == 0
    assert reply["waiting"] == 200 and reply["calls"] == 200, "the second step's rows wait for the first's answers"
    assert "200 rows waiting for extract counted as sent" in reply["output_basis"]
    assert total["calls"] == extract["calls"] + reply["calls"]
    assert total["cost_usd"] == pytest.approx(extract["cost_usd"] + reply["cost_usd"])
    assert reply["input_tokens"] > 200 * len("Write a reply to a review of: ") / 4
    some = llmledger.estimate(df, steps, **common, where="review_id <= 50")
    assert some["waiting"][1] == 50 == df.filter(pl.col("review_id") <= 50).height, "where= counts for later steps"

    # once the first step has answers, the second is estimated from its real prompts
    llmledger.apply_llm(df, "extract", **steps["extract"], **common, progress=False)
    before = sim.stats()
    figures = llmledger.estimate(df, steps, **common)
    assert figures["to_send"].to_list() == [0, 200, 200] and figures["waiting"][1] == 0
    llmledger.pipeline(df, steps, **common, progress=False)
    paid = sim.stats()["input_tokens"] - before["input_tokens"]
    assert sim.stats()["paid"] - before["paid"] == figures["calls"][1] > 190, "identical prompts share a call"
    assert 0.8 < paid / figures["input_tokens"][2] < 1.25, (paid, figures["input_tokens"][2])

    again = llmledger.estimate(df, steps, **common)
    assert again["calls"].to_list() == [0, 0, 0] and again["done"].to_list()[:2] == [200, 200]
    assert again["cost_usd"][2] == 0


def test_a_pipeline_estimate_prices_waiting_rows_at_the_steps_own_answers(
    client, sim: Simulator, store: Path, reviews: pl.DataFrame
) -> None:
    df = reviews.head(60)
    steps = {
        "extract": {"prompt": "Extract the product from: {text}", "output": {"product": str}},
        "reply": {"prompt": "Reply in a few words about {extract.product}", "max_tokens": 300},
    }
    common = {"key": "review_id", "store": store, "table": "reviews", "client": client}
    llmledger.pipeline(df, steps, **common, progress=False, where="review_id <= 20")
    ((average,),) = sql(store, "SELECT avg(reply_output_tokens) FROM reviews WHERE reply_status = 'DONE'")
    figures = llmledger.estimate(df, steps, **common).filter(pl.col("step") == "reply").row(0, named=True)
    assert figures["waiting"] == 40 and figures["output_basis"].startswith("the step's 20 answers so far")
    assert figures["output_tokens"] == pytest.approx(average * figures["calls"], abs=2), (
        "the waiting rows are reckoned at the step's own answers, not the 150-token guess"
    )
