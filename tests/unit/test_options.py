"""The run options are declared once (`_run/options.RunOptions`): apply_llm, resume and work take each of them with
the same default, their docstrings say what every parameter does, and the checks name the offending value."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmledger import apply_llm, resume, work
from llmledger._run.options import DEFAULTS, RunOptions
from llmledger.errors import InvalidInputError

from . import UNIT

RUN_OPTIONS = [f.name for f in dataclasses.fields(RunOptions)]


def _parameters(fn: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(inspect.unwrap(fn)).parameters)


@pytest.mark.parametrize("fn", [apply_llm, resume], ids=lambda f: f.__name__)
def test_every_run_option_is_a_keyword_of_the_call_with_the_one_default(fn: Any) -> None:
    parameters = _parameters(fn)
    missing = [name for name in RUN_OPTIONS if name not in parameters]
    assert not missing, f"{fn.__name__} lacks the run options {missing}"
    for name in RUN_OPTIONS:
        parameter = parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.default == getattr(DEFAULTS, name), (
            f"{fn.__name__}({name}={parameter.default!r}) but RunOptions says {getattr(DEFAULTS, name)!r}"
        )


def test_work_keeps_the_defaults_it_names_itself() -> None:
    parameters = _parameters(work)
    for name in ("stale_after", "progress"):
        assert parameters[name].default == getattr(DEFAULTS, name)


@pytest.mark.parametrize("fn", [apply_llm, resume], ids=lambda f: f.__name__)
def test_the_docstring_says_what_every_parameter_does(fn: Any) -> None:
    doc = inspect.getdoc(fn) or ""
    undocumented = [name for name in _parameters(fn) if not re.search(rf"`{name}`", doc)]
    assert not undocumented, f"{fn.__name__}'s docstring does not name {undocumented}"


def test_a_call_naming_no_option_runs_with_the_defaults() -> None:
    assert RunOptions.of({}) == DEFAULTS
    assert RunOptions.of({"concurrency": 3, "prompt": "ignored: not a run option"}).concurrency == 3
    assert DEFAULTS.checked() is DEFAULTS


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("chunk_size", 0),
        ("concurrency", True),
        ("concurrency", 1_001),
        ("max_attempts", 2.0),
        ("batch_size", -1),
        ("redo", "some"),
        ("where", "  "),
        ("commit_every", math.nan),
        ("commit_every", math.inf),
        ("redo", 1),
        ("max_cost_usd", math.inf),
        ("budget_scope", "month"),
        ("mode", "offline"),
        ("stale_after", "soon"),
        ("stale_after", timedelta(days=-1)),
        ("dedupe", "yes"),
        ("retry", {"base_delay": 1}),
        ("validate", "not callable"),
    ],
)
def test_a_bad_option_is_refused_naming_its_value(name: str, value: Any) -> None:
    options = dict(mode="batch") if name == "batch_size" else {}
    with pytest.raises(InvalidInputError) as caught:
        RunOptions(**{**options, name: value}).checked()
    assert name in str(caught.value)
    assert repr(value)[:20] in str(caught.value) or name == "concurrency"


@UNIT
@given(
    concurrency=st.integers(min_value=1, max_value=1_000),
    chunk_size=st.integers(min_value=1, max_value=10**9),
    seconds=st.floats(min_value=0.001, max_value=3650 * 86400),
)
def test_every_value_in_range_is_kept_as_given(concurrency: int, chunk_size: int, seconds: float) -> None:
    options = RunOptions(concurrency=concurrency, chunk_size=chunk_size, stale_after=seconds).checked()
    assert (options.concurrency, options.chunk_size) == (concurrency, chunk_size)
    assert options.stale == timedelta(seconds=seconds)


@pytest.mark.parametrize("seconds", [3600, 3600.0, "numpy.int64", "numpy.float32", "fractions.Fraction"])
def test_a_deadline_in_seconds_may_be_any_real_number(seconds: Any) -> None:
    """numpy's integers were refused as "not seconds" while its floats were taken (an attack found it)."""
    if isinstance(seconds, str):
        module, name = seconds.split(".")
        seconds = getattr(pytest.importorskip(module), name)(3600)
    at = RunOptions(mode="batch", deadline=seconds).checked().deadline_at
    assert at is not None and 3590 < at - time.time() <= 3600
