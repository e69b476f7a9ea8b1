"""The model's correction from the runs store: the non-negative fit against closed forms, the
shrinkage toward the model, the leave-one-workload-out before/after on synthetic data where the
correction must help and where it must not, the store round trip and `workbench runs fit`.

The synthetic stores hold candidates with stand-in programs and estimates (the correction reads
only the stored estimate's stage times and the measurements), so no construction or TVM is needed.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers import TINY_CPU
from workbench.cli import main
from workbench.errors import UserError
from workbench.profile.correction import (
    Correction, Row, Stages, blend, corrected_seconds, earned, evaluate, fit, fit_stages, nnls, op_class, signed_rank_test,
)
from workbench.profile.runner import Measurement
from workbench.profile.store import RunStore, refit, stored_rows

LAYERS = ("L1", "L2", "DRAM")


def stages(compute: float, l1: float, l2: float, dram: float, predicted: float | None = None) -> Stages:
    """Stages with the model's prediction the slowest stage (a pipeline), unless given."""
    loads = (("L1", l1), ("L2", l2), ("DRAM", dram))
    return Stages(compute, loads, max(compute, l1, l2, dram) if predicted is None else predicted)


def synthetic(truth, workloads: int = 8, per_workload: int = 10, noise: float = 0.0, seed: int = 0,
              op: str = "matmul") -> list[Row]:
    """Rows of `workloads` workloads: a workload's compute time is its own (the candidates share
    it up to 10 %), its loads spread over a decade; measured = truth(stages) x lognormal(noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(workloads):
        base = 10 ** rng.uniform(-5, -2)
        for rank in range(1, per_workload + 1):
            s = stages(base * rng.uniform(1.0, 1.1), *(base * 10 ** rng.uniform(-1.5, 0.5, size=3)))
            rows.append(Row(f"s:w{w}", op, w + 1, rank, s, truth(s) * math.exp(rng.normal(0.0, noise))))
    return rows


def linear(compute=0.0, l1=0.0, l2=0.0, dram=0.0, constant=0.0):
    def truth(s: Stages) -> float:
        loads = dict(s.load_seconds)
        return compute * s.compute_seconds + l1 * loads["L1"] + l2 * loads["L2"] + dram * loads["DRAM"] + constant
    return truth


# -- the fit ---------------------------------------------------------------------------------------


def brute_force_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The closed form: least squares on every subset of free columns; the best non-negative one."""
    best, best_residual = np.zeros(a.shape[1]), float(np.sum(b ** 2))
    for k in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), k):
            x = np.zeros(a.shape[1])
            x[list(subset)] = np.linalg.lstsq(a[:, subset], b, rcond=None)[0]
            residual = float(np.sum((a @ x - b) ** 2))
            if (x >= 0).all() and residual < best_residual - 1e-12:
                best, best_residual = x, residual
    return best


@pytest.mark.parametrize("seed", range(6))
def test_nnls_finds_the_best_non_negative_least_squares_solution(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(12, 4)) * 10.0 ** rng.uniform(-6, 0, size=4)  # columns of very different scales
    b = rng.normal(size=12)
    expected = brute_force_nnls(a, b)
    found = nnls(a, b)
    assert (found >= 0).all()
    np.testing.assert_allclose(a @ found, a @ expected, rtol=1e-9, atol=1e-12)


def test_nnls_clamps_a_coefficient_the_data_wants_negative():
    # b = 2 x0 - 1 x1 exactly: with x1 >= 0 the best is x1 = 0 and x0 the projection of b on column 0.
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    b = 2.0 * a[:, 0] - a[:, 1]
    x = nnls(a, b)
    assert x[1] == 0.0 and x[0] == pytest.approx(b.sum() / 3.0, rel=1e-12)


def test_nnls_on_degenerate_columns():
    a = np.array([[1.0, 1.0, 0.0], [2.0, 2.0, 0.0], [0.5, 0.5, 0.0]])  # a repeated column and an empty one
    x = nnls(a, np.array([1.0, 2.0, 0.5]))
    assert (x >= 0).all() and x[2] == 0.0 and x[0] + x[1] == pytest.approx(1.0)
    assert (nnls(a, -np.ones(3)) == 0.0).all()  # every column points away from b: nothing helps


