"""Models as data: their lifecycles (a warning before a retiring model is paid for, a retired model's 404 said as
such), what the provider's API says of them (OpenAI's `GET /v1/models` `shutdown_date`, served by the simulator),
`llmledger.models()` and its CLI twin, and the current OpenAI generation billed as OpenAI bills it. Dates are set
on both sides (the simulator's `today`, llmledger's `current_day`), so no test changes its verdict with the
calendar, but the one about the examples, which is meant to."""

from __future__ import annotations

import functools
import re
import warnings
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest

import llmledger
from llmledger import ModelNotFound, ModelRetiringWarning, Simulator, apply_llm
from llmledger._step.models import WARN_DAYS, lifecycle_of
from llmledger.cli import main as cli

from .conftest import frame, sql

openai = pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Summarize: {text}"


def on_day(monkeypatch: pytest.MonkeyPatch, day: date) -> None:
    """llmledger reads lifecycles as on `day`."""
    monkeypatch.setattr("llmledger._step.models.current_day", lambda: day)


@pytest.fixture
def gpt(store: Path) -> Any:
    def ask(sim: Simulator, model: str, rows: int = 6, **options: Any) -> Any:
        client = openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="test-key")
        return apply_llm(frame(rows), "s", prompt=PROMPT, model=model, client=client, store=store, table="t",
                         progress=False, **options)  # fmt: skip

    return ask


