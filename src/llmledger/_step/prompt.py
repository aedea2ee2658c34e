"""Turning rows into prompts: templates checked against the frame, rendered in SQL or in Python.

A `str.format` template over plain text and integer columns is rendered by the
ledger itself in SQL (`PromptPlan.sql`), so rows whose inputs have not changed
are never rendered again and a no-op rerun renders nothing. Anything else (a
format spec, a float column, a callable) is rendered here in Python, in
chunks. Both give the same text as `template.format(**row)` with nulls as "".
"""

from __future__ import annotations

import contextvars
import difflib
import hashlib
import re
import string
import types
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import polars as pl

from llmledger._step.request import canonical_json
from llmledger._step.sqltext import q
from llmledger.errors import LedgerError, PromptError

if TYPE_CHECKING:
    from llmledger._step.attach import Attachments

Prompt = str | Callable[[dict[str, Any]], str]

# Casting these to text gives what str() gives in Python, in polars and in SQL alike.
_TEXT_LIKE = (pl.String, pl.Categorical, pl.Enum)
RENDER_CHUNK = 100_000


def template_fields(template: str) -> list[str]:
    """The column names a str.format template reads, in order of first use."""
    return list(dict.fromkeys(_head(field) for field in _field_names(template)))


def _head(field_name: str) -> str:
    """The column a field names: `extract` of `extract.company`, `row` of `row[0]`."""
    return field_name.split(".", 1)[0].split("[", 1)[0]


