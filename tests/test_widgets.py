"""Notebook widgets, driven without a browser: set traits and click buttons, then check the core
state they mirror and the figures they show. Also the two figure builders only the widgets use
(the Rammer Gantt chart and a model's operator times)."""

from __future__ import annotations

import json
import re
from functools import cache
from html import escape
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, device, matmul

from workbench import pipeline
from workbench.fmt import duration
from workbench.models.rammer import ROperator, rkernel, schedule
from workbench.pipeline import Options
from workbench.viz.gantt import gantt_figure
from workbench.viz.operator_times import operator_times_figure
from workbench.viz.tiles import state_tiles
from workbench.widgets import (
    CandidateTable,
    ConstructionStepper,
    ExportButton,
    ModelView,
    PlotView,
    PredictedVsMeasured,
    TileView,
)
from workbench.widgets.tables import cell_text

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def construct(expr, spec, policy: str = "roller", options: Options = Options()):
    return pipeline.construct(pipeline.request(expr, spec, policy, options))


@cache
def construction(policy: str = "roller", size: int = 256):
    return construct(matmul(size, size, size), device("tiny-cpu"), policy, Options(topk=4))


def markers(fig) -> int:
    """Node markers in a graph figure (the ring on the current step excluded)."""
    return sum(len(t.x) for t in fig.data if t.mode == "markers" and t.name != "current step")


def plotted(view: PlotView) -> dict:
    """The figure an Output shows, as the frontend receives it."""
    (output,) = view.outputs
    return output["data"][PLOTLY_MIME]


# -- ConstructionStepper ----------------------------------------------------------------------


def test_stepper_buttons_move_the_core_stepper_and_the_graph_grows():
    w = ConstructionStepper(matmul(256, 256, 256), device("tiny-cpu"), options=Options(topk=4))
    assert w.position == 0 and w.total == len(w.stepper.steps) > 10
    assert w.reset_button.disabled and w.back_button.disabled and not w.next_button.disabled
    for _ in range(6):
        w.next_button.click()
    assert w.position == w.stepper.position == w.slider.value == w.play.value == 6
    early = markers(w.graph_view.figure)
    assert early == len(w.stepper.graph().nodes)
    w.end_button.click()
    assert w.stepper.position == w.total and w.next_button.disabled and w.end_button.disabled
    assert markers(w.graph_view.figure) > early
    w.back_button.click()
    assert w.stepper.position == w.total - 1
    w.reset_button.click()
    assert w.stepper.position == 0 and w.stepper.current is None and "at the start" in w.step_html.value


def test_stepper_position_trait_slider_and_play_seek_the_same_step():
    w = ConstructionStepper(matmul(256, 256, 256), device("tiny-cpu"), options=Options(topk=4))
    for control, value in ((w, 5), (w.slider, 9), (w.play, 3)):
        setattr(control, "position" if control is w else "value", value)
        assert w.stepper.position == w.position == value
        step = w.stepper.steps[value - 1]
        assert escape(step.note) in w.step_html.value
        assert w.tile_view.tiles == state_tiles(step.state, w.stepper.space.n_tile_layers)
    w.position = 10_000
    assert w.position == w.total  # clamped to the construction
    w.position = -3
    assert w.position == 0


def test_stepper_shows_the_alternatives_with_the_chosen_one_marked():
    w = ConstructionStepper(matmul(256, 256, 256), device("tiny-cpu"), options=Options(topk=4))
    w.position = next(i for i, s in enumerate(w.stepper.steps, 1) if s.action.kind == "grow")
    table = w.alternatives.value
    assert "reuse score" in table and "probability" not in table  # Roller has no probabilities
    assert table.count("<tr") == len(w.current.alternatives) + 1 and table.count("background-color") == 1


