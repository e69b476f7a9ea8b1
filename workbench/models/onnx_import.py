"""ONNX model -> fused TIR operators and their dataflow graph, through TVM Relax.

The inputs' symbolic dims (`dim_param`) are bound to integers first (`symbolic.py`), so TVM
imports a static model and the element caps apply to the bound shapes.
`from_onnx` gives a Relax module. Before lowering, the graph is put in inference form
(`_inference_mode`): Dropout becomes the identity and its mask dead code, Split one slice per
part, so that every kernel has one output, and the reshapes and transposes around a matmul (a
transformer's head split and merge) are fused into it (`layout_fusion.py`). `LegalizeOps`
lowers every Relax operator to a TIR PrimFunc, `FoldConstant` evaluates what depends on weights only (a Gemm's `transB` transpose of a constant
weight would otherwise be a kernel of its own), `AnnotateTIROpPattern` + `FuseOps` + `FuseTIR`
fuse each reduction with its elementwise neighbours (conv + bias + relu) into one PrimFunc, and
`RemoveUnusedOutputs` drops the outputs of a fused function that nothing reads. Each `call_tir`
of the fused `main` is one operator of the model, in dataflow order.

Each fused PrimFunc, without its dead blocks (a batch norm's running statistics), becomes a
`TensorExpr` with `from_prim_func`, which splits an axis that an index divides by a constant
(a grouped conv's output channel into group and channel in group, a channel shuffle's or a
flatten's index into digits; `tensor_expr.split_div_mod`):
- a fused reduction (conv, matmul, pooling) is its reduction block; the epilogue (bias,
  activation, residual add) is inlined into one block after it and stays in the PrimFunc for the
  codegen to fold into the write-back. Epilogue tensors (a bias, a residual) are read once per
  output element and are not in the tile model's traffic;
- a function with several reductions (softmax: max then sum; layer norm: mean then variance) is
  modelled by its largest reduction, the first pass over each row, which is what
  `from_prim_func` picks; the later passes over the same row and the row-sized output write are
  not in the traffic either;
- a function without a reduction is first collapsed into one block (producers inlined into the
  output block, or, when that leaves a non-affine index as a reshape after a transpose does, the
  consumers reverse-inlined into the first block), so every tensor it reads is a parameter.
Layout operators (reshape, transpose, slice, shuffle, flatten) become copy kernels: no
arithmetic, so the tile model prices their traffic only. A PrimFunc that still cannot be read as
one affine block (a gather, a reshape whose new rows straddle the old ones, several outputs) is
kept as an unsupported operator with the reason; the rest of the model is constructed as usual
and the report names and counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from math import prod
from pathlib import Path

from workbench.errors import UserError
from workbench.files import read_user_file
from workbench.models import symbolic
from workbench.models.layout_fusion import fuse_matmul_layouts
from workbench.ops.shapes import check_elements
from workbench.ops.tensor_expr import TensorExpr, is_reduction

# Refuse models above this size before parsing them: protobuf parses the whole file in memory
# (several times its size), and weights beyond this are far outside what a workbench session
# constructs in seconds. The sample models are under 1 MB each.
MAX_MODEL_BYTES = 64 * 2**20
# Every tensor of a model within shapes.MAX_ELEMENTS (the int32 indexing of the kernels), and all
# of them together within 2^33 elements: running a model (models/execute.py) holds every
# operator's output at once, 32 GiB in float32, and the co-schedule has a task per tile of each.
MAX_MODEL_ELEMENTS = 2**33


@dataclass(frozen=True)
class Arg:
    """One argument of an operator call: a model input, another operator's output, or a weight."""

    source: str  # "input" | "operator" | "constant"
    ref: object  # input name | operator index | constant index
    shape: tuple[int, ...]
    dtype: str
    item: int = 0  # which output of a multi-output operator


