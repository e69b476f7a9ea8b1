"""The CPU template, build and verify: constructed programs become kernels that match numpy.

Every kernel here runs on this machine, so the device is `local-cpu` (detected): a kernel built
for another CPU model could use instructions this one lacks.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import TINY_CPU, device, expr, suite_workloads, workload_expr
from test_alignment import AVX2, AVX512
from workbench.codegen.build import X86_FEATURES, Kernel, build_kernel, target_dict
from workbench.codegen.common import chain_factors
from workbench.codegen.cpu import schedule_cpu
from workbench.rtile.panels import PAD_STEP, simd_lanes, vector_width
from workbench.rtile.plan import PANELS, ROW, cpu_plan, describe, loop_nest_key
from workbench.codegen.verify import verify
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.ops.expr_lang import build_expr
from workbench.ops.fusion import fuse_axes
from workbench.rtile.axes import vector_axis
from workbench.rtile.rprogram import RProgram, make_program
from workbench.rtile.traffic import calculus

CPU = "local-cpu"


def vectorised_row(columns: int = 16) -> tuple[str, ...]:
    """How a register row of `columns` fp32 reads on this machine's CPU: vectors of the SIMD
    width, unrolled when the row holds more than one (`_micro_kernel` vectorises one register at
    a time), e.g. 16 columns are one vector on AVX-512 and two unrolled 8-lane vectors on AVX2."""
    lanes = min(simd_lanes(device(CPU), 4), columns)
    vector = f"T.vectorized({lanes})"
    return (vector,) if columns == lanes else (f"T.unroll({columns // lanes})", vector)


CORE = {w["id"]: w for w in suite_workloads("cpu-core")}


@lru_cache(maxsize=None)
def _construction(e):
    return construct(e, device(CPU), options=Options(topk=5))


def _kernel(e, rank: int = 1):
    """Build the program of `rank` (the last one when there are fewer) of `e`'s construction."""
    c = _construction(e)
    assert c.candidates, "the construction produced no program"
    program = c.candidates[min(rank, len(c.candidates)) - 1].program
    return c.expr, program, build_kernel(c.expr, program, device(CPU))


def _assert_correct(e, rank: int = 1):
    fused, _, kernel = _kernel(e, rank)
    assert kernel.ok, kernel.error
    check = verify(kernel, fused)
    assert check.correct, check.error
    return kernel


@pytest.mark.parametrize("rank", (1, 5))
@pytest.mark.parametrize("workload", sorted(CORE))
def test_cpu_core_kernels_match_numpy(workload, rank):
    _assert_correct(workload_expr(CORE[workload]), rank)


IRREGULAR = {
    "matmul-prime": ("matmul", dict(M=257, N=127, K=509)),
    "matmul-odd": ("matmul", dict(M=33, N=65, K=17)),
    "matmul-tiny": ("matmul", dict(M=3, N=5, K=7)),
    "bmm-3-ta": ("matmul", dict(B=3, M=17, N=31, K=13, trans_a=True)),
    "bmm-3-tb": ("matmul", dict(B=3, M=20, N=12, K=9, trans_b=True)),
    "gemv-odd": ("gemv", dict(M=101, K=77)),
    "conv-s2-p2-d2": ("conv2d", dict(N=2, C=3, H=11, W=10, F=5, KH=3, KW=3, stride=2, pad=2, dilation=2)),
    "conv-s3-p1": ("conv2d", dict(N=1, C=7, H=13, W=13, F=9, KH=5, KW=3, stride=3, pad=1)),
    "depthwise-x3": ("depthwise_conv2d", dict(N=1, C=5, H=9, W=11, KH=3, KW=3, stride=2, pad=1, multiplier=3)),
    "avgpool-pad": ("avgpool", dict(N=2, C=3, H=10, W=9, K=3, stride=2, pad=1)),
    "maxpool-pad": ("maxpool", dict(N=1, C=4, H=9, W=9, K=2, stride=2, pad=1)),
    "reduce-outer-inner": ("reduce_sum", dict(shape=(6, 7, 10), axes=(0, 2))),
    "reduce-mean-2": ("reduce_mean", dict(shape=(5, 12, 11), axes=(1, 2))),
    "relu-fused": ("relu", dict(shape=(17, 11, 3))),
    "gelu-odd": ("gelu", dict(shape=(1001,))),
    "add-odd": ("add", dict(shape=(64, 33))),
}


@pytest.mark.parametrize("case", sorted(IRREGULAR))
def test_irregular_shapes_match_numpy(case):
    op, params = IRREGULAR[case]
    _assert_correct(expr(op, **params))


@pytest.mark.parametrize(
    "text, extents",
    [
        ("C[i,j] += A[k,i] * B[j,k]", dict(i=37, j=29, k=23)),
        ("O[i] += X[i + k] * w[k]", dict(i=50, k=7)),
        ("P[i] *= A[i, 2*j + 1] + 1.5", dict(i=9, j=6)),
        ("Y[i,j] = -A[i,j] / 2 + sigmoid(B[j]) * exp(A[i,j]) - tanh(abs(A[i,j]))", dict(i=13, j=40)),
        ("M[b,i] max= X[b,j,i]", dict(b=3, i=48, j=5)),
    ],
)
def test_expression_kernels_match_numpy(text, extents):
    _assert_correct(build_expr(text, extents))


def _program(e, chains: dict, cached: tuple[bool, ...] = (True,) * 3) -> RProgram:
    """A (registers, L1, L2) program with the given tile chain per axis (top first)."""
    tiles = tuple(tuple(chains[a.name][layer] for a in e.axes) for layer in range(3))
    zeros = tuple(0 for _ in e.tensors)
    return RProgram(tuple(a.name for a in e.axes), ("registers", "L1", "L2"), tiles, (zeros,) * 3, cached, 1, 0.0, e)


_CHAIN = st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(1, 4)).map(
    lambda m: (m[0], m[0] * m[1], m[0] * m[1] * m[2])
)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(("matmul", "conv")), st.lists(_CHAIN, min_size=7, max_size=7))
def test_any_tile_chain_gives_a_correct_kernel(which, chains):
    """Guards for every non-dividing tile: any chain of multiples is realised correctly."""
    if which == "matmul":
        e = expr("matmul", M=13, N=20, K=9)
    else:
        e = expr("conv2d", N=1, C=3, H=7, W=8, F=5, KH=3, KW=2, stride=2, pad=1)
    e = fuse_axes(e)
    kernel = build_kernel(e, _program(e, {a.name: c for a, c in zip(e.axes, chains)}), device(CPU))
    assert kernel.ok, kernel.error
    check = verify(kernel, e, seed=3)
    assert check.correct, check.error


FUSED_RAGGED = ("M[i,j] += A[k,i,j]", "M[i,j] *= A[k,i,j]", "M[i,j] min= A[k,i,j]", "M[i,j] max= A[k,i,j]")


@pytest.mark.parametrize("text", FUSED_RAGGED)
def test_fused_ragged_reductions_match_numpy(text):
    """Issue 12: i and j fuse into one axis of 315, which tiles of 160 cut inside a row of 35.
    The write-back of a tile was the box of whole rows, so each core overwrote 20 outputs of
    the other with values it never computed. The pinned program is the one that failed; the
    constructed ranks are what `profile` builds."""
    e = build_expr(text, dict(i=9, j=35, k=301))
    fused = fuse_axes(e)
    kernel = build_kernel(fused, _program(fused, {"ij": (16, 160, 160), "k": (1, 16, 304)}), device(CPU))
    assert kernel.ok, kernel.error
    assert "M_local = T.sblock_alloc_buffer((315,)" in kernel.tvmscript  # laid out along ij
    check = verify(kernel, fused)
    assert check.correct, check.error
    for rank in (1, 5):
        _assert_correct(e, rank)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_fused_ragged_reduction_builds_with_its_edge_tile_apart(dev):
    """The fused reduction above on an 8-lane core: its 16-wide register rows are two vectors,
    so the plan runs the tile the row's end cuts apart (`CpuPlan.edge_vectors`), whose partition
    leaves the copies' blocks sharing their iteration variables. The caller's (9, 35) shapes
    (`with_call_shapes`) built the function anew through a Schedule, whose well-formedness
    check refused that, and no kernel of the operator built on an AVX2 core. On 16 lanes the
    row is one vector and nothing runs apart. It builds on both (run and checked against numpy
    on this machine's own spec above)."""
    e = fuse_axes(build_expr(FUSED_RAGGED[0], dict(i=9, j=35, k=301)))
    program = _program(e, {"ij": (16, 160, 160), "k": (1, 16, 304)})
    assert cpu_plan(program, dev).edge_vectors == (dev is AVX2)
    kernel = build_kernel(e, program, dev)
    assert kernel.ok, kernel.error
    assert kernel.views  # the caller's shapes


def test_fused_ragged_reduce_sum_matches_numpy():
    e = expr("reduce_sum", shape=(301, 9, 35), axes=(0,))
    fused = fuse_axes(e)
    kernel = build_kernel(fused, _program(fused, {"i0i1": (16, 160, 160), "r0": (1, 16, 304)}), device(CPU))
    check = verify(kernel, fused)
    assert check.correct, check.error
    for rank in (1, 5):
        _assert_correct(e, rank)


def test_reduction_over_every_axis_gives_a_scalar():
    e = fuse_axes(expr("reduce_sum", shape=(6, 10), axes=(0, 1)))
    kernel = build_kernel(e, _program(e, {"r0r1": (4, 8, 16)}), device(CPU))
    assert kernel.ok, kernel.error
    assert verify(kernel, e).correct


def test_matmul_schedule_is_parallel_vectorised_and_accumulates_locally():
    kernel = _assert_correct(workload_expr(CORE["mm-512"]))
    assert "T.parallel" in kernel.tvmscript and "T.vectorized" in kernel.tvmscript
    assert 'scope="local"' in kernel.tvmscript and "C_init" in kernel.tvmscript
    assert kernel.template == "cpu" and kernel.source_suffix == "ll"
    assert f"@{kernel.entry}" in kernel.source or f'"{kernel.entry}"' in kernel.source
    assert dict(kernel.sources)["s"].strip()  # the assembly is there too
    assert "sch.parallel" in kernel.trace_python and "sch.reorder" in kernel.trace_python


# (op, shape, tile chain per axis, the buffers laid out: name, declared, the caller's)
FLAT_BUFFERS = {
    "relu": (dict(shape=(1, 256, 56, 56)), ((32, 4096, 57344),),
             (("X", (802816,), (1, 256, 56, 56)), ("Y", (802816,), (1, 256, 56, 56)))),
    "add": (dict(shape=(1, 256, 56, 56)), ((32, 4096, 57344),),
            (("A", (802816,), (1, 256, 56, 56)), ("B", (802816,), (1, 256, 56, 56)),
             ("C", (802816,), (1, 256, 56, 56)))),
    "reduce_sum": (dict(shape=(8, 256, 56, 56), axes=(0,)), ((112, 896, 28672), (8, 8, 8)),
                   (("X", (8, 802816), (8, 256, 56, 56)), ("Y", (802816,), (256, 56, 56)))),
}


