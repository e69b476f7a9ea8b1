"""Grouped block order (codegen/block_order.py): the group size's closed form, the mapping of
`blockIdx.x` to grid positions is a permutation, and both CUDA templates (CUDA cores, WMMA) emit it."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

import pytest

from tests.helpers import device, expr, matmul
from workbench.codegen.block_order import BlockGroups, contraction_axes, group_rows, grouped_position
from workbench.codegen.build import build_kernel
from workbench.codegen.cuda_mma import unsupported
from workbench.codegen.nvcc import compile_ptx, nvcc_path, ptx_arch
from workbench.ops.fusion import fuse_axes
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import TileCalculus


def program(e, dev, register, block):
    return make_program(TileCalculus(e), dev, [register, block], (True, True), 0.05)


@pytest.mark.parametrize("rows, cols, group", [(64, 32, 2), (32, 16, 16), (6, 5, 3), (7, 3, 7), (2, 2, 2), (12, 1, 4)])
def test_grouped_order_is_a_permutation_of_the_grid(rows, cols, group):
    """Every launch index 0 .. rows x cols - 1 lands on a distinct grid position (so every block
    runs once), consecutive indices walk G rows of one column before the next column."""
    groups = BlockGroups(0, 1, group, rows, cols)
    seen = [grouped_position(x, groups) for x in range(rows * cols)]
    assert sorted(seen) == [(i, j) for i in range(rows) for j in range(cols)]
    assert seen[:group] == [(i, 0) for i in range(group)]
    if cols > 1:
        assert seen[group] == (0, 1)


def test_group_is_the_largest_divisor_whose_a_panels_fill_half_the_l2():
    """matmul 4096^3 in 64 x 128 blocks: an A row panel is 64 x 4096 floats = 1 MiB. The V100's
    6 MiB L2 holds 3 in its half: the largest divisor of the 64 block rows up to 3 is 2; the
    A100's 40 MiB holds 20: 16; the H100's 50 MiB 25: 16 again."""
    e = fuse_axes(matmul(4096, 4096, 4096))
    expected = {"v100": 2, "a100": 16, "h100": 16}
    for name, group in expected.items():
        dev = device(name)
        panel = 64 * 4096 * 4
        assert max(g for g in range(1, 65) if 64 % g == 0 and g * panel <= dev.l2_bytes // 2) == group
        assert group_rows(e, program(e, dev, (4, 8, 1), (64, 128, 8)), dev) == BlockGroups(0, 1, group, 64, 32)


def test_no_grouping_where_it_changes_nothing_or_does_not_apply():
    dev = device("v100")
    e = fuse_axes(matmul(4096, 4096, 4096))
    one_row = program(e, dev, (8, 8, 1), (4096, 64, 8))  # a grid of one block row
    assert group_rows(e, one_row, dev) is None
    assert group_rows(e, program(e, dev, (4, 8, 1), (64, 128, 8)), replace(dev, l2_bytes=0)) is None
    # a 1 MiB L2: its half holds no 1 MiB A panel
    assert group_rows(e, program(e, dev, (4, 8, 1), (64, 128, 8)), replace(dev, l2_bytes=2**20)) is None
    assert contraction_axes(fuse_axes(expr("relu", shape=(64, 64)))) is None
    conv = fuse_axes(expr("conv2d", N=1, C=8, H=14, W=14, F=16, KH=3, KW=3, stride=1, pad=1))
    assert contraction_axes(conv) is None
    assert contraction_axes(fuse_axes(expr("matmul", M=64, N=32, K=48, B=2))) == (1, 2)
    assert contraction_axes(fuse_axes(expr("matmul", M=64, N=32, K=48, trans_a=True))) == (0, 1)


@cache
def grouped_source() -> str:
    """matmul 1024^3 on the V100 in 32 x 64 blocks: a grid of 32 x 16, A panels of 32 x 1024
    floats (128 KiB), 24 of which fit half the L2, so groups of 16 block rows."""
    dev = device("v100")
    e = fuse_axes(matmul(1024, 1024, 1024))
    p = program(e, dev, (4, 4, 1), (32, 64, 8))
    assert group_rows(e, p, dev) == BlockGroups(0, 1, 16, 32, 16)
    built = build_kernel(e, p, dev)
    assert built.ok, built.error
    return built.source


def test_source_maps_block_index_to_grouped_positions():
    """The generated index arithmetic: A's and C's rows start at ((bx >> 8) x 16 + (bx & 15)) x
    32 rows of 1024 floats, B's and C's columns at ((bx & 255) >> 4) x 64, i.e. i = bx // 256 x 16
    + bx % 16 and j = bx // 16 % 16: `grouped_position`, checked over every block index."""
    source = grouped_source()
    rows = "(((((int)blockIdx.x) >> 8) * 524288) + ((((int)blockIdx.x) & 15) * 32768))"
    cols = "(((((int)blockIdx.x) & 255) >> 4) * 64)"
    assert rows in source and cols in source
    assert not re.search(r"blockIdx\.x\) (/|%) ", source)  # no other decomposition of the index
    groups = BlockGroups(0, 1, 16, 32, 16)
    for bx in range(32 * 16):
        row_start = (bx >> 8) * 524288 + (bx & 15) * 32768  # elements of A: rows x 1024
        col_start = ((bx & 255) >> 4) * 64
        assert (row_start // (32 * 1024), col_start // 64) == grouped_position(bx, groups)


def test_grouped_kernel_compiles_with_nvcc():
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    result = compile_ptx(grouped_source(), ptx_arch("sm_70"))
    assert result.ok, result.error


@cache
def grouped_wmma_source() -> str:
    """A float16 matmul 4096 x 256 x 4096 on the V100's tensor cores in 64 x 64 blocks: a grid of
    64 x 4, A panels of 64 x 4096 halves (512 KiB), 6 of which fit half the 6 MiB L2, so groups of
    4 block rows (the largest divisor of 64 up to 6)."""
    dev = device("v100")
    e = fuse_axes(expr("matmul", "float16", M=4096, N=256, K=4096))
    p = make_program(TileCalculus(e), dev, [(32, 32, 16), (64, 64, 32)], (True, True), 0.05)
    assert unsupported(e, p, dev) is None  # the WMMA template takes it
    assert group_rows(e, p, dev) == BlockGroups(0, 1, 4, 64, 4)
    built = build_kernel(e, p, dev)
    assert built.ok, built.error
    assert "nvcuda::wmma::mma_sync" in built.source
    return built.source


def test_wmma_source_maps_block_index_to_grouped_positions():
    """The WMMA template's index arithmetic: A's rows start at ((bx >> 4) x 4 + (bx & 3)) x 64
    rows of 4096 halves, the output's columns at ((bx & 15) >> 2) x 64, i.e. i = bx // 16 x 4 +
    bx % 4 and j = bx // 4 % 4: `grouped_position`, checked over every block index."""
    source = grouped_wmma_source()
    rows = "(((((int)blockIdx.x) >> 4) * 1048576) + ((((int)blockIdx.x) & 3) * 262144))"
    out_rows = "(((((int)blockIdx.x) >> 4) * 65536) + ((((int)blockIdx.x) & 3) * 16384))"  # C: rows of 256
    cols = "(((((int)blockIdx.x) & 15) >> 2) * 64)"
    assert rows in source and out_rows in source and cols in source
    assert not re.search(r"blockIdx\.x\) (/|%) ", source)
    groups = BlockGroups(0, 1, 4, 64, 4)
    for bx in range(64 * 4):
        row_start = (bx >> 4) * 1048576 + (bx & 3) * 262144  # elements of A: rows x 4096
        col_start = ((bx & 15) >> 2) * 64
        assert (row_start // (64 * 4096), col_start // 64) == grouped_position(bx, groups)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_grouped_wmma_kernel_compiles_with_nvcc(arch):
    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    result = compile_ptx(grouped_wmma_source(), ptx_arch(arch))
    assert result.ok, result.error
    assert "wmma.mma.sync" in result.ptx
