"""The store interface's contract, verb by verb. Every backend must pass it; the `ledger` fixture is
parametrised by backend: an embedded DuckDB file, and a database on a real PostgreSQL server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from llmledger._ledger import Chunk, Ledger, RunParams, StepDefinition, open_ledger
from llmledger._ledger.batches import BatchChanged
from llmledger._ledger.columns import RESULT_SCHEMA
from llmledger._ledger.states import Redo
from llmledger._step.prompt import plan_prompt
from llmledger._step.request import RequestSpec
from llmledger._time import utcnow

FRAME = pl.DataFrame({"id": [1, 2, 3, 4], "text": ["a", "b", "c", "d"]})


@pytest.fixture(params=["duckdb", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "postgresql":
        return open_ledger(request.getfixturevalue("pg_url"))
    return open_ledger(tmp_path / "contract.duckdb")


def _definition(frame: pl.DataFrame = FRAME, prompt: str = "Say {text}", model: str = "m") -> StepDefinition:
    return StepDefinition(
        table="t",
        step="s",
        key=["id"],
        request=RequestSpec(model=model, max_tokens=5),
        prompt=plan_prompt(prompt, frame),
    )


def _params(**changes: object) -> RunParams:
    now = utcnow()
    base = {"max_attempts": 2, "redo": Redo.NONE, "run_started": now, "stale_before": now - timedelta(minutes=30)}
    return RunParams(**{**base, **changes})  # type: ignore[arg-type]


def _result(row: dict, status: str, output: str | None = None, error: str | None = None) -> dict:
    return {
        "id": row["id"],
        "status": status,
        "output": output,
        "attempts": int(row["attempts"]) + 1,
        "error": error,
        "input_tokens": 3 if output else None,
        "output_tokens": 1 if output else None,
        "cost_usd": 0.0 if output else None,
        "stop_reason": "end_turn" if output else None,
        "model": "m",
        "fingerprint": row["fingerprint"] if output else None,
        "finished_at": utcnow(),
    }


def _commit(ledger: Ledger, selection, rows: list[dict]) -> None:
    ledger.commit(selection, pl.from_dicts(rows, schema={"id": pl.Int64} | RESULT_SCHEMA), now=utcnow())


def _age(ledger: Ledger, claimant: str, *, hours: int) -> None:
    """Make `claimant`'s claims `hours` older: on PostgreSQL a claim takes its time from the database's clock, so a
    `now=` in the past no longer backdates it."""
    ledger.query(
        f"UPDATE t SET s_running_started_at = s_running_started_at - INTERVAL '{hours} hours', "
        f"s_lease_until = s_lease_until - INTERVAL '{hours} hours' WHERE s_claimed_by = '{claimant}'",
        write=True,
    )


def test_prepare_records_rows_and_their_requests_and_selects_them(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    assert selection.work["id"].to_list() == [1, 2, 3, 4]
    spec = selection.requests[selection.version]
    rows = ledger.claim(selection, 10, claimant="h/1/r", now=utcnow())
    assert [r["prompt"] for r in rows] == ["Say a", "Say b", "Say c", "Say d"]
    assert all(r["fingerprint"] == spec.fingerprint(r["prompt"]) for r in rows), "stored fingerprints are exact"
    assert ledger.claim(selection, 10, claimant="h/1/r", now=utcnow()) == [], "the selection is used up"
    assert ledger.counts("t").select("RUNNING", "total").row(0) == (4, 4)


def test_commit_writes_outputs_and_statuses_and_release_gives_the_rest_back(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 4, claimant="h/1/r", now=utcnow())
    _commit(ledger, selection, [_result(rows[0], "DONE", "A"), _result(rows[1], "FAILED", error="400 bad")])
    assert ledger.release(selection, claimant="h/1/r") == 2
    counts = ledger.counts("t").row(0, named=True)
    assert (counts["DONE"], counts["FAILED"], counts["NOT_STARTED"], counts["RUNNING"]) == (1, 1, 2, 0)
    assert [(e.example_key, e.example) for e in ledger.overview("t").steps[0].errors] == [('{"id":2}', "400 bad")]
    out = ledger.outputs(selection, FRAME.select("id").reverse())
    assert out.rows() == [
        (None, "NOT_STARTED", False, False, False),
        (None, "NOT_STARTED", False, False, False),
        (None, "FAILED", False, False, False),
        ("A", "DONE", False, False, False),
    ], "outputs come back in the frame's order (then: a person's answer, kept by every redo; flagged, yet kept)"


def test_a_chunk_is_written_again_only_while_its_claim_stands(ledger: Ledger) -> None:
    """A chunk not yet seen to land (`Chunk`, `again.write_again`) is written again only onto the claims that made
    it. Its commit landed, a person reset one of its rows and the same run claimed that row again: the claim looks
    first and lets the chunk go, so the next commit leaves the new claim alone. Found by a review: the old answer
    came back, the reset was undone and the claim ended with its request in flight."""
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 2, claimant="h/1/r", now=utcnow())
    results = pl.from_dicts(
        [_result(rows[0], "DONE", "A"), _result(rows[1], "DONE", "B")], schema={"id": pl.Int64} | RESULT_SCHEMA
    )
    unlanded = [Chunk(results), *ledger.commit(selection, results, now=utcnow())]
    assert ledger.reset("t", "s", where="id = 1", now=utcnow()) == 1
    again = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    claimed = ledger.claim(again, 1, claimant="h/1/r", now=utcnow(), again=unlanded)
    assert [r["id"] for r in claimed] == [1] and unlanded == [], "the chunk landed: it goes before the claim"
    other = ledger.claim(again, 1, claimant="h/1/r", now=utcnow(), again=unlanded)
    later = pl.from_dicts([_result(other[0], "DONE", "C")], schema={"id": pl.Int64} | RESULT_SCHEMA)
    assert ledger.commit(again, later, now=utcnow(), again=("h/1/r", unlanded)) == []
    rows = ledger.query("SELECT id, s, s_status, s_claimed_by FROM t ORDER BY id").rows()
    assert rows[0] == (1, None, "RUNNING", "h/1/r"), "the new claim stands, its request in flight"
    assert [r[1:3] for r in rows[1:]] == [("B", "DONE"), ("C", "DONE"), (None, "NOT_STARTED")]


def test_a_second_prepare_selects_only_what_still_needs_work(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 4, claimant="h/1/r", now=utcnow())
    _commit(
        ledger,
        selection,
        [_result(r, "DONE", r["prompt"].upper()) for r in rows[:3]] + [_result(rows[3], "FAILED", error="400")],
    )
    again = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    assert again.work["id"].to_list() == [4], "DONE rows are not selected; a FAILED row with attempts left is"
    assert again.stale == 0
    changed = ledger.prepare(_definition(model="m2"), FRAME, _params(), dedupe=True)
    assert changed.stale == 3 and changed.work["id"].to_list() == [4], "a new request makes DONE rows stale"
    stale = ledger.prepare(_definition(model="m2"), FRAME, _params(redo=Redo.STALE), dedupe=True)
    assert stale.work["id"].to_list() == [1, 2, 3, 4]


def test_identical_requests_are_known_answers(ledger: Ledger) -> None:
    frame = pl.DataFrame({"id": [1, 2], "text": ["same", "same"]})
    selection = ledger.prepare(_definition(frame), frame, _params(), dedupe=True)
    [first, second] = ledger.claim(selection, 2, claimant="h/1/r", now=utcnow())
    _commit(ledger, selection, [_result(first, "DONE", "answer")])
    ledger.release(selection, claimant="h/1/r")
    again = ledger.prepare(_definition(frame), frame, _params(), dedupe=True)
    assert again.work["id"].to_list() == [2]
    assert again.known[second["fingerprint"]].output == "answer"


def test_claims_of_a_dead_run_on_this_host_are_recovered_by_the_next_prepare(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    ledger.claim(selection, 4, claimant="localhost-that-is-not-us/1/r", now=utcnow() - timedelta(hours=2))
    _age(ledger, "localhost-that-is-not-us/1/r", hours=2)
    again = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    assert again.work.height == 4 and again.running_elsewhere == 0, "claims older than stale_after come back"


def test_resume_selects_from_the_store_alone(ledger: Ledger) -> None:
    ledger.prepare(_definition(), FRAME, _params(where="false"), dedupe=True)
    selection = ledger.resume("t", "s", _params(where="id > 2"), dedupe=True)
    assert selection.to_send == 2
    rows = ledger.claim(selection, 5, claimant="h/1/r", now=utcnow())
    assert sorted(r["prompt"] for r in rows) == ["Say c", "Say d"]
    assert selection.remaining == 0 and ledger.claim(selection, 5, claimant="h/1/r", now=utcnow()) == []


def test_two_runs_resuming_one_step_never_claim_the_same_row(ledger: Ledger) -> None:
    ledger.prepare(_definition(), FRAME, _params(where="false"), dedupe=True)
    first = ledger.resume("t", "s", _params(), dedupe=True)
    second = ledger.resume("t", "s", _params(), dedupe=True)
    a = ledger.claim(first, 3, claimant="h/1/a", now=utcnow())
    b = ledger.claim(second, 3, claimant="h/2/b", now=utcnow())
    assert len(a) == 3 and len(b) == 1 and not {r["id"] for r in a} & {r["id"] for r in b}


def test_a_claim_reuses_an_answer_committed_after_the_run_selected_its_rows(ledger: Ledger) -> None:
    frame = pl.DataFrame({"id": [1, 2], "text": ["same", "same"]})
    ledger.prepare(_definition(frame), frame, _params(where="false"), dedupe=True)
    first = ledger.resume("t", "s", _params(where="id = 1"), dedupe=True)  # a claim takes its twins with it,
    second = ledger.resume("t", "s", _params(where="id = 2"), dedupe=True)  # unless where= leaves them out
    [row] = ledger.claim(first, 1, claimant="h/1/a", now=utcnow())
    _commit(ledger, first, [_result(row, "DONE", "shared")])
    if not second.open_ended:
        pytest.skip("a DuckDB file has one writer at a time; its runs look answers up when they select rows")
    [other] = ledger.claim(second, 1, claimant="h/2/b", now=utcnow())
    assert second.known[other["fingerprint"]].output == "shared", "each claim looks up answers committed meanwhile"


TWINS = pl.DataFrame({"id": [1, 2, 3, 4, 5], "text": ["same", "other", "same", "same", "other"]})


def test_a_claim_takes_every_twin_of_what_it_claims(ledger: Ledger) -> None:
    """Rows whose requests are identical are claimed together, wherever they are: a second run finds none of them
    to pay for while the first run's one call for them is in flight."""
    ledger.prepare(_definition(TWINS), TWINS, _params(where="false"), dedupe=True)
    first = ledger.resume("t", "s", _params(), dedupe=True)
    second = ledger.resume("t", "s", _params(), dedupe=True)
    a = ledger.claim(first, 1, claimant="h/1/a", now=utcnow())
    assert sorted(r["id"] for r in a) == [1, 3, 4] and len({r["fingerprint"] for r in a}) == 1
    b = ledger.claim(second, 5, claimant="h/2/b", now=utcnow())
    assert sorted(r["id"] for r in b) == [2, 5]
    assert ledger.claim(first, 5, claimant="h/1/a", now=utcnow()) == [], "twins claimed early are not met again"


