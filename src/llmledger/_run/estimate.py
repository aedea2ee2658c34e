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
import string
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from llmledger._ledger import known_table, open_ledger
from llmledger._ledger.rehearsal import Rehearsal, count_where
from llmledger._run.api import apply_llm, checked_plan
from llmledger._run.plan import Plan
from llmledger._step.apis import batches_at
from llmledger._step.attach import tokens_of
from llmledger._step.packing import ENTRY_GUESS, pack_request
from llmledger._step.prices import estimate_tokens, price_of
from llmledger._step.prompt import render
from llmledger._step.request import RequestSpec
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError

AUTO_CACHE_MIN = 1024  # tokens of shared prefix from which an API that caches by itself (OpenAI's) caches it

GUESS_CAP = 200  # before a step's first answer: half of min(max_tokens, this) output tokens per call


def estimate(df: Any, step: str | Mapping[str, Mapping[str, Any]], **options: Any) -> pl.DataFrame:
    """What `apply_llm(df, step, **options)` would send and cost, as a one-row frame; nothing is sent or written.

    Columns: rows, to_send, calls (requests after identical ones share an answer; with `rows_per_request=`, the
    packs they make), reused, done (current answers;
    stale ones are counted apart, as in `progress()`), stale,
    waiting, needs_review, in_batches (rows in Message Batches still processing), input_tokens, output_tokens,
    output_basis, cost_usd (online), cost_usd_batch, cost_usd_flex (OpenAI's flex tier, `mode="flex"`; None for a
    model without one).

    `estimate(df, steps, **common)`, with the mapping `pipeline()` takes, estimates the whole pipeline: a row per
    step, then a `total` row. A step's rows that wait for an earlier step's answers are counted as sent (as the
    pipeline sends them once those are in), each field of that step read as long as its estimated answers.
    """
    if isinstance(step, Mapping):
        return _pipeline(df, step, options)
    plan = plan_options(df, step, options)
    figures = _figures(plan)
    del figures[PER_CALL]
    return pl.DataFrame([figures], schema_overrides=_TYPES)


_TYPES = {"cost_usd": pl.Float64, "cost_usd_batch": pl.Float64, "cost_usd_flex": pl.Float64}
PER_CALL = "per_call"  # in the figures, not the frame: output tokens a call is reckoned at (answers so far, or a guess)


def plan_options(df: Any, step: str, options: Mapping[str, Any]) -> Plan:
    try:
        bound = inspect.signature(apply_llm).bind(df, step, **options)
    except TypeError as exc:
        raise InvalidInputError(f"estimate takes apply_llm's arguments: {exc}") from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop("background")
    return checked_plan(arguments)


def _figures(plan: Plan) -> dict[str, Any]:
    """apply_llm's preparation of `plan`, rolled back, and what it would send and cost."""
    params = plan.params(utcnow(), rehearsal=True)
    assert plan.definition is not None and plan.frame is not None
    rehearsal: Rehearsal = open_ledger(plan.store).prepare(
        plan.definition, plan.frame, params, dedupe=plan.cfg.dedupe, source=plan.user_frame, rehearse=True
    )
    return _look(rehearsal, plan)


def _pipeline(df: Any, steps: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any]) -> pl.DataFrame:
    """A pipeline's estimate: each step as `estimate` gives it, its rows waiting for earlier steps added."""
    from llmledger._run.pipeline import check_pipeline

    plans = check_pipeline(df, steps, common)
    answer_tokens: dict[str, float] = {}  # per step: the estimated length of one answer
    shapes = {name: _fields(plan) for name, plan in plans.items()}  # per step: its output's fields, if structured
    rows = []
    for name, plan in plans.items():
        assert plan.definition is not None and plan.frame is not None
        upstream = plan.definition.prompt.upstream
        stored = known_table(plan.store, plan.table).steps
        if all(s in stored for s in upstream):
            figures = _figures(plan)
        else:  # an earlier step is not in the store yet: every row (that where= takes) waits for it
            figures = {
                "rows": plan.frame.height,
                "to_send": 0,
                "calls": 0,
                "reused": 0,
                "done": 0,
                "stale": 0,
                "waiting": _in_where(plan),
                "needs_review": 0,
                "in_batches": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "output_basis": "",
                "cost_usd": 0.0,
                "cost_usd_batch": 0.0,
                "cost_usd_flex": 0.0,
                PER_CALL: min(plan.definition.request.max_tokens, GUESS_CAP) / 2,
            }
        if upstream and figures["waiting"]:
            figures = _with_waiting(plan, figures, answer_tokens, shapes)
        answer_tokens[name] = figures.pop(PER_CALL)
        rows.append({"step": name, **figures})
    frame = pl.DataFrame(rows, schema_overrides=_TYPES)
    costs = {c: None if frame[c].null_count() else frame[c].sum() for c in _TYPES}
    sums = {c: frame[c].sum() for c, t in frame.schema.items() if t.is_integer() and c != "rows"}
    total = {"step": "total", "rows": frame["rows"].max(), **sums, "output_basis": "", **costs}
    return pl.concat([frame, pl.DataFrame([total], schema=frame.schema)])


