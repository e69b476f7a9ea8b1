"""The CUDA templates' software pipeline and register staging (issue 16): on sm_80+ a program
whose innermost shared-step loop runs at least twice double-buffers its shared tiles and copies
them with cp.async one step ahead (prologue, steady state, epilogue), on sm_70 through registers
(register prefetch); for one-step programs nothing changes; the CUDA-core template stages each thread's fragments in `local`
arrays. No GPU here: these check the source, the shared-memory count, a serial run on this CPU
and nvcc / ptxas, not the speed."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

import pytest

from tests.helpers import device, expr
from tests.test_codegen_cuda import _gpu_program, run_serially
from workbench.codegen.build import build_kernel
from workbench.codegen.cuda import gpu_resources
from workbench.codegen.nvcc import compile_ptx, compile_ptx_many, nvcc_path
from workbench.codegen.rules import apply_rules
from workbench.codegen.verify import check_output
from workbench.construct.stepper import construct
from workbench.ops.fusion import fuse_axes
from workbench.ops.reference import random_inputs
from workbench.rtile.occupancy import prefetch_registers
from workbench.rtile.staging import pipelined, register_prefetch, shared_steps
from workbench.rtile.rprogram import footprint_at, make_program
from workbench.rtile.traffic import TileCalculus

# (register tile, block tile) per axis of a float32 matmul: 6 shared steps of 12 along K = 72
MATMUL = (("M", 64), ("N", 48), ("K", 72))
CHAINS = {"i": (4, 32), "j": (4, 16), "k": (1, 12)}
PRIME = (("M", 67), ("N", 45), ("K", 101))  # 101 = 8 x 12 + 5: the last step is guarded
WAIT_ONE = "cp.async.wait_group 1;"  # the compute of step s waits for the copy of step s only


@lru_cache(maxsize=None)
def pinned(case=MATMUL, chains=tuple(CHAINS.items())):
    """A float32 matmul of `case`'s extents with the program of `chains`, staged."""
    fused = construct(expr("matmul", "float32", **dict(case)), device("h100")).expr
    return fused, _gpu_program(fused, dict(chains), True)


@lru_cache(maxsize=None)
def source(gpu: str, case=MATMUL, chains=tuple(CHAINS.items())) -> str:
    built = build_kernel(*pinned(case, chains), device(gpu))
    assert built.ok, built.error
    return built.source


def test_the_rule_pipelines_staged_multi_step_programs_on_sm80_and_later():
    fused, program = pinned()
    assert shared_steps(program, device("h100")) == 6
    assert pipelined(program, device("h100")) and pipelined(program, device("a100"))
    assert pipelined(program, device("v100")) and register_prefetch(program, device("v100"))  # sm_70
    assert not register_prefetch(program, device("h100"))
    one_step = _gpu_program(fused, dict(CHAINS, k=(1, 72)), True)
    assert shared_steps(one_step, device("h100")) == 1 and not pipelined(one_step, device("h100"))
    assert not pipelined(replace(program, cached=(True, False)), device("h100"))  # stages nothing


def test_doubled_tiles_that_overflow_a_block_are_not_pipelined():
    """(256 + 256) x 12 floats = 24 KiB of tiles: 48 KiB doubled fits the 48 KiB per block;
    (256 + 264) x 12 = 24.4 KiB does not, so that program runs unpipelined."""
    fits = ("matmul", dict(M=512, N=512, K=48))
    fused = construct(expr(fits[0], "float32", **fits[1]), device("h100")).expr
    spec = device("h100")
    at_limit = _gpu_program(fused, {"i": (16, 256), "j": (16, 256), "k": (1, 12)}, True)
    over = _gpu_program(fused, {"i": (8, 256), "j": (8, 264), "k": (1, 12)}, True)
    assert 2 * footprint_at(spec, at_limit, 1) == spec.target_dict()["max_shared_memory_per_block"]
    assert pipelined(at_limit, spec) and not pipelined(over, spec)


