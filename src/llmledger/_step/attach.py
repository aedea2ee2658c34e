"""Files attached to a row's message: images and PDFs from columns of paths, URLs or bytes.

`apply_llm(..., attach="invoice_path")` sends each row's files as image or document content blocks before
the row's text. What the ledger records, and fingerprints, is the **content**, never where it came from:
each block's `data` is written `"sha256:<hex digest of the bytes>"` in the stored request, so

- a file that changes makes its row's request change (the row reports stale; nothing is re-paid unasked),
- an unchanged file never re-pays, whatever path or URL it is reached by, and
- the ledger holds a 71-character hash per file, not the bytes.

The bytes are read again when the request is sent, from the path or URL (kept in the fact table as an
input column) or from the frame (a bytes column, which the ledger does not keep), and sent only if they
still hash to what was recorded: a row never gets an answer to a file other than the one its request names.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import stat
import struct
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from llmledger.errors import PromptError

REF = "sha256:"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
PDF = "application/pdf"
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the API refuses a larger image
MAX_PDF_BYTES = 32 * 1024 * 1024  # the API's limit on a whole request, so on any PDF in it
MAX_IMAGE_SIDE = 8_000  # pixels; the API refuses a larger image
IMAGE_TOKEN_CAP = 1_600  # the vision docs: larger images are scaled down to about this
PDF_PAGE_TOKENS = 1_600  # a page is also sent as an image; text tokens come on top (the PDF support docs)
URL_TIMEOUT = 60.0


NOT_SENT = "not sent: "  # the start of the error of a row whose file could not be sent (no attempt is counted)
# in the error of a row whose file came as bytes: no later pass from the store can send it (a worker stops for it)
BYTES_NOT_KEPT = "came as bytes in the frame, which the ledger does not keep"


class AttachmentError(Exception):
    """A row's file can no longer be sent as its request recorded it (moved, changed, unreadable)."""


@dataclass(frozen=True)
class Blob:
    """What the ledger knows of one file: its hash, its type, and roughly what it costs to send."""

    sha256: str
    media_type: str
    size: int
    tokens: int  # an estimate, for llmledger.estimate (the API counts exactly when it answers)

    def block(self, api: str = "messages") -> dict[str, Any]:
        """The content block as recorded and fingerprinted, the bytes standing in as their hash, in the shape of
        the step's API (`api`): Anthropic's image or document block ("messages"); a Chat Completions part with a
        data URL, `image_url` for an image and `file` for a PDF ("chat"); a Responses `input_image` or
        `input_file` with the data URL ("responses")."""
        if api in ("chat", "responses"):
            url = f"data:{self.media_type};base64,{REF}{self.sha256}"
            name = f"{self.sha256[:16]}.pdf"
            if api == "responses":
                if self.media_type == PDF:
                    return {"type": "input_file", "filename": name, "file_data": url}
                return {"type": "input_image", "image_url": url}
            if self.media_type == PDF:
                return {"type": "file", "file": {"filename": name, "file_data": url}}
            return {"type": "image_url", "image_url": {"url": url}}
        kind = "document" if self.media_type == PDF else "image"
        return {"type": kind, "source": {"type": "base64", "media_type": self.media_type, "data": REF + self.sha256}}


def media_type(data: bytes) -> str | None:
    """The media type the API takes that `data` is, read from its first bytes; None for any other file."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if b"%PDF-" in data[:1024] and b"%%EOF" in data[-1024:]:  # the header may follow other bytes; the end marks it
        return PDF
    return None


def image_size(data: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) from an image's header, or None when it cannot be read there."""
    try:
        if kind == "image/png":
            return struct.unpack(">II", data[16:24])
        if kind == "image/gif":
            return struct.unpack("<HH", data[6:10])
        if kind == "image/webp" and data[12:16] == b"VP8X":  # extended
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if kind == "image/webp" and data[12:16] == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy
            width, height = struct.unpack("<HH", data[26:30])
            return width & 0x3FFF, height & 0x3FFF
        if kind == "image/webp" and data[12:16] == b"VP8L" and data[20:21] == b"\x2f":  # lossless
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if kind == "image/jpeg":
            i = 2
            while i + 9 < len(data):
                marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                    height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                    return width, height
                i += 2 + length
    except struct.error:
        return None
    return None


def image_tokens(width: int, height: int) -> int:
    """The API's count for an image: one token per 750 pixels once scaled to at most 1568 px a side, and at most
    about 1,600 (the vision docs)."""
    scale = min(1.0, 1568 / max(width, height, 1))
    return max(1, min(IMAGE_TOKEN_CAP, math.ceil(round(width * scale) * round(height * scale) / 750)))


