"""The CUDA schedule template: an rProgram on (registers, shared) as a TensorIR schedule.

Roller's GPU mapping (§3.2, §4): the shared-memory tile is one thread block, the register tile
one thread, so every spatial axis is split into (grid, [vthread,] threads, register tile) and
every reduce axis into (shared-memory steps, register steps, register tile). The grid loops are
fused and bound to `blockIdx.x`, the thread loops to `threadIdx.x`. Inputs are staged in shared
memory at the innermost shared-step loop by all threads of the block together (cooperative
fetch), each thread copies the fragments its register tile reads from shared memory into
`local` arrays at every register step (register staging), partial sums accumulate in registers
(`cache_write` to `local`), and the register tile is fully unrolled so nvcc keeps it in
registers. Where `rtile.staging.pipelined` says so (sm_80+, at least two shared steps, two
buffers fit a block) the shared copies are double-buffered and asynchronous (cp.async), a step
ahead of the compute (`pipeline_shared_copies`); on sm_70 through registers instead
(`prefetch_in_registers`). Programs with `cached[1]` False (no reuse:
elementwise, most reductions) read their inputs straight from global memory.

Tiles that do not divide an extent are realised by predicated splits: the tail block computes
under a guard, so prime shapes still give correct code. `workbench.codegen.nvcc` checks the
generated source with nvcc and reports ptxas's registers and spills.

A reduction whose rows are contiguous (`rtile.axes.cross_thread_axis`: reduce_sum /
reduce_mean over the last axes, gemv), where a thread per output would read its neighbours'
rows a row apart, binds its threads to its innermost reduce axis instead, one block a row, and
sums across them with TVM's cross-thread reduction (`_schedule_cross_thread`).

Tensor-core programs (float16 matmuls on GPUs with MMA units) take `cuda_mma`'s WMMA schedule
(the rule `codegen.rules.tensor_core`, tried before this one's `codegen.rules.gpu`); both share
the checks below (`check_gpu_program`, `within_block_limits`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from math import prod
from typing import Callable, Mapping

from workbench.codegen.common import (
    axis_chain,
    axis_loops,
    check_program,
    epilogue_names,
    flatten_fused_output,
    inline_epilogues,
    new_schedule,
    producer_names,
    split_by_chain,
)
from workbench.codegen.block_order import group_rows
from workbench.codegen.template import ScheduleError
from workbench.errors import first_line
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.occupancy import blocks_per_unit
from workbench.rtile.plan import gpu_plan
from workbench.rtile.rprogram import RProgram
from workbench.rtile.staging import pipelined, pipelined_axis, register_prefetch

REGISTERS, SHARED = 0, 1  # layer indices of a GPU rProgram (top first)
# TVM lowers the pipelined copies' async scopes to cp.async only under this pass config
# (`InjectPTXAsyncCopy` in tvm.s_tir.pipeline); kernels without async scopes are unchanged by it
ASYNC_COPY_CONFIG = {"tirx.use_async_copy": True}
LOCAL_STAGE = "tirx.manifest_shared_memory_local_stage"  # TVM's annotation of a copy through registers
VECTOR_WIDTHS = (4, 2)  # lanes of a cooperative copy; 16 B (float4) is the widest CUDA access


@dataclass(frozen=True)
class _Nest:
    """The loops of the main block after tiling, by role (outermost first)."""

    thread: object  # threadIdx.x
    reduce_steps: tuple  # one shared-memory step loop per reduce axis
    register: tuple  # register-tile loops: reduce register steps, then spatial tile


def schedule_cuda_cores(expr: TensorExpr, program: RProgram, device: DeviceSpec):
    """A `tvm.s_tir.Schedule` realising `program` on the CUDA cores; ScheduleError when it cannot.
    A program's `vthreads` pair a spatial axis name with a virtual-thread count that strides that
    axis's register tile over the block (TVM `vthread`). A tensor-core program (warp tiles) is
    first split over the lanes (`lane_program`)."""
    check_gpu_program(expr, program)
    program = lane_program(expr, program, device)
    return within_block_limits(
        block_threads(expr, program, device), lambda: _schedule(expr, program, device, dict(gpu_plan(program, device).vthreads)), device
    )


# Registers a thread keeps at least where `bound_occupancy` asks ptxas for resident blocks:
# the WMMA programs that lost a block to 129-148 registers fitted 128 without spilling, while
# asking one of 128 threads for 6 blocks (85 registers) spilled (sm_90, nvcc 13).
MIN_BOUND_REGISTERS = 128


def bound_occupancy(source: str, program: RProgram, device: DeviceSpec) -> str:
    """The CUDA C `source` of `program`'s kernels with the blocks per unit the model prices
    (`occupancy.blocks_per_unit`, B) asked of nvcc: each kernel launched with the program's
    block of T threads declares `__launch_bounds__(T, B')` instead of TVM's
    `__launch_bounds__(T)`, B' = B up to the blocks that leave a thread `MIN_BOUND_REGISTERS`,
    so ptxas fits a thread in the registers B' resident blocks leave (CUDA C++ Programming
    Guide, "Launch Bounds"). Without it ptxas took 129-148 registers a thread for WMMA
    programs the model had at 2 blocks of 256 threads, and their one resident block ran
    1.5-1.8x the time of a 128-register twin's two on the H200 (docs/gpu.md). Unchanged where
    B' is 1; other kernels (split-K's final pass) keep theirs."""
    threads, bpu = blocks_per_unit(program, device, gpu_plan(program, device).stages)
    blocks = min(bpu, device.registers_per_unit // (threads * MIN_BOUND_REGISTERS))
    if blocks <= 1:
        return source
    return re.sub(rf"__launch_bounds__\({threads}\)", f"__launch_bounds__({threads}, {blocks})", source)


def check_gpu_program(expr: TensorExpr, program: RProgram) -> None:
    check_program(expr, program)
    if len(program.tiles) != 2:
        raise ScheduleError(f"a GPU program has two layers (registers, shared), got {len(program.tiles)}")


def within_block_limits(threads: int, schedule: Callable[[], object], device: DeviceSpec):
    """`schedule()` when a block of `threads` threads and the schedule's shared memory fit the
    target's per-block limits; ScheduleError (one line) otherwise or when TVM refuses it."""
    limit = _limit(device, "max_threads_per_block")
    if threads > limit:
        raise ScheduleError(f"{threads} threads per block exceed the target's {limit}")
    try:
        sch = schedule()
    except ScheduleError:
        raise
    except Exception as err:  # a TVM primitive refused the program
        raise ScheduleError(first_line(err)) from err
    shared, limit = gpu_resources(sch, device).shared_bytes, _limit(device, "max_shared_memory_per_block")
    if shared > limit:
        raise ScheduleError(f"{shared} B of shared memory per block exceed the target's {limit} B")
    return sch


