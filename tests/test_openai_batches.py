"""OpenAI's Batch API (mode="batch" on model="openai:..."): half the price, never lost, never paid twice.

The real `openai` SDK against the simulator's `/v1/files` and `/v1/batches`, which answer as OpenAI's do: the
requests go up as a JSONL file, the batch carries its intent in `metadata`, the answers come back in an output file
and the refusals and unrun requests in an error file, in no order. The same ledger promises as for Message Batches
(`test_batches.py`); here what OpenAI's API does its own way.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm
from llmledger._exec import collect

from .conftest import frame, helper_cmd, in_a_batch, sql, subprocess_env

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")

GPT = "openai:gpt-6.1-terra"
PROMPT = "Summarize: {text}"


@pytest.fixture
def oa(sim: Simulator) -> Any:
    return openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")


def statuses(target: Any, step: str = "s", table: str = "t") -> dict[str, int]:
    query = f"SELECT {step}_status::VARCHAR AS s, count(*) AS n FROM {table} GROUP BY 1"
    return dict(llmledger.sql(target, query).rows())


@pytest.mark.parametrize("api", ["responses", "chat"])  # the Batch API takes both: "url": "/v1/responses" or chat's
def test_a_batch_run_answers_every_row_at_half_the_online_price_and_a_rerun_pays_nothing(
    target: Any, oa: Any, sim: Simulator, tmp_path: Path, api: str
) -> None:
    ask = functools.partial(apply_llm, client=oa, store=target, table="t", progress=False, model=GPT, api=api)
    df = pl.DataFrame({"id": range(40), "text": [f"message {i % 30}" for i in range(40)]})  # 10 duplicates
    out = ask(df, "s", prompt=PROMPT, mode="batch")
    assert out["s_status"].to_list() == ["DONE"] * 40
    stats = sim.stats()
    assert stats["batches"] == 1 and stats["batch_paid"] == 30 and stats["paid"] == 30
    assert not sim.log(), "no online request at all"
    batch_ids = llmledger.sql(target, "SELECT DISTINCT s_batch_id AS b FROM t")["b"].to_list()
    assert len(batch_ids) == 1 and batch_ids[0].startswith("batch_")
    assert ask(df, "s", prompt=PROMPT, mode="batch")["s"].to_list() == out["s"].to_list()
    assert sim.stats()["batch_paid"] == 30 and sim.stats()["batches"] == 1, "a rerun pays nothing"

    with Simulator() as other:  # the same rows online, for the price
        online = openai.AsyncOpenAI(base_url=other.base_url + "/v1", api_key="k")
        apply_llm(df, "s", prompt=PROMPT, model=GPT, client=online, store=tmp_path / "online.duckdb", progress=False,
                  api=api)  # fmt: skip
    batch = llmledger.sql(target, "SELECT sum(s_cost_usd) AS c, sum(s_output_tokens) AS o FROM t").row(0)
    with_online = sql(tmp_path / "online.duckdb", "SELECT sum(s_cost_usd), sum(s_output_tokens) FROM ledger")
    assert batch[1] == with_online[0][1], "the same answers and tokens ..."
    assert batch[0] == pytest.approx(with_online[0][0] / 2), "... at half the price"


def test_refused_errored_and_expired_requests_are_told_apart(oa: Any, sim: Simulator, store: Path) -> None:
    """The row's fault (a request OpenAI refuses, a refusal) fails it; the API's (a 500 in the error file, a request
    the window ended before) gives it back unpaid, to be sent again."""
    texts = ["fine one", "POISON here", "FLAKY here", "OLD here", "NOPE here"]
    df = pl.DataFrame({"id": range(5), "text": texts})
    sim.configure(poison="POISON", batch_error="FLAKY", batch_expire="OLD", refuse="NOPE")
    out = apply_llm(df, "s", prompt=PROMPT, model=GPT, mode="batch", client=oa, store=store, table="t", progress=False)
    got = dict(zip(out["text"], out["s_status"].cast(pl.String), strict=True))
    assert got == {
        "fine one": "DONE",
        "POISON here": "FAILED",
        "FLAKY here": "NOT_STARTED",
        "OLD here": "NOT_STARTED",
        "NOPE here": "FAILED",
    }
    rows = {r[0]: r[1:] for r in sql(store, "SELECT text, s_attempts, s_error, s_cost_usd FROM t")}
    assert rows["POISON here"][0] == 1 and "400" in rows["POISON here"][1] and rows["POISON here"][2] is None
    assert "refusal" in rows["NOPE here"][1], "a refusal fails its row (billed to the run's report, as online)"
    assert rows["FLAKY here"][:3] == (0, None, None) and rows["OLD here"][:3] == (0, None, None)

    sim.configure(poison=None, batch_error=None, batch_expire=None, refuse=None)
    out = apply_llm(df, "s", prompt=PROMPT, model=GPT, mode="batch", client=oa, store=store, table="t", progress=False)
    assert out["s_status"].to_list() == ["DONE"] * 5, "the failed rows' second attempt, the others' first"
    paid = sim.paid_prompts()
    assert {p: n for p, n in paid.items() if n > 1} == {"Summarize: NOPE here": 2}, "only the refusal paid twice"


def test_a_create_whose_answer_is_lost_is_found_by_its_metadata_not_sent_twice(
    oa: Any, sim: Simulator, store: Path
) -> None:
    sim.configure(batch_lose_response=1, batch_delay=0.5)  # OpenAI makes the batch; the answer never arrives
    out = apply_llm(
        frame(8), "s", prompt=PROMPT, model=GPT, mode="batch", client=oa, store=store, table="t", progress=False
    )
    assert out["s_status"].to_list() == ["DONE"] * 8
    assert sim.stats()["batches"] == 1 and sim.stats()["batch_paid"] == 8
    assert sql(store, "SELECT adopted FROM llmledger_batches") == [(True,)]


def test_a_batch_whose_file_the_api_refuses_gives_its_rows_back_unpaid_and_stops(
    oa: Any, sim: Simulator, store: Path
) -> None:
    sim.configure(batch_max_requests=3)  # the file is checked when the batch is made: a failed batch, not an error
    out = apply_llm(
        frame(5), "s", prompt=PROMPT, model=GPT, mode="batch", client=oa, store=store, table="t", progress=False
    )
    assert out["s_status"].to_list() == ["NOT_STARTED"] * 5
    report = llmledger.last_report()
    assert report is not None and "refused batch" in report.message and "too_many_requests" in report.message
    assert sim.stats()["batches"] == 1 and sim.stats()["batch_paid"] == 0
    out = apply_llm(
        frame(5),
        "s",
        prompt=PROMPT,
        model=GPT,
        mode="batch",
        batch_size=3,
        client=oa,
        store=store,
        table="t",
        progress=False,
    )
    assert out["s_status"].to_list() == ["DONE"] * 5 and sim.stats()["batch_paid"] == 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("die_before", [None, "confirm", "create"])
def test_a_killed_process_loses_no_openai_batch_and_another_collects_it(
    sim: Simulator, oa: Any, store: Path, die_before: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while waiting, after OpenAI took the batch but before the ledger knew its id, or before sending it:
    a later run in another process merges every result exactly once, or sends the batch that was never sent."""
    monkeypatch.setattr(collect, "ABANDON_AFTER", timedelta(seconds=3))  # the dead process is long gone
    rows = 12
    sim.configure(batch_delay=2.0)
    args = ["--mode", "batch", "--model", GPT, *(["--die-before", die_before] if die_before else [])]
    proc = subprocess.Popen(
        helper_cmd(str(store), str(rows), *args), env=subprocess_env(sim.base_url), stdout=subprocess.PIPE, text=True
    )
    try:
        if die_before is None:  # kill it while it waits for the batch
            deadline = time.monotonic() + 60
            while not in_a_batch(store) and time.monotonic() < deadline:
                time.sleep(0.1)
            proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert sim.stats()["batches"] == (0 if die_before == "create" else 1)
    assert statuses(store, "summary", "messages") == {"SUBMITTED" if die_before is None else "RUNNING": rows}

    out = apply_llm(
        frame(rows, word="hello"),
        "summary",
        prompt=PROMPT,
        model=GPT,
        mode="batch",
        client=oa,
        store=store,
        table="messages",
        progress=False,
    )
    assert out["summary_status"].to_list() == ["DONE"] * rows
    assert sim.stats()["batches"] == 1 and sim.stats()["batch_paid"] == rows
    assert max(sim.paid_prompts().values()) == 1
    cost, tokens_in, tokens_out = sql(
        store, "SELECT sum(summary_cost_usd), sum(summary_input_tokens), sum(summary_output_tokens) FROM messages"
    )[0]
    price = llmledger.prices().filter(model="gpt-6.1-terra").row(0, named=True)
    assert cost == pytest.approx((tokens_in * price["input"] + tokens_out * price["output"]) / 1e6 / 2), "batch rate"
    states = dict(sql(store, "SELECT state, count(*) FROM llmledger_batches GROUP BY ALL"))
    assert states == ({"abandoned": 1, "merged": 1} if die_before == "create" else {"merged": 1})


