import json

import pytest

from workbench.errors import UserError
from workbench.ops import catalog
from workbench.ops.tensor_expr import REDUCE, SPATIAL

CONV = dict(N=1, C=3, H=9, W=8, F=4, KH=3, KW=3, stride=2, pad=1)
DW = dict(N=1, C=3, H=9, W=8, KH=3, KW=3, stride=1, pad=1)
POOL = dict(N=1, C=2, H=7, W=7, K=3, stride=2, pad=1)

# (op, params, output shape, main block, number of reduce axes)
SMALL = [
    ("matmul", dict(M=3, N=4, K=5), (3, 4), "C", 1),
    ("matmul", dict(M=3, N=4, K=5, B=2, trans_a=True, trans_b=True), (2, 3, 4), "C", 1),
    ("gemv", dict(M=6, K=5), (6,), "y", 1),
    ("conv2d", CONV, (1, 4, 5, 4), "O", 3),
    ("conv2d", dict(CONV, pad=0, stride=1, dilation=2), (1, 4, 5, 4), "O", 3),
    ("group_conv2d", dict(CONV, C=6, groups=2), (1, 4, 5, 4), "O", 3),
    ("group_conv2d", dict(CONV, C=6, F=6, groups=3, pad=0), (1, 6, 4, 3), "O", 3),
    ("depthwise_conv2d", DW, (1, 3, 9, 8), "O", 2),
    ("depthwise_conv2d", dict(DW, multiplier=2), (1, 3, 2, 9, 8), "O", 2),
    ("relu", dict(shape=(3, 4)), (3, 4), "Y", 0),
    ("add", dict(shape=(5,)), (5,), "C", 0),
    ("gelu", dict(shape=(2, 3, 4)), (2, 3, 4), "Y", 0),
    ("avgpool", POOL, (1, 2, 4, 4), "S", 2),
    ("maxpool", POOL, (1, 2, 4, 4), "O", 2),
    ("reduce_sum", dict(shape=(3, 4, 5), axes=(0, 2)), (4,), "Y", 2),
    ("reduce_mean", dict(shape=(7, 9), axes=[1]), (7,), "S", 1),
]


def test_list_ops_is_the_suite_readme_catalog():
    names = [info.name for info in catalog.list_ops()]
    assert names == [
        "matmul", "gemv", "conv2d", "group_conv2d", "depthwise_conv2d", "relu", "add", "gelu",
        "avgpool", "maxpool", "reduce_sum", "reduce_mean",
    ]  # fmt: skip
    for info in catalog.list_ops():
        assert all(p.kind in ("int", "ints", "bool") for p in info.params)


def test_op_info_dict_is_json():
    doc = json.loads(json.dumps([catalog.op_info_dict(i) for i in catalog.list_ops()]))
    matmul = doc[0]
    assert set(matmul) == {"name", "params", "description", "example", "example_source"}
    assert matmul["params"][0] == {"name": "M", "kind": "int", "default": None, "doc": "rows of C"}
    assert {p["name"]: p["default"] for p in matmul["params"]}["trans_b"] is False


@pytest.mark.parametrize("info", catalog.list_ops(), ids=lambda i: i.name)
def test_every_example_is_a_whole_real_layer_that_builds(info):
    assert sorted(k for k, _ in info.example) == sorted(p.name for p in info.params)
    assert info.example_source
    built = catalog.build(info.name, dict(info.example), "float32")
    assert built.flops > 0


@pytest.mark.parametrize("op, params, out_shape, main, n_reduce", SMALL)
def test_every_op_builds(op, params, out_shape, main, n_reduce):
    inputs, output = catalog.build_te(op, params)
    assert tuple(int(d) for d in output.shape) == out_shape
    expr = catalog.build(op, params)
    assert expr.op == op and expr.main_block == main
    assert [a.kind for a in expr.axes].count(REDUCE) == n_reduce
    assert [t.role for t in expr.tensors] == ["input"] * len(inputs) + ["output"]


