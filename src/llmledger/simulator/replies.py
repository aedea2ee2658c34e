"""What the simulator answers: a deterministic reply that looks like what a prompt asked for (`default_reply`),
and, for a structured-output request, JSON that matches its schema (`fake_json`).

Its own module because it is the simulator's only "model": how a request is read and checked is `request.py`'s,
and what it does wrong on purpose (faults, the API's error responses) is `faults.py`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import uuid
from typing import Any

from llmledger.simulator.media import MARKER, files_in, stated_value

_POSITIVE = {"great", "love", "excellent", "perfect", "happy", "fast", "recommend", "works", "best", "good"}
_NEGATIVE = {"broke", "broken", "refund", "late", "never", "worst", "bad", "poor", "slow", "disappointed"}
_ONE_OF = re.compile(r"one word: ((?:[A-Za-z-]+, )*[A-Za-z-]+ or [A-Za-z-]+)")


def default_reply(prompt: str, system: str | None = None) -> str:
    """A deterministic answer that looks like what a prompt asked for.

    Sentiment prompts get a label counted from a small lexicon; everything else
    gets a short extract of the prompt's last line, so different rows get
    different, reproducible answers; one asked for "one word: A, B or C" (in its
    system prompt or its text) gets the option its last line or its files name,
    else the last one. Attached files (user_text's markers) count
    too: their text is read for sentiment, and a summary says what it was shown,
    so the same text with another file gets another answer.
    """
    files = files_in(prompt)
    prompt = MARKER.sub("", prompt)
    lowered = prompt.lower()
    if "sentiment" in lowered or ("positive" in lowered and "negative" in lowered):
        body = " ".join([lowered.rsplit(":", 1)[-1], *(text.lower() for _, text in files)])
        words = re.findall(r"[a-z']+", body)
        score = sum(w in _POSITIVE for w in words) - sum(w in _NEGATIVE for w in words)
        return "positive" if score > 0 else "negative" if score < 0 else "neutral"
    choice = _ONE_OF.search(f"{system or ''}\n{prompt}")
    if choice:  # "Answer with one word: invoice or receipt": the option the row (or its file) names, else the last
        options = [o.strip() for o in re.split(r",| or ", choice.group(1)) if o.strip()]
        seen = " ".join([prompt.rsplit("\n", 1)[-1], *(text for _, text in files)]).lower()
        seen = seen.replace(choice.group(0).lower(), " ")  # the question names every option
        return next((o for o in options if re.search(rf"\b{re.escape(o.lower())}\b", seen)), options[-1])
    last = prompt.strip().splitlines()[-1] if prompt.strip() else ""
    words = last.split(": ", 1)[-1].split()
    extract = " ".join(words[:12]) + (" …" if len(words) > 12 else "")
    shown = "; ".join(f"{head}: {' '.join(text.split()[:12])}" if text else head for head, text in files)
    return f"Summary: {extract}" + (f" (attached: {shown})" if files else "")


def fake_json(schema: dict[str, Any], prompt: str, variant: int = 0) -> str:
    """An answer matching `schema`, made from the prompt (as constrained decoding guarantees).

    The same prompt gets the same answer, except that asking again (`variant` > 0: the prompt was
    answered before) gets another one, as a real model's sampling would give.
    """
    defs = schema.get("$defs") or {}
    files = [text for _, text in files_in(prompt)]
    words = re.findall(r"[A-Za-z0-9']+", " ".join([MARKER.sub("", prompt).rsplit(":", 1)[-1], *files])) or ["nothing"]
    salt = f"\x00{variant}" if variant else ""
    again = f" (take {variant + 1})" if variant else ""

    def pick(path: str, n: int) -> int:
        return int(hashlib.md5(f"{prompt}\x00{path}{salt}".encode()).hexdigest()[:8], 16) % max(n, 1)

    def make(node: dict[str, Any], path: str) -> Any:
        if "$ref" in node:
            return make(defs[node["$ref"].split("/")[-1]], path)
        if "anyOf" in node:
            variants = [v for v in node["anyOf"] if v.get("type") != "null"] or node["anyOf"]
            return make(variants[0], path)
        if "const" in node:
            return node["const"]
        if "enum" in node:
            values = node["enum"]
            if "positive" in values and "negative" in values:
                label = default_reply(f"sentiment: {prompt.rsplit(':', 1)[-1]}")
                if label in values:
                    return label
            return values[pick(path, len(values))]
        kind = node.get("type")
        rules = _stated_rules(node)  # constraints the schema states in its description (what a model reads)
        stated = (
            stated_value(files, path.rsplit(".", 1)[-1], kind in ("integer", "number"))
            if files and kind in ("integer", "number", "string") and "format" not in node
            else None
        )
        if stated is not None and (kind != "integer" or float(stated).is_integer()):
            return int(stated) if kind == "integer" else stated
        if kind == "object":
            return {name: make(sub, f"{path}.{name}") for name, sub in (node.get("properties") or {}).items()}
        if kind == "array":
            low = int(rules.get("minItems", 1))
            high = max(low, int(rules.get("maxItems", low + 2)))
            return [
                make(node.get("items") or {"type": "string"}, f"{path}[{i}]")
                for i in range(low + pick(path, high - low + 1))
            ]
        if kind in ("integer", "number"):
            return _number(rules, kind == "integer", pick(path, 1_000_000) / 1_000_000)
        if kind == "boolean":
            return bool(pick(path, 2))
        if kind == "null":
            return None
        if node.get("format") in _FORMATTED:
            return _FORMATTED[node["format"]](pick(path, 1_000_000))
        pattern = _stated_pattern(node)
        built = matching(pattern, pick(path, 1_000)) if pattern else None
        if built is not None:
            return built
        start = pick(path, len(words))
        text = " ".join(words[start : start + 3]) + again
        text = text.ljust(int(rules.get("minLength", 0)), "x")
        return text[: int(rules["maxLength"])] if "maxLength" in rules else text

    return json.dumps(make(schema, "$"), ensure_ascii=False)


_FORMATTED: dict[str, Any] = {  # string formats structured outputs support, each made valid from a number
    "date": lambda n: f"20{n % 30:02d}-{n % 12 + 1:02d}-{n % 28 + 1:02d}",
    "date-time": lambda n: f"20{n % 30:02d}-{n % 12 + 1:02d}-{n % 28 + 1:02d}T{n % 24:02d}:{n % 60:02d}:00Z",
    "time": lambda n: f"{n % 24:02d}:{n % 60:02d}:{n % 59:02d}",
    "duration": lambda n: f"P{n % 9 + 1}D",
    "email": lambda n: f"user{n}@example.com",
    "hostname": lambda n: f"host{n}.example.com",
    "uri": lambda n: f"https://example.com/{n}",
    "ipv4": lambda n: f"10.{n % 256}.{n // 256 % 256}.{n % 250 + 1}",
    "ipv6": lambda n: f"2001:db8::{n % 65536:x}",
    "uuid": lambda n: str(uuid.UUID(int=n * 7919 + 1)),
}


def _stated_pattern(node: dict[str, Any]) -> str | None:
    """A `pattern` the description states (`api_schema` moves it there), which a model follows."""
    hint = (node.get("description") or "").rsplit("\n\n", 1)[-1].strip()
    found = re.search(r"(?:^\{|, )pattern: (.*?)(?:, [A-Za-z_]+: |\}$)", hint) if hint.startswith("{") else None
    return found.group(1) if found else None


def matching(pattern: str, seed: int = 0) -> str | None:
    """A short string `pattern` matches in full, built from its parsed form (None for what it cannot build, such
    as lookarounds or backreferences)."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    categories = {
        c.CATEGORY_DIGIT: "0123456789",
        c.CATEGORY_WORD: "abcxyz",
        c.CATEGORY_SPACE: " ",
        c.CATEGORY_NOT_DIGIT: "a",
        c.CATEGORY_NOT_WORD: "-",
        c.CATEGORY_NOT_SPACE: "a",
    }

    def build(items: Any, n: int) -> str:
        out = []
        for op, arg in items:
            if op is c.LITERAL:
                out.append(chr(arg))
            elif op is c.ANY:
                out.append("a")
            elif op is c.IN:
                choices = []
                if arg and arg[0][0] is c.NEGATE:
                    raise ValueError("negated class")
                for kind, value in arg:
                    if kind is c.LITERAL:
                        choices.append(chr(value))
                    elif kind is c.RANGE:
                        choices.extend(chr(x) for x in range(value[0], min(value[1], value[0] + 25) + 1))
                    elif kind is c.CATEGORY:
                        choices.extend(categories[value])
                out.append(choices[n % len(choices)])
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                low, high, sub = arg
                times = low if high == c.MAXREPEAT else min(high, low + n % 3)
                out.extend(build(sub, n + i) for i in range(max(times, 1 if low else 0)))
            elif op is c.SUBPATTERN:
                out.append(build(arg[-1], n))
            elif op is c.BRANCH:
                out.append(build(arg[1][n % len(arg[1])], n))
            elif op is c.AT:
                continue
            else:
                raise ValueError(f"cannot build {op}")
        return "".join(out)

    try:
        text = build(_parser.parse(pattern), seed)
    except (ValueError, KeyError, re.error, IndexError):
        return None
    return text if re.fullmatch(pattern, text) or re.search(pattern, text) else None


