"""Rows a call would send whose identical request is in a Message Batch still processing: they join that batch.

A batch sent with `wait=False` (or by a run that stopped waiting) holds its rows' requests until the API ends
it. A later call of the same step with new rows whose text duplicates them used to pay those requests again
online. With `dedupe` (the default), such rows now join the batch as the batch sender's own rows join one
(`BatchSender._attach`): SUBMITTED under the custom id of the identical request, so the batch's one answer is
merged into every row asking it when the batch is collected, and the call reports them as in batches.
"""

from __future__ import annotations

import polars as pl

from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import registered, table_exists
from llmledger._ledger.schema import BATCHES_TABLE
from llmledger._ledger.survey import Layout
from llmledger._step.sqltext import q

WORK = "llmledger_join_work"


def join_open_batches(
    con: Con, layout: Layout, work: pl.DataFrame, *, validated: bool, source: str | None
) -> pl.DataFrame:
    """Mark the rows of `work` (keys of rows a call selected to send) whose current request a processing batch of
    the step holds as that batch's rows; return their keys.

    Only a batch the API has (`submitted`, not merged yet: a call merges the ended ones before it prepares) whose
    answers are checked as this call's are (`validate=`) and whose source is the call's (a simulated batch's
    answer is no answer for a call to the API) is joined. A custom id carries the fingerprint of the request it
    answers (`<intent>-<fingerprint hex>[-n]`), so a row joins the request it asks, even if the batch's own rows
    were rendered anew since. The row keeps the status it had in `_claimed_from`, so that a batch the API gives
    back (expired, canceled) returns it to what it was.
    """
    if not work.height or not table_exists(con, BATCHES_TABLE):
        return work.clear()
    t = names(layout.step, "t")
    keys = ", ".join(f"t.{q(k)}" for k in layout.key)
    held = (
        f"SELECT split_part({t['_custom_id']}, '-', 2) AS fp, min({t['_custom_id']}) AS custom_id, "
        f"min({t['_batch_id']}) AS batch_id FROM {q(layout.table)} AS t JOIN {BATCHES_TABLE} AS b "
        f"ON b.batch_id = {t['_batch_id']} WHERE {t['_status']} = 'SUBMITTED' AND b.state = 'submitted' "
        "AND b.table_name = $table AND b.step = $step AND coalesce(b.validated, false) = $validated "
        "AND (b.source IS NULL OR b.source = $source) GROUP BY 1"
    )
    c = names(layout.step)
    with registered(con, WORK, work.select(layout.key)):
        joined: pl.DataFrame = con.sql(
            f"UPDATE {q(layout.table)} AS t SET {c['_claimed_from']} = {t['_status']}, "
            f"{c['_status']} = 'SUBMITTED', {c['_custom_id']} = o.custom_id, {c['_batch_id']} = o.batch_id "
            f"FROM ({held}) AS o, {WORK} AS w WHERE {layout.key_join('t', 'w')} "
            f"AND replace(CAST({t['_request_fingerprint']} AS VARCHAR), '-', '') = o.fp "
            f"AND {t['_status']} NOT IN ('RUNNING', 'SUBMITTED') RETURNING {keys}, {t['_batch_id']} AS batch_id",
            params={"table": layout.table, "step": layout.step, "validated": validated, "source": source},
        ).pl()
    for batch_id, n in joined.group_by("batch_id").len().iter_rows():
        con.execute(f"UPDATE {BATCHES_TABLE} SET rows_sent = rows_sent + ? WHERE batch_id = ?", [n, batch_id])
    return joined.select(layout.key).cast({k: work.schema[k] for k in layout.key})
