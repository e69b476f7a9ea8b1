"""The split-K CUDA template: a program with `split` S > 1 as two kernels (issue 16).

Where a program's grid leaves SMs idle (a GEMM with few outputs and a long K, a reduction with
few rows), the construction deals the steps of one reduce axis (`rprogram.split_axis`) over S
blocks per unit tile (`RProgram.split`). TVM's `rfactor` on the outer loop of that axis, split
in S, makes the schedule: a partial-sum block `<main>_rf` writing `rf[s, outputs]` (global
memory) and the main block, now a sum over s. Each part walks `split_steps` whole steps of the
axis, the last part the rest (its tail guarded by the split's predicate). Both are root loop nests whose outer loops are
bound to `blockIdx.x`, so TVM's lowering makes two kernels, launched one after the other.

The partial-sum block is tiled as `codegen.cuda` tiles the main block (its split loop joins the
grid), with the same steps, called from there: cooperative staging in shared memory
(`_stage_in_shared`), register staging of fragments, double-buffered copies where
`rtile.staging.pipelined` says so (each part walks at least two steps), register accumulators
written back under the thread loop, unrolled register tiles, and for a cross-thread reduction (`cross_thread_axis`) threads along the split
axis within a block, summed by TVM's cross-thread allreduce. The final pass gives each thread
one output (consecutive threads, consecutive outputs), sums its S partial sums in a register
and applies the epilogues (reduce_mean's division, a fused bias/relu) once, at its write-back.
"""

from __future__ import annotations

from math import ceil, prod

from workbench.codegen.common import (
    axis_chain,
    axis_loops,
    epilogue_names,
    inline_epilogues,
    new_schedule,
    primitive,
    producer_names,
    split_by_chain,
)
from workbench.codegen.cuda import (
    REGISTERS,
    SHARED,
    _copy_loop,
    _Nest,
    _stage_fragment,
    _stage_in_shared,
    _tensor_of,
    _unroll_below,
    block_threads,
    check_gpu_program,
    fuse_threads,
    lane_program,
    pipeline_shared_copies,
    split_levels,
    within_block_limits,
)
from workbench.codegen.template import ScheduleError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.plan import gpu_plan
from workbench.rtile.rprogram import RProgram, split_axis, split_steps
from workbench.rtile.staging import pipelined, pipelined_axis, register_prefetch

FINAL_THREADS = 128  # threads per block of the final pass: 4 warps, the multiple issue 16 asks for


