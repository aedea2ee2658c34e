"""The ledger's tables, and the numbered migrations that bring an older store up to date.

Every store records the migrations applied to it in `llmledger_migrations`.
A store written by llmledger 0.1.0 has no such table: it is recognised by its
`llmledger_steps` table, recorded as being at migration 1, and upgraded from
there inside the same transaction as the call that opened it. A store written
by a newer llmledger is refused rather than misread.

Migrations are frozen: each one spells out its own DDL instead of reading the
current column definitions, so upgrading an old store always does the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from llmledger._ledger.columns import STEP_COLUMNS, add_column_ddl, index_name
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.dialect import dialect_of
from llmledger._ledger.engine.shared import column_types, one, table_exists
from llmledger._step.request import RequestSpec
from llmledger._step.sqltext import q
from llmledger._time import utcnow
from llmledger.errors import StoreError, StoreNotFound

if TYPE_CHECKING:
    from llmledger._step.output import OutputSpec


MIGRATIONS_TABLE = "llmledger_migrations"
STEPS_TABLE = "llmledger_steps"
RUNS_TABLE = "llmledger_runs"
HISTORY_TABLE = "llmledger_history"
BATCHES_TABLE = "llmledger_batches"
VERDICTS_TABLE = "llmledger_verdicts"
PACKS_TABLE = "llmledger_packs"
LEGACY_FINGERPRINT_PREFIX = "llmledger-0.1:"  # fingerprints of 0.1.0 become md5(prefix || old)::UUID


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Con], None]


def _add_step_columns(con: Con, columns: dict[str, str]) -> None:
    """Add the per-step columns `{suffix: SQL type}` to every step of every fact table that lacks them."""
    for table, step in con.execute(f"SELECT DISTINCT table_name, step FROM {STEPS_TABLE}").fetchall():
        if table_exists(con, table):
            existing = column_types(con, table)
            for suffix, sql_type in columns.items():
                if step + suffix not in existing:
                    con.execute(f"ALTER TABLE {q(table)} ADD COLUMN {q(step + suffix)} {sql_type}")


def _v1_tables(con: Con) -> None:
    """The bookkeeping tables of llmledger 0.1.0."""
    con.execute(f"""CREATE TABLE IF NOT EXISTS {STEPS_TABLE} (
        table_name VARCHAR, step VARCHAR, key VARCHAR[], created_at TIMESTAMP, model VARCHAR,
        prompt VARCHAR, system VARCHAR)""")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
        run_id VARCHAR, table_name VARCHAR, step VARCHAR, claimant VARCHAR, model VARCHAR,
        started_at TIMESTAMP, finished_at TIMESTAMP, outcome VARCHAR, rows_in_frame BIGINT,
        rows_selected BIGINT, done BIGINT, failed BIGINT, needs_review BIGINT, stale BIGINT,
        calls BIGINT, reused BIGINT, retries BIGINT, input_tokens BIGINT, output_tokens BIGINT, cost_usd DOUBLE)""")
    con.execute(f"""CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (
        table_name VARCHAR, step VARCHAR, row_key VARCHAR, output VARCHAR, model VARCHAR,
        fingerprint VARCHAR, input_tokens BIGINT, output_tokens BIGINT, cost_usd DOUBLE,
        finished_at TIMESTAMP, replaced_at TIMESTAMP)""")


def _v2_self_contained(con: Con) -> None:
    """Step versions with their whole request; each row's rendered request; fingerprints of whole requests."""
    for name, sql_type in (
        ("version", "VARCHAR"),
        ("max_tokens", "INTEGER"),
        ("options", "VARCHAR"),
        ("request", "VARCHAR"),
        ("prompt_kind", "VARCHAR"),
        ("last_prepared_at", "TIMESTAMP"),
    ):
        con.execute(f"ALTER TABLE {STEPS_TABLE} ADD COLUMN IF NOT EXISTS {name} {sql_type}")
    for name in ("version", "entry"):
        con.execute(f"ALTER TABLE {RUNS_TABLE} ADD COLUMN IF NOT EXISTS {name} VARCHAR")
    for table, step in con.execute(f"SELECT DISTINCT table_name, step FROM {STEPS_TABLE}").fetchall():
        if not table_exists(con, table):
            continue
        existing = column_types(con, table)
        for suffix, sql_type in (("_prompt", "VARCHAR"), ("_request_fingerprint", "UUID"), ("_version", "VARCHAR")):
            if step + suffix not in existing:
                con.execute(f"ALTER TABLE {q(table)} ADD COLUMN {q(step + suffix)} {sql_type}")
        fp = step + "_fingerprint"
        if existing.get(fp) == "VARCHAR":  # 0.1.0's md5(model␟system␟max_tokens␟prompt), kept recognisable
            con.execute(
                f"ALTER TABLE {q(table)} ALTER COLUMN {q(fp)} TYPE UUID USING "
                f"CASE WHEN {q(fp)} IS NULL THEN NULL "
                f"ELSE md5('{LEGACY_FINGERPRINT_PREFIX}' || {q(fp)})::UUID END"
            )


