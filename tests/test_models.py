"""Whole-model construction: ONNX import through Relax fusion, the TensorExpr of fused operators,
candidates for every operator, the report of `workbench model`, running the models' kernels
against onnxruntime / numpy, and bad model files."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers import device, expr, user_error_in_child
from onnx import TensorProto, helper, numpy_helper

from workbench import pipeline
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.fmt import duration
from workbench.models.construction import OperatorResult, construct_model, report_dict, report_text, roperators
from workbench.models.execute import build_model_kernels, model_inputs, planned_run, run_model
from workbench.models.onnx_import import MAX_MODEL_BYTES, MAX_MODEL_ELEMENTS, Operator, import_model
from workbench.models.rammer import schedule
from workbench.ops.shapes import MAX_ELEMENTS

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
NAMES = ("mlp", "bert_layer", "resnet_block", "mobilenet_block", "shufflenet_block", "mlp_dynamic")


@cache
def imported(name):
    return import_model(SAMPLES / f"{name}.onnx")


@cache
def constructed(name, dev):
    return construct_model(imported(name), device(dev))


@cache
def kernels_of(name):
    return build_model_kernels(constructed(name, "local-cpu"))


def operator(model, name):
    return next(op for op in imported(model).operators if op.name == name)


@pytest.mark.parametrize("dev", ["h100", "local-cpu"])
@pytest.mark.parametrize("name", NAMES)
def test_every_operator_of_the_samples_gets_candidates(name, dev):
    mc = constructed(name, dev)
    assert len(mc.results) == len(imported(name).operators) >= 3
    for r in mc.results:
        assert r.supported, f"{r.operator.name}: {r.reason}"
        assert [c.rank for c in r.candidates] == list(range(1, len(r.candidates) + 1))
    assert mc.plan.veus == device(dev).compute_units


def test_grouped_convs_shuffles_and_flatten_get_candidates_on_the_v100():
    mc = constructed("shufflenet_block", "v100")
    assert all(r.supported for r in mc.results), [(r.operator.name, r.reason) for r in mc.results if not r.supported]
    assert report_dict(mc)["not_constructed"] == []


def test_grouped_conv_splits_its_output_channel_into_group_and_channel_in_group():
    """The ShuffleNet v1 unit's 1x1 conv in 3 groups, 24 -> 12 channels: output channel
    ff = 4 g + j reads input channels 8 g .. 8 g + 7, so ff is split into (ff_0, ff_1) = (g, j)."""
    op = operator("shufflenet_block", "fused_conv2d_multiply_add1_relu")
    e = op.expr
    assert e.main_block == "group_conv2d_nchw"
    assert [(a.name, a.extent, a.kind) for a in e.axes] == [
        ("nn", 1, "spatial"), ("ff_0", 3, "spatial"), ("ff_1", 4, "spatial"), ("yy", 16, "spatial"), ("xx", 16, "spatial"),
        ("rc", 8, "reduce"), ("ry", 1, "reduce"), ("rx", 1, "reduce"),
    ]
    data, kernel, out = e.tensors
    assert data.index[1] == ((0, 8, 0, 0, 0, 1, 0, 0), 0)
    assert kernel.index[0] == out.index[1] == ((0, 4, 1, 0, 0, 0, 0, 0), 0)
    # the AlexNet-style conv in 2 groups (24 -> 32 channels, 3x3) keeps its bias and ReLU epilogue
    alex = operator("shufflenet_block", "fused_conv2d4_add5_relu2").expr
    assert [(a.name, a.extent) for a in alex.axes[:3]] == [("nn", 1), ("ff_0", 2), ("ff_1", 16)]


def test_shuffles_and_flatten_are_affine_copies_and_inference_leaves_single_outputs():
    model = imported("shufflenet_block")
    kinds = {op.name: op.kind for op in model.operators}
    assert all(len(op.outputs) == 1 for op in model.operators)
    assert not any("dropout" in name or "split" in name for name in kinds)  # identity; one slice per part
    assert kinds["reshape7"] == kinds["strided_slice1"] == "layout"
    flatten = operator("shufflenet_block", "reshape7").expr  # [1, 32, 8, 8] -> [1, 2048]
    assert [(a.name, a.extent) for a in flatten.axes] == [("v0", 1), ("v1_0", 32), ("v1_1", 8), ("v1_2", 8)]
    assert flatten.output.index[1] == ((0, 64, 8, 1), 0) and flatten.flops == 1  # a copy: bandwidth only
    shuffle = operator("shufflenet_block", "fused_reshape1_transpose_reshape2").expr
    assert [(a.name, a.extent) for a in shuffle.axes[1:3]] == [("v1_0", 4), ("v1_1", 3)]
    # output channel 3 a + b reads channel 4 b + a (3 groups of 4)
    assert shuffle.output.index[1][0][1:3] == (3, 1) and shuffle.inputs[0].index[1][0][1:3] == (1, 4)


def test_batch_norm_at_inference_folds_into_the_convolution_before_it(tmp_path):
    """Conv, BatchNormalization, Relu and a batch norm of the input alone: the first becomes one
    kernel (x * scale + shift, the constants folded from the weights, is the conv's epilogue),
    the second an elementwise kernel; both against ONNX Runtime, with parameters far from the
    identity (gamma, var in [0.5, 2], beta, mean in [-1, 1]) so a swapped scale and shift or a
    missing epsilon shows."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(11)
    inits = _weights(rng, w=(8, 4, 3, 3))
    for tag, c in (("c", 8), ("x", 4)):
        inits += [numpy_helper.from_array(rng.uniform(lo, hi, c).astype(np.float32), f"{name}_{tag}")
                  for name, lo, hi in (("gamma", 0.5, 2), ("beta", -1, 1), ("mean", -1, 1), ("var", 0.5, 2))]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c", "gamma_c", "beta_c", "mean_c", "var_c"], ["n"], epsilon=1e-3),
        node("Relu", ["n"], ["y"]),
        node("BatchNormalization", ["x", "gamma_x", "beta_x", "mean_x", "var_x"], ["z"], epsilon=1e-3),
    ]
    outputs = [_tensor("y", [1, 8, 6, 6]), _tensor("z", [1, 4, 6, 6])]
    path = _save(tmp_path / "bn.onnx", nodes, [_tensor("x", [1, 4, 6, 6])], outputs, inits)
    model = import_model(path)
    conv, norm = model.operators  # no batch-norm kernel of its own
    assert conv.kind == "reduction" and conv.name.startswith("fused_conv2d_multiply_add") and conv.name.endswith("relu")
    assert norm.kind == "elementwise" and norm.name.startswith("fused_multiply")
    mc = construct_model(model, device("local-cpu"))
    x = rng.uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32)
    got = run_model(mc, build_model_kernels(mc), {"x": x})
    for out, expected in zip(got, ort.InferenceSession(str(path)).run(None, {"x": x})):
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_a_parameter_is_constant_only_where_every_call_passes_a_weight(tmp_path):
    """Two matmuls of one shape share one PrimFunc (and one kernel): where both pass a weight as
    B, that parameter is one of the expression's `constants` (laid out ahead, `CpuPlan.prepacked`);
    where one passes an activation, it is not, for either call. x is never constant."""
    rng = np.random.default_rng(3)
    node = helper.make_node
    both = [node("MatMul", ["x", "w1"], ["h"]), node("MatMul", ["h", "w2"], ["y"])]
    path = _save(tmp_path / "both.onnx", both, [_tensor("x", [8, 8])], [_tensor("y", [8, 8])],
                 _weights(rng, w1=(8, 8), w2=(8, 8)))
    first, second = import_model(path).operators
    assert first.func_name == second.func_name
    assert first.expr.constants == second.expr.constants == (first.expr.args[1].name,)
    mixed = [node("MatMul", ["x", "w1"], ["h"]), node("MatMul", ["h", "x"], ["y"])]
    path = _save(tmp_path / "mixed.onnx", mixed, [_tensor("x", [8, 8])], [_tensor("y", [8, 8])], _weights(rng, w1=(8, 8)))
    first, second = import_model(path).operators
    assert first.func_name == second.func_name
    assert first.expr.constants == second.expr.constants == ()


