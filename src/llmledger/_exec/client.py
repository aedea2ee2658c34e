"""One Messages API call, and what its errors mean for the run.

We turn the SDK's own retries off (`max_retries=0`) and retry in the online
sender instead, so that every 429/529 is seen by the pacer and the circuit
breaker, and a row that keeps failing for the API's reasons never counts
against the row. Every option goes through `extra_body`, so whatever the
installed SDK's signature, the body sent is exactly the one fingerprinted.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from llmledger._exec.pacing import Pacer, retry_after
from llmledger._ledger import KnownAnswer
from llmledger._ledger.columns import SIMULATOR
from llmledger._ledger.states import Outcome
from llmledger._step.apis import MESSAGES

if TYPE_CHECKING:  # the SDK takes over a second to import: it is imported where a run sends, so that
    import anthropic  # `import llmledger`, the CLI's readers and the simulator start without it

DEFAULT_MODEL = "claude-haiku-5-5"  # the cheapest current Claude model (prices.json): row work is volume

TRANSIENT_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}
_FULL = {429, 503, 529}  # statuses by which a server says it has more than it can take


class Kind(Enum):
    TRANSIENT = "transient"  # the API's fault: retry, never counts against the row
    PERMANENT = "permanent"  # the row's fault: FAILED, counts toward max_attempts
    FATAL = "fatal"  # the account's or the caller's: stop the whole run


@dataclass(frozen=True)
class Reply:
    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str | None
    model: str
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0  # the part of cache_write_tokens written with a 1 h ttl
    cache_read_tokens: int = 0
    calls: int = 1  # requests this answer took (2 when a structured answer needed its one retry)
    batch: bool = False  # answered in a Message Batch (billed at the batch rate)
    latency_ms: int | None = None  # how long its request(s) took, sent to answered; None: no request of its own
    counted: bool = True  # the server said what the answer used (some servers send no usage: tokens, cost NULL)
    flex: bool = False  # answered at OpenAI's flex processing tier (`service_tier: "flex"`), billed at its rate
    useless: bool = False  # paid for, but nothing to keep (a refusal, an answer left empty): its row fails, its
    # tokens and cost recorded on it
    pack: str | None = None  # the request that carried this row with others (`llmledger_packs.pack_id`), if any

    def plus(self, later: Reply) -> Reply:
        """`later` (an answer to a follow-up request), carrying the usage of both."""
        return Reply(
            later.text,
            self.input_tokens + later.input_tokens,
            self.output_tokens + later.output_tokens,
            later.stop_reason,
            later.model,
            self.cache_write_tokens + later.cache_write_tokens,
            self.cache_write_1h_tokens + later.cache_write_1h_tokens,
            self.cache_read_tokens + later.cache_read_tokens,
            self.calls + later.calls,
            later.batch,
            None if self.latency_ms is None or later.latency_ms is None else self.latency_ms + later.latency_ms,
            flex=later.flex,
            pack=later.pack,
        )


class CallFailed(Exception):
    def __init__(
        self,
        kind: Kind,
        message: str,
        retry_after: float | None = None,
        stop: Outcome | None = None,
        reply: Reply | None = None,
        refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after
        self.stop = stop  # for FATAL: the outcome the run ends with
        self.reply = reply  # an answer that was billed although it is no use (a refusal)
        self.refused = refused  # the connection was refused: nothing listens at the server's address


def error_fields(exc: Any, code_of: Callable[[dict[str, Any]], Any]) -> tuple[str, str, str | None]:
    """(type, message, code) from an API's error object (`{"error": {...}}`, or the object itself: the SDKs differ
    in what they parse), `code_of` reading the code where the API puts it."""
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    nested = body.get("error")
    error: dict[str, Any] = nested if isinstance(nested, dict) else body
    code = code_of(error)
    return (
        str(error.get("type") or type(exc).__name__),
        str(error.get("message") or exc.message),
        None if code is None else str(code),
    )


def error_detail(exc: Any, kind: str, message: str, code: str | None, request_id: str | None) -> str:
    """An HTTP error as the run reports it: status, class, type, message, code and the request id (for support)."""
    return (
        f"{exc.status_code} {type(exc).__name__} ({kind}): {message}"
        + (f" [{code}]" if code else "")
        + (f" (request {request_id})" if request_id else "")
    )


def status_failure(exc: Any, headers: Any, detail: str, stop: Outcome | None) -> CallFailed:
    """What an HTTP error means for the run once the provider's own rules chose a stop for it (or none): a retry
    status is transient unless the API says not to retry, anything else is the row's."""
    if stop is not None:
        return CallFailed(Kind.FATAL, detail, stop=stop)
    should_retry = (headers.get("x-should-retry") or "").lower()
    transient = exc.status_code in TRANSIENT_STATUS or exc.status_code >= 500
    if transient and should_retry == "false":
        return CallFailed(Kind.FATAL, detail + " (x-should-retry: false)", stop=Outcome.RETRY_REFUSED)
    if transient or should_retry == "true":
        return CallFailed(Kind.TRANSIENT, detail, retry_after(headers))
    return CallFailed(Kind.PERMANENT, detail)


