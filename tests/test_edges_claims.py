"""Who holds a claim, at the edges: a dead run whose PID the system gave to another process is seen as dead (its
rows are taken back, its journal merged), `reset(running=True)` takes back the rows of a holder that is gone,
never those of one that runs, and a claim is judged by its own lease in the database's clock, not by the
taker's clock and stale_after. Each case failed on 0.6.0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm
from llmledger._ledger.claims import host_name, process_start
from llmledger._ledger.columns import STEP_COLUMNS
from llmledger._ledger.journal import journal_folder
from llmledger._ledger.postgres import is_url, journal_base
from llmledger._time import utcnow
from llmledger.simulator import default_reply

from .conftest import frame

PROMPT = "Summarize: {text}"


@pytest.fixture
def other_process() -> Any:
    """A live process of this host: the PID a dead run's claim names after the system reused it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _claim_all(target: Any, holder: str, *, minutes_ago: float = 0.0) -> None:
    """Mark every row of step s RUNNING under `holder`, claimed `minutes_ago` (as a run would have)."""
    at = f"TIMESTAMP '{utcnow():%Y-%m-%d %H:%M:%S}' - INTERVAL '{int(minutes_ago * 60)} seconds'"
    llmledger.sql(target, f"UPDATE t SET s_status = 'RUNNING', s_claimed_from = s_status, s_claimed_by = "
                          f"'{holder}', s_running_started_at = {at}")


def _journal(target: Any, holder: str, rows: list[dict[str, Any]]) -> Path:
    base = journal_base(target) if is_url(target) else Path(target)
    folder = journal_folder(base)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"t.s.1.{holder.replace('/', '~')}.jsonl"
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_dead_runs_pid_reused_by_another_process_does_not_freeze_its_rows(
        target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(6), "s", prompt=PROMPT, **common)
    fields = {c.result: "s" + c.suffix for c in STEP_COLUMNS if c.result}
    answered = llmledger.sql(target, f"SELECT id, {', '.join(f'{col} AS {res}' for res, col in fields.items())} "
                                     "FROM t ORDER BY id").to_dicts()
    llmledger.reset(target, "t", "s", where="true")
    started = process_start(other_process.pid)
    assert started is not None, "this test needs /proc"
    # the dead run started long before the process that has its PID now
    holder = f"{host_name()}/{other_process.pid}/deadbeef0001-{int(started) - 1000}"
    _claim_all(target, holder)
    journal = _journal(target, holder, answered[:4])
    paid = sim.stats()["paid"]
    out = apply_llm(frame(6), "s", prompt=PROMPT, **common)
    assert out["s_status"].to_list() == ["DONE"] * 6
    assert out["s"].to_list() == [default_reply(f"Summarize: {t}") for t in frame(6)["text"]]
    assert sim.stats()["paid"] - paid == 2, "the journal's 4 answers were merged; the 2 others asked again"
    assert not journal.exists()


def test_a_claim_of_a_live_process_with_its_own_start_time_is_still_left_alone(
        target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(4), "s", prompt=PROMPT, where="false", **common)
    _claim_all(target, f"{host_name()}/{other_process.pid}/deadbeef0002-{process_start(other_process.pid)}",
               minutes_ago=600)
    apply_llm(frame(4), "s", prompt=PROMPT, **common)
    assert sim.stats()["paid"] == 0, "a holder that runs on this host keeps its rows, however old its claim"
    assert llmledger.reset(target, "t", "s", where="true", running=True) == 0


