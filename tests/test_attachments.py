"""Files attached to rows (attach=): sent as the API takes them, recorded and fingerprinted by content."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import PromptError, apply_llm, estimate, resume
from llmledger._step.request import canonical_json, md5_uuid
from llmledger.simulator import pdf, png

from .conftest import sql


def files(folder: Path, n: int) -> pl.DataFrame:
    """n files: even rows a PNG, odd rows a one-page PDF, each different."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / (f"scan{i}.png" if i % 2 == 0 else f"invoice{i}.pdf")
        path.write_bytes(png(16 + i, 12, seed=i) if i % 2 == 0 else pdf([f"Invoice {i}. Total: ${i}0.00"]))
        paths.append(str(path))
    return pl.DataFrame({"id": list(range(n)), "path": paths, "question": ["What is this?"] * n})


def sent_files(sim: Any) -> list[bytes]:
    """The bytes of every file the simulator was sent, request by request."""
    out = []
    for entry in sim.log():
        for block in entry["body"]["messages"][-1]["content"]:
            if isinstance(block, dict) and block.get("type") in ("image", "document"):
                out.append(base64.b64decode(block["source"]["data"]))
    return out


def test_files_are_sent_as_content_blocks_and_recorded_by_their_hash(
    run: Any, sim: Any, tmp_path: Path, store: Path
) -> None:
    df = files(tmp_path / "in", 4)
    out = run(df, "what", prompt="{question}", attach="path")
    assert out["what_status"].to_list() == ["DONE"] * 4
    contents = [Path(p).read_bytes() for p in df["path"]]
    assert sorted(sent_files(sim)) == sorted(contents), "each row's file, byte for byte"
    kinds = [b["type"] for e in sim.log() for b in e["body"]["messages"][-1]["content"]]
    assert kinds.count("image") == 2 and kinds.count("document") == 2 and kinds.count("text") == 4
    # the ledger holds each file's hash, never its bytes, and the fingerprint is of the request naming that hash
    for i, stored, fp in sql(store, "SELECT id, what_prompt, what_request_fingerprint::VARCHAR FROM messages"):
        blocks = json.loads(stored)
        assert blocks[0]["source"]["data"] == "sha256:" + hashlib.sha256(contents[i]).hexdigest()
        assert blocks[-1] == {"type": "text", "text": "What is this?"}
        body = {"model": llmledger.DEFAULT_MODEL, "max_tokens": 1024, "messages": [{"role": "user", "content": blocks}]}
        assert fp == md5_uuid(canonical_json(body))
    assert not any(
        base64.b64encode(c[:30]).decode()[:20] in str(sql(store, "SELECT * FROM messages")) for c in contents
    )


def test_the_same_content_never_pays_twice_whatever_its_path_and_a_changed_file_is_stale(
    run: Any, sim: Any, tmp_path: Path
) -> None:
    df = files(tmp_path / "in", 4)
    run(df, "what", prompt="{question}", attach="path")
    assert sim.stats()["paid"] == 4
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "in", moved)
    shutil.rmtree(tmp_path / "in")
    df = df.with_columns(pl.col("path").str.replace(str(tmp_path / "in"), str(moved), literal=True))
    out = run(df, "what", prompt="{question}", attach="path")
    assert sim.stats()["paid"] == 4 and not out["what_stale"].any(), "same files elsewhere: nothing to pay"

    changed = png(40, 40, seed=99)
    Path(df["path"][2]).write_bytes(changed)
    with pytest.warns(llmledger.StaleAnswersWarning, match="1 DONE row is stale"):
        out = run(df, "what", prompt="{question}", attach="path")
    assert out["what_stale"].to_list() == [False, False, True, False] and sim.stats()["paid"] == 4
    out = run(df, "what", prompt="{question}", attach="path", redo="stale")
    assert sim.stats()["paid"] == 5 and not out["what_stale"].any()
    assert sent_files(sim)[-1] == changed, "the redo sent the file as it is now"


