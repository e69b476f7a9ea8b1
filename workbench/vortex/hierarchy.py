"""Vortex's hardware hierarchy (the paper's Table 1) as candidate rPrograms, without shape samples.

Levels, top first, each a tile of the expression's axes (`rtile.rprogram`):

- level 0, the register micro-kernel: on a CPU the register tiles the alignment rules allow
  (SIMD lanes along the `lane_axis`, enough FMA accumulators, within the vector registers),
  preferring those the device's calibration measured (`DeviceSpec.micro_kernels`); on a GPU a
  thread's register tile (Roller's register steps) or the warp's MMA fragment tile.
- level 1, one unit's work: on a CPU a core's L1 and then L2 tiles (the cache buffers of one
  thread of TVM's pool); on a GPU the thread block's shared-memory tile (whole warps, at most
  `max_threads_per_block` threads, within shared memory). Every tile is an integer multiple of
  the tile one layer up within that layer's capacity (`filter_by_multiples`); along the dynamic
  axis any multiple up to `DYN_MULTIPLES` (its padding step), along the others `MULTIPLIERS`.
  A CPU's L1 tile over a reduction's micro-kernel is the one tile BLIS would take, the
  micro-kernel's rows and columns over the deepest reduction L1 holds (`deepest_reduction`).
- level 2, the parallel level: the grid of unit tiles over the cores / SMs. Only here does the
  dynamic axis pad: its extent is rounded up to whole unit tiles (`analyzer.padded_extent`).

Beside those, on a CPU, one family for the smallest values (`single_row_tiles`): one index of
the dynamic axis at every level, so the template packs nothing (`codegen/cpu.py` packs an
input only where the unit tile spans more than one index of an axis it ignores) and a GEMM of
one row streams B once, as BLAS's GEMV does, where a 6-row kernel pads to 6 rows and copies
all of B into panels first (the BERT GEMM at M = 1: 300 us against numpy's 65). Its unit tiles
cut the static axes into one or two tiles per core as well (`_balanced_multiples`), and beside
the 1 x lanes register tiles it holds Roller's own programs for one row (`constructed_rows`).

Loops are classified as Vortex classifies them (`loop_class`): spatial loops of the grid are
parallel, spatial loops inside a unit temporal-spatial, reduce loops temporal-reduction; the
analyzer's cost is the temporal cost of one unit times the parallel waves.

The tiles are chosen on a template expression whose dynamic axis has the declared upper bound
as its extent; the rules that judge padding (`TensorShapeRule`) do not judge the dynamic axis,
whose padding the analyzer prices per value instead.
"""

from __future__ import annotations

from itertools import product
from math import ceil, prod

from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.hardware.registers import register_budget
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.alignment import RULES
from workbench.rtile.axes import is_micro_kernel_layer, lane_axis, tile_lanes
from workbench.rtile.model import estimate
from workbench.rtile.model.cpu_compute import latency_coverage, micro_kernel_shape, simd_utilisation
from workbench.rtile.registers import accumulators, micro_kernel_registers, thread_count
from workbench.rtile.rprogram import RProgram, layer_capacity, layer_footprint, make_program, storage_padding
from workbench.rtile.rules import AlignContext, TensorShapeRule
from workbench.rtile.traffic import calculus
from workbench.vortex.analyzer import at_extent

Tile = tuple[int, ...]

# Register-tile sizes tried per axis at level 0 (every size a micro-kernel of up to 32 vector
# registers can have along its rows, and whole vectors of 8 or 16 lanes along the lane axis);
# the rules keep the aligned ones.
LEVEL0_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 16, 24, 32, 48, 64)
# Per-axis multiples from one level to the next (`filter_by_multiples`): powers of two and
# their 1.5x, so tiles of 3 x 2^n rows (BERT's 768, 2304) are reachable.
MULTIPLIERS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Along the dynamic axis every integer multiple up to this: that axis pads to whole outer
# tiles, so each step of its outer tile is a padding granularity the cover can choose
# (6 x 22 = 132 rows pad 257 to 264 where 6 x 24 pads it to 288).
DYN_MULTIPLES = 64
KEEP_LEVEL0 = 4  # register micro-kernels kept (the most efficient, one per size along the dynamic axis)
KEEP_PER_SIZE = 2  # tiles kept per level and per size along the dynamic axis (least predicted time)
CONSTRUCTED_ROWS = 3  # Roller's programs for one row offered beside the single-row family (`constructed_rows`)
# Padding allowed on the static axes, tried in order until a level has candidates (Roller's eps).
EPS_LADDER = (0.0, 0.25, 1.0)

