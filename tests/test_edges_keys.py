"""Keys of every polars type either work exactly or are refused before anything is written, and a damaged journal
is reported and set aside, never merged half-way. Each case failed on 0.6.0."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import KeyColumnError, Simulator, apply_llm
from llmledger._ledger.columns import STEP_COLUMNS
from llmledger._ledger.journal import DamagedJournalWarning, journal_folder
from llmledger.simulator import default_reply

from .conftest import frame

WORKING: dict[str, pl.Series] = {
    "int8": pl.Series([-1, 2, 3], dtype=pl.Int8),
    "uint64": pl.Series([1, 2, 2**62], dtype=pl.UInt64),
    "float32": pl.Series([0.5, 1e-7, -2.0], dtype=pl.Float32),
    "boolean": pl.Series([True, False, None]).drop_nulls(),
    "string_near_duplicates": pl.Series(["a", "A", "a "]),
    "categorical": pl.Series(["x", "y", "z"], dtype=pl.Categorical),
    "enum": pl.Series(["x", "y", "z"], dtype=pl.Enum(["x", "y", "z"])),
    "date": pl.Series([dt.date(2020, 1, 1), dt.date(1900, 1, 2), dt.date(2999, 12, 31)]),
    "datetime_us_1us_apart": pl.Series(
        [dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 0, 1), dt.datetime(2020, 1, 1, 0, 0, 0, 2)]
    ),
    "datetime_ms": pl.Series([dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 1)]).cast(pl.Datetime("ms")),
    # what pl.from_pandas gives: nanoseconds, here whole microseconds 1 µs apart
    "datetime_ns_whole_us": pl.Series([0, 1_000, 2_000], dtype=pl.Int64).cast(pl.Datetime("ns")),
    "datetime_tz": pl.Series(
        [dt.datetime(2020, 3, 29, 0, 30), dt.datetime(2020, 3, 29, 1, 30), dt.datetime(2020, 3, 29, 3, 30)]
    )
    .dt.replace_time_zone("UTC")
    .dt.convert_time_zone("Europe/Paris"),
    "time": pl.Series([dt.time(1), dt.time(2), dt.time(23, 59, 59, 999_999)]),
    "time_ns_whole_us": pl.Series([0, 1_000, 2_000], dtype=pl.Int64).cast(pl.Time),
}

REFUSED: dict[str, pl.Series] = {
    "datetime_ns_below_us": pl.Series([0, 1, 2], dtype=pl.Int64).cast(pl.Datetime("ns")),
    # a polars Time is nanoseconds (Parquet's time64[ns]): 1 ns apart, they would become one key
    "time_below_us": pl.Series([0, 1, 2], dtype=pl.Int64).cast(pl.Time),
    **({"int128": pl.Series([1, 2, 3], dtype=pl.Int128)} if hasattr(pl, "Int128") else {}),
    "duration": pl.Series([dt.timedelta(1), dt.timedelta(2), dt.timedelta(3)]),
    "decimal": pl.Series([decimal.Decimal("1.5"), decimal.Decimal("2.5"), decimal.Decimal("3.5")]),
    "binary": pl.Series([b"a", b"b", b"c"]),
    "struct": pl.Series([{"a": 1}, {"a": 2}, {"a": 3}]),
    "list": pl.Series([[1], [2], [3]]),
}


def _frame(name: str, keys: pl.Series) -> pl.DataFrame:
    return pl.DataFrame({"k": keys, "text": [f"{name} row {i}" for i in range(len(keys))]})


@pytest.mark.parametrize("name", list(WORKING))
def test_every_key_type_the_ledger_accepts_round_trips_exactly(
    name: str, target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    df = _frame(name, WORKING[name])
    common = {"key": "k", "store": target, "table": "t", "client": client, "progress": False}
    out = apply_llm(df, "s", prompt="Q: {text}", **common)
    assert out["s_status"].to_list() == ["DONE"] * df.height
    assert out["s"].to_list() == [default_reply(f"Q: {t}") for t in df["text"]], "each row got its own answer"
    assert out["k"].equals(df["k"]), "the frame comes back with the user's keys"
    again = apply_llm(df, "s", prompt="Q: {text}", **common)
    assert again.equals(out) and sim.stats()["paid"] == df.height, "a rerun finds every row again, pays nothing"
    # the flag / redo path matches rows by key too
    assert llmledger.flag(target, "t", "s", where="text LIKE '% row 1'", reason="x") == 1
    apply_llm(df, "s", prompt="Q: {text}", redo="flagged", **common)
    assert sim.stats()["paid"] == df.height + 1
    assert sim.paid_prompts()[f"Q: {name} row 1"] == 2 and max(sim.paid_prompts().values()) == 2


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_key_type_the_ledger_cannot_keep_exactly_is_refused_before_anything_is_written(
    name: str, store: Path, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    with pytest.raises(KeyColumnError, match=r"key column 'k' is .*(cast|another key)"):
        apply_llm(
            _frame(name, REFUSED[name]),
            "s",
            prompt="Q: {text}",
            key="k",
            store=store,
            table="t",
            client=client,
            progress=False,
        )
    assert not store.exists() and not store.parent.exists() and sim.stats()["requests"] == 0


def test_a_refused_key_type_writes_nothing_to_postgresql(pg_url: str, client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(KeyColumnError, match="below the microsecond"):
        apply_llm(
            _frame("ns", REFUSED["datetime_ns_below_us"]),
            "s",
            prompt="Q: {text}",
            key="k",
            store=pg_url,
            table="t",
            client=client,
            progress=False,
        )
    tables = llmledger._ledger.open_ledger(pg_url).steps()
    assert tables == []


def test_a_key_the_tables_integer_column_cannot_hold_is_refused_writing_nothing(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    """An Int8 table later given an Int64 frame: a key beyond the column's range cannot be a row of it."""
    common = {"key": "k", "store": target, "table": "t", "client": client, "progress": False}
    apply_llm(_frame("small", pl.Series([1, 2], dtype=pl.Int8)), "s", prompt="Q: {text}", **common)
    before = llmledger.sql(target, "SELECT count(*) AS n FROM t")
    wide = _frame("wide", pl.Series([1, 2, 2**40], dtype=pl.Int64))
    with pytest.raises(KeyColumnError, match=r"key column 'k' is .* cannot hold the frame's key 1099511627776"):
        apply_llm(wide, "s2", prompt="Z: {text}", **common)
    assert llmledger.sql(target, "SELECT count(*) AS n FROM t").equals(before)
    assert llmledger.progress(target)["step"].to_list() == ["s"] and sim.stats()["paid"] == 2


