import numpy as np
import pytest
import tvm

from workbench.codegen.verify import TOLERANCE, check_output, degenerate
from workbench.errors import UserError
from workbench.ops import catalog, reference
from workbench.ops.expr_lang import build_expr, parse
from workbench.ops.reference import evaluate, input_shapes, random_inputs

CONV = dict(N=2, C=3, H=7, W=6, F=4, KH=3, KW=2, stride=2, pad=1, dilation=2)

# Every catalog op at tiny sizes, with padding, strides, transposes and multipliers exercised.
CASES = [
    ("matmul", dict(M=3, N=4, K=5)),
    ("matmul", dict(M=3, N=4, K=5, B=2, trans_a=True, trans_b=True)),
    ("gemv", dict(M=3, K=4)),
    ("conv2d", CONV),
    ("group_conv2d", dict(CONV, C=6, groups=2)),
    ("group_conv2d", dict(N=1, C=6, H=5, W=5, F=9, KH=1, KW=1, stride=1, pad=0, groups=3)),
    ("depthwise_conv2d", dict(N=1, C=2, H=5, W=5, KH=3, KW=3, stride=2, pad=1, multiplier=2)),
    ("depthwise_conv2d", dict(N=1, C=2, H=5, W=5, KH=3, KW=3, stride=1, pad=1)),
    ("relu", dict(shape=(3, 4))),
    ("add", dict(shape=(3,))),
    ("gelu", dict(shape=(2, 3))),
    ("avgpool", dict(N=1, C=2, H=5, W=6, K=3, stride=2, pad=1)),
    # pad 2 with K 2, stride 2: the first window row lies wholly in the padding
    ("maxpool", dict(N=1, C=2, H=5, W=5, K=2, stride=2, pad=2)),
    ("reduce_sum", dict(shape=(3, 4, 5), axes=(0, 2))),
    ("reduce_mean", dict(shape=(3, 4), axes=1)),
    ("reduce_sum", dict(shape=(3, 4), axes=(0, 1))),
]


@pytest.mark.parametrize("op, params", CASES)
def test_reference_matches_the_tvm_kernel(op, params):
    expr = catalog.build(op, params)
    inputs = random_inputs(expr, seed=7)
    want = reference.reference(expr, inputs)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(want.shape, expr.dtype), dev)
    tvm.compile(tvm.IRModule({"main": expr.func}), target="llvm")["main"](
        *[tvm.runtime.tensor(a, dev) for a in inputs], out
    )
    assert want.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    check = check_output(expr, inputs, out.numpy())  # within verify's tolerance too
    assert check.correct, check.error


def _ref(op, params, inputs):
    return reference.reference(catalog.build(op, params), inputs)


def test_matmul_transposes_and_batch():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(8.0).reshape(4, 2)
    got = _ref("matmul", dict(M=3, N=4, K=2, trans_a=True, trans_b=True), [a, b])
    np.testing.assert_allclose(got, a.T @ b.T)
    a3, b3 = np.ones((2, 3, 5)), np.ones((2, 5, 4))
    assert _ref("matmul", dict(M=3, N=4, K=5, B=2), [a3, b3]).shape == (2, 3, 4)


def test_conv2d_by_definition():
    rng = np.random.default_rng(0)
    data, kernel = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 2))
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    got = _ref("conv2d", CONV, [data, kernel])
    oh, ow = (9 - 5) // 2 + 1, (8 - 3) // 2 + 1
    assert got.shape == (2, 4, oh, ow)
    n, f, h, w = 1, 2, 1, 2
    window = padded[n, :, h * 2 : h * 2 + 5 : 2, w * 2 : w * 2 + 3 : 2]
    assert got[n, f, h, w] == pytest.approx(float(np.sum(window * kernel[f])), rel=1e-5)