def test_markov_stepper_mirrors_temperature_and_probabilities():
    w = ConstructionStepper(matmul(256, 256, 256), device("tiny-cpu"), "markov", Options(topk=4), position=3)
    step = w.current
    assert step.temperature is not None and w.temperature == step.temperature
    assert f"temperature {step.temperature:.3g}" in w.step_html.value
    assert "benefit" in w.alternatives.value and "probability" in w.alternatives.value
    sizes = [t.marker.size for t in w.graph_view.figure.data if t.mode == "markers" and t.name != "current step"]
    assert sizes and not any(np.isscalar(s) for s in sizes)  # a marker per node, sized by its visits


def test_stepper_accepts_a_suite_reference_and_a_preset_name():
    w = ConstructionStepper("cpu-core:relu", "v100", options=Options(topk=2, max_steps=200))
    assert w.stepper.steps[0].action.kind == "fuse_axes" and w.stepper.space.device.name == "v100"
    w.position = 1
    assert w.tile_view.tiles == () and w.tile_view.footprint_view.outputs == ()


def test_stepper_candidates_are_the_finished_construction_wherever_the_cursor_is():
    options = Options(topk=4)
    w = ConstructionStepper(matmul(256, 256, 256), device("tiny-cpu"), "markov", options, position=5)
    finished = pipeline.construct(pipeline.request(matmul(256, 256, 256), device("tiny-cpu"), "markov", options))
    assert w.stepper.position == 5 and w.total == finished.steps == w.construction.steps
    assert len(w.stepper.candidates()) < len(w.candidates) == options.topk  # five steps emit nothing yet
    assert [(c.rank, c.program.tiles, c.predicted_seconds) for c in w.candidates] == [
        (c.rank, c.program.tiles, c.predicted_seconds) for c in finished.candidates]
    assert w.stepper.position == 5  # reading them moved nothing
    assert f"{w.total} steps, {len(finished.candidates)} candidates" in w.heading.value


# -- TileView -------------------------------------------------------------------------------


def test_tile_view_footprints_are_the_core_footprints():
    c = construction()
    best = c.candidates[0]
    view = TileView.from_candidate(c.expr, c.device, best)
    expected = tuple((f, c.device.layers[l].capacity_bytes) for l, f in enumerate(best.estimate.footprints))
    assert view.footprints() == expected
    bars = plotted(view.footprint_view)["data"][0]
    assert bars["y"] == [c.device.layers[l].name for l in range(len(expected))]


def test_tile_view_redraws_on_new_tiles_and_on_zoom():
    c = construction()
    # tiles well inside the 256^3 tensors, so zooming to them changes the range (rank 1's L2
    # tile may span a whole tensor)
    view = TileView(c.expr, c.device, ((2, 16, 1), (8, 32, 32), (64, 64, 64)))
    zoomed = view.tensor_view.figure.layout.xaxis.range
    view.zoom_box.value = False
    assert view.zoom is False and view.tensor_view.figure.layout.xaxis.range != zoomed
    view.tiles = ((2, 16, 1), (64, 64, 64), (128, 128, 64))  # L1 of tiny-cpu holds 32 KiB: 48 KiB is over
    assert view.footprints()[1][0] > view.footprints()[1][1] and "background-color" in view.caption.value


# -- CandidateTable and PredictedVsMeasured --------------------------------------------------------


def test_candidate_table_picks_a_rank_and_draws_measured_points():
    c = construction()
    table = CandidateTable(c)
    assert table.table.value.count("<tr") == len(c.candidates) + 1
    table.picker.value = 2
    assert table.rank == 2 and table.candidate is c.candidates[1]
    kinds = {t.name for t in table.roofline_view.figure.data}
    assert "predicted" in kinds and "measured" not in kinds
    table.measured = {1: 1e-3, 3: 2e-3}
    measured = next(t for t in table.roofline_view.figure.data if t.name == "measured")
    head, _ = table_cells(table.table.value)
    unit = re.fullmatch(r"predicted \((s|ms|us|ns)\)", head[1]).group(1)
    assert sorted(measured.customdata) == [1, 3] and f"measured ({unit})" in head  # in one unit with the predictions


