"""A write-ahead journal of answers that are paid for but not yet committed to the store.

Each answer is appended (one JSON line, handed to the OS at once) the moment
it arrives; the DuckDB commit follows a chunk later. A kill -9 therefore loses
nothing that was answered: the next run on this host merges the journal of the
dead run into the ledger before it selects work. Only requests still in flight
at the crash are paid again. The same mechanism keeps the answers of a run
that had to stop while another process held the store.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import IO, Any

import polars as pl


def journal_folder(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".journal")


def _holder_to_name(claimant: str) -> str:
    return claimant.replace("/", "~")


def _default(value: Any) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


class Journal:
    """Appends answers for one run; `rotate()` starts a new file so the old one can be deleted once committed."""

    def __init__(self, store_path: Path, table: str, step: str, claimant: str) -> None:
        self.folder = journal_folder(store_path)
        self.stem = f"{table}.{step}"
        self.holder = _holder_to_name(claimant)
        self.seq = 0
        self._fh: IO[str] | None = None
        self._path: Path | None = None

    def append(self, result: dict[str, Any]) -> None:
        if self._fh is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.seq += 1
            self._path = self.folder / f"{self.stem}.{self.seq}.{self.holder}.jsonl"
            self._fh = self._path.open("a", encoding="utf-8")
        self._fh.write(json.dumps(result, default=_default) + "\n")
        self._fh.flush()  # in the OS's hands now: survives kill -9

    def rotate(self) -> Path | None:
        """Close the current file and return it; the next answer opens a new one."""
        path, fh = self._path, self._fh
        self._fh = self._path = None
        if fh is not None:
            fh.close()
        return path


def pending(store_path: Path, table: str, step: str) -> list[tuple[Path, str]]:
    """Journal files of this table and step, with the claim of the run that wrote each."""
    folder = journal_folder(store_path)
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(f"{table}.{step}.*.jsonl")):
        parts = path.name[: -len(".jsonl")].split(".", 3)
        if len(parts) == 4:
            out.append((path, parts[3].replace("~", "/")))
    return out


def read(path: Path, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """A journal file as a results frame (a torn last line from a crash is skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    loose = {k: (pl.String if v.is_temporal() else v) for k, v in schema.items()}
    frame = pl.from_dicts(rows, schema=loose) if rows else pl.DataFrame(schema=loose)
    temporal = {k: v for k, v in schema.items() if v.is_temporal()}
    return frame.with_columns(pl.col(k).str.strptime(v) for k, v in temporal.items())
