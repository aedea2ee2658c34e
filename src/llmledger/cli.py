"""The `llmledger` command: `main` parses the arguments (`_cli_parser.parser()`, made from the table of verbs in
`_cli_parser/verbs.py`) and runs the verb's function, each a thin twin of a Python function. What every verb shares
is handled here once: --table and --step left out are the store's only ones; an error a shell user can act on is
one line on stderr (exit status 2), not a traceback; Ctrl-C is exit status 130; a reader that left
(`llmledger status | head -2`) ends it quietly.

`llmledger --help` lists the verbs.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading

from llmledger._cli_parser import parser
from llmledger._cli_parser.runs import SIMULATED_KEY, exports, status
from llmledger._cli_parser.table import Verb
from llmledger._exec.client import SIMULATOR_PATH
from llmledger._ledger import db_errors
from llmledger.errors import InvalidInputError, LedgerError

__all__ = ["SIMULATED_KEY", "entry", "main", "status"]


def entry() -> None:
    """The `llmledger` command: `main`, then an exit without the interpreter's last collection of every object
    (`gc.freeze`). With the SDKs imported, that collection takes a third of a second of CPU on every command,
    a Ctrl-C'd `llmledger run` included; the process is ending, so nothing is left uncollected for long."""
    _stop_on_sigterm()
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def _stop_on_sigterm() -> None:
    """SIGTERM (what `kill`, docker and systemd send) stops a command as Ctrl-C does: the answers in flight are
    waited for and committed, the other claims given back. Found in a trial: it killed `llmledger run` like
    SIGKILL, leaving rows RUNNING and the requests in flight to be paid again. Only the command installs this;
    `import llmledger` in a notebook leaves the process's signals alone."""

    def as_ctrl_c(signum: int, frame: object) -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with Ctrl-C ignored (a script's background
            raise KeyboardInterrupt  # job, some test runners' workers): a SIGINT would be lost, and SIGTERM with it
        os.kill(os.getpid(), signal.SIGINT)  # through whatever handles Ctrl-C at that moment

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, as_ctrl_c)


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
    verb: Verb = args.verb
    args.command = verb.name  # an alias runs its verb
    try:
        _infer_names(args, verb.infers)
        return verb.run(args) or 0
    except KeyboardInterrupt:  # what was answered is kept; the run said so
        return 130
    except (LedgerError, *db_errors()) as exc:  # type: ignore[misc]
        if isinstance(exc, InvalidInputError) and str(exc).startswith("no API key"):  # to a shell user
            exc = InvalidInputError(
                "no API key: export ANTHROPIC_API_KEY=... first. To run offline instead, start the simulator in "
                "another shell (llmledger simulator --port 8765), then here: "
                + exports("ANTHROPIC", "http://127.0.0.1:8765" + SIMULATOR_PATH, SIMULATED_KEY)
            )
        print(f"llmledger: {exc}", file=sys.stderr)
        return 2


def _infer_names(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """--table (and --step) may be left out when the store has just one: as a shell user expects."""
    if not names:
        return
    from llmledger._ledger import open_existing

    steps = open_existing(args.store).steps(args.table)
    if args.table is None:
        tables = sorted({t for t, _, _ in steps})
        if len(tables) != 1:
            raise InvalidInputError(f"pass --table: the store has {'tables ' + str(tables) if tables else 'no steps'}")
        args.table = tables[0]
    if "step" in names and args.step is None:
        step_names = sorted(s for t, s, _ in steps if t == args.table)
        if len(step_names) != 1:
            raise InvalidInputError(f"pass --step: table {args.table!r} has steps {step_names}")
        args.step = step_names[0]