def _v3_pipelines(con: Con) -> None:
    """Per step: raw text of answers not matching an output schema, the status a claim took, flags, and the
    upstream answers a request was made from; steps record their upstream steps; history says why."""
    con.execute(f"ALTER TABLE {STEPS_TABLE} ADD COLUMN IF NOT EXISTS upstream VARCHAR[]")
    for name in ("reason", "status", "raw"):
        con.execute(f"ALTER TABLE {HISTORY_TABLE} ADD COLUMN IF NOT EXISTS {name} VARCHAR")
    _add_step_columns(
        con,
        {
            "_raw": "VARCHAR",
            "_claimed_from": "VARCHAR",
            "_flag": "VARCHAR",
            "_flagged_at": "TIMESTAMP",
            "_flagged_by": "VARCHAR",
            "_upstream_fingerprint": "UUID",
        },
    )


def _v4_cache(con: Con) -> None:
    """Per step: prompt tokens written to and read from the prompt cache."""
    _add_step_columns(con, {"_cache_write_tokens": "BIGINT", "_cache_read_tokens": "BIGINT"})


def _v5_batches(con: Con) -> None:
    """Message Batches: each batch's intent and fate; per step, the batch and custom id a row was sent with;
    per run, the mode it ran in."""
    con.execute(f"""CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (
        intent VARCHAR, batch_id VARCHAR, table_name VARCHAR, step VARCHAR, claimant VARCHAR, requests BIGINT,
        rows_sent BIGINT, bytes BIGINT, model VARCHAR, version VARCHAR, created_at TIMESTAMP,
        submitted_at TIMESTAMP,
        state VARCHAR, processing_status VARCHAR, succeeded BIGINT, errored BIGINT, canceled BIGINT,
        expired BIGINT, ended_at TIMESTAMP, merged_at TIMESTAMP, note VARCHAR, validated BOOLEAN,
        adopted BOOLEAN, rejected VARCHAR[], unused BIGINT, unused_cost_usd DOUBLE)""")
    con.execute(f"ALTER TABLE {RUNS_TABLE} ADD COLUMN IF NOT EXISTS mode VARCHAR")
    _add_step_columns(con, {"_batch_id": "VARCHAR", "_custom_id": "VARCHAR"})


def _v6_sources(con: Con) -> None:
    """Per step, where each answer came from (the simulator or an API endpoint); the history keeps it, and
    the stop reason, with each replaced answer (so an answer found there can be reused like a current one).
    On PostgreSQL the history gets an index on the fingerprint: each claim of a worker looks answers up there."""
    for name in ("source", "stop_reason"):
        con.execute(f"ALTER TABLE {HISTORY_TABLE} ADD COLUMN IF NOT EXISTS {name} VARCHAR")
    if dialect_of(con).indexed:
        con.execute(f"CREATE INDEX IF NOT EXISTS llmledger_history__fingerprint ON {HISTORY_TABLE} (fingerprint)")
    _add_step_columns(con, {"_source": "VARCHAR"})


def _v7_budget_reservations(con: Con) -> None:
    """A step's budget shared by its concurrent runs: what each live run has reserved (budget.py)."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS llmledger_budget_reservations (table_name VARCHAR, step VARCHAR, "
        "claimant VARCHAR, reserved_usd DOUBLE, reserved_at TIMESTAMP)"
    )


def _v8_leases(con: Con) -> None:
    """Per step, when the current claim lapses unless renewed: each claim carries its holder's own lease, written
    in the database's clock, so workers with other clocks or other stale_after judge it alike."""
    _add_step_columns(con, {"_lease_until": "TIMESTAMP"})


def _v9_batch_sources(con: Con) -> None:
    """Per Message Batch, where it was sent (the simulator or the API endpoint): its answers are recorded as
    that source's, and only a run against the same source collects it or joins rows to it."""
    con.execute(f"ALTER TABLE {BATCHES_TABLE} ADD COLUMN IF NOT EXISTS source VARCHAR")


