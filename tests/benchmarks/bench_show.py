"""What looking costs. Run: python tests/benchmarks/bench_show.py [--rows N]

(h) `llmledger.show` on a DuckDB ledger of N rows (default 5,000,000) with three steps, each mostly DONE,
    1 % FAILED with three kinds of error, some rows RUNNING under two claims: seconds to read the whole
    overview (counts, cost, claims, errors by kind, batches), against `llmledger.progress` (the counts alone)
    on the same store; both the median of three reads. Target: show within 3x of progress.
(i) a run's live view: milliseconds to draw it (bar, figures, sparkline, errors), which happens four times a
    second while a run goes. Target: under 5 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import llmledger  # noqa: E402
from llmledger import Simulator  # noqa: E402
from llmledger._draw import Timeline  # noqa: E402
from llmledger._ledger.states import Outcome  # noqa: E402
from llmledger._report import RunReport, run_html  # noqa: E402

STEPS = ("summary", "title", "lang")
KINDS = (
    "400 BadRequestError (invalid_request_error): prompt is too long",
    "refusal: the model declined to answer this prompt",
    "the answer does not match the output schema: 'company' is a required property",
)


def build(store: Path, rows: int) -> None:
    """A ledger of `rows` rows and three steps, its statuses set in SQL (no API calls needed)."""
    frame = pl.DataFrame({"id": pl.int_range(0, rows, eager=True)}).with_columns(
        pl.format("hello message number {}", "id").alias("text")
    )
    with Simulator() as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench")
        for step in STEPS:
            llmledger.apply_llm(
                frame,
                step,
                prompt=f"{step}: {{text}}",
                store=store,
                table="t",
                client=client,
                where="false",
                progress=False,
            )
    kinds = ", ".join("'" + k.replace("'", "''") + "'" for k in KINDS)
    for step in STEPS:
        llmledger.sql(
            store,
            f"""UPDATE t SET
            {step}_status = CASE WHEN id % 100 = 7 THEN 'FAILED' WHEN id < 200 THEN 'RUNNING'
                                 WHEN id % 10 = 3 THEN 'NOT_STARTED' ELSE 'DONE' END,
            {step}_error = CASE WHEN id % 100 = 7 THEN [{kinds}][id % 3 + 1] END,
            {step}_claimed_by = CASE WHEN id < 200 THEN 'host-' || (id % 2)::VARCHAR || '/42/run' END,
            {step}_running_started_at = CASE WHEN id < 200 THEN now()::TIMESTAMP END,
            {step}_cost_usd = CASE WHEN id % 10 NOT IN (3, 7) THEN 0.0001 END""",
            write=True,
        )


def _median(fn: object, times: int = 3) -> float:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def show_overhead(rows: int, folder: Path) -> dict[str, float]:
    """(h) seconds to read `show` and `progress` of a `rows`-row ledger, and their ratio."""
    store = folder / "show.duckdb"
    build(store, rows)
    view = llmledger.show(store)
    assert len(view.overview.steps) == len(STEPS) and all(len(s.errors) == 3 for s in view.overview.steps)
    progress_s = _median(lambda: llmledger.progress(store))
    show_s = _median(view.refresh)
    return {
        "rows": rows,
        "progress_s": progress_s,
        "show_s": show_s,
        "ratio": show_s / progress_s,
        "failed_per_step": view.overview.steps[0].counts["FAILED"],
    }


def live_view_ms() -> dict[str, float]:
    """(i) milliseconds to draw a run's live view with a full five-minute sparkline and errors of five kinds."""
    report = RunReport(
        table="t",
        step="summary",
        rows=25_000_000,
        selected=20_000_000,
        done=9_000_000,
        failed=12_000,
        calls=8_000_000,
        cost_usd=812.5,
        input_tokens=10**9,
        output_tokens=10**8,
        max_cost_usd=2000.0,
    )
    report.outcome = Outcome.RUNNING
    for i in range(50):
        report.note_error(f"{400 + i % 5} SomeError (kind_{i % 5}): message {i}", example_key=f"id={i}")
    timeline = Timeline()
    for second in range(600):
        timeline.sample(second * 40, second // 7, now=float(second))
    return {"live_view_ms": _median(lambda: run_html(report, timeline=timeline, live=True), 20) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps({**show_overhead(args.rows, Path(tmp)), **live_view_ms()}, indent=1))


if __name__ == "__main__":
    main()
