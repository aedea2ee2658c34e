"""What a step is, as pure values: the fingerprint, quoting, templates, prices and attached files' headers.

The fast tier (`pytest tests/unit`): no server, no subprocess, no store on disk (an in-memory DuckDB at most).
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmledger._step.attach import image_size, media_type
from llmledger._step.prices import Price
from llmledger._step.prompt import check_prompt, template_fields
from llmledger._step.request import RequestSpec, canonical_json, fingerprint, split_model, sql_literal
from llmledger._step.sqltext import q
from llmledger.errors import PromptError
from llmledger.simulator import pdf, png

from . import UNIT

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(UNIT)
@given(st.dictionaries(st.text(max_size=8), JSON, max_size=5))
def test_a_fingerprint_depends_on_the_body_not_on_its_key_order(body: dict) -> None:
    reordered = dict(reversed(list(body.items())))
    assert fingerprint(body) == fingerprint(reordered)
    assert canonical_json(body) == canonical_json(reordered)


@settings(UNIT)
@given(st.text(max_size=40), st.text(max_size=40))
def test_different_prompts_have_different_fingerprints(a: str, b: str) -> None:
    spec = RequestSpec(model="m", max_tokens=5, system="s")
    assert (spec.fingerprint(a) == spec.fingerprint(b)) == (a == b)


# (provider, API beyond its default, the provider's own rules at another endpoint): Messages, Chat Completions (also
# through a gateway or Azure), Responses
APIS = [("anthropic", None, False), ("openai", None, False), ("openai", None, True), ("openai", "responses", False)]


@settings(UNIT, max_examples=60)
@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60),
    st.sampled_from([None, "terse", "quote ' and \" and \\"]),
    st.sampled_from(APIS),
)
def test_the_sql_fingerprint_is_the_python_fingerprint(
    prompt: str, system: str | None, api: tuple[str, str | None, bool]
) -> None:
    """The ledger fingerprints rows in SQL and answers in Python: both must agree on every text, for every API's
    body."""
    provider, name, own_rules = api
    spec = RequestSpec(
        model="claude-x", max_tokens=7, system=system, options={"metadata": {"a": [1, "é"]}}, provider=provider,
        api=name, own_rules=own_rules, endpoint="http://gateway:4000" if own_rules else None,
    )  # fmt: skip
    with duckdb.connect() as con:
        found = con.execute(f"SELECT ({spec.fingerprint_sql(sql_literal(prompt))})::VARCHAR").fetchone()
    assert found is not None and found[0] == spec.fingerprint(prompt)


OPTIONS = st.dictionaries(
    st.sampled_from(["temperature", "seed", "max_completion_tokens", "max_tokens_x", "metadata"]), JSON, max_size=3
)


@settings(UNIT, max_examples=80)
@given(
    st.sampled_from(APIS),
    st.one_of(st.none(), st.text(min_size=1, max_size=12)),
    OPTIONS,
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=8)}),
        max_size=2,
    ),
    st.sampled_from([None, "http://localhost:8000"]),
)
def test_a_stored_request_reads_back_as_the_request_it_was(
    api: tuple[str, str | None, bool], system: str | None, options: dict, prefix: list, endpoint: str | None
) -> None:
    """What `resume` sends is the request read back from the store: it must be the one apply_llm recorded, body
    and fingerprint, whichever API it is written for (an Anthropic option named like OpenAI's bound included)."""
    provider, name, own_rules = api
    if provider == "openai":
        options.pop("max_completion_tokens", None)  # apply_llm refuses it there: max_tokens= sets it
    spec = RequestSpec(
        model="m", max_tokens=9, system=system, options=options, prefix=tuple(prefix), endpoint=endpoint,
        provider=provider, api=name, own_rules=own_rules,
    )  # fmt: skip
    again = RequestSpec.from_json(spec.to_json())
    assert again.to_json() == spec.to_json() and again.max_tokens == 9 and again.provider == provider
    assert again.fingerprint("row") == spec.fingerprint("row")
    assert again.body("row") == spec.body("row")


@pytest.mark.parametrize(
    ("named", "split"),
    [
        ("openai:gpt-6.1-terra", ("openai", "gpt-6.1-terra")),
        ("anthropic:claude-haiku-5-5", ("anthropic", "claude-haiku-5-5")),
        ("claude-haiku-5-5", ("anthropic", "claude-haiku-5-5")),
        ("llama3.2:3b", ("anthropic", "llama3.2:3b")),
        ("openai:qwen3:8b", ("openai", "qwen3:8b")),
        ("openai:", ("anthropic", "openai:")),
    ],
)
def test_only_the_two_provider_prefixes_choose_a_provider(named: str, split: tuple[str, str]) -> None:
    assert split_model(named) == split


@settings(UNIT, max_examples=60)
@given(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30)
)
def test_any_name_quoted_is_the_column_name_duckdb_returns(name: str) -> None:
    with duckdb.connect() as con:
        assert con.execute(f"SELECT 1 AS {q(name)}").description[0][0] == name


def test_a_template_names_its_fields_and_an_unknown_one_is_refused_with_the_close_match() -> None:
    assert template_fields("Summarise {text} for {reader.name}") == ["text", "reader"]
    check_prompt("Summarise {text}", ["id", "text"])
    with pytest.raises(PromptError, match="tex") as refused:
        check_prompt("Summarise {tex}", ["id", "text"])
    assert "text" in str(refused.value)


def test_a_price_halves_in_batches_and_reads_from_the_cache_cheaply() -> None:
    price = Price(input=3.0, output=15.0, cache_write_5m=3.75, cache_write_1h=6.0, cache_read=0.3)
    online = price.cost(input_tokens=1_000_000, output_tokens=100_000)
    assert online == pytest.approx(3.0 + 1.5)
    assert price.cost(input_tokens=1_000_000, output_tokens=100_000, batch=True) == pytest.approx(online / 2)
    cached = price.cost(input_tokens=0, output_tokens=0, cache_read_tokens=1_000_000)
    assert cached == pytest.approx(0.3) and cached < price.cost(input_tokens=1_000_000, output_tokens=0)


def test_a_long_prompt_pays_the_long_prompt_rate_for_all_of_it() -> None:
    long = Price(input=6.0, output=22.5, cache_write_5m=7.5, cache_write_1h=12.0, cache_read=0.6)
    price = Price(
        input=3.0,
        output=15.0,
        cache_write_5m=3.75,
        cache_write_1h=6.0,
        cache_read=0.3,
        long_prompt_threshold=200_000,
        long_prompt=long,
    )
    assert price.cost(input_tokens=200_000, output_tokens=0) == pytest.approx(0.6)
    assert price.cost(input_tokens=200_001, output_tokens=0) == pytest.approx(200_001 * 6.0 / 1e6)


@settings(UNIT, max_examples=30)
@given(st.integers(1, 300), st.integers(1, 300))
def test_an_images_size_is_read_from_its_header(width: int, height: int) -> None:
    data = png(width, height)
    assert media_type(data) == "image/png"
    assert image_size(data, "image/png") == (width, height)


def test_a_pdf_is_known_by_its_bytes_and_anything_else_is_not_a_file_we_send() -> None:
    assert media_type(pdf(["hello"])) == "application/pdf"
    assert media_type(b"just some text") is None