def _field_names(template: str) -> list[str]:
    """The whole field names of a template (`text`, `extract.company`, `row[0]`), each once; PromptError for what
    is not a valid format string, or a positional field."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise PromptError(
            f"prompt template {template!r} is not a valid format string: {exc}. "
            "Write literal braces as '{{' and '}}'."
        ) from None
    fields = [field_name for _, field_name, _, _ in parsed if field_name is not None]
    positional = next((f for f in fields if f == "" or f.isdigit()), None)
    if positional is not None:
        raise PromptError(
            f"prompt template {template!r} has a positional field '{{{positional}}}'; "
            "name a column instead, e.g. '{text}'."
        )
    return list(dict.fromkeys(fields))


def check_prompt(prompt: Prompt, columns: Sequence[str], steps: Collection[str] = ()) -> None:
    """A template may name the frame's columns and the table's other steps (`{sentiment}`, `{extract.company}`)."""
    if callable(prompt):
        return
    if not isinstance(prompt, str):
        raise PromptError(
            f"prompt must be a str.format template or a callable(row) -> str, got {type(prompt).__name__}: {prompt!r}"
        )
    if not prompt.strip():
        raise PromptError("prompt is empty; pass a template such as 'Summarize: {text}'.")
    for field_name in _field_names(prompt):
        name = _head(field_name)
        if name in columns and name not in steps and field_name != name:
            raise PromptError(
                f"prompt template reads {{{field_name}}}: a template names columns, and reading an attribute or an "
                f"item of a value ('{field_name[len(name) :]}') would send Python's text for it (such as "
                f"'<built-in method ...>'), not data. Name the column alone, {{{name}}}, with a format spec if you "
                f"like ({{{name}:>10}}), or compute the value into a column first (df.with_columns(...)); a "
                "callable prompt=lambda row: ... may do anything."
            )
        if name in steps and "[" in field_name:  # the ledger renders `{step.field}` in SQL; an item it cannot
            raise PromptError(
                f"prompt template reads {{{field_name}}}: a field of another step names its answer, {{{name}}}, "
                f"or a field of a structured answer, {{{name}.field}}; reading an item of it "
                f"('{field_name[field_name.index('[') :]}') is not a field. Name the answer or its field, or "
                "compute the value into a column first; a callable prompt=lambda row: ... may do anything."
            )
        if name not in columns and name not in steps:
            close = difflib.get_close_matches(name, [*columns, *steps], n=1)
            hint = f" Did you mean {{{close[0]}}}?" if close else ""
            if not name.isidentifier() and not close:  # literal JSON or code: `{"spam": true}`
                hint = (
                    f" If {{{name}...}} is meant literally (JSON, code), write its braces doubled: "
                    f"'{{{{' and '}}}}', as in {_doubled(prompt)!r}."
                )
            others = f"; steps of this table: {sorted(steps)}" if steps else ""
            raise PromptError(
                f"prompt template names column {name!r}, which the frame does not have.{hint} "
                f"Columns: {list(columns)}{others}"
            )


def _doubled(template: str, limit: int = 60) -> str:
    """The start of `template` with every brace that does not enclose a field name doubled (shown in the hint,
    so the fix can be copied)."""
    out, i = [], 0
    while i < len(template):
        field = re.match(r"\{[A-Za-z_][A-Za-z0-9_.]*\}", template[i:])
        if field:
            out.append(field.group(0))
            i += field.end()
            continue
        out.append(template[i] * 2 if template[i] in "{}" else template[i])
        i += 1
    fixed = "".join(out)
    return fixed if len(fixed) <= limit else fixed[:limit] + "..."


class Rendering(NamedTuple):
    in_sql: bool  # DuckDB renders the template over the fact table's columns
    incremental: bool  # rows whose stored inputs did not change keep their request (no callables)


@dataclass(frozen=True)
class PromptPlan:
    """A step's prompt as the step definition records it, and what rendering it takes."""

    prompt: Prompt
    kind: str  # "template" or "python" (a callable)
    text: str  # the template, or a description of the callable, for llmledger_steps
    digest: str  # changes whenever the prompt's definition changes
    fields: tuple[str, ...] = ()  # the columns a template reads
    simple: bool = False  # every field is a plain text or integer column: SQL renders it exactly
    upstream: tuple[str, ...] = ()  # other steps of the table the template reads (rendered by the ledger in SQL)
    # attach=: the row's files go in its message, which is then rendered in Python on every call (a file can
    # change under the same path)
    attachments: Attachments | None = field(default=None, compare=False)

    def rendering(self, stored: Collection[str]) -> Rendering:
        """How rows get their prompts when the fact table holds the frame's columns `stored`.

        A template reading a column the ledger does not copy (another step's output, a Python
        object) is rendered from the frame on every call, so a change there is never missed. One reading
        another step is rendered by the ledger, in SQL over the stored answers, on every call.
        """
        if self.upstream:
            return Rendering(in_sql=True, incremental=False)
        if self.attachments is not None:
            return Rendering(in_sql=False, incremental=False)
        if self.kind == "python" or not set(self.fields) <= set(stored):
            return Rendering(in_sql=False, incremental=False)
        return Rendering(in_sql=self.simple, incremental=True)

    def sql(self, alias: str = "", upstream: Mapping[str, str] | None = None) -> str:
        """SQL rendering the template over the fact table's (or a registered frame's) columns.

        `upstream` maps the template's upstream fields (`extract.company`) to their SQL (see graph.py).
        """
        prefix = f"{alias}." if alias else ""
        parts = []
        for literal, field_name, _, _ in string.Formatter().parse(str(self.prompt)):
            if literal:
                parts.append("'" + literal.replace("'", "''") + "'")
            if field_name is not None and upstream and field_name in upstream:
                parts.append(f"coalesce({upstream[field_name]}, '')")
            elif field_name is not None:
                parts.append(f"coalesce(CAST({prefix}{q(field_name)} AS VARCHAR), '')")
        return f"concat({', '.join(parts)})" if len(parts) > 1 else (parts[0] if parts else "''")

    def render(self, frame: pl.DataFrame, key: Sequence[str]) -> pl.Series:
        return render(self.prompt, frame, key, self.attachments)

    def render_chunks(self, frame: pl.DataFrame, key: Sequence[str]) -> Iterator[pl.DataFrame]:
        """(key..., llmledger_prompt) frames of at most RENDER_CHUNK rows: big frames never hold every prompt at
        once."""
        for start in range(0, frame.height, RENDER_CHUNK):
            part = frame.slice(start, RENDER_CHUNK)
            yield part.select(key).with_columns(self.render(part, key).alias("llmledger_prompt"))


