"""The target table: every preset's target kind is in it, builds keep the texts it names, a
convolution's direct kernel is compiled with LLVM's loop-unswitch threshold raised, and a program
whose register tiles store straight to the output with TVM's unroll of the loops over them."""

from __future__ import annotations

import json
from dataclasses import replace
from math import prod

import pytest

from tests.helpers import TINY_CPU, device, expr, matmul
from workbench.codegen import targets
from workbench.codegen.build import (
    UNROLL_REGISTER_LOOPS, UNSWITCH_THRESHOLD, build_kernel, kernel_target, pass_config, target_dict,
)
from workbench.codegen.cuda import ASYNC_COPY_CONFIG
from workbench.codegen.rules import apply_rules
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.hardware.loader import list_presets
from workbench.rtile.plan import FILTERS, cpu_plan
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus

# TINY_CPU has 16 fp32 lanes (AVX-512-like), this one 8 (AVX2-like).
AVX2_LIKE = replace(TINY_CPU, name="tiny-avx2", warp_size=8, registers_per_thread_cap=12, registers_per_unit=16)


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_target_kind_is_in_the_table(name):
    spec = device(name)
    entry = targets.target(target_dict(spec)["kind"])
    assert entry in targets.TARGETS.values()
    assert entry.on_host == spec.runs_on_cpu


def test_kernels_run_on_the_cpu_device_for_llvm_and_on_their_own_device_otherwise():
    import tvm

    assert targets.runtime_device("llvm") == tvm.cpu(0)
    assert targets.runtime_device("cuda", 1) == tvm.cuda(1)


def test_a_kind_outside_the_table_keeps_its_device_code_under_its_own_name():
    entry = targets.target("vulkan")
    assert (entry.runtime_device, entry.sources, entry.on_host) == ("vulkan", (("vulkan", ""),), False)


def test_source_names_and_languages_by_suffix():
    assert [targets.source_name(s) for s in ("cu", "ll", "s", "spv")] == ["CUDA C", "LLVM IR", "assembly", "spv"]
    assert [targets.language(s) for s in ("cu", "ll", "s", "spv")] == ["cpp", "llvm", "nasm", "text"]


@pytest.mark.parametrize("name", [TINY_CPU.name, "v100"])
def test_a_build_keeps_the_texts_its_target_names(name):
    spec = device(name)
    built = construct(expr("relu", shape=[64, 64]), spec)
    kernel = build_kernel(built.expr, built.candidates[0].program, spec)
    assert kernel.ok, kernel.error
    assert [suffix for suffix, _ in kernel.sources] == [s for s, _ in targets.target(kernel.target_kind).sources]
    assert all(text.strip() for _, text in kernel.sources)


@pytest.mark.parametrize("spec", [AVX2_LIKE, TINY_CPU], ids=["8-lane", "16-lane"])
def test_a_direct_convolution_unswitches_its_grid_guard_and_the_rest_keep_llvms_default(spec):
    """A conv's edge tiles keep a guard on the grid index (the filters path's split edges) inside
    a register tile that unrolls window taps too, a body LLVM's default cost limit never
    unswitches: those kernels get `build.UNSWITCH_THRESHOLD`; a conv's tile over one tap and a
    matmul's kernels gained nothing from it and keep the default."""
    flag = {"cl-opt": [f"-unswitch-threshold:int={UNSWITCH_THRESHOLD}"]}
    conv = construct(expr("conv2d", N=1, C=479, H=12, W=12, F=11, KH=3, KW=3, stride=2, pad=0), spec,
                     options=Options(topk=10))
    flagged = []
    for c in conv.candidates:
        plan, reg = cpu_plan(c.program, spec), c.program.register_tile
        taps = plan.path == FILTERS and plan.split_edges and prod(reg[a] for a in conv.expr.reduce) > 1
        assert kernel_target(c.program, spec) == target_dict(spec) | (flag if taps else {})
        flagged += [c] if taps else []
    one_tap = replace(flagged[0].program, tiles=(tuple(1 if a in conv.expr.reduce else t for a, t in
                                                       enumerate(flagged[0].program.tiles[0])), *flagged[0].program.tiles[1:]))
    assert cpu_plan(one_tap, spec).split_edges and kernel_target(one_tap, spec) == target_dict(spec)
    for c in construct(matmul(37, 29, 53), spec, options=Options(topk=2)).candidates:
        assert cpu_plan(c.program, spec).path != FILTERS and kernel_target(c.program, spec) == target_dict(spec)
    kernel = build_kernel(conv.expr, flagged[0].program, spec, sources=False)
    assert kernel.ok, kernel.error
    assert json.loads(kernel.target)["cl-opt"] == flag["cl-opt"]  # compiled with it, and the bundle says so


