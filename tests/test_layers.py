"""The package's imports form layers: no module imports itself back through others, no room
(a subpackage `workbench/<sub>/` or a top-level module `workbench/<name>.py`) imports a room
that imports it back, and every import between rooms goes down the layer order that
docs/architecture.md declares once ("## Layers": one table row per layer, the faces first).

The graph is read from the source with `ast`; nothing is imported (no TVM needed). Every
`import` and `from ... import` of a workbench module counts, at the top, inside functions and
under `if TYPE_CHECKING:` alike (an annotation's import is still a dependency of the design);
relative imports are resolved. `from P import name` is an edge to the module `P.name` where
there is one, else to `P`.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


@lru_cache(maxsize=None)
def modules(package: Path) -> dict[str, Path]:
    """Every module under the directory `package` by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@lru_cache(maxsize=None)
def imports(package: Path) -> tuple[tuple[str, str, int], ...]:
    """(importer, imported, line) for every import of one module of `package` by another."""
    known = modules(package)

    def module_of(name: str) -> str | None:  # what `import name` runs last: it, or its longest module prefix
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges = set()
    for name, path in known.items():
        here = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                imported = module_of(target) if target.split(".")[0] == package.name else None
                if imported is not None and imported != name:
                    edges.add((name, imported, node.lineno))
    return tuple(sorted(edges))


def room(module: str, package: Path) -> str:
    """The room of a module: `sub/` for package/sub/..., `name.py` for a top-level module,
    `__init__.py` for the package's own."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (package / parts[1]).is_dir() else f"{parts[1]}.py"


def declared_layers(markdown: str) -> tuple[tuple[str, ...], ...]:
    """The rooms of each layer of the "## Layers" table of `markdown` (first column, each room
    in backticks; the top layer first), returned bottom layer first."""
    section = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    assert section, "no '## Layers' section"
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")][2:]  # after the header
    layers = tuple(tuple(re.findall(r"`([^`]+)`", row.split("|")[1])) for row in rows)
    assert layers and all(layers), "a row of the layer table names no room in its first column"
    return tuple(reversed(layers))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan's, without
    recursion)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = [stack.pop()]
                    while component[-1] != node:
                        component.append(stack.pop())
                    on_stack.difference_update(component)
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the nodes of `component` (one of `cycles`), its nodes in order."""
    best = component + [None]  # longer than any cycle found
    for start in component:
        parents, frontier = {start: None}, [start]
        while frontier:
            back = next((node for node in frontier if start in graph[node]), None)
            if back is not None:  # breadth first: the first way back is the shortest
                path = [back]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                best = min(best, path[::-1], key=len)
                break
            following = []
            for node in frontier:
                for child in sorted(graph[node] & set(component) - set(parents)):
                    parents[child] = node
                    following.append(child)
            frontier = following
    return best


def _cycle_lines(graph, edges, name) -> list[str]:
    """For each cycle of `graph`: its nodes, then one import per step of a shortest cycle."""
    lines = []
    for component in cycles(graph):
        path = shortest_cycle(graph, component)
        lines.append(f"cycle of {len(component)}: {' '.join(component)}")
        for a, b in zip(path, path[1:] + path[:1]):
            lines.append("  " + next(where for x, y, where in edges if name(x) == a and name(y) == b))
    return lines


def module_cycles(package: Path) -> list[str]:
    """Each cycle of modules, then the imports of a shortest loop through it (file:line)."""
    graph = {m: set() for m in modules(package)}
    for a, b, _ in imports(package):
        graph[a].add(b)
    edges = [(a, b, f"{_where(a, line, package)} imports {b}") for a, b, line in imports(package)]
    return _cycle_lines(graph, edges, lambda m: m)


def room_cycles(package: Path) -> list[str]:
    """Each cycle of rooms, then the imports of a shortest loop through it (file:line)."""
    graph = {room(m, package): set() for m in modules(package)}
    for a, b, _ in imports(package):
        if room(a, package) != room(b, package):
            graph[room(a, package)].add(room(b, package))
    edges = [(a, b, f"{_where(a, line, package)} imports {b}") for a, b, line in imports(package)]
    return _cycle_lines(graph, edges, lambda m: room(m, package))


