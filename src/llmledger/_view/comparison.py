"""`llmledger.compare(store, table, steps=[...])`: the same rows answered by several steps (one per model, say),
side by side: how often each pair agrees (per field of a structured answer), the rows where they differ with
their inputs, and what each step cost per row; in a notebook, an agreement matrix and a cost-against-agreement
chart. The rows where they differ are one SQL predicate, so `Comparison.flag` marks them for `redo="flagged"`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from llmledger._draw import esc, usd
from llmledger._ledger import open_existing
from llmledger._ledger.compare import ComparisonData
from llmledger._ledger.query import flag
from llmledger._view.accuracy import Accuracy, accuracy
from llmledger._view.chart import chart_svg
from llmledger.errors import InvalidInputError


def compare(store: str | Path, table: str, steps: list[str], *, where: str | None = None) -> Comparison:
    """Compare the answers of `steps` (two or more steps of `table`) on the rows they both answered.

        cmp = llmledger.compare("ledger.duckdb", "reviews", ["sentiment_haiku", "sentiment_local"])
        cmp                      # in a notebook: agreement matrix, cost against agreement
        cmp.agreement            # step_a, step_b, field, both_done, agree, share
        cmp.per_step             # per step: model, rows, done, cost, tokens and latency per answered row
        cmp.differences          # the rows where some pair differs: inputs and every step's answer
        cmp.flag("sentiment_local", reason="disagrees with haiku")   # then apply_llm(..., redo="flagged")

    Answers agree when equal once case, surrounding spaces and trailing punctuation are set aside; structured
    answers are compared field by field (the fields all the steps' schemas share). `where=` narrows the rows (SQL
    over the fact table). Reads only.
    """
    if not isinstance(table, str) or not table:
        raise InvalidInputError(f"table must be a table name, got {table!r}")
    if (
        isinstance(steps, str)
        or not isinstance(steps, list | tuple)
        or len(steps) < 2
        or not all(isinstance(s, str) and s for s in steps)
    ):
        raise InvalidInputError(
            f"steps must be a list of two or more step names, e.g. ['sentiment_a', 'sentiment_b'], got {steps!r}"
        )
    if len(set(steps)) != len(steps):
        raise InvalidInputError(f"steps names a step twice: {list(steps)}")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise InvalidInputError(f"where must be a SQL predicate string such as \"label = 'spam'\", got {where!r}")
    data = open_existing(store).compare(table, list(steps), where)
    return Comparison(store, table, data)


class Comparison:
    """What `compare` returns: frames to query, a text summary (`str`), a notebook view, and `flag`."""

    def __init__(self, store: str | Path, table: str, data: ComparisonData) -> None:
        self.store, self.table = store, table
        self.steps, self.fields = data.steps, data.fields
        self.agreement: pl.DataFrame = data.agreement
        self.per_step: pl.DataFrame = data.per_step
        self.differences: pl.DataFrame = data.differences
        self.differ: str = data.differ  # SQL over the fact table: the rows in `differences`
        self._differ_by_step = data.differ_by_step

    def matrix(self) -> pl.DataFrame:
        """Step × step: the share of their common DONE rows on which they agree (every field, averaged)."""
        mean = self.agreement.group_by("step_a", "step_b").agg(pl.col("share").mean())
        both = pl.concat([mean, mean.select(step_a="step_b", step_b="step_a", share="share")])
        rows = []
        for a in self.steps:
            found = {r["step_b"]: r["share"] for r in both.filter(pl.col("step_a") == a).iter_rows(named=True)}
            answered = bool(self.per_step.filter(pl.col("step") == a)["done"].sum())
            rows.append({"step": a, **{b: (1.0 if answered else None) if a == b else found.get(b) for b in self.steps}})
        return pl.DataFrame(rows, schema={"step": pl.String, **dict.fromkeys(self.steps, pl.Float64)})

    def agreement_with_others(self) -> dict[str, float | None]:
        """Per step: its mean agreement with every other step."""
        out: dict[str, float | None] = {}
        for row in self.matrix().iter_rows(named=True):
            shares = [row[b] for b in self.steps if b != row["step"] and row[b] is not None]
            out[row["step"]] = sum(shares) / len(shares) if shares else None
        return out

    def accuracy(self, *, target: float | None = None, confidence: float = 0.95) -> Accuracy:
        """Each compared step's accuracy on the rows a person reviewed (`llmledger.accuracy`), beside its cost per
        row, and with `target` the cheapest step whose interval reaches it."""
        return accuracy(
            self.store, self.table, self.steps[0], against=self.steps[1:], target=target, confidence=confidence
        )

    def flag(self, step: str, *, reason: str, by: str | None = None) -> int:
        """Flag `step`'s answers on the rows where it differs from another compared step (then `apply_llm(...,
        redo="flagged")`). The rows are found again now, so after a redo only what still differs is flagged; as
        `llmledger.flag` does, rows showing the same answer to the same request are flagged with them."""
        if step not in self.steps:
            raise InvalidInputError(f"step {step!r} is not one of the compared steps {self.steps}")
        return flag(self.store, self.table, step, where=self._differ_by_step[step], reason=reason, by=by)

    def __str__(self) -> str:
        lines = [f"{self.table}: {', '.join(self.steps)} compared on {', '.join(self.fields)}"]
        for row in self.agreement.iter_rows(named=True):
            field = "" if self.fields == ["answer"] else f" [{row['field']}]"
            said = (
                "no rows answered by both yet"
                if not row["both_done"]
                else f"{row['share']:.1%} agree ({row['agree']:,} of {row['both_done']:,})"
            )
            lines.append(f"  {row['step_a']} ~ {row['step_b']}{field}: {said}")
        for row in self.per_step.iter_rows(named=True):
            cost = "cost unknown" if row["cost_usd_per_row"] is None else f"{usd(row['cost_usd_per_row'])}/row"
            tokens, latency = row["output_tokens_per_row"], row["latency_ms_per_row"]
            lines.append(
                f"  {row['step']} ({row['model'] or 'no answers'}): {row['done']:,} DONE, {cost}"
                + ("" if tokens is None else f", {tokens:.0f} output tokens/row")
                + ("" if latency is None else f", {latency:,.0f} ms/answer")
            )
        lines.append(f"  {self.differences.height:,} rows differ (.differences; .flag(step, reason=...) to redo)")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        matrix = self.matrix()
        head = "".join(f"<th>{esc(s)}</th>" for s in self.steps)
        body = ""
        for row in matrix.iter_rows(named=True):
            cells = ""
            for b in self.steps:
                share = row[b]
                shade = "#eee" if share is None else f"hsl({120 * share:.0f}, 60%, 85%)"
                text = "n/a" if share is None else f"{share:.0%}"
                cells += f'<td style="background:{shade};text-align:center">{text}</td>'
            body += f"<tr><th>{esc(row['step'])}</th>{cells}</tr>"
        return (
            f'<div class="llmledger-compare"><b>{esc(self.table)}</b>: agreement on {esc(", ".join(self.fields))}'
            f"<table><tr><th></th>{head}</tr>{body}</table>{self._chart()}"
            f"<div>{self.differences.height:,} rows differ (<code>.differences</code>; "
            "<code>.flag(step, reason=...)</code> to redo them)</div>"
            f"{self._reviewed_html()}</div>"
        )

    def _reviewed_html(self) -> str:
        """Next to the agreement matrix, how often each step is right where a person judged, if anyone has."""
        judged = self.accuracy()
        if not int(judged.table["reviewed"].sum()):
            return ""
        return judged._repr_html_()

    def _chart(self) -> str:
        """Cost per row (x) against agreement with the other steps (y): the cheapest step that agrees enough."""
        agree = self.agreement_with_others()
        points = [
            (str(r["step"]), float(r["cost_usd_per_row"]), float(share))
            for r in self.per_step.iter_rows(named=True)
            if r["cost_usd_per_row"] is not None and (share := agree.get(r["step"])) is not None
        ]
        if not points:
            return "<div>cost against agreement: no step has a known cost (llmledger.set_price names one)</div>"
        return chart_svg(points, x_title="cost per row", y_title="agreement with the other steps")
