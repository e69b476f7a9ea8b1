"""Roller's alignment rules (§3.1), restated here from the paper and checked against the code.

`violations` below is an independent statement of the four rules over whole tiles; the tests
check that `is_aligned` agrees with it, that `next_aligned_sizes` / `prev_aligned_sizes` return
the nearest sizes it accepts, and the bank padding formula on worked examples and by brute force.
"""

from dataclasses import replace
from itertools import product
from math import ceil, gcd, lcm, prod

import pytest
from helpers import TINY_CPU, device, expr, matmul, suite_workloads, unique_workloads, workload_expr
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_invariants import conv_filters, simd_lane_axis, spread_reduce_axis

from workbench.construct.space import Options, with_axis
from workbench.construct.stepper import construct
from workbench.hardware.registers import register_budget
from workbench.ops.fusion import fuse_axes
from workbench.ops.gemm_view import construction_expr
from workbench.rtile.alignment import (
    RULES, initial_tile, is_aligned, next_aligned_sizes, padded_row_axis, port_free_tile, prev_aligned_sizes,
    required_accumulators, unfilled_tile,
)
from workbench.rtile.axes import (
    STREAM_ROWS, cross_thread_axis, filter_axis, lane_axis, mma_axes, short_filter_axis, stream_rows,
)
from workbench.rtile.plan import cpu_plan
from workbench.rtile.registers import (
    HOISTED_WINDOW, accumulators, live_registers, micro_kernel_registers, partial_sums, row_vectors, step_loads,
)
from workbench.rtile.rprogram import layer_capacity, layer_footprint
from workbench.rtile.rules import (
    MAX_SCAN, PAD_VECTORS, REGISTER_STEPS, AlignContext, CacheSetRule, StreamRowsRule, TailRule, TensorShapeRule,
    VectorLanesRule,
    WarpGroupRule,
    WeightsAheadRule,
    block_thread_multiple, dividing_axes, dividing_reduction, l1_set_lines, whole_vector_bound, whole_vector_waste,
)
from workbench.rtile.traffic import bank_padding, calculus

DEVICES = ("v100", "mi50", "k80", "tiny-cpu")
EXPRS = {
    "mm-prime": lambda: matmul(257, 127, 509),
    "mm-1024": lambda: matmul(1024, 1024, 1024),
    "mm-M1": lambda: matmul(128, 1000, 4032),
    "gemv": lambda: expr("gemv", M=4096, K=1000),
    "gemv-4k-rows": lambda: expr("gemv", M=96, K=1024),  # every row in one L1 set
    "conv-s2": lambda: expr("conv2d", N=8, C=64, H=30, W=30, F=96, KH=3, KW=3, stride=2, pad=1),
    "dwconv-m4": lambda: expr("depthwise_conv2d", N=4, C=84, H=21, W=21, KH=1, KW=1, stride=1, pad=0, multiplier=4),
    "avgpool": lambda: expr("avgpool", N=16, C=48, H=48, W=48, K=3, stride=2, pad=1),
    "reduce": lambda: expr("reduce_mean", shape=(128, 512, 1000), axes=(2,)),
    "relu": lambda: expr("relu", shape=(17, 11, 3)),
}


