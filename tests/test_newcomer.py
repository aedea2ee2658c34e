"""What a newcomer trips on (issue 18): calls that can only fail are refused up front with the fix, a request the API
refuses for its shape stops the run once instead of failing every row, and what the notebook shows reads as text."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
import typing
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pydantic
import pytest

import llmledger
from llmledger import InvalidInputError, KeyColumnError, PromptError, RequestRefused, Simulator
from llmledger._report import RunReport, run_html

from .conftest import frame, hold_store, sql


class Tagged(pydantic.BaseModel):
    label: str
    tags: list  # type: ignore[type-arg]


# -- refused up front, with the fix --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("output", "message"),
    [
        ({"tags": list}, r"'tags' is a list of anything.*list\[str\]"),
        ({"tags": set}, r"'tags' is a list of anything"),
        ({"tags": tuple}, r"'tags' is a list of anything"),
        ({"pair": tuple[int, str]}, r"'pair' is a tuple.*named fields"),
        ({"x": typing.Any}, r"'x' may hold anything \(Any or object\)"),
        ({"x": object}, r"'x' may hold anything"),
        ({"x": list[typing.Any]}, r"'x' is a list of anything"),
        ({"spam": pl.Boolean}, r"'spam' is the polars type Boolean.*Use bool"),
        ({"n": pl.Int32}, r"polars type Int32.*Use int"),
        (Tagged, r"'tags' is a list of anything"),
    ],
)
def test_an_output_the_api_would_refuse_for_every_row_is_refused_up_front(
    run: Any, sim: Simulator, store: Path, output: Any, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message) as caught:
        run(frame(3), "labels", prompt="Label: {text}", output=output)
    assert "arbitrary_types_allowed" not in str(caught.value), "no pydantic advice leaks through"
    assert not store.exists() and sim.stats()["requests"] == 0


def test_literal_json_in_a_template_gets_the_doubled_braces_hint(run: Any, store: Path) -> None:
    with pytest.raises(PromptError, match=r"""write its braces doubled.*'Answer \{\{"spam": true\}\} for \{text\}'"""):
        run(frame(2), "s", prompt='Answer {"spam": true} for {text}')
    assert not store.exists()


def test_a_key_that_is_the_pandas_index_says_reset_index(run: Any, store: Path) -> None:
    df = pd.DataFrame({"text": ["a", "b"]}, index=pd.Index([5, 6], name="id"))
    for key in ("id", None):
        with pytest.raises(KeyColumnError, match=r"'id' is the pandas frame's index.*df\.reset_index\(\)"):
            run(df, "s", prompt="{text}", key=key)
    assert not store.exists()


@pytest.mark.parametrize("options", [{"temperature": 1.7}, {"top_p": -0.1}, {"top_k": -1}, {"temperature": "hot"}])
def test_sampling_options_out_of_the_apis_range_are_refused_up_front(
    run: Any, sim: Simulator, store: Path, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInputError, match=f"request_options\\['{next(iter(options))}'\\] must be a number"):
        run(frame(2), "s", prompt="{text}", request_options=options)
    assert not store.exists() and sim.stats()["requests"] == 0


# -- a request refused for its shape stops the run once ------------------------------------------------------------
def test_a_request_the_api_refuses_for_its_shape_stops_the_run_with_one_error(
    run: Any, sim: Simulator, store: Path
) -> None:
    """Every row would get the same 400 (here an empty stop sequence, which only the API checks): the run stops
    after eight distinct requests were refused alike, with one error saying the call is at fault; the rows it
    did not send stay NOT_STARTED and the eight refused are FAILED with it. (0.7 failed all 40 with "run the same
    call again"; a trial found "refused the first 17" beside 16 FAILED, and "run the same call again" beside "fix
    the call": one count now, and what to change, never to retry a 400 that will repeat.)"""
    with pytest.raises(RequestRefused, match=r"refused the first 8 distinct requests alike.*stop_sequences") as err:
        run(frame(40), "s", prompt="{text}", request_options={"stop_sequences": [""]}, concurrency=1)
    statuses = dict(sql(store, "SELECT s_status, count(*) FROM messages GROUP BY ALL"))
    assert statuses == {"FAILED": 8, "NOT_STARTED": 32}, statuses
    said = str(err.value) + " ".join(err.value.report.hints())
    assert "run the same call again to retry" not in said and "change" in said
    assert sim.stats()["requests"] == 8
    fixed = run(frame(40), "s", prompt="{text}", request_options={"stop_sequences": ["END"]})
    assert fixed["s_status"].to_list() == ["DONE"] * 40, "once the call is fixed, every row is sent"


def test_a_row_the_api_refuses_for_its_own_reason_fails_alone(run: Any, sim: Simulator, store: Path) -> None:
    """Refusals that differ from row to row, or come after an answer, are the rows' own: no stop."""
    sim.configure(poison="POISON")
    df = pl.DataFrame({"id": range(6), "text": ["fine", "POISON 1", "POISON 2", "POISON 3", "POISON 4", "fine 2"]})
    out = run(df, "s", prompt="{text}", concurrency=1)
    assert out["s_status"].to_list() == ["DONE", "FAILED", "FAILED", "FAILED", "FAILED", "DONE"]


def test_bad_rows_at_the_head_of_a_frame_fail_alone_even_when_refused_first(run: Any, sim: Simulator) -> None:
    """The demo's case: the first rows are refused alike and faster than the rest are answered, all in flight
    at once; they fail alone and the run goes on (a threshold of three stopped the demo)."""
    sim.configure(poison="POISON", latency=0.05)
    texts = [f"POISON {i}" for i in range(10)] + [f"fine {i}" for i in range(30)]  # more than 8, fewer than a wave
    out = run(pl.DataFrame({"id": range(40), "text": texts}), "s", prompt="{text}", concurrency=16)
    assert out["s_status"].to_list() == ["FAILED"] * 10 + ["DONE"] * 30


# -- what the notebook shows ---------------------------------------------------------------------------------------
def test_views_are_left_alone_by_mathjax() -> None:
    """Two `$` in one view made JupyterLab typeset costs as math: the view's box carries the classes MathJax
    skips (the browser test reads the rendered text)."""
    report = RunReport(table="t", step="s")
    report.cost_usd, report.done_saved_usd, report.selected = 0.0003, 0.0003, 1
    html = run_html(report, live=False)
    assert "tex2jax_ignore" in html and "mathjax_ignore" in html


# -- stale answers are visible, and counted once, the same everywhere ----------------------------------------------
def test_the_returned_frame_marks_stale_answers_and_a_quiet_run_warns(run: Any, store: Path) -> None:
    """After an input changed, the old answers came back as plain DONE and, with progress=False, nothing was said.
    Now `{step}_stale` says which, and a quiet run warns with the count (polars and pandas alike)."""
    run(frame(6), "s", prompt="Summarise: {text}")
    edited = frame(6).with_columns(
        pl.when(pl.col("id") < 2).then(pl.lit("edited")).otherwise(pl.col("text")).alias("text")
    )
    with pytest.warns(llmledger.StaleAnswersWarning, match=r"^2 DONE rows are stale.*redo='stale'") as caught:
        out = run(edited, "s", prompt="Summarise: {text}")
    assert caught[0].filename == __file__, "the warning names the user's line, not llmledger's"
    assert out["s_status"].to_list() == ["DONE"] * 6
    assert out["s_stale"].to_list() == [True, True, False, False, False, False]
    with pytest.warns(llmledger.StaleAnswersWarning, match=r"^2 DONE rows are stale"):
        back = run(edited.to_pandas(), "s", prompt="Summarise: {text}")
    assert back["s_stale"].tolist() == [True, True, False, False, False, False]
    fresh = run(edited, "s", prompt="Summarise: {text}", redo="stale")
    assert not fresh["s_stale"].any()


def test_one_count_of_stale_rows_after_a_flagged_redo_everywhere(run: Any, store: Path) -> None:
    """0.7: after redo='flagged' the summary said 20 stale (counted before the run) while progress() said 15, and
    progress() counted stale rows among DONE where show() and `llmledger status` did not. Now every view counts
    each row once, in the same states, after the run."""
    run(frame(20), "s", prompt="Summarise: {text}")
    llmledger.flag(store, "messages", "s", where="id < 5", reason="too long")
    assert llmledger.progress(store)["flagged"].to_list() == [5]
    with pytest.warns(llmledger.StaleAnswersWarning, match=r"^15 DONE rows are stale"):
        out = run(frame(20), "s", prompt="Summarise briefly: {text}", redo="flagged")
    assert out["s_stale"].sum() == 15
    report = llmledger.last_report()
    assert report is not None and report.stale == 15 and report.calls == 5
    counts = llmledger.progress(store).row(0, named=True)
    assert (counts["DONE"], counts["stale"], counts["flagged"]) == (5, 15, 0)
    states = ("NOT_STARTED", "RUNNING", "SUBMITTED", "DONE", "FAILED", "NEEDS_REVIEW", "stale", "waiting")
    assert sum(counts[s] for s in states) == counts["total"] == 20, "every row counted once"
    text = llmledger.show(store).__repr__()
    assert "DONE 5" in text and "stale 15" in text


def test_flags_show_in_progress_status_and_show(run: Any, store: Path) -> None:
    run(frame(4), "s", prompt="{text}")
    llmledger.flag(store, "messages", "s", where="id = 1", reason="wrong")
    assert llmledger.progress(store)["flagged"].to_list() == [1]
    assert "1 row flagged by a person; redo='flagged' re-sends them" in llmledger.show(store).__repr__()
    assert "data-field='flagged'" in llmledger.show(store)._repr_html_()


def test_running_rows_are_called_claimed_where_they_are_shown() -> None:
    from llmledger._draw import legend_text, parts

    assert "RUNNING (claimed) 175" in legend_text(parts({"RUNNING": 175, "DONE": 3}))


# -- conventions users bring ---------------------------------------------------------------------------------------
def test_sql_reads_unless_told_to_write(run: Any, target: Any) -> None:
    """`llmledger.sql(store, "DELETE ...")` deleted rows: reading is the default on both engines."""
    run(frame(3), "s", prompt="{text}", store=target)
    sneaky = [
        "DELETE FROM messages WHERE id = 1",
        "COMMIT; DELETE FROM messages WHERE id = 1",
        "SELECT 1; DELETE FROM messages WHERE id = 1",
    ]
    if str(target).startswith("postgresql://"):  # out of the read-only transaction, then a write
        sneaky += [
            "SET TRANSACTION READ WRITE; DELETE FROM messages WHERE id = 1",
            "ROLLBACK; DELETE FROM messages WHERE id = 1",
        ]
    for statement in sneaky:
        with pytest.raises(InvalidInputError, match=r"writes .*write=True"):
            llmledger.sql(target, statement)
    assert llmledger.sql(target, "SELECT count(*) AS n FROM messages")["n"].item() == 3  # type: ignore[index]
    llmledger.sql(target, "DELETE FROM messages WHERE id = 1", write=True)
    assert llmledger.sql(target, "SELECT count(*) AS n FROM messages")["n"].item() == 2  # type: ignore[index]


def test_export_replaces_only_when_told_and_never_a_folder_it_did_not_write(
    run: Any, store: Path, tmp_path: Path
) -> None:
    """0.7 refused an existing export folder with no way to replace it, while export(step=) silently overwrote
    its file. One rule now: replace with overwrite=True; a folder of other things is never emptied."""
    run(frame(3), "s", prompt="{text}")
    folder, view = tmp_path / "archive", tmp_path / "s.parquet"
    llmledger.export(store, "messages", folder)
    llmledger.export(store, "messages", view, step="s")
    for target, options in ((folder, {}), (view, {"step": "s"})):
        with pytest.raises(InvalidInputError, match="overwrite=True"):
            llmledger.export(store, "messages", target, **options)
    run(frame(4), "s", prompt="{text}")
    llmledger.export(store, "messages", folder, overwrite=True)
    llmledger.export(store, "messages", view, step="s", overwrite=True)
    assert pl.read_parquet(folder / "messages.parquet").height == 4 and pl.read_parquet(view).height == 4
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidInputError, match="never emptied"):
        llmledger.export(store, "messages", mine, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_null_template_fields_are_counted_and_skipped_in_one_word(run: Any, sim: Simulator) -> None:
    """Nulls rendered as empty text and were paid for, silently. The run counts them; skip_nulls=True skips them."""
    df = pl.DataFrame({"id": range(5), "text": ["a", None, "c", None, "e"], "lang": ["en", "fr", None, "de", "it"]})
    out = run(df, "s", prompt="{text} ({lang})", skip_nulls=True)
    assert out["s_status"].to_list() == ["DONE", "NOT_STARTED", "NOT_STARTED", "NOT_STARTED", "DONE"]
    report = llmledger.last_report()
    assert report is not None and report.null_rows == 3 and report.calls == 2
    assert "3 rows of the frame have a null in {text}, {lang}: left unsent" in "\n".join(report.hints())
    # the step remembers: finishing it from the store alone (resume, `llmledger run`, workers) skips them too
    resumed = llmledger.resume(run.keywords["store"], "messages", "s", client=run.keywords["client"], progress=False)
    assert resumed.calls == 0 and sim.stats()["paid"] == 2
    assert (
        llmledger.sql(run.keywords["store"], "SELECT count(*) AS n FROM messages WHERE s_status = 'NOT_STARTED'")["n"][
            0
        ]
        == 3
    )
    run(df, "s", prompt="{text} ({lang})")
    report = llmledger.last_report()
    assert report is not None and report.calls == 3 and "Pass skip_nulls=True" in "\n".join(report.hints())
    assert sim.stats()["paid"] == 5


def test_a_run_blocked_by_another_process_says_at_once_who_holds_the_store(
    run: Any, store: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """0.7 waited silently at 0 %, then showed DuckDB's own "you could open it read-only". Now the run says, within
    about a second, which process holds the file and what to do, and goes on once it lets go."""
    run(frame(2), "s", prompt="{text}")
    holder = hold_store(store, 3, read_only=True)
    started = time.monotonic()
    out = run(frame(4), "s", prompt="{text}", progress=True)
    holder.wait()
    assert out["s_status"].to_list() == ["DONE"] * 4 and time.monotonic() - started > 1
    said = capfd.readouterr().err
    assert f"held by process {holder.pid} (" in said and "import duckdb" in said, said
    assert "close that connection" in said and "read-only mode" not in said


def test_a_read_only_connection_in_the_same_kernel_gets_a_clear_error_and_readers_still_work(
    run: Any, store: Path
) -> None:
    """0.7: DuckDB's raw ConnectionException from apply_llm; sql and show work beside the user's connection."""
    import duckdb

    run(frame(2), "s", prompt="{text}")
    con = duckdb.connect(str(store), read_only=True)
    try:
        assert llmledger.sql(store, "SELECT count(*) AS n FROM messages")["n"].item() == 2  # type: ignore[index]
        assert "messages" in repr(llmledger.show(store))
        with pytest.raises(llmledger.StoreError, match=r"open read-only.*con\.close\(\)"):
            run(frame(3), "s", prompt="{text}")
    finally:
        con.close()
    assert run(frame(3), "s", prompt="{text}")["s_status"].to_list() == ["DONE"] * 3


class Constrained(pydantic.BaseModel):
    score: float = pydantic.Field(ge=0, le=1)
    stars: int = pydantic.Field(ge=1, le=5)
    step: int = pydantic.Field(ge=0, le=100, multiple_of=25)
    half: float = pydantic.Field(gt=0, lt=10, multiple_of=0.5)
    code: str = pydantic.Field(min_length=4, max_length=6)
    tags: list[str] = pydantic.Field(min_length=2, max_length=3)
    when: datetime.date
    ref: uuid.UUID
    sku: str = pydantic.Field(pattern=r"^[A-Z]{3}-\d{4}$")
    currency: str = pydantic.Field(pattern=r"^(EUR|USD|GBP)$")


def test_simulated_typed_answers_honour_every_constraint_the_schema_states(run: Any, sim: Simulator) -> None:
    """The simulator ignored Field(ge=0, le=1) and date/UUID formats, so every typed row failed validation, was
    paid twice and ended NEEDS_REVIEW. Now its answers keep to what the schema states, as a model does."""
    out = run(frame(12), "s", prompt="Rate: {text}", output=Constrained)
    assert out["s_status"].to_list() == ["DONE"] * 12
    assert sim.stats()["paid"] == 12, "no row needed its follow-up"
    scores = out["s"].struct.field("score").to_list()
    assert all(0 <= v <= 1 for v in scores) and len(set(scores)) > 1
    assert all(1 <= v <= 5 for v in out["s"].struct.field("stars").to_list())
    assert all(v % 25 == 0 for v in out["s"].struct.field("step").to_list())
    assert all(0 < v < 10 and (v * 2).is_integer() for v in out["s"].struct.field("half").to_list())
    assert all(4 <= len(v) <= 6 for v in out["s"].struct.field("code").to_list())
    assert all(2 <= len(v) <= 3 for v in out["s"].struct.field("tags").to_list())
    assert all(re.fullmatch(r"[A-Z]{3}-\d{4}", v) for v in out["s"].struct.field("sku").to_list())
    assert set(out["s"].struct.field("currency").to_list()) <= {"EUR", "USD", "GBP"}


def test_the_default_table_refuses_another_dataset_that_would_rewrite_answered_rows(
    client: Any, store: Path, sim: Simulator
) -> None:
    """Reviews, then SMS, both without table=: the SMS rewrote the shared `text` of every answered review and made
    them stale, silently. On the default table that is refused, with the count, before anything is written."""
    import functools

    from llmledger import apply_llm

    run = functools.partial(apply_llm, client=client, store=store, progress=False)
    run(frame(5, word="review"), "sentiment", prompt="Sentiment: {text}")
    before = llmledger.sql(store, "SELECT * FROM ledger ORDER BY id")
    with pytest.raises(
        InvalidInputError,
        match=r"change the input columns of 5 rows of the default table 'ledger'"
        r".*table='sms'",
    ):
        run(frame(8, word="sms"), "sentiment", prompt="Sentiment: {text}")
    assert llmledger.sql(store, "SELECT * FROM ledger ORDER BY id").equals(before)  # type: ignore[union-attr]
    more = run(frame(8, word="review"), "sentiment", prompt="Sentiment: {text}")  # the same dataset, grown
    assert more["sentiment_status"].to_list() == ["DONE"] * 8
    with pytest.warns(llmledger.StaleAnswersWarning, match="^1 DONE row is stale"):
        edited = frame(8, word="review").with_columns(
            pl.when(pl.col("id") == 0).then(pl.lit("fixed typo")).otherwise(pl.col("text")).alias("text")
        )
        run(edited, "sentiment", prompt="Sentiment: {text}", table="ledger")  # named: on purpose


def test_a_structured_answer_has_its_declared_field_order_on_both_engines(run: Any, target: Any, client: Any) -> None:
    """PostgreSQL gave {reason, spam} where DuckDB gave {spam, reason}: the stored request's schema is canonical
    JSON (keys sorted); the fields go back in the order `required` keeps."""
    for _ in range(2):  # the first run (the live schema), then a rerun (the stored one)
        out = run(frame(2), "s", prompt="{text}", output={"spam": bool, "reason": str}, store=target)
        assert out["s"].dtype == pl.Struct({"spam": pl.Boolean, "reason": pl.String})
    resumed = llmledger.resume(target, "messages", "s", progress=False, client=client)
    assert resumed.calls == 0


def test_a_killed_run_shows_in_the_runs_table_and_status_says_its_process_is_gone(sim: Simulator, store: Path) -> None:
    """A kill -9 left no row in llmledger_runs (paid calls went uncounted) and `status` showed the dead process as
    still holding its rows. A run's row is written as it starts; status says when a holder's process is gone."""
    from .conftest import HELPERS, subprocess_env

    sim.configure(latency=0.3)
    proc = subprocess.Popen(
        [sys.executable, str(HELPERS / "run_step.py"), str(store), "60", "--concurrency", "4", "--commit-every", "0.2"],
        env=subprocess_env(sim.base_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while sim.stats()["paid"] < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    runs = llmledger.sql(store, "SELECT outcome, finished_at, started_at FROM llmledger_runs")
    assert runs is not None and runs.rows()[0][:2] == ("running", None) and runs.rows()[0][2] is not None
    status = llmledger.show(store).__repr__()
    assert "its process is gone: the next run of the step takes them back" in status, status


def test_the_default_table_guard_sees_every_step_and_ignores_new_columns(client: Any, store: Path) -> None:
    """The guard looked at the current step only (SMS under a new step name went through and rewrote answered
    reviews), and took a frame that only gained an unrelated column for a rewrite."""
    import functools

    from llmledger import apply_llm

    run = functools.partial(apply_llm, client=client, store=store, progress=False)
    run(frame(5, word="review"), "sentiment", prompt="Sentiment: {text}")
    with pytest.raises(InvalidInputError, match="change the input columns of 5 rows"):
        run(frame(5, word="sms"), "spam", prompt="Spam? {text}")
    grown = frame(5, word="review").with_columns(pl.lit("web").alias("channel"))
    out = run(grown, "sentiment", prompt="Sentiment: {text}")
    assert out["sentiment_status"].to_list() == ["DONE"] * 5 and not out["sentiment_stale"].any()


def test_sql_reads_even_beside_this_processs_own_read_write_connection(run: Any, store: Path, tmp_path: Path) -> None:
    """With the user's own duckdb.connect(store) open, llmledger.sql read through it, and wrote; nor may a read
    write files (COPY ... TO, EXPORT DATABASE)."""
    import duckdb

    run(frame(3), "s", prompt="{text}")
    con = duckdb.connect(str(store))
    try:
        for statement in (
            "DELETE FROM messages",
            f"COPY messages TO '{tmp_path / 'x.csv'}'",
            f"EXPORT DATABASE '{tmp_path / 'dump'}'",
            "EXPLAIN ANALYZE UPDATE messages SET s = 'forged'",  # it runs what it explains
            f"explain analyze COPY messages TO '{tmp_path / 'x.csv'}'",
        ):
            with pytest.raises(InvalidInputError, match="write=True"):
                llmledger.sql(store, statement)
        assert llmledger.sql(store, "SELECT count(*) AS n FROM messages")["n"].item() == 3  # type: ignore[index]
        assert llmledger.sql(store, "EXPLAIN SELECT * FROM messages") is not None, "a plain EXPLAIN reads"
    finally:
        con.close()
    assert llmledger.sql(store, "SELECT count(*) AS n FROM messages WHERE s = 'forged'")["n"].item() == 0  # type: ignore[index]
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "dump").exists()


def test_skip_nulls_with_a_callable_prompt_is_refused_not_ignored(run: Any, store: Path) -> None:
    with pytest.raises(InvalidInputError, match="skip_nulls=True looks at the columns a template reads"):
        run(frame(2), "s", prompt=lambda row: f"Say {row['text']}", skip_nulls=True)
    assert not store.exists()


@pytest.mark.parametrize(
    "options",
    [
        {"system": "Be\x00brief."},
        {"prompt": "Say\x00 {text}"},
        {"request_options": {"metadata": {"user_id": "u\x00"}}},
        {"system": "\x00llmledger-prompt\x00"},
    ],
)
def test_a_nul_in_the_request_itself_is_refused_on_both_engines_writing_nothing(
    run: Any, target: Any, sim: Simulator, options: dict[str, Any]
) -> None:
    """A NUL in system=, the template or request_options gave psycopg's raw DataError on PostgreSQL (the prompt
    marker llmledger uses inside stored requests even a bare ValueError and an empty store file on DuckDB)."""
    call = {"prompt": "{text}", **options}
    with pytest.raises(InvalidInputError, match=r"holds a NUL character"):
        run(frame(2), "s", store=target, **call)
    assert sim.stats()["requests"] == 0
    if not str(target).startswith("postgresql://"):
        assert not Path(target).exists(), "no file left behind"
