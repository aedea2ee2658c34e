"""What the batch sender and collector ask of a provider's batch API, in one small interface: Anthropic's Message
Batches (`apis/messages.py`), or OpenAI's Batch API (`apis/openai_batches.py`), chosen by `apis.batch_api_for`.

The sender, the collector and the merger (`batch.py`, `collect.py`, `merge.py`, `reconcile.py`) know batches only
through `BatchApi`: make one of request lines, look at one or at all, read its results as `Item`s. How the two APIs
differ stays here:

- Anthropic takes the requests in the create call; OpenAI takes an uploaded JSONL file (`purpose="batch"`) and a
  batch naming it, its endpoint and a 24 h window, and keeps `metadata`, so an OpenAI batch names its intent
  (`BatchInfo.intent`) and a lost create is found exactly, without reading results;
- Anthropic's batch ends `ended`; OpenAI's ends `completed`, `expired`, `cancelled` or `failed` (the file was
  refused: nothing ran), its results split between an output file (answers) and an error file (requests
  refused, with their HTTP status, or not run: `batch_expired`, `batch_cancelled`);
- limits: 100,000 requests or 256 MB for Anthropic, 50,000 requests or 200 MB for OpenAI, one model per file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmledger._exec.client import Api

INTENT_KEY = "llmledger_intent"  # the metadata an OpenAI batch carries its intent in
_PERMANENT = "invalid_request_error"  # an item the request itself caused (as `merge._PERMANENT_ITEM_ERRORS`)


@dataclass(frozen=True)
class BatchInfo:
    """One batch as a look at it shows it."""

    id: str
    created: datetime  # UTC, naive like the store's times
    requests: int
    ended: bool
    status: str  # the API's word for where it is, stored as the batch's processing_status
    ended_at: datetime | None = None
    intent: str | None = None  # the intent it names in its metadata (OpenAI's), when it does
    refused: str | None = None  # why the API ran none of it (OpenAI's `failed`: its file was refused)


@dataclass(frozen=True)
class Item:
    """One result line: `type` succeeded (with `answer`, the SDK's message or completion), errored (`error_kind`,
    `error_message`), expired or canceled. `reader`: the API that reads `answer`, when not the batch API's own (a
    batch sent with the step's earlier API: OpenAI's Batch API holds chat completions or responses alike)."""

    custom_id: str
    type: str
    answer: Any = None
    error_kind: str = ""
    error_message: str = ""
    reader: Api | None = None


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).replace(tzinfo=None)
    assert isinstance(value, datetime)
    return value.astimezone(UTC).replace(tzinfo=None)


class BatchApi:
    """The interface the batch sender, collector and merger use; each API's module in `_exec/apis` has one."""

    provider: str
    max_requests: int
    max_bytes: int

    def __init__(self, client: Any, api: Api) -> None:
        self.client, self.api = client, api
        self.classify: Callable[[BaseException], Any] = api.classify
        self.status_error: type[BaseException] = api.status_error  # an HTTP error answer (`.status_code`)
        self.connection_error, self.not_found = self._unsent_errors()
        self.error: type[BaseException] = api.sdk_error  # any error the SDK raises

    def _unsent_errors(self) -> tuple[type[BaseException], type[BaseException]]:
        """The SDK's errors for "the request never reached the API" and "no such batch"."""
        raise NotImplementedError

    def line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request of a batch, as the API takes it."""
        raise NotImplementedError

    async def create(self, lines: list[dict[str, Any]], intent: str) -> str:
        """Make a batch of `lines` (its intent named where the API keeps metadata); its id."""
        raise NotImplementedError

    async def retrieve(self, batch_id: str) -> BatchInfo:
        raise NotImplementedError

    async def cancel(self, batch_id: str) -> None:
        """Ask the API to stop a batch: what it finished stays in its results, the rest ends canceled."""
        raise NotImplementedError

    def list(self) -> AsyncIterator[BatchInfo]:
        """Newest first."""
        raise NotImplementedError

    def results(self, batch_id: str) -> AsyncIterator[Item]:
        raise NotImplementedError
