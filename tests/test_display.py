"""What a run draws: the live view that becomes its summary, errors by kind, the text bar (the browser test
measures the same views in JupyterLab)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import llmledger
from llmledger import Simulator
from llmledger._draw import FAILURE_COLOUR, Timeline, bar_text, parts
from llmledger._ledger.states import Outcome
from llmledger._report import RunReport, run_html
from llmledger._view.live import Bar, Dashboard

from .conftest import frame

SEGMENT = re.compile(r"data-status='(\w+)' data-count='(\d+)'[^>]*flex:([\d.]+) ")


def _report() -> RunReport:
    report = RunReport(
        table="reviews",
        step="sentiment",
        rows=100,
        selected=40,
        done=25,
        failed=2,
        needs_review=1,
        calls=20,
        reused=5,
        retries=3,
        input_tokens=1234,
        output_tokens=56,
        cost_usd=0.0123,
        done_before=50,
        stale=4,
        waiting=3,
        max_cost_usd=0.05,
    )
    report.outcome = Outcome.RUNNING
    report.in_flight = 6
    report.note_error("529 OverloadedError (overloaded_error): Overloaded <b>", example_key="id=7", retried=True)
    return report


def segments(html: str) -> dict[str, tuple[int, float]]:
    return {name: (int(n), float(flex)) for name, n, flex in SEGMENT.findall(html)}


def test_the_live_view_draws_the_frame_as_a_bar_and_turns_into_the_summary() -> None:
    report = _report()
    dashboard = Dashboard(report)
    dashboard.start()
    live = run_html(report, timeline=dashboard.timeline, live=True)
    bar = segments(live)
    # 50 DONE before + 25 now; 4 stale; 6 in flight; 2 FAILED; 1 NEEDS_REVIEW; 3 waiting; the rest not started
    assert {k: n for k, (n, _) in bar.items()} == {
        "DONE": 75,
        "stale": 4,
        "RUNNING": 6,
        "FAILED": 2,
        "NEEDS_REVIEW": 1,
        "waiting": 3,
        "NOT_STARTED": 9,
    }
    assert all(flex == pytest.approx(n) for n, flex in bar.values()), "widths are shares of the frame's 100 rows"
    assert "data-status='FAILED' data-count='2' title='FAILED: 2 rows (2.0%)" in live
    assert f"background:{FAILURE_COLOUR}" in live.split("data-status='FAILED'")[1].split(">")[0]
    assert "data-field='ETA'" in live and "data-field='estimated total'" in live and "data-field='budget'" in live
    assert "1 retries: 529 OverloadedError (overloaded_error)" in live and "&lt;b&gt;" in live, "escaped"

    dashboard.note("waiting for ledger.duckdb")
    report.outcome = Outcome.COMPLETED
    report.seconds = 12.0
    dashboard.close(report)
    final = dashboard.widget.value
    assert "llmledger-summary" in final and "llmledger-status" not in final, "the same widget is now the summary"
    assert "data-field='outcome'" in final and ">completed<" in final
    assert "waiting for ledger.duckdb" not in final and "data-field='ETA'" not in final
    assert "data-field='calls paid'>20<" in final


def test_errors_are_grouped_by_kind_with_a_row_example(client: Any, sim: Simulator, tmp_path: Any) -> None:
    sim.configure(poison="number 3", fail_next=[429, 429, 529])
    llmledger.apply_llm(
        frame(12),
        "summary",
        prompt="Summarize: {text}",
        client=client,
        store=tmp_path / "l.duckdb",
        progress=False,
        max_attempts=1,
        retry=llmledger.RetryPolicy(base_delay=0.01),
    )
    report = llmledger.last_report()
    assert report is not None
    lines = {(e.kind, e.retried): e for e in report.error_lines()}
    failed = lines[("400 BadRequestError (invalid_request_error)", False)]
    assert failed.count == 1 and failed.example_key == "id=3" and "poison" in failed.detail
    retried = {kind.split()[0]: e.count for (kind, again), e in lines.items() if again}  # by status: the SDK's
    assert retried == {"429": 2, "529": 1}  # class for a 529 differs between versions
    assert report.rate_limited == 2
    html = report._repr_html_()
    assert "1 rows: 400 BadRequestError (invalid_request_error)" in html and "<code>id=3</code>" in html
    assert segments(html)["NEEDS_REVIEW"][0] == 1, "a row out of attempts shows in the bar"


def test_the_text_bar_gives_every_status_with_rows_a_character() -> None:
    bar = parts({"DONE": 1_000_000, "FAILED": 1, "NOT_STARTED": 500_000})
    plain = bar_text(bar, 30)
    assert len(plain) == 30 and plain.count("x") == 1 and plain.count("#") == 19 and plain.count(".") == 10
    coloured = bar_text(bar, 30, colour=True)
    assert "\x1b[31m█\x1b[0m" in coloured, "the failure in red"


def test_the_sparkline_series_is_rows_per_second() -> None:
    timeline = Timeline(window=60, points=30)
    for second in range(121):  # 10 rows/s; 1 retry every 10 s
        timeline.sample(second * 10, second // 10, now=float(second))
    rates, retries, seconds = timeline.series()
    assert seconds == 60 and len(rates) == 30, "the last 60 s (not the current, partial second), 2 s a point"
    assert rates == [10.0] * 30 and sum(retries) == 6


def test_the_text_bar_counts_rows(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report()
    bar = Bar(report)
    bar.start()
    for _ in range(3):
        bar.update(report, 1)
    bar.close(report)
    assert "reviews.sentiment" in capsys.readouterr().err


def test_the_bar_draws_each_row_of_the_frame_once_in_real_runs(client: Any, sim: Simulator, tmp_path: Any) -> None:
    store = tmp_path / "l.duckdb"

    def drawn(**options: Any) -> dict[str, int]:
        llmledger.apply_llm(
            frame(12), options.pop("step", "summary"), client=client, store=store, table="m", progress=False, **options
        )
        report = llmledger.last_report()
        assert report is not None
        bar = {seg.name: n for seg, n in report.bar() if n}
        assert sum(bar.values()) == report.rows == 12
        return bar

    assert drawn(prompt="Summarize: {text}", where="id < 8") == {"DONE": 8, "NOT_STARTED": 4}
    assert drawn(prompt="Sum up: {text}", where="id < 8") == {"stale": 8, "NOT_STARTED": 4}, "left alone"
    assert drawn(prompt="Sum up: {text}", redo=True) == {"DONE": 12}, "the stale rows redone, each drawn once"
    sim.configure(batch_delay=3600)
    assert drawn(step="title", prompt="Title: {text}", mode="batch", wait=False) == {"SUBMITTED": 12}
    report = llmledger.last_report()
    assert report is not None and report.sent == 12 and "data-field='sent'>12 of 12<" in report._repr_html_()
    llmledger.reset(store, "m", "summary", where="id < 3")
    llmledger.resume(store, "m", "summary", client=client, progress=False)
    resumed = llmledger.last_report()
    assert resumed is not None and {seg.name: n for seg, n in resumed.bar() if n} == {"DONE": 3}