def sdk_failure(exc: BaseException, sdk: Any) -> CallFailed:
    """An SDK error that is no HTTP answer: a lost connection or a timeout (retried), or an answer it could not
    read."""
    if isinstance(exc, sdk.APIConnectionError):  # includes APITimeoutError
        return CallFailed(Kind.TRANSIENT, f"{type(exc).__name__}: {exc}", refused=_refused(exc))
    if isinstance(exc, sdk.APIResponseValidationError):
        return CallFailed(Kind.PERMANENT, f"invalid response: {exc}")
    return CallFailed(Kind.PERMANENT, f"{type(exc).__name__}: {exc}")


def _refused(exc: BaseException) -> bool:
    """Whether a connection error was a refused connection (nothing listens there), read down its causes."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class NotSent(Exception):
    """The run stopped while the request waited for its turn: it was never sent."""


@dataclass(frozen=True)
class Api:
    """How one SDK is called and read: what `send` needs to know of a provider."""

    call: Callable[[Any, dict[str, Any]], Awaitable[tuple[Any, Any]]]  # (parsed answer, response headers)
    reply_from: Callable[..., Reply]
    useless: Callable[[Any], str | None]  # why an answer (paid for) is of no use: a refusal, no room to answer
    classify: Callable[[BaseException], CallFailed]
    status_error: type[BaseException]  # an HTTP error answer, with `.status_code` and `.response`
    sdk_error: type[BaseException]  # any other error the SDK raises
    timeout_error: type[BaseException]
    counts_cached: bool = False  # its token limit counts cached input (OpenAI's does; Anthropic's mostly not)


def is_openai_client(client: Any) -> bool:
    """Whether `client` is one of the openai SDK's, a subclass, or a proxy of one (its `__class__`, which
    `isinstance` reads too, as the step's own client check does): told without importing either SDK."""
    return any(cls.__module__.split(".")[0] == "openai" for cls in client.__class__.__mro__)


async def send(
    client: Any, pacer: Pacer, body: dict[str, Any], *, api: Api, go: Callable[[], bool] | None = None
) -> Reply:
    """One request with exactly `body`. Raises CallFailed with its kind on any failure.

    `go`, asked once the pacer lets the request start: False raises NotSent, so a run that stopped while
    its requests waited for their turn (a retry-after pause) starts none of them. `api`: the API the body is
    written for (`_exec.apis.for_client(client, spec.api).api()`: the caller chooses it, so this module, which
    every API's module builds on, names none of them).
    """
    await pacer.wait()
    async with pacer.in_flight() as flight:
        if go is not None and not go():
            flight.unsent = True
            raise NotSent
        try:
            started = time.monotonic()
            message, headers = await api.call(client, body)
            took = round((time.monotonic() - started) * 1000)
        except api.status_error as exc:
            failure = api.classify(exc)
            status, answered = getattr(exc, "status_code", 0), getattr(exc, "response", None)
            flight.congested = status in _FULL
            if answered is not None:
                pacer.observe(answered.headers, reserved=_bound(body))
            if failure.kind is Kind.TRANSIENT and failure.retry_after:
                pacer.pause(failure.retry_after)
            raise failure from exc
        except api.sdk_error as exc:
            flight.congested = isinstance(exc, api.timeout_error)
            raise api.classify(exc) from exc
        finally:
            pacer.answered()
    reply = dataclasses.replace(api.reply_from(message, body["model"]), latency_ms=took)
    paced_input = reply.input_tokens + (reply.cache_read_tokens if api.counts_cached else 0)
    pacer.observe(headers, paced_input, reply.output_tokens, reserved=_bound(body))
    problem = api.useless(message)
    if problem is not None:
        raise CallFailed(Kind.PERMANENT, problem, reply=reply)
    return reply


