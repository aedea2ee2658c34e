"""The simulator's HTTP side: routes, bodies read in full, answers and errors as the API sends them.

HTTP/1.1 with keep-alive, as the real API: every request body is read to the end so the connection
can be reused, and a dropped connection is a `shutdown(SHUT_RDWR)` the client sees as a reset.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import time
import uuid
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from llmledger._exec.client import SIMULATOR_PATH
from llmledger._step.prices import platform_id
from llmledger.simulator import chat, responses
from llmledger.simulator.batches import _Refused
from llmledger.simulator.core import SimulatorCore
from llmledger.simulator.faults import ERRORS, ErrorSpec
from llmledger.simulator.request import (
    is_retired,
    model_404,
    openai_models,
    request_tokens,
    shutdown_of,
    user_text,
    validate,
)


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once; the default backlog of 5 refuses some

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (killed, cancelled) is normal here, not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def make_handler(sim: SimulatorCore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real API

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def parse_request(self) -> bool:
            """Serve the same routes with or without the path a Simulator's base_url ends in."""
            ok = super().parse_request()
            if ok and self.path.startswith(SIMULATOR_PATH + "/"):
                self.path = self.path[len(SIMULATOR_PATH) :]
            return ok

        def _send(
            self,
            status: int,
            payload: Any,
            headers: dict[str, str] | None = None,
            request_id: str | None = None,
            id_header: str = "request-id",  # OpenAI's: x-request-id
        ) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header(id_header, request_id or _request_id())
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, spec: ErrorSpec, headers: dict[str, str] | None = None) -> None:
            request_id = _request_id()
            self._send(spec.status, spec.body(request_id), {**(headers or {}), **spec.headers()}, request_id)

        def _drop(self) -> None:
            """Hang up without an answer, the way a reset connection looks to the client."""
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def _api_key(self) -> str | None:
            """The key as the API reads it: `x-api-key`, or an `Authorization: Bearer` token (newer SDKs)."""
            bearer = self.headers.get("authorization") or ""
            return self.headers.get("x-api-key") or (bearer[7:] if bearer.lower().startswith("bearer ") else None)

        def _body(self) -> Any:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""  # always read it all: the connection is reused
            return json.loads(raw or b"null")

        def _batches(self, method: str, body: Any = None, size: int = 0) -> bool:
            """The Message Batches endpoints; False when the path is not one of them."""
            if not self.path.startswith("/v1/messages/batches"):
                return False
            if sim.faults.compatible:  # only Anthropic's API has them
                self._error(ErrorSpec(404, "not_found_error", f"no route {self.path}"))
                return True
            if sim.faults.api_key is not None and self._api_key() != sim.faults.api_key:
                self._error(ERRORS[401])
                return True
            try:
                answer = sim.batches.route(method, self.path, body, size, f"http://{self.headers.get('host')}")
            except _Refused as refused:
                self._error(refused.spec)
                return True
            if method == "POST" and self.path.rstrip("/").endswith("/batches") and sim.take("batch_lose_response"):
                self._drop()  # the batch exists; the client never hears of it
                return True
            if isinstance(answer, bytes):
                self._send_bytes(answer, "application/binary")
            else:
                self._send(200, answer)
            return True

        def _openai_batches(self, method: str) -> bool:
            """OpenAI's `/v1/files` and `/v1/batches` (`openai_batches.py`), or Azure OpenAI's `/openai/files` and
            `/openai/batches` (with its `?api-version=`); False when the path is none of them."""
            path, _, query = self.path.partition("?")
            azure = path.startswith(("/openai/files", "/openai/batches"))
            if azure:  # the same API under Azure's path; its lines name the endpoint without /v1
                if "api-version=" not in query:
                    self._error(ErrorSpec(404, "invalid_request_error", "Resource not found (no api-version)"))
                    return True
                path = "/v1" + path.removeprefix("/openai")
            elif not (path.startswith("/v1/files") or path.startswith("/v1/batches")):
                return False
            url = path + ("?" + query if query else "")
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""  # always read it all: the connection is reused
            spec: ErrorSpec | None = None
            if sim.faults.compatible and not azure:  # only OpenAI's API (and Azure's) has them
                spec = ErrorSpec(404, "invalid_request_error", f"no route {path}")
            elif sim.faults.api_key is not None and self._api_key() != sim.faults.api_key:
                spec = ERRORS[401]
            answer: Any = None
            if spec is None:
                batches = sim.openai_batches
                parts = path.rstrip("/").split("/")[3:]
                try:
                    if path.startswith("/v1/batches"):
                        body = json.loads(raw or b"null") if method == "POST" else None
                        answer = batches.route(method, url, body, length, "/openai" if azure else "")
                    elif method == "POST" and not parts:
                        answer = batches.upload(self.headers.get("content-type") or "", raw)
                    elif method == "GET" and len(parts) in (1, 2) and parts[1:] in ([], ["content"]):
                        answer = batches.file(parts[0], content=len(parts) == 2)
                    else:
                        spec = ErrorSpec(404, "invalid_request_error", f"Invalid URL ({method} {path})")
                except _Refused as refused:
                    spec = refused.spec
                except json.JSONDecodeError as exc:
                    spec = ErrorSpec(400, "invalid_request_error", f"request body is not valid JSON: {exc}")
            if spec is not None:
                payload, more = chat.error(spec)
                self._send(spec.status, payload, more, f"req_{uuid.uuid4().hex}", "x-request-id")
            elif method == "POST" and path.rstrip("/") == "/v1/batches" and sim.take("batch_lose_response"):
                self._drop()  # the batch exists; the client never hears of it
            elif isinstance(answer, bytes):
                self._send_bytes(answer, "application/octet-stream")
            else:
                self._send(200, answer, None, f"req_{uuid.uuid4().hex}", "x-request-id")
            return True

        def _send_bytes(self, data: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", _request_id())
            self.end_headers()
            self.wfile.write(data)

        def do_DELETE(self) -> None:
            self._body()
            if not self._batches("DELETE"):
                self._error(ErrorSpec(404, "not_found_error", f"no route {self.path}"))

        def do_GET(self) -> None:
            if self._batches("GET") or self._openai_batches("GET"):
                return
            if self.path == "/_sim/stats":
                self._send(200, sim.stats())
            elif self.path.split("?")[0] == "/v1/models":
                self._models()
            else:
                self._error(ErrorSpec(404, "not_found_error", f"no route {self.path}"))

        def _models(self) -> None:
            """GET /v1/models: Anthropic's list (no lifecycle in it), or OpenAI's, each model with its
            `shutdown_date` (YYYY-MM-DD, or null when none is announced), as the SDK that asks expects."""
            f = sim.faults
            if sim.faults.api_key is not None and self._api_key() != f.api_key:
                self._error(ErrorSpec(401, "authentication_error", "invalid x-api-key"))
                return
            with sim._lock:
                sim._stats["model_lists"] += 1
            if self.headers.get("anthropic-version"):
                self._send(200, {"data": [], "has_more": False, "first_id": None, "last_id": None})
                return
            known = [m for m in (*openai_models(), *f.models) if not is_retired(m, f.shutdowns, f.today)]
            data = [
                {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "openai",
                 "shutdown_date": shutdown_of(m, f.shutdowns)}
                for m in dict.fromkeys(known)
            ]  # fmt: skip
            self._send(200, {"object": "list", "data": data}, {}, f"req_{uuid.uuid4().hex}", "x-request-id")

        def do_POST(self) -> None:
            if self._openai_batches("POST"):
                return
            size = int(self.headers.get("content-length") or 0)
            try:
                body = self._body()
            except json.JSONDecodeError as exc:
                self._error(ErrorSpec(400, "invalid_request_error", f"request body is not valid JSON: {exc}"))
                return
            if self._batches("POST", body, size):
                return
            if self.path == "/_sim/config":
                try:
                    sim.configure(**body)
                except (TypeError, ValueError) as exc:
                    self._error(ErrorSpec(400, "invalid_request_error", str(exc)))
                    return
                self._send(200, asdict(sim.faults))
            elif self.path == "/_sim/reset":
                sim.reset_stats()
                self._send(200, sim.stats())
            elif self.path.split("?")[0] == "/v1/messages":
                self._counted(self._messages, body)
            elif self.path.split("?")[0] == "/v1/chat/completions":
                self._counted(self._chat, body)
            elif (found := _BEDROCK.fullmatch(self.path.split("?")[0])) is not None:
                self._cloud(body, found.group(1), "bedrock-2023-05-31")
            elif (found := _VERTEX.fullmatch(self.path.split("?")[0])) is not None:
                self._cloud(body, found.group(1), "vertex-2023-10-16")
            elif (found := _AZURE.fullmatch(self.path.split("?")[0])) is not None:  # the deployment names the model
                deployment = unquote(found.group(1))
                self._counted(self._chat, {**body, "model": deployment} if isinstance(body, dict) else body)
            elif self.path.split("?")[0] == "/v1/responses" and not sim.faults.compatible:  # OpenAI's own
                self._counted(lambda b: self._chat(b, responses), body)
            else:
                self._error(ErrorSpec(404, "not_found_error", f"no route {self.path}"))

        def _counted(self, route: Any, body: Any) -> None:
            """Serve one model request, counted among those at work at once (`max_concurrent`)."""
            with sim._lock:
                sim._stats["_concurrent"] += 1
                sim._stats["max_concurrent"] = max(sim._stats["max_concurrent"], sim._stats["_concurrent"])
            try:
                route(body)
            finally:
                with sim._lock:
                    sim._stats["_concurrent"] -= 1

        def _dropped(self, action: str, body: Any, delay: float) -> bool:
            """Hang up on a request the faults say to drop (after its latency); True when it was."""
            if action != "drop":
                return False
            sim._note(body, 0)
            with sim._lock:
                sim._stats["dropped"] += 1
            if delay:
                time.sleep(delay)
            self._drop()
            return True

        def _delay(self) -> float:
            f = sim.faults
            return f.latency + (sim._rng.random() * f.jitter if f.jitter else 0.0)

        def _cloud(self, body: Any, model: str, version: str) -> None:
            """Claude on Amazon Bedrock (`POST /model/{model}/invoke`) or Google Vertex AI (`POST
            /projects/{p}/locations/{r}/publishers/anthropic/models/{model}:rawPredict`): the Messages API's body
            with the model in the URL and the platform's `anthropic_version` in the body; its answers, without
            Anthropic's rate-limit headers (the platforms send none)."""
            if not isinstance(body, dict) or not isinstance(body.get("anthropic_version"), str) or "model" in body:
                said = body.get("anthropic_version") if isinstance(body, dict) else None
                problem = (
                    f"anthropic_version (such as {version!r}) is required and the model is in the URL, got {said!r}"
                )
                self._error(ErrorSpec(400, "invalid_request_error", problem))
                return
            shaped = {k: v for k, v in body.items() if k != "anthropic_version"}
            self._counted(lambda b: self._messages(b, cloud=True), {**shaped, "model": platform_id(unquote(model))})

        def _messages(self, body: Any, *, cloud: bool = False) -> None:
            problem = validate(body)
            prompt = user_text(body) if isinstance(body, dict) else ""
            tokens_in, max_out = (request_tokens(body), int(body["max_tokens"])) if problem is None else (0, 0)
            action, spec = sim._decide(prompt, self._api_key(), tokens_in, max_out)
            f = sim.faults
            delay = self._delay()
            if self._dropped(action, body, delay):
                return
            headers = {} if cloud else sim._ratelimit_headers()
            if spec is None and problem:
                spec = ErrorSpec(400, "invalid_request_error", problem)
            if spec is None:
                spec = model_404(body, f, only=f.compatible)
            if spec is not None:
                sim._note(body, spec.status)
                self._error(spec, headers)
                return
            if not sim.enter_slot():
                sim._note(body, 429)
                self._error(ErrorSpec(429, "rate_limit_error", "server busy: too many requests waiting"), headers)
                return
            try:
                if delay:
                    time.sleep(delay)
                answer = sim._answer(body)
            finally:
                sim.leave_slot()
            sim._tokens.settle(max_out, answer["usage"]["output_tokens"])
            headers = {} if cloud else sim._ratelimit_headers()
            sim._note(body, 200)
            if not f.usage:
                answer["usage"] = None
            self._send(200, answer, headers)

        def _chat(self, body: Any, api: Any = chat) -> None:
            """OpenAI's chat completions (`chat.py`), or its Responses API (`api`: `responses.py`): the same faults
            and answers, in OpenAI's words."""
            problem = api.validate(body, own_api=not sim.faults.compatible)
            shaped = api.as_messages(body) if problem is None else None
            prompt = user_text(shaped or body) if isinstance(body, dict) else ""  # a file's marker with the text
            tokens_in, max_out = (request_tokens(shaped), int(shaped["max_tokens"])) if shaped else (0, 0)
            action, spec = sim._decide(prompt, self._api_key(), tokens_in, max_out)
            f, delay = sim.faults, self._delay()
            if self._dropped(action, body, delay):
                return
            headers = sim._openai_headers()
            if spec is None and problem:
                spec = ErrorSpec(400, "invalid_request_error", problem)
            if spec is None and model_404(body, f, only=f.compatible) is not None:
                message = f"The model `{body['model']}` does not exist or you do not have access to it."
                if is_retired(str(body["model"]), f.shutdowns, f.today):  # OpenAI's words for a shut down model
                    message = (
                        f"The model `{body['model']}` has been deprecated, learn more here: "
                        "https://platform.openai.com/docs/deprecations"
                    )
                spec = ErrorSpec(404, "invalid_request_error", message)
            reply: dict[str, Any] | None = None
            if spec is None and chat.tier(body) == "flex" and sim.draw() < f.flex_unavailable:
                spec = FLEX_UNAVAILABLE
            if spec is None and not sim.enter_slot():
                spec = ErrorSpec(429, "rate_limit_error", "server busy: too many requests waiting")
            elif spec is None:
                try:
                    if delay:
                        time.sleep(delay)
                    assert shaped is not None
                    reply = api.answer(sim, body, shaped)
                finally:
                    sim.leave_slot()
            if spec is not None or reply is None:
                spec = spec or ErrorSpec(500, "api_error", "no answer")
                sim._note(body, spec.status)
                payload, more = chat.error(spec)
                self._send(spec.status, payload, {**headers, **more}, f"req_{uuid.uuid4().hex}", "x-request-id")
                return
            sim._tokens.settle(max_out, api.output_tokens(reply))
            sim._note(body, 200)
            if not f.usage:
                reply["usage"] = None
            self._send(200, reply, sim._openai_headers(), f"req_{uuid.uuid4().hex}", "x-request-id")

    return Handler


# Flex processing's "429 Resource Unavailable" (OpenAI's flex guide: not charged; retry with backoff, or at the
# standard tier). The guide names no error code: this one's is the simulator's own.
FLEX_UNAVAILABLE = ErrorSpec(
    429, "resource_unavailable", "Resource Unavailable: flex processing has no capacity now, try again later.",
    error_code="resource_unavailable",
)  # fmt: skip
_BEDROCK = re.compile(r"/model/([^/]+)/invoke")
_VERTEX = re.compile(r"/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/([^/:]+):rawPredict")
_AZURE = re.compile(r"/openai/deployments/([^/]+)/chat/completions")  # Azure OpenAI, with its ?api-version=


def _request_id() -> str:
    return f"req_sim_{uuid.uuid4().hex[:24]}"
