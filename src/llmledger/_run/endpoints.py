"""Which client a call sends with, and which server its requests name: the provider's own API (Anthropic's, or
OpenAI's for a model named "openai:..."), the simulator, or another server (`base_url=`); what a key may be sent
to; and why a call may not finish a step whose requests name another API or server. Checks raise
`InvalidInputError` before anything is written."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from llmledger._exec.chat import OPENAI_API, make_client, openai_sdk
from llmledger._exec.client import (
    ANTHROPIC_API,
    answer_source,
    endpoint_url,
    is_openai_client,
    session_base_url,
    shown_url,
    simulated,
)
from llmledger._ledger.columns import SIMULATOR
from llmledger._step.request import ANTHROPIC, OPENAI
from llmledger.errors import InvalidInputError


def own_api(provider: str) -> str:
    return "OpenAI's API" if provider == OPENAI else "Anthropic's API"


def endpoint_refusal(
    table: str, step: str, recorded: str | None, sending: str | None, provider: str = ANTHROPIC
) -> str | None:
    """Why a call that sends to `sending` may not finish a step whose requests name `recorded` (None: the provider's
    own API), or None when they agree. A row's answer must come from the server its request names."""
    if recorded == sending:
        return None
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


def compatible_note(endpoint: str, concurrency: int, *, priced: bool, provider: str = ANTHROPIC) -> str:
    """What a run on another server does differently, said once in its report."""
    price = "" if priced else ", and its answers cost NULL unless llmledger.set_price names a price for the model"
    return (
        f"{endpoint} is not {own_api(provider)}: it announces no rate limits, so the requests in flight followed its "
        f"answers (at most concurrency={concurrency}); it has no batches (mode='auto' stays online){price}."
    )


NO_KEY = "llmledger-no-key"  # what a base_url= server gets as its key when none is passed (most ignore it)


def client_for(client: Any, base_url: Any, api_key: Any, provider: str = ANTHROPIC) -> tuple[Any, str | None]:
    """The client a call sends with, and the endpoint its requests name: None for the provider's own API (Anthropic's,
    or OpenAI's for `model="openai:..."`) or a simulator, which answer as that API does (batches, rate-limit
    headers, prices), so requests to them name none.

    `base_url=` is another server that answers the provider's API (vLLM, Ollama, llama.cpp's server, a LiteLLM
    proxy, a gateway; for OpenAI's, OpenRouter, Together, Groq, Gemini's endpoint). It gets `api_key=`, or a
    placeholder: never the environment's key, which goes only to the provider's own URL. `api_key=` alone is a key
    for the provider's own API.
    """
    for name, value in (("base_url", base_url), ("api_key", api_key)):
        if value is not None and client is not None:
            raise InvalidInputError(
                f"pass either client= or {name}=, not both (a client already says where it sends, and with "
                f"what key): e.g. anthropic.AsyncAnthropic(base_url=..., api_key=...) as client=, or {name}= alone"
            )
        if value is not None and (not isinstance(value, str) or not value.strip()):
            got = "a blank string" if isinstance(value, str) else type(value).__name__  # a key is never echoed
            raise InvalidInputError(f"{name} must be a non-empty string, got {got}")
    if provider == OPENAI:
        return _openai_client(client, base_url, api_key)
    import anthropic  # imported where a run sends: `import llmledger` and the CLI's readers do without it

    if client is not None and not isinstance(client, anthropic.AsyncAnthropic):
        raise InvalidInputError(
            f"client must be an anthropic.AsyncAnthropic (llmledger sends rows concurrently), "
            f"got {type(client).__name__}; e.g. anthropic.AsyncAnthropic(api_key=...)"
            + (" (an OpenAI client sends a model named 'openai:...')" if is_openai_client(client) else "")
        )
    if base_url is None and api_key is None:
        return client, None
    if base_url is None:
        return anthropic.AsyncAnthropic(api_key=api_key, max_retries=0), None
    return _at_server(base_url, api_key, _anthropic_client_at, ANTHROPIC_API)


