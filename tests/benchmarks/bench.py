"""Benchmarks against the offline simulator. Run: python tests/benchmarks/bench.py [--quick] [--noop-rows N]

(a) a no-op rerun over a frame whose rows are all recorded and DONE, in a fresh process: calls (target 0),
    time as a multiple of DuckDB anti-joining the frame's keys against the finished keys (target <= 5x),
    and peak RSS growth during the call as a multiple of the frame's size (target <= 2x); once with the
    frame in the order it was recorded (a rerun of the same cell) and once shuffled
(b) throughput as a share of the simulator's rate limit, and the share of 429s (target >= 90 %, < 5 %)
(c) calls re-paid after a kill -9 mid-run, against the requests in flight (target <= in flight)
(e) pacing without being told the limits, answers of varied length (10-190 tokens, max_tokens 400): output
    tokens per minute against an output-token limit that binds before the request limit, and rows per minute
    against a request limit, over the whole run, as a share of the limit (target >= 95 %, < 2 % 429s);
    bespokelabs-curator reports 0.85-0.87 of the limit on the request-limit workload
(k) (b), (c) and (e) for an OpenAI model (`--only-openai` runs just these)
(d) the no-op rerun of a structured step (output= with two fields, a STRUCT column) against the same of a text
    step, at 1,000,000 rows: extra time per row (target <= 20 %)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import polars as pl

from llmledger import DEFAULT_MODEL, Simulator, apply_llm, last_report

HELPER = Path(__file__).resolve().parents[1] / "helpers" / "run_step.py"
# (a) before this release, for comparison: llmledger 0.1.0 on the same 10,000,000-row frame, measured here on
# 2026-11-23 with this script's method, and the figures the issue reported from another machine.
BEFORE = {
    "llmledger_0_1_0_here": {
        "noop_rerun_s": 8.95,
        "time_ratio": 15.7,
        "peak_rss_growth_mb": 3498,
        "rss_growth_per_frame": 9.75,
        "record_s": 11.5,
        "record_peak_rss_growth_mb": 3584,
    },
    "issue_6_report": {
        "noop_rerun_s": 7.1,
        "apply_llm_peak_rss_gb": 4.8,
        "second_step_peak_rss_gb": 5.8,
        "time_ratio_at_1M_rows": 14,
    },
}
PROMPT = "Summarize: {text}"
STRUCTURED = {"company": str, "year": int}


def _frame(n: int) -> pl.DataFrame:
    ids = pl.DataFrame({"id": pl.int_range(0, n, eager=True)})
    return ids.with_columns(pl.format("hello message number {}", "id").alias("text"))


def _memory(field: str) -> int:
    """VmRSS / VmHWM of this process, in bytes (Linux)."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024  # type: ignore[union-attr]


