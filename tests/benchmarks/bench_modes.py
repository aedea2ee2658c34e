"""Batches with a deadline and OpenAI's flex tier, against the offline simulator.
Run: python tests/benchmarks/bench_modes.py [--quick]

(d1) `mode="batch", deadline=` when the batch cannot finish in time (it answers its requests in order over twice
     the deadline): whether the run ended before its deadline and by how much, the rows the batch answered and
     those sent online, what the run paid against the list price, and rows paid twice (target 0)
(d2) the same deadline sent with `wait=False` and kept by a later `resume` that comes after the batches' last
     moment: the same figures
(f1) `mode="flex"` against `mode="online"` for an OpenAI model, the simulator refusing a share of flex requests with
     429 "resource unavailable": cost per row as a share of online (target 0.5), rows per second as a share of
     online, the 429s retried, rows failed (target 0)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import polars as pl

import llmledger
from llmledger import Simulator, apply_llm, last_report

OPENAI_MODEL = "openai:gpt-6.1-terra"


def _frame(rows: int) -> pl.DataFrame:
    return pl.DataFrame({"id": range(rows), "text": [f"message number {i}" for i in range(rows)]})


def _books(store: Path, sim: Simulator, started: float, deadline: float) -> dict[str, Any]:
    ((batched, online, paid),) = llmledger.sql(
        store,
        "SELECT count(*) FILTER (WHERE s_batch_id IS NOT NULL), count(*) FILTER (WHERE s_batch_id IS NULL "
        "AND s_status = 'DONE'), sum(s_cost_usd) FROM t",
    ).rows()
    report = last_report()
    assert report is not None
    return {
        "ended_before_deadline_s": round(started + deadline - time.monotonic(), 2),
        "rows_from_batch": batched,
        "rows_online": online,
        "paid_usd": round(paid, 6),
        "list_usd": round(paid + report.batch_saved_usd, 6),
        "paid_twice": sum(1 for n in sim.paid_prompts().values() if n > 1),
    }


def deadline(rows: int, folder: Path, *, seconds: float = 30.0, later: bool = False) -> dict[str, Any]:
    """(d1), or with `later` (d2)."""
    store = folder / f"deadline_{later}.duckdb"
    with Simulator(batch_delay=2 * seconds) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench", max_retries=0)
        ask = dict(prompt="Summarize: {text}", store=store, table="t", progress=False, client=client, concurrency=16)
        started = time.monotonic()
        apply_llm(_frame(rows), "s", mode="batch", deadline=seconds, wait=not later, **ask)  # type: ignore[arg-type]
        if later:
            last = seconds - max(3 + rows * 2 / 16, 0.2 * seconds)  # the batches' last moment, as drive.py reckons
            time.sleep(max(0.0, last - (time.monotonic() - started)) + 0.5)
            llmledger.resume(store, "t", "s", client=client, progress=False, concurrency=16)
        return _books(store, sim, started, seconds)


def flex(rows: int, folder: Path, *, unavailable: float = 0.2) -> dict[str, Any]:
    """(f1)"""
    import openai

    out: dict[str, Any] = {}
    with Simulator(latency=0.05, rate_limit=100.0) as sim:
        for mode in ("online", "flex"):
            sim.configure(flex_unavailable=unavailable if mode == "flex" else 0.0)
            client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="bench", max_retries=0)
            started = time.monotonic()
            done = apply_llm(_frame(rows), mode, prompt="Summarize: {text}", store=folder / f"{mode}.duckdb", table="t",
                             progress=False, client=client, model=OPENAI_MODEL, mode=mode, concurrency=16)  # fmt: skip
            seconds = time.monotonic() - started
            report = last_report()
            assert report is not None
            out[mode] = {
                "rows_per_s": round(rows / seconds, 1),
                "cost_per_row_usd": (report.cost_usd or 0.0) / rows,
                "retries": report.retries,
                "failed": int((done[f"{mode}_status"] != "DONE").sum()),
            }
    out["cost_flex_over_online"] = round(out["flex"]["cost_per_row_usd"] / out["online"]["cost_per_row_usd"], 3)
    out["speed_flex_over_online"] = round(out["flex"]["rows_per_s"] / out["online"]["rows_per_s"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    rows = 40 if args.quick else 100
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {
            "d1_deadline": deadline(rows, folder, seconds=12.0 if args.quick else 30.0),
            "d2_deadline_kept_later": deadline(rows, folder, seconds=12.0 if args.quick else 30.0, later=True),
            "f1_flex": flex(rows * 10, folder),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
