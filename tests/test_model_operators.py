"""Each operator class of real models (transformer blocks, the ONNX light models) as a tiny
one- or few-node ONNX model: every operator gets a constructed kernel that builds (none falls
back to TVM's default lowering), and the model run with those kernels matches ONNX Runtime.
Tiny shapes and one candidate per operator: speed is measured in benchmarks, not here."""

from dataclasses import replace
from math import prod

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_alignment import AVX2, AVX512

from workbench import pipeline
from workbench.codegen.build import build_kernel
from workbench.models.execute import ATOL, RTOL, build_model_kernels, model_inputs, run_model
from workbench.rtile.axes import lane_axis, vector_axis
from workbench.rtile.model import estimate
from workbench.rtile.model.cpu import epilogue_seconds
from workbench.rtile.model.cpu_compute import micro_kernel_shape
from workbench.rtile.plan import LANES, cpu_plan

ort = pytest.importorskip("onnxruntime")

RNG = np.random.RandomState(0)


def _weight(*shape):
    return (RNG.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _model(nodes, x_shape, y_shape, inits=None):
    graph = helper.make_graph(
        nodes, "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _node(op, inputs, output="y", **attrs):
    return helper.make_node(op, inputs, [output], **attrs)


def _constructed(tmp_path, name: str, device="local-cpu", topk: int = 1):
    """`CASES[name]` written as an ONNX model under `tmp_path` and constructed on `device`:
    (the model's path, its construction)."""
    nodes, x_shape, y_shape, inits = CASES[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model(nodes, x_shape, y_shape, inits), path)
    return path, pipeline.construct_model(path, device, options=pipeline.Options(topk=topk))


def _assert_scheduled_and_matches_onnxruntime(mc, path):
    """Every operator of `mc` (constructed from the model at `path`) builds its constructed
    kernel, none falls back to TVM's default lowering, and the model run with them gives ONNX
    Runtime's output."""
    kernels = build_model_kernels(mc)
    assert [(k.name, k.error) for k in kernels if not k.scheduled] == []
    inputs = model_inputs(mc.model, 0)
    (ours,) = run_model(mc, kernels, inputs)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert ours.shape == expected.shape
    assert np.allclose(ours, expected, rtol=RTOL, atol=ATOL), float(np.max(np.abs(ours - expected)))


S = 12  # a sequence length unlike the sample models' (32), below one register tile's rows
CAUSAL = np.tril(np.ones((S, S), dtype=bool))


def _rms_norm():
    return [_node("Mul", ["x", "x"], "sq"), _node("ReduceMean", ["sq"], "ms", axes=[-1]),
            _node("Add", ["ms", "eps"], "mse"), _node("Sqrt", ["mse"], "rms"), _node("Div", ["x", "rms"], "n"),
            _node("Mul", ["n", "g"])]


CASES = {
    # attention scores: scaled, causal mask by Where (GPT-2's export) or an additive mask, softmax
    "softmax_causal_where": (
        [_node("Mul", ["x", "scale"], "s"), _node("Where", ["mask", "s", "ninf"], "m"), _node("Softmax", ["m"], axis=-1)],
        (1, 2, S, S), (1, 2, S, S), {"scale": np.float32(0.125), "mask": CAUSAL, "ninf": np.float32(-1e4)}),
    "softmax_additive_mask": (
        [_node("Add", ["x", "mask"], "m"), _node("Softmax", ["m"], axis=-1)], (2, S, S), (2, S, S),
        {"mask": np.triu(np.full((S, S), -1e4, np.float32), 1)}),
    "softmax_axis1": ([_node("Softmax", ["x"], axis=1)], (2, S, 7), (2, S, 7), {}),
    "layer_norm": ([_node("LayerNormalization", ["x", "g", "b"], axis=-1, epsilon=1e-5)], (1, 10, 24), (1, 10, 24),
                   {"g": 1 + _weight(24), "b": _weight(24)}),
    "rms_norm": (_rms_norm(), (1, 10, 24), (1, 10, 24), {"eps": np.float32(1e-6), "g": 1 + _weight(24)}),
    "matmul_gelu_erf": (
        [_node("MatMul", ["x", "w"], "h"), _node("Div", ["h", "sqrt2"], "d"), _node("Erf", ["d"], "e"),
         _node("Add", ["e", "one"], "e1"), _node("Mul", ["h", "e1"], "p"), _node("Mul", ["p", "half"])],
        (1, 10, 24), (1, 10, 40),
        {"w": _weight(24, 40), "sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}),
    "matmul_silu": ([_node("MatMul", ["x", "w"], "h"), _node("Sigmoid", ["h"], "s"), _node("Mul", ["h", "s"])],
                    (10, 24), (10, 40), {"w": _weight(24, 40)}),
    "tanh": ([_node("Tanh", ["x"])], (3, 50), (3, 50), {}),
    "lrn": ([_node("LRN", ["x"], size=5, alpha=1e-4, beta=0.75, bias=1.0)], (1, 16, 6, 6), (1, 16, 6, 6), {}),
    "grouped_conv": ([_node("Conv", ["x", "w", "b"], group=4, pads=[1, 1, 1, 1])], (1, 16, 7, 7), (1, 8, 7, 7),
                     {"w": _weight(8, 4, 3, 3), "b": _weight(8)}),
    # a 1x1 conv as the GEMM over its 35 pixels (ops.pixel_gemm), ragged, its bias and ReLU
    # folded into the padded output's copy-back
    "pointwise_conv_relu": ([_node("Conv", ["x", "w", "b"], "c"), _node("Relu", ["c"])], (1, 12, 5, 7), (1, 10, 5, 7),
                            {"w": _weight(10, 12, 1, 1), "b": _weight(10)}),
    # strided: the GEMM over the pixels gathered first (ops.pixel_gemm), a stride per dimension
    "strided_pointwise_conv_relu": ([_node("Conv", ["x", "w", "b"], "c", strides=[2, 3]), _node("Relu", ["c"])],
                                    (1, 12, 9, 11), (1, 10, 5, 4), {"w": _weight(10, 12, 1, 1), "b": _weight(10)}),
    # a first layer, 3 channels 3x3 to 24 filters, as the GEMM over its pixels of its gathered
    # windows (ops.window_gemm), the zero border inside the copy, its bias and ReLU folded in
    "window_conv_relu": ([_node("Conv", ["x", "w", "b"], "c", pads=[1, 1, 1, 1]), _node("Relu", ["c"])],
                         (1, 3, 9, 11), (1, 24, 9, 11), {"w": _weight(24, 3, 3, 3), "b": _weight(24)}),
    "depthwise_conv_relu": ([_node("Conv", ["x", "w"], "c", group=16, pads=[1, 1, 1, 1], strides=[2, 2]),
                             _node("Relu", ["c"])], (1, 16, 9, 9), (1, 16, 5, 5), {"w": _weight(16, 1, 3, 3)}),
    "channel_shuffle": ([_node("Reshape", ["x", "s1"], "r"), _node("Transpose", ["r"], "t", perm=[0, 2, 1, 3, 4]),
                         _node("Reshape", ["t", "s2"])], (1, 12, 5, 5), (1, 12, 5, 5),
                        {"s1": np.array([1, 3, 4, 5, 5], np.int64), "s2": np.array([1, 12, 5, 5], np.int64)}),
    "split_concat": ([helper.make_node("Split", ["x", "parts"], ["a", "b"], axis=1), _node("Relu", ["b"], "rb"),
                      _node("Concat", ["rb", "a"], axis=1)], (1, 10, 4, 4), (1, 10, 4, 4),
                     {"parts": np.array([4, 6], np.int64)}),
    "max_pool": ([_node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                 (1, 8, 9, 9), (1, 8, 5, 5), {}),
    "average_pool": ([_node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2])], (1, 8, 8, 8), (1, 8, 4, 4), {}),
    "global_average_pool": ([_node("GlobalAveragePool", ["x"])], (1, 8, 5, 5), (1, 8, 1, 1), {}),
    # its output kept to [N, C, 1, 1]; 13 x 13 pixels fuse into one K of 169, ragged in vectors
    "global_average_pool_ragged": ([_node("GlobalAveragePool", ["x"])], (2, 24, 13, 13), (2, 24, 1, 1), {}),
    "reduce_max": ([_node("ReduceMax", ["x"], axes=[1], keepdims=0)], (4, 9, 6), (4, 6), {}),
    # squeeze-excite's scale: a 1x1 conv on the pooled channels, its sigmoid broadcast over the
    # pixels it multiplies (a pass over rows after the conv)
    "se_scale": ([_node("GlobalAveragePool", ["x"], "g"), _node("Conv", ["g", "w", "b"], "c"), _node("Sigmoid", ["c"], "s"),
                  _node("Mul", ["x", "s"])], (1, 16, 6, 5), (1, 16, 6, 5), {"w": _weight(16, 16, 1, 1), "b": _weight(16)}),
    "reduce_sum_of_squares": ([_node("ReduceSumSquare", ["x"], axes=[2], keepdims=1)], (4, 6, 9), (4, 6, 1), {}),
    "transpose": ([_node("Transpose", ["x"], perm=[0, 2, 3, 1])], (1, 6, 5, 7), (1, 5, 7, 6), {}),
    "sum_of_three": ([_node("Sum", ["x", "a", "b"])], (1, 4, 5, 5), (1, 4, 5, 5),
                     {"a": _weight(1, 4, 5, 5), "b": _weight(4, 1, 1)}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_operator_is_scheduled_and_matches_onnxruntime(tmp_path, name):
    path, mc = _constructed(tmp_path, name)
    _assert_scheduled_and_matches_onnxruntime(mc, path)


def test_a_masked_softmax_gives_zeros_not_subnormals(tmp_path):
    """A causal softmax's masked scores (-1e4) give probabilities of 0 where e^x clamped to
    FLT_MIN over a row sum above 1 would be subnormal (`onnx_import.softmax`); in the first row,
    whose sum is 1, they stay FLT_MIN. No output lies strictly between 0 and FLT_MIN, and the
    rest match ONNX Runtime."""
    path, mc = _constructed(tmp_path, "softmax_causal_where")
    kernels = build_model_kernels(mc)
    (ours,) = run_model(mc, kernels, model_inputs(mc.model, 0))
    tiny = np.finfo(np.float32).tiny
    assert not np.any((ours != 0) & (np.abs(ours) < tiny))
    masked = np.broadcast_to(~CAUSAL, ours.shape)
    assert np.all(ours[masked] <= 1.2e-38) and np.all(ours[..., 1:, 0] > 0)
    assert np.all(ours[..., 1:-1, -1] == 0)  # rows of two or more scores, whose sums pass 1
    _assert_scheduled_and_matches_onnxruntime(mc, path)


@pytest.mark.parametrize("name", ["softmax_axis1", "matmul_gelu_erf", "matmul_silu", "tanh", "lrn"])
def test_transcendentals_are_polynomials_not_libm_calls(tmp_path, name):
    """exp, erf, tanh and LRN's x^0.75 become arithmetic that vectorises with the kernel
    (`onnx_import.fast_math`): LLVM has no vector `expf`, `erff`, `tanhf` or `powf` and calls libm
    once per lane. Softmax's passes after its maximum are scheduled per tile, not inlined into one
    write-back (which TVM refused: "inline epilogue T_softmax_exp: Cannot dispatch a null
    expression"). The model prices the epilogue's arithmetic (`TensorExpr.epilogue_ops`)."""
    _, mc = _constructed(tmp_path, name)
    for r in mc.results:
        kernel = build_kernel(r.construction.expr, r.candidates[0].program, pipeline.load_device("local-cpu"))
        assert kernel.ok, kernel.error
        texts = "\n".join(text for _, text in kernel.sources)  # LLVM IR and assembly
        calls = {f for f in ("expf", "erff", "tanhf", "powf", "llvm.exp", "llvm.pow") if f in texts}
        assert not calls, (r.operator.name, calls)
    reductions = [r.operator.expr for r in mc.results if r.operator.expr.reduce]
    assert all(expr.epilogue_ops > 0 for expr in reductions)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("name", ["matmul_gelu_erf", "matmul_silu", "pointwise_conv_relu"])
def test_an_epilogues_flops_stay_out_of_the_main_blocks_compute(tmp_path, dev, name):
    """TVM counts a fused operator's flops over all its blocks, an epilogue's as inlined (a
    SiLU's exp polynomial once for each use of its argument): the main block's share
    (`TensorExpr.main_flops`) is the multiply-add reduction's, two flops an iteration point, so
    its register tile runs the micro-kernel calibration measures (`micro_kernel_shape`) and its
    compute is that of the same program without the epilogue's flops; `epilogue_seconds` alone
    prices the epilogue."""
    _, mc = _constructed(tmp_path, name, dev)
    (r,) = [r for r in mc.results if r.operator.expr.reduce]
    expr, program = r.construction.expr, r.candidates[0].program
    assert expr.epilogue_flops > 0 and expr.main_flops == 2 * prod(expr.extents) < expr.flops
    assert micro_kernel_shape(expr, dev, program.register_tile) is not None
    bare = replace(program, expr=replace(expr, flops=expr.main_flops, epilogue_flops=0))
    assert estimate(program, dev).compute_seconds == pytest.approx(estimate(bare, dev).compute_seconds)
    assert epilogue_seconds(program, dev, 1.0) > 0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_row_pass_counts_what_its_rows_do_not_change_once_a_row_of_rows(tmp_path, dev):
    """Squeeze-excite's scale `x * sigmoid(conv)`: the conv writes one value a channel and the
    multiply, a row pass, runs over the channel's 6 x 5 pixels. The sigmoid depends on the
    channel alone, so LLVM computes it once a channel (`tensor_expr.block_ops` with `hoists`):
    the row pass's per-pixel operations are the multiply's one, and the epilogue's operations
    are the 480 multiplies and, for each of the 16 channels, one bias add and sigmoid (the exp
    polynomial and a division: some 40 operations, where counted per pixel they were 30 times
    as many)."""
    _, mc = _constructed(tmp_path, "se_scale", dev)
    (expr,) = [r.construction.expr for r in mc.results if r.construction.expr.row_passes]
    (scale,) = expr.row_passes
    assert scale.rows * scale.extent == 16 * 6 * 5 and scale.ops == 1 and not scale.reduction
    per_channel = expr.epilogue_ops - 16 * 6 * 5
    assert per_channel % 16 == 0 and 10 <= per_channel // 16 <= 60


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_pool_kept_to_one_pixel_sums_its_fused_pixels_in_lanes(tmp_path, dev):
    """A global average pool's output is kept to [2, 24, 1, 1]: its contiguous axis, the unit
    pixels, holds one element, so each channel's 13 x 13 pixels, one fused K, are summed in
    vector lanes instead (`axes.lane_axis`), K's ragged edge split off (`plan.LANES`); taken for
    the row to vectorise, the unit axis left the sums scalar (docs/evidence.md#pool-lanes). The
    kernel is checked against ONNX Runtime in
    `test_every_operator_is_scheduled_and_matches_onnxruntime`."""
    _, mc = _constructed(tmp_path, "global_average_pool_ragged", dev, topk=3)
    (r,) = mc.results
    expr = r.construction.expr
    k = expr.reduce[-1]
    assert expr.axes[k].fused_from and expr.axes[k].extent == 169 and lane_axis(expr, dev) == k
    assert expr.axes[vector_axis(expr)].extent == 1
    assert r.candidates and all(cpu_plan(c.program, dev).path == LANES for c in r.candidates)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_ragged_tiles_guarded_stores_are_split_off_whole_vectors(tmp_path, dev):
    """SqueezeNet's expand conv (16 -> 64 channels over 55 x 55 pixels, bias and ReLU) as a
    pixel GEMM: 3025 pixels leave the last unit tile ragged, so its register tiles store under a
    guard. A model's PrimFunc indexes in int64, and lowering's int32 narrowing used to leave the
    template's loop-partition hints naming loops that no longer existed: every store tested every
    lane and the ReLU ran scalar. Indexed in int32 (`build.narrow_indices`), lowering splits the
    tiles inside the output off, whose ReLU compares whole vectors. The fcmp counts are LLVM's
    IR, whatever the ISA; the kernel's output is checked against ONNX Runtime on this CPU."""
    import re

    path = tmp_path / "expand.onnx"
    inits = {"w": _weight(64, 16, 1, 1), "b": _weight(64)}
    onnx.save(_model([_node("Conv", ["x", "w", "b"], "c"), _node("Relu", ["c"])], (1, 16, 55, 55), (1, 64, 55, 55), inits), path)
    mc = pipeline.construct_model(path, dev, options=pipeline.Options(topk=1))
    (r,) = mc.results
    expr, program = r.construction.expr, r.candidates[0].program
    assert any(expr.axes[a].extent % program.tiles[-1][a] for a in expr.spatial)  # a ragged unit tile
    kernel = build_kernel(expr, program, dev)
    assert kernel.ok, kernel.error
    ir = dict(kernel.sources)["ll"]
    assert re.search(r"fcmp \w+ <\d+ x float>", ir), "the ReLU compares no whole vector"
    local = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    _assert_scheduled_and_matches_onnxruntime(local, path)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_ragged_k_under_a_bias_and_a_residual_is_padded_and_matches(tmp_path, dev):
    """A decoder block's down projection with its bias and residual added, over a K of 97 in
    K-steps of 16: the elementwise epilogue reads the finished sums in the padded output's
    copy-back, so K pads with zeros as it would alone and the micro-kernel runs from both
    panels (9 x 973 x 75 so: 8.4 us where its scalar row behind the guard ran 100). The plan on
    the generated specs; the kernel, built for this CPU, against TVM's default lowering."""
    from workbench.models.execute import verify_operator
    from workbench.rtile.plan import PANELS, cpu_plan
    from workbench.rtile.rprogram import RProgram

    path = tmp_path / "down.onnx"
    inits = {"w": _weight(97, 75), "b": _weight(75), "r": _weight(9, 75)}
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Add", ["m", "b"], "a"), _node("Add", ["a", "r"])]
    onnx.save(_model(nodes, (9, 97), (9, 75), inits), path)

    def program(device):
        mc = pipeline.construct_model(path, device, options=pipeline.Options(topk=1))
        (r,) = mc.results
        e = r.construction.expr
        assert e.epilogues and e.pads_reduction and not e.row_passes
        chain = [(1, 16, 16) if a.kind == "reduce" else (16, 16, 48) if i == e.spatial[-1] else (a.extent,) * 3
                 for i, a in enumerate(e.axes)]
        tiles = tuple(tuple(c[layer] for c in chain) for layer in range(3))
        zeros = tuple(0 for _ in e.tensors)
        return mc, RProgram(tuple(a.name for a in e.axes), ("registers", "L1", "L2"), tiles, (zeros,) * 3,
                            (True,) * 3, 1, 0.0, e)

    _, p = program(dev)
    plan = cpu_plan(p, dev)
    reads_k = {t.name for t in p.expr.inputs if t.uses_axis(p.expr.reduce[0])}
    assert plan.path == PANELS and plan.padded_tails and set(plan.packed) == reads_k and not plan.guarded_row
    local, p = program("local-cpu")
    kernel = build_kernel(p.expr, p, local.device)
    assert kernel.ok, kernel.error
    check = verify_operator(kernel, local.model, 0, local.device)
    assert check.correct, check.error


def test_the_run_report_warns_of_every_fallback_and_maps_onnxruntime_nodes(tmp_path, monkeypatch):
    """An operator without a built kernel is named with its reason in the JSON's `not_scheduled`
    and a WARNING line of the text; ONNX Runtime's profiled nodes go to the operators computing
    their outputs (its MatMul and Relu fused into one FusedMatMul-style node or two, all mapped)."""
    from workbench.models import execute, run

    nodes = [_node("MatMul", ["x", "w"], "h"), _node("Relu", ["h"], "r"), _node("Softmax", ["r"], axis=-1)]
    path = tmp_path / "mlp_softmax.onnx"
    onnx.save(_model(nodes, (8, 16), (8, 24), {"w": _weight(16, 24)}), path)
    mc = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    refused = mc.results[-1].operator.name
    build = execute._build

    def failing(r, mc, rank):
        return (execute._unscheduled(r.operator, mc.device, "schedule: refused here")
                if r.operator.name == refused else build(r, mc, rank))

    monkeypatch.setattr(execute, "_build", failing)
    report = run.run_model_report(mc, path)
    doc = report.to_dict()
    assert report.outputs_match
    assert doc["not_scheduled"] == [{"name": refused, "reason": "schedule: refused here"}]
    assert f"WARNING: {refused} ran TVM's default lowering, not a constructed kernel: schedule: refused here" in report.text()
    assert all(o["onnxruntime_seconds"] and o["onnxruntime_nodes"] for o in doc["operators"]), doc["operators"]
    mapped = [n for o in doc["operators"] for n in o["onnxruntime_nodes"]]
    assert len(mapped) == len(set(mapped)) and doc["onnxruntime_unmatched"] == []


def _conv(out_channels, in_channels, k):
    return (RNG.standard_normal((out_channels, in_channels, k, k)) / np.sqrt(in_channels * k * k)).astype(np.float32)


def test_onnxruntime_nchwc_nodes_map_to_the_operators_computing_them(tmp_path):
    """ONNX Runtime's CPU provider moves convs and pools whose channels are a multiple of its
    NCHWc block (8 or 16, by the CPU's vectors) to its NCHWc domain: blocked outputs under new names (`reorder_token_N`), ReorderInput/ReorderOutput
    at the edges, a residual Add and its Relu fused into the conv before them, a Concat left in
    place on blocked inputs. Each node still goes to the operator computing the tensor it
    replaces, a ReorderInput to that of its consumer; none lands on the last operator, where
    following the blocked outputs downstream to the only tensor under its original name (`y`)
    would put them all."""
    from workbench.models import ort_profile
    from workbench.models.execute import operators_alone

    nodes = [_node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1, 1, 1]), _node("Relu", ["c1"], "r1"),
             _node("Conv", ["r1", "w2"], "c2", pads=[1, 1, 1, 1]), _node("Add", ["c2", "r1"], "s"),
             _node("Relu", ["s"], "r2"), _node("Conv", ["r2", "w3"], "c3"),
             _node("Concat", ["r2", "c3"], "cat", axis=1), _node("MaxPool", ["cat"], kernel_shape=[2, 2], strides=[2, 2])]
    # 16 input channels: a block's multiple either way, so the first conv reads a ReorderInput
    # (fewer than a block, ONNX Runtime's conv reads the NCHW input itself)
    inits = {"w1": _conv(16, 16, 3), "b1": _weight(16), "w2": _conv(16, 16, 3), "w3": _conv(16, 16, 1)}
    path = tmp_path / "conv_chain.onnx"
    onnx.save(_model(nodes, (1, 16, 8, 8), (1, 32, 4, 4), inits), path)
    mc = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    inputs = model_inputs(mc.model, 0)
    names = [r.operator.name for r in mc.results]
    outputs, _ = operators_alone(mc, build_model_kernels(mc), inputs, repeat=1)
    profile = ort_profile.profile(path, inputs, 1, 1, list(zip(names, outputs)))
    if not any(n.name.endswith("_nchwc") for n in profile.nodes):
        pytest.skip("ONNX Runtime keeps NCHW convs on this CPU (no NCHWc kernels)")
    # TVM's groups, in dataflow order: conv+bias+relu, conv+add+relu, conv, concatenate, max pool
    assert len(names) == 5, names
    expected = {"ReorderInput": 0, "r1_nchwc": 0, "c2_nchwc": 1, "c3_nchwc": 2, "Concat": 3, "y_nchwc": 4,
                "ReorderOutput": 4}
    got = {n.name if n.name.endswith("_nchwc") else n.op_type: names.index(op)
           for op, ort_nodes in profile.by_operator if op for n in profile.nodes if n.name in ort_nodes}
    assert got == expected, profile.by_operator
    assert profile.unmatched == () and not profile.nodes_of(ort_profile.UNMATCHED)


def test_an_nchwc_name_that_does_not_fit_the_graph_is_refused():
    """An NCHWc node's name gives the tensor it computes only when the tensor its input carries
    is upstream of that one in the original graph: `b_nchwc` reading `a`'s blocked copy is `b`,
    `a_nchwc` reading `b`'s is nothing (and its ReorderInput computes nothing of its own)."""
    from workbench.models.ort_profile import NCHWC_DOMAIN, _computed

    original = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["a"], name="n0"), helper.make_node("Conv", ["a", "w"], ["b"], name="n1")],
        "original", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])], [])

    def optimised(first, second):
        return helper.make_graph([
            helper.make_node("ReorderInput", ["x"], ["t0"], name="ReorderInput", domain=NCHWC_DOMAIN),
            helper.make_node("Conv", ["t0", "w"], ["t1"], name=f"{first}_nchwc", domain=NCHWC_DOMAIN),
            helper.make_node("Conv", ["t1", "w"], ["t2"], name=f"{second}_nchwc_token_3", domain=NCHWC_DOMAIN)],
            "optimised", [], [])

    assert _computed(optimised("a", "b"), original) == {"a_nchwc": "a", "b_nchwc_token_3": "b"}
    assert _computed(optimised("b", "a"), original) == {"b_nchwc": "b"}


