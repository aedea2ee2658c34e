"""The per-step columns of a fact table, defined once.

Everything else is derived from `STEP_COLUMNS`: the DDL that adds a step to a
table, the polars schema of a chunk of results, the SET list of the commit
that writes such a chunk, and the names used in SQL. A migration that adds a
per-step column adds it here too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from llmledger._step.sqltext import q

SIMULATOR = "simulator"  # `{step}_source` of an answer the bundled simulator made


def same_source_sql(column: str, source: str | None) -> str:
    """SQL: an answer whose source is `column` may stand in for one from `source` (a run's).

    Simulated answers only for a simulated run, real ones (any endpoint, or NULL: written before sources were
    recorded, by llmledger 0.6 or older, which are real) only for a real run.
    """
    return f"{column} = '{SIMULATOR}'" if source == SIMULATOR else f"{column} IS DISTINCT FROM '{SIMULATOR}'"


# How a commit writes a column. `i` is the results chunk, `t` the fact table.
KEEP_UNLESS_ANSWERED = "keep"  # the new value when the result holds an answer, the old one otherwise
# (a failed redo keeps the previous answer, unless a person flagged it: `rejected_sql`). A result holds an answer
# when its fingerprint is set: DONE rows, and NEEDS_REVIEW rows whose answer was paid for but did not pass the
# schema or `validate=`.
ANSWERED = "i.fingerprint IS NOT NULL"
# The usage columns also take a paid failure's (a refusal, an answer left empty: no fingerprint, its usage set),
# added to what the row shows: on a row showing no answer, to what its earlier paid failures used, carried into the
# answer that follows them; on a row showing an answer (a refused redo), to that answer's. So a row says what it
# cost, and the step's rows add up to what its runs paid (`llmledger_runs.cost_usd`; a refused redo's cost was
# found on no row in a trial).
PAID_USAGE = ("_input_tokens", "_output_tokens", "_cache_write_tokens", "_cache_read_tokens", "_cost_usd")
FROM_RESULT = "result"  # always the result's value
CLEAR = "clear"  # NULL (the claim is over)
CLEAR_IF_DONE = "clear_if_done"  # NULL once the row is DONE again (a flag is answered by a new answer)
CLEAR_IF_ANSWERED = "clear_if_answered"  # NULL once the row holds a new answer (a verdict judged the one before)
UNTOUCHED = "untouched"  # not written by a commit (the request columns, written when rows are prepared)


@dataclass(frozen=True)
class Column:
    suffix: str  # "" for the output itself
    sql_type: str
    commit: str
    result: str | None = None  # field name in a results chunk
    result_type: pl.DataType | None = None
    default: str | None = None
    doc: str = ""


STEP_COLUMNS: tuple[Column, ...] = (
    Column(
        "",
        "VARCHAR",
        KEEP_UNLESS_ANSWERED,
        "output",
        pl.String(),
        doc="the answer: text, or a STRUCT for a step with output= (results carry it as JSON text)",
    ),
    Column(
        "_status",
        "VARCHAR",
        FROM_RESULT,
        "status",
        pl.String(),
        "'NOT_STARTED'",
        "NOT_STARTED, RUNNING, SUBMITTED, DONE, FAILED or NEEDS_REVIEW",
    ),
    Column("_running_started_at", "TIMESTAMP", CLEAR, doc="when the current claim was taken (UTC)"),
    Column("_claimed_by", "VARCHAR", CLEAR, doc="host/pid/run of the claim"),
    Column("_claimed_from", "VARCHAR", CLEAR, doc="the status the row had when it was claimed"),
    Column(
        "_lease_until",
        "TIMESTAMP",
        CLEAR,
        doc="when the current claim lapses unless renewed (UTC, the database's clock on PostgreSQL)",
    ),
    Column(
        "_attempts",
        "INTEGER",
        FROM_RESULT,
        "attempts",
        pl.Int32(),
        "0",
        "answered or refused tries (transient errors never count)",
    ),
    Column("_error", "VARCHAR", FROM_RESULT, "error", pl.String(), doc="why the last try was refused"),
    Column("_finished_at", "TIMESTAMP", FROM_RESULT, "finished_at", pl.Datetime("us"), doc="when (UTC)"),
    Column("_input_tokens", "BIGINT", KEEP_UNLESS_ANSWERED, "input_tokens", pl.Int64(), doc="billed input tokens"),
    Column("_output_tokens", "BIGINT", KEEP_UNLESS_ANSWERED, "output_tokens", pl.Int64(), doc="billed output tokens"),
    Column(
        "_cache_write_tokens",
        "BIGINT",
        KEEP_UNLESS_ANSWERED,
        "cache_write_tokens",
        pl.Int64(),
        doc="prompt tokens written to the prompt cache (billed at 1.25x, or 2x for 1 h)",
    ),
    Column(
        "_cache_read_tokens",
        "BIGINT",
        KEEP_UNLESS_ANSWERED,
        "cache_read_tokens",
        pl.Int64(),
        doc="prompt tokens read from the prompt cache (billed at 0.1x)",
    ),
    Column(
        "_latency_ms",
        "BIGINT",
        KEEP_UNLESS_ANSWERED,
        "latency_ms",
        pl.Int64(),
        doc="milliseconds from sending the request to its answer (both requests' when a structured answer was "
        "asked twice); NULL for answers reused from another row or the history, answered in a batch, or written "
        "before llmledger recorded it",
    ),
    Column(
        "_cost_usd",
        "DOUBLE",
        KEEP_UNLESS_ANSWERED,
        "cost_usd",
        pl.Float64(),
        doc="list price of the answer; NULL for models without a known price",
    ),
    Column(
        "_raw",
        "VARCHAR",
        KEEP_UNLESS_ANSWERED,
        "raw",
        pl.String(),
        doc="an answer that did not match the step's output schema, as the model wrote it",
    ),
    Column("_stop_reason", "VARCHAR", FROM_RESULT, "stop_reason", pl.String(), doc="end_turn, max_tokens, ..."),
    Column("_model", "VARCHAR", FROM_RESULT, "model", pl.String(), doc="the model that answered"),
    Column(
        "_source",
        "VARCHAR",
        KEEP_UNLESS_ANSWERED,
        "source",
        pl.String(),
        doc='where the answer came from: "simulator", or the API endpoint\'s base URL; NULL for answers '
        "written before llmledger recorded it (real ones)",
    ),
    Column(
        "_fingerprint",
        "UUID",
        KEEP_UNLESS_ANSWERED,
        "fingerprint",
        pl.String(),
        doc="fingerprint of the request that produced the answer",
    ),
    Column(
        "_batch_id",
        "VARCHAR",
        FROM_RESULT,
        "batch_id",
        pl.String(),
        doc="the Message Batch the row was sent in (mode='batch'); NULL for online answers",
    ),
    Column(
        "_custom_id",
        "VARCHAR",
        FROM_RESULT,
        "custom_id",
        pl.String(),
        doc="the row's custom_id in that batch (rows with identical requests share one)",
    ),
    Column(
        "_pack",
        "VARCHAR",
        KEEP_UNLESS_ANSWERED,
        "pack_id",
        pl.String(),
        doc="the request (llmledger_packs.pack_id) the answer came in when rows_per_request= sent rows together; "
        "NULL for a request of its own",
    ),
    Column("_flag", "VARCHAR", CLEAR_IF_DONE, doc="why a person flagged the answer for redo (llmledger.flag)"),
    Column("_flagged_at", "TIMESTAMP", CLEAR_IF_DONE, doc="when it was flagged (UTC)"),
    Column("_flagged_by", "VARCHAR", CLEAR_IF_DONE, doc="who flagged it"),
    Column(
        "_verdict",
        "VARCHAR",
        CLEAR_IF_ANSWERED,
        doc="a person's verdict on the current answer: accepted, or corrected (the answer is theirs); every "
        "verdict, flags too, is in llmledger_verdicts",
    ),
    Column("_verdict_by", "VARCHAR", CLEAR_IF_ANSWERED, doc="who gave that verdict"),
    Column("_prompt", "VARCHAR", UNTOUCHED, doc="the current request's user message"),
    Column("_request_fingerprint", "UUID", UNTOUCHED, doc="fingerprint of the current request"),
    Column(
        "_version",
        "VARCHAR",
        UNTOUCHED,
        doc="the step definition (llmledger_steps.version) the current request was rendered for",
    ),
    Column(
        "_upstream_fingerprint",
        "UUID",
        UNTOUCHED,
        doc="digest of the upstream steps' answers the current request was rendered from",
    ),
)

RESULT_SCHEMA: dict[str, pl.DataType] = {
    c.result: c.result_type for c in STEP_COLUMNS if c.result is not None and c.result_type is not None
}


def step_columns(step: str) -> list[str]:
    return [step + c.suffix for c in STEP_COLUMNS]


# Names the ledger gives its own columns in the frames it joins on the key (claimed rows, results, batch
# assignments): a key column of such a name would be confused with them, so keys may not be named so.
KEY_RESERVED = frozenset({*RESULT_SCHEMA, "prompt", "version", "was_done", "fp"})

RETURNED_ONLY = ("_stale",)  # columns apply_llm returns beside the stored ones (`{step}_stale`)


# PostgreSQL cuts identifiers at 63 bytes, so a step's longest column name must fit in them (a store may move
# between engines: `copy`): the step name is at most this long.
NAME_BYTES = 63
MAX_STEP_NAME = NAME_BYTES - max(len(c.suffix) for c in STEP_COLUMNS)


def index_name(*parts: str) -> str:
    """An index name from `parts` that PostgreSQL keeps whole: long ones end in a digest, so two never meet."""
    name = "__".join(parts)
    if len(name.encode()) <= NAME_BYTES:
        return name
    return name.encode()[:48].decode(errors="ignore") + "_" + hashlib.sha1(name.encode()).hexdigest()[:12]


def owned_names(step: str) -> list[str]:
    """Every column name a step owns: those stored in the fact table and those only its returned frame has."""
    return step_columns(step) + [step + suffix for suffix in RETURNED_ONLY]


def check_step_name(
    step: str,
    *,
    table: str,
    other_steps: Sequence[str],
    is_new: bool,
    table_columns: Sequence[str],
    frame_columns: Sequence[str],
) -> None:
    """Refuse a step whose columns would be another's: every column a step owns is `step` + a suffix of
    STEP_COLUMNS, so beside a step `s` a step named `s_prompt` would write its answers into s's stored requests,
    `s_status` into s's statuses, and a step named like an input column (`text`) over the stored input.

    Names are compared without case (DuckDB's identifiers ignore it). The frame's own columns count only for a
    new step: a frame passed back in after a run of the step carries the step's own output columns.
    """
    from llmledger.errors import StepNameError

    mine = {c.lower(): c for c in owned_names(step)}
    suggestion = (
        f"choose another name, e.g. {step.rstrip('_') + '_v2'!r}" if not step.endswith("_v2") else "choose another name"
    )
    for other in other_steps:
        shared = sorted(mine[c.lower()] for c in owned_names(other) if c.lower() in mine)
        if shared:
            raise StepNameError(
                f"step name {step!r} clashes with step {other!r} of table {table!r}: both would own column "
                f"{shared[0]!r} (a step owns its name and its name + _status, _prompt, _flag, ...); {suggestion}. "
                "Nothing was written."
            )
    theirs = {c.lower() for s in other_steps for c in owned_names(s)}
    mine_in_table = {c.lower() for c in table_columns} - theirs
    if not is_new:  # the step's own columns are in the table already
        mine_in_table -= set(mine)
    inputs = {c.lower(): c for c in [*table_columns, *(frame_columns if is_new else ())]}
    taken = [(mine[c], inputs[c]) for c in mine if c in mine_in_table]
    if is_new:
        taken += [
            (mine[c.lower()], c)
            for c in frame_columns
            if c.lower() in mine and mine[c.lower()] not in [t for t, _ in taken]
        ]
    if taken:
        raise StepNameError(
            f"step name {step!r} would write its column {taken[0][0]!r} over the input column {taken[0][1]!r} of table "
            f"{table!r} (a step owns its name and its name + _status, _prompt, _flag, ...); {suggestion}, or "
            "rename the input column. Nothing was written."
        )
    every = {c.lower(): c for s in [step, *other_steps] for c in owned_names(s)}
    for c in frame_columns:  # DuckDB folds case: beside a step `s`, a column `S` would be the step's own
        if c.lower() in every and c != every[c.lower()]:
            raise StepNameError(
                f"the frame's column {c!r} differs only in case from {every[c.lower()]!r}, a column "
                f"of a step of table {table!r}, and the store does not tell them apart; rename it. "
                "Nothing was written."
            )


def names(step: str, alias: str = "") -> dict[str, str]:
    """Quoted column names of a step by suffix, optionally prefixed with a table alias."""
    prefix = f"{alias}." if alias else ""
    return {c.suffix: prefix + q(step + c.suffix) for c in STEP_COLUMNS}


def add_column_ddl(table: str, step: str, column: Column, output_type: str = "VARCHAR") -> str:
    default = f" DEFAULT {column.default}" if column.default else ""
    sql_type = output_type if column.suffix == "" else column.sql_type
    return f"ALTER TABLE {q(table)} ADD COLUMN {q(step + column.suffix)} {sql_type}{default}"


# A structured answer's column: a STRUCT (DuckDB), or JSONB on PostgreSQL, where `llmledger_jsonb(text)` (made by
# the schema) is NULL for text that is not JSON, as DuckDB's try_cast is.
JSONB = "JSONB"


def output_from_text(expr: str, output_type: str) -> str:
    """SQL turning the JSON text of a structured answer into the step's column type (text stays text)."""
    if output_type == JSONB:
        return f"llmledger_jsonb({expr})"
    return expr if output_type == "VARCHAR" else f"try_cast(try_cast({expr} AS JSON) AS {output_type})"


def output_as_text(expr: str, output_type: str) -> str:
    """SQL for an output as text: the answer itself, or a structured one as JSON."""
    if output_type == JSONB:
        return f"CAST({expr} AS TEXT)"
    return expr if output_type == "VARCHAR" else f"to_json({expr})::VARCHAR"


def rejected_sql(step: str) -> str:
    """SQL: a result `i` holding no answer, for a row `t` showing an answer a person flagged (llmledger.flag).

    A failed try of such a row (a `redo="flagged"` refused or erring up to its attempts) does not leave the
    rejected answer showing as the row's: it goes to the history (`commit_results`), the row shows this try's
    error, and its flag stays, so that `redo="flagged"` still finds it until a new answer replaces it. Its usage
    columns keep adding up as on any row showing no answer (PAID_USAGE), so the step's rows still add up to
    what its runs paid.
    """
    t = names(step, "t")
    return f"(NOT {ANSWERED} AND {t['_flag']} IS NOT NULL AND {t['_fingerprint']} IS NOT NULL)"


def lost_commit_sql(step: str, claimant: str) -> str:
    """SQL over a row `t` and a result `i` for it from `claimant` (SQL: a literal or a parameter): the row is still
    RUNNING as that claimant claimed it, so the result's commit was lost, and writing it again counts nothing
    twice. An answer: a run never claims again a row it answered. A failure: the row's tries are one short of the
    result's (equal: a failure that landed, and was claimed again), or it is the first try of a redo of a DONE row,
    whose tries start again from one (a landed failure claimed again was claimed from FAILED, not DONE)."""
    t = names(step, "t")
    return (
        f"{t['_status']} = 'RUNNING' AND {t['_claimed_by']} = {claimant} "
        f"AND (i.status IN ('DONE', 'NEEDS_REVIEW') OR {t['_attempts']} = i.attempts - 1 "
        f"OR (i.attempts = 1 AND {t['_claimed_from']} = 'DONE'))"
    )


def commit_assignments(step: str, output_type: str = "VARCHAR") -> str:
    """The SET list writing a results chunk `i` into the fact table `t`."""
    t = names(step, "t")
    rejected = rejected_sql(step)
    sets = []
    for c in STEP_COLUMNS:
        if c.commit == UNTOUCHED:
            continue
        if c.commit == CLEAR:
            value = "NULL"
        elif c.commit == CLEAR_IF_DONE:
            value = f"CASE WHEN i.status = 'DONE' THEN NULL ELSE {t[c.suffix]} END"
        elif c.commit == CLEAR_IF_ANSWERED:
            value = f"CASE WHEN {ANSWERED} THEN NULL ELSE {t[c.suffix]} END"
        else:
            value = f"i.{c.result}" + ("::UUID" if c.sql_type == "UUID" else "")
            if c.suffix == "":
                value = output_from_text(value, output_type)
            elif c.suffix == "_raw" and output_type != "VARCHAR":  # an answer that does not fit the column's type
                value = (
                    f"coalesce({value}, CASE WHEN {output_from_text('i.output', output_type)} IS NULL "
                    "THEN i.output END)"
                )  # (its type changed meanwhile) is kept as text
            if c.commit == KEEP_UNLESS_ANSWERED and c.suffix in PAID_USAGE:  # a row showing no answer adds up
                earlier = f"CASE WHEN {t['_fingerprint']} IS NULL THEN {t[c.suffix]} END"  # its failed tries
                value = (
                    f"CASE WHEN {ANSWERED} THEN {value} + coalesce({earlier}, 0) "
                    f"WHEN {value} IS NOT NULL THEN coalesce({t[c.suffix]}, 0) + {value} ELSE {t[c.suffix]} END"
                )
            elif c.commit == KEEP_UNLESS_ANSWERED:
                value = f"CASE WHEN {ANSWERED} OR {rejected} THEN {value} ELSE {t[c.suffix]} END"
        sets.append(f"{q(step + c.suffix)} = {value}")
    return ", ".join(sets)
