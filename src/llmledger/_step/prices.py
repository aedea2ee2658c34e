"""List prices of Claude models (and OpenAI's), kept as data in `prices.json` with the date they were checked.

Each model has rates in USD per million tokens for input, output, cache writes
(5 minute and 1 hour), cache reads, and a batch multiplier; a model may have a
higher tier for long prompts. Model ids match exactly, as do their listed
aliases and snapshots; a dated snapshot not listed (`<id>-YYYYMMDD`, `<id>-YYYY-MM-DD`) takes the
rates of its id. A model with no known price gets a NULL cost and one warning,
never a guessed number. `set_price()` adds or overrides a model for this process.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from dataclasses import asdict, dataclass, replace
from functools import cache
from importlib import resources
from typing import Any, Protocol

import polars as pl

from llmledger._step.request import split_model
from llmledger.errors import InvalidInputError, warn

# How Claude's ids are spelled on the clouds: Bedrock's "anthropic.claude-haiku-4-5-20251001-v1:0" (with a region
# prefix for cross-region inference: "us.", "eu.", "apac.", "global."), Vertex AI's "claude-haiku-4-5@20251001".
_PLATFORM = re.compile(r"^(?:(?:us|eu|apac|global|jp|au|us-gov)\.)?anthropic\.(.+?)(?:-v\d+(?::\d+)?)?$")
_VERTEX_DATE = re.compile(r"^(claude-.+)@(\d{8})$")


def platform_id(model: str) -> str:
    """A Claude id as Anthropic's API spells it, from Bedrock's or Vertex AI's spelling (any other id as it is)."""
    found = _PLATFORM.match(model)
    if found:
        return found.group(1)
    dated = _VERTEX_DATE.match(model)
    return f"{dated.group(1)}-{dated.group(2)}" if dated else model


_SNAPSHOT = re.compile(r"^(.*)-(?:\d{8}|\d{4}-\d{2}-\d{2})$")  # Anthropic's -20251001, OpenAI's -2025-08-07
_overrides: dict[str, Price] = {}
_warned: set[str] = set()
_lock = threading.Lock()


