"""What a register tile and a block hold: the vector registers of a CPU register micro-kernel
(its accumulators, the rows it loads, the broadcasts; `micro_kernel_registers` is the register
layer's footprint, `rprogram.layer_footprint`) and the threads of a GPU block. Pure: no TVM.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr, window_axes
from workbench.rtile.axes import cross_thread_axis, dim_axis, filter_lanes, lane_axis, tile_lanes
from workbench.rtile.traffic import calculus

Tile = tuple[int, ...]


def simd_vectors(elements: int, itemsize: int, device: DeviceSpec) -> int:
    """Vector registers that `elements` consecutive values of `itemsize` bytes fill (a partly
    filled vector takes a whole register)."""
    return ceil(elements * itemsize / device.register_bytes)


def row_vectors(elements: int, itemsize: int, device: DeviceSpec) -> int:
    """Vector registers a register tile's row of `elements` outputs along a spatial lane axis
    takes: `simd_vectors`, except that a row longer than one vector and not a whole number of
    them is split by LLVM into pieces of the largest power of two dividing it: a 36-wide fp32
    row on AVX2 is 9 xmm registers of 4, not 4 ymm and one xmm (the assembly of 2-row matmul
    register tiles 12, 20, 36 and 44 wide: xmm FMAs only; 16, 24, 40, 48 and 56: ymm only)."""
    lanes = max(1, device.register_bytes // itemsize)
    if elements <= lanes or elements % lanes == 0:
        return simd_vectors(elements, itemsize, device)
    return elements // min(elements & -elements, lanes)


def lane_vectors(expr: TensorExpr, device: DeviceSpec, axis: int, elements: int, itemsize: int) -> int:
    """Vector registers `elements` values along the lane axis `axis` take: `row_vectors` along a
    spatial axis, `simd_vectors` along a reduce one (a vector of per-lane partial sums)."""
    if expr.axes[axis].kind == "reduce":
        return simd_vectors(elements, itemsize, device)
    return row_vectors(elements, itemsize, device)


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
    dim = next(d for d in range(len(shape)) if dim_axis(expr.output, d) == axis)
    if tile[axis] > expr.axes[axis].extent:  # a row past the end in whole vectors (`alignment.padded_row_axis`)
        return elements // shape[dim] * simd_vectors(tile[axis], expr.output.itemsize, device)
    return elements // shape[dim] * row_vectors(shape[dim], expr.output.itemsize, device)


def partial_sums(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """Partial sums a CPU register tile keeps per output element: its extent along a reduce
    `lane_axis` (a vector of per-lane sums each, summed across lanes once per tile: gemv's 14 x 8
    tile keeps 14 vectors of 8), else 1. They are what an accumulator trip moves
    (`TileCalculus.accumulator_bytes`)."""
    axis = lane_axis(expr, device)
    return tile[axis] if axis is not None and expr.axes[axis].kind == "reduce" else 1


@lru_cache(maxsize=65536)  # asked by every capacity check of a register tile and the fill's scans
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
    element again), so a tile that leaves fewer registers spills them (evidence:
    docs/model-evidence.md#micro-kernel-registers).

    Where two inputs are read along the lane axis and each row of both feeds several
    accumulators (a matmul with B stored transposed, its lanes along K: r rows of A by c rows of
    B), the micro-kernel's outer loop streams one input's rows (`_streamed_rows`)."""
    v = lane_axis(expr, device)
    filters = filter_lanes(expr, v)
    rows, broadcast = [], 0
    for tensor in expr.inputs:
        if v is not None and tensor.uses_axis(v):
            vectors = lane_vectors(expr, device, v, tile[v], tensor.itemsize)
            rows.append((tensor, _live_rows(expr, tensor, tile, v), vectors))
        elif filters:
            broadcast = max(broadcast, _step_elements(expr, tensor, tile))
        else:
            broadcast = max(broadcast, 1)
    return accumulators(expr, device, tile) + _streamed_rows(expr, tile, v, rows) + broadcast


def _streamed_rows(expr: TensorExpr, tile: Tile, lane: int | None, rows: list) -> int:
    """Vector registers the inputs read along the lane axis take, given each one's (tensor,
    live rows, vectors a row): every row of each, except that where two inputs keep several
    rows, the one indexed by the outermost of the tile's spatial axes that only it reads (the
    register loops run in the axes' order: A's rows over i, B's over j) is streamed: LLVM keeps
    as many of its rows in flight as the other input keeps live, not all of them. B stored
    transposed, lanes along K, AVX-512 (docs/model-evidence.md#micro-kernel-registers): 11 rows
    of A by 2 of B take 22 accumulators + 2 + 2 rows = 26 registers, and LLVM's code spills none
    (1.45x the 11 x 1 tile's speed); 6 by 4 take 32, no spill; 3 by 8 (35) spills and ran 1.5x
    the 3 by 7 tile's time, 5 by 5 (35) 1.8x the 5 by 4 tile's."""
    held = [live * n for _, live, n in rows]
    if sum(1 for _, live, _ in rows if live > 1) < 2:
        return sum(held)
    own = [a for a in expr.spatial if a != lane and tile[a] > 1 and sum(t.uses_axis(a) for t, _, _ in rows) == 1]
    if not own:
        return sum(held)
    streamed = next(i for i, (t, _, _) in enumerate(rows) if t.uses_axis(own[0]))
    kept = max(live for i, (_, live, _) in enumerate(rows) if i != streamed)
    return sum(held) - held[streamed] + min(rows[streamed][1], kept) * rows[streamed][2]