def plan_prompt(prompt: Prompt, frame: pl.DataFrame, steps: Collection[str] = ()) -> PromptPlan:
    """Describe a checked prompt: its text and digest for the step definition, and how it can be rendered.

    `steps`: the other steps of the table; fields naming one make this a step fed by that one.
    """
    if callable(prompt):
        name = getattr(prompt, "__qualname__", None) or type(prompt).__name__
        code = getattr(prompt, "__code__", None)
        digest = _code_digest(code) if isinstance(code, types.CodeType) else name
        return PromptPlan(prompt, "python", f"<python callable {getattr(prompt, '__module__', '?')}.{name}>", digest)
    upstream = tuple(name for name in template_fields(prompt) if name in steps)
    simple = True
    for _, field_name, spec, conversion in string.Formatter().parse(prompt):
        if field_name is None:
            continue
        root = field_name.split(".", 1)[0].split("[", 1)[0]
        if root in upstream:
            if spec or conversion:
                raise PromptError(
                    f"prompt field {{{field_name}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} reads step {root!r}: fields of other steps "
                    "take no format spec or conversion; write {" + field_name + "}."
                )
            continue
        dtype = frame.schema.get(field_name)
        if spec or conversion or dtype is None or not (isinstance(dtype, _TEXT_LIKE) or dtype.is_integer()):
            simple = False
            if upstream:
                what = (
                    f"column {field_name!r} is {dtype}"
                    if dtype is not None
                    else f"{{{field_name}}} is not a plain column"
                )
                raise PromptError(
                    f"a template that reads another step ({', '.join(upstream)}) is rendered by "
                    f"the ledger in SQL, which renders text and integer columns exactly, but {what}"
                    f"{' with a format spec' if spec or conversion else ''}. Make it a text column "
                    f"first, e.g. df.with_columns(pl.col({field_name!r}).cast(pl.String))."
                )
    return PromptPlan(
        prompt,
        "template",
        prompt,
        hashlib.md5(prompt.encode()).hexdigest(),
        tuple(template_fields(prompt)),
        simple,
        upstream,
    )


def stored_template(template: str, upstream: tuple[str, ...]) -> PromptPlan:
    """The plan of a template read back from the store (for finishing a step fed by others from the store alone)."""
    return PromptPlan(
        template,
        "template",
        template,
        hashlib.md5(template.encode()).hexdigest(),
        tuple(template_fields(template)),
        True,
        upstream,
    )


def _code_digest(code: types.CodeType) -> str:
    """A digest of a function's code that is the same in every session (no addresses, no file names)."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_digest(const).encode() if isinstance(const, types.CodeType) else repr(const).encode())
    return hashlib.md5(b"\0".join(parts)).hexdigest()


# Set while a callable prompt renders a row: llmledger refuses to open a store then (`_ledger.open.open_ledger`):
# the callable runs inside the run's transaction, so a call of llmledger on that store from it waited for itself
# forever (found in a trial).
RENDERING: contextvars.ContextVar[bool] = contextvars.ContextVar("llmledger_rendering", default=False)


def render(
    prompt: Prompt, frame: pl.DataFrame, key: Sequence[str], attachments: Attachments | None = None
) -> pl.Series:
    """One prompt string per row, in Python. Nulls render as an empty string.

    With `attachments`, each row's message is its files then its text, as canonical JSON content blocks.
    """
    out: list[str] = []
    for index, row in enumerate(frame.iter_rows(named=True)):
        values = {k: ("" if v is None else v) for k, v in row.items()}
        token = RENDERING.set(True)
        try:
            text = prompt(row) if callable(prompt) else prompt.format(**values)
        except LedgerError:
            raise
        except Exception as exc:
            where = {k: row[k] for k in key}
            raise PromptError(
                f"building the prompt failed for the row with key {where}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            RENDERING.reset(token)
        if not isinstance(text, str):
            where = {k: row[k] for k in key}
            raise PromptError(
                f"the prompt callable returned {type(text).__name__} for the row with key "
                f"{where}; it must return a str."
            )
        if attachments is not None:
            from llmledger._step.attach import row_content

            blocks = attachments.blocks(row, str({k: row[k] for k in key}), frame, index)
            text = canonical_json(row_content(blocks, text, attachments.api))
        out.append(text)
    return pl.Series("prompt", out, dtype=pl.String)