def test_reset_running_takes_back_rows_of_a_holder_that_is_gone_and_only_those(
        target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(6), "s", prompt=PROMPT, where="false", **common)
    dead = f"{host_name()}/{other_process.pid}/deadbeef0003-1"  # its PID now another process's
    alive = f"{host_name()}/{other_process.pid}/deadbeef0004-{process_start(other_process.pid)}"
    elsewhere_old, elsewhere_new = "another-host/12/deadbeef0005-9", "another-host/13/deadbeef0006-9"
    for ids, holder, minutes in (("0, 1", dead, 0), ("2", alive, 0), ("3", elsewhere_old, 90),
                                 ("4", elsewhere_new, 1)):
        llmledger.sql(target, f"UPDATE t SET s_status = 'RUNNING', s_claimed_from = 'NOT_STARTED', s_claimed_by = "
                              f"'{holder}', s_running_started_at = TIMESTAMP '{utcnow():%Y-%m-%d %H:%M:%S}' - "
                              f"INTERVAL '{minutes * 60} seconds' WHERE id IN ({ids})")
    assert llmledger.reset(target, "t", "s", where="true") == 1, "without running=True only row 5 is reset"
    assert llmledger.reset(target, "t", "s", where="true", running=True) == 4  # rows 0, 1, 3 and 5 again
    statuses = dict(llmledger.sql(target, "SELECT id, s_status FROM t ORDER BY id").rows())
    assert statuses == {0: "NOT_STARTED", 1: "NOT_STARTED", 2: "RUNNING", 3: "NOT_STARTED", 4: "RUNNING",
                        5: "NOT_STARTED"}
    done = subprocess.run([sys.executable, "-m", "llmledger", "reset", str(target), "--table", "t", "--step", "s",
                           "--where", "true", "--running", "--stale-after", "30"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "reset: 5 rows" in done.stdout, done.stdout + done.stderr
    assert dict(llmledger.sql(target, "SELECT id, s_status FROM t ORDER BY id").rows())[4] == "NOT_STARTED"


# -- leases --------------------------------------------------------------------------------------------------------
def _ledger_params(**changes: Any) -> Any:
    from llmledger._ledger import RunParams
    from llmledger._ledger.states import Redo

    now = utcnow()
    base = {"max_attempts": 2, "redo": Redo.NONE, "run_started": now, "stale_before": now - timedelta(minutes=30)}
    return RunParams(**{**base, **changes})


def _claimed(target: Any, lease: timedelta) -> Any:
    """A ledger in which a live run (another host's, so only its lease speaks for it) claimed every row."""
    from llmledger._ledger import StepDefinition, open_ledger
    from llmledger._prompt import plan_prompt
    from llmledger._request import RequestSpec

    df = pl.DataFrame({"id": [1, 2, 3, 4], "text": ["a", "b", "c", "d"]})
    ledger = open_ledger(target)
    definition = StepDefinition(table="t", step="s", key=["id"], request=RequestSpec(model="m", max_tokens=5),
                                prompt=plan_prompt("Say {text}", df))
    selection = ledger.prepare(definition, df, _ledger_params(lease=lease), dedupe=True)
    assert len(ledger.claim(selection, 10, claimant="another-host/7/feedfeed0001-5", now=utcnow())) == 4
    return ledger, selection


def test_a_worker_with_a_fast_clock_or_a_short_stale_after_leaves_a_live_claim_alone(target: Any) -> None:
    """The holder's lease is 30 minutes, renewed in time; a worker whose clock runs 32 minutes fast and whose own
    stale_after is 10 s would judge the claim dead by its own measures. It is judged by the claim's own lease."""
    ledger, selection = _claimed(target, timedelta(minutes=30))
    skewed = utcnow() + timedelta(minutes=32)
    assert ledger.recover("t", "s", _ledger_params(run_started=skewed,
                                                   stale_before=skewed - timedelta(seconds=10))) == 0
    ledger.renew(selection, claimant="another-host/7/feedfeed0001-5", now=utcnow())
    assert ledger.recover("t", "s", _ledger_params(run_started=skewed,
                                                   stale_before=skewed - timedelta(seconds=10))) == 0
    assert ledger.counts("t").select("RUNNING").item() == 4


def test_a_claim_whose_own_lease_lapsed_is_taken_back_by_a_worker_with_a_longer_one(target: Any) -> None:
    ledger, _ = _claimed(target, timedelta(seconds=1))
    time.sleep(1.5)
    assert ledger.recover("t", "s", _ledger_params()) == 4, "its 1 s lease lapsed, whatever the taker's is"
    assert ledger.counts("t").select("NOT_STARTED").item() == 4