ROW_REDUCTIONS = {
    # (nodes, shape, initialisers, the row pass's reduction block)
    "softmax": ([_node("Softmax", ["x"], axis=-1)], (6, 64), {}, "T_softmax_expsum"),
    "layer_norm": ([_node("LayerNormalization", ["x", "g", "b"], axis=-1, epsilon=1e-5)], (1, 6, 48),
                   {"g": 1 + _weight(48), "b": _weight(48)}, "x_var_sum"),
    "softmax_ragged": ([_node("Softmax", ["x"], axis=-1)], (6, 61), {}, "T_softmax_expsum"),
    "layer_norm_ragged": ([_node("LayerNormalization", ["x", "g", "b"], axis=-1, epsilon=1e-5)], (1, 6, 45),
                          {"g": 1 + _weight(45), "b": _weight(45)}, "x_var_sum"),
}


@pytest.mark.parametrize("name", list(ROW_REDUCTIONS))
def test_a_row_pass_reduction_is_vectorised_with_its_ragged_tail_apart(tmp_path, name):
    """Softmax's row sum and layer norm's variance, passes over the rows after the main block's
    reduction, accumulate in per-row lanes under a vectorised loop (`rfactor`), summed across
    the lanes per row. A ragged row (61, 45) runs its whole vectors, then its last vector in a
    loop of its own (a guard inside the vector loop would scalarise all of it), and its passes
    from the reduction on after the grid, on all cores; its elementwise passes run whole
    vectors and a scalar tail. Either way the model matches ONNX Runtime within the usual
    tolerance: the lanes reassociate the sum, which changes it by rounding."""
    import re

    from workbench.codegen.cpu import schedule_cpu
    from workbench.rtile.panels import row_vector
    from workbench.rtile.plan import cpu_plan

    nodes, shape, inits, reduction = ROW_REDUCTIONS[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model(nodes, shape, shape, inits), path)
    mc = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    (r,) = mc.results
    expr, program = r.construction.expr, r.candidates[0].program
    lanes = cpu_plan(program, mc.device).lanes
    (row,) = [p for p in expr.row_passes if p.reduction]
    assert row.extent == shape[-1] and row.contiguous
    width = row_vector(row.extent, lanes, reduction=True).width
    assert width > 1
    script = schedule_cpu(expr, program, mc.device).mod.script()
    num = r"(?:T\.int64\()?{}\)?"  # how the script spells an extent
    vector = rf'for \w+ in T\.vectorized\({num.format(width)}\):\s+with T\.sblock\("{reduction}_rf_update\w*"\)'
    assert re.search(vector, script), script
    ragged = shape[-1] % width != 0
    body = shape[-1] // width
    tail = rf'for \w+ in range\({num.format(body)}, {num.format(body + 1)}\):\s+for \w+ in T\.vectorized'
    assert bool(re.search(tail, script)) == ragged
    if ragged:  # the division: whole vectors, then the last `extent % lanes` elements
        last = shape[-1] - shape[-1] % lanes
        assert re.search(rf'for \w+ in range\({num.format(last)}, {num.format(shape[-1])}\):', script)
    _assert_scheduled_and_matches_onnxruntime(mc, path)


