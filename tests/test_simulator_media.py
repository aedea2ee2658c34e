"""Images and documents through the simulator, driven with the real SDK: what it refuses with the API's
messages, what it bills (the vision and PDF docs' formulas, never the base64), answers that depend on the file,
prompt caching on message blocks, batches, and the PNG/PDF generators themselves."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from llmledger.simulator import Simulator, pdf, png, sample_documents

MODEL = "claude-sonnet-4-6"  # caches prefixes of 1,024 tokens and more
# A page is billed as its text plus an image of it: a letter page scaled to ~1,600 tokens is 962x1246 px.
PAGE_IMAGE = math.ceil(962 * 1246 / 750)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator() as s:
        yield s


@pytest.fixture
def client(sim: Simulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.base_url, api_key="sk-test", max_retries=0)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: bytes, media_type: str = "image/png", **extra: Any) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}, **extra}


def document(data: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": b64(data)},
        **extra,
    }


def text(said: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": said, **extra}


def ask(client: anthropic.Anthropic, *content: dict[str, Any], **options: Any) -> anthropic.types.Message:
    return client.messages.create(
        model=MODEL, max_tokens=200, messages=[{"role": "user", "content": list(content)}], **options
    )


def tokens(said: str) -> int:
    return math.ceil(len(said) / 4)  # the simulator's tokenizer: four characters a token


# -- billing ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("width", "height", "billed"),
    [
        (64, 48, math.ceil(64 * 48 / 750)),  # small: as it is
        (2000, 1000, math.ceil(1549 * 774 / 750)),  # scaled to ~1,600 tokens (1.2 megapixels)
        (3000, 500, math.ceil(1568 * 261 / 750)),  # scaled to a long edge of 1568 px
    ],
)
def test_an_image_is_billed_by_its_pixels_not_its_base64(
    client: anthropic.Anthropic, width: int, height: int, billed: int
) -> None:
    data = png(width, height, seed=1)
    answer = ask(client, image(data), text("Describe: the picture"))
    assert answer.usage.input_tokens == billed + tokens("Describe: the picture")
    assert answer.content[0].text.startswith("Summary: the picture (attached: image/png")


def test_a_pdf_is_billed_its_text_and_an_image_per_page(client: anthropic.Anthropic) -> None:
    pages = ["Invoice 7\nTotal: $10.00", "Page two says more"]
    answer = ask(client, document(pdf(pages)), text("Summarize:"))
    assert answer.usage.input_tokens == sum(tokens(p) + PAGE_IMAGE for p in pages) + tokens("Summarize:")
    assert "application/pdf 2 pages" in answer.content[0].text and "Total: $10.00" in answer.content[0].text


def test_a_text_document_is_billed_as_its_text(client: anthropic.Anthropic) -> None:
    body = "The quick brown fox. " * 40
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": body}}
    answer = ask(client, doc, text("Summarize:"))
    assert answer.usage.input_tokens == tokens(body + "Summarize:")


def test_an_image_alone_is_a_request_the_api_takes(client: anthropic.Anthropic, sim: Simulator) -> None:
    answer = ask(client, image(png(30, 20)))
    assert answer.usage.input_tokens == math.ceil(30 * 20 / 750) + 1  # the empty text costs the minimum token
    assert sim.stats()["paid"] == 1


def test_a_batch_with_an_image_is_billed_as_online(client: anthropic.Anthropic, sim: Simulator) -> None:
    content = [image(png(120, 90, seed=4)), text("Describe: it")]
    online = ask(client, *content)
    batch = client.messages.batches.create(
        requests=[
            {
                "custom_id": "a",
                "params": {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": content}]},
            },
            {
                "custom_id": "b",
                "params": {
                    "model": MODEL,
                    "max_tokens": 200,
                    "messages": [
                        {
                            "role": "user",
                            "content": [image(png(120, 90, seed=4), media_type="image/gif"), text("Describe: it")],
                        }
                    ],
                },
            },
        ]
    )
    for _ in range(100):
        if client.messages.batches.retrieve(batch.id).processing_status == "ended":
            break
        time.sleep(0.05)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert results["a"].type == "succeeded"
    assert results["a"].message.usage.input_tokens == online.usage.input_tokens == math.ceil(120 * 90 / 750) + 3
    assert results["a"].message.content[0].text == online.content[0].text
    assert results["b"].type == "errored"
    assert "Image does not match the provided media type image/gif" in results["b"].error.error.message
    assert sim.stats()["prompts"][f"[image/png 120x90 sha256:{_digest(png(120, 90, seed=4))}]\nDescribe: it"] == 2


# -- answers depend on the file ---------------------------------------------------------------------------------
def _digest(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()[:8]


def test_another_image_is_another_prompt_and_the_same_image_the_same(
    client: anthropic.Anthropic, sim: Simulator
) -> None:
    cat, dog = png(64, 48, seed=1), png(64, 48, seed=2)
    first, other, again = (ask(client, image(data), text("What is this? Answer: briefly")) for data in (cat, dog, cat))
    assert first.content[0].text != other.content[0].text
    assert first.content[0].text == again.content[0].text
    assert sim.stats()["prompts"] == {
        f"[image/png 64x48 sha256:{_digest(cat)}]\nWhat is this? Answer: briefly": 2,
        f"[image/png 64x48 sha256:{_digest(dog)}]\nWhat is this? Answer: briefly": 1,
    }
    assert sim.log()[0]["prompt"].startswith("[image/png 64x48 sha256:")


def test_a_pdf_marker_carries_its_pages_and_text(client: anthropic.Anthropic, sim: Simulator) -> None:
    data = pdf(["Vendor: Acme Corp\nTotal: $123.45", "x"])
    ask(client, document(data), text("Read:"))
    assert sim.log()[-1]["prompt"] == (
        f"[application/pdf 2 pages sha256:{_digest(data)}: Vendor: Acme Corp Total: $123.45 x]\nRead:"
    )


def test_structured_output_extracts_what_the_invoice_says(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["vendor", "total", "note"],
        "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}, "note": {"type": "string"}},
    }
    config = {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    answers = [
        json.loads(
            ask(
                client,
                document(pdf([f"INVOICE 1\nVendor: {vendor}\nTotal: ${total}"])),
                text("Extract the fields:"),
                extra_body=config,
            )
            .content[0]
            .text
        )
        for vendor, total in (("Acme Corp", "123.45"), ("Initech", "1,020.00"))
    ]
    assert [(a["vendor"], a["total"]) for a in answers] == [("Acme Corp", 123.45), ("Initech", 1020.0)]
    assert answers[0]["note"] != answers[1]["note"], "the other fields come from the file's words too"


# -- refusals ---------------------------------------------------------------------------------------------------
def _url(kind: str) -> dict[str, Any]:
    return {"type": kind, "source": {"type": "url", "url": "https://example.com/a.png"}}


REFUSED = [
    (
        [image(png(8, 8), "image/jpeg"), text("hi")],
        "messages.0.content.0.image.source.base64.data: Image does not match the provided media type image/jpeg",
    ),
    ([image(pdf(["not an image"])), text("hi")], "Image does not match the provided media type image/png"),
    (
        [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"}}, text("hi")],
        "messages.0.content.0.image.source.base64: invalid base64 data",
    ),
    (
        [image(png(8, 8), "image/bmp"), text("hi")],
        "media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'",
    ),
    (
        [text("hi"), image(png(10, 10) + b"\0" * (5 * 1024 * 1024))],
        f"messages.0.content.1.image.source.base64: image exceeds 5 MB maximum: {len(png(10, 10)) + 5 * 1024 * 1024} "
        "bytes > 5242880 bytes",
    ),
    ([image(png(8001, 2)), text("hi")], "At least one of the image dimensions exceed max allowed size: 8000 pixels"),
    ([_url("image"), text("hi")], "image.source.url: the llmledger simulator takes base64 sources only"),
    ([_url("document"), text("hi")], "document.source.url: the llmledger simulator takes base64 sources only"),
    (
        [document(b"<html>This version has been withdrawn</html>"), text("hi")],
        "messages.0.content.0.pdf.source.base64.data: The PDF specified was not valid.",
    ),
    ([document(pdf(["one"])[:-400]), text("hi")], "The PDF specified was not valid."),
    (
        [{"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": b64(b"x")}}, text("hi")],
        "document.source.base64.media_type: Input should be 'application/pdf'",
    ),
    (
        [document(pdf(["page"] * 101)), text("hi")],
        "messages.0.content.0.pdf.source.base64.data: A maximum of 100 PDF pages may be provided.",
    ),
    (
        [document(pdf(["page"] * 60)), document(pdf(["page"] * 41)), text("hi")],
        "messages.0.content.1.pdf.source.base64.data: A maximum of 100 PDF pages may be provided.",
    ),
    ([image(png(8, 8)), text("")], "messages: text content blocks must be non-empty"),
    ([{"type": "audio", "data": "x"}, text("hi")], "messages.0.content.0: Input tag 'audio' found using 'type'"),
    (
        [text("hi", cache_control={"type": "ephemeral", "ttl": "10m"})],
        "messages.0.content.0.cache_control: type must be 'ephemeral' and ttl '5m' or '1h'",
    ),
    (
        [text(f"part {i}", cache_control={"type": "ephemeral"}) for i in range(5)],
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    (
        [image(png(2001, 10))] + [image(png(8, 8))] * 20 + [text("hi")],
        "exceed max allowed size for many-image requests: 2000 pixels",
    ),
]


@pytest.mark.parametrize(("content", "says"), REFUSED, ids=[f"{n}" for n in range(len(REFUSED))])
def test_what_the_api_refuses_is_a_400_with_its_message(
    client: anthropic.Anthropic, sim: Simulator, content: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        ask(client, *content)
    assert info.value.status_code == 400
    assert says in info.value.body["error"]["message"]  # type: ignore[index]
    assert sim.stats()["paid"] == 0


def test_breakpoints_count_the_system_prompts_too(client: anthropic.Anthropic) -> None:
    system = [text(f"rule {i}", cache_control={"type": "ephemeral"}) for i in range(3)]
    ask(client, text("a", cache_control={"type": "ephemeral"}), system=system)  # 4: taken
    with pytest.raises(anthropic.BadRequestError, match="Found 5"):
        ask(
            client,
            text("a", cache_control={"type": "ephemeral"}),
            text("b", cache_control={"type": "ephemeral"}),
            system=system,
        )


def test_a_hundred_pages_are_taken(client: anthropic.Anthropic) -> None:
    answer = ask(client, document(pdf(["p"] * 100)), text("Count:"))
    assert answer.usage.input_tokens == 100 * (1 + PAGE_IMAGE) + tokens("Count:")


# -- prompt caching on message blocks ---------------------------------------------------------------------------
EXAMPLES = "Example: 'my order is late' -> shipping. " * 120  # about 1,260 tokens: over Sonnet's 1,024


def _usage(answer: anthropic.types.Message) -> tuple[int, int, int]:
    u = answer.usage
    return u.cache_creation_input_tokens or 0, u.cache_read_input_tokens or 0, u.input_tokens


def test_a_breakpoint_on_a_message_block_caches_the_prompt_up_to_it(client: anthropic.Anthropic) -> None:
    system = "You label support messages."
    few_shot = [{"role": "user", "content": "my parcel never came"}, {"role": "assistant", "content": "shipping"}]
    prefix = tokens(system + "my parcel never came" + "shipping" + EXAMPLES)

    def label(row: str, examples: str = EXAMPLES, role_of_shot: str = "assistant") -> tuple[int, int, int]:
        shots = [few_shot[0], {**few_shot[1], "role": role_of_shot}]
        return _usage(
            client.messages.create(
                model=MODEL,
                max_tokens=50,
                system=system,
                messages=[
                    *shots,
                    {
                        "role": "user",
                        "content": [text(examples, cache_control={"type": "ephemeral"}), text(f"Label: {row}")],
                    },
                ],
            )
        )

    first = label("the box was crushed")
    assert first[:2] == (prefix, 0), "the first request writes the prefix"
    assert (
        first[2]
        == tokens(system + "my parcel never came" + "shipping" + EXAMPLES + "Label: the box was crushed") - prefix
    )
    assert label("refund please")[:2] == (0, prefix), "the next one reads it"
    assert label("refund please", examples=EXAMPLES + "!")[0] > 0, "another prefix is written anew"
    assert label("refund please", role_of_shot="user")[0] == prefix, "roles are part of the prefix"


def test_a_cached_pdf_is_billed_its_pages_and_a_later_breakpoint_writes_only_its_part(
    client: anthropic.Anthropic,
) -> None:
    contract = pdf(["Clause 1: the supplier delivers.", "Clause 2: the buyer pays."])
    pdf_tokens = tokens("Clause 1: the supplier delivers.") + tokens("Clause 2: the buyer pays.") + 2 * PAGE_IMAGE

    def question(extra: str) -> tuple[int, int, int]:
        return _usage(
            ask(
                client,
                document(contract, cache_control={"type": "ephemeral"}),
                text(EXAMPLES + extra, cache_control={"type": "ephemeral", "ttl": "1h"}),
                text("Question: who pays?"),
            )
        )

    first = question("")
    assert first[:2] == (tokens(EXAMPLES) + pdf_tokens, 0)
    second = question(" (more)")
    assert second[:2] == (tokens(EXAMPLES + " (more)"), pdf_tokens), "the PDF is read, the new part written"


def test_system_caching_is_unchanged(client: anthropic.Anthropic) -> None:
    system = [text("Rules. " + EXAMPLES, cache_control={"type": "ephemeral"})]
    first = _usage(ask(client, text("Label: a"), system=system))
    second = _usage(ask(client, text("Label: b"), system=system))
    assert first[:2] == (tokens("Rules. " + EXAMPLES), 0) and second[:2] == (0, first[0])


# -- the generators ---------------------------------------------------------------------------------------------
def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at : at + 4]), data[at + 4 : at + 8]
        body, (crc,) = data[at + 8 : at + 8 + length], struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        at += 12 + length
    return chunks


def test_png_is_a_valid_png_that_depends_on_its_seed() -> None:
    data = png(37, 11, seed=5)
    chunks = _chunks(data)
    assert [kind for kind, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    assert struct.unpack(">IIBBBBB", chunks[0][1]) == (37, 11, 8, 2, 0, 0, 0)
    rows = zlib.decompress(chunks[1][1])
    assert len(rows) == 11 * (1 + 3 * 37) and all(rows[y * (1 + 3 * 37)] == 0 for y in range(11))
    assert png(37, 11, seed=5) == data and png(37, 11, seed=6) != data
    with pytest.raises(ValueError):
        png(0, 5)


def test_pdf_has_a_correct_xref_table() -> None:
    data = pdf(["Hello (world) \\ done", "Second page\nwith two lines"])
    assert data.startswith(b"%PDF-1.4") and data.rstrip().endswith(b"%%EOF")
    start = int(re.search(rb"startxref\s+(\d+)\s+%%EOF", data).group(1))  # type: ignore[union-attr]
    assert data[start : start + 4] == b"xref"
    count = int(re.match(rb"xref\s+0 (\d+)", data[start:]).group(1))  # type: ignore[union-attr]
    entries = re.findall(rb"(\d{10}) (\d{5}) ([nf]) ?\r?\n", data[start:])[:count]
    assert len(entries) == count == 8  # free entry, catalog, pages, font, two pages with a content stream each
    for number, (offset, _, used) in enumerate(entries[1:], 1):
        assert used == b"n" and data[int(offset) :].startswith(b"%d 0 obj" % number)
    assert re.search(rb"/Size %d\b" % count, data) and data.count(b"/Type /Page ") == 2
    assert b"(Hello \\(world\\) \\\\ done) Tj" in data
    for length, stream in re.findall(rb"/Length (\d+) >>\nstream\n(.*?)\nendstream", data, re.S):
        assert int(length) == len(stream)


def test_sample_documents_writes_invoices_and_receipts(tmp_path: Path) -> None:
    frame = sample_documents(tmp_path / "docs", 10, seed=3)
    assert frame.columns == ["id", "path", "kind"] and frame["id"].to_list() == list(range(1, 11))
    assert set(frame["kind"]) == {"invoice", "receipt"}
    for row in frame.iter_rows(named=True):
        data = Path(row["path"]).read_bytes()
        if row["kind"] == "invoice":
            assert data.startswith(b"%PDF-") and re.search(rb"\(Total: \$\d+\.\d\d\) Tj", data)
            assert re.search(rb"\(Vendor: [A-Za-z ]+\) Tj", data)
        else:
            assert _chunks(data)[0][0] == b"IHDR"
    again = sample_documents(tmp_path / "again", 10, seed=3)
    assert [Path(p).read_bytes() for p in again["path"]] == [Path(p).read_bytes() for p in frame["path"]]


def test_the_simulator_reads_the_key_from_a_bearer_token_too() -> None:
    """Newer SDKs send `Authorization: Bearer <key>`; a simulator told api_key= must accept that as the API does."""
    import httpx

    with Simulator(api_key="sk-right") as sim:
        body = {"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        ok = httpx.post(
            f"{sim.base_url}/v1/messages",
            json=body,
            headers={"Authorization": "Bearer sk-right", "anthropic-version": "2023-06-01"},
        )
        wrong = httpx.post(
            f"{sim.base_url}/v1/messages",
            json=body,
            headers={"Authorization": "Bearer sk-wrong", "anthropic-version": "2023-06-01"},
        )
    assert ok.status_code == 200 and wrong.status_code == 401
