"""Conv as implicit GEMM on the CUDA cores (`codegen.cuda_conv`, rule `cuda-conv-gemm`).

There is no GPU here: kernels are checked as CUDA source (structure, nvcc), and for correctness
the template's own schedule is compiled for this CPU with its block and thread loops left serial
(`test_codegen_cuda.run_serially`): the reindex, layout transforms, gather from the padded
input, guards, staging and fused epilogues are the GPU kernel's, checked against numpy."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest
from helpers import device, expr, suite_workloads, workload_expr
from test_codegen_cuda import run_serially

from workbench.codegen.build import build_kernel
from workbench.codegen.cuda import block_threads
from workbench.codegen.nvcc import compile_ptx_many, nvcc_path
from workbench.codegen.rules import RULES, apply_rules
from workbench.codegen.rules.conv import ConvGemmRule
from workbench.codegen.verify import check_output
from workbench.construct.stepper import construct
from workbench.ops.gemm_view import gemm_view
from workbench.ops.reference import random_inputs
from workbench.ops.tensor_expr import from_prim_func
from workbench.rtile.rprogram import RProgram

CONV = dict(N=2, C=8, H=10, W=10, F=16, KH=3, KW=3, stride=2, pad=1)


def conv_bias_relu(n, c, h, w, f, k, stride, pad):
    """relu(conv2d(data, kernel) + bias[f]) as one PrimFunc (as ONNX import fuses it)."""
    import tvm
    from tvm import te

    data, kernel = te.placeholder((n, c, h, w), name="data"), te.placeholder((f, c, k, k), name="kernel")
    bias = te.placeholder((f,), name="bias")
    zero = tvm.tirx.const(0, "float32")
    inside = lambda y, x: tvm.tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad)  # noqa: E731
    padded = te.compute(
        (n, c, h + 2 * pad, w + 2 * pad),
        lambda i, j, y, x: te.if_then_else(inside(y, x), data[i, j, y - pad, x - pad], zero),
        name="pad",
    )
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    rc, rr, rs = (te.reduce_axis((0, e), name=x) for e, x in ((c, "c"), (k, "r"), (k, "s")))
    conv = te.compute(
        (n, f, oh, ow),
        lambda i, o, y, x: te.sum(padded[i, rc, y * stride + rr, x * stride + rs] * kernel[o, rc, rr, rs], axis=[rc, rr, rs]),
        name="O",
    )
    biased = te.compute((n, f, oh, ow), lambda i, o, y, x: conv[i, o, y, x] + bias[o], name="B")
    out = te.compute((n, f, oh, ow), lambda i, o, y, x: tvm.tirx.max(biased[i, o, y, x], zero), name="R")
    return from_prim_func(te.create_prim_func([data, kernel, bias, out]), "conv_bias_relu", {}, "float32", n_inputs=3)


def numpy_conv_bias_relu(data, kernel, bias, stride, pad):
    k = kernel.shape[2]
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (padded.shape[2] - k) // stride + 1, (padded.shape[3] - k) // stride + 1
    out = np.zeros((data.shape[0], kernel.shape[0], oh, ow))
    for y in range(oh):
        for x in range(ow):
            window = padded[:, :, y * stride : y * stride + k, x * stride : x * stride + k]
            out[:, :, y, x] = np.einsum("ncrs,fcrs->nf", window, kernel)
    return np.maximum(out + bias[None, :, None, None], 0)


def view_program(view_expr, register, shared, vthreads=()) -> RProgram:
    zeros = tuple(0 for _ in view_expr.tensors)
    names = tuple(a.name for a in view_expr.axes)
    return RProgram(names, ("registers", "shared"), (register, shared), (zeros, zeros), (True, True), 1, 0.0, view_expr, vthreads)


# (conv_bias_relu shape, register tile, shared tile, vthreads) over (m, n, k); the tiles leave
# tails on m and k (guarded), one program strides its register tile over virtual threads.
FUSED = [
    ((2, 8, 10, 10, 16, 3, 2, 1), (2, 2, 2), (8, 8, 8), ()),  # M 50, K 72: m tail
    ((1, 5, 9, 7, 12, 3, 1, 0), (1, 4, 2), (16, 8, 46), ()),  # M 35, K 45: m and k tails
    ((2, 4, 13, 13, 8, 5, 2, 2), (4, 4, 1), (100, 8, 8), ()),  # 5x5 window, pad 2
    ((2, 8, 10, 10, 16, 3, 1, 1), (2, 4, 1), (8, 16, 8), (("o", 2),)),  # vthreads along n (axis o)
    ((1, 6, 5, 5, 8, 1, 1, 0), (1, 2, 2), (5, 8, 6), ()),  # 1x1: `h + r` simplifies to h, r has no A dim
]


@pytest.mark.parametrize("shape, register, shared, vthreads", FUSED)
def test_the_gather_with_padding_stride_and_a_fused_bias_relu_equals_numpy(shape, register, shared, vthreads):
    fused = conv_bias_relu(*shape)
    view = gemm_view(fused)
    assert view is not None and len(view.expr.inputs) == 2 and len(fused.args) == 4  # bias: an epilogue input
    program = view_program(view.expr, register, shared, vthreads)
    built = build_kernel(view.expr, program, device("v100"))
    assert built.ok and built.template == "cuda-conv-gemm", built.error
    rng = np.random.default_rng(0)
    n, c, h, w, f, k, stride, pad = shape
    inputs = [rng.standard_normal(s).astype("float32") for s in ((n, c, h, w), (f, c, k, k), (f,))]
    out = run_serially(view.expr, program, device("v100"), inputs)
    want = numpy_conv_bias_relu(*inputs, stride, pad)
    assert 0.2 < (want > 0).mean() < 0.8  # relu clips a good part and keeps a good part
    # float32 sums of K <= 200 products of N(0, 1) values: |error| ~ 1e-6 x sqrt(K) x |sum|
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    assert "max(" in built.source  # relu is applied by the register write-back, no second kernel


@pytest.mark.parametrize("gpu", ("v100", "h100"))
def test_the_constructed_top_programs_of_a_catalog_conv_equal_the_reference(gpu):
    conv = expr("conv2d", **{**CONV, "dilation": 2, "pad": 2})
    built = construct(conv, device(gpu))
    inputs = random_inputs(built.expr, seed=0)
    for cand in built.candidates[:3]:
        check = check_output(built.expr, inputs, run_serially(built.expr, cand.program, device(gpu), inputs))
        assert check.correct, check.error


@lru_cache(maxsize=None)
def table1_kernel(gpu: str, wid: str):
    workload = next(w for w in suite_workloads("roller-table1") if w["id"] == wid)
    built = construct(workload_expr(workload), device(gpu))
    program = built.candidates[0].program
    return built.expr, program, build_kernel(built.expr, program, device(gpu))


@pytest.mark.parametrize("gpu", ("v100", "a100", "h100"))
@pytest.mark.parametrize("wid", ("C0", "C1", "C2"))
def test_table1_convs_build_as_one_gemm_kernel(gpu, wid):
    """One thread block per (BM, BN) tile, the program's threads, A and B staged in shared
    memory as the im2col and weight tiles, the accumulator in registers."""
    fused, program, kernel = table1_kernel(gpu, wid)
    assert kernel.ok and kernel.template == "cuda-conv-gemm", kernel.error
    threads = block_threads(fused, program, device(gpu))
    assert threads % 32 == 0 or threads < 32
    assert re.search(rf"__launch_bounds__\({threads}[,)]", kernel.source)
    staged = re.findall(r"__shared__ alignas\(\d+\) float (\w+)_reindex_shared_ptr", kernel.source)
    assert sorted(staged) == ["data", "kernel"]  # table 1 convs are unpadded: A is gathered from data itself
    registers = program.tiles[0][0] * program.tiles[0][1]
    assert f"float O_reindex_local_ptr[{registers}];" in kernel.source


@pytest.mark.parametrize("gpu", ("v100", "a100", "h100"))
def test_table1_conv_kernels_compile_with_nvcc(gpu):
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    sources = [table1_kernel(gpu, wid)[2].source for wid in ("C0", "C1", "C2")]
    for result in compile_ptx_many(sources, device(gpu).target_dict()["arch"]):
        assert result.ok, result.error
        report = result.ptxas_report
        assert report is not None and 0 < report.registers <= 255 and report.shared_bytes > 0


def test_the_rule_takes_gemm_views_only_and_comes_before_the_cuda_core_rule():
    names = [rule.name for rule in RULES]
    assert names.index("cuda-conv-gemm") < names.index("cuda")
    conv = expr("conv2d", **CONV)
    view = gemm_view(conv).expr
    program = view_program(view, (1, 1, 1), (8, 8, 8))
    assert ConvGemmRule().schedule(view, program, device("tiny-cpu")) is None
    direct = view_program(conv, (1,) * 7, (1,) * 7)  # the direct nest is the CUDA-core rule's
    assert ConvGemmRule().schedule(conv, direct, device("v100")) is None
    assert apply_rules(view, program, device("v100"))[0].name == "cuda-conv-gemm"


def test_a_gpu_conv_bundle_rebuilds_its_gemm_view_from_the_manifest(tmp_path):
    """`bundle_program` rebuilds the expression the construction tiled: the conv's GEMM view."""
    from workbench.export import bundle_program, export_candidate, rebuild

    built = construct(expr("conv2d", **CONV), device("v100"))
    cand = built.candidates[0]
    path = export_candidate(built.expr, cand, built.device, tmp_path / "conv", policy="roller").path
    program, spec = bundle_program(path)
    assert program == cand.program and program.axes == ("nhw", "f", "crs") and spec == built.device
    kernel = rebuild(path)
    assert kernel.ok and kernel.template == "cuda-conv-gemm", kernel.error
    assert kernel.sources[0][1] == (path / "kernel.cu").read_text()


