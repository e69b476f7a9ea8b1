"""Roller's alignment rules (§3.1), one small rule each, composed in `next_aligned_sizes`.

A tile size is *aligned* at a layer when every rule accepts it. Candidate sizes at a layer are the
multiples of the tile one layer up (each layer's tile is a multiple of the one above, Figure 7),
so `next_aligned_sizes` scans those multiples upwards and returns, per axis, the first size that
every rule accepts. New hardware features are new rules here, nowhere else.

Rules see an `AlignContext` (expression, device, layer, the tile one layer up, eps) and answer
`axis_ok(ctx, axis, size)` for per-axis rules and `tile_ok(ctx, tile)` for rules over the whole
tile (the thread count of a GPU block, the FMA accumulators of a CPU register tile).

A CPU core's register tile is a register micro-kernel (the BLIS / oneDNN idea): the output tile
stays in vector registers as accumulators, one vector per output row along the axis the SIMD
lanes run along (`lane_axis`), and every reduction step loads one row of vectors of each input
that axis indexes and broadcasts the elements of the others into one register.
`micro_kernel_registers` counts those vector registers; they are the register layer's footprint
(`rprogram.layer_footprint`). Memory transactions at the cache layers are 64 B lines (each CPU
layer's `transaction_bytes`, `TransactionRule`), and a cache tile leaves no ragged edge along the
vectors or a reduction where the register tile does not (`TailRule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import ceil, gcd, lcm, prod
from typing import Protocol

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.traffic import calculus

Tile = tuple[int, ...]

# GPU register-level steps: Roller's artifact multiplies a thread's tile by {1, 2, 4, 8, 16, 32}.
REGISTER_STEPS = (1, 2, 4, 8, 16, 32)
# Scan bound for `next_aligned_sizes`: enough multiples to find a transaction- or warp-aligned
# size from any start (the strictest granularity is 64 B / 1 B = 64 steps).
MAX_SCAN = 128


@dataclass(frozen=True)
class AlignContext:
    expr: TensorExpr
    device: DeviceSpec
    layer: int  # index into device.layers, 0 = top (registers)
    upper: Tile  # the tile one layer up (all ones at the top layer)
    eps: float

    @property
    def scope(self) -> str:
        return self.device.layers[self.layer].scope


class Rule(Protocol):
    name: str

    def axis_ok(self, ctx: AlignContext, axis: int, size: int) -> bool: ...

    def tile_ok(self, ctx: AlignContext, tile: Tile) -> bool: ...


class _PerAxis:
    def tile_ok(self, ctx: AlignContext, tile: Tile) -> bool:
        return True


class TensorShapeRule(_PerAxis):
    """Tensor shape: a size S on an axis of extent N wastes (S - N % S) / N when padded; allowed
    only if that fraction is <= eps (Roller raises eps up to 1.0 when too few programs exist)."""

    name = "tensor-shape"

    def axis_ok(self, ctx, axis, size):
        extent = ctx.expr.axes[axis].extent
        return (ceil(extent / size) * size - extent) / extent <= ctx.eps + 1e-12


class TransactionRule(_PerAxis):
    """Memory transaction: the contiguous (leading) dimension of every input data tile is a whole
    number of transactions of the layer it is loaded from (32 B from NVIDIA global memory, a
    64 B line on CPUs). Applies where one axis alone indexes that dimension; a window such as
    `w*stride + s` cannot be aligned by choosing one axis and is left to the other rules. Not
    applied at the top layer: registers are filled by vector / word loads (the execution-unit
    rule's business)."""

    name = "memory-transaction"

    def axis_ok(self, ctx, axis, size):
        if ctx.layer == 0:
            return True
        source = ctx.device.layers[ctx.layer + 1]
        extent = ctx.expr.axes[axis].extent
        for tensor in ctx.expr.inputs:
            if leading_axis(tensor) == axis and size < extent:
                if (size * tensor.itemsize) % source.transaction_bytes:
                    return False
        return True


class ExecutionUnitRule:
    """Execution unit: work handed to a parallel unit is a multiple of its width.

    GPU: a block's thread count (unit tile / register tile over spatial axes) is a multiple of
    the warp size, unless the block already covers every spatial axis; a thread's tile uses
    Roller's register steps. A cross-thread reduction (`cross_thread_axis`) counts its threads
    along its reduce axis instead (whole warps unless one step covers the axis, and never fewer
    than a warp: R2's 121-long rows on the A100 took blocks of 4 threads x 32 elements, 4 busy
    lanes a warp; a thread's tile along the axis leaves a warp of threads), and its
    threads and blocks sum for one output each (spatial tiles of 1: the block's partial sums
    meet in one tree per output; our choice, as the classic one-block-per-row gemv). CPU: the
    register tile along the axis the SIMD lanes run along (`lane_axis`) is a multiple of the
    lanes, or the whole axis when it is shorter, and along
    a reduction a whole number of cache lines as well (our rule: each K-step of gemv then
    advances every row's stream by whole lines; 7 x 16 and 6 x 16 measured 2.6-2.8 ms against
    14 x 8's 3.1-4.0 ms on AVX2, loaded runs, each pair in one run); and
    a reduction's register tile holds at least `required_accumulators` vector accumulators, so
    that the core's FMA pipes never wait on an FMA latency (ALGORITHMS.md §7: the execution
    unit of a CPU core is its FMA pipes x their latency, not one vector). A row LLVM vectorises
    on its own (`autovector_axis`: a stride-2 pooling) is whole 4-lane pieces, or 1 or 2 (its
    loop vectoriser then packs neighbouring tiles; register tiles of 2 rows of 3 ran 132-138 us
    against 66 us for one row of 3 and 64-75 us for rows of 1 and 2), or the whole axis:
    avgpool-3x3 on the AVX-512 Zen 5 ran rows of 4, 8, 28 and 56 in 61-95 us, and rows of 14
    with the 3 x 3 window unrolled in 147-153 us, which LLVM left scalar (its SLP vectoriser
    gave up on 8 + 4 + 2).
    Such a row's register tile unrolls one window row: 1 along every reduce axis but the last
    (the window's columns). LLVM unrolls a short window loop itself where the row is short
    (rows of 1, 2, 4 and 8 compiled to the same instructions with 1 or 3 window rows), and where
    it is long the template's unrolling is what breaks the SLP vectoriser: a row of 28 with the
    whole 3 x 3 window left 8 outputs scalar (72 scalar adds) and ran 67 us against 49 us with
    one window row (2026-11-25, the same run).
    """

    name = "execution-unit"

    def axis_ok(self, ctx, axis, size):
        if ctx.layer != 0:
            if ctx.expr.axes[axis].kind != "spatial" or not ctx.device.is_thread_block_layer(ctx.layer):
                return True
            # a cross-thread reduction's block computes one output (its register tile)
            return cross_thread_axis(ctx.expr, ctx.device) is None or size == ctx.upper[axis]
        extent = ctx.expr.axes[axis].extent
        if ctx.device.lanes_are_threads:
            mma = mma_axes(ctx.expr, ctx.device)
            if mma is not None and axis in mma:
                return True  # a warp's fragment tile: the tensor-core rule governs it
            across = cross_thread_axis(ctx.expr, ctx.device)
            if ctx.expr.axes[axis].kind == "spatial" and across is not None:
                return size == 1  # a thread of a cross-thread reduction sums for one output
            if axis == across:  # and leaves at least a warp of threads along the row
                return size in REGISTER_STEPS and ceil(extent / size) >= ctx.device.warp_size
            return size in REGISTER_STEPS or size == extent
        if axis == lane_axis(ctx.expr, ctx.device):
            return size == extent or size % _lane_step(ctx.expr, ctx.device, axis) == 0
        row = autovector_axis(ctx.expr, ctx.device)
        if axis == row:
            return size in (1, 2) or size % 4 == 0 or size == extent
        if row is not None and ctx.expr.axes[axis].kind == "reduce" and axis != ctx.expr.reduce[-1]:
            return size == 1  # one window row
        return True

    def tile_ok(self, ctx, tile):
        need = required_accumulators(ctx)
        if need and accumulators(ctx.expr, ctx.device, tile) < need:
            return False
        if not ctx.device.is_thread_block_layer(ctx.layer):
            return True
        threads = block_thread_count(ctx.expr, ctx.device, tile, ctx.upper)
        across = cross_thread_axis(ctx.expr, ctx.device)
        covered = ctx.expr.spatial if across is None else (across,)
        covers = all(tile[a] >= ctx.expr.axes[a].extent for a in covered)
        if across is not None and threads < ctx.device.warp_size:
            return False  # a row of at least a warp's elements is read by at least a warp
        return threads % ctx.device.warp_size == 0 or covers


class CacheSetRule:
    """L1 sets (our rule): a CPU micro-kernel that runs its lanes along a reduction (gemv, row
    sums) reads one line of every row of its tile per step, straight from the input (that template
    packs nothing), and rows whose stride is a multiple of the L1's way size (4 KiB on a 64-set
    cache: any 1,024-float row) all land in one set. More lines than the set's `ways` evict each
    other before they are used. So the lines one step puts into one set (`l1_set_lines`) stay
    within the ways. gemv-4096 on the AVX-512 Zen 5 (48 KiB 12-way L1d), register tiles of R
    rows x 16 lanes, R dividing 4,096, one process, interleaved rounds (2026-11-25): R = 4, 8
    (5 and 9 lines a set) 505 and 450 us, R = 16 (17 lines) 521 us; with rows of 4,160 floats
    (4 sets apart) R = 8, 16, 20 ran alike, 417-456 us."""

    name = "l1-sets"

    def axis_ok(self, ctx, axis, size):
        return True

    def tile_ok(self, ctx, tile):
        if not is_micro_kernel_layer(ctx.device, ctx.layer) or len(ctx.device.layers) < 2:
            return True
        return l1_set_lines(ctx.expr, ctx.device, tuple(tile)) <= ctx.device.layers[1].ways


@lru_cache(maxsize=4096)
def l1_set_lines(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """The most cache lines one set of the L1 (`device.layers[1]`) receives from one reduction
    step of a CPU register micro-kernel of `tile` that runs its lanes along a reduction
    (`_reduce_lanes`): per input reading that axis, the lines of the step's elements (the tile's
    extent along the lane axis and the spatial axes the input uses, 1 along other reductions),
    counted per set from row-major addresses; summed over the inputs, since their bases are
    unknown and page-aligned buffers start in the same set (gemv's x adds one line to A's R).
    0 where no such micro-kernel runs or the spec states no associativity (`ways`)."""
    lane = lane_axis(expr, device)
    if not _reduce_lanes(expr, lane) or len(device.layers) < 2 or not device.layers[1].ways:
        return 0
    l1 = device.layers[1]
    sets = max(1, l1.capacity_bytes // (l1.ways * l1.transaction_bytes))
    total = 0
    for tensor in expr.inputs:
        if not tensor.uses_axis(lane):
            continue
        axes = [a for a in range(len(expr.axes)) if tensor.uses_axis(a) and (a == lane or expr.axes[a].kind != "reduce")]
        strides = [prod(tensor.shape[d + 1 :]) * tensor.itemsize for d in range(len(tensor.shape))]
        counts: dict[int, set[int]] = {}
        point = [0] * len(expr.axes)
        for values in product(*(range(tile[a]) for a in axes)):
            for a, v in zip(axes, values):
                point[a] = v
            address = sum(sum(c * point[a] for a, c in enumerate(coeffs)) * stride for (coeffs, _), stride in zip(tensor.index, strides))
            line = address // l1.transaction_bytes
            counts.setdefault(line % sets, set()).add(line)
        total += max(len(lines) for lines in counts.values())
    return total


class WarpGroupRule:
    """Execution-unit groups (Roller section 4: a unit's TEU group is its warp schedulers): a GPU
    block with a thread per output runs a whole number of groups of `teu_per_unit` warps
    (`block_thread_multiple`: 4 x 32 = 128 threads on NVIDIA V100, A100 and H100, whose SMs
    have 4 sub-partitions of one warp scheduler each; a wavefront on the MI50, whose group would
    leave too few block sizes), so that every scheduler gets as many of the block's warps as the
    others (a 13-warp block gives one scheduler 4 warps and three 3; Roller's model is accurate
    only from 4 warps a block, section 5, Figure 18, and its artifact requires multiples of 4
    warps).

    Our reading of where it applies: a block that covers every spatial axis (the whole output
    in one block) keeps its smaller or uneven size, as `ExecutionUnitRule` lets it skip whole
    warps: a tiny operator (a 17 x 11 x 3 relu) has no second block to balance against. A
    cross-thread reduction's block (`cross_thread_axis`: threads along a reduce axis, one block
    per output, sized by `_reduce_fill` in whole warps) is left to `ExecutionUnitRule`: the
    artifact builds no such block."""

    name = "warp-group"

    def axis_ok(self, ctx, axis, size):
        return True

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


class TensorCoreRule(_PerAxis):
    """Tensor cores: where the device has MMA units for the dtype and the operator contracts a
    reduce axis into a 2-D output (matmul-like), the top-layer tile is one warp's fragment tile
    and its (i, j, k) sizes are multiples of the MMA fragment (16 x 16 x 16 on NVIDIA)."""

    name = "tensor-core"

    def axis_ok(self, ctx, axis, size):
        mma = mma_axes(ctx.expr, ctx.device) if ctx.layer == 0 else None
        if mma is None or axis not in mma:
            return True
        return size % ctx.device.tensor_core_fragment[mma.index(axis)] == 0


class TailRule(_PerAxis):
    """CPU tails (our rule): below the registers, a tile along a spatial `lane_axis` or a reduce
    axis divides the axis wherever the tile one layer up does, so that no cache tile leaves a
    ragged edge where the template pays for one. Along the vectors: the template pads a ragged
    unit tile, and the copy into a panel then tests every element of the vectorised dimension
    against the edge, which LLVM leaves scalar (mm-512 on AVX2, 6x16x1 / 12x16x256 registers and
    L1 tiles, L2 tiles 132 x 176: 2.0 ms, 132 x 128: 1.65 ms, though 176 pads N by 3% only).
    Along a reduction: a ragged K tile turns panel packing off and guards the micro-kernel
    (mm-1024, 6x16x352 L1 tiles, 3 x 352 = 1056: 34-41 ms against 12-13 ms for 6x16x256, the
    same run). Where no tile short of the whole axis both divides it and is a whole number of
    transactions (`_whole_tiles_exist`: a prime K of 509; gemv's K of 1000 over 8 lanes, whose
    divisors 40 and 200 are not whole 64 B lines), the axis is ragged anyway and left to the
    tensor-shape rule. A convolution vectorised along its filters (`filter_axis`) guards its
    whole unrolled micro-kernel for a ragged output row or column, so there every axis, the
    register tile's included, divides where a dividing tile exists (conv-3x3, AVX2, same run:
    8 x 3 x 4 filters x rows x columns, rows ragged on 56, 9.0 ms; 16 x 1 x 4 4.0 ms). A reduction
    vectorised along its K (gemv) guards its unrolled micro-kernel the same way for a ragged
    row, and LLVM then unrolls and unswitches it or not by the row count: gemv-4096 on the AVX-512
    Zen 5, register tiles of R rows x 16 lanes under R x 512 L1 tiles, one process, interleaved
    rounds (2026-11-25): R = 4, 8, 16 (dividing 4,096) 505, 450, 521 us; R = 10 441 us; R = 6,
    18, 20 641, 772, 660 us; R = 7, 9, 11-15 889-991 us, their K loop left rolled with 9-18
    FMAs in the function against 256 for R = 8. So its register tile's rows divide as well, where
    a size from 2 to `MAX_SCAN` does (a prime row count takes any), and its K, where a multiple of
    whole lines of whole vectors does: the template vectorises K only for a dividing tile
    (`panels.lane_reduction_axis`), and gemv-4096's 8 x 48 (3 vectors, K padded to 4,224) took
    the plain template, predicted 10x slower and run 35x slower as row sums."""

    name = "cpu-tails"

    def axis_ok(self, ctx, axis, size):
        if ctx.device.lanes_are_threads or ctx.expr.axes[axis].extent % size == 0:
            return True
        lane = lane_axis(ctx.expr, ctx.device)  # once: the rules ask on every size they scan
        filters = _filter_lanes(ctx.expr, lane)
        kind, extent = ctx.expr.axes[axis].kind, ctx.expr.axes[axis].extent
        along_k = ctx.layer == 0 and not filters and _reduce_lanes(ctx.expr, lane)
        if ctx.layer == 0 and not (filters or along_k):
            return True
        if along_k and kind == "spatial":  # a row of 1 always divides: ragged where nothing longer does
            return not any(extent % s == 0 for s in range(2, min(extent, MAX_SCAN + 1)))
        if along_k and axis == lane:  # whole lines of whole vectors
            step = _lane_step(ctx.expr, ctx.device, axis)
            return not any(extent % s == 0 for s in range(step, extent, step))
        if along_k:
            return True
        if kind != "reduce" and axis != lane and not filters:
            return True
        return not _whole_tiles_exist(ctx, axis)


def _lane_step(expr: TensorExpr, device: DeviceSpec, lane: int) -> int:
    """The size a CPU register tile's `lane` axis is a multiple of (`ExecutionUnitRule`): whole
    vectors of lanes, and along a reduction whole first-layer cache lines of every input reading
    it as well."""
    if expr.axes[lane].kind != "reduce" or len(device.layers) < 2:
        return device.warp_size
    line = device.layers[1].transaction_bytes
    return lcm(device.warp_size, *(line // gcd(line, t.itemsize) for t in expr.inputs if t.uses_axis(lane)))


def _reduce_lanes(expr: TensorExpr, lane: int | None) -> bool:
    """Whether a CPU micro-kernel whose `lane_axis` is `lane` runs its SIMD lanes along a
    reduction (gemv, row sums), keeping a vector of partial sums per output row."""
    return lane is not None and expr.axes[lane].kind == "reduce"


def _filter_lanes(expr: TensorExpr, lane: int | None) -> bool:
    """Whether a CPU micro-kernel whose `lane_axis` is `lane` vectorises `expr` along its
    `filter_axis`."""
    f = filter_axis(expr)
    return f is not None and f == lane


@lru_cache(maxsize=4096)
def _whole_tiles_exist(ctx: AlignContext, axis: int) -> bool:
    """Whether a tile along `axis` shorter than the axis, a multiple of the tile above within
    `MAX_SCAN` multiples, divides the axis and is a whole number of transactions."""
    extent, upper = ctx.expr.axes[axis].extent, ctx.upper[axis]
    if extent % upper:
        return False
    sizes = (m * upper for m in range(1, min(extent // upper - 1, MAX_SCAN) + 1))
    return any(extent % s == 0 and TransactionRule().axis_ok(ctx, axis, s) for s in sizes)


RULES: tuple[Rule, ...] = (
    TensorShapeRule(), TransactionRule(), ExecutionUnitRule(), WarpGroupRule(), TensorCoreRule(), TailRule(),
    CacheSetRule(),
)


def leading_axis(tensor) -> int | None:
    """The axis that alone (coefficient 1) indexes a tensor's contiguous dimension, if any."""
    if not tensor.index:  # a scalar (a reduction over every axis)
        return None
    return _dim_axis(tensor, len(tensor.index) - 1)


def _dim_axis(tensor, dim: int) -> int | None:
    """The axis that alone (coefficient 1) indexes dimension `dim` of a tensor, if any."""
    coeffs, _ = tensor.index[dim]
    used = [a for a, c in enumerate(coeffs) if c]
    return used[0] if len(used) == 1 and coeffs[used[0]] == 1 else None


def mma_axes(expr: TensorExpr, device: DeviceSpec) -> tuple[int, int, int] | None:
    """(i, j, k) covered by an MMA fragment, or None where tensor cores do not apply: the device
    has no MMA unit for the dtype, or the operator is not a contraction C[.., i, j] += A[.., i, k]
    * B[.., k, j] (i, j the output's last two dims; each of i, j, k indexing a dimension alone;
    A without j, B without i), or one of i, j, k is shorter than the fragment (no tile may
    exceed its axis, so no fragment tile would exist). A conv's window `h*stride + r` is not
    such a contraction."""
    if not device.has_tensor_cores(expr.dtype):
        return None
    out = expr.output
    if len(out.index) < 2 or len(expr.inputs) != 2:
        return None
    i, j = _dim_axis(out, len(out.index) - 2), _dim_axis(out, len(out.index) - 1)
    if i is None or j is None or i == j:
        return None
    sole = [{_dim_axis(t, d) for d in range(len(t.index))} - {None} for t in expr.inputs]
    for a, b in ((0, 1), (1, 0)):
        if i in sole[a] and j in sole[b] and not expr.inputs[a].uses_axis(j) and not expr.inputs[b].uses_axis(i):
            ks = [k for k in expr.reduce if k in sole[a] and k in sole[b]]
            if ks:
                found = (i, j, ks[-1])
                fits = all(expr.axes[x].extent >= f for x, f in zip(found, device.tensor_core_fragment))
                return found if fits else None
    return None


def tile_lanes(expr: TensorExpr, device: DeviceSpec) -> int:
    """Threads sharing one top-layer tile: a warp for an MMA fragment tile, else one."""
    return device.warp_size if mma_axes(expr, device) else 1


@lru_cache(maxsize=1024)
def cross_thread_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The reduce axis a GPU block spreads its threads along (a cross-thread reduction), or None.

    The decision is coalescing (issue 16). A thread per output puts neighbouring threads on
    neighbouring outputs, which read their rows a whole row apart wherever the innermost reduce
    axis `k` alone indexes the contiguous dimension of every input reading it (`leading_axis`
    and `streams`): a warp's load touches one 32 B sector per lane (32 sectors for 128 useful
    bytes in fp32, 8x a coalesced load; `model.gpu.warp_sectors` prices it). An operator none of whose
    inputs is reused across outputs (`_read_once`: reduce_sum / reduce_mean over the last
    axes, roller-table1 R0-R2) stages nothing in shared memory, so its threads read global
    memory that way; such a reduction, whatever its number of outputs, binds its threads to `k`
    instead: consecutive threads read consecutive elements, each thread sums its share, and
    the block combines the partial sums in a tree (TVM's cross-thread allreduce: warp shuffles,
    then shared memory across warps); a block sums for one output point (`ExecutionUnitRule`).
    An operator with a reused input (gemv's x, A x B^T's A and B) stages its tiles, which the
    block's threads copy coalesced, and keeps a thread per output, unless it has fewer outputs
    than `compute_units x warp_size` (a thread per output cannot give every unit even one warp;
    our threshold) and an input read once runs along `k` (gemv 64 x 8192's A: one block a row,
    as the classic gemv; not A x B^T, both of whose inputs are reused).
    `k` must be at least a warp long (a shorter row shares its sectors between neighbouring
    threads' rows anyway). A thread per output stays where neighbouring outputs read
    neighbouring elements: a reduction over an outer axis (axis 0 of a row-major matrix, whose
    output axis is the input's contiguous one), pooling windows (`x*stride + s`), a matmul's
    B[k, j] (k with a stride of N), and contractions on tensor cores."""
    if not device.lanes_are_threads or not expr.reduce or mma_axes(expr, device) is not None:
        return None
    k = expr.reduce[-1]
    readers = [t for t in expr.inputs if t.uses_axis(k)]
    if expr.axes[k].extent < device.warp_size or not readers:
        return None
    streamed = [_read_once(expr, t) for t in expr.inputs]
    few = prod(expr.axes[a].extent for a in expr.spatial) < device.compute_units * device.warp_size
    if not (all(streamed) or (few and any(s for s, t in zip(streamed, expr.inputs) if t.uses_axis(k)))):
        return None
    return k if all(leading_axis(t) == k and streams(t, k) for t in readers) else None


def _read_once(expr: TensorExpr, tensor) -> bool:
    """Whether each element of `tensor` is read for one output only (it uses every spatial axis
    longer than 1): nothing of it is reused across outputs."""
    return all(tensor.uses_axis(a) for a in expr.spatial if expr.axes[a].extent > 1)


def vector_axis(expr: TensorExpr) -> int | None:
    """The axis indexing the output's contiguous dimension: the one a CPU kernel vectorises
    where its inputs allow (`lane_axis`)."""
    return leading_axis(expr.output)


def streams(tensor, axis: int) -> bool:
    """Whether `axis` indexes `tensor` only through its contiguous dimension with stride 1, or not
    at all: consecutive values along the axis are one vector load (or one broadcast), not a
    gather (the CPU template decides vectorisation by this test: `panels.vector_loop_axis`)."""
    dims = [d for d, (coeffs, _) in enumerate(tensor.index) if coeffs[axis]]
    if not dims:
        return True
    last = len(tensor.index) - 1
    return dims == [last] and tensor.index[last][0][axis] == 1


def is_projection(tensor, expr: TensorExpr) -> bool:
    """Whether every dimension of `tensor` is indexed by one whole unfused axis with coefficient
    1 and no offset (matmul's operands, a conv's filters; not a conv's input windows): a tile of
    it can be copied into a panel of any layout."""
    for coeffs, const in tensor.index:
        used = [a for a, c in enumerate(coeffs) if c]
        if const or len(used) != 1 or coeffs[used[0]] != 1 or len(expr.axes[used[0]].fused_from) > 1:
            return False
    return True


# Cached: the CPU rules ask for it on every size they scan (cpu-tails, the execution unit), and
# a convolution's answer walks every output dimension's readers. On cpu-core / local-cpu the
# top-10 constructions of conv-1x1 and conv-3x3-s2 took 330 and 480 ms against 790 and 780 ms
# uncached; `lane_axis`, whose key also hashes the device spec, got slower cached (gemv-4096
# 146 ms against 99).
@lru_cache(maxsize=256)
def filter_axis(expr: TensorExpr) -> int | None:
    """The output-channel axis of a convolution-like reduction, or None.

    The operator reduces and reads its output's contiguous axis through a window (an input
    dimension indexed by that axis and another, `x*stride + s`), and the axis is a spatial one
    that the inputs reading it read as projections (`is_projection`: the filters) while at
    least one other input ignores it (the data, broadcast), and the filters are reused (they
    ignore a spatial axis longer than 1). The innermost such output dimension (conv2d: f).
    Depthwise convolutions and pooling have none: their channel axis indexes the windowed data.
    """
    v = vector_axis(expr)
    if not expr.reduce or v is None or not any(_windowed(t, v) for t in expr.inputs):
        return None
    found = None
    for dim, (coeffs, _) in enumerate(expr.output.index):
        a = _dim_axis(expr.output, dim)
        if a is None or expr.axes[a].kind != "spatial":
            continue
        readers = [t for t in expr.inputs if t.uses_axis(a)]
        if not readers or len(readers) == len(expr.inputs):
            continue
        reused = all(any(not t.uses_axis(b) and expr.axes[b].extent > 1 for b in expr.spatial) for t in readers)
        if reused and all(is_projection(t, expr) for t in readers):
            found = a
    return found


def _windowed(tensor, axis: int) -> bool:
    """Whether `tensor` reads `axis` in a dimension that another axis indexes as well."""
    return any(coeffs[axis] and sum(1 for c in coeffs if c) > 1 for coeffs, _ in tensor.index)


def lane_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The axis a CPU register micro-kernel fills its SIMD lanes along, or None (scalar code).

    A convolution's `filter_axis` when it holds a whole number of 4-lane pieces and at least a
    vector (oneDNN's direct-convolution idea: the filters, packed into panels with the filter
    axis innermost, stream as vectors; each input element is broadcast, so the stride does not
    matter; the accumulators keep the filter axis innermost). Measured on AVX2, 2 cores, loaded
    machine, hand-picked tiles in one run: conv-3x3-s2 1.7 ms (16 x 2 x 2 filters x rows x
    columns) against 25.7 ms for the scalar rank 1; conv-3x3 1.6 ms (8 x 1 x 8) against 5.6 ms
    for the output row vectorised (4 x 3 x 8).
    Else the output's contiguous axis (`vector_axis`) when every input streams along it or
    ignores it (a strided or transposed access turns a vector load into a gather); else, for a
    reduction, its innermost reduce axis when an input reads it, every input streams along it
    or ignores it, and it has at least a vector of lanes: each output then keeps a vector of
    per-lane partial sums, summed across lanes once per tile (gemv, row sums: the CPU
    template's rfactor path). Else none (a stride-2 pooling's output row is a gather).
    """
    f = filter_axis(expr)
    if f is not None and expr.axes[f].extent >= device.warp_size and expr.axes[f].extent % 4 == 0:
        return f
    v = vector_axis(expr)
    if v is not None and expr.axes[v].kind == "spatial" and all(streams(t, v) for t in expr.inputs):
        return v
    if not expr.reduce:
        return None
    k = expr.reduce[-1]
    if expr.axes[k].extent < device.warp_size or not any(t.uses_axis(k) for t in expr.inputs):
        return None
    return k if all(streams(t, k) for t in expr.inputs) else None


def autovector_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The output row LLVM vectorises on its own in a CPU micro-kernel without a `lane_axis`: the
    output's contiguous axis where an input reads it strided (a stride-2 pooling), or None. The
    template leaves that row scalar and unrolled; LLVM's SLP vectoriser packs it into vectors in
    power-of-two pieces, shuffling the strided loads (a row of 1 to 3, its loop vectoriser packs
    consecutive register tiles instead): `model.cpu_compute.autovector_efficiency`."""
    if not device.runs_on_cpu or lane_axis(expr, device) is not None:
        return None
    v = vector_axis(expr)
    return v if v is not None and expr.axes[v].kind == "spatial" else None


def is_micro_kernel_layer(device: DeviceSpec, layer: int) -> bool:
    """Whether a tile at `layer` is a CPU core's register micro-kernel: the top, per-thread layer
    of a device whose lanes are SIMD lanes of vector registers."""
    return layer == 0 and not device.lanes_are_threads and device.layers[0].scope == "thread"


def simd_vectors(elements: int, itemsize: int, device: DeviceSpec) -> int:
    """Vector registers that `elements` consecutive values of `itemsize` bytes fill (a partly
    filled vector takes a whole register)."""
    return ceil(elements * itemsize / device.register_bytes)


def accumulators(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """Vector registers a CPU register tile's output occupies, its accumulators: one vector per
    output row along a spatial `lane_axis` (the contiguous axis, or a conv's filters); a vector
    of per-lane partial sums per output element along a reduce one; without a lane axis the
    code is scalar and every output element takes a register of its own."""
    shape = calculus(expr).data_tiles(tuple(tile))[-1]
    elements = prod(shape) if shape else 1
    axis = lane_axis(expr, device)
    if axis is None:
        return elements
    if expr.axes[axis].kind == "reduce":
        return elements * simd_vectors(tile[axis], expr.output.itemsize, device)
    dim = next(d for d in range(len(shape)) if _dim_axis(expr.output, d) == axis)
    return elements // shape[dim] * simd_vectors(shape[dim], expr.output.itemsize, device)


def partial_sums(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """Partial sums a CPU register tile keeps per output element: its extent along a reduce
    `lane_axis` (a vector of per-lane sums each, summed across lanes once per tile: gemv's 14 x 8
    tile keeps 14 vectors of 8), else 1. They are what an accumulator trip moves
    (`TileCalculus.accumulator_bytes`)."""
    axis = lane_axis(expr, device)
    return tile[axis] if axis is not None and expr.axes[axis].kind == "reduce" else 1


def micro_kernel_registers(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """Vector registers a CPU register micro-kernel of `tile` needs: its `accumulators`, one row
    of vectors along the `lane_axis` for every input the axis indexes (loaded once per
    reduction step, the tile's reduce extent is unrolled over the same registers), and one
    register into which the elements of the other inputs are broadcast (BLAS's AVX2 6 x 16 fp32
    kernel: 12 accumulators + 2 vectors of B + 1 broadcast of A = 15 of the 16 ymm; a row per
    batch where the tile spans batches, `_live_rows`).

    A convolution vectorised along its filters (`filter_axis`) keeps one register per data
    element that one reduction step of the tile broadcasts (`_step_elements`): LLVM loads each
    once and keeps it live across the window's unrolled steps (`x*stride + s` meets the same
    element again), so a tile that leaves fewer registers spills them. Measured on
    conv-3x3-s2, AVX2, one run: 8 x 14 x 1 (filters x rows x columns, 14 accumulators + 1
    filter vector + 1 broadcast = 16) 3.5-5.3 ms, the code storing broadcasts to the stack;
    16 x 2 x 2 (8 + 2 + 4) 1.4-2.7 ms."""
    v = lane_axis(expr, device)
    filters = _filter_lanes(expr, v)
    rows, broadcast = 0, 0
    for tensor in expr.inputs:
        if v is not None and tensor.uses_axis(v):
            rows += simd_vectors(tile[v], tensor.itemsize, device) * _live_rows(expr, tensor, tile, v)
        elif filters:
            broadcast = max(broadcast, _step_elements(expr, tensor, tile))
        else:
            broadcast = max(broadcast, 1)
    return accumulators(expr, device, tile) + rows + broadcast


def _live_rows(expr: TensorExpr, tensor, tile: Tile, lane: int) -> int:
    """Rows of vectors of `tensor` (read along the `lane` axis) a register tile keeps live per
    reduction step: one per index of the other spatial axes that index it (a batched matmul's
    3 x 10 x 16 tile loads B's row of each of its 3 batches), where a spatial axis of the tile
    it ignores shares each row among several accumulators; 1 where it ignores none (a depthwise
    conv's data vector feeds one accumulator, straight from the load into the FMA)."""
    others = [a for a in expr.spatial if a != lane]
    if not any(tile[a] > 1 and not tensor.uses_axis(a) for a in others):
        return 1
    return prod(tile[a] for a in others if tensor.uses_axis(a))


def _step_elements(expr: TensorExpr, tensor, tile: Tile) -> int:
    """Elements of `tensor` one reduction step of a register tile reads: per dimension, the
    product of the tile's sizes along the spatial axes indexing it (a stride spreads them, it
    does not add any)."""
    return prod(
        prod(tile[a] for a, c in enumerate(coeffs) if c and expr.axes[a].kind != "reduce") for coeffs, _ in tensor.index
    )


def register_budget(device: DeviceSpec) -> int:
    """Vector registers a CPU micro-kernel may use: `registers_per_thread_cap`, and no more
    than the register layer holds (`rprogram.layer_capacity` in registers)."""
    return min(device.registers_per_thread_cap, device.layers[0].capacity_bytes // device.register_bytes)


def required_accumulators(ctx: AlignContext) -> int:
    """Vector accumulators a register tile at `ctx` must hold (0: no such requirement).

    Only a CPU micro-kernel of an operator with a reduce axis and a `lane_axis` has one: its
    FMAs into one accumulator form a dependency chain across the reduction, so the core's
    `fma_pipes` stay busy only with `DeviceSpec.fma_accumulators` (latency x pipes) chains in
    flight. Elementwise operators carry no chain (out-of-order execution overlaps their
    independent vectors), and scalar code (no lane axis) is bound by its lanes.

    Our fallback where that many cannot exist (tiny extents, an operator with few output rows,
    a small register budget, eps too small to pad): the most accumulators any register tile
    that meets the per-axis rules at this eps can hold within the register budget
    (`_accumulator_fill`), so construction still finds programs, with as many accumulators as
    they can have."""
    device, expr = ctx.device, ctx.expr
    if not is_micro_kernel_layer(device, ctx.layer) or not device.fma_accumulators:
        return 0
    if not expr.reduce or lane_axis(expr, device) is None:
        return 0
    filled = _accumulator_fill(expr, device, ctx.eps)
    if filled is None or not _within_budget(expr, device, filled, register_budget(device)):
        return 0  # no tile fits the registers at this eps: the capacity check refuses them all
    return min(device.fma_accumulators, accumulators(expr, device, filled))


@lru_cache(maxsize=256)
def _accumulator_fill(expr: TensorExpr, device: DeviceSpec, eps: float) -> Tile | None:
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
    (`_tiles_within_budget`)."""
    ctx = AlignContext(expr, device, 0, tuple(1 for _ in expr.axes), eps)
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


def _tiles_within_budget(ctx: AlignContext, start: Tile, budget: int) -> list[Tile]:
    """Every register tile that grows `start` along `_accumulator_axes` to sizes the per-axis
    rules accept and fits `budget` (`_within_budget`). Neither registers nor lines a set fall as
    an axis grows, so each axis is scanned only while the tile fits: a few hundred tiles at most."""
    expr, device = ctx.expr, ctx.device
    found: list[Tile] = []

    def visit(tile: Tile, axes: tuple[int, ...]) -> None:
        if not _within_budget(expr, device, tile, budget):
            return
        if not axes:
            found.append(tile)
            return
        a, rest = axes[0], axes[1:]
        while tile is not None and _within_budget(expr, device, tile, budget):
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
    less a spatial axis that indexes every input (a batch) where another remains, since each
    accumulator it adds brings loads of its own, as many as its FMAs (bmm-attn's fill went to 12
    batches x 16 columns: 24 loads per 12 FMAs)."""
    lane = lane_axis(expr, device)
    grown = tuple(a for a in expr.spatial if a == lane or not all(t.uses_axis(a) for t in expr.inputs))
    grown = grown or tuple(expr.spatial)
    return grown + ((lane,) if lane is not None and lane not in expr.spatial else ())


def resident_block_limit(device: DeviceSpec) -> int | None:
    """Thread blocks one unit holds at most at once (the spec's `max_blocks_per_unit`: 32 on
    NVIDIA compute capability 7.0, 8.0 and 9.0, 24 on 8.9, 16 on 3.7 and 8.7; CUDA C++
    Programming Guide, technical specifications per compute capability), or None where the spec
    gives no such limit (the MI50's: AMD states resident wavefronts, not workgroups)."""
    return device.max_blocks_per_unit if device.launches_thread_blocks and device.max_blocks_per_unit else None


def thread_count(expr: TensorExpr, tile: Tile, upper: Tile, lanes: int = 1, across: int | None = None) -> int:
    """Threads of a GPU block: unit tile over register tile, spatial axes only, times the
    threads that share one register tile (a warp for tensor-core fragments), times the threads a
    cross-thread reduction spreads along its reduce axis `across` (`cross_thread_axis`)."""
    spread = ceil(tile[across] / upper[across]) if across is not None else 1
    return prod(ceil(tile[a] / upper[a]) for a in expr.spatial) * lanes * spread


def block_thread_count(expr: TensorExpr, device: DeviceSpec, tile: Tile, upper: Tile) -> int:
    """`thread_count` of a GPU block tile over the register tile `upper` on `device`."""
    return thread_count(expr, tile, upper, tile_lanes(expr, device), cross_thread_axis(expr, device))


def is_aligned(ctx: AlignContext, tile: Tile, rules=RULES) -> bool:
    return all(r.axis_ok(ctx, a, s) for r in rules for a, s in enumerate(tile)) and all(
        r.tile_ok(ctx, tile) for r in rules
    )


def _scan(ctx: AlignContext, tile: Tile, axis: int, direction: int, rules, whole_tile=True) -> int | None:
    base = ctx.upper[axis]
    extent = ctx.expr.axes[axis].extent
    multiple = tile[axis] // base
    limit = ceil(extent / base)  # one tile covering the whole axis
    for _ in range(MAX_SCAN):
        multiple += direction
        if multiple < 1 or multiple > limit:
            return None
        size = multiple * base
        if not all(r.axis_ok(ctx, axis, size) for r in rules):
            continue
        grown = tile[:axis] + (size,) + tile[axis + 1 :]
        if not whole_tile or all(r.tile_ok(ctx, grown) for r in rules):
            return size
    return None


def next_aligned_sizes(ctx: AlignContext, tile: Tile, rules=RULES, starts=None) -> tuple[int | None, ...]:
    """Per axis, the next larger aligned size (None when the axis cannot grow), scanning up from
    `starts[a]` where given instead of `tile[a]`; the rest of the tile is `tile` either way, so
    the whole-tile rules judge the tile that growing one axis makes."""
    return tuple(
        _scan(ctx, tile if starts is None else tile[:a] + (starts[a],) + tile[a + 1 :], a, +1, rules)
        for a in range(len(tile))
    )


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
    if required_accumulators(ctx) and rules is RULES:
        result = _accumulator_fill(ctx.expr, ctx.device, ctx.eps)
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
        if a not in filled and not all(r.axis_ok(ctx, a, tile[a]) for r in rules):
            size = _scan(ctx, tuple(tile), a, +1, rules, whole_tile=False)
            if size is None and ctx.device.lanes_are_threads:  # the whole axis, if the rules take it
                whole = ceil(ctx.expr.axes[a].extent / ctx.upper[a]) * ctx.upper[a]
                size = whole if all(r.axis_ok(ctx, a, whole) for r in rules) else None
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

    def ok(i: int, m: int) -> bool:
        if (i, m) not in accepted:
            a = spatial[i]
            accepted[i, m] = m <= rooms[i] and all(r.axis_ok(ctx, a, m * upper[a]) for r in rules)
        return accepted[i, m]

    def waste(ms) -> float:
        return prod(ceil(ctx.expr.axes[a].extent / (m * upper[a])) * m * upper[a] / ctx.expr.axes[a].extent for a, m in zip(spatial, ms))

    calc = calculus(ctx.expr)

    def traffic(ms) -> int:
        tile = list(upper)
        for a, m in zip(spatial, ms):
            tile[a] = m * upper[a]
        return calc.traffic_bytes(tuple(tile))

    def key(ms) -> tuple:
        return (prod(ms), waste(ms), traffic(ms), tuple(-m for m in reversed(ms)))

    most = max(need, ctx.device.max_threads_per_block // lanes)
    cover = tuple(rooms) if prod(rooms) <= most and all(ok(i, m) for i, m in enumerate(rooms)) else None
    for threads in range(need, most + 1, need):
        found = [ms for ms in _factorizations(threads, len(spatial)) if all(ok(i, m) for i, m in enumerate(ms))]
        if cover is not None and prod(cover) <= threads:
            found.append(cover)
        if found:
            return tuple(m * upper[a] for a, m in zip(spatial, min(found, key=key)))
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
        return all(r.axis_ok(ctx, axis, threads * upper) for r in rules)

    if room <= want:
        return room * upper if ok(room) else None
    for threads in [*range(want, min(most, room) + 1, warp), *range(want - warp, 0, -warp)]:
        if ok(threads):
            return threads * upper
    return room * upper if room <= most and ok(room) else None


@lru_cache(maxsize=1024)
def _factorizations(n: int, parts: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered way of writing n as a product of `parts` positive integers."""
    if parts <= 1:
        return ((n,),) if parts == 1 else (((),) if n == 1 else ())
    return tuple((d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in _factorizations(n // d, parts - 1))
