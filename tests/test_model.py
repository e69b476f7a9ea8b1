"""The micro-performance model (Roller §3.3) and rPrograms: Estimate fields agree with each
other and with the traffic they are computed from, and more bandwidth never slows a program."""

import json
from dataclasses import replace
from functools import cache
from math import ceil, prod

import pytest
from helpers import TINY_CPU, device, expr, matmul, plain_matmul
from hypothesis import given, settings
from hypothesis import strategies as st
from test_alignment import AVX2, AVX512
from test_invariants import plain_expr

from workbench.construct.stepper import construct
from workbench.hardware.registers import register_budget
from workbench.hardware.spec import MicroKernel
from workbench.ops.fusion import fuse_axes
from workbench.ops.gemm_view import construction_expr
from workbench.ops.tensor_expr import KernelArg
from workbench.rtile.axes import (
    PREFETCH_ROWS, RAMP_LINES, autovector_axis, cross_thread_axis, lane_axis, plain_projections, unfollowed_inputs,
    read_once_below, unfollowed_reads, unramped_share, written_before,
)
from workbench.rtile.model import cpu, cpu_compute
from workbench.rtile.model import estimate, part_imbalance
from workbench.rtile.model import gpu as gpu_model
from workbench.rtile.model.common import (
    GB, hardware_caches, is_compute_bound, is_load_hidden, layer_gbps, partial_sum_bytes, source_layer,
)
from workbench.rtile.model.cpu import (
    ACCUMULATOR_FILL, BOTTOM_ADDED_SHARE, BUFFER_TOUCHES, SHARED_LINE_CYCLES, SPILL_RELOAD, accumulator_home, accumulator_steps, buffer_bytes, cache_traffic,
    GUARDED_STORE_CYCLES, clock_ghz, edge_chain_seconds, edge_seconds, epilogue_read_seconds, epilogue_seconds,
    guarded_store_seconds,
    buffer_touch_seconds, combine_stages, hidden_source, lane_sum_seconds, packed_bytes,
    RESIDENT_SHARE, packing_seconds, scattered_inputs, shared_output_lines, split_sum_seconds, stream_runs,
    transfer_seconds, FILL_BUFFERS, WINDOW_UOPS, lines_in_flight, unfollowed_seconds, STRIPS_SHARE, buffer_in_llc,
    strips_seconds,
)
from workbench.rtile.model.cpu_compute import (
    autovector_efficiency, compute_efficiency,
    guard_slowdown, GUARDED_MICRO_KERNEL, load_coverage, measured_ceiling, micro_kernel_shape, scalar_row,
    vector_pieces,
)
from workbench.rtile.model.gpu import (
    GUARDED_SLOWDOWN, L2_HIT_LATENCY, LOADED_LATENCY, bytes_in_flight, hbm_share, gpu_stages, guarded_slowdown, output_sectors, overlapped, reachable_gbps, split_k_seconds, tree_reduction_seconds,
    uncoalesced_bytes, shared_wavefronts, store_sector_ratio, vthread_conflict_ratio, warp_sectors,
)
from workbench.rtile.occupancy import (
    async_copies, blocks_per_unit, occupancy_limits, prefetch_registers, registers_per_thread, warps_per_scheduler,
)
from workbench.rtile.panels import pack_layer, packed_inputs, packed_tile_bytes
from workbench.rtile.plan import cpu_plan, gpu_plan
from workbench.rtile.registers import block_thread_count, partial_sums, step_loads
from workbench.rtile.rprogram import RProgram, footprint_at, make_program, waves
from workbench.rtile.staging import pipelined, register_prefetch, shared_buffers
from workbench.rtile.traffic import TileCalculus, calculus

DEVICES = ("v100", "mi50", "k80", "tiny-cpu")
WORKLOADS = {
    "mm-1024": lambda: matmul(1024, 1024, 1024),
    "mm-M1": lambda: matmul(128, 1000, 4032),
    "conv": lambda: expr("conv2d", N=8, C=64, H=30, W=30, F=96, KH=3, KW=3, stride=2, pad=1),
    "relu": lambda: expr("relu", shape=(128, 256, 14, 14)),
    "reduce": lambda: expr("reduce_mean", shape=(256, 4096), axes=(1,)),
}


@cache
def constructed(dev: str, name: str):
    return construct(WORKLOADS[name](), device(dev))


def constructed_on(e, dev):
    """Roller's rank 1 of `e` on `dev` (default options)."""
    return construct(e, dev).candidates[0].program


def _stages(est):
    return {"compute": est.compute_seconds, **dict(est.load_seconds)}


def check_consistent(calc, dev, program, est):
    """Every relation between the fields of an Estimate that the model promises."""
    stages = _stages(est)
    assert est.bottleneck == max(stages, key=stages.get)
    assert all(est.predicted_seconds >= s * (1 - 1e-12) for s in stages.values())
    units, grid = dev.compute_units, program.grid
    assert est.waves == ceil(grid / (units * est.blocks_per_unit)) == waves(grid, units * est.blocks_per_unit)
    # tiles dealt round-robin: the busiest unit runs ceil(grid / units) of them, the balanced
    # share is grid / units (a grid smaller than the units only leaves units idle)
    imbalance = ceil(grid / units) * units / grid if grid >= units else 1.0
    imbalance *= part_imbalance(program, dev)  # a split program's longest part (closed forms in test_split_k)
    packing = 0.0
    shared_lines = shared_output_lines(program, dev)  # 0 on a GPU
    if dev.kind == "gpu":  # stages overlap only as far as other warps / blocks hide them
        loads = dict(est.load_seconds)
        resident = min(est.blocks_per_unit, ceil(grid / units))  # the grid may not fill a unit
        warps = ceil(est.threads / dev.warp_size) * resident / dev.teu_per_unit  # per scheduler
        glob = loads.get(dev.layers[-1].name, 0.0)

        def hide(a, b, agents):  # each agent runs its share of a then b; the pipes bound both
            return max(a, b, (a + b) / max(1, agents))

        shared = loads.get(dev.layers[dev.unit_layer_index].name, 0.0)
        if program.cached[dev.unit_layer_index] and pipelined(program, dev):  # step s + 1's copy under step s
            unit_time = max(hide(est.compute_seconds, shared, warps), glob)
        elif program.cached[dev.unit_layer_index]:  # a block copies, syncs, then computes
            unit_time = hide(hide(est.compute_seconds, shared, warps), glob, resident)
        else:
            unit_time = hide(est.compute_seconds, glob, warps)
    else:  # registers' loads overlap the FMAs, as a plain projection's inputs' transfers into
        # L1 do (closed forms below); every other transfer further down adds
        # on a CPU the data passes every cache layer, staged or not (`hardware_caches`)
        through = hardware_caches(program, dev)
        first = dev.layers[source_layer(through, 0, len(dev.layers))].name
        loads = dict(est.load_seconds)
        # the CPU template's panel copies are the busiest core's already (closed forms in
        # test_vortex_analyzer): they add after the imbalance
        if packed_bytes(program, dev):
            packing = loads.pop(f"packing into {dev.layers[pack_layer(program)].name}")
        assert packing == packing_seconds(program, dev)
        # the epilogue's arithmetic (reduce_mean's division) on the busy cores, after them too
        packing += epilogue_seconds(program, dev, min(1.0, grid / units))
        assert (epilogue_seconds(program, dev, 1.0) > 0) == (program.expr.epilogue_ops > 0)
        # and a split row's scalar edge, on the core that holds it (closed forms in test_plan)
        packing += edge_seconds(program, dev)
        # and a K-vectorised reduction's sums across lanes (closed forms in test_transposed_gemm)
        packing += lane_sum_seconds(program, dev)
        # and the output lines two cores write (closed forms at the end of this file)
        sharing = loads.pop("output lines two cores write", 0.0)
        assert sharing == pytest.approx(shared_lines * SHARED_LINE_CYCLES / (clock_ghz(program, dev) * 1e9) if shared_lines else 0.0)
        packing += sharing
        # and a split program's sum on one core (closed forms in test_split_k)
        summing = loads.pop(f"summing {program.split} parts' partial sums", 0.0)
        assert summing == split_sum_seconds(program, dev)
        packing += summing
        hidden = 0.0
        if (below := hidden_source(through, dev)) is not None:
            hidden = sum(transfer_seconds(through, dev, layer, cache_traffic(program, dev, layer), scalar_row(program, dev))
                         for layer in range(len(program.tiles))
                         if source_layer(through, layer, len(dev.layers)) == below) / min(1.0, grid / units)
        # on the lanes path (a dot product per output along K) the register loads add to the
        # FMAs rather than overlap them (closed form below)
        register = loads.get(first, 0.0)
        if cpu_plan(program, dev).path == "lanes":
            core = max(est.compute_seconds + register, hidden)
        else:
            core = max(est.compute_seconds, register, hidden)
        # the bottom layer's transfers add whole, or for a plain projection overlap the core's
        # time but for BOTTOM_ADDED_SHARE of the shorter (closed forms below)
        bottom = dev.layers[-1].name if first != dev.layers[-1].name else None
        unit_time = core + sum(t for n, t in loads.items() if n not in (first, bottom)) - hidden
        streamed = loads.get(bottom, 0.0)
        overlap = (1 - BOTTOM_ADDED_SHARE) * min(unit_time, streamed) if plain_projections(program.expr) else 0.0
        unit_time += streamed - overlap
    # a cross-thread reduction's trees follow the pipeline (closed forms below), and a split-K
    # program's second pass (test_split_k); 0 for the rest
    assert est.reduction_seconds == tree_reduction_seconds(program, dev, est.threads, est.waves)
    second = split_k_seconds(program, dev) if dev.kind == "gpu" else 0.0
    assert est.predicted_seconds == pytest.approx(unit_time * imbalance + est.reduction_seconds + second + packing)
    assert est.flops == calc.expr.flops <= est.padded_flops
    moved = {}
    through = replace(program, cached=(True,) * len(program.cached)) if dev.kind == "cpu" else program
    assert hardware_caches(program, dev) == through
    for layer, tile in enumerate(program.tiles):
        if through.cached[layer]:
            src = dev.layers[source_layer(through, layer, len(dev.layers))].name
            # Q(tile), or less where a CPU cache tile's neighbours share (closed forms below);
            # a CPU cache layer counts the inputs read an element at a time in whole lines
            lines = (dev.layers[layer].transaction_bytes, scattered_inputs(program, dev))
            assert cache_traffic(program, dev, layer) <= calc.traffic_bytes(tile, *lines if dev.kind == "cpu" and layer else ())
            # plus, for a GPU register tile read straight from global memory, the sectors its
            # uncoalesced loads waste (closed forms below)
            wasted = uncoalesced_bytes(program, dev) if layer == 0 else 0
            moved[src] = moved.get(src, 0) + cache_traffic(program, dev, layer) + wasted
    if dev.kind == "cpu" and len(program.tiles) > 1 and calc.expr.reduce:
        home = dev.layers[accumulator_home(program, dev)].name
        lanes = partial_sums(calc.expr, dev, program.tiles[0])  # closed forms in test_alignment
        moved[home] = moved.get(home, 0) + calc.accumulator_bytes(program.tiles[0], accumulator_steps(program), lanes)
        moved[home] += buffer_bytes(program, dev)  # the output buffer's passes (closed forms in test_panels)
    if packed_bytes(program, dev):
        moved[f"packing into {dev.layers[pack_layer(program)].name}"] = packed_bytes(program, dev)
    if shared_lines:
        moved["output lines two cores write"] = shared_lines * dev.layers[-1].transaction_bytes
    if dev.kind == "cpu" and program.split > 1:
        moved[f"summing {program.split} parts' partial sums"] = partial_sum_bytes(program)
    if dev.kind == "cpu" and calc.expr.epilogue_input_bytes:  # a fused epilogue's own inputs (closed forms below)
        moved[dev.layers[-1].name] = moved.get(dev.layers[-1].name, 0) + calc.expr.epilogue_input_bytes
    assert dict(est.bytes_per_layer) == moved and set(dict(est.load_seconds)) == set(moved)
    assert 0 < est.occupancy <= 1 and est.blocks_per_unit >= 1
    assert est.footprints == tuple(footprint_at(dev, program, l) for l in range(len(program.tiles)))
    if dev.kind == "gpu":
        assert est.threads == block_thread_count(calc.expr, dev, program.unit_tile, program.register_tile)
        smem = est.footprints[dev.unit_layer_index]
        if est.blocks_per_unit > 1:
            assert est.threads * est.blocks_per_unit <= dev.max_threads_per_unit
            assert est.blocks_per_unit <= (dev.max_blocks_per_unit or est.blocks_per_unit)
            lanes = ceil(est.threads / dev.warp_size) * dev.warp_size  # whole warps
            assert lanes * registers_per_thread(program, dev, shared_buffers(program, dev)) * est.blocks_per_unit <= dev.registers_per_unit
            if program.cached[dev.unit_layer_index]:  # only a staged tile takes shared memory (pipelined: twice)
                copies = shared_buffers(program, dev)
                assert copies * smem * est.blocks_per_unit <= dev.unit_shared_bytes
    else:
        assert (est.threads, est.blocks_per_unit, est.occupancy) == (1, 1, 1.0)


def _faster(dev, layer_name=None, factor=2.0):
    """`dev` with one layer's bandwidth (or, for None, the peak compute) multiplied by `factor`."""
    if layer_name is None:
        return replace(dev, peak_gflops=tuple((d, g * factor) for d, g in dev.peak_gflops))
    layers = tuple(replace(l, bandwidth_gbps=l.bandwidth_gbps * factor) if l.name == layer_name else l for l in dev.layers)
    return replace(dev, layers=layers)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_candidate_estimates_are_consistent_and_reproducible(dev, name):
    c = constructed(dev, name)
    calc = TileCalculus(c.expr)
    assert c.candidates
    for cand in c.candidates:
        est = estimate(cand.program, c.device)
        assert est == cand.estimate  # a pure function of (program, device)
        check_consistent(calc, c.device, cand.program, est)
        json.dumps(est.to_dict())


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_doubling_the_bottleneck_bandwidth_never_slows_a_program(dev, name):
    c = constructed(dev, name)
    for cand in c.candidates:
        old = cand.estimate
        neck = None if old.bottleneck == "compute" else old.bottleneck
        new = estimate(cand.program, _faster(c.device, neck))
        assert new.predicted_seconds <= old.predicted_seconds
        if neck is not None:
            faster = _faster(c.device, neck)
            layer = next(l for l, x in enumerate(faster.layers) if x.name == neck)
            halved = dict(old.load_seconds)[neck] / 2
            latency_bound = reachable_gbps(cand.program, faster, layer) < faster.layers[layer].bandwidth_gbps
            if latency_bound or stream_runs(cand.program, faster):
                # loads bound by the bytes in flight (Little's law, closed forms below), or a CPU
                # row's stream starts, one latency each (`cpu.stream_seconds`): only what the
                # latency does not bound speeds up
                assert halved <= dict(new.load_seconds)[neck] * (1 + 1e-12) <= 2 * halved * (1 + 1e-12)
            else:
                assert dict(new.load_seconds)[neck] == pytest.approx(halved)
        else:
            assert new.compute_seconds == pytest.approx(old.compute_seconds / 2)
        # and slowing any layer never speeds it up
        for layer in dict(old.load_seconds):
            assert estimate(cand.program, _faster(c.device, layer, 0.5)).predicted_seconds >= old.predicted_seconds


@st.composite
def matmul_program(draw):
    """A random three-level matmul program: each tile a multiple of the one above."""
    dev = device(draw(st.sampled_from(DEVICES)))
    m, n, k = (draw(st.sampled_from([64, 127, 256, 1000, 4096])) for _ in range(3))
    e = matmul(m, n, k)
    calc = TileCalculus(e)
    tiles, tile = [], (1, 1, 1)
    for _ in range(len(dev.layers) - 1):
        tile = tuple(min(t * draw(st.sampled_from([1, 2, 4, 8])), ceil(x / t) * t) for t, x in zip(tile, e.extents))
        tiles.append(tile)
    cached = (True,) + tuple(draw(st.booleans()) for _ in tiles[1:])
    return calc, dev, make_program(calc, dev, tiles, cached, 0.05)


def test_a_pipelined_v100_program_keeps_the_estimates_relations():
    """The example hypothesis found once the V100 pipelined through registers: matmul 64^3 in
    8 x 8 x 1 blocks of one-element register tiles, staged, is pipelined, and its time is
    max(compute and shared hidden by the warps, global), not the unpipelined composition."""
    dev, calc = device("v100"), TileCalculus(matmul(64, 64, 64))
    program = make_program(calc, dev, [(1, 1, 1), (8, 8, 1)], (True, True), 0.05)
    assert pipelined(program, dev) and register_prefetch(program, dev)
    check_consistent(calc, dev, program, estimate(program, dev))


@settings(max_examples=120, deadline=None)
@given(matmul_program())
def test_random_programs_have_consistent_monotone_estimates(case):
    calc, dev, program = case
    est = estimate(program, dev)
    check_consistent(calc, dev, program, est)
    for layer in [None, *dict(est.load_seconds)]:
        assert estimate(program, _faster(dev, layer)).predicted_seconds <= est.predicted_seconds


def _with_residual(e):
    """`e` with a residual of its output's shape passed for a fused epilogue to add, as an
    imported model's operator has it: a kernel argument the main block does not read."""
    residual = KernelArg("residual", e.output.shape, e.dtype, "input")
    return replace(e, args=e.args[:-1] + (residual,) + e.args[-1:])


