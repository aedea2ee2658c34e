"""`llmledger.review`: the review view (`_view/review.py`) with its "redo flagged" wired to `resume`, which the
view, a layer below the run, cannot import itself."""

from __future__ import annotations

from numbers import Integral
from pathlib import Path
from typing import Any

from llmledger._ledger import known_table
from llmledger._run.api import resume
from llmledger._run.endpoints import check_any_client
from llmledger._run.frames import as_polars
from llmledger._run.options import check_max_cost
from llmledger._run.run import Run
from llmledger._step.request import sql_literal
from llmledger._step.sqltext import q
from llmledger._view.review import ReviewView
from llmledger._view.review_queue import check_names
from llmledger._view.review_session import Session
from llmledger.errors import InvalidInputError


def review(
    store: str | Path | Run,
    table: str | None = None,
    step: str | None = None,
    *,
    where: str | None = None,
    queue: str = "needs",
    sample: int | None = None,
    margin: float | None = None,
    by: str | None = None,
    compare_with: Any = (),
    seed: int = 0,
    client: Any = None,
    max_cost_usd: float | None = None,
    rows: Any = None,
) -> ReviewView:
    """Review the answers of `step` one row at a time in the notebook, keyboard first.

        llmledger.review("ledger.duckdb", "sms", "label", compare_with=["label_sonnet"])
        llmledger.review("ledger.duckdb", "sms", "label", queue="sample", margin=0.05)
        llmledger.review(run)  # the Run apply_llm(..., background=True) returned: its store, table, step, rows
        llmledger.review("ledger.duckdb", "sms", "label", rows=sample)  # only the rows of a frame (its keys)

    Each row shows its inputs (image paths or bytes as thumbnails), the answer (a typed answer one field per line),
    its status, verdict and flag, its earlier answers, and the same row's answers of the `compare_with` steps.
    Keys, typed into the focused box: `a` accept, `f` flag (then an optional reason, Enter), `c` correct (type the
    right answer, Enter; a typed answer one field at a time, Enter keeping a field, checked against the step's
    schema), `s` skip, `u` undo (this reviewer's latest verdict), `j`/`n` next, `k`/`p` previous, `r` twice
    redo flagged (the second `r` confirms: it pays). Every verdict is written to the ledger at once (`accept`,
    `flag`, `correct`, `undo_verdict`), as `by` (default: the login name).

    - `queue="needs"`: NEEDS_REVIEW, FAILED, flagged and stale rows first (stale: the row's request changed, or a
      step its prompt reads has answered anew), then rows where a `compare_with` step answers otherwise, then DONE
      rows no one judged. `queue="sample"` with `sample=n`, or `margin=0.05` (the
      rows an accuracy within ±5 points at 95 % needs): a random sample (`seed`) of DONE rows no one judged.
    - `where=`: a SQL predicate narrowing the rows, as everywhere. `rows=`: a frame (polars or pandas, say the one
      apply_llm was given or returned) whose key columns name the only rows to review; a Run's own frame, when
      reviewing a Run that had one (of at most 20,000 rows; a larger one's rows are narrowed by `where=` alone).
    - "redo flagged" runs `resume(store, table, step, redo="flagged", background=True)` on exactly the flagged rows
      (with `client=` and `max_cost_usd=`, if given; a Run's own, when reviewing one) and, when it ends, puts the
      redone rows back into the queue.

    The counter shows the rows reviewed and left, and the share accepted with its Wilson interval.
    `llmledger review STORE` is the terminal twin.
    """

    at: str | Path
    if isinstance(store, Run):  # its store, table, step (unless named) and client
        plan = store.plan
        table = plan.table if table is None else table
        step = plan.step if step is None else step
        client = plan.client if client is None else client
        max_cost_usd = plan.cfg.max_cost_usd if max_cost_usd is None else max_cost_usd
        if rows is None and plan.user_frame is not None and plan.user_frame.height <= MAX_ROWS:
            rows = plan.user_frame  # its own rows; a larger frame is reviewed by where= and the queue alone
        at = plan.store
    else:
        at = store
    if table is None or step is None:
        raise InvalidInputError(
            f"review() needs the table and the step: review(store, table, step), got table={table!r}, "
            f"step={step!r} (or pass the Run that apply_llm(..., background=True) returned)"
        )
    check_names(table, step)  # before rows= reads the table
    check_max_cost(max_cost_usd)  # checked now, not when "redo flagged" is pressed
    check_any_client(client, what='"redo flagged"')
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise InvalidInputError(f"seed is an integer that fixes the sample drawn, got {seed!r}")

    if rows is not None:
        where = rows_where(at, table, rows, where)
    session = Session(at, table, step, where=where, queue=queue, sample=sample, margin=margin, by=by,
                      compare_with=compare_with, seed=seed)  # fmt: skip

    def redo() -> Any:
        return resume(at, session.shape.table, session.shape.step, where=session.redo_where(), redo="flagged",
                      background=True, progress=True, client=client, max_cost_usd=max_cost_usd)  # fmt: skip

    return ReviewView(session, redo=redo)


MAX_ROWS = 20_000  # a review names its rows in its SQL: more than a person reviews in a week


def rows_where(store: str | Path, table: str, rows: Any, where: str | None) -> str:
    """`where`, narrowed to the rows whose key the frame `rows` holds (the table's key columns, as its own)."""
    frame, _ = as_polars(rows)
    keys = known_table(store, table).key
    missing = [k for k in keys if k not in frame.columns]
    if not keys or missing:
        raise InvalidInputError(
            f"rows= is a frame with the key column(s) of table {table!r} ({', '.join(keys) or 'none found'}); it "
            f"lacks {', '.join(map(repr, missing)) or 'them'}"
        )
    named = frame.select(keys).unique(maintain_order=True)
    if named.height > MAX_ROWS:
        raise InvalidInputError(
            f"rows= names {named.height:,} rows; review at most {MAX_ROWS:,} at once (a sample: "
            f"rows=df.sample({min(1_000, MAX_ROWS):,}), or queue='sample')"
        )
    if not named.height:
        raise InvalidInputError("rows= is an empty frame: it names no row to review")
    values = ", ".join(
        "(" + ", ".join("NULL" if v is None else str(v) if isinstance(v, int) and not isinstance(v, bool)
                        else sql_literal(str(v)) for v in row) + ")"
        for row in named.iter_rows()
    )  # fmt: skip
    columns = ", ".join(q(k) for k in keys)
    narrowed = f"({columns}) IN ({values})"
    return f"({where}) AND {narrowed}" if where else narrowed
