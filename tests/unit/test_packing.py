"""A pack's answer is read entry by entry (`_step/packing.py`): whatever a model writes, an answer is kept only for
the item it belongs to, every item is either kept or failed with a reason, and each row's share of the usage adds
up to the request's exactly."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmledger._step.output import output_spec
from llmledger._step.packing import (
    Pack,
    apportion,
    common_frame,
    pack_examples,
    pack_groups,
    pack_request,
    read_pack,
    stored_pack,
)
from llmledger._step.request import RequestSpec

pytestmark = pytest.mark.fast

SPEC = RequestSpec(model="claude-haiku-5-5", max_tokens=100, system="Be brief.")
texts = st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=12)


def answer_of(text: str) -> str:
    """What a faithful model answers an item: a value that names it."""
    return f"answer to {text!r}"


def faithful(pack: Pack) -> list[dict[str, object]]:
    return [
        {"id": i, "start": " ".join(t.split()[:6]), "answer": answer_of(t)}
        for i, t in zip(pack.ids, pack.own, strict=True)
    ]


@settings(max_examples=200, deadline=None)
@given(texts, st.randoms(use_true_random=False), st.lists(st.sampled_from(["drop", "dup", "swap", "bad", "junk"])))
def test_whatever_the_model_does_a_kept_answer_is_its_own_items(
    own: list[str], rng: random.Random, faults: list[str]
) -> None:
    prompts = [f"Label this: {t}" for t in own]
    pack = pack_request(SPEC, prompts)
    entries = faithful(pack)
    for fault in faults:
        if fault == "drop" and entries:
            entries.pop(rng.randrange(len(entries)))
        elif fault == "dup" and entries:
            entries.append(dict(entries[rng.randrange(len(entries))]))
        elif fault == "swap" and len(entries) >= 2:
            a, b = rng.sample(range(len(entries)), 2)
            entries[a]["id"], entries[b]["id"] = entries[b]["id"], entries[a]["id"]
        elif fault == "bad" and entries:
            entries[rng.randrange(len(entries))]["answer"] = 7
        elif fault == "junk":
            entries.append({"id": "zzzzzz", "start": "x", "answer": "not asked"})
    rng.shuffle(entries)
    kept, problems = read_pack(json.dumps({"answers": entries}), pack, None)
    assert set(kept) | set(problems) == set(range(len(prompts))) and not set(kept) & set(problems)
    for i, answer in kept.items():
        assert answer == answer_of(pack.own[i]) or pack.own[answer_index(answer, pack)] == pack.own[i], (
            "an answer is kept only on its own item (or on an item with the very same text)"
        )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z]{1,8}( [A-Za-z0-9,.!?']{1,8}){0,8}", fullmatch=True), min_size=1, max_size=20))
def test_a_faithful_answer_keeps_every_row_whose_first_words_tell_it_apart(own: list[str]) -> None:
    """Rows whose first six words are another (different) row's are asked alone: a `start` cannot tell them apart."""
    pack = pack_request(SPEC, [f"Label this: {t}" for t in own])
    kept, problems = read_pack(json.dumps({"answers": faithful(pack)}), pack, None)
    words = [re.sub(r"\W+", "", t.casefold()) for t in pack.own]
    for i, t in enumerate(pack.own):
        first = re.sub(r"\W+", "", " ".join(t.split()[:6]).casefold())
        if all(t == o or not w.startswith(first) for o, w in zip(pack.own, words, strict=True)):
            assert kept.get(i) == answer_of(t), problems.get(i)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["ok", "OK!", "Ok.", "1", "10", "100", "", " ", "yes", "yes please", "a b c d e f g"]),
            st.from_regex(r"[A-Za-z0-9]{1,4}( [A-Za-z0-9,.!?']{1,3}){0,7}", fullmatch=True),
        ),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(["Label this: {}", "{}", "Say {} now"]),
)
def test_rows_are_packed_only_with_rows_a_faithful_answer_tells_them_apart_from(own: list[str], template: str) -> None:
    """Rows such as "ok" and "OK!", or "1" and "10", never share a pack (they would fail together in every one, paid
    each time): every row is in exactly one pack, and a faithful answer keeps every row of every pack."""
    prompts = [template.format(t) for t in own]
    groups = pack_groups(prompts)
    assert sorted(i for g in groups for i in g) == list(range(len(prompts)))
    for group in groups:
        pack = pack_request(SPEC, [prompts[i] for i in group])
        _, problems = read_pack(json.dumps({"answers": faithful(pack)}), pack, None)
        assert not problems, (prompts, group, problems)


def test_rows_alike_go_in_different_packs_and_the_others_fill_the_first() -> None:
    prompts = [f"Label this: {t}" for t in ["ok", "hello there", "OK!", "1", "10", "fine", "Ok."]]
    assert pack_groups(prompts) == [[0, 1, 3, 5], [2, 4], [6]]


def answer_index(answer: str, pack: Pack) -> int:
    return next(i for i, t in enumerate(pack.own) if answer_of(t) == answer)


def test_an_answer_that_is_no_pack_fails_every_row_with_the_reason() -> None:
    pack = pack_request(SPEC, ["a b", "c d"])
    for text, why in (("not json", "not JSON"), ('{"x": 1}', 'no list of "answers"'), ("[]", 'no list of "answers"')):
        kept, problems = read_pack(text, pack, None)
        assert not kept and len(problems) == 2 and all(why in p for p in problems.values())


