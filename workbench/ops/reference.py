"""Numpy references: the oracle every generated kernel is checked against.

Each catalog operator has a direct numpy formulation with the catalog's semantics (padding as
zeros, maxpool padding as the dtype's lowest value, avgpool dividing by K*K, gelu's tanh form).
Expressions (`op == "expr"`) are evaluated from their parsed AST by broadcasting index arrays
over the axes, never by handing text to Python. Everything is computed in float64 and returned
in the expression's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import pi, prod, sqrt

import numpy as np

from workbench.errors import UserError
from workbench.ops import catalog
from workbench.ops.expr_lang import Statement, check_extents, parse, tensor_shapes
from workbench.ops.expr_syntax import Binary, Call, Expr, Negate, Number, Ref

# Largest number of elements broadcast over the axes in one step of an expression's evaluation
# (~32 MB of float64 per temporary); bigger iteration spaces are split and recombined.
CHUNK_ELEMENTS = 1 << 22


def input_shapes(expr) -> tuple[tuple[int, ...], ...]:
    """Shapes of the kernel's input arguments in call order.

    Not `expr.tensors[i].shape`: that is the shape the main block reads, which for a padded
    operator is the padded tensor.
    """
    params = dict(expr.params)
    if expr.op == "expr":
        st = parse(params.pop("expr"))
        shapes = tensor_shapes(st, params)
        return tuple(shapes[name] for name in st.inputs)
    inputs, _ = catalog.build_te(expr.op, params, expr.dtype)
    return tuple(tuple(int(d) for d in t.shape) for t in inputs)


def random_inputs(expr, seed: int = 0) -> list[np.ndarray]:
    """Uniform [-1, 1] inputs in the expression's dtype (float32 by default), in call order."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=shape).astype(expr.dtype) for shape in input_shapes(expr)]


def reference(expr, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The operator's output for `inputs` (in call order), computed with numpy."""
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    _check_inputs(input_shapes(expr), arrays)
    params = dict(expr.params)
    with np.errstate(all="ignore"):  # log/sqrt of negatives give nan, as the kernel does
        if expr.op == "expr":
            text = params.pop("expr")
            out = evaluate(parse(text), params, arrays)
        else:
            p = catalog.normalize_params(expr.op, params)
            out = _CATALOG[expr.op](p, arrays, expr.dtype)
    return np.asarray(out).astype(expr.dtype)


def _check_inputs(shapes: Sequence[tuple[int, ...]], arrays: Sequence[np.ndarray]) -> None:
    if len(arrays) != len(shapes):
        raise UserError(f"the operator takes {len(shapes)} inputs, got {len(arrays)}")
    for position, (shape, array) in enumerate(zip(shapes, arrays)):
        if tuple(array.shape) != tuple(shape):
            raise UserError(f"input {position} has shape {tuple(array.shape)}, the operator needs {tuple(shape)}")


def _matmul(p: Mapping, arrays: list, dtype: str) -> np.ndarray:
    a, b = arrays
    a = np.swapaxes(a, -1, -2) if p["trans_a"] else a
    b = np.swapaxes(b, -1, -2) if p["trans_b"] else b
    return a @ b


def _padded(x: np.ndarray, pad: int, value: float) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=value)


def _windows(x: np.ndarray, kh: int, kw: int, stride: int, dilation: int = 1):
    """Yield (r, s, x[:, :, h*stride + r*dilation, w*stride + s*dilation]) over the output h, w."""
    oh = (x.shape[2] - dilation * (kh - 1) - 1) // stride + 1
    ow = (x.shape[3] - dilation * (kw - 1) - 1) // stride + 1
    for r in range(kh):
        for s in range(kw):
            y0, x0 = r * dilation, s * dilation
            yield r, s, x[:, :, y0 : y0 + stride * (oh - 1) + 1 : stride, x0 : x0 + stride * (ow - 1) + 1 : stride]


def _conv2d(p: Mapping, arrays: list, dtype: str) -> np.ndarray:
    data, kernel = arrays
    x = _padded(data, p["pad"], 0.0)
    parts = _windows(x, p["KH"], p["KW"], p["stride"], p["dilation"])
    return sum(np.einsum("nchw,fc->nfhw", patch, kernel[:, :, r, s]) for r, s, patch in parts)


def _depthwise_conv2d(p: Mapping, arrays: list, dtype: str) -> np.ndarray:
    data, kernel = arrays
    mult = p["multiplier"]
    # kernel[c*mult + j, 0] is the filter of output channel j of input channel c
    k = kernel.reshape(p["C"], mult, p["KH"], p["KW"])
    x = _padded(data, p["pad"], 0.0)
    out = sum(
        np.einsum("nchw,cj->ncjhw", patch, k[:, :, r, s]) for r, s, patch in _windows(x, p["KH"], p["KW"], p["stride"])
    )
    return out[:, :, 0] if mult == 1 else out


def _pool(p: Mapping, arrays: list, dtype: str, kind: str) -> np.ndarray:
    (data,) = arrays
    if kind == "maxpool":
        x = _padded(data, p["pad"], float(np.finfo(dtype).min))
        return np.maximum.reduce([patch for _, _, patch in _windows(x, p["K"], p["K"], p["stride"])])
    x = _padded(data, p["pad"], 0.0)
    return sum(patch for _, _, patch in _windows(x, p["K"], p["K"], p["stride"])) / (p["K"] * p["K"])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(sqrt(2.0 / pi) * (x + 0.044715 * x**3)))


