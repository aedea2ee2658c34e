"""A run's row in `llmledger_runs`: written as the run starts sending, raised with every chunk it commits, and
replaced with its final figures when it ends.

Raised as it goes, because a run killed mid-way (kill -9, a lost kernel) never writes its end: its row must still
say what it paid, or the runs' rows would not add up to the bill. The run that merges a dead run's journal raises
the dead run's row once more to the figures of the last answer it journaled.
"""

from __future__ import annotations

from typing import Any

from llmledger._ledger.engine import Con
from llmledger._ledger.schema import RUNS_TABLE

_WHERE = "WHERE run_id = $run_id AND table_name = $run_table AND step = $run_step"


def write_run(con: Con, row: dict[str, Any]) -> None:
    """The run's whole row, replacing the one it wrote before (same run_id, table and step)."""
    con.execute(
        f"DELETE FROM {RUNS_TABLE} {_WHERE}",
        {"run_id": row["run_id"], "run_table": row["table_name"], "run_step": row["step"]},
    )
    cols = list(row)
    con.execute(
        f"INSERT INTO {RUNS_TABLE} ({', '.join(cols)}) VALUES ({', '.join('$' + c for c in cols)})",
        row,
    )


def raise_run(con: Con, run_id: str, table: str, step: str, figures: dict[str, Any]) -> None:
    """Raise the figures of a run still marked running to at least `figures` (each only grows as a run goes, so a
    journal read after a commit never lowers them). A run that has ended keeps what it wrote at its end."""
    if not figures:
        return
    raised = ", ".join(f"{name} = GREATEST({name}, ${name})" for name in figures)
    con.execute(
        f"UPDATE {RUNS_TABLE} SET {raised} {_WHERE} AND outcome = 'running'",
        {**figures, "run_id": run_id, "run_table": table, "run_step": step},
    )
