"""The safe expression language: `C[i,j] += A[i,k] * B[k,j]` -> TE -> TensorExpr.

`expr_syntax` turns the text into frozen AST values (never Python's eval/exec/ast, so
`__import__('os')` is just a parse error); this module checks what the statement means and builds
it. Output axes (the plain, distinct names on the left) are spatial; axes that appear only on the
right are reduce axes, allowed only with a reducing assignment (+=, *=, max=, min=). Input shapes
are inferred, per dimension, as the largest index value + 1.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass

from workbench.ops.expr_syntax import Binary, Call, Expr, Index, Negate, Number, Ref, fail, parse_statement
from workbench.ops.shapes import MAX_ELEMENTS, check_dtype, check_elements


@dataclass(frozen=True)
class Statement:
    """`target op value`, checked: see `parse`."""

    target: Ref
    op: str  # "=" or one of expr_syntax.REDUCING
    value: Expr
    refs: tuple[Ref, ...]  # tensor references on the right, in text order

    @property
    def spatial_axes(self) -> tuple[str, ...]:
        return tuple(index.terms[0][0] for index in self.target.indices)

    @property
    def reduce_axes(self) -> tuple[str, ...]:
        right = _unique(a for ref in self.refs for index in ref.indices for a, _ in index.terms)
        return tuple(a for a in right if a not in self.spatial_axes)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input tensor names in order of first appearance (the call order)."""
        return _unique(ref.tensor for ref in self.refs)


def _unique(items) -> tuple:
    return tuple(dict.fromkeys(items))


def parse(text: str) -> Statement:
    """Parse and check one statement; every problem is a UserError naming it (and its column)."""
    target, op, value = parse_statement(text)
    refs = tuple(_refs(value))
    statement = Statement(target, op, value, refs)
    _check(statement)
    return statement


def _refs(node: Expr):
    if isinstance(node, Ref):
        yield node
    elif isinstance(node, Call):
        for arg in node.args:
            yield from _refs(arg)
    elif isinstance(node, Binary):
        yield from _refs(node.left)
        yield from _refs(node.right)
    elif isinstance(node, Negate):
        yield from _refs(node.operand)


def _check(st: Statement) -> None:
    out = st.target
    for index in out.indices:
        if len(index.terms) != 1 or index.terms[0][1] != 1 or index.const:
            raise fail(f"output index '{index}' of {out.tensor} (column {index.column}) must be a plain axis name")
    if len(set(st.spatial_axes)) != len(st.spatial_axes):
        raise fail(f"output {out.tensor} repeats an axis: [{', '.join(st.spatial_axes)}]")
    if not st.refs:
        raise fail("the right side reads no tensor")
    first: dict[str, Ref] = {}
    for ref in st.refs:
        if ref.tensor == out.tensor:
            raise fail(f"output tensor {out.tensor} also appears on the right (column {ref.column})")
        seen = first.setdefault(ref.tensor, ref)
        if len(seen.indices) != len(ref.indices):
            raise fail(f"tensor {ref.tensor} is used with {len(seen.indices)} and {len(ref.indices)} indices")
        if _maps(seen) != _maps(ref):
            # A TensorExpr keeps one affine index map per tensor (Roller's data tiles assume it).
            raise fail(f"tensor {ref.tensor} is read with different indices at columns {seen.column} and {ref.column}")
    clash = set(first) & (set(st.spatial_axes) | set(st.reduce_axes))
    if clash:
        raise fail(f"{min(clash)!r} is used both as a tensor and as an axis")
    if st.reduce_axes and st.op == "=":
        raise fail(
            f"axis {st.reduce_axes[0]!r} appears only on the right: use a reducing assignment (+=, *=, max=, min=)"
        )
    if st.op != "=" and not st.reduce_axes:
        raise fail(f"'{st.op}' needs an axis that appears only on the right; use '=' for an elementwise statement")


def _maps(ref: Ref) -> tuple:
    return tuple((dict(index.terms), index.const) for index in ref.indices)


def check_extents(st: Statement, extents: Mapping[str, int]) -> dict[str, int]:
    """Extents of all axes of `st`, spatial then reduce; each must be given, none unknown."""
    axes = st.spatial_axes + st.reduce_axes
    unknown = sorted(set(extents) - set(axes))
    if unknown:
        raise fail(f"extent given for {unknown[0]!r}, which is not an axis (axes: {', '.join(axes)})")
    missing = [a for a in axes if a not in extents]
    if missing:
        raise fail(f"no extent for axis {missing[0]!r}; give it with --shape {missing[0]}=N")
    for axis in axes:
        value = extents[axis]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ELEMENTS:
            raise fail(f"extent of {axis} must be a positive integer up to {MAX_ELEMENTS}, got {value!r}")
    return {a: extents[a] for a in axes}


