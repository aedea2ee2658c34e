"""Frames in and out: a polars or pandas frame (or a Parquet path) made into the polars frame the ledger stores,
its key resolved and checked, and the answers put back beside the caller's rows in the caller's kind of frame."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import polars as pl

from llmledger._ledger.columns import KEY_RESERVED, NAME_BYTES, owned_names
from llmledger._run.plan import Plan
from llmledger.errors import InvalidInputError, KeyColumnError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def as_polars(df: Any) -> tuple[pl.DataFrame, bool]:
    if isinstance(df, pl.DataFrame):
        return df, False
    if isinstance(df, pl.LazyFrame):
        return df.collect(), False
    if type(df).__module__.split(".")[0] == "pandas" and type(df).__name__ == "DataFrame":
        twice = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
        if twice:  # df[c] would be a frame, and the ledger's columns are named by the frame's
            raise InvalidInputError(
                f"the pandas frame has more than one column named {', '.join(map(repr, twice))}: rename or drop "
                "the repeats (df.loc[:, ~df.columns.duplicated()] keeps the first of each)"
            )
        paths = [
            c for c in df.columns if df[c].dtype == object and df[c].map(lambda v: isinstance(v, os.PathLike)).any()
        ]  # pathlib.Path values (attach=), which Arrow cannot hold
        if paths:  # by label, not `assign(**{str(c): ...})`: a column named 5 would gain a twin named "5"
            df = df.copy(deep=False)
            for c in paths:
                df[c] = df[c].map(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v)
        try:
            return pl.from_pandas(df), True
        except (TypeError, ValueError, pl.exceptions.PolarsError) as exc:  # pyarrow's errors are ValueErrors
            raise InvalidInputError(
                f"the pandas frame cannot become a polars frame: {type(exc).__name__}: {exc}. "
                "A column mixing types (paths and bytes, text and numbers) is the usual cause: "
                "make each column one type"
            ) from None
    raise InvalidInputError(
        f"df must be a Parquet path (or glob) or a polars or pandas DataFrame, got {type(df).__name__}"
    )


def storable(frame: pl.DataFrame) -> pl.DataFrame:
    """The columns the ledger can store: no Python objects; all-null columns typed as text."""
    keep = [c for c, t in frame.schema.items() if t != pl.Object]
    out = frame.select(keep)
    nulls = [c for c, t in out.schema.items() if t == pl.Null]
    return out.with_columns(pl.col(nulls).cast(pl.String)) if nulls else out


# Key types that go through every path exactly (claim, commit, journal, history, export, copy; DuckDB and
# PostgreSQL). Others are refused before anything is written rather than half-working.
_KEY_TYPES = (
    pl.Int8,
    pl.Int16,
    pl.Int32,
    pl.Int64,
    pl.UInt8,
    pl.UInt16,
    pl.UInt32,
    pl.UInt64,
    pl.Float32,
    pl.Float64,
    pl.Boolean,
    pl.String,
    pl.Categorical,
    pl.Enum,
    pl.Date,
    pl.Datetime,
    pl.Time,
)


def exact_keys(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """`frame` with key columns of a type the ledger keeps exactly; KeyColumnError for any other.

    `Datetime("ns")` (what `pl.from_pandas` gives) and `Time` (always nanoseconds in polars) are kept in
    microseconds, as PostgreSQL and Python's datetime and time hold them, when no value has digits below the
    microsecond; otherwise two rows could become one key.
    """
    for k in keys:
        dtype = frame.schema[k]
        nanoseconds = isinstance(dtype, pl.Datetime) and dtype.time_unit == "ns"
        if nanoseconds or dtype == pl.Time:
            column = frame[k]
            lossy = column.dt.nanosecond() % 1000 != 0
            if lossy.any():
                found = column.filter(lossy)  # a Time cast to text drops its fraction: spell it out
                example = (found.cast(pl.String) if nanoseconds else found.dt.to_string("%H:%M:%S%.9f"))[0]
                raise KeyColumnError(
                    f"key column {k!r} is {dtype} and holds {example} (digits below the microsecond), which "
                    "the ledger cannot keep exactly (PostgreSQL and Python keep microseconds). Use another key, or "
                    f"make it text: df.with_columns(pl.col({k!r}).cast(pl.String))."
                )
            if nanoseconds:
                frame = frame.with_columns(column.dt.cast_time_unit("us"))
        elif dtype.base_type() not in _KEY_TYPES:
            raise KeyColumnError(
                f"key column {k!r} is {dtype}, which the ledger cannot keep exactly as a key. Keys may be integers, "
                "floats, booleans, text, categoricals, dates, datetimes or times; cast it, e.g. "
                f"df.with_columns(pl.col({k!r}).cast(pl.String)), or key on another column."
            )
    return frame


def check_identifier(name: Any, what: str, error: type[InvalidInputError], example: str) -> None:
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or name.lower().startswith("llmledger"):
        raise error(
            f"{what} name {name!r} is not usable as a SQL identifier: use letters, digits and "
            f"underscores, starting with a letter or underscore, not starting with 'llmledger' "
            f"({example})."
        )


def check_frame_columns(columns: Sequence[str]) -> None:
    """Column names the store keeps apart, on either engine: at most 63 bytes (PostgreSQL cuts longer ones, so
    two could become one), not two that differ only in case (DuckDB does not tell them apart), and none named
    like the ledger's own (llmledger_...), which its SQL uses beside the frame's columns."""
    for c in columns:
        if not c.strip():
            raise InvalidInputError(
                f"the frame has a column named {c!r}, which the store cannot name: rename it, "
                "e.g. df.rename({" + repr(c) + ": 'notes'})"
            )
        if c.lower().startswith("llmledger_"):
            raise InvalidInputError(
                f"the frame's column {c!r} starts with 'llmledger_', which names the ledger's "
                "own tables and columns: rename it, e.g. df.rename(...)"
            )
        if len(c.encode()) > NAME_BYTES:
            raise InvalidInputError(
                f"the frame's column {c[:40] + '...'!r} has a name of {len(c.encode())} bytes; "
                f"the store keeps at most {NAME_BYTES} (PostgreSQL's limit): rename it, e.g. "
                "df.rename(...)"
            )
    seen: dict[str, str] = {}
    for c in columns:
        if c.lower() in seen:
            raise InvalidInputError(
                f"the frame's columns {seen[c.lower()]!r} and {c!r} differ only in case, which "
                "the store does not tell apart; rename or drop one"
            )
        seen[c.lower()] = c


def _strictly_increasing(column: pl.Series) -> bool:
    try:
        return column.is_sorted() and not column.slice(1).eq(column.slice(0, max(len(column) - 1, 0))).any()
    except pl.exceptions.PolarsError:  # a type without an order
        return False


def index_names(df: Any) -> list[str]:
    """The names of a pandas frame's index levels (which `pl.from_pandas` leaves out)."""
    return [str(n) for n in getattr(df.index, "names", []) if n is not None]


