"""The safe expression language: `C[i,j] += A[i,k] * B[k,j]` -> TE -> TensorExpr.

`expr_syntax` turns the text into frozen AST values (never Python's eval/exec/ast, so
`__import__('os')` is just a parse error); this module checks what the statement means and builds
it. Output axes (the plain, distinct names on the left) are spatial; axes that appear only on the
right are reduce axes, allowed only with a reducing assignment (+=, *=, max=, min=). Input shapes
are inferred, per dimension, as the largest index value + 1.

Before TVM sees a statement, `check_values` folds its constants the way TVM's simplifier would
(and a little further): a literal or constant outside the dtype's range, or a divisor that folds
to 0 (`A[i] / (A[i] - A[i])`), is a UserError naming its column instead of a TVM traceback.

An extent given as `dyn` (`--shape i=dyn`, Vortex: workbench/vortex) is refused everywhere but
`split_dynamic`, which names the dynamic axis (one output axis every tensor reads as a plain
index, `check_dynamic`), and `symbolic_func`, which builds the statement with it as `T * tile`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from workbench.errors import first_line
from workbench.ops.expr_syntax import Binary, Call, Expr, Index, Negate, Number, Ref, fail, parse_statement
from workbench.ops.catalog import DYN
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
        if isinstance(value, str) and value == DYN:
            raise fail(f"{axis}=dyn is a dynamic extent: compile it with `workbench vortex compile`, "
                       "which builds kernels for every value")
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
    check_dtype(dtype)
    st = parse(text)
    check_values(st, dtype)
    return _te(st, tensor_shapes(st, extents), check_extents(st, extents), dtype)


def _te(st: Statement, shapes: Mapping[str, tuple], ext: Mapping[str, int], dtype: str) -> tuple[tuple, object]:
    """The TE tensors of a checked statement with these tensor shapes (a dimension may be a
    symbolic TVM expression, `symbolic_func`) and these reduce-axis extents."""
    from tvm import te

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
    try:
        expr = from_te("expr", {"expr": text, **extents}, inputs, output, dtype)
    except RuntimeError as err:  # TVM's failed checks (tvm.error.InternalError and kin)
        # `check_values` refuses what is known to fail here; should TVM's simplifier still find
        # something to refuse in user text, it is the user's input, said in one line.
        raise fail(f"TVM refuses it: {first_line(err)}") from None
    if not expr.inputs:  # TVM cancels more than `check_values` folds: `max(A[i], A[i]) - A[i]`
        raise fail("the right side reads no tensor once TVM simplifies it (its terms cancel)")
    return expr


# ---- a dynamic extent (`--shape i=dyn`, Vortex: workbench/vortex) ---------------------------


def split_dynamic(text: str, extents: Mapping[str, object]) -> tuple[str, dict[str, int]]:
    """(the dynamic axis, every extent checked with that one set to 1) of a statement with one
    `dyn` extent; UserError when it has none or several, or when the axis cannot be dynamic
    (`check_dynamic`)."""
    st = parse(text)
    dynamic = sorted(a for a, v in extents.items() if isinstance(v, str) and v == DYN)
    if not dynamic:
        raise fail(f"no dynamic extent; give one output axis as dyn (e.g. {st.spatial_axes[0]}=dyn)")
    if len(dynamic) > 1:
        raise fail(f"one dynamic extent per workload, got {', '.join(dynamic)}")
    check_dynamic(st, dynamic[0])
    return dynamic[0], check_extents(st, {**extents, dynamic[0]: 1})


def check_dynamic(st: Statement, axis: str) -> None:
    """Refuse, in one line naming why, an axis that cannot be dynamic: Vortex pads it with
    zeros and slices the output, which is exact only when the axis is an output (spatial) axis
    that every tensor reads as a plain index (row r of the output reads only row r of the inputs,
    and a tensor's dimension is the axis's extent) and that at least one input reads."""
    if axis in st.reduce_axes:
        raise fail(f"{axis} is a reduce axis; only an output axis can be dyn ({', '.join(st.spatial_axes)})")
    if axis not in st.spatial_axes:
        raise fail(f"{axis} is not an axis of the statement (axes: {', '.join(st.spatial_axes + st.reduce_axes)})")
    read = False
    for ref in st.refs:
        for index in ref.indices:
            if axis not in dict(index.terms):
                continue
            if index.terms != ((axis, 1),) or index.const:
                raise fail(f"dyn axis {axis} is read as '{index}' in {ref.tensor} (column {index.column}); "
                           "a dyn axis must be read as a plain index")
            read = True
    if not read:
        raise fail(f"dyn axis {axis} is read by no input; a dyn axis must index an input as well as the output")


def symbolic_func(text: str, extents: Mapping[str, object], axis: str, tile: int, dtype: str = "float32"):
    """The statement's PrimFunc with axis `axis` of extent `T * tile` for an int32 variable T,
    its last argument (as `catalog.symbolic_func`). The other extents are checked as
    `check_extents` checks them; the element counts that depend on T are the caller's to check
    for each T it runs."""
    import tvm
    from tvm import te

    check_dtype(dtype)
    st = parse(text)
    check_values(st, dtype)
    check_dynamic(st, axis)
    ext = check_extents(st, {**extents, axis: tile})
    shapes = tensor_shapes(st, ext)
    steps = tvm.tirx.Var("T", "int32")
    # `check_dynamic`: a dimension the axis reaches is indexed by it alone, so it is the extent.
    indices = {ref.tensor: ref.indices for ref in st.refs} | {st.target.tensor: st.target.indices}
    symbolic = {name: tuple(steps * tile if i.terms == ((axis, 1),) else d for d, i in zip(shape, indices[name]))
                for name, shape in shapes.items()}
    inputs, output = _te(st, symbolic, ext, dtype)
    return te.create_prim_func([*inputs, output, steps])


# ---- constants: folded before TVM sees them -------------------------------------------------

# A value as `const + sum(coeff * term)`, `terms` a dict from a structural key of something not
# folded further (a tensor read, a call of non-constants, a product or quotient of non-constants)
# to its coefficient. So `x - x`, `2*x - x - x` and `0 * x` are the constant 0, as TVM folds them.
_Form = tuple[dict, float]

_CONSTANT_CALLS = {
    "max": max,
    "min": min,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "abs": abs,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "log": np.log,
}


def check_values(st: Statement, dtype: str) -> None:
    """Refuse, naming the column, a literal beyond `dtype`'s range or so small it rounds to 0, a
    constant subexpression (which TVM folds into one literal) that is not a finite number in
    `dtype`, and a division by something that folds to 0. TVM raises on the first and the
    last (`1e39` in float32, `1e5` in float16, `A[i] / (A[i] - A[i])`); the others would make
    every output inf or NaN. A right side whose every read cancels (`(B[i] - B[i]) * A[i]`) is
    refused as one that reads no tensor: its output is a constant that no kernel need compute
    and no verification can tell from a kernel writing that constant."""
    with np.errstate(all="ignore"):
        terms, const = _fold(st.value, np.finfo(dtype), dtype)
    if not terms:
        raise fail(f"the right side reads no tensor once its terms cancel (it folds to {const:g})")


def _fold(node: Expr, info, dtype: str) -> _Form:
    if isinstance(node, Number):
        value = node.value
        if not abs(value) <= info.max:
            raise fail(f"literal {value:g} at column {node.column} is beyond the range of {dtype} (largest {info.max:g})")
        if value != 0 and _rounds_to_zero(value, dtype):
            raise fail(f"literal {value:g} at column {node.column} rounds to 0 in {dtype} (smallest {info.smallest_subnormal:g})")
        return {}, value
    if isinstance(node, Ref):
        return {("ref", node.tensor): 1.0}, 0.0  # `_check` made every read of a tensor the same
    if isinstance(node, Negate):
        return _scale(_fold(node.operand, info, dtype), -1.0)
    if isinstance(node, Binary):
        form = _fold_binary(node, _fold(node.left, info, dtype), _fold(node.right, info, dtype), dtype)
    else:
        form = _fold_call(node, [_fold(arg, info, dtype) for arg in node.args])
    terms, const = form
    if not terms and not abs(const) <= info.max:
        raise fail(f"the constant {_text(node)} at column {node.column} folds to {const:g}, "
                   f"which is not a finite {dtype} (largest {info.max:g})")
    return form


def _fold_binary(node: Binary, left: _Form, right: _Form, dtype: str) -> _Form:
    if node.op in "+-":
        sign = 1.0 if node.op == "+" else -1.0
        terms = dict(left[0])
        for key, coeff in right[0].items():
            terms[key] = terms.get(key, 0.0) + sign * coeff
        return {k: c for k, c in terms.items() if c != 0}, left[1] + sign * right[1]
    if node.op == "*":
        if not left[0]:
            return _scale(right, left[1])
        if not right[0]:
            return _scale(left, right[1])
        return {("*",) + tuple(sorted((_key(left), _key(right)), key=repr)): 1.0}, 0.0
    if not right[0]:
        if right[1] == 0 or _rounds_to_zero(right[1], dtype):
            raise fail(f"division by zero at column {node.column}: the divisor {_text(node.right)} folds to 0")
        return _scale(left, 1.0 / right[1])
    return {("/", _key(left), _key(right)): 1.0}, 0.0


def _fold_call(node: Call, args: list[_Form]) -> _Form:
    if all(not terms for terms, _ in args):
        return {}, float(_CONSTANT_CALLS[node.func](*(const for _, const in args)))
    keys = [_key(arg) for arg in args]
    if node.func in ("max", "min"):
        if keys[0] == keys[1]:
            return args[0]  # max(x, x) is x
        keys.sort(key=repr)  # max(x, y) is max(y, x)
    return {("call", node.func, tuple(keys)): 1.0}, 0.0


def _scale(form: _Form, factor: float) -> _Form:
    terms, const = form
    if factor == 0:
        return {}, 0.0
    return {key: coeff * factor for key, coeff in terms.items()}, const * factor


def _key(form: _Form) -> tuple:
    terms, const = form
    return tuple(sorted(terms.items(), key=repr)), const


def _rounds_to_zero(value: float, dtype: str) -> bool:
    return float(np.asarray(value, dtype=dtype)) == 0


def _text(node: Expr, limit: int = 60) -> str:
    """A subexpression written back as text for a message, cut to about `limit` characters."""
    text = _written(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _written(node: Expr) -> str:
    if isinstance(node, Number):
        return f"{node.value:g}"
    if isinstance(node, Ref):
        return f"{node.tensor}[{','.join(str(index) for index in node.indices)}]"
    if isinstance(node, Negate):
        return f"-{_written(node.operand)}"
    if isinstance(node, Binary):
        return f"({_written(node.left)}{node.op}{_written(node.right)})"
    return f"{node.func}({', '.join(_written(arg) for arg in node.args)})"


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
