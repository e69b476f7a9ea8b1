"""Data tiles against a brute-force enumeration of the elements a tile touches.

The index of every tensor is written out by hand below from the operator's definition (padded
coordinates for conv / pool inputs, since the expression reports the tensor it actually reads),
so these tests check both what `from_prim_func` reads off the TVM IR and the span formula of
`data_tile_shape`. Where a dimension's stride exceeds its window (e.g. stride 2 with a window
tile of 1) the touched indices have gaps: fewer distinct elements than the bounding box, and the
bounding box is what a layer stages.
"""

import json
from dataclasses import replace
from math import prod

import numpy as np
import pytest
from helpers import EXPR_FIXTURES, expr, expr_fixtures, plain_matmul
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.ops.catalog import build
from workbench.ops.expr_lang import build_expr
from workbench.ops.fusion import fuse_axes
from workbench.ops.tensor_expr import REDUCE, SPATIAL, KernelArg, TensorExpr


def _matmul(p):
    return (lambda v: (v["i"], v["k"]), lambda v: (v["k"], v["j"]), lambda v: (v["i"], v["j"]))


def _conv2d(p):
    s, d = p["stride"], p["dilation"]
    return (
        lambda v: (v["n"], v["c"], v["h"] * s + v["r"] * d, v["w"] * s + v["s"] * d),
        lambda v: (v["f"], v["c"], v["r"], v["s"]),
        lambda v: (v["n"], v["f"], v["h"], v["w"]),
    )


def _depthwise(p):
    s, m = p["stride"], p["multiplier"]
    j = (lambda v: v["j"]) if m > 1 else (lambda v: 0 * v["n"])
    out = (lambda v: (v["n"], v["c"], v["j"], v["h"], v["w"])) if m > 1 else (lambda v: (v["n"], v["c"], v["h"], v["w"]))
    return (
        lambda v: (v["n"], v["c"], v["h"] * s + v["r"], v["w"] * s + v["s"]),
        lambda v: (v["c"] * m + j(v), 0 * v["n"], v["r"], v["s"]),
        out,
    )


def _pool(p):
    s = p["stride"]
    return (
        lambda v: (v["n"], v["c"], v["h"] * s + v["r"], v["w"] * s + v["s"]),
        lambda v: (v["n"], v["c"], v["h"], v["w"]),
    )


def _reduce(p):
    shape, axes = p["shape"], sorted(p["axes"])
    kept = [d for d in range(len(shape)) if d not in axes]
    name = {d: f"i{n}" for n, d in enumerate(kept)} | {d: f"r{n}" for n, d in enumerate(axes)}
    return (
        lambda v: tuple(v[name[d]] for d in range(len(shape))),
        lambda v: tuple(v[f"i{n}"] for n in range(len(kept))),
    )


def _group_conv2d(p):
    """Output channel f = g * fg + j of group g reads input channels g * cg + c. The expression
    splits f into (f_0, f_1) = (g, j) where there are several groups of several channels."""
    s, d, cg, fg = p["stride"], p["dilation"], p["C"] // p["groups"], p["F"] // p["groups"]

    def f(v):
        return v["f_0"] * fg + v["f_1"] if "f_0" in v else v["f"]

    return (
        lambda v: (v["n"], f(v) // fg * cg + v["c"], v["h"] * s + v["r"] * d, v["w"] * s + v["s"] * d),
        lambda v: (f(v), v["c"], v["r"], v["s"]),
        lambda v: (v["n"], f(v), v["h"], v["w"]),
    )


HAND = {"matmul": _matmul, "conv2d": _conv2d, "group_conv2d": _group_conv2d, "depthwise_conv2d": _depthwise, "avgpool": _pool, "maxpool": _pool, "reduce_sum": _reduce, "reduce_mean": _reduce}

conv_params = st.fixed_dictionaries(
    dict(N=st.integers(1, 2), C=st.integers(1, 3), H=st.integers(5, 10), W=st.integers(5, 10), F=st.integers(1, 3),
         KH=st.integers(1, 3), KW=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 2), dilation=st.integers(1, 2))
)  # fmt: skip
dw_params = st.fixed_dictionaries(
    dict(N=st.integers(1, 2), C=st.integers(1, 3), H=st.integers(5, 10), W=st.integers(5, 10), KH=st.integers(1, 3),
         KW=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 2), multiplier=st.integers(1, 3))
)  # fmt: skip
group_params = st.fixed_dictionaries(
    dict(N=st.integers(1, 2), groups=st.integers(1, 3), cg=st.integers(1, 2), fg=st.integers(1, 3), H=st.integers(5, 8),
         W=st.integers(5, 8), KH=st.integers(1, 3), KW=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
         dilation=st.integers(1, 2))
).map(lambda p: {k: v for k, v in p.items() if k not in ("cg", "fg")} | dict(C=p["groups"] * p["cg"], F=p["groups"] * p["fg"]))  # fmt: skip
pool_params = st.fixed_dictionaries(
    dict(N=st.integers(1, 2), C=st.integers(1, 3), H=st.integers(5, 10), W=st.integers(5, 10), K=st.integers(1, 3),
         stride=st.integers(1, 3), pad=st.integers(0, 1))
)  # fmt: skip
reduce_params = st.lists(st.integers(1, 6), min_size=1, max_size=4).flatmap(
    lambda shape: st.fixed_dictionaries(
        dict(shape=st.just(shape), axes=st.sets(st.integers(0, len(shape) - 1), min_size=1).map(sorted))
    )
)
matmul_params = st.fixed_dictionaries(dict(M=st.integers(1, 20), N=st.integers(1, 20), K=st.integers(1, 20)))

