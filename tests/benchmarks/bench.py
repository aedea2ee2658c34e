"""Benchmarks against the offline simulator. Run: python tests/benchmarks/bench.py [--quick]

(a) a no-op rerun over a 1,000,000-row frame whose rows are all recorded: time, calls (target < 2 s, 0 calls)
(b) throughput as a share of the simulator's rate limit, and the share of 429s (target >= 90 %, < 5 %)
(c) calls re-paid after a kill -9 mid-run, against the requests in flight (target <= in flight)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import duckdb
import polars as pl

from llmledger import Simulator, apply_llm, last_report
from llmledger._prompt import request_signature

HELPER = Path(__file__).resolve().parents[1] / "helpers" / "run_step.py"
PROMPT = "Summarize: {text}"


def _frame(n: int) -> pl.DataFrame:
    ids = pl.DataFrame({"id": pl.int_range(0, n, eager=True)})
    return ids.with_columns(pl.format("hello message number {}", "id").alias("text"))


def noop_rerun(rows: int, folder: Path) -> dict[str, float]:
    """(a) Record `rows` rows as DONE (by SQL, no calls), then time the same apply_llm call again."""
    store = folder / "noop.duckdb"
    df = _frame(rows)
    with Simulator() as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        t0 = time.perf_counter()
        apply_llm(df, "summary", prompt=PROMPT, store=store, table="t", client=client, where="false", progress=False)
        record_s = time.perf_counter() - t0
        sig = request_signature(model="claude-haiku-4-5", system=None, max_tokens=1024)
        with duckdb.connect(str(store)) as con:  # pretend every row was answered earlier
            con.execute("UPDATE t SET summary = 'done earlier', summary_status = 'DONE', "
                        "summary_finished_at = now()::TIMESTAMP, summary_attempts = 1, "
                        "summary_fingerprint = md5($sig || 'Summarize: ' || text)", {"sig": sig})
        t0 = time.perf_counter()
        out = apply_llm(df, "summary", prompt=PROMPT, store=store, table="t", client=client, progress=False)
        rerun_s = time.perf_counter() - t0
        report = last_report()
        assert out.height == rows and report is not None
        return {"rows": rows, "record_s": round(record_s, 3), "noop_rerun_s": round(rerun_s, 3),
                "calls": sim.stats()["requests"], "stale": report.stale, "skipped": report.skipped}


def throughput(rows: int, rate: float, latency: float, folder: Path, concurrency: int = 16) -> dict[str, float]:
    """(b) Rows per second against a rate-limited simulator, as a share of its limit."""
    with Simulator(latency=latency, rate_limit=rate) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        t0 = time.perf_counter()
        apply_llm(_frame(rows), "summary", prompt=PROMPT, store=folder / "tp.duckdb", table="t", client=client,
                  concurrency=concurrency, progress=False)
        seconds = time.perf_counter() - t0
        stats = sim.stats()
    achieved = rows / seconds
    return {"rows": rows, "limit_rps": rate, "latency_s": latency, "achieved_rps": round(achieved, 2),
            "share_of_limit": round(achieved / rate, 3), "requests": stats["requests"],
            "share_429": round(stats["by_status"].get(429, 0) / stats["requests"], 4)}


def kill9(rows: int, folder: Path, *, concurrency: int = 16, latency: float = 0.1,
          commit_every: float = 0.5) -> dict[str, float]:
    """(c) kill -9 a run mid-way, rerun it, count the calls paid twice."""
    store = folder / "kill.duckdb"
    with Simulator(latency=latency) as sim:
        env = dict(os.environ, ANTHROPIC_BASE_URL=sim.base_url, LLMLEDGER_TEST_KEY="bench")
        proc = subprocess.Popen([sys.executable, str(HELPER), str(store), str(rows), "--concurrency",
                                 str(concurrency), "--commit-every", str(commit_every)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while sim.stats()["paid"] < rows // 3 and time.monotonic() < deadline:  # mid-run
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(latency * 3)  # let the server finish answering what was in flight
        paid_before = sim.stats()["paid"]
        # In flight at the kill = sent but not yet in the dead run's hands: neither committed nor journaled.
        with duckdb.connect(str(store), read_only=True) as con:
            committed = con.execute("SELECT count(*) FROM messages WHERE summary_status = 'DONE'").fetchall()[0][0]
        journaled = sum(len(p.read_text().splitlines()) for p in folder.glob("kill.duckdb.journal/*.jsonl"))
        in_flight = paid_before - committed - journaled
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        apply_llm(_frame(rows), "summary", prompt=PROMPT, store=store, table="messages", client=client,
                  concurrency=concurrency, progress=False)
        repaid = sum(n - 1 for n in sim.paid_prompts().values())
    return {"rows": rows, "concurrency": concurrency, "paid_before_kill": paid_before, "committed": committed,
            "journaled_not_committed": journaled, "in_flight_at_kill": in_flight, "repaid": repaid,
            "repaid_per_in_flight": round(repaid / in_flight, 2) if in_flight else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {
            "a_noop_rerun": noop_rerun(20_000 if args.quick else 1_000_000, folder),
            "b_throughput": throughput(100 if args.quick else 1_000, 50.0, 0.1, folder),
            "c_kill9": kill9(300 if args.quick else 2_000, folder),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
