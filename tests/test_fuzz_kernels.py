"""Fuzz: hundreds of random expressions over ragged extents, each built the way the workbench
builds kernels (Roller construction with axis fusion, the CPU template, TVM), run, and compared
with a numpy evaluation written here, independent of `ops.reference`.

For every generated expression, on a CPU spec drawn from two generated ones:
- the kernels of rank 1 and of a later rank build, and `verify.check_output` (the one
  correctness check of the workbench, on the per-combiner `random_inputs`) counts them correct;
- they match this file's own float64 evaluation within the stated tolerance, and
  `ops.reference` agrees with that evaluation;
- the check is not vacuous: the same output with one term lost (a sum missing its biggest term,
  a product its factor farthest from 1, a max or min its extreme) or, without a reduction, with
  two elements swapped is refused.
About a quarter of the expressions are also scheduled by the CUDA template for a GPU preset and
run on this CPU with the thread loops made serial (there is no GPU here), checked the same way.
A quarter carry a term that cancels, `(D[..] - D[..])` before or after the rest: TVM folds it
away, so D stays a kernel argument that no block reads (issue 36's KeyError), and the kernel
still computes the rest. An expression whose every term cancels is refused in one line
(`test_a_right_side_that_cancels_whole_is_refused`).

Extents are small primes and ragged sizes, so tiles rarely divide them. Half the expressions
read their output axes as one block (`A[p,i,j]`), which `ops.fusion` merges: the shape of issue
12's wrong kernels (against the codegen before its fix this test failed at the 29th expression).
The others read any axes, transposed, broadcast or affine (2*i+1, i+p). Expressions the
construction finds no program for, or whose reference is degenerate (refused, as checked), are
replaced by new ones, so EXAMPLES expressions are built and checked. The run is deterministic
(derandomize) and bounded by EXAMPLES and MAX_POINTS: 3 minutes (175-195 s measured) for 500
expressions, 850-900 CPU kernels and 120-170 CUDA schedules on a 2-core AMD EPYC.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from tests.helpers import TINY_CPU, device
from tests.test_codegen_cuda import run_serially
from workbench.codegen.build import build_kernel
from workbench.codegen.rules import apply_rules
from workbench.codegen.verify import check_output, degenerate, run_kernel, tolerance
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.hardware.spec import MemoryLayer
from workbench.ops.expr_lang import build_expr
from workbench.ops.reference import random_inputs, reference_with_scale

EXAMPLES = 500  # expressions, each built at two ranks
MAX_POINTS = 6000  # product of all extents: keeps tiles, unrolling and compile time small
EXTENTS = (1, 2, 3, 5, 6, 7, 9, 11, 12, 13, 16, 17, 19, 23, 29, 31, 35, 37, 41, 61, 101)
SPATIAL, REDUCE = ("i", "j", "l", "m"), ("p", "q", "r", "s")
TENSORS = ("A", "B", "C")
# An AVX-512-like and an AVX2-like CPU (16 and 8 float lanes, 28 and 14 usable vector registers
# of 64 and 32 bytes): two tilings per expression family, independent of the CPU running this.
CPUS = (
    TINY_CPU,
    replace(
        TINY_CPU,
        name="tiny-avx2",
        warp_size=8,
        registers_per_thread_cap=14,
        registers_per_unit=16,
        layers=(MemoryLayer("registers", "thread", 14 * 32, 1000.0, 32, 0.3),) + TINY_CPU.layers[1:],
    ),
)
GPUS = ("v100", "h100")


# ---- the generated expression: a small tree, rendered as text and evaluated with numpy --------


@dataclass(frozen=True)
class Read:
    tensor: str
    dims: tuple[tuple[tuple[tuple[str, int], ...], int], ...]  # per dim: ((axis, coeff), ...), const


@dataclass(frozen=True)
class Node:
    kind: str  # "num" | "neg" | "call" | "bin"
    name: str = ""  # function or operator
    args: tuple = ()
    value: float = 0.0


@dataclass(frozen=True)
class Generated:
    combiner: str
    spatial: tuple[str, ...]
    reduce: tuple[str, ...]
    extents: tuple[tuple[str, int], ...]
    value: object  # Read | Node

    @property
    def text(self) -> str:
        return f"Y[{','.join(self.spatial)}] {self.combiner} {_render(self.value)}"


def _render(node) -> str:
    if isinstance(node, Read):
        dims = ("+".join(a if c == 1 else f"{c}*{a}" for a, c in terms) + (f"+{k}" if k else "") for terms, k in node.dims)
        return f"{node.tensor}[{','.join(dims)}]"
    if node.kind == "num":
        return repr(node.value)
    if node.kind == "neg":
        return f"-({_render(node.args[0])})"
    if node.kind == "call":
        return f"{node.name}({', '.join(_render(a) for a in node.args)})"
    return f"({_render(node.args[0])} {node.name} {_render(node.args[1])})"


_NUMPY = {
    "exp": np.exp, "tanh": np.tanh, "abs": np.abs, "log": np.log, "sqrt": np.sqrt,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "max": np.maximum, "min": np.minimum,
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
}
_REDUCE = {"+=": np.add, "*=": np.multiply, "max=": np.maximum, "min=": np.minimum}


def _terms(g: Generated, tensors: dict) -> np.ndarray:
    """Every term of `g` in float64, one array dimension per axis (spatial first)."""
    axes = g.spatial + g.reduce
    extents = dict(g.extents)
    grids = {a: np.arange(extents[a]).reshape([-1 if b == a else 1 for b in axes]) for a in axes}

    def value(node):
        if isinstance(node, Read):
            index = tuple(sum((c * grids[a] for a, c in terms), start=np.int64(k)) for terms, k in node.dims)
            return tensors[node.tensor][index]
        if node.kind == "num":
            return np.float64(node.value)
        if node.kind == "neg":
            return -value(node.args[0])
        return _NUMPY[node.name](*(value(a) for a in node.args))

    return np.broadcast_to(value(g.value), [extents[a] for a in axes])


def _evaluate(g: Generated, terms: np.ndarray) -> np.ndarray:
    if g.combiner == "=":
        return np.array(terms)
    return _REDUCE[g.combiner].reduce(terms.reshape(terms.shape[: len(g.spatial)] + (-1,)), axis=-1)


# ---- hypothesis strategies --------------------------------------------------------------------


@st.composite
def _read(draw, tensor: str, axes: tuple[str, ...]) -> Read:
    """A read of 1..3 axes: in the axes' order (fusable) or shuffled, each index plain or not."""
    picked = draw(st.permutations(axes))[: draw(st.integers(1, min(3, len(axes))))]
    if draw(st.booleans()):
        picked = sorted(picked, key=axes.index)
    dims = []
    for axis in picked:
        form = draw(st.sampled_from(("plain", "plain", "plain", "strided", "offset", "window")))
        if form == "strided":
            dims.append((((axis, 2),), 1))
        elif form == "offset":
            dims.append((((axis, 1),), 2))
        elif form == "window":
            other = draw(st.sampled_from(axes))
            dims.append((((axis, 1),) if other == axis else ((axis, 1), (other, 1)), 0))
        else:
            dims.append((((axis, 1),), 0))
    return Read(tensor, tuple(dims))


