"""What the simulator answers: deterministic replies, token counts, the faults it can be told to
inject, and the error responses of the real Messages API (status, body, headers).

Error bodies follow the API: `{"type": "error", "error": {"type", "message", ["details": {"error_code"}]},
"request_id"}` with a `request-id` header, `x-should-retry`, and `retry-after` (or `retry-after-ms`)
where the API sends them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llmledger.simulator.media import (
    MARKER,
    attachment,
    block_cost,
    content_problem,
    count_tokens,
    files_in,
    stated_value,
)

_POSITIVE = {"great", "love", "excellent", "perfect", "happy", "fast", "recommend", "works", "best", "good"}
_NEGATIVE = {"broke", "broken", "refund", "late", "never", "worst", "bad", "poor", "slow", "disappointed"}
_ONE_OF = re.compile(r"one word: ((?:[A-Za-z-]+, )*[A-Za-z-]+ or [A-Za-z-]+)")


def default_reply(prompt: str, system: str | None = None) -> str:
    """A deterministic answer that looks like what a prompt asked for.

    Sentiment prompts get a label counted from a small lexicon; everything else
    gets a short extract of the prompt's last line, so different rows get
    different, reproducible answers; one asked for "one word: A, B or C" (in its
    system prompt or its text) gets the option its last line or its files name,
    else the last one. Attached files (user_text's markers) count
    too: their text is read for sentiment, and a summary says what it was shown,
    so the same text with another file gets another answer.
    """
    files = files_in(prompt)
    prompt = MARKER.sub("", prompt)
    lowered = prompt.lower()
    if "sentiment" in lowered or ("positive" in lowered and "negative" in lowered):
        body = " ".join([lowered.rsplit(":", 1)[-1], *(text.lower() for _, text in files)])
        words = re.findall(r"[a-z']+", body)
        score = sum(w in _POSITIVE for w in words) - sum(w in _NEGATIVE for w in words)
        return "positive" if score > 0 else "negative" if score < 0 else "neutral"
    choice = _ONE_OF.search(f"{system or ''}\n{prompt}")
    if choice:  # "Answer with one word: invoice or receipt": the option the row (or its file) names, else the last
        options = [o.strip() for o in re.split(r",| or ", choice.group(1)) if o.strip()]
        seen = " ".join([prompt.rsplit("\n", 1)[-1], *(text for _, text in files)]).lower()
        seen = seen.replace(choice.group(0).lower(), " ")  # the question names every option
        return next((o for o in options if re.search(rf"\b{re.escape(o.lower())}\b", seen)), options[-1])
    last = prompt.strip().splitlines()[-1] if prompt.strip() else ""
    words = last.split(": ", 1)[-1].split()
    extract = " ".join(words[:12]) + (" …" if len(words) > 12 else "")
    shown = "; ".join(f"{head}: {' '.join(text.split()[:12])}" if text else head for head, text in files)
    return f"Summary: {extract}" + (f" (attached: {shown})" if files else "")


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


def fake_json(schema: dict[str, Any], prompt: str, variant: int = 0) -> str:
    """An answer matching `schema`, made from the prompt (as constrained decoding guarantees).

    The same prompt gets the same answer, except that asking again (`variant` > 0: the prompt was
    answered before) gets another one, as a real model's sampling would give.
    """
    defs = schema.get("$defs") or {}
    files = [text for _, text in files_in(prompt)]
    words = re.findall(r"[A-Za-z0-9']+", " ".join([MARKER.sub("", prompt).rsplit(":", 1)[-1], *files])) or ["nothing"]
    salt = f"\x00{variant}" if variant else ""
    again = f" (take {variant + 1})" if variant else ""

    def pick(path: str, n: int) -> int:
        return int(hashlib.md5(f"{prompt}\x00{path}{salt}".encode()).hexdigest()[:8], 16) % max(n, 1)

    def make(node: dict[str, Any], path: str) -> Any:
        if "$ref" in node:
            return make(defs[node["$ref"].split("/")[-1]], path)
        if "anyOf" in node:
            variants = [v for v in node["anyOf"] if v.get("type") != "null"] or node["anyOf"]
            return make(variants[0], path)
        if "const" in node:
            return node["const"]
        if "enum" in node:
            values = node["enum"]
            if "positive" in values and "negative" in values:
                label = default_reply(f"sentiment: {prompt.rsplit(':', 1)[-1]}")
                if label in values:
                    return label
            return values[pick(path, len(values))]
        kind = node.get("type")
        rules = _stated_rules(node)  # constraints the schema states in its description (what a model reads)
        stated = (
            stated_value(files, path.rsplit(".", 1)[-1], kind in ("integer", "number"))
            if files and kind in ("integer", "number", "string") and "format" not in node
            else None
        )
        if stated is not None and (kind != "integer" or float(stated).is_integer()):
            return int(stated) if kind == "integer" else stated
        if kind == "object":
            return {name: make(sub, f"{path}.{name}") for name, sub in (node.get("properties") or {}).items()}
        if kind == "array":
            low = int(rules.get("minItems", 1))
            high = max(low, int(rules.get("maxItems", low + 2)))
            return [
                make(node.get("items") or {"type": "string"}, f"{path}[{i}]")
                for i in range(low + pick(path, high - low + 1))
            ]
        if kind in ("integer", "number"):
            return _number(rules, kind == "integer", pick(path, 1_000_000) / 1_000_000)
        if kind == "boolean":
            return bool(pick(path, 2))
        if kind == "null":
            return None
        if node.get("format") in _FORMATTED:
            return _FORMATTED[node["format"]](pick(path, 1_000_000))
        pattern = _stated_pattern(node)
        built = matching(pattern, pick(path, 1_000)) if pattern else None
        if built is not None:
            return built
        start = pick(path, len(words))
        text = " ".join(words[start : start + 3]) + again
        text = text.ljust(int(rules.get("minLength", 0)), "x")
        return text[: int(rules["maxLength"])] if "maxLength" in rules else text

    return json.dumps(make(schema, "$"), ensure_ascii=False)


_FORMATTED: dict[str, Any] = {  # string formats structured outputs support, each made valid from a number
    "date": lambda n: f"20{n % 30:02d}-{n % 12 + 1:02d}-{n % 28 + 1:02d}",
    "date-time": lambda n: f"20{n % 30:02d}-{n % 12 + 1:02d}-{n % 28 + 1:02d}T{n % 24:02d}:{n % 60:02d}:00Z",
    "time": lambda n: f"{n % 24:02d}:{n % 60:02d}:{n % 59:02d}",
    "duration": lambda n: f"P{n % 9 + 1}D",
    "email": lambda n: f"user{n}@example.com",
    "hostname": lambda n: f"host{n}.example.com",
    "uri": lambda n: f"https://example.com/{n}",
    "ipv4": lambda n: f"10.{n % 256}.{n // 256 % 256}.{n % 250 + 1}",
    "ipv6": lambda n: f"2001:db8::{n % 65536:x}",
    "uuid": lambda n: str(uuid.UUID(int=n * 7919 + 1)),
}


def _stated_pattern(node: dict[str, Any]) -> str | None:
    """A `pattern` the description states (`api_schema` moves it there), which a model follows."""
    hint = (node.get("description") or "").rsplit("\n\n", 1)[-1].strip()
    found = re.search(r"(?:^\{|, )pattern: (.*?)(?:, [A-Za-z_]+: |\}$)", hint) if hint.startswith("{") else None
    return found.group(1) if found else None


def matching(pattern: str, seed: int = 0) -> str | None:
    """A short string `pattern` matches in full, built from its parsed form (None for what it cannot build, such
    as lookarounds or backreferences)."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    categories = {
        c.CATEGORY_DIGIT: "0123456789",
        c.CATEGORY_WORD: "abcxyz",
        c.CATEGORY_SPACE: " ",
        c.CATEGORY_NOT_DIGIT: "a",
        c.CATEGORY_NOT_WORD: "-",
        c.CATEGORY_NOT_SPACE: "a",
    }

    def build(items: Any, n: int) -> str:
        out = []
        for op, arg in items:
            if op is c.LITERAL:
                out.append(chr(arg))
            elif op is c.ANY:
                out.append("a")
            elif op is c.IN:
                choices = []
                if arg and arg[0][0] is c.NEGATE:
                    raise ValueError("negated class")
                for kind, value in arg:
                    if kind is c.LITERAL:
                        choices.append(chr(value))
                    elif kind is c.RANGE:
                        choices.extend(chr(x) for x in range(value[0], min(value[1], value[0] + 25) + 1))
                    elif kind is c.CATEGORY:
                        choices.extend(categories[value])
                out.append(choices[n % len(choices)])
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                low, high, sub = arg
                times = low if high == c.MAXREPEAT else min(high, low + n % 3)
                out.extend(build(sub, n + i) for i in range(max(times, 1 if low else 0)))
            elif op is c.SUBPATTERN:
                out.append(build(arg[-1], n))
            elif op is c.BRANCH:
                out.append(build(arg[1][n % len(arg[1])], n))
            elif op is c.AT:
                continue
            else:
                raise ValueError(f"cannot build {op}")
        return "".join(out)

    try:
        text = build(_parser.parse(pattern), seed)
    except (ValueError, KeyError, re.error, IndexError):
        return None
    return text if re.fullmatch(pattern, text) or re.search(pattern, text) else None


