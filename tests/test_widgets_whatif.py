"""The what-if widgets driven without a browser (as tests/test_widgets.py drives the others): set
inputs and click buttons, then check the core values they mirror (`pipeline.edit_device`,
`pipeline.whatif`, `pipeline.whatif_sweep`) and the figures and tables they show. On the A100
preset a 64^3 matmul constructs in about a second."""

from __future__ import annotations

from html import escape

import pytest

from workbench import pipeline
from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.pipeline import Options
from workbench.widgets import DeviceEditor, SweepView, WhatIf
from workbench.workload import Workload

SMALL = Workload(op="matmul", params=(("K", 64), ("M", 64), ("N", 64)))
OTHER = Workload(op="matmul", params=(("K", 32), ("M", 128), ("N", 16)))
EDIT = "shared.capacity_bytes=0.25x"
OPTIONS = Options(topk=3)
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def test_the_editor_has_every_field_bounded_beside_its_base_value():
    w = DeviceEditor("a100")
    infos = {f.name: f for f in pipeline.editable_fields(load_spec("a100"))}
    assert set(w.inputs) == set(infos) and w.edited is None and w.edits == ()
    box = w.inputs["shared.capacity_bytes"]
    assert (box.value, box.min, box.max) == (infos["shared.capacity_bytes"].value, infos["shared.capacity_bytes"].low,
                                             infos["shared.capacity_bytes"].high)
    assert len(w.accordion.children) == len(w.accordion.titles) and "layer shared" in w.accordion.titles


def test_an_input_change_is_the_core_edit_and_reset_undoes_it(tmp_path):
    w = DeviceEditor("a100")
    w.inputs["compute_units"].value = 54
    expected = pipeline.edit_device("a100", ["compute_units=54"])
    assert w.edits == ("compute_units=54",) and w.edited == expected
    assert escape(expected.spec.name) in w.name_html.value
    assert w.inputs["peak_gflops.float32"].value == 19500.0  # follows the units: its note says so
    assert w.notes["peak_gflops.float32"].value.startswith("<small><b>9.75 TFLOP/s</b> on the edited device")
    w.save(tmp_path / "edited.toml")
    assert load_spec(tmp_path / "edited.toml") == expected.spec
    w.set("shared.capacity_bytes", "0.25x")  # an edit's text, resolved against the base
    assert w.inputs["shared.capacity_bytes"].value == 12288 and len(w.edited.changes) == 2
    w.reset_button.click()
    assert w.edited is None and w.edits == ()
    with pytest.raises(UserError, match="no field is edited"):
        w.save(tmp_path / "nothing.toml")


def test_a_refused_edit_shows_why_and_keeps_the_last_spec():
    w = DeviceEditor("a100", edits=[EDIT])
    before = w.edited
    assert before.changes == pipeline.edit_device("a100", [EDIT]).changes  # the input holds the resolved 12288
    w.inputs["registers.capacity_bytes"].value = 65536
    assert "must be larger than registers's" in w.error and "must be larger" in w.message_html.value
    assert w.edited == before
    with pytest.raises(UserError, match="no such field"):
        w.set("shared.size", 1)


def test_whatif_shows_both_top_k_the_divergence_and_the_words_of_the_core_diff():
    w = WhatIf(SMALL, "a100", options=OPTIONS)
    assert w.diffs == () and "Edit a field" in w.summary.value
    w.editor.set("shared.capacity_bytes", 12288)
    core = pipeline.whatif([SMALL], pipeline.edit_device("a100", ["shared.capacity_bytes=12288"]), "roller", OPTIONS)
    d = w.diff
    assert d.to_dict() == core.results[0].to_dict() and d.changed
    assert all(escape(line) in w.summary.value for line in d.explanation)
    assert f"diverge at step {d.walks_part_at}" in w.summary.value and d.walks_part_at == d.diverges_at_step
    for table, construction in ((w.base_table.value, d.base), (w.edited_table.value, d.edited)):
        assert table.count("<tr") == len(construction.candidates) + 1 and table.count("background-color") == 1
    stepper = w.stepper()
    assert stepper.position == d.walks_part_at and stepper.stepper.space.device == w.editor.edited.spec
    assert w.stepper(edited=False).stepper.space.device == load_spec("a100")


def test_whatif_over_several_workloads_stars_the_changed_top_ones():
    w = WhatIf([SMALL, OTHER], "a100", options=OPTIONS, edits=[EDIT])
    core = pipeline.whatif([SMALL, OTHER], pipeline.edit_device("a100", [EDIT]), "roller", OPTIONS).results
    assert [d.changed for d in w.diffs] == [d.changed for d in core] and w.diff is None
    stars = next(t for t in w.figure_view.figure.data if t.name == "top-1 changed")
    assert list(stars.x) == [d.label for d in core if d.changed]
    assert w.base_table.value.count("background-color") == sum(d.changed for d in core)


def test_sweep_view_draws_the_core_curves_with_their_change_points():
    w = SweepView(SMALL, "a100", field="shared.capacity_bytes", low="8KiB", high="96KiB", points=4, options=OPTIONS)
    core = pipeline.whatif_sweep([SMALL], "a100", "shared.capacity_bytes=8KiB:96KiB:4", "roller", OPTIONS)
    assert w.result.to_dict() == core.to_dict() and core.curves[0].changes
    curve = next(t for t in w.figure_view.figure.data if t.name == core.curves[0].label)
    assert list(curve.x) == list(core.values) and list(curve.y) == pytest.approx(core.curves[0].predicted_seconds)
    stars = next(t for t in w.figure_view.figure.data if t.name == "top-1 changes")
    assert list(stars.x) == [core.values[i] for i in core.curves[0].changes]
    assert w.table.value.count("<tr") == len(core.values) + 1
    assert PLOTLY_MIME in w.figure_view.outputs[0]["data"]
    w.low.value = "200KiB"
    w.sweep_button.click()
    assert w.result is None and "LO must be below HI" in w.message_html.value and w.figure_view.figure is None
    w.low.value, w.points.value = "8KiB", 1000
    w.sweep_button.click()
    assert w.result is None and "N must be an integer from 2 to" in w.message_html.value
