"""The front door: a request in, a finished construction out, and profile, export and the
candidate's JSON and table forms taking that construction and nothing else."""

import json

import pytest
from helpers import TINY_CPU, device, expr, matmul

from workbench import pipeline
from workbench.construct.stepper import Stepper
from workbench.errors import UserError
from workbench.fmt import table_time_unit
from workbench.profile.fake import FakeRunner
from workbench.workload import Workload, suite_workload

# The keys shared/design/CLI.md promises for a candidate of `workbench construct` and, with a
# measurement, of `workbench profile`.
CONSTRUCT_KEYS = {"rank", "predicted_seconds", "bottleneck", "grid"}
PROFILE_KEYS = CONSTRUCT_KEYS | {"measured_seconds", "correct"}


def _request(**kw):
    return pipeline.request(Workload(op="matmul", params=(("K", 64), ("M", 48), ("N", 80))), TINY_CPU,
                            options=pipeline.Options(topk=4), **kw)


def test_request_takes_what_a_user_types():
    req = pipeline.request("cpu-core:mm-512", "v100", "markov", pipeline.Options(topk=3))
    assert req.workload == suite_workload("cpu-core:mm-512") and req.device == device("v100")
    assert req.label == "cpu-core:mm-512"
    assert req.describe() == "cpu-core:mm-512 on v100 (markov, top-3)"
    built = pipeline.request(expr("relu", shape=(17, 11, 3)), TINY_CPU)
    assert built.label == "relu shape=17x11x3" and built.expr() is built.workload


@pytest.mark.parametrize("args, message", [
    (("cpu-core:mm-512", "v100", "nope"), "unknown policy 'nope'"),
    (("cpu-core:nope", "v100"), "nope"),
    (("cpu-core:mm-512", "no-such-device"), "no-such-device"),
    ((42, "v100"), "expected a Workload, a TensorExpr or 'SUITE:ID', got int"),
    (("cpu-core:mm-512", 3.5), "expected a DeviceSpec or a preset name, got float"),
])
def test_a_bad_request_is_one_user_error(args, message):
    with pytest.raises(UserError, match=message):
        pipeline.request(*args)


def test_top_k_below_one_is_refused():
    with pytest.raises(UserError, match="top-K must be >= 1, got 0"):
        pipeline.request("cpu-core:mm-512", "v100", options=pipeline.Options(topk=0))


def test_construct_is_the_stepper_finished():
    req = _request()
    c = pipeline.construct(req)
    s = pipeline.stepper(req)
    assert s.position == 0
    again = s.finish()
    assert c.candidates == again.candidates and c.graph == again.graph and c.steps == again.steps
    assert [cand.rank for cand in c.candidates] == list(range(1, len(c.candidates) + 1)) and len(c.candidates) == 4
    assert all(cand.device == TINY_CPU and cand.expr == c.expr for cand in c.candidates)


def test_profile_takes_the_construction_and_stores_under_its_label(tmp_path):
    from workbench.profile.store import RunStore

    c = pipeline.construct(_request())
    with RunStore(tmp_path / "runs.db") as store:
        result = pipeline.profile(c, FakeRunner(), label="my matmul", store=store)
        (run,) = store.runs()
    assert result.candidates == c.candidates and result.policy == c.policy and result.device == TINY_CPU.name
    assert run.workload == "my matmul" and run.id == result.run_id
    doc = result.to_dict()
    for cand, m, data in zip(c.candidates, result.measurements, doc["candidates"]):
        assert PROFILE_KEYS <= set(data)
        diagnosis = data.pop("diagnosis")  # the profile document adds the diagnosis to the one candidate form
        assert data == json.loads(json.dumps(cand.to_dict(m)))
        assert diagnosis == json.loads(json.dumps(result.diagnoses[cand.rank].to_dict()))
        assert data["measured_seconds"] == m.best_seconds


