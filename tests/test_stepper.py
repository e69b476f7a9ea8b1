"""The stepper: stepping forward and back is replay, and what it reports matches what it built."""

import gc
import json
import re
from functools import cache

import pytest
from helpers import device, expr, matmul
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.construct.graph import ConstructionGraph, node_key
from workbench.construct.space import Options, Space, replay
from workbench.construct.stepper import Stepper, construct
from workbench.errors import UserError

CASES = {
    "mm-v100": lambda: Stepper(matmul(512, 512, 512), device("v100")),
    "mm-prime-cpu": lambda: Stepper(matmul(257, 127, 509), device("tiny-cpu")),
    "conv-mi50": lambda: Stepper(expr("conv2d", N=1, C=64, H=28, W=28, F=64, KH=3, KW=3, stride=1, pad=1), device("mi50")),
    "relu-k80": lambda: Stepper(expr("relu", shape=(17, 11, 3)), device("k80")),
}


def _to_end(stepper: Stepper) -> Stepper:
    stepper.run_to_end()
    return stepper


@cache
def finished(name: str) -> Stepper:
    return _to_end(CASES[name]())


def _signature(steps):
    return [(s.action, s.state, s.note) for s in steps]


@pytest.mark.parametrize("name", sorted(CASES))
def test_next_until_done_equals_finish(name):
    stepper = CASES[name]()
    taken = []
    while (step := stepper.next()) is not None:
        taken.append(step)
    assert stepper.done and stepper.next() is None
    reference = finished(name)
    assert _signature(taken) == _signature(reference.steps)
    assert stepper.candidates() == reference.candidates()
    assert stepper.graph() == reference.graph()


