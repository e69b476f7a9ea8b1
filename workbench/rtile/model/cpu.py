"""A CPU program's memory pricing: the bytes each cache layer loads (`cache_traffic`, in whole
lines for `scattered_inputs`), their transfer times, the accumulators' trips to the layer that
keeps them (`accumulator_home`, `accumulator_steps`) and the output buffer's passes
(`buffer_bytes`), the panel copies (`packing_seconds`), a strided image's gather
(`gather_seconds`), the output lines two cores write (`shared_output_lines`), a split program's
sum (`split_sum_seconds`), a fused epilogue's own inputs (`epilogue_read_seconds`), and how the
stages add up (`combine_stages`); `price` assembles them with the compute term
(`model.cpu_compute`)."""

from __future__ import annotations

from math import ceil, gcd, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.ops.transposed_gemm import copied_bytes
from workbench.rtile.axes import (
    always_streamed, lane_axis, plain_projection, plain_projections, read_once_below, stored_past_caches,
    unfollowed_reads, unramped_share,
)
from workbench.rtile.model.common import (
    GB, Pricing, hardware_caches, is_stream_bound, layer_gbps, partial_sum_bytes, past_llc, peak_gflops, provenance,
    source_layer, stays_in_llc,
)
from workbench.rtile.model.cpu_compute import (
    EDGE_SKIP_CYCLES, GUARDED_LANE_CYCLES, compute_efficiency, compute_provenance,
    edge_in_pieces, edge_split, guard_slowdown, lane_priced_edge, scalar_lanes, scalar_row,
)
from workbench.rtile.panels import (
    gathered_inputs, packed_tile_bytes, padded_inputs, panel_copy_bytes, row_block_width, row_vector, transposes,
    vector_width,
)
from workbench.rtile.plan import LANES, PANELS, ROW, cpu_plan
from workbench.rtile.registers import accumulators, partial_sums, step_loads
from workbench.rtile.rprogram import RProgram
from workbench.rtile.traffic import calculus


def price(program: RProgram, device: DeviceSpec, padded_flops: int, busy: float) -> Pricing:
    """A CPU program's `Pricing` (Roller §3.3 on a core): the main block's flops at the fraction
    of peak its register tile reaches, slowed by its guards; per cache layer `cache_traffic` at the layer
    below's bandwidth (every layer: `hardware_caches`); the accumulators' trips and the output
    buffer's passes in the layer that holds them; stages combined by `combine_stages`; the panel
    copies, the epilogue's arithmetic (`epilogue_seconds`), a split row's scalar edge
    (`edge_seconds`), the output elements stored one at a time (`guarded_store_seconds`), a strided
    image's gather (`gather_seconds`), the output lines two cores write (`shared_output_lines`,
    SHARED_LINE_CYCLES each) and a split program's sum (`split_sum_seconds`) added after the
    scale-out; a fused epilogue's own inputs (`epilogue_read_seconds`) with the bottom layer's
    transfers."""
    expr = program.expr
    calc = calculus(expr)
    plan = cpu_plan(program, device)
    eff = compute_efficiency(program, device)
    main_flops = padded_flops * expr.main_flops / expr.flops  # the epilogue's: `epilogue_seconds`
    compute = main_flops / (peak_gflops(expr, device) * GB * busy * eff) * guard_slowdown(program, device)
    loads: dict[str, float] = {}  # every transfer, by the layer it comes from
    adding: dict[str, float] = {}  # those that do not hide under the compute (`combine_stages`)
    moved: dict[str, int] = {}
    through = hardware_caches(program, device)
    scalar = scalar_row(program, device)
    below = hidden_source(through, device)
    hidden = 0.0

    def transfer(name: str, q: int, seconds: float, hides: bool = False) -> None:
        nonlocal hidden
        moved[name] = moved.get(name, 0) + q
        loads[name] = loads.get(name, 0.0) + seconds
        if hides:
            hidden += seconds
        else:
            adding[name] = adding.get(name, 0.0) + seconds

    for layer in range(len(program.tiles)):
        at = source_layer(through, layer, len(device.layers))
        q = cache_traffic(program, device, layer)
        transfer(device.layers[at].name, q, transfer_seconds(through, device, layer, q, scalar) / busy, at == below)
    if len(program.tiles) > 1 and expr.reduce:
        at = accumulator_home(program, device)
        q = calc.accumulator_bytes(program.register_tile, accumulator_steps(program),
                                   partial_sums(expr, device, program.register_tile)) + buffer_bytes(program, device)
        gbps = layer_gbps(program, device, at)
        if at == len(device.layers) - 1 and buffer_in_llc(program, device):
            gbps = max(gbps, device.llc_gbps)
        transfer(device.layers[at].name, q, q / (gbps * GB * busy))
    runs = (stream_seconds(program, device, busy) + unfollowed_seconds(program, device, busy)
            + strips_seconds(program, device, busy))
    if runs:
        transfer(device.layers[-1].name, 0, runs)
    reading = epilogue_read_seconds(program, device, busy)
    if reading:
        transfer(device.layers[-1].name, expr.epilogue_input_bytes, reading)
    stages = {"compute": compute, **loads}
    bottleneck = max(stages, key=stages.get)
    core = combine_stages(through, device, compute, adding, hidden, plan.path == LANES)
    packed = packed_bytes(program, device)
    packing = _copy_seconds(program, device, packed, packed_bytes(program, device, transposed=True),
                            packed_bytes(program, device, rows=True))
    if packed:
        stage = f"packing into {device.layers[plan.pack_layer].name}"
        moved[stage], loads[stage] = packed, packing
    gathered = gathered_bytes(program.expr, device)
    gathering = _gather_time(device, gathered)
    if gathered:
        moved["gathering the image's pixels"], loads["gathering the image's pixels"] = gathered, gathering
    copied = copied_bytes(program.expr, plan.transposed_in_panels)
    if copied:  # before the loop nest as a gather is: added to it
        stage = f"copying {' and '.join(program.expr.transposed)} transposed"
        moved[stage], loads[stage] = copied, transpose_seconds(program, device)
        gathering += loads[stage]
    shared = shared_output_lines(program, device)
    sharing = shared * SHARED_LINE_CYCLES / (clock_ghz(program, device) * GB) if shared else 0.0
    if shared:
        stage = "output lines two cores write"
        moved[stage], loads[stage] = shared * device.layers[-1].transaction_bytes, sharing
    summing = split_sum_seconds(program, device)
    if summing:
        stage = f"summing {program.split} parts' partial sums"
        moved[stage], loads[stage] = partial_sum_bytes(program), summing
    said = provenance(program, device, compute_provenance(program, device), bool(packed))
    return Pricing(
        compute=compute, moved=tuple(moved.items()), loads=tuple(loads.items()), bottleneck=bottleneck, core=core,
        after=(packing, epilogue_seconds(program, device, busy), edge_seconds(program, device),
               lane_sum_seconds(program, device), guarded_store_seconds(program, device), gathering, sharing,
               summing),
        **said,
    )


def streamed_inputs(program: RProgram, device: DeviceSpec) -> tuple[int, ...]:
    """The inputs (numbered) a CPU reduction reads in place from the bottom layer, every element
    once per unit tile: on a path that packs nothing (`CpuPlan.packed`: panels copy their tiles
    in order), the plain projections (`axes.plain_projection`) the unit tile does not reuse
    (every spatial axis it ignores has a unit tile of 1: a one-row matmul's B, the row
    family's); on the panel path, those it reads in place beside its panels once from below the
    lowest cache layer (`axes.read_once_below`: a few-row matmul's B under register tiles that
    span its rows). 7 batches of 17 x 3203 x 2560 (B 230 MB, A packed) on two Xeon Emerald Rapids
    cores, unit tiles of 48 K-steps x 64-160 columns (256-640-byte runs) 34.5-39.8 ms, 256-640
    columns 11.0-13.1, 1280 and 2560 9.1 and 8.0, all priced 7.3-8.6 ms before
    (docs/model-evidence.md#stream-runs)."""
    expr = program.expr
    if not device.runs_on_cpu or not expr.reduce or len(program.tiles) < 2:
        return ()
    plan = cpu_plan(program, device)
    if plan.packed or plan.path == PANELS:
        if stays_in_llc(expr, device):
            return ()
        return tuple(t for t in read_once_below(expr, device, program.register_tile)
                     if expr.inputs[t].name not in plan.packed)
    unit = program.unit_tile
    return tuple(t for t, tensor in enumerate(expr.inputs) if plain_projection(tensor)
                 and not any(not tensor.uses_axis(a) and unit[a] > 1 for a in expr.spatial))


