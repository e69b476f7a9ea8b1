"""Shared bytes of a WMMA block (rtile/wmma_shared.py): closed forms of the rows the template
pads and the output it stages, and the construction's shared footprint counting them."""

from __future__ import annotations

import pytest

from tests.helpers import device, expr
from workbench.ops.fusion import fuse_axes
from workbench.rtile.rprogram import footprint_at, make_program
from workbench.rtile.traffic import TileCalculus
from workbench.rtile.wmma_shared import aligned_row, row_alignment, takes_wmma, wmma_shared_bytes


def test_rows_are_an_odd_number_of_16_byte_groups():
    assert row_alignment(2) == (16, 8)  # float16: 8 halves a group
    # 16 halves (2 groups) -> 24 (3), 24 stays, 32 -> 40 (5), 200 (25 groups) stays
    assert [aligned_row(n, 2) for n in (16, 24, 32, 192, 200)] == [24, 24, 40, 200, 200]
    assert all((aligned_row(n, 2) * 2 // 16) % 2 == 1 for n in range(8, 512, 8))


def test_a_padded_grid_stages_its_output_tile_too():
    """float16 matmul 4096^3 in 128 x 192 x 16 blocks (192 does not divide 4096): A 128 rows of
    16 -> 24, B 16 rows of 192 -> 200, the output 128 rows of 192 -> 200, halves."""
    dev = device("a100")
    e = fuse_axes(expr("matmul", "float16", M=4096, N=4096, K=4096))
    assert wmma_shared_bytes(e, dev, (128, 192, 16)) == (128 * 24 + 16 * 200 + 128 * 200) * 2 == 63744
    # 512 x 128 divides 4096: no output in shared memory
    assert wmma_shared_bytes(e, dev, (512, 128, 16)) == (512 * 24 + 16 * 136) * 2 == 28928


def test_a_transposed_b_keeps_its_rows_along_k_and_a_transposed_a_is_stored_i_k():
    dev = device("h100")
    e = fuse_axes(expr("matmul", "float16", M=256, N=128, K=64, trans_a=True, trans_b=True))
    # A copied to [i, k]: 64 rows of 32 -> 40; B [j, k]: 64 rows of 32 -> 40
    assert wmma_shared_bytes(e, dev, (64, 64, 32)) == (64 * 40 + 64 * 40) * 2


def test_only_programs_the_wmma_template_builds():
    dev = device("h100")
    assert not takes_wmma(fuse_axes(expr("matmul", M=256, N=256, K=256)), dev)  # float32: CUDA cores
    assert wmma_shared_bytes(fuse_axes(expr("matmul", M=256, N=256, K=256)), dev, (64, 64, 16)) is None
    assert not takes_wmma(fuse_axes(expr("matmul", "float16", M=256, N=256, K=256)), device("xeon-avx512"))


@pytest.mark.parametrize("gpu", ["v100", "a100", "h100"])
def test_the_shared_footprint_of_a_wmma_program_is_what_the_template_allocates(gpu):
    dev = device(gpu)
    e = fuse_axes(expr("matmul", "float16", M=4096, N=4096, K=4096))
    p = make_program(TileCalculus(e), dev, [(32, 48, 16), (128, 192, 16)], (True, True), 0.05)
    assert footprint_at(dev, p, 1) == 63744  # not the 12 KiB of bank-padded input tiles
