"""`apply_llm` and `resume`: check the call, then run what the ledger says still needs running.

Every check happens before anything is written: the options in `plan.py` (the client and its server in
`endpoints.py`), the frame and its key in `frames.py`; a bad call raises an `InvalidInputError` naming the
offending value and leaves no trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import polars as pl

from llmledger._exec.apis.chat import own_rules as own_rules_of
from llmledger._exec.client import DEFAULT_MODEL
from llmledger._exec.config import RetryPolicy
from llmledger._ledger import DEFAULT_STORE, DEFAULT_TABLE, StepDefinition, known_table, locate, stored_requests
from llmledger._ledger.columns import MAX_STEP_NAME, check_step_name
from llmledger._ledger.parquet import is_parquet_path, read_parquet_input
from llmledger._report import RunReport
from llmledger._run.choices import check_no_cache_ttl, check_responses_bound, choose_api, responses_prefix
from llmledger._run.endpoints import check_credentials
from llmledger._run.frames import (
    as_polars,
    check_frame_columns,
    check_identifier,
    exact_keys,
    index_names,
    resolve_key,
    storable,
)
from llmledger._run.lifecycle import warn_if_retiring
from llmledger._run.options import RunOptions, Validator
from llmledger._run.plan import (
    Plan,
    cache_ttl,
    check_budget_countable,
    check_flex,
    check_no_nul,
    null_fields,
    plan_options,
    step_refusal,
)
from llmledger._run.run import Run, set_last_report
from llmledger._step.apis import ANTHROPIC, OPENAI, shape_of
from llmledger._step.attach import absolute_paths
from llmledger._step.messages import attachments as attachments_of
from llmledger._step.messages import cached, check_prefix, prompt_and_prefix
from llmledger._step.output import output_spec
from llmledger._step.packing import check_rows_per_request
from llmledger._step.prices import warn_unpriced
from llmledger._step.prompt import Prompt, check_prompt, plan_prompt
from llmledger._step.request import (
    RequestSpec,
    check_max_tokens,
    check_model,
    check_request_options,
    split_model,
)
from llmledger._view.live import make_display
from llmledger.errors import InvalidInputError, StepNameError

if TYPE_CHECKING:  # the SDK is imported where a run sends: `import llmledger` and the CLI's readers do without it
    import anthropic


F = TypeVar("F", bound=Callable[..., Any])

# Request fields a user may pass as if they were options: they go in request_options= (what the API's body holds).
_REQUEST_FIELDS = frozenset(
    """
    temperature top_p top_k stop stop_sequences seed reasoning reasoning_effort thinking metadata service_tier
    tools tool_choice response_format text presence_penalty frequency_penalty logit_bias user store
    max_completion_tokens max_output_tokens
    """.split()  # noqa: SIM905
)


def refuses_unknown_options(fn: F) -> F:
    """`fn` raising InvalidInputError (not a bare TypeError) for an option it does not take: a request field
    (`temperature=0`) is pointed to request_options=, another name to the option it is closest to."""
    parameters = inspect.signature(fn).parameters

    @functools.wraps(fn)
    def checked(*args: Any, **options: Any) -> Any:
        unknown = [name for name in options if name not in parameters]
        if unknown:
            name = unknown[0]
            if name in _REQUEST_FIELDS:
                raise InvalidInputError(
                    f"{fn.__name__}() has no option {name}=: a field of the request goes in request_options, "
                    f"e.g. request_options={{{name!r}: {options[name]!r}}} (see the docs' request options)"
                )
            close = difflib.get_close_matches(name, list(parameters), n=1)
            hint = f"; did you mean {close[0]}=?" if close else ""
            raise InvalidInputError(f"{fn.__name__}() has no option {name}={hint} (its options: help({fn.__name__}))")
        return fn(*args, **options)

    return cast(F, checked)


@refuses_unknown_options
def apply_llm(
    df: Any,
    step: str,
    *,
    prompt: Prompt | None = None,
    messages: list[dict[str, Any]] | None = None,
    attach: str | Sequence[str] | None = None,
    key: str | Sequence[str] | None = None,
    store: str | Path = DEFAULT_STORE,
    table: str | None = None,
    model: str = DEFAULT_MODEL,
    system: str | None = None,
    max_tokens: int = 1024,
    rows_per_request: int = 1,
    chunk_size: int = 200,
    concurrency: int = 16,
    where: str | None = None,
    skip_nulls: bool = False,
    redo: bool | Literal["all", "stale", "flagged"] = False,
    max_attempts: int = 3,
    stale_after: timedelta | float = timedelta(minutes=30),
    client: anthropic.AsyncAnthropic | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    gateway: bool = False,
    api: Literal["responses", "chat"] | None = None,
    progress: bool = True,
    retry: RetryPolicy | None = None,
    commit_every: float = 0.5,
    request_options: dict[str, Any] | None = None,
    dedupe: bool = True,
    background: bool = False,
    output: Any = None,
    validate: Validator | None = None,
    cache: bool | Literal["5m", "1h"] = True,
    max_cost_usd: float | None = None,
    budget_scope: Literal["run", "step"] = "run",
    mode: Literal["online", "batch", "auto", "flex"] = "online",
    wait: bool = True,
    batch_size: int | None = None,
    deadline: datetime | timedelta | float | None = None,
) -> Any:
    """Run `prompt` through the model for every row of `df` that the ledger does not have yet.

    Returns `df` in its order with `{step}` (the answer), `{step}_status` and `{step}_stale` (a DONE answer made
    for a request that has changed since) appended. Rows already DONE cost nothing; see the README for the
    status model. With `background=True` it returns a `Run` handle at once instead.

    **What to ask**

    - `df`: a polars or pandas DataFrame, or the path of a Parquet file (read lazily: only the columns the step
      needs).
    - `step`: the step's name; its answers are the columns `{step}`, `{step}_status`, ... of the fact table.
    - `prompt`: a template such as `"Classify: {text}"` (column names in braces; `{other_step}` reads an earlier
      step's answer and `{extract.company}` a field of a typed one), or a callable(row) -> str.
    - `messages`: instead of `prompt=`, a conversation sent before each row's message, the last message being the
      row's own (a template, as `prompt=` is), e.g. few-shot examples, or a shared text then the row's question.
      With `cache=`, the messages before the row's are sent as a cached prefix.
    - `attach`: a column, or a list of columns, of file paths, http(s) URLs or bytes: each row's files (PNG, JPEG,
      GIF and WebP images and PDFs) are sent before its text. The ledger records each file by the SHA-256 of its
      bytes, and a path made absolute from the folder `apply_llm` runs in: a changed file makes its row stale, and
      an unchanged one is never paid for again.
    - `system`: the system prompt, the same for every row.
    - `output`: a pydantic model, or a mapping such as `{"company": str, "year": int | None}`: asks for JSON of
      that shape and stores it as a STRUCT column (a polars Struct here). An answer that does not match is retried
      once with the reason, then left NEEDS_REVIEW with its raw text in `{step}_raw`.
    - `validate`: callable(row, output) returning a string marks the row NEEDS_REVIEW with that reason, keeping
      the answer.
    - `request_options`: other fields of the API's request body (`temperature`, `stop_sequences`, `reasoning`,
      ...), as the API spells them; they are part of each row's request and of its fingerprint.
    - `max_tokens`: the most tokens an answer may have (default 1,024).
    - `rows_per_request`: rows sent together in one request (default 1, at most 100), each answered on its own:
      the request asks for one JSON entry per row, and an entry that is missing, duplicated, misaligned or out of
      shape fails only its row, which is asked again alone. Each row pays its share of the request. The setting is
      part of each row's request: changing it makes the step's answers stale. Online and in batches; not with
      `attach=`. The how-to *Pack rows into one request* says when it pays and when it hurts.

    **Where rows live**

    - `key`: the column (or columns) naming a row across calls (default: `id`, or the key the table recorded, or
      a pandas index). Never the row's position: a reordered frame pays for nothing again.
    - `store`: a DuckDB file (default `llmledger.duckdb` in the working folder) or a `postgresql://` URL.
    - `table`: the fact table (default `ledger`, which refuses a frame that would rewrite answered rows' inputs).
    - `where`: a SQL predicate over the fact table narrowing the rows sent (it may call only pure functions; the
      status model reference lists the rules).
    - `skip_nulls`: a null in a column the template reads shows as empty text, and the run says how many rows had
      one; `True` leaves those rows unsent (NOT_STARTED) instead.
    - `redo`: `False` sends only rows without a current answer; `"stale"` also those whose answer is to an older
      request; `"flagged"` the rows a person flagged (`llmledger.flag`); `True` (or `"all"`) every row selected.
    - `dedupe`: rows with identical requests share one call (default `True`).

    **Which model, and where it runs**

    - `model`: a Claude model (default the cheapest current one), or `"openai:<model>"`; `llmledger.models()`
      lists them.
    - `client`: an SDK client to send with: `anthropic.AsyncAnthropic`, `openai.AsyncOpenAI`, or a cloud's
      (`AsyncAnthropicBedrock`, `AsyncAnthropicVertex`, `AsyncAzureOpenAI`; online, and Azure's batches).
    - `base_url`: another server that answers the API (vLLM, Ollama, llama.cpp's server, a LiteLLM proxy, a
      gateway), with `api_key=` if it needs one (never the environment's ANTHROPIC_API_KEY). Its URL becomes part
      of each request, so its answers are never taken for Anthropic's (nor another server's), and moving a step
      to another server makes its answers stale. Such servers have no batches (`mode="auto"` stays online,
      `mode="batch"` is refused) and usually no prices (cost is NULL unless `llmledger.set_price` names one).
      `ANTHROPIC_BASE_URL` (`OPENAI_BASE_URL` for an OpenAI model) and a `client=` pointed at another server name
      it the same way.
    - `api_key`: the key for `base_url=`.
    - `gateway`: declares `base_url=` a gateway to the provider's own API (a LiteLLM proxy, Portkey, Helicone,
      Cloudflare AI Gateway): its requests still name it, and the run uses what the provider has through it:
      batches, prices, and its rate-limit headers where the gateway forwards them. Without `api_key=` it gets
      the environment's key, which such a gateway forwards.
    - `api`: for an OpenAI model, `"responses"` (the default on OpenAI's own API, its recommended one) or
      `"chat"` (Chat Completions). A step made with Chat Completions stays there unless `api="responses"` moves it
      (its answers then turn stale, reported and not paid). Another server (`base_url=`) uses Chat Completions.
    - `cache`: `True` ("5m"), `"1h"` or `False`: sends a system prompt (and `messages=` prefix) long enough for
      the model's prompt cache as a cached prefix, so every row after the first pays a tenth for it.

    **How it runs**

    - `concurrency`: requests in flight at once (default 16, at most 1,000).
    - `chunk_size`: rows claimed and committed together (default 200).
    - `max_attempts`: tries per row before a refused or unreadable answer leaves it NEEDS_REVIEW (default 3).
    - `retry`: a `RetryPolicy`: how hard to retry the API's own failures (429, 529, 5xx, dropped connections)
      and when an outage stops the run.
    - `stale_after`: a claim not renewed for this long (a timedelta or seconds; default 30 minutes) is a dead
      run's, and another run takes its rows back.
    - `commit_every`: seconds between commits of the answers that arrived (default 0.5); each answer is also
      journaled the moment it arrives.
    - `progress`: show the live view and the summary (default `True`).
    - `background`: return a `Run` handle at once (`progress()`, `wait()`, `cancel()`); the run goes on in a
      thread of its own.

    **Money and batches**

    - `max_cost_usd`: stops starting requests once the run (or, with `budget_scope="step"`, every run of this step
      so far) has spent that much; unsent rows stay as they were. Refused for a model of unknown price.
    - `budget_scope`: `"run"` (default) or `"step"`.
    - `mode`: `"online"` (default); `"batch"` sends the rows as Message Batches, or OpenAI's Batch API for an
      OpenAI model (half the price; answers within 24 h, usually minutes), the rows SUBMITTED until their batch
      ends; `"auto"` sends in batches when there are AUTO_BATCH_ROWS (10,000) rows or more to send; `"flex"`
      sends online at OpenAI's flex tier (`service_tier="flex"`, for the `openai:` models that offer it: half the
      price, slower answers, and at times a 429 "Resource Unavailable", which is retried and never counts against
      a row). The tier is not part of a row's request: flex and standard answers stand in for each other.
    - `wait`: with batches, `True` polls until every batch of the step has ended and returns the answers;
      `False` returns once they are submitted, and any later call of the step (this one again, `resume`,
      `llmledger run`) collects them.
    - `batch_size`: requests per batch (default and most 100,000; 50,000 for OpenAI); with `rows_per_request`,
      each request is a pack.
    - `deadline`: when the rows must be answered by (a datetime, naive ones in local time; a timedelta or seconds
      from now; at most 366 days). With `mode="batch"`: at the last moment that leaves time to answer the rest
      online, the batches still processing are cancelled, what they finished kept, and their other rows sent
      online (with `wait=False` the deadline is stored with the batches, and the call that collects them keeps
      it; a later call's earlier deadline moves it up, never back). With
      `mode="flex"`: the rows go at the flex tier while the pace so far finishes them in time, and at the
      standard tier once it would not. The summary says what the deadline cost.
    """
    plan = checked_plan(dict(locals()))
    check_credentials(plan.client)
    run = Run(plan, watch=make_display)
    if background:
        return run.start_background()
    return run.execute(foreground=True)


def checked_plan(o: dict[str, Any]) -> Plan:
    """apply_llm's arguments (`o`, by name), checked and turned into a Plan; nothing is written."""
    df, step, key, store = o["df"], o["step"], o["key"], o["store"]
    table = DEFAULT_TABLE if o["table"] is None else o["table"]
    model, system, max_tokens, validate, where = o["model"], o["system"], o["max_tokens"], o["validate"], o["where"]
    prompt, prefix = prompt_and_prefix(o.get("prompt"), o.get("messages"))
    if is_parquet_path(df):
        df = read_parquet_input(
            df, key=key, prompt=prompt, where=where, every_column=validate is not None or o.get("attach") is not None
        )
    frame, from_pandas = as_polars(df)
    check_identifier(step, "step", StepNameError, 'e.g. "summary" or "sentiment_v2"')
    check_identifier(table, "table", InvalidInputError, 'e.g. "messages"')
    check_frame_columns(frame.columns)
    stored_steps, stored_columns, table_key, batched = known_table(store, table)
    if key is None and "id" not in frame.columns and table_key and all(k in frame.columns for k in table_key):
        key = table_key  # the table records its key: a later call need not name it
    keys = resolve_key(frame, key, step, index=index_names(df) if from_pandas else [])
    # `earlier_steps`: a pipeline's checks before its first step runs name the steps that will exist by then
    steps = [s for s in dict.fromkeys([*stored_steps, *o.get("earlier_steps", ())]) if s != step]
    if step not in stored_steps and len(step) > MAX_STEP_NAME:  # a store may move to PostgreSQL (`copy`)
        raise StepNameError(
            f"step name {step!r} is {len(step)} characters long; at most {MAX_STEP_NAME} fit, "
            f"because its columns (such as {step + '_upstream_fingerprint'!r}) must fit "
            "PostgreSQL's 63-byte names. Nothing was written."
        )
    check_step_name(
        step,
        table=table,
        other_steps=steps,
        is_new=step not in stored_steps,
        table_columns=stored_columns,
        frame_columns=frame.columns,
    )
    check_prompt(prompt, frame.columns, steps)
    check_prefix(prefix, frame.columns)
    if not isinstance(model, str) or not model:
        raise InvalidInputError(f"model must be a model name such as {DEFAULT_MODEL!r}, got {model!r}")
    check_model(model)
    provider, model = split_model(model)
    recorded = stored_requests(store, table).get(step) if step in stored_steps and provider == OPENAI else None
    api = choose_api(o, provider, recorded=recorded)
    shape = shape_of(provider, api)
    if shape.caches_itself:
        check_no_cache_ttl(o["cache"], shape)
    check_rows_per_request(o["rows_per_request"], attach=o.get("attach"))
    frame, attachments = attachments_of(o.get("attach"), frame, prompt, steps, keys, shape.name)
    check_max_tokens(max_tokens)
    if system is not None and not isinstance(system, str):
        raise InvalidInputError(f"system must be a string, got {type(system).__name__}")
    options = check_request_options(o["request_options"], provider, api)
    if api == "responses":
        check_responses_bound(max_tokens)
        options.setdefault("store", False)  # each row's request stands alone: OpenAI keeps no copy for 30 days
    check_no_nul(prompt, system, options, prefix)
    field, packed = shape.structured_field, o["rows_per_request"]
    if packed > 1 and field in options and not (field == "text" and "format" not in options[field]):
        raise InvalidInputError(  # a pack's request asks for its own JSON there: the user's would be dropped
            f"rows_per_request={packed} asks for each pack's answer as JSON in request_options[{field!r}], so "
            f"yours would be replaced; give the shape of each row's answer as output= instead. Nothing was written."
        )
    spec = output_spec(o["output"])
    if spec is not None:
        if shape.structured_field in options:  # refused in request_options where apply_llm sets it itself
            raise InvalidInputError(
                f"pass the output schema either as output= or as request_options[{shape.structured_field!r}], not both"
            )
        options[shape.structured_field] = shape.structured(spec)
    ttl = cache_ttl(o["cache"], model, system, prefix)  # checks cache= for either provider
    if shape.caches_itself:  # such an API caches long prefixes by itself: no breakpoint is sent
        ttl = None
    plan = plan_options(
        RunOptions.of(o),
        store=store,
        table=table,
        step=step,
        provider=provider,
        api=api,
        output_model=None if spec is None else spec.model,
        attachments=attachments,
    )
    request = RequestSpec(
        model=model,
        max_tokens=max_tokens,
        system=system,
        options=options,
        cache_ttl=None if prefix else ttl,
        prefix=cached(prefix, ttl) if api != "responses" else responses_prefix(prefix),
        attach=() if attachments is None else attachments.columns,
        provider=provider,
        api=api,
        # the server answering is part of the request (its fingerprint); a gateway to the provider's own API, or
        # Azure OpenAI, keeps the provider's own rules
        endpoint=plan.endpoint,
        own_rules=plan.endpoint is not None and (plan.gateway or (provider == OPENAI and own_rules_of(plan.client))),
        rows_per_request=o["rows_per_request"],
    )
    stored = storable(exact_keys(frame, keys))
    if attachments is not None:  # the ledger keeps a file's hash, not its bytes; a path, made absolute
        stored = absolute_paths(stored, [c for c in attachments.columns if c in stored.columns and c not in keys])
        stored = stored.drop([c for c in attachments.columns if frame.schema[c] == pl.Binary])
    plan_of_prompt = dataclasses.replace(plan_prompt(prompt, frame, steps), attachments=attachments)
    definition = StepDefinition(table=table, step=step, key=keys, request=request, prompt=plan_of_prompt)
    definition, nulls = null_fields(prompt, stored, definition, o.get("skip_nulls", False), plan.where)
    plan = dataclasses.replace(  # the call's step: made once, its parts checked above
        plan,
        df=df,
        user_frame=frame,
        frame=stored,
        from_pandas=from_pandas,
        definition=definition,
        default_table=o["table"] is None,
        batches_open=step in batched,
        where=nulls.where,
        null_fields=nulls.fields,
        null_rows=nulls.rows,
        skip_nulls=nulls.skip,
    )
    check_budget_countable(plan.cfg.max_cost_usd, model)
    check_flex(plan.mode, model)
    warn_unpriced(model)  # every check passed: the call will run
    warn_if_retiring(model, provider=provider, client=plan.client, endpoint=plan.endpoint, gateway=plan.gateway)
    return plan


async def apply_llm_async(df: Any, step: str, **options: Any) -> Any:
    """`await apply_llm_async(df, step, prompt=...)`: the same call, without blocking the caller's event loop.

    Cancelling the awaiting task stops the run like Ctrl-C.
    """
    if options.pop("background", False):
        raise InvalidInputError("apply_llm_async takes no background=; use apply_llm(..., background=True)")
    run = apply_llm(df, step, background=True, **options)
    try:
        return await asyncio.to_thread(run.wait)
    except asyncio.CancelledError:
        await asyncio.to_thread(run.cancel)
        raise
    finally:
        set_last_report(run.report)


@refuses_unknown_options
def resume(
    store: str | Path,
    table: str,
    step: str,
    *,
    where: str | None = None,
    redo: bool | Literal["all", "stale", "flagged"] = False,
    concurrency: int = 16,
    chunk_size: int = 200,
    max_attempts: int = 3,
    stale_after: timedelta | float = timedelta(minutes=30),
    client: anthropic.AsyncAnthropic | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    gateway: bool = False,
    progress: bool = True,
    retry: RetryPolicy | None = None,
    commit_every: float = 0.5,
    dedupe: bool = True,
    background: bool = False,
    validate: Validator | None = None,
    max_cost_usd: float | None = None,
    budget_scope: Literal["run", "step"] = "run",
    mode: Literal["online", "batch", "auto", "flex"] = "online",
    wait: bool = True,
    batch_size: int | None = None,
    deadline: datetime | timedelta | float | None = None,
) -> Any:
    """Finish a step that `apply_llm` started, from the store alone (after a kill, a closed laptop, a lost kernel).

    Sends the rows of `table`.`step` that still need an answer, each with the request apply_llm recorded for it,
    with the same guarantees as apply_llm. Returns the run's `RunReport` (a `Run` handle with `background=True`);
    rerunning the notebook cell afterwards pays nothing for the rows finished here. Message Batches the step sent
    earlier are collected first, whatever `mode` this call sends in.

    - `store`, `table`, `step`: where the step lives, as apply_llm named them.
    - `where`, `redo`, `dedupe`: which rows are sent, as in apply_llm.
    - `concurrency`, `chunk_size`, `max_attempts`, `retry`, `stale_after`, `commit_every`, `progress`,
      `background`: how it runs, as in apply_llm (their defaults are apply_llm's too).
    - `client`, `base_url`, `api_key`, `gateway`: what it sends with. The step's requests name their server:
      a step sent through another server (or a gateway, `gateway=True`) is finished through it with the same
      `base_url=`, and a call that names another is refused.
    - `validate`: structured answers are checked against the schema the step's requests carry; pass the same
      `validate=` as apply_llm to apply it here too (a pydantic model's own validators run only in apply_llm).
    - `max_cost_usd`, `budget_scope`: a budget, as in apply_llm.
    - `mode`, `wait`, `batch_size`, `deadline`: online, in batches or at the flex tier, as in apply_llm.
    """
    check_identifier(step, "step", StepNameError, 'e.g. "summary"')
    check_identifier(table, "table", InvalidInputError, 'e.g. "messages"')
    options = RunOptions.of(locals()).checked()
    recorded = stored_requests(store, table).get(step)
    plan = plan_options(
        options,
        store=store,
        table=table,
        step=step,
        provider=ANTHROPIC if recorded is None else recorded.provider,  # the client speaks the step's API
        api=None if recorded is None else recorded.api,
    )
    locate(plan.store, must_exist=True)
    problem = None if recorded is None else step_refusal(plan, recorded)
    if problem is not None:
        raise InvalidInputError(problem)
    check_credentials(plan.client)
    if recorded is not None:
        check_budget_countable(plan.cfg.max_cost_usd, recorded.model)
        check_rows_per_request(recorded.rows_per_request, attach=None)
        check_flex(plan.mode, recorded.model)
        warn_if_retiring(
            recorded.model, provider=recorded.provider, client=plan.client, endpoint=plan.endpoint, gateway=gateway
        )
    run = Run(plan, watch=make_display)
    if background:
        return run.start_background()
    result = run.execute(foreground=True)
    assert isinstance(result, RunReport)
    return result


# -- input checks ---------------------------------------------------------------------------------
