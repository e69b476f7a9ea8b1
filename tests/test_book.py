"""`make book` (scripts/book.py) on two lessons, built once for the module: the pages work from the
files alone. Chromium, with the network off, opens the index and both lessons by file:// URL:
every page loads nothing but files beside it, a lesson's Plotly figures are drawn (an SVG inside
each plot div), a widget is there as a snapshot with its figures drawn, and each exercise's
solution is folded in a <details> that opens on a click. The widget snapshot renderer is
checked on a hand-made widget state too.

Lessons 01 and 06: the quickest to run, each with a widget and figures.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from helpers import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
LESSONS = ("01_tensor_expressions_and_rtiles", "06_irregular_shapes")
RENDER_TIMEOUT_MS = 60_000


def book_module():
    spec = importlib.util.spec_from_file_location("book", ROOT / "scripts" / "book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The book of LESSONS (run here, one at a time) in a temporary folder."""
    out = tmp_path_factory.mktemp("book")
    book_module().build([ROOT / "notebooks" / f"{name}.ipynb" for name in LESSONS], out, log=lambda _: None)
    return out


@pytest.mark.slow
def test_site_files(site):
    assert sorted(p.name for p in site.iterdir()) == sorted([*(f"{n}.html" for n in LESSONS), "index.html", "plotly.min.js"])
    index = (site / "index.html").read_text()
    for name in LESSONS:
        assert f'href="{name}.html"' in index
        text = (site / f"{name}.html").read_text()
        # nothing fetched from elsewhere: every script and stylesheet is inline or a file beside it
        sources = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="([^"]+)"', text)
        assert sources and all(not re.match(r"[a-z]+://|//", s) for s in sources), sources
        assert "widget-snapshot" in text and "application/vnd.jupyter.widget-state" not in text
        assert text.count('<details class="solution">') >= 2


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (`make test` installs it: apt-get install -y chromium)")
def test_pages_render_in_chromium_from_files(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1200, "height": 1600})
            requested, errors = [], []
            context.on("request", lambda request: requested.append(request.url))
            page = context.new_page()
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto((site / "index.html").as_uri())
            links = page.locator("li a")
            assert links.count() == len(LESSONS)
            links.first.click()
            page.wait_for_url(re.compile(f"{LESSONS[0]}.html$"))
            for name in LESSONS:
                page.goto((site / f"{name}.html").as_uri())
                plots = page.locator(".js-plotly-plot")
                page.wait_for_function("document.querySelectorAll('.plotly-figure').length > 0 && "
                                       "[...document.querySelectorAll('.plotly-figure')].every(d => d.querySelector('svg.main-svg'))",
                                       timeout=RENDER_TIMEOUT_MS)
                assert plots.count() == page.locator(".plotly-figure").count() >= 2
                assert page.locator(".widget-snapshot .js-plotly-plot svg.main-svg").count() >= 1
                solution = page.locator("details.solution").first
                assert not solution.evaluate("d => d.open")
                solution.locator("summary").click()
                assert solution.evaluate("d => d.open")
                assert "Right" in solution.inner_text()
                assert page.locator("text=Not yet").count() >= 2  # the exercise cells' own verdicts
            assert not errors, errors
            assert requested and all(url.startswith("file://") for url in requested), requested
        finally:
            browser.close()


def test_widget_snapshot_from_state():
    book = book_module()
    figure = {"data": [{"type": "bar", "x": [1], "y": [2]}], "layout": {"title": {"text": "footprint vs capacity"}}}
    states = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_html", "IPY_MODEL_row", "IPY_MODEL_out"]}},
        "html": {"model_name": "HTMLModel", "state": {"value": "<b>Step 3</b> of 9"}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_next", "IPY_MODEL_slider"]}},
        "next": {"model_name": "ButtonModel", "state": {"description": "Next"}},
        "slider": {"model_name": "IntSliderModel", "state": {"description": "step", "value": 3, "min": 0, "max": 9}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "display_data", "data": {book.PLOTLY_MIME: figure, "text/plain": "<plotly figure>"}}]}},
    }
    live = book.widget_html(states, "box", book.plotly_div)
    assert "<b>Step 3</b> of 9" in live and "<button disabled>Next</button>" in live
    assert 'value="3"' in live and "Plotly.newPlot" in live and '"footprint vs capacity"' in live
    saved = book.widget_html(states, "box", book.saved_figure(None))
    assert "Plotly" not in saved and "figure: footprint vs capacity" in saved
    imaged = book.widget_html(states, "box", book.saved_figure(lambda figure: "UE5H"))
    assert '<img alt="footprint vs capacity" src="data:image/png;base64,UE5H">' in imaged
    assert "not recorded" in book.widget_html(states, "missing", book.plotly_div)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium")
def test_figure_images(tmp_path):
    """A saved notebook's figure image: a PNG of the figure's own height, drawn offline."""
    import base64
    import struct

    book = book_module()
    figure = {"data": [{"type": "bar", "x": [1, 2], "y": [2, 3]}], "layout": {"height": 300, "title": {"text": "t"}}}
    with book.FigureImages(tmp_path) as images:
        png = base64.b64decode(images.png(figure))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (book.FigureImages.WIDTH_PX, 300)
