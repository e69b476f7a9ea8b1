"""Roller's alignment rules (§3.1), one small rule each; composed with the accumulator rule in
`alignment.RULES`. New hardware features are new rules here, nowhere else.

Rules see an `AlignContext` (expression, device, layer, the tile one layer up, eps) and answer
`axis_ok(ctx, axis, size)` for per-axis rules and `tile_ok(ctx, tile)` for rules over the whole
tile (the thread count of a GPU block, the lines a CPU register tile puts in one L1 set). A
per-axis answer reads the tile one layer up along its own axis only (`ctx.upper[axis]`): the
scans keep it for every upper tile of that size there (`alignment._axis_ok`).

Memory transactions at the cache layers are 64 B lines on CPUs (each layer's
`transaction_bytes`, `TransactionRule`), a CPU cache tile leaves no ragged edge along the
vectors or a reduction where the register tile does not (`TailRule`), a one-row matmul's tiles
read several rows of B at once (`StreamRowsRule`), and no CPU tile leaves one along a model
weight's axes where a dividing tile exists (`WeightsAheadRule`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from math import ceil, gcd, lcm, prod
from typing import Protocol

from workbench.frozen import direct_init, hash_once
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import (
    always_streamed, autovector_axis, cross_thread_axis, filter_lanes, is_micro_kernel_layer, lane_axis, leading_axis, mma_axes,
    even_tile, reduce_lanes, share_streams_from_l1, short_filter_axis, stream_rows, stream_rows_axis,
)
from workbench.rtile.panels import simd_lanes
from workbench.rtile.registers import block_thread_count, row_vectors

Tile = tuple[int, ...]


# GPU register-level steps: Roller's artifact multiplies a thread's tile by {1, 2, 4, 8, 16, 32}.
REGISTER_STEPS = (1, 2, 4, 8, 16, 32)
# Scan bound for `next_aligned_sizes`: enough multiples to find a transaction- or warp-aligned
# size from any start (the strictest granularity is 64 B / 1 B = 64 steps).
MAX_SCAN = 128
# Transactions in a streamed run that may end mid-transaction (`TransactionRule`): partial ends
# add at most 1/8 to its bytes.
LONG_RUN = 16
# Vectors a one-row matmul's register tiles may pad a core's share of N by where that share fits
# L1 (`StreamRowsRule`): one, so that a share of a prime count of vectors (1 x 2340 x 268: 17)
# has tiles of more than one vector (3 x 8 over 18: 37-39 us against 55-57 for 1 x 8, two Zen 3
# cores; docs/evidence.md#one-row-shares).
PAD_VECTORS = 1


@hash_once  # the key of every memoised rule answer (`alignment`)
@direct_init
@dataclass(frozen=True)
class AlignContext:
    expr: TensorExpr
    device: DeviceSpec
    layer: int  # index into device.layers, 0 = top (registers)
    upper: Tile  # the tile one layer up (all ones at the top layer)
    eps: float
    unfilled: bool = False  # no accumulators required (a one-row matmul's second start: `alignment.unfilled_tile`)
    dividing: bool = False  # a reduction's cache tiles divide it in place of whole lines (`dividing_reduction`)
    ragged: bool = False  # a conv's register rows in vectors of filters need not divide the output (`TailRule`)

    @property
    def scope(self) -> str:
        return self.device.layers[self.layer].scope


class AlignmentRule(Protocol):
    name: str
    # whether `axis_ok` or `tile_ok` reads `ctx.eps` (its answers are then kept per eps, the
    # others' for every eps: `alignment._Answers`); a rule without the attribute reads none
    reads_eps: bool
    # `applies(device)`, where a rule has it: False where it accepts everything on that device
    # (a GPU thread's rule on a CPU core), so that the scans do not ask it (`alignment._partition`)

    def axis_ok(self, ctx: AlignContext, axis: int, size: int) -> bool:
        """Whether `size` along `axis` is aligned; reads `ctx.upper` at `axis` only."""
        ...

    def tile_ok(self, ctx: AlignContext, tile: Tile) -> bool: ...


def lanes_are_simd(device: DeviceSpec) -> bool:
    """Whether a device's lanes are a core's SIMD lanes (a CPU), where the CPU rules apply
    (`AlignmentRule.applies`)."""
    return not device.lanes_are_threads


def lanes_are_threads(device: DeviceSpec) -> bool:
    """Whether a device's lanes are threads (a GPU), where a GPU thread's rules apply."""
    return device.lanes_are_threads


def launches_thread_blocks(device: DeviceSpec) -> bool:
    """Whether a device runs thread blocks, where a GPU block's rules apply."""
    return device.launches_thread_blocks


class PerAxisRule:
    """A rule over single axes: every whole tile of accepted sizes is accepted."""

    def tile_ok(self, ctx: AlignContext, tile: Tile) -> bool:
        return True


class WholeTileRule:
    """A rule over whole tiles: every size of an axis is accepted on its own."""

    def axis_ok(self, ctx: AlignContext, axis: int, size: int) -> bool:
        return True


def refusing(rules) -> tuple[tuple[AlignmentRule, ...], tuple[AlignmentRule, ...]]:
    """The rules of `rules` whose per-axis check, and those whose whole-tile check, can refuse
    anything (those not inheriting the always-true one of `PerAxisRule` / `WholeTileRule`), in
    their order: the scans skip the rest."""
    return (tuple(r for r in rules if type(r).axis_ok is not WholeTileRule.axis_ok),
            tuple(r for r in rules if type(r).tile_ok is not PerAxisRule.tile_ok))


