"""Several rows in one request (`rows_per_request=`), each answer its own: packed rows get exactly the answers they
would get alone, are paid once, add up to what their requests cost, and a pack the model gets wrong (an entry
dropped, given twice, ids swapped, an answer out of shape) fails only those rows, which are asked again alone.

The simulator answers each packed item as its request alone would be answered, so "the row's own answer" is the
answer an unpacked step gets for the same row: the check that no row holds another row's answer."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report
from llmledger.simulator import default_reply

from .conftest import frame, helper_cmd, subprocess_env

PROMPT = "Is this SMS spam or ham? Answer spam or ham.\n\n{text}"
openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")


def rows_of(store: Any, query: str) -> list[tuple[Any, ...]]:
    return llmledger.sql(store, query).rows()


def alone_and_packed(ask: Any, rows: pl.DataFrame, size: int, **options: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The same rows answered one to a request (step `alone`) and `size` to a request (step `packed`)."""
    alone = ask(rows, "alone", prompt=PROMPT, **options)
    packed = ask(rows, "packed", prompt=PROMPT, rows_per_request=size, **options)
    return alone, packed


def check_books(store: Any, table: str, step: str) -> None:
    """The step's rows add up to what its packs used and cost; every packed answer names a recorded pack."""
    ((rows_cost, rows_in, rows_out, missing),) = rows_of(
        store,
        f"SELECT sum({step}_cost_usd), sum({step}_input_tokens), sum({step}_output_tokens), "
        f"count(*) FILTER (WHERE {step}_pack IS NOT NULL AND {step}_pack NOT IN "
        f"(SELECT pack_id FROM llmledger_packs)) FROM {table}",
    )
    ((packs_cost, packs_in, packs_out),) = rows_of(
        store,
        f"SELECT sum(cost_usd), sum(input_tokens), sum(output_tokens) FROM llmledger_packs WHERE step = '{step}'",
    )
    assert (rows_in, rows_out) == (packs_in, packs_out), "every token of every pack is on exactly one row"
    assert rows_cost == pytest.approx(packs_cost)
    assert missing == 0


@pytest.mark.parametrize("target", ["duckdb", "postgresql"], indirect=True)
def test_packed_rows_get_their_own_answers_paid_once_on_both_engines(
    client: anthropic.AsyncAnthropic, sim: Simulator, target: Any, sms: pl.DataFrame
) -> None:
    rows = sms.head(97).rename({"label": "truth"})
    ask = functools.partial(apply_llm, client=client, store=target, table="sms", progress=False)
    alone, packed = alone_and_packed(ask, rows, 20)
    assert packed["packed_status"].to_list() == ["DONE"] * 97
    assert packed["packed"].to_list() == alone["alone"].to_list(), "each row's answer is its own request's"
    report = last_report()
    assert report is not None and report.calls == len(set(rows["text"])) // 20 + 1 == 5, "5 requests for 97 rows"
    check_books(target, "sms", "packed")
    ((packs, carried, kept),) = rows_of(target, "SELECT count(*), sum(rows), sum(kept) FROM llmledger_packs")
    assert packs == 5 and carried == kept == len(set(rows["text"])), "identical texts share one item"
    request, answer, keys = rows_of(target, "SELECT request, answer, row_keys FROM llmledger_packs LIMIT 1")[0]
    assert (
        len(json.loads(answer)["answers"]) == len(json.loads(keys)) == json.loads(request)["max_tokens"] // (1024 + 48)
    )
    sim.reset_stats()
    again = ask(rows, "packed", prompt=PROMPT, rows_per_request=20)
    assert sim.stats()["paid"] == 0 and again["packed"].to_list() == packed["packed"].to_list()


def test_typed_answers_and_the_openai_responses_api(sim: Simulator, store: Path, sms: pl.DataFrame) -> None:
    oa = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")
    rows = sms.head(30).rename({"label": "truth"})
    ask = functools.partial(
        apply_llm, client=oa, store=store, table="sms", progress=False, model="openai:gpt-6.1-terra",
        output={"spam": bool, "reason": str},
    )  # fmt: skip
    alone, packed = alone_and_packed(ask, rows, 8)
    assert packed["packed"].to_list() == alone["alone"].to_list()
    assert sim.stats()["paid"] == 30 + 4
    check_books(store, "sms", "packed")
    bodies = [e["body"] for e in sim.log() if e["status"] == 200 and "answers" in json.dumps(e["body"])]
    assert bodies and all(b["text"]["format"]["strict"] for b in bodies), "Responses' strict json_schema"


