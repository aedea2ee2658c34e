"""What `llmledger.compare` reads: several steps of one table that answered the same rows (one step per model, say),
compared answer by answer.

Two answers agree when they are the same text once case, surrounding spaces and trailing punctuation are set
aside ("Positive." and "positive" agree); a structured answer is compared field by field, over the fields every
compared step's schema has. Only rows where both steps of a pair are DONE count for that pair. The rows where some
pair differs come back with their inputs and every step's answer, and as one SQL predicate (`differ`) over the
fact table, which `llmledger.flag(..., where=...)` takes as it is, so those rows can be redone.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import polars as pl

from llmledger._ledger.columns import output_as_text
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.shared import column_types, table_exists
from llmledger._ledger.schema import current_output_spec, list_steps, owned_columns
from llmledger._ledger.survey import check_where
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError

ANSWER = "answer"  # the field name of a text answer in the agreement frame


@dataclass(frozen=True)
class ComparisonData:
    steps: list[str]
    fields: list[str]  # compared fields (["answer"] for text answers)
    agreement: pl.DataFrame  # step_a, step_b, field, both_done, agree, share
    # step, model, rows, done, cost_usd_per_row, input_tokens_per_row, output_tokens_per_row, latency_ms_per_row
    per_step: pl.DataFrame
    differences: pl.DataFrame  # the key, the inputs, each step's answer (as text), for rows where a pair differs
    differ: str  # SQL predicate over the fact table: the rows in `differences`
    differ_by_step: dict[str, str]  # per step: the rows where it differs from another step


_SPACE = "chr(32) || chr(9) || chr(10) || chr(11) || chr(12) || chr(13)"
# ASCII's punctuation, spelled out: the engines' [[:punct:]] differ beyond ASCII
_PUNCTUATION = "'" + string.punctuation.replace("'", "''") + "'"


def normalized(text: str) -> str:
    """`normalized_sql` in Python: an answer as compared."""
    return text.lower().strip(_SPACE_CHARS).rstrip(_SPACE_CHARS + string.punctuation)


_SPACE_CHARS = " \t\n\x0b\x0c\r"


def normalized_sql(expr: str) -> str:
    """An answer as compared: lower case, without surrounding whitespace or trailing (ASCII) punctuation. rtrim and
    ltrim with a set of characters mean the same on both engines."""
    return f"rtrim(ltrim(lower({expr}), {_SPACE}), {_SPACE} || {_PUNCTUATION})"


def _numeric(spec: Any, field: str) -> bool:
    prop = (spec.schema.get("properties") or {}).get(field) or {}
    kinds = prop.get("type") if "type" in prop else [a.get("type") for a in prop.get("anyOf", [])]
    kinds = [kinds] if isinstance(kinds, str) else [k for k in kinds or [] if k != "null"]
    return bool(kinds) and all(k in ("integer", "number") for k in kinds)


def read_comparison(con: Con, table: str, steps: list[str], where: str | None) -> ComparisonData:
    keys = {s: key for _, s, key in list_steps(con, table)}
    known = list(keys)
    if not table_exists(con, table) or not known:
        raise InvalidInputError(f"the store has no table {table!r} with steps; compare reads steps apply_llm made")
    missing = [s for s in steps if s not in known]
    if missing:
        raise InvalidInputError(f"table {table!r} has no step {missing[0]!r}; its steps: {known}")
    check_where(con, table, where)
    dialect = dialect_of(con)
    specs = {s: current_output_spec(con, table, s) for s in steps}
    structured = [s for s in steps if specs[s] is not None]
    if structured and len(structured) != len(steps):
        raise InvalidInputError(
            f"steps {structured} answer with a structure and {[s for s in steps if s not in structured]} in text; "
            "compare steps that answer alike (all text, or all structured)"
        )
    if structured:
        shapes = [list(specs[s].schema.get("properties") or {}) for s in steps]  # type: ignore[union-attr]
        fields = [f for f in shapes[0] if all(f in shape for shape in shapes[1:])]
        if not fields:
            raise InvalidInputError(f"steps {steps} share no field of their output schemas: nothing to compare")
        value = {(s, f): dialect.field_text_sql(q(s), f) for s in steps for f in fields}
        numeric = {f for f in fields if all(_numeric(specs[s], f) for s in steps)}  # 1 and 1.0 agree
    else:
        fields = [ANSWER]
        value = {(s, ANSWER): q(s) for s in steps}
        numeric = set()
    done = {s: f"{q(s + '_status')} = 'DONE'" for s in steps}
    within = f"coalesce(({where}), false)" if where else "true"
    pairs = list(combinations(steps, 2))

    def compared(s: str, f: str) -> str:
        return f"CAST({value[(s, f)]} AS DOUBLE)" if f in numeric else normalized_sql(value[(s, f)])

    differs = {
        (a, b, f): f"({done[a]} AND {done[b]} AND {compared(a, f)} IS DISTINCT FROM {compared(b, f)})"
        for a, b in pairs
        for f in fields
    }
    counts = ", ".join(
        f"count(*) FILTER (WHERE {done[a]} AND {done[b]}), count(*) FILTER (WHERE {done[a]} AND {done[b]} "
        f"AND NOT {differs[(a, b, f)]})"
        for a, b in pairs
        for f in fields
    )
    found = con.execute(f"SELECT {counts} FROM {q(table)} WHERE {within}").fetchall()[0]
    agreement = pl.DataFrame(
        [
            {"step_a": a, "step_b": b, "field": f, "both_done": int(found[2 * n]), "agree": int(found[2 * n + 1])}
            for n, (a, b, f) in enumerate(differs)
        ],
        schema={"step_a": pl.String, "step_b": pl.String, "field": pl.String, "both_done": pl.Int64, "agree": pl.Int64},
    ).with_columns(share=pl.when(pl.col("both_done") > 0).then(pl.col("agree") / pl.col("both_done")).otherwise(None))
    differ = " OR ".join(differs.values())
    owned = {c for s in known for c in owned_columns(con, table, s)}
    inputs = [c for c in column_types(con, table) if c not in owned]
    types = column_types(con, table)
    shown = ", ".join([*(q(c) for c in inputs), *(f"{output_as_text(q(s), types[s])} AS {q(s)}" for s in steps)])
    order = ", ".join(q(k) for k in keys[steps[0]])
    differences = con.sql(f"SELECT {shown} FROM {q(table)} WHERE {within} AND ({differ}) ORDER BY {order}").pl()
    paid = {s: f"{done[s]} AND {q(s + '_input_tokens')} > 0" for s in steps}  # not answers reused for free
    per_step = pl.concat(
        [
            con.sql(
                f"SELECT ? AS step, min({q(s + '_model')}) AS model, count(*)::BIGINT AS rows, "
                f"count(*) FILTER (WHERE {done[s]})::BIGINT AS done, "
                f"CASE WHEN count(*) FILTER (WHERE {paid[s]} AND {q(s + '_cost_usd')} IS NULL) > 0 THEN NULL "
                f"ELSE avg({q(s + '_cost_usd')}) FILTER (WHERE {paid[s]}) END AS cost_usd_per_row, "
                f"avg({q(s + '_input_tokens')}) FILTER (WHERE {paid[s]}) AS input_tokens_per_row, "
                f"avg({q(s + '_output_tokens')}) FILTER (WHERE {paid[s]}) AS output_tokens_per_row, "
                f"avg({q(s + '_latency_ms')}) FILTER (WHERE {paid[s]}) AS latency_ms_per_row "
                f"FROM {q(table)} WHERE {within}",
                params=[s],
            )
            .pl()
            .cast(
                {
                    "cost_usd_per_row": pl.Float64,
                    "input_tokens_per_row": pl.Float64,
                    "output_tokens_per_row": pl.Float64,
                    "latency_ms_per_row": pl.Float64,
                }
            )
            for s in steps
        ]
    )
    by_step = {
        s: f"({within} AND ({' OR '.join(v for (a, b, _), v in differs.items() if s in (a, b))}))" for s in steps
    }
    return ComparisonData(steps, fields, agreement, per_step, differences, f"({within} AND ({differ}))", by_step)