@pytest.mark.parametrize("dev", [AVX2, AVX512, TINY_CPU], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(96, 80, 64), (7, 300, 33), (512, 16, 1024)])
def test_an_epilogues_residual_is_read_once_with_the_bottom_layers_transfers(dev, shape):
    """A residual the epilogue adds is read once, each element as the write-back folds the add
    in, from the bottom layer at its rate (the last-level cache's where the operator stays there)
    on the cores the grid keeps busy, with that layer's other transfers: its bytes and seconds
    join the bottom layer's, and a plain projection's program costs between BOTTOM_ADDED_SHARE
    of them and all of them more (the part of the bottom layer's time that overlaps the core's,
    `combine_stages`), on its busiest core. An operator that passes nothing beyond what its main
    block reads pays nothing."""
    bare = plain_matmul(*shape)
    fused = _with_residual(bare)
    m, n, _ = shape
    assert bare.epilogue_input_bytes == 0 and fused.epilogue_input_bytes == 4 * m * n
    program = constructed_on(bare, dev)
    with_residual = replace(program, expr=fused)
    busy = min(1.0, program.grid / dev.compute_units)
    bottom = len(dev.layers) - 1
    expected = 4 * m * n / (layer_gbps(program, dev, bottom) * 1e9 * busy)
    assert epilogue_read_seconds(with_residual, dev, busy) == pytest.approx(expected)
    assert epilogue_read_seconds(program, dev, busy) == 0.0
    before, after = estimate(program, dev), estimate(with_residual, dev)
    name = dev.layers[bottom].name
    assert dict(after.bytes_per_layer)[name] == dict(before.bytes_per_layer).get(name, 0) + 4 * m * n
    assert dict(after.load_seconds)[name] == pytest.approx(dict(before.load_seconds).get(name, 0.0) + expected)
    imbalance = ceil(program.grid / dev.compute_units) * dev.compute_units / program.grid if program.grid >= dev.compute_units else 1.0
    imbalance *= part_imbalance(program, dev)
    added = after.predicted_seconds - before.predicted_seconds
    assert BOTTOM_ADDED_SHARE * expected * imbalance * (1 - 1e-9) <= added <= expected * imbalance * (1 + 1e-9)
    check_consistent(calculus(fused), dev, with_residual, after)


def test_waves_count_partial_waves_as_whole():
    assert [waves(g, 80) for g in (1, 79, 80, 81, 160, 161)] == [1, 1, 1, 2, 2, 3]
    assert waves(5, 0) == 5


