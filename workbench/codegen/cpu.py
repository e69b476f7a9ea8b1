"""The LLVM/CPU schedule template: an rProgram (registers, L1, L2 tiles) as loop tiling.

Every axis is split by its tile chain into levels `[L2 tiles, L1 tiles per L2 tile, register
tiles per L1 tile, register tile]` (level 0 outermost), and the loops are ordered

    S0 (parallel: the grid) R0 | S1 R1 | S2 | R2 | register tile (R3 S3, vectorised axis last)

so one core owns an L2 tile and walks the reduction in the L2 tile's K-steps, the L1 tiles
inside one K-step reuse what that step brought into L2, and the register micro-kernel is
unrolled. A split program (`RProgram.split` = S, where the grid alone leaves cores idle) deals
those K-steps over S cores instead: TVM's `rfactor` makes each part's partial sums a block of
their own, tiled as above with the loop over the parts joining the grid, and one core adds the
S rows of partial sums after the parallel loop (`_split_k`, `_final_sum`). A reduction
accumulates into a local buffer of one L2 output tile (`cache_write`, laid out along fused axes, written back once per grid iteration by `reverse_compute_at`), or,
where the whole reduction fits one L1 tile, of one register tile, stored to the output in
vectors right after its K-loop (`CpuPlan.direct_stores`); an epilogue (avgpool / reduce_mean
division, a bias and GELU) is folded into that write-back, while blocks that are passes over
the reduced rows of their own (softmax's exp, sum and division, a norm's normalisation:
`common.row_passes`) are computed per grid tile after it, vectorised where vectors divide the
row (`_row_passes`; a reduction in per-row lanes, `_vectorise_reduction`); producers
are inlined, but for a padding copy, computed per unit tile (or per reduction step of it, or per
L1 tile: `CpuPlan.pad_level`) on the core that reads it (`_pad_per_tile`).

Cached layers become buffers where the micro-kernel gains from them: a reduction whose inputs
are plain projections (matmul, batched, transposed) packs an input's tile of the outermost
cached layer into a per-core panel once per K-step, laid out in register-tile strips so the
micro-kernel streams it (`_pack_panels`, the BLIS/oneDNN idea), where its layout must change
or its L1 tile, read in place, would span more than the L1 and more than one register tile
reads the panel (`panels.read_once`), and pads ragged spatial axes to
whole tiles so the micro-kernel needs no guard (`_pad_tails`). Every such decision (the path,
the vectorised loop, the packed inputs, padded tails, direct stores, where the padding copies
go) is the kernel's `rtile.plan.CpuPlan`, which this module carries out and the model prices;
nothing here decides on its own. A reduction with no
vectorisable output axis (gemv, row sums, softmax's row maximum) vectorises its innermost
reduction axis instead: per-lane partial results, combined once per register tile where its L1
tile spans K and once per unit tile where not, a ragged K's whole register tiles unguarded and
its last one scalar (`_schedule_lanes`). A convolution with a vector of
filters vectorises them instead of its output row: the filters packed into panels, the data
broadcast, the accumulator filters-last (`_schedule_filters`), filters the unit tile leaves
ragged padded with zero filters (`_pad_filters`). Elsewhere (depthwise convs,
pooling, elementwise) the hardware-managed caches need no buffer: the tiling alone realises
the program's footprints, and storage padding emits nothing. Other tiles that do not divide an
extent leave a guarded tail (TVM adds a block predicate), so prime extents stay correct.
"""
from __future__ import annotations

from math import gcd, prod

from workbench.codegen import common
from workbench.codegen.template import ScheduleError
from workbench.errors import first_line
from workbench.hardware.spec import DeviceSpec
from workbench.ops.pixel_gemm import gathered_name
from workbench.ops.tensor_expr import TensorExpr, is_reduction, reads_along_rows
from workbench.rtile.panels import (
    PAD_STEP, cut_other_axes, cut_register_axes, ragged, row_block_width, row_vector, transposes, vector_width,
)
from workbench.rtile.plan import FILTERS, LANES, CpuPlan, cpu_plan, splits_reduction
from workbench.rtile.rprogram import RProgram, split_axis, split_steps

# Most iterations of the non-vectorised register loops unrolled into straight-line code (the
# vectorised loop counts once): enough for a 6-row tile over 16 K-steps or a 3x3 window row of 56
# pixels; beyond it compile time grows while the register tile no longer fits the registers anyway.
MAX_UNROLL = 256
# Most reduction iterations unrolled into one chain: every one updates the same accumulators, so
# unrolling gains no parallelism, and TVM's simplifier rewrites an unrolled min/max chain into
# nested min/max expressions whose simplification grows exponentially with the depth (a chain of
# 32 compiled for many minutes; 8 compiles in well under a second).
MAX_CHAIN = 8


def schedule_cpu(expr: TensorExpr, program: RProgram, device: DeviceSpec, plan: CpuPlan | None = None):
    """A `tvm.s_tir.Schedule` carrying out `plan` (default: `rtile.plan.cpu_plan` of `program`
    on `device`, the plan the model priced) on an LLVM CPU target (see the module docstring);
    ScheduleError (one line) when it cannot. Every decision comes from the plan."""
    common.check_program(expr, program)
    if len(program.tiles) < 2:
        raise ScheduleError(f"a CPU program needs register and cache tiles, got {len(program.tiles)} layer(s)")
    if program.split > 1 and (split_axis(expr, device) is None or not splits_reduction(program, device)):
        raise ScheduleError(f"{expr.op}: this CPU template does not split this program's reduction over cores")
    try:
        return _schedule(expr, program, plan or cpu_plan(program, device), split_axis(expr, device))
    except ScheduleError:
        raise
    except Exception as err:  # a TVM primitive refused the program
        raise ScheduleError(first_line(err)) from err


def _schedule(expr: TensorExpr, program: RProgram, plan: CpuPlan, split: int | None):
    """The schedule of `plan` (`schedule_cpu`); `split` the axis a split program deals over its
    parts (`rprogram.split_axis`; None where the operator splits none)."""
    if plan.path == FILTERS:
        return _schedule_filters(expr, program, plan)
    if plan.path == LANES:
        return _schedule_lanes(expr, program, plan)
    sch = common.new_schedule(expr)
    epilogues = common.epilogue_names(sch, expr)
    staged = _stage_producers(sch, expr, plan)
    padded_output = plan.padded_tails and _pad_tails(sch, expr, program, plan.edge_axes)
    block = sch.get_sblock(expr.main_block)
    shape = tuple(sch.get(block).writes[0].source.shape)
    loops, final, parts = common.axis_loops(sch, block, expr, flat_buffers=True), None, []
    if program.split > 1:  # split-K: the block tiled below computes the partial sums, `final` adds them
        final, (block, loops, part) = block, _split_k(sch, program, split, block, loops)
        parts = [part]
    levels = _split(sch, expr, program, loops)
    vector_axis, whole = plan.vector_axis, plan.direct_stores
    order = _loop_order(expr, levels, vector_axis, whole)
    sch.reorder(*parts, *order)
    grid = _parallelise(sch, parts + [levels[a][0] for a in expr.spatial])
    _pad_per_tile(sch, staged, _pad_loop(expr, levels, grid, plan.pad_level))
    # vectorise and unroll before decompose_reduction: its update block has no init, and TVM
    # refuses to vectorise a loop over a block that is neither complete nor a reduction
    vector_loop = levels[vector_axis][-1] if vector_axis is not None else None
    # where a ragged row's edge tile runs guarded (`CpuPlan.split_edges`), its scalarised body is
    # copied once per unrolled K-step: one-row matmuls of 7 rows in flight (`axes.stream_rows`)
    # over 80- and 96-wide rows took 31 and 99 s to compile so; with the K-steps a loop, the 80-wide
    # one took 1.6 s and a 144-wide one 2.1 s
    chain = 1 if plan.split_edges else MAX_CHAIN
    _micro_kernel(sch, order[-len(levels):], vector_loop, plan.lanes, _reduce_positions(expr, levels, order), chain,
                  plan.edge_vectors)
    if expr.reduce:
        # one register tile's accumulators go straight to the output when the whole reduction
        # runs inside it (`CpuPlan.direct_stores`); the loop over register tiles is then the last S(n-1)
        tile_loop = _register_tiles_loop(expr, levels) if whole else None
        passes = epilogues if common.row_passes(sch, expr.main_block, epilogues) else ()
        scope = "global" if plan.stack_accumulators else "local"
        # a split program's partial sums go to a buffer of their own, the padded output's its final sum
        _accumulate(sch, expr, block, tile_loop or grid, () if passes else epilogues, levels,
                    padded_output and final is None, scope)
        if tile_loop is not None:
            _store_registers(sch, sch.get_consumers(block)[0], tile_loop, plan.lanes, plan.stack_accumulators)
        if passes:
            _row_passes(sch, expr, program, passes, grid, shape, plan.lanes)
        if (padded_output or plan.split_edges or plan.edge_axes) and (tile_loop or grid) is not None:
            _partition_edges(sch, sch.get_consumers(block)[0], tile_loop or grid)
        if padded_output and tile_loop is not None:
            # each register tile's stores are unrolled under their guard: split the loops over
            # register tiles instead, so the tiles inside the output store whole vectors
            _split_edges(sch, [loop for a in expr.spatial for loop in levels[a][1:-1]])
        if plan.packed:
            level = _pack_level(program, plan)
            # under R(level), or where `whole` moved it inward, under the S(level) it followed
            at = (grid if level == 0 else levels[expr.spatial[-1]][level]) if whole else None
            _pack_panels(sch, expr, program, plan, block, levels, at)
    elif epilogues:
        common.inline_epilogues(sch, epilogues)
    if plan.edge_axes:  # as a ragged row's: the loops over tiles, and a ragged K's over unit K-steps
        _split_edges(sch, [loop for a in plan.edge_axes for loop in levels[a][1:-1]]
                     + [levels[a][0] for a in plan.edge_axes if a in expr.reduce])
    if plan.split_edges:
        # an axis of one-row register tiles whose end the grid's index places (unit tiles
        # shorter than it) keeps its guard where the registers store straight out, one test a
        # tile: partitioned, its loop left a copy of the unit tile's whole nest past the end,
        # every lane testing the row's guard scalar (docs/evidence.md#grid-cut-batches)
        others = [a for a in expr.spatial if a != vector_axis and ragged(expr, program, a)
                  and not (plan.direct_stores and program.register_tile[a] == 1
                           and program.unit_tile[a] < expr.axes[a].extent)]
        # with `edge_vectors` the row splits inside its register tiles instead (`_micro_kernel`)
        row = () if plan.edge_vectors else (vector_axis,)
        # a ragged reduction's loop over the unit tile's K-steps as well (a one-row matmul's
        # steps of rows: `axes.stream_rows`): where its end lies there, every step left K's
        # guard on every row of B (1 x 79 x 21843: 51 us against 39 with that loop split)
        _split_edges(sch, [loop for a in (*others, *row, *expr.reduce) for loop in levels[a][1:-1]]
                     + [levels[a][0] for a in expr.reduce if ragged(expr, program, a)])
    elif plan.split_others:  # as the filters path's pixel axes (`_schedule_filters`)
        _split_edges(sch, [loop for a in cut_other_axes(expr, program, vector_axis) for loop in levels[a][1:-1]])
    if plan.edge_vectors:
        _edge_tile_apart(sch, block, levels[vector_axis][1:-1], len(expr.reduce) + len(levels) + 1)
    if final is not None:
        _final_sum(sch, final, plan.lanes)
    return sch


