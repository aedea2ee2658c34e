"""The fingerprint covers the whole request: options change -> stale, never reused across options."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, last_report
from llmledger._ledger import open_ledger
from llmledger._ledger.engine.dialect import DIALECTS
from llmledger._ledger.engine.shared import registered

from .conftest import frame, sql


def test_changing_request_options_makes_rows_stale_and_redo_stale_pays_exactly_those(
    run, sim: Simulator, store: Path
) -> None:
    df = frame(8)
    run(df, "summary", prompt="Summarize: {text}", request_options={"stop_sequences": ["END"]})
    assert sim.stats()["paid"] == 8
    run(df, "summary", prompt="Summarize: {text}", request_options={"stop_sequences": ["STOP"]})
    report = last_report()
    assert report is not None and (report.stale, report.calls) == (8, 0), "reported, not paid"
    assert sim.stats()["paid"] == 8

    run(df.head(3), "summary", prompt="Summarize: {text}", request_options={"stop_sequences": ["STOP"]}, redo="stale")
    assert sim.stats()["paid"] == 11, "redo='stale' re-sends exactly the stale rows it is given"
    assert [r["body"]["stop_sequences"] for r in sim.log()[-3:]] == [["STOP"]] * 3
    run(df, "summary", prompt="Summarize: {text}", request_options={"stop_sequences": ["STOP"]})
    assert last_report().stale == 5  # type: ignore[union-attr]


def test_every_part_of_the_request_makes_a_new_step_version(run, store: Path) -> None:
    df = frame(2)
    base = {"prompt": "Summarize: {text}", "where": "false"}
    for changes in (
        {},
        {"model": "claude-other"},
        {"system": "Be terse."},
        {"max_tokens": 99},
        {"prompt": "Summarise: {text}"},
        {"request_options": {"temperature": 0.5}},
        {"request_options": {"temperature": 0.7}},
        {},
    ):
        run(df, "summary", **{**base, **changes})
    steps = sql(
        store, "SELECT version, model, system, max_tokens, prompt, options FROM llmledger_steps ORDER BY created_at"
    )
    assert len(steps) == 7, "seven different definitions; running the first one again adds none"
    assert len({s[0] for s in steps}) == 7
    assert json.loads(steps[-1][5]) == {"temperature": 0.7}
    assert sql(store, "SELECT count(DISTINCT summary_request_fingerprint) FROM messages") == [(2,)]


def test_identical_prompts_under_other_options_are_never_reused(run, sim: Simulator) -> None:
    run(
        pl.DataFrame({"id": [1], "text": ["same text"]}),
        "summary",
        prompt="Summarize: {text}",
        request_options={"temperature": 0.0},
    )
    out = run(
        pl.DataFrame({"id": [1, 2], "text": ["same text", "same text"]}),
        "summary",
        prompt="Summarize: {text}",
        request_options={"temperature": 1.0},
    )
    report = last_report()
    assert report is not None and report.calls == 1, "row 2 asks with other options: a new call"
    assert report.reused == 0 and report.stale == 1
    assert out["summary_status"].to_list() == ["DONE", "DONE"]
    assert [r["body"].get("temperature") for r in sim.log()] == [0.0, 1.0]


def test_options_reach_the_api_as_body_fields(run, sim: Simulator) -> None:
    run(
        frame(2),
        "summary",
        prompt="Summarize: {text}",
        request_options={"temperature": 0.2, "top_k": 5, "metadata": {"user_id": "u-1"}, "stop_sequences": ["zz"]},
    )
    body = sim.log()[0]["body"]
    assert {k: body[k] for k in ("temperature", "top_k", "metadata", "stop_sequences")} == {
        "temperature": 0.2,
        "top_k": 5,
        "metadata": {"user_id": "u-1"},
        "stop_sequences": ["zz"],
    }


def test_a_stop_sequence_is_honoured_and_stored(run, sim: Simulator, store: Path) -> None:
    out = run(
        pl.DataFrame({"id": [1], "text": ["alpha beta gamma"]}),
        "summary",
        prompt="Summarize: {text}",
        request_options={"stop_sequences": ["gamma"]},
    )
    assert out["summary"].to_list() == ["Summary: alpha beta "]
    assert sql(store, "SELECT summary_stop_reason FROM messages") == [("stop_sequence",)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": "x"}, "pass model= instead"),
        ({"messages": []}, r"pass prompt= \(or messages=\) instead"),
        ({"system": "x"}, "pass system= instead"),
        ({"stream": True}, "does not stream"),
        ({"timeout": 5}, "client.with_options"),
        ({"temperature": float("nan")}, "JSON values"),
        ({"metadata": object()}, "JSON values"),
        (["temperature", 0.5], "must be a dict"),
    ],
)
def test_bad_request_options_are_refused_before_anything_is_written(
    run, sim: Simulator, store: Path, options, message
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        run(frame(2), "summary", prompt="Summarize: {text}", request_options=options)
    assert not store.exists() and sim.stats()["requests"] == 0


@pytest.mark.parametrize("engine", ["duckdb", "postgresql"])
def test_the_sql_fingerprint_equals_pythons_for_any_text(engine: str, request: pytest.FixtureRequest) -> None:
    rng = random.Random(3)
    first = 1 if engine == "postgresql" else 0  # PostgreSQL's text cannot hold chr(0)
    alphabet = [chr(c) for c in range(first, 0x80)] + ["é", "€", "😀", "\u2028", "\ufeff", "\\u000B", '\\"']
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(2000)]
    spec = llmledger._step.request.RequestSpec(
        model="m", max_tokens=9, system="s\x0b'\" 100%", options={"stop_sequences": ["\x1f"]}
    )
    prompts = pl.DataFrame({"p": texts}).with_row_index("i")
    if engine == "postgresql":
        ledger = open_ledger(request.getfixturevalue("pg_url"))
        got = ledger.conn.transaction(lambda con: _fingerprints(con, spec, prompts, "postgres"))  # type: ignore[attr-defined]
    else:
        got = _fingerprints(duckdb.connect(), spec, prompts, "duckdb")
    assert got == [llmledger.fingerprint(spec.body(t)) for t in texts]


def _fingerprints(con: Any, spec: Any, prompts: pl.DataFrame, dialect: str) -> list[str]:
    with registered(con, "prompts", prompts):
        fingerprint = spec.fingerprint_sql("p", DIALECTS[dialect].json_string_sql)
        query = f"SELECT {fingerprint}::VARCHAR AS fp FROM prompts ORDER BY i"
        return con.sql(query).pl()["fp"].to_list()
