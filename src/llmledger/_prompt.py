"""Turning rows into prompts: templates checked against the frame, rendered in SQL or in Python.

A `str.format` template over plain text and integer columns is rendered by the
ledger itself in SQL (`PromptPlan.sql`), so rows whose inputs have not changed
are never rendered again and a no-op rerun renders nothing. Anything else (a
format spec, a float column, a callable) is rendered here in Python, in
chunks. Both give the same text as `template.format(**row)` with nulls as "".
"""

from __future__ import annotations

import difflib
import hashlib
import string
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ._ledger.columns import q
from .errors import PromptError

Prompt = str | Callable[[dict[str, Any]], str]

# Casting these to text gives what str() gives in Python, in polars and in SQL alike.
_TEXT_LIKE = (pl.String, pl.Categorical, pl.Enum)
RENDER_CHUNK = 100_000


def template_fields(template: str) -> list[str]:
    """The column names a str.format template reads, in order of first use."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise PromptError(f"prompt template {template!r} is not a valid format string: {exc}. "
                          "Write literal braces as '{{' and '}}'.") from None
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        if field_name == "" or field_name.isdigit():
            raise PromptError(f"prompt template {template!r} has a positional field '{{{field_name}}}'; "
                              "name a column instead, e.g. '{text}'.")
        name = field_name.split(".", 1)[0].split("[", 1)[0]
        if name not in names:
            names.append(name)
    return names


def check_prompt(prompt: Prompt, columns: Sequence[str]) -> None:
    if callable(prompt):
        return
    if not isinstance(prompt, str):
        raise PromptError(f"prompt must be a str.format template or a callable(row) -> str, "
                          f"got {type(prompt).__name__}: {prompt!r}")
    if not prompt.strip():
        raise PromptError("prompt is empty; pass a template such as 'Summarize: {text}'.")
    for name in template_fields(prompt):
        if name not in columns:
            close = difflib.get_close_matches(name, columns, n=1)
            hint = f" Did you mean {{{close[0]}}}?" if close else ""
            raise PromptError(f"prompt template names column {name!r}, which the frame does not have.{hint} "
                              f"Columns: {list(columns)}")


@dataclass(frozen=True)
class PromptPlan:
    """How a step's prompts get rendered, and how the step definition records the prompt."""

    prompt: Prompt
    kind: str  # "template" (rendered in SQL), "python_template" or "python"
    text: str  # the template, or a description of the callable, for llmledger_steps
    digest: str  # changes whenever the prompt's definition changes

    @property
    def in_sql(self) -> bool:
        return self.kind == "template"

    @property
    def incremental(self) -> bool:
        """Rows whose stored inputs did not change need no new rendering (false for callables)."""
        return self.kind != "python"

    def sql(self, alias: str = "") -> str:
        """SQL rendering the template over the fact table's (or a registered frame's) columns."""
        prefix = f"{alias}." if alias else ""
        parts = []
        for literal, field_name, _, _ in string.Formatter().parse(str(self.prompt)):
            if literal:
                parts.append("'" + literal.replace("'", "''") + "'")
            if field_name is not None:
                parts.append(f"coalesce(CAST({prefix}{q(field_name)} AS VARCHAR), '')")
        return f"concat({', '.join(parts)})" if len(parts) > 1 else (parts[0] if parts else "''")

    def render(self, frame: pl.DataFrame, key: Sequence[str]) -> pl.Series:
        return render(self.prompt, frame, key)

    def render_chunks(self, frame: pl.DataFrame, key: Sequence[str]) -> Iterator[pl.DataFrame]:
        """(key..., prompt) frames of at most RENDER_CHUNK rows, so big frames never hold every prompt at once."""
        for start in range(0, frame.height, RENDER_CHUNK):
            part = frame.slice(start, RENDER_CHUNK)
            yield part.select(key).with_columns(self.render(part, key).alias("prompt"))


def plan_prompt(prompt: Prompt, frame: pl.DataFrame, stored: Sequence[str]) -> PromptPlan:
    """Decide how `prompt` is rendered. `stored`: the frame columns the fact table holds (key and copies)."""
    if callable(prompt):
        name = getattr(prompt, "__qualname__", None) or type(prompt).__name__
        code = getattr(prompt, "__code__", None)
        digest = _code_digest(code) if isinstance(code, types.CodeType) else name
        return PromptPlan(prompt, "python", f"<python callable {getattr(prompt, '__module__', '?')}.{name}>",
                          digest)
    digest = hashlib.md5(prompt.encode()).hexdigest()
    simple = True
    for _, field_name, spec, conversion in string.Formatter().parse(prompt):
        if field_name is None:
            continue
        dtype = frame.schema.get(field_name)
        if spec or conversion or field_name not in stored or dtype is None or \
                not (isinstance(dtype, _TEXT_LIKE) or dtype.is_integer()):
            simple = False
    if simple:
        return PromptPlan(prompt, "template", prompt, digest)
    incremental = all(name in stored for name in template_fields(prompt))
    return PromptPlan(prompt, "python_template" if incremental else "python", prompt, digest)


def _code_digest(code: types.CodeType) -> str:
    """A digest of a function's code that is the same in every session (no addresses, no file names)."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_digest(const).encode() if isinstance(const, types.CodeType) else repr(const).encode())
    return hashlib.md5(b"\0".join(parts)).hexdigest()


def render(prompt: Prompt, frame: pl.DataFrame, key: Sequence[str]) -> pl.Series:
    """One prompt string per row, in Python. Nulls render as an empty string."""
    out: list[str] = []
    for row in frame.iter_rows(named=True):
        values = {k: ("" if v is None else v) for k, v in row.items()}
        try:
            text = prompt(row) if callable(prompt) else prompt.format(**values)
        except Exception as exc:
            where = {k: row[k] for k in key}
            raise PromptError(f"building the prompt failed for the row with key {where}: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(text, str):
            where = {k: row[k] for k in key}
            raise PromptError(f"the prompt callable returned {type(text).__name__} for the row with key "
                              f"{where}; it must return a str.")
        out.append(text)
    return pl.Series("prompt", out, dtype=pl.String)
