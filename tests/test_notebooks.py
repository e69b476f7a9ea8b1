"""The lesson notebooks: committed with their outputs, light enough for GitHub's view (widgets as
snapshots, figures as Plotly JSON, `make lessons` writes them: scripts/book.py); each one uses a
workbench widget, has at least two exercises that check themselves (an exercise cell, then its
hidden solution), and runs top to bottom on this CPU, where every exercise cell's check says
"Not yet" for the value it starts from and every solution's says "Right".

The kernel is this interpreter: a kernel spec named `python3` (the notebooks' kernelspec) is
written to a temporary JUPYTER_PATH, which comes first in Jupyter's search, so a user-wide
`python3` spec pointing at another Python cannot be picked up instead.
"""

from __future__ import annotations

import json
import os
import sys

import nbformat
import pytest
from helpers import ROOT
from nbclient import NotebookClient

import workbench.widgets

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # one cell; profiling builds kernels in spawned workers (tens of seconds)
# A committed notebook's size: its text, tables and widget snapshots, and figures as Plotly JSON up
# to scripts/book.py's FIGURE_BUDGET each (the book has the larger ones).
NOTEBOOK_BUDGET = 1_000_000
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LESSONS = ("01_tensor_expressions_and_rtiles", "02_roller_step_through", "03_markov_transitions",
           "04_predicted_vs_profiled", "05_export_kernels", "06_irregular_shapes", "07_whole_models",
           "08_dynamic_shapes", "09_design_a_device")


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """JUPYTER_PATH with a `python3` kernel spec running this interpreter; PYTHONPATH with the
    checkout, so the kernel imports this `workbench` whether or not it is installed; TMPDIR in
    pytest's temporary directory, where the lessons' bundles and profile builds then go."""
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(spec_dir.parent.parent))
        mp.setenv("TMPDIR", str(tmp_path_factory.mktemp("kernel-tmp")))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
        yield


def test_every_lesson_is_there():
    assert set(LESSONS) <= {p.stem for p in NOTEBOOKS}


def verdicts(nb) -> dict[str, list[tuple[str, str]]]:
    """Per exercise number, (cell tag, the verdict's text) of its exercise and solution cells."""
    found = {}
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        for tag in ("exercise", "solution"):
            if tag in tags:
                texts = ["".join(o.get("data", {}).get("text/plain", "")) for o in cell.outputs]
                found.setdefault(cell.metadata["exercise"], []).append((tag, "".join(texts)))
    return found


def assert_checked(nb, name: str) -> None:
    """Every exercise's own cell says Not yet (its starting value), its solution says Right."""
    for number, cells in verdicts(nb).items():
        assert [tag for tag, _ in cells] == ["exercise", "solution"], f"{name}: exercise {number}: {cells}"
        (_, start), (_, solved) = cells
        assert start.startswith("Not yet: "), f"{name}: exercise {number} starts right: {start!r}"
        assert solved.startswith("Right: "), f"{name}: exercise {number}'s solution is not right: {solved!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_light_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert path.stat().st_size <= NOTEBOOK_BUDGET, f"{path.name}: {path.stat().st_size:,} B (make lessons)"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), f"{path.name}: run it whole (make lessons)"
    outputs = [o for cell in code for o in cell.outputs]
    assert not any(o.output_type == "error" for o in outputs)
    # a widget's view needs its state, which is not saved: it is saved as a snapshot instead
    assert "widgets" not in nb.metadata
    assert not any(WIDGET_VIEW in o.get("data", {}) for o in outputs)
    assert any("widget-snapshot" in "".join(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert_checked(nb, path.name)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercises_check_themselves(path):
    """At least two exercises: each an exercise cell calling a check of workbench.lessons, then
    its solution cell, hidden (collapsed in JupyterLab, folded in the book) and calling the same
    check."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if {"exercise", "solution"} & set(c.metadata.get("tags", []))]
    numbers = [c.metadata["exercise"] for c in cells if "exercise" in c.metadata["tags"]]
    assert len(numbers) >= 2 and len(set(numbers)) == len(numbers), f"{path.name}: {numbers}"
    assert "from workbench.lessons import exercises as ex" in next(c.source for c in nb.cells if c.cell_type == "code")
    for ask, solution in zip(cells[::2], cells[1::2]):
        assert "exercise" in ask.metadata["tags"] and "solution" in solution.metadata["tags"]
        assert ask.metadata["exercise"] == solution.metadata["exercise"]
        assert solution.metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
        check = ask.source.strip().splitlines()[-1]
        assert check.startswith("ex.") and check.split("(")[0] in solution.source, f"{path.name}: {check}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert outputs and not any(o.output_type == "error" for o in outputs)
    shown = {"".join(o.data.get("text/plain", "")).split("(")[0] for o in outputs if WIDGET_VIEW in o.get("data", {})}
    assert shown & set(workbench.widgets.__all__), f"{path.name} shows no workbench widget (shown: {shown})"
    assert_checked(nb, path.name)