def _v10_request_shapes(con: Con) -> None:
    """A stored request may now hold a `messages=` prefix and the columns whose files a row's message carries
    (`llmledger_attach`), and a row's stored message may be JSON content blocks: an older llmledger would send
    such a request wrongly, so the store is marked as one only this version reads. Steps record the columns
    whose nulls skip_nulls=True leaves unsent, so `resume` and `llmledger run` leave them unsent too."""
    con.execute(f"ALTER TABLE {STEPS_TABLE} ADD COLUMN IF NOT EXISTS skip_nulls VARCHAR[]")


def _refuse_taken(con: Con, suffixes: tuple[str, ...]) -> None:
    """A column a migration would add to a step, already in its table (an input, another step's), is not taken for
    it: the upgrade is refused, naming it, and nothing changes."""
    for table, step in con.execute(f"SELECT DISTINCT table_name, step FROM {STEPS_TABLE}").fetchall():
        taken = [step + s for s in suffixes if table_exists(con, table) and step + s in column_types(con, table)]
        if taken:
            raise StoreError(
                f"upgrading this store would add {table}.{taken[0]} for step {step!r}, and {table} already "
                f"has a column of that name (an input or another step's): rename it with an older llmledger or in "
                "SQL, then open the store again. Nothing was changed."
            )


def _v11_providers(con: Con) -> None:
    """A stored request may now be written for OpenAI's API (`llmledger_provider`), which an older llmledger
    would send to Anthropic's, so the store is marked as one only this version reads; per step, how long each
    answer's request took."""
    _refuse_taken(con, ("_latency_ms",))
    _add_step_columns(con, {"_latency_ms": "BIGINT"})


def _v12_verdicts(con: Con) -> None:
    """A person's verdicts on answers: every one in `llmledger_verdicts` (which answer it judged, who, when, why,
    the corrected value), and per step the verdict on the current answer (`_verdict`, `_verdict_by`), which a
    redo reads to keep what a person accepted or wrote. An older llmledger would overwrite a person's answer, so
    the store is marked as one only this version reads."""
    _refuse_taken(con, ("_verdict", "_verdict_by"))
    con.execute(
        f"CREATE TABLE IF NOT EXISTS {VERDICTS_TABLE} (table_name VARCHAR, step VARCHAR, row_key VARCHAR, "
        "verdict VARCHAR, answer VARCHAR, fingerprint VARCHAR, source VARCHAR, status VARCHAR, corrected VARCHAR, "
        "reason VARCHAR, reviewer VARCHAR, judged_at TIMESTAMP, undone_at TIMESTAMP)"
    )
    if dialect_of(con).indexed:
        con.execute(
            f"CREATE INDEX IF NOT EXISTS llmledger_verdicts__row ON {VERDICTS_TABLE} (table_name, step, row_key)"
        )
    _add_step_columns(con, {"_verdict": "VARCHAR", "_verdict_by": "VARCHAR"})


def _v13_packs(con: Con) -> None:
    """Rows packed into one request (`rows_per_request=`): every pack's whole request and answer, what it used and
    cost, and which rows it carried, in `llmledger_packs`; per step, the pack the current answer came in (`_pack`).
    A packed step's stored request names its pack size (`llmledger_rows_per_request`), which an older llmledger
    would ignore, sending each row alone and filing the answer as packed, so the store is marked as one only this
    version reads."""
    _refuse_taken(con, ("_pack",))
    con.execute(
        f"CREATE TABLE IF NOT EXISTS {PACKS_TABLE} (pack_id VARCHAR, table_name VARCHAR, step VARCHAR, "
        "run_id VARCHAR, rows INTEGER, kept INTEGER, row_keys VARCHAR, request VARCHAR, answer VARCHAR, "
        "problems VARCHAR, model VARCHAR, input_tokens BIGINT, output_tokens BIGINT, cache_write_tokens BIGINT, "
        "cache_read_tokens BIGINT, cost_usd DOUBLE, latency_ms BIGINT, answered_at TIMESTAMP)"
    )
    _add_step_columns(con, {"_pack": "VARCHAR"})


def _v14_batch_packs(con: Con) -> None:
    """Packs in batches, and batches with a deadline. A pack sent in a batch is recorded as it is sent, with its
    request's custom id (`custom_id`) and each item's rows' custom id (`custom_ids`, JSON), so whoever merges the
    batch reads each entry back onto its own rows; a batch records the deadline it was sent against (`deadline`),
    so a later call that collects it honours it. An older llmledger would read a pack's answer as nobody's and send
    its rows again, so the store is marked as one only this version reads."""
    con.execute(f"ALTER TABLE {PACKS_TABLE} ADD COLUMN custom_id VARCHAR")
    con.execute(f"ALTER TABLE {PACKS_TABLE} ADD COLUMN custom_ids VARCHAR")
    con.execute(f"ALTER TABLE {BATCHES_TABLE} ADD COLUMN deadline TIMESTAMP")


