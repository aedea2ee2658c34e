"""`apply_llm`: check the call, record the frame, run what still needs running, return the frame."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anthropic
import polars as pl

from . import _store as st
from ._claims import Claimant, is_abandoned
from ._client import DEFAULT_MODEL, Reply, default_client
from ._display import Progress
from ._loop import run_blocking
from ._prompt import (
    FINGERPRINT_COL,
    PROMPT_COL,
    Prompt,
    check_prompt,
    fingerprints,
    render,
    request_signature,
)
from ._report import RunReport
from ._runner import Outcome, RetryPolicy, RunConfig, Runner, merge_journals, utcnow
from .errors import (
    AuthenticationFailed,
    InvalidInputError,
    KeyColumnError,
    OutageError,
    StepNameError,
)

DEFAULT_STORE = "llmledger.duckdb"
DEFAULT_TABLE = "ledger"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_last_report: RunReport | None = None


def last_report() -> RunReport | None:
    """The report of the most recent `apply_llm` call in this process."""
    return _last_report


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
) -> Any:
    """Run `prompt` through the model for every row of `df` that the ledger does not have yet.

    Returns `df` in its order with `{step}` (the answer) and `{step}_status`
    appended. Rows already DONE cost nothing; see the README for the status model.
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
    incoming = _incoming(frame, keys, prompts, fingerprints(prompts, signature))
    cfg = RunConfig(model=model, system=system, max_tokens=max_tokens, chunk_size=chunk_size,
                    concurrency=concurrency, max_attempts=max_attempts,
                    redo={False: "none", True: "all", "stale": "stale"}[redo],  # type: ignore[index]
                    commit_every=commit_every, retry=retry or RetryPolicy(), request_options=request_options or {},
                    dedupe=dedupe)
    stop_flag = threading.Event()
    ledger = st.Store(path, should_stop=stop_flag.is_set)
    template_text = prompt if isinstance(prompt, str) else getattr(prompt, "__name__", repr(prompt))

    with Claimant.new() as claimant:
        run_started = utcnow()
        layout, work, counts, known = _prepare(ledger, incoming, frame, keys, table=table, step=step, where=where,
                                        cfg=cfg, run_started=run_started, stale=stale,
                                        template_text=template_text)
        report = RunReport(table=table, step=step, rows=frame.height, selected=work.height,
                           stale=counts["stale"] if cfg.redo != "stale" else 0,
                           running_elsewhere=counts["running_elsewhere"])
        report.skipped = frame.height - work.height - report.running_elsewhere
        bar = Progress(total=work.height, label=f"{table}.{step}", enabled=progress)
        ledger.on_wait = bar.note
        interrupted = False
        try:
            if work.height:
                _, interrupted = run_blocking(lambda: _execute(
                    ledger, layout, work, cfg, client, claimant, report, run_started, stop_flag, bar, known),
                    stop_flag.set)
        finally:
            bar.close()
            outputs = ledger.transaction(lambda con: _finish(con, layout, frame.select(keys), report,
                                                              claimant, cfg, run_started), wait=30.0)

    global _last_report
    _last_report = report
    if progress or interrupted:  # after Ctrl-C the line is the only word on what happened
        print(str(report))
        for hint in report.hints():
            print("  " + hint)
    if interrupted:
        raise KeyboardInterrupt(str(report))
    if report.outcome == "auth":
        raise AuthenticationFailed(report.message, report=report)
    if report.outcome == "outage":
        raise OutageError(f"{report.message} {report.remaining:,} of {report.selected:,} selected rows remain.",
                          report=report)
    return _attach(df, frame, from_pandas, outputs, keys, step)


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


# -- the run --------------------------------------------------------------------------------------

