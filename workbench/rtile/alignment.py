"""Roller's alignment (§3.1) put together: `RULES`, the rules a tile size must all accept to be
*aligned* at a layer (`rtile.rules`, and here the accumulator rule, which needs the
register-tile fill), and the scans over them. Candidate sizes at a layer are the multiples of
the tile one layer up (each layer's tile is a multiple of the one above, Figure 7), so
`next_aligned_sizes` scans those multiples upwards and returns, per axis, the first size that
every rule accepts; `initial_tile` finds the smallest aligned tile at a layer.

A CPU core's register tile is a register micro-kernel (the BLIS / oneDNN idea): the output tile
stays in vector registers as accumulators, one vector per output row along the axis the SIMD
lanes run along (`axes.lane_axis`), and every reduction step loads one row of vectors of each
input that axis indexes and broadcasts the elements of the others into one register
(`registers.micro_kernel_registers`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import ceil, prod

from workbench.hardware.registers import register_budget
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import (
    cross_thread_axis, filter_lanes, is_micro_kernel_layer, lane_axis, plain_projections, share_streams_from_l1,
    short_filter_axis, stream_rows_axis, tile_lanes,
)
from workbench.rtile.registers import accumulators, micro_kernel_registers, resident_block_limit, step_loads
from workbench.rtile.rules import (
    MAX_SCAN, AlignContext, AlignmentRule, AutovectorRowRule, BlockThreadsRule, CacheSetRule, StreamRowsRule,
    TailRule, TensorCoreAlignment, TensorShapeRule, ThreadTileRule, TransactionRule, VectorLanesRule, WarpGroupRule,
    WeightsAheadRule, WholeTileRule, block_thread_multiple, l1_set_lines, lanes_are_simd, refusing,
)
from workbench.rtile.traffic import calculus

Tile = tuple[int, ...]


class AccumulatorRule(WholeTileRule):
    """Execution unit, a CPU core's FMA pipes x their latency (ALGORITHMS.md §7, not one
    vector): a reduction's register tile holds at least `required_accumulators` vector
    accumulators, so that the pipes never wait on an FMA latency."""

    name = "accumulators"
    reads_eps = True  # through `required_accumulators`
    applies = staticmethod(lanes_are_simd)  # `is_micro_kernel_layer` is False where lanes are threads

    def tile_ok(self, ctx, tile):
        need = required_accumulators(ctx)
        return not need or accumulators(ctx.expr, ctx.device, tile) >= need


RULES: tuple[AlignmentRule, ...] = (
    TensorShapeRule(), TransactionRule(), ThreadTileRule(), BlockThreadsRule(), VectorLanesRule(), AutovectorRowRule(),
    AccumulatorRule(), WarpGroupRule(), TensorCoreAlignment(), TailRule(), StreamRowsRule(), WeightsAheadRule(),
    CacheSetRule(),
)


@lru_cache(maxsize=4096)  # asked by the accumulator rule on every tile it judges
def required_accumulators(ctx: AlignContext) -> int:
    """Vector accumulators a register tile at `ctx` must hold (0: no such requirement).

    Only a CPU micro-kernel of an operator with a reduce axis and a `lane_axis` has one: its
    FMAs into one accumulator form a dependency chain across the reduction, so the core's
    `fma_pipes` stay busy only with `DeviceSpec.fma_accumulators` (latency x pipes) chains in
    flight. Elementwise operators carry no chain (out-of-order execution overlaps their
    independent vectors), and scalar code (no lane axis) is bound by its lanes. Nor has a one-row
    matmul whose L1 tile can be a core's share of N (`axes.share_streams_from_l1`): each vector of B
    it reads once, from below L1, feeds one FMA, so the stream, not the chains, bounds it, and
    its register tile is what divides that share: 1 x 1151 x 671 in register tiles of 1, 3 and
    7 vectors under 336-column unit tiles 28-38 us, in the 8-vector fill's 9 (144 columns, unit
    tiles of 432) 103-107. Where the share overflows L1 its L1 tile is one register tile, and
    narrower ones ran slower (1 x 183 x 2793 in 80 columns under unit tiles of 1440, 24 us,
    in 176 under 1408 14; docs/evidence.md#one-row-shares).

    Our fallback where that many cannot exist (tiny extents, an operator with few output rows,
    a small register budget, eps too small to pad): the most accumulators any register tile
    that meets the per-axis rules at this eps can hold within the register budget
    (`_accumulator_fill`), so construction still finds programs, with as many accumulators as
    they can have."""
    device, expr = ctx.device, ctx.expr
    if ctx.unfilled or not is_micro_kernel_layer(device, ctx.layer) or not device.fma_accumulators:
        return 0
    if not expr.reduce or lane_axis(expr, device) is None:
        return 0
    if share_streams_from_l1(expr, device):
        return 0
    filled = _accumulator_fill(expr, device, ctx.eps, ctx.ragged)
    if filled is None or not _within_budget(expr, device, filled, register_budget(device)):
        return 0  # no tile fits the registers at this eps: the capacity check refuses them all
    return min(device.fma_accumulators, accumulators(expr, device, filled))


@lru_cache(maxsize=256)
def _accumulator_fill(expr: TensorExpr, device: DeviceSpec, eps: float, ragged: bool = False) -> Tile | None:
    """The register tile a CPU micro-kernel starts from (`initial_tile`): the per-axis aligned
    tile grown to `fma_accumulators` accumulators within the register budget, or to as many as
    any tile can hold there (None when no tile meets the per-axis rules at `eps`).

    Our choice of path, in the spirit of the BLAS micro-kernel shapes: grow one axis that adds
    accumulators (`_accumulator_axes`) at a time to its next aligned size, taking the growth with the fewest registers per
    accumulator (accumulators are the point, loads and broadcasts the overhead), then the
    fewest registers, then the outermost axis. On AVX2 with 10 needed this reaches 5 x 16 (10
    accumulators + 2 vectors of B + 1 broadcast) on the way to BLAS's 6 x 16. Where that path
    stops short of the need (its next steps overflow the budget), the tile with the most
    accumulators up to the need, then the fewest registers, among all tiles within the budget
    (`_tiles_within_budget`). The path can end with more loads than FMAs: `port_free_tile`."""
    ctx = AlignContext(expr, device, 0, tuple(1 for _ in expr.axes), eps, ragged=ragged)
    start = tile = _per_axis_start(ctx, RULES)
    budget, need = register_budget(device), device.fma_accumulators
    while tile is not None and accumulators(expr, device, tile) < need:
        options = []
        for a in _accumulator_axes(expr, device):
            size = _scan(ctx, tile, a, +1, RULES, whole_tile=False)
            if size is None:
                continue
            grown = tile[:a] + (size,) + tile[a + 1 :]
            regs = micro_kernel_registers(expr, device, grown)
            if _within_budget(expr, device, grown, budget):
                options.append((regs / accumulators(expr, device, grown), regs, a, grown))
        if not options:
            break
        tile = min(options)[3]
    if tile is None or accumulators(expr, device, tile) >= need:
        return tile
    within = _tiles_within_budget(ctx, start, budget)
    if not within:
        return tile
    return min(within, key=lambda t: (-min(need, accumulators(expr, device, t)), micro_kernel_registers(expr, device, t), t))


@lru_cache(maxsize=4096)
def port_free_tile(ctx: AlignContext) -> Tile | None:
    """Where the register tile `initial_tile` starts a CPU micro-kernel from issues more loads
    per reduction step than FMAs (`registers.step_loads` against its accumulators: a core issues
    as many vector loads a cycle as it has FMA pipes, `model.cpu_compute.load_coverage`), the
    aligned tile within the register budget (`_tiles_within_budget`) with at least its
    accumulators and no more loads than FMAs that takes the fewest registers (then the most
    accumulators, then the smallest): a second start for construction (`Policy`'s second
    round, `Space.second_starts`), whose programs the model prices against the first's. None
    where the start's loads are under its FMAs or no such tile exists (a gemv, whose matrix
    feeds one FMA a load at every width; a one-row matmul, whose other start is
    `unfilled_tile`).

    A one-vector-wide matmul tile of r rows broadcasts r elements of A and loads one vector of B
    for its r FMAs whatever r is, so the growth of rows that the accumulator path and Roller's
    reuse score both prefer (a broadcast takes fewer registers and moves fewer bytes than a
    vector) never leaves the ports. The path reaches such a tile where M's divisors skip a
    size: 71 x 203 x 4565 at eps 0.05, whose 5 rows pad M by 5.6 %, went 4 -> 6 -> 8 rows of one
    AVX-512 vector and grew to 18 x 16 and 24 x 16, which ran 430-481 us on the Zen 5; from 4 x
    32 it grows to 12 x 32 and 9 x 32, which ran 350-370 us (built and timed in turns; 8 x 48 and
    6 x 64 371-385). Neither family wins everywhere: 38 x 1949 x 3643's 19 x 16 tiles ran 2.3-2.8
    ms, and the port-free tiles 38 rows allow, 3 rows of 3 to 5 vectors (13 rows pad), 2.5-3.2
    (the model had both orders right), so the port-free start adds its programs rather than
    replacing the first's (docs/evidence.md#second-start)."""
    expr, device = ctx.expr, ctx.device
    tile = initial_tile(ctx)
    if tile is None or not required_accumulators(ctx):
        return None
    chains = accumulators(expr, device, tile)
    if step_loads(expr, device, tile) <= chains:
        return None
    covered = [t for t in _tiles_within_budget(ctx, _per_axis_start(ctx, RULES), register_budget(device))
               if chains <= accumulators(expr, device, t) >= step_loads(expr, device, t) and is_aligned(ctx, t)]
    if not covered:
        return None
    return min(covered, key=lambda t: (micro_kernel_registers(expr, device, t), -accumulators(expr, device, t), t))


