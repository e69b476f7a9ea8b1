"""Micro-performance model (Roller §3.3): an `Estimate` computed only from (rProgram, device);
the program carries its expression.

An rProgram is a pipeline (Figure 6): at each layer its tile is loaded from the layer below, and
the register tile is computed. Roller lets the stages overlap, so the program runs at the speed of
its slowest stage (the bottleneck); here they overlap only as far as the hardware and the
template let them (`combine_stages`: on a GPU the other resident warps and blocks, and the
double-buffered shared copies of the programs the templates pipeline, `gpu_stages`):

- load time of layer l   = Q(tile_l) / bandwidth of the layer it is loaded from   (§3.3 MemPerf;
                           on a CPU less where neighbouring cache tiles share what stays in the
                           layer: `cache_traffic`, in whole lines for the inputs a core reads
                           an element at a time: `scattered_inputs`; on a GPU more where a program that stages
                           nothing loads with a warp touching more sectors than its bytes need:
                           `uncoalesced_bytes`; a GPU's loads from global memory at most at the
                           rate its bytes in flight sustain over the latency: `reachable_gbps`;
                           a register tile's reads from shared memory stretched or shortened by
                           the bank conflicts its virtual threads change: `vthread_conflict_ratio`)
- compute time           = flops on the padded iteration space / peak compute     (MaxComputePerf)
                           / the fraction of peak the register tile can reach (`compute_efficiency`:
                           warps per scheduler on a GPU; on a CPU the SIMD lanes its vectors fill
                           times the FMA latency its accumulators cover, or, where calibration
                           measured the register micro-kernel, its measured share of peak:
                           Vortex's hybrid analyzer, level 0 measured and the levels above modelled;
                           slower where the CPU template guards the micro-kernel: `guard_slowdown`)
- accumulator trips (CPU) = the register tile's partial sums leaving the registers after each
                           reduction step of the first cache tile that holds more than one register
                           tile (`accumulator_steps`), to the layer that keeps them (`accumulator_home`)

with every bandwidth and the peak scaled by the fraction of units the grid keeps busy (a shared
layer's bandwidth is split evenly over the units using it, §3.3). Scale-out (ALGORITHMS.md §1):
tiles are dealt round-robin over the units, so the busiest unit gets `ceil(grid / units)` tiles
while the balanced share is `grid / units`; the time is the balanced time times that ratio. The
resident tiles of a unit share its throughput, so blocks per unit raise compute efficiency
(enough warps per scheduler) rather than multiplying speed. `waves = ceil(grid / (units *
blocks per unit))` is reported as the number of rounds of resident blocks. A cross-thread
reduction adds, after its pipeline, the trees that combine its threads' partial sums, once per
wave (`tree_reduction_seconds`). A split-K program adds its partial sums' traffic and its second
kernel (`split_k_seconds`), a CPU program the copies of the inputs its template packs into panels
(`packing_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from math import ceil, log2, prod

from workbench.construct.banks import ThreadBinding, requests, stored_tile, wavefronts
from workbench.hardware.spec import DeviceSpec, MicroKernel
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.alignment import (
    accumulators, autovector_axis, block_thread_count, cross_thread_axis, lane_axis, mma_axes,
    partial_sums, resident_block_limit, simd_vectors,
)
from workbench.rtile.panels import packed_tile_bytes
from workbench.rtile.plan import SCALAR, cpu_plan
from workbench.rtile.pipeline import STAGES, async_copies, pipelined, prefetch_registers, shared_buffers
from workbench.rtile.rprogram import RProgram, footprint_at, storage_padding, waves
from workbench.rtile.traffic import TileCalculus, calculus

GB = 1e9


@dataclass(frozen=True)
class Estimate:
    flops: int  # useful flops of the operator
    padded_flops: int  # flops actually executed, tiles padded to whole tiles
    bytes_per_layer: tuple[tuple[str, int], ...]  # bytes read from each source layer
    load_seconds: tuple[tuple[str, float], ...]  # per source layer
    compute_seconds: float
    threads: int  # per block (GPU); 1 on CPUs
    blocks_per_unit: int
    waves: int
    occupancy: float  # resident threads / max resident threads (GPU); 1 on CPUs
    bottleneck: str  # "compute" or the name of the layer whose loads are slowest
    predicted_seconds: float
    footprints: tuple[int, ...]  # per program layer: bytes its tile occupies (`footprint_at`)
    # a cross-thread reduction's trees over the threads of its blocks (`tree_reduction_seconds`)
    reduction_seconds: float = 0.0
    # which parts of the estimate were measured on the device and which modelled, one phrase each
    # (`provenance`)
    measured: tuple[str, ...] = ()
    modelled: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "flops": self.flops,
            "padded_flops": self.padded_flops,
            "bytes_per_layer": dict(self.bytes_per_layer),
            "load_seconds": dict(self.load_seconds),
            "compute_seconds": self.compute_seconds,
            "threads": self.threads,
            "blocks_per_unit": self.blocks_per_unit,
            "waves": self.waves,
            "occupancy": self.occupancy,
            "bottleneck": self.bottleneck,
            "predicted_seconds": self.predicted_seconds,
            "footprint_bytes": list(self.footprints),
            "reduction_seconds": self.reduction_seconds,
            "measured": list(self.measured),
            "modelled": list(self.modelled),
        }


def hardware_caches(program: RProgram, device: DeviceSpec) -> RProgram:
    """`program` as its data moves: on a GPU through the layers it stages (`cached`); on a CPU
    through every cache layer, which the hardware fills whatever the program stages. A CPU
    program whose L1 and L2 tiles Roller left uncached (no reuse to stage: a pooling) still reads
    through them, its register tiles' neighbours sharing lines in the L1 and its transfers from
    L2 and DRAM adding to the compute rather than hiding it (`combine_stages`). avgpool-3x3 on
    the AVX-512 Zen 5 (uncached L1 and L2 tiles): register rows of 28, 8 and 4 outputs ran 66,
    74 and 95 us, in the order of their compute, which DRAM's term hid when it stood first."""
    if not device.runs_on_cpu or all(program.cached):
        return program
    return replace(program, cached=(True,) * len(program.cached))


def source_layer(program: RProgram, layer: int, n_layers: int) -> int:
    """The layer a tile is loaded from: the next cached layer below, or the bottom."""
    for below in range(layer + 1, len(program.tiles)):
        if program.cached[below]:
            return below
    return n_layers - 1


def blocks_per_unit(program: RProgram, device: DeviceSpec, buffers: int | None = None) -> tuple[int, int]:
    """(threads per block, blocks resident per unit). GPUs: the fewest that any of the unit's
    resources allows (`occupancy_limits`, the staged tiles in `buffers` copies: default
    `pipeline.shared_buffers`, two where the templates pipeline the program), at least one;
    CPUs run one work item per core at a time."""
    if not device.has_occupancy_limits:
        return 1, 1
    threads = block_thread_count(program.expr, device, program.unit_tile, program.register_tile)
    return threads, max(1, min(occupancy_limits(program, device, buffers).values()))