OPERATORS = st.one_of(
    st.tuples(st.just("matmul"), matmul_params),
    st.tuples(st.just("conv2d"), conv_params),
    st.tuples(st.just("group_conv2d"), group_params),
    st.tuples(st.just("depthwise_conv2d"), dw_params),
    st.tuples(st.sampled_from(["avgpool", "maxpool"]), pool_params),
    st.tuples(st.sampled_from(["reduce_sum", "reduce_mean"]), reduce_params),
)


def _hand_index(op, params):
    full = dict(params)
    full.setdefault("dilation", 1)
    full.setdefault("multiplier", 1)
    return HAND[op](full)


def gapless(coeffs, tile) -> bool:
    """Whether `sum(c_a * x_a)` over x_a in [0, t_a) takes every value of its range: adding the
    terms by increasing |c|, each step must not exceed the length already covered."""
    covered = 1
    for c, t in sorted((abs(c), t) for c, t in zip(coeffs, tile) if c and t > 1):
        if c > covered:
            return False
        covered += c * (t - 1)
    return True


def _touched(e, index, tile, origin):
    """Index arrays (one per tensor dim) of every point of the tile, clipped to the extents."""
    ranges = [np.arange(o, min(o + t, a.extent)) for o, t, a in zip(origin, tile, e.axes)]
    grids = np.meshgrid(*ranges, indexing="ij")
    values = {a.name: g.ravel() for a, g in zip(e.axes, grids)}
    return np.stack([np.broadcast_to(ix, values[e.axes[0].name].shape) for ix in index(values)])


@st.composite
def op_tile_origin(draw):
    op, params = draw(OPERATORS)
    e = expr(op, **params)  # sizes chosen so that every window fits its (padded) input
    tile = tuple(draw(st.integers(1, a.extent)) for a in e.axes)
    inside = draw(st.booleans())  # a tile wholly inside the iteration space, or one that may overhang
    origin = tuple(draw(st.integers(0, a.extent - (t if inside else 1))) for t, a in zip(tile, e.axes))
    return op, params, e, tile, origin


@settings(max_examples=120, deadline=None)
@given(op_tile_origin())
def test_data_tiles_match_brute_force(case):
    op, params, e, tile, origin = case
    hand = _hand_index(op, params)
    assert len(hand) == len(e.tensors)
    clipped = any(o + t > a.extent for o, t, a in zip(origin, tile, e.axes))
    for t, (tensor, index) in enumerate(zip(e.tensors, hand)):
        if not tensor.shape:  # a full reduction's scalar output
            assert e.data_tile_shape(t, tile) == ()
            continue
        pts = _touched(e, index, tile, origin)
        assert pts.min() >= 0 and all(pts[d].max() < n for d, n in enumerate(tensor.shape)), "index outside the tensor"
        bbox = tuple(int(pts[d].max() - pts[d].min() + 1) for d in range(len(tensor.shape)))
        shape = e.data_tile_shape(t, tile)
        if clipped:
            assert all(b <= s for b, s in zip(bbox, shape))
            continue
        assert bbox == shape, (tensor.name, tile, origin)
        distinct = len(np.unique(pts, axis=1).T)
        if all(gapless(coeffs, tile) for coeffs, _ in tensor.index):
            assert distinct == prod(shape)
        else:  # a stride larger than the window: holes inside the staged bounding box
            assert distinct < prod(shape)


