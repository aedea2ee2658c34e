"""Opening a DuckDB ledger file: briefly, politely, one transaction at a time.

DuckDB lets one process at a time open a file read-write, so the ledger is
opened only for one claim, one commit or one query, and a run waits (and says
so) while someone else (the duckdb CLI, another notebook) holds it. Threads of
one process share a lock per file, so a background run and `llmledger.sql`
in the same kernel take turns instead of failing.
"""

from __future__ import annotations

import contextlib
import contextvars
import glob
import hashlib
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import duckdb

from llmledger._ledger.engine.dialect import DUCKDB
from llmledger._ledger.engine.interrupts import CtrlCHeld, interrupts_kept, load_pyarrow
from llmledger._ledger.engine.shared import Patience, unlimited
from llmledger._ledger.liveness import host_name, is_abandoned, process_start
from llmledger.errors import InvalidInputError, StoreBusy, StoreError, StoreNotFound

T = TypeVar("T")
_DUCKDB_MAGIC = b"DUCK"
_locks: dict[Path, threading.Lock] = {}
_locks_guard = threading.Lock()
# The files this process has open now, and the thread that opened each. On POSIX, closing any descriptor of a file
# drops every lock this process holds on it, DuckDB's included: `check_store_path` reads a store only while no
# thread here has it open, so that another process never gets the file beside ours.
_open_in: dict[Path, int] = {}
# The stores a thread of this process is creating now (see `Connection._creating`), and that thread: until its
# first transaction commits, the file is not at its path, and a reader here waits for it rather than find none.
_creating_in: dict[Path, int] = {}
_expected: dict[Path, threading.Event] = {}  # stores a background run of this process is about to create


def expect_creation(path: Path) -> Callable[[], None]:
    """Say that a run of this process (in the background) is about to create the store at `path`: a reader asking
    for it meanwhile waits for it instead of finding no store (found in a trial: a reader right after
    `apply_llm(..., background=True)` on a new store got StoreNotFound 12-17 times in 20). Returns what the run
    calls once the store exists, or the run ended without making it."""
    key, made = path.expanduser().resolve(), threading.Event()
    _expected[key] = made

    def done() -> None:
        made.set()
        if _expected.get(key) is made:
            _expected.pop(key, None)

    return done


