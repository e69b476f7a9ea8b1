"""The tensor-core path of the CUDA template: a matmul-like rProgram as a WMMA TensorIR schedule.

A tensor-core rProgram's top tile is one warp's fragment tile (`rtile.axes.mma_axes`), its
shared tile one thread block, so every spatial axis splits into (grid, warps, warp tile) and the
reduce axis into (shared steps, fragment steps, fragment tile). Grid loops are fused, in grouped
order (`block_order.group_rows`), and bound to `blockIdx.x`, warp loops to `threadIdx.y`, a
warp's 32 lanes are `threadIdx.x`. At every shared step all warps copy the block's A and B tiles
into shared memory (vectorised, rows padded against bank conflicts: `rtile.wmma_shared`, whose
bytes the construction counts); at every fragment step a warp loads its A and B fragments
(`wmma.matrix_a` / `wmma.matrix_b`) and multiplies them into accumulator fragments
(`wmma.accumulator`) that live across the whole reduction; then it stores them to the output.
Where `rtile.staging.pipelined` says so the shared copies are double-buffered cp.async copies
a step ahead of the fragment steps (`cuda.pipeline_shared_copies`); a copy TVM cannot issue as
cp.async (a transposing or zero-filling one) stays a synchronous store inside the pipeline.
The 16x16x16 pieces are tensorized with TVM 0.27's registered WMMA intrinsics
(`tvm.s_tir.tensor_intrin.cuda`, float16 and int8 inputs only).

Layouts: A is read as `[.., i, k]` and B as `[.., k, j]` or `[.., j, k]` (B's column-major
fragment); a transposed A (`[.., k, i]`) is transposed by its shared-memory copy, since no WMMA
multiply in TVM 0.27 takes a column-major A. The accumulators are float16, as the catalog's
float16 matmul (its PrimFunc sums in float16; float32 accumulators would compute another
function). Extents that the block tile does not divide are padded (`pad_einsum`): the copies
read zeros past the edges, and a padded output goes through shared memory with a guarded copy.
`unsupported` names what this path does not take; the CUDA template then runs the program on
the CUDA cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import prod

from workbench.codegen.block_order import group_rows
from workbench.codegen.common import axis_loops, epilogue_names, new_schedule, producer_names
from workbench.codegen.cuda import pipeline_shared_copies
from workbench.codegen.template import ScheduleError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import mma_axes
from workbench.rtile.plan import gpu_plan
from workbench.rtile.rprogram import RProgram
from workbench.rtile.staging import pipelined
from workbench.rtile.wmma_shared import plain_dims, row_alignment

WARP, BLOCK = 0, 1  # layer indices of a tensor-core rProgram: (warp fragment tile, thread-block tile)
FRAGMENT = 16  # the m, n and k of TVM 0.27's float16 WMMA intrinsics
COPY_BYTES = 16  # widest CUDA access (uint4): one copy lane moves at most 16 bytes


@dataclass(frozen=True)
class MatmulLayout:
    """Where a matmul-like expression's operands sit: axis positions of (i, j, k) and the batch
    axes (the output's leading dims), `expr.tensors` positions of A (uses i) and B (uses j), and
    whether each is stored transposed (A as [.., k, i], B as [.., j, k])."""

    i: int
    j: int
    k: int
    batch: tuple[int, ...]
    a: int
    b: int
    a_trans: bool
    b_trans: bool


def matmul_layout(expr: TensorExpr, device: DeviceSpec) -> MatmulLayout | None:
    """The layout of an expression the WMMA path can take on `device`, else None: tensor cores
    apply, two inputs, one reduce axis, every tensor indexed by plain axes, and the inputs
    `[batch.., i, k]`-like with the output's batch dims."""
    mma = mma_axes(expr, device)
    if mma is None or len(expr.inputs) != 2 or len(expr.reduce) != 1:
        return None
    i, j, k = mma
    dims = [plain_dims(t) for t in expr.tensors]
    if None in dims or dims[-1][-2:] != (i, j):
        return None
    batch = dims[-1][:-2]
    found = {}
    for t, d in enumerate(dims[:-1]):
        if d[:-2] == batch and set(d[-2:]) == {i, k}:
            found["a"] = (t, d[-2:] == (k, i))
        elif d[:-2] == batch and set(d[-2:]) == {k, j}:
            found["b"] = (t, d[-2:] == (j, k))
    if len(found) != 2:
        return None
    (a, a_trans), (b, b_trans) = found["a"], found["b"]
    return MatmulLayout(i, j, k, batch, a, b, a_trans, b_trans)


def unsupported(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> str | None:
    """Why the WMMA path cannot realise `program` (one line), or None when it can."""
    if mma_axes(expr, device) is None:  # the rule's own refusal, asked of any spec (no plan yet)
        return "tensor cores do not apply to this expression on this device"
    if device.target_dict().get("kind") != "cuda":
        return "WMMA is a CUDA interface; the device's target is not cuda"
    dtypes = sorted({t.dtype for t in expr.tensors} - {"float16"})
    if dtypes:
        return f"the WMMA path takes float16 tensors only, not {dtypes[0]}"
    layout = matmul_layout(expr, device)
    if layout is None:
        return "not a (batched) matmul over plain axes"
    if any(axis.fused_from for axis in expr.axes):
        return "axis fusion merged axes: fragments need the buffers' own dims"
    if not program.cached[BLOCK]:
        return "the program does not stage its inputs in shared memory, where WMMA loads read"
    warp = program.tiles[WARP]
    if any(warp[a] % FRAGMENT for a in (layout.i, layout.j, layout.k)):
        return f"warp tile {list(warp)} is not a multiple of the {FRAGMENT}x{FRAGMENT}x{FRAGMENT} fragment"
    return _body_problem(expr, layout)


def _body_problem(expr: TensorExpr, layout: MatmulLayout) -> str | None:
    """None when the main block computes `C = C + A * B`, the statement the WMMA multiply's
    description matches; else why not."""
    from tvm import tirx

    sch = new_schedule(expr)
    if producer_names(sch, expr):
        return "blocks before the contraction (the copies read the inputs themselves)"
    store = sch.get(sch.get_sblock(expr.main_block)).body
    value = getattr(store, "value", None)
    if not isinstance(value, tirx.Add) or not isinstance(value.b, tirx.Mul):
        return "the contraction is not a sum of products"
    names = tuple(_loaded(x) for x in (value.a, value.b.a, value.b.b))
    wanted = (str(store.buffer.name), expr.tensors[layout.a].name, expr.tensors[layout.b].name)
    return None if names == wanted else "the contraction is not C = C + A * B with A the i-operand"


def _loaded(node) -> str | None:
    """The buffer a load reads, None for any other expression."""
    from tvm.ir.expr import TensorLoad  # what `tirx.BufferLoad(...)` builds in TVM 0.27

    return str(node.source.name) if isinstance(node, TensorLoad) else None


def warp_count(expr: TensorExpr, program: RProgram) -> int:
    """Warps of one block: prod over spatial axes of block tile / warp tile."""
    return prod(program.tiles[BLOCK][a] // program.tiles[WARP][a] for a in expr.spatial)


@dataclass(frozen=True)
class _Nest:
    """The tiled contraction: its loops by role, and its two blocks."""

    warp: object  # threadIdx.y
    steps: object  # shared-memory steps along k: the shared copies go here
    fragment_steps: object  # fragment steps along k: the fragment loads go here
    outer: object  # the block around one 16x16x16 multiply (caches are made through it)
    inner: object  # one 16x16x16 multiply (tensorized)


def schedule_wmma(expr: TensorExpr, program: RProgram, device: DeviceSpec):
    """A `tvm.s_tir.Schedule` realising `program` with WMMA intrinsics; ScheduleError when it
    cannot (`unsupported` names why beforehand)."""
    reason = unsupported(expr, program, device)
    if reason is not None:
        raise ScheduleError(reason)
    layout = matmul_layout(expr, device)
    sch = new_schedule(expr)
    main = sch.get_sblock(expr.main_block)
    _pad(sch, main, expr, program)
    # after padding: zero-filled copies of the inputs before, the output's unpadding copy after
    zero_fills, consumers = producer_names(sch, expr), epilogue_names(sch, expr)
    staged = bool(consumers)
    intrins = _wmma_intrinsics()(
        load_scope="shared",
        store_scope="shared" if staged else "global",
        in_dtype="float16",
        out_dtype="float16",
        trans_b=layout.b_trans,
    )
    operands = _operand_buffers(sch, main)
    nest = _tile(sch, main, expr, program, layout, device)
    threads = (warp_count(expr, program), device.warp_size)
    for buffer, trans, load in zip(operands, (layout.a_trans, False), ("load_a", "load_b")):
        shared = _stage_in_shared(sch, nest, buffer, trans, threads)
        _load_fragments(sch, nest, shared, "wmma.matrix_" + load[-1], intrins[load])
    for name in reversed(zero_fills):  # pad_einsum's zero-filled copies fold into the shared copies
        sch.compute_inline(sch.get_sblock(name))
    _write_back(sch, nest, staged, consumers, device.warp_size, intrins["store"])
    if gpu_plan(program, device).pipelined:  # the steps' body: the two shared copies, then the fragment steps
        pipeline_shared_copies(sch, nest.steps, len(operands))
    init = sch.decompose_reduction(nest.outer, nest.steps)
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], intrins["init"])
    sch.tensorize(sch.get_loops(nest.inner)[-3], intrins["compute"])
    return sch


@cache
def _wmma_intrinsics():
    """TVM's `get_wmma_intrin_group`; the import registers TVM's tensor intrinsics, once.

    TVMScript parses each of those ~250 functions after an `inspect.stack()`, which looks up the
    module of every frame whose file does not exist (the import machinery's frozen frames) by
    scanning all of `sys.modules`: 25 s with TVM's ~1,900 modules loaded. The parser reads only
    each frame object and its function name, so during the import `inspect.stack` returns the
    frames without source context (4 s). Another thread calling `inspect.stack` meanwhile would
    get no source lines either."""
    import inspect
    import sys

    def frames(context: int = 1) -> list:
        frame, out = sys._getframe(1), []
        while frame is not None:
            code = frame.f_code
            out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return out

    stack, inspect.stack = inspect.stack, frames
    try:
        from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group
    finally:
        inspect.stack = stack
    return get_wmma_intrin_group


def _pad(sch, main, expr: TensorExpr, program: RProgram) -> None:
    """Pad every extent to a multiple of its block tile (`pad_einsum`) where the tile does not
    divide it: tensors that grow are copied, zero-filled, into padded buffers."""
    tile = program.tiles[BLOCK]
    if all(axis.extent % t == 0 for axis, t in zip(expr.axes, tile)):
        return
    by_name = {axis.name: int(t) for axis, t in zip(expr.axes, tile)}
    iters = [str(iv.var.name).removeprefix("v_") for iv in sch.get(main).iter_vars]
    sch.pad_einsum(main, [by_name[name] for name in iters])


def _operand_buffers(sch, main) -> tuple[str, str]:
    """Names of the buffers the main block multiplies, A first (checked by `_body_problem`)."""
    product = sch.get(main).body.value.b
    return _loaded(product.a), _loaded(product.b)


def _tile(sch, main, expr: TensorExpr, program: RProgram, layout: MatmulLayout, device: DeviceSpec) -> _Nest:
    """Split spatial axes into (grid, warps, warp tile) and k into (shared steps, fragment
    steps, warp tile); cut i, j and k's warp tiles into 16-wide fragments; blockize the 16x16x16
    multiply; bind the grid to blockIdx.x and the warps to threadIdx.y. The grid runs its blocks
    in grouped order (`block_order.group_rows`, as the CUDA-core template: i's grid loop split by
    the group and reordered around j's before fusion)."""
    loops = axis_loops(sch, main, expr)
    warp, block = program.tiles[WARP], program.tiles[BLOCK]
    groups = group_rows(expr, program, device)
    grid, warps, batch = [], [], []
    for a in expr.spatial:
        outer, across, inside = _split3(sch, loops[a], block[a] // warp[a], warp[a])
        if groups and a == groups.rows:
            i_outer, i_inner = sch.split(outer, [None, groups.group])
        elif not groups or a != groups.cols:
            grid.append(outer)
        else:
            j_outer = outer
        warps.append(across)
        if a not in (layout.i, layout.j):
            batch.append(inside)
        else:
            loops[a] = inside
    if groups:  # (batch.., i_outer, j, i_inner): G block rows at a time, column by column
        grid += [i_outer, j_outer, i_inner]
    k = layout.k
    steps, fragment_steps, loops[k] = _split3(sch, loops[k], block[k] // warp[k], warp[k])
    pieces = {a: sch.split(loops[a], [None, FRAGMENT]) for a in (layout.i, layout.j, k)}
    (i, i16), (j, j16), (kf, k16) = pieces[layout.i], pieces[layout.j], pieces[k]
    sch.reorder(*grid, *warps, steps, fragment_steps, kf, *batch, i, j, i16, j16, k16)
    outer = sch.blockize(i16)
    sch.bind(sch.fuse(*grid), "blockIdx.x")
    warp_loop = sch.fuse(*warps)
    sch.bind(warp_loop, "threadIdx.y")
    return _Nest(warp_loop, steps, fragment_steps, outer, main)


def _split3(sch, loop, middle: int, inner: int) -> list:
    """(block tiles, warp tiles per block tile, warp tile), unit loops kept."""
    return list(sch.split(loop, [None, middle, inner], preserve_unit_iters=True))


def _stage_in_shared(sch, nest: _Nest, buffer: str, trans: bool, threads: tuple[int, int]) -> str:
    """Copy one operand's block tile into shared memory at every shared step, all warps
    together; a transposed A is stored as [.., i, k]. Returns the shared buffer's name."""
    cache = sch.cache_read(nest.outer, buffer, "shared")
    sch.compute_at(cache, nest.steps)
    written = sch.get(cache).writes[0].source
    rank, itemsize = len(written.shape), written.dtype.bits // 8
    if trans:
        sch.transform_layout(cache, ("write", 0), lambda *d: (*d[:-2], d[-1], d[-2]))
    sch.storage_align(cache, 0, rank - 2, *row_alignment(itemsize))
    copy = _loops_below(sch, cache, nest.steps)
    row = int(sch.get(copy[-1]).extent)
    source = sch.get(cache).reads[0].source
    # the transposing copy's shared stores are strided: one element per lane
    width = 1 if trans else _vector_width(itemsize, int(source.shape[-1]), row)
    _spread(sch, sch.fuse(*copy), threads, width)
    return str(written.name)


def _load_fragments(sch, nest: _Nest, shared: str, scope: str, intrin: str) -> None:
    """Load a warp's fragments of one operand from shared memory at every fragment step."""
    fragment = sch.cache_read(nest.outer, shared, scope)
    sch.compute_at(fragment, nest.fragment_steps)
    _tensorize_tiles(sch, fragment, intrin)


def _write_back(sch, nest: _Nest, staged: bool, consumers, lanes: int, intrin: str) -> None:
    """Accumulate in fragments for the whole reduction and store them once per warp: straight to
    the output, or (padded output, epilogues) to shared memory and from there, guarded and with
    the epilogues folded in, by the warp's lanes."""
    shared = sch.cache_write(nest.outer, 0, "shared") if staged else None
    accumulator = sch.cache_write(nest.outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(accumulator, nest.warp)
    if shared is None:
        _tensorize_tiles(sch, accumulator, intrin)
        return
    sch.reverse_compute_at(shared, nest.warp)  # before tensorizing: TVM cannot move it after
    stored = sch.get(accumulator).writes[0].source
    tiles = _tensorize_tiles(sch, accumulator, intrin)
    # aligned on the tensorized block, the one that writes the buffer when TVM lowers it
    sch.storage_align(tiles, 0, len(stored.shape) - 2, *row_alignment(stored.dtype.bits // 8))
    name = sch.get(shared).name_hint
    for consumer in consumers:  # pad_einsum's unpadding copy, then the expression's epilogues
        sch.reverse_compute_inline(sch.get_sblock(consumer))
    shared = sch.get_sblock(name)  # inlining replaced the block
    target = sch.get(shared).writes[0].source
    copy = _loops_below(sch, shared, nest.warp)
    width = _vector_width(target.dtype.bits // 8, int(target.shape[-1]), int(sch.get(copy[-1]).extent))
    _spread(sch, sch.fuse(*copy), (1, lanes), width)


def _tensorize_tiles(sch, block, intrin: str):
    """Cut a fragment copy's last two loops into 16x16 tiles and tensorize each tile; returns
    the (tensorized) block of one tile."""
    rows, cols = sch.get_loops(block)[-2:]
    row, row16 = sch.split(rows, [None, FRAGMENT])
    col, col16 = sch.split(cols, [None, FRAGMENT])
    sch.reorder(row, col, row16, col16)
    tile = sch.blockize(row16)
    sch.tensorize(tile, intrin)
    return tile


def _spread(sch, fused, threads: tuple[int, int], width: int) -> None:
    """Split a fused copy loop over (threadIdx.y, threadIdx.x) and `width`-wide vectors."""
    warps, lanes = threads
    _, y, x, vector = sch.split(fused, [None, warps, lanes, width])
    if warps > 1:
        sch.bind(y, "threadIdx.y")
    sch.bind(x, "threadIdx.x")
    if width > 1:
        sch.vectorize(vector)


def _vector_width(itemsize: int, global_row: int, copy_row: int) -> int:
    """Widest copy vector (<= 16 bytes) dividing the global row and the copied row. Block tiles
    start at multiples of 16 elements and shared rows are 16-byte multiples, so those align."""
    width = COPY_BYTES // itemsize
    while width > 1 and (global_row % width or copy_row % width):
        width //= 2
    return width


def _loops_below(sch, block, loop) -> list:
    """The loops around `block` inside `loop`."""
    loops = sch.get_loops(block)
    target = sch.get_sref(loop)
    depth = next(d for d, candidate in enumerate(loops, start=1) if sch.get_sref(candidate).same_as(target))
    return loops[depth:]
