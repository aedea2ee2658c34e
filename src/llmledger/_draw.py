"""How llmledger draws rows: a stacked bar of rows by status, a sparkline of throughput and retries, and
errors grouped by kind; as HTML for notebooks and as text (coloured where the terminal can) for terminals.

Pure functions of numbers, no I/O. The live view of a run (`_view.live.Dashboard`), its summary
(`RunReport._repr_html_`) and the whole store (`llmledger.show`, `llmledger status`) all draw with them,
so a status has one colour and one name everywhere. HTML is inline-styled (a notebook's output keeps no
stylesheet) and every number a person reads carries a `data-field` or `data-status` attribute, which is
what the browser test measures.
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    name: str
    colour: str  # the bar's colour in HTML
    ansi: str  # SGR code of the text bar's colour
    char: str  # the text bar's character where there is no colour
    meaning: str

    @property
    def label(self) -> str:
        """The name shown in a legend: RUNNING rows are claimed, not all in flight (a run claims ahead)."""
        return "RUNNING (claimed)" if self.name == "RUNNING" else self.name


SEGMENTS = {
    s.name: s
    for s in (
        Segment("DONE", "#2e7d32", "32", "#", "answered"),
        Segment(
            "stale",
            "#9e9d24",
            "33",
            "~",
            "DONE, but the request or an upstream answer changed since; redo='stale' re-sends them",
        ),
        Segment("RUNNING", "#1e88e5", "34", ">", "claimed by a run: in flight, or queued to be sent by it"),
        Segment("SUBMITTED", "#7e57c2", "35", "b", "in Message Batches the API is processing"),
        Segment("FAILED", "#d32f2f", "31", "x", "failed; a rerun retries them"),
        Segment("NEEDS_REVIEW", "#ef6c00", "91", "!", "for a person to look at"),
        Segment("waiting", "#90a4ae", "36", ":", "wait for the steps their prompt reads"),
        Segment("NOT_STARTED", "#e0e0e0", "90", ".", "not sent yet"),
    )
}
FAILURE_COLOUR = SEGMENTS["FAILED"].colour

Parts = list[tuple[Segment, int]]


def parts(counts: dict[str, int]) -> Parts:
    """A step's rows as bar segments, from its counts (`progress()`'s row: every row counted once)."""
    return [(seg, max(0, int(counts.get(name) or 0))) for name, seg in SEGMENTS.items()]


# -- HTML ------------------------------------------------------------------------------------------------
def usd(value: float | None, unknown: str = "unknown") -> str:
    """Dollars as a person reads them: cents from $1 up, four decimals down to a cent, and below that two
    significant digits (a non-zero amount never reads $0.0000); `unknown` for None (a model with no known price,
    a server that sent no usage)."""
    if value is None or not math.isfinite(value):
        return unknown
    if value == 0:
        return "$0"
    sign, size = "-" if value < 0 else "", abs(value)
    if round(size, 4) >= 1:
        return f"{sign}${size:,.2f}"
    if round(size, 6) >= 0.01:
        return f"{sign}${size:.4f}"
    return f"{sign}${size:.{max(2, 1 - math.floor(math.log10(size)))}f}"


def rows(n: int, noun: str = "row") -> str:
    """`1 row`, `2,000 rows`: counts read as English in every summary and hint."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def bar_html(bar: Parts) -> str:
    """A stacked bar whose segments' widths are proportional to their rows; each says its count on hover."""
    total = sum(n for _, n in bar)
    cells = []
    for seg, n in bar:
        if n <= 0:
            continue
        share = n / total
        cells.append(
            f"<div class='llmledger-seg' data-status='{seg.name}' data-count='{n}' "
            f"title='{seg.name}: {n:,} rows ({share:.1%}), {esc(seg.meaning)}' "
            f"style='flex:{share * 100:.6f} 1 0px;min-width:2px;background:{seg.colour}'></div>"
        )
    return (
        f"<div class='llmledger-bar' data-total='{total}' style='display:flex;height:14px;width:100%;"
        f"background:#f3f3f3;border-radius:3px;overflow:hidden;margin:3px 0'>{''.join(cells)}</div>"
    )