def stream_runs(program: RProgram, device: DeviceSpec) -> int:
    """Contiguous runs a CPU program starts in the bottom layer: those the `streamed_inputs` are
    read in (`tile_stream_runs` of the L1 tile, the first cache tile, which the micro-kernel
    walks, or of the run of them that continues the same rows: `stream_tile`), and those the
    panel copies read their tiles in where the operator streams from DRAM (`packed_runs`)."""
    streamed = streamed_inputs(program, device)
    if not streamed:
        return packed_runs(program, device)
    calc = calculus(program.expr)
    return sum(tile_stream_runs(calc, stream_tile(program, t), (t,)) for t in streamed) + packed_runs(program, device)


def stream_tile(program: RProgram, t: int) -> tuple[int, ...]:
    """The tile whose data tile of streamed input `t` a run spans: the first cache tile (the
    micro-kernel's walk), or the run of its neighbours inside the tile above (`TileCalculus.sweep`)
    where the next of them continues the same rows: the innermost loop that steps runs along the
    input's contiguous dimension and no reduction step lies between two of them. A one-row
    matmul's B in L1 tiles of 8 rows x 64 columns inside a core's 4,544 columns reads 8 rows of
    4,544 floats, not a new run every 64 (1 x 7624 x 9042 over 8 x 64 and 16 x 144 tiles ran alike,
    4.1-4.3 and 4.3-4.4 ms, where one latency a 64-column run priced the first at 10.4 ms; evidence:
    docs/model-evidence.md#stream-runs). Or, where the tile reads the input in one run whose
    next part the next reduction step reads (B's whole rows, K-step after K-step), the run over
    the reduction of the tile above: 8 batches of 7 x 9377 x 64 (B's rows 256 bytes) in L1 tiles
    of 16 whole rows would be priced a latency a tile where each unit tile reads 448-672 rows on
    end (the Zen 5's spec, where B does not stay in the last-level cache)."""
    tile = program.tiles[1]
    if len(program.tiles) < 3:
        return tile
    expr, upper = program.expr, program.tiles[2]
    calc = calculus(expr)
    if any(tile[a] < upper[a] for a in expr.reduce):
        shape = calc.data_tiles(tile)[t]
        run = _run_dim(shape, expr.inputs[t].shape)
        if prod(shape[:run]) == 1 and _reduction_along(expr, t, run) is not None:
            return tuple(upper[a] if a in expr.reduce else size for a, size in enumerate(tile))
        return tile
    sweep = calc.sweep(tile, upper)
    if sweep is None:
        return tile
    step = next(a for a in range(len(tile)) if sweep[1][a] != tile[a])
    return sweep[1] if _runs_along(expr, t, step) else tile


def _reduction_along(expr, t: int, dim: int) -> int | None:
    """The reduction axis that alone, at a unit coefficient, indexes dimension `dim` of input `t`
    (a matmul's K along B's rows, gemv's along A's columns), or None."""
    terms = expr.inputs[t].terms[dim]
    return terms[0][0] if len(terms) == 1 and terms[0][1] == 1 and terms[0][0] in expr.reduce else None


def _runs_along(expr, t: int, axis: int) -> bool:
    """Whether input `t` of `expr` is laid out along `axis`: its last (contiguous) dimension
    indexed by that axis alone, at a unit coefficient."""
    return expr.inputs[t].terms[-1] == ((axis, 1),)


def packed_runs(program: RProgram, device: DeviceSpec) -> int:
    """Runs the panel copies read from DRAM where the operator's floor is its DRAM stream
    (`common.is_stream_bound`): each packed input's tile at the pack layer (`CpuPlan.pack_layer`),
    copied once per tile of the iteration space, in the runs `tile_stream_runs` counts. A copy
    that jumps to the next row of its tile starts a stream, as the micro-kernel's streamed reads
    do: 5 x 3491 x 3681, whose B (51 MB) is read from DRAM, ran 12.3 ms with unit tiles of 144
    columns x 704 K-steps (576-byte runs) and 5.3 ms with 1856 x 64 (7.4 KB runs), predicted
    alike without it (two threads, AVX2 Zen 3). An input laid out before the first call
    (`CpuPlan.prepacked`) is copied by no call."""
    if not device.runs_on_cpu or not program.expr.reduce or len(program.tiles) < 2:
        return 0
    plan = cpu_plan(program, device)
    if not plan.packed or not is_stream_bound(program.expr, device):
        return 0
    packed = tuple(t for t, tensor in enumerate(program.expr.inputs)
                   if tensor.name in plan.packed and tensor.name not in plan.prepacked)
    return tile_stream_runs(calculus(program.expr), program.tiles[min(plan.pack_layer, len(program.tiles) - 1)], packed)


def tile_stream_runs(calc, tile, streamed: tuple[int, ...]) -> int:
    """Per tile, the runs of each `streamed` input's data tile, as `TileCalculus.input_bytes`
    counts them (its innermost dimension narrower than the tensor's, every dimension inside it
    whole: a 64 x 112 tile of a 2048 x 1001 B is 64 runs of 448 bytes, a 4 x 1008 tile one run of
    4 whole rows), times the tiles of the iteration space."""
    shapes = calc.data_tiles(tile)
    return calc.num_tiles(tile) * sum(prod(shapes[t][:_run_dim(shapes[t], calc.expr.inputs[t].shape)]) for t in streamed)


def _run_dim(shape, full) -> int:
    """The dimension a data tile of `shape` in a tensor of `full` runs along: its innermost one
    narrower than the tensor's (0 when it is the whole tensor)."""
    return next((d for d in reversed(range(len(shape))) if shape[d] < full[d]), 0)


# A streamed input whose rows lie at most half this apart is one stream through each page its
# rows cross, not a stream a run: the L2 streamer follows one forward stream a 4 KiB page (Intel's
# optimization manual). 8 batches of 7 x 9377 x 64 on two Xeon Emerald Rapids cores (B's rows
# 256 bytes apart): read in place 640 us, over B packed 1082, timed in turns; a latency a run
# priced the first 2x the second. 1 x 2048 x 1001's rows, 4004 bytes apart, cost a latency a run
# (`stream_seconds`; docs/model-evidence.md#stream-runs).
PAGE_BYTES = 4096


def stream_rounds(program: RProgram, device: DeviceSpec) -> float:
    """The `stream_runs` as the latencies they cost one after another: the runs of a streamed
    input that one register tile reads together (a reduction's rows, a K-unrolled step's rows of
    B) have their first misses outstanding at once, so they start in one latency; a panel copy
    reads its runs one after another. reduce-rows (256 x 4096, the 2-core Zen 4 of the committed
    runs): register tiles of 8 rows over L1 tiles of 8 x 512 start twice the runs of 4 over 4 x
    1024 and ran as fast (26.8-30.5 us against 28.5-29.7, 4 MB at the last-level cache's 155 GB/s)
    where one latency a run priced them at 150 against 104 us (docs/model-evidence.md#stream-runs).
    Rows at most half a page apart (PAGE_BYTES) start a round a page the tile's rows cross."""
    streamed = streamed_inputs(program, device)
    if not streamed:
        return packed_runs(program, device)
    rounds = 0.0
    calc = calculus(program.expr)
    registers = calc.data_tiles(program.tiles[0])
    for t in streamed:
        tile = stream_tile(program, t)
        shapes = calc.data_tiles(tile)
        run = _run_dim(shapes[t], calc.expr.inputs[t].shape)
        pitch = prod(calc.expr.inputs[t].shape[run:]) * calc.expr.inputs[t].itemsize
        if run and 2 * pitch <= PAGE_BYTES:
            rounds += prod(shapes[t][:run]) * pitch / PAGE_BYTES * calc.num_tiles(tile)
            continue
        rounds += resumed_rounds(program, device, t,
                                 prod(shapes[t][:run]) / max(1, prod(registers[t][:run])) * calc.num_tiles(tile))
    return rounds + packed_runs(program, device)


# Rows a core's hardware prefetchers keep following while a walk visits other rows, by vendor:
# Intel's L2 streamer keeps 32 streams (its optimization manual). gemv-4096 (A 64 MB from DRAM,
# in L1 tiles of 8 rows x 1024, walked in unit tiles of 16-256 rows, each row's next 1024 floats
# read at the unit's next reduction step) on two Xeon Emerald Rapids cores, two runs: 16 and 32
# rows 956-997 us, 64 970-1014, 128 1018-1075, 256 1037-1098 (tests/fixtures/runs-avx512-xeon-
# emr-2core.json.gz; docs/model-evidence.md#resumed-runs). AMD's cores are left out: on the Zen 5
# the same programs ran fastest under 128 rows (1.12-1.64 ms, 16 rows 1.31-1.73), on the Zen 4
# within their noise.
FOLLOWED_STREAMS = {"intel": 32}


