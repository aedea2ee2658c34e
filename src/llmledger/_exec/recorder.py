"""From an answer (or a refusal) to a result row, counted in the run's report.

Online answers and batch results become result rows the same way, so the
rules live here once: what a reused answer costs, how attempts count, when a
paid answer still needs a person (`validate=`, an answer not matching
`output=`), and what a row is billed (the batch rate for a batch's answer).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from llmledger._exec.client import Reply
from llmledger._ledger import Selection
from llmledger._ledger.states import Status, attempts_after, status_after_failure
from llmledger._report import RunReport
from llmledger._step.output import OutputSpec
from llmledger._step.prices import cost_usd, price_of
from llmledger._time import utcnow

if TYPE_CHECKING:
    from llmledger._exec.config import RunConfig


class Recorder:
    def __init__(self, *, selection: Selection, cfg: RunConfig, report: RunReport, output: OutputSpec | None) -> None:
        self.selection, self.cfg, self.report, self.output = selection, cfg, report, output

    def bill(self, reply: Reply) -> float | None:
        """Count a paid call in the report (calls, tokens, cache, cost); return its cost.

        Every billed reply comes through here: answers, and refusals that leave nothing to keep.
        """
        rep = self.report
        cost = cost_usd(reply)
        rep.calls += reply.calls
        rep.uncounted += 0 if reply.counted else reply.calls
        rep.input_tokens += reply.input_tokens
        rep.output_tokens += reply.output_tokens
        rep.cache_write_tokens += reply.cache_write_tokens
        rep.cache_read_tokens += reply.cache_read_tokens
        price = price_of(reply.model)
        if price is not None:
            scale = price.batch if reply.batch else 1.0
            rep.cache_saved_usd += reply.cache_read_tokens * (price.input - price.cache_read) * scale / 1e6
            if reply.batch and cost is not None:
                rep.batch_saved_usd += cost * (1 - price.batch) / price.batch
            elif reply.flex and cost is not None and price.flex:
                rep.flex_saved_usd += cost * (1 - price.flex) / price.flex
        rep.cost_usd = None if cost is None or rep.cost_usd is None else rep.cost_usd + cost
        return cost

    def result(self, row: dict[str, Any], reply: Reply | None, error: str | None, *, reused: bool) -> dict[str, Any]:
        """The result row for one answered (or refused) claimed row, counted in the report."""
        rep = self.report
        attempts = attempts_after(row["attempts"], was_done=row["was_done"])
        result: dict[str, Any] = {k: row[k] for k in self.selection.layout.key}
        result.update(batch_id=row.get("batch_id"), custom_id=row.get("custom_id"), pack_id=None)
        now = utcnow()
        refused_by_validate = False
        if reply is not None and error is None and self.cfg.validate is not None:
            error = self._validate(row, reply.text)
            refused_by_validate = error is not None
        if error:  # a validate= reason or an API message: PostgreSQL text holds no NUL, and the answer must commit
            error = error.replace("\x00", "\ufffd")
        cost: float | None = None
        if reply is not None:
            if reused:  # an identical request was answered already: nothing to pay
                reply = dataclasses.replace(
                    reply,
                    input_tokens=0,
                    output_tokens=0,
                    cache_write_tokens=0,
                    cache_write_1h_tokens=0,
                    cache_read_tokens=0,
                    latency_ms=None,
                )
                cost = 0.0 if reply.counted else None  # its twin's usage is unknown: so is the group's
            else:
                cost = self.bill(reply)
        if reply is not None and reply.useless:  # paid for, nothing to keep: a failure, with what it cost
            self._failed(result, row, attempts, error)
            result.update(**_usage(reply), cost_usd=cost, stop_reason=reply.stop_reason, model=reply.model)
        elif reply is not None:
            if reused:
                rep.reused += 1
            if error is None:
                rep.done += 1
                result.update(status=Status.DONE.value, output=reply.text, raw=None)
            else:  # paid for, but a person should look at it: refused by validate= (a valid answer, kept as
                rep.needs_review += 1  # the output) or not matching the output schema (kept as raw text)
                self.note_error(error, row)
                result.update(
                    status=Status.NEEDS_REVIEW.value,
                    output=reply.text if refused_by_validate else None,
                    raw=None if refused_by_validate else reply.text,
                )
            result.update(
                attempts=attempts,
                error=error,
                **_usage(reply),
                latency_ms=reply.latency_ms,
                cost_usd=cost,
                stop_reason=reply.stop_reason,
                model=reply.model,
                fingerprint=row["fingerprint"],
                finished_at=now,
                source=self.cfg.source,
                pack_id=reply.pack,
            )
        else:
            self._failed(result, row, attempts, error)
        return result

    def _failed(self, result: dict[str, Any], row: dict[str, Any], attempts: int, error: str | None) -> None:
        """A row the API refused (or answered with nothing to keep): FAILED, or NEEDS_REVIEW after its last try."""
        status = status_after_failure(attempts, self.cfg.max_attempts)
        if status is Status.FAILED:
            self.report.failed += 1
        else:
            self.report.needs_review += 1
        self.note_error(error or "", row)
        result.update(
            status=status.value,
            output=None,
            raw=None,
            attempts=attempts,
            error=error,
            input_tokens=None,
            output_tokens=None,
            cache_write_tokens=None,
            cache_read_tokens=None,
            latency_ms=None,
            cost_usd=None,
            stop_reason=None,
            model=self.selection.requests[row["version"]].model,
            fingerprint=None,
            finished_at=utcnow(),
            source=None,
        )

    def _validate(self, row: dict[str, Any], text: str) -> str | None:
        """Run the user's `validate(row, output)`: a returned string is why a person should look at the row."""
        assert self.cfg.validate is not None
        inputs = {k: row[k] for k in self.selection.layout.key}
        inputs.update({col: row.get("input." + col) for col in self.selection.inputs})
        try:
            value = self.output.value(text) if self.output is not None else text
            verdict = self.cfg.validate(inputs, value)
        except Exception as exc:
            return f"validate= raised {type(exc).__name__}: {exc}"
        if verdict is None or verdict == "":
            return None
        return str(verdict) if isinstance(verdict, str) else f"validate= returned {verdict!r} (not None or a str)"

    def note_error(self, message: str, row: dict[str, Any] | None = None, *, retried: bool = False) -> None:
        """Count the error by kind in the report, with the row it happened to as its example."""
        key = "" if row is None else ", ".join(f"{k}={row.get(k)!r}" for k in self.selection.layout.key)
        self.report.note_error(message, example_key=key, retried=retried)


def _usage(reply: Reply) -> dict[str, int | None]:
    """The token columns of a result: the reply's (zeros for a reused one), or NULL where the server sent no usage
    (tokens unknown, a twin's as the answer's)."""
    counted = reply.counted
    return {
        name: getattr(reply, name) if counted else None
        for name in ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")
    }
