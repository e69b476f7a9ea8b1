"""The CUDA template: every catalog operator's rank-1 program on v100 and h100 becomes CUDA source
with the block/thread structure the program asks for, within the target's limits, and nvcc
compiles it to PTX (one nvcc call per device for all kernels)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from tests.helpers import device, expr
from workbench.codegen.build import build_kernel
from workbench.codegen.cuda import MIN_BOUND_REGISTERS, block_threads, gpu_resources, lane_program
from workbench.codegen.nvcc import compile_ptx, compile_ptx_many, nvcc_path, ptx_arch
from workbench.codegen.rules import apply_rules
from workbench.codegen.template import ScheduleError
from workbench.codegen.verify import check_output
from workbench.construct.stepper import construct
from workbench.ops.expr_lang import build_expr
from workbench.ops.fusion import fuse_axes
from workbench.ops.reference import random_inputs
from workbench.rtile.axes import cross_thread_axis
from workbench.rtile.occupancy import blocks_per_unit
from workbench.rtile.plan import gpu_plan
from workbench.rtile.rprogram import RProgram

GPUS = ("v100", "h100")
CASES = {
    "matmul": ("matmul", dict(M=64, N=64, K=64)),
    "matmul-batch": ("matmul", dict(M=32, N=48, K=40, B=2)),
    "matmul-ta": ("matmul", dict(M=64, N=32, K=48, trans_a=True)),
    "matmul-tb": ("matmul", dict(M=64, N=32, K=48, trans_b=True)),
    "matmul-prime": ("matmul", dict(M=257, N=127, K=509)),
    "matmul-fp16": ("matmul", dict(M=64, N=64, K=32, dtype="float16")),
    "gemv": ("gemv", dict(M=128, K=256)),
    "conv2d-s2p1": ("conv2d", dict(N=1, C=8, H=14, W=14, F=16, KH=3, KW=3, stride=2, pad=1)),
    "conv2d-p0": ("conv2d", dict(N=2, C=4, H=9, W=9, F=8, KH=3, KW=3, stride=1, pad=0)),
    "depthwise-x2": ("depthwise_conv2d", dict(N=1, C=8, H=14, W=14, KH=3, KW=3, stride=1, pad=1, multiplier=2)),
    "relu": ("relu", dict(shape=(17, 11, 3))),
    "add": ("add", dict(shape=(64, 33))),
    "gelu": ("gelu", dict(shape=(1000,))),
    "avgpool": ("avgpool", dict(N=1, C=8, H=14, W=14, K=3, stride=2, pad=1)),
    "maxpool": ("maxpool", dict(N=2, C=4, H=15, W=15, K=2, stride=2, pad=0)),
    "reduce_sum-mid": ("reduce_sum", dict(shape=(8, 16, 32), axes=(1,))),
    "reduce_sum-outer-inner": ("reduce_sum", dict(shape=(8, 16, 32), axes=(0, 2))),
    "reduce_sum-all": ("reduce_sum", dict(shape=(60,), axes=(0,))),
    "reduce_mean": ("reduce_mean", dict(shape=(8, 16, 32), axes=(1, 2))),
}


@lru_cache(maxsize=None)
def candidate(gpu: str, case: str):
    """(fused expression, rank-1 program) of a case."""
    op, params = CASES[case]
    params = dict(params)
    built = construct(expr(op, params.pop("dtype", "float32"), **params), device(gpu))
    return built.expr, built.candidates[0].program


@lru_cache(maxsize=None)
def kernel(gpu: str, case: str):
    fused, program = candidate(gpu, case)
    return build_kernel(fused, program, device(gpu))


def staged(gpu: str, case: str) -> bool:
    fused, program = candidate(gpu, case)
    return program.cached[1] and bool(fused.reduce)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("case", CASES)
def test_source_has_the_programs_block_and_thread_structure(gpu, case):
    fused, program = candidate(gpu, case)
    built = kernel(gpu, case)
    assert built.ok, built.error
    source = built.source
    assert "__global__" in source
    threads = block_threads(fused, lane_program(fused, program, device(gpu)), device(gpu))
    assert re.search(rf"__launch_bounds__\({threads}[,)]", source) or threads == 1  # TVM drops a unit thread loop
    # a cross-thread tree over more than one warp meets in shared memory after the shuffles
    trees = cross_thread_axis(fused, device(gpu)) is not None and threads > device(gpu).warp_size
    assert ("__shared__" in source) == (staged(gpu, case) or trees)
    assert ("__syncthreads" in source) == (staged(gpu, case) or trees)
    if fused.reduce:  # partial sums live in an unrolled register array, or in WMMA accumulators
        registers = re.search(r"(float|half) \w+_local_ptr\[\d+\];", source)
        assert registers or re.search(r"wmma::accumulator, 16, 16, 16, half> \w+\[\d+\];", source)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("case", CASES)
def test_threads_and_shared_memory_within_the_target_limits(gpu, case):
    fused, program = candidate(gpu, case)
    spec = device(gpu)
    used = gpu_resources(apply_rules(fused, program, spec)[1], spec)
    target = spec.target_dict()
    assert used.threads == block_threads(fused, lane_program(fused, program, spec), spec) <= target["max_threads_per_block"]
    assert used.shared_bytes <= target["max_shared_memory_per_block"]
    assert (used.shared_bytes > 0) == staged(gpu, case)


@pytest.mark.parametrize("gpu", GPUS)
def test_nvcc_compiles_every_kernel_to_ptx(gpu):
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    arch = device(gpu).target_dict()["arch"]
    results = compile_ptx_many([kernel(gpu, case).source for case in CASES], arch)
    for case, result in zip(CASES, results):
        assert result.ok, f"{case}: {result.error}"
        assert ".entry main_kernel" in result.ptx
        assert result.ptxas_report is not None and 0 < result.ptxas_report.registers <= 255
        assert result.ptxas_report.shared_bytes > 0 or not staged(gpu, case)


def pinned(case: str, tiles, padding):
    """A case's expression on v100 with a fixed program (no split-K), independent of the construction policy."""
    fused, program = candidate("v100", case)
    return fused, replace(program, tiles=tiles, padding=padding, split=1)  # one pass: the plain template


