"""The review view (`llmledger.review`), driven as the browser drives it: key by key into its command box, each
keystroke sending the box's whole value (Enter a newline in it); the ledger then holds exactly the verdicts given.
And its terminal twin."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import verdicts
from llmledger._view.accuracy import sample_size
from llmledger._view.review_session import Session
from llmledger._view.review_text import review_in_terminal

from .conftest import frame, sql

PROMPT = "Summarize: {text}"
FACTS = {"company": str, "year": int | None}


def send(view: Any, value: str) -> None:
    """What the browser sends: the box's whole value, through the comm's path into the widget."""
    view.box.set_state({"value": value})


def press(view: Any, keys: str) -> None:
    """Type `keys` into the command box one keystroke at a time ("\\n" is Enter), as the browser does: after each,
    the box's whole value (a text area's, so Enter is a newline in it)."""
    for key in keys:
        send(view, view.box.value + key)


def given(store: Path, step: str) -> list[tuple[Any, ...]]:
    found = verdicts(store, "messages", step).filter(pl.col("undone_at").is_null())
    return [(json.loads(k)["id"], v, r) for k, v, r in found.select("row_key", "verdict", "reason").rows()]


def test_keys_accept_flag_skip_undo_and_move_and_the_ledger_holds_exactly_those_verdicts(run: Any, store: Path) -> None:
    run(frame(6), "summary", prompt=PROMPT)
    view = llmledger.review(store, "messages", "summary", by="ana")
    assert view.session.keys == [0, 1, 2, 3, 4, 5] and view.box.continuous_update
    assert "hello message number 0" in view.body.value and "a accept" not in view.body.value
    assert "<kbd>a</kbd> accept" in view.legend.value
    press(view, "a")  # row 0 accepted
    assert view.box.value == "a" and view.session.key == 1, "the kernel never writes the box"
    press(view, "fmade up\n")  # row 1 flagged with a reason
    press(view, "s")  # row 2 skipped
    press(view, "f\n")  # row 3 flagged, no reason
    press(view, "a")  # row 4 accepted ...
    press(view, "u")  # ... and taken back: row 4 shows again
    assert view.session.key == 4 and "undone: accept" in view.message.value
    press(view, "kk")  # back to row 2
    assert view.session.key == 2
    press(view, "a")  # row 2 accepted after all
    press(view, "j")  # past 3 to row 4
    assert view.session.key == 4
    press(view, "z")
    assert "not a key" in view.message.value
    assert given(store, "summary") == [
        (0, "accept", None),
        (1, "flag", "made up"),
        (3, "flag", None),
        (2, "accept", None),
    ]
    assert sql(store, "SELECT id, summary_verdict, summary_flag FROM messages WHERE id IN (1, 4) ORDER BY id") == [
        (1, None, "made up"),
        (4, None, None),
    ]
    assert "4 reviewed, 2 left" in view.header.value, view.header.value
    assert "accuracy 50% (15%–85%) on 4" in view.header.value, "2 accepted of 4 judged, with Wilson's interval"


def test_keystrokes_the_browser_held_back_and_sent_at_once_act_as_if_sent_one_by_one(run: Any, store: Path) -> None:
    """While the kernel is busy the browser holds a widget's updates back and then sends only the latest value, so
    several keys, an Enter and the keys after it can arrive in one update; a backspace or a selection typed over
    shortens the value. None of it is acted on twice, and nothing typed is lost."""
    out = run(frame(6), "facts", prompt="Extract: {text}", output=FACTS)
    view = llmledger.review(store, "messages", "facts", by="ana")
    send(view, "a")  # row 0 accepted
    send(view, "afwrong yaer\x08\x08")  # row 1: a flag, its reason still being typed ...
    send(view, "afwrong y")  # ... two backspaces and one more (the browser sent the value, not the keys) ...
    send(view, "afwrong year\naa")  # ... "ear", Enter, and rows 2 and 3 accepted, in one update
    assert view.session.key == 4 and view.mode == "key"
    send(view, "afwrong year\naac\n1999\n")  # row 4: company kept, year 1999
    send(view, "afwrong year\naac\n1999\nX")  # not a key; nothing else replayed
    assert "not a key" in view.message.value and view.session.key == 5
    send(view, "")  # everything selected and deleted: nothing to act on
    send(view, "s")  # then a skip typed into the empty box
    assert view.session.key is None and "5 reviewed, 1 left" in view.header.value, "row 5 skipped"
    assert given(store, "facts") == [
        (0, "accept", None),
        (1, "flag", "wrong year"),
        (2, "accept", None),
        (3, "accept", None),
        (4, "correct", None),
    ]
    assert sql(store, "SELECT facts.company, facts.year FROM messages WHERE id = 4") == [
        (out["facts"][4]["company"], 1999)
    ]


def test_a_typed_answer_is_corrected_field_by_field_and_a_bad_value_shows_the_error_and_stays(
    run: Any, store: Path
) -> None:
    out = run(frame(3), "facts", prompt="Extract: {text}", output=FACTS)
    view = llmledger.review(store, "messages", "facts", by="bo")
    assert 'data-field="company"' in view.body.value and 'data-field="year"' in view.body.value
    press(view, "c")
    assert "company" in view.prompt.value and "field 1 of 2" in view.prompt.value
    press(view, "Acme\nlast year\n")  # year is an integer: refused, nothing written, still correcting
    assert view.mode == "correct" and view.session.key == 0 and "output schema" in view.message.value
    assert verdicts(store).height == 0
    press(view, "\n1999\n")  # Enter keeps company ("Acme"), then a year that fits
    assert view.mode == "key" and view.session.key == 1
    assert out["facts"][0] != {"company": "Acme", "year": 1999}
    assert sql(store, "SELECT facts.company, facts.year, facts_source FROM messages WHERE id = 0") == [
        ("Acme", 1999, "person")
    ]
    assert given(store, "facts") == [(0, "correct", None)]
    press(view, "u")  # the correction is taken back: the model's answer shows again
    assert view.session.key == 0 and sql(store, "SELECT facts_source FROM messages WHERE id = 0") != [("person",)]
    assert given(store, "facts") == []


def test_the_needs_queue_puts_needs_review_failed_and_flagged_rows_before_done_ones(
    run: Any, sim: Any, store: Path
) -> None:
    sim.configure(refuse="number 7")
    run(frame(8), "summary", prompt=PROMPT, validate=lambda row, out: "too short" if row["id"] == 5 else None)
    llmledger.flag(store, "messages", "summary", where="id = 6", reason="wrong")
    llmledger.accept(store, "messages", "summary", key=2)
    llmledger.reset(store, "messages", "summary", where="id = 1")  # NOT_STARTED: nothing to review
    keys = llmledger.review(store, "messages", "summary").session.keys
    assert sql(store, "SELECT summary_status FROM messages WHERE id = 7") == [("FAILED",)]
    assert keys == [5, 7, 6, 0, 3, 4], "NEEDS_REVIEW, FAILED, flagged, then DONE rows no one judged; no accepted row"
    assert llmledger.review(store, "messages", "summary", where="id > 3").session.keys == [5, 7, 6, 4]


def test_a_row_stale_because_the_step_it_reads_answered_anew_needs_review(run: Any, store: Path) -> None:
    """Found in a review: only a row's own changed request made it stale in the queue, not a new upstream answer."""
    run(frame(4), "summary", prompt=PROMPT)
    run(frame(4), "title", prompt="Title for: {summary}")
    llmledger.correct(store, "messages", "summary", key=2, answer="a person's summary")  # title of row 2 is stale now
    view = llmledger.review(store, "messages", "title")
    assert view.session.keys == [2, 0, 1, 3] and view.session.row().stale