def test_group_conv_is_one_conv2d_per_group():
    """Each group's slice of the output is the plain conv2d of its slice of the input channels
    with its slice of the filters; nothing reaches across groups."""
    rng = np.random.default_rng(1)
    data, kernel = rng.standard_normal((2, 6, 7, 6)), rng.standard_normal((4, 3, 3, 2))
    got = _ref("group_conv2d", dict(CONV, C=6, groups=2), [data, kernel])
    for g in range(2):
        alone = _ref("conv2d", dict(CONV, F=2), [data[:, 3 * g : 3 * g + 3], kernel[2 * g : 2 * g + 2]])
        np.testing.assert_allclose(got[:, 2 * g : 2 * g + 2], alone, rtol=1e-12)
    data[:, 3:] = 0.0  # group 1's input gone: its output is zero, group 0's unchanged
    zeroed = _ref("group_conv2d", dict(CONV, C=6, groups=2), [data, kernel])
    np.testing.assert_array_equal(zeroed[:, 2:], 0.0)
    np.testing.assert_array_equal(zeroed[:, :2], got[:, :2])


def test_depthwise_output_channel_is_c_times_multiplier_plus_j():
    data = np.zeros((1, 2, 3, 3))
    data[0, 1] = 1.0
    kernel = np.arange(4.0).reshape(4, 1, 1, 1)  # output channel c*2 + j has weight c*2 + j
    got = _ref("depthwise_conv2d", dict(N=1, C=2, H=3, W=3, KH=1, KW=1, stride=1, pad=0, multiplier=2), [data, kernel])
    assert got.shape == (1, 2, 2, 3, 3)
    np.testing.assert_array_equal(got[0, 1, :, 0, 0], [2.0, 3.0])
    np.testing.assert_array_equal(got[0, 0], 0.0)


def test_pool_padding_semantics():
    ones = np.ones((1, 1, 4, 4))
    avg = _ref("avgpool", dict(N=1, C=1, H=4, W=4, K=3, stride=1, pad=1), [ones])
    assert avg[0, 0, 0, 0] == pytest.approx(4 / 9)  # padding counts: 4 real cells / 9
    assert avg[0, 0, 1, 1] == pytest.approx(1.0)
    low = np.full((1, 1, 4, 4), -5.0)
    mx = _ref("maxpool", dict(N=1, C=1, H=4, W=4, K=3, stride=1, pad=1), [low])
    np.testing.assert_array_equal(mx, -5.0)  # the padding value never wins


def test_elementwise_and_reductions():
    x = np.array([[-2.0, 0.0, 3.0], [1.0, -1.0, 10.0]])
    np.testing.assert_array_equal(_ref("relu", dict(shape=(2, 3)), [x]), np.maximum(x, 0))
    gelu = _ref("gelu", dict(shape=(2, 3)), [x])
    assert gelu[0, 1] == 0.0 and gelu[1, 2] == pytest.approx(10.0) and gelu[0, 0] == pytest.approx(-0.0454, abs=1e-3)
    np.testing.assert_allclose(_ref("reduce_mean", dict(shape=(2, 3), axes=1), [x]), x.mean(axis=1), rtol=1e-6)
    assert _ref("reduce_sum", dict(shape=(2, 3), axes=(0, 1)), [x]).shape == ()


def test_random_inputs_use_call_shapes():
    expr = catalog.build("conv2d", CONV)
    a, b = random_inputs(expr, seed=5)
    assert a.shape == (2, 3, 7, 6) and b.shape == (4, 3, 3, 2)  # data unpadded, unlike expr.tensors[0]
    assert a.dtype == np.float32 and -1 <= a.min() and a.max() <= 1
    np.testing.assert_array_equal(a, random_inputs(expr, seed=5)[0])
    assert input_shapes(build_expr("C[i] = A[2*i+1]", dict(i=3))) == ((6,),)  # 2*2 + 1 + 1


EXPRESSIONS = [
    ("O[n,f,h,w] += I[n,c,h*2+r,w*2+s] * W[f,c,r,s]", dict(n=2, f=3, h=4, w=5, c=3, r=2, s=3)),
    ("B[i,k] max= A[i,j] - A2[k,j]", dict(i=5, j=9, k=4)),
    ("P[i] *= A[i,j] + 2", dict(i=6, j=7)),
    ("C[b,i,j] += A[b,i,k] * B[b,k,j]", dict(b=2, i=5, j=6, k=7)),
    ("S[i] += exp(A[i,j]) - B[j,i]", dict(i=6, j=6)),
    ("M[i] min= A[i,j] * B[j,i]", dict(i=4, j=9)),
]