@pytest.mark.parametrize("opset", [7, 10, 13])
@pytest.mark.parametrize("outputs", [("d",), ("d", "mask")])
def test_dropout_is_the_identity_at_inference(tmp_path, opset, outputs):
    """Gemm, ReLU, Dropout, Gemm: the Dropout (ratio as an attribute before opset 12, an input
    after; mask declared or not) leaves no second output, so both kernels are constructed."""
    inits = [numpy_helper.from_array(np.full(shape, 0.1, dtype=np.float32), name)
             for name, shape in (("w1", (32, 16)), ("b1", (32,)), ("w2", (10, 32)), ("b2", (10,)))]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["g"], transB=1),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Dropout", ["r"], list(outputs), **({"ratio": 0.5} if opset < 12 else {})),
        helper.make_node("Gemm", ["d", "w2", "b2"], ["y"], transB=1),
    ]
    path = _save(tmp_path / "drop.onnx", nodes, [_tensor("x", [2, 16])], [_tensor("y", [2, 10])], inits, opsets=(("", opset),))
    report = report_dict(construct_model(import_model(path), device("local-cpu")))
    assert [op["name"] for op in report["operators"]] == ["fused_matmul_add_relu", "fused_matmul1_add1"]
    assert all(op["supported"] for op in report["operators"]) and report["not_constructed"] == []


def test_a_dropout_mask_as_a_model_output_is_refused_in_one_line(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r"], ["y", "mask"])]
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [4, 16])
    path = _save(tmp_path / "mask.onnx", nodes, [_tensor("x", [4, 16])], [_tensor("y", [4, 16]), mask], opsets=(("", 13),))
    with pytest.raises(UserError, match="^mask: a model output is a constant \\(a Dropout mask"):
        import_model(path)


def test_a_grouped_conv_kernel_builds_and_matches_numpy_on_this_cpu():
    from workbench.codegen.build import build_kernel
    from workbench.codegen.verify import verify

    e = expr("group_conv2d", N=1, C=6, H=9, W=9, F=8, KH=3, KW=3, stride=1, pad=1, groups=2)
    c = construct(e, device("local-cpu"))
    assert c.candidates and [a.name for a in c.expr.axes][1:3] == ["f_0", "f_1"]
    kernel = build_kernel(c.expr, c.candidates[0].program, device("local-cpu"))
    assert kernel.ok, kernel.error
    check = verify(kernel, c.expr)
    assert check.correct, check.error


def test_dataflow_graph_of_the_mlp():
    model = imported("mlp")
    assert model.inputs == (("x", (8, 256), "float32"),)
    assert [op.preds for op in model.operators] == [(), (0,), (1,)]
    assert model.outputs == ((2, 0),)
    assert [op.outputs for op in model.operators] == [(((8, 256), "float32"),), (((8, 128), "float32"),), (((8, 10), "float32"),)]
    # Gemm(transB=1)'s transpose of a constant weight is folded away, not a kernel.
    assert all(op.kind == "reduction" for op in model.operators)
    assert model.constants[model.operators[2].args[1].ref].shape == (128, 10)


def test_fused_conv_bias_relu6_maps_to_its_convolution():
    op = operator("mobilenet_block", "fused_conv2d_add_maximum_minimum")
    e = op.expr
    assert e.main_block == "conv2d_nchw"
    assert [(a.name, a.extent, a.kind) for a in e.axes] == [
        ("nn", 1, "spatial"), ("ff", 96, "spatial"), ("yy", 16, "spatial"), ("xx", 16, "spatial"),
        ("rc", 32, "reduce"), ("ry", 1, "reduce"), ("rx", 1, "reduce"),
    ]
    assert [t.name for t in e.tensors] == ["x", "param_0", "T_minimum_intermediate"]
    tile = (1, 8, 4, 4, 16, 1, 1)
    assert [e.data_tile_shape(t, tile) for t in range(3)] == [(1, 16, 4, 4), (8, 16, 1, 1), (1, 8, 4, 4)]


def test_a_fused_residual_and_the_bn_vectors_are_the_epilogues_inputs():
    """The ResNet block's second conv reads the block's input `x` only in its epilogue (the
    residual add) and BatchNorm's scale and shift per channel: those, not the conv's own input
    and filters, are its epilogue's inputs, which the model prices as read once
    (`model.cpu.epilogue_read_seconds`); the first conv's epilogue reads a bias and BN's two
    vectors, the pool nothing beyond its input."""
    second = operator("resnet_block", "fused_conv2d_multiply_add_add2_relu").expr
    assert [t.name for t in second.inputs] == ["lv7", "param_0"]
    assert second.epilogue_input_bytes == 4 * (64 * 16 * 16 + 64 + 64)
    assert operator("resnet_block", "fused_conv2d_add_multiply_add_relu").expr.epilogue_input_bytes == 4 * 3 * 64
    assert operator("resnet_block", "max_pool2d").expr.epilogue_input_bytes == 0


