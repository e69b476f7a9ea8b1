"""The construction graph as a figure: memory layer down the y axis, construction step along x.

Each node sits at the step that first reached it (so the figure of step n is the figure of step
n - 1 plus what step n added, and a node never moves while stepping). Within a layer's band a
node is placed lower the larger its tile (log of the tile's volume), so growth reads as a
descent inside the band and `descend` as a jump to the next band. Each band is shaded and its
layer's name sits at the band's middle. Colour is the node's status; for a Markov walk the marker
size grows with the node's visit count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from math import log2, prod

import numpy as np
import plotly.graph_objects as go

from workbench.construct.graph import STATUSES, ConstructionGraph, Node
from workbench.fmt import duration, human_bytes, tile_text

STATUS_COLOURS = {
    "start": "#6a3d9a",
    "explored": "#1f77b4",
    "over_capacity": "#d62728",
    "compute_bound": "#ff7f0e",
    "emitted": "#2ca02c",
    "pruned_visited": "#9e9e9e",
}
LAYOUT_NOTE = ("x: the step that first reached a state; y: its memory layer, larger tiles lower within the "
               "layer's shaded band; colour: status; lines: actions")
BAND_SHADE = "rgba(31,119,180,0.06)"
BAND = 0.7  # share of the gap between two layers a band of nodes may fill
MARGIN = 0.3  # of a layer gap, above the top band and below the bottom one
MAX_MARKER = 28
# SVG markers slow the browser down beyond about a thousand; WebGL draws tens of thousands.
WEBGL_NODES = 1000
HOVERS_KEPT = 1 << 16  # memoised hover texts (a few hundred bytes each)


def first_steps(steps: Sequence) -> dict[str, int]:
    """Node key -> the 1-based index of the step that first recorded it."""
    first: dict[str, int] = {}
    for i, step in enumerate(steps, start=1):
        if step.node is not None and step.node.key not in first:
            first[step.node.key] = i
    return first


def node_positions(graph: ConstructionGraph, first_step: Mapping[str, int] | None = None) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: x its first step (insertion order when not given), y its layer plus
    its place in the layer's band by tile volume, log2 of the volume over log2 of the whole
    operator's (`graph.extents`): a scale later steps do not change, so a node never moves while
    stepping. A graph without extents (an old saved one) scales by its own largest tile."""
    volumes = {k: log2(max(1, prod(n.tile))) for k, n in graph.nodes.items()}
    top = log2(max(1, prod(graph.extents))) if graph.extents else max(volumes.values(), default=0.0)
    out = {}
    for i, (key, node) in enumerate(graph.nodes.items(), start=1):
        offset = BAND * min(1.0, volumes[key] / top) if top > 0 else 0.0
        x = first_step.get(key, i) if first_step is not None else i
        out[key] = (float(x), node.layer + offset)
    return out


def node_hover(graph: ConstructionGraph, node: Node, probability: float | None) -> str:
    """The hover text of a node: tile per axis, footprint vs capacity, traffic, score."""
    return _hover(graph.axes, node, probability, graph.visits.get(node.key, 0))


@lru_cache(maxsize=HOVERS_KEPT)
def _hover(axes: tuple[str, ...], node: Node, probability: float | None, visits: int) -> str:
    # Memoised: stepping re-renders thousands of unchanged nodes (a Node is a frozen value).
    lines = [f"<b>{node.layer_name}</b> {node.status}", tile_text(axes, node.tile)]
    if node.capacity_bytes and node.footprint_bytes:
        share = node.footprint_bytes / node.capacity_bytes
        lines.append(f"footprint {human_bytes(node.footprint_bytes)} of {human_bytes(node.capacity_bytes)} ({share:.0%})")
    lines.append(f"traffic Q {human_bytes(node.traffic_bytes)}")
    if probability is not None:
        lines.append(f"benefit {node.score:.4g}, probability {probability:.3g}" if node.score is not None else f"probability {probability:.3g}")
    elif node.score is not None:
        lines.append(f"reuse score {node.score:.4g}")
    if node.predicted_seconds is not None:
        lines.append(f"predicted {duration(node.predicted_seconds)}")
    if visits > 1:
        lines.append(f"visits {visits}")
    return "<br>".join(lines)


