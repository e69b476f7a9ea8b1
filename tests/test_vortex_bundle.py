"""A Vortex bundle compiled on this CPU (small K and N, so it builds in seconds): every run is
verified against numpy; bad shapes, bad bundles and failed builds are one-line UserErrors."""

import json
import shutil

import pytest

from workbench import pipeline
from workbench.errors import UserError
from workbench.vortex import bundle as vortex
from workbench.workload import workload_from_args

pytestmark = pytest.mark.tvm


def _workload(op="matmul", shape="M=dyn,K=64,N=48"):
    return workload_from_args(op, shape, None, None, "float32")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("vortex") / "mm"
    return vortex.compile_bundle(_workload(), pipeline.load_device("local-cpu"), out, max_extent=256, limit=3)


def test_the_bundle_lists_verified_kernels(small):
    m = small.manifest
    assert 1 <= len(m["kernels"]) <= 3 and m["failed"] == []
    assert m["workload"] == {"op": "matmul", "dtype": "float32", "M": "dyn", "K": 64, "N": 48, "B": 0,
                             "trans_a": False, "trans_b": False}
    for k in m["kernels"]:
        values = [c["value"] for c in k["verified"]]
        assert len(values) >= 3 and values[0] == 1 and max(values) > k["outer"]
        assert all(c["correct"] for c in k["verified"])
        assert small.library(k["id"]).is_file()
    assert sorted(p.name for p in small.path.iterdir()) == sorted(
        [k["library"] for k in m["kernels"]] + ["manifest.json", "dispatch.json", "device.toml"])


def test_run_is_correct_at_one_a_prime_and_beyond_the_largest_tile(small):
    largest = max(k["outer"] for k in small.manifest["kernels"])
    for value in (1, 13, 2 * largest + 3):
        doc = vortex.run(small, value, seed=3)
        assert set(doc) >= {"shape", "kernel", "predicted_seconds", "measured_seconds", "correct"}
        assert doc["correct"], doc["error"]
        assert doc["shape"]["M"] == value and doc["shape"]["K"] == 64
        assert doc["measured_seconds"] > 0 and doc["predicted_seconds"] > 0
        assert doc["kernel"] == vortex.dispatch(small.table, value)[0]


def test_a_reloaded_bundle_dispatches_the_same(small):
    again = vortex.load_bundle(small.path)
    assert again.table == small.table and again.manifest == small.manifest


def test_the_bundle_plan_prices_the_bundle_kernels(small):
    plan = pipeline.vortex_bundle_plan(small)
    assert plan.table == small.table and plan.candidates is None
    assert plan.values[0] == 1 and plan.values[-1] == 256
    for row, (kernel, _) in zip(plan.curves, plan.table.kernels):
        assert list(row) == [plan.seconds(kernel, v) for v in plan.values]
    for value in (1, 13, 200):
        assert pipeline.vortex_pick(plan, value) == vortex.dispatch(small.table, value)


def test_the_dispatch_slider_runs_the_bundle_at_its_value(small):
    from workbench.widgets import DispatchSlider

    slider = DispatchSlider(pipeline.vortex_bundle_plan(small), small, value=13)
    assert not slider.run_button.disabled and slider.measured == {}
    result = slider.run()
    assert result["correct"], result["error"]
    assert result["kernel"] == slider.kernel and slider.measured == {13: result["measured_seconds"]}
    assert "measured" in slider.pick_html.value and "verified against numpy" in slider.status.value
    assert [t.name for t in slider.figure_view.figure.data].count("measured") == 1


@pytest.mark.parametrize(
    "shape, message",
    [
        ({"M": 0}, "M must be a positive integer"),
        ({"M": -4}, "M must be a positive integer"),
        ({"M": True}, "M must be a positive integer"),
        ({"M": 5, "K": 65}, "K=65 does not match the bundle's K=64"),
        ({"M": 5, "Q": 1}, "Q is not a parameter"),
        ({"K": 64}, "give the dynamic extent M"),
    ],
)
def test_bad_shapes_are_refused(small, shape, message):
    with pytest.raises(UserError, match=message):
        vortex.value_of(small, shape)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / "manifest.json").unlink(), "not a vortex bundle"),
        (lambda p: (p / "manifest.json").write_text("{"), "malformed bundle"),
        (lambda p: (p / "dispatch.json").write_text("[]"), "malformed bundle"),
        (lambda p: (p / "device.toml").unlink(), "malformed bundle"),
        (lambda p: (p / "k0.so").unlink(), "library k0.so is missing"),
    ],
)
def test_a_damaged_bundle_is_refused_in_one_line(small, tmp_path, damage, message):
    copy = tmp_path / "copy"
    shutil.copytree(small.path, copy)
    damage(copy)
    with pytest.raises(UserError, match=message) as err:
        vortex.load_bundle(copy)
    assert "\n" not in str(err.value)


