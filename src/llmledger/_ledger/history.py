"""Nothing paid for is lost: answers about to be replaced are copied to `llmledger_history` first.

Every path that replaces or clears a step's answers goes through `archive`:
a commit whose rows already had an answer (a redo), a change of the step's
output type, `reset`. Each archived row says why (`reason`) and what status
the row had. `side_by_side` reads them back next to the current answers.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time
from decimal import Decimal
from numbers import Integral, Number, Real
from typing import Any, cast
from uuid import UUID

import polars as pl

from llmledger._ledger.columns import names, output_as_text, output_from_text
from llmledger._ledger.engine import Con
from llmledger._ledger.engine.shared import column_types
from llmledger._ledger.schema import HISTORY_TABLE
from llmledger._ledger.survey import Layout
from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError

_KEY_VALUES = (str, Number, Decimal, date, time, UUID)  # what one row's key value can be

_COLUMNS = (
    "table_name, step, row_key, output, model, fingerprint, input_tokens, output_tokens, cost_usd, "
    "finished_at, replaced_at, reason, status, raw, source, stop_reason"
)


def archive(
    con: Con,
    layout: Layout,
    *,
    now: datetime,
    reason: str,
    condition: str,
    join: str = "",
    params: dict[str, Any] | None = None,
    output_type: str | None = None,
) -> None:
    """Copy the answers of rows `t` matching `condition` (optionally joined to more) into the history.

    `reason` is SQL (a flag's text, say); `output_type` is the type the output column has now.
    """
    output_type = output_type or column_types(con, layout.table)[layout.step]
    c = names(layout.step, "t")
    con.execute(
        f"INSERT INTO {HISTORY_TABLE} ({_COLUMNS}) SELECT $table, $step, {layout.key_json()}, "
        f"{output_as_text(c[''], output_type)}, {c['_model']}, {c['_fingerprint']}::VARCHAR, {c['_input_tokens']}, "
        f"{c['_output_tokens']}, {c['_cost_usd']}, {c['_finished_at']}, $now, {reason}, "
        f"coalesce({c['_claimed_from']}, {c['_status']}), {c['_raw']}, {c['_source']}, {c['_stop_reason']} "
        f"FROM {q(layout.table)} AS t {join} "
        f"WHERE ({c['']} IS NOT NULL OR {c['_raw']} IS NOT NULL) AND ({condition})",
        {**(params or {}), "table": layout.table, "step": layout.step, "now": now},
    )


# Why an answer went to the history, when it may stand in for an identical request later (`answers_to`): it
# was replaced because its request changed (`redo="stale"`) or the output column's type did. Not an answer a
# person rejected (flagged, reset), nor one replaced by a redo of the same request (`redo=True`: the user
# wanted another answer), nor a simulated one a real run set aside (its source says so too).
STALE = "stale"
REUSABLE_REASONS = (STALE, "output type changed")
SIMULATED = "simulated answer"


def redo_reason(layout: Layout) -> str:
    """SQL: why a commit replaces a row's answer: a person's flag; `stale` when the answer was made for another
    request than the one answered now; `redo` otherwise (the same request asked again)."""
    flag, answered, asked = (layout.col(s, "t") for s in ("_flag", "_fingerprint", "_request_fingerprint"))
    return (
        f"CASE WHEN {flag} IS NOT NULL THEN 'flagged: ' || {flag} "
        f"WHEN {answered} IS DISTINCT FROM {asked} THEN '{STALE}' ELSE 'redo' END"
    )


def side_by_side(con: Con, layout: Layout, key: Any = None) -> pl.DataFrame:
    """Each replaced answer of the step next to the row's current one, oldest first.

    `key`: one row's key value (a dict of key columns when the key has several), or None for all rows.
    """
    where, params = key_match(con, layout, key)
    types = column_types(con, layout.table)
    output_type = types[layout.step]
    c = names(layout.step, "t")
    keys = ", ".join(f"t.{q(k)}" for k in layout.key)
    old_output = output_from_text("h.output", output_type)
    # what was and what is beside the key, first: a notebook shows a wide frame's first columns (found in a trial:
    # the current answer was the 14th column, off the screen)
    frame: pl.DataFrame = con.sql(
        f"SELECT {keys}, h.reason, {old_output} AS old_output, {c['']} AS output, h.status AS old_status, "
        f"{c['_status']} AS status, h.replaced_at, h.model AS old_model, h.cost_usd AS old_cost_usd, "
        f"h.input_tokens AS old_input_tokens, h.output_tokens AS old_output_tokens, h.fingerprint AS old_fingerprint, "
        f"h.output AS old_text, h.raw AS old_raw, h.finished_at AS old_finished_at, {c['_finished_at']} AS finished_at "
        f"FROM {HISTORY_TABLE} AS h JOIN {q(layout.table)} AS t ON h.row_key = {layout.key_json()} "
        f"WHERE h.table_name = $table AND h.step = $step{' AND ' + where if where else ''} "
        f"ORDER BY {keys}, h.replaced_at",
        params={**params, "table": layout.table, "step": layout.step},
    ).pl()
    return frame


_INTEGER_TYPES = frozenset({
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
})  # fmt: skip
_FLOAT_TYPES = frozenset({"FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8", "DOUBLE PRECISION"})
_NUMBER_TEXT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)


def key_match(
    con: Con, layout: Layout, key: Any, alias: str = "t", *, whole: bool = False
) -> tuple[str, dict[str, Any]]:
    """SQL over the fact table (as `alias`) matching the row of `key` (its value, or a dict of key columns when the
    key has several; None: every row), and its parameters. A key that names no key column, or a value no row of
    that column's type can have, is refused, naming it."""
    if key is None:
        return "", {}
    if isinstance(key, dict) and not key:
        raise InvalidInputError(f"key={{}} names no key column of {layout.table!r} ({layout.key}); pass its value")
    if not isinstance(key, dict):
        if len(layout.key) != 1:
            raise InvalidInputError(
                f"table {layout.table!r} is keyed by {layout.key}; pass key= as a dict of those columns"
            )
        key = {layout.key[0]: key}
    unknown = sorted(set(key) - set(layout.key))
    if whole and not unknown and set(key) != set(layout.key):  # one row, not every row sharing part of its key
        raise InvalidInputError(
            f"key= must name every key column of {layout.table!r} ({layout.key}) to name one row; got {sorted(key)}"
        )
    if unknown:
        raise InvalidInputError(f"key= names {unknown}, which are not key columns of {layout.table!r} ({layout.key})")
    types = column_types(con, layout.table)
    key = {column: _plain(value) for column, value in key.items()}
    for column, value in key.items():
        if not isinstance(value, _KEY_VALUES):
            raise InvalidInputError(
                f"key {column!r} of {layout.table!r} is one row's value (text, a number, a date or time), got "
                f"{value!r:.80}; pass a dict of key columns for a key of several columns"
            )
        _check_key_value(layout.table, column, types[column], value)
        key[column] = _as_float(types[column], value)
    where = " AND ".join(f"CAST({alias}.{q(k)} AS VARCHAR) = CAST($k{i} AS VARCHAR)" for i, k in enumerate(key))
    return where, {f"k{i}": v for i, v in enumerate(key.values())}


def _plain(value: Any) -> Any:
    """numpy's scalars (`df["id"].iloc[0]`) as Python's, which both engines take (DuckDB refused them)."""
    return cast(Any, value).item() if isinstance(value, Number) and type(value).__module__ == "numpy" else value


def _as_float(sql_type: str, value: Any) -> Any:
    """A number (or a number's text) for a floating-point key column, as a float: rows match by their text, and
    `key=1` is "1" where the row's 1.0 is "1.0" (it was refused as naming no row). Both sides are then the engine's
    own text of a float. Only a value the float holds exactly: `2**53 + 1`, `10**20 + 1` or "1e999" would round onto
    another row's key and judge that row, so they stay as given, and name no row."""
    if sql_type.upper() not in _FLOAT_TYPES or isinstance(value, bool):
        return value
    exact: Any = value
    if isinstance(value, str):
        if not _NUMBER_TEXT.fullmatch(value.strip()):
            return value
        exact = Decimal(value.strip())
    if not isinstance(exact, Real | Decimal):  # not a complex number, which has no float
        return value
    try:
        as_float = float(exact)
    except OverflowError:  # beyond every float (and every engine's integers): its text, which names no row
        return str(value)
    if isinstance(exact, Decimal):
        same = exact.is_nan() or Decimal(as_float) == exact
    else:
        same = as_float != as_float or as_float == exact  # NaN, or Python's exact comparison of int and float
    return as_float if same else value


def _check_key_value(table: str, column: str, sql_type: str, value: Any) -> None:
    """Refuse a key value that no row of an integer key column can have (`key="notanint"`): the rows are matched by
    their text, so it would match none and say nothing. A text key takes any value, as its text; a complex number
    no column holds (it reached the engine, whose own error said nothing of the key)."""
    if isinstance(value, complex):
        raise InvalidInputError(
            f"key {column!r} is {sql_type} in table {table!r}, and key={value!r} is a complex number: no row can "
            "have it. Pass the row's key."
        )
    if sql_type.upper() not in _INTEGER_TYPES:
        return
    if isinstance(value, Integral) and not isinstance(value, bool):
        return
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value):  # as the command line passes it
        return
    raise InvalidInputError(
        f"key {column!r} is {sql_type} in table {table!r}, and key={value!r} is no integer: no row can have it. "
        "Pass the row's integer key."
    )
