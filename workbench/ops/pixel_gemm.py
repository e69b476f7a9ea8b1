"""A pointwise (1x1, unpadded) convolution as the GEMM over its pixels, for CPUs.

`O[n, f, h, w] += data[n, c, h + r, w + s] * kernel[f, c, r, s]` with r and s of extent 1 reads
`data` as a plain matrix: per image, O[f, p] = kernel[f, c] x data[c, p] over the H x W pixels p
(ONNX Runtime hands such a conv to its GEMM the same way, MLAS). Row-major buffers need no copy
for it: `data`'s (h, w) are its two innermost dimensions, so (N, C, H, W) *is* (N, C, H*W), and
the output likewise. What the view changes is what the construction sees: three axes (n, f, p)
and the reduction c, every tensor a plain projection, so the CPU template packs panels and
vectorises the output row of pixels as it does a matmul's, instead of the filters template's
broadcast data and filters-last accumulators, written back transposed one element at a time (a
reduction of 31 per output spent most of its time there: docs/benchmarks.md).

`pixel_gemm` rewrites the PrimFunc itself (TensorIR `transform_layout` on every buffer whose two
innermost dimensions are the output's pixels, `transform_block_layout` on every block, the unit
r and s dropped), so epilogues a model fused into the conv (a bias, a ReLU, BN's scale) follow
the same pixels; the function then takes (N, C, H*W) buffers, and `with_call_shapes` gives the
compiled kernel back the caller's (N, C, H, W) ones, over the same memory. At a stride the
image's pixels are not a matrix: a copy of every stride-th pixel comes first (`gather`), and the
GEMM reads that. The GPU keeps its implicit GEMM (`ops.gemm_view`), which covers every conv.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from workbench.ops.tensor_expr import (
    SPATIAL, TensorAccess, TensorExpr, read_through_window, rename_iter_vars, sum_of_products,
)


def pixel_gemm(expr: TensorExpr) -> TensorExpr | None:
    """The pixel-GEMM view of `expr` (module docstring), None where `expr` is no pointwise conv
    or TVM cannot re-lay out one of its blocks (then it is constructed as it is). A pure
    function of the expression, as `gemm_view` is (the test fast lane's expressions carry no
    PrimFunc); where `expr` has one, the view carries the rewritten function, and its `args`
    stay the caller's."""
    found = _pointwise(expr)
    if found is None:
        return None
    pixels, unit, image = found
    view = _view(expr, pixels, unit, image)
    if expr.func is None:
        return view
    try:
        return replace(view, func=_rewrite(expr, pixels, unit, image))
    except Exception:  # a block TVM cannot re-lay out (a proof it cannot make): no view
        return None


def _view(expr: TensorExpr, pixels: tuple[int, int], unit: tuple[int, ...], image: int | None) -> TensorExpr:
    """`expr` over the axes n, f, p, c: the unit reduce axes dropped, (h, w) one axis p; every
    tensor's pixel dimensions one, the weight's unit trailing ones gone. The image read at a
    stride (input `image`) is read as its gathered copy, the output's pixels in a row (under the
    argument's name, as a padded input is: the main block reads the copy)."""
    h, w = pixels
    gone = set(unit) | {w}
    keep = [a for a in range(len(expr.axes)) if a not in gone]
    height, width = expr.output.shape[-2:]
    axes = tuple(replace(expr.axes[a], name="p", extent=height * width) if a == h else expr.axes[a] for a in keep)
    gathered = None if image is None else expr.inputs[image].name

    def tensor(t: TensorAccess) -> TensorAccess:
        index, shape = list(t.index), list(t.shape)
        if t.role == "input" and t.name == gathered:
            pixel = tuple(int(a == h) for a in range(len(expr.axes)))
            index, shape = index[:-2] + [(pixel, 0)], shape[:-2] + [height * width]
        elif tuple(shape[-2:]) == (height, width) and t.uses_axis(h):
            index, shape = index[:-1], shape[:-2] + [height * width]
        elif tuple(shape[-2:]) == (1, 1):
            index, shape = index[:-2], shape[:-2]
        coeffs = tuple((tuple(c[a] for a in keep), const) for c, const in index)
        return replace(t, shape=tuple(shape), index=coeffs)

    return replace(expr, axes=axes, tensors=tuple(tensor(t) for t in expr.tensors),
                   gathered=() if gathered is None else (gathered,))


