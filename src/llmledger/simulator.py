"""An offline stand-in for the Anthropic Messages API, for tests, demos and benchmarks.

It speaks `POST /v1/messages` with the real API's JSON shapes, error bodies and
`anthropic-ratelimit-*` / `retry-after` headers, answers deterministically, and
can be told to misbehave (latency, a rate limit, error bursts, dropped
connections, an outage window, a poison substring). It counts every answer, so
a test can assert exactly how many calls were paid.

    with Simulator(latency=0.05, rate_limit=50) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="sim")
        ...
        assert sim.stats()["paid"] == 10

Faults can also be changed while it runs: `sim.configure(fail_next=[529] * 5)`,
or `POST /_sim/config` with the same keys as JSON when it runs in another
process (`llmledger simulator --port 8765`).
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[str, str | None], str]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
    529: "overloaded_error",
}

_POSITIVE = {"great", "love", "excellent", "perfect", "happy", "fast", "recommend", "works", "best", "good"}
_NEGATIVE = {"broke", "broken", "refund", "late", "never", "worst", "bad", "poor", "slow", "disappointed"}


def default_reply(prompt: str, system: str | None = None) -> str:
    """A deterministic answer that looks like what a prompt asked for.

    Sentiment prompts get a label counted from a small lexicon; everything else
    gets a short extract of the prompt's last line, so different rows get
    different, reproducible answers.
    """
    lowered = prompt.lower()
    if "sentiment" in lowered or ("positive" in lowered and "negative" in lowered):
        body = lowered.rsplit(":", 1)[-1]
        words = re.findall(r"[a-z']+", body)
        score = sum(w in _POSITIVE for w in words) - sum(w in _NEGATIVE for w in words)
        return "positive" if score > 0 else "negative" if score < 0 else "neutral"
    last = prompt.strip().splitlines()[-1] if prompt.strip() else ""
    words = last.split(": ", 1)[-1].split()
    extract = " ".join(words[:12]) + (" …" if len(words) > 12 else "")
    return f"Summary: {extract}"


def count_tokens(text: str) -> int:
    """Roughly four characters a token, as a stand-in for the real tokenizer."""
    return max(1, math.ceil(len(text) / 4))


@dataclass
class Faults:
    """What the simulator does wrong. Every field can be changed while it runs."""

    latency: float = 0.0  # seconds before each answer
    jitter: float = 0.0  # plus a uniform random 0..jitter seconds
    rate_limit: float | None = None  # requests per second (token bucket); None = unlimited
    burst: float | None = None  # bucket size; default one second's worth
    fail_next: list[int] = field(default_factory=list)  # statuses for the next requests, in order
    error_rate: float = 0.0  # share of requests answered with `error_status`
    error_status: int = 529
    drop_next: int = 0  # close the next N connections without an answer
    drop_rate: float = 0.0
    outage_until: float = 0.0  # unix time; until then every request gets `outage_status`
    outage_status: int = 529
    poison: str | None = None  # prompts containing this get a 400
    refuse: str | None = None  # prompts containing this get stop_reason "refusal"
    api_key: str | None = None  # when set, any other key gets a 401
    seed: int = 0


class _Bucket:
    def __init__(self, rate: float, size: float) -> None:
        self.rate, self.size = rate, size
        self.tokens, self.stamp = size, time.monotonic()

    def take(self) -> tuple[bool, float]:
        """Take one token; return (granted, seconds until one is available)."""
        now = time.monotonic()
        self.tokens = min(self.size, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True, 0.0
        return False, (1 - self.tokens) / self.rate


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 refuses some

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (killed, cancelled) is normal here, not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Simulator:
    """A local Messages API server on 127.0.0.1, started in a background thread."""

    def __init__(
        self,
        *,
        port: int = 0,
        responder: Responder | None = None,
        **faults: Any,
    ) -> None:
        self.responder = responder or default_reply
        self.faults = Faults(**faults)
        self._lock = threading.Lock()
        self._rng = random.Random(self.faults.seed)
        self._bucket: _Bucket | None = None
        self._reset_bucket()
        self._stats = self._empty_stats()
        self._log: deque[dict[str, Any]] = deque(maxlen=100_000)
        self._server = _QuietServer(("127.0.0.1", port), _make_handler(self))
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Simulator:
        self._thread = threading.Thread(target=self._server.serve_forever, name="llmledger-simulator",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control -----------------------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        """Change faults while running, e.g. `configure(fail_next=[529] * 3)` or `outage_for=5`."""
        with self._lock:
            if "outage_for" in changes:
                changes["outage_until"] = time.time() + float(changes.pop("outage_for"))
            known = {f.name for f in fields(Faults)}
            unknown = set(changes) - known
            if unknown:
                raise ValueError(f"unknown simulator setting(s) {sorted(unknown)}; known: {sorted(known)}")
            for name, value in changes.items():
                setattr(self.faults, name, list(value) if name == "fail_next" else value)
            if {"rate_limit", "burst"} & set(changes):
                self._reset_bucket()
            if "seed" in changes:
                self._rng = random.Random(self.faults.seed)

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = self._empty_stats()
            self._log.clear()

    def log(self) -> list[dict[str, Any]]:
        """Every request so far (the last 100,000): time, status, prompt, system, model, max_tokens."""
        with self._lock:
            return list(self._log)

    def _note(self, body: Any, status: int) -> None:
        body = body if isinstance(body, dict) else {}
        system = body.get("system")
        with self._lock:
            self._log.append({"time": time.time(), "status": status, "prompt": _user_text(body),
                              "system": system, "model": body.get("model"), "max_tokens": body.get("max_tokens")})

    def stats(self) -> dict[str, Any]:
        """Counts so far: `requests`, `paid` (200 answers), `by_status`, `dropped`, tokens, `prompts`."""
        with self._lock:
            s = dict(self._stats)
            s["by_status"] = dict(s["by_status"])
            s["prompts"] = dict(s["prompts"])
            return s

    def paid_prompts(self) -> Counter[str]:
        """How many paid answers each prompt text got: a value above 1 means a row was paid twice."""
        with self._lock:
            return Counter(self._stats["prompts"])

    @staticmethod
    def _empty_stats() -> dict[str, Any]:
        return {"requests": 0, "paid": 0, "dropped": 0, "by_status": Counter(), "input_tokens": 0,
                "output_tokens": 0, "prompts": Counter(), "max_concurrent": 0, "_concurrent": 0}

    def _reset_bucket(self) -> None:
        rate = self.faults.rate_limit
        self._bucket = _Bucket(rate, self.faults.burst or max(1.0, rate)) if rate else None

    # -- the API -----------------------------------------------------------------------------
    def _decide(self, prompt: str, api_key: str | None) -> tuple[str, int, float]:
        """Pick what to do with one request: ("drop"|"error"|"ok", status, retry_after)."""
        f = self.faults
        with self._lock:
            self._stats["requests"] += 1
            if f.drop_next > 0:
                f.drop_next -= 1
                return "drop", 0, 0.0
            if f.drop_rate and self._rng.random() < f.drop_rate:
                return "drop", 0, 0.0
            if f.api_key is not None and api_key != f.api_key:
                return "error", 401, 0.0
            if f.fail_next:
                return "error", f.fail_next.pop(0), 1.0
            if time.time() < f.outage_until:
                return "error", f.outage_status, 1.0
            if f.error_rate and self._rng.random() < f.error_rate:
                return "error", f.error_status, 1.0
            if self._bucket is not None:
                granted, wait = self._bucket.take()
                if not granted:
                    return "error", 429, wait
            if f.poison and f.poison in prompt:
                return "error", 400, 0.0
            return "ok", 200, 0.0

    def _ratelimit_headers(self) -> dict[str, str]:
        if self._bucket is None:
            return {}
        b = self._bucket
        limit = int(b.rate * 60)
        remaining = max(0, int(b.tokens))
        reset = datetime.now(UTC) + timedelta(seconds=(b.size - b.tokens) / b.rate)
        return {
            "anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": reset.isoformat(timespec="seconds").replace("+00:00", "Z"),
        }

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = _user_text(body)
        system = body.get("system")
        if isinstance(system, list):
            system = "".join(b.get("text", "") for b in system if isinstance(b, dict))
        text = self.responder(prompt, system)
        max_tokens = int(body.get("max_tokens") or 0)
        stop_reason = "end_turn"
        if self.faults.refuse and self.faults.refuse in prompt:
            text, stop_reason = "", "refusal"
        elif count_tokens(text) > max_tokens:
            text, stop_reason = text[: max_tokens * 4], "max_tokens"
        usage_in = count_tokens((system or "") + prompt)
        usage_out = count_tokens(text) if text else 0
        with self._lock:
            self._stats["paid"] += 1
            self._stats["input_tokens"] += usage_in
            self._stats["output_tokens"] += usage_out
            self._stats["prompts"][prompt] += 1
        return {
            "id": f"msg_sim_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": usage_in, "output_tokens": usage_out,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }


def _user_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))
    return ""


def _validate(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["messages"], list) or not body["messages"]:
        return "messages: at least one message is required"
    if not _user_text(body):
        return "messages: text content blocks must be non-empty"
    return None


def _make_handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            # One request per connection: with keep-alive, about 1 in 16 bursts of requests left one
            # SDK call waiting for an answer this server had already sent (cause not found; see
            # the issue notes). A fresh loopback connection per request costs ~0.1 ms.
            self.close_connection = True
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("connection", "close")
            self.send_header("request-id", f"req_sim_{uuid.uuid4().hex[:16]}")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
            kind = _ERROR_TYPES.get(status, "api_error")
            self._send(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw or b"null")

        def do_GET(self) -> None:
            if self.path == "/_sim/stats":
                self._send(200, sim.stats())
            elif self.path == "/v1/models":
                self._send(200, {"data": [], "has_more": False, "first_id": None, "last_id": None})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            try:
                body = self._body()
            except json.JSONDecodeError as exc:
                self._error(400, f"request body is not valid JSON: {exc}")
                return
            if self.path == "/_sim/config":
                try:
                    sim.configure(**body)
                except (TypeError, ValueError) as exc:
                    self._error(400, str(exc))
                    return
                self._send(200, asdict(sim.faults))
            elif self.path == "/_sim/reset":
                sim.reset_stats()
                self._send(200, sim.stats())
            elif self.path.split("?")[0] == "/v1/messages":
                self._messages(body)
            else:
                self._error(404, f"no route {self.path}")

        def _messages(self, body: Any) -> None:
            with sim._lock:
                sim._stats["_concurrent"] += 1
                sim._stats["max_concurrent"] = max(sim._stats["max_concurrent"], sim._stats["_concurrent"])
            try:
                self._messages_inner(body)
            finally:
                with sim._lock:
                    sim._stats["_concurrent"] -= 1

        def _messages_inner(self, body: Any) -> None:
            problem = _validate(body)
            prompt = _user_text(body) if isinstance(body, dict) else ""
            action, status, retry_after = sim._decide(prompt, self.headers.get("x-api-key"))
            f = sim.faults
            delay = f.latency + (sim._rng.random() * f.jitter if f.jitter else 0.0)
            if action == "drop":
                sim._note(body, 0)
                with sim._lock:
                    sim._stats["dropped"] += 1
                if delay:
                    time.sleep(delay)
                self.close_connection = True
                self.connection.close()
                return
            headers = sim._ratelimit_headers()
            if action == "error":
                sim._note(body, status)
                with sim._lock:
                    sim._stats["by_status"][status] += 1
                if status in (429, 529) or status >= 500:
                    headers["retry-after"] = str(max(1, math.ceil(retry_after)))
                    headers["x-should-retry"] = "true"
                message = {
                    400: f"prompt contains the poison substring {f.poison!r}",
                    401: "invalid x-api-key",
                    429: "Number of requests has exceeded your rate limit",
                    529: "Overloaded",
                }.get(status, "Internal server error")
                self._error(status, message, headers)
                return
            if problem:
                sim._note(body, 400)
                with sim._lock:
                    sim._stats["by_status"][400] += 1
                self._error(400, problem, headers)
                return
            if delay:
                time.sleep(delay)
            answer = sim._answer(body)
            sim._note(body, 200)
            with sim._lock:
                sim._stats["by_status"][200] += 1
            self._send(200, answer, headers)

    return Handler
