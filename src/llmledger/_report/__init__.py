"""What a run did, in numbers a person reads at the end of a cell: as a frame, as text and as HTML; and the
`Watcher` a run reports to while it goes (`_view.live` makes them; the run never imports a view).

`run_report` holds a run's numbers and their words (`RunReport`), `pipeline_report` the sum of a pipeline's steps
(`PipelineReport`), `panel` draws a run's report as HTML (`run_html`: the live view and the summary), and `watcher`
is the protocol a run reports to. The names other layers use are re-exported here.
"""

from llmledger._report.panel import run_html
from llmledger._report.pipeline_report import PipelineReport
from llmledger._report.run_report import RunReport
from llmledger._report.watcher import Watcher

__all__ = ["PipelineReport", "RunReport", "Watcher", "run_html"]