# Registers nvcc gives a thread beyond its register tile (`registers_per_thread`): a 64-bit
# address per tensor (2 registers each) and FIXED_REGISTERS for thread and block indices, loop
# counters and predicates. Fitted by us to `ptxas -v` (nvcc 13, sm_80) over the top-3 programs
# (at 64e7fe8) of every roller-table1 and gensor-table4 workload on the A100, 82 kernels: the
# median of ptxas's count minus the estimate is 0, and 48 of them are within 25 % of ptxas;
# cross-thread reductions (their trees) are under-estimated by 2-3x, window-heavy depthwise
# register tiles over-estimated.
ADDRESS_REGISTERS_PER_TENSOR = 2
FIXED_REGISTERS = 7


def registers_per_thread(program: RProgram, device: DeviceSpec, buffers: int | None = None) -> int:
    """32-bit registers one GPU thread needs: its register tile (the output's accumulators and
    the input fragments one reduce step holds, `footprint_at` the top layer: a warp's share of a
    tensor-core fragment tile) plus addressing (`ADDRESS_REGISTERS_PER_TENSOR` x tensors +
    `FIXED_REGISTERS`), plus `pipeline.prefetch_registers` where the staged tiles are double
    buffered (`buffers`, default `pipeline.shared_buffers`) without `cp.async` (sm_70: the
    next step's tiles pass through the thread's registers, `pipeline.register_prefetch`)."""
    tile = ceil(footprint_at(device, program, 0) / device.register_bytes)
    base = tile + ADDRESS_REGISTERS_PER_TENSOR * len(program.expr.tensors) + FIXED_REGISTERS
    if async_copies(device) or (buffers or shared_buffers(program, device)) < STAGES:
        return base
    return base + prefetch_registers(program, device)


def block_shared_bytes(program: RProgram, device: DeviceSpec, buffers: int | None = None) -> int:
    """Block-shared memory one GPU block allocates: the padded data tiles it stages at the unit
    layer (`footprint_at`, bank padding included) in `buffers` copies (default
    `pipeline.shared_buffers`: two where the templates pipeline the program), 0 for a program
    that stages nothing."""
    unit = device.unit_layer_index
    if not program.cached[unit]:
        return 0
    return (buffers or shared_buffers(program, device)) * footprint_at(device, program, unit)


def occupancy_limits(program: RProgram, device: DeviceSpec, buffers: int | None = None) -> dict[str, int]:
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


def compute_efficiency(program: RProgram, device: DeviceSpec, threads: int, bpu: int) -> float:
    """Fraction of peak the register tile can reach. GPU: each scheduler needs a resident warp
    (TEU group). CPU: the measured rate of its register micro-kernel over the peak where the spec
    has one (`measured_micro_kernel`; at most 1: calibration lets a measurement exceed the FMA
    peak by its noise slack), else `simd_utilisation` (one lane where a guarded tail leaves the
    row scalar, `scalar_row`) x `latency_coverage` x `load_coverage`."""
    if device.lanes_are_threads:
        return min(1.0, warps_per_scheduler(program, device, threads, bpu))
    kernel = measured_micro_kernel(program, device)
    if kernel is not None:
        return min(1.0, kernel.gflops / peak_gflops(program.expr, device))
    if autovector_axis(program.expr, device) is not None:
        return autovector_efficiency(program, device)
    tile = program.register_tile
    simd = 1.0 / scalar_lanes(program, device) if scalar_row(program, device) else simd_utilisation(
        program.expr, device, tile)
    return (
        simd
        * latency_coverage(program.expr, device, tile)
        * load_coverage(program.expr, device, tile)
    )


def scalar_row(program: RProgram, device: DeviceSpec) -> bool:
    """Whether a CPU program's register row runs scalar for a guarded tail (`CpuPlan.guarded_row`):
    its compute fills one lane (`compute_efficiency`) and its reads from L1 into registers move
    one element a load (`transfer_seconds`)."""
    return device.runs_on_cpu and cpu_plan(program, device).guarded_row


