"""The policy base: the registry, the eps schedule, shared emission (scale-out, Roller-S, the
candidate and its replayable actions), step bookkeeping, typed actions and `legal_actions`."""

import re
from dataclasses import replace

import pytest
from helpers import device, expr, matmul, suite_workloads, workload_expr
from test_invariants import KIB, assert_within_limits, detected_cpu

from workbench.construct.markov import MarkovPolicy
from workbench.construct.policies import POLICIES, policy_class
from workbench.construct.policy import MIN_PROGRAMS, Policy, in_place, split_k
from workbench.construct.stepper import Stepper
from workbench.construct.space import (
    EPS_STEPS, Action, IllegalAction, Kind, Options, OverCapacity, Space, State, apply, descend_within_limits,
    legal_actions, replay,
)
from workbench.errors import UserError
from workbench.fmt import duration
from workbench.rtile.plan import loop_nest_key
from workbench.rtile.rprogram import RProgram


CORE = {w["id"]: w for w in suite_workloads("cpu-core")}


class Descent(Policy):
    """A policy in a dozen lines: the initial tile at every layer, straight down, then emit."""

    name = "descent"

    def round(self, eps):
        state = self.space.initial_state(eps)
        if state is None:
            return False
        while state.layer < self.space.n_tile_layers:
            state = apply(self.space, state, Action(Kind.DESCEND, state.layer))
        yield from self.emit(state)
        return self.enough


class Nothing(Policy):
    """Never emits: every round ends unfinished."""

    name = "nothing"

    def round(self, eps):
        return False
        yield


def test_the_registry_holds_every_policy_under_its_name():
    assert set(POLICIES) == {"roller", "markov"}
    for name, cls in POLICIES.items():
        assert issubclass(cls, Policy) and cls.name == name and policy_class(name) is cls
    with pytest.raises(UserError, match="unknown policy 'vortex' \\(known: markov, roller\\)"):
        policy_class("vortex")


def test_eps_is_raised_through_the_schedule_while_too_few_programs_come_out():
    policy = Nothing(Space(matmul(64, 64, 64), device("tiny-cpu")), Options(eps=0.1, topk=3))
    steps = list(policy.steps())
    assert [s.action.kind for s in steps] == [Kind.WIDEN_EPS] * 4
    assert [s.action.eps for s in steps] == [e for e in EPS_STEPS if e > 0.1]
    assert steps[0].note == f"too few programs (0 < {MIN_PROGRAMS}): raise eps to 0.2"  # K = 3, but at least ten
    assert policy._count == 4 and not policy.out_of_steps