@dataclass(frozen=True)
class Operator:
    """One fused kernel of the model: `expr` is None when it could not be mapped (`reason` says why)."""

    index: int
    name: str  # the fused PrimFunc's name, with "#n" for its n-th call when it is called again
    func_name: str
    kind: str  # "reduction" | "multi-reduction" | "elementwise" | "layout" | "multi-output"
    args: tuple[Arg, ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each output
    expr: TensorExpr | None
    reason: str = ""
    func: object = field(default=None, compare=False, repr=False)

    @property
    def supported(self) -> bool:
        return self.expr is not None

    @property
    def preds(self) -> tuple[int, ...]:
        """Indices of the operators whose outputs this one reads."""
        return tuple(sorted({a.ref for a in self.args if a.source == "operator"}))


@dataclass(frozen=True)
class ImportedModel:
    name: str
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype) in call order
    operators: tuple[Operator, ...]  # dataflow (topological) order
    outputs: tuple[tuple[int, int], ...]  # (operator, output item) of each model output
    constants: tuple = field(default=(), compare=False, repr=False)  # numpy arrays, by Arg.ref
    dims: tuple[symbolic.SymbolicDim, ...] = ()  # the inputs' symbolic dims, as bound

    @property
    def dim_values(self) -> dict[str, int]:
        """The value each symbolic dim was bound to (to import the same model again)."""
        return {d.name: d.value for d in self.dims}


def import_model(path: str | Path, dims: Mapping[str, int] | None = None) -> ImportedModel:
    """Read, check, import and fuse an ONNX model; every problem with the file is a UserError.
    Its symbolic dims are bound to `dims` (1 where not given; `symbolic.py`), and each one's
    dependent operators found by importing the model once more with that dim at value + 1."""
    path = Path(path)
    raw = _parse(path)
    bound = symbolic.resolve(symbolic.input_dims(raw.graph), dims or {}, path.name)
    values = {d.name: d.value for d in bound}
    model = _walk(fused_module(_bound(raw, values, path), path.name), path.stem)
    if not bound:
        return model
    found = []
    for dim in bound:
        probe = dim.value + 1
        try:
            probe_model = _walk(fused_module(_bound(raw, {**values, dim.name: probe}, path), path.name), path.stem)
        except UserError as err:  # the probe over a cap, where the bound value is not
            found.append(replace(dim, note=f"cannot tell which operators depend on it: at {dim.name}={probe}, {err}"))
            continue
        found.append(symbolic.dependents(dim, model.operators, probe_model.operators, probe))
    return replace(model, dims=tuple(found))


def read_onnx(path: Path, dims: Mapping[str, int] | None = None):
    """`(proto, dims)`: the parsed, checked `onnx.ModelProto` of `path` with its symbolic dims
    bound to `dims` (1 where not given), its declared tensors within the caps at those values,
    and the `SymbolicDim`s bound."""
    raw = _parse(path)
    bound = symbolic.resolve(symbolic.input_dims(raw.graph), dims or {}, path.name)
    return _bound(raw, {d.name: d.value for d in bound}, path), bound


def symbolic_dim_names(path: str | Path) -> tuple[str, ...]:
    """The symbolic dims of the model's inputs, read off the file without importing it."""
    return symbolic.input_dims(_parse(Path(path)).graph)


def _parse(path: Path):
    """The parsed `onnx.ModelProto` of `path`, read within MAX_MODEL_BYTES, not yet checked."""
    import onnx
    from google.protobuf.message import DecodeError

    data = read_user_file(path, "model", MAX_MODEL_BYTES)
    try:
        proto = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise UserError(f"{path}: not an ONNX model ({_first_line(err)})") from None
    if proto.ir_version <= 0 or not proto.graph.node:
        raise UserError(f"{path}: not an ONNX model (no IR version or no graph nodes)")
    return proto


def _bound(raw, values: Mapping[str, int], path: Path):
    """`raw` with its symbolic dims bound to `values`, then checked: the caps apply to the
    bound shapes, so a dim bound to 10**9 is refused here, before TVM's import."""
    import onnx

    proto = symbolic.bind(raw, values) if values else raw
    # Before the checker and TVM's importer: a few bytes can declare a tensor that takes hours
    # to construct and schedule, and external data would be read from paths the model names.
    _check_declared(proto.graph, path.name)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise UserError(f"{path}: invalid ONNX model: {_first_line(err)}") from None
    return proto


def _check_declared(graph, label: str) -> None:
    """Refuse external weights and declared shapes over the element caps (inputs, outputs,
    annotated intermediates and weights of the main graph, the inputs' symbolic dims as bound;
    other dimensions given by name are checked after import, in `_check_inferred`)."""
    from onnx import TensorProto

    shapes = []
    for tensor in graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            raise UserError(f"{label}: weight {tensor.name} is stored outside the file; save the model with its weights inside")
        shapes.append((tensor.name, tuple(tensor.dims)))
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        shapes.append((info.name, tuple(d.dim_value for d in dims if d.HasField("dim_value"))))
    for name, shape in shapes:
        if any(d < 0 for d in shape):
            raise UserError(f"{label}: tensor {name} declares a negative dimension: {list(shape)}")
    _check_elements(shapes, label)


