"""The CLI: `llmledger status` and `llmledger demo`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from llmledger import Simulator

from .conftest import frame, subprocess_env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmledger", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_status_counts_each_status_and_shows_failed_rows(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 4")
    run(frame(9), "summary", prompt="Summarize: {text}")
    run(frame(12), "title", prompt="Title: {text}", where="id < 3")
    result = _cli("status", str(store))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    summary_row = next(line for line in lines if "summary" in line and "│" in line)
    title_row = next(line for line in lines if "title" in line and "│" in line)
    # columns: table, step, NOT_STARTED, RUNNING, SUBMITTED, DONE, FAILED, NEEDS_REVIEW, stale, waiting, total
    assert _cells(summary_row) == ["messages", "summary", "3", "0", "0", "8", "1", "0", "0", "0", "12"]
    assert _cells(title_row) == ["messages", "title", "9", "0", "0", "3", "0", "0", "0", "0", "12"]
    assert "messages.summary: first 1 FAILED / NEEDS_REVIEW rows" in result.stdout
    assert '{"id":4}  FAILED  400 BadRequestError' in result.stdout


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("│").split("┆")]


def test_status_of_a_missing_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = _cli("status", str(tmp_path / "nope.duckdb"))
    assert missing.returncode == 2 and "no store at" in missing.stderr
    (tmp_path / "x.txt").write_text("hello")
    foreign = _cli("status", str(tmp_path / "x.txt"))
    assert foreign.returncode == 2 and "not a DuckDB database file" in foreign.stderr


def test_demo_runs_offline_and_shows_the_second_run_paying_nothing(tmp_path: Path) -> None:
    env = subprocess_env("http://127.0.0.1:9")  # never used: the demo starts its own simulator
    env.pop("ANTHROPIC_BASE_URL")
    result = _cli("demo", "--rows", "300", "--store", str(tmp_path / "demo.duckdb"), env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ANTHROPIC_API_KEY is not set: using llmledger's offline simulator" in out
    runs = [tuple(int(n.replace(",", "")) for n in re.findall(r"paid ([\d,]+) calls; ([\d,]+) rows reused", line)[0])
            for line in out.splitlines() if line.startswith("-> this run paid")]
    first, second, third = runs
    assert sum(first) == 297 and first[1] > 0, "297 good rows; duplicate reviews reuse one answer"
    assert second == (0, 0)
    assert sum(third) == 3
    assert "nothing was paid twice" in out
