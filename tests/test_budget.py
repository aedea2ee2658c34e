"""A budget: max_cost_usd stops a run cleanly, and with budget_scope="step" it holds across runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, last_report

from .conftest import frame, sql

MODEL = "claude-budget-test"  # priced so that one row costs about $0.01


@pytest.fixture(autouse=True)
def _price() -> Iterator[None]:
    llmledger.set_price(MODEL, input=1000.0, output=1000.0)
    yield


def test_a_run_stops_at_its_budget_and_leaves_the_rest_unsent(run, sim: Simulator, store: Path) -> None:
    with pytest.warns(llmledger.BudgetReachedWarning, match=r"budget of \$0.1000 is reached.* rows were not sent"):
        out = run(frame(30), "summary", prompt="Summarize: {text}", model=MODEL, max_cost_usd=0.1, concurrency=2)
    report = last_report()
    assert report is not None and report.outcome == "budget" and "budget of $0.1000 is reached" in str(report.message)
    _adds_up(str(report.message))
    paid = sim.stats()["paid"]
    spent = sql(store, "SELECT sum(summary_cost_usd) FROM messages")[0][0]
    per_row = spent / paid
    assert 0.1 - 2 * per_row <= spent <= 0.1, "stops at the budget, never starting a request that would pass it"
    assert out["summary_status"].value_counts().sort("summary_status").rows() == [
        ("NOT_STARTED", 30 - paid),
        ("DONE", paid),
    ]

    run(frame(30), "summary", prompt="Summarize: {text}", model=MODEL, max_cost_usd=0.1, budget_scope="step")
    assert sim.stats()["paid"] == paid, "the step already spent its budget"
    assert last_report().outcome == "budget"  # type: ignore[union-attr]
    run(frame(30), "summary", prompt="Summarize: {text}", model=MODEL, max_cost_usd=0.1)
    assert paid < sim.stats()["paid"] <= 2 * paid + 2, "a run-scoped budget starts from nothing"

    report = llmledger.resume(store, "messages", "summary", progress=False, client=run.keywords["client"])
    assert report.outcome == "completed" and sql(
        store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'"
    ) == [(30,)]


@pytest.mark.parametrize("bad", [0, -1, "10", True])
def test_a_bad_budget_is_refused(run, store: Path, bad: object) -> None:
    with pytest.raises(InvalidInputError, match="max_cost_usd"):
        run(frame(2), "summary", prompt="x {text}", max_cost_usd=bad)
    with pytest.raises(InvalidInputError, match="budget_scope"):
        run(frame(2), "summary", prompt="x {text}", max_cost_usd=1.0, budget_scope="table")
    assert not store.exists()


def _adds_up(message: str) -> None:
    """0.7 said "$0.0979 spent ... another request (about $0.0001) would go over" a $0.1000 budget: the figures
    must add up to what goes over it."""
    budget = float(re.search(r"budget of \$([\d.]+)", message).group(1))  # type: ignore[union-attr]
    parts = [float(x) for x in re.findall(r"\$([\d.]+) (?:spent|reserved|this run)", message)]
    flying = re.search(r"in flight \(about \$([\d.]+)\)", message)
    another = float(re.search(r"another request \(about \$([\d.]+)\)", message).group(1))  # type: ignore[union-attr]
    total = float(re.search(r"would take it to \$(\d+\.\d+)", message).group(1))  # type: ignore[union-attr]
    assert total > budget, message
    assert abs(sum(parts) + (float(flying.group(1)) if flying else 0) + another - total) < 0.0003, message
