"""What llmledger knows of each model: its provider, prices, what it supports, and its lifecycle, as data.

A model's provider announces a shutdown date and a replacement months ahead; a step on that model runs as before
until the day its requests are refused with a 404. So each model's lifecycle is data beside its prices
(`prices.json`: `shutdown`, `replacement`, `announced`, and where and when each was checked), and what a provider's
API says at run time adds to it (OpenAI's `GET /v1/models` carries each model's `shutdown_date`: `learn_shutdown`),
so that a warning need not wait for a release of llmledger. A call on a model that shuts down within
`WARN_DAYS` days warns before anything is paid (`retirement_notice`); a 404 from a model past its date says it
was retired and what replaces it (`retired_note`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import polars as pl

from llmledger._step.apis import ANTHROPIC, SHAPES
from llmledger._step.prices import _SNAPSHOT, Price, _data, _table, platform_id

WARN_DAYS = 60  # a step whose model shuts down within this many days is warned about
_PROVIDER_NAMES = {shape.provider: shape.vendor for shape in SHAPES}
_learned: dict[str, tuple[date | None, str]] = {}  # model id -> (shutdown date its API gave, where it was read)
_lock = threading.Lock()


class ModelRetiringWarning(UserWarning):
    """The step's model shuts down soon (its provider announced the date): move the step to the replacement."""


@dataclass(frozen=True)
class Lifecycle:
    """When a model stops answering, and what its provider recommends instead."""

    shutdown: date | None = None
    replacement: str | None = None
    announced: date | None = None
    source: str | None = None  # where the facts were read
    checked: str | None = None  # when they were read (YYYY-MM-DD), or "the API" for a date the API gave this process

    def days_left(self, today: date) -> int | None:
        return None if self.shutdown is None else (self.shutdown - today).days

    def status(self, today: date) -> str:
        """ "active" (no shutdown announced), "deprecated" (announced, still answering) or "retired"."""
        if self.shutdown is None:
            return "active"
        return "retired" if self.shutdown <= today else "deprecated"


@dataclass(frozen=True)
class ModelInfo:
    model: str
    provider: str
    aliases: tuple[str, ...]
    price: Price
    supports: dict[str, bool] = field(default_factory=dict)
    lifecycle: Lifecycle = Lifecycle()


def provider_of_id(model: str) -> str:
    """The provider whose API serves a model id of the price table (`provider` in prices.json); an id it does not
    list is taken for Anthropic's."""
    entry = _data()["models"].get(_canonical(model), {})
    return str(entry.get("provider", ANTHROPIC))


def _canonical(model: str) -> str:
    """A model id as prices.json lists it: an alias or a dated snapshot is its model's id."""
    _, prices, aliases = _table()
    model = platform_id(model)
    for name in (model, _snapshot_base(model)):
        name = aliases.get(name, name)
        if name in prices:
            return name
    return model


def _snapshot_base(model: str) -> str:
    """ "gpt-5-mini-2025-08-07" and "claude-haiku-4-5-20251001" name the model without their date."""
    return _SNAPSHOT.sub(r"\1", model)


def _date(value: Any) -> date | None:
    return date.fromisoformat(value) if isinstance(value, str) and value else None


def lifecycle_of(model: str) -> Lifecycle:
    """The lifecycle of a model id (an alias or dated snapshot: its model's), from prices.json and what the API said
    in this process; `Lifecycle()` (nothing announced) for a model llmledger does not know."""
    name = _canonical(model)
    entry = _data()["models"].get(name, {})
    known = Lifecycle(
        shutdown=_date(entry.get("shutdown")),
        replacement=entry.get("replacement"),
        announced=_date(entry.get("announced")),
        source=entry.get("lifecycle_source") or (_data().get("lifecycle_sources", {}).get(entry.get("provider"))),
        checked=entry.get("lifecycle_checked"),
    )
    with _lock:
        learned = _learned.get(model) or _learned.get(name)
    if learned is not None and learned[0] is not None and learned[0] != known.shutdown:
        shutdown, where = learned
        return Lifecycle(shutdown, known.replacement, known.announced, where, "the API, this process")
    return known


def learn_shutdown(model: str, shutdown: date | None, source: str) -> None:
    """What the provider's API says of `model`'s shutdown date (OpenAI's `shutdown_date`), for this process."""
    with _lock:
        _learned[model] = (shutdown, source)


def current_day() -> date:
    """The day lifecycles are read against (one place, so a test can move it)."""
    return date.today()


