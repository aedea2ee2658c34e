"""Which of a provider's APIs a step's requests are written for, and what that API does not take: checked before
anything is written (`InvalidInputError`)."""

from __future__ import annotations

from typing import Any

from llmledger._exec.apis.chat import own_rules
from llmledger._run.endpoints import client_for
from llmledger._step.apis import API_NAMES, OPENAI, RESPONSES_MIN_OUTPUT, ApiShape
from llmledger._step.request import RequestSpec
from llmledger.errors import InvalidInputError


def choose_api(o: dict[str, Any], provider: str, *, recorded: RequestSpec | None) -> str | None:
    """The API a step's requests are written for, beyond its provider's default: "responses" for a new step on
    OpenAI's own API (OpenAI recommends it), unless `api="chat"` asks for Chat Completions, the step's recorded
    requests are Chat Completions' (its answers are kept: only the user moves a step) or another server answers it
    (servers speak Chat Completions). `o`: the call's
    arguments by name; `recorded`: the step's stored request, if it has one."""
    asked = o.get("api")
    if asked not in (None, *API_NAMES):
        raise InvalidInputError(
            f"api must be 'responses' or 'chat' (OpenAI's Responses API or its Chat Completions), or left out, got "
            f"{asked!r}"
        )
    if provider != OPENAI:
        if asked is not None:
            raise InvalidInputError(
                f"api={asked!r} chooses between OpenAI's APIs (model='openai:...'); a Claude model has one, the "
                "Messages API: leave api= out"
            )
        return None
    if asked == "chat":
        return None
    if asked == "responses":
        if own_rules(o["client"]):
            raise InvalidInputError(
                "api='responses' through an Azure OpenAI client is not supported yet (its Responses routes differ "
                "from OpenAI's): pass api='chat', or leave api= out"
            )
        return "responses"
    if recorded is not None and recorded.provider == OPENAI:
        if recorded.api == "responses" and own_rules(o["client"]):  # the step's API, which Azure's client lacks
            raise InvalidInputError(
                "this step's requests were made for OpenAI's Responses API, which llmledger does not send through an "
                "Azure OpenAI client yet: pass api='chat' to move the step to Chat Completions (its answers are then "
                "reported stale, not paid), or run it with an OpenAI client"
            )
        return str(recorded.api) if recorded.api else None
    gateway = o.get("gateway", False)  # the server the call would send to, asked only now that it decides the API
    _, endpoint = client_for(o["client"], o.get("base_url"), o.get("api_key"), provider, gateway=gateway)
    return "responses" if endpoint is None else None


def responses_prefix(prefix: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """`messages=` before the row's, as the Responses API takes them: a text block is a user's `input_text` or the
    assistant's `output_text` (a string content stays as it is)."""

    def part(role: str, block: dict[str, Any]) -> dict[str, Any]:
        if block.get("type") != "text":
            return block
        return {"type": "input_text" if role != "assistant" else "output_text", "text": block.get("text")}

    return tuple(
        {**m, "content": [part(m["role"], b) for b in m["content"]]} if isinstance(m["content"], list) else m
        for m in prefix
    )


def check_responses_bound(max_tokens: int) -> None:
    if max_tokens < RESPONSES_MIN_OUTPUT:
        raise InvalidInputError(
            f"max_tokens={max_tokens} is below what the Responses API takes (max_output_tokens of "
            f"{RESPONSES_MIN_OUTPUT} or more): pass max_tokens={RESPONSES_MIN_OUTPUT} or more (a reasoning model "
            "needs room to think as well), or api='chat'"
        )


def check_no_cache_ttl(cache: Any, shape: ApiShape) -> None:
    """An API that caches long prefixes by itself has no ttl to choose."""
    if cache in ("5m", "1h"):
        raise InvalidInputError(
            f"cache={cache!r} chooses how long Anthropic's prompt cache keeps a prefix; {shape.own_api} caches long "
            "prefixes by itself, with no ttl to choose: pass cache=True (the default) or leave it out"
        )