@lru_cache(maxsize=4096)
def unfilled_tile(ctx: AlignContext) -> Tile | None:
    """Where `initial_tile` fills a one-row matmul's register tile (`axes.stream_rows_axis`: B
    streamed, a row of it a reduction step) to the accumulators the FMA latency asks for, the
    start without that need (`AlignContext.unfilled`): a second start for construction
    (`Policy`'s second round, `Space.second_starts`), whose programs the model prices against
    the first's. None elsewhere, and where the two starts are the same tile.

    Such an operator's floor is B's stream, not its FMA chains, and growth from the filled
    tile's 8 vectors (AVX-512) never narrows: 1 x 179 x 4259 (B's 3 MB in the L3) ran register
    rows of 160 columns in 37-39 us, rows of 64 and 112 under the same cache tiles in 25-28,
    which the model prices 30 and 34 against 42. Dropping the need for every one-row matmul lost
    where the filled tiles run faster (1 x 183 x 2793 14 -> 24 us, 1 x 2503 x 2493 342-363 ->
    413-426: docs/evidence.md#one-row-shares), so both starts' programs compete
    (docs/evidence.md#second-start)."""
    if ctx.unfilled or stream_rows_axis(ctx.expr, ctx.device) is None or not required_accumulators(ctx):
        return None
    tile = initial_tile(replace(ctx, unfilled=True))
    return None if tile is None or tile == initial_tile(ctx) else tile


