"""Micro-performance model (Roller §3.3): an `Estimate` computed only from (rProgram, device);
the program carries its expression.

An rProgram is a pipeline (Figure 6): at each layer its tile is loaded from the layer below, and
the register tile is computed. The stages overlap, so the program runs at the speed of its
slowest stage (the bottleneck):

- load time of layer l   = Q(tile_l) / bandwidth of the layer it is loaded from   (§3.3 MemPerf)
- compute time           = flops on the padded iteration space / peak compute     (MaxComputePerf)
                           / the fraction of peak the register tile can reach (`compute_efficiency`:
                           warps per scheduler on a GPU; on a CPU the SIMD lanes its vectors fill
                           times the FMA latency its accumulators cover)

with every bandwidth and the peak scaled by the fraction of units the grid keeps busy (a shared
layer's bandwidth is split evenly over the units using it, §3.3). Scale-out (ALGORITHMS.md §1):
tiles are dealt round-robin over the units, so the busiest unit gets `ceil(grid / units)` tiles
while the balanced share is `grid / units`; the time is the balanced time times that ratio. The
resident tiles of a unit share its throughput, so blocks per unit raise compute efficiency
(enough warps per scheduler) rather than multiplying speed. `waves = ceil(grid / (units *
blocks per unit))` is reported as the number of rounds of resident blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.alignment import accumulators, lane_axis, mma_axes, simd_vectors, thread_count, tile_lanes
from workbench.rtile.rprogram import RProgram, footprint_at, waves
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
        }


def source_layer(program: RProgram, layer: int, n_layers: int) -> int:
    """The layer a tile is loaded from: the next cached layer below, or the bottom."""
    for below in range(layer + 1, len(program.tiles)):
        if program.cached[below]:
            return below
    return n_layers - 1


def blocks_per_unit(program: RProgram, device: DeviceSpec) -> tuple[int, int]:
    """(threads per block, blocks resident per unit). GPUs: limited by threads, registers and
    shared memory (the per-block capacity is used as the per-SM budget: conservative); CPUs run
    one work item per core at a time."""
    if not device.has_occupancy_limits:
        return 1, 1
    threads = thread_count(program.expr, program.unit_tile, program.register_tile, tile_lanes(program.expr, device))
    regs = max(1, footprint_at(device, program, 0) // 4)
    smem = max(1, footprint_at(device, program, device.unit_layer_index))
    unit_layer = device.layers[device.unit_layer_index]
    by_threads = device.max_threads_per_unit // threads
    by_regs = device.registers_per_unit // (threads * regs)
    by_smem = unit_layer.capacity_bytes // smem
    return threads, max(1, min(by_threads, by_regs, by_smem))


def compute_efficiency(program: RProgram, device: DeviceSpec, threads: int, bpu: int) -> float:
    """Fraction of peak the register tile can reach. GPU: each warp scheduler needs a warp
    (TEU group). CPU: `simd_utilisation` x `latency_coverage` of the register micro-kernel."""
    if device.lanes_are_threads:
        warps = ceil(threads / device.warp_size) * bpu
        return min(1.0, warps / device.teu_per_unit)
    return simd_utilisation(program.expr, device, program.register_tile) * latency_coverage(
        program.expr, device, program.register_tile
    )


def simd_utilisation(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the vector lanes a CPU register tile fills. The peak counts every lane of
    every FMA; a tile of `size` values along the `lane_axis` issues `simd_vectors` whole
    vectors for them, so it fills `size / (vectors x lanes)` of the lanes (a 12-wide fp32 row on
    8-lane AVX2: 12 / 16). An operator with no lane axis (its output row a gather, a stride-2
    conv) runs scalar code: one lane of `register_bytes / itemsize`."""
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


def peak_gflops(expr: TensorExpr, device: DeviceSpec) -> float:
    """MaxComputePerf: the MMA units' peak for tensor-core programs, else the ALUs'."""
    return device.peak(expr.dtype, tensor_core=mma_axes(expr, device) is not None)


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
    compute = padded_flops / (peak_gflops(expr, device) * GB * busy * eff)

    loads: dict[str, float] = {}
    moved: dict[str, int] = {}
    for layer, tile in enumerate(program.tiles):
        if not program.cached[layer]:
            continue
        src = device.layers[source_layer(program, layer, len(device.layers))]
        q = calc.traffic_bytes(tile)
        moved[src.name] = moved.get(src.name, 0) + q
        loads[src.name] = loads.get(src.name, 0.0) + q / (src.bandwidth_gbps * GB * busy)
    stages = {"compute": compute, **loads}
    bottleneck = max(stages, key=stages.get)
    occupancy = 1.0 if not device.has_occupancy_limits else min(1.0, threads * bpu / device.max_threads_per_unit)
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
        predicted_seconds=stages[bottleneck] * quantization,
        footprints=footprints,
    )


def is_compute_bound(calc: TileCalculus, device: DeviceSpec, layer: int, tile, source: int) -> bool:
    """Roller's stop test MemPerf(T) > MaxComputePerf: with all units busy, loading the operator
    in tiles T from `source` takes no longer than computing it."""
    load = calc.traffic_bytes(tile) / (device.layers[source].bandwidth_gbps * GB)
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return load <= compute
