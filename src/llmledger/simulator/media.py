"""Images and documents in a request, as the simulator sees them: what the API refuses, what it bills, what a
reply can depend on, and small generators of PNG and PDF files for tests and notebooks.

Everything is parsed by hand with the standard library (image headers, PDF objects), so the simulator stays free
of imaging and PDF packages: it reads what it needs to bill and refuse as the API does, no more.
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
import random
import re
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

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


def image_size(raw: bytes) -> tuple[str, int, int] | None:
    """(media type, width, height) read from an image's header, or None when it is none of the four formats."""
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        return ("image/png", *struct.unpack(">II", raw[16:24]))
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        return ("image/gif", *struct.unpack("<HH", raw[6:10]))
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP" and len(raw) >= 30:
        chunk = raw[12:16]
        if chunk == b"VP8 " and raw[23:26] == b"\x9d\x01\x2a":
            width, height = struct.unpack("<HH", raw[26:30])
            return "image/webp", width & 0x3FFF, height & 0x3FFF
        if chunk == b"VP8L" and raw[20] == 0x2F:
            bits = int.from_bytes(raw[21:25], "little")
            return "image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return "image/webp", int.from_bytes(raw[24:27], "little") + 1, int.from_bytes(raw[27:30], "little") + 1
        return None
    at = 2 if raw[:2] == b"\xff\xd8" else len(raw)
    while at + 9 <= len(raw) and raw[at] == 0xFF:  # JPEG: walk the segments to the frame header (SOFn)
        marker = raw[at + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD8:
            at += 1 if marker == 0xFF else 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return "image/jpeg", width, height
        at += 2 + struct.unpack(">H", raw[at + 2 : at + 4])[0]
    return None


_OBJECT = re.compile(rb"(?<![0-9])(\d+)\s+\d+\s+obj\b")
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_STRING = rb"\((?:\\.|[^\\)])*\)"
_SHOWN = re.compile(rb"(" + _STRING + rb")\s*(?:Tj|'|\")|\[((?:" + _STRING + rb"|[^\]()])*)\]\s*TJ", re.S)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f"}


def pdf_pages(raw: bytes) -> list[str] | None:
    """The text of each page of a PDF, or None when it is not a PDF the API would read (no header or end, no
    page, encrypted). Pages are the `/Type /Page` objects (not `/Pages`), also inside object streams, else the
    largest `/Count`; text is what `Tj`/`TJ` show in the pages' content streams (uncompressed or Flate)."""
    if b"%PDF-" not in raw[:1024] or b"%%EOF" not in raw[-4096:] or b"/Encrypt" in raw:
        return None
    objects: dict[int, tuple[bytes, bytes]] = {}
    for found in _OBJECT.finditer(raw):
        start, end = found.end(), raw.find(b"endobj", found.end())
        stream = raw.find(b"stream", start, end if end >= 0 else len(raw))
        if end < 0:
            continue
        head, data = raw[start:end], b""
        if stream >= 0:
            head, begin = raw[start:stream], stream + 6 + (2 if raw[stream + 6 : stream + 8] == b"\r\n" else 1)
            length = re.search(rb"/Length\s+(\d+)(?!\s+\d+\s+R)", head)
            data = raw[begin : begin + int(length.group(1))] if length else raw[begin : raw.find(b"endstream", begin)]
            if b"/FlateDecode" in head:
                try:
                    data = zlib.decompress(data)
                except zlib.error:
                    data = b""
        objects[int(found.group(1))] = (head, data)
    dicts = b"\n".join(
        [head for head, _ in objects.values()] + [data for head, data in objects.values() if b"/ObjStm" in head]
    )
    pages = [head for _, (head, _) in sorted(objects.items()) if _PAGE.search(head)]
    count = len(_PAGE.findall(dicts)) or max((int(n) for n in re.findall(rb"/Count\s+(\d+)", dicts)), default=0)
    if count < 1:
        return None
    texts = [_page_text(head, objects) for head in pages]
    return (texts + [""] * count)[:count]


def _page_text(page: bytes, objects: dict[int, tuple[bytes, bytes]]) -> str:
    contents = re.search(rb"/Contents\s*(\[[^\]]*\]|\d+\s+\d+\s+R)", page)
    refs = [int(n) for n in re.findall(rb"(\d+)\s+\d+\s+R", contents.group(1))] if contents else []
    lines = []
    for shown in _SHOWN.finditer(b"\n".join(objects.get(ref, (b"", b""))[1] for ref in refs)):
        parts = re.findall(_STRING, shown.group(1) or shown.group(2) or b"")
        lines.append("".join(_unescape(part[1:-1]).decode("latin-1") for part in parts))
    return "\n".join(lines)


def _unescape(text: bytes) -> bytes:
    def one(match: re.Match[bytes]) -> bytes:
        code = match.group(1)
        return bytes([int(code, 8) & 0xFF]) if code[:1].isdigit() else _ESCAPES.get(code, code)

    return re.sub(rb"\\([0-7]{1,3}|.)", one, text, flags=re.S)


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
    value = r"\$?\s*(-?[\d,]*\.?\d+)" if number else r"(.+?)(?=\s+[A-Z][A-Za-z]*:|$)"
    for text in texts:
        found = re.search(rf"(?i:\b{re.escape(name.replace('_', ' '))})\s*:\s*{value}", text)
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


# -- generators ------------------------------------------------------------------------------------------------
def png(width: int, height: int, *, seed: int = 0) -> bytes:
    """A valid RGB PNG of diagonal colour stripes that depend on `seed` (each seed gives other bytes)."""
    if width < 1 or height < 1:
        raise ValueError("a PNG needs a width and a height of at least 1")
    rng = random.Random(seed)
    base = bytes(rng.randrange(256) for _ in range(3 * 256))  # one period of 256 pixels
    tiled, step = base * (width // 256 + 2), rng.randrange(1, 256)
    rows = b"".join(b"\x00" + tiled[3 * (y * step % 256) : 3 * (y * step % 256 + width)] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows, 6))
        + chunk(b"IEND", b"")
    )


def pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF 1.4, one page per string (lines split on newlines), in Helvetica 12 pt via `Tj` in
    uncompressed content streams, with a correct xref table so PDF readers open it."""
    if not pages:
        raise ValueError("a PDF needs at least one page")
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, text in enumerate(pages):
        shown = " T* ".join(f"({_escape(line)}) Tj" for line in text.split("\n"))
        stream = f"BT /F1 12 Tf 14 TL 72 720 Td {shown} ET".encode("latin-1", "replace")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> "
            f">> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    out, offsets = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _escape(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").replace("\r", "")


VENDORS = (
    "Acme Corp",
    "Globex Ltd",
    "Initech",
    "Umbrella Supplies",
    "Stark Industries",
    "Wayne Hardware",
    "Hooli Cloud",
    "Vandelay Imports",
)


def sample_documents(folder: str | Path, n: int = 12, *, seed: int = 0) -> pl.DataFrame:
    """Write `n` small files into `folder` and list them: PDF invoices (a vendor, line items and a
    "Total: $123.45" in their text; one or two pages) and PNG receipts (two in five), for trying out documents.

    Returns a frame of `id` (1..n), `path` and `kind` ("invoice" or "receipt"); the same seed writes the same files.
    """
    import polars as pl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng, rows = random.Random(seed), []
    for i in range(1, n + 1):
        if i % 5 in (2, 4):
            path = folder / f"receipt_{i:03d}.png"
            path.write_bytes(png(rng.randrange(200, 480), rng.randrange(300, 800), seed=seed * 1000 + i))
            rows.append((i, str(path), "receipt"))
            continue
        vendor = rng.choice(VENDORS)
        items = [
            (f"Item {chr(65 + k)}", rng.randrange(1, 5), rng.randrange(500, 20000) / 100)
            for k in range(rng.randrange(1, 6))
        ]
        total = round(sum(q * p for _, q, p in items), 2)
        lines = [f"{name} x{q} @ ${p:.2f} = ${q * p:.2f}" for name, q, p in items]
        first = (
            f"INVOICE {seed:02d}-{i:04d}\nVendor: {vendor}\nDate: 2025-{i % 12 + 1:02d}-{i % 28 + 1:02d}\n"
            f"Total: ${total:.2f}\n\n" + "\n".join(lines)
        )
        pages = [first] + (["Terms: payment due within 30 days.\nThank you for your business."] if i % 3 == 0 else [])
        path = folder / f"invoice_{i:03d}.pdf"
        path.write_bytes(pdf(pages))
        rows.append((i, str(path), "invoice"))
    return pl.DataFrame(rows, schema={"id": pl.Int64, "path": pl.String, "kind": pl.String}, orient="row")