def _tiles_within_budget(ctx: AlignContext, start: Tile, budget: int) -> list[Tile]:
    """Every register tile that grows `start` along `_accumulator_axes` to sizes the per-axis
    rules accept and fits `budget` (`_within_budget`). Neither registers nor lines a set fall as
    an axis grows, so each axis is scanned only while the tile fits: a few hundred tiles at most;
    but for a row padded past its axis's end (`padded_row_axis`), whose whole vectors can take
    fewer registers than the whole axis in LLVM's pieces (20 on 16 lanes: 5 pieces, 32 padded:
    2 vectors), scanned to its end."""
    expr, device = ctx.expr, ctx.device
    padded = padded_row_axis(expr, device)
    found: list[Tile] = []

    def visit(tile: Tile, axes: tuple[int, ...]) -> None:
        if not axes:
            if _within_budget(expr, device, tile, budget):
                found.append(tile)
            return
        a, rest = axes[0], axes[1:]
        while tile is not None and (a == padded or _within_budget(expr, device, tile, budget)):
            visit(tile, rest)
            size = _scan(ctx, tile, a, +1, RULES, whole_tile=False)
            tile = None if size is None else tile[:a] + (size,) + tile[a + 1 :]

    visit(start, _accumulator_axes(expr, device))
    return found


def _within_budget(expr: TensorExpr, device: DeviceSpec, tile: Tile, budget: int) -> bool:
    """Whether a register tile needs at most `budget` vector registers and its streams fit the
    L1's sets (`CacheSetRule`)."""
    if micro_kernel_registers(expr, device, tile) > budget:
        return False
    return len(device.layers) < 2 or l1_set_lines(expr, device, tile) <= device.layers[1].ways


