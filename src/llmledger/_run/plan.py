"""The plan of a call: every option checked once and frozen in a `Plan`, from which the ledger's view
(`RunParams`) and the senders' (`RunConfig`) are derived. Checks raise `InvalidInputError` before anything is
written."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._exec.apis import for_client
from llmledger._exec.batch import MAX_REQUESTS
from llmledger._exec.config import RetryPolicy, RunConfig
from llmledger._ledger import StepDefinition, Store, locate
from llmledger._ledger.states import Redo
from llmledger._ledger.where import check_where_shape
from llmledger._run.endpoints import client_for, endpoint_refusal, provider_refusal
from llmledger._step.apis import ANTHROPIC, batches_at, shape_of
from llmledger._step.messages import message_text
from llmledger._step.prices import estimate_tokens, min_cacheable_tokens, price_of
from llmledger._step.prompt import Prompt, template_fields
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError


@dataclass(frozen=True)
class Plan:
    """A checked call: everything a run needs, nothing written yet. Frozen: each option is checked once, by
    `_run.api`, and lives in one place; the ledger's view of it (`RunParams`) and the senders' (`cfg`, a
    `RunConfig`) are derived from it, and what a run learns as it starts (where its answers come from, what the
    step has spent) makes a new plan with `dataclasses.replace`."""

    store: Store
    table: str
    step: str
    cfg: RunConfig  # how the senders send (attempts, concurrency, budget, ...)
    redo: Redo
    stale: timedelta
    where: str | None
    client: Any  # an anthropic.AsyncAnthropic, an openai.AsyncOpenAI (model="openai:..."), or None: the default
    progress: bool
    endpoint: str | None = None  # base_url= of a server other than the provider's own API (`client_for`)
    gateway: bool = False  # that server forwards to the provider's own API: batches and its features are used
    provider: str = ANTHROPIC  # the API the client speaks: "anthropic" (Messages) or "openai" (Chat Completions)
    mode: str = "online"  # "online", "batch" or "auto" (batch from AUTO_BATCH_ROWS rows to send)
    wait: bool = True  # batch mode: wait for the batches to end (else return once they are submitted)
    batch_size: int = MAX_REQUESTS
    # apply_llm only: what the user passed, the frame as the ledger sees it, and the step's definition
    df: Any = None
    user_frame: pl.DataFrame | None = None  # the frame as the user gave it, in polars
    frame: pl.DataFrame | None = None  # the columns the ledger stores
    from_pandas: bool = False
    definition: StepDefinition | None = None
    null_fields: tuple[str, ...] = ()  # template fields that are null in some rows of the frame
    null_rows: int = 0  # rows of the frame with a null in a field the template reads
    skip_nulls: bool = False  # those rows are left unsent (apply_llm's skip_nulls=True)
    default_table: bool = False  # apply_llm was not given table=: it refuses to rewrite answered rows' inputs

    @property
    def entry(self) -> str:
        return "apply_llm" if self.definition is not None else "resume"


Validator = Callable[[dict[str, Any], Any], str | None]


MAX_CHUNK = 1_000_000_000  # rows in one claim
MAX_STALE_AFTER = timedelta(days=3650)  # a claim older than this is a dead run's in any case
MAX_CONCURRENCY = 1_000  # the SDK's connection pool holds 1,000; more would only queue inside it


def plan_options(
    *,
    store: str | Path,
    table: str,
    step: str,
    chunk_size: Any,
    concurrency: Any,
    where: Any,
    redo: Any,
    max_attempts: Any,
    stale_after: Any,
    client: Any,
    progress: bool,
    retry: RetryPolicy | None,
    commit_every: Any,
    dedupe: bool,
    validate: Validator | None = None,
    output_model: Any = None,
    max_cost_usd: Any = None,
    budget_scope: Any = "run",
    mode: Any = "online",
    wait: Any = True,
    batch_size: Any = None,
    base_url: Any = None,
    api_key: Any = None,
    provider: str = ANTHROPIC,
    gateway: Any = False,
    api: str | None = None,
) -> Plan:
    client, endpoint = client_for(client, base_url, api_key, provider, gateway=gateway)
    no_batches = None if client is None else for_client(client, api).batch_refusal(client)
    if no_batches is not None and mode == "batch":
        raise InvalidInputError(no_batches + ". Nothing was written.")
    batches = batches_at(provider, endpoint, gateway) and no_batches is None
    if not batches and mode == "auto" and (wait is False or batch_size is not None):
        raise InvalidInputError(
            f"{'wait=False' if wait is False else 'batch_size'} applies to batches, which {endpoint} (base_url=) "
            "does not have: there mode='auto' sends online; for a call that returns at once, pass background=True"
        )
    if not batches and mode == "batch":
        raise InvalidInputError(
            f"mode='batch' sends batches, which only Anthropic's and OpenAI's own APIs have; {endpoint} (base_url=) "
            "is another server (it answers requests one by one, not in batches): pass mode='online', or, if it is "
            "a gateway that forwards to the provider's own API, gateway=True"
        )
    for name, value in (
        ("chunk_size", chunk_size),
        ("concurrency", concurrency),
        ("max_attempts", max_attempts),
        ("batch_size", MAX_REQUESTS if batch_size is None else batch_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    if chunk_size > MAX_CHUNK:  # a claim's rows are sliced by polars, whose offsets are 64-bit
        raise InvalidInputError(f"chunk_size must be at most {MAX_CHUNK:,} rows, got {chunk_size:,}")
    if not isinstance(dedupe, bool):
        raise InvalidInputError(f"dedupe must be True or False, got {dedupe!r}")
    if concurrency > MAX_CONCURRENCY:
        raise InvalidInputError(
            f"concurrency={concurrency:,} is more requests at once than one process can keep "
            f"going (each is a connection); pass at most {MAX_CONCURRENCY:,}, or run several "
            "workers (llmledger worker) on a PostgreSQL store"
        )
    if redo not in (False, True, "all", "stale", "flagged"):  # "all" is True, as the CLI's --redo all
        raise InvalidInputError(f"redo must be False, True (or 'all'), 'stale' or 'flagged', got {redo!r}")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise InvalidInputError(f"where must be a SQL predicate string such as \"label = 'spam'\", got {where!r}")
    check_where_shape(where)
    if isinstance(commit_every, bool) or not isinstance(commit_every, int | float) or not commit_every > 0:  # NaN
        raise InvalidInputError(f"commit_every must be a positive number of seconds, got {commit_every!r}")
    if max_cost_usd is not None and (
        isinstance(max_cost_usd, bool)
        or not isinstance(max_cost_usd, int | float)
        or not 0 < max_cost_usd < float("inf")
    ):
        raise InvalidInputError(f"max_cost_usd must be a positive number of dollars, got {max_cost_usd!r}")
    if budget_scope not in ("run", "step"):
        raise InvalidInputError(
            f"budget_scope must be 'run' (this run's spending) or 'step' (every run of the "
            f"step so far), got {budget_scope!r}"
        )
    if mode not in ("online", "batch", "auto"):
        raise InvalidInputError(f"mode must be 'online', 'batch' (batches, half price) or 'auto', got {mode!r}")
    if not isinstance(wait, bool):
        raise InvalidInputError(f"wait must be True or False, got {wait!r}")
    if mode == "online" and (wait is False or batch_size is not None):
        raise InvalidInputError(
            f"{'wait=False' if wait is False else 'batch_size'} applies to mode='batch' or "
            "'auto' (batches); an online run that returns at once is "
            "apply_llm(..., background=True)"
        )
    most = shape_of(provider).batch_limit
    if isinstance(batch_size, int) and batch_size > most:
        raise InvalidInputError(
            f"batch_size must be at most {most:,} ({shape_of(provider).own_api}'s limit on requests in one batch), "
            f"got {batch_size:,}"
        )
    if mode == "batch" and max_cost_usd is not None:
        raise InvalidInputError(
            "max_cost_usd works with mode='online' (a batch is paid when it ends, so a run "
            "cannot stop it at a budget); see what a batch would cost with "
            "llmledger.estimate(...) first, or pass mode='online'"
        )
    seconds = stale_after.total_seconds() if isinstance(stale_after, timedelta) else float(stale_after)
    if not 0 < seconds <= MAX_STALE_AFTER.total_seconds():  # NaN, infinity and dates past year 9999 too
        raise InvalidInputError(
            f"stale_after must be positive and at most {MAX_STALE_AFTER.days:,} days (seconds or a timedelta), "
            f"got {stale_after!r}"
        )
    stale = timedelta(seconds=seconds)
    path = locate(store)
    cfg = RunConfig(
        chunk_size=chunk_size,
        concurrency=concurrency,
        max_attempts=max_attempts,
        commit_every=commit_every,
        retry=retry or RetryPolicy(),
        dedupe=dedupe,
        validate=validate,
        output_model=output_model,
        max_cost_usd=None if max_cost_usd is None else float(max_cost_usd),
        budget_scope=budget_scope,
        stale_after=stale.total_seconds(),
        adaptive=endpoint is not None,
        api=api,
    )
    return Plan(
        store=path,
        table=table,
        step=step,
        cfg=cfg,
        redo=Redo.from_argument(redo),
        stale=stale,
        where=where,
        client=client,
        progress=progress,
        endpoint=endpoint,
        gateway=gateway,
        provider=provider,
        mode="online" if mode == "auto" and (max_cost_usd is not None or not batches) else mode,
        wait=wait,
        batch_size=MAX_REQUESTS if batch_size is None else batch_size,
    )


def step_refusal(plan: Plan, sent: Any) -> str | None:
    """Why `plan` may not send the requests `sent` (the step's `RequestSpec`): another API, or another server."""
    return provider_refusal(plan.table, plan.step, sent.provider, plan.provider) or endpoint_refusal(
        plan.table, plan.step, sent.endpoint, plan.endpoint, sent.provider
    )


def check_budget_countable(max_cost_usd: float | None, model: str) -> None:
    """A budget needs a price: refused up front for a model llmledger knows no price of (a `base_url=` server's),
    which would otherwise pay one request before it found it could not count what that cost."""
    if max_cost_usd is not None and price_of(model) is None:
        raise InvalidInputError(
            f"max_cost_usd needs the price of model {model!r}, which llmledger does not know, so it could not count "
            f"what the run spends: tell it with llmledger.set_price({model!r}, input=..., output=...) (dollars per "
            "million tokens), or leave max_cost_usd out. Nothing was written."
        )


def cache_ttl(cache: Any, model: str, system: str | None, prefix: tuple[dict[str, Any], ...] = ()) -> str | None:
    """The ttl the static part of the request (system prompt and `messages=` prefix) is cached with: none when
    caching is off or that part is too short to cache."""
    if cache not in (True, False, "5m", "1h"):
        raise InvalidInputError(f"cache must be True (a 5-minute cache), '5m', '1h' or False, got {cache!r}")
    static = (system or "") + "".join(message_text(m) for m in prefix)
    if cache is False or not static or estimate_tokens(static) < min_cacheable_tokens(model):
        return None
    return "5m" if cache is True else cache


def check_validator(validate: Any) -> None:
    if validate is not None and not callable(validate):
        raise InvalidInputError(f"validate must be a callable(row, output) -> None | str, got {validate!r}")


def with_null_fields(plan: Plan, prompt: Prompt, skip: Any) -> Plan:
    """`plan` with the frame's rows that hold a null in a column the template reads counted (they are shown as empty
    text); with `skip`, left unsent: their `IS NOT NULL` joins `where=` (so they stay NOT_STARTED until their value
    arrives)."""
    if not isinstance(skip, bool):
        raise InvalidInputError(f"skip_nulls must be True or False, got {skip!r}")
    if skip and not isinstance(prompt, str):
        raise InvalidInputError(
            "skip_nulls=True looks at the columns a template reads; a callable prompt has none: "
            "filter the frame instead (e.g. df.drop_nulls('text')), or pass where="
        )
    frame = plan.frame
    assert frame is not None
    fields = [f for f in template_fields(prompt) if f in frame.columns] if isinstance(prompt, str) else []
    if plan.definition is not None:  # a row without its file (a null path or URL) is left unsent too
        fields += [c for c in plan.definition.request.attach if c in frame.columns and c not in fields]
    if skip and plan.definition is not None:  # recorded with the step: resume and `llmledger run` skip them too
        plan = dataclasses.replace(plan, definition=dataclasses.replace(plan.definition, skip_nulls=tuple(fields)))
    nulls = [f for f in fields if frame[f].null_count()]
    if not nulls:
        return plan
    rows = int(frame.select(pl.any_horizontal(pl.col(f).is_null() for f in nulls).sum()).item())
    where = plan.where
    if skip:
        present = " AND ".join(f"{q(f)} IS NOT NULL" for f in nulls)
        where = f"({where}) AND {present}" if where else present
    return dataclasses.replace(plan, null_fields=tuple(nulls), skip_nulls=skip, null_rows=rows, where=where)


def check_no_nul(
    prompt: Prompt, system: str | None, options: dict[str, Any], prefix: tuple[dict[str, Any], ...] = ()
) -> None:
    """The request is stored with every row, and PostgreSQL text holds no NUL (a store may move there: `copy`);
    llmledger also marks where a row's prompt goes in a stored request with NUL-delimited text."""
    for what, text in (
        ("prompt", prompt if isinstance(prompt, str) else ""),
        ("system", system or ""),
        ("request_options", json.dumps(options, ensure_ascii=False).replace("\\u0000", "\x00")),
        *((f"messages[{n}]", message_text(m)) for n, m in enumerate(prefix)),
    ):
        if "\x00" in text:
            raise InvalidInputError(
                f"{what} holds a NUL character (\\x00), which the store cannot keep; remove it, "
                "e.g. text.replace('\\x00', '')"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ('\ud800'): no UTF-8 store or API request holds one
            bad = text[exc.start : exc.end]
            raise InvalidInputError(
                f"{what} holds {bad!r}, half of a UTF-16 surrogate pair, which UTF-8 text "
                "cannot hold; remove it (it usually comes from a broken decode)"
            ) from None