@st.composite
def _blocked_read(draw, tensor: str, spatial: tuple[str, ...], reduce: tuple[str, ...]) -> Read:
    """A read that keeps the spatial axes fusable: all of them in order as one block of plain
    indices (always in the first tensor, else mostly), or none of them, next to some of the
    reduce axes: `A[p, i, j]`, `B[i, j]`, `C[q]`."""
    inner = [a for a in reduce if draw(st.booleans())]
    block = list(spatial) if tensor == TENSORS[0] or draw(st.integers(0, 3)) else []
    picked = (inner + block if draw(st.booleans()) else block + inner) or [reduce[0] if reduce else spatial[0]]
    return Read(tensor, tuple((((a, 1),), 0) for a in picked))


def _covered(read: Read) -> set:
    return {a for terms, _ in read.dims for a, _ in terms}


def _with_axes(read: Read, missing) -> Read:
    return replace(read, dims=read.dims + tuple((((a, 1),), 0) for a in missing))


@st.composite
def _value(draw, reads: list, combiner: str):
    """Combine the reads: a product (of reads, exponentials, negations) for `*=`, else a random
    tree of +, -, *, /, max, min, unary functions and constants."""
    if combiner == "*=":
        parts = [draw(st.sampled_from(("plain", "exp", "neg"))) for _ in reads]
        items = [r if p == "plain" else Node("call", "exp", (r,)) if p == "exp" else Node("neg", args=(r,))
                 for r, p in zip(reads, parts)]
        out = items[0]
        for item in items[1:]:
            out = Node("bin", "*", (out, item))
        return out
    items = [Node("call", f, (r,)) if (f := draw(st.sampled_from(("", "", "", "", "log", "sqrt")))) else r
             for r in reads]
    for _ in range(draw(st.integers(0, 2))):  # decorate a part: a unary function or a constant
        at = draw(st.integers(0, len(items) - 1))
        f = draw(st.sampled_from(("exp", "tanh", "abs", "sigmoid", "neg", "+", "*")))
        if f in ("+", "*"):
            items[at] = Node("bin", f, (items[at], Node("num", value=draw(st.sampled_from((0.5, 1.5, 3.0))))))
        else:
            items[at] = Node("neg", args=(items[at],)) if f == "neg" else Node("call", f, (items[at],))
    while len(items) > 1:
        a, b = items.pop(0), items.pop(0)
        op = draw(st.sampled_from(("+", "-", "*", "/", "max", "min")))
        if op == "/" and not isinstance(b, Read):
            op = "*"  # divide by reads only: random_inputs keeps those away from zero
        items.append(Node("call", op, (a, b)) if op in ("max", "min") else Node("bin", op, (a, b)))
    return items[0]