PARALLEL, TEMPORAL_SPATIAL, TEMPORAL_REDUCTION = "parallel", "temporal-spatial", "temporal-reduction"


def loop_class(expr: TensorExpr, axis: int, parallel_level: bool) -> str:
    """Vortex's loop classes: a spatial loop of the grid over the units is parallel, one inside
    a unit temporal-spatial; a reduce loop is temporal-reduction at every level."""
    if expr.axes[axis].kind == "reduce":
        return TEMPORAL_REDUCTION
    return PARALLEL if parallel_level else TEMPORAL_SPATIAL


def unit_levels(device: DeviceSpec) -> range:
    """The memory layers a candidate has a tile at: registers down to the unit's last layer
    (CPU: registers, L1, L2; GPU: registers, shared memory)."""
    return range(device.unit_layer_index + 1)


def _aligned(expr: TensorExpr, device: DeviceSpec, layer: int, upper: Tile, tile: Tile, dyn: int, eps: float) -> bool:
    """The alignment rules at `layer`, but no padding judgement of the dynamic axis."""
    ctx = AlignContext(expr, device, layer, upper, eps)
    for rule in RULES:
        for a, size in enumerate(tile):
            if a == dyn and isinstance(rule, TensorShapeRule):
                continue
            if not rule.axis_ok(ctx, a, size):
                return False
        if not rule.tile_ok(ctx, tile):
            return False
    return True


def _fits(expr: TensorExpr, device: DeviceSpec, layer: int, upper: Tile, tile: Tile) -> bool:
    calc = calculus(expr)
    padding = storage_padding(calc, device, layer, tile, upper)  # bank padding, as make_program adds it
    if layer_footprint(calc, device, layer, tile, padding) > layer_capacity(device, layer):
        return False
    if device.is_thread_block_layer(layer):
        return thread_count(expr, tile, upper, tile_lanes(expr, device)) <= device.max_threads_per_block
    return True


def _within(expr: TensorExpr, axis: int, size: int, base: int) -> bool:
    """A size no larger than one tile covering the axis (the dynamic axis: its upper bound)."""
    extent = expr.axes[axis].extent
    return size <= ceil(extent / base) * base


def filter_by_multiples(expr: TensorExpr, device: DeviceSpec, layer: int, upper: Tile, dyn: int,
                        eps: float, balanced: bool = False) -> list[Tile]:
    """Vortex's FilterByMultiples: the tiles at `layer` whose every axis is an integer multiple
    (`MULTIPLIERS`) of the tile one level up, aligned at `layer` and within its capacity; over a
    CPU's register micro-kernel of a reduction, the one deepest tile of `deepest_reduction`.
    With `balanced` (the single-row family, whose grid is its static axes' alone), a static
    spatial axis also takes the multiples that cut it into one or two tiles per unit
    (`_balanced_multiples`)."""
    if deepens_reduction(expr, device, layer):
        return deepest_reduction(expr, device, layer, upper, dyn, eps)
    options = [
        [base * m for m in (range(1, DYN_MULTIPLES + 1) if a == dyn else
                            _balanced_multiples(expr, device, a, base) if balanced else MULTIPLIERS)
         if _within(expr, a, base * m, base)]
        for a, base in enumerate(upper)
    ]
    return [t for t in product(*options)
            if _aligned(expr, device, layer, upper, t, dyn, eps) and _fits(expr, device, layer, upper, t)]


def _balanced_multiples(expr: TensorExpr, device: DeviceSpec, axis: int, base: int) -> list[int]:
    """`MULTIPLIERS`, and along a spatial axis the multiples of `base` that cut it into one or
    two tiles per unit: a one-row GEMM's grid is its columns' alone, and the BERT GEMM's 2,304
    columns in 64-column steps offered 768 (three tiles on two cores: two waves, the second
    half idle) or 384 (six, three waves), never 1,152."""
    if expr.axes[axis].kind != "spatial":
        return list(MULTIPLIERS)
    extent, units = expr.axes[axis].extent, device.compute_units
    return sorted(set(MULTIPLIERS) | {ceil(extent / (k * units * base)) for k in (1, 2)})


def deepens_reduction(expr: TensorExpr, device: DeviceSpec, layer: int) -> bool:
    """Whether `layer` is a CPU's first cache layer over a reduction's register micro-kernel."""
    return bool(expr.reduce) and layer == 1 and is_micro_kernel_layer(device, 0)


