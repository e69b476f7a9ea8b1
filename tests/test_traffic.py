"""Traffic Q and footprint F against closed forms derived by hand (Roller §3.1, §3.3)."""

from math import ceil, prod

import pytest
from helpers import expr, matmul
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.rtile.traffic import TileCalculus

F32 = 4


def _cdiv(a, b):
    return -(-a // b)


@st.composite
def matmul_tile(draw):
    m, n, k = (draw(st.integers(1, 300)) for _ in range(3))
    tile = (draw(st.integers(1, m)), draw(st.integers(1, n)), draw(st.integers(1, k)))
    return (m, n, k), tile


@settings(max_examples=200, deadline=None)
@given(matmul_tile())
def test_matmul_traffic_and_footprint_are_the_closed_form(case):
    (m, n, k), (ti, tj, tk) = case
    calc = TileCalculus(matmul(m, n, k))
    grid = ceil(m / ti) * ceil(n / tj)
    q = grid * ceil(k / tk) * (ti * tk + tk * tj) * F32 + grid * ti * tj * F32
    assert calc.traffic_bytes((ti, tj, tk)) == q
    assert calc.footprint_bytes((ti, tj, tk)) == (ti * tk + tk * tj + ti * tj) * F32
    assert calc.footprint_bytes((ti, tj, tk), with_output=False) == (ti * tk + tk * tj) * F32
    assert calc.spatial_tiles((ti, tj, tk)) == grid
    assert calc.num_tiles((ti, tj, tk)) == grid * ceil(k / tk)
    assert calc.padded_volume((ti, tj, tk)) == ceil(m / ti) * ti * ceil(n / tj) * tj * ceil(k / tk) * tk


@settings(max_examples=200, deadline=None)
@given(matmul_tile(), st.integers(1, 300))
def test_accumulators_leave_the_registers_once_per_reduction_step_above(case, upper_k):
    """Register tiles (ti, tj, tk) under an L1 tile of K-depth upper_k: every register tile's
    output goes out and back once per L1 K-step after the first."""
    (m, n, k), (ti, tj, tk) = case
    calc = TileCalculus(matmul(m, n, k))
    steps = ceil(k / max(tk, upper_k))
    upper = (ti, tj, max(tk, upper_k))
    grid = ceil(m / ti) * ceil(n / tj)
    assert calc.accumulator_bytes((ti, tj, tk), upper) == 2 * (steps - 1) * grid * ti * tj * F32
    # a vector of 8 partial sums per output (a micro-kernel vectorised along K) moves 8 times as much
    assert calc.accumulator_bytes((ti, tj, tk), upper, 8) == 8 * 2 * (steps - 1) * grid * ti * tj * F32


def test_accumulators_without_reduction_steps_above_move_nothing():
    calc = TileCalculus(matmul(64, 64, 64))
    assert calc.accumulator_bytes((4, 16, 1), (8, 32, 64)) == 0
    relu = TileCalculus(expr("relu", shape=(128, 256, 14, 14)))
    assert relu.accumulator_bytes((1, 1, 1, 8), (1, 4, 14, 14)) == 0


def test_accumulator_reuse_is_trips_saved_per_byte_of_footprint_the_closed_form():
    """A 512^3 matmul, 6x16x1 registers, L1 tile 6x16x16 -> 6x16x32: the output of 86 x 32
    register tiles (516 rows padded) goes out and back 31 -> 15 times; A and B grow by
    6 x 16 and 16 x 16 floats."""
    calc = TileCalculus(matmul(512, 512, 512))
    out = ceil(512 / 6) * 6 * 512 * F32
    score = calc.accumulator_reuse((6, 16, 1), (6, 16, 16), (6, 16, 32))
    assert score == 2 * (31 - 15) * out / ((6 * 16 + 16 * 16) * F32)
    # growing a spatial axis leaves the trips per register tile as they were: nothing saved
    assert calc.accumulator_reuse((6, 16, 1), (6, 16, 16), (12, 16, 16)) == 0.0
    # a tile already whole along K saves nothing more
    assert calc.accumulator_reuse((6, 16, 1), (6, 16, 512), (6, 16, 512)) == 0.0


@settings(max_examples=100, deadline=None)
@given(matmul_tile(), st.integers(1, 4))
def test_accumulator_reuse_adds_to_the_reuse_score_over_the_same_footprint(case, factor):
    """The CPU reuse score's two parts share a denominator: (dQ + d trips) / dF."""
    (m, n, k), (ti, tj, tk) = case
    calc = TileCalculus(matmul(m, n, k))
    register, tile = (ti, tj, 1), (ti, tj, tk)
    grown = (ti, tj, tk * (factor + 1))
    df = calc.footprint_bytes(grown) - calc.footprint_bytes(tile)
    saved = calc.accumulator_bytes(register, tile) - calc.accumulator_bytes(register, grown)
    assert saved >= 0
    if df > 0:
        assert calc.accumulator_reuse(register, tile, grown) == saved / df
    else:  # K is whole already: nothing grows, nothing is saved
        assert saved == 0 and calc.accumulator_reuse(register, tile, grown) == 0.0


def test_matmul_whole_operator_tile_moves_every_byte_once():
    calc = TileCalculus(matmul(64, 32, 16))
    assert calc.traffic_bytes((64, 32, 16)) == (64 * 16 + 16 * 32 + 64 * 32) * F32


@st.composite
def conv_tile(draw):
    p = dict(
        N=draw(st.integers(1, 3)), C=draw(st.integers(1, 8)), H=draw(st.integers(6, 20)), W=draw(st.integers(6, 20)),
        F=draw(st.integers(1, 8)), KH=draw(st.integers(1, 3)), KW=draw(st.integers(1, 3)),
        stride=draw(st.integers(1, 3)), pad=draw(st.integers(0, 2)), dilation=draw(st.integers(1, 2)),
    )  # fmt: skip
    e = expr("conv2d", **p)
    tile = tuple(draw(st.integers(1, a.extent)) for a in e.axes)
    return p, e, tile


@pytest.mark.tvm  # the catalog builds each drawn conv with TVM
@settings(max_examples=150, deadline=None)
@given(conv_tile())
def test_conv_traffic_and_footprint_are_the_closed_form(case):
    p, e, (tn, tf, th, tw, tc, tr, ts) = case
    s, d, pad = p["stride"], p["dilation"], p["pad"]
    oh = (p["H"] + 2 * pad - d * (p["KH"] - 1) - 1) // s + 1
    ow = (p["W"] + 2 * pad - d * (p["KW"] - 1) - 1) // s + 1
    assert e.extents == (p["N"], p["F"], oh, ow, p["C"], p["KH"], p["KW"])
    # input rows read by th output rows and tr kernel rows: (th - 1) * s + (tr - 1) * d + 1,
    # never more than the padded input has
    rows = min((th - 1) * s + (tr - 1) * d + 1, p["H"] + 2 * pad)
    cols = min((tw - 1) * s + (ts - 1) * d + 1, p["W"] + 2 * pad)
    data = tn * tc * rows * cols
    kernel = tf * tc * tr * ts
    out = tn * tf * th * tw
    grid = _cdiv(p["N"], tn) * _cdiv(p["F"], tf) * _cdiv(oh, th) * _cdiv(ow, tw)
    steps = _cdiv(p["C"], tc) * _cdiv(p["KH"], tr) * _cdiv(p["KW"], ts)
    calc = TileCalculus(e)
    tile = (tn, tf, th, tw, tc, tr, ts)
    assert calc.traffic_bytes(tile) == grid * steps * (data + kernel) * F32 + grid * out * F32
    assert calc.footprint_bytes(tile) == (data + kernel + out) * F32


def test_footprint_padding_widens_the_leading_dimension_only():
    calc = TileCalculus(matmul(128, 128, 128))
    tile = (16, 32, 8)
    plain = calc.footprint_bytes(tile)
    # A is [16, 8] -> [16, 8 + 3]; B is [8, 32] -> [8, 32 + 5]; the output's entry 0 pads nothing
    assert calc.footprint_bytes(tile, (3, 5, 0)) == plain + (16 * 3 + 8 * 5) * F32
    assert calc.footprint_bytes(tile, (3,)) == plain + 16 * 3 * F32


@settings(max_examples=100, deadline=None)
@given(matmul_tile(), st.integers(0, 2))
def test_reuse_score_is_traffic_saved_per_byte_of_footprint(case, axis):
    (m, n, k), tile = case
    calc = TileCalculus(matmul(m, n, k))
    grown = tile[:axis] + (tile[axis] * 2,) + tile[axis + 1 :]
    dq = calc.traffic_bytes(tile) - calc.traffic_bytes(grown)
    df = calc.footprint_bytes(grown) - calc.footprint_bytes(tile)
    score = calc.reuse_score(tile, grown)
    if df > 0:
        assert score == dq / df
    else:  # the axis is already whole: growing it costs no footprint
        assert score == (float("inf") if dq > 0 else 0.0)


def test_elementwise_has_no_reuse():
    calc = TileCalculus(expr("relu", shape=(4096,)))
    for t in (1, 2, 32, 256):
        assert calc.traffic_bytes((t,)) == 2 * 4096 * F32
        assert calc.reuse_score((t,), (2 * t,)) == 0.0


def test_data_tiles_are_memoised_and_ordered_inputs_then_output():
    e = matmul(32, 16, 8)
    calc = TileCalculus(e)
    shapes = calc.data_tiles((4, 2, 8))
    assert shapes == ((4, 8), (8, 2), (4, 2))
    assert calc.data_tiles((4, 2, 8)) is shapes
    assert prod(shapes[-1]) * F32 * calc.spatial_tiles((4, 2, 8)) == 32 * 16 * F32


def test_sweep_steps_the_innermost_spatial_axis_that_steps_with_the_reduction_of_the_tile_above():
    """matmul (i, j, k): an L1 tile 4 x 16 x 8 inside 8 x 64 x 32 steps j innermost, so one
    step touches 4 x 16 over the whole K of 32 and the run of steps spans j = 64; inside
    8 x 16 x 32 only i steps; inside a tile of the same spatial sizes nothing steps."""
    calc = TileCalculus(matmul(256, 256, 256))
    assert calc.sweep((4, 16, 8), (8, 64, 32)) == ((4, 16, 32), (4, 64, 32))
    assert calc.sweep((4, 16, 8), (8, 16, 32)) == ((4, 16, 32), (8, 16, 32))
    assert calc.sweep((4, 16, 8), (4, 16, 256)) is None


def test_an_input_read_an_element_at_a_time_counts_the_whole_lines_it_touches():
    """conv-1x1 (256 channels, 14 x 14): a data tile of 128 channels x 7 rows x 1 column is 896
    runs of one float, 896 lines of 64 B; a tile 16 columns wide is 896 runs of one line each;
    whole rows and columns make the 128 channels one run (NCHW), bytes again. The
    filters' tile (32 filters x 128 channels, the 1 x 1 window whole) is 32 runs of 512 B: lines
    lose nothing there, and inputs left out of `in_lines` count bytes."""
    e = expr("conv2d", N=1, C=256, H=14, W=14, F=1024, KH=1, KW=1, stride=1, pad=0)
    calc = TileCalculus(e)
    data = frozenset({0})
    tile = (1, 32, 7, 1, 128, 1, 1)  # n, f, y, x, c, r, s
    assert calc.input_bytes(calc.data_tiles(tile), 64, data) == (896 * 64, 32 * 128 * 4)
    assert calc.input_bytes(calc.data_tiles(tile)) == (128 * 7 * 4, 32 * 128 * 4)
    assert calc.input_bytes(calc.data_tiles((1, 32, 7, 14, 128, 1, 1)), 64, data)[0] == 128 * 7 * 64
    assert calc.input_bytes(calc.data_tiles((1, 32, 7, 14, 128, 1, 1)), 64, frozenset({0, 1})) == (
        128 * 7 * 64, 32 * 128 * 4)
    whole_rows = calc.data_tiles((1, 32, 14, 14, 128, 1, 1))
    assert calc.input_bytes(whole_rows, 64, data)[0] == 128 * 14 * 14 * 4
    assert calc.footprint_bytes(tile, line=64, in_lines=data) == 896 * 64 + 32 * 128 * 4 + 32 * 7 * 4
    assert calc.traffic_bytes(tile, 64, data) - calc.traffic_bytes(tile) == (
        calc.num_tiles(tile) * (896 * 64 - 128 * 7 * 4))
