"""Notebooks run top to bottom in a real kernel without a widget front end (as `jupyter nbconvert` runs them),
against the bundled simulator, with no API key. `test_browser.py` runs every notebook in JupyterLab."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import polars as pl
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
    NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
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
    assert paid(first, "this run") > 300, "400 rows, a few of them duplicate texts"
    assert "calls; 0 rows were DONE already" in first
    assert paid(first, "the same cell again") == 0
    assert "sentiment_status" in first and "DONE" in first
    assert first.count("class='llmledger-view llmledger-summary ") == 2, "each run's summary, once, as HTML"
    assert "llmledger-store" in first, "llmledger.show draws the store"

    second = text_of(execute("01_quickstart.ipynb", store, monkeypatch))
    assert paid(second, "this run") == 0 and paid(second, "the same cell again") == 0
    assert "this run paid 0 calls; 400 rows were DONE already" in second, "the rerun says what it did"


@pytest.mark.slow
def test_background_run_while_other_cells_query(tmp_path: Path, monkeypatch) -> None:
    book = execute("03_background_run.ipynb", tmp_path / "background.duckdb", monkeypatch)
    text = text_of(book)
    assert "finished before wait(): False" in text, "the other cells ran while the run went on"
    cell = next(c for c in book.cells if "run.progress()" in c.source)
    assert [o["output_type"] for o in cell["outputs"]] == ["execute_result"], "nothing spilled into this cell"
    shown = cell["outputs"][0]["data"]["text/plain"]
    # On a loaded machine the run may still be recording the frame a second in: either state is "going".
    assert re.search(r"\b(preparing|running)\b", shown), shown
    assert "llmledger-summary" in text and "completed" in text
    assert os.path.exists(tmp_path / "background.duckdb")


@pytest.mark.slow
def test_documents_are_paid_once_whatever_their_path_and_a_changed_file_is_stale(tmp_path: Path, monkeypatch) -> None:
    text = text_of(execute("07_documents.ipynb", tmp_path / "documents.duckdb", monkeypatch))
    assert paid(text, "this run") == 12 and "12 calls; 0 rows were DONE already" in text
    assert paid(text, "the same cell again") == 0
    assert paid(text, "after moving the files") == 0 and "0 rows are stale" in text
    assert paid(text, "after the re-scan") == 0 and re.search(r"stale rows: \[\d+\]", text), "exactly one row"
    assert paid(text, "the redo of the stale rows") == 1
    assert paid(text, "the conversation step") == 12 and "it agrees with the file names on 12 of 12" in text
    assert "sha256:" in text, "the ledger shows the recorded hash, not the bytes"
    assert "llmledger-store" in text


@pytest.mark.slow
def test_models_are_compared_and_the_cheapest_that_agrees_answers_the_rest(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("openai", reason="the notebook runs an OpenAI model: pip install -e '.[dev]'")
    text = text_of(execute("06_models.ipynb", tmp_path / "models.duckdb", monkeypatch))
    for step, model in [("sonnet", "claude-sonnet-5-5"), ("haiku", "claude-haiku-5-5"), ("nano", "gpt-6-luna")]:
        assert f"sentiment_{step} ({model}): 300 DONE" in text, "each model answered the 300 rows"
    assert "sentiment_local (qwen3:8b): 300 DONE, $0/row" in text, "the local server, priced at 0"
    agree = {s: float(p) for s, p in re.findall(r"(sentiment_\w+) +agrees +([\d.]+)%", text)}
    assert agree["sentiment_sonnet"] == 100.0 and agree["sentiment_local"] < 95 <= agree["sentiment_haiku"], agree
    assert "chosen: sentiment_haiku" in text, "the cheapest model agreeing on 95 % or more"
    assert "300 rows were DONE already (the comparison's); 2,450 requests paid for the other 2,700" in text
    assert "│ claude-haiku-5-5 ┆ 3000" in text


@pytest.mark.slow
def test_review_notebook_chooses_the_cheaper_model_a_persons_verdicts_find_good_enough(
    tmp_path: Path, monkeypatch
) -> None:
    """08_review: two models label 300 messages, a sample of the cheaper one's answers is judged, accuracy() names
    the cheaper model as good enough, it labels the rest, and the redo of flagged rows pays for those alone."""
    store = tmp_path / "review.duckdb"
    text = text_of(execute("08_review.ipynb", store, monkeypatch))
    said = [line for line in text.splitlines() if re.search(r"reviewed|right on|cheapest|known to reach|chosen", line)]
    assert "cheapest whose low end reaches 90%: label_haiku" in text and "chosen: label_haiku" in text, said
    import llmledger

    verdicts = llmledger.verdicts(store, "sms")
    judged = verdicts.filter(pl.col("verdict") != "flag")
    assert judged.height == int(re.search(r"(\d+) answers reviewed", text).group(1))  # type: ignore[union-attr]
    accuracy = llmledger.accuracy(store, "sms", "label_haiku", against=["label_fable"], target=0.9)
    reviewed = dict(accuracy.table.select("step", "reviewed").iter_rows())
    on_model = verdicts.filter(pl.col("source").fill_null("") != "person")  # a flag is a verdict too
    assert accuracy.cheapest == "label_haiku" and reviewed["label_haiku"] == on_model.height
    assert reviewed["label_fable"] >= judged.height
    redone = re.search(r"(\d+) answers flagged \((\d+) rows.*the redo paid (\d+) calls", text)
    assert redone, text[-2000:]
    flags, rows, paid = (int(g) for g in redone.groups())
    assert flags == verdicts.filter(pl.col("verdict") == "flag").height and 0 < paid <= rows
    still = llmledger.sql(store, "SELECT count(*) FROM sms WHERE label_haiku_flag IS NOT NULL").item()
    assert still == 0, "every flagged row was asked again"
    person = llmledger.sql(store, "SELECT count(*) FROM sms WHERE label_haiku_source = 'person'").item()
    assert person >= judged.filter(pl.col("verdict") == "correct").height, "no redo replaced a correction"
