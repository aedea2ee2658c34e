"""One Chat Completions call (OpenAI, or a server speaking its API), and what its errors mean for the run.

The twin of `client.py` for the `openai` SDK, an optional extra (`pip install 'llmledger[openai]'`): the same
`Reply` and the same `CallFailed` kinds, so the sender, the scheduler and the ledger do not know which API
answered. Why Chat Completions rather than the Responses API: every server that speaks OpenAI's API (vLLM,
Ollama, llama.cpp's server, OpenRouter, Together, Groq, Gemini's endpoint) speaks Chat Completions, and OpenAI's
Batch API takes it too; the Responses API is OpenAI's alone.

How OpenAI says things, and what llmledger makes of them:

- usage: `prompt_tokens` includes the cached part (`prompt_tokens_details.cached_tokens`), so a Reply's
  `input_tokens` is the rest and `cache_read_tokens` the cached part, priced as OpenAI bills them;
- `finish_reason` in Anthropic's words, as the ledger stores `{step}_stop_reason`: "stop" is "end_turn",
  "length" is "max_tokens", "content_filter" is "refusal";
- a refusal (`message.refusal`, or `finish_reason: "content_filter"`) is paid for and recorded as Anthropic's is;
- a 429 `insufficient_quota` (and a 402) is the account's stop, not a rate limit: the run stops at once.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

from llmledger._exec.client import (
    REFUSAL,
    Api,
    CallFailed,
    Kind,
    Reply,
    clean_text,
    error_detail,
    error_fields,
    sdk_failure,
    status_failure,
)
from llmledger._ledger.states import Outcome
from llmledger.errors import InvalidInputError

OPENAI_API = "https://api.openai.com/v1"  # the SDK's default base URL
# 429 codes that mean the account cannot spend (more) now: no wait clears them
QUOTA_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}


def openai_sdk() -> ModuleType:
    """The `openai` package, or a clear error saying how to install it."""
    try:
        return importlib.import_module("openai")
    except ImportError:
        raise InvalidInputError(
            "model='openai:...' sends with the official openai SDK, which is not installed: "
            "pip install 'llmledger[openai]'"
        ) from None


def make_client(*, base_url: str | None, api_key: str | None, timeout: Any = None) -> Any:
    """An `openai.AsyncOpenAI` with the SDK's retries off (the sender retries, so the pacer sees every 429)."""
    kwargs: dict[str, Any] = {"max_retries": 0, "base_url": base_url, "api_key": api_key}
    if timeout is not None:
        kwargs["timeout"] = timeout
    return openai_sdk().AsyncOpenAI(**kwargs)


async def call(client: Any, body: dict[str, Any]) -> tuple[Any, Any]:
    """(the parsed ChatCompletion, the response headers) for exactly `body` (every field but the two the SDK
    requires goes through `extra_body`, so the body sent is the one fingerprinted)."""
    extra = {name: value for name, value in body.items() if name not in ("model", "messages")}
    raw = await client.chat.completions.with_raw_response.create(
        model=body["model"], messages=body["messages"], extra_body=extra or None
    )
    completion = raw.parse()
    if not isinstance(getattr(completion, "choices", None), list):  # a proxy's HTML page, a gateway's error body
        said = str(completion)[:120] if completion is not None else "nothing"
        raise CallFailed(Kind.PERMANENT, f"invalid response: a 200 with no chat completion in it ({said!r})")
    return completion, raw.headers


# A reasoning model's thinking counts toward max_completion_tokens: a bound it spends thinking leaves an empty answer.
NO_ROOM = (
    "no answer: the model spent all of max_tokens before writing one (a reasoning model's thinking counts toward "
    "it): raise max_tokens=, or pass request_options={'reasoning_effort': 'minimal'}"
)


def _choice(completion: Any) -> Any:
    """The one answer asked for (llmledger never asks for several), or None."""
    return completion.choices[0] if completion.choices else None


def useless(completion: Any) -> str | None:
    """Why a paid answer is of no use: a refusal, no answer, or an empty one (cut at max_tokens: see NO_ROOM)."""
    if refused(completion):
        return REFUSAL
    choice = _choice(completion)
    if choice is None:
        return "no answer: the server returned no choice"
    if not (choice.message.content or "").strip():
        if choice.finish_reason == "length":
            return NO_ROOM
        return f"no answer: the server returned an empty message (finish_reason {choice.finish_reason!r})"
    return None


def refused(completion: Any) -> bool:
    choice = _choice(completion)
    return choice is not None and (
        bool(getattr(choice.message, "refusal", None)) or choice.finish_reason == "content_filter"
    )


def reply_from(completion: Any, model: str, *, batch: bool = False) -> Reply:
    """The text and usage of a ChatCompletion (an online answer, or a batch output line's body)."""
    choice = _choice(completion)
    text = (choice.message.content or "") if choice is not None else ""
    usage = completion.usage
    prompt = getattr(usage, "prompt_tokens", 0) or 0
    details = getattr(usage, "prompt_tokens_details", None)
    cached = min((getattr(details, "cached_tokens", None) or 0) if details is not None else 0, prompt)
    reason = choice.finish_reason if choice is not None else None
    return Reply(
        text=clean_text(text),
        input_tokens=prompt - cached,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        stop_reason="refusal" if refused(completion) else _STOP_REASONS.get(reason or "", reason),
        model=completion.model or model,
        cache_read_tokens=cached,
        batch=batch,
        counted=usage is not None,
    )


def classify(exc: BaseException) -> CallFailed:
    """Map an openai SDK exception to what the run should do about it (as `client.classify` does Anthropic's)."""
    sdk = openai_sdk()
    if not isinstance(exc, sdk.APIStatusError):
        return sdk_failure(exc, sdk)
    status, headers = exc.status_code, exc.response.headers
    kind, message, code = error_fields(exc, lambda error: error.get("code"))  # OpenAI's code is the error's own
    stop = None
    if status in (401, 403):
        stop = Outcome.AUTH
    elif status == 404:  # the endpoint exists, so it is the model: every row would fail alike
        stop = Outcome.NO_MODEL
    elif code in QUOTA_CODES or kind in QUOTA_CODES or status == 402:  # the account's stop, not a rate limit
        stop = Outcome.SPEND_LIMIT
    return status_failure(exc, headers, error_detail(exc, kind, message, code, headers.get("x-request-id")), stop)


@functools.cache
def chat_completions_api() -> Api:
    """How the openai SDK is called and read (`client.send`), made once the SDK is known to be installed."""
    sdk = openai_sdk()
    return Api(
        call,
        reply_from,
        useless,
        classify,
        sdk.APIStatusError,
        sdk.OpenAIError,
        sdk.APITimeoutError,
        counts_cached=True,
    )
