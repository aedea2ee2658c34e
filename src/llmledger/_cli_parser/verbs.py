"""The command line's verbs, one entry each: name and aliases, the Python twin, help, argument groups (shared ones
from `args.py`, then its own) and the function that runs it (`runs.py`). `llmledger --help`, the CLI reference
and `cli.main` are all made from this table.
"""

from __future__ import annotations

from typing import Any

from llmledger._cli_parser import runs
from llmledger._cli_parser.args import (
    DAY,
    POLL,
    QUIET,
    RUN_OPTIONS,
    SERVER,
    STORE,
    STORE_HELP,
    STORE_TABLE,
    STORE_TABLE_STEP,
    WHERE,
    Group,
    port,
    positive,
    seconds,
    stale_after,
)
from llmledger._cli_parser.faults import fault_options
from llmledger._cli_parser.table import Verb
from llmledger._run.options import DEFAULTS, MAX_CHUNK


def _status(p: Any) -> None:
    p.add_argument("store", help=STORE_HELP)
    p.add_argument("--table", default=None, help="only this table")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the bars (auto: when the terminal shows colour and NO_COLOR is unset)",
    )
    p.add_argument("--every", type=positive(float, most=DAY), default=None, help="redraw every N seconds until Ctrl-C")


def _run(p: Any) -> None:
    p.add_argument(
        "--redo",
        choices=["stale", "flagged", "all"],
        default=None,
        help="also re-send stale answers (stale), flagged rows (flagged) or every matching row (all)",
    )
    p.add_argument(
        "--mode",
        choices=["online", "batch", "auto", "flex"],
        default=DEFAULTS.mode,
        help="send the rows online, as Message Batches (half price), or online at OpenAI's flex tier (half price, "
        f"slower; 'openai:' models); batches the step sent earlier are collected first either way (default "
        f"{DEFAULTS.mode})",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        default=not DEFAULTS.wait,
        help="with --mode batch: return once the batches are submitted",
    )
    p.add_argument(
        "--deadline",
        type=positive(float, most=365 * DAY),
        default=None,
        metavar="SECONDS",
        help="with --mode batch or flex: answer the rows within this many seconds (online, or at the standard tier, "
        "once batches or the flex pace would miss it)",
    )


def _worker(p: Any) -> None:
    p.add_argument(
        "--chunk-size",
        type=positive(int, most=MAX_CHUNK),
        default=DEFAULTS.chunk_size,
        help="rows claimed ahead and committed together (smaller shares a small step more evenly; "
        f"default {DEFAULTS.chunk_size})",
    )
    p.add_argument(
        "--poll",
        type=positive(float, most=DAY),
        default=POLL,
        help=f"seconds between looks while other workers hold rows (default {seconds(POLL)})",
    )
    stale_after(
        p,
        "seconds after which a claim whose worker stopped renewing it is taken over "
        "(default {default}; claims are renewed every min(60, stale-after/4) seconds)",
    )


def _compare(p: Any) -> None:
    p.add_argument("--steps", nargs="+", required=True, metavar="STEP", help="two or more steps of the table")
    p.add_argument(
        "--show",
        type=positive(int, zero=True),
        default=10,
        metavar="N",
        help="print the first N rows where they differ (default 10; 0: none)",
    )


def _models(p: Any) -> None:
    p.add_argument("--provider", choices=("anthropic", "openai"), default=None, help="one provider's models")


def _sql(p: Any) -> None:
    p.add_argument("query", help='one SQL statement, e.g. "SELECT summary_status, count(*) FROM t GROUP BY ALL"')
    p.add_argument("--write", action="store_true", help="allow a statement that writes (llmledger.sql(write=True))")


def _rows_where(p: Any) -> None:
    p.add_argument("--where", required=True, help='SQL predicate over the fact table, e.g. "id IN (3, 7)"')


def _flag(p: Any) -> None:
    _rows_where(p)
    p.add_argument("--reason", required=True, help="what is wrong with these answers")
    p.add_argument("--by", default=None, help="who flags them (default: the login name)")


def _accept(p: Any) -> None:
    _rows_where(p)
    p.add_argument("--by", default=None, help="who judged them (default: the login name)")


def _correct(p: Any) -> None:
    p.add_argument("--key", required=True, help="the row's key (single-column keys)")
    p.add_argument("--answer", required=True, help="the right answer: text, or JSON for a step with output=")
    p.add_argument("--reason", default=None, help="what was wrong with the model's answer")
    p.add_argument("--by", default=None, help="who corrected it (default: the login name)")


def _review(p: Any) -> None:
    p.add_argument(
        "--sample",
        type=positive(int),
        default=None,
        metavar="N",
        help="review a random sample of N DONE rows no one judged (default: the rows that need it first)",
    )
    p.add_argument("--by", default=None, help="who judges (default: the login name)")
    p.add_argument("--compare-with", nargs="+", default=[], metavar="STEP", help="other steps' answers to show beside")


def _accuracy(p: Any) -> None:
    p.add_argument("--against", nargs="+", default=[], metavar="STEP", help="other steps answering the same question")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="the accuracy wanted, as a share (0.9): names the cheapest step whose interval's low end reaches it",
    )


def _reset(p: Any) -> None:
    _rows_where(p)
    p.add_argument(
        "--running",
        action="store_true",
        help="also take back RUNNING rows whose holder is gone (a dead process on this host, or a "
        "holder elsewhere whose claims were not renewed for --stale-after seconds or whose "
        "leases lapsed, in the database's clock)",
    )
    stale_after(p, "seconds (with --running; default {default})")


def _history(p: Any) -> None:
    p.add_argument("--key", default=None, help="only the row with this key (single-column keys)")


