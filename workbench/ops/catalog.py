"""Catalog operators: a name plus integer parameters -> TE tensors -> TensorExpr.

Parameter names follow `specs/suites/README.md`. Tensor and block names (the codegen templates
look blocks up by name):

- matmul: A, B -> C (axes [b,] i, j, k);  gemv: A, x -> y (axes i, k)
- conv2d / depthwise_conv2d: data, kernel -> [pad] -> O (axes n, f|c[, j], h, w, [c,] r, s)
- group_conv2d: data, kernel -> [pad] -> O (axes n, f_0 (group), f_1 (channel in group), h, w, c, r, s;
  with one group, or one output channel per group, f stays one axis)
- maxpool: data -> [pad] -> O;  avgpool: data -> [pad] -> S (window sum) -> O (S / K*K)
- relu, gelu: X -> Y;  add: A, B -> C (axes i0, i1, ...)
- reduce_sum: X -> Y;  reduce_mean: X -> S (sum) -> Y (S / count) (axes i0.. kept, r0.. reduced)

The block `pad` exists only when pad > 0. The main block of an operator is the one with the
reduce axes, or the output block for the elementwise operators.

A dynamic extent (`M=dyn`, Vortex: workbench/vortex) is one parameter of `DYNAMIC_PARAMS` left
open: construction refuses it (`normalize_params`), `split_dynamic` names it, and
`symbolic_func` builds the operator with it as `T * tile` for an int32 argument T.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import pi, prod, sqrt

from workbench.errors import UserError
from workbench.ops.shapes import MAX_ELEMENTS, check_dtype, check_elements

DYN = "dyn"  # the value of a dynamic extent in a workload's parameters (`--shape M=dyn`)
# Per operator, the parameters that may be dynamic: an outermost extent of the output that no
# index but its own axis reads, so a kernel padded along it (rows of zeros in, rows sliced off
# out) computes the unpadded result. One per workload (Vortex pads only the outermost level).
DYNAMIC_PARAMS = {"matmul": ("M", "B"), "gemv": ("M",)}


@dataclass(frozen=True)
class ParamInfo:
    name: str
    kind: str  # "int" | "ints" | "bool"
    default: object  # None when the parameter is required
    doc: str
    minimum: int = 1  # smallest value an int (or each entry of ints) may take


@dataclass(frozen=True)
class OpInfo:
    name: str
    params: tuple[ParamInfo, ...]
    description: str
    example: tuple[tuple[str, object], ...] = ()  # every parameter, from a layer of a real network
    example_source: str = ""


def _p(name: str, doc: str, kind: str = "int", default: object = None, minimum: int = 1) -> ParamInfo:
    return ParamInfo(name, kind, default, doc, minimum)


_CONV_INPUT = (_p("N", "batch"), _p("C", "input channels"), _p("H", "input height"), _p("W", "input width"))
_WINDOW = (_p("stride", "stride of the window"), _p("pad", "zero padding on each side", minimum=0))
_SHAPE = _p("shape", "tensor shape, e.g. 17x11x3", kind="ints")
_REDUCE = (_SHAPE, _p("axes", "dimensions to reduce, e.g. 1 or 2x3", kind="ints", minimum=0))

_INFOS = (
    OpInfo(
        "matmul",
        (
            _p("M", "rows of C"),
            _p("N", "columns of C"),
            _p("K", "reduction length"),
            _p("B", "batch size; 0 means no batch dimension", default=0, minimum=0),
            _p("trans_a", "A is stored transposed, [K,M]", kind="bool", default=False),
            _p("trans_b", "B is stored transposed, [N,K]", kind="bool", default=False),
        ),
        "C[M,N] = A[M,K] B[K,N], batched ([B,M,K] x [B,K,N]) when B > 0",
        (("B", 0), ("K", 768), ("M", 128), ("N", 3072), ("trans_a", False), ("trans_b", False)),
        "BERT-base feed-forward up-projection, 128 tokens (hidden 768, intermediate 3072)",
    ),
    OpInfo("gemv", (_p("M", "rows of A"), _p("K", "reduction length")), "y[M] = A[M,K] x[K]",
           (("K", 4096), ("M", 4096)), "one token through a 4096 x 4096 projection (LLaMA-7B attention)"),
    OpInfo(
        "conv2d",
        _CONV_INPUT
        + (_p("F", "output channels"), _p("KH", "kernel height"), _p("KW", "kernel width"))
        + _WINDOW
        + (_p("dilation", "kernel dilation", default=1),),
        "2-D convolution, NCHW data [N,C,H,W], kernel [F,C,KH,KW], output [N,F,OH,OW]",
        (("C", 64), ("F", 64), ("H", 56), ("KH", 3), ("KW", 3), ("N", 1), ("W", 56), ("dilation", 1), ("pad", 1),
         ("stride", 1)),
        "ResNet-50 conv2_x 3x3 convolution (64 channels at 56 x 56)",
    ),
    OpInfo(
        "group_conv2d",
        _CONV_INPUT
        + (_p("F", "output channels"), _p("KH", "kernel height"), _p("KW", "kernel width"))
        + _WINDOW
        + (_p("groups", "channel groups (C and F divisible by it); each convolves its own C/groups channels"),
           _p("dilation", "kernel dilation", default=1)),
        "grouped 2-D convolution, data [N,C,H,W], kernel [F,C/groups,KH,KW], output [N,F,OH,OW]: output "
        "channel f reads input channels g*C/groups .. (g+1)*C/groups - 1 of its group g = f // (F/groups); "
        "the channel axis is split into (group, channel in group) so every index is affine",
        (("C", 96), ("F", 256), ("H", 27), ("KH", 5), ("KW", 5), ("N", 1), ("W", 27), ("dilation", 1), ("groups", 2),
         ("pad", 2), ("stride", 1)),
        "AlexNet conv2, two groups (96 channels at 27 x 27, 256 5x5 filters)",
    ),
    OpInfo(
        "depthwise_conv2d",
        _CONV_INPUT
        + (_p("KH", "kernel height"), _p("KW", "kernel width"))
        + _WINDOW
        + (_p("multiplier", "output channels per input channel", default=1),),
        "depthwise convolution, kernel [C*multiplier,1,KH,KW]; output [N,C,OH,OW], or "
        "[N,C,multiplier,OH,OW] when multiplier > 1 (the layout of [N,C*multiplier,OH,OW], "
        "channel c*multiplier + j, kept 5-D so every index is affine)",
        (("C", 32), ("H", 112), ("KH", 3), ("KW", 3), ("N", 1), ("W", 112), ("multiplier", 1), ("pad", 1),
         ("stride", 1)),
        "MobileNet v1 first depthwise 3x3 convolution (32 channels at 112 x 112)",
    ),
    OpInfo("relu", (_SHAPE,), "Y = max(X, 0)", (("shape", (1, 64, 56, 56)),), "a ResNet-50 conv2_x activation"),
    OpInfo("add", (_SHAPE,), "C = A + B, same shapes", (("shape", (1, 256, 56, 56)),),
           "a ResNet-50 conv2_x residual addition"),
    OpInfo("gelu", (_SHAPE,), "Y = 0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3))), the tanh form",
           (("shape", (128, 3072)),), "BERT-base feed-forward activation, 128 tokens"),
    OpInfo(
        "avgpool",
        _CONV_INPUT + (_p("K", "window size (K x K)"),) + _WINDOW,
        "average pooling over K x K windows; padding counts as zeros and the sum is divided by K*K",
        (("C", 128), ("H", 56), ("K", 2), ("N", 1), ("W", 56), ("pad", 0), ("stride", 2)),
        "DenseNet-121 transition-layer 2x2 average pooling (128 channels at 56 x 56)",
    ),
    OpInfo(
        "maxpool",
        _CONV_INPUT + (_p("K", "window size (K x K)"),) + _WINDOW,
        "max pooling over K x K windows; padding holds the dtype's lowest value",
        (("C", 64), ("H", 112), ("K", 3), ("N", 1), ("W", 112), ("pad", 1), ("stride", 2)),
        "ResNet-50 stem 3x3 max pooling, stride 2 (64 channels at 112 x 112)",
    ),
    OpInfo("reduce_sum", _REDUCE, "sum over the given axes (they are dropped from the output)",
           (("axes", (1,)), ("shape", (128, 768))), "BERT-base layer-norm row sums, 128 tokens"),
    OpInfo("reduce_mean", _REDUCE, "mean over the given axes (they are dropped from the output)",
           (("axes", (2, 3)), ("shape", (1, 2048, 7, 7))), "ResNet-50 global average pooling"),
)
_BY_NAME = {info.name: info for info in _INFOS}


def list_ops() -> tuple[OpInfo, ...]:
    """The catalog operators in a stable order."""
    return _INFOS


def op_info_dict(info: OpInfo) -> dict:
    """JSON form of an operator for `workbench ops --json`."""
    params = [{"name": p.name, "kind": p.kind, "default": p.default, "doc": p.doc} for p in info.params]
    example = {k: list(v) if isinstance(v, tuple) else v for k, v in info.example}
    return {"name": info.name, "params": params, "description": info.description, "example": example,
            "example_source": info.example_source}


def normalize_params(op: str, params: Mapping[str, object]) -> dict[str, object]:
    """Check `params` against the operator's parameters; return them with defaults filled in.

    `ints` values may be given as one int or a list/tuple (TOML gives lists) and come back as tuples.
    """
    if op not in _BY_NAME:
        raise UserError(f"unknown operator {op!r}; known: {', '.join(_BY_NAME)}")
    dynamic = _dynamic_names(params)
    if dynamic:
        raise UserError(f"{op}: {dynamic[0]}=dyn is a dynamic extent: compile it with `workbench vortex compile`, "
                        "which builds kernels for every value")
    info = _BY_NAME[op]
    known = {p.name for p in info.params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise UserError(f"{op}: unknown parameter {unknown[0]!r}; known: {', '.join(p.name for p in info.params)}")
    out = {}
    for p in info.params:
        if p.name not in params:
            if p.default is None:
                raise UserError(f"{op}: missing parameter {p.name} ({p.doc})")
            out[p.name] = p.default
        else:
            out[p.name] = _check_value(op, p, params[p.name])
    return out


def _dynamic_names(params: Mapping[str, object]) -> list[str]:
    return sorted(k for k, v in params.items() if isinstance(v, str) and v == DYN)


def split_dynamic(op: str, params: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """(the dynamic parameter, every parameter checked with that one set to 1) of a workload
    with one `dyn` value; UserError when it has none, several, or one `DYNAMIC_PARAMS` lacks."""
    if op not in _BY_NAME:
        raise UserError(f"unknown operator {op!r}; known: {', '.join(_BY_NAME)}")
    dynamic = _dynamic_names(params)
    allowed = DYNAMIC_PARAMS.get(op, ())
    if not dynamic:
        raise UserError(f"{op}: no dynamic extent; give one parameter as dyn (e.g. {allowed[0] if allowed else 'M'}=dyn)")
    if len(dynamic) > 1:
        raise UserError(f"{op}: one dynamic extent per workload, got {', '.join(dynamic)}")
    if dynamic[0] not in allowed:
        which = f"only {', '.join(allowed)} may be" if allowed else "no parameter may be"
        raise UserError(f"{op}: {dynamic[0]} cannot be dynamic ({which})")
    return dynamic[0], normalize_params(op, {**params, dynamic[0]: 1})


def symbolic_func(op: str, params: Mapping[str, object], dynamic: str, tile: int, dtype: str = "float32"):
    """The operator's PrimFunc with `params[dynamic] = T * tile` for an int32 variable T, its
    last argument (TVM cannot bind T from a buffer shape T * tile, so a caller passes it).
    The static parameters are checked as `normalize_params` checks them; the element counts
    that depend on T are the caller's to check for each T it runs."""
    import tvm
    from tvm import te

    check_dtype(dtype)
    if dynamic not in DYNAMIC_PARAMS.get(op, ()):
        raise UserError(f"{op}: {dynamic} cannot be dynamic")
    p = normalize_params(op, {**params, dynamic: tile})
    steps = tvm.tirx.Var("T", "int32")
    p[dynamic] = steps * tile
    inputs, output = _BUILDERS[op](p, dtype)
    return te.create_prim_func([*inputs, output, steps])


