"""`llmledger.review(store, table, step)`: a person judges a step's answers one row at a time in the notebook,
keyboard first.

ipywidgets has no key events, so the keys go through a focused text box (`continuous_update=True`): each keystroke
changes its value, the view reads the key and clears the box. `f` (flag) and `c` (correct) then take text in the
same box, Enter submitting it: a flag's optional reason, a text answer, or a typed answer one field at a time
(Enter keeps a field's value), checked against the step's schema when the last field is in. Every verdict is one
call into the ledger (`Session`), then the next row shows. "redo flagged" (or `r`) re-sends the flagged rows in the
background with the run's live view; when it ends they come back into the queue.
"""

from __future__ import annotations

import base64
import json
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmledger._draw import esc
from llmledger._view.review_queue import Row, Shape
from llmledger._view.review_session import Session, field_value
from llmledger.errors import InvalidInputError

KEYS = (
    ("a", "accept"),
    ("f", "flag (then a reason, Enter)"),
    ("c", "correct (type the answer, Enter)"),
    ("s", "skip"),
    ("u", "undo"),
    ("j / n", "next"),
    ("k / p", "previous"),
    ("r", "redo flagged"),
)
_IMAGES = {b"\x89PNG": "png", b"\xff\xd8\xff": "jpeg", b"GIF8": "gif", b"RIFF": "webp"}
_SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".gif": "gif", ".webp": "webp"}
_MAX_IMAGE = 4_000_000


def _thumbnail(value: Any) -> str | None:
    """An <img> of an image given as bytes or as the path of an image file, or None."""
    data: bytes | None = None
    kind = None
    if isinstance(value, bytes | bytearray):
        data = bytes(value)
        kind = next((k for magic, k in _IMAGES.items() if data.startswith(magic)), None)
    elif isinstance(value, str) and Path(value).suffix.lower() in _SUFFIXES and len(value) < 1000:
        path = Path(value).expanduser()
        if path.is_file() and path.stat().st_size <= _MAX_IMAGE:
            data, kind = path.read_bytes(), _SUFFIXES[path.suffix.lower()]
    if data is None or kind is None or len(data) > _MAX_IMAGE:
        return None
    src = f"data:image/{kind};base64,{base64.b64encode(data).decode()}"
    return f'<img class="llmledger-thumb" src="{src}" style="max-height:140px;max-width:240px">'


def _answer_html(answer: Any, fields: list[str]) -> str:
    if answer is None:
        return "<i>no answer</i>"
    if isinstance(answer, dict):
        names = fields or list(answer)
        return "".join(
            f'<div class="llmledger-field" data-field="{esc(f)}"><b>{esc(f)}</b>: '
            f"{esc(json.dumps(answer.get(f), ensure_ascii=False, default=str))}</div>"
            for f in names
        )
    return f'<div style="white-space:pre-wrap">{esc(answer)}</div>'


def row_html(shape: Shape, row: Row) -> str:
    """One row: key, inputs (images as thumbnails), the answer, its state, earlier answers, other steps' answers."""
    inputs = "".join(
        f"<tr><th style='text-align:left;vertical-align:top'>{esc(name)}</th><td style='white-space:pre-wrap'>"
        f"{_thumbnail(value) or esc(value)}</td></tr>"
        for name, value in row.inputs.items()
    )
    state = [f'<span data-field="status">{esc(row.status)}</span>']
    if row.stale:
        state.append("stale")
    if row.verdict:
        state.append(f'<span data-field="verdict">{esc(row.verdict)} by {esc(row.verdict_by)}</span>')
    if row.flag:
        state.append(f'<span data-field="flag">flagged: {esc(row.flag)}</span>')
    if row.source == "person":
        state.append("a person's answer")
    if row.error:
        state.append(f"error: {esc(row.error[:300])}")
    parts = [
        f'<div data-field="key">key {esc(json.dumps(row.key, default=str))}</div>',
        f"<table class='llmledger-inputs'>{inputs}</table>",
        f'<div class="llmledger-answer" style="margin:6px 0;padding:6px;border-left:3px solid #1976d2">'
        f"<b>{esc(shape.step)}</b><br>{_answer_html(row.answer, shape.fields)}</div>",
        f'<div class="llmledger-state">{" · ".join(state)}</div>',
    ]
    if row.others:
        cells = "".join(
            f"<td style='vertical-align:top;padding-right:12px'><b>{esc(o)}</b><br>{_answer_html(a, [])}</td>"
            for o, a in row.others.items()
        )
        parts.append(f"<table class='llmledger-others'><tr>{cells}</tr></table>")
    if row.earlier:
        earlier = "".join(
            f"<li>{esc(e['reason'])}: {esc(json.dumps(e['answer'], ensure_ascii=False, default=str)[:300])}</li>"
            for e in row.earlier
        )
        parts.append(f"<details><summary>earlier answers ({len(row.earlier)})</summary><ul>{earlier}</ul></details>")
    return "".join(parts)


