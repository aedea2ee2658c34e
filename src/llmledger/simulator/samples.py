"""Small files to send the simulator, made with the standard library: PNG images (`png`), PDFs (`pdf`), and a
folder of sample invoices and receipts (`sample_documents`), for tests, notebooks and the docs.

Its own module because it makes files and never reads a request; `media.py` is what reads them when they are sent.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl


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