class UnknownPriceWarning(UserWarning):
    """A model has no known price: its rows get a NULL cost. `llmledger.set_price()` fixes that."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float
    batch: float = 0.5  # multiplier for Message Batches (OpenAI's Batch API)
    long_prompt_threshold: int | None = None  # prompts (input + cache) above this many tokens pay `long_prompt`
    long_prompt: Price | None = None
    flex: float | None = None  # multiplier for OpenAI's flex processing (`service_tier="flex"`); None: not offered

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        cache_read_tokens: int = 0,
        batch: bool = False,
        flex: bool = False,
    ) -> float:
        prompt = input_tokens + cache_write_tokens + cache_read_tokens
        rates = self
        if (
            self.long_prompt is not None
            and self.long_prompt_threshold is not None
            and prompt > self.long_prompt_threshold
        ):
            rates = self.long_prompt
        write_5m = cache_write_tokens - cache_write_1h_tokens
        total = (
            input_tokens * rates.input
            + output_tokens * rates.output
            + write_5m * rates.cache_write_5m
            + cache_write_1h_tokens * rates.cache_write_1h
            + cache_read_tokens * rates.cache_read
        ) / 1e6
        discount = self.batch if batch else (self.flex or 1.0) if flex else 1.0
        return total * discount


DEFAULT_MIN_CACHEABLE_TOKENS = 1024


def estimate_tokens(text: str) -> int:
    """Roughly how many tokens `text` is (about four characters a token, as the API's tokenizers average)."""
    return (len(text) + 3) // 4


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix the API caches for `model` (prices.json; 1,024 for models it does not list)."""
    data = _data()
    found = data.get("min_cacheable_tokens", {})
    _, _, aliases = _table()
    name = aliases.get(model, model)
    snapshot = _SNAPSHOT.match(name)
    return int(found.get(name) or (found.get(snapshot.group(1)) if snapshot else None) or DEFAULT_MIN_CACHEABLE_TOKENS)


@cache
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files("llmledger").joinpath("prices.json").read_text(encoding="utf-8"))
    return data


@cache
def _table() -> tuple[str, dict[str, Price], dict[str, str]]:
    """(date checked, prices by model id, model id by alias) from prices.json."""
    data = _data()
    prices, aliases = {}, {}
    for model, entry in data["models"].items():
        prices[model] = _price(entry)
        for alias in entry.get("aliases", []):
            aliases[alias] = model
    return data["checked"], prices, aliases


def _price(entry: dict[str, Any]) -> Price:
    long = entry.get("long_prompt")
    if long is not None and "input_multiplier" in long:  # OpenAI's way: the whole request at multiples of the rates
        times_in, times_out = long["input_multiplier"], long["output_multiplier"]
        long = {
            "threshold": long["threshold"],
            **{k: entry[k] * times_in for k in ("input", "cache_write_5m", "cache_write_1h", "cache_read")},
            "output": entry["output"] * times_out,
        }
    return Price(
        input=entry["input"],
        output=entry["output"],
        cache_write_5m=entry["cache_write_5m"],
        cache_write_1h=entry["cache_write_1h"],
        cache_read=entry["cache_read"],
        batch=entry.get("batch", 0.5),
        long_prompt_threshold=long["threshold"] if long else None,
        long_prompt=_price({**long, "batch": entry.get("batch", 0.5), "flex": entry.get("flex")}) if long else None,
        flex=entry.get("flex"),
    )


def listed(model: str) -> bool:
    """Whether `model` is an id or alias of the price table (or given a price with `set_price`), exactly: what
    the simulator answers, as the API answers only models it has (an invented dated snapshot is not one)."""
    _, prices, aliases = _table()
    with _lock:
        return model in prices or model in aliases or model in _overrides


def price_of(model: str) -> Price | None:
    """The price of `model` (an id, alias or dated snapshot), or None when unknown."""
    with _lock:
        if model in _overrides:
            return _overrides[model]
    _, prices, aliases = _table()
    model = platform_id(model)
    for name in (model, _SNAPSHOT.sub(r"\1", model)):
        name = aliases.get(name, name)
        if name in _overrides:
            return _overrides[name]
        if name in prices:
            return prices[name]
    return None


def warn_unpriced(model: str) -> None:
    """Say once per model, before a run sends anything and at the user's own line, that `model` has no known
    price (its rows will get a NULL cost), naming a known model whose id is close (a typo the API would refuse
    with a 404)."""
    if price_of(model) is not None:
        return
    with _lock:
        if model in _warned:
            return
        _warned.add(model)
    _, table, aliases = _table()
    close = difflib.get_close_matches(model, [*table, *aliases, *_overrides], n=1, cutoff=0.8)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    warn(
        f"llmledger knows no price for model {model!r}: its rows get a NULL cost (tokens are stored).{hint} "
        f"Tell it with llmledger.set_price({model!r}, input=..., output=...).",
        UnknownPriceWarning,
    )


class Usage(Protocol):
    """What a price is applied to: an answer's model and token counts (`_exec.client.Reply` is one)."""

    @property
    def model(self) -> str: ...

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def cache_write_tokens(self) -> int: ...

    @property
    def cache_write_1h_tokens(self) -> int: ...

    @property
    def cache_read_tokens(self) -> int: ...

    @property
    def batch(self) -> bool: ...


def cost_usd(reply: Usage) -> float | None:
    """What an answer cost at list price (the batch rate for a batch's answer); None when the model's price is
    unknown (said once per model: `warn_unpriced`), or the server said nothing of what the answer used (a cost of
    0.0 would say it was free)."""
    if not getattr(reply, "counted", True):
        return None
    price = price_of(reply.model)
    if price is None:
        warn_unpriced(reply.model)  # the API answered with another id than the one asked for
        return None
    return price.cost(
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        cache_write_tokens=reply.cache_write_tokens,
        cache_write_1h_tokens=reply.cache_write_1h_tokens,
        cache_read_tokens=reply.cache_read_tokens,
        batch=reply.batch,
        flex=getattr(reply, "flex", False),
    )


def set_price(
    model: str,
    *,
    input: float,
    output: float,
    cache_write_5m: float | None = None,
    cache_write_1h: float | None = None,
    cache_read: float | None = None,
    batch: float = 0.5,
) -> None:
    """Set the price of `model` for this process, in USD per million tokens.

    Cache rates default to the usual multiples of the input rate (writes 1.25x for 5 minutes and 2x for
    1 hour, reads 0.1x). Affects answers committed from now on; stored costs are not rewritten.
    """
    if not isinstance(model, str) or not model:
        raise InvalidInputError(f"model must be a model id such as 'claude-haiku-4-5', got {model!r}")
    model = split_model(model)[1]  # "openai:gpt-6.1-terra" is priced as gpt-6.1-terra, the id the API answers with
    rates = {"input": input, "output": output, "batch": batch}
    for name, value in rates.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):  # NaN
            raise InvalidInputError(f"{name} must be a non-negative number of USD per million tokens, got {value!r}")
    price = Price(
        input=float(input),
        output=float(output),
        cache_write_5m=float(cache_write_5m if cache_write_5m is not None else input * 1.25),
        cache_write_1h=float(cache_write_1h if cache_write_1h is not None else input * 2.0),
        cache_read=float(cache_read if cache_read is not None else input * 0.1),
        batch=float(batch),
    )
    with _lock:
        _overrides[model] = price
        _warned.discard(model)


def prices() -> pl.DataFrame:
    """The price table in use (built-in rates, then `set_price` overrides), one row per model."""
    checked, table, aliases = _table()
    with _lock:
        merged = {**table, **_overrides}
        overridden = set(_overrides)
    by_model: dict[str, list[str]] = {}
    for alias, model in aliases.items():
        by_model.setdefault(model, []).append(alias)
    rows = []
    for model, price in merged.items():
        flat = {k: v for k, v in asdict(replace(price, long_prompt=None)).items() if k != "long_prompt"}
        rows.append(
            {
                "model": model,
                "aliases": sorted(by_model.get(model, [])),
                **flat,
                "source": "set_price"
                if model in overridden
                else f"built in (checked {_data()['models'].get(model, {}).get('checked', checked)})",
            }
        )
    return pl.DataFrame(rows)


def checked_on() -> str:
    return _table()[0]
