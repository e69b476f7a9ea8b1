"""The lesson notebooks: committed without outputs, and each one runs top to bottom on this CPU.

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

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # one cell; profiling builds kernels in spawned workers (tens of seconds)
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"
    assert "widgets" not in nb.metadata  # no saved widget state either


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert outputs and not any(o.output_type == "error" for o in outputs)
