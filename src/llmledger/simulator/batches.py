"""Message Batches in the simulator: create, retrieve, list, cancel, delete, and results as JSONL.

As the real API: a batch is `in_progress` until every request is processed,
`request_counts` move out of `processing` only when the whole batch ends,
results (at `results_url`, one JSON line per request, in no particular order)
exist only once it has ended, a canceled batch goes through `canceling`, and
a batch still processing at `expires_at` ends with its requests `expired` (and a canceled one with them
`canceled`) except those processed by then: requests are processed in order over `batch_delay`.
Request params are validated when the batch is processed, not when it is
created (an invalid one comes back `errored`); the batch itself is checked at
once (at most `batch_max_requests` requests and `batch_max_bytes` bytes;
custom ids of `[A-Za-z0-9_-]{1,64}`, unique). Faults: `batch_delay` (seconds
until a batch ends), `batch_expire_after` (its lifetime; the API's is 24 h),
prompts containing `batch_expire` expire, containing `batch_error` come back
`errored` with the API's own error, containing `poison` with an invalid request.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import uuid
from datetime import UTC, datetime
from typing import Any

from llmledger._exec.client import NEVER_IN_THIS_SIMULATOR
from llmledger.simulator.core import SimulatorCore
from llmledger.simulator.faults import ERRORS, ErrorSpec, error_spec
from llmledger.simulator.request import model_404, user_text, validate

_CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OUTCOMES = ("succeeded", "errored", "canceled", "expired")


def _rfc3339(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class SimBatches:
    DEPTH = 4  # the parts of a path before a batch's id: "", "v1", "messages", "batches"

    def __init__(self, sim: SimulatorCore) -> None:
        self.sim = sim
        self._lock = threading.Lock()
        self._batches: dict[str, dict[str, Any]] = {}
        self._deleted: set[str] = set()

    # -- endpoints: each returns its answer or raises _Refused ---------------------------------------
    def route(self, method: str, url: str, body: Any, size: int, base_url: str) -> dict[str, Any] | bytes:
        """Answer one request to `/v1/messages/batches...` (JSON, or the results as JSONL bytes)."""
        path, _, query = url.partition("?")
        rest = path.rstrip("/").split("/")[self.DEPTH :]
        if method == "POST" and not rest:
            with self.sim._lock:
                fault = self.sim.faults.fail_next.pop(0) if self.sim.faults.fail_next else None
            if fault is not None:  # an injected error for the create call (as for online requests)
                raise _Refused(error_spec(fault))
            return self.create(body, size, base_url)
        if method == "GET" and not rest:
            return self.list(dict(urllib.parse.parse_qsl(query)))
        if method == "GET" and len(rest) == 1:
            return self.retrieve(rest[0])
        if method == "POST" and rest[1:] == ["cancel"]:
            return self.cancel(rest[0])
        return self._route_more(method, url, rest)

    def _route_more(self, method: str, url: str, rest: list[str]) -> dict[str, Any] | bytes:
        """The routes only Message Batches have: results, delete."""
        if method == "GET" and rest[1:] == ["results"]:
            return self.results(rest[0])
        if method == "DELETE" and len(rest) == 1:
            return self.delete(rest[0])
        raise _Refused(ErrorSpec(404, "not_found_error", f"no route {method} {url}"))

    def create(self, body: Any, size: int, base_url: str) -> dict[str, Any]:
        f = self.sim.faults
        if size > f.batch_max_bytes:
            raise _Refused(
                ErrorSpec(413, "request_too_large", f"Batch exceeds the maximum size of {f.batch_max_bytes} bytes.")
            )
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            raise _Refused(ErrorSpec(400, "invalid_request_error", "requests: at least one request is required"))
        if len(requests) > f.batch_max_requests:
            raise _Refused(
                ErrorSpec(
                    400, "invalid_request_error", f"requests: a batch holds at most {f.batch_max_requests} requests"
                )
            )
        seen: set[str] = set()
        for n, request in enumerate(requests):
            custom_id = request.get("custom_id") if isinstance(request, dict) else None
            if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
                raise _Refused(
                    ErrorSpec(
                        400,
                        "invalid_request_error",
                        f"requests.{n}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'",
                    )
                )
            if custom_id in seen:
                raise _Refused(
                    ErrorSpec(
                        400, "invalid_request_error", f"requests.{n}.custom_id: duplicate custom_id {custom_id!r}"
                    )
                )
            seen.add(custom_id)
            if not isinstance(request.get("params"), dict):
                raise _Refused(ErrorSpec(400, "invalid_request_error", f"requests.{n}.params: Field required"))
        now = time.time()
        batch_id = f"msgbatch_sim_{uuid.uuid4().hex[:20]}"
        record = {
            "id": batch_id,
            "created": now,
            "ends": now + f.batch_delay,
            "expires": now + f.batch_expire_after,
            "requests": requests,
            "results": None,
            "ended": None,
            "cancel_at": None,
            "results_url": f"{base_url}/v1/messages/batches/{batch_id}/results",
        }
        with self._lock:
            self._batches[batch_id] = record
        self.sim.count("batches")
        self.sim.count("batch_requests", len(requests))
        return self._view(record)

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._view(self._advance(self._get(batch_id)))

    def list(self, query: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            records = sorted(self._batches.values(), key=lambda r: r["created"], reverse=True)
        ids = [r["id"] for r in records]
        limit = max(1, min(1000, int(query.get("limit") or 20)))
        if query.get("after_id") in ids:  # the page after that batch (older ones)
            records = records[ids.index(query["after_id"]) + 1 :]
            more = len(records) > limit
            records = records[:limit]
        elif query.get("before_id") in ids:  # the page before it (newer ones)
            records = records[: ids.index(query["before_id"])]
            more = len(records) > limit
            records = records[-limit:]
        else:
            more = len(records) > limit
            records = records[:limit]
        page = [self._view(self._advance(r)) for r in records]
        return {
            "data": page,
            "has_more": more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def cancel(self, batch_id: str) -> dict[str, Any]:
        record = self._advance(self._get(batch_id))
        if record["ended"] is None and record["cancel_at"] is None:
            record["cancel_at"] = time.time()
        return self._view(record)

    def delete(self, batch_id: str) -> dict[str, Any]:
        record = self._advance(self._get(batch_id))
        if record["ended"] is None:
            raise _Refused(
                ErrorSpec(
                    400,
                    "invalid_request_error",
                    "Batches must be finished processing before they can be deleted; cancel it first.",
                )
            )
        with self._lock:
            del self._batches[batch_id]
            self._deleted.add(batch_id)
        return {"id": batch_id, "type": "message_batch_deleted"}

    def results(self, batch_id: str) -> bytes:
        record = self._advance(self._get(batch_id))
        if record["results"] is None:
            raise _Refused(
                ErrorSpec(
                    400,
                    "invalid_request_error",
                    f"Batch {batch_id} has not finished processing; results are available once it has ended.",
                )
            )
        lines = list(record["results"])
        self.sim.shuffle(lines)  # the API promises no order
        return "".join(json.dumps(line) + "\n" for line in lines).encode()

    # -- processing -----------------------------------------------------------------------------------
    def _get(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            record = self._batches.get(batch_id)
        if record is None:
            never = "" if batch_id in self._deleted else f": {NEVER_IN_THIS_SIMULATOR}"
            raise _Refused(ErrorSpec(404, "not_found_error", f"No batch found with id {batch_id!r}{never}"))
        return record

    def _advance(self, record: dict[str, Any]) -> dict[str, Any]:
        """Process the batch if its time has come (all at once, when someone looks)."""
        with self._lock:
            if record["ended"] is not None:
                return record
            now = time.time()
            if record["cancel_at"] is not None:
                outcome, ended = "canceled", record["cancel_at"]
            elif now >= record["expires"] and record["ends"] > record["expires"]:
                outcome, ended = "expired", record["expires"]
            elif now >= record["ends"]:
                outcome, ended = None, record["ends"]
            else:
                return record
            # requests are processed in order over the batch's time; cut short, the ones done by then stand
            span = record["ends"] - record["created"]
            share = 1.0 if outcome is None or span <= 0 else min(1.0, max(0.0, (ended - record["created"]) / span))
            done = int(len(record["requests"]) * share)
            record["ended"] = ended
            record["results"] = [
                self._process(r, None if n < done else outcome) for n, r in enumerate(record["requests"])
            ]
        return record

    def advance_all(self) -> None:
        """Process every batch whose time has come (so what it bills is counted even if nobody looks)."""
        with self._lock:
            records = list(self._batches.values())
        for record in records:
            self._advance(record)

    def _process(self, request: dict[str, Any], outcome: str | None) -> dict[str, Any]:
        custom_id, params = request["custom_id"], request["params"]
        f = self.sim.faults
        prompt = user_text(params) if isinstance(params.get("messages"), list) else ""
        if outcome is None and f.batch_expire and f.batch_expire in prompt:
            outcome = "expired"
        if outcome is not None:
            return {"custom_id": custom_id, "result": {"type": outcome}}
        problem = validate(params)
        if problem is None and f.poison and f.poison in prompt:
            problem = f"prompt contains the poison substring {f.poison!r}"
        error = ErrorSpec(400, "invalid_request_error", problem) if problem else model_404(params, f)
        if error is None and f.batch_error and f.batch_error in prompt:
            error = ERRORS[500]
        if error is not None:
            body = error.body(f"req_sim_{uuid.uuid4().hex[:24]}")
            return {"custom_id": custom_id, "result": {"type": "errored", "error": body}}
        self.sim.count("batch_paid")
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": self.sim._answer(params)}}

    def _view(self, record: dict[str, Any]) -> dict[str, Any]:
        results = record["results"]
        counts = dict.fromkeys(_OUTCOMES, 0)
        if results is None:
            status = "canceling" if record["cancel_at"] is not None else "in_progress"
            processing = len(record["requests"])
        else:
            status, processing = "ended", 0
            for line in results:
                counts[line["result"]["type"]] += 1
        return {
            "id": record["id"],
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {"processing": processing, **counts},
            "ended_at": _rfc3339(record["ended"]),
            "created_at": _rfc3339(record["created"]),
            "expires_at": _rfc3339(record["expires"]),
            "cancel_initiated_at": _rfc3339(record["cancel_at"]),
            "archived_at": None,
            "results_url": record["results_url"] if results is not None else None,
        }


class _Refused(Exception):
    def __init__(self, spec: ErrorSpec) -> None:
        super().__init__(spec.message)
        self.spec = spec
