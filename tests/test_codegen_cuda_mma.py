"""The WMMA path of the CUDA template: float16 matmuls (batched, transposed, ragged) on tensor-core
GPUs become CUDA with `nvcuda::wmma` fragments, one warp per fragment tile, and nvcc compiles
them; what the path does not take runs on the CUDA cores, with a reason. No GPU here: these
check the schedule, the source and the PTX, not the numbers."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

import pytest

from tests.helpers import device, expr
from workbench.codegen.build import build_kernel
from workbench.codegen.cuda import block_threads, gpu_resources, lane_program
from workbench.codegen.cuda_mma import matmul_layout, schedule_wmma, unsupported, warp_count
from workbench.codegen.nvcc import compile_ptx_many, nvcc_path
from workbench.codegen.rules import apply_rules
from workbench.codegen.template import ScheduleError
from workbench.construct.stepper import construct
from workbench.ops.expr_lang import build_expr
from workbench.rtile.staging import pipelined
from workbench.rtile.rprogram import footprint_at

GPUS = ("v100", "a100", "h100")  # sm_70, sm_80, sm_90a
CASES = {
    "square": dict(M=256, N=256, K=256),
    "batched": dict(M=128, N=128, K=64, B=4),
    "trans_b": dict(M=256, N=128, K=64, trans_b=True),
    "trans_ab": dict(M=256, N=128, K=64, trans_a=True, trans_b=True),
    "ragged": dict(M=200, N=100, K=72),  # no extent divides by 16: padded
}


@lru_cache(maxsize=None)
def candidate(gpu: str, case: str):
    """(fused expression, rank-1 program) of a float16 matmul case."""
    built = construct(expr("matmul", "float16", **CASES[case]), device(gpu))
    return built.expr, built.candidates[0].program


@lru_cache(maxsize=None)
def kernel(gpu: str, case: str):
    return build_kernel(*candidate(gpu, case), device(gpu))


def pinned(case: str, tiles):
    """A case's expression on h100 with fixed tiles, independent of the construction policy."""
    fused, program = candidate("h100", case)
    return fused, replace(program, tiles=tiles)


def pinned_kernel(fused, program):
    built = build_kernel(fused, program, device("h100"))
    assert built.ok, built.error
    return built


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("case", CASES)
def test_matmul_runs_a_warp_per_fragment_tile_on_wmma(gpu, case):
    fused, program = candidate(gpu, case)
    spec = device(gpu)
    assert unsupported(fused, program, spec) is None
    built = kernel(gpu, case)
    assert built.ok, built.error
    assert "nvcuda::wmma::mma_sync" in built.source
    assert "_local_ptr" not in built.source  # no CUDA-core register tile
    threads = warp_count(fused, program) * spec.warp_size
    assert re.search(rf"__launch_bounds__\({threads}[,)]", built.source)
    used = gpu_resources(apply_rules(fused, program, spec)[1], spec)
    assert used.threads == threads
    assert 0 < used.shared_bytes <= spec.target_dict()["max_shared_memory_per_block"]


@pytest.mark.parametrize("gpu", GPUS)
def test_nvcc_compiles_the_wmma_kernels(gpu):
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    arch = device(gpu).target_dict()["arch"]  # sm_70 compiles as nvcc's oldest, sm_75
    results = compile_ptx_many([kernel(gpu, case).source for case in CASES], arch)
    for case, result in zip(CASES, results):
        assert result.ok, f"{case}: {result.error}"
        assert "wmma.mma.sync" in result.ptx and "wmma.load.a" in result.ptx
        assert result.ptxas_report.spill_store_bytes == 0


def test_warps_split_the_block_tile_and_rows_are_padded_for_fragment_loads():
    fused, program = pinned("square", ((32, 32, 16), (64, 64, 32)))
    built = pinned_kernel(fused, program)
    source = built.source
    assert re.search(r"__launch_bounds__\(128[,)]", source)  # 2 x 2 warps
    # a warp's 32 x 32 tile is 2 x 2 accumulator fragments
    assert re.search(r"fragment<nvcuda::wmma::accumulator, 16, 16, 16, half> \w+\[4\];", source)
    # 8 shared steps along K on sm_90: pipelined (`rtile.staging`), two buffers of each tile
    assert "A_shared_ptr[5120]" in source  # 2 x 64 rows of 32 + 8: an odd number of 16-byte groups
    assert "B_shared_ptr[4608]" in source  # 2 x 32 rows of 64 + 8
    assert source.count("ptx_cp_async_legacy_cg_16_") > 2  # 16-byte asynchronous copies
    assert re.search(r"load_matrix_sync\(A_shared\w+\[\w+\], .*, 40\);", source)
    assert "store_matrix_sync((&(C_ptr" in source  # divisible: fragments go straight to the output
    used = gpu_resources(apply_rules(fused, program, device("h100"))[1], device("h100"))
    assert (used.threads, used.shared_bytes) == (128, 2 * (2560 + 2304) * 2)


def test_a_warp_may_cover_several_batches():
    fused, program = pinned("batched", ((2, 16, 16, 16), (2, 32, 32, 64)))
    source = pinned_kernel(fused, program).source
    assert re.search(r"__launch_bounds__\(128[,)]", source)  # 1 x 2 x 2 warps
    assert re.search(r"fragment<nvcuda::wmma::accumulator, 16, 16, 16, half> \w+\[2\];", source)


