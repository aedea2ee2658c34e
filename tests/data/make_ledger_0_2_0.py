"""How ledger-0.2.0.duckdb.gz was made: run with llmledger 0.2.0 (commit c061393, schema 2) and duckdb 1.2.0.

Table `messages`, 8 rows. Step `summary` (request option stop_sequences ["END"]): rows 0-5 answered, row 2
FAILED once (a 400), rows 6-7 recorded only. Then, by hand, row 4 is left RUNNING as a crashed run on
another machine leaves it (a claim 0.2.0 took, which did not record the status it took the row from).
The file is kept as written (then gzipped), for tests/test_migrations.py.
"""

from pathlib import Path

import anthropic
import duckdb
import polars as pl

from llmledger import Simulator, apply_llm

store = Path("ledger-0.2.0.duckdb")
store.unlink(missing_ok=True)
df = pl.DataFrame({"id": list(range(8)), "text": [f"hello message number {i}" for i in range(8)]})
with Simulator(poison="number 2") as sim:
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
    apply_llm(
        df,
        "summary",
        prompt="Summarize: {text}",
        where="id < 6",
        request_options={"stop_sequences": ["END"]},
        store=store,
        table="messages",
        client=client,
        progress=False,
    )
with duckdb.connect(str(store)) as con:
    con.execute(
        "UPDATE messages SET summary_status = 'RUNNING', summary_claimed_by = 'elsewhere/4242/run0', "
        "summary_running_started_at = TIMESTAMP '2026-11-20 10:00:00' WHERE id = 4"
    )
    print(con.sql("SELECT id, summary_status, summary_attempts FROM messages ORDER BY id").fetchall())