def test_a_claim_takes_no_twin_without_dedupe_or_outside_where(ledger: Ledger) -> None:
    ledger.prepare(_definition(TWINS), TWINS, _params(where="false"), dedupe=True)
    alone = ledger.resume("t", "s", _params(), dedupe=False)
    assert [r["id"] for r in ledger.claim(alone, 1, claimant="h/1/a", now=utcnow())] == [1]
    scoped = ledger.resume("t", "s", _params(where="id <> 4"), dedupe=True)
    assert sorted(r["id"] for r in ledger.claim(scoped, 1, claimant="h/2/b", now=utcnow())) == [2, 5]
    assert ledger.counts("t")["RUNNING"][0] == 3, "row 3 (a twin of the first claim's) is not taken: where= ends at 4"


def test_concurrent_claims_never_split_identical_requests(target: Any) -> None:
    """Four runs, each with its own connection, claim at once, one row at a time, from 200 rows with 20 distinct
    texts: every text is held by one claimant only (on PostgreSQL a step's claims take an advisory lock, without
    which this fails; a DuckDB file has one writer)."""
    import threading

    ledgers = [open_ledger(target) for _ in range(4)]
    frame = pl.DataFrame({"id": list(range(200)), "text": [f"t{i % 20}" for i in range(200)]})
    ledgers[0].prepare(_definition(frame), frame, _params(where="false"), dedupe=True)
    selections = [ledger.resume("t", "s", _params(), dedupe=True) for ledger in ledgers]
    held: dict[str, set[str]] = {}
    lock, errors = threading.Lock(), []

    def claim(n: int) -> None:
        try:
            while rows := ledgers[n].claim(selections[n], 1, claimant=f"h/{n}/r{n}", now=utcnow()):
                with lock:
                    for r in rows:
                        held.setdefault(r["fingerprint"], set()).add(str(n))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(held) == 20 and all(len(who) == 1 for who in held.values()), held
    assert ledgers[0].counts("t")["RUNNING"][0] == 200


