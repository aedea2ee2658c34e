"""Images and documents in a request, as the simulator sees them: what the API refuses, what it bills, what a
reply can depend on.

Files are read by hand with the standard library (`formats.py`: image headers, PDF objects), so the simulator stays
free of imaging and PDF packages: it reads what it needs to bill and refuse as the API does, no more. The files a
test sends are made by `samples.py`.
Limits and formulas are the API's documented ones (vision and PDF-support pages):
- images: jpeg/png/gif/webp, at most 5 MB decoded and 8000 px a side (2000 px when a request has more than 20);
  billed `ceil(w * h / 750)` after scaling so the long edge is at most 1568 px and the image about 1,600 tokens;
- PDFs: at most 100 pages a request; each page is billed its extracted text plus an image of the page;
- text documents: billed as their text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from llmledger._step.formats import image_size, pdf_pages

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_IMAGE_SIDE, MAX_IMAGE_SIDE_MANY, MANY_IMAGES, MAX_IMAGES = 8000, 2000, 20, 100
MAX_PDF_PAGES, MAX_BREAKPOINTS = 100, 4
LONG_EDGE, IMAGE_TOKEN_CAP = 1568, 1600  # scaled down past these ("~1,600 tokens": about 1.2 megapixels)
PASSED_THROUGH = {"tool_use", "tool_result", "thinking", "redacted_thinking"}  # accepted, not inspected
MARKER = re.compile(r"^\[(image/(?:jpeg|png|gif|webp)|application/pdf|text/plain) ([^\n]*)\]$", re.M)


def count_tokens(text: str) -> int:
    """Roughly four characters a token, as a stand-in for the real tokenizer."""
    return max(1, math.ceil(len(text) / 4))


def image_tokens(width: int, height: int) -> int:
    """What the API bills for an image: `ceil(w * h / 750)` once scaled down, aspect kept, to a long edge of at
    most 1568 px and at most ~1,600 tokens (the docs' table: 1092x1092, 951x1268, 784x1568 are the largest)."""
    scale = min(1.0, LONG_EDGE / max(width, height), math.sqrt(IMAGE_TOKEN_CAP * 750 / (width * height)))
    return math.ceil(max(1, int(width * scale)) * max(1, int(height * scale)) / 750)


# "Each page is converted into an image" and billed as one: a US-letter page rendered at 150 dpi (1275x1650) is
# scaled to the cap, 962x1246 px: 1,599 tokens a page, besides its text.
PAGE_IMAGE_TOKENS = image_tokens(1275, 1650)


@dataclass(frozen=True)
class Attachment:
    """One image or document of a request, parsed once: its size, its text, what it costs and its marker."""

    media_type: str
    digest: str  # the first 8 hex digits of the SHA-256 of its bytes (or text)
    tokens: int
    marker: str  # what user_text() shows of it, so replies and prompt counts depend on the file
    size: tuple[int, int] = (0, 0)  # images: width, height
    pages: int = 0  # PDFs
    text: str = ""


def _extract(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit].replace("]", ")")


_SEEN: OrderedDict[tuple[str, str, Any], Attachment | tuple[str, str]] = OrderedDict()
_SEEN_LOCK = threading.Lock()


def inspect(kind: str, media_type: str, data: str) -> Attachment | tuple[str, str]:
    """An image ("image") or a base64 PDF or text document ("pdf", "text") parsed, or (path suffix, the API's
    message) for what the API refuses in it. Cached (large files by digest, so the cache stays small): a
    request's files are looked at several times (validation, billing, caching, the log)."""
    key = (kind, media_type, data if len(data) < 65536 else hashlib.sha256(data.encode()).digest())
    with _SEEN_LOCK:
        if key in _SEEN:
            _SEEN.move_to_end(key)
            return _SEEN[key]
    found = _inspect(kind, media_type, data)
    with _SEEN_LOCK:
        _SEEN[key] = found
        while len(_SEEN) > 512:
            _SEEN.popitem(last=False)
    return found


def _inspect(kind: str, media_type: str, data: str) -> Attachment | tuple[str, str]:
    if kind == "text":
        digest = hashlib.sha256(data.encode()).hexdigest()[:8]
        return Attachment(
            media_type, digest, 0, f"[text/plain {len(data)} chars sha256:{digest}: {_extract(data)}]", text=data
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "source.base64", "invalid base64 data"
    digest = hashlib.sha256(raw).hexdigest()[:8]
    if kind == "pdf":
        pages = pdf_pages(raw)
        if pages is None:
            return "source.base64.data", "The PDF specified was not valid."
        text, n = "\n".join(pages), len(pages)
        tokens = sum(math.ceil(len(page) / 4) + PAGE_IMAGE_TOKENS for page in pages)
        said = f": {_extract(text)}" if text.strip() else ""
        marker = f"[application/pdf {n} page{'s' * (n != 1)} sha256:{digest}{said}]"
        return Attachment(media_type, digest, tokens, marker, pages=n, text=text)
    if len(raw) > MAX_IMAGE_BYTES:
        return "source.base64", f"image exceeds 5 MB maximum: {len(raw)} bytes > {MAX_IMAGE_BYTES} bytes"
    found = image_size(raw)
    if found is None or found[0] != media_type or not found[1] or not found[2]:
        return "source.base64.data", f"Image does not match the provided media type {media_type}"
    _, width, height = found
    if max(width, height) > (side := MAX_IMAGE_SIDE):
        return "source.base64.data", f"At least one of the image dimensions exceed max allowed size: {side} pixels"
    return Attachment(
        media_type,
        digest,
        image_tokens(width, height),
        f"[{media_type} {width}x{height} sha256:{digest}]",
        size=(width, height),
    )


def _source(block: dict[str, Any], where: str) -> tuple[str, str, str] | str:
    """(kind, media type, data) of an image or document block, or what the API says is wrong with its source."""
    name, source = block["type"], block.get("source")
    stype = source.get("type") if isinstance(source, dict) else None
    expected = ("base64", "url", "file") if name == "image" else ("base64", "text", "content", "url", "file")
    if stype in ("url", "file", "content") and stype in expected:
        return (
            f"{where}.{name}.source.{stype}: the llmledger simulator takes base64 sources only (and text for "
            f"documents): it cannot fetch a URL, read the Files API or custom content; send the file's bytes "
            f'as {{"type": "base64", "media_type": ..., "data": ...}}'
        )
    if stype not in expected:
        return (
            f"{where}.{name}.source: Input tag {stype!r} found using 'type' does not match any of the expected "
            f"tags: {', '.join(repr(e) for e in expected)}"
        )
    assert isinstance(source, dict)  # a source without a type was refused above
    media, data = source.get("media_type"), source.get("data")
    allowed = IMAGE_TYPES if name == "image" else ("application/pdf",) if stype == "base64" else ("text/plain",)
    if media not in allowed:
        quoted = [repr(a) for a in allowed]
        said = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        return f"{where}.{name}.source.{stype}.media_type: Input should be {said}"
    if not isinstance(data, str):
        return f"{where}.{name}.source.{stype}.data: Input should be a valid string"
    return ("image" if name == "image" else "pdf" if stype == "base64" else "text"), str(media), data


def attachment(block: Any) -> Attachment | None:
    """The parsed file of an image or document block, None for any other block or a refused one."""
    if not isinstance(block, dict) or block.get("type") not in ("image", "document"):
        return None
    source = _source(block, "")
    found = inspect(*source) if isinstance(source, tuple) else None
    return found if isinstance(found, Attachment) else None


def block_problem(block: Any, where: str) -> str | None:
    """What the API refuses in one content block (its shape, its source, its file, its cache_control), or None."""
    if not isinstance(block, dict):
        return f"{where}: Input should be a valid dictionary"
    control = block.get("cache_control")
    if control is not None and not (
        isinstance(control, dict) and control.get("type") == "ephemeral" and control.get("ttl", "5m") in ("5m", "1h")
    ):
        return f"{where}.cache_control: type must be 'ephemeral' and ttl '5m' or '1h'"
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            return f"{where}.text.text: Input should be a valid string"
        if not text:
            return "messages: text content blocks must be non-empty"
        return None if text.strip() else "messages: text content blocks must contain non-whitespace text"
    if kind in PASSED_THROUGH:
        return None
    if kind not in ("image", "document"):
        return (
            f"{where}: Input tag {kind!r} found using 'type' does not match any of the expected tags: 'text', "
            f"'image', 'document', {', '.join(repr(k) for k in sorted(PASSED_THROUGH))}"
        )
    source = _source(block, where)
    if isinstance(source, str):
        return source
    found = inspect(*source)
    label = {"image": "image", "pdf": "pdf", "text": "document"}[source[0]]
    return f"{where}.{label}.{found[0]}: {found[1]}" if isinstance(found, tuple) else None


def content_problem(body: dict[str, Any]) -> str | None:
    """What the API refuses in the content blocks of a request's messages, over all of them: each block, the
    pages of all PDFs (at most 100), the number and size of images, cache breakpoints (at most 4 with system's)."""
    blocks = [
        (f"messages.{i}.content.{j}", block)
        for i, m in enumerate(body.get("messages") or [])
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for j, block in enumerate(m["content"])
    ]
    images = sum(isinstance(b, dict) and b.get("type") == "image" for _, b in blocks)
    if images > MAX_IMAGES:
        return f"messages: A maximum of {MAX_IMAGES} images may be provided in one request. Found {images}."
    pages = 0
    for where, block in blocks:
        problem = block_problem(block, where)
        if problem:
            return problem
        found = attachment(block)
        if found is not None and images > MANY_IMAGES and max(found.size) > MAX_IMAGE_SIDE_MANY:
            return (
                f"{where}.image.source.base64.data: At least one of the image dimensions exceed max allowed "
                f"size for many-image requests: {MAX_IMAGE_SIDE_MANY} pixels"
            )
        pages += found.pages if found is not None else 0
        if pages > MAX_PDF_PAGES:
            return f"{where}.pdf.source.base64.data: A maximum of {MAX_PDF_PAGES} PDF pages may be provided."
    system = body.get("system")
    marked = [
        b
        for b in [*(system if isinstance(system, list) else []), *(body.get("tools") or []), *(b for _, b in blocks)]
        if isinstance(b, dict) and b.get("cache_control") is not None
    ]
    if len(marked) > MAX_BREAKPOINTS:
        return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marked)}."
    return None