def _accumulator_axes(expr: TensorExpr, device: DeviceSpec) -> tuple[int, ...]:
    """The axes whose growth adds accumulators: the spatial ones, and a reduce `lane_axis`;
    less a spatial axis that indexes every input the lanes run along, each outside a window (a
    batch, which indexes every input; a batched pixel GEMM's images), where another remains:
    each accumulator it adds brings vector loads of its own, as many as its FMAs (bmm-attn's fill
    went to 12 batches x 16 columns: 24 loads per 12 FMAs; a strided pointwise conv's 4 images x
    2 filters x 32 pixels ran 72 us where 1 x 14 x 32 ran 58, both predicted, only the first
    constructed). A depthwise conv's rows index its image through the window (h + r): the rows
    of neighbouring outputs overlap, so they stay."""
    lane = lane_axis(expr, device)
    streamed = [t for t in expr.inputs if lane is not None and t.uses_axis(lane)] or list(expr.inputs)
    grown = tuple(a for a in expr.spatial if a == lane or not all(_own_rows(expr, t, a) for t in streamed))
    grown = grown or tuple(expr.spatial)
    return grown + ((lane,) if lane is not None and lane not in expr.spatial else ())


def _own_rows(expr: TensorExpr, tensor, axis: int) -> bool:
    """Whether `tensor` reads different elements for every index of `axis`: it uses the axis, and
    in no dimension together with a reduce axis (a window's h + r reads the next row's data)."""
    dims = [coeffs for coeffs, _ in tensor.index if coeffs[axis]]
    return bool(dims) and not any(c and expr.axes[a].kind == "reduce" for coeffs in dims for a, c in enumerate(coeffs))


def is_aligned(ctx: AlignContext, tile: Tile, rules=RULES) -> bool:
    answers = _answers(ctx, rules)
    known, upper = answers.axes, ctx.upper
    for a, s in enumerate(tile):
        ok = known.get((a, upper[a], s))  # most are known: `_axis_ok` only for the others
        if not (_axis_ok(ctx, a, s, answers) if ok is None else ok):
            return False
    ok = answers.tiles.get(tile)
    return _tile_ok(ctx, tile, answers) if ok is None else ok


class _Answers:
    """The rules' answers at one context found so far: per (axis, upper size along it, size),
    shared by every context of the layer and eps (`axes`), and below that, for the per-axis rules
    that do not read eps, by every eps as well (`steady`: the eps ladder's rounds scan the same
    sizes again); and per whole tile (`tiles`), with the rules that can refuse each
    (`rules.refusing`), below that, for the whole-tile rules that do not read eps, per (upper
    tile, tile) for every eps of the layer (`steady_tiles`)."""

    __slots__ = ("per_axis", "whole", "axes", "steady", "steady_rules", "eps_rules", "tiles", "steady_tiles",
                 "steady_whole", "eps_whole", "limits", "next_ok")

    def __init__(self, rules, device: DeviceSpec, axes: dict, steady: dict, steady_tiles: dict):
        self.per_axis, self.whole, self.steady_rules, self.eps_rules, self.steady_whole, self.eps_whole = _partition(rules, device)
        self.axes: dict[tuple[int, int, int], bool] = axes
        self.steady: dict[tuple[int, int, int], bool] = steady
        self.tiles: dict[Tile, bool] = {}
        self.steady_tiles: dict[tuple[Tile, Tile], bool] = steady_tiles
        self.limits: dict[int, int] = {}  # `_scan_limit` per axis at this context
        self.next_ok: dict[tuple[int, int, int, int], int | None] = {}  # `_next_ok` at this context


@lru_cache(maxsize=64)
def _partition(rules, device: DeviceSpec) -> tuple[tuple[AlignmentRule, ...], ...]:
    """`rules` as `_Answers` asks them on `device`: those that can refuse a size, those that can
    refuse a tile (`rules.refusing`, of those that apply there: `AlignmentRule.applies`), then of
    each, those that do not read eps and those that do."""
    per_axis, whole = refusing(tuple(r for r in rules if getattr(r, "applies", None) is None or r.applies(device)))
    return (per_axis, whole, *(tuple(r for r in group if getattr(r, "reads_eps", False) == reads)
                               for group in (per_axis, whole) for reads in (False, True)))


# The rules are pure functions of their context; a construction asks them about the same sizes
# again and again (every scan of an axis starts from the sizes the last one passed over, every
# descent scans the layer below afresh), so their answers are kept.
@lru_cache(maxsize=4096)
def _answers(ctx: AlignContext, rules) -> _Answers:
    """The answers of `rules` at `ctx` found so far (`_axis_ok`, `_tile_ok`)."""
    mode = (ctx.unfilled, ctx.dividing, ctx.ragged)
    return _Answers(rules, ctx.device, _axis_answers(ctx.expr, ctx.device, ctx.layer, ctx.eps, rules, mode),
                    _axis_answers(ctx.expr, ctx.device, ctx.layer, None, rules, mode),
                    _tile_answers(ctx.expr, ctx.device, ctx.layer, rules, mode))


