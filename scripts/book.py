"""Build the lessons' book: execute every notebook (or the ones named) one at a time and write a
static site, one HTML page per lesson and an index, that works from the files alone (no server,
no network). `make book` runs it; `make lessons` also saves the outputs into notebooks/.

    python scripts/book.py [--out book] [--save] [notebooks/NAME.ipynb ...]

In the pages every output is in place: Plotly figures are drawn by plotly.js, written once
beside the pages (`plotly.min.js`); a widget is shown as a static snapshot of its view at the end
of the run (its HTML parts, its figures, its controls greyed out), rebuilt from the widget state
the execution recorded; a solution cell is folded into a <details>.

`--save` writes each executed notebook back with light outputs, for GitHub's and JupyterLab's
views before anyone runs it: no widget state, the same widget snapshots (as HTML, their figures
as PNG images), every figure as a PNG image (GitHub) and as Plotly's own JSON (JupyterLab)
unless that is over FIGURE_BUDGET. The images are drawn by plotly.js in Debian's Chromium
(`FigureImages`); without it the figures keep their JSON, and a widget's its titles.

The kernel is this interpreter (a `python3` kernel spec in a temporary JUPYTER_PATH, as
tests/test_notebooks.py does), with PYTHONPATH the checkout and PLOTLY_RENDERER=plotly_mimetype,
so a figure is saved as its JSON and not with plotly.js inlined (megabytes per notebook).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import html
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import plotly
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TEMPLATES = Path(__file__).resolve().parent / "book_template"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
CELL_TIMEOUT_S = 300  # as tests/test_notebooks.py: profiling builds kernels in worker processes
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# A saved notebook keeps a figure's JSON up to this size; a larger one (a curve per kernel over
# thousands of values) is left to the book and to running the cell.
FIGURE_BUDGET = 300_000
_FIGURE_IDS = itertools.count(1)  # a page's figure divs need distinct ids


def kernel_env(tmp: Path) -> dict[str, str]:
    """The environment of the kernels: a `python3` spec running this interpreter first in
    JUPYTER_PATH, the checkout on PYTHONPATH, figures as Plotly JSON, temporary files in `tmp`."""
    spec = tmp / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    (tmp / "kernel-tmp").mkdir(exist_ok=True)
    return {"JUPYTER_PATH": str(tmp / "jupyter"), "TMPDIR": str(tmp / "kernel-tmp"), "PLOTLY_RENDERER": "plotly_mimetype",
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """`env` set in this process while the block runs: the kernel spec is looked up here, and the
    kernel inherits the rest."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def execute(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`, run top to bottom in its folder, with its widget state recorded;
    CellExecutionError on the first failing cell."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", store_widget_state=True, record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


# Widget snapshots: the view of a widget rebuilt from its recorded state (ipywidgets' models).

def _ref(value) -> str | None:
    return value[len("IPY_MODEL_"):] if isinstance(value, str) and value.startswith("IPY_MODEL_") else None


def plotly_div(figure: dict) -> str:
    """A Plotly figure (its JSON) as a div that plotly.js draws: the book's form."""
    div = f"figure-{next(_FIGURE_IDS)}"
    payload = json.dumps(figure).replace("</", "<\\/")  # no "</script>" inside the script
    return (f'<div class="plotly-figure" id="{div}"></div>'
            f'<script>(function () {{ var f = {payload}; '
            f'Plotly.newPlot("{div}", f.data || [], f.layout || {{}}, {{responsive: true}}); }})();</script>')


def figure_title(figure: dict) -> str:
    return ((figure.get("layout") or {}).get("title") or {}).get("text") or "figure"


class FigureImages:
    """PNG images (base64) of Plotly figures, drawn by plotly.js in Debian's headless Chromium
    through Playwright, offline, for the saved notebooks: GitHub's view draws no Plotly JSON.
    `png` is None where Chromium or Playwright is missing; the saved figures then keep their
    JSON (or title) only."""

    CHROMIUM = Path("/usr/bin/chromium")
    WIDTH_PX = 760  # the width of a notebook's output area; the height is the figure's own

    def __init__(self, folder: Path):
        self.folder, self.png = folder, None

    def __enter__(self) -> FigureImages:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            return self
        if not self.CHROMIUM.exists():
            return self
        page = self.folder / "render.html"
        page.write_text(f'<!DOCTYPE html><html><head><script src="{PLOTLY_JS.as_uri()}"></script></head><body></body></html>')
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=str(self.CHROMIUM),
                                                         args=["--headless", "--no-sandbox", "--disable-gpu"])
        self._page = self._browser.new_context(offline=True).new_page()
        self._page.goto(page.as_uri())
        self.png = self._png
        return self

    def _png(self, figure: dict) -> str:
        script = """async ([f, width]) => {
            const layout = Object.assign({}, f.layout || {});
            const url = await Plotly.toImage({data: f.data || [], layout: layout},
                                             {format: "png", width: width, height: layout.height || 450});
            return url.split(",")[1];
        }"""
        return self._page.evaluate(script, [figure, self.WIDTH_PX])

    def __exit__(self, *exc) -> None:
        if self.png is not None:
            self._browser.close()
            self._playwright.stop()


