"""Batches with a deadline (`mode="batch", deadline=...`): rows go in batches at the batch price; at the last moment
that leaves time to answer the rest online, the batches still processing are cancelled, what they finished is
kept, and their other rows are sent online, so the run ends in time and no row is paid twice."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, last_report
from llmledger._ledger import open_ledger
from llmledger._ledger.budget import ONLINE_SAMPLE
from llmledger._run.drive import online_from

from .conftest import frame

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")


def books(store: Path) -> tuple[int, int]:
    """(rows answered in a batch, rows answered online) of step s."""
    ((batched, online),) = llmledger.sql(
        store,
        "SELECT count(*) FILTER (WHERE s_batch_id IS NOT NULL), count(*) FILTER (WHERE s_batch_id IS NULL) FROM t "
        "WHERE s_status = 'DONE'",
    ).rows()
    return batched, online


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_rows_a_batch_has_not_answered_by_the_deadline_go_online_in_time_paid_once(
    sim: Simulator, client: anthropic.AsyncAnthropic, store: Path, provider: str
) -> None:
    # A batch answers its requests in order over 11 s. Its last moment is the deadline less 5.5 s (20 rows online,
    # 16 at once): 6.5 s after the start, so a batch sent within about 6 s has answered rows by then (with 2.5 s, a
    # loaded CI run had sent its batch too late for any).
    sim.configure(batch_delay=11.0)
    chosen: dict[str, Any] = {"client": client}
    if provider == "openai":
        chosen = {"client": openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="k"),
                  "model": "openai:gpt-6.1-terra"}  # fmt: skip
    started = time.monotonic()
    out = apply_llm(frame(20), "s", prompt="Summarize: {text}", store=store, table="t", progress=False,
                    mode="batch", deadline=12.0, concurrency=16, **chosen)  # fmt: skip
    assert time.monotonic() - started < 12.0 and out["s_status"].to_list() == ["DONE"] * 20
    batched, online = books(store)
    assert batched > 0 and online > 0 and batched + online == 20, (batched, online)
    assert set(sim.paid_prompts().values()) == {1}, "no row paid twice"
    report = last_report()
    assert report is not None and report.online_for_deadline == online
    assert report.batch_saved_usd > 0 and any("The deadline sent" in h for h in report.hints())
    ((batch_cost, online_cost),) = llmledger.sql(
        store,
        "SELECT avg(s_cost_usd) FILTER (WHERE s_batch_id IS NOT NULL), avg(s_cost_usd) FILTER (WHERE s_batch_id "
        "IS NULL) FROM t",
    ).rows()
    assert batch_cost == pytest.approx(online_cost / 2, rel=0.2), "batch rows at the batch price, the rest online"


def test_a_deadline_too_near_for_a_batch_sends_every_row_online(
    sim: Simulator, client: anthropic.AsyncAnthropic, store: Path
) -> None:
    ask = functools.partial(apply_llm, prompt="Summarize: {text}", store=store, table="t", progress=False,
                            client=client, mode="batch", concurrency=4)  # fmt: skip
    ask(frame(40), "s", deadline=3.0)  # 40 rows online take about 40 x 2 s / 4 = 20 s, by the reckoning
    assert sim.stats()["batches"] == 0 and books(store) == (0, 40)


def test_the_time_left_for_online_rows_is_reckoned_from_the_steps_own_answers(
    client: anthropic.AsyncAnthropic, store: Path
) -> None:
    """A step that has answered online before (a sample, say) reckons its rows' online time from those answers (half
    as long again as their average), not two seconds a request: its batches are left longer, so more rows get the
    batch price. (Judged on the reckoning itself: how many rows a batch answers by then depends on the machine.)"""
    ask = functools.partial(apply_llm, prompt="Summarize: {text}", store=store, table="t", progress=False,
                            client=client)  # fmt: skip
    ledger = open_ledger(store)
    ask(frame(ONLINE_SAMPLE - 1), "s")
    assert ledger.online_seconds("t", "s") is None, "too few answers to stand for the step's"
    ask(frame(ONLINE_SAMPLE - 1, start=100), "s")
    ((mean,),) = llmledger.sql(store, "SELECT avg(s_latency_ms) / 1000 FROM t").rows()
    assert ledger.online_seconds("t", "s") == pytest.approx(mean)
    deadline = time.time() + 1_000  # a fifth of the time (200 s) is the least left for going online
    default = online_from(deadline, 5_000, 16)  # 3 s to switch + 5,000 x 2 s / 16 = 628 s before it
    assert deadline - default == pytest.approx(3 + 5_000 * 2 / 16, rel=1e-3)
    measured = online_from(deadline, 5_000, 16, seconds=mean)
    assert deadline - measured == pytest.approx(max(3 + 5_000 * max(mean * 1.5, 0.2) / 16, 200), rel=1e-2)
    assert measured > default, "a step whose answers come quicker than 1.3 s leaves its batches longer"


@pytest.mark.parametrize("later", ["waits", "comes_late", "comes_late_in_batch_mode"])
def test_a_deadline_sent_with_batches_is_kept_by_a_later_call(
    sim: Simulator, client: anthropic.AsyncAnthropic, store: Path, later: str
) -> None:
    """wait=False: the deadline is stored with the batches, and the call that collects them keeps it: one that
    waits cancels them at their last moment, one that comes after it cancels them at once; either way the rows
    they had not answered go online in time, and none is paid twice."""
    # The batch's last moment is the deadline less 5.5 s (20 rows online, 16 at once): 6.5 s after the start,
    # room for a loaded machine to send the batch first (with 2.5 s, a CI run sent the rows online at once).
    # A call that comes late finds the batch still processing however slow the machine (30 s; the 11 s of a waiting
    # call's batch had ended by itself when a loaded CI run came back after 7 s, and nothing went online).
    sim.configure(batch_delay=11.0 if later == "waits" else 30.0)
    started = time.monotonic()
    apply_llm(frame(20), "s", prompt="Summarize: {text}", store=store, table="t", progress=False, client=client,
              mode="batch", deadline=12.0, wait=False, concurrency=16)  # fmt: skip
    ((stored,),) = llmledger.sql(store, "SELECT count(*) FROM llmledger_batches WHERE deadline IS NOT NULL").rows()
    assert stored == 1 and books(store) == (0, 0)
    if later == "waits":  # a call with no deadline of its own, that waits for the batch
        apply_llm(frame(20), "s", prompt="Summarize: {text}", store=store, table="t", progress=False, client=client,
                  mode="batch")  # fmt: skip
    else:  # past the batch's last moment (12 s less 5.5 s)
        time.sleep(7.0)
        if later == "comes_late":
            llmledger.resume(store, "t", "s", client=client, progress=False)
        else:  # the rows it takes out of the batch go online, never in a new batch
            apply_llm(frame(20), "s", prompt="Summarize: {text}", store=store, table="t", progress=False,
                      client=client, mode="batch")  # fmt: skip
            assert sim.stats()["batches"] == 1
    if later == "waits":  # in time, give or take a loaded machine's slower online calls (a CI run took 12.8 s);
        # a call that waited for the batch's own end instead (11 s) would have no rows online: checked below
        assert time.monotonic() - started < 12.0 + 3.0
    # else it came after the batch's last moment, so in time is not promised; that it cancelled the batch at once,
    # not waited for its 30 s, shows in the rows that went online (a batch that ends by itself answers them all)
    batched, online = books(store)
    assert batched > 0 and online > 0 and batched + online == 20, (batched, online)
    assert set(sim.paid_prompts().values()) == {1}, "no row paid twice"
    report = last_report()
    assert report is not None and report.online_for_deadline == online


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "auto", "deadline": 60.0}, "works with mode='batch'"),
        ({"mode": "online", "deadline": 60.0}, "works with mode='batch'"),
    ],
)
def test_a_deadline_a_mode_cannot_keep_is_refused(
    client: anthropic.AsyncAnthropic, store: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        apply_llm(frame(2), "s", prompt="x {text}", client=client, store=store, progress=False, **options)
    assert not store.exists()


@pytest.mark.parametrize("target", ["duckdb", "postgresql"], indirect=True)
def test_a_later_call_moves_the_stored_deadline_earlier_never_later(
    sim: Simulator, client: anthropic.AsyncAnthropic, target: Any
) -> None:
    """A call with a tighter deadline than the one the step's batches were sent with binds them (it was silently
    ignored); a looser one does not push it back, so a script polling with `deadline=` as a duration reaches it."""
    sim.configure(batch_delay=3600.0)
    ask = functools.partial(apply_llm, frame(6), "s", prompt="Summarize: {text}", store=target, table="t",
                            progress=False, client=client, mode="batch", wait=False)  # fmt: skip

    ask(deadline=3600.0)
    epoch = "CAST(extract(epoch FROM deadline) AS DOUBLE PRECISION)"
    ((first,),) = llmledger.sql(target, f"SELECT {epoch} FROM llmledger_batches").rows()
    ask(deadline=600.0)  # the rows are in the batch already: this call sends nothing
    ask(deadline=7200.0)
    ((batches, moved),) = llmledger.sql(target, f"SELECT count(*), max({epoch}) FROM llmledger_batches").rows()
    assert batches == 1 and sim.stats()["batches"] == 1
    assert first - 3600 == pytest.approx(time.time(), abs=30) and moved == pytest.approx(first - 3000, abs=30)


def test_packed_rows_are_reckoned_by_their_requests_so_a_batch_still_goes(
    sim: Simulator, client: anthropic.AsyncAnthropic, store: Path
) -> None:
    """100 rows, 10 to a request, are 10 requests online, not 100: with a deadline 20 s off and 2 at once, they need
    3 + 10 x 2 / 2 = 13 s, so a batch goes first (reckoned by rows, 103 s, it was judged too near for any batch and
    every row went online at the full price)."""
    sim.configure(batch_delay=60.0)
    words = [f"{a}{b}" for a in "bcdfghjklm" for b in "aeiouyrstn"]  # 100 texts no pack confuses
    df = pl.DataFrame({"id": range(100), "text": [f"{w} is a word" for w in words]})
    started = time.monotonic()
    out = apply_llm(df, "s", prompt="Label: {text}", store=store, table="t", progress=False, client=client,
                    mode="batch", deadline=20.0, rows_per_request=10, concurrency=2)  # fmt: skip
    assert out["s_status"].to_list() == ["DONE"] * 100 and time.monotonic() - started < 20.0
    assert sim.stats()["batches"] == 1, "the packs went in a batch first"
    assert set(sim.paid_prompts().values()) == {1}
