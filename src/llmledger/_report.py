"""What a run did, in numbers a person reads at the end of a cell."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunReport:
    table: str
    step: str
    rows: int = 0  # rows in the frame
    selected: int = 0  # rows this run set out to send
    done: int = 0
    failed: int = 0
    needs_review: int = 0  # rows this run moved to NEEDS_REVIEW
    skipped: int = 0  # rows already DONE (or left for review) that cost nothing
    stale: int = 0  # DONE rows whose prompt/model/input changed, left alone
    running_elsewhere: int = 0
    released: int = 0  # claims given back unsent (interrupt, outage)
    calls: int = 0  # answered (paid) requests
    reused: int = 0  # rows answered by an identical request's answer, at no cost
    retries: int = 0  # transient failures that were retried
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0
    seconds: float = 0.0
    outcome: str = "completed"  # completed | interrupted | outage | auth | error
    message: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return max(0, self.selected - self.done - self.failed - self.needs_review)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        cost = "n/a" if self.cost_usd is None else f"${self.cost_usd:.4f}"
        parts = [f"{self.table}.{self.step}: {self.done:,} done", f"{self.failed:,} failed",
                 f"{self.needs_review:,} needs review", f"{self.skipped:,} skipped"]
        if self.stale:
            parts.append(f"{self.stale:,} stale")
        if self.running_elsewhere:
            parts.append(f"{self.running_elsewhere:,} running elsewhere")
        if self.outcome != "completed":
            parts.append(f"{self.remaining:,} not sent")
        if self.reused:
            parts.append(f"{self.reused:,} reused")
        parts.append(f"{self.calls:,} calls paid ({self.input_tokens:,} in / {self.output_tokens:,} out tokens, "
                     f"{cost})")
        line = " · ".join(parts) + f" in {self.seconds:.1f}s"
        if self.outcome != "completed":
            line = f"[{self.outcome}] " + line
        return line

    def hints(self) -> list[str]:
        """Next steps worth telling the user about."""
        out = []
        if self.stale:
            out.append(f"{self.stale:,} DONE rows are stale (model, system, prompt or row input changed since "
                       "they were answered); they were not re-sent. Pass redo='stale' to re-send exactly those.")
        if self.failed:
            out.append(f"{self.failed:,} rows FAILED; run the same call again to retry them.")
        if self.needs_review:
            out.append(f"{self.needs_review:,} rows need review (failed max_attempts times); see their "
                       f"{self.step}_error column, then rerun with redo=True and a where= naming them.")
        return out