def violations(e, dev, layer, upper, tile, eps) -> list[str]:
    """Every rule a tile breaks at `layer` under the upper-layer tile `upper` (empty: aligned)."""
    out = []
    for a, (size, axis) in enumerate(zip(tile, e.axes)):
        if size % upper[a]:
            out.append(f"{axis.name}: not a multiple of the tile above")
        if (ceil(axis.extent / size) * size - axis.extent) / axis.extent > eps + 1e-9:
            out.append(f"{axis.name}: tensor shape (waste over eps)")
    if layer > 0:  # memory transaction, for data loaded from the layer below
        tx = dev.layers[layer + 1].transaction_bytes
        for t, tensor in enumerate(e.inputs):
            coeffs, _ = tensor.index[-1]
            used = [a for a, c in enumerate(coeffs) if c]
            whole = len(used) == 1 and coeffs[used[0]] == 1 and tile[used[0]] >= e.axes[used[0]].extent
            if len(used) == 1 and coeffs[used[0]] == 1 and not whole and e.data_tile_shape(t, tile)[-1] * tensor.itemsize % tx:
                out.append(f"{tensor.name}: leading dim not whole transactions")
    if dev.kind == "gpu" and layer == 0:
        out += [f"{a.name}: register step" for s, a in zip(tile, e.axes) if s not in REGISTER_STEPS and s != a.extent]
        k = spread_reduce_axis(e, dev)
        if k is not None:
            out += [f"{e.axes[a].name}: a thread of a cross-thread reduction" for a in e.spatial if tile[a] != 1]
            if ceil(e.axes[k].extent / tile[k]) < dev.warp_size or tile[k] not in REGISTER_STEPS:
                out.append(f"{e.axes[k].name}: fewer than a warp of threads along the row")
    if dev.kind == "gpu" and layer == dev.unit_layer_index:
        k = spread_reduce_axis(e, dev)
        threads = prod(tile[a] // upper[a] for a in e.spatial) * (tile[k] // upper[k] if k is not None else 1)
        threads *= dev.warp_size if mma_axes(e, dev) else 1  # a fragment tile is a warp's
        covers = all(tile[a] >= e.axes[a].extent for a in (e.spatial if k is None else [k]))
        if threads % dev.warp_size and not covers:
            out.append("threads not a multiple of the warp")
        outputs = prod(min(tile[a], e.axes[a].extent) for a in e.spatial)
        if k is None and threads % dev.warp_size and covers and threads < min(dev.warp_size, outputs):
            out.append("a whole-output block of fewer than a warp's threads, or than its outputs")
        # a block with a thread per output: a warp per scheduler, 4 x 32 threads on the NVIDIA
        # presets, where the block cap holds four such groups (not the MI50's 4 x 64 of 512)
        group = dev.teu_per_unit * dev.warp_size
        group = group if 4 * group <= dev.max_threads_per_block else dev.warp_size
        if k is None and threads % group and not covers:
            out.append("threads not whole groups of a warp per scheduler")
        if k is not None and threads < dev.warp_size:
            out.append("a cross-thread reduction's block shorter than a warp")
        if k is not None:
            out += [f"{e.axes[a].name}: a block of a cross-thread reduction" for a in e.spatial if tile[a] != upper[a]]
    if dev.kind == "cpu" and layer == 0:
        v = simd_lane_axis(e, dev)
        if v is not None and tile[v] % dev.warp_size and tile[v] != e.axes[v].extent:
            out.append("lane axis not a multiple of the SIMD lanes")
        if v is not None and e.axes[v].kind == "reduce":  # K in 1, 2, 4, ... steps of whole lines of vectors
            step = lcm(dev.warp_size, *(64 // t.itemsize for t in e.inputs if any(c[v] for c, _ in t.index)))
            steps = tile[v] // step
            if tile[v] % step == 0 and steps & (steps - 1):
                out.append("a reduction's lanes not a power of two of steps")
        if v is not None and tile[v] % dev.warp_size and tile[v] == e.axes[v].extent:
            # the whole axis: in whole 4-lane pieces where the template vectorises it (a conv's
            # filters however short, a spatial row longer than the lanes), and not in LLVM's
            # pieces where eps admits padding it to whole vectors (`whole_vector_waste`)
            if v == conv_filters(e):
                pieces = tile[v] % 4 == 0
            else:
                pieces = e.axes[v].kind != "spatial" or e.axes[v].extent < dev.warp_size or tile[v] % 4 == 0
            if not pieces:
                out.append("a whole row not in whole 4-lane pieces")
            waste = whole_vector_waste(e, dev)
            if waste is not None and waste <= min(eps, whole_vector_bound(e, dev)) + 1e-12:
                out.append("a whole row of LLVM's pieces where eps pads it to whole vectors")
        # no lane axis, but an output row read strided: LLVM vectorises it in 4-lane pieces, or
        # packs neighbouring rows of 1 or 2; its register tile unrolls one window row
        row = e.output.index[-1][0] if e.output.index else ()
        a = next((a for a, c in enumerate(row) if c == 1), None) if sum(1 for c in row if c) == 1 else None
        if v is None and a is not None and e.axes[a].kind == "spatial":
            if tile[a] > 2 and tile[a] % 4 and tile[a] != e.axes[a].extent:
                out.append("autovectorised row not whole 4-lane pieces")
            out += [f"{e.axes[r].name}: more than one window row" for r in e.reduce[:-1] if tile[r] != 1]
    filters = dev.kind == "cpu" and simd_lane_axis(e, dev) is not None and simd_lane_axis(e, dev) == conv_filters(e)
    v = simd_lane_axis(e, dev) if dev.kind == "cpu" else None
    along_k = v is not None and e.axes[v].kind == "reduce"  # gemv, row sums: lanes along a reduction
    if dev.kind == "cpu" and layer == 0 and along_k and dev.layers[1].ways:
        # one step reads the tile's rows x its lanes of every input along k: per input, the most
        # of those lines in one set (row-major addresses from 0), summed, within the ways
        l1 = dev.layers[1]
        sets = l1.capacity_bytes // (l1.ways * 64)
        total = 0
        for tensor in e.inputs:
            if not any(c[v] for c, _ in tensor.index):
                continue
            axes = [a for a in range(len(e.axes)) if any(c[a] for c, _ in tensor.index) and (a == v or a in e.spatial)]
            per_set = {}
            for point in product(*(range(tile[a]) for a in axes)):
                at = dict(zip(axes, point))
                flat = 0
                for (coeffs, _), size in zip(tensor.index, tensor.shape):
                    flat = flat * size + sum(c * at.get(a, 0) for a, c in enumerate(coeffs))
                line = flat * tensor.itemsize // 64
                per_set.setdefault(line % sets, set()).add(line)
            total += max(len(x) for x in per_set.values())
        if total > l1.ways:
            out.append("more lines in one L1 set than it has ways")
    if dev.kind == "cpu" and (layer > 0 or filters or along_k):
        tails = [a for a in e.reduce] + ([v] if v is not None and e.axes[v].kind == "spatial" else [])
        tails += [a for a in e.spatial if filters and a not in tails]  # a conv along its filters: every axis
        if layer == 0 and not filters:
            tails = list(e.spatial) + [v]  # lanes along k: the micro-kernel's rows and its K
        for a in tails:
            n, u = e.axes[a].extent, upper[a]
            # some tile short of the axis, within 128 multiples of the one above, divides it and
            # is whole 64 B lines for every input whose contiguous dimension the axis alone indexes
            # (registers are filled by vector loads: no lines at the top layer)
            lines = lambda s: layer == 0 or all(  # noqa: E731
                s * t.itemsize % 64 == 0 for t in e.inputs if t.index and t.index[-1][0][a] == 1
                and sum(1 for c in t.index[-1][0] if c) == 1
            )
            whole = n % u == 0 and any(n % s == 0 and lines(s) for s in range(u, min(n - u, 128 * u) + 1, u))
            if layer == 0 and along_k and not filters and a != v:  # rows: some size from 2 to 128 divides
                whole = any(n % s == 0 for s in range(2, min(n, 129)))
            if layer == 0 and along_k and not filters and a == v:  # K: some whole lines of whole vectors
                step = lcm(dev.warp_size, *(64 // t.itemsize for t in e.inputs if any(c[v] for c, _ in t.index)))
                whole = any(n % s == 0 for s in range(step, n, step))
            if whole and n % tile[a]:
                out.append(f"{e.axes[a].name}: ragged cache tile along the vectors or a reduction")
    return out


@st.composite
def aligned_state(draw):
    """(expr, device, layer, upper tile, aligned tile, eps): grown from the smallest aligned tile
    by a random walk of next-aligned steps, layer by layer."""
    e = fuse_axes(EXPRS[draw(st.sampled_from(sorted(EXPRS)))]())
    dev = device(draw(st.sampled_from(DEVICES)))
    eps = draw(st.sampled_from([0.05, 0.1, 0.2, 0.4, 0.7, 1.0]) | st.floats(0.0, 1.0))
    last = draw(st.integers(0, len(dev.layers) - 2))
    upper = tuple(1 for _ in e.axes)
    for layer in range(last + 1):
        ctx = AlignContext(e, dev, layer, upper, eps)
        tile = initial_tile(ctx)
        assume(tile is not None)
        for _ in range(draw(st.integers(0, 6))):
            sizes = next_aligned_sizes(ctx, tile)
            axes = [a for a, s in enumerate(sizes) if s is not None]
            if not axes:
                break
            a = draw(st.sampled_from(axes))
            tile = tile[:a] + (sizes[a],) + tile[a + 1 :]
        if layer < last:
            upper = tile
    return e, dev, last, upper, tile, eps


@settings(max_examples=100, deadline=None)
@given(aligned_state(), st.data())
def test_a_rule_left_out_where_it_does_not_apply_accepts_everything_there(case, data):
    """The scans ask only the rules that apply on the device (`AlignmentRule.applies`,
    `alignment._partition`): one left out accepts every size along every axis, and every tile,
    at any context there, so leaving it out changes no answer."""
    e, dev, layer, upper, tile, eps = case
    ctx = AlignContext(e, dev, layer, upper, eps)
    left_out = [r for r in RULES if hasattr(r, "applies") and not r.applies(dev)]
    assert left_out  # every device kind leaves some out: GPU threads' rules or a CPU core's
    for axis in range(len(tile)):
        extent = e.axes[axis].extent
        size = data.draw(st.integers(1, extent), label=f"size {axis}")
        assert all(r.axis_ok(ctx, axis, size) for r in left_out)
        assert all(r.axis_ok(ctx, axis, s) for r in left_out for s in (tile[axis], extent))
    assert all(r.tile_ok(ctx, tile) for r in left_out)


@settings(max_examples=150, deadline=None)
@given(aligned_state())
def test_walk_stays_aligned_and_neighbours_are_the_nearest_aligned_sizes(case):
    e, dev, layer, upper, tile, eps = case
    ctx = AlignContext(e, dev, layer, upper, eps)
    assert violations(e, dev, layer, upper, tile, eps) == []
    assert is_aligned(ctx, tile)
    for sizes, step in ((next_aligned_sizes(ctx, tile), +1), (prev_aligned_sizes(ctx, tile), -1)):
        for a, size in enumerate(sizes):
            if size is None:
                continue
            assert (size - tile[a]) * step > 0 and size % upper[a] == 0
            # a register row past the axis's end in whole vectors only (`alignment.padded_row_axis`)
            end = ceil(e.axes[a].extent / dev.warp_size) * dev.warp_size if padded_row_axis(e, dev) == a and layer == 0 else 0
            assert size <= max(end, ceil(e.axes[a].extent / upper[a]) * upper[a])
            moved = tile[:a] + (size,) + tile[a + 1 :]
            assert violations(e, dev, layer, upper, moved, eps) == [], (a, size)
            # past MAX_SCAN steps up, the next size is the whole axis (`alignment._scan`)
            end = size if abs(size - tile[a]) <= MAX_SCAN * upper[a] else tile[a] + MAX_SCAN * upper[a] + 1
            for between in range(tile[a] + step * upper[a], end, step * upper[a]):
                skipped = tile[:a] + (between,) + tile[a + 1 :]
                assert violations(e, dev, layer, upper, skipped, eps), (a, between)


@settings(max_examples=150, deadline=None)
@given(aligned_state(), st.data())
def test_is_aligned_agrees_with_the_rules_on_any_tile(case, data):
    e, dev, layer, upper, _, eps = case
    tile = tuple(upper[a] * data.draw(st.integers(1, ceil(x.extent / upper[a]))) for a, x in enumerate(e.axes))
    ctx = AlignContext(e, dev, layer, upper, eps)
    assert is_aligned(ctx, tile) == (violations(e, dev, layer, upper, tile, eps) == [])


@pytest.mark.parametrize("name, threads, block", [("v100", 128, (32, 64)), ("a100", 128, (32, 64)), ("mi50", 64, (32, 32))])
def test_gpu_block_starts_with_one_warp_per_scheduler(name, threads, block):
    """The smallest block is a warp per warp scheduler (4 x 32 threads on the V100 and A100; on
    the MI50 a wavefront of 64: 4 x 64 would leave its 512-thread cap two block sizes), split
    over i and j for the least traffic (8 x 16 threads of 4 x 4 tiles: 32 x 64; 1 x 128 would be a 4 x 512 tile reading 5.4x the bytes per output,
    1/4 + 1/512 against 1/32 + 1/64 per element of K); without `WarpGroupRule` (the rules
    before issue 16) it is one warp."""
    dev = device(name)
    e = matmul(1024, 1024, 1024)
    reg = (4, 4, 1)
    ctx = AlignContext(e, dev, dev.unit_layer_index, reg, 0.05)
    tile = initial_tile(ctx)
    assert prod(tile[a] // reg[a] for a in e.spatial) == threads == block_thread_multiple(dev)
    assert tile[:2] == block
    older = tuple(r for r in RULES if not isinstance(r, WarpGroupRule))
    assert prod(initial_tile(ctx, older)[a] // reg[a] for a in e.spatial) == dev.warp_size
    for dev in (device("v100"), device("mi50")):
        tile = initial_tile(AlignContext(e, dev, dev.unit_layer_index, reg, 0.05))
        # shared memory: k is A's leading dim; 32 B (V100) / 64 B (MI50) transactions of 4 B floats
        assert tile[2] == dev.layers[-1].transaction_bytes // 4


GPUS = ("v100", "a100", "h100", "mi50", "k80")


@st.composite
def gpu_block_case(draw):
    """(expr, GPU, eps, register tile): the block layer's upper tile is an aligned register
    tile, grown from the smallest one by a random walk of next-aligned steps."""
    e = fuse_axes(EXPRS[draw(st.sampled_from(sorted(EXPRS)))]())
    dev = device(draw(st.sampled_from(GPUS)))
    eps = draw(st.sampled_from([0.0, 0.05, 0.2, 0.4, 1.0]))
    ctx = AlignContext(e, dev, 0, tuple(1 for _ in e.axes), eps)
    reg = initial_tile(ctx)
    assume(reg is not None)
    for _ in range(draw(st.integers(0, 4))):
        sizes = next_aligned_sizes(ctx, reg)
        axes = [a for a, s in enumerate(sizes) if s is not None]
        if not axes:
            break
        a = draw(st.sampled_from(axes))
        reg = reg[:a] + (sizes[a],) + reg[a + 1 :]
    return e, dev, eps, reg


def spatial_multiples(e, upper, most: int):
    """Every choice of per-spatial-axis multiples m (m x upper within the axis) with prod(m) <= most."""
    def rec(axes, left):
        if not axes:
            yield ()
            return
        a = axes[0]
        for m in range(1, min(left, ceil(e.axes[a].extent / upper[a])) + 1):
            for rest in rec(axes[1:], left // m):
                yield (m,) + rest
    return rec(list(e.spatial), most)


@settings(max_examples=120, deadline=None)
@given(gpu_block_case())
def test_gpu_block_initial_tile_is_the_smallest_aligned_one(case):
    """Issue 16: filling a warp along the innermost axes in powers of two missed every block
    whose warp splits over other axes (a 26 x 26 conv output). Checked against the rules as
    restated in `violations`: no aligned block over the same register tile runs fewer threads,
    none with as many pads the spatial axes less, and each reduce axis is the smallest aligned
    size. Where it finds none, no block of up to four warps is aligned. A cross-thread
    reduction's block spreads its threads along a reduce axis instead (tested below)."""
    e, dev, eps, reg = case
    assume(spread_reduce_axis(e, dev) is None)
    layer = dev.unit_layer_index
    tile = initial_tile(AlignContext(e, dev, layer, reg, eps))

    def block(ms, base):
        out = list(base)
        for a, m in zip(e.spatial, ms):
            out[a] = m * reg[a]
        return tuple(out)

    def padded(t):
        return prod(ceil(e.axes[a].extent / t[a]) * t[a] for a in e.spatial)

    if tile is None:
        # the reduce axes whole: aligned whenever any size of theirs is (no transaction to
        # split, the register tile's padding), and the thread count ignores them
        base = tuple(ceil(x.extent / r) * r if a in e.reduce else r for a, (x, r) in enumerate(zip(e.axes, reg)))
        for ms in spatial_multiples(e, reg, 4 * dev.warp_size):
            assert violations(e, dev, layer, reg, block(ms, base), eps), ms
        return
    assert violations(e, dev, layer, reg, tile, eps) == []
    threads = prod(tile[a] // reg[a] for a in e.spatial)
    assert threads <= dev.max_threads_per_block
    for ms in spatial_multiples(e, reg, threads):
        other = block(ms, tile)
        if violations(e, dev, layer, reg, other, eps) == []:
            assert prod(ms) == threads, (other, tile)
            assert padded(other) >= padded(tile), (other, tile)
    for a in e.reduce:
        for smaller in range(reg[a], tile[a], reg[a]):
            assert violations(e, dev, layer, reg, tile[:a] + (smaller,) + tile[a + 1 :], eps), (a, smaller)


@pytest.mark.parametrize("name", ["v100", "a100", "h100"])
def test_conv_block_splits_its_warp_over_filters_and_output_rows(name):
    """Roller table 1's C0 (128 filters over a 26 x 26 output): four warps as 2 images x 16
    filters x 2 x 2 outputs pad nothing, where 16 x 2 along the output row would pad 26 to 32,
    and read the least (of the zero-waste splits of 128 threads, `_warp_fill`); a thread's tile
    [1, 1, 1, 1, ...] is taken at eps 0. The reduce window s is A's leading dimension, taken
    whole (3 floats are less than a 32 B transaction)."""
    dev = device(name)
    c0 = next(w for w in suite_workloads("roller-table1") if w["id"] == "C0")
    e = fuse_axes(workload_expr(c0))
    assert [x.extent for x in e.axes] == [128, 128, 26, 26, 128, 3, 3]
    tile = initial_tile(AlignContext(e, dev, dev.unit_layer_index, (1,) * 7, 0.0))
    assert tile == (2, 16, 2, 2, 1, 1, 3)


def test_tensor_shape_rule_bounds_padding_waste():
    e = matmul(257, 127, 509)
    ctx = AlignContext(e, device("tiny-cpu"), 1, (1, 1, 1), 0.05)
    sizes = next_aligned_sizes(ctx, (1, 1, 1))
    # i: 257 is prime; 2 wastes 1/257, and so on; 16 -> 272 wastes 15/257 > 5 %
    for a, size in enumerate(sizes):
        extent = e.axes[a].extent
        assert (ceil(extent / size) * size - extent) / extent <= 0.05
    wide = AlignContext(e, device("tiny-cpu"), 1, (1, 1, 1), 1.0)
    assert all(s is not None for s in next_aligned_sizes(wide, (1, 1, 1)))


def test_cpu_register_tile_vectorises_the_output_axis():
    dev = device("tiny-cpu")
    e = matmul(512, 512, 512)
    tile = initial_tile(AlignContext(e, dev, 0, (1, 1, 1), 0.05))
    assert tile[1] % dev.warp_size == 0  # j indexes C's contiguous dimension
    short = matmul(512, 10, 512)
    assert initial_tile(AlignContext(short, dev, 0, (1, 1, 1), 0.05))[1] == 10  # the whole axis


# -- CPU register micro-kernels (issue 14) ----------------------------------------------------


def generated_cpu(name: str, lanes: int, registers: int, latency: int, pipes: int, cap: int | None = None):
    """A CPU spec of `lanes` fp32 lanes, `registers` vector registers (all usable unless `cap`)
    and an FMA of `latency` cycles on `pipes` pipes, caches as TINY_CPU's: never this machine."""
    vector = 4 * lanes
    top = replace(TINY_CPU.layers[0], capacity_bytes=registers * vector, transaction_bytes=vector)
    return replace(
        TINY_CPU, name=name, warp_size=lanes, registers_per_unit=registers, registers_per_thread_cap=cap or registers,
        layers=(top,) + TINY_CPU.layers[1:], fma_latency_cycles=latency, fma_pipes=pipes,
    )


AVX2 = generated_cpu("avx2-like", 8, 16, 5, 2)  # Zen 2: 5-cycle FMA x 2 pipes, 16 ymm
AVX512 = generated_cpu("avx512-like", 16, 32, 4, 2)  # Skylake-SP: 4-cycle FMA x 2 pipes, 32 zmm


@pytest.mark.parametrize(
    "dev, tile, acc, regs",
    [
        (AVX2, (6, 16, 1), 12, 15),  # BLAS's AVX2 kernel: 12 accumulators + 2 vectors of B + 1 broadcast of A
        (AVX2, (6, 16, 8), 12, 15),  # the reduce extent is unrolled over the same registers
        (AVX2, (4, 24, 1), 12, 16),
        (AVX2, (2, 8, 1), 2, 4),  # round 1's top-1 tile
        (AVX2, (8, 16, 1), 16, 19),  # over the 16 ymm
        (AVX512, (14, 32, 1), 28, 31),  # BLAS's AVX-512 kernels
        (AVX512, (6, 64, 1), 24, 29),
    ],
)
def test_micro_kernel_registers_count_vectors_not_scalar_bytes(dev, tile, acc, regs):
    """accumulators = rows x vectors per row; registers = accumulators + one row of B + one
    broadcast of A; the register layer's footprint is that many whole vector registers."""
    e = matmul(512, 512, 512)
    assert (accumulators(e, dev, tile), micro_kernel_registers(e, dev, tile)) == (acc, regs)
    footprint = layer_footprint(calculus(e), dev, 0, tile)
    assert footprint == regs * 4 * dev.warp_size
    assert (footprint <= layer_capacity(dev, 0)) == (regs <= dev.registers_per_unit)


def test_micro_kernel_registers_of_other_operators():
    """gemv y[i] = A[i, k] x[k]: A's rows are strided along i (a gather), so its lanes run along
    k, each output a vector of partial sums: r rows x c vectors of k accumulators, a row of c
    vectors of A and of x. relu: one row of its input, no broadcast. A stride-2 conv of one
    filter (under a quarter of a vector, too few to pad to one) gathers every other input along
    its output row and its window (3) is shorter than a vector: scalar code, a register per
    output. A 12-wide fp32 row takes 2 ymm (12 of 16 lanes)."""
    gemv, relu = expr("gemv", M=4096, K=1000), expr("relu", shape=(17, 11, 3))
    conv = expr("conv2d", N=1, C=64, H=30, W=30, F=1, KH=3, KW=3, stride=2, pad=1)
    assert [lane_axis(e, AVX2) for e in (gemv, relu, conv)] == [1, 2, None]
    assert (accumulators(gemv, AVX2, (4, 16)), micro_kernel_registers(gemv, AVX2, (4, 16))) == (8, 8 + 2 + 2)
    assert (accumulators(gemv, AVX2, (6, 12)), micro_kernel_registers(gemv, AVX2, (6, 12))) == (12, 12 + 2 + 2)
    assert (accumulators(relu, AVX2, (2, 3, 3)), micro_kernel_registers(relu, AVX2, (2, 3, 3))) == (6, 6 + 1)
    outputs = prod(conv.data_tile_shape(len(conv.tensors) - 1, (1, 1, 2, 4) + (1, 1, 1)))
    assert outputs == 8 and accumulators(conv, AVX2, (1, 1, 2, 4, 1, 1, 1)) == 8
    assert micro_kernel_registers(conv, AVX2, (1, 1, 2, 4, 1, 1, 1)) == 8 + 1  # both inputs scalar: one register


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_b_stored_transposed_streams_the_rows_of_a(dev):
    """A matmul with B stored transposed ([N, K]) runs its lanes along K, each output a vector of
    partial sums: r rows of A by c rows of B keep r x c accumulators. Every row of both feeds
    several of them; B's c rows stay live while A's stream through as many registers as B keeps
    (`registers._streamed_rows`): r x c + c + min(r, c), where every row of both counted 11 x 2
    on AVX-512 as 35 of the 32 zmm. A tile of one row or one column shares neither input's
    rows: one row of each."""
    e = expr("matmul", M=64, K=48, N=32, trans_b=True)
    lane = lane_axis(e, dev)
    assert e.axes[lane].kind == "reduce"
    for r, c in ((11, 2), (6, 4), (5, 5), (3, 8), (3, 7), (2, 2), (1, 8), (8, 1)):
        tile = (r, c, dev.warp_size)
        want = r * c + (c + min(r, c) if r > 1 and c > 1 else 2)
        assert micro_kernel_registers(e, dev, tile) == want, (r, c)
    budget = register_budget(AVX512)
    fits = [(r, c) for r, c in ((11, 2), (11, 3), (6, 4), (5, 5), (3, 7), (3, 8))
            if micro_kernel_registers(e, AVX512, (r, c, 16)) <= budget]
    assert budget == 32 and fits == [(11, 2), (6, 4), (3, 7)]


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_batch_in_the_register_tile_keeps_a_row_of_b_per_batch(dev):
    """bmm b x i x j: B[b, k, j] ignores i, so each of its rows is shared by the tile's i rows
    and stays live, one row of vectors per batch: 3 x 10 x 16 on AVX-512 is 30 accumulators + 3
    rows of B + 1 broadcast = 34, over the 32 zmm (it was counted as 32). A depthwise conv's data
    ignores no spatial axis of the tile: each vector feeds one accumulator, one row (1)."""
    lanes = dev.warp_size
    bmm = expr("matmul", B=12, M=128, K=64, N=128)
    for b, i in ((1, 10), (3, 10), (2, 1), (4, 3)):
        tile = (b, i, lanes, 1)
        rows = b if i > 1 else 1
        assert micro_kernel_registers(bmm, dev, tile) == b * i + rows + 1
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    assert lane_axis(dw, dev) == 3
    tile = (1, 3, 2, lanes, 1, 1)
    assert micro_kernel_registers(dw, dev, tile) == 3 * 2 + 1 + 1  # data row + broadcast weight


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_3x3_depthwise_window_keeps_its_nine_weights_live(dev):
    """A depthwise conv's register tile of one channel reads the weights along its 3 x 3 window
    alone, the same for every tile of the channel: LLVM broadcasts the 9 once and keeps them
    (HOISTED_WINDOW), whether the register tile spans the window or its L1 tile's unrolled loops
    do, so 4 rows of one vector keep 4 + 1 + 9 registers live (`live_registers`), where the
    budget the tiles are built to counts one broadcast (`micro_kernel_registers`: 4 + 1 + 1). A
    tile of two channels (the weights change from tile to tile) and a 5 x 5 window (walked a
    row at a time) keep one broadcast live, as a matmul's A does."""
    lanes = dev.warp_size
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    assert HOISTED_WINDOW == 9
    for window in ((3, 3), (1, 3), (1, 1)):
        tile = (1, 1, 4, lanes) + window
        assert (micro_kernel_registers(dw, dev, tile), live_registers(dw, dev, tile)) == (4 + 1 + 1, 4 + 1 + 9)
    assert live_registers(dw, dev, (1, 2, 4, lanes, 3, 3)) == micro_kernel_registers(dw, dev, (1, 2, 4, lanes, 3, 3))
    dw5 = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=5, KW=5, stride=1, pad=2)
    assert live_registers(dw5, dev, (1, 1, 4, lanes, 5, 5)) == 4 + 1 + 1
    mm = matmul(512, 512, 512)
    assert live_registers(mm, dev, (6, 2 * lanes, 1)) == micro_kernel_registers(mm, dev, (6, 2 * lanes, 1)) == 12 + 2 + 1


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_accumulator_fill_does_not_grow_a_batch(dev):
    """Every accumulator a batch adds brings its own loads (A's broadcast and B's row), so the
    fill that starts a micro-kernel grows the rows and columns: a bmm's start tile keeps b = 1
    and reaches the FMA's latency x pipes accumulators. A depthwise conv's channels index both
    inputs too: its start tile keeps one channel."""
    bmm = expr("matmul", B=12, M=128, K=64, N=128)
    tile = initial_tile(AlignContext(bmm, dev, 0, (1,) * 4, 0.05))
    assert tile[0] == 1 and accumulators(bmm, dev, tile) >= dev.fma_accumulators
    dw = expr("depthwise_conv2d", N=1, C=96, H=112, W=112, KH=3, KW=3, stride=1, pad=1)
    assert initial_tile(AlignContext(dw, dev, 0, (1,) * 6, 0.05))[1] == 1


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_start_with_more_loads_than_fmas_has_a_port_free_second(dev):
    """71 rows pad by more than eps 0.05 at 5, so the accumulator path takes rows of one vector
    4 -> 6 -> 8 (AVX-512: 8 broadcasts and a load for 8 FMAs) or to 12 (AVX2, 10 needed). The
    port-free tile has as many accumulators, loads under its FMAs and the fewest registers: 4 x
    2v (6 loads, 8 FMAs, 11 zmm), 6 x 2v (8, 12, 15 ymm; 5 rows pad). A gemv, whose matrix feeds
    one FMA a load at any width, has none: a load more than its FMAs for each vector of x."""
    lanes, e = dev.warp_size, expr("matmul", M=71, K=203, N=4565)
    ctx = AlignContext(e, dev, 0, (1, 1, 1), 0.05)
    first, second = initial_tile(ctx), port_free_tile(ctx)
    assert first == ((8, lanes, 1) if dev is AVX512 else (12, lanes, 1))
    assert step_loads(e, dev, first) == accumulators(e, dev, first) + 1
    assert second == ((4, 2 * lanes, 1) if dev is AVX512 else (6, 2 * lanes, 1))
    assert step_loads(e, dev, second) <= accumulators(e, dev, second) == accumulators(e, dev, first)
    assert port_free_tile(AlignContext(expr("matmul", M=512, K=512, N=512), dev, 0, (1, 1, 1), 0.05)) is None
    gemv = expr("gemv", M=4096, K=1000)
    gctx = AlignContext(gemv, dev, 0, (1, 1), 0.05)
    tile, vectors = initial_tile(gctx), initial_tile(gctx)[1] // lanes  # of x, and of each of A's rows
    assert step_loads(gemv, dev, tile) == accumulators(gemv, dev, tile) + vectors and port_free_tile(gctx) is None


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_reduction_no_whole_line_tile_divides_has_dividing_tiles_in_their_round(dev):
    """K = 1222 = 2 x 13 x 47 (floats over 64 B lines): no multiple of 16 divides it, while 26,
    47 and 94 do, so in the dividing round (`AlignContext.dividing`) an L1 tile along K is one of
    those (a line or more, dividing K: 13 is under a line), and in the first round one of whole
    lines (176, which leaves a tail). K = 1024 has whole-line divisors, K = 1021 (prime) and K =
    13 no divisor of a line or more, and a GPU never: no round for them."""
    e = expr("matmul", M=4, K=1222, N=64)
    k, line = 2, dev.layers[2].transaction_bytes
    first, dividing = AlignContext(e, dev, 1, (4, 64, 1), 0.1), AlignContext(e, dev, 1, (4, 64, 1), 0.1, dividing=True)
    transaction = next(r for r in RULES if r.name == "memory-transaction")
    assert [s for s in (13, 16, 26, 47, 94, 176) if transaction.axis_ok(dividing, k, s)] == [26, 47, 94]
    assert [s for s in (13, 16, 26, 47, 94, 176) if transaction.axis_ok(first, k, s)] == [16, 176]
    assert dividing_reduction(e, dev, k, 1, 4, line) and dividing_axes(e, dev) == (k,)
    for other in (expr("matmul", M=4, K=1024, N=64), expr("matmul", M=4, K=1021, N=64), expr("matmul", M=4, K=13, N=64)):
        assert not dividing_reduction(other, dev, k, 1, 4, line) and dividing_axes(other, dev) == ()
    assert dividing_axes(e, device("v100")) == ()


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_one_row_start_filled_for_chains_has_an_unfilled_second(dev):
    """A one-row matmul whose core's share of N overflows the L1 (1 x 179 x 4259) starts from a
    row of the accumulators the FMA latency asks for (or as many as the registers hold); its
    second start is the row the per-axis
    rules give without that need: one vector, with fewer accumulators. Not for a matmul of 2
    rows, nor for a one-row matmul whose share fits the L1 (no need to drop: 1 x 61 x 100)."""
    lanes, e = dev.warp_size, expr("matmul", M=1, K=179, N=4259)
    ctx = AlignContext(e, dev, 0, (1, 1, 1), 0.1)  # at 0.05 no row of K-steps divides 179 closely enough
    first, second = initial_tile(ctx), unfilled_tile(ctx)
    held = 7 if dev is AVX2 else dev.fma_accumulators  # 16 ymm hold 7 vectors of a row, its B and a broadcast
    assert accumulators(e, dev, first) == held > accumulators(e, dev, second)
    assert second[:2] == (1, lanes) and port_free_tile(ctx) is None
    assert initial_tile(replace(ctx, unfilled=True)) == second and required_accumulators(replace(ctx, unfilled=True)) == 0
    for other in (expr("matmul", M=2, K=179, N=4259), expr("matmul", M=1, K=61, N=100)):
        assert unfilled_tile(AlignContext(other, dev, 0, (1, 1, 1), 0.1)) is None


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_the_accumulator_fill_does_not_grow_the_images_of_a_pixel_gemm(dev):
    """A batched pointwise conv's GEMM over its pixels (axes n, f, p, c, the pixels the lanes):
    the images index the only input the lanes run along, so each image's accumulators load a row
    of pixels of their own, as a batch's do (`_accumulator_axes`); the start tile keeps one
    image and grows the filters, which share each row of pixels."""
    conv = fuse_axes(construction_expr(expr("conv2d", N=4, C=11, H=19, W=137, F=336, KH=1, KW=1, stride=2, pad=0), dev))
    assert [a.name for a in conv.axes] == ["n", "f", "p", "c"]
    tile = initial_tile(AlignContext(conv, dev, 0, (1,) * 4, 0.05))
    assert tile[0] == 1 and tile[1] > 1 and accumulators(conv, dev, tile) >= dev.fma_accumulators


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_quarter_to_half_a_vector_of_filters_is_padded_where_the_row_cannot_take_the_lanes(dev):
    """Filters from a quarter of a vector to half of one (2 to 4 on AVX2, 4 to 8 on AVX-512) are
    the lane axis, one whole vector padded with zero filters, where the output row cannot run
    in whole 4-lane pieces (`axes.row_fills_lanes`): a row of 23, or a stride-2 row that gathers
    its input; a row of 28 keeps the lanes. Fewer than a quarter stay scalar on a strided row.
    The one vector is the register tile's only size along the filters, at any eps (`TensorShapeRule`:
    it wastes 100 % of 4 or 8 filters, over the eps ladder's 5 %), and so the cache tiles'."""
    lanes = dev.warp_size
    ragged = expr("conv2d", N=1, C=29, H=23, W=23, F=lanes // 2, KH=7, KW=7, stride=1, pad=3)
    strided = expr("conv2d", N=1, C=16, H=65, W=65, F=lanes // 4, KH=3, KW=3, stride=2, pad=1)
    whole = expr("conv2d", N=1, C=24, H=28, W=28, F=lanes // 2, KH=3, KW=3, stride=1, pad=1)
    fewer = expr("conv2d", N=1, C=16, H=65, W=65, F=lanes // 4 - 1, KH=3, KW=3, stride=2, pad=1)
    assert [short_filter_axis(e, dev) for e in (ragged, strided, whole, fewer)] == [1, 1, None, None]
    assert [lane_axis(e, dev) for e in (ragged, strided, whole, fewer)] == [1, 1, 3, None]
    for e in (ragged, strided):
        start = AlignContext(e, dev, 0, (1,) * 7, 0.05)
        assert initial_tile(start)[1] == lanes
        assert TensorShapeRule().axis_ok(start, 1, lanes) and VectorLanesRule().axis_ok(start, 1, lanes)
        assert not VectorLanesRule().axis_ok(start, 1, e.axes[1].extent)  # the whole axis: not a vector
        below = AlignContext(e, dev, 1, with_axis((1,) * 7, 1, lanes), 0.05)
        assert TensorShapeRule().axis_ok(below, 1, lanes)
        assert next_aligned_sizes(below, with_axis((1,) * 7, 1, lanes))[1] is None  # nothing past one vector


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_convs_register_rows_and_columns_need_not_divide_its_prime_output_at_small_eps(dev):
    """48 channels, 5x5 filters over 19 x 19 outputs: at eps 0.05 the tensor-shape rule admits
    no size along 19 but 1 and 19 (2 wastes 1/19 > 5 %). In one vector of filters (a quarter
    to a half of one, padded: `short_filter_axis`) the output rows and columns are the register
    tile's only accumulators, and their ragged edges are split off rather than padded, so there
    they take any size, and the tile covers more than one accumulator; its cache tiles keep the
    rule, and so do the rows of a conv of two vectors of filters, or of a matmul."""
    e = expr("conv2d", N=1, C=48, H=19, W=19, F=dev.warp_size // 2, KH=5, KW=5, stride=1, pad=2)
    assert lane_axis(e, dev) == 1 == short_filter_axis(e, dev)
    start = AlignContext(e, dev, 0, (1,) * 7, 0.05)
    assert all(TensorShapeRule().axis_ok(start, a, size) for a in (2, 3) for size in range(1, 20))
    tile = initial_tile(start)
    assert tile[1] == dev.warp_size and tile[2] * tile[3] > 1 and accumulators(e, dev, tile) == tile[2] * tile[3]
    cache = AlignContext(e, dev, 1, (1, dev.warp_size, 1, 1, 1, 1, 1), 0.05)
    assert [s for s in range(1, 20) if TensorShapeRule().axis_ok(cache, 2, s)] == [1, 19]
    wide = AlignContext(expr("conv2d", N=1, C=48, H=19, W=19, F=2 * dev.warp_size, KH=5, KW=5, stride=1, pad=2),
                        dev, 0, (1,) * 7, 0.05)
    assert [s for s in range(1, 20) if TensorShapeRule().axis_ok(wide, 2, s)] == [1, 19]
    matmul_rows = AlignContext(matmul(19, 64, 64), dev, 0, (1, 1, 1), 0.05)
    assert not TensorShapeRule().axis_ok(matmul_rows, 0, 3)  # a matmul's rows: padded, the rule holds


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_convs_register_rows_need_not_divide_its_output_in_a_ragged_round(dev):
    """cpu-tails along a conv's output rows, vectorised along its 208 filters: over 38 x 38
    outputs (2 x 19) rows of 2 divide, so the first round's register rows are 1, 2, 19 or 38;
    a round with `AlignContext.ragged` (`Space.chains_eps`) takes any, and its cache tiles
    over them still divide the rows padded to whole register tiles."""
    conv = expr("conv2d", N=1, C=56, H=38, W=38, F=208, KH=3, KW=3, stride=1, pad=1)
    assert lane_axis(conv, dev) == 1 and conv.axes[2].extent == 38
    first = AlignContext(conv, dev, 0, (1,) * 7, 0.05)
    ragged = AlignContext(conv, dev, 0, (1,) * 7, 0.05, ragged=True)
    assert [s for s in range(1, 39) if TailRule().axis_ok(first, 2, s)] == [1, 2, 19, 38]
    assert all(TailRule().axis_ok(ragged, a, s) for a in (2, 3) for s in range(1, 39))
    over = AlignContext(conv, dev, 1, (1, dev.warp_size, 3, 3, 1, 1, 3), 0.05, ragged=True)
    assert [s for s in range(3, 40, 3) if TailRule().axis_ok(over, 2, s)] == [3, 39]


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_convs_cache_tile_over_register_columns_of_one_need_not_divide_a_prime_output(dev):
    """cpu-tails along a conv's output columns (vectorised along its filters): 127 columns (prime)
    under a tile of 1 column above. A tile of 1 divides every extent, but then the columns could
    take 1 or all 127 only; no edge cuts a register tile of 1 column, so the cache tile takes any
    size the other rules allow (16: 8 tiles, the last of 15). Where a longer tile divides (126:
    2, 3, 6, 7, ...) the dividing sizes stay the only ones."""
    conv = expr("conv2d", N=1, C=7, H=127, W=127, F=4 * dev.warp_size, KH=3, KW=3, stride=1, pad=1)
    assert lane_axis(conv, dev) == 1
    ones = AlignContext(conv, dev, 2, (1, 4 * dev.warp_size, 5, 1, 7, 3, 3), 0.05)
    assert TailRule().axis_ok(ones, 3, 16) and TailRule().axis_ok(ones, 3, 43)
    assert next_aligned_sizes(ones, (1, 4 * dev.warp_size, 10, 1, 7, 3, 3))[3] < 127
    even = expr("conv2d", N=1, C=7, H=126, W=126, F=4 * dev.warp_size, KH=3, KW=3, stride=1, pad=1)
    dividing = AlignContext(even, dev, 2, (1, 4 * dev.warp_size, 5, 1, 7, 3, 3), 0.05)
    assert TailRule().axis_ok(dividing, 3, 14) and not TailRule().axis_ok(dividing, 3, 16)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_convs_cache_tile_over_a_ragged_register_row_leaves_no_register_tile_past_the_end(dev):
    """cpu-tails along a conv's output columns (vectorised along its filters) under register
    tiles of 5 columns that 83 (prime) leaves ragged: the cache tiles divide the 85 columns of
    whole register tiles (5, or the whole row), so the last of them holds the cut register tile
    and nothing past it; 65 would leave 47 columns past the end in the second (the guarded
    tiles `model.cpu_compute.busiest_share` prices). Along rows of 3 the 84 rows' divisors."""
    conv = expr("conv2d", N=1, C=97, H=83, W=83, F=19, KH=5, KW=5, stride=1, pad=2)
    assert lane_axis(conv, dev) == 1
    register = (1, dev.warp_size, 3, 5, 1, 1, 5)
    ctx = AlignContext(conv, dev, 1, register, 0.05)
    assert [s for s in range(5, 100, 5) if TailRule().axis_ok(ctx, 3, s)] == [5, 85]
    assert [s for s in range(3, 100, 3) if TailRule().axis_ok(ctx, 2, s)] == [3, 6, 12, 21, 42, 84]
    above = AlignContext(conv, dev, 2, (1, dev.warp_size, 6, 85, 1, 5, 5), 0.05)  # over L1 tiles
    assert TailRule().axis_ok(above, 3, 85) and TailRule().axis_ok(above, 2, 42) and not TailRule().axis_ok(above, 2, 30)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_convolutions_vectorise_their_filters(dev):
    """A conv (stride 1 or 2) with at least a vector of filters runs its lanes along f (axis 1 of
    n f y x c r s): accumulators are rows x columns x vectors of filters, registers add one
    row of filter vectors and one register per data element of a reduction step (rows x
    columns at stride 1 and 2 alike, the window axes at 1). Depthwise convs, pooling and
    matmul keep their axes; half a vector of filters (4 or 8) does not qualify, 20 do (a register
    row of the whole 20 is five 4-lane pieces), and so do a vector and 3 (11 or 19: the
    template pads them with zero filters) and a vector less 3 (5 or 13: one whole vector of
    filters, padded, the register tile's only size along them)."""
    lanes = dev.warp_size
    for stride in (1, 2):
        conv = expr("conv2d", N=1, C=24, H=28, W=28, F=2 * lanes, KH=3, KW=3, stride=stride, pad=1)
        assert filter_axis(conv) == 1 and lane_axis(conv, dev) == 1
        for rows, cols, kw in ((1, 4, 1), (2, 2, 3), (3, 1, 1)):
            tile = (1, 2 * lanes, rows, cols, 1, 1, kw)
            assert accumulators(conv, dev, tile) == rows * cols * 2
            assert micro_kernel_registers(conv, dev, tile) == rows * cols * 2 + 2 + rows * cols
    ragged = expr("conv2d", N=1, C=24, H=28, W=28, F=20, KH=3, KW=3, stride=1, pad=1)
    assert filter_axis(ragged) == 1 and lane_axis(ragged, dev) == 1
    few = expr("conv2d", N=1, C=24, H=28, W=28, F=lanes // 2, KH=3, KW=3, stride=1, pad=1)
    assert filter_axis(few) == 1 and lane_axis(few, dev) == 3  # the output row, as before
    short = expr("conv2d", N=1, C=24, H=28, W=28, F=lanes - 3, KH=3, KW=3, stride=2, pad=1)
    assert filter_axis(short) == 1 and lane_axis(short, dev) == 1 and short_filter_axis(short, dev) == 1
    assert initial_tile(AlignContext(short, dev, 0, (1,) * 7, 1.0))[1] == lanes  # 3 of 16 (8) lanes padding
    assert short_filter_axis(conv, dev) is None and short_filter_axis(few, dev) is None
    prime = expr("conv2d", N=1, C=24, H=28, W=28, F=lanes + 3, KH=3, KW=3, stride=2, pad=1)
    assert filter_axis(prime) == 1 and lane_axis(prime, dev) == 1  # padded to whole tiles
    dw = expr("depthwise_conv2d", N=1, C=64, H=28, W=28, KH=3, KW=3, stride=1, pad=1)
    pool = EXPRS["avgpool"]()
    assert filter_axis(dw) is None and filter_axis(pool) is None and filter_axis(matmul(64, 64, 64)) is None
    assert filter_axis(expr("gemv", M=4096, K=1000)) is None


def test_partial_sums_per_output_are_the_lanes_of_a_reduce_lane_axis():
    """gemv vectorised along K keeps a vector of k partial sums per output (its accumulator
    trips move all of them); a matmul row of vectors, relu and a scalar conv keep one."""
    gemv, relu, conv = expr("gemv", M=4096, K=1000), expr("relu", shape=(17, 11, 3)), EXPRS["conv-s2"]()
    mm = matmul(64, 64, 64)
    assert partial_sums(gemv, AVX2, (14, 8)) == 8 and partial_sums(gemv, AVX512, (7, 32)) == 32
    assert partial_sums(mm, AVX2, (6, 16, 4)) == 1
    assert partial_sums(relu, AVX2, (2, 3, 3)) == 1 and partial_sums(conv, AVX2, (1, 2, 1, 4, 1, 1, 3)) == 1


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_cpu_cache_tiles_divide_the_vector_axis_where_the_tile_above_does(dev):
    """TailRule: N = K = 512 and 16-wide register rows, at eps 0.1 (which lets the tensor-shape
    rule pad 512 to 3 x 176 or 11 x 48): the L1 tile grows N and K through divisors of 512
    only. M (not vectorised, not reduced) may still pad; N = 500, which a 16-wide register row
    does not divide, is left to the tensor-shape rule; registers and GPUs are untouched."""
    e = matmul(512, 512, 512)
    ctx = AlignContext(e, dev, 1, (6, 16, 1), 0.1)
    # K over a register K of 1: 512 lies beyond the scan's 128 steps from 256, and is the whole axis
    for axis, expected in ((1, [32, 64, 128, 256, 512]), (2, [32, 64, 128, 256, 512])):
        sizes, tile = [], (6, 16, 16)
        while (nxt := next_aligned_sizes(ctx, tile)[axis]) is not None:
            sizes.append(nxt)
            tile = tile[:axis] + (nxt,) + tile[axis + 1 :]
        assert sizes == expected
    assert next_aligned_sizes(ctx, (6, 16, 16))[0] == 12  # M pads (516 rows): another rule's business
    ragged = AlignContext(matmul(512, 500, 512), dev, 1, (6, 16, 1), 0.1)
    assert next_aligned_sizes(ragged, (6, 16, 16))[1] == 32 and is_aligned(ragged, (6, 48, 16))
    assert is_aligned(AlignContext(e, dev, 0, (1, 1, 1), 0.1), (6, 48, 1))
    assert is_aligned(AlignContext(e, device("v100"), 1, (4, 4, 1), 0.1), (128, 48, 16))  # 32 x 12 threads


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_register_tile_along_a_reduction_is_whole_cache_lines(dev):
    """gemv vectorised along K: the register tile's K is a power-of-two multiple of the lanes
    and of a 64 B line (16 fp32), or the whole of a K shorter than that (48 and 80, three and
    five steps, ran 3-13x slower over a ragged K: the lanes template keeps them one vector
    loop); a K of 61 is not taken whole (61 lanes are no whole vectors: the lanes template would
    leave the tile scalar), only in whole steps, the edge split off; a matmul's spatial lane
    axis needs the lanes only, in any number."""
    gemv = expr("gemv", M=4096, K=4096)
    ctx = AlignContext(gemv, dev, 0, (1, 1), 0.05)
    assert [k for k in range(1, 129) if VectorLanesRule().axis_ok(ctx, 1, k)] == [16, 32, 64, 128]
    prime = AlignContext(expr("gemv", M=6, K=61), dev, 0, (1, 1), 0.05)
    assert [k for k in range(1, 62) if VectorLanesRule().axis_ok(prime, 1, k)] == [16, 32]
    short = expr("gemv", M=4096, K=12)
    assert VectorLanesRule().axis_ok(AlignContext(short, dev, 0, (1, 1), 0.05), 1, 12)  # the whole axis
    mm = AlignContext(matmul(512, 512, 512), dev, 0, (1, 1, 1), 0.05)
    assert VectorLanesRule().axis_ok(mm, 1, dev.warp_size) and not VectorLanesRule().axis_ok(mm, 1, dev.warp_size + 4)
    assert VectorLanesRule().axis_ok(mm, 1, 3 * dev.warp_size)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_ragged_reduction_in_lanes_is_constructed_in_power_of_two_steps(dev):
    """3 x 15788 x 478 with B stored transposed (K in lanes, ragged under every register tile):
    its rank 1 on a Zen 4 took a register K of 48 (three steps) and ran 9.3-9.4 ms, where the
    same tiles over a K of 32 ran 1.95-2.06 (numpy 2.5-3.1). Every program of its construction
    now reads K in 1, 2, 4, ... steps of whole lines."""
    e = expr("matmul", M=3, K=15788, N=478, trans_b=True)
    built = construct(e, dev, options=Options(topk=10))
    assert built.candidates
    lane = lane_axis(built.expr, dev)
    assert built.expr.axes[lane].kind == "reduce"
    step = lcm(dev.warp_size, 16)
    for c in built.candidates:
        steps, rest = divmod(c.program.register_tile[lane], step)
        assert rest == 0 and steps & (steps - 1) == 0, c.program.tiles


def zen5_like(ways: int):
    """AVX512 with an L1d of 64 sets of `ways` 64 B lines (the Zen 5's 48 KiB at 12 ways; 32 KiB
    at 8), so that a way spans 4 KiB."""
    l1 = replace(AVX512.layers[1], capacity_bytes=4096 * (ways or 12), ways=ways)
    return replace(AVX512, layers=(AVX512.layers[0], l1, *AVX512.layers[2:]))


@pytest.mark.parametrize("rows, k, expected", [(8, 16, 9), (16, 16, 17), (8, 32, 9), (20, 16, 21), (1, 64, 2)])
def test_l1_set_lines_of_gemv_rows_that_are_a_whole_way_apart(rows, k, expected):
    """gemv-4096's rows are 16 KiB apart, a multiple of the 4 KiB a way spans over 64 sets: one
    step's line of every row lands in one set, and x's line starts there too (page-aligned
    bases): rows + 1. A K of 32 reads two lines per row, in the next set, so still rows + 1."""
    gemv = expr("gemv", M=4096, K=4096)
    assert l1_set_lines(gemv, zen5_like(12), (rows, k)) == expected


def test_l1_set_lines_spread_where_the_row_stride_is_not_a_whole_way():
    """Rows of 4,160 floats are 16,640 B apart: 260 lines, 4 sets on from the row above, so 16
    rows fill 16 sets with one line each (plus x's line): 2. Without `ways` nothing is counted,
    nor for a micro-kernel whose lanes run along an output row (matmul)."""
    assert l1_set_lines(expr("gemv", M=4096, K=4160), zen5_like(12), (16, 16)) == 2
    assert l1_set_lines(expr("gemv", M=4096, K=4096), zen5_like(0), (16, 16)) == 0
    assert l1_set_lines(matmul(1024, 1024, 1024), zen5_like(12), (14, 32, 1)) == 0


def test_cache_set_rule_keeps_a_reduction_micro_kernel_within_the_ways():
    """CacheSetRule: 8 rows (9 lines) fit 12 ways, 16 rows (17) do not; 8 ways take 4 rows.
    Only the register layer is judged; the fill and the rows Roller grows to keep to it."""
    gemv = expr("gemv", M=4096, K=4096)
    rule = CacheSetRule()
    assert rule.tile_ok(AlignContext(gemv, zen5_like(12), 0, (1, 1), 0.05), (8, 16))
    assert not rule.tile_ok(AlignContext(gemv, zen5_like(12), 0, (1, 1), 0.05), (16, 16))
    assert rule.tile_ok(AlignContext(gemv, zen5_like(0), 0, (1, 1), 0.05), (16, 16))
    assert not rule.tile_ok(AlignContext(gemv, zen5_like(8), 0, (1, 1), 0.05), (8, 16))
    assert rule.tile_ok(AlignContext(gemv, zen5_like(8), 1, (16, 16), 0.05), (64, 1024))
    for ways in (8, 12, 16):
        dev = zen5_like(ways)
        tile = initial_tile(AlignContext(gemv, dev, 0, (1, 1), 0.05))
        assert l1_set_lines(gemv, dev, tile) <= ways
        grown = next_aligned_sizes(AlignContext(gemv, dev, 0, (1, 1), 0.05), tile)[0]
        assert grown is None or l1_set_lines(gemv, dev, (grown, tile[1])) <= ways


def test_a_reduction_micro_kernel_rows_divide_the_rows():
    """cpu-tails at the registers for lanes along K: gemv-4096's rows tile by divisors of 4,096
    (LLVM left guarded 7-15-row kernels rolled), a prime row count by any size, and its K by
    dividing whole lines; a matmul's register rows stay free (its template pads panels)."""
    gemv = AlignContext(expr("gemv", M=4096, K=4096), AVX512, 0, (1, 1), 0.05)
    assert [r for r in range(1, 33) if TailRule().axis_ok(gemv, 0, r)] == [1, 2, 4, 8, 16, 32]
    prime = AlignContext(expr("gemv", M=4093, K=4096), AVX512, 0, (1, 1), 0.05)
    assert TailRule().axis_ok(prime, 0, 20)
    # K: 16-lane vectors of whole 64 B lines that divide 4,096, not 48 (padded, plain template);
    # K = 1000 has no multiple of 16 among its divisors, so any size is left to the other rules
    assert [k for k in range(16, 129, 16) if TailRule().axis_ok(gemv, 1, k)] == [16, 32, 64, 128]
    assert TailRule().axis_ok(AlignContext(expr("gemv", M=4096, K=1000), AVX512, 0, (1, 1), 0.05), 1, 48)
    assert TailRule().axis_ok(AlignContext(matmul(512, 512, 512), AVX512, 0, (1, 1, 1), 0.05), 0, 14)


def test_stream_rows_is_the_divisor_of_k_nearest_sixteen():
    """`stream_rows`: the divisor of K up to twice STREAM_ROWS nearest it on a log scale, the
    larger of two equally near, where it is at least half STREAM_ROWS; else STREAM_ROWS over a
    ragged K (a prime past 32; 2315 = 5 x 463), or the whole of a shorter K."""
    assert STREAM_ROWS == 16
    ks = (2048, 1853, 1000, 2315, 4907, 6475, 23, 1847, 37, 12, 1)
    assert [stream_rows(k) for k in ks] == [16, 17, 20, 16, 16, 25, 23, 16, 16, 12, 1]


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_one_row_matmul_reads_stream_rows_of_b_at_every_layer(dev):
    """cpu-stream-rows: a one-row matmul's tiles take `stream_rows` K-steps at every layer, no
    other size (its register tile would keep K at 1: the rows save no byte), also where they do
    not divide K (a prime K of 1847: 16, K's end cutting the last step). Two rows reuse B, so a
    two-row matmul's K is free. `cpu-tails` leaves a one-row matmul's K to it, ragged or not.
    Along N the first cache tile is the register tile, or the fewest that make whole 64 B lines
    (7 AVX2 vectors: 2), or a core's even share of N in whole register tiles (5737 over two
    cores: 2869 columns, 52 tiles of 56)."""
    rule = StreamRowsRule()
    one_row = matmul(1, 5737, 1853)
    k = 2
    for layer in range(len(dev.layers) - 1):
        ctx = AlignContext(one_row, dev, layer, (1, 1, 1), 0.05)
        assert [s for s in range(1, 129) if rule.axis_ok(ctx, k, s)] == [17]
    # N: free in the register tile and below L1; L1 takes the register tile's, in whole lines
    assert rule.axis_ok(AlignContext(one_row, dev, 0, (1, 1, 1), 0.05), 1, 96)
    assert rule.axis_ok(AlignContext(one_row, dev, 2, (1, 96, 17), 0.05), 1, 2880)
    l1 = AlignContext(one_row, dev, 1, (1, 56, 17), 0.05)
    assert dev.compute_units == 2
    assert [s for s in range(56, 5737 + 56, 56) if rule.axis_ok(l1, 1, s)] == [56, 112, 52 * 56]
    prime = matmul(1, 5737, 1847)
    for layer in range(len(dev.layers) - 1):
        ctx = AlignContext(prime, dev, layer, (1, 1, 16), 0.05)
        assert [s for s in range(1, 129) if rule.axis_ok(ctx, k, s)] == [16]
        assert TailRule().axis_ok(ctx, k, 16)
    assert rule.axis_ok(AlignContext(matmul(2, 5737, 1853), dev, 0, (1, 1, 1), 0.05), k, 1)
    assert rule.axis_ok(AlignContext(matmul(2, 5737, 1853), dev, 0, (1, 1, 1), 0.05), k, 2)
    start = initial_tile(AlignContext(one_row, dev, 0, (1, 1, 1), 0.05))
    assert start is not None and start[k] == 17


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_one_row_register_tile_divides_a_cores_share_where_it_fits_l1(dev):
    """cpu-stream-rows, the register tile: where 16 rows of a core's share of N and its outputs
    fit L1 (`share_streams_from_l1`: 451 columns over 2 cores, 226, (16 + 1) x 226 x 4 bytes of
    the 32 KiB), its width along N is whole vectors that divide the share in vectors or pad it
    by one vector (PAD_VECTORS), two tiles or more to it (15 AVX-512 vectors: 1, 3 and 5, and 2,
    4 and 8 over 16; 29 AVX2 ones: 1, and 2, 3, 5, 6, 10 and 15 over 30); where they do not
    (5737 columns), or the share is one vector or less (a classifier's 10 columns: 5 a core,
    read in a register row of 10), any width."""
    from workbench.rtile.axes import share_streams_from_l1

    rule, n = StreamRowsRule(), 1
    fits = matmul(1, 451, 2927)
    assert share_streams_from_l1(fits, dev)
    ctx = AlignContext(fits, dev, 0, (1, 1, 1), 0.05)
    lanes = dev.warp_size
    share = -(-(-(-451 // 2)) // lanes)
    expected = [d * lanes for d in range(1, share) if -share % d <= PAD_VECTORS]
    assert [s for s in range(1, 481) if rule.axis_ok(ctx, n, s)] == expected
    assert expected == ([16, 32, 48, 64, 80, 128] if lanes == 16 else [8, 16, 24, 40, 48, 80, 120])
    wide = matmul(1, 5737, 1853)
    assert not share_streams_from_l1(wide, dev)
    assert all(rule.axis_ok(AlignContext(wide, dev, 0, (1, 1, 1), 0.05), n, s) for s in (8, 24, 96, 144))
    narrow = matmul(1, 10, 2048)
    assert share_streams_from_l1(narrow, dev)
    assert rule.axis_ok(AlignContext(narrow, dev, 0, (1, 1, 1), 0.05), n, 10)
    assert construct(narrow, dev, options=Options(topk=3)).candidates


def _pointwise(f: int, constants: tuple[str, ...], dev):
    """A pointwise conv of `f` filters over 7 x 7 pixels as the construction tiles it on a CPU
    (the GEMM over its pixels: axes n, f, p, c), its filters a weight or not."""
    e = fuse_axes(construction_expr(expr("conv2d", N=1, C=512, H=7, W=7, F=f, KH=1, KW=1, stride=1, pad=0), dev))
    return replace(e, constants=constants)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_tiles_along_a_weights_axis_divide_it_where_a_dividing_tile_exists(dev):
    """cpu-weights-ahead: 2,048 filters, a weight read along f (not the lanes, which run along
    the pixels): register rows divide 2,048 (1 to 32: the powers of two), cache tiles over rows
    of 16 are the dividing multiples of 16; the pixels' axis and an operator without weights
    keep every size, and a prime filter count (2,039) any size over rows of 16, having no
    dividing tile."""
    weighted = _pointwise(2048, ("kernel",), dev)
    f, p = ([a.name for a in weighted.axes].index(n) for n in ("f", "p"))
    assert lane_axis(weighted, dev) == p
    rule = WeightsAheadRule()
    top = (1,) * len(weighted.axes)
    rows = with_axis(top, f, 16)
    assert [r for r in range(1, 33) if rule.axis_ok(AlignContext(weighted, dev, 0, top, 0.05), f, r)] == [1, 2, 4, 8, 16, 32]
    cache = AlignContext(weighted, dev, 1, rows, 0.05)
    assert [s for s in range(16, 2049, 16) if rule.axis_ok(cache, f, s)] == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert all(rule.axis_ok(cache, p, s) for s in range(1, 50))
    plain = _pointwise(2048, (), dev)
    assert all(rule.axis_ok(AlignContext(plain, dev, layer, top, 0.05), f, s) for layer in (0, 1) for s in range(1, 300))
    prime = _pointwise(2039, ("kernel",), dev)
    assert all(rule.axis_ok(AlignContext(prime, dev, 0, top, 0.05), f, r) for r in range(1, 33))
    assert all(rule.axis_ok(AlignContext(prime, dev, 1, rows, 0.05), f, s) for s in range(16, 2040, 16))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_weight_whose_tiles_divide_its_axes_is_laid_out_ahead(dev):
    """The rule's purpose, end to end on a generated spec: every candidate of the pointwise conv
    with 2,048 filters (a weight) takes its filters laid out ahead; the same conv whose filters
    are passed per call copies them per call."""
    weighted = construct(_pointwise(2048, ("kernel",), dev), dev, options=Options(topk=5))
    assert all(c.plan.prepacked == ("kernel",) for c in weighted.candidates)
    plain = construct(_pointwise(2048, (), dev), dev, options=Options(topk=5))
    assert all(c.plan.prepacked == () for c in plain.candidates)


def test_the_standard_avx2_micro_kernel_is_aligned_and_fits():
    """Issue 14: 6 x 16 fp32 (12 accumulators, 15 ymm) is aligned and fits 16 ymm; round 1's
    2 x 8 (2 accumulators) is not aligned where 5 cycles x 2 pipes need 10."""
    e = matmul(512, 512, 512)
    ctx = AlignContext(e, AVX2, 0, (1, 1, 1), 0.05)
    assert required_accumulators(ctx) == 10
    assert is_aligned(ctx, (6, 16, 1)) and is_aligned(ctx, (10, 8, 1)) and is_aligned(ctx, (5, 16, 4))
    assert not is_aligned(ctx, (2, 8, 1)) and not is_aligned(ctx, (4, 16, 1))  # 2 and 8 accumulators
    assert layer_footprint(calculus(e), AVX2, 0, (6, 16, 1)) <= layer_capacity(AVX2, 0)
    wide = AlignContext(e, AVX512, 0, (1, 1, 1), 0.05)
    assert required_accumulators(wide) == 8 and is_aligned(wide, (14, 32, 1)) and not is_aligned(wide, (6, 16, 1))


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_initial_cpu_register_tile_covers_the_fma_latency(dev):
    """The smallest aligned register tile holds latency x pipes accumulators within the
    registers; growing or shrinking keeps it so (the rule is part of alignment)."""
    e = matmul(512, 512, 512)
    ctx = AlignContext(e, dev, 0, (1, 1, 1), 0.05)
    tile = initial_tile(ctx)
    need = dev.fma_latency_cycles * dev.fma_pipes
    assert accumulators(e, dev, tile) >= need
    assert micro_kernel_registers(e, dev, tile) <= dev.registers_per_unit
    for a, size in enumerate(prev_aligned_sizes(ctx, tile)):
        if size is not None:
            assert accumulators(e, dev, tile[:a] + (size,) + tile[a + 1 :]) >= need


@pytest.mark.parametrize("base, widths", [
    (AVX2, {6: 1, 8: 1, 12: 3, 16: 2, 20: 5, 24: 3, 36: 9, 40: 5, 44: 11}),
    (AVX512, {12: 1, 16: 1, 20: 5, 24: 3, 36: 9, 40: 5, 48: 3}),
], ids=lambda v: getattr(v, "name", ""))
def test_a_row_that_is_not_whole_vectors_takes_llvms_pieces(base, widths):
    """A register row longer than a vector and not a whole number of them is split by LLVM into
    pieces of the largest power of two dividing it (`row_vectors`: 36 fp32 on AVX2 is 9 xmm of
    4, not 4 ymm + 1 xmm); a row of whole vectors, or one shorter than a vector, fills as many
    as it needs. The matmul's accumulators count rows that way; gemv's partial sums along its
    reduce axis keep whole vectors (`simd_vectors`)."""
    for width, vectors in widths.items():
        assert row_vectors(width, 4, base) == vectors, width
        assert accumulators(matmul(64, width, 64), base, (2, width, 1)) == 2 * vectors
    assert accumulators(expr("gemv", M=4096, K=1000), AVX2, (2, 12)) == 2 * 2


@pytest.mark.parametrize("base, wastes", [
    (AVX2, {6: None, 12: 4 / 12, 20: 4 / 20, 24: None, 28: 4 / 28, 36: 4 / 36, 44: 4 / 44, 84: 4 / 84}),
    (AVX512, {12: None, 20: 12 / 20, 24: 8 / 24, 28: 4 / 28, 36: 12 / 36, 40: 8 / 40, 48: None, 52: 12 / 52,
              84: 12 / 84}),
], ids=lambda v: getattr(v, "name", ""))
def test_a_whole_row_of_llvms_pieces_gives_way_to_whole_vectors_where_eps_pads_them(base, wastes):
    """A whole output row that LLVM splits into more pieces than whole vectors would take (28 on
    8 lanes: 7 xmm, where 32 is 4 ymm) is refused by the vector-lanes rule wherever eps admits
    the least padding of a row of whole vectors (`whole_vector_waste`: 28 pads to 32, 1/7), up
    to WHOLE_VECTOR_EPS (0.2); a row of 12 on AVX2 pads by a third and stays. Where the pieces
    take at least twice the vectors (`whole_vector_bound`: 20 on 16 lanes, 5 xmm against 2 zmm;
    36, 9 against 3; 52, 13 against 4; never on 8 lanes), up to 0.7. The construction then runs
    one more round at the first of EPS_STEPS admitting them (`Space.whole_vector_eps`)."""
    from workbench.construct.space import Space

    lanes = base.warp_size
    for n, waste in wastes.items():
        e = matmul(64, n, 64)
        pieces = n // min(n & -n, lanes)  # LLVM's split: the largest power of two dividing the row
        bound = 0.7 if n % 4 == 0 and pieces >= 2 * ceil(n / lanes) else 0.2
        assert whole_vector_waste(e, base) == (pytest.approx(waste) if waste is not None else None), n
        for eps in (0.05, 0.1, 0.2, 0.4, 1.0):
            whole = VectorLanesRule().axis_ok(AlignContext(e, base, 0, (1, 1, 1), eps), 1, n)
            gives_way = waste is not None and waste <= min(eps, bound) + 1e-12
            assert whole == (not gives_way), (n, eps)
        due = Space(e, base).whole_vector_eps(0.05)
        assert due == (None if waste is None or waste <= 0.05 or waste > bound
                       else min(x for x in (0.1, 0.2, 0.4, 0.7) if waste <= x + 1e-12)), n
    assert whole_vector_waste(matmul(64, 28, 64), device("v100")) is None  # a GPU's lanes are threads


@pytest.mark.parametrize("dev, row", [(AVX2, 24), (AVX512, 32)], ids=lambda v: getattr(v, "name", str(v)))
def test_a_register_row_may_cover_a_ragged_lane_axis_in_whole_vectors_past_its_end(dev, row):
    """47 x 1684 x 23: a register row along N grows from 16 to the 23 columns in whole vectors,
    past the axis's end (24 on 8 lanes, 32 on 16: `padded_row_axis`), where it pads N within eps;
    its accumulators are those vectors, not the 23 one-lane pieces of the clamped row. Only a
    matmul's (or a filters-path conv's) lane axis, whose template pads it: not an elementwise
    row's, not a pooling's, nor a GPU's, nor an axis a whole number of vectors long."""
    e = matmul(47, 23, 1684)
    assert padded_row_axis(e, dev) == 1
    ctx = AlignContext(e, dev, 0, (1, 1, 1), 0.4)
    assert next_aligned_sizes(ctx, (8, 16, 1))[1] == row
    assert accumulators(e, dev, (8, row, 1)) == 8 * row // dev.warp_size
    assert micro_kernel_registers(e, dev, (8, row, 1)) == 8 * row // dev.warp_size + row // dev.warp_size + 1
    assert padded_row_axis(matmul(47, 48, 1684), dev) is None
    assert padded_row_axis(expr("relu", shape=(2, 5, 67)), dev) is None
    assert padded_row_axis(expr("avgpool", N=128, C=42, H=83, W=83, K=3, stride=1, pad=1), dev) is None
    assert padded_row_axis(e, device("v100")) is None
    conv = expr("conv2d", N=1, C=8, H=9, W=9, F=dev.warp_size + 1, KH=3, KW=3, stride=1, pad=1)
    assert padded_row_axis(conv, dev) == 1


def most_matmul_accumulators(m: int, n: int, lanes: int, budget: int, eps: float) -> int:
    """The closed form of the fallback for C[i, j] += A[i, k] B[k, j]: the most accumulators
    r x c over row counts r and row widths (c vectors) that the tensor-shape and SIMD-lane rules
    accept, with r c + c + 1 <= budget (accumulators, a row of B, a broadcast of A). A whole row
    longer than a vector and not a whole number of them is c pieces of the largest power of two
    dividing it (LLVM's split: 20 on 8 lanes, 5 pieces of 4), and where that is more than whole
    vectors would take, it gives way to them once eps admits their padding, up to 0.2 (20 pads
    to 24: from eps 0.2 on, rows of 8 or 24 only), or 0.4 where the pieces are at least 3 times
    the vectors."""
    def waste(size, extent):
        return (ceil(extent / size) * size - extent) / extent

    def waste_ok(size, extent):
        return waste(size, extent) <= eps + 1e-12

    def vectors(w):
        return ceil(w / lanes) if w <= lanes or w % lanes == 0 else w // min(w & -w, lanes)

    def whole_row_ok(w):
        if vectors(w) <= ceil(w / lanes):
            return True
        padding = min(waste(size, w) for size in range(lanes, ceil(w / lanes) * lanes + 1, lanes))
        bound = 0.4 if w % 4 == 0 and vectors(w) >= 3 * ceil(w / lanes) else 0.2
        return padding > min(eps, bound) + 1e-12

    rows = [r for r in range(1, m + 1) if waste_ok(r, m)]
    padded = ceil(n / lanes) * lanes if n > lanes else n  # a row past n in whole vectors
    widths = [vectors(w) for w in range(1, padded + 1)
              if waste_ok(w, n) and (w % lanes == 0 or (w == n and whole_row_ok(w)))]
    fits = [r * c for r in rows for c in widths if r * c + c + 1 <= budget]
    return max(fits, default=0)


@pytest.mark.parametrize("base", [AVX2, AVX512], ids=lambda d: d.name)
@pytest.mark.parametrize("m, n", [(512, 512), (3, 512), (512, 8), (17, 40), (7, 20), (9, 52)])
@pytest.mark.parametrize("eps", [0.05, 0.2, 1.0])
def test_required_accumulators_fall_back_to_the_most_the_registers_hold(base, m, n, eps):
    """Where latency x pipes accumulators cannot exist (few rows, a narrow output, a small
    register cap, eps too small to pad) the rule asks for the most that can; a tile meeting it
    exists whenever any tile fits (else nothing is required: the capacity check refuses all)."""
    e = matmul(m, n, 64)
    for cap in (4, 6, 8, 11, 12, base.registers_per_unit):
        dev = replace(base, registers_per_thread_cap=cap)
        ctx = AlignContext(e, dev, 0, (1, 1, 1), eps)
        most = most_matmul_accumulators(m, n, dev.warp_size, cap, eps)
        assert required_accumulators(ctx) == min(dev.fma_latency_cycles * dev.fma_pipes, most), cap
        tile = initial_tile(ctx)
        if most:
            assert accumulators(e, dev, tile) >= required_accumulators(ctx)
            assert micro_kernel_registers(e, dev, tile) <= cap


def test_no_accumulator_rule_without_a_reduction_a_lane_axis_or_fma_facts():
    """Elementwise operators carry no dependency chain, scalar code (a stride-2 conv) is bound by
    its lanes; gemv's partial sums along k hold what they can: r rows x c vectors of whole 64 B
    lines (c >= 2 on AVX2) need r c + 2c <= 16 registers, and r divides the 4,096 rows
    (cpu-tails), so r = 4 holds 8 of the 10 the FMAs want (the fallback), where r = 5 held 10
    before rows had to divide; a spec without FMA facts (TINY_CPU, a GPU) asks for none. Nor
    does a one-row matmul whose L1 tile can be a core's share of N (each vector of its B feeds
    one FMA): 16 rows of 226 columns and the outputs, 15.4 KB of the 32 KiB L1; 18 rows of 2869
    columns overflow it."""
    relu, gemv, mm = expr("relu", shape=(17, 11, 3)), expr("gemv", M=4096, K=1000), matmul(512, 512, 512)
    conv = expr("conv2d", N=8, C=64, H=30, W=30, F=1, KH=3, KW=3, stride=2, pad=1)  # scalar: one filter
    assert required_accumulators(AlignContext(relu, AVX2, 0, (1, 1, 1), 0.05)) == 0
    assert required_accumulators(AlignContext(conv, AVX2, 0, (1,) * 7, 0.05)) == 0
    assert required_accumulators(AlignContext(matmul(1, 451, 2927), AVX2, 0, (1, 1, 1), 0.05)) == 0
    assert required_accumulators(AlignContext(matmul(1, 5737, 1853), AVX2, 0, (1, 1, 1), 0.05)) > 0
    assert required_accumulators(AlignContext(matmul(2, 451, 2927), AVX2, 0, (1, 1, 1), 0.05)) > 0
    # 96 filters, vectorised; 15 x 15 outputs tile by 1, 3, 5 (cpu-tails), and a tile of a
    # filter vectors x b outputs needs a b + a + b of 16 registers: at most 9 (3 x 3, 15 registers)
    filters = AlignContext(EXPRS["conv-s2"](), AVX2, 0, (1,) * 7, 0.05)
    assert required_accumulators(filters) == 9 and accumulators(filters.expr, AVX2, initial_tile(filters)) == 9
    assert required_accumulators(AlignContext(gemv, AVX2, 0, (1, 1), 0.05)) == 8
    assert required_accumulators(AlignContext(gemv, AVX512, 0, (1, 1), 0.05)) == 8
    tile = initial_tile(AlignContext(gemv, AVX2, 0, (1, 1), 0.05))
    assert tile[0] == 4 and tile[1] % 16 == 0 and accumulators(gemv, AVX2, tile) >= 8
    assert micro_kernel_registers(gemv, AVX2, tile) <= 16
    assert required_accumulators(AlignContext(mm, TINY_CPU, 0, (1, 1, 1), 0.05)) == 0
    assert required_accumulators(AlignContext(mm, device("v100"), 0, (1, 1, 1), 0.05)) == 0
    assert required_accumulators(AlignContext(mm, AVX2, 1, (6, 16, 1), 0.05)) == 0  # registers only


# -- memory bank padding -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_big, n_small, banks, width, expected",
    [
        (32, 4, 32, 1, 4),  # V100: 32 banks x 4 B, fp32 -> one element per bank
        (4, 1, 4, 1, 1),  # Roller Figure 5(b): a [3,4] tile over 4 banks read as [3,1]
        (64, 1, 32, 1, 1),
        (33, 1, 32, 1, 0),  # already one bank apart
        (8, 1, 32, 1, 25),  # short rows: the row stride becomes 33 = 1 (mod 32)
        (64, 4, 32, 2, 4),  # K80: 8 B banks hold 2 floats; n=4 spans 2 banks
    ],
)
def test_bank_padding_worked_examples(n_big, n_small, banks, width, expected):
    assert bank_padding(n_big, n_small, banks, width) == expected


def test_v100_preset_banks_give_padding_4_for_32_by_4():
    shared = device("v100").layer("shared")
    assert (shared.banks, shared.bank_width_bytes) == (32, 4)
    assert bank_padding(32, 4, shared.banks, shared.bank_width_bytes // 4) == 4
    assert bank_padding(100, 4, 0, 0) == 0  # no banks (CPU caches, registers): no padding


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.integers(1, 64), st.sampled_from([(32, 1), (32, 2), (16, 1), (4, 1)]))
def test_bank_padding_puts_the_rows_of_a_column_in_distinct_banks(n_big, n_small, bank_shape):
    banks, width = bank_shape  # width: elements per bank word
    n_small = min(n_small, n_big, banks * width)  # the upper tile reads within one row of banks
    pad = bank_padding(n_big, n_small, banks, width)
    row = n_big + pad
    assert 0 <= pad < banks * width
    words = ceil(n_small / width)  # bank words one lane reads along a row
    assert row % (banks * width) == (width * words) % (banks * width)

    def bank(r, c):
        return (r * row + c) // width % banks

    if gcd(words, banks) == 1:  # the formula's promise: `banks` lanes, one row each, same column
        for c in range(0, n_big, max(1, n_big // 7)):
            assert len({bank(r, c) for r in range(banks)}) == banks
    # lanes that each read `n_small` consecutive elements of consecutive rows never collide
    lanes = max(1, banks // words)
    hit = [bank(r, q * width) for r in range(lanes) for q in range(words)]
    assert len(set(hit)) == len(hit)


# -- cross-thread reductions (issue 16) ------------------------------------------------------------


CROSS_CASES = {
    "reduce_sum-64x1M": (("reduce_sum", dict(shape=(64, 1 << 20), axes=(1,))), 1),
    "reduce_sum-8x65536": (("reduce_sum", dict(shape=(8, 65536), axes=(1,))), 1),
    "gemv-64x8192": (("gemv", dict(M=64, K=8192)), 1),
    # many outputs, x reused: A and x staged in shared memory by coalesced copies
    "gemv-4096": (("gemv", dict(M=4096, K=4096)), None),
    # many outputs, nothing reused: a thread per output row would read rows a row apart (R0-R2)
    "reduce_mean-R0": (("reduce_mean", dict(shape=(128, 512, 1024), axes=(2,))), 1),
    "reduce_mean-R1": (("reduce_mean", dict(shape=(65536, 1024), axes=(1,))), 1),
    # R2's 516,096 rows outnumber the V100's resident threads (80 x 2048), but its 96 KiB a unit
    # hold one sector a thread, not two: a block a row still (an H100: a thread a row)
    "reduce_mean-R2": (("reduce_mean", dict(shape=(128, 4032, 11, 11), axes=(2, 3))), 1),
    "reduce_mean-121": (("reduce_mean", dict(shape=(128, 40, 11, 11), axes=(2, 3))), 1),  # 11 x 11 fused: 121
    "reduce_sum-middle": (("reduce_sum", dict(shape=(8, 64, 32), axes=(1,))), None),  # not contiguous
    # axis 0 of a row-major matrix: neighbouring outputs read neighbouring elements (coalesced)
    "reduce_sum-outer": (("reduce_sum", dict(shape=(4096, 1024), axes=(0,))), None),
    "reduce_sum-short": (("reduce_sum", dict(shape=(8, 16), axes=(1,))), None),  # shorter than a warp
    "avgpool": (("avgpool", dict(N=1, C=8, H=14, W=14, K=3, stride=2, pad=1)), None),  # a window
}


@pytest.mark.parametrize("case", sorted(CROSS_CASES))
def test_cross_thread_axis_on_the_v100(case):
    (op, params), axis = CROSS_CASES[case]
    e = fuse_axes(expr(op, **params))
    assert cross_thread_axis(e, device("v100")) == axis == spread_reduce_axis(e, device("v100"))
    assert cross_thread_axis(e, AVX2) is None  # a CPU core has no block of threads to spread


def test_matmul_keeps_a_thread_per_output():
    """B[k, j] reads k with a stride of N: threads along k would not read consecutive elements.
    A x B^T reads k contiguously in both inputs, but each is reused across outputs (A along j,
    B along i): its tiles are staged, copied coalesced, and keep a thread per output."""
    assert cross_thread_axis(matmul(64, 64, 4096), device("v100")) is None
    tb = fuse_axes(expr("matmul", M=64, N=32, K=48, trans_b=True))
    assert cross_thread_axis(tb, device("v100")) is None == spread_reduce_axis(tb, device("v100"))


@pytest.mark.parametrize(
    "case, register, threads",
    [
        # 64 blocks (one row each) need ceil(80 x 4 / 64) = 5 warps each for a warp per scheduler
        ("reduce_sum-64x1M", (1, 2), 160),
        ("reduce_sum-64x1M", (1, 8), 160),
        # 8 blocks would need 40 warps: the V100 spec's 512-thread block cap
        ("reduce_sum-8x65536", (1, 2), 512),
        ("gemv-64x8192", (1, 4), 160),
        # 65536 rows: a warp per scheduler needs 1 warp a block, but 32 resident blocks of one
        # warp would fill half the SM's 2048 threads: 2 warps
        ("reduce_mean-R1", (1, 1), 64),
        ("reduce_mean-R1", (1, 4), 64),
    ],
)
def test_cross_thread_block_fills_the_schedulers_with_warps_along_the_reduction(case, register, threads):
    (op, params), axis = CROSS_CASES[case]
    e = fuse_axes(expr(op, **params))
    tile = initial_tile(AlignContext(e, device("v100"), 1, register, 0.05))
    assert tile == (register[0], register[1] * threads)
    ctx = AlignContext(e, device("v100"), 1, register, 0.05)
    # a thread and a block of a cross-thread reduction sum for one output
    assert not is_aligned(AlignContext(e, device("v100"), 0, (1, 1), 0.05), (2, register[1]))
    assert not is_aligned(ctx, (2 * register[0], register[1] * threads))
    # threads in whole warps: 161 threads are refused, unless one block step covers the axis
    assert not is_aligned(ctx, (register[0], register[1] * (threads + 1)))


def test_a_thread_of_a_cross_thread_reduction_leaves_a_warp_of_threads_along_the_row():
    """Rows of 121 (11 x 11 fused, as R2's, 5,120 of them): on the V100 a thread may take 2
    elements (61 threads, 2 warps) but not 4 (31 threads: blocks of 4 threads x 32 elements were
    once emitted); on the MI50, whose wavefronts are 64 lanes, only 1 (2 elements leave 61
    threads)."""
    (op, params), _ = CROSS_CASES["reduce_mean-121"]
    e = fuse_axes(expr(op, **params))
    k = e.reduce[-1]
    ok = {
        gpu: [s for s in (1, 2, 4, 8) if is_aligned(AlignContext(e, device(gpu), 0, (1, 1), 0.05), (1, s))]
        for gpu in ("v100", "mi50")
    }
    assert k == 1 and ok == {"v100": [1, 2], "mi50": [1]}
    assert not is_aligned(AlignContext(e, device("v100"), 1, (1, 4), 0.05), (1, 124))  # 31 threads


def test_a_short_reduction_axis_is_covered_by_one_block_step():
    """60 elements with 1 per thread: one step of 60 threads (fewer than the 10 warps wanted)."""
    e = fuse_axes(expr("reduce_sum", shape=(60,), axes=(0,)))
    ctx = AlignContext(e, device("v100"), 1, (1,), 0.05)
    assert cross_thread_axis(e, device("v100")) == 0
    assert initial_tile(ctx) == (60,) and is_aligned(ctx, (60,))


# -- the per-axis contract the scans' memo relies on ----------------------------------------------


@pytest.mark.parametrize("dev", ["v100", "a100", "local-cpu", "xeon-avx512", AVX2, AVX512],
                         ids=lambda d: d if isinstance(d, str) else d.name)
@pytest.mark.parametrize("wid, workload", unique_workloads("roller-table1", "cpu-core"))
def test_a_per_axis_rule_reads_the_tile_above_along_its_own_axis_only(dev, wid, workload):
    """`alignment._axis_ok` keeps a per-axis answer for every upper tile of the same size along
    that axis: each rule's `axis_ok` must answer alike under upper tiles that differ elsewhere
    (here: the other axes at 1, or at up to 16)."""
    dev = device(dev) if isinstance(dev, str) else dev
    e = fuse_axes(workload_expr(workload))
    for layer in range(len(dev.layers) - 1):
        for a, axis in enumerate(e.axes):
            for base in (1, 4):
                if base > axis.extent:
                    continue
                ones = tuple(base if b == a else 1 for b in range(len(e.axes)))
                other = tuple(base if b == a else min(x.extent, 16) for b, x in enumerate(e.axes))
                for eps in (0.05, 1.0):
                    here, there = AlignContext(e, dev, layer, ones, eps), AlignContext(e, dev, layer, other, eps)
                    for rule in RULES:
                        for size in range(base, min(axis.extent, 24 * base) + 1, base):
                            assert rule.axis_ok(here, a, size) == rule.axis_ok(there, a, size), (rule.name, wid, a, size)


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_twelve_filters_are_one_register_row_only_where_it_is_a_vector_or_more(dev):
    """12 filters, whole 4-lane pieces: on AVX2's 8 lanes the register row of all 12 is
    vectorised (`panels.filter_vector_axis`: at least a vector); on AVX-512's 16 it is shorter
    than a vector, which the template would run scalar, so the only register row is one whole
    vector of padded filters (`axes.short_filter_axis`), and every program the construction
    builds has it, the filters padded (`CpuPlan.padded_filters`)."""
    conv = expr("conv2d", N=1, C=13, H=9, W=37, F=12, KH=7, KW=7, stride=2, pad=3)
    ctx = AlignContext(conv, dev, 0, (1,) * 7, 0.05)
    lanes = dev.warp_size
    assert VectorLanesRule().axis_ok(ctx, 1, 12) == (lanes <= 12)
    assert initial_tile(ctx)[1] == (12 if lanes <= 12 else lanes)
    programs = [c.program for c in construct(conv, dev, options=Options(topk=3)).candidates]
    assert programs
    for program in programs:
        plan = cpu_plan(program, dev)
        assert plan.vector_axis == 1 and program.register_tile[1] >= lanes, program.tiles
        assert plan.padded_filters == (lanes > 12), program.tiles


@pytest.mark.parametrize("dev", [AVX2, AVX512], ids=lambda d: d.name)
def test_a_register_row_of_filters_is_whole_vectors_or_whole_4_lane_pieces(dev):
    """Along a conv's filters a register tile is a multiple of the lanes, or the whole axis
    where that is whole 4-lane pieces: 20 filters may be one register row of 20, 19 may not
    (no template vectorises 19 lanes: they are padded to whole vectors instead)."""
    lanes = dev.warp_size
    for f, whole in ((20, True), (19, False), (lanes + 3, False)):
        conv = expr("conv2d", N=1, C=8, H=14, W=14, F=f, KH=3, KW=3, stride=1, pad=1)
        ctx = AlignContext(conv, dev, 0, (1,) * 7, 0.05)
        sizes = [k for k in range(1, f + 1) if VectorLanesRule().axis_ok(ctx, 1, k)]
        assert sizes == [k for k in range(lanes, f + 1, lanes)] + ([f] if whole and f % lanes else []), f
