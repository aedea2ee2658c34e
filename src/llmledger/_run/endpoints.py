"""Which client a call sends with, and which server its requests name: the provider's own API (Anthropic's, or
OpenAI's for a model named "openai:..."), the simulator, or another server (`base_url=`); what a key may be sent
to; and why a call may not finish a step whose requests name another API or server. Checks raise
`InvalidInputError` before anything is written."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from llmledger._exec.apis import for_client, for_provider
from llmledger._exec.client import (
    PLATFORMS,
    answer_source,
    endpoint_url,
    session_base_url,
    shown_url,
    simulated,
)
from llmledger._ledger.columns import SIMULATOR
from llmledger._step.apis import ANTHROPIC, MESSAGES, SHAPES, ApiShape, shape_of
from llmledger.errors import InvalidInputError


def own_api(provider: str) -> str:
    return shape_of(provider).own_api


def endpoint_refusal(
    table: str, step: str, recorded: str | None, sending: str | None, provider: str = ANTHROPIC
) -> str | None:
    """Why a call that sends to `sending` may not finish a step whose requests name `recorded` (None: the provider's
    own API), or None when they agree. A row's answer must come from the server its request names."""
    if recorded == sending:
        return None
    platform = recorded.partition(":")[0] if recorded is not None else ""
    if platform in PLATFORMS.values():  # a cloud's client made the step: only such a client reaches it again
        return (
            f"step {table}.{step} sends its requests through {recorded} (a {platform} client, client=), and this "
            f"call would send them to {sending or own_api(provider)}: pass the same platform's client as client= "
            "to finish it there. Nothing was sent."
        )
    if recorded is not None:
        elsewhere = sending or own_api(provider)
        return (
            f"step {table}.{step} sends its requests to {recorded} (apply_llm(..., base_url=...)), and this call "
            f"would send them to {elsewhere}: pass base_url={recorded!r} (and "
            "api_key= if it needs one) to finish it there, or move the step with apply_llm(..., base_url=...) "
            "(its answers then turn stale). Nothing was sent."
        )
    return (
        f"step {table}.{step} sends its requests to {own_api(provider)}, and this call would send them to {sending} "
        "(base_url=): drop base_url= to finish it there, or move the step with apply_llm(..., base_url=...) "
        "(its answers then turn stale). Nothing was sent."
    )


def provider_refusal(table: str, step: str, recorded: str, sending: str) -> str | None:
    """Why a call with a client for `sending`'s API may not finish a step whose requests are `recorded`'s."""
    if recorded == sending:
        return None
    return (
        f"step {table}.{step} sends its requests to {own_api(recorded)}, and this call has a client for "
        f"{own_api(sending)}: let resume make the client (pass no client=), or move the step with apply_llm(..., "
        "model=...) (its answers then turn stale). Nothing was sent."
    )


def gateway_note(endpoint: str, provider: str = ANTHROPIC) -> str:
    """What a run through a declared gateway does, said once in its report."""
    return (
        f"{endpoint} is a gateway to {own_api(provider)} (gateway=True): its requests name it, and the run used "
        f"{own_api(provider)}'s batches, prices and, where the gateway forwards them, its rate-limit headers."
    )


def compatible_note(endpoint: str, concurrency: int, *, priced: bool, provider: str = ANTHROPIC) -> str:
    """What a run on another server does differently, said once in its report."""
    price = "" if priced else ", and its answers cost NULL unless llmledger.set_price names a price for the model"
    return (
        f"{endpoint} is not {own_api(provider)}: it announces no rate limits, so the requests in flight followed its "
        f"answers (at most concurrency={concurrency}); it has no batches (mode='auto' stays online){price}."
    )


NO_KEY = "llmledger-no-key"  # what a base_url= server gets as its key when none is passed (most ignore it)