def resumed_rounds(program: RProgram, device: DeviceSpec, t: int, rounds: float) -> float:
    """The `rounds` of streamed input `t` left to start where a tile cuts the reduction that runs
    along `t`'s contiguous dimension (gemv's A in unit tiles of 1024 of its 4096 columns): the
    walk comes back to each of that tile's rows at its next reduction step, and the row's run
    goes on where the prefetchers still follow it. They follow FOLLOWED_STREAMS rows of the
    vendor's at once: of a walk over R rows in turn (those of the lowest tile, from the L1 tile
    up, that the layer above or the core's loop over the reduction cuts), a share
    min(1, streams / R) of the runs goes on, the least being one run a row over the core's whole
    reduction. Unchanged on another vendor's cores and where the L1 tile spans the reduction."""
    streams = FOLLOWED_STREAMS.get(device.vendor)
    expr = program.expr
    k = _reduction_along(expr, t, -1)
    if streams is None or k is None:
        return rounds
    above = [tile[k] for tile in program.tiles[2:]] + [expr.axes[k].extent]
    cut = next((l for l, tile in enumerate(program.tiles[1:], 1) if tile[k] < above[l - 1]), None)
    if cut is None:
        return rounds
    calc = calculus(expr)
    walked = prod(calc.data_tiles(program.tiles[cut])[t][:-1])
    unit = program.unit_tile
    least = (prod(calc.data_tiles(unit)[t][:-1]) / max(1, prod(calc.data_tiles(program.tiles[0])[t][:-1]))
             * calc.spatial_tiles(unit))
    if least >= rounds:
        return rounds
    return least + (1 - min(1.0, streams / walked)) * (rounds - least)


def stream_seconds(program: RProgram, device: DeviceSpec, busy: float) -> float:
    """What starting the `stream_runs` costs the busiest core beyond their bytes: the bottom
    layer's latency once per run, the runs dealt over the busy cores. A run that jumps to
    another row starts a new stream the hardware prefetchers have not yet followed (and, rows
    4 KiB apart and more, a new page); only a long one hides it (1x2048x1001 on one Zen 3
    core, L1 tiles of 64 rows x 448 B, 1344 B and whole rows: 950, 430 and 188 us, about 40 ns
    a run; evidence: docs/model-evidence.md#stream-runs). Priced at the bottom layer's
    latency, also where the operator stays in the last-level cache (faster to start); runs read
    together start together (`stream_rounds`)."""
    rounds = stream_rounds(program, device)
    if not rounds:
        return 0.0
    return rounds * device.layers[-1].latency_ns * 1e-9 / (device.compute_units * busy)


# The share of DRAM's bandwidth two cores get reading a matrix in strips, runs of every row, where
# each core reading a block of whole rows gets all of it (`strips_seconds`). Measured on the 2-core
# Zen 4: a C loop summing a 4901 x 7705 float matrix (151 MB) in vectors, each core its half, ran
# 2.4-4.9 ms in blocks of whole rows and 6.2-10.4 ms in strips 176 to 3,856 columns wide
# (evidence: docs/model-evidence.md#whole-rows).
STRIPS_SHARE = 0.5


def strips_seconds(program: RProgram, device: DeviceSpec, busy: float) -> float:
    """What reading inputs from DRAM in strips costs beyond their bytes at its bandwidth, where
    the operator does not stay in the last-level cache the spec names (`past_llc`): the inputs
    read in place from below the caches (`axes.stored_past_caches`) whose unit tile's data
    tile is narrower than their rows, each unit tile's data tile moved from DRAM at
    STRIPS_SHARE of the bandwidth (a few-row matmul's B in unit tiles of some of its columns).
    Not a one-row matmul's B (`axes.always_streamed`), whose runs `stream_seconds` prices."""
    expr = program.expr
    if not device.runs_on_cpu or not expr.reduce or len(program.tiles) < 2 or not past_llc(expr, device):
        return 0.0
    calc, unit = calculus(expr), program.unit_tile
    shapes, streamed = calc.data_tiles(unit), always_streamed(expr, device)
    strips = sum(prod(shapes[t]) * tensor.itemsize for t, tensor in enumerate(expr.inputs)
                 if t not in streamed and stored_past_caches(expr, device, tensor) and shapes[t][-1] < tensor.shape[-1])
    return strips * calc.num_tiles(unit) * (1 / STRIPS_SHARE - 1) / (device.layers[-1].bandwidth_gbps * GB * busy)


# Little's law for the lines no prefetcher fetched (`unfollowed_seconds`): a core has as many of
# them in flight as the reduction steps its reorder window holds read lines, at most its L1's fill
# buffers: Golden Cove's 512-entry window and 16 fill buffers (Intel's optimization manual; AMD's
# Zen 3 and 4 have 256- and 320-entry windows: not measured). On two Xeon Emerald Rapids cores, B
# read in place under unit tiles of 256-288 of its rows against 48: 19 x 6469 x 7104 (register
# tiles of 19 x 16, 39 instructions a step: 13 lines in flight) 17.4 against 5.9 ms, priced 15.4
# against 6.1; 19 x 4096 x 1024 1.23 against 0.67 ms (1.40, 0.53); 9 x 4096 x 1024 in 9 x 16 (19
# a step: 16 lines) 0.66 against 0.45 (1.10, 0.37) (evidence: docs/model-evidence.md#prefetch-rows).
WINDOW_UOPS = 512
FILL_BUFFERS = 16


def unfollowed_seconds(program: RProgram, device: DeviceSpec, busy: float) -> float:
    """What reading inputs from below the core's caches in place costs the busiest core beyond
    their bytes, where its L1 tiles walk more of their rows in turn inside a unit tile than the
    prefetchers follow (`axes.unfollowed_reads`: an input read once from below the lowest cache
    layer, and a model's operator's input on its first pass): each of its lines a miss of its
    own, at the bottom layer's latency, as many at a time as `lines_in_flight`. Where they walk
    fewer rows but read an input read once from below a line a visit, in runs too short for the
    prefetchers to catch up (`axes.unramped_share`: a 1x1 conv's data under unit tiles of a few
    pixels), that share of its lines. Not for an input the template copies first (packed into
    panels, its border copied, gathered): a copy reads its rows one after another, one stream at
    a time."""
    expr = program.expr
    if not device.runs_on_cpu or len(program.tiles) < 2:
        return 0.0
    plan = cpu_plan(program, device)
    copied = set(plan.packed) | set(gathered_inputs(expr)) | (set(padded_inputs(expr)) if plan.staged_padding else set())
    bottom = device.layers[-1]
    seconds = 0.0
    register, first, unit = program.register_tile, program.tiles[1], program.unit_tile
    walked = unfollowed_reads(expr, device, register, first, unit)
    for t in sorted(set(walked) | set(read_once_below(expr, device, register))):
        if expr.inputs[t].name in copied:
            continue
        share = 1.0 if t in walked else unramped_share(expr, device, t, register, first, unit)
        lines = expr.inputs[t].nbytes / bottom.transaction_bytes
        seconds += share * lines * bottom.latency_ns * 1e-9 / lines_in_flight(program, device, t)
    return seconds / (device.compute_units * busy)


def lines_in_flight(program: RProgram, device: DeviceSpec, t: int) -> float:
    """Lines of input `t` one core's misses keep in flight (Little's law; WINDOW_UOPS): the
    reduction steps of the register tile its reorder window holds, each the step's loads and
    FMAs (`registers.step_loads`, `registers.accumulators`), times the lines a step reads of the
    input, at most FILL_BUFFERS."""
    expr, register = program.expr, program.register_tile
    step = tuple(1 if a in expr.reduce else size for a, size in enumerate(register))
    uops = step_loads(expr, device, step) + accumulators(expr, device, step)
    step_bytes = prod(calculus(expr).data_tiles(step)[t]) * expr.inputs[t].itemsize
    return min(FILL_BUFFERS, WINDOW_UOPS / uops * ceil(step_bytes / device.layers[-1].transaction_bytes))