def _check_elements(shapes, label: str) -> None:
    """Each tensor within `MAX_ELEMENTS`, all of them together within `MAX_MODEL_ELEMENTS`."""
    total = 0
    for name, shape in shapes:
        try:
            check_elements(name, shape)
        except UserError as err:
            raise UserError(f"{label}: {err}") from None
        total += prod(shape)
    if total > MAX_MODEL_ELEMENTS:
        raise UserError(f"{label}: its tensors hold {total:,} elements in all, over the limit of "
                        f"{MAX_MODEL_ELEMENTS:,} for a model")


def fused_module(proto, label: str):
    """The Relax module of `proto` after legalisation, constant folding and operator fusion."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(proto, keep_params_in_input=False)
    except tvm.error.OpNotImplemented as err:
        raise UserError(f"{label}: {_first_line(err)}") from None
    except Exception as err:  # the importer raises many error types for models it cannot read
        raise UserError(f"{label}: TVM cannot import the model: {_first_line(err)}") from None
    _check_static(mod["main"], label)
    _check_inferred(mod["main"], label)
    passes = [
        relax.transform.CanonicalizeBindings(),  # `(x, mask)[0]` after `_inference_mode` is x
        relax.transform.DeadCodeElimination(),  # the masks nothing reads
        relax.transform.LegalizeOps(fast_math()),
        relax.transform.FoldConstant(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.RemoveUnusedOutputs(),  # a fused function's outputs that no one reads
        relax.transform.FuseTIR(),
    ]
    try:
        mod["main"] = _inference_mode(mod["main"])
        return tvm.transform.Sequential(passes)(fuse_matmul_layouts(mod))
    except Exception as err:  # a Relax operator without a TIR lowering, or a pass refusing the module
        raise UserError(f"{label}: TVM cannot lower the model to kernels: {_first_line(err)}") from None


def fast_math() -> dict:
    """LegalizeOps overrides for float32 exp, erf, tanh and what is built on them (sigmoid,
    softmax, GELU, SiLU): polynomials of plain arithmetic, `fast_exp` (Cephes' exp, as TOPI's
    `fast_exp` evaluates it but for a shorter dependency chain) and TOPI's `fast_erf` /
    `fast_tanh` (Eigen's erf and tanh); relative error about 1e-7, within the 1e-4 the model is
    held to against ONNX Runtime, whose MLAS evaluates such polynomials too. LLVM has no vector
    `expf`/`erff`/`tanhf`: TVM's own lowering calls libm once per lane, so a GELU matmul's
    epilogue outweighed its matmul (docs/models.md#epilogues), where a polynomial vectorises
    with the write-back. Softmax is TOPI's `fast_softmax` over `fast_exp` (`softmax`). A power
    by a constant in ROOT_POWERS is square roots and products (LRN's x^0.75). Other dtypes and
    exponents keep TVM's own lowering."""
    import tvm
    from tvm import topi

    def sigmoid(x):
        one = tvm.tirx.const(1.0, x.dtype)
        return topi.divide(one, topi.add(one, fast_exp(topi.negative(x))))

    def gelu(x):
        half = tvm.tirx.const(0.5, x.dtype)
        return topi.multiply(x, topi.add(half, topi.multiply(topi.fast_erf(topi.multiply(x, 0.5**0.5)), half)))

    def gelu_tanh(x):
        cube = topi.multiply(topi.multiply(topi.multiply(x, x), x), 0.044715)
        inner = topi.multiply(topi.add(x, cube), (2 / 3.141592653589793) ** 0.5)
        return topi.multiply(topi.multiply(x, 0.5), topi.add(topi.fast_tanh(inner), 1.0))

    def silu(x):
        return topi.multiply(x, sigmoid(x))

    def softmax_(x, axis):
        return softmax(x, int(axis))

    def power(bb, call):
        exponent = call.args[1]
        value = (float(exponent.value.numpy()) if isinstance(exponent, tvm.ir.expr.Constant)
                 and exponent.value.numpy().size == 1 else None)
        if str(call.args[0].ty.dtype) != "float32" or value not in ROOT_POWERS:
            return default_power(bb, call)
        return bb.call_te(lambda x: _root_power(topi, x, value), call.args[0], primfunc_name_hint="power")

    default_power = tvm.ir.Op.get("relax.power").get_attr("FLegalize")

    def override(op: str, fn, attrs=()):
        default = tvm.ir.Op.get(op).get_attr("FLegalize")

        def legalize(bb, call):
            if str(call.args[0].ty.dtype) != "float32":
                return default(bb, call)
            extra = [getattr(call.attrs, a) for a in attrs]
            return bb.call_te(fn, call.args[0], *extra, primfunc_name_hint=op.rsplit(".", 1)[1])

        return legalize

    return {
        "relax.exp": override("relax.exp", fast_exp),
        "relax.erf": override("relax.erf", topi.fast_erf),
        "relax.tanh": override("relax.tanh", topi.fast_tanh),
        "relax.sigmoid": override("relax.sigmoid", sigmoid),
        "relax.nn.softmax": override("relax.nn.softmax", softmax_, ("axis",)),
        "relax.nn.gelu": override("relax.nn.gelu", gelu),
        "relax.nn.gelu_tanh": override("relax.nn.gelu_tanh", gelu_tanh),
        "relax.nn.silu": override("relax.nn.silu", silu),
        "relax.power": power,
    }


# Cephes' expf polynomial (TOPI's `fast_exp` takes the same): e^r ~ 1 + r + r^2 * P(r) on
# |r| <= ln 2 / 2, P's coefficients highest degree first.
EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                  5.0000001201e-1)
# Inputs clamped to [EXP_LOW, EXP_HIGH]: e^x stays a normal float (2^-126 .. 2^128 x (1 - 2^-24)),
# so n = round(x / ln 2) + 127 is a valid biased exponent; below, e^x < 1.2e-38 reads as that.
EXP_LOW, EXP_HIGH = -87.33654, 88.37626
FLT_MIN = 2.0**-126  # float32's least normal value
# 1.5 x 2^23: added to t in [-2^22, 2^22], it leaves round(t) in the mantissa's low bits (the
# addition rounds to nearest), so n and its exponent bits come without a floor or a conversion.
ROUND_MAGIC = 12582912.0


def fast_exp(x):
    """e^x for a float32 tensor in plain vectorisable arithmetic, within 1e-5 relative of the
    exact value where it is a normal float (Cephes' expf as TOPI's `fast_exp` evaluates it):
    n = round(x / ln 2) by the ROUND_MAGIC addition, r = x - n ln 2, e^r by EXP_POLYNOMIAL in
    Estrin's scheme (r^2, then independent pairs: a chain of 4 multiply-adds where Horner's
    has 7), times 2^n built in the exponent bits; no floor and no float-to-int conversion, so
    a vector's chain of dependent operations is about half TOPI's (evidence:
    docs/benchmarks.md, the softmax A/B)."""
    from tvm import te, tirx

    f32 = "float32"

    def c(v):
        return tirx.const(v, f32)

    def exp(*i):
        v = te.max(te.min(x(*i), c(EXP_HIGH)), c(EXP_LOW))
        t = v * c(1.4426950408889634) + c(ROUND_MAGIC)
        # n from t's bits (its low mantissa bits hold n + 2^22, the magic's own 0x400000): the
        # simplifier would cancel a float `t - ROUND_MAGIC` back to the unrounded product
        n = tirx.reinterpret("int32", t) - tirx.const(0x4B400000, "int32")
        r = v - tirx.Cast(f32, n) * c(0.6931471805599453)
        r2 = r * r
        p0, p1, p2, p3, p4, p5 = (c(p) for p in EXP_POLYNOMIAL)
        poly = (p5 + p4 * r) + r2 * ((p3 + p2 * r) + r2 * (p1 + p0 * r))
        scale = tirx.reinterpret(f32, (n + tirx.const(127, "int32")) << tirx.const(23, "int32"))
        return (r + c(1.0) + r2 * poly) * scale

    return te.compute(x.shape, exp, name="T_exp", tag="elemwise")


def softmax(x, axis: int):
    """Softmax of a float32 tensor along `axis` as TOPI's `fast_softmax` builds it (its blocks
    T_softmax_maxelem, T_softmax_delta, T_softmax_expsum, T_softmax_norm), its exp `fast_exp`
    and its division a multiply by the row sum's reciprocal."""
    from tvm import te, tirx

    axis = axis % len(x.shape)
    reduced = tuple(d for i, d in enumerate(x.shape) if i != axis)

    def along(indices, k):
        return indices[:axis] + (k,) + indices[axis:]

    def others(indices):
        return tuple(v for i, v in enumerate(indices) if i != axis)

    k1 = te.reduce_axis((0, x.shape[axis]), name="k")
    k2 = te.reduce_axis((0, x.shape[axis]), name="k")
    maxelem = te.compute(reduced, lambda *i: te.max(x[along(i, k1)], axis=k1), name="T_softmax_maxelem")
    delta = te.compute(x.shape, lambda *i: x[i] - maxelem[others(i)], name="T_softmax_delta")
    exp = fast_exp(delta)
    expsum = te.compute(reduced, lambda *i: te.sum(exp[along(i, k2)], axis=k2), name="T_softmax_expsum")
    # times the row's reciprocal, which LLVM hoists out of the row: a multiply an element where
    # a division (a vector every 5 cycles on a Zen 3) was a sixth of the kernel over 128 x 1000;
    # within 2 ulp of the quotient, as MLAS scales its rows. A quotient below FLT_MIN is 0: as a
    # subnormal it costs an Intel core a microcode assist wherever it is produced or read (an
    # attention's masked half, e^x clamped to FLT_MIN over a row sum above 1: its probabilities
    # times V ran 6.7 ms for ONNX Runtime's 0.1 on an Emerald Rapids Xeon; evidence:
    # docs/evidence.md#subnormal-probabilities)
    one, zero = tirx.const(1.0, x.dtype), tirx.const(0.0, x.dtype)
    tiny = tirx.const(FLT_MIN, x.dtype)

    def norm(*i):
        total = expsum[others(i)]
        return tirx.Select(exp[i] < tiny * total, zero, exp[i]) * (one / total)

    return te.compute(x.shape, norm, name="T_softmax_norm", attrs={"axis": axis})


# Constant exponents a power is computed for with square roots and multiplies (vectorised
# `sqrt`), not libm's `powf` per lane: LRN's x^0.75 (AlexNet, GoogLeNet, ZFNet), x^0.5, x^1.5.
ROOT_POWERS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def _root_power(topi, x, value: float):
    """x ** value for `value` in ROOT_POWERS, from sqrt(x), sqrt(sqrt(x)) and products (the same
    NaN for a negative base as `powf`, within a few ulps of it)."""
    whole, rest = int(value), value - int(value)
    parts = [x] * whole
    if rest:
        root = topi.sqrt(x)
        parts += {0.25: [topi.sqrt(root)], 0.5: [root], 0.75: [root, topi.sqrt(root)]}[rest]
    out = parts[0]
    for part in parts[1:]:
        out = topi.multiply(out, part)
    return out


def _inference_mode(main):
    """`main` with the operators that return several tensors rewritten into single-output ones,
    so that every fused kernel has one output, as the tile model needs:

    - Dropout is the identity at inference (its ratio and training flag are ignored): the call
      becomes `(x, ones_like(x))`, and the mask, which nothing reads in an inference graph, is
      then removed as dead code (an ONNX model that outputs the mask gets a kernel of ones);
    - ONNX Sum, which TVM imports as a reduction over a stack of its (broadcast) inputs, becomes
      a chain of adds: elementwise operators that fuse with their neighbours, where the stack
      was a copy the reduction could not read as a parameter;
    - Split becomes one strided slice per part, each a kernel of its own (or fused with its
      consumer) instead of one kernel writing every part;
    - BatchNormalization at inference (`training=False`: the stored mean and variance, which it
      returns unchanged) becomes `x * scale + shift` per channel, scale = gamma / sqrt(var + eps)
      and shift = beta - mean * scale, which constant folding computes once from the weights:
      two broadcast operators that fuse into the convolution before them as its epilogue, as
      ONNX Runtime folds them, instead of a batch-norm kernel of their own (TVM legalises
      batch_norm into one function returning the three tensors, which fuses with nothing).
    """
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def dropout(call, _matches):
        data = call.args[0]
        return relax.Tuple([data, relax.op.ones_like(data)])

    def split(call, _matches):
        data, parts = call.args[0], call.ty.fields
        axis = int(call.attrs.axis) % len(parts[0].shape.values)
        begin, slices = 0, []
        for part in parts:
            end = begin + int(part.shape.values[axis])
            slices.append(relax.op.strided_slice(data, axes=[axis], begin=[begin], end=[end]))
            begin = end
        return relax.Tuple(slices)

    def batch_norm(call, _matches):
        data, gamma, beta, mean, var = call.args
        attrs, ndim = call.attrs, len(call.ty.fields[0].shape.values)
        if attrs.training or not (attrs.center and attrs.scale):
            return call
        axis = int(attrs.axis) % ndim
        channels = [1] * ndim
        channels[axis] = -1
        eps = relax.const(float(attrs.epsilon), call.ty.fields[0].dtype)
        gamma, beta, mean_c, var_c = (relax.op.reshape(t, channels) for t in (gamma, beta, mean, var))
        scale = relax.op.divide(gamma, relax.op.sqrt(relax.op.add(var_c, eps)))
        out = relax.op.add(relax.op.multiply(data, scale), relax.op.subtract(beta, relax.op.multiply(mean_c, scale)))
        return relax.Tuple([out, mean, var])

    def stacked_sum(call, matches):
        stack = matches[stacked]
        axes = call.attrs.axis
        if call.attrs.keepdims or axes is None or [int(a) for a in axes] != [int(stack.attrs.axis)]:
            return call
        parts = stack.args[0].fields
        out = parts[0]
        for part in parts[1:]:
            out = relax.op.add(out, part)
        return out

    stacked = is_op("relax.stack")(wildcard())
    main = rewrite_call(is_op("relax.sum")(stacked), stacked_sum, main)
    main = rewrite_call(is_op("relax.nn.dropout")(wildcard()), dropout, main)
    main = rewrite_call(is_op("relax.nn.batch_norm")(wildcard(), wildcard(), wildcard(), wildcard(), wildcard()),
                        batch_norm, main)
    return rewrite_call(is_op("relax.split")(wildcard()), split, main)


def _check_static(main, label: str) -> None:
    for param in main.params:
        values = getattr(getattr(param.ty, "shape", None), "values", None)
        if values is None or any(not hasattr(v, "value") for v in values):
            raise UserError(f"{label}: input {param.name} has a dimension with neither a size nor a name; "
                            "export the model with fixed or named (symbolic) dims")


def _check_inferred(main, label: str) -> None:
    """The element caps on every tensor the imported model computes, before any pass runs: an
    `Expand` or `ConstantOfShape` can make a huge tensor that the file never declares, which
    constant folding would then try to allocate."""
    from tvm import relax

    shapes = [(p.name, _shape(p.ty)) for p in main.params]
    for block in main.body.blocks:
        for binding in block.bindings:
            types = binding.var.ty.fields if isinstance(binding.var.ty, relax.TupleType) else (binding.var.ty,)
            for ty in types:
                values = getattr(getattr(ty, "shape", None), "values", None)
                if values is not None and all(hasattr(v, "value") for v in values):
                    shapes.append((f"{binding.var.name} (computed by the model)", tuple(int(v) for v in values)))
    _check_elements(shapes, label)


def _walk(mod, name: str) -> ImportedModel:
    """Operators of the fused `main` in binding order, with their argument sources.

    `producer` maps a Relax variable to `("input", name, 0)`, `("operator", index, item)` or
    `("tuple", entries)` (a tuple of such entries, as bound before a model's several outputs).
    """
    import tvm
    from tvm import relax

    main = mod["main"]
    call_tir = tvm.ir.Op.get("relax.call_tir")
    inputs = tuple((p.name, _shape(p.ty), _dtype(p.ty)) for p in main.params)
    producer: dict = {p: ("input", p.name, 0) for p in main.params}
    constants: list = []
    operators: list[Operator] = []
    calls: dict[str, int] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir)):
                producer[binding.var] = _entry(value, producer, name)
                continue
            func_name = value.args[0].name_hint
            calls[func_name] = calls.get(func_name, 0) + 1
            label = func_name if calls[func_name] == 1 else f"{func_name}#{calls[func_name]}"
            args = tuple(_arg(a, producer, constants, name) for a in value.args[1].fields)
            operators.append(_operator(len(operators), label, func_name, mod[func_name], args, binding.var.ty))
            producer[binding.var] = ("operator", len(operators) - 1, 0)
    outputs = _outputs(_entry(main.body.body, producer, name), name)
    return ImportedModel(name, inputs, _with_constants(operators), outputs, tuple(constants))


