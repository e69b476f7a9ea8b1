"""Parameter importance and slices (`profile.importance`) against closed forms on synthetic
trials, and the trials read back from a runs store."""

from __future__ import annotations

import math

import pytest

from tests.helpers import TINY_CPU, matmul
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.profile.importance import Trial, importance, parameters, slice_points, stored_trials, varied
from workbench.profile.runner import Measurement
from workbench.profile.store import RunStore


def trial(seconds: float, i: int = 0, **params: int) -> Trial:
    return Trial(run_id=1, rank=i, params=tuple(params.items()), seconds=seconds)


def by_name(found) -> dict:
    return {f.parameter: f for f in found}


def factorial(a: float, b: float, replicates: int = 2) -> list[Trial]:
    """A balanced 2 x 2 design: log(time) = +-a (by A) +-b (by B), `replicates` trials per cell."""
    return [trial(math.exp(a * sa + b * sb), A=int(sa > 0) + 1, B=int(sb > 0) + 1)
            for sa in (-1, 1) for sb in (-1, 1) for _ in range(replicates)]


def test_a_parameter_that_fixes_the_time_explains_it_all_and_an_unrelated_one_nothing():
    found = by_name(importance(factorial(1.0, 0.0)))
    assert found["A"].eta_squared == pytest.approx(1.0) and found["A"].adjusted == pytest.approx(1.0)
    # B's group means are equal: no variance between its groups; the adjustment would go below 0.
    assert found["B"].eta_squared == pytest.approx(0.0, abs=1e-12) and found["B"].adjusted == 0.0
    assert [f.parameter for f in importance(factorial(1.0, 0.0))] == ["A", "B"]
    assert (found["A"].groups, found["A"].trials) == (2, 8)


def test_two_additive_parameters_share_the_variance_by_their_squared_effects():
    # SS_total = n (a^2 + b^2), SS_between(A) = n a^2: eta^2(A) = 9/25, eta^2(B) = 16/25.
    # epsilon^2(A) = 1 - (SS_within / (n - k)) / (SS_total / (n - 1)) = 1 - (8*16/6) / (8*25/7) = 19/75.
    found = by_name(importance(factorial(3.0, 4.0)))
    assert found["A"].eta_squared == pytest.approx(9 / 25)
    assert found["B"].eta_squared == pytest.approx(16 / 25)
    assert found["A"].adjusted == pytest.approx(19 / 75)
    assert found["B"].adjusted == pytest.approx(1 - (8 * 9 / 6) / (8 * 25 / 7))
    assert [f.parameter for f in importance(factorial(3.0, 4.0))] == ["B", "A"]


def test_importance_is_on_log_time_so_scaling_every_time_changes_nothing():
    slow = [Trial(t.run_id, t.rank, t.params, t.seconds * 1000) for t in factorial(3.0, 4.0)]
    assert [(f.parameter, pytest.approx(f.eta_squared)) for f in importance(slow)] == \
        [(f.parameter, f.eta_squared) for f in importance(factorial(3.0, 4.0))]


def test_a_parameter_with_a_value_per_trial_has_no_adjusted_importance():
    # Four distinct values over four trials: eta^2 is 1 whatever the times; epsilon^2 is undefined.
    trials = [trial(s, i, grid=i, A=i % 2) for i, s in enumerate((1.0, 5.0, 2.0, 3.0))]
    found = by_name(importance(trials))
    assert found["grid"].eta_squared == pytest.approx(1.0) and found["grid"].adjusted is None
    assert found["A"].adjusted is not None
    assert importance(trials)[-1].parameter == "grid"  # undefined sorts last


def test_constant_parameters_and_constant_times_say_nothing():
    assert varied([trial(1.0, L2=64, A=1), trial(2.0, L2=64, A=2)]) == ("A",)
    assert [f.parameter for f in importance([trial(1.0, L2=64, A=1), trial(2.0, L2=64, A=2)])] == ["A"]
    assert importance([trial(2e-6, A=1), trial(2e-6, A=2), trial(2e-6, A=1)]) == ()
    assert importance([trial(1.0, A=1)]) == () and importance([]) == ()
    # A parameter some trials lack (another expression under the same label) is left out.
    assert varied([trial(1.0, A=1, B=1), trial(2.0, A=2)]) == ("A",)


def test_slices_are_value_time_points_of_the_trials_that_have_the_parameter():
    trials = [trial(3.0, 0, A=4), trial(1.0, 1, A=2), trial(2.0, 2, A=4), trial(5.0, 3, B=1)]
    points = slice_points(trials, "A")
    assert [(p.value, p.seconds, p.rank) for p in points] == [(2, 1.0, 1), (4, 2.0, 2), (4, 3.0, 0)]
    assert slice_points(trials, "C") == ()


def test_parameters_name_each_layers_tile_per_axis_the_grid_and_virtual_threads():
    program = {"axes": ["i", "j"], "grid": 8, "eps": 0.0, "vthreads": {"j": 2},
               "layers": [{"name": "registers", "tile": {"i": 4, "j": 8}, "padding": [0, 0], "cached": True},
                          {"name": "shared", "tile": {"i": 32, "j": 64}, "padding": [0, 0], "cached": True}]}
    assert parameters(program) == (("registers.i", 4), ("registers.j", 8), ("shared.i", 32), ("shared.j", 64),
                                   ("grid", 8), ("vthreads.i", 1), ("vthreads.j", 2))
    assert ("vthreads.i", 1) not in parameters(program | {"vthreads": {}})


def test_stored_trials_are_the_correct_measurements_with_their_programs(tmp_path):
    candidates = construct(matmul(64, 64, 64), TINY_CPU, options=Options(topk=3)).candidates
    workload = {"label": "t:mm-64", "op": "matmul", "dtype": "float32", "M": 64, "N": 64, "K": 64}
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id = store.start_run(workload=workload, device=TINY_CPU, policy="roller", runner="fake",
                                 candidates=candidates)
        store.add_measurement(run_id, Measurement(1, "fake", (3e-6, 2e-6), True))
        store.add_measurement(run_id, Measurement(2, "fake", (), False, "wrong result: fake"))
        store.add_measurement(run_id, Measurement(3, "fake", (5e-6,), True))
        store.finish_run(run_id)
        trials = stored_trials(store, store.runs())
    by_rank = {c.rank: c for c in candidates}
    assert [(t.run_id, t.rank, t.seconds) for t in trials] == [(run_id, 1, 2e-6), (run_id, 3, 5e-6)]
    for t in trials:
        program = by_rank[t.rank].program
        assert dict(t.params) == {f"{layer}.{axis}": tile[a] for layer, tile in zip(program.layers, program.tiles)
                                  for a, axis in enumerate(program.axes)} | {"grid": program.grid}
