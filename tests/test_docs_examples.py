"""Every Python code block of the README and the docs runs, as written, under `llmledger.simulate()`.

A trial found examples that did not run as written (a typed answer's fields clashing with an input column,
a call without the key its table records, a batch without `table=`). Each page's blocks run in order in one fresh
interpreter (a later block uses what an earlier one made), in a folder holding a copy of `data/`, with `df` the
reviews unless the page makes its own. A block that cannot run here (a cloud's credentials, a server of your
own) is marked just above its fence, with the reason: `<!-- not run: ... -->`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "pages").rglob("*.md"))]
FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]+) -->\n)?```python\n(?P<code>.*?)```", re.DOTALL)
PRELUDE = """\
import os
import polars as pl
import llmledger
from llmledger import apply_llm
llmledger.simulate()
df = pl.read_csv("data/reviews.csv").head(40)
# what the README's first cell made: the reviews' ledger, which the guides go on from
apply_llm(df, "sentiment", prompt="Classify the sentiment of this review as positive, negative or neutral: {text}",
          key="review_id", store="data/ledger.duckdb", table="reviews", progress=False)
"""


def blocks(page: Path) -> list[tuple[str, str | None]]:
    """(code, why it is not run or None) for each Python block of `page`."""
    return [(m["code"], m["why"]) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


RUNNABLE = [p for p in PAGES if any(why is None for _, why in blocks(p))]


def program(page: Path) -> str:
    """What the test runs of `page`: its runnable blocks in order."""
    return "\n".join(block for block, why in blocks(page) if why is None)


def distinct(pages: list[Path]) -> list[Path]:
    """`pages` without a page whose program is, statement for statement, one an earlier page has (`ast.dump`
    leaves out comments and layout): the docs site's front page repeats the README's example, a run of all
    3,000 reviews (13 s of CPU). In a fresh folder after the same prelude, running it again does it again."""
    seen: set[str] = set()
    kept = []
    for page in pages:
        tree = ast.dump(ast.parse(program(page)))
        if tree not in seen:
            seen.add(tree)
            kept.append(page)
    return kept


TO_RUN = distinct(RUNNABLE)


def test_every_block_not_run_says_why() -> None:
    for page in PAGES:
        for code, why in blocks(page):
            assert why is None or len(why.strip()) > 10, f"{page.name}: say why a block is not run: {code[:60]}"


RUNNER = """\
import json, os, shutil, sys, traceback
pages, root, work = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
failed = {}
for n, (name, code) in enumerate(pages):  # one interpreter for every page (each a process cost seconds)
    folder = os.path.join(work, str(n))
    shutil.copytree(os.path.join(root, "data"), os.path.join(folder, "data"),
                    ignore=shutil.ignore_patterns("*.duckdb*"))
    os.chdir(folder)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    except BaseException:
        failed[name] = traceback.format_exc()[-3000:]
print(json.dumps(failed))
"""


PARTS = 3  # the pages in three interpreters, which the suite's workers run side by side


@pytest.mark.parametrize("part", range(PARTS))
def test_every_pages_code_blocks_run_as_written(part: int, tmp_path: Path) -> None:
    """Each page in a folder of its own (a copy of `data/`), its blocks in order in a namespace of its own."""
    pages = [[str(page.relative_to(ROOT)), PRELUDE + program(page)] for page in TO_RUN[part::PARTS]]
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    env["LLMLEDGER_PROGRESS"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(pages), str(ROOT), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"{page}:\n{trace}" for page, trace in failed.items())
    assert len(RUNNABLE) >= 15, "the pages with examples: README, tutorial, the how-tos"


def test_a_page_not_run_again_repeats_one_that_is_run() -> None:
    """Every runnable page is run, or has the very program of a page that is (`distinct`)."""
    run = {ast.dump(ast.parse(program(page))) for page in TO_RUN}
    assert all(ast.dump(ast.parse(program(page))) in run for page in RUNNABLE)
    assert ROOT / "README.md" in TO_RUN
