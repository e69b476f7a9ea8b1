"""exp, tanh and erf in vectors on LLVM CPU targets: lowering rules that replace TVM's.

TVM lowers `exp` to LLVM's `llvm.exp` (and `tanh` to exps), which LLVM compiles into one libm
`expf` call per lane: a gelu register tile of 32 elements made 64 scalar calls, and gelu over 77 x
3072 ran 663 us on two Zen 4 cores where numpy's unfused formula takes 266
(docs/evidence.md#vector-math); erf called libm's `erff` alike. These rules build them from
multiplies and adds, which vectorise:

- exp(x) = 2^n e^r, n the nearest integer to x / ln 2 and r = x - n ln 2 (ln 2 split in two
  parts, the first exact in float32 with low bits to spare, so that n ln 2 rounds once), |r| <=
  ln 2 / 2, e^r its Taylor series to r^7: the first term left out, r^8 / 8!, is below 5.5e-9
  relative, under float32's half-ulp 6e-8. 2^n is put into the exponent bits, as two factors
  (n up to 128 at x = ln(FLT_MAX)); x below ln(FLT_MIN) gives 0 (where the subnormals lie),
  above ln(FLT_MAX) infinity.
- tanh(x) = sign(x) (1 - 2 / (e^(2|x|) + 1)), |x| clamped to 10 (float32's tanh is 1 from 9.01);
  below |x| = 0.3, where the difference from 1 cancels, its odd Taylor series to x^11, the
  first term left out (21844 / 6081075 x^13) below 2e-9 relative there.
- erf(x) (a BERT layer's gelu): below |x| = 0.9 its Taylor series, 2 / sqrt(pi) sum (-1)^n
  x^(2n+1) / (n! (2n + 1)) to n = 10 (the first term left out below 2e-9 relative there); above,
  sign(x) (1 - t (a1 + t (a2 + ... + t a5)) e^(-x^2)), t = 1 / (1 + p |x|), Abramowitz and
  Stegun's 7.1.26 (Hastings), at most 1.5e-7 off, under 2 ulp of erf's 0.8 and more there; |x|
  clamped to 4, where float32's erf is 1.

Only float32 (scalar or vector) is rewritten; other dtypes keep LLVM's intrinsics (`_rule`).
Registered once per process for the `llvm` target, before the first compile of a kernel (`build._compile`),
of a model's unscheduled operator and of TVM's default build of a model (`models.run`), so the
whole-model comparisons lower them alike; the MetaSchedule and DLight baselines, built in worker
processes of their own, keep TVM's lowering. CUDA keeps its own."""

from __future__ import annotations

import math
from functools import cache

# Above TVM's own LLVM lowering rules (registered at level 10), so that these take their place.
LEVEL = 99
LN2_HI = 0.693359375  # ln 2 in 9 bits: n x LN2_HI is exact for |n| < 2^15
LN2_LO = math.log(2.0) - LN2_HI
EXP_MIN, EXP_MAX = math.log(2.0**-126), math.log((2 - 2.0**-23) * 2.0**127)
TANH_CLAMP = 10.0
TANH_SERIES = 0.3
# tanh's odd Taylor coefficients, x to x^11 (Bernoulli numbers: 2^2n (2^2n - 1) B_2n / (2n)!)
TANH_TAYLOR = (1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835, -1382.0 / 155925)


def _const(value: float, dtype: str):
    """`value` as a PrimExpr of `dtype` ("float32", "float32x16", "int32x8", ...)."""
    from tvm import tirx

    scalar, _, lanes = dtype.partition("x")
    c = tirx.const(value, scalar)
    return tirx.Broadcast(c, int(lanes)) if lanes else c


def _is_float32(dtype: str) -> bool:
    return dtype == "float32" or dtype.startswith("float32x")


def _dtype(e) -> str:
    """The dtype of a PrimExpr as text ("float32", "float32x16")."""
    return str(e.ty.dtype)