def _split_k(sch, program: RProgram, axis: int, block, loops: list):
    """Deal reduce `axis` (`rprogram.split_axis`) over `program.split` parts of `split_steps` of
    the unit tile's K-steps each, the last part the rest (a predicate), by TVM's `rfactor`: a
    partial-sum block writing `<output>_rf[part, outputs]`, whose loops (`loops`, one per axis,
    the split axis's a part's elements) are then tiled as the unsplit block's would be, and the
    original block, now the sum over the parts (`_final_sum`). Split before the tiling, so that
    the sum's loops span the outputs exactly (TVM's rfactor keeps no predicate of a ragged tile
    on them). Returns the partial-sum block, its loops and the loop over the parts."""
    length = split_steps(program, axis) * program.unit_tile[axis]
    part, inner = sch.split(loops[axis], factors=[None, length], preserve_unit_iters=True)
    loops = [inner if a == axis else loop for a, loop in enumerate(loops)]
    # rfactor rebuilds the loop nest in the same order around the partial-sum block: the loops
    # are found again by their places in it
    nest = [sch.get_sref(loop) for loop in sch.get_loops(block)]
    place = [next(n for n, ref in enumerate(nest) if ref.same_as(sch.get_sref(loop))) for loop in (*loops, part)]
    rf = common.primitive("rfactor the split axis", sch.rfactor, part, 0)
    rebuilt = sch.get_loops(rf)
    *loops, part = [rebuilt[n] for n in place]
    return rf, loops, part


def _final_sum(sch, block, lanes: int) -> None:
    """Schedule the sum of a split program's partial sums (`_split_k`) on one core after the
    parallel loop: rfactor leaves it one loop per output axis, in order, and the loop over the
    parts innermost; that loop goes outermost and the outputs' loops, fused, walk the output in
    order, vectorised in `lanes` where they divide it, the initialisation a pass of its own."""
    *outputs, part = sch.get_loops(block)
    sch.reorder(part, *outputs)
    fused = sch.fuse(*outputs) if len(outputs) > 1 else outputs[0]
    # before decompose_reduction, as in `_schedule`: TVM vectorises no update block without its
    # init; where the vectors do not divide the outputs, lowering splits the last one off
    # (`_partition_edges`), the rest unguarded
    ragged = int(sch.get(fused).extent) % lanes
    vectors, lane = sch.split(fused, factors=[None, lanes])
    if ragged:
        sch.annotate(vectors, "pragma_loop_partition_hint", 1)
    sch.vectorize(lane)
    common.primitive("initialise the sum", sch.decompose_reduction, block, part)


def _edge_tile_apart(sch, block, tile_loops: list, register_loops: int) -> None:
    """Where a split row's edge runs its whole vectors vectorised (`CpuPlan.edge_vectors`: the
    row's end cuts the last register tile of each unit tile's last L1 tile), partition the loops
    of `block` over L1 tiles and register tiles along the row (`tile_loops`) so that that last
    register tile is a block of its own, and unroll the vectors of every other copy again: those
    run the micro-kernel with their accumulators in registers. In the last tile the loop over its
    vectors comes first among its innermost `register_loops` (from the loop over its L1 tile's
    K-steps inward, the vectors' split counted), so that each vector sums the L1 tile's K-steps
    in a register of its own, and keeps the partitioning mark that splits it where the row ends:
    its whole vectors vectorised, the one the end cuts lane by lane. With that loop inside the
    K-steps in every tile, every tile kept its accumulators in memory: 1 x 2780 x 881 in 1 x 56
    tiles ran 256 us so, 110 apart (docs/evidence.md#edge-vectors)."""
    loops = sch.get_loops(block)
    # by depth from the block: partitioning puts blocks, not loops, between the loops it copies
    depths = [len(loops) - next(k for k, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(t)))
              for t in tile_loops]
    for depth in depths:
        loops = sch.get_loops(block)
        loop = loops[len(loops) - depth]
        extent = int(sch.get(loop).extent)
        if extent <= 1:
            continue
        inside, edge = common.primitive("split the edge tile off", sch.loop_partition, loop, [extent - 1, None])
        for copy in sch.get_child_blocks(inside):
            vectors = sch.get_loops(copy)[-2]
            sch.unannotate(vectors, "pragma_loop_partition_hint")
            sch.unroll(vectors)
        block = sch.get_child_blocks(edge)[0]
    register = sch.get_loops(block)[-register_loops:]
    common.primitive("sum each edge vector apart", sch.reorder, register[-2], *register[:-2])


def _split_edges(sch, loops: list) -> None:
    """Mark `loops`, loops over tiles between the grid and the register tile, for loop partitioning,
    so that lowering splits them where the guarded axes end: the tiles inside the extents run
    without the guard, and the tiles from the one an end cuts to the unit tile's end keep it (their
    vectors scalarised). Of one axis's marked loops lowering splits the outermost whose iterations
    the end divides, not the loops inside its cut part (a row's edge runs scalar from the L1 tile
    its end cuts: `model.cpu_compute.edge_split`). For the loops of a ragged row's vector axis and
    reductions (`CpuPlan.split_edges`), that is its micro-kernel (the write-back's loops are marked
    as padded outputs' are, `_partition_edges`); for a padded output stored straight from the
    registers (`CpuPlan.direct_stores`), its stores, which otherwise test every element of every
    tile, scalar (704x44x515 ran 2x slower than 708x44x528)."""
    from tvm.tirx import ForKind

    for loop in loops:
        extent = sch.get(loop).extent  # symbolic in a dynamic-shape bundle's kernel: partitioned too
        if sch.get(loop).kind == ForKind.SERIAL and not (hasattr(extent, "value") and int(extent) <= 1):
            sch.annotate(loop, "pragma_loop_partition_hint", 1)