def test_a_step_on_a_model_that_shuts_down_soon_warns_before_anything_is_paid(
    gpt: Any, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_day(monkeypatch, date(2026, 11, 28))
    with Simulator(today="2026-11-28") as sim:
        with warnings.catch_warnings():  # the warning raised as an error: what had happened by then stays
            warnings.simplefilter("error", ModelRetiringWarning)
            with pytest.raises(ModelRetiringWarning) as said:
                gpt(sim, "openai:gpt-5-mini")
        assert sim.stats()["requests"] == 0 and not store.exists()  # before anything was sent or written
        text = str(said.value)
        assert "2026-12-11" in text and "in 13 days" in text and "'openai:gpt-6.1-terra'" in text
        assert "developers.openai.com" in text  # where the fact was read
        with pytest.warns(ModelRetiringWarning, match="gpt-6.1-terra"):
            out = gpt(sim, "openai:gpt-5-mini")  # it still answers until its day
        assert out["s_status"].to_list() == ["DONE"] * 6
        with warnings.catch_warnings():
            warnings.simplefilter("error", ModelRetiringWarning)
            gpt(sim, "openai:gpt-6.1-terra")  # the replacement: no warning


def test_a_shutdown_the_api_announces_is_warned_about_before_llmledger_knows_it(
    gpt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI's GET /v1/models says each model's shutdown_date: read once per process and server, it warns about a
    date the price table does not have yet."""
    day = date(2027, 3, 1)
    on_day(monkeypatch, day)
    soon = (day + timedelta(days=20)).isoformat()
    with Simulator(today=day.isoformat(), shutdowns={"gpt-6-luna": soon}) as sim:
        assert lifecycle_of("gpt-6-luna").shutdown is None or lifecycle_of("gpt-6-luna").shutdown != date(2027, 3, 21)
        with pytest.warns(ModelRetiringWarning, match=f"shuts down on {soon}, in 20 days"):
            gpt(sim, "openai:gpt-6-luna")
        with pytest.warns(ModelRetiringWarning):
            gpt(sim, "openai:gpt-6-luna", rows=8)
        assert sim.stats()["model_lists"] == 1  # read once per process and server


def test_the_simulator_lists_openais_models_with_their_shutdown_dates(sim: Simulator) -> None:
    sim.configure(today="2026-11-28", shutdowns={"gpt-6.2-sol": "2027-06-01"})
    client = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="k")
    listed = {m.id: m.shutdown_date for m in client.models.list()}
    assert listed["gpt-5-mini"] == "2026-12-11" and listed["gpt-6.1-terra"] is None
    assert listed["gpt-6.2-sol"] == "2027-06-01"
    assert "gpt-4.1-nano" not in listed  # shut down: the API lists it no more
    assert "gpt-6-luna" in listed and "claude-haiku-5-5" not in listed  # OpenAI's models at OpenAI's route


def test_a_model_past_its_shutdown_stops_the_run_saying_it_was_retired_and_what_replaces_it(
    gpt: Any, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_day(monkeypatch, date(2026, 12, 12))
    with Simulator(today="2026-12-12") as sim:
        retired = r"'gpt-5-mini' was retired on 2026-12-11.*'gpt-6.1-terra'"
        with (
            pytest.warns(ModelRetiringWarning, match="was shut down on 2026-12-11"),
            pytest.raises(ModelNotFound, match=retired),
        ):
            gpt(sim, "openai:gpt-5-mini")
        assert sim.stats()["paid"] == 0
        assert sql(store, "SELECT count(*) FROM t WHERE s_status = 'FAILED'") == [(0,)]  # no row blamed
        claude = anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="k")
        with pytest.warns(ModelRetiringWarning), pytest.raises(ModelNotFound, match="'claude-sonnet-5-5'"):
            apply_llm(frame(3), "c", prompt=PROMPT, model="claude-sonnet-4-5", client=claude, store=store,
                      table="t", progress=False)  # fmt: skip


def test_a_lifecycle_is_its_own_providers_and_a_404_on_the_shutdown_day_says_retired() -> None:
    from llmledger._step.models import retired_note, retirement_notice

    day = date(2026, 11, 28)
    assert retirement_notice("gpt-5-mini", "openai", day) is not None
    assert retirement_notice("gpt-5-mini", "anthropic", day) is None  # another API's model of that name
    assert retirement_notice("claude-sonnet-4-5", "openai", day) is None
    assert retired_note("gpt-5-mini", date(2026, 12, 10)) is not None  # the API's day may be ahead of the user's
    assert retired_note("gpt-5-mini", date(2026, 12, 9)) is None


def test_models_lists_prices_support_and_lifecycles_and_the_cli_prints_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = llmledger.models(today=date(2026, 11, 28))
    rows = {r["model"]: r for r in table.iter_rows(named=True)}
    mini, terra = rows["openai:gpt-5-mini"], rows["openai:gpt-6.1-terra"]
    assert mini["status"] == "deprecated" and mini["shutdown"] == date(2026, 12, 11)
    assert mini["replacement"] == "gpt-6.1-terra" and mini["lifecycle_checked"]
    assert terra["status"] == "active" and terra["shutdown"] is None
    assert terra["batch"] == terra["flex"] == 0.5 and terra["long_prompt_above"] == 272_000
    assert terra["long_input"] == 2 * terra["input"] and terra["supports_batches"] and terra["supports_structured"]
    assert rows["openai:gpt-4.1-nano"]["status"] == "retired"
    assert rows["claude-haiku-5-5"]["provider"] == "anthropic" and rows["claude-haiku-5-5"]["flex"] is None
    assert set(llmledger.models(provider="openai")["provider"]) == {"openai"}
    with pytest.raises(llmledger.InvalidInputError, match="provider must be one of"):
        llmledger.models(provider="azure")
    assert cli(["models", "--provider", "openai"]) == 0
    out = capsys.readouterr().out
    assert "openai:gpt-6.1-terra" in out and "2026-12-11" in out and "claude" not in out


def test_the_current_openai_generation_is_billed_as_openai_bills_it() -> None:
    """Cache writes, the long-prompt tier (the whole request above 272K input tokens: 2x input and cache, 1.5x
    output), Batch and flex at half."""
    from llmledger._step.prices import price_of

    terra = price_of("gpt-6.1-terra")
    assert terra is not None
    short = terra.cost(input_tokens=1_000, output_tokens=100, cache_write_tokens=2_000, cache_read_tokens=3_000)
    assert short == pytest.approx((1_000 * 1.0 + 2_000 * 1.25 + 3_000 * 0.05 + 100 * 5.0) / 1e6)
    long = terra.cost(input_tokens=272_001, output_tokens=100)
    assert long == pytest.approx((272_001 * 2.0 + 100 * 7.5) / 1e6)
    assert terra.cost(input_tokens=1_000, output_tokens=100, flex=True) == pytest.approx(
        terra.cost(input_tokens=1_000, output_tokens=100, batch=True)
    )
    assert price_of("gpt-5-mini-2025-08-07") == price_of("gpt-5-mini")  # OpenAI answers with the dated snapshot


def test_a_flex_answer_is_billed_at_the_flex_rate(gpt: Any, store: Path) -> None:
    with Simulator() as sim:
        gpt(sim, "openai:gpt-6.1-terra", request_options={"service_tier": "flex"})
        flex = sql(store, "SELECT sum(s_cost_usd), sum(s_input_tokens), sum(s_output_tokens) FROM t")[0]
    price = llmledger.prices().filter(model="gpt-6.1-terra").row(0, named=True)
    assert flex[0] == pytest.approx(0.5 * (flex[1] * price["input"] + flex[2] * price["output"]) / 1e6)


# every model id an example could name: a provider prefix, or a bare Claude id
_MODEL_IDS = re.compile(r"\b(?:openai:)?((?:gpt|claude)-[a-z0-9][a-z0-9.-]*[a-z0-9]|o[1-4](?:-[a-z]+)?)\b")


@functools.cache
def _examples() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]


def test_the_examples_name_no_model_that_shuts_down_within_60_days_of_today() -> None:
    """README, docs and notebooks: a model they name must answer for at least 60 more days (today's real date: this
    test is meant to fail as a shutdown nears). Pages that are about lifecycles and upgrades may name retiring
    models in prose, not in a `model=`."""
    today, found = date.today(), []
    for path in _examples():
        text = path.read_text(encoding="utf-8")
        for line_no, line in enumerate(text.splitlines(), 1):
            for model in _MODEL_IDS.findall(line):
                shutdown = lifecycle_of(model).shutdown
                if shutdown is None or (shutdown - today).days > WARN_DAYS:
                    continue
                if "model=" in line or 'model\\"' in line or path.suffix == ".ipynb":
                    found.append(f"{path.relative_to(ROOT)}:{line_no}: {model} shuts down on {shutdown}")
    assert not found, "examples on retiring models:\n" + "\n".join(found)
