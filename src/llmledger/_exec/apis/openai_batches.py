"""OpenAI's Batch API (a JSONL file uploaded, a batch of it, its output and error files read back), one for both of
OpenAI's APIs: a batch's lines name their endpoint (`/v1/chat/completions` or `/v1/responses`), and its output file
holds chat completions or responses alike.

Its own module, above `chat.py` and `responses.py`, because reading a batch's results needs both: each output line
is read by the API its answer is of (its `object`), not by the step's current one, so a batch sent before a step
moved from Chat Completions to Responses, or back, is read as what it holds. `apis.batch_api_for` chooses it for an
`openai` client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from llmledger._exec.apis import chat, responses
from llmledger._exec.batch_api import _PERMANENT, INTENT_KEY, BatchApi, BatchInfo, Item, _utc
from llmledger._exec.client import Api
from llmledger._step.apis import CHAT


def batches(client: Any, api: str | None = None) -> BatchApi:
    """The Batch API of an `openai` client, its lines written for `api` ("responses"; None: Chat Completions) and
    under Azure's paths for an Azure OpenAI client."""
    if api == "responses":
        return ResponsesBatches(client, responses.api())
    return (AzureBatches if chat.own_rules(client) else OpenAIBatches)(client, chat.api())


class OpenAIBatches(BatchApi):
    """OpenAI's Batch API: a JSONL file uploaded, a batch of it, its output and error files read back."""

    provider = CHAT.provider
    max_requests = CHAT.batch_limit
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

    async def cancel(self, batch_id: str) -> None:
        await self.client.batches.cancel(batch_id)

    async def list(self) -> AsyncIterator[BatchInfo]:
        async for batch in self.client.batches.list(limit=100):
            yield self._info(batch)

    async def results(self, batch_id: str) -> AsyncIterator[Item]:
        batch = await self.client.batches.retrieve(batch_id)
        if batch.status == "failed":  # the file was refused: nothing ran, every row goes back
            return

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
                    answer, reader = self.answer(response["body"])
                    yield Item(custom_id, "succeeded", answer, reader=reader)
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

    def answer(self, body: dict[str, Any]) -> tuple[Any, Api]:
        """An output line's answer as the SDK's type, and the API that reads it: told by the answer's own `object`,
        not by the step's current API (a batch sent before the step moved from Chat Completions to Responses, or
        back, is read as what it holds)."""
        if body.get("object") == "response":
            return responses.answer(body), responses.api()
        from openai.types.chat import ChatCompletion  # present: the client is one of the SDK's

        return ChatCompletion.model_validate(body), chat.api()

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


class AzureBatches(OpenAIBatches):
    """Azure OpenAI's Batch API (a global batch deployment, reached through `AsyncAzureOpenAI`): OpenAI's files and
    batches under Azure's `/openai/` path, each line's `url` without `/v1` (Microsoft's "getting started with batch
    deployments" page) and its `model` the deployment's name, as online. Azure does not expire a batch that runs
    past its 24 h target; results come back as OpenAI's."""

    endpoint = "/chat/completions"


class ResponsesBatches(OpenAIBatches):
    """OpenAI's Batch API with Responses lines: the same files and batches, another endpoint and answer type."""

    endpoint = "/v1/responses"