def files_in(prompt: str) -> list[tuple[str, str]]:
    """(description, text) of each file user_text() marked in a prompt, e.g. ("image/png 64x48 sha256:1a2b3c4d", "")."""
    found = []
    for media, rest in MARKER.findall(prompt):
        head, _, text = rest.partition(": ")
        found.append((f"{media} {head}", text))
    return found


def stated_value(texts: list[str], name: str, number: bool) -> Any:
    """The value a file's text states for a field (`Total: $123.45`, `Vendor: Acme Corp`), or None: what a model
    reading an invoice would extract."""
    if not name.isidentifier():
        return None
    value = r"\$?\s*(-?[\d,]*\.?\d+)" if number else r"(.+?)(?=\s+[A-Z][A-Za-z]*(?: [a-z]+)*:|$)"  # to the next label
    words = name.split("_")  # `total_usd` is the invoice's "Total", as a model reads it: the longest label first
    labels = [" ".join(words[:n]) for n in range(len(words), 0, -1)] + [
        " ".join(words[n:]) for n in range(1, len(words))
    ]
    for label in labels:
        for text in texts:
            found = re.search(rf"(?i:\b{re.escape(label)})\s*:\s*{value}", text)
            if found:
                return float(found.group(1).replace(",", "")) if number else found.group(1).strip()
    return None


def block_cost(block: Any) -> tuple[str, int]:
    """(text billed as text, tokens billed besides) for one content block: a file is never billed as base64."""
    if not isinstance(block, dict):
        return json.dumps(block), 0
    if block.get("type") == "text":
        return str(block.get("text", "")), 0
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):  # may hold images
        costs = [block_cost(inner) for inner in block["content"]]
        return "".join(said for said, _ in costs), sum(tokens for _, tokens in costs)
    found = attachment(block)
    if found is None:
        return json.dumps(block), 0
    said = "".join(str(block.get(k) or "") for k in ("title", "context"))
    return (said + found.text, 0) if found.media_type == "text/plain" else (said, found.tokens)


def block_key(block: Any) -> Any:
    """A content block as the prompt cache keys it: a file by its digest, not its base64."""
    found = attachment(block)
    if found is None:
        return {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
    return {"type": block["type"], "file": found.marker}