def test_a_failed_row_comes_first_and_a_disagreeing_row_before_agreeing_ones(
    client: Any, sim: Any, store: Path
) -> None:
    df = frame(4)
    llmledger.apply_llm(df, "a", prompt=PROMPT, client=client, store=store, table="messages", progress=False)
    llmledger.apply_llm(df, "b", prompt=PROMPT, client=client, store=store, table="messages", progress=False)
    llmledger.correct(store, "messages", "b", key=2, answer="something else entirely")
    keys = llmledger.review(store, "messages", "a", compare_with=["b"]).session.keys
    assert keys == [2, 0, 1, 3], "the row where b answers otherwise first"
    view = llmledger.review(store, "messages", "a", compare_with=["b"])
    assert "something else entirely" in view.body.value, "the other step's answer is shown beside"


def test_a_sample_is_seeded_sized_by_the_margin_and_leaves_out_judged_rows(run: Any, store: Path) -> None:
    run(frame(30), "summary", prompt=PROMPT)
    llmledger.accept(store, "messages", "summary", where="id < 5")
    first = llmledger.review(store, "messages", "summary", queue="sample", sample=10).session.keys
    again = llmledger.review(store, "messages", "summary", queue="sample", sample=10).session.keys
    assert first == again and len(first) == 10 and len(set(first)) == 10 and min(first) >= 5
    assert first != sorted(first), "a random sample, not the first rows"
    other = llmledger.review(store, "messages", "summary", queue="sample", sample=10, seed=1).session.keys
    assert other != first
    assert sample_size(0.05) == 385 and sample_size(0.2) == 25
    wide = llmledger.review(store, "messages", "summary", queue="sample", margin=0.2).session.keys
    assert len(wide) == 25
    assert len(llmledger.review(store, "messages", "summary", queue="sample", margin=0.05).session.keys) == 25
    with pytest.raises(llmledger.InvalidInputError, match="not both"):
        llmledger.review(store, "messages", "summary", queue="sample")
    with pytest.raises(llmledger.InvalidInputError, match="queue='sample'"):
        llmledger.review(store, "messages", "summary", sample=3)