def test_candidate_table_explains_the_picked_estimate_measured_and_modelled():
    from dataclasses import replace

    from workbench.hardware.spec import MicroKernel

    # Calibration measured every register tile tiny-cpu's alignment allows (1-28 rows, 1-4 vectors
    # of 16 lanes): a register tile of the matmul's shape then has a measured compute term.
    kernels = tuple(MicroKernel("float32", rows, 16 * vectors, 150.0) for rows in range(1, 29) for vectors in range(1, 5))
    c = construct(matmul(256, 256, 256), replace(device("tiny-cpu"), calibrated=True, micro_kernels=kernels),
                  options=Options(topk=4))
    assert any(p.startswith("compute: level-0 micro-kernel") for cand in c.candidates for p in cand.estimate.measured)
    table = CandidateTable(c)
    for cand in c.candidates:
        table.rank = cand.rank
        measured, modelled = table.estimate.value.split("<b>modelled:</b>")
        assert f"<b>#{cand.rank}</b>: predicted {duration(cand.predicted_seconds)}, bound by" in measured
        assert "<b>measured on the device:</b> " + escape("; ".join(cand.estimate.measured)) in measured
        assert modelled.startswith(" " + escape("; ".join(cand.estimate.modelled)) + "</p>")
    uncalibrated = CandidateTable(construction())  # the plain tiny-cpu: nothing measured
    assert "<b>measured on the device:</b> nothing (the device spec is not calibrated)" in uncalibrated.estimate.value


def table_cells(html: str) -> tuple[list[str], list[list[str]]]:
    """The header and the body cells of the one table in `html`, unescaped."""
    from html import unescape

    head = [unescape(h) for h in re.findall(r"<th\b[^>]*>(.*?)</th>", html)]
    rows = re.findall(r"<tr\b[^>]*>(.*?)</tr>", html)[1:]  # the first is the header
    body = [[unescape(d) for d in re.findall(r"<td\b[^>]*>(.*?)</td>", row)] for row in rows]
    return head, body


@pytest.mark.parametrize("policy", ["roller", "markov"])
def test_candidate_table_rows_are_the_pipeline_candidate_rows(policy):
    # The dashboard shows `pipeline.candidate_rows` too: same columns, same cells, so the two
    # tables cannot drift apart. On a GPU, Markov candidates carry virtual threads (a column):
    # on the V100's 512^3 matmul its top 4 has some (its 256^3 top 4 has none since the walk's
    # benefits became dimensionless).
    size = 512 if policy == "markov" else 256
    c = construct(matmul(size, size, size), device("v100" if policy == "markov" else "tiny-cpu"), policy, Options(topk=4))
    table = CandidateTable(c)
    for measured in ({}, {2: 3e-4}):
        table.measured = measured
        rows = pipeline.candidate_rows(c.candidates, measured=measured)
        assert table.rows == rows
        columns = [k for k in rows[0] if any(r[k] is not None for r in rows)]
        head, body = table_cells(table.table.value)
        unit = re.fullmatch(r"predicted \((s|ms|us|ns)\)", head[1]).group(1)  # one unit, chosen from the times
        assert head == columns and (f"measured ({unit})" in head) == bool(measured)
        assert body == [[cell_text(r[k]) for k in columns] for r in rows]
        assert ("vthreads" in head) == any(cand.program.vthreads for cand in c.candidates) == (policy == "markov")
        assert {*c.candidates[0].program.layers, "rank", "bottleneck", "grid", "waves"} <= set(head)


