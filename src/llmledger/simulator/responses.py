"""OpenAI's Responses API (`POST /v1/responses`), as the simulator answers it: OpenAI's `response` objects, its
refusals of what it does not take (an unknown parameter, `max_output_tokens` below 16, a temperature for a reasoning
model, a strict schema it cannot hold), reasoning that spends the bound, automatic caching with cache writes billed
where the model bills them, refusals as `refusal` content, flex as `service_tier`. Errors, rate-limit headers and
the answers themselves are those of Chat Completions (`chat.py`): the same service.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from llmledger.simulator import chat
from llmledger.simulator.request import schema_problem

# Responses body fields OpenAI reads; any other gets "Unknown parameter".
FIELDS = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text", "reasoning",
    "service_tier", "store", "metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "parallel_tool_calls", "tools", "tool_choice", "truncation", "include", "background", "previous_response_id",
    "conversation", "top_logprobs", "max_tool_calls", "stream",
}  # fmt: skip
ROLES = {"user", "assistant", "system", "developer"}
PARTS = {"input_text", "output_text"}  # the text parts an input message may hold (of those llmledger sends)
FILE_PARTS = {"input_image": "image_url", "input_file": "file_data"}  # and its files, with their data URL's field
MIN_OUTPUT_TOKENS = 16


def validate(body: Any, *, own_api: bool = True) -> str | None:
    """What OpenAI would say is wrong with a Responses body, or None (`own_api`: as Chat Completions' `validate`
    takes it; only OpenAI's own API speaks Responses here)."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    for name in ("model", "input"):
        if name not in body:
            return f"Missing required parameter: '{name}'."
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        return f"Unknown parameter: '{unknown[0]}'."
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    if not items or not isinstance(body["model"], str):
        return "Invalid 'input': empty array. Expected an array with minimum length 1."
    for n, item in enumerate(items):
        if not isinstance(item, dict) or item.get("role") not in ROLES:
            return f"Invalid value for 'input[{n}].role'."
        content = item.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and content)):
            return f"Invalid type for 'input[{n}].content': expected a string or an array of content parts."
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in FILE_PARTS and item.get("role") == "user":
                if not isinstance(part.get(FILE_PARTS[kind]), str):
                    return f"Missing required parameter: 'input[{n}].content[{j}].{FILE_PARTS[kind]}'."
                continue
            if kind not in PARTS or not isinstance(part.get("text"), str):
                return f"Invalid value for 'input[{n}].content[{j}].type'."
    bound = body.get("max_output_tokens")
    if "max_output_tokens" in body and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 1):
        return "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16."
    if isinstance(bound, int) and not isinstance(bound, bool) and bound < MIN_OUTPUT_TOKENS:
        return f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {bound}."
    if "temperature" in body and chat.reasoning(body["model"]):
        return "Unsupported parameter: 'temperature' is not supported with this model."
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not fmt.get("name"):
            return "Missing required parameter: 'text.format.name'."
        problem = schema_problem(fmt.get("schema"), "text.format.schema")
        if problem and fmt.get("strict"):
            return f"Invalid schema for response_format '{fmt['name']}': {problem}"
    return None


def _text(content: Any) -> Any:
    """Content as the Messages API's: text parts as text blocks, files as Chat Completions' parts turned into
    image and document blocks (`chat.as_block`: read and billed by `media.py` as Anthropic's are)."""
    if isinstance(content, str):
        return content
    return [_block(part) for part in content]


def _block(part: dict[str, Any]) -> dict[str, Any]:
    kind = part["type"]
    if kind == "input_image":
        return chat.as_block({"type": "image_url", "image_url": {"url": part["image_url"]}})
    if kind == "input_file":
        return chat.as_block({"type": "file", "file": {"file_data": part["file_data"]}})
    return {"type": "text", "text": part["text"]}


def as_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The request in the Messages API's shape, for the simulator's answerer."""
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    system = [
        i["content"] if isinstance(i["content"], str) else "".join(p["text"] for p in i["content"])
        for i in items
        if i["role"] in ("system", "developer")
    ]
    if body.get("instructions"):
        system.insert(0, str(body["instructions"]))
    shaped: dict[str, Any] = {
        "model": body["model"],
        "max_tokens": body.get("max_output_tokens") or 4096,
        "messages": [
            {"role": i["role"], "content": _text(i["content"])} for i in items if i["role"] in ("user", "assistant")
        ],
    }
    if system:
        shaped["system"] = "\n".join(system)
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        shaped["output_config"] = {"format": {"type": "json_schema", "schema": fmt.get("schema")}}
    return shaped


def thinking(body: dict[str, Any]) -> int:
    """Reasoning tokens spent before the answer, by `reasoning.effort` (0 for a model that does not reason)."""
    effort = (
        (body.get("reasoning") or {}).get("effort", "medium") if isinstance(body.get("reasoning"), dict) else "medium"
    )
    return chat.THINKING.get(str(effort), 32) if chat.reasoning(body["model"]) else 0


def answer(sim: Any, body: dict[str, Any], shaped: dict[str, Any]) -> dict[str, Any]:
    """The `response` the simulator answers a valid body with, its tokens counted in its stats (online and in
    batches alike)."""
    prefix = [{"role": "system", "content": shaped.get("system", "")}, *shaped["messages"]]
    keyed = {"model": body["model"], "messages": prefix}  # the automatic cache keys on what precedes the last message
    reply, cached, wrote, thought = chat.answered(sim, keyed, shaped, thinking(body))
    text = "".join(block.get("text", "") for block in reply["content"])
    usage = reply["usage"]
    prompt, written = usage["input_tokens"] + cached + wrote, usage["output_tokens"] + thought
    refused = reply["stop_reason"] == "refusal"
    cut = reply["stop_reason"] == "max_tokens"
    output: list[dict[str, Any]] = []
    if thought:
        output.append({"type": "reasoning", "id": f"rs_sim{uuid.uuid4().hex[:20]}", "summary": []})
    if text or refused:
        part = (
            {"type": "refusal", "refusal": chat.REFUSAL}
            if refused
            else {"type": "output_text", "text": text, "annotations": []}
        )
        output.append(
            {"type": "message", "id": f"msg_sim{uuid.uuid4().hex[:20]}", "status": "completed", "role": "assistant",
             "content": [part]}
        )  # fmt: skip
    details = {"cached_tokens": cached, "cache_write_tokens": wrote}  # both always there, as the API sends them
    return {
        "id": f"resp_sim{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": reply["model"],
        "output": output,
        "parallel_tool_calls": True,
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "service_tier": chat.tier(body),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": details,
            "output_tokens": written,
            "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": prompt + written,
        },
    }


def output_tokens(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["output_tokens"])