def epilogue_seconds(program: RProgram, device: DeviceSpec, busy: float) -> float:
    """The blocks after the main block (`TensorExpr.epilogue_ops`: a GELU's erf per output,
    softmax's exp, sum and division passes over each row), on the cores the grid keeps busy:
    one instruction per FMA pipe and cycle, half the fp32 peak, which counts an FMA as two.
    An epilogue folded into the write-back runs in full vectors (`codegen.cpu` stores it so); a
    pass over rows of its own (`TensorExpr.row_passes`) takes the instructions `row_vector`
    counts per row: vectors of the width that divides the row, a reduction's scalar sum across
    its lanes, and one instruction an element where the row stays scalar (ragged or strided)."""
    expr = program.expr
    if not expr.epilogue_ops:
        return 0.0
    lanes = cpu_plan(program, device).lanes
    rows = sum(p.ops * p.rows * p.extent for p in expr.row_passes)
    slots = sum(p.ops * p.rows * (row_vector(p.extent, lanes, p.reduction).slots if p.contiguous else p.extent)
                for p in expr.row_passes)
    return (expr.epilogue_ops - rows + slots * lanes) / (device.peak(expr.dtype) / 2 * GB * busy)


def epilogue_read_seconds(program: RProgram, device: DeviceSpec, busy: float) -> float:
    """Time to read the inputs only the blocks after the main block read
    (`TensorExpr.epilogue_input_bytes`: a residual added to a conv's output, a bias vector),
    every element once as the write-back folds the epilogue in, from the bottom layer at the
    rate `layer_gbps` gives it (the last-level cache's where the operator stays there: a model's
    kernel reads what an earlier one wrote), on the cores the grid keeps busy. `price` counts it
    with the bottom layer's transfers, as the output's lines going back there are, so it
    overlaps the core's time as they do (`combine_stages`). Six 1 x 1 convs timed in turns with
    and without a residual (the same tiles, two Xeon Emerald Rapids cores): 0.3-4.9 MB of
    residual cost 0.7-2.2x this price as AVX-512 code (medians of three runs), 0.24-1.6x as AVX2
    code (docs/model-evidence.md#epilogue-inputs)."""
    q = program.expr.epilogue_input_bytes
    if not q:
        return 0.0
    return q / (layer_gbps(program, device, len(device.layers) - 1) * GB * busy)


