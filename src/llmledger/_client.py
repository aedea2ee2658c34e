"""Calling the Messages API: one request per row, errors sorted by whose fault they are.

We turn the SDK's own retries off (`max_retries=0`) and retry here instead, so
that every 429/529 is seen by the pacer and the circuit breaker, and a row that
keeps failing for the API's reasons never counts against the row.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

import anthropic

DEFAULT_MODEL = "claude-haiku-4-5"

# USD per million tokens (input, output), list prices. Unknown models get no cost.
PRICES: dict[str, tuple[float, float]] = {
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-3-5-haiku": (0.8, 4.0),
}


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float | None:
    for prefix, (pin, pout) in PRICES.items():
        if model.startswith(prefix):
            return (input_tokens * pin + output_tokens * pout) / 1e6
    return None


class Kind(Enum):
    TRANSIENT = "transient"  # the API's fault: retry, never counts against the row
    PERMANENT = "permanent"  # the row's fault: FAILED, counts toward max_attempts
    FATAL = "fatal"  # the caller's fault (credentials): stop the whole run


@dataclass
class Reply:
    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str | None
    model: str


class CallFailed(Exception):
    def __init__(self, kind: Kind, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


def classify(exc: BaseException) -> CallFailed:
    """Map an SDK exception to what the runner should do about it."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        detail = f"{status} {type(exc).__name__}: {exc.api_message or exc.message}"
        if status in (401, 402, 403):
            return CallFailed(Kind.FATAL, detail)
        if status in (408, 409, 429) or status >= 500:
            return CallFailed(Kind.TRANSIENT, detail, _retry_after(exc.response.headers))
        return CallFailed(Kind.PERMANENT, detail)
    if isinstance(exc, anthropic.APIConnectionError):  # includes APITimeoutError
        return CallFailed(Kind.TRANSIENT, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, anthropic.APIResponseValidationError):
        return CallFailed(Kind.PERMANENT, f"invalid response: {exc}")
    return CallFailed(Kind.PERMANENT, f"{type(exc).__name__}: {exc}")


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(value) if name == "retry-after" else None
            if parsed is not None:
                return max(0.0, parsed.timestamp() - time.time())
    return None


class Pacer:
    """Spaces requests to stay under the rate limit the API announces in its headers.

    The API says `anthropic-ratelimit-requests-limit` per minute (and the same
    for tokens); sending at 95 % of that keeps 429s rare while using nearly
    all of the allowance. A `retry-after` pauses every worker, not just one.
    """

    SAFETY = 0.95

    def __init__(self) -> None:
        self.interval = 0.0  # seconds between request starts; 0 = not known yet
        self._next = 0.0
        self._paused_until = 0.0
        self._avg_in = 0.0
        self._avg_out = 0.0

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._next, self._paused_until)
        self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)

    def pause(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._paused_until = max(self._paused_until, loop.time() + seconds)

    def observe(self, headers: Any, reply: Reply | None = None) -> None:
        if reply is not None:
            self._avg_in = 0.9 * self._avg_in + 0.1 * reply.input_tokens if self._avg_in else reply.input_tokens
            self._avg_out = (0.9 * self._avg_out + 0.1 * reply.output_tokens if self._avg_out
                             else reply.output_tokens)
        rates = []
        for family, per_request in (("requests", 1.0), ("input-tokens", self._avg_in),
                                    ("output-tokens", self._avg_out)):
            limit = _number(headers.get(f"anthropic-ratelimit-{family}-limit"))
            if limit and per_request:
                rates.append(limit / 60.0 / per_request)
            remaining = _number(headers.get(f"anthropic-ratelimit-{family}-remaining"))
            reset = headers.get(f"anthropic-ratelimit-{family}-reset")
            if remaining is not None and remaining < 1 and reset:
                wait = _seconds_until(reset)
                if wait:
                    self.pause(min(wait, 60.0))
        if rates:
            self.interval = 1.0 / (min(rates) * self.SAFETY)


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _seconds_until(stamp: str) -> float | None:
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff(attempt: int, *, base: float, cap: float, retry_after: float | None) -> float:
    """Exponential backoff with full jitter; a server's retry-after is a floor."""
    delay = random.uniform(0, min(cap, base * 2**attempt))
    return max(delay, retry_after or 0.0)


async def send(client: anthropic.AsyncAnthropic, pacer: Pacer, *, model: str, prompt: str,
               system: str | None, max_tokens: int, extra: dict[str, Any]) -> Reply:
    """One request. Raises CallFailed with its kind on any failure."""
    await pacer.wait()
    kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens,
                              "messages": [{"role": "user", "content": prompt}], **extra}
    if system is not None:
        kwargs["system"] = system
    try:
        raw = await client.messages.with_raw_response.create(**kwargs)
        message = await raw.parse()
    except anthropic.APIStatusError as exc:
        failure = classify(exc)
        pacer.observe(exc.response.headers)
        if failure.kind is Kind.TRANSIENT and failure.retry_after:
            pacer.pause(failure.retry_after)
        raise failure from exc
    except anthropic.AnthropicError as exc:
        raise classify(exc) from exc
    text = "".join(getattr(block, "text", "") for block in message.content if block.type == "text")
    reply = Reply(text=text, input_tokens=message.usage.input_tokens, output_tokens=message.usage.output_tokens,
                  stop_reason=message.stop_reason, model=message.model or model)
    pacer.observe(raw.headers, reply)
    if message.stop_reason == "refusal":
        raise CallFailed(Kind.PERMANENT, "refusal: the model declined to answer this prompt")
    return reply


def bounded_timeout(timeout: Any, *, max_tokens: int) -> anthropic.Timeout:
    """The client's timeout, bounded so that no request can stall a run for long.

    Waiting for a pooled connection, a connect or a write ends before the API
    has the request, so those are short. The read (the model's answer) is
    bounded by the time to generate `max_tokens` at 10 tokens/s, at least 60 s:
    longer than any healthy answer, and a retry after it is a retry the SDK
    would make after its own 600 s anyway.
    """
    read = timeout.read if isinstance(timeout, anthropic.Timeout) else timeout
    ceiling = max(60.0, max_tokens / 10.0)
    read = ceiling if read is None else min(float(read), ceiling)
    return anthropic.Timeout(read, connect=10.0, write=30.0, pool=10.0)


def default_client(*, timeout: float | None = None) -> anthropic.AsyncAnthropic:
    """The real SDK, configured from the environment (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL)."""
    kwargs: dict[str, Any] = {"max_retries": 0}
    if timeout is not None:
        kwargs["timeout"] = timeout
    return anthropic.AsyncAnthropic(**kwargs)
