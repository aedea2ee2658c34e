"""Rows per state for every step: the one partition of a table's rows that `progress()`, `show()`,
`llmledger status` and a run's bar all draw."""

from __future__ import annotations

import polars as pl

from llmledger._ledger.columns import (
    names,
)
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import db_errors, table_exists
from llmledger._ledger.graph import StepGraph
from llmledger._ledger.schema import (
    list_steps,
)
from llmledger._ledger.states import COUNTED, STATUSES
from llmledger._ledger.survey import Layout, flag_sql
from llmledger._ledger.verbs import fed_layout
from llmledger._step.sqltext import q
from llmledger.errors import PromptError


def status_counts(con: Con, table: str | None = None) -> pl.DataFrame:
    """Rows per state for every (table, step), steps after the steps they read: one partition of the rows, the
    one `progress()`, `show()`, `llmledger status` and a run's bar all draw (`COUNTED`), plus `flagged` (rows a
    person flagged, whatever their state) and `total`.

    DONE counts only current answers; `stale` is the DONE rows whose request (or an upstream answer) changed
    since; `waiting` is the NOT_STARTED and FAILED rows whose upstream steps are not fresh yet.
    """
    schema = {
        "table": pl.String,
        "step": pl.String,
        **{st: pl.Int64 for st in COUNTED},
        "flagged": pl.Int64,
        "total": pl.Int64,
    }
    frames = []
    by_table: dict[str, list[str]] = {}
    for tbl, step, _ in list_steps(con, table):
        if table_exists(con, tbl):
            by_table.setdefault(tbl, []).append(step)
    for tbl, steps in by_table.items():
        graph: StepGraph | None = None
        try:
            loaded = StepGraph.load(con, tbl)
            ordered = [s for s in loaded.order(steps) if s in steps] + [s for s in steps if s not in loaded.templates]
            graph = loaded
        except (PromptError, *db_errors()):  # type: ignore[misc]  # an old store not upgraded yet, or a broken definition: no graph
            graph, ordered = None, steps
        for step in ordered:
            layout = Layout(tbl, step, [], [])
            if graph is not None and step in graph.templates:
                layout = fed_layout(layout, graph)
            flags = flag_sql(layout, None)
            stale, waiting = f"coalesce({flags['stale']}, false)", f"coalesce({flags['waiting']}, false)"
            status = flags["status"]
            state = {st: f"{status} = '{st}'" for st in STATUSES}
            state["DONE"] += f" AND NOT {stale}"
            state["stale"] = stale
            for st in ("NOT_STARTED", "FAILED"):
                state[st] += f" AND NOT {waiting}"
            state["waiting"] = waiting
            counts = ", ".join(f"count(*) FILTER (WHERE {state[st]})::BIGINT AS {q(st)}" for st in COUNTED)
            frames.append(
                con.sql(
                    f'SELECT ? AS "table", ? AS step, {counts}, count(*) FILTER (WHERE '
                    f"{names(step)['_flag']} IS NOT NULL)::BIGINT AS flagged, count(*)::BIGINT AS "
                    f"total FROM {q(tbl)} AS t",
                    params=[tbl, step],
                ).pl()
            )
    return pl.concat(frames).cast(schema) if frames else pl.DataFrame(schema=schema)
