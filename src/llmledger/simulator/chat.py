"""The simulator's OpenAI side: `POST /v1/chat/completions` as OpenAI's API answers it.

OpenAI's bodies, errors and headers: a `chat.completion` with `usage.prompt_tokens_details.cached_tokens`,
`{"error": {"message", "type", "param", "code"}}` with an `x-request-id` header, and rate limits announced as
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the resets as durations ("1s", "6m0s", "20ms"). It refuses
what OpenAI refuses: a missing model or messages, an unknown field, both token bounds, `max_tokens` or a
non-default `temperature` for a reasoning model (gpt-5*, gpt-6*, o*), a `response_format` schema strict mode cannot
hold.
The answer itself is the simulator's (`Simulator._answer`), read from the same request put in the Messages API's
shape, so the same faults, answers and structured outputs serve both APIs.

Prompt caching is OpenAI's automatic kind: a request whose messages before the last are 1,024 tokens or more, and
were sent before (same model) in the last ten minutes, has them counted as cached, in steps of 128 tokens.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from typing import Any

from llmledger._step.prices import price_of
from llmledger.simulator.faults import ErrorSpec
from llmledger.simulator.media import block_problem, count_tokens
from llmledger.simulator.request import schema_problem

# Chat Completions body fields OpenAI reads; any other gets "Unrecognized request argument supplied".
FIELDS = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
    "response_format", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user",
    "reasoning_effort", "verbosity", "service_tier", "store", "metadata", "prediction", "stream", "stream_options",
    "tools", "tool_choice", "parallel_tool_calls", "modalities", "audio", "prompt_cache_key", "safety_identifier",
    "web_search_options",
}  # fmt: skip
ROLES = {"system", "developer", "user", "assistant", "tool"}
CACHE_MIN, CACHE_STEP, CACHE_TTL = 1024, 128, 600.0
_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "stop"}
# OpenAI's (type, code) for what the simulator injects by status
_KINDS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}


def reasoning(model: str) -> bool:
    """OpenAI's reasoning models, which refuse `max_tokens` and any temperature but 1."""
    return model.startswith(("gpt-5", "gpt-6")) or (len(model) > 1 and model[0] == "o" and model[1].isdigit())


