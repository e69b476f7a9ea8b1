"""A conv of few channels as the GEMM over its pixels of its gathered windows (`ops.window_gemm`):
when the view is taken, the view and the rewritten PrimFunc it carries, the kernel that takes the
caller's buffers, the gather's price, and what the stepper and the export say."""

import pytest
from test_alignment import AVX2, AVX512

from tests.helpers import built_view_kernels, device
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper, ViewChoice, construct, construction_view
from workbench.ops.gemm_view import construction_expr, view_alternative
from workbench.ops.pixel_gemm import pixel_gemm
from workbench.ops.tensor_expr import from_prim_func
from workbench.ops.window_gemm import (
    MAX_COPIES_PER_OUTPUT, MAX_PRICED_REDUCTION, MAX_WINDOW_REDUCTION, is_window_view, window_gemm,
)
from workbench.rtile.panels import gathered_inputs, padded_inputs
from workbench.rtile.plan import PANELS, cpu_plan
from workbench.workload import Workload


def _conv(n=1, c=5, h=13, w=11, f=24, k=3, stride=1, pad=1, dilation=1):
    params = {"N": n, "C": c, "H": h, "W": w, "F": f, "KH": k, "KW": k, "stride": stride, "pad": pad,
              "dilation": dilation}
    return Workload(op="conv2d", params=tuple(params.items())).build()


@pytest.mark.parametrize("n,pad", [(1, 1), (2, 0)])
def test_a_few_channel_conv_is_the_gemm_over_its_gathered_windows(n, pad):
    """(n, f, p, k): the window's 5 x 3 x 3 one reduce axis, the 13 x 11 pixels (or 11 x 9
    without the border) one spatial axis; the image read as its copy (n, k, p) under the
    argument's name, gathered and not padded (the border is inside the copy)."""
    e = _conv(n=n, pad=pad)
    view = window_gemm(e)
    oh, ow = (13, 11) if pad else (11, 9)
    assert [(a.name, a.extent, a.kind) for a in view.axes] == [
        ("n", n, "spatial"), ("f", 24, "spatial"), ("p", oh * ow, "spatial"), ("k", 45, "reduce")]
    assert [t.shape for t in view.tensors] == [(n, 45, oh * ow), (24, 45), (n, 24, oh * ow)]
    assert gathered_inputs(view) == ("data",) and padded_inputs(view) == () and is_window_view(view)
    # the pure view is what TVM reads off the rewritten function, and the caller's buffers stay
    read = from_prim_func(view.func, e.op, dict(e.params), e.dtype, n_inputs=2)
    assert (read.axes, read.tensors, read.flops) == (view.axes, view.tensors, e.flops)
    assert view.args == e.args and [a.shape for a in e.args] == [(n, 5, 13, 11), (24, 5, 3, 3), (n, 24, oh, ow)]


@pytest.mark.parametrize("params, why", [
    ({"stride": 2}, "a strided copy reads an element a load"),
    ({"c": 8}, "72 multiply-adds per output"),
    ({"k": 5, "pad": 2}, "125 multiply-adds per output"),
    ({"f": 22}, "45 copied values for 22 filters: more than two an output"),
    ({"k": 1, "pad": 0}, "a pointwise conv: ops.pixel_gemm's"),
])
def test_the_rule_takes_no_other_conv(params, why):
    """Outside the limits the view is not taken outright (beyond them, up to 512 per output, it
    is priced against the nest: below)."""
    assert window_gemm(_conv(**params)) is None, why


def test_an_input_of_fewer_dimensions_than_a_window_is_no_conv():
    """Three reduce axes, but a kernel of one dimension (a draw of tests/test_invariants.py's
    expressions once reached `plain_dim` past its end): no view, no error."""
    from dataclasses import replace

    e = _conv()
    kernel = e.inputs[1]
    c = e.reduce[0]
    flat = replace(kernel, shape=(5,), index=((tuple(int(a == c) for a in range(len(e.axes))), 0),))
    assert window_gemm(replace(e, tensors=(e.inputs[0], flat, e.output), func=None)) is None


