"""A GPU program's pricing: its compute at the warps per scheduler its occupancy leaves, its
loads (uncoalesced sectors, `uncoalesced_bytes`; the bandwidth its bytes in flight reach,
`reachable_gbps`; the bank conflicts its virtual threads change, `vthread_conflict_ratio`),
how the stages overlap (`gpu_stages`), a cross-thread reduction's trees and split-K's second
pass; `price` assembles them."""

from __future__ import annotations

from functools import lru_cache
from math import ceil, log2, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import cross_thread_axis, leading_axis
from workbench.rtile.banks import ThreadBinding, lane_coords, requests, stored_tile, wavefronts
from workbench.rtile.model.common import (
    GB, Pricing, layer_gbps, partial_sum_bytes, peak_gflops, provenance, source_layer,
)
from workbench.rtile.occupancy import blocks_per_unit, resident_blocks, warps_per_scheduler
from workbench.rtile.panels import any_ragged
from workbench.rtile.plan import VECTOR_RUN, gpu_plan
from workbench.rtile.rprogram import RProgram, storage_padding, waves
from workbench.rtile.traffic import calculus


def price(program: RProgram, device: DeviceSpec, padded_flops: int, busy: float) -> Pricing:
    """A GPU program's `Pricing` (Roller §3.3): compute at the fraction of peak its resident
    warps keep (one per scheduler) and their lanes fill (`lane_fraction`), per staged layer
    Q(tile) plus the wasted sectors of unstaged loads at the source's bandwidth (`transfer_seconds`), stages overlapped by `gpu_stages`,
    the compute slowed where the block tile leaves a guarded tail (`guarded_slowdown`); a
    cross-thread reduction's trees and a split-K program's second pass added after the
    scale-out."""
    expr = program.expr
    calc = calculus(expr)
    threads, bpu = blocks_per_unit(program, device, gpu_plan(program, device).stages)
    n_waves = waves(program.grid, device.compute_units * bpu)
    eff = min(1.0, warps_per_scheduler(program, device, threads, bpu)) * lane_fraction(device, threads)
    compute = padded_flops / (peak_gflops(expr, device) * GB * busy * eff) * guarded_slowdown(program, device)
    loads: dict[str, float] = {}
    moved: dict[str, int] = {}
    for layer, tile in enumerate(program.tiles):
        if not program.cached[layer]:
            continue
        src = device.layers[source_layer(program, layer, len(device.layers))]
        q = calc.traffic_bytes(tile) + (uncoalesced_bytes(program, device) if layer == 0 else 0)
        moved[src.name] = moved.get(src.name, 0) + q
        loads[src.name] = loads.get(src.name, 0.0) + transfer_seconds(program, device, layer, q) / busy
    stages = {"compute": compute, **loads}
    bottleneck = max(stages, key=stages.get)
    core = gpu_stages(program, device, compute, loads)
    tree = tree_reduction_seconds(program, device, threads, n_waves)
    return Pricing(
        compute=compute, moved=tuple(moved.items()), loads=tuple(loads.items()), bottleneck=bottleneck, core=core,
        after=(tree, split_k_seconds(program, device)), threads=threads, blocks_per_unit=bpu,
        occupancy=min(1.0, threads * bpu / device.max_threads_per_unit), reduction_seconds=tree,
        **provenance(program, device, (False, "compute: warps per scheduler"), False),
    )


# A GPU program's compute where its block tile does not divide an axis: TVM's predicated split
# leaves the tail's test on every accumulator update of the register tile (the CUDA source of
# roller-table1 M2's 96 x 256 x 8 blocks: 221 tests, the 64-row blocks' 1), in every block, not
# only the tail's. On the H200 (the committed runs, 2026-12-01) such programs ran 1.47-1.71x
# their dividing neighbours along M or N, 1.23x along K, where the model priced them alike;
# the middle of that range (docs/model-evidence.md#gpu-guarded-tiles).
GUARDED_SLOWDOWN = 1.5


