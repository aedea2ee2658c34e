"""The command line: each verb is a thin twin of a Python function.

    llmledger status STORE [--table T]          llmledger.show(): every step as a bar of rows by status
                  [--color auto|always|never] [--every N]
    llmledger run STORE --table T --step S      llmledger.resume(): finish a step from the store alone
                  [--mode batch [--no-wait]]    (and collect its Message Batches)
    llmledger worker STORE --table T --step S   llmledger.work(): drain a step with any number of other workers
                  [--concurrency N]             (on PostgreSQL, from many machines)
    llmledger sql STORE "SELECT ..." [--write]  llmledger.sql() (reads unless --write)
    llmledger flag STORE --table T --step S --where W --reason R      llmledger.flag(): mark answers for redo
    llmledger reset STORE --table T --step S --where W                llmledger.reset(): rows back to NOT_STARTED
    llmledger history STORE --table T --step S [--key K]              llmledger.history(): replaced answers
    llmledger export STORE --table T PATH [--step S] [--overwrite]    llmledger.export(): the ledger as Parquet
    llmledger restore PATH STORE                                      llmledger.restore(): a store from an export
    llmledger copy SOURCE TARGET                                      llmledger.copy(): DuckDB <-> PostgreSQL
    llmledger demo [--rows N] [--store PATH]    the demo on the bundled reviews
    llmledger simulator [--port P] [--FAULT X]  the offline Messages API, for your own tests

`show`, `resume` and `work` are the same verbs as `status`, `run` and `worker`, named like their Python twins.
--table and --step may be left out when the store has only one.
STORE is a DuckDB file, or a PostgreSQL URL (postgresql://user@host:5432/db; pip install 'llmledger[postgresql]').
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from datetime import timedelta
from typing import Any, Literal

import polars as pl

from llmledger._draw import rows
from llmledger._ledger import db_errors, shown
from llmledger._view.overview import show, use_colour
from llmledger.errors import InvalidInputError, LedgerError
from llmledger.simulator.replies import Faults

# --redo as resume() takes it
_REDO: dict[str | None, bool | Literal["stale", "flagged"]] = {
    "stale": "stale",
    "flagged": "flagged",
    "all": True,
    None: False,
}
_TABLE_FORMAT: dict[str, Any] = {
    "tbl_hide_dataframe_shape": True,
    "tbl_hide_column_data_types": True,
    "tbl_rows": 100,
    "tbl_cols": -1,
    "fmt_str_lengths": 80,
    "tbl_width_chars": 200,
}


def status(store: str, table: str | None = None, *, colour: bool = False) -> str:
    """The text twin of `llmledger.show`: per step a bar of rows by status, cost, claims, errors by kind."""
    return show(store, table=table).text(colour=colour)


def _watch(store: str, table: str | None, colour: bool, every: float) -> None:
    """`status --every N`: redraw in place until Ctrl-C."""
    if not every > 0:
        raise InvalidInputError(f"--every is the seconds between redraws (a number > 0), got {every}")
    view = show(store, table=table)
    try:
        while True:
            print("\x1b[H\x1b[2J" + view.text(colour=colour), flush=True)
            time.sleep(every)
            view.refresh()
    except KeyboardInterrupt:
        pass


# Verbs also reachable by their Python twin's name: `llmledger show` is `llmledger status`, and so on.
_ALIASES = {"status": "show", "run": "resume", "worker": "work"}


def parser() -> argparse.ArgumentParser:
    """The whole command line (docs/gen_reference.py writes the CLI reference from its `--help`)."""
    top = argparse.ArgumentParser(
        prog="llmledger", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)

    def verb(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        aliases = [_ALIASES[name]] if name in _ALIASES else []
        made = sub.add_parser(name, aliases=aliases, **kwargs)
        made.set_defaults(verb=name)
        return made

    p_status = verb(
        "status", help="llmledger.show(): every step as a bar of rows by status, its cost, claims and errors"
    )
    p_status.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_status.add_argument("--table", default=None, help="only this table")
    p_status.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the bars (auto: when the terminal shows colour and NO_COLOR is unset)",
    )
    p_status.add_argument("--every", type=float, default=None, help="redraw every N seconds until Ctrl-C")

    p_run = verb("run", help="llmledger.resume(): finish a step that apply_llm started, from the store alone")
    p_run.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_run.add_argument("--table", default=None, help=_INFERRED)
    p_run.add_argument("--step", default=None, help=_INFERRED)
    p_run.add_argument("--concurrency", type=int, default=16)
    p_run.add_argument("--where", default=None, help="SQL predicate over the fact table narrowing the rows")
    p_run.add_argument(
        "--redo",
        choices=["stale", "flagged", "all"],
        default=None,
        help="also re-send stale answers (stale), flagged rows (flagged) or every matching row (all)",
    )
    p_run.add_argument("--max-attempts", type=int, default=3)
    p_run.add_argument("--quiet", action="store_true", help="no progress bar")
    p_run.add_argument(
        "--mode",
        choices=["online", "batch", "auto"],
        default="online",
        help="send the rows online or as Message Batches (half price); batches the step sent "
        "earlier are collected first either way",
    )
    p_run.add_argument(
        "--no-wait", action="store_true", help="with --mode batch: return once the batches are submitted"
    )

    p_worker = verb(
        "worker",
        help="llmledger.work(): work on a step together with other workers until none of it "
        "is left (a PostgreSQL store lets many machines share one step)",
    )
    p_worker.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_worker.add_argument("--table", default=None, help=_INFERRED)
    p_worker.add_argument("--step", default=None, help=_INFERRED)
    p_worker.add_argument("--concurrency", type=int, default=16)
    p_worker.add_argument(
        "--chunk-size",
        type=int,
        default=200,
        help="rows claimed ahead and committed together (smaller shares a small step more evenly)",
    )
    p_worker.add_argument("--where", default=None, help="SQL predicate over the fact table narrowing the rows")
    p_worker.add_argument("--max-attempts", type=int, default=3)
    p_worker.add_argument(
        "--poll", type=float, default=5.0, help="seconds between looks while other workers hold rows (default 5)"
    )
    p_worker.add_argument(
        "--stale-after",
        type=float,
        default=1800.0,
        help="seconds after which a claim whose worker stopped renewing it is taken over "
        "(default 1800; claims are renewed every min(60, stale-after/4) seconds)",
    )
    p_worker.add_argument("--quiet", action="store_true", help="no progress bar")

    p_sql = verb("sql", help="run a SQL query on the store and print the result")
    p_sql.add_argument("store")
    p_sql.add_argument("query")
    p_sql.add_argument("--write", action="store_true", help="allow a statement that writes (llmledger.sql(write=True))")

    p_flag = verb("flag", help="flag a step's answers on matching rows for redo (redo='flagged')")
    p_reset = verb("reset", help="put a step back to NOT_STARTED on matching rows (answers to history)")
    p_history = verb("history", help="a step's replaced answers next to the current ones")
    for p in (p_flag, p_reset, p_history):
        p.add_argument("store", help="the DuckDB file or postgresql:// URL")
        p.add_argument("--table", default=None, help=_INFERRED)
        p.add_argument("--step", default=None, help=_INFERRED)
    for p in (p_flag, p_reset):
        p.add_argument("--where", required=True, help='SQL predicate over the fact table, e.g. "id IN (3, 7)"')
    p_flag.add_argument("--reason", required=True, help="what is wrong with these answers")
    p_flag.add_argument("--by", default=None, help="who flags them (default: the login name)")
    p_reset.add_argument(
        "--running",
        action="store_true",
        help="also take back RUNNING rows whose holder is gone (a dead process on this host, or a "
        "holder elsewhere whose claims were not renewed for --stale-after seconds or whose "
        "leases lapsed, in the database's clock)",
    )
    p_reset.add_argument("--stale-after", type=float, default=1800.0, help="seconds (with --running; default 1800)")
    p_history.add_argument("--key", default=None, help="only the row with this key (single-column keys)")

    p_export = verb(
        "export", help="write a table (a folder of Parquet files, or one .parquet file) or one step (a file)"
    )
    p_export.add_argument("store", help="the DuckDB file or postgresql:// URL")
    p_export.add_argument("--table", default=None, help=_INFERRED)
    p_export.add_argument(
        "path",
        help="a new folder (the table and its bookkeeping, for restore), or a file "
        "ending in .parquet (the table alone, or with --step one step's view)",
    )
    p_export.add_argument("--step", default=None, help="only this step's view, as one Parquet file")
    p_export.add_argument(
        "--overwrite", action="store_true", help="replace an existing file, or a folder an earlier export wrote"
    )
    p_restore = verb("restore", help="rebuild a table in a store from llmledger export's folder")
    p_restore.add_argument("path", help="the folder export wrote")
    p_restore.add_argument("store", help="the DuckDB file or postgresql:// URL (created if missing)")

    p_copy = verb("copy", help="copy a whole ledger into a new DuckDB file or an empty PostgreSQL database")
    p_copy.add_argument("source", help="the DuckDB file or postgresql:// URL to copy")
    p_copy.add_argument("target", help="a new DuckDB file, or a postgresql:// URL of a database without a ledger")

    p_demo = verb("demo", help="run a step over the bundled reviews dataset")
    p_demo.add_argument("--store", default=None, help="ledger file (default: a fresh one in a temp folder)")
    p_demo.add_argument(
        "--rows", type=int, default=None, help="rows to use (default: all 3,000 on the simulator, 20 on the real API)"
    )

    p_sim = verb(
        "simulator",
        help="serve the offline Messages API simulator (every fault simulate() "
        "takes is an option: --latency 0.1 --rate-limit 50 --error-rate 0.05 ...)",
    )
    p_sim.add_argument("--port", type=int, default=8765)
    _fault_options(p_sim)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.command = getattr(args, "verb", args.command)  # an alias runs its verb
    try:
        if args.command in ("run", "worker", "flag", "reset", "history", "export"):
            _infer_names(args, step=args.command != "export")
        if args.command == "status":
            colour = {"always": True, "never": False}.get(args.color, use_colour())
            if args.every is not None:
                _watch(args.store, args.table, colour, args.every)
            else:
                print(status(args.store, args.table, colour=colour))
        elif args.command == "run":
            from llmledger._run.api import resume

            redo = _REDO[args.redo]
            try:
                resume(
                    args.store,
                    args.table,
                    args.step,
                    concurrency=args.concurrency,
                    where=args.where,
                    redo=redo,
                    max_attempts=args.max_attempts,
                    progress=not args.quiet,
                    mode=args.mode,
                    wait=not args.no_wait,
                )
            except KeyboardInterrupt:
                return 130
        elif args.command == "worker":
            from llmledger._run.worker import work

            try:
                report = work(
                    args.store,
                    args.table,
                    args.step,
                    concurrency=args.concurrency,
                    chunk_size=args.chunk_size,
                    where=args.where,
                    max_attempts=args.max_attempts,
                    poll=args.poll,
                    stale_after=args.stale_after,
                    progress=not args.quiet,
                )
            except KeyboardInterrupt:
                return 130
            print(
                f"worker done ({report.outcome.value}), all its passes together: {rows(report.done)} DONE, "
                f"{report.calls:,} paid calls, {report.failed:,} FAILED, {report.needs_review:,} NEEDS_REVIEW",
                flush=True,
            )
        elif args.command == "copy":
            from llmledger._ledger.copy import copy

            copied = copy(args.source, args.target)
            tables = ", ".join(f"{table} ({rows(n)})" for table, n in copied.items())
            print(f"copied {tables} into {shown(args.target)}")
        elif args.command == "sql":
            from llmledger._ledger.query import sql

            result = sql(args.store, args.query, write=args.write)
            if result is not None:
                with pl.Config(**_TABLE_FORMAT):
                    print(result)
        elif args.command in ("flag", "reset"):
            from llmledger._ledger.query import flag, reset

            if args.command == "flag":
                n = flag(args.store, args.table, args.step, where=args.where, reason=args.reason, by=args.by)
            else:
                n = reset(
                    args.store,
                    args.table,
                    args.step,
                    where=args.where,
                    running=args.running,
                    stale_after=timedelta(seconds=args.stale_after),
                )
            print(f"{args.command}: {rows(n)} of {args.table}.{args.step}")
        elif args.command == "history":
            from llmledger._ledger.query import history

            key = args.key
            if key is not None and key.lstrip("-").isdigit():
                key = int(key)
            found = history(args.store, args.table, args.step, key=key)
            keys = found.columns[: found.columns.index("replaced_at")]
            with pl.Config(**_TABLE_FORMAT):  # the whole frame is llmledger.history(); here what fits a terminal
                print(found.select(*keys, "replaced_at", "reason", "old_output", "output", "status"))
        elif args.command == "export":
            from llmledger._ledger.parquet import export

            print(f"wrote {export(args.store, args.table, args.path, step=args.step, overwrite=args.overwrite)}")
        elif args.command == "restore":
            from llmledger._ledger.parquet import restore

            print(f"restored table {restore(args.path, args.store)!r} into {shown(args.store)}")
        elif args.command == "demo":
            from llmledger._demo import run_demo

            run_demo(store=args.store, rows=args.rows)
        elif args.command == "simulator":
            from llmledger.simulator import Simulator

            faults = {
                name: value
                for name, value in vars(args).items()
                if (name in _FAULTS or name in _FAULTS_AS_TOLD) and value not in (None, [])
            }
            sim = Simulator(port=args.port, **faults)
            print(
                f"simulator listening on {sim.base_url} (ANTHROPIC_BASE_URL={sim.base_url}); Ctrl-C stops it",
                flush=True,
            )
            try:
                sim.serve_forever()
            except KeyboardInterrupt:
                time.sleep(0)
    except (LedgerError, *db_errors()) as exc:  # type: ignore[misc]
        if isinstance(exc, InvalidInputError) and str(exc).startswith("no API key"):  # to a shell user
            exc = InvalidInputError(
                "no API key: export ANTHROPIC_API_KEY=... first. To run offline instead, "
                "start the simulator in another shell (llmledger simulator --port 8765) and "
                "export ANTHROPIC_BASE_URL=http://127.0.0.1:8765/llmledger-simulator"
            )
        print(f"llmledger: {exc}", file=sys.stderr)
        return 2
    return 0


def _status_or_text(value: str) -> int | str:
    return int(value) if value.isdigit() else value


_FAULTS = {f.name: f for f in dataclasses.fields(Faults) if f.name not in ("fail_next", "outage_until")}
_FAULTS_AS_TOLD = ("outage_for", "fail_next")  # as simulate() takes them: seconds from now; a list of faults


def _fault_options(parser: argparse.ArgumentParser) -> None:
    """One option per fault of `Simulator` (`llmledger.simulate`'s keywords), so a shell user has them all."""
    parser.add_argument(
        "--outage-for",
        type=float,
        default=None,
        help="seconds from the start during which every request gets --outage-status",
    )
    parser.add_argument(
        "--fail-next",
        type=lambda v: [_status_or_text(x.strip()) for x in v.split(",")],
        default=None,
        help="faults for the first requests, e.g. 529,529,429 or no_retry",
    )
    for name, spec in _FAULTS.items():
        if name == "models":
            parser.add_argument(
                "--model",
                dest="models",
                action="append",
                default=[],
                help="a model id to answer besides those llmledger has prices for (repeatable)",
            )
            continue
        kind = str(spec.type)
        convert = (
            _status_or_text if "int | str" in kind else float if "float" in kind else int if "int" in kind else str
        )
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=convert,
            default=None,
            help=f"Simulator({name}=...); default {spec.default!r}",
        )


_INFERRED = "(default: the only one the store has)"


def _infer_names(args: argparse.Namespace, *, step: bool) -> None:
    """--table (and --step) may be left out when the store has just one: as a shell user expects."""
    from llmledger._ledger import open_existing

    steps = open_existing(args.store).steps(args.table)
    if args.table is None:
        tables = sorted({t for t, _, _ in steps})
        if len(tables) != 1:
            raise InvalidInputError(f"pass --table: the store has {'tables ' + str(tables) if tables else 'no steps'}")
        args.table = tables[0]
    if step and args.step is None:
        names = sorted(s for t, s, _ in steps if t == args.table)
        if len(names) != 1:
            raise InvalidInputError(f"pass --step: table {args.table!r} has steps {names}")
        args.step = names[0]
