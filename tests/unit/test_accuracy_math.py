"""The interval `llmledger.accuracy` gives (Wilson's) and the sample it asks for, as arithmetic."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmledger._view.accuracy import sample_size, wilson
from llmledger.errors import InvalidInputError

from . import UNIT


def test_the_interval_matches_the_published_formula() -> None:
    # statsmodels.stats.proportion.proportion_confint(94, 100, method="wilson") = (0.87522, 0.97224)
    low, high = wilson(94, 100)
    assert (round(low, 4), round(high, 4)) == (0.8752, 0.9722)
    assert wilson(0, 0) == (None, None)
    low, high = wilson(10, 10)  # all right: the interval still says how sure ten rows make us
    assert high == 1.0 and 0.70 < low < 0.73


@UNIT
@given(n=st.integers(1, 10_000), data=st.data(), confidence=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_the_interval_holds_the_share_seen_and_stays_inside_0_and_1(n: int, data: st.DataObject, confidence: float):
    right = data.draw(st.integers(0, n))
    low, high = wilson(right, n, confidence)
    assert low is not None and high is not None
    assert 0.0 <= low <= right / n <= high <= 1.0
    wider_low, wider_high = wilson(right, n, min(0.999, confidence + 0.009))
    assert wider_low <= low + 1e-12 and wider_high >= high - 1e-12, "more confidence, a wider interval"


def test_the_interval_covers_a_known_accuracy_as_often_as_it_says() -> None:
    """A known sample: 2,000 reviews of 200 rows each from a step that is right 90 % of the time (seeded)."""
    rng = random.Random(20261128)
    covered = 0
    for _ in range(2000):
        right = sum(rng.random() < 0.9 for _ in range(200))
        low, high = wilson(right, 200)
        assert low is not None and high is not None
        covered += low <= 0.9 <= high
    assert 0.93 <= covered / 2000 <= 0.97


def test_the_sample_for_a_margin() -> None:
    assert sample_size(0.05) == 385 and sample_size(0.05, 0.99) == 664 and sample_size(0.1) == 97
    with pytest.raises(InvalidInputError, match="between 0 and 1"):
        sample_size(5)
