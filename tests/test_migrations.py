"""A ledger written by an older llmledger opens, upgrades in place, and loses nothing.

`data/ledger-0.1.0.duckdb.gz` was written by llmledger 0.1.0 (the release before schema migrations)
with `data/make_ledger_0_1_0.py`: table `messages`, 12 rows; step `summary` (system "Be brief.",
max_tokens 50, max_attempts 2): rows 0-9 answered, row 3 NEEDS_REVIEW after two 400s, row 5 redone
once (its first answer in the history), rows 10-11 recorded only; step `title`: rows 0-3 sent, row 3
FAILED.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import duckdb
import pytest

import llmledger
from llmledger import Simulator, StoreError, apply_llm, last_report
from llmledger._ledger.schema import LATEST, MIGRATIONS, MIGRATIONS_TABLE
from llmledger.simulator import default_reply

from .conftest import frame, real_api_client, sql

OLD_STORE = Path(__file__).parent / "data" / "ledger-0.1.0.duckdb.gz"
STORE_0_2_0 = Path(__file__).parent / "data" / "ledger-0.2.0.duckdb.gz"
# The default model when these stores were written (0.1 to 0.9): a call that wants their answers current names it,
# as the upgrade guide says (the default is claude-haiku-5-5 since 0.10).
OLD_DEFAULT = "claude-haiku-4-5"
SUMMARY = {
    "prompt": "Summarize: {text}",
    "system": "Be brief.",
    "max_tokens": 50,
    "max_attempts": 2,
    "model": OLD_DEFAULT,
}


def _unpack(packed: Path, path: Path) -> Path:
    with gzip.open(packed) as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    return _unpack(OLD_STORE, tmp_path / "old.duckdb")


def _snapshot(store: Path) -> dict[str, list[tuple]]:
    return {
        "summary": sql(
            store,
            "SELECT id, summary, summary_status, summary_attempts, summary_error IS NOT NULL, "
            "summary_input_tokens, summary_output_tokens, summary_cost_usd, summary_finished_at "
            "FROM messages ORDER BY id",
        ),
        "title": sql(store, "SELECT id, title, title_status, title_attempts FROM messages ORDER BY id"),
        "history": sql(store, "SELECT table_name, step, row_key, output, replaced_at FROM llmledger_history"),
        "runs": sql(store, "SELECT run_id, outcome, calls FROM llmledger_runs ORDER BY started_at"),
    }


def test_an_old_store_upgrades_and_pays_only_for_what_it_never_had(old_store: Path, client, sim: Simulator) -> None:
    before = _snapshot(old_store)
    assert [r[2] for r in before["summary"]] == ["DONE"] * 3 + ["NEEDS_REVIEW"] + ["DONE"] * 6 + ["NOT_STARTED"] * 2

    out = apply_llm(frame(12), "summary", store=old_store, table="messages", client=client, progress=False, **SUMMARY)
    report = last_report()
    assert report is not None and (report.calls, report.stale) == (2, 0), (
        "answers from 0.1.0 are current (same request), so only the two unanswered rows are paid"
    )
    assert sorted(sim.paid_prompts()) == ["Summarize: hello message number 10", "Summarize: hello message number 11"]
    assert out["summary_status"].to_list() == ["DONE"] * 3 + ["NEEDS_REVIEW"] + ["DONE"] * 8

    after = _snapshot(old_store)
    assert after["summary"][:10] == before["summary"][:10], "statuses, outputs, tokens and cost kept as they were"
    assert after["title"] == before["title"]
    assert after["history"] == before["history"], "the history of replaced answers is kept"
    assert after["runs"][: len(before["runs"])] == before["runs"]
    assert sql(old_store, "SELECT version, llmledger FROM llmledger_migrations ORDER BY version") == [
        (1, "0.1.0"),
        *((m.version, llmledger.__version__) for m in MIGRATIONS[1:]),
    ]
    assert sql(
        old_store,
        "SELECT count(*) FROM messages WHERE summary_status = 'DONE' "
        "AND summary_fingerprint IS DISTINCT FROM summary_request_fingerprint",
    ) == [(0,)]

    apply_llm(frame(12), "summary", store=old_store, table="messages", client=client, progress=False, **SUMMARY)
    assert sim.stats()["paid"] == 2, "and a rerun pays nothing"


def test_old_answers_under_another_request_are_reported_stale(old_store: Path, client, sim: Simulator) -> None:
    apply_llm(
        frame(12),
        "summary",
        store=old_store,
        table="messages",
        client=client,
        progress=False,
        **{**SUMMARY, "system": "Be very brief."},
    )
    assert last_report().stale == 9  # type: ignore[union-attr]
    assert sim.stats()["paid"] == 2


def test_readers_upgrade_an_old_store_and_read_it_in_one_look(old_store: Path) -> None:
    """`history` and the review view's look at a row read a current store in one transaction; an old one is
    upgraded first (which writes), then read: row 5's first answer is in its history, as 0.1.0 wrote it."""
    from llmledger._view.review_queue import load_row, shape_of

    replaced = llmledger.history(old_store, "messages", "summary", key=5)
    assert replaced.height == 1 and replaced["old_output"][0] is not None
    assert sql(old_store, f"SELECT max(version) FROM {MIGRATIONS_TABLE}") == [(LATEST,)]
    row = load_row(shape_of(old_store, "messages", "summary", ()), 5)
    assert row is not None and row.status == "DONE" and row.answer is not None
    assert [e["answer"] for e in row.earlier] == replaced["old_output"].to_list()


