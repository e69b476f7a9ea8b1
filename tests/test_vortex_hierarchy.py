"""Vortex's hierarchy (Table 1): candidates on generated CPU specs (AVX2, AVX-512) and GPU presets."""

from dataclasses import replace

import pytest
from helpers import TINY_CPU, device, expr

from workbench.hardware.spec import MicroKernel
from workbench.rtile.axes import lane_axis, tile_lanes
from workbench.rtile.panels import packed_inputs, read_once
from workbench.rtile.registers import accumulators, micro_kernel_registers, thread_count
from workbench.rtile.rprogram import footprint_at, layer_capacity, make_program
from workbench.rtile.traffic import calculus
from workbench.vortex.analyzer import Dynamic
from workbench.vortex.hierarchy import (
    DYN_MULTIPLES, MULTIPLIERS, PARALLEL, TEMPORAL_REDUCTION, TEMPORAL_SPATIAL, _memory_ops_per_fma, candidates,
    _whole_lines, constructed_rows, deepens_reduction, deepest_reduction, filter_by_multiples, loop_class,
    register_tiles, single_row_tiles,
)
from workbench.vortex.select import select


def _cpu(name: str, lanes: int, registers: int, latency: int, pipes: int):
    """A CPU of `lanes` fp32 lanes, `registers` vector registers and an FMA of `latency` cycles
    on `pipes` pipes, caches as TINY_CPU's: never this machine."""
    top = replace(TINY_CPU.layers[0], capacity_bytes=registers * 4 * lanes, transaction_bytes=4 * lanes)
    return replace(TINY_CPU, name=name, warp_size=lanes, registers_per_unit=registers, registers_per_thread_cap=registers,
                   layers=(top,) + TINY_CPU.layers[1:], fma_latency_cycles=latency, fma_pipes=pipes)


AVX2 = _cpu("avx2-like", 8, 16, 5, 2)  # Zen 2: 5-cycle FMA x 2 pipes, 16 ymm
AVX512 = _cpu("avx512-like", 16, 32, 4, 2)  # Skylake-SP: 4-cycle FMA x 2 pipes, 32 zmm
BERT = dict(M=2048, K=768, N=2304)  # the template: the dynamic M at its declared bound


def _multiples(program):
    return all(t % u == 0 for upper, tile in zip(program.tiles, program.tiles[1:]) for u, t in zip(upper, tile))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_cpu_candidates_are_multiples_within_capacity(dev):
    e = expr("matmul", **BERT)
    progs = candidates(e, dev, "i")
    assert progs
    lanes = dev.warp_size
    for p in progs:
        assert len(p.tiles) == 3  # registers, L1, L2: one core's work; the grid is the parallel level
        assert _multiples(p)
        reg = p.register_tile
        single_row = p.unit_tile[0] == 1
        for layer in range(1 if single_row else 0, 3):
            assert footprint_at(dev, p, layer) <= layer_capacity(dev, layer)
        assert reg[lane_axis(e, dev)] % lanes == 0  # the SIMD lanes filled along j
        # a single-row tile holds its accumulators, A's broadcast and one vector of B in flight
        held = accumulators(e, dev, reg) + 2 if single_row else micro_kernel_registers(e, dev, reg)
        assert held <= dev.registers_per_thread_cap
        # every static axis is covered without padding at eps 0: N and K are multiples of the unit tile
        assert e.axes[1].extent % p.unit_tile[1] == 0 and e.axes[2].extent % p.unit_tile[2] == 0
    # several outer sizes along the dynamic axis, so small and large M each have a kernel
    assert len({p.unit_tile[0] for p in progs}) >= 3


def test_register_tiles_hold_enough_accumulators():
    """AVX2 (Zen 2: 5-cycle FMA x 2 pipes) needs 10 accumulators, AVX-512 (4 x 2) 8."""
    e = expr("matmul", **BERT)
    for dev, need in ((AVX2, 10), (AVX512, 8)):
        tiles = register_tiles(e, dev, 0, 0.0)
        assert tiles and len({t[0] for t in tiles}) == len(tiles)  # one per size along the dynamic axis
        for t in tiles:
            assert t[0] * t[1] // dev.warp_size >= need
            assert t[2] == 1