def _with_constants(operators: list[Operator]) -> tuple[Operator, ...]:
    """The operators, each expression naming its `constants`: the parameters a weight fills in
    every call of its PrimFunc (the calls share one construction and one kernel)."""
    fixed: dict[str, set[int]] = {}
    for op in operators:
        weights = {i for i, a in enumerate(op.args) if a.source == "constant"}
        fixed[op.func_name] = fixed.get(op.func_name, weights) & weights
    out = []
    for op in operators:
        names = tuple(op.expr.args[i].name for i in sorted(fixed[op.func_name])) if op.expr is not None else ()
        out.append(replace(op, expr=replace(op.expr, constants=names)) if names else op)
    return tuple(out)


def _entry(value, producer: dict, name: str):
    """The producer entry of a binding that is not a kernel call: alias, tuple item or tuple."""
    import tvm
    from tvm import relax

    if isinstance(value, relax.Var) and value in producer:
        return producer[value]
    if isinstance(value, relax.TupleGetItem):
        whole = _entry(value.tuple_value, producer, name)
        if whole[0] == "tuple":
            return whole[1][int(value.index)]
        return whole[0], whole[1], int(value.index)
    if isinstance(value, relax.Tuple):
        return ("tuple", tuple(_entry(f, producer, name) for f in value.fields))
    if isinstance(value, tvm.ir.expr.Constant):  # a returned tensor that constant folding computed
        return ("constant", None, 0)
    raise UserError(f"{name}: unsupported Relax expression after lowering: {_first_line(value)}")


