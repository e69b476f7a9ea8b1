"""Symbolic dims of an ONNX model (`dim_param`, e.g. `batch`, `seq`): bound to values before
TVM's import, and which operators depend on each.

A model input declared as `x[batch, seq, 128]` is imported with every symbolic dim of the
inputs bound to an integer (`workbench model PATH --dim batch=4,seq=16`; a dim not given is
bound to 1 and the report says so): `bind` rewrites `dim_param` to `dim_value` wherever that
name appears on the graph's inputs, outputs and annotated intermediates, so TVM imports a
static model and the element caps (`onnx_import._check_declared`) apply to the bound shapes.
Only the names on the graph's inputs are symbolic dims here: a `dim_param` that appears only on
an output or an intermediate (an exporter's `unk__3`) is computed from the inputs and is left to
TVM's shape inference.

Which operators depend on a dim is found by building the model at two bindings (the dim at its
value and at another, every other dim as bound) and comparing each operator's argument and
output shapes (`dependents`): simple and exact for whatever TVM's import and fusion make of the
model, where tracking the name through every ONNX operator would repeat their shape rules. When
the two fused graphs differ in their operators (a dim of 1 broadcasting one way and 2 another),
the report says it cannot tell rather than guess.

A matmul-class operator (main block `matmul`: ONNX MatMul, Gemm and batched MatMul after legalisation)
whose M or B depends on the dim is a `workbench vortex compile --op matmul --shape M=dyn,...`
workload: `matmul_params` reads M, N, K and B off its axes (B the axes both operands read, M
those only the left one reads, N only the right one), and the catalog's own `split_dynamic`
decides whether that workload is one Vortex compiles (one dynamic extent, one of
`DYNAMIC_PARAMS`); otherwise the reason is reported instead of a command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

from workbench.errors import UserError
from workbench.ops.catalog import DYN, DYNAMIC_PARAMS, split_dynamic
from workbench.ops.shapes import MAX_ELEMENTS

DEFAULT_VALUE = 1  # a symbolic dim the user does not bind: the smallest valid extent
MATMUL_BLOCKS = ("matmul",)  # main block of Relax's matmul (2-D, batched, Gemm) after LegalizeOps


@dataclass(frozen=True)
class MatmulWorkload:
    """A matmul-class operator whose shape depends on a symbolic dim, as a catalog workload."""

    operator: str
    params: tuple[tuple[str, object], ...]  # catalog matmul parameters, the dependent one `dyn`; () if none
    reason: str = ""  # why Vortex cannot compile it, when params is ()
    value: int = 0  # the `dyn` parameter's extent at the bound values (`vortex run --shape M=value`)

    @property
    def dynamic(self) -> str:
        """The parameter that is `dyn` ("" when there is no workload)."""
        return next((k for k, v in self.params if v == DYN), "")


@dataclass(frozen=True)
class SymbolicDim:
    name: str
    value: int
    default: bool  # True: not given, bound to DEFAULT_VALUE
    operators: tuple[str, ...] | None = None  # operators whose shapes depend on it; None: cannot tell
    matmuls: tuple[MatmulWorkload, ...] = ()
    note: str = ""  # why `operators` is None


def parse_dims(items: str | list[str] | tuple[str, ...] | None) -> dict[str, int]:
    """`--dim NAME=VALUE[,NAME=VALUE]` (the option may be repeated) as {name: value}; a
    malformed item, a repeated name or a value that is not an integer is a UserError (`resolve`
    checks the values' range)."""
    if items is None:
        return {}
    texts = [items] if isinstance(items, str) else list(items)
    out: dict[str, int] = {}
    for text in texts:
        if not text.strip():
            continue
        for item in text.split(","):
            name, sep, value = (s.strip() for s in item.partition("="))
            if not sep or not name:
                raise UserError(f"--dim: {item.strip()!r} is not of the form NAME=VALUE (e.g. batch=4)")
            if name in out:
                raise UserError(f"--dim: {name} is given twice")
            if not re.fullmatch(r"-?[0-9]+", value):
                raise UserError(f"--dim: {item.strip()!r}: {name} must be a positive integer")
            out[name] = int(value)
    return out


def input_dims(graph) -> tuple[str, ...]:
    """The symbolic dims of a graph's inputs (weights listed as inputs excluded), in order of
    first appearance."""
    weights = {t.name for t in graph.initializer}
    names: list[str] = []
    for info in graph.input:
        if info.name in weights or not info.type.HasField("tensor_type"):
            continue
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param not in names:
                names.append(dim.dim_param)
    return tuple(names)


def resolve(names: tuple[str, ...], given: Mapping[str, int], label: str) -> tuple[SymbolicDim, ...]:
    """Each of the model's symbolic dims with its value: given, or DEFAULT_VALUE. A given name
    the model does not have, or a value that is not a positive integer within one tensor's
    element cap, is a UserError."""
    unknown = [n for n in given if n not in names]
    if unknown:
        has = f"its symbolic dims are {', '.join(names)}" if names else "it has no symbolic dims"
        raise UserError(f"{label}: --dim {unknown[0]}: the model has no symbolic dim {unknown[0]!r} ({has})")
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--dim {name}={value}: {name} must be a positive integer")
        # a tensor with this dim is over the int32 cap whatever its other dims (and ONNX's dims are int64)
        if value > MAX_ELEMENTS:
            raise UserError(f"--dim {name}={value}: over the limit of {MAX_ELEMENTS} elements of a tensor (int32 indexing)")
    return tuple(SymbolicDim(n, given.get(n, DEFAULT_VALUE), n not in given) for n in names)


def bind(proto, values: Mapping[str, int]):
    """A copy of `proto` with every `dim_param` named in `values` on the graph's inputs,
    outputs and value_info replaced by its value."""
    import onnx

    bound = onnx.ModelProto()
    bound.CopyFrom(proto)
    graph = bound.graph
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        if not info.type.HasField("tensor_type"):
            continue
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]  # the oneof: clears dim_param
    return bound


