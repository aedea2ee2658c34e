"""A run's report (`RunReport`): its numbers and words (`tally.RunTally`), shown in a notebook as the HTML panel
`panel.py` draws of them.

Its own module, above both, because a notebook shows an object by its own `_repr_html_`: the one report class
every layer above the ledger writes to or reads is the tally that draws itself; the numbers (`tally.py`) and the
drawing (`panel.py`) stay apart below it, and a pipeline's sum of reports is `pipeline_report.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmledger._report.panel import run_html
from llmledger._report.tally import RunTally


@dataclass(repr=False)
class RunReport(RunTally):
    """What one run did (see `RunTally`), drawn as one HTML panel where a notebook shows it."""

    def _repr_html_(self) -> str:
        return run_html(self)