def _arg(expr, producer: dict, constants: list, name: str) -> Arg:
    import tvm

    sinfo = expr.ty
    if isinstance(expr, tvm.ir.expr.Constant):
        constants.append(expr.value.numpy())
        return Arg("constant", len(constants) - 1, _shape(sinfo), _dtype(sinfo))
    source, ref, item = _entry(expr, producer, name)
    return Arg(source, ref, _shape(sinfo), _dtype(sinfo), item)


def _outputs(entry, name: str) -> tuple[tuple[int, int], ...]:
    entries = entry[1] if entry[0] == "tuple" else (entry,)
    if any(e[0] == "constant" for e in entries):
        raise UserError(f"{name}: a model output is a constant (a Dropout mask is all ones at inference); "
                        "export the model without that output")
    if any(e[0] != "operator" for e in entries):
        raise UserError(f"{name}: a model output is not computed by any operator")
    return tuple((e[1], e[2]) for e in entries)


def _shape(sinfo) -> tuple[int, ...]:
    return tuple(int(v) for v in sinfo.shape.values)


def _dtype(sinfo) -> str:
    return str(sinfo.dtype)


def _operator(index, label, func_name, func, args, out_ty) -> Operator:
    from tvm import relax

    types = out_ty.fields if isinstance(out_ty, relax.TupleType) else (out_ty,)
    outputs = tuple((_shape(t), _dtype(t)) for t in types)
    # Fused functions are private to the Relax module; a kernel of its own needs an exported name.
    func = func.with_attr("global_symbol", "main")
    if len(outputs) > 1:
        reason = f"{func_name}: returns {len(outputs)} tensors; the tile model has one output per kernel"
        return Operator(index, label, func_name, "multi-output", args, outputs, None, reason, func)
    func, kind, expr, reason = prepare(func, func_name, outputs[0][1], len(args))
    return Operator(index, label, func_name, kind, args, outputs, expr, reason, func)


