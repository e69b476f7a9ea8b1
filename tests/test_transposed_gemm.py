"""A GEMM whose B is stored transposed, as the GEMM over a copy of B laid along the output's rows
(`ops.transposed_gemm`): the view, which operators have one, its price against the nest (the copy
and the nest's sums across lanes, closed forms on generated specs), the kernel over the caller's
buffers, and the construction's choice between the two."""

import re
from dataclasses import replace
from math import prod

import pytest
from test_alignment import AVX2, AVX512

from tests.helpers import built_view_kernels, device
from workbench.codegen.build import build_kernel
from workbench.codegen.verify import verify
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper, ViewChoice, construct, construction_view
from workbench.hardware.registers import register_budget
from workbench.ops.gemm_view import view_alternative
from workbench.ops.tensor_expr import from_prim_func
from workbench.ops.transposed_gemm import copied_bytes, transposed_gemm
from workbench.rtile.model.common import layer_gbps
from workbench.rtile.model.cpu import (
    LANE_ADDS_PER_CYCLE, LANE_SUM_CYCLES, PACK_BYTES_PER_CYCLE, ROW_BLOCKS_BYTES_PER_CYCLE,
    ROWS_DOWN_STRIPS_BYTES_PER_CYCLE, TRANSPOSE_BYTES_PER_CYCLE,
    TRANSPOSE_DRAM_SLOWDOWN, buffer_touch_seconds, clock_ghz, core_ghz, lane_sum_seconds, packed_bytes, packing_seconds, price,
    transpose_seconds,
)
from workbench.rtile.panels import packed_tile_bytes, row_block_width
from workbench.rtile.plan import LANES, PANELS, cpu_plan, describe
from workbench.rtile.registers import micro_kernel_registers
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus
from workbench.workload import Workload


def _matmul(m, k, n, b=0, **flags):
    params = {"M": m, "K": k, "N": n, "B": b, **flags}
    return Workload(op="matmul", params=tuple(params.items())).build()


def _rows_copy_seconds(program, dev, panels: int, rate: float) -> float:
    """The closed form of the panel copies where `panels` of their bytes are B's rows copied
    down its strips at `rate` bytes a cycle and the rest a plain copy's: the slower of those
    cycles on one core and the whole copy at the core's share of the pack layer's bandwidth, and
    the touches of the buffer they are copied into (closed form in test_model)."""
    moved = packed_bytes(program, dev)
    cycles = (moved - panels) / PACK_BYTES_PER_CYCLE + panels / rate
    layer = dev.layers[cpu_plan(program, dev).pack_layer]
    streamed = moved / (layer.bandwidth_gbps * 1e9 / dev.compute_units)
    return max(streamed, cycles / (core_ghz(dev) * 1e9)) + buffer_touch_seconds(program, dev)


@pytest.mark.parametrize("b", [0, 3])
def test_b_stored_transposed_is_read_as_its_copy_laid_along_the_rows(b):
    e = _matmul(45, 67, 29, b, trans_b=True)
    view = transposed_gemm(e)
    lead = (b,) if b else ()
    # the axes and the flops stay; B is read as [.., K, N], the caller still passes [.., N, K]
    assert view.axes == e.axes and view.flops == e.flops and view.transposed == ("B",)
    assert [t.shape for t in view.tensors] == [lead + (45, 67), lead + (67, 29), lead + (45, 29)]
    assert view.args == e.args and e.args[1].shape == lead + (29, 67)
    # the PrimFunc it carries reads the copy, whose TVM-read expression is the view's
    read = from_prim_func(view.func, e.op, dict(e.params), e.dtype, n_inputs=2)
    assert read.axes == view.axes
    assert [t.shape for t in read.tensors] == [t.shape for t in view.tensors]
    assert "B_reindex" in view.func.script()


@pytest.mark.parametrize("m,k,n,flags", [
    (45, 67, 29, {}),  # B streams along the row already
    (45, 67, 29, {"trans_a": True}),  # A ignores the row: broadcast, nothing to copy
    (1, 67, 29, {"trans_b": True}),  # B read once: a copy only adds its traffic (gemv's template)
])
def test_other_matmuls_have_no_such_view(m, k, n, flags):
    assert transposed_gemm(_matmul(m, k, n, **flags)) is None