def _stated_rules(node: dict[str, Any]) -> dict[str, float]:
    """Numeric constraints the API does not enforce but states in the description (`api_schema`'s hint:
    "{maximum: 1, minimum: 0}"), which a model follows: the simulator follows them too."""
    hint = (node.get("description") or "").rsplit("\n\n", 1)[-1].strip()
    rules: dict[str, float] = {}
    if not (hint.startswith("{") and hint.endswith("}")):
        return rules
    for part in re.split(r", (?=[A-Za-z_]+: )", hint[1:-1]):  # a pattern's own braces and commas stay whole
        name, _, value = part.partition(": ")
        with contextlib.suppress(ValueError):
            rules[name.strip()] = float(value)
    return rules


def _number(rules: dict[str, float], integer: bool, share: float) -> float | int:
    """A number within the stated bounds (by default 0 to 99, or 0 to 100.0)."""
    step = 1 if integer else 1e-6
    low = max(rules.get("minimum", -math.inf), rules.get("exclusiveMinimum", -math.inf) + step)
    high = min(rules.get("maximum", math.inf), rules.get("exclusiveMaximum", math.inf) - step)
    low = low if low > -math.inf else (high - 99 if high < math.inf else 0)
    high = high if high < math.inf else low + (99 if integer else 100)
    step_of = rules.get("multipleOf")
    if step_of:  # the multiples within the bounds, one picked
        first, last = math.ceil(low / step_of), math.floor(high / step_of)
        value = (first + round(share * max(last - first, 0))) * step_of
        return int(value) if integer else round(value, 9)
    if integer:
        low, high = math.ceil(low), math.floor(high)
        return int(low + round(share * max(high - low, 0)))
    return round(low + share * (high - low), 6) if high > low else low