def saved_figure(png):
    """How a saved notebook's widget snapshot shows a figure: its PNG image where `png` draws
    one, else its title."""
    def draw(figure: dict) -> str:
        if png is not None:
            return f'<img alt="{html.escape(figure_title(figure))}" src="data:image/png;base64,{png(figure)}">'
        return f'<p class="widget-note"><i>figure: {html.escape(figure_title(figure))} (drawn when the cell runs)</i></p>'
    return draw


def output_html(output: dict, states: dict, draw) -> str:
    """One output (a notebook's or an Output widget's) as HTML, figures drawn by `draw`."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if kind == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    data = output.get("data", {})
    if WIDGET_VIEW in data:
        return widget_html(states, data[WIDGET_VIEW]["model_id"], draw)
    if PLOTLY_MIME in data:
        return draw(data[PLOTLY_MIME])
    if "text/html" in data:
        return "".join(data["text/html"])
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"]}">'
    return f"<pre>{html.escape(''.join(data.get('text/plain', '')))}</pre>"


def widget_html(states: dict, model_id: str, draw) -> str:
    """The view of widget `model_id` from the recorded `states` (model id -> model): boxes as
    boxes, HTML as its HTML, an Output widget's outputs (figures drawn by `draw`: JSON -> HTML),
    controls drawn disabled at their value."""
    model = states.get(model_id)
    if model is None:
        return '<p class="widget-note">(a widget whose state was not recorded)</p>'
    name, state = model.get("model_name", ""), model.get("state", {})
    label = html.escape(state.get("description") or "")
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        inner = "".join(widget_html(states, _ref(c), draw) for c in state.get("children", ()) if _ref(c))
        return f'<div class="{"widget-hbox" if name == "HBoxModel" else "widget-vbox"}">{inner}</div>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return (f"<b>{label}</b> " if label else "") + state.get("value", "")
    if name == "LabelModel":
        return f"<span>{html.escape(str(state.get('value', '')))}</span>"
    if name == "OutputModel":
        return "".join(output_html(o, states, draw) for o in state.get("outputs", ()))
    if name in ("ButtonModel", "ToggleButtonModel"):
        return f"<button disabled>{label or html.escape(state.get('tooltip') or '')}</button>"
    if name in ("IntSliderModel", "FloatSliderModel", "PlayModel", "IntProgressModel", "FloatProgressModel"):
        value, low, high = state.get("value", 0), state.get("min", 0), state.get("max", 100)
        return (f'<label>{label} <input type="range" disabled min="{low}" max="{high}" value="{value}"> '
                f"{html.escape(str(value))}</label>")
    if name in ("DropdownModel", "ToggleButtonsModel", "RadioButtonsModel", "SelectModel"):
        labels, index = state.get("_options_labels", ()), state.get("index")
        chosen = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""
        return f"<label>{label} <select disabled><option>{html.escape(str(chosen))}</option></select></label>"
    if name == "CheckboxModel":
        checked = " checked" if state.get("value") else ""
        return f'<label><input type="checkbox" disabled{checked}> {label}</label>'
    if name in ("TextModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel", "BoundedFloatTextModel"):
        return f'<label>{label} <input disabled value="{html.escape(str(state.get("value", "")))}"></label>'
    return f'<span class="widget-note">({html.escape(name)})</span>'


def snapshot(states: dict, model_id: str, draw) -> str:
    """A widget's static view, framed and labelled as such."""
    return (f'<div class="widget-snapshot">{widget_html(states, model_id, draw)}'
            f'<p class="widget-note">A snapshot of the widget at the end of the run: run the notebook to use it.</p></div>')


