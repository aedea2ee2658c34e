"""The chart `compare` and `accuracy` draw: every text inside the figure, point names clear of each other and of
the axes' text (a trial found names on top of each other and of the axis title, the right-most one cut off)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from llmledger._view.chart import CHART_H, CHART_W, _overlaps, _text_box, chart_svg

from . import UNIT

TEXT = re.compile(r'<text class="llmledger-chart-(\w+)" x="([\d.-]+)" y="([\d.-]+)" [^>]*text-anchor="(\w+)">([^<]*)<')
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=14)
share = st.floats(0.5, 1.0)
cost = st.just(0.0) | st.floats(1e-6, 5.0)  # dollars per row (or per 1,000 rows): a millionth of a cent and up


def boxes(svg: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    return [(kind, _text_box(float(x), float(y), label, anchor)) for kind, x, y, anchor, label in TEXT.findall(svg)]


@UNIT
@given(
    points=st.lists(st.tuples(names, cost, share), min_size=1, max_size=3, unique_by=lambda p: p[0]),
    spread=st.floats(0.0, 0.1),
    target=st.none() | st.floats(0.5, 0.99),
)
def test_every_text_is_inside_and_names_clear_of_each_other(points, spread: float, target: float | None) -> None:
    intervals = {name: (max(0.0, s - spread), min(1.0, s + spread)) for name, _, s in points}
    svg = chart_svg(points, x_title="cost per 1,000 rows", y_title="right", intervals=intervals, target=target)
    drawn = boxes(svg)
    assert len(drawn) == 6 + 2 + len(points) + (target is not None), "ticks, titles, a name per point, the target"
    for _, box in drawn:
        assert box[0] >= 0 and box[1] >= 0 and box[2] <= CHART_W and box[3] <= CHART_H, (box, svg)
    named = [box for kind, box in drawn if kind == "point"]
    apart = len({(round(c, 2), round(s, 2)) for _, c, s in points}) == len(points)  # two points in one place
    if apart and len(points) <= 2:
        for i, a in enumerate(named):
            assert not any(_overlaps(a, b) for b in named[i + 1 :]), svg


def test_the_y_axis_starts_near_the_points_when_they_all_sit_high() -> None:
    svg = chart_svg([("a", 0.02, 0.94), ("b", 0.61, 0.97)], x_title="x", y_title="y",
                    intervals={"a": (0.90, 0.97), "b": (0.94, 0.99)}, target=0.9)  # fmt: skip
    ticks = [label for kind, _, _, _, label in TEXT.findall(svg) if kind == "tick" and label.endswith("%")]
    assert ticks == ["80%", "90%", "100%"]
    assert "target 90%" in svg and svg.count("llmledger-chart-interval") == 2


def test_the_interval_named_in_the_title_is_the_one_drawn() -> None:
    """Found in an attack: confidence=0.999 was titled "100% interval"."""
    import polars as pl

    from llmledger._view.accuracy import Accuracy

    table = pl.DataFrame({"step": ["a"], "reviewed": [50], "right": [45], "accuracy": [0.9], "low": [0.79],
                          "high": [0.96], "usd_per_1000_rows": [0.02], "meets_target": [False]})  # fmt: skip
    assert "99.9% interval" in Accuracy("t", ["a"], table, None, None, None, 0.999).chart()
    assert "95% interval" in Accuracy("t", ["a"], table, None, None, None, 0.95).chart()
