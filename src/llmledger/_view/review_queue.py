"""Which rows the review view shows, and a row as it stands now: read from the store, never written.

`queue="needs"` orders the rows that need a person first: NEEDS_REVIEW, FAILED, flagged, stale (their own request
changed, or a step their prompt reads answered anew), rows where a `compare_with` step answers otherwise, then DONE
rows no one has judged (rows with a verdict are left out).
`queue="sample"` draws a seeded random sample of DONE rows no one has judged, sized by `sample=` or by the
margin wanted for the accuracy estimate (`accuracy.sample_size`). `where=` narrows both.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmledger._ledger import db_errors, known_table, open_existing, stale_condition, stored_outputs
from llmledger._ledger.columns import STEP_COLUMNS, names
from llmledger._ledger.query import sql
from llmledger._ledger.states import PERSON
from llmledger._ledger.where import check_where_shape
from llmledger._step.sqltext import q
from llmledger._view.accuracy import as_compared, sample_size
from llmledger.errors import InvalidInputError, WhereClauseError

QUEUES = ("needs", "sample")
# why a row is in the "needs" queue, in the order it is shown
REASONS = ("NEEDS_REVIEW", "FAILED", "flagged", "stale", "disagrees", "unreviewed")


@dataclass(frozen=True)
class Shape:
    """The table as a review sees it: its key and input columns, the step's typed fields (None: text)."""

    store: str | Path
    table: str
    step: str
    keys: list[str]
    inputs: list[str]
    schema: dict[str, Any] | None
    others: list[str] = field(default_factory=list)
    stale: str = "false"  # SQL over `t`: the answer is stale, by its own request or a step its prompt reads

    @property
    def fields(self) -> list[str]:
        return list((self.schema or {}).get("properties", {}))


@dataclass
class Row:
    """One row as it stands: its key, inputs, answer (text, or a typed answer's dict) and state."""

    key: Any
    inputs: dict[str, Any]
    answer: Any
    status: str
    verdict: str | None
    verdict_by: str | None
    flag: str | None
    error: str | None
    source: str | None
    stale: bool
    others: dict[str, Any]
    earlier: list[dict[str, Any]] = field(default_factory=list)
    # what a verdict judges: the answer shown (its fingerprint and finished_at) to the request shown (the row's
    # inputs: a row recorded anew with other text keeps its answer, stale, under another request fingerprint)
    seen: tuple[str | None, Any, str | None] = (None, None, None)


def check_names(table: Any, step: Any) -> None:
    """The table and step reviewed are names (InvalidInputError, before anything reads the store)."""
    if not isinstance(table, str) or not table or not isinstance(step, str) or not step:
        raise InvalidInputError(f"table and step are names, got {table!r} and {step!r}")


def shape_of(store: str | Path, table: str, step: str, compare_with: Any = ()) -> Shape:
    """The shape of `table` for reviewing `step` beside `compare_with`, or InvalidInputError naming what is wrong."""
    check_names(table, step)
    if not isinstance(compare_with, list | tuple) or not all(isinstance(s, str) and s for s in compare_with):
        raise InvalidInputError(f"compare_with is a list of step names, e.g. ['label_sonnet'], got {compare_with!r}")
    open_existing(store).migrated()  # not there: StoreNotFound, not "no such step"; older: read as it is now
    steps, columns, keys, _ = known_table(store, table)
    for name in [step, *compare_with]:
        if name not in steps:
            raise InvalidInputError(f"table {table!r} has no step {name!r}; it has: {steps or 'no steps'}")
    if step in compare_with:
        raise InvalidInputError(f"compare_with names the step under review ({step!r}); name other steps")
    owned = {s + c.suffix for s in steps for c in STEP_COLUMNS}
    inputs = [c for c in columns if c not in keys and c not in owned and not c.startswith("_")]
    spec = stored_outputs(store, table).get(step)
    stale = stale_condition(store, table, step)
    return Shape(store, table, step, keys, inputs, None if spec is None else spec.schema, list(compare_with), stale)


def key_id(key: Any) -> str:
    """A row's key as one string (a dict of several key columns in a stable order)."""
    return json.dumps(key, sort_keys=True, default=str)