def resolve_key(
    frame: pl.DataFrame, key: str | Sequence[str] | None, step: str, *, index: Sequence[str] = ()
) -> list[str]:
    """The key columns; `index`: a pandas frame's index names, which the frame's columns do not include."""

    def in_index(k: str) -> str:
        return (
            (f". {k!r} is the pandas frame's index, which is not a column: pass df.reset_index() (and key={k!r})")
            if k in index
            else ""
        )

    if key is None:
        if "id" not in frame.columns:
            named = [n for n in index if n != "id"]
            hint = (
                f". The pandas frame's index {named[0]!r} is not a column: pass df.reset_index() and key={named[0]!r}"
                if named and "id" not in index
                else in_index("id")
            )
            raise KeyColumnError(
                f"the frame has no 'id' column, so pass key= naming the column(s) that "
                f"identify a row; columns: {frame.columns}{hint}"
            )
        keys = ["id"]
    else:
        if not isinstance(key, str) and not (isinstance(key, list | tuple) and all(isinstance(k, str) for k in key)):
            raise KeyColumnError(f"key= names a column, or a list of columns, e.g. key='review_id'; got {key!r}")
        keys = [key] if isinstance(key, str) else list(key)
    if not keys:
        raise KeyColumnError("key= is empty; name at least one column")
    repeated = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if repeated is not None:
        raise KeyColumnError(f"key={keys} names column {repeated!r} more than once; name each key column once")
    for k in keys:
        if k not in frame.columns:
            raise KeyColumnError(f"key column {k!r} is not in the frame; columns: {frame.columns}{in_index(k)}")
        if k in owned_names(step):
            raise KeyColumnError(f"key column {k!r} clashes with a column of step {step!r}; rename it")
        if k.lower() in KEY_RESERVED:
            raise KeyColumnError(
                f"key column {k!r} has a name the ledger gives its own bookkeeping (the rows it "
                f"claims and commits carry {k!r} beside the key): rename it, e.g. "
                f"df.rename({{{k!r}: {k + '_id'!r}}}) and key={k + '_id'!r}"
            )
    nulls = frame.select(pl.any_horizontal(pl.col(k).is_null() for k in keys).arg_true().head(3)).to_series()
    if len(nulls):
        raise KeyColumnError(
            f"key {keys} is null in row(s) {nulls.to_list()} (0-based); every row needs a key. "
            "Drop those rows or fill the key (e.g. df.with_row_index('id'))."
        )
    if len(keys) == 1 and _strictly_increasing(frame[keys[0]]):
        return keys  # unique, found without a hash table over every key
    if frame.n_unique(subset=keys) == frame.height:
        return keys
    dup = frame.group_by(keys).len().filter(pl.col("len") > 1)
    if dup.height:
        example = dup.row(0, named=True)
        raise KeyColumnError(
            f"key {keys} is not unique: {dup.height:,} value(s) repeat, e.g. "
            f"{ {k: example[k] for k in keys} } occurs {example['len']} times. Deduplicate the "
            "frame or choose a key that identifies a row."
        )
    return keys


def with_answers(plan: Plan, found: pl.DataFrame) -> Any:
    """The input rows in their order, with the step's output and status appended."""
    names = [plan.step, f"{plan.step}_status", f"{plan.step}_stale"]
    if plan.from_pandas:
        out = plan.df.copy()
        for name in names:  # text, or dicts for a structured output
            column = found[name]
            out[name] = (column.cast(pl.String) if column.dtype in (pl.Enum, pl.Categorical) else column).to_list()
        return out
    assert plan.user_frame is not None
    return pl.concat([plan.user_frame.drop(names, strict=False), found], how="horizontal")
