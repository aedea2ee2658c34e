"""`llmledger review STORE`: the review view's terminal twin, for a person on a server over SSH. One row at a time,
one key per line (a text's reason or answer on the next line), the same `Session` and the same verdicts."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from llmledger._view.review_queue import Row, Shape
from llmledger._view.review_session import Session
from llmledger.errors import InvalidInputError

KEYS_LINE = "a accept · f flag (reason on the next line) · c correct (answer on the next line{typed}) · s skip · u undo"
KEYS_LINE += " · j/n next · k/p previous · q quit"


def row_text(shape: Shape, row: Row) -> str:
    """One row as lines of text: key, inputs, the answer (typed fields one per line), state, other steps."""
    out = [f"key {json.dumps(row.key, default=str)}"]
    out += [f"  {name}: {_short(value)}" for name, value in row.inputs.items()]
    if isinstance(row.answer, dict):
        out.append(f"{shape.step}:")
        out += [f"  {f}: {json.dumps(row.answer.get(f), ensure_ascii=False, default=str)}" for f in shape.fields]
    else:
        out.append(f"{shape.step}: {row.answer if row.answer is not None else '(no answer)'}")
    state = [row.status, *(["stale"] if row.stale else [])]
    state += [f"{row.verdict} by {row.verdict_by}"] if row.verdict else []
    state += [f"flagged: {row.flag}"] if row.flag else []
    state += [f"error: {row.error[:200]}"] if row.error else []
    out.append("  " + " · ".join(state))
    out += [f"  {o}: {_short(a)}" for o, a in row.others.items()]
    out += [f"  earlier ({e['reason']}): {_short(e['answer'])}" for e in row.earlier]
    return "\n".join(out)


def _short(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return f"({len(value):,} bytes)"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 400 else text[:400] + "…"


def review_in_terminal(
    session: Session, *, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> dict[str, Any]:
    """Review the session's rows reading one key per line from `stdin` (a|f|c|s|u|j|n|k|p|q; after f the reason
    and after c the answer on the next line, JSON for a typed step) until q, the end of input, or nothing is left.
    Returns the session's tally (reviewed, left, accuracy)."""
    read, out = stdin or sys.stdin, stdout or sys.stdout
    table, step = session.shape.table, session.shape.step

    def say(*lines: str) -> None:
        print(*lines, sep="\n", file=out, flush=True)

    say(f"review {table}.{step}: {len(session.keys)} rows to review, as {session.by}",
        KEYS_LINE.format(typed=", JSON" if session.shape.fields else ""))  # fmt: skip
    while True:
        try:
            row = session.row(fresh=True)
        except InvalidInputError as exc:  # the table or step itself is gone
            say(f"error: {exc}")
            break
        say("", f"[{session.position_line()} · {session.tally_line()}]")
        say(row_text(session.shape, row) if row is not None else "nothing left to review (u undoes, k goes back)")
        if row is not None:
            session.drawn(row)
        line = read.readline()
        if not line:
            break
        key = line.strip()[:1].lower()
        if key == "q":
            break
        try:
            if key == "a":
                session.accept()
            elif key in ("f", "c"):
                text = read.readline().rstrip("\n")
                if key == "f":
                    session.flag(text)
                else:
                    session.correct(_answer(text, session.shape))
            elif key == "s":
                session.skip()
            elif key == "u":
                say(f"undone: {session.undo() or 'nothing to undo'}")
            elif key in ("j", "n"):
                session.next()
            elif key in ("k", "p"):
                session.previous()
            elif key:
                say(f"{key!r} is not a key. " + KEYS_LINE.format(typed=""))
        except InvalidInputError as exc:
            say(f"error: {exc}")
    tally = session.tally()
    say("", f"review {table}.{step}: {session.tally_line()}")
    return tally


def _answer(text: str, shape: Shape) -> Any:
    if not shape.fields:
        return text
    try:
        return json.loads(text)
    except ValueError:
        example = "{" + ", ".join(f'"{f}": ...' for f in shape.fields) + "}"
        raise InvalidInputError(f"a typed answer is JSON with the fields {shape.fields}, e.g. {example}") from None