def _stated_rules(node: dict[str, Any]) -> dict[str, float]:
    """Numeric constraints the API does not enforce but states in the description (`api_schema`'s hint:
    "{maximum: 1, minimum: 0}"), which a model follows: the simulator follows them too."""
    hint = (node.get("description") or "").rsplit("\n\n", 1)[-1].strip()
    rules: dict[str, float] = {}
    if not (hint.startswith("{") and hint.endswith("}")):
        return rules
    for part in re.split(r", (?=[A-Za-z_]+: )", hint[1:-1]):  # a pattern's own braces and commas stay whole
        name, _, value = part.partition(": ")
        with contextlib.suppress(ValueError):
            rules[name.strip()] = float(value)
    return rules


def _number(rules: dict[str, float], integer: bool, share: float) -> float | int:
    """A number within the stated bounds (by default 0 to 99, or 0 to 100.0)."""
    step = 1 if integer else 1e-6
    low = max(rules.get("minimum", -math.inf), rules.get("exclusiveMinimum", -math.inf) + step)
    high = min(rules.get("maximum", math.inf), rules.get("exclusiveMaximum", math.inf) - step)
    low = low if low > -math.inf else (high - 99 if high < math.inf else 0)
    high = high if high < math.inf else low + (99 if integer else 100)
    step_of = rules.get("multipleOf")
    if step_of:  # the multiples within the bounds, one picked
        first, last = math.ceil(low / step_of), math.floor(high / step_of)
        value = (first + round(share * max(last - first, 0))) * step_of
        return int(value) if integer else round(value, 9)
    if integer:
        low, high = math.ceil(low), math.floor(high)
        return int(low + round(share * max(high - low, 0)))
    return round(low + share * (high - low), 6) if high > low else low
