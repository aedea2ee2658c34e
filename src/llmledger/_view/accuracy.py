"""`llmledger.accuracy(store, table, step)`: how often a step is right on the rows a person reviewed, with a
confidence interval, and, beside the other steps that answer the same question (other models, other prompts), their
agreement with the person's truth and what each costs per row: the cheapest step good enough.

What counts as right, per step and row:

- the step's own answers a person judged (its latest verdict on the row): accepted, or corrected to the same
  value, is right; flagged, or corrected to another value, is wrong;
- otherwise its current answer against the person's truth for the row, from the latest verdict on any of the
  compared steps: the answer accepted, or the corrected value; after a flag alone, only an answer equal to the
  flagged one is known (wrong); other rows are left out.

Answers are compared as `compare` compares them: case, surrounding space and trailing punctuation set aside, and
typed answers field by field (`fields`: per field, on the rows whose truth has the field).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import polars as pl

from llmledger._draw import esc, usd
from llmledger._ledger import open_existing
from llmledger._ledger.compare import normalized
from llmledger._ledger.states import PERSON
from llmledger._view.chart import chart_svg
from llmledger.errors import InvalidInputError


def wilson(right: int, n: int, confidence: float = 0.95) -> tuple[float, float] | tuple[None, None]:
    """The Wilson score interval of a share `right` of `n` (None, None for no rows): unlike the normal
    approximation it stays inside [0, 1] and does not collapse at 0 % or 100 %, where small samples often sit."""
    if n == 0:
        return None, None
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = right / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if right == 0 else max(0.0, min(p, centre - half))  # exact at the ends, where rounding would stray
    high = 1.0 if right == n else min(1.0, max(p, centre + half))
    return low, high


def sample_size(margin: float, confidence: float = 0.95) -> int:
    """Rows to review for an accuracy within ±`margin` at `confidence`, whatever the accuracy is (the worst case,
    50 %): ±5 points at 95 % is 385 rows."""
    if not 0 < margin < 1 or not 0 < confidence < 1:
        raise InvalidInputError(f"margin and confidence are shares between 0 and 1, got {margin!r}, {confidence!r}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return math.ceil(z * z * 0.25 / (margin * margin) - 1e-9)


def accuracy(
    store: str | Path,
    table: str,
    step: str,
    *,
    against: Sequence[str] = (),
    target: float | None = None,
    confidence: float = 0.95,
) -> Accuracy:
    """How often `step` is right on the rows a person reviewed (`accept`, `flag`, `correct`, or the review view),
    with a Wilson interval at `confidence`, and the same for each step of `against` (other models or prompts for
    the same question) against the person's truth, with each step's cost per 1,000 rows.

        acc = llmledger.accuracy("ledger.duckdb", "sms", "label_haiku", against=["label_sonnet"], target=0.9)
        acc.table      # step, reviewed, right, accuracy, low, high, usd_per_1000_rows, meets_target
        acc.cheapest   # the cheapest step whose interval's low end reaches target (None if none does)
        acc.fields     # typed answers: the same per field

    Reads only. The module's docstring says what counts as right.
    """
    steps = _check(table, step, against, target, confidence)
    ledger = open_existing(store)
    answers = ledger.answers(table, steps)
    verdicts = ledger.verdicts(table).filter(pl.col("step").is_in(steps) & pl.col("undone_at").is_null())
    judged = _judgements(steps, answers, verdicts)
    return Accuracy(
        table,
        steps,
        _summary(steps, judged, answers, confidence, target),
        _fields(judged, confidence),
        target,
        _reviewers(verdicts),
        confidence,
    )


@dataclass(frozen=True)
class Accuracy:
    """What `accuracy` returns: frames, the cheapest step good enough, a text summary and a notebook table."""

    table_name: str
    steps: list[str]
    table: pl.DataFrame
    fields: pl.DataFrame | None
    target: float | None
    reviewers: pl.DataFrame | None = None  # per pair of reviewers: answers both judged, and how many alike
    confidence: float = 0.95  # of the intervals

    @property
    def cheapest(self) -> str | None:
        """The cheapest step (known cost) whose interval's low end reaches the target; None without a target."""
        if self.target is None:
            return None
        good = self.table.filter(pl.col("meets_target") & pl.col("usd_per_1000_rows").is_not_null())
        return None if good.is_empty() else str(good.sort("usd_per_1000_rows")["step"][0])

    def lines(self) -> list[str]:
        out = []
        for r in self.table.iter_rows(named=True):
            cost = "cost unknown" if r["usd_per_1000_rows"] is None else f"{usd(r['usd_per_1000_rows'])} per 1,000 rows"
            if not r["reviewed"]:
                out.append(f"{r['step']}: no reviewed rows yet ({cost})")
                continue
            out.append(
                f"{r['step']} is {r['accuracy']:.0%} ({r['low']:.0%}–{r['high']:.0%}) right on {r['reviewed']:,} "
                f"reviewed rows, at {cost}"
            )
        for r in self.reviewers.iter_rows(named=True) if self.reviewers is not None else ():
            out.append(
                f"{r['reviewer_a']} and {r['reviewer_b']} judged {r['both']:,} answers of {r['step']} both: alike on "
                f"{r['agree']:,} ({r['share']:.0%})"
            )
        if self.target is not None:
            best = self.cheapest
            out.append(
                f"cheapest whose low end reaches {self.target:.0%}: {best}"
                if best
                else f"no step is known to reach {self.target:.0%} yet: review more rows, or try a stronger model"
            )
        return out

    def __str__(self) -> str:
        return f"{self.table_name}: accuracy on reviewed rows\n" + "\n".join("  " + line for line in self.lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = "".join(f"<li>{esc(line)}</li>" for line in self.lines())
        head = f"<b>{esc(self.table_name)}</b>: accuracy on reviewed rows"
        return f'<div class="llmledger-accuracy">{head}<ul>{rows}</ul>{self.chart()}</div>'

    def chart(self) -> str:
        """Each reviewed step with a known cost: its cost per 1,000 rows (x) against the share right (y), with its
        interval and the target as a dashed line: the cheapest good enough is the left-most whose bar clears it."""
        reviewed = self.table.filter(pl.col("reviewed") > 0)
        drawn = reviewed.filter(pl.col("usd_per_1000_rows").is_not_null())
        unknown = reviewed.filter(pl.col("usd_per_1000_rows").is_null())["step"].to_list()
        note = (
            f"<div>not drawn, its cost unknown: {esc(', '.join(unknown))} (llmledger.set_price sets a price)</div>"
            if unknown
            else ""
        )
        if drawn.is_empty():
            return note
        rows = list(drawn.iter_rows(named=True))
        return note + chart_svg(
            [(r["step"], float(r["usd_per_1000_rows"]), float(r["accuracy"])) for r in rows],
            x_title="cost per 1,000 rows",
            y_title=f"right on reviewed rows ({self.confidence * 100:g}% interval)",
            intervals={r["step"]: (float(r["low"]), float(r["high"])) for r in rows},
            target=self.target,
        )


def _check(table: Any, step: Any, against: Any, target: Any, confidence: Any) -> list[str]:
    if not isinstance(table, str) or not table:
        raise InvalidInputError(f"table must be a table name, got {table!r}")
    if not isinstance(step, str) or not step:
        raise InvalidInputError(f"step must be a step name, got {step!r}")
    if isinstance(against, str) or not all(isinstance(s, str) and s for s in against):
        raise InvalidInputError(f"against must be a list of step names, e.g. ['label_sonnet'], got {against!r}")
    steps = [step, *against]
    if len(set(steps)) != len(steps):
        raise InvalidInputError(f"step and against name a step twice: {steps}")
    if target is not None and (isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < 1):
        raise InvalidInputError(f"target is a share between 0 and 1 (0.9 for 90 %), got {target!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, float) or not 0.5 <= confidence < 1:
        raise InvalidInputError(f"confidence is a share such as 0.95, got {confidence!r}")
    return steps


def as_compared(text: Any) -> Any:
    """An answer as compared: a typed one's fields, normalized; text normalized."""
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except (TypeError, ValueError):
        return normalized(str(text))
    if isinstance(parsed, dict):
        return {k: normalized(v) if isinstance(v, str) else v for k, v in parsed.items()}
    return normalized(str(text))


def _judgements(steps: list[str], answers: pl.DataFrame, verdicts: pl.DataFrame) -> list[dict[str, Any]]:
    """One judgement per (step, reviewed row): right or wrong, and per field for typed answers.

    The person's truth for a row is the latest verdict on it (any step, any reviewer): the answer accepted, the
    value corrected to, or after a flag only "not this answer". A step is judged by the model's answer a person
    last judged on the row (a verdict on a person's own answer says nothing of the model), else by its current
    answer; a row the model never answered is left out."""
    truth: dict[str, dict[str, Any]] = {}
    model: dict[tuple[str, str], dict[str, Any]] = {}
    for r in verdicts.sort("judged_at").iter_rows(named=True):
        truth[r["row_key"]] = r
        if r["answer"] is not None and r["source"] != PERSON:
            model[(r["step"], r["row_key"])] = r
    current = {r["row_key"]: r for r in answers.filter(pl.col("row_key").is_in(list(truth))).iter_rows(named=True)}
    out = []
    for row_key, said in truth.items():
        flagged = said["verdict"] == "flag"
        known = None if flagged else as_compared(said["answer"] if said["verdict"] == "accept" else said["corrected"])
        for step in steps:
            mine = model.get((step, row_key))
            if mine is not None:
                judged = as_compared(mine["answer"])
            else:
                answer = current.get(row_key, {})
                if answer.get(step) is None or answer.get(step + "_source") == PERSON:
                    continue
                judged = as_compared(answer[step])
            if flagged:  # only "not this answer" is known
                if judged == as_compared(said["answer"]):
                    out.append({"step": step, "right": False, "fields": None})
                continue
            fields = (
                {f: judged.get(f) == v for f, v in known.items()}
                if isinstance(known, dict) and isinstance(judged, dict)
                else None
            )
            out.append({"step": step, "right": judged == known, "fields": fields})
    return out


def _summary(
    steps: list[str], judged: list[dict[str, Any]], answers: pl.DataFrame, confidence: float, target: float | None
) -> pl.DataFrame:
    rows = []
    for step in steps:
        mine = [j["right"] for j in judged if j["step"] == step]
        n, right = len(mine), sum(mine)
        low, high = wilson(right, n, confidence)
        paid = answers.filter(pl.col(step).is_not_null() & (pl.col(step + "_source").fill_null("") != PERSON))[
            step + "_cost_usd"
        ]
        cost = None if paid.is_empty() or paid.null_count() else float(paid.mean()) * 1000  # type: ignore[arg-type]
        rows.append({
            "step": step, "reviewed": n, "right": right, "accuracy": right / n if n else None, "low": low,
            "high": high, "usd_per_1000_rows": cost,
            "meets_target": None if target is None else bool(low is not None and low >= target),
        })  # fmt: skip
    return pl.DataFrame(
        rows,
        schema={"step": pl.String, "reviewed": pl.Int64, "right": pl.Int64, "accuracy": pl.Float64, "low": pl.Float64,
                "high": pl.Float64, "usd_per_1000_rows": pl.Float64, "meets_target": pl.Boolean},
    )  # fmt: skip


def _reviewers(verdicts: pl.DataFrame) -> pl.DataFrame | None:
    """How often two reviewers judged the same answer alike (right, or wrong), per pair and step: where their
    verdicts disagree, the latest one counts for accuracy, and this says how much that choice matters."""
    latest = verdicts.sort("judged_at").group_by("step", "row_key", "answer", "reviewer", maintain_order=True).last()
    said: dict[tuple[str, str, str], dict[str, bool]] = {}
    for r in latest.iter_rows(named=True):
        right = r["verdict"] == "accept" or (
            r["verdict"] == "correct" and as_compared(r["corrected"]) == as_compared(r["answer"])
        )
        said.setdefault((r["step"], r["row_key"], r["answer"]), {})[r["reviewer"]] = right
    pairs: dict[tuple[str, str, str], list[bool]] = {}
    for (step, _, _), by in said.items():
        names = sorted(by)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                pairs.setdefault((step, a, b), []).append(by[a] == by[b])
    if not pairs:
        return None
    return pl.DataFrame(
        [{"step": step, "reviewer_a": a, "reviewer_b": b, "both": len(alike), "agree": sum(alike),
          "share": sum(alike) / len(alike)} for (step, a, b), alike in pairs.items()]
    )  # fmt: skip


def _fields(judged: list[dict[str, Any]], confidence: float) -> pl.DataFrame | None:
    per: dict[tuple[str, str], list[bool]] = {}
    for j in judged:
        for field, ok in (j["fields"] or {}).items():
            per.setdefault((j["step"], field), []).append(ok)
    if not per:
        return None
    rows = []
    for (step, field), oks in per.items():
        low, high = wilson(sum(oks), len(oks), confidence)
        rows.append({"step": step, "field": field, "reviewed": len(oks), "right": sum(oks),
                     "accuracy": sum(oks) / len(oks), "low": low, "high": high})  # fmt: skip
    return pl.DataFrame(rows)
