"""SQL over a store from Python, safe to call while a run (in this kernel or another process) is going.

The file is opened only for one query; a run in progress holds it only
between claims and commits, so these wait at most a moment.
"""

from __future__ import annotations

import getpass
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._ledger.open import open_existing
from llmledger._ledger.where import check_where_shape
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError


def sql(
    store: str | Path, query: str, params: Any = None, *, wait: float = 60.0, write: bool = False
) -> pl.DataFrame | None:
    """Run `query` on the store and return the result as a polars frame (None for statements without rows).

    Read-only unless `write=True`: a statement that writes is refused (InvalidInputError, nothing changed), since
    editing the ledger's own columns by hand can undo its promises; `flag`, `reset` and `redo=` are the ways to
    change answers."""
    if not isinstance(write, bool):
        raise InvalidInputError(f"write must be True or False, got {write!r}")
    return open_existing(store).query(query, params, wait=wait, write=write)


def progress(store: str | Path, table: str | None = None) -> pl.DataFrame:
    """Rows per status for every (table, step) in the store."""
    return open_existing(store).counts(table)


def history(store: str | Path, table: str, step: str, key: Any = None) -> pl.DataFrame:
    """Every answer of one step that was replaced (by a redo, a reset, a schema change), next to the current one.

    One row per replaced answer, oldest first: the row's key columns, `replaced_at`, `reason`,
    `old_output` (same type as the step's output), `old_status`, `old_model`, `old_fingerprint`,
    `old_input_tokens`, `old_output_tokens`, `old_cost_usd`, `old_finished_at`, then the row's
    current `output`, `status` and `finished_at`. `key=` narrows it to one row.
    """
    _check_names(table, step)
    return open_existing(store).history(table, step, key)