def test_redo_flagged_from_the_view_redoes_the_flagged_rows_and_they_come_back(
    run: Any, sim: Any, client: Any, store: Path
) -> None:
    run(frame(5), "summary", prompt=PROMPT)
    view = llmledger.review(store, "messages", "summary", by="ana", client=client)
    press(view, "fbad\nafworse\n")  # rows 0 and 2 flagged, 1 accepted
    paid = sim.stats()["paid"]
    press(view, "r")  # found in a review: one stray `r` spent money; it asks for a second now
    assert view.run is None and "r again to re-send the 2 flagged rows (paid)" in view.message.value
    press(view, "xr")  # any other key in between: not sent
    assert view.run is None and sim.stats()["paid"] == paid
    press(view, "r")
    assert view.run is not None
    view.run.wait(60)
    for _ in range(100):  # the view puts them back once the run has ended (a thread waits for it)
        if view.session.keys[3:5] == [0, 2]:
            break
        import time

        time.sleep(0.05)
    with view._lock:  # the thread puts them back, then draws the view, under it: once taken here, both are done
        pass
    assert sim.stats()["paid"] == paid + 2, "exactly the flagged rows are paid for"
    assert view.session.keys == [0, 1, 2, 0, 2, 3, 4] and view.session.key == 0
    assert "1 reviewed, 4 left" in view.header.value, "each row counted once, a redone one too"
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_flag IS NOT NULL") == [(0,)]


def test_the_terminal_twin_reads_one_key_per_line(run: Any, store: Path, capsys: Any) -> None:
    run(frame(5), "summary", prompt=PROMPT)
    script = "a\nf\nnot what it says\ns\nc\na person's summary\nu\nc\nmine\nq\n"
    out = io.StringIO()
    session = Session(store, "messages", "summary", by="cy")
    tally = review_in_terminal(session, stdin=io.StringIO(script), stdout=out)
    assert given(store, "summary") == [(0, "accept", None), (1, "flag", "not what it says"), (3, "correct", None)]
    assert sql(store, "SELECT summary FROM messages WHERE id = 3") == [("mine",)]
    assert tally["reviewed"] == 3
    text = out.getvalue()
    assert "a accept · f flag" in text and "hello message number 0" in text and "undone: correct" in text