def _check_value(op: str, p: ParamInfo, value: object) -> object:
    bound = "a positive integer" if p.minimum == 1 else f"an integer >= {p.minimum}"
    if p.kind == "bool":
        if not isinstance(value, bool):
            raise UserError(f"{op}: {p.name} must be true or false, got {value!r}")
        return value
    if p.kind == "int":
        if not _is_int(value) or value < p.minimum:
            raise UserError(f"{op}: {p.name} must be {bound}, got {value!r}")
        _check_index_range(op, p.name, value)
        return value
    values = (value,) if _is_int(value) else value
    if not isinstance(values, (list, tuple)) or not values:
        raise UserError(f"{op}: {p.name} must be a list of integers such as 17x11x3, got {value!r}")
    if not all(_is_int(v) and v >= p.minimum for v in values):
        raise UserError(f"{op}: every entry of {p.name} must be {bound}, got {value!r}")
    for v in values:
        _check_index_range(op, p.name, v)
    return tuple(values)


def _check_index_range(op: str, name: str, value: int) -> None:
    # A stride or dilation becomes an index coefficient, int32 in TVM's index arithmetic (one
    # past it makes TVM raise); every extent is bounded by the int32 element count anyway.
    if value > MAX_ELEMENTS:
        raise UserError(f"{op}: {name} must be at most {MAX_ELEMENTS} (the int32 index range), got {value}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def build_te(op: str, params: Mapping[str, object], dtype: str = "float32") -> tuple[tuple, object]:
    """Validate and build the operator's TE tensors: (inputs in call order, output)."""
    check_dtype(dtype)
    p = normalize_params(op, params)
    return _BUILDERS[op](p, dtype)


def build(op: str, params: Mapping[str, object], dtype: str = "float32"):
    """Build the catalog operator `op` as a TensorExpr (params: names of specs/suites/README.md)."""
    from workbench.ops.tensor_expr import from_te

    check_dtype(dtype)
    p = normalize_params(op, params)
    inputs, output = _BUILDERS[op](p, dtype)
    return from_te(op, p, inputs, output, dtype)


def _placeholder(name: str, shape: tuple, dtype: str):
    from tvm import te

    _check_static(name, shape)
    return te.placeholder(shape, dtype=dtype, name=name)


def _check_static(name: str, shape: tuple) -> None:
    """`check_elements` where every extent is an int; a symbolic one (`symbolic_func`) has no
    count until it has a value."""
    if all(_is_int(d) for d in shape):
        check_elements(name, shape)


def _matmul(p: Mapping, dtype: str):
    from tvm import te

    m, n, k, batch = p["M"], p["N"], p["K"], p["B"]
    batched = not (_is_int(batch) and batch == 0)  # a symbolic B is batched
    lead = (batch,) if batched else ()
    lhs = _placeholder("A", lead + ((k, m) if p["trans_a"] else (m, k)), dtype)
    rhs = _placeholder("B", lead + ((n, k) if p["trans_b"] else (k, n)), dtype)
    _check_static("C", lead + (m, n))
    rk = te.reduce_axis((0, k), name="k")

    def product(bi: tuple, i, j):
        a_at = lhs[bi + ((rk, i) if p["trans_a"] else (i, rk))]
        b_at = rhs[bi + ((j, rk) if p["trans_b"] else (rk, j))]
        return te.sum(a_at * b_at, axis=rk)

    if batched:
        out = te.compute((batch, m, n), lambda b, i, j: product((b,), i, j), name="C")
    else:
        out = te.compute((m, n), lambda i, j: product((), i, j), name="C")
    return (lhs, rhs), out


def _gemv(p: Mapping, dtype: str):
    from tvm import te

    a = _placeholder("A", (p["M"], p["K"]), dtype)
    x = _placeholder("x", (p["K"],), dtype)
    _check_static("y", (p["M"],))
    k = te.reduce_axis((0, p["K"]), name="k")
    return (a, x), te.compute((p["M"],), lambda i: te.sum(a[i, k] * x[k], axis=k), name="y")


def _out_extent(op: str, dim: str, size: int, pad: int, window: int, stride: int) -> int:
    """Output length of a sliding window: floor((size + 2 pad - window) / stride) + 1."""
    out = (size + 2 * pad - window) // stride + 1
    if out <= 0:
        raise UserError(f"{op}: window of {window} is larger than the padded input {dim} of {size + 2 * pad}")
    return out


def _padded(data, pad: int, value):
    """A separate `pad` block (so schedules can inline or cache it), or `data` itself when pad = 0."""
    if pad == 0:
        return data
    import tvm
    from tvm import te

    n, c, h, w = (int(s) for s in data.shape)
    check_elements("pad", (n, c, h + 2 * pad, w + 2 * pad))

    def at(i, j, y, x):
        inside = tvm.tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad)
        return te.if_then_else(inside, data[i, j, y - pad, x - pad], value)

    return te.compute((n, c, h + 2 * pad, w + 2 * pad), at, name="pad")


