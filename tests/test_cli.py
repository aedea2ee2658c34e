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


def test_status_draws_each_step_with_its_counts_and_errors_by_kind(run, sim: Simulator, store: Path) -> None:
    sim.configure(poison="number 4")
    run(frame(9), "summary", prompt="Summarize: {text}")
    run(frame(12), "title", prompt="Title: {text}", where="id < 3")
    result = _cli("status", str(store))  # not a terminal: no colour
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "\x1b[" not in result.stdout and "messages (12 rows)" in lines
    summary_row = next(line for line in lines if line.strip().startswith("summary"))
    title_row = next(line for line in lines if line.strip().startswith("title"))
    assert "DONE 8 · FAILED 1 · NOT_STARTED 3" in summary_row
    assert "DONE 3 · NOT_STARTED 9" in title_row
    bar = summary_row.split()[1]  # 30 characters: 8/12 DONE (20), 1/12 FAILED (2.5), 3/12 not started (7.5)
    assert len(bar) == 30 and bar.count("#") == 20 and bar.count("x") in (2, 3) and bar.count(".") in (7, 8)
    assert any('1 rows: 400 BadRequestError (invalid_request_error), e.g. {"id":4}: ' in line for line in lines)

    coloured = _cli("status", str(store), "--color", "always")
    assert "\x1b[31m" in coloured.stdout and "DONE\x1b[0m 8" in coloured.stdout


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
    runs = [tuple(int(n.replace(",", "")) for n in re.findall(r"paid ([\d,]+) calls; ([\d,]+) rows? reused", line)[0])
            for line in out.splitlines() if line.startswith("-> this run paid")]
    first, second, third = runs
    assert sum(first) == 297 and first[1] > 0, "297 good rows; duplicate reviews reuse one answer"
    assert second == (0, 0)
    assert sum(third) == 3
    assert "nothing was paid twice" in out
    assert "First run: every row is new" in out


def test_demo_run_again_on_its_store_says_what_that_run_did(tmp_path: Path) -> None:
    """0.7 crashed the second time (`max()` of no paid prompts) after calling it a "first run: every row is new"."""
    env = subprocess_env("http://127.0.0.1:9")
    env.pop("ANTHROPIC_BASE_URL")
    store = str(tmp_path / "demo.duckdb")
    assert _cli("demo", "--rows", "100", "--store", store, env=env).returncode == 0
    again = _cli("demo", "--rows", "100", "--store", store, env=env)
    assert again.returncode == 0, again.stderr
    assert "every row is new" not in again.stdout
    assert "a store that already holds this step" in again.stdout
    assert next(line for line in again.stdout.splitlines() if line.startswith("-> this run paid")).startswith(
        "-> this run paid 0 calls")
    assert "answered 0 paid calls" in again.stdout and "nothing was paid twice" in again.stdout
