"""`apply_llm`: check the call, record the frame, run what still needs running, return the frame."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anthropic
import polars as pl

from . import _store as st
from ._client import DEFAULT_MODEL
from ._prompt import FINGERPRINT_COL, PROMPT_COL, Prompt, check_prompt, fingerprints, render, request_signature
from ._run import Plan, Run
from ._runner import RetryPolicy, RunConfig
from .errors import InvalidInputError, KeyColumnError, StepNameError

DEFAULT_STORE = "llmledger.duckdb"
DEFAULT_TABLE = "ledger"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def apply_llm(
    df: Any,
    step: str,
    *,
    prompt: Prompt,
    key: str | Sequence[str] | None = None,
    store: str | Path = DEFAULT_STORE,
    table: str = DEFAULT_TABLE,
    model: str = DEFAULT_MODEL,
    system: str | None = None,
    max_tokens: int = 1024,
    chunk_size: int = 200,
    concurrency: int = 16,
    where: str | None = None,
    redo: bool | Literal["stale"] = False,
    max_attempts: int = 3,
    stale_after: timedelta | float = timedelta(minutes=30),
    client: anthropic.AsyncAnthropic | None = None,
    progress: bool = True,
    retry: RetryPolicy | None = None,
    commit_every: float = 0.5,
    request_options: dict[str, Any] | None = None,
    dedupe: bool = True,
    background: bool = False,
) -> Any:
    """Run `prompt` through the model for every row of `df` that the ledger does not have yet.

    Returns `df` in its order with `{step}` (the answer) and `{step}_status`
    appended. Rows already DONE cost nothing; see the README for the status
    model. With `background=True` it returns a `Run` handle at once instead.
    """
    frame, from_pandas = _as_polars(df)
    _check_identifier(step, "step", StepNameError, 'e.g. "summary" or "sentiment_v2"')
    _check_identifier(table, "table", InvalidInputError, 'e.g. "messages"')
    keys = _resolve_key(frame, key, step)
    check_prompt(prompt, frame.columns)
    _check_options(model=model, max_tokens=max_tokens, chunk_size=chunk_size, concurrency=concurrency,
                   max_attempts=max_attempts, redo=redo, where=where, commit_every=commit_every)
    stale = stale_after if isinstance(stale_after, timedelta) else timedelta(seconds=float(stale_after))
    if stale.total_seconds() <= 0:
        raise InvalidInputError(f"stale_after must be positive, got {stale_after!r}")
    if client is not None and not isinstance(client, anthropic.AsyncAnthropic):
        raise InvalidInputError(f"client must be an anthropic.AsyncAnthropic (llmledger sends rows concurrently), "
                                f"got {type(client).__name__}; e.g. anthropic.AsyncAnthropic(api_key=...)")
    path = Path(store).expanduser()
    st.check_store_path(path)

    prompts = render(prompt, frame, keys)
    signature = request_signature(model=model, system=system, max_tokens=max_tokens)
    cfg = RunConfig(model=model, system=system, max_tokens=max_tokens, chunk_size=chunk_size,
                    concurrency=concurrency, max_attempts=max_attempts,
                    redo={False: "none", True: "all", "stale": "stale"}[redo],  # type: ignore[index]
                    commit_every=commit_every, retry=retry or RetryPolicy(), request_options=request_options or {},
                    dedupe=dedupe)
    plan = Plan(df=df, frame=frame, from_pandas=from_pandas, keys=keys, table=table, step=step, where=where,
                stale=stale, cfg=cfg, store=path,
                incoming=_incoming(frame, keys, prompts, fingerprints(prompts, signature)),
                template_text=prompt if isinstance(prompt, str) else getattr(prompt, "__name__", repr(prompt)),
                client=client, progress=progress)
    run = Run(plan)
    if background:
        return run.start_background()
    return run.execute(foreground=True)


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


# -- input checks ---------------------------------------------------------------------------------

def _as_polars(df: Any) -> tuple[pl.DataFrame, bool]:
    if isinstance(df, pl.DataFrame):
        return df, False
    if isinstance(df, pl.LazyFrame):
        return df.collect(), False
    if type(df).__module__.split(".")[0] == "pandas" and type(df).__name__ == "DataFrame":
        return pl.from_pandas(df), True
    raise InvalidInputError(f"df must be a polars or pandas DataFrame, got {type(df).__name__}")


def _check_identifier(name: Any, what: str, error: type[InvalidInputError], example: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or name.lower().startswith("llmledger"):
        raise error(f"{what} name {name!r} is not usable as a SQL identifier: use letters, digits and "
                    f"underscores, starting with a letter or underscore, not starting with 'llmledger' "
                    f"({example}).")


def _resolve_key(frame: pl.DataFrame, key: str | Sequence[str] | None, step: str) -> list[str]:
    if key is None:
        if "id" not in frame.columns:
            raise KeyColumnError(f"the frame has no 'id' column, so pass key= naming the column(s) that "
                                 f"identify a row; columns: {frame.columns}")
        keys = ["id"]
    else:
        keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise KeyColumnError("key= is empty; name at least one column")
    for k in keys:
        if k not in frame.columns:
            raise KeyColumnError(f"key column {k!r} is not in the frame; columns: {frame.columns}")
        if k in st.step_columns(step):
            raise KeyColumnError(f"key column {k!r} clashes with a column of step {step!r}; rename it")
    nulls = frame.select(pl.any_horizontal(pl.col(k).is_null() for k in keys).arg_true().head(3)).to_series()
    if len(nulls):
        raise KeyColumnError(f"key {keys} is null in row(s) {nulls.to_list()} (0-based); every row needs a key. "
                             "Drop those rows or fill the key (e.g. df.with_row_index('id')).")
    dup = frame.group_by(keys).len().filter(pl.col("len") > 1)
    if dup.height:
        example = dup.row(0, named=True)
        raise KeyColumnError(f"key {keys} is not unique: {dup.height:,} value(s) repeat, e.g. "
                             f"{ {k: example[k] for k in keys} } occurs {example['len']} times. Deduplicate the "
                             "frame or choose a key that identifies a row.")
    return keys


def _check_options(*, model: Any, max_tokens: Any, chunk_size: Any, concurrency: Any, max_attempts: Any,
                   redo: Any, where: Any, commit_every: Any) -> None:
    if not isinstance(model, str) or not model:
        raise InvalidInputError(f"model must be a model name such as {DEFAULT_MODEL!r}, got {model!r}")
    for name, value in (("max_tokens", max_tokens), ("chunk_size", chunk_size), ("concurrency", concurrency),
                        ("max_attempts", max_attempts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    if redo not in (False, True, "stale"):
        raise InvalidInputError(f"redo must be False, True or 'stale', got {redo!r}")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise InvalidInputError(f"where must be a SQL predicate string such as \"label = 'spam'\", got {where!r}")
    if not isinstance(commit_every, int | float) or commit_every <= 0:
        raise InvalidInputError(f"commit_every must be a positive number of seconds, got {commit_every!r}")


def _incoming(frame: pl.DataFrame, keys: list[str], prompts: pl.Series, fps: pl.Series) -> pl.DataFrame:
    """The frame as DuckDB will see it: storable columns, plus each row's prompt and fingerprint."""
    keep = [c for c, t in frame.schema.items() if t != pl.Object and c not in (PROMPT_COL, FINGERPRINT_COL)]
    out = frame.select(keep).with_columns(prompts.alias(PROMPT_COL), fps.alias(FINGERPRINT_COL))
    nulls = [c for c, t in out.schema.items() if t == pl.Null]
    return out.with_columns(pl.col(nulls).cast(pl.String)) if nulls else out
