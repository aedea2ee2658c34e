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
from llmledger._ledger.columns import STEP_COLUMNS
from llmledger._ledger.engine.postgres import is_url, journal_base
from llmledger._ledger.journal import journal_folder
from llmledger._ledger.liveness import host_name, process_start
from llmledger._time import utcnow
from llmledger.simulator import default_reply

from .conftest import frame, subprocess_env

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
    llmledger.sql(
        target,
        f"UPDATE t SET s_status = 'RUNNING', s_claimed_from = s_status, s_claimed_by = "
        f"'{holder}', s_running_started_at = {at}",
        write=True,
    )


def _journal(target: Any, holder: str, rows: list[dict[str, Any]]) -> Path:
    base = journal_base(target) if is_url(target) else Path(target)
    folder = journal_folder(base)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"t.s.1.{holder.replace('/', '~')}.jsonl"
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_dead_runs_pid_reused_by_another_process_does_not_freeze_its_rows(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen
) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(6), "s", prompt=PROMPT, **common)
    fields = {c.result: "s" + c.suffix for c in STEP_COLUMNS if c.result}
    answered = llmledger.sql(
        target, f"SELECT id, {', '.join(f'{col} AS {res}' for res, col in fields.items())} FROM t ORDER BY id"
    ).to_dicts()
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
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen
) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(4), "s", prompt=PROMPT, where="false", **common)
    _claim_all(
        target, f"{host_name()}/{other_process.pid}/deadbeef0002-{process_start(other_process.pid)}", minutes_ago=600
    )
    apply_llm(frame(4), "s", prompt=PROMPT, **common)
    assert sim.stats()["paid"] == 0, "a holder that runs on this host keeps its rows, however old its claim"
    assert llmledger.reset(target, "t", "s", where="true", running=True) == 0