def test_the_sample_models_convs_with_int64_indices_and_relu6_equal_the_direct_nest():
    """ONNX import's fused convs (int64 iterators; 1x1 and 3x3 windows; bias, batch-norm scale and
    shift, relu or relu6 epilogues) on the V100: every conv the construction took as a GEMM view
    builds with this rule, and its kernel (threads serial) equals the imported PrimFunc built
    directly for this CPU."""
    import tvm
    from test_models import constructed

    seen = 0
    for model in ("resnet_block", "mobilenet_block"):
        for result in constructed(model, "v100").results:
            program = result.candidates[0].program
            if gemm_view(result.operator.expr) is None:
                continue
            seen += 1
            built = build_kernel(program.expr, program, device("v100"))
            assert built.ok and built.template == "cuda-conv-gemm", (result.operator.name, built.error)
            rng = np.random.default_rng(0)
            inputs = [rng.standard_normal(a.shape).astype(a.dtype) for a in program.expr.args[:-1]]
            want = tvm.runtime.tensor(np.zeros(program.expr.args[-1].shape, program.expr.dtype))
            direct = tvm.compile(tvm.IRModule({"main": result.operator.expr.func}), target="llvm")
            direct["main"](*[tvm.runtime.tensor(a) for a in inputs], want)
            got = run_serially(program.expr, program, device("v100"), inputs)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
    assert seen == 4  # resnet_block's two 3x3 convs, mobilenet_block's two 1x1 convs
