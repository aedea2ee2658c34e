"""A person's verdicts live in the ledger: accept, flag, correct; recorded with the answer each judged, kept by
every redo but one that names the rows, fed downstream like any answer, and carried by copy, export and restore."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, accept, correct, verdicts
from llmledger.simulator import Simulator

from .conftest import frame, sql

PROMPT = "Summarize: {text}"


def test_an_accepted_answer_is_recorded_with_what_it_judged_and_kept_by_redo_stale(
    run: Any, sim: Simulator, store: Path
) -> None:
    first = run(frame(4), "summary", prompt=PROMPT)
    assert accept(store, "messages", "summary", key=1, by="ana") == 1
    found = verdicts(store, "messages", "summary")
    assert found.select("row_key", "verdict", "answer", "reviewer").rows() == [
        ('{"id":1}', "accept", first["summary"][1], "ana")
    ]
    assert found["fingerprint"][0] == sql(store, "SELECT summary_fingerprint::VARCHAR FROM messages WHERE id = 1")[0][0]
    judged = "SELECT id, summary_verdict, summary_verdict_by FROM messages WHERE summary_verdict IS NOT NULL"
    assert sql(store, judged) == [(1, "accepted", "ana")]
    paid = sim.stats()["paid"]
    with pytest.warns(llmledger.StaleAnswersWarning):
        run(frame(4), "summary", prompt="Summarize briefly: {text}")  # every answer turns stale
    again = run(frame(4), "summary", prompt="Summarize briefly: {text}", redo="stale")
    assert sim.stats()["paid"] == paid + 3, "the three stale answers no one accepted are redone, not the accepted one"
    assert again["summary"][1] == first["summary"][1] and again["summary_stale"][1], "kept, and still stale"
    report = llmledger.last_report()
    assert report is not None and (report.stale, report.kept_stale) == (0, 1)
    assert "1 stale answer kept: a person accepted or wrote it" in "\n".join(report.hints())
    assert not any("Pass redo='stale'" in hint for hint in report.hints()), "redo='stale' would not re-send it"
    replaced = run(frame(4), "summary", prompt="Summarize briefly: {text}", redo=True, where="id = 1")
    assert sim.stats()["paid"] == paid + 4 and not replaced["summary_stale"][1], "named: the accepted answer is redone"
    assert sql(store, "SELECT summary_verdict FROM messages WHERE id = 1") == [(None,)], "a new answer, no verdict yet"
    assert verdicts(store)["verdict"].to_list() == ["accept"], "the verdict on the earlier answer stays"


def test_a_correction_becomes_the_answer_at_no_cost_and_no_redo_but_a_named_one_replaces_it(
    run: Any, sim: Simulator, store: Path
) -> None:
    first = run(frame(5), "summary", prompt=PROMPT)
    run(frame(5), "title", prompt="Title for: {summary}")
    assert correct(store, "messages", "summary", key=2, answer="a person's summary", by="bo", reason="too long") == 1
    row = sql(
        store,
        "SELECT summary, summary_status, summary_source, summary_cost_usd, summary_verdict, summary_verdict_by "
        "FROM messages WHERE id = 2",
    )
    assert row == [("a person's summary", "DONE", "person", 0.0, "corrected", "bo")]
    old = llmledger.history(store, "messages", "summary", key=2)
    assert old.select("reason", "old_output", "output").rows() == [
        ("corrected by bo", first["summary"][2], "a person's summary")
    ]
    (verdict,) = verdicts(store).select("verdict", "answer", "corrected", "reason").rows()
    assert verdict == ("correct", first["summary"][2], "a person's summary", "too long")
    paid = sim.stats()["paid"]
    out = run(frame(5), "summary", prompt=PROMPT)
    assert sim.stats()["paid"] == paid and out["summary"][2] == "a person's summary" and not out["summary_stale"][2]
    titles = run(frame(5), "title", prompt="Title for: {summary}", redo="stale")  # fed downstream like any answer
    assert sim.stats()["paid"] == paid + 1 and "a person's summary" in titles["title"][2]
    for redo in ("stale", "flagged", True):
        llmledger.flag(store, "messages", "summary", where="id = 2", reason="try again")
        run(frame(5), "summary", prompt="Summarize again: {text}" if redo == "stale" else PROMPT, redo=redo)
        assert sql(store, "SELECT summary FROM messages WHERE id = 2") == [("a person's summary",)], redo
        if redo == "flagged":  # found in a review: the flag stayed and the run said nothing
            report = llmledger.last_report()
            assert report is not None and report.kept_flagged == 1
            assert "1 flagged row kept: a person wrote its answer" in "\n".join(report.hints())
    run(frame(5), "summary", prompt=PROMPT, redo=True, where="id = 2")
    assert sql(store, "SELECT summary_source FROM messages WHERE id = 2") != [("person",)], "named: replaced"


def test_a_typed_correction_is_checked_against_the_schema_and_a_bad_one_writes_nothing(run: Any, store: Path) -> None:
    run(frame(3), "facts", prompt="Extract: {text}", output={"company": str, "year": int | None})
    before = sql(store, "SELECT * FROM messages ORDER BY id")
    with pytest.raises(InvalidInputError, match="output schema"):
        correct(store, "messages", "facts", key=0, answer={"company": "Acme", "year": "last year"})
    assert sql(store, "SELECT * FROM messages ORDER BY id") == before and verdicts(store).height == 0
    correct(store, "messages", "facts", key=0, answer={"company": "Acme", "year": 1999})
    out = run(frame(3), "facts", prompt="Extract: {text}", output={"company": str, "year": int | None})
    assert out["facts"][0] == {"company": "Acme", "year": 1999}


def test_rows_showing_the_same_answer_to_the_same_request_take_the_verdict(run: Any, store: Path) -> None:
    df = pl.DataFrame({"id": [1, 2, 3], "text": ["same", "same", "other"]})
    run(df, "summary", prompt=PROMPT)
    assert correct(store, "messages", "summary", key=1, answer="fixed") == 2  # its twin too
    assert sql(store, "SELECT id, summary FROM messages ORDER BY id")[:2] == [(1, "fixed"), (2, "fixed")]
    assert verdicts(store).height == 1, "one judgement, recorded once"


def test_accepting_a_needs_review_answer_makes_it_done(run: Any, store: Path) -> None:
    run(frame(3), "summary", prompt=PROMPT, validate=lambda row, out: "too short" if row["id"] == 1 else None)
    assert sql(store, "SELECT summary_status FROM messages WHERE id = 1") == [("NEEDS_REVIEW",)]
    accept(store, "messages", "summary", where="id = 1")
    # DONE; the reason it needed review stays readable (and an undo puts it back under review)
    assert sql(store, "SELECT summary_status, summary_error FROM messages WHERE id = 1") == [("DONE", "too short")]


def run_with(store: Path, **options: Any) -> Any:
    """Found in an attack: key=5 gave a raw TypeError, cache=1 was taken for True."""
    return llmledger.apply_llm(frame(3), "summary", prompt=PROMPT, store=store, table="messages", **options)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: accept(s, "messages", "summary"), "key= .* or where="),
        (lambda s: accept(s, "messages", "summary", key=1, where="true"), "not both"),
        (lambda s: accept(s, "messages", "summary", key=99), "no row with key 99"),
        (lambda s: accept(s, "messages", "summary", key="x"), "no integer"),
        (lambda s: accept(s, "messages", "nope", key=1), "no step 'nope'"),
        (lambda s: accept(s, "messages", "summary", key=1, by=" "), "by= names who"),
        (lambda s: correct(s, "messages", "summary", key=1, answer=3), "non-empty string"),
        (lambda s: correct(s, "messages", "summary", key=None, answer="x"), "one row"),
        (lambda s: llmledger.flag(s, "messages", "summary", where="id = 1", reason="r", by=""), "by= names who"),
        (lambda s: llmledger.flag(s, "messages", "summary", where="id = 1", reason="r", by=5), "by= names who"),
        (lambda s: verdicts(s, 5), "table must be a table name"),
        (lambda s: run_with(s, key=5), "key= names a column"),
        (lambda s: accept(s, "messages", "summary", key=1, by="a\x00b"), "by= names who"),
        (lambda s: llmledger.flag(s, "messages", "summary", where="id = 1", reason="x\x00"), "NUL"),
        (lambda s: llmledger.review(s, "messages", "summary", where="nope = 1"), "does not work on table"),
        (lambda s: run_with(s, cache=1), "cache must be"),
    ],
)
def test_a_bad_verdict_is_refused_and_writes_nothing(run: Any, store: Path, call: Any, message: str) -> None:
    run(frame(3), "summary", prompt=PROMPT)
    before = sql(store, "SELECT * FROM messages ORDER BY id")
    with pytest.raises(InvalidInputError, match=message):
        call(store)
    assert sql(store, "SELECT * FROM messages ORDER BY id") == before and verdicts(store).height == 0


def test_verdicts_go_along_with_copy_export_and_restore(run: Any, store: Path, tmp_path: Path) -> None:
    run(frame(3), "summary", prompt=PROMPT)
    accept(store, "messages", "summary", key=0, by="ana")
    correct(store, "messages", "summary", key=1, answer="mine", by="bo")
    expected = verdicts(store).drop("judged_at", "undone_at").rows()
    copied = tmp_path / "copied.duckdb"
    llmledger.copy(store, copied)
    restored = tmp_path / "restored.duckdb"
    llmledger.restore(llmledger.export(store, "messages", tmp_path / "out"), restored)
    for other in (copied, restored):
        assert verdicts(other).drop("judged_at", "undone_at").rows() == expected, other
        assert sql(other, "SELECT summary_verdict FROM messages ORDER BY id") == [
            ("accepted",),
            ("corrected",),
            (None,),
        ]


def test_two_reviewers_at_once_on_postgresql_both_land(client: Any, pg_url: str) -> None:
    llmledger.apply_llm(frame(40), "summary", prompt=PROMPT, client=client, store=pg_url, table="m", progress=False)
    errors: list[BaseException] = []

    def review(name: str, keys: range) -> None:
        try:
            for k in keys:
                accept(pg_url, "m", "summary", key=k, by=name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=review, args=(n, range(i, 40, 2))) for i, n in enumerate(("ana", "bo"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    found = verdicts(pg_url, "m", "summary")
    assert found.height == 40 and found.group_by("reviewer").len().sort("reviewer").rows() == [("ana", 20), ("bo", 20)]


def test_accuracy_on_reviewed_rows_beside_another_model_and_the_cheapest_good_enough(
    client: Any, sim: Simulator, store: Path, sms: pl.DataFrame, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two models label 80 SMS; a person reviews the cheap one's first 50 answers against the data's own labels
    (accepting right ones, correcting wrong ones). accuracy() then says, for each model, the share right on those
    rows, with its interval, and which is the cheapest whose interval reaches the target: each figure checked
    against the same count made here from the frames."""
    sim.configure(accuracy={"claude-haiku-5-5": 0.7, "claude-fable-5-2": 0.97})
    rows = sms.head(80)
    prompt = "Is this SMS spam or ham? Answer spam or ham.\n\n{text}"
    common = dict(client=client, store=store, table="sms", progress=False, prompt=prompt)
    cheap = llmledger.apply_llm(rows, "label_cheap", **common)
    strong = llmledger.apply_llm(rows, "label_strong", model="claude-fable-5-2", **common)
    reviewed = cheap.head(50)
    for r in reviewed.iter_rows(named=True):
        if r["label_cheap"].strip().lower() == r["label"]:
            accept(store, "sms", "label_cheap", key=r["id"], by="ana")
        else:
            correct(store, "sms", "label_cheap", key=r["id"], answer=r["label"], by="ana")
    acc = llmledger.accuracy(store, "sms", "label_cheap", against=["label_strong"], target=0.8)
    expected = {
        "label_cheap": int((reviewed["label_cheap"].str.strip_chars().str.to_lowercase() == reviewed["label"]).sum()),
        "label_strong": int(
            (strong.head(50)["label_strong"].str.strip_chars().str.to_lowercase() == reviewed["label"]).sum()
        ),
    }
    assert 20 < expected["label_cheap"] < 50 and expected["label_strong"] > expected["label_cheap"]
    for r in acc.table.iter_rows(named=True):
        assert (r["reviewed"], r["right"]) == (50, expected[r["step"]]), r
        assert r["low"] <= r["accuracy"] == expected[r["step"]] / 50 <= r["high"]
        ((per_row,),) = sql(store, f"SELECT avg({r['step']}_cost_usd) * 1000 FROM sms WHERE {r['step']}_source "
                                   "IS DISTINCT FROM 'person'")  # fmt: skip
        assert r["usd_per_1000_rows"] == pytest.approx(per_row)
        assert r["meets_target"] == (r["low"] >= 0.8)
    good = acc.table.filter("meets_target").sort("usd_per_1000_rows")
    assert acc.cheapest == (good["step"][0] if good.height else None)
    assert f"{acc.table['accuracy'][0]:.0%}" in str(acc) and "per 1,000 rows" in str(acc)
    comparison = llmledger.compare(store, "sms", ["label_cheap", "label_strong"])
    assert comparison.accuracy(target=0.8).table.equals(acc.table)
    html = comparison._repr_html_()
    assert "accuracy on reviewed rows" in html, "drawn next to the agreement matrix"
    assert html.count('class="llmledger-chart"') == 2, "agreement's chart, and accuracy's"
    drawn = acc.chart()
    assert drawn.count("llmledger-chart-interval") == 2 and "target 80%" in drawn
    assert all(f">{step}</text>" in drawn for step in ("label_cheap", "label_strong"))
    from llmledger.cli import main

    main(["accuracy", str(store), "--table", "sms", "--step", "label_cheap", "--against", "label_strong",
          "--target", "0.8"])  # fmt: skip
    assert capsys.readouterr().out.strip() == str(acc)


