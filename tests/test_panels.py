"""The CPU template's panel decisions (`rtile.panels`) and their price in the model, as closed
forms on generated specs: an input is packed where its layout must change, where the unit tile
pads (the padding copy is the panel; but for one that a single register tile reads, read in
place with its ragged edges split off), or where its L1 tile spans more than the L1 in place."""

from dataclasses import replace
from math import prod

import pytest
from helpers import TINY_CPU, device, expr, matmul
from test_alignment import AVX2, AVX512

from workbench.ops.fusion import fuse_axes
from workbench.rtile.model import estimate
from workbench.rtile.model.common import GB, source_layer
from workbench.rtile.model.cpu import (
    buffer_bytes, BUFFER_PASSES, buffer_touch_seconds, core_ghz, PACK_BYTES_PER_CYCLE, packed_bytes, packing_seconds, transfer_seconds,
    TRANSPOSED_BYTES_PER_CYCLE,
)
from workbench.rtile.model.cpu_compute import (
    GRID_GUARDED_TILE, compute_efficiency, guard_slowdown, scalar_row,
)
from workbench.rtile.panels import (
    GRID_CUT_SHARE, PAD_OVERLAP, PAD_STEP, _panel_pays, filter_vector_axis, lane_reduction_axis, pack_layer,
    packed_inputs, packed_tile_bytes,
    pad_level, padded_inputs, pads_tails, ragged, read_once, reads_in_place, transposes, whole_reduction,
    window_spills,
)
from workbench.rtile.plan import ROW, cpu_plan, describe, loop_nest_key, splits_reduction
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus

L1 = TINY_CPU.layers[1].capacity_bytes  # 32 KiB


def _program(e, tiles, dev=TINY_CPU):
    return make_program(calculus(e), dev, tiles, [True] * len(tiles), 0.0)


def _span(rows: int, stride: int, width: int, itemsize: int = 4) -> int:
    """Bytes from the first to the last element of `rows` rows of `width` elements, `stride` apart."""
    return ((rows - 1) * stride + width) * itemsize


def test_a_batched_tile_that_fits_the_l1_in_place_is_not_copied():
    """bmm-attn's shape: B's 64 x 32 L1 tile, rows 128 apart, spans 32,640 B <= 32 KiB, A's 8 x 64
    rows 64 apart 2 KiB: the micro-kernel reads both in place, and the model prices no copy."""
    e = expr("matmul", B=12, M=128, K=64, N=128)
    program = _program(e, [(1, 8, 16, 1), (1, 8, 32, 64), (6, 128, 128, 64)])
    assert _span(64, 128, 32) <= L1 and _span(8, 64, 64) <= L1
    assert packed_inputs(e, program, TINY_CPU) == () and packed_bytes(program, TINY_CPU) == 0
    assert packing_seconds(program, TINY_CPU) == 0.0
    assert "packing into L2" not in dict(estimate(program, TINY_CPU).load_seconds)


def test_a_unit_tile_that_pads_copies_every_input():
    """12 rows leave a tail of 128 (132 = 11 x 12): `_pad_tails` copies every input to whole
    tiles, so both are panels whatever their spans."""
    e = expr("matmul", B=12, M=128, K=64, N=128)
    program = _program(e, [(1, 12, 16, 1), (1, 12, 32, 64), (6, 132, 128, 64)])
    assert packed_inputs(e, program, TINY_CPU) == ("A", "B")


@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_an_input_is_copied_where_its_l1_tile_spans_more_than_the_l1(n, k):
    """matmul, L1 tile 8 x 16 x 64: A's 8 rows K apart span (7 K + 64) x 4 B (14.2 KiB at K =
    512, over 32 KiB from K = 2048); B's 64 rows N apart span (63 N + 16) x 4 B (16 KiB at N =
    64, over 32 KiB from N = 256). The closed form against the rule."""
    e = expr("matmul", M=64, N=n, K=k)
    program = _program(e, [(8, 16, 1), (8, 16, 64), (64, n, 64)])
    a_span, b_span = _span(8, k, 64), _span(64, n, 16)
    expected = tuple(name for name, span in (("A", a_span), ("B", b_span)) if span > L1)
    assert packed_inputs(e, program, TINY_CPU) == expected


