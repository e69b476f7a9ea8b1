"""The lessons' exercise checks (workbench/lessons/exercises.py): each one, called with its
lesson's solution, says right; called with the value the exercise cell starts from, says wrong,
and says why. The lessons' own solution cells are checked when the notebooks run
(tests/test_notebooks.py); here the same solutions on the same workloads, without a kernel.
DispatchSlider (lesson 8's widget) is driven here too."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from helpers import ROOT

from workbench import pipeline
from workbench.construct.policy import MIN_PROGRAMS
from workbench.hardware.loader import load_spec
from workbench.lessons import exercises as ex
from workbench.lessons.exercises import NOT_ANSWERED, Verdict
from workbench.ops import catalog
from workbench.ops.expr_lang import build_expr
from workbench.pipeline import Options
from workbench.widgets import DispatchSlider
from workbench.workload import Workload

MODELS = ROOT / "sample_models"


def right(verdict: Verdict) -> None:
    assert isinstance(verdict, Verdict) and verdict.correct, verdict
    assert str(verdict).startswith("Right: ") and "Right" in verdict._repr_html_()


def wrong(verdict: Verdict, *words: str) -> None:
    assert isinstance(verdict, Verdict) and not verdict.correct, verdict
    assert str(verdict).startswith("Not yet: ") and "Not yet" in verdict._repr_html_()
    for word in words:
        assert word in verdict.message, verdict.message


def construct(expr, device, policy="roller", topk=4, seed=0):
    return pipeline.construct(pipeline.request(expr, device, policy, Options(topk=topk, seed=seed)))


@cache
def xeon():
    return load_spec("xeon-avx512")


@cache
def v100():
    return load_spec("v100")


@cache
def mm(n: int):
    return catalog.build("matmul", {"M": n, "N": n, "K": n})


def test_verdict_is_frozen_and_escaped():
    v = Verdict(False, "a <b> c")
    with pytest.raises(AttributeError):
        v.correct = True
    assert "a &lt;b&gt; c" in v._repr_html_()


def test_lesson1_best_growth():
    right(ex.best_growth(mm(64), (4, 16, 1), (8, 16, 1)))  # the solution: grow i
    wrong(ex.best_growth(mm(64), (4, 16, 1), (4, 16, 2)), "growing k", "growing i")  # the start
    wrong(ex.best_growth(mm(64), (4, 16, 1), (8, 32, 1)), "exactly one axis")


def test_lesson1_bank_pad():
    right(ex.bank_pad((16 - 60 % 16 + 8) % 16, 60, 8, banks=16, bank_width=1))
    wrong(ex.bank_pad(None, 60, 8, banks=16, bank_width=1), NOT_ANSWERED)
    wrong(ex.bank_pad(8, 60, 8, banks=16, bank_width=1), "you said 8", "= 12")


def test_lesson1_and_6_smallest_eps():
    odd = build_expr("C[i,j] += A[i,k] * B[k,j]", dict(i=100, j=100, k=100))
    right(ex.smallest_eps(odd, xeon(), "i", 24, 0.2))
    wrong(ex.smallest_eps(odd, xeon(), "i", 24, 0.05), "refuses it", "20.0%")
    wrong(ex.smallest_eps(odd, xeon(), "i", 24, 0.4), "a smaller step does too")
    prime = build_expr("C[i,j] += A[i,k] * B[k,j]", dict(i=97, j=89, k=83))
    right(ex.smallest_eps(prime, v100(), "i", 16, 0.2))
    wrong(ex.smallest_eps(prime, v100(), "i", 16, 0.05), "15.5%")


def test_lesson1_tile_fits():
    def l1(tile):
        return ex.tile_fits(mm(256), xeon(), ((2, 16, 1), tile, (128, 128, 64)), layer=1, at_least=(64, 64, 1))

    right(l1((64, 64, 16)))
    wrong(l1((64, 64, 64)), "49,152 B", "32,768 B")
    wrong(l1((64, 24, 16)), "not a multiple")
    wrong(l1((32, 32, 16)), "at least")


def test_lesson2_grid_rounds_and_steps():
    construction = construct(mm(1024), v100())
    second = construction.candidates[1]
    right(ex.grid_rounds(second, v100(), -(-second.program.grid // v100().compute_units)))
    wrong(ex.grid_rounds(second, v100(), None), NOT_ANSWERED)
    wrong(ex.grid_rounds(second, v100(), 1), "you said 1")
    stepper = pipeline.stepper(pipeline.request(mm(1024), v100(), "roller", Options(topk=4)))
    stepper.finish()
    # K = 1 searches as far as K = 4: both stop at the MIN_PROGRAMS-th program
    last_emit = [i for i, s in enumerate(stepper.steps, start=1) if s.action.kind == "emit"][MIN_PROGRAMS - 1]
    one = construct(mm(1024), v100(), topk=1)
    right(ex.construction_steps(one, last_emit))
    wrong(ex.construction_steps(one, None), NOT_ANSWERED)
    wrong(ex.construction_steps(one, last_emit + 1), f"it took {last_emit} steps")


@pytest.mark.slow
def test_lesson3_markov_checks():
    stepper = pipeline.stepper(pipeline.request(mm(1024), v100(), "markov", Options(topk=4, seed=0)))
    stepper.finish()
    state = stepper.steps[6].state
    descend = next(a.action for a in stepper.policy.transitions(state) if a.action.kind == "descend")
    # the lesson's solution: the 1 / T factor on descend's benefit, from the benefits at T = 1
    legal = [a for a in stepper.policy.transitions(state, 1.0) if a.probability > 0]
    b_descend = sum(a.score for a in legal if a.action.kind == "descend")
    others = sum(a.score for a in legal if a.action.kind != "descend")
    p = 256 * b_descend / (others + 256 * b_descend)
    right(ex.transition_probability(stepper.policy, state, descend, 1 / 256, p))
    wrong(ex.transition_probability(stepper.policy, state, descend, 1 / 256, None), NOT_ANSWERED)
    wrong(ex.transition_probability(stepper.policy, state, descend, 1 / 256, p * 1.5), "T = 0.0039")

    stepper.seek(len(stepper.steps))
    nodes, shares = stepper.graph().nodes, {}
    for key, share in stepper.policy.stationary().items():
        if nodes[key].layer_name == "shared":
            shares[nodes[key].tile] = shares.get(nodes[key].tile, 0.0) + share
    best = max(shares, key=shares.get)
    right(ex.most_visited(stepper, "shared", best))
    wrong(ex.most_visited(stepper, "shared", None), NOT_ANSWERED)
    least = min(shares, key=shares.get)
    wrong(ex.most_visited(stepper, "shared", least), str(best))
    wrong(ex.most_visited(stepper, "no such layer", best), "no state")


def test_lesson4_bottleneck_and_intensity():
    best = construct(mm(256), xeon(), topk=5).candidates[0]
    est = best.estimate
    layers = {layer.name for layer in xeon().layers}
    stages = {"compute": est.compute_seconds, **{n: t for n, t in est.load_seconds if n in layers}}
    right(ex.bottleneck(best, xeon(), max(stages, key=stages.get)))  # the slowest stage
    wrong(ex.bottleneck(best, xeon(), None), NOT_ANSWERED)
    wrong(ex.bottleneck(best, xeon(), min(stages, key=stages.get)), f"bound by {est.bottleneck}")
    assert any(n.startswith("packing") for n, _ in est.load_seconds)  # priced, but not a stage of the choice
    intensity = est.flops / dict(est.bytes_per_layer)["DRAM"]
    right(ex.dram_intensity(best, xeon(), intensity))
    wrong(ex.dram_intensity(best, xeon(), None), NOT_ANSWERED)
    wrong(ex.dram_intensity(best, xeon(), intensity * 2), "flops per byte")


def test_lesson5_reference_and_grid():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (16, 16)).astype(np.float32), rng.uniform(-1, 1, (16, 16)).astype(np.float32)
    kernel = (a.astype(np.float64) @ b).astype(np.float32)  # what a float32 matmul kernel writes
    right(ex.same_as_kernel(lambda A, B: A @ B, (a, b), kernel))
    wrong(ex.same_as_kernel(lambda A, B: A * B, (a, b), kernel), "beyond")
    wrong(ex.same_as_kernel(lambda A, B: A @ B[:8], (a, b), kernel), "raised")
    wrong(ex.same_as_kernel(lambda A, B: A.sum(axis=0), (a, b), kernel), "shape")

    first = construct(mm(128), xeon(), topk=3).candidates[0]
    unit = first.program.unit_tile
    right(ex.grid_size(first, math.ceil(128 / unit[0]) * math.ceil(128 / unit[1])))
    wrong(ex.grid_size(first, None), NOT_ANSWERED)
    wrong(ex.grid_size(first, first.program.grid + 1), "you said")


def test_lesson6_fusion_and_eps_rounds():
    right(ex.fused_extents(catalog.build("add", {"shape": (7, 13)}), (91,)))
    wrong(ex.fused_extents(catalog.build("add", {"shape": (7, 13)}), (7, 13)), "(91,)")
    right(ex.fused_extents(catalog.build("relu", {"shape": (2, 3, 5, 7)}), (210,)))
    tiny = catalog.build("matmul", {"M": 7, "N": 13, "K": 11})
    ten = pipeline.stepper(pipeline.request(tiny, v100(), "roller", Options(topk=10)))
    ten.finish()
    rounds = sum(s.action.kind == "widen_eps" for s in ten.steps)  # the lesson's solution: K = 4 searches as K = 10
    assert rounds > 0
    four = pipeline.stepper(pipeline.request(tiny, v100(), "roller", Options(topk=4)))
    four.finish()
    right(ex.eps_rounds(four.steps, rounds))
    wrong(ex.eps_rounds(four.steps, None), NOT_ANSWERED)
    wrong(ex.eps_rounds(four.steps, rounds + 1), "eps rounds added")


@pytest.mark.slow
def test_lesson7_waves_and_gain():
    bert = pipeline.construct_model(str(MODELS / "bert_layer.onnx"), "v100")
    right(ex.wave_width(bert, 0, 3))  # Q, K and V read the layer's input
    wrong(ex.wave_width(bert, 0, None), NOT_ANSWERED)
    wrong(ex.wave_width(bert, 0, 1), "wave 0 holds 3")
    chain = pipeline.construct_model(str(MODELS / "resnet_block.onnx"), "local-cpu")
    saved = (chain.plan.sequential_launches - chain.plan.launches) * chain.plan.launch_seconds
    right(ex.rammer_gain(chain, chain.sum_seconds / (chain.sum_seconds - saved)))  # a chain saves launches only
    wrong(ex.rammer_gain(chain, None), NOT_ANSWERED)
    wrong(ex.rammer_gain(chain, 2.0), "fewer launches")


@pytest.mark.slow
def test_lesson8_dispatcher_checks_and_slider():
    small = Workload(op="matmul", params=(("K", 128), ("M", "dyn"), ("N", 128)))
    plan = pipeline.vortex_plan(small, "local-cpu", 512)
    widest = max((k for k, _ in plan.table.kernels), key=plan.outer)
    assert 77 % plan.outer(widest)  # so that the exercise's start (77 rows) is wrong
    right(ex.padded_rows(plan, widest, 77, math.ceil(77 / plan.outer(widest)) * plan.outer(widest)))
    wrong(ex.padded_rows(plan, widest, 77, 77), "you said 77")
    wrong(ex.padded_rows(plan, widest, 77, None), NOT_ANSWERED)

    slider = DispatchSlider(plan, value=77)
    slider.value = 33  # the lesson's solution reads the widget
    assert (slider.kernel, slider.predicted) == pipeline.vortex_pick(plan, 33)
    right(ex.dispatcher_pick(plan, 33, slider.kernel))
    wrong(ex.dispatcher_pick(plan, 33, None), NOT_ANSWERED)
    others = [k for k, _ in plan.table.kernels if k != slider.kernel]
    if others:
        wrong(ex.dispatcher_pick(plan, 33, others[0]), f"picks {slider.kernel}")

    # the slider clamps to the plan's range and draws the pick; without a bundle it runs nothing
    slider.value = 10**6
    assert slider.value == plan.values[-1] == slider.slider.max
    assert f"M={plan.values[-1]}" in slider.pick_html.value
    assert any(t.name.startswith(f"picked at M={plan.values[-1]}") for t in slider.figure_view.figure.data)
    assert slider.run() is None and "No compiled bundle" in slider.status.value
    assert slider.run_button.disabled


def test_lesson9_whatif_checks():
    a100 = pipeline.load_device("a100")
    options = Options(topk=3)
    half = pipeline.whatif([mm(1024)], pipeline.edit_device(a100, ["compute_units=54"]), options=options).results[0]
    truth = half.edited_top.predicted_seconds / half.base_top.predicted_seconds
    assert truth > 1  # half the SMs is never predicted faster
    right(ex.slowdown(half, 1.9))  # the lesson's solution: the base's split-K is gone on 54 SMs
    right(ex.slowdown(half, truth * 1.015))
    wrong(ex.slowdown(half, truth * 1.03), "slower")
    wrong(ex.slowdown(half, 2.0), "you said 2x")  # the lesson's trap: half the peak
    wrong(ex.slowdown(half, None), NOT_ANSWERED)

    faster = pipeline.whatif([mm(256)], pipeline.edit_device(a100, ["shared.bandwidth_gbps=2x"]), options=options).results[0]
    right(ex.top1_changes(faster, faster.changed))
    right(ex.top1_changes(faster, False))  # the lesson's solution
    wrong(ex.top1_changes(faster, True), "stays")
    wrong(ex.top1_changes(faster, None), NOT_ANSWERED)
