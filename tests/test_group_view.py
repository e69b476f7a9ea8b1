"""A grouped conv with its groups a dimension of every tensor (`ops.group_view`): the view, the
rewritten PrimFunc it carries, the plan it gets (lanes along the filters of a group), and the
kernel that takes the caller's buffers."""

import pytest
from test_alignment import AVX2, AVX512

from tests.helpers import device
from workbench.codegen.build import build_kernel
from workbench.codegen.verify import verify
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.ops.gemm_view import construction_expr
from workbench.ops.group_view import group_view
from workbench.ops.pixel_gemm import pixel_gemm
from workbench.ops.tensor_expr import from_prim_func
from workbench.rtile.axes import filter_axis
from workbench.rtile.plan import FILTERS, PANELS, ROW, cpu_plan
from workbench.workload import Workload


def _grouped(n=1, c=24, h=11, w=9, f=48, k=3, stride=1, pad=1, groups=3):
    params = {"N": n, "C": c, "H": h, "W": w, "F": f, "KH": k, "KW": k, "stride": stride, "pad": pad,
              "groups": groups}
    return Workload(op="group_conv2d", params=tuple(params.items())).build()


def test_a_grouped_conv_reads_its_groups_as_a_dimension_of_every_tensor():
    """24 channels and 48 filters in 3 groups: the data (padded, 13 x 11) becomes [1, 3, 8, ..],
    the filters [3, 16, 8, 3, 3], the output [1, 3, 16, 11, 9]; each dimension is one axis."""
    e = _grouped()
    assert [a.name for a in e.axes] == ["n", "f_0", "f_1", "h", "w", "c", "r", "s"]
    assert filter_axis(e) is None  # the output's channels are g * 16 + f: no axis of their own
    view = group_view(e)
    assert [t.shape for t in view.tensors] == [(1, 3, 8, 13, 11), (3, 16, 8, 3, 3), (1, 3, 16, 11, 9)]
    assert all(sum(1 for c in coeffs if c) == 1 for t in view.tensors[1:] for coeffs, _ in t.index)
    assert view.axes == e.axes and filter_axis(view) == 2  # f_1: lanes along a group's filters
    # the pure view is what TVM reads off the rewritten function, and the caller's buffers stay
    read = from_prim_func(view.func, e.op, dict(e.params), e.dtype, n_inputs=2)
    assert (read.axes, read.tensors, read.flops) == (view.axes, view.tensors, e.flops)
    assert view.args == e.args and [a.shape for a in e.args] == [(1, 24, 11, 9), (48, 8, 3, 3), (1, 48, 11, 9)]


def test_ungrouped_convs_and_matmuls_have_no_group_view():
    conv = Workload(op="conv2d", params=tuple({"N": 1, "C": 8, "H": 9, "W": 9, "F": 16, "KH": 3, "KW": 3,
                                                "stride": 1, "pad": 1}.items())).build()
    mm = Workload(op="matmul", params=(("M", 16), ("N", 32), ("K", 8))).build()
    assert group_view(conv) is None and group_view(mm) is None


def test_a_grouped_pointwise_conv_is_a_batched_gemm_over_its_pixels():
    """On a CPU the pixel-GEMM view applies on top (ShuffleNet's grouped 1x1 convs); the GPU
    keeps its implicit GEMM of the direct nest."""
    e = _grouped(c=24, h=7, w=7, f=24, k=1, pad=0)
    assert pixel_gemm(e) is None  # the channel g * 8 + c: no plain matmul dimension
    viewed = construction_expr(e, device("local-cpu"))
    assert [(a.name, a.extent) for a in viewed.axes] == [("n", 1), ("f_0", 3), ("f_1", 8), ("p", 49), ("c", 8)]
    assert [t.shape for t in viewed.tensors] == [(1, 3, 8, 49), (3, 8, 8), (1, 3, 8, 49)]
    assert construction_expr(e, device("v100")).axes != viewed.axes


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_grouped_conv_runs_its_lanes_along_a_groups_filters(dev):
    """AlexNet's second conv (96 channels, 256 5x5 filters in 2 groups over 26 x 26): the
    filters template, lanes along f_1, where the nest without the view ran scalar. A pointwise
    one takes its GEMM view in vectors: panels, or, where its 196 pixels leave a tail, reading
    its inputs in place with the edge split off (`RProgram.in_place`; 48 -> 96 in 4 groups over
    14 x 14 on two Zen 5 cores: 1.6 us against 1.9-2.1 padded, AVX2 code 3.9-4.2 against
    4.6-4.7: docs/evidence.md#in-place-tails)."""
    e = _grouped(c=96, h=26, w=26, f=256, k=5, pad=2, groups=2)
    top = construct(e, dev, options=Options(topk=3)).candidates[0].program
    assert cpu_plan(top, dev).path == FILTERS and cpu_plan(top, dev).vector_axis == 2
    pointwise = construct(_grouped(c=48, h=14, w=14, f=96, k=1, pad=0, groups=4), dev, options=Options(topk=3))
    program = pointwise.candidates[0].program
    plan = cpu_plan(program, dev)
    assert plan.path == PANELS or (plan.path == ROW and program.in_place and plan.split_edges)


@pytest.mark.parametrize("case", ["3x3-pad", "1x1", "5x5-s2-two-images"])
def test_the_kernel_takes_the_callers_buffers_and_matches_numpy(case):
    """Every candidate of the top 3 of a padded 3x3, a pointwise (group then pixel view) and a
    strided 5x5 over two images, against numpy's grouped conv."""
    e = {"3x3-pad": _grouped(), "1x1": _grouped(h=7, w=7, f=24, k=1, pad=0),
         "5x5-s2-two-images": _grouped(n=2, c=12, h=13, w=11, f=20, k=5, stride=2, pad=2, groups=4)}[case]
    dev = device("local-cpu")
    for cand in construct(e, dev, options=Options(topk=3)).candidates:
        kernel = build_kernel(cand.program.expr, cand.program, dev)
        assert kernel.ok, kernel.error
        assert [a.shape for a in kernel.args] == [a.shape for a in e.args]
        result = verify(kernel, cand.program.expr)
        assert result.correct, result