def not_down(package: Path, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """One line per import of a room by a room of the same layer or one below it."""
    level = {r: i for i, layer in enumerate(layers) for r in layer}
    wrong = []
    for a, b, line in imports(package):
        ra, rb = room(a, package), room(b, package)
        if ra != rb and ra in level and rb in level and level[ra] <= level[rb]:
            wrong.append(f"{_where(a, line, package)} imports {b}: {ra} (layer {level[ra] + 1}) -> "
                         f"{rb} (layer {level[rb] + 1})")
    return wrong


def _where(module: str, line: int, package: Path) -> str:
    return f"{modules(package)[module].relative_to(package.parent)}:{line}"



def test_the_layers_name_every_room_once():
    declared = [r for layer in declared_layers(ARCHITECTURE.read_text()) for r in layer]
    rooms = {room(m, PACKAGE) for m in modules(PACKAGE)}
    assert not {r for r in declared if declared.count(r) > 1}, f"{ARCHITECTURE}, ## Layers: a room named twice"
    assert rooms <= set(declared), f"{ARCHITECTURE}, ## Layers: no layer for {sorted(rooms - set(declared))}"
    assert set(declared) <= rooms, f"{ARCHITECTURE}, ## Layers: no such room {sorted(set(declared) - rooms)}"


def test_no_module_imports_itself_back():
    found = module_cycles(PACKAGE)
    assert not found, "imports inside a cycle of modules:\n  " + "\n  ".join(found)


def test_no_room_imports_itself_back():
    found = room_cycles(PACKAGE)
    assert not found, "imports inside a cycle of rooms:\n  " + "\n  ".join(found)


def test_every_import_between_rooms_goes_down_the_layers():
    """A room imports rooms of lower layers only: neither its own layer's others nor those above."""
    found = not_down(PACKAGE, declared_layers(ARCHITECTURE.read_text()))
    assert not found, f"imports that do not go down the layers of {ARCHITECTURE.name} (1 the bottom):\n  " + \
        "\n  ".join(found)


def test_the_checks_see_every_kind_of_import_and_name_the_edge(tmp_path):
    """On a small package: a relative import, one inside a function and one under TYPE_CHECKING
    are edges; cycles and an import that goes up are reported with the file and line."""
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from . import b\n")  # relative, inside low/
    (pkg / "low" / "b.py").write_text("def f():\n    from pkg.low import a\n")  # in a function: a <-> b
    (pkg / "low" / "c.py").write_text("import pkg.mid\n")  # up: low/ -> mid.py -> top.py -> low/
    (pkg / "top.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low.a import x\n")
    (pkg / "mid.py").write_text("import pkg.top\nimport os\n")
    assert set(imports(pkg)) == {("pkg.low.a", "pkg.low.b", 1), ("pkg.low.b", "pkg.low.a", 2), ("pkg.low.c", "pkg.mid", 1),
                                 ("pkg.top", "pkg.low.a", 3), ("pkg.mid", "pkg.top", 1)}
    assert module_cycles(pkg) == ["cycle of 2: pkg.low.a pkg.low.b",
                                  "  pkg/low/a.py:1 imports pkg.low.b", "  pkg/low/b.py:2 imports pkg.low.a"]
    assert room_cycles(pkg) == ["cycle of 3: low/ mid.py top.py", "  pkg/low/c.py:1 imports pkg.mid",
                                "  pkg/mid.py:1 imports pkg.top", "  pkg/top.py:3 imports pkg.low.a"]
    layers = declared_layers("## Layers\n\n| rooms | what |\n|---|---|\n| `top.py` | |\n| `mid.py` | |\n"
                             "| `low/` `__init__.py` | |\n")
    assert layers == (("low/", "__init__.py"), ("mid.py",), ("top.py",))
    assert not_down(pkg, layers) == ["pkg/low/c.py:1 imports pkg.mid: low/ (layer 1) -> mid.py (layer 2)",
                                     "pkg/mid.py:1 imports pkg.top: mid.py (layer 2) -> top.py (layer 3)"]
