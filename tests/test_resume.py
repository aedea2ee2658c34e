"""Finishing a step from the store alone: `llmledger run` and `llmledger.resume()`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, StoreNotFound, apply_llm, last_report
from llmledger.simulator import default_reply

from .conftest import frame, helper_cmd, sigint_as_a_terminal_sends_it, sql, subprocess_env

STEP_COLUMNS = (
    "summary",
    "summary_status",
    "summary_attempts",
    "summary_error",
    "summary_input_tokens",
    "summary_output_tokens",
    "summary_cost_usd",
    "summary_stop_reason",
    "summary_model",
    "summary_fingerprint",
    "summary_request_fingerprint",
    "summary_prompt",
)


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "llmledger", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_a_terminal_sends_it,
    )


def _rows(store: Path, columns: tuple[str, ...] = STEP_COLUMNS) -> pl.DataFrame:
    with duckdb.connect(str(store), read_only=True) as con:
        return con.sql(f"SELECT id, {', '.join(columns)} FROM messages ORDER BY id").pl()


@pytest.mark.slow
def test_llmledger_run_finishes_a_killed_run_from_another_process(store: Path) -> None:
    rows = 300
    with Simulator(latency=0.05) as sim:
        env = subprocess_env(sim.base_url)
        env["ANTHROPIC_API_KEY"] = "test-key"
        notebook = subprocess.Popen(
            helper_cmd(str(store), str(rows), "--concurrency", "4", "--commit-every", "0.2"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        while sim.stats()["paid"] < 60:
            assert notebook.poll() is None, notebook.communicate()
            time.sleep(0.02)
        notebook.send_signal(signal.SIGKILL)  # the kernel is gone
        notebook.wait()

        finisher = _cli("run", str(store), "--table", "messages", "--step", "summary", "--concurrency", "8", env=env)
        out, err = finisher.communicate(timeout=120)
        assert finisher.returncode == 0, err
        assert "messages.summary:" in out and "calls paid" in out

        done = _rows(store)
        assert done["summary_status"].to_list() == ["DONE"] * rows
        texts = [f"hello message number {i}" for i in range(rows)]
        assert done["summary"].to_list() == [default_reply(f"Summarize: {t}") for t in texts], (
            "every row holds the answer to its own request"
        )
        assert (done["summary_fingerprint"] == done["summary_request_fingerprint"]).all()
        repaid = sum(n - 1 for n in sim.paid_prompts().values())
        assert repaid <= 4, "only the requests in flight at the kill were paid twice"

        paid_before = sim.stats()["paid"]
        client = __import__("anthropic").AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
        out_frame = apply_llm(
            frame(rows),
            "summary",
            prompt="Summarize: {text}",
            store=store,
            table="messages",
            client=client,
            progress=False,
        )
        assert sim.stats()["paid"] == paid_before, "rerunning the notebook cell afterwards pays nothing"
        assert out_frame["summary"].to_list() == done["summary"].to_list()


def test_resume_writes_exactly_what_apply_llm_writes(client, sim: Simulator, tmp_path: Path) -> None:
    sim.configure(poison="number 3")
    options = {"system": "Be brief.", "max_tokens": 40, "request_options": {"stop_sequences": ["zzz"]}}
    df = frame(12)
    by_apply, by_resume = tmp_path / "apply.duckdb", tmp_path / "resume.duckdb"
    apply_llm(
        df,
        "summary",
        prompt="Summarize: {text}",
        store=by_apply,
        table="messages",
        client=client,
        progress=False,
        **options,
    )
    sent_by_apply = [r["body"] for r in sim.log()]
    sim.reset_stats()

    apply_llm(
        df,
        "summary",
        prompt="Summarize: {text}",
        store=by_resume,
        table="messages",
        client=client,
        progress=False,
        where="false",
        **options,
    )  # records the step and its requests, sends nothing
    assert sim.stats()["requests"] == 0
    report = llmledger.resume(by_resume, "messages", "summary", client=client, progress=False)
    assert (report.done, report.failed, report.calls) == (11, 1, 11)
    assert last_report() is report
    assert sorted(map(str, (r["body"] for r in sim.log()))) == sorted(map(str, sent_by_apply)), (
        "resume sends the very requests apply_llm sends"
    )
    same = (
        "summary",
        "summary_status",
        "summary_attempts",
        "regexp_replace(summary_error, ' [(]request .*', '')",
        "summary_input_tokens",
        "summary_output_tokens",
        "summary_cost_usd",
        "summary_stop_reason",
        "summary_model",
        "summary_fingerprint",
        "summary_request_fingerprint",
        "summary_prompt",
        "summary_version",
    )
    assert _rows(by_resume, same).equals(_rows(by_apply, same))


def test_resume_sends_only_rows_prepared_for_the_current_definition(run, client, sim: Simulator, store: Path) -> None:
    run(frame(10), "summary", prompt="Summarize: {text}", where="false")
    changed = frame(10).with_columns(pl.when(pl.col("id") < 4).then(pl.lit("edited")).otherwise("text").alias("text"))
    run(changed, "title", prompt="Title: {text}", where="false")  # new inputs: summary's requests are now outdated
    report = llmledger.resume(store, "messages", "summary", client=client, progress=False)
    assert (report.calls, report.unprepared) == (6, 4)
    assert "4 not prepared" in str(report)
    assert any("run apply_llm with the frame" in hint for hint in report.hints())
    assert sql(store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'") == [(6,)]
    assert all(not p.startswith("Summarize: edited") for p in sim.paid_prompts()), "no outdated request was sent"

    run(changed, "summary", prompt="Summarize: {text}")  # apply_llm prepares and sends the rest
    assert sim.stats()["paid"] == 7, "the four edited rows share one identical request"
    assert sim.paid_prompts()["Summarize: edited"] == 1


def test_resume_takes_where_and_redo(run, client, sim: Simulator, store: Path) -> None:
    run(frame(10), "summary", prompt="Summarize: {text}", where="false")
    report = llmledger.resume(store, "messages", "summary", where="id < 3", client=client, progress=False)
    assert report.calls == 3
    report = llmledger.resume(store, "messages", "summary", where="id = 1", redo=True, client=client, progress=False)
    assert report.calls == 1 and sim.paid_prompts()["Summarize: hello message number 1"] == 2


def test_resume_needs_a_step_that_apply_llm_prepared(run, client, store: Path, tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match="no store at"):
        llmledger.resume(tmp_path / "nope.duckdb", "messages", "summary", client=client)
    run(frame(3), "summary", prompt="Summarize: {text}", where="false")
    with pytest.raises(InvalidInputError, match=r"no step 'title' on table 'messages'.*messages\.summary"):
        llmledger.resume(store, "messages", "title", client=client)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_on_llmledger_run_commits_and_releases(run, store: Path, stop: signal.Signals) -> None:
    """SIGTERM (kill, docker, systemd) stops like Ctrl-C: found in an attack, it left rows RUNNING, paid again."""
    run(frame(200), "summary", prompt="Summarize: {text}", where="false")
    with Simulator(latency=0.3) as sim:
        env = subprocess_env(sim.base_url)
        env["ANTHROPIC_API_KEY"] = "test-key"
        proc = _cli("run", str(store), "--table", "messages", "--step", "summary", "--concurrency", "8", env=env)
        while sim.stats()["paid"] < 16:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err
    assert "[interrupted]" in out
    statuses = dict(sql(store, "SELECT summary_status, count(*) FROM messages GROUP BY ALL"))
    assert "RUNNING" not in statuses and statuses["DONE"] >= 16