def validate(body: Any, *, own_api: bool = True) -> str | None:
    """What OpenAI would say is wrong with a Chat Completions body, or None (`own_api=False`: another server that
    speaks its API, which has no reasoning models' rules)."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    for name in ("model", "messages"):
        if name not in body:
            return f"Missing required parameter: '{name}'."
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        return f"Unrecognized request argument supplied: {unknown[0]}"
    model, messages = body["model"], body["messages"]
    if not isinstance(model, str) or not isinstance(messages, list) or not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"Invalid value for 'messages[{n}].role'."
        content = message.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and content)):
            return f"Invalid type for 'messages[{n}].content': expected a string or an array of content parts."
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in PARTS:
                return (
                    f"Invalid value: {kind!r}. Supported values are: {', '.join(repr(p) for p in sorted(PARTS))} "
                    f"(messages[{n}].content[{j}].type)."
                )
            problem = block_problem(as_block(part), f"messages[{n}].content[{j}]")
            if problem:
                return f"Invalid content part messages[{n}].content[{j}]: {problem}"
    if "max_tokens" in body and "max_completion_tokens" in body:
        return "max_tokens and max_completion_tokens cannot both be set; use max_completion_tokens."
    if "max_tokens" in body and own_api and reasoning(model):
        return (
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
        )
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if name in body and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"Invalid '{name}': integer below minimum value. Expected a value >= 1."
    temperature = body.get("temperature")
    if "temperature" in body and not (isinstance(temperature, int | float) and 0 <= temperature <= 2):
        return "Invalid 'temperature': decimal above maximum value. Expected a value <= 2."
    if "temperature" in body and own_api and reasoning(model) and temperature != 1:
        return (
            f"Unsupported value: 'temperature' does not support {temperature} with this model. "
            "Only the default (1) value is supported."
        )
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            return "Invalid value for 'response_format.type'."
        if fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not spec.get("name"):
                return "Missing required parameter: 'response_format.json_schema.name'."
            problem = schema_problem(spec.get("schema"), "response_format.json_schema.schema")
            if problem and spec.get("strict"):
                return f"Invalid schema for response_format '{spec['name']}': {problem}"
    return None


# Tokens a reasoning model thinks before it answers, by `reasoning_effort` (billed as output, bounded by
# max_completion_tokens with the answer: a bound too small leaves no room for the answer, as OpenAI's models do).
THINKING = {"none": 0, "minimal": 0, "low": 8, "medium": 32, "high": 128, "xhigh": 256, "max": 512}


def thinking(body: dict[str, Any]) -> int:
    """The reasoning tokens a request spends before its answer (0 for a model that does not reason)."""
    return THINKING.get(str(body.get("reasoning_effort", "medium")), 32) if reasoning(body["model"]) else 0


PARTS = {"text", "image_url", "file"}  # the content parts a chat message may hold (of those llmledger sends)


def as_block(part: dict[str, Any]) -> dict[str, Any]:
    """A content part as the Messages API's block: an image's or a file's data URL as a base64 source (read and
    billed by `media.py` as Anthropic's are), an image's web URL as a URL source."""
    kind = str(part.get("type"))
    if kind == "text":
        return {"type": "text", "text": part.get("text")}
    found = part.get(kind)
    inner: dict[str, Any] = found if isinstance(found, dict) else {}
    url = inner.get("url" if kind == "image_url" else "file_data")
    name = "image" if kind == "image_url" else "document"
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": name, "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": name, "source": {"type": "url", "url": url}}


def as_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The request in the Messages API's shape, for the simulator's answerer: system prompt apart, content parts
    as blocks, the schema as `output_config`, the stop strings as `stop_sequences`."""
    system = [m["content"] for m in body["messages"] if m["role"] in ("system", "developer")]
    messages = [
        {
            "role": m["role"],
            "content": m["content"] if isinstance(m["content"], str) else list(map(as_block, m["content"])),
        }
        for m in body["messages"]
        if m["role"] in ("user", "assistant")
    ]
    shaped: dict[str, Any] = {
        "model": body["model"],
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 4096,
        "messages": messages,
    }
    if system:
        shaped["system"] = "\n".join(s if isinstance(s, str) else json.dumps(s) for s in system)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        shaped["output_config"] = {"format": {"type": "json_schema", "schema": fmt["json_schema"]["schema"]}}
    stop = body.get("stop")
    if stop:
        shaped["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return shaped


class AutomaticCache:
    """OpenAI's automatic prompt cache: the messages before the last, when long enough, as billing sees them."""

    def __init__(self) -> None:
        self.expiry: dict[str, float] = {}
        self.lock = threading.Lock()

    def cached_tokens(self, body: dict[str, Any]) -> int:
        return self.lookup(body)[0]

    def lookup(self, body: dict[str, Any]) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it): a prefix long enough is read when cached, else
        written."""
        prefix = json.dumps([body["model"], body["messages"][:-1]], sort_keys=True)
        tokens = count_tokens(prefix) if len(body["messages"]) > 1 else 0
        if tokens < CACHE_MIN:
            return 0, 0
        key, now = hashlib.sha256(prefix.encode()).hexdigest(), time.time()
        with self.lock:
            hit = self.expiry.get(key, 0.0) > now
            self.expiry[key] = now + CACHE_TTL
        counted = tokens // CACHE_STEP * CACHE_STEP
        return (counted, 0) if hit else (0, counted)


def bills_cache_writes(model: str) -> bool:
    """Whether OpenAI bills (and reports) cache writes for `model`: the GPT-5.6 and GPT-6 generations do, at 1.25x
    their input rate; older models write to the cache for free and report nothing of it."""
    price = price_of(model)
    return price is not None and price.cache_write_5m > price.input


def tier(body: dict[str, Any]) -> str:
    """The `service_tier` an answer was processed at: flex when asked for and the model offers it."""
    price = price_of(str(body.get("model")))
    return "flex" if body.get("service_tier") == "flex" and price is not None and price.flex else "default"


def answer(sim: Any, body: dict[str, Any], shaped: dict[str, Any]) -> dict[str, Any]:
    """The `chat.completion` the simulator `sim` answers a valid body with (`shaped`: it in the Messages API's
    shape), its tokens counted in its stats: a reasoning model thinks first, within the bound; a bound spent
    thinking leaves an empty answer cut at `length`. Online and in batches alike."""
    reply, cached, wrote, thought = answered(sim, body, shaped, thinking(body))
    refusal = REFUSAL if reply["stop_reason"] == "refusal" else None
    return completion(reply, cached, refusal, thought, wrote=wrote, tier=tier(body))


def answered(
    sim: Any, body: dict[str, Any], shaped: dict[str, Any], thinks: int
) -> tuple[dict[str, Any], int, int, int]:
    """(the Messages-shaped answer, tokens read from and written to the automatic cache, tokens thought) of an OpenAI
    request (`body`: its `model` and `messages`, as the cache keys them), counted in `sim`'s stats."""
    max_out = int(shaped["max_tokens"])
    thought = 0 if sim.faults.compatible else min(thinks, max_out)
    reply = sim._answer({**shaped, "max_tokens": max(1, max_out - thought)})
    with sim._lock:
        if thought >= max_out:  # the bound was spent thinking: no room for an answer
            reply.update(content=[], stop_reason="max_tokens")
            sim._stats["output_tokens"] -= reply["usage"]["output_tokens"]
            reply["usage"]["output_tokens"] = 0
        sim._stats["output_tokens"] += thought
    cached, wrote = (0, 0) if sim.faults.compatible else sim.chat_cache.lookup(body)
    cached = min(cached, reply["usage"]["input_tokens"])
    wrote = min(wrote, reply["usage"]["input_tokens"] - cached) if bills_cache_writes(body["model"]) else 0
    reply["usage"]["input_tokens"] -= cached + wrote
    with sim._lock:
        sim._stats["input_tokens"] -= cached + wrote
        sim._stats["cache_read_tokens"] += cached
        sim._stats["cache_write_tokens"] += wrote
    return reply, cached, wrote, thought


