"""A batch's requests, made from claimed rows within the API's limits (`batch.py` sends them): one per distinct
request, or several rows' requests packed into one (`rows_per_request=`, `_step/packing.py`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from llmledger._ledger import Selection
from llmledger._step.attach import NOT_SENT, AttachmentError, Attachments
from llmledger._step.packing import Pack, pack_request, shareable

PACK_SUFFIX = "-pk"  # ends the custom id of a request carrying several rows


@dataclasses.dataclass(frozen=True)
class Request:
    """One request of a batch: its body and, for each item it asks, the fingerprint and the rows asking it (one item,
    unless rows are packed into it: `pack`)."""

    body: dict[str, Any]
    items: list[tuple[str, list[dict[str, Any]]]]
    pack: Pack | None = None


def chunks(
    rows: list[dict[str, Any]],
    selection: Selection,
    size: int,
    *,
    max_bytes: int,
    dedupe: bool,
    files: Attachments | None = None,
    unsendable: list[tuple[dict[str, Any], str]] | None = None,
    alone: set[str] | None = None,
) -> Iterator[list[Request]]:
    """Claimed rows as batches of requests within the limits, one batch at a time: with `dedupe`, one request per
    distinct request (its rows share the answer), else one per row; a step with `rows_per_request=` packs that many
    of them into a request (but those in `alone`: their entry failed in a pack). Rows that cannot be sent (an
    attached file no longer as recorded) go to `unsendable`, each with why."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for n, row in enumerate(rows):
        groups.setdefault(row["fingerprint"] if dedupe else n, []).append(row)
    files = files or Attachments(())
    chunk: list[Request] = []
    weight = 0
    for request in _requests(list(groups.values()), selection, files, unsendable, alone or set()):
        cost = len(json.dumps(request.body)) + 100
        if chunk and (len(chunk) >= size or weight + cost > max_bytes * 0.95):
            yield chunk
            chunk, weight = [], 0
        chunk.append(request)
        weight += cost
    if chunk:
        yield chunk


def _requests(
    groups: list[list[dict[str, Any]]],
    selection: Selection,
    files: Attachments,
    unsendable: list[tuple[dict[str, Any], str]] | None,
    alone: set[str],
) -> Iterator[Request]:
    """The requests for groups of rows asking the same (each group's first row speaks for it): each alone, or packed
    `rows_per_request` of one step version to a request."""
    packing: dict[str, list[list[dict[str, Any]]]] = {}  # by version: groups waiting for their pack to fill
    for members in groups:
        first = members[0]
        spec = selection.requests[first["version"]]
        if spec.rows_per_request > 1:
            size = 1 if first["fingerprint"] in alone else spec.rows_per_request
            waiting = packing.setdefault(f"{first['version']}/{size}", [])
            waiting.append(members)
            if len(waiting) >= size:  # a pack of the groups it can tell apart; the others wait for the next
                yield _packed(selection, waiting, shareable([g[0]["prompt"] for g in waiting]))
            continue
        body = spec.body(first["prompt"])
        if spec.attach:
            try:
                body = files.for_columns(spec.attach).resolve(body, *members)
            except AttachmentError as exc:
                if unsendable is not None:
                    unsendable.extend((r, f"{NOT_SENT}{exc}") for r in members)
                continue
        yield Request(body, [(first["fingerprint"], members)])
    for waiting in packing.values():
        while waiting:
            yield _packed(selection, waiting, shareable([g[0]["prompt"] for g in waiting]))


def _packed(selection: Selection, waiting: list[list[dict[str, Any]]], chosen: list[int]) -> Request:
    """One request carrying the `chosen` groups' rows, one item each (`_step/packing.py`), taken out of `waiting`."""
    groups, taken = [waiting[i] for i in chosen], set(chosen)
    waiting[:] = [g for i, g in enumerate(waiting) if i not in taken]
    spec = selection.requests[groups[0][0]["version"]]
    pack = pack_request(spec, [g[0]["prompt"] for g in groups])
    return Request(pack.body, [(g[0]["fingerprint"], g) for g in groups], pack)