@pytest.mark.parametrize("name", sorted(CASES))
def test_back_then_next_returns_the_same_step(name):
    stepper = CASES[name]()
    stepper.seek(25)
    here = stepper.current
    assert stepper.position == 25 and here is stepper.steps[24]
    before = stepper.back()
    assert before is stepper.steps[23] and stepper.position == 24
    assert stepper.next() is here and stepper.current.state == here.state
    stepper.reset()
    assert stepper.current is None and stepper.back() is None and stepper.position == 0


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.tuples(st.sampled_from(["next", "back", "seek"]), st.integers(0, 400)), max_size=30))
def test_any_walk_lands_on_the_reference_steps(name, moves):
    reference = finished(name).steps
    stepper = CASES[name]()
    for move, n in moves:
        if move == "next":
            stepper.next()
        elif move == "back":
            stepper.back()
        else:
            stepper.seek(n)
        assert 0 <= stepper.position <= len(reference)
        expected = reference[stepper.position - 1] if stepper.position else None
        current = stepper.current
        assert (current is None) == (expected is None)
        if current is not None:
            assert (current.action, current.state, current.note) == (expected.action, expected.state, expected.note)
        assert len(stepper.graph().edges) == sum(1 for s in reference[: stepper.position] if s.edge is not None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_emitted_nodes_are_the_programs_made_and_the_candidates_their_top_k(name):
    """One emitted node per program a step made; the candidates are the top K of them, and a
    program left out (a construction makes more than K where balanced cuts come as extras) is
    predicted no faster than the last candidate."""
    stepper = finished(name)
    graph = stepper.graph()
    n = stepper.space.n_tile_layers
    emitted = {node.key: node for node in graph.emitted()}
    made = [s.candidate for s in stepper.steps if s.candidate is not None]
    assert len(emitted) == len(made)
    ranked = stepper.candidates()
    assert len(ranked) == min(len(made), stepper.options.topk)
    programs = {node_key(n, c.program.tiles[-1], c.program.tiles[:-1]): c for c in ranked}
    assert set(programs) <= set(emitted)
    for key, cand in programs.items():
        assert emitted[key].predicted_seconds == cand.predicted_seconds
        assert emitted[key].tile == cand.program.unit_tile
    assert all(node.predicted_seconds >= ranked[-1].predicted_seconds for key, node in emitted.items() if key not in programs)


@pytest.mark.parametrize("policy", ["roller", "markov"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_candidate_replays_to_its_program(name, policy):
    stepper = finished(name) if policy == "roller" else _markov(name)
    candidates = stepper.candidates()
    assert candidates
    for cand in candidates:
        assert cand.device == stepper.space.device and cand.expr == stepper.space.expr
        assert cand.actions[0].kind == "start" and cand.actions[-1].kind == "emit"
        assert replay(stepper.space, cand.actions) == cand.program
        assert replay(Space(cand.expr, cand.device), cand.actions) == cand.program  # from the candidate alone
    if name == "mm-v100" and policy == "markov":  # virtual threads replay too
        assert any(c.program.vthreads for c in candidates)


def test_replay_refuses_actions_that_do_not_build_a_program():
    stepper = finished("mm-v100")
    actions = stepper.candidates()[0].actions
    with pytest.raises(UserError, match="start action"):
        replay(stepper.space, actions[1:])
    with pytest.raises(UserError, match="not the bottom layer"):
        replay(stepper.space, actions[:1])


@cache
def _markov(name: str) -> Stepper:
    base = CASES[name]()
    return _to_end(Stepper(base.original, base.space.device, "markov", Options(topk=4)))


# Python's text of a dict, a quoted string, a tuple or a list of numbers: `{'i': 4}`, `(4, 16, 1)`, `[4, 16]`.
PYTHON_TEXT = re.compile(r"[{}']|[(\[]-?\d+(\.\d+)?, -?\d")


@pytest.mark.parametrize("policy", ["roller", "markov"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_step_notes_are_sentences_without_python_text(name, policy):
    """Every face shows a step's note as the policy wrote it (dashboard, widgets, CLI), so the
    note itself reads as a sentence: a tile as 4x16x1 with its axes named, no dict or tuple text."""
    stepper = finished(name) if policy == "roller" else _markov(name)
    notes = [n for s in stepper.steps for n in (s.note, *(a.note for a in s.alternatives)) if n]
    assert notes and not [n for n in notes if PYTHON_TEXT.search(n)]
    axes = " x ".join(stepper.space.axes)
    starts = [s for s in stepper.steps if s.action.kind == "start"]
    assert starts and all(f"tile {'x'.join(map(str, s.state.tile))} ({axes})" in s.note for s in starts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_round_trips(name, tmp_path):
    graph = finished(name).graph()
    assert ConstructionGraph.from_dict(json.loads(json.dumps(graph.to_dict()))) == graph
    graph.save(tmp_path / "graph.json")
    assert ConstructionGraph.load(tmp_path / "graph.json") == graph


def test_partial_graph_holds_the_steps_taken_so_far():
    stepper = CASES["mm-v100"]()
    stepper.seek(5)
    assert sum(stepper.graph().visits.values()) == sum(1 for s in stepper.steps[:5] if s.node is not None)
    assert stepper.candidates() == []


def test_construct_reports_the_fused_expression_and_its_steps():
    c = construct(expr("relu", shape=(17, 11, 3)), device("v100"), options=Options(topk=4))
    assert c.expr.extents == (561,) and c.policy == "roller"
    assert 1 <= len(c.candidates) <= 4 and c.steps > 0 and c.seconds > 0
    assert c.graph.counts()["nodes"] > 0


def test_unknown_policy_is_a_user_error():
    with pytest.raises(UserError, match="unknown policy"):
        Stepper(matmul(8, 8, 8), device("v100"), policy="nope")


def test_construction_is_deterministic():
    a, b = CASES["conv-mi50"](), CASES["conv-mi50"]()
    assert _signature(a.run_to_end()) == _signature(b.run_to_end())


@pytest.mark.parametrize("name", sorted(CASES))
def test_finish_leaves_the_cursor_where_it_is(name):
    """The cursor and the finished result are two things: finishing mid-way moves nothing."""
    stepper = CASES[name]()
    stepper.seek(7)
    here = stepper.current
    done = stepper.finish()
    assert stepper.position == 7 and stepper.current is here and stepper.done is False
    reference = finished(name)
    assert list(done.candidates) == reference.candidates() and done.graph == reference.graph()
    assert done.steps == len(reference.steps) and done.expr == stepper.space.expr and done.options == stepper.options
    emitted = sum(1 for s in stepper.steps[:7] if s.candidate is not None)  # the cursor's view: steps 1-7 only
    assert len(stepper.candidates()) == min(emitted, stepper.options.topk)
    assert len(stepper.graph().edges) == sum(1 for s in stepper.steps[:7] if s.edge is not None)


def test_run_to_end_moves_the_cursor_to_the_last_step():
    stepper = CASES["relu-k80"]()
    stepper.seek(3)
    steps = stepper.run_to_end()
    assert stepper.done and stepper.position == len(steps) and stepper.current is steps[-1]
    assert stepper.candidates() == list(stepper.finish().candidates)


def test_construction_candidate_by_rank():
    c = finished("mm-v100").finish()
    assert c.candidate(1) is c.candidates[0] and c.candidate(len(c.candidates)).rank == len(c.candidates)
    for bad in (0, len(c.candidates) + 1):
        with pytest.raises(UserError, match=f"rank {bad}: the construction has {len(c.candidates)} candidates"):
            c.candidate(bad)


@pytest.mark.parametrize("policy", ["roller", "markov"])
def test_a_construction_leaves_no_garbage_cycles(policy):
    """`Stepper.finish` pauses the cyclic collector (`stepper.collector_paused`): what a
    construction allocates must then be freed by reference counting alone."""
    e, dev = matmul(257, 127, 509), device("tiny-cpu")
    construct(e, dev, policy, Options(topk=4, seed=1))  # first calls: caches and imports settle
    gc.collect()
    finished = Stepper(e, dev, policy, Options(topk=4, seed=2)).finish()
    assert finished.candidates and gc.collect() == 0
    assert gc.isenabled()