def legend_html(bar: Parts) -> str:
    """The counts beside the bar, for the segments that have rows."""
    keys = [
        f"<span data-field='{seg.name}' style='margin-right:10px;white-space:nowrap'>"
        f"<span style='display:inline-block;width:9px;height:9px;background:{seg.colour};margin-right:3px'>"
        f"</span>{seg.label} {n:,}</span>"
        for seg, n in bar
        if n > 0
    ]
    return f"<div class='llmledger-legend' style='font-size:90%'>{''.join(keys) or 'no rows'}</div>"


def figures_html(figures: Iterable[tuple[str, str]]) -> str:
    """Labelled figures in one wrapping line: `rows/s 12.3 · ETA 40s · ...`. The line wraps between figures, and a
    long figure (what a run avoided, and why) wraps within itself, so nothing is cut off in a narrow cell."""
    cells = [
        f"<span style='display:inline-block;max-width:100%;margin-right:14px;vertical-align:top'>"
        f"<span style='color:#777;white-space:nowrap'>{esc(label)}</span> "
        f"<span data-field='{esc(label)}'>{esc(value)}</span></span>"  # wraps as the view does: anywhere
        for label, value in figures
    ]
    return f"<div class='llmledger-figures' style='margin:2px 0'>{''.join(cells)}</div>"


def sparkline_svg(
    rates: Sequence[float], retries: Sequence[int], *, seconds: float, width: int = 220, height: int = 30
) -> str:
    """Rows per second (a line) and retries (red ticks) over the last `seconds`, one point per bucket."""
    if len(rates) < 2:
        return ""
    peak, worst = max(rates) or 1.0, max(retries) or 1
    step = width / (len(rates) - 1)
    line = " ".join(f"{i * step:.1f},{height - 2 - r / peak * (height - 6):.1f}" for i, r in enumerate(rates))
    ticks = "".join(
        f"<rect x='{i * step - 1:.1f}' y='{height - n / worst * height * 0.5:.1f}' width='2' "
        f"height='{n / worst * height * 0.5:.1f}' fill='{FAILURE_COLOUR}'/>"
        for i, n in enumerate(retries)
        if n
    )
    what = (
        f"rows/s over the last {seconds:,.0f}s (peak {max(rates):,.1f}); {sum(retries):,} retries "
        "(429, 529, 5xx, timeouts) in red"
    )
    return (
        f"<svg class='llmledger-spark' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"style='vertical-align:middle;background:#fafafa'><title>{esc(what)}</title>{ticks}"
        f"<polyline points='{line}' fill='none' stroke='{SEGMENTS['RUNNING'].colour}' stroke-width='1.5'/></svg>"
        f"<span style='color:#777;font-size:85%;margin-left:6px'>{esc(what)}</span>"
    )


@dataclass(frozen=True)
class ErrorLine:
    """Rows (or retries) with one kind of error, and the last example of it."""

    kind: str
    count: int
    example_key: str
    example: str
    retried: bool = False  # the API's transient errors: retried, never counted against the row

    @property
    def detail(self) -> str:
        """The example's message without the kind it starts with."""
        head = self.kind + ":"
        return self.example[len(head) :].strip() if self.example.startswith(head) else self.example


def error_kind(message: str) -> str:
    """What groups errors: the text before the first colon ("429 RateLimitError (rate_limit_error)",
    "refusal"); the same rule `_ledger/overview.py` applies in SQL."""
    return message.split(":", 1)[0].strip() or "no error recorded"


def errors_html(errors: Sequence[ErrorLine]) -> str:
    if not errors:
        return ""
    lines = []
    for e in errors:
        colour = "#8d6e00" if e.retried else FAILURE_COLOUR
        what = "retries" if e.retried else "rows"
        lines.append(
            f"<div class='llmledger-error' data-kind='{esc(e.kind)}' style='color:{colour}'>"
            f"<b>{e.count:,} {what}: {esc(e.kind)}</b> <span style='color:#555'>e.g. "
            f"<code>{esc(e.example_key)}</code>: {esc(e.detail[:240])}</span></div>"
        )
    return f"<div class='llmledger-errors' style='margin-top:3px;font-size:90%'>{''.join(lines)}</div>"