def _openai_client(client: Any, base_url: Any, api_key: Any) -> tuple[Any, str | None]:
    """`client_for` a model named "openai:...": an `openai.AsyncOpenAI`, made here unless one is passed."""
    sdk = openai_sdk()
    if client is not None:
        if not isinstance(client, sdk.AsyncOpenAI):
            raise InvalidInputError(
                f"model='openai:...' sends with an openai.AsyncOpenAI client, got {type(client).__name__}; e.g. "
                "openai.AsyncOpenAI(api_key=...), or base_url=/api_key= alone"
            )
        return client, _endpoint(client, str(client.base_url), OPENAI_API)
    if base_url is None:
        if simulated():  # llmledger.simulate(): the session's simulator answers OpenAI's routes too
            return make_client(base_url=session_base_url() + "/v1", api_key="simulated"), None
        # the SDK's own environment, URL and key set together (a server there is named, as base_url= would)
        base_url = os.environ.get("OPENAI_BASE_URL") or OPENAI_API
        made = _openai_client_at(base_url, api_key)
        return made, _endpoint(made, base_url, OPENAI_API)
    return _at_server(base_url, api_key, _openai_client_at, OPENAI_API)


def _anthropic_client_at(base_url: str, api_key: str | None) -> Any:
    """`api_key` None: the SDK's own environment (ANTHROPIC_API_KEY)."""
    import anthropic

    if api_key is None:
        return anthropic.AsyncAnthropic(base_url=base_url, max_retries=0)
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)


def _openai_client_at(base_url: str, api_key: str | None) -> Any:
    """`api_key` None: the SDK's own environment (OPENAI_API_KEY), or a placeholder."""
    return make_client(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or NO_KEY)


def _at_server(
    base_url: str, api_key: str | None, make: Callable[[str, str | None], Any], own_api: str
) -> tuple[Any, str | None]:
    """A client `make`s for `base_url=`, and the endpoint its requests name. Another server gets `api_key=` or a
    placeholder, never the environment's key; the provider's own URL (no endpoint named, not the simulator) gets
    the environment's key when none was passed."""
    check_base_url(base_url)
    made = make(base_url, api_key or NO_KEY)
    endpoint = _endpoint(made, base_url, own_api)
    if endpoint is None and api_key is None and answer_source(made) != SIMULATOR:
        made = make(base_url, None)
    return made, endpoint


def _endpoint(client: Any, base_url: str, own_api: str) -> str | None:
    """The endpoint a request to `base_url` names: none for the provider's own API or a simulator on this machine."""
    source = answer_source(client)
    if source == SIMULATOR:  # a simulator's path on another host is a server like any other
        return None if _loopback(base_url) else endpoint_url(base_url)
    return None if source == own_api else source


def check_base_url(base_url: str) -> None:
    """Refuse a base_url= the SDK could not send to, or that would carry a secret into messages and the ledger."""
    example = "such as 'http://localhost:8000' (vLLM) or 'http://localhost:11434' (Ollama)"
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
            f"base_url must be the http(s) URL of a server that answers the Messages API, {example}; "
            f"{shown_url(base_url)!r} is not: {problem}"
        )


def _loopback(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def credentials_missing(client: Any = None) -> bool:
    """No client, no key in the environment, and not pointed at the simulator: a run could send nothing."""
    if is_openai_client(client):  # a key for OpenAI's own API (another server may need none)
        return client.api_key == NO_KEY and answer_source(client) == OPENAI_API
    return client is None and not (
        simulated() or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
    )


def check_credentials(client: Any) -> None:
    """A call that will send needs a key: say so before anything is written (estimate sends nothing)."""
    if is_openai_client(client) and credentials_missing(client):
        raise InvalidInputError(
            "no OpenAI API key: set OPENAI_API_KEY (or pass api_key=, or client=openai.AsyncOpenAI(api_key=...)). "
            "To try llmledger offline, call llmledger.simulate() first: it answers OpenAI's API too"
        )
    if credentials_missing(client):
        raise InvalidInputError(
            "no API key: set ANTHROPIC_API_KEY (or pass client=anthropic.AsyncAnthropic("
            "api_key=...)). To try llmledger offline, call llmledger.simulate() first: "
            "apply_llm then answers from the bundled simulator (simulated answers, no cost)"
        )