def _reduce(p: Mapping, arrays: list, dtype: str, kind: str) -> np.ndarray:
    (x,) = arrays
    total = np.sum(x, axis=tuple(p["axes"]))
    return total if kind == "reduce_sum" else total / prod(p["shape"][d] for d in p["axes"])


_CATALOG = {
    "matmul": _matmul,
    "gemv": lambda p, arrays, dtype: arrays[0] @ arrays[1],
    "conv2d": _conv2d,
    "depthwise_conv2d": _depthwise_conv2d,
    "relu": lambda p, arrays, dtype: np.maximum(arrays[0], 0.0),
    "add": lambda p, arrays, dtype: arrays[0] + arrays[1],
    "gelu": lambda p, arrays, dtype: _gelu(arrays[0]),
    "avgpool": lambda p, arrays, dtype: _pool(p, arrays, dtype, "avgpool"),
    "maxpool": lambda p, arrays, dtype: _pool(p, arrays, dtype, "maxpool"),
    "reduce_sum": lambda p, arrays, dtype: _reduce(p, arrays, dtype, "reduce_sum"),
    "reduce_mean": lambda p, arrays, dtype: _reduce(p, arrays, dtype, "reduce_mean"),
}


def evaluate(st: Statement, extents: Mapping[str, int], arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Evaluate a parsed statement on `arrays` (its inputs in call order), in float64."""
    ext = check_extents(st, extents)
    shapes = tensor_shapes(st, extents)
    _check_inputs(tuple(shapes[name] for name in st.inputs), arrays)
    tensors = dict(zip(st.inputs, arrays))
    if _is_einsum(st):
        return _einsum(st, tensors)
    order = st.spatial_axes + st.reduce_axes
    return _evaluate_box(st, order, tuple((0, ext[a]) for a in order), tensors)


def _factors(node: Expr) -> list:
    if isinstance(node, Binary) and node.op == "*":
        return _factors(node.left) + _factors(node.right)
    return [node]


def _is_einsum(st: Statement) -> bool:
    """A sum of products of plainly indexed tensors (matmul, batched matmul, contractions)."""
    plain = all(len(i.terms) == 1 and i.terms[0][1] == 1 and i.const == 0 for ref in st.refs for i in ref.indices)
    return st.op == "+=" and plain and all(isinstance(f, Ref) for f in _factors(st.value))


def _einsum(st: Statement, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    # einsum takes single letters; an expression has at most 52 distinct axes here
    letters = dict(zip(st.spatial_axes + st.reduce_axes, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    refs = _factors(st.value)
    subscripts = ",".join("".join(letters[i.terms[0][0]] for i in ref.indices) for ref in refs)
    output = "".join(letters[a] for a in st.spatial_axes)
    return np.einsum(f"{subscripts}->{output}", *(tensors[ref.tensor] for ref in refs), optimize=True)


_COMBINE = {"+=": np.add, "*=": np.multiply, "max=": np.maximum, "min=": np.minimum}


def _evaluate_box(st: Statement, order: tuple[str, ...], box: tuple, tensors: Mapping) -> np.ndarray:
    """The output block over `box` (a (lo, hi) range per axis, spatial axes first).

    A box too big to broadcast at once is halved along its longest axis: halves of a spatial
    axis are concatenated, halves of a reduce axis combined with the statement's reduction.
    """
    sizes = [hi - lo for lo, hi in box]
    n_spatial = len(st.spatial_axes)
    if prod(sizes) > CHUNK_ELEMENTS and max(sizes) > 1:
        d = int(np.argmax(sizes))
        lo, hi = box[d]
        mid = (lo + hi) // 2
        halves = [
            _evaluate_box(st, order, box[:d] + (part,) + box[d + 1 :], tensors) for part in ((lo, mid), (mid, hi))
        ]
        return np.concatenate(halves, axis=d) if d < n_spatial else _COMBINE[st.op](*halves)
    grids = {
        axis: np.arange(lo, hi).reshape([-1 if k == d else 1 for k in range(len(order))])
        for d, (axis, (lo, hi)) in enumerate(zip(order, box))
    }
    value = np.broadcast_to(_node(st.value, grids, tensors), sizes)
    if st.op == "=":
        return np.array(value)
    return _COMBINE[st.op].reduce(value.reshape(sizes[:n_spatial] + [-1]), axis=-1)


_FUNCTIONS = {
    "max": np.maximum,
    "min": np.minimum,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "abs": np.abs,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "log": np.log,
}
_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def _node(node: Expr, grids: Mapping[str, np.ndarray], tensors: Mapping[str, np.ndarray]):
    if isinstance(node, Number):
        return np.float64(node.value)
    if isinstance(node, Ref):
        index = tuple(sum((c * grids[a] for a, c in i.terms), start=np.int64(i.const)) for i in node.indices)
        return tensors[node.tensor][index]
    if isinstance(node, Negate):
        return -_node(node.operand, grids, tensors)
    if isinstance(node, Binary):
        return _BINARY[node.op](_node(node.left, grids, tensors), _node(node.right, grids, tensors))
    assert isinstance(node, Call)
    return _FUNCTIONS[node.func](*(_node(arg, grids, tensors) for arg in node.args))