def blob_of(data: bytes, what: str) -> Blob:
    """The Blob of a file's bytes; PromptError when the API would not take them (`what` names the file)."""
    kind = media_type(data)
    if kind is None:
        raise PromptError(
            f"{what} is not a PNG, JPEG, GIF or WebP image or a PDF (it starts {data[:8]!r}); "
            "those are the files llmledger sends (Claude and OpenAI read them). Convert it, or leave the row out "
            "(where=, or a null)."
        )
    limit = MAX_PDF_BYTES if kind == PDF else MAX_IMAGE_BYTES
    if len(data) > limit:
        raise PromptError(
            f"{what} is {len(data) / 2**20:.1f} MB; the API takes at most {limit // 2**20} MB for "
            f"{'a PDF' if kind == PDF else 'an image'}. Make it smaller, or leave the row out."
        )
    if kind == PDF:
        pages = len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data)) or 1
        text = sum(len(t) for t in re.findall(rb"\((.*?)\)\s*Tj", data)) // 4
        tokens = pages * PDF_PAGE_TOKENS + text
    else:
        size = image_size(data, kind)
        cut = (kind == "image/png" and b"IEND" not in data[-16:]) or (
            kind == "image/jpeg" and b"\xff\xd9" not in data[-1024:]
        )
        if size is None or min(size) < 1 or cut:
            raise PromptError(
                f"{what} starts like a {kind} but its size cannot be read from it: a damaged or cut-off "
                "file, which the API refuses. Replace it, or leave the row out."
            )
        if max(size) > MAX_IMAGE_SIDE:
            raise PromptError(
                f"{what} is {size[0]} x {size[1]} px; the API takes at most {MAX_IMAGE_SIDE} px a side. "
                "Scale it down, or leave the row out."
            )
        tokens = image_tokens(*size)
    return Blob(hashlib.sha256(data).hexdigest(), kind, len(data), tokens)


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def read_location(value: str) -> bytes:
    """The bytes at a path or an http(s) URL; OSError when they cannot be had."""
    if is_url(value):
        with urllib.request.urlopen(value, timeout=URL_TIMEOUT) as response:
            return bytes(response.read(MAX_PDF_BYTES + 1))  # more is refused anyway: never read on
    path = Path(value).expanduser()
    checked_stat(path, since_recorded=True)  # swapped for a FIFO or a huge file since: never block on it
    return read_at_most(path)


def checked_stat(path: Path, *, since_recorded: bool = False) -> os.stat_result:
    """The stat of a file that may be read: OSError for anything but a regular file (a FIFO would block, a device
    never end) and for one larger than any file the API takes (refused unread)."""
    st = path.stat()
    not_, now = ("no longer", " now") if since_recorded else ("not", "")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{str(path)!r} is {not_} a regular file (a {'directory' if path.is_dir() else 'special file'})")
    if st.st_size > MAX_PDF_BYTES:
        raise OSError(
            f"{str(path)!r} is {st.st_size / 2**20:.1f} MB{now}; the API takes at most "
            f"{MAX_IMAGE_BYTES // 2**20} MB for an image and {MAX_PDF_BYTES // 2**20} MB for a PDF"
        )
    return st


def read_at_most(path: Path) -> bytes:
    """The file's bytes, at most one more than any file the API takes, whatever it became since its stat."""
    with path.open("rb") as f:
        return f.read(MAX_PDF_BYTES + 1)


# Hashes of files already read in this process, by (absolute path, inode, size, mtime, ctime): a rerun stats its
# files instead of reading them all again. A file rewritten in place changes its ctime (even when its size and
# mtime are put back), a repointed symlink its inode, so either is read afresh.
_HASHED: dict[tuple[str, int, int, int, int], Blob] = {}


def blob_at(value: str, what: str) -> Blob:
    """The Blob of the file at a path or URL (PromptError naming `what` when it cannot be read)."""
    try:
        if not value.strip():
            raise PromptError(f"{what} is an empty path; leave the row out (where=, or a null) or fix the path")
        if not is_url(value):
            path = Path(value).expanduser().absolute()
            st = checked_stat(path)
            stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if stamp in _HASHED:
                return _HASHED[stamp]
            found = blob_of(read_at_most(path), what)
            _HASHED[stamp] = found
            return found
        return blob_of(read_location(value), what)
    except OSError as exc:
        where = "" if is_url(value) or os.path.isabs(os.path.expanduser(value)) else f" (relative to {os.getcwd()})"
        raise PromptError(
            f"{what} cannot be read{where}: {type(exc).__name__}: {exc}. Fix the path, or leave the "
            "row out (where=, or a null)."
        ) from None


