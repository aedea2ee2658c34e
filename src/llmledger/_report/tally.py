"""A run's numbers (`RunTally`): what it found, sent, paid and avoided, counted as it goes, and said in words at
the end (`str()`, `hints()`, `progress_frame()`).

Its own module, below `panel.py` (which draws a tally as HTML) and `run_report.py` (`RunReport`, the tally a run
keeps, which draws itself so in a notebook), so that the drawing reads the numbers and the numbers know no drawing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import polars as pl

from llmledger._draw import ErrorLine, Parts, error_kind, parts, rows, usd
from llmledger._ledger.states import Outcome

PAID_FIGURES = (
    "done",
    "failed",
    "needs_review",
    "calls",
    "reused",
    "retries",
    "input_tokens",
    "output_tokens",
    "cost_usd",
)


@dataclass(repr=False)
class RunTally:
    table: str
    step: str
    rows: int = 0  # rows in the frame
    selected: int = 0  # rows this run set out to send
    done: int = 0
    failed: int = 0
    needs_review: int = 0  # rows this run moved to NEEDS_REVIEW
    skipped: int = 0  # rows already DONE (or left for review) that cost nothing
    stale: int = 0  # DONE rows whose request (or an upstream step's answer) changed, left alone
    kept_stale: int = 0  # of such rows, those a person accepted or wrote: every redo but a named one keeps them
    kept_flagged: int = 0  # flagged rows redo='flagged' kept: a person wrote their answers
    waiting: int = 0  # rows that need an answer but wait for the steps their prompt reads
    running_elsewhere: int = 0
    unprepared: int = 0  # (resume) rows whose request is not the current definition's: apply_llm must prepare them
    released: int = 0  # claims given back unsent (interrupt, outage)
    calls: int = 0  # answered (paid) requests
    reused: int = 0  # rows answered by an identical request's answer, at no cost
    retries: int = 0  # transient failures that were retried
    input_tokens: int = 0
    output_tokens: int = 0
    uncounted: int = 0  # paid calls whose server sent no usage: their tokens (and cost) are unknown, not counted
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    cache_saved_usd: float = 0.0  # what the cache reads would have cost as plain input, less what they cost
    batch_saved_usd: float = 0.0  # what the batch answers would have cost online, less what they cost
    flex_saved_usd: float = 0.0  # what the flex answers would have cost at the standard tier, less what they cost
    standard_for_deadline: int = 0  # mode="flex": requests sent at the standard tier to meet the deadline
    online_for_deadline: int = 0  # mode="batch": rows taken out of batches (or not sent in one) and sent online
    past_deadline: bool = False  # this call found a deadline's last moment for the step's batches passed: the rows
    # they gave back go online, not in another batch
    done_saved_usd: float = 0.0  # what the skipped rows (DONE already) would cost again, at the step's average
    submitted: int = 0  # rows this run sent in Message Batches
    downstream_stale: dict[str, int] = field(default_factory=dict)  # stale rows in steps reading this one, after
    null_fields: tuple[str, ...] = ()  # template fields null in some rows of the frame
    null_rows: int = 0  # rows of the frame with such a null (sent with empty text, unless skip_nulls)
    skip_nulls: bool = False
    batches: int = 0  # Message Batches this run created
    batch_requests: int = 0  # requests in them (rows with identical requests share one)
    in_batches: int = 0  # rows of the step in batches still processing when the run ended
    collected: int = 0  # rows answered (or refused) by batches this run merged
    recovered: int = 0  # answers a dead run (kill -9, a lost kernel) had paid for, found in its journal and kept
    mode: str = "online"  # how this run sent rows: "online" or "batch"
    returned: int = 0  # rows batches gave back unanswered (expired, canceled, the API's own errors)
    batch_pending: int = 0  # rows this run sent in batches that have not come back yet
    early_finished: int = 0  # rows finished by merging earlier batches before this run selected its rows
    notes: list[str] = field(default_factory=list)  # what the user should know: the step's batches, the server
    cost_usd: float | None = 0.0
    seconds: float = 0.0
    outcome: Outcome = Outcome.COMPLETED
    message: str = ""
    errors: list[str] = field(default_factory=list)  # the last few
    error_kinds: dict[str, ErrorLine] = field(default_factory=dict)  # every error so far, by kind (`error_kind`)
    rate_limited: int = 0  # retries that were 429s
    binding_limit: str = ""  # the announced rate limit that paces the run ("output tokens: 80,000/min")
    done_before: int = 0  # DONE rows of the frame (fresh) this run left alone
    review_before: int = 0  # NEEDS_REVIEW rows of the frame this run left alone
    max_cost_usd: float | None = None  # the run's budget
    spent_before_usd: float = 0.0  # what earlier runs of the step spent, when the budget is the step's
    simulated: bool = False  # answered by the bundled simulator (`llmledger.simulate()`, or a client pointed at one)
    unsent: int = 0  # rows given back unsent because their files are not as recorded (attach=)
    unsent_why: str = ""  # the last such reason
    unsimulated: int = 0  # rows whose simulated answer this run (against a real endpoint) set aside to ask for real
    in_flight: int = 0
    started: float = field(default_factory=time.monotonic)

    _SUMMED = (
        "done",
        "failed",
        "needs_review",
        "reused",
        "calls",
        "input_tokens",
        "output_tokens",
        "uncounted",
        "recovered",
        "cache_write_tokens",
        "cache_read_tokens",
        "cache_saved_usd",
        "batch_saved_usd",
        "flex_saved_usd",
        "standard_for_deadline",
        "online_for_deadline",
    )

    def absorb(self, other: RunTally) -> None:
        """Add what `other` counted (rows answered, calls, tokens, cost, errors) to this report."""
        for name in self._SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cost_usd = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        self.errors[:] = (self.errors + other.errors)[-5:]
        for kind, line in other.error_kinds.items():
            mine = self.error_kinds.get(kind)
            self.error_kinds[kind] = line if mine is None else replace(line, count=mine.count + line.count)

    def note_error(self, message: str, *, example_key: str = "", retried: bool = False) -> None:
        """Count an error by its kind, keeping the last one (and its row) as the kind's example."""
        self.errors.append(message)
        del self.errors[:-5]
        kind = error_kind(message)
        group = kind + (" (retried)" if retried else "")
        count = self.error_kinds[group].count if group in self.error_kinds else 0
        self.error_kinds[group] = ErrorLine(kind, count + 1, example_key, message, retried)
        if retried and message.startswith("429"):
            self.rate_limited += 1

    def error_lines(self, limit: int = 5) -> list[ErrorLine]:
        """The commonest kinds of error, rows' failures before the API's retried ones."""
        return sorted(self.error_kinds.values(), key=lambda e: (e.retried, -e.count))[:limit]

    def bar(self) -> Parts:
        """The frame's rows as bar segments: what this run found, plus what it has done so far.

        The counts found before sending (stale, NEEDS_REVIEW and DONE rows) include rows a redo re-sends;
        what would take the bar past the frame's rows comes off them, so each row is drawn once.
        """
        before = {"stale": self.stale, "NEEDS_REVIEW": self.review_before, "DONE": self.done_before}
        now = {
            "DONE": self.done,
            "RUNNING": self.in_flight + self.running_elsewhere,
            "SUBMITTED": max(self.in_batches, self.batch_pending),
            "FAILED": self.failed,
            "NEEDS_REVIEW": self.needs_review,
        }
        over = sum(before.values()) + sum(now.values()) - self.rows
        for name in before:
            cut = min(max(over, 0), before[name])
            before[name] -= cut
            over -= cut
        counts = {
            **now,
            "DONE": now["DONE"] + before["DONE"],
            "stale": before["stale"],
            "waiting": self.waiting,
            "NEEDS_REVIEW": now["NEEDS_REVIEW"] + before["NEEDS_REVIEW"],
        }
        counts["NOT_STARTED"] = max(0, self.rows - sum(counts.values()))  # every row once, as in the store's counts
        return parts(counts)

    @property
    def sent(self) -> int:
        """Selected rows this run has finished or handed to a Message Batch."""
        return self.done + self.failed + self.needs_review - self.early_finished + self.batch_pending

    @property
    def projected_usd(self) -> float | None:
        """What the run will have cost when every selected row is answered, at its average so far."""
        finished = self.done + self.failed + self.needs_review
        if self.cost_usd is None or not finished:
            return None
        return self.cost_usd + self.cost_usd / finished * (self.remaining + self.batch_pending)

    @property
    def remaining(self) -> int:
        """Selected rows neither finished nor waiting in a batch."""
        finished = self.done + self.failed + self.needs_review - self.early_finished
        return max(0, self.selected - finished - self.batch_pending)

    @property
    def avoided(self) -> dict[str, float]:
        """What this run did not pay, by reason: rows DONE already (at the step's average paid answer),
        reused answers (at this run's average call), cache reads, the batch discount."""
        per_call = (self.cost_usd or 0.0) / self.calls if self.calls else 0.0
        return {
            "rows already done": self.done_saved_usd,
            "reused answers": self.reused * per_call,
            "cache reads": self.cache_saved_usd,
            "batch prices": self.batch_saved_usd,
            "flex prices": self.flex_saved_usd,
        }

    def avoided_reasons(self) -> str:
        """The reasons with a saving, as text: "rows already done $0.0123, batch prices $0.0040"."""
        return ", ".join(f"{why} {usd(dollars)}" for why, dollars in self.avoided.items() if dollars)

    @property
    def avoided_usd(self) -> float | None:
        """What this run did not pay, in all (see `avoided`); None when the model has no known price."""
        if self.cost_usd is None:
            return None
        return sum(self.avoided.values())

    @property
    def elapsed(self) -> float:
        if self.outcome in (Outcome.PREPARING, Outcome.RUNNING):
            return time.monotonic() - self.started
        return self.seconds

    @property
    def rate(self) -> float:
        """Rows finished per second so far."""
        finished = self.done + self.failed + self.needs_review
        return finished / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if self.outcome != Outcome.RUNNING or not self.rate:
            return None
        return self.remaining / self.rate

    def progress_frame(self) -> pl.DataFrame:
        fields = [
            "table",
            "step",
            "outcome",
            "rows",
            "selected",
            "remaining",
            "in_flight",
            "done",
            "failed",
            "needs_review",
            "skipped",
            "stale",
            "waiting",
            "reused",
            "calls",
            "retries",
            "submitted",
            "in_batches",
            "input_tokens",
            "output_tokens",
            "cache_write_tokens",
            "cache_read_tokens",
            "cost_usd",
            "avoided_usd",
            "elapsed",
            "rate",
            "eta",
        ]
        values = {f: getattr(self, f) for f in fields}
        values["outcome"] = str(self.outcome)
        return pl.DataFrame(
            [values], schema_overrides={"cost_usd": pl.Float64, "avoided_usd": pl.Float64, "eta": pl.Float64}
        )

    def __repr__(self) -> str:
        return str(self)

    def paid_figures(self, *, plus: RunTally | None = None) -> dict[str, Any]:
        """The columns of the run's row in `llmledger_runs` that grow as it goes (with `plus`'s added: a batch
        being merged): written with every chunk it commits (so a run killed mid-way still shows what it paid) and
        once more when it ends. A cost unknown on either side is unknown."""
        mine = {name: getattr(self, name) for name in PAID_FIGURES}
        if plus is None:
            return mine
        return {k: None if v is None or getattr(plus, k) is None else v + getattr(plus, k) for k, v in mine.items()}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": str(self.outcome)}

    def __str__(self) -> str:
        cost = usd(self.cost_usd, "cost unknown")
        parts = [
            f"{self.table}.{self.step}: {self.done:,} done",
            f"{self.failed:,} failed",
            f"{self.needs_review:,} needs review",
            f"{self.skipped:,} skipped",
        ]
        batches = (
            f"sent in {self.batches:,} new batch{'es' if self.batches != 1 else ''} of "
            f"{self.batch_requests:,} request{'s' if self.batch_requests != 1 else ''}"
        )
        counts = [
            (self.unsimulated, "simulated answers set aside to ask for real"),
            (self.stale, "stale"),
            (self.waiting, "waiting"),
            (self.running_elsewhere, "running elsewhere"),
            (self.unprepared, "not prepared"),
            (self.remaining if self.outcome != "completed" else 0, "not sent"),
            (self.unsent, "not sent (their files are not as recorded)"),
            (self.reused, "reused"),
            (self.collected, "of them from batches"),
            (self.submitted, batches),
            (self.in_batches, "in batches still processing"),
        ]
        parts.extend(f"{n:,} {what}" for n, what in counts if n)
        cached = (
            f", {self.cache_read_tokens:,} read from / {self.cache_write_tokens:,} written to the cache"
            if self.cache_read_tokens or self.cache_write_tokens
            else ""
        )
        avoided = self.avoided_usd
        saved = f"; {usd(avoided)} avoided: {self.avoided_reasons()}" if avoided else ""
        parts.append(
            f"{self.calls:,} calls paid ({self.input_tokens:,} in / {self.output_tokens:,} out tokens"
            f"{f', usage unknown for {self.uncounted:,}' if self.uncounted else ''}{cached}, {cost}{saved})"
        )
        line = " · ".join(parts) + f" in {self.seconds:.1f}s"
        if self.outcome != "completed":
            line = f"[{self.outcome}] " + line
        return line

    def stale_hint(self) -> str:
        verb = "is" if self.stale == 1 else "are"
        return (
            f"{rows(self.stale, 'DONE row')} {verb} stale (their request changed since they were answered: "
            "model, system, prompt, options, or the row's input or files); they were not re-sent. Pass "
            "redo='stale' to re-send exactly those."
        )

    def elsewhere_hint(self) -> str:
        verb = "is" if self.running_elsewhere == 1 else "are"
        return (
            f"{rows(self.running_elsewhere)} {verb} being answered by another run on this store right now (another "
            "kernel, process or worker): they were left to it, and show RUNNING without an answer here. Run the "
            "same call again once that run ends to get their answers at no cost; llmledger.show(store) follows it."
        )

    def hints(self) -> list[str]:
        """Next steps worth telling the user about."""
        out = []
        if self.recovered:  # found in a trial: merged answers appeared in no report
            out.append(
                f"{rows(self.recovered, 'answer')} that a run which died (kill -9, a lost kernel) had paid for "
                "were found in its journal and kept: not asked again."
            )
        if self.unsent:
            out.append(
                f"{rows(self.unsent)} not sent, left as they were and unpaid: their files are not as the "
                f"ledger recorded them ({self.unsent_why.removeprefix('not sent: ')}). Run apply_llm again "
                "with the frame to record the files as they are now; then they are sent."
            )
        if self.stale:
            out.append(self.stale_hint())
        if self.standard_for_deadline:
            out.append(
                f"{rows(self.standard_for_deadline, 'request')} went at the standard tier, at the standard price: at "
                "the flex tier's pace the rows would have missed the deadline."
            )
        if self.online_for_deadline:
            listed = (self.cost_usd or 0.0) + self.batch_saved_usd
            out.append(
                f"The deadline sent {rows(self.online_for_deadline)} online that batches had not answered in time. "
                f"This run paid {usd(self.cost_usd or 0.0)} against {usd(listed)} at list price: batches saved "
                f"{usd(self.batch_saved_usd)}. Nothing was paid twice: a batch's rows go online only once it has "
                "ended, its finished answers kept."
            )
        if self.running_elsewhere:
            out.append(self.elsewhere_hint())
        if self.kept_stale:
            out.append(
                f"{rows(self.kept_stale, 'stale answer')} kept: a person accepted or wrote "
                f"{'it' if self.kept_stale == 1 else 'them'}, and no redo replaces that but redo=True with where= "
                "naming the rows."
            )
        if self.kept_flagged:
            out.append(
                f"{rows(self.kept_flagged, 'flagged row')} kept: a person wrote "
                f"{'its answer' if self.kept_flagged == 1 else 'their answers'}, which no redo replaces but "
                "redo=True with where= naming the rows; llmledger.undo_verdict takes a correction back."
            )
        if self.downstream_stale:
            made = ", ".join(f"{rows(n)} of step {s!r}" for s, n in self.downstream_stale.items())
            out.append(
                f"Steps reading this one are stale where its answers changed: {made}. Run them with "
                "redo='stale' to re-send exactly those rows."
            )
        if self.null_rows:
            fields = ", ".join(f"{{{f}}}" for f in self.null_fields)
            out.append(
                f"{rows(self.null_rows)} of the frame {'has' if self.null_rows == 1 else 'have'} a null in "
                f"{fields}: "
                + (
                    "left unsent (skip_nulls=True)."
                    if self.skip_nulls
                    else "the prompt shows it as empty text (an attached column: no file). Pass "
                    "skip_nulls=True to leave such rows unsent."
                )
            )
        if self.unsimulated:
            out.append(
                f"{rows(self.unsimulated)} of the step held answers made by the simulator; a run against "
                "the real API never counts those as done: they were set back to NOT_STARTED (the simulated "
                "answers are kept in llmledger_history, reason 'simulated answer'), and every run asks "
                "for the ones it selects for real."
            )
        if self.outcome == "budget":
            out.append(self.message)
        out.extend(self.notes)
        if self.returned:
            out.append(
                f"{rows(self.returned)} came back from their batch unanswered (expired, canceled, or the "
                "API's own error); they are as they were before, unpaid, and the next call sends them."
            )
        if self.in_batches:
            out.append(
                f"{rows(self.in_batches)} are in Message Batches the API is still processing (usually "
                "minutes, at most 24 h). Run the same call again (or `llmledger run`) to collect them; "
                "they are never sent twice."
                + (
                    " (Simulated batches live in this kernel's simulator: collect them here; a run in "
                    "another kernel or process asks their rows again of its own simulator, at no cost.)"
                    if self.simulated
                    else ""
                )
            )
        if self.waiting:
            out.append(
                f"{rows(self.waiting)} wait for the steps their prompt reads (not DONE there yet, or "
                "stale there); finish those steps first."
            )
        if self.failed and self.outcome == Outcome.BAD_REQUEST:  # a refusal that would repeat: not "retry"
            out.append(f"{rows(self.failed)} FAILED with the API's refusal above; change the call, then run it.")
        elif self.failed:
            out.append(f"{rows(self.failed)} FAILED; run the same call again to retry them.")
        if self.unprepared:
            out.append(
                f"{rows(self.unprepared)} have no request for the step's current definition (their inputs "
                "or the step changed since apply_llm last prepared them); run apply_llm with the frame to "
                "prepare and send them."
            )
        if self.needs_review:
            out.append(
                f"{rows(self.needs_review)} need review (refused max_attempts times, an answer not "
                f"matching output=, or refused by validate=); see their {self.step}_error and {self.step}_raw "
                f"columns, then llmledger.flag(...) them and rerun with redo='flagged'."
            )
        return out
