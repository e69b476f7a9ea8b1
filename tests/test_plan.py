"""One plan per kernel (`rtile.plan`): the CPU template's path and layout, the GPU templates'
staging, made once from the rules and read by codegen, the model and the faces; on generated
specs, never only this machine's."""

from dataclasses import replace
from math import ceil, prod

import pytest
from helpers import TINY_CPU, device, expr, matmul, plain_matmul
from test_alignment import AVX2, AVX512

from workbench.construct.stepper import construct
from workbench.ops.fusion import fuse_axes
from workbench.ops.tensor_expr import RowPass
from workbench.hardware.spec import MicroKernel
from workbench.rtile.model import estimate
from workbench.rtile.model.common import is_stream_bound
from workbench.rtile.model.cpu import (
    FOLLOWED_STREAMS, core_ghz, edge_seconds, packed_bytes, packed_runs, stream_rounds, stream_runs,
    stream_seconds, stream_tile, streamed_inputs,
)
from workbench.rtile.model.cpu_compute import (
    CUT_ROWS_SLOWDOWN, EDGE_SKIP_CYCLES, GRID_GUARDED_TILE, GUARDED_LANE_CYCLES, GUARDED_MICRO_KERNEL,
    compute_efficiency, cut_rows, edge_in_pieces, edge_pieces, edge_slowdown, edge_split,
    guard_slowdown, guarded_edges, lane_priced_edge, past_rate,
)
from workbench.rtile.panels import (
    cut_other_axes, cut_register_axes, ends_on_vector, packed_inputs, pads_tails, vector_loop_axis,
)
from workbench.rtile.plan import (
    FILTERS, LANES, PANELS, ROW, SCALAR, CpuPlan, GpuPlan, cpu_plan, describe, gpu_plan, plan_for, splits_reduction,
)
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus

CPUS = (TINY_CPU, AVX2, AVX512)


def _program(e, tiles, dev=TINY_CPU):
    return make_program(calculus(e), dev, tiles, [True] * len(tiles), 0.0)


def _ragged_matmul(epilogues=()):
    """100 rows on 6-row register tiles: a tail the template pads where it packs panels."""
    e = replace(fuse_axes(expr("matmul", M=100, K=64, N=64)), epilogues=epilogues)
    return _program(e, [(6, 16, 1), (6, 16, 64), (102, 64, 64)])


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_ragged_matmul_packs_pads_and_vectorises_its_row(dev):
    program = _ragged_matmul()
    plan = cpu_plan(program, dev)
    assert plan.path == PANELS and plan.vector_axis == 1 and plan.padded_tails and not plan.guarded_row
    assert plan.packed == packed_inputs(program.expr, program, dev) == ("A", "B")
    assert plan.lanes == dev.warp_size  # fp32: the spec's 32-bit lanes
    assert guard_slowdown(program, dev) == 1.0 and packed_bytes(program, dev) > 0


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_epilogues_fold_into_the_padded_copy_back_but_row_passes_keep_the_guard(dev):
    """An elementwise epilogue (a bias, a ReLU) is folded into the padded output's copy-back, so
    ragged tails are padded as without it (a 1x1 conv's pixel row with its bias and ReLU ran
    scalar behind the guard); passes over rows of their own (softmax's) read the unpadded
    output, so there the 6-row register tiles keep their guard over 100 rows, and the model
    prices the guarded micro-kernel the template builds."""
    program = _ragged_matmul(("T_add",))
    plan = cpu_plan(program, dev)
    assert plan.path == PANELS and plan.padded_tails and not plan.guarded_row
    assert guard_slowdown(program, dev) == 1.0
    passes = (RowPass(rows=100, extent=64, ops=1, reduction=False),)
    e = replace(program.expr, row_passes=passes)
    program = _program(e, [(6, 16, 1), (6, 16, 64), (102, 64, 64)])
    assert pads_tails(program.expr, program, ("A", "B"))  # the rule alone would pad
    plan = cpu_plan(program, dev)
    assert not plan.padded_tails and plan.vector_axis == 1  # the row (64 columns) is not ragged
    assert plan.vector_axis == vector_loop_axis(program.expr, program, dev, True, False)
    assert guard_slowdown(program, dev) == GUARDED_MICRO_KERNEL
    assert estimate(program, dev).predicted_seconds != estimate(_ragged_matmul(), dev).predicted_seconds


def _ragged_k_matmul(pads_reduction=True):
    """1000x999x1001 on 144x144x336 unit tiles: every axis ragged, K (999 in 3 K-steps of 336)
    too; `pads_reduction` False stands for a reduction zeros would change (`max=`)."""
    e = replace(plain_matmul(1000, 1001, 999), pads_reduction=pads_reduction)
    return _program(e, [(6, 16, 1), (6, 16, 336), (144, 144, 336)])


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_ragged_k_of_a_sum_of_products_is_padded_so_the_micro_kernel_runs_unguarded(dev):
    """Zeros past K's end add nothing to a sum of products: the plan packs and pads every axis
    (K included) and vectorises the row, where a ragged K used to leave panels out and the row
    scalar behind its guard (1000x999x1001 ran 0.06x numpy), with an elementwise epilogue as
    well (a decoder block's 9 x 973 x 75 down projection, bias and residual added, ran 100 us
    so against 8.4 padded, ONNX Runtime's 18). A reduction zeros would change
    gets no panels: its row has its edges split off instead, the rows' ragged end as well
    (`panels.splits_edges`), priced as closed forms: of N's 1001 columns 992 in whole 16-column
    register tiles run in vectors, over the 1008 of whole unit tiles; 6-row tiles cut M's 1000
    rows, which such programs ran far slower than the cut tile's guard alone
    (CUT_ROWS_SLOWDOWN, docs/model-evidence.md#cut-rows). The tile N's end cuts runs its 9
    columns as guarded scalar FMAs and tests the guard of the 7 lanes past the end (a 6-row
    tile: its vectors stay unrolled, no `edge_vectors`), on the 1002 rows of register tiles and
    999 K-steps, at GUARDED_LANE_CYCLES and EDGE_SKIP_CYCLES, on the cores that hold the 7 unit
    tiles of that column: ceil(7 / cores) of 7 on the busiest."""
    program = _ragged_k_matmul()
    plan = cpu_plan(program, dev)
    assert plan.path == PANELS and plan.vector_axis == 1 and plan.padded_tails and not plan.guarded_row
    assert plan.packed == ("A", "B") and guard_slowdown(program, dev) == 1.0
    assert describe(plan, program).startswith("A, B packed in 6x16 panels, lanes along j, tails padded")
    # only K ragged: still padded (the inputs only)
    k_only = _program(plain_matmul(1008, 1008, 999), [(6, 16, 1), (6, 16, 336), (144, 144, 336)])
    assert pads_tails(k_only.expr, k_only, packed_inputs(k_only.expr, k_only, dev))
    assert cpu_plan(k_only, dev).padded_tails and cpu_plan(k_only, dev).path == PANELS
    kept = _ragged_k_matmul(pads_reduction=False)
    plan = cpu_plan(kept, dev)
    assert plan.packed == () and not plan.padded_tails and plan.path == ROW and plan.split_edges
    assert not plan.guarded_row and "edge tiles split off, scalar" in describe(plan, kept)
    assert not plan.edge_vectors and lane_priced_edge(kept, dev)
    row = 992 / 1008
    assert guard_slowdown(kept, dev) == pytest.approx(row * CUT_ROWS_SLOWDOWN)
    assert edge_split(kept, dev) == (992, 9, 7)
    share = ceil(7 / dev.compute_units) / 7
    cycles = 9 * GUARDED_LANE_CYCLES + 7 * EDGE_SKIP_CYCLES
    assert edge_seconds(kept, dev) == pytest.approx(cycles * 1002 * 999 * share / (_clock_ghz(dev) * 1e9))
    # an elementwise epilogue (a bias, a residual) folds into the padded output's copy-back and
    # reads the finished sums, so a ragged K is padded beside it as without it; row passes keep
    # the tails guarded, so there a ragged K is not padded and gets no panels either
    fused = replace(k_only, expr=replace(k_only.expr, epilogues=("T_add",)))
    assert packed_inputs(fused.expr, fused, dev) == ("A", "B") and cpu_plan(fused, dev).padded_tails
    passes = (RowPass(rows=1008, extent=1008, ops=1, reduction=False),)
    rows = replace(k_only, expr=replace(fused.expr, row_passes=passes))
    assert packed_inputs(rows.expr, rows, dev) == () and not cpu_plan(rows, dev).padded_tails


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_the_model_prices_the_padded_ragged_k_as_closed_forms(dev):
    """The padded flops are those of the 1008^3 the kernel runs, the panel copies move A's and
    B's unit-tile slices (144 x 336 each way) once per K-step (3) per unit tile, for the
    ceil(49 / cores) unit tiles of the busiest core, and the compute is not slowed by a guard."""
    program = _ragged_k_matmul()
    est = estimate(program, dev)
    assert est.padded_flops == 2 * 1008 ** 3
    assert program.grid == 49
    per_copy = (144 * 336 + 336 * 144) * 4
    assert packed_bytes(program, dev) == ceil(49 / dev.compute_units) * 3 * per_copy
    # the split edges of a reduction that cannot pad cost more than the padding
    assert estimate(_ragged_k_matmul(False), dev).predicted_seconds > est.predicted_seconds


