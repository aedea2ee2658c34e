"""The documentation site's reference is complete and current: every public name, error and CLI verb is in it, and
the generated pages (the CLI from `--help`, the ledger's columns and tables from a real store) match the code."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import llmledger
import llmledger.errors

DOCS = Path(__file__).resolve().parents[1] / "docs"
REFERENCE = DOCS / "pages" / "reference"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented() -> set[str]:
    """Every `::: llmledger.X` the reference pages render from the docstrings."""
    text = "".join(p.read_text() for p in REFERENCE.glob("*.md"))
    return set(re.findall(r"^::: llmledger\.(\w+)\s*$", text, flags=re.M))


def test_every_public_name_is_in_the_reference() -> None:
    public = {n for n in llmledger.__all__ if n != "__version__"}
    missing = sorted(public - _documented())
    assert not missing, f"add `::: llmledger.NAME` for these to docs/pages/reference/api.md or errors.md: {missing}"


def test_every_error_and_warning_class_is_in_the_reference() -> None:
    classes = {
        name
        for name, obj in vars(llmledger.errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception | Warning) and obj.__module__ == "llmledger.errors"
    }
    assert classes <= set(llmledger.__all__), f"export these from llmledger: {sorted(classes - set(llmledger.__all__))}"
    missing = sorted(classes - _documented())
    assert not missing, f"add these to docs/pages/reference/errors.md: {missing}"


@pytest.mark.parametrize("page", ["cli.md", "ledger.md"])
def test_the_generated_reference_pages_are_current(page: str) -> None:
    made = _generator().PAGES_MADE[page]()
    assert (REFERENCE / page).read_text() == made, (
        f"docs/pages/reference/{page} is out of date: run `python docs/gen_reference.py`"
    )


def test_every_cli_verb_and_its_options_are_in_the_cli_reference() -> None:
    from llmledger._cli_parser import parser

    text = (REFERENCE / "cli.md").read_text()
    for name, sub in _generator().verbs(parser()).items():
        assert f"llmledger {name}" in text or f"{name})" in text, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in text, f"{name} {flag} is not in docs/pages/reference/cli.md"


def test_every_page_in_the_docs_folder_is_in_the_site_navigation() -> None:
    nav = (DOCS / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS / "pages")) for p in (DOCS / "pages").rglob("*.md")}
    missing = sorted(p for p in pages if p not in nav)
    assert not missing, f"add these to the nav of docs/mkdocs.yml: {missing}"