@dataclass
class Attachments:
    """One call's attached columns, and where in this process each recorded file's bytes can be found."""

    columns: tuple[str, ...]
    # sha256 -> a path or URL, or a function returning the bytes (a bytes column the ledger does not keep)
    known: dict[str, str | Callable[[], bytes]] = field(default_factory=dict)
    blobs: dict[str, Blob] = field(default_factory=dict)
    fetched: dict[str, Blob] = field(default_factory=dict)  # URLs fetched by this call: once, not in a transaction
    in_frame: dict[tuple[str, str], Blob] = field(default_factory=dict)  # bytes values hashed, by (column, row key)
    api: str = "messages"  # whose blocks `blocks` makes: the Messages API's, Chat Completions' or Responses' parts

    def blocks(
        self, row: dict[str, Any], where: str, frame: pl.DataFrame | None = None, index: int | None = None
    ) -> list[dict[str, Any]]:
        """The content blocks of one row's files, in column order (a null is no file)."""
        out = []
        for column in self.columns:
            value = row.get(column)
            if value is None:
                continue
            what = f"{column} of the row with key {where}"
            if isinstance(value, bytes | bytearray | memoryview):
                found = self.in_frame.get((column, where))  # hashed by the up-front check: not again
                if found is None:
                    data = bytes(value)
                    found = self.in_frame[column, where] = blob_of(data, what)
                    self.known.setdefault(found.sha256, _holder(frame, column, index, data))
            else:
                text = str(value) if isinstance(value, os.PathLike | str) else None
                if text is None:
                    raise PromptError(
                        f"{what} is a {type(value).__name__}; an attached column holds file paths "
                        "or URLs (text) or file contents (bytes)"
                    )
                found = self.fetched.get(text) or blob_at(text, f"{what} ({text!r})")
                if is_url(text):
                    self.fetched[text] = found
                self.known.setdefault(found.sha256, text)
            self.blobs[found.sha256] = found
            out.append(found.block(self.api))
        return out

    def for_columns(self, columns: tuple[str, ...]) -> Attachments:
        """The same bytes this process knows, for a request attaching `columns` (another version's, resume's)."""
        return (
            self
            if columns == self.columns
            else Attachments(columns, self.known, self.blobs, self.fetched, self.in_frame, self.api)
        )

    def resolve(self, body: dict[str, Any], *rows: dict[str, Any]) -> dict[str, Any]:
        """`body` as sent: each recorded hash replaced by the file's bytes, read now and checked against it.

        The bytes come from this process (the frame apply_llm was given) or from the stored path or URL columns
        (`input.<column>`, as claims return them) of any of `rows`, the rows asking this very request.
        AttachmentError when no such file hashes as recorded.
        """
        field = "input" if "input" in body else "messages"  # the conversation: Responses' input, or messages
        messages = body[field]
        content = messages[-1]["content"]
        if not isinstance(content, list) or not any(_ref(b) for b in content):
            return body
        sent = [_with_data(b, self._bytes(ref, rows)) if (ref := _ref(b)) else b for b in content]
        return {**body, field: [*messages[:-1], {**messages[-1], "content": sent}]}

    def _bytes(self, sha: str, rows: Sequence[dict[str, Any]]) -> bytes:
        places: list[str | Callable[[], bytes]] = []
        if sha in self.known:
            places.append(self.known[sha])
        for row in rows:
            places += [v for c in self.columns if isinstance(v := row.get("input." + c), str) and v not in places]
        problems = []
        for place in places:
            try:
                data = place() if callable(place) else read_location(place)
            except OSError as exc:
                relative = isinstance(place, str) and not is_url(place) and not os.path.isabs(os.path.expanduser(place))
                problems.append(
                    f"{place!r}{f' (relative to {os.getcwd()})' if relative else ''}: {type(exc).__name__}: {exc}"
                )
                continue
            if hashlib.sha256(data).hexdigest() == sha:
                return data
            if isinstance(place, str):  # a rewrite that kept size and mtime: hash it afresh next time
                for stamp in [s for s in _HASHED if s[0] == str(Path(place).expanduser().absolute())]:
                    _HASHED.pop(stamp, None)
            problems.append(f"{place!r} holds other content now" if isinstance(place, str) else "changed bytes")
        if not places:
            raise AttachmentError(
                f"the file recorded as sha256:{sha[:12]}… {BYTES_NOT_KEPT} (it keeps paths and URLs): "
                "finish this step with apply_llm on that frame"
            )
        raise AttachmentError(
            f"the file recorded as sha256:{sha[:12]}… is not where it was ("
            f"{'; '.join(problems)}): run apply_llm again so the ledger records the file as it "
            "is now (the row then reports stale), or put the file back"
        )