def _loops_indexing(mod, buffer: str) -> int:
    """Loops of the lowered `mod` whose variable indexes `buffer` (or a copy of it that loop
    partitioning made, `buffer_1`, ...), read off its TVMScript (this TVM has no Python visitor
    of statements)."""
    import re

    text = mod.script()
    loops = set(re.findall(r"for (\w+) in ", text))
    indexing = set()
    for name, index in re.findall(r"(\w+)\[([^\]]*)\]", text):
        if re.fullmatch(rf"{buffer}(_\d+)?", name):
            indexing |= set(re.findall(r"\w+", index)) & loops
    return len(indexing)


def _lowered(mod, target, config: dict):
    import tvm

    with tvm.transform.PassContext(config=config):
        bound = tvm.tirx.transform.BindTarget(target.with_host(target))(mod)
        lower = tvm.tirx.get_default_tir_pipeline(target)[0]  # 0.27: (pipeline, host and device finalisation)
        return lower(bound)


@pytest.mark.parametrize("spec", [AVX2_LIKE, TINY_CPU], ids=["8-lane", "16-lane"])
def test_register_tiles_stored_straight_to_the_output_keep_no_loop_over_their_accumulators(spec):
    """356 x 71 x 139 in register tiles of 6 rows x 3 vectors whose whole reduction runs inside
    them (`CpuPlan.direct_stores`): the output's end (139 columns) cuts the last tile along its
    vectors, which the vectoriser stores lane by lane in a loop indexing the accumulators (LLVM
    then keeps them in memory through the K-loop). Its panels pad the tails, so the accumulators
    are a stack buffer (`CpuPlan.stack_accumulators`), which `pass_config`'s
    `UNROLL_REGISTER_LOOPS` (for `local` buffers) does not see: the write-back's
    `pragma_auto_unroll_max_step` has TVM unroll that loop. Lowered under the config, the kernel
    has no loop indexing the accumulators, where without the pragma it has some; the kernel and
    bundle carry the config, which the `local` accumulators of the row path need. A program that
    accumulates a unit tile's outputs in a buffer of its own (K split over L1 tiles) keeps the
    plain config: unrolling the loops over that buffer would copy their bodies by the thousand."""
    import tvm

    v = spec.warp_size
    mm = matmul(356, 139, 71)
    program = make_program(calculus(mm), spec, [(6, 3 * v, 1), (6, 3 * v, 71), (180, 144, 71)], [True] * 3, 0.0)
    plan = cpu_plan(program, spec)
    assert plan.direct_stores and plan.stack_accumulators and 139 % (3 * v)
    config = pass_config(program, spec)
    assert config == ASYNC_COPY_CONFIG | UNROLL_REGISTER_LOOPS
    split = make_program(calculus(mm), spec, [(6, 3 * v, 1), (6, 3 * v, 16), (180, 144, 71)], [True] * 3, 0.0)
    assert not cpu_plan(split, spec).direct_stores and pass_config(split, spec) == ASYNC_COPY_CONFIG
    target = tvm.target.Target(kernel_target(program, spec))
    _, sch = apply_rules(mm, program, spec)
    accumulator = sch.get(sch.get_sblock("C_update")).writes[0].source.name
    plain = sch.copy()
    for loop in plain.get_loops(plain.get_consumers(plain.get_sblock("C_update"))[0]):
        if "pragma_auto_unroll_max_step" in plain.get(loop).annotations:
            plain.unannotate(loop, "pragma_auto_unroll_max_step")
    counts = [_loops_indexing(_lowered(s.mod, target, config), accumulator) for s in (sch, plain)]
    assert counts[0] == 0 < counts[1]
    kernel = build_kernel(mm, program, spec, sources=False)
    assert kernel.ok, kernel.error
    assert json.loads(kernel.pass_config) == json.loads(json.dumps(config))


@pytest.mark.parametrize("spec", [AVX2_LIKE, TINY_CPU], ids=["8-lane", "16-lane"])
def test_local_accumulators_of_a_split_row_are_unrolled_by_the_pass_config(spec):
    """One row of 100 columns (96 + 4) over K = 24 in 16-column register tiles, no panels: the
    edge tile's lanes are split off and guarded (`CpuPlan.split_edges`, the row path), its
    accumulators `local`, and `UNROLL_REGISTER_LOOPS` unrolls the loops over them: none left in
    the lowered kernel under the config, some without it."""
    import tvm

    mm = matmul(1, 100, 24)
    program = make_program(calculus(mm), spec, [(1, 16, 1), (1, 32, 24), (1, 64, 24)], [True] * 3, 0.0)
    plan = cpu_plan(program, spec)
    assert plan.direct_stores and plan.split_edges and not plan.stack_accumulators
    config = pass_config(program, spec)
    assert config == ASYNC_COPY_CONFIG | UNROLL_REGISTER_LOOPS
    target = tvm.target.Target(kernel_target(program, spec))
    _, sch = apply_rules(mm, program, spec)
    accumulator = sch.get(sch.get_sblock("C_update")).writes[0].source.name
    counts = [_loops_indexing(_lowered(sch.mod, target, c), accumulator) for c in (config, ASYNC_COPY_CONFIG)]
    assert counts[0] == 0 < counts[1]