@dataclass(frozen=True)
class ErrorSpec:
    """One error response. `should_retry=None` sends what the API sends for the status."""

    status: int
    type: str
    message: str
    error_code: str | None = None
    should_retry: bool | None = None
    retry_after: float | str | None = None  # seconds, sent as `retry-after`; a string is sent as it is (a proxy's)
    retry_after_ms: float | str | None = None  # sent as `retry-after-ms`; a string is sent as it is

    def headers(self) -> dict[str, str]:
        retry = self.should_retry if self.should_retry is not None else self.status in RETRYABLE
        headers = {"x-should-retry": "true" if retry else "false"}
        if isinstance(self.retry_after, str):
            headers["retry-after"] = self.retry_after
        elif self.retry_after is not None:
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after)))
        if isinstance(self.retry_after_ms, str):
            headers["retry-after-ms"] = self.retry_after_ms
        elif self.retry_after_ms is not None:
            headers["retry-after-ms"] = str(int(self.retry_after_ms))
        return headers

    def body(self, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.error_code:
            error["details"] = {"error_code": self.error_code}
        return {"type": "error", "error": error, "request_id": request_id}


RETRYABLE = {408, 409, 429, 500, 502, 503, 504, 529}
_USAGE_LIMIT_RESET = "2026-12-01 at 00:00 UTC"

ERRORS: dict[int | str, ErrorSpec] = {
    400: ErrorSpec(400, "invalid_request_error", "Invalid request"),
    401: ErrorSpec(401, "authentication_error", "invalid x-api-key"),
    402: ErrorSpec(402, "billing_error", "There is an issue with your billing or payment information."),
    403: ErrorSpec(403, "permission_error", "Your API key does not have permission to use the specified resource."),
    404: ErrorSpec(404, "not_found_error", "The requested resource was not found."),
    409: ErrorSpec(409, "conflict_error", "Conflict: the request conflicts with another in progress.", retry_after=1),
    413: ErrorSpec(413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ErrorSpec(429, "rate_limit_error", "Number of requests has exceeded your rate limit", retry_after=1),
    500: ErrorSpec(500, "api_error", "Internal server error", retry_after=1),
    502: ErrorSpec(502, "api_error", "Bad gateway", retry_after=1),
    503: ErrorSpec(503, "api_error", "Service unavailable", retry_after=1),
    504: ErrorSpec(504, "timeout_error", "Request timed out while processing", retry_after=1),
    529: ErrorSpec(529, "overloaded_error", "Overloaded", retry_after=1),
    "enforced_spend_limit_reached": ErrorSpec(
        429,
        "rate_limit_error",
        "Your organization has reached the monthly usage limit of its API tier.",
        error_code="enforced_spend_limit_reached",
        should_retry=False,
    ),
    "contract_spend_limit_reached": ErrorSpec(
        429,
        "rate_limit_error",
        "Your organization has reached the spend limit of its contract.",
        error_code="contract_spend_limit_reached",
        should_retry=False,
    ),
    "usage_limit": ErrorSpec(
        400,
        "invalid_request_error",
        f"You have reached your specified API usage limits. You will regain access on {_USAGE_LIMIT_RESET}.",
    ),
    "credit_balance": ErrorSpec(
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic API. Please go to "
        "Plans & Billing to upgrade or purchase credits.",
    ),
    "no_retry": ErrorSpec(529, "overloaded_error", "Overloaded", should_retry=False),
    "retry_after_ms": ErrorSpec(
        429, "rate_limit_error", "Number of requests has exceeded your rate limit", retry_after_ms=1500
    ),
}


def error_spec(fault: int | str | dict[str, Any]) -> ErrorSpec:
    """An error to inject: a status (529), a named preset ("enforced_spend_limit_reached") or a dict of
    ErrorSpec fields, optionally over a preset ({"status": 529, "should_retry": False})."""
    if isinstance(fault, dict):
        base = ERRORS.get(fault.get("preset") or fault.get("status", 500)) or ErrorSpec(
            int(fault.get("status", 500)), "api_error", "Internal server error"
        )
        return replace(base, **{k: v for k, v in fault.items() if k != "preset"})
    if fault in ERRORS:
        return ERRORS[fault]
    if isinstance(fault, int):
        return ErrorSpec(
            fault,
            "api_error" if fault >= 500 else "invalid_request_error",
            f"error {fault}",
            retry_after=1 if fault in RETRYABLE else None,
        )
    raise ValueError(f"unknown simulator fault {fault!r}; known: {sorted(map(str, ERRORS))} or a status code")


@dataclass
class Faults:
    """What the simulator does wrong. Every field can be changed while it runs."""

    latency: float = 0.0  # seconds before each answer
    jitter: float = 0.0  # plus a uniform random 0..jitter seconds
    rate_limit: float | None = None  # requests per second (token bucket); None = unlimited
    burst: float | None = None  # bucket size; default one second's worth
    input_tokens_per_minute: float | None = None  # input-token bucket; None = unlimited
    output_tokens_per_minute: float | None = None  # output-token bucket (max_tokens reserved, the rest refunded)
    token_burst: float = 60.0  # token buckets hold this many seconds' worth (the API: a minute)
    fail_next: list[int | str | dict[str, Any]] = field(default_factory=list)  # errors for the next requests
    error_rate: float = 0.0  # share of requests answered with `error_status`
    error_status: int | str = 529
    drop_next: int = 0  # close the next N connections without an answer
    drop_rate: float = 0.0
    outage_until: float = 0.0  # unix time; until then every request gets `outage_status`
    outage_status: int | str = 529
    poison: str | None = None  # prompts containing this get a 400
    refuse: str | None = None  # prompts containing this get stop_reason "refusal"
    # structured outputs: prompts (the first user message) containing these get JSON that is not valid JSON,
    # always / only on their first request (a follow-up with the error gets valid JSON), or cut at max_tokens
    bad_json: str | None = None
    bad_json_once: str | None = None
    truncate: str | None = None
    api_key: str | None = None  # when set, any other key gets a 401
    # model ids it answers besides those llmledger knows a price for (prices.json, set_price); any other gets the
    # API's 404 (not_found_error), as a typo or a retired model does
    models: tuple[str, ...] = ()
    # Message Batches (batches.py): seconds until a batch ends, its lifetime, per-request expiry and the
    # API's own errors by prompt substring, and the size limits of one batch
    batch_delay: float = 0.0
    batch_expire_after: float = 24 * 3600.0
    batch_expire: str | None = None
    batch_error: str | None = None
    batch_max_requests: int = 100_000
    batch_max_bytes: int = 256_000_000
    batch_lose_response: int = 0  # the next N creates make the batch, then drop the connection unanswered
    seed: int = 0


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
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            blocks = [b for b in content or [] if isinstance(b, dict)] if isinstance(content, list) else []
            markers = [found.marker for found in map(attachment, blocks) if found is not None]
            text = "".join(b["text"] for b in blocks if isinstance(b.get("text"), str))
            return "\n".join([*markers, text]) if markers else text
    return ""


def unknown_model(body: Any, models: Sequence[str]) -> ErrorSpec | None:
    """The API's 404 for a model it does not have (checked once the body is well formed)."""
    from llmledger._step.prices import listed

    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or model in models or listed(model):
        return None
    return ErrorSpec(404, "not_found_error", f"model: {model}")


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
