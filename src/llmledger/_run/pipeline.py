"""`pipeline`: several steps over one frame, in order, each one an `apply_llm` call with all its guarantees.

A step's template may read an earlier step (`"{sentiment}"`, `"{extract.company}"`); the ledger
then sends it only rows whose earlier steps are fresh, and a redo upstream makes exactly the
affected rows stale downstream (see `_ledger/graph.py`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

import polars as pl

from llmledger._ledger import stored_outputs
from llmledger._ledger.graph import field_paths
from llmledger._report import PipelineReport, RunReport
from llmledger._run.api import apply_llm, checked_plan
from llmledger._run.plan import Plan
from llmledger._run.run import last_report, set_last_report
from llmledger._step.output import OutputSpec, resolved, spec_from_request
from llmledger._step.prompt import template_fields
from llmledger.errors import InvalidInputError, PromptError

_PER_CALL = {"background"}


def pipeline(df: Any, steps: Mapping[str, Mapping[str, Any]], **common: Any) -> Any:
    """Run `steps` (step name -> its apply_llm options) over `df` in order; return `df` with every step's columns.

        out = llmledger.pipeline(df, {
            "extract": {"prompt": "Extract from: {text}", "output": {"company": str}},
            "classify": {"prompt": "Which industry is {extract.company} in?"},
        }, key="id", store="ledger.duckdb", table="reviews")

    `common` options (store, table, key, model, client, ...) apply to every step; a step's own
    options win. A rerun pays only for what is not DONE and fresh, step by step.
    """
    check_pipeline(df, steps, common)
    names = list(steps)
    outputs = []
    frame = None
    reports: dict[str, RunReport] = {}
    for name, options in steps.items():
        frame = apply_llm(df, name, **{**common, **options})
        outputs.append((name, frame))
        report = last_report()
        if isinstance(report, RunReport):
            reports[name] = report
    assert frame is not None
    combined = PipelineReport(reports)
    set_last_report(combined)
    if common.get("progress", True):
        print(str(combined).splitlines()[0])  # each step showed its own summary; this is the whole
    returned = {name: [name, f"{name}_status", f"{name}_stale"] for name in names}  # what apply_llm appends
    step_columns = [c for name in names for c in returned[name]]
    if isinstance(frame, pl.DataFrame):
        return pl.concat(
            [frame.drop(step_columns, strict=False), *(f.select(returned[name]) for name, f in outputs)],
            how="horizontal",
        )
    out = frame  # pandas: each step's result is a copy of df with that step's columns
    for name, f in outputs[:-1]:
        for column in returned[name]:
            out[column] = f[column].to_list()
    return out[[c for c in out.columns if c not in step_columns] + step_columns]


def check_pipeline(df: Any, steps: Any, common: Mapping[str, Any]) -> dict[str, Plan]:
    """Every step of a pipeline checked as apply_llm checks one, in order, before any runs; each step's Plan."""
    if not isinstance(steps, Mapping) or not steps:
        raise InvalidInputError(
            "steps must be a non-empty mapping of step name -> apply_llm options, e.g. "
            "{'summary': {'prompt': 'Summarize: {text}'}}"
        )
    for name in _PER_CALL & set(common):
        raise InvalidInputError(f"pipeline takes no {name}=; it runs its steps one after another")
    names = list(steps)
    for i, (name, options) in enumerate(steps.items()):
        if not isinstance(options, Mapping) or ("prompt" not in options and "messages" not in options):
            raise InvalidInputError(
                f"step {name!r} needs a mapping of apply_llm options with a prompt= (or messages=), got {options!r}"
            )
        messages = options.get("messages")
        prompt = (
            options.get("prompt")
            if "prompt" in options
            or not isinstance(messages, list | tuple)
            or not messages
            or not isinstance(messages[-1], dict)
            else messages[-1].get("content")
        )
        later = [f for f in template_fields(prompt) if f in names[i:]] if isinstance(prompt, str) else []
        if later:
            raise InvalidInputError(
                f"step {name!r} reads {later}, which run at or after it; order the steps "
                "so that each comes after the steps it reads"
            )
    return _check_every_step(df, steps, common)


def _check_every_step(df: Any, steps: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any]) -> dict[str, Plan]:
    """Check every step's call as apply_llm would, before the first one runs: a mistake in a later step must
    not leave a store behind with earlier steps paid for. (A `where=` is checked against the table when its
    step runs: a new table does not exist until then.)"""
    earlier: dict[str, OutputSpec | None] = {}
    stored: dict[tuple[str, str], dict[str, OutputSpec | None]] = {}
    plans: dict[str, Plan] = {}
    for name, options in steps.items():
        try:
            bound = inspect.signature(apply_llm).bind(df, name, **{**common, **options})
        except TypeError as exc:
            raise InvalidInputError(f"step {name!r}: {exc}") from None
        bound.apply_defaults()
        plan = checked_plan({**bound.arguments, "earlier_steps": list(earlier)})
        plans[name] = plan
        assert plan.definition is not None
        prompt = plan.definition.prompt.prompt
        if isinstance(prompt, str):
            where = (str(plan.store), plan.table)  # steps already in the store count too (`{extract.company}`)
            if where not in stored:
                stored[where] = stored_outputs(plan.store, plan.table)
            _check_fields(name, prompt, {**stored[where], **earlier})
        earlier[name] = spec_from_request(plan.definition.request.options)
    return plans


def _check_fields(step: str, prompt: str, earlier: Mapping[str, OutputSpec | None]) -> None:
    """Each `{extract.company}` the template reads names a field the earlier step's output has: a typo
    (`{verdict.is_spma}`) is found before step 1 is paid for, not when this step runs."""
    for path in field_paths(prompt):
        root, *fields = path.split(".")
        if not fields or root not in earlier:
            continue
        spec = earlier[root]
        if spec is None:
            raise PromptError(
                f"step {step!r} reads {{{path}}}, but step {root!r} answers text, which has no "
                f"fields; read {{{root}}}, or give {root!r} an output= with a field "
                f"{fields[0]!r}. Nothing was run."
            )
        schema = spec.schema
        for depth, field in enumerate(fields, start=1):
            properties = _properties(schema, spec.schema.get("$defs", {}))
            if field not in properties:
                close = difflib.get_close_matches(field, list(properties), n=1)
                fix = f" Did you mean {{{'.'.join([root, *fields[: depth - 1], close[0]])}}}?" if close else ""
                raise PromptError(
                    f"step {step!r} reads {{{path}}}, but step {root!r} has no field "
                    f"{'.'.join(fields[:depth])!r}; its fields: {sorted(properties)}.{fix} "
                    "Nothing was run."
                )
            schema = properties[field]


def _properties(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The fields of an object schema (through `$ref`, and the object branch of an optional `T | None`)."""
    schema = resolved(schema, defs)
    for branch in schema.get("anyOf", []):
        if resolved(branch, defs).get("properties"):
            return resolved(branch, defs)["properties"]
    return schema.get("properties", {})