def test_the_fit_recovers_known_coefficients():
    rows = synthetic(linear(compute=2.0, l2=0.5, dram=3.0, constant=1e-6))
    got = fit_stages(rows, LAYERS)
    assert got.compute == pytest.approx(2.0, rel=1e-8)
    assert dict(got.loads) == pytest.approx({"L1": 0.0, "L2": 0.5, "DRAM": 3.0}, rel=1e-8, abs=1e-10)
    assert got.constant == pytest.approx(1e-6, rel=1e-6)
    assert (got.measurements, got.workloads) == (80, 8)


def test_a_layer_absent_from_every_row_gets_no_coefficient():
    rows = [Row(r.workload, r.op, r.run_id, r.rank, Stages(r.stages.compute_seconds, r.stages.load_seconds[:2],
                                                          r.stages.predicted_seconds), r.measured_seconds)
            for r in synthetic(linear(compute=1.5, l1=0.25))]
    got = fit_stages(rows, LAYERS)
    assert dict(got.loads)["DRAM"] == 0.0
    assert got.compute == pytest.approx(1.5, rel=1e-8) and dict(got.loads)["L1"] == pytest.approx(0.25, rel=1e-8)


def test_one_measurement_stays_near_the_model():
    (row,) = synthetic(linear(compute=10.0), workloads=1, per_workload=1)
    correction = fit([row], "tiny-cpu")
    # W / (W + p): one workload against five coefficients (compute, three loads, constant).
    assert correction.overall.weight == pytest.approx(1 / 6)
    new = stages(2e-4, 1e-4, 5e-5, 3e-4)
    fitted = correction.fitted(new, "matmul")
    assert fitted == pytest.approx(10.0 * 2e-4)  # the one row's truth, put on the compute stage
    # The prediction moves a sixth of the way (in log time) toward the fit, no further.
    assert correction.apply(new, "matmul") == pytest.approx(new.predicted_seconds ** (5 / 6) * fitted ** (1 / 6))
    assert correction.apply(new) == correction.apply(new, "matmul")  # the class saw the same row


def test_the_weight_grows_with_the_workloads_seen():
    weights = [fit(synthetic(linear(compute=2.0), workloads=w), "tiny-cpu").overall.weight for w in (1, 5, 50)]
    assert weights == pytest.approx([1 / 6, 5 / 10, 50 / 55])


def test_an_operator_class_blends_its_own_fit_with_the_devices():
    rows = (synthetic(linear(compute=2.0), workloads=3, op="matmul")
            + [Row(r.workload + "-conv", r.op, r.run_id, r.rank, r.stages, r.measured_seconds)
               for r in synthetic(linear(dram=4.0), workloads=2, op="conv2d", seed=1)])
    correction = fit(rows, "tiny-cpu")
    classes = dict(correction.classes)
    assert set(classes) == {"matmul", "conv"}
    assert classes["conv"].weight == pytest.approx(2 / 7)
    new = stages(1e-4, 2e-5, 3e-5, 5e-5)
    device, conv = correction.overall.seconds(new), classes["conv"].seconds(new)
    assert conv == pytest.approx(4.0 * 5e-5)
    assert correction.fitted(new, "depthwise_conv2d") == pytest.approx(device ** (5 / 7) * conv ** (2 / 7))
    assert correction.fitted(new, "expr") == correction.fitted(new) == pytest.approx(device)  # no class


def test_op_classes():
    assert [op_class(op) for op in ("matmul", "gemv", "conv2d", "depthwise_conv2d", "relu", "gelu", "maxpool",
                                   "reduce_mean", "expr")] == [
        "matmul", "matmul", "conv", "conv", "elementwise", "elementwise", "reduction", "reduction", "other"]


def test_corrected_seconds_of_an_estimate_and_without_a_correction():
    estimate = SimpleNamespace(compute_seconds=1e-4, load_seconds=(("L1", 2e-5), ("L2", 3e-5), ("DRAM", 5e-5)),
                               predicted_seconds=1e-4)
    assert corrected_seconds(estimate, None) == 1e-4
    correction = fit(synthetic(linear(compute=3.0), workloads=4), "tiny-cpu")
    w = correction.overall.weight
    assert corrected_seconds(estimate, correction, "gemv") == pytest.approx(1e-4 ** (1 - w) * 3e-4 ** w, rel=1e-6)
    stored_form = {"compute_seconds": 1e-4, "load_seconds": {"L1": 2e-5, "L2": 3e-5, "DRAM": 5e-5},
                   "predicted_seconds": 1e-4, "bottleneck": "compute"}
    assert correction.apply(stored_form, "gemv") == corrected_seconds(estimate, correction, "gemv")