def _stage_producers(sch, expr: TensorExpr, plan: CpuPlan) -> tuple[str, ...]:
    """Inline the producers (copies, conv's zero border) into the main block, unless one pads:
    an input read under a larger shape than the caller passes. A padding producer stays its own
    stage, computed per unit tile (`_pad_per_tile`); the names of those it left are returned.
    Inlined, its bounds test is evaluated per lane inside the vectorised micro-kernel, which
    LLVM can only scalarise (evidence: docs/evidence.md#cpu-stage-producers)."""
    if plan.staged_padding:
        names = common.producer_names(sch, expr)
        gathers = [name for name in names if _gathers(sch, name)]
        for name in gathers:
            if _copied(sch, name) in plan.transposed_in_panels:
                continue  # its panel copy reads the operand as stored (`_pack_panels`)
            if _copied(sch, name) in expr.transposed:
                _transpose_first(sch, name, plan.lanes)
            else:
                _gather_first(sch, name)
        return tuple(name for name in names if name not in gathers)
    common.inline_producers(sch, expr)
    return ()


# The longest row of a gather (`_gather_first`) unrolled: unrolled, LLVM folds the zero border's
# test of each column (a window's copy, `ops.window_gemm`) where the loop kept it per element.
# Rows of 17-128 ran 1.1-2.2x faster so, 160 as fast (evidence: docs/evidence.md#window-gemm).
MAX_UNROLLED_GATHER_ROW = 128


def _gather_first(sch, name: str) -> None:
    """Run the producer `name` that gathers an image's pixels (a strided pointwise conv's,
    `ops.pixel_gemm`; a window's, `ops.window_gemm`) before the loop nest, over all cores, a row
    of pixels at a time, its innermost loop walking the image at a constant stride, unrolled up
    to MAX_UNROLLED_GATHER_ROW. Inside each tile's panel copy instead, every pixel's row and
    column came from the flat pixel index: 31 channels over 161 x 161 at stride 2 ran 71 us
    so, 40 us gathered first (evidence: docs/evidence.md#gathered-pixels)."""
    loops = sch.get_loops(sch.get_sblock(name))
    common.primitive(f"gather {name} on all cores", sch.parallel, sch.fuse(*loops[:-1]) if len(loops) > 1 else loops[0])
    row = sch.get(loops[-1]).extent
    if len(loops) > 1 and hasattr(row, "value") and int(row) <= MAX_UNROLLED_GATHER_ROW:
        common.primitive(f"unroll {name}'s row", sch.unroll, loops[-1])


def _transpose_first(sch, name: str, lanes: int) -> None:
    """Run the producer `name` that copies a transposed operand with its dimensions permuted
    (`ops.transposed_gemm`) before the loop nest, over all cores, in blocks of `lanes` x `lanes`
    elements: a block reads `lanes` lines of the operand and writes `lanes` lines of the copy,
    each row of it one vector store, where a row at a time read every element from a line of
    its own (2 x 4096 x 4096's B: 66 ms copied so, 18 ms in blocks)."""
    *outer, row, col = sch.get_loops(sch.get_sblock(name))
    rows, row_in = sch.split(row, factors=[None, lanes])
    cols, col_in = sch.split(col, factors=[None, lanes])
    sch.reorder(rows, cols, row_in, col_in)
    common.primitive(f"copy {name} on all cores", sch.parallel, sch.fuse(*outer, rows) if outer else rows)
    common.primitive(f"vectorise {name}'s rows", sch.vectorize, col_in)


def _copied(sch, name: str) -> str:
    """The buffer the producer block `name` reads."""
    return str(sch.get(sch.get_sblock(name)).reads[0].source.name)


def _gathers(sch, name: str) -> bool:
    """Whether the producer block `name` gathers a strided image's pixels (`ops.pixel_gemm`): it
    reads one buffer and writes that buffer's gathered copy."""
    block = sch.get(sch.get_sblock(name))
    reads = block.reads
    return len(reads) == 1 and str(block.writes[0].source.name) == gathered_name(str(reads[0].source.name))


def _pad_per_tile(sch, staged: tuple[str, ...], at) -> None:
    """Compute each staged padding producer under the loop `at` (`_pad_loop`): the grid loop,
    the unit tile's reduction loop where its window over every step would spill, or the L1
    tile's innermost spatial loop where the L1 tiles do not overlap: per tile, the part of the
    padded tensor that tile reads, on the core that reads it (in parallel, and in that core's
    caches), rather than one pass over the whole tensor on one core before the loop nest
    (evidence: docs/evidence.md#cpu-pad-per-tile, #pad-level)."""
    if at is None:
        return
    for name in staged:
        common.primitive(f"pad {name} per tile", sch.compute_at, sch.get_sblock(name), at, True)


def _pad_loop(expr: TensorExpr, levels: list, grid, level: int):
    """The loop the padding copies are computed under (`CpuPlan.pad_level`): the grid's (per unit
    tile), the first of the unit tile's reduction loops R0 (`PAD_STEP`: per reduction step, which
    `_loop_order` puts right inside the grid), or the L1 tile's innermost spatial loop."""
    if level == 0:
        return grid
    if level == PAD_STEP:
        return levels[expr.reduce[0]][0]
    return levels[expr.spatial[-1]][level]


def _split(sch, expr: TensorExpr, program: RProgram, loops: list) -> list:
    """Every axis's loop (`loops`, in `expr.axes` order) split by its tile chain:
    `levels[axis][level]`, level 0 outermost."""
    return [
        common.split_by_chain(sch, loop, axis.extent, common.axis_chain(program, a))
        for a, (axis, loop) in enumerate(zip(expr.axes, loops))
    ]


def _schedule_lanes(expr: TensorExpr, program: RProgram, plan: CpuPlan):
    """A reduction vectorised along its reduction `axis`: the register tile's K-slice becomes
    vector lanes, each lane its own partial sum (`rfactor`: a local buffer of register-tile
    K x outputs). Where the L1 tile spans the whole reduction (`CpuPlan.direct_stores`), the
    loops go as the plain template's then (R0 .. R(n-2), one step each, inside the register
    tiles' loop) and each register tile's lanes are summed right after its K-loop: lowering
    keeps the partial sums of one register tile, the compiler keeps them in registers, and the
    sum is unrolled (`build.UNROLL_REGISTER_LOOPS`); else each grid iteration ends with the
    sum over the lanes of its outputs, from a buffer of them all. Then the epilogues. A register
    tile of r rows and K = 2 vectors keeps 2r independent vector accumulators, where the plain
    template keeps r scalar ones. (`rfactor` knows the combiners of the expression language:
    sum, product, min and max.) A ragged K (`CpuPlan.split_edges`)
    keeps the guard of its split, and lowering partitions its loops over tiles where K ends
    (`_split_edges`): the register tiles inside K run the unguarded vector loop, the one K's end
    cuts its guarded copy. The output's ragged axes (`CpuPlan.split_others`) have their loops
    over register tiles split where they end as well."""
    sch = common.new_schedule(expr, int32=plan.split_edges or plan.split_others)
    epilogues = common.epilogue_names(sch, expr)
    common.inline_producers(sch, expr)
    block = sch.get_sblock(expr.main_block)
    levels = _split(sch, expr, program, common.axis_loops(sch, block, expr))
    order = _loop_order(expr, levels, None, plan.direct_stores)
    sch.reorder(*order)
    grid = _parallelise(sch, [levels[a][0] for a in expr.spatial])
    # the lanes as the partial sums' last dimension: one vector per output, contiguous
    shape = tuple(sch.get(block).writes[0].source.shape)
    factor_dim = len(shape)
    partial = common.primitive("split the lanes off", sch.rfactor, levels[plan.vector_axis][-1], factor_dim)
    common.primitive("accumulate lanes locally", sch.set_scope, partial, 0, "local")
    # the lane-sum iterates the fused index already; laid out along it, the partial sums of one
    # tile are an interval, so the lane-sum attached under the tile reads only that tile's
    common.flatten_fused_output(sch, partial, None, expr, trailing=1)
    # the loop handles now name the lane-sum's loops; the partial sums own the tiled nest
    loops = sch.get_loops(partial)
    # counted from the innermost loop: fusing the grid shortened the nest at its outer end
    at = lambda loop: loops[len(loops) - len(order) + order.index(loop)]  # noqa: E731
    # a ragged K (`CpuPlan.split_edges`) guards the partial sums across all of K's loops, and
    # TVM takes a block so guarded for a reduction only while its lane is one loop: the
    # register tile's K then stays one vector loop (LLVM splits it into registers), and
    # lowering splits K's loops over tiles where K ends
    width = int(sch.get(loops[-1]).extent) if plan.split_edges else plan.lanes
    _micro_kernel(sch, loops[-len(levels):], loops[-1], width, _reduce_positions(expr, levels, order))
    if plan.direct_stores:  # the whole reduction in the L1 tile: after each register tile's K-loop
        common.primitive("sum the lanes per register tile", sch.reverse_compute_at, block,
                         at(_register_tiles_loop(expr, levels)), True)
    elif grid is not None:
        common.primitive("sum the lanes per tile", sch.reverse_compute_at, block, loops[0], True)
    # before the row passes: attached after the guarded partial sums, they make TVM find its
    # bindings no longer affine
    common.primitive("decompose_reduction", sch.decompose_reduction, partial, at(levels[expr.reduce[0]][0]))
    if plan.split_edges:
        _split_edges(sch, [at(loop) for loop in levels[plan.vector_axis][:-1]])
    if plan.split_others:  # the output's ragged axes, as the row path's (`_schedule`)
        cut = cut_register_axes(expr, program, plan.vector_axis)
        _split_edges(sch, [at(loop) for a in cut for loop in levels[a][1:-1]])
    _row_passes(sch, expr, program, epilogues, loops[0] if grid is not None else None, shape, plan.lanes)
    return sch


