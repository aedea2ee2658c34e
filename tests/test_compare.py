"""`llmledger.compare`: one task answered by two models (two servers, here two simulators answering differently),
compared on both engines: agreement per pair and per field, the rows that differ with their inputs, cost per row,
and flagging those rows so `redo="flagged"` asks exactly them again."""

from __future__ import annotations

import re
from typing import Any

import polars as pl
import pytest

import llmledger
from llmledger import InvalidInputError, Simulator, apply_llm, compare
from llmledger.cli import main as cli

from .conftest import frame

pytestmark = pytest.mark.filterwarnings("ignore::llmledger.UnknownPriceWarning")


def _id(prompt: str) -> int:
    found = re.search(r"number (\d+)", prompt)
    assert found is not None, prompt  # every request is a row's first: the answers match their schemas
    return int(found.group(1))


def careful(prompt: str, system: str | None = None) -> str:
    return "positive"


def hasty(prompt: str, system: str | None = None) -> str:  # says it its own way, and is wrong on every 5th row
    return "negative" if _id(prompt) % 5 == 0 else " Positive."


def run(store: Any, server: Simulator, step: str, model: str, **options: Any) -> Any:
    return apply_llm(
        frame(20), step, prompt="Sentiment of: {text}", model=model, store=store, table="reviews",
        base_url=server.server_url, progress=False, **options,
    )  # fmt: skip


def test_two_models_compared_and_their_differences_redone(target: Any) -> None:
    llmledger.set_price("model-a", input=1.0, output=5.0)
    with (
        Simulator(compatible=True, models=("model-a",), responder=careful) as a,
        Simulator(compatible=True, models=("model-b",), responder=hasty) as b,
    ):
        run(target, a, "sentiment_a", "model-a")
        run(target, b, "sentiment_b", "model-b")
        cmp = compare(target, "reviews", ["sentiment_a", "sentiment_b"])
        (row,) = cmp.agreement.to_dicts()
        assert (row["both_done"], row["agree"], row["share"]) == (20, 16, 0.8)  # " Positive." agrees with "positive"
        assert sorted(cmp.differences["id"].to_list()) == [0, 5, 10, 15]
        assert set(cmp.differences.columns) >= {"id", "text", "sentiment_a", "sentiment_b"}
        assert set(cmp.differences["sentiment_b"]) == {"negative"}
        matrix = cmp.matrix()
        assert matrix.filter(step="sentiment_a")["sentiment_b"].item() == 0.8
        assert matrix.filter(step="sentiment_b")["sentiment_a"].item() == 0.8
        assert matrix.filter(step="sentiment_a")["sentiment_a"].item() == 1.0
        steps = {r["step"]: r for r in cmp.per_step.to_dicts()}
        assert steps["sentiment_a"]["model"] == "model-a" and steps["sentiment_a"]["cost_usd_per_row"] > 0
        assert steps["sentiment_b"]["cost_usd_per_row"] is None  # no price for model-b: unknown, not free
        assert steps["sentiment_b"]["done"] == 20 and steps["sentiment_b"]["output_tokens_per_row"] > 0
        assert "80.0% agree (16 of 20)" in str(cmp) and "4 rows differ" in str(cmp)
        html = cmp._repr_html_()
        assert "80%" in html and "<svg" in html and "sentiment_b" in html
        assert cmp.flag("sentiment_b", reason="disagrees with model-a") == 4
        b.responder = careful  # the model does better this time
        run(target, b, "sentiment_b", "model-b", redo="flagged")
        assert b.stats()["paid"] == 24  # exactly the four flagged rows again
        assert compare(target, "reviews", ["sentiment_a", "sentiment_b"]).agreement["share"].to_list() == [1.0]


def test_structured_answers_are_compared_field_by_field(target: Any) -> None:
    def labeller(flip: bool) -> Any:
        def reply(prompt: str, system: str | None = None) -> str:
            label = "spam" if flip and _id(prompt) < 5 else "ham"
            note = ', "note": null' if flip else ""
            return f'{{"label": "{label}", "score": {_id(prompt) % 3}{note}}}'

        return reply

    output = {"label": str, "score": int}
    with (
        Simulator(compatible=True, models=("model-a",), responder=labeller(False)) as a,
        Simulator(compatible=True, models=("model-b",), responder=labeller(True)) as b,
    ):
        run(target, a, "kind_a", "model-a", output=output)
        run(target, b, "kind_b", "model-b", output={**output, "note": str | None})  # a field only b has
        cmp = compare(target, "reviews", ["kind_a", "kind_b"])
    shares = {r["field"]: r["share"] for r in cmp.agreement.to_dicts()}
    assert shares == {"label": 0.75, "score": 1.0}  # "note" is not compared: only one schema has it
    assert sorted(cmp.differences["id"].to_list()) == [0, 1, 2, 3, 4]
    assert '"spam"' in cmp.differences.filter(id=0)["kind_b"].item()


