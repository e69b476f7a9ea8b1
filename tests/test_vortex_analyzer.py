"""Vortex's analyzer: padded extents, the pure expression at an extent, the hybrid cost's waves."""

from math import ceil

import pytest
from helpers import TINY_CPU, device, expr

from workbench.ops import catalog
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus
from workbench.rtile.model import estimate
from workbench.rtile.model import cpu
from workbench.rtile.model.cpu import packed_bytes, packing_seconds
from workbench.rtile.panels import pack_layer, packed_inputs
from workbench.vortex.analyzer import Dynamic, at_extent, cost, outer_tile, padded_extent, program_at


@pytest.mark.parametrize("value, outer, padded", [(1, 48, 48), (48, 48, 48), (49, 48, 96), (97, 48, 144), (5, 1, 5)])
def test_padded_extent_is_whole_outer_tiles(value, outer, padded):
    assert padded_extent(value, outer) == padded


@pytest.mark.parametrize(
    "op, params, param, axis",
    [
        ("matmul", dict(M=64, N=48, K=32), "M", "i"),
        ("matmul", dict(M=64, N=48, K=32, trans_a=True), "M", "i"),
        ("matmul", dict(M=64, N=48, K=32, trans_b=True), "M", "i"),
        ("matmul", dict(B=4, M=8, N=48, K=32), "B", "b"),
        ("matmul", dict(B=4, M=8, N=48, K=32), "M", "i"),
        ("gemv", dict(M=64, K=32), "M", "i"),
    ],
)
@pytest.mark.parametrize("value", [1, 7, 64, 331])
def test_at_extent_is_the_catalog_expression(op, params, param, axis, value):
    """Axes, tensor shapes, kernel arguments, flops and parameters as catalog.build gives them."""
    template = catalog.build(op, params)
    assert at_extent(template, axis, value, param) == catalog.build(op, {**params, param: value})


def _program(e, dev, tiles):
    return make_program(calculus(e), dev, tiles, [True] * len(tiles), 0.0)


