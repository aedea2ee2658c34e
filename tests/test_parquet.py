"""Parquet in and out: a Parquet file as input, and a ledger exported and restored without losing anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, last_report

from .conftest import frame, sql

EXTRACT = {"prompt": "Extract from: {text}", "output": {"company": str, "year": int}}


def _wide(n: int) -> pl.DataFrame:
    return frame(n).with_columns(pl.lit("x" * 1000).alias("blob"), (pl.col("id") % 3 == 0).alias("flagged"))


def test_a_parquet_file_is_read_for_just_the_columns_the_step_needs(
    run, sim: Simulator, store: Path, tmp_path: Path
) -> None:
    _wide(6).write_parquet(tmp_path / "part1.parquet")
    _wide(10).slice(6).write_parquet(tmp_path / "part2.parquet")
    out = run(tmp_path / "part*.parquet", "summary", prompt="Summarize: {text}", where="flagged")
    assert out.columns == ["id", "text", "flagged", "summary", "summary_status", "summary_stale"]
    assert out["id"].to_list() == list(range(10))
    assert sim.stats()["paid"] == 4  # ids 0, 3, 6, 9
    columns = [c for (c,) in sql(store, "SELECT column_name FROM (DESCRIBE messages)")]
    assert "blob" not in columns and "flagged" in columns

    with pytest.raises(InvalidInputError, match="could not be read as Parquet"):
        run(tmp_path / "missing.parquet", "summary", prompt="Summarize: {text}")


def test_export_and_restore_keep_everything_and_a_rerun_pays_nothing(
    run, sim: Simulator, store: Path, tmp_path: Path, client
) -> None:
    df = frame(8)
    run(df, "extract", **EXTRACT)
    run(df, "summary", prompt="Summarize: {text}")
    llmledger.flag(store, "messages", "summary", where="id IN (1, 2)", reason="vague")
    sim.responder = lambda prompt, system: "again: " + prompt
    run(df, "summary", prompt="Summarize: {text}", redo="flagged")
    llmledger.flag(store, "messages", "summary", where="id = 5", reason="check later")
    paid = sim.stats()["paid"]

    folder = llmledger.export(store, "messages", tmp_path / "archive")
    assert sorted(p.name for p in folder.iterdir()) == [
        "llmledger_history.parquet",
        "llmledger_packs.parquet",  # none here: every bookkeeping table goes along
        "llmledger_runs.parquet",
        "llmledger_steps.parquet",
        "llmledger_verdicts.parquet",  # the flag above is a person's verdict
        "messages.parquet",
    ]
    assert pl.read_parquet(folder / "messages.parquet").schema["extract"] == pl.Struct(
        {"company": pl.String, "year": pl.Int64}
    )

    copy = tmp_path / "restored.duckdb"
    assert llmledger.restore(folder, copy) == "messages"
    every = "SELECT * FROM messages ORDER BY id"
    assert sql(copy, every) == sql(store, every)
    for table in ("llmledger_history", "llmledger_steps", "llmledger_runs"):
        assert sql(copy, f"SELECT * FROM {table} ORDER BY ALL") == sql(store, f"SELECT * FROM {table} ORDER BY ALL")

    for step, options in (("extract", EXTRACT), ("summary", {"prompt": "Summarize: {text}"})):
        run(df, step, store=copy, **options)
        assert last_report().calls == 0  # type: ignore[union-attr]
    assert sim.stats()["paid"] == paid
    assert llmledger.history(copy, "messages", "summary")["reason"].to_list() == ["flagged: vague"] * 2
    run(df, "summary", store=copy, prompt="Summarize: {text}", redo="flagged")
    assert sim.stats()["paid"] == paid + 1, "the flag on row 5 came along"

    with pytest.raises(InvalidInputError, match="already has a table 'messages'"):
        llmledger.restore(folder, copy)
    with pytest.raises(InvalidInputError, match="not an empty folder"):
        llmledger.export(store, "messages", folder)


def test_one_steps_view_and_the_cli(run, store: Path, tmp_path: Path) -> None:
    run(frame(5), "summary", prompt="Summarize: {text}")
    run(frame(5), "title", prompt="Title for: {text}")
    target = tmp_path / "summary.parquet"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmledger",
            "export",
            str(store),
            "--table",
            "messages",
            str(target),
            "--step",
            "summary",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    view = pl.read_parquet(target)
    assert view.columns == [
        "id",
        "text",
        "summary",
        "summary_status",
        "summary_error",
        "summary_attempts",
        "summary_input_tokens",
        "summary_output_tokens",
        "summary_cost_usd",
        "summary_model",
        "summary_finished_at",
        "summary_raw",
        "summary_flag",
    ]
    assert view["summary_status"].to_list() == ["DONE"] * 5

    folder, copy = tmp_path / "all", tmp_path / "copy.duckdb"
    for args in (["export", str(store), "--table", "messages", str(folder)], ["restore", str(folder), str(copy)]):
        done = subprocess.run([sys.executable, "-m", "llmledger", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert sql(copy, "SELECT id, summary, title FROM messages ORDER BY id") == sql(
        store, "SELECT id, summary, title FROM messages ORDER BY id"
    )


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".ndjson"])
def test_export_writes_the_file_its_suffix_names(suffix: str, tmp_path: Path, client: Any, sim: Any) -> None:
    """Found in a trial: `llmledger export STORE out.csv` made a folder named out.csv holding Parquet files."""
    from llmledger import apply_llm

    store = tmp_path / "s.duckdb"
    apply_llm(frame(5), "s", prompt="Summarize: {text}", store=store, table="t", client=client, progress=False)
    apply_llm(frame(5), "v", prompt="Judge: {text}", output={"label": str}, store=store, table="t", client=client,
              progress=False)  # fmt: skip
    out = llmledger.export(store, "t", tmp_path / f"out{suffix}")
    assert out.is_file()
    read = pl.read_csv(out) if suffix == ".csv" else pl.read_ndjson(out)
    assert read.height == 5 and read["s"].to_list() == [f"Summary: hello message number {i}" for i in range(5)]
    done = subprocess.run([sys.executable, "-m", "llmledger", "export", str(store), str(out)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "--overwrite" in done.stderr, done.stderr
    with pytest.raises(llmledger.InvalidInputError, match=r"\.parquet, \.csv, \.jsonl.*Nothing was written"):
        llmledger.export(store, "t", tmp_path / "out.xlsx")
    assert not (tmp_path / "out.xlsx").exists()