def _schedule_filters(expr: TensorExpr, program: RProgram, plan: CpuPlan):
    """A convolution vectorised along its filter `axis` (the oneDNN direct-convolution idea):
    every input that reads the axis (the filters) is packed into panels with the axis innermost
    in register-tile strips (`_pack_panels`: kernel[f, c, r, s] becomes
    [f // 16, c, r, s, f % 16]), the other inputs (the data) are broadcast one element at a
    time, so a stride-2 window costs nothing extra, and the accumulator of one unit tile keeps
    the filter axis innermost ([n, y, x, f]), transposed back to the output's layout once per
    grid iteration in the write-back (O(output) beside O(output x C x KH x KW) compute), a
    block of filters at a time (`_transpose_in_blocks`). Ragged output rows and columns have
    their loops over register tiles split where the axis ends (`CpuPlan.split_edges`,
    `_split_edges`): the interior tiles run without TVM's guard, the edge tiles keep it.

    The reduction keeps its order (c, r, s) (evidence: docs/evidence.md#cpu-filters)."""
    from tvm.tirx import IndexMap

    sch = common.new_schedule(expr)
    epilogues = common.epilogue_names(sch, expr)
    staged = _stage_producers(sch, expr, plan)
    block = sch.get_sblock(expr.main_block)
    axis = plan.vector_axis
    if plan.padded_filters:
        _pad_filters(sch, expr, block, axis, int(program.unit_tile[axis]))
    levels = _split(sch, expr, program, common.axis_loops(sch, block, expr))
    order = _loop_order(expr, levels, axis)
    sch.reorder(*order)
    grid = _parallelise(sch, [levels[a][0] for a in expr.spatial])
    _pad_per_tile(sch, staged, _pad_loop(expr, levels, grid, plan.pad_level))
    _micro_kernel(sch, order[-len(levels):], levels[axis][-1], plan.lanes, _reduce_positions(expr, levels, order))
    if plan.split_edges:  # the ragged pixel axes: interior register tiles run without the guard
        _split_edges(sch, [loop for a in expr.spatial if a != axis and ragged(expr, program, a) for loop in levels[a][1:-1]])
    if plan.padded_filters:  # the padded output is the accumulator buffer, its copy out the write-back
        common.primitive("accumulate locally", sch.set_scope, block, 0, "local")
    else:
        common.primitive("cache_write", sch.cache_write, block, 0, "local")
    common.inline_epilogues(sch, epilogues)
    dim = next(d for d, (coeffs, _) in enumerate(expr.output.index) if coeffs[axis])
    ndim = len(expr.output.index)

    def filters_last(*index):
        return tuple(index[d] for d in range(ndim) if d != dim) + (index[dim],)

    index_map = IndexMap.from_func(filters_last, ndim=ndim, index_dtype=_index_dtype(sch, block))
    common.primitive("lay out the accumulator filters last", sch.transform_layout, block, ("write", 0), index_map)
    writeback = sch.get_consumers(block)[0]
    if grid is not None:
        common.primitive("reverse_compute_at", sch.reverse_compute_at, writeback, grid, True)
    _transpose_in_blocks(sch, writeback, dim, ndim, plan.lanes)
    common.primitive("decompose_reduction", sch.decompose_reduction, block, levels[expr.reduce[0]][0])
    _pack_panels(sch, expr, program, plan, block, levels)
    return sch


def _pad_filters(sch, expr: TensorExpr, block, axis: int, unit: int) -> None:
    """Pad the filter axis `axis` of the main `block` with zero filters up to whole unit tiles
    of `unit` (`CpuPlan.padded_filters`; oneDNN pads its output-channel blocks the same way):
    `pad_einsum` copies the filters into a zero-padded buffer (`_pack_panels` makes that copy
    the filter panel) and accumulates into a padded output copied back, the real filters only
    (the write-back). `pad_einsum` takes only plain accesses (every index one iterator), so a
    windowed read (the data's `y*stride + r`) is first re-indexed by the block's iterators
    (`reindex`: a copy of the windows) and that copy inlined back once the block is padded
    (evidence: docs/evidence.md#cpu-padded-filters)."""
    from tvm.tirx import IntImm, Var

    def plain(region) -> bool:
        return all(isinstance(r.min, (Var, IntImm)) for r in region.region)

    windows = []
    for name in [str(r.source.name) for r in sch.get(block).reads if not plain(r)]:
        reads = [str(r.source.name) for r in sch.get(block).reads]
        copy = common.primitive(f"re-index {name}'s windows", sch.reindex, block, ("read", reads.index(name)))
        windows.append(sch.get(copy).name_hint)
    names = [str(iv.var.name).removeprefix("v_") for iv in sch.get(block).iter_vars]
    factors = [unit if n == expr.axes[axis].name else 1 for n in names]
    common.primitive("pad the filters to whole tiles", sch.pad_einsum, block, factors)
    for name in windows:
        common.primitive(f"inline {name}", sch.compute_inline, sch.get_sblock(name))


# Widths of the output row's pieces the filters-last write-back stores as vectors
# (`_transpose_in_blocks`), the first that divides the row: 4 or 2 pixels a store, each gathered
# from the block's filters by inserts (evidence: docs/evidence.md#cpu-transpose-in-blocks).
TRANSPOSE_WIDTHS = (4, 2)


def _transpose_in_blocks(sch, writeback, dim: int, ndim: int, lanes: int) -> None:
    """Write a filters-last accumulator buffer back to an output whose filter dimension `dim`
    is not its last in blocks of `lanes` filters: the loops go (other dims, filters // lanes,
    filters % lanes, last dim), so one block reads a row of the buffer's lines and writes
    `lanes` rows of the output, both in L1. The write-back's default order (filters outside
    the pixels) reads the buffer a float per line, a line per pixel, once per filter: 16 times
    the buffer's lines from L2 for a buffer L1 does not hold. Where the row is a whole number of
    `TRANSPOSE_WIDTHS` pieces, each filter's row is stored a piece a vector, rather than a store
    per element. A filter's row is written whole before the next filter's: the output's filter
    planes lie a plane apart, and where that stride is a multiple of the L1's way (224 x 224
    pixels, 49 pages), the block's rows fall in one set; written piece by piece across the
    block's filters, each line left before it was whole was evicted and fetched again (VGG-16's
    conv1_1 2x slower). (Evidence: docs/evidence.md#cpu-transpose-in-blocks.)"""
    from tvm.tirx import IntImm

    if dim == ndim - 1:
        return
    loops = sch.get_loops(writeback)[-ndim:]
    outer, inner = common.primitive("split the write-back's filters", sch.split, loops[dim], [None, lanes])
    rest = [l for d, l in enumerate(loops) if d != dim]
    common.primitive("reorder the write-back", sch.reorder, *rest[:-1], outer, inner, rest[-1])
    extent = sch.get(rest[-1]).extent
    row = extent.value if isinstance(extent, IntImm) else 0
    width = next((w for w in TRANSPOSE_WIDTHS if row > w and row % w == 0), None)
    if width is not None:
        _, piece = common.primitive("split the write-back's row", sch.split, rest[-1], [None, width])
        common.primitive("vectorise the write-back's row", sch.vectorize, piece)


def _loop_order(expr: TensorExpr, levels: list, vector_axis: int | None, whole: bool = False) -> list:
    """`S0 R0 .. S(n-2) R(n-2) | S(n-1) | R(n-1) | register tile`, n = number of layers; with
    `whole` (`CpuPlan.direct_stores`: R0 .. R(n-2) run once) those come right before R(n-1), inside
    the register tiles' loop, so that a register tile's whole reduction lies under it.

    Register tile: with a vectorised axis `R(n) S(n)`, that axis last (every register K-step
    updates a row of vector accumulators) and the axes only the streamed inputs read right
    outside it (`_streamed_only`); without one `S(n) R(n)`, so each scalar accumulator
    stays in a register over the register K-steps and the K-contiguous inputs are read in order
    (3x faster on gemv than the other order).
    """
    n = len(levels[0]) - 1
    spatial = [levels[a] for a in expr.spatial]
    reduce = [levels[a] for a in expr.reduce]
    if whole:
        order = [lv[m] for m in range(n) for lv in spatial] + [lv[m] for m in range(n) for lv in reduce]
    else:
        order = [lv[m] for m in range(n - 1) for group in (spatial, reduce) for lv in group]
        order += [lv[n - 1] for lv in spatial] + [lv[n - 1] for lv in reduce]
    if vector_axis is None:
        return order + [lv[n] for lv in spatial] + [lv[n] for lv in reduce]
    others = sorted((a for a in expr.spatial if a != vector_axis), key=lambda a: _streamed_only(expr, vector_axis, a))
    return order + [lv[n] for lv in reduce] + [levels[a][n] for a in others] + [levels[vector_axis][n]]