def test_a_file_changed_after_it_was_recorded_is_never_sent_under_the_old_request(
    client: Any, sim: Any, tmp_path: Path, store: Path
) -> None:
    df = files(tmp_path / "in", 4)
    sim.configure(poison="What is this?")  # every request refused: the rows stay FAILED with their requests
    apply_llm(
        df,
        "what",
        prompt="{question}",
        attach="path",
        client=client,
        store=store,
        table="t",
        progress=False,
        max_attempts=5,
    )
    Path(df["path"][0]).write_bytes(png(8, 8, seed=7))  # changed behind the ledger's back
    sim.configure(poison=None)
    sim.reset_stats()
    for _ in range(3):  # as often as a user retries `llmledger run`: nothing is sent, no attempt is used up
        report = resume(store, "t", "what", client=client, progress=False, max_attempts=5)
        assert sim.stats()["paid"] == 3 and png(8, 8, seed=7) not in sent_files(sim)
        assert any("not sent" in e and "holds other content now" in e for e in report.errors), report.errors
        assert "1 not sent (their files are not as recorded)" in str(report)
        assert "Run apply_llm again with the frame" in "\n".join(report.hints())
    ((status, attempts),) = sql(store, "SELECT what_status, what_attempts FROM t WHERE id = 0")
    assert status == "FAILED" and attempts == 1, "given back as it was (its one refused attempt)"
    out = apply_llm(
        df,
        "what",
        prompt="{question}",
        attach="path",
        client=client,
        store=store,
        table="t",
        progress=False,
        max_attempts=5,
    )  # records the file as it is now, and sends it
    assert out["what_status"].to_list() == ["DONE"] * 4 and sent_files(sim)[-1] == png(8, 8, seed=7)


def test_a_bytes_column_is_sent_but_not_kept_in_the_ledger(client: Any, sim: Any, store: Path) -> None:
    images = [png(10 + i, 10, seed=i) for i in range(3)]
    df = pl.DataFrame({"id": [1, 2, 3], "image": images, "note": ["a", "b", "c"]})
    out = apply_llm(
        df, "caption", prompt="Caption ({note})", attach="image", client=client, store=store, table="t", progress=False
    )
    assert out["caption_status"].to_list() == ["DONE"] * 3 and sorted(sent_files(sim)) == sorted(images)
    columns = [c for (c,) in sql(store, "SELECT column_name FROM (DESCRIBE t)")]
    assert "image" not in columns and "note" in columns
    # a run from the store alone cannot send them: each row fails saying how to finish it, and nothing is sent
    with pytest.warns(llmledger.StaleAnswersWarning):  # records the new requests; stale rows are not re-sent
        apply_llm(
            df.with_columns(note=pl.lit("d")),
            "caption",
            prompt="Caption ({note})",
            attach="image",
            client=client,
            store=store,
            table="t",
            progress=False,
        )
    report = resume(store, "t", "caption", client=client, progress=False, redo="stale")
    assert sim.stats()["paid"] == 3 and report.calls == 0
    assert report.errors and all("came as bytes in the frame" in e for e in report.errors), report.errors
    assert sql(store, "SELECT DISTINCT caption_status FROM t") == [("DONE",)], "the rows keep their answers"


