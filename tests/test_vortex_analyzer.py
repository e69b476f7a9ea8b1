"""Vortex's analyzer: padded extents, the pure expression at an extent, the hybrid cost's waves."""

from math import ceil

import pytest
from helpers import TINY_CPU, expr

from workbench.ops import catalog
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus
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