@pytest.mark.parametrize("value", [1, 5, 8, 9, 40, 77])
def test_cost_pads_only_the_outer_level_and_counts_waves(value):
    """On two cores, a unit tile of 8 x 16 over N = 48: ceil(v / 8) x 3 unit tiles in
    ceil(that / 2) waves; the executed flops are those of the padded extent; every value with
    the same padded extent costs the same."""
    dev = TINY_CPU
    template = expr("matmul", M=512, N=48, K=64)
    program = _program(template, dev, [(4, 16, 1), (8, 16, 16), (8, 16, 64)])
    dyn = Dynamic("M", "i", 512)
    assert outer_tile(program, dyn) == 8
    est = cost(program, dev, dyn, value)
    padded = ceil(value / 8) * 8
    assert program_at(program, dev, dyn, value).grid == padded // 8 * 3
    assert est.waves == ceil(padded // 8 * 3 / dev.compute_units)
    assert est.flops == est.padded_flops == 2 * padded * 48 * 64
    assert cost(program, dev, dyn, padded).predicted_seconds == est.predicted_seconds
    assert cost(program, dev, dyn, padded + 1).predicted_seconds > est.predicted_seconds  # one more outer tile


def test_a_smaller_outer_tile_wastes_less_at_small_values():
    """At M = 1 a kernel of outer tile 6 executes 6 rows, one of 48 executes 48: the model
    prices the first lower; at M = 48 neither pads."""
    dev = TINY_CPU
    template = expr("matmul", M=2048, N=256, K=256)
    dyn = Dynamic("M", "i", 2048)
    small = _program(template, dev, [(6, 16, 1), (6, 64, 64), (6, 256, 256)])
    big = _program(template, dev, [(6, 16, 1), (12, 64, 64), (48, 256, 256)])
    assert cost(small, dev, dyn, 1).padded_flops * 8 == cost(big, dev, dyn, 1).padded_flops
    assert cost(small, dev, dyn, 1).predicted_seconds < cost(big, dev, dyn, 1).predicted_seconds
    assert cost(small, dev, dyn, 48).padded_flops == cost(big, dev, dyn, 48).padded_flops


@pytest.mark.parametrize("value", [1, 8, 9, 77, 512])
@pytest.mark.parametrize("k_tile", [64, 32])
def test_packing_is_one_copy_of_the_panels_per_unit_tile_and_k_step(value, k_tile, monkeypatch):
    """The CPU template packs B's kc x 16 tile per unit tile and K-step (K = 1536 in 1536 / kc
    steps; B's kc rows 3 KiB apart span more than TINY_CPU's 32 KiB L1 in place, and the unit
    tile's two 4-row register tiles read it). A's 8 x kc tile spans more too (8 rows 6 KiB
    apart), but its 16 columns are one register tile's, which reads each element once: read in
    place (`panels.read_once`). The busiest of the 2 cores runs ceil(grid / 2) unit tiles, each
    copying 1536 / kc x 4 x 16 kc bytes, written at its half of L2's 200 GB/s, into a buffer of
    16 kc floats that B's 2.4 MB a core pushes out of L2 between calls: each call reads it for
    ownership and writes it back at the core's half of DRAM's 20 GB/s (`buffer_touch_seconds`).
    The cost is the model's estimate, those times included."""
    dev = TINY_CPU
    template = expr("matmul", M=512, N=768, K=1536)
    program = _program(template, dev, [(4, 16, 1), (8, 16, 16), (8, 16, k_tile)])
    dyn = Dynamic("M", "i", 512)
    at = program_at(program, dev, dyn, value)
    assert packed_inputs(at.expr, at, dev) == ("B",) and pack_layer(at) == 2
    grid = ceil(value / 8) * 768 // 16
    moved = ceil(grid / 2) * (1536 // k_tile) * 4 * (k_tile * 16)
    assert packed_bytes(at, dev) == moved
    touch = 2 * (16 * k_tile * 4) / (20e9 / 2)
    assert packing_seconds(at, dev) == pytest.approx(moved / (200e9 / 2) + touch, rel=1e-12)
    est = cost(program, dev, dyn, value)
    assert est == estimate(at, dev)
    assert dict(est.load_seconds)["packing into L2"] == pytest.approx(moved / 100e9 + touch, rel=1e-12)
    monkeypatch.setattr(cpu, "packed_bytes", lambda program, device, transposed=False, rows=False: 0)  # no copies: all else equal
    assert est.predicted_seconds == pytest.approx(estimate(at, dev).predicted_seconds + moved / 100e9 + touch, rel=1e-12)


def test_a_single_row_unit_tile_packs_nothing():
    """One row per unit tile: B is read once per row whatever the template does, so it is not
    packed (nor A, whose rows it would copy once per column of tiles), and the cost is the
    model's alone; on a GPU nothing is priced as a CPU panel."""
    dev = TINY_CPU
    template = expr("matmul", M=512, N=48, K=64)
    program = _program(template, dev, [(1, 16, 1), (1, 16, 64), (1, 48, 64)])
    dyn = Dynamic("M", "i", 512)
    assert packed_inputs(program.expr, program, dev) == () and packed_bytes(program, dev) == 0
    assert cost(program, dev, dyn, 5) == estimate(program_at(program, dev, dyn, 5), dev)
    packed = _program(template, dev, [(4, 16, 1), (8, 16, 16), (8, 16, 64)])
    assert packed_inputs(packed.expr, packed, device("a100")) == ()


def test_at_one_row_the_single_row_kernel_is_cheaper_than_six_rows():
    """BERT GEMM at M = 1 on TINY_CPU: a 6-row kernel computes 6 rows and copies B's panels,
    the single-row one neither; at M = 1536 the single row streams B once per row and costs
    more than the 6-row kernel that packs it once per 96 rows."""
    dev = TINY_CPU
    template = expr("matmul", M=2048, N=2304, K=768)
    dyn = Dynamic("M", "i", 2048)
    row = _program(template, dev, [(1, 64, 1), (1, 64, 96), (1, 384, 96)])
    six = _program(template, dev, [(6, 16, 1), (6, 16, 256), (96, 384, 256)])
    assert packing_seconds(program_at(row, dev, dyn, 1), dev) == 0 < packing_seconds(program_at(six, dev, dyn, 1), dev)
    assert cost(row, dev, dyn, 1).predicted_seconds < cost(six, dev, dyn, 1).predicted_seconds
    assert cost(row, dev, dyn, 1536).predicted_seconds > cost(six, dev, dyn, 1536).predicted_seconds
