"""The review view in JupyterLab (headless Chromium, as `test_browser.py`): it renders text, typed fields and an
image, and a person's keyboard session (typed into its command box, no mouse after the first click) reviews 30
rows in under a minute: accepts, a flag with a reason, a correction of a typed field, an undo, some of it typed
faster than the kernel answers; the ledger then holds exactly those verdicts."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger

from .test_browser import lab, notebook, run_all, shut_down_kernels

pytestmark = [pytest.mark.jupyter, pytest.mark.slow]
__all__ = ["lab"]  # the fixture, shared

SETUP = """
import polars as pl, llmledger
from llmledger.simulator.samples import png
llmledger.simulate(latency=0.0)
open({picture!r}, "wb").write(png(40, 30))
df = pl.DataFrame({{"id": list(range(30)), "text": [f"ACME report number {{i}}" for i in range(30)],
                    "picture": [{picture!r}] * 30}})
llmledger.apply_llm(df, "facts", prompt="Extract: {{text}}", output={{"company": str, "year": int | None}},
                    key="id", store={store!r}, table="t", progress=False)
view = llmledger.review({store!r}, "t", "facts", by="tester")
view
"""


TALLY = "document.querySelector('.llmledger-review [data-field=tally]')"
PROMPT = "document.querySelector('.llmledger-review .llmledger-prompt')"


def _notebook(path: Path, source: str) -> None:
    cell: dict[str, Any] = {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": source,
    }
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def test_a_keyboard_session_reviews_30_rows_in_under_a_minute(lab: dict[str, Any]) -> None:
    root = lab["tmp"] / "lab"
    store, picture = root / "data" / "review.duckdb", root / "data" / "review.png"
    _notebook(root / "notebooks" / "review_session.ipynb", SETUP.format(store=str(store), picture=str(picture)))
    try:
        page = run_all(lab, "review_session.ipynb")
        view = notebook(page).locator(".llmledger-review")
        view.wait_for(timeout=30_000)
        assert "ACME report number 0" in view.inner_text()
        assert view.locator("[data-field='company']").count() == 1 and view.locator("[data-field='year']").count() == 1
        assert view.locator("img.llmledger-thumb").count() == 1, "the picture column shows as a thumbnail"
        box = view.locator(".llmledger-review-box textarea")
        box.click()  # the one use of the mouse: focus
        assert box.evaluate("b => getComputedStyle(b).color") == "rgba(0, 0, 0, 0)", "the box's text is hidden"
        head = view.locator("[data-field='tally']")

        def wait(what: str, js: str, *, keys: int = 1) -> None:
            # The kernel draws the view once per burst of keys (`ReviewView.typed`), after a ledger write and a
            # read for each: on a loaded CI machine 11 keys took over 10 s, all of them before the view changed.
            # The session's own limit (a minute, below) is what a person feels; this only waits for a burst.
            try:
                page.wait_for_function(js, timeout=10_000 + 3_000 * keys)
            except Exception as exc:
                focused = page.evaluate("() => document.activeElement?.outerHTML.slice(0, 200)")
                raise AssertionError(
                    f"waiting for {what}: the view shows\n{view.inner_text()}\nthe focus is on: {focused}"
                ) from exc

        def typed(keys: str, *, reviewed: int | None = None, prompting: str | None = None) -> None:
            """Type `keys` ("\\n" is Enter) as fast as Playwright types, then wait for what a person would look at."""
            for i, part in enumerate(keys.split("\n")):
                if i:
                    page.keyboard.press("Enter")
                if part:
                    page.keyboard.type(part)
            if reviewed is not None:  # the view's HTML is drawn anew each time: look it up each time
                wait(f"{reviewed} reviewed", f"{TALLY}.textContent.startsWith('{reviewed} reviewed,')", keys=len(keys))
            if prompting is not None:
                wait(prompting, f"{PROMPT}.textContent.includes('{prompting}')", keys=len(keys))

        def shot(name: str) -> None:
            path = lab["tmp"] / f"review-{name}.png"
            view.screenshot(path=str(path))
            if keep := os.environ.get("LLMLEDGER_SCREENSHOTS"):
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, keep)

        started = time.monotonic()
        typed("aaa", reviewed=3)  # rows 0-2, three keys at once
        typed("f", prompting="why is it wrong")  # row 3: a flag, read the prompt, then its reason
        typed("wrong year", prompting="wrong year")  # shown in the prompt line, not in the box
        shot("flag")
        typed("\n", reviewed=4)
        typed("a", reviewed=5)  # row 4
        typed("c", prompting="field 1 of 2")  # row 5: company kept, the year typed
        typed("\n", prompting="field 2 of 2")
        typed("1999\n", reviewed=6)
        typed("aa", reviewed=8)  # rows 6, 7
        shot("keys")
        typed("f\n", reviewed=9)  # row 8 flagged without a reason ...
        typed("u", reviewed=8)  # ... taken back: row 8 shows again
        assert "row 9 of 30" in view.locator("[data-field='position']").inner_text()
        typed("a", reviewed=9)  # row 8 accepted after all
        typed("a" * 10, reviewed=19)  # rows 9-18 as fast as the keyboard goes
        typed("aaaaa" + "aaaaaa", reviewed=30)  # rows 19-29
        elapsed = time.monotonic() - started
        print(f"30 rows reviewed in {elapsed:.1f}s of wall time")
        assert elapsed < 60, f"30 rows took {elapsed:.0f}s"
        assert head.inner_text().startswith("30 reviewed, 0 left")
        assert "row 30 of 30" in view.locator("[data-field='position']").inner_text()
        assert "not a key" not in view.inner_text() and view.locator("[data-field='done']").count() == 1
        # "redo flagged" from the view: a first r says what a second would pay for, the second sends row 3 again
        typed("r")
        said = "document.querySelector('.llmledger-review').innerText.includes"
        wait("the confirmation", f"{said}('r again to re-send the 1 flagged row (paid)')")
        typed("r")
        page.wait_for_function(f"{said}('1 redone rows are back in the queue')", timeout=60_000)
    finally:
        shut_down_kernels(lab)
    found = llmledger.verdicts(store, "t", "facts")
    standing = found.filter(pl.col("undone_at").is_null())
    by_row = {json.loads(k)["id"]: (v, r) for k, v, r in standing.select("row_key", "verdict", "reason").rows()}
    assert standing.height == 30 and set(by_row) == set(range(30))
    assert by_row[3] == ("flag", "wrong year") and by_row[5][0] == "correct" and by_row[8] == ("accept", None)
    assert all(v == ("accept", None) for i, v in by_row.items() if i not in (3, 5))
    undone = found.filter(pl.col("undone_at").is_not_null())
    assert undone.select("row_key", "verdict").rows() == [('{"id":8}', "flag")]
    corrected = llmledger.sql(store, "SELECT facts.year, facts_source FROM t WHERE id = 5")
    assert corrected is not None and corrected.rows() == [(1999, "person")]
    redo = llmledger.sql(store, "SELECT calls, rows_selected FROM llmledger_runs ORDER BY started_at DESC LIMIT 1")
    assert redo is not None and redo.rows() == [(1, 1)], "the redo paid for the flagged row alone"
    latest = (
        "SELECT id, facts_flag, facts_source FROM t WHERE facts_finished_at = (SELECT max(facts_finished_at) FROM t)"
    )
    again = llmledger.sql(store, latest)
    assert again is not None and again.rows() == [(3, None, "simulator")], "row 3 answered anew, its flag gone"
