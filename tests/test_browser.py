"""Real-browser smoke test: `streamlit run app.py` in a subprocess, driven by Debian's headless
chromium through Playwright. Every page renders its main sections with no exception box, a Next
click re-renders the construction, and a screenshot of each page lands in tests/artifacts/. The text a
page shows (captions, tables' accessible text, chart labels; not kernel sources, which are code)
holds no "nan", no "Traceback" and no Python dictionary text. The server's workspace holds a runs
store with fake-profiled runs and a fitted correction, so the Runs page draws its history and the
correction, and the Candidates page its corrected column. On the What-if page one edit, typed into
a field's input, renders the diff of the two constructions with its links into the Construction
page.

`make test` installs /usr/bin/chromium where it is missing (CI runs as root), so the skip below
only happens on a machine where that install was not possible.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_TIMEOUT_S = 90
RENDER_TIMEOUT_MS = 90_000
# (url path, title, plotly charts on the default workload, a main section that must be drawn)
PAGES = (
    ("", "Workload", 0, "text=matmul: axes"),
    ("construction", "Construction", 3, "[data-testid='stSlider']"),
    ("candidates", "Candidates", 1, "text=corrected: the model's prediction corrected"),
    ("kernel", "Kernel", 0, "[data-testid='stCode']"),
    ("export", "Export", 0, "button:has-text('Build the bundle')"),
    ("runs", "Runs", 3, "text=Stored correction of"),  # best so far, predicted vs measured, before/after
    ("models", "Models", 2, "[data-testid='stDataFrame']"),
    ("dynamic", "Dynamic shapes", 1, "[data-testid='stDataFrame']"),
    ("whatif", "What-if", 0, "text=Edit a field above"),
)
# The What-if page's edit: a 64^3 matmul on the A100 (a construction of about a second), whose top-1
# changes when the shared memory per SM drops to a quarter.
WHATIF_LINK = "whatif?op=matmul&shape=K%3D64%2CM%3D64%2CN%3D64&device=a100&policy=roller&topk=3"

# What a page must never show: a missing number printed as such, a Python error, a dict's repr.
FORBIDDEN = (re.compile(r"\bnan\b", re.IGNORECASE), re.compile(r"Traceback"), re.compile(r"\{'"))
# The page's text without code blocks (kernel sources and TVMScript are code, not the page's words)
# and without style sheets; chart labels (SVG text) included.
SHOWN_TEXT = """() => {
  const main = document.querySelector("[data-testid='stMain']") || document.body;
  const copy = main.cloneNode(true);
  copy.querySelectorAll("[data-testid='stCode'], style, script").forEach(e => e.remove());
  return copy.textContent;
}"""

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (`make test` installs it: apt-get install -y chromium)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _workspace(folder: Path) -> Path:
    """A workspace whose runs store holds fake-profiled runs of four small matmuls on this machine
    and the correction fitted on them, so the Runs page draws its charts and the Candidates page
    its corrected column (and the test never reads the user's own runs store)."""
    from workbench import pipeline
    from workbench.pipeline import Options
    from workbench.profile.fake import FakeRunner
    from workbench.profile.store import RunStore
    from workbench.workload import Workload

    folder.mkdir()
    spec = pipeline.load_device("local-cpu")
    with RunStore(folder / "runs.sqlite3") as store:
        for seed, n in enumerate((32, 48, 64, 96)):
            work = Workload(op="matmul", params=(("K", n), ("M", n), ("N", n)))
            construction = pipeline.construct(pipeline.request(work, spec, "roller", Options(topk=4)))
            pipeline.profile(construction, FakeRunner(seed=seed), label=f"mm-{n}", store=store)
        pipeline.refit(store, spec.name)
    return folder


@pytest.fixture
def server(tmp_path):
    """The dashboard on a free port (its URL and process id), started in the repository root as
    `make app` starts it, on a workspace of its own (`_workspace`); the server and anything it
    started are killed afterwards."""
    env = dict(os.environ, WORKBENCH_WORKSPACE=str(_workspace(tmp_path / "workspace")))
    port = free_port()
    command = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
               "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    with open(tmp_path / "streamlit.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            _wait_healthy(proc, port, tmp_path / "streamlit.log")
            yield f"http://127.0.0.1:{port}", proc.pid
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its children only
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"streamlit did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")


def _rendered(page, title: str, charts: int, section: str = "") -> None:
    """Wait until the page's title, its main section and its charts are drawn and the script has
    finished."""
    page.wait_for_selector(f"h1:has-text('{title}')", timeout=RENDER_TIMEOUT_MS)
    if section:
        page.wait_for_selector(section, timeout=RENDER_TIMEOUT_MS)
    if charts:
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {charts}", timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=RENDER_TIMEOUT_MS)


