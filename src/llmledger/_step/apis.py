"""The model APIs llmledger writes requests for, as pure values: one `ApiShape` per API.

Everything that differs between Anthropic's Messages API and OpenAI's Chat Completions and that is no more than
a value lives here, beside the step values that use it: what the API is called and where its own service is, which
body fields llmledger sets itself, the bounds of sampling fields, where the system prompt goes, which field bounds
the answer, which asks for structured output, how many requests one batch takes, whether it caches long prefixes
by itself. The SDK side (making a client, calling it, reading its answers, errors, rate-limit headers and batches)
is one module per API in `_exec/apis/`. A step's request names its provider (`RequestSpec.provider`);
`shape_of(provider)` is its API. Adding an API is one `ApiShape` here and one module there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmledger._step.output import OutputSpec

ANTHROPIC, OPENAI = "anthropic", "openai"
PROVIDERS = (ANTHROPIC, OPENAI)

_NOT_BODY = {"stream", "extra_headers", "extra_query", "extra_body", "timeout", "betas"}


@dataclass(frozen=True)
class ApiShape:
    """One model API's pure values (see the module docstring)."""

    provider: str  # the `model=` prefix that chooses it ("openai:..."); the bare id is Anthropic's
    name: str  # the API: "messages", "chat" (Chat Completions) or "responses"
    vendor: str  # who runs it
    label: str  # the API's name in messages
    own_api: str  # its provider's own service, as messages name it
    own_url: str  # the base URL of that service (the SDK's default)
    base_url_env: str  # the environment variable the SDK reads a base URL from
    key_env: str  # and its key
    own_fields: Mapping[str, str]  # body fields llmledger sets itself -> the argument that sets them
    other_spellings: Mapping[str, str]  # another API's body fields -> what this one takes instead
    ranges: Mapping[str, tuple[float, float | None]]  # sampling fields the API bounds (a value outside: a 400)
    example_options: str  # request_options as an example in messages
    batch_limit: int  # requests in one batch
    system_in_messages: bool  # the system prompt is the first message (Chat Completions), not a body field
    system_field: str | None  # else the body field holding it: "system" (Messages), "instructions" (Responses)
    messages_field: str  # the body field of the conversation: "messages", or "input" (Responses)
    caches_itself: bool  # the API caches long prefixes by itself: no breakpoint sent, no ttl to choose
    structured_field: str  # the body field `output=` fills
    sdk_path: str  # what the SDK's base URL adds to a server's root ("/v1" for OpenAI's)
    client_class: str  # the SDK's async client, as a user writes it
    model_example: str  # a model= of this API, for messages

    def tokens_field(self, endpoint: str | None) -> str:
        """The body field bounding the answer: Responses takes `max_output_tokens`; OpenAI's own API takes
        `max_completion_tokens` in Chat Completions (its reasoning models refuse `max_tokens`); a server speaking
        Chat Completions (`endpoint`) takes `max_tokens`, which every such server reads; the Messages API takes
        `max_tokens`."""
        if self.name == "responses":
            return "max_output_tokens"
        return "max_completion_tokens" if self.provider == OPENAI and endpoint is None else "max_tokens"

    def not_body(self, name: str) -> str | None:
        """Why `name` is no body field of this API (an SDK argument), or None."""
        if name not in _NOT_BODY:
            return None
        hint = (
            "llmledger does not stream"
            if name == "stream"
            else "set SDK options on the client, e.g. client.with_options(...)"
        )
        return f"request_options[{name!r}] is not a {self.label} body field ({hint})"

    def structured(self, spec: OutputSpec) -> dict[str, Any]:
        """The body field asking for `output=`'s JSON: Messages' `output_config`, Chat Completions'
        `response_format`, or Responses' `text` (its `format`: the same strict schema, named)."""
        if self.name == "responses":
            return {"format": {"type": "json_schema", **spec.response_format()["json_schema"]}}
        return spec.response_format() if self.provider == OPENAI else spec.request_option()


MESSAGES = ApiShape(
    provider=ANTHROPIC,
    name="messages",
    vendor="Anthropic",
    label="Messages API",
    own_api="Anthropic's API",
    own_url="https://api.anthropic.com",
    base_url_env="ANTHROPIC_BASE_URL",
    key_env="ANTHROPIC_API_KEY",
    own_fields={
        "model": "model=",
        "max_tokens": "max_tokens=",
        "system": "system=",
        "messages": "prompt= (or messages=)",
        "llmledger_attach": "attach=",
        "llmledger_endpoint": "base_url=",
    },
    other_spellings={},
    ranges={"temperature": (0.0, 1.0), "top_p": (0.0, 1.0), "top_k": (0, None)},
    example_options="{'temperature': 0.0, 'stop_sequences': ['END']}",
    batch_limit=100_000,
    system_in_messages=False,
    system_field="system",
    messages_field="messages",
    caches_itself=False,
    structured_field="output_config",
    sdk_path="",
    client_class="anthropic.AsyncAnthropic",
    model_example="claude-haiku-5-5",
)

