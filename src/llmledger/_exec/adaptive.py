"""How many requests to keep in flight at a server that announces no limits (`base_url=`: vLLM, Ollama, a proxy).

Anthropic's API says what a run may send in its rate-limit headers, and the pacer (`pacing.py`) keeps to them.
Another server says nothing, yet has a limit: the requests it works on at once (a GPU's batch), beyond which
they wait in its queue, each answer taking longer for no more answers per second, and perhaps a proxy's limit,
beyond which it answers 429. So the run finds that limit from what it sees, as TCP finds a network's:

- it starts with a couple of requests and adds one per answer (doubling each round trip) until the first sign
  of a queue, then one per round trip;
- a queue shows as latency: when the median of the last few answers takes more than `QUEUED` times the
  server's time without a queue (and `SLACK` more, so that the client's own delays next to a very quick server
  are not taken for one), the limit is cut by a fifth, at most once per round trip;
- a 429, 503 or 529 (the server says it is full) halves it, at most once per round trip.

`concurrency=` stays the ceiling. The server's time without a queue is the lowest median of a few answers seen
so far (a median, so one short answer does not make every other look queued), let drift up slowly
(`DRIFT` per answer) so that a run whose answers grow longer is not taken for a queue for good.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

QUEUED = 2.0  # recent latency over the quickest's beyond which the server is queueing: fewer at once
CLEAR = 1.4  # below this, it is not: one more at once
RECENT = 8  # answers whose median is "recent"
# seconds of extra latency too few to call a queue: the client's own delays (its event loop committing a chunk, a
# garbage collection) are that long, and next to a server that answers in 20 ms they would double every latency
SLACK = 0.05
DRIFT = 0.002  # per answer: how fast the server's time without a queue may grow
START = 2  # requests in flight before any answer


class AdaptiveLimit:
    """A semaphore whose size follows the server: `acquire` before a request, `release` after it."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = float(min(START, self.ceiling))
        self.active = 0
        self.slow_start = True  # until the first sign of a queue, grow by one per answer
        self.cuts = 0  # times the limit was cut (a report's figure)
        self._latencies: deque[float] = deque(maxlen=RECENT)
        self.unqueued: float | None = None  # seconds an answer takes without a queue
        self._last_cut = 0.0
        self._waiting: list[asyncio.Future[None]] = []

    async def acquire(self) -> None:
        """Wait until fewer than `limit` requests are in flight, and count this one."""
        while self.active >= int(self.limit):
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await turn
            finally:
                if turn in self._waiting:
                    self._waiting.remove(turn)
        self.active += 1

    def lift(self) -> None:
        """Step aside: every request waiting goes (the server announced its limits, which pace the run now)."""
        self.limit = float(self.ceiling)
        for turn in self._waiting:
            if not turn.done():
                turn.set_result(None)

    def release(self, latency: float | None, *, congested: bool = False) -> None:
        """A request ended after `latency` seconds (None: it never reached the server); `congested`: the server
        said it is full (429, 503, 529). Synchronous, so a cancelled request's slot is always given back."""
        self.active -= 1
        self.adjust(latency, congested=congested, now=time.monotonic())
        for turn in self._waiting[: max(0, int(self.limit) - self.active)]:
            if not turn.done():
                turn.set_result(None)

    def adjust(self, latency: float | None, *, congested: bool, now: float) -> None:
        """The limit after one more request's outcome (pure arithmetic, apart from the clock it is handed)."""
        recent = self._median()
        if congested:
            self._cut(0.5, now, recent or 0.0)
            return
        if latency is None:
            return
        self._latencies.append(latency)
        recent = self._median()
        if recent is None or len(self._latencies) < RECENT:
            self._grow()
            return
        self.unqueued = recent if self.unqueued is None else min(self.unqueued * (1 + DRIFT), recent)
        if recent > QUEUED * self.unqueued and recent - self.unqueued > SLACK:
            self._cut(0.8, now, recent)
        elif recent < CLEAR * self.unqueued or recent - self.unqueued <= SLACK:
            self._grow()

    def _grow(self) -> None:
        step = 1.0 if self.slow_start else 1.0 / max(self.limit, 1.0)
        self.limit = min(float(self.ceiling), self.limit + step)

    def _cut(self, factor: float, now: float, round_trip: float) -> None:
        self.slow_start = False
        if now - self._last_cut < round_trip:  # the answers of one round trip all saw the same queue
            return
        self._last_cut = now
        self.limit = max(1.0, self.limit * factor)
        self.cuts += 1

    def _median(self) -> float | None:
        recent = sorted(self._latencies)
        return recent[len(recent) // 2] if recent else None
