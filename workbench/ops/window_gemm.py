"""A convolution with a window and few input channels as the GEMM over its pixels of a gathered
copy of its windows (im2col), for CPUs.

`O[n, f, h, w] += data[n, c, h + r*dh, w + s*dw] * kernel[f, c, r, s]` is, per image,
O[f, p] = kernel[f, k] x col[k, p] over the OH x OW output pixels p and the k = (c, r, s) of a
window, once `col[n, c, r, s, h, w] = data[n, c, h + r*dh, w + s*dw]` (zero in the border) is
written out: ONNX Runtime runs a conv so (MLAS: an im2col copy, then its GEMM). The copy is
`C x KH x KW` values per output pixel, `F` outputs share each; what it saves is the filters
template's write-back: that template keeps the filters as the lanes and the accumulators
filters-last, so every output is stored transposed, one element at a time, and with few
channels a window's `C x KH x KW` FMAs per output are too few to hide it. The GEMM stores the
pixels as the output row, in whole vectors (`window_gemm` says when the view is taken).

The rewrite is TensorIR's, as `ops.pixel_gemm`'s: `reindex` copies what the main block reads of
the image into a buffer over its own iterators, the zero border's producer is inlined into that
copy, the copy is laid out (n, c*KH*KW + r*KW + s, h*OW + w) and walks (n, h, c, r, s, w), the
kernel's (c, r, s) flattened alike, and the main block's iterators merged to (n, f, p, k);
epilogues a model fused in follow the output's pixels (`pixel_gemm.flatten_pixels`). The caller
still passes (N, C, H, W), (F, C, KH, KW) and (N, F, OH, OW) buffers (`with_call_shapes`).
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from workbench.ops.pixel_gemm import flatten_pixels, gathered_name, merged_map, plain_axis, plain_dim, source_read
from workbench.ops.tensor_expr import REDUCE, Axis, TensorAccess, TensorExpr, rename_iter_vars, sum_of_products

# When the view is taken (`_windowed`), measured on a 2-core Zen 5 against the conv's own nest,
# each the best of its top 3 (evidence: docs/evidence.md#window-gemm):
# - MAX_WINDOW_REDUCTION: at most 64 FMAs per output (C x KH x KW), too few to hide the filters
#   template's transposed store of each output; 72-175 ran as fast or faster in their own nest.
# - MAX_COPIES_PER_OUTPUT: the copy writes C x KH x KW values per pixel for the F outputs there
#   (F filters) to share; at most two a pixel's output, as with 9 or 8 filters (5 and 5.6 an
#   output: 0.77x and 0.93x) the copy costs more than it saves. It bounds the priced views too
#   (below): of 74 stride-1 convs drawn with 18-495 per output, pricing only those with at most
#   two copies an output took 0.966 of the faster of nest and view in geomean (the worst 0.66)
#   where pricing them all took 0.953 (the worst 0.66); chosen on 50 of them, 0.982 against
#   0.974 (worst 0.91 against 0.83) on the other 24.
# - the image read at stride 1 only: a strided copy reads an element a load (0.19 ns an element
#   against 0.03-0.08 at stride 1), and three of four strided convs ran slower as the view.
MAX_WINDOW_REDUCTION = 64
MAX_COPIES_PER_OUTPUT = 2
# Beyond MAX_WINDOW_REDUCTION, up to MAX_PRICED_REDUCTION FMAs per output and within
# MAX_COPIES_PER_OUTPUT, the view is the alternative the construction prices against the nest
# (`window_gemm(priced=True)`, `construct.stepper.construction_view`): of 24 stride-1 convs
# drawn with 99-441 per output, the view ran 1.01-1.80x faster than the nest in 16, and the model
# chose the faster in 16, the others 1-15 % slower (1.11x over the nest in geomean, of 1.13x
# possible); of 8 drawn with 522-2375, the view was at most 3 % faster and the model chose the
# slower in 4 (by 1-15 %; docs/evidence.md#window-gemm).
MAX_PRICED_REDUCTION = 512

# The view's reduce axis, the window's (c, r, s) flattened: what tells it from a pointwise
# conv's view, whose reduction stays the channel `c` (the stepper's note, the export's)
WINDOW_AXIS = "k"


def is_window_view(expr: TensorExpr) -> bool:
    """Whether `expr` is a window's view (`window_gemm`): its one reduce axis the window's."""
    return len(expr.reduce) == 1 and expr.axes[expr.reduce[0]].name == WINDOW_AXIS and bool(expr.gathered)


def window_gemm(expr: TensorExpr, priced: bool = False) -> TensorExpr | None:
    """The im2col view of `expr` (module docstring), None where `expr` is no conv with a window
    at stride 1 of at most MAX_WINDOW_REDUCTION multiply-adds per output and at most
    MAX_COPIES_PER_OUTPUT copied values per output (a pointwise conv is `pixel_gemm`'s), or
    TVM cannot re-lay out one of its blocks. `priced`: the view to price against the nest
    instead, of a conv beyond MAX_WINDOW_REDUCTION but within MAX_PRICED_REDUCTION multiply-adds
    and MAX_COPIES_PER_OUTPUT copied values per output (None for one the limits take). Pure, as
    `pixel_gemm` is: the view carries the rewritten function where `expr` has one."""
    found = _windowed(expr, priced)
    if found is None:
        return None
    view = _view(expr, *found)
    if expr.func is None:
        return view
    try:
        return replace(view, func=_rewrite(expr, *found))
    except Exception:  # a block TVM cannot re-lay out (a proof it cannot make): no view
        return None


def _windowed(expr: TensorExpr, priced: bool = False):
    """(the output's pixel axes (h, w), the window's reduce axes (c, r, s) in the kernel's
    order, the image's position among the inputs) where `expr` sums products of an image read
    through a window and a kernel whose last three dimensions are (c, r, s), each plain, the
    image's channel plain and its pixels the output's at stride 1 plus the window's at a
    dilation, every other dimension of both a plain spatial axis, the window and the filters
    within MAX_WINDOW_REDUCTION and MAX_COPIES_PER_OUTPUT (`priced`: beyond the first, within
    MAX_PRICED_REDUCTION and the second); else None."""
    if len(expr.inputs) != 2 or len(expr.reduce) != 3 or any(a.fused_from for a in expr.axes):
        return None
    out = expr.output
    if len(out.shape) < 3 or any(plain_axis(expr, out, d) is None for d in range(len(out.shape))):
        return None
    pixels = (plain_axis(expr, out, -2), plain_axis(expr, out, -1))
    for image, kernel in (expr.inputs, expr.inputs[::-1]):
        if len(kernel.shape) < 4 or len(image.shape) != len(out.shape):
            continue
        window = tuple(plain_dim(kernel, d) for d in (-3, -2, -1))
        if None in window or sorted(window) != sorted(expr.reduce):
            continue
        c, r, s = window
        if plain_dim(image, -3) != c:
            continue
        if any(not _pixel_index(image.index[d], p, q) for d, p, q in ((-2, pixels[0], r), (-1, pixels[1], s))):
            continue
        if any(plain_axis(expr, t, d) is None for t in (image, kernel) for d in range(len(t.shape) - 3)):
            continue
        if expr.axes[r].extent * expr.axes[s].extent == 1:
            return None  # a pointwise conv: `pixel_gemm`
        depth = prod(expr.axes[a].extent for a in window)
        # the outputs that share a copied value: the filters of its group (a group is the image's)
        filters = prod(expr.axes[a].extent for a in expr.spatial if kernel.uses_axis(a) and not image.uses_axis(a))
        shared = depth <= MAX_COPIES_PER_OUTPUT * filters
        if not shared or (depth <= MAX_WINDOW_REDUCTION) == priced or depth > MAX_PRICED_REDUCTION:
            return None
        args = {a.name: a for a in expr.args}
        if kernel.name in args and prod(args[kernel.name].shape) != prod(kernel.shape):
            return None
        # last: it reads the PrimFunc's body
        return (pixels, window, expr.inputs.index(image)) if sum_of_products(expr) else None
    return None


def _pixel_index(index, pixel: int, tap: int) -> bool:
    """Whether an image dimension's index is `pixel + tap * dilation + offset`, the dilation
    positive, no other axis."""
    coeffs, _ = index
    return coeffs[pixel] == 1 and coeffs[tap] > 0 and all(c == 0 for a, c in enumerate(coeffs) if a not in (pixel, tap))


def _view(expr: TensorExpr, pixels: tuple[int, int], window: tuple[int, int, int], image: int) -> TensorExpr:
    """`expr` over the axes (.., f, p, k): (h, w) one spatial axis p, the window's (c, r, s) one
    reduce axis k; the image read as its gathered copy (.., k, p) under the argument's name, the
    kernel as (.., k), the output as (.., p)."""
    h, w = pixels
    height, width = expr.output.shape[-2:]
    depth = prod(expr.axes[a].extent for a in window)
    spatial = [a for a in expr.spatial if a != w]
    axes = tuple(replace(expr.axes[a], name="p", extent=height * width) if a == h else expr.axes[a] for a in spatial)
    axes += (Axis(WINDOW_AXIS, depth, REDUCE),)
    n = len(axes)

    def unit(axis: int) -> tuple[tuple[int, ...], int]:
        return tuple(int(a == axis) for a in range(n)), 0

    def at(axis: int) -> int:  # an axis of `expr` kept in the view: its position there
        return spatial.index(axis)

    def keep(t: TensorAccess, dims: int) -> list:
        return [unit(at(next(a for a, c in enumerate(coeffs) if c))) for coeffs, _ in t.index[:dims]]

    source, kernel, out = expr.inputs[image], expr.inputs[1 - image], expr.output
    col = replace(source, shape=source.shape[:-3] + (depth, height * width),
                  index=tuple(keep(source, len(source.shape) - 3) + [unit(n - 1), unit(at(h))]))
    weights = replace(kernel, shape=kernel.shape[:-3] + (depth,),
                      index=tuple(keep(kernel, len(kernel.shape) - 3) + [unit(n - 1)]))
    output = replace(out, shape=out.shape[:-2] + (height * width,), index=tuple(keep(out, len(out.shape) - 2) + [unit(at(h))]))
    inputs = (col, weights) if image == 0 else (weights, col)
    return replace(expr, axes=axes, tensors=inputs + (output,), gathered=(source.name,))


def _rewrite(expr: TensorExpr, pixels: tuple[int, int], window: tuple[int, int, int], image: int):
    """`expr.func` as the view's: the image's windows gathered (module docstring)."""
    import tvm
    from tvm import s_tir
    from tvm.tirx import IndexMap

    name = expr.inputs[image].name
    height, width = expr.output.shape[-2:]
    kh, kw = (expr.axes[a].extent for a in window[1:])
    sch = s_tir.Schedule(tvm.IRModule({"main": expr.func}))
    main = sch.get_sblock(expr.main_block)
    copy = sch.reindex(main, ("read", source_read(sch, main, name)))
    while producers := list(sch.get_producers(copy)):  # the zero border, and copies before it
        for producer in producers:
            sch.compute_inline(producer)
    variables = [iv.var for iv in sch.get(copy).iter_vars]
    dtype = str(variables[0].ty)
    # the copy's iterators are the main block's that the image reads, in the main block's order
    used = [a for a in range(len(expr.axes)) if expr.inputs[image].uses_axis(a)]
    if len(used) != len(variables):
        raise ValueError(f"{name}'s copy walks {len(variables)} iterators, its index {len(used)} axes")
    batch = [used.index(a) for a in used if a not in window and a not in pixels]
    taps = [used.index(a) for a in window]
    rows = [used.index(a) for a in pixels]
    # the output's rows outside the taps: `codegen.cpu._gather_first` deals the fused loops out to
    # the cores in chunks, so each core copies the pixels of the rows the GEMM's grid gives it
    # (its unit tiles run along the pixels), not a share of the taps of every pixel, which the
    # other core then reads from its cache (docs/evidence.md#window-gemm)
    order = batch + rows[:1] + taps + rows[1:]
    permute = IndexMap.from_func(lambda *i: tuple(i[k] for k in order), ndim=len(order), index_dtype=dtype)
    sch.transform_block_layout(copy, permute)
    flat = IndexMap.from_func(
        lambda *i: (*(i[k] for k in batch), (i[taps[0]] * kh + i[taps[1]]) * kw + i[taps[2]], i[rows[0]] * width + i[rows[1]]),
        ndim=len(order), index_dtype=dtype)
    sch.transform_layout(copy, ("write", 0), flat)
    reads = [str(region.source.name) for region in sch.get(main).reads]
    kernel = next(i for i, read in enumerate(reads) if read != str(sch.get(copy).writes[0].source.name))
    ndim = len(expr.inputs[1 - image].shape)
    sch.transform_layout(main, ("read", kernel), IndexMap.from_func(
        lambda *i: (*i[:-3], (i[-3] * kh + i[-2]) * kw + i[-1]), ndim=ndim, index_dtype=dtype))
    n = len(expr.axes)
    keep = [a for a in range(n) if a not in window and a != pixels[1]]
    merge = merged_map(keep, pixels[0], width)
    main_map = IndexMap.from_func(
        lambda *i: (*merge(*i), (i[window[0]] * kh + i[window[1]]) * kw + i[window[2]]), ndim=n, index_dtype=dtype)
    # the image stays the caller's (N, C, H, W); the copy and the kernel are laid out already
    laid_out = (name, str(sch.get(copy).writes[0].source.name), reads[kernel])
    func = flatten_pixels(sch, expr, skip=(str(sch.get(copy).name_hint),), kept=laid_out, main_map=main_map)
    return _renamed(func, str(sch.get(copy).writes[0].source.name), gathered_name(name), expr, keep, pixels[0])


def _renamed(func, theirs: str, ours: str, expr: TensorExpr, keep: list[int], h: int):
    """`func` with the copy's buffer named `ours` (the CPU template finds a gather by the name,
    `codegen.cpu`) and the main block's iterators named after the view's axes (n, f, p, k)."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx
    from tvm.tirx import Var

    made: dict[str, object] = {}

    def buffer(b):
        if str(b.name) != theirs:
            return b
        if theirs not in made:
            made[theirs] = tirx.decl_buffer(b.shape, b.dtype, ours)
        return made[theirs]

    func = tvm_ffi.structural_map(func, [(tirx.Buffer, buffer)])
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    main = sch.get(sch.get_sblock(expr.main_block))
    names = ["p" if a == h else expr.axes[a].name for a in keep] + [WINDOW_AXIS]
    return rename_iter_vars(func, [(iv.var, Var(f"v_{nm}", str(iv.var.ty)), None) for iv, nm in zip(main.iter_vars, names)])