def test_a_table_keyed_by_one_column_refuses_another_key_writing_nothing(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    """A table's rows are its key's: a later call keying them by another column (unique in its frame, not in the
    table) would match a paid answer to another row's inputs. Found by attack on 0.10: it overwrote DONE answers,
    rewrote ids, or raised a raw polars error."""
    common = {"store": target, "table": "t", "client": client, "progress": False}
    df = pl.DataFrame({"id": [1, 2, 3], "group": ["a", "a", "b"], "text": ["one", "two", "three"]})
    first = apply_llm(df, "s", prompt="Q: {text}", **common)
    before = llmledger.sql(target, "SELECT * FROM t ORDER BY id")
    other = pl.DataFrame({"group": ["a", "b"], "id": [7, 8], "text": ["changed", "changed too"]})
    for step in ("s", "s2"):
        with pytest.raises(KeyColumnError, match=r"table 't' is keyed by \['id'\].* key=\['group'\]"):
            apply_llm(other, step, prompt="Q: {text}", key="group", **common)
    assert llmledger.sql(target, "SELECT * FROM t ORDER BY id").equals(before)
    assert llmledger.progress(target)["step"].to_list() == ["s"] and sim.stats()["paid"] == 3
    again = apply_llm(df, "s", prompt="Q: {text}", key=["id"], **common)
    assert again["s"].to_list() == first["s"].to_list() and sim.stats()["paid"] == 3


def test_composite_keys_of_mixed_types_find_their_rows(
    target: Any, client: anthropic.AsyncAnthropic, sim: Simulator
) -> None:
    df = pl.DataFrame(
        {
            "day": [dt.date(2020, 1, 1)] * 2 + [dt.date(2020, 1, 2)] * 2,
            "who": ["a", "b", "a", "b"],
            "text": [f"composite {i}" for i in range(4)],
        }
    )
    common = {"key": ["day", "who"], "store": target, "table": "t", "client": client, "progress": False}
    out = apply_llm(df.reverse(), "s", prompt="Q: {text}", **common)
    assert out["s"].to_list() == [default_reply(f"Q: {t}") for t in df.reverse()["text"]]
    apply_llm(df, "s", prompt="Q: {text}", **common)
    assert sim.stats()["paid"] == 4


# -- the journal -----------------------------------------------------------------------------------------------------
def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_damaged_journal_is_reported_set_aside_and_only_its_whole_answers_merged(
    run: Any, store: Path, sim: Simulator
) -> None:
    """A dead run's journal with a garbage line, a line holding only a key and a torn last line: the whole answers
    are merged (not paid again), the others are asked again, no row's status becomes NULL, and a copy of the file
    is kept beside it, named in a warning."""
    run(frame(6), "summary", prompt="Summarize: {text}")
    fields = {c.result: "summary" + c.suffix for c in STEP_COLUMNS if c.result}
    done = llmledger.sql(
        store, f"SELECT id, {', '.join(f'{col} AS {res}' for res, col in fields.items())} FROM messages ORDER BY id"
    )
    llmledger.reset(store, "messages", "summary", where="true")  # the answers go to the history (not reusable)
    lines = [json.dumps(row, default=str) for row in done.head(4).to_dicts()]
    lines.insert(2, "{this is not json")
    lines.insert(3, json.dumps({"id": 4}))  # a key alone: no status
    lines.insert(4, json.dumps({**done.row(5, named=True), "attempts": "many"}, default=str))  # a wrong type
    text = "\n".join(lines) + "\n" + json.dumps(done.row(5, named=True), default=str)[:30]  # torn: no newline
    folder = journal_folder(store)
    folder.mkdir(exist_ok=True)
    path = folder / f"messages.summary.1.{socket.gethostname()}~{_dead_pid()}~deadrun.jsonl"
    path.write_text(text, encoding="utf-8")
    paid = sim.stats()["paid"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(frame(6), "summary", prompt="Summarize: {text}")
    damaged = [w for w in caught if issubclass(w.category, DamagedJournalWarning)]
    assert len(damaged) == 1 and str(path) in str(damaged[0].message)
    assert "line 3, 4, 5" in str(damaged[0].message), damaged[0].message
    assert out["summary_status"].to_list() == ["DONE"] * 6
    assert out["summary"].to_list() == [default_reply(f"Summarize: {t}") for t in frame(6)["text"]]
    assert sim.stats()["paid"] - paid == 2, "the 4 whole answers were merged; rows 4 and 5 were asked again"
    assert not path.exists() and path.with_name(path.name + ".bad").read_text(encoding="utf-8") == text
    # a later run does not trip over the copy
    run(frame(6), "summary", prompt="Summarize: {text}")
    assert sim.stats()["paid"] - paid == 2
