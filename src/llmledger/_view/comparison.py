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
        """Cost per row (x) against agreement with the other steps (y): the cheapest step that agrees enough.

        Axes with ticks; each point's name placed beside it where it overlaps no other text and stays inside the
        figure (a trial found names on top of each other and of the axis title, the right-most one cut off)."""
        agree = self.agreement_with_others()
        points = [
            (str(r["step"]), float(r["cost_usd_per_row"]), float(share))
            for r in self.per_step.iter_rows(named=True)
            if r["cost_usd_per_row"] is not None and (share := agree.get(r["step"])) is not None
        ]
        if not points:
            return "<div>cost against agreement: no step has a known cost (llmledger.set_price names one)</div>"
        return chart_svg(points)


CHART_W, CHART_H = 440, 250
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 24, 44  # room for the y ticks, the right-most name, the y title, the x ticks
FONT = 11


def _text_box(x: float, y: float, text: str, anchor: str = "start") -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a text drawn at (x, y) (its baseline), at about 0.62 em per character."""
    width = len(text) * FONT * 0.62
    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
    return left, y - FONT, left + width, y + 3


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def chart_svg(points: list[tuple[str, float, float]]) -> str:
    """The cost-against-agreement chart of `points` (name, cost per row, share agreeing) as SVG."""
    top = max(cost for _, cost, _ in points) or 1.0
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM

    def at(cost: float, share: float) -> tuple[float, float]:
        return LEFT + plot_w * cost / top, TOP + plot_h * (1 - share)

    parts, taken = [], []

    def text(x: float, y: float, label: str, anchor: str = "start", kind: str = "tick") -> None:
        taken.append(_text_box(x, y, label, anchor))
        parts.append(
            f'<text class="llmledger-chart-{kind}" x="{x:.1f}" y="{y:.1f}" font-size="{FONT}" '
            f'text-anchor="{anchor}">{esc(label)}</text>'
        )

    base, left_x = TOP + plot_h, LEFT
    parts.append(f'<line x1="{left_x}" y1="{base}" x2="{LEFT + plot_w}" y2="{base}" stroke="#999"/>')
    parts.append(f'<line x1="{left_x}" y1="{TOP}" x2="{left_x}" y2="{base}" stroke="#999"/>')
    for share in (0.0, 0.5, 1.0):
        _, y = at(0, share)
        parts.append(f'<line x1="{left_x - 4}" y1="{y:.1f}" x2="{left_x}" y2="{y:.1f}" stroke="#999"/>')
        text(left_x - 6, y + 4, f"{share:.0%}", "end")
    for fraction in (0.0, 0.5, 1.0):
        x, _ = at(top * fraction, 0)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#999"/>')
        text(x, base + 16, usd(top * fraction), "end" if fraction == 1.0 else "middle" if fraction else "start")
    text(LEFT + plot_w / 2, CHART_H - 6, "cost per row", "middle", "title")
    text(4, TOP - 10, "agreement with the other steps", "start", "title")
    for name, cost, share in sorted(points, key=lambda p: (p[1], -p[2])):
        x, y = at(cost, share)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#4a7"><title>{esc(name)}</title></circle>')
        taken.append((x - 4, y - 4, x + 4, y + 4))
        spots = [(x + 7, y - 5, "start"), (x + 7, y + 13, "start"), (x - 7, y - 5, "end"), (x - 7, y + 13, "end")]
        spots += [(x, y - 9 - 13 * k, "middle") for k in range(4)] + [(x, y + 19 + 13 * k, "middle") for k in range(4)]
        inside = [s for s in spots if _inside(_text_box(*s[:2], name, s[2]))]
        free = [s for s in inside if not any(_overlaps(_text_box(*s[:2], name, s[2]), box) for box in taken)]
        lx, ly, anchor = (free or inside or spots)[0]
        text(lx, ly, name, anchor, "point")
    return (
        f'<svg class="llmledger-chart" width="{CHART_W}" height="{CHART_H}" viewBox="0 0 {CHART_W} {CHART_H}" '
        f'role="img">{"".join(parts)}</svg>'
    )


def _inside(box: tuple[float, float, float, float]) -> bool:
    return box[0] >= 0 and box[1] >= 0 and box[2] <= CHART_W and box[3] <= CHART_H
