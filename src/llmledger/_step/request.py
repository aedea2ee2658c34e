"""The request of a step, and its fingerprint.

A row's request is the step's request body (model, max_tokens, system, every
option) with the row's rendered prompt as the last user message: a Messages API
body for Anthropic's models, a Chat Completions body for a model named
"openai:..." (`split_model`), whose stored request also names its provider under
`"llmledger_provider"`, fingerprinted with it. Its fingerprint is

    fingerprint = md5(canonical JSON of the whole request body), written as a UUID
    canonical JSON = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

so anything that changes what is sent changes the fingerprint, and two rows
share one answer only when their requests are identical byte for byte. A
request sent anywhere but Anthropic's API (a vLLM or Ollama server, a gateway:
`base_url=`) names that endpoint too, under `"llmledger_endpoint"`, so an
answer from one server never stands in for another's and moving a step to
another server makes its answers stale. Requests to Anthropic's API (or the
simulator standing in for it) name none: their fingerprints are those of the
body alone, as they always were. A file
attached to a row (`attach=`) is in that body as the hash of its bytes
(`"data": "sha256:<hex>"`, see attach.py): the body recorded and fingerprinted
names the file's content, and its bytes are put in only as it is sent. The
ledger computes it in SQL (`fingerprint_sql`), which gives the same bytes as
Python's `json.dumps` for every string (tested); `fingerprint()` is the
reference implementation.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from llmledger._step.apis import ANTHROPIC, PROVIDERS, ApiShape, shape_of
from llmledger.errors import InvalidInputError

if TYPE_CHECKING:
    from llmledger._step.output import OutputSpec

_SENTINEL = "\x00llmledger-prompt\x00"
ATTACH_KEY = "llmledger_attach"  # in a stored request: the columns whose files go in the row's message
ENDPOINT_KEY = "llmledger_endpoint"  # in a stored and fingerprinted request: the server it is sent to, if not Anthropic
PROVIDER_KEY = "llmledger_provider"  # in a stored and fingerprinted request: the API it speaks, if not Anthropic's
API_KEY = "llmledger_api"  # in a stored and fingerprinted request: the API, if not its provider's default ("responses")
PACK_KEY = "llmledger_rows_per_request"  # and the rows one request carries, when more than one (packing.py)


def split_model(model: str) -> tuple[str, str]:
    """(provider, model id) of a `model=` argument: "openai:gpt-6.1-terra" is OpenAI's Chat Completions API (or a
    server that speaks it, with base_url=), "anthropic:claude-haiku-5-5" or a bare id is Anthropic's Messages API.
    Only these two prefixes are read: any other colon is part of the id (Ollama's "llama3.2:3b")."""
    head, sep, rest = model.partition(":")
    if sep and head in PROVIDERS and rest:
        return head, rest
    return ANTHROPIC, model


def check_model(model: str) -> None:
    """Refuse a `model=` no API has: blank, padded with spaces, a provider prefix with no id or in capitals."""
    head, sep, rest = model.partition(":")
    problem = None
    if not model.strip() or model != model.strip():
        problem = "it is blank or has spaces around it"
    elif sep and head.lower() in PROVIDERS and head not in PROVIDERS:
        problem = f"the provider prefix is written {head!r}; write it in lower case, {head.lower()!r}"
    elif sep and head in PROVIDERS and (not rest or rest != rest.strip()):
        problem = f"after {head + ':'!r} comes no model id, or one with spaces around it"
    if problem is not None:
        raise InvalidInputError(
            f"model={model!r} is no model name: {problem} (e.g. 'claude-haiku-5-5' or 'openai:gpt-6.1-terra'). "
            "Nothing was written."
        )


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def md5_uuid(text: str) -> str:
    return str(uuid.UUID(hashlib.md5(text.encode("utf-8")).hexdigest()))


def fingerprint(body: dict[str, Any]) -> str:
    """The fingerprint of a whole Messages request body (see the module docstring)."""
    return md5_uuid(canonical_json(body))


def check_request_options(options: Any, provider: str = ANTHROPIC, api: str | None = None) -> dict[str, Any]:
    """Extra body fields of the provider's request (its API's `ApiShape`), checked before anything is written."""
    shape = shape_of(provider, api)
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidInputError(
            f"request_options must be a dict of {shape.label} fields such as {shape.example_options}, "
            f"got {type(options).__name__}"
        )
    for name in options:
        if not isinstance(name, str):
            raise InvalidInputError(f"request_options keys must be strings, got {name!r}")
        if name in shape.other_spellings:
            raise InvalidInputError(
                f"request_options[{name!r}] is not a {shape.label} field; it takes {shape.other_spellings[name]}"
            )
        if name in shape.own_fields:
            raise InvalidInputError(
                f"request_options sets {name!r}, which apply_llm sets itself; pass {shape.own_fields[name]} instead"
            )
        if name.startswith("llmledger_"):  # the ledger's own marks in a stored request: never the caller's
            raise InvalidInputError(f"request_options[{name!r}]: names starting with 'llmledger_' are llmledger's own")
        problem = shape.not_body(name)
        if problem is not None:
            raise InvalidInputError(problem)
    try:
        canonical_json(options)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"request_options must be JSON values (str, number, bool, None, list, dict): {exc}"
        ) from None
    for name, (low, high) in shape.ranges.items():
        value = options.get(name)
        if name in options and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= (high if high is not None else value)
        ):
            bounds = f"between {low} and {high}" if high is not None else f"{low} or more"
            raise InvalidInputError(
                f"request_options[{name!r}] must be a number {bounds} (the API refuses anything else), got {value!r}"
            )
    return dict(options)


