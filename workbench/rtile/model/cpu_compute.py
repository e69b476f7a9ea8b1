"""How fast a CPU core computes a register tile: the fraction of the FMA peak its micro-kernel
reaches (measured where calibration ran it, else SIMD lanes filled x FMA latency covered x the
loads its ports issue; a row LLVM vectorises on its own; a row left scalar) and what its guards
cost."""

from __future__ import annotations

from functools import cache
from math import prod

from workbench.hardware.registers import register_budget
from workbench.hardware.spec import DeviceSpec, MicroKernel
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import autovector_axis, lane_axis, plain_projections
from workbench.rtile.model.common import peak_gflops
from workbench.rtile.panels import vector_width
from workbench.rtile.plan import FILTERS, LANES, PANELS, SCALAR, cpu_plan
from workbench.rtile.registers import accumulators, lane_vectors, live_registers, micro_kernel_registers, step_loads
from workbench.rtile.rprogram import RProgram


def compute_efficiency(program: RProgram, device: DeviceSpec) -> float:
    """Fraction of the FMA peak a CPU register tile's micro-kernel reaches: the measured rate of
    its register micro-kernel over the peak where the spec has one (`measured_micro_kernel`; at
    most 1: calibration lets a measurement exceed the FMA peak by its noise slack), else
    `autovector_efficiency` for a row LLVM vectorises, else `simd_utilisation` (one lane where a
    guarded tail leaves the row scalar, `scalar_row`) x `latency_coverage` x `load_coverage` x
    `measured_ceiling`.
    A reduction whose row a guarded tail leaves scalar runs neither: `guarded_scalar_efficiency`."""
    if scalar_row(program, device) and program.expr.reduce:
        return guarded_scalar_efficiency(program, device)
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
        * spill_coverage(program.expr, device, tile)
        * measured_ceiling(program.expr, device)
    )


def measured_ceiling(expr: TensorExpr, device: DeviceSpec) -> float:
    """The most of the FMA peak an unmeasured register tile reaches on a spec whose calibration
    measured micro-kernels in `expr`'s dtype: the fastest of them over the peak, at most 1
    (without any: 1). The peak and each micro-kernel are measured apart, and where the fastest
    measured micro-kernel fell short of the peak, by its own loads or by the host's speed while
    it ran (on two Zen 3 cores a quick calibration's 6 x 16 read 0.963 of it, a full one's 4 x 16,
    5 x 16 and 6 x 16 all 1.0), lanes, chains and ports all filled would rank an unmeasured
    4 x 16 ahead of the measured 6 x 16 by that shortfall alone (evidence:
    docs/model-evidence.md#measured-ceiling)."""
    rates = [k.gflops for k in device.micro_kernels if k.dtype == expr.dtype]
    return min(1.0, max(rates) / peak_gflops(expr, device)) if rates else 1.0


def scalar_row(program: RProgram, device: DeviceSpec) -> bool:
    """Whether a CPU program's register row runs scalar for a guarded tail (`CpuPlan.guarded_row`):
    its compute fills one lane (`compute_efficiency`) and its reads from L1 into registers move
    one element a load (`transfer_seconds`)."""
    return device.runs_on_cpu and cpu_plan(program, device).guarded_row


# Cycles a core spends on one guarded scalar FMA of a reduction's row that runs scalar, with its
# accumulator's load and store (`guarded_scalar_efficiency`, `model.cpu.edge_seconds`): fitted
# 1.6-2.1 on one-row matmuls' split edges on two Zen 4 cores (evidence:
# docs/model-evidence.md#edge-lane-cycles).
GUARDED_LANE_CYCLES = 2.0

# Cycles a core spends on one lane past a split row's end, where only the guard is tested
# (`model.cpu.edge_seconds`; a lane that computes costs GUARDED_LANE_CYCLES): 1.2-1.3 fitted on
# one-row matmuls on two Zen 4 cores (evidence: docs/model-evidence.md#edge-lane-cycles); a
# filters-path register tile past an axis's end tests each unrolled statement's guard alike
# (`busiest_share`).
EDGE_SKIP_CYCLES = 1.2


