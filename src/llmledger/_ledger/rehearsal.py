"""What `estimate` reads inside apply_llm's own preparation before it is rolled back: the requests the work would
send and the step's answers so far. The SQL is here, with the ledger's; `estimate` only prices what it gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from llmledger._ledger.columns import names
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import one, registered
from llmledger._ledger.types import Selection
from llmledger._step.sqltext import q

_WORK = "llmledger_estimate"


@dataclass(frozen=True)
class Rehearsal:
    """A prepared selection and what it would send, read before the transaction was rolled back."""

    selection: Selection
    requests: list[tuple[str, str | None]]  # (fingerprint, stored prompt) of every row the work would send
    answered: int  # the step's DONE rows with output tokens, before this call
    average_output_tokens: float | None  # their average output tokens (None without any)


def rehearse(con: Con, selection: Selection) -> Rehearsal:
    layout = selection.layout
    c = names(layout.step, "t")
    with registered(con, _WORK, selection.work):
        sent = con.execute(
            f"SELECT {c['_request_fingerprint']}::VARCHAR, {c['_prompt']} FROM {q(layout.table)} AS t "
            f"WHERE EXISTS (SELECT 1 FROM {_WORK} AS i WHERE {layout.key_join('t', 'i')})"
        ).fetchall()
    average, answered = one(
        con,
        f"SELECT avg({c['_output_tokens']}), count(*) FROM {q(layout.table)} AS t "
        f"WHERE {c['_status']} = 'DONE' AND {c['_output_tokens']} > 0",
    )
    return Rehearsal(
        selection, [(fp, prompt) for fp, prompt in sent], int(answered), None if average is None else float(average)
    )


def count_where(frame: pl.DataFrame, where: str) -> int | None:
    """How many of `frame`'s rows `where` takes, judged on the frame's own columns in a throwaway DuckDB; None
    when it reads anything else (another step's columns, which do not exist yet)."""
    con = duckdb.connect()
    try:
        con.register("llmledger_frame", frame)
        found: Any = con.execute(f"SELECT count(*) FROM llmledger_frame WHERE {where}").fetchone()
        return int(found[0])
    except duckdb.Error:
        return None
    finally:
        con.close()