def deepest_reduction(expr: TensorExpr, device: DeviceSpec, layer: int, upper: Tile, dyn: int,
                      eps: float) -> list[Tile]:
    """The first cache tile over a CPU's register micro-kernel, as BLIS sizes its kc (our rule,
    as Roller's CPU rule in `construct/roller.py`): the spatial axes the smallest multiple of
    the micro-kernel aligned at the layer (whole cache lines: a 24-lane tile of fp32 becomes 48),
    the reduce axes the deepest multiple that is aligned and fits beside it. The CPU template
    keeps a register tile's accumulators in registers only over one such tile's reduction
    (`TileCalculus.accumulator_bytes`), so every shorter tile sends the output through the cache
    again, a load before the first FMA and a store after the last; spatial growth here only
    takes room the reduction could use, and the spatial blocking is the next layer's (multiples
    of this tile). The model prices those trips as bandwidth that overlaps the FMAs, so it cannot
    be left to choose the depth (evidence: docs/evidence.md#hierarchy-deepest-reduction).
    [] when nothing fits."""
    reduce = set(expr.reduce)
    spatial = [
        [base] if a in reduce else [base * m for m in MULTIPLIERS if _within(expr, a, base * m, base)]
        for a, base in enumerate(upper)
    ]
    depths = [
        [base * m for m in range(1, ceil(expr.axes[a].extent / base) + 1)] if a in reduce else [None]
        for a, base in enumerate(upper)
    ]
    for shape in sorted(product(*spatial), key=lambda t: (prod(t), t)):
        tiles = [t for d in product(*depths) for t in [tuple(s if x is None else x for s, x in zip(shape, d))]
                 if _aligned(expr, device, layer, upper, t, dyn, eps) and _fits(expr, device, layer, upper, t)]
        if tiles:
            return [max(tiles, key=lambda t: (prod(t[a] for a in reduce), t))]
    return []


def register_tiles(expr: TensorExpr, device: DeviceSpec, dyn: int, eps: float) -> list[Tile]:
    """Level 0: the aligned register tiles within the register budget, the most efficient
    first, at most `KEEP_LEVEL0`, one per size along the dynamic axis. Efficiency: the measured
    micro-kernel's share of peak where calibration measured it (only measured ones are kept
    when any fits), else SIMD lanes filled x FMA latency covered (`rtile.model`), then on a CPU
    the fewest loads and broadcasts per FMA (`_memory_ops_per_fma`); on a GPU all tiles are
    equal there and the least traffic (most reuse) decides. On a CPU only rows of whole cache
    lines along the lanes, where any tile has them (`_whole_lines`)."""
    ones = tuple(1 for _ in expr.axes)
    sizes = [[s for s in LEVEL0_SIZES if _within(expr, a, s, 1)] for a in range(len(expr.axes))]
    tiles = [t for t in product(*sizes)
             if _aligned(expr, device, 0, ones, t, dyn, eps) and _fits(expr, device, 0, ones, t)]
    tiles = [t for t in tiles if _whole_lines(expr, device, t)] or tiles
    measured = {t: _measured_share(expr, device, t) for t in tiles}
    if any(v is not None for v in measured.values()):
        tiles = [t for t in tiles if measured[t] is not None]
    calc = calculus(expr)

    def key(t: Tile) -> tuple:
        if measured[t] is not None:
            share = measured[t]
        elif is_micro_kernel_layer(device, 0):
            share = simd_utilisation(expr, device, t) * latency_coverage(expr, device, t)
        else:
            share = 1.0
        if not is_micro_kernel_layer(device, 0):
            return (-round(share, 9), 0.0, calc.traffic_bytes(t), 0, t)
        regs = micro_kernel_registers(expr, device, t)
        return (-round(share, 9), round(_memory_ops_per_fma(expr, device, t), 9), calc.traffic_bytes(t), regs, t)

    return _one_per_size(sorted(tiles, key=key), dyn, KEEP_LEVEL0)


