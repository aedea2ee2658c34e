"""Write the generated reference pages: the command line from `--help`, and the ledger's columns and tables from
a real store. `python docs/gen_reference.py` rewrites them; `tests/test_docs.py` fails when they are out of date.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

PAGES = Path(__file__).parent / "pages" / "reference"
CLI_INTRO = """# Command line

Each verb is a thin twin of a Python function, named like it (the table below is made from the CLI's own table of
verbs). STORE is a DuckDB file or a `postgresql://` URL. `--table` and `--step` may be left out when the store has
only one. Without `ANTHROPIC_API_KEY`, `run` and `worker` say how to set it, or how to point them at
`llmledger simulator`.

This page is generated from `--help` (`python docs/gen_reference.py`); a test fails when it is out of date.
"""


def cli_intro() -> str:
    """CLI_INTRO, then every verb (aliases too) and its Python twin, from `_cli_parser.VERBS`."""
    from llmledger._cli_parser import VERBS

    rows = ["| verb | Python twin | what it does |", "|---|---|---|"]
    for verb in VERBS:
        names = " or ".join(f"`llmledger {name}`" for name in (verb.name, *verb.aliases))
        twin = f"`{verb.twin}`" if verb.twin else "-"
        rows.append(f"| {names} | {twin} | {verb.help.replace('|', chr(92) + '|')} |")
    return CLI_INTRO + "\n" + "\n".join(rows) + "\n"


TABLES = {
    "llmledger_steps": "every definition a step has had: model, system, max_tokens, template, request options, "
    "the key, and its `version` (a digest of all of them); the newest row is the current one",
    "llmledger_runs": "one row per run (apply_llm, resume, a worker's pass): when, its outcome, calls, retries, "
    "tokens and cost",
    "llmledger_history": "every answer that was replaced (by a redo, a reset or a new definition), with why",
    "llmledger_verdicts": "every verdict a person gave on an answer (accept, flag, correct): the row (`row_key`), "
    "the answer judged (its text, `fingerprint` and `source`), the correction, the reason, who and when; "
    "`{step}_verdict` on the row is the verdict on its current answer",
    "llmledger_packs": "every request that carried several rows (`rows_per_request=`): the rows' keys in the order "
    "of its items (`row_keys`), the whole request and answer, why an entry was not kept (`problems`, by item id; those "
    "rows were asked again alone), what it used and cost; `{step}_pack` on a row names the pack its answer came in. "
    "A pack sent in a batch is recorded as it is sent, with its request's `custom_id` and each item's rows' "
    "custom id (`custom_ids`, JSON); its answer is added when the batch is merged",
    "llmledger_batches": "every Message Batch a run sent or meant to send: its intent, the API's id, its state, "
    "and the `deadline` it was sent against, if any. `succeeded`, `errored`, `canceled` and `expired` count the "
    "API's requests (a pack is one); `unused` counts the answers no row took, paid all the same (rows reset while "
    "the batch ran; a pack's entries one by one), and `unused_cost_usd` what they cost",
    "llmledger_budget_reservations": "what live runs reserved under a step's shared budget",
    "llmledger_migrations": "the schema migrations applied to this store, with the llmledger version that did",
}


def cli_reference() -> str:
    """The CLI page: the intro, then each verb's `--help`, as argparse prints it 100 columns wide."""
    from llmledger._cli_parser import parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: the page must not depend on it
    try:
        return _cli_reference(parser())
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def verbs(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The CLI's verbs by name, aliases included (one parser serves a verb and its alias)."""
    found = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return dict(found.choices)


def _cli_reference(top: argparse.ArgumentParser) -> str:
    out = [cli_intro(), "## llmledger", "", "```", top.format_help().rstrip(), "```", ""]
    seen: set[int] = set()
    for name, sub in verbs(top).items():
        if id(sub) in seen:  # an alias
            continue
        seen.add(id(sub))
        out += [f"## llmledger {name}", "", "```", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def ledger_reference() -> str:
    """The ledger page: the per-step columns from their one definition, and every bookkeeping table's columns as a
    store made by a real (simulated) run holds them."""
    import polars as pl

    import llmledger
    from llmledger._ledger.columns import STEP_COLUMNS

    out = [
        "# Ledger columns and tables",
        "",
        "A store holds one fact table per dataset (`table=`): the key columns, the input columns a step reads, and "
        "for every step `S` the columns below. Statuses are plain strings, so `WHERE S_status = 'DONE'` works "
        "from any SQL client. This page is generated from the code and a real store "
        "(`python docs/gen_reference.py`).",
        "",
        "## Per-step columns of a fact table",
        "",
        "| column | type | what it holds |",
        "|---|---|---|",
    ]
    for c in STEP_COLUMNS:
        doc = c.doc.replace("|", "\\|")
        out.append(f"| `S{c.suffix}` | {c.sql_type} | {doc} |")
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        store = Path(tmp) / "ledger.duckdb"
        with llmledger.simulate():
            frame = pl.DataFrame({"id": [1, 2], "text": ["a", "b"]})
            common = {"prompt": "{text}", "store": store, "table": "t", "max_tokens": 5, "progress": False}
            llmledger.apply_llm(frame, "s", **common)  # the steps, runs and migrations tables
            llmledger.apply_llm(frame, "s", **common, mode="batch", redo=True)  # batches, and history
            llmledger.apply_llm(frame, "s", **common, max_cost_usd=1.0, budget_scope="step", redo=True)  # budget
        columns = llmledger.sql(
            store,
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_name LIKE 'llmledger_%' ORDER BY table_name, ordinal_position",
        )
    out += ["", "## Bookkeeping tables", ""]
    for table, what in TABLES.items():
        rows = columns.filter(pl.col("table_name") == table)
        assert rows.height, f"{table} is not in a store made by a run: update TABLES"
        out += [f"### `{table}`", "", what[0].upper() + what[1:] + ".", "", "| column | type |", "|---|---|"]
        out += [f"| `{name}` | {kind} |" for name, kind in rows.select("column_name", "data_type").iter_rows()]
        out.append("")
    unknown = set(columns["table_name"]) - set(TABLES)
    assert not unknown, f"bookkeeping tables without a description here: {unknown}"
    return "\n".join(out)


PAGES_MADE = {"cli.md": cli_reference, "ledger.md": ledger_reference}


def main() -> int:
    for name, make in PAGES_MADE.items():
        (PAGES / name).write_text(make())
        print(f"wrote {PAGES / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
