"""A pointwise conv as the GEMM over its pixels (`ops.pixel_gemm`): the view, the rewritten
PrimFunc it carries, the kernel that takes the caller's buffers, and the plan it gets."""

import pytest
from test_alignment import AVX2, AVX512

from tests.helpers import built_view_kernels, device
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper, construct
from workbench.ops.gemm_view import construction_expr
from workbench.ops.pixel_gemm import pixel_gemm
from workbench.ops.tensor_expr import from_prim_func
from workbench.rtile.panels import gathered_inputs
from workbench.rtile.plan import PANELS, cpu_plan
from workbench.workload import Workload


def _conv(n=1, c=31, h=15, w=13, f=41, k=1, stride=1, pad=0):
    params = {"N": n, "C": c, "H": h, "W": w, "F": f, "KH": k, "KW": k, "stride": stride, "pad": pad}
    return Workload(op="conv2d", params=tuple(params.items())).build()


@pytest.mark.parametrize("n", [1, 3])
def test_a_pointwise_conv_is_the_gemm_over_its_pixels(n):
    e = _conv(n=n)
    view = pixel_gemm(e)
    assert [(a.name, a.extent, a.kind) for a in view.axes] == [
        ("n", n, "spatial"), ("f", 41, "spatial"), ("p", 15 * 13, "spatial"), ("c", 31, "reduce")]
    assert [t.shape for t in view.tensors] == [(n, 31, 195), (41, 31), (n, 41, 195)]
    # the pure view is what TVM reads off the rewritten function, and the caller's buffers stay
    read = from_prim_func(view.func, e.op, dict(e.params), e.dtype, n_inputs=2)
    assert (read.axes, read.tensors, read.flops) == (view.axes, view.tensors, e.flops)
    assert view.args == e.args and [a.shape for a in e.args] == [(n, 31, 15, 13), (41, 31, 1, 1), (n, 41, 15, 13)]


@pytest.mark.parametrize("params", [{"k": 3}, {"pad": 1}, {"stride": 2, "pad": 1}, {"h": 1, "w": 1}])
def test_other_convs_keep_their_nest(params):
    """A window wider than one pixel, a padding copy, or no pixels to speak of."""
    assert pixel_gemm(_conv(**params)) is None


@pytest.mark.parametrize("n,stride", [(1, 2), (2, 3)])
def test_a_strided_pointwise_conv_is_the_gemm_over_its_gathered_pixels(n, stride):
    """The image read every stride-th pixel is gathered into the output's pixels first: the GEMM
    reads that copy at stride 1 (its name the argument's, as a padded input's is), and the
    caller still passes the whole image."""
    e = _conv(n=n, stride=stride)
    view = pixel_gemm(e)
    oh, ow = 14 // stride + 1, 12 // stride + 1
    assert [(a.name, a.extent, a.kind) for a in view.axes] == [
        ("n", n, "spatial"), ("f", 41, "spatial"), ("p", oh * ow, "spatial"), ("c", 31, "reduce")]
    assert [t.shape for t in view.tensors] == [(n, 31, oh * ow), (41, 31), (n, 41, oh * ow)]
    read = from_prim_func(view.func, e.op, dict(e.params), e.dtype, n_inputs=2)
    assert (read.axes, read.tensors, read.flops) == (view.axes, view.tensors, e.flops)
    assert view.args == e.args and [a.shape for a in e.args][0] == (n, 31, 15, 13)
    assert gathered_inputs(view) == ("data",) and gathered_inputs(pixel_gemm(_conv(n=n))) == ()
    assert "gathered pixels" in Stepper(e, device("local-cpu")).next().note


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_gather_is_priced_as_a_copy_of_the_lines_it_reads_and_writes(dev):
    """2 images x 13 channels x 15 strided rows of 31 pixels (124 B, within 16 lines) read, and
    the 2 x 13 x 240 gathered pixels written, at a panel copy's 16 B a cycle on every core."""
    from workbench.rtile.model.cpu import PACK_BYTES_PER_CYCLE, core_ghz, gather_seconds, price

    view = pixel_gemm(_conv(n=2, c=13, h=29, w=31, f=20, stride=2))
    moved = 2 * 13 * 15 * 31 * 4 + 2 * 13 * 15 * 16 * 4
    assert gather_seconds(view, dev) == pytest.approx(
        moved / (PACK_BYTES_PER_CYCLE * dev.compute_units * core_ghz(dev) * 1e9))
    program = construct(view, dev, options=Options(topk=1)).candidates[0].program
    pricing = price(program, dev, program.expr.flops, 1.0)
    # the output lines two cores write and a split program's sum come last (tests/test_model.py)
    *_, gathering, _, _ = pricing.after
    assert gathering == gather_seconds(view, dev)
    assert dict(pricing.moved)["gathering the image's pixels"] == moved