def _zero(dtype: str):
    import tvm

    return tvm.tirx.const(0, dtype)


def _conv_window(op: str, p: Mapping, kh: int, kw: int) -> tuple[int, int]:
    oh = _out_extent(op, "height", p["H"], p["pad"], kh, p["stride"])
    ow = _out_extent(op, "width", p["W"], p["pad"], kw, p["stride"])
    return oh, ow


def _conv2d(p: Mapping, dtype: str):
    from tvm import te

    d, st = p["dilation"], p["stride"]
    oh, ow = _conv_window("conv2d", p, d * (p["KH"] - 1) + 1, d * (p["KW"] - 1) + 1)
    data = _placeholder("data", (p["N"], p["C"], p["H"], p["W"]), dtype)
    kernel = _placeholder("kernel", (p["F"], p["C"], p["KH"], p["KW"]), dtype)
    check_elements("O", (p["N"], p["F"], oh, ow))
    src = _padded(data, p["pad"], _zero(dtype))
    c = te.reduce_axis((0, p["C"]), name="c")
    r = te.reduce_axis((0, p["KH"]), name="r")
    s = te.reduce_axis((0, p["KW"]), name="s")

    def body(n, f, h, w):
        return te.sum(src[n, c, h * st + r * d, w * st + s * d] * kernel[f, c, r, s], axis=[c, r, s])

    return (data, kernel), te.compute((p["N"], p["F"], oh, ow), body, name="O")