def test_profile_button_runs_the_session_and_feeds_bar_scatter_and_table():
    import traitlets

    c = construction()
    table = CandidateTable(c)
    profiler = PredictedVsMeasured(c, runner="fake")
    traitlets.dlink((profiler, "measured"), (table, "measured"))
    drawn = []  # every figure the scatter shows: one as each measurement arrives, then the result's
    show = profiler.scatter_view.show
    profiler.scatter_view.show = lambda fig: (drawn.append(fig), show(fig))
    profiler.button.click()
    result = profiler.result
    n = len(c.candidates)
    assert [len(f.data[0].customdata) for f in drawn[:n]] == list(range(1, n + 1)) and len(drawn) == n + 1
    assert drawn[n - 1].layout.title.text.startswith(f"{n} of {n} so far")
    assert result is not None and result.runner == "fake" and len(result.measurements) == len(c.candidates)
    assert profiler.progress.value == profiler.progress.max == len(c.candidates)  # the fake runner builds nothing
    assert profiler.measured == {m.rank: m.best_seconds for m in result.measurements} == table.measured
    points = next(t for t in profiler.scatter_view.figure.data if t.name != "y = x")
    assert sorted(points.customdata) == [cand.rank for cand in c.candidates]
    assert "correct and timed" in profiler.status.value and not profiler.button.disabled
    assert escape(result.best_note()) in profiler.status.value  # the best, with the ranks within noise of it


def test_profile_with_a_bad_runner_shows_the_error_and_keeps_no_result():
    profiler = PredictedVsMeasured(construction(), runner="nope")
    assert profiler.profile() is None
    assert profiler.result is None and "unknown runner" in profiler.status.value


def test_profile_local_runner_counts_build_and_measure_events(tmp_path):
    c = construct(matmul(32, 32, 32), device("tiny-cpu"), "roller", Options(topk=2))
    profiler = PredictedVsMeasured(c, store_path=str(tmp_path / "runs.sqlite"))
    result = profiler.profile()
    assert profiler.progress.max == 2 * len(c.candidates) == profiler.progress.value
    assert result.run_id is not None and all(m.ok for m in result.measurements)


# -- ExportButton ---------------------------------------------------------------------------------


def test_export_button_writes_a_verified_bundle_and_refuses_to_overwrite(tmp_path):
    c = construct(matmul(32, 32, 32), device("tiny-cpu"), "roller", Options(topk=2))
    export = ExportButton(c, rank=2, folder=tmp_path)
    export.measured = {2: 1.5e-6}
    export.button.click()
    path = Path(export.path)
    assert export.verified and path.parent == tmp_path and str(path) in export.status.value
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["rank"] == 2 and manifest["measured_seconds"] == 1.5e-6
    assert manifest["rprogram"]["layers"][0]["tile"] == dict(zip(("i", "j", "k"), c.candidates[1].program.tiles[0]))
    assert export.export() is None and "not empty" in export.status.value and export.path == ""


def test_export_button_zips(tmp_path):
    c = construct(matmul(32, 32, 32), device("tiny-cpu"), "roller", Options(topk=1))
    export = ExportButton(c, folder=tmp_path, zip=True)
    path = export.export()
    assert path.suffix == ".zip" and path.exists() and export.verified


def test_export_button_takes_the_cli_path_refusals_included(tmp_path):
    # The widget calls export_candidate: the manifest says how the kernel was checked, and a bad
    # folder is refused in one line before anything is built, leaving nothing behind.
    c = construct(matmul(32, 32, 32), device("tiny-cpu"), "roller", Options(topk=1))
    export = ExportButton(c, folder=tmp_path / "a")
    path = export.export()
    verification = json.loads((path / "manifest.json").read_text())["verification"]
    assert verification["ran"] is True and "max abs error" in export.status.value
    assert export.kernel.ok and export.kernel.executable is None  # built in a worker process
    (tmp_path / "file").write_text("mine")
    export.folder.value = str(tmp_path / "file")
    assert export.export() is None and export.path == "" and not export.verified
    assert "is not a directory" in export.status.value and export.status.value.count("<p") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "file"]


def test_export_button_for_another_cpu_says_it_was_not_run(tmp_path):
    from dataclasses import replace

    from workbench.hardware.detect import local_cpu_info

    xeon = device("xeon-avx512")
    # tiny-cpu's tiles, built for Skylake-SP: run here only on a CPU with AVX-512.
    c = construct(matmul(32, 32, 32), replace(device("tiny-cpu"), target=xeon.target), "roller", Options(topk=1))
    export = ExportButton(c, folder=tmp_path)
    path = export.export()
    has_avx512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= local_cpu_info().flags
    assert path is not None and export.verified is has_avx512
    assert ("checked against numpy" if has_avx512 else "not run here") in export.status.value