@st.composite
def expressions(draw) -> Generated:
    n = draw(st.integers(1, 4))
    n_reduce = draw(st.integers(0 if n == 1 or draw(st.integers(0, 3)) == 0 else 1, n - 1))  # 3/4 reduce
    spatial, reduce = SPATIAL[: n - n_reduce], REDUCE[:n_reduce]
    axes = spatial + reduce
    extents, budget = {}, MAX_POINTS
    for axis in draw(st.permutations(axes)):  # no axis is always the one squeezed by the budget
        extents[axis] = draw(st.sampled_from([e for e in EXTENTS if e <= budget]))
        budget //= extents[axis]
    combiner = draw(st.sampled_from(("+=", "*=", "max=", "min="))) if reduce else "="
    tensors = TENSORS[: draw(st.integers(1, 3))]
    if draw(st.booleans()):  # merged by axis fusion: issue 12's fused ragged reductions
        reads = [draw(_blocked_read(t, spatial, reduce)) for t in tensors]
    else:
        reads = [draw(_read(t, axes)) for t in tensors]
    # every reduce axis is read somewhere, and some spatial axis of extent > 1 is (a reference
    # constant over the output could not tell a right kernel from a wrong one)
    seen = set().union(*map(_covered, reads))
    missing = [a for a in reduce if a not in seen]
    varying = [a for a in spatial if extents[a] > 1]
    if varying and not seen & set(varying):
        missing.append(varying[0])
    reads[0] = _with_axes(reads[0], missing)
    value = draw(_value(reads, combiner))
    if draw(st.integers(0, 3)) == 0:
        value = _with_cancelled(value, draw(_read(CANCELLED, axes)), first=draw(st.booleans()))
    return Generated(combiner, spatial, reduce, tuple(sorted(extents.items())), value)


CANCELLED = "D"  # the tensor of a term that cancels


def _with_cancelled(value, read: Read, first: bool):
    """`value` plus `(read - read)`, the term first (its tensor the first argument) or last."""
    zero = Node("bin", "-", (read, read))
    return Node("bin", "+", (zero, value) if first else (value, zero))


# ---- checks -----------------------------------------------------------------------------------


