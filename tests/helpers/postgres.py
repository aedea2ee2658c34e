"""A real PostgreSQL server for the tests: Debian's `postgresql` package, in a temp data dir on 127.0.0.1.

Run as root (as CI is), the server runs as the unprivileged `postgres` user, which initdb requires.
`Server.restart()` stops it fast (dropping every connection, as a network cut does) and starts it again.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path


def find_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="llmledger-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.getuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.as_root:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in cmd)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