@lru_cache(maxsize=1024)
def _axis_answers(expr: TensorExpr, device: DeviceSpec, layer: int, eps: float | None, rules, mode: tuple) -> dict:
    """The per-axis answers of `rules` at a layer and eps (None: of those rules that do not read
    eps) in a round's `mode` (`AlignContext.unfilled`, `.dividing`, `.ragged`), by (axis, upper size,
    size): a per-axis rule reads the tile above along its own axis only (`rules.AlignmentRule`)."""
    return {}


@lru_cache(maxsize=1024)
def _tile_answers(expr: TensorExpr, device: DeviceSpec, layer: int, rules, mode: tuple) -> dict:
    """The whole-tile answers of those of `rules` that do not read eps at a layer in a round's
    `mode`, by (upper tile, tile)."""
    return {}


def _axis_ok(ctx: AlignContext, axis: int, size: int, answers: _Answers) -> bool:
    """Whether every rule accepts `size` along `axis` at `ctx` (`answers`: its `_answers`)."""
    key = (axis, ctx.upper[axis], size)
    ok = answers.axes.get(key)
    if ok is None:
        ok = answers.steady.get(key)
        if ok is None:
            ok = answers.steady[key] = _sizes_accepted(answers.steady_rules, ctx, axis, size)
        answers.axes[key] = ok = ok and _sizes_accepted(answers.eps_rules, ctx, axis, size)
    return ok


def _tile_ok(ctx: AlignContext, tile: Tile, answers: _Answers) -> bool:
    """Whether every rule accepts the whole `tile` at `ctx` (`answers`: its `_answers`)."""
    ok = answers.tiles.get(tile)
    if ok is None:
        key = (ctx.upper, tile)
        ok = answers.steady_tiles.get(key)
        if ok is None:
            ok = answers.steady_tiles[key] = _tiles_accepted(answers.steady_whole, ctx, tile)
        answers.tiles[tile] = ok = ok and _tiles_accepted(answers.eps_whole, ctx, tile)
    return ok


def _sizes_accepted(rules, ctx: AlignContext, axis: int, size: int) -> bool:
    """Whether every one of `rules` accepts `size` along `axis` at `ctx`: a loop, not `all` over
    a generator, whose frame the scans paid on every size they meet first (1.9 % of the
    instructions of `scripts/count_construction.py`, with `_tiles_accepted`)."""
    for rule in rules:
        if not rule.axis_ok(ctx, axis, size):
            return False
    return True


def _tiles_accepted(rules, ctx: AlignContext, tile: Tile) -> bool:
    """Whether every one of `rules` accepts the whole `tile` at `ctx` (a loop: `_sizes_accepted`)."""
    for rule in rules:
        if not rule.tile_ok(ctx, tile):
            return False
    return True


def _scan(ctx: AlignContext, tile: Tile, axis: int, direction: int, rules, whole_tile=True, answers=None) -> int | None:
    """The next aligned size of `axis` from `tile` in `direction` within `MAX_SCAN` steps of
    the tile above, else, growing a cache tile, the whole axis where that is aligned (`answers`:
    `_answers(ctx, rules)`, where the caller has it)."""
    if answers is None:
        answers = _answers(ctx, rules)
    base = ctx.upper[axis]
    limit = answers.limits.get(axis)
    if limit is None:
        limit = answers.limits[axis] = _scan_limit(ctx, axis)
    start = tile[axis] // base
    last = start + direction * MAX_SCAN  # the last multiple of `base` the scan looks at
    multiple = start
    while True:
        multiple = _next_ok(ctx, axis, multiple, direction, last, limit, answers)
        if multiple is None:
            break
        size = multiple * base
        if not whole_tile or _tile_ok(ctx, tile[:axis] + (size,) + tile[axis + 1 :], answers):
            return size
    if direction > 0 and last < limit and ctx.layer > 0:
        # past the scan, the tile covering the whole axis, which a cache tile may always grow
        # to: a prime K of 293 over a register K of 1 and 16-step L1 tiles found no size up to
        # 145 that wastes at most eps, and its L1 tile stayed at 16 K-steps (0.59x numpy). Not
        # a register tile: its loops are unrolled (a one-row matmul's K of 6,637 was)
        size = limit * base
        grown = tile[:axis] + (size,) + tile[axis + 1 :]
        if _axis_ok(ctx, axis, size, answers) and (not whole_tile or _tile_ok(ctx, grown, answers)):
            return size
    return None


