"""The packs a run sent (`rows_per_request=`): one row of `llmledger_packs` per request that carried rows together,
written in the same transaction as the answers it gave, so an audit finds, for any packed answer (`{step}_pack`),
the whole request it came in, the whole answer, which rows it carried and why any entry was not kept."""

from __future__ import annotations

from typing import Any

import polars as pl

from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import registered
from llmledger._ledger.schema import PACKS_TABLE

PACK_SCHEMA: dict[str, pl.DataType] = {
    "pack_id": pl.String(),
    "table_name": pl.String(),
    "step": pl.String(),
    "run_id": pl.String(),
    "rows": pl.Int32(),
    "kept": pl.Int32(),
    "row_keys": pl.String(),  # JSON: each item's key, in the order of the request's items
    "request": pl.String(),  # the body sent, as JSON
    "answer": pl.String(),  # the text the model wrote
    "problems": pl.String(),  # JSON: {item id: why its entry was not kept}
    "model": pl.String(),
    "input_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "cache_write_tokens": pl.Int64(),
    "cache_read_tokens": pl.Int64(),
    "cost_usd": pl.Float64(),
    "latency_ms": pl.Int64(),
    "answered_at": pl.Datetime("us"),
    "custom_id": pl.String(),  # a pack sent in a batch: its request's custom id (NULL online)
    "custom_ids": pl.String(),  # and, as JSON, the custom id each item's rows hold, in the order of its items
}
_INCOMING = "llmledger_incoming_packs"


def record_packs(con: Con, packs: list[dict[str, Any]]) -> None:
    """Write the packs whose answers the same transaction commits (or a dead run's journal holds), each in place of
    the record the store may have of it already: the same pack journaled and committed, or a batch's pack recorded
    as sent and now answered."""
    if not packs:
        return
    frame = pl.from_dicts(packs, schema=PACK_SCHEMA)
    columns = ", ".join(PACK_SCHEMA)
    with registered(con, _INCOMING, frame):
        con.execute(f"DELETE FROM {PACKS_TABLE} WHERE pack_id IN (SELECT pack_id FROM {_INCOMING})")
        con.execute(f"INSERT INTO {PACKS_TABLE} ({columns}) SELECT {columns} FROM {_INCOMING}")


def batch_packs(con: Con, table: str, step: str, intent: str) -> dict[str, dict[str, Any]]:
    """The packs a batch intent sent, by their request's custom id (`<intent>-<pack>-pk`)."""
    columns = ", ".join(PACK_SCHEMA)
    found = con.execute(
        f"SELECT {columns} FROM {PACKS_TABLE} WHERE table_name = ? AND step = ? AND starts_with(custom_id, ?)",
        [table, step, intent + "-"],
    ).fetchall()
    records = [dict(zip(PACK_SCHEMA, row, strict=True)) for row in found]
    return {record["custom_id"]: record for record in records}
