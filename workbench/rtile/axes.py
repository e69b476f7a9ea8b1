"""Which axis an operator's work runs along on a device: the contiguous axes of its tensors, a
tensor-core contraction's (i, j, k), a cross-thread reduction's axis on a GPU, the axis a CPU
micro-kernel fills its SIMD lanes along (or LLVM's own vectorised row). Read by the alignment
rules, the model, the panels and the templates alike. Pure: no TVM.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, log, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.traffic import calculus


@lru_cache(maxsize=1024)  # the transaction rule asks on every size it judges
def leading_axis(tensor) -> int | None:
    """The axis that alone (coefficient 1) indexes a tensor's contiguous dimension, if any."""
    if not tensor.index:  # a scalar (a reduction over every axis)
        return None
    return dim_axis(tensor, len(tensor.index) - 1)


def dim_axis(tensor, dim: int) -> int | None:
    """The axis that alone (coefficient 1) indexes dimension `dim` of a tensor, if any."""
    coeffs, _ = tensor.index[dim]
    used = [a for a, c in enumerate(coeffs) if c]
    return used[0] if len(used) == 1 and coeffs[used[0]] == 1 else None


@lru_cache(maxsize=1024)
def mma_axes(expr: TensorExpr, device: DeviceSpec) -> tuple[int, int, int] | None:
    """(i, j, k) covered by an MMA fragment, or None where tensor cores do not apply: the device
    has no MMA unit for the dtype, or the operator is not a contraction C[.., i, j] += A[.., i, k]
    * B[.., k, j] (i, j the output's last two dims; each of i, j, k indexing a dimension alone;
    A without j, B without i), or one of i, j, k is shorter than the fragment (no tile may
    exceed its axis, so no fragment tile would exist). A conv's window `h*stride + r` is not
    such a contraction."""
    if not device.has_tensor_cores(expr.dtype):
        return None
    out = expr.output
    if len(out.index) < 2 or len(expr.inputs) != 2:
        return None
    i, j = dim_axis(out, len(out.index) - 2), dim_axis(out, len(out.index) - 1)
    if i is None or j is None or i == j:
        return None
    sole = [{dim_axis(t, d) for d in range(len(t.index))} - {None} for t in expr.inputs]
    for a, b in ((0, 1), (1, 0)):
        if i in sole[a] and j in sole[b] and not expr.inputs[a].uses_axis(j) and not expr.inputs[b].uses_axis(i):
            ks = [k for k in expr.reduce if k in sole[a] and k in sole[b]]
            if ks:
                found = (i, j, ks[-1])
                fits = all(expr.axes[x].extent >= f for x, f in zip(found, device.tensor_core_fragment))
                return found if fits else None
    return None


def tile_lanes(expr: TensorExpr, device: DeviceSpec) -> int:
    """Threads sharing one top-layer tile: a warp for an MMA fragment tile, else one."""
    return device.warp_size if mma_axes(expr, device) else 1


