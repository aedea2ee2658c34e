"""OpenAI's Responses API (`/v1/responses`) through the `openai` SDK: one call and its answer (its batches, OpenAI's
Batch API with `"url": "/v1/responses"`, are `openai_batches.py`'s). OpenAI recommends it, and its newer models get
features there first; a step on OpenAI's own API uses it unless the step was made with Chat Completions or asks for
it (`api="chat"`). The client, its errors and the account's stops are Chat Completions' (`chat.py`): the same SDK,
the same service. The pure values are `_step.apis.RESPONSES`.

How the API says things, and what llmledger makes of them:

- usage: `input_tokens` includes the cached part (`input_tokens_details.cached_tokens`) and, on models that bill
  them, the part written to the cache (`cache_write_tokens`); a Reply's `input_tokens` is the rest, priced as
  billed; `output_tokens` includes the reasoning;
- the answer is the text of its `message` output items; a `refusal` content item is a refusal, paid for;
- `status: "incomplete"` with `incomplete_details.reason` "max_output_tokens" is Anthropic's "max_tokens" (an
  empty one, all spent thinking, is no answer: `NO_ROOM`), "content_filter" a refusal.
"""

from __future__ import annotations

import functools
from typing import Any

from llmledger._exec.apis.chat import (
    NO_ROOM,
    batch_refusal,
    classify,
    has_key,
    is_client,
    load,
    make_client,
    openai_api,
    split_prompt,
)
from llmledger._exec.apis.chat import read_shutdown_dates as read_shutdown_dates
from llmledger._exec.client import REFUSAL, Api, CallFailed, Kind, Reply, clean_text
from llmledger._step.apis import RESPONSES

SHAPE = RESPONSES
__all__ = [
    "SHAPE",
    "api",
    "batch_refusal",
    "classify",
    "has_key",
    "is_client",
    "load",
    "make_client",
    "read_shutdown_dates",
]


async def call(client: Any, body: dict[str, Any]) -> tuple[Any, Any]:
    """(the parsed Response, the response headers) for exactly `body` (every field but the two the SDK requires
    goes through `extra_body`, so the body sent is the one fingerprinted)."""
    extra = {name: value for name, value in body.items() if name not in ("model", "input")}
    raw = await client.responses.with_raw_response.create(
        model=body["model"], input=body["input"], extra_body=extra or None
    )
    response = raw.parse()
    if not isinstance(getattr(response, "output", None), list):  # a proxy's HTML page, a gateway's error body
        said = str(response)[:120] if response is not None else "nothing"
        raise CallFailed(Kind.PERMANENT, f"invalid response: a 200 with no response object in it ({said!r})")
    return response, raw.headers


def _contents(response: Any) -> list[Any]:
    return [c for item in response.output if item.type == "message" for c in (item.content or [])]


def refused(response: Any) -> bool:
    reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
    return reason == "content_filter" or any(getattr(c, "type", "") == "refusal" for c in _contents(response))


def text_of(response: Any) -> str:
    return "".join(c.text or "" for c in _contents(response) if getattr(c, "type", "") == "output_text")


def useless(response: Any) -> str | None:
    """Why a paid answer is of no use: a refusal, or no text (cut at max_output_tokens: see NO_ROOM)."""
    if refused(response):
        return REFUSAL
    if not text_of(response).strip():
        reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
        if reason == "max_output_tokens":  # the Responses API's spelling of the advice
            return NO_ROOM.replace("{'reasoning_effort': 'low'}", "{'reasoning': {'effort': 'low'}}")
        return f"no answer: the response holds no text (status {getattr(response, 'status', None)!r})"
    return None


def _stop_reason(response: Any) -> str | None:
    if refused(response):
        return "refusal"
    if getattr(response, "status", None) == "incomplete":
        reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
        return "max_tokens" if reason == "max_output_tokens" else reason
    return "end_turn" if getattr(response, "status", None) == "completed" else getattr(response, "status", None)


def reply_from(response: Any, model: str, *, batch: bool = False) -> Reply:
    """The text and usage of a Response (an online answer, or a batch output line's body)."""
    usage = response.usage
    plain, cached, written = split_prompt(
        getattr(usage, "input_tokens", 0) or 0, getattr(usage, "input_tokens_details", None)
    )
    return Reply(
        text=clean_text(text_of(response)),
        input_tokens=plain,
        output_tokens=getattr(usage, "output_tokens", 0) or 0,
        stop_reason=_stop_reason(response),
        model=response.model or model,
        cache_write_tokens=written,
        cache_read_tokens=cached,
        batch=batch,
        counted=usage is not None,
        flex=getattr(response, "service_tier", None) == "flex",
    )


@functools.cache
def api() -> Api:
    """How the openai SDK's Responses are called and read (`client.send`)."""
    return openai_api(call, reply_from, useless)


def answer(body: dict[str, Any]) -> Any:
    """A batch output line's response, built as the SDK builds an online answer (leniently: an SDK older than a
    field the API added, or than an output item's type, still reads the rest)."""
    from openai.types.responses import Response

    return Response.construct(**body)