def _mutated(g: Generated, terms: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`out` with one mistake a wrong kernel makes: a term lost at one output, or (elementwise)
    two outputs swapped; where that changes nothing (a min whose terms all tie), the largest
    output never written."""
    bad = out.astype(np.float64)
    flat = terms.reshape(terms.shape[: len(g.spatial)] + (-1,))
    change = np.zeros_like(bad)
    if g.combiner == "=":
        low, high = int(np.argmin(bad)), int(np.argmax(bad))
        change.flat[[low, high]] = bad.flat[[high, low]] - bad.flat[[low, high]]
    elif g.combiner == "+=":
        where = np.unravel_index(int(np.argmax(np.abs(flat))), flat.shape)
        change[where[:-1]] = -flat[where]
    elif g.combiner == "*=":
        where = np.unravel_index(int(np.argmax(np.abs(np.log(np.abs(flat))))), flat.shape)
        change[where[:-1]] = bad[where[:-1]] * (1.0 / flat[where] - 1.0)
    elif flat.shape[-1] > 1:  # the output whose extreme stands out most loses it
        ordered = np.sort(flat, axis=-1)
        if g.combiner == "max=":
            loss = ordered[..., -2] - ordered[..., -1]
        else:
            loss = ordered[..., 1] - ordered[..., 0]
        at = np.unravel_index(int(np.argmax(np.abs(loss))), loss.shape)
        change[at] = loss[at]
    if not change.any():
        change.flat[int(np.argmax(np.abs(bad)))] = -bad.flat[int(np.argmax(np.abs(bad)))]
    return bad + change


def _check(g: Generated, expr, out: np.ndarray, inputs, what: str) -> None:
    """`out` passes the check, matches this file's evaluation, and a mutation of it fails."""
    # by argument, not by read tensor: a tensor whose term cancels is an argument no block reads
    params = [a for a in expr.args if a.role == "input"]
    tensors = {a.name: np.asarray(x, dtype=np.float64) for a, x in zip(params, inputs)}
    terms = _terms(g, tensors)
    want = _evaluate(g, terms)
    verdict = check_output(expr, inputs, out)
    assert verdict.correct, f"{what}: {g.text} {dict(g.extents)}: {verdict.error}"
    ref = reference_with_scale(expr, inputs)
    atol, rtol = tolerance(ref, expr.dtype)
    # ops.reference agrees with this evaluation far inside the tolerance (both are float64)
    assert np.all(np.abs(ref.value - want) <= 1e-6 * atol + 1e-9 * np.abs(want)), f"{what}: {g.text}"
    assert np.all(np.abs(out - want) <= atol + rtol * np.abs(want)), f"{what}: {g.text}"
    refused = check_output(expr, inputs, _mutated(g, terms, out).astype(out.dtype))
    assert not refused.correct, f"{what}: {g.text} {dict(g.extents)}: a lost term passed the check"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],  # a failure is reported as found: shrinking rebuilds kernels for minutes
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(g=expressions(), cpu=st.sampled_from(CPUS), later=st.integers(2, 4), gpu=st.sampled_from(GPUS + (None,) * 6))
def test_generated_kernels_match_numpy(g, cpu, later, gpu):
    e = build_expr(g.text, dict(g.extents))
    built = construct(e, cpu, options=Options(topk=later))
    # An expression the construction finds no program for (it says why, e.g. no aligned register
    # tile) has no kernel to check: Hypothesis draws another, so EXAMPLES expressions are built.
    assume(built.candidates)
    inputs = random_inputs(built.expr, seed=0)
    # A reference that cannot tell right from wrong (outputs that happen to coincide, e.g. a min
    # over overlapping windows of two outputs) must be refused, and says so; such an expression
    # does not count towards EXAMPLES.
    reason = degenerate(reference_with_scale(built.expr, inputs), built.expr.dtype)
    if reason:
        verdict = check_output(built.expr, inputs, np.zeros([dict(g.extents)[a] for a in g.spatial], "float32"))
        assert not verdict.correct and verdict.error == f"cannot verify: {reason}"
    assume(not reason)
    for rank in sorted({1, min(later, len(built.candidates))}):
        kernel = build_kernel(built.expr, built.candidates[rank - 1].program, cpu, sources=False)
        assert kernel.ok, f"{g.text} {dict(g.extents)} rank {rank}: {kernel.error}"
        _check(g, built.expr, run_kernel(kernel, inputs), inputs, f"{cpu.name} rank {rank}")
    on_gpu = construct(e, device(gpu), options=Options(topk=1)) if gpu else None
    if on_gpu and on_gpu.candidates:
        program, spec = on_gpu.candidates[0].program, device(gpu)
        apply_rules(on_gpu.expr, program, spec)  # the real schedule, threads bound
        _check(g, on_gpu.expr, run_serially(on_gpu.expr, program, spec, inputs), inputs, f"{gpu} (threads serial)")


@settings(max_examples=200, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(g=expressions())
def test_a_right_side_that_cancels_whole_is_refused(g):
    """`Y[..] = v - v` for a generated v: every read cancels, the output is a constant no kernel
    need compute (and no check could tell from a kernel writing it), refused in one line
    whether the expression language folds it or only TVM's simplifier does."""
    text = f"Y[{','.join(g.spatial)}] {g.combiner} ({_render(g.value)}) - ({_render(g.value)})"
    with pytest.raises(UserError) as err:
        build_expr(text, dict(g.extents))
    assert str(err.value).startswith("expression: the right side reads no tensor once "), str(err.value)
