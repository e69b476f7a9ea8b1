"""Check a built kernel against the float64 numpy reference on random inputs.

One function decides whether an output is correct, `check_output`; the CLI's export, the profile
runners (local and RPC), the baselines and the tests all call it (`verify` for a built kernel).

Inputs: `ops.reference.random_inputs`, drawn per combiner (products of factors near +-1,
zero-mean sums, operands inside the domain of log and sqrt and away from zero under a division).

Tolerance, per output: `TOLERANCE * eps * (scale + |ref|) + TOLERANCE * tiny`, eps the machine
epsilon of the expression's dtype. `scale` (`ops.reference.Reference.scale`) is the error scale
of a correct kernel: first-order bounds of every rounding inside a term, and for a reduction of
K terms the accumulation's random walk (about K times the terms' size for zero-mean sums, K^1.5
when they share a sign, sqrt(K) times the product for `*=`, more where equal terms round
alike): that is where the reduction length enters. A rounding is at most eps/2 relative and about uniform, a standard deviation of
eps/(2 sqrt 3) ~= 0.29 eps per unit of scale, so TOLERANCE = 8 is ~28 standard deviations: room
for the accumulation estimate being a few times off for the kernel's own order of the terms and
for libm's few-ulp errors, while a real mistake (a lost, doubled or misplaced term: the size of
a term) stays far above it. `|ref|` is the rounding of the output itself; `tiny` (the smallest
normal number) allows subnormal results to be flushed to zero.

A reference that cannot tell a right kernel from a wrong one is refused before any comparison:
every output within the tolerance of zero or of one constant (a kernel writing that constant
would pass), outputs that are not finite or do not fit the dtype although every input is
finite, or an infinite error scale (log or division at a pole). The kernel is then not counted
correct, with an error saying why.
docs/verification.md has the whole argument.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from workbench.codegen import targets
from workbench.codegen.build import Kernel, laid_out_args
from workbench.errors import first_line
from workbench.ops.reference import Reference, random_inputs, reference_with_scale
from workbench.ops.tensor_expr import TensorExpr

# Tolerance in units of eps per unit of error scale (see the module docstring for the number).
TOLERANCE = 8.0


@dataclass(frozen=True)
class Verification:
    correct: bool
    max_abs_err: float = float("nan")
    max_rel_err: float = float("nan")  # max |out - ref| / tolerance: 1 is the edge of correct
    error: str = ""
    atol: float = 0.0  # the largest per-output atol_i
    rtol: float = 0.0


def eps(dtype: str) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


# Outputs per block of `degenerate`'s and `compare`'s passes: 512 KiB of float64 a block, so
# every pass runs over arrays that stay in L2 instead of over temporaries the size of the output.
# A fresh temporary is paid page by page on first touch, once per pass over a large output
# (evidence: docs/evidence.md#verify-block).
BLOCK = 1 << 16


def tolerance(ref: Reference, dtype: str) -> tuple[np.ndarray, float]:
    """(atol per output, rtol) of `ref` for a kernel computing in `dtype` (module docstring)."""
    return _atol(np.asarray(ref.scale), dtype), TOLERANCE * eps(dtype)


def _atol(scale: np.ndarray, dtype: str) -> np.ndarray:
    """atol_i of outputs with error scales `scale` (`tolerance`)."""
    return TOLERANCE * eps(dtype) * scale + TOLERANCE * float(np.finfo(np.dtype(dtype)).tiny)


def degenerate(ref: Reference, dtype: str) -> str:
    """Why `ref` cannot tell a right kernel from a wrong one ("" when it can): outputs not
    finite or beyond the dtype's range (inputs are always finite), an infinite error scale, or
    outputs all within the tolerance of zero (under- or cancelled) or of one constant."""
    return _reference_side(ref, dtype).reason


def _flat(a: np.ndarray) -> np.ndarray:
    """`a` as one row for the blocked passes: a view where `a` is contiguous, one element where
    it is one value broadcast (an operator's constant error scale), else a copy."""
    a = np.asarray(a)
    if a.size and not any(a.strides):
        return np.full(1, a.flat[0], dtype=a.dtype)
    return a.reshape(-1)


def _blocks(size: int, *rows: np.ndarray):
    """Each block `(start, parts)` of `size` outputs: `parts` the block of each of `rows`
    (`_flat`), a one-element row as it is (numpy broadcasts it)."""
    for start in range(0, size, BLOCK):
        yield start, tuple(r if r.size == 1 else r[start:start + BLOCK] for r in rows)


@dataclass(frozen=True)
class _ReferenceSide:
    """What every comparison with one reference shares: why it is degenerate ("" when it is
    not), the largest atol_i and rtol."""

    ref: Reference
    dtype: str
    reason: str
    widest: float = 0.0
    rtol: float = 0.0


# The last reference's side (`_reference_side`). A profile session compares every candidate with
# one reference, and this side was up to half of each comparison, each time again for the same
# reference (evidence: docs/evidence.md#verify-reference-side). Kept by identity: the entry
# holds the reference, so its id cannot be reused while it is kept; one entry, as
# `profile.runner.inputs_and_reference` keeps one reference.
_last_side: list[_ReferenceSide] = []


def _reference_side(ref: Reference, dtype: str) -> _ReferenceSide:
    if _last_side and _last_side[0].ref is ref and _last_side[0].dtype == dtype:
        return _last_side[0]
    _last_side[:] = [side := _work_out_side(ref, dtype)]
    return side


def _work_out_side(ref: Reference, dtype: str) -> _ReferenceSide:
    value, scale = _flat(ref.value), _flat(ref.scale)
    rtol = TOLERANCE * eps(dtype)
    not_finite, largest, ill, widest, zero = 0, 0.0, False, 0.0, True
    low, high = -np.inf, np.inf  # a constant c is within every output's bound iff low <= c <= high
    with np.errstate(invalid="ignore", over="ignore"):
        for _, (v, s) in _blocks(value.size, value, scale):
            magnitude = np.abs(v)
            not_finite += v.size - int(np.count_nonzero(np.isfinite(v)))
            largest = max(largest, float(magnitude.max()))
            ill = ill or not bool(np.all(np.isfinite(s)))
            atol = _atol(s, dtype)
            widest = max(widest, float(atol.max()))
            bound = atol + rtol * magnitude
            zero = zero and bool(np.all(magnitude <= bound))
            low, high = max(low, float((v - bound).max())), min(high, float((v + bound).min()))
    if not_finite:
        return _ReferenceSide(ref, dtype, f"the reference is not finite at {not_finite} of {value.size} outputs "
                                          f"although every input is")
    if largest > float(np.finfo(np.dtype(dtype)).max):
        return _ReferenceSide(ref, dtype, f"the reference reaches {largest:.3g}, beyond {dtype}'s range")
    if ill:
        return _ReferenceSide(ref, dtype, "the reference is ill-conditioned (log, sqrt or a division at a pole): "
                                          "no tolerance is meaningful")
    side = _ReferenceSide(ref, dtype, "", widest, rtol)
    if zero:
        return replace(side, reason=f"every reference output is within the tolerance of 0 in {dtype}: a kernel "
                                    f"writing zeros would pass")
    if value.size > 1 and low <= high:
        return replace(side, reason=f"every reference output is within the tolerance of {(low + high) / 2:.6g}: a "
                                    f"kernel writing that constant would pass")
    return side


def compare(out: np.ndarray, ref: Reference, dtype: str) -> Verification:
    """Elementwise `|out - ref| <= atol_i + rtol * |ref|` on a non-degenerate reference."""
    side = _reference_side(ref, dtype)
    if side.reason:
        return Verification(False, error=f"cannot verify: {side.reason}")
    if out.shape != ref.value.shape:
        return Verification(False, error=f"output shape {out.shape} differs from the reference's {ref.value.shape}")
    got, value, scale = _flat(out), _flat(ref.value), _flat(ref.scale)
    wrong, not_finite, max_abs, max_rel, worst = 0, 0, 0.0, 0.0, 0
    with np.errstate(invalid="ignore"):
        for start, (o, v, s) in _blocks(value.size, got, value, scale):
            diff = np.abs(o.astype(np.float64) - v)  # NaN where out is NaN, inf where it is infinite
            bound = _atol(s, dtype) + side.rtol * np.abs(v)
            wrong += int(np.count_nonzero(~(diff <= bound)))  # NaN compares false: a non-finite output is wrong
            not_finite += diff.size - int(np.count_nonzero(np.isfinite(diff)))
            if not_finite:  # the maxima are infinite; only the count is still wanted
                continue
            ratio = diff / bound
            at = int(np.argmax(ratio))
            max_abs = max(max_abs, float(diff.max()))
            if ratio[at] > max_rel or start == 0:
                max_rel, worst = float(ratio[at]), start + at
    if not_finite:
        return Verification(False, np.inf, np.inf, f"{not_finite} outputs are not finite where the reference is",
                            side.widest, side.rtol)
    if not wrong:
        return Verification(True, max_abs, max_rel, "", side.widest, side.rtol)
    at = np.unravel_index(worst, out.shape)
    bound = float(_atol(scale[0 if scale.size == 1 else worst], dtype) + side.rtol * abs(value[worst]))
    error = (
        f"max abs error {max_abs:.3g} exceeds the tolerance at {wrong} of {value.size} outputs; "
        f"worst at {tuple(int(i) for i in at)}: {float(got[worst]):.6g} vs {float(value[worst]):.6g} "
        f"(tolerance {bound:.3g})"
    )
    return Verification(False, max_abs, max_rel, error, side.widest, side.rtol)


def check_output(expr: TensorExpr, inputs: Sequence[np.ndarray], out: np.ndarray) -> Verification:
    """Is `out` the output of `expr` on `inputs`? The one correctness check of the workbench."""
    return compare(np.asarray(out), reference_with_scale(expr, inputs), expr.dtype)


def run_kernel(kernel: Kernel, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Run `kernel` on `inputs` (call order) on its target's device; returns the output array."""
    import tvm

    dev = targets.runtime_device(kernel.target_kind)
    out_arg = kernel.args[-1]
    module = kernel.runtime()
    arrays = laid_out_args(module, kernel.prepacked, [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs], dev)
    out = tvm.runtime.tensor(np.zeros(out_arg.shape, dtype=out_arg.dtype), dev)
    module[kernel.entry](*arrays, out)
    return out.numpy()


def verify(kernel: Kernel, expr: TensorExpr, seed: int = 0) -> Verification:
    """Run `kernel` on `random_inputs(expr, seed)` and `check_output`; a failed build, a crash or
    a wrong result is recorded in the Verification, never raised."""
    if not kernel.ok:
        return Verification(False, error=f"not built: {kernel.error}")
    try:
        inputs = random_inputs(expr, seed)
        out = run_kernel(kernel, inputs)
    except Exception as err:  # a TVM runtime error of any kind is this kernel's failure
        return Verification(False, error=f"run: {first_line(err)}")
    return check_output(expr, inputs, out)
