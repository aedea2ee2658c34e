"""`llmledger.review(store, table, step)`: a person judges a step's answers one row at a time in the notebook,
keyboard first.

ipywidgets has no key events, so the keys go through a focused one-line text area (`continuous_update=True`): each
keystroke sends the box's whole value, Enter included (a newline), in the order typed. The kernel never writes the
box: a write would race the person's typing (the browser has typed more by the time it arrives, so keys are lost,
or replayed when the browser's newer value comes in), and the browser sends a Text's Enter (`on_submit`) as a
message of its own that can overtake the last keystrokes. So the view keeps the value it last saw and acts on what
was typed since (`edit`): in key mode each new character is a key; `f` (flag) and `c` (correct) then take the text
typed after them up to Enter: a flag's optional reason, a text answer, or a typed answer one field at a time (Enter
keeps a field's value), checked against the step's schema when the last field is in. The box's value only grows;
its text is not shown (what it holds is not what the person reads: the keys before a reason, say), and the text
being typed for a flag or a correction is shown in the prompt line instead, drawn by the kernel. Every verdict is
one call into the ledger (`Session`), then the next row shows. "redo flagged" (or `r` twice) re-sends the flagged rows
in the background with the run's live view; when it ends they come back into the queue.
"""

from __future__ import annotations

import atexit
import base64
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmledger._draw import esc
from llmledger._ledger.review import RowChanged
from llmledger._step.formats import pdf_pages
from llmledger._view.review_queue import Row, Shape, key_id
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
    ("r r", "redo flagged (r twice: it pays)"),
)
_IMAGES = {b"\x89PNG": "png", b"\xff\xd8\xff": "jpeg", b"GIF8": "gif", b"RIFF": "webp"}
_SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".gif": "gif", ".webp": "webp"}
_MAX_IMAGE = 4_000_000
_MAX_PDF, _PDF_TEXT = 32_000_000, 600  # the API's own PDF limit; the first page's text shown, at most
# the command box's text is hidden (its caret and placeholder are not): one line, never wrapped, never resized
_BOX_STYLE = (
    "<style>.llmledger-review-box textarea{color:transparent;caret-color:#333;white-space:pre;overflow:hidden;"
    "resize:none}</style>"
)


def _thumbnail(value: Any) -> str | None:
    """An <img> of an image given as bytes or as the path of an image file, or None."""
    data: bytes | None = None
    kind = None
    if isinstance(value, bytes | bytearray):
        data = bytes(value)
        kind = next((k for magic, k in _IMAGES.items() if data.startswith(magic)), None)
    elif isinstance(value, str) and Path(value).suffix.lower() in _SUFFIXES and len(value) < 1000:
        try:  # text that merely ends like a file name: too long a name, "~who", no permission
            path = Path(value).expanduser()
            if path.is_file() and path.stat().st_size <= _MAX_IMAGE:
                data, kind = path.read_bytes(), _SUFFIXES[path.suffix.lower()]
        except (OSError, RuntimeError, ValueError):
            return None
    if data is None or kind is None or len(data) > _MAX_IMAGE:
        return None
    src = f"data:image/{kind};base64,{base64.b64encode(data).decode()}"
    return f'<img class="llmledger-thumb" src="{src}" style="max-height:140px;max-width:240px">'