def test_the_limits_are_the_documented_ones():
    """At the edge of both limits (7 x 3 x 3 = 63 per output, 32 filters: 1.97 an output) the view
    is taken; a filter fewer than half the window, or a channel more, and it is not."""
    assert (MAX_WINDOW_REDUCTION, MAX_COPIES_PER_OUTPUT) == (64, 2)
    assert window_gemm(_conv(c=7, f=32)) is not None
    assert window_gemm(_conv(c=7, f=31)) is None  # 63 > 2 x 31
    assert window_gemm(_conv(c=4, k=4, pad=1, f=32)) is not None  # 64
    assert window_gemm(_conv(c=5, k=4, pad=1, f=40)) is None  # 80


@pytest.mark.parametrize("params, priced", [
    ({"c": 8, "f": 36}, True),  # 72 per output, two copied values an output
    ({"c": 56, "f": 252}, True),  # 504, two an output
    ({"c": 8}, False),  # 72 copied values for 24 filters: three an output
    ({"f": 22}, False),  # 45 for 22 filters: within MAX_WINDOW_REDUCTION, but more than two an output
    ({"c": 56, "f": 8}, False),  # 504, seven an output
    ({"c": 57, "f": 300}, False),  # 513: above MAX_PRICED_REDUCTION
    ({"c": 8, "stride": 2}, False),  # a strided copy
    ({}, False),  # within the limits: the view, taken outright
    ({"k": 1, "pad": 0}, False),  # a pointwise conv: ops.pixel_gemm's
])
def test_beyond_the_limits_the_view_is_priced_against_the_nest_up_to_512(params, priced):
    """`window_gemm(priced=True)`: the view of a stride-1 conv beyond MAX_WINDOW_REDUCTION, up to
    MAX_PRICED_REDUCTION multiply-adds and MAX_COPIES_PER_OUTPUT copied values per output (more
    copies keep the nest, priced or not); `view_alternative` offers it on a CPU only."""
    assert MAX_PRICED_REDUCTION == 512
    e = _conv(**params)
    view = window_gemm(e, priced=True)
    assert (view is not None) == priced
    if priced:
        assert window_gemm(e) is None and is_window_view(view)
        assert view_alternative(e, device("local-cpu")).axes == view.axes
        assert view_alternative(e, device("v100")) is None


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("params", [{"c": 11, "f": 50, "h": 29, "w": 31}, {"c": 8, "f": 40, "h": 41, "w": 23}],
                         ids=["99-per-output", "72-for-40-filters"])