ROW_MAXIMA = {
    # (Softmax's input shape and axis, whether its row maximum runs in lanes, ragged)
    "whole_rows": ((6, 64), -1, True, False),
    "ragged_rows": ((6, 61), -1, True, True),
    "long_ragged_rows": ((3, 1000), -1, True, True),
    "strided_axis": ((2, S, 7), 1, False, False),
}


@pytest.mark.parametrize("name", list(ROW_MAXIMA))
def test_softmax_row_maximum_runs_in_lanes(tmp_path, name):
    """Softmax's main block, the maximum over each row, keeps one vector of partial maxima per
    row (`rfactor`, the lanes path of the plan), combined once per row; a ragged row (61, 1000)
    runs its whole register tiles as vectors and the last one apart (`CpuPlan.split_edges`). A
    maximum over a strided axis (softmax over axis 1) has no contiguous lanes and stays on the
    plan's scalar path. Either way the model matches ONNX Runtime."""
    from workbench.codegen.cpu import schedule_cpu
    from workbench.rtile.plan import LANES, cpu_plan

    shape, axis, lanes, ragged = ROW_MAXIMA[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model([_node("Softmax", ["x"], axis=axis)], shape, shape), path)
    mc = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    (r,) = mc.results
    expr, program = r.construction.expr, r.candidates[0].program
    plan = cpu_plan(program, mc.device)
    assert (plan.path == LANES) == lanes and plan.split_edges == ragged, plan
    script = schedule_cpu(expr, program, mc.device).mod.script()
    rf = f'T.sblock("{expr.main_block}_rf'
    assert (rf in script) == lanes
    if lanes:  # the partial maxima's update under a vectorised loop, over K's register tile
        update = script[script.index(rf + '_update"'):]
        loops = script[:script.index(rf + '_update"')].rsplit("for ", 2)[-1]
        assert "T.vectorized" in loops and "T.max" in update.split("T.sblock(")[1]
    _assert_scheduled_and_matches_onnxruntime(mc, path)


