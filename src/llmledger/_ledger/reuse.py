"""Answers a request can reuse: paid once, found again by the request's fingerprint.

A fingerprint covers the whole request, so a stored DONE answer to the same fingerprint, from this step, another
step or table of the store, or the history of replaced answers, is an answer to this request too: it costs
nothing and is recorded as reused. A run looks answers up when it selects its work (`selection.py`), and a
PostgreSQL worker when it claims (`verbs.claim_twins`).
"""

from __future__ import annotations

import hashlib
import uuid

import polars as pl

from llmledger._ledger.columns import (
    names,
    output_as_text,
    same_source_sql,
)
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import column_types, registered, table_exists
from llmledger._ledger.history import REUSABLE_REASONS
from llmledger._ledger.schema import (
    HISTORY_TABLE,
    LEGACY_FINGERPRINT_PREFIX,
    list_steps,
)
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import KnownAnswer
from llmledger._step.sqltext import q

KEYS = "llmledger_reuse_keys"
WANTED = "llmledger_wanted"


def upgrade_fingerprint(value: str | None) -> str | None:
    """Journals written by 0.1.0 hold md5 hex fingerprints; map them like the migration maps stored ones."""
    if value is None or "-" in value:
        return value
    return str(uuid.UUID(hashlib.md5((LEGACY_FINGERPRINT_PREFIX + value).encode()).hexdigest()))


def known_answers(con: Con, layout: Layout, work: pl.DataFrame, source: str | None) -> dict[str, KnownAnswer]:
    """One stored DONE answer per request fingerprint the work asks for, from any step of any table in the store,
    or from the answers it replaced (the history), made by a source like the run's `source` (`same_source_sql`).

    A fingerprint covers the whole request, so another step's (or table's) answer to an identical
    request is an answer to this one: it costs nothing and is recorded as reused. So is an answer a
    change of definition replaced: going back to an earlier definition pays nothing for what it had.
    """
    if not work.height:
        return {}
    c = names(layout.step, "t")
    with registered(con, KEYS, work):
        wanted = con.sql(
            f"SELECT DISTINCT {c['_request_fingerprint']}::VARCHAR AS fp FROM {q(layout.table)} AS t "
            f"WHERE {c['_request_fingerprint']} IS NOT NULL AND EXISTS (SELECT 1 FROM {KEYS} AS i "
            f"WHERE {layout.key_join()})"
        ).pl()
    return answers_to(con, layout, wanted, source)


def answers_to(con: Con, layout: Layout, wanted: pl.DataFrame, source: str | None) -> dict[str, KnownAnswer]:
    """One stored DONE answer per fingerprint of `wanted` (column `fp`) from a source like `source`: this step's
    first, then the store's, then the history's (`history.REUSABLE_REASONS` only, the latest first)."""
    if not wanted.height:
        return {}
    sources = [(layout.table, layout.step)] + [
        (t, s) for t, s, _ in list_steps(con) if (t, s) != (layout.table, layout.step)
    ]
    found: dict[str, KnownAnswer] = {}
    steps = [(table, step, column_types(con, table) if table_exists(con, table) else {}) for table, step in sources]
    steps = [(table, step, types) for table, step, types in steps if step + "_fingerprint" in types]
    with registered(con, WANTED, wanted):  # a request whose answer a person flagged anywhere is asked afresh
        rejected = {
            r[0]
            for table, step, _ in steps
            for r in con.execute(
                f"SELECT DISTINCT {q(step + '_fingerprint')}::VARCHAR FROM {q(table)} WHERE {q(step + '_flag')} IS NOT "
                f"NULL AND {q(step + '_fingerprint')} IN (SELECT w.fp::UUID FROM {WANTED} AS w)"
            ).fetchall()
        }
    wanted = wanted.filter(~pl.col("fp").is_in(list(rejected))) if rejected else wanted
    if not wanted.height:
        return {}
    with registered(con, WANTED, wanted):
        for table, step, types in steps:
            o = names(step, "t")
            rows = con.execute(
                f"SELECT {o['_fingerprint']}::VARCHAR, min({output_as_text(o[''], types[step])}), "
                f"min({o['_stop_reason']}), min({o['_model']}) FROM {q(table)} AS t "
                f"WHERE {o['_status']} = 'DONE' AND {o['_fingerprint']} IN (SELECT w.fp::UUID FROM {WANTED} AS w) "
                f"AND {same_source_sql(o['_source'], source)} "
                f"GROUP BY {o['_fingerprint']}"
            ).fetchall()
            for r in rows:
                found.setdefault(r[0], KnownAnswer(r[1], r[2], r[3]))
            if len(found) == wanted.height:
                return found
        reasons = ", ".join(f"'{r}'" for r in REUSABLE_REASONS)
        rows = con.execute(
            f"SELECT h.fingerprint, h.output, h.stop_reason, h.model FROM {HISTORY_TABLE} AS h "
            f"WHERE h.fingerprint IN (SELECT w.fp FROM {WANTED} AS w) AND h.status = 'DONE' AND h.output IS NOT NULL "
            f"AND h.raw IS NULL AND h.reason IN ({reasons}) AND {same_source_sql('h.source', source)} "
            "ORDER BY h.finished_at DESC NULLS LAST, h.replaced_at DESC"
        ).fetchall()
        for r in rows:
            found.setdefault(r[0], KnownAnswer(r[1], r[2], r[3]))
    return found
