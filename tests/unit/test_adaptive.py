"""How many requests go at once to a server that announces no limits (`_exec/adaptive.py`), as arithmetic on the
outcomes it is handed: it grows while answers come back as fast as ever, shrinks when they queue or the server
says it is full, never leaves [1, concurrency], and cuts once per round trip, not once per answer of that trip."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from llmledger._exec.adaptive import RECENT, START, AdaptiveLimit
from llmledger._exec.pacing import Pacer

from . import UNIT


def test_it_starts_small_and_doubles_each_round_trip_while_answers_stay_quick() -> None:
    limit = AdaptiveLimit(64)
    assert limit.limit == START
    for n in range(20):
        limit.adjust(0.1, congested=False, now=n * 0.1)
    assert limit.limit == START + 20 and limit.slow_start


def test_it_stops_at_the_ceiling() -> None:
    limit = AdaptiveLimit(5)
    for n in range(50):
        limit.adjust(0.1, congested=False, now=n * 0.1)
    assert limit.limit == 5


def test_a_full_server_halves_it_once_per_round_trip_and_ends_the_quick_growth() -> None:
    limit = AdaptiveLimit(64)
    for n in range(RECENT):
        limit.adjust(1.0, congested=False, now=float(n))
    before = limit.limit
    limit.adjust(None, congested=True, now=100.0)
    assert limit.limit == before / 2 and not limit.slow_start
    limit.adjust(None, congested=True, now=100.5)  # the same round trip (answers take 1 s): no second cut
    assert limit.limit == before / 2 and limit.cuts == 1
    limit.adjust(None, congested=True, now=102.0)
    assert limit.limit == before / 4


def test_answers_that_queue_shrink_it_and_quick_ones_grow_it_slowly_after() -> None:
    limit = AdaptiveLimit(64)
    for n in range(RECENT):
        limit.adjust(0.1, congested=False, now=n * 0.1)
    grown = limit.limit
    for n in range(RECENT):  # the server now queues: answers take three times as long
        limit.adjust(0.3, congested=False, now=10 + n)
    assert limit.limit < grown and not limit.slow_start
    for n in range(RECENT):  # quick again: the queue has drained
        limit.adjust(0.1, congested=False, now=30 + n)
    drained = limit.limit
    for n in range(RECENT):
        limit.adjust(0.1, congested=False, now=50 + n)
    assert drained < limit.limit < drained + 2  # about one per round trip now, not one per answer


def test_one_quick_answer_does_not_make_every_other_look_queued() -> None:
    limit = AdaptiveLimit(64)
    for n in range(3 * RECENT):
        limit.adjust(0.01 if n == RECENT else 0.1, congested=False, now=n * 0.1)
    assert limit.cuts == 0


@UNIT
@given(
    ceiling=st.integers(1, 100),
    outcomes=st.lists(st.tuples(st.none() | st.floats(0.001, 30.0), st.booleans()), max_size=300),
)
def test_the_limit_stays_between_one_and_the_ceiling(ceiling: int, outcomes: list[tuple[float | None, bool]]) -> None:
    limit = AdaptiveLimit(ceiling)
    for n, (latency, congested) in enumerate(outcomes):
        limit.adjust(latency, congested=congested, now=n * 0.05)
        assert 1.0 <= limit.limit <= ceiling


def test_requests_wait_for_a_slot_and_a_cancelled_one_gives_its_back() -> None:
    async def scenario() -> tuple[int, int]:
        pacer = Pacer(AdaptiveLimit(8))
        assert pacer.limit is not None
        peak = 0

        async def request(seconds: float) -> None:
            nonlocal peak
            async with pacer.in_flight():
                peak = max(peak, pacer.limit.active)  # type: ignore[union-attr]
                await asyncio.sleep(seconds)

        stuck = asyncio.create_task(request(60.0))
        await asyncio.sleep(0.01)
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        await asyncio.gather(*(request(0.001) for _ in range(20)))
        return peak, pacer.limit.active

    peak, active = asyncio.run(scenario())
    assert peak <= 8 and active == 0


def test_a_quick_servers_answers_delayed_by_the_client_alone_are_no_queue() -> None:
    """Next to a server answering in 20 ms, the client's own delays (a commit on its event loop) double latencies;
    that is no queue (it held such runs at two requests at once), while 20 ms growing to 200 ms is one."""
    limit = AdaptiveLimit(64)
    for n in range(RECENT):
        limit.adjust(0.02, congested=False, now=n * 0.02)
    grown = limit.limit
    for n in range(RECENT):
        limit.adjust(0.06, congested=False, now=1 + n * 0.06)
    assert limit.limit > grown and limit.cuts == 0
    for n in range(RECENT):
        limit.adjust(0.2, congested=False, now=2 + n * 0.2)
    assert limit.cuts >= 1
