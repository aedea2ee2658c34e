"""Create a store with llmledger 0.1.0 (the release before schema migrations), for the upgrade test."""
import anthropic, duckdb, polars as pl
from pathlib import Path
from llmledger import Simulator, apply_llm
store = Path("/tmp/legacy-out/ledger-0.1.0.duckdb")
store.unlink(missing_ok=True)
df = pl.DataFrame({"id": list(range(12)), "text": [f"hello message number {i}" for i in range(12)]})
with Simulator(poison="number 3") as sim:
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
    kw = dict(store=store, table="messages", client=client, progress=False)
    # rows 0-9: summary answered (row 3 fails twice -> NEEDS_REVIEW with max_attempts=2); rows 10, 11 recorded only
    apply_llm(df, "summary", prompt="Summarize: {text}", where="id < 10", max_attempts=2, system="Be brief.", max_tokens=50, **kw)
    apply_llm(df, "summary", prompt="Summarize: {text}", where="id < 10", max_attempts=2, system="Be brief.", max_tokens=50, **kw)
    # a redo of row 5 puts its first answer in the history
    sim.responder = lambda p, s: "second opinion: " + p
    apply_llm(df, "summary", prompt="Summarize: {text}", where="id = 5", redo=True, max_attempts=2, system="Be brief.", max_tokens=50, **kw)
    sim.responder = None or __import__("llmledger.simulator", fromlist=["x"]).default_reply
    # a second step, answered for rows 0-3 (row 3 FAILED once)
    apply_llm(df, "title", prompt="Title for: {text}", where="id < 4", **kw)
with duckdb.connect(str(store), read_only=True) as con:
    print(con.sql("SELECT id, summary_status, summary_attempts, title_status FROM messages ORDER BY id").fetchall())
    print(con.sql("SELECT count(*) FROM llmledger_history").fetchall(), con.sql("SELECT count(*) FROM llmledger_runs").fetchall())
    print(con.sql("SELECT * FROM llmledger_steps").fetchall())