def output_tokens(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["completion_tokens"])


def completion(
    answer: dict[str, Any],
    cached: int,
    refusal: str | None,
    reasoned: int = 0,
    *,
    wrote: int = 0,
    tier: str = "default",
) -> dict[str, Any]:
    """A `chat.completion` from the simulator's Messages-shaped answer (`reasoned`: tokens thought before it;
    `wrote`: prompt tokens written to the cache, reported by models that bill them)."""
    text = "".join(block.get("text", "") for block in answer["content"])
    usage = answer["usage"]
    prompt = usage["input_tokens"] + cached + wrote
    written = usage["output_tokens"] + reasoned
    details: dict[str, int] = {"cached_tokens": cached}
    if wrote:
        details["cache_write_tokens"] = wrote
    return {
        "id": f"chatcmpl-sim{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None if refusal else text, "refusal": refusal},
                "finish_reason": _REASONS.get(answer["stop_reason"], "stop"),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": written,
            "total_tokens": prompt + written,
            "prompt_tokens_details": details,
            "completion_tokens_details": {"reasoning_tokens": reasoned},
        },
        "service_tier": tier,
    }


REFUSAL = "I'm sorry, but I can't help with that request."


def error(spec: ErrorSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """OpenAI's body and headers for an error the simulator sends (a status, or a named preset)."""
    kind, code = _KINDS.get(spec.status, ("server_error" if spec.status >= 500 else "invalid_request_error", None))
    if spec.error_code is not None:
        kind, code = spec.type, spec.error_code
    elif spec.status == 429 and "tokens" in spec.message:
        kind = "tokens"
    message = spec.message
    if code == "rate_limit_exceeded":
        message = f"Rate limit reached on {kind} per min: {spec.message}."
    headers: dict[str, str] = {}
    if spec.should_retry is not None:
        headers["x-should-retry"] = "true" if spec.should_retry else "false"
    headers.update({k: v for k, v in spec.headers().items() if k.startswith("retry-after")})
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers


def duration(seconds: float) -> str:
    """A reset as OpenAI writes it: "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s"
