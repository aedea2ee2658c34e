"""Rows in Message Batches, as ledger verbs: the intent, the submission, the merge of results.

A batch passes through the store in three transactions, so that no batch the
API accepted (and will bill) is ever lost:

    begin_batch    before the API call: an intent in `llmledger_batches` and each claimed row's custom id
    confirm_batch  after it: the API's batch id; the rows become SUBMITTED with it, in one transaction
    merge_batch    once the batch ended: its results committed like online ones, and the rows it left
                   unanswered (expired, canceled, the API's own errors) given back to their earlier status

A process that dies between the API call and `confirm_batch` leaves an intent
whose rows are RUNNING with a custom id. Claim recovery never touches such rows;
the next run looks for the batch (`batches.list`, in `_exec/batch.py`) and
either confirms it or, when the API never got it, abandons the intent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from llmledger._ledger.again import until_landed
from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import column_types, one, registered, table_exists
from llmledger._ledger.packs import batch_packs, record_packs
from llmledger._ledger.run_rows import raise_run
from llmledger._ledger.schema import BATCHES_TABLE, STEPS_TABLE
from llmledger._ledger.survey import Layout
from llmledger._ledger.types import BatchRecord, BatchRows
from llmledger._ledger.verbs import commit_results, give_back, input_columns, requests_of
from llmledger._step.apis import ANTHROPIC
from llmledger._step.request import PROVIDER_KEY
from llmledger._step.sqltext import q

ASSIGNED = "llmledger_assigned"
NO_LIMIT = 1 << 30  # max_attempts for giving back batch rows: each had its prior status recorded by its claim
OPEN_STATES = ("submitting", "submitted")


def _record(*row: Any, provider: str = ANTHROPIC) -> BatchRecord:
    """A `BatchRecord` from a row of the SELECT in `batches` (its columns in the record's order, the deadline last)."""
    *fields, deadline = row
    fields[12] = list(fields[12] or [])  # rejected: NULL in rows written before it was recorded
    return dataclasses.replace(BatchRecord(*fields), provider=provider, deadline=deadline)


def _providers(con: Con) -> dict[tuple[str, str, str], str]:
    """The provider of every step definition's requests, by (table, step, version): a batch's is its requests'."""
    if not table_exists(con, STEPS_TABLE):
        return {}
    rows = con.execute(f"SELECT table_name, step, version, request FROM {STEPS_TABLE} WHERE version IS NOT NULL")
    return {
        (t, s, v): str(json.loads(r).get(PROVIDER_KEY, ANTHROPIC)) if r else ANTHROPIC for t, s, v, r in rows.fetchall()
    }


class BatchChanged(Exception):
    """Rows joined a batch between reading its rows and merging its results: merge again."""


def _state(con: Con, intent: str) -> tuple[str | None, str | None]:
    """(state, batch id) of an intent; (None, None) when the store has no such intent."""
    found = con.execute(f"SELECT state, batch_id FROM {BATCHES_TABLE} WHERE intent = ?", [intent]).fetchall()
    return found[0] if found else (None, None)


def _of_intent(col: dict[str, str]) -> str:
    return f"starts_with({col['_custom_id']}, $intent || '-')"


class BatchVerbs:
    """The batch verbs of a ledger, run on its connection (mixed into the DuckDB ledger)."""

    conn: Database
    path: Path
    _layout: Callable[[Con, str, str], Layout]  # the ledger's: migrates, checks the step

    def begin_batch(
        self,
        layout: Layout,
        assigned: pl.DataFrame,
        *,
        intent: str,
        claimant: str,
        requests: int,
        size: int,
        model: str,
        version: str,
        validated: bool,
        now: datetime,
        source: str | None = None,
        packs: list[dict[str, Any]] | None = None,
        deadline: datetime | None = None,
    ) -> None:
        """Record the intent (and where it is sent: `source`; the deadline its rows must be answered by, if any) and
        give each claimed row (`assigned`: key columns and custom_id) its custom id. `packs`: the records
        (`packs.PACK_SCHEMA`, not answered yet) of the requests
        that carry rows together, so whoever merges the batch can read their answers back onto the rows."""

        def work(con: Con) -> None:
            c = names(layout.step, "t")
            with registered(con, ASSIGNED, assigned):
                con.execute(
                    f"UPDATE {q(layout.table)} AS t SET {q(layout.step + '_custom_id')} = i.custom_id, "
                    f"{q(layout.step + '_batch_id')} = NULL "
                    f"FROM {ASSIGNED} AS i WHERE {layout.key_join()} AND {c['_status']} = 'RUNNING' "
                    f"AND {c['_claimed_by']} = $claimant",
                    {"claimant": claimant},
                )
            con.execute(
                f"INSERT INTO {BATCHES_TABLE} (intent, table_name, step, claimant, requests, rows_sent, "
                "bytes, model, version, validated, created_at, state, adopted, rejected, source, deadline) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'submitting', false, ?, ?, ?)",
                [
                    intent,
                    layout.table,
                    layout.step,
                    claimant,
                    requests,
                    assigned.height,
                    size,
                    model,
                    version,
                    validated,
                    now,
                    [],
                    source,
                    deadline,
                ],
            )
            record_packs(con, packs or [])

        def recorded(con: Con, _: None) -> bool:
            return bool(one(con, f"SELECT count(*) FROM {BATCHES_TABLE} WHERE intent = ?", [intent])[0])

        lost = f"batch intent {intent}: nothing was sent, run again"  # before the API call: nothing is paid
        until_landed(self.conn, work, recorded, wait=60.0, lost=lost)

    def batch_packs(self, table: str, step: str, intent: str) -> dict[str, dict[str, Any]]:
        """The packs a batch intent sent, by their request's custom id (none when it sent no pack)."""
        with self.conn.open(wait=60.0) as con:
            return batch_packs(con, table, step, intent)

    def confirm_batch(
        self, table: str, step: str, *, intent: str, batch_id: str, now: datetime, adopted: bool = False
    ) -> int | None:
        """The API has the batch: its rows become SUBMITTED with its id, in the same transaction as the record.

        None (nothing written) when the intent is no longer waiting for its batch (another run settled it).
        When another run confirmed it with this very batch (it read the batch's custom ids), its rows.
        """

        def work(con: Con) -> int | None:
            c = names(step)
            state, current = _state(con, intent)
            if state == "submitted" and current == batch_id:
                return int(
                    one(
                        con,
                        f"SELECT count(*) FROM {q(table)} WHERE {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} = ?",
                        [batch_id],
                    )[0]
                )
            if state != "submitting":
                return None
            if one(con, f"SELECT count(*) FROM {BATCHES_TABLE} WHERE batch_id = ?", [batch_id])[0]:
                return None  # another intent has that batch already
            rows = len(
                con.execute(
                    f"UPDATE {q(table)} SET {c['_status']} = 'SUBMITTED', {c['_batch_id']} = $batch_id "
                    f"WHERE {c['_status']} = 'RUNNING' AND {_of_intent(c)} RETURNING 1",
                    {"batch_id": batch_id, "intent": intent},
                ).fetchall()
            )
            con.execute(
                f"UPDATE {BATCHES_TABLE} SET batch_id = ?, submitted_at = ?, state = 'submitted', "
                "processing_status = 'in_progress', adopted = ? WHERE intent = ?",
                [batch_id, now, adopted, intent],
            )
            return rows

        def confirmed(con: Con, rows: int | None) -> bool:  # None: the intent was settled otherwise, nothing to see
            return rows is None or _state(con, intent) == ("submitted", batch_id)

        lost = (  # waiting for a batch the store does not know would never end
            f"the record of batch {batch_id}: its intent {intent} is kept, and the next run finds the batch by it "
            "and collects its answers (nothing is sent again)"
        )
        return until_landed(self.conn, work, confirmed, wait=None, lost=lost)

    def reject_batch(self, batch: BatchRecord, *, note: str) -> int:
        """Reconciliation adopted a batch that was not the intent's (its results hold other custom ids):
        the intent waits for its own batch again, never to adopt this one."""

        def work(con: Con) -> int:
            c = names(batch.step)
            rows = len(
                con.execute(
                    f"UPDATE {q(batch.table)} SET {c['_status']} = 'RUNNING', {c['_batch_id']} = NULL "
                    f"WHERE {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} = $batch_id AND {_of_intent(c)} "
                    "RETURNING 1",
                    {"batch_id": batch.batch_id, "intent": batch.intent},
                ).fetchall()
            )
            con.execute(
                f"UPDATE {BATCHES_TABLE} SET batch_id = NULL, state = 'submitting', adopted = false, "
                "rejected = array_append(coalesce(rejected, CAST(? AS VARCHAR[])), batch_id), note = ? "
                "WHERE intent = ?",
                [[], note, batch.intent],
            )
            return rows

        return self.conn.transaction(work, wait=None)

    def attach_to_batch(
        self,
        layout: Layout,
        assigned: pl.DataFrame,
        *,
        batch_id: str,
        claimant: str,
        validated: bool,
        source: str | None = None,
    ) -> int:
        """Claimed rows whose request is already in a processing batch join it (`assigned`: keys, custom_id):
        they share that request's answer instead of being sent again. 0 when the batch is no longer open, or
        was sent with a different `validate=` setting (its answers are checked as it says), or to another source
        than the run's (`source`: a simulated batch's answer is no answer for a run against the API)."""

        def work(con: Con) -> int:
            if not one(
                con,
                f"SELECT count(*) FROM {BATCHES_TABLE} WHERE batch_id = ? AND state = 'submitted' "
                "AND coalesce(validated, false) = ? AND (source IS NULL OR source = ?)",
                [batch_id, validated, source],
            )[0]:
                return 0  # merged meanwhile, checked otherwise (validate=), or another source's: sent on their own
            c = names(layout.step, "t")
            with registered(con, ASSIGNED, assigned):
                rows = len(
                    con.execute(
                        f"UPDATE {q(layout.table)} AS t SET {q(layout.step + '_status')} = 'SUBMITTED', "
                        f"{q(layout.step + '_custom_id')} = i.custom_id, {q(layout.step + '_batch_id')} = $batch_id "
                        f"FROM {ASSIGNED} AS i WHERE {layout.key_join()} AND {c['_status']} = 'RUNNING' "
                        f"AND {c['_claimed_by']} = $claimant RETURNING 1",
                        {"batch_id": batch_id, "claimant": claimant},
                    ).fetchall()
                )
            con.execute(f"UPDATE {BATCHES_TABLE} SET rows_sent = rows_sent + ? WHERE batch_id = ?", [rows, batch_id])
            return rows

        return self.conn.transaction(work, wait=None)

    def requests_in_batches(self, table: str, step: str) -> dict[str, str]:
        """custom_id → batch id of every request of the step in a batch still processing."""
        with self.conn.open(wait=60.0) as con:
            c = names(step)
            return dict(
                con.execute(
                    f"SELECT DISTINCT {c['_custom_id']}, {c['_batch_id']} FROM {q(table)} "
                    f"WHERE {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} IS NOT NULL"
                ).fetchall()
            )

    def abandon_batch(
        self, table: str, step: str, *, intent: str, note: str, now: datetime, confirmed: bool = False
    ) -> pl.DataFrame:
        """The API never got (or refused) the batch: give its rows back to what they were before the claim.
        Returns their keys. Only an intent still waiting for its batch is abandoned (another run may have
        found the batch meanwhile); with `confirmed`, a batch the API has is closed instead, its rows (if any are
        left: a simulated batch a run against the API gives up) back to what they were."""

        def work(con: Con) -> pl.DataFrame:
            layout = self._layout(con, table, step)
            state, batch_id = _state(con, intent)
            if not ((state == "submitting" and batch_id is None) or (confirmed and state == "submitted")):
                return pl.DataFrame(schema={k: pl.Int64 for k in layout.key})
            rows = give_back(
                con,
                layout,
                _of_intent(names(step)),
                {"intent": intent, "max_attempts": NO_LIMIT},
                status="SUBMITTED" if state == "submitted" else "RUNNING",
            )
            con.execute(
                f"UPDATE {BATCHES_TABLE} SET state = 'abandoned', merged_at = ?, note = ? WHERE intent = ?",
                [now, note, intent],
            )
            return rows

        return self.conn.transaction(work, wait=None)

    def open_batches(self, table: str, step: str) -> list[BatchRecord]:
        """The step's batches not merged yet (none in a store that has never sent one)."""
        return self._records(f"table_name = ? AND step = ? AND state IN {OPEN_STATES}", [table, step])

    def unsettled_batches(self) -> list[BatchRecord]:
        """Every batch of the store, of any step, whose API batch is not known for sure: intents still waiting
        for theirs, and batches adopted on a guess not yet checked against their custom ids. A batch found by
        looking may be any of theirs, so none is matched while another could claim it."""
        return self._records(
            "(state = 'submitting' AND batch_id IS NULL) OR (state = 'submitted' AND coalesce(adopted, false))", []
        )

    def _records(self, where: str, params: list[str]) -> list[BatchRecord]:
        if not self.conn.exists():
            return []
        with self.conn.open(wait=60.0) as con:
            if not table_exists(con, BATCHES_TABLE):
                return []
            columns = column_types(con, BATCHES_TABLE)
            source = "source" if "source" in columns else "NULL"  # before schema 9
            deadline = "deadline" if "deadline" in columns else "NULL"  # before schema 14
            rows = con.execute(
                f"SELECT intent, batch_id, table_name, step, claimant, requests, rows_sent, created_at, state, "
                f"version, coalesce(validated, false), coalesce(adopted, false), rejected, {source}, {deadline} "
                f"FROM {BATCHES_TABLE} WHERE {where} ORDER BY created_at",
                params,
            ).fetchall()
            providers = _providers(con) if rows else {}
        return [_record(*r, provider=providers.get((r[2], r[3], r[9]), ANTHROPIC)) for r in rows]

    def known_batch_ids(self) -> set[str]:
        """Every API batch id this store has recorded (so reconciling never adopts one twice)."""
        with self.conn.open(wait=60.0) as con:
            return {
                r[0] for r in con.execute(f"SELECT batch_id FROM {BATCHES_TABLE} WHERE batch_id IS NOT NULL").fetchall()
            }

    def batch_rows(self, batch: BatchRecord, *, inputs: bool = False) -> BatchRows:
        """The SUBMITTED rows of `batch`, with their custom ids and what a result row needs."""

        def work(con: Con) -> BatchRows:
            layout = self._layout(con, batch.table, batch.step)
            columns = input_columns(con, layout) if inputs else []
            c = names(layout.step, "t")
            keys = ", ".join(f"t.{q(k)}" for k in layout.key)
            extra = "".join(f", t.{q(col)} AS {q('input.' + col)}" for col in columns)
            rows = con.sql(  # not the rows' current request: it may have been rendered anew since (see batch.py)
                f"SELECT {keys}, {c['_custom_id']} AS custom_id, {c['_attempts']} AS attempts, "
                f"{c['_finished_at']} IS NOT NULL AND {c['_error']} IS NULL AS was_done{extra} "
                f"FROM {q(layout.table)} AS t WHERE {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} = $batch_id",
                params={"batch_id": batch.batch_id},
            ).pl()
            key_types = dict(con.sql(f"SELECT {keys} FROM {q(layout.table)} AS t LIMIT 0").pl().schema)
            return BatchRows(layout, rows, requests_of(con, layout), key_types, columns)

        return self.conn.transaction(work, wait=60.0)

    def merge_batch(
        self,
        batch: BatchRecord,
        layout: Layout,
        results: pl.DataFrame,
        *,
        counts: dict[str, int],
        processing_status: str,
        ended_at: datetime | None,
        now: datetime,
        expected_rows: int,
        unused: tuple[int, float] = (0, 0.0),
        run: tuple[str, dict[str, Any]] | None = None,
        packs: list[dict[str, Any]] | None = None,
    ) -> pl.DataFrame | None:
        """Commit a batch's results; give back its rows left unanswered; mark it merged. Returns the keys of the
        rows given back, or None when another run merged the batch first (then nothing is written).

        `unused`: answers (and their cost) to requests no row holds any more (reset while the batch ran):
        paid for, so recorded with the batch. Raises BatchChanged when the batch no longer holds the
        `expected_rows` rows the results were matched against (rows joined it meanwhile). `run` (run id, figures):
        the merging run's row in llmledger_runs takes its figures with the batch's, as `commit` does. `packs`: the
        batch's packs with their answers, in place of their records as sent.
        """

        def work(con: Con) -> pl.DataFrame | None:
            if _state(con, batch.intent)[0] not in OPEN_STATES:
                return None
            c = names(layout.step)
            held = one(
                con,
                f"SELECT count(*) FROM {q(layout.table)} WHERE {c['_status']} = 'SUBMITTED' AND {c['_batch_id']} = ?",
                [batch.batch_id],
            )[0]
            if held != expected_rows:  # rows joined the batch since they were read: read them again first
                raise BatchChanged(batch.batch_id)
            if results.height:
                commit_results(con, layout, results, now=now, only_batch=batch.batch_id)
            if run is not None:
                raise_run(con, run[0], layout.table, layout.step, run[1])
            record_packs(con, packs or [])
            back = give_back(
                con,
                layout,
                f"{c['_batch_id']} = $batch_id",
                {"batch_id": batch.batch_id, "max_attempts": NO_LIMIT},
                status="SUBMITTED",
            )
            con.execute(
                f"UPDATE {BATCHES_TABLE} SET state = 'merged', merged_at = ?, processing_status = ?, "
                "ended_at = ?, succeeded = ?, errored = ?, canceled = ?, expired = ?, unused = ?, "
                "unused_cost_usd = ? WHERE intent = ?",
                [
                    now,
                    processing_status,
                    ended_at,
                    counts.get("succeeded", 0),
                    counts.get("errored", 0),
                    counts.get("canceled", 0),
                    counts.get("expired", 0),
                    unused[0],
                    unused[1],
                    batch.intent,
                ],
            )
            return back

        return self.conn.transaction(work, wait=None)