def pinned_source(fused, program) -> str:
    built = build_kernel(fused, program, device("v100"))
    assert built.ok, built.error
    return built.source


MATMUL_64 = (((4, 8, 1), (32, 32, 64)), ((0, 0, 0), (1, 8, 0)))  # V100's bank padding for this tile
MATMUL_PRIME = (((4, 8, 1), (8, 128, 48)), ((0, 0, 0), (17, 9, 0)))


def test_prime_matmul_is_guarded_at_every_tail():
    source = pinned_source(*pinned("matmul-prime", *MATMUL_PRIME))
    for extent in (257, 127, 509):  # 8 does not divide 257, 128 overhangs 127, 48 does not divide 509
        assert f"< {extent})" in source


def test_shared_rows_are_padded_as_the_program_says():
    source = pinned_source(*pinned("matmul", *MATMUL_64))
    assert "A_shared_ptr[2080]" in source  # 32 rows of 64 + 1
    assert "B_shared_ptr[2560]" in source  # 64 rows of 32 + 8


def test_copies_are_vectorized_only_where_aligned():
    source = pinned_source(*pinned("matmul", *MATMUL_64))
    assert "*(float4*)(B_shared_ptr" in source  # rows of 32 + 8 floats keep 16-byte alignment
    assert "*(float4*)(A_shared_ptr" not in source  # rows of 64 + 1 floats do not
    assert "float4" not in pinned_source(*pinned("matmul-prime", *MATMUL_PRIME))  # rows of 509, 127


@pytest.mark.parametrize(
    "case, store, register",
    # reduce_mean's 8 outputs are a cross-thread reduction: the tree's result is in a register of thread 0
    [("reduce_mean", "Y_ptr", "red_buf0_ptr"), ("avgpool", "O_ptr", "S_local_ptr")],
)
def test_epilogue_is_folded_into_the_register_write_back(case, store, register):
    source = kernel("v100", case).source
    assert "S_ptr" not in source  # the window / axis sum never goes through global memory
    assert re.search(store + r"\[[^\n]*\] = \(" + register + r"\[\d+\] / ", source)


def test_vthreads_stride_the_register_tile_without_changing_threads():
    fused, program = pinned("matmul", *MATMUL_64)
    spec = device("v100")
    sch = apply_rules(fused, replace(program, vthreads=(("j", 2),)), spec)[1]
    used = gpu_resources(sch, spec)
    assert (used.threads, used.vthreads) == (block_threads(fused, program, device("v100")), 2)
    with pytest.raises(ScheduleError, match="not a spatial axis"):
        apply_rules(fused, replace(program, vthreads=(("k", 2),)), spec)
    with pytest.raises(ScheduleError, match="do not divide"):
        apply_rules(fused, replace(program, vthreads=(("j", 3),)), spec)