def _with_waiting(
    plan: Plan, figures: dict[str, Any], answer_tokens: Mapping[str, float], shapes: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """`figures` with the rows waiting for earlier steps counted as sent: their template over the frame's own
    columns, each earlier step's field as long as that step's estimated answer (a sample of the frame's rows)."""
    assert plan.definition is not None and plan.frame is not None
    request, template = plan.definition.request, str(plan.definition.prompt.prompt)
    upstream = plan.definition.prompt.upstream
    own, fields = [], 0.0
    for literal, field, spec, conversion in string.Formatter().parse(template):
        own.append(literal.replace("{", "{{").replace("}", "}}"))
        root = None if field is None else field.split(".", 1)[0].split("[", 1)[0]
        if root in upstream:  # a field of a structured answer is a share of it
            share = 1 / max(1, len(shapes.get(root) or ())) if field != root else 1.0
            fields += answer_tokens.get(root, min(request.max_tokens, GUESS_CAP) / 2) * share
        elif field is not None:
            own.append("{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
    sample = plan.user_frame if plan.user_frame is not None else plan.frame
    sample = sample.head(_SAMPLE)
    texts = render("".join(own), sample, plan.definition.key) if sample.height else pl.Series([], dtype=pl.String)
    per_row = (sum(estimate_tokens(t) for t in texts) / max(len(texts), 1)) + fields
    fixed = _schema_tokens(request)
    waiting = figures["waiting"]
    extra = _priced(request, waiting, round((per_row + fixed) * waiting), figures[PER_CALL], gateway=plan.gateway)
    cost = {c: None if figures[c] is None or extra[c] is None else figures[c] + extra[c] for c in _TYPES}
    basis = figures["output_basis"] or "a guess (the step has no answers yet)"
    return {
        **figures,
        "to_send": figures["to_send"] + waiting,
        "calls": figures["calls"] + waiting,
        "input_tokens": figures["input_tokens"] + extra["input_tokens"],
        "output_tokens": figures["output_tokens"] + extra["output_tokens"],
        **cost,
        "output_basis": f"{basis}; {waiting:,} rows waiting for {', '.join(upstream)} counted as sent",
    }


def _in_where(plan: Plan) -> int:
    """How many of the frame's rows `where=` takes, judged on the frame's own columns; all of them when it reads
    anything else (another step's columns, which do not exist yet)."""
    assert plan.frame is not None
    if not plan.where:
        return plan.frame.height
    found = count_where(plan.frame, plan.where)
    return plan.frame.height if found is None else found


def _fields(plan: Plan) -> list[str]:
    assert plan.definition is not None
    spec = plan.definition.request.output_spec()
    return list(spec.schema.get("properties", {})) if spec is not None else []


_SAMPLE = 10_000  # rows whose prompts are rendered to estimate the length of the waiting ones


def _look(rehearsal: Rehearsal, plan: Plan) -> dict[str, Any]:
    """The figures, from what was read inside prepare's transaction (before it was rolled back)."""
    assert plan.definition is not None and plan.frame is not None
    selection, request = rehearsal.selection, plan.definition.request
    prompts: dict[str, str] = {}
    for fp, prompt in rehearsal.requests:
        if not (plan.cfg.dedupe and (fp in prompts or fp in selection.known)):
            prompts[fp if plan.cfg.dedupe else f"{fp}/{len(prompts)}"] = prompt or ""
    calls = len(prompts)
    average, answered = rehearsal.average_output_tokens, rehearsal.answered
    if answered and average is not None:
        per_call, basis = average, f"the step's {answered:,} answers so far"
    else:
        per_call, basis = min(request.max_tokens, GUESS_CAP) / 2, "a guess (the step has no answers yet)"
    fixed = _schema_tokens(request)
    blobs = plan.cfg.attachments.blobs if plan.cfg.attachments is not None else {}
    if request.rows_per_request > 1:  # the requests as packs would be: the instructions said once a pack
        usage = _packed(request, list(prompts.values()), per_call, answered=bool(answered), gateway=plan.gateway)
    else:
        plain = sum(
            tokens_of(json.loads(p) if request.attach and p else p, blobs, estimate_tokens) for p in prompts.values()
        )
        usage = _priced(request, calls, plain + fixed * calls, per_call, gateway=plan.gateway)
    survey = (
        selection.survey
        if selection.survey is not None
        else pl.DataFrame(schema={"status": pl.String, "stale": pl.Boolean})
    )
    status, stale = survey["status"], survey["stale"].fill_null(False)
    return {
        "rows": plan.frame.height,
        "to_send": selection.work.height,
        "calls": -(-calls // request.rows_per_request),  # requests: packs of rows_per_request distinct rows
        "reused": selection.work.height - calls,
        "done": int(((status == "DONE") & ~stale).sum()),
        "stale": selection.stale,
        "waiting": selection.waiting,
        "needs_review": selection.needs_review,
        "in_batches": selection.in_batches,
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "output_basis": basis,
        "cost_usd": usage["cost_usd"],
        "cost_usd_batch": usage["cost_usd_batch"],
        "cost_usd_flex": usage["cost_usd_flex"],
        PER_CALL: per_call,
    }


def _packed(
    request: RequestSpec, prompts: list[str], per_row: float, *, answered: bool, gateway: bool
) -> dict[str, Any]:
    """Tokens and cost of `prompts` sent `rows_per_request` to a request (`_step/packing.py`): each pack's message
    and schema, its instructions once a pack (or cached), each row's answer with its entry's id and first words."""
    size = request.rows_per_request
    packs = [pack_request(request, prompts[i : i + size], ids=["xxxxxx"] * len(prompts[i : i + size]))
             for i in range(0, len(prompts), size)]  # fmt: skip
    if not packs:
        return _priced(request, 0, 0, per_row, gateway=gateway)
    specs = [p.spec for p in packs if p.spec is not None]  # every pack made here has its spec
    plain = sum(estimate_tokens(p.message) for p in packs) + sum(_schema_tokens(s) for s in specs)
    per_pack = (per_row + (0 if answered else ENTRY_GUESS)) * len(prompts) / len(packs)
    return _priced(specs[0], len(packs), plain, per_pack, gateway=gateway)


def _schema_tokens(request: RequestSpec) -> int:
    """The tokens an `output=` schema adds to each request (0 without one)."""
    options = request.options
    asked = options.get(request.shape.structured_field)  # output_config, response_format, or Responses' text
    return estimate_tokens(json.dumps(asked)) if asked else 0


def _priced(request: RequestSpec, calls: int, plain: int, per_call: float, *, gateway: bool) -> dict[str, Any]:
    """Tokens and cost of `calls` requests with `plain` input tokens between them (the fixed part, system prompt
    and `messages=` prefix, added here: cached, or in every call) and `per_call` output tokens each."""
    static = estimate_tokens(request.static_text())
    cached = request.cached_ttl is not None and calls > 0
    write, read = (static, static * (calls - 1)) if cached else (0, 0)
    if request.shape.caches_itself and request.endpoint is None and static >= AUTO_CACHE_MIN and calls > 0:
        # OpenAI caches a prefix this long by itself, in steps of 128 tokens: the first call writes it (at the
        # input price), the rest read it
        kept = static // 128 * 128
        cached, write, read = True, static, kept * (calls - 1)
        plain += (static - kept) * (calls - 1)
    if not cached:
        plain += static * calls
    output = round(per_call * calls)
    price = price_of(request.model)
    usage: dict[str, Any] = {
        "input_tokens": plain,
        "output_tokens": output,
        "cache_write_tokens": write,
        "cache_write_1h_tokens": write if request.cached_ttl == "1h" else 0,
        "cache_read_tokens": read,
    }
    return {
        "input_tokens": plain + write + read,
        "output_tokens": output,
        "cost_usd": None if price is None else price.cost(**usage),
        # no batch price to offer where llmledger sends no batches (another server, named with base_url=)
        "cost_usd_batch": None
        if price is None or not batches_at(request.provider, request.endpoint, gateway)
        else price.cost(**usage, batch=True),
        "cost_usd_flex": None if price is None or price.flex is None else price.cost(**usage, flex=True),
    }
