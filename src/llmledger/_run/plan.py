"""The plan of a call: every option checked once and frozen in a `Plan`, from which the ledger's view
(`RunParams`) and the senders' (`RunConfig`) are derived. Checks raise `InvalidInputError` before anything is
written."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import polars as pl

from llmledger._exec.batch import MAX_REQUESTS
from llmledger._exec.chat import OPENAI_API, is_openai_client, make_client, openai_sdk
from llmledger._exec.client import ANTHROPIC_API, answer_source, endpoint_url, session_base_url, shown_url, simulated
from llmledger._exec.config import RetryPolicy, RunConfig
from llmledger._ledger import StepDefinition, Store, locate
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.states import Redo
from llmledger._ledger.where import check_where_shape
from llmledger._step.messages import message_text
from llmledger._step.prices import estimate_tokens, min_cacheable_tokens
from llmledger._step.prompt import Prompt, template_fields
from llmledger._step.request import ANTHROPIC, OPENAI
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
) -> Plan:
    client, endpoint = client_for(client, base_url, api_key, provider)
    if provider == OPENAI and mode == "batch":
        raise InvalidInputError(
            "mode='batch' for an OpenAI model is not built yet (OpenAI's Batch API comes in a later llmledger "
            "release): pass mode='online'; mode='auto' sends such a step online"
        )
    if endpoint is not None and mode == "auto" and (wait is False or batch_size is not None):
        raise InvalidInputError(
            f"{'wait=False' if wait is False else 'batch_size'} applies to Message Batches, which {endpoint} "
            "(base_url=) does not have: there mode='auto' sends online; for a call that returns at once, "
            "pass background=True"
        )
    if endpoint is not None and mode == "batch":
        raise InvalidInputError(
            f"mode='batch' sends Message Batches, which only Anthropic's API has; {endpoint} (base_url=) is another "
            "server (it answers the Messages API, not its batches): pass mode='online'"
        )
    for name, value in (
        ("chunk_size", chunk_size),
        ("concurrency", concurrency),
        ("max_attempts", max_attempts),
        ("batch_size", MAX_REQUESTS if batch_size is None else batch_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    if concurrency > MAX_CONCURRENCY:
        raise InvalidInputError(
            f"concurrency={concurrency:,} is more requests at once than one process can keep "
            f"going (each is a connection); pass at most {MAX_CONCURRENCY:,}, or run several "
            "workers (llmledger worker) on a PostgreSQL store"
        )
    if redo not in (False, True, "stale", "flagged"):
        raise InvalidInputError(f"redo must be False, True, 'stale' or 'flagged', got {redo!r}")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise InvalidInputError(f"where must be a SQL predicate string such as \"label = 'spam'\", got {where!r}")
    check_where_shape(where)
    if isinstance(commit_every, bool) or not isinstance(commit_every, int | float) or commit_every <= 0:
        raise InvalidInputError(f"commit_every must be a positive number of seconds, got {commit_every!r}")
    if max_cost_usd is not None and (
        isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, int | float) or not max_cost_usd > 0
    ):
        raise InvalidInputError(f"max_cost_usd must be a positive number of dollars, got {max_cost_usd!r}")
    if budget_scope not in ("run", "step"):
        raise InvalidInputError(
            f"budget_scope must be 'run' (this run's spending) or 'step' (every run of the "
            f"step so far), got {budget_scope!r}"
        )
    if mode not in ("online", "batch", "auto"):
        raise InvalidInputError(f"mode must be 'online', 'batch' (Message Batches, half price) or 'auto', got {mode!r}")
    if not isinstance(wait, bool):
        raise InvalidInputError(f"wait must be True or False, got {wait!r}")
    if mode == "online" and (wait is False or batch_size is not None):
        raise InvalidInputError(
            f"{'wait=False' if wait is False else 'batch_size'} applies to mode='batch' or "
            "'auto' (Message Batches); an online run that returns at once is "
            "apply_llm(..., background=True)"
        )
    if isinstance(batch_size, int) and batch_size > MAX_REQUESTS:
        raise InvalidInputError(
            f"batch_size must be at most {MAX_REQUESTS:,} (the API's limit on requests in "
            f"one batch), got {batch_size:,}"
        )
    if mode == "batch" and max_cost_usd is not None:
        raise InvalidInputError(
            "max_cost_usd works with mode='online' (a batch is paid when it ends, so a run "
            "cannot stop it at a budget); see what a batch would cost with "
            "llmledger.estimate(...) first, or pass mode='online'"
        )
    stale = stale_after if isinstance(stale_after, timedelta) else timedelta(seconds=float(stale_after))
    if stale.total_seconds() <= 0:
        raise InvalidInputError(f"stale_after must be positive, got {stale_after!r}")
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
        provider=provider,
        mode="online"
        if mode == "auto" and (max_cost_usd is not None or endpoint is not None or provider == OPENAI)
        else mode,
        wait=wait,
        batch_size=MAX_REQUESTS if batch_size is None else batch_size,
    )


def own_api(provider: str) -> str:
    return "OpenAI's API" if provider == OPENAI else "Anthropic's API"


def endpoint_refusal(
    table: str, step: str, recorded: str | None, sending: str | None, provider: str = ANTHROPIC
) -> str | None:
    """Why a call that sends to `sending` may not finish a step whose requests name `recorded` (None: the provider's
    own API), or None when they agree. A row's answer must come from the server its request names."""
    if recorded == sending:
        return None
    if recorded is not None:
        elsewhere = sending or own_api(provider)
        return (
            f"step {table}.{step} sends its requests to {recorded} (apply_llm(..., base_url=...)), and this call "
            f"would send them to {elsewhere}: pass base_url={recorded!r} (and "
            "api_key= if it needs one) to finish it there, or move the step with apply_llm(..., base_url=...) "
            "(its answers then turn stale). Nothing was sent."
        )
    return (
        f"step {table}.{step} sends its requests to {own_api(provider)}, and this call would send them to {sending} "
        "(base_url=): drop base_url= to finish it there, or move the step with apply_llm(..., base_url=...) "
        "(its answers then turn stale). Nothing was sent."
    )


