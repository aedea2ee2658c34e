"""What a run did, in numbers a person reads at the end of a cell: as a frame, as text and as HTML; and the
`Watcher` a run reports to while it goes (`_view.live` makes them; the run never imports a view).

`tally` holds a run's numbers and their words (`RunTally`), `panel` draws them as HTML (`run_html`: the live view and
the summary), `run_report` joins the two (`RunReport`: the tally a run keeps, shown in a notebook as its panel),
`pipeline_report` sums a pipeline's steps (`PipelineReport`), and `watcher` is the protocol a run reports to. The
names other layers use are re-exported here.
"""

from llmledger._report.panel import run_html
from llmledger._report.pipeline_report import PipelineReport
from llmledger._report.run_report import RunReport
from llmledger._report.watcher import Watcher

__all__ = ["PipelineReport", "RunReport", "Watcher", "run_html"]
