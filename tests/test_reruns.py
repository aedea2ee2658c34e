"""Behaviour 6: reruns are targeted, and stale rows are reported, not silently re-paid."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, last_report

from .conftest import frame, sql


def test_where_narrows_the_rows(run, sim: Simulator, store: Path) -> None:
    df = frame(20).with_columns((pl.col("id") % 2 == 0).alias("even"))
    out = run(df, "summary", prompt="Summarize: {text}", where="even AND id < 10")
    assert sim.stats()["paid"] == 5
    assert out.filter(pl.col("summary_status") == "DONE")["id"].to_list() == [0, 2, 4, 6, 8]
    assert out.filter(pl.col("id") >= 10)["summary_status"].unique().to_list() == ["NOT_STARTED"]


def test_redo_resends_flagged_rows_and_keeps_the_old_answers(run, sim: Simulator, store: Path) -> None:
    run(frame(10), "summary", prompt="Summarize: {text}")
    with duckdb.connect(str(store)) as con:
        con.execute("ALTER TABLE messages ADD COLUMN flagged BOOLEAN DEFAULT false")
        con.execute("UPDATE messages SET flagged = true WHERE id IN (2, 7)")
        old = dict(con.execute("SELECT id, summary FROM messages WHERE flagged").fetchall())

    run(frame(10), "summary", prompt="Summarize: {text}", where="flagged")
    assert sim.stats()["paid"] == 10, "without redo, DONE rows are not re-sent"

    sim.responder = lambda prompt, system: "second opinion: " + prompt
    out = run(frame(10), "summary", prompt="Summarize: {text}", where="flagged", redo=True)
    assert sim.stats()["paid"] == 12
    assert sorted(p for p, n in sim.paid_prompts().items() if n == 2) == [
        "Summarize: hello message number 2",
        "Summarize: hello message number 7",
    ]
    assert out.filter(pl.col("id").is_in([2, 7]))["summary"].str.starts_with("second opinion").all()
    history = dict(sql(store, "SELECT json_extract(row_key, '$.id')::INT, output FROM llmledger_history"))
    assert history == old, "a redo keeps the answers it replaces"
    run(frame(10), "summary", prompt="Summarize: {text}", where="id = 2", redo="all")  # the CLI's --redo all
    assert sim.stats()["paid"] == 13, "redo='all' is redo=True (found in a trial: the CLI offered it, Python refused)"


def test_a_refused_redo_of_a_done_row_is_paid_on_that_row(run, sim: Simulator, store: Path) -> None:
    # found in a trial: the refusal was billed (llmledger_runs) and recorded on no row, so the rows did not add up
    run(frame(3), "summary", prompt="Summarize: {text}")
    (before,) = sql(store, "SELECT summary_cost_usd FROM messages WHERE id = 1")[0]
    sim.configure(refuse="number 1")
    run(frame(3), "summary", prompt="Summarize: {text}", where="id = 1", redo=True)
    assert sim.stats()["paid"] == 4
    (answer, cost, tokens) = sql(
        store, "SELECT summary, summary_cost_usd, summary_output_tokens FROM messages WHERE id = 1"
    )[0]
    assert answer is not None, "a failed redo keeps the answer it had"
    (rows,) = sql(store, "SELECT sum(summary_cost_usd) FROM messages")[0]
    (runs,) = sql(store, "SELECT sum(cost_usd) FROM llmledger_runs WHERE step = 'summary'")[0]
    assert cost > before and tokens > 0, "the refusal's cost and tokens are on its row"
    assert rows == pytest.approx(runs), "the step's rows add up to what its runs paid"


def test_changed_prompt_is_reported_stale_and_not_repaid(run, sim: Simulator, store: Path) -> None:
    df = frame(12)
    run(df, "summary", prompt="Summarize: {text}")
    out = run(df, "summary", prompt="Summarize briefly: {text}")
    report = last_report()
    assert sim.stats()["paid"] == 12
    assert report is not None and report.stale == 12 and report.calls == 0
    assert out["summary_status"].to_list() == ["DONE"] * 12

    changed = df.with_columns(
        pl.when(pl.col("id") < 3).then(pl.format("new text {}", "id")).otherwise("text").alias("text")
    )
    run(changed, "summary", prompt="Summarize: {text}")
    assert last_report().stale == 3  # type: ignore[union-attr]
    run(changed, "summary", prompt="Summarize: {text}", redo="stale")
    assert sim.stats()["paid"] == 15
    assert [sim.paid_prompts()[f"Summarize: new text {i}"] for i in range(3)] == [1, 1, 1]
    run(changed, "summary", prompt="Summarize: {text}")
    assert last_report().stale == 0  # type: ignore[union-attr]
    assert sim.stats()["paid"] == 15


def test_model_and_system_changes_are_stale_too(run, sim: Simulator) -> None:
    df = frame(4)
    run(df, "summary", prompt="Summarize: {text}")
    run(df, "summary", prompt="Summarize: {text}", model="claude-other")
    assert last_report().stale == 4  # type: ignore[union-attr]
    run(df, "summary", prompt="Summarize: {text}", system="Be terse.")
    assert last_report().stale == 4  # type: ignore[union-attr]
    assert sim.stats()["paid"] == 4


def test_needs_review_rows_come_back_with_redo(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 1")
    for _ in range(2):
        run(frame(3), "summary", prompt="Summarize: {text}", max_attempts=2)
    assert sql(store, "SELECT summary_status FROM messages WHERE id = 1") == [("NEEDS_REVIEW",)]
    sim.configure(poison=None)
    run(
        frame(3),
        "summary",
        prompt="Summarize: {text}",
        max_attempts=2,
        where="summary_status = 'NEEDS_REVIEW'",
        redo=True,
    )
    assert sql(store, "SELECT summary_status, summary_error FROM messages WHERE id = 1") == [("DONE", None)]
    assert sim.stats()["paid"] == 3


def test_the_readme_stale_query_matches_stored_fingerprints(run, sim: Simulator, store: Path) -> None:
    run(frame(5), "summary", prompt="Summarize: {text}", system="Be brief.", max_tokens=7, model="claude-x")
    stale = """SELECT count(*) FROM messages WHERE summary_status = 'DONE'
               AND summary_fingerprint IS DISTINCT FROM summary_request_fingerprint"""
    sent = {r["prompt"]: llmledger.fingerprint(r["body"]) for r in sim.log()}
    stored = dict(sql(store, "SELECT 'Summarize: ' || text, summary_fingerprint::VARCHAR FROM messages"))
    assert stored == sent, "fingerprint = md5 of the canonical JSON of the very body the API received"
    assert sql(store, stale) == [(0,)]
    run(frame(5), "summary", prompt="Summarize: {text}", system="Be brief.", max_tokens=7, model="claude-y")
    assert sql(store, stale) == [(5,)]


def test_a_prompt_reading_another_steps_output_goes_stale_when_that_output_changes(run, sim: Simulator) -> None:
    out = run(frame(4), "summary", prompt="Summarize: {text}")
    run(out, "title", prompt="Title for: {summary}")
    sim.responder = lambda prompt, system: "new: " + prompt
    redone = run(frame(4), "summary", prompt="Summarize: {text}", where="id < 2", redo=True)
    run(redone, "title", prompt="Title for: {summary}")
    report = last_report()
    assert report is not None and (report.stale, report.calls) == (2, 0)
    run(redone, "title", prompt="Title for: {summary}", redo="stale")
    assert sorted(p for p in sim.paid_prompts() if p.startswith("Title for: new")) == [
        "Title for: new: Summarize: hello message number 0",
        "Title for: new: Summarize: hello message number 1",
    ]


def test_a_new_step_on_a_table_larger_than_the_scan_memory_limit(run, store: Path, monkeypatch) -> None:
    """A new step renders a request for every row in its transaction: changes DuckDB cannot evict. Lowering
    the memory limit below them for the read that follows failed (and aborted the transaction); at 3,000,000
    rows that was every new step. Here the limits are made small instead of the table large."""
    from llmledger._ledger import survey

    monkeypatch.setattr(survey, "SCAN_MEMORY_LIMIT", 64_000_000)
    monkeypatch.setattr(survey, "JOIN_MEMORY_LIMIT", 64_000_000)
    df = frame(600_000)
    run(df, "summary", prompt="Summarize: {text}", where="false")
    out = run(df, "title", prompt="Title: {text}", where="id < 3")
    assert out["title_status"].value_counts().sort("title_status").rows() == [("NOT_STARTED", 599_997), ("DONE", 3)]
    assert (
        run(df.sample(fraction=1.0, shuffle=True, seed=1), "title", prompt="Title: {text}", where="id < 3")[
            "title_status"
        ].null_count()
        == 0
    ), "the rerun (and its join fallback) reads it back"


def test_a_read_that_runs_out_of_room_under_the_lowered_limit_is_read_again_without_it(
    run, store: Path, monkeypatch
) -> None:
    """What a full-table read needs beside its pages differs by DuckDB version (1.2 needs more than 2.0) and by
    what the last writes left in memory: a limit that is too small must cost a second read, never the run."""
    from llmledger._ledger import survey

    monkeypatch.setattr(survey, "SCAN_MEMORY_LIMIT", 1_000_000)
    monkeypatch.setattr(survey, "JOIN_MEMORY_LIMIT", 1_000_000)
    df = frame(300_000)
    run(df, "summary", prompt="Summarize: {text}", where="id < 2")
    out = run(df, "summary", prompt="Summarize: {text}", where="id < 4")
    assert out["summary_status"].value_counts().sort("summary_status").rows() == [("NOT_STARTED", 299_996), ("DONE", 4)]
    assert out.filter(pl.col("id") < 4)["summary"].null_count() == 0


def test_a_later_call_on_a_table_takes_the_key_the_table_records(run, sim: Simulator, store: Path) -> None:
    """Found in a trial: the docs' second call on a table (another step, another model) named no key= and was
    refused with "no 'id' column", though the table records its key. A frame holding those columns takes it."""
    df = frame(5).rename({"id": "review_id"})
    run(df, "summary", prompt="Summarize: {text}", key="review_id")
    out = run(df, "title", prompt="Title: {text}")  # no key=: the table's
    assert out["title_status"].to_list() == ["DONE"] * 5 and sim.stats()["paid"] == 10
    with pytest.raises(llmledger.KeyColumnError, match="no 'id' column"):  # a frame without them: as before
        run(df.rename({"review_id": "rid"}), "other", prompt="{text}")


@pytest.mark.parametrize(("key", "column"), [("__exists", "text"), ("id", "__output"), ("at", "__status")])
def test_columns_named_like_the_surveys_own_read_as_the_users(run, sim: Simulator, key: str, column: str) -> None:
    """Found in an attack on the one-scan survey: it read an input column named `__output` as the answers of a
    plain rerun, a key named `__exists` hid an edited input (not stale, never redone), and a key named `at` broke
    the read-back of claims. The survey's own columns now go under names no user column can shadow."""
    df = pl.DataFrame({key: [0, 1, 2], column: ["a", "b", "c"]})
    options = {"prompt": "Summarize: {" + column + "}", "key": key}
    run(df, "summary", **options)
    again = run(df, "summary", **options)
    assert again["summary"].to_list() == ["Summary: a", "Summary: b", "Summary: c"] and sim.stats()["paid"] == 3
    edited = df.with_columns(pl.when(pl.col(key) == 0).then(pl.lit("A")).otherwise(pl.col(column)).alias(column))
    assert run(edited, "summary", **options)["summary_stale"].to_list() == [True, False, False]
    redone = run(edited, "summary", redo="stale", **options)
    assert redone["summary"].to_list() == ["Summary: A", "Summary: b", "Summary: c"] and sim.stats()["paid"] == 4


def test_a_where_with_an_escaped_quote_and_a_parameter_name_in_its_text(run, sim: Simulator) -> None:
    """Found in an attack: the survey wrote the call's parameters into its query, and past an E'\\'' string in a
    `where=` it took the text "$max_attempts" in a later string for a parameter, so the where selected other rows.
    A `where=` holding a "$" keeps the parameters."""
    df = pl.DataFrame({"id": [1, 2, 3], "text": ["x", "retry 3", "retry $max_attempts"]})
    run(df, "summary", prompt="Summarize: {text}", where="false")
    out = run(df, "summary", prompt="Summarize: {text}", where=r"text <> E'\'' AND text <> 'retry $max_attempts'")
    assert out["summary_status"].to_list() == ["DONE", "DONE", "NOT_STARTED"] and sim.stats()["paid"] == 2