def test_pipelined_source_doubles_the_shared_tiles_and_copies_a_step_ahead():
    text = source("h100")
    # 32 x 12 of A and 12 x 16 of B (unpadded: `_gpu_program`), two of each
    assert "A_shared_ptr[768]" in text and "B_shared_ptr[384]" in text
    assert "cp.async.ca.shared.global" in text or "cp.async.cg.shared.global" in text
    prologue, rest = text.split("for (int k_0 = 0; k_0 < 5; ++k_0)")  # the steady state: steps 0..4
    assert "ptx_cp_async" in prologue.split("__global__")[-1]  # step 0's copy, in the kernel before the loop
    steady, epilogue = rest.split("cp_async_wait_group_async_wait_group_0();")
    assert "tvm_builtin_ptx_cp_async_wait_group_async_wait_group_1();" in steady
    assert "((k_0 + 1) & 1) * 384" in steady  # copy of step s + 1 into the other A buffer
    assert "(k_0 & 1) * 384" in steady  # compute of step s from this one
    assert "ptx_cp_async" not in epilogue  # the last step only computes
    assert WAIT_ONE in text


def test_unpipelined_programs_keep_one_buffer_and_plain_copies():
    one_step = tuple(dict(CHAINS, k=(1, 72)).items())
    for gpu in ("h100", "v100"):
        text = source(gpu, MATMUL, one_step)
        assert "A_shared_ptr[2304]" in text and "B_shared_ptr[1152]" in text  # 32 x 72 and 72 x 16, once
        assert "cp.async" not in text and "float4 A_shared_local_ptr" not in text


def test_v100_prefetches_the_next_step_in_registers_around_the_compute():
    """sm_70 (no cp.async): each thread loads its share of step s + 1's tiles into registers
    (3 float4 of the 32 x 12 A tile, 2 of the 12 x 16 B tile, 32 threads), computes step s from
    one shared buffer, then stores the registers into the other."""
    text = source("v100")
    assert "cp.async" not in text
    assert "float4 A_shared_local_ptr[3];" in text and "float4 B_shared_local_ptr[2];" in text
    assert "A_shared_ptr[768]" in text and "B_shared_ptr[384]" in text  # two buffers of each tile
    prologue, rest = text.split("for (int k_0 = 0; k_0 < 5; ++k_0)")
    steady, epilogue = rest.split("\n  }\n  __syncthreads();")
    load, compute_and_store = steady.split("__syncthreads();", 1)
    assert re.search(r"A_shared_local_ptr\[\w+\] = \*\(float4\*\)\(A_ptr", load)  # step s + 1's global loads
    assert "A_shared_ptr +" not in load and "C_local_ptr" not in load  # before any FMA or shared store
    compute, store = compute_and_store.split("__syncthreads();")
    assert "C_local_ptr[15] = (C_local_ptr[15] +" in compute and "A_shared_local_ptr[" not in compute
    assert "((k_0 + 1) & 1) * 384) +" in store and "= A_shared_local_ptr[" in store  # registers to buffer s + 1
    assert "C_local_ptr" not in store
    # TVM's ThreadSync keeps a barrier between the compute of step s and the store of step s + 1
    # (it cannot tell the two buffers apart): two barriers a steady step, not the one they need
    assert steady.count("__syncthreads();") == 2
    assert "A_ptr" not in epilogue  # the last step only computes


def test_register_tiles_multiply_fragments_staged_in_local_arrays():
    for gpu in ("v100", "h100"):  # the loop body and the pipeline's epilogue
        text = source(gpu)
        assert re.search(r"float A_shared_local_ptr(_\d)?\[4\];", text)  # a thread's 4 rows of A
        assert re.search(r"float B_shared_local_ptr(_\d)?\[4\];", text)  # and its 4 columns of B
        products = re.findall(r"C_local_ptr\[\d+\] = \(C_local_ptr\[\d+\] \+ \((\w+)\[\d+\] \* (\w+)\[\d+\]\)\)", text)
        assert len(products) == 2 * 16  # the unrolled 4 x 4 tile
        assert all(a.startswith("A_shared_local_ptr") and b.startswith("B_shared_local_ptr") for a, b in products)


