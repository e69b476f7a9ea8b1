"""Axis fusion (Roller §3.2): a canonicalising pass for irregular shapes.

Two neighbouring axes of the same kind can be merged when, in every tensor, they are either both
absent, or both present as two adjacent dimensions indexed by exactly those axes (coefficient 1,
the first outer). An elementwise [17, 11, 3] becomes [561]: one axis whose extent aligns far more
easily than 3 or 11 do. The fused expression keeps the original PrimFunc; codegen fuses the
corresponding loops (`Axis.fused_from` names them, outermost first).
"""

from __future__ import annotations

from dataclasses import replace

from workbench.ops.tensor_expr import SPATIAL, Axis, TensorAccess, TensorExpr, reuses_every_input


def fuse_axes(expr: TensorExpr, panels: bool = False) -> TensorExpr:
    """Merge fusable neighbouring axes until none are left. `panels`: for a template that
    packs its inputs into panels and pads their tails (a CPU's, `rtile.panels`), which a fused
    input dimension keeps it from (`_first_fusable`)."""
    while True:
        pair = _first_fusable(expr, panels)
        if pair is None:
            return expr
        expr = _fuse(expr, *pair)


def _first_fusable(expr: TensorExpr, panels: bool = False):
    """The first pair of neighbouring axes that fuse. Where the expression reuses every input
    (`reuses_every_input`: a matmul) its spatial axes of extent 1 are left alone: fusing one
    changes no extent, which is what fusion is for, while a fused axis keeps the CPU template
    from packing panels and padding tails (`rtile.panels`). A transformer block's [1, 77, 300]
    x [300, 300] projection fused its batch of one into the rows and ran its 300 columns' last
    12 scalar: 115-490 us for its top 10, 75-96 us with the batch left alone (two Zen 4 cores).
    For such a template (`panels`) every spatial axis its inputs read stays apart, a register
    tile spanning rows of several batches as it is: a [2, 9, 973] x [973, 75] projection with
    its bias and ReLU ran 26.6 us fused, 11.6 apart (ONNX Runtime 20; two Zen 5 cores,
    docs/evidence.md#panel-inputs). The GPU templates keep fusing a batch into the rows (their
    tensor-core path takes no fused axis; unmeasured either way)."""
    reused = reuses_every_input(expr.axes, expr.inputs)
    for a in range(len(expr.axes) - 1):
        b = a + 1
        read = panels and any(t.uses_axis(a) or t.uses_axis(b) for t in expr.inputs)
        if reused and expr.axes[a].kind == SPATIAL and (read or 1 in (expr.axes[a].extent, expr.axes[b].extent)):
            continue
        if expr.axes[a].kind == expr.axes[b].kind and all(_adjacent_or_absent(t, a, b) for t in expr.tensors):
            return a, b
    return None


def _sole_dim(tensor: TensorAccess, axis: int):
    """The dimension indexed by `axis` alone with coefficient 1; None if absent; -1 otherwise."""
    dims = [d for d, (coeffs, _) in enumerate(tensor.index) if coeffs[axis]]
    if not dims:
        return None
    d = dims[0]
    coeffs, const = tensor.index[d]
    if len(dims) == 1 and coeffs[axis] == 1 and const == 0 and sum(1 for c in coeffs if c) == 1:
        return d
    return -1


def _adjacent_or_absent(tensor: TensorAccess, a: int, b: int) -> bool:
    da, db = _sole_dim(tensor, a), _sole_dim(tensor, b)
    if da is None and db is None:
        return True
    return da is not None and db is not None and da >= 0 and db == da + 1


def _fuse(expr: TensorExpr, a: int, b: int) -> TensorExpr:
    first, second = expr.axes[a], expr.axes[b]
    fused = Axis(
        name=f"{first.name}{second.name}",
        extent=first.extent * second.extent,
        kind=first.kind,
        fused_from=(first.fused_from or (first.name,)) + (second.fused_from or (second.name,)),
    )
    axes = expr.axes[:a] + (fused,) + expr.axes[b + 1 :]
    return replace(expr, axes=axes, tensors=tuple(_fuse_tensor(t, a, b) for t in expr.tensors))


def _drop(coeffs: tuple[int, ...], b: int) -> tuple[int, ...]:
    return coeffs[:b] + coeffs[b + 1 :]


def _fuse_tensor(tensor: TensorAccess, a: int, b: int) -> TensorAccess:
    da = _sole_dim(tensor, a)
    if da is None:
        return replace(tensor, index=tuple((_drop(c, b), k) for c, k in tensor.index))
    shape = tensor.shape[:da] + (tensor.shape[da] * tensor.shape[da + 1],) + tensor.shape[da + 2 :]
    index = tensor.index[: da + 1] + tensor.index[da + 2 :]  # dim da+1 (axis b) disappears
    index = tuple((_drop(c, b), k) for c, k in index)
    return replace(tensor, shape=shape, index=index)