def _bound(body: dict[str, Any]) -> int:
    """The most output tokens a request may take, which the API holds from its start: its max_tokens, in any
    API's spelling (0 when it names none)."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int):
            return value
    return 0


REFUSAL = "refusal: the model declined to answer this prompt"


def known_reply(answer: KnownAnswer) -> Reply:
    """A stored answer to an identical request, as a reply (its usage is this row's: none)."""
    return Reply(answer.output, 0, 0, answer.stop_reason, answer.model)


def clean_text(text: str) -> str:
    """An answer as the ledger can keep it: a lone surrogate would break the journal and the store, and PostgreSQL
    text cannot hold NUL (the paid answer keeps the rest)."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


FLEX_READ = 900.0  # seconds a flex request may take to answer: OpenAI's advice (its flex processing queues)


def bounded_timeout(timeout: Any, *, max_tokens: int, sdk: Any = None, slow: bool = False) -> Any:
    """The client's timeout, bounded so that no request can stall a run for long (a `Timeout` of `sdk`, the
    client's own SDK module).

    Waiting for a pooled connection, a connect or a write ends before the API
    has the request, so those are short. The read (the model's answer) is
    bounded by the time to generate `max_tokens` at 10 tokens/s, at least 60 s:
    longer than any healthy answer, and a retry after it is a retry the SDK
    would make after its own 600 s anyway. `slow`: flex processing, which queues a request before answering it:
    at least FLEX_READ, as OpenAI advises.
    """
    if sdk is None:
        import anthropic as sdk
    read = timeout.read if isinstance(timeout, sdk.Timeout) else timeout
    ceiling = max(FLEX_READ if slow else 60.0, max_tokens / 10.0)
    read = ceiling if read is None else min(float(read), ceiling)
    return sdk.Timeout(read, connect=10.0, write=30.0, pool=10.0)


# The base URL of the simulator `llmledger.simulate()` started for this session (None: the environment's API).
_session_base_url: str | None = None


def use_session_simulator(base_url: str | None) -> None:
    """Send this session's default requests to `base_url` (a simulator), or back to the environment's API."""
    global _session_base_url
    _session_base_url = base_url


def session_base_url() -> str:
    """The base URL of the session's simulator (`llmledger.simulate()`); only when `simulated()`."""
    assert _session_base_url is not None
    return _session_base_url


def _session_base_url_or_none() -> str | None:
    return _session_base_url


def simulated() -> bool:
    """Whether this session's default client answers from `llmledger.simulate()`'s simulator."""
    return _session_base_url is not None


SIMULATOR_PATH = "/llmledger-simulator"  # the path a Simulator's base_url ends in, so any client pointed at one
# The simulator's 404 for a batch id it never had (not one deleted): its batches live as long as it does, so a
# batch a simulator of another kernel or process made is gone with it (the collector asks its rows again).
NEVER_IN_THIS_SIMULATOR = "this simulator never had it (a simulator keeps its batches only while it runs)"
# (in this process, a subprocess, a kernel) is recognised as simulated


def is_simulator_url(url: str) -> bool:
    """Whether `url` is a Simulator's base URL (`Simulator.base_url`, or OpenAI's SDK's with "/v1" after it)."""
    path = urlsplit(url).path.rstrip("/")
    return path.endswith(SIMULATOR_PATH) or path.endswith(SIMULATOR_PATH + "/v1")


def answer_source(client: anthropic.AsyncAnthropic | None) -> str:
    """Where a run's answers come from, as stored in `{step}_source`: "simulator", or the endpoint's base URL.

    The simulator is recognised by the path its base URL ends in (`Simulator.base_url`), or by
    `llmledger.simulate()` when no client is passed. A real endpoint is recorded as its base URL without
    credentials, query or trailing slash ("https://api.anthropic.com"): enough to tell which endpoint
    answered, nothing secret in the store. A cloud platform's client (Bedrock, Vertex AI, Azure OpenAI) is named
    with its platform before its URL ("bedrock:https://bedrock-runtime.us-east-1.amazonaws.com"): its requests
    differ from the provider's own API's in what the platform does with them, whatever URL a proxy gives it.
    """
    if client is None:
        if simulated():
            return SIMULATOR
        url = os.environ.get("ANTHROPIC_BASE_URL") or MESSAGES.own_url  # what the SDK itself reads
    else:
        url = str(getattr(client, "base_url", "") or MESSAGES.own_url)
    platform = None if client is None else platform_of(client)
    if platform is None and is_simulator_url(url):
        return SIMULATOR
    named = endpoint_url(url) or url
    return named if platform is None else f"{platform}:{named}"


PLATFORMS = {"AsyncAnthropicBedrock": "bedrock", "AsyncAnthropicVertex": "vertex", "AsyncAzureOpenAI": "azure"}


def platform_of(client: Any) -> str | None:
    """The cloud platform an SDK client reaches its provider's models through ("bedrock", "vertex", "azure"), told
    by its class (or a subclass) without importing an SDK; None for the provider's own client."""
    for cls in type(client).__mro__:
        if cls.__module__.split(".")[0] in ("anthropic", "openai") and cls.__name__ in PLATFORMS:
            return PLATFORMS[cls.__name__]
    return None


def endpoint_url(url: str) -> str:
    """A base URL as the ledger names an endpoint: without credentials, query, fragment or trailing slash, the host
    lower-cased and a default port as given. Raises ValueError for a port that is not one."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def shown_url(url: str) -> str:
    """A URL as messages show it: without credentials, query or fragment (they may hold keys)."""
    try:
        return endpoint_url(url)
    except ValueError:
        return "<a URL that cannot be read>"
