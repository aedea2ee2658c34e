"""`llmledger demo`: the whole story on the bundled reviews, in under a minute, with or without an API key."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anthropic
import polars as pl

from llmledger._draw import rows as n_rows
from llmledger._exec.client import is_simulator_url
from llmledger._ledger.query import sql
from llmledger._report import RunReport
from llmledger._run.api import apply_llm
from llmledger._run.run import last_report
from llmledger.errors import InvalidInputError
from llmledger.simulator import Simulator

PROMPT = "Classify the sentiment of this product review as positive, negative or neutral. Review: {text}"
SYSTEM = "Answer with one word: positive, negative or neutral."
BROKEN = " <corrupted upload>"  # the simulator answers 400 to prompts containing this


def reviews_path() -> Path:
    for candidate in (
        Path(__file__).parent / "_data" / "reviews.csv",
        Path(__file__).resolve().parents[2] / "data" / "reviews.csv",
    ):
        if candidate.exists():
            return candidate
    raise FileNotFoundError("reviews.csv not found; run `python data/make_reviews.py` in the repository")


def _simulator_in_environment() -> str | None:
    """ANTHROPIC_BASE_URL when it is a simulator's (`llmledger simulator` prints the line that sets it, with a
    key): the demo then answers from it, nothing paid, and must not say that the real API costs money."""
    url = os.environ.get("ANTHROPIC_BASE_URL") or ""
    return url if is_simulator_url(url) else None


@contextlib.contextmanager
def _client() -> Iterator[tuple[anthropic.AsyncAnthropic | None, Simulator | None]]:
    url = _simulator_in_environment()
    if url is not None:
        print(f"ANTHROPIC_BASE_URL is llmledger's simulator at {url}: answers are simulated; no cost.")
        yield None, None
        return
    if os.environ.get("ANTHROPIC_API_KEY"):
        print("ANTHROPIC_API_KEY is set: using the real Anthropic API (this costs money).")
        yield None, None
        return
    with Simulator(latency=0.02, poison=BROKEN) as sim:
        print(
            f"ANTHROPIC_API_KEY is not set: using llmledger's offline simulator at {sim.base_url}.\n"
            "Answers are simulated (a small word list decides the sentiment); no network, no cost."
        )
        yield anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="simulator"), sim


def _show(title: str, frame: pl.DataFrame | None) -> None:
    print(f"\n{title}")
    with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, fmt_str_lengths=60):
        print(frame)


def run_demo(*, store: str | None = None, rows: int | None = None) -> None:
    reviews = pl.read_csv(reviews_path())
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= reviews.height):
        # checked before anything starts: `--rows 5000` ran the 3,000 there are without a word
        raise InvalidInputError(
            f"--rows {rows!r}: the bundled reviews have {reviews.height:,} rows; pass 1 to {reviews.height:,}"
        )
    with _client() as (client, sim):
        offline = sim is not None or _simulator_in_environment() is not None
        rows = rows or (reviews.height if offline else 20)
        folder = Path(tempfile.mkdtemp(prefix="llmledger-demo-")) if store is None else None
        path = Path(store) if store else folder / "ledger.duckdb"  # type: ignore[operator]
        df = reviews.head(rows)
        # Three reviews carry text the (simulated) API rejects, so the first run shows failed rows.
        broken_ids = df["review_id"].head(3).to_list() if sim else []
        df = df.with_columns(
            pl.when(pl.col("review_id").is_in(broken_ids))
            .then(pl.col("text") + BROKEN)
            .otherwise(pl.col("text"))
            .alias("text")
        )
        print(f"\nStore: {path}  (table 'reviews', step 'sentiment', {df.height:,} rows)")

        def run(frame: pl.DataFrame, label: str) -> pl.DataFrame:
            print(f"\n== {label}")
            out = apply_llm(
                frame,
                "sentiment",
                prompt=PROMPT,
                system=SYSTEM,
                key="review_id",
                store=path,
                table="reviews",
                max_tokens=5,
                client=client,
                concurrency=16,
            )
            report = last_report()
            if isinstance(report, RunReport):
                print(
                    f"-> this run paid {report.calls:,} calls; {n_rows(report.reused)} reused the answer to an "
                    "identical request"
                )
            return out

        fresh = not path.exists()
        run(
            df,
            "First run: every row is new"
            if fresh
            else "First run on a store that already holds this step: only rows not DONE are sent",
        )
        run(df, "Second run, same cell: every row the first run finished is DONE, so it pays nothing for them")

        _show(
            "Progress by SQL: SELECT sentiment_status, count(*) FROM reviews GROUP BY ALL",
            sql(path, "SELECT sentiment_status, count(*) AS n FROM reviews GROUP BY ALL ORDER BY n DESC"),
        )
        _show(
            "Failed rows: SELECT review_id, sentiment_attempts, sentiment_error FROM reviews "
            "WHERE sentiment_status = 'FAILED'",
            sql(
                path,
                "SELECT review_id, sentiment_attempts, sentiment_error FROM reviews "
                "WHERE sentiment_status = 'FAILED' ORDER BY review_id",
            ),
        )

        if broken_ids:
            fixed = df.with_columns(pl.col("text").str.replace_all(BROKEN, "", literal=True))
            run(
                fixed,
                f"Third run: the {len(broken_ids)} broken reviews are cleaned"
                + ("; only they are sent" if fresh else ""),
            )

        _show(
            "Answers and cost by SQL",
            sql(
                path,
                "SELECT sentiment, count(*) AS n, sum(sentiment_input_tokens) AS tokens_in, "
                "sum(sentiment_output_tokens) AS tokens_out, round(sum(sentiment_cost_usd), 4) AS usd "
                "FROM reviews GROUP BY ALL ORDER BY n DESC",
            ),
        )
        if sim:
            paid = sim.paid_prompts()
            twice = sum(1 for n in paid.values() if n > 1)
            print(
                f"\nThe simulator answered {sum(paid.values()):,} paid calls for {df.height:,} rows in this demo "
                f"({len(paid):,} distinct prompts): "
                + ("SOME PROMPTS WERE PAID TWICE." if twice else "nothing was paid twice.")
            )
        print(f"\nTry: llmledger status {path}")