@pytest.mark.parametrize("text, extents", EXPRESSIONS)
def test_chunked_evaluation_equals_whole(monkeypatch, text, extents):
    rng = np.random.default_rng(2)
    expr = build_expr(text, extents)
    arrays = [rng.uniform(-1, 1, shape) for shape in input_shapes(expr)]
    whole = reference.reference_with_scale(expr, arrays)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 7)  # forces splits of spatial and reduce axes
    chunked = reference.reference_with_scale(expr, arrays)
    np.testing.assert_allclose(chunked.value, whole.value, rtol=1e-12)
    np.testing.assert_allclose(chunked.scale, whole.scale, rtol=1e-9)  # the statistics combine exactly


def test_einsum_path_equals_matmul():
    a, b = np.arange(12.0).reshape(3, 4), np.arange(20.0).reshape(4, 5)
    np.testing.assert_allclose(evaluate(parse("C[i,j] += A[i,k] * B[k,j]"), dict(i=3, j=5, k=4), [a, b]), a @ b)


def test_inputs_are_checked():
    with pytest.raises(UserError, match=r"input 0 has shape \(4,\), the operator needs \(3,\)"):
        evaluate(parse("C[i] = A[i]"), dict(i=3), [np.zeros(4)])
    with pytest.raises(UserError, match="the operator takes 2 inputs, got 1"):
        reference.reference(catalog.build("gemv", dict(M=3, K=4)), [np.zeros((3, 4))])


def _loops(text, extents, arrays, combine, start):
    """An expression's output by explicit Python loops over every axis (an independent oracle)."""
    st = parse(text)
    spatial, red = st.spatial_axes, st.reduce_axes
    tensors = {name: np.asarray(a, dtype=np.float64) for name, a in zip(st.inputs, arrays)}
    out = np.full([extents[a] for a in spatial], start, dtype=np.float64)
    for where in np.ndindex(*out.shape):
        for inner in np.ndindex(*[extents[a] for a in red]):
            env = dict(zip(spatial, where)) | dict(zip(red, inner))
            out[where] = combine(out[where], _value(st.value, env, tensors))
    return out


def _value(node, env, tensors):
    from workbench.ops.expr_syntax import Binary, Ref

    if isinstance(node, Ref):
        return tensors[node.tensor][tuple(sum(c * env[a] for a, c in i.terms) + i.const for i in node.indices)]
    assert isinstance(node, Binary) and node.op == "*"
    return _value(node.left, env, tensors) * _value(node.right, env, tensors)


