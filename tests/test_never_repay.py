"""Behaviour 1: a rerun pays for nothing that is DONE."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pytest

from llmledger import Simulator, last_report
from llmledger.simulator import default_reply

from .conftest import frame, sql


def test_second_identical_call_pays_nothing(run, sim: Simulator) -> None:
    df = frame(40)
    first = run(df, "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] == 40
    second = run(df, "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] == 40
    assert second.equals(first)
    assert first["summary_status"].unique().to_list() == ["DONE"]


def test_request_carries_prompt_and_system_and_output_is_the_reply(run, sim: Simulator) -> None:
    df = frame(5)
    out = run(df, "summary", prompt="Summarize: {text}", system="Be brief.", model="claude-test-1", max_tokens=77)
    log = sim.log()
    assert sorted(r["prompt"] for r in log) == sorted(f"Summarize: {t}" for t in df["text"])
    assert {r["system"] for r in log} == {"Be brief."}
    assert {r["model"] for r in log} == {"claude-test-1"}
    assert {r["max_tokens"] for r in log} == {77}
    assert out["summary"].to_list() == [default_reply(f"Summarize: {t}") for t in df["text"]]


def test_new_rows_are_the_only_ones_paid(run, sim: Simulator, store: Path) -> None:
    run(frame(30), "summary", prompt="Summarize: {text}")
    grown = pl.concat([frame(30), frame(7, start=30)])
    out = run(grown, "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] == 37
    assert max(sim.paid_prompts().values()) == 1
    assert out["summary_status"].to_list() == ["DONE"] * 37
    assert sql(store, "SELECT count(*) FROM messages") == [(37,)]


def test_order_extra_columns_and_rereading_a_file_change_nothing(run, sim: Simulator, tmp_path: Path) -> None:
    csv = tmp_path / "input.csv"
    frame(25).write_csv(csv)
    run(pl.read_csv(csv), "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] == 25

    shuffled = (
        pl.read_csv(csv)
        .sample(fraction=1.0, shuffle=True, seed=3)
        .with_columns(pl.lit("unrelated").alias("note"), pl.col("id").alias("id_copy"))
    )
    out = run(shuffled, "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] == 25
    assert out["id"].to_list() == shuffled["id"].to_list(), "rows come back in the order they went in"
    assert out.columns == [*shuffled.columns, "summary", "summary_status", "summary_stale"]


def test_pandas_in_pandas_out(run, sim: Simulator) -> None:
    df = pd.DataFrame({"id": [3, 1, 2], "text": ["c", "a", "b"]}, index=[10, 11, 12])
    out = run(df, "summary", prompt="Summarize: {text}")
    assert isinstance(out, pd.DataFrame)
    assert list(out.index) == [10, 11, 12]
    assert list(out["summary"]) == [default_reply(f"Summarize: {t}") for t in ["c", "a", "b"]]
    assert list(out["summary_status"]) == ["DONE"] * 3


def test_ledger_is_plain_sql(run, store: Path) -> None:
    run(frame(10), "summary", prompt="Summarize: {text}")
    with duckdb.connect(str(store), read_only=True) as con:
        cols = {r[0]: r[1] for r in con.execute("DESCRIBE messages").fetchall()}
        rows = con.execute(
            "SELECT summary_status, count(*), sum(summary_attempts), "
            "count(summary_input_tokens), count(summary_fingerprint), count(summary_finished_at) "
            "FROM messages GROUP BY ALL"
        ).fetchall()
    for name, kind in [
        ("id", "BIGINT"),
        ("text", "VARCHAR"),
        ("summary", "VARCHAR"),
        ("summary_status", "VARCHAR"),
        ("summary_running_started_at", "TIMESTAMP"),
        ("summary_attempts", "INTEGER"),
        ("summary_error", "VARCHAR"),
        ("summary_claimed_by", "VARCHAR"),
    ]:
        assert cols[name] == kind
    assert rows == [("DONE", 10, 10, 10, 10, 10)]


def test_default_key_is_id_and_outputs_chain_into_a_second_step(run, sim: Simulator, store: Path) -> None:
    out = run(frame(6), "summary", prompt="Summarize: {text}")
    again = run(out, "title", prompt="Title for: {summary}")
    assert sim.stats()["paid"] == 12
    assert again.columns == [
        "id",
        "text",
        "summary",
        "summary_status",
        "summary_stale",
        "title",
        "title_status",
        "title_stale",
    ]
    # the first step's columns were not copied over by the second call
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'") == [(6,)]


def test_duplicate_texts_share_one_call_in_real_data(run, sim: Simulator, sms: pl.DataFrame, store: Path) -> None:
    sample = sms.head(800)  # 17 texts repeated (1,500 rows: 48, at twice the time; the claim is the same)
    distinct = sample["text"].n_unique()
    assert distinct < sample.height, "the SMS collection repeats some texts"
    out = run(sample, "label_guess", prompt="Is this spam? {text}", concurrency=32)
    assert sim.stats()["paid"] == distinct
    assert max(sim.paid_prompts().values()) == 1
    assert out["label_guess_status"].to_list() == ["DONE"] * sample.height
    answers = out.group_by("text").agg(pl.col("label_guess").n_unique().alias("answers"))
    assert answers["answers"].max() == 1, "identical texts got the identical answer"
    report = last_report()
    assert report is not None and (report.calls, report.reused) == (distinct, sample.height - distinct)
    assert sql(store, "SELECT sum(label_guess_input_tokens > 0::INT) FROM messages") == [(distinct,)], (
        "reused rows cost nothing"
    )

    # a later frame with more rows (8 of the 300 new ones repeat texts already answered): reused from the ledger,
    # not paid again
    run(sms.head(1100), "label_guess", prompt="Is this spam? {text}", concurrency=32)
    assert sim.stats()["paid"] == sms.head(1100)["text"].n_unique()
    run(sample.reverse(), "label_guess", prompt="Is this spam? {text}")
    assert sim.stats()["paid"] == sms.head(1100)["text"].n_unique()


def test_dedupe_false_sends_every_row(run, sim: Simulator) -> None:
    df = pl.DataFrame({"id": [1, 2, 3], "text": ["same", "same", "other"]})
    run(df, "summary", prompt="Summarize: {text}", dedupe=False)
    assert sim.stats()["paid"] == 3


def test_new_frame_columns_join_the_fact_table_for_where(run, sim: Simulator, store: Path) -> None:
    run(frame(6), "summary", prompt="Summarize: {text}", where="false")
    tagged = frame(6).with_columns(pl.when(pl.col("id") < 2).then(pl.lit("en")).otherwise(pl.lit("fr")).alias("lang"))
    run(tagged, "summary", prompt="Summarize: {text}", where="lang = 'en'")
    assert sim.stats()["paid"] == 2
    assert sql(store, "SELECT lang, count(*) FROM messages GROUP BY ALL ORDER BY ALL") == [("en", 2), ("fr", 4)]


def test_clients_dropped_without_closing_never_stall_a_later_run(sim: Simulator, store: Path) -> None:
    """A notebook makes a new client per cell and never closes it: no later run may lose an answer to that."""
    import anthropic

    from llmledger import apply_llm

    for i in range(15):
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")  # the previous one is dropped
        started = time.monotonic()
        out = apply_llm(
            frame(40, start=40 * i),
            "summary",
            prompt="Summarize: {text}",
            store=store,
            table="messages",
            client=client,
            progress=False,
        )
        assert time.monotonic() - started < 10, "no request waited for an answer the server had sent"
        assert out["summary_status"].to_list() == ["DONE"] * 40
    assert sim.stats()["paid"] == 600 and max(sim.paid_prompts().values()) == 1


def test_a_prompt_callable_sees_every_column_even_python_objects(run, sim: Simulator, store: Path) -> None:
    class Note:
        def __init__(self, text: str) -> None:
            self.text = text

    df = pl.DataFrame({"id": [1, 2], "note": pl.Series([Note("alpha"), Note("beta")], dtype=pl.Object)})
    out = run(df, "summary", prompt=lambda row: f"Summarize: {row['note'].text}")
    assert sorted(sim.paid_prompts()) == ["Summarize: alpha", "Summarize: beta"]
    assert out.columns == ["id", "note", "summary", "summary_status", "summary_stale"]
    assert sql(store, "SELECT summary_prompt FROM messages ORDER BY id") == [
        ("Summarize: alpha",),
        ("Summarize: beta",),
    ]
    run(df, "summary", prompt=lambda row: f"Summarize: {row['note'].text}")
    assert sim.stats()["paid"] == 2, "a callable is rendered again on every call, and nothing changed"


def test_an_identical_request_in_another_table_or_step_is_not_paid_again(run, sim: Simulator, store: Path) -> None:
    run(frame(6), "summary", prompt="Summarize: {text}")
    out = run(frame(8), "summary", prompt="Summarize: {text}", table="archive")
    report = last_report()
    assert sim.stats()["paid"] == 8 and report is not None and (report.calls, report.reused) == (2, 6)
    assert out["summary_status"].to_list() == ["DONE"] * 8
    assert sql(store, "SELECT count(*) FROM archive WHERE summary_cost_usd = 0") == [(6,)], "reused: no cost"
    assert report.avoided_usd == pytest.approx(6 * report.cost_usd / 2), "six answers at the run's average call"
    run(frame(8), "recap", prompt="Summarize: {text}", table="archive")
    assert sim.stats()["paid"] == 8, "another step with the same request reuses too"
    run(frame(8), "recap2", prompt="Summarize: {text}", table="archive", model="claude-sonnet-4-6")
    assert sim.stats()["paid"] == 16, "another model is another request"
