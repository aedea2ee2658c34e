"""Runs one apply_llm in its own process, for tests that kill, interrupt or race it.

usage: run_step.py STORE ROWS [--concurrency N] [--chunk-size N] [--commit-every S] [--step NAME]
                   [--mode online|batch] [--no-wait] [--die-before create|confirm] [--distinct N]
                   [--clock-skew SECONDS] [--max-cost USD] [--model MODEL] [--rows-per-request N]
                   [--lose-commits SEED] [--lose-claims SEED] [--race-lost-claims]
Talks to ANTHROPIC_BASE_URL with the key in LLMLEDGER_TEST_KEY. `--die-before` kills the process (no cleanup,
as a crash or a lost kernel would) just before a batch is sent to the API, or just after the API took it and
before the ledger records its id. `--distinct N`: row i's text is that of row i % N (duplicate texts).
`--clock-skew`: the process's clock (llmledger's `utcnow`) runs that many seconds ahead (negative: behind).
`--max-cost`: a step budget, with the model priced $1000 per million tokens (about a cent a row).
`--lose-commits SEED`: the store loses about a third of the run's chunk commits (never two in a row, drawn from SEED):
the call returns and nothing of the transaction is kept, as DuckDB 2.0.1 did when processes took turns on a file.
`--lose-claims SEED`: on a DuckDB store, the run's first claim transaction is lost in the same way, and about a third
of the later ones (never two in a row, drawn from SEED). `--race-lost-claims`: after each, the run waits (up to 10 s)
until another process has claimed or answered rows of the step, the race the loss opens (it prints "claim lost" as it
starts waiting).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import anthropic
import polars as pl

import llmledger
from llmledger import apply_llm

p = argparse.ArgumentParser()
p.add_argument("store")
p.add_argument("rows", type=int)
p.add_argument("--concurrency", type=int, default=4)
p.add_argument("--chunk-size", type=int, default=200)
p.add_argument("--commit-every", type=float, default=0.5)
p.add_argument("--step", default="summary")
p.add_argument("--progress", action="store_true")
p.add_argument("--mode", default="online")
p.add_argument("--no-wait", action="store_true")
p.add_argument("--die-before", choices=["create", "confirm"])
p.add_argument("--distinct", type=int, default=0)
p.add_argument("--clock-skew", type=float, default=0.0)
p.add_argument("--max-cost", type=float, default=None)
p.add_argument("--rows-per-request", type=int, default=1)
p.add_argument("--model", default=None)  # "openai:...": the openai SDK, at ANTHROPIC_BASE_URL + "/v1"
p.add_argument("--lose-commits", default=None)
p.add_argument("--lose-claims", default=None)
p.add_argument("--race-lost-claims", action="store_true")
a = p.parse_args()

if a.clock_skew:
    from datetime import timedelta

    import llmledger._time

    real = llmledger._time.utcnow

    def skewed() -> object:
        return real() + timedelta(seconds=a.clock_skew)

    for module in [m for name, m in sys.modules.items() if name.startswith("llmledger")]:
        if getattr(module, "utcnow", None) is real:
            module.utcnow = skewed  # type: ignore[attr-defined]
budget = {}
if a.max_cost is not None:
    import llmledger
    from llmledger._exec.client import DEFAULT_MODEL

    llmledger.set_price(a.model or DEFAULT_MODEL, input=1000.0, output=1000.0)
    budget = {"max_cost_usd": a.max_cost, "budget_scope": "step"}

if a.die_before:
    from llmledger._exec.batch import BatchSender
    from llmledger._ledger.batches import BatchVerbs

    def die(*args: object, **kwargs: object) -> None:
        print("dying", flush=True)
        os._exit(9)

    if a.die_before == "create":
        BatchSender._create = die  # type: ignore[method-assign, assignment]
    else:
        BatchVerbs.confirm_batch = die  # type: ignore[method-assign, assignment]

if a.lose_commits is not None:
    import random

    from llmledger._ledger.ledger import SQLLedger

    draw, real_commit, lost = random.Random(a.lose_commits), SQLLedger.commit, [False]

    def losing(self: SQLLedger, *args: object, **kwargs: object) -> object:
        lost[0] = not lost[0] and draw.random() < 0.35
        if not lost[0]:
            return real_commit(self, *args, **kwargs)  # type: ignore[arg-type]
        again = kwargs.get("again")
        return list(again[1]) if again else []  # type: ignore[index]  # what it had written again, lost too

    SQLLedger.commit = losing  # type: ignore[method-assign]

if a.lose_claims is not None:
    import random

    from llmledger._ledger.ledger import SQLLedger

    pick, real_claim, claims = random.Random(a.lose_claims), SQLLedger.claim, [0, False]
    taken = f"SELECT count(*) FROM messages WHERE {a.step}_status <> 'NOT_STARTED'"

    def losing_claim(self: SQLLedger, *args: object, **kwargs: object) -> object:
        claims[0] += 1
        claims[1] = claims[0] == 1 or (not claims[1] and pick.random() < 0.35)
        if not claims[1] or self.conn.dialect.name != "duckdb":
            return real_claim(self, *args, **kwargs)  # type: ignore[arg-type]
        real_tx, first = self.conn.transaction, [True]

        def transaction(work: object, **options: object) -> object:
            if not first[0]:  # reading the claim back is not lost
                return real_tx(work, **options)  # type: ignore[arg-type]
            first[0] = False
            got = real_tx(work, **{**options, "commit": False})  # type: ignore[arg-type]
            print("claim lost", flush=True)
            for _ in range(
                100 if a.race_lost_claims else 0
            ):  # the race that loss opens, made sure: another process claims before this one sends
                if real_tx(lambda con: con.execute(taken).fetchone()[0]):  # type: ignore[attr-defined]
                    break
                time.sleep(0.1)
            return got

        self.conn.transaction = transaction  # type: ignore[method-assign]
        try:
            return real_claim(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            del self.conn.transaction

    SQLLedger.claim = losing_claim  # type: ignore[method-assign]

df = pl.DataFrame(
    {
        "id": list(range(a.rows)),
        "text": [f"hello message number {i % a.distinct if a.distinct else i}" for i in range(a.rows)],
    }
)
client: object = anthropic.AsyncAnthropic(api_key=os.environ["LLMLEDGER_TEST_KEY"])
chosen = {} if a.model is None else {"model": a.model}
if a.model is not None and a.model.startswith("openai:"):
    import openai

    client = openai.AsyncOpenAI(
        base_url=os.environ["ANTHROPIC_BASE_URL"] + "/v1", api_key=os.environ["LLMLEDGER_TEST_KEY"]
    )
print("started", flush=True)
try:
    out = apply_llm(
        df,
        a.step,
        prompt="Summarize: {text}",
        store=a.store,
        table="messages",
        client=client,
        concurrency=a.concurrency,
        chunk_size=a.chunk_size,
        commit_every=a.commit_every,
        progress=a.progress,
        mode=a.mode,
        wait=not a.no_wait,
        rows_per_request=a.rows_per_request,
        **budget,
        **chosen,
    )
except KeyboardInterrupt:
    print("interrupted", flush=True)
    gc.freeze()  # as the `llmledger` command exits: no last collection of the SDKs' objects (0.3 s of CPU)
    sys.exit(130)
report = llmledger.last_report()
print("finished", out.height, flush=True)
print("report", report.outcome if report else None, report.message if report else None, flush=True)
gc.freeze()
