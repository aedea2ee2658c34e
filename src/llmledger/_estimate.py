"""`estimate`: what an apply_llm call would send and cost, before paying for anything.

It runs apply_llm's own preparation (the same checks, the same selection of
rows, identical requests found the same way) inside a transaction that is
rolled back, so the store is left exactly as it was, and prices the requests
it would send. Input tokens are counted from the stored requests (about four
characters a token); output tokens are the step's average so far, or, before
its first answer, a guess (`output_basis` says which). The simulator counts
tokens the same way, so on it the estimate is close; on the real API, a
small first run (`where=`) gives the step answers to estimate the rest from.
"""

from __future__ import annotations

import inspect
import json
from datetime import timedelta
from typing import Any

import duckdb
import polars as pl

from ._api import apply_llm, checked_plan
from ._attach import tokens_of
from ._exec.api import answer_source
from ._ledger import RunParams, Selection, open_ledger
from ._ledger.columns import names, q
from ._ledger.connection import one, registered
from ._prices import estimate_tokens, price_of
from ._run import Plan
from ._time import utcnow
from .errors import InvalidInputError

GUESS_CAP = 200  # before a step's first answer: half of min(max_tokens, this) output tokens per call
_WORK = "llmledger_estimate"


def estimate(df: Any, step: str, **options: Any) -> pl.DataFrame:
    """What `apply_llm(df, step, **options)` would send and cost, as a one-row frame; nothing is sent or written.

    Columns: rows, to_send, calls (requests after identical ones share an answer), reused, done (current answers;
    stale ones are counted apart, as in `progress()`), stale,
    waiting, needs_review, in_batches (rows in Message Batches still processing), input_tokens, output_tokens,
    output_basis, cost_usd (online), cost_usd_batch.
    """
    try:
        bound = inspect.signature(apply_llm).bind(df, step, **options)
    except TypeError as exc:
        raise InvalidInputError(f"estimate takes apply_llm's arguments: {exc}") from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("background")
    plan = checked_plan(arguments)
    started = utcnow()
    params = RunParams(max_attempts=plan.max_attempts, redo=plan.redo, run_started=started,
                       stale_before=started - timedelta(days=36500), where=plan.where,
                       source=answer_source(plan.client))
    assert plan.definition is not None and plan.frame is not None
    figures = open_ledger(plan.store).prepare(plan.definition, plan.frame, params, dedupe=plan.cfg.dedupe,
                                              source=plan.user_frame, look=lambda con, sel: _look(con, sel, plan))
    return pl.DataFrame([figures], schema_overrides={"cost_usd": pl.Float64, "cost_usd_batch": pl.Float64})


def _look(con: duckdb.DuckDBPyConnection, selection: Selection, plan: Plan) -> dict[str, Any]:
    """The figures, read inside prepare's transaction (before it is rolled back)."""
    assert plan.definition is not None and plan.frame is not None
    layout, request = selection.layout, plan.definition.request
    c = names(layout.step, "t")
    with registered(con, _WORK, selection.work):
        sent = con.execute(f"SELECT {c['_request_fingerprint']}::VARCHAR, {c['_prompt']} FROM {q(layout.table)} AS t "
                           f"WHERE EXISTS (SELECT 1 FROM {_WORK} AS i WHERE {layout.key_join('t', 'i')})").fetchall()
    prompts: dict[str, str] = {}
    for fp, prompt in sent:
        if not (plan.cfg.dedupe and (fp in prompts or fp in selection.known)):
            prompts[fp if plan.cfg.dedupe else f"{fp}/{len(prompts)}"] = prompt or ""
    calls = len(prompts)
    average, answered = one(con, f"SELECT avg({c['_output_tokens']}), count(*) FROM {q(layout.table)} AS t "
                                 f"WHERE {c['_status']} = 'DONE' AND {c['_output_tokens']} > 0")
    if answered:
        per_call, basis = float(average), f"the step's {answered:,} answers so far"
    else:
        per_call, basis = min(request.max_tokens, GUESS_CAP) / 2, "a guess (the step has no answers yet)"
    fixed = estimate_tokens(json.dumps(request.options.get("output_config", ""))) if "output_config" in \
        request.options else 0
    system = estimate_tokens(request.static_text())
    blobs = plan.cfg.attachments.blobs if plan.cfg.attachments is not None else {}
    plain = sum(tokens_of(json.loads(p) if request.attach and p else p, blobs, estimate_tokens)
                for p in prompts.values()) + fixed * calls
    cached = request.cached_ttl is not None and calls > 0
    write, read = (system, system * (calls - 1)) if cached else (0, 0)
    if not cached:
        plain += system * calls
    output = round(per_call * calls)
    price = price_of(request.model)
    usage = {"input_tokens": plain, "output_tokens": output, "cache_write_tokens": write,
             "cache_write_1h_tokens": write if request.cached_ttl == "1h" else 0, "cache_read_tokens": read}
    survey = selection.survey if selection.survey is not None else pl.DataFrame(
        schema={"status": pl.String, "stale": pl.Boolean})
    status, stale = survey["status"], survey["stale"].fill_null(False)
    return {"rows": plan.frame.height, "to_send": selection.work.height, "calls": calls,
            "reused": selection.work.height - calls, "done": int(((status == "DONE") & ~stale).sum()),
            "stale": selection.stale, "waiting": selection.waiting, "needs_review": selection.needs_review,
            "in_batches": selection.in_batches,
            "input_tokens": plain + write + read, "output_tokens": output, "output_basis": basis,
            "cost_usd": None if price is None else price.cost(**usage),
            "cost_usd_batch": None if price is None else price.cost(**usage, batch=True)}