def _lock_for(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(path, threading.Lock())


# DuckDB's own limit (80 % of RAM) unless LLMLEDGER_DUCKDB_MEMORY says otherwise (any DuckDB size, e.g. "4GB").
MEMORY_LIMIT = os.environ.get("LLMLEDGER_DUCKDB_MEMORY")
# DuckDB keeps every page it reads cached until the connection closes. A sequential scan needs almost no
# working memory, and a hash join spills what does not fit, so reading a whole fact table for a frame runs
# under these limits and leaves a notebook its memory.
SCAN_MEMORY_LIMIT = 256_000_000  # bytes
JOIN_MEMORY_LIMIT = 512_000_000  # bytes
# DuckDB before 2.0 pushes a hash join's min and max down into the scan of the other side as a filter that leaves
# NaN out: a join with a filter lost the row keyed NaN (1.2.2 to 1.5), or every row of a table holding one (1.2.0,
# 1.2.1), so a run keyed by such a column never saw its claim of that row (found by the tests on the floors).
# Those versions join without that filter; 2.0 joins NaN right.
_JOIN_FILTER_LOSES_NAN = int(duckdb.__version__.split(".")[0]) < 2


# A URL handed on as a `Path` (restore's store=, a `Path("mysql://...")`) lost a slash: its first part is the scheme
# and a colon (on Windows a drive looks so, but `Path.drive` names that).
_SCHEME_PART = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:$")
_BESIDE = ".journal"  # the longest name kept beside a store: llmledger's `<name>.journal` (DuckDB's is `<name>.wal`)


def check_store_path(path: Path, *, must_exist: bool = False) -> None:
    """Refuse a path that cannot be a DuckDB store before DuckDB touches it: a URL that lost a slash on its way into a
    `Path`, a name too long for the files kept beside it, a directory, a file that is not a DuckDB file."""
    parts = path.parts
    if parts and not path.drive and not path.is_absolute() and _SCHEME_PART.match(parts[0]):
        from llmledger._ledger.engine.postgres import not_a_store

        raise not_a_store(f"{parts[0]}//{'/'.join(parts[1:])}")
    _check_name_length(path)
    if path.is_dir():
        raise StoreError(
            f"store {str(path)!r} is a directory; pass a file path such as {str(path / 'ledger.duckdb')!r}."
        )
    key = path.expanduser().resolve()
    if must_exist and not path.exists():
        expected = _expected.get(key)
        if expected is not None:  # a background run here is about to create it
            expected.wait(60.0)
        if _creating_in.get(key) not in (None, threading.get_ident()):
            with _lock_for(key):  # another thread here is creating it: its first transaction is about to commit
                pass
        if not path.exists():
            raise StoreNotFound(f"no store at {str(path)!r}; apply_llm(..., store=...) creates it")
    if path.exists() and path.stat().st_size > 0:
        if _open_in.get(key) == threading.get_ident():
            return  # this thread has it open through DuckDB: a DuckDB file, and not to be opened a second time
        with _lock_for(key):  # while no thread of this process has it open through llmledger (`_open_in`)
            held = _descriptor_here(key)
            if held == _UNSEEN:
                if os.name != "nt":  # whether this process holds it cannot be seen, and looking could drop its lock:
                    return  # DuckDB says what the file is when it opens it (`store_error`)
                held = None  # Windows: closing a handle drops no other handle's lock
            if held is not None:  # e.g. a user's own duckdb.connect: read through it, as closing another would
                try:  # drop that connection's lock
                    head = os.pread(held, 12, 0)
                except OSError:
                    return  # opened for writing only: nothing to read it by, and DuckDB will say what it is
            else:
                with path.open("rb") as fh:
                    head = fh.read(12)
        if head[8:12] != _DUCKDB_MAGIC:
            raise StoreError(
                f"store {str(path)!r} exists but is not a DuckDB database file; "
                "pass a new path (it will be created) or an existing .duckdb ledger."
            )


def _check_name_length(path: Path) -> None:
    """Refuse a store name that the files kept beside it would not fit (found in a trial: names of 248-251 bytes
    failed with a bare OSError when a run made `<name>.journal`, longer ones with DuckDB's words on `<name>.wal`)."""
    size = len(os.fsencode(path.name))
    allowed = _name_max(path.parent)
    if size > allowed - len(_BESIDE):
        raise InvalidInputError(
            f"store file name {path.name!r} is {size} bytes long; at most {allowed - len(_BESIDE)} fit: this file "
            f"system allows {allowed} bytes in a name, and a {_BESIDE} folder is kept beside the store under its "
            "name and that suffix. Pass a shorter store= name. Nothing was written."
        )


def _name_max(folder: Path) -> int:
    """The longest file name, in bytes, that the file system of `folder` (or of its nearest existing parent) allows:
    255 on most; 255 where the system does not say (Windows)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        allowed = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255
    return allowed if allowed > 0 else 1 << 16  # -1: no limit


_UNSEEN = -1  # `_descriptor_here`: this process's descriptors cannot be listed here


def _own_descriptors() -> list[int] | None:
    """This process's open descriptors: Linux's /proc/self/fd, or macOS's /dev/fd (which CPython's subprocess trusts
    to list them all as well); None where they cannot be listed (then whether a file is open here cannot be seen)."""
    for folder in ("/proc/self/fd", "/dev/fd") if sys.platform == "darwin" else ("/proc/self/fd",):
        try:
            return [int(fd) for fd in os.listdir(folder) if fd.isdigit()]
        except OSError:
            continue
    return None


def _descriptor_here(path: Path) -> int | None:
    """A descriptor through which this process already has `path` open, such as a `duckdb.connect` in the user's
    own code; None if none; `_UNSEEN` where this process's descriptors cannot be listed (found in a trial: on macOS,
    which has no /proc, the check opened the store beside a user's connection). Closing a second descriptor of a
    file drops every POSIX lock this process holds on it, that connection's included."""
    descriptors = _own_descriptors()
    if descriptors is None:
        return _UNSEEN
    try:
        wanted = path.stat()
    except OSError:
        return None
    for fd in descriptors:
        with contextlib.suppress(OSError):
            found = os.fstat(fd)
            if (found.st_dev, found.st_ino) == (wanted.st_dev, wanted.st_ino):
                return fd
    return None