@settings(max_examples=60, deadline=None)
@given(op_tile_origin(), st.randoms(use_true_random=False))
def test_affine_index_maps_equal_the_operator_definition(case, rnd):
    op, params, e, _, _ = case
    hand = _hand_index(op, params)
    for _ in range(5):
        point = [rnd.randrange(a.extent) for a in e.axes]
        values = {a.name: np.array([x]) for a, x in zip(e.axes, point)}
        for tensor, index in zip(e.tensors, hand):
            read = tuple(sum(c * x for c, x in zip(coeffs, point)) + const for coeffs, const in tensor.index)
            assert read == tuple(int(np.asarray(v).ravel()[0]) for v in index(values))


def test_conv_data_tile_is_the_strided_dilated_window():
    e = expr("conv2d", N=1, C=4, H=20, W=20, F=8, KH=3, KW=3, stride=2, pad=1, dilation=2)
    names = [a.name for a in e.axes]
    assert names == ["n", "f", "h", "w", "c", "r", "s"]
    tile = (1, 2, 3, 4, 2, 3, 2)
    # rows: (th - 1) * stride + (tr - 1) * dilation + 1, columns likewise
    assert e.data_tile_shape(0, tile) == (1, 2, (3 - 1) * 2 + (3 - 1) * 2 + 1, (4 - 1) * 2 + (2 - 1) * 2 + 1)
    assert e.data_tile_shape(1, tile) == (2, 2, 3, 2)
    assert e.data_tile_shape(2, tile) == (1, 2, 3, 4)
    assert e.tensors[0].shape == (1, 4, 22, 22)  # the padded input the main block reads


def test_data_tile_is_clipped_to_the_tensor():
    e = expr("matmul", M=8, N=8, K=8)
    assert e.data_tile_shape(0, (16, 16, 16)) == (8, 8)


def test_axes_kinds_and_tensor_roles():
    e = expr("conv2d", N=1, C=2, H=6, W=6, F=3, KH=3, KW=3, stride=1, pad=0)
    assert [a.kind for a in e.axes] == [SPATIAL] * 4 + [REDUCE] * 3
    assert e.spatial == (0, 1, 2, 3) and e.reduce == (4, 5, 6)
    assert [t.role for t in e.tensors] == ["input", "input", "output"]
    assert e.inputs == e.tensors[:2] and e.output is e.tensors[2]
    assert e.axis_index("r") == 5
    with pytest.raises(KeyError):
        e.axis_index("zz")
    assert e.flops == 2 * 1 * 3 * 4 * 4 * 2 * 3 * 3
    # whole tensors' bytes: the padded 1 x 2 x 6 x 6 data, 3 x 2 x 3 x 3 filters, 1 x 3 x 4 x 4 out
    assert [t.nbytes for t in e.tensors] == [72 * 4, 54 * 4, 48 * 4]
    assert expr("matmul", M=3, N=5, K=7, dtype="float64").inputs[1].nbytes == 7 * 5 * 8


def test_batched_transposed_matmul_reads_the_transposed_layout():
    e = expr("matmul", M=5, N=6, K=7, B=2, trans_a=True, trans_b=True)
    assert [a.name for a in e.axes] == ["b", "i", "j", "k"]
    tile = (1, 2, 3, 4)
    assert e.data_tile_shape(0, tile) == (1, 4, 2)  # A is [B, K, M]
    assert e.data_tile_shape(1, tile) == (1, 3, 4)  # B is [B, N, K]
    assert e.data_tile_shape(2, tile) == (1, 2, 3)


def test_expressions_compare_by_value():
    a = expr("matmul", M=4, N=4, K=4)
    b = build("matmul", dict(M=4, N=4, K=4))
    assert a == b and hash(a) == hash(b) and a.func is not b.func


def test_to_dict_round_trips_every_field_but_the_prim_func():
    e = expr("conv2d", N=1, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=2, pad=1)
    back = TensorExpr.from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e and back.func is None
    assert back.args == e.args and back.args[0].shape == (1, 3, 9, 9)


def test_an_epilogues_flops_are_counted_apart_from_the_main_blocks():
    """TVM counts the flops of every block (`flops`); the blocks after the main block are
    `epilogue_flops` (a pooling's division, a mean's), so `main_flops` is the window's or the
    row's sums alone; an operator of one block has none."""
    pool = expr("avgpool", N=1, C=8, H=14, W=14, K=3, stride=2, pad=1)
    outputs = prod(pool.output.shape)
    assert pool.epilogues and pool.epilogue_flops == outputs  # one division an output
    assert pool.main_flops == 9 * outputs == pool.flops - outputs  # nine adds a window
    mean = expr("reduce_mean", shape=(256, 4096), axes=(1,))
    assert (mean.epilogue_flops, mean.main_flops) == (256, 256 * 4096)
    mm = expr("matmul", M=5, N=6, K=7)
    assert (mm.epilogue_flops, mm.main_flops) == (0, mm.flops) == (0, 2 * 5 * 6 * 7)