def noop_rerun(
    rows: int, folder: Path, *, shuffle: bool = False, repeat: int = 1, structured: bool = False
) -> dict[str, float]:
    """(a) Record `rows` rows and mark them DONE by SQL (no calls), then time a rerun in a fresh process.

    With `repeat`, the rerun is measured that many times (each in a fresh process) and the median kept.
    `structured`: the step has an output schema (a STRUCT column) instead of text answers.
    """
    store = folder / f"noop-{rows}{'-structured' if structured else ''}.duckdb"
    recorded: dict[str, float] = {}
    if not store.exists():
        recorded = _child(store, rows, "record", structured)
    runs = sorted(
        (_child(store, rows, "shuffle" if shuffle else "same", structured) for _ in range(repeat)),
        key=lambda r: r["noop_rerun_s"],
    )
    return {**runs[len(runs) // 2], **recorded}


def structured_overhead(rows: int, folder: Path, repeat: int = 3) -> dict[str, float]:
    """(d) The no-op rerun of a structured step against a text step over the same frame."""
    text = noop_rerun(rows, folder, repeat=repeat)
    typed = noop_rerun(rows, folder, repeat=repeat, structured=True)
    return {
        "rows": rows,
        "text_noop_s": text["noop_rerun_s"],
        "structured_noop_s": typed["noop_rerun_s"],
        "extra_time_per_row": round(typed["noop_rerun_s"] / text["noop_rerun_s"] - 1, 3),
        "calls": typed["calls"],
    }


def _child(store: Path, rows: int, mode: str, structured: bool = False) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "_noop", str(store), str(rows), mode, str(int(structured))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _noop_child(store: Path, rows: int, mode: str, structured: bool) -> None:
    df = _frame(rows)
    if mode == "shuffle":
        df = df.sample(fraction=1.0, shuffle=True, seed=7)
    options = {"output": STRUCTURED} if structured else {}
    answer = "{'company': 'done earlier', 'year': 1}" if structured else "'done earlier'"
    with Simulator() as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        if mode == "record":
            Path("/proc/self/clear_refs").write_text("5")
            before = _memory("VmRSS")
            t0 = time.perf_counter()
            apply_llm(
                df,
                "summary",
                prompt=PROMPT,
                store=store,
                table="t",
                client=client,
                where="false",
                progress=False,
                **options,
            )
            seconds, growth = time.perf_counter() - t0, _memory("VmHWM") - before
            with duckdb.connect(str(store)) as con:  # pretend every row was answered earlier
                con.execute(
                    f"UPDATE t SET summary = {answer}, summary_status = 'DONE', "
                    "summary_finished_at = now()::TIMESTAMP, summary_attempts = 1, "
                    "summary_fingerprint = summary_request_fingerprint"
                )
            print(json.dumps({"record_s": round(seconds, 2), "record_peak_rss_growth_mb": round(growth / 1e6, 1)}))
            return
        floors = []
        for _ in range(3):
            t0 = time.perf_counter()
            with duckdb.connect(str(store), read_only=True) as con:
                con.sql(
                    "SELECT count(*) FROM (SELECT id FROM df ANTI JOIN "
                    "(SELECT id FROM t WHERE summary_status = 'DONE') USING (id))"
                ).fetchall()
            floors.append(time.perf_counter() - t0)
        floor = sorted(floors)[1]
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
        before = _memory("VmRSS")
        t0 = time.perf_counter()
        out = apply_llm(df, "summary", prompt=PROMPT, store=store, table="t", client=client, progress=False, **options)
        seconds = time.perf_counter() - t0
        growth = _memory("VmHWM") - before
        report = last_report()
        assert out.height == rows and report is not None
        frame_bytes = df.estimated_size()
        print(
            json.dumps(
                {
                    "rows": rows,
                    "order": mode,
                    "frame_mb": round(frame_bytes / 1e6, 1),
                    "noop_rerun_s": round(seconds, 3),
                    "anti_join_floor_s": round(floor, 3),
                    "time_ratio": round(seconds / floor, 2),
                    "peak_rss_growth_mb": round(growth / 1e6, 1),
                    "rss_growth_per_frame": round(growth / frame_bytes, 2),
                    "calls": sim.stats()["requests"],
                    "stale": report.stale,
                    "skipped": report.skipped,
                }
            )
        )


def client_for(sim: Simulator, model: str) -> Any:
    """A real SDK client pointed at the simulator: OpenAI's for a model named "openai:...", else Anthropic's."""
    if model.startswith("openai:"):
        import openai

        return openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="bench")
    return anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")


def throughput(
    rows: int, rate: float, latency: float, folder: Path, concurrency: int = 16, model: str = DEFAULT_MODEL
) -> dict[str, float]:
    """(b) Rows per second against a rate-limited simulator, as a share of its limit."""
    with Simulator(latency=latency, rate_limit=rate) as sim:
        t0 = time.perf_counter()
        apply_llm(
            _frame(rows),
            "summary",
            prompt=PROMPT,
            store=folder / f"tp-{model.replace(':', '-')}.duckdb",
            table="t",
            client=client_for(sim, model),
            model=model,
            concurrency=concurrency,
            progress=False,
        )
        seconds = time.perf_counter() - t0
        stats = sim.stats()
    achieved = rows / seconds
    return {
        "rows": rows,
        "limit_rps": rate,
        "latency_s": latency,
        "achieved_rps": round(achieved, 2),
        "share_of_limit": round(achieved / rate, 3),
        "requests": stats["requests"],
        "share_429": round(stats["by_status"].get(429, 0) / stats["requests"], 4),
    }


def _varied_reply(prompt: str, system: str | None = None) -> str:
    """Answers from about 10 to 190 tokens, varying by row (as real summaries do)."""
    n = 10 + (zlib.crc32(prompt.encode()) % 180)
    return " ".join(["word"] * n)[: n * 4]


def token_throughput(
    rows: int,
    *,
    output_tpm: float | None,
    rpm: float | None,
    latency: float,
    folder: Path,
    concurrency: int = 16,
    max_tokens: int = 400,
    burst: float = 5.0,
    model: str = DEFAULT_MODEL,
) -> dict[str, float]:
    """(e) Output tokens per minute against an output-token limit (or rows per minute against a request
    limit), answers of varied length, measured over the whole run, as a share of the binding limit. For an OpenAI
    model `output_tpm` is OpenAI's one token limit (input and output tokens), and the share is of that."""
    openai_model = model.startswith("openai:")
    with Simulator(
        latency=latency,
        responder=_varied_reply,
        output_tokens_per_minute=None if openai_model else output_tpm,
        tokens_per_minute=output_tpm if openai_model else None,
        rate_limit=rpm / 60 if rpm else None,
        burst=rpm / 60 * burst if rpm else None,
        token_burst=burst,
    ) as sim:
        t0 = time.perf_counter()
        apply_llm(
            _frame(rows),
            "summary",
            prompt=PROMPT,
            store=folder / f"tokens-{output_tpm}-{rpm}-{model.replace(':', '-')}.duckdb",
            table="t",
            client=client_for(sim, model),
            model=model,
            concurrency=concurrency,
            max_tokens=max_tokens,
            progress=False,
        )
        minutes = (time.perf_counter() - t0) / 60
        stats = sim.stats()
    if openai_model:  # OpenAI's limit counts every token, input (cached or not) and output
        stats["output_tokens"] += stats["input_tokens"] + stats["cache_read_tokens"]
    result = {
        "rows": rows,
        "latency_s": latency,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "minutes": round(minutes, 3),
        "requests": stats["requests"],
        "share_429": round(stats["by_status"].get(429, 0) / stats["requests"], 4),
    }
    if output_tpm:
        result |= {
            "output_tpm_limit": output_tpm,
            "output_tpm": round(stats["output_tokens"] / minutes),
            "share_of_limit": round(stats["output_tokens"] / minutes / output_tpm, 3),
        }
    else:
        result |= {
            "rpm_limit": rpm,
            "rpm": round(stats["paid"] / minutes),
            "share_of_limit": round(stats["paid"] / minutes / rpm, 3),
        }  # type: ignore[operator]
    return result


def kill9(
    rows: int,
    folder: Path,
    *,
    concurrency: int = 16,
    latency: float = 0.1,
    commit_every: float = 0.5,
    model: str = DEFAULT_MODEL,
) -> dict[str, float]:
    """(c) kill -9 a run mid-way, rerun it, count the calls paid twice."""
    store = folder / "kill.duckdb"
    with Simulator(latency=latency) as sim:
        env = dict(os.environ, ANTHROPIC_BASE_URL=sim.base_url, LLMLEDGER_TEST_KEY="bench")
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HELPER),
                str(store),
                str(rows),
                "--concurrency",
                str(concurrency),
                "--commit-every",
                str(commit_every),
                "--model",
                model,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while sim.stats()["paid"] < rows // 3 and time.monotonic() < deadline:  # mid-run
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(latency * 3)  # let the server finish answering what was in flight
        paid_before = sim.stats()["paid"]
        # In flight at the kill = sent but not yet in the dead run's hands: neither committed nor journaled. A journal
        # file is deleted just after its answers commit, so a kill between the two leaves rows in both: count rows.
        with duckdb.connect(str(store), read_only=True) as con:
            done = {i for (i,) in con.execute("SELECT id FROM messages WHERE summary_status = 'DONE'").fetchall()}
        lines = [line for p in folder.glob("kill.duckdb.journal/*.jsonl") for line in p.read_text().splitlines()]
        journaled_ids = {json.loads(line)["id"] for line in lines if line.strip()}
        committed, journaled = len(done), len(journaled_ids - done)
        in_flight = paid_before - committed - journaled
        apply_llm(
            _frame(rows),
            "summary",
            prompt=PROMPT,
            store=store,
            table="messages",
            client=client_for(sim, model),
            model=model,
            concurrency=concurrency,
            progress=False,
        )
        repaid = sum(n - 1 for n in sim.paid_prompts().values())
    return {
        "rows": rows,
        "concurrency": concurrency,
        "paid_before_kill": paid_before,
        "committed": committed,
        "journaled_not_committed": journaled,
        "in_flight_at_kill": in_flight,
        "repaid": repaid,
        "repaid_per_in_flight": round(repaid / in_flight, 2) if in_flight else None,
    }


