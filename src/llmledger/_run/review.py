"""`llmledger.review`: the review view (`_view/review.py`) with its "redo flagged" wired to `resume`, which the
view, a layer below the run, cannot import itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmledger._run.api import resume
from llmledger._view.review import ReviewView
from llmledger._view.review_session import Session


def review(
    store: str | Path,
    table: str,
    step: str,
    *,
    where: str | None = None,
    queue: str = "needs",
    sample: int | None = None,
    margin: float | None = None,
    by: str | None = None,
    compare_with: Any = (),
    seed: int = 0,
    client: Any = None,
) -> ReviewView:
    """Review the answers of `step` one row at a time in the notebook, keyboard first.

        llmledger.review("ledger.duckdb", "sms", "label", compare_with=["label_sonnet"])
        llmledger.review("ledger.duckdb", "sms", "label", queue="sample", margin=0.05)

    Each row shows its inputs (image paths or bytes as thumbnails), the answer (a typed answer one field per line),
    its status, verdict and flag, its earlier answers, and the same row's answers of the `compare_with` steps.
    Keys, typed into the focused box: `a` accept, `f` flag (then an optional reason, Enter), `c` correct (type the
    right answer, Enter; a typed answer one field at a time, Enter keeping a field, checked against the step's
    schema), `s` skip, `u` undo (this reviewer's latest verdict), `j`/`n` next, `k`/`p` previous, `r` redo
    flagged. Every verdict is written to the ledger at once (`accept`, `flag`, `correct`, `undo_verdict`), as
    `by` (default: the login name).

    - `queue="needs"`: NEEDS_REVIEW, FAILED, flagged and stale rows first, then rows where a `compare_with` step
      answers otherwise, then DONE rows no one judged. `queue="sample"` with `sample=n`, or `margin=0.05` (the
      rows an accuracy within ±5 points at 95 % needs): a random sample (`seed`) of DONE rows no one judged.
    - `where=`: a SQL predicate narrowing the rows, as everywhere.
    - "redo flagged" runs `resume(store, table, step, redo="flagged", background=True)` (with `client=`, if
      given) and, when it ends, puts the redone rows back into the queue.

    The counter shows the rows reviewed and left, and the share accepted with its Wilson interval.
    `llmledger review STORE` is the terminal twin.
    """

    def redo() -> Any:
        return resume(store, table, step, where=where, redo="flagged", background=True, progress=True, client=client)

    session = Session(store, table, step, where=where, queue=queue, sample=sample, margin=margin, by=by,
                      compare_with=compare_with, seed=seed)  # fmt: skip
    return ReviewView(session, redo=redo)