@pytest.mark.parametrize("fault", ["pack_drop", "pack_duplicate", "pack_swap", "pack_invalid"])
def test_a_pack_gotten_wrong_fails_only_those_rows_which_are_asked_alone(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path, sms: pl.DataFrame, fault: str
) -> None:
    rows = sms.head(60).rename({"label": "truth"})
    ask = functools.partial(apply_llm, client=client, store=store, table="sms", progress=False)
    alone = ask(rows, "alone", prompt=PROMPT)
    sim.configure(**{fault: 1.0})
    sim.reset_stats()
    packed = ask(rows, "packed", prompt=PROMPT, rows_per_request=10)
    assert packed["packed"].to_list() == alone["alone"].to_list(), "no row holds another row's answer"
    assert packed["packed_status"].to_list() == ["DONE"] * 60
    problems = [json.loads(p) for (p,) in rows_of(store, "SELECT problems FROM llmledger_packs WHERE rows > 1")]
    expected = {"pack_drop": "missing", "pack_duplicate": "came back 2 times", "pack_swap": "misaligned",
                "pack_invalid": "should be text"}[fault]  # fmt: skip
    assert all(p and any(expected in why for why in p.values()) for p in problems), problems
    retried = sum(len(p) for p in problems)
    assert sim.stats()["paid"] == 6 + retried, "each pack, and each failed row once more, alone"
    check_books(store, "sms", "packed")


