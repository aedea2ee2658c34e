"""What the simulator keeps between requests, as the API does: rate-limit buckets and the prompt cache."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from ._sim_api import ErrorSpec, count_tokens


class PromptCache:
    """The API's prompt cache, as billing sees it: a system prefix marked with `cache_control` and long enough
    for the model is written by the first request (billed as a cache write) and read by later ones within its
    ttl (billed as a cache read), each read renewing the ttl."""

    TTL: ClassVar[dict[str, float]] = {"5m": 300.0, "1h": 3600.0}

    def __init__(self) -> None:
        self.expiry: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()

    def account(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """(tokens written 5m, tokens written 1h, tokens read) for this request's cached prefix."""
        from ._prices import min_cacheable_tokens

        blocks = body.get("system") if isinstance(body.get("system"), list) else []
        marked = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")]
        if not marked:
            return 0, 0, 0
        prefix = "".join(b.get("text", "") for b in blocks[: marked[-1] + 1])
        ttl = blocks[marked[-1]]["cache_control"].get("ttl", "5m")
        tokens = count_tokens(prefix)
        if tokens < min_cacheable_tokens(str(body.get("model"))):
            return 0, 0, 0  # too short to cache: billed as plain input, without an error
        key, now = (str(body.get("model")), prefix), time.time()
        with self.lock:
            hit = self.expiry.get(key, 0.0) > now
            self.expiry[key] = now + self.TTL[ttl]
        if hit:
            return 0, 0, tokens
        return (0, tokens, 0) if ttl == "1h" else (tokens, 0, 0)


class Bucket:
    """A token bucket refilled continuously, as the API's rate limiter is."""

    def __init__(self, rate: float, size: float) -> None:
        self.rate, self.size = rate, size
        self.tokens, self.stamp = size, time.monotonic()

    def take(self, amount: float = 1.0) -> tuple[bool, float]:
        """Take `amount`; return (granted, seconds until that much is available)."""
        self._refill()
        if self.tokens >= amount:
            self.tokens -= amount
            return True, 0.0
        return False, (min(amount, self.size) - self.tokens) / self.rate

    def give_back(self, amount: float) -> None:
        self._refill()
        self.tokens = min(self.size, self.tokens + amount)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.size, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def headers(self, family: str, *, rounded: bool = False) -> dict[str, str]:
        """`anthropic-ratelimit-{family}-{limit,remaining,reset}` as the API sends them."""
        self._refill()
        remaining = max(0, int(self.tokens))
        if rounded:  # the API rounds token counts to the nearest thousand
            remaining = int(round(remaining, -3))
        reset = datetime.now(UTC) + timedelta(seconds=(self.size - self.tokens) / self.rate)
        return {f"anthropic-ratelimit-{family}-limit": str(int(self.rate * 60)),
                f"anthropic-ratelimit-{family}-remaining": str(remaining),
                f"anthropic-ratelimit-{family}-reset": reset.isoformat(timespec="seconds").replace("+00:00", "Z")}


class TokenLimits:
    """Input- and output-token buckets per minute, refilled continuously, as the API enforces them.

    A request needs its input tokens and `max_tokens` output tokens available when it starts; the
    output tokens it did not use are given back when it ends (the API estimates from max_tokens, then
    adjusts to the actual usage).
    """

    def __init__(self, input_per_minute: float | None, output_per_minute: float | None, burst_seconds: float):
        self.input = Bucket(input_per_minute / 60, input_per_minute / 60 * burst_seconds) if input_per_minute \
            else None
        self.output = Bucket(output_per_minute / 60, output_per_minute / 60 * burst_seconds) \
            if output_per_minute else None
        self.lock = threading.Lock()

    def admit(self, tokens_in: int, max_out: int) -> ErrorSpec | None:
        """None when the request may start (its tokens taken), else the 429 the API would send."""
        with self.lock:
            for bucket, amount, family in ((self.input, tokens_in, "input"), (self.output, max_out, "output")):
                if bucket is None:
                    continue
                granted, wait = bucket.take(amount)
                if not granted:
                    if family == "output" and self.input is not None:
                        self.input.give_back(tokens_in)
                    return ErrorSpec(429, "rate_limit_error",
                                     f"This request would exceed the rate limit for your organization of "
                                     f"{int(bucket.rate * 60):,} {family} tokens per minute.", retry_after=wait)
        return None

    def settle(self, max_out: int, used_out: int) -> None:
        if self.output is not None:
            with self.lock:
                self.output.give_back(max(0, max_out - used_out))

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        with self.lock:
            for bucket, family in ((self.input, "input-tokens"), (self.output, "output-tokens")):
                if bucket is not None:
                    out.update(bucket.headers(family, rounded=True))
            binding = min((b for b in (self.input, self.output) if b is not None), key=lambda b: b.tokens / b.size,
                          default=None)
            if binding is not None:
                family = "input-tokens" if binding is self.input else "output-tokens"
                out.update({k.replace(family, "tokens"): v for k, v in binding.headers(family, rounded=True).items()})
        return out
