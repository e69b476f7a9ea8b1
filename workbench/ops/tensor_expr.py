"""TensorExpr: an operator as axes plus affine index maps, read off the TVM IR.

Roller (§3.1) needs, for any tile shape, the data tile of every input and output. We never keep a
per-operator table for that: the operator is built as a TVM PrimFunc, and the main block's
read/write regions give, per tensor dimension, an affine map of the block's iteration variables
(`tvm.sym.detect_linear_equation`). A conv window `h*stride + r` then yields a data-tile extent of
`(t_h - 1) * stride + t_r` without anyone writing that formula down.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from math import prod
from typing import Mapping, Sequence

from workbench.errors import UserError
from workbench.frozen import hash_once

SPATIAL, REDUCE = "spatial", "reduce"
# Rounds of `split_div_mod`: a round is needed per level of division nested in a sum (a reshape
# that merges and re-splits dimensions needs two); each round splits an axis at least in two.
MAX_SPLIT_ROUNDS = 4
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int32": 4}


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    kind: str  # SPATIAL | REDUCE
    fused_from: tuple[str, ...] = ()  # original axes, outermost first, after axis fusion


@hash_once
@dataclass(frozen=True)
class TensorAccess:
    """One tensor of the expression: `index[d] = (coeffs, const)`, one coefficient per axis."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "input" | "output"
    index: tuple[tuple[tuple[int, ...], int], ...]

    @cached_property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @cached_property
    def nbytes(self) -> int:
        """The whole tensor's bytes."""
        return prod(self.shape) * self.itemsize

    @cached_property
    def strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each dimension (row-major)."""
        return tuple(prod(self.shape[d + 1 :]) for d in range(len(self.shape)))

    def axes_of_dim(self, dim: int) -> tuple[int, ...]:
        """Axes (by position) that index dimension `dim`."""
        return tuple(a for a, c in enumerate(self.index[dim][0]) if c != 0)

    def uses_axis(self, axis: int) -> bool:
        return bool(self.index) and self._used_axes[axis]

    @cached_property
    def terms(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per dimension, (axis, |coefficient|) of every axis its index reads."""
        return tuple(tuple((a, abs(c)) for a, c in enumerate(coeffs) if c) for coeffs, _ in self.index)

    @cached_property
    def _used_axes(self) -> tuple[bool, ...]:
        """Per axis, whether some dimension's index reads it (computed once: the rules and the
        model ask on every tile)."""
        return tuple(any(c != 0 for c in column) for column in zip(*(coeffs for coeffs, _ in self.index)))


