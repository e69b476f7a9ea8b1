"""Micro-performance model (Roller §3.3): an `Estimate` computed only from (rProgram, device);
the program carries its expression. `estimate` prices what every target shares (padded flops,
the scale-out over the units) and hands the rest to the target's pricing once: `model.cpu`
(with `model.cpu_compute`) or `model.gpu` (with `rtile.occupancy`).

An rProgram is a pipeline (Figure 6): at each layer its tile is loaded from the layer below, and
the register tile is computed. Roller lets the stages overlap, so the program runs at the speed of
its slowest stage (the bottleneck); here they overlap only as far as the hardware and the
template let them (`cpu.combine_stages`, `gpu.gpu_stages`):

- load time of layer l   = Q(tile_l) / bandwidth of the layer it is loaded from   (§3.3 MemPerf;
                           on a CPU less where neighbouring cache tiles share what stays in the
                           layer: `cpu.cache_traffic`, in whole lines for the inputs a core reads
                           an element at a time: `cpu.scattered_inputs`; on a GPU more where a
                           program that stages nothing loads with a warp touching more sectors
                           than its bytes need: `gpu.uncoalesced_bytes`; a GPU's loads from global
                           memory at most at the rate its bytes in flight sustain over the
                           latency: `gpu.reachable_gbps`; a register tile's reads from shared
                           memory stretched or shortened by the bank conflicts its virtual threads
                           change: `gpu.vthread_conflict_ratio`)
- compute time           = flops on the padded iteration space / peak compute     (MaxComputePerf)
                           / the fraction of peak the register tile can reach (warps per
                           scheduler on a GPU; on a CPU `cpu_compute.compute_efficiency`: the SIMD
                           lanes its vectors fill times the FMA latency its accumulators cover, or,
                           where calibration measured the register micro-kernel, its measured share
                           of peak: Vortex's hybrid analyzer, level 0 measured and the levels above
                           modelled; slower where the CPU template guards the micro-kernel:
                           `cpu_compute.guard_slowdown`)
- accumulator trips (CPU) = the register tile's partial sums leaving the registers after each
                           reduction step of the first cache tile that holds more than one register
                           tile (`cpu.accumulator_steps`), to the layer that keeps them
                           (`cpu.accumulator_home`)

with every bandwidth and the peak scaled by the fraction of units the grid keeps busy (a shared
layer's bandwidth is split evenly over the units using it, §3.3). Scale-out (ALGORITHMS.md §1):
tiles are dealt round-robin over the units, so the busiest unit gets `ceil(grid / units)` tiles
while the balanced share is `grid / units`; the time is the balanced time times that ratio. The
resident tiles of a unit share its throughput, so blocks per unit raise compute efficiency
(enough warps per scheduler) rather than multiplying speed. `waves = ceil(grid / (units *
blocks per unit))` is reported as the number of rounds of resident blocks. A cross-thread
reduction adds, after its pipeline, the trees that combine its threads' partial sums, once per
wave (`gpu.tree_reduction_seconds`). A split-K program adds its partial sums' traffic and its
second kernel (`gpu.split_k_seconds`; on a CPU their sum on one core, `cpu.split_sum_seconds`,
its longest part setting the time, `part_imbalance`), a CPU program the copies of the inputs its
template packs into panels (`cpu.packing_seconds`) and the output lines two of its cores write, where the grid's
split between them falls inside the output's rows (`cpu.shared_output_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence
from math import ceil, prod

from workbench.hardware.spec import DeviceSpec
from workbench.rtile.model.cpu import price as cpu_price
from workbench.rtile.model.gpu import price as gpu_price
from workbench.rtile.rprogram import RProgram, footprint_at, split_axis, split_steps, waves
from workbench.rtile.traffic import calculus


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
    # a cross-thread reduction's trees over the threads of its blocks (`gpu.tree_reduction_seconds`)
    reduction_seconds: float = 0.0
    # which parts of the estimate were measured on the device and which modelled, one phrase each
    # (`common.provenance`)
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

    @classmethod
    def from_dict(cls, data: Mapping, layers: Sequence[str] = ()) -> "Estimate":
        """The estimate of `to_dict` read back (the runs store keeps each candidate's so, its keys
        sorted): the per-layer pairs in the order of the device's `layers` (top to bottom)."""
        order = {name: i for i, name in enumerate(layers)}

        def ordered(pairs: Mapping) -> tuple:
            return tuple(sorted(pairs.items(), key=lambda kv: order.get(kv[0], len(order))))

        return cls(data["flops"], data["padded_flops"], ordered(data["bytes_per_layer"]),
                   ordered(data["load_seconds"]), data["compute_seconds"], data["threads"],
                   data["blocks_per_unit"], data["waves"], data["occupancy"], data["bottleneck"],
                   data["predicted_seconds"], tuple(data["footprint_bytes"]), data.get("reduction_seconds", 0.0),
                   tuple(data.get("measured", ())), tuple(data.get("modelled", ())))


def part_imbalance(program: RProgram, device: DeviceSpec) -> float:
    """How much longer a CPU split program's longest part runs than an even share: parts walk
    `split_steps` whole steps of the split axis each, the last the rest, so of T steps in S
    parts the busiest walks ceil(T / S) where an even share is T / S (3 steps in 2 parts: 2 and
    1, 4/3 of the even share). A CPU splits only where its grid leaves cores idle, so its parts run at once,
    one a core, and the longest sets the time; a GPU's blocks of short parts give their SM to
    the next wave's blocks, which the waves priced as whole do not follow (1 there). 1 unsplit."""
    if program.split <= 1 or not device.runs_on_cpu:
        return 1.0
    axis = split_axis(program.expr, device)
    steps = ceil(program.expr.axes[axis].extent / program.unit_tile[axis])
    return split_steps(program, axis) * program.split / steps


def estimate(program: RProgram, device: DeviceSpec) -> Estimate:
    """Predicted time and its parts for `program` on `device`: the target's `Pricing`
    (`cpu.price` or `gpu.price`), scaled out over the units."""
    expr = program.expr
    calc = calculus(expr)
    footprints = tuple(footprint_at(device, program, l) for l in range(len(program.tiles)))
    units = device.compute_units
    busy = min(1.0, program.grid / units)
    quantization = ceil(program.grid / units) * units / program.grid if program.grid >= units else 1.0
    quantization *= part_imbalance(program, device)
    volume = prod(calc.extents)
    padded = calc.padded_volume(program.unit_tile)
    padded_flops = int(expr.flops * padded / volume)
    priced = (cpu_price if device.runs_on_cpu else gpu_price)(program, device, padded_flops, busy)
    predicted = priced.core * quantization
    for seconds in priced.after:
        predicted += seconds
    return Estimate(
        flops=expr.flops,
        padded_flops=padded_flops,
        bytes_per_layer=priced.moved,
        load_seconds=priced.loads,
        compute_seconds=priced.compute,
        threads=priced.threads,
        blocks_per_unit=priced.blocks_per_unit,
        waves=waves(program.grid, units * priced.blocks_per_unit),
        occupancy=priced.occupancy,
        bottleneck=priced.bottleneck,
        predicted_seconds=predicted,
        footprints=footprints,
        reduction_seconds=priced.reduction_seconds,
        measured=priced.measured,
        modelled=priced.modelled,
    )
