"""Numpy references: the oracle every generated kernel is checked against.

Each catalog operator has a direct numpy formulation with the catalog's semantics (padding as
zeros, maxpool padding as the dtype's lowest value, avgpool dividing by K*K, gelu's tanh form).
Expressions (`op == "expr"`) are evaluated from their parsed AST by broadcasting index arrays
over the axes, never by handing text to Python. Everything is computed in float64.

Besides its value, a reference carries, per output, the *error scale* of a correct kernel: how
far a kernel computing in the expression's dtype may land from the exact value, in units of
that dtype's machine epsilon. `codegen.verify` turns it into the tolerance; docs/verification.md
gives the whole argument. In short:

- Inside a term every operation rounds once: a first-order bound propagates the operands' errors
  and adds |result| (+, -, *, /), a literal adds |c|, a libm call (exp, log, tanh, sigmoid)
  `LIBM_ULPS` times its result; tanh also that many absolute units, as TVM lowers it to
  (1 - e^-2x) / (1 + e^-2x), which cancels near 0. Inputs are exact (drawn in the dtype).
- Roundings of different values are independent, so over a reduction their variances add.
  `+=` over K terms t_k with error scales m_k: sqrt(sum m_k^2 + sum_k S_k^2), S_k the partial
  sums, whose squares add up, in a random order of the terms, to about
  K/6 * sum t^2 + K/3 * (sum t)^2. That grows like K for zero-mean terms, so an O(1) mistake (a
  lost or doubled term) stays far above it, and like K^1.5 when the terms share a sign, where
  no float kernel does better. Runs of equal terms are the exception: adding one value r times
  in a row rounds the same way each time, so runs of r_g equal terms along a reduce axis
  multiply the variance by sum_g r_g^2 / K (counted from the terms themselves, e.g.
  `max(A[i], B[i,k] - 3)` that is always A[i]; the axis with the longest runs counts, as the
  kernel's tiling decides which one it walks innermost).
- `*=`: each term's error times the product of the other terms (equal factors counted as
  above), and the K roundings of the running product, each relative and so carried into the
  result as a relative error whatever the partial products' sizes:
  sqrt(sum (m_k * prod_{j!=k} |t_j|)^2 + K * P^2).
- `max=` / `min=` return one term: the largest term error.

`random_inputs` draws inputs per combiner so that the reference says something: products of
factors near +-1 (a uniform [-1, 1] product of 301 terms underflows to 0, and every kernel
"matches" 0), zero-mean sums, and operands kept in the domain of log / sqrt and away from zero
under a division.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import pi, prod, sqrt

import numpy as np

from workbench.errors import UserError
from workbench.ops import catalog
from workbench.ops.expr_lang import Statement, check_extents, parse, tensor_shapes
from workbench.ops.expr_syntax import Binary, Call, Expr, Negate, Number, Ref

# Largest number of elements broadcast over the axes in one step of an expression's evaluation
# (~32 MB of float64 per temporary); bigger iteration spaces are split and recombined.
CHUNK_ELEMENTS = 1 << 22
# Error of a libm call (exp, log, tanh, sigmoid), in ulps of its result: glibc's and CUDA's
# single-precision exp/log/tanh are within 1-2 ulps; twice that leaves room for TVM's lowering
# (sigmoid as 1 / (1 + exp(-x)) rounds three times).
LIBM_ULPS = 4
# Largest spread s of a `*=` input, |x| = exp(s * z) or s * z with z uniform in [-1, 1]: with
# s = 1 a factor exp(s * z) lies in [1/e, e], well inside every float type.
MAX_LOG_SPREAD = 1.0
# Inputs of an expression that takes log or sqrt, or divides by an input: uniform in this range
# (positive for log and sqrt; with a random sign otherwise), so operands stay in the function's
# domain and denominators stay at least 0.5 away from zero.
AWAY_FROM_ZERO = (0.5, 1.5)


@dataclass(frozen=True)
class Reference:
    """The float64 output of an operator and, per output, the error scale of a correct kernel
    (in units of the dtype's eps, the rounding of the output itself excluded)."""

    value: np.ndarray
    scale: np.ndarray


def input_shapes(expr) -> tuple[tuple[int, ...], ...]:
    """Shapes of the kernel's input arguments in call order.

    Not `expr.tensors[i].shape`: that is the shape the main block reads, which for a padded
    operator is the padded tensor.
    """
    return tuple(arg.shape for arg in expr.args if arg.role == "input")


def random_inputs(expr, seed: int = 0) -> list[np.ndarray]:
    """Inputs in the expression's dtype, in call order, drawn for its combiner (module docstring).

    Catalog operators and `+=`, `max=`, `min=`, `=` expressions: uniform in [-1, 1] (zero-mean
    sums; continuous values, so ties in a max or min are improbable). Expressions that take log
    or sqrt, or divide by something that reads an input: magnitudes in AWAY_FROM_ZERO (positive
    for log and sqrt). `*=`: see `_product_inputs`.
    """
    rng = np.random.default_rng(seed)
    shapes = input_shapes(expr)
    if expr.op != "expr":
        return [rng.uniform(-1.0, 1.0, size=shape).astype(expr.dtype) for shape in shapes]
    params = dict(expr.params)
    st = parse(params.pop("expr"))
    positive = _calls(st.value, ("log", "sqrt"))
    away = positive or _divides_by_input(st.value)
    if st.op == "*=":
        return _product_inputs(expr, st, params, shapes, rng, away, positive)
    out = []
    for shape in shapes:
        if not away:
            x = rng.uniform(-1.0, 1.0, size=shape)
        elif positive:
            x = rng.uniform(*AWAY_FROM_ZERO, size=shape)
        else:
            x = rng.uniform(*AWAY_FROM_ZERO, size=shape) * rng.choice((-1.0, 1.0), size=shape)
        out.append(x.astype(expr.dtype))
    return out


def _product_inputs(expr, st: Statement, params, shapes, rng, away: bool, positive: bool) -> list[np.ndarray]:
    """Inputs of a `*=` expression: factors near 1 in magnitude, so a product of K of them
    neither under- nor overflows (uniform [-1, 1] factors shrink it by e^-1 per term on average).

    With s chosen from K terms of R tensor reads each so that log|product| has a standard
    deviation of about 1 whatever K is, each input is drawn two ways: +-exp(s * z), z uniform in
    [-1, 1] (signs random unless log or sqrt needs them positive), for a factor that is a read,
    and (unless inputs must stay away from zero) s * z, for a factor near 1 when its input is
    near 0 (exp(x), 1 + x). Starting from the first way for every input, each input in turn
    takes the second where that brings the outputs closer to 1 (median |log|output||).
    """
    terms = prod(check_extents(st, params)[a] for a in st.reduce_axes)
    spread = min(MAX_LOG_SPREAD, sqrt(3.0 / (terms * len(st.refs))))

    def signed(x):
        return x if positive else x * rng.choice((-1.0, 1.0), size=x.shape)

    chosen = [signed(np.exp(spread * rng.uniform(-1.0, 1.0, size=shape))).astype(expr.dtype) for shape in shapes]
    if away:
        return chosen
    near_zero = [(spread * rng.uniform(-1.0, 1.0, size=shape)).astype(expr.dtype) for shape in shapes]
    distance = _distance_from_one(expr, chosen)
    for i, x in enumerate(near_zero):
        trial = chosen[:i] + [x] + chosen[i + 1 :]
        closer = _distance_from_one(expr, trial)
        if closer < distance:
            chosen, distance = trial, closer
    return chosen


def _distance_from_one(expr, inputs) -> float:
    """Median over the outputs of |log|output||; infinite when an output is 0 or not finite."""
    with np.errstate(all="ignore"):
        logs = np.abs(np.log(np.abs(reference(expr, inputs))))
    return float(np.median(logs)) if np.all(np.isfinite(logs)) else float("inf")


def _calls(node: Expr, names: tuple[str, ...]) -> bool:
    if isinstance(node, Call):
        return node.func in names or any(_calls(a, names) for a in node.args)
    if isinstance(node, Binary):
        return _calls(node.left, names) or _calls(node.right, names)
    if isinstance(node, Negate):
        return _calls(node.operand, names)
    return False


def _reads(node: Expr) -> bool:
    if isinstance(node, Ref):
        return True
    if isinstance(node, Call):
        return any(_reads(a) for a in node.args)
    if isinstance(node, Binary):
        return _reads(node.left) or _reads(node.right)
    return isinstance(node, Negate) and _reads(node.operand)


def _divides_by_input(node: Expr) -> bool:
    if isinstance(node, Binary):
        here = node.op == "/" and _reads(node.right)
        return here or _divides_by_input(node.left) or _divides_by_input(node.right)
    if isinstance(node, Call):
        return any(_divides_by_input(a) for a in node.args)
    return isinstance(node, Negate) and _divides_by_input(node.operand)


def reference(expr, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The operator's output for `inputs` (in call order), computed with numpy in float64."""
    return reference_with_scale(expr, inputs).value


def reference_with_scale(expr, inputs: Sequence[np.ndarray]) -> Reference:
    """The float64 output and the per-output error scale of a correct kernel (module docstring)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    _check_inputs(input_shapes(expr), arrays)
    params = dict(expr.params)
    with np.errstate(all="ignore"):  # log/sqrt of negatives give nan, as the kernel does
        if expr.op == "expr":
            text = params.pop("expr")
            value, scale = _evaluate(parse(text), params, arrays)
        else:
            p = catalog.normalize_params(expr.op, params)
            value, scale = _CATALOG[expr.op](p, arrays, expr.dtype)
    value = np.asarray(value, dtype=np.float64)
    if any(np.may_share_memory(value, a) for a in arrays):  # an output that is an input's view
        value = value.copy()
    # A constant scale stays one value broadcast (read-only): copying it out to the output's size
    # cost relu's 12.8 M outputs 0.1-0.2 s of fresh pages, for nothing `codegen.verify` needs.
    return Reference(value, np.broadcast_to(np.asarray(scale, dtype=np.float64), value.shape))


def _check_inputs(shapes: Sequence[tuple[int, ...]], arrays: Sequence[np.ndarray]) -> None:
    if len(arrays) != len(shapes):
        raise UserError(f"the operator takes {len(shapes)} inputs, got {len(arrays)}")
    for position, (shape, array) in enumerate(zip(shapes, arrays)):
        if tuple(array.shape) != tuple(shape):
            raise UserError(f"input {position} has shape {tuple(array.shape)}, the operator needs {tuple(shape)}")


# ---- reductions: statistics of the terms, combined over chunks, then a value and a scale ------


def _sum_scale(total, squares, error_squares, terms: int, repeats=None):
    """Scale of a sum of `terms` terms from the sum, the sum of squares of the terms and of their
    error scales: independent roundings, so variances add (module docstring). `repeats` is
    sum_g r_g^2 over runs of r_g consecutive equal terms (`terms` when none repeat): adding one
    value r times in a row rounds the same way each time, r times one rounding, which raises
    the variance by repeats / terms."""
    spread = 1.0 if repeats is None else repeats / terms
    return np.sqrt(spread * (terms * squares / 6.0 + terms * np.square(total) / 3.0 + error_squares))


def _bilinear(f, a, b, terms: int):
    """Value and scale of `f(a, b)`, a sum of `terms` products a * b (one rounding each, so a
    term's error scale is |a * b| and the sum of their squares that of the terms)."""
    value = f(a, b)
    squares = f(np.square(a), np.square(b))
    return value, _sum_scale(value, squares, squares, terms)


# ---- catalog operators ----------------------------------------------------------------------


def _matmul(p: Mapping, arrays: list, dtype: str):
    a, b = arrays
    a = np.swapaxes(a, -1, -2) if p["trans_a"] else a
    b = np.swapaxes(b, -1, -2) if p["trans_b"] else b
    return _bilinear(np.matmul, a, b, p["K"])


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


def _conv2d(p: Mapping, arrays: list, dtype: str):
    def conv(data, kernel):
        x = _padded(data, p["pad"], 0.0)
        parts = _windows(x, p["KH"], p["KW"], p["stride"], p["dilation"])
        return sum(np.einsum("nchw,fc->nfhw", patch, kernel[:, :, r, s]) for r, s, patch in parts)

    return _bilinear(conv, *arrays, p["C"] * p["KH"] * p["KW"])


def _group_conv2d(p: Mapping, arrays: list, dtype: str):
    groups = p["groups"]
    cg, fg = p["C"] // groups, p["F"] // groups

    def conv(data, kernel):
        # group g: input channels g*cg .. (g+1)*cg - 1 -> output channels g*fg .. (g+1)*fg - 1
        n = data.shape[0]
        k = kernel.reshape(groups, fg, cg, p["KH"], p["KW"])
        parts = _windows(_padded(data, p["pad"], 0.0), p["KH"], p["KW"], p["stride"], p["dilation"])
        out = sum(
            np.einsum("ngchw,gfc->ngfhw", patch.reshape(n, groups, cg, *patch.shape[2:]), k[:, :, :, r, s])
            for r, s, patch in parts
        )
        return out.reshape(n, groups * fg, *out.shape[3:])

    return _bilinear(conv, *arrays, cg * p["KH"] * p["KW"])


def _depthwise_conv2d(p: Mapping, arrays: list, dtype: str):
    mult = p["multiplier"]

    def conv(data, kernel):
        # kernel[c*mult + j, 0] is the filter of output channel j of input channel c
        k = kernel.reshape(p["C"], mult, p["KH"], p["KW"])
        x = _padded(data, p["pad"], 0.0)
        windows = _windows(x, p["KH"], p["KW"], p["stride"])
        out = sum(np.einsum("nchw,cj->ncjhw", patch, k[:, :, r, s]) for r, s, patch in windows)
        return out[:, :, 0] if mult == 1 else out

    return _bilinear(conv, *arrays, p["KH"] * p["KW"])


def _pool(p: Mapping, arrays: list, dtype: str, kind: str):
    (data,) = arrays
    if kind == "maxpool":  # one input returned exactly
        x = _padded(data, p["pad"], float(np.finfo(dtype).min))
        return np.maximum.reduce([patch for _, _, patch in _windows(x, p["K"], p["K"], p["stride"])]), 0.0

    def window_sum(y):
        return sum(patch for _, _, patch in _windows(_padded(y, p["pad"], 0.0), p["K"], p["K"], p["stride"]))

    area = p["K"] * p["K"]
    total = window_sum(data)
    return _mean(total, _sum_scale(total, window_sum(np.square(data)), 0.0, area), area)


def _mean(total, scale, count: int):
    """`total / count` and its scale: the sum's scaled down, plus the division's rounding."""
    value = total / count
    return value, scale / count + np.abs(value)


# gelu in the expression language: its value and scale come from the same evaluator as any
# expression's (the constants are the catalog's, sqrt(2/pi) written out to float64 precision).
_GELU = parse(f"Y[i] = 0.5 * X[i] * (1 + tanh({sqrt(2.0 / pi)!r} * (X[i] + 0.044715 * X[i] * X[i] * X[i])))")


def _gelu(p: Mapping, arrays: list, dtype: str):
    (x,) = arrays
    value, scale = _evaluate(_GELU, {"i": x.size}, [x.reshape(-1)])
    return value.reshape(x.shape), scale.reshape(x.shape)


def _reduce(p: Mapping, arrays: list, dtype: str, kind: str):
    (x,) = arrays
    axes = tuple(p["axes"])
    count = prod(p["shape"][d] for d in axes)
    total = np.sum(x, axis=axes)
    scale = _sum_scale(total, np.sum(np.square(x), axis=axes), 0.0, count)
    return (total, scale) if kind == "reduce_sum" else _mean(total, scale, count)


def _add(p: Mapping, arrays: list, dtype: str):
    value = arrays[0] + arrays[1]
    return value, np.abs(value)


_CATALOG = {
    "matmul": _matmul,
    "gemv": lambda p, arrays, dtype: _bilinear(np.matmul, arrays[0], arrays[1], p["K"]),
    "conv2d": _conv2d,
    "group_conv2d": _group_conv2d,
    "depthwise_conv2d": _depthwise_conv2d,
    "relu": lambda p, arrays, dtype: (np.maximum(arrays[0], 0.0), 0.0),
    "add": _add,
    "gelu": _gelu,
    "avgpool": lambda p, arrays, dtype: _pool(p, arrays, dtype, "avgpool"),
    "maxpool": lambda p, arrays, dtype: _pool(p, arrays, dtype, "maxpool"),
    "reduce_sum": lambda p, arrays, dtype: _reduce(p, arrays, dtype, "reduce_sum"),
    "reduce_mean": lambda p, arrays, dtype: _reduce(p, arrays, dtype, "reduce_mean"),
}


# ---- expressions ----------------------------------------------------------------------------


def evaluate(st: Statement, extents: Mapping[str, int], arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Evaluate a parsed statement on `arrays` (its inputs in call order), in float64."""
    with np.errstate(all="ignore"):
        return _evaluate(st, extents, arrays)[0]


def _evaluate(st: Statement, extents: Mapping[str, int], arrays: Sequence[np.ndarray]):
    """(value, scale) of a parsed statement on `arrays` (its inputs in call order)."""
    ext = check_extents(st, extents)
    shapes = tensor_shapes(st, extents)
    _check_inputs(tuple(shapes[name] for name in st.inputs), arrays)
    tensors = dict(zip(st.inputs, arrays))
    if _is_einsum(st):
        return _einsum(st, tensors, ext)
    order = st.spatial_axes + st.reduce_axes
    stats, terms = _evaluate_box(st, order, tuple((0, ext[a]) for a in order), tensors)
    return _finish(st.op, stats, terms)


def _factors(node: Expr) -> list:
    if isinstance(node, Binary) and node.op == "*":
        return _factors(node.left) + _factors(node.right)
    return [node]


def _is_einsum(st: Statement) -> bool:
    """A sum of products of plainly indexed tensors (matmul, batched matmul, contractions)."""
    plain = all(len(i.terms) == 1 and i.terms[0][1] == 1 and i.const == 0 for ref in st.refs for i in ref.indices)
    return st.op == "+=" and plain and all(isinstance(f, Ref) for f in _factors(st.value))


def _einsum(st: Statement, tensors: Mapping[str, np.ndarray], ext: Mapping[str, int]):
    """A sum of products by `np.einsum`. Output axes that no factor reads (`C[i,j] += A[i,k] *
    B[k]`) are left out of the einsum, which refuses them, and broadcast afterwards."""
    # einsum takes single letters; an expression has at most 52 distinct axes here
    letters = dict(zip(st.spatial_axes + st.reduce_axes, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    refs = _factors(st.value)
    read = {i.terms[0][0] for ref in refs for i in ref.indices}
    kept = [a for a in st.spatial_axes if a in read]
    subscripts = ",".join("".join(letters[i.terms[0][0]] for i in ref.indices) for ref in refs)
    spec = f"{subscripts}->{''.join(letters[a] for a in kept)}"
    shape = [ext[a] if a in read else 1 for a in st.spatial_axes]
    out = tuple(ext[a] for a in st.spatial_axes)

    def contract(f) -> np.ndarray:
        return np.broadcast_to(np.einsum(spec, *(f(tensors[r.tensor]) for r in refs), optimize=True).reshape(shape), out)

    value, squares = contract(lambda x: x), contract(np.square)
    terms = prod(ext[a] for a in st.reduce_axes)
    # a product of n exact factors rounds n - 1 times: error scale (n - 1) * |term|
    return value, _sum_scale(value, squares, (len(refs) - 1) ** 2 * squares, terms)


def _reduce_terms(op: str, value: np.ndarray, error: np.ndarray, n_reduce: int) -> tuple:
    """Statistics of the terms over the last `n_reduce` axes, from which `_finish` makes value
    and scale.

    `+=`: (sum, sum of squares, sum of squared term errors, `_repeats`). `*=`: (product, sum
    over terms of the squared term error times the product of the other terms' magnitudes,
    `_repeats`: equal factors carry equal errors). `max=` / `min=`: (extreme, largest term
    error).
    """
    repeats = _repeats(value, n_reduce) if op in ("+=", "*=") else None
    value = value.reshape(value.shape[: value.ndim - n_reduce] + (-1,))
    error = error.reshape(value.shape)
    if op == "+=":
        return value.sum(-1), np.square(value).sum(-1), np.square(error).sum(-1), repeats
    if op == "*=":
        size = np.abs(value)
        ones = np.ones_like(size[..., :1])
        before = np.cumprod(np.concatenate([ones, size[..., :-1]], axis=-1), axis=-1)
        after = np.flip(np.cumprod(np.concatenate([ones, np.flip(size[..., 1:], -1)], axis=-1), axis=-1), -1)
        return value.prod(-1), np.square(error * before * after).sum(-1), repeats
    extreme = value.max(-1) if op == "max=" else value.min(-1)
    return extreme, error.max(-1)


def _repeats(value: np.ndarray, n_reduce: int) -> np.ndarray:
    """Per reduce axis (the last dimension of the result): sum_g r_g^2 over the runs of r_g
    equal terms along that axis, summed over the other reduce axes.

    Only consecutive equal terms round alike (a different term in between moves the partial sum
    off the pattern), and which reduce axis a kernel walks innermost depends on its tiling, so
    `_finish` takes the axis with the longest runs.
    """
    first = value.ndim - n_reduce
    terms = prod(value.shape[first:])
    per_axis = []
    for axis in range(first, value.ndim):
        along = np.moveaxis(value, axis, -1)
        position = np.arange(along.shape[-1])
        starts = np.concatenate([np.ones_like(along[..., :1], dtype=bool), along[..., 1:] != along[..., :-1]], -1)
        run_start = np.maximum.accumulate(np.where(starts, position, 0), axis=-1)
        pairs = (position - run_start).sum(-1)  # each term counts the equal ones just before it
        per_axis.append(terms + 2.0 * pairs.reshape(pairs.shape[:first] + (-1,)).sum(-1))
    return np.stack(per_axis, axis=-1)


def _combine(op: str, a: tuple, b: tuple) -> tuple:
    """Statistics of two halves of the reduce range together."""
    if op == "+=":
        return tuple(x + y for x, y in zip(a, b))
    if op == "*=":
        return a[0] * b[0], a[1] * np.square(b[0]) + b[1] * np.square(a[0]), a[2] + b[2]
    extreme = np.maximum(a[0], b[0]) if op == "max=" else np.minimum(a[0], b[0])
    return extreme, np.maximum(a[1], b[1])


def _finish(op: str, stats: tuple, terms: int):
    """(value, scale) from a reduction's statistics over `terms` terms (or an elementwise pair)."""
    if op == "+=":
        total, squares, errors, repeats = stats
        return total, _sum_scale(total, squares, errors, terms, repeats.max(-1))
    if op == "*=":
        product, propagated, repeats = stats
        return product, np.sqrt(propagated * repeats.max(-1) / terms + terms * np.square(product))
    return stats


def _evaluate_box(st: Statement, order: tuple[str, ...], box: tuple, tensors: Mapping) -> tuple:
    """Statistics of the output block over `box` (a (lo, hi) range per axis, spatial axes first),
    and the number of terms they cover.

    A box too big to broadcast at once is halved along its longest spatial axis, the halves
    concatenated; once it holds one output, along its longest reduce axis, the halves combined
    with `_combine` (which cuts the runs of equal terms at the border of the halves, beyond
    CHUNK_ELEMENTS terms per output).
    """
    sizes = [hi - lo for lo, hi in box]
    n_spatial = len(st.spatial_axes)
    if prod(sizes) > CHUNK_ELEMENTS and max(sizes) > 1:
        spatial = sizes[:n_spatial]
        d = int(np.argmax(spatial)) if spatial and max(spatial) > 1 else n_spatial + int(np.argmax(sizes[n_spatial:]))
        lo, hi = box[d]
        mid = (lo + hi) // 2
        (first, n), (second, _) = (
            _evaluate_box(st, order, box[:d] + (part,) + box[d + 1 :], tensors) for part in ((lo, mid), (mid, hi))
        )
        if d < n_spatial:
            return tuple(np.concatenate([x, y], axis=d) for x, y in zip(first, second)), n
        return _combine(st.op, first, second), prod(sizes[n_spatial:])
    grids = {
        axis: np.arange(lo, hi).reshape([-1 if k == d else 1 for k in range(len(order))])
        for d, (axis, (lo, hi)) in enumerate(zip(order, box))
    }
    value, error = (np.broadcast_to(x, sizes) for x in _node(st.value, grids, tensors))
    if st.op == "=":
        return (np.array(value), np.array(error)), 1
    return _reduce_terms(st.op, value, error, len(sizes) - n_spatial), prod(sizes[n_spatial:])


def _through(error, slope):
    """`error * slope`, 0 where the error is 0 (an exact argument at a pole adds nothing)."""
    return np.where(error == 0, 0.0, error * slope)


def _libm(value, argument_error, slope):
    """A libm call: its argument's error through the slope, plus LIBM_ULPS of the result."""
    return _through(argument_error, slope) + LIBM_ULPS * np.abs(value)


def _function(name: str, args: list) -> tuple:
    """(value, error scale) of a call; `args` are (value, error scale) pairs."""
    (x, e), *rest = args
    if name in ("max", "min"):
        (y, f) = rest[0]
        return (np.maximum(x, y) if name == "max" else np.minimum(x, y)), e + f
    if name == "abs":
        return np.abs(x), e
    if name == "exp":
        v = np.exp(x)
        return v, _libm(v, e, v)
    if name == "log":
        v = np.log(x)
        return v, _libm(v, e, 1.0 / np.abs(x))
    if name == "sqrt":  # correctly rounded
        v = np.sqrt(x)
        return v, _through(e, 0.5 / v) + v
    if name == "tanh":  # plus absolute units: TVM's form cancels near 0
        v = np.tanh(x)
        return v, _libm(v, e, 1.0 - v * v) + LIBM_ULPS
    assert name == "sigmoid"
    v = 1.0 / (1.0 + np.exp(-x))
    return v, _libm(v, e, v * (1.0 - v))


def _node(node: Expr, grids: Mapping[str, np.ndarray], tensors: Mapping[str, np.ndarray]) -> tuple:
    """(value, error scale) of an AST node, broadcast over the axis grids."""
    if isinstance(node, Number):  # the literal is rounded into the dtype
        return np.float64(node.value), np.float64(abs(node.value))
    if isinstance(node, Ref):  # inputs are exact
        index = tuple(sum((c * grids[a] for a, c in i.terms), start=np.int64(i.const)) for i in node.indices)
        return tensors[node.tensor][index], np.float64(0.0)
    if isinstance(node, Negate):
        v, e = _node(node.operand, grids, tensors)
        return -v, e
    if isinstance(node, Binary):
        (a, e), (b, f) = _node(node.left, grids, tensors), _node(node.right, grids, tensors)
        if node.op in "+-":
            v = a + b if node.op == "+" else a - b
            return v, e + f + np.abs(v)
        if node.op == "*":
            v = a * b
            return v, e * np.abs(b) + np.abs(a) * f + np.abs(v)
        v = a / b
        return v, (e + np.abs(v) * f) / np.abs(b) + np.abs(v)
    assert isinstance(node, Call)
    return _function(node.func, [_node(arg, grids, tensors) for arg in node.args])