def flag(store: str | Path, table: str, step: str, *, where: str, reason: str, by: str | None = None) -> int:
    """Flag the answers of `step` on rows matching `where` for redo; return how many rows were flagged.

    Rows showing the very same answer to the very same request (twins answered together, or reused) are flagged
    with them, so no row keeps a rejected answer; and no later row is handed a flagged answer.

    The flag (`{step}_flag`, `_flagged_at`, `_flagged_by`) is plain SQL to query; `apply_llm(...,
    redo="flagged")` re-sends exactly the flagged rows and clears each flag when its row is DONE again
    (the replaced answer goes to the history with the flag's reason).

    If the re-ask fails (the model refuses, the request errs), the rejected answer is no longer shown as the
    row's: it goes to the history all the same, and the row becomes FAILED (attempts left: a plain rerun asks
    again) or NEEDS_REVIEW with the new error. The flag stays until a new answer replaces it, so a person's
    flag is never lost and `redo="flagged"` (or `WHERE {step}_flag IS NOT NULL`) still finds the row.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInputError("flag needs a reason= saying what is wrong, e.g. reason='company name is wrong'")
    _check_names(table, step)
    _check_reason(reason)
    _check_where(where)
    return open_existing(store).flag(table, step, where=where, reason=reason, by=_by(by), now=utcnow())


def reset(
    store: str | Path,
    table: str,
    step: str,
    *,
    where: str,
    running: bool = False,
    stale_after: timedelta = timedelta(minutes=30),
) -> int:
    """Put `step` back to NOT_STARTED on rows matching `where` (not rows being sent); return how many.

    Their answers, usage and errors are cleared from the fact table after being copied to the history.
    Rows in a Message Batch (SUBMITTED) are taken out of it: its answers to them are then not merged.
    With `running=True`, RUNNING rows are taken back too when their holder is gone: a process on this host that
    no longer runs (by PID and start time), or a holder elsewhere whose claims were not renewed for `stale_after`
    or whose own leases have lapsed, judged in the clock the claims were written in (PostgreSQL's), not this
    machine's. Rows of a holder that still runs on this host are never taken (its answers would be paid twice).
    """
    _check_names(table, step)
    _check_where(where)
    if not isinstance(running, bool):
        raise InvalidInputError(f"running must be True or False, got {running!r}")
    if not isinstance(stale_after, timedelta) or stale_after <= timedelta(0):
        raise InvalidInputError(f"stale_after must be a positive timedelta, got {stale_after!r}")
    now = utcnow()
    return open_existing(store).reset(
        table, step, where=where, now=now, running_stale_after=stale_after if running else None
    )


def accept(
    store: str | Path, table: str, step: str, *, key: Any = None, where: str | None = None, by: str | None = None
) -> int:
    """Record that a person judged the answers of `step` right: on the row `key` (its key value, or a dict of key
    columns), or on the rows matching `where`. Returns how many rows took the verdict.

    The verdict is kept with the answer it judged in `llmledger_verdicts`, and on the row (`{step}_verdict` is
    "accepted") until a new answer replaces it. `redo="stale"` keeps an accepted answer (redo=True with `where=`
    naming the row replaces it); a NEEDS_REVIEW answer a person accepts is DONE; a flag on it is lifted.
    """
    _check_names(table, step)
    _check_rows(key, where)
    return open_existing(store).judge(table, step, verdict="accept", key=key, where=where, by=_by(by), now=utcnow())


def correct(
    store: str | Path, table: str, step: str, *, key: Any, answer: Any, by: str | None = None, reason: str | None = None
) -> int:
    """Give the row `key` of `step` a person's answer: `answer` (text, or for a typed step a dict checked against
    its output schema) becomes the row's answer, DONE, its source `person`, at no cost.

    The answer it replaces goes to the history, and the verdict (with `reason`) to `llmledger_verdicts`. Steps that
    read this one's answer turn stale on the row, as after any new answer. No redo replaces a person's answer but
    `redo=True` with `where=` naming the row. Rows showing the same answer to the same request take it too.
    """
    _check_names(table, step)
    if key is None:
        raise InvalidInputError("correct() judges one row: pass key= its key value (a dict when the key has several)")
    if reason is not None and not isinstance(reason, str):
        raise InvalidInputError(f"reason must be text, got {reason!r}")
    _check_reason(reason)
    return open_existing(store).judge(
        table, step, verdict="correct", key=key, answer=answer, reason=reason, by=_by(by), now=utcnow()
    )


def undo_verdict(store: str | Path, table: str, step: str, *, key: Any, by: str | None = None) -> str | None:
    """Take back the latest verdict `by` (default: the login name) gave on the row `key` of `step`, and put the row
    back as it was before it: an accepted answer that needed review needs it again, a flag is lifted, a corrected
    row shows the model's answer again (the person's goes to the history). The verdict stays in
    `llmledger_verdicts`, marked `undone_at`. Returns the verdict taken back ("accept", "flag", "correct"), or None
    when there was none."""
    _check_names(table, step)
    if key is None:
        raise InvalidInputError("undo_verdict() takes back one row's verdict: pass key= its key value")
    return open_existing(store).undo_verdict(table, step, key=key, by=_by(by), now=utcnow())


def verdicts(store: str | Path, table: str | None = None, step: str | None = None) -> pl.DataFrame:
    """Every verdict a person gave (accept, flag, correct), oldest first: which row (`row_key`, as JSON), the answer
    judged (`answer`, `fingerprint`, `source`), `corrected`, `reason`, `reviewer`, `judged_at`. The same rows as
    `SELECT * FROM llmledger_verdicts`."""
    for name, value in (("table", table), ("step", step)):
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidInputError(f"{name} must be a {name} name (or None for every one), got {value!r}")
    return open_existing(store).verdicts(table, step)


def _check_names(table: Any, step: Any) -> None:
    """A table and a step are names: anything else reached the store as a raw DuckDB error."""
    for name, value in (("table", table), ("step", step)):
        if not isinstance(value, str) or not value or "\x00" in value:
            raise InvalidInputError(f"{name} must be a {name} name (text, no NUL character), got {value!r}")


def _check_rows(key: Any, where: Any) -> None:
    if (key is None) == (where is None):
        raise InvalidInputError("name the rows judged with key= (one row) or where= (a SQL predicate), not both")
    if where is not None:
        _check_where(where)


def _check_reason(reason: str | None) -> None:
    """A reason is stored as text, which PostgreSQL cannot hold with a NUL in it (a store may move there)."""
    if reason is not None and "\x00" in reason:
        raise InvalidInputError("reason= holds a NUL character (\\x00), which the store cannot keep; remove it")


def _by(by: Any) -> str:
    if by is None:
        return _who()
    if not isinstance(by, str) or not by.strip() or "\x00" in by or len(by) > 200:
        raise InvalidInputError(f"by= names who judged, e.g. by='ana' (a name, at most 200 characters); got {by!r:.60}")
    return by


def _check_where(where: Any) -> None:
    if not isinstance(where, str) or not where.strip():
        raise InvalidInputError(
            f'where= must be a SQL predicate over the fact table such as "id IN (3, 7)" '
            f'(use "true" for every row), got {where!r}'
        )
    check_where_shape(where)


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
