"""Runs one apply_llm with a step budget in its own process, for tests that race two runs of one step.

usage: budget_run.py STORE ROWS MAX_COST_USD [--concurrency N] [--model NAME]
Talks to ANTHROPIC_BASE_URL with the key in LLMLEDGER_TEST_KEY; the model is priced $1000 per million
tokens in and out (about a cent a row), so a small budget is reached after a few dozen rows.
"""

from __future__ import annotations

import argparse
import gc
import os

import anthropic
import polars as pl

import llmledger
from llmledger import apply_llm, last_report

p = argparse.ArgumentParser()
p.add_argument("store")
p.add_argument("rows", type=int)
p.add_argument("max_cost_usd", type=float)
p.add_argument("--concurrency", type=int, default=2)
p.add_argument("--model", default="claude-budget-race")
a = p.parse_args()

llmledger.set_price(a.model, input=1000.0, output=1000.0)
df = pl.DataFrame({"id": list(range(a.rows)), "text": [f"hello message number {i}" for i in range(a.rows)]})
client = anthropic.AsyncAnthropic(api_key=os.environ["LLMLEDGER_TEST_KEY"])
print("started", flush=True)
apply_llm(
    df,
    "summary",
    prompt="Summarize: {text}",
    store=a.store,
    table="messages",
    client=client,
    model=a.model,
    concurrency=a.concurrency,
    chunk_size=4,
    commit_every=0.2,
    progress=False,
    max_cost_usd=a.max_cost_usd,
    budget_scope="step",
)
report = last_report()
print("outcome", report.outcome if report else None, flush=True)
print("message", report.message if report else None, flush=True)  # a test that fails shows why the run stopped
gc.freeze()  # as the `llmledger` command exits: no last collection of the SDKs' objects
