"""Edges of naming and opening a store, found in a user trial: URLs in other spellings, a killed first transaction's
scratch file, names near the file system's limit, an empty file, DuckDB's memory limit, and systems without /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

import llmledger
from llmledger import InvalidInputError, StoreError, apply_llm
from llmledger._ledger.engine import duckdb as engine
from llmledger.cli import main as cli_main

from .conftest import frame, sql


def _everything_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _another_process_opens(store: Path) -> bool:
    probe = f"import duckdb; duckdb.connect({str(store)!r}).close()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


# -- 1. URLs -------------------------------------------------------------------------------------------------------
OTHER_URLS = ["mysql://me:secret@db/ledger", "s3://bucket/ledger.duckdb", "MySQL+pymysql://me:secret@db/x", "a.b-c://x"]


@pytest.mark.parametrize("url", OTHER_URLS)
def test_a_url_of_another_database_is_refused_by_every_entry_point_writing_nothing(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found in a trial: `mysql://...` or `s3://...` became a local DuckDB file under a folder named like the URL
    (credentials in the path), and a run paid into it. A run, the readers, restore and the command line refuse it."""
    source = tmp_path / "source"
    source.mkdir()
    apply_llm(frame(2), "s", prompt="{text}", store=source / "s.duckdb", table="t", client=client, progress=False)
    llmledger.export(source / "s.duckdb", "t", source / "export")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    calls: dict[str, Callable[[], Any]] = {
        "apply_llm": lambda: apply_llm(frame(3), "s", prompt="{text}", store=url, client=client, progress=False),
        "estimate": lambda: llmledger.estimate(frame(3), "s", prompt="{text}", store=url),
        "sql": lambda: llmledger.sql(url, "SELECT 1"),
        "progress": lambda: llmledger.progress(url),
        "restore": lambda: llmledger.restore(source / "export", url),
        "copy": lambda: llmledger.copy(source / "s.duckdb", url),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidInputError, match=r"is a URL llmledger cannot open.*postgresql://") as caught:
            call()
        assert "secret" not in str(caught.value), name
        assert _everything_under(here) == [], f"{name} made {_everything_under(here)}"
    assert cli_main(["status", url]) != 0
    assert "cannot open" in capsys.readouterr().err and _everything_under(here) == []