def test_padded_3x3_conv_reads_a_halo_and_depthwise_reads_its_own_channel():
    conv = operator("resnet_block", "fused_conv2d_add_multiply_add_relu").expr
    assert conv.tensors[0].shape == (1, 64, 18, 18)  # the padded data, read through the pad block
    assert conv.data_tile_shape(0, (1, 8, 4, 4, 8, 3, 3)) == (1, 8, 6, 6)
    dw = operator("mobilenet_block", "fused_conv2d1_add_maximum_minimum").expr
    assert dw.main_block == "group_conv2d_nchw"
    assert dw.data_tile_shape(0, (1, 8, 4, 4, 1, 3, 3)) == (1, 8, 6, 6)  # channel ff + rc, rc < 1


def test_layout_and_row_operators_of_the_encoder_layer():
    kinds = {op.name: op.kind for op in imported("bert_layer").operators}
    assert kinds["softmax"] == kinds["layer_norm"] == "multi-reduction"
    assert kinds["fused_reshape_transpose"] == "layout"  # K's transpose to [b, heads, dh, s]
    # the head merge (transpose then reshape) is the P V matmul's epilogue, writing [1, 32, 128]
    merge = operator("bert_layer", "batch_matmul1")
    assert merge.expr.main_block == "matmul" and merge.expr.epilogues == ("T_layout",)
    assert merge.outputs == (((1, 32, 128), "float32"),)
    # the GELU epilogue chain is inlined into one block after the matmul
    gelu = operator("bert_layer", "fused_matmul1_add2_divide_erf_multiply1_add3_multiply2")
    assert gelu.expr.main_block == "matmul" and len(_blocks(gelu.func)) == 2


def _blocks(func):
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def test_a_primfunc_called_twice_is_constructed_once():
    mc = constructed("bert_layer", "h100")
    by_name = {r.operator.name: r for r in mc.results}
    assert by_name["fused_matmul_add#3"].construction is by_name["fused_matmul_add"].construction


def test_the_front_door_reads_the_model_file_and_names_the_device():
    report = report_dict(pipeline.construct_model(str(SAMPLES / "mlp.onnx"), "h100"))
    assert [op["name"] for op in report["operators"]] == [r.operator.name for r in constructed("mlp", "h100").results]
    assert report["inputs"] == [{"name": "x", "shape": [8, 256], "dtype": "float32"}]


@pytest.mark.parametrize("name", NAMES)
def test_report_follows_the_cli_contract(name):
    report = report_dict(constructed(name, "h100"))
    json.dumps(report)
    assert (report["model"], report["device"], report["policy"]) == (name, "h100", "roller")
    for op in report["operators"]:
        assert {"name", "kind", "shapes", "candidates", "predicted_seconds", "supported", "reason"} <= set(op)
        assert op["predicted_seconds"] == op["candidates"][0]["predicted_seconds"] > 0
    total, launch = report["predicted_seconds"], report["launch_overhead"]
    # one launch per kernel one at a time, one for the co-schedule's rProgram (h100: 5 us, an estimate)
    assert launch["seconds_per_launch"] == pytest.approx(5e-6) and launch["source"].startswith("estimate")
    assert (launch["sum_launches"], launch["coscheduled_launches"]) == (len(report["operators"]), 1)
    assert total["sum"] == pytest.approx(sum(op["predicted_seconds"] for op in report["operators"])
                                         + len(report["operators"]) * 5e-6)
    assert 5e-6 < total["coscheduled"] <= total["sum"] * (1 + 1e-9)
    schedule = report["schedule"]
    assert schedule["veus"] == 132 and schedule["predicted_seconds"] == total["coscheduled"]
    scheduled = [o["name"] for w in schedule["waves"] for o in w["operators"]]
    assert sorted(scheduled) == sorted(op["name"] for op in report["operators"])
    assert all(0 <= t["veu"] < 132 for w in schedule["waves"] for t in w["tasks"])


@pytest.mark.parametrize("dev", ["h100", "local-cpu"])
def test_the_coschedule_is_priced_with_one_launch_and_one_at_a_time_with_one_per_kernel(dev):
    """Closed form on a constructed model: the plan with launches is the plan without them, one
    launch later; one at a time adds a launch per kernel. The text's totals line says so."""
    mc = constructed("bert_layer", dev)
    spec = device(dev)
    launch = spec.launch_seconds
    assert launch > 0 and mc.plan.launch_seconds == launch
    bare = schedule(roperators(mc.results, spec.compute_units), spec.compute_units)
    assert mc.plan.seconds == pytest.approx(bare.seconds + launch)
    assert mc.sum_seconds == pytest.approx(sum(r.predicted_seconds for r in mc.results) + len(mc.results) * launch)
    assert mc.sum_seconds == pytest.approx(mc.plan.sequential_seconds)
    assert mc.rammer_gain == pytest.approx(mc.sum_seconds / mc.plan.seconds) and mc.rammer_gain >= 1
    text = report_text(report_dict(mc)).splitlines()
    totals = next(line for line in text if line.startswith("predicted "))
    assert f"({len(mc.results)} launches)" in totals and "1 launch)" in totals
    assert totals.endswith(f"a launch {duration(launch)} included in both")


def test_independent_projections_share_a_wave():
    waves = report_dict(constructed("bert_layer", "h100"))["schedule"]["waves"]
    assert [o["name"] for o in waves[0]["operators"]] == ["fused_matmul_add", "fused_matmul_add#2", "fused_matmul_add#3"]


