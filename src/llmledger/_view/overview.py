"""`llmledger.show(store)`: every table and step of a store at a glance, refreshable while others work.

Each step is one stacked bar of its rows by status (the colours of a run's live view), with its cost,
the processes holding its claims (workers, background runs, other kernels) and its errors by kind; then
the Message Batches still processing. In a notebook it is a widget with a Refresh button (and
`every=` seconds, a redraw on its own); elsewhere its HTML, or the text twin `llmledger status` prints.
Reading takes the store only for a moment, so it is safe while runs and workers go on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from llmledger._draw import (
    SEGMENTS,
    ErrorLine,
    bar_html,
    bar_text,
    errors_html,
    esc,
    legend_html,
    legend_text,
    panel_html,
    parts,
    rows,
    usd,
)
from llmledger._ledger import DEFAULT_STORE, open_existing, short_name
from llmledger._ledger.liveness import is_abandoned
from llmledger._ledger.types import BatchOverview, Claims, Overview, StepOverview
from llmledger._time import utcnow
from llmledger._view.live import widget_frontend


def show(store: str | Path = DEFAULT_STORE, *, table: str | None = None, every: float | None = None) -> StoreView:
    """Every table and step of `store` (a DuckDB file or a postgresql:// URL) as bars of rows by status.

        llmledger.show("ledger.duckdb")              # the last expression of a cell: drawn below it
        view = llmledger.show(url, every=5)          # redrawn every 5 s while workers run; view.stop()

    `table=` narrows it to one table. `every=` needs a widget front end (JupyterLab, Notebook, VS Code);
    elsewhere call `view.refresh()`. `str(view)` is the text `llmledger status` prints.
    """
    if every is not None and not every > 0:
        from llmledger.errors import InvalidInputError

        raise InvalidInputError(f"every= is the seconds between redraws (a number > 0), got {every!r}")
    return StoreView(store, table=table, every=every)


class StoreView:
    """What `show` returns: the store as last read; `refresh()` reads it again (and redraws it if shown)."""

    def __init__(self, store: str | Path, *, table: str | None = None, every: float | None = None) -> None:
        self.store, self.table, self.every = store, table, every
        self.name = short_name(store)
        self._ledger = open_existing(store)
        self.overview: Overview = self._ledger.overview(table)
        if table is not None and table not in self.overview.tables:
            from llmledger.errors import InvalidInputError

            raise InvalidInputError(
                f"the store has no table {table!r}; its tables: {self.overview.tables}. "
                "Leave out table= to see every one."
            )
        self.read_at: datetime = utcnow()
        self._widget: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> StoreView:
        self.overview = self._ledger.overview(self.table)
        self.read_at = utcnow()
        if self._widget is not None:
            self._widget.value = self._repr_html_()
        return self

    def stop(self) -> None:
        """Stop redrawing every `every` seconds (the view stays as last drawn)."""
        self._stop.set()

    # -- drawing --------------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        return store_html(self.overview, name=self.name, read_at=self.read_at, table=self.table)

    def text(self, *, colour: bool = False) -> str:
        return store_text(self.overview, name=self.name, read_at=self.read_at, table=self.table, colour=colour)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if not widget_frontend():
            display({"text/html": self._repr_html_(), "text/plain": self.text()}, raw=True)
            return
        import ipywidgets

        if self._widget is None:
            self._widget = ipywidgets.HTML(value=self._repr_html_(), layout=ipywidgets.Layout(width="100%"))
            self._widget.add_class("llmledger-show")
        button = ipywidgets.Button(description="Refresh", icon="refresh", layout=ipywidgets.Layout(width="110px"))
        button.on_click(lambda _: self.refresh())
        display(ipywidgets.VBox([self._widget, button]))
        if self.every is not None and self._thread is None:  # one redrawing thread per view, however often shown
            self._thread = threading.Thread(target=self._redraw, name="llmledger-show", daemon=True)
            self._thread.start()

    def _redraw(self) -> None:
        """Every `every` seconds, or as long as the last read took if that was longer: a slow store (a
        very large table, a distant server) is not read back to back."""
        assert self.every is not None
        pause = self.every
        while not self._stop.wait(pause):
            started = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # the store went away, the server is down: say so, keep the last view
                if self._widget is not None:
                    self._widget.value = self._repr_html_() + f"<div style='color:#d32f2f'>{esc(exc)}</div>"
            pause = max(self.every, time.monotonic() - started)


def use_colour(stream: Any = None) -> bool:
    """Colour for a terminal that shows it: a tty, NO_COLOR unset, TERM not dumb (FORCE_COLOR forces it)."""
    if os.environ.get("FORCE_COLOR"):
        return True
    stream = stream or sys.stdout
    return (
        not os.environ.get("NO_COLOR")
        and os.environ.get("TERM") != "dumb"
        and hasattr(stream, "isatty")
        and stream.isatty()
    )


# -- HTML --------------------------------------------------------------------------------------------------
def _ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return "?"
    seconds = max(0, int((now - when).total_seconds()))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h"


def _errors(step: StepOverview) -> list[ErrorLine]:
    return [ErrorLine(e.kind, e.rows, e.example_key, e.example) for e in step.errors]


def _cost(step: StepOverview) -> str:
    """What the step's runs spent, and of it what its current answers cost (a redo's replaced answers, refusals
    and empty answers were paid too); "unknown" where a price or the usage is not known."""
    answers = f"{usd(step.cost_usd)} for {rows(step.paid_rows, 'paid row')}"
    if step.unpriced_rows:  # answers of a cost no one can tell (no price for the model, no usage sent): never "$0"
        known = f" and {answers}" if step.paid_rows else ""
        answers = f"cost unknown for {rows(step.unpriced_rows)}{known}"
    if step.unpriced_rows and not step.calls:
        return f"current answers {answers}"
    if not step.calls:
        return "nothing spent" if not step.paid_rows else f"current answers {answers}"
    spent = usd(None if step.spent_unknown else step.spent_usd, "cost unknown")
    return f"spent {spent} on {rows(step.calls, 'call')}; current answers {answers}"


def _flagged(step: StepOverview) -> list[str]:
    n = step.counts.get("flagged", 0)
    return [f"{rows(n)} flagged by a person; redo='flagged' re-sends them"] if n else []


def _claims(claims: list[Claims], now: datetime) -> list[str]:
    """Who holds the step's RUNNING rows; a holder whose process on this host is gone is said to be."""
    return [
        f"held by {c.claimed_by}: {rows(c.rows)}, claimed {_ago(c.since, now)} ago"
        + (" (its process is gone: the next run of the step takes them back)" if is_abandoned(c.claimed_by) else "")
        for c in claims
    ]