def _prepare(ledger: st.Store, incoming: pl.DataFrame, frame: pl.DataFrame, keys: list[str], *, table: str,
             step: str, where: str | None, cfg: RunConfig, run_started: Any, stale: timedelta,
             template_text: str) -> tuple[st.Layout, pl.DataFrame, dict[str, int], dict[str, Outcome]]:
    existed = ledger.path.exists()
    journals: list[Path] = []

    def work(con: Any) -> tuple[st.Layout, pl.DataFrame, dict[str, int], dict[str, Outcome]]:
        con.register(st.INCOMING, incoming)
        owned = st.owned_columns(con, table, step)
        mirror = [c for c in incoming.columns if c not in keys and c not in owned
                  and c not in (PROMPT_COL, FINGERPRINT_COL)]
        layout = st.Layout(table=table, step=step, key=keys, mirror=mirror)
        st.ensure_schema(con, layout, model=cfg.model, prompt=template_text, system=cfg.system, now=run_started)
        st.upsert(con, layout)
        journals[:] = merge_journals(con, layout, ledger.path, {k: frame.schema[k] for k in keys})
        st.recover_claims(con, layout, max_attempts=cfg.max_attempts, stale_before=run_started - stale,
                          is_abandoned=is_abandoned)
        params = {"max_attempts": cfg.max_attempts, "redo": cfg.redo, "run_started": run_started}
        work_rows, counts = st.select_work(con, layout, where=where, params=params)
        con.unregister(st.INCOMING)
        known: dict[str, Outcome] = {}
        if cfg.dedupe and cfg.redo != "all" and work_rows.height:  # a redo asks for a fresh answer
            for r in st.known_answers(con, layout, work_rows).iter_rows(named=True):
                known[r["fingerprint"]] = (Reply(r["output"], 0, 0, r["stop_reason"], r["model"]), None)
        return layout, work_rows.cast({k: frame.schema[k] for k in keys}), counts, known

    try:
        result = ledger.transaction(work)
    except InvalidInputError:
        if not existed:  # a bad call leaves no file behind
            for leftover in (ledger.path, ledger.path.with_name(ledger.path.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        raise
    for path in journals:
        path.unlink(missing_ok=True)
    return result


async def _execute(ledger: st.Store, layout: st.Layout, work: pl.DataFrame, cfg: RunConfig,
                   client: anthropic.AsyncAnthropic | None, claimant: Claimant, report: RunReport,
                   run_started: Any, stop_flag: threading.Event, bar: Progress,
                   known: dict[str, Outcome]) -> RunReport:
    own = client is None
    api = default_client() if own else client.with_options(max_retries=0)  # type: ignore[union-attr]
    try:
        runner = Runner(store=ledger, layout=layout, work=work, cfg=cfg, client=api, claimant=claimant,
                        report=report, run_started=run_started, stop_flag=stop_flag, on_progress=bar.update,
                        known=known)
        return await runner.run()
    finally:
        if own:
            await api.close()


def _finish(con: Any, layout: st.Layout, keys: pl.DataFrame, report: RunReport, claimant: Claimant,
            cfg: RunConfig, run_started: Any) -> pl.DataFrame:
    st.record_run(con, {
        "run_id": claimant.run_id, "table_name": layout.table, "step": layout.step, "claimant": str(claimant),
        "model": cfg.model, "started_at": run_started, "finished_at": utcnow(), "outcome": report.outcome,
        "rows_in_frame": report.rows, "rows_selected": report.selected, "done": report.done,
        "failed": report.failed, "needs_review": report.needs_review, "stale": report.stale,
        "calls": report.calls, "reused": report.reused, "retries": report.retries, "input_tokens": report.input_tokens,
        "output_tokens": report.output_tokens, "cost_usd": report.cost_usd,
    })
    return st.read_outputs(con, layout, keys)


def _attach(df: Any, frame: pl.DataFrame, from_pandas: bool, outputs: pl.DataFrame, keys: list[str],
            step: str) -> Any:
    names = [step, f"{step}_status"]
    outputs = outputs.cast({k: frame.schema[k] for k in keys})
    joined = frame.select(keys).join(outputs, on=keys, how="left", maintain_order="left")
    if from_pandas:
        out = df.copy()
        for name in names:
            out[name] = joined[name].to_list()
        return out
    return pl.concat([frame.drop(names, strict=False), joined.select(names)], how="horizontal")
