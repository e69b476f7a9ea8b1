"""Split-K (issue 16): the `RProgram.split` field, its price in the model (`split_k_seconds`),
its choice at emission (`policy.split_k`), its CUDA template (`codegen.cuda_splitk`) and, on a
CPU, its cores' parts in the plain template (`codegen.cpu._split_k`, run here against numpy).

There is no GPU here: the template's kernels are checked as CUDA source (two kernels, bound
blocks and threads, a tree over the threads), compiled with nvcc where it is installed, and run
on the CPU with their thread loops serial (`test_codegen_cuda.run_serially`: the same schedule,
rfactor included, built for LLVM) against numpy."""

from __future__ import annotations

import re
from dataclasses import replace
from math import prod

import numpy as np
import pytest

from tests.helpers import TINY_CPU, device, expr
from tests.test_codegen_cuda import run_serially
from workbench.codegen.build import build_kernel
from workbench.codegen.nvcc import compile_ptx_many, nvcc_path
from workbench.codegen.rules import apply_rules
from workbench.codegen.verify import verify
from workbench.construct.policy import split_k
from workbench.construct.space import Options, Space, replay
from workbench.construct.stepper import construct
from workbench.ops.reference import random_inputs
from workbench.ops.tensor_expr import from_te
from workbench.rtile.model import estimate
from workbench.rtile.model.gpu import split_k_seconds
from workbench.rtile.panels import simd_lanes
from workbench.rtile.plan import cpu_plan, splits_reduction
from workbench.rtile.rprogram import CPU_MIN_PART_STEPS, RProgram, make_program, split_axis, split_counts, split_steps
from workbench.rtile.traffic import TileCalculus


def program(e, tiles, staged: bool, split: int = 1, gpu: str = "v100") -> RProgram:
    p = make_program(TileCalculus(e), device(gpu), tiles, (True, staged), 0.0)
    return replace(p, split=split, grid=p.grid * split)


def reduce_sum(rows: int, k: int):
    return construct(expr("reduce_sum", shape=(rows, k), axes=(1,)), device("v100")).expr


# -- the field -----------------------------------------------------------------------------------


def test_split_round_trips_and_unsplit_programs_keep_their_stored_form():
    e = expr("matmul", M=64, N=64, K=4096)
    unsplit = program(e, ((2, 2, 1), (32, 32, 16)), True)
    split = replace(unsplit, split=4, grid=unsplit.grid * 4)
    assert RProgram.from_dict(split.to_dict(), e) == split and split.to_dict()["split"] == 4
    stored = unsplit.to_dict()
    assert "split" not in stored  # a program stored before split-K reads the same
    assert RProgram.from_dict(stored, e) == unsplit and RProgram.from_dict(stored, e).split == 1