def scalar_lanes(program: RProgram, device: DeviceSpec) -> int:
    """Lanes of the output's dtype in a vector register: what a scalar row gives up."""
    return max(1, device.register_bytes // program.expr.output.itemsize)


def vector_pieces(elements: int, lanes: int) -> int:
    """Vectors LLVM's SLP vectoriser packs a row of `elements` independent scalar operations
    into: power-of-two pieces of at most `lanes`, largest first (14 on 16 lanes: 8 + 4 + 2)."""
    pieces, left, width = 0, elements, lanes
    while left:
        while width > left:
            width //= 2
        pieces, left = pieces + left // width, left % width
    return pieces


def autovector_efficiency(program: RProgram, device: DeviceSpec) -> float:
    """Fraction of peak a CPU micro-kernel reaches whose row LLVM vectorises (`autovector_axis`:
    a stride-2 pooling): the lanes its vectors fill, over the loads each needs, over the flops
    an operation counts.

    - Lanes: a register row of w >= 4 outputs is SLP-vectorised in `vector_pieces`: w / (pieces
      x lanes). A row of 1 or 2 is left to the loop vectoriser, which packs consecutive register
      tiles of the L1 row; counted over the row's n outputs, `lanes` of them a vector and the
      rest one at a time: n / ((n // lanes + n % lanes) x lanes), whatever w is (rows of 1 and 2
      in L1 rows of 56 ran alike, 65-73 and 66-75 us; counting the 28 tiles of 2 put a row of 2
      at twice the time of a row of 1).
    - Loads: an input read with stride s along the row takes s vector loads per vector (and a
      shuffle to separate them) on as many load ports as FMA pipes: 1 / s.
    - Flops: the peak counts an FMA as two flops; an operator of fewer flops per iteration point
      (a pooling's add) reaches that share of it.
    The chains are short (a window's few adds per output), so out-of-order execution overlaps
    consecutive register tiles' and no latency term applies.

    avgpool-3x3 (stride 2, 64 x 112 x 112) on the AVX-512 Zen 5, L1 rows of 56, one process,
    no gathers (`codegen.build.X86_FEATURES`): rows of 56 / 28 / 8 / 14 / 4 / 7 outputs (lanes
    0.88 / 0.58 / 0.50 / 0.29 / 0.25 / 0.15) ran 61 / 66 / 74 / 79 / 95 / 100 us, a row of 1
    (loop-vectorised, 0.32) 85 us: about 47 us of copies and traffic plus 12-14 us / lanes, the
    compute this gives (14 us with every lane filled: 2.0 Mflop at 509 GFLOP/s, x 2 loads, x 1.8
    for the adds). Rows LLVM left partly scalar (14 with the 3 x 3 window unrolled: 147-153 us;
    28 with it: 67 against 49 us; 2 rows of 3: 132-138 us) are not modelled:
    `alignment.ExecutionUnitRule` keeps the row to whole 4-lane pieces, 1 or 2, and the
    register tile to one window row."""
    expr = program.expr
    axis = autovector_axis(expr, device)
    lanes = max(1, device.register_bytes // expr.output.itemsize)
    width = program.register_tile[axis]
    if width >= 4:
        filled = width / (vector_pieces(width, lanes) * lanes)
    else:
        row = program.tiles[min(1, len(program.tiles) - 1)][axis]
        filled = row / ((row // lanes + row % lanes) * lanes)
    stride = max((abs(t.index[-1][0][axis]) for t in expr.inputs if t.uses_axis(axis)), default=1)
    flops = min(1.0, expr.flops / (2 * prod(expr.extents)))
    return filled / max(1, stride) * flops


def simd_utilisation(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the vector lanes a CPU register tile fills. The peak counts every lane of
    every FMA; a tile of `size` values along the `lane_axis` issues `simd_vectors` whole
    vectors for them, so it fills `size / (vectors x lanes)` of the lanes (a 12-wide fp32 row on
    8-lane AVX2: 12 / 16). An operator with no lane axis (its output row a gather, as a
    stride-2 pooling's, or a stride-2 conv's with fewer filters than a vector) runs scalar
    code: one lane of `register_bytes / itemsize`."""
    lanes = max(1, device.register_bytes // expr.output.itemsize)
    axis = lane_axis(expr, device)
    if axis is None:
        return 1.0 / lanes
    size = tile[axis]
    return size / (simd_vectors(size, expr.output.itemsize, device) * lanes)


def latency_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the FMA pipes a CPU reduction's register tile keeps busy:
    min(1, accumulators / (latency x pipes)). Each accumulator is a dependency chain that issues
    one FMA per `fma_latency_cycles`, so `a` accumulators issue a / latency FMAs per cycle out of
    the `fma_pipes` the peak assumes (Little's law; ALGORITHMS.md §7): 2 accumulators on Zen 2
    (5 cycles x 2 pipes) reach 2 / 10 of peak. Operators without a reduce axis carry no chain
    (out-of-order execution overlaps independent vectors): 1. A spec without FMA facts: 1."""
    need = device.fma_accumulators
    if not need or not expr.reduce:
        return 1.0
    return min(1.0, accumulators(expr, device, tile) / need)


def step_loads(expr: TensorExpr, device: DeviceSpec, tile) -> int:
    """Loads a CPU register tile issues per reduction step: for every input, one vector per
    `simd_vectors` of its `lane_axis` extent times the tile's sizes along the other spatial axes
    that index it (rows of that input), or, where the lane axis does not index it, one broadcast
    per element those axes select (matmul 6 x 16: 2 vectors of B + 6 broadcasts of A; bmm 3 x 4 x
    8: the batch axis indexes both inputs, 3 vectors of B + 12 broadcasts of A)."""
    v = lane_axis(expr, device)
    loads = 0
    for tensor in expr.inputs:
        rows = prod(tile[a] for a in expr.spatial if a != v and tensor.uses_axis(a))
        loads += rows * simd_vectors(tile[v], tensor.itemsize, device) if tensor.uses_axis(v) else rows
    return loads


def load_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the FMA pipes a CPU register tile's loads let it keep busy:
    min(1, accumulators / `step_loads`). Each reduction step issues one FMA per accumulator and
    `step_loads` loads and broadcasts (a broadcast from memory is a load uop); a core issues as
    many full-width vector loads per cycle as it has FMA pipes (2 and 2 on Haswell to Skylake-SP
    and Zen 1 to Zen 4: Intel's optimization reference manual, AMD's software optimization
    guides), so a tile with more loads than FMAs waits on its load ports. A register tile over
    an axis that indexes every input (a batch) adds loads in proportion to its FMAs: on the AVX2
    EPYC, bmm-attn's 3 x 4 x 8 x 1 tile (15 loads per 12 FMAs: 12 / 15) measured 208-211 us
    against 184 us for 1 x 4 x 16 x 1 (6 per 8) in one process; the earlier model predicted
    327 us for both, this one 368 and 327. Re-predicting the 208 stored runs of 7 sessions on
    that machine: mean Spearman 0.349 -> 0.359, dwconv-3x3 up in 13 of its 15 runs (its input
    rows are loaded once per filter step). Operators without a reduce axis, scalar code (no
    lane axis) and specs without FMA facts: 1."""
    if not device.fma_accumulators or not expr.reduce or lane_axis(expr, device) is None:
        return 1.0
    return min(1.0, accumulators(expr, device, tile) / step_loads(expr, device, tile))


def micro_kernel_shape(expr: TensorExpr, device: DeviceSpec, tile) -> tuple[int, int] | None:
    """(rows, columns) of the register micro-kernel calibration measures that a CPU register
    tile runs, or None where it runs another kind of kernel.

    Calibration measures C[r, n] += A[r, k] * B[k, n]: r x n accumulators vectorised along n,
    each reduction step loading one row of B and broadcasting one element of A per row. A tile
    runs that kernel when its operator reduces with one multiply-add per iteration point (two
    flops per point: the pure expression carries no body, only its flop count), has a spatial
    `lane_axis`, and has two inputs: one that the lane axis indexes and whose row all the tile's
    rows share (no other spatial axis of register size > 1 indexes it), and one the lane axis
    does not index (broadcast). rows = the product of the other spatial axes' register sizes,
    columns = the lane axis's (matmul 6 x 16 x 1: 6 x 16; a conv's filters x output columns)."""
    v = lane_axis(expr, device)
    if v is None or expr.axes[v].kind != "spatial" or not expr.reduce or len(expr.inputs) != 2:
        return None
    if expr.flops != 2 * prod(expr.extents):
        return None
    streamed = [t for t in expr.inputs if t.uses_axis(v)]
    if len(streamed) != 1:
        return None
    others = [a for a in expr.spatial if a != v]
    if any(streamed[0].uses_axis(a) and tile[a] > 1 for a in others):
        return None
    return prod(tile[a] for a in others), tile[v]


def measured_micro_kernel(program: RProgram, device: DeviceSpec) -> MicroKernel | None:
    """The micro-kernel calibration measured on `device` that `program`'s register tile runs
    (`micro_kernel_shape`, in the program's dtype), or None (not measured, or not that kind)."""
    if device.lanes_are_threads or not device.micro_kernels:
        return None
    shape = micro_kernel_shape(program.expr, device, program.register_tile)
    return None if shape is None else device.micro_kernel(program.expr.dtype, *shape)


def provenance(program: RProgram, device: DeviceSpec, packed: bool) -> dict[str, tuple[str, ...]]:
    """`Estimate.measured` and `Estimate.modelled`: the compute term measured where the register
    tile's micro-kernel was (level 0), else modelled from the peak; the peak and the bandwidths
    measured where the spec is calibrated, else the spec's values; the traffic per layer and
    the scale-out over the units always modelled (the levels above level 0), and the panel
    copies where the CPU template makes them (`packed`: `packed_bytes` > 0)."""
    measured, modelled = [], []
    kernel = measured_micro_kernel(program, device)
    calibrated = "calibrated" if device.calibrated else "the spec's, not calibrated"
    if kernel is not None:
        measured.append(f"compute: level-0 micro-kernel {kernel.shape} {kernel.dtype}, {kernel.gflops:g} GFLOP/s")
    else:
        if device.lanes_are_threads:
            how = "warps per scheduler"
        elif autovector_axis(program.expr, device) is not None:
            how = "the row LLVM vectorises: lanes filled over the strided loads"
        elif scalar_row(program, device):
            how = "a guarded tail leaves the row scalar: one lane, one element a load from L1"
        else:
            shape = micro_kernel_shape(program.expr, device, program.register_tile)
            # said only where calibration measured micro-kernels, just not this one
            unmeasured = f", no measured {shape[0]}x{shape[1]} micro-kernel" if shape and device.micro_kernels else ""
            how = f"SIMD lanes filled x FMA latency covered{unmeasured}"
        modelled.append(f"compute: {how}")
        (measured if device.calibrated else modelled).append(f"peak compute ({calibrated})")
    through = hardware_caches(program, device)
    sources = sorted({source_layer(through, l, len(device.layers)) for l, c in enumerate(through.cached) if c})
    llc = [l for l in sources if layer_gbps(program, device, l) != device.layers[l].bandwidth_gbps]
    if names := ", ".join(device.layers[l].name for l in sources if l not in llc):
        (measured if device.calibrated else modelled).append(f"bandwidth of {names} ({calibrated})")
    if llc:  # the L3 serves the bottom layer's reads; its bandwidth measured only where calibrated with it
        how = dict(device.sources).get("llc_gbps", "")
        line = (f"bandwidth of the {device.llc_bytes / 2**20:g} MiB last-level cache, which serves "
                f"{device.layers[llc[0]].name}'s reads: the operator fits in half of it")
        (measured if how.startswith("measured") else modelled).append(line)
    modelled.append("traffic per layer")
    if packed:
        modelled.append("panel copies of the packed inputs")
    modelled.append(f"scale-out over {device.compute_units} {'cores' if device.runs_on_cpu else 'units'}")
    return {"measured": tuple(measured), "modelled": tuple(modelled)}


def peak_gflops(expr: TensorExpr, device: DeviceSpec) -> float:
    """MaxComputePerf: the MMA units' peak for tensor-core programs, else the ALUs'."""
    return device.peak(expr.dtype, tensor_core=mma_axes(expr, device) is not None)


# The share of a CPU cache the output buffer and the tiles streaming past it may fill and stay
# there (`accumulator_home`): all but one way of a 16-way cache, the rest holding what else the
# core touches (stack, code, the prefetchers' lines). Our reconstruction, bracketed by two
# mm-bert-qkv unit tiles on the AVX-512 Zen 5 (1 MiB L2, 16-way; three top-10 runs, 2026-11-25):
# 266 x 384 x 192 (887 KiB, 87 %) ran 3.88-3.90 ms with the other tiles that fit, 266 x 576 x 128
# (1020 KiB, 99.6 %) 4.10 ms, the one tile of the ten that the full capacity kept in L2.
ACCUMULATOR_FILL = 15 / 16


def unit_output_bytes(program: RProgram) -> int:
    """Bytes of one unit tile's outputs: the CPU template's output buffer (`codegen/cpu.py`)."""
    return prod(calculus(program.expr).data_tiles(program.unit_tile)[-1]) * program.expr.tensors[-1].itemsize


def accumulator_home(program: RProgram, device: DeviceSpec) -> int:
    """The layer a CPU register tile's accumulators go to between two L1 K-steps: the template
    accumulates into one buffer of the unit tile's whole output (`codegen/cpu.py`), which stays
    in the first cache layer that holds it together with the input tiles streaming through that
    layer (the layer's tile's inputs, `footprint_bytes` without its output): between two visits
    of one accumulator the core touches at most those, so an LRU cache keeps the buffer; else
    the next layer.
    conv-1x1 measured it: unit tiles of 174 x 14 x 14 outputs (136 KiB, in L2) ran 2.3-2.9 ms,
    tiles of 114 x 2 x 14 (12.5 KiB, in L1) 1.9-2.0 ms, with the same register and L1 tiles.
    mm-512 on the AVX2 EPYC (512 KiB L2) measured the L2 side: unit tiles of 258 x 256 outputs
    (264 KiB, with their 64-deep panels 394 KiB) ran 1.57-1.65 ms with L1 K tiles of 32 or 64,
    as fast as 174 x 256 (1.57-1.62 ms): the buffer stays in L2, where the earlier rule (the
    output alone in half the layer) sent it to DRAM and predicted 3.3-4.2 ms. A layer holds
    them in `ACCUMULATOR_FILL` of its capacity, not all of it."""
    calc = calculus(program.expr)
    out = unit_output_bytes(program)
    last = len(device.layers) - 1
    tiles = program.tiles
    return next((l for l in range(1, last)
                 if out + calc.footprint_bytes(tiles[min(l, len(tiles) - 1)], (), with_output=False)
                 <= ACCUMULATOR_FILL * device.layers[l].capacity_bytes), last)


# Bytes a core's panel copy moves per cycle: four fp32 elements. bmm-attn (AVX-512 Zen 5 EPYC at
# 3.97 GHz, one process, 2026-11-25): its 13-row tiles pad M and copy ~99 K elements per core
# with the copies vectorised (`codegen/cpu._vectorise_copy`), and ran 54-56 us against 48 us for
# 8-row tiles that copy nothing, both with L1 tiles of the whole K (direct stores): ~7 us, 0.28
# cycles per element, where the L2's bandwidth would move them in 2 us (the copies' loads and
# stores, the panel's layout and the padding's select, not the bytes). (Fitted as two elements
# before `buffer_bytes` priced the output buffer, whose 10 us that comparison had included.)
PACK_BYTES_PER_CYCLE = 16

# How much slower a CPU register micro-kernel runs when its tiles carry a guard (`guard_slowdown`):
# dwconv-3x3 (96 channels, 112 x 112) on the AVX-512 Zen 5, two top-10 runs on 2026-11-24: the 8,
# 7 and 4-row register tiles (dividing 112) ran 267-325 us, the 6, 5 and 3-row ones (cut by
# the last tile) 363-430 us with the same other tiles, 1.3-1.5x.
GUARDED_MICRO_KERNEL = 1.4


def guard_slowdown(program: RProgram, device: DeviceSpec) -> float:
    """How much slower than the modelled micro-kernel a CPU program's guards make it run, as its
    plan (`rtile.plan.CpuPlan`) builds it; 1 on GPUs (their guards are per thread, and the model
    prices the padded work instead).

    A reduction whose lanes the alignment rules put along its reduce axis (`lane_axis`: gemv,
    row sums) that the template leaves without any vector (`SCALAR` path: it takes the lanes
    along K only on whole tiles) sums one output at a time: one chain of dependent adds instead
    of lanes x FMA pipes x FMA latency independent ones. Elsewhere GUARDED_MICRO_KERNEL where a
    register tile along a spatial axis does not divide the axis and the plan does not pad the
    tails: the template then guards the micro-kernel with the block predicate TVM adds, and the
    whole loop nest runs with it, not only the cut tile. (Evidence: docs/evidence.md#guard-slowdown.)"""
    expr = program.expr
    if not device.runs_on_cpu:
        return 1.0
    plan = cpu_plan(program, device)
    lanes = lane_axis(expr, device)
    if lanes is not None and expr.axes[lanes].kind == "reduce" and plan.path == SCALAR:
        return float(device.warp_size * max(1, device.fma_pipes) * max(1, device.fma_latency_cycles))
    if plan.padded_tails:
        return 1.0
    reg = program.register_tile
    return GUARDED_MICRO_KERNEL if any(expr.axes[a].extent % reg[a] for a in expr.spatial) else 1.0


# Passes the CPU template's output buffer makes over the unit tile's outputs beyond storing
# them once (`buffer_bytes`): the initialisation's stores, the first K-step's loads of the
# accumulators, their last stores into the buffer, and the write-back's loads.
BUFFER_PASSES = 4


def buffer_bytes(program: RProgram, device: DeviceSpec) -> int:
    """Bytes a CPU reduction's output buffer moves in the layer that holds it
    (`accumulator_home`), beyond the one store of each output: `BUFFER_PASSES` over the padded
    output, where the template accumulates into a buffer of the unit tile's outputs; 0 where it
    stores each register tile's accumulators straight to the output (`CpuPlan.direct_stores`).
    bmm-attn (12 x 128 x 128, K = 64) on the AVX-512 Zen 5, one process, the same register
    tiles and L2 tiles: L1 tiles of the whole K (direct stores) ran 54-56 us with 11 to 13-row
    registers and 48 us with 8 rows, those of K = 32 (buffered) 65-66 and 56 us: about 10 us
    for ~1.6 MB a core at the L2's 217 GB/s a core (7.5 us), which the model did not see and
    ranked the two as equal."""
    expr = program.expr
    if not device.runs_on_cpu or not expr.reduce or cpu_plan(program, device).direct_stores:
        return 0
    return BUFFER_PASSES * unit_output_bytes(program) * program.grid


def accumulator_steps(program: RProgram) -> tuple[int, ...]:
    """The tile whose reduction steps take a CPU register tile's accumulators out of the
    registers and back (`TileCalculus.accumulator_bytes`): the first cache tile that holds more
    than one register tile along a spatial axis. Inside a cache tile of one register tile its
    reduction loop runs straight around the micro-kernel's (`S1 R1 | S2 | R2`, S2 of one
    iteration), on the same accumulators, which LLVM keeps in registers across it; with no
    such tile they never leave (the whole iteration space's tile: one step).
    conv-1x1 on the AVX-512 Zen 5 measured it: 32 x 7 registers under L1 tiles of the same 32 x 7
    outputs ran 383-388 us whether the L1 tile held 1, 2, 4, 8, 16 or 32 channels (top-10
    run, 2026-11-24), where counting a trip per L1 step predicted 546 us to 2.9 ms."""
    reg = program.register_tile
    spatial = program.expr.spatial
    return next((tile for tile in program.tiles[1:] if any(tile[a] > reg[a] for a in spatial)),
                tuple(program.expr.extents))


def cache_traffic(program: RProgram, device: DeviceSpec, layer: int) -> int:
    """Bytes `program`'s tiles at `layer` load from the layer below: Roller's Q(tile), except
    where a CPU cache tile's neighbours share what stays (`TileCalculus.sweep`): when one step
    of the innermost stepping spatial loop, over all the reduction steps of the tile above,
    fits the layer, the run of neighbours loads `traffic_bytes(swept)` (a conv's packed filter
    panel is loaded once per row of output tiles, not once per tile). GPU tiles are explicit
    copies per tile, and the unit tile's neighbours are other cores' work: Q(tile).

    conv-3x3 on AVX2 (one core, process CPU time, 32 x 2 x 1 registers under 32 x 2 x 2 L1
    tiles): L2 tiles of 16 channels (the L1 tile's step over them: 20 KiB, in L1) 2.68-2.77
    ms, of 32 (39 KiB) 3.14-3.30, of 64 3.21-4.33, whatever the L1 tile's channels (8, 16 or
    32): the 32 filters x C x 3 x 3 panel of the L2 K-step stays in L1 across the row of L1
    tiles or is reloaded for each, where Q reloads it for each in every case."""
    calc = calculus(program.expr)
    tile = program.tiles[layer]
    if not device.runs_on_cpu or layer == 0:
        return calc.traffic_bytes(tile)
    line, scattered = device.layers[layer].transaction_bytes, scattered_inputs(program, device)
    q = calc.traffic_bytes(tile, line, scattered)
    if layer + 1 >= len(program.tiles):
        return q
    sweep = calc.sweep(tile, program.tiles[layer + 1])
    if sweep is None or calc.footprint_bytes(sweep[0], line=line, in_lines=scattered) > device.layers[layer].capacity_bytes:
        return q
    return min(q, calc.traffic_bytes(sweep[1], line, scattered))


def scattered_inputs(program: RProgram, device: DeviceSpec) -> frozenset[int]:
    """The inputs a CPU cache layer holds and loads in whole lines (`TileCalculus.input_bytes`):
    those that do not read the loop the template vectorises (`CpuPlan.vector_axis`; all of them
    where it vectorises none). An input that reads it is streamed in vectors, packed into panels
    (matmul's B, a convolution's filters, whose 3-element rows of one filter would otherwise
    count a line each) or read along its contiguous axis; one that does not is read an element
    at a time (a convolution's data, broadcast) or in tiles whose rows the alignment rules make
    whole lines (matmul's A)."""
    vector = cpu_plan(program, device).vector_axis
    inputs = program.expr.inputs
    return frozenset(t for t, tensor in enumerate(inputs) if vector is None or not tensor.uses_axis(vector))


def combine_stages(program: RProgram, device: DeviceSpec, compute: float, loads: dict[str, float]) -> float:
    """One unit's time from its stage times. GPU: `gpu_stages` (they overlap as far as resident
    warps hide them). CPU: the register tile's loads from the layer right below the registers issue
    in the FMAs' shadow (same instruction stream, separate ports), so they overlap the compute,
    but every transfer further down adds: a core copies the next panel from L2 or DRAM between
    two micro-kernel runs, and the hardware prefetchers hide only part of a stream (the
    Execution-Cache-Memory model's observation, Treibig & Hager 2010, that x86 cache-level
    transfers do not overlap one another; ALGORITHMS.md §7). Checked against three sets of 257
    measured cpu-core kernels (docs/benchmarks.md): the typical error of a prediction fell from
    1.5x-1.9x to 1.23x-1.5x (median |log(predicted / measured)|), the quiet calibrated run
    included (1.9x -> 1.23x); the ranking within a workload did not improve consistently (best
    in the predicted top 3 for 16, 13 and 12 of 26 runs against 6, 11 and 16 with the pipelined
    maximum): most candidates are near-equal, and what orders them is not in the model yet."""
    if not device.runs_on_cpu:
        return gpu_stages(program, device, compute, loads)
    first = device.layers[source_layer(program, 0, len(device.layers))].name
    return max(compute, loads.get(first, 0.0)) + sum(t for name, t in loads.items() if name != first)


def resident_blocks(program: RProgram, device: DeviceSpec, bpu: int) -> int:
    """Blocks a busy GPU unit holds at once: `bpu`, or fewer where the grid does not give every
    unit that many (tiles dealt round-robin: at most ceil(grid / units) a unit)."""
    return max(1, min(bpu, ceil(program.grid / device.compute_units)))


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


def warps_per_scheduler(program: RProgram, device: DeviceSpec, threads: int, bpu: int) -> float:
    """Resident warps per warp scheduler of a busy unit (`resident_blocks` blocks of `threads`):
    a grid smaller than the units' room for blocks leaves fewer resident than `bpu`."""
    warps = ceil(threads / device.warp_size) * resident_blocks(program, device, bpu)
    return warps / device.teu_per_unit


def gpu_stages(program: RProgram, device: DeviceSpec, compute: float, loads: dict[str, float]) -> float:
    """One GPU unit's time from its stage times, as far as the CUDA templates (codegen/cuda.py,
    cuda_mma.py) overlap them. Inside a step, a warp's register-tile reads from shared memory
    feed its own FMAs (no barrier between warps), so the other warps of its scheduler hide them
    (`overlapped` over `warps_per_scheduler`). A pipelined program (`pipeline.pipelined`)
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
    threads, bpu = blocks_per_unit(program, device)
    warps = warps_per_scheduler(program, device, threads, bpu)
    unit = device.unit_layer_index
    bottom = device.layers[-1].name
    global_load = loads.get(bottom, 0.0)
    if not program.cached[unit]:
        return overlapped(compute, global_load, warps)
    shared_load = loads.get(device.layers[unit].name, 0.0)
    inner = overlapped(compute, shared_load, warps)
    if pipelined(program, device):
        return max(inner, global_load)
    return overlapped(inner, global_load, resident_blocks(program, device, bpu))


def bytes_in_flight(program: RProgram, device: DeviceSpec, bpu: int) -> int:
    """Bytes of global-memory loads a busy GPU unit has outstanding at once: each resident block
    (`resident_blocks`) issues the loads of one step of its block tile, its inputs' data tiles
    (a staged copy of a shared step, or the register tiles its threads read), before the first
    returns: the copy loop and the register tile have constant trip counts, the register tile
    is unrolled by the template and nvcc unrolls small loops with a known trip count by default
    (CUDA C++ Programming Guide, `#pragma unroll`), and no load depends on another. Our
    simplification: a thread's outstanding loads are not capped by its registers or the
    unit's miss-handling resources."""
    calc = calculus(program.expr)
    shapes = calc.data_tiles(program.unit_tile)
    block = sum(prod(shape) * t.itemsize for shape, t in zip(shapes, program.expr.tensors) if t.role == "input")
    return resident_blocks(program, device, bpu) * block


def reachable_gbps(program: RProgram, device: DeviceSpec, layer: int) -> float:
    """Bandwidth a program reaches reading from `layer`: `layer_gbps`, except from a GPU's global
    memory, where Little's law bounds it by the bytes in flight over the memory latency
    (throughput = concurrency / latency): units x `bytes_in_flight` / `latency_ns`. The V100
    (750 GB/s, 400 ns) needs 300 KB in flight, 3.75 KB an SM, to reach its bandwidth: 29
    warps each with one 128 B load outstanding. Few small blocks cannot."""
    spec = device.layers[layer]
    if not device.lanes_are_threads or layer != len(device.layers) - 1 or spec.latency_ns <= 0:
        return layer_gbps(program, device, layer)
    _, bpu = blocks_per_unit(program, device)
    little = device.compute_units * bytes_in_flight(program, device, bpu) / spec.latency_ns  # B/ns = GB/s
    return min(spec.bandwidth_gbps, little)


# An operator stays in a CPU's last-level cache from one run to the next when its data takes at
# most this share of it: the rest is other processes' lines, the template's panels and buffers,
# and replacement that is not a perfect LRU. The half that `codegen.block_order` leaves of a GPU's L2.
LLC_FILL = 0.5


def layer_gbps(program: RProgram, device: DeviceSpec, layer: int) -> float:
    """Bandwidth of `program`'s reads from `layer`: the spec's, except from the bottom layer of a
    CPU with a last-level cache (`DeviceSpec.llc_bytes`) whose operator fits in LLC_FILL of it,
    every tensor once (its compulsory bytes): from the second run on those reads hit the L3, at
    `llc_gbps`. A timing repeats the kernel on the same tensors, and a model's next kernel reads
    what the last one wrote. Re-predicting the AVX-512 Zen 5's three stored cpu-core top-10 runs
    of 02:05 (32 MiB L3 measured at 224-232 GB/s, DRAM at 46-79), with either of two
    calibrations: the median error fell from 1.38x to 1.23x and from 1.37x to 1.28x (dwconv-3x3's
    9.4 MiB from 2.3x to 0.92x, avgpool-3x3 from 1.9x to 0.94x, reduce-rows from 4.5x to 1.4x)
    and the mean top-10 Spearman rose from 0.694 to 0.701-0.702; gemv-4096 (64 MiB) and relu
    (98 MiB) still stream from DRAM, mm-skinny (17 MiB) too."""
    spec = device.layers[layer]
    if not device.runs_on_cpu or not device.llc_bytes or layer != len(device.layers) - 1:
        return spec.bandwidth_gbps
    calc = calculus(program.expr)
    if calc.traffic_bytes(tuple(calc.extents)) > device.llc_bytes * LLC_FILL:
        return spec.bandwidth_gbps
    return max(spec.bandwidth_gbps, device.llc_gbps)


def transfer_seconds(program: RProgram, device: DeviceSpec, layer: int, q: int, scalar: bool = False) -> float:
    """Time to move `q` bytes for `program`'s tiles at `layer` from the layer below with every
    unit busy: at the source's bandwidth, except on a GPU, where register tiles read from shared
    memory take the wavefronts their virtual threads add or save (`vthread_conflict_ratio`),
    and loads from global memory reach only `reachable_gbps`; its output stores (Q's `stores`
    part) are posted, no register waits for them, so they stream at the spec's bandwidth. A CPU
    register row left scalar (`scalar`: `scalar_row` of the program as Roller staged it, which
    decides the template's panels, where `program` here is the one `hardware_caches` moves data
    through) reads from L1 one element a load: `lanes` times as long as the vector loads the
    calibrated bandwidth was measured with."""
    src = source_layer(program, layer, len(device.layers))
    bandwidth = layer_gbps(program, device, src) * GB
    if device.lanes_are_threads and layer == 0 and src == device.unit_layer_index:
        return q * vthread_conflict_ratio(program, device) / bandwidth
    if layer == 0 and scalar:  # one element a load, where a vector moves `lanes`
        return q * scalar_lanes(program, device) / bandwidth
    reach = reachable_gbps(program, device, src) * GB
    if reach >= bandwidth:
        return q / bandwidth
    calc = calculus(program.expr)
    tile, output = program.tiles[layer], program.expr.tensors[-1]
    stores = calc.spatial_tiles(tile) * prod(calc.data_tiles(tile)[-1]) * output.itemsize
    return (q - stores) / reach + stores / bandwidth


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
    if not program.vthreads or not device.lanes_are_threads or not expr.reduce:
        return 1.0
    unit = device.unit_layer_index
    if (
        not program.cached[unit] or device.layers[unit].banks <= 0
        or mma_axes(expr, device) is not None or cross_thread_axis(expr, device) is not None
    ):
        return 1.0
    split = dict(program.vthreads)
    vthreads = tuple(split.get(axis.name, 1) for axis in expr.axes)
    block, reg = program.unit_tile, program.register_tile
    with_split = shared_wavefronts(expr, device, block, reg, vthreads)[0]
    without = shared_wavefronts(expr, device, block, reg, tuple(1 for _ in expr.axes))[0]
    return with_split / without if without else 1.0


def tree_reduction_seconds(program: RProgram, device: DeviceSpec, threads: int, n_waves: int) -> float:
    """Time a cross-thread reduction (`alignment.cross_thread_axis`) spends combining its
    threads' partial sums, after its loads: each block sums its `threads` partial sums in a tree
    of ceil(log2(threads)) steps per output point of its tile (they are reduced one after
    another), each step one exchange through the warp shuffle or shared-memory network, priced
    at the shared layer's latency (a shuffle's latency is of that order on Volta: Jia et al.
    2018). The blocks resident on a unit reduce at the same time, so a unit pays it once per
    wave. 0 for every other program."""
    if cross_thread_axis(program.expr, device) is None or threads <= 1:
        return 0.0
    outputs = prod(program.unit_tile[a] for a in program.expr.spatial)
    steps = ceil(log2(threads))
    return n_waves * outputs * steps * device.layers[device.unit_layer_index].latency_ns * 1e-9


def split_k_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a split-K program (`RProgram.split` = S > 1) adds to its first pass: that pass's
    grid already counts its S blocks per unit tile (`RProgram.grid`), each walking 1/S of the
    reduce axis, so its loads and compute are the unsplit program's spread over more units;
    beyond them, its blocks store S x O partial sums (O outputs) where the unsplit program
    stores O, and a second kernel reads the S x O partial sums back and writes the O results.
    Priced at the bottom layer's bandwidth (both passes stream: consecutive threads,
    consecutive outputs), plus the second kernel's launch (`DeviceSpec.launch_seconds`) and
    one memory latency before its first loads return (it has nothing to overlap them with).
    Partial sums have the output's dtype (TVM's rfactor buffer). 0 for unsplit programs."""
    split = program.split
    if split <= 1:
        return 0.0
    out = program.expr.output
    size = prod(out.shape) * out.itemsize
    bottom = device.layers[-1]
    moved = (split - 1) * size + split * size + size  # extra partial stores; pass 2 reads S x O, writes O
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
    split = dict(vthreads)
    if across is not None:
        counts = {across: ceil(block[across] / reg[across])}
        steps = {across: 1}
    else:
        counts = {a: ceil(block[a] / reg[a]) for a in expr.spatial}
        steps = {a: max(1, reg[a] // split.get(expr.axes[a].name, 1)) for a in expr.spatial}
    offsets = []  # per axis, a thread's register tile as offsets from its first element
    for a, axis in enumerate(expr.axes):
        if a == across:
            offsets.append([i * counts[a] for i in range(reg[a])])
        elif a in counts:
            pieces = reg[a] // steps[a]  # virtual threads: pieces a block's threads apart
            offsets.append([v * counts[a] * steps[a] + r for v in range(pieces) for r in range(steps[a])])
        else:
            offsets.append(list(range(reg[a])))
    lanes = min(device.warp_size, prod(counts.values()))
    starts = []
    for lane in range(lanes):
        coord, rest = [0] * len(expr.axes), lane
        for a in reversed(list(counts)):
            coord[a], rest = rest % counts[a] * steps[a], rest // counts[a]
        starts.append(coord)
    sector = device.layers[-1].transaction_bytes
    found = []
    for tensor in expr.inputs:
        elements = set()
        for start in starts:
            for point in product(*offsets):
                coord = [s + o for s, o in zip(start, point)]
                elements.add(sum((sum(c * x for c, x in zip(coeffs, coord)) + const) * stride
                                 for (coeffs, const), stride in zip(tensor.index, tensor.strides)))
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
    if not device.lanes_are_threads or program.cached[device.unit_layer_index] or mma_axes(expr, device) is not None:
        return 0
    calc, reg = calculus(expr), program.register_tile
    sectors = warp_sectors(expr, device, program.unit_tile, reg, program.vthreads)
    shapes, tiles = calc.data_tiles(reg), calc.num_tiles(reg)
    extra = 0
    for (touched, needed), shape, tensor in zip(sectors, shapes, expr.inputs):
        if touched > needed:
            extra += tiles * prod(shape) * tensor.itemsize * (touched - needed) // needed
    return extra


@lru_cache(maxsize=65536)
def shared_wavefronts(expr: TensorExpr, device: DeviceSpec, block, reg, vthreads) -> tuple[int, int]:
    """(wavefronts, requests) of the first warp of a GPU block tile `block` reading its
    threads' register tiles `reg` of every input from shared memory (bank padding included),
    each thread's tile split into per-axis `vthreads`: counted exactly from the 32 lane
    addresses (`construct.banks`) under the CUDA template's binding, one thread per register
    tile along each spatial axis. wavefronts == requests when conflict-free."""
    calc, smem = calculus(expr), device.layers[device.unit_layer_index]
    threads = tuple(b // r if a in expr.spatial else 1 for a, (b, r) in enumerate(zip(block, reg)))
    binding = ThreadBinding(threads, reg, vthreads)
    shapes, pads = calc.data_tiles(block), storage_padding(calc, device, device.unit_layer_index, block, reg)
    served = reqs = 0
    for t, tensor in enumerate(expr.tensors):
        if tensor.role != "input":
            continue
        tile = stored_tile([c for c, _ in tensor.index], shapes[t], pads[t], tensor.itemsize)
        served += wavefronts(tile, binding, smem.banks, smem.bank_width_bytes, device.warp_size)
        reqs += requests(tile, binding)
    return served, reqs


def estimate(program: RProgram, device: DeviceSpec) -> Estimate:
    """Predicted time and its parts for `program` on `device`."""
    expr = program.expr
    calc = calculus(expr)
    footprints = tuple(footprint_at(device, program, l) for l in range(len(program.tiles)))
    threads, bpu = blocks_per_unit(program, device)
    units = device.compute_units
    busy = min(1.0, program.grid / units)
    n_waves = waves(program.grid, units * bpu)
    quantization = ceil(program.grid / units) * units / program.grid if program.grid >= units else 1.0

    volume = prod(calc.extents)
    padded = calc.padded_volume(program.unit_tile)
    padded_flops = int(expr.flops * padded / volume)
    eff = compute_efficiency(program, device, threads, bpu)
    compute = padded_flops / (peak_gflops(expr, device) * GB * busy * eff) * guard_slowdown(program, device)

    loads: dict[str, float] = {}
    moved: dict[str, int] = {}
    through = hardware_caches(program, device)
    scalar = scalar_row(program, device)
    for layer, tile in enumerate(program.tiles):
        if not through.cached[layer]:
            continue
        src = device.layers[source_layer(through, layer, len(device.layers))]
        q = cache_traffic(program, device, layer) + (uncoalesced_bytes(program, device) if layer == 0 else 0)
        moved[src.name] = moved.get(src.name, 0) + q
        loads[src.name] = loads.get(src.name, 0.0) + transfer_seconds(through, device, layer, q, scalar) / busy
    if device.runs_on_cpu and len(program.tiles) > 1 and expr.reduce:
        at = accumulator_home(program, device)
        home = device.layers[at]
        q = calc.accumulator_bytes(program.register_tile, accumulator_steps(program),
                                   partial_sums(expr, device, program.register_tile)) + buffer_bytes(program, device)
        moved[home.name] = moved.get(home.name, 0) + q
        loads[home.name] = loads.get(home.name, 0.0) + q / (layer_gbps(program, device, at) * GB * busy)
    stages = {"compute": compute, **loads}
    bottleneck = max(stages, key=stages.get)
    core = combine_stages(through, device, compute, loads)
    packed = packed_bytes(program, device)
    packing = _copy_seconds(program, device, packed)
    if packed:
        stage = f"packing into {device.layers[cpu_plan(program, device).pack_layer].name}"
        moved[stage], loads[stage] = packed, packing
    occupancy = 1.0 if not device.has_occupancy_limits else min(1.0, threads * bpu / device.max_threads_per_unit)
    tree = tree_reduction_seconds(program, device, threads, n_waves)
    return Estimate(
        flops=expr.flops,
        padded_flops=padded_flops,
        bytes_per_layer=tuple(moved.items()),
        load_seconds=tuple(loads.items()),
        compute_seconds=compute,
        threads=threads,
        blocks_per_unit=bpu,
        waves=n_waves,
        occupancy=occupancy,
        bottleneck=bottleneck,
        predicted_seconds=core * quantization + tree + split_k_seconds(program, device) + packing,
        footprints=footprints,
        reduction_seconds=tree,
        **provenance(program, device, bool(packed)),
    )


def packed_bytes(program: RProgram, device: DeviceSpec) -> int:
    """Bytes the busiest core writes into panels: the plan's packed inputs (`CpuPlan.packed`)
    at its pack layer's tile (`panels.packed_tile_bytes`), 0 where it packs none or on GPUs."""
    if not device.runs_on_cpu:
        return 0
    plan = cpu_plan(program, device)
    return packed_tile_bytes(program, device, plan.packed, plan.pack_layer) if plan.packed else 0


def packing_seconds(program: RProgram, device: DeviceSpec) -> float:
    """The CPU template's panel copies (`CpuPlan.packed`) on the busiest core: `packed_bytes` at
    `PACK_BYTES_PER_CYCLE` of that core's clock (`core_ghz`), or over its share of the pack
    layer's bandwidth where that is slower (the reads that fill the panel are the loads of the
    unit tile already). The copy runs between micro-kernel runs, so it adds to the unit's time,
    as the transfers below the first cache layer do (`combine_stages`)."""
    return _copy_seconds(program, device, packed_bytes(program, device))


def _copy_seconds(program: RProgram, device: DeviceSpec, moved: int) -> float:
    """`packing_seconds` of `moved` = `packed_bytes(program, device)` (computed once by `estimate`)."""
    if not moved:
        return 0.0
    layer = device.layers[cpu_plan(program, device).pack_layer]
    streamed = moved / (layer.bandwidth_gbps * GB / device.compute_units)
    ghz = core_ghz(device)
    return max(streamed, moved / (PACK_BYTES_PER_CYCLE * ghz * GB)) if ghz else streamed


def core_ghz(device: DeviceSpec) -> float:
    """A CPU core's clock as its fp32 peak implies: peak / (cores x FMA pipes x lanes x 2 flops);
    0 where the spec has no FMA pipes (Zen 5 EPYC, calibrated 508.6 GFLOP/s over 2 cores x 2
    pipes x 16 lanes: 3.97 GHz)."""
    if not device.runs_on_cpu or not device.fma_pipes:
        return 0.0
    return device.peak("float32") / (device.compute_units * device.fma_pipes * device.warp_size * 2)


def is_compute_bound(calc: TileCalculus, device: DeviceSpec, layer: int, tile, source: int) -> bool:
    """Roller's stop test MemPerf(T) > MaxComputePerf: with all units busy, loading the operator
    in tiles T from `source` takes no longer than computing it."""
    load = calc.traffic_bytes(tile) / (device.layers[source].bandwidth_gbps * GB)
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return load <= compute


def is_load_hidden(calc: TileCalculus, device: DeviceSpec, tile, source: int) -> bool:
    """Whether loading the operator in tiles T from `source` takes no longer than the operator's
    floor: computing it, or moving each byte of it once from the bottom layer (its compulsory
    traffic, the whole operator as one tile). Roller's stop test (`is_compute_bound`) is the
    case where compute is the floor; for an operator bound by its compulsory traffic (gemv reads
    its matrix once, however it is tiled) a cache tile's loads from the layer below hide under
    that stream as well, and growing it to cut them gains nothing."""
    bottom = device.layers[-1]
    compulsory = calc.traffic_bytes(tuple(calc.extents)) / (bottom.bandwidth_gbps * GB)
    load = calc.traffic_bytes(tile) / (device.layers[source].bandwidth_gbps * GB)
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return load <= max(compute, compulsory)
