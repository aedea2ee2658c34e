"""Flags, resets and history: a person marks bad answers, redoes just those, and loses nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, WhereClauseError, last_report

from .conftest import frame, sql

PROMPT = "Summarize: {text}"


def test_redo_flagged_resends_exactly_the_flagged_rows_and_clears_their_flags(run, sim: Simulator, store: Path) -> None:
    first = run(frame(10), "summary", prompt=PROMPT)
    assert llmledger.flag(store, "messages", "summary", where="id IN (2, 5, 7)", reason="too vague", by="ana") == 3
    flags = sql(
        store,
        "SELECT id, summary_flag, summary_flagged_by, summary_flagged_at IS NOT NULL FROM messages "
        "WHERE summary_flag IS NOT NULL ORDER BY id",
    )
    assert flags == [(2, "too vague", "ana", True), (5, "too vague", "ana", True), (7, "too vague", "ana", True)]

    run(frame(10), "summary", prompt=PROMPT)
    assert sim.stats()["paid"] == 10, "a plain rerun leaves flagged rows alone"

    sim.responder = lambda prompt, system: "better: " + prompt
    out = run(frame(10), "summary", prompt=PROMPT, redo="flagged")
    assert sim.stats()["paid"] == 13
    assert [sim.paid_prompts()[f"Summarize: hello message number {i}"] for i in (2, 5, 7)] == [2, 2, 2]
    changed = out.filter(pl.col("summary") != first["summary"])["id"].to_list()
    assert changed == [2, 5, 7]
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_flag IS NOT NULL") == [(0,)]

    run(frame(10), "summary", prompt=PROMPT, redo="flagged")
    assert sim.stats()["paid"] == 13, "flags are cleared once their rows are DONE again"

    history = llmledger.history(store, "messages", "summary")
    assert history["id"].to_list() == [2, 5, 7]
    assert history["reason"].to_list() == ["flagged: too vague"] * 3
    assert history["old_output"].to_list() == first.filter(pl.col("id").is_in([2, 5, 7]))["summary"].to_list()
    assert history["output"].str.starts_with("better: ").all()
    assert (history["old_cost_usd"] > 0).all() and history["old_status"].to_list() == ["DONE"] * 3
    one = llmledger.history(store, "messages", "summary", key=5)
    assert one.select("id", "old_output").rows() == [(5, first["summary"][5])]


def test_a_flagged_answer_is_not_handed_back_by_an_identical_request(run, sim: Simulator, store: Path) -> None:
    df = pl.DataFrame({"id": [1, 2], "text": ["same words", "same words"]})
    run(df, "summary", prompt=PROMPT)
    assert sim.stats()["paid"] == 1, "identical requests share one answer"
    assert llmledger.flag(store, "messages", "summary", where="id = 1", reason="wrong") == 2, (
        "its twin shows the same answer to the same request: flagged with it"
    )
    sim.responder = lambda prompt, system: "a fresh answer"
    out = run(df, "summary", prompt=PROMPT, redo="flagged")
    assert sim.stats()["paid"] == 2
    assert out["summary"].to_list() == ["a fresh answer", "a fresh answer"]


def test_a_redo_flagged_run_reuses_answers_for_its_other_rows(run, sim: Simulator, store: Path) -> None:
    """A redo="flagged" run also sends the rows not answered yet; one asking what an answered row asked reuses
    that answer (found by the explorer: a run stopped at its budget left twins NOT_STARTED, and the flagged run
    paid for them again). The flagged request itself is asked afresh."""
    df = pl.DataFrame({"id": [1, 2, 3, 4], "text": ["same words", "other words", "same words", "more words"]})
    run(df.head(2), "summary", prompt=PROMPT)
    assert sim.stats()["paid"] == 2
    llmledger.flag(store, "messages", "summary", where="id = 2", reason="wrong")
    out = run(df, "summary", prompt=PROMPT, redo="flagged")
    assert out["summary_status"].to_list() == ["DONE"] * 4
    assert sim.paid_prompts() == {"Summarize: same words": 1, "Summarize: other words": 2, "Summarize: more words": 1}
    report = last_report()
    assert report is not None and report.reused == 1


def test_reset_starts_rows_over_and_keeps_their_answers_in_the_history(run, sim: Simulator, store: Path) -> None:
    run(frame(6), "summary", prompt=PROMPT)
    assert llmledger.reset(store, "messages", "summary", where="id >= 4") == 2
    rows = sql(
        store,
        "SELECT id, summary, summary_status, summary_attempts, summary_cost_usd FROM messages "
        "WHERE id >= 4 ORDER BY id",
    )
    assert rows == [(4, None, "NOT_STARTED", 0, None), (5, None, "NOT_STARTED", 0, None)]
    assert llmledger.history(store, "messages", "summary")["reason"].to_list() == ["reset", "reset"]
    run(frame(6), "summary", prompt=PROMPT)
    assert sim.stats()["paid"] == 8 and last_report().calls == 2  # type: ignore[union-attr]


def test_a_history_key_that_cannot_be_the_key_columns_type_is_refused(run, sim: Simulator, store: Path) -> None:
    # found in a trial: key="notanint" on an integer key matched nothing and said nothing
    run(frame(3), "summary", prompt=PROMPT)
    llmledger.reset(store, "messages", "summary", where="id = 1")
    with pytest.raises(InvalidInputError, match=r"key 'id' is BIGINT.*'notanint'"):
        llmledger.history(store, "messages", "summary", key="notanint")
    with pytest.raises(InvalidInputError, match=r"key 'id' is BIGINT.*1\.5"):
        llmledger.history(store, "messages", "summary", key={"id": 1.5})
    assert llmledger.history(store, "messages", "summary", key=1)["id"].to_list() == [1]
    assert llmledger.history(store, "messages", "summary", key="1")["id"].to_list() == [1], "as the CLI passes it"
    run(frame(3).with_columns(pl.col("id").cast(pl.String)), "summary", prompt=PROMPT, table="texts")
    assert llmledger.history(store, "texts", "summary", key="notanint").is_empty(), "any value can be a text key"
    assert llmledger.history(store, "texts", "summary", key=1).is_empty()


def test_bad_flag_calls_are_refused_and_write_nothing(run, store: Path) -> None:
    run(frame(3), "summary", prompt=PROMPT)
    before = sql(store, "SELECT * FROM messages ORDER BY id")
    with pytest.raises(WhereClauseError, match="no_such_column"):
        llmledger.flag(store, "messages", "summary", where="no_such_column = 1", reason="x")
    with pytest.raises(InvalidInputError, match="reason="):
        llmledger.flag(store, "messages", "summary", where="true", reason=" ")
    with pytest.raises(InvalidInputError, match=r"no step 'sumary'.*messages\.summary"):
        llmledger.flag(store, "messages", "sumary", where="true", reason="x")
    with pytest.raises(InvalidInputError, match="where="):
        llmledger.reset(store, "messages", "summary", where="")
    assert sql(store, "SELECT * FROM messages ORDER BY id") == before


def test_cli_flag_reset_and_history(run, sim: Simulator, store: Path) -> None:
    run(frame(4), "summary", prompt=PROMPT)

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "llmledger", *args, str(store), "--table", "messages", "--step", "summary"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert (
        cli("flag", "--where", "id = 1", "--reason", "off topic", "--by", "bo").strip()
        == "flag: 1 row of messages.summary"
    )
    assert sql(store, "SELECT summary_flag, summary_flagged_by FROM messages WHERE id = 1") == [("off topic", "bo")]
    assert "reset: 2 rows" in cli("reset", "--where", "id >= 2")
    printed = cli("history", "--key", "3")
    assert "reset" in printed and "Summary: hello message number 3" in printed
