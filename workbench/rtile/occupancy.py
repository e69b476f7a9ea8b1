"""Occupancy of a GPU unit (the CUDA occupancy calculator's terms): the threads, registers and
block-shared memory one block of an rProgram takes, and how many blocks a unit holds at once.
Read by the model (`rtile.model`) and by the pipelining rule (`rtile.staging.pipelined`), which
asks what a second buffer of the staged tiles costs; `buffers` is always the caller's: one, or
`staging.shared_buffers`. Pure: no TVM.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from workbench.hardware.spec import DeviceSpec
from workbench.rtile.registers import block_thread_count, resident_block_limit
from workbench.rtile.rprogram import RProgram, footprint_at, layer_footprint
from workbench.rtile.traffic import calculus

STAGES = 2  # copy of step s + 1, compute of step s: two buffers of every staged input
ASYNC_ARCH = 80  # cp.async: sm_80 (Ampere) and later


@lru_cache(maxsize=64)  # asked by every occupancy count of every program
def async_copies(device: DeviceSpec) -> bool:
    """Whether the device copies global to shared memory asynchronously: CUDA `cp.async`, which
    needs sm_80 or later (PTX ISA 7.0, `cp.async`: "Requires sm_80 or higher")."""
    target = device.target_dict()
    arch = str(target.get("arch", ""))
    digits = "".join(c for c in arch.removeprefix("sm_") if c.isdigit())
    return target.get("kind") == "cuda" and arch.startswith("sm_") and bool(digits) and int(digits) >= ASYNC_ARCH


def prefetch_registers(program: RProgram, device: DeviceSpec) -> int:
    """32-bit registers the register prefetch adds to a thread: its share of one step's staged
    input tiles (`layer_footprint` at the shared layer without bank padding, which is not
    loaded) over the block's threads, rounded up. Our count: the copies' split rounds each
    input's share up to whole vectors, at most a vector more per input."""
    unit = device.unit_layer_index
    tiles = layer_footprint(calculus(program.expr), device, unit, program.tiles[unit])
    threads = block_thread_count(program.expr, device, program.unit_tile, program.register_tile)
    return ceil(tiles / (threads * device.register_bytes))


# Registers nvcc gives a thread beyond its register tile (`registers_per_thread`): a 64-bit
# address per tensor (2 registers each) and FIXED_REGISTERS for thread and block indices, loop
# counters and predicates. Fitted by us to `ptxas -v` (nvcc 13, sm_80) over the top-3 programs
# (at 64e7fe8) of every roller-table1 and gensor-table4 workload on the A100, 82 kernels: the
# median of ptxas's count minus the estimate is 0, and 48 of them are within 25 % of ptxas;
# cross-thread reductions (their trees) are under-estimated by 2-3x, window-heavy depthwise
# register tiles over-estimated.
ADDRESS_REGISTERS_PER_TENSOR = 2
FIXED_REGISTERS = 7


def registers_per_thread(program: RProgram, device: DeviceSpec, buffers: int) -> int:
    """32-bit registers one GPU thread needs: its register tile (the output's accumulators and
    the input fragments one reduce step holds, `footprint_at` the top layer: a warp's share of a
    tensor-core fragment tile) plus addressing (`ADDRESS_REGISTERS_PER_TENSOR` x tensors +
    `FIXED_REGISTERS`), plus `prefetch_registers` where the staged tiles are double buffered
    (`buffers` >= `STAGES`) without `cp.async` (sm_70: the next step's tiles pass through the
    thread's registers, `staging.register_prefetch`)."""
    tile = ceil(footprint_at(device, program, 0) / device.register_bytes)
    base = tile + ADDRESS_REGISTERS_PER_TENSOR * len(program.expr.tensors) + FIXED_REGISTERS
    if async_copies(device) or buffers < STAGES:
        return base
    return base + prefetch_registers(program, device)


def block_shared_bytes(program: RProgram, device: DeviceSpec, buffers: int) -> int:
    """Block-shared memory one GPU block allocates: the padded data tiles it stages at the unit
    layer (`footprint_at`, bank padding included) in `buffers` copies
    (`staging.shared_buffers`: two where the templates pipeline the program), 0 for a program
    that stages nothing."""
    unit = device.unit_layer_index
    if not program.cached[unit]:
        return 0
    return buffers * footprint_at(device, program, unit)


def occupancy_limits(program: RProgram, device: DeviceSpec, buffers: int) -> dict[str, int]:
    """Blocks of `program` one GPU unit can hold by each of its resources (the CUDA occupancy
    calculator's terms): resident threads, registers, block-shared memory (only where the block
    stages any) and the unit's block limit (`resident_block_limit`, where the spec states one).
    Threads and registers are taken by whole warps (a partial warp occupies a warp's slots);
    registers are `registers_per_thread` against `registers_per_unit`, without the allocator's
    granularity (256 registers a warp on NVIDIA: our simplification); shared memory is
    `block_shared_bytes` against the unit's (`DeviceSpec.unit_shared_bytes`), without the 1 KB
    a block reserves for the system on compute capability 8.0 and later (also ours)."""
    threads = block_thread_count(program.expr, device, program.unit_tile, program.register_tile)
    lanes = ceil(threads / device.warp_size) * device.warp_size
    limits = {
        "threads": device.max_threads_per_unit // lanes,
        "registers": device.registers_per_unit // (lanes * registers_per_thread(program, device, buffers)),
    }
    shared = block_shared_bytes(program, device, buffers)
    if shared:
        limits["shared"] = device.unit_shared_bytes // shared
    if resident_block_limit(device):
        limits["blocks"] = resident_block_limit(device)
    return limits


# Memoised: the pricing of one program asks for it at every stage it prices, and the pipelining
# rule with one and two buffers.
@lru_cache(maxsize=65536)
def blocks_per_unit(program: RProgram, device: DeviceSpec, buffers: int) -> tuple[int, int]:
    """(threads per block, blocks resident per unit) on a GPU: the fewest that any of the
    unit's resources allows (`occupancy_limits`, the staged tiles in `buffers` copies:
    `staging.shared_buffers`, two where the templates pipeline the program), at least one.
    (A CPU core runs one work item at a time: the model counts one thread, one block.)"""
    threads = block_thread_count(program.expr, device, program.unit_tile, program.register_tile)
    return threads, max(1, min(occupancy_limits(program, device, buffers).values()))


def resident_blocks(program: RProgram, device: DeviceSpec, bpu: int) -> int:
    """Blocks a busy GPU unit holds at once: `bpu`, or fewer where the grid does not give every
    unit that many (tiles dealt round-robin: at most ceil(grid / units) a unit)."""
    return max(1, min(bpu, ceil(program.grid / device.compute_units)))


def warps_per_scheduler(program: RProgram, device: DeviceSpec, threads: int, bpu: int) -> float:
    """Resident warps per warp scheduler of a busy unit (`resident_blocks` blocks of `threads`):
    a grid smaller than the units' room for blocks leaves fewer resident than `bpu`."""
    warps = ceil(threads / device.warp_size) * resident_blocks(program, device, bpu)
    return warps / device.teu_per_unit