def live_registers(expr: TensorExpr, device: DeviceSpec, tile: Tile) -> int:
    """Vector registers a CPU register micro-kernel keeps live as LLVM compiles it: its
    `micro_kernel_registers`, and, for a vectorised tile, the elements of a broadcast input LLVM
    hoists out of the loops over the tiles beyond the one broadcast register counted there
    (`_hoisted_elements`). Those it may load again instead of keeping them, so the budget the
    tiles are built to is `micro_kernel_registers`; the pressure past it is priced
    (`model.cpu_compute.spill_coverage`)."""
    v = lane_axis(expr, device)
    hoisted = [_hoisted_elements(expr, t, tile) for t in expr.inputs if v is not None and not t.uses_axis(v)]
    return micro_kernel_registers(expr, device, tile) + max(hoisted, default=1) - 1


def step_loads(expr: TensorExpr, device: DeviceSpec, tile) -> int:
    """Loads a CPU register tile issues per reduction step: for every input, one vector per
    `lane_vectors` of its `lane_axis` extent times the tile's sizes along the other spatial axes
    that index it (rows of that input), or, where the lane axis does not index it, one broadcast
    per element those axes select (matmul 6 x 16: 2 vectors of B + 6 broadcasts of A; bmm 3 x 4 x
    8: the batch axis indexes both inputs, 3 vectors of B + 12 broadcasts of A)."""
    v = lane_axis(expr, device)
    loads = 0
    for tensor in expr.inputs:
        rows = prod(tile[a] for a in expr.spatial if a != v and tensor.uses_axis(a))
        loads += rows * lane_vectors(expr, device, v, tile[v], tensor.itemsize) if tensor.uses_axis(v) else rows
    return loads


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


# The largest window whose weights LLVM broadcasts once and keeps (`_hoisted_elements`): it
# unrolls a 3 x 3 depthwise window whole and hoists its 9 broadcasts out of the loops over the
# register tiles, and walks a 5 x 5 or 7 x 7 window a row at a time, broadcasting a row's
# weights in the loop (x86 code for AVX2 and AVX-512, 2026-12-06: docs/model-evidence.md#hoisted-broadcasts).
HOISTED_WINDOW = 9


def _hoisted_elements(expr: TensorExpr, tensor, tile: Tile) -> int:
    """Registers a broadcast input takes in a vectorised register micro-kernel: 1 (each element
    broadcast as its reduction step comes), or one per element for an input read only along a window's
    reduce axes (`_window_axes`) of at most HOISTED_WINDOW elements and along no spatial axis
    the tile spans (a depthwise conv's 3 x 3 weights of one channel): the same for every
    register tile of the channel, they are broadcast once and kept live."""
    reduce = [a for a in range(len(expr.axes)) if tensor.uses_axis(a) and expr.axes[a].kind == "reduce"]
    window = prod(expr.axes[a].extent for a in reduce)
    if not reduce or not set(reduce) <= _window_axes(expr) or window > HOISTED_WINDOW:
        return 1
    if any(tensor.uses_axis(a) and tile[a] > 1 for a in expr.spatial):
        return 1
    return window


@lru_cache(maxsize=1024)  # asked for every price of a vectorised CPU tile
def _window_axes(expr: TensorExpr) -> frozenset[int]:
    """Reduce axes some input reads together with a spatial axis in one dimension (a conv's or
    pooling's window `h*stride + r`)."""
    return frozenset(a for tensor in expr.inputs for a in window_axes(expr, tensor))


def _step_elements(expr: TensorExpr, tensor, tile: Tile) -> int:
    """Elements of `tensor` one reduction step of a register tile reads: per dimension, the
    product of the tile's sizes along the spatial axes indexing it (a stride spreads them, it
    does not add any)."""
    return prod(
        prod(tile[a] for a, c in enumerate(coeffs) if c and expr.axes[a].kind != "reduce") for coeffs, _ in tensor.index
    )


def thread_count(expr: TensorExpr, tile: Tile, upper: Tile, lanes: int = 1, across: int | None = None) -> int:
    """Threads of a GPU block: unit tile over register tile, spatial axes only, times the
    threads that share one register tile (a warp for tensor-core fragments), times the threads a
    cross-thread reduction spreads along its reduce axis `across` (`cross_thread_axis`)."""
    spread = ceil(tile[across] / upper[across]) if across is not None else 1
    return prod(ceil(tile[a] / upper[a]) for a in expr.spatial) * lanes * spread


@lru_cache(maxsize=65536)  # asked by two rules on every block tile they judge, then by the capacity checks
def block_thread_count(expr: TensorExpr, device: DeviceSpec, tile: Tile, upper: Tile) -> int:
    """`thread_count` of a GPU block tile over the register tile `upper` on `device`."""
    return thread_count(expr, tile, upper, tile_lanes(expr, device), cross_thread_axis(expr, device))


def resident_block_limit(device: DeviceSpec) -> int | None:
    """Thread blocks one unit holds at most at once (the spec's `max_blocks_per_unit`: 32 on
    NVIDIA compute capability 7.0, 8.0 and 9.0, 24 on 8.9, 16 on 3.7 and 8.7; CUDA C++
    Programming Guide, technical specifications per compute capability), or None where the spec
    gives no such limit (the MI50's: AMD states resident wavefronts, not workgroups)."""
    return device.max_blocks_per_unit if device.launches_thread_blocks and device.max_blocks_per_unit else None