def provider_refusal(table: str, step: str, recorded: str, sending: str) -> str | None:
    """Why a call with a client for `sending`'s API may not finish a step whose requests are `recorded`'s."""
    if recorded == sending:
        return None
    return (
        f"step {table}.{step} sends its requests to {own_api(recorded)}, and this call has a client for "
        f"{own_api(sending)}: let resume make the client (pass no client=), or move the step with apply_llm(..., "
        "model=...) (its answers then turn stale). Nothing was sent."
    )


def step_refusal(plan: Plan, sent: Any) -> str | None:
    """Why `plan` may not send the requests `sent` (the step's `RequestSpec`): another API, or another server."""
    return provider_refusal(plan.table, plan.step, sent.provider, plan.provider) or endpoint_refusal(
        plan.table, plan.step, sent.endpoint, plan.endpoint, sent.provider
    )


def compatible_note(endpoint: str, concurrency: int, *, priced: bool, provider: str = ANTHROPIC) -> str:
    """What a run on another server does differently, said once in its report."""
    price = "" if priced else ", and its answers cost NULL unless llmledger.set_price names a price for the model"
    batches = "a Batch API" if provider == OPENAI else "Message Batches"
    return (
        f"{endpoint} is not {own_api(provider)}: it announces no rate limits, so the requests in flight followed its "
        f"answers (at most concurrency={concurrency}); it has no {batches} (mode='auto' stays online){price}."
    )


NO_KEY = "llmledger-no-key"  # what a base_url= server gets as its key when none is passed (most ignore it)


def client_for(client: Any, base_url: Any, api_key: Any, provider: str = ANTHROPIC) -> tuple[Any, str | None]:
    """The client a call sends with, and the endpoint its requests name: None for the provider's own API (Anthropic's,
    or OpenAI's for `model="openai:..."`) or a simulator, which answer as that API does (batches, rate-limit
    headers, prices), so requests to them name none.

    `base_url=` is another server that answers the provider's API (vLLM, Ollama, llama.cpp's server, a LiteLLM
    proxy, a gateway; for OpenAI's, OpenRouter, Together, Groq, Gemini's endpoint). It gets `api_key=`, or a
    placeholder: never the environment's key, which goes only to the provider's own URL. `api_key=` alone is a key
    for the provider's own API.
    """
    for name, value in (("base_url", base_url), ("api_key", api_key)):
        if value is not None and client is not None:
            raise InvalidInputError(
                f"pass either client= or {name}=, not both (a client already says where it sends, and with "
                f"what key): e.g. anthropic.AsyncAnthropic(base_url=..., api_key=...) as client=, or {name}= alone"
            )
        if value is not None and (not isinstance(value, str) or not value.strip()):
            got = "a blank string" if isinstance(value, str) else type(value).__name__  # a key is never echoed
            raise InvalidInputError(f"{name} must be a non-empty string, got {got}")
    if provider == OPENAI:
        return _openai_client(client, base_url, api_key)
    if client is not None and not isinstance(client, anthropic.AsyncAnthropic):
        raise InvalidInputError(
            f"client must be an anthropic.AsyncAnthropic (llmledger sends rows concurrently), "
            f"got {type(client).__name__}; e.g. anthropic.AsyncAnthropic(api_key=...)"
            + (" (an OpenAI client sends a model named 'openai:...')" if is_openai_client(client) else "")
        )
    if base_url is None and api_key is None:
        return client, None
    if base_url is None:
        return anthropic.AsyncAnthropic(api_key=api_key, max_retries=0), None
    check_base_url(base_url)
    made = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key or NO_KEY, max_retries=0)
    endpoint = _endpoint(made, base_url, ANTHROPIC_API)
    if endpoint is None and api_key is None and answer_source(made) != SIMULATOR:
        made = anthropic.AsyncAnthropic(base_url=base_url, max_retries=0)  # Anthropic's own URL: the usual key
    return made, endpoint


