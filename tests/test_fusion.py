"""Axis fusion (Roller §3.2): which neighbouring axes merge, and what the fused expression says."""

from math import prod

from helpers import expr, matmul
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.ops.expr_lang import build_expr
from workbench.ops.fusion import fuse_axes
from workbench.ops.tensor_expr import REDUCE, SPATIAL


def test_elementwise_17_11_3_becomes_one_axis_of_561():
    fused = fuse_axes(expr("relu", shape=(17, 11, 3)))
    assert [(a.extent, a.kind) for a in fused.axes] == [(561, SPATIAL)]
    assert fused.axes[0].fused_from == ("i0", "i1", "i2")
    for tensor in fused.tensors:
        assert tensor.shape == (561,)
        assert tensor.index == (((1,), 0),)
    assert fused.data_tile_shape(0, (64,)) == (64,)


def test_matmul_is_not_fused():
    for e in (matmul(64, 48, 32), expr("matmul", M=8, N=8, K=8, B=4)):
        assert fuse_axes(e) == e


def test_a_matmuls_batch_stays_apart_where_every_input_is_reused():
    """A batch over a weight read without it, as an ONNX model's [B, 77, 300] x [300, 300]
    lowers. A batch of one stays apart: fused into the rows it would change no extent and
    would keep the CPU template from packing panels (`rtile.panels` refuses fused axes). For
    that template (`panels`) a batch of three stays apart too, a register tile spanning rows of
    several batches (3 x 37 x 333 x 517 with a bias and a ReLU ran 124 us fused, 92 apart; ONNX
    Runtime 113), while axes only the output reads fuse; elsewhere it fuses (231 rows). The unit
    axes of an elementwise operator fuse, and so do those of a mean (which ignores only its unit
    axes: no input is reused) and of a matrix-vector product (the matrix ignores only the
    vector's unit rows)."""
    one = build_expr("C[b,i,j] += A[b,i,k] * B[k,j]", dict(b=1, i=77, j=300, k=300))
    assert fuse_axes(one) == one == fuse_axes(one, panels=True)
    three = build_expr("C[b,i,j] += A[b,i,k] * B[k,j]", dict(b=3, i=77, j=300, k=300))
    assert fuse_axes(three, panels=True) == three
    assert [(a.extent, a.fused_from) for a in fuse_axes(three).axes] == [(231, ("b", "i")), (300, ()), (300, ())]
    outer = fuse_axes(build_expr("C[x,y,j] += A[k] * B[k,j]", dict(x=5, y=7, j=300, k=30)), panels=True)
    assert [(a.extent, a.fused_from) for a in outer.axes] == [(35, ("x", "y")), (300, ()), (30, ())]
    relu = fuse_axes(expr("relu", shape=(1, 7, 3)))
    assert [(a.extent, a.fused_from) for a in relu.axes] == [(21, ("i0", "i1", "i2"))]
    mean = fuse_axes(build_expr("C[b,c,x,y] += A[b,c,h,w]", dict(b=1, c=32, x=1, y=1, h=7, w=7)))
    assert [(a.extent, a.fused_from) for a in mean.axes] == [(32, ("b", "c")), (1, ("x", "y")), (49, ("h", "w"))]
    gemv = fuse_axes(build_expr("C[b,i,j] += A[b,i,k] * B[k,j]", dict(b=1, i=1, j=300, k=300)))
    assert [(a.extent, a.fused_from) for a in gemv.axes] == [(1, ("b", "i")), (300, ()), (300, ())]


def test_reduce_over_the_last_axis_fuses_the_kept_axes_only():
    fused = fuse_axes(expr("reduce_sum", shape=(7, 5, 1001), axes=(2,)))
    assert [(a.extent, a.kind) for a in fused.axes] == [(35, SPATIAL), (1001, REDUCE)]
    assert fused.axes[0].fused_from == ("i0", "i1") and fused.axes[1].fused_from == ()
    x, y = fused.tensors
    assert x.shape == (35, 1001) and y.shape == (35,)
    assert x.index == (((1, 0), 0), ((0, 1), 0)) and y.index == (((1, 0), 0),)


def test_reduce_over_a_middle_axis_fuses_nothing():
    e = expr("reduce_sum", shape=(7, 5, 11), axes=(1,))
    # X is [i0, r0, i1]: i0 and i1 are neighbours in the loop order but not in X.
    assert fuse_axes(e) == e


def test_pool_fuses_batch_and_channels_but_not_the_window():
    fused = fuse_axes(expr("avgpool", N=2, C=3, H=9, W=9, K=3, stride=2, pad=1))
    assert [a.name for a in fused.axes] == ["nc", "h", "w", "r", "s"]
    assert fused.axes[0].extent == 6 and fused.axes[0].fused_from == ("n", "c")
    assert fused.tensors[0].shape == (6, 11, 11)


def test_conv_is_not_fused():
    e = expr("conv2d", N=2, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=1, pad=0)
    assert fuse_axes(e) == e


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.data())
def test_fusion_preserves_the_iteration_space(shape, data):
    op = data.draw(st.sampled_from(["relu", "reduce_sum"]))
    params = dict(shape=shape)
    if op == "reduce_sum":
        params["axes"] = data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1).map(sorted))
    e = expr(op, **params)
    fused = fuse_axes(e)
    assert fuse_axes(fused) == fused  # a canonical form: nothing left to fuse
    assert prod(fused.extents) == prod(e.extents) and fused.flops == e.flops
    for kind in (SPATIAL, REDUCE):
        assert prod(a.extent for a in fused.axes if a.kind == kind) == prod(a.extent for a in e.axes if a.kind == kind)
    originals = [n for a in fused.axes for n in (a.fused_from or (a.name,))]
    assert originals == [a.name for a in e.axes]  # fused_from keeps the loop order, outermost first
    for t, f in zip(e.tensors, fused.tensors):
        assert prod(t.shape) == prod(f.shape)
        assert f.name == t.name and f.role == t.role
    # a whole-space tile touches every element, before and after fusion
    for t in range(len(e.tensors)):
        assert prod(fused.data_tile_shape(t, fused.extents)) == prod(e.data_tile_shape(t, e.extents))
