"""`llmledger.show(store)` and its text twin `llmledger status`: every step of a store at a glance, on DuckDB
and on PostgreSQL, with a batch still processing, rows another process holds, and failed rows."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest

import llmledger
from llmledger import Simulator
from llmledger._draw import FAILURE_COLOUR, usd
from llmledger._ledger import RunParams, open_ledger
from llmledger._ledger.states import Redo
from llmledger._time import utcnow

from .conftest import frame, subprocess_env

SEGMENT = re.compile(r"data-status='(\w+)' data-count='(\d+)'[^>]*background:(#\w+)")


@pytest.fixture(params=["duckdb", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return request.getfixturevalue("pg_url") if request.param == "postgresql" else str(tmp_path / "show.duckdb")


def bars(html: str) -> dict[str, dict[str, int]]:
    """Each step's segments as drawn: {step: {status: rows}}; asserts each segment's colour is its status's."""
    out = {}
    for body in html.split("<div class='llmledger-step' ")[1:]:
        step = re.match(r"data-table='\w+' data-step='(\w+)'", body).group(1)  # type: ignore[union-attr]
        segments = SEGMENT.findall(body)
        assert all(colour == FAILURE_COLOUR for status, _, colour in segments if status == "FAILED")
        out[step] = {status: int(n) for status, n, _ in segments}
    return out


def test_show_draws_three_steps_a_batch_in_progress_claims_and_failures(
    where: str, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    sim.configure(poison="number 4", batch_delay=3600)
    apply = functools.partial(
        llmledger.apply_llm, frame(12), client=client, store=where, table="messages", progress=False
    )
    apply("summary", prompt="Summarize: {text}")  # row 4 FAILED
    apply("title", prompt="Title for: {summary}", mode="batch", wait=False)  # 11 in a batch; row 4 waits
    apply("lang", prompt="Language of: {text}", where="id < 6")  # row 4 FAILED, rows 6-11 not sent
    ledger = open_ledger(where)  # another process claims three rows of "lang"
    now = utcnow()
    params = RunParams(
        max_attempts=3, redo=Redo.NONE, run_started=now, stale_before=now - timedelta(minutes=30), where="id >= 6"
    )
    selection = ledger.resume("messages", "lang", params, dedupe=False)
    claimed = ledger.claim(selection, 3, claimant="worker-7/4242/r1", now=now)
    assert len(claimed) == 3

    view = llmledger.show(where)
    html = view._repr_html_()
    assert bars(html) == {
        "summary": {"DONE": 11, "FAILED": 1},
        "title": {"SUBMITTED": 11, "waiting": 1},
        "lang": {"DONE": 5, "RUNNING": 3, "FAILED": 1, "NOT_STARTED": 3},
    }
    assert list(bars(html)) == ["summary", "title", "lang"], "a step comes after the step it reads"
    assert html.count("1 rows: 400 BadRequestError (invalid_request_error)") == 2
    assert "<code>{&quot;id&quot;:4}</code>" in html, "each kind of error with a row that has it"
    assert "held by worker-7/4242/r1: 3 rows" in html
    (batch_id,) = llmledger.sql(where, "SELECT batch_id FROM llmledger_batches")["batch_id"]
    assert re.search(rf"{batch_id}  messages.title: 11 rows in 11 requests, in_progress", html)

    text = str(view)
    assert "SUBMITTED 11 · waiting 1" in text and "held by worker-7/4242/r1: 3 rows" in text
    cli = subprocess.run(
        [sys.executable, "-m", "llmledger", "status", where, "--color", "always"],
        env=subprocess_env(sim.base_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "\x1b[35mSUBMITTED\x1b[0m 11" in cli.stdout and "\x1b[31m1 rows: 400 BadRequestError" in cli.stdout

    ledger.release(selection, claimant="worker-7/4242/r1")  # the other process is done; the rest gets sent
    apply("lang", prompt="Language of: {text}")
    assert bars(view.refresh()._repr_html_())["lang"] == {"DONE": 11, "FAILED": 1}, "refresh reads the store again"
    assert "held by" not in str(view)


def test_show_of_a_store_without_steps_or_with_a_bad_argument(tmp_path: Path, client: Any) -> None:
    with pytest.raises(llmledger.StoreNotFound, match="no store at"):
        llmledger.show(tmp_path / "nope.duckdb")
    llmledger.apply_llm(frame(2), "s", prompt="{text}", client=client, store=tmp_path / "one.duckdb", progress=False)
    with pytest.raises(llmledger.InvalidInputError, match="every= is the seconds between redraws"):
        llmledger.show(tmp_path / "one.duckdb", every=0)
    with pytest.raises(llmledger.InvalidInputError, match=r"no table 'other'; its tables: \['ledger'\]"):
        llmledger.show(tmp_path / "one.duckdb", table="other")


def test_show_says_what_was_spent_and_what_the_current_answers_cost(
    client: anthropic.AsyncAnthropic, sim: Simulator, tmp_path: Path
) -> None:
    """Found in a trial: show()/status gave the cost of the current answers only ($0.0210 for 1,452 rows, where the
    runs paid $0.0214 for 1,482 calls), printed small amounts as $0.0000 and unknown ones as $0.0000 too."""
    store = str(tmp_path / "spent.duckdb")
    apply = functools.partial(llmledger.apply_llm, client=client, store=store, table="m", progress=False)
    apply(frame(10), "summary", prompt="Summarize: {text}")
    sim.responder = lambda prompt, system: "another answer to " + prompt
    apply(frame(10), "summary", prompt="Summarize: {text}", where="id < 3", redo=True)  # 3 answers replaced
    ((spent, calls),) = llmledger.sql(store, "SELECT sum(cost_usd), sum(calls) FROM llmledger_runs").rows()
    ((current,),) = llmledger.sql(store, "SELECT sum(summary_cost_usd) FROM m").rows()
    assert calls == 13 and spent > current > 0
    text = str(llmledger.show(store))
    assert f"spent {usd(spent)} on 13 calls; current answers {usd(current)} for 10 paid rows" in text, text
    assert not re.search(r"\$0\.0000(?!\d)", text), "a non-zero amount never reads $0.0000"
    sim.configure(usage=False)  # a server that says nothing of what its answers used: their cost is unknown
    apply(frame(3), "other", prompt="{text}")
    assert "other" in (text := str(llmledger.show(store))) and "spent cost unknown on 3 calls" in text, text
    # found in a trial: the same line said "current answers $0 for 0 paid rows" of three answers of unknown cost
    assert "spent cost unknown on 3 calls; current answers cost unknown for 3 rows" in text, text


def test_dollars_read_with_significant_digits() -> None:
    assert [usd(v) for v in (None, 0, 0.0214, 0.00004234, 1.5, 1234.5)] == [
        "unknown", "$0", "$0.0214", "$0.000042", "$1.50", "$1,234.50"
    ]  # fmt: skip