def test_the_cli_verb_reviews_from_stdin(run: Any, store: Path, monkeypatch: Any, capsys: Any) -> None:
    from llmledger.cli import main

    run(frame(4), "summary", prompt=PROMPT)
    monkeypatch.setattr("sys.stdin", io.StringIO("a\na\nf\nwrong\n"))
    main(["review", str(store), "--sample", "3", "--by", "dee"])
    found = verdicts(store, "messages", "summary")
    assert found["verdict"].to_list() == ["accept", "accept", "flag"] and set(found["reviewer"]) == {"dee"}
    assert "review messages.summary: 3 reviewed, 0 left" in capsys.readouterr().out


def test_a_background_run_is_reviewed_by_passing_it(sim: Any, client: Any, store: Path) -> None:
    """From a Run: its store, table and step; its client redoes the flagged rows."""
    started = llmledger.apply_llm(frame(3), "summary", prompt=PROMPT, store=store, table="messages", client=client,
                                  background=True, progress=False)  # fmt: skip
    started.wait(60)
    view = llmledger.review(started, by="ana")
    press(view, "af")
    press(view, "no\nrr")
    view.run.wait(60)
    assert given(store, "summary") == [(0, "accept", None), (1, "flag", "no")]
    assert sim.stats()["paid"] == 4, "the flagged row again, through the run's client"
    with pytest.raises(llmledger.InvalidInputError, match=r"review\(\) needs the table and the step"):
        llmledger.review(store)


def test_redo_flagged_from_the_view_pays_for_the_rows_it_announced_and_no_others(
    run: Any, sim: Any, client: Any, store: Path
) -> None:
    """Found in an attack: r r ran redo='flagged', which also sends rows never answered (here 4, left unsent by
    where=; in the attack 45 a budget had stopped), after announcing 2; and a single r after a redo paid."""
    run(frame(8), "summary", prompt=PROMPT, where="id < 4")  # rows 4-7 recorded, not answered
    view = llmledger.review(store, "messages", "summary", by="ana", client=client)
    press(view, "r")
    assert "no flagged row to redo" in view.message.value and not view.armed
    press(view, "fa\nfb\n")  # rows 0 and 1 flagged
    paid = sim.stats()["paid"]
    press(view, "r")
    assert "r again to re-send the 2 flagged rows (paid)" in view.message.value
    press(view, "r")
    view.run.wait(60)
    for _ in range(100):
        if "redone rows are back" in view.message.value:
            break
        import time

        time.sleep(0.05)
    assert sim.stats()["paid"] == paid + 2, "the two flagged rows, no others"
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'NOT_STARTED'") == [(4,)]
    assert not view.armed
    llmledger.flag(store, "messages", "summary", where="id = 2", reason="a colleague")
    press(view, "r")
    assert view.run.done and sim.stats()["paid"] == paid + 2, "one r after the redo ended only asks"
    assert "r again to re-send the 1 flagged row (paid)" in view.message.value


def test_reviewing_a_store_that_is_not_there_says_so(tmp_path: Path) -> None:
    """Found in an attack: "table 'm' has no step 's'; it has: no steps"."""
    with pytest.raises(llmledger.StoreNotFound):
        llmledger.review(tmp_path / "none.duckdb", "m", "s")
    assert not (tmp_path / "none.duckdb").exists()


def test_a_database_that_holds_no_ledger_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """Found in an attack: `history` on a DuckDB file of the user's own created llmledger's tables in it, then
    said "no step"; reviewing it did the same."""
    import duckdb

    mine = tmp_path / "mine.duckdb"
    with duckdb.connect(str(mine)) as con:
        con.execute("CREATE TABLE foo AS SELECT 1 AS x")
    for read in (lambda: llmledger.history(mine, "foo", "s"), lambda: llmledger.review(mine, "foo", "s")):
        with pytest.raises(llmledger.StoreNotFound, match=r"no ledger in store .*mine\.duckdb"):
            read()
    assert sql(mine, "SELECT table_name FROM information_schema.tables") == [("foo",)]


