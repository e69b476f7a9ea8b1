"""The construction graph: every state a policy visited and every action it took.

Nodes are rTile states per layer (with footprint, capacity, traffic, score, estimate when
emitted, status); edges are actions with their score (Roller) or probability (Markov). The graph
is derived from the list of steps, so stepping back is replaying a prefix. Serialisable to JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.files import write_user_file
from workbench.frozen import direct_init

STATUSES = ("explored", "over_capacity", "compute_bound", "emitted", "pruned_visited", "start")


@direct_init
@dataclass(frozen=True)
class Node:
    key: str
    layer: int
    layer_name: str
    tile: tuple[int, ...]
    footprint_bytes: int
    capacity_bytes: int
    traffic_bytes: int
    score: float | None
    status: str
    predicted_seconds: float | None = None


@direct_init
@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    action: str
    score: float | None = None
    probability: float | None = None


@dataclass
class ConstructionGraph:
    axes: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    # The operator's extents per axis: the largest tile any node can have, so a drawing can place
    # tiles on a scale the later steps do not change (viz.graph).
    extents: tuple[int, ...] = ()
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    visits: dict[str, int] = field(default_factory=dict)

    def add(self, node: Node | None, edge: Edge | None) -> None:
        """Record a step: a node seen again keeps its first data but counts the visit; a later,
        more specific status (emitted, over capacity, ...) replaces `explored`."""
        if node is not None:
            old = self.nodes.get(node.key)
            if old is None or (old.status == "explored" and node.status != "explored"):
                self.nodes[node.key] = node
            self.visits[node.key] = self.visits.get(node.key, 0) + 1
        if edge is not None:
            self.edges.append(edge)

    def counts(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "edges": len(self.edges)}

    def emitted(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.status == "emitted"]

    def to_dict(self) -> dict:
        return {
            "axes": list(self.axes),
            "layers": list(self.layers),
            "extents": list(self.extents),
            "nodes": [asdict(n) for n in self.nodes.values()],
            "edges": [asdict(e) for e in self.edges],
            "visits": self.visits,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ConstructionGraph":
        nodes = {}
        for n in data["nodes"]:
            node = Node(**{**n, "tile": tuple(n["tile"])})
            nodes[node.key] = node
        return cls(
            axes=tuple(data["axes"]),
            layers=tuple(data["layers"]),
            extents=tuple(int(e) for e in data.get("extents", ())),
            nodes=nodes,
            edges=[Edge(**e) for e in data["edges"]],
            visits={k: int(v) for k, v in data.get("visits", {}).items()},
        )

    def save(self, path: str | Path, what: str = "graph") -> None:
        """Write the graph as JSON to the regular file `path` (`files.write_user_file`: UserError
        as "<what> <path>: ..." for a FIFO, a directory or a path that cannot be written)."""
        write_user_file(path, json.dumps(self.to_dict()), what)

    @classmethod
    def load(cls, path: str | Path) -> "ConstructionGraph":
        return cls.from_dict(json.loads(Path(path).read_text()))


def node_key(layer: int, tile: tuple[int, ...], recorded: tuple = (), prefix: str | None = None) -> str:
    """A readable, stable key: the recorded tiles of the layers above, then this layer's tile
    (`prefix`: `recorded_prefix(recorded)`, where the caller keeps it)."""
    return f"L{layer}:{recorded_prefix(recorded) if prefix is None else prefix}{'x'.join(map(str, tile))}"


def recorded_prefix(recorded: tuple) -> str:
    """The part of `node_key` the recorded tiles make: each tile, then a slash."""
    return "".join(["x".join(map(str, t)) + "/" for t in recorded])
