"""Check a built kernel against the numpy reference on random inputs.

Tolerances follow from how the kernel computes, not from a fudge factor: inputs are uniform in
[-1, 1], so a reduction over K terms has partial sums of typical size sqrt(K)/3 (products of two
such numbers have rms 1/3), and accumulating K terms in a different order than the float64
reference adds K roundings of relative size eps/2 as a random walk, sqrt(K) * eps/2 * sqrt(K)/3
= K * eps / 6 typical. `atol = K * eps` is about six of those standard deviations, so a
correct kernel passes over millions of outputs, while a wrong one (a lost tile, a bad guard)
is off by whole terms (~0.3). `rtol` covers libm differences (tanh, exp: a few ulps) and the
log2(K) growth of pairwise-vs-sequential rounding on large outputs. float16 kernels accumulate
in float16 and get the same formulas with float16's eps.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import log2, prod
from typing import Sequence

import numpy as np

from workbench.codegen.build import Kernel
from workbench.codegen.common import first_line
from workbench.ops.reference import random_inputs, reference
from workbench.ops.tensor_expr import TensorExpr

# Smallest absolute tolerance in units of eps: a handful of roundings even without a reduction
# (the elementwise kernels round once or twice per operation, as numpy does in float64 only).
MIN_ATOL_EPS = 16
# rtol in units of eps per log2(K): libm's tanh/exp differ from numpy's by a few ulps.
RTOL_EPS = 8


@dataclass(frozen=True)
class Verification:
    correct: bool
    max_abs_err: float = float("nan")
    max_rel_err: float = float("nan")  # max |out - ref| / (|ref| + atol)
    error: str = ""
    atol: float = 0.0
    rtol: float = 0.0


def tolerances(expr: TensorExpr) -> tuple[float, float]:
    """(atol, rtol) for `expr` (see the module docstring for where they come from)."""
    eps = float(np.finfo(np.dtype(expr.dtype)).eps)
    terms = prod(expr.axes[a].extent for a in expr.reduce) if expr.reduce else 1
    atol = eps * max(MIN_ATOL_EPS, terms)
    rtol = RTOL_EPS * eps * max(1.0, log2(terms))
    return atol, rtol


def run_kernel(kernel: Kernel, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Run `kernel` on `inputs` (call order) on its target's device; returns the output array."""
    import tvm

    dev = tvm.cpu() if kernel.target_kind == "llvm" else tvm.device(kernel.target_kind, 0)
    out_arg = kernel.args[-1]
    arrays = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    out = tvm.runtime.tensor(np.zeros(out_arg.shape, dtype=out_arg.dtype), dev)
    kernel.runtime()[kernel.entry](*arrays, out)
    return out.numpy()


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Verification:
    """Elementwise `|out - ref| <= atol + rtol * |ref|`; NaN/inf must match exactly."""
    if out.shape != ref.shape:
        return Verification(False, error=f"output shape {out.shape} differs from the reference's {ref.shape}")
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(ref64)
    same_special = np.array_equal(out64[~finite], ref64[~finite], equal_nan=True)
    diff = np.abs(out64[finite] - ref64[finite])
    scale = np.abs(ref64[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / (scale + atol)).max()) if diff.size else 0.0
    ok = bool(same_special and np.all(np.isfinite(out64[finite])) and np.all(diff <= atol + rtol * scale))
    error = "" if ok else f"max abs error {max_abs:.3g} exceeds atol {atol:.3g} + rtol {rtol:.3g} * |ref|"
    if not same_special:
        error = "non-finite outputs differ from the reference's"
    return Verification(ok, max_abs, max_rel, error, atol, rtol)


def verify(kernel: Kernel, expr: TensorExpr, seed: int = 0) -> Verification:
    """Run `kernel` on `random_inputs(expr, seed)` and compare with `reference`; a failed build,
    a crash or a wrong result is recorded in the Verification, never raised."""
    if not kernel.ok:
        return Verification(False, error=f"not built: {kernel.error}")
    atol, rtol = tolerances(expr)
    try:
        inputs = random_inputs(expr, seed)
        out = run_kernel(kernel, inputs)
    except Exception as err:  # a TVM runtime error of any kind is this kernel's failure
        return Verification(False, error=f"run: {first_line(err)}", atol=atol, rtol=rtol)
    return compare(out, reference(expr, inputs), atol, rtol)