def _holder(frame: pl.DataFrame | None, column: str, index: int | None, data: bytes) -> Callable[[], bytes]:
    """A way back to a bytes value that keeps no copy of it when the frame holds it."""
    if frame is None or index is None:
        return lambda: data
    series = frame[column]
    return lambda: bytes(series[index])


_DATA_URLS = {"image_url": "url", "file": "file_data"}  # where a Chat Completions part holds its data URL
_TOP_URLS = {"input_image": "image_url", "input_file": "file_data"}  # and a Responses part, at its top level
_URL_FIELDS = {**_DATA_URLS, **_TOP_URLS}


def _ref(block: Any) -> str | None:
    """The recorded hash of a file block (Anthropic's source data, or OpenAI's data URL), None for any other."""
    if not isinstance(block, dict):
        return None
    source, kind = block.get("source"), str(block.get("type"))
    if isinstance(source, dict):
        data = source.get("data")
    else:
        inner = block if kind in _TOP_URLS else block.get(kind) if kind in _DATA_URLS else None
        url = inner.get(_URL_FIELDS[kind]) if isinstance(inner, dict) else None
        data = url.partition(";base64,")[2] if isinstance(url, str) and url.startswith("data:") else None
    return data[len(REF) :] if isinstance(data, str) and data.startswith(REF) else None


def _with_data(block: dict[str, Any], data: bytes) -> dict[str, Any]:
    encoded = base64.b64encode(data).decode("ascii")
    if "source" in block:
        return {**block, "source": {**block["source"], "data": encoded}}
    kind = block["type"]
    if kind in _TOP_URLS:
        name = _TOP_URLS[kind]
        return {**block, name: block[name].partition(";base64,")[0] + ";base64," + encoded}
    inner, name = block[kind], _DATA_URLS[kind]
    return {**block, kind: {**inner, name: inner[name].partition(";base64,")[0] + ";base64," + encoded}}


def check_attach(attach: Any, frame: pl.DataFrame) -> tuple[str, ...]:
    """attach= as a tuple of column names, each holding paths/URLs (text) or bytes; PromptError otherwise."""
    if attach is None:
        return ()
    names = [attach] if isinstance(attach, str) else attach
    if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) for n in names):
        raise PromptError(
            f"attach must name a column (or a list of columns) of file paths, URLs or bytes, "
            f"e.g. attach='invoice_path'; got {attach!r}"
        )
    for name in names:
        if name not in frame.columns:
            raise PromptError(f"attach names column {name!r}, which the frame does not have; columns: {frame.columns}")
        dtype = frame.schema[name]
        if not (dtype == pl.String or dtype == pl.Binary or dtype == pl.Object or dtype == pl.Null):
            raise PromptError(
                f"attach column {name!r} is {dtype}; it must hold file paths or URLs (text) or file contents (bytes)"
            )
    if len(set(names)) != len(names):
        raise PromptError(f"attach names a column twice: {names!r}")
    return tuple(names)


def absolute_paths(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """The frame as the ledger keeps it: each relative path of an attached column made absolute (from the folder
    the call runs in), so a worker or `llmledger run` in another folder finds the same files. URLs, absolute
    paths and bytes stay as they are; the frame the user passed is not changed."""
    text = [c for c in columns if frame.schema[c] == pl.String]

    def absolute(value: str | None) -> str | None:
        if value is None or is_url(value) or os.path.isabs(value):
            return value
        return os.path.abspath(os.path.expanduser(value))

    return frame.with_columns(pl.col(c).map_elements(absolute, return_dtype=pl.String) for c in text)


def row_content(blocks: Sequence[dict[str, Any]], text: str, api: str = "messages") -> list[dict[str, Any]]:
    """The row's message content: its files, then its text (Claude reads files best before the question), a text
    part in the API's shape (Responses' `input_text`)."""
    kind = "input_text" if api == "responses" else "text"
    return [*blocks, {"type": kind, "text": text}] if text else list(blocks)


def tokens_of(content: Any, blobs: dict[str, Blob], count: Callable[[str], int]) -> int:
    """Estimated input tokens of recorded message content (a string, or blocks with hashed files)."""
    if isinstance(content, str):
        return count(content)
    total = 0
    for block in content if isinstance(content, list) else []:
        sha = _ref(block)
        if sha is not None:
            total += blobs[sha].tokens if sha in blobs else 1_600
        elif isinstance(block, dict):
            total += count(str(block.get("text", "")))
    return total