MIGRATIONS = (
    Migration(1, "bookkeeping tables of llmledger 0.1.0", _v1_tables),
    Migration(2, "self-contained steps: versions, stored requests, whole-request fingerprints", _v2_self_contained),
    Migration(
        3, "pipelines: structured outputs, upstream steps, flags, claims that remember, history reasons", _v3_pipelines
    ),
    Migration(4, "prompt caching: cache write and read tokens per row", _v4_cache),
    Migration(5, "Message Batches: batch intents and ids, per-row batch and custom ids, run modes", _v5_batches),
    Migration(6, "answer sources: the simulator or the API endpoint per answer, kept in the history too", _v6_sources),
    Migration(7, "budget reservations: a step's budget shared by its concurrent runs", _v7_budget_reservations),
    Migration(8, "leases: each claim's own end, in the database's clock", _v8_leases),
    Migration(9, "batch sources: where each Message Batch was sent", _v9_batch_sources),
    Migration(10, "requests with messages= prefixes and attached files", _v10_request_shapes),
    Migration(11, "providers and latency: requests for OpenAI's API, how long each answer took", _v11_providers),
    Migration(12, "verdicts: a person's accepts, flags and corrections, and the verdict on each answer", _v12_verdicts),
    Migration(13, "packs: rows sent together in one request, each pack's request and answer", _v13_packs),
    Migration(14, "packs in batches, and batches with a deadline", _v14_batch_packs),
)
LATEST = MIGRATIONS[-1].version


def schema_version(con: Con) -> int:
    if table_exists(con, MIGRATIONS_TABLE):
        return int(one(con, f"SELECT coalesce(max(version), 0) FROM {MIGRATIONS_TABLE}")[0])
    return 1 if table_exists(con, STEPS_TABLE) else 0


def migrate(con: Con, now: datetime) -> int:
    """Bring the store to the latest schema; return how many migrations ran. Runs inside the caller's transaction."""
    current = schema_version(con)
    if current > LATEST:
        raise StoreError(
            f"this store was written by a newer llmledger (schema {current}; this llmledger knows "
            f"up to {LATEST}). Upgrade llmledger (pip install -U llmledger) to use it."
        )
    if current == LATEST:
        return 0
    from llmledger._version import __version__

    if current == 0:
        for statement in dialect_of(con).setup:
            con.execute(statement)
    con.execute(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version INTEGER, name VARCHAR, "
        "applied_at TIMESTAMP, llmledger VARCHAR)"
    )
    if current == 1 and not one(con, f"SELECT count(*) FROM {MIGRATIONS_TABLE}")[0]:
        con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (1, ?, ?, '0.1.0')", [MIGRATIONS[0].name, now])
    ran = 0
    for migration in MIGRATIONS:
        if migration.version > current:
            migration.apply(con)
            con.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?, ?, ?)",
                [migration.version, migration.name, now, __version__],
            )
            ran += 1
    return ran


def migrate_for_readers(conn: Any) -> None:
    """Bring an older store to the current schema before a reader opens it read-only (`conn`: a `Connection` or
    `PgConnection`). A current store, the usual case, is only read, so one that cannot be written can be."""
    with conn.open(wait=60.0, read_only=True) as con:
        found = schema_version(con)
    if found >= LATEST:
        return
    name = getattr(conn, "name", None) or str(getattr(conn, "path", "the store"))
    if found == 0:  # a database of the user's own: a reader must not fill it with llmledger's tables
        raise StoreNotFound(f"no ledger in store {name!r} (it has no llmledger tables); apply_llm(..., store=...) "
                            "creates one")  # fmt: skip
    try:
        conn.transaction(lambda con: migrate(con, utcnow()), wait=60.0, exclusive=True)
    except Exception as exc:
        if isinstance(exc, StoreError) or "permission denied" not in str(exc).lower():  # DuckDB's say it already
            raise  # (a read-only file or medium); what is left is PostgreSQL's role that may only read
        raise StoreError(
            f"store {name!r} was written by an older llmledger (schema {found}, this one reads {LATEST}) and must "
            f"be upgraded once, which this role may not do ({str(exc).splitlines()[0]}): run any llmledger call on "
            "it as a role that may write, then read it as this one"
        ) from None


# -- steps ---------------------------------------------------------------------------------------------


