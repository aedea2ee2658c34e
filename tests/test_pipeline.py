"""Steps that feed steps: a prompt reads another step's answer; a change upstream is reported stale downstream."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pydantic
import pytest

import llmledger
from llmledger import PromptError, Simulator, last_report

from .conftest import sql

EXTRACT = {"prompt": "Extract from: {text}", "output": {"company": str, "year": int}}
CLASSIFY = {"prompt": "Which industry is {extract.company} in?"}
SUMMARISE = {"prompt": "Write one line on {extract.company}, a company in {classify}."}


def frame(n: int) -> pl.DataFrame:
    """Rows whose every word is their own, so no two rows' answers (or downstream requests) coincide."""
    return pl.DataFrame(
        {"id": list(range(n)), "text": [f"acme{i} sells{i} widgets{i} in{i} town{i}" for i in range(n)]}
    )


def _stale(store: Path) -> dict[str, tuple[int, int]]:
    counts = llmledger.progress(store, "messages")
    return {r["step"]: (r["stale"], r["waiting"]) for r in counts.iter_rows(named=True)}


def test_a_redo_upstream_makes_exactly_those_rows_stale_downstream(run, sim: Simulator, store: Path, client) -> None:
    df = frame(20)
    out = llmledger.pipeline(
        df,
        {"extract": EXTRACT, "classify": CLASSIFY, "summarise": SUMMARISE},
        client=client,
        store=store,
        table="messages",
        progress=False,
    )
    assert sim.stats()["paid"] == 60
    assert out.columns == [
        "id",
        "text",
        "extract",
        "extract_status",
        "extract_stale",
        "classify",
        "classify_status",
        "classify_stale",
        "summarise",
        "summarise_status",
        "summarise_stale",
    ]
    assert out["classify"].to_list() == [
        f"Summary: Which industry is {c} in?" for c in out["extract"].struct.field("company")
    ]
    sent = {e["prompt"] for e in sim.log()}
    assert f"Write one line on {out['extract'][3]['company']}, a company in {out['classify'][3]}." in sent

    flagged = [1, 4, 9, 12, 17]
    llmledger.flag(store, "messages", "extract", where=f"id IN {tuple(flagged)}", reason="wrong company")
    redone = run(df, "extract", **EXTRACT, redo="flagged")
    assert sim.stats()["paid"] == 65
    report = last_report()
    assert report is not None and report.downstream_stale == {"classify": 5, "summarise": 5}
    assert "5 rows of step 'classify', 5 rows of step 'summarise'" in "\n".join(report.hints())
    changed = redone.filter(pl.col("extract").struct.field("company") != out["extract"].struct.field("company"))
    assert changed["id"].to_list() == flagged, "the simulator answers a repeated request differently"
    assert _stale(store) == {"extract": (0, 0), "classify": (5, 0), "summarise": (5, 0)}

    for step, options in (("classify", CLASSIFY), ("summarise", SUMMARISE)):
        run(df, step, **options)
        report = last_report()
        assert report is not None and (report.stale, report.calls) == (5, 0), f"{step}: reported, not re-paid"
    assert sim.stats()["paid"] == 65

    report = llmledger.resume(store, "messages", "summarise", redo="stale", client=client, progress=False)
    assert report.calls == 0 and report.stale == 0, "summarise waits while classify is stale"
    report = llmledger.resume(store, "messages", "classify", redo="stale", client=client, progress=False)
    assert report.calls == 5
    final = run(df, "summarise", **SUMMARISE, redo="stale")
    assert last_report().calls == 5  # type: ignore[union-attr]
    assert sim.stats()["paid"] == 75
    resent = sorted(
        int(p.split("town")[-1]) for p, n in sim.paid_prompts().items() if p.startswith("Extract") and n == 2
    )
    assert resent == flagged
    assert _stale(store) == {"extract": (0, 0), "classify": (0, 0), "summarise": (0, 0)}
    assert final.filter(pl.col("id").is_in(flagged))["summarise"].str.contains("take 2").all()

    llmledger.pipeline(
        df,
        {"extract": EXTRACT, "classify": CLASSIFY, "summarise": SUMMARISE},
        client=client,
        store=store,
        table="messages",
        progress=False,
    )
    assert sim.stats()["paid"] == 75, "a rerun of the whole pipeline pays nothing"


def test_rows_wait_until_the_step_they_read_is_done(run, sim: Simulator, store: Path) -> None:
    run(frame(4), "extract", **EXTRACT)
    out = run(frame(6), "classify", **CLASSIFY)
    report = last_report()
    assert report is not None and (report.calls, report.waiting) == (4, 2)
    assert out["classify_status"].to_list() == ["DONE"] * 4 + ["NOT_STARTED"] * 2
    assert _stale(store)["classify"] == (0, 2)
    run(frame(6), "extract", **EXTRACT)
    run(frame(6), "classify", **CLASSIFY)
    assert last_report().calls == 2 and sim.stats()["paid"] == 12  # type: ignore[union-attr]


