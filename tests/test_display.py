"""The dashboard widget and the text bar, outside a notebook front end (the browser test covers JupyterLab)."""

from __future__ import annotations

import pytest

from llmledger._display import Bar, Dashboard, render_html
from llmledger._ledger.states import Outcome
from llmledger._report import RunReport


def _report() -> RunReport:
    report = RunReport(table="reviews", step="sentiment", rows=100, selected=40, done=25, failed=2, needs_review=1,
                       calls=20, reused=5, retries=3, input_tokens=1234, output_tokens=56, cost_usd=0.0123)
    report.outcome = Outcome.RUNNING
    report.errors.append("529 OverloadedError (overloaded_error): Overloaded <b>")
    return report


def test_the_dashboard_widget_shows_the_run_in_numbers() -> None:
    report = _report()
    dashboard = Dashboard(report)
    dashboard.start()
    dashboard.note("waiting for ledger.duckdb")
    report.outcome = Outcome.COMPLETED
    dashboard.close(report)
    html = dashboard.widget.value
    assert "llmledger-status" in html and "reviews.sentiment" in html
    assert "data-field='DONE'>25<" in html and "data-field='to send'>12<" in html
    assert "completed" in html
    assert "&lt;b&gt;" in render_html(_report()), "errors are escaped, never rendered as HTML"


def test_the_text_bar_counts_rows(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report()
    bar = Bar(report)
    bar.start()
    for _ in range(3):
        bar.update(report, 1)
    bar.close(report)
    assert "reviews.sentiment" in capsys.readouterr().err