def test_the_construction_tiles_whichever_of_nest_and_view_rank_1_is_priced_faster(dev, params):
    """Both prices are Roller's rank 1 over each expression; the one tiled is the faster, the
    choice the same on a second call, and a construction says it in its first step."""
    e = _conv(**params)
    nest, view = construction_expr(e, dev), window_gemm(e, priced=True)
    prices = [Stepper(e, dev, options=Options(topk=1), view=ViewChoice(x)).finish().candidates[0].predicted_seconds
              for x in (nest, view)]
    choice = construction_view(e, dev)
    assert (choice.nest_seconds, choice.view_seconds) == tuple(prices)
    assert choice.expr == (view if prices[1] < prices[0] else nest)
    assert construction_view(e, dev) == choice
    # remembered by value: an equal expression gets the same choice, and a kept nest is its own
    # object (the stepper tells a view by identity)
    from dataclasses import replace

    copy = replace(e)
    again = construction_view(copy, dev)
    assert again == choice and (again.expr is copy) == (prices[1] >= prices[0])
    c = construct(e, dev, options=Options(topk=2))
    assert c.view == choice and is_window_view(c.expr) == (prices[1] < prices[0])
    if is_window_view(c.expr):
        assert "priced as the GEMM over its gathered windows" in Stepper(e, dev).next().note


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("topk", [1, 5, 10])
def test_the_construction_takes_the_search_that_priced_its_view(dev, topk, monkeypatch):
    """Roller's rank 1 over each view is two searches; the construction that follows takes the
    search of the one it tiles instead of a third, with the steps and top K a fresh search gives
    (any K up to the ten-program floor searches alike). Another policy, or K above the floor,
    searches afresh."""
    from workbench.construct import stepper
    from workbench.construct.roller import RollerPolicy

    e = _conv(c=11, f=50, h=29, w=31)
    searches = []
    original = RollerPolicy.steps
    monkeypatch.setattr(RollerPolicy, "steps", lambda self: searches.append(1) or original(self))
    monkeypatch.setattr(stepper, "_PRICED", {})
    monkeypatch.setattr(stepper, "_SEARCHED", {})
    taken = construct(e, dev, options=Options(topk=topk))
    assert len(searches) == 2
    fresh = Stepper(e, dev, options=Options(topk=topk), view=taken.view).finish()
    assert len(searches) == 3
    assert [c.actions for c in taken.candidates] == [c.actions for c in fresh.candidates]
    assert len(taken.candidates) == topk and taken.steps == fresh.steps and taken.graph.nodes == fresh.graph.nodes
    assert [c.predicted_seconds for c in taken.candidates] == [c.predicted_seconds for c in fresh.candidates]
    construct(e, dev, options=Options(topk=topk))  # priced before, its search taken once: afresh
    assert len(searches) == 4
    stepper._SEARCHED.clear()
    stepper._PRICED.clear()
    construct(e, dev, options=Options(topk=12))
    assert len(searches) == 7


def test_a_priced_view_builds_and_matches_numpy():
    """A conv beyond the limits (11 x 3 x 3 = 99 per output, 50 filters) as the view, whatever
    the local CPU's model chooses: its top 2 built and verified."""
    from workbench.codegen.build import build_kernel
    from workbench.codegen.verify import verify

    e = _conv(c=11, f=50, h=29, w=31)
    dev = device("local-cpu")
    view = ViewChoice(window_gemm(e, priced=True))
    for cand in Stepper(e, dev, options=Options(topk=2), view=view).finish().candidates:
        kernel = build_kernel(cand.program.expr, cand.program, dev)
        assert kernel.ok, kernel.error
        assert verify(kernel, cand.program.expr).correct


def test_a_dilated_window_is_gathered_alike():
    view = window_gemm(_conv(dilation=2, pad=2))
    assert view is not None and view.tensors[0].shape == (1, 45, 13 * 11)


@pytest.mark.parametrize("channels, filters, taken", [(6, 32, True), (12, 24, False)])
def test_a_grouped_conv_is_viewed_per_group(channels, filters, taken):
    """After `ops.group_view` the groups are a dimension of every tensor; a copied value serves
    the filters of its group only (2 groups: 3 x 3 x 3 = 27 for 16 filters, taken; 3 groups: 36
    for 8, more than two an output, not)."""
    groups = 2 if taken else 3
    params = {"N": 1, "C": channels, "H": 13, "W": 11, "F": filters, "KH": 3, "KW": 3, "stride": 1, "pad": 1,
              "groups": groups}
    e = Workload(op="group_conv2d", params=tuple(params.items())).build()
    view = construction_expr(e, device("local-cpu"))
    assert is_window_view(view) == taken
    if taken:
        assert [t.shape for t in view.tensors] == [(1, 2, 27, 143), (2, 16, 27), (1, 2, 16, 143)]
        assert len(built_view_kernels(e)) == 3