def test_a_correction_round_trips_through_json():
    correction = fit(synthetic(linear(compute=2.0, dram=1.0)) + synthetic(linear(l1=3.0), op="relu", seed=2), "d")
    again = Correction.from_dict(json.loads(json.dumps(correction.to_dict())))
    assert again == correction


# -- the before/after -----------------------------------------------------------------------------


def test_cross_validation_shows_a_correction_that_helps():
    # The model says max(stages); the device takes 2 x compute + 3 x DRAM (the loads do not overlap).
    rows = synthetic(linear(compute=2.0, dram=3.0), noise=0.05)
    ev = evaluate(rows, "tiny-cpu")
    assert ev.measurements == 80 and len(ev.workloads) == 8
    # The fit on the other 7 workloads is all but exact, and the blend keeps 1 - 7 / 12 = 5 / 12 of
    # the model's log error (plus a share of the 5 % noise).
    assert ev.after_error < ev.before_error / 2
    assert ev.after_spearman > ev.before_spearman + 0.2
    assert ev.improved == 8 and ev.claim
    assert "helps" in ev.summary()
    more = evaluate(synthetic(linear(compute=2.0, dram=3.0), workloads=40, noise=0.05), "tiny-cpu")
    assert more.after_error < more.before_error / 5  # 39 workloads seen: weight 39 / 44


@pytest.mark.parametrize("seed", range(5))
def test_cross_validation_claims_nothing_on_noise(seed):
    # The model is right; the measurements scatter around it by a factor of about 1.5.
    rows = synthetic(lambda s: s.predicted_seconds, noise=0.4, seed=seed)
    ev = evaluate(rows, "tiny-cpu")
    assert not ev.claim
    assert ev.after_error > ev.before_error * 0.9  # nothing real to learn, so nothing much gained
    assert "no improvement shown" in ev.summary()


def test_each_workload_is_scored_by_a_fit_that_never_saw_it():
    # Two workloads with opposite truths: held out, each is predicted by the other's fit alone.
    rows = synthetic(linear(compute=1.0), workloads=1) + [
        Row("s:other", r.op, 2, r.rank, r.stages, 10.0 * r.stages.compute_seconds)
        for r in synthetic(linear(compute=1.0), workloads=1, seed=3)]
    scores = {s.workload: s for s in evaluate(rows, "tiny-cpu").workloads}
    assert set(scores) == {"s:w0", "s:other"}
    # s:w0 (measured = compute) is predicted from the fit on s:other alone (10 x compute) and the
    # other way round, each with one workload's weight W / (W + p) = 1 / 6.
    for name, other_fit in (("s:w0", 10.0), ("s:other", 1.0)):
        held = [r for r in rows if r.workload == name]
        expected = [abs(math.log(blend(r.stages.predicted_seconds, other_fit * r.stages.compute_seconds, 1 / 6)
                                 / r.measured_seconds)) for r in held]
        assert scores[name].after_error == pytest.approx(float(np.median(expected)), rel=1e-6)


def test_one_workload_is_too_few_to_score():
    with pytest.raises(UserError, match="at least 2 workloads"):
        evaluate(synthetic(linear(compute=1.0), workloads=1), "tiny-cpu")


def test_blend_is_geometric_and_a_zero_fit_leaves_the_prior():
    assert blend(1e-3, 1e-1, 0.5) == pytest.approx(1e-2)
    assert blend(1e-3, 1e-1, 0.0) == pytest.approx(1e-3) and blend(1e-3, 1e-1, 1.0) == pytest.approx(1e-1)
    assert blend(1e-3, 0.0, 0.9) == 1e-3


@pytest.mark.parametrize("gains, p", [
    ([3.0, 2.0, 1.0], 1 / 8),  # every sign positive: the largest rank sum, 1 pattern in 8
    ([1.0, -2.0, 3.0], 3 / 8),  # rank sum 4: the subsets {1, 3}, {2, 3}, {1, 2, 3} of ranks reach it
    ([0.5, 0.5], 1 / 4),  # tied: ranks 1.5 each
    ([0.5, -0.5], 3 / 4),
    ([0.0, 2.0], 1 / 2),  # the zero gain is left out
    ([], 1.0),
])
def test_signed_rank_test_against_enumeration(gains, p):
    assert signed_rank_test(gains) == pytest.approx(p)


