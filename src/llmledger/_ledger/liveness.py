"""Who holds a claim, and whether that holder is still alive.

A claim is written as ``host/pid/run_id``, where the run id ends with the process's
start time (``<12 hex>-<start>``, from /proc on Linux), so a dead run's PID that the
system has since given to another process is not taken for the run (0.6 wrote the
run id alone; such claims are judged by the PID). A claim from this host whose process
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
from pathlib import Path

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
        started = process_start(os.getpid())
        return cls(host_name(), os.getpid(), uuid.uuid4().hex[:12] + (f"-{started}" if started else ""))

    @property
    def started(self) -> str | None:
        """The holder process's start time as its claim recorded it (None for claims written by 0.6)."""
        _, sep, started = self.run_id.rpartition("-")
        return started if sep and started.isdigit() else None

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


def process_start(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat); None where there is no
    /proc (then a claim is judged by its PID alone) or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    return fields[19] if len(fields) > 19 else None


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
    if holder.pid == os.getpid() and holder.started in (None, process_start(holder.pid)):
        with _active_lock:
            return holder.run_id in _active_runs
    if not _pid_alive(holder.pid):
        return False
    started = holder.started
    if started is None:
        return True
    now_started = process_start(holder.pid)
    return now_started is None or now_started == started  # another start time: the PID was given to another process


def is_alive_here(claim: str) -> bool:
    """True when the claim's holder certainly still runs (same host only): its age then says nothing."""
    return _holder_runs(claim) is True


def is_abandoned(claim: str) -> bool:
    """True when the claim's holder certainly no longer runs (same host only)."""
    return _holder_runs(claim) is False
