"""OpenAI's Chat Completions through the `openai` SDK (OpenAI, or a server speaking its API): the client, one call, its
answer and what its errors mean for the run (its Batch API, which holds Responses too, is `openai_batches.py`). The
pure values are `_step.apis.CHAT`.

The twin of `client.py` for the `openai` SDK, an optional extra (`pip install 'llmledger[openai]'`): the same
`Reply` and the same `CallFailed` kinds, so the sender, the scheduler and the ledger do not know which API
answered. Every server that speaks OpenAI's API (vLLM, Ollama, llama.cpp's server, OpenRouter, Together, Groq,
Gemini's endpoint) speaks Chat Completions, so a step on one uses it; a step on OpenAI's own API uses the Responses
API (`responses.py`) unless it was made with Chat Completions or asks for it.

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
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import date
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
    is_openai_client,
    platform_of,
    sdk_failure,
    shown_url,
    status_failure,
)
from llmledger._ledger.states import Outcome
from llmledger._step.apis import CHAT
from llmledger._step.models import learn_shutdown
from llmledger.errors import InvalidInputError

# 429 codes that mean the account cannot spend (more) now: no wait clears them
QUOTA_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}


SHAPE = CHAT


def load() -> ModuleType:
    return openai_sdk()


def is_client(client: Any) -> bool:
    """An `openai.AsyncOpenAI` (or a subclass: Azure's), told by class without importing the SDK first."""
    return is_openai_client(client) and isinstance(client, openai_sdk().AsyncOpenAI)


def has_key() -> bool:
    return bool(os.environ.get("OPENAI_API_KEY"))


def own_rules(client: Any) -> bool:
    """Whether `client` reaches OpenAI's own service at another URL (Azure OpenAI), so OpenAI's own rules apply
    (its reasoning models refuse `max_tokens`)."""
    return platform_of(client) == "azure"


def batch_refusal(client: Any) -> str | None:
    """Why `client` cannot send batches, or None: an OpenAI client sends them where the server has them (OpenAI's
    own API, a gateway, Azure OpenAI's global batch deployments)."""
    return None


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
NO_ROOM_HEAD = "no answer: the model spent all of max_tokens before writing one"  # every API's words begin so
NO_ROOM = (
    f"{NO_ROOM_HEAD} (a reasoning model's thinking counts toward it): raise max_tokens=, or pass "
    "request_options={'reasoning_effort': 'low'}"
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
    plain, cached, written = split_prompt(
        getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "prompt_tokens_details", None)
    )
    reason = choice.finish_reason if choice is not None else None
    return Reply(
        text=clean_text(text),
        input_tokens=plain,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        stop_reason="refusal" if refused(completion) else _STOP_REASONS.get(reason or "", reason),
        model=completion.model or model,
        cache_write_tokens=written,
        cache_read_tokens=cached,
        batch=batch,
        counted=usage is not None,
        flex=getattr(completion, "service_tier", None) == "flex",
    )


def split_prompt(prompt: int, details: Any) -> tuple[int, int, int]:
    """(plain input, cached, written to the cache) of an OpenAI answer's prompt tokens, which include the other two
    (`details`: Chat Completions' `prompt_tokens_details`, Responses' `input_tokens_details`); cache writes are
    billed, and reported, by GPT-5.6 and later models."""
    cached = min(_detail(details, "cached_tokens"), prompt)
    written = min(_detail(details, "cache_write_tokens"), prompt - cached)
    return prompt - cached - written, cached, written


def _detail(details: Any, name: str) -> int:
    """A count of `usage.prompt_tokens_details` (an SDK object, or a dict in a batch's output line; an SDK older
    than the field keeps it as an extra attribute)."""
    value = details.get(name) if isinstance(details, dict) else getattr(details, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


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


_models_read: set[str] = set()  # the servers whose GET /v1/models this process has read (once each)
_models_lock = threading.Lock()


def read_shutdown_dates(client: Any, *, timeout: float = 5.0) -> None:
    """Learn each model's `shutdown_date` from the server's `GET /v1/models` (OpenAI's own API, or the simulator
    standing in for it), once per process and server, so a shutdown announced after this release of llmledger is
    warned about too. Any failure (no network, a key that may not list models, an old SDK) is ignored: the price
    table's dates still apply."""
    base_url = str(client.base_url)
    with _models_lock:
        if base_url in _models_read:
            return
        _models_read.add(base_url)
    try:
        sync = openai_sdk().OpenAI(base_url=base_url, api_key=client.api_key, max_retries=0, timeout=timeout)
        with sync:
            listed = list(sync.models.list())
    except Exception:
        return
    for model in listed:
        shutdown = getattr(model, "shutdown_date", None)
        try:
            when = date.fromisoformat(shutdown) if isinstance(shutdown, str) else None
        except ValueError:
            continue
        learn_shutdown(str(model.id), when, f"GET {shown_url(base_url)}/models")


def openai_api(
    call: Callable[[Any, dict[str, Any]], Awaitable[tuple[Any, Any]]],
    reply_from: Callable[..., Reply],
    useless: Callable[[Any], str | None],
) -> Api:
    """An API of the openai SDK: its errors, its classification, and token limits that count cached input."""
    sdk = openai_sdk()
    errors = (sdk.APIStatusError, sdk.OpenAIError, sdk.APITimeoutError)
    return Api(call, reply_from, useless, classify, *errors, counts_cached=True)


@functools.cache
def api() -> Api:
    """How the openai SDK's Chat Completions are called and read (`client.send`), made once the SDK is known to be
    installed."""
    return openai_api(call, reply_from, useless)