def test_transposed_operands_use_a_column_major_b_and_a_transposing_copy_of_a():
    assert "matrix_b, 16, 16, 16, half, nvcuda::wmma::col_major" in kernel("h100", "trans_b").source
    # tiles that divide every extent (2 x 2 warps): rank 1 may pad, and a padded operand is
    # copied element by element from its zero-filled copy whatever its layout
    source = pinned_kernel(*pinned("trans_ab", ((16, 16, 16), (32, 32, 64)))).source
    assert "matrix_a, 16, 16, 16, half, nvcuda::wmma::row_major" in source  # A stored as [i, k]
    assert "*(uint4*)(A_shared_ptr" not in source  # strided shared stores: one element per lane
    assert "*(uint4*)(B_shared_ptr" in source


def test_ragged_matmul_is_padded_and_its_output_stored_through_shared_memory():
    built = kernel("h100", "ragged")
    assert "if_then_else(v0 < 200 and v1 < 72, A[v0, v1], T.float16(0.0))" in built.tvmscript
    assert "C[v0, v1] = C_pad_shared[v0, v1]" in built.tvmscript
    assert "< 200 and" in built.tvmscript and "< 100)" in built.tvmscript  # the output copy's guard
    assert "store_matrix_sync((&(C_ptr" not in built.source and "store_matrix_sync" in built.source


def test_layouts_of_the_matmul_variants():
    spec = device("h100")
    square = matmul_layout(candidate("h100", "square")[0], spec)
    assert (square.i, square.j, square.k, square.batch) == (0, 1, 2, ())
    assert (square.a_trans, square.b_trans) == (False, False)
    batched = matmul_layout(candidate("h100", "batched")[0], spec)
    assert (batched.batch, batched.i, batched.k) == ((0,), 1, 3)
    both = matmul_layout(candidate("h100", "trans_ab")[0], spec)
    assert (both.a_trans, both.b_trans) == (True, True)


def _text_case(text: str, **extents):
    built = construct(build_expr(text, extents, "float16"), device("h100"))
    return built.expr, built.candidates[0].program


@pytest.mark.parametrize(
    "text, extents, reason",
    [
        ("C[i,j] += B[k,j] * A[i,k]", dict(i=64, j=64, k=64), "A the i-operand"),
        ("C[i,j] max= A[i,k] * B[k,j]", dict(i=64, j=64, k=64), "not a sum of products"),
        ("C[b,i,j] += A[b,i,k] * B[k,j]", dict(b=2, i=64, j=64, k=64), "axis fusion"),
    ],
)
def test_other_contractions_fall_back_to_the_cuda_cores(text, extents, reason):
    fused, program = _text_case(text, **extents)
    spec = device("h100")
    assert reason in unsupported(fused, program, spec)
    built = build_kernel(fused, program, spec)
    assert built.ok, built.error
    assert "wmma" not in built.source
    assert re.search(rf"__launch_bounds__\({block_threads(fused, lane_program(fused, program, spec), spec)}[,)]", built.source)
    with pytest.raises(ScheduleError, match=reason):
        schedule_wmma(fused, program, spec)


def test_programs_off_the_wmma_path_say_why():
    spec = device("h100")
    fused, program = candidate("h100", "square")
    assert "does not stage" in unsupported(fused, replace(program, cached=(True, False)), spec)
    off_grid = replace(program, tiles=((16, 8, 16), (16, 16, 16)))
    assert "not a multiple of the 16x16x16 fragment" in unsupported(fused, off_grid, spec)
    plain = construct(expr("matmul", M=64, N=64, K=64), spec)
    assert "do not apply" in unsupported(plain.expr, plain.candidates[0].program, spec)
    rocm = replace(spec, target=tuple(sorted((dict(spec.target) | {"kind": "rocm"}).items())))  # as the loader holds it
    assert "not cuda" in unsupported(fused, program, rocm)


def test_vthreads_are_refused_on_the_wmma_path():
    with pytest.raises(ScheduleError, match="vthreads"):
        fused, program = candidate("h100", "square")
        apply_rules(fused, replace(program, vthreads=(("j", 2),)), device("h100"))


@pytest.mark.parametrize(
    "gpu, shape",
    [
        ("a100", dict(M=4096, N=4096, K=4096)),  # padded 128 x 192 grids staged 51 KB of output
        ("h100", dict(M=4096, N=4096, K=4096)),  # 512 x 128 blocks: rows of 16 halves padded to 24
        ("h100", dict(M=65536, N=1024, K=4096)),
        ("v100", dict(M=128, N=3072, K=768)),  # BERT-base feed-forward up-projection
    ],
)
def test_every_top_wmma_program_fits_the_shared_memory_the_construction_counted(gpu, shape):
    """The construction's shared footprint of a WMMA program (`rtile.wmma_shared`) is what the
    template allocates: once, or (pipelined) the input tiles twice, within the block's limit, so
    every top-10 program schedules (they asked for 58-150 KB of the 48 KiB before)."""
    spec = device(gpu)
    built = construct(expr("matmul", "float16", **shape), spec)
    limit = spec.target_dict()["max_shared_memory_per_block"]
    for c in built.candidates[:10]:
        assert unsupported(built.expr, c.program, spec) is None
        used = gpu_resources(apply_rules(built.expr, c.program, spec)[1], spec).shared_bytes
        counted = footprint_at(spec, c.program, 1)
        if pipelined(c.program, spec):
            assert counted < used <= 2 * counted <= limit
        else:
            assert used == counted <= limit
