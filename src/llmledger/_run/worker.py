"""Workers: any number of processes, on any number of machines, draining one step of a shared store together.

A worker is `resume` run again and again until nothing of the step is left.
Each pass claims rows no one holds; on PostgreSQL, rows another worker is
claiming that instant are skipped (`FOR UPDATE SKIP LOCKED`), not waited for,
so workers started together, or late, never send a row twice. While other
workers still hold rows, a worker waits `poll` seconds and looks again: a
worker that died (kill -9, a lost machine) stops renewing its claims, and once
they are older than `stale_after` the next pass of any live worker takes them
back and sends them. Each worker paces itself by the rate-limit headers the
API returns to every worker of the account, and backs off with jitter, so a
429 does not send them all back at the same moment.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from llmledger._ledger.states import Outcome
from llmledger._report import RunReport
from llmledger._step.attach import BYTES_NOT_KEPT
from llmledger.errors import InvalidInputError

log = logging.getLogger("llmledger")


def work(
    store: str | Path,
    table: str,
    step: str,
    *,
    poll: float = 5.0,
    stale_after: timedelta | float = timedelta(minutes=30),
    progress: bool = True,
    **options: Any,
) -> RunReport:
    """Work on `table`.`step` of `store` alongside other workers until no row of it needs an answer.

    Takes `resume`'s options (`concurrency`, `where`, `redo`, `client`, `mode`, ...). Returns one report
    for everything this worker did. A worker that never finds rows to send returns at once when no
    other worker holds any either; while others do, it waits for them (they may die) and returns when
    they are done. Ctrl-C stops it like any run: what was answered is kept, the rest given back.
    """
    from llmledger._run.api import resume

    _check_names(options, takes=[*inspect.signature(resume).parameters, "poll"])
    if isinstance(poll, bool) or not isinstance(poll, int | float) or poll <= 0:
        raise InvalidInputError(f"poll must be a positive number of seconds, got {poll!r}")
    if options.get("redo", False) not in (False, "stale"):
        raise InvalidInputError(
            f"work() takes redo=False or 'stale', not {options['redo']!r}: a worker sends rows "
            "until none are left, so redo=True or 'flagged' would send its own answers again on "
            "every pass. Run llmledger.resume(..., redo=...) once instead."
        )
    if options.get("background"):
        raise InvalidInputError(
            "work() runs in the foreground; start it in a process of its own "
            "(llmledger worker STORE --table T --step S) or use apply_llm(..., background=True)"
        )
    total: RunReport | None = None
    said: str | None = None  # why rows could not be sent, once said
    while True:
        report = resume(store, table, step, stale_after=stale_after, progress=progress, **options)
        if total is None:
            total = report
        else:
            total.absorb(report)
            total.selected += report.selected
            total.outcome, total.message = report.outcome, report.message
            total.running_elsewhere = report.running_elsewhere
        if report.outcome is not Outcome.COMPLETED:  # interrupted, an outage, a budget...: stop like a run does
            return total
        if report.selected and report.unsent >= report.selected and BYTES_NOT_KEPT in report.unsent_why:
            # their files came as bytes, which only the frame apply_llm was given holds: waiting would be for ever
            if not report.running_elsewhere:
                log.warning(
                    "%s of %s.%s cannot be sent from the store: %s. This worker stops; finish them with apply_llm on "
                    "that frame.",
                    f"{report.unsent:,} row(s)",
                    table,
                    step,
                    report.unsent_why.removeprefix("not sent: "),
                )
                return total
            time.sleep(poll)  # rows are held elsewhere (an apply_llm with the frame may send these): look again
            continue
        if report.selected and report.unsent >= report.selected:  # none could be sent (their files are not as
            if said is None:  # recorded): say why once (the first file named), and wait for them to be sendable
                said = report.unsent_why
                log.warning(
                    "%s of %s.%s cannot be sent: %s. This worker waits and looks again every %gs; they are sent "
                    "once their files are back as recorded (or after apply_llm records them as they are now).",
                    f"{report.unsent:,} row(s)",
                    table,
                    step,
                    said.removeprefix("not sent: "),
                    poll,
                )
            time.sleep(poll)
            continue
        if report.selected:  # rows may have come back meanwhile (a lapsed claim): look again at once
            continue
        if not report.running_elsewhere:
            return total
        time.sleep(poll)  # other workers hold rows: wait for them to finish, or for their claims to lapse


def _check_names(options: dict[str, Any], *, takes: list[str]) -> None:
    """Refuse an option neither work() nor the resume() it runs takes, naming work() (the function called): the
    error resume() raised named resume(), which the caller never called."""
    from llmledger._run.api import _REQUEST_FIELDS

    for name, value in options.items():
        if name in takes:
            continue
        if name in _REQUEST_FIELDS:
            raise InvalidInputError(
                f"work() has no option {name}=: a field of the request is part of the step, and a worker sends each "
                f"row with the request apply_llm recorded for it; change it there, e.g. apply_llm(..., "
                f"request_options={{{name!r}: {value!r}}}) (see the docs' request options)"
            )
        close = difflib.get_close_matches(name, takes, n=1)
        hint = f"; did you mean {close[0]}=?" if close else ""
        raise InvalidInputError(f"work() has no option {name}={hint} (its options: help(work), help(resume))")
