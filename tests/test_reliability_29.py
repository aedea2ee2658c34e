"""Issue 29 §4: a burst of Ctrl-C, a failed redo of flagged answers, an online call beside a running batch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

import llmledger
from llmledger import Simulator

from .conftest import HELPERS, frame, sigint_as_a_terminal_sends_it, sql, subprocess_env


@pytest.mark.slow
def test_a_burst_of_ctrl_c_leaves_the_process_able_to_run_again(store: Path) -> None:
    """30 foreground calls (10 on the lowest versions), each under a burst of SIGINTs (at its start, mid-run,
    during the wind-down after the first one, as it ends), then one more call in the same process over all their
    rows: it finishes, in time, with every row done and none paid twice."""
    rows, rounds = 4, 5 * int(os.environ.get("LLMLEDGER_TEST_SEEDS", "6"))  # random storms: 30, 10 on the floors
    with Simulator(latency=0.1) as sim:
        proc = subprocess.run(
            [sys.executable, str(HELPERS / "sigint_storm.py"), str(store), str(rows), str(rounds), "29", "60"],
            env=subprocess_env(sim.base_url),
            capture_output=True,
            text=True,
            timeout=240,
            preexec_fn=sigint_as_a_terminal_sends_it,
        )
        assert proc.returncode == 0 and "last run" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-6000:]
        assert f"statuses {{'DONE': {rows * rounds}}}" in proc.stdout, proc.stdout[-2000:]
        assert sim.stats()["paid"] == rows * rounds, "no answer was paid twice"
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'RUNNING'") == [(0,)]


PROMPT = "Summarize: {text}"


@pytest.mark.parametrize(("max_attempts", "after"), [(3, "FAILED"), (1, "NEEDS_REVIEW")])
def test_a_failed_redo_of_a_flagged_row_drops_the_rejected_answer(
    run, sim: Simulator, store: Path, max_attempts: int, after: str
) -> None:
    first = run(frame(4), "summary", prompt=PROMPT, max_attempts=max_attempts)
    rejected = first.filter(id=2)["summary"].item()
    assert llmledger.flag(store, "messages", "summary", where="id = 2", reason="wrong", by="ana") == 1

    sim.configure(refuse="number 2")
    out = run(frame(4), "summary", prompt=PROMPT, redo="flagged", max_attempts=max_attempts)
    assert sim.stats()["paid"] == 5
    row = out.filter(id=2)
    assert row["summary_status"].item() == after
    assert row["summary"].item() is None, "the answer a person rejected is no row's answer any more"
    stored = sql(
        store,
        "SELECT summary, summary_fingerprint, summary_error LIKE '%refusal%', summary_flag, summary_flagged_by "
        "FROM messages WHERE id = 2",
    )
    assert stored == [(None, None, True, "wrong", "ana")], "the flag stays until a new answer replaces it"
    history = llmledger.history(store, "messages", "summary")
    assert history.select("id", "reason", "old_output", "old_status").rows() == [
        (2, "flagged: wrong", rejected, "DONE")
    ]
    assert history["status"].to_list() == [after]
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_flag IS NOT NULL") == [(1,)]

    sim.configure(refuse=None)
    if after == "FAILED":  # attempts left: a plain rerun asks again
        out = run(frame(4), "summary", prompt=PROMPT, max_attempts=max_attempts)
    else:  # no attempts left: a plain rerun leaves it for review; redo="flagged" still finds it
        run(frame(4), "summary", prompt=PROMPT, max_attempts=max_attempts)
        assert sim.stats()["paid"] == 5
        out = run(frame(4), "summary", prompt=PROMPT, redo="flagged", max_attempts=max_attempts)
    assert sim.stats()["paid"] == 6
    assert out.filter(id=2)["summary_status"].item() == "DONE"
    assert out.filter(id=2)["summary"].item() is not None
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_flag IS NOT NULL") == [(0,)]
    assert llmledger.history(store, "messages", "summary")["reason"].to_list() == ["flagged: wrong"], (
        "a failed try holds no answer: only the rejected one went to the history"
    )


def test_an_online_call_waits_for_a_running_batch_that_holds_its_identical_requests(
    run, sim: Simulator, store: Path
) -> None:
    sim.configure(batch_delay=6.0)  # the batch stays in progress at the simulator for 6 s
    batched = frame(6)
    run(batched, "summary", prompt=PROMPT, mode="batch", wait=False)
    sent = sim.stats()["paid"]
    twins = pl.DataFrame(
        {
            "id": [100, 101, 102, 103],
            "text": ["hello message number 0", "hello message number 1", "hello message number 4", "brand new words"],
        }
    )
    out = run(twins, "summary", prompt=PROMPT)
    online = sim.stats()["paid"] - sim.stats()["batch_paid"] - sent  # the batch may end meanwhile on a slow machine
    assert online == 1, "only the request no batch holds is paid online"
    assert out["summary_status"].to_list() == ["SUBMITTED"] * 3 + ["DONE"]
    report = llmledger.last_report()
    assert report is not None and report.calls == 1 and report.in_batches == 3
    assert "in batches" in str(report) or "batch" in " ".join(report.hints()), str(report)

    deadline = time.monotonic() + 30
    while sim.stats()["batch_paid"] < 6 and time.monotonic() < deadline:  # the batch ends at the simulator
        time.sleep(0.1)
    out = run(twins, "summary", prompt=PROMPT)
    assert out["summary_status"].to_list() == ["DONE"] * 4
    stats = sim.stats()
    assert stats["paid"] - sent == 6 + 1 and stats["batch_paid"] == 6, "the batch's six, one online, nothing more"
    assert stats["batches"] == 1
    answers = dict(sql(store, "SELECT text, summary FROM messages WHERE id < 100"))
    for text, answer in zip(out["text"][:3], out["summary"][:3], strict=True):
        assert answer == answers[text], "each twin has the batch's answer to its request"
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'") == [(10,)]
