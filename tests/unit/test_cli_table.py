"""The command line as a table of verbs: its usage text and reference are made from the table, its defaults from
`RunOptions`' DEFAULTS; and `work()` names itself when it refuses an option."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import llmledger
from llmledger._cli_parser import VERBS, parser
from llmledger._cli_parser.table import synopsis
from llmledger._run.options import DEFAULTS


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    found = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(found.choices)


def test_the_usage_text_lists_every_verb_of_the_table_compare_included() -> None:
    """`llmledger --help`'s hand-written list of verbs left out `compare`; now it is made from the table."""
    text = parser().format_help()
    subparsers = _subparsers()
    assert {verb.name for verb in VERBS} | {a for verb in VERBS for a in verb.aliases} == set(subparsers)
    for verb in VERBS:
        assert f"  llmledger {verb.name} {synopsis(subparsers[verb.name])}\n" in text, verb.name
        assert callable(verb.run) and subparsers[verb.name].get_default("verb") is verb
    assert "llmledger compare STORE --steps STEP ... [options]" in text
    assert "llmledger flag STORE --where WHERE --reason REASON [options]" in text
    assert "`show`, `resume` and `work` are the same verbs as `status`, `run` and `worker`" in text


def test_the_defaults_that_mirror_a_python_option_are_read_from_run_options() -> None:
    run = parser().parse_args(["run", "s.duckdb"])
    assert (run.concurrency, run.max_attempts, run.mode, run.where) == (
        DEFAULTS.concurrency,
        DEFAULTS.max_attempts,
        DEFAULTS.mode,
        DEFAULTS.where,
    )
    assert run.no_wait is (not DEFAULTS.wait) and run.quiet is (not DEFAULTS.progress)
    worker = parser().parse_args(["work", "s.duckdb"])
    assert worker.chunk_size == DEFAULTS.chunk_size and worker.stale_after == DEFAULTS.stale.total_seconds()
    assert worker.verb.name == "worker"
    reset = parser().parse_args(["reset", "s.duckdb", "--where", "true"])
    assert reset.stale_after == DEFAULTS.stale.total_seconds()
    helps = {a.dest: a.help or "" for a in _subparsers()["worker"]._actions}
    assert f"(default {DEFAULTS.concurrency})" in helps["concurrency"]
    assert f"default {DEFAULTS.chunk_size})" in helps["chunk_size"]
    assert f"(default {DEFAULTS.max_attempts})" in helps["max_attempts"]
    assert f"(default {DEFAULTS.stale.total_seconds():g};" in helps["stale_after"]


def test_work_names_itself_when_refusing_an_option(tmp_path: Path) -> None:
    """`work(..., temperature=0)` said "resume() has no option temperature=": the caller never called resume()."""
    store = tmp_path / "s.duckdb"
    with pytest.raises(llmledger.InvalidInputError, match=r"^work\(\) has no option temperature=") as raised:
        llmledger.work(store, "t", "s", temperature=0)
    assert "resume()" not in str(raised.value) and "request_options={'temperature': 0}" in str(raised.value)
    with pytest.raises(llmledger.InvalidInputError, match=r"^work\(\) has no option concurency=; did you mean"):
        llmledger.work(store, "t", "s", concurency=4)
    assert not store.exists()
