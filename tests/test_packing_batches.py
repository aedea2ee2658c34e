"""Packs in batches (`rows_per_request=` with `mode="batch"`): several rows in one request of a Message Batch or an
OpenAI batch, each answer its own. The pack is recorded as it is sent, so whoever merges the batch (this run, a later
call, another process) reads each entry back onto its own rows; an entry the model gets wrong is paid for all the
same (with the batch) and its rows are asked again alone; nothing is paid twice.

As in `test_packing.py`, the simulator answers each item as its request alone would be answered, so a packed row's
answer must equal the unpacked step's answer for the same row."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm, last_report

from .test_packing import PROMPT, rows_of

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")


def batch_books(store: Any, table: str, step: str) -> None:
    """What the step's rows and its batches' unused answers cost adds up to what its packs cost; each packed answer
    names a recorded pack."""
    ((rows_cost, strays),) = rows_of(
        store,
        f"SELECT sum({step}_cost_usd), count(*) FILTER (WHERE {step}_pack IS NOT NULL AND {step}_pack NOT IN "
        f"(SELECT pack_id FROM llmledger_packs)) FROM {table}",
    )
    ((packs_cost, unanswered),) = rows_of(
        store,
        f"SELECT sum(cost_usd), count(*) FILTER (WHERE answer IS NULL) FROM llmledger_packs WHERE step = '{step}'",
    )
    ((unused_cost,),) = rows_of(
        store, f"SELECT coalesce(sum(unused_cost_usd), 0) FROM llmledger_batches WHERE step = '{step}'"
    )
    assert rows_cost + unused_cost == pytest.approx(packs_cost), "every pack's cost is on rows or its batch"
    assert strays == 0 and unanswered == 0


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_packed_rows_in_a_batch_get_their_own_answers_at_the_batch_price(
    sim: Simulator, client: anthropic.AsyncAnthropic, target: Any, sms: pl.DataFrame, provider: str
) -> None:
    chosen: dict[str, Any] = {"client": client}
    if provider == "openai":
        chosen = {"client": openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="k"),
                  "model": "openai:gpt-6.1-terra"}  # fmt: skip
    rows = sms.head(45).rename({"label": "truth"})
    ask = functools.partial(apply_llm, store=target, table="sms", progress=False, **chosen)
    alone = ask(rows, "alone", prompt=PROMPT)
    sim.reset_stats()
    packed = ask(rows, "packed", prompt=PROMPT, rows_per_request=10, mode="batch")
    assert packed["packed_status"].to_list() == ["DONE"] * 45
    assert packed["packed"].to_list() == alone["alone"].to_list(), "each row's answer is its own request's"
    distinct = len(set(rows["text"]))
    assert sim.stats()["paid"] == -(-distinct // 10), "one request a pack"
    assert set(sim.paid_prompts().values()) == {1}
    report = last_report()
    assert report is not None and report.batches == 1 and report.batch_requests == -(-distinct // 10)
    assert report.batch_saved_usd > 0
    batch_books(target, "sms", "packed")
    ((batched, packs),) = rows_of(
        target, "SELECT count(*) FILTER (WHERE packed_batch_id IS NOT NULL), count(DISTINCT packed_pack) FROM sms"
    )
    assert batched == 45 and packs == -(-distinct // 10)
    ((packed_cost,),) = rows_of(target, "SELECT sum(packed_cost_usd) FROM sms")
    assert report.batch_saved_usd == pytest.approx(packed_cost), "at the batch price: half the list price"
    sim.reset_stats()
    again = ask(rows, "packed", prompt=PROMPT, rows_per_request=10, mode="batch")
    assert sim.stats()["paid"] == 0 and again["packed"].to_list() == packed["packed"].to_list()


@pytest.mark.parametrize("fault", ["pack_drop", "pack_duplicate", "pack_swap", "pack_invalid"])
def test_a_pack_in_a_batch_gotten_wrong_sends_only_those_rows_again_alone(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path, sms: pl.DataFrame, fault: str
) -> None:
    rows = sms.head(40).rename({"label": "truth"})
    ask = functools.partial(apply_llm, client=client, store=store, table="sms", progress=False)
    alone = ask(rows, "alone", prompt=PROMPT)
    sim.configure(**{fault: 1.0})
    sim.reset_stats()
    packed = ask(rows, "packed", prompt=PROMPT, rows_per_request=8, mode="batch")
    assert packed["packed"].to_list() == alone["alone"].to_list(), "no row holds another row's answer"
    assert packed["packed_status"].to_list() == ["DONE"] * 40
    problems = [json.loads(p) for (p,) in rows_of(store, "SELECT problems FROM llmledger_packs WHERE rows > 1")]
    assert problems and all(problems), "every pack of several rows got something wrong"
    failed = sum(len(p) for p in problems)
    ((alone_packs, unused),) = rows_of(
        store,
        "SELECT (SELECT count(*) FROM llmledger_packs WHERE rows = 1), "
        "(SELECT sum(unused) FROM llmledger_batches WHERE step = 'packed')",
    )
    assert alone_packs == failed == unused, "each failed entry paid with its batch, its row asked once alone"
    assert sim.stats()["paid"] == len(problems) + failed
    report = last_report()
    assert report is not None and report.batches == 2, "the failed rows went alone in a second batch"
    batch_books(store, "sms", "packed")


def test_a_later_call_merges_a_packed_batch_it_did_not_send(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path, sms: pl.DataFrame
) -> None:
    rows = sms.head(30).rename({"label": "truth"})
    ask = functools.partial(apply_llm, client=client, store=store, table="sms", progress=False)
    sim.configure(pack_drop=0.5, seed=3)
    ask(rows, "packed", prompt=PROMPT, rows_per_request=6, mode="batch", wait=False)
    assert rows_of(store, "SELECT count(*) FROM llmledger_packs WHERE answer IS NULL")[0][0] > 0, "recorded as sent"
    llmledger.resume(store, "sms", "packed", client=client, progress=False)  # merges it, asks the failed again
    done = ask(rows, "packed", prompt=PROMPT, rows_per_request=6, mode="batch")
    assert done["packed_status"].to_list() == ["DONE"] * 30
    paid = sim.paid_prompts()
    failed = sum(
        len(json.loads(p))
        for (p,) in rows_of(
            store, "SELECT problems FROM llmledger_packs WHERE custom_id IS NOT NULL AND problems IS NOT NULL"
        )
    )
    assert failed and max(paid.values()) <= 2 and sum(paid.values()) == len(paid) + failed, "failed rows once more"
    sim.configure(pack_drop=0.0)
    alone = ask(rows, "alone", prompt=PROMPT)
    assert done["packed"].to_list() == alone["alone"].to_list()
    batch_books(store, "sms", "packed")


@pytest.mark.parametrize("mode", ["online", "batch"])
def test_rows_alike_go_in_different_packs_so_each_is_paid_once(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path, mode: str
) -> None:
    """Rows whose first words cannot be told apart ("ok" and "OK!"; "1" and "10") failed together in every pack they
    shared: online each was then paid again alone, and a batch polled with wait=False packed them together again on
    every call, paying each time. They now go in different packs from the start."""
    texts = ["ok", "OK!", "Ok.", "1", "10", "100", "hello there", "hello there friend", "fine"]
    df = pl.DataFrame({"id": range(len(texts)), "text": texts})
    ask = functools.partial(apply_llm, df, "s", prompt="Label: {text}", store=store, table="t", progress=False,
                            client=client, rows_per_request=9, mode=mode,
                            **({"wait": False} if mode == "batch" else {}))  # fmt: skip
    sim.configure(batch_delay=0.3)
    out = ask()
    for _ in range(40):  # a script polling its batches
        if out["s_status"].to_list() == ["DONE"] * len(texts):
            break
        out = ask()
    assert out["s_status"].to_list() == ["DONE"] * len(texts)
    assert set(sim.paid_prompts().values()) == {1}, sim.paid_prompts()
    ((problems,),) = rows_of(store, "SELECT count(*) FROM llmledger_packs WHERE problems IS NOT NULL")
    assert problems == 0


def test_batch_size_counts_requests_so_packs_fill_each_batch(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path
) -> None:
    """batch_size= is requests per batch (as documented): 20 rows, 5 to a request, 2 requests a batch make 2 batches
    of 2 full packs. It once counted rows, so each batch carried one pack of 2 rows."""
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
    df = pl.DataFrame({"id": range(20), "text": [f"{w} is a word" for w in (words + "romeo sierra tango").split()]})
    out = apply_llm(df, "s", prompt="Label: {text}", store=store, table="t", progress=False, client=client,
                    rows_per_request=5, mode="batch", batch_size=2)  # fmt: skip
    assert out["s_status"].to_list() == ["DONE"] * 20
    batches = rows_of(store, "SELECT requests, rows_sent FROM llmledger_batches ORDER BY created_at")
    assert batches == [(2, 10), (2, 10)]