def remove_folders(folders: Sequence[Path]) -> None:
    """Remove the `folders` a refused call made for a store (deepest first, each only while empty). The store file
    itself never needs removing: a new store appears only when its first transaction commits (`_creating`)."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty: someone else put something there meanwhile
            folder.rmdir()


def _wal(path: Path) -> Path:
    """The write-ahead log DuckDB keeps beside a database file."""
    return path.with_name(path.name + ".wal")


def make_folders(path: Path) -> list[Path]:
    """Create the missing folders above `path`; return those created, deepest first (for `remove_folders`)."""
    missing = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a folder that cannot be made (/proc/..., no permission, a file in the way)
        raise StoreError(
            f"cannot create the folder {str(path.parent)!r} for store {str(path)!r}: {exc.strerror or exc}; pass a "
            "store in a folder you can write to"
        ) from None
    return missing


# What DuckDB says about a file it cannot read (cut short, overwritten, not a database) or cannot write. Only
# `_CORRUPT` never names the file; the others count only when they name the store (or its .wal), so that a
# user's own query reading some other file keeps its error.
_CORRUPT = ("corrupt database file", "not a valid duckdb database file")
_CUT_SHORT = ("could not read enough bytes",)
_UNWRITABLE = ("permission denied", "operation not permitted", "read-only file system")


def store_error(path: Path, exc: BaseException) -> StoreError | None:
    """The llmledger error for a DuckDB error that means the file itself is damaged or cannot be written
    (None for any other error): DuckDB's own words hide which file and what to do."""
    text = str(exc)
    lower = text.lower()
    about_store = str(path) in text
    with contextlib.suppress(OSError):
        if path.exists() and path.stat().st_size == 0:  # found in a trial: an empty file was called "damaged"
            return StoreError(
                f"store {str(path)!r} is an empty file, not a DuckDB database: delete it (it holds nothing) or pass "
                "another store= path; llmledger creates a new store where no file is."
            )
    if any(word in lower for word in _CORRUPT) or (about_store and any(word in lower for word in _CUT_SHORT)):
        return StoreError(
            f"store {str(path)!r} is damaged (cut short or overwritten): {text}. Restore it from a "
            "backup or from an llmledger.export folder (llmledger.restore), or pass a new store= "
            "path to start a new ledger."
        )
    if about_store and any(word in lower for word in _UNWRITABLE):
        return StoreError(
            f"store {str(path)!r} cannot be written: {text}. DuckDB writes the file and a "
            f"{path.name}.wal beside it, so both the file and its folder {str(path.parent)!r} "
            "must be writable by this user; fix the permissions or copy the store to a writable "
            "folder. Reading it works as it is: llmledger.sql, progress, show, history and "
            "export (and llmledger status) open it read-only."
        )
    return None


def _is_lock_error(exc: Exception) -> bool:
    """Another process holds the file ("Could not set lock on file ..."); a word, not a substring: a damaged
    file's "checksum ... in block at location" (an IOException too on DuckDB 1.2) is no lock to wait for."""
    return re.search(r"\block\b", str(exc).lower()) is not None


def lock_holder(exc: Exception) -> str:
    """Who holds a DuckDB file, from its lock error ("Conflicting lock is held in <program> (PID n)"), and what to do
    about it; DuckDB's own advice (open it read-only) does not help a writer."""
    found = re.search(r"held in (.+?) \(PID (\d+)\)", str(exc))
    if found is None:
        return f"another process holds it ({str(exc).split(':', 1)[-1].strip()})"
    program, pid = found.group(1), found.group(2)
    with contextlib.suppress(OSError):  # Linux: the whole command line says which notebook or script it is
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        program = " ".join(w for w in words if w)[:120] or program
    return (
        f"held by process {pid} ({program}). A DuckDB file has one process at a time, and any connection left "
        "open holds it, even duckdb.connect(..., read_only=True): close that connection (con.close()), or "
        "read with llmledger.sql(...), which holds the file only while it reads"
    )


def _is_other_configuration(exc: Exception) -> bool:
    """DuckDB refuses a read-only connection to a file this process has open read-write (and the reverse)."""
    return "different configuration" in str(exc).lower()


