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
# Words of unsolicited offers, weighted: what a spam filter keys on (the SMS Spam Collection's spam is mostly
# prizes, premium numbers and "txt STOP"); a message scoring 3 or more is spam.
_SPAM = {
    "free": 2, "win": 2, "winner": 3, "won": 2, "prize": 3, "claim": 3, "cash": 2, "award": 2, "urgent": 2,
    "guaranteed": 3, "txt": 2, "text": 1, "call": 1, "mobile": 1, "reply": 1, "stop": 1, "ringtone": 3,
    "tone": 1, "offer": 1, "voucher": 3, "bonus": 2, "selected": 2, "congratulations": 2, "subscribe": 2,
    "subscription": 2, "unsubscribe": 2, "service": 1, "chat": 1, "sexy": 2, "dating": 2, "rate": 1, "apply": 1,
    "nokia": 2, "camera": 1, "delivery": 1, "entry": 2, "comp": 2, "draw": 1, "t&c": 3, "t&cs": 3, "tc": 1,
    "www": 3, "http": 3, "com": 1, "uk": 1, "ppm": 3, "p/min": 3, "150p": 3, "100p": 3, "18": 1, "await": 2,
    "collection": 2, "customer": 1, "valued": 2, "code": 1, "po": 1, "box": 1, "quiz": 2, "credit": 1,
}  # fmt: skip
_OPTION = r"['\"]?[A-Za-z][\w-]*['\"]?"
# How a prompt names the answers it takes: "one word: A, B or C", "Answer spam or ham", "label it as A or B",
# "one of: A, B, C", "(A/B/C)": a cue, then a list joined by commas, "or" or slashes.
_CHOICES = re.compile(
    rf"(?:one word|one of|either|whether|answer|reply|respond|label|classify|categori[sz]e|is (?:it|this|the \w+)"
    rf"|as)\b[^\n.?]*?[:(]?\s*"
    rf"((?:{_OPTION}\s*(?:,\s*|/\s*|,?\s+or\s+))+{_OPTION})",
    re.IGNORECASE,
)
_NOT_OPTIONS = {"a", "an", "the", "it", "is", "with", "only", "just", "word", "one", "as", "this", "that", "text"}


def choices(text: str) -> list[str]:
    """The answers a prompt (or its system prompt) asks to choose from, as it names them; [] when it names none."""
    for found in _CHOICES.finditer(text):
        options = [o.strip("'\" ") for o in re.split(r",\s*or\s+|,|/|\s+or\s+", found.group(1))]
        options = [o for o in options if o and o.lower() not in _NOT_OPTIONS]
        if len(options) >= 2:
            return options
    return []


def is_spam(text: str) -> bool:
    """Whether `text` reads like an unsolicited offer: a spam score of 3 or more."""
    return spam_score(text) >= 3


def spam_score(text: str) -> int:
    """How much `text` reads like an unsolicited offer (`_SPAM`'s weights; a long number, a price)."""
    words = re.findall(r"[a-z0-9&/]+", text.lower())
    score = sum(_SPAM.get(w, 0) for w in words)
    score += 2 * len(re.findall(r"\b0?[789]\d{9,}\b|\b8\d{4}\b", text))  # premium numbers and short codes
    score += 2 * len(re.findall(r"[£$€]\s?\d", text))
    return score


def _classified(options: list[str], row: str) -> str | None:
    """The option a known task's lexicon gives `row` (spam or ham; positive, negative or neutral), if the options
    are such a task's."""
    low = {o.lower(): o for o in options}
    if "spam" in low:
        other = next((o for o in options if o.lower() != "spam"), options[-1])
        return low["spam"] if is_spam(row) else other
    if "positive" in low and "negative" in low:
        words = re.findall(r"[a-z']+", row.lower())
        score = sum(w in _POSITIVE for w in words) - sum(w in _NEGATIVE for w in words)
        label = "positive" if score > 0 else "negative" if score < 0 else "neutral"
        return low.get(label, low["negative"] if score < 0 else low["positive"])
    return None


def default_reply(prompt: str, system: str | None = None) -> str:
    """A deterministic answer that looks like what a prompt asked for.

    A prompt that names its answers ("one word: A, B or C", "Answer spam or ham", "label it positive, negative or
    neutral", in its system prompt or its text) gets one of them: for the common tasks the one a small lexicon
    gives the row (spam or ham from the words of unsolicited offers; sentiment from words of praise and
    complaint), otherwise the option the row (or its file) names, else the last. Sentiment prompts that name no
    options get positive, negative or neutral. Everything else gets a short extract of the prompt's last line, so
    different rows get different, reproducible answers. Attached files (user_text's markers) count too: their
    text is read, and a summary says what it was shown, so the same text with another file gets another answer.
    """
    files = files_in(prompt)
    prompt = MARKER.sub("", prompt)
    lowered = prompt.lower()
    options = choices(f"{system or ''}\n{prompt}")
    if not options and ("sentiment" in lowered or ("positive" in lowered and "negative" in lowered)):
        options = ["positive", "negative", "neutral"]
    if options:  # the row's own text: after the prompt's last colon, and its files
        row = " ".join([prompt.rsplit(":", 1)[-1], *(text for _, text in files)])
        known = _classified(options, row)
        if known is not None:
            return known
        # "Answer with one word: invoice or receipt": the option the row (or its file) names, else the last
        seen = " ".join([prompt.rsplit("\n", 1)[-1], *(text for _, text in files)]).lower()
        for option in options:  # the question names every option: not counted
            seen = seen.replace(option.lower(), " ", 1) if f" or {option.lower()}" in seen else seen
        named = [o for o in options if re.search(rf"\b{re.escape(o.lower())}\b", seen)]
        return named[0] if named else options[-1]
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
    row = " ".join([MARKER.sub("", prompt).rsplit(":", 1)[-1], *files])  # the row's own text, for known tasks
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
            known = _classified([str(v) for v in values], row) if all(isinstance(v, str) for v in values) else None
            if known is not None and not variant:
                return known
            return values[pick(path, len(values))]
        kind = node.get("type")
        if kind == "boolean" and "spam" in path.rsplit(".", 1)[-1].lower() and not variant:  # is_spam: the lexicon's
            return is_spam(row)
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
