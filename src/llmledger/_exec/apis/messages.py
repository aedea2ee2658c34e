"""Anthropic's Messages API through the `anthropic` SDK: the client, one call, its answer, its errors, and Message
Batches. The pure values of the API (its body fields, bounds, limits) are `_step.apis.MESSAGES`.

The SDK takes over a second to import, so it is imported where a run sends: `import llmledger`, the CLI's readers
and the simulator start without it.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import AsyncIterator
from datetime import datetime
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from llmledger._exec.batch_api import BatchApi, BatchInfo, Item, _utc
from llmledger._exec.client import (
    REFUSAL,
    Api,
    CallFailed,
    Reply,
    _session_base_url_or_none,
    clean_text,
    error_detail,
    error_fields,
    platform_of,
    sdk_failure,
    status_failure,
)
from llmledger._ledger.states import Outcome
from llmledger._step.apis import MESSAGES

if TYPE_CHECKING:
    import anthropic

SHAPE = MESSAGES


def load() -> ModuleType:
    import anthropic

    return anthropic


def is_client(client: Any) -> bool:
    """Anthropic's own client, or Claude on Amazon Bedrock or Google Vertex AI (the SDK's clients for them)."""
    import anthropic

    return isinstance(client, anthropic.AsyncAnthropic) or cloud_of(client) is not None


_CLOUDS = {"bedrock": "Amazon Bedrock", "vertex": "Google Vertex AI"}


def cloud_of(client: Any) -> str | None:
    """The cloud platform a client reaches Claude through (its SDK client class, or a subclass), or None."""
    return _CLOUDS.get(platform_of(client) or "")


def batch_refusal(client: Any) -> str | None:
    """Why a run through `client` cannot send batches, or None: the clouds have batch mechanisms of their own
    (Bedrock's batch inference jobs, Vertex AI's batch predictions), which llmledger does not drive."""
    cloud = cloud_of(client)
    if cloud is None:
        return None
    return (
        f"mode='batch' sends Message Batches, and Claude on {cloud} has a batch mechanism of its own that llmledger "
        "does not drive: pass mode='online' (or send the step to Anthropic's API for batches)"
    )


def make_client(*, base_url: str | None, api_key: str | None, timeout: Any = None) -> Any:
    """An `anthropic.AsyncAnthropic` with the SDK's retries off (the sender retries, so the pacer sees every 429);
    `base_url` or `api_key` None: the SDK's own (its environment's)."""
    import anthropic

    kwargs: dict[str, Any] = {"max_retries": 0}
    for name, value in (("base_url", base_url), ("api_key", api_key), ("timeout", timeout)):
        if value is not None:
            kwargs[name] = value
    return anthropic.AsyncAnthropic(**kwargs)


def read_shutdown_dates(client: Any) -> None:
    """Anthropic's `GET /v1/models` says nothing of a model's lifecycle: the price table's dates are all there is."""


def has_key() -> bool:
    """Whether the environment has credentials for Anthropic's API."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


# error.details.error_code values that mean "this account cannot spend more now"
SPEND_LIMIT_CODES = {
    "enforced_spend_limit_reached",
    "contract_spend_limit_reached",
    "linked_organization_spend_limit_reached",
    "linked_organization_billing_unavailable",
}
# A 400 whose message says the account's usage limit or credit is exhausted (older accounts get no error_code).
_USAGE_LIMIT = re.compile(r"usage limit|credit balance is too low|spend limit", re.IGNORECASE)


def _details_code(error: dict[str, Any]) -> str | None:
    """Anthropic's `details.error_code`."""
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, dict) else None
    return code if isinstance(code, str) else None


