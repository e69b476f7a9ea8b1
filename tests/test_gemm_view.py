"""The implicit-GEMM view of a conv (`ops.gemm_view`): which operators have one, its extents and
virtual tensors in closed form, and where the construction uses it (GPUs only)."""

from __future__ import annotations

from math import prod

import pytest
from helpers import device, expr, suite_workloads, workload_expr

from workbench.construct.stepper import Stepper, construct
from workbench.ops.gemm_view import construction_expr, gemm_view, view_of
from workbench.rtile.axes import cross_thread_axis, mma_axes

CONV = dict(N=2, C=8, H=10, W=10, F=16, KH=3, KW=3, stride=2, pad=1)  # OH = OW = (10 + 2 - 3) // 2 + 1 = 5


def test_a_conv_is_m_pixels_by_n_filters_by_k_window_elements():
    view = gemm_view(expr("conv2d", **CONV))
    assert (view.m, view.n, view.k) == (("n", "h", "w"), ("f",), ("c", "r", "s"))
    # M = N * OH * OW, N = F, K = C * KH * KW
    assert view.expr.extents == (2 * 5 * 5, 16, 8 * 3 * 3)
    assert [a.kind for a in view.expr.axes] == ["spatial", "spatial", "reduce"]
    assert [a.fused_from for a in view.expr.axes] == [("n", "h", "w"), (), ("c", "r", "s")]
    assert view.expr.flops == expr("conv2d", **CONV).flops == 2 * 50 * 16 * 72
    a, b, out = view.expr.tensors
    assert (a.name, a.shape, b.name, b.shape, out.shape) == ("data", (50, 72), "kernel", (72, 16), (50, 16))


def test_the_a_tile_is_an_im2col_tile_of_bm_by_bk_elements():
    """The model's data tiles in the view: BM x BK of A whatever the window (halo elements
    counted once per use), BK x BN of B, BM x BN of the output."""
    view = gemm_view(expr("conv2d", **CONV))
    bm, bn, bk = 16, 8, 24
    assert [view.expr.data_tile_shape(t, (bm, bn, bk)) for t in range(3)] == [(bm, bk), (bk, bn), (bm, bn)]


def test_traffic_and_footprint_of_the_view_are_the_gemms():
    """Q(T) over (BM, BN, BK) = M/BM x N/BN x K/BK tiles each loading BM x BK of A and BK x BN of
    B, plus M x N outputs stored once (4 B each, float32); F(T) the three tiles. The direct nest
    counted A as the halo box of the window instead."""
    from workbench.rtile.traffic import calculus

    calc = calculus(gemm_view(expr("conv2d", **CONV)).expr)
    bm, bn, bk = 10, 8, 24  # M, N, K = 50, 16, 72: 5 x 2 x 3 tiles
    assert calc.traffic_bytes((bm, bn, bk)) == 4 * (5 * 2 * 3 * (bm * bk + bk * bn) + 50 * 16)
    assert calc.footprint_bytes((bm, bn, bk)) == 4 * (bm * bk + bk * bn + bm * bn)


def test_dilation_and_unpadded_windows_have_the_same_view():
    view = gemm_view(expr("conv2d", **{**CONV, "dilation": 2, "pad": 0}))  # OH = (10 - 5) // 2 + 1 = 3
    assert view.expr.extents == (2 * 3 * 3, 16, 72)


@pytest.mark.parametrize(
    "op, params",
    [
        ("depthwise_conv2d", dict(N=1, C=8, H=10, W=10, KH=3, KW=3, stride=1, pad=1, multiplier=1)),
        ("group_conv2d", dict(N=1, C=8, H=10, W=10, F=8, KH=3, KW=3, stride=1, pad=1, groups=2)),
        ("maxpool", dict(N=1, C=8, H=10, W=10, K=3, stride=1, pad=1)),
        ("avgpool", dict(N=1, C=8, H=10, W=10, K=3, stride=1, pad=1)),
        ("matmul", dict(M=8, N=8, K=8)),
    ],
)
def test_operators_that_are_no_implicit_gemm_have_no_view(op, params):
    """Depthwise and grouped convs batch over a channel both inputs read (no channel
    reduction), pools have one input, a matmul needs no view."""
    assert gemm_view(expr(op, **params)) is None


def test_a_max_combiner_is_no_gemm_and_a_sum_is():
    from workbench.ops.expr_lang import build_expr

    extents = dict(n=2, f=8, h=6, w=6, c=4, r=3, s=3)
    assert gemm_view(build_expr("O[n,f,h,w] += X[n,c,h+r,w+s] * K[f,c,r,s]", extents)).expr.extents == (72, 8, 36)
    assert gemm_view(build_expr("O[n,f,h,w] max= X[n,c,h+r,w+s] * K[f,c,r,s]", extents)) is None


def test_the_construction_tiles_the_view_on_gpus_only():
    conv = expr("conv2d", **CONV)
    assert construction_expr(conv, device("tiny-cpu")) is conv
    assert construction_expr(conv, device("v100")).extents == (50, 16, 72)
    # tensor-core dtypes keep the direct nest: the view would be priced as an MMA contraction
    half = expr("conv2d", "float16", **CONV)
    assert mma_axes(gemm_view(half).expr, device("h100")) is not None
    assert construction_expr(half, device("h100")) is half


def test_the_view_spreads_threads_over_outputs_not_the_reduction():
    """B is [K, N] (n contiguous, as a row-major GEMM's B): k alone is not every input's
    contiguous dimension, so the view is no cross-thread reduction."""
    assert cross_thread_axis(gemm_view(expr("conv2d", **CONV)).expr, device("v100")) is None


def test_the_stepper_says_why_the_axes_changed():
    stepper = Stepper(expr("conv2d", **CONV), device("v100"))
    assert stepper.space.expr.extents == (50, 16, 72)
    assert "implicit GEMM" in stepper.next().note


def test_a_view_is_recognised_from_its_primfunc():
    conv = expr("conv2d", **CONV)
    view = gemm_view(conv)
    assert view_of(view.expr) == view
    assert view_of(conv) is None


@pytest.mark.parametrize("gpu", ("v100", "a100", "h100"))
@pytest.mark.parametrize("wid", ("C0", "C1", "C2"))
def test_table1_convs_are_tiled_as_gemms_without_padding(gpu, wid):
    """roller-table1's convs: top-1 tiles (M, N, K), its padded FLOPs within 5% of the useful."""
    workload = next(w for w in suite_workloads("roller-table1") if w["id"] == wid)
    built = construct(workload_expr(workload), device(gpu))
    assert [a.name for a in built.expr.axes] == ["nhw", "f", "crs"]
    top = built.candidates[0]
    padded = prod(-(-x // t) * t for x, t in zip(built.expr.extents, top.program.unit_tile))
    assert padded / prod(built.expr.extents) <= 1.05
    assert top.estimate.padded_flops <= 1.05 * top.estimate.flops