class TensorShapeRule(PerAxisRule):
    """Tensor shape: a size S on an axis of extent N wastes (S - N % S) / N when padded; allowed
    only if that fraction is <= eps (Roller raises eps up to 1.0 when too few programs exist).
    A CPU convolution in one vector of filters (`axes.short_filter_axis`) is exempt in its register
    tile: that vector, padded with zero filters, is the only size along the filters (the model
    prices their flops), and its output rows and columns, whose ragged edges the template splits
    off and runs guarded (`plan.cpu_plan`, priced by `cpu_compute.guard_slowdown`), are its
    accumulators' only source: at eps 0.05 an output of 19 x 19 took no row or column but 1 and
    19, and the register tile its one accumulator vector, a latency-bound chain, 0.32-0.36x ONNX
    Runtime (48 channels, 5 5x5 filters; with rows and columns of 3 x 5, 1.02-1.07x). Exempting the
    rows and columns of every conv in vectors of filters lost as much elsewhere (192 channels,
    89 7x7 filters over 11 x 11: 1.23 -> 1.64 ms, the walk's path through the wider choice
    ending at programs it predicted slower; docs/model-evidence.md#lane-axis)."""

    name = "tensor-shape"
    reads_eps = True

    def axis_ok(self, ctx, axis, size):
        extent = ctx.expr.axes[axis].extent
        short = short_filter_axis(ctx.expr, ctx.device)
        if short is not None:
            if axis == short and size == ctx.device.warp_size > extent:
                return True  # at every layer: the register tile's one vector is the cache tiles' as well
            if axis != short and ctx.layer == 0 and ctx.expr.axes[axis].kind == "spatial":
                return True  # an output row or column of a conv in one vector of filters: its edge is split off
        return (ceil(extent / size) * size - extent) / extent <= ctx.eps + 1e-12


class TransactionRule(PerAxisRule):
    """Memory transaction: the contiguous (leading) dimension of every input data tile is a whole
    number of transactions of the layer it is loaded from (32 B from NVIDIA global memory, a
    64 B line on CPUs). Applies where one axis alone indexes that dimension; a window such as
    `w*stride + s` cannot be aligned by choosing one axis and is left to the other rules. Not
    applied at the top layer: registers are filled by vector / word loads (the execution-unit
    rule's business). Beside an input that every program streams (`always_streamed`: a one-row
    matmul's B) the others are vectors every tile reads again (its A, 8 KiB for K = 2048): their
    lines stay in the layers above after the first read, so they are left out, which lets the
    streamed rows be long (a 1 x 1008 x 4 L1 tile, where whole lines of A ask for 16 K-steps).
    A streamed run of at least LONG_RUN transactions may end inside one: its two partial ends
    add at most 2 / LONG_RUN to its bytes, and it lets the cores split a row that is a whole
    number of lines but not of two (504 columns of 1001, two per row of B). In a round that
    asks for it (`AlignContext.dividing`), a reduction no tile of whole lines divides takes the
    tiles of a line or more that divide it instead (`dividing_reduction`)."""

    name = "memory-transaction"

    def axis_ok(self, ctx, axis, size):
        extent = ctx.expr.axes[axis].extent
        if ctx.layer == 0 or size >= extent:
            return True
        source = ctx.device.layers[ctx.layer + 1]
        streamed, itemsizes = _line_inputs(ctx.expr, ctx.device, axis)
        for itemsize in itemsizes:
            run = size * itemsize
            if ctx.dividing and dividing_reduction(ctx.expr, ctx.device, axis, ctx.upper[axis], itemsize,
                                                   source.transaction_bytes):
                if extent % size or run < source.transaction_bytes:
                    return False
            elif run % source.transaction_bytes and not (streamed and run >= LONG_RUN * source.transaction_bytes):
                return False
        return True


@lru_cache(maxsize=4096)
def _line_inputs(expr: TensorExpr, device: DeviceSpec, axis: int) -> tuple[bool, tuple[int, ...]]:
    """What `TransactionRule` judges along `axis`: whether some inputs are `always_streamed`,
    and the itemsizes of the inputs whose contiguous dimension `axis` alone indexes (of the
    streamed ones only, where there are any)."""
    streamed = always_streamed(expr, device)
    return bool(streamed), tuple(t.itemsize for i, t in enumerate(expr.inputs)
                                 if (not streamed or i in streamed) and leading_axis(t) == axis)