def test_changing_the_pack_size_makes_rows_stale_and_an_unpacked_answer_is_never_reused(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path
) -> None:
    ask = functools.partial(apply_llm, client=client, store=store, table="t", progress=False)
    ask(frame(12), "s", prompt="Summarize: {text}")
    sim.reset_stats()
    with pytest.warns(llmledger.StaleAnswersWarning):
        out = ask(frame(12), "s", prompt="Summarize: {text}", rows_per_request=4)
    assert sim.stats()["paid"] == 0 and out["s_stale"].all(), "reported, not paid"
    out = ask(frame(12), "s", prompt="Summarize: {text}", rows_per_request=4, redo="stale")
    assert sim.stats()["paid"] == 3 and not out["s_stale"].any()
    assert rows_of(store, "SELECT count(DISTINCT s_pack) FROM t") == [(3,)]
    sim.reset_stats()
    with pytest.warns(llmledger.StaleAnswersWarning):
        ask(frame(12), "s", prompt="Summarize: {text}", rows_per_request=6)
    assert sim.stats()["paid"] == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rows_per_request": 0}, "whole number from 1"),
        ({"rows_per_request": 101}, "whole number from 1"),
        ({"rows_per_request": True}, "whole number from 1"),
        ({"rows_per_request": "5"}, "whole number from 1"),
        ({"rows_per_request": 5, "attach": "text"}, "attach="),
        (  # an attack: a pack put its own JSON shape there, dropping the user's silently
            {
                "rows_per_request": 3,
                "request_options": {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
            },
            "output= instead",
        ),
    ],
)
def test_a_bad_pack_size_is_refused_and_writes_nothing(
    client: anthropic.AsyncAnthropic, store: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        apply_llm(frame(3), "s", prompt="Summarize: {text}", client=client, store=store, progress=False, **options)
    assert not store.exists()


def test_packs_go_along_with_copy_export_and_restore(
    client: anthropic.AsyncAnthropic, store: Path, tmp_path: Path
) -> None:
    apply_llm(frame(9), "s", prompt="Summarize: {text}", client=client, store=store, table="t", progress=False,
              rows_per_request=4)  # fmt: skip
    packs = rows_of(store, "SELECT pack_id, request, answer FROM llmledger_packs ORDER BY pack_id")
    assert len(packs) == 3
    llmledger.copy(store, tmp_path / "copy.duckdb")
    restored = tmp_path / "restored.duckdb"
    llmledger.restore(llmledger.export(store, "t", tmp_path / "archive"), restored)
    for other in (tmp_path / "copy.duckdb", restored):
        assert rows_of(other, "SELECT pack_id, request, answer FROM llmledger_packs ORDER BY pack_id") == packs
        assert rows_of(other, "SELECT count(*) FROM t WHERE s_pack IN (SELECT pack_id FROM llmledger_packs)") == [(9,)]


@pytest.mark.slow
def test_kill_9_mid_pack_repays_at_most_the_packs_in_flight(store: Path) -> None:
    """Answers of packs that arrived are journaled with their pack's record and merged by the next run; only the
    packs in flight at the kill are paid again, and every answer still names a recorded pack."""
    rows, size, concurrency = 600, 10, 4
    with Simulator(latency=0.1) as sim:
        args = ["--concurrency", str(concurrency), "--rows-per-request", str(size), "--commit-every", "0.3"]
        proc = subprocess.Popen(
            helper_cmd(str(store), str(rows), *args),
            env=subprocess_env(sim.base_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while sum(sim.paid_prompts().values()) < 150:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        out = apply_llm(frame(rows), "summary", prompt="Summarize: {text}", store=store, table="messages",
                        client=client, progress=False, rows_per_request=size)  # fmt: skip
        assert out["summary_status"].to_list() == ["DONE"] * rows
        alone = apply_llm(frame(rows), "alone", prompt="Summarize: {text}", store=store, table="messages",
                          client=client, progress=False)  # fmt: skip
        assert out["summary"].to_list() == alone["alone"].to_list()
        repaid = sum(n - 1 for n in sim.paid_prompts().values() if n > 1) - rows  # less the `alone` step's
        assert 0 <= repaid <= concurrency * size, repaid
    (missing,) = rows_of(store, "SELECT count(*) FROM messages WHERE summary_pack NOT IN "
                                "(SELECT pack_id FROM llmledger_packs)")[0]  # fmt: skip
    assert missing == 0 and not list(store.parent.glob("*.journal/*.jsonl"))


def test_a_stop_while_a_row_is_asked_again_keeps_what_its_pack_answered(store: Path) -> None:
    """Ctrl-C while a pack's dropped row waits to be asked again alone (its request got a 529 with a long
    retry-after): the pack's other answers are paid for, so they are committed, and the row's share of the pack is
    counted. A stop that cancelled the re-ask once took the whole pack's answers back: the explorer saw the next run
    pay for them all again."""
    first = threading.Event()

    def slow_the_reask_then_interrupt() -> None:
        sim.configure(fail_next=[{"status": 529, "retry_after": 30}])
        time.sleep(0.8)
        os.kill(os.getpid(), signal.SIGINT)

    def answer_then_interrupt(prompt: str, system: str | None = None) -> str:
        if not first.is_set():  # the pack: its re-ask will wait 30 s; Ctrl-C comes in the meantime
            first.set()
            threading.Thread(target=slow_the_reask_then_interrupt).start()
        return default_reply(prompt, system)

    ask = functools.partial(apply_llm, frame(5), "s", prompt="Summarize: {text}", store=store, table="t",
                            progress=False, rows_per_request=5, concurrency=1)  # fmt: skip
    with Simulator(responder=answer_then_interrupt, pack_drop=1.0, seed=1) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        with pytest.raises(KeyboardInterrupt):
            ask(client=client)
        statuses = rows_of(store, "SELECT s_status, count(*) FROM t GROUP BY 1 ORDER BY 1")
        assert statuses == [("DONE", 4), ("NOT_STARTED", 1)]
        ((pack_cost, kept),) = rows_of(store, "SELECT cost_usd, kept FROM llmledger_packs")
        ((rows_cost,),) = rows_of(store, "SELECT sum(s_cost_usd) FROM t")
        ((run_cost,),) = rows_of(store, "SELECT cost_usd FROM llmledger_runs")
        assert kept == 4 and rows_cost < pack_cost == pytest.approx(run_cost), "the dropped row's share is counted"
        sim.configure(pack_drop=0.0, fail_next=[])
        out = ask(client=client)
    assert out["s_status"].to_list() == ["DONE"] * 5
    assert sorted(sim.paid_prompts().values()) == [1, 1, 1, 1, 2], "only the dropped row is asked again"


def test_kill_9_while_a_row_is_asked_again_keeps_what_its_pack_answered(store: Path) -> None:
    """kill -9 while a pack's dropped row waits for its own request: the pack's other answers were committed (or
    journaled) the moment the pack was read, so the next run pays for none of them again. An attack found them held
    in memory until every re-ask of the pack was done, and all ten rows paid again."""
    with Simulator(latency=0.05, pack_drop=1.0, seed=5) as sim:
        proc = subprocess.Popen(
            helper_cmd(str(store), "10", "--concurrency", "1", "--rows-per-request", "10", "--commit-every", "0.2"),
            env=subprocess_env(sim.base_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while sim.stats()["paid"] < 1:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.005)
        sim.configure(latency=30.0)  # the dropped row's own request hangs: its answer comes in 30 s, after the kill
        deadline = time.monotonic() + 10
        while (
            not store.exists()
            or rows_of(store, "SELECT count(*) FROM messages WHERE summary_status = 'DONE'")[0][0] < 9
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "the pack's 9 answers were not committed"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        sim.configure(latency=0.0, pack_drop=0.0)
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k", max_retries=0)
        out = apply_llm(frame(10), "summary", prompt="Summarize: {text}", store=store, table="messages",
                        client=client, progress=False, rows_per_request=10)  # fmt: skip
        assert out["summary_status"].to_list() == ["DONE"] * 10
        assert sorted(sim.paid_prompts().values()) == [1] * 9 + [2], "only the dropped row is paid again"


def test_two_workers_on_postgresql_pack_what_they_claim(
    client: anthropic.AsyncAnthropic, sim: Simulator, pg_url: str
) -> None:
    """A packed step's size is in its stored request: workers (and resume) pack as the call that made it did."""
    rows = frame(80)
    apply_llm(rows, "s", prompt="Summarize: {text}", client=client, store=pg_url, table="t", progress=False,
              rows_per_request=8, where="false")  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda _: llmledger.work(pg_url, "t", "s", client=client, progress=False,
                                                         concurrency=2), range(2)))  # fmt: skip
    assert sum(r.done for r in reports) == 80 and sim.stats()["paid"] <= 80 // 8 + 4
    assert rows_of(pg_url, "SELECT count(*) FROM t WHERE s_status = 'DONE' AND s_pack IS NOT NULL") == [(80,)]
    check_books(pg_url, "t", "s")


def test_the_estimate_counts_packs_and_what_packing_saves(client: anthropic.AsyncAnthropic, store: Path) -> None:
    long_system = "You label SMS messages for an abuse team; spam is unsolicited and commercial. " * 12
    common = dict(prompt="{text}", system=long_system, store=store, table="t", cache=False, client=client)
    alone = llmledger.estimate(frame(60), "s", **common)
    packed = llmledger.estimate(frame(60), "s", rows_per_request=20, **common)
    assert (alone["calls"][0], packed["calls"][0]) == (60, 3)
    assert packed["input_tokens"][0] < 0.3 * alone["input_tokens"][0], "the system prompt is said once a pack"
    apply_llm(frame(60), "s", rows_per_request=20, progress=False, **common)
    ((paid_in,),) = rows_of(store, "SELECT sum(input_tokens)::BIGINT FROM llmledger_packs")
    assert abs(packed["input_tokens"][0] - paid_in) < 0.25 * paid_in, (packed["input_tokens"][0], paid_in)


def test_a_budget_stops_before_a_pack_would_pass_it(client: anthropic.AsyncAnthropic, store: Path) -> None:
    llmledger.set_price("claude-budget-test", input=1000.0, output=1000.0)  # about five cents a packed row
    with pytest.warns(llmledger.BudgetReachedWarning):
        out = apply_llm(frame(100), "s", prompt="Summarize: {text}", client=client, store=store, table="t",
                        progress=False, model="claude-budget-test", rows_per_request=10, max_cost_usd=2.0,
                        concurrency=2)  # fmt: skip
    ((spent, packs),) = rows_of(store, "SELECT sum(s_cost_usd), count(DISTINCT s_pack) FROM t")
    assert 2 <= packs < 10 and 2.0 - 2 * spent / packs < spent <= 2.0, "stops within a pack or two of the budget"
    assert out["s_status"].value_counts().sort("s_status").rows() == [("NOT_STARTED", 100 - 10 * packs),
                                                                       ("DONE", 10 * packs)]  # fmt: skip


@pytest.mark.parametrize("fault", ["pack_drop", "pack_invalid"])
def test_a_budget_holds_when_every_pack_fails_a_row(client: anthropic.AsyncAnthropic, sim: Simulator, store: Path,
                                                     fault: str) -> None:  # fmt: skip
    """Every pack fails a row or two, each asked again alone at a fraction of a pack's cost: the budget reckons the
    next request at the average pack, not at the average of all requests, which those cheap ones pulled down so
    that twice as many packs went into flight as the budget had room for (an attack: 1.6-2.1 times the budget)."""
    sim.configure(**{fault: 1.0})
    texts = [
        f"row{i} {w} this product is {'great' if i % 3 else 'bad'}" for i, w in enumerate(["apple", "river"] * 150)
    ]
    with pytest.warns(llmledger.BudgetReachedWarning):
        apply_llm(pl.DataFrame({"id": range(300), "text": texts}), "s", prompt="Label: {text}", store=store, table="t",
                  client=client, progress=False, rows_per_request=10, max_cost_usd=0.002, concurrency=16,
                  budget_scope="step")  # fmt: skip
    ((paid, dearest),) = rows_of(store, "SELECT sum(cost_usd), max(cost_usd) FROM llmledger_packs")
    assert paid <= 0.002 + dearest, f"${paid:.5f} paid under a $0.002 budget (a pack costs up to ${dearest:.5f})"


def test_a_refused_pack_is_asked_again_row_by_row_and_identical_rows_pay_apart_without_dedupe(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path
) -> None:
    """The model refuses a pack for one row in it: every row is asked alone, the refused one fails with what it
    cost, the others are answered; every token of the refused pack lands on a row. With dedupe off, two identical
    rows in one pack each pay their own share."""
    rows = frame(8).with_columns(pl.when(pl.col("id") == 3).then(pl.lit("forbidden topic")).otherwise("text")
                                 .alias("text"))  # fmt: skip
    rows = pl.concat([rows, rows.head(2).with_columns(pl.col("id") + 100)])
    sim.configure(refuse="forbidden topic")
    out = apply_llm(rows, "s", prompt="Summarize: {text}", client=client, store=store, table="t", progress=False,
                    rows_per_request=10, dedupe=False)  # fmt: skip
    statuses = dict(zip(out["id"], out["s_status"], strict=True))
    assert statuses.pop(3) == "FAILED" and set(statuses.values()) == {"DONE"}
    assert rows_of(store, "SELECT s_cost_usd > 0 FROM t WHERE id = 3") == [(True,)]
    check_books(store, "t", "s")
    assert sim.stats()["paid"] == 1 + 10, "the pack, then each row alone"


def test_few_shot_examples_are_shown_as_a_pack_and_the_rows_keep_their_own_answers(
    client: anthropic.AsyncAnthropic, sim: Simulator, store: Path, sms: pl.DataFrame
) -> None:
    examples = [
        {"role": "user", "content": PROMPT.format(text="WINNER! Claim your prize, call 0800 now")},
        {"role": "assistant", "content": "spam"},
        {"role": "user", "content": PROMPT.format(text="Running late, see you at 6")},
        {"role": "assistant", "content": "ham"},
    ]
    rows = sms.head(24).rename({"label": "truth"})
    ask = functools.partial(apply_llm, client=client, store=store, table="sms", progress=False,
                            messages=[*examples, {"role": "user", "content": PROMPT}])  # fmt: skip
    alone = ask(rows, "alone")
    packed = ask(rows, "packed", rows_per_request=8)
    assert packed["packed"].to_list() == alone["alone"].to_list()
    packs = [e["body"] for e in sim.log() if e["status"] == 200 and "answers" in json.dumps(e["body"])]
    assert packs and all(
        json.loads(b["messages"][1]["content"])["answers"][0] == {"id": "ex1", "start": "WINNER! Claim your prize, "
                                                                  "call 0800", "answer": "spam"} for b in packs
    )  # fmt: skip
    check_books(store, "sms", "packed")