def test_the_block_limit_check_counts_both_buffers():
    fused, program = pinned()
    for gpu, copies in (("h100", 2), ("v100", 2)):
        spec = device(gpu)
        used = gpu_resources(apply_rules(fused, program, spec)[1], spec)
        assert used.shared_bytes == copies * footprint_at(spec, program, 1) == copies * (384 + 192) * 4


CONV = dict(N=1, C=8, H=10, W=10, F=8, KH=3, KW=3, stride=1, pad=1)


@lru_cache(maxsize=None)
def conv():
    """A padded 3 x 3 conv on its direct loop nest (the CUDA-core template's, as a float16 conv on
    a tensor-core GPU keeps it) whose filter window is one shared step: 4 steps of 2 input
    channels."""
    fused = fuse_axes(expr("conv2d", "float32", **CONV))
    chains = {"n": (1, 1), "f": (2, 8), "h": (1, 2), "w": (2, 10), "c": (1, 2), "r": (1, 3), "s": (3, 3)}
    return fused, _gpu_program(fused, chains, True)


@lru_cache(maxsize=None)
def conv_gemm():
    """The same conv as the construction sees it on a GPU, an implicit GEMM (`ops.gemm_view`):
    100 pixels x 8 filters x 72 window elements, 9 shared steps of 8 along K."""
    fused = construct(expr("conv2d", "float32", **CONV), device("h100")).expr
    return fused, _gpu_program(fused, {"nhw": (2, 20), "f": (2, 8), "crs": (1, 8)}, True)


def test_a_conv_pipelines_its_input_channel_steps_around_its_one_step_window():
    fused, program = conv()
    assert pipelined(program, device("h100")) and shared_steps(program, device("h100")) == 4
    built = build_kernel(fused, program, device("h100"))
    assert built.ok, built.error
    # the window loops (r, s) run once a step: the copies sit in the channel-step loop, 3 steps + prologue
    assert "for (int c_0 = 0; c_0 < 3; ++c_0)" in built.source and WAIT_ONE in built.source


def test_the_implicit_gemm_conv_pipelines_its_gather_and_weight_copies():
    fused, program = conv_gemm()
    assert pipelined(program, device("h100")) and shared_steps(program, device("h100")) == 9
    built = build_kernel(fused, program, device("h100"))
    assert built.ok and built.template == "cuda-conv-gemm", built.error
    # two buffers of the 20 x 8 im2col tile and of the 8 x 8 weight tile; 8 steady steps after the prologue
    assert "pad_reindex_shared_ptr[320]" in built.source and "kernel_reindex_shared_ptr[128]" in built.source
    assert re.search(r"for \(int (\w+) = 0; \1 < 8; \+\+\1\)", built.source) and WAIT_ONE in built.source
    # the padding's zeros come from the predicated copy's other arm, not from stale shared memory
    assert "@!p st.shared.u32" in built.source
    assert register_prefetch(program, device("v100"))
    text = build_kernel(fused, program, device("v100")).source
    assert "cp.async" not in text and "pad_reindex_shared_ptr[320]" in text and "float pad_reindex_shared_local_ptr" in text


@pytest.mark.parametrize("gpu", ["h100", "v100"])
@pytest.mark.parametrize("case", ["matmul", "prime", "conv", "conv-gemm"])
def test_a_pipelined_kernel_run_serially_on_this_cpu_matches_numpy(case, gpu):
    """The pipelined schedule (prologue, steady state, epilogue, two buffers) with its threads
    serial, compiled by LLVM for this CPU: the copies synchronous (`run_serially`), the stage
    structure and the buffer indexing TVM's."""
    fused, program = {"matmul": pinned, "prime": lambda: pinned(PRIME), "conv": conv, "conv-gemm": conv_gemm}[case]()
    assert pipelined(program, device(gpu)) and register_prefetch(program, device(gpu)) == (gpu == "v100")
    inputs = random_inputs(fused, seed=0)
    check = check_output(fused, inputs, run_serially(fused, program, device(gpu), inputs))
    assert check.correct, check.error


