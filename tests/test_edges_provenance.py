"""Where answers come from (issue 17): simulated answers are never served as real ones, and going back to an
earlier definition reuses the answers it had (from the history), never one a person rejected.

A "real endpoint" here is a client of Anthropic's own API (`https://api.anthropic.com`) whose requests the
simulator answers (`conftest.real_api_client`): to llmledger it is the real API.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import polars as pl
import pytest

import llmledger
from llmledger import Simulator, apply_llm, last_report
from llmledger._exec.client import answer_source
from llmledger._ledger import open_ledger

from .conftest import frame, real_api_client, subprocess_env

PROMPT_A = "Summarize: {text}"
PROMPT_B = "Describe: {text}"


@pytest.fixture(params=["duckdb", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url")
    return tmp_path / "ledger.duckdb"


@pytest.fixture
def real(sim: Simulator) -> anthropic.AsyncAnthropic:
    """A client of the real API, answered by the simulator."""
    return real_api_client(sim)


def _run(
    store: Any,
    client: anthropic.AsyncAnthropic,
    prompt: str = PROMPT_A,
    *,
    table: str = "messages",
    n: int = 4,
    **options: Any,
) -> pl.DataFrame:
    return apply_llm(
        frame(n), "summary", prompt=prompt, store=store, table=table, client=client, progress=False, **options
    )


def _rows(store: Any, query: str) -> list[tuple[Any, ...]]:
    found = open_ledger(store).query(query)
    assert found is not None
    return found.rows()


def test_answer_sources_say_simulator_or_the_endpoint_without_credentials(
    sim: Simulator, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert answer_source(client) == "simulator"
    proxy = anthropic.AsyncAnthropic(base_url="https://ana:secret@proxy.example.com:8443/anthropic/?key=k", api_key="x")
    assert answer_source(proxy) == "https://proxy.example.com:8443/anthropic"
    assert answer_source(anthropic.AsyncAnthropic(api_key="x")) == "https://api.anthropic.com"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.base_url)  # a subprocess or kernel pointed at the simulator
    assert answer_source(None) == "simulator"
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    assert answer_source(None) == "https://api.anthropic.com"
    session = llmledger.simulate()
    try:
        assert answer_source(None) == "simulator"
    finally:
        session.stop()


def test_a_real_run_asks_for_real_what_the_simulator_answered(any_store: Any, sim: Simulator, client, real) -> None:
    simulated = _run(any_store, client)
    sim.responder = lambda prompt, system: "real: " + prompt

    out = _run(any_store, real)
    report = last_report()
    assert report is not None and report.calls == 4, (
        "rows the simulator answered are not done for a run against a real endpoint"
    )
    assert report.unsimulated == 4
    assert "4 simulated answers set aside to ask for real" in str(report)
    assert any("simulated" in hint for hint in report.hints())
    assert out["summary"].to_list() == [f"real: Summarize: hello message number {i}" for i in range(4)]
    assert _rows(any_store, "SELECT DISTINCT summary_source FROM messages") == [("https://api.anthropic.com",)]
    kept = _rows(any_store, "SELECT output, reason, source FROM llmledger_history ORDER BY output")
    assert kept == [(text, "simulated answer", "simulator") for text in sorted(simulated["summary"].to_list())], (
        "the simulated answers are kept in the history, saying they were simulated"
    )

    _run(any_store, real)
    assert last_report().calls == 0, "real answers are done for the next real run"  # type: ignore[union-attr]
    again = _run(any_store, client)
    assert last_report().calls == 0, "a simulated run never replaces real answers"  # type: ignore[union-attr]
    assert again["summary"].to_list() == out["summary"].to_list()


def test_a_simulated_review_row_is_asked_for_real_too(tmp_path: Path, sim: Simulator, client, real) -> None:
    store = tmp_path / "s.duckdb"
    _run(store, client, validate=lambda row, output: "looks simulated" if row["id"] == 1 else None)
    assert _rows(store, "SELECT summary_status FROM messages WHERE id = 1") == [("NEEDS_REVIEW",)]
    out = _run(store, real)
    assert last_report().calls == 4  # type: ignore[union-attr]
    assert out["summary_status"].to_list() == ["DONE"] * 4


def test_store_wide_reuse_never_crosses_between_simulated_and_real(
    any_store: Any, sim: Simulator, client, real
) -> None:
    _run(any_store, client, table="a")
    sim.responder = lambda prompt, system: "real: " + prompt
    out = _run(any_store, real, table="b")
    report = last_report()
    assert report is not None and (report.calls, report.reused) == (4, 0), (
        "a new table of the store does not take simulated answers for a real run"
    )
    assert out["summary"].str.starts_with("real: ").all()

    _run(any_store, real, table="c")
    assert (last_report().calls, last_report().reused) == (0, 4), "real answers serve real runs"  # type: ignore
    sim.responder = lambda prompt, system: "simulated again: " + prompt
    simulated = _run(any_store, client, table="d")
    assert (last_report().calls, last_report().reused) == (0, 4)  # type: ignore[union-attr]
    assert not simulated["summary"].str.starts_with("real: ").any(), (
        "a simulated run reuses the simulator's answers (table a), not the real ones"
    )


def test_going_back_to_an_earlier_definition_reuses_its_answers(any_store: Any, sim: Simulator, client) -> None:
    first = _run(any_store, client, PROMPT_A)
    _run(any_store, client, PROMPT_B, redo="stale")
    assert sim.stats()["paid"] == 8
    sim.responder = lambda prompt, system: "new: " + prompt
    back = _run(any_store, client, PROMPT_A, redo="stale")
    report = last_report()
    assert report is not None and (report.calls, report.reused) == (0, 4), (
        "A -> B -> A: A's answers are in the history; nothing is paid for them again"
    )
    assert sim.stats()["paid"] == 8
    assert back["summary"].to_list() == first["summary"].to_list()
    assert back["summary_status"].to_list() == ["DONE"] * 4
    _run(any_store, client, PROMPT_A)
    assert last_report().calls == 0  # type: ignore[union-attr]


def test_answers_a_person_flagged_or_reset_are_not_reused(any_store: Any, sim: Simulator, client) -> None:
    first = _run(any_store, client, PROMPT_A)
    assert llmledger.flag(any_store, "messages", "summary", where="id = 0", reason="wrong") == 1
    assert llmledger.reset(any_store, "messages", "summary", where="id = 1") == 1
    _run(any_store, client, PROMPT_B, redo="stale")
    assert sim.stats()["paid"] == 8
    sim.responder = lambda prompt, system: "new: " + prompt
    back = _run(any_store, client, PROMPT_A, redo="stale")
    report = last_report()
    assert report is not None and (report.calls, report.reused) == (2, 2), (
        "rows 2 and 3 come back from the history; the flagged and the reset answer are asked again"
    )
    assert (
        back["summary"].to_list()
        == [f"new: Summarize: hello message number {i}" for i in (0, 1)] + first["summary"].to_list()[2:]
    )


def test_history_answers_are_reused_only_from_the_same_source(any_store: Any, sim: Simulator, client, real) -> None:
    _run(any_store, client, PROMPT_A)
    _run(any_store, client, PROMPT_B, redo="stale")
    sim.responder = lambda prompt, system: "real: " + prompt
    out = _run(any_store, real, PROMPT_A, redo="stale")
    report = last_report()
    assert report is not None and (report.calls, report.reused) == (4, 0), (
        "the simulated answers to A in the history do not stand in for a real run's"
    )
    assert out["summary"].str.starts_with("real: ").all()


def test_batch_answers_record_their_source_and_a_real_batch_run_re_asks_simulated_rows(
    tmp_path: Path, sim: Simulator, client, real
) -> None:
    store = tmp_path / "b.duckdb"
    _run(store, client, mode="batch")
    assert _rows(store, "SELECT DISTINCT summary_source FROM messages") == [("simulator",)]
    sim.responder = lambda prompt, system: "real: " + prompt
    out = _run(store, real, mode="batch")
    assert last_report().unsimulated == 4  # type: ignore[union-attr]
    assert out["summary"].str.starts_with("real: ").all()
    assert _rows(store, "SELECT DISTINCT summary_source FROM messages") == [("https://api.anthropic.com",)]


def test_a_simulated_batch_is_never_merged_as_real_nor_joined_by_real_rows(
    any_store: Any, sim: Simulator, client: anthropic.AsyncAnthropic
) -> None:
    """A simulated batch left processing (wait=False), then a batch run against the API on the same rows and their
    twins: the API run merged the simulated batch, stamped its answers with the API's endpoint and joined the twins
    to it, so a later run served simulated answers as real (and, against another server, the rows stayed SUBMITTED
    for good). Each batch records where it was sent: the API run gives the simulated one up and asks the API."""
    sim.configure(batch_delay=1.0)
    with Simulator(batch_delay=1.0) as api:
        api.responder = lambda prompt, system: "REAL " + prompt
        real = real_api_client(api)
        _run(any_store, client, n=3, mode="batch", wait=False)
        twins = pl.DataFrame({"id": range(6), "text": [f"hello message number {i % 3}" for i in range(6)]})
        out = apply_llm(
            twins,
            "summary",
            prompt=PROMPT_A,
            store=any_store,
            table="messages",
            client=real,
            progress=False,
            mode="batch",
        )
        assert out["summary_status"].to_list() == ["DONE"] * 6
        assert all(a.startswith("REAL ") for a in out["summary"].to_list()), out["summary"].to_list()
        assert api.stats()["batch_paid"] == 3, "three distinct requests, asked of the API once each"
        assert _rows(any_store, "SELECT DISTINCT summary_source FROM messages") == [("https://api.anthropic.com",)]
        notes = _rows(any_store, "SELECT state, source FROM llmledger_batches ORDER BY created_at")
        assert notes == [("abandoned", "simulator"), ("merged", "https://api.anthropic.com")]
        again = apply_llm(
            twins, "summary", prompt=PROMPT_A, store=any_store, table="messages", client=real, progress=False
        )
        assert again["summary"].to_list() == out["summary"].to_list() and last_report().calls == 0  # type: ignore[union-attr]


def test_a_simulated_batch_left_in_a_kernel_that_is_gone_is_asked_again_not_left_waiting(store: Path) -> None:
    """`mode="batch", wait=False` under simulate(), then a new kernel: its simulator has no such batch, and 0.7 said
    "the API has no batch" and then "still processing... run again to collect", the rows SUBMITTED for good. The
    batch ended with its simulator; the rows are asked again of the new one, saying so once."""
    script = (
        "import sys, polars as pl, llmledger\n"
        "llmledger.simulate(batch_delay=30)\n"
        "df = pl.DataFrame({'id': range(4), 'text': [f'hello {i}' for i in range(4)]})\n"
        "llmledger.apply_llm(df, 's', prompt='{text}', store=sys.argv[1], table='t', mode='batch', wait=False,"
        " progress=False)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(store)], check=True, env=subprocess_env("http://127.0.0.1:9"))
    assert _rows(store, "SELECT DISTINCT s_status FROM t") == [("SUBMITTED",)]
    with Simulator() as new_kernel:
        client = anthropic.AsyncAnthropic(base_url=new_kernel.base_url, api_key="k")
        out = apply_llm(
            pl.DataFrame({"id": range(4), "text": [f"hello {i}" for i in range(4)]}),
            "s",
            prompt="{text}",
            store=store,
            table="t",
            client=client,
            progress=False,
            mode="batch",
        )
        assert out["s_status"].to_list() == ["DONE"] * 4
        report = last_report()
        notes = "\n".join(report.hints())  # type: ignore[union-attr]
        assert "ended with the simulator that held it" in notes and "has no batch" not in notes, notes