class Connection:
    """One DuckDB file, opened briefly for each transaction."""

    dialect = DUCKDB

    def __init__(
        self,
        path: str | Path,
        *,
        on_wait: Callable[[str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        self.on_wait = on_wait
        self.should_stop = should_stop
        self.made: list[Path] = []  # folders this object created for the file (removed with it on a refusal)
        self._lock = _lock_for(self.path)
        self._swept = False  # whether this call has removed dead processes' scratch files (`_remove_dead_scratch`)

    @contextlib.contextmanager
    def open(self, *, wait: float | None = None, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """Open the file, waiting while another process holds it.

        `wait` bounds the wait in seconds (None: until `should_stop` says so, or forever);
        past it, `StoreBusy` is raised so that callers can keep their data. `read_only` is for readers: a
        store on a read-only medium, or another user's, can be read; another process holding the file
        read-write makes it wait as a writer would.

        A DuckDB error that means the file is damaged or cannot be written becomes a `StoreError` naming it.
        """
        with CtrlCHeld() as held, self._lock, interrupts_kept():  # see CtrlCHeld: no Ctrl-C leaves the lock taken
            con = self._connect(wait, read_only, held)
            try:
                _open_in[self.path] = threading.get_ident()
                held.con = con
                yield con
            except duckdb.Error as exc:
                error = store_error(self.path, exc)
                if error is None:
                    raise
                raise error from exc
            finally:
                held.con = None
                _open_in.pop(self.path, None)
                con.close()

    def _connect(self, wait: float | None, read_only: bool, held: CtrlCHeld) -> duckdb.DuckDBPyConnection:
        load_pyarrow()
        if not read_only and not self.path.parent.exists():
            self.made = make_folders(self.path)
        patience = Patience(wait, self.should_stop, self.on_wait, longest=0.5)
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only)
                try:
                    con.execute("SET enable_progress_bar = false")  # DuckDB's bar went to stdout on a slow export
                    if MEMORY_LIMIT:
                        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
                    if _JOIN_FILTER_LOSES_NAN:
                        con.execute("SET disabled_optimizers = 'join_filter_pushdown'")
                except BaseException:
                    con.close()
                    raise
                return con
            except duckdb.ConnectionException as exc:
                if not _is_other_configuration(exc):
                    raise
                if not read_only:
                    raise StoreError(
                        f"this process has {str(self.path)!r} open read-only (a duckdb.connect(..., read_only=True) "
                        "left open, e.g. in another cell), and DuckDB cannot open it for writing beside that: close "
                        "that connection (con.close()) and call again, or read with llmledger.sql(...), which holds "
                        "the file only while it reads"
                    ) from None
                read_only = False  # this process holds it read-write (its own duckdb.connect): read through that
            except duckdb.Error as exc:
                if not isinstance(exc, duckdb.IOException) or not _is_lock_error(exc):
                    raise store_error(self.path, exc) or StoreError(
                        f"cannot open store {str(self.path)!r}: {exc}"
                    ) from exc
                if held.noted or not patience.again(f"waiting for {self.path.name}: {lock_holder(exc)}"):
                    raise StoreBusy(
                        f"store {str(self.path)!r}: {lock_holder(exc)} (waited {patience.waited:.0f}s)"
                    ) from exc

    def exists(self) -> bool:
        return self.path.exists()

    def check(self, *, must_exist: bool = False) -> None:
        check_store_path(self.path, must_exist=must_exist)

    def remove(self) -> None:
        """Remove the folders a refused call created for the file; no file was created (see `_creating`)."""
        remove_folders(self.made)
        self.made = []

    def transaction(
        self,
        work: Callable[[duckdb.DuckDBPyConnection], T],
        *,
        wait: float | None = None,
        commit: bool = True,
        exclusive: bool = False,
        read_only: bool = False,
        idempotent: bool = False,
    ) -> T:
        """Run `work` in one transaction, retrying on a write conflict (`commit=False`: roll it back).
        `idempotent` is for PostgreSQL (a COMMIT lost in flight is redone without asking whether it landed).

        `exclusive` is for PostgreSQL (one such transaction at a time); a DuckDB file has one writer anyway.
        `read_only`: `work` only reads (the file is opened read-only, see `open`).

        DuckDB reports a conflict on the statement, and a COMMIT after it would
        silently roll back, so the conflict is caught here and the work redone. A read that ran out of room
        under a limit `memory_limited` lowered is redone too, once, with no lowered limit (the context copy keeps
        that to this transaction).
        """
        return contextvars.copy_context().run(self._transaction, work, wait, commit, read_only)

    def _transaction(
        self, work: Callable[[duckdb.DuckDBPyConnection], T], wait: float | None, commit: bool, read_only: bool
    ) -> T:
        if not read_only and not self._swept:  # once in a call: a Connection lives for one call on the store
            self._swept = True
            _remove_dead_scratch(self.path)
        if not read_only and not self.path.exists():
            return self._creating(work, wait, commit)
        return self._attempts(work, wait, commit, read_only)

    def _creating(self, work: Callable[[duckdb.DuckDBPyConnection], T], wait: float | None, commit: bool) -> T:
        """The first transaction of a store that does not exist yet, run in a scratch file beside it.

        The file appears at the store's path only when the transaction commits, by a hard link, which fails
        if the name was taken meanwhile. So a rehearsal (`estimate`) or a refused call leaves no file behind
        without deleting one: deleting what it had created could delete a store that another process created
        under that name and paid answers into in the meantime. A transaction that finds the name taken when
        it commits is done again in that store, as on any existing one. Threads of this process wait for it as
        for an open file: a cell reading the store of a run just started in the background finds it.
        """
        # the store's name cut short: a name near the file system's 255 bytes must still leave room for the rest;
        # the process's host, id and start time in it, so a later run can tell a dead process's scratch file
        # (`_remove_dead_scratch`) as it tells a dead claimant (`liveness`)
        started = process_start(os.getpid())
        maker = f"{_HOST}{os.getpid()}-{started + '-' if started else ''}{uuid.uuid4().hex[:8]}"
        scratch = Connection(
            self.path.with_name(f".{self.path.name[:40]}.{maker}.new"),
            on_wait=self.on_wait,
            should_stop=self.should_stop,
        )
        with self._lock:  # threads of this process take turns on the store, as on an existing file (`open`)
            if not self.path.exists():  # (else another thread created it while this one waited)
                _creating_in[self.path] = threading.get_ident()
                try:
                    result = scratch._attempts(work, wait, commit, read_only=False)
                    if not commit or self._place(scratch):
                        return result
                except StoreError as exc:  # say which store, not which scratch file
                    named = str(exc).replace(str(scratch.path), str(self.path))
                    raise type(exc)(named.replace(scratch.path.name, self.path.name)) from exc.__cause__
                finally:
                    _creating_in.pop(self.path, None)
                    self.made = scratch.made  # folders made for the file: a refused call removes them (`remove`)
                    for leftover in (scratch.path, _wal(scratch.path)):
                        with contextlib.suppress(OSError):  # never in place of the error that ended the work
                            leftover.unlink(missing_ok=True)
        return self._attempts(work, wait, commit, read_only=False)  # created meanwhile: the work goes into that one

    def _place(self, scratch: Connection) -> bool:
        """Give the committed scratch file the store's name, unless the name was taken meanwhile (False)."""
        if _wal(scratch.path).exists():  # DuckDB folds the WAL in when it closes a file; if it did not, make it
            with scratch.open() as con:
                con.execute("CHECKPOINT")
        try:
            os.link(scratch.path, self.path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: a rename, which checks the name just before
            if self.path.exists():
                return False
            os.replace(scratch.path, self.path)
        return True

    def _attempts(
        self, work: Callable[[duckdb.DuckDBPyConnection], T], wait: float | None, commit: bool, read_only: bool
    ) -> T:
        for attempt in range(20):
            with self.open(wait=wait, read_only=read_only) as con:
                con.execute("BEGIN TRANSACTION")
                try:
                    result = work(con)
                    con.execute("COMMIT" if commit else "ROLLBACK")
                    return result
                except duckdb.TransactionException as exc:
                    with contextlib.suppress(duckdb.Error):  # a failed COMMIT ended it: keep its reason
                        con.execute("ROLLBACK")
                    if "conflict" not in str(exc).lower():
                        raise
                    time.sleep(0.01 * (attempt + 1))
                except duckdb.OutOfMemoryException:
                    with contextlib.suppress(duckdb.Error):
                        con.execute("ROLLBACK")
                    if unlimited.get():
                        raise
                    unlimited.set(True)  # the work again, its reads under DuckDB's own limit (see memory_limited)
                except BaseException:
                    with contextlib.suppress(duckdb.Error):
                        con.execute("ROLLBACK")
                    raise
        raise StoreError(f"store {str(self.path)!r}: gave up after 20 write conflicts")


# This machine in a scratch file's name: its name as claims give it (`liveness.host_name`), hashed short.
_HOST = "h" + hashlib.sha256(host_name().encode()).hexdigest()[:6] + "p"


def _remove_dead_scratch(path: Path) -> None:
    """Remove the scratch files of first transactions on `path` whose process died (kill -9 before it committed):
    found in a trial, left beside the store for good. A scratch file is named `.<store>.h<host>p<pid>-<start>-<hex>.new`
    and judged as a claim is (`liveness`): a file of this host whose process is gone, or whose PID now belongs to a
    process started at another time, goes; a live process's file (this one's included), another machine's on a
    shared folder, or one from before llmledger named them so, is never touched."""
    cut = path.name[:40]
    for leftover in path.parent.glob(f".{glob.escape(cut)}.{_HOST}*-*.new"):
        pid, _, rest = leftover.name[len(cut) + 2 + len(_HOST) : -len(".new")].partition("-")
        started = rest.rpartition("-")[0]  # "<start>-<hex>", or "<hex>" where there is no /proc
        if not pid.isdigit() or int(pid) == os.getpid():
            continue  # this process's own: another of its threads is creating the store now
        if is_abandoned(f"{host_name()}/{pid}/scratch" + (f"-{started}" if started.isdigit() else "")):
            for gone in (leftover, _wal(leftover)):
                with contextlib.suppress(OSError):
                    gone.unlink(missing_ok=True)