def test_shared_emission_emits_a_complete_replayable_candidate():
    space = Space(matmul(256, 256, 256), device("v100"))
    policy = Descent(space, Options(topk=1))
    steps = list(policy.steps())
    (cand,) = policy.candidates
    emit = next(s for s in steps if s.candidate is not None)  # then the ladder widens eps for more
    assert emit.candidate is cand and emit.action.kind == Kind.EMIT
    assert cand.actions == emit.state.actions and cand.actions[0].kind == Kind.START
    assert cand.device == space.device and cand.expr == space.expr
    assert replay(space, cand.actions) == cand.program
    assert cand.estimate.footprints == tuple(space.footprint(l, t, cand.program.tiles[l - 1] if l else space.ones())
                                             for l, t in enumerate(cand.program.tiles))
    assert emit.note.startswith(f"emit rProgram #1: grid {cand.program.grid}, "
                                     f"{duration(cand.predicted_seconds)} predicted, bound by ")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_program_that_pads_only_for_its_tails_is_emitted_as_the_faster_of_it_and_its_in_place_variant(isa):
    """5 x 2880 x 1521 on two detected cores: its ragged N pads every program's inputs, B's 17 MB
    read by 5 rows. Emission prices each such program and its variant that reads the inputs in
    place (`policy.in_place`) and keeps the faster; its emit action records which, so replay
    and the stored form rebuild it."""
    dev = detected_cpu(isa, 2, 48 * KIB, 1024 * KIB)
    space = Space(matmul(5, 1521, 2880), dev)
    policy = policy_class("roller")(space, Options(topk=10))
    steps = list(policy.steps())
    emits = [s for s in steps if s.candidate is not None]
    kept = [s.candidate.program for s in emits if s.candidate.program.in_place]
    assert kept and all(s.action.size == int(s.candidate.program.in_place) for s in emits)
    for step in emits:
        program = step.candidate.program
        assert replay(space, step.candidate.actions) == program
        assert RProgram.from_dict(program.to_dict(), space.expr) == program
        assert ("in_place" in program.to_dict()) == program.in_place
        padded = replace(program, in_place=False, split=1, grid=program.grid // program.split)
        variant = in_place(padded, dev)
        assert (variant is not None) >= program.in_place and ("inputs read in place" in step.note) == program.in_place
        times = [split_k(p, dev)[1].predicted_seconds for p in (padded, variant) if p is not None]
        assert step.candidate.predicted_seconds == min(times)


def test_roller_s_shrinks_grow_the_grid_while_it_is_smaller_than_the_units():
    stepper = Stepper(matmul(512, 512, 512), device("v100"), "markov")
    stepper.run_to_end()
    units = stepper.space.device.compute_units
    runs, run = [], []
    for step in stepper.steps:
        if step.action.kind == Kind.SHRINK:
            run.append(step)
        elif run:
            runs.append((run, step))
            run = []
    assert runs, "a 512^3 matmul on 80 SMs is shrunk (Roller-S)"
    for shrinks, after in runs:
        grids = [tuple(int(x) for x in re.findall(r"grid (\d+)", s.note)) for s in shrinks]
        # one aligned step need not add a row of tiles (512 / 192 and 512 / 176 both round up to 3)
        assert all(before < units and before <= now for before, now in grids)
        assert all(a[1] == b[0] for a, b in zip(grids, grids[1:]))  # each shrink starts where the last ended
        assert shrinks[-1].state.recorded == after.state.recorded  # emitted (or repeated) as shrunk


def test_a_program_emitted_twice_is_a_candidate_once():
    space = Space(matmul(64, 64, 64), device("tiny-cpu"))
    policy = Descent(space, Options(topk=2))
    list(policy.steps())  # every eps round emits the same program when eps changes nothing
    assert len(policy.candidates) == 1 and policy._count >= 2


def test_steps_are_counted_against_max_steps():
    policy = Nothing(Space(matmul(64, 64, 64), device("tiny-cpu")), Options(max_steps=2))
    for _ in policy.steps():
        pass
    assert policy._count == len(EPS_STEPS) - 1 and policy.out_of_steps


def test_notes_come_from_the_policy_templates():
    policy = Descent(Space(matmul(64, 64, 64), device("tiny-cpu")), Options())
    note = policy.describe("shrink", before=2, units=8, axis="i", size=32, after=4)
    assert note == "grid 2: too few tiles for 8 units, shrink i (smallest reuse) to 32: grid 4"
    with pytest.raises(KeyError):
        policy.describe("no such event")


def test_actions_are_typed():
    grow = Action("grow", 0, 1, 8)
    assert grow.kind is Kind.GROW and grow == Action(Kind.GROW, 0, 1, size=8) and grow.kind == "grow"
    assert grow.describe(("i", "j", "k"), ("registers", "shared")) == "grow j to 8 at registers"
    assert Action(Kind.SET_VTHREAD, 0, 1, count=2).describe(("i", "j", "k"), ("registers",)) == "set_vthread j x2 at registers"
    assert f"{Kind.WIDEN_EPS}" == "widen_eps"
    with pytest.raises(UserError, match="unknown action kind 'enlarge'"):
        Action("enlarge")
    space = Space(matmul(64, 64, 64), device("tiny-cpu"))
    state = space.initial_state(0.05)
    assert apply(space, state, Action(Kind.WIDEN_EPS, eps=0.4)).eps == 0.4


@pytest.mark.parametrize("dev, workload", [
    ("v100", lambda: matmul(512, 512, 512)),
    ("tiny-cpu", lambda: matmul(257, 127, 509)),
    ("mi50", lambda: expr("conv2d", N=1, C=64, H=28, W=28, F=64, KH=3, KW=3, stride=1, pad=1)),
])
def test_legal_actions_are_exactly_the_tried_moves_apply_accepts(dev, workload):
    space = Space(workload(), device(dev))
    state = space.initial_state(0.05)
    for _ in range(space.n_tile_layers):
        legal = legal_actions(space, state)
        assert legal and all(a.layer == state.layer for a in legal)
        for action in legal:
            apply(space, state, action)  # never raises
        kinds = {a.kind for a in legal}
        assert Kind.GROW in kinds
        if Kind.SET_VTHREAD in kinds:  # a GPU thread's tile only
            assert space.device.kind == "gpu" and state.layer == 0
        for axis in range(len(state.tile)):  # a grow to a size in between is refused by apply
            size = next((a.size for a in legal if a.kind == Kind.GROW and a.axis == axis), None)
            if size is not None and size - 1 > state.tile[axis]:
                in_between = Action(Kind.GROW, state.layer, axis, size - 1)
                assert in_between not in legal
        if Kind.DESCEND not in kinds:  # no aligned tile below the smallest one here
            with pytest.raises(IllegalAction):
                apply(space, state, Action(Kind.DESCEND, state.layer))
            return
        state = apply(space, state, Action(Kind.DESCEND, state.layer))
    assert legal_actions(space, state) == ()


def test_virtual_threads_that_do_not_divide_a_tile_are_not_legal():
    space = Space(matmul(512, 512, 512), device("v100"))
    state = apply(space, space.initial_state(0.05), Action(Kind.GROW, 0, 1, 4))
    vthreads = {(a.axis, a.count) for a in legal_actions(space, state) if a.kind == Kind.SET_VTHREAD}
    assert vthreads == {(1, 2), (1, 4)}  # V divides the thread's tile (1, 4, 1), spatial axes only
    split = apply(space, state, Action(Kind.SET_VTHREAD, 0, 1, count=4))
    legal = legal_actions(space, split)
    assert all(a.size % 4 == 0 for a in legal if a.kind in (Kind.GROW, Kind.INV_TILE) and a.axis == 1)
    assert Action(Kind.SET_VTHREAD, 0, 1, count=4) not in legal  # already set: not a move
    with pytest.raises(IllegalAction):
        apply(space, split, Action(Kind.SET_VTHREAD, 0, 1, count=8))


def test_every_policy_descends_through_one_capacity_check():
    stepper = Stepper(matmul(512, 512, 512), device("v100"), "markov", Options(topk=2))
    stepper.run_to_end()
    space = stepper.space
    states = {s.state for s in stepper.steps if s.state is not None and s.state.layer < space.n_tile_layers}
    for state in states:  # within the limits: the plain transition
        assert descend_within_limits(space, state) == apply(space, state, Action(Kind.DESCEND, state.layer))
    # a V100 with 512 bytes of shared memory: no block of a warp of threads fits it
    v100 = device("v100")
    small = replace(v100, layers=(v100.layers[0], replace(v100.layers[1], capacity_bytes=512), *v100.layers[2:]))
    space = Space(matmul(512, 512, 512), small)
    start = space.initial_state(0.05)
    with pytest.raises(OverCapacity, match="smallest aligned tile at shared does not fit") as over:
        descend_within_limits(space, start)
    assert over.value.state == apply(space, start, Action(Kind.DESCEND, 0))
    (alt,) = [a for a in MarkovPolicy(space, Options()).transitions(start) if a.action.kind == Kind.DESCEND]
    assert alt.probability == 0 and alt.note == "over capacity: the smallest tile at shared does not fit"


@pytest.mark.parametrize("policy", ["roller", "markov"])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("wid", ["conv-1x1", "mm-512", "gemv-4096"])
def test_each_loop_nest_is_emitted_once(policy, isa, wid):
    """Programs whose L1 tile only splits the register tile's K-loop are one kernel
    (`plan.loop_nest_key`): a construction emits one of them, so its top K are K kernels.
    (Before, 35 of cpu-core's 130 top-10 programs on the AVX-512 Zen 5 were such repeats.)"""
    dev = detected_cpu(isa, 2, 48 * KIB, 1024 * KIB)
    stepper = Stepper(workload_expr(CORE[wid]), dev, policy, Options(topk=10))
    stepper.run_to_end()
    keys = [(loop_nest_key(c.program, dev), c.program.vthreads) for c in stepper.candidates()]
    assert keys and len(set(keys)) == len(keys)


def _with_llc(dev, mib: int = 32):
    """`dev` with a last-level cache of `mib` MiB, three times DRAM's bandwidth."""
    return replace(dev, llc_bytes=mib * 2**20, llc_gbps=3 * dev.layers[-1].bandwidth_gbps)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_a_few_row_matmul_past_the_last_level_cache_also_gets_whole_rows(isa):
    """16 x 4901 x 7705 (B 151 MB) on two cores with a 32 MiB last-level cache: a rows step
    follows programs that read B in strips of its rows, and the program it makes spans N whole
    (whole tiles of the layer above, no more), in K-steps no longer than the cache tiles' were,
    split over both cores; each within every layer's limits and replayed from its actions
    alone. An operator that stays in the cache (N = 512), or a spec that names no last-level
    cache, gets none."""
    dev = detected_cpu(isa, 2, 48 * KIB, 1024 * KIB)
    e = matmul(16, 7705, 4901)
    stepper = Stepper(e, _with_llc(dev), "roller", Options(topk=10))
    steps = stepper.run_to_end()
    marks = [s for s in steps if s.action.kind == Kind.ROWS]
    assert marks and all(s.note.startswith("B is read from DRAM in strips of its rows: also span them whole (j to ")
                         for s in marks)
    whole = [s.candidate for s in steps if s.candidate is not None and Kind.ROWS in [a.kind for a in s.candidate.actions]]
    assert whole
    for cand in whole:
        p = cand.program
        rows = next(a for a in cand.actions if a.kind == Kind.ROWS)
        above = p.tiles[-2][1]
        assert p.unit_tile[1] == -(-7705 // above) * above and p.unit_tile[2] == rows.size
        assert all(t[2] <= rows.size for t in p.tiles[1:]) and (p.split, p.grid) == (2, 2)
        assert replay(stepper.space, cand.actions) == p
        assert_within_limits(stepper.space, p)
    for other in (Stepper(matmul(16, 512, 4901), _with_llc(dev), "roller", Options(topk=10)),
                  Stepper(e, dev, "roller", Options(topk=10))):
        assert not [s for s in other.run_to_end() if s.action.kind == Kind.ROWS]


def test_a_rows_step_is_refused_off_a_program_or_off_whole_register_steps():
    """`apply` of rows: only at the bottom layer, in K-steps of whole register steps no longer
    than the cache tiles', and within every layer's limits; where `Space.whole_rows` finds the
    longest step, one more is refused."""
    dev = _with_llc(detected_cpu("avx512", 2, 48 * KIB, 1024 * KIB))
    stepper = Stepper(matmul(16, 7705, 4901), dev, "roller", Options(topk=10))
    space, steps = stepper.space, stepper.run_to_end()
    with pytest.raises(IllegalAction, match="only a program's unit tile spans rows"):
        apply(space, space.initial_state(0.05), Action(Kind.ROWS, space.n_tile_layers, 1, 16))
    strips = next(s.candidate for s in steps if s.candidate is not None and s.candidate.actions[0].count == 0
                  and Kind.ROWS not in [a.kind for a in s.candidate.actions] and s.candidate.program.unit_tile[1] < 7705)
    tiles, eps = strips.program.tiles, strips.actions[0].eps
    state = State(space.n_tile_layers, (), tiles, eps, (), strips.actions[:-1])
    name, axis, size, whole = space.whole_rows(tiles, eps)
    assert (name, axis) == ("B", 1) and whole[-1][1] >= 7705 and size <= tiles[-2][2]
    assert apply(space, state, Action(Kind.ROWS, space.n_tile_layers, axis, size)).recorded == whole
    for refused in (size + 1, 2 * tiles[-2][2], 0):
        with pytest.raises(IllegalAction, match=f"spans j in steps of {refused}"):
            apply(space, state, Action(Kind.ROWS, space.n_tile_layers, axis, refused))