def test_broadcast_reduction_reference():
    """Issue 12: `C[i,j] += A[i,k] * B[k]` (j read by no input) made np.einsum refuse the output
    subscript, so correct kernels were recorded as failed."""
    text, extents = "C[i,j] += A[i,k] * B[k]", dict(i=3, j=4, k=5)
    expr = build_expr(text, extents)
    inputs = random_inputs(expr, seed=1)
    got = reference.reference_with_scale(expr, inputs)
    want = _loops(text, extents, inputs, lambda acc, t: acc + t, 0.0)
    np.testing.assert_allclose(got.value, want, rtol=1e-12)
    assert np.all(got.value == got.value[:, :1])  # equal along the broadcast j
    assert np.all(got.scale > 0)
    lib = tvm.compile(tvm.IRModule({"main": expr.func}), target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((3, 4), "float32"), dev)
    lib["main"](*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    assert check_output(expr, inputs, out.numpy()).correct


def test_product_inputs_stay_near_one_so_301_terms_neither_under_nor_overflow():
    """Issue 12: uniform [-1, 1] inputs made a 301-term product underflow to 0 in float32, which
    any kernel "matched"; per-combiner inputs keep |product| near 1 with both signs."""
    expr = build_expr("M[i,j] *= A[k,i,j]", dict(i=9, j=35, k=301))
    (a,) = random_inputs(expr, seed=0)
    assert (a > 0).any() and (a < 0).any()
    ref = reference.reference_with_scale(expr, [a])
    logs = np.log(np.abs(ref.value))
    assert -8 < logs.min() and logs.max() < 8 and 0.3 < logs.std() < 3  # std(log|P|) ~ 1 by design
    assert (ref.value > 0).any() and (ref.value < 0).any()
    assert degenerate(ref, "float32") == ""
    uniform = np.random.default_rng(0).uniform(-1, 1, a.shape).astype(np.float32)
    assert "writing zeros would pass" in degenerate(reference.reference_with_scale(expr, [uniform]), "float32")


@pytest.mark.parametrize(
    "text, positive, away",
    [
        ("Y[i] = log(A[i]) + B[i]", True, True),
        ("Y[i] += sqrt(A[i,k])", True, True),
        ("Y[i] = A[i] / B[i]", False, True),
        ("Y[i] = A[i] / 2", False, False),
        ("Y[i] max= A[i,k] - B[k]", False, False),
    ],
)
def test_inputs_stay_in_the_domain(text, positive, away):
    st = parse(text)
    extents = {a: 50 for a in st.spatial_axes + st.reduce_axes}
    for x in random_inputs(build_expr(text, extents), seed=3):
        assert (x.min() > 0) == positive
        assert (np.abs(x).min() >= 0.5) == away
        assert np.abs(x).max() <= 1.5


def test_error_scale_follows_the_reduction_length():
    """Zero-mean sums: the scale grows like K (the accumulation's random walk over partial sums
    of size sqrt(K)); same-sign sums like K^1.5. Max and min of plain reads are exact."""
    def scale(text, k, low):
        expr = build_expr(text, dict(i=64, k=k))
        x = np.random.default_rng(0).uniform(low, 1.0, input_shapes(expr)[0])
        return float(np.median(reference.reference_with_scale(expr, [x]).scale))

    for low, power in ((-1.0, 1.0), (0.0, 1.5)):
        ratio = scale("S[i] += A[i,k]", 4096, low) / scale("S[i] += A[i,k]", 256, low)
        assert 16**power / 2 < ratio < 16**power * 2
    assert scale("S[i] max= A[i,k]", 300, -1.0) == 0.0
    assert scale("S[i] max= exp(A[i,k])", 300, -1.0) > 0.0


def test_equal_terms_round_alike():
    """`max(A[i], B[i,k] - 3)` is A[i] for every k: adding one value K times in a row rounds the
    same way each time, an error K times one rounding, not sqrt(K) times. The error scale counts
    the equal terms; without that, this correct (unscheduled, sequential) kernel would fail."""
    k = 4096
    expr = build_expr("S[i] += max(A[i], B[i,k] - 3.0)", dict(i=64, k=k))
    inputs = random_inputs(expr, seed=0)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(64, "float32"), dev)
    tvm.compile(tvm.IRModule({"main": expr.func}), target="llvm")["main"](
        *[tvm.runtime.tensor(a, dev) for a in inputs], out
    )
    assert check_output(expr, inputs, out.numpy()).correct
    ref = reference.reference_with_scale(expr, inputs)
    error = np.abs(out.numpy() - ref.value)
    independent = TOLERANCE * np.finfo(np.float32).eps * (ref.scale / np.sqrt(k) + np.abs(ref.value))
    assert np.any(error > independent)


def test_interleaved_equal_terms_keep_the_tolerance_tight():
    """Only runs of equal terms round alike: where A[i] is near 0, `max(A[i], B[i,k])` equals A[i]
    for about half the k, at random places, so the variance grows by about the mean run length
    (~3), not by the group size (~K/2), and a lost term is still far outside the tolerance."""
    k = 4096
    expr = build_expr("S[i] += max(A[i], B[i,k])", dict(i=64, k=k))
    inputs = random_inputs(expr, seed=0)
    ref = reference.reference_with_scale(expr, inputs)
    a, b = (x.astype(np.float64) for x in inputs)
    terms = np.maximum(a[:, None], b)
    distinct = np.sqrt(k / 6 * np.square(terms).sum(1) + k / 3 * np.square(terms.sum(1)))
    middle = np.abs(a) < 0.2
    assert middle.sum() > 5 and np.all(ref.scale[middle] < 2 * distinct[middle])
    lost = ref.value - terms.max(axis=1)
    assert not check_output(expr, inputs, lost.astype(np.float32)).correct
