"""What-if hardware (`whatif`): a workload constructed on a base and an edited spec, the top-1
diff, the step where the walks part, the change in words, sweeps and what this machine can
make real."""

from dataclasses import replace

import pytest
from helpers import device, matmul, unique_workloads, workload_expr

from workbench import whatif
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.hardware.edit import Edit, apply_edits, parse_edit, parse_sweep


def edit(spec, *texts):
    return apply_edits(spec, [parse_edit(t) for t in texts])


@pytest.mark.parametrize("layer, n", [("L2", 2048), ("L1", 1024)])
def test_doubling_a_layer_that_bounds_the_tile_grows_its_bytes(layer, n):
    spec = device("xeon-avx512")
    base = whatif.construction(matmul(n, n, n), spec).construction.candidates[0]
    at = base.program.layers.index(layer)
    # the precondition: the top-1 tile fills more than half the layer, so it cannot double along any axis
    assert base.estimate.footprints[at] > spec.layer(layer).capacity_bytes / 2
    diff = whatif.compare("mm", matmul(n, n, n), edit(spec, f"{layer}.capacity_bytes=2x"))
    assert diff.edited_top.footprints[at] > diff.base_top.footprints[at]
    before, after = dict(diff.base_top.tiles)[layer], dict(diff.edited_top.tiles)[layer]
    assert any(a > b for (_, b), (_, a) in zip(before, after))
    assert diff.changed and diff.diverges_at_step is not None
    assert any(w.startswith(f"{layer} tile ") and w.endswith(f"the bigger {layer} holds it")
               for w in diff.explanation)


@pytest.mark.parametrize("preset", ["xeon-avx512", "v100"])
def test_one_unit_never_predicts_faster(preset):
    edited = edit(device(preset), "compute_units=1")
    suite = whatif.compare_suite([(label, workload_expr(w)) for label, w in unique_workloads("cpu-core")], edited)
    assert len(suite.results) == 13
    for r in suite.results:
        assert r.edited_top.predicted_seconds >= r.base_top.predicted_seconds, r.label
    assert suite.geomean_speedup < 1


def test_an_edit_the_construction_does_not_read_leaves_the_walk_alone():
    spec = device("xeon-avx512")
    diff = whatif.compare("mm", matmul(512, 512, 512), edit(spec, "L2.latency_ns=9"))
    assert not diff.changed and diff.diverges_at_step is None and diff.walks_part_at is None
    assert diff.base_top == diff.edited_top and diff.explanation[0] == "same program"
    doc = diff.to_dict()
    assert doc["changed"] is False and doc["diverges_at_step"] is None and doc["predicted_speedup"] == 1.0


def test_the_walks_part_at_the_step_divergence_names():
    spec = device("xeon-avx512")
    expr, edited = matmul(1024, 1024, 1024), edit(spec, "L2.capacity_bytes=2x")
    diff = whatif.compare("mm", expr, edited)
    n = diff.walks_part_at
    assert n is not None
    a, b = Stepper(expr, spec), Stepper(expr, edited.spec)
    a.seek(n - 1), b.seek(n - 1)
    assert [(s.action, s.state) for s in a.steps[: n - 1]] == [(s.action, s.state) for s in b.steps[: n - 1]]
    x, y = a.next(), b.next()
    assert (x.action, x.state) != (y.action, y.state)


def test_a_top_one_reached_by_another_walk_has_no_divergence_step():
    spec = device("v100")  # a bigger shared memory: the walks part, the best program stays (roller-table1 M1)
    diff = whatif.compare("mm", matmul(128, 1000, 4032), edit(spec, "shared.capacity_bytes=96KiB"))
    assert diff.walks_part_at is not None and not diff.changed
    assert diff.diverges_at_step is None and diff.to_dict()["diverges_at_step"] is None


def test_divergence_of_walks():
    assert whatif.divergence((1, 2, 3), (1, 2, 3)) is None
    assert whatif.divergence((1, 2, 3), (1, 5, 3)) == 2
    assert whatif.divergence((1, 2), (1, 2, 3)) == 3


