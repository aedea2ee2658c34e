"""Several rows in one request, each answer its own (`rows_per_request=`): the pack's request and how its answer is
read, as pure values.

Why: for short rows (a label for an SMS, a field from a sentence) the request limit, not tokens, bounds the work, and
every request pays the instructions again. A pack sends up to N rows in one request and asks for one JSON entry per
row. Peers that pack rows (Ondine) were caught putting answers on the wrong rows or losing them, so a pack's answer
is trusted entry by entry, never by position:

- Each row goes in as an item with an id drawn afresh for every request (`new_ids`): six letters and digits that no
  row's content, no count (1..N) and no other pack shares.
- Each entry must give the id, the first words of its item (`start`) and the answer. An entry is kept only when its
  id came back exactly once, its `start` is the beginning of that item's text and of no other item's (different)
  text, and its answer passes the step's output schema (`output=`) or is text. So a model that swaps ids, drops or
  duplicates an entry, or answers out of shape fails only those rows (`read_pack`), which the sender asks again
  alone; the rows answered correctly keep their answers.
- Text every item's request shares (the prompt template around the row's own text) is said once: the longest common
  prefix and suffix of the items, cut at a word (`common_frame`).

A packed row's stored request and fingerprint carry the pack size (`request.PACK_KEY`, a mark like the provider's),
so its answer is reused only in the same packing setting, and a changed size makes the rows stale, reported and not
paid.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from typing import TYPE_CHECKING, Any

from llmledger._step.output import OutputError, OutputSpec
from llmledger.errors import InvalidInputError

if TYPE_CHECKING:
    from llmledger._step.request import RequestSpec

MAX_ROWS_PER_REQUEST = 100
PACK_MAX_TOKENS = 32_000  # a pack's answer bound: below every current model's output limit
START_WORDS = 6  # an entry's `start`: the item's first words, up to this many (INSTRUCTIONS say "six")
ENTRY_TOKENS = 48  # what one entry's id, start and JSON may add to an answer, in tokens: its share of max_tokens
ENTRY_GUESS = 16  # and what they add, as an estimate reckons before a step has answers (about 15 measured)
_ID_LETTERS = "bcdfghjkmnpqrstvwxz23456789"  # no vowels (no words), no 0/1/l/o to misread
PLACEHOLDER = "<<ITEM>>"
ITEMS_HEAD = "Items, one JSON object a line:\n"  # what comes before a pack's items, one JSON line each

INSTRUCTIONS = (
    "You are given several items at once. Answer each item separately, exactly as if it were the only one: an "
    "item's answer must never depend on another item.\n"
    'Reply with JSON {"answers": [...]}, one entry per item, each an object with:\n'
    '- "id": the item\'s id, copied exactly;\n'
    '- "start": the first words of the item\'s text (up to six), copied exactly;\n'
    '- "answer": your answer to that item.'
)


def new_ids(n: int) -> list[str]:
    """`n` distinct ids for one pack's items, random so that no row's text and no other pack carries them."""
    ids: list[str] = []
    while len(ids) < n:
        candidate = "".join(secrets.choice(_ID_LETTERS) for _ in range(6))
        if candidate not in ids and not candidate.isdigit():
            ids.append(candidate)
    return ids


def common_frame(texts: list[str]) -> tuple[str, str]:
    """The prefix and suffix every text shares (a prompt template around each row's own text), cut at whitespace so
    no word is split, and leaving each text something of its own unless it has nothing after the prefix; ("", "")
    for fewer than two texts."""
    if len(texts) < 2:
        return "", ""
    first, shortest = texts[0], min(len(t) for t in texts)
    n = 0
    while n < shortest and all(t[n] == first[n] for t in texts):
        n += 1
    prefix = first[:n]
    if n < len(first) and not prefix[-1:].isspace():  # ends inside a word: back to the whitespace before it
        cut = max(prefix.rfind(" "), prefix.rfind("\n"))
        prefix = prefix[: cut + 1] if cut >= 0 else ""
    rest = [t[len(prefix) :] for t in texts]
    m, shortest = 0, min(len(t) for t in rest)
    while m < shortest and all(t[-1 - m] == rest[0][-1 - m] for t in rest):
        m += 1
    suffix = rest[0][len(rest[0]) - m :] if m else ""
    if suffix and not suffix[0].isspace():  # starts inside a word: on to the whitespace after it
        cut = min((i for i in (suffix.find(" "), suffix.find("\n")) if i >= 0), default=-1)
        suffix = suffix[cut:] if cut >= 0 else ""
    if any(not t[: len(t) - len(suffix)].strip() for t in rest):  # an item would be left empty: say it whole
        suffix = ""
    # a row that is the prefix and nothing more (an empty {text}) is an empty item: its first words cannot tell it
    # apart, so it is asked alone, and the other rows still share the frame (an attack saw one empty row send a
    # whole pack's rows alone)
    if any(mark in prefix + suffix for mark in (PLACEHOLDER, ITEMS_HEAD.strip())):  # a frame that holds the pack's
        return "", ""  # own marks would be read wrongly (an attack: every row answered "<<ITEM>>"): items go whole
    return prefix, suffix


def pack_schema(answer: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON schema of a pack's answer: {"answers": [{"id", "start", "answer"}]}, the answer in the step's own
    shape (`output=`'s schema, its $defs lifted to the top) or text."""
    inner = {"type": "string"} if answer is None else {k: v for k, v in answer.items() if k != "$defs"}
    entry = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "start": {"type": "string"}, "answer": inner},
        "required": ["id", "start", "answer"],
        "additionalProperties": False,
    }
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"answers": {"type": "array", "items": entry}},
        "required": ["answers"],
        "additionalProperties": False,
    }
    if answer is not None and answer.get("$defs"):
        schema["$defs"] = answer["$defs"]
    return schema