def prepare(func, name: str, dtype: str, n_inputs: int):
    """`(func, kind, expr, reason)` for a fused PrimFunc: the function as mapped (collapsed into
    one block when it has no reduction), its kind, its TensorExpr or None and the reason."""
    func = _drop_dead_blocks(func)
    reductions = _reduction_blocks(func)
    if reductions > 1:
        return (func, "multi-reduction", *_mapped(func, name, dtype, n_inputs))
    if reductions == 1:
        func = _inline_epilogue_chain(func)
        return (func, "reduction", *_mapped(func, name, dtype, n_inputs))
    kind = "layout" if _only_copies(func) else "elementwise"
    reasons = []
    for collapse in (_inline_into_last, _reverse_inline_into_first):
        collapsed = collapse(func)
        if collapsed is not None:
            expr, reason = _mapped(collapsed, name, dtype, n_inputs)
            if expr is not None:
                return collapsed, kind, expr, ""
            reasons.append(reason)
    expr, reason = _mapped(func, name, dtype, n_inputs)
    # the first collapse's reason names the index a user would look for (the output's view)
    return func, kind, expr, reasons[0] if expr is None and reasons else reason


def _drop_dead_blocks(func):
    """`func` without the blocks whose results nothing reads: a batch norm's running mean and
    variance (Relax computes its three outputs; fusion drops the two unused ones from the
    function's outputs but not the blocks computing them). Left in, a dead block can come last
    and be taken for the function's output block."""
    sch, blocks = _schedule(func)
    params = {str(p.name) for p in func.params}
    while True:
        read = {str(r.source.name) for b in blocks for r in sch.get(b).reads}
        dead = [b for b in blocks if not any(str(w.source.name) in params | read for w in sch.get(b).writes)]
        if not dead:
            return sch.mod["main"]
        try:
            sch.compute_inline(dead[0])  # inlining into no consumer removes the block
        except Exception:  # a block TVM will not remove: keep the function as it is
            return func
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))


