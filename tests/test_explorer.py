"""The fault explorer in CI: a fixed list of seeds on both engines, one test each (so they spread over the
workers, and a failure names its seed), and proof that its checker fails when the promise is broken. A longer
exploration: `python -m tests.explorer --seeds 200 --engine both`."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import llmledger
from llmledger import Simulator, apply_llm

from .conftest import frame
from .explorer.__main__ import explore
from .explorer.actions import PROMPT, STEP, TABLE, Books, Scenario, store_for
from .explorer.invariants import violations
from .explorer.plan import Plan, make_plan

# each on DuckDB and PostgreSQL; the lowest-versions run in .ci/run takes fewer (LLMLEDGER_EXPLORER_SEEDS)
CI_SEEDS = list(range(int(os.environ.get("LLMLEDGER_EXPLORER_SEEDS", "6"))))


@pytest.mark.parametrize("engine", ["duckdb", "postgresql"])
@pytest.mark.parametrize("seed", CI_SEEDS)
def test_fixed_seeds_keep_the_promise_on_both_engines(seed: int, engine: str, request: pytest.FixtureRequest) -> None:
    out = io.StringIO()
    pg_server = request.getfixturevalue("pg_server") if engine == "postgresql" else None
    figures = explore([seed], [engine], pg_server=pg_server, out=out)
    assert not figures.failures, out.getvalue()
    assert figures.scenarios == 1
    print(figures.line())


def test_plans_are_the_same_for_a_seed_and_differ_between_seeds() -> None:
    assert make_plan(7, "duckdb") == make_plan(7, "duckdb")
    assert len({make_plan(s, "postgresql").describe() for s in range(20)}) == 20


def test_the_checker_catches_a_wrong_answer_a_stuck_row_and_a_request_paid_twice(tmp_path: Path) -> None:
    plan = Plan(seed=0, engine="duckdb", rows=30, actions=[])
    with Simulator(latency=0.0) as sim:
        store = store_for("duckdb", tmp_path, None)
        books = Scenario(plan, sim, store).run()
        assert violations(store, sim, plan, books) == []
        llmledger.sql(store, f"UPDATE {TABLE} SET {STEP} = 'not its answer' WHERE id = 3", write=True)
        apply_llm(
            frame(plan.rows),
            STEP,
            prompt=PROMPT,
            store=store,
            table=TABLE,
            where="id = 5",
            redo=True,
            client=Scenario(plan, sim, store).client,
            progress=False,
        )  # paid again, on nobody's books
        # after: a run recovers it
        llmledger.sql(store, f"UPDATE {TABLE} SET {STEP}_status = 'RUNNING' WHERE id = 4", write=True)
        found = violations(store, sim, plan, Books())
    assert any("row 3 shows an answer that is not to its own request" in p for p in found), found
    assert any("row 4 is RUNNING" in p for p in found), found
    assert any("1 requests paid again" in p for p in found), found