@pytest.mark.parametrize("op", sorted(FLAT_BUFFERS))
@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_a_kernel_reads_its_fused_buffers_by_the_fused_index(op, mcpu):
    """Fused dimensions (an element-wise operator's, the kept ones of a sum over the batch) once
    reached TVM as the fused index's divisions and remainders by 56 and 3136, which its
    simplifier no longer folded into one contiguous index where a tile (57344 = 1024 rows of 56,
    28672 = 512) is not whole 56 x 56 planes: the vectorised loop moved its elements one at a time
    (40 and 137 `insertelement`s in the LLVM IR), up to 12x slower. Laid out along the fused axis,
    the buffers are indexed by it alone, on AVX2 and AVX-512 code, and the kernel still takes
    the caller's buffers."""
    params, chains, views = FLAT_BUFFERS[op]
    e = fuse_axes(expr(op, **params))
    program = _program(e, {a.name: chain for a, chain in zip(e.axes, chains)})
    spec = replace(device(CPU), target=tuple(sorted({**dict(device(CPU).target), "mcpu": mcpu}.items())))
    kernel = build_kernel(e, program, spec)
    assert kernel.ok, kernel.error
    assert kernel.views == tuple((name, (declared, caller)) for name, declared, caller in views)
    assert [a.shape for a in kernel.args] == [caller for _, _, caller in views]
    body = "\n".join(line for line in kernel.tvmscript.splitlines() if not line.lstrip().startswith("#"))
    assert "//" not in body and "%" not in body, body
    assert dict(kernel.sources)["ll"].count("insertelement") == 0


@pytest.mark.parametrize("op", sorted(FLAT_BUFFERS))
def test_a_kernel_over_flat_buffers_matches_numpy(op):
    params, chains, _ = FLAT_BUFFERS[op]
    e = fuse_axes(expr(op, **params))
    _local_kernel(e, {a.name: chain for a, chain in zip(e.axes, chains)})


def _short_rows(width: int) -> tuple:
    """A depthwise conv whose output rows are `width` columns, and a program of one whole row a
    register tile (tile chains by axis name)."""
    e = fuse_axes(expr("depthwise_conv2d", N=1, C=24, H=9, W=width, KH=3, KW=3, stride=1, pad=1))
    return e, dict(n=(1, 1, 1), c=(1, 1, 12), h=(3, 9, 9), w=(width, width, width), r=(3, 3, 3), s=(3, 3, 3))


@pytest.mark.parametrize("mcpu, lanes, width", [("haswell", 8, 7), ("skylake-avx512", 16, 13)])
def test_a_whole_row_shorter_than_a_vector_runs_in_vectors(mcpu, lanes, width):
    """A row shorter than a vector (a late depthwise layer's 7 or 13 columns) ran scalar, one FMA
    a lane, while the model priced it in LLVM's pieces (120 5x5 filters over 16 x 13 outputs: 77
    us against 18 vectorised on two Zen 4 cores). Vectorised whole, it compiles to packed FMAs
    (8 + 4 + 1 lanes for 13), on AVX2 and AVX-512 code."""
    e, chains = _short_rows(width)
    local = device(CPU)
    spec = replace(local, warp_size=lanes, target=tuple(sorted({**dict(local.target), "mcpu": mcpu}.items())))
    kernel = build_kernel(e, _program(e, chains), spec)
    assert kernel.ok, kernel.error
    assert f"T.vectorized({width})" in kernel.tvmscript
    assert re.search(r"vfmadd\d+ps", dict(kernel.sources)["s"])


def test_a_whole_row_shorter_than_a_vector_matches_numpy():
    e, chains = _short_rows(7)  # shorter than a vector on AVX2 and AVX-512 alike
    assert "T.vectorized(7)" in _local_kernel(e, chains).tvmscript


@pytest.mark.parametrize("op", ["maxpool", "avgpool"])
def test_a_padding_copy_under_a_fused_tile_copies_that_tile(op):
    """A batched pooling fuses its images and channels (4 x 90 = 360) and pads its input in a copy
    per unit tile. Over separate image and channel iterators, TVM relaxed a tile of 36 of the 360
    to the whole images around it: each tile copied 90 or 180 channels (rank 2 of 4 x 90 x 82 x 68
    ran 971 us where rank 1's tiles of 30, which divide 90, ran 562; 2 x 153 x 59 x 33 ran 2.8-3.0 ms,
    89 us since). Iterating over the fused index, the copy writes exactly the tile."""
    e = fuse_axes(expr(op, N=4, C=90, H=82, W=68, K=2, stride=1, pad=1))
    assert [a.name for a in e.axes] == ["nc", "h", "w", "r", "s"]
    chains = {"nc": (1, 1, 36), "h": (7, 7, 49), "w": (16, 16, 80), "r": (2, 2, 2), "s": (2, 2, 2)}
    kernel = _local_kernel(e, chains)
    pad = _block(kernel.tvmscript, "pad")
    assert "T.axis.spatial(360," in pad and "90" not in pad, pad  # no image and channel of the fused index
    loops = kernel.tvmscript[:kernel.tvmscript.index('T.sblock("pad")')].splitlines()
    assert "T.grid(36," in next(line for line in reversed(loops) if "T.grid(" in line)
    assert dict(kernel.views)["data"] == ((360, 82, 68), (4, 90, 82, 68))


def test_epilogue_is_folded_into_the_kernel_and_padding_is_its_own_stage():
    _, _, kernel = _kernel(expr("avgpool", N=1, C=2, H=9, W=9, K=3, stride=2, pad=1))
    assert kernel.ok, kernel.error
    assert 'T.sblock("pad")' in kernel.tvmscript  # the border is built once, not tested per lane
    # per unit tile, under the parallel grid loop, by the core that reads it
    script = kernel.tvmscript
    assert script.index("T.parallel(") < script.index('T.sblock("pad")')
    assert kernel.tvmscript.count("T.if_then_else") == 1  # in the pad stage only, not the main block
    assert 'T.sblock("O")' not in kernel.tvmscript  # division folded into the write-back
    assert "/ T.float32(9.0)" in kernel.tvmscript or "* T.float32(0.111" in kernel.tvmscript


def test_broken_programs_are_recorded_not_raised():
    fused, program, _ = _kernel(expr("matmul", M=64, N=64, K=64))
    not_multiple = replace(program, tiles=((3, 16, 1), (4, 16, 8), (8, 32, 8)))
    kernel = build_kernel(fused, not_multiple, device(CPU))
    assert not kernel.ok and "multiple" in kernel.error and kernel.executable is None
    wrong_axes = replace(program, axes=("x", "y", "z"))
    assert "axes" in build_kernel(fused, wrong_axes, device(CPU)).error
    one_layer = replace(program, tiles=program.tiles[:1], layers=program.layers[:1])
    assert not build_kernel(fused, one_layer, device(CPU)).ok
    assert not verify(kernel, fused).correct and "not built" in verify(kernel, fused).error


def test_a_crashing_run_is_recorded():
    _, _, small = _kernel(expr("matmul", M=8, N=8, K=8))
    check = verify(small, expr("matmul", M=16, N=16, K=16))  # arguments of the wrong shape
    assert not check.correct and check.error.startswith("run:")


def test_helpers_split_chains_and_find_the_contiguous_axis():
    assert chain_factors(100, (2, 8, 32)) == [None, 4, 4, 2]
    assert vector_axis(expr("matmul", M=4, N=5, K=6)) == 1  # j indexes C's last dimension
    assert vector_axis(fuse_axes(expr("reduce_sum", shape=(3, 4), axes=(0, 1)))) is None


def test_failed_kernel_is_a_kernel():
    kernel = Kernel(ok=False, error="compile: boom")
    assert kernel.source == "" and not verify(kernel, expr("relu", shape=(4,))).correct
    with pytest.raises(RuntimeError):
        kernel.runtime()


@pytest.mark.parametrize(
    "dtype, op, params",
    [
        ("float16", "matmul", dict(M=64, N=48, K=100)),
        ("float64", "conv2d", dict(N=1, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=1, pad=1)),
    ],
)
def test_other_dtypes_match_numpy(dtype, op, params):
    _assert_correct(expr(op, dtype, **params))


# Generated specs for schedule-only checks: TINY_CPU has 16 fp32 lanes (AVX-512-like), this one 8.
AVX2_LIKE = replace(TINY_CPU, name="tiny-avx2", warp_size=8, registers_per_thread_cap=12, registers_per_unit=16)


def _block(script: str, name: str) -> str:
    """The TVMScript text of block `name`, up to the next block."""
    start = script.index(f'T.sblock("{name}")')
    end = script.find("T.sblock(", start + 1)
    return script[start:] if end < 0 else script[start:end]


def _line(script: str, text: str) -> str:
    """The first line of `script` that holds `text`."""
    return next(line for line in script.splitlines() if text in line)


def _local_kernel(e, chains: dict, cached: tuple[bool, ...] = (True,) * 3):
    kernel = build_kernel(e, _program(e, chains, cached), device(CPU))
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    return kernel


def test_cached_matmul_tiles_become_packed_panels_and_an_unguarded_micro_kernel():
    """M = 100 leaves a ragged L2 tile of 6-row register tiles: the padded A panel takes the
    tail, so the micro-kernel has no predicate and only the pack and the write-back are guarded."""
    e = expr("matmul", M=100, N=64, K=128)
    kernel = _local_kernel(e, dict(i=(6, 12, 48), j=(16, 32, 64), k=(1, 32, 64)))
    script = kernel.tvmscript
    # A's L2 tile copied row by row (zero past row 100); B in 16-column strips, K-steps in turn
    assert "A_pad[v0, v1] = T.if_then_else(v0 < 100" in script
    assert "B_global[v1 // 16, v0, v1 % 16] = B[v0, v1]" in script
    # one panel per core and K-step: the packs run inside the parallel grid, under the K loop
    assert script.index("T.parallel") < script.index("for k_0") < script.index('T.sblock("A_pad")')
    update = _block(script, "C_update")
    assert "T.where" not in update and "A_pad[v_i, v_k]" in update
    assert "T.unroll(6)" in script and all(loop in script for loop in vectorised_row())
    assert "T.where" in _block(script, "C_pad")  # the write-back skips the padding rows