def classify(exc: BaseException) -> CallFailed:
    """Map an SDK exception to what the run should do about it."""
    import anthropic

    if not isinstance(exc, anthropic.APIStatusError):
        return sdk_failure(exc, anthropic)
    status, headers = exc.status_code, exc.response.headers
    kind, message, code = error_fields(exc, _details_code)
    request_id = headers.get("request-id") or (exc.body.get("request_id") if isinstance(exc.body, dict) else None)
    stop = None
    if code == "organization_on_hold" or status in (401, 403):
        stop = Outcome.AUTH
    elif status == 404:  # the Messages endpoint exists, so it is the model: every row would fail alike
        stop = Outcome.NO_MODEL
    elif code in SPEND_LIMIT_CODES or status == 402 or (status == 400 and _USAGE_LIMIT.search(message)):
        stop = Outcome.SPEND_LIMIT
    return status_failure(exc, headers, error_detail(exc, kind, message, code, request_id), stop)


async def _messages_call(client: anthropic.AsyncAnthropic, body: dict[str, Any]) -> tuple[Any, Any]:
    required = {name: body[name] for name in ("model", "max_tokens", "messages")}
    extra = {name: value for name, value in body.items() if name not in required}
    raw = await client.messages.with_raw_response.create(**required, extra_body=extra or None)
    message = raw.parse()
    if inspect.isawaitable(message):  # anthropic >= 0.4x made parse() a coroutine on async clients
        message = await message
    return message, raw.headers


def _message_useless(message: Any) -> str | None:
    return REFUSAL if message.stop_reason == "refusal" else None


def reply_from(message: Any, model: str, *, batch: bool = False) -> Reply:
    """The text and usage of an SDK Message (an online answer, or a batch result's)."""
    usage = message.usage
    cache = getattr(usage, "cache_creation", None)
    text = "".join(getattr(block, "text", "") for block in message.content if block.type == "text")
    return Reply(
        text=clean_text(text),
        input_tokens=getattr(usage, "input_tokens", None) or 0,
        output_tokens=getattr(usage, "output_tokens", None) or 0,
        stop_reason=message.stop_reason,
        model=message.model or model,
        cache_write_tokens=getattr(usage, "cache_creation_input_tokens", None) or 0,
        cache_write_1h_tokens=(
            cache.get("ephemeral_1h_input_tokens")
            if isinstance(cache, dict)  # older SDKs
            else getattr(cache, "ephemeral_1h_input_tokens", None)
        )
        or 0,
        cache_read_tokens=getattr(usage, "cache_read_input_tokens", None) or 0,
        batch=batch,
        counted=usage is not None,
    )


def default_client(*, timeout: float | None = None) -> anthropic.AsyncAnthropic:
    """The real SDK, configured from the environment (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL), or pointed at
    the simulator `llmledger.simulate()` started (no key needed, nothing paid)."""
    session = _session_base_url_or_none()
    if session is not None:
        made = make_client(base_url=session, api_key="simulated", timeout=timeout)
    else:
        made = make_client(base_url=None, api_key=None, timeout=timeout)
    client: anthropic.AsyncAnthropic = made
    return client


@cache
def api() -> Api:
    """Anthropic's Messages API (made on first use, with the SDK)."""
    import anthropic

    return Api(
        _messages_call,
        reply_from,
        _message_useless,
        classify,
        anthropic.APIStatusError,
        anthropic.AnthropicError,
        anthropic.APITimeoutError,
    )


def batches(client: Any) -> BatchApi:
    return MessageBatches(client, api())


class MessageBatches(BatchApi):
    """Anthropic's Message Batches: the requests in the create call, the results streamed back."""

    provider = MESSAGES.provider
    max_requests = MESSAGES.batch_limit
    max_bytes = 256 * 1000 * 1000

    def _unsent_errors(self) -> tuple[type[BaseException], type[BaseException]]:
        import anthropic

        return anthropic.APIConnectionError, anthropic.NotFoundError

    def line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": body}

    async def create(self, lines: list[dict[str, Any]], intent: str) -> str:
        batch = await self.client.messages.batches.create(requests=lines)
        return str(batch.id)

    async def retrieve(self, batch_id: str) -> BatchInfo:
        return self._info(await self.client.messages.batches.retrieve(batch_id))

    async def cancel(self, batch_id: str) -> None:
        await self.client.messages.batches.cancel(batch_id)

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
