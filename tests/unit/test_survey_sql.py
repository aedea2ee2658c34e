"""The survey writes a call's parameters into its query as literals (DuckDB folds those, and evaluates a parameter
on every row): whatever the values and whatever quoted text the query holds, the query reads the same."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
from hypothesis import given
from hypothesis import strategies as st

from llmledger._ledger.survey import _inlined

_TEXT = st.lists(st.sampled_from([*"ab$'\" _\\\n", "é", "$redo", "$when", "''"]), max_size=8).map("".join)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "redo": _TEXT,
    "n": st.integers(-(2**63), 2**63 - 1),
    "when": st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    "zoned": st.datetimes(timezones=st.just(dt.UTC)),  # kept a parameter: no literal reads back the same
    "flag": st.booleans(),  # kept a parameter too
}


_CON = duckdb.connect()  # one for every example: a connection takes longer than the query


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


PIECES = st.one_of(st.sampled_from([f"${name}" for name in VALUES]), _TEXT.map(_quoted))


@given(params=st.fixed_dictionaries(VALUES), pieces=st.lists(PIECES, min_size=1, max_size=8))
def test_inlined_parameters_read_as_the_parameters_did(params: dict[str, Any], pieces: list[str]) -> None:
    query = "SELECT " + ", ".join(f"{piece} AS c{i}" for i, piece in enumerate(pieces))
    used = {piece[1:]: params[piece[1:]] for piece in pieces if piece[0] == "$"}  # the ones outside quotes
    inlined, left = _inlined(query, params)
    assert set(left) <= {"zoned", "flag"} and all(f"${name}" in inlined for name in left)
    assert _CON.execute(inlined, left).fetchall() == _CON.execute(query, used).fetchall()


def test_quoted_text_and_longer_names_are_left_as_they_are() -> None:
    query = "SELECT '$redo' || \"$redo\" || $redo || $redone || 'it''s $redo'"
    inlined, left = _inlined(query, {"redo": "x'y"})
    assert inlined == "SELECT '$redo' || \"$redo\" || 'x''y' || $redone || 'it''s $redo'" and left == {}
