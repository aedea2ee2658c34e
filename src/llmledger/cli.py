"""`llmledger status STORE`, `llmledger demo`, `llmledger simulator`: thin wrappers over the Python API."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import duckdb
import polars as pl

from . import _store as st
from .errors import LedgerError


def status(store: str, table: str | None = None, *, show_failures: int = 5) -> str:
    """Counts per status for every table and step, then the first failed rows with their errors."""
    path = Path(store)
    st.check_store_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no store at {store!r}")
    with st.Store(path).open(wait=10.0) as con:
        counts = st.status_counts(con, table)
        lines = []
        if counts.is_empty():
            known = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
            return f"{store}: no llmledger steps" + (f" for table {table!r}" if table else "") + \
                f" (tables: {known})"
        with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, tbl_rows=100):
            lines.append(str(counts))
        for tbl, step, key in st.list_steps_with_keys(con, table):
            bad = st.failures(con, tbl, step, key, limit=show_failures)
            if bad:
                lines.append(f"\n{tbl}.{step}: first {len(bad)} FAILED / NEEDS_REVIEW rows")
                lines.extend(f"  {k}  {s}  {e}" for k, s, e in bad)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_status = sub.add_parser("status", help="row counts per status, and failed rows with their errors")
    p_status.add_argument("store", help="the DuckDB file")
    p_status.add_argument("--table", default=None, help="only this table")

    p_demo = sub.add_parser("demo", help="run a step over the bundled reviews dataset")
    p_demo.add_argument("--store", default=None, help="ledger file (default: a fresh one in a temp folder)")
    p_demo.add_argument("--rows", type=int, default=None,
                        help="rows to use (default: all 3,000 on the simulator, 20 on the real API)")

    p_sim = sub.add_parser("simulator", help="serve the offline Messages API simulator")
    p_sim.add_argument("--port", type=int, default=8765)
    p_sim.add_argument("--latency", type=float, default=0.0)
    p_sim.add_argument("--rate-limit", type=float, default=None, help="requests per second")

    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            print(status(args.store, args.table))
        elif args.command == "demo":
            from ._demo import run_demo

            run_demo(store=args.store, rows=args.rows)
        elif args.command == "simulator":
            from .simulator import Simulator

            sim = Simulator(port=args.port, latency=args.latency, rate_limit=args.rate_limit)
            print(f"simulator listening on {sim.base_url} (ANTHROPIC_BASE_URL={sim.base_url}); Ctrl-C stops it",
                  flush=True)
            try:
                sim.serve_forever()
            except KeyboardInterrupt:
                time.sleep(0)
    except (LedgerError, FileNotFoundError, duckdb.Error) as exc:
        print(f"llmledger: {exc}", file=sys.stderr)
        return 2
    return 0