def test_matmul_layouts_and_defaults():
    inputs, _ = catalog.build_te("matmul", dict(M=3, N=4, K=5, B=2, trans_a=True))
    assert [tuple(int(d) for d in t.shape) for t in inputs] == [(2, 5, 3), (2, 5, 4)]
    expr = catalog.build("matmul", dict(M=3, N=4, K=5))
    assert dict(expr.params) == dict(M=3, N=4, K=5, B=0, trans_a=False, trans_b=False)
    assert [(a.name, a.kind) for a in expr.axes] == [("i", SPATIAL), ("j", SPATIAL), ("k", REDUCE)]
    assert expr.flops == 2 * 3 * 4 * 5


def test_padding_is_a_separate_block_only_when_padded():
    _, padded = catalog.build_te("conv2d", CONV)
    _, unpadded = catalog.build_te("conv2d", dict(CONV, pad=0))
    assert [t.name for t in padded.op.input_tensors] == ["pad", "kernel"]
    assert [t.name for t in unpadded.op.input_tensors] == ["data", "kernel"]


def test_group_conv_splits_the_output_channels_into_group_and_channel_in_group():
    """AlexNet-style: 6 input channels in 2 groups of 3, 4 filters in 2 groups of 2. Output
    channel f = 2 g + j reads input channels 3 g .. 3 g + 2: with f split into (g, j) = (f_0, f_1)
    the data's channel index is 3 f_0 + c and the kernel's and output's 2 f_0 + f_1."""
    inputs, _ = catalog.build_te("group_conv2d", dict(CONV, C=6, groups=2))
    assert [tuple(int(d) for d in t.shape) for t in inputs] == [(1, 6, 9, 8), (4, 3, 3, 3)]
    expr = catalog.build("group_conv2d", dict(CONV, C=6, groups=2))
    assert [(a.name, a.extent, a.kind) for a in expr.axes] == [
        ("n", 1, SPATIAL), ("f_0", 2, SPATIAL), ("f_1", 2, SPATIAL), ("h", 5, SPATIAL), ("w", 4, SPATIAL),
        ("c", 3, REDUCE), ("r", 3, REDUCE), ("s", 3, REDUCE),
    ]
    data, kernel, out = expr.tensors
    assert data.index[1] == ((0, 3, 0, 0, 0, 1, 0, 0), 0)
    assert kernel.index[0] == out.index[1] == ((0, 2, 1, 0, 0, 0, 0, 0), 0)
    assert expr.flops == 2 * 1 * 4 * 5 * 4 * 3 * 3 * 3
    # a tile of one group reads that group's 3 input channels only
    assert expr.data_tile_shape(0, (1, 1, 2, 5, 4, 3, 3, 3)) == (1, 3, 11, 9)


def test_depthwise_kernel_layout():
    inputs, _ = catalog.build_te("depthwise_conv2d", dict(DW, multiplier=2))
    assert [tuple(int(d) for d in t.shape) for t in inputs] == [(1, 3, 9, 8), (6, 1, 3, 3)]