def test_a_batch_a_person_cancels_gives_back_what_it_did_not_run(oa: Any, sim: Simulator, store: Path) -> None:
    # a batch processes its requests in order over batch_delay: with 5 s, a loaded machine that took 1.25 s to
    # cancel found one of the four answered; with an hour, the cancel finds all four still to run
    sim.configure(batch_delay=3600.0)
    ask = functools.partial(
        apply_llm, model=GPT, mode="batch", client=oa, store=store, table="t", progress=False, wait=False
    )
    ask(frame(4), "s", prompt=PROMPT)
    batch_id = sql(store, "SELECT any_value(s_batch_id) FROM t")[0][0]

    async def cancel() -> None:  # as a person would, from the dashboard or the SDK
        async with openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="k") as person:
            await person.batches.cancel(batch_id)

    asyncio.run(cancel())
    out = ask(frame(4), "s", prompt=PROMPT)
    assert sql(store, f"SELECT canceled, processing_status FROM llmledger_batches WHERE batch_id = '{batch_id}'") == [
        (4, "cancelled")
    ]
    assert out["s_status"].to_list() == ["SUBMITTED"] * 4 and sim.stats()["batches"] == 2, "sent again at once"


@pytest.mark.parametrize("first", ["openai", "anthropic"])
def test_a_batch_of_one_provider_waits_for_it_when_the_step_moves_to_the_other(
    oa: Any, client: Any, sim: Simulator, store: Path, first: str
) -> None:
    """A step sent in a batch to one provider, then run on the other's model: that batch is the first provider's
    to read, and its paid answers are kept once a run on that provider collects it. Found by attack: a run of
    the other provider looked for it with its own client, took the 404 for a simulator that is gone, and gave its
    rows back: 6 paid answers were lost and paid again."""
    models = {"openai": {"model": GPT, "client": oa}, "anthropic": {"client": client}}
    second = "anthropic" if first == "openai" else "openai"
    ask = functools.partial(apply_llm, frame(6), "s", prompt=PROMPT, store=store, table="t", progress=False)
    sim.configure(batch_delay=0.5)
    ask(mode="batch", wait=False, **models[first])
    time.sleep(0.7)  # the batch has ended, its answers billed
    out = ask(**models[second])
    assert out["s_status"].to_list() == ["SUBMITTED"] * 6, "left in the batch that answers them"
    report = llmledger.last_report()
    assert report is not None and any("collects it" in n for n in report.notes)
    assert sql(store, "SELECT state FROM llmledger_batches") == [("submitted",)]
    out = ask(**models[first])
    assert out["s_status"].to_list() == ["DONE"] * 6
    assert sim.stats()["batch_paid"] == 6 and sim.stats()["paid"] == 6, "each answer paid once, and kept"


