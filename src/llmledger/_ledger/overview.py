"""The whole store at a glance, read on one connection: every step's rows by status, what it cost, who holds its
claims, its errors by kind, and the Message Batches still processing (`llmledger.show`, `llmledger status`).

Plain SQL that DuckDB and PostgreSQL both run, one scan per question, none of them sorting every row. An
error's kind is the text before its first colon ("429 RateLimitError (rate_limit_error)", "refusal", "the
answer does not match the output schema"), the rule the live view of a run groups by (`_draw.error_kind`),
so both show one line per kind.
"""

from __future__ import annotations

from typing import Any

from llmledger._ledger.counts import status_counts
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import table_exists
from llmledger._ledger.schema import BATCHES_TABLE, RUNS_TABLE, list_steps
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import BatchOverview, Claims, ErrorKind, Overview, StepOverview
from llmledger._step.sqltext import q

ERROR_KINDS = 5  # kinds shown per step, the commonest first


def read_overview(con: Con, table: str | None = None) -> Overview:
    """Everything `show` draws, read on one connection."""
    counts = status_counts(con, table)
    keys = {(t, s): k for t, s, k in list_steps(con, table)}
    steps = []
    for row in counts.iter_rows(named=True):
        tbl, step = row["table"], row["step"]
        numbers = {k: int(v or 0) for k, v in row.items() if k not in ("table", "step")}
        overview = StepOverview(tbl, step, numbers)
        _usage(con, overview, keys[tbl, step])
        steps.append(overview)
    batches = _batches(con, table) if table_exists(con, BATCHES_TABLE) else []
    known = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY table_name"
    ).fetchall()
    return Overview(steps, batches, [r[0] for r in known if not r[0].startswith("llmledger_")])


def _usage(con: Con, s: StepOverview, key_columns: list[str]) -> None:
    """Cost and paid rows; the processes holding claims; FAILED / NEEDS_REVIEW rows by kind of error."""
    t, status = q(s.table), q(s.step + "_status")
    cost = q(s.step + "_cost_usd")
    answers_usd, paid, unpriced = con.execute(  # an answer of no known cost: no price, or the server sent no usage
        f"SELECT coalesce(sum({cost}), 0)::DOUBLE, count(*) FILTER (WHERE {cost} > 0), "
        f"count(*) FILTER (WHERE {cost} IS NULL AND {q(s.step)} IS NOT NULL) FROM {t}"
    ).fetchall()[0]
    s.cost_usd, s.paid_rows, s.unpriced_rows = float(answers_usd), int(paid), int(unpriced)
    if table_exists(con, RUNS_TABLE):
        calls, spent, unknown = con.execute(
            f"SELECT coalesce(sum(calls), 0)::BIGINT, coalesce(sum(cost_usd), 0)::DOUBLE, "
            f"count(*) FILTER (WHERE calls > 0 AND cost_usd IS NULL) FROM {RUNS_TABLE} "
            "WHERE table_name = ? AND step = ?",
            [s.table, s.step],
        ).fetchall()[0]
        s.calls, s.spent_usd, s.spent_unknown = int(calls), float(spent), bool(unknown)
    if s.counts.get("RUNNING"):
        by = q(s.step + "_claimed_by")
        s.claims = [
            Claims(str(r[0]), int(r[1]), r[2])
            for r in con.execute(
                f"SELECT coalesce({by}, '?'), count(*), min({q(s.step + '_running_started_at')}) FROM {t} "
                f"WHERE {status} = 'RUNNING' GROUP BY 1 ORDER BY 2 DESC, 1"
            ).fetchall()
        ]
    if s.counts.get("FAILED") or s.counts.get("NEEDS_REVIEW"):
        key = Layout(s.table, s.step, key_columns, []).key_json()
        message = f"coalesce({q(s.step + '_error')}, '')"
        kind = f"coalesce(nullif(trim(split_part({message}, ':', 1)), ''), 'no error recorded')"
        bad = f"FROM {t} AS t WHERE {status} IN ('FAILED', 'NEEDS_REVIEW')"
        kinds = con.execute(
            f"SELECT {kind} AS kind, count(*) AS n {bad} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {ERROR_KINDS}"
        ).fetchall()
        for name, rows in kinds:  # one example each: the first row found, not a sort of every failed row
            example = con.execute(f"SELECT {key}, {message} {bad} AND {kind} = ? LIMIT 1", [name]).fetchall()
            s.errors.append(ErrorKind(str(name), int(rows), *(str(v) for v in (example or [("", "")])[0])))


def _batches(con: Con, table: str | None) -> list[BatchOverview]:
    where, params = ("AND table_name = ?", [table]) if table else ("", [])
    rows: list[Any] = con.execute(
        f"SELECT batch_id, table_name, step, coalesce(rows_sent, 0), coalesce(requests, 0), state, "
        f"processing_status, submitted_at FROM {BATCHES_TABLE} WHERE state IN ('submitting', 'submitted') {where} "
        "ORDER BY created_at",
        params,
    ).fetchall()
    return [BatchOverview(*r) for r in rows]