def test_a_row_deleted_after_the_queue_was_made_is_skipped_not_the_end(run: Any, store: Path) -> None:
    """Found in an attack: a row deleted under the view made it say the queue was done, rows still left."""
    run(frame(4), "summary", prompt=PROMPT)
    view = llmledger.review(store, "messages", "summary", by="ana")
    llmledger.sql(store, "DELETE FROM messages WHERE id IN (1, 3)", write=True)
    press(view, "aa")  # row 0, then row 2: 1 is gone
    assert given(store, "summary") == [(0, "accept", None), (2, "accept", None)]
    assert view.session.key is None and "2 reviewed, 0 left" in view.header.value, view.header.value


def test_a_pdf_shows_its_name_pages_and_first_pages_text(run: Any, store: Path, tmp_path: Path) -> None:
    from llmledger.simulator.samples import pdf

    doc = tmp_path / "invoice.pdf"
    doc.write_bytes(pdf(["ACME Corp invoice 2024\nTotal 120 EUR", "Terms and conditions"]))
    df = pl.DataFrame({"id": [1], "question": ["Who sent it?"], "path": [str(doc)]})
    run(df, "who", prompt="{question}", attach="path")
    body = llmledger.review(store, "messages", "who").body.value
    shown = body[body.index('class="llmledger-pdf"') :].split("</div></div>")[0]
    assert "invoice.pdf</b> · 2 pages" in shown and "ACME Corp invoice 2024" in shown
    assert "Terms and conditions" not in shown, "the first page only"


def test_rows_of_a_frame_and_a_runs_own_rows_are_the_ones_reviewed(run: Any, client: Any, store: Path) -> None:
    """The issue's "from a Run/frame": rows= narrows the review to a frame's keys; a Run brings its own frame."""
    run(frame(10), "summary", prompt=PROMPT)
    picked = frame(10).filter(pl.col("id").is_in([7, 2, 5]))
    assert llmledger.review(store, "messages", "summary", rows=picked).session.keys == [2, 5, 7]
    assert llmledger.review(store, "messages", "summary", rows=picked.to_pandas(), where="id > 3").session.keys == [
        5,
        7,
    ]
    started = llmledger.apply_llm(frame(10).head(4), "summary", prompt=PROMPT, store=store, table="messages",
                                  client=client, background=True, progress=False)  # fmt: skip
    started.wait(60)
    assert llmledger.review(started).session.keys == [0, 1, 2, 3]
    with pytest.raises(llmledger.InvalidInputError, match=r"rows= is a frame with the key column\(s\) of table"):
        llmledger.review(store, "messages", "summary", rows=picked.select("text"))
    with pytest.raises(llmledger.InvalidInputError, match="names no row"):
        llmledger.review(store, "messages", "summary", rows=picked.clear())


def test_text_that_merely_ends_like_a_file_name_is_shown_as_text(run: Any, store: Path) -> None:
    """Found in an attack: a long message ending "see invoice.pdf" (ENAMETOOLONG) or "~notes.pdf" (no such user's
    home) broke the view."""
    long = "Customer writes: charged twice " * 10 + "see invoice.pdf"
    df = pl.DataFrame({"id": [1, 2, 3], "text": [long, "~notes.pdf", "~nosuchuser_zz/pic.png"]})
    run(df, "summary", prompt=PROMPT)
    view = llmledger.review(store, "messages", "summary")
    bodies = [view.body.value]
    for _ in range(2):
        press(view, "a")
        bodies.append(view.body.value)
    assert "see invoice.pdf" in bodies[0] and "~notes.pdf" in bodies[1] and "~nosuchuser_zz/pic.png" in bodies[2]


