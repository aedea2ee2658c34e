"""PostgreSQL benchmarks against the simulator. Run: python tests/benchmarks/bench_postgres.py [--quick]

Needs Debian's postgresql package (a server is started in a temp dir on 127.0.0.1, as the tests do).

(f) workers: rows per second with 1, 2 and 4 `llmledger worker` processes sharing one step, against a request
    limit one worker cannot fill alone (each worker: concurrency 4, 0.2 s per answer, so about 20 rows/s);
    4 workers against 1 (target >= 3.5x while the limit does not bind), then 8 workers against a limit that
    binds, as a share of it (target >= 0.95), with the share of 429s. Throughput is taken from the first to
    the last answer committed, so process start-up does not count.
(g) claim + commit overhead per row on a 5,000,000-row ledger, against the same on a 10,000-row one: the
    ledger verbs alone (claim 200 rows, commit 200 results), no API calls
(h) a frame-driven call on PostgreSQL against the same on DuckDB, 1,000,000 rows: the first call (recording the
    frame, `where="false"`: nothing to send) and a no-op rerun once every row is DONE (target: within 2x)
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

import anthropic
import polars as pl
import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmledger import Simulator, apply_llm  # noqa: E402
from llmledger._ledger import RunParams, open_ledger  # noqa: E402
from llmledger._ledger.columns import RESULT_SCHEMA  # noqa: E402
from llmledger._ledger.states import Redo  # noqa: E402
from llmledger._time import utcnow  # noqa: E402
from tests.helpers.postgres import Server, find_bindir  # noqa: E402

PROMPT = "Summarize: {text}"


def _frame(n: int) -> pl.DataFrame:
    ids = pl.DataFrame({"id": pl.int_range(0, n, eager=True)})
    return ids.with_columns(pl.format("hello message number {}", "id").alias("text"))


def _prepare(url: str, rows: int, sim: Simulator) -> None:
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
    apply_llm(
        _frame(rows), "summary", prompt=PROMPT, store=url, table="t", client=client, where="false", progress=False
    )


def workers(server: Server, n: int, *, rows: int, limit_rps: float, latency: float = 0.2) -> dict[str, float]:
    """(f) `n` worker processes draining `rows` rows against a `limit_rps` request limit."""
    url = server.new_database()
    with Simulator(latency=latency, rate_limit=limit_rps) as sim:
        _prepare(url, rows, sim)
        sim.reset_stats()
        env = {**os.environ, "ANTHROPIC_BASE_URL": sim.base_url, "ANTHROPIC_API_KEY": "bench"}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llmledger",
                    "worker",
                    url,
                    "--table",
                    "t",
                    "--step",
                    "summary",
                    "--concurrency",
                    "4",
                    "--chunk-size",
                    "8",
                    "--poll",
                    "0.5",
                    "--quiet",
                ],
                env=env | {"LLMLEDGER_HOSTNAME": f"bench-{i}"},
                stdout=subprocess.DEVNULL,
            )
            for i in range(n)
        ]
        for p in procs:
            p.wait(timeout=600)
        stats = sim.stats()
    with psycopg.connect(url) as con:
        done, first, last = con.execute(
            "SELECT count(*), min(summary_finished_at), max(summary_finished_at) FROM t WHERE summary_status = 'DONE'"
        ).fetchone()  # type: ignore[misc]
    rps = (done - 1) / (last - first).total_seconds()
    return {
        "workers": n,
        "rows": rows,
        "done": done,
        "paid": stats["paid"],
        "limit_rps": limit_rps,
        "achieved_rps": round(rps, 2),
        "share_of_limit": round(rps / limit_rps, 3),
        "share_429": round(stats["by_status"].get(429, 0) / max(stats["requests"], 1), 4),
    }


def _fill(url: str, rows: int) -> None:
    """A step over `rows` rows, recorded by apply_llm for the first rows and extended in SQL (same requests)."""
    with Simulator() as sim:
        _prepare(url, 1_000, sim)
    ledger = open_ledger(url)
    spec_sql = ledger.conn.transaction(lambda con: _request_sql(con))  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(
            f"INSERT INTO t (id, text, summary_prompt, summary_request_fingerprint, summary_version) "
            f"SELECT g, txt, pr, {spec_sql[0]}, %s FROM (SELECT g, 'hello message number ' || g AS txt, "
            f"'Summarize: hello message number ' || g AS pr FROM generate_series(1000, {rows - 1}) g) s",
            [spec_sql[1]],
        )
        con.execute("ANALYZE t")


def _request_sql(con: object) -> tuple[str, str]:
    from llmledger._ledger.engine.dialect import POSTGRES
    from llmledger._ledger.schema import current_version
    from llmledger._step.request import RequestSpec

    version, request, _ = current_version(con, "t", "summary")  # type: ignore[arg-type, misc]
    return RequestSpec.from_json(request).fingerprint_sql("pr", POSTGRES.json_string_sql), version


def claim_commit(server: Server, rows: int, *, sample: int = 2_000, chunk: int = 200) -> dict[str, float]:
    """(g) Seconds per row to claim and commit `sample` rows of a `rows`-row PostgreSQL ledger."""
    url = server.new_database()
    _fill(url, rows)
    ledger = open_ledger(url)
    now = utcnow()
    params = RunParams(max_attempts=3, redo=Redo.NONE, run_started=now, stale_before=now, where=f"id < {sample}")
    selection = ledger.resume("t", "summary", params, dedupe=False)
    t0 = time.perf_counter()
    done = 0
    while done < sample:
        claimed = ledger.claim(selection, chunk, claimant="bench/1/r", now=utcnow())
        if not claimed:
            break
        results = pl.from_dicts(
            [
                {
                    "id": r["id"],
                    "status": "DONE",
                    "output": "ok",
                    "attempts": 1,
                    "error": None,
                    "input_tokens": 10,
                    "output_tokens": 2,
                    "cost_usd": 0.0001,
                    "stop_reason": "end_turn",
                    "model": "m",
                    "fingerprint": r["fingerprint"],
                    "finished_at": utcnow(),
                }
                for r in claimed
            ],
            schema={"id": pl.Int64} | RESULT_SCHEMA,
        )
        ledger.commit(selection, results, now=utcnow())
        done += len(claimed)
    seconds = time.perf_counter() - t0
    return {"ledger_rows": rows, "rows_claimed_and_committed": done, "ms_per_row": round(1000 * seconds / done, 4)}


def engines(server: Server, rows: int, folder: Path) -> dict[str, float]:
    """(h) The same frame-driven calls on both engines: record the frame, then rerun it with every row DONE."""
    frame, out = _frame(rows), {}
    with Simulator() as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        for engine, store in (("duckdb", str(folder / "engines.duckdb")), ("postgresql", server.new_database())):
            ask = dict(prompt=PROMPT, store=store, table="t", client=client, progress=False)
            started = time.perf_counter()
            apply_llm(frame, "summary", where="false", **ask)  # type: ignore[arg-type]
            out[f"{engine}_first_call_s"] = round(time.perf_counter() - started, 2)
            done = (
                "UPDATE t SET summary = 'done earlier', summary_status = 'DONE', summary_attempts = 1, "
                "summary_finished_at = now()::TIMESTAMP, summary_fingerprint = summary_request_fingerprint"
            )
            if engine == "duckdb":
                import duckdb

                with duckdb.connect(store) as con:
                    con.execute(done)
            else:
                with psycopg.connect(store, autocommit=True) as con:
                    con.execute(done)  # type: ignore[arg-type]
                    con.execute("VACUUM ANALYZE t")
            times = []
            for _ in range(3):
                started = time.perf_counter()
                apply_llm(frame, "summary", **ask)  # type: ignore[arg-type]
                times.append(time.perf_counter() - started)
            out[f"{engine}_noop_rerun_s"] = round(sorted(times)[1], 2)
        assert sim.stats()["requests"] == 0, "nothing was sent"
    out["first_call_pg_over_duckdb"] = round(out["postgresql_first_call_s"] / out["duckdb_first_call_s"], 2)
    out["noop_rerun_pg_over_duckdb"] = round(out["postgresql_noop_rerun_s"] / out["duckdb_noop_rerun_s"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only-engines", action="store_true", help="only (h), PostgreSQL against DuckDB")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("needs PostgreSQL's server: apt-get install -y postgresql")
    server = Server(bindir)
    server.start()
    try:
        out: dict[str, object] = {}
        if args.only_engines:
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps(engines(server, 20_000 if args.quick else 1_000_000, Path(tmp)), indent=2))
            return
        per = 60 if args.quick else 300
        scaling = [workers(server, n, rows=per * n, limit_rps=1000.0) for n in (1, 2, 4)]
        out["f_workers"] = scaling
        out["f_4_over_1"] = round(scaling[2]["achieved_rps"] / scaling[0]["achieved_rps"], 2)
        out["f_limit_binds"] = workers(server, 8, rows=per * 8, limit_rps=100.0)
        big = 50_000 if args.quick else 5_000_000
        small = claim_commit(server, 10_000)
        large = claim_commit(server, big)
        out["g_claim_commit"] = [small, large]
        out["g_large_over_small"] = round(large["ms_per_row"] / small["ms_per_row"], 2)
        with tempfile.TemporaryDirectory() as tmp:
            out["h_engines"] = engines(server, 20_000 if args.quick else 1_000_000, Path(tmp))
        print(json.dumps(out, indent=2))
    finally:
        server.close()


if __name__ == "__main__":
    main()
