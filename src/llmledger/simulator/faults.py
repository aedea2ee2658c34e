"""What the simulator does wrong when told to (`Faults`: latency, rate limits, errors, outages, dropped
connections, batch troubles), and the error responses of the real Messages API (`ErrorSpec`, `ERRORS`,
`error_spec`): status, body, headers.

Error bodies follow the API: `{"type": "error", "error": {"type", "message", ["details": {"error_code"}]},
"request_id"}` with a `request-id` header, `x-should-retry`, and `retry-after` (or `retry-after-ms`)
where the API sends them.

Its own module because it is configuration and error data, read by every other part of the simulator (the
server, its routes, its batches, its rate limits) and by the command line's `simulator` options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any


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
    # OpenAI's account stop: a 429 no wait clears (the chat completions route sends it in OpenAI's words)
    "insufficient_quota": ErrorSpec(
        429,
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        error_code="insufficient_quota",
    ),
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
    # OpenAI's one token limit (chat completions): input and max output tokens reserved, the unused output refunded
    tokens_per_minute: float | None = None
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
    # model id -> the share of its answers given as the default responder gives them; the rest (chosen by a hash of
    # model and prompt, so the same row is always the one) get another sentiment label, or an unsure text: models
    # that disagree on some rows, for comparing them (`llmledger.compare`)
    accuracy: dict[str, float] = field(default_factory=dict)
    # Another server that speaks the Messages API (vLLM, Ollama, llama.cpp's server, a LiteLLM proxy), as
    # `base_url=` reaches one: no rate-limit headers, no Message Batches (404), no prompt caching (a breakpoint
    # is accepted and ignored, and usage has no cache fields)
    compatible: bool = False
    usage: bool = True  # False: answers carry no usage, as some servers' (an old llama.cpp, a bare proxy) do not
    # True: a text request asked again (a redo) draws again, as sampling would: a label half the time another of
    # the prompt's options, a summary another take. Off by default, so runs against one simulator compare alike
    # (a structured answer asked again always gets other values)
    resample: bool = False
    # requests worked on at once (a GPU's batch): the others wait their turn, so latency grows with the load;
    # with `queue_limit`, a request that finds that many already waiting gets a 429 (a proxy's limit)
    capacity: int | None = None
    queue_limit: int | None = None
    seed: int = 0
    # rows_per_request packs gone wrong as peers' did (Ondine #251/#254/#255): the share of packs answered with an
    # entry dropped, an entry given twice, two entries' ids swapped, or an answer out of the step's shape
    pack_drop: float = 0.0
    pack_duplicate: float = 0.0
    pack_swap: float = 0.0
    pack_invalid: float = 0.0
    # the share of OpenAI flex-tier requests (`service_tier: "flex"`, a model with a flex rate) answered with flex
    # processing's 429 "Resource Unavailable" (not charged)
    flex_unavailable: float = 0.0
    # the day the simulator lives on (YYYY-MM-DD; None: today): a model past its shutdown date (prices.json, or
    # `shutdowns`) gets the API's 404, as a retired model does; GET /v1/models says each model's shutdown_date
    today: str | None = None
    shutdowns: dict[str, str | None] = field(default_factory=dict)  # model id -> shutdown date, over prices.json's


# What each fault's value must be, as `llmledger simulator`'s options say it (`_cli_parser._FAULT_OPTIONS`): checked
# when a Simulator is made or configured, so `Simulator(error_rate=5)` is refused at once, not seen as every request
# failing (found in a trial: only the command line checked).
_SECONDS = ("latency", "jitter", "batch_delay", "outage_for")
_COUNTS = ("drop_next", "batch_lose_response", "queue_limit", "seed")
_RATES = (
    "rate_limit", "burst", "input_tokens_per_minute", "output_tokens_per_minute", "tokens_per_minute", "token_burst",
    "batch_expire_after",
)  # fmt: skip
_SIZES = ("batch_max_requests", "batch_max_bytes", "capacity")
_SHARES = ("error_rate", "drop_rate", "pack_drop", "pack_duplicate", "pack_swap", "pack_invalid", "flex_unavailable")
_STATUSES = ("error_status", "outage_status")
_FLAGS = ("compatible", "usage", "resample")
_TEXTS = ("poison", "refuse", "bad_json", "bad_json_once", "truncate", "api_key", "batch_expire", "batch_error")
_OPTIONAL = {"rate_limit", "burst", "input_tokens_per_minute", "output_tokens_per_minute", "tokens_per_minute",
             "capacity", "queue_limit", "today", *_TEXTS}  # fmt: skip


def check_faults(values: dict[str, Any]) -> None:
    """Refuse, with ValueError, a fault value the simulator cannot have (see above); None where it means none."""
    for name, value in values.items():
        problem = None if value is None and name in _OPTIONAL else _fault_problem(name, value)
        if problem:
            raise ValueError(f"{name}={value!r}: {problem}")


def _fault_problem(name: str, value: Any) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if name in _SECONDS or name in _COUNTS or name in _RATES or name in _SIZES:
        whole = name in _COUNTS or name in _SIZES
        if not number or (whole and not isinstance(value, int)):
            return "is not an integer" if whole else "is not a number"
        zero = name in _SECONDS or name in _COUNTS
        if not math.isfinite(value) or not (value >= 0 if zero else value > 0):
            return "must be 0 or more" if zero else "must be more than 0"
    elif name in _SHARES and not (number and 0 <= value <= 1):  # NaN too
        return "must be a share from 0 to 1 (0.05: one request in twenty)"
    elif name in _STATUSES or name == "fail_next":
        for fault in value if name == "fail_next" and isinstance(value, list | tuple) else [value]:
            if not isinstance(fault, dict) and not (
                (isinstance(fault, int) and not isinstance(fault, bool) and 400 <= fault <= 599) or fault in ERRORS
            ):
                named = ", ".join(sorted(str(n) for n in ERRORS if isinstance(n, str)))
                return (
                    f"{fault!r} is an unknown simulator fault: must be an HTTP error status 400..599 or one of " + named
                )
    elif name in _FLAGS and not isinstance(value, bool):
        return "pass true or false"
    elif name in _TEXTS and not isinstance(value, str):
        return "must be a text (a prompt containing it is answered so)"
    elif name == "today":
        try:
            date.fromisoformat(value)
        except (TypeError, ValueError):
            return "must be a day as YYYY-MM-DD, e.g. 2026-12-01"
    return None