def _group_conv2d(p: Mapping, dtype: str):
    from tvm import te

    groups, d, st = p["groups"], p["dilation"], p["stride"]
    for name in ("C", "F"):
        if p[name] % groups:
            raise UserError(f"group_conv2d: {name} = {p[name]} is not divisible by groups = {groups}")
    cg, fg = p["C"] // groups, p["F"] // groups
    oh, ow = _conv_window("group_conv2d", p, d * (p["KH"] - 1) + 1, d * (p["KW"] - 1) + 1)
    data = _placeholder("data", (p["N"], p["C"], p["H"], p["W"]), dtype)
    kernel = _placeholder("kernel", (p["F"], cg, p["KH"], p["KW"]), dtype)
    check_elements("O", (p["N"], p["F"], oh, ow))
    src = _padded(data, p["pad"], _zero(dtype))
    c = te.reduce_axis((0, cg), name="c")
    r = te.reduce_axis((0, p["KH"]), name="r")
    s = te.reduce_axis((0, p["KW"]), name="s")

    # written as ONNX and TVM's own lowering write it (`f // fg`); from_prim_func splits f
    def body(n, f, h, w):
        return te.sum(src[n, f // fg * cg + c, h * st + r * d, w * st + s * d] * kernel[f, c, r, s], axis=[c, r, s])

    return (data, kernel), te.compute((p["N"], p["F"], oh, ow), body, name="O")


def _depthwise_conv2d(p: Mapping, dtype: str):
    from tvm import te

    mult, st = p["multiplier"], p["stride"]
    oh, ow = _conv_window("depthwise_conv2d", p, p["KH"], p["KW"])
    data = _placeholder("data", (p["N"], p["C"], p["H"], p["W"]), dtype)
    kernel = _placeholder("kernel", (p["C"] * mult, 1, p["KH"], p["KW"]), dtype)
    src = _padded(data, p["pad"], _zero(dtype))
    r = te.reduce_axis((0, p["KH"]), name="r")
    s = te.reduce_axis((0, p["KW"]), name="s")

    def window(n, c, j, h, w):
        return te.sum(src[n, c, h * st + r, w * st + s] * kernel[c * mult + j, 0, r, s], axis=[r, s])

    if mult == 1:
        check_elements("O", (p["N"], p["C"], oh, ow))
        return (data, kernel), te.compute((p["N"], p["C"], oh, ow), lambda n, c, h, w: window(n, c, 0, h, w), name="O")
    check_elements("O", (p["N"], p["C"], mult, oh, ow))
    return (data, kernel), te.compute((p["N"], p["C"], mult, oh, ow), window, name="O")


def _pool(p: Mapping, dtype: str, kind: str):
    import tvm
    from tvm import te

    k, st = p["K"], p["stride"]
    oh, ow = _conv_window(kind, p, k, k)
    data = _placeholder("data", (p["N"], p["C"], p["H"], p["W"]), dtype)
    out_shape = (p["N"], p["C"], oh, ow)
    check_elements("O", out_shape)
    fill = tvm.tirx.min_value(dtype) if kind == "maxpool" else _zero(dtype)
    src = _padded(data, p["pad"], fill)
    r = te.reduce_axis((0, k), name="r")
    s = te.reduce_axis((0, k), name="s")
    reducer = te.max if kind == "maxpool" else te.sum

    def window(n, c, h, w):
        return reducer(src[n, c, h * st + r, w * st + s], axis=[r, s])

    if kind == "maxpool":
        return (data,), te.compute(out_shape, window, name="O")
    total = te.compute(out_shape, window, name="S")
    # count_include_pad: every window divides by K*K, padding included (ONNX's default).
    area = tvm.tirx.const(k * k, dtype)
    return (data,), te.compute(out_shape, lambda n, c, h, w: total[n, c, h, w] / area, name="O")


def _elementwise(p: Mapping, dtype: str, kind: str):
    import tvm
    from tvm import te

    shape = p["shape"]
    if kind == "add":
        a, b = _placeholder("A", shape, dtype), _placeholder("B", shape, dtype)
        return (a, b), te.compute(shape, lambda *i: a[i] + b[i], name="C")
    x = _placeholder("X", shape, dtype)
    if kind == "relu":
        return (x,), te.compute(shape, lambda *i: tvm.tirx.max(x[i], _zero(dtype)), name="Y")

    def gelu(*i):
        v = x[i]
        c = tvm.tirx.const
        inner = c(sqrt(2 / pi), dtype) * (v + c(0.044715, dtype) * v * v * v)
        return c(0.5, dtype) * v * (c(1, dtype) + tvm.tirx.tanh(inner))

    return (x,), te.compute(shape, gelu, name="Y")


def _reduce(p: Mapping, dtype: str, kind: str):
    import tvm
    from tvm import te

    shape, axes = p["shape"], p["axes"]
    if len(set(axes)) != len(axes) or max(axes) >= len(shape):
        raise UserError(f"{kind}: axes {list(axes)} must be distinct dimensions of a rank-{len(shape)} shape")
    x = _placeholder("X", shape, dtype)
    kept = tuple(d for d in range(len(shape)) if d not in axes)
    out_shape = tuple(shape[d] for d in kept)
    raxes = [te.reduce_axis((0, shape[d]), name=f"r{n}") for n, d in enumerate(sorted(axes))]

    def total(*out_index):
        where = dict(zip(kept, out_index)) | dict(zip(sorted(axes), raxes))
        return te.sum(x[tuple(where[d] for d in range(len(shape)))], axis=raxes)

    if kind == "reduce_sum":
        return (x,), te.compute(out_shape, total, name="Y")
    sums = te.compute(out_shape, total, name="S")
    count = tvm.tirx.const(prod(shape[d] for d in axes), dtype)
    return (x,), te.compute(out_shape, lambda *i: sums[i] / count, name="Y")


_BUILDERS: dict[str, Callable] = {
    "matmul": _matmul,
    "gemv": _gemv,
    "conv2d": _conv2d,
    "group_conv2d": _group_conv2d,
    "depthwise_conv2d": _depthwise_conv2d,
    "relu": lambda p, dt: _elementwise(p, dt, "relu"),
    "add": lambda p, dt: _elementwise(p, dt, "add"),
    "gelu": lambda p, dt: _elementwise(p, dt, "gelu"),
    "avgpool": lambda p, dt: _pool(p, dt, "avgpool"),
    "maxpool": lambda p, dt: _pool(p, dt, "maxpool"),
    "reduce_sum": lambda p, dt: _reduce(p, dt, "reduce_sum"),
    "reduce_mean": lambda p, dt: _reduce(p, dt, "reduce_mean"),
}