def _openai_client(client: Any, base_url: Any, api_key: Any) -> tuple[Any, str | None]:
    """`client_for` a model named "openai:...": an `openai.AsyncOpenAI`, made here unless one is passed."""
    sdk = openai_sdk()
    if client is not None:
        if not isinstance(client, sdk.AsyncOpenAI):
            raise InvalidInputError(
                f"model='openai:...' sends with an openai.AsyncOpenAI client, got {type(client).__name__}; e.g. "
                "openai.AsyncOpenAI(api_key=...), or base_url=/api_key= alone"
            )
        return client, _endpoint(client, str(client.base_url), OPENAI_API)
    if base_url is None:
        if simulated():  # llmledger.simulate(): the session's simulator answers OpenAI's routes too
            return make_client(base_url=session_base_url() + "/v1", api_key="simulated"), None
        # the SDK's own environment, URL and key set together (a server there is named, as base_url= would)
        base_url = os.environ.get("OPENAI_BASE_URL") or OPENAI_API
        made = make_client(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY)
        return made, _endpoint(made, base_url, OPENAI_API)
    check_base_url(base_url)
    made = make_client(base_url=base_url, api_key=api_key or NO_KEY)
    endpoint = _endpoint(made, base_url, OPENAI_API)
    if endpoint is None and api_key is None and answer_source(made) != SIMULATOR:
        made = make_client(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or NO_KEY)  # its own URL
    return made, endpoint


def _endpoint(client: Any, base_url: str, own_api: str) -> str | None:
    """The endpoint a request to `base_url` names: none for the provider's own API or a simulator on this machine."""
    source = answer_source(client)
    if source == SIMULATOR:  # a simulator's path on another host is a server like any other
        return None if _loopback(base_url) else endpoint_url(base_url)
    return None if source == own_api else source


def check_base_url(base_url: str) -> None:
    """Refuse a base_url= the SDK could not send to, or that would carry a secret into messages and the ledger."""
    example = "such as 'http://localhost:8000' (vLLM) or 'http://localhost:11434' (Ollama)"
    problem = None
    try:
        parts = urlsplit(base_url)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError as exc:
        parts, port, problem = None, None, str(exc)
    if problem is None and parts is not None:
        if base_url != base_url.strip() or any(c.isspace() or ord(c) < 32 for c in base_url):
            problem = "it holds spaces or control characters"
        elif parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            problem = "it is not an http(s) URL with a host"
        elif parts.username is not None or parts.password is not None:
            problem = "it holds credentials (user:password@): pass the key as api_key= instead"
        elif parts.query or parts.fragment:
            problem = "it has a query or fragment, which the SDK would put before /v1/messages"
        elif port == 0:
            problem = "port 0 is no server's port"
    if problem is not None:
        raise InvalidInputError(
            f"base_url must be the http(s) URL of a server that answers the Messages API, {example}; "
            f"{shown_url(base_url)!r} is not: {problem}"
        )


def _loopback(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def credentials_missing(client: Any = None) -> bool:
    """No client, no key in the environment, and not pointed at the simulator: a run could send nothing."""
    if is_openai_client(client):  # a key for OpenAI's own API (another server may need none)
        return client.api_key == NO_KEY and answer_source(client) == OPENAI_API
    return client is None and not (
        simulated() or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
    )


def check_credentials(client: Any) -> None:
    """A call that will send needs a key: say so before anything is written (estimate sends nothing)."""
    if is_openai_client(client) and credentials_missing(client):
        raise InvalidInputError(
            "no OpenAI API key: set OPENAI_API_KEY (or pass api_key=, or client=openai.AsyncOpenAI(api_key=...)). "
            "To try llmledger offline, call llmledger.simulate() first: it answers OpenAI's API too"
        )
    if credentials_missing(client):
        raise InvalidInputError(
            "no API key: set ANTHROPIC_API_KEY (or pass client=anthropic.AsyncAnthropic("
            "api_key=...)). To try llmledger offline, call llmledger.simulate() first: "
            "apply_llm then answers from the bundled simulator (simulated answers, no cost)"
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
