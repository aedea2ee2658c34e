"""Prompt caching: a long system prompt is sent as a cached prefix, and what the cache saves is accounted."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, last_report
from llmledger._draw import usd

from .conftest import frame, sql

# Long enough for every model's prompt cache (claude-haiku-4-5's minimum is 4,096 tokens; the default model's 1,024);
# the simulator counts about four characters a token.
LONG_SYSTEM = "You label support messages. " + "Example: 'my order is late' -> shipping. " * 420
PROMPT = "Summarize: {text}"


def _control(sim: Simulator) -> list[object]:
    return [
        e["body"]["system"][0].get("cache_control") if isinstance(e["body"].get("system"), list) else None
        for e in sim.log()
    ]


def test_a_long_system_prompt_is_written_once_and_read_after(run, sim: Simulator, store: Path) -> None:
    run(frame(10), "summary", prompt=PROMPT, system=LONG_SYSTEM, concurrency=1)
    assert _control(sim) == [{"type": "ephemeral", "ttl": "5m"}] * 10
    rows = sql(
        store,
        "SELECT summary_cache_write_tokens, summary_cache_read_tokens, summary_input_tokens, "
        "summary_cost_usd FROM messages ORDER BY summary_finished_at",
    )
    prefix = rows[0][0]
    assert prefix >= 4096 and rows[0][1] == 0, "the first request writes the cache"
    assert all(r[0] == 0 and r[1] == prefix for r in rows[1:]), "the others read it"
    assert all(r[2] < 50 for r in rows), "only the row's own text is plain input"
    assert rows[1][3] < rows[0][3] / 5, "a read costs a tenth of the input price, a write 1.25x"
    report = last_report()
    assert report is not None and (report.cache_write_tokens, report.cache_read_tokens) == (prefix, 9 * prefix)
    assert sim.stats()["cache_read_tokens"] == 9 * prefix
    price_row = llmledger.prices().filter(llmledger.prices()["model"] == llmledger.DEFAULT_MODEL).row(0, named=True)
    assert report.avoided_usd == pytest.approx(9 * prefix * (price_row["input"] - price_row["cache_read"]) / 1e6)
    assert f"avoided: cache reads {usd(report.avoided_usd)}" in str(report)

    written = sum(r[3] for r in rows)
    plain = llmledger.prices()  # the same tokens without a cache, at the plain input rate
    price = plain.filter(plain["model"] == llmledger.DEFAULT_MODEL).row(0, named=True)
    uncached = sum((r[0] + r[1] + r[2]) * price["input"] / 1e6 for r in rows)
    assert written < uncached / 3


def test_cache_options_change_the_request_and_so_the_fingerprint(run, sim: Simulator, store: Path) -> None:
    run(frame(3), "summary", prompt=PROMPT, system=LONG_SYSTEM, cache="1h", concurrency=1)
    assert _control(sim) == [{"type": "ephemeral", "ttl": "1h"}] * 3
    first = sql(
        store, "SELECT summary_cache_write_tokens, summary_cost_usd FROM messages ORDER BY summary_finished_at LIMIT 1"
    )[0]
    price = llmledger.prices().filter(llmledger.prices()["model"] == llmledger.DEFAULT_MODEL).row(0, named=True)
    assert first[1] > first[0] * price["cache_write_1h"] / 1e6 * 0.99, "1 h writes are priced at the 1 h rate"

    run(frame(3), "summary", prompt=PROMPT, system=LONG_SYSTEM, cache=False)
    assert last_report().stale == 3 and sim.stats()["paid"] == 3  # type: ignore[union-attr]
    run(frame(3), "summary", prompt=PROMPT, system=LONG_SYSTEM, cache=False, redo="stale")
    assert _control(sim)[-3:] == [None] * 3


def test_a_short_system_prompt_is_sent_as_it_is(run, sim: Simulator) -> None:
    run(frame(2), "summary", prompt=PROMPT, system="Be brief.")
    assert [e["body"]["system"] for e in sim.log()] == ["Be brief."] * 2


def test_a_bad_cache_option_is_refused(run, store: Path) -> None:
    with pytest.raises(InvalidInputError, match="cache must be"):
        run(frame(2), "summary", prompt=PROMPT, cache="10m")
    assert not store.exists()


def test_resume_sends_the_cached_prefix_too(run, sim: Simulator, store: Path, client) -> None:
    sim.configure(fail_next=["enforced_spend_limit_reached"])
    with pytest.raises(llmledger.SpendLimitReached):
        run(frame(4), "summary", prompt=PROMPT, system=LONG_SYSTEM, concurrency=1)
    report = llmledger.resume(store, "messages", "summary", client=client, progress=False, concurrency=1)
    assert report.done == 4
    assert _control(sim)[1:] == [{"type": "ephemeral", "ttl": "5m"}] * 4