def _whole_lines(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> bool:
    """Whether a CPU register tile's row along a spatial `lane_axis` is whole first-layer cache
    lines (or the whole axis); true for any other tile. Our rule, from measurement, its cause not
    established: rows of partial lines ran slower than the model rates them (evidence:
    docs/evidence.md#hierarchy-whole-lines). On AVX-512 a vector is a whole 64 B line, so
    nothing changes there."""
    v = lane_axis(expr, device)
    if not is_micro_kernel_layer(device, 0) or v is None or expr.axes[v].kind != "spatial" or len(device.layers) < 2:
        return True
    line = device.layers[1].transaction_bytes
    return tile[v] == expr.axes[v].extent or tile[v] * expr.output.itemsize % line == 0


def _memory_ops_per_fma(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> float:
    """Vector loads and broadcasts a CPU register tile issues per vector FMA: each input's data
    tile in vectors where the `lane_axis` indexes it, else element by element (broadcasts), over
    accumulators x the reduce tile. The unmodelled difference between tiles of equal share: an
    uncalibrated 8 x 8 fp32 tile on AVX2 (1 load + 8 broadcasts for 8 FMAs) fills the FMA pipes
    in the model as 6 x 16 does (2 + 6 for 12), but a core issues loads on 2 ports and FMAs on 2
    pipes, so the first waits on its loads (one reason BLAS's AVX2 kernel is 6 x 16)."""
    lane = lane_axis(expr, device)
    shapes = calculus(expr).data_tiles(tuple(tile))
    ops = 0.0
    for t, tensor in enumerate(expr.tensors[:-1]):
        elements = prod(shapes[t])
        vector = lane is not None and tensor.uses_axis(lane)
        ops += elements * tensor.itemsize / device.register_bytes if vector else elements
    steps = prod(tile[a] for a in expr.reduce) if expr.reduce and (lane is None or lane not in expr.reduce) else 1
    return ops / max(1, accumulators(expr, device, tile) * steps)


def single_row_tiles(expr: TensorExpr, device: DeviceSpec, dyn: int, eps: float) -> list[Tile]:
    """Level 0 of the single-row family (module docstring): on a CPU reduction whose SIMD lanes
    run along a spatial axis other than the dynamic one, the register tile of one index along
    every other axis and, along the lanes, the fewest whole vectors that hold the device's
    `fma_accumulators` and are aligned at `eps`: 1 x 64 on AVX2 with 8 needed, 1 x 96 with 10
    (80 does not divide N = 2304), 1 x 128 on AVX-512. [] elsewhere or when none fits.

    Its register count is ours, not `micro_kernel_registers`: that one holds a row of B's
    vectors for the tile's rows to share, but with one row each vector of B feeds one FMA and
    is dead after it (an FMA may even take it from memory), so the tile needs its accumulators,
    the broadcast of A and one vector in flight: 8 + 2 of AVX2's 16 registers for 1 x 64, where
    the shared-row count (17) refuses it."""
    if not _has_single_row(expr, device, dyn):
        return []
    v = lane_axis(expr, device)
    need, budget, lanes = max(1, device.fma_accumulators), register_budget(device), device.warp_size
    ones = tuple(1 for _ in expr.axes)
    for size in range(lanes, expr.axes[v].extent + 1, lanes):
        tile = ones[:v] + (size,) + ones[v + 1:]
        held = accumulators(expr, device, tile)
        if held + 2 > budget:
            return []
        if held >= need and _aligned(expr, device, 0, ones, tile, dyn, eps):
            return [tile]
    return []


def _has_single_row(expr: TensorExpr, device: DeviceSpec, dyn: int) -> bool:
    """Whether `expr` has a single-row family on `device`: a CPU reduction whose SIMD lanes run
    along a spatial axis other than the dynamic one."""
    v = lane_axis(expr, device)
    return (is_micro_kernel_layer(device, 0) and bool(expr.reduce) and v is not None and v != dyn
            and expr.axes[v].kind == "spatial")


def constructed_rows(expr: TensorExpr, device: DeviceSpec, dyn: int) -> list[tuple[Tile, ...]]:
    """The single-row family's other members: the tiles of Roller's top `CONSTRUCTED_ROWS`
    programs for one index of the dynamic axis (a construction, priced by the model, nothing
    measured), each one row along it at every level. Their register tiles walk several rows of
    the reduction at a time, so a GEMM of one row reads B in long runs of rows with their first
    misses outstanding together (`model.cpu.stream_rounds`), where `single_row_tiles`'s 1 x 64
    starts a run for every row of B. Over the eight shapes of two random draws (docs/benchmarks.md,
    "Dynamic shapes") M = 1 ran 1.3-5.7x numpy's time before them: the 1 x 64 kernel on five, a
    6-row kernel on three, where the model, pricing the 1 x 64 tile's runs at DRAM's latency
    though B stayed in the last-level cache, kept none (369 x 11468: 896 us, Roller's rank 1 at
    one row 157, numpy 162). Constructed without split-K: a bundle's kernels run unsplit, and a
    tile sized to be split over the cores would leave one idle. [] where there is no single-row
    family."""
    if not _has_single_row(expr, device, dyn):
        return []
    one = at_extent(expr, expr.axes[dyn].name, 1)
    built = construct(one, device, "roller", Options(topk=CONSTRUCTED_ROWS, split_k=False))
    levels = len(unit_levels(device))
    return [tuple(c.program.tiles) for c in built.candidates
            if len(c.program.tiles) == levels and all(len(t) == len(expr.axes) and t[dyn] == 1 for t in c.program.tiles)]


def _measured_share(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> float | None:
    shape = micro_kernel_shape(expr, device, tile) if device.micro_kernels and not device.lanes_are_threads else None
    kernel = device.micro_kernel(expr.dtype, *shape) if shape else None
    return None if kernel is None else kernel.gflops / device.peak(expr.dtype)


def _one_per_size(tiles: list[Tile], dyn: int, keep: int) -> list[Tile]:
    seen, out = set(), []
    for t in tiles:
        if t[dyn] not in seen:
            seen.add(t[dyn])
            out.append(t)
    return out[:keep]


def candidates(expr: TensorExpr, device: DeviceSpec, dyn_axis: str) -> tuple[RProgram, ...]:
    """The candidate programs of Table 1 on the template `expr` (module docstring): level-0
    micro-kernels, then at each unit layer the multiples of the layer above that fit, keeping
    per size along the dynamic axis the `KEEP_PER_SIZE` of least predicted time (`_least_cost`);
    at the first eps of `EPS_LADDER` that gives any, the single-row family beside them. Where no
    eps gives any (a dynamic batch of one-row matmuls: no register tile of several rows fits an
    M of 1), the single-row family alone. Sorted by their tiles."""
    dyn = expr.axis_index(dyn_axis)

    def programs(chains, eps: float) -> tuple[RProgram, ...]:
        calc = calculus(expr)
        return tuple(make_program(calc, device, chain, [True] * len(chain), eps) for chain in sorted(set(chains)))

    def rows(eps: float) -> list[tuple[Tile, ...]]:
        return _grow(expr, device, [(t,) for t in single_row_tiles(expr, device, dyn, eps)], dyn, eps, True)

    for eps in EPS_LADDER:
        chains = _grow(expr, device, [(t,) for t in register_tiles(expr, device, dyn, eps)], dyn, eps, False)
        if chains:
            return programs(chains + rows(eps) + constructed_rows(expr, device, dyn), eps)
    eps, single = next(((e, found) for e in EPS_LADDER if (found := rows(e))), (EPS_LADDER[0], []))
    return programs(single + constructed_rows(expr, device, dyn), eps)


def _grow(expr: TensorExpr, device: DeviceSpec, chains: list[tuple[Tile, ...]], dyn: int, eps: float,
          one_row: bool) -> list[tuple[Tile, ...]]:
    """`chains` grown layer by layer to the unit layer by `filter_by_multiples`, keeping the
    least predicted (`_least_cost`) on the template `expr`; with `one_row` (the single-row
    family) a chain stays one row along the dynamic axis at every layer and is priced at one
    row, the values it is for, where its grid over the static axes must fill the cores (on the
    template every grid does)."""
    priced = at_extent(expr, expr.axes[dyn].name, 1) if one_row else expr
    for layer in list(unit_levels(device))[1:]:
        grown = {chain + (t,) for chain in chains for t in filter_by_multiples(expr, device, layer, chain[-1], dyn, eps, one_row)
                 if not one_row or t[dyn] == 1}
        chains = _least_cost(priced, device, sorted(grown), dyn, eps)
    return chains


def _least_cost(expr: TensorExpr, device: DeviceSpec, chains: list[tuple[Tile, ...]], dyn: int,
                eps: float) -> list[tuple[Tile, ...]]:
    """Per size of the last tile along the dynamic axis, the `KEEP_PER_SIZE` chains of least
    predicted time on `expr` (`rtile.model.estimate`: its panel copies included), a chain
    short of the unit layer completed by repeating its last tile (the layers below hold the
    same tile: no reuse)."""
    calc = calculus(expr)
    levels = len(unit_levels(device))

    def predicted(chain: tuple[Tile, ...]) -> float:
        tiles = chain + (chain[-1],) * (levels - len(chain))
        return estimate(make_program(calc, device, tiles, [True] * levels, eps), device).predicted_seconds

    groups: dict[int, list] = {}
    for chain in chains:
        groups.setdefault(chain[-1][dyn], []).append(chain)
    out = []
    for size in sorted(groups):
        out += sorted(groups[size], key=lambda c: (predicted(c), c))[:KEEP_PER_SIZE]
    return out