def guarded_scalar_efficiency(program: RProgram, device: DeviceSpec) -> float:
    """Fraction of the FMA peak a reduction's register tile reaches whose row a guarded tail
    leaves scalar (`scalar_row`): one guarded scalar FMA, with its accumulator's load and store,
    per GUARDED_LANE_CYCLES, where the peak counts `fma_pipes` x `scalar_lanes` FMAs a cycle (a
    spec without FMA facts: one pipe). Neither a measured vector micro-kernel nor the tile's
    FMA chains apply: 3 x 3664 x 355 in 3 x 16 tiles of one register tile along N (no loop to
    split) ran 0.27-2.9 ms on two Zen 4 cores; priced by its lanes and chains 0.31 ms, so 1.68."""
    return 1.0 / (GUARDED_LANE_CYCLES * max(1, device.fma_pipes) * scalar_lanes(program, device))


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
      rest one at a time: n / ((n // lanes + n % lanes) x lanes), whatever w is.
    - Loads: an input read with stride s along the row takes s vector loads per vector (and a
      shuffle to separate them) on as many load ports as FMA pipes: 1 / s.
    - Flops: the peak counts an FMA as two flops; an operator of fewer flops per iteration point
      (a pooling's add) reaches that share of it.
    The chains are short (a window's few adds per output), so out-of-order execution overlaps
    consecutive register tiles' and no latency term applies. Rows LLVM leaves partly scalar are
    not modelled: `rules.AutovectorRowRule` keeps the row to whole 4-lane pieces, 1 or 2, and
    the register tile to one window row (evidence: docs/model-evidence.md#autovector-efficiency)."""
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
    flops = min(1.0, expr.main_flops / (2 * prod(expr.extents)))
    return filled / max(1, stride) * flops


def simd_utilisation(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the vector lanes a CPU register tile fills. The peak counts every lane of
    every FMA; a tile of `size` values along the `lane_axis` issues `lane_vectors` whole
    vectors for them, so it fills `size / (vectors x lanes)` of the lanes (a 12-wide fp32 row on
    8-lane AVX2, 3 xmm pieces of 4: 12 / 24). An operator with no lane axis (its output row a gather, as a
    stride-2 pooling's, or a stride-2 conv's with fewer filters than a vector) runs scalar
    code: one lane of `register_bytes / itemsize`."""
    lanes = max(1, device.register_bytes // expr.output.itemsize)
    axis = lane_axis(expr, device)
    if axis is None:
        return 1.0 / lanes
    size = tile[axis]
    return size / (lane_vectors(expr, device, axis, size, expr.output.itemsize) * lanes)


def latency_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the FMA pipes a CPU reduction's register tile keeps busy. Each accumulator is
    a dependency chain that issues one FMA per `fma_latency_cycles`, so `a` accumulators issue
    a / latency FMAs per cycle out of the `fma_pipes` the peak assumes (Little's law;
    ALGORITHMS.md §7): min(1, a / (latency x pipes)), 2 accumulators on Zen 2 (5 cycles x 2
    pipes) reaching 2 / 10 of peak. Where calibration measured micro-kernels of `a` accumulators
    in `expr`'s dtype, their coverage instead (`measured_chains`). A tile spanning its whole
    reduction (a depthwise conv's window) ends its chains with it, and the next tile's, which
    out-of-order execution starts meanwhile, add OVERLAPPED_FMAS / (the reduction's elements).
    Operators without a reduce axis carry no chain (out-of-order execution overlaps independent
    vectors): 1. A spec without FMA facts: 1."""
    need = device.fma_accumulators
    if not need or not expr.reduce:
        return 1.0
    measured = measured_coverage(expr, device, tile)
    if measured is not None:
        return measured
    chains = accumulators(expr, device, tile)
    if all(tile[a] >= expr.axes[a].extent for a in expr.reduce):
        chains += OVERLAPPED_FMAS / prod(expr.axes[a].extent for a in expr.reduce)
    return min(1.0, chains / need)


# FMAs out-of-order execution issues from the register tiles after the one running, where each
# tile spans its whole reduction (a depthwise conv's 3 x 3 window): the tile's chains end with it
# and the next tile's are independent. About a core's floating-point scheduler queue; on two Zen
# 5 cores, 3 x 3 depthwise tiles of 4 accumulators ran as fast as 8 or faster, as AVX2 and as
# AVX-512 code (evidence: docs/model-evidence.md#hoisted-broadcasts).
OVERLAPPED_FMAS = 64


def spill_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of its rate a CPU register tile keeps whose micro-kernel keeps more vector
    registers live than the core has (`register_budget`) because LLVM holds a broadcast input
    it hoisted (`live_registers`: a 3 x 3 depthwise window's 9 weights, where the budget the
    tiles are built to counts one): each register short spills an accumulator, whose FMAs then
    wait on a store and a load: a / (a + over) of a accumulators; 1 where they fit. A tile past
    the budget on its own counts (`micro_kernel_registers`) is not priced here: construction
    makes none, and what LLVM keeps of such a tile was not measured."""
    over = live_registers(expr, device, tile) - max(register_budget(device), micro_kernel_registers(expr, device, tile))
    if over <= 0:
        return 1.0
    chains = accumulators(expr, device, tile)
    return chains / (chains + over)


def measured_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float | None:
    """`measured_chains`' coverage for a register tile of the kind calibration measures
    (`micro_kernel_shape`) at its accumulator count, or None (another kind, no FMA facts, or no
    measured micro-kernel of that count)."""
    if not device.fma_accumulators or micro_kernel_shape(expr, device, tile) is None:
        return None
    return measured_chains(expr.dtype, device).get(accumulators(expr, device, tile))


@cache
def measured_chains(dtype: str, device: DeviceSpec) -> dict[int, float]:
    """Per accumulator count, the FMA pipes' coverage calibration measured on `device` in
    `dtype`: the fastest micro-kernel of that many accumulators over the fastest of all (the
    share of the peak that `measured_ceiling` puts on top). Little's law is the ideal a core
    approaches, not a step it reaches: on two Zen 5 cores 8 accumulators (4 cycles x 2 pipes)
    ran 0.84-0.86 of the fastest micro-kernel, 10 ran 0.93, 12 ran 0.98-0.99; on Zen 4's 4
    chains 0.87 (evidence: docs/model-evidence.md#measured-chains). A tile of more vectors than
    calibration measures (a 2 x 5-vector matmul tile: 10 accumulators) is priced at its count's
    measured coverage, not the step's 1."""
    rates = [k for k in device.micro_kernels if k.dtype == dtype]
    if not rates:
        return {}
    fastest = max(k.gflops for k in rates)
    out: dict[int, float] = {}
    for k in rates:
        chains = k.vectors(device.warp_size)
        loads = chains // k.rows + k.rows  # a row of B's vectors and a broadcast per row
        if chains >= loads:  # not waiting on its loads (`load_coverage`)
            out[chains] = max(out.get(chains, 0.0), k.gflops / fastest)
    return out


def load_coverage(expr: TensorExpr, device: DeviceSpec, tile) -> float:
    """Fraction of the FMA pipes a CPU register tile's loads let it keep busy:
    min(1, accumulators / `step_loads`). Each reduction step issues one FMA per accumulator and
    `step_loads` loads and broadcasts (a broadcast from memory is a load uop); a core issues as
    many full-width vector loads per cycle as it has FMA pipes (2 and 2 on Haswell to Skylake-SP
    and Zen 1 to Zen 4: Intel's optimization reference manual, AMD's software optimization
    guides), so a tile with more loads than FMAs waits on its load ports. A register tile over
    an axis that indexes every input (a batch) adds loads in proportion to its FMAs (evidence:
    docs/model-evidence.md#load-coverage). Operators without a reduce axis, scalar code (no
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
    if not expr.multiply_adds:
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
    if not device.micro_kernels:
        return None
    shape = micro_kernel_shape(program.expr, device, program.register_tile)
    return None if shape is None else device.micro_kernel(program.expr.dtype, *shape)


def compute_provenance(program: RProgram, device: DeviceSpec) -> tuple[bool, str]:
    """(measured, phrase) of a CPU program's compute term for `common.provenance`: measured where
    its register tile's micro-kernel was (level 0), else how it is modelled."""
    kernel = measured_micro_kernel(program, device)
    if kernel is not None:
        return True, f"compute: level-0 micro-kernel {kernel.shape} {kernel.dtype}, {kernel.gflops:g} GFLOP/s"
    if autovector_axis(program.expr, device) is not None:
        how = "the row LLVM vectorises: lanes filled over the strided loads"
    elif scalar_row(program, device):
        how = "a guarded tail leaves the row scalar: one lane, one element a load from L1"
    else:
        expr, tile = program.expr, program.register_tile
        shape = micro_kernel_shape(expr, device, tile)
        # said only where calibration measured micro-kernels, just not this one
        unmeasured = f", no measured {shape[0]}x{shape[1]} micro-kernel" if shape and device.micro_kernels else ""
        ceiling = measured_ceiling(expr, device)
        capped = f" x {ceiling:.3g}, the fastest measured micro-kernel's share of the peak" if ceiling < 1 else ""
        covered = f" as measured with {accumulators(expr, device, tile)} accumulators" \
            if measured_coverage(expr, device, tile) is not None else ""
        spill = spill_coverage(expr, device, tile)
        spilled = f" x {spill:.3g} for the accumulators it spills" if spill < 1 else ""
        how = f"SIMD lanes filled x FMA latency covered{covered}{spilled}{capped}{unmeasured}"
    return False, f"compute: {how}"


# How much slower a CPU register micro-kernel runs when its tiles carry a guard (`guard_slowdown`),
# measured 1.3-1.5x on dwconv-3x3 (evidence: docs/model-evidence.md#guarded-micro-kernel).
GUARDED_MICRO_KERNEL = 1.4
# How much slower than its price a matmul whose row's edge splits off (`CpuPlan.split_edges`, the
# edge priced lane by lane: `lane_priced_edge`) runs where its register tiles also cut its rows
# (`cut_rows`), priced as the rows' `guarded_edges` otherwise (1.05 for 13-row tiles over 77
# rows). A transformer block's 77 x 300 x 300 projections with an epilogue and a ragged K (no
# panels) on two Zen 4 cores: tiles of 8, 10, 13, 16 and 20 rows ran 2.5-12.7x that price, 11
# rows (dividing 77) 1.2-1.3x. The least of those: what ranks such a program after the padded
# panels of the same tiles, not what it runs at (docs/model-evidence.md#cut-rows).
CUT_ROWS_SLOWDOWN = 2.5


def guard_slowdown(program: RProgram, device: DeviceSpec) -> float:
    """How much slower than the modelled micro-kernel a CPU program's guards make it run, as its
    plan (`rtile.plan.CpuPlan`) builds it (a GPU's guards are per thread, and the model prices
    the padded work instead).

    A reduction whose lanes the alignment rules put along its reduce axis (`lane_axis`: gemv,
    row sums) that the template leaves without any vector (the plan's `SCALAR` path: it takes
    the lanes along K only for a register tile of whole vectors) sums one output at a time: one chain of dependent
    adds instead of lanes x FMA pipes x FMA latency independent ones (evidence:
    docs/model-evidence.md#guard-slowdown). Elsewhere GUARDED_MICRO_KERNEL where a register tile
    along a spatial axis does not divide the axis and the plan does not pad the tails: the
    template then guards the micro-kernel with the block predicate TVM adds, and the whole loop
    nest runs with it, not only the cut tile; not along filters the plan pads to whole unit
    tiles (`CpuPlan.padded_filters`), whose register tiles are all whole. A padded program's
    axes left unpadded for an input read in place (`CpuPlan.edge_axes`): `guarded_edges` over
    them, on the busiest core, the register tiles past an end free on the panels path (a
    matmul's) and at `past_rate` on the others. Where the plan splits the edges off instead
    (`CpuPlan.split_edges`: a ragged row, or a ragged K in lanes), `edge_slowdown`; a
    convolution's ragged pixel axes on the filters path, and a whole row's other ragged axes on
    the row path (`CpuPlan.split_others`), `guarded_edges` over them, on the busiest core; on
    the lanes path, the output's ragged axes so (`split_others`) times a ragged K's
    `edge_slowdown`."""
    expr = program.expr
    plan = cpu_plan(program, device)
    lanes = lane_axis(expr, device)
    if lanes is not None and expr.axes[lanes].kind == "reduce" and plan.path == SCALAR:
        return float(device.warp_size * max(1, device.fma_pipes) * max(1, device.fma_latency_cycles))
    if plan.padded_tails:
        edges = plan.edge_axes
        # a matmul's register tiles past the rows' end cost nothing measurable, unlike those
        # past a conv's pixel axis on the filters path (evidence: docs/model-evidence.md#panels-past-end)
        past = 0.0 if plan.path == PANELS else past_rate(device)
        return guarded_edges(program, edges, device.compute_units, past=past) if edges else 1.0
    if (plan.split_edges and plan.path == FILTERS) or plan.split_others:
        others = guarded_edges(program, [a for a in expr.spatial if a != plan.vector_axis], device.compute_units,
                               past=past_rate(device))
        return others * edge_slowdown(program, device) if plan.split_edges and plan.path == LANES else others
    if plan.split_edges:
        return edge_slowdown(program, device)
    reg = program.register_tile
    return GUARDED_MICRO_KERNEL if any(expr.axes[a].extent % reg[a] for a in plan.guarded_axes(expr)) else 1.0


def past_rate(device: DeviceSpec) -> float:
    """What a filters-path register tile's element past an axis's end costs against a whole
    tile's (`busiest_share`): it tests its guard, EDGE_SKIP_CYCLES, once for every statement a
    whole tile's element spends an FMA on, which a core issues `fma_pipes` a cycle (a spec
    without FMA facts: one)."""
    return EDGE_SKIP_CYCLES * max(1, device.fma_pipes)


def guarded_edges(program: RProgram, axes, cores: int = 0, past: float = 0.0) -> float:
    """The factor of split-off edges along `axes` whose edge tiles keep a guard the same for
    every lane: of the E = prod(E_a) elements, the I = prod(E_a // r_a * r_a) in register tiles
    whole along every axis run unguarded, the rest in the edge tiles at GUARDED_MICRO_KERNEL's
    rate, over the P = prod(ceil(E_a / U_a) * U_a) of whole unit tiles that the compute term
    counts (23 x 23 outputs on 2 x 6 register tiles in 12 x 24 unit tiles: (22 x 18 + (529 -
    396) x 1.4) / (24 x 24)). 1 over no axes, or axes the unit tiles divide.

    Given the `cores` (the filters path), the factor is the busiest core's (`busiest_share`):
    the grid deals its unit tiles ceil(G / cores) a core, so a core whose tiles are whole runs
    them whole however few elements the last tile holds (7 rows in unit tiles of 4 on two cores:
    4 / 4, not 7 / 8); an edge along an axis the grid splits into more than one unit tile runs
    at GRID_GUARDED_TILE's rate, on the cores whose unit tiles hold it, the register tiles past
    the end in that last unit tile at `past` each (`past_rate`)."""
    expr = program.expr
    reg, unit = program.register_tile, program.unit_tile
    extents = [expr.axes[a].extent for a in axes]
    if cores:
        split = [a for a, e in zip(axes, extents) if e % reg[a] and unit[a] < e]
        return busiest_share(program, axes, split, cores, past)
    inner = prod(e // reg[a] * reg[a] for a, e in zip(axes, extents))
    padded = prod(-(-e // unit[a]) * unit[a] for a, e in zip(axes, extents))
    return (inner + (prod(extents) - inner) * GUARDED_MICRO_KERNEL) / padded


# How much longer a filters-path register tile's elements run than a whole tile's where the tile
# holds the ragged end of an axis the grid splits into several unit tiles (`guarded_edges`): the
# end then lies in the last of them only, its guard depends on the grid's index, loop
# partitioning cannot lift it as a constant, and every unrolled statement of the cut tile keeps
# it, its accumulator loaded and stored in memory around each FMA; the register tiles from there
# to the unit tile's end run too, every statement testing its guard (`past_rate`). Fitted on two
# Zen 5 cores, 11 channels to 257 filters over 19 x 19 (3 x 3): 16 x 5 x 2 register tiles under
# 272 x 10 x 20 unit tiles (the rows split) 131-137 us, under 272 x 20 x 10 (the columns) 79-82,
# 16 x 4 x 2 under 272 x 20 x 10 85-88: 112, 78 and 80 predicted with 4, 68-70 before (evidence:
# docs/model-evidence.md#grid-guarded-tile).
GRID_GUARDED_TILE = 4.0


def busiest_share(program: RProgram, axes, split, cores: int, past: float = 0.0) -> float:
    """`guarded_edges` on the busiest of `cores`, whose grid splits the ragged `split` axes
    (among the guarded `axes`): per unit tile, the elements in register tiles whole along every
    axis at 1, those in the edge tiles of `axes` not split at GUARDED_MICRO_KERNEL, those in
    the edge tiles of a `split` axis at GRID_GUARDED_TILE, those past a `split` axis's end (in
    the last unit tile along it, inside the other axes' ends) at `past`; the padding past the
    end of an axis not split at 0 (along the other spatial axes, the padded unit tile's every
    element at 1). 97 channels to 19 5x5 filters over 83 x 83 in 16 x 3 x 5 register tiles
    under 32 x 21 x 65 unit tiles: the second column of unit tiles holds 18 columns, 3 in the
    cut tile, and 47 past them, 9 whole register tiles among them, which ran 5.3 ms against 2.6
    for unit tiles of 85 columns (one along the row, none past it; 2026-12-01, two Zen 5 cores:
    docs/model-evidence.md#grid-guarded-tile). The grid, fused over the spatial axes in order,
    runs ceil(G / cores) unit tiles per core one after another (TVM's parallel loop); the factor
    is the most any core's tiles cost over as many whole ones. Each of the four counts is a
    product of per-axis counts, so a core's sum is read off the grid's mixed-radix digits
    (`_grid_prefix`) without visiting its tiles."""
    expr = program.expr
    unit = program.unit_tile
    counts = []  # per spatial axis: its unit tiles, a whole one's extent, and the last one's four counts
    for a in expr.spatial:
        extent, u, r = expr.axes[a].extent, unit[a], program.register_tile[a]
        tiles = -(-extent // u)
        if a not in axes:
            counts.append((tiles, u, (u, u, u, u)))
            continue
        valid = extent - (tiles - 1) * u
        inner = max(0, extent // r * r - (tiles - 1) * u)
        counts.append((tiles, u, (inner, inner if a in split else valid, valid, u if a in split else valid)))
    grid = prod(c[0] for c in counts)
    step = -(-grid // cores)
    rates = (1.0 - GUARDED_MICRO_KERNEL, GUARDED_MICRO_KERNEL - GRID_GUARDED_TILE, GRID_GUARDED_TILE - past, past)
    worst = 0.0
    for start in range(0, grid, step):
        end = min(grid, start + step)
        worst = max(worst, sum(rate * (_grid_prefix(counts, k, end) - _grid_prefix(counts, k, start))
                               for k, rate in enumerate(rates)))
    return worst / (step * prod(unit[a] for a in expr.spatial))


def _grid_prefix(counts, k: int, flat: int) -> int:
    """The sum over the grid's first `flat` unit tiles (row-major over `counts`' axes) of the
    product over axes of the k-th count (the last tile along an axis its last value, every other
    the whole tile's extent)."""
    totals = [(c[0] - 1) * c[1] + c[2][k] for c in counts]
    total, head = 0, 1
    for j, (tiles, whole, last) in enumerate(counts):
        inner = prod(c[0] for c in counts[j + 1:])
        digit, flat = divmod(flat, inner)
        if digit >= tiles:  # the whole grid
            return head * totals[j] * prod(totals[j + 1:])
        total += head * digit * whole * prod(totals[j + 1:])
        head *= last[k] if digit == tiles - 1 else whole
    return total


def edge_slowdown(program: RProgram, device: DeviceSpec) -> float:
    """How much of the padded, unguarded micro-kernel's time a CPU program spends on its vectors
    and, where the edge is not priced lane by lane, its edge, whose plan splits the edge of its
    vectorised axis off (`CpuPlan.split_edges`); the compute term prices the P = ceil(E / U) * U
    elements of the axis's whole unit tiles of U.

    A matmul's row (`lane_priced_edge`): the `edge_split` V of the axis's E elements run the
    vector micro-kernel, the factor is V / P (1x1024x4096 on 1x56 registers, 112-column unit
    tiles: 4096 / 4144), and the edge's lanes cost the core that holds them
    `model.cpu.edge_seconds`; where they run in LLVM's pieces (`edge_in_pieces`) each piece is a
    vector's slot instead, (V + `edge_pieces`(S) x lanes) / P. Any other row, and a ragged K
    vectorised in lanes (whose rows are not split): the I = E // r * r elements in whole
    register tiles of r run in vectors and the E - I the end cuts scalar, one lane of
    `scalar_lanes` L each, so the factor is (I + (E - I) * L) / P (a softmax row maximum over
    1000 in 16-lane register tiles and 1024-wide unit tiles: (992 + 8 * 8) / 1024); a row that
    ends on a vector (`CpuPlan.edge_in_vectors`) runs its cut tile's vectors whole: E / P (a 3 x 3
    depthwise conv over 112 columns in 64-column tiles ran 82 us, as fast as in 112-column ones,
    79, where the edge's 48 columns priced scalar made it 3.9x; evidence:
    docs/model-evidence.md#hoisted-broadcasts). A row's other ragged spatial axes, split off as
    well (`panels.splits_edges`), multiply it by their `guarded_edges`."""
    expr, plan = program.expr, cpu_plan(program, device)
    v = plan.vector_axis
    extent, reg, unit = expr.axes[v].extent, program.register_tile[v], program.unit_tile[v]
    padded = -(-extent // unit) * unit
    if lane_priced_edge(program, device):
        vectors, scalar, _ = edge_split(program, device)
        lanes = plan.lanes
        pieces = edge_pieces(scalar, lanes) * lanes if edge_in_pieces(program, device) else 0
        row = (vectors + pieces) / padded
    else:
        whole = extent if plan.edge_in_vectors else extent // reg * reg
        row = (whole + (extent - whole) * scalar_lanes(program, device)) / padded
    if expr.axes[v].kind != "spatial":  # a ragged K in lanes: its rows are not split
        return row
    others = [a for a in expr.spatial if a != v]
    if lane_priced_edge(program, device) and cut_rows(program, others):
        return row * CUT_ROWS_SLOWDOWN
    return row * guarded_edges(program, others)


def cut_rows(program: RProgram, axes) -> bool:
    """Whether the register tiles span more than one index of one of `axes` and do not divide
    it (13 rows of a 77-row matmul): the tile holding its end is cut (`CUT_ROWS_SLOWDOWN`)."""
    reg = program.register_tile
    return any(reg[a] > 1 and program.expr.axes[a].extent % reg[a] for a in axes)


def lane_priced_edge(program: RProgram, device: DeviceSpec) -> bool:
    """Whether the model prices a split row's edge lane by lane on the core that holds it
    (`model.cpu.edge_seconds`): a reduction over plain projections (`axes.plain_projection`: a
    matmul's, batched or not) along a spatial vector axis, where it was measured: each lane of
    the edge a guarded scalar FMA per row of the register tile that loads and stores its
    accumulator at every reduction step (the template keeps a split row's reduction steps a
    loop). One-row matmuls fit it (1 x 2048 x 1001: Spearman 0.96 over the top 10), and so do
    few rows: 4 x 4537 x 109 in 4 x 16 register tiles, 242 of its 282 us predicted the edge's,
    measured 217-411 us (73 predicted without); 3 x 1 x 670 x 1384's three-batch register tiles
    (3 x 112 columns) come after one-batch ones, as they measure (285-362 us against 195-222). A
    convolution's row path keeps the vector micro-kernel's price per lane (5 channels, 3 3x3
    filters over 73 x 73 in 3 x 3 x 16 register tiles: 19.9 us predicted so, 19.3 measured; lane
    by lane 44), and so does an elementwise row."""
    expr = program.expr
    plan = cpu_plan(program, device)
    v = plan.vector_axis
    return (plan.split_edges and v is not None and expr.axes[v].kind == "spatial" and bool(expr.reduce)
            and plain_projections(expr))


def edge_in_pieces(program: RProgram, device: DeviceSpec) -> bool:
    """Whether a lane-priced split edge (`lane_priced_edge`) runs in LLVM's vector pieces rather
    than lane by lane: where one unit tile spans the whole row, the loop lowering splits ends at
    the same column in every call, a constant, and LLVM vectorises the edge's S lanes in vectors
    of the widths that sum to S (63 columns on 16 lanes: three of 16, one of 8, one of 4, three
    scalar), with nothing past the end to test. Where several unit tiles lie along the row the
    end falls in the last one only, its position depends on the grid's index, and the edge runs
    scalar. Two Zen 5 cores: 3 batches of 2 x 1777 x 127 in 2 x 16 to 2 x 64 register tiles,
    22-30 us in one 128-column unit tile against 46-70 in two of 64; 4 x 4537 x 109 in 4 x 16,
    33-38 us in one of 112 or 128 columns against 168-173 in 64
    (docs/model-evidence.md#edge-lane-cycles)."""
    if not lane_priced_edge(program, device):
        return False
    v = cpu_plan(program, device).vector_axis
    return program.unit_tile[v] >= program.expr.axes[v].extent


def edge_pieces(elements: int, lanes: int) -> int:
    """Vector instructions LLVM covers a constant run of `elements` lanes with: whole vectors of
    `lanes`, then one of each power of two from half a vector down to 4 that the rest holds, then
    the last 0-3 lanes one at a time (the assembly of 63 columns over 16 lanes: 3 zmm, 1 ymm, 1
    xmm and 3 scalar FMAs)."""
    whole, rest = divmod(elements, lanes)
    return whole + bin(rest & ~3).count("1") + rest % 4


def edge_split(program: RProgram, device: DeviceSpec) -> tuple[int, int, int]:
    """(V, S, X) of a CPU program that splits the edge of its spatial vector axis off
    (`CpuPlan.split_edges`): of the axis's E elements V run in vectors and S scalar, each a
    guarded FMA, and X = P - E lanes past the end, up to the P = ceil(E / U) * U of whole unit
    tiles of U, only test their guard; S and X along every row of the register tiles and every
    reduction step.

    Lowering splits the outermost loop below the grid that the template marks
    (`codegen.cpu._split_edges`: over tiles of T, the largest tile below the unit tile that it
    holds more than once) where the row ends, not the loops inside it: the tiles of T before
    the one the end cuts run whole (V = E // T * T), and every lane from there to the unit
    tile's end runs scalar. With `CpuPlan.edge_vectors` it splits the loop over each register
    tile's vectors of w lanes (`panels.vector_width`) instead, so the cut register tile's whole
    vectors run in vectors too (V = E // r * r + c // w * w for c = E - E // r * r; the plan
    takes it only where the cut tile ends the unit tile). A row that ends on a vector
    (`CpuPlan.edge_in_vectors`) runs the cut tile's vectors vectorised, each under a guard the
    same for its lanes: V = E, S = 0. 1 x 1309 in tiles of 112 (L1 tiles alike) and unit tiles
    of 672 (16 lanes): (1232, 77, 35), with edge vectors (1296, 13, 35); relu over 670 in
    register tiles of 16, L1 tiles of 64, unit tiles of 256: (640, 30, 98)."""
    expr = program.expr
    plan = cpu_plan(program, device)
    v = plan.vector_axis
    extent, reg, unit = expr.axes[v].extent, program.register_tile[v], program.unit_tile[v]
    if plan.edge_in_vectors:
        vectors = extent
    elif plan.edge_vectors:
        vectors = extent // reg * reg
        width = vector_width(reg, plan.lanes)
        vectors += (extent - vectors) // width * width
    else:
        sizes = [tile[v] for tile in program.tiles]
        cut = next(sizes[l] for l in reversed(range(len(sizes) - 1)) if sizes[l + 1] > sizes[l])
        vectors = extent // cut * cut
    return vectors, extent - vectors, -(-extent // unit) * unit - extent