def edge_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a ragged row's edge (`CpuPlan.split_edges` on the row path, priced lane by lane:
    `cpu_compute.lane_priced_edge`, a matmul's) costs the core that holds it beyond its vectors: the
    S lanes it runs as guarded scalar FMAs and the X past the row's end whose guard it tests
    (`cpu_compute.edge_split`), along each of the register tiles' rows and each reduction step, at
    GUARDED_LANE_CYCLES and EDGE_SKIP_CYCLES of the core's clock (`core_ghz`; a spec without FMA
    facts: the clock its peak implies with one pipe). The edge lies in the last unit tile along the
    row, so the cores share it only as they share the unit tiles of that column: a one-row matmul's
    edge is all one core's, while the other cores stream their columns (1 x 2304 x 1309 in 1 x 224
    tiles of 672 columns, all 224 lanes of the cut tile scalar: 343 us against 91 for 1344 columns;
    1 x 3001 x 777 in 80 columns of 720, 663 of the edge's 720 lanes past the end: 721 us against
    117 in 400). The compute term keeps only the vectors (`cpu_compute.edge_slowdown`). None
    where the edge runs in LLVM's vector pieces (`cpu_compute.edge_in_pieces`: one unit tile
    spans the row), which the compute term prices. A row that ends on a vector
    (`CpuPlan.edge_in_vectors`) tests the guard once per vector past its end, not per lane.
    A row whose edge tile runs its whole vectors apart (`CpuPlan.edge_vectors`) adds their
    chains (`edge_chain_seconds`)."""
    if not device.runs_on_cpu:
        return 0.0
    return _lane_edge_seconds(program, device) + edge_chain_seconds(program, device)


def _lane_edge_seconds(program: RProgram, device: DeviceSpec) -> float:
    """The guarded lanes and tested lanes of `edge_seconds`, on a CPU."""
    expr = program.expr
    plan = cpu_plan(program, device)
    if plan.path != ROW or not lane_priced_edge(program, device) or edge_in_pieces(program, device):
        return 0.0
    _, scalar, past = edge_split(program, device)
    rows, steps = _rows_and_steps(program, plan.vector_axis)
    others = [a for a in expr.spatial if a != plan.vector_axis]
    column = prod(-(-expr.axes[a].extent // program.unit_tile[a]) for a in others)  # the unit tiles holding the edge
    share = -(-column // device.compute_units) / column
    if plan.edge_in_vectors:
        past //= vector_width(program.register_tile[plan.vector_axis], plan.lanes)
    cycles = scalar * GUARDED_LANE_CYCLES + past * EDGE_SKIP_CYCLES
    return cycles * rows * steps * share / (clock_ghz(program, device) * GB)


def _rows_and_steps(program: RProgram, row_axis: int) -> tuple[int, int]:
    """The register tiles' rows across the spatial axes but `row_axis` (each padded to whole
    register tiles), and the operator's reduction steps."""
    expr, reg = program.expr, program.register_tile
    rows = prod(-(-expr.axes[a].extent // reg[a]) * reg[a] for a in expr.spatial if a != row_axis)
    return rows, prod(expr.axes[a].extent for a in expr.reduce)


def edge_chain_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What the register tile apart at the end of each unit tile along a split row
    (`CpuPlan.edge_vectors`, `codegen.cpu._edge_tile_apart`) adds to the busiest core beyond the
    stream it overlaps: each of its vectors sums its K-steps in one register, a chain of one FMA
    per `fma_latency_cycles` with nothing but the next vector's chain beside it, for every row
    of the register tiles in it; the cores deal the unit tiles along the row. 1 x 2780 x 881 in
    1 x 56 tiles of 448 columns: 110 us against 85 for 896 columns (no edge, two Zen 3 cores), 7
    vectors of 2780 4-cycle chains on each core, 22 us (docs/evidence.md#edge-vectors). None
    without FMA facts."""
    if not device.runs_on_cpu or not device.fma_latency_cycles:
        return 0.0
    plan = cpu_plan(program, device)
    if not plan.edge_vectors:
        return 0.0
    v = plan.vector_axis
    rows, steps = _rows_and_steps(program, v)
    tiles = rows * -(-program.expr.axes[v].extent // program.unit_tile[v])  # each unit tile's row ends in one
    vectors = -(-program.register_tile[v] // vector_width(program.register_tile[v], plan.lanes))
    cycles = -(-tiles // device.compute_units) * vectors * steps * device.fma_latency_cycles
    return cycles / (clock_ghz(program, device) * GB)


# Cycles a core spends storing one output element on its own: a register tile whose write-back
# TVM scalarises (`guarded_store_seconds`) moves its accumulators through a buffer on the stack
# and stores them an element at a time (`vmovss`, `vextractps`). Fitted on two Zen 4 cores,
# 213 x 13 x 809 against 216 x 13 x 809 (ten programs of 4-27 rows in 16 or 32 columns): the cut
# tiles cost 0.9-1.9 cycles a valid element beyond their price, 1.7-1.8 for 18 to 27 rows
# (docs/model-evidence.md#guarded-store-cycles).
GUARDED_STORE_CYCLES = 1.7


def guarded_store_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What the output elements a CPU program stores one at a time cost its busiest core, at
    GUARDED_STORE_CYCLES each. A padded program storing its register tiles straight to the
    output (`CpuPlan.padded_tails` and `direct_stores`) stores each tile under TVM's guard of
    every spatial axis's end, one predicate inside the loop over the vector's lanes; where the
    vector axis is ragged, the lane test varies across the lanes. Loop partitioning lifts the
    guard from the tiles inside the output. An axis's end that one unit tile spans is a constant
    there; an end that lies in one of several unit tiles along the axis depends on the grid's
    index, and the register tiles it cuts keep the predicate: their valid elements are stored
    one at a time, on the cores holding the unit tiles at that end (213 x 13 x 809 in 18 x 16
    tiles under unit tiles of 108 x 816: the 15 rows of the cut tiles, on the second core, ran
    30 us against 25 over 216 rows; 161 filters in one unit tile of 162 cost nothing). The
    vector axis's own cut tile is left out: it holds a handful of columns. Where several unit
    tiles lie along the vector axis and too few along the rows, the grid deals each core a part
    of every output row, a cost of its own that is not priced (docs/model-evidence.md#split-rows)."""
    if not device.runs_on_cpu:
        return 0.0
    plan = cpu_plan(program, device)
    v = plan.vector_axis
    if not (plan.padded_tails and plan.direct_stores) or v is None or v not in program.expr.spatial:
        return 0.0
    expr, reg, unit, cores = program.expr, program.register_tile, program.unit_tile, device.compute_units
    extents = {a: expr.axes[a].extent for a in expr.spatial}
    if extents[v] % reg[v] == 0:
        return 0.0  # no lane test: a cut tile's row test is the same for every lane
    tiles = {a: -(-extents[a] // unit[a]) for a in expr.spatial}
    elements = 0.0
    for a in expr.spatial:
        if a == v or tiles[a] < 2 or not extents[a] % reg[a]:
            continue
        # the cut tiles along `a` lie in the unit tiles at its end, which the grid deals over the cores
        holding = prod(t for b, t in tiles.items() if b != a)
        others = prod(e for b, e in extents.items() if b != a)
        elements += extents[a] % reg[a] * others * -(-holding // cores) / holding
    return elements * GUARDED_STORE_CYCLES / (clock_ghz(program, device) * GB)


# What one output line written by two cores costs the program: the line moves from one core's
# cache to the other's (and back) while both write it. Measured on the 2-core Zen 5 host (4
# images x 17 channels -> 176 1x1 filters over 7 x 7, unit tiles of 32 of the 49 pixels: 1,320
# lines shared a call): 2.2 ns a line more than unit tiles of whole planes in one state of the
# host, 26 ns in the other, which lasted seconds to whole processes; 40 cycles (10 ns at its
# 3.97 GHz) lies between (docs/model-evidence.md#shared-output-lines).
SHARED_LINE_CYCLES = 40


def shared_output_lines(program: RProgram, device: DeviceSpec) -> int:
    """Output cache lines that two cores write, where the grid's split between the cores falls
    inside the output's rows. The CPU template fuses the unit tiles' loops in the order of the
    spatial axes and runs them on all cores (`codegen.cpu._parallelise`); TVM deals the fused
    tiles in contiguous chunks of ceil(grid / cores) (its static schedule). At a chunk boundary
    whose tile differs from the one before first along axis m (the innermost nonzero digit of
    the fused index), the two cores share every row of that tile's outer axes (the axes before m:
    each row runs over m and the axes inside it, contiguous): one core writes the row up to the
    tile boundary along m, the other the rest, and the first the start of the next row again.
    That is a line at the boundary and one at the row's end per row, less those on a line's
    start (rows and boundary offsets whose bytes the line divides: the share follows from the
    gcd of the rows' strides and the line), and never more lines than the rows span. A boundary
    with one row (a one-row block, a split between whole rows) costs a line or two per core and
    is left out, as are outputs laid out against the loop order (not made by the catalog). With
    two cores this is within 20 % of visiting every element (tests/test_model.py); with more,
    boundaries of different axes that meet at one row end count it twice (up to a third more).
    A split on a line's start shares no line, yet long parts of a row cost the stores more on
    two cores; that is not priced (docs/model-evidence.md#split-rows)."""
    expr = program.expr
    units = device.compute_units
    if not device.runs_on_cpu or units < 2 or program.grid < 2:
        return 0
    out, unit, extents, spatial = expr.output, program.unit_tile, expr.extents, expr.spatial
    stride = [abs(sum(coeffs[a] * out.strides[d] for d, (coeffs, _) in enumerate(out.index))) for a in spatial]
    if any(later > earlier for earlier, later in zip(stride, stride[1:])):
        return 0
    grid = [-(-extents[a] // unit[a]) for a in spatial]
    fused = prod(grid)
    chunk = ceil(fused / units)
    line, size = device.layers[-1].transaction_bytes, out.itemsize
    shared, blocks = 0, set()
    for boundary in range(chunk, fused, chunk):
        digits, rest = [], boundary
        for g in reversed(grid):
            digits.append(rest % g)
            rest //= g
        digits.reverse()
        m = max(d for d, digit in enumerate(digits) if digit)
        rows = prod(min(unit[a], extents[a] - digit * unit[a]) for a, digit in zip(spatial[:m], digits))
        if rows < 2:
            continue
        span = extents[spatial[m]] * stride[m] * size  # a row's bytes
        offset = digits[m] * unit[spatial[m]] * stride[m] * size  # the boundary's within its row
        step = gcd(line, *(stride[d] * size for d in range(m)))
        cycle = line // step  # rows before their starts repeat their place in a line
        spanned = -(-rows * span // line)
        if span < line:  # rows shorter than a line: both cores write in every line of the block
            shared += spanned
            continue
        # per row: the boundary's line unless it starts one (rows whose start puts the boundary on
        # a line's start: one in `cycle`, where the gcd allows it), the row end's unless it ends
        # one or an earlier boundary of these rows counted it; a boundary less than a line from
        # its row's start or end shares that line with the end as often as one line holds both
        inside = 1 - (1 / cycle if offset % step == 0 else 0)
        end = 1 - 1 / cycle
        counted = 0 if (m, *digits[:m]) in blocks else end  # rows another boundary cut already
        blocks.add((m, *digits[:m]))
        near = max(0.0, 1 - offset / line) + max(0.0, 1 - (span - offset) / line)
        lines = rows * (inside + counted - (end * min(1.0, near) if inside else 0))
        shared += min(round(lines), spanned)
    return shared


def split_sum_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a split program (`RProgram.split` = S > 1: its grid counts S parts per unit tile,
    each over 1/S of the reduce axis, so its loads and compute are the unsplit program's spread
    over more cores) adds after its parallel loop: the partial sums' bytes (`partial_sum_bytes`)
    at the bottom layer's bandwidth (`layer_gbps`: the last-level cache's where the operator
    fits it), the sum running on one core (`codegen.cpu._final_sum`) over partial sums the
    other cores left in their caches. The same kernel: no launch. 0 for unsplit programs."""
    moved = partial_sum_bytes(program)
    return moved / (layer_gbps(program, device, len(device.layers) - 1) * GB) if moved else 0.0


def transfer_seconds(program: RProgram, device: DeviceSpec, layer: int, q: int, scalar: bool = False) -> float:
    """Time to move `q` bytes for a CPU program's tiles at `layer` from the layer below with every
    core busy, at the source's bandwidth (`layer_gbps`). A register row left scalar (`scalar`:
    `scalar_row` of the program as Roller staged it, which decides the template's panels, where
    `program` here is the one `hardware_caches` moves data through) reads from L1 one element a
    load: `lanes` times as long as the vector loads the calibrated bandwidth was measured with."""
    src = source_layer(program, layer, len(device.layers))
    bandwidth = layer_gbps(program, device, src) * GB
    if layer == 0 and scalar:  # one element a load, where a vector moves `lanes`
        return q * scalar_lanes(program, device) / bandwidth
    return q / bandwidth


# Of the reloads Q(tile) counts beyond the neighbours' shared traffic where what one step of a
# CPU cache tile's sweep touches does not fit the layer (`cache_traffic`), the share that costs:
# the rest stays in the layer (a cache is not a strict LRU over that cycle) or streams back in
# the prefetchers' shadow. Fitted over `bench model` on the committed runs of three CPUs and
# fresh random runs on one (1, 0.5, 0.25 and 0.1 tried; docs/model-evidence.md#cache-traffic).
SPILL_RELOAD = 0.25


def cache_traffic(program: RProgram, device: DeviceSpec, layer: int) -> int:
    """Bytes `program`'s tiles at `layer` load from the layer below: Roller's Q(tile), except
    where a CPU cache tile's neighbours share what stays (`TileCalculus.sweep`): when one step
    of the innermost stepping spatial loop, over all the reduction steps of the tile above,
    fits the layer, the run of neighbours loads `traffic_bytes(swept)` (a conv's packed filter
    panel is loaded once per row of output tiles, not once per tile); where it does not, that
    plus SPILL_RELOAD of the rest of Q(tile); at the top layer, less the inputs that stay
    (`resident_reloads`). GPU tiles are explicit copies per tile, and the unit tile's neighbours
    are other cores' work: Q(tile) (evidence: docs/model-evidence.md#cache-traffic)."""
    calc = calculus(program.expr)
    tile = program.tiles[layer]
    if not device.runs_on_cpu or layer == 0:
        return calc.traffic_bytes(tile)
    line, scattered = device.layers[layer].transaction_bytes, scattered_inputs(program, device)
    q = calc.traffic_bytes(tile, line, scattered)
    if layer + 1 >= len(program.tiles):
        return q - resident_reloads(program, device, line, scattered)
    sweep = calc.sweep(tile, program.tiles[layer + 1])
    if sweep is None:
        return q
    shared = min(q, calc.traffic_bytes(sweep[1], line, scattered))
    if calc.footprint_bytes(sweep[0], line=line, in_lines=scattered) > device.layers[layer].capacity_bytes:
        return shared + round(SPILL_RELOAD * (q - shared))
    return shared


# The share of a core's top cache layer an input read in place may take and stay there while the
# tiles stream the rest through it: half (0.25 and 1.0 gave the same `bench model` scores;
# docs/model-evidence.md#resident-inputs).
RESIDENT_SHARE = 0.5


def resident_reloads(program: RProgram, device: DeviceSpec, line: int, scattered: frozenset[int]) -> int:
    """Bytes of Q(top tile) that stay in a core's top cache layer: an input read in place (not
    packed into panels, whose copies are made per tile) whose whole tensor takes at most
    RESIDENT_SHARE of the layer is loaded once by each core that runs tiles (or its tiles' data
    tiles, where those are less), not once per tile. Q reloads gemv-4096's x (16 KiB) from DRAM
    for each tile of rows: 10 % more time at 8 rows than at 128, an order its runs do not show
    (evidence: docs/model-evidence.md#resident-inputs)."""
    calc, top = calculus(program.expr), len(program.tiles) - 1
    tile, packed = program.tiles[top], cpu_plan(program, device).packed
    tiles = calc.num_tiles(tile)
    cores = min(tiles, device.compute_units)
    per_tile = calc.input_bytes(calc.data_tiles(tile), line, scattered)
    kept = 0
    for t, tensor in enumerate(program.expr.inputs):
        whole = tensor.nbytes
        if tensor.name in packed or whole > RESIDENT_SHARE * device.layers[top].capacity_bytes:
            continue
        once = cores * min(whole, -(-tiles // cores) * per_tile[t])
        kept += max(0, tiles * per_tile[t] - once)
    return kept


def scattered_inputs(program: RProgram, device: DeviceSpec) -> frozenset[int]:
    """The inputs a CPU cache layer holds and loads in whole lines (`TileCalculus.input_bytes`):
    those that do not read the axis the register row runs along: the loop the template
    vectorises (`CpuPlan.vector_axis`), or where it vectorises none, the axis the alignment
    rules laid the row along (`lane_axis`: a scalar row still walks it, consecutive outputs
    sharing their input lines). An input that reads it is streamed in vectors, packed into
    panels (matmul's B, a convolution's filters, whose 3-element rows of one filter would
    otherwise count a line each) or read along its contiguous axis; one that does not is read
    an element at a time (a convolution's data, broadcast) or in tiles whose rows the alignment
    rules make whole lines (matmul's A)."""
    vector = cpu_plan(program, device).vector_axis
    row = vector if vector is not None else lane_axis(program.expr, device)
    inputs = program.expr.inputs
    return frozenset(t for t, tensor in enumerate(inputs) if row is None or not tensor.uses_axis(row))


# The share of the shorter of a plain projection's core time and its transfers from the bottom
# layer (L3 or DRAM) that adds to the longer (`combine_stages`); the L2's streamer overlaps the
# rest. Fitted, not derived: over the committed runs of four CPUs and 73 workloads measured on a
# fifth (an Emerald Rapids Xeon, whose L3 serves a core 36 GB/s), 0.65 to 0.75 raised the Zen 3's,
# the Zen 4's and the Xeon's mean Spearman and every matmul set's, kept the 16-core Xeon's, and
# cost the Zen 5 0.004 and the random convs 0.003-0.011; 52 workloads drawn after agree (evidence:
# docs/model-evidence.md#bottom-added-share).
BOTTOM_ADDED_SHARE = 0.7


def combine_stages(program: RProgram, device: DeviceSpec, compute: float, loads: dict[str, float],
                   hidden: float = 0.0, lanes: bool = False) -> float:
    """One CPU core's time from its stage times: the register tile's loads from the layer right
    below the registers issue in the FMAs' shadow (same instruction stream, separate ports), so
    they overlap the compute, as do the `hidden` seconds of the inputs' transfers into that layer
    where `hidden_source` says they stream ahead; every other transfer further down (`loads`
    but the first layer's) adds: a core copies the next panel from L2 or DRAM between two
    micro-kernel runs, its accumulators' trips wait on the FMAs that fill them, and the hardware
    prefetchers hide only part of a stream (the Execution-Cache-Memory model's observation,
    Treibig & Hager 2010, that x86 cache-level transfers do not overlap one another;
    ALGORITHMS.md §7; evidence: docs/model-evidence.md#combine-stages). On the `lanes` path (a
    dot product per output along K, its register tile's inputs both read along the lanes: a
    gemv, a matmul whose B is read transposed in place) the register loads add to the FMAs
    instead: 1 x 13 x 16 tiles of 53 x 15437 x 481 with B transposed, a load for each FMA, ran
    the sum of the two on two Zen 5 cores, twice their overlap (evidence:
    docs/model-evidence.md#lanes-loads). Where every input is a plain projection, the L2's
    streamer fetches the bottom layer's runs ahead of the demand loads: of the shorter of the
    core's time and those transfers, all but BOTTOM_ADDED_SHARE overlaps the longer."""
    first = device.layers[source_layer(program, 0, len(device.layers))].name
    bottom = device.layers[-1].name if first != device.layers[-1].name else None
    register = loads.get(first, 0.0)
    core = max(compute + register, hidden) if lanes else max(compute, register, hidden)
    core += sum(t for name, t in loads.items() if name not in (first, bottom))
    streamed = loads.get(bottom, 0.0)
    if not plain_projections(program.expr):
        return core + streamed
    return core + streamed - (1 - BOTTOM_ADDED_SHARE) * min(core, streamed)


def hidden_source(program: RProgram, device: DeviceSpec) -> int | None:
    """The cache layer under a CPU program's first whose transfers of the inputs into the first
    overlap the compute (`combine_stages`), or None. Where every input is a plain projection
    (`axes.plain_projection`: a matmul's A and B, a conv's pixels or gathered windows as a GEMM),
    its L1 tiles read their panels and rows from L2 in runs the L1's prefetchers fetch ahead of
    the FMAs: reloads of B for every few rows cost what the L2 cannot deliver in the compute's
    time, not their whole transfer. A window's reads (a conv's nest, a pooling) add, as the
    stages below L2 do. Measured, not derived: over the committed runs of three CPUs and 238
    workloads drawn at random and measured on one, hiding them for plain projections raised every
    committed machine's Spearman and every random set's but one conv draw's whose runs disagree;
    hiding them everywhere lowered the committed runs (docs/model-evidence.md#combine-stages)."""
    below = source_layer(program, 0, len(device.layers)) + 1
    if below >= len(device.layers) - 1 or not plain_projections(program.expr):
        return None
    return below


# The share of a CPU cache the output buffer and the tiles streaming past it may fill and stay
# there (`accumulator_home`): all but one way of a 16-way cache, the rest holding what else the
# core touches (stack, code, the prefetchers' lines). Our reconstruction, bracketed by two
# mm-bert-qkv unit tiles (evidence: docs/model-evidence.md#accumulator-fill).
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
    the next layer. A layer holds them in `ACCUMULATOR_FILL` of its capacity, not all of it
    (evidence: docs/model-evidence.md#accumulator-home)."""
    calc = calculus(program.expr)
    out = unit_output_bytes(program)
    last = len(device.layers) - 1
    tiles = program.tiles
    return next((l for l in range(1, last)
                 if out + calc.footprint_bytes(tiles[min(l, len(tiles) - 1)], (), with_output=False)
                 <= ACCUMULATOR_FILL * device.layers[l].capacity_bytes), last)


def buffer_in_llc(program: RProgram, device: DeviceSpec) -> bool:
    """Whether the output buffer that no cache layer of the spec holds (`accumulator_home` at the
    bottom layer) stays in the last-level cache (`DeviceSpec.llc_bytes`) instead: every core's
    buffer beside the input tiles streaming past it in its lowest cache tile, in
    ACCUMULATOR_FILL of it."""
    if not device.llc_bytes:
        return False
    calc, tiles = calculus(program.expr), program.tiles
    held = unit_output_bytes(program) + calc.footprint_bytes(tiles[-1], (), with_output=False)
    return device.compute_units * held <= ACCUMULATOR_FILL * device.llc_bytes


def accumulator_steps(program: RProgram) -> tuple[int, ...]:
    """The tile whose reduction steps take a CPU register tile's accumulators out of the
    registers and back (`TileCalculus.accumulator_bytes`): the first cache tile that holds more
    than one register tile along a spatial axis. Inside a cache tile of one register tile its
    reduction loop runs straight around the micro-kernel's (`S1 R1 | S2 | R2`, S2 of one
    iteration), on the same accumulators, which LLVM keeps in registers across it; with no
    such tile they never leave (the whole iteration space's tile: one step; evidence:
    docs/model-evidence.md#accumulator-steps)."""
    reg = program.register_tile
    spatial = program.expr.spatial
    return next((tile for tile in program.tiles[1:] if any(tile[a] > reg[a] for a in spatial)),
                tuple(program.expr.extents))


# Passes the CPU template's output buffer makes over the unit tile's outputs beyond storing
# them once (`buffer_bytes`): the initialisation's stores, the first K-step's loads of the
# accumulators, their last stores into the buffer, and the write-back's loads.
BUFFER_PASSES = 4


def buffer_bytes(program: RProgram, device: DeviceSpec) -> int:
    """Bytes a CPU reduction's output buffer moves in the layer that holds it
    (`accumulator_home`), beyond the one store of each output: `BUFFER_PASSES` over the padded
    output, where the template accumulates into a buffer of the unit tile's outputs; 0 where it
    stores each register tile's accumulators straight to the output (`CpuPlan.direct_stores`;
    evidence: docs/model-evidence.md#buffer-bytes)."""
    expr = program.expr
    if not device.runs_on_cpu or not expr.reduce or cpu_plan(program, device).direct_stores:
        return 0
    return BUFFER_PASSES * unit_output_bytes(program) * program.grid


# Bytes a core's panel copy moves per cycle: four fp32 elements, fitted to bmm-attn's copies
# (evidence: docs/model-evidence.md#pack-bytes-per-cycle).
PACK_BYTES_PER_CYCLE = 16
# ... and a transposing copy (`panels.transposes`: a conv's filters into vectors of filters),
# each element read on its own: 1.6 B, the median of 13 filter panels of three convs timed with
# and without their copy when it ran scalar, element by element (0.45-3.7 B a cycle); it now
# writes whole vectors and runs faster, but the Zen 3 runs committed for `bench model` were
# recorded with the scalar copy and score lower at any higher rate (evidence:
# docs/model-evidence.md#transposed-bytes-per-cycle).
TRANSPOSED_BYTES_PER_CYCLE = 1.6
# ... and a transposed operand copied into its panels as stored (`CpuPlan.transposed_in_panels`),
# a row at a time (each row read in one run, written down its strip an element a K-step): 2.3 B,
# the median of 13 matmuls on two Zen 4 cores, each timed against its price without the copy
# (1.6-4.6 B a cycle) ...
ROWS_DOWN_STRIPS_BYTES_PER_CYCLE = 2.3
# ... or in blocks staged in registers (`panels.row_block_width`, `codegen.cpu._copy_rows_down_strips`):
# 5.9 B, the median of 34 programs of 12 matmuls timed the same way (3.1-11.3; evidence:
# docs/model-evidence.md#transposed-in-panels).
ROW_BLOCKS_BYTES_PER_CYCLE = 5.9


def packed_bytes(program: RProgram, device: DeviceSpec, transposed: bool = False, rows: bool = False) -> int:
    """Bytes the busiest core writes into panels: the plan's packed inputs (`CpuPlan.packed`)
    at its pack layer's tile (`panels.packed_tile_bytes`), 0 where it packs none or on GPUs.
    Those laid out before the first call (`CpuPlan.prepacked`) are copied by no call.
    `transposed`: those of them whose copy transposes (`panels.transposes`) only; `rows`: the
    transposed operands copied into their panels as stored (`CpuPlan.transposed_in_panels`) only."""
    if not device.runs_on_cpu:
        return 0
    plan = cpu_plan(program, device)
    copied = tuple(t.name for t in _copied_inputs(program, device)
                   if (not transposed or transposes(t, plan.vector_axis))
                   and (not rows or t.name in plan.transposed_in_panels))
    return packed_tile_bytes(program, device, copied, plan.pack_layer) if copied else 0


def _copied_inputs(program: RProgram, device: DeviceSpec) -> tuple:
    """The inputs a CPU program's calls copy into panels: the plan's packed ones (`CpuPlan.packed`)
    but those laid out before the first call (`CpuPlan.prepacked`)."""
    plan = cpu_plan(program, device)
    return tuple(t for t in program.expr.inputs if t.name in plan.packed and t.name not in plan.prepacked)


# A panel buffer's lines, where they do not stay in a core's caches from one call to the next,
# are read for ownership at each call's first copy into them and written back once the copies
# have dirtied them: two transfers of the buffer (`buffer_touch_seconds`).
BUFFER_TOUCHES = 2


def buffer_touch_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a call's copies into its panel buffer (`panels.panel_copy_bytes` of the inputs
    `packed_bytes` counts, one buffer a core, reused by its copies) cost beyond the copying:
    nothing where the buffer stays in the layer it is packed into between calls (the core's share
    of the operator's tensors, every one once, and the buffer fit that layer's capacity), else
    BUFFER_TOUCHES transfers of it from the first layer below that holds them both (the bottom
    layer where none does) at the core's share of that layer's bandwidth (`layer_gbps`).
    9 x 647 x 799 on two Xeon Emerald Rapids cores, A and B packed once per 9 x 432 unit tile:
    its K in steps of 112, 224, 336 and 672 (buffers of 0.2, 0.4, 0.6 and 1.1 MB, the same
    padding) ran 58, 63, 72 and 97 us, where the copies and the reads of the panels are the same
    bytes; only the last overflows the 2 MiB L2 with the core's 1 MB share of the operator
    (evidence: docs/model-evidence.md#buffer-touches)."""
    plan = cpu_plan(program, device)
    buffer = panel_copy_bytes(program, tuple(t.name for t in _copied_inputs(program, device)), plan.pack_layer)
    if not buffer:
        return 0.0
    held = calculus(program.expr).compulsory_bytes() / device.compute_units + buffer
    bottom = len(device.layers) - 1
    source = next((l for l in range(plan.pack_layer, bottom) if held <= device.layers[l].capacity_bytes), bottom)
    if source == plan.pack_layer:
        return 0.0
    return BUFFER_TOUCHES * buffer / (layer_gbps(program, device, source) * GB / device.compute_units)


def packing_seconds(program: RProgram, device: DeviceSpec) -> float:
    """The CPU template's panel copies (`CpuPlan.packed`) on the busiest core: `packed_bytes` at
    `PACK_BYTES_PER_CYCLE` of that core's clock (`core_ghz`), or over its share of the pack
    layer's bandwidth where that is slower (the reads that fill the panel are the loads of the
    unit tile already), and the touches of the buffer they are written into
    (`buffer_touch_seconds`). The copy runs between micro-kernel runs, so it adds to the unit's time,
    as the transfers below the first cache layer do (`combine_stages`). What it decides: a
    6-row unit tile copies all of B for every 6 rows where a 1-row kernel packs nothing
    (Vortex's kernels along a dynamic M), and bmm-attn's 13-row register tiles pad M to 130, so
    every input is copied, where 8 rows divide it and copy nothing. A transposing copy's bytes
    (a conv's filters) move at `TRANSPOSED_BYTES_PER_CYCLE`: a 3x3 conv whose pixel tiles copy its
    1.2 MB of filters 8 times in all ran 2.4 ms against 0.64 for one that copies them once; a
    transposed operand's rows copied down its strips at `rows_bytes_per_cycle`."""
    return _copy_seconds(program, device, packed_bytes(program, device), packed_bytes(program, device, transposed=True),
                         packed_bytes(program, device, rows=True))


def _copy_seconds(program: RProgram, device: DeviceSpec, moved: int, transposed: int, rows: int) -> float:
    """`packing_seconds` of `moved` = `packed_bytes(program, device)`, `transposed` of them by
    transposing copies, `rows` a transposed operand's rows copied down its strips (all three
    computed once by `price`)."""
    if not moved:
        return 0.0
    layer = device.layers[cpu_plan(program, device).pack_layer]
    streamed = moved / (layer.bandwidth_gbps * GB / device.compute_units)
    ghz = core_ghz(device)
    cycles = (moved - transposed - rows) / PACK_BYTES_PER_CYCLE + transposed / TRANSPOSED_BYTES_PER_CYCLE
    if rows:
        cycles += rows / rows_bytes_per_cycle(program, device)
    copying = max(streamed, cycles / (ghz * GB)) if ghz else streamed
    return copying + buffer_touch_seconds(program, device)


def rows_bytes_per_cycle(program: RProgram, device: DeviceSpec) -> float:
    """Bytes a core copies per cycle of a transposed operand read as stored into its strips
    (`CpuPlan.transposed_in_panels`): ROW_BLOCKS_BYTES_PER_CYCLE where the template copies it in
    blocks staged in registers (`panels.row_block_width` of the strips' columns), else
    ROWS_DOWN_STRIPS_BYTES_PER_CYCLE, a row at a time."""
    plan = cpu_plan(program, device)
    blocks = row_block_width(int(program.register_tile[plan.vector_axis]), plan.lanes)
    return ROW_BLOCKS_BYTES_PER_CYCLE if blocks else ROWS_DOWN_STRIPS_BYTES_PER_CYCLE


def gathered_bytes(expr: TensorExpr, device: DeviceSpec) -> int:
    """Bytes the gather of a conv's image moves (`panels.gathered_inputs`): the image's lines its
    rows touch, once per row of the copy (a strided pointwise conv's: every line of a row at a
    stride shorter than a line; a window's im2col reads each row once per tap of the window),
    and the copy it writes, the output's pixels in a row. 0 where nothing is gathered."""
    names = gathered_inputs(expr)
    if not names:
        return 0
    height, width = next(a for a in expr.args if a.role == "output").shape[-2:]
    line = device.layers[-1].transaction_bytes
    moved = 0
    for tensor, arg in zip(expr.inputs, expr.input_args):
        if tensor.name in names:
            rows = prod(tensor.shape[:-1]) * height  # (images, channels x taps) of the copy
            moved += rows * min(arg.shape[-1] * tensor.itemsize, width * line) + tensor.nbytes
    return moved


def gather_seconds(expr: TensorExpr, device: DeviceSpec) -> float:
    """The gather's time (`gathered_bytes`), a copy over every core before the loop nest at a
    panel copy's `PACK_BYTES_PER_CYCLE`, or at the bottom layer's bandwidth where the spec has
    no clock: 15, 18 and 2 us predicted for gathers measured at about 13, 15 and 3-4 (evidence:
    docs/evidence.md#gathered-pixels)."""
    return _gather_time(device, gathered_bytes(expr, device))


# Bytes a core's copy of a transposed operand moves per cycle (`codegen.cpu._transpose_first`:
# blocks of a vector's lanes square, each row of a block one vector store): 2.4 and 3.7 on two
# Zen 4 cores, a 4 and a 6 MB operand, each the view's time less its GEMM's predicted time
# (evidence: docs/model-evidence.md#lane-sum-cycles).
TRANSPOSE_BYTES_PER_CYCLE = 3.0
# ... and from DRAM, where the last-level cache does not hold the operand: each block's lines
# read from and written to rows apart (and each written line read first), the copy moves at
# about a quarter of the bottom layer's bandwidth: 3.3, 4.1 and 5.7 times its streamed time for
# an 87, a 64 and a 109 MB operand on two Zen 4 cores (evidence:
# docs/model-evidence.md#lane-sum-cycles).
TRANSPOSE_DRAM_SLOWDOWN = 4.0


def transpose_seconds(program: RProgram, device: DeviceSpec) -> float:
    """The copies of a GEMM's transposed operands (`ops.transposed_gemm.copied_bytes`: each
    operand read and written once), over every core before the loop nest, but for those copied
    into their panels instead (`CpuPlan.transposed_in_panels`, `packing_seconds`): at
    TRANSPOSE_BYTES_PER_CYCLE, or the bottom layer's bandwidth where that is slower (or the spec
    has no clock), TRANSPOSE_DRAM_SLOWDOWN times slower where that layer is DRAM (an operator
    the last-level cache does not hold, `layer_gbps`)."""
    moved = copied_bytes(program.expr, cpu_plan(program, device).transposed_in_panels)
    if not moved:
        return 0.0
    bottom = len(device.layers) - 1
    gbps = layer_gbps(program, device, bottom)
    slowdown = TRANSPOSE_DRAM_SLOWDOWN if gbps == device.layers[bottom].bandwidth_gbps else 1.0
    streamed = moved * slowdown / (gbps * GB)
    ghz = core_ghz(device)
    if not ghz:
        return streamed
    return max(streamed, moved / (TRANSPOSE_BYTES_PER_CYCLE * device.compute_units * ghz * GB))


# Cycles a core spends per output of a reduction vectorised along its K (`CpuPlan.path` LANES)
# summing the output's vector of per-lane partial sums into one value, its store included: 53
# fitted on attention scores (12 x 128 x 64 x 128, B transposed) on two Zen 4 cores, whose
# 196,608 outputs ran 1.55 ms where their FMAs are priced 0.13 ms (evidence:
# docs/model-evidence.md#lane-sum-cycles).
LANE_SUM_CYCLES = 53
# Partial sums a core adds per cycle where a register tile's lanes are summed right after its
# K-loop (`CpuPlan.direct_stores` on the lanes path), from registers, in code unrolled over the
# tile's outputs and lanes: two, the FP adders of Haswell to Sapphire Rapids and Zen 1 to Zen 5.
# 5 x K x 3459 with B transposed in 5 x 3-output tiles on two Zen 5 cores ran 15.6 us beyond
# its K-steps as AVX-512 code (16 lanes an output: 7.2 cycles) and 7.7 as AVX2 code (8 lanes:
# 3.5 cycles; evidence: docs/model-evidence.md#lane-sum-cycles).
LANE_ADDS_PER_CYCLE = 2


def lane_sum_seconds(program: RProgram, device: DeviceSpec) -> float:
    """What a reduction vectorised along its K (`CpuPlan.path` LANES: gemv, row sums, a GEMM
    whose operands both stream along K) spends beyond its FMAs: per output, the sum across its
    lanes, over the cores the grid keeps busy. Where the L1 tile spans the whole reduction
    (`CpuPlan.direct_stores`), each register tile's are summed after its K-loop from registers:
    the register tile's K (the lanes it keeps per output) at LANE_ADDS_PER_CYCLE; else after
    the grid iteration's whole K, from a buffer of the unit tile's outputs x lanes
    (`codegen.cpu._schedule_lanes`): LANE_SUM_CYCLES. A ragged K's scalar edge is the compute
    term's (`cpu_compute.edge_slowdown`: a vector's slot per edge element). Beside a gemv's
    K-long rows little (4096 outputs of 4096: 0.03 of its time); beside a GEMM's short K most
    of it, unless summed per register tile."""
    plan = cpu_plan(program, device)
    if not device.runs_on_cpu or plan.path != LANES:
        return 0.0
    outputs = prod(program.expr.axes[a].extent for a in program.expr.spatial)
    cycles = program.register_tile[plan.vector_axis] / LANE_ADDS_PER_CYCLE if plan.direct_stores else LANE_SUM_CYCLES
    return outputs * cycles / (min(program.grid, device.compute_units) * clock_ghz(program, device) * GB)


def _gather_time(device: DeviceSpec, moved: int) -> float:
    """`gather_seconds` of `moved` = `gathered_bytes` (computed once by `price`)."""
    if not moved:
        return 0.0
    ghz = core_ghz(device)
    if not ghz:
        return moved / (device.layers[-1].bandwidth_gbps * GB)
    return moved / (PACK_BYTES_PER_CYCLE * device.compute_units * ghz * GB)


def clock_ghz(program: RProgram, device: DeviceSpec) -> float:
    """The clock a CPU program's cycles are priced at: `core_ghz`, or for a spec without FMA
    facts the clock its peak implies with one pipe of the plan's lanes."""
    return core_ghz(device) or device.peak(program.expr.dtype) / (device.compute_units * cpu_plan(program, device).lanes * 2)


def core_ghz(device: DeviceSpec) -> float:
    """A CPU core's clock as its fp32 peak implies: peak / (cores x FMA pipes x lanes x 2 flops);
    0 where the spec has no FMA pipes (Zen 5 EPYC, calibrated 508.6 GFLOP/s over 2 cores x 2
    pipes x 16 lanes: 3.97 GHz)."""
    if not device.runs_on_cpu or not device.fma_pipes:
        return 0.0
    return device.peak("float32") / (device.compute_units * device.fma_pipes * device.warp_size * 2)