def test_a_verdict_lands_only_on_the_answer_shown_on_both_engines(client: Any, sim: Any, target: Any) -> None:
    """Found in an attack: the view sent only a row's key, so an answer replaced while it was on screen (a
    colleague's redo, the row deleted and recorded anew) took a verdict nobody gave it. Now the verdict is refused,
    nothing is written, and the row is read again: the next key judges what is shown then."""
    sim.configure(resample=True)  # a redo draws another answer
    common: dict[str, Any] = dict(prompt=PROMPT, client=client, store=target, table="messages", progress=False)
    llmledger.apply_llm(frame(4), "summary", **common)
    session = Session(target, "messages", "summary", by="ana")
    shown = session.row()
    assert session.key == 0 and shown is not None
    llmledger.apply_llm(frame(4), "summary", redo=True, where="id = 0", **common)  # a colleague's redo
    with pytest.raises(llmledger.InvalidInputError, match="has another answer or other inputs since it was shown"):
        session.accept()
    assert verdicts(target).is_empty() and session.key == 0
    now = session.row()
    assert now is not None and now.answer != shown.answer, "the view shows the new answer"
    session.accept()  # judged as shown now
    assert verdicts(target).select("row_key", "answer").rows() == [('{"id":0}', now.answer)]

    assert session.key == 1 and session.row() is not None  # row 1 on screen, then deleted and recorded anew
    llmledger.sql(target, "DELETE FROM messages WHERE id = 1", write=True)
    llmledger.apply_llm(frame(1, start=1, word="other"), "summary", **common)
    with pytest.raises(llmledger.InvalidInputError, match="has another answer"):
        session.flag("too long")
    assert session.row() is not None and "other message" in str(session.row().inputs)  # type: ignore[union-attr]

    session.next()  # row 2 on screen, then deleted: refused, and the next look skips it
    assert session.key == 2 and session.row() is not None
    llmledger.sql(target, "DELETE FROM messages WHERE id = 2", write=True)
    with pytest.raises(llmledger.InvalidInputError, match="is gone since it was shown"):
        session.correct("a person's summary")
    assert session.row() is not None and session.key == 3
    assert verdicts(target).height == 1, "only the verdict given on an answer shown"


def test_a_table_dropped_under_an_open_view_is_said_so(run: Any, store: Path, capsys: Any) -> None:
    """Found in an attack: the next key raised DuckDB's own CatalogException out of the widget."""
    run(frame(3), "summary", prompt=PROMPT)
    view = llmledger.review(store, "messages", "summary", by="ana")
    llmledger.sql(store, "DROP TABLE messages", write=True)
    press(view, "a")
    assert "table &#x27;messages&#x27; is no longer in the store" in view.message.value, view.message.value
    assert "start the review again" in view.body.value and given(store, "summary") == []


def test_in_the_view_keys_never_judge_an_answer_that_was_not_drawn(client: Any, sim: Any, store: Path) -> None:
    """Found in an attack on the check above, each on the view: keys sent in one burst after a refused one judged
    the answer that replaced it; a flag's reason typed while the row was redone flagged the new answer; and a row
    recorded anew with other text (its answer kept, stale) took a verdict for text no one saw."""
    sim.configure(resample=True)
    common: dict[str, Any] = dict(prompt=PROMPT, client=client, store=store, table="messages", progress=False)
    llmledger.apply_llm(frame(3), "summary", **common)
    view = llmledger.review(store, "messages", "summary", by="ana")

    def redo(key: int) -> None:
        llmledger.apply_llm(frame(3), "summary", redo=True, where=f"id = {key}", **common)

    redo(0)
    send(view, "aa")  # two keys in one update, both typed before the new answer was drawn
    assert "has another answer" in view.message.value and given(store, "summary") == [], view.message.value
    assert view.session.key == 0 and str(view.session.row().answer) in view.body.value  # type: ignore[union-attr]
    press(view, "k")  # a key that judges nothing: the redraw says the answer changed on screen
    redo(0)
    press(view, "k")
    assert "changed while it was on screen" in view.message.value, view.message.value
    press(view, "a")
    assert given(store, "summary") == [(0, "accept", None)]

    press(view, "f")  # row 1: a flag's reason is being typed while a colleague redoes the row
    redo(1)
    press(view, "too long\n")
    assert "has another answer" in view.message.value and len(given(store, "summary")) == 1
    assert view.mode == "key" and view.session.key == 1

    llmledger.apply_llm(frame(1, start=1, word="other"), "summary", **common)  # recorded anew, answer kept: stale
    press(view, "a")
    assert "other inputs" in view.message.value and len(given(store, "summary")) == 1
    assert "other message number 1" in view.body.value
    press(view, "a")  # now judged as shown
    assert given(store, "summary") == [(0, "accept", None), (1, "accept", None)]


