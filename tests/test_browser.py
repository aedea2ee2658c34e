"""The notebooks as a person sees them: JupyterLab on 127.0.0.1, headless Chromium, Run All Cells, then the
views measured from the DOM and what the cells printed checked. Screenshots go to the test's tmp dir (and to
$LLMLEDGER_SCREENSHOTS if set). `test_notebooks.py` runs two of them in a kernel without widgets."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.jupyter, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FAILED_RGB = "rgb(211, 47, 47)"  # _view.SEGMENTS["FAILED"].colour, #d32f2f, as the browser computes it
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))

KERNEL_READY = """() => {
    const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const ctx = nb && nb.sessionContext;
    return !!(ctx && ctx.isReady && ctx.session && ctx.session.kernel
              && ctx.session.kernel.connectionStatus === 'connected');
}"""
# How far Run All has got: code cells run, code cells in all, and the first error shown.
PROGRESS = """() => {
    const nb = window.jupyterapp.shell.currentWidget;
    const cells = nb.content.widgets.filter(c => c.model.type === 'code');
    const error = document.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"] pre');
    const busy = nb.sessionContext.session.kernel.status !== 'idle';
    return {ran: cells.filter(c => c.model.executionCount !== null).length, cells: cells.length, busy,
            error: error && error.innerText.includes('Traceback') ? error.innerText.slice(-1500) : null};
}"""
# What of a view sticks out of it, or the view out of its cell's output: a summary's line of figures once did not
# wrap, cut off at a 948 px cell (trial finding); each offender's start and how far it sticks out.
OVERFLOW = """view => {
  const box = view.getBoundingClientRect(), out = [];
  const area = view.closest('.jp-OutputArea-output') || view.parentElement;
  const edge = Math.min(box.right, area.getBoundingClientRect().right);
  if (box.right > area.getBoundingClientRect().right + 1) out.push(`the view: ${box.right - edge}px`);
  for (const el of view.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > edge + 1) out.push(`${el.outerHTML.slice(0, 100)}: ${Math.round(r.right - edge)}px`);
  }
  return out;
}"""
# A chart's texts as the browser lays them out: each point's name, tick label and axis title, with its box.
CHART_TEXTS = """svg => [...svg.querySelectorAll('text')].map(t => {
  const b = t.getBBox(); return {text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height};
})"""
MEASURE = """bar => ({
    width: bar.getBoundingClientRect().width, total: Number(bar.dataset.total),
    segments: [...bar.children].map(s => ({status: s.dataset.status, count: Number(s.dataset.count),
                                            width: s.getBoundingClientRect().width,
                                            colour: getComputedStyle(s).backgroundColor}))
})"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """JupyterLab over a copy of notebooks/ and data/, and a headless Chromium page logged in to it."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (`apt-get install chromium`; .ci/run does it)")
    from playwright.sync_api import sync_playwright

    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "lab"
    fresh = shutil.ignore_patterns("*.duckdb*")  # ledgers a person's own runs left (notebooks 01-04 write to data/)
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=fresh)
    shutil.copytree(ROOT / "data", root / "data", ignore=fresh)
    port, token = _free_port(), "llmledger-test"
    env = {
        k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "LLMLEDGER_PROGRESS", "LLMLEDGER_STORE")
    }
    args = [
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--allow-root",
        "--LabApp.news_url=",
        "--LabApp.expose_app_in_browser=True",
    ]
    log_path = tmp / "lab.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", *args], env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()[-2000:]
                time.sleep(0.3)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                headless=True,
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                ],
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            yield {"page": page, "base": base, "token": token, "tmp": tmp}
            browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def run_all(lab: dict[str, Any], name: str) -> Any:
    """Open the notebook, Run All Cells, wait until every code cell has run; fail with the first traceback."""
    page, base, token = lab["page"], lab["base"], lab["token"]
    page.goto(f"{base}/lab/tree/notebooks/{name}?reset&token={token}")  # reset: only this notebook open
    page.wait_for_selector(".jp-Notebook >> visible=true", timeout=60_000)
    page.wait_for_function(KERNEL_READY, timeout=60_000)
    # the same command as Run ▸ Run All Cells, asked of the app itself so a slow menu cannot miss it
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    accept = page.locator(".jp-Dialog button.jp-mod-accept")  # a kernel to pick: the notebook's own
    deadline = time.monotonic() + int(os.environ.get("LLMLEDGER_BROWSER_TIMEOUT", "240"))
    while True:
        state = page.evaluate(PROGRESS)
        assert state["error"] is None, f"{name} raised:\n{state['error']}"
        if state["ran"] == state["cells"] and not state["busy"]:
            return page
        if accept.count():
            accept.click()
        if time.monotonic() > deadline:
            page.screenshot(path=str(lab["tmp"] / f"{name}-stuck.png"))
            raise AssertionError(f"{name} did not finish: {state}; see {lab['tmp'] / f'{name}-stuck.png'}")
        time.sleep(0.25)