def test_signed_rank_test_weighs_magnitudes():
    # Ten small gains and three large losses: most workloads improved, yet no improvement is shown.
    assert signed_rank_test([0.01 * (i + 1) for i in range(10)] + [-1.0, -2.0, -3.0]) > 0.05
    assert signed_rank_test([0.1 * (i + 1) for i in range(8)]) == pytest.approx(1 / 256)


# -- the runs store and the CLI --------------------------------------------------------------------


@dataclass(frozen=True)
class StoredCandidate:
    """What `RunStore.start_run` reads of a candidate: its rank, program and estimate."""

    rank: int
    program: SimpleNamespace
    estimate: SimpleNamespace


def candidate(rank: int, s: Stages) -> StoredCandidate:
    estimate = {"compute_seconds": s.compute_seconds, "load_seconds": dict(s.load_seconds),
                "predicted_seconds": s.predicted_seconds, "bottleneck": "compute"}
    return StoredCandidate(rank, SimpleNamespace(to_dict=lambda: {"rank": rank}),
                           SimpleNamespace(predicted_seconds=s.predicted_seconds, to_dict=lambda: estimate))


def write_store(path, rows: list[Row], wrong: int = 0) -> None:
    """A runs store of `rows` on tiny-cpu, one run per workload; `wrong` more candidates per run
    measured incorrect (the fit must leave them out)."""
    with RunStore(path) as store:
        for name in dict.fromkeys(r.workload for r in rows):
            mine = [r for r in rows if r.workload == name]
            extra = [Row(name, mine[0].op, 0, len(mine) + i + 1, mine[0].stages, 1e-9) for i in range(wrong)]
            run_id = store.start_run(workload={"label": name, "op": mine[0].op, "dtype": "float32"}, device=TINY_CPU,
                                     policy="roller", runner="local",
                                     candidates=[candidate(r.rank, r.stages) for r in mine + extra])
            for r in mine:
                seconds = (r.measured_seconds * 1.2, r.measured_seconds)
                store.add_measurement(run_id, Measurement(r.rank, "local", seconds, True, "", 0.1))
            for r in extra:
                store.add_measurement(run_id, Measurement(r.rank, "local", (1e-9,), False, "wrong result", 0.1))
            store.finish_run(run_id)


def test_stored_rows_are_the_correct_measurements_with_their_estimates(tmp_path):
    rows = synthetic(linear(compute=2.0), workloads=3, per_workload=4)
    write_store(tmp_path / "runs.sqlite3", rows, wrong=2)
    with RunStore(tmp_path / "runs.sqlite3") as store:
        got = stored_rows(store, "tiny-cpu")
        assert stored_rows(store, "v100") == ()
    assert [(r.workload, r.rank, r.measured_seconds) for r in got] == [
        (r.workload, r.rank, pytest.approx(r.measured_seconds)) for r in rows]  # the fastest repeat
    def parts(s: Stages):
        return s.compute_seconds, dict(s.load_seconds), s.predicted_seconds  # JSON keeps no key order

    assert [parts(r.stages) for r in got] == [parts(r.stages) for r in rows]


def test_a_fitted_correction_is_stored_and_read_back(tmp_path):
    path = tmp_path / "runs.sqlite3"
    write_store(path, synthetic(linear(compute=2.0, dram=3.0), workloads=4))
    with RunStore(path) as store:
        assert store.correction("tiny-cpu") is None
        correction, evaluation = refit(store, "tiny-cpu")
    with RunStore(path) as again:  # a fresh connection: it survives a restart
        stored = again.correction("tiny-cpu")
        assert again.correction("v100") is None
    assert stored.correction == correction and stored.measurements == 40
    assert stored.evaluation == json.loads(json.dumps(evaluation.to_dict()))
    assert stored.fitted_at > 0


