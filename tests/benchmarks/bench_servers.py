"""A server that announces no limits (`base_url=`: vLLM, Ollama, a proxy): the throughput the run's adaptive
concurrency reaches, as a share of the best fixed concurrency's, measured in one run.

The simulator answers as such a server (`compatible=True`): it works on `capacity` requests at once, queues the
rest (latency grows, answers per second do not), and answers 429 beyond `queue_limit` waiting. Each fixed
concurrency is sent with `client=` (no adaptation); the adaptive run is `base_url=` with `concurrency=` as its
ceiling. The issue's target: adaptive >= 0.9 of the best fixed.

    python -m tests.benchmarks.bench_servers            # 1,500 rows per run
    python -m tests.benchmarks.bench_servers --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import polars as pl

from llmledger import Simulator, UnknownPriceWarning, apply_llm

ADAPTIVE = "llmledger._exec.online.AdaptiveLimit"  # patched to None: requests at once stay at concurrency=

MODEL = "local-model"
FIXED = (2, 4, 8, 16, 32, 64)


def _frame(rows: int) -> pl.DataFrame:
    return pl.DataFrame({"id": range(rows), "text": [f"row {i} of the benchmark" for i in range(rows)]})


def one_run(rows: int, folder: Path, *, concurrency: int, adaptive: bool, server: dict[str, Any]) -> dict[str, Any]:
    """Rows per second, and the share of 429s, of one run against a fresh server."""
    with Simulator(compatible=True, models=(MODEL,), **server) as sim:
        store = folder / f"{'adaptive' if adaptive else 'fixed'}-{concurrency}.duckdb"
        t0 = time.perf_counter()
        # the fixed runs: the same server, with the adaptation turned off
        fixed = contextlib.nullcontext() if adaptive else mock.patch(ADAPTIVE, lambda concurrency: None)
        with warnings.catch_warnings(), fixed:
            warnings.simplefilter("ignore", UnknownPriceWarning)
            apply_llm(
                _frame(rows), "s", prompt="{text}", model=MODEL, store=store, concurrency=concurrency, progress=False,
                base_url=sim.server_url,
            )  # fmt: skip
        seconds = time.perf_counter() - t0
        stats = sim.stats()
    return {
        "concurrency": concurrency,
        "adaptive": adaptive,
        "rows_per_s": round(rows / seconds, 1),
        "share_429": round(stats["by_status"].get(429, 0) / max(stats["requests"], 1), 4),
        "max_at_once": stats["max_concurrent"],
    }


def compare(rows: int, folder: Path, *, server: dict[str, Any], ceiling: int = 64) -> dict[str, Any]:
    fixed = [one_run(rows, folder, concurrency=c, adaptive=False, server=server) for c in FIXED if c <= ceiling]
    adaptive = one_run(rows, folder, concurrency=ceiling, adaptive=True, server=server)
    best = max(fixed, key=lambda r: r["rows_per_s"])
    return {
        "server": server,
        "rows": rows,
        "fixed": fixed,
        "adaptive": adaptive,
        "best_fixed_concurrency": best["concurrency"],
        "adaptive_share_of_best": round(adaptive["rows_per_s"] / best["rows_per_s"], 3),
    }


SERVERS = {
    # a GPU server batching 8 requests, queueing without bound (vLLM)
    "queueing": {"capacity": 8, "latency": 0.05},
    # the same behind a proxy that refuses beyond 8 waiting (LiteLLM, Ollama's OLLAMA_MAX_QUEUE)
    "refusing": {"capacity": 8, "queue_limit": 8, "latency": 0.05},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 rows per run")
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args()
    rows = args.rows or (300 if args.quick else 1_500)
    with tempfile.TemporaryDirectory() as tmp:
        for name, server in SERVERS.items():
            result = compare(rows, Path(tmp) / name, server=server)
            print(json.dumps({name: result}, indent=1), flush=True)


if __name__ == "__main__":
    main()