def user_message(prefix: str, suffix: str, ids: list[str], own: list[str]) -> str:
    """The pack's one user message: the shared frame once (if any), then one JSON line per item."""
    lines = [json.dumps({"id": i, "text": text}, ensure_ascii=False) for i, text in zip(ids, own, strict=True)]
    if prefix or suffix:
        head = (
            f"Each item is one request: the text between the lines below, with {PLACEHOLDER} replaced by the "
            f"item's text.\n-----\n{prefix}{PLACEHOLDER}{suffix}\n-----\n"
        )
    else:
        head = "Each item's text is one whole request.\n"
    return head + ITEMS_HEAD + "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Pack:
    """One request carrying several rows: its body, each item's id and own text (the frame taken off)."""

    body: dict[str, Any]
    ids: list[str]
    own: list[str]
    shared_chars: int  # characters said once for every item: instructions, system prompt, frame
    spec: RequestSpec | None  # the request's own spec (the step's, with the packing instructions and schema); None
    # for a pack read back from its stored body (`stored_pack`)
    message: str  # its user message


def pack_request(spec: RequestSpec, prompts: list[str], ids: list[str] | None = None) -> Pack:
    """The request for rows whose stored user messages are `prompts` (of one step version)."""
    ids = new_ids(len(prompts)) if ids is None else ids
    prefix, suffix = common_frame(prompts)
    own = [p[len(prefix) : len(p) - len(suffix)] for p in prompts]
    answer = spec.output_spec()
    shape, field = spec.shape, spec.shape.structured_field
    asked = shape.structured(OutputSpec(pack_schema(None if answer is None else answer.schema)))
    options = {k: v for k, v in spec.options.items() if k != field}
    earlier = spec.options.get(field)
    if isinstance(earlier, dict) and field == "text":  # Responses' `text` may carry more than its format
        asked = {**earlier, **asked}
    bound = min(PACK_MAX_TOKENS, len(prompts) * (spec.max_tokens + ENTRY_TOKENS))
    system = INSTRUCTIONS if not spec.system else f"{spec.system}\n\n{INSTRUCTIONS}"
    packed = dataclasses.replace(
        spec,
        system=system,
        options={**options, field: asked},
        max_tokens=bound,
        rows_per_request=1,
        prefix=pack_examples(spec.prefix, answer),
    )
    message = user_message(prefix, suffix, ids, own)
    shared = len(system) + len(message) - sum(len(json.dumps(t, ensure_ascii=False)) for t in own)
    return Pack(packed.body(message), ids, own, max(shared, 0), packed, message)