def test_gemv_and_convs_have_no_such_view():
    gemv = Workload(op="gemv", params=(("M", 64), ("K", 96))).build()
    conv = Workload(op="conv2d", params=tuple({"N": 1, "C": 8, "H": 9, "W": 9, "F": 16, "KH": 3, "KW": 3,
                                               "stride": 1, "pad": 1}.items())).build()
    assert transposed_gemm(gemv) is None and transposed_gemm(conv) is None


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_copy_is_priced_per_byte_on_every_core_or_at_the_bottom_layers_bandwidth(dev):
    """B read once and its copy written once, 2 N K x 4 bytes, at TRANSPOSE_BYTES_PER_CYCLE on
    every core, or streamed at the bottom layer's rate where that is slower; added before the
    loop nest as a gather is (the slot `tests/test_pixel_gemm.py` reads). 1000 rows are dealt
    over unit tiles, each copying B's panels from the copy."""
    view = transposed_gemm(_matmul(1000, 200, 300, 4, trans_b=True))
    moved = 2 * 4 * 200 * 300 * 4
    assert copied_bytes(view) == moved
    program = construct(view, dev, options=Options(topk=1)).candidates[0].program
    assert not cpu_plan(program, dev).transposed_in_panels
    cycles = moved / (TRANSPOSE_BYTES_PER_CYCLE * dev.compute_units * core_ghz(dev) * 1e9)
    bottom = dev.layers[-1].bandwidth_gbps
    gbps = layer_gbps(program, dev, len(dev.layers) - 1)
    streamed = moved * (TRANSPOSE_DRAM_SLOWDOWN if gbps == bottom else 1.0) / (gbps * 1e9)
    assert transpose_seconds(program, dev) == pytest.approx(max(cycles, streamed))
    pricing = price(program, dev, program.expr.flops, 1.0)
    assert dict(pricing.moved)["copying B transposed"] == moved
    *_, gathering, _, _ = pricing.after
    assert gathering == pytest.approx(transpose_seconds(program, dev))
    assert cpu_plan(program, dev).path == PANELS and cpu_plan(program, dev).staged_padding


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_copy_from_dram_is_priced_at_a_fraction_of_its_bandwidth(dev):
    """A 109 MB B (GPT-2's head over 541 inputs) is no operator the last-level cache holds: read
    and written from DRAM, 2 x 4 x 541 x 50257 bytes at TRANSPOSE_DRAM_SLOWDOWN times its
    streamed time where that is slower than the copy's cycles (1000 rows, dealt over unit tiles
    that each copy B's panels from the copy)."""
    view = transposed_gemm(_matmul(1000, 541, 50257, trans_b=True))
    program = construct(view, dev, options=Options(topk=1)).candidates[0].program
    assert not cpu_plan(program, dev).transposed_in_panels
    bottom = len(dev.layers) - 1
    assert layer_gbps(program, dev, bottom) == dev.layers[bottom].bandwidth_gbps
    moved = 2 * 4 * 541 * 50257
    cycles = moved / (TRANSPOSE_BYTES_PER_CYCLE * dev.compute_units * core_ghz(dev) * 1e9)
    streamed = moved * TRANSPOSE_DRAM_SLOWDOWN / (dev.layers[bottom].bandwidth_gbps * 1e9)
    assert transpose_seconds(program, dev) == pytest.approx(max(cycles, streamed))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("k", [64, 75])