def test_the_top_one_is_the_constructions_and_its_json_has_the_contract():
    spec = device("v100")
    diff = whatif.compare("mm", matmul(1024, 1024, 1024), edit(spec, "shared.capacity_bytes=96KiB"))
    top = diff.base.candidates[0]
    assert diff.base_top.predicted_seconds == top.predicted_seconds and diff.base_top.grid == top.program.grid
    assert diff.base_top.bound == top.estimate.bottleneck
    doc = diff.to_dict()
    for side in ("base", "edited"):
        assert {"tiles", "grid", "predicted_seconds", "bound"} <= set(doc[side])
        assert list(doc[side]["tiles"]) == list(diff.base.candidates[0].program.layers)
    assert doc["predicted_speedup"] == pytest.approx(doc["base"]["predicted_seconds"] / doc["edited"]["predicted_seconds"])
    assert len(doc["base_topk"]) == len(diff.base.candidates)


def test_a_base_is_constructed_once_for_every_edit():
    spec, expr = device("xeon-avx512"), matmul(256, 256, 256)
    first = whatif.compare("mm", expr, edit(spec, "L2.capacity_bytes=2x"))
    second = whatif.compare("mm", expr, edit(spec, "DRAM.bandwidth_gbps=2x"))
    assert first.base is second.base


def test_sweep_change_points_are_where_the_pointwise_top_one_changes():
    spec = device("xeon-avx512")
    items = [("mm-1024", matmul(1024, 1024, 1024)), ("mm-skinny", matmul(4096, 1024, 64))]
    result = whatif.sweep(items, spec, parse_sweep("L2.capacity_bytes=256KiB:4MiB:5"))
    assert result.geometric and result.values == (2**18, 2**19, 2**20, 2**21, 2**22)
    for (label, expr), curve in zip(items, result.curves):
        pointwise = [whatif.compare(label, expr, apply_edits(spec, [Edit("L2.capacity_bytes", str(v))])).edited_top
                     for v in result.values]
        assert list(curve.tops) == pointwise
        assert curve.changes == tuple(i for i in range(1, len(pointwise))
                                      if pointwise[i].program_key != pointwise[i - 1].program_key)
    assert any(c.changes for c in result.curves)  # the sweep sees the L2 tile move somewhere
    doc = result.to_dict()
    assert doc["field"] == "L2.capacity_bytes" and doc["base_value"] == 2**20 and doc["spacing"] == "geometric"
    for entry, curve in zip(doc["results"], result.curves):
        assert [c["value"] for c in entry["changes"]] == [result.values[i] for i in curve.changes]
        assert entry["predicted_seconds"] == list(curve.predicted_seconds)


def test_markov_walks_compare_with_their_seed():
    spec = device("xeon-avx512")
    options = Options(topk=3, seed=7)
    diff = whatif.compare("mm", matmul(256, 256, 256), edit(spec, "L2.latency_ns=9"), "markov", options)
    assert diff.diverges_at_step is None and not diff.changed


def test_only_fewer_cores_and_a_narrower_isa_are_real_here():
    local = replace(device("xeon-avx512"), name="local-cpu")
    real = lambda *texts: whatif.unrealisable(edit(local, *texts), "local-cpu")  # noqa: E731
    assert real("compute_units=1") == "" and real("target.mcpu=haswell") == "" and real("target.mcpu=x86-64-v2") == ""
    assert real("compute_units=4", "target.mcpu=haswell") == ""
    assert "not realisable on this machine" in real("L2.capacity_bytes=2MiB")
    assert "not realisable" in real("compute_units=56")  # more cores than the machine has
    haswell = edit(local, "target.mcpu=haswell").spec
    wider = whatif.unrealisable(apply_edits(replace(haswell, name="local-cpu"), [parse_edit("target.mcpu=skylake-avx512")]),
                                "local-cpu")
    assert "target.mcpu=skylake-avx512: not realisable" in wider
    assert "--device local-cpu" in whatif.unrealisable(edit(device("v100"), "compute_units=1"), "local-cpu")
