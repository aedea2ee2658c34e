"""Names and conditions at the edges: a step never takes over another step's or an input's columns, `where=` is
one condition and never SQL to run (on either engine), URLs with passwords are never printed, a quiet run is
quiet, and PostgreSQL's crash recovery is waited for. Each case failed on 0.6.0."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, StepNameError, WhereClauseError, apply_llm
from llmledger._ledger.engine.postgres import _refused_for_good
from llmledger.simulator import default_reply

from .conftest import frame


def snapshot(target: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of the store, every row, in a stable order: what 'nothing was written' is checked against."""
    tables = llmledger.sql(
        target, "SELECT table_name FROM information_schema.tables WHERE table_schema IN ('main', 'public') ORDER BY 1"
    )["table_name"].to_list()
    out = {}
    for table in tables:
        rows = llmledger.sql(target, f'SELECT * FROM "{table}"')
        out[table] = sorted(map(repr, rows.rows()))  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


# -- step names ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["s_prompt", "s_flag", "s_status", "S_Status", "s_request_fingerprint", "text", "Text", "label"]
)
def test_a_step_whose_columns_would_be_another_steps_or_an_inputs_is_refused(
    name: str, target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    df = frame(6).with_columns(pl.lit("ham").alias("label"))
    apply_llm(df, "s", prompt="Classify: {text} ({label})", store=target, table="t", client=client, progress=False)
    before, paid = snapshot(target), sim.stats()["paid"]
    with pytest.raises(StepNameError, match=r"clashes with step 's'|over the input column") as caught:
        apply_llm(df, name, prompt="Other: {text}", store=target, table="t", client=client, progress=False)
    assert "Nothing was written" in str(caught.value)
    if name.lower() in ("text", "label"):  # the input named as it is, not as the step spells it
        assert f"over the input column {name.lower()!r}" in str(caught.value)
    assert snapshot(target) == before and sim.stats()["paid"] == paid
    # the step it would have broken still sends what it recorded, and its rows are still its own answers
    report = llmledger.resume(target, "t", "s", client=client, progress=False)
    assert report.calls == 0
    rows = llmledger.sql(target, "SELECT text, label, s, s_status, s_prompt FROM t ORDER BY id")
    assert rows["s_status"].to_list() == ["DONE"] * 6 and rows["label"].to_list() == ["ham"] * 6
    assert rows["s"].to_list() == [default_reply(p) for p in rows["s_prompt"].to_list()]
    assert rows["s_prompt"].to_list() == [f"Classify: {t} (ham)" for t in rows["text"].to_list()]


def test_an_older_step_named_like_a_new_steps_column_is_refused_too(store: Path, run: Any) -> None:
    """The other direction: beside a step `s_prompt`, a step `s` would own `s_prompt` as its stored request."""
    run(frame(3), "s_prompt", prompt="A: {text}")
    with pytest.raises(StepNameError, match="clashes with step 's_prompt'"):
        run(frame(3), "s", prompt="B: {text}")


def test_steps_of_one_pipeline_that_would_share_columns_are_refused_before_any_runs(
    store: Path, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    with pytest.raises(StepNameError, match="clashes with step 'a'"):
        llmledger.pipeline(
            frame(3),
            {"a": {"prompt": "A: {text}"}, "a_status": {"prompt": "B: {text}"}},
            store=store,
            table="t",
            client=client,
            progress=False,
        )
    assert sim.stats()["paid"] == 0 and not store.exists()


def test_names_that_only_look_alike_are_fine_and_a_frame_passed_back_in_is_fine(run: Any, sim: Simulator) -> None:
    out = run(frame(4), "s", prompt="A: {text}")
    out = run(out, "s", prompt="A: {text}")  # the frame carries s and s_status: the step's own columns
    run(out, "summary", prompt="B: {s}")  # `summary` owns no column of `s`, and `s` none of it
    run(out, "status", prompt="C: {text}")  # `status` is no suffix of anything here
    assert sim.stats()["paid"] == 12


def test_the_longest_step_name_allowed_works_on_postgresql_and_a_longer_one_is_refused(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    """PostgreSQL cuts names at 63 bytes: a 44-character step ran once, then every later call raised psycopg's
    DuplicateColumn (its `_upstream_fingerprint` and `_upstream_...` columns met). Every column a step owns now
    fits, and a name too long for them is refused with the reason, nothing written."""

    def run(step: str, table: str = "t") -> pl.DataFrame:
        return apply_llm(frame(3), step, prompt="A: {text}", store=target, table=table, client=client, progress=False)

    longest = "s" * 42
    assert run(longest)[f"{longest}_status"].to_list() == ["DONE"] * 3
    assert run(longest)[f"{longest}_status"].to_list() == ["DONE"] * 3 and sim.stats()["paid"] == 3
    before = snapshot(target)
    with pytest.raises(StepNameError, match=r"is 44 characters long; at most 42 fit.*63-byte"):
        run("s" * 44)
    assert snapshot(target) == before


def test_columns_the_store_cannot_keep_apart_are_refused(target: Any, client: anthropic.AsyncAnthropic) -> None:
    """Names DuckDB folds together (`text` and `Text`; `S` beside a step `s`) or PostgreSQL cuts to one
    (two long names with one 63-byte start) gave raw KeyError, CatalogException or DuplicateColumn."""

    def run(df: pl.DataFrame) -> Any:
        return apply_llm(df, "s", prompt="A: {text}", store=target, table="t", client=client, progress=False)

    run(frame(2))
    before = snapshot(target)
    with pytest.raises(llmledger.InvalidInputError, match=r"table 'T' differs only in case from the store's table 't'"):
        apply_llm(frame(2), "s", prompt="A: {text}", store=target, table="T", client=client, progress=False)
    cases = [
        (frame(2).with_columns(pl.col("text").alias("Text")), r"'text' and 'Text' differ only in case"),
        (frame(2).with_columns(pl.lit("x").alias("S")), r"'S' differs only in case from 's'"),
        (frame(2).with_columns(pl.lit("x").alias("S_STATUS")), r"'S_STATUS' differs only in case"),
        (frame(2).with_columns(pl.lit("x").alias("c" * 64)), r"has a name of 64 bytes.*at most 63"),
    ]
    for df, message in cases:
        with pytest.raises(llmledger.InvalidInputError, match=message):
            run(df)
    assert snapshot(target) == before


# -- where= --------------------------------------------------------------------------------------------------------
ATTACKS = [
    "true); DELETE FROM t WHERE id = 3; SELECT (1",
    "true); COMMIT; DELETE FROM t WHERE id = 3; SELECT (1",
    "true); DROP TABLE llmledger_runs; SELECT (1",
    "id = 1) OR (true",
    "true) --",
    "true /* ) */",
    "id = 1; DELETE FROM t",
    "text = 'a",
    "$$x$$ = '1'",
]


def _where_calls(target: Any, client: anthropic.AsyncAnthropic, where: str) -> dict[str, Any]:
    return {
        "apply_llm": lambda: apply_llm(
            frame(6), "s", prompt="A: {text}", store=target, table="t", client=client, progress=False, where=where
        ),
        "flag": lambda: llmledger.flag(target, "t", "s", where=where, reason="x"),
        "reset": lambda: llmledger.reset(target, "t", "s", where=where),
        "resume": lambda: llmledger.resume(target, "t", "s", client=client, progress=False, where=where),
    }


@pytest.mark.parametrize("where", ATTACKS)
def test_where_is_one_condition_never_statements_to_run(
    where: str, target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    apply_llm(frame(6), "s", prompt="A: {text}", store=target, table="t", client=client, progress=False)
    before, paid = snapshot(target), sim.stats()["paid"]
    for name, call in _where_calls(target, client, where).items():
        with pytest.raises(WhereClauseError, match=r"not one SQL condition|more than one SQL statement"):
            call()
        assert snapshot(target) == before, f"{name} with where={where!r} changed the store"
    assert sim.stats()["paid"] == paid


def test_the_cli_refuses_a_where_that_is_not_one_condition(
    pg_url: str, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    apply_llm(frame(6), "s", prompt="A: {text}", store=pg_url, table="t", client=client, progress=False)
    before = snapshot(pg_url)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmledger",
            "run",
            pg_url,
            "--table",
            "t",
            "--step",
            "s",
            "--where",
            "true); DELETE FROM t WHERE id = 3; SELECT (1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "not one SQL condition" in done.stderr
    assert snapshot(pg_url) == before


@pytest.mark.parametrize(
    "where",
    [
        "text = 'a;b'",
        "text LIKE '%message%'",
        "text = 'it''s (not' OR id % 2 = 0",
        "(id IN (1, 2)) AND text <> '--'",
        "\"text\" = '/* no comment */'",
    ],
)
def test_conditions_with_semicolons_dashes_and_percents_in_literals_still_work(
    where: str, target: Any, client: anthropic.AsyncAnthropic
) -> None:
    apply_llm(frame(6), "s", prompt="A: {text}", store=target, table="t", client=client, progress=False, where=where)
    expected = llmledger.sql(target, f"SELECT count(*) AS n FROM t WHERE {where}")["n"][0]
    done = llmledger.sql(target, "SELECT count(*) AS n FROM t WHERE s_status = 'DONE'")["n"][0]
    assert done == expected


# -- URLs, quiet runs, crash recovery ----------------------------------------------------------------------------
def test_copy_never_prints_a_password(pg_url: str, store: Path, run: Any) -> None:
    run(frame(3), "s", prompt="A: {text}")
    secret = (
        pg_url.replace("://", "://postgres:Sup3rS3cret@", 1)
        if "@" not in pg_url
        else pg_url.replace("@", ":Sup3rS3cret@", 1)
    )
    done = subprocess.run(
        [sys.executable, "-m", "llmledger", "copy", str(store), secret], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "copied" in done.stdout and "Sup3rS3cret" not in done.stdout + done.stderr
    again = subprocess.run(
        [sys.executable, "-m", "llmledger", "copy", str(store), secret], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 2 and "already holds a ledger" in again.stderr
    assert "Sup3rS3cret" not in again.stdout + again.stderr


def test_a_quiet_run_says_nothing_while_it_waits_for_the_store(store: Path, run: Any, sim: Simulator) -> None:
    """Another process takes the DuckDB file mid-run for two seconds: the run waits for it, silently."""
    run(frame(3), "s", prompt="A: {text}")
    sim.configure(latency=0.2)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import duckdb, time
time.sleep(0.8)
while True:
    try:
        con = duckdb.connect({str(store)!r})
        break
    except duckdb.Error:
        time.sleep(0.01)
print('held', flush=True)
time.sleep(2.5)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            run(frame(40), "s", prompt="A: {text}", concurrency=2, commit_every=0.1)
        assert holder.stdout is not None and holder.stdout.read().strip() == "held", "the file was held mid-run"
        assert "waiting for" not in err.getvalue()
    finally:
        holder.wait(timeout=30)


def test_postgresql_in_crash_recovery_is_waited_for_not_taken_as_a_refusal() -> None:
    for message in (
        "connection failed: FATAL:  the database system is not yet accepting connections\n"
        "DETAIL:  Consistent recovery state has not been yet reached.",
        "connection failed: FATAL:  the database system is in recovery mode",
        "connection failed: FATAL:  the database system is starting up",
    ):
        assert _refused_for_good(message) is None, message
    assert _refused_for_good('FATAL:  database "nope" does not exist') == 'database "nope" does not exist'


def test_a_run_waits_through_a_postgresql_crash_and_its_recovery(pg_server: Any, sim: Simulator) -> None:
    """A server killed (`pg_ctl stop -m immediate`) mid-run, then started: the run waits and finishes; nothing is
    paid twice. The test server runs with synchronous_commit=off (speed), which forgets the last commits a crash
    catches; this database keeps PostgreSQL's default, under which a commit acknowledged is a commit kept."""
    import psycopg

    url = pg_server.new_database()
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET synchronous_commit = on')
    sim.configure(latency=0.05)
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
    run = llmledger.apply_llm(
        frame(60),
        "s",
        prompt="A: {text}",
        store=url,
        table="t",
        client=client,
        progress=False,
        concurrency=4,
        background=True,
    )
    time.sleep(0.8)
    pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "immediate", "-w", "stop")
    time.sleep(1.0)
    pg_server.start()
    run.wait(timeout=240)
    out = llmledger.sql(url, "SELECT s_status, count(*) AS n FROM t GROUP BY 1")
    assert out.rows() == [("DONE", 60)]
    assert max(sim.paid_prompts().values()) == 1


# -- values no call should take ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": 10**12}, r"max_tokens=1,000,000,000,000 is more"),
        ({"concurrency": 10**6}, r"concurrency=1,000,000 is more"),
    ],
)
def test_absurd_options_are_refused_before_anything_is_written(
    options: dict[str, Any], message: str, store: Path, run: Any, sim: Simulator
) -> None:
    with pytest.raises(llmledger.InvalidInputError, match=message):
        run(frame(3), "s", prompt="A: {text}", **options)
    assert not store.exists() and sim.stats()["requests"] == 0


def test_a_nul_character_is_refused_on_postgresql_before_anything_is_written(
    pg_url: str, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    df = frame(3).with_columns(pl.Series("text", ["fine", "a\x00b", "fine too"]))
    with pytest.raises(llmledger.InvalidInputError, match=r"column 'text' holds a NUL character .* 1 row"):
        apply_llm(df, "s", prompt="A: {text}", store=pg_url, table="t", client=client, progress=False)
    assert llmledger._ledger.open_ledger(pg_url).steps() == [] and sim.stats()["requests"] == 0


@pytest.mark.parametrize("key", ["id", "p", "up"])
def test_columns_named_like_the_ledgers_own_sql_never_stand_in_for_a_prompt(
    key: str, target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    """A frame column `p` was sent, paid and kept DONE instead of every row's prompt: the ledger's SQL named the
    rendered prompt `p` in a SELECT beside the frame's columns. Such names are now the ledger's own."""
    df = pl.DataFrame(
        {
            key: [1, 2] if key != "p" else ["a", "b"],
            "text": ["great", "awful"],
            **{c: ["x", "y"] for c in ("p", "fp", "up", "prompt", "legacy") if c != key},
        }
    )
    apply_llm(df, "s", prompt="Classify: {text}", key=key, store=target, table="t", client=client, progress=False)
    apply_llm(df, "t", prompt="Again ({s}): {text}", key=key, store=target, table="t", client=client, progress=False)
    sent = sorted(entry["prompt"] for entry in sim.log())
    assert sent == sorted(
        [
            "Classify: great",
            "Classify: awful",
            f"Again ({default_reply('Classify: great')}): great",
            f"Again ({default_reply('Classify: awful')}): awful",
        ]
    )
    with pytest.raises(llmledger.InvalidInputError, match="starts with 'llmledger_'"):
        apply_llm(
            df.with_columns(llmledger_p=pl.lit(1)),
            "s",
            prompt="{text}",
            key=key,
            store=target,
            table="t",
            client=client,
            progress=False,
        )


@pytest.mark.parametrize("key", ["status", "output", "fingerprint", "version", "custom_id", "batch_id", "prompt"])
def test_a_key_named_like_the_ledgers_bookkeeping_is_refused_before_anything_is_written(
    key: str, run: Any, store: Path, sim: Simulator
) -> None:
    """Keys named like the columns claims and commits carry beside the key failed with raw DuckDB errors midway
    (status: 'Could not convert string DONE to INT64'), or lost the answers of a batch."""
    df = pl.DataFrame({key: [1, 2], "text": ["great", "awful"]})
    with pytest.raises(llmledger.KeyColumnError, match=f"key column '{key}' has a name the ledger gives"):
        run(df, "s", prompt="{text}", key=key)
    assert not store.exists() and sim.stats()["requests"] == 0


@pytest.mark.parametrize("name", ["", " "])
def test_a_column_without_a_name_is_refused_before_anything_is_written(name: str, run: Any, store: Path) -> None:
    df = pl.DataFrame({"id": [1], "text": ["a"], name: ["unused"]})
    with pytest.raises(llmledger.InvalidInputError, match="which the store cannot name"):
        run(df, "s", prompt="{text}")
    assert not store.exists()