def tensor_shapes(st: Statement, extents: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor, the inputs (in call order) then the output.

    An input dimension is as long as its largest index value + 1; an index that can go below 0
    is an error.
    """
    ext = check_extents(st, extents)
    shapes: dict[str, list[int]] = {}
    for ref in st.refs:
        dims = shapes.setdefault(ref.tensor, [1] * len(ref.indices))
        for d, index in enumerate(ref.indices):
            low = index.const + sum(c * (ext[a] - 1) for a, c in index.terms if c < 0)
            high = index.const + sum(c * (ext[a] - 1) for a, c in index.terms if c > 0)
            if low < 0:
                raise fail(f"index '{index}' of {ref.tensor} (column {index.column}) goes below 0, down to {low}")
            dims[d] = max(dims[d], high + 1)
    out = {name: tuple(dims) for name, dims in shapes.items()}
    out[st.target.tensor] = tuple(ext[a] for a in st.spatial_axes)
    for name, shape in out.items():
        check_elements(name, shape)
    return out


def build_te_from_expr(text: str, extents: Mapping[str, int], dtype: str = "float32") -> tuple[tuple, object]:
    """Parse `text` and build its TE tensors: (inputs in order of first appearance, output)."""
    from tvm import te

    check_dtype(dtype)
    st = parse(text)
    shapes, ext = tensor_shapes(st, extents), check_extents(st, extents)
    tensors = {name: te.placeholder(shapes[name], dtype=dtype, name=name) for name in st.inputs}
    reduce = {a: te.reduce_axis((0, ext[a]), name=a) for a in st.reduce_axes}

    def body(*spatial):
        env = dict(zip(st.spatial_axes, spatial)) | reduce
        value = _to_prim(st.value, env, tensors, dtype)
        return value if st.op == "=" else _reducer(st.op, dtype)(value, axis=list(reduce.values()))

    target = st.target.tensor
    out = te.compute(shapes[target], body, name=target, varargs_names=list(st.spatial_axes))
    return tuple(tensors[name] for name in st.inputs), out


def build_expr(text: str, extents: Mapping[str, int], dtype: str = "float32"):
    """Build the statement `text` with axis extents `extents` as a TensorExpr with op "expr"."""
    from workbench.ops.tensor_expr import from_te

    inputs, output = build_te_from_expr(text, extents, dtype)
    return from_te("expr", {"expr": text, **extents}, inputs, output, dtype)


_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _to_prim(node: Expr, env: Mapping, tensors: Mapping, dtype: str):
    import tvm

    if isinstance(node, Number):
        return tvm.tirx.const(node.value, dtype)
    if isinstance(node, Ref):
        return tensors[node.tensor][tuple(_index(index, env) for index in node.indices)]
    if isinstance(node, Negate):
        return -_to_prim(node.operand, env, tensors, dtype)
    if isinstance(node, Binary):
        return _BINARY[node.op](_to_prim(node.left, env, tensors, dtype), _to_prim(node.right, env, tensors, dtype))
    args = [_to_prim(arg, env, tensors, dtype) for arg in node.args]
    return _function(node.func)(*args)


def _function(name: str):
    import tvm

    # Keys are expr_syntax.FUNCTIONS; with two arguments tirx.max/min are elementwise.
    tirx = tvm.tirx
    table = {"max": tirx.max, "min": tirx.min, "exp": tirx.exp, "sqrt": tirx.sqrt, "tanh": tirx.tanh}
    return (table | {"abs": tirx.abs, "sigmoid": tirx.sigmoid, "log": tirx.log})[name]


def _index(index: Index, env: Mapping):
    terms = [env[axis] if coeff == 1 else env[axis] * coeff for axis, coeff in index.terms]
    if not terms:
        return index.const
    value = functools.reduce(operator.add, terms)
    return value + index.const if index.const else value


def _reducer(op: str, dtype: str):
    import tvm
    from tvm import te

    if op == "*=":
        return te.comm_reducer(lambda x, y: x * y, lambda t: tvm.tirx.const(1, dtype=t), name="prod")
    return {"+=": te.sum, "max=": te.max, "min=": te.min}[op]