def dependents(dim: SymbolicDim, operators, probe_operators, probe_value: int) -> SymbolicDim:
    """`dim` with the operators whose shapes differ between `operators` (the model at the
    bound values) and `probe_operators` (the same with `dim` at `probe_value`), and the
    matmul-class ones among them as catalog workloads."""
    if [op.name for op in operators] != [op.name for op in probe_operators]:
        note = (f"the fused operators differ at {dim.name}={dim.value} and {dim.name}={probe_value}, "
                "so which depend on it cannot be told")
        return SymbolicDim(dim.name, dim.value, dim.default, None, (), note)
    names, matmuls = [], []
    for op, probe in zip(operators, probe_operators):
        if _shapes(op) == _shapes(probe):
            continue
        names.append(op.name)
        if op.expr is not None and probe.expr is not None and op.expr.main_block in MATMUL_BLOCKS:
            matmuls.append(matmul_workload(op.name, op.expr, probe.expr, dim.name))
    return SymbolicDim(dim.name, dim.value, dim.default, tuple(names), tuple(matmuls))


def _shapes(op) -> tuple:
    return tuple(a.shape for a in op.args), tuple(shape for shape, _ in op.outputs)


def matmul_params(expr) -> dict[str, object] | None:
    """The catalog matmul parameters (M, N, K, B, trans_a, trans_b) of a matmul-class
    TensorExpr, or None when it is not two operands and one reduce axis."""
    if len(expr.inputs) != 2 or len(expr.reduce) != 1:
        return None
    (k,) = expr.reduce
    lhs, rhs = expr.inputs
    groups: dict[str, list[int]] = {"B": [], "M": [], "N": []}
    for a in expr.spatial:
        left, right = lhs.uses_axis(a), rhs.uses_axis(a)
        if left and right:
            groups["B"].append(a)
        elif left or right:
            groups["M" if left else "N"].append(a)
    if not groups["M"] or not groups["N"]:
        return None
    extent = {g: prod(expr.axes[a].extent for a in axes) for g, axes in groups.items()}
    return {
        "M": extent["M"], "N": extent["N"], "K": expr.axes[k].extent,
        "B": extent["B"] if groups["B"] else 0,
        # an operand is stored transposed when its last dimension is not the reduction's
        "trans_a": k not in lhs.axes_of_dim(len(lhs.shape) - 1),
        "trans_b": k in rhs.axes_of_dim(len(rhs.shape) - 1),
    }


def matmul_workload(name: str, expr, probe_expr, dim: str) -> MatmulWorkload:
    """The Vortex workload of a matmul-class operator whose shape depends on `dim`: the
    parameters that differ between the two bindings become `dyn`; the catalog decides."""
    params, probe = matmul_params(expr), matmul_params(probe_expr)
    if params is None or probe is None:
        return MatmulWorkload(name, (), "not read as a matmul (two operands, one reduction)")
    varying = [p for p in ("B", "M", "N", "K") if params[p] != probe[p]]
    if not varying:  # the operator's other tensors (an epilogue's) depend on the dim, not the product
        return MatmulWorkload(name, (), f"its M, N, K and B do not depend on {dim}")
    allowed = DYNAMIC_PARAMS["matmul"]
    if len(varying) != 1 or varying[0] not in allowed:
        verb = "depend" if len(varying) > 1 else "depends"
        return MatmulWorkload(name, (), f"{' and '.join(varying)} {verb} on {dim}; Vortex compiles a matmul with "
                                         f"one dynamic extent, one of {', '.join(allowed)}")
    workload = {**params, varying[0]: DYN}
    try:
        split_dynamic("matmul", workload)
    except UserError as err:
        return MatmulWorkload(name, (), str(err))
    return MatmulWorkload(name, tuple(workload.items()), value=params[varying[0]])


def vortex_command(workload: MatmulWorkload, device: str) -> str:
    """The `workbench vortex compile` line of a matmul workload (parameters at their catalog
    defaults left out), or "" when there is none."""
    if not workload.params:
        return ""
    p = dict(workload.params)
    shape = [f"{k}={p[k]}" for k in ("B", "M", "K", "N") if not (k == "B" and p[k] == 0)]
    shape += [f"{k}=true" for k in ("trans_a", "trans_b") if p[k]]
    return f"workbench vortex compile --op matmul --shape {','.join(shape)} --device {device} --out DIR"