def test_fast_exp_matches_numpy_and_stays_finite():
    """`onnx_import.fast_exp`, Cephes' polynomial with the exponent rounded by a magic addition:
    within 1e-5 relative of float64 exp where e^x is a normal float (the reduction by a one-part
    ln 2 costs about 2^-17 at |x| = 88, as TOPI's `fast_exp`), a normal float below, finite
    above (no infinity for softmax to divide by)."""
    import tvm
    from tvm import te

    from workbench.models.onnx_import import fast_exp

    x = te.placeholder((4096,), "float32", name="x")
    kernel = tvm.compile(te.create_prim_func([x, fast_exp(x)]), target="llvm")
    xs = np.concatenate([np.linspace(-100, 100, 4000), RNG.uniform(-1, 1, 96)]).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros_like(xs))
    kernel(tvm.runtime.tensor(xs), out)
    got, ref = out.numpy().astype(np.float64), np.exp(xs.astype(np.float64))
    normal = (xs > -87.3) & (xs < 88.3)
    assert np.max(np.abs(got[normal] - ref[normal]) / ref[normal]) < 1e-5
    assert np.all(np.isfinite(got)) and np.all(got[xs < -87.4] < 1.2e-38) and np.all(got > 0)


WEIGHTED = {
    # along its filters: the filters in vectors of filters
    "conv3x3": ([_node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], (1, 16, 8, 8), (1, 32, 8, 8),
                {"w": _conv(32, 16, 3), "b": _weight(32)}),
    # B in strips of column vectors
    "matmul": ([_node("MatMul", ["x", "w"])], (48, 256), (48, 128), {"w": _weight(256, 128)}),
}