def _export(p: Any) -> None:
    p.add_argument(
        "path",
        help="a new folder, named without a suffix (the table and its bookkeeping as Parquet files, which restore "
        "reads), or one file ending in .parquet, .csv, .jsonl or .ndjson (JSON lines): the table alone, or with "
        "--step one step's view; any other suffix is refused",
    )
    p.add_argument(
        "--step", default=None, help="only this step's view, as one file (.parquet, .csv, .jsonl or .ndjson)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing file, or a folder an earlier export wrote"
    )


def _restore(p: Any) -> None:
    p.add_argument("path", help="the folder export wrote")
    p.add_argument("store", help=f"{STORE_HELP} (created if missing)")


def _copy(p: Any) -> None:
    p.add_argument("source", help=f"{STORE_HELP} to copy")
    p.add_argument("target", help="a new DuckDB file, or a postgresql:// URL of a database without a ledger")


def _demo(p: Any) -> None:
    p.add_argument("--store", default=None, help="ledger file (default: a fresh one in a temp folder)")
    p.add_argument(
        "--rows",
        type=positive(int),
        default=None,
        help="rows to use, at most the 3,000 there are (default: all 3,000 on the simulator, 20 on the real API)",
    )


def _simulator(p: Any) -> None:
    p.add_argument(
        "--port",
        type=port,
        default=8765,
        help="the TCP port on 127.0.0.1 to listen on, 0 to 65535 (0: any free one, printed when it starts; "
        "default 8765)",
    )
    fault_options(p)


VERBS = (
    Verb(
        "status",
        "every step as a bar of rows by status, its cost, claims and errors",
        runs.run_status,
        (Group(_status),),
        twin="llmledger.show()",
        aliases=("show",),
    ),
    Verb(
        "run",
        "finish a step that apply_llm started, from the store alone",
        runs.run_run,
        (STORE_TABLE_STEP, RUN_OPTIONS, Group(_run), QUIET, SERVER),
        twin="llmledger.resume()",
        aliases=("resume",),
    ),
    Verb(
        "worker",
        "work on a step together with other workers until none of it is left (a PostgreSQL store lets many "
        "machines share one step); says what all its passes did once, at the end",
        runs.run_worker,
        (STORE_TABLE_STEP, RUN_OPTIONS, Group(_worker), QUIET, SERVER),
        twin="llmledger.work()",
        aliases=("work",),
    ),
    Verb(
        "compare",
        "several steps' answers to the same rows, side by side (one step per model)",
        runs.run_compare,
        (STORE_TABLE, Group(_compare), WHERE),
        twin="llmledger.compare()",
    ),
    Verb(
        "models",
        "the models llmledger knows, their prices, what they support and their lifecycle",
        runs.run_models,
        (Group(_models),),
        twin="llmledger.models()",
    ),
    Verb(
        "sql",
        "run a SQL query on the store and print the result (reads unless --write)",
        runs.run_sql,
        (STORE, Group(_sql)),
        twin="llmledger.sql()",
    ),
    Verb(
        "flag",
        "flag a step's answers on matching rows for redo (redo='flagged')",
        runs.run_flag,
        (STORE_TABLE_STEP, Group(_flag)),
        twin="llmledger.flag()",
    ),
    Verb(
        "accept",
        "record that a person judged a step's answers on matching rows right (kept by redo='stale')",
        runs.run_accept,
        (STORE_TABLE_STEP, Group(_accept)),
        twin="llmledger.accept()",
    ),
    Verb(
        "correct",
        "give one row a person's answer: it replaces the step's answer, at no cost, and no redo overwrites it",
        runs.run_correct,
        (STORE_TABLE_STEP, Group(_correct)),
        twin="llmledger.correct()",
    ),
    Verb(
        "review",
        "judge a step's answers one row at a time, one key per line from stdin (a accept, f flag, c correct, "
        "s skip, u undo, q quit; a reason or answer on the next line)",
        runs.run_review,
        (STORE_TABLE_STEP, WHERE, Group(_review)),
        twin="llmledger.review()",
    ),
    Verb(
        "accuracy",
        "how often a step is right on the rows a person reviewed, beside other steps and their cost per row",
        runs.run_accuracy,
        (STORE_TABLE_STEP, Group(_accuracy)),
        twin="llmledger.accuracy()",
    ),
    Verb(
        "reset",
        "put a step back to NOT_STARTED on matching rows (answers to history)",
        runs.run_reset,
        (STORE_TABLE_STEP, Group(_reset)),
        twin="llmledger.reset()",
    ),
    Verb(
        "history",
        "a step's replaced answers next to the current ones",
        runs.run_history,
        (STORE_TABLE_STEP, Group(_history)),
        twin="llmledger.history()",
    ),
    Verb(
        "export",
        "write a table (a folder of Parquet files, or one .parquet/.csv/.jsonl file) or one step",
        runs.run_export,
        (STORE_TABLE, Group(_export)),
        twin="llmledger.export()",
    ),
    Verb(
        "restore",
        "rebuild a table in a store from llmledger export's folder",
        runs.run_restore,
        (Group(_restore),),
        twin="llmledger.restore()",
    ),
    Verb(
        "copy",
        "copy a whole ledger into a new DuckDB file or an empty PostgreSQL database",
        runs.run_copy,
        (Group(_copy),),
        twin="llmledger.copy()",
    ),
    Verb("demo", "run a step over the bundled reviews dataset", runs.run_demo, (Group(_demo),)),
    Verb(
        "simulator",
        "serve the offline Messages API simulator (every fault simulate() takes is an option: --latency 0.1 "
        "--rate-limit 50 --error-rate 0.05 ...)",
        runs.run_simulator,
        (Group(_simulator),),
    ),
)