def test_split_counts_deal_whole_steps_on_a_cpu_in_long_parts_and_none_on_tensor_cores():
    e = expr("matmul", M=64, N=64, K=1000)
    p = program(e, ((2, 2, 1), (32, 32, 16)), True)  # 63 steps of 16, the last 8 long
    counts = split_counts(p, device("v100"))
    assert counts[:4] == (2, 3, 4, 5) and counts[-1] == 63
    # every count makes parts of ceil(63 / S') steps, the last part the rest: S = 5 -> 13 steps x 5
    assert all(-(-63 // split_steps(replace(p, split=s), 2)) == s for s in counts)
    assert 33 not in counts  # ceil(63 / 33) = 2 steps a part make 32 parts, not 33
    # on a CPU the cores take parts of CPU_MIN_PART_STEPS steps or more: 63 in at most 7
    assert split_axis(e, TINY_CPU) == 2
    cpu = make_program(TileCalculus(e), TINY_CPU, ((1, 8, 1), (8, 64, 16), (64, 64, 16)), (True,) * 3, 0.0)
    assert split_counts(cpu, TINY_CPU) == (2, 3, 4, 5, 6, 7)
    assert all(split_steps(replace(cpu, split=s), 2) >= CPU_MIN_PART_STEPS for s in split_counts(cpu, TINY_CPU))
    whole = make_program(TileCalculus(e), TINY_CPU, ((1, 8, 1), (8, 64, 64), (64, 64, 1000)), (True,) * 3, 0.0)
    assert split_counts(whole, TINY_CPU) == ()  # one step: nothing to deal
    assert split_axis(expr("matmul", "float16", M=64, N=64, K=4096), device("v100")) is None  # WMMA
    assert split_axis(expr("relu", shape=(64, 64)), device("v100")) is None  # nothing to reduce


def test_a_cross_thread_reduction_splits_only_without_a_predicate():
    """reduce_sum rows of 2^20 in steps of 1280: 820 steps, the last one short; an rfactor
    block bound to threads under a predicate loses its cross-thread tree in TVM 0.27."""
    e = reduce_sum(64, 1 << 20)
    assert split_counts(program(e, ((1, 4), (1, 1280)), False), device("v100")) == ()
    counts = split_counts(program(e, ((1, 4), (1, 1024)), False), device("v100"))
    assert counts == tuple(2**n for n in range(1, 11))  # divisors of 1024 steps


# -- the model -----------------------------------------------------------------------------------


def test_split_k_seconds_in_closed_form():
    """reduce_sum 64 x 2^20 on the V100 in 4 parts: the first pass stores 4 x 64 partial sums
    where the unsplit one stores 64 (3 x 256 B more), the second reads 4 x 256 B and writes
    256 B, all at 750 GB/s, after its 5 us launch and one 400 ns DRAM latency (v100.toml)."""
    e = reduce_sum(64, 1 << 20)
    p = program(e, ((1, 4), (1, 1024)), False, split=4)
    dev = device("v100")
    moved = 3 * 256 + 4 * 256 + 256
    assert split_k_seconds(p, dev) == pytest.approx(5e-6 + 400e-9 + moved / 750e9, rel=1e-12)
    assert split_k_seconds(replace(p, split=1), dev) == 0.0
    # estimate adds it once to the first pass priced over the S-times larger grid
    first = estimate(replace(p, split=1), dev)  # same grid (256 blocks), no second pass
    assert estimate(p, dev).predicted_seconds == pytest.approx(first.predicted_seconds + split_k_seconds(p, dev), rel=1e-12)
    assert first.waves == 1 and p.grid == 256


def test_reduce_sum_64x1m_split_fills_the_v100():
    """tests/test_model.py: unsplit, 64 rows keep 64 of the 80 SMs busy, so the best is the
    2^28 B read at 750 GB/s x 64 / 80 (447 us). Its 1024 steps of 1024 split in powers of 2; of
    the splits from the first that fills the SMs (2: 128 blocks) to the most resident at once
    (8 blocks an SM: 640), 8 quantises best: 512 blocks in ceil(512 / 80) = 7 rounds of 80, the
    read at 750 GB/s x 512 / 560, the tree over 256 threads, then the second pass (`split_k_seconds`): 397 us."""
    e = reduce_sum(64, 1 << 20)
    dev = device("v100")
    unsplit = program(e, ((1, 4), (1, 1024)), False)
    chosen, est = split_k(unsplit, dev)
    bound = 64 * 2**20 * 4 / 750e9
    assert estimate(unsplit, dev).predicted_seconds >= bound * 80 / 64
    assert (chosen.split, chosen.grid, est.blocks_per_unit, est.waves) == (8, 512, 8, 1)
    read = (64 * 2**20 * 4 + 64 * 4) / 750e9  # the matrix and the 64 outputs stored by the first pass
    assert dict(est.load_seconds)["global"] == pytest.approx(read, rel=1e-9)
    tree = 8 * 12.4e-9  # log2(256 threads) exchanges at the shared layer's latency, one wave
    assert est.predicted_seconds == pytest.approx(read * 560 / 512 + tree + split_k_seconds(chosen, dev), rel=1e-9)
    assert est.predicted_seconds < 0.9 * estimate(unsplit, dev).predicted_seconds


# -- emission ------------------------------------------------------------------------------------


def test_a_short_long_k_matmul_is_split_on_a_gpu_and_its_rows_fill_two_cpu_cores():
    e = expr("matmul", M=64, N=64, K=8192)
    gpu = construct(e, device("v100"))
    top = gpu.candidates[0]
    assert top.program.split > 1 and top.program.grid >= device("v100").compute_units
    unsplit = replace(top.program, split=1, grid=top.program.grid // top.program.split)
    assert top.predicted_seconds < estimate(unsplit, device("v100")).predicted_seconds
    assert replay(Space(gpu.expr, device("v100")), top.actions) == top.program
    cpu = construct(e, TINY_CPU)  # two cores: 64 rows in two tiles already keep both busy
    assert cpu.candidates[0].program.grid >= TINY_CPU.compute_units
    assert all(c.program.split == 1 for c in cpu.candidates)


@pytest.mark.parametrize("M, K, N", [(1, 256, 128), (1, 2048, 10)])  # mlp_dynamic-mm1, shufflenet_block-mm0
def test_a_single_row_gemm_fills_its_warps_and_is_split(M, K, N):
    """A one-row GEMM's block fills a warp, or has a thread per output where it has fewer than
    a warp's (`rules.BlockThreadsRule`); its few threads' loads in flight make one block slow
    (`model.gpu.THREAD_BYTES_IN_FLIGHT`), so the top programs split K over blocks."""
    h200 = device("h200")
    found = construct(expr("matmul", M=M, N=N, K=K), h200, options=Options(topk=5))
    assert len(found.candidates) == 5
    for cand in found.candidates:
        assert cand.estimate.threads >= min(h200.warp_size, M * N)
    top = found.candidates[0].program
    assert top.split > 1
    unsplit = replace(top, split=1, grid=top.grid // top.split)
    assert found.candidates[0].predicted_seconds < estimate(unsplit, h200).predicted_seconds
    assert build_kernel(found.expr, top, h200).ok


def test_a_partial_warp_computes_at_its_lanes_share_of_the_peak():
    from workbench.rtile.model.gpu import lane_fraction

    h200 = device("h200")
    assert [lane_fraction(h200, t) for t in (4, 32, 40, 128)] == [4 / 32, 1.0, 40 / 64, 1.0]
    assert lane_fraction(TINY_CPU, 1) == 1.0


def test_a_program_filling_the_units_is_not_split():
    e = expr("matmul", M=1024, N=1024, K=1024)
    p = program(e, ((4, 4, 1), (64, 64, 16)), True)  # 256 blocks on 80 SMs
    assert split_k(p, device("v100"))[0] is p


# -- the template --------------------------------------------------------------------------------


def kernels(source: str) -> list[str]:
    return re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+(?:, \d+)?\) (\w+)\(', source)


def built(e, p, gpu="v100"):
    kernel = build_kernel(e, p, device(gpu))
    assert kernel.ok, kernel.error
    assert kernel.template == "cuda-splitk"
    return kernel.source


def test_unsplit_programs_take_the_other_rules():
    e = expr("matmul", M=64, N=64, K=4096)
    assert apply_rules(e, program(e, ((2, 2, 1), (32, 32, 16)), True), device("v100"))[0].name == "cuda"


@pytest.mark.parametrize(
    "op, params, tiles, staged, split",
    [
        ("matmul", dict(M=64, N=64, K=4096), ((2, 2, 1), (32, 32, 16)), True, 4),
        ("matmul", dict(M=33, N=40, K=1000), ((2, 2, 1), (16, 32, 16)), True, 5),  # 63 steps: 5 x 13, tails guarded
        # the final pass's 128 threads exactly one row of outputs (mlp-mm1: TVM divided by zero)
        ("matmul", dict(M=8, N=128, K=256), ((8, 8, 1), (8, 128, 64)), True, 4),
        ("reduce_sum", dict(shape=(8, 8192), axes=(1,)), ((1, 4), (1, 512)), False, 4),
        ("reduce_mean", dict(shape=(8, 8192), axes=(1,)), ((1, 4), (1, 512)), False, 8),
    ],
)
def test_split_kernels_equal_numpy(op, params, tiles, staged, split):
    e = construct(expr(op, **params), device("v100")).expr
    p = program(e, tiles, staged, split)
    source = built(e, p)
    assert sorted(set(kernels(source))) == ["main_kernel", "main_kernel_1"]  # declared, then defined
    inputs = random_inputs(e, seed=0)
    out = run_serially(e, p, device("v100"), inputs)
    x = [a.astype(np.float64) for a in inputs]
    ref = x[0] @ x[1] if op == "matmul" else x[0].sum(axis=1) / (x[0].shape[1] if op == "reduce_mean" else 1)
    assert np.abs(ref).max() > 1e-3  # not a vacuous comparison
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_fused_bias_relu_is_applied_once_in_the_final_pass():
    from tvm import te, tirx

    m, n, k = 32, 32, 2048
    a, b, bias = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B"), te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    d = te.compute((m, n), lambda i, j: te.max(c[i, j] + bias[j], tirx.const(0, "float32")), name="D")
    e = from_te("matmul_bias_relu", {}, [a, b, bias], d, "float32")
    p = program(e, ((2, 2, 1), (16, 32, 16)), True, split=8)
    source = built(e, p)
    *_, first, final = source.split('extern "C" __global__')  # the two definitions, after the declarations
    assert "bias_ptr" not in first and "max(" not in first  # the first pass writes raw partial sums
    assert re.search(r"D_ptr\[[^\n]*\] = max\(\(C_local_ptr\[0\] \+ bias_ptr", final)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]
    out = run_serially(e, p, device("v100"), inputs)
    ref = np.maximum(inputs[0].astype(np.float64) @ inputs[1] + inputs[2], 0)
    assert 0.2 < (ref == 0).mean() < 0.8  # relu clips some outputs, not all
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_split_cross_thread_reduction_keeps_its_tree_and_writes_one_partial_sum_a_block():
    e = reduce_sum(8, 65536)
    source = built(e, program(e, ((1, 16), (1, 8192)), False, split=8))
    first = source.split('extern "C" __global__')[-2]
    assert "__shfl_down_sync" in first and "red_buf_staging" in first
    assert re.search(r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*Y_rf_ptr\[\(\(int\)blockIdx.x\)\]", first)
    assert "__launch_bounds__(8) main_kernel_1" in source  # the final pass: a thread per output


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_kernels_compile_with_nvcc(arch):
    if nvcc_path() is None:
        pytest.skip("nvcc not found on PATH: the sources' structure is checked above, not compiled")
    cases = [(expr("matmul", M=64, N=64, K=4096), ((2, 2, 1), (32, 32, 16)), True, 4),
             (reduce_sum(8, 65536), ((1, 16), (1, 8192)), False, 8)]
    gpu = "a100" if arch == "sm_80" else "h100"
    sources = [built(e, program(e, tiles, staged, split, gpu), gpu) for e, tiles, staged, split in cases]
    for result in compile_ptx_many(sources, arch):
        assert result.ok, result.error
        assert len(re.findall(r"^\.visible \.entry", result.ptx, re.M)) == 2


def test_a_direct_conv_splits_its_input_channels_and_its_padding_folds_into_the_partial_sums():
    """conv2d 64 -> 8 channels on 7 x 7 (pad 1) as its direct 7-axis nest: one block of outputs
    for 80 SMs, its 64 input channels (8 steps of 8) split over 8 blocks; `pad` is inlined into
    the partial-sum kernel's shared copies. Run serially on the CPU against the reference. (The
    construction builds a conv as implicit GEMM over fused axes, which `split_axis` leaves
    unsplit.)"""
    from workbench.codegen.verify import check_output

    e = expr("conv2d", N=1, C=64, H=7, W=7, F=8, KH=3, KW=3, stride=1, pad=1)
    assert [a.name for a in e.axes] == ["n", "f", "h", "w", "c", "r", "s"]
    p = program(e, ((1, 8, 1, 7, 1, 1, 1), (1, 8, 7, 7, 8, 3, 3)), True)
    assert split_counts(p, device("v100")) == (2, 3, 4, 8)
    chosen, _ = split_k(p, device("v100"))
    assert (chosen.split, chosen.grid) == (8, 8)
    source = built(e, chosen)
    assert sorted(set(kernels(source))) == ["main_kernel", "main_kernel_1"] and "__shared__" in source
    inputs = random_inputs(e, seed=0)
    check = check_output(e, inputs, run_serially(e, chosen, device("v100"), inputs))
    assert check.correct, check.error


@pytest.mark.parametrize("params, split", [(dict(M=64, N=64, K=4096), 4), (dict(M=33, N=40, K=1000), 5)])
def test_a_pipelined_split_on_the_h100_double_buffers_its_parts_and_equals_numpy(params, split):
    """On sm_80+ the partial-sum kernel pipelines its copies as `codegen.cuda` does (cp.async a
    step ahead, `rtile.staging.pipelined`), each part over its own steps (64, or 13 with the
    last part's 11 guarded). Run serially, the copies synchronous (`run_serially`)."""
    from workbench.rtile.staging import pipelined

    e = expr("matmul", **params)
    p = program(e, ((2, 2, 1), (16, 32, 16)), True, split, "h100")
    assert pipelined(p, device("h100"))
    assert "cp.async" in built(e, p, "h100")
    inputs = random_inputs(e, seed=0)
    out = run_serially(e, p, device("h100"), inputs)
    ref = inputs[0].astype(np.float64) @ inputs[1]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


# -- on a CPU ------------------------------------------------------------------------------------


def cpu_split(e, tiles, split: int):
    """`e` in (registers, L1, L2) `tiles` on this machine's CPU, its first reduce axis in `split` parts."""
    p = make_program(TileCalculus(e), device("local-cpu"), tiles, (True,) * 3, 0.0)
    return replace(p, split=split, grid=p.grid * split)


@pytest.mark.parametrize("params, tiles, split", [
    # one row whose end cuts the last register tile (edges split off): the sum covers 451 outputs, not 512
    (dict(M=1, K=2927, N=451), ((1, 32, 16), (1, 256, 16), (1, 512, 16)), 2),
    # 63 steps of 16 (the last 8 long) in parts of 32 and 31: the split's predicate and K's
    (dict(M=3, K=1000, N=96), ((3, 32, 1), (3, 32, 16), (3, 96, 16)), 2),
    (dict(M=3, K=1000, N=96), ((3, 32, 1), (3, 32, 16), (3, 96, 16)), 3),
    # ragged rows and columns padded to whole tiles, packed panels: the parts sum the padded output
    (dict(M=13, K=2000, N=170), ((13, 32, 1), (13, 32, 16), (13, 192, 160)), 2),
    (dict(B=3, M=5, K=700, N=40), ((1, 5, 16, 1), (1, 5, 48, 16), (3, 5, 48, 32)), 2),
])
def test_cpu_split_kernels_equal_numpy(params, tiles, split):
    """Each core's part sums its K-steps into its own row of partial sums, under the grid's
    parallel loop; one core then adds the rows into the output, its loop over the outputs
    spanning them exactly (TVM's rfactor keeps no predicate of a ragged tile on that sum)."""
    e = expr("matmul", **params)
    dev = device("local-cpu")
    p = cpu_split(e, tiles, split)
    assert splits_reduction(replace(p, split=1, grid=p.grid // split), dev)
    kernel = build_kernel(e, p, dev)
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    script = kernel.tvmscript
    assert "T.parallel(" in script and f"T.sblock_alloc_buffer(({split}," in script  # a row of partial sums a part
    final = script[script.index('T.sblock("C_update")'):]
    # the sum over the parts, into the output or, where the tails are padded, the padded output
    padded = cpu_plan(p, dev).padded_tails
    outputs = prod(-(-e.axes[a].extent // p.unit_tile[a]) * p.unit_tile[a] if padded else e.axes[a].extent
                   for a in e.spatial)
    assert f"T.axis.reduce({split}," in final
    assert ("T.where(" in final) == (outputs % simd_lanes(dev, 4) != 0)  # the last vector guarded


def test_a_cpu_template_that_cannot_split_refuses_a_split_program():
    """gemv sums lanes along K (`plan.LANES`): a split program of it is refused with one line,
    recorded as a failed kernel, never built unsplit under a split program's name."""
    e = expr("gemv", M=64, K=4096)
    dev = device("local-cpu")
    program = construct(e, dev).candidates[0].program
    split = replace(program, split=2, grid=program.grid * 2)
    kernel = build_kernel(e, split, dev)
    assert not kernel.ok and "does not split" in kernel.error and "\n" not in kernel.error
