"""How the simulator answers a request carrying several rows (`rows_per_request=`), and how it gets packs wrong
when told to.

A model reads the pack's items and answers each on its own; so does the simulator: each item's request is put back
together (the shared frame around the item's text) and answered exactly as that request alone would be (a label,
a summary, JSON of the entry's answer schema, a model's accuracy), so a packed row's answer can be checked against
the row's own. The faults are what packing peers were caught doing (Ondine #251, #254, #255): an entry dropped,
one given twice, two entries' ids swapped (each answer then sits under the other row's id), an answer out of
shape. Each is a share of packs of two rows or more (`Faults.pack_drop` ...), drawn from the simulator's seeded
generator.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from llmledger._step.packing import INSTRUCTIONS, ITEMS_HEAD, PLACEHOLDER


def is_pack(schema: dict[str, Any] | None) -> bool:
    """Whether a structured-output schema asks for a pack's answer: {"answers": [{"id", "start", "answer"}]}."""
    if not isinstance(schema, dict) or set(schema.get("properties") or {}) != {"answers"}:
        return False
    items = (schema["properties"]["answers"] or {}).get("items") or {}
    return set(items.get("properties") or {}) == {"id", "start", "answer"}


def items_of(prompt: str) -> list[tuple[str, str, str]]:
    """(id, the item's own text, its whole request as it would be sent alone) for each item of a pack's message."""
    head, _, lines = prompt.partition(ITEMS_HEAD)
    frame = re.search(r"-----\n(.*)\n-----\n", head, re.S)
    prefix, _, suffix = frame.group(1).partition(PLACEHOLDER) if frame else ("", "", "")
    out = []
    for line in lines.split("\n"):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and isinstance(item.get("id"), str) and isinstance(item.get("text"), str):
            out.append((item["id"], item["text"], prefix + item["text"] + suffix))
    return out


def own_system(system: str | None) -> str | None:
    """The step's own system prompt: the pack's, without the packing instructions after it."""
    if not system:
        return None
    own = system.removesuffix(INSTRUCTIONS).rstrip("\n")
    return own or None


def answer_pack(
    prompt: str,
    schema: dict[str, Any],
    answer_one: Callable[[str, dict[str, Any] | None], Any],
    *,
    faults: Any,
    rng: random.Random,
) -> tuple[str, list[str]]:
    """The pack's answer as JSON text, and each item's whole request (what was paid for, one per item).

    `answer_one(request, answer_schema)` answers one item's request as if sent alone: text for a text step (the
    entry's answer schema is a string), else the JSON value of the step's schema."""
    inner = dict(schema["properties"]["answers"]["items"]["properties"]["answer"])
    if schema.get("$defs"):
        inner["$defs"] = schema["$defs"]
    text_step = inner.get("type") == "string" and len(inner) == 1
    items = items_of(prompt)
    entries: list[dict[str, Any]] = [
        {"id": item_id, "start": " ".join(own.split()[:6]), "answer": answer_one(request, None if text_step else inner)}
        for item_id, own, request in items
    ]
    several = len(entries) >= 2  # a row asked alone is answered as asked
    if several and rng.random() < faults.pack_drop:
        entries.pop(rng.randrange(len(entries)))
    if several and rng.random() < faults.pack_duplicate:
        entries.append(dict(entries[rng.randrange(len(entries))]))
    if several and rng.random() < faults.pack_swap and len(entries) >= 2:  # a pack of two may have lost one
        a, b = rng.sample(range(len(entries)), 2)
        entries[a]["id"], entries[b]["id"] = entries[b]["id"], entries[a]["id"]
    if several and rng.random() < faults.pack_invalid:
        entries[rng.randrange(len(entries))]["answer"] = 42 if text_step else {"unexpected": True}
    rng.shuffle(entries)  # the model's order, not the request's
    return json.dumps({"answers": entries}, ensure_ascii=False), [request for _, _, request in items]
