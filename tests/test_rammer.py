"""Rammer's wavefront co-schedule: waves, kernel selection, kernel launches (one per operator one
at a time, one for the plan), and the plan's invariants (no rTask before its dependencies, never
more rTasks at once than vEUs, never slower than one by one)."""

from math import ceil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.models.rammer import RKernel, ROperator, rkernel, schedule, wavefronts

EPS = 1e-9


def op(name, preds=(), *kernels):
    return ROperator(name, tuple(preds), tuple(kernels) or (RKernel(1, 4, 1.0),))


def test_rkernel_alone_takes_the_candidates_predicted_time():
    for grid, units in ((1, 132), (132, 132), (133, 132), (1000, 8), (7, 2)):
        k = rkernel(1, grid, 3.5e-6, units)
        assert k.tasks == grid
        assert k.alone_seconds(units) == pytest.approx(3.5e-6)


def test_waves_are_breadth_first_levels():
    ops = [op("a"), op("b"), op("c", (0,)), op("d", (0, 1)), op("e", (2, 1)), op("f", (4,))]
    assert wavefronts(ops) == ((0, 1), (2, 3), (4,), (5,))


def test_predecessors_must_come_first():
    with pytest.raises(ValueError, match="earlier"):
        wavefronts([op("a", (1,)), op("b")])


def test_independent_small_kernels_share_the_device():
    # Two operators of 4 rTasks on 8 vEUs: run side by side, half the one-by-one time.
    plan = schedule([op("a"), op("b")], veus=8)
    assert plan.sequential_seconds == 2.0
    assert plan.seconds == 1.0
    assert {p.veu for p in plan.waves[0].placements} == set(range(8))
    assert plan.waves[0].selection == "fastest"


def test_dependent_kernels_wait_for_their_predecessors():
    plan = schedule([op("a"), op("b", (0,))], veus=8)
    first, second = plan.waves
    assert min(p.start for p in second.placements) == max(p.end for p in first.placements) == 1.0
    assert plan.seconds == 2.0


def test_efficient_kernels_are_chosen_when_they_finish_the_wave_sooner():
    # Fastest alone: 16 rTasks of 1.0 (one round on 16 vEUs); efficient: 4 rTasks of 2.0 (work 8,
    # not 16). Three operators: the fastest need 3 rounds (3.0), the efficient 12 rTasks fit in
    # one round (2.0).
    kernels = (RKernel(1, 16, 1.0), RKernel(2, 4, 2.0))
    plan = schedule([op(n, (), *kernels) for n in "abc"], veus=16)
    (wave,) = plan.waves
    assert wave.selection == "efficient" and wave.ranks == (2, 2, 2)
    assert plan.seconds == 2.0 < plan.sequential_seconds == 3.0


def test_the_fastest_kernels_are_kept_when_they_fill_the_device_no_worse():
    kernels = (RKernel(1, 16, 1.0), RKernel(2, 4, 4.5))
    plan = schedule([op("a", (), *kernels), op("b", (), *kernels)], veus=16)
    assert plan.waves[0].selection == "fastest" and plan.waves[0].ranks == (1, 1)


def test_bad_vdevice_and_kernel_lists_are_refused():
    with pytest.raises(ValueError, match="vEU"):
        schedule([op("a")], veus=0)
    with pytest.raises(ValueError, match="rKernel"):
        schedule([ROperator("a", (), ())], veus=2)


def test_an_empty_model_has_an_empty_plan():
    plan = schedule([], veus=4)
    assert plan.waves == () and plan.seconds == 0.0 and plan.sequential_seconds == 0.0


def test_one_kernel_at_a_time_pays_a_launch_per_operator_the_plan_one():
    # Two operators of 4 rTasks of 1.0 on 8 vEUs, a launch of 0.5: one at a time 2 x (1.0 + 0.5);
    # co-scheduled, the rProgram's one launch, then both side by side.
    plan = schedule([op("a"), op("b")], veus=8, launch_seconds=0.5)
    assert plan.sequential_seconds == 3.0 and plan.seconds == 1.5
    assert (plan.launches, plan.sequential_launches, plan.launch_seconds) == (1, 2, 0.5)
    assert all(p.start == 0.5 for p in plan.waves[0].placements)  # no rTask before the launch