@dataclass(frozen=True)
class GpuResources:
    """What one thread block of a scheduled kernel uses, read off the lowered TIR."""

    threads: int  # product of the threadIdx extents
    vthreads: int
    shared_bytes: int
    local_bytes: int  # per thread


def gpu_resources(sch, device: DeviceSpec) -> GpuResources:
    """Thread extents from the schedule's bound loops; buffer sizes after buffer compaction (the
    first passes of TVM's lowering). TVM's `verify_gpu_code` is not used for threads: it keys
    them by variable name, which TensorIR's loop-named thread variables never match."""
    import tvm
    from tvm import s_tir, tirx

    extents: dict[str, int] = {}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        for loop in sch.get_loops(block):
            binding = sch.get(loop).thread_binding
            if binding is not None and not str(binding.thread_tag).startswith("blockIdx"):
                # the grid's extent may be symbolic (a Vortex kernel's T * tile); only threads count here
                tag = str(binding.thread_tag)
                extents[tag] = max(extents.get(tag, 1), int(sch.get(loop).extent))
    passes = [
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        # a register prefetch's local stage (its copies' thread loops lifted first, as TVM's
        # lowering does); only there: lifting the threads reshapes a WMMA kernel's pipeline body
        *([s_tir.transform.LiftThreadBinding(), s_tir.transform.ManifestSharedMemoryLocalStage()]
          if _has_local_stage(sch) else []),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(),  # tensorized (WMMA) blocks bind their operands this way
        s_tir.transform.InjectSoftwarePipeline(),  # a pipelined program's shared buffers double
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
    ]
    with tvm.target.Target(device.target_dict()):
        lowered = tvm.ir.transform.Sequential(passes)(sch.mod)
    sizes = s_tir.analysis.calculate_allocated_bytes(lowered)["main"]
    return GpuResources(
        threads=prod(n for tag, n in extents.items() if tag.startswith("threadIdx")),
        vthreads=prod(n for tag, n in extents.items() if tag.startswith("vthread")),
        shared_bytes=int(sizes.get("shared", 0)),
        local_bytes=int(sizes.get("local", 0)),
    )