def _batch(b: BatchOverview, now: datetime) -> str:
    state = b.processing_status or ("being created" if b.state == "submitting" else b.state)
    return (
        f"{b.batch_id or '(being created)'}  {b.table}.{b.step}: {b.rows:,} rows in {b.requests:,} requests, "
        f"{state}, sent {_ago(b.submitted_at, now)} ago"
    )


def _nothing(overview: Overview, table: str | None) -> str:
    return "no llmledger steps" + (f" for table {table!r}" if table else "") + f" (tables: {overview.tables})"


def store_html(overview: Overview, *, name: str, read_at: datetime, table: str | None = None) -> str:
    now = utcnow()
    head = f"<b>llmledger · {esc(name)}</b> <span style='color:#777'>read at {read_at:%H:%M:%S} UTC</span>"
    if not overview.steps:
        return panel_html("llmledger-store", head, f"<div>{esc(_nothing(overview, table))}</div>")
    body, current = [], None
    for step in overview.steps:
        if step.table != current:
            current = step.table
            body.append(
                f"<div style='margin-top:6px'><b>{esc(current)}</b> <span style='color:#777'>"
                f"{step.counts.get('total', 0):,} rows</span></div>"
            )
        bar = parts(step.counts)
        extra = "".join(
            f"<div style='color:{SEGMENTS['RUNNING'].colour}'>{esc(c)}</div>" for c in _claims(step.claims, now)
        )
        extra += "".join(f"<div data-field='flagged' style='color:#ef6c00'>{esc(f)}</div>" for f in _flagged(step))
        body.append(
            f"<div class='llmledger-step' data-table='{esc(step.table)}' data-step='{esc(step.step)}' "
            f"style='display:flex;gap:10px;align-items:flex-start;margin:2px 0 6px 8px'>"
            f"<div style='width:150px;overflow:hidden;text-overflow:ellipsis'><b>{esc(step.step)}</b>"
            f"<div style='color:#777;font-size:85%' data-field='cost'>{esc(_cost(step))}</div></div>"
            f"<div style='flex:1'>{bar_html(bar)}{legend_html(bar)}{extra}{errors_html(_errors(step))}"
            f"</div></div>"
        )
    if overview.batches:
        rows = "".join(f"<div class='llmledger-batch'>{esc(_batch(b, now))}</div>" for b in overview.batches)
        body.append(f"<div style='margin-top:6px'><b>Message Batches in progress</b>{rows}</div>")
    return panel_html("llmledger-store", head, "".join(body))


# -- text --------------------------------------------------------------------------------------------------
def _plain(value: object, limit: int = 160) -> str:
    """One line of printable text: model output and error messages may hold newlines or terminal escapes."""
    text = " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def store_text(
    overview: Overview, *, name: str, read_at: datetime, table: str | None = None, colour: bool = False
) -> str:
    now = utcnow()
    lines = [f"llmledger · {name} · read at {read_at:%H:%M:%S} UTC"]
    if not overview.steps:
        return lines[0] + "\n" + _nothing(overview, table)
    width = max(len(s.step) for s in overview.steps)
    pad = " " * (width + 4)
    current = None
    for step in overview.steps:
        if step.table != current:
            current = step.table
            lines.append(f"{current} ({step.counts.get('total', 0):,} rows)")
        bar = parts(step.counts)
        lines.append(
            f"  {step.step:<{width}}  {bar_text(bar, 30, colour=colour)}  {legend_text(bar, colour=colour)}"
            f"  ({_cost(step)})"
        )
        lines.extend(pad + _plain(c) for c in _claims(step.claims, now) + _flagged(step))
        red = ("\x1b[31m", "\x1b[0m") if colour else ("", "")
        lines.extend(
            f"{pad}{red[0]}{e.count:,} rows: {_plain(e.kind, 80)}{red[1]}, e.g. {_plain(e.example_key, 60)}: "
            f"{_plain(e.detail)}"
            for e in _errors(step)
        )
    if overview.batches:
        lines.append("Message Batches in progress")
        lines.extend("  " + _plain(_batch(b, now), 200) for b in overview.batches)
    return "\n".join(lines)
