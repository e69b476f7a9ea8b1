import numpy as np
import pytest
import tvm

from workbench.errors import UserError
from workbench.ops import catalog
from workbench.ops.expr_lang import build_expr, build_te_from_expr, parse, tensor_shapes
from workbench.ops.expr_syntax import MAX_OPERATIONS
from workbench.ops.reference import random_inputs, reference
from workbench.ops.shapes import MAX_ELEMENTS
from workbench.ops.tensor_expr import REDUCE, SPATIAL

CONV = "O[n,f,h,w] += I[n,c,h*2+r,w*2+s] * W[f,c,r,s]"


def run_on_cpu(expr, inputs):
    """Compile the expression's PrimFunc for the local CPU and run it on `inputs`."""
    executable = tvm.compile(tvm.IRModule({"main": expr.func}), target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(reference(expr, inputs).shape, expr.dtype), dev)
    executable["main"](*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    return out.numpy()


def test_axes_inputs_and_shapes():
    st = parse(CONV)
    assert st.spatial_axes == ("n", "f", "h", "w")
    assert st.reduce_axes == ("c", "r", "s")
    assert st.inputs == ("I", "W")
    shapes = tensor_shapes(st, dict(n=1, f=4, h=5, w=6, c=3, r=3, s=2))
    # (h - 1) * 2 + (r - 1) + 1 = 11 rows, (w - 1) * 2 + (s - 1) + 1 = 12 columns
    assert shapes == {"I": (1, 3, 11, 12), "W": (4, 3, 3, 2), "O": (1, 4, 5, 6)}


def test_inputs_follow_first_appearance():
    st = parse("Y[i,j] = B[j] * A[i,j] + B[j]")
    inputs, output = build_te_from_expr("Y[i,j] = B[j] * A[i,j] + B[j]", dict(i=2, j=3))
    assert st.inputs == ("B", "A") and [t.name for t in inputs] == ["B", "A"]
    assert output.name == "Y"


@pytest.mark.parametrize(
    "text, message",
    [
        ("C[i+1] = A[i]", "output index 'i+1' of C (column 3) must be a plain axis name"),
        ("C[2] = A[i]", "output index '2' of C"),
        ("C[i,i] = A[i]", "output C repeats an axis"),
        ("C[i] = C[i] + A[i]", "output tensor C also appears on the right (column 8)"),
        ("C[i] = A[i,k]", "axis 'k' appears only on the right: use a reducing assignment"),
        ("C[i] += A[i]", "'+=' needs an axis that appears only on the right"),
        ("C[i] = A[i] + A[i,i]", "tensor A is used with 1 and 2 indices"),
        ("C[i] = A[i] + A[i+1]", "tensor A is read with different indices at columns 8 and 15"),
        ("C[i] = 2", "the right side reads no tensor"),
        ("C[A] = A[A]", "'A' is used both as a tensor and as an axis"),
    ],
)
def test_meaning_errors(text, message):
    with pytest.raises(UserError) as err:
        parse(text)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "extents, message",
    [
        (dict(i=4, j=4), "no extent for axis 'k'; give it with --shape k=N"),
        (dict(i=4, j=4, k=4, q=2), "extent given for 'q', which is not an axis"),
        (dict(i=0, j=4, k=4), "extent of i must be a positive integer"),
        (dict(i=(2, 2), j=4, k=4), "extent of i must be a positive integer"),
        (dict(i=65536, j=4, k=65536), "tensor A has shape 65536x65536"),
        (dict(i=2, j=2, k=MAX_ELEMENTS + 1), "extent of k must be a positive integer up to"),
    ],
)
def test_extent_errors(extents, message):
    with pytest.raises(UserError) as err:
        build_te_from_expr("C[i,j] += A[i,k] * B[k,j]", extents)
    assert message in str(err.value)


def test_negative_index_is_refused():
    with pytest.raises(UserError, match=r"index 'i-1' of A \(column 10\) goes below 0, down to -1"):
        build_te_from_expr("C[i] = A[i-1]", dict(i=4))