def test_a_reduction_along_its_lanes_pays_one_sum_across_them_per_output(dev, k):
    """The nest of a transposed B vectorises K (`CpuPlan.path` LANES): per output one sum across
    the lanes, over the cores the grid keeps busy; a ragged K's edge is the compute term's alone.
    Where the L1 tile spans K (`CpuPlan.direct_stores`) each register tile's are summed after its
    K-loop, the register tile's K at LANE_ADDS_PER_CYCLE; where it cuts K, after the unit tile's
    whole K, from a buffer, at LANE_SUM_CYCLES."""
    e = _matmul(24, k, 40, 2, trans_b=True)
    nest = Stepper(e, dev, options=Options(topk=1), view=ViewChoice(e)).finish().candidates[0].program
    lanes = cpu_plan(nest, dev).lanes
    padded = -(-k // lanes) * lanes
    calc = calculus(nest.expr)
    for l1_k, whole in ((padded, True), (lanes, False)):
        program = make_program(calc, dev, [(1, 2, 4, lanes), (1, 2, 4, l1_k), (2, 12, 8, padded)], [True] * 3, 0.0)
        plan = cpu_plan(program, dev)
        assert plan.path == LANES and plan.vector_axis == 3
        assert plan.split_edges == bool(k % plan.lanes)
        assert plan.direct_stores == whole
        per_output = lanes / LANE_ADDS_PER_CYCLE if whole else LANE_SUM_CYCLES
        busy = min(program.grid, dev.compute_units)
        expected = 2 * 24 * 40 * per_output / (busy * clock_ghz(program, dev) * 1e9)
        assert lane_sum_seconds(program, dev) == pytest.approx(expected)
    assert lane_sum_seconds(transposed_program(e, dev), dev) == 0.0  # the view's plain template has none


def transposed_program(e, dev):
    return construct(transposed_gemm(e), dev, options=Options(topk=1)).candidates[0].program


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_construction_takes_the_view_where_it_prices_faster(dev):
    """Attention's scores (Q x K^T, K = 64): each output of the nest a short dot product and its
    sum across lanes, the copy a few KB: the view. Two rows over a 4096 x 4096 B read once by the
    nest: copying 64 MB costs more than the GEMM, so the nest stays."""
    scores = _matmul(128, 64, 128, 12, trans_b=True)
    chosen = construction_view(scores, dev)
    assert chosen.priced and chosen.expr.transposed == ("B",) and chosen.view_seconds < chosen.nest_seconds
    assert "copy of B" in chosen.text() and chosen.to_dict()["transposed_view"]
    first = Stepper(scores, dev).next()
    assert first.note.startswith("view: priced as the GEMM over a copy of B")
    two_rows = _matmul(2, 4096, 4096, trans_b=True)
    kept = construction_view(two_rows, dev)
    assert kept.priced and kept.expr is two_rows and kept.nest_seconds < kept.view_seconds
    assert view_alternative(scores, device("v100")) is None  # the GPU's templates read B as stored


def test_the_view_kernels_take_the_callers_b_and_match_numpy():
    """Ragged extents on every axis. 45 rows over 29 columns are dealt to the cores along M, so B's
    panels are copied per unit tile of rows, from the copy made before the loop nest
    (`codegen.cpu._transpose_first`); 5 rows of 16 batches are one unit tile, the batches dealt
    over the cores (up to 16 of them), whose panel copy reads B as stored
    (`codegen.cpu._copy_rows_down_strips`). Both ways are built."""
    ways = set()
    for m, k, n, b in [(45, 67, 29, 0), (37, 129, 77, 3), (5, 67, 70, 16)]:
        view = transposed_gemm(_matmul(m, k, n, b, trans_b=True))
        built = built_view_kernels(view, topk=2)  # each built over the caller's buffers and checked
        assert len(built) == 2 and all(cand.program.expr.transposed == ("B",) for cand, _ in built)
        ways |= {cpu_plan(cand.program, device("local-cpu")).transposed_in_panels for cand, _ in built}
    assert ways == {(), ("B",)}


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_b_whose_panels_are_copied_once_is_copied_into_them_as_stored(dev):
    """Where the unit tile spans every row (5 rows of 6 batches), B's panel copy reads B as
    stored and there is no copy before the loop nest; those bytes of the panels are priced at
    ROW_BLOCKS_BYTES_PER_CYCLE where the template copies them in blocks (`row_block_width`), else
    at ROWS_DOWN_STRIPS_BYTES_PER_CYCLE. Where the rows are dealt over unit tiles (4049 rows),
    each copies B's panels again, from the copy made first."""
    ways = set()
    for e in (_matmul(5, 64, 6895, 6, trans_b=True), _matmul(4049, 989, 37, trans_b=True)):
        view = transposed_gemm(e)
        b = next(t for t in view.inputs if t.name == "B")
        for cand in construct(view, dev, options=Options(topk=5)).candidates:
            program, plan = cand.program, cpu_plan(cand.program, dev)
            once = "B" in plan.packed and all(program.unit_tile[a] >= view.axes[a].extent
                                              for a in view.spatial if not b.uses_axis(a))
            assert plan.transposed_in_panels == (("B",) if once else ())
            assert copied_bytes(view, plan.transposed_in_panels) == (0 if once else 2 * prod(b.shape) * 4)
            assert (transpose_seconds(program, dev) == 0) == once
            assert plan.to_dict(view).get("transposed_in_panels") == (["B"] if once else None)
            words = describe(plan, program)
            assert ("(B from its rows as stored)" in words) == once
            assert ("B copied transposed before the loop nest" in words) == (not once)
            panels = packed_tile_bytes(program, dev, ("B",), plan.pack_layer)
            assert packed_bytes(program, dev, rows=True) == (panels if once else 0)
            assert packed_bytes(program, dev, transposed=True) == 0  # no filters' copy
            if once:
                blocks = row_block_width(int(program.register_tile[plan.vector_axis]), plan.lanes)
                rate = ROW_BLOCKS_BYTES_PER_CYCLE if blocks else ROWS_DOWN_STRIPS_BYTES_PER_CYCLE
                assert packing_seconds(program, dev) == pytest.approx(_rows_copy_seconds(program, dev, panels, rate))
            ways.add(once)
    assert ways == {True, False}


@pytest.mark.parametrize("mcpu, lanes, width", [("haswell", 8, 8), ("skylake-avx512", 16, 16)])
def test_b_copied_as_stored_goes_through_registers_in_square_blocks(mcpu, lanes, width):
    """B's rows copied down their 16-column strips one scalar load and store per element took
    about 45 of 27 x 123 x 1367's 95 us on two Zen 4 cores; staged in registers in blocks of a
    vector's lanes square (each row's piece one vector load, the strip's rows one vector store
    per K-step), it runs 66. AVX2 code writes its 16-column strips in 8-lane halves, so blocks
    of 8; AVX-512 code in blocks of 16. K (123) and the padding past N (1367) end inside a block,
    so the blocks' loops are partitioned where their guards' bounds fall."""
    view = transposed_gemm(_matmul(27, 123, 1367, trans_b=True))
    local = device("local-cpu")
    spec = replace(local, warp_size=lanes, target=tuple(sorted({**dict(local.target), "mcpu": mcpu}.items())))
    program = make_program(calculus(view), spec, ((9, 16, 1), (9, 16, 123), (27, 688, 123)), [True] * 3, 0.0)
    assert cpu_plan(program, spec).transposed_in_panels == ("B",)
    kernel = build_kernel(view, program, spec)
    assert kernel.ok, kernel.error
    staged = re.search(r'(\w+) = T.sblock_alloc_buffer\(\(1367, 123\), scope="local"\)', kernel.tvmscript)
    assert staged, "B is not staged in registers"
    load = re.search(rf"for \w+ in T.unroll\({width}\):\n\s+for \w+ in T.vectorized\({width}\):\n"
                     rf"\s+with T.sblock\(\"{staged.group(1)}\"\)", kernel.tvmscript)
    store = re.search(rf"for \w+ in T.unroll\({width}\):\n\s+for \w+ in T.vectorized\({width}\):\n"
                      rf"\s+with T.sblock\(\"B_reindex_pad\"\)", kernel.tvmscript)
    assert load and store, kernel.tvmscript
    for blocks in (688 // width, -(-123 // width)):  # the rows' and K-steps' blocks
        assert f'T.serial({blocks}, annotations={{"pragma_loop_partition_hint": 1}})' in kernel.tvmscript


@pytest.mark.parametrize("dev, n, columns, width", [(AVX2, 1367, 16, 8), (AVX2, 1367, 12, 4), (AVX512, 1367, 16, 16),
                                                     (AVX512, 12, 12, 0), (AVX2, 6, 6, 0)],
                         ids=["avx2-16", "avx2-12", "avx512-16", "avx512-12", "avx2-6"])
def test_b_copied_in_blocks_is_priced_at_their_rate_and_a_row_at_a_time_at_its_own(dev, n, columns, width):
    """B's panel bytes at the rate of the copy the template makes of them: strips of 16 columns
    in blocks of 8 on AVX2 and of 16 on AVX-512, of 12 in blocks of 4 (three 4-lane pieces) on
    AVX2. A whole row shorter than a vector (12 on AVX-512, 6 on AVX2), packed because the 27
    rows pad to 28, is written in one vector of 12 or 6 lanes and copied a row at a time."""
    view = transposed_gemm(_matmul(27, 123, n, trans_b=True))
    program = make_program(calculus(view), dev, ((4, columns, 1), (4, columns, 123), (28, min(48, n), 123)), [True] * 3, 0.0)
    plan = cpu_plan(program, dev)
    assert plan.transposed_in_panels == ("B",)
    assert row_block_width(columns, plan.lanes) == width
    rate = ROW_BLOCKS_BYTES_PER_CYCLE if width else ROWS_DOWN_STRIPS_BYTES_PER_CYCLE
    panels = packed_bytes(program, dev, rows=True)
    assert panels and packing_seconds(program, dev) == pytest.approx(_rows_copy_seconds(program, dev, panels, rate))


@pytest.mark.parametrize("m,k,n,b", [(9, 37, 70, 0), (6, 53, 41, 2)])
def test_b_copied_as_stored_in_blocks_matches_numpy(m, k, n, b):
    """Blocks cut by K's end (37, 53: neither a multiple of 8 or 16) and by the padding rows past
    N's end (70, 41 in 16-column strips), one batch and two."""
    view = transposed_gemm(_matmul(m, k, n, b, trans_b=True))
    dev = device("local-cpu")
    batch = (1,) if b else ()
    tiles = tuple(batch + t for t in ((m, 16, 1), (m, 16, k), (m, -(-n // 16) * 16, k)))
    program = make_program(calculus(view), dev, tiles, [True] * 3, 0.0)
    assert cpu_plan(program, dev).transposed_in_panels == ("B",)
    kernel = build_kernel(view, program, dev)
    assert kernel.ok, kernel.error
    assert 'scope="local"' in kernel.tvmscript
    result = verify(kernel, view)
    assert result.correct, result


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("b,k", [(0, 841), (8, 841), (0, 4097)])
def test_one_row_over_a_transposed_b_finds_register_tiles_along_a_ragged_k(dev, b, k):
    """A Linear layer at decode time: one row over B [N, K], no view (B read once), the nest's K
    vectorised as a gemv's. Its register K was refused at every size that does not divide K (the
    one-row rule of `rules.TailRule`), so a K of 841 = 29 x 29 found no register tile at all."""
    e = _matmul(1, k, 457, b, trans_b=True)
    assert transposed_gemm(e) is None
    found = construct(e, dev, options=Options(topk=3)).candidates
    assert found and all(cpu_plan(c.program, dev).path == LANES for c in found)
    assert all(c.program.register_tile[-1] % cpu_plan(c.program, dev).lanes == 0 for c in found)


def test_the_nest_over_ragged_rows_and_columns_matches_numpy():
    """The nest (K in lanes) of 29 x 679 x 1009, every axis ragged: its register tiles' loops split
    where the rows and columns end (`CpuPlan.split_others`) and where K does (`split_edges`)."""
    e = _matmul(29, 679, 1009, trans_b=True)
    dev = device("local-cpu")
    found = Stepper(e, dev, options=Options(topk=2), view=ViewChoice(e)).finish().candidates
    assert any(cpu_plan(c.program, dev).split_others and cpu_plan(c.program, dev).split_edges for c in found)
    for cand in found:
        assert cpu_plan(cand.program, dev).path == LANES
        kernel = build_kernel(cand.program.expr, cand.program, dev)
        assert kernel.ok, kernel.error
        result = verify(kernel, cand.program.expr)
        assert result.correct, result


def test_one_row_over_a_transposed_b_with_a_ragged_k_matches_numpy():
    e = _matmul(1, 841, 457, 3, trans_b=True)
    dev = device("local-cpu")
    cand = construct(e, dev, options=Options(topk=1)).candidates[0]
    kernel = build_kernel(cand.program.expr, cand.program, dev)
    assert kernel.ok, kernel.error
    result = verify(kernel, cand.program.expr)
    assert result.correct, result


def test_a_nest_tile_streaming_the_rows_of_a_matches_numpy():
    """A register tile of the nest that fits only with A's rows streamed (`registers._streamed_rows`:
    11 rows by 2 of B in 16 lanes, 5 by 2 in 8), over ragged rows, columns and K, on this machine."""
    e = _matmul(23, 203, 37, trans_b=True)
    dev = device("local-cpu")
    lanes = dev.warp_size
    rows = 11 if lanes >= 16 else 5
    program = make_program(calculus(e), dev, ((rows, 2, lanes), (rows, 4, 4 * lanes), (2 * rows, 20, 16 * lanes)), [True] * 3, 0.0)
    plan = cpu_plan(program, dev)
    assert plan.path == LANES and micro_kernel_registers(e, dev, (rows, 2, lanes)) <= register_budget(dev)
    kernel = build_kernel(e, program, dev)
    assert kernel.ok, kernel.error
    result = verify(kernel, e)
    assert result.correct, result