def test_compare_refuses_what_it_cannot_compare_and_the_cli_prints_it(
    store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with Simulator(compatible=True, models=("model-a",), responder=careful) as a:
        run(store, a, "s1", "model-a")
        run(store, a, "s2", "model-a", system="Be brief.")
        run(store, a, "typed", "model-a", output={"label": str})
    for steps, message in [
        (["s1"], "two or more"),
        ("s1", "two or more"),
        (["s1", "s1"], "twice"),
        (["s1", "nope"], "no step 'nope'"),
        (["s1", "typed"], "answer alike"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            compare(store, "reviews", steps)  # type: ignore[arg-type]
    with pytest.raises(llmledger.WhereClauseError):
        compare(store, "reviews", ["s1", "s2"], where="no_such_column = 1")
    assert compare(store, "reviews", ["s1", "s2"], where="id < 5").agreement["both_done"].to_list() == [5]
    assert cli(["compare", str(store), "--steps", "s1", "s2"]) == 0
    out = capsys.readouterr().out
    assert "s1 ~ s2: 100.0% agree (20 of 20)" in out and "0 rows differ" in out


def test_what_counts_as_agreeing_is_the_same_on_both_engines(target: Any) -> None:
    answers = {0: ("positive", "\n\tPositive!"), 1: ("ok", "ok！"), 2: ("yes", "yes..."), 3: ("a", "b")}

    def side(n: int) -> Any:
        return lambda prompt, system=None: answers[_id(prompt)][n]

    with (
        Simulator(compatible=True, models=("model-a",), responder=side(0)) as a,
        Simulator(compatible=True, models=("model-b",), responder=side(1)) as b,
    ):
        for server, step, model in ((a, "x", "model-a"), (b, "y", "model-b")):
            apply_llm(frame(4), step, prompt="{text}", model=model, store=target, table="t", base_url=server.server_url,
                      progress=False)  # fmt: skip
    cmp = compare(target, "t", ["x", "y"])
    assert cmp.differences["id"].to_list() == [1, 3]  # full-width "！" is not ASCII punctuation on either engine


def test_numbers_agree_whatever_their_json_type_and_flag_names_only_the_step_that_differs(target: Any) -> None:
    def numbers(value: str) -> Any:
        return lambda prompt, system=None: f'{{"n": {value if _id(prompt) else 7}}}'

    with (
        Simulator(compatible=True, models=("model-a",), responder=numbers("1")) as a,
        Simulator(compatible=True, models=("model-b",), responder=numbers("1.0")) as b,
        Simulator(compatible=True, models=("model-c",), responder=numbers("2")) as c,
    ):
        for server, step, model, kind in (
            (a, "i", "model-a", int),
            (b, "f", "model-b", float),
            (c, "k", "model-c", int),
        ):
            apply_llm(frame(3), step, prompt="{text}", model=model, store=target, table="t", output={"n": kind},
                      base_url=server.server_url, progress=False)  # fmt: skip
    cmp = compare(target, "t", ["i", "f", "k"])
    shares = {(r["step_a"], r["step_b"]): r["share"] for r in cmp.agreement.to_dicts()}
    assert shares[("i", "f")] == 1.0 and shares[("i", "k")] == shares[("f", "k")] == pytest.approx(1 / 3)
    assert cmp.flag("i", reason="check") == 2  # rows 1 and 2, where i differs from k
    assert cmp.flag("k", reason="check") == 2
    flagged = llmledger.sql(target, "SELECT id FROM t WHERE f_flag IS NOT NULL")
    assert flagged is not None and flagged.height == 0  # f was never named


def test_a_step_without_a_price_costs_unknown_even_with_free_reused_rows(store: Any) -> None:
    # a model no test prices (set_price holds for the whole process)
    with Simulator(compatible=True, models=("model-unpriced",), responder=careful) as a:
        twins = frame(3).with_columns(text=pl.Series(["same number 0", "same number 0", "other number 1"]))
        for step in ("x", "y"):
            apply_llm(twins, step, prompt="{text}", model="model-unpriced", store=store, table="t",
                      base_url=a.server_url, progress=False)  # fmt: skip
    cmp = compare(store, "t", ["x", "y"])
    assert cmp.per_step["cost_usd_per_row"].to_list() == [None, None]
    assert "no step has a known cost" in cmp._repr_html_()


def test_compare_writes_nothing_whatever_its_where_calls(target: Any) -> None:
    with Simulator(compatible=True, models=("model-a",), responder=careful) as a:
        for step in ("x", "y"):
            run(target, a, step, "model-a")
    llmledger.sql(target, "CREATE SEQUENCE side_effect", write=True)
    with pytest.raises(llmledger.WhereClauseError):
        compare(target, "reviews", ["x", "y"], where="nextval('side_effect') > 0")
    after = llmledger.sql(target, "SELECT nextval('side_effect') AS n", write=True)
    assert after is not None and after["n"].to_list() == [1]