def test_a_typed_correction_begun_on_an_answer_since_redone_is_refused_and_ended(
    client: Any, sim: Any, store: Path
) -> None:
    """Found in an attack: Enter to keep each field wrote the old answer's values as a correction of the new one."""
    sim.configure(resample=True)
    common: dict[str, Any] = dict(prompt="Extract: {text}", output=FACTS, client=client, store=store,
                                  table="messages", progress=False)  # fmt: skip
    llmledger.apply_llm(frame(2), "facts", **common)
    view = llmledger.review(store, "messages", "facts", by="bo")
    press(view, "c")
    llmledger.apply_llm(frame(2), "facts", redo=True, where="id = 0", **common)
    press(view, "\n\n")  # keep both fields
    assert "has another answer" in view.message.value and view.mode == "key" and view.draft == {}
    assert given(store, "facts") == [] and view.session.key == 0


def _redo_ended(view: Any) -> None:
    """Wait for the view's redo, then for its thread to put the rows back and draw (under the view's lock)."""
    view.run.wait(60)
    view._after.join(60)


def test_a_verdict_judges_the_answer_last_drawn_even_after_moves_in_one_burst(
    client: Any, sim: Any, store: Path
) -> None:
    """Found in an attack: on row 1, with row 0 redone by a colleague, the keys `ka` sent at once accepted row 0's
    new answer, never drawn. A row drawn before is judged as drawn; one typed ahead to, never drawn, as it is."""
    sim.configure(resample=True)
    common: dict[str, Any] = dict(prompt=PROMPT, client=client, store=store, table="messages", progress=False)
    llmledger.apply_llm(frame(3), "summary", **common)
    view = llmledger.review(store, "messages", "summary", by="ana")
    press(view, "j")  # row 1 drawn
    llmledger.apply_llm(frame(3), "summary", redo=True, where="id = 0", **common)
    send(view, view.box.value + "ka")
    assert "has another answer" in view.message.value and given(store, "summary") == []
    send(view, view.box.value + "aa")  # row 0 now drawn as it is: accepted; row 1, drawn before, unchanged
    assert given(store, "summary") == [(0, "accept", None), (1, "accept", None)]


def test_the_views_redo_coming_back_mid_correction_keeps_the_row_being_corrected(
    client: Any, sim: Any, store: Path
) -> None:
    """Found in an attack: the view's own "redo flagged" ending while a correction was typed swapped the row under
    it, and Enter wrote the old answer's values as a correction of the row just redone."""
    sim.configure(resample=True, latency=0.5)
    common: dict[str, Any] = dict(prompt="Extract: {text}", output=FACTS, client=client, store=store,
                                  table="messages", progress=False)  # fmt: skip
    first = llmledger.apply_llm(frame(4), "facts", **common)
    view = llmledger.review(store, "messages", "facts", by="bo", client=client)
    press(view, "f\n")  # row 0 flagged
    press(view, "rr")  # its redo runs in the background ...
    press(view, "c")  # ... while row 1's correction is begun
    _redo_ended(view)
    assert view.mode == "correct" and view.session.key == 1, "the row being corrected stays"
    press(view, "\n\n")  # both fields kept: row 1 corrected with its own values
    assert given(store, "facts")[-1] == (1, "correct", None)
    assert sql(store, "SELECT facts.year FROM messages WHERE id = 1") == [(first["facts"][1]["year"],)]
    assert view.session.key == 0, "the redone row comes next"

    press(view, "f\n")  # row 0 flagged again, then back to it, redone while its correction is begun
    press(view, "k")
    assert view.session.key == 0
    press(view, "rr")
    press(view, "c")
    _redo_ended(view)
    press(view, "\n\n")
    assert "has another answer" in view.message.value and view.mode == "key", view.message.value
    assert [v for k, v, _ in given(store, "facts") if k == 0] == ["flag", "flag"], "no correction of the new answer"