def test_register_tiles_of_equal_share_rank_by_loads_per_fma():
    """Uncalibrated, 8 x 8 and 6 x 16 fill AVX2's FMA pipes alike in the model; per FMA the first
    issues (1 load + 8 broadcasts) / 8, the second (2 + 6) / 12, so 8 x 8 ranks below it."""
    e = expr("matmul", **BERT)
    assert _memory_ops_per_fma(e, AVX2, (8, 8, 1)) == 9 / 8
    assert _memory_ops_per_fma(e, AVX2, (6, 16, 1)) == 8 / 12
    assert _memory_ops_per_fma(e, AVX2, (6, 16, 4)) == 8 / 12  # per reduction step alike
    tiles = register_tiles(e, AVX2, 0, 0.0)
    assert (8, 8, 1) not in tiles[:2] and all(_memory_ops_per_fma(e, AVX2, t) <= 9 / 8 for t in tiles)


def test_register_rows_are_whole_cache_lines():
    """On AVX2 a row of 24 fp32 lanes is 96 B, 1.5 lines: 4 x 24 is not kept although it issues
    fewer loads per FMA than 6 x 16; on AVX-512 every vector is a 64 B line; a lane axis shorter
    than a line is kept whole."""
    e = expr("matmul", **BERT)
    assert not _whole_lines(e, AVX2, (4, 24, 1)) and _whole_lines(e, AVX2, (6, 16, 1))
    assert _memory_ops_per_fma(e, AVX2, (4, 24, 1)) < _memory_ops_per_fma(e, AVX2, (6, 16, 1))
    assert all(t[1] * 4 % 64 == 0 for t in register_tiles(e, AVX2, 0, 0.0))
    assert all(_whole_lines(e, AVX512, (r, c, 1)) for r in (1, 4, 6) for c in (16, 48, 64))
    assert _whole_lines(expr("matmul", M=64, N=8, K=64), AVX2, (6, 8, 1))  # N = 8: the whole axis


def test_calibrated_micro_kernels_are_preferred():
    """Unmeasured, 5 x 16 is not first on AVX2 (6 x 16 issues fewer loads per FMA); measured, it
    is the only one kept."""
    e = expr("matmul", **BERT)
    assert register_tiles(e, AVX2, 0, 0.0)[0][:2] != (5, 16)
    dev = replace(AVX2, micro_kernels=(MicroKernel("float32", 5, 16, 90.0),))
    assert [t[:2] for t in register_tiles(e, dev, 0, 0.0)] == [(5, 16)]