def test_a_failed_build_is_recorded_and_nothing_is_written_when_all_fail(tmp_path, monkeypatch):
    from workbench.codegen.build import Kernel

    monkeypatch.setattr(vortex, "build_kernel", lambda *a, **k: Kernel(ok=False, error="schedule: broken on purpose"))
    out = tmp_path / "none"
    with pytest.raises(UserError, match="no kernel built and verified; first failure: schedule: broken on purpose"):
        vortex.compile_bundle(_workload(), pipeline.load_device("local-cpu"), out, max_extent=64, limit=2)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_existing_bundle_is_not_overwritten(small):
    with pytest.raises(UserError, match="is not empty"):
        vortex.compile_bundle(_workload(), pipeline.load_device("local-cpu"), small.path, max_extent=64, limit=1)


@pytest.mark.parametrize(
    "workload, device, message",
    [
        (_workload(shape="M=dyn,K=dyn,N=4"), "local-cpu", "one dynamic extent per workload"),
        (_workload(shape="M=4,K=4,N=4"), "local-cpu", "no dynamic extent"),
        (_workload(shape="M=4,K=4,N=dyn"), "local-cpu", "N cannot be dynamic"),
        (_workload(), "mi50", "builds CPU and CUDA kernels; mi50's target is rocm"),
        (_workload(), "xeon-avx512", "use --device local-cpu"),
    ],
)
def test_refused_workloads_and_devices(tmp_path, workload, device, message):
    with pytest.raises(UserError, match=message):
        vortex.compile_bundle(workload, pipeline.load_device(device), tmp_path / "b", max_extent=64, limit=1)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("op, shape, param", [("gemv", "M=dyn,K=64", "M"), ("matmul", "B=dyn,M=5,K=32,N=48", "B")])
def test_gemv_and_a_dynamic_batch(tmp_path, op, shape, param):
    b = vortex.compile_bundle(_workload(op, shape), pipeline.load_device("local-cpu"), tmp_path / "b", max_extent=64,
                              limit=1)
    assert b.table.dyn.param == param
    for value in (1, 11):
        doc = vortex.run(b, value)
        assert doc["correct"], doc["error"]


def test_the_manifest_is_json_with_the_dispatch_table_beside_it(small):
    table = json.loads((small.path / "dispatch.json").read_text())
    assert table["dynamic"] == {"param": "M", "axis": "i", "max_extent": 256}
    assert [k["id"] for k in table["kernels"]] == [k["id"] for k in small.manifest["kernels"]]


def test_a_kernel_that_fails_is_recorded_and_left_out_of_the_table(tmp_path, monkeypatch):
    from workbench.codegen.build import Kernel

    real, calls = vortex.build_kernel, []

    def first_fails(*args, **kwargs):
        calls.append(1)
        return Kernel(ok=False, error="compile: broken on purpose") if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(vortex, "build_kernel", first_fails)
    b = vortex.compile_bundle(_workload(), pipeline.load_device("local-cpu"), tmp_path / "b", max_extent=256, limit=3)
    assert [f["id"] for f in b.manifest["failed"]] == ["k0"]
    assert b.manifest["failed"][0]["error"] == "compile: broken on purpose"
    assert "k0" not in dict(b.table.kernels) and not (b.path / "k0.so").exists()
    assert len(b.table.kernels) == len(calls) - 1 >= 1
    assert vortex.run(b, 5)["kernel"] != "k0"


def test_a_value_beyond_int32_indexing_is_refused(small):
    with pytest.raises(UserError, match="over the limit of 2147483647"):
        vortex.run(small, 2**31 // 64 + 1)


def test_a_bundle_for_another_cpu_is_not_run_here(small, tmp_path):
    from dataclasses import replace

    from workbench.hardware.loader import load_spec
    from workbench.hardware.write import spec_to_toml

    local = load_spec("local-cpu")
    other = {**local.target_dict(), "mcpu": "a-cpu-this-is-not"}
    copy = tmp_path / "copy"
    shutil.copytree(small.path, copy)
    (copy / "device.toml").write_text(spec_to_toml(replace(local, name="other", target=tuple(sorted(other.items())))))
    with pytest.raises(UserError, match="built for another machine's CPU"):
        vortex.run(vortex.load_bundle(copy), 5)
