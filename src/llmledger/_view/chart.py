"""A small SVG scatter chart: steps by cost per row (x) against a share (y), each point named.

Drawn by `compare` (agreement with the other steps) and by `accuracy` (share right on reviewed rows, each with its
interval and the target as a dashed line). Axes with ticks; each point's name is placed beside it where it overlaps
no other text and stays inside the figure (a trial found names on top of each other and of the axis title, the
right-most one cut off). The browser tests measure every text of every such chart for exactly that.
"""

from __future__ import annotations

import math

from llmledger._draw import esc, usd

CHART_W, CHART_H = 440, 250
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 24, 44  # room for the y ticks, the right-most name, the y title, the x ticks
FONT = 11

Box = tuple[float, float, float, float]


def _text_box(x: float, y: float, text: str, anchor: str = "start") -> Box:
    """(left, top, right, bottom) of a text drawn at (x, y) (its baseline), at about 0.62 em per character."""
    width = len(text) * FONT * 0.62
    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
    return left, y - FONT, left + width, y + 3


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(box: Box) -> bool:
    return box[0] >= 0 and box[1] >= 0 and box[2] <= CHART_W and box[3] <= CHART_H


def chart_svg(
    points: list[tuple[str, float, float]],
    *,
    x_title: str,
    y_title: str,
    intervals: dict[str, tuple[float, float]] | None = None,
    target: float | None = None,
) -> str:
    """The chart of `points` (name, cost, share) as SVG; `intervals` (name: low, high) draws each point's interval,
    `target` a dashed line at that share. The y axis starts at 0, or nearer the points when they all sit high (an
    accuracy chart of 90 % models is not a line along the top)."""
    intervals = intervals or {}
    top = max(cost for _, cost, _ in points) or 1.0
    lows = [intervals.get(name, (share, share))[0] for name, _, share in points] + ([target] if target else [])
    bottom = max(0.0, math.floor(min(lows) * 10) / 10 - 0.1) if intervals else 0.0
    plot_w, plot_h = CHART_W - LEFT - RIGHT, CHART_H - TOP - BOTTOM

    def at(cost: float, share: float) -> tuple[float, float]:
        return LEFT + plot_w * cost / top, TOP + plot_h * (1 - (share - bottom) / (1 - bottom))

    parts: list[str] = []
    taken: list[Box] = []

    def text(x: float, y: float, label: str, anchor: str = "start", kind: str = "tick") -> None:
        taken.append(_text_box(x, y, label, anchor))
        parts.append(
            f'<text class="llmledger-chart-{kind}" x="{x:.1f}" y="{y:.1f}" font-size="{FONT}" '
            f'text-anchor="{anchor}">{esc(label)}</text>'
        )

    base, left_x = TOP + plot_h, LEFT
    parts.append(f'<line x1="{left_x}" y1="{base}" x2="{LEFT + plot_w}" y2="{base}" stroke="#999"/>')
    parts.append(f'<line x1="{left_x}" y1="{TOP}" x2="{left_x}" y2="{base}" stroke="#999"/>')
    for share in (bottom, (bottom + 1) / 2, 1.0):
        _, y = at(0, share)
        parts.append(f'<line x1="{left_x - 4}" y1="{y:.1f}" x2="{left_x}" y2="{y:.1f}" stroke="#999"/>')
        text(left_x - 6, y + 4, f"{share:.0%}", "end")
    for fraction in (0.0, 0.5, 1.0):
        x, _ = at(top * fraction, bottom)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#999"/>')
        text(x, base + 16, usd(top * fraction), "end" if fraction == 1.0 else "middle" if fraction else "start")
    text(LEFT + plot_w / 2, CHART_H - 6, x_title, "middle", "title")
    text(4, TOP - 10, y_title, "start", "title")
    if target is not None:
        _, y = at(0, target)
        parts.append(
            f'<line class="llmledger-chart-target" x1="{left_x}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
            'stroke="#c62828" stroke-dasharray="4 3"/>'
        )
    for name, (low, high) in intervals.items():
        match = [(cost, share) for n, cost, share in points if n == name]
        if match:
            x, y_low = at(match[0][0], low)
            _, y_high = at(match[0][0], high)
            parts.append(
                f'<path class="llmledger-chart-interval" d="M{x - 3:.1f},{y_high:.1f}h6M{x:.1f},{y_high:.1f}'
                f'V{y_low:.1f}M{x - 3:.1f},{y_low:.1f}h6" stroke="#4a7" fill="none"/>'
            )
            taken.append((x - 3, y_high, x + 3, y_low))
    if target is not None:
        _, y = at(0, target)
        right = float(LEFT + plot_w)
        label = f"target {target:.0%}"
        beside = [(right, y - 4), (right, y + 13)]  # above the line, else below it
        clear = [(x_, y_) for x_, y_ in beside if not any(_overlaps(_text_box(x_, y_, label, "end"), b) for b in taken)]
        text(*(clear or beside)[0], label, "end", "title")
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