# -- ModelView and its figures ----------------------------------------------------------------------


def test_model_view_lists_operators_and_draws_every_rtask():
    view = ModelView(ROOT / "sample_models" / "mlp.onnx", "v100")
    plan = view.result.plan
    assert view.operators.value.count("<tr") == len(view.result.results) + 1
    head, _ = table_cells(view.operators.value)
    assert any(re.fullmatch(r"predicted \((s|ms|us|ns)\)", h) for h in head) and "predicted us" not in head
    bars = [t for t in view.gantt_view.figure.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == sum(len(w.placements) for w in plan.waves)
    imported = view.model  # the path, imported by the first construction
    assert imported is view.result.model and imported.name == "mlp"
    view.policy_buttons.value = "markov"
    assert view.policy == view.result.policy == "markov"
    assert view.result.model is imported  # a policy switch constructs again, it does not import again


def test_model_view_says_what_was_measured_and_what_modelled():
    from dataclasses import replace
    from html import unescape

    gpu = ModelView(ROOT / "sample_models" / "mlp.onnx", "v100")  # a preset: nothing measured
    assert "best candidate: modelled for every operator. For every operator, measured on the device: nothing; " \
        in unescape(gpu.summary.value)
    view = ModelView(ROOT / "sample_models" / "mlp.onnx", replace(device("tiny-cpu"), calibrated=True))
    best = [r.candidates[0].estimate for r in view.result.results]
    assert len(best) == 3 and all(r.supported for r in view.result.results)
    head, body = table_cells(view.operators.value)
    compute = ["measured" if any(p.startswith("compute") for p in e.measured) else "modelled" for e in best]
    assert [row[head.index("compute")] for row in body] == compute
    shared = {kind: [p for p in getattr(best[0], kind) if not p.startswith("compute")
                     and all(p in getattr(e, kind) for e in best)] for kind in ("measured", "modelled")}
    assert shared["measured"], "a calibrated spec's peak or bandwidths are measured for every operator"
    assert (f"measured on the device: {'; '.join(shared['measured'])}; modelled: {'; '.join(shared['modelled'])}.</p>"
            in unescape(view.summary.value))


def test_gantt_places_each_rtask_on_its_veu_with_its_times():
    ops = (ROperator("a", (), (rkernel(1, 3, 3e-6, 2),)), ROperator("b", (), (rkernel(1, 1, 1e-6, 2),)),
           ROperator("c", (0, 1), (rkernel(1, 2, 2e-6, 2),)))
    plan = schedule(ops, 2)
    fig = gantt_figure(plan, ["a", "b", "c"])
    assert [t.name for t in fig.data] == ["a", "b", "c"]
    placed = {(p.op, p.task): p for w in plan.waves for p in w.placements}
    for op, trace in enumerate(fig.data):
        for veu, base, width, data in zip(trace.y, trace.base, trace.x, trace.customdata):
            p = placed[(op, data[1])]
            assert (veu, base, base + width) == pytest.approx((p.veu, p.start * 1e6, p.end * 1e6))
    assert len(fig.layout.shapes) == len(plan.waves)  # a line where each wave ends


def test_operator_times_marks_unsupported_operators():
    fig = operator_times_figure(["mm", "gather"], ["reduction", "multi-output"], [2e-6, None], ["", "not affine"])
    bar = fig.data[0]
    assert list(bar.x) == pytest.approx([2.0, 0.0]) and "unsupported: not affine" in bar.text[1]


def test_plot_view_sends_plotly_json_and_clears():
    view = PlotView(operator_times_figure(["x"], ["elementwise"], [1e-6]))
    assert json.dumps(plotted(view))  # plain JSON for the frontend
    view.clear()
    assert view.outputs == () and view.figure is None