def _mapped(func, name: str, dtype: str, n_inputs: int):
    """(TensorExpr, "") or (None, the reason it cannot be read off the PrimFunc)."""
    from workbench.ops.tensor_expr import from_prim_func

    try:
        expr = from_prim_func(func, name, {}, dtype, n_inputs=n_inputs)
        names = {a.name for a in expr.args}
        inner = [t.name for t in expr.inputs if names and t.name not in names]
        if inner:  # the main block reads a block of the function that is no parameter's copy
            return None, f"{name}: the main block reads {inner[0]}, computed inside the function, not a parameter"
        return expr, ""
    except UserError as err:
        return None, str(err)
    except Exception as err:  # TVM analyses raise their own error classes
        return None, f"{name}: {_first_line(err)}"


def _schedule(func):
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return sch, list(sch.get_child_blocks(sch.get_sblock("root")))


def _reduction_blocks(func) -> int:
    sch, blocks = _schedule(func)
    return sum(is_reduction(sch.get(b)) for b in blocks)


def _only_copies(func) -> bool:
    """True when every block stores a plain load: reshape, transpose, slicing (no arithmetic)."""
    import tvm

    sch, blocks = _schedule(func)
    return all(isinstance(getattr(sch.get(b).body, "value", None), tvm.ir.expr.TensorLoad) for b in blocks)


