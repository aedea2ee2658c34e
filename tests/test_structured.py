"""Structured outputs: `output=` asks for JSON of a shape, stores a STRUCT, and sends unusable answers to review."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Literal

import anthropic
import polars as pl
import pytest
from pydantic import BaseModel, field_validator

import llmledger
from llmledger import InvalidInputError, Simulator, last_report

from .conftest import frame, sql


class Company(BaseModel):
    name: str
    country: str | None


class Extract(BaseModel):
    company: Company
    year: int
    tone: Literal["positive", "negative", "neutral"]
    tags: list[str]
    confidence: float
    public: bool


def test_structured_answers_are_struct_columns_that_plain_sql_reads(run, sim: Simulator, store: Path) -> None:
    out = run(frame(8), "extract", prompt="Extract from: {text}", output=Extract)

    assert out.schema["extract"] == pl.Struct(
        {
            "company": pl.Struct({"name": pl.String, "country": pl.String}),
            "year": pl.Int64,
            "tone": pl.String,
            "tags": pl.List(pl.String),
            "confidence": pl.Float64,
            "public": pl.Boolean,
        }
    )
    assert out["extract_status"].to_list() == ["DONE"] * 8
    flat = out.unnest("extract")
    assert flat["tone"].is_in(["positive", "negative", "neutral"]).all()
    assert flat["year"].is_between(0, 99).all()

    body = sim.log()[0]["body"]
    schema = body["output_config"]["format"]["schema"]
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(Extract.model_fields)
    assert "tool_choice" not in body and "tools" not in body

    # Another process, with nothing but the duckdb module, groups by a field of the struct.
    code = (
        f"import duckdb; con = duckdb.connect({str(store)!r}, read_only=True); "
        'print(con.sql("SELECT typeof(extract.company.name), typeof(extract.year), typeof(extract.tags), '
        'count(*) FROM messages GROUP BY ALL").fetchall())'
    )
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "[('VARCHAR', 'BIGINT', 'VARCHAR[]', 8)]"
    answers = sql(store, "SELECT extract.tone, extract.company.name FROM messages ORDER BY id")
    assert answers == [(t, n) for t, n in zip(flat["tone"], flat["company"].struct.field("name"), strict=True)]


def test_a_mapping_of_types_is_an_output_schema_and_pandas_gets_dicts(run, sim: Simulator) -> None:
    pandas = pytest.importorskip("pandas")
    df = pandas.DataFrame({"id": [1, 2], "text": ["great phone", "broken on arrival"]})
    out = run(
        df,
        "label",
        prompt="Sentiment of: {text}",
        output={"sentiment": Literal["positive", "negative", "neutral"], "words": int | None},
    )
    assert isinstance(out, pandas.DataFrame)
    assert [row["sentiment"] for row in out["label"]] == ["positive", "negative"]
    assert all(isinstance(row, dict) and set(row) == {"sentiment", "words"} for row in out["label"])


def test_an_invalid_answer_is_retried_once_with_the_reason(run, sim: Simulator, store: Path) -> None:
    sim.configure(bad_json_once="number 3")
    out = run(frame(5), "extract", prompt="Extract from: {text}", output=Extract)
    assert out["extract_status"].to_list() == ["DONE"] * 5
    assert sim.stats()["paid"] == 6, "one retry for the one bad answer"
    retry = [entry["body"] for entry in sim.log() if len(entry["body"]["messages"]) > 1]
    assert len(retry) == 1
    assert retry[0]["messages"][0]["content"] == "Extract from: hello message number 3"
    assert retry[0]["messages"][1]["role"] == "assistant"
    assert "not valid JSON" in retry[0]["messages"][2]["content"]
    report = last_report()
    assert report is not None and report.calls == 6 and report.done == 5
    tokens = dict(sql(store, "SELECT id, extract_input_tokens FROM messages"))
    assert tokens[3] > 2 * tokens[2], "the retry's tokens are billed to the row"


def test_an_answer_invalid_twice_goes_to_review_with_its_raw_text(run, sim: Simulator, store: Path) -> None:
    sim.configure(bad_json="number 1", truncate="number 2")
    out = run(frame(4), "extract", prompt="Extract from: {text}", output=Extract)
    assert out["extract_status"].to_list() == ["DONE", "NEEDS_REVIEW", "NEEDS_REVIEW", "DONE"]
    assert sim.stats()["paid"] == 6
    rows = {
        r[0]: r[1:]
        for r in sql(
            store,
            "SELECT id, extract, extract_raw, extract_error, extract_stop_reason, "
            "extract_cost_usd > 0 FROM messages WHERE id IN (1, 2)",
        )
    }
    output, raw, error, _, paid = rows[1]
    assert output is None and raw and not raw.startswith("{") and paid
    assert "does not match the output schema, also when asked again" in error
    assert rows[2][3] == "max_tokens" and rows[2][1] and rows[2][4]
    with pytest.raises(json.JSONDecodeError):
        json.loads(rows[2][1])

    run(frame(4), "extract", prompt="Extract from: {text}", output=Extract)
    assert sim.stats()["paid"] == 6, "rows in review are not re-sent by a plain rerun"


def test_changing_the_schema_makes_answers_stale_and_keeps_the_old_ones(run, sim: Simulator, store: Path) -> None:
    run(frame(6), "extract", prompt="Extract from: {text}", output={"company": str})
    out = run(frame(6), "extract", prompt="Extract from: {text}", output={"company": str, "year": int})
    report = last_report()
    assert report is not None and report.stale == 6 and report.calls == 0
    assert sim.stats()["paid"] == 6
    assert out.schema["extract"] == pl.Struct({"company": pl.String, "year": pl.Int64})
    assert out["extract"].struct.field("year").null_count() == 6, "old answers had no year"

    out = run(
        frame(6),
        "extract",
        prompt="Extract from: {text}",
        output={"company": str, "year": int},
        where="id < 2",
        redo="stale",
    )
    assert sim.stats()["paid"] == 8
    assert out["extract"].struct.field("year").null_count() == 4
    kept = sql(store, "SELECT count(*), count(DISTINCT row_key) FROM llmledger_history WHERE step = 'extract'")
    assert kept == [(8, 6)], "the schema change archived 6 answers, the redo 2 more"
    assert json.loads(sql(store, "SELECT output FROM llmledger_history LIMIT 1")[0][0]).keys() == {"company"}


def test_validate_sends_a_row_to_review_and_keeps_its_answer(run, sim: Simulator, store: Path) -> None:
    seen: list[dict] = []

    def check(row: dict, output: Extract) -> str | None:
        seen.append(row)
        return "year looks wrong" if output.year > 50 else None

    out = run(frame(10), "extract", prompt="Extract from: {text}", output=Extract, validate=check)
    years = out["extract"].struct.field("year")
    assert (out["extract_status"] == "NEEDS_REVIEW").to_list() == (years > 50).to_list()
    assert years.null_count() == 0, "answers sent to review stay in the output column"
    errors = {e for (e,) in sql(store, "SELECT extract_error FROM messages WHERE extract_status = 'NEEDS_REVIEW'")}
    assert errors == {"year looks wrong"}
    assert {row["id"] for row in seen} == set(range(10)) and seen[0]["text"].startswith("hello message")
    assert sim.stats()["paid"] == 10


def test_a_pydantic_validator_counts_as_a_mismatch(run, sim: Simulator) -> None:
    class Strict(BaseModel):
        year: int

        @field_validator("year")
        @classmethod
        def recent(cls, value: int) -> int:
            if value < 1000:
                raise ValueError("year must have four digits")
            return value

    out = run(frame(2), "extract", prompt="Extract from: {text}", output=Strict)
    assert out["extract_status"].to_list() == ["NEEDS_REVIEW"] * 2
    assert sim.stats()["paid"] == 4
    assert "four digits" in sim.log()[-1]["body"]["messages"][-1]["content"]


def test_resume_checks_structured_answers_from_the_stored_schema(
    run, sim: Simulator, store: Path, client: anthropic.AsyncAnthropic
) -> None:
    sim.configure(fail_next=["enforced_spend_limit_reached"])
    with pytest.raises(llmledger.SpendLimitReached):
        run(frame(6), "extract", prompt="Extract from: {text}", output=Extract, concurrency=1)
    sim.configure(bad_json="number 4")
    report = llmledger.resume(store, "messages", "extract", client=client, progress=False)
    assert report.done == 5 and report.needs_review == 1
    statuses = dict(sql(store, "SELECT id, extract_status FROM messages"))
    assert statuses[4] == "NEEDS_REVIEW" and list(statuses.values()).count("DONE") == 5
    paid = sim.stats()["paid"]
    run(frame(6), "extract", prompt="Extract from: {text}", output=Extract)
    assert sim.stats()["paid"] == paid


def test_the_simulator_refuses_a_schema_the_api_refuses(sim: Simulator) -> None:
    client = anthropic.Anthropic(base_url=sim.base_url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="additionalProperties"):
        client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=50,
            messages=[{"role": "user", "content": "x"}],
            extra_body={
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    }
                }
            },
        )


@pytest.mark.parametrize(
    "output, message",
    [
        ({}, "empty mapping"),
        ({"my field": str}, "identifiers"),
        ({"x": object()}, "could not be made into a model"),
        (str, "pydantic model class or a mapping"),
    ],
)
def test_bad_output_is_refused_before_anything_is_written(run, store: Path, output: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        run(frame(2), "extract", prompt="Extract from: {text}", output=output)
    assert not store.exists()


def test_output_and_an_output_config_option_together_are_refused(run, store: Path) -> None:
    with pytest.raises(InvalidInputError, match="not both"):
        run(
            frame(2),
            "extract",
            prompt="x {text}",
            output={"a": str},
            request_options={"output_config": {"format": {"type": "json_schema", "schema": {}}}},
        )
    assert not store.exists()
