"""A request body as the Messages API reads it: what it refuses in one (`validate`, `unknown_model`, a
structured-output schema's `schema_problem`), the input tokens it bills (`request_tokens`), and the user text a
reply and the request log see (`user_text`).

Its own module because the HTTP routes and the batches both check and count a request the same way, before any
answer is made (`replies.py`) or any fault injected (`faults.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

from llmledger.simulator.faults import ErrorSpec, Faults
from llmledger.simulator.media import attachment, block_cost, content_problem, count_tokens


def output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request's structured output asks for (`output_config.format`), if any."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    return fmt.get("schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None


def schema_problem(schema: Any, path: str = "output_config.format.schema") -> str | None:
    """What the API would refuse in a structured-output schema, or None."""
    if not isinstance(schema, dict):
        return f"{path}: must be an object"
    for name, sub in (schema.get("$defs") or {}).items():
        problem = schema_problem(sub, f"{path}.$defs.{name}")
        if problem:
            return problem
    if "$ref" in schema:
        return None
    for variant in schema.get("anyOf") or schema.get("allOf") or []:
        problem = schema_problem(variant, path)
        if problem:
            return problem
    kind = schema.get("type")
    if kind is None and not ({"anyOf", "allOf", "enum", "const"} & set(schema)):
        return f"{path}: a schema needs 'type', 'enum', 'const', 'anyOf' or '$ref'"
    if kind == "object":
        if schema.get("additionalProperties") is not False:
            return f"{path}: For 'object' type, 'additionalProperties' must be explicitly set to false"
        for name, sub in (schema.get("properties") or {}).items():
            problem = schema_problem(sub, f"{path}.properties.{name}")
            if problem:
                return problem
    if kind == "array" and "items" in schema:
        return schema_problem(schema["items"], f"{path}.items")
    for keyword in ("minLength", "maxLength", "pattern", "minimum", "maximum", "multipleOf"):
        if keyword in schema:
            return f"{path}: '{keyword}' is not supported in structured outputs"
    return None


def request_tokens(body: dict[str, Any]) -> int:
    """The input tokens of a request (tools, system, messages and output schema), as billed and rate-limited: text
    blocks by their text, images and PDFs by the API's formulas (media.py), never their base64."""
    system, tools = body.get("system"), body.get("tools")
    text = (json.dumps(tools) if tools else "") + (
        system if isinstance(system, str) else "".join(b.get("text", "") for b in system or [] if isinstance(b, dict))
    )
    files = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for block in content:
                said, tokens = block_cost(block)
                text, files = text + said, files + tokens
        else:
            text += content if isinstance(content, str) else json.dumps(content)
    schema = output_schema(body)
    return count_tokens(text + (json.dumps(schema) if schema else "")) + files


def user_text(body: dict[str, Any]) -> str:
    """The last user message's text, as replies, the request log and `stats()["prompts"]` see it: each image or
    document it carries comes first, one marker a line (`[image/png 64x48 sha256:1a2b3c4d]`,
    `[application/pdf 2 pages sha256:…: <its first 200 characters>]`), so another file is another prompt."""
    conversation = body.get("messages") or body.get("input") or []  # Responses' `input` may be a bare string
    if isinstance(conversation, str):
        return conversation
    for message in reversed(conversation if isinstance(conversation, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            blocks = [b for b in content or [] if isinstance(b, dict)] if isinstance(content, list) else []
            markers = [found.marker for found in map(attachment, blocks) if found is not None]
            text = "".join(b["text"] for b in blocks if isinstance(b.get("text"), str))
            return "\n".join([*markers, text]) if markers else text
    return ""


def unknown_model(
    body: Any, models: Sequence[str], *, only: bool = False, retired: Callable[[str], bool] = lambda _: False
) -> ErrorSpec | None:
    """The API's 404 for a model it does not have (checked once the body is well formed): not one it knows, or one
    `retired` (past its shutdown date); `only`: it has `models` and no other (a local server serves the models it
    was started with, not Anthropic's)."""
    from llmledger._step.prices import listed

    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or model in models or (listed(model) and not only and not retired(model)):
        return None
    return ErrorSpec(404, "not_found_error", f"model: {model}")


def model_404(body: Any, faults: Faults, *, only: bool = False) -> ErrorSpec | None:
    """`unknown_model` with the simulator's settings: the models it answers besides the price table's, and the
    day it lives on (a model past its shutdown date is gone)."""
    return unknown_model(
        body, faults.models, only=only, retired=lambda model: is_retired(model, faults.shutdowns, faults.today)
    )


def openai_models() -> list[str]:
    """The OpenAI model ids of the price table: what the simulator lists at OpenAI's GET /v1/models."""
    from llmledger._step.models import catalogue

    return [info.model for info in catalogue() if info.provider == "openai"]


def shutdown_of(model: str, shutdowns: dict[str, str | None]) -> str | None:
    """A model's shutdown date as the simulator's API says it: `shutdowns` (the simulator's setting), else the
    price table's."""
    from llmledger._step.models import lifecycle_of

    if model in shutdowns:
        return shutdowns[model]
    shutdown = lifecycle_of(model).shutdown
    return None if shutdown is None else shutdown.isoformat()


def is_retired(model: str, shutdowns: dict[str, str | None], today: str | None) -> bool:
    """Whether the API no longer serves `model` on `today` (YYYY-MM-DD; None: today)."""
    shutdown = shutdown_of(model, shutdowns)
    return shutdown is not None and shutdown <= (today or date.today().isoformat())


def validate(body: Any) -> str | None:
    """What the API would say is wrong with a request body, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["max_tokens"], int) or isinstance(body["max_tokens"], bool) or body["max_tokens"] < 1:
        return "max_tokens: Input should be a positive integer"
    if not isinstance(body["messages"], list) or not body["messages"]:
        return "messages: at least one message is required"
    problem = content_problem(body)  # content blocks: text, images, documents, cache breakpoints
    if problem:
        return problem
    if not user_text(body):
        return "messages: text content blocks must be non-empty"
    if "temperature" in body and not (isinstance(body["temperature"], int | float) and 0 <= body["temperature"] <= 1):
        return "temperature: Input should be less than or equal to 1"
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
        return "stop_sequences: Input should be a list of non-empty strings"
    if "output_config" in body:
        config = body["output_config"]
        fmt = config.get("format") if isinstance(config, dict) else None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            return "output_config.format: Input tag does not match the expected tag 'json_schema'"
        problem = schema_problem(fmt.get("schema"))
        if problem:
            return problem
    system = body.get("system")
    for block in system if isinstance(system, list) else []:
        control = block.get("cache_control") if isinstance(block, dict) else None
        if control is not None and (control.get("type") != "ephemeral" or control.get("ttl", "5m") not in ("5m", "1h")):
            return "system.cache_control: type must be 'ephemeral' and ttl '5m' or '1h'"
    for message in body["messages"]:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return "messages: each message needs a role of 'user' or 'assistant'"
        if not message.get("content"):
            return "messages: all messages must have non-empty content"
    return None