OPENAI_MODEL = "openai:gpt-6.1-terra"


def openai_results(folder: Path, *, quick: bool) -> dict[str, Any]:
    """(k) (b), (c) and (e) again for an OpenAI model: the openai SDK against the simulator's chat completions,
    paced by its `x-ratelimit-*` headers (one token limit, input and output)."""
    return {
        "k_openai_throughput": throughput(100 if quick else 1_000, 50.0, 0.1, folder, model=OPENAI_MODEL),
        "k_openai_kill9": kill9(300 if quick else 2_000, folder, model=OPENAI_MODEL),
        "k_openai_token_limit": token_throughput(
            200 if quick else 400, output_tpm=40_000, rpm=None, latency=0.3, folder=folder, model=OPENAI_MODEL
        ),
        "k_openai_request_limit": token_throughput(
            200 if quick else 600, output_tpm=None, rpm=600, latency=0.3, folder=folder, model=OPENAI_MODEL
        ),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_noop":
        _noop_child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--noop-rows", type=int, default=None, help="rows for (a) (default 10,000,000)")
    parser.add_argument("--only-openai", action="store_true", help="only (k), the OpenAI model's measurements")
    args = parser.parse_args()
    noop_rows = args.noop_rows or (50_000 if args.quick else 10_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.only_openai:
            print(json.dumps(openai_results(folder, quick=args.quick), indent=2))
            return
        results = {
            "a_noop_rerun_same_order": noop_rerun(noop_rows, folder, repeat=1 if args.quick else 3),
            "a_noop_rerun_shuffled": noop_rerun(noop_rows, folder, shuffle=True),
            "a_before": BEFORE,
            "b_throughput": throughput(100 if args.quick else 1_000, 50.0, 0.1, folder),
            "c_kill9": kill9(300 if args.quick else 2_000, folder),
            "e_output_token_limit": token_throughput(
                200 if args.quick else 400, output_tpm=30_000, rpm=None, latency=0.3, folder=folder
            ),
            "e_request_limit": token_throughput(
                200 if args.quick else 600, output_tpm=None, rpm=600, latency=0.3, folder=folder
            ),
            "e_curator_request_limit_share": [0.85, 0.87],
            "d_structured_noop": structured_overhead(
                20_000 if args.quick else 1_000_000, folder, repeat=1 if args.quick else 3
            ),
            **openai_results(folder, quick=args.quick),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
