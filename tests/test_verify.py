"""codegen.verify: the one correctness check. Tolerances follow the reduction length and the
combiner, degenerate references are refused, and a wrong output is named with where it is."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import expr
from workbench.codegen.verify import TOLERANCE, check_output, compare, degenerate, tolerance
from workbench.ops.expr_lang import build_expr
from workbench.ops.reference import Reference, random_inputs, reference_with_scale

EPS32 = float(np.finfo(np.float32).eps)


def _ref(value, scale=0.0) -> Reference:
    value = np.asarray(value, dtype=np.float64)
    return Reference(value, np.broadcast_to(np.float64(scale), value.shape).copy())


def test_compare_flags_wrong_values_and_names_the_worst_output():
    ref = _ref([1.0, -2.0, 3.0], scale=1.0)
    assert compare(np.array([1.0, -2.0, 3.0], np.float32), ref, "float32").correct
    wrong = np.array([1.0, -2.001, 3.0], np.float32)
    check = compare(wrong, ref, "float32")
    assert not check.correct and check.max_abs_err == pytest.approx(1e-3, rel=1e-2)
    assert "1 of 3 outputs" in check.error and "worst at (1,)" in check.error
    assert not compare(np.zeros(2, np.float32), ref, "float32").correct  # shape
    nan = np.array([1.0, np.nan, 3.0], np.float32)
    assert "not finite" in compare(nan, ref, "float32").error


def test_tolerance_is_per_output_from_the_error_scale():
    ref = _ref([1.0, 100.0], scale=[2.0, 0.0])
    atol, rtol = tolerance(ref, "float32")
    assert rtol == pytest.approx(TOLERANCE * EPS32)
    assert atol[0] == pytest.approx(2 * TOLERANCE * EPS32, rel=1e-6) and atol[1] < 1e-30
    # the same outputs, one ulp-sized error each: inside; 100 eps at the output with scale 0: outside
    assert compare(np.array([1 + 2 * EPS32, 100.0], np.float32), ref, "float32").correct
    assert not compare(np.array([1.0, 100.0 * (1 + 100 * EPS32)], np.float32), ref, "float32").correct
    assert tolerance(ref, "float16")[1] > rtol  # float16's eps


@pytest.mark.parametrize(
    "reason, value, scale",
    [
        ("not finite", [1.0, np.inf], 0.0),
        ("beyond float32's range", [1.0, 1e39], 0.0),
        ("writing zeros", [0.0, 0.0, 0.0], 0.0),
        ("writing zeros", [1e-40, -1e-39], 0.0),  # flushed below float32's normal range
        ("writing zeros", [1e-3, -1e-3], 1e5),  # all within the tolerance of 0
        ("that constant", [0.5, 0.5, 0.5], 0.0),
        ("that constant", [0.5, 0.5 + 1e-8], 1.0),
        # bounds ~1.4e-6: 2.5e-6 from the median 0.5, but 0.5 + 1.25e-6 is within every bound
        ("that constant", [0.5, 0.5, 0.5 + 2.5e-6], 1.0),
        ("ill-conditioned", [1.0, 2.0], np.inf),
    ],
)
def test_degenerate_references_are_refused(reason, value, scale):
    ref = _ref(value, scale)
    assert reason in degenerate(ref, "float32")
    check = compare(np.asarray(value), ref, "float32")
    assert not check.correct and check.error.startswith("cannot verify:") and reason in check.error


def test_one_output_is_not_degenerate_for_being_alone():
    assert degenerate(_ref([0.25]), "float32") == ""


def test_tolerances_grow_with_the_reduction_length():
    """A K-term sum of zero-mean terms rounds like a random walk over partial sums of size
    sqrt(K): the tolerance grows about like K (module docstring), and a lost term (the size of
    one term, ~0.5) stays far outside it even at K = 4096."""
    def widest(k):
        e = expr("gemv", M=8, K=k)
        atol, _ = tolerance(reference_with_scale(e, random_inputs(e, seed=1)), "float32")
        return float(np.median(atol))

    small, big = widest(64), widest(4096)
    assert 64 / 3 < big / small < 64 * 3
    assert big < 0.05


def test_the_reproducer_inputs_are_sound():
    """Issue 12: `M[i,j] *= A[k,i,j]` over 301 terms. A correct output passes; the output of the
    wrong kernel (20 of 315 outputs wrong at the tile boundary of the fused ij axis) fails; and
    the uniform [-1, 1] inputs that once let every kernel through are refused."""
    e = build_expr("M[i,j] *= A[k,i,j]", dict(i=9, j=35, k=301))
    inputs = random_inputs(e, seed=0)
    ref = reference_with_scale(e, inputs)
    good = ref.value.astype(np.float32)
    assert check_output(e, inputs, good).correct
    bad = good.copy()
    bad.flat[160:175] = bad.flat[160 - 35 : 175 - 35]  # a tile boundary copying the wrong row
    assert "exceeds the tolerance at 15 of 315" in check_output(e, inputs, bad).error
    uniform = [np.random.default_rng(0).uniform(-1, 1, inputs[0].shape).astype(np.float32)]
    assert "cannot verify" in check_output(e, uniform, np.zeros((9, 35), np.float32)).error


@pytest.mark.parametrize("op", ("+=", "max=", "min="))
def test_a_lost_term_is_caught_for_every_combiner(op):
    text = f"M[i,j] {op} A[k,i,j]"
    e = build_expr(text, dict(i=9, j=35, k=301))
    inputs = random_inputs(e, seed=0)
    a = inputs[0].astype(np.float64)
    good = reference_with_scale(e, inputs).value
    reduce = {"+=": np.sum, "max=": np.max, "min=": np.min}[op]
    assert check_output(e, inputs, good.astype(np.float32)).correct
    lost = good.copy()
    lost[4, 20] = reduce(np.delete(a[:, 4, 20], np.argmax(np.abs(a[:, 4, 20]))))
    lost[4, 21] = reduce(np.delete(a[:, 4, 21], np.argmin(a[:, 4, 21])))
    lost[4, 22] = reduce(np.delete(a[:, 4, 22], np.argmax(a[:, 4, 22])))
    check = check_output(e, inputs, lost.astype(np.float32))
    assert not check.correct and "exceeds the tolerance" in check.error


def test_each_reference_is_compared_with_its_own_tolerance_when_they_alternate():
    """`compare` keeps the last reference's bounds: a second reference, even with equal values,
    is compared with its own, and going back to the first gives the first's answer again."""
    loose = _ref([1.0, 2.0, 3.0], scale=1.0)  # bound at 2.0: 8 eps (1 + 2) = 2.9e-6
    tight = _ref([1.0, 2.0, 3.0], scale=0.0)  # 8 eps * 2 = 1.9e-6
    out = np.array([1.0, 2.0 + 2.4e-6, 3.0], np.float32)
    assert compare(out, loose, "float32").correct
    assert not compare(out, tight, "float32").correct
    assert compare(out, loose, "float32").correct
    assert degenerate(_ref([0.0, 0.0]), "float32") and compare(out, loose, "float32").correct
