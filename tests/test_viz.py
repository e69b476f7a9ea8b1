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
from workbench.fmt import (
    duration,
    gbps,
    gflops,
    human_bytes,
    prefixed,
    progress_text,
    signed,
    significant,
    table_time_unit,
    target_text,
    tile_text,
    time_columns,
    whole,
)
from workbench.profile.importance import Trial
from workbench.profile.runner import Measurement
from workbench.profile.session import ProgressEvent
from workbench.profile.store import BestPoint
from workbench.viz.compare import (
    ComparedPoint,
    compared_points,
    live_figure,
    predicted_vs_measured_figure,
    ranks_from_selection,
)
from workbench.viz.diff import changed_lines, side_by_side_diff
from workbench.viz.axes import AXIS_PX, LEGEND_ROW_PX, MAX_TICKS, labelled, legend_rows, log_ticks
from workbench.viz.graph import BAND, first_steps, graph_figure, node_positions
from workbench.viz.importance import PARALLEL_TICKS, parallel_figure
from workbench.viz.roofline import RooflinePoint, roofline_figure, roofline_points
from workbench.viz.runs import best_so_far_figure
from workbench.viz.source import entry_line
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
    assert line.x[0] <= 1e-5 and line.x[-1] >= 5e-5  # spans every point (seconds)
    assert list(fig.data[0].customdata) == [1, 2, 3]  # the unmeasured candidate has no point
    assert "Spearman 1.00" in fig.layout.title.text


def test_the_live_scatter_fills_in_as_measurements_arrive():
    cands = finished().candidates()[:4]
    arrived = [Measurement(2, "fake", (3e-4, 4e-4), correct=True), Measurement(1, "fake", correct=False, error="wrong result"),
               Measurement(4, "fake", (1e-3,), correct=True)]
    predicted = {c.rank: c.predicted_seconds for c in cands}
    assert compared_points(cands, arrived) == [ComparedPoint(2, predicted[2], 3e-4), ComparedPoint(1, predicted[1], None),
                                               ComparedPoint(4, predicted[4], 1e-3)]
    for k in range(1, len(arrived) + 1):
        fig = live_figure(cands, arrived[:k])
        shown = [m.rank for m in arrived[:k] if m.ok]  # the wrong result has no point
        assert sorted(fig.data[0].customdata) == shown and fig.layout.title.text.startswith(f"{k} of 4 so far: ")


def test_progress_text_gives_a_measured_time_in_its_unit():
    timed = Measurement(3, "local", (0.10742773, 0.2), correct=True)
    assert progress_text(ProgressEvent("measure", 2, 10, 3, "107427.73 us", timed)) == "measure 2/10: #3 107 ms"
    wrong = Measurement(4, "local", correct=False, error="wrong result")
    assert progress_text(ProgressEvent("measure", 3, 10, 4, "wrong result", wrong)) == "measure 3/10: #4 wrong result"
    assert progress_text(ProgressEvent("build", 1, 10, 5, "built")) == "build 1/10: #5 built"