@pytest.mark.parametrize(
    "op, params, message",
    [
        ("conv3d", {}, "unknown operator 'conv3d'; known: matmul, gemv"),
        ("matmul", dict(M=3, N=4), "missing parameter K"),
        ("matmul", dict(M=0, N=4, K=5), "M must be a positive integer, got 0"),
        ("matmul", dict(M=3, N=-4, K=5), "N must be a positive integer, got -4"),
        ("matmul", dict(M=3, N=4, K=2.5), "K must be a positive integer, got 2.5"),
        ("matmul", dict(M=3, N=4, K="5"), "K must be a positive integer"),
        ("matmul", dict(M=True, N=4, K=5), "M must be a positive integer, got True"),
        ("matmul", dict(M=3, N=4, K=5, Q=1), "unknown parameter 'Q'"),
        ("matmul", dict(M=3, N=4, K=5, trans_a=1), "trans_a must be true or false"),
        ("matmul", dict(M=65536, N=4, K=65536), "tensor A has shape 65536x65536"),
        ("conv2d", dict(CONV, pad=-1), "pad must be an integer >= 0"),
        ("conv2d", dict(CONV, stride=0), "stride must be a positive integer"),
        ("conv2d", dict(CONV, KH=12), "window of 12 is larger than the padded input height of 11"),
        ("conv2d", dict(CONV, KW=3, dilation=5), "window of 11 is larger than the padded input width of 10"),
        ("group_conv2d", dict(CONV, groups=2), "group_conv2d: C = 3 is not divisible by groups = 2"),
        ("group_conv2d", dict(CONV, C=6, F=5, groups=2), "group_conv2d: F = 5 is not divisible by groups = 2"),
        ("group_conv2d", CONV, "group_conv2d: missing parameter groups"),
        ("maxpool", dict(POOL, K=10), "window of 10 is larger"),
        ("relu", dict(shape=()), "shape must be a list of integers"),
        ("relu", dict(shape=(3, 0)), "every entry of shape must be a positive integer"),
        ("reduce_sum", dict(shape=(3, 4), axes=2), "axes [2] must be distinct dimensions of a rank-2 shape"),
        ("reduce_sum", dict(shape=(3, 4), axes=(1, 1)), "must be distinct"),
        ("reduce_mean", dict(shape=(3, 4), axes=-1), "every entry of axes must be an integer >= 0"),
    ],
)
def test_bad_params_name_the_problem(op, params, message):
    with pytest.raises(UserError) as err:
        catalog.build_te(op, params)
    assert message in str(err.value)


def test_bad_dtype():
    with pytest.raises(UserError, match="unsupported dtype 'int4'"):
        catalog.build("relu", dict(shape=(3,)), dtype="int4")


@pytest.mark.parametrize(
    "op, params, message",
    [
        # 2^63 as a dilation or stride reached TVM as a BigInt index coefficient (a TypeError)
        ("conv2d", dict(N=1, C=1, H=8, W=8, F=1, KH=1, KW=1, stride=1, pad=0, dilation=2**63), "dilation must be at most 2147483647"),
        ("maxpool", dict(N=1, C=1, H=8, W=8, K=1, stride=2**32, pad=0), "stride must be at most 2147483647"),
        ("relu", dict(shape=(4, 2**31)), "shape must be at most 2147483647"),
    ],
)
def test_params_beyond_the_int32_index_range_are_refused(op, params, message):
    with pytest.raises(UserError, match=f"^{op}: {message} \\(the int32 index range\\)"):
        catalog.build(op, params)


def test_a_stride_at_the_int32_limit_builds():
    expr = catalog.build("maxpool", dict(N=1, C=1, H=8, W=8, K=1, stride=2**31 - 1, pad=0))
    assert [a.extent for a in expr.axes if a.kind == SPATIAL] == [1, 1, 1, 1]


def test_a_dynamic_extent_is_split_off_and_refused_elsewhere():
    assert catalog.split_dynamic("matmul", dict(M="dyn", K=8, N=4)) == (
        "M", dict(M=1, N=4, K=8, B=0, trans_a=False, trans_b=False))
    with pytest.raises(UserError, match="workbench vortex compile"):
        catalog.build("matmul", dict(M="dyn", K=8, N=4))
    for params, message in ((dict(M="dyn", K="dyn", N=4), "one dynamic extent per workload, got K, M"),
                            (dict(M=3, K=8, N="dyn"), "N cannot be dynamic"),
                            (dict(M=3, K=8, N=4), "no dynamic extent")):
        with pytest.raises(UserError, match=message):
            catalog.split_dynamic("matmul", params)


def test_the_symbolic_function_takes_its_outer_step_count_last():
    import re

    func = catalog.symbolic_func("matmul", dict(M="dyn", K=8, N=4), "M", 6)
    steps = func.params[-1]
    assert len(func.params) == 4 and str(steps.name).startswith("T")
    script = func.script()  # the printer renames T (the script's module alias) to T_1
    rows = re.search(r"C: T\.Buffer\(\((T\w*) \* 6, 4\)", script)  # C's rows: T outer tiles of 6
    assert rows and f"{rows.group(1)}: T.int32)" in script