def panel_html(kind: str, head: str, body: str) -> str:
    """The view's outer box. Its classes tell MathJax (JupyterLab, Notebook) to leave it alone: two `$` signs of
    costs in one line are otherwise typeset as inline math (`avoided 0.0003(reusedanswers0.0003)`)."""
    return (
        f"<div class='llmledger-view {kind} tex2jax_ignore mathjax_ignore' "
        "style='font-family:var(--jp-ui-font-family,sans-serif);"
        f"font-size:13px;line-height:1.45;padding:4px 0;max-width:min(1100px,100%);box-sizing:border-box;"
        "overflow-wrap:anywhere'>"
        f"<div>{head}</div>{body}</div>"
    )


def badge(text: str, colour: str, *, field: str = "") -> str:
    attr = f" data-field='{esc(field)}'" if field else ""
    return (
        f"<span{attr} style='background:{colour};color:white;border-radius:3px;padding:0 5px;"
        f"margin-left:6px;font-size:85%'>{esc(text)}</span>"
    )


# -- text ------------------------------------------------------------------------------------------------
def bar_text(bar: Parts, width: int = 40, *, colour: bool = False) -> str:
    """The bar in `width` characters (largest remainders; every segment with rows gets at least one)."""
    total = sum(n for _, n in bar)
    if not total:
        return " " * width
    shown = [(seg, n) for seg, n in bar if n > 0][:width]
    exact = [n / total * width for _, n in shown]
    chars = [max(1, math.floor(x)) for x in exact]
    while sum(chars) > width:
        chars[chars.index(max(chars))] -= 1
    for i in sorted(range(len(shown)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True):
        if sum(chars) >= width:
            break
        chars[i] += 1
    out = []
    for (seg, _), k in zip(shown, chars, strict=True):
        if colour:
            out.append(f"\x1b[{seg.ansi}m{('░' if seg.name == 'NOT_STARTED' else '█') * k}\x1b[0m")
        else:
            out.append(seg.char * k)
    return "".join(out)


def legend_text(bar: Parts, *, colour: bool = False) -> str:
    def name(seg: Segment) -> str:
        return f"\x1b[{seg.ansi}m{seg.label}\x1b[0m" if colour else seg.label

    return " · ".join(f"{name(seg)} {n:,}" for seg, n in bar if n > 0) or "no rows"


# -- time ------------------------------------------------------------------------------------------------
class Timeline:
    """Rows finished and retries per second, sampled by a live view, bucketed for its sparkline."""

    def __init__(self, window: float = 300.0, points: int = 60) -> None:
        self.window, self.points = window, points
        self._bins: deque[list[float]] = deque()  # [second, rows, retries]
        self._start: float | None = None
        self._last: tuple[int, int] | None = None

    def sample(self, finished: int, retries: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._start is None:
            self._start = now
        second = int(now - self._start)
        rows, tries = (finished - self._last[0], retries - self._last[1]) if self._last else (0, 0)
        self._last = (finished, retries)
        if self._bins and self._bins[-1][0] == second:
            self._bins[-1][1] += rows
            self._bins[-1][2] += tries
        else:
            self._bins.append([second, rows, tries])
        while self._bins and self._bins[0][0] < second - self.window:
            self._bins.popleft()

    def series(self) -> tuple[list[float], list[int], float]:
        """(rows/s per point, retries per point, seconds covered), over the last `window` seconds at most."""
        bins = list(self._bins)[:-1] if len(self._bins) > 2 else list(self._bins)  # the current second is partial
        if not bins:
            return [], [], 0.0
        first, last = bins[0][0], bins[-1][0]
        span = last - first + 1
        width = max(1, math.ceil(span / self.points))
        count = math.ceil(span / width)
        rows, tries = [0.0] * count, [0] * count
        for second, r, t in bins:
            i = int((second - first) // width)
            rows[i] += r
            tries[i] += int(t)
        seconds = [min(width, span - i * width) for i in range(count)]  # the last point may cover fewer
        return [r / s for r, s in zip(rows, seconds, strict=True)], tries, float(span)