def _pointwise(expr: TensorExpr):
    """(the output's pixel axes (h, w), the unit reduce axes, the position among the inputs of
    an image read at a stride, None at stride 1) when `expr` is a sum of products of two inputs,
    one read through a window whose reduce axes all have extent 1 at offset 0 (the other, the
    weight, reading them only in trailing dimensions of extent 1), its pixels the two innermost
    dimensions of both it and the output; else None."""
    if len(expr.inputs) != 2 or not expr.reduce or any(a.fused_from for a in expr.axes):
        return None
    out = expr.output
    pixels = tuple(plain_axis(expr, out, d) for d in (-2, -1)) if len(out.shape) >= 3 else (None,)
    if None in pixels:
        return None
    # the image: read through the window, or, where TVM folded the unit window away (a
    # grouped 1x1 conv's `h`, not `h + r`), the one input that reads the pixels
    windowed = [read_through_window(expr, t) for t in expr.inputs]
    if not any(windowed):
        windowed = [t.uses_axis(pixels[0]) for t in expr.inputs]
    if windowed.count(True) != 1:
        return None
    image, weight = expr.inputs[windowed.index(True)], expr.inputs[windowed.index(False)]
    arg = {a.name: a for a in expr.args}.get(image.name)
    # padded: the view would read the padding copy (a group view, `ops.group_view`, reshapes the
    # argument's dimensions, not its elements)
    if arg is None or prod(arg.shape) != prod(image.shape):
        return None
    if len(image.shape) < 3 or prod(out.shape[-2:]) == 1:
        return None
    unit = tuple(r for r in expr.reduce if expr.axes[r].extent == 1)
    strides = []
    for d, pixel in zip((-2, -1), pixels):
        coeffs, const = image.index[d]
        others = [a for a, c in enumerate(coeffs) if c and a != pixel]
        if const or coeffs[pixel] < 1 or any(a not in unit for a in others):
            return None
        strides.append(coeffs[pixel])
    if strides == [1, 1] and image.shape[-2:] != out.shape[-2:]:
        return None
    # every other dimension one whole axis, as a matmul's: a grouped conv's channel, `g * C/G + c`,
    # would leave the GEMM without panels and its pixel row scalar (ShuffleNet's grouped 1x1
    # convs ran 2x slower as views than in their own nest); `ops.group_view` splits it first
    if any(plain_dim(t, d) is None for t in (image, weight) for d in range(len(t.shape) - 2)):
        return None
    if len(weight.shape) < 3 or weight.shape[-2:] != (1, 1) or any(
            coeffs[a] for coeffs, _ in weight.index[:-2] for a in unit):
        return None
    # last: it reads the PrimFunc's body, which every conv with a window would pay for
    if not sum_of_products(expr):
        return None
    return pixels, unit, None if strides == [1, 1] else expr.inputs.index(image)


def plain_dim(tensor: TensorAccess, dim: int) -> int | None:
    """The axis indexing `tensor`'s dimension `dim` alone, coefficient 1, offset 0; else None."""
    coeffs, const = tensor.index[dim]
    used = [a for a, c in enumerate(coeffs) if c]
    return used[0] if not const and len(used) == 1 and coeffs[used[0]] == 1 else None


def plain_axis(expr: TensorExpr, tensor: TensorAccess, dim: int) -> int | None:
    """The spatial axis indexing `tensor`'s dimension `dim` alone, coefficient 1, offset 0."""
    axis = plain_dim(tensor, dim)
    return axis if axis is not None and expr.axes[axis].kind == SPATIAL else None