def test_a_register_row_past_a_ragged_n_runs_whole_vectors_over_padded_panels():
    """47 x 64 x 23 in register tiles of 8 rows x 32 columns, past N's end in whole vectors
    (`alignment.padded_row_axis`), under 24 x 32 unit tiles: the tails pad (B's panel is 32
    columns wide, zero past the 23rd; A's, though one register tile reads it, takes the rows'
    tail, whose cut tile the grid would guard: `panels.GRID_CUT_SHARE`), so the micro-kernel
    has no predicate and runs whole vectors, and only the write-back skips the padding; the
    kernel matches numpy."""
    e = expr("matmul", M=47, N=23, K=64)
    kernel = _local_kernel(e, dict(i=(8, 8, 24), j=(32, 32, 32), k=(1, 32, 64)))
    script = kernel.tvmscript
    update = _block(script, "C_update")
    assert "T.where" not in update and "B_pad[" in update and "A_pad[" in update
    assert all(loop in script for loop in vectorised_row(32))
    assert "T.where" in _block(script, "C_pad")


def test_a_padded_program_reads_in_place_the_input_one_register_tile_reads():
    """50 x 37 x 45 in 6 x 16 register tiles under 60 x 16 unit tiles, one register tile across
    N: every axis ragged. B reads N, the vector axis: its padding copy is its panel (zero past
    the 45th column), so the vectors stay whole. A's panel would be read by one register tile
    only (`panels.read_once`), and one unit tile holds every row: A is read in place, unpadded
    (`CpuPlan.edge_axes`: its rows and K), and the loops over its tiles carry the
    loop-partition hint, so that lowering runs the tiles inside the rows and K unguarded and
    keeps the guard in the tiles their ends cut. The kernel matches numpy."""
    e = expr("matmul", M=50, N=45, K=37)
    chains = dict(i=(6, 12, 60), j=(16, 16, 16), k=(1, 16, 16))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.padded_tails and plan.packed == ("B",) and plan.edge_axes == (0, 2)
    script = _local_kernel(e, chains).tvmscript
    update = _block(script, "C_update")
    assert "A_pad" not in script and "A[v_i, v_k]" in update and "B_pad[" in update
    assert "T.where" in update  # the rows' and K's guard, lifted by the partitioning
    assert all(loop in script for loop in vectorised_row())
    assert all(HINT in _line(script, f"for {loop} in") for loop in ("k_0", "i_1", "i_2", "k_2"))


HINT = 'annotations={"pragma_loop_partition_hint": 1}'
RAGGED_K = {
    # M, N and K all ragged; K = 37 in K-steps of 16 pads with zeros (a sum of products)
    "every-axis": (expr("matmul", M=50, N=45, K=37), dict(i=(6, 12, 24), j=(16, 16, 32), k=(1, 16, 16))),
    # only K ragged: the inputs are padded, the output is not (it accumulates in a cache_write buffer)
    "k-only": (expr("matmul", M=48, N=64, K=37), dict(i=(6, 12, 24), j=(16, 16, 32), k=(1, 16, 16))),
    # the whole (padded) reduction in one L1 tile: accumulators stored straight from registers
    "direct-stores": (expr("matmul", M=50, N=45, K=13), dict(i=(6, 6, 24), j=(16, 16, 32), k=(1, 16, 16))),
}


@pytest.mark.parametrize("case", sorted(RAGGED_K))
def test_a_ragged_k_is_padded_with_zeros_and_the_micro_kernel_runs_unguarded(case):
    """A ragged K of a sum of products pads with zeros like the spatial tails (`pad_einsum`):
    the micro-kernel has no predicate and reads padded panels; the padding copies carry TVM's
    loop-partition hint on their loops, so that lowering copies the interior in unguarded
    vectors and tests only the edge; the kernel matches numpy."""
    e, chains = RAGGED_K[case]
    kernel = _local_kernel(e, chains)
    script = kernel.tvmscript
    update = _block(script, "C_update")
    assert "T.where" not in update and "A_pad[" in update and "B_pad[" in update
    assert all(loop in script for loop in vectorised_row())
    for pack in ("A_pad", "B_pad"):
        # its loop over rows carries the hint (and over vectors, unless of one vector), the vector loop not
        loops = script[:script.index(f'T.sblock("{pack}")')].splitlines()[-4:-1]
        assert HINT in loops[0] and "T.vectorized" in loops[-1] and HINT not in loops[-1]
    assert ('T.sblock("C_pad")' in script) == (case != "k-only")
    if case == "direct-stores":
        # each register tile's unrolled stores sit under its guard: the loops over register
        # tiles carry the hint instead, so the tiles inside the output store whole vectors
        assert all(f"for {loop} in T.serial" in script and HINT in _line(script, f"for {loop} in")
                   for loop in ("i_1", "j_1"))


