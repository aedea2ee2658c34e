"""Runs one apply_llm in its own process, for tests that kill, interrupt or race it.

usage: run_step.py STORE ROWS [--concurrency N] [--chunk-size N] [--commit-every S] [--step NAME]
Talks to ANTHROPIC_BASE_URL with the key in LLMLEDGER_TEST_KEY.
"""

from __future__ import annotations

import argparse
import os
import sys

import anthropic
import polars as pl

from llmledger import apply_llm

p = argparse.ArgumentParser()
p.add_argument("store")
p.add_argument("rows", type=int)
p.add_argument("--concurrency", type=int, default=4)
p.add_argument("--chunk-size", type=int, default=200)
p.add_argument("--commit-every", type=float, default=0.5)
p.add_argument("--step", default="summary")
p.add_argument("--progress", action="store_true")
a = p.parse_args()

df = pl.DataFrame({"id": list(range(a.rows)), "text": [f"hello message number {i}" for i in range(a.rows)]})
client = anthropic.AsyncAnthropic(api_key=os.environ["LLMLEDGER_TEST_KEY"])
print("started", flush=True)
try:
    out = apply_llm(df, a.step, prompt="Summarize: {text}", store=a.store, table="messages", client=client,
                    concurrency=a.concurrency, chunk_size=a.chunk_size, commit_every=a.commit_every,
                    progress=a.progress)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("finished", out.height, flush=True)
