"""A run's report drawn as one HTML panel (`run_html`): its step's rows as a bar, its pace, cost and errors; live
while it runs, or as the summary when it ends.

Its own module because it is presentation only: it reads a run's tally (`tally.RunTally`, which every `RunReport`
is) and draws with `_draw`'s pieces, and the numbers it draws are `tally.py`'s.
"""

from __future__ import annotations

from llmledger._draw import (
    FAILURE_COLOUR,
    SEGMENTS,
    Timeline,
    badge,
    bar_html,
    errors_html,
    esc,
    figures_html,
    legend_html,
    panel_html,
    sparkline_svg,
    usd,
)
from llmledger._report.tally import RunTally


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes < 60 else f"{minutes // 60}h {minutes % 60:02d}m"


OUTCOME_COLOURS = {
    "preparing": "#757575",
    "running": SEGMENTS["RUNNING"].colour,
    "completed": SEGMENTS["DONE"].colour,
    "interrupted": "#757575",
    "cancelled": "#757575",
    "budget": SEGMENTS["NEEDS_REVIEW"].colour,
}


def run_html(
    report: RunTally, *, timeline: Timeline | None = None, notes: list[str] | None = None, live: bool = False
) -> str:
    """One run at a glance: its step's rows as a bar, its pace, cost and errors; live, or as the summary."""
    r = report
    outcome = str(r.outcome)
    head = (
        f"<b>llmledger · {esc(r.table)}.{esc(r.step)}</b>"
        + badge(outcome, OUTCOME_COLOURS.get(outcome, FAILURE_COLOUR), field="outcome")
        + (badge(r.mode, "#607d8b") if r.mode in ("batch", "flex") else "")
        + (badge("simulated answers", "#6d4c41", field="simulated") if r.simulated else "")
    )
    figures = [("sent", f"{r.sent:,} of {r.selected:,}")]
    if live:
        figures += [
            ("rows/s", f"{r.rate:,.1f}"),
            ("ETA", "—" if r.eta is None else _duration(r.eta)),
            ("elapsed", _duration(r.elapsed)),
        ]
        if r.in_batches or r.batch_pending:
            figures.append(("in batches", f"{max(r.in_batches, r.batch_pending):,}"))
    else:
        figures.append(("time", _duration(r.seconds)))
    figures += [("calls paid", f"{r.calls:,}"), ("reused", f"{r.reused:,}")]
    if r.retries:
        figures.append(("retries", f"{r.retries:,}" + (f" ({r.rate_limited:,} × 429)" if r.rate_limited else "")))
    cached = f" (cache: {r.cache_read_tokens:,} read)" if r.cache_read_tokens else ""
    figures.append(("tokens in / out", f"{r.input_tokens:,} / {r.output_tokens:,}{cached}"))
    figures.append(("cost", usd(r.cost_usd, "unknown (no known price or usage)")))
    if r.max_cost_usd is not None:
        spent = r.spent_before_usd + (r.cost_usd or 0.0)
        figures.append(
            (
                "budget",
                usd(r.max_cost_usd)
                + (
                    f" ({spent / r.max_cost_usd:.0%} used"
                    + (", with earlier runs of the step" if r.spent_before_usd else "")
                    + ")"
                    if r.max_cost_usd
                    else ""
                ),
            )
        )
    projected = r.projected_usd
    if live and projected is not None:
        figures.append(("estimated total", usd(projected)))
    if live and r.binding_limit:
        figures.append(("rate limit", r.binding_limit))
    avoided = r.avoided_usd
    if not live and avoided:
        figures.append(("avoided", f"{usd(avoided)} ({r.avoided_reasons()})"))
    bar = r.bar()
    body = bar_html(bar) + legend_html(bar) + figures_html(figures)
    if timeline is not None:
        rates, retries, seconds = timeline.series()
        body += f"<div>{sparkline_svg(rates, retries, seconds=seconds)}</div>"
    body += "".join(f"<div style='color:#757575'>{esc(n)}</div>" for n in notes or [])
    if r.message and not live:
        body += f"<div style='color:{FAILURE_COLOUR}'>{esc(r.message)}</div>"
    body += errors_html(r.error_lines())
    if not live:
        body += "".join(
            f"<div class='llmledger-hint' style='color:#555'>{esc(h)}</div>" for h in r.hints() if h != r.message
        )
    return panel_html("llmledger-status" if live else "llmledger-summary", head, body)
