"""Turning rows into prompts, and prompts into fingerprints.

A fingerprint is the md5 of everything that decides a row's answer (model,
system, max_tokens, the rendered prompt). Stored next to the output, it lets a
rerun tell that a DONE row is stale without re-paying for it.
"""

from __future__ import annotations

import difflib
import string
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import polars as pl

from .errors import PromptError

Prompt = str | Callable[[dict[str, Any]], str]

PROMPT_COL = "__llmledger_prompt"
FINGERPRINT_COL = "__llmledger_fingerprint"

# Casting these to text gives what str() gives in Python, so the vectorised path
# renders exactly what str.format would.
_TEXT_LIKE = (pl.String, pl.Categorical, pl.Enum)


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


def _is_simple(template: str, frame: pl.DataFrame) -> bool:
    for _, field_name, spec, conversion in string.Formatter().parse(template):
        if field_name is None:
            continue
        if spec or conversion or field_name not in frame.columns:
            return False
        dtype = frame.schema[field_name]
        if not (isinstance(dtype, _TEXT_LIKE) or dtype.is_integer()):
            return False
    return True


def render(prompt: Prompt, frame: pl.DataFrame, key: Sequence[str]) -> pl.Series:
    """One prompt string per row. Nulls render as an empty string."""
    if isinstance(prompt, str) and _is_simple(prompt, frame):
        parts: list[pl.Expr] = []
        for literal, field_name, _, _ in string.Formatter().parse(prompt):
            if literal:
                parts.append(pl.lit(literal))
            if field_name is not None:
                parts.append(pl.col(field_name).cast(pl.String).fill_null(""))
        if not parts:
            return pl.Series(PROMPT_COL, [prompt] * frame.height, dtype=pl.String)
        return frame.select(pl.concat_str(parts).alias(PROMPT_COL)).to_series()

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
    return pl.Series(PROMPT_COL, out, dtype=pl.String)


def request_signature(*, model: str, system: str | None, max_tokens: int) -> str:
    """The part of the fingerprint shared by every row of a call."""
    return f"{model}\x1f{system or ''}\x1f{max_tokens}\x1f"


def fingerprints(prompts: pl.Series, signature: str) -> pl.Series:
    """md5(signature || prompt) per row, computed by DuckDB so it is stable across versions."""
    con = duckdb.connect()
    try:
        frame = pl.DataFrame({PROMPT_COL: prompts})
        con.register("prompts", frame)
        return con.sql(f"SELECT md5($sig || {PROMPT_COL}) AS {FINGERPRINT_COL} FROM prompts",
                       params={"sig": signature}).pl().to_series()
    finally:
        con.close()
