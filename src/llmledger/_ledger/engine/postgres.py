"""Opening a PostgreSQL ledger: one database, through one connection kept open and opened again when lost.

The ledger's SQL (`verbs.py`, `survey.py`, `prepare.py`, ...) is written once; `pgcon.PgCon` gives the psycopg
connection DuckDB's shape, and where the two engines truly differ (JSON, indexes, the claim's
`FOR UPDATE SKIP LOCKED`) the SQL asks the connection's `Dialect` (`dialect.py`).

Many processes share one PostgreSQL ledger. Claims and commits touch rows
only, so they run side by side; preparing a step, migrating and the verbs
people call (flag, reset) take one advisory lock, so they happen one at a
time, as on a DuckDB file. A connection lost mid-transaction (a network cut,
a server restart) is opened again and the transaction redone, waiting as a
busy DuckDB file waits; one lost as its COMMIT was sent is redone only if the
server says it did not commit.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from llmledger._ledger.engine.dialect import POSTGRES
from llmledger._ledger.engine.pgcon import PgCon, _psycopg
from llmledger._ledger.engine.shared import Patience
from llmledger.errors import CommitUnknown, InvalidInputError, StoreBusy, StoreError, StoreNotFound

T = TypeVar("T")
URL_SCHEMES = ("postgresql://", "postgres://")
_LOCK_ID = 0x6C6C6D6C  # "llml": the advisory lock of prepare, migrations, flag and reset


# Every spelling of a PostgreSQL URL's scheme: any case (schemes are case-insensitive), and SQLAlchemy's driver
# suffixes (`postgresql+psycopg://`, `postgres+psycopg2://`). A trial found `POSTGRESQL://...` and
# `postgresql+psycopg://...` taken for DuckDB file names: a local file under a folder named like the URL.
_PG_SCHEME = re.compile(r"^(?:postgresql|postgres)(?:\+[a-z0-9_]+)?://", re.IGNORECASE)


def is_url(store: object) -> bool:
    return isinstance(store, str) and _PG_SCHEME.match(store) is not None


def pg_url(url: str) -> str:
    """A PostgreSQL URL as psycopg takes it: `postgresql://` and the rest as given. A port that is no number
    (`db:abc`) is refused here: no server answers there, and a store that cannot be reached is otherwise waited for
    (60 s, as a restarting server is) before the error says so."""
    url = _PG_SCHEME.sub("postgresql://", url, count=1)
    hosts = url.partition("://")[2].partition("/")[0].partition("?")[0].rpartition("@")[2]
    for host in hosts.split(","):  # psycopg takes several hosts: h1:5432,h2:5433
        port = host.rpartition("]")[2].partition(":")[2] if host.startswith("[") else host.partition(":")[2]
        if port and not port.isdigit():
            raise InvalidInputError(
                f"store {redacted(url)!r} names port {port!r}, which is not a number: pass the server's port, "
                "e.g. postgresql://user@host:5432/db. Nothing was written."
            )
    return url


def not_a_store(url: str) -> InvalidInputError:
    """The error for a URL of anything but PostgreSQL given as a store: found in a trial, `mysql://...` and
    `s3://...` became a local DuckDB file under a folder named like the URL (its password in the path)."""
    return InvalidInputError(
        f"store {redacted(url)!r} is a URL llmledger cannot open: a store is a DuckDB file path or a PostgreSQL "
        "URL (postgresql://user@host:5432/db; postgres:// and postgresql+psycopg:// too). Nothing was written."
    )


def redacted(url: str) -> str:
    """The URL without its password, for messages and journal folders (a URL that cannot be read: its scheme)."""
    try:
        return _redacted(url)
    except ValueError:  # a port that is no number, a / in a password: show nothing of what follows the scheme
        return url.partition("://")[0] + "://…"


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def journal_base(url: str) -> Path:
    """Where runs on this machine journal answers for this database before they commit (see journal.py)."""
    digest = hashlib.md5(redacted(url).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "llmledger" / f"postgresql-{digest}" / "ledger"


# "not yet accepting connections": crash recovery (PostgreSQL 14+), as after a crash or `pg_ctl stop -m immediate`
_TRANSIENT = (
    "starting up",
    "shutting down",
    "in recovery",
    "not yet accepting connections",
    "not accepting connections",
    "connection slots",
    "too many connections",
)


def _refused_for_good(message: str) -> str | None:
    """The server's reason when it answered but refused the connection for good (no such database or role,
    a wrong password); None when it may yet accept one (down, restarting, full)."""
    fatal = message.split("FATAL:", 1)
    if len(fatal) < 2 or any(word in fatal[1] for word in _TRANSIENT):
        return None
    return fatal[1].strip().splitlines()[0]


class PgConnection:
    """One PostgreSQL database (a URL), through one connection kept open and opened again when lost."""

    dialect = POSTGRES

    def __init__(
        self, url: str, *, on_wait: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None
    ) -> None:
        self.url = url = pg_url(url)
        self.name = redacted(url)
        self.path = journal_base(url)
        self.on_wait = on_wait
        self.should_stop = should_stop
        self._lock = threading.RLock()
        self._raw: Any = None

    def _connection(self, wait: float | None) -> Any:
        """The open connection, or a new one, waiting while the server cannot be reached."""
        psycopg = _psycopg()
        if self._raw is not None and not self._raw.closed:
            return self._raw
        patience = Patience(wait, self.should_stop, self.on_wait, longest=1.0)
        raw: Any = None
        while raw is None:
            try:
                raw = psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=10,
                    keepalives=1,
                    keepalives_idle=30,
                    keepalives_interval=10,
                    keepalives_count=3,
                )
            except psycopg.OperationalError as exc:
                refused = _refused_for_good(str(exc))
                if refused:
                    raise (StoreNotFound if "does not exist" in refused else StoreError)(
                        f"cannot open the PostgreSQL store {self.name}: {refused}"
                        + (" (create it first: createdb NAME)" if "database" in refused else "")
                    ) from None
                reason = str(exc).strip().splitlines()[-1]
                if not patience.again(f"waiting for PostgreSQL at {self.name}: {reason}"):
                    raise StoreBusy(
                        f"cannot reach the PostgreSQL store {self.name} (waited {patience.waited:.0f}s): {reason}"
                    ) from exc
        text = psycopg.types.string.TextLoader
        for name in ("uuid", "json", "jsonb"):  # as text, like the DuckDB side returns them
            raw.adapters.register_loader(name, text)
        raw.adapters.register_loader("numeric", psycopg.types.numeric.FloatLoader)
        self._raw = raw
        return raw

    def _landed(self, xid: int, server_started: Any, wait: float | None, start: float) -> bool:
        """Whether transaction `xid`, whose COMMIT was sent as the connection was lost, committed: asked of the
        server once it is reached again (`txid_status`; a backend still finishing its COMMIT says "in progress" a
        moment longer). Only the same server, not restarted since (`server_started`), can say: a crash forgets the
        transactions it had not made durable, and may give their ids to others, whose status it would then report
        (found by an attack: a `flag` reported done that was not). After a restart it is `CommitUnknown`."""
        psycopg = _psycopg()
        status: str | None = "unasked"
        for _ in range(600):
            try:
                raw = self._connection(None if wait is None else max(0.0, wait - (time.monotonic() - start)))
                if raw.execute("SELECT pg_postmaster_start_time()").fetchone()[0] != server_started:
                    status = "the server restarted since"
                    break
                (found,) = raw.execute("SELECT txid_status(%s)", [xid]).fetchone()
                status = None if found is None else str(found)
            except psycopg.OperationalError:
                self._drop()
                status = "unreachable"
            if status in ("committed", "aborted"):
                return status == "committed"
            if status is None or (wait is not None and time.monotonic() - start > wait):
                break
            time.sleep(0.1)
        raise CommitUnknown(
            f"lost the PostgreSQL store {self.name} while committing, and whether that transaction landed cannot be "
            f"known (txid {xid}: {status}). A run keeps its answers in this machine's journal, and the next "
            "transaction or run writes them again where they did not land; call a verb again once you have checked "
            "what the store holds."
        )

    def _drop(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        self._raw = None

    def __del__(self) -> None:
        """Close the connection with the store object that held it (each verb call opens its own), rather than
        leave it to psycopg's finaliser, which warns (a ResourceWarning per call, seen under `-W error`)."""
        if getattr(self, "_raw", None) is not None:
            self._drop()

    def exists(self) -> bool:
        """Whether the database holds a ledger (llmledger's bookkeeping tables)."""
        with self.open(wait=30.0) as con:
            return bool(
                con.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                    "current_schema() AND table_name = 'llmledger_steps'"
                ).fetchall()[0][0]
            )

    def remove(self) -> None:
        """Nothing to delete: the refused call's transaction was rolled back, so the database is as it was."""

    def check(self, *, must_exist: bool = False) -> None:
        if must_exist and not self.exists():
            raise StoreNotFound(f"no ledger in the PostgreSQL store {self.name}; apply_llm(..., store=...) creates one")

    @contextlib.contextmanager
    def open(self, *, wait: float | None = None, read_only: bool = False) -> Iterator[PgCon]:
        """The connection for statements outside a transaction (each one commits on its own)."""
        psycopg = _psycopg()
        with self._lock:
            raw = self._connection(wait)
            try:
                yield PgCon(raw)
            except psycopg.OperationalError as exc:
                self._drop()
                raise StoreError(f"lost the PostgreSQL store {self.name}: {str(exc).strip()}") from exc

    def transaction(
        self,
        work: Callable[[PgCon], T],
        *,
        wait: float | None = None,
        commit: bool = True,
        exclusive: bool = False,
        read_only: bool = False,
        idempotent: bool = False,
    ) -> T:
        """Run `work` in one transaction, redoing it after a serialization failure, a deadlock or a lost
        connection (`commit=False`: roll it back; `exclusive`: one such transaction at a time in the database;
        `read_only` is for a DuckDB file: the server decides what this role may do).

        A connection lost while the COMMIT was on its way leaves the transaction's fate unknown here: redone, it
        could write twice (answers, a claim whose rows then wait for nobody). So the transaction's id is taken
        just before the COMMIT, and the server, once reached again, says whether it committed (`_landed`): if so
        its result stands, if not it is redone. `idempotent`: done twice, `work` leaves what doing it once does
        (a run's row written whole, a heartbeat), so it is redone without asking, even after a restart."""
        psycopg = _psycopg()
        retry = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
        start = time.monotonic()
        for attempt in range(1000):
            with self._lock:
                raw = self._connection(None if wait is None else max(0.0, wait - (time.monotonic() - start)))
                xid: int | None = None
                server_started: Any = None
                result: T | None = None
                try:
                    raw.execute("BEGIN")
                    if exclusive:
                        raw.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
                    result = work(PgCon(raw))
                    if commit and not idempotent:  # NULL when it wrote nothing: nothing to lose, a redo is harmless
                        xid, server_started = raw.execute(
                            "SELECT txid_current_if_assigned(), pg_postmaster_start_time()"
                        ).fetchone()
                    raw.execute("COMMIT" if commit else "ROLLBACK")
                    return result
                except retry:
                    raw.execute("ROLLBACK")
                    if attempt >= 20:
                        raise
                    time.sleep(0.01 * (attempt + 1))
                except psycopg.OperationalError:
                    if not raw.broken:
                        with contextlib.suppress(psycopg.Error):
                            raw.execute("ROLLBACK")
                        raise
                    self._drop()  # the server went away: connect again and redo the transaction
                    if xid is not None and self._landed(xid, server_started, wait, start):
                        return result  # type: ignore[return-value]  # set: the xid is taken after the work
                    if wait is not None and time.monotonic() - start > wait:
                        raise StoreBusy(
                            f"cannot reach the PostgreSQL store {self.name} (waited {time.monotonic() - start:.0f}s)"
                        ) from None
                    time.sleep(0.2)
                except BaseException:
                    with contextlib.suppress(psycopg.Error):
                        raw.execute("ROLLBACK")
                    raise
        raise StoreError(f"PostgreSQL store {self.name}: gave up after repeated conflicts")