def client_for(
    client: Any, base_url: Any, api_key: Any, provider: str = ANTHROPIC, *, gateway: bool = False
) -> tuple[Any, str | None]:
    """The client a call sends with, and the endpoint its requests name: None for the provider's own API (Anthropic's,
    or OpenAI's for `model="openai:..."`) or a simulator, which answer as that API does (batches, rate-limit
    headers, prices), so requests to them name none.

    Every way of naming another server names it the same: `base_url=`, the SDK's environment variable
    (`ANTHROPIC_BASE_URL`, `OPENAI_BASE_URL`) or a `client=` whose base URL is that server's. Such a server (vLLM,
    Ollama, llama.cpp's server, a LiteLLM proxy, a gateway; for OpenAI's API, OpenRouter, Together, Groq, Gemini's
    endpoint) gets `api_key=`, or a placeholder: never the environment's key, which goes only to the provider's own
    URL, or to the server named by the environment beside it. `api_key=` alone is a key for the provider's own API.
    Each API's client is made by its module in `_exec/apis` (`for_provider`).

    `gateway=True` declares the server a gateway to the provider's own API (a LiteLLM proxy, Portkey, Helicone,
    Cloudflare AI Gateway): its requests still name it, and without `api_key=` it gets the environment's key, which
    such a gateway forwards to the provider.
    """
    if not isinstance(gateway, bool):
        raise InvalidInputError(f"gateway must be True or False, got {gateway!r}")
    made, endpoint = _client_for(client, base_url, api_key, provider, gateway)
    check_gateway(gateway, endpoint, shape_of(provider))
    return made, endpoint


def _client_for(client: Any, base_url: Any, api_key: Any, provider: str, gateway: bool) -> tuple[Any, str | None]:
    for name, value in (("base_url", base_url), ("api_key", api_key)):
        if value is not None and client is not None:
            raise InvalidInputError(
                f"pass either client= or {name}=, not both (a client already says where it sends, and with "
                f"what key): e.g. anthropic.AsyncAnthropic(base_url=..., api_key=...) as client=, or {name}= alone"
            )
        if value is not None and (not isinstance(value, str) or not value.strip()):
            got = "a blank string" if isinstance(value, str) else type(value).__name__  # a key is never echoed
            raise InvalidInputError(f"{name} must be a non-empty string, got {got}")
    sdk = for_provider(provider)
    sdk.load()  # a clear error when an optional SDK is not installed
    shape: ApiShape = sdk.SHAPE
    if client is not None:  # a client names the server it sends to, as base_url= would
        if not sdk.is_client(client):
            raise InvalidInputError(_wrong_client(client, shape))
        return client, _endpoint(client, str(client.base_url), shape.own_url)
    if base_url is None and simulated():  # llmledger.simulate(): the session's simulator answers every API's routes
        return sdk.make_client(base_url=session_base_url() + shape.sdk_path, api_key="simulated"), None
    env_url = os.environ.get(shape.base_url_env)
    if base_url is None and env_url:
        # the SDK's own environment, URL and key set together: a server there is named, as base_url= would name it
        check_base_url(env_url, name=shape.base_url_env, shape=shape)
        made = sdk.make_client(base_url=env_url, api_key=api_key or (None if sdk.has_key() else NO_KEY))
        return made, _endpoint(made, env_url, shape.own_url)
    if base_url is None:  # the provider's own API, with api_key= or the environment's key
        return sdk.make_client(base_url=None, api_key=api_key or (None if sdk.has_key() else NO_KEY)), None
    check_base_url(base_url, shape=shape)
    made = sdk.make_client(base_url=base_url, api_key=api_key or NO_KEY)
    endpoint = _endpoint(made, base_url, shape.own_url)
    own_key = endpoint is None or gateway  # the provider's own URL, or a gateway that forwards its key
    if own_key and api_key is None and answer_source(made) != SIMULATOR:
        made = sdk.make_client(base_url=base_url, api_key=None if sdk.has_key() else NO_KEY)
    return made, endpoint


def check_gateway(gateway: bool, endpoint: str | None, shape: ApiShape) -> None:
    """A gateway is a server other than the provider's own API: one must be named."""
    if gateway and endpoint is None:
        raise InvalidInputError(
            f"gateway=True says that the server this call sends to forwards to {shape.own_api}, and this call names "
            f"none (it sends to {shape.own_api} itself, or to the simulator): name the gateway with base_url=..., "
            f"{shape.base_url_env} or client=, or drop gateway=True"
        )


