"""Figure builders: the data they draw follows the core values they are given."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from helpers import device, expr, matmul
from hypothesis import given
from hypothesis import strategies as st

from workbench.construct.graph import ConstructionGraph, Edge, Node
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.profile.store import BestPoint
from workbench.viz.compare import (
    ComparedPoint,
    predicted_vs_measured_figure,
    ranks_from_selection,
)
from workbench.viz.diff import changed_lines, side_by_side_diff
from workbench.viz.fmt import human_bytes, tile_text
from workbench.viz.graph import first_steps, graph_figure, node_positions
from workbench.viz.roofline import roofline_figure, roofline_points
from workbench.viz.runs import best_so_far_figure
from workbench.viz.tiles import footprint_figure, rtile_figure, state_tiles


@cache
def finished(policy: str = "roller") -> Stepper:
    s = Stepper(matmul(256, 256, 256), device("tiny-cpu"), policy, Options(topk=4))
    s.run_to_end()
    return s


def figure_at(s: Stepper, position: int, **kw):
    s.seek(position)
    current = s.current.node.key if s.current and s.current.node else None
    return graph_figure(s.graph(), first_steps(s.steps[:position]), current, **kw)


def trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def points(fig) -> int:
    return sum(len(t.x) for t in fig.data if t.mode == "markers" and t.name != "current step")


# -- construction graph ---------------------------------------------------------------------------


def test_graph_figure_grows_with_the_step_and_keeps_node_places():
    s = finished()
    early = figure_at(s, 5)
    early_nodes = len(s.graph().nodes)
    late = figure_at(s, len(s.steps))
    assert points(early) == early_nodes < points(late)
    assert trace(early, "actions").name == early.data[0].name  # edges drawn first, under the nodes
    late_xy = {(x, y) for t in late.data if t.mode == "markers" for x, y in zip(t.x, t.y)}
    early_xy = {(x, y) for t in early.data if t.mode == "markers" and t.name != "current step" for x, y in zip(t.x, t.y)}
    assert early_xy <= late_xy  # a node never moves while stepping (same x, same band offset)


def test_graph_figure_has_a_trace_per_status_and_marks_the_current_step():
    s = finished()
    fig = figure_at(s, len(s.steps))
    statuses = {n.status.replace("_", " ") for n in s.graph().nodes.values()}
    names = [t.name for t in fig.data]
    assert set(names) == {"actions", "current step"} | statuses
    ring = trace(fig, "current step")
    assert (ring.x[0], ring.y[0]) == node_positions(s.graph(), first_steps(s.steps))[s.current.node.key]


def test_graph_hover_names_tile_footprint_traffic_and_score():
    s = finished()
    fig = figure_at(s, len(s.steps))
    explored = trace(fig, "explored")
    node = next(n for n in s.graph().nodes.values() if n.status == "explored" and n.score is not None)
    text = next(h for h in explored.hovertext if tile_text(s.space.axes, node.tile) in h)
    assert "footprint" in text and "of" in text and "traffic Q" in text and "reuse score" in text


def test_markov_graph_sizes_nodes_by_visits_and_shows_probabilities():
    s = finished("markov")
    fig = figure_at(s, len(s.steps), visits_as_size=True)
    sizes = np.concatenate([np.atleast_1d(t.marker.size) for t in fig.data if t.mode == "markers" and t.name != "current step"])
    assert sizes.max() > sizes.min()  # revisited states are drawn larger
    assert any("probability" in h for h in trace(fig, "explored").hovertext)


def test_first_steps_is_the_first_step_of_each_node():
    s = finished()
    first = first_steps(s.steps)
    for key, i in first.items():
        assert s.steps[i - 1].node.key == key
        assert all(step.node is None or step.node.key != key for step in s.steps[: i - 1])


def test_edges_join_node_positions():
    g = ConstructionGraph(("i",), ("registers", "DRAM"))
    a = Node("L0:1", 0, "registers", (1,), 4, 64, 100, None, "start")
    b = Node("L0:2", 0, "registers", (2,), 8, 64, 50, 2.0, "explored")
    g.add(a, None)
    g.add(b, Edge(a.key, b.key, "grow i to 2", 2.0))
    fig = graph_figure(g)
    edges = trace(fig, "actions")
    pos = node_positions(g)
    assert (edges.x[0], edges.y[0]) == pos[a.key] and (edges.x[1], edges.y[1]) == pos[b.key]
    assert math.isnan(edges.x[2])  # a gap between segments
    assert pos[b.key][1] > pos[a.key][1]  # the larger tile sits lower in the band


# -- rTiles and footprints ---------------------------------------------------------------------------


def test_rtile_figure_draws_each_layer_data_tile_on_each_tensor():
    e = matmul(64, 32, 16)
    tiles = ((2, 4, 1), (8, 16, 8))
    fig = rtile_figure(e, tiles, ("registers", "L1"))
    assert len(fig.data) == len(e.tensors) * (1 + len(tiles))
    for t, tensor in enumerate(e.tensors):
        panel = fig.data[t * 3 : t * 3 + 3]
        assert max(panel[0].x) == tensor.shape[-1] and max(panel[0].y) == tensor.shape[-2]
        for layer, rect in zip((1, 0), panel[1:]):  # largest tile drawn first
            data = e.data_tile_shape(t, tiles[layer])
            assert (max(rect.x), max(rect.y)) == (data[-1], data[-2])


def test_rtile_zoom_narrows_the_view_to_the_tiles():
    e = matmul(512, 512, 512)
    tiles = ((2, 16, 1),)
    full, zoomed = rtile_figure(e, tiles, ("registers",)), rtile_figure(e, tiles, ("registers",), zoom=True)
    assert full.layout.xaxis.range[1] == 512 and zoomed.layout.xaxis.range[1] < 64


def test_rtile_figure_handles_vectors_and_fused_axes():
    e = expr("gemv", M=64, K=32)
    fig = rtile_figure(e, ((4, 8),), ("registers",))
    assert max(fig.data[2].y) == 1  # x[K] is one row


def test_state_tiles_of_growing_and_finished_states():
    s = finished()
    n = s.space.n_tile_layers
    emit = next(step for step in s.steps if step.action.kind == "emit")
    assert state_tiles(emit.state, n) == emit.candidate.program.tiles
    grow = next(step for step in s.steps if step.action.kind == "grow" and step.state.layer == 1)
    assert state_tiles(grow.state, n) == (grow.state.recorded[0], grow.state.tile)
    assert state_tiles(None, n) == ()


def test_footprint_figure_shares_and_over_capacity_colour():
    fig = footprint_figure(("registers", "L1"), (512, 4096), (1024, 2048))
    bar = fig.data[0]
    assert list(bar.x) == [50.0, 200.0]
    assert bar.marker.color[1] != bar.marker.color[0]  # over capacity stands out


# -- roofline ------------------------------------------------------------------------------------------


def test_roofline_has_a_ceiling_per_layer_and_the_peak():
    layers = (("registers", 2000.0), ("L1", 400.0), ("DRAM", 20.0))
    fig = roofline_figure(layers, 200.0)
    ceilings = fig.data[: len(layers)]
    for (name, bw), t in zip(layers, ceilings):
        assert t.name.startswith(name)
        assert all(math.isclose(y, min(bw * x, 200.0)) for x, y in zip(t.x, t.y))
    assert fig.data[len(layers)].name.startswith("peak") and set(fig.data[len(layers)].y) == {200.0}


def test_roofline_points_are_flops_per_bottom_byte_and_predicted_speed():
    s = finished()
    s.seek(len(s.steps))
    cands = s.candidates()
    bottom = s.space.device.layers[-1].name
    pts = roofline_points(cands, bottom, measured={cands[0].rank: 2 * cands[0].predicted_seconds})
    first = [p for p in pts if p.rank == cands[0].rank]
    predicted, measured = (next(p for p in first if p.kind == k) for k in ("predicted", "measured"))
    est = cands[0].estimate
    assert math.isclose(predicted.intensity, est.flops / dict(est.bytes_per_layer)[bottom])
    assert math.isclose(predicted.gflops, 2 * measured.gflops)
    fig = roofline_figure([(l.name, l.bandwidth_gbps) for l in s.space.device.layers], 200.0, pts)
    assert [t.name for t in fig.data][-2:] == ["predicted", "measured"]
    assert set(trace(fig, "predicted").customdata) == {c.rank for c in cands}


# -- predicted vs measured -----------------------------------------------------------------------------


def test_predicted_vs_measured_has_the_identity_line_and_the_correlation():
    pts = [ComparedPoint(1, 1e-5, 2e-5), ComparedPoint(2, 2e-5, 3e-5), ComparedPoint(3, 4e-5, 5e-5), ComparedPoint(4, 5e-5, None)]
    fig = predicted_vs_measured_figure(pts)
    line = trace(fig, "y = x")
    assert list(line.x) == list(line.y)
    assert line.x[0] <= 10 and line.x[-1] >= 50  # spans every point (microseconds)
    assert list(fig.data[0].customdata) == [1, 2, 3]  # the unmeasured candidate has no point
    assert "Spearman 1.00" in fig.layout.title.text


def test_predicted_vs_measured_groups_runs():
    pts = [ComparedPoint(1, 1e-5, 2e-5, "run 1"), ComparedPoint(1, 1e-5, 1e-5, "run 2")]
    fig = predicted_vs_measured_figure(pts)
    assert len(fig.data) == 3 and fig.data[0].name.startswith("run 1")


@given(st.lists(st.integers(1, 50)))
def test_ranks_from_selection_are_sorted_unique_ranks(ranks):
    selected = [{"customdata": r} for r in ranks] + [{"x": 1.0}, {"customdata": True}, {"customdata": [ranks[0]] if ranks else []}]
    assert ranks_from_selection(selected) == tuple(sorted(set(ranks)))


def test_ranks_from_selection_accepts_float_ranks():
    assert ranks_from_selection([{"customdata": 3.0}, {"customdata": 2.5}]) == (3,)


# -- runs, diff, formats ---------------------------------------------------------------------------


def test_best_so_far_has_two_traces_per_series_in_microseconds():
    series = {"mm on cpu": (BestPoint(1, 1e9, 3e-5, 3e-5), BestPoint(2, 1e9 + 60, None, 3e-5), BestPoint(3, 1e9 + 120, 1e-5, 1e-5))}
    fig = best_so_far_figure(series)
    assert len(fig.data) == 2
    assert list(fig.data[0].y) == pytest.approx([30.0, 30.0, 10.0])
    assert fig.data[1].y[1] is None


def test_side_by_side_diff_marks_changes():
    a, b = "x = 1\ny = 2\nz = 3\n", "x = 1\ny = 4\nz = 3\nw = 5\n"
    html = side_by_side_diff(a, b, "#1", "#2")
    assert "diff_chg" in html and "diff_add" in html and "#1" in html
    assert changed_lines(a, b) == 3
    assert "identical" in side_by_side_diff(a, a, "#1", "#1")


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


def test_large_graphs_are_drawn_with_webgl():
    g = ConstructionGraph(("i",), ("registers", "DRAM"))
    for t in range(1, 1100):
        g.add(Node(f"L0:{t}", 0, "registers", (t,), 4 * t, 1 << 20, 100, 1.0, "explored"), None)
    assert {t.type for t in graph_figure(g).data} == {"scattergl"}
    assert {t.type for t in graph_figure(ConstructionGraph(("i",), ("registers",))).data} == {"scatter"}


def test_correlation_of_tied_predictions_is_called_undefined():
    pts = [ComparedPoint(r, 1e-5, m) for r, m in ((1, 2e-5), (2, 3e-5))]
    assert "undefined" in predicted_vs_measured_figure(pts).layout.title.text