def exp(x):
    """e^x of a float32 PrimExpr (module docstring)."""
    from tvm import tirx

    dtype = _dtype(x)
    ints = dtype.replace("float32", "int32")
    f = lambda v: _const(v, dtype)  # noqa: E731
    clamped = tirx.max(tirx.min(x, f(EXP_MAX)), f(EXP_MIN))
    n = tirx.floor(clamped * f(1.0 / math.log(2.0)) + f(0.5))
    r = clamped - n * f(LN2_HI) - n * f(LN2_LO)
    series = f(1.0 / math.factorial(7))
    for k in range(6, -1, -1):
        series = series * r + f(1.0 / math.factorial(k))
    whole = tirx.Cast(ints, n)
    half = tirx.shift_right(whole, _const(1, ints))
    scale = lambda m: tirx.reinterpret(dtype, tirx.shift_left(m + _const(127, ints), _const(23, ints)))  # noqa: E731
    value = series * scale(half) * scale(whole - half)
    inf = f(float("inf"))
    value = tirx.Select(x > f(EXP_MAX), inf, tirx.Select(x < f(EXP_MIN), f(0.0), value))
    return tirx.Select(tirx.isnan(x), x, value)  # NaN stays NaN (the clamps would make it a number)


def tanh(x):
    """tanh(x) of a float32 PrimExpr (module docstring)."""
    from tvm import tirx

    dtype = _dtype(x)
    f = lambda v: _const(v, dtype)  # noqa: E731
    a = tirx.min(tirx.abs(x), f(TANH_CLAMP))
    far = f(1.0) - f(2.0) / (exp(a + a) + f(1.0))
    square = x * x
    series = f(TANH_TAYLOR[-1])
    for c in reversed(TANH_TAYLOR[:-1]):
        series = series * square + f(c)
    near = x * series
    value = tirx.Select(a < f(TANH_SERIES), near, tirx.Select(x < f(0.0), -far, far))
    return tirx.Select(tirx.isnan(x), x, value)  # NaN stays NaN


ERF_SERIES = 0.9
ERF_CLAMP = 4.0
ERF_TERMS = 11  # n = 0 .. 10
# Abramowitz and Stegun 7.1.26: p and a1 .. a5
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x):
    """erf(x) of a float32 PrimExpr (module docstring)."""
    from tvm import tirx

    dtype = _dtype(x)
    f = lambda v: _const(v, dtype)  # noqa: E731
    a = tirx.min(tirx.abs(x), f(ERF_CLAMP))
    square = x * x
    series = f((-1) ** (ERF_TERMS - 1) / (math.factorial(ERF_TERMS - 1) * (2 * ERF_TERMS - 1)))
    for n in range(ERF_TERMS - 2, -1, -1):
        series = series * square + f((-1) ** n / (math.factorial(n) * (2 * n + 1)))
    near = x * series * f(2 / math.sqrt(math.pi))
    t = f(1.0) / (f(1.0) + f(ERF_P) * a)
    poly = f(ERF_A[-1])
    for c in reversed(ERF_A[:-1]):
        poly = poly * t + f(c)
    far = f(1.0) - t * poly * exp(-(a * a))
    value = tirx.Select(a < f(ERF_SERIES), near, tirx.Select(x < f(0.0), -far, far))
    return tirx.Select(tirx.isnan(x), x, value)  # NaN stays NaN


def _rule(fn, intrinsic: str = ""):
    """The lowering of a call to `fn` for float32; other dtypes call LLVM's `intrinsic`, or
    without one (erf) libm's double function, or `fn` in float32 for a narrower float."""
    def lower(call):
        from tvm import tirx

        x = call.args[0]
        dtype = _dtype(call)
        if _is_float32(dtype):
            return fn(x)
        if intrinsic:
            return tirx.call_llvm_pure_intrin(dtype, intrinsic, x)
        if dtype.startswith("float64"):
            return tirx.call_pure_extern(dtype, fn.__name__, x)
        return tirx.Cast(dtype, fn(tirx.Cast(dtype.replace(dtype.split("x")[0], "float32"), x)))

    return lower


@cache
def register() -> None:
    """The rules, for the `llvm` target, once per process (`build._compile` calls it before
    every compile)."""
    from tvm.tirx import register_intrin_lowering

    register_intrin_lowering("tirx.exp", target="llvm", f=_rule(exp, "llvm.exp"), level=LEVEL)
    register_intrin_lowering("tirx.tanh", target="llvm", f=_rule(tanh, "llvm.tanh"), level=LEVEL)
    register_intrin_lowering("tirx.erf", target="llvm", f=_rule(erf), level=LEVEL)