def _edge_xy(graph: ConstructionGraph, pos: Mapping[str, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Edge segments as one polyline with NaN gaps (numeric arrays validate and serialise far
    faster than lists with None)."""
    pairs = dict.fromkeys((e.src, e.dst) for e in graph.edges if e.src in pos and e.dst in pos)
    xy = np.full((len(pairs), 3, 2), np.nan)
    for i, (src, dst) in enumerate(pairs):
        xy[i, 0], xy[i, 1] = pos[src], pos[dst]
    flat = xy.reshape(-1, 2).astype(np.float32)  # half the bytes of float64, exact enough to draw
    return flat[:, 0], flat[:, 1]


def _probabilities(graph: ConstructionGraph) -> dict[str, float]:
    """The probability of the last edge into each node (Markov walks; empty for Roller)."""
    return {e.dst: e.probability for e in graph.edges if e.probability is not None}


def _node_traces(graph: ConstructionGraph, pos, kind: str, visits_as_size: bool) -> list[dict]:
    """One marker trace per status present, in `STATUSES` order."""
    probs = _probabilities(graph)
    traces = []
    for status in STATUSES:
        nodes = [n for n in graph.nodes.values() if n.status == status]
        if not nodes:
            continue
        xy = np.array([pos[n.key] for n in nodes], dtype=np.float32)
        visits = [graph.visits.get(n.key, 1) for n in nodes]
        traces.append({
            "type": kind, "x": xy[:, 0], "y": xy[:, 1], "mode": "markers", "name": status.replace("_", " "),
            "hovertext": [node_hover(graph, n, probs.get(n.key)) for n in nodes], "hoverinfo": "text",
            "marker": {"color": STATUS_COLOURS[status], "line": {"width": 0},
                       "size": np.minimum(MAX_MARKER, 6 + 3 * np.sqrt(visits)) if visits_as_size else 8},
        })
    return traces


def graph_figure(
    graph: ConstructionGraph,
    first_step: Mapping[str, int] | None = None,
    current: str | None = None,
    visits_as_size: bool = False,
) -> go.Figure:
    """The construction graph: an edge trace, one node trace per status present, and a ring on
    the `current` node (the node of the step shown)."""
    pos = node_positions(graph, first_step)
    ex, ey = _edge_xy(graph, pos)
    kind = "scattergl" if len(graph.nodes) > WEBGL_NODES else "scatter"
    traces = [{"type": kind, "x": ex, "y": ey, "mode": "lines", "name": "actions", "hoverinfo": "skip",
               "line": {"width": 0.7, "color": "rgba(120,120,120,0.45)"}}]
    traces += _node_traces(graph, pos, kind, visits_as_size)
    if current in pos:
        x, y = pos[current]
        traces.append({"type": "scatter", "x": [x], "y": [y], "mode": "markers", "name": "current step", "hoverinfo": "skip",
                       "marker": {"size": 18, "symbol": "circle-open", "color": "black", "line": {"width": 2}}})
    fig = go.Figure(traces)
    # A band per layer, [layer, layer + BAND], shaded behind the nodes, named at its middle.
    bands = [{"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "y0": l - MARGIN / 3, "y1": l + BAND + MARGIN / 3,
              "fillcolor": BAND_SHADE, "line": {"width": 0}, "layer": "below"} for l in range(len(graph.layers))]
    fig.update_layout(
        height=420, margin={"l": 10, "r": 10, "t": 30, "b": 40}, legend={"orientation": "h", "y": -0.15},
        xaxis={"title": "construction step", "zeroline": False}, shapes=bands,
        # Every layer's band stays in view while stepping: the figure does not jump as it grows.
        yaxis={"tickvals": [l + BAND / 2 for l in range(len(graph.layers))], "ticktext": list(graph.layers),
               "range": [len(graph.layers) - 1 + BAND + MARGIN, -MARGIN], "zeroline": False, "showgrid": False},
        title={"text": f"{len(graph.nodes)} states, {len(graph.edges)} actions", "font": {"size": 13}},
        uirevision="construction",  # a zoom into the graph survives stepping
    )
    return fig
