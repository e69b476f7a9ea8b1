"""One plan per kernel (`rtile.plan`): the CPU template's path and layout, the GPU templates'
staging, made once from the rules and read by codegen, the model and the faces; on generated
specs, never only this machine's."""

from dataclasses import replace

import pytest
from helpers import TINY_CPU, device, expr
from test_alignment import AVX2, AVX512

from workbench.construct.stepper import construct
from workbench.ops.fusion import fuse_axes
from workbench.rtile.model import estimate
from workbench.rtile.model.cpu import packed_bytes
from workbench.rtile.model.cpu_compute import GUARDED_MICRO_KERNEL, guard_slowdown
from workbench.rtile.panels import packed_inputs, pads_tails, vector_loop_axis
from workbench.rtile.plan import (
    FILTERS, LANES, PANELS, SCALAR, CpuPlan, GpuPlan, cpu_plan, describe, gpu_plan, plan_for,
)
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus

CPUS = (TINY_CPU, AVX2, AVX512)


def _program(e, tiles, dev=TINY_CPU):
    return make_program(calculus(e), dev, tiles, [True] * len(tiles), 0.0)


def _ragged_matmul(epilogues=()):
    """100 rows on 6-row register tiles: a tail the template pads where it packs panels."""
    e = replace(fuse_axes(expr("matmul", M=100, K=64, N=64)), epilogues=epilogues)
    return _program(e, [(6, 16, 1), (6, 16, 64), (102, 64, 64)])


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_ragged_matmul_packs_pads_and_vectorises_its_row(dev):
    program = _ragged_matmul()
    plan = cpu_plan(program, dev)
    assert plan.path == PANELS and plan.vector_axis == 1 and plan.padded_tails and not plan.guarded_row
    assert plan.packed == packed_inputs(program.expr, program, dev) == ("A", "B")
    assert plan.lanes == dev.warp_size  # fp32: the spec's 32-bit lanes
    assert guard_slowdown(program, dev) == 1.0 and packed_bytes(program, dev) > 0


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_epilogues_keep_the_guard_and_the_model_prices_it(dev):
    """An epilogue block reads the unpadded output, so the template does not pad the tails:
    the 6-row register tiles keep their guard over 100 rows, and the model prices the guarded
    micro-kernel the template builds, not the padded one."""
    program = _ragged_matmul(("T_add",))
    assert pads_tails(program.expr, program, ("A", "B"))  # the rule alone would pad
    plan = cpu_plan(program, dev)
    assert not plan.padded_tails and plan.vector_axis == 1  # the row (64 columns) is not ragged
    assert plan.vector_axis == vector_loop_axis(program.expr, program, dev, True, False)
    assert guard_slowdown(program, dev) == GUARDED_MICRO_KERNEL
    assert estimate(program, dev).predicted_seconds != estimate(_ragged_matmul(), dev).predicted_seconds


def test_a_gemv_sums_lanes_along_k_and_a_conv_vectorises_its_filters():
    gemv = construct(fuse_axes(expr("gemv", M=4096, K=4096)), AVX512).candidates[0]
    plan = cpu_plan(gemv.program, AVX512)
    assert plan.path == LANES and gemv.expr.axes[plan.vector_axis].kind == "reduce" and plan.packed == ()
    conv = fuse_axes(expr("conv2d", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, pad=1))
    plan = cpu_plan(construct(conv, AVX512).candidates[0].program, AVX512)
    assert plan.path == FILTERS and plan.accumulators == "filters-last buffer" and plan.staged_padding
    assert plan.packed == tuple(t.name for t in conv.inputs if t.uses_axis(plan.vector_axis))


def test_a_ragged_tail_nothing_pads_leaves_the_row_scalar():
    relu = expr("relu", shape=(100,))
    plan = cpu_plan(_program(relu, [(16,), (96,)]), TINY_CPU)
    assert plan.path == SCALAR and plan.vector_axis is None and plan.guarded_row
    assert "scalar row (a guarded tail)" in describe(plan, _program(relu, [(16,), (96,)]))


def test_a_plan_reads_in_words_and_as_json():
    program = _ragged_matmul()
    plan = plan_for(program, TINY_CPU)
    assert isinstance(plan, CpuPlan)
    assert describe(plan, program).startswith("A, B packed in 6x16 panels, lanes along j, tails padded")
    data = plan.to_dict(program.expr)
    assert data["vector_axis"] == "j" and data["packed"] == ["A", "B"] and data["template"] == "cpu"


@pytest.mark.parametrize("name", ["v100", "a100"])
def test_a_gpu_plan_names_what_the_cuda_templates_stage_and_pipeline(name):
    dev = device(name)
    cand = construct(expr("matmul", M=1024, K=1024, N=1024), dev).candidates[0]
    plan = plan_for(cand.program, dev)
    assert isinstance(plan, GpuPlan) and plan == gpu_plan(cand.program, dev)
    assert plan.staged == (("A", "B") if cand.program.cached[dev.unit_layer_index] else ())
    assert plan.stages in (1, 2) and (plan.pipelined_axis is not None) == plan.pipelined
    assert not plan.register_prefetch or plan.pipelined
    data = plan.to_dict(cand.expr)
    assert data["template"] == "cuda" and data["split"] == cand.program.split
    assert describe(plan, cand.program)