def _rewrite(expr: TensorExpr, pixels: tuple[int, int], unit: tuple[int, ...], image: int | None):
    """`expr.func` over (.., H*W) buffers and blocks whose (h, w) iterators are one p; an image
    read at a stride (input `image`) first gathered (`gather`)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": expr.func}))
    main = sch.get_sblock(expr.main_block)
    copy = gather(sch, main, expr.inputs[image].name) if image is not None else None
    # the gather walks the image's rows: its pixels stay two loops
    func = flatten_pixels(sch, expr, skip=() if copy is None else (copy,), unit=unit)
    return _name_axes(func, sch.get(main), expr, pixels, unit)


def flatten_pixels(sch, expr: TensorExpr, skip: tuple[str, ...] = (), kept: tuple[str, ...] = (), unit: tuple[int, ...] = (),
                   main_map=None):
    """The function `sch` schedules with every buffer whose two innermost dimensions are the
    output's pixels (H, W) laid out (.., H*W) (parameters and intermediates alike, but the
    buffers named in `kept`), the main block's reads of trailing (1, 1) dimensions dropped, and
    every block's (h, w) iterators merged into one p (the main block's `unit` reduce axes
    dropped), but the blocks named in `skip`; `main_map`, where given, is the main block's
    iterator map instead. A pointwise conv's view (`pixel_gemm`) and a window's
    (`ops.window_gemm`) both end so."""
    from tvm.tirx import IndexMap

    height, width = expr.output.shape[-2:]
    handles = list(sch.get_child_blocks(sch.get_sblock("root")))
    # per block, the positions of its iterators that walk the pixels, read off what it writes
    # before any layout changes (after, the pixels are one index h * W + w)
    plans = []
    for handle in handles:
        block = sch.get(handle)
        if str(block.name_hint) in skip:
            continue
        variables = [iv.var for iv in block.iter_vars]
        region = block.writes[0].region
        at = [next((i for i, v in enumerate(variables) if v.same_as(r.min)), None) for r in region[-2:]]
        if None in at or len(region) < 2 or at[0] + 1 != at[1]:
            raise ValueError(f"block {block.name_hint} does not write pixels in its own iterators")
        plans.append((handle, len(variables), at[0], str(block.name_hint) == expr.main_block))
    done = set(kept)
    for handle in handles:
        block = sch.get(handle)
        dtype = str(block.iter_vars[0].var.ty)
        for kind, regions in (("read", block.reads), ("write", block.writes)):
            for i, region in enumerate(regions):
                buffer = region.source
                name = str(buffer.name)
                if name in done:
                    continue
                shape = tuple(int(s) for s in buffer.shape)
                if len(shape) >= 3 and shape[-2:] == (height, width):
                    flat = IndexMap.from_func(lambda *i: (*i[:-2], i[-2] * width + i[-1]), ndim=len(shape), index_dtype=dtype)
                elif str(block.name_hint) == expr.main_block and kind == "read" and len(shape) >= 3 and shape[-2:] == (1, 1):
                    flat = IndexMap.from_func(lambda *i: i[:-2], ndim=len(shape), index_dtype=dtype)
                else:
                    continue
                sch.transform_layout(handle, (kind, i), flat)
                done.add(name)
    for handle, n, h, is_main in plans:
        dtype = str(sch.get(handle).iter_vars[0].var.ty)
        if is_main and main_map is not None:
            sch.transform_block_layout(handle, main_map)
            continue
        keep = [i for i in range(n) if not (is_main and i in unit)]
        sch.transform_block_layout(handle, IndexMap.from_func(merged_map(keep, h, width), ndim=n, index_dtype=dtype))
    return sch.mod["main"]


def gathered_name(name: str) -> str:
    """The buffer `gather` copies argument `name` into (TVM's `reindex` names it)."""
    return f"{name}_reindex"


def gather(sch, main, name: str, dims: tuple[int, ...] | None = None) -> str:
    """Copy the elements the main block reads of argument `name` into a buffer the main block
    then reads instead, before the loop nest; returns the copy block's name. A strided pointwise
    conv's image: the pixels read (every stride-th) over the output's pixels, which the main
    block then reads at stride 1: ONNX Runtime runs a strided pointwise conv as a GEMM over such
    a copy (MLAS), where the conv's own nest read the image at the stride (13 channels, 223 x 223
    pixels at stride 2: 0.41x ONNX Runtime's speed in the filters template:
    docs/evidence.md#gathered-pixels). TVM's `reindex` makes the copy, its buffer and iterators
    in the main block's iterator order; both are put in the argument's dimension order, or in
    the order `dims` lists its dimensions (`ops.transposed_gemm`: a transposed operand's copy)."""
    import tvm
    from tvm.tirx import IndexMap

    _read_in_place(sch, main, name)
    reads = [str(r.source.name) for r in sch.get(main).reads]
    copy = sch.reindex(main, ("read", reads.index(name)))
    block = sch.get(copy)
    variables = [iv.var for iv in block.iter_vars]
    # per dimension of the image, the copy's iterator that walks it, None for a dimension of
    # one element (TVM leaves an axis of extent 1, the image's one batch, out of the copy)
    order = []
    for r in block.reads[0].region:
        used = [i for i, v in enumerate(variables) if _uses(r.min, v)]
        if len(used) > 1:
            raise ValueError(f"{name}'s dimension {len(order)} walks {len(used)} iterators")
        order.append(used[0] if used else None)
    if sorted(i for i in order if i is not None) != list(range(len(variables))):
        raise ValueError(f"{name}'s copy has iterators no dimension walks")
    if dims is not None:
        order = [order[d] for d in dims]
    dtype = str(variables[0].ty)
    zero = tvm.tirx.const(0, dtype)
    permute = IndexMap.from_func(lambda *i: tuple(zero if k is None else i[k] for k in order),
                                 ndim=len(variables), index_dtype=dtype)
    sch.transform_layout(copy, ("write", 0), permute)
    sch.transform_block_layout(copy, permute)
    return str(sch.get(copy).name_hint)


def _read_in_place(sch, main, name: str) -> None:
    """Inline the copies between argument `name` and the main block (an imported conv reads its
    image through TOPI's `pad_temp`, a copy where the padding is 0), so the main block reads the
    argument itself."""
    while name not in [str(r.source.name) for r in sch.get(main).reads]:
        copies = [p for p in sch.get_producers(main) if len(sch.get(p).reads) == 1 and _copies(sch, p, name)]
        if not copies:
            raise ValueError(f"the main block does not read {name}")
        sch.compute_inline(copies[0])


def source_read(sch, main, name: str) -> int:
    """The position among the main block's reads of argument `name` or the copy of it it reads
    (a zero border, TOPI's `pad_temp`)."""
    for i, region in enumerate(sch.get(main).reads):
        source = str(region.source.name)
        if source == name or any(_copies(sch, p, name) for p in sch.get_producers(main) if len(sch.get(p).reads) == 1
                                 and str(sch.get(p).writes[0].source.name) == source):
            return i
    raise ValueError(f"the main block does not read {name}")


def _copies(sch, block, name: str) -> bool:
    """Whether `block`, of one read, reads argument `name` or a copy of it."""
    source = str(sch.get(block).reads[0].source.name)
    if source == name:
        return True
    producers = [p for p in sch.get_producers(block) if len(sch.get(p).reads) == 1]
    return any(_copies(sch, p, name) for p in producers)


def _uses(index, var) -> bool:
    from tvm import tirx

    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(index))