@pytest.mark.parametrize("first", ["responses", "chat"])
def test_a_batch_sent_through_one_openai_api_is_read_after_the_step_moves_to_the_other(
    oa: Any, sim: Simulator, store: Path, first: str
) -> None:
    """A step sent in a batch with Responses lines, then run with `api="chat"` (or the other way) while the batch
    runs: the batch's answers are read as what they are, kept, and paid once. Found by attack: the collector read
    every batch with the step's current API, so a Responses answer read as a chat completion was lost."""
    second = "chat" if first == "responses" else "responses"
    ask = functools.partial(apply_llm, frame(6), "s", prompt=PROMPT, model=GPT, client=oa, store=store, table="t",
                            progress=False)  # fmt: skip
    sim.configure(batch_delay=0.5)
    ask(mode="batch", wait=False, api=first)
    time.sleep(0.7)  # the batch has ended, its answers billed
    out = ask(api=second, mode="batch")
    batch_paid = sim.stats()["batch_paid"]
    assert batch_paid == 6, "the ended batch's answers were read, not lost and sent again"
    assert sql(store, "SELECT state FROM llmledger_batches") == [("merged",)]
    assert out["s_status"].to_list() == ["DONE"] * 6 and out["s_stale"].all(), "kept, and reported stale, not paid"
    own = [f"Summary: hello message number {i}" for i in range(6)]
    assert out["s"].to_list() == own, "each row shows its own answer"
    assert sim.stats()["paid"] == 6 and not sim.log(), "nothing paid online, nothing twice"