@pytest.mark.parametrize("name", list(WEIGHTED))
@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_models_weights_are_laid_out_once_before_the_calls(tmp_path, dev, name):
    """A model's weights are laid out in their register-tile strips once, before the calls
    (`CpuPlan.prepacked`), as ONNX Runtime packs its weights when the session starts. The
    importer names the parameters a weight fills (`TensorExpr.constants`); a kernel laying one
    out takes it laid out (its argument has the strips' shape, as many elements), copies none
    of it per call (no copy priced), and the library's own function lays it out; the model run
    that way matches ONNX Runtime."""
    from workbench.rtile.model.cpu import packed_bytes
    from workbench.rtile.plan import cpu_plan

    nodes, x_shape, y_shape, inits = WEIGHTED[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model(nodes, x_shape, y_shape, inits), path)
    mc = pipeline.construct_model(path, dev, options=pipeline.Options(topk=5))
    (r,) = mc.results
    expr = r.construction.expr
    assert expr.constants == tuple(a.name for a in expr.args[1:-1])  # the weights (and bias); not x
    laid_out = [(c.program, cpu_plan(c.program, dev)) for c in r.candidates if cpu_plan(c.program, dev).prepacked]
    assert laid_out, [cpu_plan(c.program, dev) for c in r.candidates]
    for program, plan in laid_out:
        if set(plan.packed) <= set(plan.prepacked):
            assert packed_bytes(program, dev) == 0
        kernel = build_kernel(expr, program, dev)
        assert kernel.ok, kernel.error
        assert len(kernel.prepacked) == len(plan.prepacked)
        for p in kernel.prepacked:
            assert expr.args[p.index].name in plan.prepacked
            assert p.shape != expr.args[p.index].shape and np.prod(p.shape) == np.prod(expr.args[p.index].shape)
    local = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=5))
    (r,) = local.results
    rank = next((c.rank for c in r.candidates if cpu_plan(c.program, local.device).prepacked), None)
    assert rank is not None
    kernels = build_model_kernels(local, rank=rank)
    assert kernels[0].prepacked and kernels[0].scheduled, kernels[0].error
    inputs = model_inputs(local.model, 0)
    (ours,) = run_model(local, kernels, inputs)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert np.allclose(ours, expected, rtol=RTOL, atol=ATOL), float(np.max(np.abs(ours - expected)))