def rendered(nb: nbformat.NotebookNode, book: bool, png=None) -> nbformat.NotebookNode:
    """A copy of an executed notebook with its widget outputs as snapshots (HTML) and no widget
    state. For the `book`, figures are plotly.js divs. For a saved notebook, a figure keeps its
    JSON (JupyterLab draws it) up to FIGURE_BUDGET, plus its PNG image where `png` draws one
    (GitHub shows that); a widget's figures are its images, or their titles."""
    nb = copy.deepcopy(nb)
    states = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    draw = plotly_div if book else saved_figure(png)
    for cell in nb.cells:
        for out in cell.get("outputs", ()):
            data = out.get("data")
            if data is None:
                continue
            if WIDGET_VIEW in data:
                kind = "".join(data.get("text/plain", "")).split("(", 1)[0] or "widget"
                out["data"] = {"text/html": snapshot(states, data[WIDGET_VIEW]["model_id"], draw),
                               "text/plain": f"<{kind}: run the cell to use it>"}
            elif PLOTLY_MIME in data:
                figure, text = data[PLOTLY_MIME], f"<plotly figure: {figure_title(data[PLOTLY_MIME])}>"
                if book:
                    out["data"] = {"text/html": plotly_div(figure), "text/plain": text}
                    continue
                out["data"] = {"text/plain": text}
                if len(json.dumps(figure)) <= FIGURE_BUDGET:
                    out["data"][PLOTLY_MIME] = figure
                if png is not None:
                    out["data"]["image/png"] = png(figure)
    return nb


def title_of(nb: nbformat.NotebookNode) -> str:
    first = nb.cells[0].source.splitlines()[0]
    return first.lstrip("# ").strip()


def exercises_of(nb: nbformat.NotebookNode) -> list[str]:
    return [c.metadata["exercise"] for c in nb.cells if "exercise" in c.metadata.get("tags", ())]


def page(nb: nbformat.NotebookNode, name: str, nav: str) -> str:
    exporter = HTMLExporter(template_name="book", extra_template_basedirs=[str(TEMPLATES)])
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title_of(nb)}, "book_nav": nav})
    return body


def nav_html(names: list[str], titles: dict[str, str], i: int) -> str:
    links = ['<a href="index.html">All lessons</a>']
    if i > 0:
        links.append(f'<a href="{names[i - 1]}.html">&larr; {html.escape(titles[names[i - 1]])}</a>')
    if i + 1 < len(names):
        links.append(f'<a href="{names[i + 1]}.html">{html.escape(titles[names[i + 1]])} &rarr;</a>')
    return " ".join(links)


def index_html(names: list[str], titles: dict[str, str], counts: dict[str, int]) -> str:
    items = "".join(f'<li><a href="{n}.html">{html.escape(titles[n])}</a> <small>({counts[n]} exercises)</small></li>'
                    for n in names)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tile-workbench lessons</title>"
            "<style>body { font-family: sans-serif; max-width: 760px; margin: 32px auto; line-height: 1.5 }</style>"
            "</head><body><h1>tile-workbench lessons</h1>"
            "<p>The lesson notebooks of <code>notebooks/</code>, run top to bottom on the machine that built this "
            "book, with every output in place. Figures are interactive; widgets are snapshots of their view at the "
            "end of the run (run the notebook in Jupyter to use them). Each lesson has exercises that check "
            "themselves; the solutions are folded under each exercise.</p>"
            f"<ol>{items}</ol></body></html>")


def build(paths: list[Path], out: Path, save: bool = False, log=print) -> dict[str, nbformat.NotebookNode]:
    """Execute `paths` one at a time and write their pages, the index and plotly.min.js into
    `out`; with `save`, also write each executed notebook back in its light form. Returns the
    executed notebooks by name (their widget state included)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PLOTLY_JS, out / "plotly.min.js")
    executed = {}
    with tempfile.TemporaryDirectory(prefix="workbench-book-") as tmp:
        with environment(kernel_env(Path(tmp))):
            for path in paths:
                start = time.monotonic()
                executed[path.stem] = execute(path)
                log(f"{path.name}: ran in {time.monotonic() - start:.0f} s")
        if save:  # after every run: Chromium does not share the 2 cores with a kernel
            with FigureImages(Path(tmp)) as images:
                for path in paths:
                    nbformat.write(rendered(executed[path.stem], book=False, png=images.png), path)
    names = list(executed)
    titles = {n: title_of(nb) for n, nb in executed.items()}
    for i, name in enumerate(names):
        (out / f"{name}.html").write_text(page(rendered(executed[name], book=True), name, nav_html(names, titles, i)))
    (out / "index.html").write_text(index_html(names, titles, {n: len(exercises_of(nb)) for n, nb in executed.items()}))
    return executed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--out", type=Path, default=ROOT / "book", help="the site's folder (default: book/)")
    parser.add_argument("--save", action="store_true", help="also save the outputs into the notebooks")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    build(paths, args.out, save=args.save)
    print(f"book: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