@lru_cache(maxsize=1024)
def cross_thread_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The reduce axis a GPU block spreads its threads along (a cross-thread reduction), or None.

    The decision is coalescing (issue 16). A thread per output puts neighbouring threads on
    neighbouring outputs, which read their rows a whole row apart wherever the innermost reduce
    axis `k` alone indexes the contiguous dimension of every input reading it (`leading_axis`
    and `streams`): a warp's load touches one 32 B sector per lane (32 sectors for 128 useful
    bytes in fp32, 8x a coalesced load; `model.gpu.warp_sectors` prices it). An operator none of whose
    inputs is reused across outputs (`_read_once`: reduce_sum / reduce_mean over the last
    axes, roller-table1 R0-R2) stages nothing in shared memory, so its threads read global
    memory that way; such a reduction, whatever its number of outputs, binds its threads to `k`
    instead: consecutive threads read consecutive elements, each thread sums its share, and
    the block combines the partial sums in a tree (TVM's cross-thread allreduce: warp shuffles,
    then shared memory across warps); a block sums for one output point (`rules.BlockThreadsRule`).
    An operator with a reused input (gemv's x, A x B^T's A and B) stages its tiles, which the
    block's threads copy coalesced, and keeps a thread per output, unless it has fewer outputs
    than `compute_units x warp_size` (a thread per output cannot give every unit even one warp;
    our threshold) and an input read once runs along `k` (gemv 64 x 8192's A: one block a row,
    as the classic gemv; not A x B^T, both of whose inputs are reused).
    `k` must be at least a warp long (a shorter row shares its sectors between neighbouring
    threads' rows anyway). Nor where the outputs are as many as every unit's resident threads
    (`compute_units x max_threads_per_unit`) and a unit's L1 holds two sectors for each of them
    (a row's current sector and the next, rows not starting on a sector): a thread per output
    fills the device, and the L1 keeps each thread's row sectors between its steps
    (`model.gpu.l1_keeps_sectors`), where a block a row makes that many tiny blocks:
    roller-table1 R2's 516,096 rows of 121 ran 315 us so on the H200, 130 us at a thread a row
    (torch 147); the V100's 96 KiB hold one sector for each of its 2048 threads, not two. A
    thread per output stays where neighbouring outputs read neighbouring elements: a reduction
    over an outer axis (axis 0 of a row-major matrix, whose output axis is the input's
    contiguous one), pooling windows (`x*stride + s`), a matmul's B[k, j] (k with a stride of
    N), and contractions on tensor cores."""
    if not device.lanes_are_threads or not expr.reduce or mma_axes(expr, device) is not None:
        return None
    k = expr.reduce[-1]
    readers = [t for t in expr.inputs if t.uses_axis(k)]
    if expr.axes[k].extent < device.warp_size or not readers:
        return None
    streamed = [_read_once(expr, t) for t in expr.inputs]
    outputs = prod(expr.axes[a].extent for a in expr.spatial)
    few = outputs < device.compute_units * device.warp_size
    if not (all(streamed) or (few and any(s for s, t in zip(streamed, expr.inputs) if t.uses_axis(k)))):
        return None
    resident = device.max_threads_per_unit
    l1_holds = 2 * resident * device.layers[-1].transaction_bytes <= device.unit_shared_bytes
    if outputs >= device.compute_units * resident and l1_holds:
        return None
    return k if all(leading_axis(t) == k and streams(t, k) for t in readers) else None


def _read_once(expr: TensorExpr, tensor) -> bool:
    """Whether each element of `tensor` is read for one output only (it uses every spatial axis
    longer than 1): nothing of it is reused across outputs."""
    return all(tensor.uses_axis(a) for a in expr.spatial if expr.axes[a].extent > 1)


def vector_axis(expr: TensorExpr) -> int | None:
    """The axis indexing the output's contiguous dimension: the one a CPU kernel vectorises
    where its inputs allow (`lane_axis`)."""
    return leading_axis(expr.output)


def streams(tensor, axis: int) -> bool:
    """Whether `axis` indexes `tensor` only through its contiguous dimension with stride 1, or not
    at all: consecutive values along the axis are one vector load (or one broadcast), not a
    gather (the CPU template decides vectorisation by this test: `panels.vector_loop_axis`)."""
    dims = [d for d, (coeffs, _) in enumerate(tensor.index) if coeffs[axis]]
    if not dims:
        return True
    last = len(tensor.index) - 1
    return dims == [last] and tensor.index[last][0][axis] == 1


def plain_projection(tensor) -> bool:
    """Whether every dimension of `tensor` is read by one axis with stride 1 and no offset (a
    matmul's operands): a window's rows (a pooling's, a depthwise conv's) overlap from one
    output row to the next, which the prefetchers follow (evidence: docs/model-evidence.md#stream-runs)."""
    return all(const == 0 and sum(1 for c in coeffs if c) == 1 and max(coeffs) == 1 for coeffs, const in tensor.index)


@lru_cache(maxsize=1024)
def plain_projections(expr: TensorExpr) -> bool:
    """Whether every input of `expr` is a `plain_projection` (a matmul, a conv seen as a GEMM; not
    a window's reads). Asked for every price of a CPU program, hence remembered."""
    return all(plain_projection(t) for t in expr.inputs)


@lru_cache(maxsize=1024)
def always_streamed(expr: TensorExpr, device: DeviceSpec) -> tuple[int, ...]:
    """The inputs every CPU program of a reduction `expr` reads in place from the bottom layer,
    whatever its tiles (`model.cpu.streamed_inputs` for any unit tile): plain projections that
    ignore spatial axes, each of extent 1 (a one-row matmul's B), which no tile reuses and no
    plan packs. What construction knows of the streams before a unit tile exists. (gemv's
    matrix, which ignores no axis, streams too, but its tiles' rows are long already.)"""
    if not device.runs_on_cpu or not expr.reduce:
        return ()
    out = []
    for t, tensor in enumerate(expr.inputs):
        ignored = [a for a in expr.spatial if not tensor.uses_axis(a)]
        if ignored and plain_projection(tensor) and all(expr.axes[a].extent == 1 for a in ignored):
            out.append(t)
    return tuple(out)


# Rows of an input read once from below the lowest cache layer (`read_once_below`) that one core's
# hardware prefetchers follow at once, where a tile walks those rows a few lines each and comes
# back for their next lines only after the others: with more, each row's next lines miss again,
# one latency each (`model.cpu.unfollowed_seconds`). 19 x 6469 x 7104 (B 184 MB, read in place)
# in 19 x 16 register tiles under unit tiles of 24, 32, 40, 48, 56, 64 and 288 of B's rows, two
# Xeon Emerald Rapids cores: 5.6, 5.7, 5.5, 5.9, 6.8, 17.5 and 17.4-25.8 ms, numpy 22 (evidence:
# docs/model-evidence.md#prefetch-rows; AMD's cores not measured).
PREFETCH_ROWS = 48


def prefetch_rows(device: DeviceSpec) -> int:
    """Rows a walk may visit in turn that `device`'s cores' prefetchers follow: its spec's
    `prefetch_rows` (16 on a Zen 3, `hardware.detect`), else PREFETCH_ROWS."""
    return device.prefetch_rows or PREFETCH_ROWS


@lru_cache(maxsize=4096)
def read_once_below(expr: TensorExpr, device: DeviceSpec, register) -> tuple[int, ...]:
    """The inputs (numbered) of a CPU reduction that a program with `register` tiles reads once
    from below its lowest cache layer: plain projections larger than that layer whose ignored
    spatial axes the register tile spans whole (no other tile reads their elements again), over
    more than one row of them (a one-row matmul's B streams as `always_streamed` says), and
    stored as they are read (`stored_past_caches`; a transposed B, `panels._panel_pays`,
    `transposed_in_panels`, is copied into panels instead). Cached: Roller asks at every growth of a
    cache tile (`construct.roller`'s `_full`)."""
    if not device.runs_on_cpu or not expr.reduce or len(device.layers) < 3:
        return ()
    out = []
    for t, tensor in enumerate(expr.inputs):
        ignored = [a for a in expr.spatial if not tensor.uses_axis(a)]
        if (ignored and stored_past_caches(expr, device, tensor)
                and prod(register[a] for a in ignored) > 1 and all(register[a] == expr.axes[a].extent for a in ignored)):
            out.append(t)
    return tuple(out)


def stored_past_caches(expr: TensorExpr, device: DeviceSpec, tensor) -> bool:
    """Whether input `tensor` of a CPU reduction is a plain projection larger than the device's
    lowest cache layer, stored as it is read: not across the output's contiguous axis nor
    permuted (`TensorExpr.transposed`), which every plan copies into panels row after row. What
    `read_once_below` and the model's `strips_seconds` read from below the caches in place."""
    return (plain_projection(tensor) and tensor.nbytes > device.layers[-2].capacity_bytes
            and tensor.name not in expr.transposed and not read_across(expr, tensor))


def read_across(expr: TensorExpr, tensor) -> bool:
    """Whether `tensor` reads the output's contiguous axis (`vector_axis`) other than along its
    own contiguous dimension (a B stored N x K): a CPU plan's panels of it change its layout."""
    vector = vector_axis(expr)
    return vector is not None and tensor.uses_axis(vector) and not streams(tensor, vector)


def unfollowed_inputs(expr: TensorExpr, device: DeviceSpec, register, first, tile) -> tuple[int, ...]:
    """The inputs (`read_once_below` under `register`) of which a walk in tiles `first` visits
    more rows in turn inside `tile` than the prefetchers follow (`walked_rows` > PREFETCH_ROWS):
    what ends Roller's growth of `tile` (`construct.roller`'s `_full`) and what the model prices
    a latency a line (`model.cpu.unfollowed_seconds`)."""
    return tuple(t for t in read_once_below(expr, device, register)
                 if walked_rows(expr, t, register, first, tile) > prefetch_rows(device))


def written_before(expr: TensorExpr) -> tuple[int, ...]:
    """The inputs (numbered) of a model's operator (an expression with `constants`, named by the
    importer) that are not its weights: the kernels before it wrote them, so its first pass over
    them reads from the other core's caches or the last-level cache, however small they are.
    ResNet-50 on two Xeon Emerald Rapids cores: its 1 x 1 convs of 512 to 128 channels over 28 x
    28, their 1.6 MB input read in place, ran 674 us in their place in the model and 317 timed
    in a row, the input then in the core's L2 (evidence: docs/model-evidence.md#written-before)."""
    if not expr.constants:
        return ()
    return tuple(t for t, tensor in enumerate(expr.inputs) if tensor.name not in expr.constants)


def unfollowed_reads(expr: TensorExpr, device: DeviceSpec, register, first, tile) -> tuple[int, ...]:
    """The inputs of which a walk in tiles `first` visits more rows in turn inside `tile` than
    the prefetchers follow (`walked_rows` > PREFETCH_ROWS) while it reads them from below the
    core's caches: every pass over those `read_once_below` reads (`unfollowed_inputs`), the first
    pass over those a model's operator gets from the kernels before it (`written_before`). What
    the model prices a latency a line (`model.cpu.unfollowed_seconds`); each line of either is
    read from below once. Not the inputs of a nest without a lanes micro-kernel (a grouped
    conv's, a pooling's: no `lane_axis`), whose steps `model.cpu.lines_in_flight` cannot count."""
    if not device.runs_on_cpu or not expr.reduce or len(device.layers) < 3:
        return ()
    written = written_before(expr) if lane_axis(expr, device) is not None else ()
    below = sorted(set(read_once_below(expr, device, register)) | set(written))
    return tuple(t for t in below if walked_rows(expr, t, register, first, tile) > prefetch_rows(device))


# The shortest run of a row a walk may read at a visit and still be followed, however many rows it
# walks: two lines, the pair the L2's adjacent-line prefetcher completes. On the Xeon, 3 x 281 x
# 7872 read B (8.8 MB) in 384-byte runs under unit tiles of 96 and 288 rows as fast as of 48
# (126-146 us), and 9 x 4096 x 1024 in 128-byte runs 1.34x slower under 256 rows than 48 (not
# priced), in 64-byte runs 1.47x.
FOLLOWED_RUN_BYTES = 128


# A row's run that a walk reads a line at a visit, in turn with other rows, is missed for its first
# RAMP_LINES lines: the prefetchers follow a stream only after some of its lines. On the 2-core
# Xeon with AMX (a 480 MiB L3, 120 MiB held), 4 images of 347 -> 17 1x1 convs over 53 x 53 read
# their data (15.6 MB) in place a line a visit, 32 channel rows in turn, under unit tiles 64, 128,
# 176, 256, 352 and 704 pixels wide (runs of 4, 8, 11, 16, 22 and 44 lines a row): 1.53, 1.53,
# 1.44, 1.10, 0.89 and 0.78 ms, all but the last priced alike at 0.67 before
# (docs/model-evidence.md#short-runs).
RAMP_LINES = 8


def unramped_share(expr: TensorExpr, device: DeviceSpec, t: int, register, first, tile) -> float:
    """The share of input `t`'s lines that a walk in tiles `first` reads before the prefetchers
    follow them, where it reads them a line at a time (visits shorter than FOLLOWED_RUN_BYTES,
    `visit_tile`): each row's run inside `tile` starts a stream whose first RAMP_LINES lines are
    missed, all of a run as short. 0 where a visit spans the rows or reads FOLLOWED_RUN_BYTES of
    them (`line_visits`), or where `tile` spans the rows whole (one run in memory)."""
    tensor = expr.inputs[t]
    run = calculus(expr).data_tiles(tuple(tile))[t][-1]
    if not line_visits(expr, t, register, first) or run == tensor.shape[-1]:
        return 0.0
    return min(1.0, RAMP_LINES / ceil(run * tensor.itemsize / device.layers[-1].transaction_bytes))


def line_visits(expr: TensorExpr, t: int, register, first) -> bool:
    """Whether a walk in tiles `first` reads input `t`'s rows a line or so at a time: its visits
    (`visit_tile`) neither span the rows (one run in memory) nor read runs of FOLLOWED_RUN_BYTES
    or more of them (the pair of lines the L2's adjacent-line prefetcher completes)."""
    tensor = expr.inputs[t]
    run = calculus(expr).data_tiles(visit_tile(expr, register, first))[t][-1]
    return run != tensor.shape[-1] and run * tensor.itemsize < FOLLOWED_RUN_BYTES


def walked_rows(expr: TensorExpr, t: int, register, first, tile) -> int:
    """Rows of input `t` that a walk in tiles `first` (the first cache layer's, which the
    micro-kernel walks) visits in turn inside `tile`, each a stream of its own: its data tile's
    elements along every dimension but the last, the contiguous one, under `tile` (a matmul's B
    under a K-extent of 288: 288), or under `first` where `first` spans that last dimension whole
    (the walk ends those rows before it starts others); 1 where a visit spans it whole (its rows
    one run in memory) or reads runs of FOLLOWED_RUN_BYTES or more of it (a transposed B's rows of
    207 floats in runs of 192). A visit is what the micro-kernel reads of a row before it goes to
    the next (`visit_tile`, `line_visits`)."""
    tensor, calc = expr.inputs[t], calculus(expr)
    if not line_visits(expr, t, register, first):
        return 1
    whole = calc.data_tiles(tuple(first))[t][-1] == tensor.shape[-1]
    return prod(calc.data_tiles(tuple(first if whole else tile))[t][:-1])


def visit_tile(expr: TensorExpr, register, first) -> tuple[int, ...]:
    """What the micro-kernel reads of each input in one visit to its rows: the register tile's
    spatial extents over the first cache tile's reduction, which it steps through with the
    accumulators in registers before it moves to the next register tile of `first`. A matmul's B
    (K x N) is visited in runs of the register tile's N, however wide `first` is: on the 2-core
    Zen 3, 3 x 1417 x 4355 in 3 x 24 register tiles walking 48 or 109 of B's rows ran 1.7-3.5x the
    time of 16 rows under L1 tiles 48 to 384 columns wide alike (evidence:
    docs/model-evidence.md#prefetch-rows); a B stored N x K in runs of `first`'s K."""
    return tuple(f if ax.kind == "reduce" else r for ax, r, f in zip(expr.axes, register, first))


# Rows of a streamed input (`always_streamed`) a one-row matmul's register tile reads per step,
# unrolled over the same registers: each row is a stream of its own, and a core that follows more
# of them at once keeps more misses in flight. Two Zen 4 cores, B read from DRAM and the
# last-level cache, 1 x 2048 x 4096: 1, 4, 8, 16 and 32 rows 1.03, 0.53, 0.44-0.51, 0.46-0.60 and
# 0.64-0.82 ms; 1 x 1853 x 5737: 1, 2, 4, 8 and 17 rows 1.5-1.8, 1.41-1.46, 1.14-1.5, 0.89-1.07 and
# 0.69-1.07 ms (numpy 0.65-0.9). 32 rows ran slower (our reading, not measured: more streams than
# the core's prefetchers follow), and each row unrolled lengthens the compile (109 rows had not
# compiled after 15 minutes).
STREAM_ROWS = 16


def stream_rows(extent: int) -> int:
    """The register K of a one-row matmul over a reduction of `extent`: the divisor of it nearest
    `STREAM_ROWS` on a log scale, up to twice that (a K of 1853 = 17 x 109 reads 17 rows), where
    that divisor is at least half STREAM_ROWS; else STREAM_ROWS (or the whole of a shorter K),
    the last step of rows cut by K's end and guarded (`panels.splits_edges`: a prime K of 1847, or
    2315 = 5 x 463, reads 16 rows at a time)."""
    divisors = [d for d in range(1, 2 * STREAM_ROWS + 1) if extent % d == 0]
    best = min(divisors, key=lambda d: (abs(log(d / STREAM_ROWS)), -d))
    return best if 2 * best >= STREAM_ROWS else min(STREAM_ROWS, extent)


@lru_cache(maxsize=1024)  # asked by two rules on every size they scan
def stream_rows_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The reduction whose every tile takes `stream_rows` K-steps (`StreamRowsRule`): the one
    reduction of a one-row matmul (`always_streamed`) vectorised along an output axis that the
    streamed inputs read (B's rows along N); None elsewhere (an RMS norm's mean of 10 rows of 24,
    whose lane axis, of extent 1, no input reads: a row reduction)."""
    streamed = always_streamed(expr, device)
    if len(expr.reduce) != 1 or not streamed:
        return None
    lane = lane_axis(expr, device)
    if lane is None or expr.axes[lane].kind != "spatial" or not all(expr.inputs[t].uses_axis(lane) for t in streamed):
        return None
    return expr.reduce[0]


def even_tile(extent: int, parts: int, step: int = 1) -> int:
    """The tile that cuts `extent` into `parts` even tiles, rounded up to whole multiples of
    `step`: ceil(ceil(E / parts) / step) x step (a core's share of a row in whole register tiles,
    `rules.StreamRowsRule`; an even cut in whole tiles of the layer above, `Space.balances`)."""
    share = -(-extent // parts)
    return -(-share // step) * step


@lru_cache(maxsize=1024)  # asked by the accumulator and stream-rows rules on every size they scan
def share_streams_from_l1(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether a one-row matmul (`axes.stream_rows_axis`) can take a core's even share of N as
    its L1 tile (`rules.StreamRowsRule`): its `stream_rows` rows of B and its row of outputs fit
    the first cache layer."""
    rows_axis = stream_rows_axis(expr, device)
    if rows_axis is None or len(device.layers) < 2:
        return False
    share = even_tile(expr.axes[lane_axis(expr, device)].extent, device.compute_units)
    rows = stream_rows(expr.axes[rows_axis].extent)
    return (rows + 1) * share * expr.output.itemsize <= device.layers[1].capacity_bytes


def is_projection(tensor, expr: TensorExpr) -> bool:
    """Whether every dimension of `tensor` is indexed by one whole unfused axis with coefficient
    1 and no offset (matmul's operands, a conv's filters; not a conv's input windows): a tile of
    it can be copied into a panel of any layout."""
    for coeffs, const in tensor.index:
        used = [a for a, c in enumerate(coeffs) if c]
        if const or len(used) != 1 or coeffs[used[0]] != 1 or len(expr.axes[used[0]].fused_from) > 1:
            return False
    return True


# Cached, as `lane_axis`, `mma_axes` and `autovector_axis`: the rules ask for them on every size
# they scan (cpu-tails, vector-lanes, thread-tile), and a convolution's answer walks every output
# dimension's readers. Expressions and device specs keep their hashes (`frozen.hash_once`), so a
# lookup costs less than the answer.
@lru_cache(maxsize=256)
def filter_axis(expr: TensorExpr) -> int | None:
    """The output-channel axis of a convolution-like reduction, or None.

    The operator reduces and reads its output's contiguous axis through a window (an input
    dimension indexed by that axis and another, `x*stride + s`), and the axis is a spatial one
    that the inputs reading it read as projections (`is_projection`: the filters) while at
    least one other input ignores it (the data, broadcast), and the filters are reused (they
    ignore a spatial axis longer than 1). The innermost such output dimension (conv2d: f).
    Depthwise convolutions and pooling have none: their channel axis indexes the windowed data.
    """
    v = vector_axis(expr)
    if not expr.reduce or v is None or not any(_windowed(t, v) for t in expr.inputs):
        return None
    found = None
    for dim, (coeffs, _) in enumerate(expr.output.index):
        a = dim_axis(expr.output, dim)
        if a is None or expr.axes[a].kind != "spatial":
            continue
        readers = [t for t in expr.inputs if t.uses_axis(a)]
        if not readers or len(readers) == len(expr.inputs):
            continue
        reused = all(any(not t.uses_axis(b) and expr.axes[b].extent > 1 for b in expr.spatial) for t in readers)
        if reused and all(is_projection(t, expr) for t in readers):
            found = a
    return found


def _windowed(tensor, axis: int) -> bool:
    """Whether `tensor` reads `axis` in a dimension that another axis indexes as well."""
    return any(coeffs[axis] and sum(1 for c in coeffs if c) > 1 for coeffs, _ in tensor.index)


@lru_cache(maxsize=1024)
def short_filter_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """A convolution's `filter_axis` shorter than a CPU vector that the micro-kernel fills one
    whole vector of, padded with zero filters (`panels.pads_filters`, the only tile longer than
    its axis, `alignment._scan`), or None: filters longer than half a vector (9 to 15 over
    AVX-512's 16 lanes, 5 to 7 over AVX2's 8), at most half the lanes wasted, where the output
    row left to the lanes instead ran scalar (13 filters of 239 x 5 x 5 over 17 x 17 outputs ran
    at 0.12x ONNX Runtime's speed on an AVX-512 Zen 4); and down to a quarter of a vector (4 to 8
    over 16 lanes, 2 to 4 over 8) where the output row cannot take the lanes in whole 4-lane
    pieces either (`row_fills_lanes`): 8 filters of 29 x 7 x 7 over a row of 23 ran its 7-column
    end scalar, 0.19-0.22x ONNX Runtime (docs/model-evidence.md#lane-axis)."""
    if not device.runs_on_cpu or device.lanes_are_threads:
        return None
    f = filter_axis(expr)
    if f is None or expr.axes[f].extent >= device.warp_size:
        return None
    filters = expr.axes[f].extent
    if 2 * filters > device.warp_size:
        return f
    return f if 4 * filters >= device.warp_size and not row_fills_lanes(expr, device) else None


def row_fills_lanes(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether a CPU micro-kernel can run `expr`'s output row (`vector_axis`) in its SIMD lanes
    without a scalar end: every input streams along it (`streams`: no stride) and it is a whole
    number of vectors or of the 4-lane pieces the template vectorises a whole row in
    (`rules.VectorLanesRule`)."""
    v = vector_axis(expr)
    if v is None or expr.axes[v].kind != "spatial" or not all(streams(t, v) for t in expr.inputs):
        return False
    return expr.axes[v].extent % min(4, device.warp_size) == 0


@lru_cache(maxsize=1024)
def lane_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The axis a CPU register micro-kernel fills its SIMD lanes along, or None (scalar code).

    A convolution's `filter_axis` when it holds at least a vector (oneDNN's direct-convolution
    idea: the filters, packed into panels with the filter axis innermost, stream as vectors;
    each input element is broadcast, so the stride does not matter; the accumulators keep the
    filter axis innermost; evidence: docs/model-evidence.md#lane-axis). Filters that no whole
    vectors divide (31, 347) are padded with zero filters to whole tiles, as oneDNN pads its
    output-channel blocks (`panels.pads_filters`), rather than left to a scalar row; so are
    filters shorter than a vector but longer than half of one (`short_filter_axis`).
    Else the output's contiguous axis (`vector_axis`) when every input streams along it or
    ignores it (a strided or transposed access turns a vector load into a gather); else, for a
    reduction, its innermost reduce axis when an input reads it, every input streams along it
    or ignores it, and it has at least a vector of lanes: each output then keeps a vector of
    per-lane partial sums, summed across lanes once per tile (gemv, row sums: the CPU
    template's rfactor path). That reduce axis also where the output's contiguous axis holds
    one element (a pool's output kept to [C, 1], whose pixels would otherwise be summed one at
    a time). Else none (a stride-2 pooling's output row is a gather).
    """
    f = filter_axis(expr)
    if f is not None and (expr.axes[f].extent >= device.warp_size or f == short_filter_axis(expr, device)):
        return f
    v = vector_axis(expr)
    if v is not None and expr.axes[v].kind == "spatial" and all(streams(t, v) for t in expr.inputs):
        k = _reduce_lanes(expr, device)
        return v if expr.axes[v].extent > 1 or k is None else k
    return _reduce_lanes(expr, device)


def _reduce_lanes(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The innermost reduce axis, where `lane_axis` may fill the lanes along it, else None."""
    if not expr.reduce:
        return None
    k = expr.reduce[-1]
    if expr.axes[k].extent < device.warp_size or not any(t.uses_axis(k) for t in expr.inputs):
        return None
    return k if all(streams(t, k) for t in expr.inputs) else None


@lru_cache(maxsize=1024)
def autovector_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The output row LLVM vectorises on its own in a CPU micro-kernel without a `lane_axis`: the
    output's contiguous axis where an input reads it strided (a stride-2 pooling), or None. The
    template leaves that row scalar and unrolled; LLVM's SLP vectoriser packs it into vectors in
    power-of-two pieces, shuffling the strided loads (a row of 1 to 3, its loop vectoriser packs
    consecutive register tiles instead): `model.cpu_compute.autovector_efficiency`."""
    if not device.runs_on_cpu or lane_axis(expr, device) is not None:
        return None
    v = vector_axis(expr)
    return v if v is not None and expr.axes[v].kind == "spatial" else None


def is_micro_kernel_layer(device: DeviceSpec, layer: int) -> bool:
    """Whether a tile at `layer` is a CPU core's register micro-kernel: the top, per-thread layer
    of a device whose lanes are SIMD lanes of vector registers."""
    return layer == 0 and not device.lanes_are_threads and device.layers[0].scope == "thread"


def reduce_lanes(expr: TensorExpr, lane: int | None) -> bool:
    """Whether a CPU micro-kernel whose `lane_axis` is `lane` runs its SIMD lanes along a
    reduction (gemv, row sums), keeping a vector of partial sums per output row."""
    return lane is not None and expr.axes[lane].kind == "reduce"


def filter_lanes(expr: TensorExpr, lane: int | None) -> bool:
    """Whether a CPU micro-kernel whose `lane_axis` is `lane` vectorises `expr` along its
    `filter_axis`."""
    f = filter_axis(expr)
    return f is not None and f == lane