def _inline_epilogue_chain(func):
    """The blocks between the reduction and the output block inlined into the output block, so
    the epilogue is one block (GELU's `x * 0.5 * (1 + erf(x / sqrt 2))` reads the reduction
    twice, which the codegen's `reverse_compute_inline` refuses over a chain of blocks)."""
    sch, blocks = _schedule(func)
    reducing = [i for i, b in enumerate(blocks) if is_reduction(sch.get(b))]
    try:
        for block in reversed(blocks[reducing[0] + 1 : -1]):
            sch.compute_inline(block)
    except Exception:  # leave the function as fused when TVM cannot inline a block
        return func
    return sch.mod["main"]


def _inline_into_last(func):
    """Every block inlined into the output block (iterating over the output), or None."""
    sch, blocks = _schedule(func)
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_inline(block)
        return _relayout(sch, blocks[-1])
    except Exception:  # a block TVM cannot inline (several consumers, opaque access)
        return None


def _reverse_inline_into_first(func):
    """Every block reverse-inlined into the first one (iterating over its input), or None."""
    sch, blocks = _schedule(func)
    names = [sch.get(b).name_hint for b in blocks]
    try:
        for block_name in names[1:]:
            sch.reverse_compute_inline(sch.get_sblock(block_name))
        return _relayout(sch, sch.get_sblock(names[0]))
    except Exception:  # the consumer's index is not an invertible map of the producer's
        return None


def _relayout(sch, block):
    """The function after an identity `transform_block_layout` of its one block: TVM rewrites
    the indices under the iterators' bounds, so a reshape's `(h * 64 + w) // 128 % 32` inlined
    into a transpose becomes plain `h`, which `detect_linear_equation` can read."""
    from tvm.tirx import IndexMap

    rank = len(sch.get(block).iter_vars)
    sch.transform_block_layout(block, IndexMap.from_func(lambda *axes: list(axes), ndim=rank))
    return sch.mod["main"]


def _first_line(obj) -> str:
    lines = [l.strip() for l in str(obj).splitlines() if l.strip()]
    return (lines[0] if lines else type(obj).__name__)[:300]