CHAT = ApiShape(
    provider=OPENAI,
    name="chat",
    vendor="OpenAI",
    label="Chat Completions",
    own_api="OpenAI's API",
    own_url="https://api.openai.com/v1",
    base_url_env="OPENAI_BASE_URL",
    key_env="OPENAI_API_KEY",
    own_fields={
        "model": "model=",
        "messages": "prompt= (or messages=)",
        "max_tokens": "max_tokens=",
        "max_completion_tokens": "max_tokens=",
        "system": "system=",
        "response_format": "output=",
        "n": "nothing: llmledger keeps one answer per row",
        "stream_options": "nothing: llmledger does not stream",
        "llmledger_attach": "attach=",
        "llmledger_endpoint": "base_url=",
        "llmledger_provider": "model='openai:...'",
    },
    other_spellings={},
    ranges={"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)},
    example_options="{'temperature': 0.0, 'seed': 7}",
    batch_limit=50_000,
    system_in_messages=True,
    system_field=None,
    messages_field="messages",
    caches_itself=True,
    structured_field="response_format",
    sdk_path="/v1",
    client_class="openai.AsyncOpenAI",
    model_example="openai:gpt-6.1-terra",
)

RESPONSES = ApiShape(
    provider=OPENAI,
    name="responses",
    vendor="OpenAI",
    label="Responses API",
    own_api="OpenAI's API",
    own_url="https://api.openai.com/v1",
    base_url_env="OPENAI_BASE_URL",
    key_env="OPENAI_API_KEY",
    own_fields={
        "model": "model=",
        "input": "prompt= (or messages=)",
        "messages": "prompt= (or messages=)",
        "instructions": "system=",
        "system": "system=",
        "max_output_tokens": "max_tokens=",
        "max_tokens": "max_tokens=",
        "max_completion_tokens": "max_tokens=",
        "text": "output= (or nothing: an answer is text by default)",
        "response_format": "output=",
        "previous_response_id": "nothing: each row's request stands alone",
        "conversation": "nothing: each row's request stands alone",
        "background": "nothing: llmledger waits for each answer (mode='batch' for many at half price)",
        "llmledger_attach": "attach=",
        "llmledger_endpoint": "base_url=",
        "llmledger_provider": "model='openai:...'",
        "llmledger_api": "api=",
        "n": "nothing: llmledger keeps one answer per row",
    },
    other_spellings={
        "reasoning_effort": "request_options={'reasoning': {'effort': ...}}, or api='chat'",
        "stop": "no stop sequences (pass api='chat' for them)",
        "seed": "no seed (pass api='chat' for one)",
        "verbosity": "request_options={'text': ...} is set by output=; pass api='chat' for verbosity",
    },
    ranges={"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)},
    example_options="{'reasoning': {'effort': 'low'}, 'service_tier': 'flex'}",
    batch_limit=50_000,
    system_in_messages=False,
    system_field="instructions",
    messages_field="input",
    caches_itself=True,
    structured_field="text",
    sdk_path="/v1",
    client_class="openai.AsyncOpenAI",
    model_example="openai:gpt-6.1-terra",
)

SHAPES = (MESSAGES, CHAT)  # each provider's default API first
_BY_PROVIDER = {shape.provider: shape for shape in SHAPES}
_BY_NAME = {shape.name: shape for shape in (*SHAPES, RESPONSES)}
API_NAMES = ("responses", "chat")  # what api= takes (OpenAI's two)
RESPONSES_MIN_OUTPUT = 16  # the Responses API refuses a max_output_tokens below this


def shape_of(provider: str, api: str | None = None) -> ApiShape:
    """The API a step of `provider` writes its requests for: `api` ("responses"), or the provider's default."""
    return _BY_PROVIDER[provider] if api is None else _BY_NAME[api]


BATCH_CLOUDS = {"openai": ("azure",)}  # the cloud platforms whose batch API llmledger drives, per provider


def batches_at(provider: str, endpoint: str | None, gateway: bool = False) -> bool:
    """Whether llmledger can send a request for `provider`'s API, to `endpoint`, in batches: Anthropic's own API has
    Message Batches, OpenAI's its Batch API, and so does a gateway that forwards to it (`gateway`), and Azure
    OpenAI (global batch deployments; an endpoint named `azure:<url>`); another server (`endpoint`) has none, nor
    do Bedrock and Vertex AI as llmledger drives them."""
    clouds = tuple(f"{cloud}:" for cloud in BATCH_CLOUDS.get(provider, ()))
    return provider in _BY_PROVIDER and (endpoint is None or gateway or bool(clouds and endpoint.startswith(clouds)))