def test_every_page_renders_in_chromium(server):
    from playwright.sync_api import sync_playwright

    server, _ = server  # the URL
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            for path, title, charts, section in PAGES:
                page.goto(f"{server}/{path}")
                _rendered(page, title, charts, section)
                page.screenshot(path=str(ARTIFACTS / f"{title.lower()}.png"), full_page=True)
                assert page.locator("[data-testid='stException']").count() == 0, f"{title}: exception box shown"
                assert page.locator("[data-testid='stAlertContentError']").count() == 0, f"{title}: error shown"
                _shows_no_raw_values(page, title)
            _next_click(page, server)
            _select_on_the_roofline(page, server)
        finally:
            browser.close()


def _shows_no_raw_values(page, title: str) -> None:
    text = page.evaluate(SHOWN_TEXT)
    assert title.split()[0] in text  # the text was read at all (the page title is in it)
    for pattern in FORBIDDEN:
        found = pattern.search(text)
        assert found is None, f"{title} shows {found.group()!r}: ...{text[max(0, found.start() - 80): found.end() + 80]}..."


def _next_click(page, server: str) -> None:
    """Reset, then Next: the step text follows and the graph is redrawn with the current step."""
    from playwright.sync_api import expect

    page.goto(f"{server}/construction")
    _rendered(page, "Construction", 3)
    page.get_by_role("button", name="Reset", exact=True).click()
    page.wait_for_selector("text=Step 0", timeout=RENDER_TIMEOUT_MS)
    page.get_by_role("button", name="Next", exact=True).click()
    page.wait_for_selector("text=Step 1", timeout=RENDER_TIMEOUT_MS)
    _rendered(page, "Construction", 3)
    # While Streamlit replaces the figure, the old and the new chart can both be in the page for
    # a moment: wait for the page to settle on one "current step" marker.
    expect(page.locator(".js-plotly-plot .legendtext:has-text('current step')")).to_have_count(1, timeout=RENDER_TIMEOUT_MS)
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(ARTIFACTS / "construction-step-1.png"), full_page=True)
    _shows_no_raw_values(page, "Construction at step 1")


def _select_on_the_roofline(page, server: str) -> None:
    """Box-select every point of the roofline: all candidates become picked (the multiselect)."""
    page.goto(f"{server}/candidates")
    _rendered(page, "Candidates", 1, "[data-testid='stMultiSelect']")
    area = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
    page.mouse.move(area["x"] + 2, area["y"] + 2)
    page.mouse.down()
    page.mouse.move(area["x"] + area["width"] / 2, area["y"] + area["height"] / 2, steps=5)
    page.mouse.move(area["x"] + area["width"] - 2, area["y"] + area["height"] - 2, steps=5)
    page.mouse.up()
    picker = page.locator("[data-testid='stMultiSelect']")
    page.wait_for_function("document.querySelector('[data-testid=\"stMultiSelect\"]').innerText.includes('10')", timeout=RENDER_TIMEOUT_MS)
    assert "10" in picker.inner_text()
    page.screenshot(path=str(ARTIFACTS / "candidates-selected.png"), full_page=True)
    _shows_no_raw_values(page, "Candidates with a selection")


def test_a_what_if_edit_renders_the_diff_in_chromium(server):
    """Type a quarter of the A100's shared memory into its input: the edited device is named, the
    walks' divergence links into the Construction page on both specs, and both top-Ks are drawn."""
    from playwright.sync_api import sync_playwright

    server, _ = server
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            page.goto(f"{server}/{WHATIF_LINK}")
            _rendered(page, "What-if", 0, "text=Edit a field above")
            page.get_by_text("layer shared", exact=True).click()  # open the layer's group
            box = page.get_by_label("shared.capacity_bytes (bytes)")
            box.fill("12288")
            box.press("Enter")
            page.wait_for_selector("text=Edited device: a100-shared.capacity_bytes-12288", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector("text=the top-1 program changes", timeout=RENDER_TIMEOUT_MS)
            _rendered(page, "What-if", 0, "text=The constructions diverge at")
            links = page.locator("a[href*='construction?']")
            assert links.count() == 2
            hrefs = [links.nth(i).get_attribute("href") for i in range(2)]
            assert all("step=" in h for h in hrefs) and "set=shared.capacity_bytes" in hrefs[1]
            # the changes and both top-Ks: tables draw after the text and links of the same run
            page.locator("[data-testid='stDataFrame']").nth(2).wait_for(timeout=RENDER_TIMEOUT_MS)
            assert page.locator("[data-testid='stDataFrame']").count() >= 3
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.locator("[data-testid='stAlertContentError']").count() == 0
            page.screenshot(path=str(ARTIFACTS / "whatif-edited.png"), full_page=True)
            _shows_no_raw_values(page, "What-if after an edit")
        finally:
            browser.close()
