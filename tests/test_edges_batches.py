"""Edge cases of Message Batches reconciliation (issue 17): a lost intent finds its own batch, never another's.

A run that dies around `batches.create` leaves an intent whose rows are RUNNING with custom ids. A later
run looks for the batch with `batches.list`, which shows no custom ids: only sizes and times. These tests
leave several such intents of the same size, some whose create never reached the API and some whose create
reached it with the answer lost, and check that a later run pays for each row exactly once and gives every
row its own answer, on DuckDB and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm
from llmledger._exec import collect
from llmledger._exec.batch import BatchSender

from .conftest import frame

PROMPT = "Summarize: {text}"


class Died(Exception):
    """Stands for a process that died around `batches.create`: the run stops there and writes nothing more."""


@pytest.fixture(params=["duckdb", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "ledger" / "edges.duckdb")


@pytest.fixture
def run(client: anthropic.AsyncAnthropic, store: str) -> Callable[..., pl.DataFrame]:
    def apply(df: pl.DataFrame, **options: Any) -> pl.DataFrame:
        return apply_llm(df, "summary", prompt=PROMPT, store=store, table="messages", client=client, progress=False,
                         mode="batch", **options)
    return apply


@pytest.fixture(autouse=True)
def _quick_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """An intent nobody can find is given up 1 s after it was made, not 20 s (its process is long dead)."""
    monkeypatch.setattr(collect, "ABANDON_AFTER", timedelta(seconds=1))


def dead_run(run: Callable[..., pl.DataFrame], sim: Simulator, df: pl.DataFrame, monkeypatch: pytest.MonkeyPatch,
             *, reaches_api: bool) -> None:
    """A run that writes its intent and dies: before `batches.create` left it, or after the API made the batch
    but before its answer came back (the simulator drops the connection after creating it)."""
    async def create(self: BatchSender, requests: list[dict[str, Any]], *args: Any) -> None:
        if reaches_api:
            sim.configure(batch_lose_response=1)
            with pytest.raises(anthropic.APIConnectionError):
                await self.client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(BatchSender, "_create", create)
        with pytest.raises(Died):
            run(df)


def paid_once_each(sim: Simulator, df: pl.DataFrame) -> None:
    paid = sim.paid_prompts()
    prompts = [PROMPT.format(text=t) for t in df["text"]]
    assert {p: paid[p] for p in prompts} == dict.fromkeys(prompts, 1), "every row paid exactly once"
    assert sum(paid.values()) == len(prompts), "nothing else paid"


def own_answers(out: pl.DataFrame) -> None:
    assert out["summary_status"].to_list() == ["DONE"] * out.height
    for text, answer in zip(out["text"], out["summary"], strict=True):
        assert answer is not None and text in answer, f"{text!r} got {answer!r}"


@pytest.mark.timeout(120)
def test_two_dead_intents_of_the_same_size_each_get_their_own_batch(run: Any, sim: Simulator, store: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The first intent never reached the API; the second did, and lost the answer. Matched by size and time
    alone, the first took the second's batch, the second was given up and its rows were paid twice."""
    sim.configure(batch_delay=1.0)
    first, second = frame(6), frame(6, start=6)
    dead_run(run, sim, first, monkeypatch, reaches_api=False)
    dead_run(run, sim, second, monkeypatch, reaches_api=True)
    assert sim.stats()["batches"] == 1
    both = pl.concat([first, second])
    out = run(both)
    own_answers(out)
    paid_once_each(sim, both)
    assert sim.stats()["batches"] == 2, "the second's batch was collected, only the first's rows sent again"
    states = llmledger.sql(store, "SELECT state, count(*) AS n FROM llmledger_batches GROUP BY state ORDER BY state")
    assert states is not None and states.rows() == [("abandoned", 1), ("merged", 2)]