def test_a_refit_replaces_the_devices_correction(tmp_path):
    path = tmp_path / "runs.sqlite3"
    write_store(path, synthetic(linear(compute=2.0), workloads=2))
    with RunStore(path) as store:
        first, _ = refit(store, "tiny-cpu")
    write_store(path, synthetic(linear(compute=2.0), workloads=3, seed=5)[20:])  # a third workload
    with RunStore(path) as store:
        second, _ = refit(store, "tiny-cpu")
        assert store.correction("tiny-cpu").correction == second
    assert (first.overall.workloads, second.overall.workloads) == (2, 3)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_fit_prints_before_and_after_and_stores_the_correction(capsys, tmp_path):
    path = tmp_path / "runs.sqlite3"
    write_store(path, synthetic(linear(compute=2.0, dram=3.0), noise=0.05))
    code, out, _ = run_cli(capsys, "runs", "fit", "--device", "tiny-cpu", "--db", str(path))
    assert code == 0
    assert "80 measurements of 8 workloads" in out and "the correction helps" in out
    assert sum(line.startswith("s:w") for line in out.splitlines()) == 8  # one line per held-out workload
    code, out, _ = run_cli(capsys, "runs", "fit", "--device", "tiny-cpu", "--db", str(path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["device"] == "tiny-cpu" and doc["measurements"] == 80
    assert doc["evaluation"]["after"]["error"] < doc["evaluation"]["before"]["error"]
    assert doc["evaluation"]["claim"] is True and len(doc["evaluation"]["workloads"]) == 8
    with RunStore(path) as store:
        assert store.correction("tiny-cpu").correction.to_dict() == doc["correction"]


@pytest.mark.parametrize("workloads, device, needle", [
    (1, "tiny-cpu", "at least 2 workloads"),
    (2, "v100", "no correct measurements"),
    (0, "tiny-cpu", "no correct measurements"),
])
def test_runs_fit_with_too_few_measurements_is_one_line_exit_2(capsys, tmp_path, workloads, device, needle):
    path = tmp_path / "runs.sqlite3"
    write_store(path, synthetic(linear(compute=2.0), workloads=workloads, per_workload=3))
    code, out, err = run_cli(capsys, "runs", "fit", "--device", device, "--db", str(path))
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1
    with RunStore(path) as store:
        assert store.correction(device) is None  # nothing stored


def _evaluation(before_rho, after_rho, before_error=0.5, after_error=0.4) -> dict:
    return {"before": {"error": before_error, "spearman": before_rho},
            "after": {"error": after_error, "spearman": after_rho}}


@pytest.mark.parametrize("evaluation, applies", [
    (_evaluation(0.3, 0.5), True),
    (_evaluation(0.3, 0.5, after_error=0.5), True),  # the error no worse, the ranking better
    (_evaluation(0.5, 0.5), False),  # a ranking no better is not earned
    (_evaluation(0.3, 0.5, after_error=0.6), False),  # better ranks at worse times
    (_evaluation(None, 0.5), False),  # undefined: nothing to compare
])
def test_a_correction_is_applied_by_default_only_where_it_earned_it(evaluation, applies):
    assert earned(evaluation) is applies


def test_an_evaluation_says_whether_it_earned_it():
    rows = synthetic(linear(compute=2.0, dram=3.0), noise=0.05)
    evaluation = evaluate(rows, "tiny-cpu")
    assert evaluation.to_dict()["earned"] is evaluation.earned is earned(evaluation.to_dict())


def test_an_earned_correction_ranks_the_candidates_and_an_unearned_one_does_not(tmp_path):
    from tests.helpers import matmul
    from workbench import pipeline
    from workbench.construct.stepper import construct

    c = construct(matmul(64, 64, 64), TINY_CPU, "roller", pipeline.Options(topk=10))
    # a correction that adds the L2 stage to the compute, which the model hides under it for a
    # matmul's inputs (`model.cpu.hidden_source`): it orders them by their L2 transfers too
    with_l2 = Correction("tiny-cpu", fit_stages_of(compute=1.0, loads=(("L2", 1.0),)), ())
    expected = sorted(c.candidates, key=lambda x: (corrected_seconds(x.estimate, with_l2, "matmul"), x.rank))
    assert [x.rank for x in expected] != [x.rank for x in c.candidates]  # it reorders them
    with RunStore(tmp_path / "runs.sqlite3") as store:
        assert pipeline.rank_by_correction(c, store) == (c, "")  # none stored
        store.save_correction(with_l2, _evaluation(0.5, 0.5))
        assert pipeline.rank_by_correction(c, store) == (c, "")  # not earned
        store.save_correction(with_l2, _evaluation(0.2, 0.6))
        ranked, note = pipeline.rank_by_correction(c, store)
    assert [x.program for x in ranked.candidates] == [x.program for x in expected]
    assert [x.rank for x in ranked.candidates] == list(range(1, len(c.candidates) + 1))
    assert [x.estimate for x in ranked.candidates] == [x.estimate for x in expected]  # the model's, kept
    assert note.startswith("ranked by the runs store's correction of tiny-cpu (held-out mean Spearman +0.20 -> +0.60")


def fit_stages_of(compute: float, loads: tuple = ()):
    from workbench.profile.correction import StageFit

    return StageFit(compute, loads, 0.0, measurements=100, workloads=50)