@pytest.mark.parametrize("dev", [TINY_CPU, AVX2, AVX512])
def test_an_input_one_register_tile_reads_is_read_in_place_however_wide_its_span(dev):
    """A's 8 rows of 2048 span (7 x 2048 + 64) x 4 B = 57 KiB, more than the 32 KiB L1. Where
    the unit tile's 16 columns are one register tile's (N = 16), each element of its panel would
    be read once, so A is read in place (`panels.read_once`) and the model prices no copy; at N =
    32 two register tiles read each row of the panel, and A is copied as its span asks. B's 64
    rows of 16 or 32 span 4-8 KiB: in place both times."""
    e = expr("matmul", M=64, N=16, K=2048)
    once = _program(e, [(8, 16, 1), (8, 16, 64), (64, 16, 64)], dev)
    a = next(t for t in e.inputs if t.name == "A")
    assert _span(8, 2048, 64) > dev.layers[1].capacity_bytes
    assert read_once(e, once, a) and packed_inputs(e, once, dev) == ()
    assert packing_seconds(once, dev) == 0.0
    wide = expr("matmul", M=64, N=32, K=2048)
    twice = _program(wide, [(8, 16, 1), (8, 16, 64), (64, 32, 64)], dev)
    assert not read_once(wide, twice, a) and packed_inputs(wide, twice, dev) == ("A",)
    assert packing_seconds(twice, dev) > 0.0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_padded_program_reads_in_place_the_input_one_register_tile_reads(dev):
    """1693 x 7853 x 45 in 9 x 48 register tiles under 171 x 48 x 1040 unit tiles: every axis
    is ragged, so the tails pad. B reads N, the vector axis, ragged: its padding copy is its
    panel. One register tile reads each element of A's panel (`read_once`), so A is read in
    place, its ragged rows and K left unpadded (`CpuPlan.edge_axes`), their edge tiles split off
    under their guard: `guard_slowdown` is `guarded_edges` over them on the busiest core, the
    second, whose five unit tiles end in the last of the ten: 153 whole rows, the cut one at
    GRID_GUARDED_TILE, the 17 past the end free on the panels path (K's register tile of 1 cuts
    nothing): 841 of the first core's 855, so the first core's whole rows set the time. The
    model prices B's copy alone. Two register tiles across N read A's panel twice: A is copied,
    nothing left unpadded. Where no input would stay copied (N = 48, B read once as well), both
    are, as before; so in a split program, whose parts' K is its own loop."""
    e = matmul(1693, 45, 7853)
    once = _program(e, [(9, 48, 1), (9, 48, 208), (171, 48, 1040)], dev)
    plan = cpu_plan(once, dev)
    assert plan.padded_tails and plan.packed == ("B",) and plan.edge_axes == (0, 2)
    whole, last = 5 * 171, 4 * 171 + 153 + GRID_GUARDED_TILE
    assert last < whole and guard_slowdown(once, dev) == 1.0
    assert packed_bytes(once, dev) == packed_tile_bytes(once, dev, ("B",), pack_layer(once)) > 0
    twice = _program(e, [(9, 16, 1), (9, 48, 208), (171, 48, 1040)], dev)
    assert cpu_plan(twice, dev).packed == ("A", "B") and cpu_plan(twice, dev).edge_axes == ()
    assert guard_slowdown(twice, dev) == 1.0
    whole = matmul(1693, 48, 7853)
    both = _program(whole, [(9, 48, 1), (9, 48, 208), (9, 48, 1040)], dev)
    a, b = whole.inputs
    assert read_once(whole, both, a) and read_once(whole, both, b)
    assert cpu_plan(both, dev).packed == ("A", "B") and cpu_plan(both, dev).edge_axes == ()
    assert cpu_plan(replace(once, split=2), dev).packed == ("A", "B")


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_few_row_program_that_pads_only_for_its_tails_may_read_in_place(dev):
    """5 x 1536 x 1521 in 5 x 32 register tiles under 5 x 1536 x 192 unit tiles: N's tail pads, so
    both inputs are copied, though no panel gains more: one register tile reads B's (`read_once`)
    and A's L1 tile, 5 rows 6 KiB apart, spans (4 x 1536 + 32) x 4 B < 32 KiB. Its variant that
    reads them in place (`RProgram.in_place`) copies nothing and splits the row's edge off, the
    interior unguarded; over a ragged K as well, but then on one core (`splits_reduction`: K's
    edge would stay guarded under split-K's parts). Not where two register tiles read B's
    panel, whose 32 rows 6 KiB apart span more than the L1, nor where the unit tile is one
    register tile along the row (no loop to split below the grid; A, read once, is read in
    place there already)."""
    e = matmul(5, 1521, 1536)
    tiles = [(5, 32, 1), (5, 64, 32), (5, 1536, 192)]
    padded = _program(e, tiles, dev)
    plan = cpu_plan(padded, dev)
    assert plan.packed == ("A", "B") and plan.padded_tails and not plan.split_edges
    assert _span(5, 1536, 32) < 32 * 1024 and reads_in_place(e, padded, dev)
    variant = replace(padded, in_place=True)
    plan = cpu_plan(variant, dev)
    assert plan.path == ROW and plan.split_edges and plan.packed == () and not plan.padded_tails
    assert describe(plan, variant).startswith("inputs read in place, not padded, lanes along j, edge tiles split off")
    assert packing_seconds(variant, dev) == 0.0 < packing_seconds(padded, dev)
    ragged_k = _program(matmul(5, 1521, 1537), tiles, dev)
    assert reads_in_place(ragged_k.expr, ragged_k, dev) and splits_reduction(padded, dev)
    assert splits_reduction(variant, dev) and not splits_reduction(replace(ragged_k, in_place=True), dev)
    twice = _program(matmul(10, 1521, 1536), [(5, 32, 1), (10, 64, 32), (10, 1536, 192)], dev)
    assert _span(32, 1521, 64) > 32 * 1024 and not reads_in_place(twice.expr, twice, dev)
    narrow = _program(e, [(5, 32, 1), (5, 32, 32), (5, 32, 192)], dev)
    assert cpu_plan(narrow, dev).packed == ("B",) and not reads_in_place(e, narrow, dev)
    whole = matmul(5, 1536, 1536)
    assert not reads_in_place(whole, _program(whole, tiles, dev), dev)  # nothing pads


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_an_input_whose_cut_tile_the_grid_would_guard_is_copied_with_its_padding(dev):
    """31 x 797 x 23 in 8 x 32 register tiles, one across N: A is read once. Under 16-row unit
    tiles the grid splits the rows in two and the second's last register tile is cut (31 = 3 x 8
    + 7): one in four of the rows' register tiles, past GRID_CUT_SHARE, so A is copied, padded.
    Under one unit tile of all 32 rows the guard is the same on every core and A is read in
    place; so where the register tiles divide the rows (8 x 32 over 32 rows in units of 16)."""
    e = matmul(31, 23, 797)
    split = _program(e, [(8, 32, 1), (8, 32, 160), (16, 32, 800)], dev)
    assert 1 / 4 > GRID_CUT_SHARE and packed_inputs(e, split, dev) == ("A", "B")
    assert cpu_plan(split, dev).edge_axes == ()
    one = _program(e, [(8, 32, 1), (8, 32, 160), (32, 32, 800)], dev)
    assert packed_inputs(e, one, dev) == ("B",) and cpu_plan(one, dev).edge_axes == (0, 2)
    even = matmul(32, 23, 797)
    assert packed_inputs(even, _program(even, [(8, 32, 1), (8, 32, 160), (16, 32, 800)], dev), dev) == ("B",)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_an_axis_another_panel_splits_into_register_tiles_is_padded_for_both(dev):
    """2 x 395 x 1973 in 2 x 144 x 9 register tiles (K-unrolled): B's panel splits K into runs of
    9 (`codegen/cpu._panel_layout`), so K is padded for it, and A, which reads K, is copied with
    its padding though one register tile reads it; with a K step of 1 (or a K that the unit
    tile divides) A is read in place."""
    e = matmul(2, 1973, 395)
    unrolled = _program(e, [(2, 144, 9), (2, 144, 396), (2, 144, 396)], dev)
    assert packed_inputs(e, unrolled, dev) == ("A", "B") and cpu_plan(unrolled, dev).edge_axes == ()
    single = _program(e, [(2, 144, 1), (2, 144, 396), (2, 144, 396)], dev)
    assert packed_inputs(e, single, dev) == ("B",) and cpu_plan(single, dev).edge_axes == (2,)
    whole = matmul(2, 1973, 396)
    assert packed_inputs(whole, _program(whole, [(2, 144, 9), (2, 144, 396), (2, 144, 396)], dev), dev) == ("B",)


