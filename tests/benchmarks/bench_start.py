"""What a whole process costs, start included: python tests/benchmarks/bench_start.py [--rows N]

(s1) a fresh `python` process that runs apply_llm over 1,000 rows against a 40 request/s limit (200 ms an answer,
     concurrency 16), timed from its start to its exit, as a share of the limit (target >= 0.95); and the time to
     its first request, from the simulator's log
(s2) a fresh process rerunning those 1,000 rows unchanged (nothing to pay) against a naive loop over a JSON
     cache in a fresh process, which imports the SDK it would call (target: no slower)
(s3) where a process's first second goes: `import llmledger`, `import anthropic`, and the slowest imports
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmledger import Simulator

RUN = """
import sys, anthropic, polars as pl
from llmledger import apply_llm
rows = int(sys.argv[2])
df = pl.DataFrame({"id": range(rows), "text": [f"message number {i}" for i in range(rows)]})
apply_llm(df, "summary", prompt="Summarize: {text}", store=sys.argv[1], table="t", progress=False,
          client=anthropic.AsyncAnthropic(base_url=sys.argv[3], api_key="bench", max_retries=0))
"""
NAIVE = """
import json, sys, os
import anthropic  # the SDK a naive script calls for what its cache lacks
rows = int(sys.argv[2])
cache = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {}
out = []
for i in range(rows):
    prompt = f"Summarize: message number {i}"
    if prompt not in cache:
        cache[prompt] = "an answer"  # a call would go here
    out.append(cache[prompt])
json.dump(cache, open(sys.argv[1], "w"))
"""


def _process(code: str, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return time.perf_counter() - started


def whole_process(rows: int, folder: Path, *, rate: float = 40.0, latency: float = 0.2) -> dict[str, Any]:
    """(s1) and (s2)."""
    store = folder / "start.duckdb"
    with Simulator(latency=latency, rate_limit=rate) as sim:
        started = time.time()
        seconds = _process(RUN, str(store), str(rows), sim.base_url)
        first = min(entry["time"] for entry in sim.log()) - started - latency  # the first answer, less its wait
        paid = sim.stats()["paid"]
        rerun = _process(RUN, str(store), str(rows), sim.base_url)
        assert sim.stats()["paid"] == paid, "an unchanged rerun pays nothing"
    cache = folder / "cache.json"
    _process(NAIVE, str(cache), str(rows))
    naive = _process(NAIVE, str(cache), str(rows))
    return {
        "rows": rows,
        "limit_rps": rate,
        "process_s": round(seconds, 2),
        "share_of_limit": round(rows / seconds / rate, 3),
        "first_request_after_s": round(first, 2),
        "unchanged_rerun_s": round(rerun, 2),
        "naive_json_cache_s": round(naive, 2),
        "rerun_over_naive": round(rerun / naive, 2),
    }


def imports() -> dict[str, Any]:
    """(s3) Import times in fresh processes, and the slowest modules `import llmledger` pulls in."""
    out: dict[str, Any] = {}
    for name in ("llmledger", "anthropic", "polars", "duckdb"):
        out[f"import_{name}_s"] = round(_process(f"import {name}"), 2)
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import llmledger"], capture_output=True, text=True, check=True
    ).stderr
    rows = []
    for line in found.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[0].split(":")[1]), parts[2].strip()))
    out["slowest_own_us"] = dict(sorted(rows, reverse=True)[:8][::-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps({"s1_s2": whole_process(args.rows, Path(tmp)), "s3": imports()}, indent=2))


if __name__ == "__main__":
    main()