def _scan_limit(ctx: AlignContext, axis: int) -> int:
    """The largest multiple of the tile above that `_scan` looks at along `axis`: one tile
    covering the whole axis, or at the top layer a whole vector of a short filter axis, or a
    padded row in whole vectors."""
    base, extent = ctx.upper[axis], ctx.expr.axes[axis].extent
    if ctx.layer == 0 and extent < ctx.device.warp_size and axis == short_filter_axis(ctx.expr, ctx.device):
        return ceil(ctx.device.warp_size / base)  # one whole vector of filters, padded
    if ctx.layer == 0 and padded_row_axis(ctx.expr, ctx.device) == axis:
        return ceil(extent / ctx.device.warp_size) * ctx.device.warp_size // base  # the row in whole vectors
    return ceil(extent / base)


def _next_ok(ctx: AlignContext, axis: int, multiple: int, direction: int, last: int, limit: int,
             answers: _Answers) -> int | None:
    """The next multiple of the tile above past `multiple` in `direction`, up to `last` and
    within 1 to `limit`, whose size every per-axis rule accepts at `ctx`; None where none is.
    Kept per context: scans from the same size pass over the same refused sizes again."""
    key = (axis, multiple, direction, last)
    if key in answers.next_ok:
        return answers.next_ok[key]
    base, known, found = ctx.upper[axis], answers.axes, None
    end = min(last, limit) if direction > 0 else max(last, 1)
    for m in range(multiple + direction, end + direction, direction):
        if m > limit:  # shrinking from past the limit: nothing to scan
            break
        ok = known.get((axis, base, m * base))
        if ok is None:
            ok = _axis_ok(ctx, axis, m * base, answers)
        if ok:
            found = m
            break
    answers.next_ok[key] = found
    return found