def test_a_grouped_pointwise_conv_keeps_its_nest():
    """Its channel `g * C/G + c` is no plain matmul dimension: no panels for it, until
    `ops.group_view` splits it (tests/test_group_view.py)."""
    params = {"N": 1, "C": 24, "H": 7, "W": 7, "F": 24, "KH": 1, "KW": 1, "stride": 1, "pad": 0, "groups": 3}
    assert pixel_gemm(Workload(op="group_conv2d", params=tuple(params.items())).build()) is None


def test_the_view_is_the_cpus_and_the_gpu_keeps_its_implicit_gemm():
    e = _conv()
    assert construction_expr(e, device("local-cpu")).axes == pixel_gemm(e).axes
    gpu = construction_expr(e, device("v100"))
    assert [a.name for a in gpu.axes] == ["nhw", "f", "crs"]  # ops.gemm_view: M, N, K


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_pixels_are_packed_and_vectorised_like_a_matmuls_row(dev, stride):
    e = _conv(c=31, h=149, w=149, f=41, stride=stride)
    stepper = Stepper(e, dev)
    assert "GEMM over its" in stepper.next().note
    top = construct(e, dev, options=Options(topk=3)).candidates[0].program
    plan = cpu_plan(top, dev)
    assert plan.path == PANELS and plan.vector_axis == 2  # the pixels
    assert plan.staged_padding == (stride > 1)  # the gather, a stage of its own


@pytest.mark.parametrize("n,stride", [(1, 1), (2, 1), (1, 2), (2, 3)])
def test_the_kernel_takes_the_callers_buffers_and_matches_numpy(n, stride):
    """Ragged pixels (195 in tiles of 16, or 40 and 25 gathered at a stride) and filters (41),
    every candidate of the top 3."""
    for _, kernel in built_view_kernels(_conv(n=n, stride=stride)):
        assert "T.Buffer((%d, 31, 15, 13)" % n in kernel.tvmscript


def test_the_images_loop_inside_the_filters_in_the_register_tile():
    """2 images x 6 filters x 8 pixels: the broadcast of a filter's weight feeds both images'
    FMAs at once (`codegen.cpu._streamed_only`); with the images outside, six broadcasts stayed
    live across them and LLVM spilled (19 of 16 ymm registers). A batched matmul's batch, which
    both inputs read, keeps its place."""
    from workbench.codegen.cpu import _loop_order, _streamed_only
    from workbench.ops.catalog import build

    view = pixel_gemm(_conv(n=2))
    assert [_streamed_only(view, 2, a) for a in (0, 1)] == [True, False]  # n only in the data; f in the weight
    levels = [[("n", m) for m in range(4)], [("f", m) for m in range(4)], [("p", m) for m in range(4)],
              [("c", m) for m in range(4)]]
    assert _loop_order(view, levels, 2)[-3:] == [("f", 3), ("n", 3), ("p", 3)]
    bmm = build("matmul", {"B": 4, "M": 16, "K": 8, "N": 32}, "float32")
    assert not _streamed_only(bmm, 2, 0) and not _streamed_only(bmm, 2, 1)  # the batch and the rows


@pytest.mark.parametrize("stride, output, view, gathered", [
    (1, [1, 24, 9, 11], "data [1, 16, 99] for [1, 16, 9, 11]", False),
    (2, [1, 24, 5, 6], "O [1, 24, 30] for [1, 24, 5, 6]", True),  # the whole image passed, gathered
])
def test_the_exported_bundle_takes_nchw_and_its_schedule_says_it_replays_the_view(tmp_path, stride, output, view,
                                                                                   gathered):
    import json

    from workbench import pipeline

    e = _conv(c=16, h=9, w=11, f=24, stride=stride)
    c = construct(e, device("local-cpu"), options=Options(topk=1))
    result = pipeline.export(c, 1, tmp_path / "bundle")
    assert result.verified
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert [a["shape"] for a in manifest["args"]] == [[1, 16, 9, 11], [24, 16, 1, 1], output]
    script = (tmp_path / "bundle" / "schedule.py").read_text()
    assert view in script and "ops/pixel_gemm.py" in script
    assert ("data's strided pixels gathered" in script) == gathered