@pytest.mark.parametrize("k, staggered", [(256, True), (288, False)])
def test_a_strip_panel_whose_strips_share_an_l1_set_is_staggered(k, staggered):
    """B's 16 strips of 16 columns: of 256 K-steps they lie 16 KiB apart, a multiple of the
    L1d's 4 KiB way, so the copy puts a line of every strip, for each row of B it reads, into
    one set, more than `L1_WAYS`: it pads each strip by a line (`_stagger_strips`: storage_align
    on the strip dimension). Of 288 K-steps (18 KiB) they alternate between two sets, 8 each:
    no pad. The kernels match numpy."""
    e, chains = expr("matmul", M=16, N=256, K=k), dict(i=(4, 4, 16), j=(16, 16, 256), k=(1, k // 4, k))
    script = _local_kernel(e, chains).tvmscript
    assert f"B_global = T.sblock_alloc_buffer((16, {k}, 16))" in script
    assert ('"buffer_dim_align": [[0, 0, 1024, 16]]' in script) == staggered


@pytest.mark.parametrize("c, along_panel", [(416, True), (512, False)])
def test_a_filter_panel_copy_writes_its_rows_whole_where_its_reads_spread(c, along_panel):
    """32 filters of C channels x 3 x 3 copied into one panel of 32-filter rows per unit tile:
    the copy runs strip by strip with the strip's 32 filters innermost (`_copy_along_panel`),
    each panel row written whole in vectors of filters (16 lanes: 2 x 16 filters; 8: 4 x 8),
    where the 32 source rows it then reads at once spread over the L1d's sets (416 channels:
    rows 14,976 bytes apart, 32 sets); 512 channels' rows, 18 KiB apart, fall into two sets, and
    that copy keeps the source's order, element by element. The kernels match numpy."""
    e = expr("conv2d", N=1, C=c, H=7, W=13, F=32, KH=3, KW=3, stride=1, pad=1)
    chains = dict(n=(1, 1, 1), f=(32, 32, 32), h=(1, 1, 7), w=(4, 4, 12), c=(1, 16, c), r=(1, 3, 3), s=(1, 3, 3))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.path == "filters"
    script = _local_kernel(e, chains).tvmscript
    copy = "\n".join(script[:script.index('T.sblock("kernel')].splitlines()[-4:-1])
    vector = vector_width(32, plan.lanes)
    assert (f"T.grid(1, {c}, 3, 3):" in copy) == along_panel, copy
    assert (f"T.unroll({32 // vector})" in copy and f"T.vectorized({vector})" in copy) == along_panel, copy
    assert (f"T.grid(32, {c}, 3, 3):" in copy) == (not along_panel), copy
    assert ("T.vectorized" in copy) == along_panel, copy


@pytest.mark.parametrize("f, path", [(16, "filters"), (3, "row")])
def test_a_padding_window_that_spills_is_copied_per_reduction_step(f, path):
    """2 images x 48 channels of 32 x 32, padded by 1: a unit tile of 8 output rows reads a
    window of 2 x 48 x 10 x 34 x 4 B = 130,560 B over its 6 steps of 8 channels, over 60 % of a
    128 KiB last-level cache (`panels.window_spills`): the copy is made under the unit tile's
    reduction loop, one step's 8 channels at a time, on the filters path and on the row path (3
    filters: the output row takes the lanes) alike, and the kernels match numpy. With a 32 MiB
    cache the copy stays per unit tile, before the reduction loop."""
    e = expr("conv2d", N=2, C=48, H=32, W=32, F=f, KH=3, KW=3, stride=1, pad=1)
    pixels = dict(h=(2, 2, 8), w=(1, 8, 32)) if f == 16 else dict(h=(2, 2, 8), w=(16, 16, 32))
    chains = dict(n=(2, 2, 2), f=(f, f, f), c=(1, 4, 8), r=(1, 3, 3), s=(1, 3, 3), **pixels)
    dev = replace(device(CPU), llc_bytes=128 * 2**10, llc_gbps=100.0)
    program = _program(e, chains)
    plan = cpu_plan(program, dev)
    assert plan.path == path and plan.pad_level == PAD_STEP
    assert "border copied per reduction step" in describe(plan, program)
    kernel = build_kernel(e, program, dev)
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    script = kernel.tvmscript
    assert script.index("T.parallel") < script.index("for c_0") < script.index('T.sblock("pad")')
    assert "T.grid(2, 8, 10, 34)" in script[:script.index('T.sblock("pad")')].splitlines()[-2]  # one step's window
    roomy = replace(dev, llc_bytes=32 * 2**20)
    assert cpu_plan(program, roomy).pad_level == 0
    assert "border copied per unit tile" in describe(cpu_plan(program, roomy), program)
    roomy_script = build_kernel(e, program, roomy).tvmscript
    assert roomy_script.index('T.sblock("pad")') < roomy_script.index("for c_0")


SPLIT_EDGES = {
    # one row over a ragged N: 100 = 64 + 2 x 16 + 4, the last 4 columns a cut register tile
    "one-row": (expr("matmul", M=1, N=100, K=64), dict(i=(1, 1, 1), j=(16, 32, 64), k=(1, 16, 64))),
    # the whole reduction in one L1 tile: each register tile stored straight from registers
    "direct-stores": (expr("matmul", M=1, N=100, K=24), dict(i=(1, 1, 1), j=(16, 32, 64), k=(1, 24, 24))),
    # K ragged too (37 in K-steps of 16 and 32), over register tiles of one K-step
    "ragged-k": (expr("matmul", M=1, N=100, K=37), dict(i=(1, 1, 1), j=(16, 32, 64), k=(1, 16, 32))),
    # rows in flight (`axes.stream_rows`): 6 rows of B per register tile, at every layer
    "rows-in-flight": (expr("matmul", M=1, N=100, K=24), dict(i=(1, 1, 1), j=(16, 32, 64), k=(6, 6, 6))),
    # 16 rows over a K of 37 (`stream_rows`): K's end cuts the third step, guarded per step
    "rows-in-flight-ragged-k": (expr("matmul", M=1, N=100, K=37), dict(i=(1, 1, 1), j=(16, 32, 64), k=(16, 16, 16))),
    # register K-steps of 2 over a K of 37: K's end cuts a register tile, guarded per step
    "cut-register-k": (expr("matmul", M=1, N=100, K=37), dict(i=(1, 1, 1), j=(16, 32, 64), k=(2, 16, 32))),
}


@pytest.mark.parametrize("case", sorted(SPLIT_EDGES))
def test_a_ragged_row_with_no_panels_splits_its_edge_off_and_runs_vectors(case):
    """A one-row matmul over a ragged N packs nothing, so nothing pads its tail: the plan splits
    the edge off (`CpuPlan.split_edges`). The row is vectorised under its guard, the N loops
    between the grid and the register tile carry the loop-partition hint, and lowering leaves
    the interior's FMAs whole vectors (the guarded row was scalar: no vector FMA at all); the
    kernel matches numpy."""
    e, chains = SPLIT_EDGES[case]
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.split_edges and plan.path == ROW and plan.packed == ()
    kernel = _local_kernel(e, chains)
    script = kernel.tvmscript
    assert "T.where" in _block(script, "C_update") and HINT in script
    assert all(loop in script for loop in vectorised_row())
    lanes = simd_lanes(device(CPU), 4)
    assert re.search(rf"@llvm\.fmuladd\.v{min(lanes, 16)}f32", dict(kernel.sources)["ll"])
    if chains["k"][0] > 1:
        # the K-steps stay a loop: unrolled, each copied the edge tile's scalarised body
        # (one-row matmuls of 7 rows over 80-wide rows compiled 31 s so)
        assert not re.search(r"for k_\d+ in T\.unroll", script)


def test_a_ragged_k_is_split_where_its_end_lies_above_the_l1_tile():
    """16 rows in flight over K = 37 (`axes.stream_rows`) at every layer: K's end cuts the third
    step of rows, in the loop over the unit tile's K-steps, above the loops over tiles. That
    loop carries the partition hint as well, so lowering runs the first two steps without K's
    guard; with K = 48 (nothing ragged) it carries none. The kernels match numpy."""
    hinted = re.compile(rf"for k_0 in T\.serial\(\d+, {re.escape(HINT)}\)")
    ragged_k = _local_kernel(*SPLIT_EDGES["rows-in-flight-ragged-k"])
    assert hinted.search(ragged_k.tvmscript)
    e, chains = expr("matmul", M=1, N=100, K=48), dict(i=(1, 1, 1), j=(16, 32, 64), k=(16, 16, 16))
    assert cpu_plan(_program(e, chains), device(CPU)).split_edges
    assert not hinted.search(_local_kernel(e, chains).tvmscript)


def test_a_few_row_matmul_over_a_ragged_k_with_no_panels_splits_its_edges_and_runs_vectors():
    """Four rows over a K of 37 in register K-steps of 2 and N = 100, the cache tiles left
    unstaged (Roller staged nothing: no panels), as few-row matmuls over a long ragged K are
    constructed (4 x 4537 x 109): K's end cuts a register tile. Its guard is the same for every
    lane, so the plan splits the edges off (`panels.splits_edges`) and the row runs in vector
    FMAs under it, where it ran scalar behind the guard; the kernel matches numpy."""
    e, chains = expr("matmul", M=4, N=100, K=37), dict(i=(4, 4, 4), j=(16, 32, 64), k=(2, 16, 32))
    cached = (True, False, False)
    plan = cpu_plan(_program(e, chains, cached), device(CPU))
    assert plan.split_edges and plan.path == ROW and plan.packed == () and not plan.guarded_row
    kernel = _local_kernel(e, chains, cached)
    assert HINT in kernel.tvmscript
    lanes = simd_lanes(device(CPU), 4)
    assert re.search(rf"@llvm\.fmuladd\.v{min(lanes, 16)}f32", dict(kernel.sources)["ll"])


@pytest.mark.parametrize("k, split", [(64, 1), (64, 2), (37, 1)])
def test_a_few_row_program_read_in_place_splits_its_edge_off_instead_of_padding(k, split):
    """Five rows over N = 100 in 5 x 16 register tiles under 64-column unit tiles: N's tail pads
    the program, every input copied (`panels._panel_inputs`). Its in-place variant
    (`RProgram.in_place`, `panels.reads_in_place`) copies nothing: the kernel reads A and B as
    stored, the loops over N's tiles carry the partition hint and keep the guard in the tile the
    end cuts, the interior in vector FMAs; so with its reduction split over two cores (split-K,
    as emission may take it), and over a ragged K (37 in unit K-steps of 32), whose last step
    keeps K's guard. The kernels match numpy."""
    e, chains = expr("matmul", M=5, N=100, K=k), dict(i=(5, 5, 5), j=(16, 32, 64), k=(1, 16, 32))
    padded = _program(e, chains)
    assert cpu_plan(padded, device(CPU)).packed == ("A", "B")
    program = replace(padded, in_place=True, split=split)
    plan = cpu_plan(program, device(CPU))
    assert plan.path == ROW and plan.split_edges and plan.packed == () and not plan.padded_tails
    kernel = build_kernel(e, program, device(CPU))
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    script = kernel.tvmscript
    assert "A_pad" not in script and "B_pad" not in script and HINT in script
    assert all(loop in script for loop in vectorised_row())
    lanes = simd_lanes(device(CPU), 4)
    assert re.search(rf"@llvm\.fmuladd\.v{min(lanes, 16)}f32", dict(kernel.sources)["ll"])


@pytest.mark.parametrize("batch_tile, k_steps, hinted", [(2, 16, False), (4, 16, True), (2, 8, True)])
def test_a_batch_the_grid_cuts_keeps_its_guard_where_registers_store_straight_out(batch_tile, k_steps, hinted):
    """Three batches of a 4 x 16 x 100 matmul read in place (`RProgram.in_place`: the row path,
    its edges split off), the whole K in one L1 tile (`CpuPlan.direct_stores`). In unit tiles of
    two batches the grid holds two of them and the end cuts the second, where it depends on the
    grid's index: partitioned there, the batch's loop left a copy of the unit tile's whole nest
    past the end, every lane testing the row's guard scalar (6 batches of 16 x 20 x 194 ran
    138 us so, 7 without the mark, 5 predicted). So the batch's loops carry no partition hint,
    its guard one test a tile, while N's carry it. In one unit tile of four the end is a
    constant, and where the K-steps sum into a unit-tile buffer (two L1 K-steps) the mark stays:
    there dropping it cost as often as it gained. The kernels match numpy and run vector FMAs."""
    e = expr("matmul", B=3, M=4, N=100, K=16)
    chains = dict(b=(1, 1, batch_tile), i=(4, 4, 4), j=(16, 32, 64), k=(1, k_steps, 16))
    program = replace(_program(e, chains), in_place=True)
    plan = cpu_plan(program, device(CPU))
    assert plan.path == ROW and plan.split_edges and plan.direct_stores == (k_steps == 16)
    kernel = build_kernel(e, program, device(CPU))
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    split = set(re.findall(rf"for (\w)_\d+ in T\.serial\(\d+, {re.escape(HINT)}\)", kernel.tvmscript))
    assert "j" in split and ("b" in split) == hinted
    lanes = simd_lanes(device(CPU), 4)
    assert re.search(rf"@llvm\.fmuladd\.v{min(lanes, 16)}f32", dict(kernel.sources)["ll"])


EDGE_VECTORS = {
    # 180 = 96 + 48 + 36: the tile N's end cuts holds whole vectors (36 = 2 x 16 + 4, 4 x 8 + 4)
    "whole-k": (expr("matmul", M=1, N=180, K=64), dict(i=(1, 1, 1), j=(48, 48, 96), k=(1, 16, 64))),
    # with 16 rows in flight over a K of 37 (`stream_rows`), as one-row matmuls are constructed
    "rows-in-flight": (expr("matmul", M=1, N=180, K=37), dict(i=(1, 1, 1), j=(48, 48, 96), k=(16, 16, 16))),
}


@pytest.mark.parametrize("case", sorted(EDGE_VECTORS))
def test_a_one_row_edge_tile_runs_its_whole_vectors_in_vectors(case):
    """A one-row register tile of several vectors whose unit tiles leave no register tile wholly
    past N's end (192 - 180 < 48): the plan runs the last register tile of each unit tile apart
    (`CpuPlan.edge_vectors`, `codegen.cpu._edge_tile_apart`): the loop over L1 tiles is
    partitioned before its last one, whose loop over vectors keeps the partition hint and comes
    before its L1 tile's K-steps (each vector summed in a register of its own), while the other copy
    unrolls its vectors inside the K-steps (the micro-kernel); the register tiles' loop has no
    hint. The kernel matches numpy (random inputs: a cut tile that added its neighbours' columns
    twice would not)."""
    e, chains = EDGE_VECTORS[case]
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.split_edges and plan.edge_vectors and plan.path == ROW
    script = _local_kernel(e, chains).tvmscript
    width = min(simd_lanes(device(CPU), 4), 16)
    vectors = 48 // width
    assert re.search(rf"for j_\d+_0 in T\.serial\({vectors}, {re.escape(HINT)}\):\s+for k_2\b", script)
    assert re.search(rf"for j_\d+_0 in T\.unroll\({vectors}\):\s+for j_\d+_1 in T\.vectorized\({width}\)", script)
    assert len(re.findall(r'T\.sblock\("C_update_j_\d+_partition"\)', script)) == 2
    assert not re.search(rf"for j_\d+ in T\.serial\(\d+, {re.escape(HINT)}\)", script)


def test_a_row_that_ends_on_a_vector_keeps_the_register_tiles_split():
    """176 columns (11 vectors of 16, 22 of 8) in register tiles of 48 and unit tiles of 96: the
    end cuts the second unit tile's second register tile on a vector (`panels.ends_on_vector`),
    so the plan splits the loop over register tiles (no `edge_vectors`): the tiles inside the row
    keep their unrolled micro-kernel, the cut one runs its vectors under a guard the same for
    each vector's lanes, and the kernel matches numpy (random inputs)."""
    e, chains = expr("matmul", M=1, N=176, K=64), dict(i=(1, 1, 1), j=(48, 48, 96), k=(1, 16, 64))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.split_edges and not plan.edge_vectors
    script = _local_kernel(e, chains).tvmscript
    assert re.search(rf"for j_\d+ in T\.serial\(\d+, {re.escape(HINT)}\)", script)
    assert not re.search(rf"for j_\d+_0 in T\.serial\(\d+, {re.escape(HINT)}\)", script)


# A workspace allocation in a kernel's LLVM IR: TVMBackendAllocWorkspace(device type 1 (CPU),
# device id, bytes, dtype code, dtype bits), called through the runtime's function pointer.
WORKSPACE = re.compile(r"call ptr %[\w.]+\(i32 1, i32 %[\w.]+, i64 (\d+), i32 \d+, i32 \d+\)")


def test_register_tile_accumulators_of_padded_panels_live_on_the_stack():
    """Direct stores (the whole K in one L1 tile) over 20 columns padded to 32: the row ends
    inside the second register tile's first vector, so LoopPartition gives that tile a copy of
    its own. The accumulators of 4 x 16 floats (256 bytes) are a stack buffer that LLVM keeps in
    registers (`CpuPlan.stack_accumulators`), not a TVM workspace: only the packed panels, too
    big for the stack, are (`WORKSPACE`); the kernel matches numpy. Without padded tails (a K
    split over L1 tiles into a unit tile's buffer, or a guarded tile) the plan keeps `local`."""
    e, chains = expr("matmul", M=64, N=20, K=32), dict(i=(4, 8, 64), j=(16, 16, 32), k=(1, 32, 32))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.direct_stores and plan.padded_tails and plan.packed and plan.stack_accumulators
    assert "stack-allocated" in describe(plan, _program(e, chains))
    kernel = _local_kernel(e, chains)
    sizes = [int(n) for n in WORKSPACE.findall(dict(kernel.sources)["ll"])]
    assert sizes and min(sizes) >= 1024, sizes  # TVM's kMaxStackAlloca: smaller buffers go on the stack
    assert 4 * 16 * 4 not in sizes
    assert not cpu_plan(_program(e, dict(chains, k=(1, 16, 32))), device(CPU)).stack_accumulators


def test_row_tile_accumulators_stored_from_registers_live_on_the_stack():
    """A depthwise conv (24 channels over 16 x 16) in register tiles of one channel's 2 rows x 16
    columns over the whole 3 x 3 window: the row path stores its registers (`direct_stores`) with
    no guard along the row, so its 128 bytes of accumulators are a stack buffer, not a TVM
    workspace, whose contents LLVM copied to the stack at every step of a dividing tile's row
    loop (`CpuPlan.stack_accumulators`, docs/evidence.md#accumulator-scope: on an Intel core; this
    machine's spec as one, whatever its vendor); the kernel matches numpy."""
    e = expr("depthwise_conv2d", N=1, C=24, H=16, W=16, KH=3, KW=3, stride=1, pad=1)
    chains = dict(n=(1, 1, 1), c=(1, 1, 12), h=(2, 2, 16), w=(16, 16, 16), r=(3, 3, 3), s=(3, 3, 3))
    intel = replace(device(CPU), vendor="intel")
    plan = cpu_plan(_program(e, chains), intel)
    assert plan.path == "row" and plan.direct_stores and not plan.split_edges and plan.stack_accumulators
    kernel = build_kernel(e, _program(e, chains), intel)
    assert kernel.ok, kernel.error
    check = verify(kernel, e)
    assert check.correct, check.error
    sizes = [int(n) for n in WORKSPACE.findall(dict(kernel.sources)["ll"])]
    assert all(size >= 1024 for size in sizes), sizes  # TVM's kMaxStackAlloca
    assert 2 * 16 * 4 not in sizes


def test_a_register_tile_wholly_past_the_end_keeps_the_register_tiles_split():
    """100 columns in unit tiles of 96 pad to 192, so the second unit tile's second register
    tile of 48 lies wholly past the end: TVM would bound the split vector loop's scalar rest by
    a negative count of whole vectors, unclamped, and add the tile before it twice. The plan
    splits the loop over register tiles there instead (no `edge_vectors`); the kernel matches."""
    e, chains = expr("matmul", M=1, N=100, K=64), dict(i=(1, 1, 1), j=(48, 48, 96), k=(1, 16, 64))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.split_edges and not plan.edge_vectors
    script = _local_kernel(e, chains).tvmscript
    assert re.search(rf"for j_\d+ in T\.serial\(\d+, {re.escape(HINT)}\)", script)


def test_a_conv_row_ragged_both_ways_splits_every_edge_off():
    """3 filters (fewer than a vector: the output row takes the lanes) over 23 x 23 outputs in
    16-wide register rows of 2 output rows: both pixel axes ragged in their unit tiles (12 and
    32). The plan splits the edges off along both (`panels.splits_edges`), the row and the rows'
    loops over register tiles carry the partition hint, and the kernel matches numpy (the rows'
    ragged end kept the whole row scalar behind the guard before)."""
    e = expr("conv2d", N=1, C=5, H=23, W=23, F=3, KH=3, KW=3, stride=1, pad=1)
    chains = dict(n=(1, 1, 1), f=(1, 3, 3), h=(2, 4, 12), w=(16, 16, 32), c=(1, 5, 5), r=(1, 3, 3), s=(1, 3, 3))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.path == ROW and plan.split_edges and not plan.guarded_row
    script = _local_kernel(e, chains).tvmscript
    split = re.findall(r"for (\w)_\d+ in T\.serial\(\d+, annotations=\{\"pragma_loop_partition_hint\": 1\}\)", script)
    assert {"h", "w"} <= set(split)


def test_a_whole_row_over_ragged_rows_splits_the_rows_edge_off():
    """A depthwise conv's 16-wide rows of 6 output rows over 26 output rows in a unit tile of
    30: the row is whole and the rows ragged (`CpuPlan.split_others`), so the rows' loop over
    register tiles carries the partition hint (TVM's guard left in every tile ran dwconv-3x3's
    6 x 16 tiles 1.8-2x slower), the row's does not, and the kernel matches numpy."""
    e = expr("depthwise_conv2d", N=1, C=3, H=26, W=32, KH=3, KW=3, stride=1, pad=1)
    chains = dict(n=(1, 1, 1), c=(1, 1, 3), h=(6, 6, 30), w=(16, 16, 32), r=(3, 3, 3), s=(3, 3, 3))
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.path == ROW and plan.split_others and not plan.split_edges
    script = _local_kernel(e, chains).tvmscript
    split = re.findall(r"for (\w)_\d+ in T\.serial\(\d+, annotations=\{\"pragma_loop_partition_hint\": 1\}\)", script)
    assert split and set(split) == {"h"}


def test_a_ragged_fused_row_splits_its_edge_off_and_stores_vectors():
    """relu over (2, 5, 67), its axes fused into one row of 670 (`fuse_axes`, as a model's
    elementwise operators and concatenations are read): 670 = 2 x 256 + 158 leaves a tail in
    256-element unit tiles of 16-element register tiles. The edge is split off as on a plain
    row, so lowering stores the interior in whole vectors (guarded, the row was unrolled scalar:
    SqueezeNet's concatenations of 55 x 55 maps ran 13x ONNX Runtime's time so); the kernel
    matches numpy."""
    e = fuse_axes(expr("relu", shape=(2, 5, 67)))
    assert len(e.axes) == 1 and len(e.axes[0].fused_from) == 3
    chains = {e.axes[0].name: (16, 64, 256)}
    plan = cpu_plan(_program(e, chains), device(CPU))
    assert plan.split_edges and not plan.guarded_row and plan.path == ROW
    kernel = _local_kernel(e, chains)
    assert HINT in kernel.tvmscript
    lanes = min(simd_lanes(device(CPU), 4), 16)
    assert f"store <{lanes} x float>" in dict(kernel.sources)["ll"]


@pytest.mark.parametrize("k, rows, factor", [(2048, 16, 1024), (1536, 16, None), (1280, 16, None), (512, 32, 512)])
def test_a_row_major_panel_whose_rows_share_an_l1_set_is_staggered(k, rows, factor):
    """A's panel keeps the L2 tile's rows, `rows` of them read per K-step: 2048 floats (8 KiB)
    put the register tile's 16 rows into one L1d set, so each row is padded by a line
    (`storage_align` to 16 modulo 1024 floats); 1536 floats (6 KiB) alternate between two sets,
    8 rows each, within an 8-way L1d, and 1280 floats (5 KiB) cycle through four, and both stay
    unpadded; 512 floats (2 KiB) alternate between two sets too, and 32 rows put 16 lines into
    each: those rows are padded to 16 modulo 512 floats. All verify. (Each L1 tile of A spans
    more than any L1d, 32 to 48 KiB: 64 KiB for 32 rows of 2 KiB, so A is packed on any CPU.)"""
    e = expr("matmul", M=2 * rows, N=64, K=k)
    chains = dict(i=(rows, rows, 2 * rows), j=(16, 16, 64), k=(1, 128, k))
    assert cpu_plan(_program(e, chains), device(CPU)).packed == ("A",)
    kernel = _local_kernel(e, chains)
    aligned = [line for line in kernel.trace_python.splitlines() if "storage_align" in line]
    assert len(aligned) == (factor is not None)
    assert factor is None or aligned[0].endswith(f"axis=0, factor={factor}, offset=16)")


def test_a_ragged_k_that_zeros_would_change_keeps_its_guard():
    """`max=` over a ragged K: zero inputs would win the max, so nothing is padded: no panels,
    the guarded row, and the right answer."""
    e = build_expr("C[i,j] max= A[i,k] * B[k,j]", dict(i=13, j=32, k=19))
    chains = dict(i=(6, 6, 12), j=(16, 16, 32), k=(1, 8, 16))
    assert not e.pads_reduction and cpu_plan(_program(e, chains), device(CPU)).packed == ()
    kernel = _local_kernel(e, chains)
    assert "_pad" not in kernel.tvmscript and "T.where" in _block(kernel.tvmscript, "C_update")


PACKED = {
    "trans-a-b": (build_expr("C[i,j] += A[k,i] * B[j,k]", dict(i=13, j=40, k=16)),
                  dict(i=(4, 4, 8), j=(16, 16, 32), k=(1, 8, 16))),
    "batched": (expr("matmul", B=3, M=20, N=32, K=24), dict(b=(1, 1, 1), i=(4, 8, 16), j=(16, 16, 32), k=(1, 8, 24))),
    "max-plus": (build_expr("C[i,j] max= A[i,k] + B[k,j]", dict(i=13, j=32, k=16)),
                 dict(i=(6, 6, 12), j=(16, 16, 32), k=(1, 8, 16))),
    "product": (build_expr("C[i,j] *= A[i,k] + B[k,j]", dict(i=7, j=48, k=5)),
                dict(i=(2, 4, 8), j=(16, 16, 48), k=(1, 5, 5))),
}


@pytest.mark.parametrize("case", sorted(PACKED))
def test_packed_matmul_class_kernels_match_numpy(case):
    """Transposed inputs become strips like any other (the pack transposes them), and padding
    rows never reach a max, product or batched output."""
    e, chains = PACKED[case]
    kernel = _local_kernel(e, chains)
    assert all(loop in kernel.tvmscript for loop in vectorised_row()) and "sch.transform_layout" in kernel.trace_python
    assert "T.where" not in _block(kernel.tvmscript, "C_update")


def test_panel_copies_are_vectorised_where_the_panel_keeps_rows_contiguous():
    """A's row-major copy and B's strips (a 32-wide register row: [j // 32, k, j % 32]) are
    copied in 16-lane vectors on a 16-lane CPU; a transposed B ([j, k] read along j, its copy
    moving j innermost) is copied element by element (checked on the schedules)."""
    e = expr("matmul", M=64, N=1024, K=1024)
    chains = dict(i=(4, 16, 32), j=(32, 32, 64), k=(1, 16, 64))
    script = schedule_cpu(e, _program(e, chains), TINY_CPU).mod.script()
    assert "B_global[v1 // 32, v0, v1 % 32]" in script
    assert all("T.vectorized(16)" in _copy_loop(script, copy) for copy in ("A_global", "B_global"))
    moved = build_expr("C[i,j] += A[i,k] * B[j,k]", dict(i=64, j=1024, k=1024))
    loop = _copy_loop(schedule_cpu(moved, _program(moved, chains), TINY_CPU).mod.script(), "B_global")
    assert "T.grid" in loop and "T.vectorized" not in loop


def _copy_loop(script: str, block: str) -> str:
    """The innermost loop's line around block `block` (the line before its `with`)."""
    return script[: script.index(f'T.sblock("{block}")')].splitlines()[-2]


@pytest.mark.parametrize("m, batches", [(100, 0), (64, 3)])
def test_a_register_tile_holding_the_whole_reduction_stores_its_accumulators_to_the_output(m, batches):
    """K = 48 fits one L1 tile: each register tile's accumulators leave in vector stores (whole
    registers of this machine) right after its K-loop (the write-back under the loop over register tiles, vectorised), not from a
    buffer of the whole unit tile copied out once per grid iteration (a plain loop nest). M = 100
    pads (the store is guarded by row), the batched case does not; all four match numpy."""
    batch = {"B": batches} if batches else {}
    e = expr("matmul", M=m, N=64, K=48, **batch)
    chains = dict(i=(4, 8, 16), j=(16, 32, 64), k=(1, 48, 48), **({"b": (1, 1, 1)} if batches else {}))
    lanes = min(16, simd_lanes(device(CPU), 4))  # this machine's: 16 on AVX-512, 8 on AVX2
    assert f"T.vectorized({lanes})" in _store_loop(_local_kernel(e, chains).tvmscript)
    split = expr("matmul", M=m, N=64, K=96, **batch)  # two L1 tiles of K: the unit tile's buffer
    # plain loops (a padded output's marked for partitioning at the padding rows)
    assert re.search(r"T\.(grid|serial)\(", _store_loop(_local_kernel(split, dict(chains, k=(1, 48, 96))).tvmscript))


def _store_loop(script: str) -> str:
    """The innermost loop's line around the block that writes the output C."""
    block = script.rindex("T.sblock(", 0, script.index("T.writes(C["))
    return script[:block].splitlines()[-2]


def test_panels_are_made_only_for_a_vectorised_micro_kernel():
    """An 8-column register tile fills a vector on an 8-lane CPU, which packs, not on a 16-lane
    one, which keeps the plain loop nest (checked on the schedules, nothing runs). Rows 4 KiB
    apart: in place, the L1 tiles would span more than the L1 (`panels._panel_pays`)."""
    e = expr("matmul", M=64, N=1024, K=1024)
    chains = dict(i=(4, 16, 32), j=(8, 32, 64), k=(1, 16, 64))
    avx2 = schedule_cpu(e, _program(e, chains), AVX2_LIKE).mod.script()
    avx512 = schedule_cpu(e, _program(e, chains), TINY_CPU).mod.script()
    assert "B_global[v1 // 8, v0, v1 % 8]" in avx2 and "T.vectorized(8)" in avx2
    assert "B_global" not in avx512 and "T.vectorized" not in avx512
    wide = schedule_cpu(e, _program(e, dict(chains, j=(16, 32, 64))), TINY_CPU).mod.script()
    assert "B_global[v1 // 16, v0, v1 % 16]" in wide and "T.vectorized(16)" in wide


@pytest.mark.parametrize("spec", [AVX2_LIKE, TINY_CPU], ids=["8-lane", "16-lane"])
def test_a_register_row_of_several_vectors_is_unrolled_over_whole_vectors(spec):
    """A 24-wide row is 3 vectors of 8 lanes on both ISAs, each reading its strip of the panel
    through a plain ramp (vectorised whole, its `j // 24, j % 24` index became gathers). B's rows
    6 KiB apart, so that it is packed (`panels._panel_pays`)."""
    e = expr("matmul", M=64, N=1536, K=64)
    script = schedule_cpu(e, _program(e, dict(i=(4, 16, 32), j=(24, 24, 48), k=(1, 16, 64))), spec).mod.script()
    assert "B_global[v1 // 24, v0, v1 % 24]" in script
    assert "T.unroll(3)" in script and "T.vectorized(8)" in script and "T.vectorized(24)" not in script


def test_vector_width_is_a_register_or_a_power_of_two_dividing_the_row():
    from workbench.rtile.panels import vector_width

    assert [vector_width(n, 8) for n in (4, 8, 12, 16, 24, 40)] == [4, 8, 4, 8, 8, 8]
    assert [vector_width(n, 16) for n in (16, 24, 32, 48)] == [16, 8, 16, 16]


LANES = {
    "gemv": (expr("gemv", M=37, K=256), {"spatial": (2, 4, 8), "reduce": (16, 64, 256)}),
    "mean-rows-fused": (expr("reduce_mean", shape=(5, 12, 64), axes=(2,)), {"spatial": (2, 4, 12), "reduce": (16, 32, 64)}),
    "max": (build_expr("M[b,i] max= X[b,i,j]", dict(b=3, i=5, j=64)), {"spatial": (1, 1, 5), "reduce": (16, 32, 64)}),
    "min": (build_expr("M[i] min= A[i,j]", dict(i=7, j=48)), {"spatial": (2, 2, 4), "reduce": (16, 16, 48)}),
    "product": (build_expr("P[i] *= A[i,j] + 1.5", dict(i=7, j=32)), {"spatial": (2, 2, 4), "reduce": (16, 16, 32)}),
}


@pytest.mark.parametrize("case", sorted(LANES))
def test_reductions_along_contiguous_k_vectorise_in_lanes(case):
    """No output axis to vectorise: the register tile's 16 K-values become lanes with partial
    results of their own (rfactor), combined per tile, epilogue (the mean's division) after."""
    e, by_kind = LANES[case]
    e = fuse_axes(e)
    kernel = _local_kernel(e, {a.name: by_kind[a.kind] for a in e.axes})
    assert "sch.rfactor" in kernel.trace_python and all(loop in kernel.tvmscript for loop in vectorised_row())
    assert "_rf_local" in kernel.tvmscript


RAGGED_LANES = {
    # K of 100 in 64-wide unit tiles: a whole unit tile, then 2 whole register tiles and 4 left
    "max": (build_expr("M[i] max= A[i,j]", dict(i=7, j=100)), {"spatial": (1, 7, 7), "reduce": (16, 32, 64)}),
    # K of 61 inside one unit tile (softmax's row maximum over a ragged row)
    "min": (build_expr("M[b,i] min= X[b,i,j]", dict(b=2, i=3, j=61)), {"spatial": (1, 3, 3), "reduce": (16, 64, 64)}),
    "mean": (expr("reduce_mean", shape=(3, 4, 203), axes=(2,)), {"spatial": (2, 4, 12), "reduce": (16, 64, 128)}),
}


def _lowered(sch, dev) -> str:
    """`sch`'s module through lowering up to vectorisation, as `tvm.compile` runs it (its loop
    partitioning included)."""
    import tvm
    from tvm import s_tir, tirx

    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(), tirx.transform.NarrowDataType(32),
              s_tir.transform.LoopPartition(), tirx.transform.VectorizeLoop(True), tirx.transform.StmtSimplify()]
    with tvm.target.Target(target_dict(dev)):
        return tvm.transform.Sequential(passes)(sch.mod).script()


@pytest.mark.parametrize("spec", [TINY_CPU, AVX2_LIKE], ids=lambda d: d.name)
def test_a_one_vector_strip_past_a_ragged_n_is_copied_in_whole_half_vectors(spec):
    """4 x 64 x 45 in one-vector register rows and unit tiles (three or six tiles of N, the
    last cut by N's end): B's padding copy runs a strip row in two half vectors, so lowering
    splits it where N ends and the tiles inside N copy whole half vectors, unguarded, only the
    half N's end cuts testing each lane (a one-vector loop left it nothing to split: every
    tile's copy ran scalar); the kernel matches numpy on this machine."""
    lanes = simd_lanes(spec, 4)
    e = expr("matmul", M=4, N=45, K=64)
    chains = dict(i=(4, 4, 4), j=(lanes, lanes, lanes), k=(1, 64, 64))
    program = _program(e, chains)
    assert cpu_plan(program, spec).padded_tails
    lowered = _lowered(schedule_cpu(e, program, spec), spec)
    half = lanes // 2
    assert re.search(rf"B_pad\[[^\]]*\] = B\w*\[T\.Ramp\([^)]*, 1, {half}\)\]", lowered), lowered
    assert re.search(r"B_pad\[[^\]]*\] = T\.if_then_else\(", lowered), lowered  # the cut half, lane by lane
    local = simd_lanes(device(CPU), 4)
    _local_kernel(e, dict(chains, j=(local, local, local)))


@pytest.mark.parametrize("case", sorted(RAGGED_LANES))
def test_a_ragged_k_in_lanes_runs_whole_vectors_and_its_edge_apart(case):
    """A K the unit tile leaves ragged still runs in lanes (`CpuPlan.split_edges`): lowering
    splits K's loops over tiles where K ends, so the register tiles inside it update their
    lanes as whole vectors, unguarded, and only the one K's end cuts tests each lane, scalar;
    the partial results stay correct (numpy) for max, min and a mean's sum."""
    e, by_kind = RAGGED_LANES[case]
    e = fuse_axes(e)
    program = _program(e, {a.name: by_kind[a.kind] for a in e.axes})
    plan = cpu_plan(program, device(CPU))
    assert plan.path == "lanes" and plan.split_edges
    _local_kernel(e, {a.name: by_kind[a.kind] for a in e.axes})
    lowered = _lowered(schedule_cpu(e, program, device(CPU)), device(CPU))
    k = e.axes[e.reduce[-1]].extent
    # a 16-lane vector store (into a register tile's own partial sums where the L1 tile spans K)
    assert re.search(r"_rf_local\[(?:[^\]]* \+ 16|0:16)\] = ", lowered), lowered
    # one guarded scalar register tile: the lanes of the last one below K's end
    guards = re.findall(r"if (\w+) < (\d+):", lowered)
    assert [int(bound) for _, bound in guards if int(bound) < 16] == [k % 16], lowered


@pytest.mark.parametrize("spec", [TINY_CPU, AVX2_LIKE], ids=lambda d: d.name)
def test_lanes_whose_l1_tile_spans_k_are_summed_per_register_tile(spec):
    """A gemv in 3-row register tiles under 12-row unit tiles, K ragged (203): where the L1 tile
    spans K (`CpuPlan.direct_stores` on the lanes path) the partial sums are one register tile's
    (3 outputs x lanes), summed right after its K-loop; where the L1 tile cuts K, the unit
    tile's (12 x lanes), summed after the unit tile's K. Both kernels match numpy on this
    machine."""
    e = expr("gemv", M=37, K=203)

    def chains(lanes: int, whole: bool) -> dict:
        padded = -(-203 // lanes) * lanes
        return dict(i=(3, 3, 12), k=(lanes, padded if whole else lanes, padded))

    lanes = simd_lanes(spec, 4)
    for whole, sums in ((True, 3 * lanes), (False, 12 * lanes)):
        program = _program(e, chains(lanes, whole))
        plan = cpu_plan(program, spec)
        assert plan.path == "lanes" and plan.direct_stores == whole
        lowered = _lowered(schedule_cpu(e, program, spec), spec)
        assert re.search(rf"y_rf_local = T\.alloc_local\(\({sums},\)", lowered), lowered
    local = simd_lanes(device(CPU), 4)
    for whole in (True, False):
        _local_kernel(e, chains(local, whole))


def test_lanes_need_a_whole_vector_of_k():
    """8 K-values fill an 8-lane vector but half a 16-lane one: only the 8-lane CPU splits lanes."""
    e = expr("gemv", M=64, K=256)
    program = _program(e, dict(i=(4, 8, 32), k=(8, 64, 256)))
    assert "y_rf_local" in schedule_cpu(e, program, AVX2_LIKE).mod.script()
    assert "y_rf" not in schedule_cpu(e, program, TINY_CPU).mod.script()


def test_no_padding_without_a_vectorised_micro_kernel():
    """A ragged matmul whose 8-column register tile is half a 16-lane vector keeps its guarded
    tail: padding copies every input, worth it only for the unguarded vector micro-kernel."""
    e = expr("matmul", M=100, N=64, K=64)
    chains = dict(i=(6, 12, 48), j=(8, 32, 64), k=(1, 16, 64))
    assert "A_pad" in schedule_cpu(e, _program(e, chains), AVX2_LIKE).mod.script()
    assert "A_pad" not in schedule_cpu(e, _program(e, chains), TINY_CPU).mod.script()


FILTERS = {
    # stride 2 with padding; rows ragged in the register tile (2 on 7 outputs: a guarded tail)
    "s2-pad": (dict(N=1, C=5, H=13, W=13, F=32, KH=3, KW=3, stride=2, pad=1),
               dict(n=(1, 1, 1), f=(16, 32, 32), h=(2, 4, 8), w=(1, 7, 7), c=(1, 5, 5), r=(1, 3, 3), s=(1, 1, 3))),
    # 24 filters in one register row (3 x 8 lanes), C = 13 channels, a 5 x 3 window, pad 2
    "f24-c13": (dict(N=2, C=13, H=9, W=11, F=24, KH=5, KW=3, stride=1, pad=2),
                dict(n=(1, 1, 2), f=(24, 24, 24), h=(1, 3, 9), w=(4, 4, 12), c=(1, 13, 13), r=(1, 5, 5), s=(3, 3, 3))),
    # 40 filters in a 48-filter unit tile of 16-wide register rows: padded with 8 zero filters
    "f40-ragged": (dict(N=1, C=8, H=6, W=6, F=40, KH=3, KW=3, stride=1, pad=1),
                   dict(n=(1, 1, 1), f=(16, 16, 48), h=(1, 2, 6), w=(2, 6, 6), c=(1, 8, 8), r=(1, 3, 3), s=(1, 3, 3))),
    # 31 filters (prime), two images, stride 2: 8-wide register rows, 16-filter unit tiles (32)
    "f31-prime-s2": (dict(N=2, C=5, H=11, W=9, F=31, KH=3, KW=3, stride=2, pad=1),
                     dict(n=(1, 1, 2), f=(8, 16, 16), h=(2, 2, 6), w=(1, 5, 5), c=(1, 5, 5), r=(1, 3, 3), s=(1, 3, 3))),
    # 11 filters, a 1x1 window: one 8-wide register row, padded to 16 in one unit tile
    "f11-1x1": (dict(N=1, C=9, H=7, W=13, F=11, KH=1, KW=1, stride=1, pad=0),
                dict(n=(1, 1, 1), f=(8, 16, 16), h=(1, 7, 7), w=(4, 4, 12), c=(1, 9, 9), r=(1, 1, 1), s=(1, 1, 1))),
    # 13 filters, stride 2, in a register tile of 16 longer than the axis (one AVX-512 vector,
    # `axes.short_filter_axis`; two AVX2 ones): padded with 3 zero filters
    "f13-short-s2": (dict(N=1, C=7, H=9, W=10, F=13, KH=3, KW=3, stride=2, pad=1),
                     dict(n=(1, 1, 1), f=(16, 16, 16), h=(1, 5, 5), w=(1, 5, 5), c=(1, 7, 7), r=(1, 3, 3), s=(1, 3, 3))),
    # 5 filters, a quarter of an AVX-512 vector, over a prime 11 x 11 output (`axes.short_filter_axis`):
    # one vector of 16, padded with 11 zero filters; register rows and columns of 3 x 5 leave
    # both output axes ragged, their edges split off
    "f5-quarter": (dict(N=1, C=6, H=11, W=11, F=5, KH=5, KW=5, stride=1, pad=2),
                   dict(n=(1, 1, 1), f=(16, 16, 16), h=(3, 6, 12), w=(5, 5, 15), c=(1, 6, 6), r=(1, 5, 5), s=(1, 5, 5))),
    # 3 filters, fewer than a vector: the output row is vectorised, as before
    "f3": (dict(N=1, C=6, H=10, W=16, F=3, KH=3, KW=3, stride=1, pad=1),
           dict(n=(1, 1, 1), f=(1, 3, 3), h=(1, 2, 10), w=(8, 16, 16), c=(1, 6, 6), r=(1, 3, 3), s=(1, 3, 3))),
}


@pytest.mark.parametrize("case", sorted(FILTERS))
def test_convolutions_along_their_filters_match_numpy(case):
    """Filters packed into panels, data broadcast, accumulators filters-last: stride 2, padding,
    ragged rows, 24 filters, 13 channels and two images verify against numpy; so do filters
    that the unit tile leaves ragged (40 in 48, 31, 13, 11 and 5 in 16), padded with zero filters: the
    panel is the padding copy and the accumulator the padded output, the write-back keeps the
    real filters. Output rows and columns that the unit tile leaves ragged (7 in 8, 11 in 12)
    have their loops over register tiles split where they end (the partition hint). 3 filters
    fall back to the plain template and verify too."""
    params, chains = FILTERS[case]
    e = expr("conv2d", **params)
    kernel = _local_kernel(e, chains)
    script = kernel.tvmscript
    lanes = simd_lanes(device(CPU), 4)
    filters = chains["f"][0] >= lanes and chains["f"][0] % 4 == 0
    padded = filters and params["F"] % chains["f"][2] != 0
    out = {a: (params[d] + 2 * params["pad"] - params[k]) // params["stride"] + 1 for a, d, k in (("h", "H", "KH"), ("w", "W", "KW"))}
    edges = filters and any(extent % chains[a][2] for a, extent in (("n", params["N"]), *out.items()))
    split = re.findall(r"for (\w)_\d+ in T\.serial\(\d+, annotations=\{\"pragma_loop_partition_hint\": 1\}\)", script)
    assert bool(split) is edges and set(split) <= {"n", "h", "w"}
    assert ("kernel_global" in script) == (filters and not padded)
    assert ("kernel_pad" in script) == padded
    if filters:
        panel = "kernel_pad" if padded else "kernel_global"
        # the filter axis innermost in the panel (`v0 % r`, or `v0` where r is every filter)
        assert re.search(rf"{panel}\[[^]]*, v0( % \d+)?\] = ", script)
        accumulator = "O_pad_local" if padded else "O_local"
        assert f"{accumulator}[v_n, v_h, v_w, v_f]" in _block(script, "O_update")
    if padded:
        whole = -(-params["F"] // chains["f"][2]) * chains["f"][2]
        assert f"T.if_then_else(v0 < {params['F']}, kernel[v0, v1, v2, v3], T.float32(0.0))" in script
        assert f"v_f = T.axis.spatial({whole}," in _block(script, "O_update")
        assert f"< {params['F']})" not in _block(script, "O_update")  # whole vectors, no filter guard


def test_padded_filters_keep_a_fused_epilogue_on_the_real_filters(tmp_path):
    """resnet_block's conv + bias, batch norm and relu (64 filters) in unit tiles of three
    register rows of a vector (24 filters on 8 lanes): the filters are padded to whole unit
    tiles (72 on 8 lanes, 96 on 16), the epilogue is folded into the
    write-back of the padded accumulator, which keeps the 64 real filters (a guard on the last
    tile), and the kernel matches TVM's default lowering in a run of the model."""
    from tests.test_models_pick import SAMPLES
    from workbench.models.execute import measure_operator, model_inputs, operator_references
    from workbench.models.construction import construct_model
    from workbench.models.onnx_import import import_model
    from workbench.profile.runner import Timing
    from workbench.profile.session import build_library

    mc = construct_model(import_model(SAMPLES / "resnet_block.onnx"), device(CPU))
    name = "fused_conv2d_add_multiply_add_relu"
    (op,) = [r for r in mc.results if r.operator.func_name == name]
    e = op.construction.expr
    lanes = simd_lanes(device(CPU), 4)
    chains = dict(nn=(1, 1, 1), ff=(lanes, lanes, 3 * lanes), yy=(2, 4, 16), xx=(1, 16, 16), rc=(1, 8, 64),
                  ry=(1, 3, 3), rx=(1, 3, 3))
    program = _program(e, chains)
    assert cpu_plan(program, device(CPU)).padded_filters
    script = schedule_cpu(e, program, device(CPU)).mod.script()
    padded = -(-64 // (3 * lanes)) * 3 * lanes
    assert f"v_ff = T.axis.spatial(T.int64({padded})," in _block(script, "conv2d_nchw_update")
    writeback = _block(script, "conv2d_nchw_intermediate_pad")
    assert "T.max(" in writeback and "< T.int64(64))" in writeback
    built = build_library(e, program, device(CPU), 1, 0.0, str(tmp_path / "k.so"))
    assert built.ok, built.error
    args, expected = operator_references(mc.model, mc.device, model_inputs(mc.model, 0))[name]
    got = measure_operator(built, args, expected, Timing(repeat=1, min_repeat_ms=0))
    assert got.correct, got.error


@pytest.mark.parametrize("spec", [AVX2_LIKE, TINY_CPU], ids=["8-lane", "16-lane"])
def test_a_convolution_vectorises_its_filters_from_packed_panels(spec):
    """32 filters in 16-wide register rows (two 8-lane vectors or one 16-lane one) over a
    stride-2 conv, whose output row is a gather: the filters' tile is packed per core in
    16-filter strips, each update reads a strip as a plain ramp and broadcasts one data element,
    the accumulator is laid out [n, y, x, f], and the write-back transposes it once per tile,
    a block of one vector's filters at a time (n, y, f // lanes, f % lanes, x // 2, x % 2
    vectorised: one buffer row and `lanes` output rows a block, each filter's row of 14 stored
    whole in 2-wide pieces, `TRANSPOSE_WIDTHS`, before the next filter's). An 8-wide filter row fills an 8-lane vector but half a
    16-lane one: only the 8-lane spec takes the filters then (checked on the schedules, nothing
    runs)."""
    e = expr("conv2d", N=1, C=16, H=28, W=28, F=32, KH=3, KW=3, stride=2, pad=1)
    chains = dict(n=(1, 1, 1), f=(16, 32, 32), h=(2, 14, 14), w=(2, 14, 14), c=(1, 16, 16), r=(1, 3, 3), s=(1, 3, 3))
    script = schedule_cpu(e, _program(e, chains), spec).mod.script()
    assert "kernel_global[v0 // 16, v1, v2, v3, v0 % 16] = kernel[v0, v1, v2, v3]" in script
    update = _block(script, "O_update")
    assert "kernel_global[v_f // 16, v_c, v_r, v_s, v_f % 16]" in update and "O_local[v_n, v_h, v_w, v_f]" in update
    assert f"T.vectorized({spec.warp_size})" in script
    assert "O[v0, v1, v2, v3] = O_local[v0, v2, v3, v1]" in script
    lanes = spec.warp_size
    assert f"for ax0, ax2, ax1_0, ax1_1, ax3_0 in T.grid(1, 14, {32 // lanes}, {lanes}, 7):" in script
    assert "for ax3_1 in T.vectorized(2):" in script
    assert f"v1 = T.axis.spatial(32, ax1_0 * {lanes} + ax1_1)" in _block(script, "O_local")
    assert "v3 = T.axis.spatial(14, ax3_0 * 2 + ax3_1)" in _block(script, "O_local")
    assert script.index("T.parallel") < script.index('T.sblock("kernel_global")')
    narrow = schedule_cpu(e, _program(e, dict(chains, f=(8, 32, 32))), spec).mod.script()
    assert ("kernel_global" in narrow) == (spec.warp_size == 8)


@pytest.mark.parametrize("rows, attached", [((4, 12, 12), False), ((7, 14, 14), True)], ids=["12-row", "14-row"])
def test_a_multi_block_epilogue_is_correct_on_tiles_that_straddle_fused_rows(rows, attached, tmp_path):
    """mlp_dynamic's layer norm at batch 3, seq 7 (21 rows fused from 3 x 7) on 16 lanes, as
    local-cpu constructs it on AVX-512. One tile's lane sums are an interval of the flattened
    partial sums; the mean, variance and normalisation index rows as (3, 7), so on 12-row tiles
    (no box) they run after the grid and on 14-row tiles (whole rows of 7) under it. Attached
    under 12-row tiles, rows 7-11 were off by up to 0.26: the second tile computed their mean
    from lane sums the first had not finished."""
    from tests.test_models_pick import SAMPLES
    from workbench.models.execute import measure_operator, model_inputs, operator_references
    from workbench.models.construction import construct_model
    from workbench.models.onnx_import import import_model
    from workbench.profile.runner import Timing
    from workbench.profile.session import build_library

    mc = construct_model(import_model(SAMPLES / "mlp_dynamic.onnx", {"batch": 3, "seq": 7}), device(CPU))
    (op,) = [r for r in mc.results if r.operator.func_name == "layer_norm"]
    e = op.construction.expr
    program = _program(e, {"ax0ax1": rows, "k2": (32, 128, 128)})
    script = schedule_cpu(e, program, TINY_CPU).mod.script()
    # 32-bit indices where the 12-row tiles' edge is split off (`common.new_schedule`)
    assert re.search(r"lv5_sum_rf_local = T\.sblock_alloc_buffer\(\((T\.int64\(21\)|21), (T\.int64\(32\)|32)\)", script)
    assert ("ax0_0" in _block(script, "T_layer_norm")) is attached
    built = build_library(e, program, TINY_CPU, 1, 0.0, str(tmp_path / "k.so"))
    assert built.ok, built.error
    args, expected = operator_references(mc.model, mc.device, model_inputs(mc.model, 0))["layer_norm"]
    got = measure_operator(built, args, expected, Timing(repeat=1, min_repeat_ms=0))
    assert got.correct, got.error


def test_x86_kernels_are_compiled_without_llvm_gathers():
    """LLVM vectorises a scalar micro-kernel's unrolled row on its own; on a stride-2 pooling it
    turned a 4-wide row into gathers and scatters (2-3x slower on AVX-512 Zen 5), which
    `X86_FEATURES` rules out: the CPU target carries them (x86 only: an aarch64 spec's target
    does not), and the kernel's assembly has no gather or scatter, and still matches numpy."""
    x86 = target_dict(device(CPU))
    assert all(feature in x86["mattr"] for feature in X86_FEATURES)
    assert "mattr" not in target_dict(replace(TINY_CPU, target=(("kind", "llvm"), ("mtriple", "aarch64-linux-gnu"))))
    e = expr("avgpool", N=1, C=64, H=112, W=112, K=3, stride=2, pad=1)
    kernel = _local_kernel(e, dict(n=(1, 1, 1), c=(1, 1, 16), h=(1, 14, 56), w=(4, 56, 56), r=(1, 3, 3), s=(3, 3, 3)))
    assembly = dict(kernel.sources)["s"]
    assert not re.search(r"\bv(p)?(gather|scatter)", assembly)


def test_an_l1_tile_of_one_register_tile_compiles_alike_whatever_its_k():
    """The evidence for `plan.loop_nest_key`: matmul 64 x 32 x 256, 4 x 16 registers under L1
    tiles of the same 4 x 16 outputs with the register tile's K (1) or the unit tile's (128):
    one of the two K-loops the L1 tile splits has a single iteration, and the two compile to the
    same assembly. The K of 32 between them shares their key."""
    e = expr("matmul", M=64, N=32, K=256)
    programs = [_program(e, dict(i=(4, 4, 32), j=(16, 16, 32), k=(1, k1, 128))) for k1 in (1, 128, 32)]
    kernels = [build_kernel(e, p, device(CPU)) for p in programs[:2]]
    assert all(k.ok for k in kernels), [k.error for k in kernels]
    assert dict(kernels[0].sources)["s"] == dict(kernels[1].sources)["s"]
    assert len({loop_nest_key(p, device(CPU)) for p in programs}) == 1


def test_the_plan_decides_the_code():
    """Codegen carries the kernel's plan out and decides nothing itself: the same plan gives
    byte-identical code, and two plans that differ in one field give different schedules. A
    ragged matmul (100 rows on 6-row register tiles) whose plan packs A and B into panels and
    pads the tails: without padding, without packing, with fewer lanes or with direct stores
    the schedule changes."""
    e = fuse_axes(expr("matmul", M=100, K=64, N=64))
    program = make_program(calculus(e), TINY_CPU, [(6, 16, 1), (6, 16, 64), (102, 64, 64)], [True] * 3, 0.0)
    plan = cpu_plan(program, TINY_CPU)
    assert plan.path == PANELS and plan.padded_tails and plan.packed == ("A", "B")

    def script(p):
        return schedule_cpu(e, program, TINY_CPU, p).mod.script()

    same = script(plan)
    assert script(plan) == same == schedule_cpu(e, program, TINY_CPU).mod.script()
    variants = {
        "padded_tails": replace(plan, padded_tails=False),
        "packed": replace(plan, path=ROW, packed=()),
        "lanes": replace(plan, lanes=plan.lanes // 2),
        "pack_layer": replace(plan, pack_layer=1),
    }
    for field, other in variants.items():
        assert script(other) != same, f"a plan that differs in {field} built the same schedule"


def _pointwise_view(constants):
    from workbench.ops.pixel_gemm import pixel_gemm

    conv = expr("conv2d", N=1, C=4096, H=16, W=16, F=96, KH=1, KW=1, stride=1, pad=0)
    return replace(pixel_gemm(conv), constants=constants)


@pytest.mark.parametrize("case", ["matmul", "pointwise"])
def test_weights_laid_out_ahead_are_taken_in_their_strips_and_verify(case):
    """A matmul whose A and B are both weights (`TensorExpr.constants`), and a pointwise conv's
    GEMM over its pixels whose [F, C] filters (a view of the caller's [F, C, 1, 1]) are, all
    packed (a 6-row L1 tile of the broadcast operand spans rows 16 KiB apart, more than any
    L1d; B is read along the vector): the kernel takes each weight laid out in register-tile
    strips (`CpuPlan.prepacked`), the broadcast one as [i // 6, k, i % 6], B as
    [j // r, k, j % r]; its entry refuses them as the caller holds them, and laid out by the
    library's own functions (`codegen.build.laid_out_args`, which `verify` applies; the view's
    from the caller's shape) the result is numpy's."""
    import numpy as np
    import tvm

    dev = device(CPU)
    lanes = simd_lanes(dev, 4)
    if case == "matmul":
        e = replace(expr("matmul", M=288, K=4096, N=256), constants=("A", "B"))
        tiles = [(6, 2 * lanes, 1), (6, 4 * lanes, 256), (96, 256, 512)]
        laid_out = [(0, (48, 4096, 6)), (1, (256 // (2 * lanes), 4096, 2 * lanes))]
    else:
        e = _pointwise_view(("kernel",))
        tiles = [(1, 6, 2 * lanes, 1), (1, 6, 4 * lanes, 256), (1, 96, 256, 512)]
        laid_out = [(1, (16, 4096, 6))]
    program = make_program(calculus(e), dev, tiles, [True] * 3, 0.0)
    assert cpu_plan(program, dev).prepacked == e.constants
    kernel = build_kernel(e, program, dev)
    assert kernel.ok, kernel.error
    assert [(p.index, p.shape) for p in kernel.prepacked] == laid_out
    check = verify(kernel, e)
    assert check.correct, check.error
    held = [tvm.runtime.tensor(np.zeros(a.shape, dtype=a.dtype)) for a in e.args]
    with pytest.raises(Exception):
        kernel.runtime()[kernel.entry](*held)