def _key_of(shape: Shape, record: dict[str, Any]) -> Any:
    if len(shape.keys) == 1:
        return record[shape.keys[0]]
    return {k: record[k] for k in shape.keys}


def _answer(value: Any, typed: bool) -> Any:
    """A typed answer as a dict whatever the engine hands back (a STRUCT, JSONB or its text)."""
    if typed and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _select(shape: Shape, *, inputs: bool) -> str:
    c = names(shape.step, "t")
    cols = [q(k) for k in shape.keys] + ([q(i) for i in shape.inputs] if inputs else [])
    cols += [f"{c['']} AS __answer", f"{c['_status']} AS __status", f"{c['_verdict']} AS __verdict",
             f"{c['_verdict_by']} AS __verdict_by", f"{c['_flag']} AS __flag", f"{c['_error']} AS __error",
             f"{c['_source']} AS __source", f"coalesce({shape.stale}, false) AS __stale",
             f"{c['_fingerprint']}::VARCHAR AS __fingerprint", f"{c['_finished_at']} AS __finished_at",
             f"{c['_request_fingerprint']}::VARCHAR AS __request"]  # fmt: skip
    cols += [f"{names(o, 't')['']} AS {q('__other_' + o)}" for o in shape.others]
    return ", ".join(cols)


def _records_sql(shape: Shape, where: str | None, *, key: Any = None, inputs: bool) -> tuple[str, dict[str, Any]]:
    conditions, params = [f"coalesce(({where}), false)" if where else "true"], {}
    if key is not None:
        values = key if isinstance(key, dict) else {shape.keys[0]: key}
        for i, (column, value) in enumerate(values.items()):
            conditions.append(f"{q(column)} = $k{i}")
            params[f"k{i}"] = value
    order = ", ".join(q(k) for k in shape.keys)
    return (
        f"SELECT {_select(shape, inputs=inputs)} FROM {q(shape.table)} AS t WHERE {' AND '.join(conditions)} "
        f"ORDER BY {order}",
        params,
    )


def _records(shape: Shape, where: str | None, *, inputs: bool) -> list[dict[str, Any]]:
    query, params = _records_sql(shape, where, inputs=inputs)
    found = sql(shape.store, query, params or None)
    return [] if found is None else found.to_dicts()


def reason_of(record: dict[str, Any], others: list[str], typed: bool) -> str | None:
    """Why the row needs a person (one of REASONS), or None when a person has judged it or it has no answer yet."""
    status = record["__status"]
    if status in ("NEEDS_REVIEW", "FAILED"):
        return str(status)
    if record["__flag"] is not None:
        return "flagged"
    if status != "DONE" or record["__verdict"] is not None:
        return None
    if record["__stale"]:
        return "stale"
    mine = as_compared(_text(_answer(record["__answer"], typed)))
    for other in others:
        theirs = record["__other_" + other]
        if theirs is not None and as_compared(_text(theirs)) != mine:
            return "disagrees"
    return "unreviewed"


def _text(answer: Any) -> Any:
    return json.dumps(answer, ensure_ascii=False, default=str) if isinstance(answer, dict) else answer


def queue_keys(
    shape: Shape,
    *,
    where: str | None = None,
    queue: str = "needs",
    sample: int | None = None,
    margin: float | None = None,
    seed: int = 0,
) -> list[Any]:
    """The keys of the rows to review, in the order to show them."""
    if where is not None:
        if not isinstance(where, str) or not where.strip():
            raise InvalidInputError(f"where must be a SQL predicate such as \"label = 'spam'\", got {where!r}")
        check_where_shape(where)
    if queue not in QUEUES:
        raise InvalidInputError(f"queue is 'needs' (rows that need a person first) or 'sample', got {queue!r}")
    if queue == "needs" and (sample is not None or margin is not None):
        raise InvalidInputError("sample= and margin= size a random sample: pass queue='sample' with them")
    try:
        records = _records(shape, where, inputs=False)
    except db_errors() as exc:  # the predicate does not fit the table: said as apply_llm says it
        if where is None:
            raise
        raise WhereClauseError(
            f"where={where!r} does not work on table {shape.table!r}: {str(exc).splitlines()[0]}"
        ) from None
    typed = shape.schema is not None
    if queue == "needs":
        ranked = [(REASONS.index(r), i, rec) for i, rec in enumerate(records)
                  if (r := reason_of(rec, shape.others, typed)) is not None]  # fmt: skip
        return [_key_of(shape, rec) for _, _, rec in sorted(ranked, key=lambda t: (t[0], t[1]))]
    n = sample_count(sample, margin)
    pool = [_key_of(shape, rec) for rec in records if reason_of(rec, [], typed) == "unreviewed"]
    return random.Random(seed).sample(pool, min(n, len(pool)))