def test_reset_running_takes_back_rows_of_a_holder_that_is_gone_and_only_those(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator, other_process: subprocess.Popen
) -> None:
    common = {"store": target, "table": "t", "client": client, "progress": False}
    apply_llm(frame(6), "s", prompt=PROMPT, where="false", **common)
    dead = f"{host_name()}/{other_process.pid}/deadbeef0003-1"  # its PID now another process's
    alive = f"{host_name()}/{other_process.pid}/deadbeef0004-{process_start(other_process.pid)}"
    elsewhere_old, elsewhere_new = "another-host/12/deadbeef0005-9", "another-host/13/deadbeef0006-9"
    for ids, holder, minutes in (("0, 1", dead, 0), ("2", alive, 0), ("3", elsewhere_old, 90), ("4", elsewhere_new, 1)):
        llmledger.sql(
            target,
            f"UPDATE t SET s_status = 'RUNNING', s_claimed_from = 'NOT_STARTED', s_claimed_by = "
            f"'{holder}', s_running_started_at = TIMESTAMP '{utcnow():%Y-%m-%d %H:%M:%S}' - "
            f"INTERVAL '{minutes * 60} seconds' WHERE id IN ({ids})",
            write=True,
        )
    assert llmledger.reset(target, "t", "s", where="true") == 1, "without running=True only row 5 is reset"
    assert llmledger.reset(target, "t", "s", where="true", running=True) == 4  # rows 0, 1, 3 and 5 again
    statuses = dict(llmledger.sql(target, "SELECT id, s_status FROM t ORDER BY id").rows())
    assert statuses == {
        0: "NOT_STARTED",
        1: "NOT_STARTED",
        2: "RUNNING",
        3: "NOT_STARTED",
        4: "RUNNING",
        5: "NOT_STARTED",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmledger",
            "reset",
            str(target),
            "--table",
            "t",
            "--step",
            "s",
            "--where",
            "true",
            "--running",
            "--stale-after",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "reset: 5 rows" in done.stdout, done.stdout + done.stderr
    assert dict(llmledger.sql(target, "SELECT id, s_status FROM t ORDER BY id").rows())[4] == "NOT_STARTED"


def test_reset_running_judges_holders_elsewhere_in_the_databases_clock_and_by_their_lease(
    pg_url: str, client: anthropic.AsyncAnthropic, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL claims are written in the server's clock. A person whose machine's clock runs two hours fast
    does not take back a claim renewed a minute ago (0.7.0 compared the claim with the caller's clock); a claim
    whose own lease has lapsed is taken back even when renewed recently, as a worker would take it."""
    import llmledger._ledger.query

    apply_llm(frame(3), "s", prompt=PROMPT, store=pg_url, table="t", client=client, progress=False, where="false")
    for row, holder, lease in (
        (0, "another-host/12/deadbeef0005-9", "10 minutes"),
        (1, "another-host/13/deadbeef0006-9", "-1 seconds"),
    ):
        llmledger.sql(
            pg_url,
            f"UPDATE t SET s_status = 'RUNNING', s_claimed_from = 'NOT_STARTED', s_claimed_by = "
            f"'{holder}', s_running_started_at = (now() AT TIME ZONE 'UTC') - INTERVAL '1 minute', "
            f"s_lease_until = (now() AT TIME ZONE 'UTC') + INTERVAL '{lease}' WHERE id = {row}",
            write=True,
        )
    real = llmledger._ledger.query.utcnow
    monkeypatch.setattr(llmledger._ledger.query, "utcnow", lambda: real() + timedelta(hours=2))
    assert llmledger.reset(pg_url, "t", "s", where="id < 2", running=True, stale_after=timedelta(minutes=30)) == 1
    statuses = dict(llmledger.sql(pg_url, "SELECT id, s_status FROM t ORDER BY id").rows())
    assert statuses == {0: "RUNNING", 1: "NOT_STARTED", 2: "NOT_STARTED"}


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
    from llmledger._step.prompt import plan_prompt
    from llmledger._step.request import RequestSpec

    df = pl.DataFrame({"id": [1, 2, 3, 4], "text": ["a", "b", "c", "d"]})
    ledger = open_ledger(target)
    definition = StepDefinition(
        table="t",
        step="s",
        key=["id"],
        request=RequestSpec(model="m", max_tokens=5),
        prompt=plan_prompt("Say {text}", df),
    )
    selection = ledger.prepare(definition, df, _ledger_params(lease=lease), dedupe=True)
    assert len(ledger.claim(selection, 10, claimant="another-host/7/feedfeed0001-5", now=utcnow())) == 4
    return ledger, selection


def test_a_worker_with_a_fast_clock_or_a_short_stale_after_leaves_a_live_claim_alone(target: Any) -> None:
    """The holder's lease is 30 minutes, renewed in time; a worker whose clock runs 32 minutes fast and whose own
    stale_after is 10 s would judge the claim dead by its own measures. It is judged by the claim's own lease."""
    ledger, selection = _claimed(target, timedelta(minutes=30))
    skewed = utcnow() + timedelta(minutes=32)
    assert (
        ledger.recover("t", "s", _ledger_params(run_started=skewed, stale_before=skewed - timedelta(seconds=10))) == 0
    )
    ledger.renew(selection, claimant="another-host/7/feedfeed0001-5", now=utcnow())
    assert (
        ledger.recover("t", "s", _ledger_params(run_started=skewed, stale_before=skewed - timedelta(seconds=10))) == 0
    )
    assert ledger.counts("t").select("RUNNING").item() == 4


def test_a_claim_whose_own_lease_lapsed_is_taken_back_by_a_worker_with_a_longer_one(target: Any) -> None:
    ledger, _ = _claimed(target, timedelta(seconds=1))
    time.sleep(1.5)
    assert ledger.recover("t", "s", _ledger_params()) == 4, "its 1 s lease lapsed, whatever the taker's is"
    assert ledger.counts("t").select("NOT_STARTED").item() == 4


def test_concurrent_runs_pay_each_duplicate_text_once(
    target: Any, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    """Three `llmledger run` processes share a step of 300 rows with 60 distinct texts, each text's rows spread
    across the table: each text is paid once (0.6 paid texts whose rows two processes claimed at once; on
    DuckDB, also those one process answered after another had selected its rows)."""
    rows = 300
    df = pl.DataFrame({"id": list(range(rows)), "text": [f"text number {(i * 7) % 60}" for i in range(rows)]})
    apply_llm(df, "summary", prompt=PROMPT, store=target, table="m", client=client, where="false", progress=False)
    sim.configure(latency=0.05)
    sim.reset_stats()
    env = subprocess_env(sim.base_url) | {"ANTHROPIC_API_KEY": "test-key"}
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmledger",
                "run",
                str(target),
                "--table",
                "m",
                "--step",
                "summary",
                "--concurrency",
                "4",
                "--quiet",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in runs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    assert llmledger.sql(target, "SELECT count(*) AS n FROM m WHERE summary_status = 'DONE'")["n"][0] == rows
    assert sim.stats()["paid"] == 60, "each distinct text is paid once, whichever process claimed its rows"