def test_a_gemv_sums_lanes_along_k_and_a_conv_vectorises_its_filters():
    gemv = construct(fuse_axes(expr("gemv", M=4096, K=4096)), AVX512).candidates[0]
    plan = cpu_plan(gemv.program, AVX512)
    assert plan.path == LANES and gemv.expr.axes[plan.vector_axis].kind == "reduce" and plan.packed == ()
    conv = fuse_axes(expr("conv2d", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, pad=1))
    plan = cpu_plan(construct(conv, AVX512).candidates[0].program, AVX512)
    assert plan.path == FILTERS and plan.accumulators == "filters-last buffer" and plan.staged_padding
    assert plan.packed == tuple(t.name for t in conv.inputs if t.uses_axis(plan.vector_axis))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_filters_the_unit_tile_leaves_ragged_are_padded_and_priced_as_whole_tiles(dev):
    """31 filters in unit tiles of two register rows of a vector each: the plan pads them to
    ceil(31 / 2v) x 2v (32 on 8 lanes, 32 on 16), vectorises them, and says so; the model
    prices the padded filters' flops (31 -> 32: 32 / 31 of the work) and no guard. A ragged
    output row (7 in one unit tile of 8) has its edge split off: of the 7 rows, the 6 in whole
    register tiles of 2 run unguarded, the 7th under the guard (GUARDED_MICRO_KERNEL), over
    the 8 rows of the whole unit tile the compute term counts. 32 filters pad nothing."""
    v = dev.warp_size
    for f, oh in ((31, 8), (31, 7), (32, 8)):
        conv = expr("conv2d", N=1, C=8, H=oh, W=8, F=f, KH=3, KW=3, stride=1, pad=1)
        program = _program(conv, [(1, v, 2, 1, 1, 3, 3), (1, 2 * v, 2, 8, 8, 3, 3), (1, 2 * v, 8, 8, 8, 3, 3)], dev)
        plan = cpu_plan(program, dev)
        ragged = f % (2 * v) != 0
        assert plan.path == FILTERS and plan.vector_axis == 1 and plan.padded_filters is ragged
        assert plan.to_dict(conv)["padded_filters"] is ragged
        words = describe(plan, program)
        edges = oh % 8 != 0
        assert plan.split_edges is edges and "tails guarded" not in words
        assert ("filters padded" in words) is ragged and ("edge tiles split off, guarded" in words) is edges
        assert guard_slowdown(program, dev) == pytest.approx((6 + 1 * GUARDED_MICRO_KERNEL) / 8 if edges else 1.0)
        padded_f = -(-f // (2 * v)) * 2 * v
        assert estimate(program, dev).padded_flops == pytest.approx(conv.flops * padded_f * 8 / (f * oh), abs=1)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_filters_an_edge_the_grid_splits_off_is_priced_on_the_core_that_holds_it(dev):
    """The same 31 filters over 7 rows, in unit tiles of 4 rows: the grid splits the rows, so
    the 7th row's guard depends on the grid's index and runs at GRID_GUARDED_TILE, on the cores
    whose unit tiles end the rows, and the 8th row, past the end in the cut register tile, tests
    its guards at `past_rate` (P). Two cores (TINY_CPU's). On 16 lanes the grid is the two row
    tiles, a core each: the second's rows 4 and 5 whole, row 6 guarded, row 7 past, over 4
    rows, (2 + G + P) / 4. On 8 lanes the filters take two unit tiles too, the grid (filters,
    rows) is 4 tiles, two a core, each core one whole row tile and one last: (4 + 2 + G + P) / 8."""
    v = dev.warp_size
    conv = expr("conv2d", N=1, C=8, H=7, W=8, F=31, KH=3, KW=3, stride=1, pad=1)
    program = _program(conv, [(1, v, 2, 1, 1, 3, 3), (1, 2 * v, 2, 8, 8, 3, 3), (1, 2 * v, 4, 8, 8, 3, 3)], dev)
    assert cpu_plan(program, dev).split_edges and dev.compute_units == 2
    past = past_rate(dev)
    assert past == pytest.approx(EDGE_SKIP_CYCLES * dev.fma_pipes)
    expected = (2 + GRID_GUARDED_TILE + past) / 4 if v == 16 else (6 + GRID_GUARDED_TILE + past) / 8
    assert guard_slowdown(program, dev) == pytest.approx(expected)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_panels_rows_past_the_end_cost_nothing(dev):
    """263 x 191 x 75 in 5 x 80 register tiles under U x 80 x 192 unit tiles: one register tile
    across N reads A's panel, so A is read in place, its rows left unpadded
    (`CpuPlan.edge_axes`), and the grid's two row tiles go to two cores. The second core's last
    register tile is cut (3 of its 5 rows, at GRID_GUARDED_TILE) and the rows from there to U lie
    past the end, which on the panels path cost nothing (evidence:
    docs/model-evidence.md#panels-past-end): the factor is max(U, 263 - U - 3 + 3 G) / U, where
    the filters path's `past_rate` would add the 2U - 263 rows past the end to the second core."""
    e = fuse_axes(matmul(263, 75, 191))
    for unit in (135, 140, 180):
        program = _program(e, [(5, 80, 1), (5, 80, 96), (unit, 80, 192)], dev)
        plan = cpu_plan(program, dev)
        assert plan.path == PANELS and plan.packed == ("B",) and 0 in plan.edge_axes and program.grid == 2
        last = 263 - unit - 3 + 3 * GRID_GUARDED_TILE
        assert guard_slowdown(program, dev) == pytest.approx(max(unit, last) / unit)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_filters_uneven_unit_tiles_are_priced_on_the_busiest_core(dev):
    """7 output rows in register tiles of one row (no register tile cut) under unit tiles of 4
    or 3 rows: the grid's tiles hold 4 + 3 or 3 + 3 + 1 rows, dealt ceil(G / 2) a core, so the
    first core runs 4 of its 4 rows or 6 of its 6: the compute term, which counts the padded 8
    or 9 rows over the two cores, is the busiest core's time as it stands (factor 1), not
    scaled down to the 7 rows' even share (7 / 8, 7 / 9), which the second core's idle rows do
    not buy (evidence: docs/model-evidence.md#busiest-core)."""
    v = dev.warp_size
    conv = expr("conv2d", N=1, C=8, H=7, W=8, F=2 * v, KH=3, KW=3, stride=1, pad=1)
    for rows, grid in ((4, 2), (3, 3)):
        program = _program(conv, [(1, v, 1, 8, 1, 3, 3), (1, 2 * v, 1, 8, 8, 3, 3), (1, 2 * v, rows, 8, 8, 3, 3)],
                           dev)
        assert cpu_plan(program, dev).path == FILTERS and program.grid == grid and dev.compute_units == 2
        assert guard_slowdown(program, dev) == 1.0
        assert estimate(program, dev).padded_flops == pytest.approx(conv.flops * grid * rows / 7, abs=1)


@pytest.mark.parametrize("seed", range(6))
def test_the_busiest_core_of_a_split_edge_agrees_with_visiting_every_tile(seed):
    """`busiest_share` reads each core's sum off the grid's digits; visiting every unit tile in
    the grid's order, costing each element (1 in whole register tiles, GUARDED_MICRO_KERNEL in
    an edge along an axis one unit tile spans, GRID_GUARDED_TILE in one along an axis the grid
    splits, `past` past the end of an axis the grid splits and within the others', 0 past any
    other end) and dealing ceil(G / cores) tiles a core, gives the same."""
    import itertools
    import random

    from workbench.rtile.model.cpu_compute import busiest_share

    rng = random.Random(seed)
    dims = {a: rng.randint(5, 23) for a in ("H", "W")}
    params = dict(N=rng.randint(1, 3), C=4, F=rng.choice((16, 32, 48)), KH=3, KW=3, stride=1, pad=1, **dims)
    conv = fuse_axes(expr("conv2d", **params))
    reg = (1, 16, rng.randint(1, 4), rng.randint(1, 4), 1, 3, 3)
    unit = (1, 16 * rng.randint(1, 2), reg[2] * rng.randint(1, 3), reg[3] * rng.randint(1, 3), 4, 3, 3)
    program = _program(conv, [reg, (1, 16, reg[2], reg[3], 4, 3, 3), unit], AVX512)
    axes = [2, 3]
    split = [a for a in axes if conv.axes[a].extent % reg[a] and unit[a] < conv.axes[a].extent]
    cores = rng.choice((2, 3, 4))
    past = rng.choice((0.0, 2.4))
    spatial = conv.spatial
    counts = [range(-(-conv.axes[a].extent // unit[a])) for a in spatial]
    costs = []
    for index in itertools.product(*counts):
        cost = 0.0
        for point in itertools.product(*(range(i * unit[a], (i + 1) * unit[a]) for a, i in zip(spatial, index))):
            at = dict(zip(spatial, point))
            beyond = {a for a in axes if at[a] >= conv.axes[a].extent}
            if beyond:
                cost += past if beyond <= set(split) else 0.0
                continue
            edge = [a for a in axes if at[a] >= conv.axes[a].extent // reg[a] * reg[a]]
            cost += GRID_GUARDED_TILE if set(edge) & set(split) else GUARDED_MICRO_KERNEL if edge else 1.0
        costs.append(cost)
    step = -(-len(costs) // cores)
    worst = max(sum(costs[i:i + step]) for i in range(0, len(costs), step))
    assert busiest_share(program, axes, split, cores, past) == pytest.approx(worst / (step * prod(unit[a] for a in spatial)))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_whole_row_over_ragged_rows_splits_their_edges_off(dev):
    """A depthwise conv's 16-wide rows, the row whole and read in place (the row path), its
    output rows in unit tiles of 16 (two channels' to a unit tile: the grid splits only the
    channels, one unit tile a core). 14 rows in register tiles of 4: the plan splits the rows'
    edge off (`split_others`); of the unit tile's 16 rows the 12 in whole register tiles run
    unguarded, the 2 of the cut tile at GUARDED_MICRO_KERNEL's rate, the 2 past the end at
    nothing. In tiles of 2 no tile is cut, but every row of every tile would test the guard:
    split, 14 of 16 rows at 1. In tiles of one row the guard is one per tile: nothing split,
    the padded rows priced as the compute term counts them. 12 rows in a unit tile of 12
    guard nothing."""
    cases = ((14, 4, 16, True, (12 + 2 * GUARDED_MICRO_KERNEL) / 16), (14, 2, 16, True, 14 / 16),
             (14, 1, 16, False, 1.0), (12, 4, 12, False, 1.0))
    for h, rows, unit, split, guard in cases:
        e = expr("depthwise_conv2d", N=1, C=4, H=h, W=16, KH=3, KW=3, stride=1, pad=1)
        program = _program(e, [(1, 1, rows, 16, 3, 3), (1, 1, rows, 16, 3, 3), (1, 2, unit, 16, 3, 3)], dev)
        plan = cpu_plan(program, dev)
        assert plan.path == ROW and plan.vector_axis == 3 and not plan.split_edges and plan.split_others is split
        assert plan.to_dict(e)["split_others"] is split
        assert ("edge tiles split off, guarded" in describe(plan, program)) is split
        assert guard_slowdown(program, dev) == pytest.approx(guard)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("m,k,rows,unit_k", [(96, 1024, 7, 1024), (4096, 1000, 6, 1008)])
def test_a_reduction_in_lanes_splits_its_ragged_outputs_edges_off(dev, m, k, rows, unit_k):
    """A gemv, K in lanes, in register tiles of 7 (6) rows under one unit tile of 98 (4098): the
    plan splits the rows' edge off (`split_others`), so the 91 (4092) rows in whole register
    tiles run unguarded and the 5 (4) of the cut tile at GUARDED_MICRO_KERNEL's rate, of the 98
    (4098) the compute term counts; a ragged K's edge (`split_edges`) multiplies that by its
    scalar lanes' share (`edge_slowdown`: the unit K's whole vectors and its K % lanes lanes a
    vector's slot each). Register tiles of one row keep one guard per tile: nothing split."""
    lanes = dev.warp_size
    e = expr("gemv", M=m, K=k)
    unit = -(-m // rows) * rows
    whole = k // lanes * lanes
    along_k = (whole + (k - whole) * lanes) / unit_k
    for reg, split in ((rows, True), (1, False)):
        program = _program(e, [(reg, lanes), (reg, 256), (unit, unit_k)], dev)
        plan = cpu_plan(program, dev)
        assert plan.path == LANES and plan.split_edges is (k % unit_k > 0) and plan.split_others is split
        assert ("edge tiles split off, guarded" in describe(plan, program)) is split
        inner = m // rows * rows
        # one row a tile: its one guard hoisted, the rows to the unit tile's end as the compute term counts them
        edge = (inner + (m - inner) * GUARDED_MICRO_KERNEL) / unit if split else 1.0
        assert guard_slowdown(program, dev) == pytest.approx(edge * along_k)


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_whole_row_shorter_than_a_vector_is_vectorised_in_pieces(dev):
    """A whole output row shorter than a vector (a late depthwise layer's 7 or 13 columns, a
    matmul's 6 outputs) runs in LLVM's pieces of at least 4 lanes, as the model prices it
    (`registers.row_vectors`), rather than scalar; a row of 2 or 3 stays scalar."""
    lanes = dev.warp_size
    for width in sorted({4, 7, lanes - 1}):
        e = fuse_axes(expr("depthwise_conv2d", N=1, C=32, H=9, W=width, KH=3, KW=3, stride=1, pad=1))
        w = [a.name for a in e.axes].index("w")
        program = _program(e, [tuple({w: width}.get(a, 1) for a in range(len(e.axes))),
                               tuple({w: width}.get(a, e.axes[a].extent) for a in range(len(e.axes)))], dev)
        plan = cpu_plan(program, dev)
        assert plan.path == ROW and plan.vector_axis == w, (width, plan)
        assert "lanes along w" in describe(plan, program)
    for n in (lanes - 2, 4, 3, 2):
        program = _program(plain_matmul(100, n, 64), [(5, n, 1), (5, n, 64), (100, n, 64)], dev)
        plan = cpu_plan(program, dev)
        vectorised = plan.path in (ROW, PANELS) and plan.vector_axis == 1
        assert vectorised is (n >= 4) and (vectorised or plan.path == SCALAR), (n, plan)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_reduction_in_lanes_splits_only_the_outputs_edges_that_cut_a_register_tile(dev):
    """Over 816 rows (34 register tiles of 24) in unit tiles of 72 the guard tests whole register
    tiles: nothing is split, and a ragged K's edge alone prices the guard (split as well, lowering
    no longer partitioned K's loops: gemv 816 x 1837 ran 70 us against 43 on two Zen 4 cores).
    817 rows cut a register tile, whose rows' edge splits off."""
    lanes = dev.warp_size
    for m, split in ((816, False), (817, True)):
        e = expr("gemv", M=m, K=1837)
        program = _program(e, [(24, lanes), (24, 20 * lanes), (72, 120 * lanes)], dev)
        plan = cpu_plan(program, dev)
        assert plan.path == LANES and plan.split_edges and plan.split_others is split, (m, plan)
        assert cut_register_axes(e, program, plan.vector_axis) == ((0,) if split else ())
        assert cut_other_axes(e, program, plan.vector_axis) == (0,)
        if not split:
            assert guard_slowdown(program, dev) == edge_slowdown(program, dev)


def test_a_ragged_tail_nothing_pads_or_splits_leaves_the_row_scalar():
    """A unit tile of one register tile leaves no loop below the grid to split at the end."""
    relu = expr("relu", shape=(100,))
    plan = cpu_plan(_program(relu, [(16,), (16,)]), TINY_CPU)
    assert plan.path == SCALAR and plan.vector_axis is None and plan.guarded_row and not plan.split_edges
    assert "scalar row (a guarded tail)" in describe(plan, _program(relu, [(16,), (16,)]))


def _one_row(n=4096, k=1024, tiles=((1, 56, 1), (1, 112, 64), (1, 112, 1024)), dev=TINY_CPU):
    """A one-row matmul over a ragged N (Vortex's M = 1 kernel): no panels (B is read once)."""
    return _program(plain_matmul(1, n, k), list(tiles), dev)


def _clock_ghz(dev) -> float:
    """The clock `edge_seconds` prices a core's cycles at: `core_ghz`, or for a spec without FMA
    facts (tiny-cpu) the one its peak implies with one pipe."""
    return core_ghz(dev) or dev.peak("float32") / (dev.compute_units * (dev.register_bytes // 4) * 2)


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_ragged_row_with_no_panels_splits_its_edge_off_and_vectorises(dev):
    """1x1024x212 on 1x56 registers (7 vectors of 8 lanes), 112-column unit tiles: nothing pads
    (a one-row tile packs no panel), so the plan splits the edge off (`split_edges`): the row
    vectorised, not guarded scalar. Its register tile is one row of several vectors, none lies
    wholly past the end (224 - 212 < 56) and the row ends inside a vector, so each unit tile's
    last register tile runs apart (`edge_vectors`): of 212 columns, 208 in whole tiles and the
    cut tile's whole vectors run in vectors, over the 224 columns of whole unit tiles that the
    compute term counts (`edge_slowdown`); its last 4 lanes run as guarded scalar FMAs and the
    other 12 lie past the end, and the one core that holds it runs and tests them for each of
    the 1024 K-steps, GUARDED_LANE_CYCLES and EDGE_SKIP_CYCLES each (`edge_seconds`), with the
    chains of the 7 vectors of the tile apart on the busiest core (`edge_chain_seconds`)."""
    program = _one_row(n=212, dev=dev)
    plan = cpu_plan(program, dev)
    assert plan.path == ROW and plan.vector_axis == 1 and plan.packed == () and not plan.padded_tails
    assert plan.split_edges and plan.edge_vectors and not plan.edge_in_vectors and not plan.guarded_row
    assert "edge tiles split off, their whole vectors vectorised" in describe(plan, program)
    assert plan.to_dict(program.expr)["split_edges"] is True and plan.to_dict(program.expr)["edge_vectors"] is True
    assert edge_split(program, dev) == (208, 4, 12)
    assert edge_slowdown(program, dev) == pytest.approx(208 / 224)
    assert guard_slowdown(program, dev) == edge_slowdown(program, dev)
    cycles = 4 * GUARDED_LANE_CYCLES + 12 * EDGE_SKIP_CYCLES
    # and the tile apart at each of the 2 unit tiles' ends: 7 vectors, each a chain of FMA latencies
    chains = -(-2 // dev.compute_units) * 7 * dev.fma_latency_cycles
    assert edge_seconds(program, dev) == pytest.approx((cycles + chains) * 1024 / (_clock_ghz(dev) * 1e9))
    # the compute of the same tiles over 224 columns (no edge: the padded flops alike) times it:
    # every other tile keeps its accumulators in registers
    whole = _one_row(n=224, dev=dev)
    assert not cpu_plan(whole, dev).split_edges and edge_seconds(whole, dev) == 0
    assert compute_efficiency(program, dev) == pytest.approx(compute_efficiency(whole, dev))
    assert estimate(program, dev).compute_seconds == pytest.approx(
        estimate(whole, dev).compute_seconds * edge_slowdown(program, dev))
    # 4100 columns: the cut tile holds 12, one whole vector and 4 lanes, so it runs apart as well
    long = _one_row(n=4100, dev=dev)
    assert cpu_plan(long, dev).split_edges and cpu_plan(long, dev).edge_vectors
    assert edge_split(long, dev) == (4096, 4, 44)
    assert "edge tiles split off, their whole vectors vectorised" in describe(cpu_plan(long, dev), long)
    # unit tiles of 336 columns pad 4100 to 4368, so a register tile lies wholly past the end:
    # the loops over tiles split instead, the outermost below the grid (over L1 tiles of 112):
    # from the L1 tile the end cuts to the unit tile's end every lane runs scalar, 68 of them
    # FMAs, 268 past the end
    wide = _one_row(n=4100, tiles=((1, 56, 1), (1, 112, 64), (1, 336, 1024)), dev=dev)
    assert cpu_plan(wide, dev).split_edges and not cpu_plan(wide, dev).edge_vectors
    assert edge_split(wide, dev) == (4032, 68, 268)
    cycles = 68 * GUARDED_LANE_CYCLES + 268 * EDGE_SKIP_CYCLES
    assert edge_seconds(wide, dev) == pytest.approx(cycles * 1024 / (_clock_ghz(dev) * 1e9))
    assert estimate(wide, dev).predicted_seconds > estimate(long, dev).predicted_seconds
    # a register tile of one vector has no loop over vectors to split: its tiles' loop splits,
    # and the cut tile (a vector, the end inside it) runs scalar
    lanes = dev.register_bytes // 4
    single = _one_row(n=212, tiles=((1, lanes, 1), (1, 112, 64), (1, 112, 1024)), dev=dev)
    assert cpu_plan(single, dev).split_edges and not cpu_plan(single, dev).edge_vectors
    assert edge_split(single, dev) == (208, 4, 12)
    # 4096 columns of 128: nothing ragged, nothing split
    assert not cpu_plan(_one_row(tiles=((1, 64, 1), (1, 128, 64), (1, 128, 1024)), dev=dev), dev).split_edges


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_row_that_ends_on_a_vector_runs_its_cut_tile_in_vectors(dev):
    """1x1024x4096 on 1x56 registers (vectors of 8) in 112-column unit tiles: ragged in its unit
    tiles, but 4096 ends on a vector (`ends_on_vector`), so each vector of the tile the end cuts
    lies wholly inside the row or past it, its guard the same for its lanes: the register tiles'
    loop splits (no `edge_vectors`: no lane of the cut tile runs scalar, so no tile runs apart),
    the cut tile's vectors run vectorised (V = E, S = 0) and the 48 lanes past the
    end test their guard once per vector of 8, 6 per K-step. With 4 columns more the row ends
    inside a vector and the cut tile's last lanes run scalar (the test above)."""
    program = _one_row(dev=dev)
    plan = cpu_plan(program, dev)
    assert plan.split_edges and not plan.edge_vectors and plan.edge_in_vectors and not plan.guarded_row
    assert plan.to_dict(program.expr)["edge_in_vectors"] is True
    assert "edge tiles split off, in whole vectors" in describe(plan, program)
    assert edge_split(program, dev) == (4096, 0, 48)
    assert edge_slowdown(program, dev) == pytest.approx(4096 / 4144)
    assert edge_seconds(program, dev) == pytest.approx(6 * 1024 * EDGE_SKIP_CYCLES / (_clock_ghz(dev) * 1e9))
    ragged = _one_row(n=4100, dev=dev)
    assert edge_seconds(ragged, dev) > edge_seconds(program, dev)
    assert ends_on_vector(4096, 56, 16) and ends_on_vector(4096, 56, 8) and not ends_on_vector(4100, 56, 8)
    assert ends_on_vector(4096, 24, 16)  # 24 in vectors of 8: 4096 ends on one
    assert not ends_on_vector(1309, 224, 16)


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_depthwise_row_that_ends_on_a_vector_runs_its_cut_tile_in_vectors(dev):
    """A 3 x 3 depthwise conv over 112 columns in register tiles of 4 vectors (64 columns on 16
    lanes, 32 on 8; unit tiles padded to whole ones, 128 columns): the row ends on a vector
    (`ends_on_vector`), so the tile the end cuts runs its whole vectors vectorised, and the row
    path's factor is E / P, not its edge lanes at one lane each (a conv's row path is not priced
    lane by lane: `lane_priced_edge`)."""
    lanes = dev.warp_size
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    padded = -(-112 // (4 * lanes)) * 4 * lanes
    program = _program(dw, [(1, 1, 2, 4 * lanes, 3, 3), (1, 1, 2, 4 * lanes, 3, 3), (1, 8, 56, padded, 3, 3)], dev)
    plan = cpu_plan(program, dev)
    assert plan.path == ROW and plan.split_edges and plan.edge_in_vectors and not lane_priced_edge(program, dev)
    assert 112 % (4 * lanes) and edge_slowdown(program, dev) == pytest.approx(112 / padded)


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_split_row_runs_scalar_from_the_outermost_tile_its_end_cuts(dev):
    """relu over (2, 5, 67) fused into a row of 670, in register tiles of 16, L1 tiles of 64 and
    unit tiles of 256: lowering splits the loop over L1 tiles (the outermost below the grid)
    where the row ends, so the 640 columns of whole L1 tiles run in vectors and the cut L1
    tile's 30 columns and the 98 lanes past the end up to 768 run scalar (`edge_split`), not
    only the cut register tile's; no reduction, so no `edge_vectors`, and the edge keeps the
    vector micro-kernel's price per lane (`lane_priced_edge`: measured on matmuls)."""
    e = fuse_axes(expr("relu", shape=(2, 5, 67)))
    program = _program(e, [(16,), (64,), (256,)], dev)
    plan = cpu_plan(program, dev)
    assert plan.split_edges and not plan.edge_vectors
    assert edge_split(program, dev) == (640, 30, 98)
    assert not lane_priced_edge(program, dev) and edge_seconds(program, dev) == 0


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_split_edge_at_a_constant_column_runs_in_llvms_pieces(dev):
    """2 x 1259 x 97 in 2 x 64 register tiles, nothing staged below them (no panels), its edge
    split off: in one unit tile of 128 columns the row ends at column 97 in every call, so LLVM
    vectorises the cut tile's 33 lanes in pieces (`edge_in_pieces`): 64 columns in whole tiles
    and `edge_pieces`(33) vector slots (two whole vectors and one scalar on 16 lanes; four and
    one on 8) over the 128 columns the compute term counts, and no lane priced one by one. In
    unit tiles of 64 columns the end lies in the second, at a column the grid's index decides:
    lane by lane, as before (`model.cpu.edge_seconds`)."""
    lanes = dev.register_bytes // 4
    e = plain_matmul(2, 97, 1259)
    one = make_program(calculus(e), dev, [(2, 64, 1), (2, 64, 128), (2, 128, 1280)], [True, False, False], 0.4)
    assert cpu_plan(one, dev).split_edges and lane_priced_edge(one, dev) and edge_in_pieces(one, dev)
    assert edge_split(one, dev) == (64, 33, 31)
    assert edge_pieces(33, lanes) == 33 // lanes + 1
    assert edge_slowdown(one, dev) == pytest.approx((64 + edge_pieces(33, lanes) * lanes) / 128)
    assert edge_seconds(one, dev) == 0
    two = make_program(calculus(e), dev, [(2, 16, 1), (2, 16, 128), (2, 64, 1280)], [True, False, False], 0.4)
    assert cpu_plan(two, dev).split_edges and not edge_in_pieces(two, dev)
    assert edge_split(two, dev) == (96, 1, 31) and edge_seconds(two, dev) > 0
    assert edge_pieces(63, 16) == 3 + 1 + 1 + 3 and edge_pieces(63, 8) == 7 + 1 + 3 and edge_pieces(16, 16) == 1


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_one_row_program_pays_the_bottom_layers_latency_per_run_of_b(dev):
    """1x2048x1001: the row reads B in place, once (`streamed_inputs`), in runs of its L1
    tile's rows: 64 x 112 tiles are 64 runs each, 9 x 32 tiles of them; 4 x 1008 tiles cover
    whole rows, one run, which the next reduction step's tile goes on with: the whole of B is one
    run (`stream_tile`). Each run costs the bottom layer's latency, the runs
    dealt over the cores (`stream_seconds`), so the long rows are predicted faster though they
    move more accumulators; the short tiles' register tiles read 2 rows of B a step, which start
    together (`stream_rounds`). A's rows are reused by the 112 columns: not streamed. A packed
    matmul streams nothing."""
    short = _program(plain_matmul(1, 1001, 2048), [(1, 56, 2), (1, 112, 64), (1, 336, 128)], dev)
    long = _program(plain_matmul(1, 1001, 2048), [(1, 56, 1), (1, 1008, 4), (1, 1008, 2048)], dev)
    assert streamed_inputs(short, dev) == streamed_inputs(long, dev) == (1,)
    assert stream_runs(short, dev) == 9 * 32 * 64 and stream_runs(long, dev) == 1
    busy = min(1.0, short.grid / dev.compute_units)
    latency = dev.layers[-1].latency_ns * 1e-9
    assert stream_rounds(short, dev) == 9 * 32 * 64 / 2 and stream_rounds(long, dev) == 1
    assert stream_seconds(short, dev, busy) == pytest.approx(9 * 32 * 64 / 2 * latency / (dev.compute_units * busy))
    assert estimate(long, dev).predicted_seconds < estimate(short, dev).predicted_seconds
    assert stream_runs(_ragged_k_matmul(), dev) == 0


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_panel_programs_input_read_in_place_once_from_below_starts_its_runs(dev):
    """7 batches of 17 x 3203 x 2560 on the panel path: A is packed, B (230 MB) is read in place,
    once (the register tile spans the 17 rows: `read_once_below`), in unit tiles of 48 K-steps.
    Under 320 columns each unit tile starts 48 runs of 1280 bytes, 7 x 8 x 67 unit tiles; under
    the whole 2560 its 48 rows are one run. The short runs are priced slower (on two Xeon
    Emerald Rapids cores 11.8 against 8.0 ms, where both were priced alike). Runs of A, packed,
    are counted apart (`packed_runs`)."""
    e = fuse_axes(expr("matmul", B=7, M=17, K=3203, N=2560))

    def columns(n):
        return _program(e, [(1, 17, 16, 1), (1, 17, 16, 48), (1, 17, n, 48)], dev)

    narrow, whole = columns(320), columns(2560)
    for p in (narrow, whole):
        assert cpu_plan(p, dev).path == PANELS and cpu_plan(p, dev).packed == ("A",) and streamed_inputs(p, dev) == (1,)
    assert stream_runs(narrow, dev) - packed_runs(narrow, dev) == 48 * 7 * 8 * 67
    assert stream_runs(whole, dev) - packed_runs(whole, dev) == 7 * 67
    assert estimate(whole, dev).predicted_seconds < estimate(narrow, dev).predicted_seconds
    packed_b = _program(plain_matmul(64, 4096, 4096), [(4, 32, 1), (4, 32, 256), (64, 512, 256)], dev)
    assert "B" in cpu_plan(packed_b, dev).packed and 1 not in streamed_inputs(packed_b, dev)
    cached = replace(dev, llc_bytes=1 << 30)  # 230 MB within LLC_FILL of it: B read from the cache, its runs not priced
    assert streamed_inputs(columns(320), cached) == ()


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_rows_less_than_half_a_page_apart_are_one_stream_through_each_page(dev):
    """A one-row matmul reads B in place in runs of its L1 tile's 8 rows. Rows of 1024 floats
    (4 KiB apart) start 8 runs a tile, read together: a round a tile. Rows of 128 floats (512 B
    apart, eight to a page) are one stream through each page they cross: 8 x 512 / 4096 = 1 round
    a tile of 64 columns, which the next tile along the row goes on with
    (`stream_tile`: 128 columns, 8 rows, 1 page)."""
    wide = _program(plain_matmul(1, 1024, 4096), [(1, 16, 8), (1, 64, 8), (1, 512, 8)], dev)
    narrow = _program(plain_matmul(1, 128, 4096), [(1, 16, 8), (1, 64, 8), (1, 128, 8)], dev)
    for p in (wide, narrow):
        assert streamed_inputs(p, dev) == (1,)
    assert stream_tile(wide, 1) == (1, 512, 8) and stream_tile(narrow, 1) == (1, 128, 8)
    assert stream_rounds(wide, dev) == 2 * 512  # 8 rows read together, 2 x 512 unit tiles
    assert stream_rounds(narrow, dev) == 8 * 512 / 4096 * 512


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_l1_tiles_that_continue_each_others_rows_read_them_as_one_run(dev):
    """1x4096x512 in unit tiles of 2048 columns x 8 rows of B: L1 tiles of 64 columns walk the
    unit's columns over the same 8 rows (the loop that steps runs along B's contiguous axis, no
    reduction step between two of them), so the rows run on from one tile into the next: 8 runs
    a unit tile, 2 x 64 unit tiles, as the unit-wide L1 tile reads them (`stream_tile`). Where
    the unit tile holds 64 rows, each L1 tile's 8 rows are followed by the next 8 rows of the
    same columns, not by the next columns: a run a row of every L1 tile."""
    e = plain_matmul(1, 4096, 512)
    narrow = _program(e, [(1, 64, 8), (1, 64, 8), (1, 2048, 8)], dev)
    wide = _program(e, [(1, 64, 8), (1, 2048, 8), (1, 2048, 8)], dev)
    deep = _program(e, [(1, 64, 8), (1, 64, 8), (1, 2048, 64)], dev)
    assert streamed_inputs(narrow, dev) == streamed_inputs(deep, dev) == (1,)
    assert stream_tile(narrow, 1) == (1, 2048, 8) and stream_tile(deep, 1) == (1, 64, 8)
    assert stream_runs(narrow, dev) == stream_runs(wide, dev) == 8 * 2 * 64
    assert stream_rounds(narrow, dev) == stream_rounds(wide, dev) == 2 * 64  # a register tile reads the 8 together
    assert stream_runs(deep, dev) == 8 * 64 * 64
    assert stream_tile(narrow, 0) == (1, 64, 8)  # A's row runs along K, which the tiles do not step


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_rows_a_register_tile_reads_together_start_their_streams_together(dev):
    """reduce-rows (256 x 4096) reads its input in place, each L1 tile's rows a run: 8 x 512
    tiles start 8 runs each, 256 of them, 4 x 1024 tiles 4 runs each, also 256; register tiles of
    8 and 4 rows read their L1 tile's rows together, so both start their runs in 256 rounds of
    one latency and are priced alike, where counting runs would price the first twice the other.
    Register tiles of one row read the 4 rows one after another: 4 rounds a tile. As on the Zen 4
    it was measured on: an AMD core's runs never go on (`FOLLOWED_STREAMS`). On an Intel core
    each L1 tile's next reduction step comes right after it, over the same 8 (4) rows, which the
    prefetchers still follow: a run a row of the unit tile, read 8 (4, 1) rows together."""
    e = fuse_axes(expr("reduce_mean", shape=(256, 4096), axes=(1,)))
    amd, intel = replace(dev, vendor="amd"), replace(dev, vendor="intel")
    eight = _program(e, [(8, 16), (8, 512), (32, 4096)], amd)
    four = _program(e, [(4, 32), (4, 1024), (32, 4096)], amd)
    single = _program(e, [(1, 32), (4, 1024), (32, 4096)], amd)
    assert streamed_inputs(eight, amd) == streamed_inputs(four, amd) == (0,)
    assert stream_runs(eight, amd) == 2 * stream_runs(four, amd) == 2 * 1024
    assert stream_rounds(eight, amd) == stream_rounds(four, amd) == 256
    assert stream_rounds(single, amd) == stream_runs(single, amd) == 1024
    assert estimate(eight, amd).predicted_seconds == pytest.approx(estimate(four, amd).predicted_seconds)
    assert stream_rounds(eight, intel) == 256 // 8 and stream_rounds(four, intel) == 256 // 4
    assert stream_rounds(single, intel) == 256


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_rows_the_prefetchers_still_follow_run_on_at_the_next_reduction_step(dev):
    """gemv 4096 x 4096 in L1 tiles of 8 rows x 1024 columns of A under unit tiles of R rows x
    1024: the core walks the unit's R rows, then comes back to each at the next 1024 columns.
    On an Intel core the prefetchers follow 32 rows (`FOLLOWED_STREAMS`): up to 32 rows each
    row's four pieces are one run, 4096 / 8 rounds of 8 rows; of 64 rows half the runs go on,
    of 256 an eighth. More rows are priced slower (on two Xeon Emerald Rapids cores 16 and 32
    rows ran 956-997 us, 256 rows 1037-1098). On an AMD core every piece starts a run of its
    own, as it did before, whatever R."""
    e = fuse_axes(expr("gemv", M=4096, K=4096))
    intel, amd = replace(dev, vendor="intel"), replace(dev, vendor="amd")
    assert FOLLOWED_STREAMS["intel"] == 32 and "amd" not in FOLLOWED_STREAMS

    def rows(r, device):
        return _program(e, [(8, 16), (8, 1024), (r, 1024)], device)

    pieces, whole = 4096 // 8 * 4, 4096 // 8
    for r in (16, 32, 64, 256):
        assert streamed_inputs(rows(r, amd), amd) == (0,) and stream_rounds(rows(r, amd), amd) == pieces
    assert stream_rounds(rows(16, intel), intel) == stream_rounds(rows(32, intel), intel) == whole
    assert stream_rounds(rows(64, intel), intel) == whole + (pieces - whole) / 2
    assert stream_rounds(rows(256, intel), intel) == whole + (pieces - whole) * 7 / 8
    assert estimate(rows(32, intel), intel).predicted_seconds < estimate(rows(256, intel), intel).predicted_seconds
    spans = _program(e, [(8, 16), (8, 4096), (32, 4096)], intel)  # the L1 tile reads whole rows: nothing to resume
    assert stream_rounds(spans, intel) == whole


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_panels_copied_from_dram_pay_the_bottom_layers_latency_per_run(dev):
    """5 x 3491 x 3681 on a CPU without a last-level cache: reading its 51 MB once from DRAM
    takes longer than computing it (`is_stream_bound`), so the panel copies' reads start a
    stream per run of each packed tile at the pack layer, once per tile of the iteration space
    (`packed_runs`): B's 704 x 144 tiles are 704 runs each, A's 5 x 704 tiles 5, 26 x 5 tiles
    of each; B's 64 x 1856 tiles 64 runs each, 2 x 55 tiles. The long runs are predicted faster
    (measured 5.3 against 12.3 ms on the 2-core Zen 3). A 512-cube matmul is bound by its
    compute: no runs counted."""
    e = plain_matmul(5, 3681, 3491)
    assert is_stream_bound(e, dev) and not is_stream_bound(plain_matmul(512, 512, 512), dev)
    short = _program(e, [(5, 16, 1), (5, 16, 352), (5, 144, 704)], dev)
    wide = _program(e, [(5, 16, 1), (5, 16, 64), (5, 1856, 64)], dev)
    assert set(cpu_plan(short, dev).packed) == set(cpu_plan(wide, dev).packed) == {"A", "B"}
    assert packed_runs(short, dev) == 26 * 5 * (704 + 5) and packed_runs(wide, dev) == 2 * 55 * (64 + 5)
    assert stream_runs(short, dev) == packed_runs(short, dev)  # nothing streamed in place
    assert estimate(wide, dev).predicted_seconds < estimate(short, dev).predicted_seconds
    square = _program(plain_matmul(512, 512, 512), [(6, 16, 1), (6, 16, 128), (174, 256, 128)], dev)
    assert cpu_plan(square, dev).packed and packed_runs(square, dev) == 0


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_split_edge_whose_register_tiles_cut_the_rows_is_priced_as_measured(dev):
    """77 x 300 x 300 as a reduction zeros would change, over a K of 304 (ragged, so no panels:
    `_panel_inputs`), splits its row's edge off (300 columns in unit tiles of 304). Register tiles of 13 rows cut
    the 77 rows (`cut_rows`): such tiles ran 2.5-12.7x the price of their rows' `guarded_edges`,
    where 11 rows, which divide 77, ran at it; their rows' factor is CUT_ROWS_SLOWDOWN."""
    def program(rows, unit):
        e = replace(plain_matmul(77, 300, 300), pads_reduction=False)
        return _program(e, [(rows, 16, 1), (rows, 16, 16), (unit, 304, 304)], dev)

    cut, whole = program(13, 39), program(11, 44)
    for p in (cut, whole):
        plan = cpu_plan(p, dev)
        assert plan.split_edges and plan.packed == () and lane_priced_edge(p, dev)
    assert cut_rows(cut, [0]) and not cut_rows(whole, [0])
    assert guarded_edges(whole, [0]) == pytest.approx(77 / 88)  # 7 whole tiles, unit tiles of 44
    columns = edge_slowdown(whole, dev) / guarded_edges(whole, [0])  # the same 16-column tiles in both
    assert edge_slowdown(cut, dev) == pytest.approx(columns * CUT_ROWS_SLOWDOWN)


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_split_edge_needs_a_loop_below_the_grid_whatever_cuts_the_reduction(dev):
    """A ragged K splits too, at its end: where its register tile is 1 (its loops end where K
    does) and where K's end cuts a register tile of 2 (the cut tile's guard is the same for
    every lane, so its vector row runs under it; it ran scalar behind the guard before). A unit
    tile of one register tile (no loop to split below the parallel grid) keeps the guarded
    scalar row."""
    ragged_k = _one_row(k=1000)
    assert cpu_plan(ragged_k, dev).split_edges
    assert edge_slowdown(ragged_k, dev) == edge_slowdown(_one_row(dev=dev), dev)
    ragged_k2 = _one_row(k=1001, tiles=((1, 56, 2), (1, 112, 64), (1, 112, 1024)))
    assert cpu_plan(ragged_k2, dev).split_edges and not cpu_plan(ragged_k2, dev).guarded_row
    assert cpu_plan(ragged_k2, dev).path == ROW
    one_tile = _one_row(tiles=((1, 56, 1), (1, 56, 64), (1, 56, 1024)))
    assert not cpu_plan(one_tile, dev).split_edges and cpu_plan(one_tile, dev).guarded_row
    assert guard_slowdown(one_tile, dev) == GUARDED_MICRO_KERNEL


@pytest.mark.parametrize("dev", (AVX2, AVX512), ids=lambda d: d.name)
def test_a_reduction_left_scalar_by_its_guard_runs_one_guarded_fma_at_a_time(dev):
    """1 x 3664 x 355 in 1 x 16 register tiles and unit tiles of one register tile along N (no
    loop to split below the grid, and a one-row tile reuses no B: no panels to pad): the guard
    leaves the row scalar (`guarded_row`), and its compute runs one guarded scalar FMA per
    GUARDED_LANE_CYCLES, of the peak's FMA pipes x lanes a cycle, whatever the tile's chains or a
    measured vector micro-kernel of its shape say."""
    e = plain_matmul(1, 355, 3664)
    program = make_program(calculus(e), dev, [(1, 16, 2), (1, 16, 16), (1, 16, 16)], [True, False, False], 0.0)
    assert cpu_plan(program, dev).guarded_row
    lanes = dev.register_bytes // 4
    expected = 1 / (GUARDED_LANE_CYCLES * dev.fma_pipes * lanes)
    assert compute_efficiency(program, dev) == pytest.approx(expected)
    measured = replace(dev, micro_kernels=(MicroKernel("float32", 1, 16, 100.0),))
    assert compute_efficiency(program, measured) == pytest.approx(expected)


def test_a_plan_reads_in_words_and_as_json():
    program = _ragged_matmul()
    plan = plan_for(program, TINY_CPU)
    assert isinstance(plan, CpuPlan)
    assert describe(plan, program).startswith("A, B packed in 6x16 panels, lanes along j, tails padded")
    data = plan.to_dict(program.expr)
    assert data["vector_axis"] == "j" and data["packed"] == ["A", "B"] and data["template"] == "cpu"


@pytest.mark.parametrize("name", ["v100", "a100"])
def test_a_gpu_plan_names_what_the_cuda_templates_stage_and_pipeline(name):
    dev = device(name)
    cand = construct(expr("matmul", M=1024, K=1024, N=1024), dev).candidates[0]
    plan = plan_for(cand.program, dev)
    assert isinstance(plan, GpuPlan) and plan == gpu_plan(cand.program, dev)
    assert plan.staged == (("A", "B") if cand.program.cached[dev.unit_layer_index] else ())
    assert plan.stages in (1, 2) and (plan.pipelined_axis is not None) == plan.pipelined
    assert not plan.register_prefetch or plan.pipelined
    data = plan.to_dict(cand.expr)
    assert data["template"] == "cuda" and data["split"] == cand.program.split
    assert describe(plan, cand.program)


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_only_unguarded_panel_tiles_stored_from_registers_keep_their_accumulators_on_the_stack(dev):
    """`stack_accumulators` (docs/evidence.md#accumulator-scope): 100 x 64 x 64 on 6 x 16
    register tiles over the whole K packs panels and pads its 100 rows, so every tile computes
    unguarded and stores its registers: on the stack. The same over two K-steps accumulates a
    unit tile's buffer (no direct stores); a one-row matmul over a ragged N reads B in place and
    guards its split edge tile (the row path): both `local`."""
    padded = _ragged_matmul()
    plan = cpu_plan(padded, dev)
    assert plan.path == "panels" and plan.padded_tails and plan.direct_stores and plan.stack_accumulators
    assert plan.to_dict(padded.expr)["stack_accumulators"] is True
    assert describe(plan, padded).endswith("accumulators: registers, stack-allocated")
    split_k = cpu_plan(_program(padded.expr, [(6, 16, 1), (6, 16, 32), (102, 64, 64)]), dev)
    assert not split_k.direct_stores and not split_k.stack_accumulators
    one_row = cpu_plan(_one_row(n=4100, dev=dev), dev)
    assert one_row.path == "row" and one_row.split_edges and not one_row.stack_accumulators


@pytest.mark.parametrize("dev", CPUS, ids=lambda d: d.name)
def test_a_row_tile_stored_from_registers_unguarded_along_its_row_keeps_its_accumulators_on_the_stack(dev):
    """`stack_accumulators` on the row path: cpu-core's depthwise conv (96 channels over 112 x 112)
    in register tiles of 2 rows x 112 columns over the whole 3 x 3 window stores its registers,
    its rows whole (the tails along h split off): on the stack, where its unit tiles of 24 and 32
    channels ran 1.41-1.54x faster than in `local` on two Xeon cores
    (docs/evidence.md#accumulator-scope). Over the window's rows in turn (a unit tile's buffer)
    it keeps `local`, as does a row whose edges split off (`one_row` in the test above), and so
    does every row tile on an AMD core, where the rule was not measured."""
    e = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    unit = (1, 24, 58, 112, 3, 3)
    assert dev.vendor == "intel"
    whole = cpu_plan(_program(e, [(1, 1, 2, 112, 3, 3), (1, 1, 2, 112, 3, 3), unit], dev), dev)
    assert whole.path == "row" and whole.direct_stores and not whole.split_edges and whole.stack_accumulators
    amd = replace(dev, vendor="amd")
    assert not cpu_plan(_program(e, [(1, 1, 2, 112, 3, 3), (1, 1, 2, 112, 3, 3), unit], amd), amd).stack_accumulators
    steps = cpu_plan(_program(e, [(1, 1, 2, 112, 1, 3), (1, 1, 2, 112, 1, 3), unit], dev), dev)
    assert steps.path == "row" and not steps.direct_stores and not steps.stack_accumulators


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_plain_template_splits_a_reduction_the_lanes_and_filters_templates_do_not(dev):
    """A split program (`RProgram.split`) is the plain template's only (`splits_reduction`,
    `codegen.cpu._split_k`): the gemv's lanes along K and the conv's filters as lanes run
    loop nests of their own, and a whole reduction in one register tile has one K-step."""
    one_row = _program(plain_matmul(1, 512, 4096), [(1, 16, 16), (1, 64, 16), (1, 512, 256)], dev)
    assert cpu_plan(one_row, dev).path in (PANELS, ROW) and splits_reduction(one_row, dev)
    split = replace(one_row, split=2, grid=2)
    plan = cpu_plan(split, dev)
    assert plan.split == 2 and plan.to_dict(split.expr)["split"] == 2
    assert describe(plan, split).endswith("split-K x2 over the cores, the parts summed on one")
    assert "split-K" not in describe(cpu_plan(one_row, dev), one_row)
    assert "split" not in cpu_plan(one_row, dev).to_dict(one_row.expr)  # as stored before split-K
    gemv = construct(fuse_axes(expr("gemv", M=4096, K=4096)), dev).candidates[0].program
    conv = fuse_axes(expr("conv2d", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, pad=1))
    filters = construct(conv, dev).candidates[0].program
    whole = _program(plain_matmul(64, 64, 32), [(4, 16, 32), (64, 64, 32), (64, 64, 32)], dev)
    assert cpu_plan(whole, dev).direct_stores
    for program in (gemv, filters, whole):
        assert not splits_reduction(program, dev), cpu_plan(program, dev)
    assert splits_reduction(one_row, device("v100"))  # a GPU's splits are `split_counts`'s alone