def stored_pack(body: dict[str, Any]) -> Pack:
    """A pack as it was sent, read back from its stored body (a batch's pack is read when the batch ends, perhaps by
    another process, and its rows may ask otherwise by then): the ids and own texts of its items, from its message.

    The shared characters are the body's whole JSON less the items' texts: the weights the input tokens are split by,
    as `pack_request` reckons them for a pack answered online up to the JSON around the message."""
    messages = [text for text in _strings(body) if ITEMS_HEAD in text]  # the few-shot pack's first, if any
    message = messages[-1] if messages else ""
    ids, own = [], []
    for line in message.partition(ITEMS_HEAD)[2].split("\n"):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and isinstance(item.get("id"), str) and isinstance(item.get("text"), str):
            ids.append(item["id"])
            own.append(item["text"])
    whole = len(json.dumps(body, ensure_ascii=False))
    shared = whole - sum(len(json.dumps(t, ensure_ascii=False)) for t in own)
    return Pack(body, ids, own, max(shared, 0), None, message)


def _strings(value: Any) -> list[str]:
    """Every string a JSON value holds (a request body's messages, in any API's shape)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def pack_examples(prefix: tuple[dict[str, Any], ...], output: OutputSpec | None) -> tuple[dict[str, Any], ...]:
    """The step's few-shot examples (`messages=`: user and assistant turns in pairs) as one pack and its answer, so
    the model sees the very shape it must answer in, not one row's; the prefix as it is when it is anything else
    (files, several blocks) or an example's answer is not in the step's shape. Their ids (`ex1`, `ex2`...) are fixed,
    so a cached prefix stays the same from pack to pack, and never an item's (an item's id has no vowel)."""
    turns: list[tuple[str, str, Any]] = []
    for message in prefix:
        content = message.get("content")
        if isinstance(content, list) and len(content) == 1 and isinstance(content[0].get("text"), str):
            turns.append((message.get("role", ""), content[0]["text"], content[0].get("cache_control")))
        elif isinstance(content, str):
            turns.append((message.get("role", ""), content, None))
        else:
            return prefix
    if not turns or [t[0] for t in turns] != ["user", "assistant"] * (len(turns) // 2):
        return prefix
    asked, answered = [t[1] for t in turns[0::2]], [t[1] for t in turns[1::2]]
    try:
        values = [a if output is None else json.loads(output.check(a)) for a in answered]
    except (OutputError, json.JSONDecodeError):
        return prefix
    ids = [f"ex{n + 1}" for n in range(len(asked))]
    frame_prefix, frame_suffix = common_frame(asked)
    own = [t[len(frame_prefix) : len(t) - len(frame_suffix)] for t in asked]
    entries = [
        {"id": i, "start": first_words(text), "answer": value} for i, text, value in zip(ids, own, values, strict=True)
    ]
    answer: Any = json.dumps({"answers": entries}, ensure_ascii=False)
    control = turns[-1][2]
    if control is not None:  # the prefix was cached: it still is
        answer = [{"type": "text", "text": answer, "cache_control": control}]
    return (
        {"role": "user", "content": user_message(frame_prefix, frame_suffix, ids, own)},
        {"role": "assistant", "content": answer},
    )


def first_words(text: str) -> str:
    """An item's `start` as a faithful answer gives it: its first words, up to START_WORDS."""
    return " ".join(text.split()[:START_WORDS])


def _words(text: str) -> str:
    """Text as a `start` is compared: letters and digits only, case folded (a model may copy punctuation, quotes
    and spaces loosely, not words)."""
    return re.sub(r"\W+", "", text.casefold())


def shareable(prompts: list[str]) -> list[int]:
    """Which of `prompts` (indices, taken in order) one pack can carry so that each entry's `start` names its own
    item alone: none whose first words begin another item's different text. Rows such as "ok" and "OK!", or "1"
    and "10", would otherwise fail together in every pack they shared (`read_pack`), and be paid each time."""
    group = list(range(len(prompts)))
    while True:  # the frame a pack factors out depends on its items: a smaller pack is looked at again
        prefix, suffix = common_frame([prompts[i] for i in group])
        own = {i: prompts[i][len(prefix) : len(prompts[i]) - len(suffix)] for i in group}
        words = {i: _words(text) for i, text in own.items()}
        starts = {i: _words(first_words(text)) for i, text in own.items()}
        keep: list[int] = []
        for i in group:
            if all(
                own[i] == own[j] or not (words[j].startswith(starts[i]) or words[i].startswith(starts[j])) for j in keep
            ):
                keep.append(i)
        if len(keep) == len(group):
            return keep
        group = keep


