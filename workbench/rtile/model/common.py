"""What the CPU and GPU pricing share: where a layer's tile is loaded from, the bandwidth of
that layer, the peak compute, Roller's stop tests, and the `Pricing` each target hands to
`rtile.model.estimate`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from workbench.hardware.spec import LLC_FILL, DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import mma_axes
from workbench.rtile.rprogram import RProgram
from workbench.rtile.traffic import TileCalculus, calculus

GB = 1e9


@dataclass(frozen=True)
class Pricing:
    """One target's price of a program, before the scale-out that `estimate` applies: the compute
    term, bytes and seconds per source layer (in the order they were priced), the slowest stage,
    one unit's time with the stages combined (`core`), and the seconds added after the
    scale-out, in order (`after`)."""

    compute: float
    moved: tuple[tuple[str, int], ...]
    loads: tuple[tuple[str, float], ...]
    bottleneck: str
    core: float
    after: tuple[float, ...]
    threads: int = 1
    blocks_per_unit: int = 1
    occupancy: float = 1.0
    reduction_seconds: float = 0.0
    measured: tuple[str, ...] = ()
    modelled: tuple[str, ...] = ()


def partial_sum_bytes(program: RProgram) -> int:
    """Bytes a split-K program (`RProgram.split` = S > 1) moves beyond the unsplit one's, O the
    output's bytes: its parts store S x O partial sums where the unsplit program stores O, and
    their sum reads the S x O back and writes the O results, (S - 1) O + S O + O. Partial sums
    have the output's dtype (TVM's rfactor buffer). 0 for unsplit programs."""
    split = program.split
    if split <= 1:
        return 0
    out = program.expr.output
    size = out.nbytes
    return (split - 1) * size + split * size + size


def hardware_caches(program: RProgram, device: DeviceSpec) -> RProgram:
    """`program` as its data moves: on a GPU through the layers it stages (`cached`); on a CPU
    through every cache layer, which the hardware fills whatever the program stages. A CPU
    program whose L1 and L2 tiles Roller left uncached (no reuse to stage: a pooling) still reads
    through them, its register tiles' neighbours sharing lines in the L1 and its transfers from
    L2 and DRAM adding to the compute rather than hiding it (`cpu.combine_stages`; evidence:
    docs/model-evidence.md#hardware-caches)."""
    if not device.runs_on_cpu or all(program.cached):
        return program
    return replace(program, cached=(True,) * len(program.cached))


def source_layer(program: RProgram, layer: int, n_layers: int) -> int:
    """The layer a tile is loaded from: the next cached layer below, or the bottom."""
    for below in range(layer + 1, len(program.tiles)):
        if program.cached[below]:
            return below
    return n_layers - 1


def peak_gflops(expr: TensorExpr, device: DeviceSpec) -> float:
    """MaxComputePerf: the MMA units' peak for tensor-core programs, else the ALUs'."""
    return device.peak(expr.dtype, tensor_core=mma_axes(expr, device) is not None)


def layer_gbps(program: RProgram, device: DeviceSpec, layer: int) -> float:
    """Bandwidth of `program`'s reads from `layer`: the spec's, except from the bottom layer of a
    CPU with a last-level cache (`DeviceSpec.llc_bytes`) whose operator fits in LLC_FILL of it,
    every tensor once (its compulsory bytes): from the second run on those reads hit the L3, at
    `llc_gbps`. A timing repeats the kernel on the same tensors, and a model's next kernel reads
    what the last one wrote (evidence: docs/model-evidence.md#layer-gbps)."""
    spec = device.layers[layer]
    if not device.runs_on_cpu or layer != len(device.layers) - 1 or not stays_in_llc(program.expr, device):
        return spec.bandwidth_gbps
    return max(spec.bandwidth_gbps, device.llc_gbps)


def past_llc(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether the device names a last-level cache (`DeviceSpec.llc_bytes`) and the operator
    does not stay in it (`stays_in_llc`): its reads from the bottom layer come from DRAM."""
    return bool(device.llc_bytes) and not stays_in_llc(expr, device)


def stays_in_llc(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether an operator's tensors, every one once (its compulsory bytes), fit in LLC_FILL of
    the device's last-level cache (`DeviceSpec.llc_bytes`; False without one): from its second
    run on, its reads from the bottom layer hit that cache."""
    if not device.llc_bytes:
        return False
    return calculus(expr).compulsory_bytes() <= device.llc_bytes * LLC_FILL


def is_compute_bound(calc: TileCalculus, device: DeviceSpec, layer: int, tile, source: int) -> bool:
    """Roller's stop test MemPerf(T) > MaxComputePerf: with all units busy, loading the operator
    in tiles T from `source` takes no longer than computing it."""
    load = calc.traffic_bytes(tile) / (device.layers[source].bandwidth_gbps * GB)
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return load <= compute


@lru_cache(maxsize=1024)
def is_stream_bound(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether a CPU operator's floor is the stream of its inputs from DRAM: its tensors do not
    stay in the last-level cache (LLC_FILL of it, `layer_gbps`) and reading each input byte once
    from the bottom layer takes longer than computing it (a matmul of 5 rows over a 51 MB B; not
    roller-table1's M0, 65536 x 1024 over K = 2, whose inputs are 0.5 MB and whose floor is
    writing its output). Cached, as `axes.lane_axis` is: every CPU estimate of a packed program
    asks (`cpu.packed_runs`)."""
    if not device.runs_on_cpu:
        return False
    if stays_in_llc(expr, device):
        return False
    calc = calculus(expr)
    extents = tuple(calc.extents)
    inputs = sum(calc.input_bytes(calc.data_tiles(extents)))
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return inputs / (device.layers[-1].bandwidth_gbps * GB) > compute


def is_load_hidden(calc: TileCalculus, device: DeviceSpec, tile, source: int) -> bool:
    """Whether loading the operator in tiles T from `source` takes no longer than the operator's
    floor: computing it, or moving each byte of it once from the bottom layer (its compulsory
    traffic, the whole operator as one tile). Roller's stop test (`is_compute_bound`) is the
    case where compute is the floor; for an operator bound by its compulsory traffic (gemv reads
    its matrix once, however it is tiled) a cache tile's loads from the layer below hide under
    that stream as well, and growing it to cut them gains nothing."""
    bottom = device.layers[-1]
    compulsory = calc.compulsory_bytes() / (bottom.bandwidth_gbps * GB)
    load = calc.traffic_bytes(tile) / (device.layers[source].bandwidth_gbps * GB)
    compute = calc.expr.flops / (peak_gflops(calc.expr, device) * GB)
    return load <= max(compute, compulsory)


def provenance(
    program: RProgram, device: DeviceSpec, compute: tuple[bool, str], packed: bool,
) -> dict[str, tuple[str, ...]]:
    """`Estimate.measured` and `Estimate.modelled`: the compute term as the target says
    (`compute`: whether it was measured, and its phrase), and where it was modelled the peak,
    measured where the spec is calibrated, else the spec's; the bandwidths likewise; the traffic
    per layer and the scale-out over the units always modelled (the levels above level 0), and
    the panel copies where the CPU template makes them (`packed`: `packed_bytes` > 0)."""
    measured, modelled = [], []
    calibrated = "calibrated" if device.calibrated else "the spec's, not calibrated"
    was_measured, phrase = compute
    if was_measured:
        measured.append(phrase)
    else:
        modelled.append(phrase)
        (measured if device.calibrated else modelled).append(f"peak compute ({calibrated})")
    through = hardware_caches(program, device)
    sources = sorted({source_layer(through, l, len(device.layers)) for l, c in enumerate(through.cached) if c})
    llc = [l for l in sources if layer_gbps(program, device, l) != device.layers[l].bandwidth_gbps]
    if names := ", ".join(device.layers[l].name for l in sources if l not in llc):
        (measured if device.calibrated else modelled).append(f"bandwidth of {names} ({calibrated})")
    if llc:  # the L3 serves the bottom layer's reads; its bandwidth measured only where calibrated with it
        how = dict(device.sources).get("llc_gbps", "")
        line = (f"bandwidth of the {device.llc_bytes / 2**20:g} MiB last-level cache, which serves "
                f"{device.layers[llc[0]].name}'s reads: the operator fits in {LLC_FILL:.0%} of it")
        (measured if how.startswith("measured") else modelled).append(line)
    modelled.append("traffic per layer")
    if packed:
        modelled.append("panel copies of the packed inputs")
    modelled.append(f"scale-out over {device.compute_units} {'cores' if device.runs_on_cpu else 'units'}")
    return {"measured": tuple(measured), "modelled": tuple(modelled)}