def _args(e):
    return [(a.name, a.shape, a.dtype, a.role) for a in e.args]


def test_arguments_of_a_padded_conv_are_unpadded_in_call_order():
    e = expr("conv2d", N=1, C=3, H=8, W=8, F=4, KH=3, KW=3, stride=1, pad=1)
    assert _args(e) == [
        ("data", (1, 3, 8, 8), "float32", "input"),
        ("kernel", (4, 3, 3, 3), "float32", "input"),
        ("O", (1, 4, 8, 8), "float32", "output"),
    ]
    assert e.tensors[0].shape == (1, 3, 10, 10)  # what the main block reads: the padded input


def test_arguments_of_an_expression_follow_first_appearance():
    e = build_expr("Y[i, j] = B[j] * A[i, j + 2]", dict(i=3, j=4), "float16")
    assert _args(e) == [("B", (4,), "float16", "input"), ("A", (3, 6), "float16", "input"), ("Y", (3, 4), "float16", "output")]


def test_arguments_of_a_transposed_catalog_matmul():
    e = expr("matmul", M=5, N=6, K=7, trans_a=True)
    assert e.args == (
        KernelArg("A", (7, 5), "float32", "input"), KernelArg("B", (7, 6), "float32", "input"), KernelArg("C", (5, 6), "float32", "output"),
    )


def test_arguments_survive_axis_fusion_and_the_dict_form():
    e = expr("relu", shape=(17, 11, 3))
    fused = fuse_axes(e)
    assert fused.extents == (561,) and fused.tensors[0].shape == (561,)  # fusion reshaped the accesses
    assert _args(fused) == [("X", (17, 11, 3), "float32", "input"), ("Y", (17, 11, 3), "float32", "output")]
    back = TensorExpr.from_dict(json.loads(json.dumps(fused.to_dict())))
    assert back == fused and back.args == e.args


def test_the_fast_lane_fixtures_equal_fresh_tvm_builds():
    """tests/fixtures/tensor_exprs.json stands in for TVM in `make test-fast`; a fixture that no
    longer matches what the catalog builds would make the fast lane test a stale operator."""
    fixtures = expr_fixtures()
    assert fixtures, f"{EXPR_FIXTURES} is missing: run `make fixtures`"
    for key, stored in fixtures.items():
        op, dtype, params = json.loads(key)
        built = build(op, {k: v for k, v in params}, dtype)
        assert built.to_dict() == stored, f"{key}: the fixture is stale, run `make fixtures`"


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (64, 48, 32), (257, 127, 509)])
def test_the_plain_matmul_of_the_fast_lane_is_the_catalogs(m, n, k):
    assert plain_matmul(m, n, k) == build("matmul", {"M": m, "N": n, "K": k}, "float32")


def _layout(shape_in, shape_out, index):
    """A copy kernel Y[out] = X[index(out)] read through `from_te`."""
    from tvm import te

    from workbench.ops.tensor_expr import from_te

    x = te.placeholder(shape_in, name="X")
    y = te.compute(shape_out, lambda *out: x[index(*out)], name="Y")
    return from_te("layout", {}, [x], y, "float32")


def _reads_as_defined(e, index):
    """At every point of the iteration space, the affine maps of X and Y give the element the
    definition copies: Y[out] = X[index(out)], with out rebuilt from the split digits."""
    grids = np.meshgrid(*[np.arange(a.extent) for a in e.axes], indexing="ij")
    point = np.stack([g.ravel() for g in grids])
    x, y = ([np.array(coeffs) @ point + const for coeffs, const in t.index] for t in e.tensors)
    want = index(*y)
    assert all(np.array_equal(np.broadcast_to(w, got.shape), got) for w, got in zip(want, x))
    assert len({tuple(p) for p in np.stack(y).T}) == point.shape[1]  # every output element once


