"""Steps that feed steps: which step of a table reads which, and what fresh, stale and waiting mean across them.

A template may name another step of the same table, `"{sentiment}"`, or a
field of a structured one, `"{extract.company}"`. Such a step is rendered by
the ledger in SQL from the upstream answers it stores, and each row records a
digest of the upstream values its request was rendered from
(`_upstream_fingerprint`). So, for a step S of a row:

    fresh(S)   = S is DONE, its answer was made for its current request, its request was rendered
                 from the upstream values there are now, and every upstream step is fresh
    stale(S)   = S is DONE but not fresh: reported, re-sent only with redo="stale"
    ready(S)   = every upstream step is fresh: only then may S be sent
    waiting(S) = S still needs an answer but is not ready (counted, never sent)

A redo of one upstream row therefore makes exactly that row stale in every
step downstream of it, however long the chain, and `redo="stale"` step by
step re-sends exactly those rows.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

import duckdb

from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import DUCKDB, Dialect, dialect_of
from llmledger._ledger.engine.shared import column_types, table_exists
from llmledger._ledger.schema import STEPS_TABLE
from llmledger._step.sqltext import q
from llmledger.errors import PromptError

_NESTED = ("STRUCT", "MAP", "JSON", "UNION")


def field_paths(template: str) -> list[str]:
    """The fields a template reads, as written (`extract.company`), in order of first use."""
    out: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name and name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class StepGraph:
    """The steps of one table: the template of each (None when prompts were made in Python) and what it reads."""

    templates: dict[str, str | None] = field(default_factory=dict)
    upstream: dict[str, tuple[str, ...]] = field(default_factory=dict)
    field_sql: dict[str, str] = field(default_factory=dict)  # "step.sub" -> SQL over the fact table `t`
    dialect: Dialect = DUCKDB  # of the store the SQL is for

    @classmethod
    def load(cls, con: Con, table: str, step: str | None = None) -> StepGraph:
        """The current definition of every step of `table`, as apply_llm last prepared it.

        Upstream fields are checked and given their SQL for `step` and the steps it reads (all steps
        when None), so a broken definition elsewhere in the table does not stop this one.
        """
        if not table_exists(con, STEPS_TABLE) or "upstream" not in column_types(con, STEPS_TABLE):
            return cls()
        rows = con.execute(
            f"SELECT DISTINCT ON (step) step, prompt, prompt_kind, upstream FROM {STEPS_TABLE} "
            "WHERE table_name = ? AND version IS NOT NULL ORDER BY step, last_prepared_at DESC",
            [table],
        ).fetchall()
        graph = cls(
            {r[0]: (r[1] if r[2] == "template" else None) for r in rows},
            {r[0]: tuple(r[3] or ()) for r in rows},
            dialect=dialect_of(con),
        )
        return graph.typed(con, table, graph.lineage(step) if step is not None else list(graph.templates))

    def lineage(self, step: str) -> list[str]:
        """`step` and every step it reads, directly or through others."""
        order = self.order()
        wanted = {step}
        for s in reversed(order):
            if s in wanted:
                wanted.update(self.upstream.get(s, ()))
        return [s for s in order if s in wanted] or [step]

    def with_step(self, step: str, template: str | None, upstream: tuple[str, ...]) -> StepGraph:
        return StepGraph(
            {**self.templates, step: template}, {**self.upstream, step: upstream}, self.field_sql, self.dialect
        )

    def typed(self, con: Con, table: str, steps: list[str]) -> StepGraph:
        """This graph with SQL for the upstream fields the templates of `steps` read, checked against the table."""
        exprs = dict(self.field_sql)
        for step in steps:
            ups = self.upstream.get(step, ())
            for path in field_paths(self.templates.get(step) or ""):
                root = path.split(".", 1)[0]
                if root in ups and path not in exprs:
                    exprs[path] = upstream_field_sql(con, table, path, step)
        return StepGraph(self.templates, self.upstream, exprs, self.dialect)

    def order(self, preferred: list[str] | None = None) -> list[str]:
        """Steps with every step after the steps it reads; otherwise in the `preferred` order (then by name)."""
        done: list[str] = []

        def visit(step: str, path: tuple[str, ...]) -> None:
            if step in done:
                return
            if step in path:
                raise PromptError(f"steps read each other in a cycle: {' -> '.join((*path, step))}")
            for up in self.upstream.get(step, ()):
                visit(up, (*path, step))
            done.append(step)

        for step in [*(s for s in preferred or [] if s in self.templates), *sorted(self.templates)]:
            visit(step, ())
        return done

    # -- SQL over the fact table (alias `t`) ------------------------------------------------------------
    def digest_sql(self, step: str) -> str:
        """SQL: a digest of the upstream values the step's template reads for a row."""
        paths = [
            p for p in field_paths(self.templates.get(step) or "") if p.split(".", 1)[0] in self.upstream.get(step, ())
        ]
        values = ", ".join(f"coalesce({self.field_sql[p]}, {self.dialect.missing_text})" for p in paths) or "''"
        return f"md5(concat_ws(chr(31), {values}))::UUID"

    def rendered_sql(self, step: str) -> str:
        """SQL: the step's current request was rendered from the upstream values there are now."""
        if not self.upstream.get(step):
            return "true"
        return f"({names(step, 't')['_upstream_fingerprint']} IS NOT DISTINCT FROM {self.digest_sql(step)})"

    def _own_sql(self, step: str) -> str:
        """SQL: the step's own answer is current (DONE, for its current request, from the current inputs)."""
        c = names(step, "t")
        parts = [
            f"{c['_status']} = 'DONE'",
            f"{c['_version']} IS NOT NULL",
            f"{c['_fingerprint']} IS NOT DISTINCT FROM {c['_request_fingerprint']}",
        ]
        if self.upstream.get(step):
            parts.append(self.rendered_sql(step))
        return "(" + " AND ".join(parts) + ")"

    def _ancestors(self, step: str) -> list[str]:
        return [s for s in self.lineage(step) if s != step]

    def fresh_sql(self, step: str) -> str:
        """SQL: the step's answer, and the answer of every step it reads however indirectly, is current.

        Each step's own condition appears once, so the SQL grows with the number of steps, not the paths.
        """
        return "(" + " AND ".join(self._own_sql(s) for s in [*self._ancestors(step), step]) + ")"

    def ready_sql(self, step: str) -> str:
        """SQL: every step this one reads, however indirectly, is fresh, and its request was rendered from them."""
        parts = [self._own_sql(s) for s in self._ancestors(step)]
        if self.upstream.get(step):
            parts.append(self.rendered_sql(step))
        return "(" + " AND ".join(parts) + ")" if parts else "true"

    def stale_sql(self, step: str) -> str:
        return f"({names(step, 't')['_status']} = 'DONE' AND NOT {self.fresh_sql(step)})"