def schedule_split_k(expr: TensorExpr, program: RProgram, device: DeviceSpec):
    """A `tvm.s_tir.Schedule` of two kernels realising split program `program` (`split` > 1);
    ScheduleError when it cannot (an operator `split_axis` does not split, or a split that is
    not `split_counts`'s: parts of `split_steps` whole shared-memory steps)."""
    check_gpu_program(expr, program)
    axis = split_axis(expr, device)
    if axis is None:
        raise ScheduleError(f"{expr.op}: split-K does not apply to this operator on {device.name}")
    extent, step = expr.axes[axis].extent, program.tiles[SHARED][axis]
    if ceil(extent / (split_steps(program, axis) * step)) != program.split:
        raise ScheduleError(
            f"axis {expr.axes[axis].name}: its {extent} elements in steps of {step} do not make {program.split} parts"
        )
    plan = gpu_plan(program, device)
    if axis == plan.cross_thread_axis and (extent % step or extent // step % program.split):
        # TVM lowers a thread-bound reduce loop of an rfactor block under a predicate as a plain loop
        raise ScheduleError(f"axis {expr.axes[axis].name}: a cross-thread reduction splits only into whole steps (no predicate)")
    if plan.pipelined and plan.pipelined_axis == axis and split_steps(program, axis) < 2:
        raise ScheduleError(f"axis {expr.axes[axis].name}: a pipelined program's parts need two steps or more")
    program = lane_program(expr, program, device)
    return within_block_limits(
        block_threads(expr, program, device), lambda: _schedule(expr, program, device, axis), device
    )


def _schedule(expr: TensorExpr, program: RProgram, device: DeviceSpec, axis: int):
    sch = new_schedule(expr)
    main = sch.get_sblock(expr.main_block)
    producers, epilogues = producer_names(sch, expr), epilogue_names(sch, expr)
    reads = tuple(str(r.source.name) for r in sch.get(main).reads)
    loops = axis_loops(sch, main, expr)
    step = program.tiles[SHARED][axis]
    steps, lanes = sch.split(loops[axis], factors=[None, step], preserve_unit_iters=True)  # as unsplit: tail guarded
    part, rest = sch.split(steps, factors=[None, split_steps(program, axis)], preserve_unit_iters=True)
    nest = [sch.get_sref(loop) for loop in sch.get_loops(main)]
    loops[axis] = lanes  # a placeholder: the split axis's loops are rebuilt below
    where = [next(n for n, ref in enumerate(nest) if ref.same_as(sch.get_sref(loop))) for loop in (*loops, part, rest, lanes)]
    rf = primitive("rfactor the split axis", sch.rfactor, part, 0)  # main now sums the partial sums over `part`
    rebuilt = sch.get_loops(rf)  # rfactor rebuilds the nest (same order) around the partial-sum block
    *loops, part, rest, lanes = [rebuilt[n] for n in where]
    loops[axis] = (rest, lanes)  # the axis's own steps and one step's elements
    across = gpu_plan(program, device).cross_thread_axis is not None
    if across:
        nest, anchor = _tile_cross_thread(sch, expr, program, part, loops, axis)
    else:
        nest = _tile(sch, expr, program, device, part, loops, axis, dict(gpu_plan(program, device).vthreads))
        anchor = nest.thread
    local = sch.cache_write(rf, 0, "local")  # partial sums in registers, stored once per output
    sch.reverse_compute_at(local, anchor)
    if program.cached[SHARED]:  # staged, register-staged and pipelined as `codegen.cuda._schedule` does
        copies = [_stage_in_shared(sch, rf, buffer, _tensor_of(sch, expr, buffer, producers), expr, program, device, nest)
                  for buffer in reads]
        for copy in copies:
            _stage_fragment(sch, rf, copy, nest)  # no fused axes here (`split_axis`)
        if gpu_plan(program, device).pipelined:
            loop = _copy_loop(expr, program, device, nest)
            pipeline_shared_copies(sch, loop, len(copies), gpu_plan(program, device).register_prefetch)
    for name in reversed(producers):  # conv's `pad` folds into its shared copy, or into the partial sums
        sch.compute_inline(sch.get_sblock(name))
    for loop in nest.register:
        sch.unroll(loop)
    if not across:  # a cross-thread reduction's init stays in its allreduce (as in `codegen.cuda`)
        init = sch.decompose_reduction(rf, nest.reduce_steps[0])
        for block in (init, local):
            _unroll_below(sch, block, nest.thread)
    _final_pass(sch, expr, epilogues)
    return sch


def _tile(sch, expr: TensorExpr, program: RProgram, device: DeviceSpec, part, loops, axis: int, vthreads) -> _Nest:
    """`codegen.cuda._tile` on the partial-sum block: every axis split by its tile chain (the
    split axis's steps are its part's), the split loop outermost in the grid."""
    levels = split_levels(sch, loops, expr, program, vthreads, keep=axis)
    # (steps of its share, register steps, register tile), as `split_by_chain` makes them
    steps, lanes = loops[axis]
    register = axis_chain(program, axis)[REGISTERS]
    levels[axis] = [steps, *sch.split(lanes, factors=[None, register], preserve_unit_iters=True)]
    grid, virtual, threads, spatial_regs = [part], [], [], []
    for a in expr.spatial:
        grid.append(levels[a][0])
        virtual.extend(levels[a][1:-2])
        threads.append(levels[a][-2])
        spatial_regs.append(levels[a][-1])
    steps = [levels[k][0] for k in expr.reduce]
    inner = [levels[k][1] for k in expr.reduce] + [levels[k][2] for k in expr.reduce]
    sch.reorder(*grid, *virtual, *threads, *steps, *inner, *spatial_regs)
    if not threads:  # a reduction to a scalar: one thread a block
        threads = [sch.add_unit_loop(steps[0])]
    sch.bind(sch.fuse(*grid), "blockIdx.x")
    if virtual:
        sch.bind(sch.fuse(*virtual), "vthread.x")
    thread = fuse_threads(sch, threads, [expr.axes[a].name for a in expr.spatial], gpu_plan(program, device).warp_lanes)
    sch.bind(thread, "threadIdx.x")
    return _Nest(thread, tuple(steps), tuple([levels[k][2] for k in expr.reduce] + spatial_regs))


def _tile_cross_thread(sch, expr: TensorExpr, program: RProgram, part, loops, axis: int):
    """`codegen.cuda._schedule_cross_thread`'s loop nest on the partial-sum block: the block's
    threads along the split axis (thread t of T reads t, t + T, .. of each step of its share),
    the split loop outermost in the grid. Returns the nest and the loop the register
    write-back goes under (the block's last output loop)."""
    grid, units, outputs, steps, inner, register = [part], [], [], [], [], []
    for a, (ax, loop) in enumerate(zip(expr.axes, loops)):
        chain = axis_chain(program, a)
        if a == axis:
            step, lanes = loop
            regs, thread = sch.split(lanes, factors=[chain[REGISTERS], None], preserve_unit_iters=True)
        elif ax.kind == "spatial":
            block, unit, tile = split_by_chain(sch, loop, ax.extent, chain)
            grid.append(block)
            units.append(unit)
            outputs.append(tile)
        else:
            other_step, walk, other_regs = split_by_chain(sch, loop, ax.extent, chain)
            steps.append(other_step)
            inner.append(walk)
            register.append(other_regs)
    steps.append(step)
    register.append(regs)
    sch.reorder(*grid, *units, *outputs, *steps, *inner, *register, thread)
    blocks = sch.fuse(*grid)
    sch.bind(blocks, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    return _Nest(thread, tuple(steps), tuple(register)), (outputs[-1] if outputs else blocks)


def _final_pass(sch, expr: TensorExpr, epilogues) -> None:
    """The second kernel: the main block, now a sum over the split, a thread per output
    (FINAL_THREADS a block, consecutive threads on consecutive outputs: coalesced reads of each
    partial-sum row), the sum kept in a register and written back through the epilogues."""
    final = sch.get_sblock(expr.main_block)
    local = sch.cache_write(final, 0, "local")
    inline_epilogues(sch, epilogues)
    *spatial, part = sch.get_loops(final)
    outputs = prod(int(sch.get(loop).extent) for loop in spatial)
    threads = min(FINAL_THREADS, outputs)
    if spatial and int(sch.get(spatial[-1]).extent) % threads == 0:
        # the threads within the last axis: fusing all axes and splitting at an axis boundary
        # makes TVM 0.27's FlattenBuffer divide by zero on the register's indices (M=8, N=128)
        rows, thread = sch.split(spatial[-1], factors=[None, threads], preserve_unit_iters=True)
        blocks = sch.fuse(*spatial[:-1], rows)
    else:
        flat = sch.fuse(*spatial) if spatial else sch.add_unit_loop(part)
        blocks, thread = sch.split(flat, factors=[None, threads], preserve_unit_iters=True)
    sch.bind(blocks, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.reverse_compute_at(local, thread)
    sch.decompose_reduction(final, part)