def test_mlp_kernels_match_numpy():
    mc = constructed("mlp", "local-cpu")
    kernels = kernels_of("mlp")
    assert all(k.scheduled and k.rank == 1 for k in kernels)
    x = np.random.default_rng(1).uniform(-1, 1, (8, 256)).astype(np.float32)
    (out,) = run_model(mc, kernels, {"x": x})
    w = [mc.model.constants[a.ref] for op in mc.model.operators for a in op.args if a.source == "constant"]
    h = np.maximum(x @ w[0] + w[1], 0)
    h = np.maximum(h @ w[2] + w[3], 0)
    np.testing.assert_allclose(out, h @ w[4] + w[5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_model_kernels_match_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    mc = constructed(name, "local-cpu")
    kernels = kernels_of(name)
    unscheduled = {k.name for k in kernels if not k.scheduled}
    # only the row operators with several reductions fall back to TVM's default lowering
    assert unscheduled <= {"softmax", "layer_norm", "layer_norm#2"}
    assert all(k.error for k in kernels if not k.scheduled)
    (name_in, shape, _), = mc.model.inputs
    x = np.random.default_rng(2).uniform(-1, 1, shape).astype(np.float32)
    (out,) = run_model(mc, kernels, {name_in: x})
    (expected,) = ort.InferenceSession(str(SAMPLES / f"{name}.onnx")).run(None, {name_in: x})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_running_refuses_wrong_inputs_and_gpu_devices():
    mc = constructed("mlp", "local-cpu")
    kernels = kernels_of("mlp")
    with pytest.raises(UserError, match="missing input 'x'"):
        run_model(mc, kernels, {})
    with pytest.raises(UserError, match=r"shape \(2, 2\)"):
        run_model(mc, kernels, {"x": np.zeros((2, 2))})
    with pytest.raises(UserError, match="CPU device"):
        build_model_kernels(constructed("mlp", "h100"))


# --- bad model files -----------------------------------------------------------------------


def _save(path, nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    path.write_bytes(model.SerializeToString())
    return path


def _tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_missing_directory_empty_and_corrupt_files(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        import_model(tmp_path / "absent.onnx")
    with pytest.raises(UserError, match="not a regular file \\(a directory\\)"):
        import_model(tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "text.onnx").write_text("this is not a model\n")
    (tmp_path / "noise.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    for name in ("empty.onnx", "text.onnx", "noise.onnx"):
        with pytest.raises(UserError, match="not an ONNX model"):
            import_model(tmp_path / name)


def test_oversized_file_is_refused_before_reading(tmp_path):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(MAX_MODEL_BYTES + 1)  # sparse: no disk or time spent
    with pytest.raises(UserError, match=f"over the {MAX_MODEL_BYTES:,}-byte limit"):
        import_model(big)


def test_invalid_graph_and_operators_tvm_cannot_import(tmp_path):
    dangling = _save(tmp_path / "dangling.onnx", [helper.make_node("Relu", ["nowhere"], ["y"])], [_tensor("x", [4])], [_tensor("y", [4])])
    with pytest.raises(UserError, match="invalid ONNX model"):
        import_model(dangling)
    custom = _save(
        tmp_path / "custom.onnx",
        [helper.make_node("Foo", ["x"], ["y"], domain="com.example")],
        [_tensor("x", [4])], [_tensor("y", [4])], opsets=(("", 17), ("com.example", 1)),
    )
    with pytest.raises(UserError, match="not supported.*Foo"):
        import_model(custom)


def _child_error(path) -> str:
    return user_error_in_child("workbench.pipeline", 'construct_model(PATH, "xeon-avx512")', path)


def test_a_tiny_file_declaring_a_huge_tensor_is_refused_before_import(tmp_path):
    shape = [100000, 100000, 100000]
    path = _save(tmp_path / "huge.onnx", [helper.make_node("Relu", ["X"], ["Y"])], [_tensor("X", shape)], [_tensor("Y", shape)])
    assert path.stat().st_size < 120  # the reproducer was 89 bytes
    assert _child_error(path) == (
        "huge.onnx: tensor X has shape 100000x100000x100000 = 1000000000000000 elements, "
        "over the limit of 2147483647 (int32 indexing)"
    )


@pytest.mark.parametrize("keep", [200, 0.5])
def test_a_truncated_model_is_one_line_exit_2(tmp_path, keep):
    """A real model cut short (a download stopped halfway): the CLI says so in one line, exit 2,
    in a child process with a time limit and its address space capped at 4 GiB, so that reading
    a corrupt length as an allocation would fail the test instead of the machine."""
    data = (SAMPLES / "mlp.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
            "from workbench.cli import main; sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", code, "model", str(path), "--device", "local-cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"workbench: error: {path}: not an ONNX model")


@pytest.mark.parametrize("data", [b"", b"\0" * 16], ids=["no data", "16 bytes"])
def test_an_initializer_claiming_a_huge_shape_is_refused_before_import(tmp_path, data):
    """A weight whose dims claim 1e15 elements in a file of a hundred bytes: refused by its shape,
    never allocated (the child would run for hours or be killed)."""
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[100000, 100000, 100000], raw_data=data)
    path = _save(tmp_path / "weight.onnx", [helper.make_node("Add", ["x", "W"], ["y"])], [_tensor("x", [4])],
                 [_tensor("y", [4])], inits=[weight])
    assert path.stat().st_size < 200
    assert _child_error(path) == (
        "weight.onnx: tensor W has shape 100000x100000x100000 = 1000000000000000 elements, "
        "over the limit of 2147483647 (int32 indexing)"
    )


def test_a_huge_tensor_the_file_does_not_declare_is_refused_after_import(tmp_path):
    """An Expand to a constant shape: the graph declares the output's dimensions by name only."""
    target = numpy_helper.from_array(np.array([100000, 100000, 100000], dtype=np.int64), "target")
    path = _save(
        tmp_path / "expand.onnx",
        [helper.make_node("Expand", ["X", "target"], ["E"]), helper.make_node("Relu", ["E"], ["Y"])],
        [_tensor("X", [1])], [_tensor("Y", ["a", "b", "c"])], inits=[target],
    )
    message = _child_error(path)
    assert message.startswith("expand.onnx: tensor ") and "(computed by the model) has shape 100000x100000x100000" in message


def test_all_tensors_of_a_model_together_are_capped(tmp_path):
    """Five tensors just under the per-tensor cap: each is fine, all together are not."""
    shape, names = [MAX_ELEMENTS], ["X", "A", "B", "C", "Y"]
    nodes = [helper.make_node("Relu", [a], [b]) for a, b in zip(names, names[1:])]
    graph = helper.make_graph(nodes, "g", [_tensor("X", shape)], [_tensor("Y", shape)], value_info=[_tensor(n, shape) for n in names[1:-1]])
    path = tmp_path / "chain.onnx"
    path.write_bytes(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(UserError, match=f"chain.onnx: its tensors hold {5 * MAX_ELEMENTS:,} elements in all, over the limit of {MAX_MODEL_ELEMENTS:,}"):
        import_model(path)


def test_weights_stored_outside_the_file_are_refused(tmp_path):
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "weights.bin"), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    path = _save(tmp_path / "ext.onnx", [helper.make_node("Add", ["x", "W"], ["y"])], [_tensor("x", [4])], [_tensor("y", [4])], inits=[weight])
    with pytest.raises(UserError, match="ext.onnx: weight W is stored outside the file"):
        import_model(path)


def test_a_fifo_model_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)  # no writer: reading it would block forever
    assert _child_error(fifo) == f"model {fifo}: not a regular file (a FIFO)"


def _dims_model(path):
    """Four matmul-class operators and two others over inputs with the symbolic dims batch, seq
    and b: relu(z) depends on none; x[batch,4] @ relu(z) has M = batch; q[seq,8] @ q^T has M and
    N = seq (with the transpose); a[b,4,8] @ c[b,8,5] has B = b."""
    nodes = [helper.make_node("Relu", ["z"], ["rz"]), helper.make_node("MatMul", ["x", "rz"], ["y1"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0]), helper.make_node("MatMul", ["q", "qt"], ["y2"]),
             helper.make_node("MatMul", ["a", "c"], ["y3"])]
    inputs = [_tensor("x", ["batch", 4]), _tensor("z", [4, 6]), _tensor("q", ["seq", 8]), _tensor("a", ["b", 4, 8]),
              _tensor("c", ["b", 8, 5])]
    return _save(path, nodes, inputs, [_tensor("y1", ["batch", 6]), _tensor("y2", ["seq", "seq"]), _tensor("y3", ["b", 4, 5])])


def test_symbolic_dims_are_bound_and_the_operators_depending_on_each_listed(tmp_path):
    model = import_model(_dims_model(tmp_path / "dims.onnx"), {"seq": 3, "b": 2})
    assert model.inputs == (("x", (1, 4), "float32"), ("z", (4, 6), "float32"), ("q", (3, 8), "float32"),
                            ("a", (2, 4, 8), "float32"), ("c", (2, 8, 5), "float32"))
    dims = {d.name: d for d in model.dims}
    assert [(d.name, d.value, d.default) for d in model.dims] == [("batch", 1, True), ("seq", 3, False), ("b", 2, False)]
    assert dims["batch"].operators == ("matmul",) and dims["seq"].operators == ("transpose", "matmul1")
    assert dims["b"].operators == ("matmul2",)  # relu(z) depends on no dim
    (mm,) = dims["batch"].matmuls
    assert (mm.operator, mm.dynamic, mm.value, dict(mm.params)["K"], dict(mm.params)["N"]) == ("matmul", "M", 1, 4, 6)
    (square,) = dims["seq"].matmuls
    assert square.params == () and square.reason.startswith("M and N depend on seq")
    (bmm,) = dims["b"].matmuls
    assert (bmm.dynamic, bmm.value, dict(bmm.params)["M"]) == ("B", 2, 4)
    report = report_dict(construct_model(model, device("h100")))
    assert report["symbolic_dims"]["batch"] == {
        "value": 1, "default": True, "operators": ["matmul"], "note": "",
        "vortex": [{"operator": "matmul", "dynamic": "M", "value": 1, "reason": "",
                    "command": "workbench vortex compile --op matmul --shape M=dyn,K=4,N=6 --device h100 --out DIR"}]}
    assert report["symbolic_dims"]["seq"]["vortex"][0]["command"] is None
    text = report_text(report).splitlines()
    assert text[1] == "symbolic dims: batch=1 (default; --dim batch=N to choose), seq=3, b=2"
    assert "  seq: 2 operators depend on it: transpose, matmul1" in text
    assert "    matmul1: no Vortex command (M and N depend on seq; Vortex compiles a matmul with one dynamic " \
           "extent, one of M, B)" in text


def test_a_static_model_has_no_symbolic_dims_and_refuses_a_dim():
    assert imported("mlp").dims == () and report_dict(constructed("mlp", "h100"))["symbolic_dims"] == {}
    with pytest.raises(UserError, match=r"^mlp.onnx: --dim batch: the model has no symbolic dim 'batch' \(it has no"):
        import_model(SAMPLES / "mlp.onnx", {"batch": 2})


def test_a_huge_binding_is_refused_before_import(tmp_path, monkeypatch):
    """The caps apply to the bound shapes, before TVM's importer sees the model."""
    from workbench.models import onnx_import

    def never(*_):
        raise AssertionError("imported a model over the caps")

    monkeypatch.setattr(onnx_import, "fused_module", never)
    with pytest.raises(UserError) as err:
        import_model(SAMPLES / "mlp_dynamic.onnx", {"batch": 10**9})
    assert str(err.value) == ("mlp_dynamic.onnx: tensor x has shape 1000000000x1x128 = 128000000000 elements, "
                              "over the limit of 2147483647 (int32 indexing)")


def test_an_input_dim_with_neither_size_nor_name_is_refused(tmp_path):
    path = _save(tmp_path / "dyn.onnx", [helper.make_node("Relu", ["x"], ["y"])], [_tensor("x", [None, 4])],
                 [_tensor("y", [None, 4])])
    with pytest.raises(UserError, match="dyn.onnx: input x has a dimension with neither a size nor a name"):
        import_model(path)


@pytest.mark.parametrize("dims", [{}, {"batch": 3, "seq": 7}], ids=["defaults", "batch=3,seq=7"])
def test_the_symbolic_sample_runs_against_onnxruntime_at_its_bound_shapes(dims):
    """`workbench model --run` on mlp_dynamic.onnx at two bindings: inputs at the bound shapes,
    ONNX Runtime given the same, TVM's default build imported at the same values."""
    pytest.importorskip("onnxruntime")
    from workbench.models.run import run_model_report

    model = import_model(SAMPLES / "mlp_dynamic.onnx", dims)
    shape = (dims.get("batch", 1), dims.get("seq", 1), 128)
    assert model.inputs == (("x", shape, "float32"),)
    assert [d.operators for d in model.dims] == [("fused_matmul_add_relu", "fused_matmul1_add1_add2", "layer_norm")] * 2
    run = run_model_report(construct_model(model, device("local-cpu")), SAMPLES / "mlp_dynamic.onnx")
    assert run.outputs_match and run.max_abs_error <= 1e-4
    assert run.tvm_default_seconds is not None, run.tvm_default_error  # built at the same shapes


DECODER = SAMPLES / "decoder_dynamic.onnx"


@cache
def decoder(seq):
    return import_model(DECODER, {"seq": seq})


@pytest.mark.parametrize("seq", [5, 77])
def test_the_decoder_sample_imports_at_any_length_and_matches_onnxruntime(seq):
    """The head split's shape (Shape, Slice, Concat), the merge's [0, -1, 96] and the causal
    mask (ConstantOfShape, Trilu) follow the bound `seq`; every operator depends on it, is
    constructed and runs as ONNX Runtime does."""
    ort = pytest.importorskip("onnxruntime")
    model = decoder(seq)
    assert model.inputs == (("x", (1, seq, 96), "float32"),)
    (dim,) = model.dims
    assert (dim.name, dim.value, dim.default) == ("seq", seq, False)
    assert dim.operators == tuple(op.name for op in model.operators)
    mc = construct_model(model, device("local-cpu"))
    assert [r.reason for r in mc.results if not r.supported] == []
    x = np.random.default_rng(seq).uniform(-1, 1, (1, seq, 96)).astype(np.float32)
    (out,) = run_model(mc, build_model_kernels(mc), {"x": x})
    (expected,) = ort.InferenceSession(str(DECODER)).run(None, {"x": x})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_the_head_split_and_merge_fuse_into_the_attention_matmuls(monkeypatch):
    """Q's and V's head split (Reshape + Transpose) become index remaps of the batched matmuls'
    reads, the head merge the P V matmul's write: 15 operators become 12, one copy left (K's
    transpose to [b, heads, dh, s], which a fused read would stride along the vectorised N)."""
    from workbench.models import onnx_import
    from workbench.models.symbolic import matmul_params

    fused = decoder(77)
    assert len(fused.operators) == 12
    assert [op.name for op in fused.operators if op.kind == "layout"] == ["fused_reshape_transpose"]
    scores, context = (op for op in fused.operators if "batch_matmul" in op.name)
    assert scores.name == "fused_batch_matmul_multiply_where"  # scale and causal mask as its epilogue
    assert [a.shape for a in scores.args[:2]] == [(1, 77, 96), (1, 4, 24, 77)]  # Q read from its projection
    assert [a.shape for a in context.args] == [(1, 4, 77, 77), (1, 77, 96)]  # V read from its projection
    assert context.outputs == (((1, 77, 96), "float32"),)  # heads merged in the write
    q = scores.expr.inputs[0]
    assert q.index[-1] == ((0, 24, 0, 0, 1), 0)  # q[b, i, h * 24 + k]
    assert [{k: matmul_params(op.expr)[k] for k in ("B", "M", "N", "K")} for op in (scores, context)] == [
        {"B": 4, "M": 77, "N": 77, "K": 24}, {"B": 4, "M": 77, "N": 24, "K": 77}]  # one operator over the heads
    assert [op.kind for op in decoder(1).operators] == [op.kind for op in fused.operators]  # at a length of 1 too
    monkeypatch.setattr(onnx_import, "fuse_matmul_layouts", lambda mod: mod)
    unfused = import_model(DECODER, {"seq": 77})
    assert len(unfused.operators) == 15 and sum(op.kind == "layout" for op in unfused.operators) == 4


def test_a_merge_that_is_the_models_output_and_a_transposed_write_back(tmp_path):
    """The merged heads as the graph's output (a var outside the dataflow) are written by the
    matmul; a transpose that moves the product's last dimension stays a copy (its write-back
    would store along a strided dimension). Both run as numpy computes them."""
    node = helper.make_node
    nodes = [node("MatMul", ["a", "b"], ["p"]), node("Transpose", ["p"], ["t"], perm=[0, 2, 1, 3]),
             node("Reshape", ["t", "shape"], ["y"]),
             node("MatMul", ["a", "b"], ["p2"]), node("Transpose", ["p2"], ["z"], perm=[0, 1, 3, 2])]
    path = _save(tmp_path / "merge.onnx", nodes, [_tensor("a", [1, 2, 4, 3]), _tensor("b", [1, 2, 3, 5])],
                 [_tensor("y", [1, 4, 10]), _tensor("z", [1, 2, 5, 4])], [_ints("shape", [1, 4, 10])])
    mc = construct_model(import_model(path), device("local-cpu"))
    assert [(r.operator.kind, r.operator.outputs[0][0]) for r in mc.results] == [
        ("reduction", (1, 4, 10)), ("reduction", (1, 2, 4, 5)), ("layout", (1, 2, 5, 4))]
    rng = np.random.default_rng(4)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((1, 2, 4, 3), (1, 2, 3, 5)))
    y, z = run_model(mc, build_model_kernels(mc), {"a": a, "b": b})
    np.testing.assert_allclose(y, (a @ b).transpose(0, 2, 1, 3).reshape(1, 4, 10), rtol=1e-6)
    np.testing.assert_allclose(z, (a @ b).transpose(0, 1, 3, 2), rtol=1e-6)


def test_a_fused_qkv_split_is_a_slice_offset_in_the_attention_reads(tmp_path):
    """A QKV projection split in three (Split: strided slices) then split into heads: Q and V
    are read from the one projection at their offsets; only K's copy is left."""
    model = import_model(_gpt_block(tmp_path / "gpt.onnx"))
    layouts = [op for op in model.operators if op.kind == "layout"]
    assert [op.args[0].shape for op in layouts] == [(1, 8, 96)]  # K's slice and transpose, one copy
    scores = next(op for op in model.operators if "batch_matmul" in op.name)
    q = scores.expr.inputs[0]
    assert q.shape == (1, 8, 96) and q.index[-1] == ((0, 16, 0, 0, 1), 0)  # q[b, i, h * 16 + k], offset 0
    context = [op for op in model.operators if "batch_matmul" in op.name][1]
    assert context.expr.inputs[1].index[-1] == ((0, 16, 0, 1, 0), 64)  # v at offset 2 * 32


def test_a_flatten_before_a_matmul_is_not_fused():
    """No transpose in the chain: shufflenet's Flatten stays its classifier's own copy."""
    kinds = [op.kind for op in imported("shufflenet_block").operators]
    assert kinds.count("layout") == 3 and imported("shufflenet_block").operators[-1].expr.main_block == "matmul"


@pytest.mark.parametrize("dims, message", [
    ({"len": 8}, "decoder_dynamic.onnx: --dim len: the model has no symbolic dim 'len' (its symbolic dims are seq)"),
    ({"seq": 0}, "--dim seq=0: seq must be a positive integer"),
    ({"seq": 2**31}, "--dim seq=2147483648: over the limit of 2147483647 elements of a tensor (int32 indexing)"),
    # the attention scores [1, heads, seq, seq], which the file declares nowhere
    ({"seq": 300_000}, "decoder_dynamic.onnx: tensor lv12 (computed by the model) has shape 1x4x300000x300000 = "
                       "360000000000 elements, over the limit of 2147483647 (int32 indexing)"),
])
def test_bad_decoder_lengths_are_one_line_errors(dims, message):
    with pytest.raises(UserError) as err:
        import_model(DECODER, dims)
    assert str(err.value) == message


def test_an_unmappable_operator_is_listed_and_the_rest_constructed(tmp_path):
    inits = [
        numpy_helper.from_array(np.array([3, 1, 0], dtype=np.int64), "idx"),
        numpy_helper.from_array(np.ones((16, 8), dtype=np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=0),
        helper.make_node("MatMul", ["g", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    path = _save(tmp_path / "gather.onnx", nodes, [_tensor("x", [4, 16])], [_tensor("y", [3, 8])], inits)
    report = report_dict(pipeline.construct_model(path, "h100"))
    gather, matmul = report["operators"]
    assert not gather["supported"] and "not affine" in gather["reason"] and gather["candidates"] == []
    assert gather["predicted_seconds"] is None
    assert matmul["supported"] and matmul["inputs"] == [gather["name"], "constant"]
    # the one constructed kernel and its launch: the unsupported operator is not priced at all
    assert report["predicted_seconds"]["sum"] == pytest.approx(matmul["predicted_seconds"] + 5e-6)
    assert report["launch_overhead"]["sum_launches"] == 1
    assert [o["name"] for w in report["schedule"]["waves"] for o in w["operators"]] == [matmul["name"]]
    assert report["not_constructed"] == [{"name": gather["name"], "kind": gather["kind"], "reason": gather["reason"]}]
    text = report_text(report)
    assert "unsupported: tensor x: index" in text and "1 constructed" in text and "co-scheduled" in text
    assert text.splitlines()[-2:] == [
        "WARNING: 1 of 2 operators not constructed and left out of the predicted times; they run TVM's default lowering:",
        f"WARNING:   {gather['name']}: {gather['reason']}"]


def test_a_split_becomes_one_kernel_per_part_and_still_runs(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Split", ["r"], ["a", "y"], axis=1, num_outputs=2),
        helper.make_node("Exp", ["a"], ["e"]),
    ]
    outputs = [_tensor("y", [4, 8]), _tensor("e", [4, 8])]
    path = _save(tmp_path / "split.onnx", nodes, [_tensor("x", [4, 16])], outputs, opsets=(("", 18),))
    mc = construct_model(import_model(path), device("local-cpu"))
    assert all(r.supported and len(r.operator.outputs) == 1 for r in mc.results)
    assert [r.operator.preds for r in mc.results] == [(), (0,), (0,)]  # relu, then each part reads it
    x = np.random.default_rng(3).uniform(-1, 1, (4, 16)).astype(np.float32)
    y, e = run_model(mc, build_model_kernels(mc), {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0)[:, 8:])
    np.testing.assert_allclose(e, np.exp(np.maximum(x, 0)[:, :8]), rtol=1e-6)


def test_a_multi_output_operator_is_listed_not_constructed():
    """A fused function still returning two tensors (none of the sample or test models has one
    after the inference rewrites) is kept, named and counted, not mapped."""
    from tvm import relax, te

    from workbench.models.onnx_import import _operator

    x = te.placeholder((4, 8), name="x")
    a = te.compute((4, 8), lambda i, j: x[i, j] + 1, name="a")
    b = te.compute((4, 8), lambda i, j: x[i, j] * 2, name="b")
    func = te.create_prim_func([x, a, b])
    ty = relax.TupleType([relax.TensorType((4, 8), "float32")] * 2)
    op = _operator(0, "two", "two", func, (), ty)
    assert op.kind == "multi-output" and op.expr is None and "returns 2 tensors" in op.reason
    result = OperatorResult(op, None)
    assert not result.supported and result.reason == op.reason


def _weights(rng, **shapes):
    return [numpy_helper.from_array((0.2 * rng.standard_normal(shape)).astype(np.float32), name) for name, shape in shapes.items()]


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _gpt_block(path):
    """A pre-LN decoder block with one fused QKV projection split in three, a causal mask, two
    heads and a GELU MLP (opset 20 has Gelu)."""
    s, d, heads = 8, 32, 2
    mask = numpy_helper.from_array(np.triu(np.full((s, s), -1e9, np.float32), 1), "mask")
    scale = numpy_helper.from_array(np.array((d // heads) ** -0.5, np.float32), "scale")
    inits = _weights(np.random.default_rng(5), wqkv=(d, 3 * d), wo=(d, d), w1=(d, 4 * d), w2=(4 * d, d), g=(d,), b=(d,))
    inits += [_ints("parts", [d, d, d]), _ints("heads", [1, s, heads, d // heads]), _ints("back", [1, s, d]), mask, scale]
    node = helper.make_node
    nodes = [
        node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
        node("MatMul", ["ln", "wqkv"], ["qkv"]),
        node("Split", ["qkv", "parts"], ["q0", "k0", "v0"], axis=-1),
        *(node("Reshape", [f"{t}0", "heads"], [f"{t}1"]) for t in "qkv"),
        node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k1"], ["k"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", "k"], ["s0"]), node("Mul", ["s0", "scale"], ["s1"]), node("Add", ["s1", "mask"], ["s2"]),
        node("Softmax", ["s2"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["o0"]),
        node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]), node("Reshape", ["o1", "back"], ["o2"]),
        node("MatMul", ["o2", "wo"], ["o3"]), node("Add", ["x", "o3"], ["h"]),
        node("MatMul", ["h", "w1"], ["f0"]), node("Gelu", ["f0"], ["f1"]), node("MatMul", ["f1", "w2"], ["f2"]),
        node("Add", ["h", "f2"], ["y"]),
    ]
    return _save(path, nodes, [_tensor("x", [1, s, d])], [_tensor("y", [1, s, d])], inits, opsets=(("", 20),))


def _cnn_ops(path):
    """CNN operators besides the sample models': LRN, PReLU, an inception-style concat, nearest
    upsampling (an index h // 2), a strided channel slice, average pooling, a reshape whose rows
    merge and re-split, softmax, a mean, Gemm."""
    inits = _weights(np.random.default_rng(6), w1=(8, 3, 3, 3), w2=(4, 8, 1, 1), w3=(4, 8, 3, 3), slope=(8, 1, 1),
                     wf=(10, 8), bf=(10,))
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    inits += [scales, _ints("start", [0]), _ints("end", [8]), _ints("axis", [1]), _ints("step", [2]),
              _ints("rows", [1, 8, 8]), _ints("mean_axis", [1])]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), node("LRN", ["c1"], ["n1"], size=3),
        node("PRelu", ["n1", "slope"], ["p1"]),
        node("MaxPool", ["p1"], ["m1"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
        node("Conv", ["m1", "w2"], ["a"]), node("Conv", ["m1", "w3"], ["b0"], pads=[1, 1, 1, 1]),
        node("HardSigmoid", ["b0"], ["b"]), node("Concat", ["a", "b"], ["cat"], axis=1),
        node("Resize", ["cat", "", "scales"], ["up"], mode="nearest"),
        node("Slice", ["up", "start", "end", "axis", "step"], ["sl"]),
        node("AveragePool", ["sl"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Reshape", ["ap", "rows"], ["r"]), node("Softmax", ["r"], ["sm"], axis=-1),
        node("ReduceMean", ["sm", "mean_axis"], ["mean"], keepdims=0), node("Gemm", ["mean", "wf", "bf"], ["y"], transB=1),
    ]
    return _save(path, nodes, [_tensor("x", [1, 3, 8, 8])], [_tensor("y", [1, 10])], inits, opsets=(("", 18),))


@pytest.mark.parametrize("make", [_gpt_block, _cnn_ops], ids=["gpt_block", "cnn_ops"])
def test_generated_models_are_constructed_whole_and_match_onnxruntime(tmp_path, make):
    ort = pytest.importorskip("onnxruntime")
    path = make(tmp_path / "model.onnx")
    model = import_model(path)
    for dev in ("v100", "local-cpu"):
        report = report_dict(construct_model(model, device(dev)))
        assert report["not_constructed"] == [], report["not_constructed"]
    mc = construct_model(model, device("local-cpu"))
    kernels = build_model_kernels(mc)
    assert {k.name for k in kernels if not k.scheduled} <= {"softmax", "layer_norm"}  # several reductions
    x = np.random.default_rng(7).uniform(-1, 1, model.inputs[0][1]).astype(np.float32)
    (out,) = run_model(mc, kernels, {"x": x})
    (expected,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_an_unknown_policy_is_refused_once():
    with pytest.raises(UserError, match="unknown policy 'gensor'"):
        construct_model(imported("mlp"), device("h100"), "gensor")


def test_an_operator_the_construction_refuses_is_listed(monkeypatch):
    import workbench.models.construction as model_module

    def refuse_wide(expr, dev, policy, options):
        if expr.axes[1].extent == 256:
            raise UserError("too wide")
        return construct(expr, dev, policy, options)

    monkeypatch.setattr(model_module, "construct", refuse_wide)
    mc = construct_model(imported("mlp"), device("h100"))
    assert [r.supported for r in mc.results] == [False, True, True]
    assert mc.results[0].reason == "too wide"
    assert [w.ops for w in mc.plan.waves] == [(0,), (1,)]


def test_dependencies_pass_through_unsupported_operators():
    relu = expr("relu", shape=(64, 64))
    c = construct(relu, device("h100"))

    def result(index, preds, supported):
        args = tuple(_arg(p) for p in preds)
        outputs = (((64, 64), "float32"),)
        op = Operator(index, f"op{index}", f"f{index}", "elementwise", args, outputs, relu if supported else None, "" if supported else "why")
        return OperatorResult(op, c if supported else None)

    results = [result(0, (), True), result(1, (0,), False), result(2, (1,), False), result(3, (2, 0), True)]
    a, b = roperators(results, 132)
    assert (a.name, a.preds) == ("op0", ()) and (b.name, b.preds) == ("op3", (0,))


def _arg(producer):
    from workbench.models.onnx_import import Arg

    return Arg("operator", producer, (64, 64), "float32")


def test_run_report_finds_outputs_off_by_more_than_the_tolerance(monkeypatch):
    pytest.importorskip("onnxruntime")
    from workbench.models import run

    mc = constructed("mlp", "local-cpu")
    (x,) = model_inputs(mc.model, 0).values()
    assert x.min() < -0.9 and x.max() > 0.9  # no underflow: inputs of order 1 of both signs
    good = run.run_model_report(mc, SAMPLES / "mlp.onnx")
    assert good.outputs_match and len(good.operators) == len(mc.results)
    off = 10 * (run.ATOL + run.RTOL)  # beyond the tolerance on every output of magnitude <= 9
    def off_by(*args):
        planned = planned_run(*args)
        return replace(planned, outputs=tuple(o + off for o in planned.outputs))

    monkeypatch.setattr(run, "planned_run", off_by)
    bad = run.run_model_report(mc, SAMPLES / "mlp.onnx")
    assert not bad.outputs_match and bad.max_abs_error == pytest.approx(off, rel=1e-2)
    assert "outputs DO NOT match ONNX Runtime" in bad.text()


def test_run_report_checks_nothing_against_constant_outputs(tmp_path):
    """A model whose weights are constants (onnx's `light_*.onnx` test models: every class of
    SqueezeNet's softmax 0.001) gives ONNX Runtime's outputs one value each, which any kernel
    writing that value matches: the run says it checked nothing, and does not report a match.
    Here a matmul by a weight of zeros, on the seeded inputs of both signs."""
    pytest.importorskip("onnxruntime")
    from workbench.models import run

    weight = numpy_helper.from_array(np.zeros((16, 8), np.float32), "W")
    path = _save(tmp_path / "zeros.onnx", [helper.make_node("MatMul", ["x", "W"], ["y"])],
                 [_tensor("x", [4, 16])], [_tensor("y", [4, 8])], [weight])
    mc = pipeline.construct_model(path, "local-cpu")
    report = run.run_model_report(mc, path)
    assert report.outputs_constant and not report.outputs_match and report.max_abs_error == 0.0
    assert "outputs NOT CHECKED" in report.text() and report.to_dict()["outputs_checked"] is False
    good = run.run_model_report(constructed("mlp", "local-cpu"), SAMPLES / "mlp.onnx")
    assert not good.outputs_constant and good.to_dict()["outputs_checked"] is True


def test_run_report_refuses_a_gpu_device():
    with pytest.raises(UserError, match="CPU device"):
        pipeline.run_model_report(constructed("mlp", "h100"), SAMPLES / "mlp.onnx")


def test_run_report_refuses_a_cpu_whose_instructions_this_one_lacks(monkeypatch):
    """The kernels run in this process: an AVX-512 kernel on an AVX2 machine would kill it with an
    illegal instruction, so such a device is refused in one line first (the reason is injected:
    whether xeon-avx512 runs here depends on the machine)."""
    from workbench.models import run

    asked = []
    monkeypatch.setattr(run, "cannot_run_locally", lambda dev: asked.append(dev.name) or "the target needs avx512f")
    with pytest.raises(UserError) as info:
        run.run_model_report(constructed("mlp", "local-cpu"), SAMPLES / "mlp.onnx")
    assert asked == ["local-cpu"] and str(info.value) == (
        "cannot run local-cpu's kernels on this machine: the target needs avx512f")