@dataclass(frozen=True)
class RequestSpec:
    """Everything in a step's request except the row's own message.

    `prefix`: messages sent before the row's (`messages=`: few-shot examples, a shared text), exactly as sent,
    a cache breakpoint included. `attach`: the columns whose files go in the row's message; the row's message
    is then recorded as JSON content blocks (files by their hash, see attach.py) instead of a string.
    """

    model: str
    max_tokens: int
    system: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    cache_ttl: str | None = None  # "5m" or "1h": the system prompt is sent as a cached prefix
    prefix: tuple[dict[str, Any], ...] = ()
    attach: tuple[str, ...] = ()
    endpoint: str | None = None  # the base URL of a server other than the provider's own API that answers it
    provider: str = ANTHROPIC  # the API the request is written for: Anthropic's Messages, or OpenAI's Chat Completions
    api: str | None = None  # another API of the provider's than its default: "responses" (OpenAI's)
    # the provider's own rules at another endpoint (a gateway to it, Azure OpenAI): its own field bounds the answer
    own_rules: bool = False
    rows_per_request: int = 1  # rows packed into one request (`_step/packing.py`); 1: each row its own request

    @property
    def shape(self) -> ApiShape:
        """The API the request is written for."""
        return shape_of(self.provider, self.api)

    @property
    def tokens_field(self) -> str:
        return self.shape.tokens_field(None if self.own_rules else self.endpoint)

    def _static(self) -> dict[str, Any]:
        """The body without the messages (the system prompt included, for the Messages API)."""
        body: dict[str, Any] = {**self.options, "model": self.model, self.tokens_field: self.max_tokens}
        if self.shape.system_in_messages:
            return body
        if self.system is not None and self.shape.system_field != "system":  # Responses' `instructions`
            body[str(self.shape.system_field)] = self.system
        elif self.system is not None and self.cache_ttl is not None:
            body["system"] = [
                {"type": "text", "text": self.system, "cache_control": {"type": "ephemeral", "ttl": self.cache_ttl}}
            ]
        elif self.system is not None:
            body["system"] = self.system
        return body

    def _lead(self) -> list[dict[str, Any]]:
        """The messages before the row's: Chat Completions carries the system prompt as the first of them."""
        system = [{"role": "system", "content": self.system}] if self.shape.system_in_messages and self.system else []
        return [*system, *self.prefix]

    def _marks(self) -> dict[str, Any]:
        """What the fingerprint covers besides the body: the provider and endpoint when not Anthropic's API."""
        marks: dict[str, Any] = {}
        if self.endpoint is not None:
            marks[ENDPOINT_KEY] = self.endpoint
        if self.provider != ANTHROPIC:
            marks[PROVIDER_KEY] = self.provider
        if self.api is not None:
            marks[API_KEY] = self.api
        if self.rows_per_request > 1:
            marks[PACK_KEY] = self.rows_per_request
        return marks

    @property
    def cached_ttl(self) -> str | None:
        """The ttl of the cached prefix (system prompt, or the `messages=` prefix with it), if one is sent."""
        if self.cache_ttl is not None or not self.prefix:
            return self.cache_ttl
        content = self.prefix[-1]["content"]
        control = content[-1].get("cache_control") if isinstance(content, list) else None
        return control["ttl"] if control else None

    def static_text(self) -> str:
        """The text sent the same in every row's request: the system prompt and the `messages=` prefix."""
        parts = [self.system or ""]
        for message in self.prefix:
            content = message["content"]
            parts.append(content if isinstance(content, str) else "".join(b.get("text", "") for b in content))
        return "".join(parts)

    def body(self, prompt: str) -> dict[str, Any]:
        """The body for a row's stored message (`{step}_prompt`): its text, or its content blocks as JSON."""
        content = json.loads(prompt) if self.attach else prompt
        return {**self._static(), self.shape.messages_field: [*self._lead(), {"role": "user", "content": content}]}

    def recorded(self, prompt: str) -> dict[str, Any]:
        """What the fingerprint covers: the body, and the provider and endpoint when they are not Anthropic's API."""
        return {**self.body(prompt), **self._marks()}

    def to_json(self) -> str:
        """The body without the row's message, as stored in `llmledger_steps.request` (the messages before the
        row's, attached columns, the endpoint and the provider included, under `messages`, `llmledger_attach`,
        `llmledger_endpoint` and `llmledger_provider`, only when the step has them)."""
        body = self._static()
        if self._lead():
            body[self.shape.messages_field] = self._lead()
        if self.attach:
            body[ATTACH_KEY] = list(self.attach)
        return canonical_json({**body, **self._marks()})

    @classmethod
    def from_json(cls, text: str) -> RequestSpec:
        body = json.loads(text)
        provider, endpoint = body.pop(PROVIDER_KEY, ANTHROPIC), body.pop(ENDPOINT_KEY, None)
        api = body.pop(API_KEY, None)
        rows_per_request = int(body.pop(PACK_KEY, 1))
        model = body.pop("model")
        shape = shape_of(provider, api)
        bound = shape.tokens_field(None) if shape.tokens_field(None) in body else "max_tokens"
        max_tokens = body.pop(bound)
        prefix, attach = list(body.pop(shape.messages_field, ())), tuple(body.pop(ATTACH_KEY, ()))
        system, ttl = body.pop(shape.system_field or "system", None), None
        if shape.system_in_messages and prefix and prefix[0]["role"] == "system":  # `_lead`: a prefix has no system
            system = prefix.pop(0)["content"]
        if isinstance(system, list):  # [{"type": "text", "text": ..., "cache_control": {...}}], as body() makes it
            ttl = system[0]["cache_control"]["ttl"]
            system = system[0]["text"]
        return cls(
            model=model,
            max_tokens=max_tokens,
            system=system,
            options=body,
            cache_ttl=ttl,
            prefix=tuple(prefix),
            attach=attach,
            endpoint=endpoint,
            provider=provider,
            api=api,
            own_rules=endpoint is not None and bound != "max_tokens",
            rows_per_request=rows_per_request,
        )

    def fingerprint(self, prompt: str) -> str:
        return fingerprint(self.recorded(prompt))

    def output_spec(self) -> OutputSpec | None:
        """The structured output this request asks for (`output_config`, or `response_format`), if any."""
        from llmledger._step.output import spec_from_request

        return spec_from_request(self.options)

    @cached_property
    def _around_prompt(self) -> tuple[str, str]:
        """The canonical JSON before and after the prompt's JSON string: the prompt is its only varying part."""
        document = {
            **self._static(),
            self.shape.messages_field: [*self._lead(), {"role": "user", "content": _SENTINEL}],
        }
        text = canonical_json({**document, **self._marks()})
        head, tail = text.split(json.dumps(_SENTINEL, ensure_ascii=False))
        return head, tail

    def fingerprint_sql(self, prompt_sql: str, json_string: Callable[[str], str] | None = None) -> str:
        """SQL computing the fingerprint of this request for the prompt expression `prompt_sql`; `json_string`
        writes a text expression as a JSON string in the store's SQL (the ledger's `Dialect.json_string_sql`;
        DuckDB's by default)."""
        head, tail = self._around_prompt
        # the stored message of an attachment step is the content's canonical JSON already
        text = prompt_sql if self.attach else (json_string or json_string_sql)(prompt_sql)
        return f"md5({sql_literal(head)} || {text} || {sql_literal(tail)})::UUID"


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# PostgreSQL's to_json writes the same bytes as Python's json.dumps(ensure_ascii=False) for every string.
# DuckDB's does too, except for these
# control characters, which it escapes with upper-case hex; strings holding one are escaped by hand.
_UPPER_HEX_CONTROLS = "[" + "".join(chr(c) for c in (11, 14, 15)) + chr(26) + "-" + chr(31) + "]"
_SHORT = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}


def json_string_sql(expr: str) -> str:
    """SQL for the JSON string literal of `expr`, byte-identical to Python's json.dumps(ensure_ascii=False)."""
    manual = f"replace(replace({expr}, '\\', '\\\\'), '\"', '\\\"')"
    for code in range(32):
        escaped = _SHORT.get(code, f"\\u{code:04x}")
        manual = f"replace({manual}, chr({code}), {sql_literal(escaped)})"
    return (
        f"(CASE WHEN regexp_matches({expr}, {sql_literal(_UPPER_HEX_CONTROLS)}) "
        f"THEN '\"' || {manual} || '\"' ELSE to_json({expr})::VARCHAR END)"
    )


MAX_TOKENS_BOUND = 1_000_000  # above every model's output limit; also what the ledger's INTEGER column holds


def check_max_tokens(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or math.isinf(value):
        raise InvalidInputError(f"max_tokens must be a positive integer, got {value!r}")
    if value > MAX_TOKENS_BOUND:
        raise InvalidInputError(
            f"max_tokens={value:,} is more than any model writes in one answer; pass at most "
            f"{MAX_TOKENS_BOUND:,} (the model's own limit, e.g. 64,000, is checked by the API)"
        )
