"""The CPU template's layout rules, as pure functions of a program: which loop it vectorises
(the output row, a conv's filters, or a reduction's K), which inputs it copies into panels
(`packed_inputs`) and what those copies move (`packed_tile_bytes`), whether it pads the tails.
`rtile.plan.cpu_plan` applies them once per kernel; the schedule (`codegen/cpu.py`) and the
model (`rtile.model`) read that plan, not these rules.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from workbench.hardware.spec import LLC_FILL, DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import filter_axis, lane_axis, read_across, streams, vector_axis
from workbench.rtile.rprogram import RProgram, split_axis, split_steps
from workbench.rtile.traffic import calculus


def ragged(expr: TensorExpr, program: RProgram, axis: int) -> bool:
    """Whether the unit tile leaves a tail along `axis` (the schedule guards it)."""
    return expr.axes[axis].extent % int(program.unit_tile[axis]) != 0


def any_ragged(expr: TensorExpr, program: RProgram) -> bool:
    """Whether the unit tile leaves a tail along any axis, spatial or reduction (`ragged`)."""
    return any(ragged(expr, program, a) for a in range(len(expr.axes)))


def lane_reduction_axis(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> int | None:
    """The reduction axis a reduction without a vectorisable output axis (gemv, row sums)
    vectorises instead, or None.

    It is the innermost reduction axis, when no spatial axis can be vectorised
    (`vector_loop_axis`, with panels where `_panel_inputs` would pack: a transposed matmul
    vectorises its output rows after packing rather than its K), every input reading it
    streams along it (`streams`) and at least one does, and its register tile is a whole
    number of vectors. A fused K (a pool's pixels) is one contiguous run: the template lays the
    buffers out along it (`codegen.common.axis_loops`' `flat_buffers`). Where the unit tile leaves a tail along it (a
    row of 1000 in tiles of 1024, GPT-2's 50257), the template splits the edge off
    (`splits_reduction_edge`).
    """
    packed = bool(_panel_inputs(expr, program, device))
    if not expr.reduce or vector_loop_axis(expr, program, device, packed, packed) is not None:
        return None
    axis = expr.reduce[-1]
    tile = program.register_tile[axis]
    lanes = simd_lanes(device, expr.output.itemsize)
    if tile % lanes:
        return None
    if ragged(expr, program, axis) and not splits_reduction_edge(expr, program, axis):
        return None
    if not any(t.uses_axis(axis) for t in expr.inputs) or not all(streams(t, axis) for t in expr.inputs):
        return None
    return axis


def splits_reduction_edge(expr: TensorExpr, program: RProgram, axis: int) -> bool:
    """Whether a reduction vectorised along its K (`lane_reduction_axis`) whose unit tile leaves
    a tail along it runs its whole register tiles unguarded and the one K's end cuts guarded,
    scalar (`codegen/cpu._split_edges` on its loops over tiles, the BLIS main block and fringe):
    where there is a loop over register tiles to split, more than one register tile along K in
    the unit tile or more than one unit tile along K."""
    extent, unit, reg = expr.axes[axis].extent, program.unit_tile[axis], program.register_tile[axis]
    return ragged(expr, program, axis) and (unit > reg or extent > unit)


def filter_vector_axis(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> int | None:
    """The filter axis a convolution vectorises (`alignment.filter_axis`, when it is the
    `lane_axis`), or None: also when its register tile is not a whole number of 4-lane pieces of
    at least a vector; such a program takes the plain template. Filters the unit tile leaves
    ragged are padded (`pads_filters`)."""
    axis = lane_axis(expr, device)
    if axis is None or axis != filter_axis(expr):
        return None
    tile = program.register_tile[axis]
    if tile < simd_lanes(device, expr.output.itemsize) or tile % 4:
        return None
    return axis


def pads_filters(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> bool:
    """Whether a convolution vectorised along its filters (`filter_vector_axis`) pads them with
    zero filters up to whole unit tiles (`codegen/cpu._pad_filters`): where the unit tile leaves
    a tail along them (31 filters in tiles of 16, 347 in 32), as oneDNN pads its output-channel
    blocks. Every register tile then holds whole vectors of filters and runs unguarded; the
    padded filters' outputs are computed and dropped by the write-back, which the model prices
    as the padded volume's flops (`model.estimate`'s `padded_flops`; evidence:
    docs/evidence.md#cpu-padded-filters)."""
    axis = filter_vector_axis(expr, program, device)
    return axis is not None and ragged(expr, program, axis)


def packed_inputs(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> tuple[str, ...]:
    """The inputs the template copies into panels for `program` (the one decision the schedule
    and the model that prices the copies, `rtile.model`, share): a convolution along its
    filters packs the inputs that read them (`codegen/cpu.py`'s `_schedule_filters`);
    elsewhere `_panel_inputs` decides, only for a micro-kernel with a vector axis (panels, and
    the padding that serves them, feed vector loads); a reduction vectorised along its
    reduction packs nothing."""
    if len(program.tiles) < 2:
        return ()
    filters = filter_vector_axis(expr, program, device)
    if filters is not None:
        return tuple(t.name for t in expr.inputs if t.uses_axis(filters))
    if lane_reduction_axis(expr, program, device) is not None:
        return ()
    if vector_loop_axis(expr, program, device, True, True) is None:
        return ()
    return _panel_inputs(expr, program, device)


def prepacked_inputs(expr: TensorExpr, program: RProgram, packed: tuple[str, ...]) -> tuple[str, ...]:
    """The `packed` inputs whose panels are laid out once, before the first call, rather than
    copied per tile in every call, as ONNX Runtime and oneDNN pack a model's weights when the
    session starts: the expression's `constants` that the kernel reads as its caller passes
    them (the argument or a view of it with as many elements, no padding copy), each dimension
    one axis, whose register tile divides it and whose unit tile leaves no tail (no padding to
    lay out), with a register tile over one element along some dimension (a layout to give:
    register-tile strips, `codegen/cpu._panel_layout`, which a copy per call gives only inputs
    read along the vector axis, the others' transposing copy costing what it saves). Their
    copy is no part of the kernel's time: ResNet-50's 512-filter 3x3 conv over 7 x 7 pixels ran
    1.84 ms with its 9.4 MB of filters copied per call and 1.03 ms with them laid out ahead (two
    Zen 4 cores; ONNX Runtime 1.2; evidence: docs/evidence.md#cpu-prepacked)."""
    if not packed or not expr.constants:
        return ()
    args = {a.name: a for a in expr.input_args}
    out = []
    for t in expr.inputs:
        arg = args.get(t.name)
        if t.name not in packed or t.name not in expr.constants or arg is None or prod(arg.shape) != prod(t.shape) \
                or t.name in expr.transposed:  # read as a copy made in the call
            continue
        axes = [[a for a, c in enumerate(coeffs) if c] for coeffs, _ in t.index]
        if any(len(used) != 1 or const or coeffs[used[0]] != 1 for used, (coeffs, const) in zip(axes, t.index)):
            continue
        regs = [int(program.register_tile[used[0]]) for used in axes]
        if any(extent % r or ragged(expr, program, used[0]) for extent, r, used in zip(t.shape, regs, axes)):
            continue
        if all(r == 1 for r in regs):
            continue
        out.append(t.name)
    return tuple(out)


def transposes(tensor, vector: int | None) -> bool:
    """Whether the panel copy of `tensor` transposes: an input laid out along the `vector` axis
    (its panels end in a vector's lanes of it, `_panel_layout`) whose innermost dimension is
    another axis: a conv's filters [f, c, r, s] copied to [.., f % r]. Its copy reads an element
    at a time (`codegen/cpu._copy_along_panel` gathers each vector of filters lane by lane), at
    `model.cpu.TRANSPOSED_BYTES_PER_CYCLE`."""
    if vector is None or not tensor.uses_axis(vector) or not tensor.index:
        return False
    return next((a for a, c in enumerate(tensor.index[-1][0]) if c), None) != vector


def transposed_in_panels(expr: TensorExpr, program: RProgram, packed: tuple[str, ...]) -> tuple[str, ...]:
    """The transposed operands (`ops.transposed_gemm`: a copy of B laid along the output's row)
    among the `packed` inputs whose copy is their panel copy (`codegen.cpu._pack_panels`), made
    per tile from the operand as stored rather than before the loop nest: those whose panels
    are copied once, the unit tile spanning every spatial axis the operand ignores (a matmul's
    M). The copy before the nest reads the operand and writes it whole, and the panels then
    read it again: three passes where one does, which from DRAM cost most of the time (16 x 163
    x 21843: 3.7 ms so, 1.6 in one pass; numpy 1.9). Where the panels are copied more than
    once, each copy that transposes costs more than the plain copy it replaces (4049 x 989 x 37,
    19 copies, and 512 x 768 x 768, 2: 1.00-1.05x the time so) and the copy before the nest stays.
    Evidence: docs/model-evidence.md#transposed-in-panels."""
    if not expr.transposed:
        return ()
    return tuple(t.name for t in expr.inputs if t.name in expr.transposed and t.name in packed and all(
        program.unit_tile[a] >= expr.axes[a].extent for a in expr.spatial if not t.uses_axis(a)))


def pads_tails(expr: TensorExpr, program: RProgram, panels: tuple[str, ...]) -> bool:
    """Whether the template pads the axes up to whole unit tiles (`codegen/cpu._pad_tails`): a
    panel-packed expression (`panels`: its `packed_inputs`, which take a ragged reduction only
    where zero inputs add nothing to it) of unfused axes whose unit tile leaves a tail, spatial
    or reduction. (The schedule also keeps the guard where row passes follow the main block.)"""
    if any(len(a.fused_from) > 1 for a in expr.axes) or not panels:
        return False
    return any_ragged(expr, program)


def whole_reduction(expr: TensorExpr, program: RProgram) -> bool:
    """Whether the whole reduction runs inside one L1 tile (every reduce axis's L1 tile is its
    extent), so that a register tile's accumulators are complete when its own K-loop ends and
    can go straight to the output (`direct_stores`) instead of into a unit tile's buffer that is
    initialised, filled and copied out in passes of their own (mm-skinny's 16 MiB output,
    K = 64, passed through L2 three times)."""
    return bool(expr.reduce) and len(program.tiles) > 1 and all(
        program.tiles[1][r] >= expr.axes[r].extent for r in expr.reduce)


# A padding copy is made per L1 tile where a unit tile's L1 tiles read at most this much more of
# the padded input, together, than the unit tile does (their halos), else once per unit tile.
PAD_OVERLAP = 1.1


def padded_inputs(expr: TensorExpr) -> tuple[str, ...]:
    """The inputs the main block reads under a larger shape than the caller passes (a conv's or a
    pooling's zero border): the template copies each into a padded buffer (`codegen/cpu.py`). An
    input read under another shape of the same size (a fused elementwise operator's) is not, nor
    is a gathered copy (`gathered_inputs`: a window's im2col is larger, its border inside the copy)."""
    return tuple(t.name for t, arg in zip(expr.inputs, expr.input_args)
                 if prod(t.shape) > prod(arg.shape) and t.name not in expr.gathered)


def gathered_inputs(expr: TensorExpr) -> tuple[str, ...]:
    """The inputs the main block reads as a copy gathered before the loop nest
    (`TensorExpr.gathered`, `codegen/cpu._gather_first`): a strided pointwise conv's image
    gathered into the output's pixels (`ops.pixel_gemm`), a window's im2col (`ops.window_gemm`)."""
    return tuple(t.name for t in expr.inputs if t.name in expr.gathered)


# `pad_level` of a copy per reduction step of the unit tile (under its loops R0, outside its L1
# tiles): the window of one step, where the windows of all its steps would not stay in cache
PAD_STEP = -1


def pad_level(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> int:
    """The tile level the padding copies are made at, counted from the unit tile (0) inwards:
    per L1 tile (the level inside the unit tile) where those tiles read the padded inputs
    without overlapping beyond PAD_OVERLAP, so each copy stays in L1 and is read right after it
    is written; else per reduction step of the unit tile (`PAD_STEP`) where it takes several and
    the copies of its whole window, one on each core, do not fit the caches (`window_spills`);
    else per unit tile (evidence: docs/evidence.md#pad-level)."""
    names = padded_inputs(expr)
    if not names or not expr.spatial or len(program.tiles) < 3:
        return 0
    unit, inner = program.unit_tile, program.tiles[-2]
    # under the L1 tile's spatial loops the copy covers that tile's window of one unit-tile
    # reduction step (the loops R0 run outside them, `codegen/cpu._loop_order`)
    region = tuple(unit[a] if a in expr.reduce else inner[a] for a in range(len(unit)))
    tiles = prod(ceil(unit[a] / inner[a]) for a in expr.spatial)
    shapes, whole = _data_tiles(expr, region), _data_tiles(expr, tuple(unit))
    read = sum(tiles * prod(shapes[n]) for n in names)
    if read <= PAD_OVERLAP * sum(prod(whole[n]) for n in names):
        return 1
    return PAD_STEP if window_spills(expr, program, device) else 0


def window_spills(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> bool:
    """Whether a unit tile of several reduction steps pads a window, over all its steps, that does
    not stay in cache until its compute reads it: one copy on each core, together over LLC_FILL
    of the last-level cache (the unit tile's layer on each core where the spec gives none). Such
    a copy goes to DRAM and comes back (a 3-image, 501-channel 79 x 79 conv: 20 MB a core)."""
    unit = program.unit_tile
    calc = calculus(expr)
    if all(unit[a] >= calc.extents[a] for a in expr.reduce):
        return False
    region = tuple(calc.extents[a] if a in expr.reduce else unit[a] for a in range(len(unit)))
    shapes, names = _data_tiles(expr, region), padded_inputs(expr)
    window = sum(prod(shapes[t.name]) * t.itemsize for t in expr.inputs if t.name in names)
    cores = min(device.compute_units, program.grid)
    room = device.llc_bytes * LLC_FILL if device.llc_bytes else cores * device.layers[len(program.tiles) - 1].capacity_bytes
    return cores * window > room


def _data_tiles(expr: TensorExpr, tile) -> dict[str, tuple[int, ...]]:
    """Tensor name -> the shape of its data tile under `tile` (`TileCalculus.data_tiles`)."""
    return dict(zip((t.name for t in expr.tensors), calculus(expr).data_tiles(tile)))


def simd_lanes(device: DeviceSpec, dtype_bytes: int) -> int:
    """Elements of `dtype_bytes` per vector register (`warp_size` counts 32-bit lanes on CPUs)."""
    return max(1, device.warp_size * 4 // dtype_bytes)


def vector_width(extent: int, lanes: int) -> int:
    """Lanes of the vectors a row of `extent` elements is computed in: the whole row when it
    fits one register, else the largest power of two dividing it, at most `lanes` (24 on 8
    lanes: 3 x 8; on 16 lanes: 3 x 8 as well, 8-lane halves, rather than 16 + 8)."""
    if extent <= lanes:
        return extent
    width = 1
    while width * 2 <= lanes and extent % (width * 2) == 0:
        width *= 2
    return width


def row_block_width(columns: int, lanes: int) -> int:
    """The side of the square blocks in which a transposed operand read as stored is copied into
    strips of `columns` (`CpuPlan.transposed_in_panels`, `codegen.cpu._copy_rows_down_strips`):
    the lanes the strip's rows are written in (`vector_width`), where that is a power of two from
    4, which then divides the strip; 0 where the copy goes a row at a time (a strip of 12
    columns on 16 lanes, written in one 12-lane vector; strips of 6 or 2)."""
    width = vector_width(columns, lanes)
    return width if width >= 4 and width & (width - 1) == 0 else 0


@dataclass(frozen=True)
class RowVector:
    """How the CPU template runs one row of a row pass (`codegen.cpu._row_passes`)."""

    width: int  # lanes of its vectors; 1: the row stays scalar
    slots: int  # vector or scalar instructions per operation of the pass and row


def row_vector(extent: int, lanes: int, reduction: bool = False) -> RowVector:
    """A row pass over rows of `extent` contiguous elements on `lanes`-lane vectors: in
    vectors of `vector_width` lanes, at least 4, that divide the row. A ragged row runs whole
    `lanes`-wide vectors, then, in an elementwise pass, its last `extent % lanes` elements one
    at a time, in a reduction its last vector guarded lane by lane (`lanes` scalar steps; the
    template then runs the reduction and the passes after it after the grid:
    `codegen.cpu._row_passes`). A reduction ends each row with a scalar sum across the lanes,
    one instruction a lane, and stays scalar where that takes as many as the row."""
    width = vector_width(extent, lanes)
    if width < 4 and extent > lanes:  # ragged: whole vectors, then a scalar tail
        tail = lanes if reduction else extent % lanes  # a reduction's last vector, guarded lane by lane
        slots = extent // lanes + tail + (lanes if reduction else 0)
        return RowVector(lanes, slots) if slots < extent else RowVector(1, extent)
    if width < 4:
        return RowVector(1, extent)
    slots = extent // width + (width if reduction else 0)
    return RowVector(width, slots) if slots < extent else RowVector(1, extent)


def vector_loop_axis(
    expr: TensorExpr, program: RProgram, device: DeviceSpec, packed: bool = False, padded: bool = False
) -> int | None:
    """The spatial axis vectorised in the register tile, or None.

    It is the output's contiguous axis, when its register tile holds at least one vector and a
    whole number of 4-lane pieces (LLVM splits a 56-wide vector into 3.5 AVX-512 registers,
    which measured 2-3x faster than leaving the unrolled tile to LLVM's SLP vectoriser on a 3x3
    conv) or is the whole axis, shorter than a vector but at least a 4-lane piece, in LLVM's
    pieces as the model prices it (`registers.row_vectors`; left scalar, 120 5x5 depthwise
    filters over 16 x 13 outputs ran 77 us on two Zen 4 cores where 18 vectorised, a 500 x 300
    x 12 matmul 48 us where 22; a row of 2 ran slower in a vector: docs/evidence.md#short-rows),
    when every input streams along it or ignores it (a strided or transposed access
    would turn each vector load into a gather, which measured slower than scalar code on gemv;
    `packed`: `_pack_panels` lays every input out so that the axis is innermost), and when the
    axis needs no guarded tail (a predicate inside the vector loop scalarises it; `padded`:
    `_pad_tails` removed the tails).
    """
    axis = vector_axis(expr)
    if axis is None or expr.axes[axis].kind != "spatial":
        return None
    tile, lanes = program.register_tile[axis], simd_lanes(device, expr.output.itemsize)
    short = 4 <= tile == expr.axes[axis].extent < lanes
    if not short and (tile < lanes or tile % 4):
        return None
    if not packed and not all(streams(t, axis) for t in expr.inputs):
        return None
    if not padded and ragged(expr, program, axis):
        return None
    return axis


def splits_edges(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> bool:
    """Whether the template vectorises a row whose unit tile leaves a tail that nothing pads
    (no panels: a one-row tile reuses no B, so a copy would only double its traffic) by
    splitting its loops at the axis's end (`codegen/cpu._split_edges`): the tiles inside the
    extent run the unguarded vector micro-kernel and the rest of the unit tile from the one the
    end cuts runs its guard, scalar (the BLIS main block and fringe; `splits_edge_vectors` keeps
    the cut tile's whole vectors in vectors). A row fused from several axes (a model's
    elementwise operator or concatenation over its flattened dimensions, `ops.fusion`) splits
    alike: its divided indices flatten back to the row's own. Other ragged spatial axes split
    at their ends as well, their edge tiles keeping the guard, the same for every lane (3 filters
    over 73 x 73 outputs in 16-lane rows: the rows' ragged end left every row scalar behind the
    guard, 0.12-0.15 ms against ONNX Runtime's 0.04-0.06; split, 0.02-0.03: docs/model-evidence.md
    #filters-edges). A ragged reduction splits at its end as well: its guard is the same for
    every lane, so the register tile K's end cuts runs its vector row under it (a one-row
    matmul's 16 rows in flight over a prime K; 4 x 4537 x 109 in 4 x 16 x 2 register tiles, whose
    row ran scalar behind the guard otherwise: 0.8-1.3 ms against 0.22-0.41, numpy 0.085). It
    needs the row `vector_loop_axis` allows once padded and a loop to split below the grid:
    more than one register tile along the row in a unit tile."""
    v = vector_loop_axis(expr, program, device, False, True)
    if v is None or not ragged(expr, program, v):
        return False
    return program.unit_tile[v] > program.register_tile[v]


def cut_other_axes(expr: TensorExpr, program: RProgram, vector: int) -> tuple[int, ...]:
    """The spatial axes other than a whole vectorised row `vector` that the unit tile leaves
    ragged (`ragged`) under register tiles of more than one row: TVM's guard then tests each
    unrolled row of every register tile, where the row path splits their loops over register
    tiles where they end instead (`CpuPlan.split_others`). dwconv-3x3 guarded, against the tiles
    that divide its 112 rows: on the Zen 3, 6- and 5-row tiles (the end cuts one) 1.8-2x slower;
    on the Zen 4, 2-row tiles under 58-row unit tiles (the last one wholly past the end)
    1.4x (docs/evidence.md#row-edges). A register tile of one row keeps one guard per tile,
    which the compiler hoists out of its statements."""
    reg = program.register_tile
    return tuple(a for a in expr.spatial if a != vector and reg[a] > 1 and ragged(expr, program, a))


def cut_register_axes(expr: TensorExpr, program: RProgram, vector: int) -> tuple[int, ...]:
    """The axes of `cut_other_axes` whose end cuts a register tile (the register tile does not
    divide the extent): those the lanes path splits (`CpuPlan.split_others`). Where the register
    tiles divide the axis, its guard tests whole tiles, and split there it kept lowering from
    partitioning a ragged K's loops in every tile: gemv 816 x 1837 on 24-row register tiles
    under 72- and 96-row unit tiles ran 70 and 64 us split, 43 and 47 not, 41 under 48-row
    tiles, which divide it (two Zen 4 cores; docs/evidence.md#lanes-edges)."""
    return tuple(a for a in cut_other_axes(expr, program, vector) if expr.axes[a].extent % program.register_tile[a])


def splits_edge_vectors(expr: TensorExpr, program: RProgram, device: DeviceSpec, v: int) -> bool:
    """Whether a row along `v` whose edges split off (`splits_edges`) and that does not end on a
    vector (`ends_on_vector`), both of which the caller has checked, also runs the whole vectors
    of its edge tile vectorised: the register tile the row's end cuts becomes a block of its own
    (`codegen.cpu._edge_tile_apart`) whose loop over vectors stays a loop, each vector summing its
    K-steps in a register, split where the row ends, so that only the vector the end cuts runs
    lane by lane. With the register tiles' loop split instead, the edge tile runs every one of
    its lanes scalar, each a guarded FMA with its accumulator's load and store: 1 x 2780 x 881
    on two Zen 3 cores in 1 x 56 tiles of 448 columns (41 of the cut tile's lanes inside the row)
    256 us so, 110 with the cut tile apart, 85 for 896 columns (no edge; evidence:
    docs/evidence.md#edge-vectors).

    Taken for a reduction over one-row register tiles of more than one vector (a one-row
    matmul's, mostly memory-bound) whose accumulators stay in a unit tile's buffer (not
    `whole_reduction`'s stores straight from the registers, whose loop over tiles holds their
    write-back), where no register tile lies wholly past the row's end: the cut tile is then the
    last register tile of each unit tile's last L1 tile, and TVM bounds the partitioned loop's
    scalar rest by the whole vectors' count without clamping it at zero, so a tile wholly past
    the end would run over the tiles before it and add their columns twice."""
    if not expr.reduce:
        return False
    reg = program.register_tile
    if any(reg[a] > 1 for a in expr.spatial if a != v):
        return False
    lanes = simd_lanes(device, expr.output.itemsize)
    if vector_width(reg[v], lanes) >= reg[v]:
        return False  # one vector: no loop over vectors to split
    extent, unit = expr.axes[v].extent, program.unit_tile[v]
    return -(-extent // unit) * unit - extent < reg[v]


def ends_on_vector(extent: int, register: int, lanes: int) -> bool:
    """Whether a row of `extent` elements in register rows of `register` ends on a vector (of
    `vector_width` lanes): then each vector of the tile its end cuts lies wholly inside the row
    or wholly past it, and the guard a split row's edge tiles keep (`splits_edges`) is the same
    for every lane of a vector, so lowering leaves the cut tile's vectors vectorised, each under
    its test, where a row that ends inside a vector scalarises the tile."""
    return extent % vector_width(register, lanes) == 0


def _panel_inputs(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> tuple[str, ...]:
    """The inputs `_pack_panels` copies into panels: those a panel serves (`_panel_pays`), when
    the program has a layer below the registers, the expression reduces, and every input is
    a plain projection (each dimension one whole unfused axis, as in matmul, batched or
    transposed) whose reduction axes the tiles divide, or which pad with zeros
    (`TensorExpr.pads_reduction`: a sum of products, no row passes after it), and which the unit tile reuses (it spans
    more than one index of a spatial axis the input ignores); () otherwise (convolutions,
    strided or offset reads, a ragged K that zeros would change, and gemv, whose matrix is read
    once: a copy only doubles its traffic; evidence: docs/evidence.md#panel-inputs). Where
    `_pad_tails` will pad (any axis ragged), every input is copied (the padding copy is the
    panel) but one that one register tile reads while another input is copied
    (`_read_in_place`), and none in a program's variant that reads them in place
    (`RProgram.in_place`, `reads_in_place`). Where Roller staged nothing below the registers
    (`Space.cached`: its start tile saw no reuse to grow for) the inputs are read in place, but
    for a ragged tail that cannot be split off (`splits_edges`), which only the padding keeps
    vectorised: 17 x 1259 x 29, two register tiles covering the rows and the columns, ran its
    row scalar behind the guard (evidence: docs/evidence.md#panel-inputs)."""
    if not expr.reduce or len(program.tiles) < 2:
        return ()
    tails = any_ragged(expr, program)
    if not any(program.cached[1:]) and (not tails or splits_edges(expr, program, device)):
        return ()
    for tensor in expr.inputs:
        if not any(not tensor.uses_axis(a) and program.unit_tile[a] > 1 for a in expr.spatial):
            return ()
        for coeffs, const in tensor.index:
            used = [a for a, c in enumerate(coeffs) if c]
            if const or len(used) != 1 or coeffs[used[0]] != 1 or len(expr.axes[used[0]].fused_from) > 1:
                return ()
            # a ragged K is padded with zeros where they add nothing and no row passes keep the
            # tails guarded (`rtile.plan.cpu_plan`; an elementwise epilogue reads the finished sums
            # in the padded output's copy-back); a guarded K-tile would reach the panels
            if expr.axes[used[0]].kind != "spatial" and ragged(expr, program, used[0]) and (
                    not expr.pads_reduction or expr.row_passes):
                return ()
    if tails and program.in_place and reads_in_place(expr, program, device):
        return ()
    if tails:
        copied = [t for t in expr.inputs if not _read_in_place(expr, program, device, t)]
        return tuple(t.name for t in (copied or expr.inputs))
    return tuple(t.name for t in expr.inputs if _panel_pays(expr, program, device, t))


def reads_in_place(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> bool:
    """Whether `program` has a variant that reads its inputs as stored (`RProgram.in_place`)
    where its unit tile leaves tails that `_panel_inputs` would pad by copying every input into
    panels: no panel gains anything but the padding (`_panel_pays`), and the row's edges split
    off instead (`splits_edges`: the interior runs the unguarded micro-kernel, the tile the end
    cuts keeps its guard). The construction prices both and keeps the faster
    (`construct.policy.Policy.priced`), since what decides is a copy of every input against the
    edge's guarded lanes (`model.cpu.edge_seconds`): where few rows read a large B once, its
    copy doubles the traffic (two Zen 5 cores, best of the top 5: 5 x 2880 x 1521 279-296 us
    padded, 114-172 with the variant; 4 x 1024 x 10001 1.54-1.57 ms and 0.71-0.96; 3 x 768 x
    7919 0.65-0.71 and 0.25-0.35), where a 5 x 48 register tile in 96-column unit tiles of the
    first ran 390-400 us in place, each unit tile's 33 edge columns scalar, against 290 padded
    (evidence: docs/evidence.md#in-place-tails)."""
    if not splits_edges(expr, program, device):
        return False
    # (plain projections only, which `_panel_pays` reads) where a model's weights are laid out
    # ahead (`prepacked_inputs`), no call pays their copy: not measured
    padded = _panel_inputs(expr, replace(program, in_place=False), device)
    if not padded or prepacked_inputs(expr, program, padded):
        return False
    return not any(_panel_pays(expr, program, device, t) for t in expr.inputs)


def _read_in_place(expr: TensorExpr, program: RProgram, device: DeviceSpec, tensor) -> bool:
    """Whether an input of a padded program is read in place rather than copied with its padding
    (`edge_axes`): one register tile reads each element of its panel (`read_once`), which needs
    no other layout (`_panel_pays`), it does not read a ragged vector axis, whose padding keeps
    the micro-kernel's vectors whole, and no ragged axis it reads has a cut tile the grid makes
    costly (`_costly_cut`) or is split into register tiles in another input's panel; not in a
    split program (`RProgram.split`), whose parts' K is their own loop (`codegen/cpu._split_k`).
    1693 x 7853 x 45 in 9 x 48 register tiles, A copied (53 MB) only to pad its rows and K,
    runs 4.4-4.9 ms on two Zen 5 cores, 2.9-3.1 with A read in place (ONNX Runtime 2.9;
    evidence: docs/evidence.md#panel-read-once)."""
    vector = vector_axis(expr)
    if vector is None or program.split > 1 or (tensor.uses_axis(vector) and ragged(expr, program, vector)):
        return False
    if any(_costly_cut(expr, program, a) for a in expr.spatial if tensor.uses_axis(a)):
        return False
    # an axis another input's panel splits into register tiles (`codegen/cpu._panel_layout`: B's
    # K in K-unrolled register tiles) is padded for that panel, and so for this input too
    others = [t for t in expr.inputs if t is not tensor]
    if any(tensor.uses_axis(a) and ragged(expr, program, a) and program.register_tile[a] > 1
           and any(t.uses_axis(a) for t in others) for a in range(len(expr.axes))):
        return False
    return read_once(expr, program, tensor) and not _panel_pays(expr, program, device, tensor)


# The most of an axis's register tiles one cut tile may be where the grid splits the axis into
# several unit tiles and the input is read in place. Its guard then depends on the grid's index,
# loop partitioning cannot lift it, and the cut tile runs about 4x a whole one's time
# (`model.cpu_compute.GRID_GUARDED_TILE`): at 1 in 30, a tenth more along the axis. Two Zen 5
# cores, 60 fresh random matmuls read in place against copied: every shape whose cut tile was
# 1 in 21 to 1 in 3 of such an axis ran 0.56-0.97x (31 x 797 x 23 in 8-row tiles under 16-row
# units: 5.6 -> 10.0 us), at 1 in 30 or fewer 1.05-1.59x; the bound lies between the two
# (evidence: docs/evidence.md#panel-read-once).
GRID_CUT_SHARE = 1 / 30


def _costly_cut(expr: TensorExpr, program: RProgram, axis: int) -> bool:
    """Whether `axis`'s edge, left unpadded, would cost more than GRID_CUT_SHARE allows: the grid
    splits it into several unit tiles and its end cuts a register tile."""
    extent, register, unit = expr.axes[axis].extent, program.register_tile[axis], program.unit_tile[axis]
    return extent > unit and extent % register != 0 and 1 / -(-extent // register) > GRID_CUT_SHARE


def edge_axes(expr: TensorExpr, program: RProgram, packed: tuple[str, ...]) -> tuple[int, ...]:
    """The ragged axes a padded program (`pads_tails`) leaves unpadded: those an input read in
    place (not in `packed`: `_read_in_place`) reads. The schedule splits their edges off
    (`codegen/cpu._split_edges`): the tiles inside the extents run unguarded, the tile an end
    cuts keeps TVM's guard, the same for every lane of a vector (the vector axis is padded)."""
    inplace = [t for t in expr.inputs if t.name not in packed]
    return tuple(a for a in range(len(expr.axes)) if ragged(expr, program, a) and any(t.uses_axis(a) for t in inplace))


def _panel_pays(expr: TensorExpr, program: RProgram, device: DeviceSpec, tensor) -> bool:
    """Whether a panel of `tensor` gains anything: its layout has to change (an input read
    across the vector axis, as a transposed matmul's), or more than one register tile reads the
    panel (not `read_once`) and the addresses its L1 tile reads in place span more than the L1
    holds. A span within the L1 cannot conflict in it (a contiguous range of at most the
    capacity puts at most `ways` lines in any set), so its copy is pure overhead; a wider span
    (mm-512's B, 256 rows 2 KiB apart) puts many rows in the same sets, which the copy avoids
    (evidence: docs/evidence.md#panel-pays)."""
    if read_across(expr, tensor):
        return True
    if read_once(expr, program, tensor):
        return False
    tile = program.tiles[1]
    axes = [next(a for a, c in enumerate(coeffs) if c) for coeffs, _ in tensor.index]
    span = 1 + sum((int(tile[a]) - 1) * stride for a, stride in zip(axes, tensor.strides))
    return span * tensor.itemsize > device.layers[1].capacity_bytes


def read_once(expr: TensorExpr, program: RProgram, tensor) -> bool:
    """Whether one register tile reads each element of `tensor`'s panel, the tile of the pack
    layer (`pack_layer`) no wider than the register tile along every spatial axis the input
    ignores (a matmul's A where the unit tile's columns are one register tile's: N = 48 in
    8 x 48 register tiles). Its copy then reads the input, writes the panel and the micro-kernel
    reads that once more, where it could have read the input in place as the copy does: 4 x 384
    x 3584 x 48 in those tiles ran 1.44-1.54 ms with A copied and 1.02-1.05 ms read in place
    (two Zen 5 cores; ONNX Runtime 1.13-1.19; evidence: docs/evidence.md#panel-read-once)."""
    tile, register = program.tiles[pack_layer(program)], program.register_tile
    return all(tile[a] <= register[a] for a in expr.spatial if not tensor.uses_axis(a))


def pack_layer(program: RProgram) -> int:
    """The layer whose tile the template packs: the outermost cached layer below the registers,
    or the outermost layer where none is cached (a convolution's filters are packed
    regardless)."""
    n = len(program.tiles) - 1
    return max((l for l in range(1, n + 1) if program.cached[l]), default=n)


def panel_copy_bytes(program: RProgram, inputs: tuple[str, ...], layer: int) -> int:
    """Bytes of one copy of the panels of `inputs` packed at the tile of `layer`: their data tiles
    at that tile, the buffer a core writes each copy into."""
    expr = program.expr
    shapes = _data_tiles(expr, tuple(program.tiles[layer]))
    return sum(prod(shapes[t.name]) * t.itemsize for t in expr.inputs if t.name in inputs)


def packed_tile_bytes(program: RProgram, device: DeviceSpec, inputs: tuple[str, ...], layer: int) -> int:
    """Bytes the busiest core writes into panels of `inputs` packed at the tile of `layer`: per
    copy `panel_copy_bytes`; one copy per such tile in a unit tile (its K-steps, and
    its spatial steps when the layer lies below the unit's), for each of the
    `ceil(grid / units)` unit tiles that core runs (a split program's parts, each over its part
    of the split axis, `split_steps` unit tiles' K-steps)."""
    expr = program.expr
    tile, unit = program.tiles[layer], program.unit_tile
    per_copy = panel_copy_bytes(program, inputs, layer)
    extents = {a: expr.axes[a].extent for a in expr.reduce}
    if program.split > 1:  # a part walks `split_steps` of the unit tile's K-steps
        axis = split_axis(expr, device)
        extents[axis] = min(extents[axis], split_steps(program, axis) * unit[axis])
    steps = prod(ceil(extent / tile[a]) for a, extent in extents.items())
    steps *= prod(unit[a] // tile[a] for a in expr.spatial)
    return ceil(program.grid / device.compute_units) * steps * per_copy
