"""OpenAI's Batch API in the simulator: `/v1/files` (a JSONL input uploaded, results read) and `/v1/batches`.

As the real API: the requests go up first as a file (`purpose="batch"`, multipart); a batch names it, its
endpoint (`/v1/chat/completions` or `/v1/responses`; Azure OpenAI's `/openai/batches` takes `/chat/completions`,
its lines' `model` a deployment) and `completion_window="24h"`, and may carry `metadata` (16 pairs, values of
at most 512 characters). The file is checked when the batch is made: JSON lines of a unique `custom_id`, `method`
POST, `url` the batch's endpoint and a `body`, one model for the whole file, at most 50,000 lines and 200 MB
(or the faults' lower `batch_max_requests`, `batch_max_bytes`); a file that fails makes a `failed` batch with
`errors`, not an HTTP error. A batch is `validating` for a moment (no request counted yet), then `in_progress`
until it ends `completed` (or `expired`, or `cancelled` through `cancelling`), with `request_counts` {total,
completed, failed}; then its `output_file_id` holds one line per answered request (`response.status_code` 200
and the `chat.completion`), its `error_file_id` one per request refused (the error body under its status) or
not run (`error.code` `batch_expired`, `batch_cancelled`), in no particular order. Timing and faults are
`SimBatches`'s.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import time
import uuid
from typing import Any

from llmledger.simulator import chat, responses
from llmledger.simulator.batches import SimBatches, _Refused
from llmledger.simulator.faults import ERRORS, ErrorSpec
from llmledger.simulator.request import model_404, user_text

ENDPOINTS = {  # the endpoints a batch may name, by the path it was made through: OpenAI's, or Azure's
    "": ("/v1/chat/completions", "/v1/responses"),
    "/openai": ("/chat/completions",),  # Azure OpenAI (global batch deployments): lines name no /v1
}
MAX_REQUESTS, MAX_BYTES = 50_000, 200_000_000  # OpenAI's limits on one batch (the faults may set lower ones)
_NOT_RUN = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "canceled": ("batch_cancelled", "This request was not executed because the batch was cancelled."),
}


def multipart_file(content_type: str, raw: bytes) -> tuple[dict[str, str], bytes | None]:
    """The form fields and the file of a multipart/form-data upload."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"content-type: {content_type}\r\n\r\n".encode() + raw
    )
    fields: dict[str, str] = {}
    data: bytes | None = None
    for part in message.iter_parts() if message.is_multipart() else []:
        name = part.get_param("name", header="content-disposition")
        got = part.get_payload(decode=True)
        payload = got if isinstance(got, bytes) else b""
        if part.get_filename() is not None:
            data = payload
            fields["filename"] = str(part.get_filename())
        elif isinstance(name, str):
            fields[name] = payload.decode()
    return fields, data