def test_a_typed_step_is_judged_field_by_field(run: Any, store: Path) -> None:
    out = run(frame(4), "facts", prompt="Extract: {text}", output={"company": str, "year": int | None})
    accept(store, "messages", "facts", where="id IN (0, 1)")
    correct(store, "messages", "facts", key=2, answer={**out["facts"][2], "year": 1901})
    llmledger.flag(store, "messages", "facts", where="id = 3", reason="wrong company")
    acc = llmledger.accuracy(store, "messages", "facts")
    assert acc.table.select("reviewed", "right").row(0) == (4, 2)
    assert acc.fields is not None
    fields = {r["field"]: (r["reviewed"], r["right"]) for r in acc.fields.iter_rows(named=True)}
    assert fields == {"company": (3, 3), "year": (3, 2)}, "a flag says the answer is wrong, not which field"


def test_accuracy_refuses_what_it_cannot_count(run: Any, store: Path) -> None:
    run(frame(2), "summary", prompt=PROMPT)
    for options, message in (
        ({"target": 90}, "share between 0 and 1"),
        ({"against": "summary2"}, "list of step names"),
        ({"against": ["summary"]}, "twice"),
        ({"against": ["nope"]}, "no step 'nope'"),
        ({"confidence": 95}, "share such as 0.95"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            llmledger.accuracy(store, "messages", "summary", **options)
    assert llmledger.accuracy(store, "messages", "summary").table["reviewed"].to_list() == [0]
    run(frame(2), "summary2", prompt=PROMPT)
    assert "accuracy" not in llmledger.compare(store, "messages", ["summary", "summary2"])._repr_html_()


def test_undo_takes_back_a_reviewers_latest_verdict_and_puts_the_row_back(client: Any, target: Any) -> None:
    store = target

    def run(df: pl.DataFrame, step: str, **options: Any) -> pl.DataFrame:
        return llmledger.apply_llm(df, step, client=client, store=store, table="messages", progress=False, **options)

    def sql(store: Any, query: str) -> list[tuple[Any, ...]]:
        found = llmledger.sql(store, query)
        assert found is not None
        return found.rows()

    df = pl.DataFrame({"id": [1, 2, 3, 4], "text": ["same", "same", "other", "third"]})
    first = run(df, "summary", prompt=PROMPT, validate=lambda row, out: "check" if row["id"] == 4 else None)
    state = (
        "SELECT id, summary, summary_status, summary_source, summary_verdict, summary_flag FROM messages ORDER BY id"
    )
    before = sql(store, state)
    correct(store, "messages", "summary", key=1, answer="fixed", by="ana")  # its twin 2 too
    llmledger.flag(store, "messages", "summary", where="id = 3", reason="vague", by="ana")
    accept(store, "messages", "summary", key=4, by="ana")
    accept(store, "messages", "summary", key=3, by="bo")  # a second reviewer disagrees on row 3
    assert llmledger.undo_verdict(store, "messages", "summary", key=4, by="ana") == "accept"
    assert llmledger.undo_verdict(store, "messages", "summary", key=3, by="bo") == "accept"
    assert sql(store, "SELECT summary_flag FROM messages WHERE id = 3") == [("vague",)], "ana's flag stands again"
    assert llmledger.undo_verdict(store, "messages", "summary", key=3, by="ana") == "flag"
    assert llmledger.undo_verdict(store, "messages", "summary", key=1, by="ana") == "correct"
    assert llmledger.undo_verdict(store, "messages", "summary", key=1, by="ana") is None
    assert sql(store, state) == before, "every row as it was, NEEDS_REVIEW again included"
    assert llmledger.history(store, "messages", "summary", key=1)["reason"].to_list() == [
        "corrected by ana", "correction undone by ana"
    ]  # fmt: skip
    assert verdicts(store)["undone_at"].null_count() == 0 and verdicts(store).height == 4
    assert first["summary"][0] == sql(store, "SELECT summary FROM messages WHERE id = 1")[0][0]


def test_undoing_an_accept_or_a_flag_of_a_persons_answer_leaves_it_corrected(client: Any, target: Any) -> None:
    """Found in an attack: an accept of a corrected answer, taken back, left the row `accepted` (and a flag,
    taken back, left it flagged), its twin too, while the verdicts said it was undone."""
    common: dict[str, Any] = dict(client=client, store=target, table="messages", progress=False)
    llmledger.apply_llm(pl.DataFrame({"id": [1, 2, 3], "text": ["same", "same", "x"]}), "summary", prompt=PROMPT,
                        **common)  # fmt: skip
    correct(target, "messages", "summary", key=1, answer="fixed", by="ana")  # its twin 2 too
    state = "SELECT id, summary, summary_source, summary_verdict, summary_verdict_by, summary_flag FROM messages"
    corrected = llmledger.sql(target, state + " ORDER BY id").rows()  # type: ignore[union-attr]
    assert corrected[0][2:5] == ("person", "corrected", "ana") and corrected[1][1] == "fixed"
    accept(target, "messages", "summary", key=1, by="bo")
    assert llmledger.undo_verdict(target, "messages", "summary", key=1, by="bo") == "accept"
    assert llmledger.sql(target, state + " ORDER BY id").rows() == corrected  # type: ignore[union-attr]
    llmledger.flag(target, "messages", "summary", where="id = 1", reason="still wrong", by="bo")
    assert llmledger.undo_verdict(target, "messages", "summary", key=1, by="bo") == "flag"
    assert llmledger.sql(target, state + " ORDER BY id").rows() == corrected  # type: ignore[union-attr]


def test_two_reviewers_agreement_is_counted_on_the_answers_both_judged(run: Any, store: Path) -> None:
    out = run(frame(5), "summary", prompt=PROMPT)
    for key in range(4):
        accept(store, "messages", "summary", key=key, by="ana")
    accept(store, "messages", "summary", key=0, by="bo")
    accept(store, "messages", "summary", key=1, by="bo")
    llmledger.flag(store, "messages", "summary", where="id = 2", reason="no", by="bo")
    correct(store, "messages", "summary", key=4, answer=out["summary"][4] + ".", by="bo")  # the same, once normalized
    acc = llmledger.accuracy(store, "messages", "summary")
    assert acc.reviewers is not None
    assert acc.reviewers.select("reviewer_a", "reviewer_b", "both", "agree").rows() == [("ana", "bo", 3, 2)]
    assert "ana and bo judged 3 answers of summary both: alike on 2 (67%)" in str(acc)
    assert acc.table.select("reviewed", "right").row(0) == (5, 4), "the latest verdict on a row counts"


def test_skip_nulls_does_not_count_as_naming_rows_for_a_redo(run: Any, client: Any, store: Path) -> None:
    """skip_nulls=True narrows the rows with a predicate of its own; only the call's where= names rows."""
    df = frame(3).with_columns(note=pl.Series(["a", None, "c"]))
    run(df, "summary", prompt="{text} ({note})", skip_nulls=True)
    correct(store, "messages", "summary", key=0, answer="mine")
    run(df, "summary", prompt="{text} ({note})", skip_nulls=True, redo=True)
    assert sql(store, "SELECT summary FROM messages WHERE id = 0") == [("mine",)]
    llmledger.resume(
        store, "messages", "summary", redo=True, client=client, progress=False
    )  # skip_nulls recorded with the step
    assert sql(store, "SELECT summary FROM messages WHERE id = 0") == [("mine",)]
    run(df, "summary", prompt="{text} ({note})", skip_nulls=True, redo=True, where="id = 0")
    assert sql(store, "SELECT summary_source FROM messages WHERE id = 0") != [("person",)]


def test_a_verdict_spreads_only_to_rows_asked_the_same_request_now(run: Any, store: Path) -> None:
    """Found in an attack: twins answered together, then given other texts, took one row's correction."""
    run(pl.DataFrame({"id": [1, 2], "text": ["great product", "great product"]}), "summary", prompt=PROMPT)
    with pytest.warns(llmledger.StaleAnswersWarning):
        run(pl.DataFrame({"id": [1, 2], "text": ["awful", "meh"]}), "summary", prompt=PROMPT)
    assert correct(store, "messages", "summary", key=1, answer="negative") == 1
    assert accept(store, "messages", "summary", key=2) == 1
    assert sql(store, "SELECT id, summary_source, summary_verdict FROM messages ORDER BY id") == [
        (1, "person", "corrected"), (2, "simulator", "accepted")
    ]  # fmt: skip


def test_a_key_that_names_part_of_a_several_column_key_is_refused(run: Any, store: Path) -> None:
    df = pl.DataFrame({"shop": ["A", "A", "B"], "n": [1, 2, 1], "text": ["good", "awful", "ok"]})
    run(df, "summary", prompt=PROMPT, key=["shop", "n"])
    for call in (
        lambda: correct(store, "messages", "summary", key={"shop": "A"}, answer="positive"),
        lambda: accept(store, "messages", "summary", key={"n": 1}),
        lambda: llmledger.undo_verdict(store, "messages", "summary", key={"shop": "A"}),
    ):
        with pytest.raises(InvalidInputError, match="every key column"):
            call()
    assert verdicts(store).height == 0
    assert correct(store, "messages", "summary", key={"shop": "A", "n": 2}, answer="negative") == 1


def test_undo_keeps_what_other_reviewers_did_on_twins(run: Any, store: Path) -> None:
    """Found in an attack: one reviewer's undo wiped another's standing correction or accept on a twin row."""
    run(pl.DataFrame({"id": [1, 2], "text": ["same", "same"]}), "summary", prompt=PROMPT)
    correct(store, "messages", "summary", key=1, answer="X-ana", by="ana")
    correct(store, "messages", "summary", key=2, answer="Y-bob", by="bo")
    llmledger.undo_verdict(store, "messages", "summary", key=1, by="ana")
    assert sql(store, "SELECT summary, summary_verdict_by FROM messages ORDER BY id") == [("Y-bob", "bo")] * 2

    run(pl.DataFrame({"id": [3, 4], "text": ["twin", "twin"]}), "summary", prompt=PROMPT)
    accept(store, "messages", "summary", key=4, by="ana")
    llmledger.flag(store, "messages", "summary", where="id = 3", reason="no", by="bo")
    llmledger.undo_verdict(store, "messages", "summary", key=3, by="bo")
    on_twins = "SELECT summary_verdict, summary_verdict_by, summary_flag FROM messages WHERE id IN (3, 4)"
    assert sql(store, on_twins) == [("accepted", "ana", None)] * 2, "ana's accept stands again on both"


def test_undoing_the_correction_of_an_unanswered_row_leaves_it_unanswered(run: Any, store: Path) -> None:
    run(frame(2), "summary", prompt=PROMPT, where="id = 0")
    correct(store, "messages", "summary", key=1, answer="typo", by="ana")
    assert llmledger.undo_verdict(store, "messages", "summary", key=1, by="ana") == "correct"
    row = "SELECT summary, summary_status, summary_source, summary_verdict FROM messages WHERE id = 1"
    assert sql(store, row) == [(None, "NOT_STARTED", None, None)]


def test_accuracy_judges_the_models_answers_not_a_persons(run: Any, store: Path) -> None:
    """Found in an attack: a reviewer accepting another's correction counted as the model being right, and a
    corrected row the model never answered as the model being wrong."""
    out = run(frame(4), "summary", prompt=PROMPT, where="id < 3")
    correct(store, "messages", "summary", key=0, answer="right one", by="ana")
    accept(store, "messages", "summary", key=0, by="bo")  # bo accepts ana's answer: nothing about the model
    correct(store, "messages", "summary", key=1, answer="oops", by="ana")
    correct(store, "messages", "summary", key=1, answer=out["summary"][1], by="ana")  # back to the model's
    accept(store, "messages", "summary", key=2, by="ana")
    correct(store, "messages", "summary", key=3, answer="never answered", by="ana")
    acc = llmledger.accuracy(store, "messages", "summary")
    assert acc.table.select("reviewed", "right").row(0) == (3, 2)


@pytest.mark.filterwarnings("ignore::llmledger.UnknownPriceWarning")
def test_a_reviewed_step_of_unknown_cost_is_named_under_the_chart_not_dropped(run: Any, store: Path) -> None:
    run(frame(3), "summary", prompt=PROMPT)
    run(frame(3), "summary2", prompt=PROMPT, model="claude-from-the-future")
    for step in ("summary", "summary2"):
        accept(store, "messages", step, key=1, by="ana")
    drawn = llmledger.accuracy(store, "messages", "summary", against=["summary2"]).chart()
    assert ">summary</text>" in drawn and ">summary2</text>" not in drawn
    assert "not drawn, its cost unknown: summary2" in drawn


def test_the_review_views_look_at_a_row_reads_it_and_its_history_on_postgresql(client: Any, pg_url: str) -> None:
    """The view reads a row, its earlier answers and the schema's version in one read-only transaction
    (`LookVerbs.row_and_history`): on PostgreSQL too, a redone row shows its first answer as an earlier one."""
    from llmledger._view.review_queue import load_row, shape_of

    common: dict[str, Any] = dict(prompt=PROMPT, client=client, store=pg_url, table="h", progress=False)
    first = llmledger.apply_llm(frame(4), "summary", **common)
    llmledger.flag(pg_url, "h", "summary", where="id = 2", reason="too long")
    llmledger.apply_llm(frame(4), "summary", redo="flagged", **common)
    row = load_row(shape_of(pg_url, "h", "summary"), 2)
    assert row is not None and row.status == "DONE" and row.flag is None
    assert [e["answer"] for e in row.earlier] == [first.filter(pl.col("id") == 2)["summary"].item()]
    assert [e["reason"] for e in row.earlier] == llmledger.history(pg_url, "h", "summary", key=2)["reason"].to_list()
    assert load_row(shape_of(pg_url, "h", "summary"), 99) is None


def test_on_postgresql_a_row_and_its_history_are_read_from_one_snapshot(
    client: Any, sim: Simulator, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in an attack: at READ COMMITTED, a redo committed between the row's read and its history's showed the
    answer on screen among its own earlier answers. The redo here commits exactly there: the view sees neither."""
    import llmledger._ledger.looks as looks
    from llmledger._view.review_queue import load_row, shape_of

    sim.configure(resample=True)  # a redo draws another answer
    common: dict[str, Any] = dict(prompt=PROMPT, client=client, store=pg_url, table="snap", progress=False)
    first = llmledger.apply_llm(frame(3), "summary", **common)
    shape = shape_of(pg_url, "snap", "summary")
    real = looks.side_by_side

    def redo_in_between(con: Any, layout: Any, key: Any = None) -> Any:
        monkeypatch.setattr(looks, "side_by_side", real)  # once
        redo = dict(redo=True, where="id = 1", **common)
        worker = threading.Thread(target=lambda: llmledger.apply_llm(frame(3), "summary", **redo))
        worker.start()
        worker.join(60)
        return real(con, layout, key)

    monkeypatch.setattr(looks, "side_by_side", redo_in_between)
    row = load_row(shape, 1)
    assert row is not None and row.answer == first.filter(pl.col("id") == 1)["summary"].item()
    assert row.earlier == [], "the history as it stood with the row"
    now = load_row(shape, 1)
    assert now is not None and [e["answer"] for e in now.earlier] == [row.answer] and now.answer != row.answer