def list_steps(con: Con, table: str | None = None) -> list[tuple[str, str, list[str]]]:
    """(table, step, key) for every step the store knows, in the order they were first run."""
    if not table_exists(con, STEPS_TABLE):
        return []
    sql = f"SELECT table_name, step, min(key), min(created_at) AS first FROM {STEPS_TABLE}"
    params: list[Any] = []
    if table:
        sql += " WHERE table_name = ?"
        params.append(table)
    rows = con.execute(sql + " GROUP BY table_name, step ORDER BY first, step", params).fetchall()
    return [(r[0], r[1], list(r[2])) for r in rows]


def owned_columns(con: Con, table: str, step: str) -> set[str]:
    """Columns the ledger owns for the table's steps, stored or only returned (never copied from a frame)."""
    from llmledger._ledger.columns import owned_names

    owned = set(owned_names(step))
    for _, other, _ in list_steps(con, table):
        owned.update(owned_names(other))
    return owned


def ensure_step_columns(con: Con, table: str, step: str, output_type: str = "VARCHAR") -> None:
    """Give the table the step's columns. On PostgreSQL the status and the request fingerprint get an index:
    claims look rows up by the one, and take identical requests together by the other (`claim_twins`)."""
    existing = column_types(con, table)
    for column in STEP_COLUMNS:
        if step + column.suffix not in existing:
            con.execute(add_column_ddl(table, step, column, output_type))
    if dialect_of(con).indexed:
        for suffix in ("_status", "_request_fingerprint"):
            con.execute(
                f"CREATE INDEX IF NOT EXISTS {q(index_name(table, step + suffix))} ON {q(table)} ({q(step + suffix)})"
            )


def record_step(
    con: Con,
    *,
    table: str,
    step: str,
    key: list[str],
    version: str,
    model: str,
    system: str | None,
    max_tokens: int,
    options: str,
    request: str,
    prompt: str,
    prompt_kind: str,
    upstream: list[str],
    now: datetime,
    skip_nulls: list[str] | None = None,
) -> None:
    """Record this definition of the step (one row per version) and mark it the step's current one, with the
    columns whose nulls this call leaves unsent (`skip_nulls`)."""
    known = one(
        con,
        f"SELECT count(*) FROM {STEPS_TABLE} WHERE table_name = ? AND step = ? AND version = ?",
        [table, step, version],
    )[0]
    if known:
        con.execute(
            f"UPDATE {STEPS_TABLE} SET last_prepared_at = ?, skip_nulls = ? WHERE table_name = ? "
            "AND step = ? AND version = ?",
            [now, skip_nulls, table, step, version],
        )
    else:
        con.execute(
            f"INSERT INTO {STEPS_TABLE} (table_name, step, key, created_at, model, prompt, system, version, "
            "max_tokens, options, request, prompt_kind, last_prepared_at, upstream, skip_nulls) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                table,
                step,
                key,
                now,
                model,
                prompt,
                system,
                version,
                max_tokens,
                options,
                request,
                prompt_kind,
                now,
                upstream,
                skip_nulls,
            ],
        )


def skipped_nulls(con: Con, table: str, step: str) -> list[str]:
    """The columns whose nulls the step's last apply_llm left unsent (skip_nulls=True)."""
    rows = con.execute(
        f"SELECT skip_nulls FROM {STEPS_TABLE} WHERE table_name = ? AND step = ? "
        "AND version IS NOT NULL ORDER BY last_prepared_at DESC LIMIT 1",
        [table, step],
    ).fetchall()
    return list(rows[0][0] or []) if rows else []


def current_version(con: Con, table: str, step: str) -> tuple[str, str, list[str]] | None:
    """(version, request JSON, key) of the definition apply_llm last prepared for this step."""
    if not table_exists(con, STEPS_TABLE):
        return None
    rows = con.execute(
        f"SELECT version, request, key FROM {STEPS_TABLE} WHERE table_name = ? AND step = ? "
        "AND version IS NOT NULL ORDER BY last_prepared_at DESC LIMIT 1",
        [table, step],
    ).fetchall()
    return (rows[0][0], rows[0][1], list(rows[0][2])) if rows else None


def current_output_spec(con: Con, table: str, step: str) -> OutputSpec | None:
    """The structured output the step's current definition asks for; None for text answers (or no such step)."""
    found = current_version(con, table, step)
    return RequestSpec.from_json(found[1]).output_spec() if found else None


def requests_by_version(con: Con, table: str, step: str) -> dict[str, str]:
    return dict(
        con.execute(
            f"SELECT version, request FROM {STEPS_TABLE} WHERE table_name = ? AND step = ? AND version IS NOT NULL",
            [table, step],
        ).fetchall()
    )