def test_blocks_per_unit_limited_by_threads_registers_and_shared_memory():
    dev = device("v100")
    calc = TileCalculus(matmul(4096, 4096, 4096))
    # 8x8 register tile (64 + 16 floats: 80 registers) in a 128x128x8 block: 256 threads
    program = make_program(calc, dev, [(8, 8, 1), (128, 128, 8)], (True, True), 0.05)
    threads, bpu = blocks_per_unit(program, dev, shared_buffers(program, dev))
    assert threads == 256
    regs = footprint_at(dev, program, 0) // 4
    smem = footprint_at(dev, program, 1)
    assert bpu == min(2048 // 256, 65536 // (256 * regs), 49152 // smem)


@pytest.mark.parametrize("dev", ["v100", "h200"])
def test_a_gpu_block_tile_that_leaves_a_tail_computes_under_its_guards(dev, monkeypatch):
    """A block tile that does not divide an axis (96 of 65,536 rows, 384 of 4,096 columns, 24 of
    1,024 K-steps) leaves TVM's tail test on every accumulator update, in every block: its
    compute is `GUARDED_SLOWDOWN` times what the same tiles cost unguarded; a dividing tile's is
    not slowed."""
    dev = device(dev)
    calc = TileCalculus(matmul(65536, 4096, 1024))
    for block in ((96, 256, 8), (64, 384, 8), (128, 256, 24)):
        program = make_program(calc, dev, [(8, 8, 1), block], (True, True), 0.05)
        assert guarded_slowdown(program, dev) == GUARDED_SLOWDOWN > 1
        guarded = estimate(program, dev).compute_seconds
        monkeypatch.setattr(gpu_model, "GUARDED_SLOWDOWN", 1.0)
        assert guarded == pytest.approx(estimate(program, dev).compute_seconds * GUARDED_SLOWDOWN)
        monkeypatch.undo()
    exact = make_program(calc, dev, [(8, 8, 1), (64, 256, 8)], (True, True), 0.05)
    assert guarded_slowdown(exact, dev) == 1.0


def test_compute_bound_test_compares_load_time_with_compute_time():
    dev = device("v100")
    calc = TileCalculus(matmul(4096, 4096, 4096))
    small, large = (1, 1, 1), (128, 128, 8)
    assert not is_compute_bound(calc, dev, 1, small, 2)
    assert is_compute_bound(calc, dev, 1, large, 2)
    load = calc.traffic_bytes(large) / (dev.layers[2].bandwidth_gbps * 1e9)
    assert load <= calc.expr.flops / (dev.peak("float32") * 1e9)


@pytest.mark.parametrize("spec", [AVX2, AVX512], ids=lambda d: d.name)
def test_load_hidden_under_the_operators_floor_the_closed_form(spec):
    """is_load_hidden: a tile's loads from L2 against max(compute at peak, each byte once from
    DRAM). gemv 4096 x 4096 is bound by reading its 64 MiB matrix once: an L1 tile of 14 x 16
    reloads x 293 times from L2 and still hides under that stream, though it is far from
    compute-bound; a matmul's floor is its compute."""
    gb, m = 1e9, 4096
    gemv = TileCalculus(expr("gemv", M=m, K=m))
    dram, l2 = spec.layers[-1].bandwidth_gbps * gb, spec.layers[2].bandwidth_gbps * gb
    floor = (m * m + m + m) * 4 / dram
    tile = (14, 16)
    rows = ceil(m / 14) * 14  # padded to whole tiles: A's rows, x once per row tile, the outputs
    q = rows * m * 4 + ceil(m / 14) * m * 4 + rows * 4
    assert gemv.traffic_bytes(tile) == q and q / l2 <= floor
    assert is_load_hidden(gemv, spec, tile, 2) and not is_compute_bound(gemv, spec, 1, tile, 2)
    mm = TileCalculus(matmul(512, 512, 512))
    compute = 2 * 512**3 / (spec.peak("float32") * gb)
    for t in ((1, 1, 1), (6, 16, 16), (48, 64, 256)):
        load = mm.traffic_bytes(t) / l2
        assert is_load_hidden(mm, spec, t, 2) == (load <= max(compute, 3 * 512 * 512 * 4 / dram))
    assert not is_load_hidden(mm, spec, (1, 1, 1), 2)


def test_rprogram_round_trips_and_pads_shared_inputs_only():
    dev = device("v100")
    calc = TileCalculus(matmul(512, 512, 512))
    program = make_program(calc, dev, [(4, 4, 1), (64, 64, 32)], (True, True), 0.1)
    assert RProgram.from_dict(json.loads(json.dumps(program.to_dict())), program.expr) == program
    assert program.grid == (512 // 64) ** 2
    assert program.unit_tile == (64, 64, 32) and program.register_tile == (4, 4, 1)
    assert program.tile_dict(1) == {"i": 64, "j": 64, "k": 32}
    assert program.padding[0] == (0, 0, 0)
    # A [64, 32] read by [4, 1]: (32 - 32 % 32 + 1) % 32 = 1; B [32, 64] read by [1, 4]: 4; C: none
    assert program.padding[1] == (1, 4, 0)
    assert footprint_at(dev, program, 1) == (64 * 33 + 32 * 68) * 4  # no output in shared
    assert footprint_at(dev, program, 0) == (4 + 4 + 16) * 4


def test_rprogram_carries_its_virtual_threads_through_json():
    dev = device("v100")
    calc = TileCalculus(matmul(512, 512, 512))
    program = make_program(calc, dev, [(4, 8, 1), (64, 64, 32)], (True, True), 0.1, (("j", 2),))
    data = json.loads(json.dumps(program.to_dict()))
    assert data["vthreads"] == {"j": 2}
    back = RProgram.from_dict(data, program.expr)
    assert back == program and back.vthreads == (("j", 2),)
    assert RProgram.from_dict(data | {"vthreads": {}}, program.expr) != program  # vthreads are part of the value
    # the model needs nothing beside the program and the device: the program carries its expression
    assert back.expr == calc.expr and estimate(back, dev) == estimate(program, dev)


# -- the CPU compute term (issue 14): a register tile reaches peak only with enough accumulators
# to cover the FMA latency and with every SIMD lane used; checked on generated CPUs.


def cpu_program(dev, e, register_tile):
    """A CPU program of `e` whose register tile is `register_tile` and whose L1 and L2 tiles are
    the whole operator on one core (the compute term does not depend on them)."""
    whole = tuple(ceil(x / t) * t for x, t in zip(e.extents, register_tile))
    return make_program(TileCalculus(e), dev, [register_tile, whole, whole], (True, True, True), 1.0)


def closed_compute_seconds(dev, e, program, efficiency):
    padded = prod(ceil(x / t) * t for x, t in zip(e.extents, program.unit_tile))
    padded_flops = int(e.flops * padded / prod(e.extents))
    busy = min(1.0, program.grid / dev.compute_units)
    return padded_flops / (dev.peak(e.dtype) * 1e9 * busy * efficiency)


@pytest.mark.parametrize(
    "dev, tile, efficiency",
    [
        # 2 accumulators of the 10 that 5 cycles x 2 pipes need; 1 vector of B + 2 broadcasts of A
        # per 2 FMAs: the load ports allow 2 / 3 of them
        (AVX2, (2, 8, 1), 2 / 10 * 2 / 3),
        (AVX2, (4, 16, 1), 8 / 10),  # 2 + 4 loads per 8 FMAs
        (AVX2, (6, 16, 1), 1.0),  # 12 >= 10
        (AVX2, (5, 12, 1), 12 / 24),  # 15 accumulators, but LLVM splits a 12-wide row into 3 xmm of 4 lanes
        (AVX2, (8, 4, 1), 8 / 10 * 4 / 8 * 8 / 9),  # half a vector per row, 8 accumulators, 1 + 8 loads
        (AVX512, (2, 16, 1), 2 / 8 * 2 / 3),  # 4 cycles x 2 pipes
        (AVX512, (8, 16, 1), 8 / 9),  # 8 chains cover 4 x 2, but 1 + 8 loads per 8 FMAs
        (AVX512, (8, 32, 1), 1.0),  # 2 + 8 loads per 16 FMAs
        (AVX512, (14, 32, 1), 1.0),  # 2 + 14 loads per 28 FMAs
    ],
)
def test_cpu_compute_efficiency_is_lanes_used_times_latency_covered(dev, tile, efficiency):
    """compute = padded flops / (peak x busy units x min(1, accumulators / (latency x pipes)) x
    lanes filled / lanes issued x min(1, accumulators / loads per reduction step))."""
    e = matmul(64, 64, 64)
    program = cpu_program(dev, e, tile)
    assert compute_efficiency(program, dev) == pytest.approx(efficiency)
    assert estimate(program, dev).compute_seconds == pytest.approx(closed_compute_seconds(dev, e, program, efficiency))


def test_cpu_compute_efficiency_without_a_chain_or_a_lane_axis():
    """relu has no reduction: only the lanes count (a 3-wide row of fp32 fills 3 of 8 lanes).
    A sum into a scalar runs its lanes along the reduction: 1 vector of partial sums covers 1
    of 10 FMA chains, 10 vectors all. out[i] = sum_k A[2i + k] (k < 3) has no lane axis (its row
    gathers every other input, its window is shorter than a vector): the template's code is
    scalar, and LLVM vectorises its row (`autovector_efficiency`). A spec without FMA facts
    (TINY_CPU): lanes only. float64 has 4 lanes in a ymm register (test_panels: a row a guarded
    tail leaves scalar fills one)."""
    relu = expr("relu", shape=(17, 11, 3))
    assert compute_efficiency(cpu_program(AVX2, relu, (1, 1, 3)), AVX2) == pytest.approx(3 / 8)
    total = plain_expr({"i": (640, "reduce")}, [("A", [{"i": 1}]), ("out", [])])
    assert compute_efficiency(cpu_program(AVX2, total, (8,)), AVX2) == pytest.approx(1 / 10)
    assert compute_efficiency(cpu_program(AVX2, total, (80,)), AVX2) == pytest.approx(1.0)
    strided = plain_expr({"i": (64, "spatial"), "k": (3, "reduce")}, [("A", [{"i": 2, "k": 1}]), ("out", [{"i": 1}])])
    # LLVM vectorises its row (closed forms below): 8 outputs = one 8-lane vector, 2 loads each
    flops = min(1.0, strided.flops / (2 * 64 * 3))
    assert compute_efficiency(cpu_program(AVX2, strided, (8, 3)), AVX2) == pytest.approx(8 / 8 / 2 * flops)
    assert compute_efficiency(cpu_program(TINY_CPU, matmul(64, 64, 64), (2, 16, 1)), TINY_CPU) == 1.0
    # 120 rows, which tiles of 40 and 6 divide: a ragged row would be guarded, and scalar
    wide = plain_expr({"i": (120, "spatial"), "k": (64, "reduce")}, [("A", [{"k": 1}, {"i": 1}]), ("y", [{"i": 1}])], "float64")
    assert compute_efficiency(cpu_program(AVX2, wide, (40, 1)), AVX2) == pytest.approx(10 / 10 * 1.0)
    assert compute_efficiency(cpu_program(AVX2, wide, (6, 1)), AVX2) == pytest.approx(2 / 10 * 6 / 8)


@pytest.mark.parametrize("elements, lanes, pieces", [(56, 16, 4), (28, 16, 3), (14, 16, 3), (8, 16, 1), (7, 16, 3),
                                                     (4, 16, 1), (28, 8, 4), (24, 8, 3), (12, 8, 2), (1, 16, 1)])
def test_llvm_packs_a_scalar_row_in_power_of_two_pieces(elements, lanes, pieces):
    """Largest first, at most a register: 56 = 16+16+16+8, 28 = 16+8+4, 14 = 8+4+2, 7 = 4+2+1;
    on 8 lanes 28 = 8+8+8+4."""
    assert vector_pieces(elements, lanes) == pieces


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_an_operator_that_fits_the_last_level_cache_reads_below_l2_from_it(dev):
    """A 512^3 matmul's tensors are 3 MiB: within LLC_FILL of an 8 MiB L3 its L2 tiles load at
    the L3's bandwidth, within a 4 MiB L3 (2.4 MiB usable) at DRAM's, and the layers above never
    change. Everything else of the estimate is the same: only the DRAM stage's time scales, and
    the panel buffer's touches, which come from the bottom layer too (`buffer_touch_seconds`)."""
    e = matmul(512, 512, 512)
    program = make_program(TileCalculus(e), dev, [(4, 2 * dev.warp_size, 1), (64, 128, 64), (256, 256, 512)],
                           (True, True, True), 0.0)
    dram = dev.layers[-1].bandwidth_gbps
    assert TileCalculus(e).traffic_bytes((512, 512, 512)) == 3 * 512 * 512 * 4
    big, small = replace(dev, llc_bytes=8 * 2**20, llc_gbps=3 * dram), replace(dev, llc_bytes=4 * 2**20, llc_gbps=3 * dram)
    assert layer_gbps(program, big, len(dev.layers) - 1) == 3 * dram
    assert layer_gbps(program, small, len(dev.layers) - 1) == layer_gbps(program, dev, len(dev.layers) - 1) == dram
    assert all(layer_gbps(program, big, l) == dev.layers[l].bandwidth_gbps for l in range(len(dev.layers) - 1))
    plain, cached = dict(estimate(program, dev).load_seconds), dict(estimate(program, big).load_seconds)
    assert cached["DRAM"] == pytest.approx(plain["DRAM"] / 3)
    touch = buffer_touch_seconds(program, dev)
    assert touch > 0 and buffer_touch_seconds(program, big) == pytest.approx(touch / 3)
    assert cached["packing into L2"] == pytest.approx(plain["packing into L2"] - touch + touch / 3)
    scaled = ("DRAM", "packing into L2")
    assert {k: v for k, v in cached.items() if k not in scaled} == {k: v for k, v in plain.items() if k not in scaled}
    said = estimate(program, big)
    assert any(line.startswith("bandwidth of L1, L2 (") for line in said.measured + said.modelled)
    assert "bandwidth of the 8 MiB last-level cache, which serves DRAM's reads: the operator fits in 60% of it" in said.modelled
    gpu = device("v100")  # a GPU's bottom layer is never an LLC's
    assert layer_gbps(program, replace(gpu, llc_bytes=2**30, llc_gbps=1e5), len(gpu.layers) - 1) == gpu.layers[-1].bandwidth_gbps


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("row", [1, 2, 4, 8, 12, 16, 28])
def test_an_autovectorised_row_fills_its_pieces_over_its_loads_and_flops(dev, row):
    """A stride-2 sum over a window of 3 (a pooling's row), L1 rows of n = 56: a row of w >= 4
    fills w / (pieces x lanes) and loads 2 vectors a vector; a row of 1 or 2 is vectorised
    across the L1 row, its n outputs `lanes` at a time and the rest one by one, whatever w is.
    The flops of one add per point reach half the FMA peak. Closed forms."""
    lanes = dev.register_bytes // 4
    extent = 56
    e = plain_expr({"i": (extent, "spatial"), "k": (3, "reduce")}, [("A", [{"i": 2, "k": 1}]), ("out", [{"i": 1}])])
    assert autovector_axis(e, dev) == 0
    program = make_program(TileCalculus(e), dev, [(row, 3), (extent, 3), (extent, 3)], (True,) * 3, 0.0)
    if row >= 4:
        filled = row / (vector_pieces(row, lanes) * lanes)
    else:
        filled = extent / ((extent // lanes + extent % lanes) * lanes)
    flops = min(1.0, e.flops / (2 * extent * 3))
    assert autovector_efficiency(program, dev) == pytest.approx(filled / 2 * flops)
    assert compute_efficiency(program, dev) == autovector_efficiency(program, dev)
    # with a contiguous input the row is the template's own (`lane_axis`): not LLVM's
    contiguous = plain_expr({"i": (56, "spatial"), "k": (3, "reduce")}, [("A", [{"i": 1, "k": 1}]), ("out", [{"i": 1}])])
    assert autovector_axis(contiguous, dev) is None


def test_a_cpu_program_reads_through_every_cache_layer_a_gpu_only_through_those_it_stages():
    """A pooling whose L1 and L2 tiles are left uncached: on a CPU its register tiles still load
    from L1 (the first stage, overlapping the compute) and the L1 and L2 tiles from the layers
    below (adding); the same tiles on a GPU load straight from the bottom."""
    e = plain_expr({"i": (4096, "spatial"), "k": (3, "reduce")}, [("A", [{"i": 2, "k": 1}]), ("out", [{"i": 1}])])
    program = make_program(TileCalculus(e), AVX512, [(8, 3), (512, 3), (2048, 3)], (True, False, False), 0.0)
    assert hardware_caches(program, AVX512).cached == (True, True, True)
    est = estimate(program, AVX512)
    assert [name for name, _ in est.load_seconds][:3] == ["L1", "L2", "DRAM"]
    assert "compute: the row LLVM vectorises: lanes filled over the strided loads" in est.modelled
    assert any(line.startswith("bandwidth of L1, L2, DRAM") for line in est.measured + est.modelled)
    gpu = device("v100")
    staged = make_program(TileCalculus(matmul(256, 256, 256)), gpu, [(4, 4, 1), (64, 32, 16)], (True, False), 0.0)
    assert hardware_caches(staged, gpu) is staged


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("batches, rows, vectors", [(1, 4, 2), (3, 4, 1), (2, 6, 1), (4, 2, 1), (1, 1, 1)])
def test_a_batched_register_tile_pays_for_the_loads_its_batch_axis_adds(dev, batches, rows, vectors):
    """bmm C[b, i, j] = sum_k A[b, i, k] B[b, k, j], lanes along j: per reduction step a b x i x
    (vectors x lanes) tile issues b x i x vectors FMAs and loads b x vectors vectors of B plus
    b x i broadcasts of A, so its load ports allow min(1, FMAs / loads) of the FMA pipes (as many
    loads as FMAs per cycle). The compute term is lanes x latency covered x that."""
    lanes = dev.warp_size
    e = plain_expr(
        {"b": (4, "spatial"), "i": (12, "spatial"), "j": (4 * lanes, "spatial"), "k": (8, "reduce")},
        [("A", [{"b": 1}, {"i": 1}, {"k": 1}]), ("B", [{"b": 1}, {"k": 1}, {"j": 1}]), ("C", [{"b": 1}, {"i": 1}, {"j": 1}])],
    )
    tile = (batches, rows, vectors * lanes, 1)
    fmas, loads = batches * rows * vectors, batches * vectors + batches * rows
    assert (step_loads(e, dev, tile), load_coverage(e, dev, tile)) == (loads, pytest.approx(min(1.0, fmas / loads)))
    program = cpu_program(dev, e, tile)
    latency = min(1.0, fmas / dev.fma_accumulators)
    assert compute_efficiency(program, dev) == pytest.approx(latency * min(1.0, fmas / loads))
    assert estimate(program, dev).compute_seconds == pytest.approx(
        closed_compute_seconds(dev, e, program, latency * min(1.0, fmas / loads)))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("vectors", [2, 3])
def test_the_edge_tile_apart_adds_a_chain_of_fma_latencies_per_vector(dev, vectors):
    """A one-row matmul over 11 vectors and 6 lanes of columns (1024 K-steps) in register tiles of
    2 or 3 vectors and unit tiles of 6 vectors: the row's end cuts the last register tile of the
    second unit tile (`CpuPlan.edge_vectors`), and each unit tile's last register tile runs apart,
    each of its vectors a chain of 1024 FMAs at `fma_latency_cycles`; the two unit tiles go to two
    cores, so the busiest core adds one tile's chains, at the clock the peak implies. The compute
    term is the micro-kernel's, as for the whole row of 12 vectors; a whole row, a tile of one
    vector and a spec without FMA facts add nothing."""
    def one_row(spec, n, *tiles):
        return make_program(TileCalculus(plain_matmul(1, n, 1024)), spec, list(tiles), (True,) * len(tiles), 0.0)

    lanes = dev.warp_size
    program = one_row(dev, 11 * lanes + 6, (1, vectors * lanes, 1), (1, 6 * lanes, 64), (1, 6 * lanes, 1024))
    assert cpu_plan(program, dev).edge_vectors
    ghz = dev.peak("float32") / (dev.compute_units * dev.fma_pipes * lanes * 2)
    cycles = -(-2 // dev.compute_units) * vectors * 1024 * dev.fma_latency_cycles
    assert edge_chain_seconds(program, dev) == pytest.approx(cycles / (ghz * 1e9))
    assert edge_seconds(program, dev) > edge_chain_seconds(program, dev) > 0
    whole = one_row(dev, 12 * lanes, (1, vectors * lanes, 1), (1, 6 * lanes, 64), (1, 6 * lanes, 1024))
    assert not cpu_plan(whole, dev).edge_vectors and edge_chain_seconds(whole, dev) == 0.0
    assert compute_efficiency(program, dev) == pytest.approx(compute_efficiency(whole, dev))
    single = one_row(dev, 11 * lanes + 6, (1, lanes, 1), (1, 6 * lanes, 64), (1, 6 * lanes, 1024))
    assert not cpu_plan(single, dev).edge_vectors and edge_chain_seconds(single, dev) == 0.0
    tl = TINY_CPU.warp_size
    tiny = one_row(TINY_CPU, 11 * tl + 6, (1, 3 * tl, 1), (1, 6 * tl, 64), (1, 6 * tl, 1024))
    assert cpu_plan(tiny, TINY_CPU).edge_vectors and edge_chain_seconds(tiny, TINY_CPU) == 0.0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_cut_register_tiles_store_their_elements_one_at_a_time(dev):
    """213 rows x K 13 in register tiles of 18 rows x 2 vectors, unit tiles of 108 rows (two
    along the rows: the end lies in the second) over a row of 100 vectors and 9 columns in one
    unit tile: the 15 rows of the cut tiles store each of their 15 x N elements alone, on the
    core holding the second unit tile, at GUARDED_STORE_CYCLES and the clock the peak implies.
    Nothing where the rows divide (216), where the row ends on a whole tile (no lane test), or
    where one unit tile spans the rows (the end a constant)."""
    lanes = dev.warp_size

    def program(m, n, unit_rows):
        tiles = ((18, 2 * lanes, 1), (18, 2 * lanes, 13), (unit_rows, 51 * 2 * lanes, 13))
        return make_program(TileCalculus(plain_matmul(m, n, 13)), dev, tiles, (True,) * 3, 0.05)

    n = 50 * 2 * lanes + 9
    cut = program(213, n, 108)
    plan = cpu_plan(cut, dev)
    assert plan.padded_tails and plan.direct_stores
    ghz = dev.peak("float32") / (dev.compute_units * dev.fma_pipes * lanes * 2)
    assert guarded_store_seconds(cut, dev) == pytest.approx(15 * n * GUARDED_STORE_CYCLES / (ghz * 1e9))
    assert guarded_store_seconds(program(216, n, 108), dev) == 0.0
    assert guarded_store_seconds(program(213, 51 * 2 * lanes, 108), dev) == 0.0
    assert guarded_store_seconds(program(213, n, 216), dev) == 0.0


def test_load_coverage_is_1_without_a_chain_a_lane_axis_or_fma_facts():
    """relu (no reduction), a stride-2 window (scalar code), a spec without FMA facts (TINY_CPU):
    1. A reduction along its lanes loads one vector per accumulator: 1 (gemv's x adds one more
    per row of vectors: 14 rows of A's 1 vector + 1 of x, 14 / 15)."""
    relu = expr("relu", shape=(17, 11, 3))
    assert load_coverage(relu, AVX2, (1, 1, 3)) == 1.0
    strided = plain_expr({"i": (64, "spatial"), "k": (3, "reduce")}, [("A", [{"i": 2, "k": 1}]), ("out", [{"i": 1}])])
    assert load_coverage(strided, AVX2, (8, 3)) == 1.0
    assert load_coverage(matmul(64, 64, 64), TINY_CPU, (2, 16, 1)) == 1.0
    total = plain_expr({"i": (640, "reduce")}, [("A", [{"i": 1}]), ("out", [])])
    assert load_coverage(total, AVX2, (80,)) == 1.0
    gemv = plain_expr({"i": (64, "spatial"), "k": (64, "reduce")}, [("A", [{"i": 1}, {"k": 1}]), ("x", [{"k": 1}]), ("y", [{"i": 1}])])
    assert (step_loads(gemv, AVX2, (14, 8)), load_coverage(gemv, AVX2, (14, 8))) == (15, pytest.approx(14 / 15))


# -- Vortex's hybrid analyzer (issue 14): a register micro-kernel measured by calibration gives
# the compute term; the rest stays modelled. Checked on generated specs, never this machine.


def with_kernels(dev, *kernels, calibrated=False):
    """`dev` with measured micro-kernels ((dtype, rows, cols, GFLOP/s) each)."""
    return replace(dev, micro_kernels=tuple(MicroKernel(*k) for k in kernels), calibrated=calibrated)


def test_a_measured_micro_kernel_gives_the_compute_term():
    """compute = padded flops / (measured GFLOP/s x busy units): the efficiency is the measured
    rate over the peak (AVX2's generated spec: 200 GFLOP/s), whatever lanes and chains say."""
    dev = with_kernels(AVX2, ("float32", 6, 16, 120.0), ("float32", 2, 8, 31.0))
    e = matmul(64, 64, 64)
    for tile, gflops in (((6, 16, 1), 120.0), ((2, 8, 1), 31.0), ((6, 16, 4), 120.0)):
        program = cpu_program(dev, e, tile)
        assert compute_efficiency(program, dev) == pytest.approx(gflops / 200.0)
        est = estimate(program, dev)
        assert est.compute_seconds == pytest.approx(closed_compute_seconds(dev, e, program, gflops / 200.0))
        padded = prod(ceil(x / t) * t for x, t in zip(e.extents, program.unit_tile))
        busy = min(1.0, program.grid / dev.compute_units)
        assert est.compute_seconds == pytest.approx(e.flops * padded / prod(e.extents) / (gflops * 1e9 * busy))
        shape = f"{tile[0]}x{tile[1]}"
        assert est.measured[0] == f"compute: level-0 micro-kernel {shape} float32, {gflops:g} GFLOP/s"
        assert not any(part.startswith("compute") or part.startswith("peak") for part in est.modelled)


def test_without_its_measured_micro_kernel_the_compute_term_is_analytic():
    """A tile with no measurement of its shape or dtype keeps simd_utilisation x
    latency_coverage (4 x 16 on AVX2: 8 of 10 chains), at most the fastest measured micro-kernel's
    share of the peak (`measured_ceiling`: 6 x 16 at 120 of 200 GFLOP/s), and says so."""
    dev = with_kernels(AVX2, ("float32", 6, 16, 120.0), ("float64", 4, 16, 50.0))
    program = cpu_program(dev, matmul(64, 64, 64), (4, 16, 1))
    assert compute_efficiency(program, dev) == pytest.approx(8 / 10 * 120 / 200)
    est = estimate(program, dev)
    assert est.compute_seconds == pytest.approx(closed_compute_seconds(dev, program.expr, program, 8 / 10 * 120 / 200))
    assert ("compute: SIMD lanes filled x FMA latency covered x 0.6, the fastest measured micro-kernel's share of "
            "the peak, no measured 4x16 micro-kernel") in est.modelled
    assert est.measured == ()
    without = estimate(program, AVX2)  # the spec without kernels: lanes and chains alone, nothing said about kernels
    assert without.compute_seconds == pytest.approx(closed_compute_seconds(AVX2, program.expr, program, 8 / 10))
    assert without.modelled[0] == "compute: SIMD lanes filled x FMA latency covered"


@pytest.mark.parametrize("dev", [AVX2, AVX512])
def test_an_unmeasured_tile_reaches_at_most_the_fastest_measured_micro_kernel(dev):
    """`measured_ceiling` = min(1, fastest measured micro-kernel of the dtype / peak): 1 without
    a measurement in the dtype, and where one reached the peak (its noise above it included);
    the analytic figure of an unmeasured tile is multiplied by it, a measured tile keeps its own."""
    e = matmul(64, 64, 64)
    peak = dev.peak("float32")
    lanes = dev.register_bytes // 4
    assert measured_ceiling(e, dev) == 1.0
    assert measured_ceiling(e, with_kernels(dev, ("float64", 6, lanes, 0.1 * peak))) == 1.0  # another dtype
    assert measured_ceiling(e, with_kernels(dev, ("float32", 6, lanes, 1.05 * peak))) == 1.0
    slow = with_kernels(dev, ("float32", 6, lanes, 0.9 * peak), ("float32", 2, lanes, 0.4 * peak))
    assert measured_ceiling(e, slow) == pytest.approx(0.9)
    tile = (4, lanes, 1)
    analytic = compute_efficiency(cpu_program(dev, e, tile), dev)
    assert compute_efficiency(cpu_program(slow, e, tile), slow) == pytest.approx(0.9 * analytic)
    assert compute_efficiency(cpu_program(slow, e, (2, lanes, 1)), slow) == pytest.approx(0.4)  # measured: its own


@pytest.mark.parametrize("dev", [AVX2, AVX512])
def test_an_unmeasured_tile_covers_its_chains_as_the_measured_tiles_of_as_many_accumulators(dev):
    """`latency_coverage` of a tile of the measured kind whose shape calibration did not run (a
    2 x 5-vector matmul tile) = the fastest measured micro-kernel of as many accumulators over the
    fastest of all (`measured_chains`), not Little's law's step; a measured kernel that waits on
    its loads (10 x 1 vector: 10 FMAs, 11 loads a step) does not count; elsewhere the step stays."""
    lanes = dev.register_bytes // 4
    peak = dev.peak("float32")
    need = dev.fma_accumulators
    e = matmul(64, 5 * lanes, 64)
    loaded = with_kernels(dev, ("float32", 6, 2 * lanes, 0.9 * peak), ("float32", 10, lanes, 0.3 * peak))
    assert cpu_compute.measured_chains("float32", loaded) == {12: 1.0}
    assert cpu_compute.latency_coverage(e, loaded, (2, 5 * lanes, 1)) == pytest.approx(min(1.0, 10 / need))
    dev = with_kernels(dev, ("float32", 6, 2 * lanes, 0.9 * peak), ("float32", 5, 2 * lanes, 0.81 * peak),
                       ("float32", 10, lanes, 0.3 * peak))
    assert cpu_compute.measured_chains("float32", dev) == {12: 1.0, 10: pytest.approx(0.9)}
    program = cpu_program(dev, e, (2, 5 * lanes, 1))
    assert cpu_compute.latency_coverage(e, dev, (2, 5 * lanes, 1)) == pytest.approx(0.9)
    assert compute_efficiency(program, dev) == pytest.approx(0.9 * 0.9)  # x measured_ceiling: 6 x 2 vectors at 0.9
    assert "compute: SIMD lanes filled x FMA latency covered as measured with 10 accumulators x 0.9, the fastest " \
           f"measured micro-kernel's share of the peak, no measured 2x{5 * lanes} micro-kernel" in estimate(program, dev).modelled
    assert cpu_compute.latency_coverage(e, dev, (1, 5 * lanes, 1)) == pytest.approx(min(1.0, 5 / need))  # 5: none measured
    gemv = plain_expr({"i": (64, "spatial"), "k": (64, "reduce")}, [("A", [{"i": 1}, {"k": 1}]), ("x", [{"k": 1}]), ("y", [{"i": 1}])])
    assert cpu_compute.latency_coverage(gemv, dev, (10, lanes)) == pytest.approx(min(1.0, 10 / need))  # not that kind
    assert cpu_compute.measured_chains("float64", dev) == {}


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_depthwise_tile_over_its_registers_spills_and_one_spanning_its_window_overlaps_its_chains(dev):
    """`spill_coverage`: a 3 x 3 depthwise tile of r rows x v vectors needs r v + v + 9
    registers (its weights kept live); past the budget each register short spills an
    accumulator: a / (a + over); past the budget on its own count, only the weights' 8 more
    registers count. `latency_coverage`: a tile spanning its whole reduction (the
    window) ends its chains with it, and the next tile's start while they run: a +
    OVERLAPPED_FMAS / 9 chains; a tile of one window row keeps Little's law's step."""
    lanes, budget, need = dev.warp_size, register_budget(dev), dev.fma_accumulators
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    fits = (1, 1, 2, 2 * lanes, 3, 3)
    assert cpu_compute.spill_coverage(dw, dev, fits) == 1.0
    rows = (budget - 3) // 2  # 2 vectors a row: rows x 2 accumulators + 2 + 1 fit the budget, + 2 + 9 do not
    over = rows * 2 + 2 + 9 - budget
    assert over > 0 and rows * 2 + 2 + 1 <= budget
    spilling = (1, 1, rows, 2 * lanes, 3, 3)
    assert cpu_compute.spill_coverage(dw, dev, spilling) == pytest.approx(2 * rows / (2 * rows + over))
    program = cpu_program(dev, dw, spilling)
    phrase = f"x {cpu_compute.spill_coverage(dw, dev, spilling):.3g} for the accumulators it spills"
    assert any(phrase in said for said in estimate(program, dev).modelled)
    past = (1, 1, budget, 2 * lanes, 3, 3)
    assert cpu_compute.spill_coverage(dw, dev, past) == pytest.approx(2 * budget / (2 * budget + 8))
    assert cpu_compute.OVERLAPPED_FMAS == 64
    assert cpu_compute.latency_coverage(dw, dev, (1, 1, 2, lanes, 3, 3)) == pytest.approx(min(1.0, (2 + 64 / 9) / need))
    assert cpu_compute.latency_coverage(dw, dev, (1, 1, 2, lanes, 1, 3)) == pytest.approx(2 / need)
    assert cpu_compute.latency_coverage(matmul(64, 64, 64), dev, (1, lanes, 1)) == pytest.approx(1 / need)  # K in steps


def test_a_measurement_within_the_noise_above_peak_counts_as_peak():
    dev = with_kernels(AVX2, ("float32", 6, 16, 210.0))  # 1.05 x the 200 GFLOP/s peak
    assert compute_efficiency(cpu_program(dev, matmul(64, 64, 64), (6, 16, 1)), dev) == 1.0


def test_micro_kernel_shape_is_rows_by_lane_columns_of_the_measured_kind():
    """rows = the other spatial axes' register sizes, columns = the lane axis's, for a
    multiply-add reduction with one streamed input shared by all rows and one broadcast input."""
    mm = matmul(64, 64, 64)
    assert micro_kernel_shape(mm, AVX2, (6, 16, 8)) == (6, 16)
    # out[f, w] = sum_{c, s} data[c, w + s] * kernel[f, c, s]: the filters stream along the lanes
    # (axes.filter_axis), the output columns are rows, each broadcasting one data element
    conv = plain_expr(
        {"f": (16, "spatial"), "w": (64, "spatial"), "c": (8, "reduce"), "s": (3, "reduce")},
        [("data", [{"c": 1}, {"w": 1, "s": 1}]), ("kernel", [{"f": 1}, {"c": 1}, {"s": 1}]), ("out", [{"f": 1}, {"w": 1}])],
    )
    assert micro_kernel_shape(conv, AVX2, (16, 4, 1, 1)) == (4, 16)
    # batched: B[b, k, j] differs per batch, so a tile of 2 batches loads two rows: another kernel
    bmm = plain_expr(
        {"b": (4, "spatial"), "i": (64, "spatial"), "j": (64, "spatial"), "k": (64, "reduce")},
        [("A", [{"b": 1}, {"i": 1}, {"k": 1}]), ("B", [{"b": 1}, {"k": 1}, {"j": 1}]), ("C", [{"b": 1}, {"i": 1}, {"j": 1}])],
    )
    assert micro_kernel_shape(bmm, AVX2, (1, 6, 16, 1)) == (6, 16)
    assert micro_kernel_shape(bmm, AVX2, (2, 3, 16, 1)) is None
    # no lane axis along the output (gemv runs its lanes along k), no reduction, one input
    gemv = plain_expr({"i": (64, "spatial"), "k": (64, "reduce")}, [("A", [{"i": 1}, {"k": 1}]), ("x", [{"k": 1}]), ("y", [{"i": 1}])])
    assert micro_kernel_shape(gemv, AVX2, (4, 16)) is None
    assert micro_kernel_shape(expr("relu", shape=(17, 11, 3)), AVX2, (1, 1, 3)) is None
    total = plain_expr({"i": (8, "spatial"), "k": (640, "reduce")}, [("A", [{"i": 1}, {"k": 1}]), ("out", [{"i": 1}])])
    assert micro_kernel_shape(total, AVX2, (1, 16)) is None
    # one flop per point (a sum of differences has two, but a max-reduction one): not a multiply-add
    reduce = expr("reduce_mean", shape=(256, 4096), axes=(1,))
    assert reduce.flops != 2 * prod(reduce.extents) and micro_kernel_shape(reduce, AVX2, (8, 16)) is None


def test_the_estimate_says_what_was_measured_and_what_modelled():
    e = matmul(64, 64, 64)
    program = cpu_program(AVX2, e, (6, 16, 1))
    plain = estimate(program, AVX2)
    assert plain.measured == ()
    assert plain.modelled == (
        "compute: SIMD lanes filled x FMA latency covered",
        "peak compute (the spec's, not calibrated)",
        "bandwidth of L1, L2, DRAM (the spec's, not calibrated)",
        "traffic per layer",
        "panel copies of the packed inputs",  # 6 rows leave a tail of 64: padded, so packed
        "scale-out over 2 cores",
    )
    calibrated = estimate(program, with_kernels(AVX2, ("float32", 6, 16, 120.0), calibrated=True))
    assert calibrated.measured == (
        "compute: level-0 micro-kernel 6x16 float32, 120 GFLOP/s",
        "bandwidth of L1, L2, DRAM (calibrated)",
    )
    assert calibrated.modelled == ("traffic per layer", "panel copies of the packed inputs", "scale-out over 2 cores")
    doc = json.loads(json.dumps(calibrated.to_dict()))
    assert (doc["measured"], doc["modelled"]) == (list(calibrated.measured), list(calibrated.modelled))
    gpu = constructed("v100", "mm-1024").candidates[0].estimate
    assert gpu.measured == () and gpu.modelled[:2] == ("compute: warps per scheduler", "peak compute (the spec's, not calibrated)")
    assert gpu.modelled[-1] == "scale-out over 80 units"


def test_a_cpu_register_tile_under_a_short_k_tile_pays_for_its_accumulators():
    """On a CPU the register tile's accumulators go out to L1 and back at every L1 K-step:
    mm-512 with L1 K tiles of 16 moves 2 x 31 x the 1 MiB output more through L1 than with
    K tiles of 512 (whose accumulators go straight to the output, where the short tiles' pass
    through the unit tile's buffer), and the prediction grows by exactly that traffic over
    L1's bandwidth when the L1 stage binds. A GPU thread keeps its accumulators over the whole
    K loop: no change."""
    e = matmul(512, 512, 512)
    calc = TileCalculus(e)
    cpu = TINY_CPU

    def program(l1_k):
        return make_program(calc, cpu, [(4, 16, 1), (32, 64, l1_k), (128, 256, 512)], (True,) * 3, 0.0)

    short, long = estimate(program(16), cpu), estimate(program(512), cpu)
    # plus the output buffer's passes: the K tile of 512 is the whole reduction, stored directly
    assert buffer_bytes(program(512), cpu) == 0
    extra = 2 * 31 * 512 * 512 * 4 + buffer_bytes(program(16), cpu)
    home = cpu.layers[accumulator_home(program(16), cpu)].name
    assert home == "L2"  # a 128 x 256 unit tile's 128 KiB of outputs: more than L1 holds
    assert dict(short.bytes_per_layer)[home] - dict(long.bytes_per_layer)[home] == extra
    assert dict(short.load_seconds)[home] - dict(long.load_seconds)[home] == pytest.approx(
        extra / (cpu.layer(home).bandwidth_gbps * 1e9 * min(1.0, program(16).grid / cpu.compute_units)))
    assert short.predicted_seconds > long.predicted_seconds
    gpu = device("v100")
    g = matmul(1024, 1024, 1024)
    gcalc = TileCalculus(g)
    tiles = [(4, 4, 1), (64, 64, 8)]
    gp = make_program(gcalc, gpu, tiles, (True, True), 0.0)
    assert dict(estimate(gp, gpu).bytes_per_layer) == {
        gpu.layers[source_layer(gp, l, len(gpu.layers))].name: gcalc.traffic_bytes(t) for l, t in enumerate(tiles)
    }


def test_cpu_transfers_below_the_first_layer_add_to_the_overlapped_compute():
    """CPU: max(compute, loads from L1, a plain projection's inputs' loads from L2) + the rest
    of L2's (the accumulators' trips), combined with the loads from DRAM, all but
    BOTTOM_ADDED_SHARE of the shorter overlapping the longer (closed form on a generated spec); the
    same program on a spec whose DRAM is 4x slower predicts the slower stream plus that share of
    the core, more than twice the old DRAM time more, where a pipelined maximum would hide the
    stream behind the compute. A conv's nest reads windows: its L2 transfers add whole."""
    e = matmul(256, 256, 256)
    calc = TileCalculus(e)
    p = make_program(calc, TINY_CPU, [(4, 16, 1), (32, 64, 64), (64, 128, 256)], (True,) * 3, 0.0)
    est = estimate(p, TINY_CPU)
    loads = dict(est.load_seconds)
    imbalance = ceil(p.grid / TINY_CPU.compute_units) * TINY_CPU.compute_units / p.grid
    busy = min(1.0, p.grid / TINY_CPU.compute_units)
    l2 = TINY_CPU.layer("L2")
    inputs = cache_traffic(p, TINY_CPU, 1) / (l2.bandwidth_gbps * 1e9 * busy)  # the L1 tiles' A and B
    trips = loads["L2"] - inputs  # the unit-tile buffer's accumulator trips, held in L2
    assert hidden_source(p, TINY_CPU) == 2 and inputs > 0 and trips > 0
    core = max(est.compute_seconds, loads["L1"], inputs) + trips

    def combined(core, streamed):  # all but BOTTOM_ADDED_SHARE of the shorter overlaps the longer
        return max(core, streamed) + BOTTOM_ADDED_SHARE * min(core, streamed)

    assert loads["DRAM"] < core < 4 * loads["DRAM"]  # the core the longer, then the stream
    assert est.predicted_seconds == pytest.approx(combined(core, loads["DRAM"]) * imbalance + packing_seconds(p, TINY_CPU))
    slow = replace(TINY_CPU, layers=tuple(
        replace(l, bandwidth_gbps=l.bandwidth_gbps / 4) if l.name == "DRAM" else l for l in TINY_CPU.layers))
    assert estimate(p, slow).predicted_seconds == pytest.approx(
        combined(core, 4 * loads["DRAM"]) * imbalance + packing_seconds(p, slow))
    assert estimate(p, slow).predicted_seconds > est.predicted_seconds + 2 * loads["DRAM"] * imbalance
    # an L2 slow enough that the inputs' transfers outlast the compute bounds the core by them
    crawl = replace(TINY_CPU, layers=tuple(replace(l, bandwidth_gbps=l.bandwidth_gbps / 64) if l.name == "L2" else l
                                           for l in TINY_CPU.layers))
    slow_est, slow_loads = estimate(p, crawl), dict(estimate(p, crawl).load_seconds)
    assert 64 * inputs > max(slow_est.compute_seconds, slow_loads["L1"])
    assert slow_est.predicted_seconds == pytest.approx(
        (64 * inputs + 64 * trips + BOTTOM_ADDED_SHARE * slow_loads["DRAM"]) * imbalance + packing_seconds(p, crawl))
    nest = constructed_on(WORKLOADS["conv"](), TINY_CPU)
    assert hidden_source(nest, TINY_CPU) is None
    nest_loads = dict(estimate(nest, TINY_CPU).load_seconds)
    nest_est = estimate(nest, TINY_CPU)
    assert nest_est.predicted_seconds >= (max(nest_est.compute_seconds, nest_loads["L1"]) + nest_loads["L2"]) * (1 - 1e-12)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_lanes_register_tile_pays_its_loads_after_its_fmas(dev):
    """`combine_stages` on the lanes path (gemv: a dot product per output along K, both inputs
    read along the lanes): the register loads from L1 add to the FMAs, and the inputs' hidden
    transfers into L1 overlap that sum; off it they overlap the FMAs; the layers further down
    add either way, the bottom one in part (generated AVX2-like and AVX-512-like specs)."""
    gemv = constructed_on(expr("gemv", M=4096, K=4096), dev)
    assert cpu_plan(gemv, dev).path == "lanes"
    through = hardware_caches(gemv, dev)  # as `price` combines them
    assert dev.layers[source_layer(through, 0, len(dev.layers))].name == "L1"
    loads = {"L1": 3.0, "DRAM": 2.5}
    added = BOTTOM_ADDED_SHARE * 2.5  # a gemv's inputs are plain projections (test below)
    assert combine_stages(through, dev, 2.0, loads, 1.0, lanes=True) == pytest.approx(2.0 + 3.0 + added)
    assert combine_stages(through, dev, 2.0, loads, 6.0, lanes=True) == pytest.approx(6.0 + added)
    assert combine_stages(through, dev, 2.0, loads, 1.0) == pytest.approx(3.0 + added)
    assert combine_stages(through, dev, 4.0, loads, 1.0) == pytest.approx(4.0 + added)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_plain_projection_hides_part_of_its_bottom_layer_transfers(dev):
    """`combine_stages`: where every input is a plain projection (a matmul), the core's time
    (the layers between the first and the bottom adding to it whole) and the transfers from the
    bottom layer overlap but for BOTTOM_ADDED_SHARE of the shorter, whichever that is; a
    pooling's window reads add the bottom layer's whole (generated AVX2-like and AVX-512-like
    specs)."""
    assert 0.0 < BOTTOM_ADDED_SHARE < 1.0
    mm = hardware_caches(constructed_on(matmul(96, 130, 200), dev), dev)
    first = dev.layers[source_layer(mm, 0, len(dev.layers))].name
    bottom = dev.layers[-1].name
    assert plain_projections(mm.expr) and first != bottom
    assert combine_stages(mm, dev, 6.0, {first: 1.0, "L2": 0.5, bottom: 4.0}) == pytest.approx(
        6.0 + 0.5 + BOTTOM_ADDED_SHARE * 4.0)
    assert combine_stages(mm, dev, 2.0, {first: 1.0, "L2": 0.5, bottom: 40.0}) == pytest.approx(
        40.0 + BOTTOM_ADDED_SHARE * 2.5)
    assert combine_stages(mm, dev, 2.0, {first: 3.0, bottom: 40.0}) > combine_stages(mm, dev, 2.0, {first: 1.0, bottom: 40.0})
    pool = hardware_caches(constructed_on(expr("avgpool", N=16, C=48, H=48, W=48, K=3, stride=2, pad=1), dev), dev)
    assert not plain_projections(pool.expr)
    first = dev.layers[source_layer(pool, 0, len(dev.layers))].name
    assert combine_stages(pool, dev, 2.0, {first: 1.0, bottom: 4.0}) == 2.0 + 4.0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_an_input_read_once_over_more_rows_than_the_prefetchers_follow_waits_a_latency_a_line(dev):
    """`unfollowed_seconds`: 12 x 2048 x 4096 in register tiles of its 12 rows, one vector wide,
    reads B (32 MB, past the 1 MiB L2) once, in place. Under unit tiles of 256 of B's rows, more
    than PREFETCH_ROWS, each of its lines waits the bottom layer's latency, with as many in flight
    as `lines_in_flight` says: a step's 1 load of B, 12 broadcasts of A and 12 FMAs, 512 / 25
    steps in the window, each a line, at most FILL_BUFFERS. A 19-row tile's steps (39) leave
    fewer. Under 32 rows only each row's first RAMP_LINES lines of its 32 in the unit tile are
    missed (`axes.unramped_share`), and the estimate ranks that program first, unless the spec
    says its cores follow 16 rows (`DeviceSpec.prefetch_rows`, a Zen 3's) (generated AVX2-like
    and AVX-512-like specs)."""
    e = matmul(12, 4096, 2048)
    calc, lanes = TileCalculus(e), dev.warp_size

    def program(rows, m=12, mm=e):
        return make_program(TileCalculus(mm), dev, [(m, lanes, 1), (m, lanes, rows), (m, 512, rows)],
                            (True, True, True), 0.05)

    deep, shallow = program(256), program(32)
    assert 32 <= PREFETCH_ROWS < 256 and (WINDOW_UOPS, FILL_BUFFERS) == (512, 16)
    assert all("B" not in cpu_plan(p, dev).packed for p in (deep, shallow))
    assert lines_in_flight(deep, dev, 1) == min(16, 512 / 25) == 16
    assert lines_in_flight(program(256, 19, matmul(19, 4096, 2048)), dev, 1) == pytest.approx(512 / 39)
    bottom = dev.layers[-1]
    lines = 2048 * 4096 * 4 / bottom.transaction_bytes
    assert unfollowed_seconds(deep, dev, 1.0) == pytest.approx(
        lines * bottom.latency_ns * 1e-9 / (16 * dev.compute_units))
    ramped = RAMP_LINES / (512 * 4 / bottom.transaction_bytes)  # runs of 512 floats: 32 lines
    assert unfollowed_seconds(shallow, dev, 1.0) == pytest.approx(ramped * unfollowed_seconds(deep, dev, 1.0))
    assert estimate(deep, dev).predicted_seconds > estimate(shallow, dev).predicted_seconds
    zen3 = replace(dev, prefetch_rows=16)  # a core whose prefetchers follow 16 rows: 32 are too many
    assert unfollowed_seconds(shallow, zen3, 1.0) == unfollowed_seconds(deep, dev, 1.0)
    assert unfollowed_seconds(program(16), zen3, 1.0) == unfollowed_seconds(shallow, dev, 1.0)
    check_consistent(calc, dev, deep, estimate(deep, dev))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_runs_too_short_for_the_prefetchers_are_missed_for_their_first_ramp_lines(dev):
    """`axes.unramped_share` and `unfollowed_seconds`: 17 x 347 x 2816 (a 1x1 conv's GEMM of 17
    filters over 347 channels, its data B, 3.9 MB, past the 1 MiB L2, read once in place) in
    register tiles of the 17 rows, one vector wide (a line a visit), 32 of B's rows walked in
    turn. Unit tiles 64, 128, 256 and 704 columns wide run each row for 4, 8, 16 and 44 lines: all,
    all, half and 8 / 44 of the lines are missed, each the bottom layer's latency with
    `lines_in_flight` at a time. None where the unit tile spans the rows (one run in memory) or a
    visit reads FOLLOWED_RUN_BYTES (two vectors on AVX-512). The estimate puts the 704-wide
    program before the 64-wide (generated AVX2-like and AVX-512-like specs)."""
    e, lanes = matmul(17, 2816, 347), dev.warp_size
    bottom = dev.layers[-1]

    def program(width, vectors=1):
        return make_program(TileCalculus(e), dev, [(17, lanes * vectors, 1), (17, lanes * vectors, 32), (17, width, 32)],
                            (True, True, True), 0.05)

    def share(p):
        return unramped_share(e, dev, 1, p.register_tile, p.tiles[1], p.unit_tile)

    assert RAMP_LINES == 8 and read_once_below(e, dev, (17, lanes, 1)) == (1,)
    assert [share(program(w)) for w in (64, 128, 256, 704, 2816)] == [1.0, 1.0, 0.5, 8 / 44, 0.0]
    if lanes == 16:
        assert share(program(256, vectors=2)) == 0.0  # 128-byte visits: the adjacent-line pair is followed
    lines = 347 * 2816 * 4 / bottom.transaction_bytes
    each = lines * bottom.latency_ns * 1e-9 / (lines_in_flight(program(64), dev, 1) * dev.compute_units)
    assert unfollowed_seconds(program(64), dev, 1.0) == pytest.approx(each)
    assert unfollowed_seconds(program(704), dev, 1.0) == pytest.approx(each * 8 / 44)
    assert unfollowed_seconds(program(2816), dev, 1.0) == 0.0
    assert estimate(program(704), dev).predicted_seconds < estimate(program(64), dev).predicted_seconds
    check_consistent(TileCalculus(e), dev, program(704), estimate(program(704), dev))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_model_operator_reads_its_input_from_below_on_its_first_pass(dev):
    """`unfollowed_seconds` of a model's operator: the GEMM of a 1 x 1 conv, 512 to 128 channels
    over 784 pixels, its filters A a weight (`TensorExpr.constants`), its image B (1.6 MB, within
    the L2) written by the kernel before (`axes.written_before`). Under unit tiles of 256 of B's
    rows, read a vector at a visit, each of B's lines waits the bottom layer's latency once,
    `lines_in_flight` at a time. The operator on its own (no constants) finds B in the L2 and pays
    nothing, nor does a program that copies B into panels first (one that stages its L2 tile),
    and Roller's growth is not capped for it (`axes.unfollowed_inputs`: read once only)
    (generated AVX2-like and AVX-512-like specs)."""
    lanes, alone = dev.warp_size, matmul(128, 784, 512)
    model_op = replace(alone, constants=("A",))

    def program(e, n, staged):  # L2 tile staged: B copied into panels; not: read in place
        return make_program(TileCalculus(e), dev, [(16, lanes, 1), (16, lanes, 16), (64, n, 256)], (True, True, staged), 0.05)

    walked, copied = program(model_op, 112, False), program(model_op, 112, True)
    tiles = (walked.register_tile, walked.tiles[1], walked.unit_tile)
    assert written_before(model_op) == (1,) and written_before(alone) == ()
    assert unfollowed_reads(model_op, dev, *tiles) == (1,) and unfollowed_reads(alone, dev, *tiles) == ()
    assert unfollowed_inputs(model_op, dev, *tiles) == ()
    assert "B" not in cpu_plan(walked, dev).packed and "B" in cpu_plan(copied, dev).packed
    bottom = dev.layers[-1]
    lines = 512 * 784 * 4 / bottom.transaction_bytes
    assert unfollowed_seconds(walked, dev, 1.0) == pytest.approx(
        lines * bottom.latency_ns * 1e-9 / (lines_in_flight(walked, dev, 1) * dev.compute_units))
    assert unfollowed_seconds(program(alone, 112, False), dev, 1.0) == 0.0
    assert unfollowed_seconds(copied, dev, 1.0) == 0.0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_model_operator_without_a_lanes_micro_kernel_is_priced_without_its_first_pass(dev):
    """A model's pooling (its `constants` naming a parameter, not an input, as a layer norm's do)
    reads its input as the kernel before wrote it (`axes.written_before`), but its nest has no
    lanes micro-kernel (`lane_axis` None) whose steps `lines_in_flight` counts: every candidate
    is priced, none with a first pass (`axes.unfollowed_reads`) (generated AVX2-like and
    AVX-512-like specs)."""
    pool = replace(expr("avgpool", N=16, C=48, H=48, W=48, K=3, stride=2, pad=1), constants=("scale",))
    assert written_before(pool) == (0,) and lane_axis(pool, dev) is None
    for candidate in construct(pool, dev).candidates:
        p = candidate.program
        assert unfollowed_reads(pool, dev, p.register_tile, p.tiles[1], p.unit_tile) == ()
        assert estimate(p, dev).predicted_seconds > 0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_only_plain_projections_stream_their_inputs_into_l1_under_the_compute(dev):
    """`hidden_source`: the layer under the L1 (L2) for an operator whose every input is a plain
    projection (matmul, batch matmul, a conv seen as the GEMM over its pixels), none for one that
    reads windows (a conv's nest, a pooling) or a device with nothing between L1 and its bottom
    layer (generated AVX2-like and AVX-512-like specs)."""
    mm = constructed_on(matmul(96, 130, 200), dev)
    assert hidden_source(mm, dev) == [l.name for l in dev.layers].index("L2")
    pool = constructed_on(expr("avgpool", N=16, C=48, H=48, W=48, K=3, stride=2, pad=1), dev)
    assert hidden_source(pool, dev) is None
    assert hidden_source(constructed_on(WORKLOADS["conv"](), dev), dev) is None
    flat = replace(dev, layers=tuple(l for l in dev.layers if l.name != "L2"))
    assert hidden_source(replace(mm, tiles=mm.tiles[:2], cached=mm.cached[:2]), flat) is None


def test_accumulators_live_in_the_first_cache_that_holds_the_outputs_and_the_tiles_streaming_through():
    """The CPU template accumulates into one buffer of the unit tile's outputs, kept in the first
    layer that holds it with that layer's tile's inputs (closed forms, fp32 matmul 1024^3, on
    TINY_CPU's 32 KiB L1 and 1 MiB L2). Under a 4 x 16 x 64 L1 tile (1 KiB of A, 4 KiB of B):
    64 x 64 outputs (16 KiB) + 5 KiB fit L1; 96 x 64 (24 KiB) + 5 KiB as well, but not beside a
    16 x 64 x 64 L1 tile's 20 KiB; 64 x 128 (32 KiB) leaves no room in L1 and goes to L2 with
    its unit tile's 256 + 512 KiB of panels (800 KiB); 256 x 256 x 128 (256 + 256 KiB) fits L2,
    256 x 256 x 512 (256 + 1024 KiB) does not and goes to DRAM, as 1024 x 1024 (4 MiB) does. A
    layer keeps them in 15/16 of its capacity: 266 x 384 x 192 (887 KiB) stays in L2, 266 x 576 x
    128 (1020 KiB, within the 1024 but above 960) goes to DRAM."""
    e = matmul(1024, 1024, 1024)
    calc = TileCalculus(e)

    def home(unit, l1=(4, 16, 64), dev=TINY_CPU):
        p = make_program(calc, dev, [(4, 16, 1), l1, unit], (True,) * 3, 0.0)
        return dev.layers[accumulator_home(p, dev)].name

    assert TINY_CPU.layer("L1").capacity_bytes == 32768 and TINY_CPU.layer("L2").capacity_bytes == 2**20
    assert [home((64, 64, 1024)), home((96, 64, 1024)), home((96, 64, 1024), l1=(16, 64, 64))] == ["L1", "L1", "L2"]
    assert [home((64, 128, 1024)), home((256, 256, 128)), home((256, 256, 512)), home((1024, 1024, 1024))] == [
        "L2", "L2", "DRAM", "DRAM"]
    assert ACCUMULATOR_FILL == 15 / 16
    assert calc.footprint_bytes((266, 384, 192)) == (266 * 384 + 266 * 192 + 192 * 384) * 4 <= 15 * 2**16
    assert 15 * 2**16 < calc.footprint_bytes((266, 576, 128)) == (266 * 576 + 266 * 128 + 128 * 576) * 4 <= 2**20
    assert [home((266, 384, 192)), home((266, 576, 128))] == ["L2", "DRAM"]
    # mm-512's unit tile of 258 x 256 x 64 on a 512 KiB L2 (the AVX2 EPYC's): 264 KiB of outputs
    # (more than half the L2, once sent to DRAM) + 130 KiB of panels = 394 KiB: in L2
    half_l2 = replace(TINY_CPU, layers=tuple(
        replace(l, capacity_bytes=2**19) if l.name == "L2" else l for l in TINY_CPU.layers))
    e512 = matmul(512, 512, 512)
    p = make_program(TileCalculus(e512), half_l2, [(6, 16, 1), (6, 16, 32), (258, 256, 64)], (True,) * 3, 0.0)
    assert half_l2.layers[accumulator_home(p, half_l2)].name == "L2"
    assert TileCalculus(e512).footprint_bytes((258, 256, 64)) == (258 * 256 + 258 * 64 + 64 * 256) * 4 <= 2**19


# -- cross-thread reductions (issue 16) ------------------------------------------------------------


def _reduce_sum_64x1m(register_k: int, threads: int) -> RProgram:
    e = fuse_axes(expr("reduce_sum", shape=(64, 1 << 20), axes=(1,)))
    dev = device("v100")
    return make_program(TileCalculus(e), dev, [(1, register_k), (1, register_k * threads)], (True, False), 0.05)


@pytest.mark.parametrize("threads, steps", [(32, 5), (160, 8), (320, 9), (512, 9), (1024, 10)])
def test_reduce_sum_64x1m_on_the_v100_reads_what_its_loads_in_flight_allow_then_reduces_in_a_tree(threads, steps):
    """reduce_sum over 64 x 2^20 fp32 on the V100 as a cross-thread reduction, in closed form:
    64 blocks (one row each) over 80 SMs keep 64 / 80 of them busy, one block an SM. A block
    has one step of its row in flight, 2 floats a thread (8 T bytes), so Little's law caps the
    read at 80 x 8 T B over the loaded latency (400 ns x `LOADED_LATENCY`, 500 ns) = 1.28 T
    GB/s: 41 GB/s for one warp, the 750 GB/s from 586 threads on. The one output a row is
    stored at 750 GB/s. The warps of a scheduler (T / 128) overlap the adds with the loads, one
    warp alone serialises them. Then a tree of
    ceil(log2(threads)) exchanges at the shared layer's 12.4 ns, one wave. It was 14.3 ms with
    a thread per row (2 blocks of 32 threads)."""
    dev = device("v100")
    program = _reduce_sum_64x1m(2, threads)
    est = estimate(program, dev)
    assert est.threads == threads and program.grid == 64 and est.waves == 1
    tree = steps * 12.4e-9
    assert tree_reduction_seconds(program, dev, threads, 1) == pytest.approx(tree, rel=1e-12)
    assert est.reduction_seconds == pytest.approx(tree, rel=1e-12)
    reach = min(750.0, 80 * 8 * threads / (400 * LOADED_LATENCY))  # GB/s
    assert reachable_gbps(program, dev, 2) == pytest.approx(reach, rel=1e-12)
    read = (64 * 2**20 * 4 / (reach * 1e9) + 64 * 4 / 750e9) / (64 / 80)  # the matrix once, the outputs once
    assert dict(est.bytes_per_layer) == {"global": (64 * 2**20 + 64) * 4}
    assert dict(est.load_seconds)["global"] == pytest.approx(read, rel=1e-9)
    warps = threads / 32 / 4  # per scheduler: one block an SM, a scheduler needs a warp
    adds = est.padded_flops / (12480e9 * 64 / 80 * min(1.0, warps))
    assert est.compute_seconds == pytest.approx(adds, rel=1e-9)
    unit = max(adds, read, (adds + read) / max(1.0, warps))
    assert est.predicted_seconds == pytest.approx(unit + tree, rel=1e-9)
    if threads == 1024:  # the bandwidth bound, against the 14.3 ms of a thread per row
        assert est.predicted_seconds == pytest.approx(64 * 2**20 * 4 / (750e9 * 64 / 80), rel=1e-3)
    if threads == 32:  # one warp an SM: 256 B in flight, not the 4.7 KB the bandwidth needs
        assert est.predicted_seconds > 10 * (64 * 2**20 * 4 / (750e9 * 64 / 80))


def test_tree_is_paid_per_output_of_a_block_and_per_wave():
    dev = device("v100")
    program = _reduce_sum_64x1m(2, 32)
    assert tree_reduction_seconds(program, dev, 32, 3) == pytest.approx(3 * 5 * 12.4e-9, rel=1e-12)
    two_rows = replace(program, tiles=((2, 2), (2, 64)))
    assert tree_reduction_seconds(two_rows, dev, 32, 1) == pytest.approx(2 * 5 * 12.4e-9, rel=1e-12)


R1 = ("reduce_mean", dict(shape=(65536, 1024), axes=(1,)))  # roller-table1 R1: 256 MiB of fp32 rows


def test_a_warp_along_the_rows_reads_whole_sectors():
    """R1 as a cross-thread reduction on the V100 (32 threads x 32 elements a row): lane t reads
    elements t, t + 32, .., its warp the whole 4 KiB row in 128 sectors of 32 B, as few as 4 KiB
    take (each load: 32 x 4 B in 4 sectors), so the global layer moves Q(tile) and no more."""
    dev, e = device("v100"), fuse_axes(expr(R1[0], **R1[1]))
    program = make_program(TileCalculus(e), dev, [(1, 32), (1, 1024)], (True, False), 0.05)
    assert warp_sectors(e, dev, (1, 1024), (1, 32)) == ((128, 128),)
    assert warp_sectors(e, dev, (1, 32), (1, 1)) == ((4, 4),)
    assert uncoalesced_bytes(program, dev) == 0
    assert dict(estimate(program, dev).bytes_per_layer) == {"global": (65536 * 1024 + 65536) * 4}


def test_a_thread_per_row_touches_a_sector_per_lane():
    """A thread per output row (rows of 8 fp32, shorter than a warp: `cross_thread_axis` keeps
    the threads on the outputs), 32 rows a block: with 2 elements a thread the warp touches 32
    sectors (one per row) for 32 x 8 useful bytes, which take 8. Where a unit's resident warps'
    sectors fit its L1 (`l1_keeps_sectors`: 32 blocks of one warp x 32 sectors = 32 KiB of the
    V100's 96) the thread's next steps read the rest of its sector from there: nothing wasted;
    on a spec whose unit holds 16 KiB, each input byte is priced 4 times (3 x Q wasted). With
    the whole row a thread every byte of the 32 sectors is read. The output, written once per
    row, is not a load."""
    dev, e = device("v100"), fuse_axes(expr("reduce_sum", shape=(65536, 8), axes=(1,)))
    assert warp_sectors(e, dev, (32, 8), (1, 2)) == ((32, 8),)
    program = make_program(TileCalculus(e), dev, [(1, 2), (32, 8)], (True, False), 0.05)
    assert uncoalesced_bytes(program, dev) == 0
    small = replace(dev, shared_bytes_per_unit=16 * 1024)
    assert uncoalesced_bytes(program, small) == 3 * 65536 * 8 * 4
    assert dict(estimate(program, small).bytes_per_layer) == {"global": 4 * 65536 * 8 * 4 + 65536 * 4}
    whole = make_program(TileCalculus(e), dev, [(1, 8), (32, 8)], (True, False), 0.05)
    assert warp_sectors(e, dev, (32, 8), (1, 8)) == ((32, 32),) and uncoalesced_bytes(whole, small) == 0
    # staged in shared memory, the block's cooperative copy is coalesced: nothing wasted
    staged = make_program(TileCalculus(e), dev, [(1, 2), (32, 8)], (True, True), 0.05)
    assert uncoalesced_bytes(staged, small) == 0


def test_a_stride_2_window_reads_every_sector_it_touches_over_its_register_tile():
    """avgpool 2 x 2, stride 2, a thread per output along the row: lane t reads x[2t + s]; over
    the window's s = 0, 1 (the register tile along it) the warp reads 64 consecutive floats, 8
    sectors, all used; with only s = 0 in the tile, 8 sectors for 128 B (needed: 4)."""
    dev = device("v100")
    e = fuse_axes(expr("avgpool", N=1, C=1, H=64, W=64, K=2, stride=2, pad=0))
    w = [axis.name for axis in e.axes].index("w")
    block, reg = [1] * len(e.axes), [1] * len(e.axes)
    block[w] = 32
    assert warp_sectors(e, dev, tuple(block), tuple(reg)) == ((8, 4),)
    for a in e.reduce:  # the window's rows r and columns s
        reg[a] = 2
    assert warp_sectors(e, dev, tuple(block), tuple(reg)) == ((16, 16),)  # 2 rows x 64 floats


def test_neighbouring_outputs_of_an_outer_reduction_read_neighbouring_elements():
    """reduce_sum over axis 0 of a 4096 x 1024 matrix keeps a thread per output (`cross_thread_axis`
    is None): lane t reads column t, 32 x 4 B in 4 sectors, so nothing is wasted."""
    dev, e = device("v100"), fuse_axes(expr("reduce_sum", shape=(4096, 1024), axes=(0,)))
    j = e.spatial[0]
    block, reg = [1] * len(e.axes), [1] * len(e.axes)
    block[j] = 128
    assert warp_sectors(e, dev, tuple(block), tuple(reg)) == ((4, 4),)


TABLE1_REDUCTIONS = {  # roller-table1's reduce_mean workloads: (params, elements read, bound's slack)
    "R0": (dict(shape=(128, 512, 1024), axes=(2,)), 65536 * 1024, 1.1),
    "R1": (R1[1], 65536 * 1024, 1.1),
    # rows of 121 on the V100 only (a thread a row elsewhere): 61 threads x 2 elements, the rows
    # padded to 122 (the sector a warp's step shares with the next kept in L1,
    # `l1_keeps_sectors`), and 516096 trees of 6 exchanges
    "R2": (dict(shape=(128, 4032, 11, 11), axes=(2, 3)), 128 * 4032 * 121, 1.3),
}


@pytest.mark.parametrize("gpu, wid", [(gpu, wid) for gpu in ("v100", "a100", "h100") for wid in sorted(TABLE1_REDUCTIONS)
                                      if wid != "R2" or gpu == "v100"])
def test_table1_reductions_are_cross_thread_near_the_bandwidth_bound(gpu, wid):
    """Issue 16's acceptance: roller-table1 R0-R2's top-1 binds its threads to the reduce axis
    (a thread and a block per output row, at least a warp along it), and its predicted time is
    within the slack of reading the input once at the global layer's bandwidth, the trees
    included: R1 reads 256 MiB in 0.36 ms on the V100 (750 GB/s). R2 on the V100 only
    (`test_r2_runs_a_thread_per_row_its_sectors_kept_in_l1`)."""
    dev = device(gpu)
    params, elements, slack = TABLE1_REDUCTIONS[wid]
    built = construct(expr("reduce_mean", **params), dev)
    program, est = built.candidates[0].program, built.candidates[0].estimate
    k = built.expr.reduce[-1]
    assert cross_thread_axis(built.expr, dev) == k
    assert all(tile[a] == 1 for tile in program.tiles for a in built.expr.spatial)  # one row per block
    assert est.threads == program.unit_tile[k] // program.register_tile[k] >= 32
    floor = elements * 4 / (dev.layers[-1].bandwidth_gbps * 1e9)
    assert floor <= est.predicted_seconds <= slack * floor
    if (gpu, wid) == ("v100", "R1"):
        assert uncoalesced_bytes(program, dev) == 0 and 0.35e-3 < est.predicted_seconds < 0.37e-3


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_r2_runs_a_thread_per_row_its_sectors_kept_in_l1(gpu):
    """roller-table1 R2: 516,096 rows of 121 outnumber every GPU's resident threads; on the A100
    and H100, whose units (164 and 228 KiB) hold two sectors for each resident thread, a thread
    per row (`cross_thread_axis` None; the V100's 96 KiB: a block a row still), several rows a
    block, the sectors of a unit's warps' rows kept in L1 between their steps
    (`l1_keeps_sectors`), so rank 1 is priced at reading the input once (within 1.2x of the
    bandwidth floor: the write-back and the grid's last wave)."""
    dev = device(gpu)
    r2 = dict(shape=(128, 4032, 11, 11), axes=(2, 3))
    assert cross_thread_axis(fuse_axes(expr("reduce_mean", **r2)), device("v100")) is not None
    built = construct(expr("reduce_mean", **r2), dev)
    program, est = built.candidates[0].program, built.candidates[0].estimate
    (i,), k = built.expr.spatial, built.expr.reduce[-1]
    assert cross_thread_axis(built.expr, dev) is None
    assert program.unit_tile[i] > program.register_tile[i] and uncoalesced_bytes(program, dev) == 0
    floor = 128 * 4032 * 121 * 4 / (dev.layers[-1].bandwidth_gbps * 1e9)
    assert floor <= est.predicted_seconds <= 1.2 * floor


def test_blocks_per_unit_capped_by_the_resident_block_limit_and_unstaged_shared_memory():
    """R1's blocks of one warp: 64 fit the V100's 2048 threads, but an SM holds at most 32
    blocks (compute capability 7.0), and the 4 KiB block tile, not staged, takes no shared
    memory (it capped them at 12 before)."""
    dev, e = device("v100"), fuse_axes(expr(R1[0], **R1[1]))
    program = make_program(TileCalculus(e), dev, [(1, 32), (1, 1024)], (True, False), 0.05)
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == (32, 32)
    assert estimate(program, dev).occupancy == 32 * 32 / 2048


def test_no_tree_without_a_cross_thread_reduction():
    dev = device("v100")
    mm = matmul(256, 256, 256)
    program = make_program(TileCalculus(mm), dev, [(4, 4, 1), (64, 32, 16)], (True, True), 0.05)
    assert tree_reduction_seconds(program, dev, 128, 1) == 0.0 == estimate(program, dev).reduction_seconds


@pytest.mark.parametrize("spec", [AVX2, AVX512], ids=lambda d: d.name)
def test_an_input_that_fits_the_top_cache_layer_is_loaded_once_per_core(spec):
    """gemv 4096 x 4096 in unit tiles of `rows` x 1024: Roller's Q(tile) loads x's 4 KiB slice
    once per tile, 16 KiB x 4096 / rows in all; x (16 KiB) takes under RESIDENT_SHARE of the
    1 MiB L2, so each of the two cores loads it once and the top layer's traffic is A once, x
    twice and the outputs, whatever the rows. Where the L2 holds 16 KiB, x does not stay."""
    calc = TileCalculus(expr("gemv", M=4096, K=4096))

    def program(dev, rows):
        return make_program(calc, dev, [(1, 16), (8, 1024), (rows, 1024)], (True,) * 3, 0.0)

    a, x, out = 4096 * 4096 * 4, 4096 * 4, 4096 * 4
    assert x <= RESIDENT_SHARE * spec.layers[2].capacity_bytes and spec.compute_units == 2
    for rows in (8, 128):
        p = program(spec, rows)
        assert calc.traffic_bytes(p.tiles[2]) == a + 4096 // rows * x + out
        assert cache_traffic(p, spec, 2) == a + 2 * x + out
    small = replace(spec, layers=(*spec.layers[:2], replace(spec.layers[2], capacity_bytes=x), spec.layers[3]))
    p = program(small, 8)
    assert cache_traffic(p, small, 2) == calc.traffic_bytes(p.tiles[2]) > cache_traffic(program(spec, 8), spec, 2)


def test_cpu_cache_tiles_share_with_their_neighbours_what_one_step_leaves_in_the_layer():
    """matmul 256 x 256 x 512 on a 32 KiB L1, L1 tiles 4 x 16 x 64 under 64 x 128 x K2 unit
    tiles: with K2 = 256 one step along j keeps A 4 x 256 (4 KiB) + B 256 x 16 (16 KiB) + C
    (256 B) in L1, so the j-run's tiles load A once per row of 4: Q(4 x 128 x 256), where
    Roller's Q(tile) reloads A for each; with K2 = 512 the step holds 40 KiB, and of what Q(tile)
    reloads beyond the run's Q(4 x 128 x 512) SPILL_RELOAD counts. The register tile and the
    unit tile (whose neighbours are other cores') keep Q, and so does a GPU's shared-memory
    tile, an explicit copy per tile."""
    calc = TileCalculus(matmul(256, 256, 512))
    tiles = [(4, 16, 1), (4, 16, 64)]

    def program(k2):
        return make_program(calc, TINY_CPU, [*tiles, (64, 128, k2)], (True,) * 3, 0.0)

    fits, spills = program(256), program(512)
    assert cache_traffic(fits, TINY_CPU, 1) == calc.traffic_bytes((4, 128, 256)) == (
        64 * 2 * 2 * (4 * 256 + 256 * 128) * 4 + 64 * 2 * 4 * 128 * 4)
    assert cache_traffic(fits, TINY_CPU, 1) < calc.traffic_bytes((4, 16, 64))
    run, reloads = calc.traffic_bytes((4, 128, 512)), calc.traffic_bytes((4, 16, 64))
    assert run < reloads and cache_traffic(spills, TINY_CPU, 1) == run + round(SPILL_RELOAD * (reloads - run))
    assert cache_traffic(fits, TINY_CPU, 1) < cache_traffic(spills, TINY_CPU, 1) < reloads
    assert [cache_traffic(fits, TINY_CPU, l) for l in (0, 2)] == [calc.traffic_bytes(t) for t in fits.tiles[::2]]
    # the L1 tile is one register tile, so the accumulators stay in registers over its K-steps
    # and leave them once per K-step of the unit tile (`accumulator_steps`), through the unit
    # tile's buffer (`buffer_bytes`: its L1 tile's K of 64 is not the whole reduction)
    assert accumulator_steps(fits) == (64, 128, 256)
    assert dict(estimate(fits, TINY_CPU).bytes_per_layer)["L2"] - cache_traffic(fits, TINY_CPU, 1) == (
        calc.accumulator_bytes(tiles[0], (64, 128, 256)) + buffer_bytes(fits, TINY_CPU))
    gpu = device("v100")
    g = TileCalculus(matmul(1024, 1024, 1024))
    gp = make_program(g, gpu, [(4, 4, 1), (64, 64, 8)], (True, True), 0.0)
    assert cache_traffic(gp, gpu, 1) == g.traffic_bytes((64, 64, 8))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_panel_buffer_that_leaves_the_pack_layer_is_read_for_ownership_and_written_back(dev, monkeypatch):
    """8 x 647 x 799 in 8 x 432 unit tiles packs A and B into L2 once per K-step of kc: a buffer
    of 8 x kc of A and kc x 432 of B a core (kc at most K). Where the core's share of the
    operator (its tensors once, over 2 cores) and that buffer overflow L2 and no layer but the
    bottom holds them, each call reads the buffer for ownership from DRAM and writes it back:
    BUFFER_TOUCHES x the buffer at the core's half of DRAM's 20 GB/s, added to the copies; with
    an L2 that holds both, nothing (generated AVX2-like and AVX-512-like specs)."""
    e = matmul(8, 799, 647)
    share = (8 * 647 + 647 * 799 + 8 * 799) * 4 / 2
    l2 = dev.layers[2]
    wide = replace(dev, layers=dev.layers[:2] + (replace(l2, capacity_bytes=2 * 2**20),) + dev.layers[3:])
    for kc in (112, 672):
        buffer = (8 + 432) * min(kc, 647) * 4  # a K-step past K is cut at it
        for spec in (dev, wide):
            p = make_program(calculus(e), spec, [(8, 16, 1), (8, 16, 112), (8, 432, kc)], [True] * 3, 0.0)
            assert packed_inputs(p.expr, p, spec) == ("A", "B") and pack_layer(p) == 2
            overflows = share + buffer > spec.layers[2].capacity_bytes
            touch = BUFFER_TOUCHES * buffer / (20e9 / 2) if overflows else 0.0
            assert buffer_touch_seconds(p, spec) == pytest.approx(touch, rel=1e-12)
            with monkeypatch.context() as m:
                m.setattr(cpu, "buffer_touch_seconds", lambda program, device: 0.0)
                copying = packing_seconds(p, spec)
            assert packing_seconds(p, spec) == pytest.approx(copying + touch, rel=1e-12)
        # the generated specs' 1 MiB L2 holds neither buffer with the 1.06 MB share; a 2 MiB one
        # the 0.2 MB buffer of kc = 112, not the 1.1 MB of kc = 672
        p = make_program(calculus(e), wide, [(8, 16, 1), (8, 16, 112), (8, 432, kc)], [True] * 3, 0.0)
        assert (buffer_touch_seconds(p, wide) > 0) == (kc == 672)


def test_a_conv_row_of_l1_tiles_shares_the_filter_panel_of_the_l2_k_step_while_it_fits():
    """conv-3x3 (64 channels, 56 x 56), 32 x 2 x 2 L1 tiles (filters x rows x columns) over 16
    channels x 1 x 3 of the window: inside an L2 tile of 16 channels one step along the
    columns holds the 32 x 16 x 3 x 3 filters (18 KiB) + 16 x 4 x 4 data (1 KiB) + 32 x 2 x 2
    outputs (512 B), within a 32 KiB L1, so the row of 28 tiles loads the filters once; over
    32 channels the filters alone are 36 KiB, and of the reloads of every tile (Q) beyond the
    row's SPILL_RELOAD counts."""
    e = expr("conv2d", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, pad=1)
    calc = TileCalculus(e)
    l1 = (1, 32, 2, 2, 16, 1, 3)

    def program(c2):
        return make_program(calc, TINY_CPU, [(1, 32, 2, 1, 1, 1, 1), l1, (1, 64, 14, 56, c2, 3, 3)], (True,) * 3, 0.0)

    assert calc.sweep(l1, (1, 64, 14, 56, 16, 3, 3)) == ((1, 32, 2, 2, 16, 3, 3), (1, 32, 2, 56, 16, 3, 3))
    assert calc.footprint_bytes((1, 32, 2, 2, 16, 3, 3)) == (32 * 16 * 9 + 16 * 4 * 4 + 32 * 2 * 2) * 4 == 19968
    assert calc.footprint_bytes((1, 32, 2, 2, 32, 3, 3)) > TINY_CPU.layer("L1").capacity_bytes
    # the data is broadcast an element at a time, so L1 holds and loads it in whole lines: its
    # 16 x 4 rows of 4 floats are 64 lines (4 KiB, not 1 KiB); the filters stream as vectors
    lines = (64, frozenset({0}))
    assert scattered_inputs(program(16), TINY_CPU) == lines[1]
    footprint = calc.footprint_bytes((1, 32, 2, 2, 16, 3, 3), line=64, in_lines=lines[1])
    assert footprint == (32 * 16 * 9 + 32 * 2 * 2) * 4 + 16 * 4 * 64 == 23040
    assert cache_traffic(program(16), TINY_CPU, 1) == calc.traffic_bytes((1, 32, 2, 56, 16, 3, 3), *lines)
    row, reloads = calc.traffic_bytes((1, 32, 2, 56, 32, 3, 3), *lines), calc.traffic_bytes(l1, *lines)
    assert cache_traffic(program(32), TINY_CPU, 1) == row + round(SPILL_RELOAD * (reloads - row))
    assert estimate(program(16), TINY_CPU).predicted_seconds < estimate(program(32), TINY_CPU).predicted_seconds


# -- overlap, latency hiding and virtual threads on GPUs (issue 16) --------------------------------


def test_overlapped_stages_serialise_for_one_agent_and_hide_under_several():
    """max(a, b, (a + b) / agents): one agent runs its load and its compute one after the other;
    two with balanced stages hide one under the other; the pipes still bound the time."""
    assert overlapped(3e-6, 1e-6, 1) == pytest.approx(4e-6)
    assert overlapped(3e-6, 1e-6, 2) == pytest.approx(3e-6)
    assert overlapped(1e-6, 1e-6, 2) == pytest.approx(1e-6)
    assert overlapped(2e-6, 2e-6, 1.5) == pytest.approx(4e-6 / 1.5)
    assert overlapped(2e-6, 1e-6, 0.25) == pytest.approx(3e-6)  # fewer than one: still one


def _v100_matmul(m, n, k, tiles, vthreads=()):
    dev = device("v100")
    return dev, make_program(TileCalculus(matmul(m, n, k)), dev, tiles, (True, True), 0.05, vthreads=vthreads)


def test_one_resident_block_with_a_warp_per_scheduler_hides_nothing():
    """matmul 256^3 on the V100, blocks of 64 x 32 x 16 over 4 x 4 x 1 register tiles: 32 blocks
    of 128 threads over 80 SMs, one an SM, one warp per scheduler: the reads from shared memory
    and the FMAs add up. The template prefetches step s + 1 in registers while it computes step
    s (sm_70's register prefetch, `staging.register_prefetch`), so the copy from global memory
    overlaps them: max(compute + shared, global). A step's copy (64 x 16 + 16 x 32 floats, 6
    KiB) keeps 80 x 6144 B / 500 ns (the loaded latency) = 983 GB/s in flight: the 750 GB/s is
    reached."""
    dev, program = _v100_matmul(256, 256, 256, [(4, 4, 1), (64, 32, 16)])
    est = estimate(program, dev)
    assert (est.threads, program.grid) == (128, 32)
    assert bytes_in_flight(program, dev, est.blocks_per_unit) == (64 * 16 + 16 * 32) * 4
    assert reachable_gbps(program, dev, 2) == 750.0
    busy = 32 / 80
    glob = TileCalculus(program.expr).traffic_bytes((64, 32, 16)) / (750e9 * busy)
    shared = TileCalculus(program.expr).traffic_bytes((4, 4, 1)) / (12080e9 * busy)
    assert dict(est.load_seconds) == pytest.approx({"shared": shared, "global": glob}, rel=1e-12)
    assert est.compute_seconds == pytest.approx(2 * 256**3 / (12480e9 * busy), rel=1e-12)
    assert est.predicted_seconds == pytest.approx(max(est.compute_seconds + shared, glob), rel=1e-12)


def test_two_resident_blocks_hide_the_shorter_stage_under_the_longer():
    """The same blocks over a 1280 x 256 output: 160 blocks, two an SM, two warps per scheduler.
    While one block copies, the other computes: max(inner, global, (inner + global) / 2), the
    inner stage max(compute, shared, (compute + shared) / 2) over the scheduler's two warps."""
    dev, program = _v100_matmul(1280, 256, 256, [(4, 4, 1), (64, 32, 16)])
    est = estimate(program, dev)
    assert program.grid == 160 and est.blocks_per_unit >= 2
    loads = dict(est.load_seconds)
    c, s, g = est.compute_seconds, loads["shared"], loads["global"]
    inner = max(c, s, (c + s) / 2)
    assert est.predicted_seconds == pytest.approx(max(inner, g, (inner + g) / 2), rel=1e-12)
    assert max(c, s, g) <= est.predicted_seconds < c + s + g


def test_one_small_block_an_sm_cannot_keep_enough_loads_in_flight():
    """matmul 2560 x 32 x 256 on the V100 in blocks of 32 x 32 x 1: 80 blocks, one an SM, each
    step copying 32 + 32 floats (256 B). Little's law at the loaded latency (400 ns x
    `LOADED_LATENCY`): 80 x 256 B / 500 ns = 40.96 GB/s, not 750, for loads from the HBM. The
    blocks load A's 2,560 x 256 floats and B's 256 x 32 once, 2.65 MB of their 5.24 (`hbm_share`
    0.506); the rest hit the L2 at `L2_HIT_LATENCY`, so they wait 400 ns x (0.506 x 1.25 + 0.494
    / 3) = 319 ns on average and read at 64.2 GB/s. The output's stores (posted, nothing waits
    for them) still stream at 750 GB/s."""
    dev, program = _v100_matmul(2560, 32, 256, [(4, 4, 1), (32, 32, 1)])
    est = estimate(program, dev)
    assert program.grid == 80
    assert bytes_in_flight(program, dev, est.blocks_per_unit) == 256
    reach = 80 * 256 / (400 * LOADED_LATENCY)
    assert reach == pytest.approx(40.96, rel=1e-12)
    assert reachable_gbps(program, dev, 2) == pytest.approx(reach, rel=1e-12)
    loads = 80 * 256 * 256  # 80 blocks x 256 steps x 256 B
    stores = 2560 * 32 * 4
    share = (2560 * 256 + 256 * 32) * 4 / loads
    assert hbm_share(program, loads) == pytest.approx(share, rel=1e-12) and 0.5 < share < 0.51
    mixed = 80 * 256 / (400 * (share * LOADED_LATENCY + (1 - share) * L2_HIT_LATENCY))
    assert mixed == pytest.approx(64.2, rel=1e-3)
    assert reachable_gbps(program, dev, 2, share) == pytest.approx(mixed, rel=1e-12)
    assert dict(est.load_seconds)["global"] == pytest.approx(loads / (mixed * 1e9) + stores / 750e9, rel=1e-12)
    # twice the latency halves what a unit's 256 B in flight deliver
    slow = replace(dev, layers=dev.layers[:2] + (replace(dev.layers[2], latency_ns=800.0),))
    assert reachable_gbps(program, slow, 2) == pytest.approx(reach / 2, rel=1e-12)


def test_a_relu_of_two_floats_a_thread_reads_at_its_loads_in_flight_over_the_loaded_latency():
    """relu over 128 x 1008 x 42 x 42 fp32 on the H200 (roller-table1 E0) in blocks of 512
    threads, 4 resident an SM. Threads of 2 floats keep 4 x 512 x 8 B = 16 KiB an SM in flight:
    132 x 16,384 B over the idle 500 ns would just reach the 4,250 GB/s, over the loaded latency
    (500 ns x `LOADED_LATENCY`, 625 ns) they read at 3,460 GB/s. Threads of 4 floats keep twice
    that and read at the bandwidth. The output is stored at the bandwidth either way."""
    dev = device("h200")
    e = fuse_axes(expr("relu", shape=(128, 1008, 42, 42)))
    n = 128 * 1008 * 42 * 42
    assert dev.compute_units == 132 and dev.layers[2].latency_ns == 500.0 and dev.layers[2].bandwidth_gbps == 4250.0
    seconds = {}
    for floats in (2, 4):
        program = make_program(TileCalculus(e), dev, [(floats,), (512 * floats,)], (True, False), 0.05)
        est = estimate(program, dev)
        assert (est.threads, est.blocks_per_unit) == (512, 4)
        assert bytes_in_flight(program, dev, est.blocks_per_unit) == 4 * 512 * floats * 4
        reach = min(4250.0, 132 * 4 * 512 * floats * 4 / (500 * LOADED_LATENCY))
        assert reachable_gbps(program, dev, 2) == pytest.approx(reach, rel=1e-12)
        seconds[floats] = dict(est.load_seconds)["global"]
        assert seconds[floats] == pytest.approx(n * 4 / (reach * 1e9) + n * 4 / 4250e9, rel=1e-9)
    assert 132 * 16384 / 500 > 4250 > 132 * 16384 / (500 * LOADED_LATENCY)
    assert seconds[2] > 1.1 * seconds[4]


def test_virtual_threads_price_the_wavefronts_they_save():
    """matmul 512^3 on the V100, blocks 1 x 256 x 1 over register tiles 1 x 8 x 1 (test_banks:
    the first warp's reads take 65 wavefronts, 17 with 4 virtual threads along j, 9 with 8): its
    register tiles' reads from shared memory take 17/65 and 9/65 of the time they take without.
    A program without virtual threads is written back interleaved (`plan.store_vthreads`: 8
    along j), so it is priced as 8. With global memory made fast enough not to matter, 4 and 8
    virtual threads hide their reads under the compute and tie, as the hardware would: 26
    warps a scheduler overlap the reads and the FMAs."""
    dev = device("v100")
    fast = replace(dev.layers[2], bandwidth_gbps=750e3, latency_ns=1.0)
    quick = replace(dev, layers=dev.layers[:2] + (fast,))
    tiles = [(1, 8, 1), (1, 256, 1)]
    plain, four, eight = (_v100_matmul(512, 512, 512, tiles, v)[1] for v in ((), (("j", 4),), (("j", 8),)))
    assert shared_wavefronts(plain.expr, dev, plain.unit_tile, plain.register_tile, (1, 1, 1))[0] == 65
    assert gpu_plan(plain, dev).vthreads == (("j", 8),)
    assert vthread_conflict_ratio(plain, dev) == pytest.approx(9 / 65, rel=1e-12)
    assert vthread_conflict_ratio(four, dev) == pytest.approx(17 / 65, rel=1e-12)
    assert vthread_conflict_ratio(eight, dev) == pytest.approx(9 / 65, rel=1e-12)
    reads = {p: dict(estimate(p, quick).load_seconds)["shared"] for p in (plain, four, eight)}
    assert reads[eight] == pytest.approx(reads[four] * 9 / 17, rel=1e-12)
    assert reads[plain] == pytest.approx(reads[eight], rel=1e-12)
    est = {p: estimate(p, quick) for p in (plain, four, eight)}
    compute = est[eight].compute_seconds
    assert reads[eight] < reads[four] < compute
    quantization = ceil(1024 / 80) * 80 / 1024
    tied = est[four].predicted_seconds == est[eight].predicted_seconds == est[plain].predicted_seconds
    assert tied and est[four].predicted_seconds == pytest.approx(compute * quantization, rel=1e-12)


def test_a_strided_write_back_is_priced_by_the_sectors_it_wastes():
    """A 65536 x 2 x 1024 matmul (M0: memory-bound on its output) over 8 x 8 register tiles in
    128 x 256 blocks: written back interleaved (`plan.store_vthreads`: 8 along j) a warp's
    store takes 4 sectors; with the construction's virtual threads along i instead, lanes 8
    elements (32 B) apart take 32 (8x), and 2 along j leave 16 B apart (4x). Only the output
    bytes are charged the extra sectors."""
    dev = device("h200")
    calc, tiles = TileCalculus(matmul(65536, 1024, 2)), [(8, 8, 1), (128, 256, 2)]
    plain, rows, pairs = (make_program(calc, dev, tiles, (True, True), 0.05, vthreads=v)
                          for v in ((), (("i", 2),), (("j", 2),)))
    assert [store_sector_ratio(p, dev) for p in (plain, rows, pairs)] == [1.0, 8.0, 4.0]
    # `plan.warp_lanes`: the plain program's warp is 4 rows of 8 lanes, each storing a run of 4
    # along j as one 16-byte vector: 4 rows x 128 B, 16 whole sectors; were the run stored one
    # element at a time, each store's 8 lanes would be 16 B apart: 16 sectors for 4 sectors' bytes
    assert gpu_plan(plain, dev).warp_lanes == (("i", 4), ("j", 8)) and gpu_plan(plain, dev).vector_stores
    block, reg, split = plain.unit_tile, plain.register_tile, gpu_plan(plain, dev).vthreads
    assert output_sectors(calc.expr, dev, block, reg, split, (("i", 4), ("j", 8)), 4) == (16, 16)
    assert output_sectors(calc.expr, dev, block, reg, split, (("i", 4), ("j", 8)), 1) == (16, 4)
    output, gbps = 65536 * 1024 * 4, dev.layers[-1].bandwidth_gbps  # global memory's
    loads = {p: dict(estimate(p, dev).load_seconds)["global"] for p in (plain, rows, pairs)}
    assert loads[rows] - loads[plain] == pytest.approx(7 * output / (gbps * 1e9), rel=1e-9)
    assert loads[pairs] - loads[plain] == pytest.approx(3 * output / (gbps * 1e9), rel=1e-9)


def roller_d2():
    """roller-table1 D2: a 1x1 depthwise convolution, 4 outputs per input channel."""
    return expr("depthwise_conv2d", N=128, C=84, H=21, W=21, KH=1, KW=1, multiplier=4, stride=1, pad=0)


def test_a_write_back_along_no_contiguous_axis_takes_a_sector_a_lane():
    """roller-table1 D2's construction put a block's threads over images and channels, one
    pixel each (the H200 ran those programs at 12x their prediction): a warp's store of one
    element puts its 32 lanes in 32 sectors for 128 B (8x); threads along the output's rows
    (21 floats, w) store a warp's 32 floats in 5 sectors: a row's 84 B in 3, the next
    channel's 11 floats in 2."""
    e, dev = roller_d2(), device("h200")
    calc = TileCalculus(e)
    names = [a.name for a in e.axes]

    def tiles(reg, block):
        return [tuple(reg.get(n, 1) for n in names), tuple(block.get(n, 1) for n in names)]

    across = make_program(calc, dev, tiles({"n": 4, "j": 4}, {"n": 128, "c": 4, "j": 4}), (True, True), 0.05)
    rows = make_program(calc, dev, tiles({"j": 4}, {"j": 4, "h": 1, "w": 21, "c": 2, "n": 2}), (True, True), 0.05)
    assert store_sector_ratio(across, dev) == 8.0
    assert store_sector_ratio(rows, dev) == 5 / 4


def test_virtual_threads_change_nothing_where_nothing_is_read_from_banks():
    """A program that stages nothing reads global memory (its sectors, `warp_sectors`, see the
    vthreads there), a cross-thread reduction has no virtual threads, an operator without a
    reduce axis stages nothing: the ratio is 1."""
    dev = device("v100")
    unstaged = make_program(TileCalculus(matmul(512, 512, 512)), dev, [(1, 8, 1), (1, 256, 1)], (True, False), 0.05,
                            vthreads=(("j", 4),))
    assert vthread_conflict_ratio(unstaged, dev) == 1.0
    e = expr("relu", shape=(1024, 1024))
    relu = make_program(TileCalculus(e), dev, [(1, 8), (1, 256)], (True, False), 0.05, vthreads=((e.axes[1].name, 4),))
    assert vthread_conflict_ratio(relu, dev) == 1.0


# -- software pipelining (issue 16: the model overlaps only what the templates pipeline) ------------


def _with_arch(dev, arch: str):
    """`dev` with another CUDA architecture in its target (nothing else changed)."""
    return replace(dev, target=tuple((k, arch if k == "arch" else v) for k, v in dev.target))


def test_async_copies_need_cuda_sm80_or_later():
    h100 = device("h100")
    assert [async_copies(_with_arch(h100, a)) for a in ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90a")] == [
        False, False, True, True, True]
    assert async_copies(device("a100")) and not async_copies(device("v100"))
    assert not async_copies(device("mi50")) and not async_copies(TINY_CPU)


def _h100_matmul(m, n, k, tiles, arch="sm_90a"):
    dev = _with_arch(device("h100"), arch)
    return dev, make_program(TileCalculus(matmul(m, n, k)), dev, tiles, (True, True), 0.05)


def test_a_pipelined_block_copies_the_next_step_while_it_computes_this_one():
    """matmul 256^3 on the H100 in blocks of 64 x 32 x 16 over 4 x 4 x 1 register tiles: 32
    blocks over 132 SMs, one an SM, one warp per scheduler, 16 shared steps. Pipelined (sm_90a,
    cp.async) the copy of step s + 1 runs under the compute of step s: max(compute + shared,
    global); on an sm_75 target (no cp.async) it is pipelined through registers
    (`staging.register_prefetch`), which the model overlaps alike."""
    dev, program = _h100_matmul(256, 256, 256, [(4, 4, 1), (64, 32, 16)])
    old, same = _h100_matmul(256, 256, 256, [(4, 4, 1), (64, 32, 16)], arch="sm_75")
    assert pipelined(program, dev) and register_prefetch(same, old) and not register_prefetch(program, dev)
    est, before = estimate(program, dev), estimate(same, old)
    assert (est.threads, program.grid) == (128, 32)
    assert dict(est.load_seconds) == dict(before.load_seconds) and est.compute_seconds == before.compute_seconds
    loads = dict(est.load_seconds)
    c, s, g = est.compute_seconds, loads["shared"], loads["global"]
    assert est.predicted_seconds == pytest.approx(max(c + s, g), rel=1e-12)
    assert before.predicted_seconds == pytest.approx(max(c + s, g), rel=1e-12)


def test_a_single_shared_step_is_not_pipelined():
    dev, program = _h100_matmul(256, 256, 16, [(4, 4, 1), (64, 32, 16)])
    assert not pipelined(program, dev) and shared_buffers(program, dev) == 1
    est = estimate(program, dev)
    loads = dict(est.load_seconds)
    assert est.predicted_seconds == pytest.approx(est.compute_seconds + loads["shared"] + loads["global"], rel=1e-12)


def test_a_pipelined_block_holds_two_copies_of_its_shared_tiles():
    """The 256^3 blocks above (64 x (16 + 17) + 16 x (32 + 4) bank-padded floats of tiles,
    10.5 KiB; 128 threads of 4 x 4 + 4 + 4 = 24 tile registers + 3 x 2 + 7 for addressing): by
    the H100's 228 KiB of shared memory an SM, room for 21 blocks with one buffer, 10 with two;
    13 by registers. 32 blocks over 132 SMs put one on an SM either way, so the program is
    pipelined and its occupancy counts both buffers."""
    dev, program = _h100_matmul(256, 256, 256, [(4, 4, 1), (64, 32, 16)])
    smem, tile = footprint_at(dev, program, 1), footprint_at(dev, program, 0) // 4
    assert (smem, tile, registers_per_thread(program, dev, shared_buffers(program, dev))) == ((64 * 33 + 16 * 36) * 4, 24, 24 + 6 + 7)
    assert pipelined(program, dev) and shared_buffers(program, dev) == 2
    by_threads, by_regs, unit = 2048 // 128, 65536 // (128 * 37), dev.unit_shared_bytes
    assert blocks_per_unit(program, dev, 1) == (128, min(by_threads, by_regs, 32, unit // smem)) == (128, 13)
    bpu = min(by_threads, by_regs, 32, unit // (2 * smem))
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == blocks_per_unit(program, dev, 2) == (128, bpu) == (128, 10)
    assert estimate(program, dev).blocks_per_unit == 10


def test_tiles_whose_second_buffer_would_cost_resident_blocks_are_not_pipelined():
    """matmul 4096^3 on the H100 in blocks of 64 x 64 x 32 over 8 x 4 x 1 register tiles: 128
    threads of 32 + 8 + 4 + 13 = 57 registers (8 blocks by registers), 64 x (32 + 1) + 32 x
    (64 + 4) floats of bank-padded tiles (16.75 KiB): 13 blocks by shared memory with one buffer,
    6 with two. The 4096 blocks keep every SM full, so doubling would cost 2 resident blocks and
    the program runs unpipelined. (128 x 128 x 8 over 8 x 8 tiles, register-limited to 2 blocks
    with one buffer or two, is pipelined.)"""
    dev, program = _h100_matmul(4096, 4096, 4096, [(8, 4, 1), (64, 64, 32)])
    smem, regs = footprint_at(dev, program, 1), registers_per_thread(program, dev, shared_buffers(program, dev))
    assert (smem, regs) == ((64 * 33 + 32 * 68) * 4, 57)
    by_threads, by_regs, unit = 2048 // 128, 65536 // (128 * 57), dev.unit_shared_bytes
    assert blocks_per_unit(program, dev, 1) == (128, min(by_threads, by_regs, 32, unit // smem)) == (128, 8)
    assert blocks_per_unit(program, dev, 2) == (128, min(by_threads, by_regs, 32, unit // (2 * smem))) == (128, 6)
    assert not pipelined(program, dev) and shared_buffers(program, dev) == 1
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == (128, 8)
    _, square = _h100_matmul(4096, 4096, 4096, [(8, 8, 1), (128, 128, 8)])
    assert blocks_per_unit(square, dev, 1) == blocks_per_unit(square, dev, 2) == (256, 2) and pipelined(square, dev)


# -- occupancy: blocks per unit from threads, registers, shared memory and the block limit ----------


def test_registers_per_thread_is_the_register_tile_plus_addressing():
    """8 x 8 register tile of a matmul: 64 accumulators + 8 + 8 fragment floats (80 registers),
    a 64-bit address per tensor (3 x 2) and 7 fixed: 93 (ptxas reported 88-92 for such programs on
    sm_80, see `occupancy.FIXED_REGISTERS`); pipelined on the V100 through registers, a thread also
    holds its share of a step's staged tiles, (128 x 8 x 2) / 256 = 8."""
    dev = device("v100")
    program = make_program(TileCalculus(matmul(4096, 4096, 4096)), dev, [(8, 8, 1), (128, 128, 8)], (True, True), 0.05)
    assert registers_per_thread(program, dev, 1) == 64 + 8 + 8 + 3 * 2 + 7 == 93
    assert register_prefetch(program, dev) and registers_per_thread(program, dev, shared_buffers(program, dev)) == 93 + 8


def test_occupancy_register_limited():
    """V100, 256 threads of 93 + 8 registers (the register prefetch's 8: the program is pipelined):
    65536 // (256 x 101) = 2 blocks, below 2048 // 256 = 8 by threads, 96 KB // twice the padded
    staged tiles by shared memory and the 32-block limit."""
    dev = device("v100")
    program = make_program(TileCalculus(matmul(4096, 4096, 4096)), dev, [(8, 8, 1), (128, 128, 8)], (True, True), 0.05)
    smem = footprint_at(dev, program, 1)
    assert smem >= (128 * 8 + 8 * 128) * 4  # A and B tiles of one shared step, bank padding on top
    limits = occupancy_limits(program, dev, shared_buffers(program, dev))
    assert limits == {"threads": 8, "registers": 65536 // (256 * 101), "shared": 98304 // (2 * smem), "blocks": 32}
    assert limits["registers"] == 2 <= limits["shared"]
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == (256, 2)


def test_occupancy_shared_limited():
    """A100, 4 x 4 register tiles in a 64 x 64 block over a K step of 64: 256 threads of
    16 + 4 + 4 + 13 = 37 registers (65536 // (256 x 37) = 6 blocks), 2048 // 256 = 8 by threads,
    and staged A and B tiles of 64 x 64 floats, their rows padded by 1 and 4 against bank
    conflicts: (64 x 65 + 64 x 68) x 4 B = 34048 B, 4 of which fit the SM's 164 KB. Without
    `shared_bytes_per_unit` one block's 48 KB is the budget: 1."""
    dev = device("a100")
    program = make_program(TileCalculus(matmul(1024, 1024, 1024)), dev, [(4, 4, 1), (64, 64, 64)], (True, True), 0.05)
    assert registers_per_thread(program, dev, shared_buffers(program, dev)) == 37
    assert footprint_at(dev, program, 1) == (64 * 65 + 64 * 68) * 4 == 34048
    assert occupancy_limits(program, dev, shared_buffers(program, dev)) == {"threads": 8, "registers": 6, "shared": 167936 // 34048, "blocks": 32}
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == (256, 4)
    small = replace(dev, shared_bytes_per_unit=0)
    assert blocks_per_unit(program, small, shared_buffers(program, small)) == (256, 49152 // 34048) == (256, 1)


def test_occupancy_thread_limited_and_no_shared_memory_without_staging():
    """relu on H100 in blocks of 512 threads of one element: 2048 // 512 = 4 blocks by threads;
    1 + 1 registers of tile + 2 x 2 addresses + 7 = 13 registers (65536 // (512 x 13) = 9); it
    stages nothing, so shared memory does not limit it."""
    dev = device("h100")
    e = fuse_axes(expr("relu", shape=(1024, 1024)))
    program = make_program(TileCalculus(e), dev, [(1,), (512,)], (True, False), 0.05)
    assert registers_per_thread(program, dev, shared_buffers(program, dev)) == 2 + 2 * 2 + 7
    assert occupancy_limits(program, dev, shared_buffers(program, dev)) == {"threads": 4, "registers": 65536 // (512 * 13), "blocks": 32}
    assert blocks_per_unit(program, dev, shared_buffers(program, dev)) == (512, 4)


def test_occupancy_block_limited_and_whole_warps():
    """Blocks of one warp stop at the SM's resident-block limit (32 on the V100, 16 on the K80:
    compute capability 3.7) though threads allow 64; a block of 40 threads holds two warps'
    slots and registers (2048 // 64 = 32 by threads); a spec without a limit has none."""
    dev = device("v100")
    e = fuse_axes(expr("relu", shape=(1024, 1024)))
    one_warp = make_program(TileCalculus(e), dev, [(1,), (32,)], (True, False), 0.05)
    assert occupancy_limits(one_warp, dev, shared_buffers(one_warp, dev))["threads"] == 64
    assert blocks_per_unit(one_warp, dev, shared_buffers(one_warp, dev)) == (32, 32)
    k80 = device("k80")
    assert blocks_per_unit(one_warp, k80, shared_buffers(one_warp, k80)) == (32, 16)
    unlimited = replace(dev, max_blocks_per_unit=0)
    assert "blocks" not in occupancy_limits(one_warp, unlimited, shared_buffers(one_warp, unlimited))
    partial = make_program(TileCalculus(e), dev, [(1,), (40,)], (True, False), 0.05)
    limits = occupancy_limits(partial, dev, shared_buffers(partial, dev))
    assert limits["threads"] == 2048 // 64 and limits["registers"] == 65536 // (64 * registers_per_thread(partial, dev, shared_buffers(partial, dev)))


def test_v100_register_prefetch_adds_a_threads_share_of_the_staged_tiles_to_its_registers():
    """matmul 256^3 on the V100 in 64 x 32 x 16 blocks of 4 x 4 x 1 register tiles: 128 threads
    stage (64 x 16 + 16 x 32) floats a step, 12 a thread, which the register prefetch holds
    (sm_70 has no cp.async). Resident blocks stay the same (8 by registers and by shared memory),
    so the program is pipelined and its stages overlap as on the H100: max(inner, global)."""
    dev, program = _v100_matmul(256, 256, 256, [(4, 4, 1), (64, 32, 16)])
    assert not async_copies(dev) and register_prefetch(program, dev)
    assert prefetch_registers(program, dev) == (64 * 16 + 16 * 32) // 128 == 12
    base = ceil(footprint_at(dev, program, 0) / 4) + 2 * 3 + 7
    assert registers_per_thread(program, dev, 1) == base
    assert registers_per_thread(program, dev, shared_buffers(program, dev)) == registers_per_thread(program, dev, 2) == base + 12
    threads, bpu = blocks_per_unit(program, dev, shared_buffers(program, dev))
    compute, loads = 3e-6, {"shared": 1e-6, "global": 5e-6}
    inner = overlapped(compute, 1e-6, warps_per_scheduler(program, dev, threads, bpu))
    assert gpu_stages(program, dev, compute, loads) == max(inner, 5e-6)


def test_v100_programs_whose_prefetch_registers_cost_a_resident_block_stay_unpipelined():
    """1920^2 x 64 in 96 x 96 x 8 blocks of 6 x 6 x 1 register tiles: 256 threads, 400 blocks.
    Without the prefetch a thread needs `registers_per_thread` R (65536 // (256 R) = 4 blocks);
    the prefetch adds (96 x 8 x 2) / 256 = 6, which leaves 3: so no pipeline on the V100."""
    dev, program = _v100_matmul(1920, 1920, 64, [(6, 6, 1), (96, 96, 8)])
    assert prefetch_registers(program, dev) == 6
    r = registers_per_thread(program, dev, 1)
    assert 65536 // (256 * r) == 4 and 65536 // (256 * (r + 6)) == 3
    assert occupancy_limits(program, dev, 1)["registers"] == 4 and occupancy_limits(program, dev, 2)["registers"] == 3
    assert not pipelined(program, dev) and not register_prefetch(program, dev)
    assert registers_per_thread(program, dev, shared_buffers(program, dev)) == r  # unpipelined: no prefetch registers counted


# -- CPU: accumulators over one-register cache tiles, lines, guarded micro-kernels (issue 14) -------


def test_accumulators_leave_the_registers_at_the_k_steps_of_the_first_tile_holding_several():
    """The first cache tile with more than one register tile along a spatial axis sets the
    K-steps after which the accumulators go out and come back: the L1 tile where it holds
    several, else the unit tile, else none (the whole iteration space, one step: no trips)."""
    calc = TileCalculus(matmul(512, 512, 512))

    def program(l1, l2):
        return make_program(calc, TINY_CPU, [(4, 16, 1), l1, l2], (True,) * 3, 0.0)

    assert accumulator_steps(program((8, 16, 64), (64, 128, 256))) == (8, 16, 64)
    assert accumulator_steps(program((4, 16, 64), (64, 128, 256))) == (64, 128, 256)
    alone = program((4, 16, 64), (4, 16, 256))
    assert accumulator_steps(alone) == (512, 512, 512)
    assert calc.accumulator_bytes((4, 16, 1), accumulator_steps(alone)) == 0
    # one register tile per L1 tile: 2 x (512 / 256 - 1) trips per register tile, not 2 x 7
    assert calc.accumulator_bytes((4, 16, 1), (64, 128, 256)) == 2 * 1 * 4 * 16 * 4 * (512 // 4) * (512 // 16)


def test_the_inputs_held_in_lines_are_those_the_template_does_not_vectorise_along():
    """The inputs that do not read the plan's vector axis are held in lines: conv's data is
    broadcast (the lanes run along the filters, which stream as panels); matmul's A is broadcast
    (its rows are whole lines by the transaction rule, so lines change nothing); gemv's lanes
    run along K, which both inputs read: none."""
    conv = fuse_axes(expr("conv2d", N=1, C=64, H=56, W=56, F=64, KH=3, KW=3, stride=1, pad=1))
    cases = ((conv, AVX512, "filters", frozenset({0})), (fuse_axes(matmul(64, 64, 64)), AVX2, None, frozenset({0})),
             (fuse_axes(expr("gemv", M=4096, K=4096)), AVX512, "lanes", frozenset()))
    for e, dev, path, held in cases:
        program = construct(e, dev).candidates[0].program
        plan = cpu_plan(program, dev)
        assert path is None or plan.path == path
        assert scattered_inputs(program, dev) == held
        assert held == {t for t, x in enumerate(e.inputs) if not x.uses_axis(plan.vector_axis)}


def test_a_register_tile_the_axis_cuts_runs_guarded_unless_the_template_pads(monkeypatch):
    """dwconv 112 x 112: register rows of 6 leave a cut tile (112 = 18 x 6 + 4) in a unit tile
    of 114 rows. The row is whole, so the plan splits the rows' edge off (`split_others`): the
    108 rows of whole tiles run unguarded, the cut tile's 4 at GUARDED_MICRO_KERNEL's rate, the
    2 past the end at nothing, over the 114 the compute term counts; rows of 8 divide it. A
    ragged matmul is padded by the CPU template, and GPU programs keep their own pricing."""
    e = fuse_axes(expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1))
    calc = TileCalculus(e)
    y = e.axes.index(next(a for a in e.axes if a.name in ("y", "h", "oh")))

    def program(rows):
        reg = tuple(rows if a == y else (16 if ax.name in ("x", "w", "ow") else 1) for a, ax in enumerate(e.axes))
        unit = tuple(ceil(ax.extent / r) * r for ax, r in zip(e.axes, reg))
        return make_program(calc, AVX512, [reg, reg, unit], (True,) * 3, 0.0)

    assert cpu_plan(program(6), AVX512).split_others
    assert guard_slowdown(program(6), AVX512) == pytest.approx((108 + 4 * GUARDED_MICRO_KERNEL) / 114)
    assert guard_slowdown(program(8), AVX512) == 1.0
    guarded = estimate(program(6), AVX512).compute_seconds
    monkeypatch.setattr(cpu_compute, "GUARDED_MICRO_KERNEL", 1.0)
    assert guarded / estimate(program(6), AVX512).compute_seconds == pytest.approx((108 + 4 * GUARDED_MICRO_KERNEL) / 112)
    mm = TileCalculus(matmul(100, 64, 64))
    assert guard_slowdown(make_program(mm, AVX512, [(6, 16, 1), (6, 16, 64), (102, 64, 64)], (True,) * 3, 0.0),
                          AVX512) == 1.0
    gpu = device("v100")
    assert guard_slowdown(make_program(calc, gpu, [program(6).tiles[0], program(6).tiles[2]], (True, True), 0.0),
                          gpu) == 1.0


def test_a_reduction_whose_tiles_cut_its_lane_axis_is_priced_as_one_dependent_chain():
    """reduce-rows (256 x 4096), lanes along K: a 40-wide register K (2.5 vectors of 16) leaves
    the CPU template its plain loop nest, one chain of dependent adds per output, lanes x pipes x
    FMA latency (16 x 2 x 4 on the AVX-512-like spec) slower than the lanes it prices otherwise;
    48-wide K tiles (whole vectors) that leave K ragged (4,224 of 4,096) run in lanes with the
    edge split off, its 16 columns scalar (`edge_slowdown`: (4,080 + 16 x 16) / 4,224); 16-wide
    tiles that divide K keep the lanes unguarded."""
    e = fuse_axes(expr("reduce_mean", shape=(256, 4096), axes=(1,)))
    calc = TileCalculus(e)
    k = next(a for a, ax in enumerate(e.axes) if ax.kind == "reduce")
    assert lane_axis(e, AVX512) == k

    def program(reg_k, unit_k):
        def tile(rows, width):
            return tuple(width if a == k else rows for a in range(len(e.axes)))
        return make_program(calc, AVX512, [tile(8, reg_k), tile(8, 1024 if unit_k == 4096 else reg_k * 22),
                                           tile(32, unit_k)], (True,) * 3, 0.0)

    assert guard_slowdown(program(40, 4400), AVX512) == 16 * 2 * 4
    assert guard_slowdown(program(48, 4224), AVX512) == (4080 + 16 * 16) / 4224
    assert guard_slowdown(program(16, 4096), AVX512) == 1.0
    assert estimate(program(40, 4400), AVX512).compute_seconds > 50 * estimate(program(16, 4096), AVX512).compute_seconds


def _pointwise_conv(dev, **shape):
    """A 1x1 convolution as a CPU construction tiles it (`ops.pixel_gemm`: images, filters,
    pixels, channels), its output NCHW."""
    return fuse_axes(construction_expr(expr("conv2d", KH=1, KW=1, stride=1, pad=0, **shape), dev))


def _unit(e, unit, dev):
    """A program of unit tiles `unit` (register tiles of one element: the split is the grid's)."""
    return make_program(TileCalculus(e), dev, [tuple(1 for _ in unit), unit], (True, True), 0.0)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_grid_split_inside_the_output_rows_shares_their_lines_between_the_cores(dev):
    """4 images x 17 channels -> 176 1x1 filters over 7 x 7 (49 pixels a plane of 196 bytes) on
    two cores. Unit tiles of 32 of the 49 pixels: the cores split every one of the 704 planes, a
    line at pixel 32 and one at the plane's end, less the planes whose start puts them on a
    line's start (gcd(64, 196) = 4 bytes: one in 16 of each): 2 x (704 - 44) lines, priced at
    SHARED_LINE_CYCLES each. Unit tiles of 88 whole-plane filters meet in 4 rows (one per image,
    each 88 x 196 bytes: the boundary 17,248 bytes in, not on a line: 4 lines); of 2 whole
    images, not at all (one row: a line per core, left out)."""
    e = _pointwise_conv(dev, N=4, C=17, H=7, W=7, F=176)
    assert e.output.shape == (4, 176, 49) and dev.compute_units == 2
    pixels = _unit(e, (4, 176, 32, 17), dev)
    assert shared_output_lines(pixels, dev) == 2 * (704 - 704 // 16)
    assert shared_output_lines(_unit(e, (4, 88, 49, 17), dev), dev) == 4
    assert shared_output_lines(_unit(e, (2, 176, 49, 17), dev), dev) == 0
    seconds = dict(estimate(pixels, dev).load_seconds)["output lines two cores write"]
    assert seconds == pytest.approx(2 * (704 - 44) * SHARED_LINE_CYCLES / (clock_ghz(pixels, dev) * 1e9))
    one_core = replace(dev, compute_units=1)
    assert shared_output_lines(pixels, one_core) == 0
    assert "output lines two cores write" not in dict(estimate(pixels, one_core).load_seconds)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_matmuls_rows_split_at_a_line_share_only_their_ends(dev):
    """C (64 x 256) on two cores in unit tiles of 64 x 128: every row of 1,024 bytes is cut at
    512 bytes, a line's start, and ends on one: nothing shared. 64 x 125 of a 64 x 250 C: cut at
    500 bytes, never a line's start (rows of 1,000 bytes start on multiples of gcd(64, 1000) = 8
    bytes, and 500 is none), the row ends shared in 7 of 8: 64 + 56 lines."""
    assert shared_output_lines(_unit(plain_matmul(64, 256, 32), (64, 128, 32), dev), dev) == 0
    assert shared_output_lines(_unit(plain_matmul(64, 250, 32), (64, 125, 32), dev), dev) == 64 + 56


@pytest.mark.parametrize("seed", range(8))
def test_shared_output_lines_agree_with_visiting_every_element(seed):
    """Each output element's core (its unit tile's place in the fused grid, dealt in chunks of
    ceil(tiles / cores)) and line, counted: the lines two cores write. The closed form is within
    a fifth of that with two or three cores (its rows' alignment is a share, not each row's),
    and within a third with four, where boundaries of two axes meeting at one row end count it
    twice. Rows at least a line long (the template's contiguous axis carries its lanes)."""
    import random

    import numpy as np

    rng = random.Random(seed)
    for _ in range(12):
        cores = rng.choice((2, 3, 4))
        dev = replace(rng.choice((AVX2, AVX512)), compute_units=cores)
        if rng.random() < 0.5:
            m, n = rng.randint(2, 90), rng.randint(16, 300)
            e = plain_matmul(m, n, 8)
            unit = (rng.randint(1, m), rng.randint(1, n), 8)
        else:
            e = fuse_axes(expr("conv2d", N=rng.randint(1, 4), C=3, H=rng.randint(3, 12), W=rng.randint(16, 40),
                               F=rng.randint(1, 40), KH=1, KW=1, stride=1, pad=0))
            unit = tuple(rng.randint(1, x) if a in e.spatial else x for a, x in enumerate(e.extents))
        program = _unit(e, unit, dev)
        spatial, out = e.spatial, e.output
        grid = [ceil(e.extents[a] / unit[a]) for a in spatial]
        coords = np.indices([e.extents[a] for a in spatial]).reshape(len(spatial), -1)
        core = np.ravel_multi_index([coords[i] // unit[a] for i, a in enumerate(spatial)], grid) // ceil(prod(grid) / cores)
        element = sum((sum(coeffs[a] * coords[i] for i, a in enumerate(spatial)) + const) * out.strides[d]
                      for d, (coeffs, const) in enumerate(out.index))
        lines = np.unique(np.stack([element * out.itemsize // dev.layers[-1].transaction_bytes, core]), axis=1)[0]
        visited = int((np.unique(lines, return_counts=True)[1] > 1).sum())
        share = 0.35 if cores == 4 else 0.2
        assert abs(shared_output_lines(program, dev) - visited) <= share * visited + 2 * cores, (e.extents, unit, cores)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_cpu_split_program_prices_its_parts_and_their_sum_in_closed_form(dev):
    """4 x 4096 x 300 in one unit tile (4 x 304 x 256: 16 K-steps), split over K in two parts
    of 8 steps: the compute spread over both cores instead of one, the partial sums (2 x 4 x 300
    floats where the unsplit program stores 4 x 300, read back, the results written) at the
    bottom layer's bandwidth on one core, after the parallel loop (`cpu.split_sum_seconds`).
    A K of 4100 makes 17 steps, parts of 9 and 8: the longer sets the time, 18/17 of an even
    share (`part_imbalance`)."""
    tiles = [(4, 16, 16), (4, 64, 16), (4, 304, 256)]
    whole = make_program(TileCalculus(plain_matmul(4, 300, 4096)), dev, tiles, (True,) * 3, 0.0)
    split = replace(whole, split=2, grid=2)
    out = 4 * 300 * 4
    assert partial_sum_bytes(split) == out + 2 * out + out and partial_sum_bytes(whole) == 0
    bottom = layer_gbps(split, dev, len(dev.layers) - 1) * 1e9
    assert split_sum_seconds(split, dev) == pytest.approx(4 * out / bottom, rel=1e-12)
    assert split_sum_seconds(whole, dev) == 0.0
    one, both = estimate(whole, dev), estimate(split, dev)
    assert both.compute_seconds == pytest.approx(one.compute_seconds / 2, rel=1e-12)
    assert part_imbalance(split, dev) == part_imbalance(whole, dev) == 1.0
    assert both.predicted_seconds < one.predicted_seconds
    # each core copies the panels of its part's 8 K-steps, half of the unsplit core's 16
    plan = cpu_plan(whole, dev)
    assert plan.packed and packed_tile_bytes(split, dev, plan.packed, plan.pack_layer) * 2 == packed_tile_bytes(
        whole, dev, plan.packed, plan.pack_layer)
    ragged = make_program(TileCalculus(plain_matmul(4, 300, 4100)), dev, tiles, (True,) * 3, 0.0)
    assert part_imbalance(replace(ragged, split=2, grid=2), dev) == pytest.approx(18 / 17, rel=1e-12)
    assert part_imbalance(replace(ragged, split=2, grid=2), device("v100")) == 1.0  # a GPU's waves: unpriced


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_an_input_read_from_dram_in_strips_moves_again_at_strips_share(dev):
    """16 x 4901 x 7705 (B 151 MB) past a 32 MiB last-level cache in unit tiles 192 columns
    wide: B's data tiles (29 of its rows x 192 columns, 41 x 169 of them) cost their bytes once
    more at DRAM's bandwidth over STRIPS_SHARE, in the DRAM stage and nowhere else; unit tiles
    spanning N whole (7712) read whole rows and pay nothing, nor does anything where the operator
    stays in the cache or on a spec that names none. A (314 KB) stays in the L2. A one-row
    matmul's B, whose runs `stream_seconds` prices, pays nothing here either."""
    e = matmul(16, 7705, 4901)
    w, dram = 2 * dev.warp_size, dev.layers[-1].bandwidth_gbps
    llc = replace(dev, llc_bytes=32 * 2**20, llc_gbps=3 * dram)
    tiles = [(4, w, 1), (16, w, 29), (16, 192, 29)]
    strips = make_program(TileCalculus(e), llc, tiles, (True, True, True), 0.0)
    extra = 29 * 192 * 4 * ceil(7705 / 192) * 169 * (1 / STRIPS_SHARE - 1) / (dram * GB)
    assert strips_seconds(strips, llc, 1.0) == pytest.approx(extra)
    charged, plain = dict(estimate(strips, llc).load_seconds), dict(estimate(strips, dev).load_seconds)
    assert charged.pop("DRAM") - plain.pop("DRAM") == pytest.approx(extra)
    assert charged == plain
    whole = make_program(TileCalculus(e), llc, tiles[:2] + [(16, 7712, 29)], (True, True, True), 0.0)
    assert strips_seconds(whole, llc, 1.0) == 0
    assert strips_seconds(strips, replace(llc, llc_bytes=2**30), 1.0) == strips_seconds(strips, dev, 1.0) == 0
    one_row = make_program(TileCalculus(matmul(1, 7705, 4901)), llc, [(1, w, 1), (1, w, 29), (1, 192, 29)], (True,) * 3, 0.0)
    assert strips_seconds(one_row, llc, 1.0) == 0


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_an_output_buffer_past_the_l2_moves_at_the_last_level_caches_bandwidth(dev):
    """Unit tiles of 16 x 7712 x 29 (a K-step of B's whole rows, 894 KB, beside C's 493 KB
    buffer) leave the accumulators' buffer in no cache layer of the spec (`accumulator_home`:
    DRAM). A 32 MiB last-level cache holds both cores' buffers and tiles (`buffer_in_llc`), a 2
    MiB one does not; where it does, the accumulators' trips move at its bandwidth: the DRAM
    stage is shorter by their bytes at DRAM's bandwidth less at the cache's, and nothing else
    changes."""
    e = matmul(16, 7705, 4901)
    w, dram = 2 * dev.warp_size, dev.layers[-1].bandwidth_gbps
    roomy, tight = (replace(dev, llc_bytes=mib * 2**20, llc_gbps=3 * dram) for mib in (32, 2))
    program = make_program(TileCalculus(e), roomy, [(4, w, 1), (16, w, 29), (16, 7712, 29)], (True, True, True), 0.0)
    assert accumulator_home(program, roomy) == len(dev.layers) - 1
    assert buffer_in_llc(program, roomy) and not buffer_in_llc(program, tight)
    trips = TileCalculus(e).accumulator_bytes(program.register_tile, accumulator_steps(program),
                                              partial_sums(e, roomy, program.register_tile)) + buffer_bytes(program, roomy)
    busy = min(1.0, program.grid / dev.compute_units)
    held, spilled = dict(estimate(program, roomy).load_seconds), dict(estimate(program, tight).load_seconds)
    assert spilled.pop("DRAM") - held.pop("DRAM") == pytest.approx(trips * (1 / dram - 1 / (3 * dram)) / (GB * busy))
    assert held == spilled
