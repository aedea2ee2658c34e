"""The simulator's answers follow the prompt for the common tasks, so a newcomer's first runs mean something: a
label among the options a prompt names (spam or ham read from the message, sentiment from the review), typed
fields of those labels alike, `accuracy=` models that get a share wrong on any such task, and a redo that draws
again as sampling would. Found in a trial: typed spam/ham labels matched the truth on 51.5 % of the SMS Spam
Collection, `accuracy=` did nothing on a one-word prompt, and a redo of flagged rows returned the same answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm

from .conftest import sql

SPAM = "Is this SMS spam or ham? Answer with one word.\n\nSMS: {text}"


@pytest.fixture
def messages(sms: pl.DataFrame) -> pl.DataFrame:
    # both kinds, in the collection's proportion (13 % spam: about 40 of them). 300 tell a label that follows the
    # message (>= 90 %) from a coin (51.5 % once) and 20 % wrong from none or all (0.12-0.28 is +-3.4 standard
    # errors); 600 took twice the time for the same verdicts (the answers are the same every run)
    return sms.sample(300, seed=7)


def agreement(out: pl.DataFrame, column: str) -> float:
    return float((out[column] == out["label"]).mean())  # type: ignore[arg-type]


def test_spam_or_ham_is_read_from_the_message_as_text_and_as_a_typed_field(run: Any, messages: pl.DataFrame) -> None:
    out = run(messages, "label_text", prompt=SPAM)
    assert set(out["label_text"]) <= {"spam", "ham"} and agreement(out, "label_text") >= 0.9
    typed = run(messages, "typed", prompt=SPAM, output={"label": Literal["spam", "ham"]})
    labels = typed.with_columns(pl.col("typed").struct.field("label").alias("typed_label"))
    assert agreement(labels, "typed_label") >= 0.9, "a typed label follows the message too (was 51.5 %)"


def test_a_model_given_an_accuracy_gets_that_share_of_a_one_word_task_wrong(
    messages: pl.DataFrame, store: Path
) -> None:
    pytest.importorskip("anthropic")
    import anthropic

    with Simulator(accuracy={"claude-haiku-5-5": 0.8}) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
        ask = {"prompt": SPAM, "client": client, "store": store, "table": "t", "progress": False}
        sure = apply_llm(messages, "sure", model="claude-sonnet-5", **ask)["sure"]
        unsure = apply_llm(messages, "unsure", model="claude-haiku-5-5", **ask)["unsure"]
    differ = float((sure != unsure).mean())  # type: ignore[arg-type]
    assert 0.12 <= differ <= 0.28, f"{differ:.1%} of answers differ; accuracy 0.8 should make about 20 %"
    assert set(unsure) <= {"spam", "ham"}, "a wrong answer is another of the options, not text"


def test_a_redo_of_flagged_rows_draws_again_as_sampling_would(run: Any, sim: Simulator, store: Path) -> None:
    sim.configure(resample=True)
    df = pl.DataFrame({"id": range(40), "text": [f"Call now to claim your prize {i}" for i in range(40)]})
    first = run(df, "label", prompt=SPAM)["label"].to_list()
    llmledger.flag(store, "messages", "label", where="id < 40", reason="check again")
    again = run(df, "label", prompt=SPAM, redo="flagged")["label"].to_list()
    changed = sum(a != b for a, b in zip(first, again, strict=True))
    assert 5 <= changed <= 35, f"{changed} of 40 answers changed on a redo: some, not none or all"
    summaries = run(df.head(3), "summary", prompt="Summarize: {text}")["summary"].to_list()
    llmledger.flag(store, "messages", "summary", where="id < 3", reason="again")
    redone = run(df.head(3), "summary", prompt="Summarize: {text}", redo="flagged")["summary"].to_list()
    assert all(r != s and r.startswith(s) for r, s in zip(redone, summaries, strict=True)), redone
    assert sql(store, "SELECT count(*) FROM llmledger_history WHERE step = 'summary'") == [(3,)]


def test_typed_fields_are_read_from_the_invoice_as_a_model_would(run: Any, tmp_path: Path) -> None:
    """Found in a trial: notebook 07 says invoices get "their real vendor and total", and the totals (a field
    named `total_usd`) were made up: a field's name is read as the document's label ("Total"), longest first."""
    from llmledger.simulator import pdf

    paths = []
    for i, (vendor, total) in enumerate([("Acme Corp", "1,234.50"), ("Globex Ltd", "87.10")]):
        path = tmp_path / f"invoice{i}.pdf"
        path.write_bytes(pdf([f"Vendor: {vendor}\nInvoice number: {i}\nTotal: ${total}"]))
        paths.append(str(path))
    df = pl.DataFrame({"id": [0, 1], "path": paths})
    out = run(df, "extract", prompt="Who issued this, and what is its total in US dollars?", attach="path",
              output={"vendor": str, "total_usd": float, "invoice_number": int})  # fmt: skip
    fields = out["extract"].struct.unnest().rows()
    assert fields == [("Acme Corp", 1234.5, 0), ("Globex Ltd", 87.1, 1)]


@pytest.mark.parametrize(
    ("fault", "value", "message"),
    [("error_rate", 5, "must be a share from 0 to 1"), ("drop_rate", -0.1, "must be a share from 0 to 1"),
     ("latency", -1, "must be 0 or more"), ("rate_limit", 0, "must be more than 0"),
     ("drop_next", 1.5, "is not an integer"), ("batch_max_requests", 0, "must be more than 0"),
     ("error_status", "bogus", "must be an HTTP error status 400..599 or one of"),
     ("fail_next", [529, "bogus"], "must be an HTTP error status 400..599 or one of"),
     ("outage_for", float("inf"), "must be 0 or more"), ("compatible", "no", "pass true or false"),
     ("today", "tomorrow", "must be a day as YYYY-MM-DD"), ("poison", 3, "must be a text")],
)  # fmt: skip
def test_a_fault_the_simulator_cannot_have_is_refused_in_python_as_on_the_command_line(
    fault: str, value: Any, message: str
) -> None:
    # found in a trial: Simulator(error_rate=5) failed every request; only `llmledger simulator` checked its options
    with pytest.raises(ValueError, match=f"{fault}=.*{message}"):
        Simulator(**{fault: value})
    sim = Simulator()
    with pytest.raises(ValueError, match=f"{fault}=.*{message}"):
        sim.configure(**{fault: value})
    assert sim.faults == Simulator().faults, "a refused change changes nothing"