def test_parallel_axes_have_a_few_readable_ticks_at_values_taken():
    # 24 tile sizes from 1 to 2048 (powers of two and a few between), grids up to 1.3 million, a
    # fixed vthreads, and times over four decades: a tick per distinct value would crowd every axis.
    sizes = sorted({2**e for e in range(12)} | {3 * 2**e for e in range(10)} | {5, 7})
    trials = [Trial(1, r + 1, (("L1.i", sizes[r % len(sizes)]), ("grid", 5 * 4**(r % 10)), ("vthreads.j", 2), ("L2.k", r % 3)),
                    1e-6 * 10 ** (4 * r / 59)) for r in range(60)]
    fig = parallel_figure(trials, ["L1.i", "grid", "vthreads.j", "L2.k"])
    (parcoords,) = fig.data
    axes = {d.label: d for d in parcoords.dimensions}
    assert list(axes) == ["L1.i", "grid", "vthreads.j", "L2.k", "best measured"]
    for name, values in (("L1.i", sizes), ("grid", [5 * 4**e for e in range(10)]), ("vthreads.j", [2]), ("L2.k", [0, 1, 2])):
        d = axes[name]
        assert 1 <= len(d.tickvals) <= PARALLEL_TICKS and len(d.ticktext) == len(d.tickvals)
        texts = list(d.ticktext)
        assert texts[0] == whole(min(values)) and texts[-1] == whole(max(values))  # the ends are labelled
        assert set(texts) <= {whole(v) for v in values}  # every tick at a value the trials take
    # powers of two spanning decades sit evenly on a log axis: 1, 2, 4 do not pile up at its foot
    assert list(axes["L1.i"].tickvals) == pytest.approx([math.log2(int(t)) for t in axes["L1.i"].ticktext])
    assert list(axes["L2.k"].tickvals) == [0, 1, 2]  # 0 to 2: a linear axis, every value
    assert axes["grid"].ticktext[-1] == "1.31 M" and "5" in axes["grid"].ticktext
    time = axes["best measured"]
    assert 2 <= len(time.tickvals) <= PARALLEL_TICKS and all(t.endswith("s") for t in time.ticktext)
    assert parcoords.labelangle != 0  # a dozen labels side by side overlap when level


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


def test_best_so_far_has_two_traces_and_one_legend_entry_per_series():
    series = {"mm on cpu": (BestPoint(1, 1e9, 3e-5, 3e-5), BestPoint(2, 1e9 + 60, None, 3e-5), BestPoint(3, 1e9 + 120, 1e-5, 1e-5))}
    fig = best_so_far_figure(series)
    assert len(fig.data) == 2
    assert list(fig.data[0].y) == pytest.approx([3e-5, 3e-5, 1e-5])  # seconds, ticks say the unit
    assert fig.data[1].y[1] is None
    assert [t.showlegend is not False for t in fig.data] == [True, False]
    assert "30 us" in fig.data[0].hovertext[0] and "10 us" in fig.layout.yaxis.ticktext


def test_side_by_side_diff_marks_changes():
    a, b = "x = 1\ny = 2\nz = 3\n", "x = 1\ny = 4\nz = 3\nw = 5\n"
    html = side_by_side_diff(a, b, "#1", "#2")
    assert "diff_chg" in html and "diff_add" in html and "#1" in html
    assert changed_lines(a, b) == 3
    assert "identical" in side_by_side_diff(a, a, "#1", "#1")


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(2048) == "2 KiB"
    assert human_bytes(3 * 2**30) == "3 GiB"
    assert human_bytes(1000 * 2**20) == "1000 MiB"  # under 1 GiB: stays in MiB
    assert human_bytes(None) == human_bytes(float("nan")) == "-"


