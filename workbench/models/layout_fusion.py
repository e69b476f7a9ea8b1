"""Reshapes and transposes fused into the matmuls they feed or that feed them (a transformer's
head split and merge), as index remaps in the matmul's reads or a copy in its write-back.

Multi-head attention, as exporters write it, splits each projection `[b, s, heads * dh]` into
heads with a Reshape to `[b, s, heads, dh]` and a Transpose to `[b, heads, s, dh]` (K's to
`[b, heads, dh, s]`), multiplies per head (`Q K^T`, then `P V`: batched matmuls over `b, heads`)
and merges the heads back with a Transpose and a Reshape of `P V`. TVM's fusion keeps each
reshape + transpose a copy kernel of its own (it fuses elementwise and broadcast operators after
a matmul, never a layout operator before or after one): four copies per attention. Here, before
legalisation, a Relax `matmul` whose operands come through chains of `reshape` / `permute_dims`
/ `strided_slice` (of a computed tensor, not a weight: constant folding folds those) or whose
result goes only through such a chain is replaced by one TE matmul (`call_te`, named
`batch_matmul`, its block `matmul` as TOPI's) that reads the chains' sources and writes the
chain's result:
- an operand's chain becomes the index of its read: `Q K^T` reads `q[b, i, h * dh + k]` from
  Q's projection (a fused QKV projection's Split, a strided slice, adds its offset);
- the output's chain becomes a copy block after the matmul (`T_layout`, iterating over the
  chain's result), an epilogue the CPU template folds into the accumulator's write-back as it
  folds a bias, so `P V` writes `[b, s, heads * dh]` itself.
The copies, which nothing reads any more, are dead code.

Which chains fuse: as many of the three (two operands, output) as keep the product a matmul
with its rows where the unfused one has them (`_reads_as_matmul`): every index affine, two
operands and one reduction (`symbolic.matmul_params`, so the catalog, the Vortex workloads and
the templates see a batched matmul), the reduction along the left operand's last dimension and
N along the right operand's and the output's. K's transpose to `[b, heads, dh, s]` is the one
that does not: read in place, K would be strided along N, the axis the CPU template vectorises
(docs/models.md#the-transformer-path has the measurement), so it stays a copy. A chain must contain a transpose (a Flatten's reshape before a classifier is its own
layout) and be read by nothing else, so that a copy really disappears. The fused matmul sums
over the same reduction in the same order as the unfused one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import product
from math import prod

LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.strided_slice")


def fuse_matmul_layouts(mod):
    """`mod` with the layout chains around each matmul of `main` fused into it (module doc)."""
    import tvm
    from tvm import relax

    main = mod["main"]
    bindings = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    users: Counter = Counter()
    for value in list(bindings.values()) + [main.body.body]:
        users.update(relax.analysis.free_vars(value))
    matmul = tvm.ir.Op.get("relax.matmul")
    outputs = {var: _output_chain(var, bindings, users) for var, value in bindings.items()
               if isinstance(value, relax.Call) and value.op.same_as(matmul)}
    ends = {end for end, chain in outputs.values() if chain}
    fusions = {var: _fusion(bindings[var], *outputs[var], bindings, users, ends) for var in outputs}
    fusions = {var: f for var, f in fusions.items() if f is not None}
    if not fusions:
        return mod
    written = {f.end: var for var, f in fusions.items() if f.end is not None}

    @relax.expr_functor.mutator
    class Fuse(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            if binding.var in written:  # computed by the fused matmul, bound where it was emitted
                return
            fusion = fusions.get(binding.var)
            if fusion is None:
                super().visit_var_binding_(binding)
                return
            target = binding.var if fusion.end is None else fusion.end
            if fusion.end is not None:  # the unfused matmul stays for the chain's (dead) copies
                super().visit_var_binding_(binding)
            call = self.builder_.call_te(fusion.compute, self.visit_expr(fusion.a), self.visit_expr(fusion.b),
                                         primfunc_name_hint="batch_matmul")
            emit = self.builder_.emit if isinstance(target, relax.DataflowVar) else self.builder_.emit_output
            self.set_var_remap(target, emit(call, name_hint=str(target.name)))

    fuse = Fuse(mod)
    fuse.builder_.update_func(mod.get_global_var("main"), fuse.visit_expr(main))
    return fuse.builder_.get()


@dataclass(frozen=True)
class Fusion:
    """One matmul with layout chains fused: the tensors it reads, the TE compute of the fused
    matmul (`compute(a, b)`), and the var of the output chain's result it writes (None: the
    matmul's own result)."""

    a: object
    b: object
    compute: object
    end: object = None


def _is_layout(value) -> bool:
    from tvm import relax

    return isinstance(value, relax.Call) and getattr(value.op, "name", "") in LAYOUT_OPS