def test_an_old_store_is_reviewed_as_it_stands_once_upgraded(old_store: Path) -> None:
    """Found in an attack: `review` read the queue before upgrading, and failed on a verdict column 0.1.0 lacks."""
    view = llmledger.review(old_store, "messages", "summary", by="ana")
    assert view.session.keys[0] == 3, "row 3, NEEDS_REVIEW, first"
    assert sql(old_store, f"SELECT max(version) FROM {MIGRATIONS_TABLE}") == [(LATEST,)]
    view.typed("ja")  # past row 3 (no answer to accept), then row 0 accepted
    assert llmledger.verdicts(old_store, "messages", "summary").select("row_key", "verdict").rows() == [
        ('{"id":0}', "accept")
    ]


def test_the_second_step_of_an_old_store_upgrades_too(old_store: Path, client, sim: Simulator) -> None:
    out = apply_llm(
        frame(12),
        "title",
        prompt="Title for: {text}",
        model=OLD_DEFAULT,
        store=old_store,
        table="messages",
        client=client,
        progress=False,
    )
    assert last_report().stale == 0  # type: ignore[union-attr]
    assert sim.stats()["paid"] == 9, "rows 0-2 were answered by 0.1.0; row 3 (FAILED) and 4-11 are sent"
    assert out["title"].to_list() == [default_reply(f"Title for: hello message number {i}") for i in range(12)]


def test_resume_needs_apply_llm_to_record_an_old_steps_requests_first(old_store: Path, client) -> None:
    before = _snapshot(old_store)
    with pytest.raises(llmledger.InvalidInputError, match="Run apply_llm once"):
        llmledger.resume(old_store, "messages", "summary", client=client)
    assert _snapshot(old_store) == before, "a refused call writes nothing, not even the upgrade"


def test_a_store_from_a_newer_llmledger_is_refused_untouched(old_store: Path, client) -> None:
    with duckdb.connect(str(old_store)) as con:
        con.execute(
            "CREATE TABLE llmledger_migrations (version INTEGER, name VARCHAR, applied_at TIMESTAMP, llmledger VARCHAR)"
        )
        con.execute("INSERT INTO llmledger_migrations VALUES (99, 'from the future', now(), '9.0')")
    before = _snapshot(old_store)
    with pytest.raises(StoreError, match=r"newer llmledger.*schema 99"):
        apply_llm(frame(12), "summary", store=old_store, table="messages", client=client, progress=False, **SUMMARY)
    assert _snapshot(old_store) == before


