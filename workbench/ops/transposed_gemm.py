"""A GEMM whose operand is stored across the output's row, as the GEMM over a copy of it laid
along the row, for CPUs.

`C[i, j] += A[i, k] * B[j, k]` (`trans_b`: attention's Q x K^T, a Linear layer's weight as PyTorch
keeps it, [out, in]) reads B across C's row j: consecutive outputs of a row read elements K apart,
so no vector load serves them, and the CPU template, which vectorises a row only along inputs that
stream along it (`rtile.axes.lane_axis`), falls back to vectors along K, each output a sum across
lanes (the gemv template): 0.08-0.65x numpy's speed on random shapes, 0.15x on attention scores.
BLIS and OpenBLAS pack B's panels whichever way it is stored; here a copy of B with its dimensions
in the order the output row streams (`Bt[k, j]`) is made once, before the loop nest, over all
cores (`codegen.cpu._transpose_first`), and the plain template then tiles, packs and vectorises the
GEMM over it as it does a matmul's. The copy reads B once and writes it once: O(N K) against the
GEMM's O(M N K). Where B's panels are copied once (`rtile.panels.transposed_in_panels`) the copy
is B's panel copy itself, which reads B as stored.

The view is the expression with that input's dimensions permuted, under the argument's name
(`TensorExpr.transposed` names it); its PrimFunc has the copy block (`pixel_gemm.gather`, TVM's
`reindex`), and the caller passes B as it is stored.
"""

from __future__ import annotations

from dataclasses import replace

from workbench.ops.pixel_gemm import gather, plain_dim
from workbench.ops.tensor_expr import SPATIAL, TensorExpr, sum_of_products


def transposed_gemm(expr: TensorExpr) -> TensorExpr | None:
    """The view of `expr` over a copy of its transposed operand (module docstring), None where
    `expr` has none or TVM cannot make the copy. A pure function of the expression, as
    `pixel_gemm` is (the test fast lane's expressions carry no PrimFunc)."""
    found = _transposed(expr)
    if found is None:
        return None
    operand, dims = found
    view = _view(expr, operand, dims)
    if expr.func is None:
        return view
    try:
        return replace(view, func=_rewrite(expr, operand, dims))
    except Exception:  # a block TVM cannot re-lay out: no view
        return None


def _transposed(expr: TensorExpr) -> tuple[int, tuple[int, ...]] | None:
    """(the position among the inputs of the operand read across the output's row, the order of
    its dimensions in the copy: the row's last, the others as stored) when `expr` is a sum of
    products of two inputs, not fused, whose output's innermost dimension is a spatial axis that
    one input reads, in another dimension than its innermost, as a plain projection (every
    dimension one axis, stride 1, no offset: a matrix, not a window) passed as stored and reused
    (it ignores a spatial axis longer than 1), while the other ignores the row; else None."""
    if len(expr.inputs) != 2 or not expr.reduce or any(a.fused_from for a in expr.axes) or expr.gathered \
            or expr.transposed:
        return None
    out = expr.output
    if not out.shape:  # a scalar output (a dot product) has no row
        return None
    row = plain_dim(out, len(out.shape) - 1)
    if row is None or expr.axes[row].kind != SPATIAL:
        return None
    readers = [n for n, t in enumerate(expr.inputs) if t.uses_axis(row)]
    if len(readers) != 1:
        return None
    operand = expr.inputs[readers[0]]
    if not any(not operand.uses_axis(a) and expr.axes[a].extent > 1 for a in expr.spatial):
        return None  # read once (a gemv's matrix, a one-row matmul's B): a copy only adds its traffic
    axes = [plain_dim(operand, d) for d in range(len(operand.shape))]
    if None in axes or axes.count(row) != 1 or axes[-1] == row:
        return None
    args = {a.name: a for a in expr.args}
    arg = args.get(operand.name)
    if expr.args and (arg is None or tuple(arg.shape) != tuple(operand.shape)):
        return None  # read through a padding copy or another shape: no plain matrix to copy
    if not sum_of_products(expr):  # last: it reads the PrimFunc
        return None
    at = axes.index(row)
    return readers[0], tuple(d for d in range(len(axes)) if d != at) + (at,)


def _view(expr: TensorExpr, operand: int, dims: tuple[int, ...]) -> TensorExpr:
    """`expr` with input `operand`'s dimensions in the order `dims`, read as its copy."""
    tensor = expr.inputs[operand]
    copied = replace(tensor, shape=tuple(tensor.shape[d] for d in dims), index=tuple(tensor.index[d] for d in dims))
    tensors = tuple(copied if t is tensor else t for t in expr.tensors)
    return replace(expr, tensors=tensors, transposed=(tensor.name,))


def _rewrite(expr: TensorExpr, operand: int, dims: tuple[int, ...]):
    """`expr.func` with the main block reading input `operand` through a copy laid out in the
    order `dims` (`pixel_gemm.gather`)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": expr.func}))
    gather(sch, sch.get_sblock(expr.main_block), expr.inputs[operand].name, dims)
    return sch.mod["main"]


def copied_bytes(expr: TensorExpr, but: tuple[str, ...] = ()) -> int:
    """Bytes the copies of the transposed operands (`TensorExpr.transposed`) made before the loop
    nest move, each read once and written once; `but`: those copied into their panels instead
    (`CpuPlan.transposed_in_panels`)."""
    return sum(2 * t.nbytes for t in expr.inputs if t.name in expr.transposed and t.name not in but)
