"""A person reviewing a step's rows one at a time: where they are in the queue, each verdict written to the ledger
at once (one call), undo, and the running count and accuracy. The notebook view and the terminal twin both drive
one `Session`; neither writes anything itself.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

from llmledger._ledger import open_existing
from llmledger._ledger.query import undo_verdict
from llmledger._time import utcnow
from llmledger._view.accuracy import wilson
from llmledger._view.review_queue import (
    Row,
    Shape,
    flagged_keys,
    key_id,
    load_row,
    queue_keys,
    redo_where,
    resendable,
    shape_of,
)
from llmledger.errors import InvalidInputError


def reviewer(by: Any) -> str:
    """Who judges: `by`, or the login name."""
    if by is None:
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return "unknown"
    if not isinstance(by, str) or not by.strip():
        raise InvalidInputError(f"by= names who judges, e.g. by='ana'; got {by!r}")
    return by


class Session:
    """The queue of rows to review and what this person did to them."""

    def __init__(
        self,
        store: str | Path,
        table: str,
        step: str,
        *,
        where: str | None = None,
        queue: str = "needs",
        sample: int | None = None,
        margin: float | None = None,
        by: str | None = None,
        compare_with: Any = (),
        seed: int = 0,
    ) -> None:
        self.by = reviewer(by)
        self.shape: Shape = shape_of(store, table, step, compare_with)
        self.where = where
        self.keys: list[Any] = queue_keys(self.shape, where=where, queue=queue, sample=sample, margin=margin, seed=seed)
        self.pos = 0
        self.given: dict[str, tuple[str, bool]] = {}  # key id -> (latest verdict this session, the row had an answer)
        self.done: list[tuple[Any, str, bool]] = []  # (key, verdict, had an answer), newest last: what undo takes back
        self.shown: dict[str, Any] = {}  # key id -> the answer drawn last for the row (`Row.seen`): what keys judge
        self._row: Row | None = None

    # -- where we are -----------------------------------------------------------------------------
    @property
    def key(self) -> Any:
        return self.keys[self.pos] if self.pos < len(self.keys) else None

    def row(self, *, fresh: bool = False) -> Row | None:
        """The current row as it stands (read again after a verdict, or when `fresh`)."""
        while self.key is not None:
            if not fresh and self._row is not None and key_id(self._row.key) == key_id(self.key):
                return self._row
            self._row = load_row(self.shape, self.key)
            if self._row is not None:
                return self._row
            del self.keys[self.pos]  # gone since the queue was made (deleted, or the table recorded anew): skipped
        return None

    def drawn(self, row: Row) -> None:
        """The view drew `row`: a verdict on it judges this answer, even when given after moving away and back in
        keys sent at once (a row a person typed ahead to, never drawn, is judged as it stands)."""
        self.shown[key_id(row.key)] = row.seen

    def move(self, by: int) -> None:
        self.pos = max(0, min(len(self.keys), self.pos + by))
        self._row = None

    def next(self) -> None:
        self.move(1)

    def previous(self) -> None:
        self.move(-1)

    skip = next

    # -- verdicts: one call into the ledger each, then the next row -------------------------------
    def accept(self) -> None:
        self._judged("accept")

    def flag(self, reason: str | None = None) -> None:
        self._judged("flag", reason=reason.strip() if reason and reason.strip() else None)

    def correct(self, answer: Any) -> None:
        """Write the person's answer (text, or a dict for a typed step: InvalidInputError if it does not fit)."""
        self._judged("correct", answer=answer)

    def _judged(self, verdict: str, *, reason: str | None = None, answer: Any = None) -> None:
        """Judge the answer on screen: the ledger refuses the verdict if the row's answer is another one by now (a
        colleague's redo), and the row is read again, so the next draw shows what there is to judge."""
        row = self.row()  # first: a row gone since the queue was made is skipped, and the key is the next one's
        key = self.key
        if key is None or row is None:
            raise InvalidInputError("no row to judge: the queue is done")
        try:
            open_existing(self.shape.store).judge(self.shape.table, self.shape.step, verdict=verdict, key=key,
                                                  by=self.by, now=utcnow(), reason=reason, answer=answer,
                                                  seen=self.shown.get(key_id(key), row.seen))  # fmt: skip
        except InvalidInputError:
            self._row = None
            raise
        had_answer = row.answer is not None
        self.given[key_id(key)] = (verdict, had_answer)
        self.done.append((key, verdict, had_answer))
        self.next()

    def undo(self) -> str | None:
        """Take back this person's latest verdict (of this session, else on the current row) and show its row."""
        if self.done:
            key, _, _ = self.done.pop()
        elif self.key is not None:
            key = self.key
        else:
            return None
        undone = undo_verdict(self.shape.store, self.shape.table, self.shape.step, key=key, by=self.by)
        earlier = [(v, a) for k, v, a in self.done if key_id(k) == key_id(key)]
        if earlier:
            self.given[key_id(key)] = earlier[-1]
        else:
            self.given.pop(key_id(key), None)
        if key_id(key) in [key_id(k) for k in self.keys]:
            self.pos = [key_id(k) for k in self.keys].index(key_id(key))
        self._row = None
        return undone

    def flagged(self) -> int:
        """How many rows the view's "redo flagged" sends (and pays for): flagged by anyone, within `where`."""
        return resendable(self.shape, self.where)

    def redo_where(self) -> str:
        """`where=` of that redo: exactly those rows."""
        return redo_where(self.shape, self.where)

    def redone(self, *, keep_current: bool = False) -> list[Any]:
        """After `redo="flagged"`: the rows the session flagged (now answered again) come back next in the queue.
        With `keep_current` (a flag's reason or a correction is being typed), they come after the current row,
        which stays as drawn: the verdict being typed judges it, and is refused if the redo changed it (found in
        an attack: the redo's return swapped the row under a typed correction)."""
        still = {key_id(k) for k in flagged_keys(self.shape, self.where)}
        back = [k for k, v, _ in self.done if v == "flag" and key_id(k) not in still]
        back = list({key_id(k): k for k in back}.values())
        for k in back:
            self.given.pop(key_id(k), None)
        keep = keep_current and self.key is not None
        at = self.pos + 1 if keep else self.pos
        back_here = [k for k in back if not (keep and key_id(k) == key_id(self.key))]
        ids = {key_id(k) for k in back_here}
        self.keys = self.keys[:at] + back_here + [k for k in self.keys[at:] if key_id(k) not in ids]
        if not keep_current:
            self._row = None
        return back

    # -- the counter ------------------------------------------------------------------------------
    def tally(self) -> dict[str, Any]:
        """Reviewed and left in this session, and the running accuracy (right: accepted) with its Wilson interval."""
        judged = [v for v, had in self.given.values() if had]
        right = sum(v == "accept" for v in judged)
        low, high = wilson(right, len(judged))
        left = len({key_id(k) for k in self.keys} - set(self.given))  # a redone row is in the queue twice
        return {"reviewed": len(self.given), "left": left, "right": right, "judged": len(judged),
                "accuracy": right / len(judged) if judged else None, "low": low, "high": high}  # fmt: skip

    def tally_line(self) -> str:
        t = self.tally()
        line = f"{t['reviewed']} reviewed, {t['left']} left"
        if t["accuracy"] is not None:
            line += f" · accuracy {t['accuracy']:.0%} ({t['low']:.0%}–{t['high']:.0%}) on {t['judged']}"
        return line

    def position_line(self) -> str:
        return f"row {min(self.pos + 1, len(self.keys))} of {len(self.keys)}"


def field_value(text: str, schema: dict[str, Any], current: Any) -> Any:
    """A typed field as typed into the box: empty keeps `current`; text for a string field, else JSON (a number,
    true/false, null, a list), or the text itself, which the schema check then refuses with a reason."""
    if text == "":
        return current
    kinds = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", []) if isinstance(s, dict)}
    if "string" in kinds and not (text == "null" and "null" in kinds):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text