def test_register_tiles_are_written_back_coalesced():
    """`plan.store_vthreads`: a thread's 8 outputs along j are interleaved over the block's 4
    threads along j, so neighbouring lanes store neighbouring elements (j = lane + 4 v, not
    8 lane + v), and the kernel still equals numpy."""
    fused, program = pinned("matmul", *MATMUL_64)
    spec = device("v100")
    assert program.vthreads == () and gpu_plan(program, spec).vthreads == (("j", 8),)
    stores = re.findall(r"C_ptr\[(.*)\] = C_local_ptr", pinned_source(fused, program))
    assert len(stores) == 32
    assert all("(((int)threadIdx.x) & 3)" in index and "(((int)threadIdx.x) & 3) * " not in index for index in stores)
    inputs = random_inputs(fused, seed=0)
    ref = inputs[0].astype(np.float64) @ inputs[1]
    np.testing.assert_allclose(run_serially(fused, program, spec, inputs), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    pool, pool_program = candidate("v100", "avgpool")  # a windowed input along the output row: none
    assert gpu_plan(pool_program, spec).vthreads == pool_program.vthreads == ()


def test_a_warp_is_laid_out_in_rows_of_8_lanes_storing_16_bytes():
    """`plan.warp_lanes`: 4 x 4 register tiles in 16 x 64 blocks have 16 threads along j; the
    first warp is 4 rows of 8 of them (lane j = t & 7, lane i = (t & 31) >> 3), not 2 rows of
    16, and each thread's run of 4 outputs is stored as one float4 (`vector_stores`; a run of
    4 needs no virtual threads). The kernel, its threads run serially here, equals numpy.
    With 8 threads along j a row-major warp is already 4 x 8: nothing to lay out."""
    fused, program = pinned("matmul", ((4, 4, 1), (16, 64, 64)), ((0, 0, 0), (1, 4, 0)))
    spec = device("v100")
    plan = gpu_plan(program, spec)
    assert (plan.warp_lanes, plan.vthreads, plan.vector_stores) == ((("i", 4), ("j", 8)), (), True)
    source = pinned_source(fused, program)
    assert "(((int)threadIdx.x) & 7) * 4)" in source and "((((int)threadIdx.x) & 31) >> 3)" in source
    assert len(re.findall(r"\*\(float4\*\)\(C_ptr \+", source)) == 4  # 4 rows of one run
    inputs = random_inputs(fused, seed=0)
    ref = inputs[0].astype(np.float64) @ inputs[1]
    np.testing.assert_allclose(run_serially(fused, program, spec, inputs), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    _, narrow = pinned("matmul", ((4, 4, 1), (32, 32, 64)), ((0, 0, 0), (1, 4, 0)))
    assert gpu_plan(narrow, spec).warp_lanes == () and not gpu_plan(narrow, spec).vector_stores
    # 40 rows in blocks of 16: the tail guards whole rows, whose runs are still stored whole
    # (`plan._whole_runs`: M0's 192-row blocks on the H200 554 -> 142 us so, no spills)
    rows = fuse_axes(build_expr("C[i,j] += A[i,k] * B[k,j]", dict(i=40, j=64, k=64)))
    guarded = _gpu_program(rows, {"i": (4, 16), "j": (4, 64), "k": (1, 64)}, True)
    assert gpu_plan(guarded, spec).vector_stores and gpu_plan(guarded, spec).warp_lanes == (("i", 4), ("j", 8))
    assert "*(float4*)(C_ptr +" in _built_and_checked(rows, guarded)


def test_programs_beyond_the_target_limits_are_refused():
    fused, program = pinned("matmul", *MATMUL_64)
    spec = device("v100")
    many_threads = replace(program, tiles=((1, 1, 1), (64, 64, 64)))  # 4096 threads
    with pytest.raises(ScheduleError, match="threads per block"):
        apply_rules(fused, many_threads, spec)
    big = construct(expr("matmul", M=256, N=256, K=256), spec)
    huge = replace(program, tiles=((8, 8, 1), (128, 128, 256)))  # (128 + 128) x 256 floats = 256 KB
    with pytest.raises(ScheduleError, match="shared memory"):
        apply_rules(big.expr, huge, spec)


def test_compile_ptx_reports_missing_nvcc(monkeypatch):
    monkeypatch.setattr("workbench.codegen.nvcc.shutil.which", lambda name: None)
    result = compile_ptx('extern "C" __global__ void k() {}', "sm_90")
    assert not result.ok and result.error == "nvcc not found on PATH"


def test_compile_ptx_names_the_error_and_falls_back_from_dropped_archs():
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    broken = compile_ptx('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }', "sm_90a")
    assert not broken.ok and "undefined_name" in broken.error
    fine = compile_ptx('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "sm_70")
    assert fine.ok and fine.arch == ptx_arch("sm_70")
    assert fine.ptxas_report.spill_store_bytes == 0


def test_tensor_core_program_runs_a_warp_per_fragment_tile():
    """float16 matmul on a tensor-core GPU: the top tile is a 16x16x16-aligned warp tile, and the
    kernel runs one warp per warp tile on WMMA fragments (threads = warps x 32)."""
    fused, program = candidate("h100", "matmul-fp16")
    warp = program.tiles[0]
    assert all(size % 16 == 0 for size in warp)
    warps = block_threads(fused, program, device("h100"))
    source = kernel("h100", "matmul-fp16").source
    assert "nvcuda::wmma::mma_sync" in source
    assert re.search(rf"__launch_bounds__\({warps * 32}[,)]", source)


@contextmanager
def unbound_threads():
    """`Schedule.bind` as a no-op: the CUDA template's schedule with every block, thread and
    virtual-thread loop left serial, which LLVM compiles for this CPU (there is no GPU here).
    Each "thread" then runs in turn and does each cooperative copy whole; the tiling, guards,
    staging and write-back are the template's own. A pipeline's asynchronous stage (cp.async on
    sm_80+) is left synchronous: it is a CUDA lowering, and LLVM has no barrier for it (its
    codegen stops at "not implemented"); the stages, buffers and indexing stay TVM's."""
    from tvm import s_tir

    bind, annotate = s_tir.Schedule.bind, s_tir.Schedule.annotate
    s_tir.Schedule.bind = lambda self, loop, thread_axis: None
    s_tir.Schedule.annotate = lambda self, block_or_loop, key, value: (
        None if key == "software_pipeline_async_stages" else annotate(self, block_or_loop, key, value))
    try:
        yield
    finally:
        s_tir.Schedule.bind, s_tir.Schedule.annotate = bind, annotate


def run_serially(fused, program, spec, inputs) -> np.ndarray:
    """The CUDA template's kernel for `program`, run on the CPU with its thread loops serial
    (`unbound_threads`)."""
    import tvm

    with unbound_threads():
        sch = apply_rules(fused, program, spec)[1]
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(fused.args[-1].shape, fused.dtype), dev)
    tvm.compile(sch.mod, target="llvm")["main"](*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    return out.numpy()


def _gpu_program(e, chains: dict, staged: bool) -> RProgram:
    tiles = tuple(tuple(chains[a.name][layer] for a in e.axes) for layer in range(2))
    zeros = tuple(0 for _ in e.tensors)
    return RProgram(tuple(a.name for a in e.axes), ("registers", "shared"), tiles, (zeros,) * 2, (True, staged), 1, 0.0, e)


@pytest.mark.parametrize("staged", (False, True))
@pytest.mark.parametrize("op", ("+=", "*=", "min=", "max="))
def test_fused_ragged_reduction_writes_back_exactly_its_tile(op, staged):
    """Issue 12: with i, j fused (315 outputs) a thread tile of 3 crosses rows of 35, and the
    write-back of a tile was the box of whole rows: wrong outputs, or a loop of non-constant
    extent that could not be unrolled. Now the accumulator is laid out along the fused axis:
    3 registers per thread, and the kernel (threads run serially on this CPU) matches numpy."""
    e = fuse_axes(build_expr(f"M[i,j] {op} A[k,i,j]", dict(i=9, j=35, k=301)))
    program = _gpu_program(e, {"ij": (3, 96), "k": (1, 16)}, staged)
    assert "float M_local_ptr[3];" in _built_and_checked(e, program)


def test_a_one_element_shared_tile_is_copied():
    """A staged input whose block tile is one element (C[q], q of extent 1) left compute_at no
    copy loop to spread over the threads; the copy gets a unit loop."""
    e = fuse_axes(build_expr("Y[i,j] max= C[q] + A[i,j,p]", dict(i=12, j=23, p=2, q=1)))
    program = _gpu_program(e, {"ij": (1, 64), "p": (1, 2), "q": (1, 1)}, True)
    assert "__shared__" in _built_and_checked(e, program)


def _built_and_checked(e, program) -> str:
    """Build `program` for the v100, run it with its threads serial on this CPU, check the
    output against the reference; returns the CUDA source."""
    built = build_kernel(e, program, device("v100"))
    assert built.ok, built.error
    inputs = random_inputs(e, seed=0)
    check = check_output(e, inputs, run_serially(e, program, device("v100"), inputs))
    assert check.correct, check.error
    return built.source


# -- cross-thread reductions (issue 16) ------------------------------------------------------------

REDUCE_8x65536 = ("reduce_sum", dict(shape=(8, 65536), axes=(1,)))


@lru_cache(maxsize=None)
def cross_thread_kernel(gpu: str):
    """reduce_sum over 8 x 65536 (8 outputs: a cross-thread reduction), its rank-1 program
    unsplit (rank 1 is split-K, whose kernels tests/test_split_k.py checks)."""
    op, params = REDUCE_8x65536
    built = construct(expr(op, **params), device(gpu))
    program = built.candidates[0].program
    program = replace(program, split=1, grid=program.grid // program.split)
    return built.expr, program, build_kernel(built.expr, program, device(gpu))


@pytest.mark.parametrize("gpu", GPUS)
def test_a_short_reduction_binds_its_threads_to_the_reduce_axis(gpu):
    """Each block sums one row with all its threads: thread t reads elements t, t + T, .. (the
    index is the block's row, the step and threadIdx.x with coefficient 1: coalesced), keeps a
    partial sum in a register, and TVM's cross-thread allreduce combines them with warp
    shuffles and shared memory across the warps; thread 0 writes the row's sum. The kernel
    cannot run here (no GPU; serial threads would not exchange), so its structure is checked."""
    fused, program, built = cross_thread_kernel(gpu)
    assert built.ok, built.error
    spec = device(gpu)
    threads = block_threads(fused, program, spec)
    assert program.tiles[1][0] == program.tiles[0][0]  # no threads along the outputs
    assert threads == program.tiles[1][1] // program.tiles[0][1] and threads % 32 == 0 and threads > 32
    source = built.source
    assert re.search(rf"__launch_bounds__\({threads}[,)]", source)
    loads = re.findall(r"X_ptr\[([^\]]*)\]", source)
    assert loads and all("((int)threadIdx.x)" in index and "threadIdx.x) *" not in index for index in loads)
    assert "__shfl_down_sync" in source and "red_buf_staging" in source  # a tree over several warps
    assert re.search(r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*Y_ptr\[", source)
    used = gpu_resources(apply_rules(fused, program, spec)[1], spec)
    assert used.threads == threads


@lru_cache(maxsize=None)
def two_reduce_axes_kernel():
    """Y[i] += A[r, i, k] on the v100: 8 outputs, k spread over 128 threads of 32 elements each."""
    e = fuse_axes(build_expr("Y[i] += A[r,i,k]", dict(i=8, r=3, k=4096)))
    return build_kernel(e, _gpu_program(e, {"i": (1, 1), "r": (1, 3), "k": (32, 4096)}, False), device("v100"))


def test_a_cross_thread_reduction_walks_its_other_reduce_axes_in_every_thread():
    """k (contiguous) is spread over the threads, r (not fusable with k) is a loop every thread
    runs around its coalesced loads, before the one tree per output."""
    built = two_reduce_axes_kernel()
    assert built.ok, built.error
    assert re.search(r"__launch_bounds__\(128[,)]", built.source) and "__shfl_down_sync" in built.source
    assert re.search(r"for \(int r_\d = 0; r_\d < 3; \+\+r_\d\)", built.source)


# roller-table1's reductions with a block a row: many outputs, rows contiguous; and R2's rows (11 x
# 11 fused into rows of 121), fewer of them (R2's own 516,096 outnumber the resident threads: a
# thread a row, `rtile.axes.cross_thread_axis`)
TABLE1_REDUCTIONS = {
    "R0": dict(shape=(128, 512, 1024), axes=(2,)),
    "R1": dict(shape=(65536, 1024), axes=(1,)),
    "R2-rows": dict(shape=(128, 40, 11, 11), axes=(2, 3)),
}
ARCHS = {"v100": "sm_70", "a100": "sm_80", "h100": "sm_90"}


@lru_cache(maxsize=None)
def table1_reduction(gpu: str, wid: str):
    """(fused expression, rank-1 program, kernel) of a roller-table1 reduction on `gpu`."""
    built = construct(expr("reduce_mean", **TABLE1_REDUCTIONS[wid]), device(gpu))
    program = built.candidates[0].program
    return built.expr, program, build_kernel(built.expr, program, device(gpu))


@pytest.mark.parametrize("gpu", sorted(ARCHS))
@pytest.mark.parametrize("wid", sorted(TABLE1_REDUCTIONS))
def test_table1_reductions_bind_a_blocks_threads_to_its_row(gpu, wid):
    """Issue 16: R0, R1 and R2's rows have 5120 to 65536 outputs, and a thread per output read
    its row with a row's stride between neighbouring threads. Rank 1 now sums one row per block with at least
    a warp of threads along it: every load's index is the row's start plus threadIdx.x with
    coefficient 1 (lane t reads element t of a step), and thread 0 writes the mean."""
    fused, program, built = table1_reduction(gpu, wid)
    assert built.ok, built.error
    k = fused.reduce[-1]
    assert all(tile[a] == 1 for tile in program.tiles for a in fused.spatial)  # a row per thread and per block
    threads = block_threads(fused, program, device(gpu))
    assert threads == program.tiles[1][k] // program.tiles[0][k] >= 32
    source = built.source
    assert re.search(rf"__launch_bounds__\({threads}[,)]", source)
    loads = re.findall(r"X_ptr\[([^\]]*)\]", source)
    assert loads and all("((int)threadIdx.x)" in index and "threadIdx.x) *" not in index for index in loads)
    assert re.search(r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*Y_ptr\[", source)


@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_90"])
def test_cross_thread_reductions_compile_with_nvcc(arch):
    """nvcc 13 dropped sm_70: `ptx_arch` compiles for the oldest newer architecture (sm_75).
    The table-1 reductions' rank-1 kernels of the GPU of that architecture with them: R2's rows'
    61 threads a row (not whole warps) reduce through shared memory, the others with shuffles."""
    if nvcc_path() is None:
        pytest.skip("nvcc not found on PATH: the CUDA sources' structure is checked by the tests above, not compiled")
    gpu = next(g for g, a in ARCHS.items() if a == arch)
    table1 = {wid: table1_reduction(gpu, wid) for wid in sorted(TABLE1_REDUCTIONS)}
    shuffles = [cross_thread_kernel("v100")[2].source, two_reduce_axes_kernel().source]
    warps = {wid: block_threads(e, program, device(gpu)) % 32 == 0 for wid, (e, program, _) in table1.items()}
    shuffles += [table1[wid][2].source for wid in table1 if warps[wid]]
    others = [table1[wid][2].source for wid in table1 if not warps[wid]]
    for n, result in enumerate(compile_ptx_many(shuffles + others, arch)):
        assert result.ok, result.error
        assert result.arch == ptx_arch(arch)
        assert result.ptxas_report is not None and result.ptxas_report.spill_store_bytes == 0
        if n < len(shuffles):
            assert "shfl.sync.down" in result.ptx


def test_kernels_ask_nvcc_for_the_blocks_the_model_prices():
    """`cuda.bound_occupancy`: a kernel declares the blocks per unit the model prices (up to
    those that leave a thread `MIN_BOUND_REGISTERS`) in its launch bounds, and ptxas keeps
    its registers within what those blocks leave; a program of one block a unit keeps TVM's."""
    spec, asked = device("h100"), {}
    for case in ("matmul", "matmul-fp16", "matmul-prime", "relu"):
        fused, program = candidate("h100", case)
        threads, bpu = blocks_per_unit(program, spec, gpu_plan(program, spec).stages)
        blocks = min(bpu, spec.registers_per_unit // (threads * MIN_BOUND_REGISTERS))
        source = kernel("h100", case).source
        bounds = re.findall(r"__launch_bounds__\(([0-9, ]+)\)", source)
        assert bounds and set(bounds) == {f"{threads}, {blocks}" if blocks > 1 else f"{threads}"}, (case, bounds)
        asked[case] = blocks
        if blocks > 1 and nvcc_path():
            report = compile_ptx(source, ptx_arch("sm_90")).ptxas_report
            assert report.registers <= spec.registers_per_unit // (threads * blocks) and report.spill_store_bytes == 0
    assert any(b > 1 for b in asked.values()), asked
