"""How a call finds its work: `prepare` records a frame and selects from it, `resume` selects from the store alone.

Each is one exclusive transaction: the schema brought up to date, the frame's rows and requests written, the
journals of dead runs merged, lost claims taken back, and the rows to claim chosen (`Selection`). Mixed into
`ledger.SQLLedger`, whose other verbs are a run's claims and commits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from llmledger._ledger.batch_join import join_open_batches
from llmledger._ledger.budget import average_paid_in
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.shared import column_types, one, registered, table_exists
from llmledger._ledger.graph import StepGraph
from llmledger._ledger.prepare import (
    establish_table,
    frame_columns,
    insert_rows,
    legacy_signature,
    refresh_rows,
    render_dependent,
    render_rows,
    set_output_type,
)
from llmledger._ledger.rehearsal import rehearse as rehearsal
from llmledger._ledger.reuse import known_answers
from llmledger._ledger.schema import (
    current_version,
    list_steps,
    migrate,
    owned_columns,
    record_step,
    skipped_nulls,
)
from llmledger._ledger.states import Redo, Status
from llmledger._ledger.survey import Layout, check_where, flag_sql, survey
from llmledger._ledger.types import RunParams, Selection, StepDefinition
from llmledger._ledger.verbs import (
    fed_layout,
    from_legacy,
    input_columns,
    merge_journals,
    recover_claims,
    requests_of,
    set_aside_simulated,
)
from llmledger._step.prompt import stored_template
from llmledger._step.request import RequestSpec, canonical_json
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError

_PREPARE_FIELDS = ("current", "status", "stale", "eligible", "waiting", "in_where", "output", "kept", "kept_flagged")


class SelectionVerbs:
    """Preparing and resuming a step (mixed into SQLLedger)."""

    conn: Database
    path: Path

    def prepare(
        self,
        definition: StepDefinition,
        frame: pl.DataFrame,
        params: RunParams,
        *,
        dedupe: bool,
        source: pl.DataFrame | None = None,
        inputs: bool = False,
        rehearse: bool = False,
    ) -> Any:
        """One transaction: schema, the frame's rows and requests, journals of dead runs, lost claims, the work.

        `frame` holds the columns the ledger can store; `source` (the same rows, in the same order) is
        what a prompt rendered in Python sees, Python objects included. With `inputs`, claims return
        each row's stored input columns too (for a `validate=` callable). With `rehearse`, nothing is kept:
        the transaction is rolled back and a `Rehearsal` read inside it is returned (estimate).
        """
        self.conn.check()
        merged: list[Path] = []
        unsimulated = [0]
        recovered = [0]

        def work(con: Con) -> Selection:
            now = params.run_started
            migrate(con, now)
            layout = Layout(
                definition.table,
                definition.step,
                definition.key,
                frame_columns(frame, definition.key, owned_columns(con, definition.table, definition.step)),
            )
            columns_before = column_types(con, layout.table) if table_exists(con, layout.table) else {}
            establish_table(con, layout, frame)
            key_types = {k: frame.schema[k] for k in layout.key}
            if layout.step in column_types(con, layout.table):  # a dead run's answers go in under their own type
                merged[:], recovered[0] = merge_journals(con, layout, self.path, key_types)
            request = definition.request
            output = request.output_spec()
            set_output_type(con, layout, "VARCHAR" if output is None else output.sql_type, now)
            record_step(
                con,
                table=layout.table,
                step=layout.step,
                key=layout.key,
                version=definition.version,
                model=request.model,
                system=request.system,
                max_tokens=request.max_tokens,
                options=canonical_json(request.options),
                request=request.to_json(),
                prompt=definition.prompt.text,
                prompt_kind=definition.prompt.kind,
                upstream=list(definition.prompt.upstream),
                now=now,
                skip_nulls=list(definition.skip_nulls) or None,
            )
            graph = StepGraph.load(con, layout.table, layout.step)
            layout = fed_layout(layout, graph)
            check_where(con, layout.table, params.where)
            recover_claims(con, layout, params)
            unsimulated[0] = set_aside_simulated(con, layout, params.source, now)
            sql_params = params.sql(definition.version)
            altered = column_types(con, layout.table).keys() != columns_before.keys()  # a new table version to hold

            def look(**how: bool) -> pl.DataFrame:  # the frame's rows as the ledger holds them now
                return survey(con, layout, frame, fields=_PREPARE_FIELDS, params=sql_params, where=params.where,
                              named=params.named, **how)  # fmt: skip

            found = look(wrote=altered)
            if params.guard_inputs and columns_before and bool((found["changed"] & found["exists"]).any()):
                _refuse_rewriting_answered_inputs(con, layout, frame, list(columns_before))
            wrote = self._write_frame(con, layout, definition, frame, found, frame if source is None else source, graph)
            if wrote:
                found = look(compare=False, wrote=True)
            chosen = found["eligible"] & found["in_where"]
            if dedupe and params.redo.reuses_answers:  # identical requests in a batch still processing: wait for it
                joined = join_open_batches(
                    con, layout, frame.select(layout.key).filter(chosen), validated=inputs, source=params.source
                )
                if joined.height:
                    into = (
                        frame.select(layout.key)
                        .join(joined.with_columns(pl.lit(True).alias("_joined")), on=layout.key, how="left")["_joined"]
                        .is_not_null()
                    )
                    chosen = chosen & ~into
                    found = found.with_columns(
                        pl.when(into).then(pl.lit(Status.SUBMITTED)).otherwise("status").alias("status")
                    )
            status = found["status"]
            selection = _selection(
                con,
                layout,
                version=definition.version,
                work=frame.select(layout.key).filter(chosen),
                sql_params=sql_params,
                key_types=key_types,
                params=params,
                dedupe=dedupe,
                inputs=inputs,
                stale=int(found["stale"].sum()),
                running_elsewhere=int((status == Status.RUNNING).sum()),
                needs_review=int((status == Status.NEEDS_REVIEW).sum()),
                waiting=int((found["waiting"] & found["in_where"]).sum()),
                in_batches=int((status == Status.SUBMITTED).sum()),
                done_skipped=int(((status == Status.DONE) & ~chosen).sum()),
                survey=found.select("status", "output", "stale", "kept", "kept_flagged"),
                where=params.where,
                named=params.named,
                unsimulated=unsimulated[0],
                recovered=recovered[0],
            )
            return rehearsal(con, selection) if rehearse else selection  # type: ignore[return-value]

        try:
            selection = self.conn.transaction(work, commit=not rehearse, exclusive=True)
        except InvalidInputError:
            self.conn.remove()  # the empty folders made for a new store (the store appears only on a commit)
            raise
        if rehearse:
            self.conn.remove()  # a rehearsal leaves no folder behind either
            return selection
        for path in merged:
            path.unlink(missing_ok=True)
        return selection

    def _write_frame(
        self,
        con: Con,
        layout: Layout,
        definition: StepDefinition,
        frame: pl.DataFrame,
        found: pl.DataFrame,
        source: pl.DataFrame,
        graph: StepGraph,
    ) -> bool:
        """Insert new rows, refresh changed ones, render what is not current. True when anything was written."""
        exists, changed = found["exists"], found["changed"] & found["exists"]
        rendering = definition.prompt.rendering({*layout.key, *layout.mirror})
        fed = bool(definition.prompt.upstream)
        wrote = False
        if not exists.all():
            insert_rows(con, layout, definition, frame.filter(~exists), in_sql=rendering.in_sql and not fed)
            wrote = True
        if changed.any():
            refresh_rows(con, layout, frame.filter(changed))
            wrote = True
        if fed:  # rendered from the stored answers of the steps it reads, whose changes the frame cannot show
            rendered = render_dependent(con, layout, definition.prompt, definition.version, definition.request, graph)
            return wrote or rendered > 0
        if rendering.incremental:
            need = changed | ~found["current"]
            if rendering.in_sql:
                need = need & exists  # new rows got their request as they were inserted
        else:
            need = pl.repeat(True, frame.height, eager=True)
        if need.any():
            render_rows(
                con,
                layout,
                definition,
                (frame if rendering.in_sql else source).filter(need),
                in_sql=rendering.in_sql,
                legacy_signature=legacy_signature(definition, from_legacy(con)),
            )
            wrote = True
        return wrote

    def resume(self, table: str, step: str, params: RunParams, *, dedupe: bool, inputs: bool = False) -> Selection:
        """The work of a step that apply_llm prepared, selected from the store alone."""
        self.conn.check(must_exist=True)
        merged: list[Path] = []

        def work(con: Con) -> Selection:
            migrate(con, params.run_started)
            found = current_version(con, table, step)
            if found is None or not table_exists(con, table):
                known = [f"{t}.{s}" for t, s, _ in list_steps(con)]
                raise InvalidInputError(
                    f"the store has no step {step!r} on table {table!r} that apply_llm "
                    f"prepared; it has: {known or 'no steps'}. Run apply_llm once to record "
                    "the step and its requests."
                )
            version, request, key = found
            skipped = skipped_nulls(con, table, step)  # apply_llm's skip_nulls=True holds here too
            where: str | None = " AND ".join(
                [f"({params.where})"] * bool(params.where)
                + [f"{q(c)} IS NOT NULL" for c in skipped if c in column_types(con, table)]
            )
            where = where or None  # nothing to narrow by
            graph = StepGraph.load(con, table, step)
            layout = fed_layout(Layout(table, step, key, []), graph)
            if graph.upstream.get(step):  # the steps it reads may have moved since apply_llm rendered it
                render_dependent(
                    con,
                    layout,
                    stored_template(graph.templates[step] or "", graph.upstream[step]),
                    version,
                    RequestSpec.from_json(request),
                    graph,
                )
            check_where(con, table, where)
            work_sql = params.sql(version)
            key_list = ", ".join(q(k) for k in key)
            key_types = dict(con.sql(f"SELECT {key_list} FROM {q(table)} LIMIT 0").pl().schema)
            merged[:], recovered = merge_journals(con, layout, self.path, key_types)
            recover_claims(con, layout, params)
            unsimulated = set_aside_simulated(con, layout, params.source, params.run_started)
            flags = flag_sql(layout, where, named=params.named)
            open_ended = dialect_of(con).claims_from_table  # no list of keys to hold
            work = con.sql(
                f"SELECT {key_list} FROM {q(table)} AS t WHERE {flags['current']} "
                f"AND {flags['eligible']} AND {flags['in_where']}{' LIMIT 0' if open_ended else ''}",
                params=work_sql,
            ).pl()
            pending, stale, running, review, unprepared, waiting, submitted = one(
                con,
                (
                    f"SELECT count(*) FILTER (WHERE {flags['current']} AND {flags['eligible']}), "
                    f"count(*) FILTER (WHERE {flags['current']} AND {flags['stale']}), "
                    f"count(*) FILTER (WHERE {flags['status']} = 'RUNNING'), "
                    f"count(*) FILTER (WHERE {flags['status']} = 'NEEDS_REVIEW'), "
                    f"count(*) FILTER (WHERE NOT {flags['current']} AND {flags['eligible']}), "
                    f"count(*) FILTER (WHERE {flags['waiting']}), "
                    f"count(*) FILTER (WHERE {flags['status']} = 'SUBMITTED') "
                    f"FROM {q(table)} AS t WHERE {flags['in_where']}"
                ),
                work_sql,
            )
            return _selection(
                con,
                layout,
                version=version,
                work=work,
                sql_params=work_sql,
                key_types=key_types,
                params=params,
                dedupe=dedupe,
                inputs=inputs,
                stale=int(stale),
                running_elsewhere=int(running),
                needs_review=int(review),
                unprepared=int(unprepared),
                waiting=int(waiting),
                in_batches=int(submitted),
                open_ended=open_ended,
                pending=int(pending),
                where=where,
                named=params.named,
                reuse=open_ended and dedupe and params.redo.reuses_answers,
                unsimulated=unsimulated,
                recovered=recovered,
            )

        selection = self.conn.transaction(work, exclusive=True)
        for path in merged:
            path.unlink(missing_ok=True)
        return selection


def _selection(
    con: Con,
    layout: Layout,
    *,
    version: str,
    work: pl.DataFrame,
    sql_params: dict[str, Any],
    key_types: dict[str, pl.DataType],
    params: RunParams,
    dedupe: bool,
    inputs: bool,
    stale: int,
    **counts: Any,
) -> Selection:
    """The `Selection` of a prepared or resumed step: its work and what the run needs to claim and report it."""
    requests = requests_of(con, layout)
    return Selection(
        average_paid=average_paid_in(con, layout.table, layout.step),
        inputs=input_columns(con, layout) if inputs or _attaching(requests) else [],
        layout=layout,
        version=version,
        requests=requests,
        work=work,
        params=sql_params,
        lease=params.lease,
        key_types=key_types,
        stale=stale if params.redo is not Redo.STALE else 0,
        known=known_answers(con, layout, work, params.source) if dedupe and params.redo.reuses_answers else {},
        source=params.source,
        dedupe=dedupe,
        **counts,
    )


def _attaching(requests: dict[str, RequestSpec]) -> bool:
    """Whether a request of the step attaches files: claims then return the stored input columns, in which the
    sender finds their paths and URLs."""
    return any(r.attach for r in requests.values())


def _refuse_rewriting_answered_inputs(con: Con, layout: Layout, frame: pl.DataFrame, before: list[str]) -> None:
    """The default table, given a frame whose values differ from those stored for rows some step has answered:
    most likely another dataset sharing its keys (reviews, then SMS, both `id` 1..n). Say so before writing.

    Only input columns the table had are compared (a frame may bring new ones), and every step of the table
    counts (the other dataset may come under another step's name)."""
    inputs = [c for c in layout.mirror if c in before]
    steps = [s for _, s, _ in list_steps(con, layout.table)]
    if not inputs or not steps:
        return
    differs = " OR ".join(f"t.{q(c)} IS DISTINCT FROM i.{q(c)}" for c in inputs)
    answered = " OR ".join(f"t.{q(s + '_status')} = 'DONE'" for s in steps)
    with registered(con, "llmledger_incoming_check", frame.select([*layout.key, *inputs])):
        n = one(
            con,
            f"SELECT count(*) FROM {q(layout.table)} AS t JOIN llmledger_incoming_check AS i ON "
            f"{layout.key_join('t', 'i')} WHERE ({differs}) AND ({answered})",
        )[0]
    if n:
        raise InvalidInputError(
            f"this frame would change the input columns of {n:,} rows of the default table {layout.table!r} that "
            f"already have answers (they would turn stale): is it another dataset with the same keys? Pass "
            f"table='...' naming a table for it (e.g. table='sms'); or, to update those rows on purpose, pass "
            f"table={layout.table!r}. Nothing was written."
        )
