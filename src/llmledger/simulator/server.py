"""An offline stand-in for the Anthropic Messages API, for tests, demos and benchmarks.

It speaks `POST /v1/messages` and the Message Batches endpoints
(`/v1/messages/batches`: `batches.py`), and OpenAI's `POST /v1/chat/completions` (`chat.py`) with its files
and batches (`openai_batches.py`), with the real APIs' JSON shapes, error bodies
(`request_id`, `details.error_code`) and headers (`request-id`,
`anthropic-ratelimit-*`, `retry-after`, `retry-after-ms`, `x-should-retry`),
keeps connections alive as the API does, answers deterministically, and can
be told to misbehave: latency, a rate limit, error bursts (any status, or a
named case such as `"enforced_spend_limit_reached"`), dropped connections, an
outage window, a poison substring. It counts every answer and logs every
request body, so a test can assert exactly how many calls were paid and what
was sent.

    with Simulator(latency=0.05, rate_limit=50) as sim:
        client = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="sim")
        ...
        assert sim.stats()["paid"] == 10

Image and document (PDF, text) content blocks are refused, billed and answered as
the API does (`media.py`); `png`, `pdf` and `sample_documents` (`samples.py`) make files to
send it.

Faults can also be changed while it runs: `sim.configure(fail_next=[529] * 5)`,
or `POST /_sim/config` with the same keys as JSON when it runs in another
process (`llmledger simulator --port 8765`).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from llmledger._exec.client import SIMULATOR_PATH, use_session_simulator
from llmledger.simulator.batches import SimBatches
from llmledger.simulator.chat import AutomaticCache
from llmledger.simulator.faults import ERRORS, ErrorSpec, Faults, check_faults, error_spec
from llmledger.simulator.http import QuietServer, make_handler
from llmledger.simulator.limits import Bucket, PromptCache, TokenLimits
from llmledger.simulator.media import count_tokens
from llmledger.simulator.openai_batches import SimOpenAIBatches
from llmledger.simulator.packs import answer_pack, is_pack, own_system
from llmledger.simulator.replies import choices, default_reply, fake_json
from llmledger.simulator.request import output_schema, request_tokens, user_text

Responder = Callable[[str, str | None], str]


class Simulator:
    """A local Messages API server on 127.0.0.1, started in a background thread."""

    def __init__(self, *, port: int = 0, responder: Responder | None = None, **faults: Any) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:  # 99999: an OverflowError
            raise ValueError(f"port must be 0 (any free port) to 65535, got {port!r}")
        self.responder = responder or default_reply
        check_faults(faults)
        if "outage_for" in faults:  # seconds from now, as configure() takes it
            faults["outage_until"] = time.time() + float(faults.pop("outage_for"))
        unknown = set(faults) - {f.name for f in fields(Faults)}
        if unknown:
            raise ValueError(
                f"unknown simulator setting(s) {sorted(unknown)}; known: {sorted(f.name for f in fields(Faults))}"
            )
        self.faults = Faults(**faults)
        self._lock = threading.Lock()
        self._rng = random.Random(self.faults.seed)
        self._bucket: Bucket | None = None
        self._tokens = TokenLimits(None, None, 60.0)
        self._reset_bucket()
        self._stats = self._empty_stats()
        self._asked: Counter[str] = Counter()  # requests answered, by what makes them the same request
        self._log: deque[dict[str, Any]] = deque(maxlen=100_000)
        self._cache = PromptCache()
        self.chat_cache = AutomaticCache()  # OpenAI's automatic prompt cache (chat completions)
        self._room = threading.Condition()  # `capacity`: requests at work and waiting for a slot
        self._working = self._waiting = 0
        self.batches = SimBatches(self)
        self.openai_batches = SimOpenAIBatches(self)  # OpenAI's files and /v1/batches
        self._server = QuietServer(("127.0.0.1", port), make_handler(self))
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """Where to point a client. Its path marks the answers as the simulator's wherever the client runs
        (`{step}_source` = "simulator"); `http://127.0.0.1:{port}` serves the same routes."""
        return f"http://127.0.0.1:{self.port}{SIMULATOR_PATH}"

    @property
    def server_url(self) -> str:
        """The same routes without the simulator's mark: a client pointed here (`base_url=`) takes it for another
        server, its answers for that server's, as with `compatible=True` it answers like one (vLLM, Ollama)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Simulator:
        if self._thread is not None:  # started already (e.g. `with llmledger.simulate() as sim:`)
            return self
        self._thread = threading.Thread(target=self.serve_forever, name="llmledger-simulator", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        # `stop` waits for the loop to look again: every 0.05 s, not socketserver's 0.5 s (a suite starts hundreds)
        self._server.serve_forever(poll_interval=0.05)

    def stop(self) -> None:
        if _session[0] is self:  # apply_llm goes back to the environment's API
            _session[0] = None
            use_session_simulator(None)
        self._server.shutdown()
        self._server.server_close()

    def __repr__(self) -> str:
        which = " (this session's: apply_llm answers from it)" if _session[0] is self else ""
        return f"<llmledger Simulator at {self.base_url}{which}: simulated answers, not Claude's; nothing is paid>"

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control -----------------------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        """Change faults while running, e.g. `configure(fail_next=[529] * 3)` or `outage_for=5`."""
        check_faults(changes)
        with self._lock:
            if "outage_for" in changes:
                changes["outage_until"] = time.time() + float(changes.pop("outage_for"))
            known = {f.name for f in fields(Faults)}
            unknown = set(changes) - known
            if unknown:
                raise ValueError(f"unknown simulator setting(s) {sorted(unknown)}; known: {sorted(known)}")
            for fault in [
                *changes.get("fail_next", []),
                changes.get("error_status", 529),
                changes.get("outage_status", 529),
            ]:
                error_spec(fault)  # refuse an unknown fault now, not at the next request
            for name, value in changes.items():
                setattr(self.faults, name, list(value) if name == "fail_next" else value)
            if {
                "rate_limit",
                "burst",
                "input_tokens_per_minute",
                "output_tokens_per_minute",
                "tokens_per_minute",
                "token_burst",
            } & set(changes):
                self._reset_bucket()
            if "seed" in changes:
                self._rng = random.Random(self.faults.seed)

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = self._empty_stats()
            self._asked.clear()  # what was asked before is forgotten with the counts
            self._log.clear()

    def log(self) -> list[dict[str, Any]]:
        """Every request so far (the last 100,000): time, status, prompt, system, model, max_tokens, body."""
        with self._lock:
            return list(self._log)

    def _note(self, body: Any, status: int) -> None:
        body = body if isinstance(body, dict) else {}
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        # a chat completions body carries its system prompt as a message, its bound as max_completion_tokens
        said = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        with self._lock:
            self._log.append(
                {
                    "time": time.time(),
                    "status": status,
                    "prompt": user_text(body),
                    "system": body.get("system", said[0] if said else None),
                    "model": body.get("model"),
                    "max_tokens": body.get("max_tokens", body.get("max_completion_tokens")),
                    "body": body,
                }
            )
            if status:
                self._stats["by_status"][status] += 1

    def stats(self) -> dict[str, Any]:
        """Counts so far: `requests`, `paid` (answers, online and in batches), `by_status`, `dropped`, tokens,
        `prompts`, and for Message Batches `batches` (created), `batch_requests`, `batch_paid`."""
        self.batches.advance_all()
        self.openai_batches.advance_all()
        with self._lock:
            s = dict(self._stats)
            s["by_status"] = dict(s["by_status"])
            s["prompts"] = dict(s["prompts"])
            return s

    def paid_prompts(self) -> Counter[str]:
        """How many paid answers each prompt text got: a value above 1 means a row was paid twice."""
        with self._lock:
            return Counter(self._stats["prompts"])

    def take(self, fault: str) -> bool:
        """Use up one of a counted fault such as `batch_lose_response`: True when one was left."""
        with self._lock:
            left = getattr(self.faults, fault)
            if left > 0:
                setattr(self.faults, fault, left - 1)
            return left > 0

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def draw(self) -> float:
        """A number from the simulator's seeded generator (0 to 1): whether a fault given as a share strikes."""
        with self._lock:
            return self._rng.random()

    def shuffle(self, items: list[Any]) -> None:
        with self._lock:
            self._rng.shuffle(items)

    @staticmethod
    def _empty_stats() -> dict[str, Any]:
        return {
            "requests": 0,
            "paid": 0,
            "dropped": 0,
            "by_status": Counter(),
            "input_tokens": 0,
            "batches": 0,
            "batch_requests": 0,
            "batch_paid": 0,
            "output_tokens": 0,
            "cache_write_tokens": 0,
            "cache_read_tokens": 0,
            "prompts": Counter(),
            "max_concurrent": 0,
            "_concurrent": 0,
            "model_lists": 0,  # GET /v1/models answered
        }

    def _reset_bucket(self) -> None:
        f = self.faults
        rate = f.rate_limit
        self._bucket = Bucket(rate, f.burst or max(1.0, rate)) if rate else None
        self._tokens = TokenLimits(
            f.input_tokens_per_minute, f.output_tokens_per_minute, f.token_burst, f.tokens_per_minute
        )

    # -- the API -----------------------------------------------------------------------------
    def _decide(
        self, prompt: str, api_key: str | None, tokens_in: int = 0, max_out: int = 0
    ) -> tuple[str, ErrorSpec | None]:
        """Pick what to do with one request: ("drop" | "error" | "ok", the error to send)."""
        f = self.faults
        with self._lock:
            self._stats["requests"] += 1
            if f.drop_next > 0:
                f.drop_next -= 1
                return "drop", None
            if f.drop_rate and self._rng.random() < f.drop_rate:
                return "drop", None
            if f.api_key is not None and api_key != f.api_key:
                return "error", ERRORS[401]
            if f.fail_next:
                return "error", error_spec(f.fail_next.pop(0))
            if time.time() < f.outage_until:
                return "error", error_spec(f.outage_status)
            if f.error_rate and self._rng.random() < f.error_rate:
                return "error", error_spec(f.error_status)
            if self._bucket is not None:
                granted, wait = self._bucket.take()
                if not granted:
                    spec = ERRORS[429]
                    return "error", ErrorSpec(spec.status, spec.type, spec.message, retry_after=wait)
            refused = self._tokens.admit(tokens_in, max_out)
            if refused is not None:
                if self._bucket is not None:
                    self._bucket.give_back(1)
                return "error", refused
            if f.poison and f.poison in prompt:
                return "error", ErrorSpec(
                    400, "invalid_request_error", f"prompt contains the poison substring {f.poison!r}"
                )
            return "ok", None

    def enter_slot(self) -> bool:
        """Wait for a slot among `capacity` (none: at once); False when `queue_limit` requests already wait."""
        with self._room:
            f = self.faults
            if f.capacity is not None and self._working >= f.capacity:
                if f.queue_limit is not None and self._waiting >= f.queue_limit:
                    return False
                self._waiting += 1
                while self.faults.capacity is not None and self._working >= self.faults.capacity:
                    self._room.wait(0.05)
                self._waiting -= 1
            self._working += 1
            return True

    def leave_slot(self) -> None:
        with self._room:
            self._working -= 1
            self._room.notify()

    def _ratelimit_headers(self) -> dict[str, str]:
        if self.faults.compatible:  # such servers announce no limits
            return {}
        headers = self._bucket.headers("requests") if self._bucket is not None else {}
        return {**headers, **self._tokens.headers()}

    def _openai_headers(self) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers (none in compatible mode)."""
        if self.faults.compatible:
            return {}
        headers = self._bucket.openai_headers("requests") if self._bucket is not None else {}
        return {**headers, **self._tokens.openai_headers()}

    def _answer_item(self, body: dict[str, Any], system: str | None, request: str, schema: Any) -> Any:
        """One item of a pack answered as its request alone would be (the caller holds the lock): text, or the
        JSON value of the step's schema; asked again, another answer, as sampling would give."""
        own = own_system(system)
        same = json.dumps([body.get("model"), own, request, schema], sort_keys=True, default=str)
        asked_before = self._asked[same]
        self._asked[same] += 1
        if schema is not None and self.responder is default_reply:
            return json.loads(fake_json(schema, request, asked_before))
        mine = self.responder is default_reply
        options = choices(f"{own or ''}\n{request}") if mine else []
        f = self.faults
        text = misread(self.responder(request, own), str(body.get("model")), request, f.accuracy, options,
                       asked_before if mine and f.resample else 0)  # fmt: skip
        return json.loads(text) if schema is not None else text

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = user_text(body)
        system = body.get("system")
        if isinstance(system, list):
            system = "".join(b.get("text", "") for b in system if isinstance(b, dict))
        schema = output_schema(body)
        first = user_text({"messages": (body.get("messages") or [])[:1]})
        f = self.faults
        same = json.dumps([body.get("model"), system, body.get("messages"), schema], sort_keys=True, default=str)
        with self._lock:  # the same request asked before gets another answer, as sampling would
            asked_before = self._asked[same]
            self._asked[same] += 1
        paid = [prompt]  # the requests this answer pays for: a pack's items, each as if sent alone
        if is_pack(schema):
            assert schema is not None
            with self._lock:
                text, paid = answer_pack(
                    prompt, schema, lambda request, inner: self._answer_item(body, system, request, inner),
                    faults=f, rng=self._rng,
                )  # fmt: skip
        elif schema is not None and self.responder is default_reply:
            text = fake_json(schema, first, asked_before)
        else:
            own = self.responder is default_reply  # a test's own responder answers as it likes, asked again or not
            options = choices(f"{system or ''}\n{prompt}") if own else []
            text = misread(
                self.responder(prompt, system), str(body.get("model")), prompt, f.accuracy, options,
                asked_before if own and f.resample else 0,
            )  # fmt: skip
        if schema is not None and (
            (f.bad_json and f.bad_json in first)
            or (f.bad_json_once and f.bad_json_once in first and len(body["messages"]) == 1)
        ):
            text = text.replace("{", "", 1) or "not json"
        max_tokens = int(body.get("max_tokens") or 0)
        if f.truncate and f.truncate in first:
            max_tokens = min(max_tokens, max(1, count_tokens(text) // 2))
        stop_reason, stop_sequence = "end_turn", None
        hits = [(text.find(s), s) for s in body.get("stop_sequences") or [] if s in text]
        if self.faults.refuse and self.faults.refuse in prompt:
            text, stop_reason = "", "refusal"
        elif hits:
            at, stop_sequence = min(hits)
            text, stop_reason = text[:at], "stop_sequence"
        elif count_tokens(text) > max_tokens:
            text, stop_reason = text[: max_tokens * 4], "max_tokens"
        usage_in = request_tokens(body)
        usage_out = count_tokens(text) if text else 0
        write_5m, write_1h, read = self._cache.account(body) if not f.compatible else (0, 0, 0)
        usage_in -= write_5m + write_1h + read
        with self._lock:
            self._stats["paid"] += 1
            self._stats["cache_write_tokens"] += write_5m + write_1h
            self._stats["cache_read_tokens"] += read
            self._stats["input_tokens"] += usage_in
            self._stats["output_tokens"] += usage_out
            for request in paid:
                self._stats["prompts"][request] += 1
        usage: dict[str, Any] = {"input_tokens": usage_in, "output_tokens": usage_out}
        if not f.compatible:
            usage.update(
                cache_creation_input_tokens=write_5m + write_1h,
                cache_read_input_tokens=read,
                cache_creation={"ephemeral_5m_input_tokens": write_5m, "ephemeral_1h_input_tokens": write_1h},
            )
        return {
            "id": f"msg_sim_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }


_LABELS = ("positive", "negative", "neutral")


def misread(
    text: str, model: str, prompt: str, accuracy: dict[str, float], options: Sequence[str] = (), asked: int = 0
) -> str:
    """`text`, or for the share of prompts beyond `model`'s accuracy another answer: the next of the options the
    prompt names (or the next sentiment label), or the text marked unsure. Which prompts is fixed by a hash of
    model and prompt, as a model's mistakes are; asked again (`asked` > 0, a redo), the draw is made afresh, as
    sampling would, and a free-text answer is another take."""
    share = accuracy.get(model, 1.0 if not asked else 0.5)  # asked again: another draw
    draw = zlib.crc32(f"{model}\x00{prompt}\x00{asked or ''}".encode()) % 1000
    if draw < share * 1000:
        return text if not asked or text in options or text in _LABELS else f"{text} (take {asked + 1})"
    labels = list(options) if text in options else list(_LABELS) if text in _LABELS else []
    if labels:
        return labels[(labels.index(text) + 1) % len(labels)]
    return f"{text} (unsure)" if not asked else f"{text} (take {asked + 1})"


_session: list[Simulator | None] = [None]  # the simulator simulate() started for this session


def simulate(**faults: Any) -> Simulator:
    """Start the bundled simulator and make every `apply_llm` (and `resume`, `work`, `pipeline`) of this
    session use it when no `client=` is passed: no API key, no set-up, nothing paid; answers are simulated.

        llmledger.simulate(latency=0.02)            # the notebook's first cell; delete it for the real API

    `faults` are the Simulator's (latency, rate_limit, error_rate, poison, ...). Its answers follow the prompt
    for the common tasks (a label among the options a prompt names, spam or ham, sentiment; JSON of an `output=`
    schema, fields a file states read from it; otherwise `Summary: ...`); a redo draws again as sampling would
    (structured answers always, text ones with `resample=True`). `accuracy={"model id": 0.8}` makes that model
    get a share of answers wrong (another option), the same rows each time, to compare models;
    `responder=lambda prompt, system: ...` answers instead (the docs' simulator reference has both). Calling it
    again (running the cell again) starts another for the runs that follow; a run already going keeps the one
    it started with. `.stop()` on the session's simulator sends apply_llm back to ANTHROPIC_API_KEY's API.

    Simulated answers are stored marked as such (`{step}_source = 'simulator'`): a later run against the
    real API asks for those rows again, and never reuses a simulated answer.
    """
    simulator = Simulator(**faults).start()  # a bad fault raises before the session's simulator changes
    _session[0] = simulator
    use_session_simulator(simulator.base_url)
    return simulator