def pack_groups(prompts: list[str]) -> list[list[int]]:
    """`prompts` (indices) split into packs whose items can be told apart (`shareable`): one pack, mostly."""
    left, groups = list(range(len(prompts))), []
    while left:
        groups.append([left[k] for k in shareable([prompts[i] for i in left])])
        taken = set(groups[-1])
        left = [i for i in left if i not in taken]
    return groups


def read_pack(text: str, pack: Pack, output: OutputSpec | None) -> tuple[dict[int, str], dict[int, str]]:
    """A pack's answer, item by item: ({item index: its answer, as stored}, {item index: why its entry is not
    kept}). Every item is in exactly one of the two."""
    n = len(pack.ids)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return {}, dict.fromkeys(range(n), f"the pack's answer is not JSON ({exc.msg} at character {exc.pos})")
    entries = data.get("answers") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return {}, dict.fromkeys(range(n), 'the pack\'s answer has no list of "answers"')
    index = {item_id: i for i, item_id in enumerate(pack.ids)}
    found: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"].strip() in index:
            found.setdefault(index[entry["id"].strip()], []).append(entry)
    words = [_words(t) for t in pack.own]
    answers: dict[int, str] = {}
    problems: dict[int, str] = {}
    for i in range(n):
        got = found.get(i, [])
        if not got:
            problems[i] = "its entry was missing from the pack's answer"
            continue
        if len(got) > 1:
            problems[i] = f"its id came back {len(got)} times in the pack's answer"
            continue
        entry = got[0]
        start = _words(str(entry.get("start", "")))
        if not words[i].startswith(start) or any(
            words[j].startswith(start) and pack.own[j] != pack.own[i] for j in range(n) if j != i
        ):
            shown = str(entry.get("start", ""))[:60]
            problems[i] = f"its entry's start {shown!r} does not name its own text alone: answers may be misaligned"
            continue
        try:
            answers[i] = _answer_text(entry.get("answer"), output)
        except OutputError as exc:
            problems[i] = f"its answer in the pack does not match the output schema: {exc}"
    return answers, problems


def _answer_text(value: Any, output: OutputSpec | None) -> str:
    if output is not None:
        return output.check(json.dumps(value, ensure_ascii=False))
    if not isinstance(value, str):
        raise OutputError(f"the answer should be text, got {json.dumps(value, ensure_ascii=False)[:80]}")
    return value


def apportion(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights` into integers that add up to it exactly (largest remainder)."""
    if not weights:
        return []
    whole = sum(weights)
    exact = [total * w / whole for w in weights] if whole > 0 else [total / len(weights)] * len(weights)
    parts = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - parts[i], reverse=True)[: total - sum(parts)]:
        parts[i] += 1
    return parts


def entry_lengths(text: str, pack: Pack) -> list[int]:
    """The characters each item's entry took in the pack's answer (its share of the output tokens); 0 for an item
    with none."""
    try:
        entries = json.loads(text).get("answers", [])
    except (json.JSONDecodeError, AttributeError):
        return [0] * len(pack.ids)
    index = {item_id: i for i, item_id in enumerate(pack.ids)}
    lengths = [0] * len(pack.ids)
    for entry in entries if isinstance(entries, list) else []:
        at = index.get(str(entry.get("id", "")).strip()) if isinstance(entry, dict) else None
        if at is not None:
            lengths[at] += len(json.dumps(entry, ensure_ascii=False))
    return lengths


def check_rows_per_request(value: Any, *, attach: Any) -> None:
    """Refuse a `rows_per_request=` that is no count, or one the run cannot pack (before anything is written)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROWS_PER_REQUEST:
        raise InvalidInputError(
            f"rows_per_request must be a whole number from 1 (each row its own request) to {MAX_ROWS_PER_REQUEST}, "
            f"got {value!r}. Nothing was written."
        )
    if value > 1 and attach is not None:
        raise InvalidInputError(
            f"rows_per_request={value} with attach=: rows with files are sent one to a request; leave "
            "rows_per_request out. Nothing was written."
        )