def test_a_chain_gains_only_the_launches():
    # a -> b -> c, each filling the device: nothing overlaps, the plan saves 2 of 3 launches.
    plan = schedule([op("a"), op("b", (0,)), op("c", (1,))], veus=4, launch_seconds=0.25)
    assert plan.sequential_seconds == 3.75 and plan.seconds == 3.25


def test_small_gpu_kernels_gain_by_their_launches():
    # Ten independent 1 us operators of one rTask each on 80 vEUs with 5 us launches (a GPU):
    # 10 x 6 us one at a time, 5 us + 1 us co-scheduled.
    ops = [ROperator(f"op{i}", (), (RKernel(1, 1, 1e-6),)) for i in range(10)]
    plan = schedule(ops, veus=80, launch_seconds=5e-6)
    assert plan.sequential_seconds == pytest.approx(60e-6) and plan.seconds == pytest.approx(6e-6)
    assert schedule(ops, veus=80).seconds == pytest.approx(1e-6)  # without launches: 10x as well, of less


def test_a_negative_launch_is_refused_and_an_empty_model_launches_nothing():
    with pytest.raises(ValueError, match="negative"):
        schedule([op("a")], veus=2, launch_seconds=-1e-6)
    plan = schedule([], veus=4, launch_seconds=5e-6)
    assert (plan.seconds, plan.sequential_seconds, plan.launches, plan.sequential_launches) == (0.0, 0.0, 0, 0)


@st.composite
def dags(draw):
    n = draw(st.integers(1, 8))
    ops = []
    for i in range(n):
        preds = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        ranks = draw(st.integers(1, 3))
        kernels = tuple(
            RKernel(r + 1, draw(st.integers(1, 24)), draw(st.sampled_from((0.5, 1.0, 1.5, 3.0))))
            for r in range(ranks)
        )
        ops.append(ROperator(f"op{i}", tuple(sorted(preds)), kernels))
    return ops, draw(st.integers(1, 10))


@settings(max_examples=150, deadline=None)
@given(dags())
def test_plan_invariants(case):
    ops, veus = case
    plan = schedule(ops, veus)
    placements = [p for w in plan.waves for p in w.placements]
    chosen = {o: k for w in plan.waves for o, k in zip(w.ops, w.ranks)}
    assert sorted(chosen) == list(range(len(ops)))  # every operator in exactly one wave
    finish = {}
    for o, rank in chosen.items():
        kernel = next(k for k in ops[o].kernels if k.rank == rank)
        mine = [p for p in placements if p.op == o]
        assert sorted(p.task for p in mine) == list(range(kernel.tasks))
        assert all(p.end - p.start == pytest.approx(kernel.task_seconds) for p in mine)
        finish[o] = max(p.end for p in mine)
    for p in placements:
        assert 0 <= p.veu < veus
        assert all(p.start >= finish[q] - EPS for q in ops[p.op].preds)
    for v in range(veus):
        run = sorted((p.start, p.end) for p in placements if p.veu == v)
        assert all(b[0] >= a[1] - EPS for a, b in zip(run, run[1:]))
    events = sorted([(p.start, 1) for p in placements] + [(p.end, -1) for p in placements], key=lambda e: (e[0], e[1]))
    running = 0
    for _, delta in events:
        running += delta
        assert running <= veus
    assert plan.seconds == pytest.approx(max(finish.values()))
    assert plan.seconds <= plan.sequential_seconds * (1 + EPS)
    fastest = sum(min(ceil(k.tasks / veus) * k.task_seconds for k in o.kernels) for o in ops)
    assert plan.sequential_seconds == pytest.approx(fastest)
    # a launch of L: the plan starts L later (one rProgram), one at a time pays L per operator
    launched = schedule(ops, veus, launch_seconds=0.5)
    assert launched.seconds == pytest.approx(plan.seconds + 0.5)
    assert launched.sequential_seconds == pytest.approx(fastest + 0.5 * len(ops))
    assert min(p.start for w in launched.waves for p in w.placements) >= 0.5 - EPS
