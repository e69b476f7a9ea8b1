"""The dashboard is a thin face: its pages call the front door (`workbench.pipeline`) and draw with
the views (`workbench.viz.figures`, `workbench.fmt`) instead of assembling the pipeline from the core's
modules (issue 35: it imported 18 of them). Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = (ROOT / "app.py", *sorted((ROOT / "workbench" / "app").glob("*.py")))
MAX_CORE_MODULES = 10  # issue 35: the front door, the views and a leaf or two, not the pipeline's parts


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(files, own: str) -> dict[str, set[str]]:
    """workbench module -> the files among `files` that import it (annotation-only imports too),
    leaving out the face's own package `own`. `from workbench.x import y` names module
    `workbench.x.y` when that is a module, else `workbench.x`."""
    found: dict[str, set[str]] = {}
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else node.module
                         for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("workbench.") and not (name == own or name.startswith(own + ".")):
                    found.setdefault(name, set()).add(file.relative_to(ROOT).as_posix())
    return found


def test_the_counter_resolves_modules_and_names():
    found = imported_modules([ROOT / "workbench" / "app" / "page_dynamic.py"], "workbench.app")
    assert "workbench.pipeline" in found  # `from workbench import pipeline`: the module
    assert "workbench.viz.figures" in found  # `from workbench.viz.figures import dynamic_figure`: not a module
    assert not any(name.startswith("workbench.app") for name in found)


def test_the_dashboard_imports_at_most_ten_core_modules():
    found = imported_modules(DASHBOARD, "workbench.app")
    listing = "\n".join(f"  {name}: {', '.join(sorted(files))}" for name, files in sorted(found.items()))
    assert len(found) <= MAX_CORE_MODULES, (
        f"app.py and workbench/app/ import {len(found)} core modules (at most {MAX_CORE_MODULES}); call "
        f"workbench.pipeline and draw with workbench.viz.figures instead:\n{listing}")
