"""The command line's verbs: `main` parses the arguments (`_cli_parser.parser`, where every verb and option is
defined) and runs the verb, each a thin twin of a Python function; the errors a shell user can act on are printed,
not raised (exit status 2).

`llmledger --help` (`_cli_parser.USAGE`) lists the verbs.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import time
from datetime import timedelta
from typing import Any, Literal

import polars as pl

from llmledger._cli_parser import _FAULTS, _FAULTS_AS_TOLD, parser
from llmledger._draw import rows
from llmledger._exec.client import SIMULATOR_PATH
from llmledger._ledger import db_errors, shown
from llmledger._view.overview import show, use_colour
from llmledger.errors import InvalidInputError, LedgerError

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


def _server(args: Any) -> dict[str, Any]:
    """--base-url and the key --api-key-env names, as resume() and work() take them."""
    if args.api_key_env is None:
        return {"base_url": args.base_url, "gateway": args.gateway}
    key = os.environ.get(args.api_key_env)
    if not key:
        raise InvalidInputError(
            f"--api-key-env {args.api_key_env}: no such environment variable is set (or it is empty); "
            f"export {args.api_key_env}=... first"
        )
    return {"base_url": args.base_url, "api_key": key, "gateway": args.gateway}


def entry() -> None:
    """The `llmledger` command: `main`, then an exit without the interpreter's last collection of every object
    (`gc.freeze`). With the SDKs imported, that collection takes a third of a second of CPU on every command,
    a Ctrl-C'd `llmledger run` included; the process is ending, so nothing is left uncollected for long."""
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a reader that left is seen here, not in the interpreter's last flush
        return code
    except BrokenPipeError:  # `llmledger status | head -2`: the reader left; say nothing more (CPython's recipe)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    args.command = getattr(args, "verb", args.command)  # an alias runs its verb
    try:
        if args.command in ("run", "worker", "flag", "reset", "history", "export", "compare"):
            _infer_names(args, step=args.command not in ("export", "compare"))
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
                    **_server(args),
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
                    **_server(args),
                )
            except KeyboardInterrupt:
                return 130
            print(
                f"worker done ({report.outcome.value}), all its passes together: {rows(report.done)} DONE, "
                f"{report.calls:,} paid calls, {report.failed:,} FAILED, {report.needs_review:,} NEEDS_REVIEW",
                flush=True,
            )
        elif args.command == "compare":
            from llmledger._view.comparison import compare

            comparison = compare(args.store, args.table, args.steps, where=args.where)
            print(comparison)
            if args.show > 0 and comparison.differences.height:
                with pl.Config(tbl_rows=args.show, fmt_str_lengths=60, tbl_width_chars=160):
                    print(comparison.differences.head(args.show))
        elif args.command == "models":
            from llmledger._step.models import models

            table = models(provider=args.provider).select(
                "model", "status", "shutdown", "replacement", "input", "output", "cache_read", "batch", "flex"
            )
            with pl.Config(**{**_TABLE_FORMAT, "tbl_rows": -1}):
                print(table)
            print("USD per million tokens; batch and flex are multipliers. llmledger.models() has every column.")
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
            keys = found.columns[: found.columns.index("reason")]  # the key columns come first
            if isinstance(key, str) and keys and found.schema[keys[0]].is_integer():  # found nothing, said nothing
                raise InvalidInputError(f"--key {key!r} is not an integer, and {args.table}'s key {keys[0]} is")
            with pl.Config(**_TABLE_FORMAT):  # the whole frame is llmledger.history(); here what fits a terminal
                print(found.select(*keys, "replaced_at", "reason", "old_output", "output", "status"))
        elif args.command == "export":
            from llmledger._ledger.parquet import COMMAND_LINE, export_spelled

            written = export_spelled(
                args.store, args.table, args.path, step=args.step, overwrite=args.overwrite, spelling=COMMAND_LINE
            )
            print(f"wrote {written}")
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
            try:
                sim = Simulator(port=args.port, **faults)
            except OSError as exc:  # the port is taken, or not this user's to take
                raise InvalidInputError(
                    f"the simulator cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}): pass another "
                    "--port, or --port 0 for any free one"
                ) from None
            print(f"simulator listening on {sim.base_url}; Ctrl-C stops it", flush=True)
            print(_recipe(sim.base_url, args.api_key), flush=True)
            try:
                sim.serve_forever()
            except KeyboardInterrupt:
                time.sleep(0)
    except (LedgerError, *db_errors()) as exc:  # type: ignore[misc]
        if isinstance(exc, InvalidInputError) and str(exc).startswith("no API key"):  # to a shell user
            exc = InvalidInputError(
                "no API key: export ANTHROPIC_API_KEY=... first. To run offline instead, start the simulator in "
                "another shell (llmledger simulator --port 8765), then here: "
                + _exports("ANTHROPIC", "http://127.0.0.1:8765" + SIMULATOR_PATH, SIMULATED_KEY)
            )
        print(f"llmledger: {exc}", file=sys.stderr)
        return 2
    return 0


SIMULATED_KEY = "simulated"  # the key the printed recipe sets: the simulator takes any key unless told --api-key


def _exports(provider: str, base_url: str, key: str) -> str:
    """One `export` line for the shell, pointing an SDK at a simulator with a key: without a key, the SDK's own
    client and `llmledger run` refuse before sending anything ("no API key"), so the recipe sets one."""
    return f"export {provider}_BASE_URL={shlex.quote(base_url)} {provider}_API_KEY={shlex.quote(key)}"


def _recipe(base_url: str, api_key: str | None) -> str:
    """What `llmledger simulator` prints under its address: the lines to paste, exactly, into the shell that runs
    `llmledger run` (or your own code) so that it sends to this simulator. A test runs them as printed."""
    key = api_key if api_key is not None else SIMULATED_KEY
    accepted = "it takes any key" if api_key is None else "it takes only the key --api-key set"
    return (
        f"To send to it, run this in the shell that runs llmledger or your code ({accepted}):\n"
        f"{_exports('ANTHROPIC', base_url, key)}\n"
        "and for 'openai:' models also:\n"
        f"{_exports('OPENAI', base_url + '/v1', key)}"
    )


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