# Each parsed, and TVM refused it with a traceback (or, for the inf/NaN ones, built a kernel whose
# every output is inf or NaN): now a one-line error naming the problem and its column.
VALUE_ERRORS = [
    ("C[i] = A[i] / 0", "float32", "division by zero at column 13: the divisor 0 folds to 0"),
    ("C[i] = A[i] / (A[i] - A[i])", "float32", "division by zero at column 13: the divisor (A[i]-A[i]) folds to 0"),
    ("C[i] = A[i] / (2*A[i] - A[i] - A[i])", "float32", "division by zero at column 13"),
    ("C[i] = A[i] / (0 * A[i])", "float32", "division by zero at column 13"),
    ("C[i] = A[i] / (max(A[i], B[i]) - max(B[i], A[i]))", "float32", "division by zero at column 13"),
    ("C[i] = A[i] / (A[i]*B[i] - B[i]*A[i])", "float32", "division by zero at column 13"),
    ("C[i] = A[i] / (exp(0) - 1)", "float32", "division by zero at column 13"),
    ("C[i] = A[i] / -0.0", "float64", "division by zero at column 13"),
    ("C[i] = A[i] / (1e-30 * 1e-30)", "float32", "the divisor (1e-30*1e-30) folds to 0"),  # TVM rounds it to 0 too
    ("C[i] += A[i,k] / (A[i,k] - A[i,k])", "float32", "division by zero at column 16"),
    ("C[i] = A[i] * 1e39", "float32", "literal 1e+39 at column 15 is beyond the range of float32"),
    ("C[i] = A[i] * 1e5", "float16", "literal 100000 at column 15 is beyond the range of float16 (largest 65504)"),
    ("C[i] = A[i] - 70000", "float16", "literal 70000 at column 15 is beyond the range of float16"),
    ("C[i] = A[i] + 1e-50", "float32", "literal 1e-50 at column 15 rounds to 0 in float32"),
    ("C[i] = A[i] + 1e-8", "float16", "literal 1e-08 at column 15 rounds to 0 in float16"),
    ("C[i] = A[i] * (300 * 300)", "float16", "the constant (300*300) at column 20 folds to 90000, which is not a finite float16"),
    ("C[i] = A[i] + (A[i] - A[i] + 3e38) * 10", "float32", "folds to 3e+39"),
    ("C[i] = A[i] + sqrt(-1)", "float32", "the constant sqrt(-1) at column 15 folds to nan"),
    ("C[i] = A[i] + log(0)", "float64", "the constant log(0) at column 15 folds to -inf"),
    ("C[i] = A[i] * exp(100)", "float32", "the constant exp(100) at column 15 folds to 2.68812e+43"),
]


@pytest.mark.parametrize("text, dtype, message", VALUE_ERRORS)
def test_values_tvm_refuses_are_one_line_errors(text, dtype, message):
    with pytest.raises(UserError) as err:
        build_expr(text, dict(i=4, k=3), dtype)
    assert str(err.value).startswith("expression: ") and message in str(err.value)


# Every read cancels: the output is a constant no kernel need compute and no verification can
# tell from a kernel writing it (before, `(B[i] - B[i]) * A[i]` raised KeyError 'B' in
# `_kernel_args`, the folded tensors missing from every block). Refused by the fold, or, where
# TVM's simplifier cancels more than the fold sees, once TVM has simplified it.
CANCELLED = [
    ("C[i] = (B[i] - B[i]) * A[i]", "once its terms cancel (it folds to 0)"),
    ("C[i] += A[i,k] - A[i,k]", "once its terms cancel (it folds to 0)"),
    ("C[i] = exp(A[i] - A[i])", "once its terms cancel (it folds to 1)"),
    ("C[i] = A[i]*B[i] - B[i]*A[i] + 2", "once its terms cancel (it folds to 2)"),
    ("C[i] max= 0 * A[i,k]", "once its terms cancel (it folds to 0)"),
    ("C[i] = (A[i] - A[i]) / B[i]", "once TVM simplifies it (its terms cancel)"),
]


@pytest.mark.parametrize("text, message", CANCELLED)
def test_a_right_side_whose_reads_all_cancel_is_refused(text, message):
    with pytest.raises(UserError) as err:
        build_expr(text, dict(i=4, k=3) if "k]" in text else dict(i=4))
    assert str(err.value) == f"expression: the right side reads no tensor {message}"


def test_a_tensor_whose_every_use_cancels_stays_an_argument():
    """The kernel takes every tensor the expression names, in order, also one the main block no
    longer reads; `input_args` pairs each read tensor with its own argument, not the next one."""
    from workbench.rtile.panels import padded_inputs

    e = build_expr("C[i,j] += (D[k] - D[k]) + A[i,k] * B[k,j]", dict(i=5, j=3, k=7))
    assert [t.name for t in e.inputs] == ["A", "B"]
    assert [(a.name, a.shape, a.role) for a in e.args] == [
        ("D", (7,), "input"), ("A", (5, 7), "input"), ("B", (7, 3), "input"), ("C", (5, 3), "output")]
    assert [a.name for a in e.input_args] == ["A", "B"]
    assert padded_inputs(e) == ()  # positionally A would meet D's smaller shape and pass for padded
    inputs = random_inputs(e)
    assert [x.shape for x in inputs] == [(7,), (5, 7), (7, 3)]
    np.testing.assert_allclose(run_on_cpu(e, inputs), reference(e, inputs), rtol=1e-5)


