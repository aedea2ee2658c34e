"""The plan of a call: its checked `RunOptions` (and apply_llm's step) frozen in a `Plan`, from which the ledger's
view (`RunParams`) and the senders' (`RunConfig`) are derived. Checks raise `InvalidInputError` before anything is
written."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._exec.apis import for_client
from llmledger._exec.client import answer_source
from llmledger._exec.config import RetryPolicy, RunConfig
from llmledger._ledger import RunParams, StepDefinition, Store, locate
from llmledger._ledger.states import Redo
from llmledger._run.endpoints import client_for, endpoint_refusal, provider_refusal
from llmledger._run.options import RunOptions
from llmledger._step.apis import ANTHROPIC, OPENAI, batches_at, shape_of
from llmledger._step.attach import Attachments
from llmledger._step.messages import message_text
from llmledger._step.prices import estimate_tokens, min_cacheable_tokens, price_of, prices
from llmledger._step.prompt import Prompt, template_fields
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError


@dataclass(frozen=True)
class Plan:
    """A checked call: everything a run needs, nothing written yet. Frozen, made once by `plan_options` from the
    call's checked `RunOptions`: the ledger's view of it (`params`) and the senders' (`cfg`, a `RunConfig`) are
    derived here, and nowhere else. apply_llm adds its frame and step (`with_step`); what a run learns as it starts
    (what the step has spent so far) makes a new plan with `dataclasses.replace`."""

    store: Store
    table: str
    step: str
    options: RunOptions  # as the call gave them, checked
    cfg: RunConfig  # how the senders send (attempts, concurrency, budget, ...)
    client: Any  # an anthropic.AsyncAnthropic, an openai.AsyncOpenAI (model="openai:..."), or None: the default
    endpoint: str | None = None  # base_url= of a server other than the provider's own API (`client_for`)
    provider: str = ANTHROPIC  # the API the client speaks: "anthropic" (Messages) or "openai"
    mode: str = "online"  # "online", "batch" or "flex"; "auto": batches from AUTO_BATCH_ROWS rows to send
    where: str | None = None  # where=, and under skip_nulls=True the rows with a null the template reads left out
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
    batches_open: bool = True  # the step had batches not merged when apply_llm looked (else no need to look again)

    @property
    def entry(self) -> str:
        return "apply_llm" if self.definition is not None else "resume"

    @property
    def redo(self) -> Redo:
        return Redo.from_argument(self.options.redo)

    @property
    def stale(self) -> timedelta:
        return self.options.stale

    @property
    def progress(self) -> bool:
        return self.options.progress

    @property
    def gateway(self) -> bool:
        return self.options.gateway

    @property
    def wait(self) -> bool:
        return self.options.wait

    @property
    def batch_size(self) -> int:
        return self.options.requests_per_batch

    def params(self, started: datetime, *, rehearsal: bool = False) -> RunParams:
        """The ledger's view of this run, started at `started`: what it may claim, and how long its claims last.
        A rehearsal (`estimate`) takes back no claim, however old, and refuses nothing: it says what would be sent."""
        return RunParams(
            max_attempts=self.cfg.max_attempts,
            redo=self.redo,
            run_started=started,
            stale_before=started - (timedelta(days=36500) if rehearsal else self.stale),
            where=self.where,
            named=self.options.where is not None,
            source=self.cfg.source,
            lease=self.stale,
            guard_inputs=self.default_table and not rehearsal,
        )


def plan_options(
    options: RunOptions,
    *,
    store: str | Path,
    table: str,
    step: str,
    provider: str = ANTHROPIC,
    api: str | None = None,
    output_model: Any = None,
    attachments: Attachments | None = None,
) -> Plan:
    """The plan of a call that runs with `options` on `store`'s `table`.`step`, whose requests speak `provider`'s
    `api`; what needs that API or the server (batches there) is checked here, the rest by `options.checked()`."""
    options = options.checked()
    client, endpoint = client_for(options.client, options.base_url, options.api_key, provider, gateway=options.gateway)
    mode, wait, batch_size = options.mode, options.wait, options.batch_size
    no_batches = None if client is None else for_client(client, api).batch_refusal(client)
    if no_batches is not None and mode == "batch":
        raise InvalidInputError(no_batches + ". Nothing was written.")
    batches = batches_at(provider, endpoint, options.gateway) and no_batches is None
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
    if mode == "flex" and provider != OPENAI:
        raise InvalidInputError(
            "mode='flex' is OpenAI's flex processing (service_tier='flex'), for 'openai:' models; Claude's half "
            "price is mode='batch'. Nothing was written."
        )
    most = shape_of(provider).batch_limit
    if batch_size is not None and batch_size > most:
        raise InvalidInputError(
            f"batch_size must be at most {most:,} ({shape_of(provider).own_api}'s limit on requests in one batch), "
            f"got {batch_size:,}"
        )
    cost = options.max_cost_usd
    cfg = RunConfig(
        chunk_size=options.chunk_size,
        concurrency=options.concurrency,
        max_attempts=options.max_attempts,
        commit_every=options.commit_every,
        retry=options.retry or RetryPolicy(),
        dedupe=options.dedupe,
        validate=options.validate,
        output_model=output_model,
        max_cost_usd=None if cost is None else float(cost),
        budget_scope=options.budget_scope,
        stale_after=options.stale.total_seconds(),
        adaptive=endpoint is not None,
        api=api,
        # where the run's answers come from, fixed now: a later llmledger.simulate() does not change it
        source=answer_source(client),
        attachments=attachments,
        service_tier="flex" if mode == "flex" else None,
        deadline=options.deadline_at,
    )
    return Plan(
        store=locate(store),
        table=table,
        step=step,
        options=options,
        cfg=cfg,
        client=client,
        endpoint=endpoint,
        provider=provider,
        mode="online" if mode == "auto" and (cost is not None or not batches) else mode,
        where=options.where,
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


def check_flex(mode: str, model: str) -> None:
    """mode='flex' needs a model OpenAI offers flex processing for (a flex rate in the price data): refused up front
    otherwise, naming those that have one (OpenAI answers such a request with a 400, or at the standard price)."""
    price = price_of(model)
    if mode == "flex" and (price is None or price.flex is None):
        offered = sorted(prices().filter(pl.col("flex").is_not_null())["model"])
        raise InvalidInputError(
            f"mode='flex': OpenAI offers no flex processing for {model!r} as far as llmledger's price data says; "
            f"models with a flex rate: {', '.join(offered) or 'none'} (llmledger.models() lists them). Pass "
            "mode='online', or mode='batch' for the batch price. Nothing was written."
        )


def cache_ttl(cache: Any, model: str, system: str | None, prefix: tuple[dict[str, Any], ...] = ()) -> str | None:
    """The ttl the static part of the request (system prompt and `messages=` prefix) is cached with: none when
    caching is off or that part is too short to cache."""
    if not isinstance(cache, bool) and cache not in ("5m", "1h"):  # 1 == True, but is no setting
        raise InvalidInputError(f"cache must be True (a 5-minute cache), '5m', '1h' or False, got {cache!r}")
    static = (system or "") + "".join(message_text(m) for m in prefix)
    if cache is False or not static or estimate_tokens(static) < min_cacheable_tokens(model):
        return None
    return "5m" if cache is True else cache


@dataclass(frozen=True)
class NullFields:
    """The frame's rows that hold a null in a column the template reads (shown as empty text), and with
    skip_nulls=True the `where` that leaves them unsent (NOT_STARTED until their value arrives)."""

    fields: tuple[str, ...] = ()
    rows: int = 0
    skip: bool = False
    where: str | None = None


def null_fields(
    prompt: Prompt, frame: pl.DataFrame, definition: StepDefinition, skip: Any, where: str | None
) -> tuple[StepDefinition, NullFields]:
    """The step's definition (with skip_nulls=True, recording the fields whose nulls leave a row unsent, so that
    resume and `llmledger run` skip them too) and what the frame's nulls mean for this run."""
    if not isinstance(skip, bool):
        raise InvalidInputError(f"skip_nulls must be True or False, got {skip!r}")
    if skip and not isinstance(prompt, str):
        raise InvalidInputError(
            "skip_nulls=True looks at the columns a template reads; a callable prompt has none: "
            "filter the frame instead (e.g. df.drop_nulls('text')), or pass where="
        )
    fields = [f for f in template_fields(prompt) if f in frame.columns] if isinstance(prompt, str) else []
    # a row without its file (a null path or URL) is left unsent too
    fields += [c for c in definition.request.attach if c in frame.columns and c not in fields]
    if skip:
        definition = dataclasses.replace(definition, skip_nulls=tuple(fields))
    nulls = [f for f in fields if frame[f].null_count()]
    if not nulls:
        return definition, NullFields(where=where)
    rows = int(frame.select(pl.any_horizontal(pl.col(f).is_null() for f in nulls).sum()).item())
    if skip:
        present = " AND ".join(f"{q(f)} IS NOT NULL" for f in nulls)
        where = f"({where}) AND {present}" if where else present
    return definition, NullFields(fields=tuple(nulls), rows=rows, skip=skip, where=where)


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