def test_history_keeps_the_answers_a_redo_replaces(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 4, claimant="h/1/r", now=utcnow())
    _commit(ledger, selection, [_result(r, "DONE", "first") for r in rows])
    redo = ledger.prepare(
        _definition(), FRAME, _params(redo=Redo.ALL, where="id = 2", run_started=utcnow()), dedupe=False
    )
    [row] = ledger.claim(redo, 4, claimant="h/1/r2", now=utcnow())
    _commit(ledger, redo, [_result(row, "DONE", "second")])
    history = ledger.history("t", "s")
    assert history.select("id", "old_output", "output", "reason").rows() == [(2, "first", "second", "redo")]
    assert history.columns[:4] == ["id", "reason", "old_output", "output"], "what was and what is come first"
    assert ledger.outputs(redo, FRAME.select("id"))["s"].to_list() == ["first", "second", "first", "first"]


def test_recover_gives_back_lost_claims_and_leaves_live_ones(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    ledger.claim(selection, 2, claimant="another-host/1/old", now=utcnow() - timedelta(hours=2))
    _age(ledger, "another-host/1/old", hours=2)
    ledger.claim(selection, 2, claimant="another-host/1/fresh", now=utcnow())
    assert ledger.recover("t", "s", _params()) == 2
    counts = ledger.counts("t").row(0, named=True)
    assert (counts["NOT_STARTED"], counts["RUNNING"]) == (2, 2), "a fresh claim from another host is left alone"


def test_flag_selects_rows_for_redo_and_reset_starts_rows_over(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 4, claimant="h/1/r", now=utcnow())
    _commit(ledger, selection, [_result(r, "DONE", f"first {r['id']}") for r in rows])
    assert ledger.flag("t", "s", where="id IN (1, 2)", reason="bad", by="me", now=utcnow()) == 2
    assert ledger.prepare(_definition(), FRAME, _params(), dedupe=True).work.height == 0, "flags alone send nothing"
    redo = ledger.prepare(_definition(), FRAME, _params(redo=Redo.FLAGGED, run_started=utcnow()), dedupe=True)
    assert sorted(redo.work["id"].to_list()) == [1, 2] and redo.known == {}, "a flagged answer is never reused"
    [one, _] = ledger.claim(redo, 4, claimant="h/1/r2", now=utcnow())
    _commit(ledger, redo, [_result(one, "DONE", "second")])
    assert ledger.release(redo, claimant="h/1/r2") == 1
    again = ledger.prepare(_definition(), FRAME, _params(redo=Redo.FLAGGED, run_started=utcnow()), dedupe=True)
    assert again.work["id"].to_list() == [2], "a flag is cleared once its row is DONE again; a released one stays"

    assert ledger.reset("t", "s", where="id >= 3", now=utcnow()) == 2
    counts = ledger.counts("t").row(0, named=True)
    assert (counts["NOT_STARTED"], counts["DONE"]) == (2, 2)
    history = ledger.history("t", "s")
    assert history.select("id", "reason").rows() == [(1, "flagged: bad"), (3, "reset"), (4, "reset")]


def _intent(ledger: Ledger, selection, rows: list[dict], intent: str = "bintent1") -> None:
    assigned = pl.DataFrame({"id": [r["id"] for r in rows], "custom_id": [f"{intent}-{i}" for i in range(len(rows))]})
    ledger.begin_batch(
        selection.layout,
        assigned,
        intent=intent,
        claimant="h/1/r",
        requests=len(rows),
        size=100,
        model="m",
        version=selection.version,
        validated=False,
        now=utcnow(),
    )


def test_a_batch_goes_from_intent_to_submitted_to_merged(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 3, claimant="h/1/r", now=utcnow())
    _intent(ledger, selection, rows)
    [record] = ledger.open_batches("t", "s")
    assert (record.intent, record.batch_id, record.requests, record.rows) == ("bintent1", None, 3, 3)
    assert ledger.release(selection, claimant="h/1/r") == 0, "rows of an intent are not given back with claims"
    assert ledger.confirm_batch("t", "s", intent="bintent1", batch_id="msgbatch_x", now=utcnow()) == 3
    assert ledger.counts("t").select("RUNNING", "SUBMITTED", "NOT_STARTED").row(0) == (0, 3, 1)
    assert ledger.known_batch_ids() == {"msgbatch_x"}
    [record] = ledger.open_batches("t", "s")
    held = ledger.batch_rows(record)
    assert held.rows.sort("id")["custom_id"].to_list() == ["bintent1-0", "bintent1-1", "bintent1-2"]
    answered = [
        {
            **_result({**rows[0], "fingerprint": rows[0]["fingerprint"]}, "DONE", "yes"),
            "batch_id": "msgbatch_x",
            "custom_id": "bintent1-0",
        }
    ]
    back = ledger.merge_batch(
        record,
        held.layout,
        pl.from_dicts(answered, schema={"id": pl.Int64} | RESULT_SCHEMA),
        counts={"succeeded": 1, "expired": 2},
        processing_status="ended",
        ended_at=utcnow(),
        now=utcnow(),
        expected_rows=3,
    )
    assert sorted(back["id"].to_list()) == [2, 3], "the rows the batch did not answer go back"
    assert ledger.counts("t").select("SUBMITTED", "DONE", "NOT_STARTED").row(0) == (0, 1, 3)
    assert ledger.open_batches("t", "s") == []
    again = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    assert again.work["id"].to_list() == [2, 3, 4], "expired rows are sent again; the answered one is not"


def test_an_abandoned_intent_gives_its_rows_back_as_they_were(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 2, claimant="h/1/r", now=utcnow())
    _intent(ledger, selection, rows)
    params = _params(stale_before=utcnow() + timedelta(hours=1))  # every claim is old now
    assert ledger.recover("t", "s", params) == 0, "a claim with an intent waits for its batch to be looked for"
    back = ledger.abandon_batch("t", "s", intent="bintent1", note="never sent", now=utcnow())
    assert sorted(back["id"].to_list()) == sorted(r["id"] for r in rows)
    assert ledger.counts("t").select("RUNNING", "NOT_STARTED").row(0) == (0, 4)
    assert ledger.open_batches("t", "s") == []


def test_a_found_batch_is_never_abandoned_nor_given_to_two_intents(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    first = ledger.claim(selection, 2, claimant="h/1/r", now=utcnow())
    _intent(ledger, selection, first, intent="bfirst")
    second = ledger.claim(selection, 2, claimant="h/1/r", now=utcnow())
    _intent(ledger, selection, second, intent="bsecond")
    assert ledger.confirm_batch("t", "s", intent="bfirst", batch_id="msgbatch_a", now=utcnow()) == 2
    assert ledger.confirm_batch("t", "s", intent="bsecond", batch_id="msgbatch_a", now=utcnow()) is None
    assert ledger.abandon_batch("t", "s", intent="bfirst", note="late", now=utcnow()).height == 0, (
        "another run found its batch meanwhile: not abandoned"
    )
    assert ledger.counts("t").select("SUBMITTED", "RUNNING").row(0) == (2, 2)
    [record] = [b for b in ledger.open_batches("t", "s") if b.intent == "bfirst"]
    held = ledger.batch_rows(record)
    with pytest.raises(BatchChanged):
        ledger.merge_batch(
            record,
            held.layout,
            pl.DataFrame(schema={"id": pl.Int64} | RESULT_SCHEMA),
            counts={},
            processing_status="ended",
            ended_at=utcnow(),
            now=utcnow(),
            expected_rows=3,
        )
    assert ledger.counts("t").select("SUBMITTED").row(0) == (2,), "a merge against stale rows writes nothing"


def test_overview_counts_claims_and_errors_by_kind(ledger: Ledger) -> None:
    selection = ledger.prepare(_definition(), FRAME, _params(), dedupe=True)
    rows = ledger.claim(selection, 4, claimant="h/1/r", now=utcnow())
    _commit(
        ledger,
        selection,
        [
            _result(rows[0], "DONE", "A"),
            _result(rows[1], "FAILED", error="400 bad: row 2"),
            _result(rows[2], "FAILED", error="400 bad: row 3"),
        ],
    )
    (step,) = ledger.overview("t").steps
    assert (step.counts["DONE"], step.counts["FAILED"], step.counts["RUNNING"], step.counts["total"]) == (1, 2, 1, 4)
    assert [(c.claimed_by, c.rows) for c in step.claims] == [("h/1/r", 1)]
    (error,) = step.errors  # one line per kind, with one of its rows (and that row's own message) as example
    assert (error.kind, error.rows) == ("400 bad", 2)
    assert (error.example_key, error.example) in {('{"id":2}', "400 bad: row 2"), ('{"id":3}', "400 bad: row 3")}
    assert ledger.overview("other").steps == []