def _register_tiles_loop(expr: TensorExpr, levels: list):
    """The innermost loop over register tiles in `_loop_order`'s order with direct stores (the
    last S(n-1)): a register tile's whole reduction lies under it."""
    return levels[expr.spatial[-1]][len(levels[0]) - 2]


def _streamed_only(expr: TensorExpr, vector_axis: int, axis: int) -> bool:
    """Whether only the inputs that stream the vector row read `axis` (a pixel GEMM's images: the
    weight ignores them). Such axes go innermost among the register tile's loops, right outside
    the vector: each broadcast of the other input then feeds its FMAs at once and dies, where
    with the images outside it every broadcast stayed live across them (2 images x 6 filters x
    8 pixels: 12 accumulators, 6 broadcasts and a row of B need 19 of the 16 ymm registers; LLVM
    spilled three of them on every reduction step, which ran 2x slower than 1 x 6 x 16)."""
    streamed = [t for t in expr.inputs if t.uses_axis(vector_axis)]
    return bool(streamed) and all(t.uses_axis(axis) for t in streamed) and not any(
        t.uses_axis(axis) for t in expr.inputs if not t.uses_axis(vector_axis))


def _parallelise(sch, outer: list):
    """Fuse the outermost spatial loops (the grid of L2 tiles) and run them on all cores."""
    if not outer:
        return None
    grid = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(grid)
    return grid