def sample_count(sample: Any, margin: Any) -> int:
    """Rows in a sample: `sample=` itself, or the size `margin=` asks for (at 95 %)."""
    if (sample is None) == (margin is None):
        raise InvalidInputError("queue='sample' takes sample= (rows) or margin= (e.g. 0.05 for ±5 points), not both")
    if sample is not None:
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
            raise InvalidInputError(f"sample is a number of rows, at least 1, got {sample!r}")
        return sample
    if isinstance(margin, bool) or not isinstance(margin, int | float):
        raise InvalidInputError(f"margin is a share such as 0.05 (±5 points), got {margin!r}")
    return sample_size(float(margin))


def load_row(shape: Shape, key: Any) -> Row | None:
    """The row `key` as it stands now, with its earlier answers (None if it is gone)."""
    query, params = _records_sql(shape, None, key=key, inputs=True)
    try:
        found, earlier_found = open_existing(shape.store).row_and_history(shape.table, shape.step, query, params, key)
    except db_errors():  # a table or step dropped under an open view: said so, not DuckDB's CatalogException
        steps, columns, _, _ = known_table(shape.store, shape.table)
        missing = [s for s in (shape.step, *shape.others) if s not in steps or s not in columns]
        if columns and not missing:
            raise
        gone = f"step {missing[0]!r} of table {shape.table!r}" if columns else f"table {shape.table!r}"
        raise InvalidInputError(
            f"{gone} is no longer in the store (dropped since this review began): start the review again"
        ) from None
    if found is None or found.is_empty():
        return None
    rec, typed = found.row(0, named=True), shape.schema is not None
    earlier = [] if earlier_found is None else earlier_found.to_dicts()
    return Row(
        key=key,
        inputs={i: rec[i] for i in shape.inputs},
        answer=_answer(rec["__answer"], typed),
        status=rec["__status"],
        verdict=rec["__verdict"],
        verdict_by=rec["__verdict_by"],
        flag=rec["__flag"],
        error=rec["__error"],
        source=rec["__source"],
        stale=bool(rec["__stale"]),
        others={o: rec["__other_" + o] for o in shape.others},
        seen=(rec["__fingerprint"], rec["__finished_at"], rec["__request"]),
        earlier=[
            {"reason": e.get("reason"), "answer": e.get("old_output"), "model": e.get("old_model")} for e in earlier
        ],
    )


def redo_where(shape: Shape, where: str | None) -> str:
    """The rows the view's "redo flagged" sends, as `where=`: the flagged ones within `where`. `redo="flagged"`
    alone also sends rows never answered (or FAILED with tries left), which the view never asked about (an attack
    found 47 rows paid, past the budget that had stopped them, after the view announced 2)."""
    flagged = f"{q(shape.step + '_flag')} IS NOT NULL"
    return f"({where}) AND {flagged}" if where else flagged


def resendable(shape: Shape, where: str | None) -> int:
    """How many rows that redo pays for: flagged, not in flight, and not a person's answer (no redo replaces one)."""
    rows = _records(shape, redo_where(shape, where), inputs=False)
    return sum(r["__source"] != PERSON and r["__status"] not in ("RUNNING", "SUBMITTED") for r in rows)


def flagged_keys(shape: Shape, where: str | None = None) -> list[Any]:
    """The keys of the flagged rows (what `redo="flagged"` sends again)."""
    return [_key_of(shape, r) for r in _records(shape, where, inputs=False) if r["__flag"] is not None]