def test_the_guarded_last_step_is_copied_under_its_guard():
    text = source("h100", PRIME)
    assert "for (int k_0 = 0; k_0 < 8; ++k_0)" in text  # 9 steps: step 0 in the prologue
    assert "< 89)" in text  # K = 101: the copy of step s + 1 reads k < 101 - 12


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_pipelined_kernels(arch):
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    texts = [source("h100"), source("h100", PRIME), build_kernel(*conv(), device("h100")).source, _wmma_kernel().source]
    for result in compile_ptx_many(texts, arch):
        assert result.ok, result.error
        assert "cp.async" in result.ptx and result.ptxas_report.spill_store_bytes == 0


@lru_cache(maxsize=None)
def _wmma_program():
    """float16 matmul 512^3 on the H100 in 32 x 32 x 32 blocks of 32 x 32 x 16 warp tiles: one
    warp a block, 16 shared steps of 32 along K."""
    fused = construct(expr("matmul", "float16", M=512, N=512, K=512), device("h100")).expr
    return fused, make_program(TileCalculus(fused), device("h100"), [(32, 32, 16), (32, 32, 32)], (True, True), 0.05)


@lru_cache(maxsize=None)
def _wmma_kernel():
    kernel = build_kernel(*_wmma_program(), device("h100"))
    assert kernel.ok and kernel.template == "cuda-wmma", kernel.error
    return kernel


def test_the_wmma_template_pipelines_its_shared_copies():
    fused, program = _wmma_program()
    spec = device("h100")
    assert pipelined(program, spec)
    text = _wmma_kernel().source
    assert WAIT_ONE in text and "nvcuda::wmma::mma_sync" in text
    # 32 x 32 block tiles of A (i, k) and B (k, j), rows padded to 40 halves (`rtile.wmma_shared.row_alignment`), twice
    assert "half A_shared_ptr[2560];" in text and "half B_shared_ptr[2560];" in text
    used = gpu_resources(apply_rules(fused, program, spec)[1], spec)
    assert used.shared_bytes == 2 * 2 * 32 * 40 * 2


def test_matmul_4096_top1_on_h100_does_not_spill():
    """Register staging adds a thread's fragments (here 8 + 8 floats) to its 64 accumulators."""
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    spec = device("h100")
    built = construct(expr("matmul", "float32", M=4096, N=4096, K=4096), spec)
    program = built.candidates[0].program
    assert program.tiles[0] == (8, 8, 1)
    kernel = build_kernel(built.expr, program, spec)
    assert kernel.ok, kernel.error
    assert "float A_shared_local_ptr[8];" in kernel.source and "float B_shared_local_ptr[8];" in kernel.source
    result = compile_ptx(kernel.source, spec.target_dict()["arch"])
    assert result.ok, result.error
    report = result.ptxas_report
    assert report.spill_store_bytes == report.spill_load_bytes == report.stack_bytes == 0


def test_matmul_4096_on_v100_prefetches_without_spilling():
    """nvcc 13 has no sm_70: the sm_75 PTX of the V100 kernels (no cp.async either). The top 1
    (64 x 128 x 8 blocks of 4 x 8 register tiles) is not pipelined: its prefetch registers would
    cost a resident block; the first candidate that is pipelined is compiled, and the pinned
    matmul, prime and conv kernels."""
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    spec = device("v100")
    built = construct(expr("matmul", "float32", M=4096, N=4096, K=4096), spec)
    assert not register_prefetch(built.candidates[0].program, spec)
    program = next(c.program for c in built.candidates if register_prefetch(c.program, spec))
    for result in compile_ptx_many([source("v100"), source("v100", PRIME), build_kernel(*conv(), spec).source], "sm_75"):
        assert result.ok and result.ptxas_report.spill_store_bytes == 0, result.error
    kernel = build_kernel(built.expr, program, spec)
    assert kernel.ok, kernel.error
    assert "ptx_cp_async" not in kernel.source and re.search(r"float4? A_shared_local_ptr\[\d+\];", kernel.source)
    result = compile_ptx(kernel.source, "sm_75")
    assert result.ok, result.error
    report = result.ptxas_report
    assert report.spill_store_bytes == report.spill_load_bytes == report.stack_bytes == 0