def test_a_0_2_0_store_upgrades_and_its_crashed_claim_goes_back_to_what_it_was(
    tmp_path: Path, client, sim: Simulator
) -> None:
    """`data/ledger-0.2.0.duckdb.gz` (schema 2, see make_ledger_0_2_0.py): rows 0-5 sent with stop_sequences
    ["END"], row 2 FAILED once, row 4 left RUNNING by a run that died on another machine; rows 6-7 unsent."""
    store = _unpack(STORE_0_2_0, tmp_path / "v2.duckdb")
    answered = "SELECT id, summary, summary_cost_usd FROM messages WHERE id IN (0, 1, 3, 4, 5) ORDER BY id"
    before = sql(store, answered)
    out = apply_llm(
        frame(8),
        "summary",
        prompt="Summarize: {text}",
        request_options={"stop_sequences": ["END"]},
        store=store,
        table="messages",
        client=client,
        progress=False,
        stale_after=60,
    )
    assert sorted(sim.paid_prompts()) == [f"Summarize: hello message number {i}" for i in (2, 6, 7)], (
        "the lost claim of row 4 goes back to DONE (its answer is kept), not to FAILED or NOT_STARTED"
    )
    assert out["summary_status"].to_list() == ["DONE"] * 8
    assert sql(store, answered) == before
    assert sql(store, "SELECT max(version) FROM llmledger_migrations") == [(LATEST,)]


def test_old_answers_have_no_source_and_count_as_real(old_store: Path, sim: Simulator) -> None:
    """Migration 6 adds `{step}_source` (and the history's `source`): answers written before it are NULL there,
    and count as real: a run against a real endpoint neither asks them again nor refuses to reuse them."""
    real = real_api_client(sim)
    apply_llm(frame(12), "summary", store=old_store, table="messages", client=real, progress=False, **SUMMARY)
    report = last_report()
    assert report is not None and (report.calls, report.unsimulated) == (2, 0)
    assert sql(old_store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE' AND summary_source IS NULL") == [
        (9,)
    ]
    assert sql(old_store, "SELECT id, summary_source FROM messages WHERE id >= 10 ORDER BY id") == [
        (10, "https://api.anthropic.com"),
        (11, "https://api.anthropic.com"),
    ]
    assert sql(old_store, "SELECT count(*), count(source) FROM llmledger_history") == [(1, 0)]
    assert sql(old_store, "SELECT count(*) FROM messages WHERE title_source IS NOT NULL") == [(0,)], (
        "every step of every table gets the column"
    )
    apply_llm(frame(12), "summary", store=old_store, table="copy", client=real, progress=False, **SUMMARY)
    assert last_report().reused == 11, "old answers (9) and the 2 new ones serve identical requests of a real run"  # type: ignore[union-attr]


@pytest.mark.parametrize(("version", "column"), [(11, "summary_latency_ms"), (12, "summary_verdict")])
def test_an_upgrade_that_would_take_over_a_column_of_the_same_name_is_refused(
    tmp_path: Path, client, sim: Simulator, version: int, column: str
) -> None:
    """A store from before migration `version` whose table already has a column of the name that migration gives a
    step's new column (an input, `summary_latency_ms`): the migration would take it for the step's and write over
    the user's values. It is refused, and the store stays as it was, byte for byte."""
    store = tmp_path / "old.duckdb"
    apply_llm(
        frame(3), "summary", prompt="Summarize: {text}", store=store, table="messages", client=client, progress=False
    )
    with duckdb.connect(str(store)) as con:  # back to the schema before `version`, an input named like its column
        for suffix, since in (("_latency_ms", 11), ("_verdict", 12), ("_verdict_by", 12)):
            if since >= version:
                con.execute(f'ALTER TABLE messages DROP COLUMN "summary{suffix}"')
        if version <= 12:
            con.execute("DROP TABLE llmledger_verdicts")
        con.execute(f'ALTER TABLE messages ADD COLUMN "{column}" BIGINT DEFAULT 333')
        con.execute("DELETE FROM llmledger_migrations WHERE version >= ?", [version])
    before = store.read_bytes()
    with pytest.raises(StoreError, match=rf"messages\.{column}.*already has a column of that name"):
        apply_llm(
            frame(3),
            "summary",
            prompt="Summarize: {text}",
            store=store,
            table="messages",
            client=client,
            progress=False,
        )
    assert store.read_bytes() == before
