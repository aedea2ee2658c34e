"""Answers at the edges: a character a store cannot hold, an answer a person rejected (issue 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

import llmledger
from llmledger import Simulator, apply_llm, last_report

from .conftest import frame


def test_an_answer_holding_a_nul_is_kept_on_both_engines(client: Any, sim: Simulator, target: Any) -> None:
    """PostgreSQL text holds no NUL: one answer with one (text, or "\\u0000" in JSON) lost the whole paid chunk,
    and every rerun failed merging the journal. The NUL becomes U+FFFD; every paid answer is kept."""
    sim.responder = lambda prompt, system: ("bad\x00answer " if "number 3" in prompt else "ok ") + prompt
    out = apply_llm(frame(8), "s", prompt="Q: {text}", store=target, table="m", client=client, progress=False)
    assert out["s_status"].to_list() == ["DONE"] * 8 and sim.stats()["paid"] == 8
    assert out["s"][3] == "bad\ufffdanswer Q: hello message number 3"
    sim.responder = lambda prompt, system: '{"name": "a\\u0000b"}'
    out = apply_llm(
        frame(3),
        "t",
        prompt="Name in: {text}",
        output={"name": str},
        store=target,
        table="m",
        client=client,
        progress=False,
    )
    assert out["t_status"].to_list() == ["DONE"] * 3
    assert out["t"].struct.field("name").to_list() == ["a\ufffdb"] * 3


def test_a_flagged_answer_is_never_handed_to_another_row(client: Any, sim: Simulator, store: Path) -> None:
    """A person flagged an answer as wrong; a new row with the same text (or the same request in another table)
    got that very answer for free, and its twins kept it. Now flagging marks every row showing that answer to
    that request, and reuse never takes an answer to a flagged request: it is asked afresh."""
    answers = iter(range(1, 100))
    sim.responder = lambda prompt, system: f"answer {next(answers)}"

    def run(df: pl.DataFrame, table: str = "t", **options: Any) -> pl.DataFrame:
        return apply_llm(
            df, "s", prompt="Q: {text}", store=store, table=table, client=client, progress=False, **options
        )

    same = pl.DataFrame({"id": [1, 2], "text": ["the same text"] * 2})
    assert run(same)["s"].to_list() == ["answer 1"] * 2, "twins share one paid answer"
    assert llmledger.flag(store, "t", "s", where="id = 1", reason="wrong") == 2, "its twin shows it too"
    with_new = pl.concat([same, pl.DataFrame({"id": [3], "text": ["the same text"]})])
    out = run(with_new)
    assert out["s"].to_list() == ["answer 1", "answer 1", "answer 2"] and last_report().calls == 1  # type: ignore[union-attr]
    assert run(pl.DataFrame({"id": [9], "text": ["the same text"]}), table="other")["s"].to_list() == ["answer 3"]
    redone = run(with_new, redo="flagged")
    assert redone["s"].to_list()[:2] == ["answer 4", "answer 4"]
    assert llmledger.progress(store, "t")["flagged"].to_list() == [0]


def test_a_validate_reason_holding_a_nul_is_kept_on_both_engines(client: Any, sim: Simulator, target: Any) -> None:
    """A NUL in a validate= reason made the commit fail on PostgreSQL, losing the paid answers and blocking the
    step while its journal was merged; the reason keeps U+FFFD in its place."""
    out = apply_llm(
        frame(2),
        "s",
        prompt="Q: {text}",
        store=target,
        table="m",
        client=client,
        progress=False,
        validate=lambda row, output: "bad\x00reason",
    )
    assert out["s_status"].to_list() == ["NEEDS_REVIEW"] * 2 and sim.stats()["paid"] == 2
    errors = llmledger.sql(target, "SELECT DISTINCT s_error FROM m")["s_error"].to_list()  # type: ignore[index]
    assert errors == ["bad\ufffdreason"]
