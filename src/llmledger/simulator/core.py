"""What the HTTP handler and the batch endpoints need of a running simulator.

`server.Simulator` holds the state (faults, counters, the token buckets, the prompt cache) and is the only
implementation; `http.py` and `batches.py` are typed against this protocol instead of importing it, so the
package's modules import one way only: server → http → batches → core → limits, request, replies → faults,
media → formats.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Protocol

from llmledger.simulator.chat import AutomaticCache
from llmledger.simulator.faults import ErrorSpec, Faults
from llmledger.simulator.limits import TokenLimits


class SimulatorCore(Protocol):
    faults: Faults
    batches: Any  # the SimBatches serving /v1/messages/batches
    openai_batches: Any  # the SimOpenAIBatches serving OpenAI's /v1/files and /v1/batches
    _lock: threading.Lock
    _rng: random.Random
    _tokens: TokenLimits
    _stats: dict[str, Any]
    chat_cache: AutomaticCache  # OpenAI's automatic prompt cache

    def configure(self, **changes: Any) -> None: ...

    def reset_stats(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def take(self, fault: str) -> bool: ...

    def count(self, name: str, n: int = 1) -> None: ...

    def shuffle(self, items: list[Any]) -> None: ...

    def draw(self) -> float: ...

    def _note(self, body: Any, status: int) -> None: ...

    def _decide(
        self, prompt: str, api_key: str | None, tokens_in: int = 0, max_out: int = 0
    ) -> tuple[str, ErrorSpec | None]: ...

    def _ratelimit_headers(self) -> dict[str, str]: ...

    def _openai_headers(self) -> dict[str, str]: ...

    def enter_slot(self) -> bool: ...

    def leave_slot(self) -> None: ...

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]: ...
