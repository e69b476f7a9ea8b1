"""exp, tanh and erf on CPUs from multiplies and adds (`codegen.vector_math`), against numpy over their
whole float32 range, in a kernel's vectors and in its scalar code."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import device
from workbench.codegen import vector_math
from workbench.codegen.build import build_kernel
from workbench.codegen.verify import run_kernel
from workbench.export import schedule_script
from workbench.ops.expr_lang import build_expr
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus

N = 4096
EPS = float(np.finfo(np.float32).eps)
TINY = float(np.finfo(np.float32).tiny)


def _run(fn: str, x: np.ndarray, vector: bool) -> tuple[np.ndarray, str]:
    """`fn` over `x` (N float32 values) by a kernel whose register tile is 16 values (vectorised)
    or 1 (scalar), and its assembly."""
    e = build_expr(f"Y[i] = {fn}(X[i])", {"i": N})
    top = 16 if vector else 1
    program = make_program(calculus(e), device("local-cpu"), [(top,), (256,), (N,)], [True] * 3, 0.0)
    kernel = build_kernel(e, program, device("local-cpu"))
    assert kernel.ok, kernel.error
    return run_kernel(kernel, [x.astype(np.float32)]), dict(kernel.sources)["s"]


def _run_te(fn: str, x: np.ndarray, vector: bool) -> tuple[np.ndarray, str]:
    """As `_run`, for a function the expression language does not name (erf): built in TE."""
    from tvm import te, tirx

    from workbench.ops.tensor_expr import from_te

    X = te.placeholder((N,), "float32", name="X")
    Y = te.compute((N,), lambda i: getattr(tirx, fn)(X[i]), name="Y")
    e = from_te("expr", {"expr": f"Y[i] = {fn}(X[i])", "i": N}, [X], Y, "float32")
    top = 16 if vector else 1
    program = make_program(calculus(e), device("local-cpu"), [(top,), (256,), (N,)], [True] * 3, 0.0)
    kernel = build_kernel(e, program, device("local-cpu"))
    assert kernel.ok, kernel.error
    return run_kernel(kernel, [x.astype(np.float32)]), dict(kernel.sources)["s"]


def _spread(*ranges) -> np.ndarray:
    points = np.concatenate([np.linspace(lo, hi, 1000, dtype=np.float64) for lo, hi in ranges])
    return np.resize(points, N).astype(np.float32)


@pytest.mark.parametrize("vector", [True, False], ids=["vectors", "scalar"])
def test_exp_matches_numpy_to_a_few_ulps_and_over_and_underflows_as_it_does(vector):
    x = _spread((-104, -85), (-85, 85), (-1, 1), (85, 90))
    x[:5] = (0.0, -0.0, 1e-30, 88.7, np.nan)  # e^88.7 just under FLT_MAX
    out, asm = _run("exp", x, vector)
    assert "expf" not in asm  # no libm call per lane
    assert np.isnan(out[4])
    x, out = np.delete(x, 4), np.delete(out, 4)
    ref = np.exp(x.astype(np.float64))
    normal = (ref >= TINY) & (ref <= np.finfo(np.float32).max)
    assert np.all(np.abs(out[normal] - ref[normal]) <= 4 * EPS * ref[normal])
    assert np.all(out[ref < TINY] <= TINY) and np.all(out[ref < TINY] >= 0)
    assert np.all(np.isinf(out[~normal & (ref > 1)]))


@pytest.mark.parametrize("vector", [True, False], ids=["vectors", "scalar"])
def test_tanh_matches_numpy_to_a_few_ulps_near_zero_and_saturates_far_from_it(vector):
    x = _spread((-30, 30), (-1, 1), (-0.31, 0.31), (-1e-6, 1e-6))
    x[:7] = (0.0, 1e-30, -1e-30, vector_math.TANH_SERIES, -vector_math.TANH_SERIES, np.inf, np.nan)
    out, asm = _run("tanh", x, vector)
    assert not re.search(r"call\w*\s+(expf|tanhf)", asm)
    assert np.isnan(out[6])
    x, out = np.delete(x, 6), np.delete(out, 6)
    ref = np.tanh(x.astype(np.float64))
    assert out[0] == 0.0 and out[5] == 1.0
    assert np.all(np.abs(out - ref) <= 4 * EPS * np.abs(ref) + TINY)


def test_an_exported_schedule_says_how_its_library_lowers_exp():
    """Replayed and built by plain `tvm.compile`, the schedule would call libm per lane: the
    exported `schedule.py` says so where the kernel computes exp, tanh or sigmoid (through exp),
    and only there."""
    for fn, noted in (("exp", True), ("tanh", True), ("sigmoid", True), ("abs", False)):
        e = build_expr(f"Y[i] = {fn}(X[i])", {"i": N})
        program = make_program(calculus(e), device("local-cpu"), [(16,), (256,), (N,)], [True] * 3, 0.0)
        kernel = build_kernel(e, program, device("local-cpu"))
        assert kernel.ok, kernel.error
        assert ("vector_math.register()" in schedule_script(kernel, e)) is noted
        assert "expf" not in dict(kernel.sources)["s"]


@pytest.mark.parametrize("vector", [True, False], ids=["vectors", "scalar"])
def test_erf_matches_numpy_to_a_few_ulps(vector):
    """erf (a BERT layer's gelu): its series below 0.9, Abramowitz and Stegun's 7.1.26 above."""
    from math import erf

    x = _spread((-6, 6), (-1, 1), (-0.91, 0.91), (-1e-6, 1e-6))
    x[:5] = (0.0, 1e-30, vector_math.ERF_SERIES, -vector_math.ERF_SERIES, np.inf)
    out, asm = _run_te("erf", x, vector)
    assert not re.search(r"call\w*\s+(expf|erff)", asm)
    ref = np.array([erf(v) for v in x.astype(np.float64)])
    assert out[0] == 0.0 and out[4] == 1.0
    assert np.all(np.abs(out - ref) <= 4 * EPS * np.abs(ref) + TINY)