def test_profile_picks_ranks_and_refuses_a_missing_one():
    c = pipeline.construct(_request())
    result = pipeline.profile(c, FakeRunner(), ranks=[2, 4])
    assert [cand.rank for cand in result.candidates] == [2, 4]
    with pytest.raises(UserError, match="rank 9: the construction has 4 candidates"):
        pipeline.profile(c, FakeRunner(), ranks=[9])


def test_export_refuses_a_bad_rank_or_path_before_building(tmp_path):
    c = pipeline.construct(_request())
    with pytest.raises(UserError, match="rank 5: the construction has 4 candidates"):
        pipeline.export(c, 5, tmp_path / "bundle")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="file"):
        pipeline.check_export_path(tmp_path / "file" / "bundle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_candidate_json_has_the_contract_keys_and_each_layer():
    c = pipeline.construct(_request())
    for cand in c.candidates:
        data = cand.to_dict()
        assert CONSTRUCT_KEYS <= set(data) and "measured_seconds" not in data
        assert [l["name"] for l in data["layers"]] == list(cand.program.layers)
        assert all(l["footprint_bytes"] <= l["capacity_bytes"] for l in data["layers"])
        assert data["rprogram"] == cand.program.to_dict() and json.loads(json.dumps(data)) == data


def test_candidate_rows_show_measured_times_of_correct_kernels_only():
    c = pipeline.construct(_request())
    result = pipeline.profile(c, FakeRunner(incorrect=frozenset({2})))
    rows = pipeline.candidate_rows(c.candidates, result.measurements)
    layers = list(c.candidates[0].program.layers)
    by_rank = {m.rank: m for m in result.measurements}
    # one unit for the table's times, the unit of their median: no "us" column holding 107427.73
    times = [t for cand in c.candidates for t in (cand.predicted_seconds, by_rank[cand.rank].best_seconds,
                                                   by_rank[cand.rank].median_seconds) if t is not None]
    unit, scale = table_time_unit(times)
    assert list(rows[0]) == ["rank", f"predicted ({unit})", f"measured ({unit})", "% peak compute", "% peak bandwidth",
                             "binds", f"median ({unit})", "spread %", "error", "bottleneck", "compute", "grid", "waves",
                             *layers, "plan"]
    for cand, row in zip(c.candidates, rows):
        assert row["rank"] == cand.rank and row[f"predicted ({unit})"] == pytest.approx(cand.predicted_seconds / scale)
        m = by_rank[cand.rank]
        assert row[f"measured ({unit})"] == (pytest.approx(m.best_seconds / scale) if m.ok else None)
        assert row[f"median ({unit})"] == (pytest.approx(m.median_seconds / scale) if m.ok else None)
        if m.ok:  # 5 repeats: the interval is [min, max], as a share of the median
            assert row["spread %"] == pytest.approx((max(m.seconds) - min(m.seconds)) / m.median_seconds * 100)
        assert row["error"] == m.error
        if m.ok:  # the measured time's shares of the roofs, as the diagnosis gives them
            d = result.diagnoses[cand.rank]
            assert row["% peak compute"] == pytest.approx(d.compute_share * 100) and 0 < row["% peak compute"]
            assert row["% peak bandwidth"] == pytest.approx(d.bandwidth_share[1] * 100) and row["binds"] == d.binding
    assert rows[1][f"measured ({unit})"] is None and "wrong result" in rows[1]["error"]
    assert rows[1]["% peak compute"] is None and rows[1]["binds"] is None


def test_candidate_rows_show_a_learnt_correction_and_what_was_measured():
    """A correction from the runs store adds the corrected prediction beside the model's; the
    compute column says whether a calibrated micro-kernel gave the compute term."""
    from workbench.profile.correction import Correction, StageFit, corrected_seconds

    c = pipeline.construct(_request())
    fit = StageFit(2.0, tuple((name, 1.0) for name, _ in c.candidates[0].estimate.load_seconds), 0.0, 40, 8)
    correction = Correction(c.device.name, fit)
    rows = pipeline.candidate_rows(c.candidates, correction=correction)
    unit, scale = table_time_unit([x for cand in c.candidates for x in (
        cand.predicted_seconds, corrected_seconds(cand.estimate, correction, cand.program.expr.op))])
    assert list(rows[0])[:4] == ["rank", f"predicted ({unit})", f"corrected ({unit})", "bottleneck"]
    for cand, row in zip(c.candidates, rows):
        assert row[f"corrected ({unit})"] == pytest.approx(corrected_seconds(cand.estimate, correction, cand.program.expr.op) / scale)
        assert row[f"corrected ({unit})"] != pytest.approx(row[f"predicted ({unit})"])
        assert row["compute"] == ("measured" if any(p.startswith("compute") for p in cand.estimate.measured) else "modelled")


def test_candidate_rows_before_profiling_and_with_virtual_threads():
    plain = pipeline.candidate_rows(pipeline.construct(_request()).candidates)
    assert not [k for k in plain[0] if k.startswith("measured")] and "error" not in plain[0] and "vthreads" not in plain[0]
    s = Stepper(matmul(512, 512, 512), device("v100"), "markov", pipeline.Options(topk=10))
    cands = s.finish().candidates
    rows = pipeline.candidate_rows(cands, measured={1: 2e-6})
    unit, scale = table_time_unit([c.predicted_seconds for c in cands] + [2e-6])
    assert rows[0][f"measured ({unit})"] == pytest.approx(2e-6 / scale)
    assert all(r[f"measured ({unit})"] is None for r in rows[1:])
    assert any(c.program.vthreads for c in cands)  # Markov on a GPU sets virtual threads
    for cand, row in zip(cands, rows):
        assert row["vthreads"] == (", ".join(f"{a}x{v}" for a, v in cand.program.vthreads) or None)


def test_construct_model_takes_a_path_or_an_imported_model():
    from helpers import ROOT

    from workbench.models.onnx_import import import_model

    path = next(iter(sorted((ROOT / "sample_models").glob("*.onnx"))))
    by_path = pipeline.construct_model(path, TINY_CPU, options=pipeline.Options(topk=2))
    by_model = pipeline.construct_model(import_model(path), TINY_CPU, options=pipeline.Options(topk=2))
    assert [r.operator.name for r in by_path.results] == [r.operator.name for r in by_model.results]
    assert [r.candidates for r in by_path.results] == [r.candidates for r in by_model.results]
    assert any(r.supported for r in by_path.results)


def test_a_model_with_symbolic_dims_is_imported_at_the_values_given_as_text_or_mapping():
    from helpers import ROOT

    path = ROOT / "sample_models" / "mlp_dynamic.onnx"
    assert pipeline.model_symbolic_dims(path) == ("batch", "seq")
    assert pipeline.model_symbolic_dims(ROOT / "sample_models" / "mlp.onnx") == ()
    by_text = pipeline.import_onnx(path, "seq=4")
    by_list = pipeline.import_onnx(path, ["batch=1", "seq=4"])
    by_map = pipeline.import_onnx(path, {"seq": 4})
    assert by_text.inputs == by_list.inputs == by_map.inputs == (("x", (1, 4, 128), "float32"),)
    assert [(d.name, d.value, d.default) for d in by_text.dims] == [("batch", 1, True), ("seq", 4, False)]
    assert [d.default for d in by_list.dims] == [False, False]  # given, even at the default value
    with pytest.raises(UserError, match="the model has no symbolic dim 'heads'"):
        pipeline.import_onnx(path, "heads=2")


def test_bundle_name_and_peak_come_with_the_construction():
    c = pipeline.construct(_request())
    name = pipeline.bundle_name_for(c, 2, "cpu-core:mm 512")
    assert "tiny-cpu" in name and "roller" in name and name.endswith("rank2") and "/" not in name and " " not in name
    assert c.peak_gflops > 0


# The stages of the pipeline: a face reaches them through the front door only.
STAGES = ("workbench.construct.stepper", "workbench.construct.policies", "workbench.construct.policy",
          "workbench.rtile", "workbench.codegen.build", "workbench.export", "workbench.codegen.rules",
          "workbench.profile.session", "workbench.profile.runner", "workbench.profile.local",
          "workbench.workers", "workbench.models.construction", "workbench.models.onnx_import")
# Core modules (workbench.* outside the face, workbench.viz and workbench.fmt, the shared figures
# and number formats) a face may import at run time. Beyond the front door and the plain inputs
# (errors, workload, files, the runs store), the dashboard has the device controls (detection,
# calibration, presets) and the Kernel page's compiler views (target table, nvcc), the CLI its
# device and bench commands.
FACES = {
    "cli": (["workbench/cli.py"], 10),
    "app": (["app.py", "workbench/app/*.py"], 13),
    "widgets": (["workbench/widgets/*.py"], 8),
}


def _runtime_imports(path) -> set[str]:
    """workbench.* modules `path` imports when it runs (not those under `if TYPE_CHECKING:`)."""
    import ast

    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
            found |= {f"workbench.{a.name}" for a in node.names} if node.module == "workbench" else {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("workbench")}
    return found


@pytest.mark.parametrize("face", sorted(FACES))
def test_faces_call_the_front_door(face):
    from helpers import ROOT

    patterns, limit = FACES[face]
    own = "workbench.cli" if face == "cli" else f"workbench.{face}"
    modules = set().union(*(_runtime_imports(p) for pattern in patterns for p in ROOT.glob(pattern)))
    core = sorted(m for m in modules if not m.startswith((own, "workbench.viz", "workbench.fmt")))
    assert "workbench.pipeline" in core
    assert not [m for m in core if m.startswith(STAGES)], core
    assert len(core) <= limit, core


def test_noise_that_hides_the_order_of_the_fastest_is_said():
    c = pipeline.construct(_request())
    loud = pipeline.profile(c, FakeRunner(spread=0.0, noise=0.5, seed=1))  # repeats vary far more than candidates
    tied = loud.indistinguishable
    assert tied and f"cannot be told apart from {', '.join(f'#{r}' for r in tied)}" in loud.noise_note()
    assert loud.to_dict()["indistinguishable_from_best"] == list(tied)
    quiet = pipeline.profile(c, FakeRunner(spread=0.3, noise=0.0))  # identical repeats: every median exact
    medians = {m.rank: m.median_seconds for m in quiet.measurements}
    fastest = min(medians, key=lambda r: (medians[r], r))
    assert quiet.indistinguishable == tuple(r for r in sorted(medians) if r != fastest and medians[r] == medians[fastest])
    assert (quiet.noise_note() == "") == (quiet.indistinguishable == ())


def test_diagnosis_rows_explain_each_correct_kernel():
    c = pipeline.construct(_request())
    result = pipeline.profile(c, FakeRunner(incorrect=frozenset({2})))
    rows = pipeline.diagnosis_rows(result)
    assert [r["rank"] for r in rows] == [m.rank for m in result.measurements if m.ok]
    for row in rows:
        cand, m = c.candidate(row["rank"]), next(m for m in result.measurements if m.rank == row["rank"])
        assert row["achieved GFLOP/s"] == pytest.approx(cand.estimate.flops / m.best_seconds / 1e9)
        assert row["% of peak"] == pytest.approx(row["achieved GFLOP/s"] / c.peak_gflops * 100)
        assert row["why"] == result.diagnoses[row["rank"]].sentence
    doc = result.to_dict()["candidates"]
    assert doc[1]["diagnosis"] is None and doc[0]["diagnosis"]["binding"] == rows[0]["binds"]
    first = doc[0]["diagnosis"]  # achieved rates beside the roofs they are shares of
    assert first["peaks"]["compute"] == c.peak_gflops and first["peaks_from"] == ("calibrated" if c.device.calibrated else "spec")
    for layer, gbps in first["achieved_gbps"].items():
        assert first["roof_shares"][layer] == pytest.approx(gbps / first["peaks"][layer])