@lru_cache(maxsize=1024)
def padded_row_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The axis a CPU register row may cover padded to whole vectors, past its extent (`_scan`):
    a spatial lane axis longer than a vector and not a whole number of them, of a reduction
    whose template pads it (a matmul's, batched or not: its tails padded with its panels, or
    its edge split off; a convolution's filters, padded to whole unit tiles). 47 x 1684 x 23 on
    two Zen 5 cores: its rows of 16 columns and a 7-column edge ran 108-123 us, rows of 32
    (padded panels) 14-15, numpy 41 (docs/model-evidence.md#whole-vector-bound)."""
    if not device.runs_on_cpu or device.lanes_are_threads:
        return None
    axis = lane_axis(expr, device)
    if axis is None or expr.axes[axis].kind != "spatial" or not expr.reduce:
        return None
    if not (filter_lanes(expr, axis) or plain_projections(expr)):
        return None
    extent = expr.axes[axis].extent
    return axis if extent > device.warp_size and extent % device.warp_size else None


def next_aligned_sizes(ctx: AlignContext, tile: Tile, rules=RULES, starts=None) -> tuple[int | None, ...]:
    """Per axis, the next larger aligned size (None when the axis cannot grow), scanning up from
    `starts[a]` where given instead of `tile[a]`; the rest of the tile is `tile` either way, so
    the whole-tile rules judge the tile that growing one axis makes."""
    answers = _answers(ctx, rules)
    if starts is None:
        return tuple([_scan(ctx, tile, a, +1, rules, True, answers) for a in range(len(tile))])
    return tuple([_scan(ctx, tile[:a] + (starts[a],) + tile[a + 1 :], a, +1, rules, True, answers) for a in range(len(tile))])


def prev_aligned_sizes(ctx: AlignContext, tile: Tile, rules=RULES) -> tuple[int | None, ...]:
    """Per axis, the next smaller aligned size (None when the axis cannot shrink)."""
    return tuple(_scan(ctx, tile, a, -1, rules) for a in range(len(tile)))


def initial_tile(ctx: AlignContext, rules=RULES) -> Tile | None:
    """Smallest aligned tile at a layer that is a multiple of the tile one layer up.

    Starts from the upper tile and lifts each axis that breaks a per-axis rule to its next
    aligned size; on a GPU block layer the spatial axes are instead filled with the fewest
    threads in whole warps (`_warp_fill`), or, for a cross-thread reduction, its reduce axis
    with enough warps to fill the device (`_reduce_fill`). A CPU micro-kernel then grows to its required
    accumulators (`_accumulator_fill`). None when no aligned tile exists (e.g. eps too small
    for the shape; on a GPU block layer, none within a block's thread limit).
    """
    return _initial_tile(ctx, rules, rules is RULES)


# Memoised: every descent and every capacity check of the layer below asks for the tile one
# layer down, and a Markov walk's predicted time completes each state with them.
@lru_cache(maxsize=1 << 14)
def _initial_tile(ctx: AlignContext, rules, standard: bool) -> Tile | None:
    """`initial_tile`; `standard`: `rules` is `RULES` itself (the accumulator fill applies)."""
    if required_accumulators(ctx) and standard:
        result = _accumulator_fill(ctx.expr, ctx.device, ctx.eps, ctx.ragged)
        return result if result is not None and is_aligned(ctx, result, rules) else None
    result = _per_axis_start(ctx, rules)
    return result if result is not None and is_aligned(ctx, result, rules) else None


def _per_axis_start(ctx: AlignContext, rules) -> Tile | None:
    """The upper tile with every axis that breaks a per-axis rule lifted to its next aligned
    size; on a GPU block layer the spatial axes are filled by `_warp_fill`. None when an axis
    has no aligned size. On a GPU an axis with none within MAX_SCAN multiples takes the whole
    axis (gemv's 1000-long reduction at eps 0 on the MI50: no divisor of 1000 is a whole 64 B
    transaction); CPU tiles keep the scan's answer, which the register micro-kernel fill
    (`_accumulator_fill`) starts from."""
    tile = list(ctx.upper)
    filled: tuple[int, ...] = ()
    across = cross_thread_axis(ctx.expr, ctx.device)
    if ctx.device.is_thread_block_layer(ctx.layer) and across is not None:
        size = _reduce_fill(ctx, rules, across)
        if size is None:
            return None
        tile[across], filled = size, (across,)
    elif ctx.device.is_thread_block_layer(ctx.layer):
        sizes = _warp_fill(ctx, rules)
        if sizes is None:
            return None
        filled = ctx.expr.spatial
        for a, size in zip(filled, sizes):
            tile[a] = size
    for a in range(len(tile)):
        if a not in filled and not _axis_ok(ctx, a, tile[a], _answers(ctx, rules)):
            size = _scan(ctx, tuple(tile), a, +1, rules, whole_tile=False)
            if size is None and ctx.device.lanes_are_threads:  # the whole axis, if the rules take it
                whole = ceil(ctx.expr.axes[a].extent / ctx.upper[a]) * ctx.upper[a]
                size = whole if _axis_ok(ctx, a, whole, _answers(ctx, rules)) else None
            if size is None:
                return None
            tile[a] = size
    return tuple(tile)


@lru_cache(maxsize=4096)
def _warp_fill(ctx: AlignContext, rules) -> tuple[int, ...] | None:
    """The spatial sizes of the smallest GPU block tile over `ctx.upper` that the per-axis rules
    accept and whose threads come in whole warps, in whole groups of `teu_per_unit` warps where
    `rules` hold `WarpGroupRule` (or that covers every spatial axis: one block for the whole
    operator); None when there is none within a block's thread limit.

    Each spatial axis takes a multiple m of its upper size that every per-axis rule accepts; the
    block runs prod(m) threads (x the lanes sharing a fragment). Thread counts are tried in
    increasing multiples of that group, and at each every way of writing the count as such a
    product (a few dozen: the factors divide it), so a zero-waste block is found whenever one
    exists: a conv's 26 x 26 output takes 2 x 2 threads, its 128 filters 16 and its 128 images
    2 (filling the threads along the innermost axes alone would pad 26). Among blocks of as many
    threads our choice is the least padding of the spatial axes, then the least traffic to the
    layer below (`traffic_bytes`: Roller's data reuse; a 4-warp matmul block of 8 x 8 register
    tiles is then 8 x 16 threads, a 64 x 128 tile, not 1 x 128, an 8 x 1024 tile reading 5.4x
    the bytes per output: 1/8 + 1/1024 against 1/64 + 1/128 per step of K), then the most
    threads along the innermost axes (contiguous data), as the single-path fill did."""
    spatial, upper = ctx.expr.spatial, ctx.upper
    rooms = [ceil(ctx.expr.axes[a].extent / upper[a]) for a in spatial]
    lanes = tile_lanes(ctx.expr, ctx.device)
    grouped = any(isinstance(r, WarpGroupRule) for r in rules)
    group = block_thread_multiple(ctx.device) if grouped else ctx.device.warp_size
    need = max(1, group // lanes)  # threads per group of warps, a fragment tile counting as a warp
    accepted: dict[tuple[int, int], bool] = {}
    answers = _answers(ctx, rules)

    def ok(i: int, m: int) -> bool:
        found = accepted.get((i, m))
        if found is None:
            a = spatial[i]
            found = accepted[i, m] = m <= rooms[i] and _axis_ok(ctx, a, m * upper[a], answers)
        return found

    def factorizations(n: int, i: int = 0) -> list[tuple[int, ...]]:
        """Every ordered way of writing n as a product of one multiple per spatial axis from the
        i-th on that `ok` accepts, by the first axis's multiple, smallest first, then the next's."""
        if i == len(spatial):
            return [()] if n == 1 else []
        if i == len(spatial) - 1:
            return [(n,)] if ok(i, n) else []
        return [(d,) + rest for d in _divisors(n) if ok(i, d) for rest in factorizations(n // d, i + 1)]

    def waste(ms) -> float:
        return prod(ceil(ctx.expr.axes[a].extent / (m * upper[a])) * m * upper[a] / ctx.expr.axes[a].extent for a, m in zip(spatial, ms))

    calc = calculus(ctx.expr)

    def traffic(ms) -> int:
        tile = list(upper)
        for a, m in zip(spatial, ms):
            tile[a] = m * upper[a]
        return calc.traffic_bytes(tuple(tile))

    def best(found) -> tuple[int, ...]:
        """The first of `found` least by (threads, waste, traffic, innermost threads): the
        traffic, a data tile per tensor, is counted only for the blocks tied on the first two."""
        heads = [(prod(ms), waste(ms)) for ms in found]
        least = min(heads)
        tied = [ms for ms, head in zip(found, heads) if head == least]
        return min(tied, key=lambda ms: (traffic(ms), tuple(-m for m in reversed(ms))))

    most = max(need, ctx.device.max_threads_per_block // lanes)
    cover = tuple(rooms) if prod(rooms) <= most and all(ok(i, m) for i, m in enumerate(rooms)) else None
    for threads in range(need, most + 1, need):
        found = factorizations(threads)
        if cover is not None and prod(cover) <= threads:
            found.append(cover)
        if found:
            return tuple(m * upper[a] for a, m in zip(spatial, best(found)))
    return tuple(m * upper[a] for a, m in zip(spatial, cover)) if cover is not None else None


@lru_cache(maxsize=4096)
def _reduce_fill(ctx: AlignContext, rules, axis: int) -> int | None:
    """The size along `axis` of a cross-thread reduction's smallest block tile
    (`cross_thread_axis`), or None: its threads in whole warps, as many as give each warp
    scheduler of the device one warp over the grid (a block per register tile of output points;
    our choice: with fewer, the model's compute efficiency and the loads in flight fall), and
    at least as many as fill a unit's resident threads with the blocks it may hold
    (`resident_block_limit`: 2 warps on the V100, whose 32 blocks of one warp would leave half
    its 2048 threads idle), at most a block's limit, fewer where the rules refuse that many
    (padding beyond eps); one thread per register tile of the whole axis where that takes no
    more threads."""
    upper, extent = ctx.upper[axis], ctx.expr.axes[axis].extent
    device = ctx.device
    warp, most = device.warp_size, device.max_threads_per_block
    grid = prod(ceil(ctx.expr.axes[a].extent / ctx.upper[a]) for a in ctx.expr.spatial)
    per_scheduler = ceil(device.compute_units * device.teu_per_unit / grid)
    # the fewest threads whose blocks, at the unit's resident-block limit, fill its threads
    filling = ceil(device.max_threads_per_unit / resident_block_limit(device) / warp) if resident_block_limit(device) else 1
    want = min(most - most % warp, warp * max(per_scheduler, filling))
    room = ceil(extent / upper)  # threads that cover the axis in one step

    def ok(threads: int) -> bool:
        return _axis_ok(ctx, axis, threads * upper, _answers(ctx, rules))

    if room <= want:
        return room * upper if ok(room) else None
    for threads in [*range(want, min(most, room) + 1, warp), *range(want - warp, 0, -warp)]:
        if ok(threads):
            return threads * upper
    return room * upper if room <= most and ok(room) else None


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, smallest first."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)
