"""Bank conflicts of one warp: the closed-form lane offsets and the counting against a brute-force
simulation of the lanes that builds every thread's elements explicitly."""

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.rtile.banks import (
    ThreadBinding,
    access_degree,
    conflict_degree,
    lane_coords,
    stored_tile,
    wavefronts,
)


def owned(threads: int, size: int, vthreads: int) -> list[list[int]]:
    """Per thread, the block-tile offsets it owns in element order: the block tile is cut into
    `vthreads` strips, and in each strip thread t owns the t-th run of size / vthreads."""
    run, strip = size // vthreads, threads * (size // vthreads)
    return [[s * strip + t * run + q for s in range(vthreads) for q in range(run)] for t in range(threads)]


def brute_degree(ld, itemsize, grid, tile, vthreads, element, banks, width, lanes=32):
    """A 2-D data tile (rows = axis 0, cols = axis 1) stored with `ld` elements per row; the
    first `lanes` threads of a row-major (cols fastest) thread grid each read one element."""
    rows, cols = owned(grid[0], tile[0], vthreads[0]), owned(grid[1], tile[1], vthreads[1])
    words_per_bank: dict[int, set[int]] = {}
    for t in range(min(lanes, grid[0] * grid[1])):
        r, c = rows[t // grid[1]][element[0]], cols[t % grid[1]][element[1]]
        word = (r * ld + c) * itemsize // width
        words_per_bank.setdefault(word % banks, set()).add(word)
    return max(len(w) for w in words_per_bank.values())


def ours(ld, itemsize, grid, tile, vthreads):
    shape = (grid[0] * tile[0], grid[1] * tile[1])
    return stored_tile(((1, 0), (0, 1)), shape, ld - shape[1], itemsize), ThreadBinding(grid, tile, vthreads)


def test_textbook_cases():
    # 32 lanes down one column of a 32-float row: every lane in bank 0; one float of padding fixes it
    assert brute_degree(32, 4, (32, 1), (1, 1), (1, 1), (0, 0), 32, 4) == 32
    assert access_degree(*ours(32, 4, (32, 1), (1, 1), (1, 1)), (0, 0), 32, 4) == 32
    assert access_degree(*ours(33, 4, (32, 1), (1, 1), (1, 1)), (0, 0), 32, 4) == 1
    # a thread tile of 8 floats along a row: lanes 8 floats apart share 4 banks, 8 words each;
    # 8 virtual threads make the lanes adjacent again
    assert access_degree(*ours(256, 4, (1, 32), (1, 8), (1, 1)), (0, 0), 32, 4) == 8
    assert access_degree(*ours(256, 4, (1, 32), (1, 8), (1, 8)), (0, 0), 32, 4) == 1
    assert conflict_degree([0, 0, 4, 128], 32, 4) == 2  # a broadcast word counts once


def test_lane_coords_are_row_major_and_stop_at_the_block():
    assert lane_coords((2, 3), 32) == tuple((t // 3, t % 3) for t in range(6))
    assert len(lane_coords((4, 64), 32)) == 32 and lane_coords((4, 64), 32)[-1] == (0, 31)


def test_lane_coords_of_a_warp_laid_out_as_a_box():
    """`plan.warp_lanes`: 8 x 32 threads whose warps are 4 x 8 boxes: the first warp's lanes
    are row-major within the box, never past its 8 columns."""
    assert lane_coords((8, 32), 32, (4, 8)) == tuple((t // 8, t % 8) for t in range(32))
    assert lane_coords((1, 8, 32), 32, (1, 4, 8))[9] == (0, 1, 1)


@pytest.mark.parametrize("ld_extra", [0, 1, 4, 8])
@pytest.mark.parametrize("tile", [(1, 1), (2, 4), (4, 8), (8, 2), (1, 16)])
@pytest.mark.parametrize("grid", [(32, 1), (4, 8), (2, 16), (1, 32), (8, 8)])
def test_degrees_match_the_brute_force(grid, tile, ld_extra):
    ld = grid[1] * tile[1] + ld_extra
    for vr, vc in product((1, 2, 4, 8), repeat=2):
        if tile[0] % vr or tile[1] % vc:
            continue
        tile_, binding = ours(ld, 4, grid, tile, (vr, vc))
        for element in product(range(tile[0]), range(tile[1])):
            expected = brute_degree(ld, 4, grid, tile, (vr, vc), element, 32, 4)
            assert access_degree(tile_, binding, element, 32, 4) == expected, (vr, vc, element)


@settings(max_examples=150, deadline=None)
@given(
    grid=st.tuples(st.sampled_from([1, 2, 4, 8, 16, 32]), st.sampled_from([1, 2, 4, 8, 16, 32, 64])),
    tile=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8, 16])),
    v=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8])),
    ld_extra=st.integers(0, 40),
    itemsize=st.sampled_from([1, 2, 4, 8]),
    bank=st.sampled_from([(32, 4), (32, 8), (16, 4)]),
    lanes=st.sampled_from([32, 64]),
)
def test_wavefronts_are_the_brute_force_sum_over_a_threads_elements(grid, tile, v, ld_extra, itemsize, bank, lanes):
    v = (min(v[0], tile[0]), min(v[1], tile[1]))
    if tile[0] % v[0] or tile[1] % v[1]:
        return
    banks, width = bank
    ld = grid[1] * tile[1] + ld_extra
    expected = sum(
        brute_degree(ld, itemsize, grid, tile, v, e, banks, width, lanes) for e in product(range(tile[0]), range(tile[1]))
    )
    assert wavefronts(*ours(ld, itemsize, grid, tile, v), banks, width, lanes) == expected


def test_an_axis_the_tensor_ignores_is_a_broadcast():
    """A[i, k] read by a warp laid along j: every lane reads the same word."""
    a = stored_tile(((1, 0, 0), (0, 0, 1)), (4, 8), 0, 4)  # axes (i, j, k); dims (i, k)
    binding = ThreadBinding((1, 32, 1), (4, 4, 8), (1, 1, 1))
    assert access_degree(a, binding, (0, 0, 0), 32, 4) == 1
    assert wavefronts(a, binding, 32, 4) == 4 * 8  # one per element of i x k, none for j


# -- the wavefronts Markov's set_vthread weighs -------------------------------------------------


def test_the_first_warps_wavefronts_per_request_with_virtual_threads():
    """A warp of 32 threads along j, each owning 8 floats of a
    256-float row of B (block 1 x 256 x 1, register tile 1 x 8 x 1, matmul on the V100: 32 banks
    of 4 bytes). Per element, lanes 8 floats apart fall in 4 banks, 8 distinct words each: 8
    wavefronts for each of the 8 requests; A's one element is a broadcast (1 request, 1
    wavefront): 65 wavefronts for 9 requests. 4 virtual threads (runs of 2): lanes l and l + 16
    share a bank, 2 per request: 17 / 9. 8 virtual threads (runs of 1): adjacent, 9 / 9."""
    from helpers import device, matmul

    from workbench.construct.space import Space
    from workbench.rtile.model.gpu import shared_wavefronts

    dev = device("v100")
    space = Space(matmul(512, 512, 512), dev)
    tiles = ((1, 8, 1), (1, 256, 1))
    counts = {v: shared_wavefronts(space.expr, dev, tiles[1], tiles[0], (1, v, 1)) for v in (1, 4, 8)}
    assert counts == {1: (65, 9), 4: (17, 9), 8: (9, 9)}