def _output_chain(var, bindings, users):
    """`(end, chain)`: the layout calls that alone read `var`, one after another, and the var
    bound to the last one (`var` itself and () when there is none)."""
    chain = []
    while users[var] == 1:
        reader = [v for v, value in bindings.items() if _is_layout(value) and value.args[0].same_as(var)]
        if not reader:
            break
        var = reader[0]
        chain.append(bindings[var])
    return var, tuple(chain)


def _input_chain(operand, bindings, users, ends):
    """`(source, chain)`: the layout calls that make `operand` out of a tensor the graph computes
    or takes as input (chain in order from the source), each of them used by nothing else and
    none the end of another matmul's output chain (`ends`: that matmul writes it)."""
    from tvm import relax

    chain = []
    while isinstance(operand, relax.Var) and operand in bindings and _is_layout(bindings[operand]) \
            and users[operand] == 1 and operand not in ends:
        chain.append(bindings[operand])
        operand = bindings[operand].args[0]
    if not isinstance(operand, relax.Var):  # a weight's layout is constant folding's
        return None, ()
    return operand, tuple(reversed(chain))


def _keeps_last(call) -> bool:
    """True unless `call` is a transpose that moves the last dimension (a reshape or a slice
    keeps the innermost elements innermost)."""
    if call.op.name != "relax.permute_dims":
        return True
    axes = call.attrs.axes
    return axes is not None and int(axes[-1]) % len(axes) == len(axes) - 1