def test_the_view_is_the_cpus_and_the_gpu_keeps_its_implicit_gemm():
    e = _conv()
    assert construction_expr(e, device("local-cpu")).axes == window_gemm(e).axes
    assert [a.name for a in construction_expr(e, device("v100")).axes] == ["nhw", "f", "crs"]
    assert pixel_gemm(e) is None


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_windows_are_packed_and_vectorised_like_a_matmuls_row(dev):
    e = _conv(h=61, w=67, f=48)
    assert "gathered windows (im2col)" in Stepper(e, dev).next().note
    top = construct(e, dev, options=Options(topk=3)).candidates[0].program
    plan = cpu_plan(top, dev)
    assert plan.path == PANELS and plan.vector_axis == 2  # the pixels
    assert plan.staged_padding  # the gather, a stage of its own


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_gather_is_priced_as_a_copy_of_the_rows_it_reads_and_writes(dev):
    """2 images x 5 channels x 3 x 3 taps x 13 rows of the 13 x 11 output: each tap reads a row
    of the image (11 pixels, 44 B) and writes one of the copy; at a panel copy's 16 B a cycle on
    every core."""
    from workbench.rtile.model import estimate
    from workbench.rtile.model.cpu import PACK_BYTES_PER_CYCLE, core_ghz, gather_seconds

    view = window_gemm(_conv(n=2))
    rows = 2 * 45 * 13
    moved = rows * 11 * 4 + 2 * 45 * 13 * 11 * 4
    assert gather_seconds(view, dev) == pytest.approx(
        moved / (PACK_BYTES_PER_CYCLE * dev.compute_units * core_ghz(dev) * 1e9))
    program = construct(view, dev, options=Options(topk=1)).candidates[0].program
    assert dict(estimate(program, dev).bytes_per_layer)["gathering the image's pixels"] == moved


@pytest.mark.parametrize("params", [{}, {"n": 2, "pad": 0}, {"dilation": 2, "pad": 2}, {"c": 3, "f": 29, "h": 17, "w": 7}])
def test_the_kernel_takes_the_callers_buffers_and_matches_numpy(params):
    """Ragged pixels and filters, a border, none, a dilation: every candidate of the top 3."""
    built = built_view_kernels(_conv(**params))
    assert len(built) == 3 and all(is_window_view(cand.program.expr) for cand, _ in built)


def test_the_exported_bundle_takes_nchw_and_its_schedule_says_it_replays_the_view(tmp_path):
    import json

    from workbench import pipeline

    e = _conv()
    c = construct(e, device("local-cpu"), options=Options(topk=1))
    result = pipeline.export(c, 1, tmp_path / "bundle")
    assert result.verified
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert [a["shape"] for a in manifest["args"]] == [[1, 5, 13, 11], [24, 5, 3, 3], [1, 24, 13, 11]]
    script = (tmp_path / "bundle" / "schedule.py").read_text()
    assert "ops/window_gemm.py" in script and "data's windows gathered" in script
    assert "kernel [24, 45] for [24, 5, 3, 3]" in script


@pytest.mark.parametrize("w, unrolled", [(29, True), (129, False)])
def test_the_copy_walks_the_output_rows_outermost_and_unrolls_a_short_row(w, unrolled):
    """Rows outside the taps, so each core copies the pixels its own unit tiles read
    (`window_gemm._rewrite`); a row of at most MAX_UNROLLED_GATHER_ROW unrolled
    (`codegen.cpu._gather_first`)."""
    from workbench.codegen.cpu import MAX_UNROLLED_GATHER_ROW

    (_, kernel), = built_view_kernels(_conv(h=9, w=w, f=23), topk=1)
    script = kernel.tvmscript
    # 9 rows x 5 x 3 x 3 taps fused and dealt out to the cores, the row the outermost
    gather = script[script.index("T.parallel(405)"):script.index("T.if_then_else")]
    assert "T.axis.spatial(9, " in gather and "// 45)" in gather
    assert (f"T.unroll({w})" in gather) == unrolled == (w <= MAX_UNROLLED_GATHER_ROW)
