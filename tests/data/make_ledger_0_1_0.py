"""How ledger-0.1.0.duckdb.gz was made: run with llmledger 0.1.0 (commit 39e70f4) and duckdb 1.2.0 installed.

The file is kept as written by that release (then gzipped), for tests/test_migrations.py.
"""

from pathlib import Path

import anthropic
import duckdb
import polars as pl

from llmledger import Simulator, apply_llm
from llmledger.simulator import default_reply

store = Path("ledger-0.1.0.duckdb")
store.unlink(missing_ok=True)
df = pl.DataFrame({"id": list(range(12)), "text": [f"hello message number {i}" for i in range(12)]})
summary = {"prompt": "Summarize: {text}", "max_attempts": 2, "system": "Be brief.", "max_tokens": 50}
with Simulator(poison="number 3") as sim:
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
    kw = {"store": store, "table": "messages", "client": client, "progress": False}
    # rows 0-9: summary answered (row 3 fails twice -> NEEDS_REVIEW with max_attempts=2); rows 10, 11 recorded only
    apply_llm(df, "summary", where="id < 10", **summary, **kw)
    apply_llm(df, "summary", where="id < 10", **summary, **kw)
    # a redo of row 5 puts its first answer in the history
    sim.responder = lambda p, s: "second opinion: " + p
    apply_llm(df, "summary", where="id = 5", redo=True, **summary, **kw)
    sim.responder = default_reply
    # a second step, sent for rows 0-3 (row 3 FAILED once)
    apply_llm(df, "title", prompt="Title for: {text}", where="id < 4", **kw)
with duckdb.connect(str(store), read_only=True) as con:
    print(con.sql("SELECT id, summary_status, summary_attempts, title_status FROM messages ORDER BY id").fetchall())