@dataclass(frozen=True)
class KernelArg:
    """One parameter of the kernel as a caller passes it: the PrimFunc's buffer, unpadded."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "input" | "output"

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "role": self.role}


@dataclass(frozen=True)
class RowPass:
    """A block after the main block that the CPU template runs as a pass over rows of its own
    (`codegen.common.row_passes`: softmax's exp, sum and division), vectorised or not along its
    innermost loop by the row's length (`rtile.panels.row_vector`)."""

    rows: int  # iterations of its loops outside the innermost one
    extent: int  # iterations of its innermost loop: one row
    ops: int  # arithmetic operations per iteration (`block_ops`)
    reduction: bool  # a reduction over the row (softmax's sum), else elementwise
    # whether the row is contiguous in every tensor it reads (`reads_along_rows`); a reduction
    # over a strided row (softmax over axis 1) stays scalar
    contiguous: bool = True

    def to_dict(self) -> dict:
        return {"rows": self.rows, "extent": self.extent, "ops": self.ops, "reduction": self.reduction,
                "contiguous": self.contiguous}


@hash_once
@dataclass(frozen=True)
class TensorExpr:
    """An operator: axes (spatial first in loop order, then reduce) and its tensors.

    `tensors` holds the inputs in call order followed by the output, as the main block reads
    them (a padded input under its padded shape). `args` are the kernel's parameters in call
    order (inputs, then the output) with the shapes a caller allocates, read once off the
    PrimFunc. `func` is the TVM PrimFunc the expression was read from; it is excluded from
    equality so TensorExprs compare by value.
    """

    op: str
    params: tuple[tuple[str, object], ...]
    axes: tuple[Axis, ...]
    tensors: tuple[TensorAccess, ...]
    dtype: str
    flops: int
    main_block: str = ""
    args: tuple[KernelArg, ...] = ()
    # the blocks after the main block (a pooling's division, a fused bias or activation), in
    # program order: the CPU template keeps its guards where they follow (`rtile.plan`)
    epilogues: tuple[str, ...] = ()
    # whether inputs read as zero past the end of the reduction axes leave the output unchanged
    # (`zero_padded_reduction`): the CPU template may then pad a ragged reduction (`rtile.panels`)
    pads_reduction: bool = False
    # arithmetic operations of the blocks after the main block in all (`epilogue_ops`): a GELU's
    # erf polynomial per output, softmax's exp, sum and division passes; priced by the CPU model
    epilogue_ops: int = 0
    # the part of `flops` that is those blocks' as TVM counts it (`estimate_tir_flops`, an
    # expression repeated by inlining counted each time): what the main block leaves is
    # `main_flops`, which a CPU prices at its register tile's rate; the epilogue it prices apart
    epilogue_flops: int = 0
    # the blocks after the main block when the CPU template runs them as passes over rows of
    # their own (`row_passes`), in program order; () when they fold into the main block's
    # write-back. Priced by the CPU model, row by row
    row_passes: tuple[RowPass, ...] = ()
    # the inputs whose values are fixed before the first call (a model's weights, by name): the
    # CPU template lays out their panels once, ahead of the calls (`rtile.panels.prepacked_inputs`)
    constants: tuple[str, ...] = ()
    # the inputs the main block reads as a copy gathered before the loop nest (by name): a
    # strided pointwise conv's pixels (`ops.pixel_gemm`), a window's im2col (`ops.window_gemm`)
    gathered: tuple[str, ...] = ()
    # the inputs the main block reads as a copy made before the loop nest with their dimensions
    # permuted, the output's row innermost (by name): a matmul's B stored [N, K] (`ops.transposed_gemm`)
    transposed: tuple[str, ...] = ()
    func: object = field(default=None, compare=False, repr=False, hash=False)

    # Views of the frozen fields, computed once per expression: construction asks for them on
    # every tile size it tries.
    @cached_property
    def inputs(self) -> tuple[TensorAccess, ...]:
        return tuple(t for t in self.tensors if t.role == "input")

    @property
    def input_args(self) -> tuple[KernelArg, ...]:
        """The kernel argument of each of `inputs`, in the same order, matched by name: `args`
        can hold more (a fused operator's epilogue parameters, a tensor whose every use
        cancelled, which the main block does not read), in any place; () for an expression
        written as plain values without its kernel's parameters."""
        if not self.args:
            return ()
        by_name = {a.name: a for a in self.args}
        return tuple(by_name[t.name] for t in self.inputs)

    @cached_property
    def output(self) -> TensorAccess:
        return self.tensors[-1]

    @cached_property
    def epilogue_input_bytes(self) -> int:
        """Bytes of the kernel's inputs that the main block does not read (`args` not among
        `tensors`): what a fused operator's blocks after it read, a residual added to a conv's
        output or a bias vector. An argument no block reads (every use cancelled) counts too:
        the expression keeps no record of which block reads what."""
        read = {t.name for t in self.tensors}
        return sum(prod(a.shape) * _arg_bytes(a.dtype) for a in self.args if a.role == "input" and a.name not in read)

    @property
    def main_flops(self) -> int:
        """The main block's flops: `flops` less the blocks' after it (`epilogue_flops`)."""
        return self.flops - self.epilogue_flops

    @property
    def multiply_adds(self) -> bool:
        """Whether the main block is one multiply-add an iteration point (two flops a point: the
        pure expression carries no body, only its flop count): a matmul, gemv or conv, not a row
        sum, maximum or mean."""
        return self.main_flops == 2 * prod(self.extents)

    @cached_property
    def extents(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes)

    @cached_property
    def spatial(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.axes) if a.kind == SPATIAL)

    @cached_property
    def reduce(self) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.axes) if a.kind == REDUCE)

    def axis_index(self, name: str) -> int:
        for i, axis in enumerate(self.axes):
            if axis.name == name:
                return i
        raise KeyError(name)

    def data_tile_shape(self, tensor: int, tile: Sequence[int]) -> tuple[int, ...]:
        """Bounding box of the elements of `tensors[tensor]` touched by one tile.

        Per dimension: for an affine index `sum(c_a * a) + const`, a tile of `t_a` consecutive
        values of each axis spans `sum(|c_a| * (t_a - 1)) + 1` elements, clipped to the extent.
        """
        access = self.tensors[tensor]
        return tuple(min(1 + sum(c * (tile[a] - 1) for a, c in terms), extent)
                     for terms, extent in zip(access.terms, access.shape))

    def workload_dict(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, **{k: _jsonable(v) for k, v in self.params}}

    def to_dict(self) -> dict:
        """Everything but `func`, as JSON: enough for construction and the model, not codegen."""
        return {
            "op": self.op,
            "params": [[k, _jsonable(v)] for k, v in self.params],
            "axes": [{"name": a.name, "extent": a.extent, "kind": a.kind, "fused_from": list(a.fused_from)} for a in self.axes],
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "role": t.role,
                 "index": [[list(coeffs), const] for coeffs, const in t.index]}
                for t in self.tensors
            ],
            "dtype": self.dtype,
            "flops": self.flops,
            "main_block": self.main_block,
            "args": [a.to_dict() for a in self.args],
            "epilogues": list(self.epilogues),
            "pads_reduction": self.pads_reduction,
            "epilogue_ops": self.epilogue_ops,
            **({"epilogue_flops": self.epilogue_flops} if self.epilogue_flops else {}),
            # only where there are some: the recorded fixtures of other operators stay as they were
            **({"row_passes": [p.to_dict() for p in self.row_passes]} if self.row_passes else {}),
            **({"constants": list(self.constants)} if self.constants else {}),
            **({"gathered": list(self.gathered)} if self.gathered else {}),
            **({"transposed": list(self.transposed)} if self.transposed else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TensorExpr":
        """The inverse of `to_dict` (with no PrimFunc: such an expression cannot be built)."""
        return cls(
            op=data["op"],
            params=tuple((k, _freeze(v)) for k, v in data["params"]),
            axes=tuple(Axis(a["name"], int(a["extent"]), a["kind"], tuple(a["fused_from"])) for a in data["axes"]),
            tensors=tuple(
                TensorAccess(
                    name=t["name"], shape=tuple(t["shape"]), dtype=t["dtype"], role=t["role"],
                    index=tuple((tuple(coeffs), int(const)) for coeffs, const in t["index"]),
                )
                for t in data["tensors"]
            ),
            dtype=data["dtype"],
            flops=int(data["flops"]),
            main_block=data["main_block"],
            args=tuple(KernelArg(a["name"], tuple(a["shape"]), a["dtype"], a["role"]) for a in data["args"]),
            epilogues=tuple(data["epilogues"]),
            pads_reduction=bool(data.get("pads_reduction", False)),  # not recorded: never padded
            epilogue_ops=int(data.get("epilogue_ops", 0)),  # not recorded: not priced
            epilogue_flops=int(data.get("epilogue_flops", 0)),  # not recorded: none
            row_passes=tuple(RowPass(int(p["rows"]), int(p["extent"]), int(p["ops"]), bool(p["reduction"]),
                                     bool(p["contiguous"])) for p in data.get("row_passes", ())),  # not recorded: priced as vectorised
            constants=tuple(data.get("constants", ())),  # not recorded: every input passed per call
            gathered=tuple(data.get("gathered", ())),  # not recorded: none gathered
            transposed=tuple(data.get("transposed", ())),  # not recorded: none transposed
        )


def _arg_bytes(dtype: str) -> int:
    """Bytes of one element of a kernel argument: an epilogue may read a dtype the operators
    never compute in (an int64 index), whose width its name gives."""
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    bits = "".join(c for c in dtype if c.isdigit())
    return max(1, int(bits) // 8) if bits else 1


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def from_te(op: str, params: Mapping[str, object], inputs: Sequence, output, dtype: str) -> TensorExpr:
    """Build a TensorExpr from TE tensors: create the PrimFunc and read its main block."""
    from tvm import te

    func = te.create_prim_func(list(inputs) + [output])
    return from_prim_func(func, op, params, dtype, n_inputs=len(inputs))


def from_prim_func(func, op: str, params: Mapping[str, object], dtype: str, n_inputs: int) -> TensorExpr:
    """Read axes and affine index maps off the main block of `func`.

    The main block is the one with reduction iterators (the largest such), or, for injective
    operators, the block writing the function's output. An axis that an index divides or takes
    the remainder of by a constant is first split there (`split_div_mod`), so a grouped conv's
    `ff // 8 * 4 + rc` or a channel shuffle's `c % 3 * 4 + c // 3` is read as affine. Blocks before it that only copy or pad a
    parameter (e.g. conv padding) are looked through: the main block reads `pad`, and the tensor
    is reported under the padded shape it actually reads, named after the parameter it pads.
    """
    import tvm
    from tvm import s_tir

    func = split_div_mod(func)
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    main = _main_block(blocks)
    param_names = [_buffer_name(func, p) for p in func.params]
    axes = tuple(
        Axis(str(iv.var.name).removeprefix("v_"), int(iv.dom.extent), REDUCE if int(iv.iter_type) == 2 else SPATIAL)
        for iv in main.iter_vars
    )
    variables = [iv.var for iv in main.iter_vars]
    producers = {_region_name(w): b for b in blocks if b is not main for w in b.writes}
    tensors = []
    for region in main.reads:
        name = _region_name(region)
        shown = _source_param(name, producers, param_names)
        tensors.append(_access(shown, region, variables, dtype, "input"))
    inputs = _order_inputs(tensors, param_names[:n_inputs])
    if reuses_every_input(axes, inputs):
        inputs = [_on_unit_axes(t, axes) for t in inputs]
    out = _access(param_names[-1], main.writes[0], variables, dtype, "output")
    flops = int(s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    after = blocks[blocks.index(main) + 1:]
    passes = row_passes(main, after)
    return TensorExpr(
        op=op,
        params=tuple(sorted((k, _freeze(v)) for k, v in params.items())),
        axes=axes,
        tensors=tuple(inputs) + (out,),
        dtype=dtype,
        flops=max(flops, 1),
        main_block=str(main.name_hint),
        args=_kernel_args(func, param_names),
        epilogues=tuple(str(b.name_hint) for b in after),
        pads_reduction=zero_padded_reduction(main),
        epilogue_ops=sum(block_ops(b, hoists=bool(passes)) for b in after),
        epilogue_flops=sum(_nest_flops(sch, b) for b in after),
        row_passes=passes,
        func=func,
    )


# Issue slots of one float operation in a vector ALU, relative to an add or a multiply: a vector
# division's reciprocal throughput is about 4-5 cycles on Zen 3 and Skylake against 0.5 for an
# add or a multiply (Agner Fog's instruction tables), the rest (min, max, floor, casts, shifts,
# selects) take one slot like an add.
_DIVIDE_SLOTS = 8


def block_ops(block, hoists: bool = False) -> int:
    """The arithmetic operations one TIR block performs over all its iterations: the distinct
    operations of its stored value (an expression repeated by inlining, as TOPI's polynomials
    repeat their clamped argument, is computed once after LLVM's common-subexpression
    elimination), a division counted as `_DIVIDE_SLOTS`, times its iterations. Where the block
    runs its own loops, in its iterators' order (`hoists`: a row pass), an operation whose
    operands stay fixed along its inner loops is computed once per iteration of the loops it
    depends on: LLVM hoists loop invariants out of a loop (an SE block's sigmoid of a channel's
    value, broadcast over the channel's pixels, once a channel)."""
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    last = len(extents) - 1
    return sum(own * prod(extents[:(depth if hoists else last) + 1]) for own, depth in _operations(block))


def _operations(block) -> list[tuple[int, int]]:
    """The distinct operations of `block`'s stored value (`block_ops`), each as (issue slots,
    the position of the innermost of the block's iterators its operands depend on; -1: none)."""
    from tvm import tirx
    from tvm.ir.expr import Expr
    from tvm_ffi import structural_hash

    body = block.body
    if not isinstance(body, tirx.BufferStore):
        return []
    iterators = [iv.var for iv in block.iter_vars]
    depths: dict[int, int] = {}
    out: list[tuple[int, int]] = []

    def depth(node) -> int:
        key = structural_hash(node)
        if key in depths:
            return depths[key]
        if isinstance(node, tirx.Var):
            found = next((i for i, v in enumerate(iterators) if v.same_as(node)), -1)
        elif hasattr(node, "indices"):  # a load: its indices are address arithmetic, not the block's
            found = max((depth(i) for i in node.indices), default=-1)
        else:
            children = [getattr(node, name) for name in ("a", "b", "value", "condition", "true_value", "false_value")
                        if isinstance(getattr(node, name, None), Expr)]
            children += [arg for arg in getattr(node, "args", ()) if isinstance(arg, Expr)]
            found = max((depth(c) for c in children), default=-1)
            if not isinstance(node, (tirx.FloatImm, tirx.IntImm)):
                out.append((_DIVIDE_SLOTS if isinstance(node, tirx.Div) else 1, found))
        depths[key] = found
        return found

    depth(body.value)
    return out


def _nest_flops(sch, block) -> int:
    """TVM's flop count (`estimate_tir_flops`) of `block`'s own loop nest in `sch`, an
    unscheduled PrimFunc's, where every block has a nest of its own."""
    from tvm import s_tir

    rv = sch.get_sblock(str(block.name_hint))
    loops = sch.get_loops(rv)
    return int(s_tir.analysis.estimate_tir_flops(sch.get(loops[0]) if loops else block))


def row_passes(main, after) -> tuple[RowPass, ...]:
    """The blocks `after` the main block `main` as `RowPass`es where one of them holds a
    reduction or iterates over more elements than `main` writes (the rule of
    `codegen.common.row_passes`, on the PrimFunc's static extents), else ()."""
    outputs = prod(int(e) for e in main.writes[0].source.shape)

    def extents(block):
        return [int(iv.dom.extent) for iv in block.iter_vars]

    if not any(is_reduction(b) or prod(extents(b)) > outputs for b in after):
        return ()
    out = []
    for block in after:
        ext = extents(block) or [1]
        along = sum(own for own, depth in _operations(block) if depth == len(ext) - 1)  # the rest hoisted
        out.append(RowPass(prod(ext[:-1]), ext[-1], along, is_reduction(block), reads_along_rows(block)))
    return tuple(out)


def reads_along_rows(block) -> bool:
    """Whether `block`'s innermost iterator (its row) indexes only the last dimension of every
    tensor it reads: consecutive iterations then read consecutive elements, which vector loads
    need (a strided row would be gathered)."""
    from tvm import tirx

    if not block.iter_vars:
        return True
    row = block.iter_vars[-1].var
    for region in block.reads:
        for d, r in enumerate(region.region):
            uses = any(v.same_as(row) for v in tirx.analysis.undefined_vars(r.min))
            if uses and d != len(region.region) - 1:
                return False
    return True


def is_reduction(block) -> bool:
    """Whether a TIR block reduces: one of its iterators is a reduce axis."""
    return any(int(iv.iter_type) == 2 for iv in block.iter_vars)


def zero_padded_reduction(block) -> bool:
    """Whether `block` sums products into a zero-initialised output (`out = 0`, then
    `out = out + f1 * f2 * ...`, each factor a load, a constant or a cast of one) and every one
    of its reduction axes indexes some factor: a reduction padded with zero inputs then adds only
    zero terms (matmul's A[i, k] * B[k, j]), where a max, a sum of sums or a product that ignores
    an axis would change."""
    from tvm import tirx
    from tvm.ir.expr import TensorLoad  # what `tirx.BufferLoad(...)` builds in TVM 0.27

    init, body = block.init, block.body
    if not isinstance(init, tirx.BufferStore) or not isinstance(body, tirx.BufferStore):
        return False
    if not isinstance(init.value, (tirx.FloatImm, tirx.IntImm)) or float(init.value.value) != 0.0:
        return False
    update = body.value
    if not isinstance(update, tirx.Add) or not _loads(update.a, body.buffer):
        return False
    factors, stack = [], [update.b]
    while stack:
        node = stack.pop()
        if isinstance(node, tirx.Mul):
            stack += [node.a, node.b]
        elif isinstance(node, tirx.Cast):
            stack.append(node.value)
        elif isinstance(node, (TensorLoad, tirx.FloatImm, tirx.IntImm)):
            factors.append(node)
        else:
            return False
    used = [v for f in factors if isinstance(f, TensorLoad) for i in f.indices for v in tirx.analysis.undefined_vars(i)]
    return all(any(v.same_as(iv.var) for v in used) for iv in block.iter_vars if int(iv.iter_type) == 2)


def _loads(node, buffer) -> bool:
    """Whether `node` is a load of `buffer`."""
    from tvm.ir.expr import TensorLoad

    return isinstance(node, TensorLoad) and node.source.same_as(buffer)


def split_div_mod(func):
    """`func` with the main block's iterators split where an index divides one of them, or takes
    its remainder, by a constant; `func` itself when there is nothing to split or no split helps.

    An iterator `v` of extent E whose indices use `v // k` or `v % k` for constants
    k_1 | k_2 | ... | k_n | E is replaced by its mixed-radix digits `v_0 .. v_n` (outermost first,
    extents E / k_n, ..., k_1, each of the kind of `v`), with v = v_0 * k_n + ... + v_n; every
    such index is then a digit or a sum of digits times constants. This is how a grouped
    convolution's output channel `ff` becomes (group, channel in group), a channel shuffle's
    channel (c // g, c % g) and a flatten's flat index the dimensions it flattens. Indices that
    divide a sum of several iterators (a reshape that merges and re-splits dimensions) are left
    alone at first, but a split can simplify them into divisions of one iterator, split in turn:
    a reshape [4, 8, 8] -> [8, 32] reads `(v1 * 4 + v2 // 8) // 8`, which after v2 -> (v2_0, v2_1)
    is `v1 // 2`. The block keeps one loop per iterator, named `NAME_i`, as the codegen expects.
    """
    for _ in range(MAX_SPLIT_ROUNDS):
        split = _split_once(func)
        if split is func:
            break
        func = split
    return func


def _split_once(func):
    """One round of `split_div_mod`: the divisions of one iterator each, or `func` itself."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    handles = list(sch.get_child_blocks(sch.get_sblock("root")))
    blocks = [sch.get(b) for b in handles]
    main = _main_block(blocks)
    handle = handles[[b.same_as(main) for b in blocks].index(True)]
    iter_vars = list(main.iter_vars)
    divisors = [_divisors(main, iv.var, [v.var for v in iter_vars]) for iv in iter_vars]
    if not any(divisors):
        return func
    radices = [_radix(iv, found) for iv, found in zip(iter_vars, divisors)]
    # with no digits to make, the identity map still simplifies `f // F` of an f < F to 0
    if not any(radices) and not any(k >= int(iv.dom.extent) for iv, found in zip(iter_vars, divisors) for k in found):
        return func
    try:
        sch.transform_block_layout(handle, _digits_map(iter_vars, radices))
    except Exception:  # TVM refuses a map it cannot prove bijective: keep the function as it was
        return func
    return _name_digits(sch.mod["main"], sch.get(handle), iter_vars, radices)


def _divisors(block, var, block_vars) -> set[int]:
    """Constants k of `x // k` and `x % k` in `block`'s regions where x depends on `var` alone."""
    import tvm_ffi
    from tvm.tirx import FloorDiv, FloorMod, IntImm

    found: set[int] = set()

    def visit(node):
        if isinstance(node.b, IntImm) and node.b.value > 1:
            used = [v for v in block_vars if _uses(node.a, v)]
            if len(used) == 1 and used[0].same_as(var):
                found.add(int(node.b.value))

    for region in list(block.reads) + list(block.writes):
        for rng in region.region:
            tvm_ffi.structural_walk(rng.min, ((FloorDiv, FloorMod), visit))
    return found


def _uses(expr, var) -> bool:
    import tvm_ffi
    from tvm.tirx import Var

    hits = []
    tvm_ffi.structural_walk(expr, (Var, lambda v: hits.append(v) if v.same_as(var) else None))
    return bool(hits)


def _radix(iv, divisors: set[int]) -> tuple[int, ...]:
    """Digit extents of iterator `iv` (outermost first) for a chain of divisors, () for none:
    the divisors below the extent must divide each other and the extent (else no split makes
    them all affine); one at or above it (`v % E`, `v // E`) needs no digit."""
    extent = int(iv.dom.extent)
    chain = sorted(k for k in divisors if k < extent)
    if not chain or extent % chain[-1] or any(b % a for a, b in zip(chain, chain[1:])):
        return ()
    bounds = [extent] + chain[::-1]
    return tuple(a // b for a, b in zip(bounds, bounds[1:])) + (chain[0],)


def _digits_map(iter_vars, radices):
    """The block layout map from the iterators to their digits (an iterator without a radix
    maps to itself; an empty radix everywhere is the identity, which still simplifies)."""
    from tvm.tirx import IndexMap

    def digits(*values):
        out = []
        for value, radix in zip(values, radices):
            stride = prod(radix)
            for i, extent in enumerate(radix or (1,)):
                stride //= extent
                digit = value // stride if stride > 1 else value
                out.append(digit % extent if i > 0 else digit)
        return out

    dtype = str(iter_vars[0].dom.extent.ty)
    return IndexMap.from_func(digits, ndim=len(iter_vars), index_dtype=dtype)


def _name_digits(func, block, old_vars, radices):
    """Name the new iterators after the ones they split (`ff` -> `ff_0`, `ff_1`) with the same
    kind (TVM names them v0, v1, ... and calls a digit of extent 1 spatial), and simplify the
    indices under their bounds (`(ff_0 * 8 + ff_1) // 8` -> `ff_0`)."""
    from tvm.sym import Analyzer
    from tvm.ir import Range
    from tvm.tirx import FloorDiv, FloorMod, Var

    renamed = []  # (TVM's new var, ours, kind)
    new_vars = list(block.iter_vars)
    position = 0
    for iv, radix in zip(old_vars, radices):
        name = str(iv.var.name).removeprefix("v_")
        names = [f"{name}_{i}" for i in range(len(radix))] if radix else [name]
        for digit in names:
            tvm_var = new_vars[position].var
            renamed.append((tvm_var, Var(f"v_{digit}", str(new_vars[position].dom.extent.ty)), int(iv.iter_type)))
            position += 1
    analyzer = Analyzer()
    for (_, ours, _), new in zip(renamed, new_vars):
        analyzer.bind(ours, Range.from_min_extent(0, new.dom.extent))
    return rename_iter_vars(func, renamed, [((FloorDiv, FloorMod), analyzer.simplify)])


def rename_iter_vars(func, renamed, more=()):
    """`func` with each of TVM's block iterators `theirs` replaced by `ours`, of `kind` where
    given, else of its own (`renamed`: (theirs, ours, kind or None)), and `more` (node types,
    function) applied as well; for the names a schedule's transforms leave (v0, v1, ...)."""
    import tvm_ffi
    from tvm.tirx import IterVar, Var

    def var(v):
        return next((ours for theirs, ours, _ in renamed if theirs.same_as(v)), v)

    def iter_var(iv):  # the map is post-order: `iv.var` is ours already
        for _, ours, kind in renamed:
            if ours.same_as(iv.var):
                return IterVar(iv.dom, ours, iv.iter_type if kind is None else kind)
        return iv

    return tvm_ffi.structural_map(func, [(Var, var), (IterVar, iter_var), *more])


def _kernel_args(func, param_names) -> tuple[KernelArg, ...]:
    """The parameters in call order (inputs, then the output) with their buffers' shapes, read
    off the parameters' buffer types (0.27 does not expose the PrimFunc's buffer map). Every
    parameter is kept, also one no block reads: `(B[i] - B[i]) * A[i]` simplifies to 0 and
    reads neither A nor B, yet its kernel still takes both, as the expression names them."""
    last = len(param_names) - 1
    return tuple(
        KernelArg(name, tuple(int(s) for s in param.ty.shape), str(param.ty.dtype), "output" if i == last else "input")
        for i, (name, param) in enumerate(zip(param_names, func.params))
    )


def _main_block(blocks):
    reducing = [b for b in blocks if is_reduction(b)]
    if reducing:
        return max(reducing, key=lambda b: prod(int(iv.dom.extent) for iv in b.iter_vars))
    return blocks[-1]


def _access(name, region, variables, dtype, role) -> TensorAccess:
    from tvm.sym import detect_linear_equation

    index, shape = [], []
    for rng in region.region:
        coeffs = detect_linear_equation(rng.min, variables)
        if len(coeffs) == 0:
            raise UserError(f"tensor {name}: index {rng.min} is not affine in the loop axes")
        *cs, const = (int(c) for c in coeffs)
        index.append((tuple(cs), const))
    shape = tuple(int(s) for s in region.source.shape)
    return TensorAccess(name=name, shape=shape, dtype=dtype, role=role, index=tuple(index))


def reuses_every_input(axes: Sequence[Axis], inputs: Sequence[TensorAccess]) -> bool:
    """Whether an expression over `axes` reduces and each of its `inputs` ignores some spatial
    axis longer than 1 (a matmul, batched or not: each operand reused along an axis it does not
    read), the expressions whose CPU template packs its inputs into panels (`rtile.panels`). A
    mean over a window ignores only its unit axes, a matrix-vector product's matrix only the
    vector's unit rows: neither reuses its input."""
    spatial = [a for a, axis in enumerate(axes) if axis.kind == SPATIAL and axis.extent > 1]
    return any(axis.kind == REDUCE for axis in axes) and all(any(not t.uses_axis(a) for a in spatial) for t in inputs)


def _on_unit_axes(tensor: TensorAccess, axes: tuple[Axis, ...]) -> TensorAccess:
    """`tensor` with each dimension of extent 1 that it reads at index 0 (a batch of one that a
    lowering broadcasts, `lv[0, i, k]`) read at a spatial axis of extent 1 that it does not
    read otherwise, in order, where one is left: the same element at every iteration, but a
    dimension indexed by one axis, as the CPU template's panels and padding take it. A
    transformer block's [1, 77, 300] x [300, 300] projections, lowered so, ran their 12-column
    edge scalar without panels: 184 us and worse, 87-107 with them (two Zen 4 cores)."""
    free = [a for a, axis in enumerate(axes) if axis.kind == SPATIAL and axis.extent == 1 and not tensor.uses_axis(a)]
    index = []
    for (coeffs, const), extent in zip(tensor.index, tensor.shape):
        if free and extent == 1 and const == 0 and not any(coeffs):
            a = free.pop(0)
            coeffs = tuple(int(i == a) for i in range(len(coeffs)))
        index.append((coeffs, const))
    return replace(tensor, index=tuple(index))


def _region_name(region) -> str:
    return str(region.source.name)


def _buffer_name(func, param) -> str:
    """Name of the buffer bound to a PrimFunc parameter (buffer_map is not exposed in 0.27)."""
    return str(func.params_buffer(param).name) if hasattr(func, "params_buffer") else str(param.name)


def _source_param(name, producers, param_names):
    """Follow copy/pad producer blocks back to the function parameter they read."""
    seen = set()
    while name not in param_names and name in producers and name not in seen:
        seen.add(name)
        reads = producers[name].reads
        if len(reads) != 1:
            break
        name = _region_name(reads[0])
    return name


def _order_inputs(tensors, input_names):
    order = {n: i for i, n in enumerate(input_names)}
    return sorted(tensors, key=lambda t: order.get(t.name, len(order)))


def _freeze(value):
    return tuple(value) if isinstance(value, list) else value


SUM_OF_PRODUCTS = ("conv2d", "group_conv2d", "depthwise_conv2d")  # catalog ops whose block is O += x * y


def read_through_window(expr: TensorExpr, tensor: TensorAccess) -> bool:
    """Some dimension of `tensor` is indexed by a spatial and a reduce axis together."""
    return bool(window_axes(expr, tensor))


def window_axes(expr: TensorExpr, tensor: TensorAccess) -> tuple[int, ...]:
    """The reduce axes that index a dimension of `tensor` together with a spatial axis (a conv's
    or pooling's window `h*stride + r`: r), in order."""
    found: set[int] = set()
    for d in range(len(tensor.index)):
        axes = tensor.axes_of_dim(d)
        if {expr.axes[a].kind for a in axes} >= {SPATIAL, REDUCE}:
            found.update(a for a in axes if expr.axes[a].kind == REDUCE)
    return tuple(sorted(found))


def sum_of_products(expr: TensorExpr) -> bool:
    """The main block updates `O = O + x * y` (a max or any other combiner is no GEMM). An
    expression read back from JSON has no PrimFunc to look at: it is taken by its catalog name
    (the test fast lane's fixtures, `TensorExpr.from_dict`)."""
    if expr.func is None:
        return expr.op in SUM_OF_PRODUCTS
    import tvm
    from tvm import s_tir, tirx

    sch = s_tir.Schedule(tvm.IRModule({"main": expr.func}))
    body = sch.get(sch.get_sblock(expr.main_block)).body
    value = getattr(body, "value", None)
    if not (isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul)):
        return False
    accumulator = getattr(value.a, "source", None)  # the update reads the buffer it stores
    return accumulator is not None and accumulator.same_as(body.buffer)
