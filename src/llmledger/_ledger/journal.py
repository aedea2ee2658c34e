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
import warnings
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from typing import IO, Any, cast

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

    def append(
        self, result: dict[str, Any], figures: dict[str, Any] | None = None, packs: list[dict[str, Any]] | None = None
    ) -> None:
        """One answer, and the run's paid figures after it (`RUN_FIGURES`): if the run dies before its next
        commit, the run that merges this journal gives the dead run's row in llmledger_runs what it had paid.
        `packs`: records (`packs.PACK_SCHEMA`) of requests that carried rows together, journaled with the next
        answer, so the merge keeps the audit of what it merges."""
        if figures is not None:
            result = {**result, RUN_FIGURES: figures}
        if packs:
            result = {**result, PACK_RECORD: packs}
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


RUN_FIGURES = "_run"  # the key of a journal line's run figures (never a result column)
PACK_RECORD = "_pack"  # the key of a journal line's pack record


def pack_records(path: Path) -> list[dict[str, Any]]:
    """The pack records a journal file holds, on whole lines (their times back as datetimes)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        records = row.get(PACK_RECORD) if isinstance(row, dict) else None
        for record in records if isinstance(records, list) else []:
            at = record.get("answered_at") if isinstance(record, dict) else None
            if isinstance(record, dict):
                out.append({**record, "answered_at": datetime.fromisoformat(at) if isinstance(at, str) else None})
    return out


def last_figures(path: Path) -> dict[str, Any] | None:
    """The run's figures on the last whole line of a journal file that has them (None: none has)."""
    for line in reversed(path.read_text(encoding="utf-8", errors="replace").split("\n")):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get(RUN_FIGURES), dict):
            return cast(dict[str, Any], row[RUN_FIGURES])
    return None


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


class DamagedJournalWarning(UserWarning):
    """A journal file held lines that are not whole answers: they were set aside, named by path and line."""


def read(path: Path, schema: dict[str, pl.DataType], *, key: Sequence[str] = ()) -> pl.DataFrame:
    """A journal file as a results frame: every line that is a whole answer (all of `key`, a known status, values
    of the right types). A torn last line (a crash mid-write) is skipped silently; any other line that is not a
    whole answer is never merged (a key alone would set the row's status to NULL): the file is copied beside
    itself as `<name>.bad` and a DamagedJournalWarning names it and the lines."""
    from llmledger._ledger.states import STATUSES

    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = len(lines) - 1 if lines and lines[-1] else None  # the last line, unless the file ends with a newline
    loose = {k: (pl.String if v.is_temporal() else v) for k, v in schema.items()}
    temporal = {k: v for k, v in schema.items() if v.is_temporal()}

    def whole(rows: list[Any]) -> pl.DataFrame:
        frame = pl.from_dicts(rows, schema=loose) if rows else pl.DataFrame(schema=loose)
        return frame.with_columns(pl.col(k).str.strptime(cast(Any, v)) for k, v in temporal.items())

    good: list[tuple[int, dict[str, Any]]] = []  # (line number, row)
    bad: list[int] = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number != torn:
                bad.append(number + 1)
            continue
        if not (isinstance(row, dict) and row.get("status") in STATUSES and all(row.get(k) is not None for k in key)):
            bad.append(number + 1)
            continue
        good.append((number + 1, row))
    try:
        frame = whole([row for _, row in good])
    except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
        keep = []  # one line at a time, to find the ones whose values do not fit
        for number, row in good:
            try:
                whole([row])
            except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
                bad.append(number)
            else:
                keep.append(row)
        frame = whole(keep)
    if bad:
        aside = path.with_name(path.name + ".bad")
        aside.write_text(text, encoding="utf-8")
        shown = ", ".join(map(str, sorted(bad)[:10])) + (" ..." if len(bad) > 10 else "")
        warnings.warn(
            f"the journal {path} has {len(bad)} damaged line(s) (line {shown}): they were not merged; "
            f"its {frame.height} whole answer(s) were. A copy of the file is kept as {aside}; the rows "
            "of the damaged lines are asked again.",
            DamagedJournalWarning,
            stacklevel=2,
        )
    return frame
