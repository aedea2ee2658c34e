"""The notebooks run top to bottom with a real kernel, against the bundled simulator, with no API key."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient
pytestmark = pytest.mark.jupyter


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, store: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run a notebook in a fresh kernel (which inherits this environment) and return it with its outputs."""
    monkeypatch.setenv("LLMLEDGER_STORE", str(store))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return book


def text_of(book: Any) -> str:
    """Everything the cells printed or displayed as text/plain or text/html."""
    parts = []
    for cell in book.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            data = out.get("data", {})
            parts.append(data.get("text/plain", ""))
            parts.append(data.get("text/html", ""))
    return "\n".join(parts)


def paid(text: str, what: str) -> int:
    match = re.search(rf"{what} paid (\d+) calls", text)
    assert match, f"no '{what} paid N calls' in the output"
    return int(match.group(1))


@pytest.mark.slow
def test_quickstart_twice_on_one_store_pays_nothing_the_second_time(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "quickstart.duckdb"
    first = text_of(execute("01_quickstart.ipynb", store, monkeypatch))
    assert "simulated answers" in first
    assert paid(first, "first run") > 300, "400 rows, a few of them duplicate texts"
    assert paid(first, "second run") == 0
    assert "sentiment_status" in first and "DONE" in first
    assert "llmledger-summary" in first, "the end-of-run summary rendered as HTML"

    second = text_of(execute("01_quickstart.ipynb", store, monkeypatch))
    assert paid(second, "first run") == 0 and paid(second, "second run") == 0


@pytest.mark.slow
def test_rerun_failed_and_flagged(tmp_path: Path, monkeypatch) -> None:
    text = text_of(execute("02_rerun_failed_and_flagged.ipynb", tmp_path / "rerun.duckdb", monkeypatch))
    assert text.count("400 BadRequestError") >= 3, "the failed rows and their errors are shown"
    assert paid(text, "rerun of the failed rows") == 3
    assert paid(text, "redo of the flagged rows") == 2
    assert "flagged: looks wrong" in text, "the replaced answers are kept, with why"


@pytest.mark.slow
def test_background_run_while_other_cells_query(tmp_path: Path, monkeypatch) -> None:
    book = execute("03_background_run.ipynb", tmp_path / "background.duckdb", monkeypatch)
    text = text_of(book)
    assert "finished before wait(): False" in text, "the other cells ran while the run went on"
    cell = next(c for c in book.cells if "run.progress()" in c.source)
    assert [o["output_type"] for o in cell["outputs"]] == ["execute_result"], "nothing spilled into this cell"
    assert "running" in cell["outputs"][0]["data"]["text/plain"]
    assert "llmledger-summary" in text and "completed" in text
    assert os.path.exists(tmp_path / "background.duckdb")


@pytest.mark.slow
def test_pipeline_with_a_typed_step_a_flag_and_a_redo(tmp_path: Path, monkeypatch) -> None:
    text = text_of(execute("04_pipeline.ipynb", tmp_path / "pipeline.duckdb", monkeypatch))
    assert "simulated answers" in text
    assert paid(text, "the pipeline") > 600, "300 rows, three steps (a few duplicate reviews share answers)"
    assert paid(text, "the rerun") == 0
    assert "struct[3]" in text, "the extract step is a typed column"
    assert paid(text, "the redo of the flagged rows") == 5
    assert re.search(r"classify\s*┆\s*300\s*┆\s*5\s*┆", text) and re.search(r"summarise\s*┆\s*300\s*┆\s*5\s*┆", text), \
        "the five redone rows are reported stale in both downstream steps"
    assert paid(text, "a plain rerun") == 0, "stale rows are not re-paid unless asked"
    assert paid(text, "the redo of the stale rows") == 10
    assert "flagged: vague product" in text


@pytest.mark.slow
def test_cost_notebook_estimates_batches_and_shows_what_was_avoided(tmp_path: Path, monkeypatch) -> None:
    text = text_of(execute("05_cost.ipynb", tmp_path / "cost.duckdb", monkeypatch))
    assert "simulated answers" in text
    assert "SUBMITTED" in text and "submitted" in text, "the batch was left processing after the submitting cell"
    assert re.search(r"9\d\d done · .* · 9\d\d of them from batches", text), "a later cell collected the batch"
    estimated, billed = map(float, re.search(r"estimated for the batch: \$([\d.]+); billed: \$([\d.]+)", text).groups())
    assert billed > 0 and abs(estimated - billed) <= 0.25 * billed
    assert re.search(r"batch prices \$0\.0[1-9]", text), "the batch discount is counted as avoided"
    assert re.search(r"the rerun paid 0 calls and avoided \$0\.0[1-9]", text)