def _static_shape(expr) -> tuple[int, ...] | None:
    values = getattr(getattr(expr.ty, "shape", None), "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return tuple(int(v) for v in values)


def _view(chain):
    """The index map of a layout chain: an index into its result -> the index into its source
    (TIR expressions), or None when a call of it is not one this reads (dynamic shapes, an
    unknown attribute)."""
    steps = []
    for call in chain:
        src, out = _static_shape(call.args[0]), _static_shape(call)
        if src is None or out is None:
            return None
        name = call.op.name
        if name == "relax.reshape":
            steps.append(_reshape_step(src, out))
        elif name == "relax.permute_dims":
            axes = call.attrs.axes
            perm = [int(a) for a in axes] if axes is not None else list(range(len(src)))[::-1]
            steps.append(_permute_step(perm))
        else:
            step = _slice_step(call, src)
            if step is None:
                return None
            steps.append(step)

    def source_index(index):
        for step in reversed(steps):
            index = step(index)
        return index

    return source_index


def _reshape_step(src, out):
    src_strides = [prod(src[d + 1:]) for d in range(len(src))]
    out_strides = [prod(out[d + 1:]) for d in range(len(out))]

    def step(index):
        flat = sum(i * s for i, s in zip(index, out_strides))
        return [flat // s % n if d else flat // s for d, (s, n) in enumerate(zip(src_strides, src))]

    return step


def _permute_step(perm):
    def step(index):
        src = [None] * len(perm)
        for d, axis in enumerate(perm):
            src[axis] = index[d]
        return src

    return step


def _slice_step(call, src):
    """A strided slice with constant bounds: source index = begin + index * stride."""
    args = call.args[1:] if len(call.args) > 1 else ()
    try:
        axes, begin, _end, *strides = (list(_ints(a)) for a in args[:4])
    except (TypeError, ValueError, AttributeError):
        return None
    strides = strides[0] if strides else [1] * len(axes)
    if any(s < 1 for s in strides) or any(b < 0 for b in begin):
        return None
    offsets = {int(a) % len(src): (b, s) for a, b, s in zip(axes, begin, strides)}

    def step(index):
        return [offsets[d][0] + i * offsets[d][1] if d in offsets else i for d, i in enumerate(index)]

    return step


def _ints(expr):
    """The integers of a Relax tuple or shape of constants."""
    from tvm import relax

    if isinstance(expr, relax.ShapeExpr):
        return [int(v) for v in expr.values]
    if isinstance(expr, relax.Tuple):
        return [int(f.value) for f in expr.fields]
    raise TypeError(f"not a tuple of constants: {type(expr).__name__}")


def _fusion(matmul, end, out_chain, bindings, users, ends) -> Fusion | None:
    """The fusion of `matmul` with the most of its chains (operands', output's) whose fused
    expression is a matmul with contiguous rows (`_reads_as_matmul`), None when none is."""
    a, b = matmul.args
    (a_src, a_chain), (b_src, b_chain) = _input_chain(a, bindings, users, ends), _input_chain(b, bindings, users, ends)
    shapes = [_static_shape(e) for e in (a, b, matmul)]
    dtypes = {str(e.ty.dtype) for e in (a, b, matmul)}
    if any(s is None for s in shapes) or len(dtypes) != 1 or min(len(shapes[0]), len(shapes[1])) < 2:
        return None
    (dtype,) = dtypes
    options = [((a, ()), (a_src, a_chain)) if a_chain else ((a, ()),),
               ((b, ()), (b_src, b_chain)) if b_chain else ((b, ()),),
               ((matmul, ()), (end, out_chain)) if out_chain else ((matmul, ()),)]
    choices = sorted(product(*options), key=lambda c: -sum(bool(chain) for _, chain in c))
    for (a_in, a_fused), (b_in, b_fused), (out, out_fused) in choices:
        chains = a_fused + b_fused + out_fused
        if not any(c.op.name == "relax.permute_dims" for c in chains):
            continue  # no transpose: a Flatten's reshape is the classifier's own layout
        if not all(_keeps_last(c) for c in out_fused):
            continue  # the write-back would store along a strided dimension
        compute = _compute(*shapes, a_fused, b_fused, out_fused, _static_shape(out))
        if compute is not None and _reads_as_matmul(compute, _static_shape(a_in), _static_shape(b_in), dtype):
            return Fusion(a_in, b_in, compute, end if out_fused else None)
    return None


def _compute(a_shape, b_shape, mm_shape, a_chain, b_chain, out_chain, out_shape):
    """`compute(lhs, rhs)`: the TE matmul of `a_shape @ b_shape` reading its operands through
    their chains from the chains' sources and writing through the output chain, or None."""
    from tvm import te

    views = [_view(c) for c in (a_chain, b_chain, out_chain)]
    if any(v is None for v in views) or out_shape is None:
        return None
    a_view, b_view, out_view = views
    reduce_extent = a_shape[-1]

    def compute(lhs, rhs):
        k = te.reduce_axis((0, reduce_extent), name="k")

        def body(*r):
            analyzer = _bounded(zip(r + (k.var,), mm_shape + (reduce_extent,)))
            a_index = _broadcast(list(r[:-2]), a_shape[:-2]) + [r[-2], k.var]
            b_index = _broadcast(list(r[:-2]), b_shape[:-2]) + [k.var, r[-1]]
            a_at = tuple(analyzer.simplify(e) for e in a_view(a_index))
            b_at = tuple(analyzer.simplify(e) for e in b_view(b_index))
            return te.sum(lhs[a_at] * rhs[b_at], axis=k)

        product = te.compute(mm_shape, body, name="matmul")
        if not out_chain:
            return product

        def copy(*y):
            analyzer = _bounded(zip(y, out_shape))
            return product[tuple(analyzer.simplify(e) for e in out_view(list(y)))]

        return te.compute(out_shape, copy, name="T_layout")

    return compute


def _bounded(axes):
    """An analyzer that knows each axis's bounds, to simplify the chains' div/mod of a flat
    index to digits. An axis of extent 1 is left unbound: bound, it would simplify to 0 and
    vanish from the indices, and the expression would no longer read as a matmul (M or N
    indexed by nothing) at a length of 1."""
    from tvm.ir import Range
    from tvm.sym import Analyzer

    analyzer = Analyzer()
    for axis, extent in axes:
        if extent > 1:
            analyzer.bind(axis, Range.from_min_extent(0, extent))
    return analyzer


def _broadcast(batch, shape):
    """An operand's batch index from the result's: right-aligned, 0 where it broadcasts."""
    tail = batch[len(batch) - len(shape):] if shape else []
    return [i if n != 1 else 0 for i, n in zip(tail, shape)]


def _reads_as_matmul(compute, a_shape, b_shape, dtype) -> bool:
    """True when the fused TE maps to a TensorExpr that `matmul_params` reads as a matmul whose
    rows stay contiguous where the unfused one's are: the reduction along the left operand's
    last dimension, the right operand's and the output's last dimension along N (the axis the
    CPU template vectorises; K's transpose to `[b, heads, dh, s]` moves N off it and stays a
    copy)."""
    from tvm import te

    from workbench.errors import UserError
    from workbench.models.symbolic import matmul_params
    from workbench.ops.tensor_expr import from_te

    lhs, rhs = te.placeholder(a_shape, dtype, "a"), te.placeholder(b_shape, dtype, "b")
    try:
        expr = from_te("matmul", {}, [lhs, rhs], compute(lhs, rhs), dtype)
    except (UserError, ValueError):
        return False
    params = matmul_params(expr)
    if params is None or params["trans_a"] or params["trans_b"]:
        return False
    left, right = expr.inputs
    innermost = expr.spatial[-1]
    return right.uses_axis(innermost) and not left.uses_axis(innermost) and _unit_stride(right, innermost) \
        and _unit_stride(expr.output, innermost)


def _unit_stride(tensor, axis) -> bool:
    """True when `axis` indexes the last dimension of `tensor` with coefficient 1."""
    coeffs, _ = tensor.index[-1]
    return coeffs[axis] == 1