class ReviewView:
    """The review view: the row, the keys, the command box, the counter, "redo flagged"."""

    def __init__(self, session: Session, *, redo: Callable[[], Any] | None = None) -> None:
        import ipywidgets as w

        self.session, self._redo = session, redo
        self.mode = "key"  # or "flag", "correct"
        self.field = 0  # the typed field being corrected
        self.draft: dict[str, Any] = {}
        self.run: Any = None
        self.header = w.HTML()
        self.body = w.HTML()
        self.prompt = w.HTML()
        self.message = w.HTML()
        self.box = w.Text(value="", placeholder="press a key", continuous_update=True)
        self.box.add_class("llmledger-review-box")
        self.box.observe(self._typed, names="value")
        with warnings.catch_warnings():  # on_submit is the only Enter a Text widget reports
            warnings.simplefilter("ignore", DeprecationWarning)
            self.box.on_submit(lambda _: self.submit())
        legend = " · ".join(f"<kbd>{esc(k)}</kbd> {esc(what)}" for k, what in KEYS)
        self.legend = w.HTML(f'<div class="llmledger-keys" style="color:#555">{legend}</div>')
        self.redo_button = w.Button(description="redo flagged", disabled=redo is None)
        self.redo_button.on_click(lambda _: self.redo_flagged())
        self.live = w.Output()
        self.widget = w.VBox([self.header, self.body, self.prompt, self.box, self.message, self.legend,
                              self.redo_button, self.live])  # fmt: skip
        self.widget.add_class("llmledger-review")
        self.draw()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    # -- keys -------------------------------------------------------------------------------------
    def _typed(self, change: dict[str, Any]) -> None:
        value = change["new"]
        if self.mode != "key" or not value:
            return
        self.box.value = ""
        self.key(value[-1])

    def key(self, key: str) -> None:
        """Act on one key (what the command box does with each keystroke)."""
        s, key = self.session, key.lower()
        self.message.value = ""
        try:
            if key == "a":
                s.accept()
            elif key == "f" and s.key is not None:
                self.mode = "flag"
            elif key == "c" and s.key is not None:
                self.mode, self.field = "correct", 0
                row = s.row()
                self.draft = dict(row.answer) if row is not None and isinstance(row.answer, dict) else {}
            elif key == "s":
                s.skip()
            elif key == "u":
                undone = s.undo()
                self.note(f"undone: {undone}" if undone else "nothing to undo")
            elif key in "jn":
                s.next()
            elif key in "kp":
                s.previous()
            elif key == "r":
                self.redo_flagged()
            else:
                self.note(f"{key!r} is not a key: {', '.join(k for k, _ in KEYS)}")
        except InvalidInputError as exc:
            self.note(str(exc), error=True)
        self.draw()

    def submit(self) -> None:
        """Enter: the flag's reason, or the answer (a typed step's field) in the box."""
        text, self.box.value = self.box.value, ""
        s = self.session
        try:
            if self.mode == "flag":
                self.mode = "key"
                s.flag(text)
            elif self.mode == "correct":
                self._correct(text)
        except InvalidInputError as exc:
            self.note(str(exc), error=True)
        self.draw()

    def _correct(self, text: str) -> None:
        s, fields = self.session, self.session.shape.fields
        if not fields:
            if not text.strip():
                raise InvalidInputError("type the right answer, then Enter")
            s.correct(text)
            self.mode = "key"
            return
        props = (s.shape.schema or {}).get("properties", {})
        name = fields[self.field]
        self.draft[name] = field_value(text, props.get(name, {}), self.draft.get(name))
        self.field += 1
        if self.field < len(fields):
            return
        self.field = 0  # a bad answer stays, to be edited from its first field
        s.correct(dict(self.draft))
        self.mode = "key"

    def cancel(self) -> None:
        self.mode, self.box.value = "key", ""
        self.draw()

    # -- redo flagged -----------------------------------------------------------------------------
    def redo_flagged(self) -> None:
        if self._redo is None:
            self.note("redo flagged is not available here")
            return
        if self.run is not None and not getattr(self.run, "done", True):
            self.note("the redo is still running")
            return
        self.live.clear_output()
        with self.live:
            self.run = self._redo()
            from IPython.display import display

            display(self.run)
        self.note("redoing the flagged rows in the background; they come back here when it ends")
        threading.Thread(target=self._after_redo, args=(self.run,), daemon=True, name="llmledger-review").start()

    def _after_redo(self, run: Any) -> None:
        try:
            run.wait()
        except BaseException as exc:  # the run's own view says what stopped it
            self.note(f"the redo stopped: {exc}", error=True)
        back = self.session.redone()
        self.note(f"{len(back)} redone rows are back in the queue")
        self.draw()

    # -- drawing ----------------------------------------------------------------------------------
    def note(self, text: str, *, error: bool = False) -> None:
        colour = "#d32f2f" if error else "#555"
        self.message.value = f'<div class="llmledger-message" style="color:{colour}">{esc(text)}</div>'

    def draw(self) -> None:
        s = self.session
        self.header.value = (
            f'<div class="llmledger-review-head"><b>review {esc(s.shape.table)}.{esc(s.shape.step)}</b> · '
            f'<span data-field="position">{esc(s.position_line())}</span> · '
            f'<span data-field="tally">{esc(s.tally_line())}</span></div>'
        )
        row = s.row(fresh=True)
        self.body.value = (
            row_html(s.shape, row) if row is not None else '<div data-field="done"><b>nothing left to review</b></div>'
        )
        self.prompt.value = f'<div class="llmledger-prompt">{esc(self.prompt_text(row))}</div>'

    def prompt_text(self, row: Row | None) -> str:
        if self.mode == "flag":
            return "flag: why is it wrong? (optional; Enter flags)"
        if self.mode == "correct":
            fields = self.session.shape.fields
            if not fields:
                return "correct: type the right answer, Enter"
            name = fields[self.field]
            now = json.dumps(self.draft.get(name), ensure_ascii=False, default=str)
            return f"correct field {self.field + 1} of {len(fields)}, {name} (now {now}; Enter keeps it):"
        return "press a key" if row is not None else "done: u undoes the last verdict, k goes back"


def review_view(
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
    redo: Callable[[], Any] | None = None,
) -> ReviewView:
    """The view over a new `Session` (see `llmledger.review`); `redo` starts "redo flagged" and returns its run."""
    session = Session(store, table, step, where=where, queue=queue, sample=sample, margin=margin, by=by,
                      compare_with=compare_with, seed=seed)  # fmt: skip
    return ReviewView(session, redo=redo)
