"""Large frames on PostgreSQL: their rows written into an empty table before its indexes are built, and the survey
of every rerun read as the server's CSV.

A result read as CSV (`PgCon.frame`) must be the result `PgCon.sql` fetches row by row: CSV must keep apart what the
ledger keeps apart: NULL and '', NaN and infinities, -0.0, text with quotes, commas, newlines and a "%", and JSON.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import anthropic
import hypothesis.strategies as st
import polars as pl
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

import llmledger
from llmledger import Simulator
from llmledger._ledger.engine.pgcon import PgCon
from llmledger._ledger.prepare import BULK_ROWS

from .conftest import frame

pytestmark = pytest.mark.slow

_TEXT = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(['"', '""', ",", "\n", "\r\n", "a,b", 'say "hi"', "%s", "%(x)s", "\\N", " ", "t", "NULL"]),
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12),
)
_FLOAT = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.just(-0.0))
_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    _FLOAT,
    st.one_of(st.none(), st.booleans()),
    _TEXT,
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b"]), st.one_of(st.integers(0, 9), _TEXT), max_size=2)),
)


def _same(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    if a.schema != b.schema or a.height != b.height:
        return False
    for left, right in zip(a.iter_rows(), b.iter_rows(), strict=True):
        for x, y in zip(left, right, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if not ((x == y and math.copysign(1, x) == math.copysign(1, y)) or (math.isnan(x) and math.isnan(y))):
                    return False
            elif x != y:
                return False
    return True


@pytest.fixture(scope="module")
def raw(pg_server: Any) -> Any:
    with psycopg.connect(pg_server.new_database()) as con:
        for name in ("uuid", "json", "jsonb"):  # as the store's connections read them (`PgConnection._connection`)
            con.adapters.register_loader(name, psycopg.types.string.TextLoader)
        yield con


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROW, max_size=12))
def test_a_result_read_as_csv_is_the_result_fetched_row_by_row(raw: Any, rows: list[tuple[Any, ...]]) -> None:
    raw.execute("DROP TABLE IF EXISTS r")
    raw.execute("CREATE TEMP TABLE r (n BIGINT, x DOUBLE PRECISION, b BOOLEAN, s VARCHAR, j JSONB)")
    with raw.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO r VALUES (%s, %s, %s, %s, %s)",
            [(*row[:4], None if row[4] is None else psycopg.types.json.Jsonb(row[4])) for row in rows],
        )
    con = PgCon(raw)
    query = "SELECT n, x, b, s, j, s = $like AS same, 'a%b' AS lit FROM r ORDER BY n NULLS FIRST, s, x"
    params = {"like": "%s"}
    fetched = con.sql(query, params)
    assert fetched is not None
    expected = fetched.pl()
    found = con.frame(query, params)
    assert _same(found, expected), (found, expected)


def test_a_result_of_another_type_is_fetched_as_before(raw: Any) -> None:
    con = PgCon(raw)
    found = con.frame("SELECT DATE '2026-11-30' AS d, NULL::TIMESTAMP AS t, 1 AS n WHERE $yes", {"yes": True})
    assert found.schema == pl.Schema({"d": pl.Date, "t": pl.Datetime("us"), "n": pl.Int32})
    assert found.rows() == [(datetime.date(2026, 11, 30), None, 1)]
    assert con.frame("SELECT 1 AS n WHERE false").schema == pl.Schema({"n": pl.Int32})


def _indexes(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as con:
        return con.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 't' ORDER BY 1").fetchall()


def test_an_empty_table_takes_many_rows_then_has_every_index_it_had(pg_url: str, sim: Simulator) -> None:
    """A first call of BULK_ROWS rows writes them without the indexes and builds them after; a table a person
    emptied gets back its indexes, theirs included, and one with a comment is left in place; a table with rows
    keeps its indexes throughout."""
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
    ask: dict[str, Any] = dict(prompt="A: {text}", store=pg_url, table="t", client=client, progress=False)
    small = frame(3)
    llmledger.apply_llm(small, "s", **ask)  # a table built the usual way: its indexes, one row at a time
    assert {name for name, _ in _indexes(pg_url)} == {"t__key", "t__s_status", "t__s_request_fingerprint"}
    with psycopg.connect(pg_url, autocommit=True) as con:
        con.execute("DELETE FROM t")
        con.execute("CREATE INDEX mine ON t (lower(text)) WHERE id > 0")
        con.execute("COMMENT ON INDEX t__s_status IS 'kept'")  # left in place: its definition has no comment
    before = _indexes(pg_url)
    assert len(before) == 4
    many = frame(BULK_ROWS, start=10)
    out = llmledger.apply_llm(many, "s", where="id < 20", **ask)
    assert out["s_status"].to_list()[:10] == ["DONE"] * 10 and sim.stats()["paid"] == 3 + 10
    assert _indexes(pg_url) == before
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT obj_description('t__s_status'::regclass, 'pg_class')").fetchone() == ("kept",)
    llmledger.apply_llm(frame(BULK_ROWS, start=10 + BULK_ROWS), "s", where="false", **ask)  # rows there: kept
    assert len(_indexes(pg_url)) == 4
    with psycopg.connect(pg_url) as con:
        assert con.execute("SELECT count(*), count(DISTINCT id) FROM t").fetchone() == (2 * BULK_ROWS, 2 * BULK_ROWS)
        plan = con.execute("EXPLAIN SELECT * FROM t WHERE id = 12").fetchall()
    assert "t__key" in " ".join(row[0] for row in plan), plan


def test_a_key_column_named_with_a_percent_sign_is_read_back(pg_url: str, sim: Simulator) -> None:
    """psycopg reads "%%" as "%" in a query given parameters; the survey's CSV read once sent "id%%" to the server
    (found by an attack: rows paid, then every call failed)."""
    client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")
    df = frame(3).rename({"id": "id%"})
    ask: dict[str, Any] = dict(key="id%", prompt="A: {text}", store=pg_url, table="t", client=client, progress=False)
    assert llmledger.apply_llm(df, "s", where='"id%" % 2 = 0', **ask)["s_status"].to_list() == [
        "DONE",
        "NOT_STARTED",
        "DONE",
    ]
    assert llmledger.apply_llm(df, "s", **ask)["s_status"].to_list() == ["DONE"] * 3
    assert sim.stats()["paid"] == 3
