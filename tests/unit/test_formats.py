"""The PDF reader the review view runs on a user's own files: a hostile file costs no memory and raises nothing
(an attack found a 64-byte PDF saying /Count 30000000 took 460 MB, a 5,000-digit number raised ValueError, and a
small stream inflated without bound)."""

from __future__ import annotations

import zlib

from llmledger._step.formats import pdf_pages
from llmledger.simulator.samples import pdf


def test_a_real_pdf_reads_page_by_page() -> None:
    assert pdf_pages(pdf(["first page", "second"])) == ["first page", "second"]


def test_a_page_count_no_pdf_has_is_not_believed() -> None:
    tiny = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 30000000 >> endobj\n%%EOF"
    assert pdf_pages(tiny) is None


def test_numbers_too_long_for_int_are_skipped_not_raised() -> None:
    long = b"%PDF-1.4\n" + b"9" * 5000 + b" 0 obj << /Type /Pages /Count " + b"7" * 5000 + b" >> endobj\n%%EOF"
    assert pdf_pages(long) is None


def test_a_stream_inflates_at_most_so_far() -> None:
    packer, chunk = zlib.compressobj(9), b"\0" * 1_000_000
    bomb = b"".join(packer.compress(chunk) for _ in range(200)) + packer.flush()  # 200 MB inflated, 200 kB here
    head = b"1 0 obj << /Type /Page /Contents 2 0 R >> endobj\n2 0 obj << /Length %d /Filter /FlateDecode >>" % len(
        bomb
    )
    raw = b"%PDF-1.4\n" + head + b"\nstream\n" + bomb + b"\nendstream endobj\n%%EOF"
    assert pdf_pages(raw) == [""]