def guarded_slowdown(program: RProgram, device: DeviceSpec) -> float:
    """`GUARDED_SLOWDOWN` for a contraction's register tiles (a reduction over two or more
    inputs: matmul, convolution; not a cross-thread reduction) where the unit (block) tile leaves
    a tail along some axis, else 1."""
    expr = program.expr
    if not expr.reduce or len(expr.inputs) < 2 or gpu_plan(program, device).cross_thread_axis is not None:
        return 1.0
    return GUARDED_SLOWDOWN if any_ragged(expr, program) else 1.0


def lane_fraction(device: DeviceSpec, threads: int) -> float:
    """Fraction of its warps' lanes a block of `threads` threads fills: a partial warp issues
    as a whole one (SIMT), so a block of 4 threads computes at 4/32 of a warp's peak. 1 on a
    CPU (one thread a block in the model); tensor-core blocks count whole warps."""
    if not device.lanes_are_threads or threads <= 0:
        return 1.0
    return threads / (ceil(threads / device.warp_size) * device.warp_size)


def transfer_seconds(program: RProgram, device: DeviceSpec, layer: int, q: int) -> float:
    """Time to move `q` bytes for a GPU program's tiles at `layer` from the layer below with every
    unit busy: register tiles read from shared memory take the wavefronts their virtual threads
    add or save (`vthread_conflict_ratio`), and loads from global memory reach only
    `reachable_gbps` (`hbm_share` of them from the HBM); their output stores (Q's `stores`
    part) are posted, no register waits for them, so they stream at the spec's bandwidth, with
    the sectors a strided write-back wastes (`store_sector_ratio`)."""
    src = source_layer(program, layer, len(device.layers))
    bandwidth = layer_gbps(program, device, src) * GB
    if layer == 0 and src == device.unit_layer_index:
        return q * vthread_conflict_ratio(program, device) / bandwidth
    calc = calculus(program.expr)
    tile, output = program.tiles[layer], program.expr.tensors[-1]
    stores = calc.spatial_tiles(tile) * prod(calc.data_tiles(tile)[-1]) * output.itemsize
    bottom = src == len(device.layers) - 1  # global memory: Little's law and the stores' sectors
    reach = reachable_gbps(program, device, src, hbm_share(program, q - stores) if bottom else 1.0) * GB
    wasted = stores * (store_sector_ratio(program, device) - 1) if bottom else 0
    if reach >= bandwidth:
        return (q + wasted) / bandwidth
    return (q - stores) / reach + (stores + wasted) / bandwidth


def store_sector_ratio(program: RProgram, device: DeviceSpec) -> float:
    """Sectors a warp's store of one register-tile element touches over the fewest its bytes
    need (`warp_sectors` of the output at one element: the template writes the register tile
    back one element at a time, the warp's lanes over the block's threads, the last spatial
    axis fastest, neighbouring threads of an axis its tile over its virtual threads apart;
    `plan.store_vthreads` interleaves the contiguous axis's tile: 1; a warp laid out in rows
    of 8 lanes storing runs of 4 in 16-byte vectors, `plan.warp_lanes`: 1). 8 x 8 register tiles
    without it: 32 sectors for 128 B (8), as the H200 wrote a 64K x 1024 output at 470 GB/s of
    4.25 TB/s; lanes that run along no contiguous axis at all (a depthwise convolution's
    threads over batch and channels, a thread per output row) each take a sector of their own.
    1 on CPUs, for tensor-core fragments and cross-thread reductions (one output a block)."""
    expr, plan = program.expr, gpu_plan(program, device)
    if not device.lanes_are_threads or plan.mma_axes is not None or plan.cross_thread_axis is not None:
        return 1.0
    run = VECTOR_RUN if plan.vector_stores else 1
    touched, needed = output_sectors(expr, device, program.unit_tile, program.register_tile, plan.vthreads,
                                     plan.warp_lanes, run)
    return touched / needed