def test_an_input_read_across_the_vector_axis_is_always_copied():
    """A transposed B (out[i, j] = sum_k A[i, k] B[j, k]): j runs along B's rows, so the vector
    loop needs B laid out again, however small its span."""
    e = expr("matmul", M=64, N=64, K=64, trans_b=True)
    program = _program(e, [(4, 16, 1), (8, 16, 64), (64, 64, 64)])
    b = next(t for t in e.inputs if t.name == "B")
    assert _span(16, 64, 64) <= L1 and _panel_pays(e, program, TINY_CPU, b)


def test_the_copies_run_at_four_elements_per_cycle_where_the_bandwidth_would_allow_more():
    """With FMA facts the spec implies a clock (peak / (cores x pipes x lanes x 2)); the copies
    take packed_bytes / (PACK_BYTES_PER_CYCLE (16 B) x clock), or the pack layer's bandwidth
    share where that is slower, and the touches of their buffer (the operator's 1.5 MiB a core
    pushes it out of L2: `buffer_touch_seconds`, closed form in test_model)."""
    e = expr("matmul", M=512, N=512, K=512)
    program = _program(e, [(4, 16, 1), (8, 16, 64), (64, 512, 64)])
    moved = packed_bytes(program, TINY_CPU)
    layer = TINY_CPU.layers[pack_layer(program)]
    streamed = moved / (layer.bandwidth_gbps * GB / TINY_CPU.compute_units)
    touch = buffer_touch_seconds(program, TINY_CPU)
    assert moved > 0 and touch > 0 and core_ghz(TINY_CPU) == 0.0
    assert packing_seconds(program, TINY_CPU) == pytest.approx(streamed + touch, rel=1e-12)
    timed = replace(TINY_CPU, fma_latency_cycles=4, fma_pipes=2)
    ghz = 200.0 / (2 * 2 * 16 * 2)
    assert core_ghz(timed) == pytest.approx(ghz, rel=1e-12)
    copying = max(streamed, moved / (PACK_BYTES_PER_CYCLE * ghz * GB))
    assert packing_seconds(program, timed) == pytest.approx(copying + buffer_touch_seconds(program, timed), rel=1e-12)
    assert copying > streamed
    assert packed_bytes(program, timed, transposed=True) == 0  # B's strips end along its rows


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_transposing_copy_runs_at_its_own_bytes_per_cycle(dev):
    """A conv's filters [f, c, r, s] copied into vectors of filters (`transposes`: laid out along
    f, innermost s) move at TRANSPOSED_BYTES_PER_CYCLE, the matmul's B [k, j] into strips
    along j (innermost j) at PACK_BYTES_PER_CYCLE; the rows of A keep their layout and never
    transpose. A conv whose pixel tiles copy the filters again each time pays each copy."""
    lanes = dev.warp_size
    conv = expr("conv2d", N=1, C=16, H=8, W=8, F=4 * lanes, KH=3, KW=3, stride=1, pad=1)
    kernel = next(t for t in conv.inputs if t.name == "kernel")
    f = conv.axis_index("f")
    assert transposes(kernel, f) and not transposes(conv.inputs[0], f)
    mm = expr("matmul", M=64, N=64, K=64)
    assert not transposes(next(t for t in mm.inputs if t.name == "B"), 1)
    assert not transposes(next(t for t in mm.inputs if t.name == "A"), 1)
    ghz = core_ghz(dev)
    once = [(1, 2 * lanes, 1, 2, 1, 1, 1), (1, 2 * lanes, 2, 8, 16, 3, 3), (1, 4 * lanes, 8, 8, 16, 3, 3)]
    again = [(1, 2 * lanes, 1, 2, 1, 1, 1), (1, 2 * lanes, 2, 8, 16, 3, 3), (1, 4 * lanes, 2, 8, 16, 3, 3)]
    for tiles, grid in ((once, 1), (again, 4)):  # unit tiles of 2 of the 8 rows: the filters copied per row pair
        program = _program(conv, tiles, dev)
        moved = packed_bytes(program, dev)
        # every filter (4 x lanes of 16 x 3 x 3) once per unit tile the busiest of the 2 cores runs
        assert program.grid == grid and moved == packed_bytes(program, dev, transposed=True) == (
            -(-grid // dev.compute_units) * 4 * lanes * 16 * 9 * 4)
        layer = dev.layers[pack_layer(program)]
        streamed = moved / (layer.bandwidth_gbps * GB / dev.compute_units)
        assert packing_seconds(program, dev) == pytest.approx(
            max(streamed, moved / (TRANSPOSED_BYTES_PER_CYCLE * ghz * GB)), rel=1e-12)


@pytest.mark.parametrize("k_tile", [64, 32, 16])
def test_a_register_tile_over_the_whole_reduction_stores_straight_to_the_output(k_tile):
    """bmm-attn's shape with 8 x 16 registers: an L1 tile of the whole K (64) runs each register
    tile's K-loop to its end, so the accumulators go straight to C and the model prices no
    buffer; a K tile of 32 or 16 accumulates into the unit tile's buffer: BUFFER_PASSES over the
    output of every unit tile (6 x 128 x 128 fp32, 2 tiles), which `estimate` adds to the
    buffer's layer (test_model's invariants)."""
    e = expr("matmul", B=12, M=128, K=64, N=128)
    program = _program(e, [(1, 8, 16, 1), (1, 8, 32, k_tile), (6, 128, 128, 64)])
    direct = k_tile == 64
    assert whole_reduction(e, program) is direct and cpu_plan(program, TINY_CPU).direct_stores is direct
    assert buffer_bytes(program, TINY_CPU) == (0 if direct else BUFFER_PASSES * 6 * 128 * 128 * 4 * 2)


def test_templates_that_always_buffer_store_nothing_directly():
    """A convolution along its filters transposes its accumulators on the way out: it goes
    through a buffer whatever the L1 tile's K. A reduction along its K sums lanes: through the
    unit tile's buffer where the L1 tile cuts K, or where it is not a multiply-add a point (a
    row sum); a gemv whose L1 tile spans K sums each register tile's lanes and stores them
    directly. So does a micro-kernel without a vector axis (a register row narrower than a
    vector) go through a buffer."""
    conv = expr("conv2d", N=1, C=16, H=8, W=8, F=32, KH=3, KW=3, stride=1, pad=1)
    program = _program(conv, [(1, 16, 1, 2, 1, 1, 1), (1, 16, 2, 8, 16, 3, 3), (1, 32, 8, 8, 16, 3, 3)])
    assert filter_vector_axis(conv, program, TINY_CPU) is not None and whole_reduction(conv, program)
    assert not cpu_plan(program, TINY_CPU).direct_stores and buffer_bytes(program, TINY_CPU) > 0
    gemv = expr("gemv", M=64, K=256)
    for l1_k, direct in ((128, False), (256, True)):
        program = _program(gemv, [(1, 16), (4, l1_k), (64, 256)])
        assert lane_reduction_axis(gemv, program, TINY_CPU) is not None
        assert cpu_plan(program, TINY_CPU).direct_stores == direct
        assert (buffer_bytes(program, TINY_CPU) == 0) == direct
    rows = expr("reduce_sum", shape=(64, 256), axes=(1,))
    program = _program(rows, [(1, 16), (4, 256), (64, 256)])
    assert lane_reduction_axis(rows, program, TINY_CPU) is not None and whole_reduction(rows, program)
    assert not cpu_plan(program, TINY_CPU).direct_stores
    narrow = expr("matmul", M=64, N=64, K=64)
    program = _program(narrow, [(4, 2, 1), (8, 8, 64), (64, 64, 64)])
    assert whole_reduction(narrow, program) and not cpu_plan(program, TINY_CPU).direct_stores


def test_a_padding_copy_is_made_per_l1_tile_where_those_tiles_do_not_overlap():
    """avgpool-3x3 (stride 2, axes nc h w r s): L1 tiles of 1 channel x 19 x 56 outputs read
    39 x 113 of the padded input each, 48 of them 211,536 elements against the unit tile's
    16 x 114 x 113 = 206,112 (its 115 rows clipped to the tensor's 114; 2.6% more): copied per
    L1 tile. dwconv-3x3 (stride 1): 2-row
    tiles read 4 rows, 560 of them 255,360 elements against 20 x 58 x 114 = 132,240 (1.9x):
    copied per unit tile. A program without padding, or with a single cache tile, has nothing
    to move."""
    pool = fuse_axes(expr("avgpool", N=1, C=64, H=112, W=112, K=3, stride=2, pad=1))
    assert padded_inputs(pool) == (pool.inputs[0].name,)
    program = _program(pool, [(1, 1, 8, 1, 3), (1, 19, 56, 3, 3), (16, 57, 56, 3, 3)])
    calc = calculus(pool)
    assert prod(calc.data_tiles((1, 19, 56, 3, 3))[0]) == 39 * 113
    assert prod(calc.data_tiles((16, 57, 56, 3, 3))[0]) == 16 * 114 * 113
    assert 48 * 39 * 113 <= PAD_OVERLAP * 16 * 114 * 113 and pad_level(pool, program, TINY_CPU) == 1
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    program = _program(dw, [(1, 1, 2, 16, 3, 3), (1, 1, 2, 112, 3, 3), (1, 20, 56, 112, 3, 3)])
    assert prod(calculus(dw).data_tiles((1, 1, 2, 112, 3, 3))[0]) == 4 * 114
    assert 560 * 4 * 114 > PAD_OVERLAP * 20 * 58 * 114 and pad_level(dw, program, TINY_CPU) == 0
    assert pad_level(dw, _program(dw, [(1, 1, 2, 16, 3, 3), (1, 20, 56, 112, 3, 3)]), TINY_CPU) == 0
    relu = fuse_axes(expr("relu", shape=(4, 8, 6)))  # read as one fused axis: reshaped, not padded
    assert relu.inputs[0].shape != relu.args[0].shape and padded_inputs(relu) == ()
    mm = expr("matmul", M=64, K=64, N=64)
    assert padded_inputs(mm) == () and pad_level(mm, _program(mm, [(4, 16, 1), (16, 32, 64), (64, 64, 64)]), TINY_CPU) == 0


def test_a_padding_window_that_spills_is_copied_per_reduction_step():
    """A 3-image, 501-channel 79 x 79 conv (stride 2, pad 1) in unit tiles of 20 x 40 outputs
    and 3 channels a step: one unit tile's window over all its 167 steps is 3 x 501 x 41 x 81
    floats, 19,965,852 B, on each of 2 cores 39.9 MB, over 60 % of a 32 MiB last-level cache
    (19.3 MB): the copy would go to DRAM and come back, so it is made per reduction step;
    within 60 % of a 64 MiB one (40.3 MB) it stays per unit tile, as where a spec gives no
    last-level cache and one unit tile's window fits the unit tile's layer (two L2s of 1 MiB
    against 2 x 5 x 41 x 81 x 4 B). A unit tile of the whole reduction takes one step: nothing
    to split. Its L1 tiles, each 3 x 3 x 11 x 3 of a step's 3 x 3 x 41 x 81, 160 of them, overlap
    1.59x: no copy per L1 tile."""
    conv = expr("conv2d", N=3, C=501, H=79, W=79, F=16, KH=3, KW=3, stride=2, pad=1)
    tiles = [(3, 16, 5, 1, 1, 3, 1), (3, 16, 5, 1, 3, 3, 3), (3, 16, 20, 40, 3, 3, 3)]
    program = _program(conv, tiles)
    assert program.grid == 2
    assert prod(calculus(conv).data_tiles((3, 16, 20, 40, 501, 3, 3))[0]) * 4 == 3 * 501 * 41 * 81 * 4 == 19_965_852
    assert 160 * 3 * 3 * 11 * 3 > PAD_OVERLAP * 3 * 3 * 41 * 81
    l3 = replace(TINY_CPU, llc_bytes=32 * 2**20, llc_gbps=100.0)
    assert 2 * 19_965_852 > 0.6 * 32 * 2**20 and window_spills(conv, program, l3)
    assert pad_level(conv, program, l3) == PAD_STEP and cpu_plan(program, l3).pad_level == PAD_STEP
    big = replace(l3, llc_bytes=64 * 2**20)
    assert 2 * 19_965_852 <= 0.6 * 64 * 2**20 and not window_spills(conv, program, big)
    assert pad_level(conv, program, big) == 0
    assert window_spills(conv, program, TINY_CPU)  # no last-level cache: 20 MB against a 1 MiB L2
    small = expr("conv2d", N=2, C=5, H=79, W=79, F=16, KH=3, KW=3, stride=2, pad=1)
    assert not window_spills(small, _program(small, [(2, 16, 5, 1, 1, 3, 1), (2, 16, 5, 1, 1, 3, 3),
                                                     (2, 16, 20, 40, 1, 3, 3)]), TINY_CPU)
    whole = _program(conv, [(3, 16, 5, 1, 1, 3, 1), (3, 16, 5, 1, 3, 3, 3), (3, 16, 20, 40, 501, 3, 3)])
    assert not window_spills(conv, whole, l3)


def test_an_l1_tile_of_one_register_tile_is_one_loop_nest_whatever_its_k():
    """matmul 64 x 32 x 256, 4 x 16 registers: L1 tiles of the same 4 x 16 outputs and K of 1,
    8, 32 or 128 only split the register tile's K-loop (`codegen/cpu._loop_order`), so they
    share a key; an L1 tile of two register tiles, one of the whole K (direct stores) and a GPU's
    tiles keep theirs. The key keeps the packed inputs: N = 1024 puts B's 8-row L1 tile within
    32 KiB ((7 x 1024 + 16) x 4 B) and its 16-row one beyond it, so only the second packs B."""
    e = expr("matmul", M=64, N=32, K=256)
    unit = (32, 32, 128)
    keys = {k1: loop_nest_key(_program(e, [(4, 16, 1), (4, 16, k1), unit]), TINY_CPU) for k1 in (1, 8, 32, 128)}
    assert len(set(keys.values())) == 1
    assert keys[1][1] == (4, 16, None) and keys[1][::2] == ((4, 16, 1), unit)
    two = _program(e, [(4, 16, 1), (8, 16, 8), unit])
    assert loop_nest_key(two, TINY_CPU) == two.tiles
    whole, part = (_program(e, [(4, 16, 1), (4, 16, k1), (32, 32, 256)]) for k1 in (256, 128))
    assert whole_reduction(e, whole) and loop_nest_key(whole, TINY_CPU) == whole.tiles
    assert loop_nest_key(part, TINY_CPU) != loop_nest_key(whole, TINY_CPU)
    gpu = _program(e, [(4, 16, 1), (4, 16, 8), unit], device("v100"))
    assert loop_nest_key(gpu, device("v100")) == gpu.tiles
    wide = expr("matmul", M=64, N=1024, K=256)
    narrow_span, wide_span = (_program(wide, [(4, 16, 1), (4, 16, k1), (32, 64, 128)]) for k1 in (8, 16))
    assert _span(8, 1024, 16) <= L1 < _span(16, 1024, 16)
    assert "B" not in packed_inputs(wide, narrow_span, TINY_CPU) and "B" in packed_inputs(wide, wide_span, TINY_CPU)
    assert loop_nest_key(narrow_span, TINY_CPU) != loop_nest_key(wide_span, TINY_CPU)


@pytest.mark.parametrize("dev", [TINY_CPU, AVX2, AVX512])
def test_a_guarded_tail_leaves_the_row_scalar_where_nothing_pads_it(dev):
    """relu over 192 elements (its three axes fused into one): a 128-element unit tile of one
    register tile leaves a tail of 64 and no loop below the grid to split at the end
    (`splits_edges`), so the guard sits in the vector loop (the row runs scalar); 192 divides;
    128-element unit tiles of smaller register tiles split the edge off. A matmul whose unit
    tile leaves a tail along its vector axis N is padded to whole tiles (`pads_tails`), so its
    row stays vectorised."""
    relu = fuse_axes(expr("relu", shape=(4, 8, 6)))
    lanes = dev.warp_size  # float32 lanes
    tail = _program(relu, [(128,), (128,), (128,)], dev)
    whole = _program(relu, [(lanes,), (64,), (192,)], dev)
    assert ragged(relu, tail, 0) and cpu_plan(tail, dev).guarded_row and scalar_row(tail, dev)
    split = _program(relu, [(lanes,), (32,), (128,)], dev)
    assert cpu_plan(split, dev).split_edges and not cpu_plan(split, dev).guarded_row and not scalar_row(split, dev)
    assert not ragged(relu, whole, 0) and not cpu_plan(whole, dev).guarded_row
    mm = expr("matmul", M=64, N=96, K=64)
    padded = _program(mm, [(4, lanes, 1), (8, 32, 64), (64, 64, 64)], dev)
    assert ragged(mm, padded, 1) and pads_tails(mm, padded, packed_inputs(mm, padded, dev))
    assert not cpu_plan(padded, dev).guarded_row
    assert not scalar_row(_program(relu, [(32,), (128,)], device("v100")), device("v100"))


@pytest.mark.parametrize("dev", [AVX2, AVX512])
def test_a_ragged_matmul_staging_nothing_below_the_registers_is_padded_all_the_same(dev):
    """17 x 1259 x 29 (three primes), as Roller built it where its start tile covers the rows and
    columns in two register tiles each (no reuse to grow for: nothing staged below the
    registers): unit tiles of one register tile along N leave no loop to split the tail at, and
    left unpadded the row ran scalar behind the guard (147 us on two Zen 5 cores, numpy 14). The
    unit tile still reuses both inputs, so the padding copy is the panel and the row runs
    vectorised (9-11 us); A is copied though one register tile reads it, since B's panel splits
    K into the register tile's 2-step runs and K is padded for it (`panels._read_in_place`).
    Where the tail can be split off instead (unit tiles of several
    register tiles along N) the inputs stay in place: two rows over a long K would copy all of B
    for them (2 x 8527 x 1297: 0.64 ms split, 1.47 padded). A one-row tile reuses no B and stays
    unpadded."""
    lanes = dev.warp_size
    mm = expr("matmul", M=17, N=29, K=1259)
    tiles = [(9, lanes, 2), (9, lanes, 256), (18, lanes, 1280)]
    unstaged = make_program(calculus(mm), dev, tiles, [True, False, False], 0.2)
    assert packed_inputs(mm, unstaged, dev) == ("A", "B") and pads_tails(mm, unstaged, ("A", "B"))
    plan = cpu_plan(unstaged, dev)
    assert plan.padded_tails and plan.vector_axis == 1 and not plan.guarded_row and not scalar_row(unstaged, dev)
    assert plan.edge_axes == ()
    two = expr("matmul", M=2, N=97, K=1259)
    split = make_program(calculus(two), dev, [(2, lanes, 2), (2, 4 * lanes, 256), (2, 4 * lanes, 1280)],
                         [True, False, False], 0.2)
    assert packed_inputs(two, split, dev) == () and cpu_plan(split, dev).split_edges
    row = expr("matmul", M=1, N=29, K=1259)
    one = make_program(calculus(row), dev, [(1, lanes, 2), (1, lanes, 256), (1, lanes, 1280)], [True, False, False], 0.2)
    assert packed_inputs(row, one, dev) == ()


@pytest.mark.parametrize("dev", [TINY_CPU, AVX2, AVX512])
def test_a_scalar_row_fills_one_lane_and_reads_l1_one_element_a_load(dev):
    """The model's price of a guarded row: compute at one lane of the register's float32 lanes
    (relu has no reduction: no latency or load term), and its register reads from L1 `lanes`
    times as long as vector loads at the layer's bandwidth; a dividing row pays neither."""
    relu = fuse_axes(expr("relu", shape=(4, 8, 6)))
    lanes = dev.register_bytes // 4
    tail = _program(relu, [(128,), (128,), (128,)], dev)  # one register tile a unit tile: no edge to split off
    whole = _program(relu, [(dev.warp_size,), (64,), (192,)], dev)
    assert compute_efficiency(tail, dev) == pytest.approx(1 / lanes, rel=1e-12)
    assert compute_efficiency(whole, dev) == pytest.approx(1.0, rel=1e-12)
    for program, factor in ((tail, lanes), (whole, 1)):
        bandwidth = dev.layers[source_layer(program, 0, len(dev.layers))].bandwidth_gbps * GB
        scalar = scalar_row(program, dev)
        assert transfer_seconds(program, dev, 0, 4096, scalar) == pytest.approx(4096 * factor / bandwidth, rel=1e-12)
    # `estimate` passes it: the tail's reads from L1 take `lanes` times their bytes' time (over
    # the busy cores' share, `busy`), the dividing row's do not
    for program, factor in ((tail, lanes), (whole, 1)):
        e = estimate(program, dev)
        busy = min(1.0, program.grid / dev.compute_units)
        bandwidth = dev.layers[1].bandwidth_gbps * GB
        expected = dict(e.bytes_per_layer)["L1"] * factor / bandwidth / busy
        assert dict(e.load_seconds)["L1"] == pytest.approx(expected, rel=1e-9)
    assert "a guarded tail leaves the row scalar" in " ".join(estimate(tail, dev).modelled)


def test_a_row_pass_runs_in_vectors_a_ragged_tail_apart_and_a_reduction_pays_its_lanes_sum():
    from workbench.rtile.panels import RowVector, row_vector

    assert row_vector(1000, 8) == RowVector(8, 125)
    assert row_vector(1000, 8, reduction=True) == RowVector(8, 125 + 8)  # then 8 scalar adds a row
    assert row_vector(1000, 16, reduction=True) == RowVector(8, 125 + 8)  # 1000 = 125 x 8, not 16s
    assert row_vector(50257, 8) == RowVector(8, 6282 + 1)  # ragged: whole vectors, then 1 element
    assert row_vector(50257, 8, reduction=True) == RowVector(8, 6282 + 8 + 8)  # the last vector lane by lane
    assert row_vector(7, 8) == RowVector(7, 1)  # one register
    assert row_vector(8, 8, reduction=True) == RowVector(1, 8)  # one vector, then 8 adds: no gain
    assert row_vector(12, 8, reduction=True) == RowVector(4, 3 + 4)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_weight_read_in_panels_is_laid_out_once_and_copied_by_no_call(dev):
    """An input whose value is fixed before the first call (`TensorExpr.constants`, a model's
    weight) is laid out ahead in register-tile strips (`prepacked_inputs`): the conv's filters,
    the matmul's B or A or both. The copy priced per call is then the other inputs' alone: the
    conv copies nothing, the matmul the panels of its input that is no weight. Filters ragged in
    the unit tile would need padding laid out, and an expression without constants copies all
    as before."""
    lanes = dev.warp_size
    conv = expr("conv2d", N=1, C=16, H=8, W=8, F=4 * lanes, KH=3, KW=3, stride=1, pad=1)
    tiles = [(1, 2 * lanes, 1, 2, 1, 1, 1), (1, 2 * lanes, 2, 8, 16, 3, 3), (1, 4 * lanes, 8, 8, 16, 3, 3)]
    plain, weights = _program(conv, tiles, dev), _program(replace(conv, constants=("kernel",)), tiles, dev)
    assert cpu_plan(plain, dev).packed == cpu_plan(weights, dev).packed == ("kernel",)
    assert cpu_plan(plain, dev).prepacked == () and cpu_plan(weights, dev).prepacked == ("kernel",)
    assert packed_bytes(plain, dev) > 0 and packed_bytes(weights, dev) == 0
    assert estimate(weights, dev).predicted_seconds < estimate(plain, dev).predicted_seconds
    odd = replace(expr("conv2d", N=1, C=16, H=8, W=8, F=3 * lanes, KH=3, KW=3, stride=1, pad=1), constants=("kernel",))
    program = _program(odd, [(1, 2 * lanes, 1, 2, 1, 1, 1), (1, 2 * lanes, 2, 8, 16, 3, 3), (1, 2 * lanes, 8, 8, 16, 3, 3)], dev)
    assert cpu_plan(program, dev).packed == ("kernel",) and cpu_plan(program, dev).padded_filters
    assert cpu_plan(program, dev).prepacked == () and packed_bytes(program, dev) > 0

    mm = expr("matmul", M=288, K=2048, N=256)  # A's L1 tile spans 6 rows 8 KiB apart: packed too
    tiles = [(6, 2 * lanes, 1), (6, 4 * lanes, 256), (96, 256, 512)]
    for constants, ahead in ((("B",), ("B",)), (("A",), ("A",)), (("A", "B"), ("A", "B"))):
        program = _program(replace(mm, constants=constants), tiles, dev)
        plan = cpu_plan(program, dev)
        assert plan.packed == ("A", "B") and plan.prepacked == ahead
        copied = tuple(name for name in plan.packed if name not in ahead)
        assert packed_bytes(program, dev) == (packed_tile_bytes(program, dev, copied, plan.pack_layer) if copied else 0)
