"""What the simulator keeps between requests, as the API does: rate-limit buckets and the prompt cache."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from llmledger.simulator.chat import duration
from llmledger.simulator.faults import ErrorSpec
from llmledger.simulator.media import block_cost, block_key, count_tokens


class PromptCache:
    """The API's prompt cache, as billing sees it. The prompt is read in the API's order (tools, system, then the
    messages' blocks); each block with `cache_control` ends a prefix that, when long enough for the model, the
    first request writes (billed as a cache write) and later ones read within its ttl (billed as a cache read),
    each read renewing the ttl. With several breakpoints the longest prefix cached is read and the part after
    it, up to the last breakpoint, written: a few-shot prefix after a cached system prompt is billed so."""

    TTL: ClassVar[dict[str, float]] = {"5m": 300.0, "1h": 3600.0}

    def __init__(self) -> None:
        self.expiry: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()

    def account(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """(tokens written 5m, tokens written 1h, tokens read) for this request's cached prefix."""
        from llmledger._step.prices import min_cacheable_tokens

        model, blocks = str(body.get("model")), _prompt_blocks(body)
        text, files, keys, points = "", 0, [], []  # points: (key, tokens up to it, ttl) per breakpoint
        for role, block in blocks:
            said, tokens = block_cost(block)
            text, files = text + said, files + tokens
            keys.append((role, block_key(block)))
            control = block.get("cache_control") if isinstance(block, dict) else None
            upto = (count_tokens(text) if text else 0) + files
            if control and upto >= min_cacheable_tokens(model):  # shorter: billed as plain input
                points.append((json.dumps(keys, sort_keys=True), upto, control.get("ttl", "5m")))
        if not points:
            return 0, 0, 0
        now, written, read = time.time(), {"5m": 0, "1h": 0}, 0
        with self.lock:
            hit = max(
                (n for n, (key, _, _) in enumerate(points) if self.expiry.get((model, key), 0.0) > now), default=-1
            )
            for n, (key, tokens, ttl) in enumerate(points):
                before = points[n - 1][1] if n else 0
                if n <= hit:
                    read += tokens - before
                else:
                    written[ttl] += tokens - before
                self.expiry[(model, key)] = now + self.TTL[ttl]
        return written["5m"], written["1h"], read


def _prompt_blocks(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(role, block) of the whole prompt in the order the API caches it: tools, system, then each message."""
    system = body.get("system")
    blocks: list[tuple[str, Any]] = [("tools", tool) for tool in body.get("tools") or []]
    blocks += (
        [("system", {"type": "text", "text": system})]
        if isinstance(system, str)
        else [("system", b) for b in system or [] if isinstance(b, dict)]
    )
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        role = str(message.get("role")) if isinstance(message, dict) else ""
        blocks += (
            [(role, {"type": "text", "text": content})]
            if isinstance(content, str)
            else [(role, b) for b in content or []]
            if isinstance(content, list)
            else []
        )
    return blocks


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
        return {
            f"anthropic-ratelimit-{family}-limit": str(int(self.rate * 60)),
            f"anthropic-ratelimit-{family}-remaining": str(remaining),
            f"anthropic-ratelimit-{family}-reset": reset.isoformat(timespec="seconds").replace("+00:00", "Z"),
        }

    def openai_headers(self, family: str) -> dict[str, str]:
        """`x-ratelimit-{limit,remaining,reset}-{family}` as OpenAI sends them: the reset is the time until the
        bucket is full again, as a duration."""
        self._refill()
        return {
            f"x-ratelimit-limit-{family}": str(int(self.rate * 60)),
            f"x-ratelimit-remaining-{family}": str(max(0, int(self.tokens))),
            f"x-ratelimit-reset-{family}": duration((self.size - self.tokens) / self.rate),
        }


class TokenLimits:
    """Input- and output-token buckets per minute, refilled continuously, as the API enforces them.

    A request needs its input tokens and `max_tokens` output tokens available when it starts; the
    output tokens it did not use are given back when it ends (the API estimates from max_tokens, then
    adjusts to the actual usage).
    """

    def __init__(
        self,
        input_per_minute: float | None,
        output_per_minute: float | None,
        burst_seconds: float,
        per_minute: float | None = None,
    ):
        def bucket(rate: float | None) -> Bucket | None:
            return Bucket(rate / 60, rate / 60 * burst_seconds) if rate else None

        self.input, self.output = bucket(input_per_minute), bucket(output_per_minute)
        self.both = bucket(per_minute)  # OpenAI's one token limit: input and max output, the unused output refunded
        self.lock = threading.Lock()

    def admit(self, tokens_in: int, max_out: int) -> ErrorSpec | None:
        """None when the request may start (its tokens taken), else the 429 the API would send."""
        with self.lock:
            taken: list[tuple[Bucket, int]] = []
            for bucket, amount, family in (
                (self.input, tokens_in, "input"),
                (self.output, max_out, "output"),
                (self.both, tokens_in + max_out, "total"),
            ):
                if bucket is None:
                    continue
                granted, wait = bucket.take(amount)
                if granted:
                    taken.append((bucket, amount))
                else:
                    for earlier, amount_taken in taken:
                        earlier.give_back(amount_taken)
                    return ErrorSpec(
                        429,
                        "rate_limit_error",
                        f"This request would exceed the rate limit for your organization of "
                        f"{int(bucket.rate * 60):,} {family} tokens per minute.",
                        retry_after=wait,
                    )
        return None

    def settle(self, max_out: int, used_out: int) -> None:
        with self.lock:
            for bucket in (self.output, self.both):
                if bucket is not None:
                    bucket.give_back(max(0, max_out - used_out))

    def openai_headers(self) -> dict[str, str]:
        """OpenAI's token headers: its one limit (`tokens_per_minute`), or the input limit when only that is set."""
        with self.lock:
            bucket = self.both or self.input
            return bucket.openai_headers("tokens") if bucket is not None else {}

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        with self.lock:
            for bucket, family in ((self.input, "input-tokens"), (self.output, "output-tokens")):
                if bucket is not None:
                    out.update(bucket.headers(family, rounded=True))
            binding = min(
                (b for b in (self.input, self.output) if b is not None), key=lambda b: b.tokens / b.size, default=None
            )
            if binding is not None:
                family = "input-tokens" if binding is self.input else "output-tokens"
                out.update({k.replace(family, "tokens"): v for k, v in binding.headers(family, rounded=True).items()})
        return out
