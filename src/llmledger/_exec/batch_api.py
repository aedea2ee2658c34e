"""What the batch sender and collector ask of a provider's batch API, in one small interface: Anthropic's Message
Batches, or OpenAI's Batch API (`batch_api_for`).

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

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmledger._exec.client import Api, api_for, is_openai_client
from llmledger._step.request import ANTHROPIC, OPENAI

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
    `error_message`), expired or canceled."""

    custom_id: str
    type: str
    answer: Any = None
    error_kind: str = ""
    error_message: str = ""


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).replace(tzinfo=None)
    assert isinstance(value, datetime)
    return value.astimezone(UTC).replace(tzinfo=None)


class BatchApi:
    """The interface, and Anthropic's Message Batches behind it."""

    provider = ANTHROPIC
    max_requests = 100_000
    max_bytes = 256 * 1000 * 1000

    def __init__(self, client: Any, api: Api) -> None:
        self.client, self.api = client, api
        self.classify: Callable[[BaseException], Any] = api.classify
        self.status_error: type[BaseException] = api.status_error  # an HTTP error answer (`.status_code`)
        self.connection_error, self.not_found = self._unsent_errors()
        self.error: type[BaseException] = api.sdk_error  # any error the SDK raises

    def _unsent_errors(self) -> tuple[type[BaseException], type[BaseException]]:
        """The SDK's errors for "the request never reached the API" and "no such batch"."""
        import anthropic  # imported where a run sends (`_exec/client.py`)

        return anthropic.APIConnectionError, anthropic.NotFoundError

    def line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": body}

    async def create(self, lines: list[dict[str, Any]], intent: str) -> str:
        batch = await self.client.messages.batches.create(requests=lines)
        return str(batch.id)

    async def retrieve(self, batch_id: str) -> BatchInfo:
        return self._info(await self.client.messages.batches.retrieve(batch_id))

    async def list(self) -> AsyncIterator[BatchInfo]:
        """Newest first."""
        async for batch in self.client.messages.batches.list(limit=100):
            yield self._info(batch)

    async def results(self, batch_id: str) -> AsyncIterator[Item]:
        async for item in await self.client.messages.batches.results(batch_id):
            result = item.result
            if result.type == "succeeded":
                yield Item(item.custom_id, "succeeded", result.message)
            elif result.type == "errored":
                error = result.error.error
                yield Item(
                    item.custom_id,
                    "errored",
                    error_kind=str(getattr(error, "type", "api_error")),
                    error_message=str(getattr(error, "message", "")),
                )
            else:
                yield Item(item.custom_id, str(result.type))

    def _info(self, batch: Any) -> BatchInfo:
        counts = batch.request_counts
        total = sum(
            int(getattr(counts, name, 0) or 0) for name in ("processing", "succeeded", "errored", "canceled", "expired")
        )
        return BatchInfo(
            str(batch.id),
            _utc(batch.created_at) or datetime.min,
            total,
            batch.processing_status == "ended",
            str(batch.processing_status),
            _utc(batch.ended_at),
        )


class OpenAIBatches(BatchApi):
    """OpenAI's Batch API: a JSONL file uploaded, a batch of it, its output and error files read back."""

    provider = OPENAI
    max_requests = 50_000
    max_bytes = 200 * 1000 * 1000
    endpoint = "/v1/chat/completions"
    _ENDED = frozenset({"completed", "expired", "cancelled", "failed"})

    def _unsent_errors(self) -> tuple[type[BaseException], type[BaseException]]:
        import openai  # present: the client is one of its

        return openai.APIConnectionError, openai.NotFoundError

    def line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}

    async def create(self, lines: list[dict[str, Any]], intent: str) -> str:
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
        uploaded = await self.client.files.create(file=(f"{intent}.jsonl", data), purpose="batch")
        batch = await self.client.batches.create(
            input_file_id=uploaded.id,
            endpoint=self.endpoint,
            completion_window="24h",
            metadata={INTENT_KEY: intent},
        )
        return str(batch.id)

    async def retrieve(self, batch_id: str) -> BatchInfo:
        return self._info(await self.client.batches.retrieve(batch_id))

    async def list(self) -> AsyncIterator[BatchInfo]:
        async for batch in self.client.batches.list(limit=100):
            yield self._info(batch)

    async def results(self, batch_id: str) -> AsyncIterator[Item]:
        batch = await self.client.batches.retrieve(batch_id)
        if batch.status == "failed":  # the file was refused: nothing ran, every row goes back
            return
        from openai.types.chat import ChatCompletion

        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            content = await self.client.files.content(file_id)
            for text in content.text.splitlines():
                if not text.strip():
                    continue
                line = json.loads(text)
                custom_id, response, error = line.get("custom_id", ""), line.get("response"), line.get("error")
                if response is None:  # not run: the window ended, or the batch was cancelled
                    code = (error or {}).get("code")
                    yield Item(custom_id, "expired" if code == "batch_expired" else "canceled")
                elif response.get("status_code") == 200:
                    yield Item(custom_id, "succeeded", ChatCompletion.model_validate(response["body"]))
                else:
                    status = int(response.get("status_code") or 500)
                    said = (response.get("body") or {}).get("error") or {}
                    permanent = 400 <= status < 500 and status not in (408, 409, 429)
                    yield Item(
                        custom_id,
                        "errored",
                        error_kind=_PERMANENT if permanent else str(said.get("type") or "api_error"),
                        error_message=f"{status} {said.get('message', '')}".strip(),
                    )

    def _info(self, batch: Any) -> BatchInfo:
        counts = batch.request_counts
        ended = batch.status in self._ENDED
        stamps = [getattr(batch, name, None) for name in ("completed_at", "expired_at", "cancelled_at", "failed_at")]
        at = next((t for t in stamps if t is not None), None) if ended else None
        intent = (batch.metadata or {}).get(INTENT_KEY)
        said = [f"{e.code}: {e.message}" for e in (batch.errors.data or [])] if batch.errors is not None else []
        return BatchInfo(
            str(batch.id),
            _utc(batch.created_at) or datetime.min,
            int(getattr(counts, "total", 0) or 0) if counts is not None else 0,
            ended,
            str(batch.status),
            _utc(at),
            intent if isinstance(intent, str) else None,
            ("; ".join(said) or "no reason given") if batch.status == "failed" else None,
        )


def batch_api_for(client: Any) -> BatchApi:
    """The batch API of a client: Anthropic's Message Batches, or OpenAI's Batch API."""
    api = api_for(client)
    return OpenAIBatches(client, api) if is_openai_client(client) else BatchApi(client, api)