def test_a_typed_answer_is_checked_against_the_steps_schema() -> None:
    spec = output_spec({"spam": bool})
    assert spec is not None
    pack = pack_request(SPEC, ["first one", "second one"])
    entries = [
        {"id": pack.ids[0], "start": "first", "answer": {"spam": True}},
        {"id": pack.ids[1], "start": "second", "answer": {"spam": "yes"}},
    ]
    kept, problems = read_pack(json.dumps({"answers": entries}), pack, spec)
    assert kept == {0: '{"spam":true}'} and "output schema" in problems[1]


def test_ids_are_fresh_letters_and_digits_never_counts() -> None:
    a, b = pack_request(SPEC, ["x"] * 30), pack_request(SPEC, ["x"] * 30)
    assert len(set(a.ids)) == 30 and not set(a.ids) & set(b.ids)
    assert not any(i.isdigit() for i in a.ids)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**7), st.lists(st.floats(0, 1e6), min_size=1, max_size=40))
def test_shares_add_up_to_the_whole_exactly(total: int, weights: list[float]) -> None:
    parts = apportion(total, weights)
    assert sum(parts) == total and all(p >= 0 for p in parts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=2, max_size=8), st.text(max_size=20), st.text(max_size=20))
def test_the_shared_frame_leaves_each_item_its_own_words(middles: list[str], head: str, tail: str) -> None:
    items = [head + m + tail for m in middles]
    prefix, suffix = common_frame(items)
    for item in items:
        assert item.startswith(prefix) and item.endswith(suffix)
        if prefix or suffix:  # no item is left empty but one with nothing after the shared prefix
            assert item[len(prefix) : len(item) - len(suffix)].strip() or not item[len(prefix) :].strip()


def test_the_template_around_each_row_is_said_once() -> None:
    prompts = [f"Is this SMS spam or ham? Answer spam or ham.\n\n{t}" for t in ("Win cash now", "See you at 5")]
    pack = pack_request(SPEC, prompts)
    message = pack.body["messages"][-1]["content"]
    assert message.count("Answer spam or ham") == 1 and pack.own == ["Win cash now", "See you at 5"]
    assert pack.body["max_tokens"] == 2 * (100 + 48) and pack.body["system"].startswith("Be brief.")
    assert pack.body["output_config"]["format"]["schema"]["required"] == ["answers"]


def test_an_empty_row_is_an_empty_item_and_the_others_still_share_the_template() -> None:
    """Found in an attack: one row with an empty {text} made every item its whole request, all starting with the
    template's words, so no entry could be told apart and the whole pack was asked again row by row."""
    prompts = [f"Is this SMS spam or ham?\n\n{t}" for t in ("", "Win cash now", "See you at 5")]
    pack = pack_request(SPEC, prompts)
    assert pack.own == ["", "Win cash now", "See you at 5"]
    kept, problems = read_pack(json.dumps({"answers": faithful(pack)}), pack, None)
    assert set(kept) == {1, 2} and set(problems) == {0}, "only the empty row goes alone"


def test_few_shot_examples_become_one_pack_and_its_answer_and_the_rows_are_still_read_back() -> None:
    """`messages=` examples (user and assistant turns) are shown in the pack's own shape, with fixed ids, so the model
    sees how to answer; the row's pack, read back from its stored body (a batch's), is the last message's."""
    examples = (
        {"role": "user", "content": "Is this SMS spam or ham?\n\nWIN a prize, call now"},
        {"role": "assistant", "content": "spam"},
        {"role": "user", "content": "Is this SMS spam or ham?\n\nsee you at lunch"},
        {"role": "assistant", "content": [{"type": "text", "text": "ham", "cache_control": {"type": "ephemeral"}}]},
    )
    spec = dataclasses.replace(SPEC, prefix=examples)
    pack = pack_request(spec, [f"Is this SMS spam or ham?\n\n{t}" for t in ("Free tickets", "Running late")])
    shown, answered, asked = pack.body["messages"]
    assert "ex1" in shown["content"] and "ex2" in shown["content"] and "Free tickets" not in shown["content"]
    entries = json.loads(answered["content"][0]["text"])["answers"]
    assert [(e["id"], e["start"], e["answer"]) for e in entries] == [
        ("ex1", "WIN a prize, call now", "spam"),
        ("ex2", "see you at lunch", "ham"),
    ]
    assert answered["content"][0]["cache_control"] == {"type": "ephemeral"}, "a cached prefix stays cached"
    assert asked["content"] == pack.message
    again = stored_pack(pack.body)
    assert (again.ids, again.own) == (pack.ids, pack.own)
    typed = output_spec({"spam": bool})
    assert pack_examples(examples, typed) == examples, "answers not in the step's shape: the examples as they are"
    assert pack_examples(examples[:3], None) == examples[:3], "not in pairs: as they are"


HEADING = 'Items, one JSON object a line:\n{{"id": "ex", "text": "e"}}\nLabel: {}'


@pytest.mark.parametrize("template", ["Template uses <<ITEM>> tags. Summarise: {}", HEADING])
def test_a_template_holding_the_packs_own_marks_is_not_factored_out(template: str) -> None:
    """Found in an attack: a shared template holding `<<ITEM>>` made every row's answer the placeholder's, and one
    holding the items' heading made a batch's stored pack read one item too many (paid again and again)."""
    prompts = [template.format(t) for t in ("apple pie", "pear tart", "plum jam")]
    pack = pack_request(SPEC, prompts)
    assert pack.own == prompts, "each item is its whole request"
    again = stored_pack(pack.body)
    assert (again.ids, again.own) == (pack.ids, pack.own)
    kept, problems = read_pack(json.dumps({"answers": faithful(pack)}), pack, None)
    assert set(kept) | set(problems) == {0, 1, 2}  # items whose first words are alike go alone: never misread
    assert all(kept[i] == answer_of(pack.own[i]) for i in kept)