def merged_map(keep: list[int], h: int, width: int):
    """The iterator map of one block: iterators `keep`, those at h and h + 1 merged into one."""
    return lambda *i: tuple(i[k] * width + i[k + 1] if k == h else i[k] for k in keep if k != h + 1)


def _name_axes(func, block, expr: TensorExpr, pixels: tuple[int, int], unit: tuple[int, ...]):
    """The main block's new iterators named after the axes they came from, the pixels `p`
    (TVM names them v0, v1, ...): the construction shows n, f, p, c."""
    from tvm.tirx import Var

    names = [a.name for i, a in enumerate(expr.axes) if i not in unit and i != pixels[1]]
    names[names.index(expr.axes[pixels[0]].name)] = "p"
    return rename_iter_vars(func, [(iv.var, Var(f"v_{name}", str(iv.var.ty)), None) for iv, name in zip(block.iter_vars, names)])


def reshaped_params(func, args) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per parameter of `func` whose static shape is not its argument's in `args` (a pixel-GEMM
    view's (N, C, H*W) for (N, C, H, W)): (declared, the caller's); none for symbolic or scalar
    parameters (a view needs static pixels). ValueError where the two differ in elements."""
    shapes = {a.name: tuple(a.shape) for a in args}
    out = {}
    for param in func.params:
        declared = _static(getattr(param.ty, "shape", None))  # a scalar parameter has none
        wanted = shapes.get(str(param.name), declared)
        if declared is not None and wanted != declared:
            if prod(wanted) != prod(declared):
                raise ValueError(f"parameter {param.name}: {list(wanted)} is not a view of {list(declared)}")
            out[str(param.name)] = (declared, wanted)
    return out


def with_call_shapes(mod, args):
    """`mod` whose function takes the buffers of `args` (the caller's shapes) where it declared
    other shapes of as many elements (`reshaped_params`): each declared buffer becomes a view of
    the parameter's memory; `mod` itself where nothing differs."""
    func = mod["main"]
    differ = {name: wanted for name, (_, wanted) in reshaped_params(func, args).items()}
    if not differ:
        return mod
    import tvm
    from tvm import tirx

    params, views = [], []
    # a parameter is the buffer its blocks read and write, taken as it is (not looked up by
    # name: `x * x` from a model takes two `x`), and not by walking the blocks with a new
    # Schedule, whose well-formedness check refuses what a schedule may leave behind (the edge
    # tile `codegen.cpu._edge_tile_apart` partitions off keeps its block's iteration variables)
    for param in func.params:
        name = str(param.name)
        if name in differ:
            outer = tirx.decl_buffer(differ[name], param.dtype, name)
            params.append(outer)
            views.append(tirx.DeclBuffer(param, data=outer.data))
        else:
            params.append(param)
    body = tirx.SeqStmt(views + [func.body])
    return tvm.IRModule({"main": tirx.PrimFunc(params, body, func.ret_type, func.attrs)})


def _static(shape) -> tuple[int, ...] | None:
    """`shape` as integers, None where a dimension is symbolic (a Vortex kernel's) or there is
    no shape."""
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except TypeError:
        return None
