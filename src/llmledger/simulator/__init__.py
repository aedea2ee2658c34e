"""An offline stand-in for the Anthropic Messages API, for tests, demos and benchmarks.

`Simulator` (in `server.py`) serves `POST /v1/messages`, token counting and the Message Batches endpoints on
127.0.0.1 with the real API's bodies, headers, limits and faults; `simulate()` points every run in this
process at one. The modules import one way: server → http → batches → core → limits, request, replies → faults,
media → formats; `samples` makes files to send it.
"""

from llmledger.simulator.faults import ERRORS, ErrorSpec, Faults
from llmledger.simulator.media import count_tokens
from llmledger.simulator.replies import default_reply
from llmledger.simulator.samples import pdf, png, sample_documents
from llmledger.simulator.server import Simulator, simulate

__all__ = [
    "ERRORS",
    "ErrorSpec",
    "Faults",
    "Simulator",
    "count_tokens",
    "default_reply",
    "pdf",
    "png",
    "sample_documents",
    "simulate",
]
