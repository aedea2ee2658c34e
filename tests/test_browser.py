"""The dashboard in a real browser: JupyterLab on 127.0.0.1, headless Chromium, Run All Cells."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.jupyter


ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


KERNEL_READY = """() => {
    const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const ctx = nb && nb.sessionContext;
    return !!(ctx && ctx.isReady && ctx.session && ctx.session.kernel
              && ctx.session.kernel.connectionStatus === 'connected');
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_quickstart_dashboard_renders_in_jupyterlab(tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (`apt-get install chromium`; .ci/run does it)")
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    shutil.copytree(ROOT / "data", root / "data")
    port, token = _free_port(), "llmledger-test"
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "LLMLEDGER_PROGRESS")}
    env["LLMLEDGER_STORE"] = str(tmp_path / "ledger.duckdb")
    args = ["--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}", "--allow-root", "--LabApp.news_url=",
            "--LabApp.expose_app_in_browser=True"]
    log = (tmp_path / "lab.log").open("w")
    lab = subprocess.Popen([sys.executable, "-m", "jupyterlab", *args], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert lab.poll() is None and time.monotonic() < deadline, (tmp_path / "lab.log").read_text()[-2000:]
                time.sleep(0.3)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/notebooks/01_quickstart.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=60_000)
            page.wait_for_function(KERNEL_READY, timeout=60_000)
            # the same command as Run ▸ Run All Cells, asked of the app itself so a slow menu cannot miss it
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            # JupyterLab may first ask which kernel to start: take the notebook's own (Python 3)
            select = page.locator(".jp-Dialog button.jp-mod-accept")
            deadline = time.monotonic() + int(os.environ.get("LLMLEDGER_BROWSER_TIMEOUT", "180"))
            while page.locator(".llmledger-summary").count() < 2:
                if select.count():
                    select.click()
                if time.monotonic() > deadline:
                    page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
                    raise AssertionError(f"the notebook did not finish; see {tmp_path / 'failure.png'}")
                time.sleep(0.25)
            dashboards = page.locator(".llmledger-dashboard")
            assert dashboards.count() >= 1, "the live dashboard widget rendered"
            first = dashboards.first
            done = int(first.locator("td[data-field='DONE']").inner_text().replace(",", ""))
            assert done > 300
            assert first.locator("[data-field='outcome']").inner_text() == "completed"
            assert int(first.locator("td[data-field='FAILED']").inner_text()) == 0
            summary = page.locator(".llmledger-summary").last
            assert summary.locator("td[data-field='calls paid']").inner_text() == "0", "the rerun paid nothing"
            first.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "quickstart.png"), full_page=False)
            browser.close()
        assert (tmp_path / "quickstart.png").stat().st_size > 10_000
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=15)
        except subprocess.TimeoutExpired:
            lab.kill()
        log.close()