@pytest.mark.parametrize(
    "text, dtype",
    [
        ("C[i] = A[i] / A[i]", "float32"),  # not a constant divisor
        ("C[i] = (A[i] + 3e38) + 3e38", "float32"),  # not folded by TVM: a value, not a constant
        ("C[i] = A[i] * 65504 + 6e-8", "float16"),  # the largest and the smallest float16
        ("C[i] = A[i] * 1e300 + exp(700)", "float64"),
        ("C[i] = A[i] / (A[i] - B[i])", "float32"),
    ],
)
def test_values_at_the_edge_of_the_range_build(text, dtype):
    assert build_expr(text, dict(i=4), dtype).dtype == dtype


def test_whatever_tvm_still_refuses_is_a_user_error(monkeypatch):
    """A net behind `check_values`: TVM's own refusal of user text is one line too."""
    from workbench.ops import tensor_expr

    def refuse(*args):
        raise tvm.error.InternalError("Check failed: something TVM's simplifier found\nmore lines")

    monkeypatch.setattr(tensor_expr, "from_te", refuse)
    with pytest.raises(UserError, match="^expression: TVM refuses it: Check failed: something TVM's simplifier found$"):
        build_expr("C[i] = A[i] + 1", dict(i=4))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "bfloat16"])
def test_bad_dtype(dtype):
    # Integer dtypes are refused before any literal is checked against their range.
    with pytest.raises(UserError, match=f"unsupported dtype '{dtype}'"):
        build_te_from_expr("C[i] = A[i] * 100000", dict(i=4), dtype=dtype)


def test_build_expr_records_text_and_extents():
    expr = build_expr("C[i,j] += A[i,k] * B[k,j]", dict(i=3, j=4, k=5))
    assert expr.op == "expr"
    assert dict(expr.params) == {"expr": "C[i,j] += A[i,k] * B[k,j]", "i": 3, "j": 4, "k": 5}
    assert [(a.name, a.kind) for a in expr.axes] == [("i", SPATIAL), ("j", SPATIAL), ("k", REDUCE)]


# (expression, extents, catalog op, params): the same computation written both ways
SAME_AS_CATALOG = [
    ("C[i,j] += A[i,k] * B[k,j]", dict(i=5, j=6, k=7), "matmul", dict(M=5, N=6, K=7)),
    (
        CONV,
        dict(n=1, f=4, h=3, w=4, c=3, r=3, s=3),
        "conv2d",
        dict(N=1, C=3, H=7, W=9, F=4, KH=3, KW=3, stride=2, pad=0),
    ),
    (
        "O[n,c,h,w] max= I[n,c,h*2+r,w*2+s]",
        dict(n=1, c=2, h=3, w=3, r=3, s=3),
        "maxpool",
        dict(N=1, C=2, H=7, W=7, K=3, stride=2, pad=0),
    ),
    ("Y[i] += X[i,j]", dict(i=4, j=9), "reduce_sum", dict(shape=(4, 9), axes=1)),
]


@pytest.mark.parametrize("text, extents, op, params", SAME_AS_CATALOG)
def test_expression_matches_catalog_and_reference(text, extents, op, params):
    expr, op_expr = build_expr(text, extents), catalog.build(op, params)
    assert [a.extent for a in expr.axes] == [a.extent for a in op_expr.axes]
    assert [t.index for t in expr.tensors] == [t.index for t in op_expr.tensors]
    inputs = random_inputs(expr, seed=3)
    got = run_on_cpu(expr, inputs)
    np.testing.assert_allclose(got, reference(expr, inputs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, run_on_cpu(op_expr, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "text, extents",
    [
        ("Y[i,j] = -A[i,j] / 2 + sigmoid(B[j]) * exp(A[i,j]) - tanh(abs(A[i,j])) + min(B[j], 0.25)", dict(i=3, j=4)),
        ("P[i] *= A[i, 2*j + 1] + 1.5", dict(i=3, j=4)),
        ("M[i] min= sqrt(abs(A[j, i])) + log(abs(A[j, i]) + 1) - max(A[j, i], 0)", dict(i=3, j=5)),
    ],
)
def test_functions_and_reductions_match_reference(text, extents):
    expr = build_expr(text, extents)
    inputs = random_inputs(expr, seed=1)
    np.testing.assert_allclose(run_on_cpu(expr, inputs), reference(expr, inputs), rtol=1e-5, atol=1e-6)


def test_longest_allowed_chain_builds_and_evaluates():
    text = "Y[i] = A[i]" + " + A[i]" * MAX_OPERATIONS
    expr = build_expr(text, dict(i=2))
    (a,) = random_inputs(expr)
    np.testing.assert_allclose(reference(expr, [a]), a * (MAX_OPERATIONS + 1), rtol=1e-5)