@lru_cache(maxsize=65536)
def output_sectors(expr: TensorExpr, device: DeviceSpec, block, reg, vthreads=(), warp=(),
                   run: int = 1) -> tuple[int, int]:
    """(sectors, needed) of the first warp's store of one element of its threads' register
    tiles of the output (each thread's first; its first `run` along the output's contiguous
    axis where the template stores them as one vector), lanes bound as `warp_sectors` binds
    them (in the box `warp` where the plan lays the warp out so)."""
    starts = _lane_starts(expr, device, block, reg, vthreads, None, warp)
    out, sector = expr.output, device.layers[-1].transaction_bytes
    weights = _weights(out, len(expr.axes))
    # a run lies along the output's contiguous axis: its e-th element is e elements on
    addresses = {(sum(c * w for c, w in zip(start, weights)) + e) * out.itemsize
                 for start in starts for e in range(run)}
    return len({a // sector for a in addresses}), ceil(len(addresses) * out.itemsize / sector)


def _weights(tensor, n_axes: int) -> list[int]:
    """Per axis, the elements one step along it moves in the row-major `tensor`: its
    coefficient times the dimension's stride, summed over dimensions (the index is affine)."""
    return [sum(coeffs[a] * stride for (coeffs, _), stride in zip(tensor.index, tensor.strides)) for a in range(n_axes)]


def _lane_layout(expr: TensorExpr, block, reg, vthreads, across) -> tuple[dict[int, int], dict[int, int]]:
    """(threads per axis, a thread's step along it) as the CUDA template binds them: along a
    cross-thread reduction's axis `across` thread t at t; else threads over the block's spatial
    axes, thread t of an axis at t x (register tile / its virtual threads)."""
    split = dict(vthreads)
    if across is not None:
        return {across: ceil(block[across] / reg[across])}, {across: 1}
    return ({a: ceil(block[a] / reg[a]) for a in expr.spatial},
            {a: max(1, reg[a] // split.get(expr.axes[a].name, 1)) for a in expr.spatial})


def _lane_starts(expr: TensorExpr, device: DeviceSpec, block, reg, vthreads, across,
                 warp=()) -> list[list[int]]:
    """The first warp's lanes as coordinates of their register tiles' first elements, laid out
    by `_lane_layout`, the last axis fastest (`banks.lane_coords`; in the box `warp`, ((axis
    name, lanes), ..), where the plan lays the warp out so: `plan.warp_lanes`)."""
    counts, steps = _lane_layout(expr, block, reg, vthreads, across)
    axes, box = list(counts), dict(warp)
    lanes = tuple(box.get(expr.axes[a].name, 1) for a in axes) if box else ()
    starts = []
    for coord in lane_coords(tuple(counts[a] for a in axes), device.warp_size, lanes):
        start = [0] * len(expr.axes)
        for a, c in zip(axes, coord):
            start[a] = c * steps[a]
        starts.append(start)
    return starts


def overlapped(a: float, b: float, agents: float) -> float:
    """Time of two stages of a unit's work (`a`, `b`: each at the unit's full throughput) that
    each of `agents` independent agents (blocks or warps, sharing the unit's pipes) runs one
    after the other: no faster than either pipe, max(a, b), and no faster than one agent's own
    chain over its share, (a + b) / agents. One agent serialises them (a + b); two or more
    with balanced stages hide the shorter one entirely, as while one agent loads another
    computes. The bound form of the MWP/CWP argument (Hong & Kim, ISCA 2009: the memory
    waiting periods of one warp are hidden by the compute periods of the others); our
    simplification: stages evenly divided between agents, no latency (`reachable_gbps`)."""
    return max(a, b, (a + b) / max(1.0, agents))


def gpu_stages(program: RProgram, device: DeviceSpec, compute: float, loads: dict[str, float]) -> float:
    """One GPU unit's time from its stage times, as far as the CUDA templates (codegen/cuda.py,
    cuda_mma.py) overlap them. Inside a step, a warp's register-tile reads from shared memory
    feed its own FMAs (no barrier between warps), so the other warps of its scheduler hide them
    (`overlapped` over `warps_per_scheduler`). A pipelined program (`staging.pipelined`)
    copies step s + 1 from global memory while it computes step s (`cp.async` on sm_80+; on
    sm_70 a register prefetch whose loads are issued before the compute and stored to shared
    memory after it), so a block's step takes the longer of the two: max(inner, global) (the
    prologue's copy and the epilogue's compute, one step each, are not counted; nor the sm_70
    prefetch's store after the compute, nor that a copy TVM cannot issue as cp.async, a WMMA
    program's transposing or zero-filling one, stays a synchronous store in the pipeline). An
    unpipelined one copies a shared
    step's tiles, waits at __syncthreads, computes on them, waits again, so within a block the
    copy and the compute serialise and only the other resident blocks of the unit overlap them
    (`overlapped` over `resident_blocks`). A program that stages nothing reads global memory
    straight into the registers of its FMAs: the warps per scheduler overlap those loads.
    Cross-thread reductions follow the unpipelined structure."""
    threads, bpu = blocks_per_unit(program, device, gpu_plan(program, device).stages)
    warps = warps_per_scheduler(program, device, threads, bpu)
    unit = device.unit_layer_index
    bottom = device.layers[-1].name
    global_load = loads.get(bottom, 0.0)
    if not program.cached[unit]:
        return overlapped(compute, global_load, warps)
    shared_load = loads.get(device.layers[unit].name, 0.0)
    inner = overlapped(compute, shared_load, warps)
    if gpu_plan(program, device).pipelined:
        return max(inner, global_load)
    return overlapped(inner, global_load, resident_blocks(program, device, bpu))


# Bytes of global loads one GPU thread keeps outstanding at most: our fit to the first H200 run
# (docs/gpu.md), where blocks of 1, 4 and 5 threads copying 80-136 KB into shared memory
# reached 0.12, 0.92 and 0.6 GB/s: 90-160 B a thread over the spec's 500 ns latency (fitted
# before `reachable_gbps` priced the latency loads see under load: LOADED_LATENCY).
THREAD_BYTES_IN_FLIGHT = 128

# The latency a GPU's global loads wait under a kernel's load, over the spec's (an idle latency):
# Little's law holds at the latency the requests see, which queues above the idle one as the
# bandwidth fills. Our fit to the H200's relus (roller-table1 E0-E2, five runs of the pack on
# 2026-11-28 and 2026-12-01, agreeing at 0.78-1.0): in register tiles of 2 floats (8 B a thread
# in flight, 2,048 threads an SM: 132 x 16 KiB over 500 ns, the 4,250 GB/s just reached) they ran
# 1.08-1.15x the tiles of 4, which 1.22-1.24x the spec's latency prices (evidence:
# docs/model-evidence.md#loaded-latency).
LOADED_LATENCY = 1.25

# The latency of a global load that hits the GPU's L2, over the spec's global-memory latency:
# published microbenchmarks put an H100's L2 hit near 200 cycles against some 600 for its HBM.
# `bench model` over the five H200 runs reads the same from 0.25 to 1.0, lower at 0.1
# (evidence: docs/model-evidence.md#loaded-latency).
L2_HIT_LATENCY = 1 / 3


def hbm_share(program: RProgram, loads: int) -> float:
    """The share of a GPU program's `loads` bytes from global memory that come from the HBM: its
    inputs' bytes once (their compulsory misses) over the bytes it loads, at most 1. Our
    simplification: every read of an input element after its first hits the L2 (a pooling's
    overlapping windows, a tile's neighbours' halo, a matmul's panels read again by the next
    blocks), whatever the L2's size."""
    unique = sum(t.nbytes for t in program.expr.inputs)
    return min(1.0, unique / loads) if loads > 0 else 1.0


def bytes_in_flight(program: RProgram, device: DeviceSpec, bpu: int) -> int:
    """Bytes of global-memory loads a busy GPU unit has outstanding at once: each resident block
    (`resident_blocks`) issues the loads of one step of its block tile, its inputs' data tiles
    (a staged copy of a shared step, or the register tiles its threads read), before the first
    returns: the copy loop and the register tile have constant trip counts, the register tile
    is unrolled by the template and nvcc unrolls small loops with a known trip count by default
    (CUDA C++ Programming Guide, `#pragma unroll`), and no load depends on another; but no more
    than `THREAD_BYTES_IN_FLIGHT` a thread (a block of a few threads copies its step in many
    rounds). Our simplification: the unit's miss-handling resources do not cap it."""
    calc = calculus(program.expr)
    shapes = calc.data_tiles(program.unit_tile)
    block = sum(prod(shape) * t.itemsize for shape, t in zip(shapes, program.expr.tensors) if t.role == "input")
    threads = blocks_per_unit(program, device, gpu_plan(program, device).stages)[0]
    return resident_blocks(program, device, bpu) * min(block, threads * THREAD_BYTES_IN_FLIGHT)


def reachable_gbps(program: RProgram, device: DeviceSpec, layer: int, share: float = 1.0) -> float:
    """Bandwidth a program reaches reading from `layer`: `layer_gbps`, except from a GPU's global
    memory, where Little's law bounds it by the bytes in flight over the memory latency
    (throughput = concurrency / latency): units x `bytes_in_flight` / latency, the latency
    `latency_ns` x (`share` x `LOADED_LATENCY` + (1 - share) x `L2_HIT_LATENCY`) where `share` of
    the loads go to the HBM (`hbm_share`) and the rest hit the L2. The V100 (750 GB/s, 400 ns
    idle, 500 loaded) needs 375 KB of loads from its HBM in flight, 4.7 KB an SM, to reach its
    bandwidth: 37 warps each with one 128 B load outstanding. Few small blocks cannot."""
    spec = device.layers[layer]
    if not device.lanes_are_threads or layer != len(device.layers) - 1 or spec.latency_ns <= 0:
        return layer_gbps(program, device, layer)
    _, bpu = blocks_per_unit(program, device, gpu_plan(program, device).stages)
    latency = spec.latency_ns * (share * LOADED_LATENCY + (1 - share) * L2_HIT_LATENCY)
    little = device.compute_units * bytes_in_flight(program, device, bpu) / latency  # B/ns = GB/s
    return min(spec.bandwidth_gbps, little)


def vthread_conflict_ratio(program: RProgram, device: DeviceSpec) -> float:
    """Factor by which a GPU program's virtual threads change the time of its register-tile
    reads from shared memory: the first warp's wavefronts with them over those without
    (`shared_wavefronts`, counted exactly for scalar loads). Only the change is priced: the
    absolute degree of scalar loads is not what the template's register reads cost (nvcc
    merges a thread's consecutive elements into 64- and 128-bit loads, served per half or
    quarter warp), and charging it moved roller-table1 M1's top 1 to a padded tile (7fdc68d);
    what a strided split does to the bank pattern, it does to both. 1 without virtual threads,
    on CPUs, where the register tile is not read from banked shared memory (nothing staged,
    tensor-core fragments, cross-thread reductions) and for operators without a reduce axis."""
    expr = program.expr
    if not gpu_plan(program, device).vthreads or not device.lanes_are_threads or not expr.reduce:
        return 1.0
    unit, plan = device.unit_layer_index, gpu_plan(program, device)
    if (
        not plan.staged or device.layers[unit].banks <= 0
        or plan.mma_axes is not None or plan.cross_thread_axis is not None
    ):
        return 1.0
    split = dict(gpu_plan(program, device).vthreads)
    vthreads = tuple(split.get(axis.name, 1) for axis in expr.axes)
    block, reg = program.unit_tile, program.register_tile
    layout = (plan.warp_lanes, plan.kmajor)
    with_split = shared_wavefronts(expr, device, block, reg, vthreads, *layout)[0]
    without = shared_wavefronts(expr, device, block, reg, tuple(1 for _ in expr.axes), *layout)[0]
    return with_split / without if without else 1.0


def tree_reduction_seconds(program: RProgram, device: DeviceSpec, threads: int, n_waves: int) -> float:
    """Time a cross-thread reduction (`axes.cross_thread_axis`) spends combining its
    threads' partial sums, after its loads: each block sums its `threads` partial sums in a tree
    of ceil(log2(threads)) steps per output point of its tile (they are reduced one after
    another), each step one exchange through the warp shuffle or shared-memory network, priced
    at the shared layer's latency (a shuffle's latency is of that order on Volta: Jia et al.
    2018). The blocks resident on a unit reduce at the same time, so a unit pays it once per
    wave. 0 for every other program."""
    if gpu_plan(program, device).cross_thread_axis is None or threads <= 1:
        return 0.0
    outputs = prod(program.unit_tile[a] for a in program.expr.spatial)
    steps = ceil(log2(threads))
    return n_waves * outputs * steps * device.layers[device.unit_layer_index].latency_ns * 1e-9


def split_k_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a split-K program (`RProgram.split` = S > 1) adds to its first pass: that pass's
    grid already counts its S blocks per unit tile (`RProgram.grid`), each walking 1/S of the
    reduce axis, so its loads and compute are the unsplit program's spread over more units;
    beyond them, its blocks store partial sums that a second kernel adds (`partial_sum_bytes`).
    Priced at the bottom layer's bandwidth (both passes stream: consecutive threads,
    consecutive outputs), plus the second kernel's launch (`DeviceSpec.launch_seconds`) and
    one memory latency before its first loads return (it has nothing to overlap them with).
    0 for unsplit programs."""
    moved = partial_sum_bytes(program)
    if not moved:
        return 0.0
    bottom = device.layers[-1]
    return device.launch_seconds + bottom.latency_ns * 1e-9 + moved / (bottom.bandwidth_gbps * GB)


@lru_cache(maxsize=65536)
def warp_sectors(expr: TensorExpr, device: DeviceSpec, block, reg, vthreads=()) -> tuple[tuple[int, int], ...]:
    """Per input, (sectors, needed): the memory transactions (`transaction_bytes` of the bottom
    layer: 32 B sectors on NVIDIA) that the first warp touches reading its register tiles of the
    input straight from global memory, and the fewest that the distinct bytes it reads could
    take. Counted from the byte addresses in the row-major tensor.

    Lanes follow the CUDA template's binding: along a cross-thread reduction's axis thread t of
    T reads elements t, t + T, .. (`cross_thread_axis`); else threads run over the block's
    spatial axes, the last fastest, thread t of an axis at t x (register tile / its virtual
    threads). A sector that several loads of one register tile touch is counted once (our
    reading of DRAM transactions: the L1 keeps a warp's sectors for the few loads of its
    tile). R1's rows with a thread per row and 2 elements a thread touch 32 sectors for 256
    useful bytes (needed: 8); rows of 8 with 8 elements a thread use every sector they touch."""
    across = cross_thread_axis(expr, device)
    counts, steps = _lane_layout(expr, block, reg, vthreads, across)
    offsets = []  # per axis, a thread's register tile as offsets from its first element
    for a, axis in enumerate(expr.axes):
        if a == across:
            offsets.append([i * counts[a] for i in range(reg[a])])
        elif a in counts:
            pieces = reg[a] // steps[a]  # virtual threads: pieces a block's threads apart
            offsets.append([v * counts[a] * steps[a] + r for v in range(pieces) for r in range(steps[a])])
        else:
            offsets.append(list(range(reg[a])))
    starts = _lane_starts(expr, device, block, reg, vthreads, across)
    sector = device.layers[-1].transaction_bytes
    found = []
    for tensor in expr.inputs:
        # An element's offset is affine in its coordinates: base + sum over axes of coord x
        # weight (the axis's coefficient times the dimension's stride, summed over dimensions),
        # so the warp's elements are the sums of a lane's start and a register tile's offset.
        weights = _weights(tensor, len(expr.axes))
        base = sum(const * stride for (_, const), stride in zip(tensor.index, tensor.strides))
        tile = {base}
        for axis_offsets, weight in zip(offsets, weights):
            tile = {e + o * weight for e in tile for o in axis_offsets}
        firsts = {sum(c * w for c, w in zip(start, weights)) for start in starts}
        elements = {f + e for f in firsts for e in tile}
        touched = len({e * tensor.itemsize // sector for e in elements})
        found.append((touched, ceil(len(elements) * tensor.itemsize / sector)))
    return tuple(found)


def uncoalesced_bytes(program: RProgram, device: DeviceSpec) -> int:
    """Bytes a GPU program's register tiles load from global memory beyond Q(tile), for the
    transactions its uncoalesced loads waste: each input read straight from global memory (the
    program stages nothing in shared memory) moves its Q share x sectors / needed
    (`warp_sectors`), every sector fetched at the bottom layer's bandwidth (our pricing: the
    unused bytes of a sector that the warp's register tiles do not read are not kept for the
    next tile). 0 on CPUs, for staged
    programs (the cooperative copy into shared memory is coalesced by construction) and for
    tensor-core programs (staged)."""
    expr = program.expr
    if not device.lanes_are_threads:
        return 0
    plan = gpu_plan(program, device)
    if plan.staged or plan.mma_axes is not None:
        return 0
    calc, reg = calculus(expr), program.register_tile
    sectors = warp_sectors(expr, device, program.unit_tile, reg, plan.vthreads)
    shapes, tiles = calc.data_tiles(reg), calc.num_tiles(reg)
    extra = 0
    for (touched, needed), shape, tensor in zip(sectors, shapes, expr.inputs):
        if touched > needed and not l1_keeps_sectors(program, device, tensor, touched):
            extra += tiles * prod(shape) * tensor.itemsize * (touched - needed) // needed
    return extra


def l1_keeps_sectors(program: RProgram, device: DeviceSpec, tensor, touched: int) -> bool:
    """Whether the unit's L1 keeps the `touched` sectors a warp's register tiles of `tensor` take
    until the same threads' next steps read the rest of them: where the tensor's contiguous
    dimension is a reduce axis the threads step along (a row each thread reads in turn, as
    roller-table1 R2's 121-element rows with a thread per row), the next step reads the next
    elements of the same sectors, so each sector comes from global memory once, provided every
    resident warp's sectors fit at once. The L1 is the unit's on-chip array, which L1 and shared
    memory split (NVIDIA since Volta); a program that stages nothing leaves it to L1. Measured on
    the H200 (2026-12-01): R2 at a thread per row, 2 or 4 rows a thread over 1 or 2 elements a
    step (128 KiB of a unit's sectors), ran 130-180 us where a block a row ran 315 (predicted 81;
    the thread-a-row programs 280-283 before this); 8 and 16 rows a thread ran 370-1165 us,
    predicted alike (their grids leave 8-16 warps a unit, which the model does not charge here)."""
    k = leading_axis(tensor)
    axis = None if k is None else program.expr.axes[k]
    if axis is None or axis.kind != "reduce" or program.register_tile[k] >= axis.extent:
        return False
    threads, bpu = blocks_per_unit(program, device, gpu_plan(program, device).stages)
    warps = ceil(threads / device.warp_size) * resident_blocks(program, device, bpu)
    sector = device.layers[-1].transaction_bytes
    return warps * touched * sector <= device.unit_shared_bytes


@lru_cache(maxsize=65536)
def shared_wavefronts(expr: TensorExpr, device: DeviceSpec, block, reg, vthreads, warp=(),
                      kmajor=()) -> tuple[int, int]:
    """(wavefronts, requests) of the first warp of a GPU block tile `block` reading its
    threads' register tiles `reg` of every input from shared memory (bank padding included),
    each thread's tile split into per-axis `vthreads`: counted exactly from the 32 lane
    addresses (`rtile.banks`) under the CUDA template's binding, one thread per register
    tile along each spatial axis, the warp a box of lanes where the plan says (`warp`,
    `plan.warp_lanes`), the inputs named in `kmajor` stored transposed and unpadded
    (`plan.kmajor_inputs`). wavefronts == requests when conflict-free."""
    calc, smem = calculus(expr), device.layers[device.unit_layer_index]
    threads = tuple(b // r if a in expr.spatial else 1 for a, (b, r) in enumerate(zip(block, reg)))
    box = dict(warp)
    lanes = tuple(box.get(axis.name, 1) for axis in expr.axes) if box else ()
    binding = ThreadBinding(threads, reg, vthreads, lanes)
    shapes, pads = calc.data_tiles(block), storage_padding(calc, device, device.unit_layer_index, block, reg)
    served = reqs = 0
    for t, tensor in enumerate(expr.tensors):
        if tensor.role != "input":
            continue
        coeffs = [c for c, _ in tensor.index]
        if tensor.name in kmajor:
            tile = stored_tile(coeffs[::-1], shapes[t][::-1], 0, tensor.itemsize)
        else:
            tile = stored_tile(coeffs, shapes[t], pads[t], tensor.itemsize)
        served += wavefronts(tile, binding, smem.banks, smem.bank_width_bytes, device.warp_size)
        reqs += requests(tile, binding)
    return served, reqs
