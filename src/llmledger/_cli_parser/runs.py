"""The function that runs each verb (`verbs.VERBS` names them): a few lines calling the Python twin with the parsed
arguments and printing what it returns. `cli.main` has filled in --table and --step, and turns llmledger's errors
into one line and Ctrl-C into exit status 130; a function returns the exit status (None: 0).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Literal, TextIO

import polars as pl

from llmledger._cli_parser.faults import _FAULTS, _FAULTS_AS_TOLD
from llmledger._draw import rows
from llmledger._ledger import shown
from llmledger._view.overview import show, use_colour
from llmledger.errors import InvalidInputError

# --redo as resume() takes it
_REDO: dict[str | None, bool | Literal["stale", "flagged"]] = {"stale": "stale", "flagged": "flagged", "all": True}
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


def run_status(args: argparse.Namespace) -> None:
    colour = {"always": True, "never": False}.get(args.color, use_colour())
    if args.every is None:
        print(status(args.store, args.table, colour=colour))
        return
    view = show(args.store, table=args.table)  # --every N: redraw in place until Ctrl-C
    try:
        while True:
            print("\x1b[H\x1b[2J" + view.text(colour=colour), flush=True)
            time.sleep(args.every)
            view.refresh()
    except KeyboardInterrupt:
        pass


def _server(args: argparse.Namespace) -> dict[str, Any]:
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


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The run options every sending verb takes, as resume() and work() name them."""
    return {
        "concurrency": args.concurrency,
        "where": args.where,
        "max_attempts": args.max_attempts,
        "progress": not args.quiet,
        **_server(args),
    }


def run_run(args: argparse.Namespace) -> None:
    from llmledger._run.api import resume

    redo = _REDO.get(args.redo, False)
    resume(args.store, args.table, args.step, redo=redo, mode=args.mode, wait=not args.no_wait,
           deadline=args.deadline, **_run_options(args))  # fmt: skip


def run_worker(args: argparse.Namespace) -> None:
    from llmledger._run.worker import work

    with _one_summary(f"{args.table}.{args.step}") as said:
        report = work(
            args.store,
            args.table,
            args.step,
            chunk_size=args.chunk_size,
            poll=args.poll,
            stale_after=args.stale_after,
            **_run_options(args),
        )
    print(
        f"worker done ({report.outcome.value}), all its passes together: {rows(report.done)} DONE, "
        f"{report.calls:,} paid calls, {report.failed:,} FAILED, {report.needs_review:,} NEEDS_REVIEW",
        flush=True,
    )
    print(*said.hints, sep="\n", end="\n" if said.hints else "", flush=True)


class _Passes(io.TextIOBase):
    """Standard output while `work()` runs: every pass of it is a run that prints its one-line summary (and what to
    do next) when it ends. The summaries are held back, the last one kept; each hint under them is kept once."""

    def __init__(self, out: TextIO, step: str) -> None:
        self.out, self.partial = out, ""
        self.summary = re.compile(rf"(\[\w+\] )?{re.escape(step)}: ")
        self.last: str | None = None
        self.hints: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            if self.summary.match(line):
                self.last = line
            elif line.startswith("  ") and self.last is not None:
                if line not in self.hints:
                    self.hints.append(line)
            else:
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def _one_summary(step: str) -> Iterator[_Passes]:
    """`llmledger worker` says what all its passes did once, at the end, not a line per pass (`work()` prints
    those, as each of its passes is a `resume()`). A worker that stops on an error or Ctrl-C shows its last pass's
    line, the only word on what happened then."""
    passes = _Passes(sys.stdout, step)
    try:
        with contextlib.redirect_stdout(passes):
            yield passes
    except BaseException:
        print(*([passes.last] if passes.last else []), *passes.hints, sep="\n", flush=True)
        raise
    finally:
        if passes.partial:
            print(passes.partial, end="")


def run_compare(args: argparse.Namespace) -> None:
    from llmledger._view.comparison import compare

    comparison = compare(args.store, args.table, args.steps, where=args.where)
    print(comparison)
    if args.show > 0 and comparison.differences.height:
        with pl.Config(tbl_rows=args.show, fmt_str_lengths=60, tbl_width_chars=160):
            print(comparison.differences.head(args.show))


def run_models(args: argparse.Namespace) -> None:
    from llmledger._step.models import models

    table = models(provider=args.provider).select(
        "model", "status", "shutdown", "replacement", "input", "output", "cache_read", "batch", "flex"
    )
    with pl.Config(**{**_TABLE_FORMAT, "tbl_rows": -1}):
        print(table)
    print("USD per million tokens; batch and flex are multipliers. llmledger.models() has every column.")