def test_a_channel_shuffle_splits_the_channel_at_the_group_count():
    # ShuffleNet's reshape [1, 3, 4, h, w] -> transpose -> reshape: output channel c reads c % 3 * 4 + c // 3
    shuffle = lambda n, c, h, w: (n, c % 3 * 4 + c // 3, h, w)  # noqa: E731
    e = _layout((1, 12, 4, 4), (1, 12, 4, 4), shuffle)
    assert [(a.name, a.extent) for a in e.axes] == [("i0", 1), ("i1_0", 4), ("i1_1", 3), ("i2", 4), ("i3", 4)]
    assert e.tensors[0].index[1] == ((0, 1, 4, 0, 0), 0) and e.output.index[1] == ((0, 3, 1, 0, 0), 0)
    _reads_as_defined(e, shuffle)


def test_a_flatten_splits_the_flat_index_into_the_dimensions_it_flattens():
    flatten = lambda i, j: (i, j // 20, j % 20 // 5, j % 5)  # noqa: E731
    e = _layout((2, 3, 4, 5), (2, 60), flatten)
    assert [(a.name, a.extent, a.kind) for a in e.axes] == [("i0", 2, SPATIAL), ("i1_0", 3, SPATIAL), ("i1_1", 4, SPATIAL), ("i1_2", 5, SPATIAL)]
    assert e.output.index == (((1, 0, 0, 0), 0), ((0, 20, 5, 1), 0))
    _reads_as_defined(e, flatten)


def test_a_reshape_that_merges_and_resplits_is_split_in_two_rounds():
    """[4, 8, 8] -> [8, 32]: output (i, j) reads flat element 32 i + j. Splitting j at 8 leaves
    `(4 i + j_0) // 8` = i // 2, a division of i alone, split in the next round."""
    merge = lambda i, j: ((i * 32 + j) // 64, (i * 32 + j) % 64 // 8, j % 8)  # noqa: E731
    e = _layout((4, 8, 8), (8, 32), merge)
    assert [(a.name, a.extent) for a in e.axes] == [("i0_0", 4), ("i0_1", 2), ("i1_0", 4), ("i1_1", 8)]
    _reads_as_defined(e, merge)


@pytest.mark.parametrize(
    "shape_in, shape_out, index",
    [
        # 3 and 4 do not divide each other: no split makes both i // 3 and i % 4 affine
        ((4, 4), (12,), lambda i: (i // 3, i % 4)),
        # [3, 4] -> [2, 6]: rows of 6 straddle rows of 4, no digit of i or j is one of the input's
        ((3, 4), (2, 6), lambda i, j: ((i * 6 + j) // 4, (i * 6 + j) % 4)),
    ],
)
def test_divisions_no_split_makes_affine_are_refused_by_name(shape_in, shape_out, index):
    from workbench.errors import UserError

    with pytest.raises(UserError, match="is not affine in the loop axes"):
        _layout(shape_in, shape_out, index)


def test_a_dimension_of_one_read_at_zero_is_read_at_a_unit_axis_where_every_input_is_reused():
    """`A[0, i, k]` under a batch of one (how a model's lowering broadcasts a batched projection's
    activations) reads the element `A[b, i, k]` reads for the only b, 0; read so, A is a
    projection that the CPU template packs into panels. Not where no spatial axis of extent 1
    is left (a batch of 3), nor where some input is read at every output (a window's image)."""
    extents = dict(b=1, i=7, j=9, k=5)
    e = build_expr("C[b,i,j] += A[0,i,k] * B[k,j]", extents)
    assert e.inputs[0].index == build_expr("C[b,i,j] += A[b,i,k] * B[k,j]", extents).inputs[0].index
    assert e.inputs[0].index[0] == ((1, 0, 0, 0), 0) and e.inputs[0].shape == (1, 7, 5)
    three = build_expr("C[b,i,j] += A[0,i,k] * B[k,j]", dict(extents, b=3))
    assert three.inputs[0].index[0] == ((0, 0, 0, 0), 0)
    window = build_expr("C[b,c,h] += X[b,c,h+r] * W[c,0,r]", dict(b=1, c=4, h=6, r=3))
    assert window.inputs[1].index[1] == ((0, 0, 0, 0), 0)


def test_an_argument_the_main_block_does_not_read_counts_as_the_epilogues_by_its_dtypes_width():
    """`epilogue_input_bytes`: the inputs among the kernel's arguments that the main block does
    not read, each at its dtype's width, an int64 one's from its name as well; the output is
    not one of them."""
    e = plain_matmul(8, 16, 4)
    assert e.epilogue_input_bytes == 0
    extra = (KernelArg("bias", (16,), "float32", "input"), KernelArg("index", (8, 2), "int64", "input"),
             KernelArg("mask", (8, 16), "bool", "input"))
    assert replace(e, args=e.args[:-1] + extra + e.args[-1:]).epilogue_input_bytes == 16 * 4 + 16 * 8 + 8 * 16