def test_status_lists_steps_after_the_steps_they_read(run, store: Path) -> None:
    run(frame(3), "extract", **EXTRACT)
    run(frame(3), "summarise", prompt="Summarize: {text}")
    run(frame(3), "classify", **CLASSIFY)
    order = llmledger.progress(store)["step"].to_list()
    assert order.index("extract") < order.index("classify")
    printed = subprocess.run(
        [sys.executable, "-m", "llmledger", "status", str(store)], capture_output=True, text=True, check=True
    ).stdout
    steps = [line.split()[0] for line in printed.splitlines() if line.startswith("  ")]
    assert steps.index("extract") < steps.index("classify"), printed


def test_reading_a_field_a_step_does_not_have_is_refused(run, store: Path) -> None:
    run(frame(3), "extract", **EXTRACT)
    before = sql(store, "SELECT * FROM messages ORDER BY id")
    with pytest.raises(PromptError, match="no field 'compnay'"):
        run(frame(3), "classify", prompt="Industry of {extract.compnay}?")
    with pytest.raises(PromptError, match="format spec"):
        run(frame(3), "classify", prompt="Industry of {extract.company:>10}?")
    with pytest.raises(llmledger.InvalidInputError, match="order the steps"):
        llmledger.pipeline(frame(3), {"classify": CLASSIFY, "extract": EXTRACT}, store=store, table="messages")
    assert sql(store, "SELECT * FROM messages ORDER BY id") == before
    assert sql(store, "SELECT count(*) FROM llmledger_steps WHERE step = 'classify'") == [(0,)]


class Verdict(pydantic.BaseModel):
    is_spam: bool
    reason: str


class Checked(pydantic.BaseModel):
    verdict: Verdict | None


def test_a_typo_in_a_later_steps_field_is_found_before_any_step_runs(client, sim: Simulator, store: Path) -> None:
    """0.7 paid for step 1, then refused step 2's `{verdict.is_spma}`: every step's fields are checked first."""
    cases = [
        (
            {"verdict": {"prompt": "Spam? {text}", "output": Verdict}, "why": {"prompt": "Explain: {verdict.is_spma}"}},
            r"no field 'is_spma'.*Did you mean \{verdict.is_spam\}",
        ),
        (
            {
                "check": {"prompt": "Spam? {text}", "output": Checked},
                "why": {"prompt": "Explain: {check.verdict.reasn}"},
            },
            r"no field 'verdict.reasn'.*\{check.verdict.reason\}",
        ),
        (
            {"summary": {"prompt": "Sum: {text}"}, "why": {"prompt": "Explain: {summary.is_spam}"}},
            r"step 'summary' answers text, which has no fields",
        ),
    ]
    for steps, message in cases:
        with pytest.raises(PromptError, match=message):
            llmledger.pipeline(frame(3), steps, client=client, store=store, table="messages", progress=False)
    assert not store.exists() and sim.stats()["requests"] == 0
    out = llmledger.pipeline(
        frame(3),
        {"check": {"prompt": "Spam? {text}", "output": Checked}, "why": {"prompt": "Explain: {check.verdict.reason}"}},
        client=client,
        store=store,
        table="messages",
        progress=False,
    )
    assert out["why_status"].to_list() == ["DONE"] * 3


def test_a_pipeline_reports_each_step_and_the_total(client, sim: Simulator, store: Path) -> None:
    llmledger.pipeline(
        frame(4),
        {"extract": EXTRACT, "classify": CLASSIFY},
        client=client,
        store=store,
        table="messages",
        progress=False,
    )
    report = last_report()
    assert isinstance(report, llmledger.PipelineReport) and list(report.steps) == ["extract", "classify"]
    assert report.calls == sim.stats()["paid"] == 8
    table = report.frame()
    assert table["step"].to_list() == ["extract", "classify", "total"]
    assert table.filter(pl.col("step") == "total")["calls"].item() == 8
    assert str(report).startswith("pipeline of 2 steps: 8 calls paid")


def test_a_pipeline_checks_fields_of_steps_already_in_the_store_before_paying(
    run, client, sim: Simulator, store: Path
) -> None:
    run(frame(3), "extract", **EXTRACT)
    paid = sim.stats()["paid"]
    with pytest.raises(PromptError, match=r"no field 'compnay'.*Did you mean \{extract.company\}"):
        llmledger.pipeline(
            frame(3),
            {"summary": {"prompt": "Sum: {text}"}, "classify": {"prompt": "Industry of {extract.compnay}?"}},
            client=client,
            store=store,
            table="messages",
            progress=False,
        )
    assert sim.stats()["paid"] == paid, "step 1 was not paid for"