def check_any_client(client: Any, *, what: str) -> None:
    """Refuse, before anything is sent, a `client=` that is no provider SDK's client (`client="x"`), where the step
    it will send for is not known yet (`what`: the call that sends with it later)."""
    if client is not None and not any(for_provider(s.provider).is_client(client) for s in SHAPES):
        classes = " or ".join(dict.fromkeys(s.client_class for s in SHAPES))
        raise InvalidInputError(f"client is the SDK client {what} sends with ({classes}), got {client!r:.80}")


def _wrong_client(client: Any, shape: ApiShape) -> str:
    other = next((s for s in SHAPES if s is not shape and for_provider(s.provider).is_client(client)), None)
    hint = "" if other is None else f" (an {other.client_class} sends a model such as {other.model_example!r})"
    return (
        f"client must be an {shape.client_class} for a model such as {shape.model_example!r} (llmledger sends rows "
        f"concurrently), got {type(client).__name__}; e.g. {shape.client_class}(api_key=...), or base_url= and "
        f"api_key= alone{hint}"
    )


def _endpoint(client: Any, base_url: str, own_api: str) -> str | None:
    """The endpoint a request to `base_url` names: none for the provider's own API or a simulator on this machine."""
    source = answer_source(client)
    if source == SIMULATOR:  # a simulator's path on another host is a server like any other
        return None if _loopback(base_url) else endpoint_url(base_url)
    return None if source == own_api else source


def check_base_url(base_url: str, *, name: str = "base_url", shape: ApiShape = MESSAGES) -> None:
    """Refuse a base_url= (or the environment variable `name`) the SDK could not send to, or that would carry a
    secret into messages and the ledger."""
    path = shape.sdk_path  # OpenAI's SDK takes a base URL ending in /v1
    example = f"such as 'http://localhost:8000{path}' (vLLM) or 'http://localhost:11434{path}' (Ollama)"
    problem = None
    try:
        parts = urlsplit(base_url)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError as exc:
        parts, port, problem = None, None, str(exc)
    if problem is None and parts is not None:
        if base_url != base_url.strip() or any(c.isspace() or ord(c) < 32 for c in base_url):
            problem = "it holds spaces or control characters"
        elif parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            problem = "it is not an http(s) URL with a host"
        elif parts.username is not None or parts.password is not None:
            problem = "it holds credentials (user:password@): pass the key as api_key= instead"
        elif parts.query or parts.fragment:
            problem = "it has a query or fragment, which the SDK would put before /v1/messages"
        elif port == 0:
            problem = "port 0 is no server's port"
    if problem is not None:
        raise InvalidInputError(
            f"{name} must be the http(s) URL of a server that answers {shape.vendor}'s {shape.label}, {example}; "
            f"{shown_url(base_url)!r} is not: {problem}"
        )


def _loopback(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def credentials_missing(client: Any = None) -> bool:
    """No key for the provider's own API (a placeholder in its place), and not pointed at the simulator: a run could
    send nothing. Another server may need no key."""
    if client is None:  # the SDK's own default, made when the run starts
        return not (simulated() or for_provider(ANTHROPIC).has_key())
    own = for_client(client).SHAPE.own_url
    return getattr(client, "api_key", None) == NO_KEY and answer_source(client) == own


def check_credentials(client: Any) -> None:
    """A call that will send needs a key: say so before anything is written (estimate sends nothing)."""
    if not credentials_missing(client):
        return
    shape = for_client(client).SHAPE
    whose = "" if shape.provider == ANTHROPIC else f"{shape.vendor} "  # the default provider's key is "the" key
    raise InvalidInputError(
        f"no {whose}API key: set {shape.key_env} (or pass api_key=, or client={shape.client_class}(api_key=...)). "
        "To try llmledger offline, call llmledger.simulate() first: apply_llm then answers from the bundled "
        "simulator (simulated answers, no cost)"
    )