@lru_cache(maxsize=4096)
def dividing_reduction(expr: TensorExpr, device: DeviceSpec, axis: int, upper: int, itemsize: int, line: int) -> bool:
    """Whether CPU cache tiles over tiles of `upper` along reduction `axis` (read along an
    input's lines of `line` bytes, elements of `itemsize`) have a dividing size of a line or more
    where none of whole lines divides the axis (within MAX_SCAN multiples, short of the axis). A
    tile of whole lines leaves such a K a tail, which the template pads, copying every input in
    every call: 4 batches of 4 x 1222 x 64 (K = 2 x 13 x 47) ran 18.6-22.3 us in L1 tiles of 176
    K-steps and 6.8-7.0 in tiles of 47 or 94, nothing copied (docs/evidence.md#dividing-round)."""
    extent = expr.axes[axis].extent
    if not device.runs_on_cpu or device.lanes_are_threads or expr.axes[axis].kind != "reduce" or extent % upper:
        return False
    sizes = [m * upper for m in range(1, min(extent // upper - 1, MAX_SCAN) + 1) if extent % (m * upper) == 0]
    return not any(s * itemsize % line == 0 for s in sizes) and any(s * itemsize >= line for s in sizes)


@lru_cache(maxsize=1024)
def dividing_axes(expr: TensorExpr, device: DeviceSpec) -> tuple[int, ...]:
    """The reduce axes of a CPU reduction that an input reads along its lines and that
    `dividing_reduction` holds for over steps of one: where a construction round whose cache
    tiles divide them (`AlignContext.dividing`) finds programs the first round's cannot."""
    if not device.runs_on_cpu or device.lanes_are_threads or len(device.layers) < 3:
        return ()
    line = device.layers[2].transaction_bytes  # the first cache layer's source (`TransactionRule`)
    return tuple(sorted({a for t in expr.inputs if (a := leading_axis(t)) is not None
                         and dividing_reduction(expr, device, a, 1, t.itemsize, line)}))


class ThreadTileRule(PerAxisRule):
    """Execution unit, a GPU thread's tile (Roller §3.1): Roller's register steps along each axis
    (or the whole axis); an MMA fragment's axes are left to `TensorCoreAlignment`. A cross-thread
    reduction's thread (`cross_thread_axis`) sums for one output (spatial tiles of 1) and its
    tile along the reduce axis leaves at least a warp of threads (evidence:
    docs/model-evidence.md#execution-unit-rules)."""

    name = "thread-tile"
    applies = staticmethod(lanes_are_threads)  # its `axis_ok` accepts every size elsewhere

    def axis_ok(self, ctx, axis, size):
        if ctx.layer != 0 or not ctx.device.lanes_are_threads:
            return True
        extent = ctx.expr.axes[axis].extent
        mma = mma_axes(ctx.expr, ctx.device)
        if mma is not None and axis in mma:
            return True  # a warp's fragment tile: the tensor-core rule governs it
        across = cross_thread_axis(ctx.expr, ctx.device)
        if ctx.expr.axes[axis].kind == "spatial" and across is not None:
            return size == 1  # a thread of a cross-thread reduction sums for one output
        if axis == across:  # and leaves at least a warp of threads along the row
            return size in REGISTER_STEPS and ceil(extent / size) >= ctx.device.warp_size
        return size in REGISTER_STEPS or size == extent


class BlockThreadsRule:
    """Execution unit, a GPU block (Roller §3.1): its thread count (unit tile / register tile over
    the spatial axes) is a multiple of the warp size, unless the block already covers every
    spatial axis; such a block still runs at least a warp of threads, or a thread per output
    where it has fewer outputs than a warp (a block of 4 threads fills 4 of a warp's 32 lanes:
    M=1, K=256, N=128 ran 22x slower than cuBLAS on the H200 so). A cross-thread reduction (`cross_thread_axis`) counts its threads along its
    reduce axis instead, in whole warps unless one step covers the axis and never fewer than a
    warp, and its block sums for one output (spatial block tiles equal to the register tile: the
    partial sums meet in one tree per output, as the classic one-block-per-row gemv; our choice)."""

    name = "block-threads"
    applies = staticmethod(launches_thread_blocks)  # `is_thread_block_layer` is False elsewhere

    def axis_ok(self, ctx, axis, size):
        if ctx.layer == 0 or ctx.expr.axes[axis].kind != "spatial" or not ctx.device.is_thread_block_layer(ctx.layer):
            return True
        # a cross-thread reduction's block computes one output (its register tile)
        return cross_thread_axis(ctx.expr, ctx.device) is None or size == ctx.upper[axis]

    def tile_ok(self, ctx, tile):
        if not ctx.device.is_thread_block_layer(ctx.layer):
            return True
        threads = block_thread_count(ctx.expr, ctx.device, tile, ctx.upper)
        across = cross_thread_axis(ctx.expr, ctx.device)
        covered = ctx.expr.spatial if across is None else (across,)
        covers = all(tile[a] >= ctx.expr.axes[a].extent for a in covered)
        if across is not None and threads < ctx.device.warp_size:
            return False  # a row of at least a warp's elements is read by at least a warp
        if threads % ctx.device.warp_size == 0:
            return True
        outputs = prod(min(tile[a], ctx.expr.axes[a].extent) for a in covered)
        return covers and threads >= min(ctx.device.warp_size, outputs)


# The most a register row along the lane axis pads to whole vectors before a whole axis that
# LLVM splits into pieces gives way to it (`VectorLanesRule`, `whole_vector_waste`). A row of 28
# over 8 lanes runs as 7 xmm pieces where padded to 32 it takes 4 ymm: 2 x 300 x 400 x 28 ran
# 776 us so and 207 us padded, 2 x 119 x 1169 x 28 459 and 249 us (one thread, AVX2 Zen 3);
# it pads by a seventh. A row of 12 pads by a third: padded, two random matmuls over N = 12 ran
# 0.75x as fast, so no further.
WHOLE_VECTOR_EPS = 0.2
# Where LLVM's pieces take at least PIECES_RATIO times the vector instructions of whole vectors,
# whole vectors may pad the row by up to PIECES_EPS instead: 52 filters over 16 lanes run as 13
# xmm pieces, padded to 64 (a quarter more) as 4 zmm vectors (272 channels to 52 3x3 filters at
# stride 2 over 27 x 27: pieces 464-624 us, padded 145-163, ONNX Runtime 214-282); a matmul's
# row of 20 as 5 xmm pieces, padded to 32 (by three fifths) as 2 zmm (903 x 1913 x 20: pieces
# 680-780 us, padded 369, numpy 494; docs/model-evidence.md#whole-vector-bound). The row of 12
# above took 1.5 times the instructions, and lost.
PIECES_RATIO = 2
PIECES_EPS = 0.7


class VectorLanesRule(PerAxisRule):
    """Execution unit, a CPU register tile: along the axis the SIMD lanes run along (`lane_axis`)
    a multiple of the lanes, or the whole axis when it is shorter, and along a reduction a whole
    number of cache lines as well (`_lane_step`; our rule: each K-step of gemv then advances
    every row's stream by whole lines; evidence: docs/model-evidence.md#execution-unit-rules).
    A whole spatial axis longer than the lanes only in whole 4-lane pieces, which the template
    vectorises (`panels.vector_loop_axis`): a row of 53 it leaves to LLVM, which ran it scalar
    (2087 x 335 x 53 at 0.10x numpy, predicted vectorised). A whole reduction longer than a step
    not at all: the lanes template takes whole vectors only (`panels.lane_reduction_axis`), and a
    register tile of softmax's whole 61-wide row maximum ran it scalar, 11 us predicted against
    0.7 for 48 lanes with the edge split off, and a construction of one program ended there. A
    convolution's filters (`filter_lanes`) are the whole axis only in whole 4-lane pieces of at
    least a vector (12 on AVX2's 8 lanes, not 11): the template vectorises no other
    (`panels.filter_vector_axis`: 12 filters in a register tile of 12 on AVX-512 ran its plain
    template, scalar, 20-114 us where a vector of 16 padded filters ran 10-14; 13 channels, 7x7
    filters at stride 2 over 9 x 37, two Zen 5 cores), and pads filters that no multiple of the
    lanes divides to whole tiles instead (`panels.pads_filters`). A whole axis that LLVM splits
    into more pieces than whole vectors would take (`whole_vector_waste`) gives way to them
    wherever eps admits their padding, up to `whole_vector_bound`. Along a reduction, steps in a
    power-of-two number only (`_whole_steps`): where K's end cuts a unit tile the lanes template
    keeps the register tile's K one vector loop (`codegen.cpu._schedule_lanes`), and one of 3, 5
    or 6 vectors ran 3-13x slower than one of 2 or 4 (evidence:
    docs/model-evidence.md#power-of-two-lanes)."""

    name = "vector-lanes"
    reads_eps = True  # through `whole_vector_waste`
    applies = staticmethod(lanes_are_simd)  # its `axis_ok` accepts every size where lanes are threads

    def axis_ok(self, ctx, axis, size):
        if ctx.layer != 0 or ctx.device.lanes_are_threads or axis != lane_axis(ctx.expr, ctx.device):
            return True
        step = _lane_step(ctx.expr, ctx.device, axis)
        if size % step == 0:
            return ctx.expr.axes[axis].kind == "spatial" or _whole_steps(size // step)
        extent = ctx.expr.axes[axis].extent
        if size != extent:
            return False
        waste = whole_vector_waste(ctx.expr, ctx.device)
        if waste is not None and waste <= min(ctx.eps, whole_vector_bound(ctx.expr, ctx.device)) + 1e-12:
            return False
        if filter_lanes(ctx.expr, axis):
            # the whole axis in 4-lane pieces of at least a vector, which the template vectorises
            # (`panels.filter_vector_axis`); a shorter one takes one whole vector, padded
            # (`axes.short_filter_axis`), or nothing
            return size % 4 == 0 and size >= simd_lanes(ctx.device, ctx.expr.output.itemsize)
        if ctx.expr.axes[axis].kind != "spatial":
            return extent < step  # a K longer than a step: whole steps, its edge split off
        return extent < step or extent % 4 == 0


class AutovectorRowRule(PerAxisRule):
    """Execution unit, a CPU row LLVM vectorises on its own (`autovector_axis`: a stride-2
    pooling): whole 4-lane pieces, or 1 or 2 (its loop vectoriser then packs neighbouring tiles),
    or the whole axis; and its register tile unrolls one window row: 1 along every reduce axis
    but the last (the window's columns), since the template's unrolling of a long row's whole
    window breaks LLVM's SLP vectoriser (evidence: docs/model-evidence.md#execution-unit-rules)."""

    name = "autovector-row"
    applies = staticmethod(lanes_are_simd)  # its `axis_ok` accepts every size where lanes are threads

    def axis_ok(self, ctx, axis, size):
        if ctx.layer != 0 or ctx.device.lanes_are_threads:
            return True
        row = autovector_axis(ctx.expr, ctx.device)
        if axis == row:
            return size in (1, 2) or size % 4 == 0 or size == ctx.expr.axes[axis].extent
        if row is not None and ctx.expr.axes[axis].kind == "reduce" and axis != ctx.expr.reduce[-1]:
            return size == 1  # one window row
        return True


class CacheSetRule(WholeTileRule):
    """L1 sets (our rule): a CPU micro-kernel that runs its lanes along a reduction (gemv, row
    sums) reads one line of every row of its tile per step, straight from the input (that template
    packs nothing), and rows whose stride is a multiple of the L1's way size (4 KiB on a 64-set
    cache: any 1,024-float row) all land in one set. More lines than the set's `ways` evict each
    other before they are used. So the lines one step puts into one set (`l1_set_lines`) stay
    within the ways (evidence: docs/model-evidence.md#cache-set-rule)."""

    name = "l1-sets"
    applies = staticmethod(lanes_are_simd)  # `is_micro_kernel_layer` is False where lanes are threads

    def tile_ok(self, ctx, tile):
        if not is_micro_kernel_layer(ctx.device, ctx.layer) or len(ctx.device.layers) < 2:
            return True
        return l1_set_lines(ctx.expr, ctx.device, tuple(tile)) <= ctx.device.layers[1].ways


@lru_cache(maxsize=4096)
def l1_set_lines(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """The most cache lines one set of the L1 (`device.layers[1]`) receives from one reduction
    step of a CPU register micro-kernel of `tile` that runs its lanes along a reduction
    (`reduce_lanes`): per input reading that axis, the lines of the step's elements (the tile's
    extent along the lane axis and the spatial axes the input uses, 1 along other reductions),
    counted per set from row-major addresses; summed over the inputs, since their bases are
    unknown and page-aligned buffers start in the same set (gemv's x adds one line to A's R).
    0 where no such micro-kernel runs or the spec states no associativity (`ways`)."""
    lane = lane_axis(expr, device)
    if not reduce_lanes(expr, lane) or len(device.layers) < 2 or not device.layers[1].ways:
        return 0
    l1 = device.layers[1]
    sets = max(1, l1.capacity_bytes // (l1.ways * l1.transaction_bytes))
    total = 0
    for tensor in expr.inputs:
        if not tensor.uses_axis(lane):
            continue
        axes = [a for a in range(len(expr.axes)) if tensor.uses_axis(a) and (a == lane or expr.axes[a].kind != "reduce")]
        strides = [prod(tensor.shape[d + 1 :]) * tensor.itemsize for d in range(len(tensor.shape))]
        # a point's byte address is linear in its coordinates: the sum over the axes of the
        # coordinate times the axis's bytes per step (its coefficients times the strides)
        steps = {a: sum(coeffs[a] * stride for (coeffs, _), stride in zip(tensor.index, strides)) for a in axes}
        # along the axis of the shortest step, if no longer than a line, the addresses from each
        # point of the others' run through every line between the first and the last: those
        # lines are counted without the addresses in them (a gemv row's K is thousands of floats)
        line = l1.transaction_bytes
        run = min((a for a in axes if 0 < steps[a] <= line), key=lambda a: steps[a], default=None)
        starts = {0}
        for a in axes:
            if a != run:
                starts = {x + v * steps[a] for x in starts for v in range(tile[a])}
        span = (tile[run] - 1) * steps[run] if run is not None else 0
        lines = {n for x in starts for n in range(x // line, (x + span) // line + 1)}
        total += max(Counter(n % sets for n in lines).values())  # the distinct lines per set
    return total


class WarpGroupRule(WholeTileRule):
    """Execution-unit groups (Roller section 4: a unit's TEU group is its warp schedulers): a GPU
    block with a thread per output runs a whole number of groups of `teu_per_unit` warps
    (`block_thread_multiple`: 4 x 32 = 128 threads on NVIDIA V100, A100 and H100, whose SMs
    have 4 sub-partitions of one warp scheduler each; a wavefront on the MI50, whose group would
    leave too few block sizes), so that every scheduler gets as many of the block's warps as the
    others (a 13-warp block gives one scheduler 4 warps and three 3; Roller's model is accurate
    only from 4 warps a block, section 5, Figure 18, and its artifact requires multiples of 4
    warps).

    Our reading of where it applies: a block that covers every spatial axis (the whole output
    in one block) keeps its smaller or uneven size, as `BlockThreadsRule` lets it skip whole
    warps: a tiny operator (a 17 x 11 x 3 relu) has no second block to balance against. A
    cross-thread reduction's block (`cross_thread_axis`: threads along a reduce axis, one block
    per output, sized by `_reduce_fill` in whole warps) is left to `BlockThreadsRule`: the
    artifact builds no such block."""

    name = "warp-group"
    applies = staticmethod(launches_thread_blocks)  # `is_thread_block_layer` is False elsewhere

    def tile_ok(self, ctx, tile):
        device, expr = ctx.device, ctx.expr
        if not device.is_thread_block_layer(ctx.layer) or cross_thread_axis(expr, device) is not None:
            return True
        if all(tile[a] >= expr.axes[a].extent for a in expr.spatial):
            return True
        return block_thread_count(expr, device, tile, ctx.upper) % block_thread_multiple(device) == 0


def block_thread_multiple(device: DeviceSpec) -> int:
    """Threads a GPU block's thread count is a multiple of under `WarpGroupRule`: one warp per
    warp scheduler of a unit (`teu_per_unit` x `warp_size`) where a block's thread cap holds at
    least four such groups, else a warp. Our bound: four groups leave the construction block
    sizes to choose from (128 to 512 threads on the NVIDIA presets); the MI50's group, 4 SIMDs x
    a wavefront of 64, would leave two (256 and 512 of Roller's 512-thread cap: gensor-table4's
    65536 x 1024 x 4 matmul then had 4 programs), and the paper gives no such rule for it."""
    group = device.teu_per_unit * device.warp_size
    return group if 4 * group <= device.max_threads_per_block else device.warp_size


class TensorCoreAlignment(PerAxisRule):
    """Tensor cores: where the device has MMA units for the dtype and the operator contracts a
    reduce axis into a 2-D output (matmul-like), the top-layer tile is one warp's fragment tile
    and its (i, j, k) sizes are multiples of the MMA fragment (16 x 16 x 16 on NVIDIA)."""

    name = "tensor-core"

    def axis_ok(self, ctx, axis, size):
        mma = mma_axes(ctx.expr, ctx.device) if ctx.layer == 0 else None
        if mma is None or axis not in mma:
            return True
        return size % ctx.device.tensor_core_fragment[mma.index(axis)] == 0


class TailRule(PerAxisRule):
    """CPU tails (our rule): below the registers, a tile along a spatial `lane_axis` or a reduce
    axis divides the axis wherever the tile one layer up does, so that no cache tile leaves a
    ragged edge where the template pays for one. Along the vectors: the template pads a ragged
    unit tile, and the copy into a panel then tests every element of the vectorised dimension
    against the edge, which LLVM leaves scalar. Along a reduction: a ragged K tile turns panel
    packing off and guards the micro-kernel. Where no tile short of the whole axis both divides it and is a whole number of
    transactions (`_whole_tiles_exist`: a prime K of 509; gemv's K of 1000 over 8 lanes, whose
    divisors 40 and 200 are not whole 64 B lines), the axis is ragged anyway and left to the
    tensor-shape rule. A convolution vectorised along its filters (`filter_axis`) guards its
    whole unrolled micro-kernel for a ragged output row or column, so there every axis, the
    register tile's included, divides where a dividing tile exists, but for the register tile's
    output rows and columns a tile of 1 does not count: along a prime extent (23 x 13 outputs)
    it would leave one accumulator per vector of filters, a latency-bound chain that the
    guard's cost does not approach; nor for a cache tile over register tiles of 1 there, whose
    edge cuts none: over 127 columns (prime) it could otherwise be 1 or 127 columns only, and the
    walk's first ten programs of 64 filters over 127 x 127 outputs all had unit tiles one column
    wide (evidence: docs/model-evidence.md#tail-rule). Where the dividing rows cannot hold the
    accumulators the FMA chains ask for, a round of its own takes ragged ones as well
    (`AlignContext.ragged`, `Space.chains_eps`): over 38 x 38 outputs (2 x 19) only rows of 2
    divide, four accumulators a vector of filters. Over register tiles the axis's end cuts,
    its cache tiles divide the axis padded to whole register tiles (83 columns in tiles of 5: 5
    or all 85 columns), so the last one holds the cut tile and no whole one past the end, which
    would run anyway, each statement testing its guard (`model.cpu_compute.busiest_share`: 65
    columns of 97 channels to 19 5x5 filters ran 5.3 ms, 85 ran 2.6). A reduction vectorised
    along its K (gemv) guards its unrolled micro-kernel the same way for a ragged row, and LLVM
    then unrolls and unswitches it or not by the row count. So its register tile's rows divide
    as well, where a size from 2 to `MAX_SCAN` does (a prime row count takes any), and its K,
    where a multiple of whole lines of whole vectors does: the template vectorises K whole on a
    dividing tile and otherwise splits the edge off, its last register tile scalar
    (`panels.lane_reduction_axis`; evidence: docs/model-evidence.md#tail-rule).
    A one-row matmul (`always_streamed`) pads nothing, having no panels: its one reduction's
    tiles are `StreamRowsRule`'s (`stream_rows_axis`), but for a register tile vectorised along K
    (B stored transposed, [N, K]), whose K is a gemv's (1 x 841 x 457 found no register tile:
    every size of K but 29 and 841 refused). Another reduction with no panels splits
    the edge of a ragged K off its vector row whatever register K it cuts (`panels.splits_edges`:
    the guard K's end puts there is the same for every lane); its cache tiles' K divides K where
    a multiple of the tile above other than itself does, and otherwise need not (a prime K over
    K-steps of 1: the split runs them past the last whole tile)."""

    name = "cpu-tails"
    applies = staticmethod(lanes_are_simd)  # its `axis_ok` accepts every size where lanes are threads

    def axis_ok(self, ctx, axis, size):
        if ctx.device.lanes_are_threads or ctx.expr.axes[axis].extent % size == 0:
            return True
        lane = lane_axis(ctx.expr, ctx.device)  # once: the rules ask on every size they scan
        filters = filter_lanes(ctx.expr, lane)
        kind, extent = ctx.expr.axes[axis].kind, ctx.expr.axes[axis].extent
        along_k = ctx.layer == 0 and not filters and reduce_lanes(ctx.expr, lane)
        if kind == "reduce" and always_streamed(ctx.expr, ctx.device) and not along_k:
            if axis == stream_rows_axis(ctx.expr, ctx.device):
                return True  # `StreamRowsRule` has every tile's K
            upper = ctx.upper[axis]
            return ctx.layer > 0 and not any(extent % (m * upper) == 0 for m in range(2, min(extent // upper, MAX_SCAN) + 1))
        if ctx.layer == 0 and not (filters or along_k):
            return True
        if kind == "spatial" and axis != lane and (
                (along_k or filters) and ctx.layer == 0 or filters and ctx.upper[axis] == 1):
            if filters and ctx.layer == 0 and ctx.ragged:
                return True
            return _no_dividing_row(extent)  # a register tile's rows, or cache tiles over rows of 1
        if along_k and axis == lane:  # whole lines of whole vectors
            step = _lane_step(ctx.expr, ctx.device, axis)
            return not any(extent % s == 0 for s in range(step, extent, step))
        if along_k:
            return True
        if kind != "reduce" and axis != lane and not filters:
            return True
        if filters and kind == "spatial" and axis != lane and extent % ctx.upper[axis]:
            return -(-extent // ctx.upper[axis]) * ctx.upper[axis] % size == 0
        return not _whole_tiles_exist(ctx, axis)


class StreamRowsRule(PerAxisRule):
    """CPU rows in flight (our rule): a one-row matmul (`always_streamed`: its B is read once, in
    place, from the bottom layer) reads `axes.stream_rows` rows of B in each step of its register
    tile, no more and no fewer, each row a stream of its own started at once (`model.cpu.
    stream_rounds`). Roller's score cannot ask for it: the rows unroll over the same registers and
    save no byte, so K stayed 1 and one row streamed at a time (1 x 1853 x 5737 at 0.37x numpy;
    17 rows: 0.71-0.84x, evidence at `axes.STREAM_ROWS`). Its cache tiles take the same K, so
    that the register tiles after one another along N continue the same rows: each core streams
    its share of those rows in runs as long as its unit tile is wide (with a cache tile of more
    K, every L1 tile along N restarted them, 224 columns at a time on a 32 KiB L1). Where the
    rows do not divide K (`stream_rows` of a prime K), K's end cuts the last step of rows, which
    runs under a guard the same for every lane (`panels.splits_edges`).

    Along N its first cache tile is the register tile (or the fewest of them that make whole
    lines, `TransactionRule`), or a core's even share of N in whole register tiles
    (`axes.even_tile`): holding the same rows, a wider one holds nothing more the next step reads,
    and between the register and the unit tile it left the last L1 tile that a ragged row cuts
    guarded whole (lowering splits the loop over L1 tiles at the row's end, not the register
    tiles inside the cut one). Two Zen 4 cores, 16 rows, L1 tiles of 96 columns, 192 or 384,
    and the unit tile's: 1 x 2315 x 1309 (unit tiles of 768) 330, 450-480, 440-740 and 330-350
    us; 1 x 4907 x 2254 (1152) 1.10-1.34, -, 1.97-2.40 and 1.13-1.40 ms; the model put the
    middle ones first. The even share is an L1 tile that is the unit tile, the row's split
    falls among its register tiles, and it lets the unit tile be no wider than a core's share:
    with L1 tiles of one register tile, Roller's unit tile grew in whole L1 tiles, 1 x 1151 x
    671 in register tiles of 144 to unit tiles of 432 (one core's 432 columns against the
    other's 239), 103-107 us, where tiles of 112 columns under unit tiles of 336 ran 28-30
    (numpy 23-31; two Zen 5 cores, docs/evidence.md#one-row-shares). Where that share fits L1
    (`axes.share_streams_from_l1`) the register tile takes whole vectors that divide it, or pad
    it by at most PAD_VECTORS, two tiles or more to a share, so that the share is whole register
    tiles and its edge the one the row's end cuts. Padding it was slower on the Zen 4 while the
    cut tile's lanes ran scalar (1 x 2315 x 1309's share of 41 vectors in register tiles of 2
    padded to 42, 134-140 us; of 1 vector 98-107); with that tile apart (`codegen.cpu.
    _edge_tile_apart`) a share of a prime count of vectors needs it: 1 x 2340 x 268's 17 AVX2
    vectors only in tiles of 1 vector, one FMA chain each, 55-57 us; in 3 vectors over 18,
    37-39, numpy 32-63 (docs/evidence.md#one-row-shares); the model ranks the widths."""

    name = "cpu-stream-rows"

    @staticmethod
    def applies(device) -> bool:
        return device.runs_on_cpu and not device.lanes_are_threads  # its `axis_ok` accepts every size elsewhere

    def axis_ok(self, ctx, axis, size):
        if not ctx.device.runs_on_cpu or ctx.device.lanes_are_threads:
            return True
        rows_axis = stream_rows_axis(ctx.expr, ctx.device)
        if rows_axis is None:
            return True
        if axis == rows_axis:
            return size == stream_rows(ctx.expr.axes[axis].extent)
        if ctx.layer == 1 and axis == lane_axis(ctx.expr, ctx.device):
            # in whole lines: a register row of 7 AVX2 vectors (224 B) under L1 tiles of two
            line = max(1, ctx.device.layers[1].transaction_bytes // ctx.expr.output.itemsize)
            share = even_tile(ctx.expr.axes[axis].extent, ctx.device.compute_units, ctx.upper[axis])
            return size <= lcm(ctx.upper[axis], line) or size == share  # a core's share, `axes.even_tile`
        if ctx.layer == 0 and axis == lane_axis(ctx.expr, ctx.device) and share_streams_from_l1(ctx.expr, ctx.device):
            # whole vectors that divide a core's share or pad it by PAD_VECTORS at most, two
            # register tiles or more to it; a share of one vector or less leaves the row to the
            # other rules (10 columns: 10)
            lanes = ctx.device.warp_size
            share = even_tile(ctx.expr.axes[axis].extent, ctx.device.compute_units, lanes) // lanes
            vectors = size // lanes
            return share <= 1 or size % lanes == 0 and vectors < share and -share % vectors <= PAD_VECTORS
        return True


class WeightsAheadRule(PerAxisRule):
    """CPU weights laid out ahead (our rule): along a spatial axis that an input fixed before
    the first call reads (a model's weight, `TensorExpr.constants`) and that is not the lanes',
    every tile divides the axis where a dividing tile exists, as `TailRule` has the tiles along
    the lanes and a reduction do: the template lays such an input's panels out once, before the
    calls, only where no tile leaves a tail along its axes (`panels.prepacked_inputs`); a ragged
    tile has them copied, padded, in every call. ResNet-50's 2048 filters of 512 channels over
    7 x 7 pixels, a pointwise conv whose filters are the broadcast operand, ran 0.68 ms in
    register tiles of 30 filters (its 4 MB of filters copied per call) and 0.60 in tiles of 16
    and unit tiles of 256, laid out ahead (two Zen 4 cores; evidence:
    docs/model-evidence.md#weights-ahead-rule). Register tiles: a row of 1 does not count, as in
    `TailRule` (a dividing row from 2 up, where one exists)."""

    name = "cpu-weights-ahead"
    applies = staticmethod(lanes_are_simd)  # its `axis_ok` accepts every size where lanes are threads

    def axis_ok(self, ctx, axis, size):
        expr = ctx.expr
        if ctx.device.lanes_are_threads or not expr.constants or expr.axes[axis].extent % size == 0:
            return True
        if axis not in _weight_axes(expr) or axis == lane_axis(expr, ctx.device):
            return True
        extent = expr.axes[axis].extent
        if ctx.layer == 0:
            return _no_dividing_row(extent)
        return not _whole_tiles_exist(ctx, axis)


def _no_dividing_row(extent: int) -> bool:
    """Whether no register row from 2 up (to `MAX_SCAN`) divides `extent`: a row of 1 always
    does, so a register tile that must divide is ragged where nothing longer does."""
    return not any(extent % s == 0 for s in range(2, min(extent, MAX_SCAN + 1)))


@lru_cache(maxsize=1024)
def _weight_axes(expr: TensorExpr) -> frozenset[int]:
    """The spatial axes the expression's constant inputs (`constants`) read."""
    return frozenset(a for t in expr.inputs if t.name in expr.constants for a in expr.spatial if t.uses_axis(a))


@lru_cache(maxsize=1024)
def whole_vector_waste(expr: TensorExpr, device: DeviceSpec) -> float | None:
    """Where a CPU register row along a spatial lane axis (`lane_axis`) can be the whole axis
    only in LLVM's pieces, more vectors than whole ones would take (`registers.row_vectors`: a
    row of 28 over 8 lanes, 7 xmm where 32 is 4 ymm), the least share of the axis a row of whole
    vectors pads it by (28: rows of 8, 16 or 32 pad to 32, 1/7); None elsewhere."""
    axis = lane_axis(expr, device) if device.runs_on_cpu and not device.lanes_are_threads else None
    if axis is None or expr.axes[axis].kind != "spatial":
        return None
    extent, itemsize = expr.axes[axis].extent, expr.output.itemsize
    lanes = max(1, device.register_bytes // itemsize)
    vectors = -(-extent // lanes)
    if extent <= lanes or extent % lanes == 0 or row_vectors(extent, itemsize, device) <= vectors:
        return None
    return min((-(-extent // size) * size - extent) / extent for size in range(lanes, vectors * lanes + 1, lanes))


@lru_cache(maxsize=1024)
def whole_vector_bound(expr: TensorExpr, device: DeviceSpec) -> float:
    """The most whole vectors may pad a CPU register row that LLVM would split into pieces
    (`whole_vector_waste`) and replace it: WHOLE_VECTOR_EPS, or PIECES_EPS where the row is one
    of whole 4-lane pieces (`VectorLanesRule`; no other row of the whole axis is a register
    row) that take at least PIECES_RATIO times the vectors (`row_vectors` against whole ones:
    on 16 lanes rows of 20, 28, 36, 44, ...; on 8 lanes pieces of 4 are always fewer)."""
    axis = lane_axis(expr, device)
    extent, itemsize = expr.axes[axis].extent, expr.output.itemsize
    lanes = max(1, device.register_bytes // itemsize)
    if extent % 4 == 0 and row_vectors(extent, itemsize, device) >= PIECES_RATIO * -(-extent // lanes):
        return PIECES_EPS
    return WHOLE_VECTOR_EPS


def _whole_steps(steps: int) -> bool:
    """Whether a reduction's register tile of `steps` lane steps (`_lane_step`) is a power of
    two of them, which LLVM splits into whole vectors under the lanes template's guard
    (`VectorLanesRule`): 3 x 15788 x 478 with B stored transposed, register K 16, 32, 64 and 128
    against 48, 80 and 96 over a ragged K, 1.9-2.9 ms against 9.3-11.5 on one Zen 4 core; on
    both, 32 against 48 1.23 ms against 5.9."""
    return steps & (steps - 1) == 0


def _lane_step(expr: TensorExpr, device: DeviceSpec, lane: int) -> int:
    """The size a CPU register tile's `lane` axis is a multiple of (`VectorLanesRule`): whole
    vectors of lanes, and along a reduction whole first-layer cache lines of every input reading
    it as well."""
    if expr.axes[lane].kind != "reduce" or len(device.layers) < 2:
        return device.warp_size
    line = device.layers[1].transaction_bytes
    return lcm(device.warp_size, *(line // gcd(line, t.itemsize) for t in expr.inputs if t.uses_axis(lane)))


# The per-axis rules besides the tensor shape's (which any dividing size passes) that a CPU tile
# size must meet at any eps: a dividing size they refuse is no whole tile.
_SIZE_RULES = (TransactionRule(), VectorLanesRule(), AutovectorRowRule())


@lru_cache(maxsize=4096)
def _whole_tiles_exist(ctx: AlignContext, axis: int) -> bool:
    """Whether a tile along `axis` shorter than the axis, a multiple of the tile above within
    `MAX_SCAN` multiples, divides the axis and is a size the other per-axis rules accept (whole
    transactions; along a register tile's lanes whole vectors: a conv's 356 filters, 4 x 89,
    have no dividing multiple of 8 lanes, so there a ragged register tile is the only kind)."""
    extent, upper = ctx.expr.axes[axis].extent, ctx.upper[axis]
    if extent % upper:
        return False
    sizes = (m * upper for m in range(1, min(extent // upper - 1, MAX_SCAN) + 1))
    return any(extent % s == 0 and all(r.axis_ok(ctx, axis, s) for r in _SIZE_RULES) for s in sizes)
