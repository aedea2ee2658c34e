"""`apply_llm` and `resume`: check the call, then run what the ledger says still needs running.

Every check here happens before anything is written: a bad call raises an
`InvalidInputError` naming the offending value and leaves no trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anthropic
import polars as pl

from llmledger._exec.batch import MAX_REQUESTS
from llmledger._exec.client import DEFAULT_MODEL, simulated
from llmledger._exec.config import RetryPolicy, RunConfig
from llmledger._ledger import DEFAULT_STORE, DEFAULT_TABLE, StepDefinition, known_table, locate
from llmledger._ledger.columns import KEY_RESERVED, MAX_STEP_NAME, NAME_BYTES, check_step_name, owned_names
from llmledger._ledger.parquet import is_parquet_path, read_parquet_input
from llmledger._ledger.states import Redo
from llmledger._ledger.where import check_where_shape
from llmledger._report import RunReport
from llmledger._run.run import Plan, Run, set_last_report
from llmledger._step.messages import attachments as attachments_of
from llmledger._step.messages import cached, check_prefix, message_text, prompt_and_prefix
from llmledger._step.output import output_spec
from llmledger._step.prices import estimate_tokens, min_cacheable_tokens, warn_unpriced
from llmledger._step.prompt import Prompt, check_prompt, plan_prompt, template_fields
from llmledger._step.request import RequestSpec, check_max_tokens, check_request_options
from llmledger._step.sqltext import q
from llmledger._view.live import make_display
from llmledger.errors import InvalidInputError, KeyColumnError, StepNameError

Validator = Callable[[dict[str, Any], Any], str | None]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


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
    chunk_size: int = 200,
    concurrency: int = 16,
    where: str | None = None,
    skip_nulls: bool = False,
    redo: bool | Literal["stale", "flagged"] = False,
    max_attempts: int = 3,
    stale_after: timedelta | float = timedelta(minutes=30),
    client: anthropic.AsyncAnthropic | None = None,
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
    mode: Literal["online", "batch", "auto"] = "online",
    wait: bool = True,
    batch_size: int | None = None,
) -> Any:
    """Run `prompt` through the model for every row of `df` that the ledger does not have yet.

    Returns `df` in its order with `{step}` (the answer), `{step}_status` and `{step}_stale` (a DONE answer made
    for a request that has changed since) appended. Rows already DONE cost nothing; see the README for the
    status model. With `background=True` it returns a `Run` handle at once instead.

    `messages=` instead of `prompt=`: a conversation sent before each row's message, the last message being the
    row's own (a template, as `prompt=` is), e.g. few-shot examples, or a shared text then the row's question.
    With `cache=`, the messages before the row's are sent as a cached prefix.

    `attach=` (a column, or a list of columns, of file paths, http(s) URLs or bytes) sends each row's files, PNG,
    JPEG, GIF and WebP images and PDFs, before its text. The ledger records each file by the SHA-256 of its
    bytes, not its path: a changed file makes its row stale, and an unchanged one is never paid for again.

    A null in a column the template reads shows as empty text, and the run says how many rows had one;
    `skip_nulls=True` leaves those rows unsent (NOT_STARTED) instead.

    `output=` (a pydantic model, or a mapping such as `{"company": str, "year": int | None}`)
    asks for JSON of that shape and stores it as a STRUCT column (a polars Struct here);
    an answer that does not match is retried once with the reason, then left NEEDS_REVIEW
    with its raw text in `{step}_raw`. `validate=callable(row, output)` returning a string
    marks the row NEEDS_REVIEW with that reason, keeping the answer.

    `cache=` (True: "5m"; or "1h"; False: off) sends a system prompt long enough for the model's
    prompt cache as a cached prefix, so every row after the first pays a tenth for it.

    `max_cost_usd=` stops starting requests once the run (or, with `budget_scope="step"`, every run
    of this step so far) has spent that much; unsent rows stay as they were.

    `mode="batch"` sends the rows as Message Batches (half the price; answers within 24 h, usually
    minutes) of up to `batch_size` requests (default 100,000); the rows are SUBMITTED until their batch ends.
    `wait=True` polls until every batch of the step has ended and returns the answers;
    `wait=False` returns once they are submitted, and any later call of the step (this one
    again, `resume`, `llmledger run`) collects them. `mode="auto"` sends in batches when there
    are AUTO_BATCH_ROWS (10,000) rows or more to send, online otherwise.
    """
    plan = checked_plan(dict(locals()))
    _check_credentials(plan.client)
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
    frame, from_pandas = _as_polars(df)
    _check_identifier(step, "step", StepNameError, 'e.g. "summary" or "sentiment_v2"')
    _check_identifier(table, "table", InvalidInputError, 'e.g. "messages"')
    _check_frame_columns(frame.columns)
    keys = _resolve_key(frame, key, step, index=_index_names(df) if from_pandas else [])
    # `earlier_steps`: a pipeline's checks before its first step runs name the steps that will exist by then
    stored_steps, stored_columns = known_table(store, table)
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
    frame, attachments = attachments_of(o.get("attach"), frame, prompt, steps, keys)
    if not isinstance(model, str) or not model:
        raise InvalidInputError(f"model must be a model name such as {DEFAULT_MODEL!r}, got {model!r}")
    check_max_tokens(max_tokens)
    if system is not None and not isinstance(system, str):
        raise InvalidInputError(f"system must be a string, got {type(system).__name__}")
    options = check_request_options(o["request_options"])
    _check_no_nul(prompt, system, options, prefix)
    spec = output_spec(o["output"])
    if spec is not None:
        if "output_config" in options:
            raise InvalidInputError(
                "pass the output schema either as output= or as request_options['output_config'], not both"
            )
        options["output_config"] = spec.request_option()
    _check_validator(validate)
    ttl = _cache_ttl(o["cache"], model, system, prefix)
    request = RequestSpec(
        model=model,
        max_tokens=max_tokens,
        system=system,
        options=options,
        cache_ttl=None if prefix else ttl,
        prefix=cached(prefix, ttl),
        attach=() if attachments is None else attachments.columns,
    )
    stored = _storable(exact_keys(frame, keys))
    if attachments is not None:  # the ledger keeps a file's hash, not its bytes
        stored = stored.drop([c for c in attachments.columns if frame.schema[c] == pl.Binary])
    plan_of_prompt = dataclasses.replace(plan_prompt(prompt, frame, steps), attachments=attachments)
    definition = StepDefinition(table=table, step=step, key=keys, request=request, prompt=plan_of_prompt)
    plan = _plan(
        store=store,
        table=table,
        step=step,
        chunk_size=o["chunk_size"],
        concurrency=o["concurrency"],
        where=where,
        redo=o["redo"],
        max_attempts=o["max_attempts"],
        stale_after=o["stale_after"],
        client=o["client"],
        progress=o["progress"],
        retry=o["retry"],
        commit_every=o["commit_every"],
        dedupe=o["dedupe"],
        validate=validate,
        output_model=None if spec is None else spec.model,
        max_cost_usd=o["max_cost_usd"],
        budget_scope=o["budget_scope"],
        mode=o.get("mode", "online"),
        wait=o.get("wait", True),
        batch_size=o.get("batch_size"),
    )
    plan = dataclasses.replace(
        plan,
        df=df,
        user_frame=frame,
        frame=stored,
        from_pandas=from_pandas,
        definition=definition,
        cfg=dataclasses.replace(plan.cfg, attachments=attachments),
        default_table=o["table"] is None,
    )
    plan = _null_fields(plan, prompt, o.get("skip_nulls", False))
    warn_unpriced(model)  # every check passed: the call will run
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


def resume(
    store: str | Path,
    table: str,
    step: str,
    *,
    where: str | None = None,
    redo: bool | Literal["stale", "flagged"] = False,
    concurrency: int = 16,
    chunk_size: int = 200,
    max_attempts: int = 3,
    stale_after: timedelta | float = timedelta(minutes=30),
    client: anthropic.AsyncAnthropic | None = None,
    progress: bool = True,
    retry: RetryPolicy | None = None,
    commit_every: float = 0.5,
    dedupe: bool = True,
    background: bool = False,
    validate: Validator | None = None,
    max_cost_usd: float | None = None,
    budget_scope: Literal["run", "step"] = "run",
    mode: Literal["online", "batch", "auto"] = "online",
    wait: bool = True,
    batch_size: int | None = None,
) -> Any:
    """Finish a step that `apply_llm` started, from the store alone (after a kill, a closed laptop, a lost kernel).

    Sends the rows of `table`.`step` that still need an answer, each with the
    request apply_llm recorded for it, with the same guarantees as apply_llm.
    Returns the run's `RunReport` (a `Run` handle with `background=True`);
    rerunning the notebook cell afterwards pays nothing for the rows finished here. Structured
    answers are checked against the schema the step's requests carry; pass the same `validate=`
    as apply_llm to apply it here too (a pydantic model's own validators run only in apply_llm).
    Message Batches the step sent earlier are collected first, whatever `mode` this call sends in.
    """
    _check_identifier(step, "step", StepNameError, 'e.g. "summary"')
    _check_identifier(table, "table", InvalidInputError, 'e.g. "messages"')
    _check_validator(validate)
    plan = _plan(
        store=store,
        table=table,
        step=step,
        chunk_size=chunk_size,
        concurrency=concurrency,
        where=where,
        redo=redo,
        max_attempts=max_attempts,
        stale_after=stale_after,
        client=client,
        progress=progress,
        retry=retry,
        commit_every=commit_every,
        dedupe=dedupe,
        validate=validate,
        max_cost_usd=max_cost_usd,
        budget_scope=budget_scope,
        mode=mode,
        wait=wait,
        batch_size=batch_size,
    )
    locate(plan.store, must_exist=True)
    _check_credentials(plan.client)
    run = Run(plan, watch=make_display)
    if background:
        return run.start_background()
    result = run.execute(foreground=True)
    assert isinstance(result, RunReport)
    return result


# -- input checks ---------------------------------------------------------------------------------

MAX_CONCURRENCY = 1_000  # the SDK's connection pool holds 1,000; more would only queue inside it


def _plan(
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
) -> Plan:
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
    if client is not None and not isinstance(client, anthropic.AsyncAnthropic):
        raise InvalidInputError(
            f"client must be an anthropic.AsyncAnthropic (llmledger sends rows concurrently), "
            f"got {type(client).__name__}; e.g. anthropic.AsyncAnthropic(api_key=...)"
        )
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
        mode="online" if mode == "auto" and max_cost_usd is not None else mode,
        wait=wait,
        batch_size=MAX_REQUESTS if batch_size is None else batch_size,
    )


def credentials_missing(client: anthropic.AsyncAnthropic | None = None) -> bool:
    """No client, no key in the environment, and not pointed at the simulator: a run could send nothing."""
    return client is None and not (
        simulated() or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
    )


def _check_credentials(client: anthropic.AsyncAnthropic | None) -> None:
    """A call that will send needs a key: say so before anything is written (estimate sends nothing)."""
    if credentials_missing(client):
        raise InvalidInputError(
            "no API key: set ANTHROPIC_API_KEY (or pass client=anthropic.AsyncAnthropic("
            "api_key=...)). To try llmledger offline, call llmledger.simulate() first: "
            "apply_llm then answers from the bundled simulator (simulated answers, no cost)"
        )


def _cache_ttl(cache: Any, model: str, system: str | None, prefix: tuple[dict[str, Any], ...] = ()) -> str | None:
    """The ttl the static part of the request (system prompt and `messages=` prefix) is cached with: none when
    caching is off or that part is too short to cache."""
    if cache not in (True, False, "5m", "1h"):
        raise InvalidInputError(f"cache must be True (a 5-minute cache), '5m', '1h' or False, got {cache!r}")
    static = (system or "") + "".join(message_text(m) for m in prefix)
    if cache is False or not static or estimate_tokens(static) < min_cacheable_tokens(model):
        return None
    return "5m" if cache is True else cache


def _check_validator(validate: Any) -> None:
    if validate is not None and not callable(validate):
        raise InvalidInputError(f"validate must be a callable(row, output) -> None | str, got {validate!r}")


def _as_polars(df: Any) -> tuple[pl.DataFrame, bool]:
    if isinstance(df, pl.DataFrame):
        return df, False
    if isinstance(df, pl.LazyFrame):
        return df.collect(), False
    if type(df).__module__.split(".")[0] == "pandas" and type(df).__name__ == "DataFrame":
        paths = [
            c for c in df.columns if df[c].dtype == object and df[c].map(lambda v: isinstance(v, os.PathLike)).any()
        ]  # pathlib.Path values (attach=), which Arrow cannot hold
        if paths:
            df = df.assign(
                **{str(c): df[c].map(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v) for c in paths}
            )
        try:
            return pl.from_pandas(df), True
        except (TypeError, ValueError, pl.exceptions.PolarsError) as exc:  # pyarrow's errors are ValueErrors
            raise InvalidInputError(
                f"the pandas frame cannot become a polars frame: {type(exc).__name__}: {exc}. "
                "A column mixing types (paths and bytes, text and numbers) is the usual cause: "
                "make each column one type"
            ) from None
    raise InvalidInputError(
        f"df must be a Parquet path (or glob) or a polars or pandas DataFrame, got {type(df).__name__}"
    )


def _storable(frame: pl.DataFrame) -> pl.DataFrame:
    """The columns the ledger can store: no Python objects; all-null columns typed as text."""
    keep = [c for c, t in frame.schema.items() if t != pl.Object]
    out = frame.select(keep)
    nulls = [c for c, t in out.schema.items() if t == pl.Null]
    return out.with_columns(pl.col(nulls).cast(pl.String)) if nulls else out


# Key types that go through every path exactly (claim, commit, journal, history, export, copy; DuckDB and
# PostgreSQL). Others are refused before anything is written rather than half-working.
_KEY_TYPES = (
    pl.Int8,
    pl.Int16,
    pl.Int32,
    pl.Int64,
    pl.UInt8,
    pl.UInt16,
    pl.UInt32,
    pl.UInt64,
    pl.Float32,
    pl.Float64,
    pl.Boolean,
    pl.String,
    pl.Categorical,
    pl.Enum,
    pl.Date,
    pl.Datetime,
    pl.Time,
)


def exact_keys(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """`frame` with key columns of a type the ledger keeps exactly; KeyColumnError for any other.

    `Datetime("ns")` (what `pl.from_pandas` gives) is kept in microseconds, as PostgreSQL and Python's datetime
    hold it, when no value has digits below the microsecond; otherwise two rows could become one key.
    """
    for k in keys:
        dtype = frame.schema[k]
        if isinstance(dtype, pl.Datetime) and dtype.time_unit == "ns":
            column = frame[k]
            lossy = column.dt.nanosecond() % 1000 != 0
            if lossy.any():
                example = column.filter(lossy).cast(pl.String)[0]
                raise KeyColumnError(
                    f"key column {k!r} is Datetime('ns') and holds {example} (digits below the microsecond), which "
                    "the ledger cannot keep exactly (PostgreSQL and Python keep microseconds). Use another key, or "
                    f"make it text: df.with_columns(pl.col({k!r}).cast(pl.String))."
                )
            frame = frame.with_columns(column.dt.cast_time_unit("us"))
        elif dtype.base_type() not in _KEY_TYPES:
            raise KeyColumnError(
                f"key column {k!r} is {dtype}, which the ledger cannot keep exactly as a key. Keys may be integers, "
                "floats, booleans, text, categoricals, dates, datetimes or times; cast it, e.g. "
                f"df.with_columns(pl.col({k!r}).cast(pl.String)), or key on another column."
            )
    return frame


def _check_identifier(name: Any, what: str, error: type[InvalidInputError], example: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or name.lower().startswith("llmledger"):
        raise error(
            f"{what} name {name!r} is not usable as a SQL identifier: use letters, digits and "
            f"underscores, starting with a letter or underscore, not starting with 'llmledger' "
            f"({example})."
        )


def _check_frame_columns(columns: Sequence[str]) -> None:
    """Column names the store keeps apart, on either engine: at most 63 bytes (PostgreSQL cuts longer ones, so
    two could become one), not two that differ only in case (DuckDB does not tell them apart), and none named
    like the ledger's own (llmledger_...), which its SQL uses beside the frame's columns."""
    for c in columns:
        if not c.strip():
            raise InvalidInputError(
                f"the frame has a column named {c!r}, which the store cannot name: rename it, "
                "e.g. df.rename({" + repr(c) + ": 'notes'})"
            )
        if c.lower().startswith("llmledger_"):
            raise InvalidInputError(
                f"the frame's column {c!r} starts with 'llmledger_', which names the ledger's "
                "own tables and columns: rename it, e.g. df.rename(...)"
            )
        if len(c.encode()) > NAME_BYTES:
            raise InvalidInputError(
                f"the frame's column {c[:40] + '...'!r} has a name of {len(c.encode())} bytes; "
                f"the store keeps at most {NAME_BYTES} (PostgreSQL's limit): rename it, e.g. "
                "df.rename(...)"
            )
    seen: dict[str, str] = {}
    for c in columns:
        if c.lower() in seen:
            raise InvalidInputError(
                f"the frame's columns {seen[c.lower()]!r} and {c!r} differ only in case, which "
                "the store does not tell apart; rename or drop one"
            )
        seen[c.lower()] = c


def _strictly_increasing(column: pl.Series) -> bool:
    try:
        return column.is_sorted() and not column.slice(1).eq(column.slice(0, max(len(column) - 1, 0))).any()
    except pl.exceptions.PolarsError:  # a type without an order
        return False


def _check_no_nul(
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


def _null_fields(plan: Plan, prompt: Prompt, skip: Any) -> Plan:
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


def _index_names(df: Any) -> list[str]:
    """The names of a pandas frame's index levels (which `pl.from_pandas` leaves out)."""
    return [str(n) for n in getattr(df.index, "names", []) if n is not None]


def _resolve_key(
    frame: pl.DataFrame, key: str | Sequence[str] | None, step: str, *, index: Sequence[str] = ()
) -> list[str]:
    """The key columns; `index`: a pandas frame's index names, which the frame's columns do not include."""

    def in_index(k: str) -> str:
        return (
            (f". {k!r} is the pandas frame's index, which is not a column: pass df.reset_index() (and key={k!r})")
            if k in index
            else ""
        )

    if key is None:
        if "id" not in frame.columns:
            raise KeyColumnError(
                f"the frame has no 'id' column, so pass key= naming the column(s) that "
                f"identify a row; columns: {frame.columns}{in_index('id')}"
            )
        keys = ["id"]
    else:
        keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise KeyColumnError("key= is empty; name at least one column")
    for k in keys:
        if k not in frame.columns:
            raise KeyColumnError(f"key column {k!r} is not in the frame; columns: {frame.columns}{in_index(k)}")
        if k in owned_names(step):
            raise KeyColumnError(f"key column {k!r} clashes with a column of step {step!r}; rename it")
        if k.lower() in KEY_RESERVED:
            raise KeyColumnError(
                f"key column {k!r} has a name the ledger gives its own bookkeeping (the rows it "
                f"claims and commits carry {k!r} beside the key): rename it, e.g. "
                f"df.rename({{{k!r}: {k + '_id'!r}}}) and key={k + '_id'!r}"
            )
    nulls = frame.select(pl.any_horizontal(pl.col(k).is_null() for k in keys).arg_true().head(3)).to_series()
    if len(nulls):
        raise KeyColumnError(
            f"key {keys} is null in row(s) {nulls.to_list()} (0-based); every row needs a key. "
            "Drop those rows or fill the key (e.g. df.with_row_index('id'))."
        )
    if len(keys) == 1 and _strictly_increasing(frame[keys[0]]):
        return keys  # unique, found without a hash table over every key
    if frame.n_unique(subset=keys) == frame.height:
        return keys
    dup = frame.group_by(keys).len().filter(pl.col("len") > 1)
    if dup.height:
        example = dup.row(0, named=True)
        raise KeyColumnError(
            f"key {keys} is not unique: {dup.height:,} value(s) repeat, e.g. "
            f"{ {k: example[k] for k in keys} } occurs {example['len']} times. Deduplicate the "
            "frame or choose a key that identifies a row."
        )
    return keys
