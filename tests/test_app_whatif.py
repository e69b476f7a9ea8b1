"""The What-if page (Streamlit AppTest): each control (a field's input, reset, save, the suite
comparison, the sweep) and the edited device in the URL, round trip and the divergence step's
link into the Construction page. On the A100 preset a 64^3 matmul constructs in about a second."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from tests.test_app import ROOT, button, charts, errors, title, values
from workbench import pipeline
from workbench.hardware.loader import load_spec
from workbench.workload import Workload

PAGE = "workbench/app/page_whatif.py"
LINK = {"op": "matmul", "shape": "K=64,M=64,N=64", "device": "a100", "policy": "roller", "topk": "3"}
EDIT = "shared.capacity_bytes=0.25x"  # on the A100: the shared tile shrinks, the walks part at step 9
SMALL = Workload(op="matmul", params=(("K", 64), ("M", 64), ("N", 64)))


def url_app(page: str = PAGE, **query) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def field(at: AppTest, name: str):
    return next(n for n in at.number_input if n.label.split(" (")[0] == name)


def shared(at: AppTest) -> dict[str, str]:
    return {k: at.query_params[k] for k in at.query_params}


def test_an_edited_field_becomes_the_device_and_the_page_shows_both_constructions():
    at = url_app(**LINK)
    assert at.title[0].value == "What-if" and not errors(at)
    assert at.info[0].value.startswith("Edit a field")
    capacity = field(at, "shared.capacity_bytes")
    bounds = next(f for f in pipeline.editable_fields(load_spec("a100")) if f.name == "shared.capacity_bytes")
    assert capacity.value == 49152 and (capacity.min, capacity.max) == (bounds.low, bounds.high)
    assert any(c.value.startswith("base 48 KiB; 1 B .. ") for c in at.caption)
    capacity.set_value(12288).run()
    assert not at.exception and not errors(at), errors(at)
    expected = pipeline.edit_device("a100", ["shared.capacity_bytes=12288"])
    assert at.session_state["selection"].device == expected.spec
    assert at.subheader[0].value == f"Edited device: {expected.spec.name}"
    core = pipeline.whatif([SMALL], expected, "roller", pipeline.Options(topk=3)).results[0]
    shown = "\n".join(m.value for m in at.markdown)
    assert core.changed and all(line in shown for line in core.explanation)
    assert f"diverge at **step {core.walks_part_at}**" in shown and core.walks_part_at == core.diverges_at_step
    base, edited = at.dataframe[1].value, at.dataframe[2].value  # after the changed fields
    assert len(base) == len(core.base.candidates) and len(edited) == len(core.edited.candidates)
    assert base["shared"][0] != edited["shared"][0] and list(base["grid"]) == [c.program.grid for c in core.base.candidates]
    assert any(c.value.startswith("**edited**, base 48 KiB") for c in at.caption)
    # Every page now works on the edited device; the Workload page names it.
    at.switch_page("workbench/app/page_workload.py").run()
    assert at.radio[1].value == "Edited on the What-if page" and not errors(at)


def test_a_refused_edit_says_why_and_keeps_the_device():
    at = url_app(**LINK)
    field(at, "registers.capacity_bytes").set_value(65536).run()
    assert any("shared.capacity_bytes (49152) must be larger than registers's (65536)" in e for e in errors(at))
    assert at.session_state["selection"].device == load_spec("a100")
    assert field(at, "registers.capacity_bytes").value == load_spec("a100").layers[0].capacity_bytes


def test_reset_returns_to_the_base_spec():
    at = url_app(**LINK, set=EDIT)
    assert at.session_state["selection"].device != load_spec("a100")
    button(at, "Reset to the base spec").click().run()
    assert at.session_state["selection"].device == load_spec("a100") and "set" not in shared(at)
    assert field(at, "shared.capacity_bytes").value == 49152


def test_the_url_carries_the_edit_and_restores_it():
    at = url_app(**LINK)
    field(at, "compute_units").set_value(54).run()
    link = shared(at)
    assert link["device"] == "a100" and link["set"] == "compute_units=54"
    again = url_app(**link)
    assert again.session_state["selection"] == at.session_state["selection"] and not errors(again)
    assert field(again, "compute_units").value == 54 and shared(again) == link
    # The peak follows the units: its input stays at the base value, its caption gives the edited one.
    assert field(again, "peak_gflops.float32").value == 19500.0
    assert any(c.value.startswith("**9.75 TFLOP/s** on the edited device (follows the edit), base 19.5 TFLOP/s")
               for c in again.caption)
    # Edits the page did not write itself, a factor among them, read back to the same spec.
    both = url_app(**LINK, set=f"{EDIT},global.bandwidth_gbps=2x")
    expected = pipeline.edit_device("a100", [EDIT, "global.bandwidth_gbps=2x"])
    assert both.session_state["selection"].device == expected.spec and shared(both)["set"] == f"{EDIT},global.bandwidth_gbps=2x"


@pytest.mark.parametrize("bad, message", [
    ({"set": "shared.size=1"}, "shared.size: no such field of a100"),
    ({"set": "compute_units=0"}, "compute_units"),
    ({"set": "compute_units"}, "an edit is FIELD=VALUE"),
    ({"step": "-3"}, "step must be a whole number of steps"),
])
def test_a_bad_edit_or_step_in_a_link_says_why_and_opens_the_sample(bad, message):
    at = url_app(page="", **LINK, **bad)
    assert any(message in e for e in errors(at)), errors(at)
    assert at.session_state["selection"].workload.label == "cpu-core:mm-512"


def test_the_divergence_links_open_the_construction_at_that_step_on_each_spec():
    at = url_app(**LINK, set=EDIT)
    line = next(m.value for m in at.markdown if "diverge at" in m.value)
    step = int(re.search(r"step (\d+)\*\*", line).group(1))
    links = re.findall(r"\]\((construction\?[^)]+)\)", line)
    assert len(links) == 2
    for link, device in zip(links, (load_spec("a100"), pipeline.edit_device("a100", [EDIT]).spec)):
        query = dict(parse_qsl(urlsplit(link).query))
        assert query["step"] == str(step)
        opened = url_app(page="workbench/app/page_construction.py", **query)
        assert opened.title[0].value == "Construction" and not errors(opened)
        assert opened.session_state["selection"].device == device
        assert opened.markdown[0].value.startswith(f"**Step {step}**")
        assert opened.slider[0].value == step


def test_save_writes_a_spec_that_loads_back_to_the_edited_one(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    at = url_app(**LINK, set=EDIT)
    name = pipeline.edit_device("a100", [EDIT]).spec.name
    assert any(d.proto.label == "Download the edited spec (TOML)" for d in at.get("download_button"))
    button(at, "Save the spec").click().run()
    assert not errors(at), errors(at)
    path = tmp_path / "devices" / f"{name}.toml"
    assert load_spec(path) == at.session_state["selection"].device
    next(t for t in at.text_input if t.label.startswith("Save as")).set_value("../outside.toml").run()
    button(at, "Save the spec").click().run()
    assert any("outside the workspace" in e for e in errors(at)) and not (tmp_path.parent / "outside.toml").exists()


def test_the_suite_comparison_marks_the_workloads_whose_top_one_changed(monkeypatch):
    # Two workloads stand in for the suite: a suite's 13 would take minutes on two cores.
    small = (SMALL, Workload(op="matmul", params=(("K", 32), ("M", 128), ("N", 16))))
    monkeypatch.setattr(pipeline, "suite", lambda name, seed=None: (name, small))
    at = url_app(**LINK, set=EDIT)
    button(at, "Compare the").click().run()
    assert not at.exception and not errors(at), errors(at)
    core = pipeline.whatif(small, pipeline.edit_device("a100", [EDIT]), "roller", pipeline.Options(topk=3)).results
    table = at.dataframe[-1].value
    assert list(table["top-1"]) == ["changed" if d.changed else "same" for d in core]
    assert list(table["walks part at step"].fillna(0)) == [d.walks_part_at or 0 for d in core]
    (chart,) = [c for c in charts(at) if title(c).startswith("Predicted time per workload")]
    stars = next(t for t in chart["data"] if t["name"] == "top-1 changed")
    assert list(stars["x"]) == [d.label for d in core if d.changed]


def test_a_sweep_draws_each_curve_with_its_change_points_and_a_table():
    at = url_app(**LINK)
    at.selectbox(key="sweep_field").set_value("shared.capacity_bytes")
    at.text_input(key="sweep_low").set_value("8KiB")
    at.text_input(key="sweep_high").set_value("96KiB")
    at.number_input(key="sweep_points").set_value(4)
    at.run()
    button(at, "Sweep").click().run()
    assert not at.exception and not errors(at), errors(at)
    core = pipeline.whatif_sweep([SMALL], "a100", "shared.capacity_bytes=8KiB:96KiB:4", "roller", pipeline.Options(topk=3))
    (chart,) = [c for c in charts(at) if title(c).startswith("Predicted time over shared.capacity_bytes")]
    curve = next(t for t in chart["data"] if t["name"] == core.curves[0].label)
    assert values(curve["x"]) == list(core.values) and values(curve["y"]) == pytest.approx(core.curves[0].predicted_seconds)
    stars = next(t for t in chart["data"] if t["name"] == "top-1 changes")
    assert values(stars["x"]) == [core.values[i] for i in core.curves[0].changes] and core.curves[0].changes
    table = at.dataframe[-1].value
    assert len(table) == len(core.values)
    assert [bool(x) for x in table["top-1 changes"]] == [i in core.curves[0].changes for i in range(len(core.values))]
    at.text_input(key="sweep_low").set_value("96KiB").run()
    button(at, "Sweep").click().run()
    assert any("LO must be below HI" in e for e in errors(at))


def test_apply_on_the_workload_page_keeps_the_edited_device_for_another_workload():
    at = url_app(page="workbench/app/page_workload.py", **LINK, set=EDIT)
    assert at.radio[1].value == "Edited on the What-if page" and not errors(at)
    next(n for n in at.number_input if n.label == "M").set_value(128).run()
    button(at, "Apply").click().run()
    assert not errors(at), errors(at)
    sel = at.session_state["selection"]
    assert dict(sel.workload.params)["M"] == 128 and sel.device == pipeline.edit_device("a100", [EDIT]).spec
    assert shared(at)["set"] == EDIT and shared(at)["device"] == "a100"
