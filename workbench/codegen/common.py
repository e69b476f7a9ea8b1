"""Schedule helpers shared by the templates (target independent).

All of them work on a `tvm.s_tir.Schedule` over `expr.func` (the unfused PrimFunc of a possibly
axis-fused `TensorExpr`) and raise `ScheduleError` with a one-line reason when a program cannot
be realised. Loops are `LoopRV`s, blocks `SBlockRV`s, listed outermost first.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

from workbench.codegen.template import ScheduleError
from workbench.errors import first_line
from workbench.ops.tensor_expr import TensorExpr, is_reduction
from workbench.rtile.rprogram import RProgram


def new_schedule(expr: TensorExpr, int32: bool = False):
    """A traced schedule over `expr.func` (module function name `main`); with `int32`, its
    indices narrowed to 32 bits first (`ForceNarrowIndexToInt32`): lowering narrows them anyway
    (`NarrowDataType`), but renames the loop variables and leaves a loop's
    `pragma_loop_partition_hint` on the old one, so a 64-bit loop is never partitioned."""
    import tvm
    from tvm import s_tir

    if expr.func is None:
        raise ScheduleError(f"{expr.op}: the expression carries no PrimFunc")
    mod = tvm.IRModule({"main": expr.func})
    if int32:
        # on a copy: the schedule rewrites the pass's output in place, statements it shares
        # with `expr.func` included
        mod = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.ir.load_json(tvm.ir.save_json(mod)))
    return s_tir.Schedule(mod)


def check_program(expr: TensorExpr, program: RProgram) -> None:
    """Raise ScheduleError unless `program` is a well-formed tile chain for `expr`.

    Checks: same axis names; every tile positive; every layer's tile a multiple of the tile of
    the layer above it (top first) along every axis.
    """
    names = tuple(a.name for a in expr.axes)
    if tuple(program.axes) != names:
        raise ScheduleError(f"program axes {list(program.axes)} do not match the expression's {list(names)}")
    for layer, tile in enumerate(program.tiles):
        if len(tile) != len(names) or any(int(t) < 1 for t in tile):
            raise ScheduleError(f"layer {program.layers[layer]}: tile {list(tile)} is not one positive size per axis")
    for layer in range(1, len(program.tiles)):
        for name, small, big in zip(names, program.tiles[layer - 1], program.tiles[layer]):
            if big % small:
                raise ScheduleError(
                    f"axis {name}: the {program.layers[layer]} tile {big} is not a multiple of "
                    f"the {program.layers[layer - 1]} tile {small}"
                )


def axis_chain(program: RProgram, axis: int) -> tuple[int, ...]:
    """Tile sizes of one axis over the layers, top (registers) first."""
    return tuple(int(tile[axis]) for tile in program.tiles)


def block_names(sch) -> tuple[str, ...]:
    """Names of the root's child blocks in program order."""
    return tuple(sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root")))


def producer_names(sch, expr: TensorExpr) -> tuple[str, ...]:
    """Blocks before the main block (e.g. conv's `pad`): candidates for `compute_inline`."""
    names = block_names(sch)
    return names[: names.index(expr.main_block)]


def epilogue_names(sch, expr: TensorExpr) -> tuple[str, ...]:
    """Blocks after the main block (e.g. avgpool's division), in program order."""
    names = block_names(sch)
    return names[names.index(expr.main_block) + 1 :]


def inline_producers(sch, expr: TensorExpr) -> None:
    """`compute_inline` every block before the main block, last first (so chains collapse)."""
    for name in reversed(producer_names(sch, expr)):
        primitive(f"inline producer {name}", sch.compute_inline, sch.get_sblock(name))


def inline_epilogues(sch, names: Sequence[str]) -> None:
    """`reverse_compute_inline` the blocks `names` (from `epilogue_names`, taken BEFORE any
    `cache_write`) into their producer, in order. Call it after `cache_write` of the main block:
    the producer is then the write-back block, a plain copy that can absorb the epilogue."""
    for name in names:
        primitive(f"inline epilogue {name}", sch.reverse_compute_inline, sch.get_sblock(name))


def row_passes(sch, main: str, names: Sequence[str]) -> bool:
    """Whether the blocks `names` after the main block `main` are passes over its rows of their
    own rather than an epilogue one write-back can absorb: one holds a reduction (softmax's
    sum, layer norm's variance) or iterates over more elements than `main` writes (RMS norm's
    `x / rms`, which reads the reduced row back). `reverse_compute_inline` cannot fold them
    (it fails on softmax's exp: "Cannot dispatch a null expression")."""
    outputs = _static_prod(sch.get(sch.get_sblock(main)).writes[0].source.shape)
    for name in names:
        block = sch.get(sch.get_sblock(name))
        if is_reduction(block):
            return True
        extents = _static_prod(iv.dom.extent for iv in block.iter_vars)
        if outputs is not None and extents is not None and extents > outputs:
            return True
    return False


def _static_prod(extents) -> int | None:
    """The product of `extents`, None where one is symbolic (a dynamic shape's Var or product:
    a bundle's kernel, whose epilogue blocks are then compared by their reductions alone)."""
    out = 1
    for e in extents:
        if not hasattr(e, "value") and not isinstance(e, int):
            return None
        out *= int(e)
    return out


def axis_loops(sch, block, expr: TensorExpr, flat_buffers: bool = False) -> list:
    """One loop per axis of `expr` (in `expr.axes` order).

    `block` must still have its original loop nest (one loop per block iterator, as
    `te.create_prim_func` makes it); axis names are the iterator names without `v_`. When axis
    fusion merged axes, the block is first rewritten to iterate over the fused axes
    (`transform_block_layout`: one iterator `i * J + j` instead of `i, j`), not merely given a
    fused loop: TVM relaxes the region a loop touches per block iterator, so with separate
    iterators a tile of a fused axis (elements 160..319 of `M[i, j]`, j = 35) would count as the
    box of whole rows 4..9, and a write-back attached under that tile would overwrite the
    neighbouring tiles' outputs. Over one fused iterator the region is the exact interval.
    """
    loops = sch.get_loops(block)
    iter_vars = sch.get(block).iter_vars
    if len(loops) != len(iter_vars):
        raise ScheduleError(f"block {sch.get(block).name_hint}: loop nest does not match its iterators")
    names = [str(iv.var.name).removeprefix("v_") for iv in iter_vars]
    parts = [axis.fused_from or (axis.name,) for axis in expr.axes]
    missing = [p for group in parts for p in group if p not in names]
    if missing:
        raise ScheduleError(f"axis {missing[0]}: no loop of that name in block {expr.main_block}")
    if all(len(group) == 1 for group in parts):
        by_name = dict(zip(names, loops))
        return [by_name[group[0]] for group in parts]
    extents = {name: int(iv.dom.extent) for name, iv in zip(names, iter_vars)}

    def fused(*index):
        value = dict(zip(names, index))
        out = []
        for group in parts:
            flat = value[group[0]]
            for name in group[1:]:
                flat = flat * extents[name] + value[name]
            out.append(flat)
        return tuple(out)

    primitive("iterate over the fused axes", sch.transform_block_layout, block, _index_map(sch, block, fused, len(names)))
    if flat_buffers:
        _flatten_fused_buffers(sch, block, expr)
    return list(sch.get_loops(block))


def _flatten_fused_buffers(sch, block, expr: TensorExpr) -> None:
    """Lay every buffer `block` reads or writes out along the fused axes (`axis_loops` with
    `flat_buffers`: one dimension per fused group, `build.with_call_shapes` hands the kernel the
    caller's shapes back over the same memory), so that the block indexes it by the fused
    iterator itself. Left as it is, the buffer is indexed by that iterator's divisions and
    remainders by the inner dimensions, and once a tile loop's term is substituted in, TVM's
    simplifier may no longer fold them back into one contiguous index: the vectorised loop then
    moves its elements one at a time (evidence: docs/evidence.md#fused-flat-buffers). A buffer
    it reads that another block writes (a padding copy) has that block iterate over the fused
    index too (`_fuse_producers`)."""
    for kind in ("read", "write"):
        for k, region in enumerate(list(getattr(sch.get(block), kind + "s"))):
            shape = tuple(region.source.shape)
            groups = _buffer_groups(expr, region.source)
            if groups is None:
                continue
            primitive("lay out a buffer along the fused axes", sch.transform_layout, block, (kind, k),
                      _index_map(sch, block, lambda *index: _merged(groups, shape, index), len(shape)))
            if kind == "read":
                _fuse_producers(sch, block, region.source.name, groups, expr)


def _buffer_groups(expr: TensorExpr, buffer) -> tuple[int, ...] | None:
    """How `buffer` merges along the fused axes (`_groups` of its tensor in `expr`: the one of its
    name, or the input whose padded shape it is, a padding copy's), None where it merges none
    or has a symbolic dimension (`with_call_shapes` gives only static buffers back)."""
    shape = tuple(buffer.shape)
    if _static_prod(shape) is None:
        return None
    named = [t for t in expr.tensors if t.name == str(buffer.name)]
    for tensor in named or [t for t in expr.inputs if _merged_shape(_groups(expr, t), shape) == tuple(t.shape)]:
        groups = _groups(expr, tensor)
        if len(groups) < len(shape) and sum(groups) == len(shape):
            return groups
    return None


def _fuse_producers(sch, block, name, groups: Sequence[int], expr: TensorExpr) -> None:
    """Let the block that writes buffer `name` (a padding copy, `codegen.cpu._stage_producers`)
    iterate over the fused index too, and lay out what it reads alike: computed under a tile of
    the fused axis, it then copies exactly that tile's elements, where over separate iterators
    TVM relaxes the tile to the box of whole rows around it (a batched max pooling's tiles of 36
    of 4 x 90 channels copied 90-180 channels each). Left as it is where TVM cannot re-lay it out."""
    for producer in sch.get_producers(block):
        stmt = sch.get(producer)
        if [str(w.source.name) for w in stmt.writes] != [str(name)] or len(stmt.iter_vars) != sum(groups):
            continue
        try:
            shape = [int(iv.dom.extent) for iv in stmt.iter_vars]
            sch.transform_block_layout(producer, _index_map(sch, producer, lambda *i: _merged(groups, shape, i), len(shape)))
        except Exception:  # a producer TVM cannot re-lay out: correct as it is, copying the box
            continue
        _flatten_fused_buffers(sch, producer, expr)


def _merged(groups: Sequence[int], shape: Sequence, index: Sequence) -> tuple:
    """`index` into a buffer of `shape` with each run of `groups` dimensions merged into one
    row-major index (dimensions past the groups, rfactor's vector lanes, kept as they are)."""
    out, d = [], 0
    for n in groups:
        flat = index[d]
        for m in range(d + 1, d + n):
            flat = flat * shape[m] + index[m]
        out.append(flat)
        d += n
    return tuple(out) + tuple(index[d:])


def _merged_shape(groups: Sequence[int], shape: Sequence) -> tuple[int, ...]:
    """`shape` with each run of `groups` dimensions merged into one (`_merged`)."""
    out, d = [], 0
    for n in groups:
        out.append(prod(int(e) for e in shape[d:d + n]))
        d += n
    return tuple(out) + tuple(int(e) for e in shape[d:])


def flatten_fused_output(sch, block, writeback, expr: TensorExpr, trailing: int = 0) -> None:
    """Lay the accumulator that `block` writes (a `cache_write` buffer, read by `writeback`) out
    along the fused axes, and let `writeback` iterate over the same fused index.

    Call it after `cache_write` and before `reverse_compute_at(writeback, ...)`, on a block
    whose iterators `axis_loops` fused: for the reason given there, a tile of a fused axis is a
    box only in the fused layout, so the write-back of one tile copies exactly that tile's
    outputs. `trailing` dimensions after the output's (rfactor's vector lanes) are kept as
    they are; `writeback` None when it already iterates over the fused index. A no-op when no
    output dimension is fused.
    """
    groups = _fused_groups(expr)
    if all(n == 1 for n in groups):
        return
    shape = tuple(int(s) for s in sch.get(block).writes[0].source.shape)
    if len(groups) + trailing == len(shape):  # laid out so already (`axis_loops`' `flat_buffers`)
        return
    if sum(groups) + trailing != len(shape):
        raise ScheduleError(f"output dims {list(shape)} do not match the fused output {list(expr.output.shape)}")

    index_map = _index_map(sch, block, lambda *index: _merged(groups, shape, index), len(shape))
    primitive("lay out the accumulator along the fused axes", sch.transform_layout, block, ("write", 0), index_map)
    if writeback is not None:
        primitive("iterate the write-back over the fused axes", sch.transform_block_layout, writeback, index_map)


def fused_tiles_are_boxes(expr: TensorExpr, program: RProgram, shape: Sequence[int]) -> bool:
    """Whether every top-level tile of every fused output axis covers a box of the unfused
    output `shape`: then a block that indexes the output dimension by dimension (an epilogue
    that `axis_loops` did not fuse, layer norm's mean) computes exactly one tile's elements
    when attached under the tile's loop. Otherwise TVM widens its region to the enclosing box,
    and tiles run in parallel would compute each other's elements from partial inputs.

    A tile of t elements of an axis fused from extents e_0..e_(n-1) is a box at every offset
    (t-aligned, the last one cut at the end) when, for some k, t is a multiple of
    P = e_(k+1) * .. * e_(n-1) (whole rows of the dimensions inside k) and either k = 0 or t
    divides e_k * P (rows do not straddle dimension k-1), dimensions of extent 1 left out; or
    when one tile covers the whole axis."""
    d = 0
    for (coeffs, const), n in zip(expr.output.index, _fused_groups(expr)):
        if n > 1:
            axis = next(a for a, c in enumerate(coeffs) if c)
            extents = shape[d:d + n]
            if _static_prod(extents) is None:  # a symbolic extent: whether tiles stay boxes is unknown
                return False
            if not _tile_is_box(int(axis_chain(program, axis)[-1]), [int(e) for e in extents]):
                return False
        d += n
    return True


def _tile_is_box(tile: int, extents: Sequence[int]) -> bool:
    extents = [e for e in extents if e > 1]  # a dimension of one index never widens a box
    if tile >= prod(extents):  # one tile: the whole box
        return True
    inner = 1
    for k in reversed(range(len(extents))):
        if tile % inner == 0 and (k == 0 or (inner * extents[k]) % tile == 0):
            return True
        inner *= extents[k]
    return False


def _index_map(sch, block, fn, ndim: int):
    """`fn` (of `ndim` indices) as a TVM IndexMap in the index dtype of `block`'s iterators."""
    from tvm.tirx import IndexMap

    return IndexMap.from_func(fn, ndim=ndim, index_dtype=str(sch.get(block).iter_vars[0].var.ty))


def _fused_groups(expr: TensorExpr) -> tuple[int, ...]:
    """Per dimension of the (fused) output: how many dimensions of the original buffer it merges
    (`_groups`)."""
    return _groups(expr, expr.output)


def _groups(expr: TensorExpr, tensor) -> tuple[int, ...]:
    """Per dimension of `tensor` of the (fused) `expr`: how many dimensions of its original
    buffer it merges (`len(fused_from)` of the axis indexing it alone, as `ops.fusion` fuses; 1
    otherwise)."""
    groups = []
    for coeffs, const in tensor.index:
        used = [a for a, c in enumerate(coeffs) if c]
        sole = len(used) == 1 and coeffs[used[0]] == 1 and const == 0
        groups.append(max(1, len(expr.axes[used[0]].fused_from)) if sole else 1)
    return tuple(groups)


def chain_factors(extent: int, chain: Sequence[int]) -> list:
    """Split factors realising a tile chain (top first): `[None, t_n / t_(n-1), ..., t_1 / t_0, t_0]`.

    The outermost factor is None (TVM infers `ceil(extent / t_n)`); a last tile that does not
    divide the extent makes TVM guard the tail with a block predicate.
    """
    inner = [int(chain[i]) // int(chain[i - 1]) for i in range(len(chain) - 1, 0, -1)]
    return [None] + inner + [int(chain[0])]


def split_by_chain(sch, loop, extent: int, chain: Sequence[int]) -> list:
    """Split `loop` (of `extent`) into `len(chain) + 1` loops: outermost counts the last tiles,
    then one loop per layer down to the top tile. Unit loops are kept so that every axis has the
    same number of levels (templates index them by level)."""
    return list(sch.split(loop, factors=chain_factors(extent, chain), preserve_unit_iters=True))


def needs_guard(extent: int, chain: Sequence[int]) -> bool:
    """True when the chain's last tile does not divide `extent` (the split adds a predicate)."""
    return extent % int(chain[-1]) != 0


def primitive(what: str, fn, *args):
    """Run a schedule primitive, turning TVM's error into a one-line ScheduleError."""
    try:
        return fn(*args)
    except Exception as err:  # TVM raises its own error classes (tvm.error.*, TVMError)
        raise ScheduleError(f"{what}: {first_line(err)}") from err