def notebook(page: Any) -> Any:
    """The notebook on screen (not one JupyterLab keeps open in the background)."""
    return page.locator(".jp-NotebookPanel >> visible=true")


def bars(page: Any) -> list[dict[str, Any]]:
    """Every status bar of the notebook, scrolled into view and measured."""
    out = []
    for bar in notebook(page).locator(".llmledger-bar").all():
        bar.scroll_into_view_if_needed()
        out.append(bar.evaluate(MEASURE))
    return out


def screenshots(lab: dict[str, Any], page: Any, name: str) -> list[Path]:
    """Each llmledger view of the notebook, as the reader sees it."""
    keep = os.environ.get("LLMLEDGER_SCREENSHOTS")
    shots = []
    for i, view in enumerate(notebook(page).locator(".llmledger-view").all()):
        view.scroll_into_view_if_needed()
        path = lab["tmp"] / f"{name.removesuffix('.ipynb')}-{i}.png"
        view.screenshot(path=str(path))
        shots.append(path)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, keep)
    return shots


def paid(text: str, what: str) -> int:
    match = re.search(rf"{what} paid (\d+) calls", text)
    assert match, f"no '{what} paid N calls' in the output"
    return int(match.group(1))


def shut_down_kernels(lab: dict[str, Any]) -> None:
    url = f"{lab['base']}/api/sessions?token={lab['token']}"
    for session in json.load(urllib.request.urlopen(url, timeout=10)):
        request = urllib.request.Request(
            f"{lab['base']}/api/sessions/{session['id']}?token={lab['token']}", method="DELETE"
        )
        urllib.request.urlopen(request, timeout=10)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_views_in_jupyterlab(lab: dict[str, Any], name: str) -> None:
    try:
        page = run_all(lab, name)
        nb = notebook(page)
        measured = bars(page)
        assert measured, "every notebook draws at least one status bar (a run's view, or llmledger.show)"
        for bar in measured:
            counted = sum(s["count"] for s in bar["segments"])
            assert counted == bar["total"] and bar["width"] > 300
            slack = 2.0 * len(bar["segments"]) + 1  # a segment is at least 2 px wide, so a tiny one can be seen
            for s in bar["segments"]:
                expected = s["count"] / bar["total"] * bar["width"]
                assert abs(s["width"] - expected) <= slack, (name, s, expected, bar)
                assert (s["colour"] == FAILED_RGB) == (s["status"] == "FAILED"), (name, s)

        # nothing twice: each cell shows at most one view, every live view became its summary, and no cell
        # with a view also prints the summary as text
        for cell in nb.locator(".jp-CodeCell").all():
            views = cell.locator(".llmledger-view")
            assert views.count() <= 1, f"{name}: a cell shows {views.count()} views"
            if cell.locator(".llmledger-summary").count():
                text = cell.locator(".jp-OutputArea").inner_text()
                assert text.count("calls paid") == 1, f"{name}: the summary is shown twice:\n{text}"
        assert nb.locator(".llmledger-status").count() == 0, "a live view that never became its summary"
        assert nb.locator(".jp-RenderedHTML .llmledger-summary").count() == nb.locator(".llmledger-summary").count(), (
            "every summary is plain HTML, which the saved notebook keeps"
        )
        assert nb.locator("[data-field='simulated']").count() == nb.locator(".llmledger-summary").count(), (
            "every run's view says its answers are simulated"
        )

        assert nb.locator(".llmledger-view mjx-container, .llmledger-view .MathJax").count() == 0, (
            "a view's costs were typeset as math"
        )
        for view in nb.locator(".llmledger-view").all():  # the text as rendered: each cost a $ and its figure
            shown = view.inner_text()
            assert shown.count("$") == len(re.findall(r"\$\d", shown)), f"{name}: a $ without its figure: {shown}"
        text = "\n".join(out.text_content() for out in nb.locator(".jp-OutputArea").all())
        assert "simulated answers, not Claude's" in text, "the setup cell says the answers are simulated"
        if name.startswith("01"):
            summaries = nb.locator(".llmledger-summary")
            assert summaries.count() == 2, "two runs, one view each"
            assert int(summaries.nth(0).locator("[data-field='calls paid']").inner_text()) > 300
            assert summaries.nth(1).locator("[data-field='calls paid']").inner_text() == "0", "the rerun paid 0"
            assert paid(text, "this run") > 300 and paid(text, "the same cell again") == 0
            assert nb.locator(".llmledger-store .llmledger-bar").count() == 1, "llmledger.show draws the step"
        if name.startswith("02"):
            failed = [s for bar in measured for s in bar["segments"] if s["status"] == "FAILED"]
            assert failed and all(s["count"] == 3 and s["colour"] == FAILED_RGB for s in failed), failed
            assert nb.locator(".llmledger-error").first.inner_text().startswith("3 rows: 400 BadRequestError")
            assert paid(text, "rerun of the failed rows") == 3 and paid(text, "redo of the flagged rows") == 2
            assert "flagged: looks wrong" in text, "the replaced answers are kept, with why"
        if name.startswith("04"):
            assert paid(text, "the pipeline") > 600, "300 rows, three steps (a few duplicate reviews share answers)"
            assert paid(text, "the rerun") == 0 and paid(text, "a plain rerun") == 0, "stale rows are not re-paid"
            assert "struct[3]" in text, "the extract step is a typed column"
            assert paid(text, "the redo of the flagged rows") == 5  # then classify's 5, and summarise's whose team
            assert 5 <= paid(text, "the redo of the stale rows") <= 10  # changed (its request with it)
            stale = [s for bar in measured for s in bar["segments"] if s["status"] == "stale"]
            assert [s["count"] for s in stale] == [5, 5], "llmledger.show: five stale rows in both later steps"
            assert "flagged: vague product" in text
        if name.startswith("05"):
            assert nb.locator(".llmledger-batch").count() == 1, "the batch in progress is listed"
            assert re.search(r"9\d\d done · .* · 9\d\d of them from batches", text), "a later cell collected it"
            estimated, billed = map(
                float, re.search(r"estimated for the batch: \$([\d.]+); billed: \$([\d.]+)", text).groups()
            )  # type: ignore[union-attr]
            assert billed > 0 and abs(estimated - billed) <= 0.25 * billed
            # a positive amount, at the default model's prices (a few tenths of a cent for these 1,000 rows)
            assert re.search(r"batch prices \$0\.\d*[1-9]", text), "the batch discount is counted as avoided"
            assert re.search(r"the rerun paid 0 calls and avoided \$0\.\d*[1-9]", text)
        if name.startswith("07"):
            assert paid(text, "this run") == 12 and paid(text, "after moving the files") == 0
            assert paid(text, "the redo of the stale rows") == 1 and "agrees with the file names on 12 of 12" in text
            done = [s for bar in measured for s in bar["segments"] if s["status"] == "DONE"]
            assert [s["count"] for s in done] == [12, 12], "llmledger.show: both steps, every document DONE"
        assert all(p.stat().st_size > 5_000 for p in screenshots(lab, page, name))
        for chart in nb.locator(".llmledger-chart").all():  # compare's chart: every text readable, none cut off
            chart.scroll_into_view_if_needed()
            texts = chart.evaluate(CHART_TEXTS)
            width, height = float(chart.get_attribute("width")), float(chart.get_attribute("height"))
            for i, a in enumerate(texts):
                assert a["x"] >= 0 and a["y"] >= 0 and a["x"] + a["w"] <= width and a["y"] + a["h"] <= height, a
                for b in texts[i + 1 :]:
                    apart = a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"]
                    assert apart or b["y"] + b["h"] <= a["y"], f"{name}: {a} overlaps {b}"
        if name.startswith("06"):
            assert nb.locator(".llmledger-chart").count() >= 1, "compare draws its chart"
        for width in (900, 1920):  # a narrow window and a wide one: nothing of any view is cut off
            page.set_viewport_size({"width": width, "height": 1000})
            page.wait_for_timeout(300)
            for view in nb.locator(".llmledger-view").all():
                sticking = view.evaluate(OVERFLOW)
                assert not sticking, f"{name} at {width}px: {sticking[:3]}"
        page.set_viewport_size({"width": 1400, "height": 1000})
    finally:
        shut_down_kernels(lab)
