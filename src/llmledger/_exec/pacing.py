"""Pacing requests by what the API says about its limits, and backing off when it says no.

The API announces its limits in `anthropic-ratelimit-*` headers (per minute);
requests start at just under the pace of the tightest one — requests per
minute, or input / output tokens per minute divided by the step's average
request — which keeps 429s rare while using nearly all of the allowance.
A `retry-after` (or `retry-after-ms`) pauses every worker, not just the one
that got it. What the buckets hold when the first answer comes back
(`*-remaining`) is spent at once, up to a second of the pace (`Pacer.credit`):
a run need not spend its first seconds spacing requests out under a bucket
that is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import math
import random
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from llmledger._exec.adaptive import AdaptiveLimit

MAX_RETRY_AFTER = 600.0  # seconds: the longest wait a retry-after header can ask of one request


def retry_after(headers: Any) -> float | None:
    """Seconds the API asks us to wait: `retry-after-ms` first (more precise), then `retry-after`.

    A value that is not a number or an HTTP date (a proxy's), or not finite, is ignored; a longer wait than
    `MAX_RETRY_AFTER` is cut to it, so no header can hold a request (and the run) for good.
    """
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if name != "retry-after":
                continue
            try:  # an HTTP date
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (ValueError, TypeError, OverflowError):
                continue
        if math.isfinite(seconds):
            return min(max(0.0, seconds), MAX_RETRY_AFTER)
    return None


def backoff(attempt: int, *, base: float, cap: float, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; a server's retry-after is a floor."""
    delay = random.uniform(0, min(cap, base * 2**attempt))
    return max(delay, retry_after or 0.0)


FIRST_ANSWER_WAIT = 30.0  # seconds the other requests wait for the first one at most
BURST_SECONDS = 1.0  # the most of the pace the first answer's `remaining` lets start at once (`Pacer.credit`)


class Pacer:
    """Spaces request starts to stay under the tightest announced limit; pauses everyone on retry-after."""

    SAFETY = 0.98  # share of the request limit used: requests are counted exactly
    TOKENS = 0.97  # share of a token limit: a request's tokens are estimated from the step's average

    def __init__(self, limit: AdaptiveLimit | None = None) -> None:
        self.limit = limit  # requests in flight, for a server that announces no limits (`adaptive.py`)
        self.interval = 0.0  # seconds between request starts; 0 = not known yet
        self._next = 0.0
        self._paused_until = 0.0
        self._avg_in = 0.0
        self._avg_out = 0.0
        self._answers = 0
        self._first: asyncio.Future[None] | None = None  # done once the first request has ended
        # requests that may start without waiting for their turn: what the buckets held when their limits were
        # first announced, which a token bucket lets go at once (the API's limiter is one, refilled continuously)
        self.credit = 0
        self.binding = ""  # the limit that sets the pace, as a person reads it ("requests: 50/min")

    async def wait(self) -> None:
        """Wait for this request's turn. Until the first answer says what the limits are, one request
        goes alone (a run's first burst of `concurrency` requests could overdraw a token bucket at once)."""
        if self._first is None:
            self._first = asyncio.get_running_loop().create_future()
        elif not self._first.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._first), FIRST_ANSWER_WAIT)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.credit > 0 and now >= self._paused_until:  # out of turn: the paced ones follow from now on
            self.credit -= 1
            self._next = max(self._next, now)
            return
        start = max(now, self._next, self._paused_until)
        self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)

    @contextlib.asynccontextmanager
    async def in_flight(self) -> AsyncIterator[Flight]:
        """One request, from its start to its end: under the adaptive limit when there is one, which learns from
        how long it took and whether the server said it is full (`Flight.congested`)."""
        limit = self.limit  # the limit this request was let in by (it may step aside meanwhile: `observe`)
        if limit is None:
            yield Flight()
            return
        await limit.acquire()
        flight = Flight(time.monotonic())
        try:
            yield flight
        finally:
            limit.release(None if flight.unsent else time.monotonic() - flight.started, congested=flight.congested)

    def pause(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._paused_until = max(self._paused_until, loop.time() + seconds)
        self.credit = 0  # the server said no: what the first answer said the buckets held is gone

    def answered(self) -> None:
        """A request ended (answered, refused or failed): the others need not wait for the first one."""
        if self._first is not None and not self._first.done():
            self._first.set_result(None)

    def observe(self, headers: Any, input_tokens: int = 0, output_tokens: int = 0, *, reserved: int = 0) -> None:
        """Learn the pace from an answer's headers (and its tokens, for the token limits). `reserved`: the output
        tokens the API held for the request while it ran (its max_tokens), which a burst takes from the bucket."""
        if input_tokens or output_tokens:
            # The mean of the answers so far (then a slow moving average): a step's answers vary row by row,
            # and pacing on the last few would swing the rate with them and drain the bucket into 429s.
            self._answers += 1
            weight = max(1.0 / self._answers, 0.01)
            self._avg_in += weight * (input_tokens - self._avg_in)
            self._avg_out += weight * (output_tokens - self._avg_out)
        rates: list[tuple[float, str]] = []
        room: list[float] = []  # requests each bucket holds now
        for family, per_request, safety, (limit_header, remaining_header, reset_header) in self._families(headers):
            limit = _number(headers.get(limit_header))
            if limit and per_request:
                rates.append((limit / 60.0 / per_request * safety, f"{family.replace('-', ' ')}: {limit:,.0f}/min"))
            remaining = _number(headers.get(remaining_header))
            if limit and per_request and remaining is not None:
                room.append(remaining * safety / max(self._held(family, reserved), 1.0))
            reset = headers.get(reset_header)
            need = max(per_request, 1.0)
            if remaining is not None and remaining < need and reset:
                # The bucket refills continuously: wait until one more request's worth is back, not until
                # it is full (`reset`), which for a per-minute token bucket can be most of a minute.
                wait = _seconds_until(reset) or 0.0
                if limit:
                    wait = min(wait, (need - remaining) / (limit / 60.0))
                if wait:
                    self.pause(min(wait, 60.0))
        if rates:
            rate, self.binding = min(rates)
            if not self.interval and len(room) == len(rates):  # the limits' first word: their buckets' room
                self.credit = max(0, min(math.floor(min(room)) - 1, math.floor(rate * BURST_SECONDS)))
            self.interval = 1.0 / rate
            # a server that announces its limits (a gateway forwarding the provider's headers) is paced by them:
            # the requests in flight no longer follow its answers
            if self.limit is not None:
                self.limit.lift()
                self.limit = None

    def _families(self, headers: Any) -> list[tuple[str, float, float, tuple[str, str, str]]]:
        """(limit family, its amount per request, share used, its three headers) in the scheme the API sends:
        Anthropic's `anthropic-ratelimit-{family}-{limit,remaining,reset}` (input and output tokens apart), or
        OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (one token limit, input and output)."""
        if headers.get("x-ratelimit-limit-requests") is not None or headers.get("x-ratelimit-limit-tokens") is not None:
            openai = (("requests", 1.0, self.SAFETY), ("tokens", self._avg_in + self._avg_out, self.TOKENS))
            return [(f, n, share, _names("x-ratelimit-{part}-" + f)) for f, n, share in openai]
        anthropic = (
            ("requests", 1.0, self.SAFETY),
            ("input-tokens", self._avg_in, self.TOKENS),
            ("output-tokens", self._avg_out, self.TOKENS),
        )
        return [(f, n, share, _names(f"anthropic-ratelimit-{f}-" + "{part}")) for f, n, share in anthropic]

    def _held(self, family: str, reserved: int) -> float:
        """What one request takes from a family's bucket while it runs: its input tokens, and its output tokens
        at `reserved` (max_tokens) at least, which the API holds from its start and gives back unused."""
        output = max(self._avg_out, float(reserved))
        held = {"requests": 1.0, "input-tokens": self._avg_in, "output-tokens": output}
        return held.get(family, self._avg_in + output)  # OpenAI's one "tokens" limit: input and output

    def state(self) -> tuple[float, float, float]:
        return self.interval, self._next, self._paused_until


@dataclass
class Flight:
    started: float = 0.0
    congested: bool = False  # the server said it is full (429, 503, 529)
    unsent: bool = False  # the request never reached it


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _names(pattern: str) -> tuple[str, str, str]:
    """The limit, remaining and reset header names of one family, from a pattern with `{part}` in it."""
    limit, remaining, reset = (pattern.format(part=part) for part in ("limit", "remaining", "reset"))
    return limit, remaining, reset


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATIONS = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|h|m|s))+")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds_until(stamp: str) -> float | None:
    """Seconds until a reset: Anthropic's RFC 3339 time, or OpenAI's duration ("6m0s", "1s", "20ms", "1h2m3.5s")."""
    if _DURATIONS.fullmatch(stamp.strip()):
        return sum(float(n) * _UNIT[unit] for n, unit in _DURATION.findall(stamp))
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, when.timestamp() - time.time())