@pytest.mark.parametrize("seconds, text", [
    (1.87e-3, "1.87 ms"), (107427.73e-6, "107 ms"), (1.97e-3, "1.97 ms"), (2.5e-8, "25 ns"), (1e-6, "1 us"),
    (999.6e-6, "1 ms"), (12.345, "12.3 s"), (4000.0, "4000 s"), (0.0, "0 ns"), (None, "-"), (float("nan"), "-"),
])
def test_duration_chooses_the_unit_by_magnitude_with_three_figures(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("value, text", [(1234.5, "1230"), (0.012345, "0.0123"), (2.0, "2"), (9.996, "10"), (-1.5, "-1.5")])
def test_significant_has_no_exponent_and_no_trailing_zeros(value, text):
    assert significant(value) == text


def test_a_score_shows_its_sign_with_two_decimals_and_a_dash_when_undefined():
    assert signed(0.5512) == "+0.55" and signed(-0.071) == "-0.07" and signed(0.0) == "+0.00"
    assert signed(float("nan")) == signed(None) == "-"


def test_rates_take_a_decimal_prefix():
    assert gflops(31.2) == "31.2 GFLOP/s" and gflops(1500) == "1.5 TFLOP/s" and gflops(0.5) == "500 MFLOP/s"
    assert gbps(25.6) == "25.6 GB/s" and gbps(2039) == "2.04 TB/s"
    assert prefixed(None, "B/s") == "-" and prefixed(2**28, "FLOP") == "268 MFLOP"


def test_a_table_takes_the_unit_of_its_median_time():
    assert table_time_unit([2e-6, 3e-3, 5e-3, None]) == ("ms", 1e-3)
    assert table_time_unit([None]) == ("us", 1e-6)


def test_log_ticks_are_1_2_5_per_decade_with_unit_text():
    values, texts = log_ticks(1e-6, 1e-4, duration)
    assert values == pytest.approx([1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4])
    assert texts == ["1 us", "2 us", "5 us", "10 us", "20 us", "50 us", "100 us"]
    wide, _ = log_ticks(1e-9, 10.0, duration)  # ten decades: one tick per decade
    assert len(wide) <= MAX_TICKS and wide == pytest.approx([10.0**e for e in range(-9, 2, 2)])
    narrow, text = log_ticks(1.2e-3, 1.8e-3, duration)  # inside one step: the ends
    assert text == ["1.2 ms", "1.8 ms"]


def test_labels_are_kept_only_where_they_do_not_overlap():
    assert labelled([1.0, 1.001, 100.0], [1.0, 1.001, 100.0]) == [True, False, True]
    assert labelled([1.0, 100.0], [1.0, 1.0]) == [True, True]  # same height, far apart
    assert labelled([], []) == []
    # A cluster looks spread out against its own span, not against the axes: one label.
    assert labelled([10.0, 10.5, 11.0], [100.0, 101.0, 102.0], (0.1, 1000.0), (1.0, 1000.0)) == [True, False, False]


def test_crowded_candidates_keep_their_rank_on_hover_only():
    pts = [ComparedPoint(r, 1e-5 * (1 + r / 1000), 2e-5) for r in range(1, 11)] + [ComparedPoint(11, 1e-3, 3e-3)]
    fig = predicted_vs_measured_figure(pts)
    texts = fig.data[0].text
    assert texts[0] == "#1" and texts[10] == "#11" and not any(texts[1:10])  # 2..10 sit on #1
    assert all(f"#{r}:" in h for r, h in zip(range(1, 12), fig.data[0].hovertext))
    assert any(t.endswith(" ms") for t in fig.layout.xaxis.ticktext)


def test_large_graphs_are_drawn_with_webgl():
    g = ConstructionGraph(("i",), ("registers", "DRAM"))
    for t in range(1, 1100):
        g.add(Node(f"L0:{t}", 0, "registers", (t,), 4 * t, 1 << 20, 100, 1.0, "explored"), None)
    assert {t.type for t in graph_figure(g).data} == {"scattergl"}
    assert {t.type for t in graph_figure(ConstructionGraph(("i",), ("registers",))).data} == {"scatter"}


def test_correlation_of_tied_predictions_is_called_undefined():
    pts = [ComparedPoint(r, 1e-5, m) for r, m in ((1, 2e-5), (2, 3e-5))]
    assert "undefined" in predicted_vs_measured_figure(pts).layout.title.text


def test_rtile_figure_shows_every_dimension_of_a_conv():
    e = expr("conv2d", N=1, C=64, H=28, W=28, F=64, KH=3, KW=3, stride=1, pad=1)  # recorded for the fast lane
    axes = [a.name for a in e.axes]
    tile = tuple(4 if a.kind == "reduce" else 2 for a in e.axes)  # channels tiled by 4
    fig = rtile_figure(e, (tile,), ("registers",))
    bars = [t for t in fig.data if t.type == "bar"]
    deep = [i for i, t in enumerate(e.tensors) if len(t.shape) > 2]
    assert len(bars) == len(deep) > 0 and axes  # one bar trace per deep tensor and layer
    for i, bar in zip(deep, bars):
        shape, data = e.tensors[i].shape, e.data_tile_shape(i, tile)
        assert len(bar.y) == len(shape)  # every dimension, the leading ones included
        assert list(bar.x) == pytest.approx([100 * d / n for d, n in zip(data, shape)])
        assert all(f"{d} of {n}" in h for d, n, h in zip(data, shape, bar.hovertext))


def test_time_columns_share_one_unit_chosen_from_the_data():
    rows = [{"rank": 1, "predicted us": 107427.73, "measured us": None}, {"rank": 2, "predicted us": 250000.0, "measured us": 1970.0}]
    out, columns = time_columns(rows)
    assert columns == ("predicted (ms)", "measured (ms)")
    assert out[0] == {"rank": 1, "predicted (ms)": pytest.approx(107.42773), "measured (ms)": None}
    assert out[1]["measured (ms)"] == pytest.approx(1.97)
    assert time_columns([{"rank": 1}]) == ([{"rank": 1}], ())


def test_target_text_has_no_dictionary_text():
    assert target_text('{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}') == "llvm, mcpu haswell, num-cores 2"
    assert target_text('{"kind": "cuda", "keys": ["cuda", "gpu"]}') == "cuda, keys cuda gpu"
    assert target_text("not json") == "not json"


def test_side_by_side_diff_fits_each_side_in_half_the_width():
    html = side_by_side_diff("x = " + "1" * 300 + "\n", "x = 2\n", "#1", "#2")
    assert html.count("<col style") == 6 and "table-layout: fixed" in html
    assert "nowrap" not in html.split("</style>", 1)[1]  # long lines wrap inside their column


def test_entry_line_opens_llvm_and_assembly_at_the_computation():
    ll = '@.str = private constant [4 x i8] c"abc\\00"\ndefine i32 @__tvm_ffi_main(ptr %a) {\n}\ndefine internal fastcc i32 @main_compute_(ptr %A) {\n}'
    assert entry_line(ll, "ll", "main") == 3
    assert entry_line(".text\n.globl x\n__tvm_ffi_main:\n ret\nmain_compute_:\n ret", "s", "main") == 4
    assert entry_line("#include <cuda.h>\n\nextern \"C\" __global__ void main_kernel() {}", "cu", "main") == 2
    assert entry_line("define i32 @other() {\n}", "ll", "main") == 0  # the first function
    assert entry_line("no function here", "txt", "main") == 0


def test_gantt_rows_are_readable_and_its_legend_sits_below():
    from workbench.models.rammer import ROperator, rkernel, schedule
    from workbench.viz.gantt import MIN_PLOT_PX, ROW_PX, gantt_figure

    ops = tuple(ROperator(f"op{i}", (), (rkernel(1, 2, 1e-3, 2),)) for i in range(12))
    two, many = gantt_figure(schedule(ops, 2), [o.name for o in ops]), gantt_figure(schedule(ops, 16), [o.name for o in ops])
    assert two.layout.height >= MIN_PLOT_PX + 40 and many.layout.height >= ROW_PX * 16  # grows with its rows
    legend, bottom = two.layout.legend, two.layout.margin.b
    assert legend.orientation == "h" and legend.yref == "container" and legend.y == 0  # at the figure's foot
    assert bottom >= AXIS_PX + LEGEND_ROW_PX * legend_rows(12, 4)  # room for the axis and every legend row
    assert two.layout.xaxis.title.text == "time (ms)"  # the plan's unit, not microseconds of milliseconds


def test_graph_layer_names_sit_at_the_middle_of_their_bands():
    s = finished()
    fig = figure_at(s, len(s.steps))
    layers = len(s.graph().layers)
    assert len(fig.layout.shapes) == layers
    for layer, (tick, band) in enumerate(zip(fig.layout.yaxis.tickvals, fig.layout.shapes)):
        assert tick == pytest.approx((band.y0 + band.y1) / 2) and band.y0 < layer + BAND / 2 < band.y1
    ys = [y for t in fig.data if t.mode == "markers" and t.name != "current step" for y in t.y]
    assert all(any(b.y0 <= y <= b.y1 for b in fig.layout.shapes) for y in ys)  # every node inside a band


def test_roofline_ticks_read_as_rates_and_intensities():
    fig = roofline_figure((("DRAM", 20.0),), 200.0, (RooflinePoint(1, 2.0, 30.0),))
    assert all(t.endswith("FLOP/s") for t in fig.layout.yaxis.ticktext)
    assert "flop/B" in fig.layout.xaxis.title.text and "1" in fig.layout.xaxis.ticktext  # 1 flop/B, not "10^0"
    assert fig.data[0].name == "DRAM 20 GB/s" and fig.data[1].name == "peak 200 GFLOP/s"


def test_a_narrow_log_range_gets_a_tick_per_digit():
    values, texts = log_ticks(1.6e-3, 4.78e-3, duration)  # no 1-2-5 tick but 2 ms inside
    assert texts == ["2 ms", "3 ms", "4 ms"]


# -- the model's correction, the estimate's parts, micro-kernels ------------------------------------


def _evaluation_and_correction():
    """A device's held-out evaluation and fit (their stored forms) on three workloads measured at
    twice the model's prediction; `mm-c` measured once, so its Spearman is undefined."""
    from workbench.profile.correction import Row, Stages, evaluate, fit

    rows = []
    for name, sizes in (("mm-a", (1, 2, 3)), ("mm-b", (2, 5, 4)), ("mm-c", (3,))):
        for rank, size in enumerate(sizes, start=1):
            stages = Stages(size * 1e-4, (("DRAM", size * 3e-5),), size * 1.3e-4)
            rows.append(Row(name, "matmul", 1, rank, stages, 2 * stages.predicted_seconds * (1 + 0.01 * rank)))
    return evaluate(rows, "tiny-cpu").to_dict(), fit(rows, "tiny-cpu").to_dict()


def test_before_after_bars_are_the_held_out_errors_and_correlations():
    from workbench.viz.correction import before_after_figure

    evaluation, _ = _evaluation_and_correction()
    scores = evaluation["workloads"]
    fig = before_after_figure(scores)
    assert [(t.name, t.xaxis) for t in fig.data] == [("model", "x"), ("model", "x2"), ("corrected", "x"), ("corrected", "x2")]
    before, rho_before, after, rho_after = fig.data
    assert list(before.y) == ["mm-a", "mm-b", "mm-c"]
    assert list(before.x) == [w["before_error"] for w in scores] and list(after.x) == [w["after_error"] for w in scores]
    assert list(before.text) == [f"x{significant(math.exp(w['before_error']))}" for w in scores]
    assert scores[2]["after_spearman"] is None  # one measurement: no correlation, shown as such, not as 0
    assert rho_after.text[2] == "undefined" and "undefined" in rho_after.hovertext[2]
    assert rho_after.text[0] == f"{scores[0]['after_spearman']:+.2f}"
    ticks = fig.layout.xaxis.ticktext
    assert ticks[0] == "x1" and all(t.startswith("x") for t in ticks)  # errors read as factors off
    assert fig.layout.xaxis.tickvals[1] == pytest.approx(math.log(float(ticks[1][1:])))


def test_the_verdict_is_the_evaluations_and_a_claim_needs_the_test():
    from workbench.viz.correction import evaluation_text, factor, stored_text, verdict, worse

    evaluation, _ = _evaluation_and_correction()
    # Three workloads: the smallest one-sided signed-rank p is 1/8, never a claim.
    assert not evaluation["claim"] and evaluation["p_value"] >= 0.125
    assert verdict(evaluation) == f"no improvement shown (signed-rank p = {significant(evaluation['p_value'])})"
    text = evaluation_text(evaluation)
    assert text.startswith("No improvement shown") and "7 measurements of 3 workloads" in text
    assert f"typical error {factor(evaluation['before']['error'])} -> {factor(evaluation['after']['error'])}" in text
    assert worse(evaluation) == (evaluation["after"]["error"] > evaluation["before"]["error"])
    helps = evaluation | {"claim": True, "p_value": 0.0156}
    assert verdict(helps) == "the correction helps (signed-rank p = 0.0156)"
    assert stored_text(0.0, 9, helps).endswith("on 9 measurements: the correction helps (signed-rank p = 0.0156)")
    assert factor(math.log(1.5)) == "x1.5" and factor(None) == "-" and factor(math.nan) == "-"


def test_coefficient_rows_have_a_fit_per_row_with_its_weight():
    from workbench.viz.correction import coefficient_rows

    _, correction = _evaluation_and_correction()
    rows = coefficient_rows(correction)
    overall = correction["overall"]
    assert [r["fit"] for r in rows] == ["all operators", "matmul"]
    assert rows[0] == {"fit": "all operators", "workloads": 3, "measurements": 7, "weight": overall["weight"],
                       "x compute": overall["compute"], "x DRAM loads": overall["loads"]["DRAM"],
                       "constant us": overall["constant"] * 1e6}
    (constant,) = time_columns(rows)[1]  # the dashboard's time table gives the constant its unit
    assert constant.startswith("constant (")


def test_estimate_parts_join_the_measured_and_modelled_phrases():
    from types import SimpleNamespace

    from workbench.fmt import estimate_parts

    calibrated = SimpleNamespace(measured=("compute: level-0 micro-kernel 6x16 float32, 205 GFLOP/s", "bandwidth of L1"),
                                 modelled=("traffic per layer", "scale-out over 2 cores"))
    assert estimate_parts(calibrated) == ("compute: level-0 micro-kernel 6x16 float32, 205 GFLOP/s; bandwidth of L1",
                                          "traffic per layer; scale-out over 2 cores")
    assert estimate_parts(SimpleNamespace(measured=(), modelled=("traffic per layer",)))[0] == \
        "nothing (the device spec is not calibrated)"
    real = finished().finish().candidates[0].estimate  # tiny-cpu is not calibrated: everything modelled
    assert estimate_parts(real) == ("nothing (the device spec is not calibrated)", "; ".join(real.modelled))


def test_micro_kernel_grid_has_a_row_per_row_count_and_a_column_per_width():
    from workbench.fmt import micro_kernel_grid
    from workbench.hardware.spec import MicroKernel

    kernels = (MicroKernel("float32", 6, 16, 205.4), MicroKernel("float32", 4, 32, 180.0),
               MicroKernel("float32", 4, 16, 150.0), MicroKernel("float64", 6, 8, 101.0))
    assert micro_kernel_grid(kernels, "float32") == [{"rows": 4, "16 cols": "150", "32 cols": "180"},
                                                     {"rows": 6, "16 cols": "205", "32 cols": "-"}]
    assert micro_kernel_grid(kernels, "float64") == [{"rows": 6, "8 cols": "101"}]
    assert micro_kernel_grid(kernels, "float16") == []


def test_the_forest_plot_draws_each_comparable_workload_by_verdict():
    from workbench.profile.versus import FLOOR, NOT_COMPARABLE, RUNS, SAME, SLOWER, RatioInterval, WorkloadComparison
    from workbench.viz.figures import forest_figure

    rows = [WorkloadComparison("mm-32", "d", None, None, RatioInterval(1.1, 1.05, 1.15, 0.99, 3, 3, 0.02, 8, RUNS),
                               SLOWER, ""),
            WorkloadComparison("mm-48", "d", None, None, RatioInterval(1.0, 0.98, 1.01, 0.99, 1, 1, 0.005, 4, FLOOR),
                               SAME, ""),
            WorkloadComparison("mm-64", "d", None, None, None, NOT_COMPARABLE, "no correct measurement in B")]
    fig = forest_figure(rows)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"slower", "no detectable change"}
    slower = by_name["slower"]
    assert list(slower.x) == [1.1] and list(slower.y) == ["mm-32"]
    assert list(slower.error_x.array) == pytest.approx([0.05]) and list(slower.error_x.arrayminus) == pytest.approx([0.05])
    assert "(1 not comparable, not drawn)" in fig.layout.title.text
    assert fig.layout.xaxis.type == "log" and list(fig.layout.yaxis.categoryarray) == ["mm-48", "mm-32"]
    assert "runs 3 / 3, between-run spread 2.0%" in slower.hovertext[0]
    assert "runs 1 / 1, drift floor 0.5%" in by_name["no detectable change"].hovertext[0]
