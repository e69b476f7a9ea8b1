"""The implicit-GEMM view of a convolution (Roller's artifact constructs conv this way on GPUs).

A conv `O[n, f, h, w] += pad[n, c, h*st + r, w*st + s] * kernel[f, c, r, s]` is the matrix
product O[M, N] = A[M, K] x B[K, N] with M = the output-pixel axes (n, h, w: the spatial axes
the weight does not read), N = the output channels (f: the spatial axes the weight reads) and
K = the reduction (c, r, s). A is the im2col matrix of the (padded) input, never materialised:
its element (m, k) is gathered from `pad` when a tile of it is loaded. `gemm_view` is a pure
function of the expression; the construction tiles (M, N, K) instead of the seven loop axes
when the device launches thread blocks (`construction_expr`), and `codegen.cuda_conv` realises
such a program by re-laying the conv block out as that GEMM (TensorIR `reindex`,
`transform_layout`, `transform_block_layout`).

How the model counts A (stated once, here): the view's A is a plain [M, K] matrix, so a block
tile moves BM x BK elements of A per shared step, read from global memory through shared memory
as an im2col tile (which the CUDA template stores k-major: `rtile.plan.kmajor_inputs`).
Elements that neighbouring windows share (the halo: a 3x3 window at stride 1 reads each input
up to 9 times) are counted once per use: the gather makes one load per im2col element, which is
what the template issues. B's view is [K, N] (the weight, the
reduction outermost as in a row-major GEMM's B), the output's [M, N]; every other formula of
the model is unchanged.

Which operators have a view: a sum of products of two inputs whose every reduce axis indexes
both inputs, whose every spatial axis indexes the output and exactly one input, and where one
input (A) is read through a window (an index that adds a spatial and a reduce axis: that is what
makes it a conv and not already a matmul). conv2d (any stride, dilation, padding) qualifies.
Depthwise conv does not (its channel indexes both inputs and the output: a batch of per-channel
GEMMs with N = the multiplier and K = KH*KW, no channel reduction), nor do pooling windows (one
input, no weights), nor grouped conv (the group indexes both inputs): docs/architecture.md says
why they keep the direct loop nest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.group_view import group_view
from workbench.ops.pixel_gemm import pixel_gemm
from workbench.ops.tensor_expr import REDUCE, SPATIAL, Axis, TensorAccess, TensorExpr, read_through_window, sum_of_products
from workbench.ops.transposed_gemm import transposed_gemm
from workbench.ops.window_gemm import window_gemm


@dataclass(frozen=True)
class GemmView:
    """A conv as O[M, N] = A[M, K] x B[K, N]. `m`, `n`, `k` name the original axes fused into
    each (outermost first, row-major: m = (n * OH + h) * OW + w); `image` / `weight` index the
    inputs of the original expression (A is gathered from `image`); `expr` is the 3-axis
    expression the construction tiles (its tensors are the virtual A, B and O, its PrimFunc the
    conv's own)."""

    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    image: int
    weight: int
    expr: TensorExpr

    def groups(self) -> dict[str, tuple[str, ...]]:
        return {"m": self.m, "n": self.n, "k": self.k}


def gemm_view(expr: TensorExpr) -> GemmView | None:
    """The implicit-GEMM view of `expr`, None when it is no conv in the sense of the module doc
    (or its axes were already fused: the view is taken on the expression as built)."""
    if any(a.fused_from for a in expr.axes) or len(expr.inputs) != 2 or not expr.reduce:
        return None
    if not sum_of_products(expr):
        return None
    windowed = [read_through_window(expr, t) for t in expr.inputs]
    if windowed.count(True) != 1:
        return None
    image = windowed.index(True)
    a_in, b_in = expr.inputs[image], expr.inputs[1 - image]
    if any(not (a_in.uses_axis(r) and b_in.uses_axis(r)) for r in expr.reduce):
        return None
    m_axes, n_axes = [], []
    for s in expr.spatial:
        if not expr.output.uses_axis(s) or a_in.uses_axis(s) == b_in.uses_axis(s):
            return None
        (m_axes if a_in.uses_axis(s) else n_axes).append(s)
    if not m_axes or not n_axes:
        return None
    groups = tuple(tuple(expr.axes[a].name for a in axes) for axes in (m_axes, n_axes, expr.reduce))
    sizes = tuple(prod(expr.axes[a].extent for a in axes) for axes in (m_axes, n_axes, expr.reduce))
    axes = tuple(
        Axis("".join(group), size, kind, group if len(group) > 1 else ())
        for group, size, kind in zip(groups, sizes, (SPATIAL, SPATIAL, REDUCE))
    )
    big_m, big_n, big_k = sizes

    def access(tensor: TensorAccess, shape, dims) -> TensorAccess:
        index = tuple((tuple(int(a == d) for a in range(3)), 0) for d in dims)
        return TensorAccess(tensor.name, shape, tensor.dtype, tensor.role, index)

    a_view = access(a_in, (big_m, big_k), (0, 2))
    b_view = access(b_in, (big_k, big_n), (2, 1))
    inputs = (a_view, b_view) if image == 0 else (b_view, a_view)
    out = access(expr.output, (big_m, big_n), (0, 1))
    view_expr = TensorExpr(
        op=expr.op, params=expr.params, axes=axes, tensors=inputs + (out,), dtype=expr.dtype, flops=expr.flops,
        main_block=expr.main_block, args=expr.args, epilogues=expr.epilogues, pads_reduction=expr.pads_reduction,
        epilogue_flops=expr.epilogue_flops,
        func=expr.func,
    )
    return GemmView(*groups, image, 1 - image, view_expr)


def construction_expr(expr: TensorExpr, device: DeviceSpec) -> TensorExpr:
    """What the construction tiles: a conv's GEMM view on a device that launches thread blocks
    (CUDA); on a CPU, a grouped conv with its groups a dimension of every tensor
    (`ops.group_view`), a pointwise conv's GEMM over its pixels (`ops.pixel_gemm`) and a conv of
    few channels the GEMM over its gathered windows (`ops.window_gemm`), the expression itself
    everywhere else (`view_alternative` names what the construction prices against it). A dtype the
    device has tensor cores for keeps the direct nest: the view would be modelled as an MMA
    contraction (`rtile.axes.mma_axes`) while the WMMA template declines fused axes and
    `codegen.cuda_conv` runs on the CUDA cores, so the model would price the wrong units."""
    if not device.launches_thread_blocks:
        grouped = group_view(expr) or expr
        return pixel_gemm(grouped) or window_gemm(grouped) or grouped
    if device.has_tensor_cores(expr.dtype):
        return expr
    view = gemm_view(expr)
    if view is None:
        return expr
    if view.expr.func is not None:
        _MADE[view.expr, view.expr.func] = view
        while len(_MADE) > MAX_MADE:
            del _MADE[next(iter(_MADE))]
    return view.expr


def view_alternative(expr: TensorExpr, device: DeviceSpec) -> TensorExpr | None:
    """On a CPU, a view priced against the nest `construction_expr` keeps: a conv's window view
    within the limits where it is priced (`window_gemm(priced=True)`), or a GEMM's over a copy
    of its transposed operand (`ops.transposed_gemm`: the copy pays only where the operand is
    reused enough); the construction takes whichever the model prices faster
    (`construct.stepper.construction_view`). None elsewhere."""
    if device.launches_thread_blocks:
        return None
    grouped = group_view(expr) or expr
    return window_gemm(grouped, priced=True) or transposed_gemm(grouped)


def view_of(expr: TensorExpr) -> GemmView | None:
    """The GemmView whose `expr` is `expr` (a GEMM-view expression, as `construction_expr`
    returns it): the one `construction_expr` made, else recovered from its PrimFunc; None for
    any other expression."""
    return _view_of(expr, expr.func)


# The views `construction_expr` made, by (view expression, PrimFunc), oldest first: the GPU model
# asks `view_of` about every conv program it prices (`staging.pipelined`), and reading the
# PrimFunc back through TVM took 26 ms of a 180 ms construction of roller-table1's C2 on the V100.
_MADE: dict[tuple, GemmView] = {}
MAX_MADE = 256


# Memoised per expression and PrimFunc (a PrimFunc hashes and compares by identity; equality of
# TensorExprs leaves it out): reading the PrimFunc back through TVM takes tens of milliseconds.
@lru_cache(maxsize=256)
def _view_of(expr: TensorExpr, func) -> GemmView | None:
    from workbench.ops.tensor_expr import from_prim_func

    made = _MADE.get((expr, func))
    if made is not None:
        return made
    if func is None or len(expr.axes) != 3 or not any(a.fused_from for a in expr.axes):
        return None
    original = from_prim_func(func, expr.op, dict(expr.params), expr.dtype, n_inputs=len(expr.inputs))
    view = gemm_view(original)
    return view if view is not None and view.expr == expr else None
