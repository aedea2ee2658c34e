"""Who holds a claim, and whether that holder is still alive.

A claim is written as ``host/pid/run_id``. A claim from this host whose process
is gone (a crash, a kernel restart) or whose run has ended in this very process
can be taken back at once; a claim whose holder runs on this host is never taken
back; any other claim is left alone until it is older than `stale_after`, because
we cannot see into other machines. A run renews its claims' `running_started_at`
every minute, so only the claims of a holder that stopped renewing grow old.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass

_active_runs: set[str] = set()


def host_name() -> str:
    """The machine's name in claims: `LLMLEDGER_HOSTNAME`, else the host name. Containers that share one host name
    (and cannot see each other's processes) need distinct names, or one would take the other's claims for dead."""
    return os.environ.get("LLMLEDGER_HOSTNAME") or socket.gethostname()
_active_lock = threading.Lock()


@dataclass(frozen=True)
class Claimant:
    host: str
    pid: int
    run_id: str

    @classmethod
    def new(cls) -> Claimant:
        return cls(host_name(), os.getpid(), uuid.uuid4().hex[:12])

    @classmethod
    def parse(cls, text: str) -> Claimant | None:
        host, sep, rest = text.rpartition("/")
        host, sep2, pid = host.rpartition("/")
        if not (sep and sep2 and pid.isdigit()):
            return None
        return cls(host, int(pid), rest)

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.run_id}"

    def __enter__(self) -> Claimant:
        with _active_lock:
            _active_runs.add(self.run_id)
        return self

    def __exit__(self, *exc: object) -> None:
        with _active_lock:
            _active_runs.discard(self.run_id)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder_runs(claim: str) -> bool | None:
    """Whether the claim's holder still runs; None when that cannot be seen from here (another host)."""
    holder = Claimant.parse(claim)
    if holder is None or holder.host != host_name():
        return None
    if holder.pid == os.getpid():
        with _active_lock:
            return holder.run_id in _active_runs
    return _pid_alive(holder.pid)


def is_alive_here(claim: str) -> bool:
    """True when the claim's holder certainly still runs (same host only): its age then says nothing."""
    return _holder_runs(claim) is True


def is_abandoned(claim: str) -> bool:
    """True when the claim's holder certainly no longer runs (same host only)."""
    return _holder_runs(claim) is False