class SimOpenAIBatches(SimBatches):
    """Files and batches of OpenAI's API; a batch's `requests` are its file's lines as `{custom_id, params}`."""

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self._files: dict[str, dict[str, Any]] = {}

    # -- files --------------------------------------------------------------------------------------------
    def upload(self, content_type: str, raw: bytes) -> dict[str, Any]:
        fields, data = multipart_file(content_type, raw)
        if data is None or fields.get("purpose") != "batch":
            raise _Refused(ErrorSpec(400, "invalid_request_error", "a file and purpose='batch' are required"))
        file_id = f"file-sim{uuid.uuid4().hex[:20]}"
        record = {"id": file_id, "data": data, "filename": fields.get("filename", "upload"), "created": time.time()}
        with self._lock:
            self._files[file_id] = record
        return self._file_view(record, "batch")

    def file(self, file_id: str, *, content: bool) -> dict[str, Any] | bytes:
        self.advance_all()  # an output file exists once its batch has ended
        with self._lock:
            record = self._files.get(file_id)
        if record is None:
            raise _Refused(ErrorSpec(404, "invalid_request_error", f"No such File object: {file_id}"))
        return record["data"] if content else self._file_view(record, record.get("purpose", "batch"))

    def _file_view(self, record: dict[str, Any], purpose: str) -> dict[str, Any]:
        return {
            "id": record["id"],
            "object": "file",
            "bytes": len(record["data"]),
            "created_at": int(record["created"]),
            "filename": record["filename"],
            "purpose": purpose,
            "status": "processed",
        }

    # -- batches ------------------------------------------------------------------------------------------
    DEPTH = 3  # "", "v1", "batches"

    def _route_more(self, method: str, url: str, rest: list[str]) -> dict[str, Any] | bytes:
        raise _Refused(ErrorSpec(404, "invalid_request_error", f"Invalid URL ({method} {url.partition('?')[0]})"))

    def create(self, body: Any, size: int, base_url: str) -> dict[str, Any]:
        body = body if isinstance(body, dict) else {}
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise _Refused(ErrorSpec(400, "invalid_request_error", f"Missing required parameter: '{name}'."))
        if body["endpoint"] not in ENDPOINTS[base_url]:
            raise _Refused(ErrorSpec(400, "invalid_request_error", f"Invalid endpoint {body['endpoint']!r}."))
        if body["completion_window"] != "24h":
            raise _Refused(ErrorSpec(400, "invalid_request_error", "completion_window must be '24h'."))
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16 or any(len(str(v)) > 512 for v in metadata.values()):
            raise _Refused(ErrorSpec(400, "invalid_request_error", "metadata: at most 16 pairs of 512 characters"))
        with self._lock:
            file = self._files.get(body["input_file_id"])
        if file is None:
            raise _Refused(ErrorSpec(404, "invalid_request_error", f"No such File object: {body['input_file_id']}"))
        now = time.time()
        requests, problems = self._lines(file["data"], body["endpoint"])
        record = {
            "id": f"batch_sim{uuid.uuid4().hex[:20]}",
            "created": now,
            "ends": now + self.sim.faults.batch_delay,
            "expires": now + self.sim.faults.batch_expire_after,
            "requests": requests,
            "results": [] if problems else None,
            "ended": now if problems else None,
            "cancel_at": None,
            "endpoint": body["endpoint"],
            "input_file_id": file["id"],
            "metadata": metadata,
            "errors": problems,
            "files": {},
        }
        with self._lock:
            self._batches[record["id"]] = record
        self.sim.count("batches")
        self.sim.count("batch_requests", len(requests))
        return self._view(record)

    def _lines(self, data: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The file's requests, and what is wrong with it (the API fails the batch for any of it)."""
        f = self.sim.faults
        most, largest = min(f.batch_max_requests, MAX_REQUESTS), min(f.batch_max_bytes, MAX_BYTES)
        problems: list[dict[str, Any]] = []
        requests: list[dict[str, Any]] = []
        seen: set[str] = set()
        models: set[str] = set()
        if len(data) > largest:
            problems.append({"code": "file_too_large", "message": f"The file exceeds {largest} bytes."})
        for n, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                problems.append({"code": "invalid_json_line", "line": n, "message": "This line is not valid JSON."})
                continue
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or custom_id in seen:
                problems.append({"code": "duplicate_custom_id", "line": n, "message": "custom_id must be unique."})
                continue
            seen.add(custom_id)
            if item.get("method") != "POST" or item.get("url") != endpoint or not isinstance(item.get("body"), dict):
                problems.append({"code": "invalid_request", "line": n, "message": f"POST {endpoint} with a body."})
                continue
            models.add(str(item["body"].get("model")))
            requests.append({"custom_id": custom_id, "params": item["body"]})
        if len(requests) > most:
            problems.append({"code": "too_many_requests", "message": f"At most {most} requests."})
        if len(models) > 1:
            problems.append({"code": "mismatched_model", "message": "Every request in a batch must use one model."})
        if not requests and not problems:
            problems.append({"code": "empty_file", "message": "The file holds no requests."})
        return requests, problems

    def list(self, query: dict[str, str]) -> dict[str, Any]:
        with self._lock:
            records = sorted(self._batches.values(), key=lambda r: r["created"], reverse=True)
        ids = [r["id"] for r in records]
        limit = max(1, min(100, int(query.get("limit") or 20)))
        if query.get("after") in ids:  # the page after that batch (older ones)
            records = records[ids.index(query["after"]) + 1 :]
        more = len(records) > limit
        page = [self._view(self._advance(r)) for r in records[:limit]]
        return {
            "object": "list",
            "data": page,
            "has_more": more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    # -- processing ---------------------------------------------------------------------------------------
    def _process(self, request: dict[str, Any], outcome: str | None) -> dict[str, Any]:
        custom_id, body = request["custom_id"], request["params"]
        f = self.sim.faults
        api = responses if "input" in body and "messages" not in body else chat  # the line's endpoint's API
        valid = api.validate(body) is None
        prompt = user_text(api.as_messages(body) if valid else body)
        if outcome is None and f.batch_expire and f.batch_expire in prompt:
            outcome = "expired"
        line_id = f"batch_req_sim{uuid.uuid4().hex[:20]}"
        if outcome is not None:
            code, message = _NOT_RUN[outcome]
            return {
                "id": line_id,
                "custom_id": custom_id,
                "response": None,
                "error": {"code": code, "message": message},
            }
        problem = api.validate(body)
        if problem is None and f.poison and f.poison in prompt:
            problem = f"prompt contains the poison substring {f.poison!r}"
        spec = ErrorSpec(400, "invalid_request_error", problem) if problem else None
        if spec is None and model_404(body, f) is not None:
            spec = ErrorSpec(404, "invalid_request_error", f"The model `{body['model']}` does not exist.")
        if spec is None and f.batch_error and f.batch_error in prompt:
            spec = ERRORS[500]
        request_id = f"req_{uuid.uuid4().hex}"
        if spec is not None:
            payload, _ = chat.error(spec)
            response = {"status_code": spec.status, "request_id": request_id, "body": payload}
            return {"id": line_id, "custom_id": custom_id, "response": response, "error": None}
        self.sim.count("batch_paid")
        completion = api.answer(self.sim, body, api.as_messages(body))
        response = {"status_code": 200, "request_id": request_id, "body": completion}
        return {"id": line_id, "custom_id": custom_id, "response": response, "error": None}

    def _advance(self, record: dict[str, Any]) -> dict[str, Any]:
        super()._advance(record)
        with self._lock:
            if record["results"] is not None and not record["files"] and not record["errors"]:
                lines = list(record["results"])
                self.sim._rng.shuffle(lines)  # the API promises no order
                answered = [r for r in lines if r["response"] and r["response"]["status_code"] == 200]
                refused = [r for r in lines if r not in answered]
                for name, part in (("output_file_id", answered), ("error_file_id", refused)):
                    if part:
                        file_id = f"file-sim{uuid.uuid4().hex[:20]}"
                        data = "".join(json.dumps(r) + "\n" for r in part).encode()
                        self._files[file_id] = {
                            "id": file_id,
                            "data": data,
                            "filename": f"{record['id']}_{name[:-8]}.jsonl",
                            "created": record["ended"],
                            "purpose": "batch_output",
                        }
                        record["files"][name] = file_id
        return record

    def _view(self, record: dict[str, Any]) -> dict[str, Any]:
        results = record["results"]
        ended = record["ended"]
        if record["errors"]:
            status = "failed"
        elif (
            results is None
            and record["cancel_at"] is None
            and time.time() < record["created"] + min(1.0, 0.2 * (record["ends"] - record["created"]))
        ):
            status = "validating"  # its file is being checked: no request counted yet
        elif results is None:
            status = "cancelling" if record["cancel_at"] is not None else "in_progress"
        elif record["cancel_at"] is not None:
            status = "cancelled"
        elif ended is not None and ended >= record["expires"]:
            status = "expired"
        else:
            status = "completed"
        done = [r for r in results or [] if r["response"] is not None]
        completed = sum(1 for r in done if r["response"]["status_code"] == 200)
        stamp = {
            "completed": "completed_at",
            "failed": "failed_at",
            "expired": "expired_at",
            "cancelled": "cancelled_at",
        }
        view: dict[str, Any] = {
            "id": record["id"],
            "object": "batch",
            "endpoint": record["endpoint"],
            "errors": {"object": "list", "data": record["errors"]} if record["errors"] else None,
            "input_file_id": record["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": record["files"].get("output_file_id"),
            "error_file_id": record["files"].get("error_file_id"),
            "created_at": int(record["created"]),
            "in_progress_at": None if record["errors"] else int(record["created"]),
            "expires_at": int(record["expires"]),
            "cancelling_at": int(record["cancel_at"]) if record["cancel_at"] is not None else None,
            "request_counts": {
                "total": 0 if status == "validating" else len(record["requests"]),
                "completed": completed,
                "failed": len(done) - completed if results is not None else 0,
            },
            "metadata": record["metadata"] or None,
        }
        for name in stamp.values():
            view[name] = None
        if status in stamp and ended is not None:
            view[stamp[status]] = int(ended)
        return view
