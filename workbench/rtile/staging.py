"""Which GPU programs the CUDA templates software-pipeline: one rule, read by the templates
(`codegen.cuda`, `codegen.cuda_mma`, `codegen.cuda_conv`), which annotate the loop, and by the model
(`rtile.model.gpu.gpu_stages`), which overlaps the stages, and by its occupancy
(`rtile.occupancy`), which counts the shared buffers accordingly. Pure: no TVM.

A pipelined program double-buffers its shared-memory tiles: the block copies the inputs' tiles
of shared step s + 1 into one pair of buffers while it computes step s from the other (TVM's
`InjectSoftwarePipeline`: a prologue copies step 0, the steady state runs copy(s + 1) with
compute(s), an epilogue computes the last step). The copies are `cp.async`, so a thread's
compute of step s runs while its copy of step s + 1 is in flight. Without `cp.async` (sm_70)
the copy goes through registers (`register_prefetch`): a thread loads its share of step s + 1's
tiles from global memory into `local` arrays, computes step s from one shared buffer, then
stores the registers into the other, so its global loads are in flight during the compute.
"""

from __future__ import annotations

from math import ceil

from workbench.hardware.spec import DeviceSpec
from workbench.rtile.axes import cross_thread_axis, mma_axes
from workbench.rtile.occupancy import STAGES, async_copies, blocks_per_unit, resident_blocks
from workbench.rtile.rprogram import RProgram, footprint_at

def pipelined_axis(program: RProgram, device: DeviceSpec) -> int | None:
    """The reduce axis whose shared-step loop the templates pipeline: the innermost (the last of
    `expr.reduce`, as the templates order the step loops) with more than one step, None where
    every one has a single step. The step loops inside it run once, so copying the tiles at it
    copies what the innermost step loop would (a direct conv's filter window, 3 x 3 in one
    step, pipelines over its input channels)."""
    expr, unit = program.expr, device.unit_layer_index
    steps = [k for k in expr.reduce if ceil(expr.axes[k].extent / program.tiles[unit][k]) > 1]
    return steps[-1] if steps else None


def shared_steps(program: RProgram, device: DeviceSpec) -> int:
    """Trip count of the loop the templates pipeline (`pipelined_axis`): its axis's extent over
    its shared tile, rounded up (a ragged last step is a guarded or zero-padded whole step); 1
    where there is none."""
    axis = pipelined_axis(program, device)
    if axis is None:
        return 1
    return ceil(program.expr.axes[axis].extent / program.tiles[device.unit_layer_index][axis])


def cuda_target(device: DeviceSpec) -> bool:
    """Whether the device's TVM target is CUDA (the templates' software pipeline is CUDA's)."""
    return device.target_dict().get("kind") == "cuda"


def register_prefetch(program: RProgram, device: DeviceSpec) -> bool:
    """Whether the templates pipeline `program` through registers: pipelined on a device without
    `cp.async` (sm_70)."""
    return not async_copies(device) and pipelined(program, device)


def shared_limit(device: DeviceSpec) -> int:
    """Shared bytes one block may allocate: the TVM target's per-block limit where it states one,
    else the shared layer's capacity (as `codegen.cuda.within_block_limits` checks)."""
    capacity = device.layers[device.unit_layer_index].capacity_bytes
    return int(device.target_dict().get("max_shared_memory_per_block", capacity))


def pipelined(program: RProgram, device: DeviceSpec) -> bool:
    """Whether the CUDA templates double-buffer `program`'s shared tiles: a two-layer GPU program
    with reduce axes that stages its inputs in shared memory, is not a cross-thread reduction
    (its threads split the reduce axis; `cross_thread_axis`), runs on a CUDA target
    (copying with `cp.async` on sm_80+, through registers before: `register_prefetch`; a
    synchronous copy of step s + 1 before the compute of step s would stall each thread on its
    loads, and the doubled buffers would only cost occupancy), has a shared-step loop that runs at least
    twice (`shared_steps`; a single step has nothing to overlap), whose doubled input tiles
    (`footprint_at` the shared layer, bank padding included) fit one block's shared memory,
    and for which they cost no resident blocks (`occupancy.resident_blocks`, with one buffer and
    with two, the latter with the prefetch registers where there is no `cp.async`:
    `occupancy.registers_per_thread`; a tensor-core program, or one with fused axes, pipelines
    on sm_80+ only): with as many blocks resident the pipelined time max(inner, global) is never
    above the unpipelined one (`model.gpu.gpu_stages`), where fewer blocks would cost latency
    hiding and bytes in flight that the model prices (a matmul's or a conv's top 1 on the
    H100 predicted up to 1.5x slower when doubled tiles halved its blocks)."""
    expr = program.expr
    if not device.lanes_are_threads or not expr.reduce or len(program.tiles) != 2:
        return False
    unit = device.unit_layer_index
    if not program.cached[unit] or cross_thread_axis(expr, device) is not None:
        return False
    if not cuda_target(device) or shared_steps(program, device) < STAGES:
        return False
    if not async_copies(device) and (mma_axes(expr, device) is not None or _boxed_copy(expr)):
        return False  # the WMMA template (`codegen.cuda_mma`) has no register prefetch
    if STAGES * footprint_at(device, program, unit) > shared_limit(device):
        return False
    resident = [resident_blocks(program, device, blocks_per_unit(program, device, n)[1]) for n in (1, STAGES)]
    return resident[1] == resident[0]


def _boxed_copy(expr) -> bool:
    """Whether the CUDA-core template copies a fused axis's tile as a box of whole rows (issue
    12): larger than `footprint_at` counts, so two of them can overflow a block that the rule
    admits. The implicit-GEMM conv (`ops.gemm_view`) copies its own tiles exactly."""
    from workbench.ops.gemm_view import view_of

    return any(a.fused_from for a in expr.axes) and view_of(expr) is None


def shared_buffers(program: RProgram, device: DeviceSpec) -> int:
    """Copies of each staged input tile a block holds in shared memory: `STAGES` when
    pipelined, else 1."""
    return STAGES if pipelined(program, device) else 1