def _model_ref(model: str, provider: str) -> str:
    """How `model=` names a model of `provider`."""
    return f"{provider}:{model}" if provider != ANTHROPIC else model


def retirement_notice(model: str, provider: str, today: date, *, within: int = WARN_DAYS) -> str | None:
    """What to tell the user of a step on `model` (of `provider`'s API) whose shutdown is within `within` days (or
    past), or None."""
    if provider_of_id(model) != provider:  # another provider's model of that name: no lifecycle of its applies
        return None
    life = lifecycle_of(model)
    left = life.days_left(today)
    if left is None or left > within:
        return None
    who = _PROVIDER_NAMES.get(provider, provider)
    when = (
        f"was shut down on {life.shutdown}"
        if left <= 0
        else f"shuts down on {life.shutdown}, in {left} day{'s' if left != 1 else ''}"
    )
    instead = (
        f"; {who} recommends {life.replacement!r} instead: pass model={_model_ref(life.replacement, provider)!r} "
        "(a new model makes the step's answers stale, reported and not paid: run a sample and compare first)"
        if life.replacement
        else f"; {who} names no replacement"
    )
    source = f" ({life.source}, checked {life.checked})" if life.source else ""
    return f"model {model!r} ({who}) {when}{instead}.{source}"


def retired_note(model: str, today: date) -> str | None:
    """What a 404 for `model` means when its shutdown date has passed: retired on that date, and its replacement."""
    life = lifecycle_of(model)
    # a day's margin: the API's day may start before the user's (a time zone behind UTC on the shutdown day)
    if life.shutdown is None or life.shutdown > today + timedelta(days=1):
        return None
    instead = f"; its replacement is {life.replacement!r}" if life.replacement else ""
    return f"model {model!r} was retired on {life.shutdown}{instead}"


def catalogue() -> list[ModelInfo]:
    """Every model of the price table, with what it supports and its lifecycle."""
    data = _data()
    _, prices, aliases = _table()
    by_model: dict[str, list[str]] = {}
    for alias, model in aliases.items():
        by_model.setdefault(model, []).append(alias)
    defaults = data.get("supports", {})
    out = []
    for model, entry in data["models"].items():
        provider = str(entry.get("provider", ANTHROPIC))
        supports = {**defaults.get(provider, {}), **entry.get("supports", {})}
        out.append(
            ModelInfo(
                model, provider, tuple(sorted(by_model.get(model, []))), prices[model], supports, lifecycle_of(model)
            )
        )
    return out


def models(*, provider: str | None = None, today: date | None = None) -> pl.DataFrame:
    """The models llmledger knows, one row each: provider, prices (USD per million tokens: standard, cache write and
    read, the batch and flex multipliers, the long-prompt tier), what each supports (batches, prompt caching,
    structured outputs, images and PDFs), and its lifecycle (status, shutdown date, replacement, where and when
    that was checked). `provider="openai"` (or "anthropic") keeps one provider's."""
    from llmledger.errors import InvalidInputError

    if provider is not None and provider not in _PROVIDER_NAMES:
        raise InvalidInputError(f"provider must be one of {sorted(_PROVIDER_NAMES)}, got {provider!r}")
    today = today or current_day()
    rows = []
    for info in catalogue():
        if provider is not None and info.provider != provider:
            continue
        price, life, long = info.price, info.lifecycle, info.price.long_prompt
        rows.append(
            {
                "provider": info.provider,
                "model": _model_ref(info.model, info.provider),
                "aliases": list(info.aliases),
                "status": life.status(today),
                "shutdown": life.shutdown,
                "replacement": life.replacement,
                "input": price.input,
                "output": price.output,
                "cache_write_5m": price.cache_write_5m,
                "cache_write_1h": price.cache_write_1h,
                "cache_read": price.cache_read,
                "batch": price.batch,
                "flex": price.flex,
                "long_prompt_above": price.long_prompt_threshold,
                "long_input": None if long is None else long.input,
                "long_output": None if long is None else long.output,
                **{f"supports_{name}": value for name, value in sorted(info.supports.items())},
                "lifecycle_source": life.source,
                "lifecycle_checked": life.checked,
                "price_checked": _data()["models"][info.model].get("checked", _data()["checked"]),
            }
        )
    return pl.DataFrame(rows, infer_schema_length=None).sort(
        ["provider", "status", "model"], descending=[False, True, False]
    )
