"""One module per model API an SDK speaks, each the same few names, so that the run knows none of them:

    SHAPE            the API's pure values (`_step.apis.ApiShape`)
    load()           the SDK module (a clear error when an optional one is not installed)
    is_client(c)     whether `c` is a client of that SDK for that API
    make_client(...) a client with the SDK's retries off, at a base URL with a key (None: the SDK's default)
    has_key()        whether the environment has a key for the provider's own API
    read_shutdown_dates(c)  what the API says of its models' shutdown dates, learned once per process
    batch_refusal(c) why a run through client `c` cannot send batches (a cloud's client), or None
    api()            how one request is sent and read (`_exec.client.Api`: call, answer, usefulness, errors)

A batch API is the provider's, not one API's (`batch_api_for`): Anthropic's Message Batches are `messages.py`'s,
OpenAI's Batch API (one for both of its APIs: a batch's answers are read by the API each is of) `openai_batches.py`.

`messages` is Anthropic's Messages API (the `anthropic` SDK), `chat` OpenAI's Chat Completions and `responses` its
Responses API (the `openai` SDK).
Adding an API is one module here and one `ApiShape` in `_step/apis.py`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from llmledger._exec.client import is_openai_client
from llmledger._step.apis import ANTHROPIC, OPENAI, ApiShape

if TYPE_CHECKING:
    from llmledger._exec.batch_api import BatchApi
    from llmledger._exec.client import Api


class SdkApi(Protocol):
    """What each module here has (see above)."""

    SHAPE: ApiShape

    def load(self) -> ModuleType: ...
    def is_client(self, client: Any) -> bool: ...
    def make_client(self, *, base_url: str | None, api_key: str | None, timeout: Any = None) -> Any: ...
    def has_key(self) -> bool: ...
    def read_shutdown_dates(self, client: Any) -> None: ...
    def batch_refusal(self, client: Any) -> str | None: ...
    def api(self) -> Api: ...


def for_provider(provider: str, api: str | None = None) -> SdkApi:
    """The module of the API a step of `provider` sends to: `api` ("responses"), or the provider's default."""
    module: SdkApi
    if api == "responses":
        from llmledger._exec.apis import responses as module
    elif provider == OPENAI:
        from llmledger._exec.apis import chat as module
    else:
        assert provider == ANTHROPIC, provider
        from llmledger._exec.apis import messages as module
    return module


def for_client(client: Any, api: str | None = None) -> SdkApi:
    """The module of the API a client sends to (its SDK told by its class, without importing an SDK it is not of;
    `api`: which of that SDK's APIs, when not its default)."""
    return for_provider(OPENAI if is_openai_client(client) else ANTHROPIC, api)


def batch_api_for(client: Any, api: str | None = None) -> BatchApi:
    """The batch API of a client's provider (`api`: which of its APIs the step's requests are written for, when not
    its default)."""
    if is_openai_client(client):
        from llmledger._exec.apis import openai_batches

        return openai_batches.batches(client, api)
    from llmledger._exec.apis import messages

    return messages.batches(client)
