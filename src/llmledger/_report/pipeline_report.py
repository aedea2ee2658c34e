"""What one `pipeline()` call did (`PipelineReport`): each step's `RunReport` and their totals.

Its own module because it only sums `RunReport`s (as a frame, as text) and nothing about one run depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from llmledger._draw import usd
from llmledger._report.run_report import RunReport


@dataclass(repr=False)
class PipelineReport:
    """What one `pipeline()` call did: each step's report and their totals (`llmledger.last_report()` after it,
    so `.calls` and `.cost_usd` are the whole pipeline's)."""

    steps: dict[str, RunReport]

    def _sum(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.steps.values())

    @property
    def calls(self) -> int:
        return self._sum("calls")

    @property
    def done(self) -> int:
        return self._sum("done")

    @property
    def failed(self) -> int:
        return self._sum("failed")

    @property
    def stale(self) -> int:
        return self._sum("stale")

    @property
    def waiting(self) -> int:
        return self._sum("waiting")

    @property
    def cost_usd(self) -> float | None:
        costs = [r.cost_usd for r in self.steps.values()]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def frame(self) -> pl.DataFrame:
        """One row per step, then a `total` row: calls, cost, rows done / failed / for review, stale, waiting."""
        names = ("calls", "done", "failed", "needs_review", "stale", "waiting")
        rows_ = [
            {"step": step, **{n: getattr(r, n) for n in names}, "cost_usd": r.cost_usd, "seconds": round(r.seconds, 2)}
            for step, r in self.steps.items()
        ]
        rows_.append(
            {
                "step": "total",
                **{n: self._sum(n) for n in names},
                "cost_usd": self.cost_usd,
                "seconds": round(sum(r.seconds for r in self.steps.values()), 2),
            }
        )
        return pl.DataFrame(rows_, schema_overrides={"cost_usd": pl.Float64})

    def __str__(self) -> str:
        cost = usd(self.cost_usd, "cost unknown")
        extra = "".join(
            f" · {n:,} {what}"
            for n, what in ((self.stale, "stale"), (self.waiting, "waiting"), (self.failed, "failed"))
            if n
        )
        return (
            f"pipeline of {len(self.steps)} steps: {self.calls:,} calls paid ({cost}) · {self.done:,} done"
            f"{extra}\n" + "\n".join(f"  {r}" for r in self.steps.values())
        )

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return self.frame()._repr_html_()