def _store_registers(sch, writeback, tile_loop, lanes: int, stack: bool) -> None:
    """Make the write-back of one register tile (under `tile_loop`) vector stores of whole
    registers, its other loops unrolled, so that the tile's accumulator buffer has constant
    indices only and LLVM keeps it in registers.

    Where the output's end cuts a tile along its vectors, the guard varies across the lanes and
    TVM's vectoriser stores that tile lane by lane, in a loop indexing the accumulators, which
    LLVM then kept in memory through the tile's whole K-loop unless it unrolled that loop itself
    (docs/evidence.md#lane-stores). TVM's UnrollLoop, after the vectoriser, unrolls it: for
    `local` accumulators under `build.pass_config`; for accumulators on the stack
    (`CpuPlan.stack_accumulators`), which that config does not see, under the write-back's
    `pragma_auto_unroll_max_step`, every loop of at most `lanes` stores, which by then is that
    lane loop alone."""
    loops = sch.get_loops(writeback)
    own = loops[next(k for k, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(tile_loop))) + 1:]
    if not own:
        return
    extent = int(sch.get(own[-1]).extent)
    width = vector_width(extent, lanes)
    if width >= 4 and extent % width == 0:
        outer, inner = sch.split(own[-1], [extent // width, width])
        sch.vectorize(inner)
        own = [*own[:-1], outer]
    if stack:  # after the split, which an annotated loop refuses (a row tile's one loop)
        sch.annotate(own[0], "pragma_auto_unroll_max_step", lanes)
    for loop in own:
        if int(sch.get(loop).extent) > 1:
            sch.unroll(loop)


def _row_passes(sch, expr: TensorExpr, program: RProgram, names, grid, shape, lanes: int) -> None:
    """The blocks after the main block that are passes over its rows of their own (softmax's
    exp, sum and division, layer norm's variance and normalisation: `common.row_passes`),
    computed per grid tile on the core that computed the tile's rows, each vectorised along its
    innermost loop as `panels.row_vector` says (`_vectorise_pass`, `_vectorise_reduction`); a
    block with one consumer (softmax's `x - max`) is inlined into it first. `shape`: the main
    block's output, unfused.

    The passes index the output dimension by dimension: attached under a tile they span the
    enclosing box, which on a tile that is no box holds elements a parallel tile is still
    summing (mlp_dynamic's layer norm at batch 3, seq 7 on 12-row tiles of 21 was wrong).
    There they stay after the grid, one pass over the whole output. A reduction over a ragged
    row cannot be vectorised under a tile (`_vectorise_reduction`): from it on, the passes run
    after the grid, each on all cores over its rows."""
    if not names:
        return
    names = [n for n in names if not _inline_single_use(sch, n)]
    attach = grid is not None and common.fused_tiles_are_boxes(expr, program, shape)
    elementwise, detached = [], False
    for name in names:
        block = sch.get_sblock(name)
        reduction = is_reduction(sch.get(block))
        if reduction and attach and _ragged(sch, block, lanes):
            attach, detached = False, True
        # not the passes after the grid for want of a box: launched on all cores, the decoder
        # block's three softmax passes over 3 x 48 rows of 48 took 17 us instead of 9 (one thread)
        if detached:
            _rows_on_all_cores(sch, block)
        if reduction:
            _vectorise_reduction(sch, block, grid if attach else None, lanes)
            continue
        if attach:
            common.primitive(f"compute {name} per tile", sch.reverse_compute_at, block, grid, True)
        elementwise.append(name)
    # once every pass is attached: a ragged row's tail partitioned off wraps its pass in opaque
    # blocks, whose region is the whole buffer, and the next pass attached after it would then
    # compute every row under every tile
    for name in elementwise:
        _vectorise_pass(sch, sch.get_sblock(name), lanes)


def _rows_on_all_cores(sch, block) -> None:
    """Fuse the loops over the rows of a pass left after the grid (`block`'s spatial loops but
    its innermost, its own nest still) and run them on all cores."""
    loops = sch.get_loops(block)
    spatial = sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)
    rows = loops[:min(spatial, len(loops) - 1)]
    if not rows:
        return
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    if int(sch.get(row).extent) > 1:
        common.primitive("run a row pass on all cores", sch.parallel, row)


def _ragged(sch, block, lanes: int) -> bool:
    """Whether the reduction `block` is one `_vectorise_reduction` vectorises with a ragged tail."""
    width, extent = _reduction_row(sch, block, lanes)
    return width > 1 and extent % width != 0


def _reduction_row(sch, block, lanes: int) -> tuple[int, int]:
    """(vector width, row length) of the reduction `block`'s innermost loop as
    `_vectorise_reduction` sums it: `row_vector`'s width for a static row read along memory
    (`reads_along_rows`), else 1 (scalar; the length then 0 where it is symbolic)."""
    extent = sch.get(sch.get_loops(block)[-1]).extent
    if not hasattr(extent, "value"):
        return 1, 0
    if not reads_along_rows(sch.get(block)):
        return 1, int(extent.value)
    return row_vector(int(extent.value), lanes, reduction=True).width, int(extent.value)


def _inline_single_use(sch, name: str) -> bool:
    """Inline the elementwise block `name` into its one consumer; False when it has several
    consumers (softmax's exp, read by the sum and the division, is computed once) or writes an
    output."""
    block = sch.get_sblock(name)
    if is_reduction(sch.get(block)) or len(sch.get_consumers(block)) != 1:
        return False
    try:
        sch.compute_inline(block)
    except Exception:  # an output block, or an index TVM cannot substitute: keep the pass
        return False
    return True


def _vectorise_pass(sch, block, lanes: int) -> None:
    """Vectorise an elementwise pass along its innermost loop as `panels.row_vector` says: a
    ragged row's whole vectors first, its last `extent % width` elements after them in a
    scalar loop of their own (`loop_partition`: a guard inside the vector loop would scalarise
    all of it)."""
    inner = sch.get_loops(block)[-1]
    extent = sch.get(inner).extent
    if not hasattr(extent, "value"):
        return
    row = row_vector(int(extent.value), lanes)
    if row.width == 1:
        return
    body = int(extent.value) - int(extent.value) % row.width
    if body < int(extent.value):
        inner, _ = common.primitive("split a row's tail off", sch.loop_partition, inner, [body, None])
    _, vector = sch.split(inner, [None, row.width])
    common.primitive("vectorise a row pass", sch.vectorize, vector)


def _vectorise_reduction(sch, block, grid, lanes: int) -> None:
    """Compute the row pass `block`, a reduction over its innermost loop (softmax's sum, layer
    norm's variance), under `grid` (None: where it is), vectorised where `row_vector` says so:
    the loop split into vectors of `width` lanes, each lane its own partial result (`rfactor`:
    a local buffer of `width` per row, one register), then one short scalar reduction across
    the lanes per row.

    `rfactor` refuses a block attached under the grid (not the first block under its outermost
    loop), so the partials are split off first and attached after; TVM then derives their
    loops from the region of the row they read, which it does exactly only when the vectors
    cover the row (12 elements in vectors of 8 became 2 x 4 lanes, the guard dropped, summing 8
    of 12). A ragged row is therefore vectorised only where it stays (`grid` None, as
    `_row_passes` leaves it): its whole vectors, then the last one in a loop of its own
    (`loop_partition` of the lanes' update, after their initialisation is split off, which it
    would otherwise copy into the tail), its lanes guarded one by one. A row strided in memory
    (`reads_along_rows`: softmax over axis 1) keeps its scalar loop."""
    loops = sch.get_loops(block)
    width, extent = _reduction_row(sch, block, lanes)
    if width == 1:
        if grid is not None:
            common.primitive("compute a row sum per tile", sch.reverse_compute_at, block, grid, True)
        return
    tail = extent % width
    if tail and grid is not None:
        raise ScheduleError("a ragged row's lanes cannot be computed per tile")
    _, vector = sch.split(loops[-1], [None, width])
    ndim = len(sch.get(block).writes[0].source.shape)
    partial = common.primitive("split a row's lanes off", sch.rfactor, vector, ndim)
    common.primitive("keep a row's lanes local", sch.set_scope, partial, 0, "local")
    if grid is not None:
        common.primitive("compute a row's lanes per tile", sch.reverse_compute_at, partial, grid, True)
        # the loops follow the partials' iterators: the lane first, the rows, the vectors
        lane, *rows = sch.get_loops(partial)[1:]
        sch.reorder(*rows, lane)
    *_, row, steps, lane = sch.get_loops(partial)
    if int(sch.get(lane).extent) != width:
        raise ScheduleError(f"the lanes of a row's partial results are {sch.get(lane).extent}, not {width}")
    common.primitive("vectorise a row's lanes", sch.vectorize, lane)
    common.primitive("sum a row's lanes", sch.reverse_compute_at, block, row, True)
    common.primitive("decompose a row's lanes", sch.decompose_reduction, partial, steps)
    if tail:  # whole vectors, then the last one, guarded lane by lane, in a loop of its own
        common.primitive("split a row's tail off", sch.loop_partition, steps, [extent // width, None])


def _accumulate(sch, expr: TensorExpr, block, at_loop, epilogues, levels, padded: bool, scope: str) -> None:
    """Accumulate in a buffer of one unit (L2) output tile, of storage `scope` (`global` for
    `CpuPlan.stack_accumulators`, else `local`), written back once at `at_loop` (the grid loop),
    fold epilogues into the write-back, and split off the initialisation. After `_pad_tails`
    padded the output (`padded`) the padded output is that buffer already (compacted to one tile
    per grid iteration when lowered) and its copy into the output, epilogues folded in, is the
    write-back. Where `at_loop` is the loop over register tiles instead (`CpuPlan.direct_stores`),
    the buffer is one register tile's, initialised under it."""
    if padded:
        common.primitive("accumulate locally", sch.set_scope, block, 0, scope)
    else:
        common.primitive("cache_write", sch.cache_write, block, 0, scope)
    common.inline_epilogues(sch, epilogues)
    if at_loop is not None:
        writeback = sch.get_consumers(block)[0]
        if not padded:
            common.flatten_fused_output(sch, block, writeback, expr)
        common.primitive("reverse_compute_at", sch.reverse_compute_at, writeback, at_loop, True)
    first_reduce = levels[expr.reduce[0]][0]
    common.primitive("decompose_reduction", sch.decompose_reduction, block, first_reduce)


def _reduce_positions(expr: TensorExpr, levels: list, order: list) -> frozenset[int]:
    """Positions, among the register-tile loops at the end of `order`, of the reduction axes'."""
    register = order[-len(levels):]
    reduce_loops = [levels[a][-1] for a in expr.reduce]
    return frozenset(k for k, loop in enumerate(register) if any(loop is r for r in reduce_loops))


def _micro_kernel(sch, register: list, vector_loop, lanes: int, reduce_positions: frozenset[int] = frozenset(),
                  max_chain: int = MAX_CHAIN, edge_vectors: bool = False) -> None:
    """Vectorise `vector_loop` (if any) and unroll the other register-tile loops, innermost
    first, while the unrolled body stays within MAX_UNROLL iterations and the unrolled
    reduction loops (those at `reduce_positions` of `register`) within `max_chain`.

    A vector loop longer than a register is split into an unrolled loop over vectors of
    `panels.vector_width` lanes around one vectorised vector, so that each vector's panel index is a
    plain ramp: vectorised whole, a row over a panel of strips reads its operand through
    `j // r, j % r` per lane, which TVM lowers to gathers (evidence: docs/evidence.md#cpu-micro-kernel).
    With `edge_vectors` (`CpuPlan.edge_vectors`) that loop over vectors stays a loop, marked for
    loop partitioning where the row ends, until `_edge_tile_apart` unrolls it again in every tile
    but the edge's: there the edge tile's whole vectors run vectorised, and partitioning takes
    the constant extent an unrolled loop needs."""
    if vector_loop is not None:
        extent = int(sch.get(vector_loop).extent)
        width = vector_width(extent, lanes)
        if width < extent:
            at = next(k for k, loop in enumerate(register) if loop is vector_loop)
            registers, vector_loop = sch.split(vector_loop, [extent // width, width])
            register = [*register[:at], registers, *register[at + 1:], vector_loop]
            reduce_positions = reduce_positions - {at}
            if edge_vectors:
                sch.annotate(registers, "pragma_loop_partition_hint", 1)
                register = [loop for loop in register if loop is not registers]
        sch.vectorize(vector_loop)
    unrolled = chain = 1
    for k in reversed(range(len(register))):
        loop = register[k]
        if loop is vector_loop:
            continue
        extent = int(sch.get(loop).extent)
        is_reduce = k in reduce_positions
        if unrolled * extent > MAX_UNROLL or (is_reduce and chain * extent > max_chain):
            break
        if extent > 1:
            unrolled *= extent
            chain *= extent if is_reduce else 1
            sch.unroll(loop)


def _pad_tails(sch, expr: TensorExpr, program: RProgram, edges: tuple[int, ...] = ()) -> bool:
    """Pad every axis up to whole unit tiles (`pad_einsum`: inputs read as zero past their end,
    the padded output copied back), where the plan says so (`CpuPlan.padded_tails`), so the
    micro-kernel runs without a guard on every tile (a 6-row register tile on 512 rows has a
    tail in every column of tiles otherwise, and a guarded accumulator row stays in memory, not
    a register; a ragged K, 999 in K-steps of 336, guards every FMA). The plan pads a ragged
    reduction only where its zero terms add nothing (`TensorExpr.pads_reduction`). Only the
    packs read the ragged edge, under their own guard; the micro-kernel runs over whole panels.
    The `edges` (`CpuPlan.edge_axes`: those an input read in place reads) are not padded: their
    edge tiles split off instead (`_split_edges`). Returns whether the output was padded too (a
    padded spatial axis ragged; a ragged K alone pads only the inputs)."""
    padded = [a for a in range(len(expr.axes)) if a not in edges and ragged(expr, program, a)]
    if not padded:
        return False
    factors = [int(extent) if a in padded else 1 for a, extent in enumerate(program.unit_tile)]
    common.primitive("pad to whole tiles", sch.pad_einsum, sch.get_sblock(expr.main_block), factors)
    return any(a in padded for a in expr.spatial)


def _partition_edges(sch, block, at) -> None:
    """Mark the loops of `block` under `at` (a padding copy into a panel, or the padded
    output's copy back) for TVM's loop partitioning (`pragma_loop_partition_hint`), so that
    lowering splits each at its guard's bound: the interior runs unguarded and stays vectorised,
    and only the tile's ragged edge tests each element (unrolled loops, a register tile's
    stores, keep their guard). Left guarded, the test on the
    contiguous axis varies across a vector's lanes, and TVM scalarises the whole copy
    (evidence: docs/evidence.md#cpu-partition-edges)."""
    from tvm.tirx import ForKind

    loops = sch.get_loops(block)
    start = next(k for k, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(at))) + 1
    for loop in loops[start:]:
        # an unrolled loop needs its constant extent, which partitioning takes away
        if sch.get(loop).kind == ForKind.SERIAL:
            sch.annotate(loop, "pragma_loop_partition_hint", 1)


def _pack_level(program: RProgram, plan: CpuPlan) -> int:
    """Loop level whose reduction loop `_pack_panels` packs under: that of the plan's
    `pack_layer` (level 0 iterates L2 tiles, so packing under its K-step copies one L2 tile's
    K-slice; the L1 tiles inside are contiguous runs of those panels)."""
    return len(program.tiles) - 1 - plan.pack_layer


def _pack_panels(sch, expr: TensorExpr, program: RProgram, plan: CpuPlan, block, levels, at=None) -> None:
    """Copy each input's tile into a contiguous buffer once per K-step of the cached layer (the
    BLIS/oneDNN panel idea), laid out so the micro-kernel streams it.

    The copy sits under that layer's innermost reduction loop (`_pack_level`), so its buffer
    holds exactly one tile's slice and, allocated inside the parallel grid loop, belongs to
    one core. An input read along the vector axis is laid out in register-tile strips
    (`_panel_layout`): matmul's B becomes 16-column strips whose K-steps follow each other, so
    the micro-kernel's two vector loads per K-step advance linearly through one strip. (evidence:
    docs/evidence.md#cpu-pack-panels).
    """
    at = at if at is not None else levels[expr.reduce[-1]][_pack_level(program, plan)]
    by_name = {t.name: t for t in expr.inputs}
    vector_axis = plan.vector_axis
    for name in plan.packed:
        tensor = by_name[name]
        reads = [str(r.source.name) for r in sch.get(block).reads]
        if name in plan.prepacked:  # the caller passes it laid out (`prepack_function`)
            index_map = _panel_map(expr, program, tensor, vector_axis, _index_dtype(sch, block), ahead=True)
            common.primitive(f"take {name} laid out in panels", sch.transform_layout, block, ("read", reads.index(name)),
                             index_map)
            continue
        # the main block reads a gathered image's copy (`ops.pixel_gemm`), made before the loop nest
        source = name if name in reads or f"{name}_pad" in reads else gathered_name(name)
        padding = f"{source}_pad" in reads
        if padding:  # `_pad_tails` made a padding copy: it becomes the pack
            pack = next(p for p in sch.get_producers(block) if str(sch.get(p).writes[0].source.name) == f"{source}_pad")
        else:
            pack = common.primitive(f"pack {name}", sch.cache_read, block, reads.index(source), "global")
        common.primitive(f"pack {name} per tile", sch.compute_at, pack, at, True)
        if name in plan.transposed_in_panels:
            common.primitive(f"copy {name} as stored into its panels", sch.compute_inline, sch.get_producers(pack)[0])
        index_map = _panel_map(expr, program, tensor, vector_axis, _index_dtype(sch, pack))
        if index_map is not None:
            common.primitive(f"lay out {name} in panels", sch.transform_layout, pack, ("write", 0), index_map)
        if name in plan.transposed_in_panels:
            _copy_rows_down_strips(sch, pack, row_block_width(int(program.register_tile[vector_axis]), plan.lanes))
            continue
        if index_map is not None and transposes(tensor, vector_axis):
            _copy_along_panel(sch, pack, at, tensor, vector_axis, int(program.register_tile[vector_axis]), plan.lanes)
        _vectorise_copy(sch, pack, expr, program, tensor, vector_axis, index_map is not None, plan.lanes,
                        guarded=padding and vector_axis is not None and ragged(expr, program, vector_axis))
        if index_map is None:
            _stagger_rows(sch, pack, prod(int(program.register_tile[a]) for a in expr.spatial if tensor.uses_axis(a)))
        else:
            _stagger_strips(sch, pack, _strip_dim(expr, tensor, program, vector_axis))
        if padding:
            _partition_edges(sch, pack, at)


def _copy_along_panel(sch, pack, at, tensor, vector_axis: int, width: int, lanes: int) -> None:
    """Order a transposing panel copy (a conv's filters, kernel[f, c, r, s] into strips of
    `width` filters, [f // w, c, r, s, f % w]) strip by strip, the strip's filters innermost, so
    that it writes each panel row whole: in the source's order every filter's pass wrote one
    element of every row of the panel, which, larger than the L1d, was fetched again for each
    filter (two Zen 5 cores, 2026-12-01, the same program both ways in one process: 413 channels
    to 8 3x3 filters at stride 2, a 238 KiB panel, 330 -> 121 us; cpu-core's conv-3x3-s2 296 ->
    270 us; 256 channels to 256 3x3 filters over 14 x 14 661 -> 579; evidence:
    docs/evidence.md#cpu-copy-along-panel). It then reads `width` rows of the source at once, one
    element each: where those rows fall into fewer L1d sets than that takes ways (512 channels of
    3x3 filters, rows 18 KiB apart: two sets for 32 rows; 702 -> 817 us), the copy keeps the
    source's order.

    The strip's filters are then written in vectors of `panels.vector_width` lanes, unrolled: TVM
    gathers each vector's lanes with scalar loads at constant offsets from one address and stores
    it whole. Left a loop, LLVM vectorised it itself, computing the 16 lanes' addresses in vector
    registers and extracting each to load it (313 channels to 424 7x7 filters over 16 x 16, 26 MB
    of filters copied per call: ranks 1, 2, 4 and 5 1.5-1.8x faster, rank 3, a row of taps a
    step, 0.69x; elsewhere 0.97-1.14x; evidence: docs/evidence.md#cpu-filter-vectors)."""
    dim = next(d for d, (coeffs, _) in enumerate(tensor.index) if coeffs[vector_axis])
    source = sch.get(pack).reads[0].source
    stride = prod(int(n) for n in source.shape[dim + 1:]) * (source.dtype.bits // 8)
    if _crowds_a_set(width, stride):
        return
    loops = sch.get_loops(pack)
    start = next(k for k, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(at))) + 1
    own = loops[start:]
    extent = int(sch.get(own[dim]).extent)
    if len(own) < 2 or extent % width:
        return
    strips, inner = sch.split(own[dim], [extent // width, width])
    sch.reorder(*own[:dim], strips, *own[dim + 1:], inner)
    vector = vector_width(width, lanes)
    if vector > 1:
        vectors, lane = sch.split(inner, [width // vector, vector])
        sch.unroll(vectors)
        common.primitive("vectorise the filters' copy", sch.vectorize, lane)


def prepack_function(expr: TensorExpr, program: RProgram, plan: CpuPlan, name: str):
    """The PrimFunc that lays input `name` out in its panels (`CpuPlan.prepacked`), the layout
    `_pack_panels` has the kernel read it in: a copy of the argument (the caller's shape, of
    which the expression's tensor may be a view: a pointwise conv's [F, C] filters of
    [F, C, 1, 1]) into that layout, run by the caller once, before the kernel's first call."""
    from tvm import s_tir, te

    tensor = next(t for t in expr.inputs if t.name == name)
    arg = next(a for a in expr.input_args if a.name == name)
    source = te.placeholder(arg.shape, tensor.dtype, name=name)

    def element(*index):  # the view's element `index` in the argument, both row-major
        flat = sum(i * stride for i, stride in zip(index, tensor.strides))
        return source[tuple(flat // prod(arg.shape[d + 1:]) % n for d, n in enumerate(arg.shape))]

    panels = te.compute(tensor.shape, element, name=f"{name}_panels")
    sch = s_tir.Schedule(te.create_prim_func([source, panels]))
    sch.transform_layout(sch.get_sblock(f"{name}_panels"), ("write", 0),
                         _panel_map(expr, program, tensor, plan.vector_axis, "int32", ahead=True))
    return sch.mod["main"]


def _copy_rows_down_strips(sch, pack, width: int) -> None:
    """Order the panel copy of a transposed operand read as stored
    (`CpuPlan.transposed_in_panels`: B[j, k] into strips [j // r, k, j % r]) by the operand's
    rows: each row read in one contiguous run and written down its strip, a line per K-step,
    the lines in order. In the panel's order each vector of a strip's row gathered its lanes
    from r rows K elements apart, which share an L1d set where K x 4 bytes is a multiple of 4
    KiB (2 x 4096 x 4096: 66 ms so, 4.6 by rows; 8 x 1024 x 1000: 1.58 ms, 0.38-0.43; evidence:
    docs/model-evidence.md#transposed-in-panels).

    Where the strip's rows are written in vectors of `width` lanes, a power of two from 4
    (`panels.row_block_width`; 0: a row at a time), the copy goes in blocks of `width` rows by
    `width` K-steps staged in registers: each row's piece read as one vector, the strip's rows
    then written a vector per K-step, gathered from the staged block. Row by row, every element
    was its own scalar load and store (27 x 123 x 1367: the copy about 45 of the kernel's 95 us;
    staged, the kernel runs 61-71). A block cut by K's end or by the padding past N's end tests
    each lane, and TVM then runs the whole copy scalar, so the blocks' loops are partitioned
    where those bounds fall (6 x 5 x 64 x 6895: 620 us unpartitioned, 451 partitioned, 534 row
    by row; evidence: docs/evidence.md#transposed-blocks)."""
    *_, k, j = sch.get_loops(pack)
    common.primitive("copy the operand's rows down the strips", sch.reorder, j, k)
    if not width:
        return
    rows, row = sch.split(j, [None, width])
    steps, step = sch.split(k, [None, width])
    sch.reorder(rows, steps, row, step)
    for loop in (rows, steps):
        sch.annotate(loop, "pragma_loop_partition_hint", 1)
    staged = common.primitive("stage a block of the operand's rows in registers", sch.cache_read, pack, 0, "local")
    sch.compute_at(staged, steps, True)
    *_, staged_row, staged_step = sch.get_loops(staged)
    sch.unroll(staged_row)
    sch.vectorize(staged_step)
    sch.reorder(step, row)
    sch.unroll(step)
    common.primitive("write the strip's rows in vectors", sch.vectorize, row)


def _vectorise_copy(sch, pack, expr: TensorExpr, program: RProgram, tensor, vector_axis: int, laid_out: bool,
                    lanes: int, guarded: bool = False) -> None:
    """Vectorise a panel copy along the tensor's contiguous dimension, where the panel keeps it
    contiguous: a row-major copy (A) in vectors of `panels.vector_width` lanes, a strip layout (B's
    [j // r, k, j % r]) in vectors within one strip's row of r. A copy that transposes (a filter
    panel, which moves the filters innermost) is left to `_copy_along_panel`, which writes it in
    vectors of filters where it reorders it. Left to LLVM, the copies run scalar (evidence:
    docs/evidence.md#cpu-vectorise-copy).

    A padding copy whose guard tests the vector axis (`guarded`: that axis ragged), along which
    it copies rows of one vector, copies them in two half vectors: lowering splits the loop over
    a row's vectors where the guard's bound falls (`_partition_edges`), and a loop of one vector
    leaves it nothing to split, so every tile's copy tested each lane and ran scalar (4 x 4537 x
    109 in one-vector strips, 7 tiles: 257 -> 94 us on the Zen 4, numpy 93; evidence:
    docs/evidence.md#cpu-copy-halves)."""
    last = next((a for a, c in enumerate(tensor.index[-1][0]) if c), None)
    if last is None or (laid_out and transposes(tensor, vector_axis)):
        return
    inner = sch.get_loops(pack)[-1]
    extent = int(sch.get(inner).extent)
    row = int(program.register_tile[vector_axis]) if laid_out else extent
    width = vector_width(min(row, extent), lanes)
    if guarded and last == vector_axis and width == extent and width >= 8:
        width //= 2
    if width < 4 or extent % width or row % width:
        return
    common.primitive("vectorise the copy", sch.vectorize, sch.split(inner, [extent // width, width])[1])


# An x86 L1d holds 4 KiB a way (its sets x 64-byte lines: a VIPT cache indexed within the page),
# so rows a multiple of 4 KiB apart share a set.
L1_WAY_BYTES = 4096
LINE_BYTES = 64
# The fewest ways an x86 L1d has (Zen 2 to 4: 8 of 32 KiB; Zen 5 and Intel since Ice Lake: 12 of
# 48 KiB): `_stagger_rows` keeps one K-step's lines of a panel within them, `_stagger_strips` one
# copied row's lines of the strips.
L1_WAYS = 8


def _crowds_a_set(count: int, stride: int) -> bool:
    """Whether `count` lines `stride` bytes apart put more of them into one L1d set than
    `L1_WAYS`: they land in L1_WAY_BYTES // gcd(stride, L1_WAY_BYTES) sets."""
    return -(-count // (L1_WAY_BYTES // gcd(stride, L1_WAY_BYTES))) > L1_WAYS


def _stagger_rows(sch, pack, rows: int) -> None:
    """Pad each row of a row-major panel (an input the micro-kernel broadcasts from, matmul's A)
    by one cache line where the register tile's `rows` rows, read one element each per K-step,
    would put more lines into one L1d set than it has ways (`L1_WAYS`), evicting each other
    every step: rows whose length is a multiple of `L1_WAY_BYTES` all fall into one set (16 rows
    of 2048 floats), rows of 512 floats into two (23 to 30 rows of a pointwise conv's 512
    channels). A line apart they spread over the sets (512 x 49 x 2048 on a Zen 4 core: 16 x 16
    register tiles 2.6 -> 1.3 ms; 2048 filters of 512 channels over 7 x 7 pixels: 30-row tiles
    1.55 -> 0.8 ms; evidence: docs/evidence.md#cpu-stagger-rows)."""
    buffer = sch.get(pack).writes[0].source
    if len(buffer.shape) < 2:
        return
    itemsize = buffer.dtype.bits // 8
    row = int(buffer.shape[-1]) * itemsize
    if row % LINE_BYTES:
        return  # rows that end mid-line start in successive sets already
    period = gcd(row, L1_WAY_BYTES)
    if period == L1_WAY_BYTES or _crowds_a_set(rows, row):
        common.primitive("stagger the panel's rows", sch.storage_align, pack, 0, len(buffer.shape) - 2,
                         period // itemsize, LINE_BYTES // itemsize)


def _strip_dim(expr: TensorExpr, tensor, program: RProgram, vector_axis: int) -> int | None:
    """The dimension of `tensor`'s strip panel (`_panel_layout`) that numbers its strips: the
    vector axis's outer part, after the other spatial axes' dimensions (matmul's B as [j // 16,
    k, j % 16]: 0); None where the tensor is not split along the vector axis."""
    axes = [next(a for a, c in enumerate(coeffs) if c) for coeffs, _ in tensor.index]
    if vector_axis not in axes or int(program.register_tile[vector_axis]) <= 1:
        return None
    return sum(1 for a in axes if a not in expr.reduce and a != vector_axis)


def _stagger_strips(sch, pack, dim: int | None) -> None:
    """Pad each strip of a strip panel (matmul's B, a pixel GEMM's image) by one cache line
    where the copy's strips, a multiple of `L1_WAY_BYTES` apart, put more lines of one source
    row into an L1d set than it has ways (`L1_WAYS`): the copy writes one row of every strip per
    source row, and without the pad the tile ran up to twice as slow (two Zen 5 cores,
    2026-12-01, the same program both ways in one process: 160 channels to 11 1x1 filters over
    167 x 167 in 32-pixel strips of 160 channels, 47 to a unit tile, 845 -> 434 us; 84 x 960 x
    1472 in 14 x 16 register tiles, B's strips of 960 K-steps copied 64 K-steps at a time, 705
    -> 538 us, 48 at a time 544 both ways; evidence: docs/evidence.md#cpu-stagger-rows). The
    micro-kernel reads one strip at a time, front to back, which the pad does not change."""
    if dim is None:
        return
    buffer = sch.get(pack).writes[0].source
    itemsize = buffer.dtype.bits // 8
    stride = prod(int(n) for n in buffer.shape[dim + 1:]) * itemsize
    if stride % LINE_BYTES:
        return  # strips that end mid-line start in successive sets already
    if _crowds_a_set(int(buffer.shape[dim]), stride):
        common.primitive("stagger the panel's strips", sch.storage_align, pack, 0, dim,
                         gcd(stride, L1_WAY_BYTES) // itemsize, LINE_BYTES // itemsize)


def _panel_layout(expr: TensorExpr, program: RProgram, tensor, vector_axis: int, ahead: bool = False):
    """The index map (a function of the tensor's indices) of `tensor`'s panel, or None to keep
    the tile's own row-major layout.

    Only an input read along the vector axis is re-laid out. Dimensions whose axis has a
    register tile r > 1 split into (x // r, x % r); the outer parts go first, spatial axes
    (the vector axis after the others) before reductions, so one register tile's strip holds
    its whole K-run; the inner parts go innermost in the micro-kernel's order (reductions,
    rows, the vector axis last): matmul's B[k, j] becomes [j // 16, k, j % 16]. The broadcast
    operand (A) keeps rows: its copy is then a plain vectorised one, while 6-row strips
    ([i // 6, k, i % 6]) need a scalar transposing copy, which is no faster
    (evidence: docs/evidence.md#cpu-panel-layout), except laid out once, `ahead` of the calls
    (`CpuPlan.prepacked`): then A gets its strips too.
    """
    if not ahead and not tensor.uses_axis(vector_axis):
        return None
    axes = [next(a for a, c in enumerate(coeffs) if c) for coeffs, _ in tensor.index]
    regs = [int(program.register_tile[a]) for a in axes]
    split = [d for d, r in enumerate(regs) if r > 1]
    reduce = set(expr.reduce)
    outer = sorted(range(len(axes)), key=lambda d: (axes[d] in reduce, axes[d] == vector_axis, d))
    inner = sorted(split, key=lambda d: (axes[d] not in reduce, axes[d] == vector_axis, d))

    def panel(*x):
        return tuple(x[d] // regs[d] if d in split else x[d] for d in outer) + tuple(x[d] % regs[d] for d in inner)

    return panel


def _panel_map(expr: TensorExpr, program: RProgram, tensor, vector_axis: int, index_dtype: str, ahead: bool = False):
    """`_panel_layout` as TVM's IndexMap over `tensor`'s indices of `index_dtype`, None where the
    tile keeps its own layout: what the per-call pack, the kernel's read of a weight laid out
    ahead and `prepack_function` lay the tensor out by."""
    from tvm.tirx import IndexMap

    layout = _panel_layout(expr, program, tensor, vector_axis, ahead)
    return None if layout is None else IndexMap.from_func(layout, ndim=len(tensor.index), index_dtype=index_dtype)


def _index_dtype(sch, block) -> str:
    return str(sch.get(block).iter_vars[0].var.ty)
