"""messages=: a conversation before each row's message (few-shot examples, a shared text), fingerprinted whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import PromptError, pipeline, resume

from .conftest import frame, sql

SHOTS = [
    {"role": "user", "content": "Classify: free entry to win a prize"},
    {"role": "assistant", "content": "spam"},
    {"role": "user", "content": "Classify: see you at lunch"},
    {"role": "assistant", "content": "ham"},
]
ROW = {"role": "user", "content": "Classify: {text}"}


def test_the_conversation_is_sent_before_each_rows_message(run: Any, sim: Any, store: Path) -> None:
    out = run(frame(3), "label", messages=[*SHOTS, ROW], max_tokens=5)
    assert out["label_status"].to_list() == ["DONE"] * 3
    for entry in sim.log():
        assert entry["body"]["messages"][:4] == SHOTS
        assert entry["body"]["messages"][4]["content"].startswith("Classify: hello message number")
    # the ledger stores the row's message; the conversation is stored once, with the step's request
    assert sql(store, "SELECT label_prompt FROM messages ORDER BY id")[0] == ("Classify: hello message number 0",)


def test_changing_the_conversation_makes_rows_stale_and_a_rerun_pays_nothing(run: Any, sim: Any) -> None:
    run(frame(3), "label", messages=[*SHOTS, ROW])
    run(frame(3), "label", messages=[*SHOTS, ROW])
    assert sim.stats()["paid"] == 3
    edited = [*SHOTS[:3], {"role": "assistant", "content": "not spam"}]
    with pytest.warns(llmledger.StaleAnswersWarning, match="3 DONE rows are stale"):
        out = run(frame(3), "label", messages=[*edited, ROW])
    assert out["label_stale"].all() and sim.stats()["paid"] == 3
    run(frame(3), "label", messages=[*edited, ROW], redo="stale")
    assert sim.stats()["paid"] == 6 and sim.log()[-1]["body"]["messages"][3]["content"] == "not spam"


def test_a_resumed_step_sends_the_same_conversation(client: Any, sim: Any, store: Path) -> None:
    sim.configure(poison="number 1")
    llmledger.apply_llm(
        frame(3), "label", messages=[*SHOTS, ROW], client=client, store=store, table="t", progress=False
    )
    sim.configure(poison=None)
    report = resume(store, "t", "label", client=client, progress=False)
    assert report.done == 1 and sim.log()[-1]["body"]["messages"][:4] == SHOTS


def test_a_long_conversation_is_sent_as_a_cached_prefix(run: Any, sim: Any) -> None:
    shared = {"role": "user", "content": "The house rules for labelling. " * 800}
    messages = [shared, {"role": "assistant", "content": "Understood."}, ROW]
    run(frame(4), "label", messages=messages, system="You label messages.")
    body = sim.log()[0]["body"]
    assert body["system"] == "You label messages.", "one breakpoint, at the end of the prefix, caches both"
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Understood.", "cache_control": {"type": "ephemeral", "ttl": "5m"}}
    ]
    assert "cache_control" not in str(body["messages"][2])
    stats = sim.stats()
    assert stats["cache_write_tokens"] > 6000 and stats["cache_read_tokens"] == 3 * stats["cache_write_tokens"], (
        "the first row writes the prefix, the other three read it"
    )
    est = llmledger.estimate(
        frame(4, start=10),
        "label2",
        messages=messages,
        system="You label messages.",
        store=run.keywords["store"],
        client=run.keywords["client"],
    )
    assert est["cost_usd"][0] is not None
    plain = llmledger.estimate(
        frame(4, start=10),
        "label3",
        messages=messages,
        system="You label messages.",
        cache=False,
        store=run.keywords["store"],
        client=run.keywords["client"],
    )
    assert est["cost_usd"][0] < plain["cost_usd"][0], "the cached prefix is priced as cache reads"


def test_short_conversations_are_not_marked_for_caching(run: Any, sim: Any) -> None:
    run(frame(2), "label", messages=[*SHOTS, ROW])
    assert "cache_control" not in str(sim.log()[0]["body"])


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "pass prompt= .* or messages="),
        ({"prompt": "x {text}", "messages": [ROW]}, "not both"),
        ({"messages": []}, "non-empty list"),
        (
            {"messages": [{"role": "user", "content": "Classify: {text}"}, {"role": "assistant", "content": "ok"}]},
            "the last message is the row's own",
        ),
        ({"messages": [{"role": "system", "content": "x"}, ROW]}, r"messages\[0\] must be"),
        (
            {"messages": [{"role": "user", "content": "Earlier: {text}"}, {"role": "assistant", "content": "ok"}, ROW]},
            r"messages\[0\] names column \{text\}",
        ),
        ({"messages": [{"role": "user", "content": ""}, ROW]}, "non-empty text content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}, ROW]}, "attach="),
        ({"messages": [{"role": "user", "content": "a\x00b"}, {"role": "assistant", "content": "ok"}, ROW]}, "NUL"),
        (
            {"messages": [{"role": "user", "content": "a\ud800b"}, {"role": "assistant", "content": "ok"}, ROW]},
            "surrogate",
        ),
        ({"messages": [ROW], "system": "x\udfffy"}, "system holds '.udfff', half of a UTF-16 surrogate"),
    ],
)
def test_bad_conversations_are_refused_before_anything_is_written(
    run: Any, store: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(llmledger.InvalidInputError, match=message):
        run(frame(2), "label", **options)
    assert not store.exists()


def test_literal_braces_in_the_conversation_are_sent_as_written(run: Any, sim: Any) -> None:
    shots = [
        {"role": "user", "content": 'Answer as JSON like {"label": "spam"}'},
        {"role": "assistant", "content": "OK"},
    ]
    run(frame(1), "label", messages=[*shots, ROW])
    assert sim.log()[0]["body"]["messages"][0]["content"] == 'Answer as JSON like {"label": "spam"}'


def test_pipelines_take_messages(client: Any, sim: Any, store: Path) -> None:
    out = pipeline(
        frame(2),
        {"label": {"messages": [*SHOTS, ROW]}, "why": {"prompt": "Why is '{text}' {label}?"}},
        client=client,
        store=store,
        table="t",
        progress=False,
    )
    assert out["why_status"].to_list() == ["DONE"] * 2 and sim.stats()["paid"] == 4


def test_the_row_message_may_be_a_callable(run: Any, sim: Any) -> None:
    out = run(
        pl.DataFrame({"id": [1], "text": ["abc"]}),
        "label",
        messages=[*SHOTS, {"role": "user", "content": lambda row: f"Classify: {row['text'].upper()}"}],
    )
    assert out["label_status"][0] == "DONE" and sim.log()[0]["body"]["messages"][-1]["content"] == "Classify: ABC"
    with pytest.raises(PromptError):
        run(pl.DataFrame({"id": [1], "text": ["abc"]}), "label2", messages=[*SHOTS, {"role": "user", "content": 3}])