def test_every_spelling_of_a_postgresql_url_reads_the_same_database(
    pg_url: str, tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schemes are case-insensitive, and SQLAlchemy writes `postgresql+psycopg2://`: the readers take them all."""
    monkeypatch.chdir(tmp_path)
    apply_llm(frame(3), "s", prompt="{text}", store=pg_url, table="m", client=client, progress=False)
    rest = pg_url.split("://", 1)[1]
    for url in [
        f"POSTGRESQL://{rest}",
        f"postgres://{rest}",
        f"postgresql+psycopg2://{rest}",
        f"Postgres+pg8000://{rest}",
    ]:
        assert llmledger.sql(url, "SELECT count(*) AS n FROM m")["n"].to_list() == [3], url
        assert "m" in llmledger.show(url).text(), url
    assert list(tmp_path.iterdir()) == [], "no local file or folder was made"


# -- 2. a killed first transaction's scratch file ------------------------------------------------------------------
_HANG_IN_A_FIRST_TRANSACTION = """
import sys, time
from llmledger._ledger.engine.duckdb import Connection

def work(con):
    con.execute("CREATE TABLE t (x INTEGER)")
    print("inside", flush=True)
    time.sleep(600)

Connection(sys.argv[1]).transaction(work)
"""


def test_the_scratch_file_of_a_killed_first_transaction_goes_with_the_next_run_even_on_an_existing_store(
    tmp_path: Path, client: Any, sim: Any
) -> None:
    """Found in a trial: kill -9 during a new store's first transaction left `.<store>.<...>.new` for good. While
    its process lives the file stays (another process's store is created beside it); once it is dead, the next
    run on the store removes it, although that store now exists."""
    store = tmp_path / "s.duckdb"
    hanging = subprocess.Popen(
        [sys.executable, "-c", _HANG_IN_A_FIRST_TRANSACTION, str(store)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert hanging.stdout is not None and hanging.stdout.readline().strip() == "inside"
        scratch = [p for p in tmp_path.iterdir() if p.name.endswith(".new")]
        assert len(scratch) == 1 and str(hanging.pid) in scratch[0].name, "the file names the process that made it"
        apply_llm(frame(3), "s", prompt="{text}", store=store, table="t", client=client, progress=False)
        assert scratch[0].exists(), "a live process's scratch file is never removed"
    finally:
        hanging.send_signal(signal.SIGKILL)
        hanging.wait()
    apply_llm(frame(4), "s", prompt="{text}", store=store, table="t", client=client, progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "the scratch file and its .wal go"
    assert sql(store, "SELECT count(*) FROM t") == [(4,)] and sim.stats()["paid"] == 4


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="a process's start time is read from /proc")
def test_a_scratch_file_whose_process_id_was_given_to_another_process_is_removed(tmp_path: Path, client: Any) -> None:
    """The scratch name carries the process's start time, as claims do (liveness.py): a dead process's PID that
    the system gave to another process does not keep its file for ever. Another host's file is never touched."""
    store = tmp_path / "s.duckdb"
    prefix = f".s.duckdb.{engine._HOST}"
    reused = tmp_path / f"{prefix}{os.getppid()}-1-0badf00d.new"  # a live process, which started at another time
    other_host = tmp_path / ".s.duckdb.h000000p999999999-1-0badf00d.new"  # another machine (a shared folder)
    for made in (reused, other_host):
        made.write_bytes(b"half a first transaction")
    apply_llm(frame(2), "s", prompt="{text}", store=store, table="t", client=client, progress=False)
    assert not reused.exists() and other_host.exists()


# -- 3. names near the file system's limit -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["s" * 241 + ".duckdb", "s" * 244 + ".duckdb", "é" * 124 + ".db", "s" * 255])
def test_a_store_name_too_long_for_the_files_beside_it_is_refused_naming_the_limit(
    name: str, tmp_path: Path, client: Any, sim: Any
) -> None:
    """Found in a trial: names of 248-251 bytes failed with a bare OSError (the journal folder beside the store is
    `<name>.journal`, DuckDB's log `<name>.wal`); 252-255 with DuckDB's "File name too long"."""
    store = tmp_path / "sub" / name
    limit = os.pathconf(tmp_path, "PC_NAME_MAX") - len(".journal")
    for call in (
        lambda: apply_llm(frame(2), "s", prompt="{text}", store=store, table="t", client=client, progress=False),
        lambda: llmledger.sql(store, "SELECT 1"),
    ):
        with pytest.raises(InvalidInputError, match=rf"is {len(name.encode())} bytes long; at most {limit} fit"):
            call()
    assert list(tmp_path.iterdir()) == [] and sim.stats()["requests"] == 0


def test_the_longest_store_name_allowed_works(tmp_path: Path, client: Any) -> None:
    store = tmp_path / ("s" * (os.pathconf(tmp_path, "PC_NAME_MAX") - len(".journal") - 7) + ".duckdb")
    apply_llm(frame(2), "s", prompt="{text}", store=store, table="t", client=client, progress=False)
    assert llmledger.sql(store, "SELECT count(*) AS n FROM t")["n"].to_list() == [2]


# -- 4. an empty file ----------------------------------------------------------------------------------------------
def test_an_empty_file_is_called_empty_by_readers_and_left_as_it_is(tmp_path: Path) -> None:
    empty = tmp_path / "empty.duckdb"
    empty.touch()
    for call in (lambda: llmledger.sql(empty, "SELECT 1"), lambda: llmledger.progress(empty)):
        with pytest.raises(StoreError, match="is an empty file, not a DuckDB database: delete it"):
            call()
    assert empty.stat().st_size == 0 and [p.name for p in tmp_path.iterdir()] == ["empty.duckdb"]


# -- 5. DuckDB's memory limit --------------------------------------------------------------------------------------
def test_a_read_under_a_lowered_limit_never_goes_above_the_users_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a trial: `memory_limited` set 256 MB for a scan on a connection LLMLEDGER_DUCKDB_MEMORY had set to
    less. The user's limit is the ceiling; a lower limit is still applied below it."""
    from llmledger._ledger.engine.shared import memory_limited

    def limit(con: Any) -> int:
        (text,) = con.execute("SELECT current_setting('memory_limit')").fetchone()
        number, unit = text.split()
        return int(float(number) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit])

    monkeypatch.setattr(engine, "MEMORY_LIMIT", "100MB")

    def work(con: Any) -> list[int]:
        seen = [limit(con)]
        with memory_limited(con, engine.SCAN_MEMORY_LIMIT):
            seen.append(limit(con))
        with memory_limited(con, 50_000_000):
            seen.append(limit(con))
        return [*seen, limit(con)]

    user, scan, lower, after = engine.Connection(tmp_path / "m.duckdb").transaction(work)
    assert user <= 100_000_000 and scan == user and lower <= 50_000_000
    assert user * 0.99 < after <= user, "set back as DuckDB shows it (to 0.1 MiB)"


# -- 6. no /proc ---------------------------------------------------------------------------------------------------
def _no_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """A system without /proc/self/fd or /dev/fd (this process's descriptors cannot be listed there)."""
    listdir = os.listdir

    def no_proc(path: Any = ".") -> list[str]:
        if str(path).startswith(("/proc", "/dev/fd")):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", no_proc)


def test_without_proc_a_users_own_connection_keeps_its_lock(
    store: Path, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a trial: where there is no /proc/self/fd (macOS), checking the store opened and closed a second
    descriptor of it, and closing any descriptor of a file drops the process's POSIX locks on it: the user's own
    `duckdb.connect(store)` lost its lock, and another process could open the file beside it."""
    run(frame(3), "summary", prompt="Summarize: {text}")
    _no_proc(monkeypatch)
    own = duckdb.connect(str(store))
    try:
        llmledger.progress(store)
        assert llmledger.sql(store, "SELECT count(*) AS n FROM messages")["n"].to_list() == [3]
        run(frame(4), "summary", prompt="Summarize: {text}")
        assert not _another_process_opens(store)
        assert own.execute("SELECT count(*) FROM messages").fetchall() == [(4,)]
    finally:
        own.close()
    assert _another_process_opens(store)


def test_without_proc_a_file_that_is_not_a_duckdb_database_is_still_refused(
    store: Path, client: Any, sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping the header check where descriptors cannot be listed leaves DuckDB to refuse the file; it is not
    changed."""
    _no_proc(monkeypatch)
    store.parent.mkdir(parents=True)
    store.write_text("id,text\n1,hello\n" * 100)
    with pytest.raises(StoreError, match=str(store)):
        apply_llm(frame(3), "s", prompt="{text}", store=store, client=client, progress=False)
    assert store.read_text() == "id,text\n1,hello\n" * 100 and sim.stats()["requests"] == 0
