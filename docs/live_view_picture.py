"""Draw `docs/pages/images/live-view.png`: the live view of a real (simulated) run, as a notebook shows it
as it ends, rendered by Chromium. `python docs/live_view_picture.py` redraws it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import polars as pl

import llmledger
from llmledger._draw import Timeline
from llmledger._report import run_html

OUT = Path(__file__).parent / "pages" / "images" / "live-view.png"


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, llmledger.simulate(latency=0.01, error_rate=0.02, poison="@@"):
        texts = [
            f"review {i}: " + ("@@ broken" if i % 97 == 0 else "fine product, would buy again") for i in range(600)
        ]
        df = pl.DataFrame({"id": range(600), "text": texts})
        with contextlib.suppress(llmledger.LedgerError):
            llmledger.apply_llm(
                df,
                "sentiment",
                prompt="Sentiment of: {text}",
                store=Path(tmp) / "l.duckdb",
                max_tokens=5,
                progress=False,
                max_attempts=1,
            )
        report = llmledger.last_report()
    assert report is not None
    report.outcome = llmledger.Outcome.RUNNING  # drawn as it looked while it ran
    timeline = Timeline()
    for i in range(40):
        timeline.sample(15 * i * i // 40, i // 10, now=float(i))
    html = run_html(report, timeline=timeline, live=True)
    page_html = f"<html><body style='font-family: sans-serif; width: 1100px; padding: 8px'>{html}</body></html>"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium",
            headless=True,
            args=["--no-sandbox", "--disable-gpu"],
        )
        page = browser.new_page(viewport={"width": 1140, "height": 600}, device_scale_factor=1)
        page.set_content(page_html)
        page.locator(".llmledger-status").screenshot(path=str(OUT))
        browser.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