def test_a_worker_stops_for_files_that_came_as_bytes_instead_of_waiting_for_ever(
    client: Any, sim: Any, store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found in a trial: a worker waited for ever, idle, for rows whose files came as bytes. No later pass from the
    store can send those (the ledger keeps no bytes), so it says why and returns, paying nothing."""
    import threading

    df = pl.DataFrame({"id": [1, 2], "image": [png(12, 12, seed=1), png(14, 14, seed=2)], "note": ["a", "b"]})
    apply_llm(df, "caption", prompt="Caption ({note})", attach="image", client=client, store=store, table="t",
              where="false", progress=False)  # fmt: skip
    result: list[Any] = []
    worker = threading.Thread(
        target=lambda: result.append(llmledger.work(store, "t", "caption", client=client, progress=False, poll=0.1)),
        daemon=True,
    )
    with caplog.at_level("WARNING", logger="llmledger"):
        worker.start()
        worker.join(60)
    assert not worker.is_alive(), "the worker still waits for files only the frame holds"
    assert result[0].calls == 0 and sim.stats()["paid"] == 0
    said = [r.getMessage() for r in caplog.records if "cannot be sent" in r.getMessage()]
    assert len(said) == 1 and "apply_llm on that frame" in said[0], said
    assert sql(store, "SELECT DISTINCT caption_status FROM t") == [("NOT_STARTED",)]


def test_two_rows_with_the_same_file_and_text_share_one_call(run: Any, sim: Any, tmp_path: Path) -> None:
    path = tmp_path / "same.png"
    path.write_bytes(png(12, 12))
    copy = tmp_path / "copy.png"
    copy.write_bytes(png(12, 12))
    df = pl.DataFrame({"id": [1, 2, 3], "path": [str(path), str(copy), str(path)]})
    out = run(df, "what", prompt="Describe it", attach="path")
    assert out["what_status"].to_list() == ["DONE"] * 3 and sim.stats()["paid"] == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        ("missing.png", "cannot be read"),
        ("notes.txt", "is not a PNG, JPEG, GIF or WebP image or a PDF"),
    ],
)
def test_a_file_that_cannot_be_sent_is_refused_before_anything_is_written(
    run: Any, sim: Any, tmp_path: Path, store: Path, bad: str, message: str
) -> None:
    (tmp_path / "notes.txt").write_text("plain text")
    good = tmp_path / "ok.png"
    good.write_bytes(png(4, 4))
    df = pl.DataFrame({"id": [1, 2], "path": [str(good), str(tmp_path / bad)]})
    with pytest.raises(PromptError, match=message) as caught:
        run(df, "what", prompt="Describe it", attach="path")
    assert "key {'id': 2}" in str(caught.value) and bad in str(caught.value)
    assert not store.exists() and sim.stats()["requests"] == 0


@pytest.mark.parametrize(
    "attach, message",
    [
        ("nope", "attach names column 'nope'"),
        ("id", "attach column 'id' is Int64"),
        (["path", "path"], "names a column twice"),
        (3, "attach must name a column"),
    ],
)
def test_attach_names_columns_of_paths_urls_or_bytes(
    run: Any, tmp_path: Path, store: Path, attach: Any, message: str
) -> None:
    df = pl.DataFrame({"id": [1], "path": [str(tmp_path / "x.png")]})
    with pytest.raises(PromptError, match=message):
        run(df, "what", prompt="Describe it", attach=attach)
    assert not store.exists()


def test_files_go_through_message_batches_too(run: Any, sim: Any, tmp_path: Path) -> None:
    df = files(tmp_path / "in", 4)
    out = run(df, "what", prompt="{question}", attach="path", mode="batch")
    assert out["what_status"].to_list() == ["DONE"] * 4 and sim.stats()["batch_paid"] == 4
    assert run(df, "what", prompt="{question}", attach="path", mode="batch") is not None
    assert sim.stats()["batch_paid"] == 4


def test_estimate_counts_the_files(client: Any, tmp_path: Path, store: Path) -> None:
    path = tmp_path / "big.png"
    path.write_bytes(png(1000, 750))
    df = pl.DataFrame({"id": [1], "path": [str(path)]})
    with_file = estimate(df, "what", prompt="Describe it", attach="path", store=store, client=client)
    without = estimate(df, "what", prompt="Describe it", store=store, client=client)
    assert with_file["input_tokens"][0] - without["input_tokens"][0] == 1000, "1000 x 750 px / 750 per token"


def test_attachments_on_postgresql(client: Any, sim: Any, tmp_path: Path, pg_url: str) -> None:
    df = files(tmp_path / "in", 4)
    out = apply_llm(
        df, "what", prompt="{question}", attach="path", client=client, store=pg_url, table="t", progress=False
    )
    assert out["what_status"].to_list() == ["DONE"] * 4 and sim.stats()["paid"] == 4
    apply_llm(df, "what", prompt="{question}", attach="path", client=client, store=pg_url, table="t", progress=False)
    assert sim.stats()["paid"] == 4
    fps = llmledger.sql(pg_url, "SELECT what_prompt, what_request_fingerprint::text AS fp FROM t")
    assert fps is not None
    for stored, fp in fps.iter_rows():
        body = {
            "model": llmledger.DEFAULT_MODEL,
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": json.loads(stored)}],
        }
        assert fp == md5_uuid(canonical_json(body)), "PostgreSQL computes the same fingerprint as DuckDB"


def test_a_column_of_pathlib_paths_is_kept_as_text_so_a_resume_finds_the_files(
    client: Any, sim: Any, tmp_path: Path, store: Path
) -> None:
    df = files(tmp_path / "in", 2)
    df = df.with_columns(pl.Series("path", [Path(p) for p in df["path"]], dtype=pl.Object))
    sim.configure(poison="What is this?")
    apply_llm(df, "what", prompt="{question}", attach="path", client=client, store=store, table="t", progress=False)
    sim.configure(poison=None)
    assert resume(store, "t", "what", client=client, progress=False).done == 2
    assert sql(store, "SELECT typeof(path) FROM t LIMIT 1") == [("VARCHAR",)]


def test_urls_are_fetched_and_recorded_by_content(run: Any, sim: Any, tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    df = files(tmp_path / "in", 2)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "in"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        urls = df.with_columns(pl.col("path").str.replace(r"^.*/", base + "/"))
        out = run(urls, "what", prompt="{question}", attach="path")
        assert out["what_status"].to_list() == ["DONE"] * 2
        assert sorted(sent_files(sim)) == sorted(Path(p).read_bytes() for p in df["path"])
        out = run(df, "what", prompt="{question}", attach="path")  # the same files as paths: the same requests
        assert sim.stats()["paid"] == 2 and not out["what_stale"].any()
        missing = urls.with_columns(pl.col("path") + ".gone")
        with pytest.raises(PromptError, match="cannot be read: HTTPError"):
            run(missing, "what", prompt="{question}", attach="path")
    finally:
        server.shutdown()


def test_a_rewrite_that_keeps_size_and_mtime_is_still_seen(run: Any, sim: Any, tmp_path: Path) -> None:
    """Hashes are remembered by path, inode, size, mtime and ctime: putting the mtime back does not hide a change."""
    import os

    path = tmp_path / "f.png"
    path.write_bytes(png(10, 10, seed=1))
    df = pl.DataFrame({"id": [1], "path": [str(path)]})
    run(df, "what", prompt="Describe it", attach="path")
    st = path.stat()
    path.write_bytes(png(10, 10, seed=2))  # the same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.warns(llmledger.StaleAnswersWarning):
        out = run(df, "what", prompt="Describe it", attach="path")
    assert out["what_stale"].to_list() == [True]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: p.write_bytes(b"%PDF-1.4 but never ended"), "is not a PNG"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n"), "its size cannot be read"),
        (lambda p: p.write_bytes(png(8001, 1)), "at most 8000 px a side"),
        (lambda p: p.write_bytes(b"x" * (33 * 2**20)), "33.0 MB"),
    ],
)
def test_files_the_api_would_refuse_are_refused_up_front(
    run: Any, sim: Any, tmp_path: Path, store: Path, make: Any, message: str
) -> None:
    path = tmp_path / "bad.png"
    make(path)
    with pytest.raises(PromptError, match=message):
        run(pl.DataFrame({"id": [1], "path": [str(path)]}), "what", prompt="Describe it", attach="path")
    assert not store.exists() and sim.stats()["requests"] == 0


def test_rows_sharing_a_file_are_sent_from_whichever_copy_still_holds_it(
    client: Any, sim: Any, tmp_path: Path, store: Path
) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(png(9, 9))
    b.write_bytes(png(9, 9))
    df = pl.DataFrame({"id": [1, 2], "path": [str(a), str(b)]})
    apply_llm(
        df,
        "what",
        prompt="Describe it",
        attach="path",
        client=client,
        store=store,
        table="t",
        progress=False,
        where="id < 0",
    )  # recorded, not sent
    a.write_bytes(png(7, 7))
    report = resume(store, "t", "what", client=client, progress=False, mode="batch")
    assert report.done == 2 and sim.stats()["batch_paid"] == 1 and sent_files(sim) == []
    assert sql(store, "SELECT DISTINCT what_status FROM t") == [("DONE",)]


def test_paths_in_pandas_and_mixed_columns_are_kept_as_text(client: Any, sim: Any, tmp_path: Path, store: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = files(tmp_path / "in", 2)
    frame = pd.DataFrame({"id": [0, 1], "path": [Path(df["path"][0]), df["path"][1]]})  # a Path and a str
    out = apply_llm(
        frame, "what", prompt="Describe it", attach="path", client=client, store=store, table="t", progress=False
    )
    assert list(out["what_status"]) == ["DONE", "DONE"]
    mixed = pl.DataFrame({"id": [0, 1], "path": pl.Series([Path(df["path"][0]), df["path"][1]], dtype=pl.Object)})
    apply_llm(mixed, "what", prompt="Describe it", attach="path", client=client, store=store, table="u", progress=False)
    assert sql(store, "SELECT path FROM u ORDER BY id") == [(p,) for p in df["path"]], "kept, so resume finds them"


def test_skip_nulls_leaves_rows_without_a_file_unsent(run: Any, sim: Any, tmp_path: Path) -> None:
    df = files(tmp_path / "in", 2).with_columns(
        pl.when(pl.col("id") == 1).then(None).otherwise(pl.col("path")).alias("path")
    )
    out = run(df, "what", prompt="{question}", attach="path", skip_nulls=True)
    assert out["what_status"].to_list() == ["DONE", "NOT_STARTED"] and sim.stats()["paid"] == 1


def test_a_file_swapped_for_a_fifo_after_it_was_recorded_is_given_back_not_waited_on(
    client: Any, sim: Any, tmp_path: Path, store: Path
) -> None:
    df = files(tmp_path / "in", 2)
    apply_llm(
        df,
        "what",
        prompt="{question}",
        attach="path",
        client=client,
        store=store,
        table="t",
        progress=False,
        where="id < 0",
    )  # recorded, not sent
    Path(df["path"][0]).unlink()
    os.mkfifo(df["path"][0])
    report = resume(store, "t", "what", client=client, progress=False)
    assert report.done == 1 and report.unsent == 1 and "no longer a regular file" in report.unsent_why
    assert sql(store, "SELECT what_status, what_attempts FROM t ORDER BY id") == [("NOT_STARTED", 0), ("DONE", 1)]


def _webp(chunk: bytes, payload: bytes) -> bytes:
    body = b"WEBP" + chunk + len(payload).to_bytes(4, "little") + payload
    return b"RIFF" + len(body).to_bytes(4, "little") + body


@pytest.mark.parametrize(
    "data, size",
    [
        (
            _webp(b"VP8 ", b"\x00" * 3 + b"\x9d\x01\x2a" + (640).to_bytes(2, "little") + (480).to_bytes(2, "little")),
            (640, 480),
        ),
        (_webp(b"VP8L", b"\x2f" + ((300 - 1) | ((200 - 1) << 14)).to_bytes(4, "little")), (300, 200)),
    ],
)
def test_plain_webp_files_are_read_with_their_size(data: bytes, size: tuple[int, int]) -> None:
    from llmledger._step.attach import blob_of, image_size, image_tokens

    assert image_size(data, "image/webp") == size
    assert blob_of(data, "x").tokens == image_tokens(*size)


def test_a_cut_off_png_is_refused_up_front(run: Any, sim: Any, tmp_path: Path, store: Path) -> None:
    path = tmp_path / "cut.png"
    path.write_bytes(png(40, 40)[:60])
    with pytest.raises(PromptError, match="damaged or cut-off"):
        run(pl.DataFrame({"id": [1], "path": [str(path)]}), "what", prompt="Describe it", attach="path")
    assert not store.exists()


def test_bytes_are_hashed_once_per_call_and_bad_bytes_are_refused_up_front(
    client: Any, sim: Any, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmledger._step.attach as attach

    hashed = []
    real = attach.blob_of
    monkeypatch.setattr(attach, "blob_of", lambda data, what: hashed.append(what) or real(data, what))
    df = pl.DataFrame({"id": [1, 2, 3], "image": [png(5 + i, 5, seed=i) for i in range(3)]})
    apply_llm(df, "caption", prompt="Caption", attach="image", client=client, store=store, table="t", progress=False)
    assert len(hashed) == 3, hashed
    bad = pl.DataFrame({"id": [1], "image": [b"plain text, not an image"]})
    with pytest.raises(PromptError, match="is not a PNG"):
        apply_llm(
            bad, "caption", prompt="Caption", attach="image", client=client, store=store, table="u", progress=False
        )
    assert sql(store, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'u'") == [(0,)]


def test_a_column_of_paths_may_be_the_key_too(run: Any, sim: Any, tmp_path: Path) -> None:
    df = files(tmp_path / "in", 2).select("path")
    out = run(df, "what", prompt="Describe it", attach="path", key="path")
    assert out["what_status"].to_list() == ["DONE", "DONE"] and sim.stats()["paid"] == 2


def test_a_worker_in_another_folder_finds_relative_paths_and_waits_for_missing_files(
    run: Any, sim: Any, tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in a trial: files attached by a relative path, and a worker started in another folder (as on another
    machine), re-ran the same pass without end at 100 % of a core, saying nothing with --quiet. The ledger now keeps
    each path absolute (from the folder of the call that recorded it), and a worker whose rows cannot be sent says
    why once and waits for them, then sends them once their files are back."""
    import subprocess
    import sys
    import threading
    import time

    from .conftest import subprocess_env

    monkeypatch.chdir(tmp_path)
    df = files(tmp_path / "in", 4).with_columns(pl.col("path").str.replace(str(tmp_path) + "/", "", literal=True))
    assert df["path"].to_list()[0] == "in/scan0.png"  # relative to the folder of the call
    run(df, "what", prompt="{question}", attach="path", where="false")  # recorded, nothing sent
    assert sorted(r[0] for r in sql(store, "SELECT path FROM messages")) == sorted(
        str(tmp_path / p) for p in df["path"]
    ), "the ledger keeps the paths absolute"
    (tmp_path / "in" / "invoice1.pdf").rename(tmp_path / "away.pdf")  # one file is missing for now
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = subprocess.Popen(
        [sys.executable, "-m", "llmledger", "worker", str(store), "--table", "messages", "--step", "what", "--poll",
         "0.5", "--quiet"],
        cwd=elsewhere, env=subprocess_env(sim.base_url) | {"ANTHROPIC_API_KEY": "test-key"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(worker.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("cannot be sent" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)  # the file goes back only once the worker has said why it waits (on a loaded machine
            # its second look may come later than any fixed sleep)
        assert sim.stats()["paid"] == 3, "the three files found were sent from the other folder"
        time.sleep(2.0)  # the worker waits for the fourth: idle, not spinning
        assert worker.poll() is None, "a worker waits for rows it cannot send yet"
        (tmp_path / "away.pdf").rename(tmp_path / "in" / "invoice1.pdf")
        worker.wait(timeout=60)
        reader.join(timeout=10)
        output = "".join(lines)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0 and sim.stats()["paid"] == 4
    assert output.count("cannot be sent") == 1 and "invoice1.pdf" in output, output
    assert sql(store, "SELECT count(*) FROM messages WHERE what_status = 'DONE'") == [(4,)]
    runs = sql(store, "SELECT count(*) FROM llmledger_runs WHERE step = 'what'")[0][0]
    assert runs < 20, f"{runs} passes: the worker looked again every poll, not without end"
