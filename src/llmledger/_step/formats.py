"""Image and PDF files read by hand with the standard library: an image's type and size from its header
(`image_size`), a PDF's pages and their text (`pdf_pages`).

Its own module because it is byte-level parsing, with no notion of a request: the simulator's `media.py` uses it
to refuse, bill and mark files as the API does, and the review view to show a PDF's pages and first page's text,
both free of imaging and PDF packages.
"""

from __future__ import annotations

import re
import struct
import zlib


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


_MAX_PAGES = 100_000  # far above the API's 100: such a file is refused for its pages, not read into memory
_MAX_INFLATED = 64_000_000  # bytes one compressed stream may inflate to
_OBJECT = re.compile(rb"(?<![0-9])(\d{1,9})\s+\d+\s+obj\b")
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
            length = re.search(rb"/Length\s+(\d{1,12})(?!\s+\d+\s+R)", head)
            data = raw[begin : begin + int(length.group(1))] if length else raw[begin : raw.find(b"endstream", begin)]
            if b"/FlateDecode" in head:
                try:
                    data = zlib.decompressobj().decompress(data, _MAX_INFLATED)  # a zip bomb stops here
                except zlib.error:
                    data = b""
        objects[int(found.group(1))] = (head, data)
    dicts = b"\n".join(
        [head for head, _ in objects.values()] + [data for head, data in objects.values() if b"/ObjStm" in head]
    )
    pages = [head for _, (head, _) in sorted(objects.items()) if _PAGE.search(head)]
    count = len(_PAGE.findall(dicts)) or max((int(n) for n in re.findall(rb"/Count\s+(\d{1,9})\b", dicts)), default=0)
    if not 1 <= count <= _MAX_PAGES:  # no page, or a count no PDF the API reads has (a 64-byte file said 30 million)
        return None
    texts = [_page_text(head, objects) for head in pages]
    return (texts + [""] * count)[:count]


def _page_text(page: bytes, objects: dict[int, tuple[bytes, bytes]]) -> str:
    contents = re.search(rb"/Contents\s*(\[[^\]]*\]|\d+\s+\d+\s+R)", page)
    refs = [int(n) for n in re.findall(rb"(\d{1,9})\s+\d+\s+R", contents.group(1))] if contents else []
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