def _pdf_preview(value: Any) -> str | None:
    """A PDF given as bytes or as the path of a .pdf file: its name, its pages, and its first page's text (what the
    standard library reads cheaply, `_step.formats.pdf_pages`; no rendering), or None when it is no PDF."""
    if isinstance(value, bytes | bytearray) and bytes(value[:1024]).lstrip().startswith(b"%PDF-"):
        raw, name = bytes(value), f"a PDF of {len(value):,} bytes"
    elif isinstance(value, str) and value.lower().endswith(".pdf") and len(value) < 1000:
        try:  # text that merely ends like a file name: too long a name, "~who", no permission
            path = Path(value).expanduser()
            if not path.is_file() or path.stat().st_size > _MAX_PDF:
                return None
            raw, name = path.read_bytes(), path.name
        except (OSError, RuntimeError, ValueError):
            return None
    else:
        return None
    pages = pdf_pages(raw)
    if pages is None:
        return f'<div class="llmledger-pdf">{esc(name)}: a PDF whose text cannot be read here</div>'
    first = pages[0].strip() if pages else ""
    text = (first[:_PDF_TEXT] + " ...") if len(first) > _PDF_TEXT else first
    return (
        f'<div class="llmledger-pdf"><b>{esc(name)}</b> · {len(pages)} page{"s" if len(pages) != 1 else ""}'
        f'<div style="white-space:pre-wrap;border-left:3px solid #ddd;padding-left:6px;color:#333">'
        f"{esc(text) or '<i>no text on the first page</i>'}</div></div>"
    )


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
    """One row: key, inputs (images as thumbnails, a PDF's name, pages and first page's text), the answer, its
    state, earlier answers, other steps' answers."""
    inputs = "".join(
        f"<tr><th style='text-align:left;vertical-align:top'>{esc(name)}</th><td style='white-space:pre-wrap'>"
        f"{_thumbnail(value) or _pdf_preview(value) or esc(value)}</td></tr>"
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


def edit(seen: str, value: str) -> tuple[int, str]:
    """How the box went from `seen` to `value`: the length of the start both share and the characters typed there.

    Typing appends to the end (several keystrokes at once when the browser held them back while the kernel was
    busy); a backspace or a selection typed over shortens the shared start; a key typed with the caret moved back
    inserts in the middle. Only the inserted characters are new: the rest was seen before and is never acted on
    again."""
    kept = 0
    limit = min(len(seen), len(value))
    while kept < limit and seen[kept] == value[kept]:
        kept += 1
    tail = 0  # what both end with, after the shared start
    while tail < limit - kept and seen[len(seen) - 1 - tail] == value[len(value) - 1 - tail]:
        tail += 1
    return kept, value[kept : len(value) - tail]


class ReviewView:
    """The review view: the row, the keys, the command box, the counter, "redo flagged"."""

    def __init__(self, session: Session, *, redo: Callable[[], Any] | None = None) -> None:
        import ipywidgets as w

        self.session, self._redo = session, redo
        self.mode = "key"  # or "flag", "correct"
        self.field = 0  # the typed field being corrected
        self.draft: dict[str, Any] = {}
        self.run: Any = None
        self.armed = False  # `r` pressed once: the next `r` re-sends the flagged rows (paid), any other key does not
        self.seen = ""  # the box's value as last seen: what was typed before it is handled
        self.refused = False  # a key of the burst being handled was refused: the rest of the burst is dropped
        self.drawn: tuple[str, Any] | None = None  # the row drawn last (its key id and answer), to say it changed
        self.start = 0  # in flag and correct mode: where in the box the text being typed begins
        self._lock = threading.RLock()  # keys, and the redo's thread putting rows back
        self.header = w.HTML()
        self.body = w.HTML()
        self.prompt = w.HTML()
        self.message = w.HTML()
        # never written by the kernel (see the module's docstring); one line: each Enter starts a new one
        self.box = w.Textarea(value="", placeholder="keys", rows=1, continuous_update=True)
        self.box.add_class("llmledger-review-box")
        self.box.layout.width = "8em"
        self.box.observe(self._typed, names="value")
        legend = " · ".join(f"<kbd>{esc(k)}</kbd> {esc(what)}" for k, what in KEYS)
        self.legend = w.HTML(f'<div class="llmledger-keys" style="color:#555">{legend}</div>{_BOX_STYLE}')
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
        self.typed(change["new"])

    def typed(self, value: str) -> None:
        """The box's whole value, as the browser sends it after a keystroke: act on what was typed since."""
        with self._lock:
            kept, new = edit(self.seen, value)
            self.seen = value
            if self.mode != "key" and kept < self.start:  # the text's beginning was deleted or typed over
                self.start = kept
            acted, self.refused = False, False
            for at, char in enumerate(new, start=kept):
                if self.mode == "key":
                    if char != "\n":  # Enter between keys does nothing
                        self.key(char, draw=False)
                        self.start, acted = at + 1, True
                elif char == "\n":  # Enter: the text typed since the mode began (an Enter in its middle ends it)
                    text, self.start, acted = value[self.start : at].replace("\n", " "), at + 1, True
                    self.submit(text, draw=False)
                if self.refused:  # the keys typed after it were typed before the refusal was seen: dropped
                    self.start = len(value)  # (found in an attack: a second `a` accepted the answer that had
                    break  # replaced the refused one, never drawn)
            if acted:
                self.draw()
            elif self.mode != "key":  # the text being typed, shown where the person reads
                self.prompt.value = self.prompt_html(self.session.row())

    def key(self, key: str, *, draw: bool = True) -> None:
        """Act on one key (what the command box does with each key typed in key mode)."""
        s, key = self.session, key.lower()
        self.message.value = ""
        armed, self.armed = self.armed, False
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
            elif key in ("j", "n"):
                s.next()
            elif key in ("k", "p"):
                s.previous()
            elif key == "r" and armed:
                self.redo_flagged()
            elif key == "r":  # one stray key must not spend money: a second `r` confirms
                self._ask_to_redo()
            else:
                self.note(f"{key!r} is not a key: {', '.join(k for k, _ in KEYS)}")
        except InvalidInputError as exc:
            self._refused(exc)
        if draw:
            self.draw()

    def _refused(self, exc: InvalidInputError) -> None:
        """A key or an Enter refused: say why, and drop the keys typed after it (typed before this was seen). A
        verdict refused because the row changed also ends a flag or a correction begun on the old row."""
        self.note(str(exc), error=True)
        self.refused = True
        if isinstance(exc, RowChanged):
            self.mode, self.field, self.draft = "key", 0, {}

    def submit(self, text: str, *, draw: bool = True) -> None:
        """Enter in flag or correct mode: `text` is the flag's reason, or the answer (a typed step's field)."""
        s = self.session
        try:
            if self.mode == "flag":
                self.mode = "key"
                s.flag(text)
            elif self.mode == "correct":
                self._correct(text)
        except InvalidInputError as exc:
            self._refused(exc)
        if draw:
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
        """Back to key mode; what was typed for the flag or correction is dropped (the box is left as it is)."""
        with self._lock:
            self.mode = "key"
            self.draw()

    # -- redo flagged -----------------------------------------------------------------------------
    def _ask_to_redo(self) -> None:
        """The first `r`: say what a second one sends and pays for (nothing to send, or a redo running: no ask)."""
        if self._redo is None:
            self.note("redo flagged is not available here")
        elif self.run is not None and not getattr(self.run, "done", True):
            self.note("the redo is still running")
        elif not (flagged := self.session.flagged()):
            self.note("no flagged row to redo (f flags the row shown)")
        else:
            self.armed = True
            self.note(f"r again to re-send the {flagged:,} flagged row{'s' if flagged != 1 else ''} (paid); any "
                      "other key does not")  # fmt: skip

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
        self._after = threading.Thread(target=self._after_redo, args=(self.run,), daemon=True, name="llmledger-review")
        self._after.start()
        atexit.register(self._after.join, 30)  # a script ending now must not tear the store down under its last read

    def _after_redo(self, run: Any) -> None:
        self.armed = False  # a `r` asked before the redo ended does not carry over to rows flagged since
        try:
            run.wait()
        except BaseException as exc:  # the run's own view says what stopped it
            self.note(f"the redo stopped: {exc}", error=True)
        with self._lock:
            back = self.session.redone(keep_current=self.mode != "key")
            self.note(f"{len(back)} redone rows are back in the queue")
            self.draw()

    # -- drawing ----------------------------------------------------------------------------------
    def note(self, text: str, *, error: bool = False) -> None:
        colour = "#d32f2f" if error else "#555"
        self.message.value = f'<div class="llmledger-message" style="color:{colour}">{esc(text)}</div>'

    def draw(self) -> None:
        s = self.session
        try:  # first: it skips rows gone since the queue was made, which the counts leave out. While a flag's
            row = s.row(fresh=self.mode == "key")  # reason or a correction is typed, the row shown stays: the
        except InvalidInputError as exc:  # verdict judges it, and is refused if it changed meanwhile
            self.note(str(exc), error=True)  # the table or step itself is gone
            self.body.value = f'<div data-field="gone"><b>{esc(str(exc))}</b></div>'
            return
        if row is not None:
            s.drawn(row)
        drawn = None if row is None else (key_id(row.key), row.seen)
        if drawn and self.drawn and drawn[0] == self.drawn[0] and drawn != self.drawn and not self.message.value:
            self.note("this row's answer or inputs changed while it was on screen (a redo, or the row recorded "
                      "anew): this is the row now", error=True)  # fmt: skip
        self.drawn = drawn
        self.header.value = (
            f'<div class="llmledger-review-head"><b>review {esc(s.shape.table)}.{esc(s.shape.step)}</b> · '
            f'<span data-field="position">{esc(s.position_line())}</span> · '
            f'<span data-field="tally">{esc(s.tally_line())}</span></div>'
        )
        self.body.value = (
            row_html(s.shape, row) if row is not None else '<div data-field="done"><b>nothing left to review</b></div>'
        )
        self.prompt.value = self.prompt_html(row)

    def prompt_html(self, row: Row | None) -> str:
        """What the keys do now, and in flag or correct mode the text typed so far (the box itself hides it)."""
        typed = ""
        if self.mode != "key":
            text = self.seen[self.start :].replace("\n", " ")
            typed = f' <span class="llmledger-typed" style="background:#e3f2fd">{esc(text)}</span>▏'
        return f'<div class="llmledger-prompt">{esc(self.prompt_text(row))}{typed}</div>'

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