def test_filter_by_multiples_keeps_aligned_multiples_that_fit():
    """At L2 over a 6x16x256 L1 tile: the static axes multiples from `MULTIPLIERS`, the dynamic
    axis every multiple to `DYN_MULTIPLES` (6 x 22 = 132 rows, a padding step 6 x 24 does not
    give), each aligned and within the 1 MiB L2."""
    e = expr("matmul", **BERT)
    base = (6, 16, 256)
    tiles = filter_by_multiples(e, AVX2, 2, base, 0, 0.0)
    assert tiles
    for t in tiles:
        assert t[0] % 6 == 0 and t[0] // 6 <= DYN_MULTIPLES
        assert all(s % b == 0 and s // b in MULTIPLIERS for s, b in zip(t[1:], base[1:]))
        assert 768 % t[2] == 0  # K whole at L2 (TailRule: a tile dividing K is whole lines)
        assert footprint_at(AVX2, make_program(calculus(e), AVX2, (base, base, t), (True,) * 3, 0.0), 2) <= 2**20
    assert {132, 138, 144} <= {t[0] for t in tiles}


def _kc(e, rows: int, cols: int) -> int:
    """BLIS's kc for a rows x cols fp32 L1 tile of a matmul (closed form): the deepest K that
    divides the K extent in whole 64 B lines with A's rows x K, B's K x cols and the output's
    rows x cols within the 32 KiB L1 of the generated specs."""
    extent = e.axes[2].extent
    return max(k for k in range(16, extent + 1, 16)
               if extent % k == 0 and 4 * (rows * k + k * cols + rows * cols) <= 32768)


@pytest.mark.parametrize("dev, register, l1", [
    (AVX2, (6, 16, 1), (6, 16, 256)),  # 4 (6K + 16K + 96) <= 32768: K <= 368, divides 768: 256
    (AVX2, (4, 24, 1), (4, 48, 128)),  # 24 lanes are 96 B: 48 is whole lines; K <= 153: 128
    (AVX512, (6, 64, 1), (6, 64, 96)),  # 4 (70K + 384) <= 32768: K <= 111: 96
    (AVX512, (8, 48, 1), (8, 48, 128)),  # 4 (56K + 384) <= 32768: K <= 139: 128
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v.name)
def test_l1_tile_over_the_micro_kernel_is_blis_kc(dev, register, l1):
    e = expr("matmul", **BERT)
    assert deepens_reduction(e, dev, 1) and not deepens_reduction(e, dev, 2)
    assert l1[2] == _kc(e, l1[0], l1[1])
    assert filter_by_multiples(e, dev, 1, register, 0, 0.0) == [l1]


@pytest.mark.parametrize("dev, register, l1", [
    (AVX2, (7, 16), (7, 512)),  # 4 (7K + K + 7) <= 32768: K <= 1023, divides 4096: 512
    (AVX2, (6, 16), (6, 1024)),  # 4 (6K + K + 6) <= 32768: K <= 1169: 1024
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v.name)
def test_gemv_l1_tile_is_the_deepest_k_row_panel(dev, register, l1):
    e = expr("gemv", M=2048, K=4096)
    assert deepest_reduction(e, dev, 1, register, 0, 0.0) == [l1]


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_cpu_candidates_keep_accumulators_over_a_deep_k(dev):
    """Every CPU candidate's L1 tile is its micro-kernel's kc tile: no shallow K (16 or 32) under
    which the accumulators leave the registers every few steps; but Roller's own programs for one
    row (`constructed_rows`), which keep theirs in the unit tile's buffer."""
    e = expr("matmul", **BERT)
    constructed = set(constructed_rows(e, dev, 0))
    for p in candidates(e, dev, "i"):
        if tuple(p.tiles) in constructed:
            continue
        assert [p.tiles[1]] == deepest_reduction(e, dev, 1, p.register_tile, 0, p.eps)
        # the single rows' kc are the shallowest: 1 x 96 on AVX2, 4 (97K + 96) <= 32768: 64;
        # 1 x 128 on AVX-512, 4 (129K + 128) <= 32768: 48
        assert p.tiles[1][2] >= (48 if p.register_tile[0] == 1 else 96)


@pytest.mark.parametrize("dev, tile", [
    (AVX2, (1, 96, 1)),  # 10 accumulators needed: 80 lanes hold them but do not divide N = 2304
    (AVX512, (1, 128, 1)),  # 8 needed: 8 vectors of 16
    (replace(AVX2, fma_latency_cycles=4), (1, 64, 1)),  # 8 needed, as on this repo's EPYC
], ids=["avx2", "avx512", "avx2-4cycle"])
def test_single_row_tile_holds_the_accumulators_in_whole_vectors(dev, tile):
    e = expr("matmul", **BERT)
    assert single_row_tiles(e, dev, 0, 0.0) == [tile]
    assert accumulators(e, dev, tile) >= dev.fma_accumulators
    # the shared-row count refuses it on AVX2 (one B vector per accumulator held, 21 or 17 of 16)
    assert (micro_kernel_registers(e, dev, tile) > dev.registers_per_thread_cap) == (dev.warp_size == 8)


def test_no_single_row_tile_where_it_cannot_be_one():
    e = expr("matmul", **BERT)
    assert single_row_tiles(e, AVX2, 1, 0.0) == []  # the dynamic axis is the lane axis
    assert single_row_tiles(e, device("a100"), 0, 0.0) == []  # a GPU: no SIMD micro-kernel
    small = replace(AVX2, registers_per_thread_cap=11)  # 10 accumulators + 2 do not fit
    assert single_row_tiles(e, small, 0, 0.0) == []


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_single_row_candidates_pack_nothing(dev):
    """The single-row family is one row at every level, so the CPU template packs no panel;
    every other candidate packs B where more than one register tile reads its panel (its L1
    tile's rows lie 9 KiB apart, spanning more than the L1; a unit tile of one register tile's
    rows reads it once, in place: `panels.read_once`), and A only where the unit tile leaves a
    tail of M (padded: A is copied with its padding, B, where one register tile reads it, still
    read in place: `panels._read_in_place`), since A's L1 tile of a few rows 3 KiB apart fits
    the L1 in place (`panels._panel_pays`)."""
    e = expr("matmul", **BERT)
    progs = candidates(e, dev, "i")
    rows = [p for p in progs if p.register_tile[0] == 1]
    assert rows and all(t[0] == 1 for p in rows for t in p.tiles)
    assert all(packed_inputs(p.expr, p, dev) == () for p in rows)
    b = next(t for t in e.inputs if t.name == "B")

    def expected(p):
        once = read_once(p.expr, p, b)
        if BERT["M"] % p.unit_tile[0]:
            return ("A",) if once else ("A", "B")
        return () if once else ("B",)

    packed = [(p, packed_inputs(p.expr, p, dev)) for p in progs if p.unit_tile[0] > 1]
    assert packed and all(inputs == expected(p) for p, inputs in packed)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("cores", [2, 3])
def test_single_row_family_keeps_one_unit_tile_per_core(dev, cores):
    """A one-row GEMM's grid is its columns' alone: the family keeps the unit tile of N / cores
    columns, one wave, which `MULTIPLIERS` alone do not reach on two cores (2,304 = 2 x 18 x 64:
    768 left the second of two waves half idle)."""
    dev = replace(dev, compute_units=cores)
    e = expr("matmul", **BERT)
    rows = [p for p in candidates(e, dev, "i") if p.register_tile[0] == 1]
    assert BERT["N"] // cores in {p.unit_tile[1] for p in rows}


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [BERT, dict(M=1024, K=369, N=11468)], ids=["bert", "369x11468"])
def test_one_row_starts_from_rollers_program_for_one_row(dev, shape):
    """Roller's programs for M = 1 (`constructed_rows`) are one row at every level, their register
    tiles over several rows of K (B read in long runs of rows), and the cover starts from the first
    of them: the kernel the bundle runs at M = 1."""
    e = expr("matmul", **shape)
    rows = constructed_rows(e, dev, 0)
    assert rows and all(t[0] == 1 for chain in rows for t in chain)
    assert all(chain[0][2] > 1 for chain in rows)
    kept = select(candidates(e, dev, "i"), dev, Dynamic("M", "i", shape["M"]))
    assert tuple(kept[0].tiles) == rows[0]


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_dynamic_batch_of_one_row_matmuls_takes_the_single_row_family(dev):
    """No register tile of several rows fits an M of 1, so no eps gives the other family: the
    batch's candidates are the single-row family alone, one batch and one row at every level
    (before: none, and `vortex compile` refused the workload)."""
    e = expr("matmul", B=64, M=1, K=300, N=700)
    progs = candidates(e, dev, "b")
    assert progs and all(t[0] == 1 and t[1] == 1 for p in progs for t in p.tiles)


def test_gpu_blocks_do_not_take_the_cpu_kc_rule():
    e = expr("matmul", **BERT)
    assert not deepens_reduction(e, device("a100"), 1)


@pytest.mark.parametrize("name", ["v100", "a100"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_candidates_are_blocks_of_whole_warps(name, dtype):
    dev = device(name)
    e = expr("matmul", dtype=dtype, **BERT)
    progs = candidates(e, dev, "i")
    assert progs
    for p in progs:
        assert len(p.tiles) == 2  # registers (or the warp's fragment), the block's shared memory
        assert _multiples(p)
        threads = thread_count(e, p.unit_tile, p.register_tile, tile_lanes(e, dev))
        assert threads % dev.warp_size == 0 and threads <= min(1024, dev.max_threads_per_block)
        assert footprint_at(dev, p, 1) <= layer_capacity(dev, 1)
        if dev.has_tensor_cores(dtype):  # the warp's MMA fragment is level 0
            m, n, k = dev.tensor_core_fragment
            assert [t % f for t, f in zip(p.register_tile, (m, n, k))] == [0, 0, 0]


def test_loop_classes():
    e = expr("matmul", **BERT)
    assert loop_class(e, 0, parallel_level=True) == PARALLEL
    assert loop_class(e, 1, parallel_level=False) == TEMPORAL_SPATIAL
    assert loop_class(e, 2, parallel_level=True) == TEMPORAL_REDUCTION
    assert loop_class(e, 2, parallel_level=False) == TEMPORAL_REDUCTION