def run_sql(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import sql

    result = sql(args.store, args.query, write=args.write)
    if result is not None:
        with pl.Config(**_TABLE_FORMAT):
            print(result)


def run_flag(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import flag

    n = flag(args.store, args.table, args.step, where=args.where, reason=args.reason, by=args.by)
    print(f"flag: {rows(n)} of {args.table}.{args.step}")


def run_accept(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import accept

    n = accept(args.store, args.table, args.step, where=args.where, by=args.by)
    print(f"accept: {rows(n)} of {args.table}.{args.step}")


def run_correct(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import correct

    key = _history_key(args.store, args.table, args.key, whole="")
    n = correct(args.store, args.table, args.step, key=key, answer=args.answer, reason=args.reason, by=args.by)
    print(f"correct: {rows(n)} of {args.table}.{args.step}")


def run_review(args: argparse.Namespace) -> None:
    from llmledger._view.review_session import Session
    from llmledger._view.review_text import review_in_terminal

    session = Session(args.store, args.table, args.step, where=args.where, by=args.by,
                      queue="needs" if args.sample is None else "sample", sample=args.sample,
                      compare_with=args.compare_with)  # fmt: skip
    review_in_terminal(session)


def run_accuracy(args: argparse.Namespace) -> None:
    from llmledger._view.accuracy import accuracy

    print(accuracy(args.store, args.table, args.step, against=args.against, target=args.target))


def run_reset(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import reset

    stale_after = timedelta(seconds=args.stale_after)
    n = reset(args.store, args.table, args.step, where=args.where, running=args.running, stale_after=stale_after)
    print(f"reset: {rows(n)} of {args.table}.{args.step}")


def run_history(args: argparse.Namespace) -> None:
    from llmledger._ledger.query import history

    key = None if args.key is None else _history_key(args.store, args.table, args.key)
    found = history(args.store, args.table, args.step, key=key)
    keys = found.columns[: found.columns.index("reason")]  # the key columns come first
    with pl.Config(**_TABLE_FORMAT):  # the whole frame is llmledger.history(); here what fits a terminal
        print(found.select(*keys, "replaced_at", "reason", "old_output", "output", "status"))


def _history_key(
    store: str, table: str, text: str, *, whole: str = ", or leave --key out for every row's history"
) -> Any:
    """--key's value as `history(key=)` (or `correct`) takes it, once the table has a row with it: else an error
    saying what is wrong and what to pass (a key that matched no row printed an empty table, as a row without history
    does). `whole`: what the verb does without --key, if anything."""
    from llmledger._ledger import known_table
    from llmledger._ledger.query import sql

    key_columns = known_table(store, table)[2]
    if len(key_columns) != 1:
        raise InvalidInputError(
            f"--key takes one value, and table {table!r} is keyed by {len(key_columns)} columns {key_columns}: "
            "call its Python twin with key={...} (a dict of the key columns)" + whole
        )
    column = key_columns[0]
    quoted, value = _quoted(column), text.strip()
    found = sql(
        store,
        f"SELECT min({quoted}) AS lo, max({quoted}) AS hi, "
        f"count(*) FILTER (WHERE CAST({quoted} AS VARCHAR) = $key) AS n FROM {_quoted(table)}",
        {"key": value},
    )
    assert found is not None
    lo, hi, n = found.row(0)
    integer = found.schema["lo"].is_integer()
    span = f"its {column} values run from {lo!r} to {hi!r}" if lo is not None else "it has no rows"
    if integer and not re.fullmatch(r"-?[0-9]+", value):
        raise InvalidInputError(
            f"--key {text!r} is not an integer, and the key of table {table!r} ({column}) is one ({span}); "
            f"pass a row's {column}, e.g. --key {lo if lo is not None else 1}"
        )
    if not n:
        raise InvalidInputError(
            f"--key {text}: table {table!r} has no row whose {column} is {value if integer else repr(value)} "
            f"({span}); pass one it has{whole}"
        )
    return int(value) if integer else value


def run_export(args: argparse.Namespace) -> None:
    from llmledger._ledger.parquet import COMMAND_LINE, export_spelled

    written = export_spelled(
        args.store, args.table, args.path, step=args.step, overwrite=args.overwrite, spelling=COMMAND_LINE
    )
    print(f"wrote {written}")


def run_restore(args: argparse.Namespace) -> None:
    from llmledger._ledger.parquet import restore

    print(f"restored table {restore(args.path, args.store)!r} into {shown(args.store)}")


def run_copy(args: argparse.Namespace) -> None:
    from llmledger._ledger.copy import copy

    copied = copy(args.source, args.target)
    tables = ", ".join(f"{table} ({rows(n)})" for table, n in copied.items())
    print(f"copied {tables} into {shown(args.target)}")


def run_demo(args: argparse.Namespace) -> None:
    from llmledger._demo import run_demo

    run_demo(store=args.store, rows=args.rows)


def run_simulator(args: argparse.Namespace) -> None:
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
    print(recipe(sim.base_url, args.api_key), flush=True)
    try:
        sim.serve_forever()
    except KeyboardInterrupt:
        time.sleep(0)


SIMULATED_KEY = "simulated"  # the key the printed recipe sets: the simulator takes any key unless told --api-key


def exports(provider: str, base_url: str, key: str) -> str:
    """One `export` line for the shell, pointing an SDK at a simulator with a key: without a key, the SDK's own
    client and `llmledger run` refuse before sending anything ("no API key"), so the recipe sets one."""
    return f"export {provider}_BASE_URL={shlex.quote(base_url)} {provider}_API_KEY={shlex.quote(key)}"


def recipe(base_url: str, api_key: str | None) -> str:
    """What `llmledger simulator` prints under its address: the lines to paste, exactly, into the shell that runs
    `llmledger run` (or your own code) so that it sends to this simulator. A test runs them as printed."""
    key = api_key if api_key is not None else SIMULATED_KEY
    accepted = "it takes any key" if api_key is None else "it takes only the key --api-key set"
    return (
        f"To send to it, run this in the shell that runs llmledger or your code ({accepted}):\n"
        f"{exports('ANTHROPIC', base_url, key)}\n"
        "and for 'openai:' models also:\n"
        f"{exports('OPENAI', base_url + '/v1', key)}"
    )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