def upstream_field_sql(con: Con, table: str, path: str, step: str) -> str:
    """SQL for one upstream field as prompt text (nested values as JSON), or a PromptError naming the problem."""
    parts = path.split(".")
    if any(not p.isidentifier() for p in parts) or "[" in path:
        raise PromptError(
            f"step {step!r} reads {{{path}}}: name a step or a field of a structured step, "
            "e.g. {extract.company} (no indexing)"
        )
    if dialect_of(con).structured_as_jsonb:
        return _jsonb_field_sql(con, table, parts, step)
    expr = "t." + ".".join(q(p) for p in parts)
    try:
        sql_type = str(con.execute(f"DESCRIBE SELECT {expr} AS v FROM {q(table)} AS t").fetchall()[0][1])
    except duckdb.Error:
        raise PromptError(
            f"step {step!r} reads {{{path}}}, but step {parts[0]!r} has no field {'.'.join(parts[1:])!r}"
        ) from None
    nested = sql_type.startswith(_NESTED) or sql_type.endswith("]")
    return f"to_json({expr})::VARCHAR" if nested else f"CAST({expr} AS VARCHAR)"


def _jsonb_field_sql(con: Con, table: str, parts: list[str], step: str) -> str:
    """PostgreSQL: a structured step is a JSONB column; its fields are checked against the step's output schema."""
    from llmledger._ledger.schema import current_output_spec

    root = "t." + q(parts[0])
    if len(parts) == 1:  # a text answer, or a whole structured one as JSON
        return f"CAST({root} AS VARCHAR)"
    if column_types(con, table).get(parts[0]) != "JSONB":
        raise PromptError(
            f"step {step!r} reads {{{'.'.join(parts)}}}, but step {parts[0]!r} has no field "
            f"{'.'.join(parts[1:])!r} (its answers are text)"
        )
    spec = current_output_spec(con, table, parts[0])
    schema: dict[str, Any] = spec.schema if spec is not None else {}
    for depth, name in enumerate(parts[1:], start=1):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            schema = spec.schema.get("$defs", {}).get(ref.split("/")[-1], {})  # type: ignore[union-attr]
        schema = schema.get("properties", {}).get(name)
        if schema is None:
            raise PromptError(
                f"step {step!r} reads {{{'.'.join(parts)}}}, but step {parts[0]!r} has no field "
                f"{'.'.join(parts[1 : depth + 1])!r}"
            )
    return f"({root} #>> '{{{','.join(parts[1:])}}}')"