def _has_local_stage(sch) -> bool:
    """Whether a shared copy of the schedule goes through registers (`prefetch_in_registers`)."""
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    while blocks:
        block = blocks.pop()
        if LOCAL_STAGE in sch.get(block).annotations:
            return True
        blocks.extend(sch.get_child_blocks(block))
    return False


def _limit(device: DeviceSpec, key: str) -> int:
    """A per-block hardware limit from the TVM target, else the spec's own number."""
    fallback = {"max_threads_per_block": device.max_threads_per_block}
    fallback["max_shared_memory_per_block"] = device.layers[SHARED].capacity_bytes
    return int(device.target_dict().get(key, fallback[key]))


def lane_program(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> RProgram:
    """A tensor-core program's top tile is one warp's fragment tile (rtile.axes.mma_axes).
    Where the WMMA path (`cuda_mma`) cannot take it, it is realised on the CUDA cores: the warp
    tile is split over the warp's lanes along (i, j), which keeps the program's threads per block
    and its shared-memory tiles. Other programs are returned unchanged."""
    mma = gpu_plan(program, device).mma_axes
    if mma is None:
        return program
    i, j, _ = mma
    warp_tile = program.tiles[REGISTERS]
    lanes_j = next(l for l in (8, 4, 2, 1) if warp_tile[j] % l == 0)
    lanes_i = device.warp_size // lanes_j
    if warp_tile[i] % lanes_i:
        raise ScheduleError(f"warp tile {warp_tile} does not split over {device.warp_size} lanes")
    lane = list(warp_tile)
    lane[i], lane[j] = warp_tile[i] // lanes_i, warp_tile[j] // lanes_j
    return replace(program, tiles=(tuple(lane),) + program.tiles[1:])


def block_threads(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> int:
    """Threads of one block: prod over spatial axes of shared tile / register tile, or for a
    cross-thread reduction (`cross_thread_axis`) that ratio along its reduce axis."""
    across = gpu_plan(program, device).cross_thread_axis
    axes = expr.spatial if across is None else (across,)
    return prod(program.tiles[SHARED][a] // program.tiles[REGISTERS][a] for a in axes)


def _schedule(expr: TensorExpr, program: RProgram, device: DeviceSpec, vthreads: Mapping[str, int]):
    across = gpu_plan(program, device).cross_thread_axis
    if across is not None:
        return _schedule_cross_thread(expr, program, device, vthreads, across)
    sch = new_schedule(expr)
    main = sch.get_sblock(expr.main_block)
    producers, epilogues = producer_names(sch, expr), epilogue_names(sch, expr)
    reads = tuple(str(r.source.name) for r in sch.get(main).reads)
    nest = _tile(sch, main, expr, program, device, vthreads)
    if expr.reduce:  # partial sums stay in registers; the write-back absorbs the epilogues
        local = sch.cache_write(main, 0, "local")
        flatten_fused_output(sch, main, local, expr)
        sch.reverse_compute_at(local, nest.thread)
    inline_epilogues(sch, epilogues)
    if program.cached[SHARED] and expr.reduce:  # without reduce axes there is no reuse to stage
        copies = []
        for buffer in reads:
            tensor = _tensor_of(sch, expr, buffer, producers)
            copies.append(_stage_in_shared(sch, main, buffer, tensor, expr, program, device, nest))
            if not any(expr.axes[a].fused_from for a in range(len(expr.axes)) if expr.tensors[tensor].uses_axis(a)):
                _stage_fragment(sch, main, copies[-1], nest)
        if gpu_plan(program, device).pipelined:
            loop = _copy_loop(expr, program, device, nest)
            pipeline_shared_copies(sch, loop, len(copies), gpu_plan(program, device).register_prefetch)
    for name in reversed(producers):  # conv's `pad` folds into its shared copy, or into the main block
        sch.compute_inline(sch.get_sblock(name))
    for loop in nest.register:
        sch.unroll(loop)
    if expr.reduce:
        init = sch.decompose_reduction(main, nest.reduce_steps[0])
        for block in (init, local):
            _unroll_below(sch, block, nest.thread)
        if gpu_plan(program, device).vector_stores:
            sch.vectorize(sch.get_loops(local)[-1])
    return sch


def _schedule_cross_thread(expr: TensorExpr, program: RProgram, device: DeviceSpec, vthreads, across: int):
    """A cross-thread reduction (`rtile.axes.cross_thread_axis`): the block's threads split
    the reduce axis `across`, thread t of T reading elements t, t + T, .. of each step of the
    block tile (consecutive threads, consecutive elements: coalesced) into its registers; the
    other reduce axes are walked by every thread. The block computes the outputs of its tile
    one after another (a spatial loop inside the reduce loops is refused by TVM's lowering),
    and TVM's `LowerCrossThreadReduction` turns the reduce loop bound to `threadIdx.x` into an
    in-thread sum followed by a tree over the threads (warp shuffles, then shared memory
    between the warps), thread 0 writing the result. Epilogues (reduce_mean's division) are
    computed by thread 0 from its register after the tree (the write-back of a `local` cache).
    """
    if vthreads:
        raise ScheduleError("virtual threads do not apply to a cross-thread reduction (no threads along the outputs)")
    sch = new_schedule(expr)
    main = sch.get_sblock(expr.main_block)
    producers, epilogues = producer_names(sch, expr), epilogue_names(sch, expr)
    reads = tuple(str(r.source.name) for r in sch.get(main).reads)
    grid, units, outputs, steps, inner, register = [], [], [], [], [], []
    for a, (axis, loop) in enumerate(zip(expr.axes, axis_loops(sch, main, expr))):
        chain = axis_chain(program, a)
        if a == across:  # (steps, register tile, threads): thread t reads t, t + T, .. of a step
            step, lanes = sch.split(loop, factors=[None, chain[SHARED]], preserve_unit_iters=True)
            regs, thread = sch.split(lanes, factors=[chain[REGISTERS], None], preserve_unit_iters=True)
        elif axis.kind == "spatial":
            block, unit, tile = split_by_chain(sch, loop, axis.extent, chain)  # unit: no threads along it
            grid.append(block)
            units.append(unit)
            outputs.append(tile)
        else:
            other_step, walk, other_regs = split_by_chain(sch, loop, axis.extent, chain)
            steps.append(other_step)
            inner.append(walk)
            register.append(other_regs)
    steps.append(step)  # the threads' axis innermost: the loops bound to threads come last
    register.append(regs)
    sch.reorder(*grid, *units, *outputs, *steps, *inner, *register, thread)
    if not grid:  # a reduction to a scalar: one block
        grid = [sch.add_unit_loop(outputs[0] if outputs else steps[0])]
    sch.bind(sch.fuse(*grid), "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    local = sch.cache_write(main, 0, "local")
    flatten_fused_output(sch, main, local, expr)
    sch.reverse_compute_at(local, outputs[-1] if outputs else sch.get_loops(main)[0])
    inline_epilogues(sch, epilogues)
    nest = _Nest(thread, tuple(steps), tuple(register))
    if program.cached[SHARED]:
        for buffer in reads:
            tensor = _tensor_of(sch, expr, buffer, producers)
            _stage_in_shared(sch, main, buffer, tensor, expr, program, device, nest)
    for name in reversed(producers):
        sch.compute_inline(sch.get_sblock(name))
    for loop in register:
        sch.unroll(loop)
    return sch


def _tile(sch, main, expr: TensorExpr, program: RProgram, device: DeviceSpec, vthreads: Mapping[str, int]) -> _Nest:
    """Split every axis by its tile chain, order the levels Roller's way, bind block and threads.
    A contraction's grid runs its blocks in grouped order (`block_order.group_rows`: the row
    axis's grid loop split by the group and reordered around the column axis's before fusion)."""
    levels = split_levels(sch, axis_loops(sch, main, expr), expr, program, vthreads)
    groups = group_rows(expr, program, device)
    grid_extents = ((groups.rows, groups.grid_rows), (groups.cols, groups.grid_cols)) if groups else ()
    if any(_static_extent(sch, levels[a][0]) != n for a, n in grid_extents):
        groups = None  # a symbolic grid (a Vortex kernel's T * tile): its row count is not known here
    grid, virtual, threads, spatial_regs = [], [], [], []
    for a in expr.spatial:
        if not groups or a not in (groups.rows, groups.cols):
            grid.append(levels[a][0])
        virtual.extend(levels[a][1:-2])
        threads.append(levels[a][-2])
        spatial_regs.append(levels[a][-1])
    if groups:  # (.., i_outer, j, i_inner): G block rows at a time, column by column
        outer, rows = sch.split(levels[groups.rows][0], factors=[None, groups.group])
        grid += [outer, levels[groups.cols][0], rows]
    steps = [levels[k][0] for k in expr.reduce]
    inner = [levels[k][1] for k in expr.reduce] + [levels[k][2] for k in expr.reduce]
    order = [*grid, *virtual, *threads, *steps, *inner, *spatial_regs]
    sch.reorder(*order)
    if not grid:  # a reduction to a scalar: one block of one thread
        grid, threads = [sch.add_unit_loop(order[0])], [sch.add_unit_loop(order[0])]
    sch.bind(sch.fuse(*grid), "blockIdx.x")
    if virtual:
        sch.bind(sch.fuse(*virtual), "vthread.x")
    thread = fuse_threads(sch, threads, [expr.axes[a].name for a in expr.spatial], gpu_plan(program, device).warp_lanes)
    sch.bind(thread, "threadIdx.x")
    register = [levels[k][2] for k in expr.reduce] + spatial_regs
    return _Nest(thread, tuple(steps), tuple(register))


def fuse_threads(sch, loops, names, lanes) -> object:
    """The block's thread loops (one per spatial axis, named `names`, outermost first) fused
    into the one loop bound to `threadIdx.x`. Where the plan lays a warp's lanes out as a box
    (`rtile.plan.warp_lanes`: `lanes` = ((axis, lanes along it), ..)), each of those loops is
    split into (warps, lanes) and the lanes' parts go innermost: thread t's warp, t / 32, is
    row-major over the warps' loops, its lane, t % 32, row-major over the box (the last axis
    fastest), as `rtile.banks.lane_coords` reads it. Unit-extent loops (a reduction to a
    scalar's) fuse as they are."""
    box = dict(lanes)
    if not box or len(loops) != len(names):
        return sch.fuse(*loops)
    outer, inner = [], []
    for loop, name in zip(loops, names):
        if box.get(name, 1) > 1:
            warps, lane = sch.split(loop, factors=[None, box[name]])
            outer.append(warps)
            inner.append(lane)
        else:
            outer.append(loop)
    sch.reorder(*outer, *inner)
    return sch.fuse(*outer, *inner)


def _static_extent(sch, loop) -> int | None:
    """A loop's extent when it is a constant, else None."""
    import tvm

    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def split_levels(sch, loops, expr: TensorExpr, program: RProgram, vthreads: Mapping[str, int],
                 keep: int | None = None) -> list:
    """Every axis's loop of `loops` split by its tile chain (`levels[axis][level]`, outermost
    first), a spatial axis with virtual threads as `_split_virtual` splits it; ScheduleError
    for virtual threads along an axis that is not spatial. Axis `keep` is left to the caller
    (None in its place: split-K splits its reduce axis into parts first, `cuda_splitk._tile`)."""
    unknown = set(vthreads) - {expr.axes[a].name for a in expr.spatial}
    if unknown:
        raise ScheduleError(f"vthread axis {min(unknown)} is not a spatial axis")
    levels = []
    for a, (axis, loop) in enumerate(zip(expr.axes, loops)):
        chain = axis_chain(program, a)
        count = vthreads.get(axis.name, 1)
        if a == keep:
            levels.append(None)
        elif count > 1:
            levels.append(_split_virtual(sch, loop, chain, count, axis.name))
        else:
            levels.append(split_by_chain(sch, loop, axis.extent, chain))
    return levels


def _split_virtual(sch, loop, chain, count: int, axis: str) -> list:
    """Split a spatial axis as (grid, vthreads, threads, register tile / vthreads): the same
    threads and registers as the plain split, but a thread's tile is strided over the block in
    `count` pieces (TVM lowers the `vthread` loop by replicating the body)."""
    register, block = int(chain[0]), int(chain[1])
    if register % count:
        raise ScheduleError(f"axis {axis}: {count} virtual threads do not divide its register tile {register}")
    return list(sch.split(loop, factors=[None, count, block // register, register // count]))


def _stage_in_shared(sch, main, buffer: str, tensor: int, expr, program, device, nest: _Nest):
    """Copy one input's block tile into shared memory at the innermost shared-step loop, all
    threads of the block together, rows padded against bank conflicts (Roller §3.1). Returns
    the copy block."""
    threads = block_threads(expr, program, device)
    anchor = _copy_loop(expr, program, device, nest)
    cache = sch.cache_read(main, buffer, "shared")
    sch.compute_at(cache, anchor)
    copy = sch.get_loops(cache)[_depth(sch, main, anchor) :]
    if not copy:  # a one-element tile (C[q], q of extent 1): compute_at left no loop to split
        copy = [sch.add_unit_loop(cache)]
    source = _template_shape(sch.get(cache).reads[0].source.shape, expr.tensors[tensor].shape)
    align = _bank_alignment(expr, program, device, tensor, source)
    if align is not None:
        sch.storage_align(cache, 0, len(source) - 2, *align)
    plain = buffer == expr.tensors[tensor].name  # not a padded copy made by a producer block
    width = _vector_width(expr, program, tensor, source, int(sch.get(copy[-1]).extent), align) if plain else 1
    fused = sch.fuse(*copy)
    if width > 1:
        _, thread, lanes = sch.split(fused, factors=[None, threads, width])
        sch.vectorize(lanes)
    else:
        _, thread = sch.split(fused, factors=[None, threads])
    sch.bind(thread, "threadIdx.x")
    if gpu_plan(program, device).register_prefetch:
        prefetch_in_registers(sch, cache)
    return cache


def _copy_loop(expr: TensorExpr, program: RProgram, device: DeviceSpec, nest: _Nest):
    """The shared-step loop the copies go to: the innermost, or in a pipelined program the
    loop `rtile.staging.pipelined_axis` names (the step loops inside it run once, so the same
    tiles are copied, and the copies become statements of the loop that is pipelined)."""
    plan = gpu_plan(program, device)
    if not plan.pipelined or len(nest.reduce_steps) != len(expr.reduce):
        return nest.reduce_steps[-1]
    return nest.reduce_steps[expr.reduce.index(plan.pipelined_axis)]


def _stage_fragment(sch, main, copy, nest: _Nest) -> None:
    """Register staging: at every register step each thread copies the fragment of a staged
    input that its register tile reads (its rows of A, its columns of B for a matmul) from the
    shared copy `copy` into a `local` array, unrolled so that its indices are constants and
    nvcc keeps it in registers; the register tile's multiply-adds then read registers, each
    fragment element loaded from shared memory once per step instead of once per use. Not for
    an input indexed by a fused axis (the caller's check): a thread's tile along it may cross
    rows of the buffer, whose box then has no constant extent to unroll (issue 12)."""
    step = sch.get_loops(main)[_depth(sch, main, nest.register[0]) - 2]  # the register step above the tile
    fragment = sch.cache_read(main, str(sch.get(copy).writes[0].source.name), "local")
    sch.compute_at(fragment, step)
    _unroll_below(sch, fragment, step)


def prefetch_in_registers(sch, copy) -> None:
    """Register prefetch (`rtile.staging.register_prefetch`, sm_70): the shared copy `copy`
    goes through a `local` array, each thread loading its elements from global memory into
    registers, then storing them into shared memory, two statements that the pipeline places
    apart (`pipeline_shared_copies`); its shared buffer is doubled though the store of step
    s + 1 follows the compute of step s (TVM's `tirx.manifest_shared_memory_local_stage` and
    `double_buffer_scope`, as TVM's own dlight matmul schedule uses them)."""
    sch.annotate(copy, LOCAL_STAGE, 1)
    sch.annotate(copy, "double_buffer_scope", 0)


def pipeline_shared_copies(sch, steps, copies: int, prefetch: bool = False) -> None:
    """Double-buffer the shared copies (`rtile.staging.pipelined` says which programs): the
    body of the shared-step loop `steps` is the copies, then the compute; the copies run one
    step ahead (stage 0) of the compute (stage 1), in program order. TVM's
    `InjectSoftwarePipeline` doubles each shared buffer and emits the prologue (the copies of
    step 0), the steady state (copies of step s + 1, compute of step s) and the epilogue (the
    compute of the last step). Stage 0 is asynchronous: compiled with `ASYNC_COPY_CONFIG`, its
    stores become `cp.async` (sm_80+), committed as one group a step; the compute of step s
    waits only for the group of step s (`cp.async.wait_group 1`), so the copy of step s + 1
    is in flight while it runs. Without `cp.async` the copy's loads would stall each thread
    before the barrier that precedes the compute, and nothing would overlap: with `prefetch`
    (sm_70, `prefetch_in_registers`) each copy is a load into registers (stage 0, before the
    compute) and a store into the other shared buffer (stage 0, ordered after the compute of
    step s), so the loads of step s + 1 are in flight while step s computes. TVM's ThreadSync
    puts a barrier before the compute and another before the stores (it cannot prove the two
    buffers apart), where the double buffers would need only the first."""
    if prefetch:
        sch.annotate(steps, "software_pipeline_stage", [0] * (2 * copies) + [1])
        sch.annotate(steps, "software_pipeline_order", [*_prefetch_order(copies), copies])
        return
    sch.annotate(steps, "software_pipeline_stage", [0] * copies + [1])
    sch.annotate(steps, "software_pipeline_order", list(range(copies + 1)))
    sch.annotate(steps, "software_pipeline_async_stages", [0])


def _prefetch_order(copies: int) -> list[int]:
    """Order of the (load, store) pairs of a register-prefetch step body in the pipeline: every
    load first (0 .. copies - 1), then the compute (`copies`), then the stores."""
    return [n for c in range(copies) for n in (c, copies + 1 + c)]


def _template_shape(shape, template: tuple) -> tuple:
    """A buffer's shape as integers: a symbolic extent (a Vortex kernel's T * tile, from
    `catalog.symbolic_func`) is read as the template expression's, whose integers every other
    decision of the schedule reads; -1 where there is none (a fused buffer's rank differs).
    A symbolic row stays safe to read in vectors: its axis is indexed plainly, so the copied row
    is its tile, and a vector width that divides the tile (`_vector_width`) divides T * tile."""
    import tvm

    def static(d: int, extent) -> int:
        if isinstance(extent, tvm.tirx.IntImm):
            return int(extent)
        return int(template[d]) if len(template) == len(shape) else -1

    return tuple(static(d, s) for d, s in enumerate(shape))


def _bank_alignment(expr: TensorExpr, program: RProgram, device: DeviceSpec, tensor: int, source: tuple):
    """`storage_align` (factor, offset) making the stored row `N + padding[1][t]` elements long
    modulo one bank row, as `rtile.rprogram.storage_padding` computed it; None when unpadded.

    Skipped for tensors whose dimensions axis fusion merged: their data-tile rows are not the
    buffer's rows."""
    access = expr.tensors[tensor]
    pad = program.padding[SHARED][tensor]
    if not pad or len(source) < 2 or tuple(access.shape) != source:
        return None
    layer = device.layers[SHARED]
    factor = layer.banks * max(1, layer.bank_width_bytes // access.itemsize)
    row = expr.data_tile_shape(tensor, program.tiles[SHARED])[-1]
    return factor, (row + pad) % factor


def _vector_width(expr: TensorExpr, program: RProgram, tensor: int, source: tuple, copy_row: int, align) -> int:
    """Widest vector (<= 16 B) whose loads and stores stay aligned: the global row length, every
    block tile's start along the row, the copied row and the shared row stride all divide by it."""
    access = expr.tensors[tensor]
    if tuple(access.shape) != source:
        return 1
    coeffs, const = access.index[-1]
    tile = program.tiles[SHARED]
    for width in VECTOR_WIDTHS:
        starts = const % width == 0 and all(c * t % width == 0 for c, t in zip(coeffs, tile) if c)
        stride = align is None or (align[0] % width == 0 and align[1] % width == 0)
        rows = source[-1] % width == 0 and copy_row % width == 0
        if starts and stride and rows and width * access.itemsize <= 16:
            return width
    return 1


def _tensor_of(sch, expr: TensorExpr, buffer: str, producers) -> int:
    """Index in `expr.tensors` of the input a main-block read comes from (through `pad`-like
    producer blocks, as `ops.tensor_expr` names them)."""
    blocks = [sch.get(sch.get_sblock(name)) for name in producers]
    written = {str(w.source.name): block for block in blocks for w in block.writes}
    name = buffer
    while name in written and len(written[name].reads) == 1:
        name = str(written[name].reads[0].source.name)
    for t, access in enumerate(expr.tensors):
        if access.role == "input" and access.name == name:
            return t
    raise ScheduleError(f"block {expr.main_block} reads {buffer}, which is no input of the expression")


def _depth(sch, block, loop) -> int:
    """Number of loops around `block` down to and including `loop`."""
    target = sch.get_sref(loop)
    for depth, candidate in enumerate(sch.get_loops(block), start=1):
        if sch.get_sref(candidate).same_as(target):
            return depth
    raise ScheduleError("internal: loop is not around the block")


def _unroll_below(sch, block, loop) -> None:
    """Unroll every loop between `loop` and `block`: local arrays indexed only by unrolled loops
    have constant indices, which nvcc keeps in registers."""
    for inner in sch.get_loops(block)[_depth(sch, block, loop) :]:
        sch.unroll(inner)
