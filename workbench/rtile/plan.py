"""One plan per kernel: the template's decisions for an (expression, rProgram, device), made once.

Codegen carries a plan out and decides nothing itself (`codegen.cpu`, `codegen.cuda`,
`codegen.cuda_mma`, `codegen.cuda_conv`), the model prices the plan and re-derives nothing
(`rtile.model`), and the faces show it (`describe`, `Candidate.to_dict()["plan"]`). The rules a
plan is made of live beside it: the CPU template's layout rules in `rtile.panels`, the GPU
templates' staging rules in `rtile.staging`, the axis rules in `rtile.axes`. Pure: no TVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import cross_thread_axis, mma_axes, streams, vector_axis
from workbench.rtile.panels import (
    PAD_STEP, any_ragged, cut_other_axes, cut_register_axes, ends_on_vector, filter_vector_axis, gathered_inputs,
    edge_axes, lane_reduction_axis, pack_layer, packed_inputs, pad_level, padded_inputs, pads_filters, pads_tails,
    prepacked_inputs, ragged, simd_lanes, splits_edge_vectors, splits_edges, transposed_in_panels, vector_loop_axis,
    whole_reduction, window_spills,
)
from workbench.rtile.rprogram import RProgram
from workbench.rtile.staging import pipelined, pipelined_axis, register_prefetch

# The CPU template's paths (`codegen.cpu`): a convolution vectorised along its filters, a
# reduction vectorised along its K (per-lane partial sums), a vectorised output row over inputs
# packed into panels, a vectorised output row read in place, and a register row left scalar.
FILTERS, LANES, PANELS, ROW, SCALAR = "filters", "lanes", "panels", "row", "scalar"

# Where a CPU reduction's accumulators live between the register tile's K-steps.
IN_REGISTERS = "registers"  # stored straight to the output after the whole reduction
UNIT_BUFFER = "unit-tile buffer"  # a local buffer of the unit tile's outputs, written back once
LANE_SUMS = "per-lane partial sums"  # summed across the lanes once per unit tile
TILE_LANE_SUMS = "per-lane partial sums, summed per register tile"  # the whole reduction in the L1 tile
FILTERS_LAST = "filters-last buffer"  # the unit tile's outputs, filters innermost, transposed back


@dataclass(frozen=True)
class CpuPlan:
    """The CPU template's decisions for one program (`codegen.cpu` carries them out).

    `vector_axis` is the loop vectorised in the register tile (the filters, the reduction axis
    of a lanes-along-K reduction, or the output row), None for scalar code; `lanes` the vector's
    elements; `packed` the inputs copied into panels at the tile of layer `pack_layer`;
    `padded_tails` whether the axes are padded to whole unit tiles (`pad_einsum`: the spatial
    ones, and a ragged reduction of zero-padded terms), so the micro-kernel runs unguarded, but
    `edge_axes`, the ragged axes of an input read in place (`panels.edge_axes`), whose edges
    split off as `split_edges` splits a row's, the tile an end cuts keeping its guard;
    `split_edges` whether a ragged row that nothing pads is vectorised anyway, its loops split by
    lowering into whole tiles, unguarded, and from the one the axis's end cuts to the unit tile's
    end, scalar (`model.cpu_compute.edge_split`; `panels.splits_edges`: the BLIS main block and
    fringe; on the lanes path the ragged K, `panels.splits_reduction_edge`; on the filters path the
    ragged output rows and columns, whose edge tiles keep their guard and their vectors of
    filters); `edge_vectors` whether a split row's edge tile runs apart, its whole vectors
    vectorised and only the rest scalar (`panels.splits_edge_vectors`,
    `codegen.cpu._edge_tile_apart`), rather than every lane;
    `edge_in_vectors` whether a split row ends on a vector (`panels.ends_on_vector`), so that
    its cut tile runs every vector vectorised under the register tiles' split, without
    `edge_vectors`; `split_others` whether a row read in place and vectorised whole (the row
    path, no `split_edges`; on the lanes path, the output's axes beside a K split or not) splits
    off the edges of the other axes its register tiles cut
    (`panels.cut_other_axes`; on the lanes path those whose end cuts a register tile,
    `panels.cut_register_axes`) as the filters path does its pixel axes': the register tiles inside
    them run without the guard, the edge tiles keep it;
    `guarded_row` whether a ragged tail that neither pads nor splits leaves the row that would be
    vectorised scalar;
    `direct_stores` whether each register tile's accumulators go straight to the output (the
    whole reduction inside one L1 tile; on the lanes path, where it is a reduction of products,
    each register tile's lanes summed right after its K-loop);
    `staged_padding` whether padding producers stay stages of their own (computed per tile at
    level `pad_level`) rather than inlined; `accumulators` where a reduction's partial sums live;
    `stack_accumulators` whether a register tile's accumulators are a buffer of TVM's `global`
    scope, which its lowering puts on the stack (under 1 KiB), rather than `local`, a TVM
    workspace: a panel-packed reduction storing its registers directly whose register tiles all
    compute unguarded (`codegen.cpu._accumulate`);
    `padded_filters` whether a convolution vectorised along its filters computes them padded
    with zero filters to whole unit tiles (`panels.pads_filters`); `prepacked` the packed inputs
    laid out in their panels once, before the first call (a model's weights,
    `panels.prepacked_inputs`): the kernel takes them so laid out and copies nothing of them;
    `transposed_in_panels` the transposed operands (`ops.transposed_gemm`) copied straight into
    their panels, not before the loop nest (`panels.transposed_in_panels`);
    `split` the parts its reduce axis is dealt over (`RProgram.split`, `splits_reduction`), each
    part's partial sums summed on one core after the parallel loop (`codegen.cpu._split_k`).
    """

    path: str
    vector_axis: int | None
    lanes: int
    packed: tuple[str, ...] = ()
    pack_layer: int = 0
    padded_tails: bool = False
    guarded_row: bool = False
    direct_stores: bool = False
    staged_padding: bool = False
    pad_level: int = 0
    accumulators: str = ""
    split_edges: bool = False
    padded_filters: bool = False
    prepacked: tuple[str, ...] = ()
    edge_vectors: bool = False
    edge_in_vectors: bool = False
    split_others: bool = False
    stack_accumulators: bool = False
    split: int = 1
    transposed_in_panels: tuple[str, ...] = ()
    edge_axes: tuple[int, ...] = ()

    def guarded_axes(self, expr) -> tuple[int, ...]:
        """The spatial axes of `expr` whose ragged tails TVM's predicate guards: all but filters
        padded to whole unit tiles (`padded_filters`), whose register tiles are all whole."""
        return tuple(a for a in expr.spatial if not (self.padded_filters and a == self.vector_axis))

    def to_dict(self, expr) -> dict:
        return {
            "template": "cpu",
            "path": self.path,
            "vector_axis": None if self.vector_axis is None else expr.axes[self.vector_axis].name,
            "lanes": self.lanes,
            "packed": list(self.packed),
            "pack_layer": self.pack_layer,
            "padded_tails": self.padded_tails,
            "guarded_row": self.guarded_row,
            "direct_stores": self.direct_stores,
            "staged_padding": self.staged_padding,
            "pad_level": self.pad_level,
            "accumulators": self.accumulators,
            "split_edges": self.split_edges,
            "padded_filters": self.padded_filters,
            "prepacked": list(self.prepacked),
            "edge_vectors": self.edge_vectors,
            "edge_in_vectors": self.edge_in_vectors,
            "split_others": self.split_others,
            "stack_accumulators": self.stack_accumulators,
            # written only where set: an unsplit kernel's plan reads as it was stored before
            # split-K, or B copied into its panels (`model_bench` compares stored plans with the
            # template's)
            **({"split": self.split} if self.split > 1 else {}),
            **({"transposed_in_panels": list(self.transposed_in_panels)} if self.transposed_in_panels else {}),
            **({"edge_axes": [expr.axes[a].name for a in self.edge_axes]} if self.edge_axes else {}),
        }


@dataclass(frozen=True)
class GpuPlan:
    """The CUDA templates' decisions for one program: the inputs staged in shared memory, the
    pipeline depth (`stages`: 2 double-buffers the staged tiles) and whether the next step's
    copy passes through registers (`register_prefetch`, no `cp.async`), the reduce axis a block
    spreads its threads along (`cross_thread_axis`), the reduce axis whose step loop is
    pipelined, the MMA fragment's (i, j, k) axes, the split-K factor, the virtual threads, the
    lanes of a warp along each spatial axis (`warp_lanes`; empty: the block's threads row-major),
    whether a thread's run of the output is written back in one vector (`vector_stores`) and the
    inputs staged transposed, their reduce axis outermost (`kmajor`: `kmajor_inputs`)."""

    staged: tuple[str, ...]
    stages: int
    register_prefetch: bool
    pipelined_axis: int | None
    cross_thread_axis: int | None
    mma_axes: tuple[int, int, int] | None
    split: int
    vthreads: tuple[tuple[str, int], ...]
    warp_lanes: tuple[tuple[str, int], ...] = ()
    vector_stores: bool = False
    kmajor: tuple[str, ...] = ()

    @property
    def pipelined(self) -> bool:
        return self.stages > 1

    def to_dict(self, expr) -> dict:
        name = lambda a: None if a is None else expr.axes[a].name  # noqa: E731
        return {
            "template": "cuda",
            "staged": list(self.staged),
            "stages": self.stages,
            "register_prefetch": self.register_prefetch,
            "pipelined_axis": name(self.pipelined_axis),
            "cross_thread_axis": name(self.cross_thread_axis),
            "mma_axes": None if self.mma_axes is None else [name(a) for a in self.mma_axes],
            "split": self.split,
            "vthreads": dict(self.vthreads),
            "warp_lanes": dict(self.warp_lanes),
            "vector_stores": self.vector_stores,
            "kmajor": list(self.kmajor),
        }


Plan = CpuPlan | GpuPlan


def plan_for(program: RProgram, device: DeviceSpec) -> Plan:
    """The plan of `program` (which carries its expression) on `device`."""
    return cpu_plan(program, device) if device.runs_on_cpu else gpu_plan(program, device)


@lru_cache(maxsize=65536)
def cpu_plan(program: RProgram, device: DeviceSpec) -> CpuPlan:
    """The CPU template's decisions (module docstring of `codegen.cpu`), from `rtile.panels`'s
    rules: the filters template where `filter_vector_axis` holds, the lanes-along-K template
    where `lane_reduction_axis` does (its edge split off where K is ragged), else the plain template, which pads the tails of a
    panel-packed expression (`pads_tails`) unless row passes follow its main block (they
    read the unpadded output; an elementwise epilogue folds into the padded output's copy-back
    instead), vectorises the output row where `vector_loop_axis`
    allows, or, for a ragged row with no panels, where `splits_edges` does, and packs the panels
    only for a vectorised row."""
    expr = program.expr
    lanes = simd_lanes(device, expr.output.itemsize)
    # a padding copy, a gathered image (`ops.pixel_gemm` at a stride) or a transposed operand's
    # copy (`ops.transposed_gemm`) is a stage of its own; a view of the argument's elements is neither
    staged = bool(padded_inputs(expr) or gathered_inputs(expr) or expr.transposed)
    filters = filter_vector_axis(expr, program, device)
    if filters is not None:
        # the ragged pixel axes' edges split off: TVM's guard left in every register tile cost
        # 1.4-1.9x on 17 x 17 and 23 x 23 outputs (docs/model-evidence.md#filters-edges)
        edges = any(ragged(expr, program, a) for a in expr.spatial if a != filters)
        packed = packed_inputs(expr, program, device)
        # its copy per unit tile or, where that window spills, per reduction step: an L1 tile
        # reads every channel of its window, as every other L1 tile does (evidence: docs/evidence.md#pad-level)
        step = staged and window_spills(expr, program, device)
        return CpuPlan(FILTERS, filters, lanes, packed, pack_layer(program), staged_padding=staged,
                       pad_level=PAD_STEP if step else 0, accumulators=FILTERS_LAST, split_edges=edges,
                       padded_filters=pads_filters(expr, program, device),
                       prepacked=prepacked_inputs(expr, program, packed))
    k = lane_reduction_axis(expr, program, device)
    if k is not None:
        # the ragged output axes' edges split off as well: TVM's guard left on every unrolled
        # output of every register tile cost 2.9-3.5x (64 x 2579 x 1423 with B transposed:
        # 10.3 ms so, 3.3 split), where the end cuts a register tile (docs/evidence.md#lanes-edges)
        # where the L1 tile spans a reduction of products (a multiply-add a point: gemv, a GEMM
        # whose B is stored transposed), each register tile's lanes are summed right after its
        # K-loop, from registers, rather than from a buffer of the unit tile's outputs x lanes
        # after all of them; row sums, maxima and means keep the buffer
        # (docs/evidence.md#lane-sums-per-tile)
        whole = whole_reduction(expr, program) and expr.multiply_adds
        return CpuPlan(LANES, k, lanes, direct_stores=whole, accumulators=TILE_LANE_SUMS if whole else LANE_SUMS,
                       split_edges=ragged(expr, program, k), split_others=bool(cut_register_axes(expr, program, k)))
    panels = packed_inputs(expr, program, device)
    padded = pads_tails(expr, program, panels) and not expr.row_passes
    vector = vector_loop_axis(expr, program, device, bool(panels), padded)
    split = vector is None and not panels and splits_edges(expr, program, device)
    if split:
        vector = vector_loop_axis(expr, program, device, False, True)
    whole = vector is not None and whole_reduction(expr, program)
    guarded = vector is None and vector_loop_axis(expr, program, device, bool(panels), True) is not None
    packed = panels if vector is not None else ()
    path = SCALAR if vector is None else PANELS if packed else ROW
    home = "" if not expr.reduce else IN_REGISTERS if whole else UNIT_BUFFER
    in_vectors = split and ends_on_vector(expr.axes[vector].extent, program.register_tile[vector], lanes)
    others = path == ROW and not split and not padded and bool(cut_other_axes(expr, program, vector))
    # TVM's lowering takes a `local` buffer from a workspace, whose contents LLVM keeps: it holds
    # a register tile's accumulators live across every loop around the tile, and where loop
    # partitioning copies the tile (a row ending inside a vector) the copies' accumulators spill
    # in the K-loop (1024 x 256 x 196 in 4 x 16 tiles: 749 us, 593 on the stack). A tile computing
    # under a guard keeps `local`: its lanes' loops index the accumulators, and only TVM's unroll of
    # loops over `local` buffers unrolls them (`build.pass_config`; depthwise convs with split
    # edges ran 1.1-3.6x slower on the stack). On the row path, without a guard along the row,
    # LLVM promoted the workspace's stores out of the row loop and copied the 14 vectors to the
    # stack at every step: cpu-core's depthwise conv in 24- and 32-channel unit tiles ran 1.41-1.54x
    # faster on the stack on two Intel Xeon cores. Not on AMD's, where it was not measured and the
    # Zen 3 ran depthwise convs on the stack 1.047x slower (tiles with split edges among them).
    # Evidence: docs/evidence.md#accumulator-scope
    edges = edge_axes(expr, program, packed) if padded and packed else ()
    stack = path == PANELS and whole and (padded and not edges or not any_ragged(expr, program)) or \
        path == ROW and whole and not split and not ragged(expr, program, vector) and device.vendor == "intel"
    return CpuPlan(path, vector, lanes, packed, pack_layer(program), padded, guarded, whole,
                   staged, pad_level(expr, program, device) if staged else 0, home, split,
                   prepacked=prepacked_inputs(expr, program, packed),
                   edge_vectors=split and not in_vectors and not whole and splits_edge_vectors(expr, program, device, vector),
                   edge_in_vectors=in_vectors, split_others=others, stack_accumulators=stack, split=program.split,
                   transposed_in_panels=transposed_in_panels(expr, program, packed),
                   edge_axes=edges)


def splits_reduction(program: RProgram, device: DeviceSpec) -> bool:
    """Whether the template can deal `program`'s reduce axis (`rprogram.split_axis`) over parts:
    every GPU program (`rprogram.split_counts` decides); on a CPU the plain template's
    (`codegen.cpu._split_k`), not the filters' or the lanes' (their own loop nests), nor a
    program whose whole reduction runs in one register tile (one K-step: nothing to deal), whose
    split row's edge tile runs apart (`edge_vectors`: TVM partitions no loop under the parts'
    loop fused with the grid, whose index is no longer affine), or whose inputs come packed
    ahead (`prepacked`: their panels are laid out for the whole axis); nor an in-place variant
    over a ragged K (`RProgram.in_place`), whose K-edge lowering does not split under the parts'
    loop either: 5 x 2753 x 1521 in one 5 x 1536 x 128 unit tile ran 326 us over two parts, 322
    on one core (docs/evidence.md#in-place-tails)."""
    if not device.runs_on_cpu:
        return True
    plan = cpu_plan(program, device)
    if program.in_place and any(ragged(program.expr, program, a) for a in program.expr.reduce):
        return False
    return plan.path in (PANELS, ROW, SCALAR) and not (plan.direct_stores or plan.edge_vectors or plan.prepacked)


@lru_cache(maxsize=65536)
def gpu_plan(program: RProgram, device: DeviceSpec) -> GpuPlan:
    """The CUDA templates' decisions: what `rtile.staging` and `rtile.axes` rule."""
    expr = program.expr
    unit = device.unit_layer_index
    staged = tuple(t.name for t in expr.inputs) if program.cached[unit] else ()
    deep = pipelined(program, device)
    lanes = warp_lanes(program, device)
    runs = bool(lanes) and _whole_runs(program, device)
    # split-K's partial sums are written back by their own template, one element at a time, and
    # a fused output (a conv's GEMM view: NCHW, not its view's [M, N]) by its copy block
    fused = any(axis.fused_from for axis in expr.axes)
    vectors = runs and not program.vthreads and program.split <= 1 and not fused
    return GpuPlan(staged, 2 if deep else 1, deep and register_prefetch(program, device),
                   pipelined_axis(program, device) if deep else None, cross_thread_axis(expr, device),
                   mma_axes(expr, device), program.split, program.vthreads or store_vthreads(program, device, runs),
                   lanes, vectors, kmajor_inputs(program, device))


# A warp's lanes along the output's contiguous axis where `warp_lanes` lays them out: 8 lanes
# reading 16 B each of a staged row are one 128 B shared-memory wavefront (32 banks x 4 B), and
# write 128 B of an output row, four whole 32 B sectors.
ROW_LANES = 8
# Elements of a thread's run along that axis (float32): one 16-byte vector, the widest access.
VECTOR_RUN = 4


def warp_lanes(program: RProgram, device: DeviceSpec) -> tuple[tuple[str, int], ...]:
    """How the first warp's lanes lie over a block's threads: ((u, W / 8), (v, 8)), a box of
    W / 8 rows of 8 threads, v the output's contiguous axis and u the spatial axis with threads
    next to it; () for the template's plain row-major order (the last axis fastest). Each k-step
    a thread of an r_u x r_v register tile reads r_u elements of the staged input along u (A's
    column of a matmul) and r_v along v (B's row); a warp of 32 threads along v reads its B row
    in r_v / 4 16-byte loads of 32 x 16 B, four wavefronts each, and each scalar load of A is
    one wavefront however few distinct words it reads: 8 + 8 = 16 wavefronts for 8 x 8's 64
    FMAs a warp, and the H200's shared memory serves one wavefront a cycle an SM against four
    warps' FMAs a cycle, so shared memory binds as much as the FMAs (M2 ran at 33 of 61
    TFLOP/s, docs/gpu.md). Laid as 4 x 8, the warp's B loads cover 128 B: 8 + 2 = 10 (M2's
    best of 5 17.5 -> 14.6 ms on the H200, M1 87 -> 79 us; docs/gpu.md). Only for
    a staged CUDA-core program with a reduction whose inputs read v contiguously or not at all
    (`streams`: matmul's A and B, not a conv's windows), more than 8 threads along v (8 or fewer
    are already rows of at most 8 lanes), and threads along u in whole multiples of W / 8. A
    conv seen as a GEMM (`ops.gemm_view`) is laid out over its view's (m, n): its k-major A
    and B both read 16 bytes a lane, 4 + 4 wavefronts for 8 x 8."""
    expr, warp = program.expr, device.warp_size
    staged = program.cached[device.unit_layer_index]
    v = _streamed_row(expr, device)
    if v is None or warp % ROW_LANES or not expr.reduce or not staged:
        return ()
    threads = {a: program.unit_tile[a] // program.register_tile[a] for a in expr.spatial}
    others = [a for a in expr.spatial if a != v and threads[a] > 1]
    if threads[v] <= ROW_LANES or threads[v] % ROW_LANES or not others or threads[others[-1]] % (warp // ROW_LANES):
        return ()
    return ((expr.axes[others[-1]].name, warp // ROW_LANES), (expr.axes[v].name, ROW_LANES))


def kmajor_inputs(program: RProgram, device: DeviceSpec) -> tuple[str, ...]:
    """Inputs of a staged CUDA-core program stored in shared memory transposed, [K, M]: a conv
    seen as a GEMM (`ops.gemm_view`) has A[m, k] with m the output pixels fused from (n, h, w);
    stored [m][k], a thread's register tile of A (8 pixels at one k) is 8 scalar loads each k-step
    (one shared-memory wavefront each); stored [k][m], unpadded, two 16-byte loads, the lanes of
    a warp all on one row (conflict-free whatever the row's length), and the gather, consecutive
    threads on consecutive pixels, writes the row in order (`codegen.cuda_conv`). The model
    keeps tiling the view's A as [M, K] (its traffic and footprint are the same bytes); its
    wavefronts (`model.gpu.shared_wavefronts`) read the transposed layout."""
    expr = program.expr
    staged = program.cached[device.unit_layer_index]
    if not device.lanes_are_threads or not staged or mma_axes(expr, device) is not None:
        return ()
    if len(expr.inputs) != 2 or len(expr.spatial) != 2 or len(expr.reduce) != 1:
        return ()  # not GEMM-shaped, as the view is
    out = []
    for tensor in expr.inputs:
        dims = [[a for a, c in enumerate(coeffs) if c] for coeffs, _ in tensor.index]
        if len(dims) == 2 and all(len(d) == 1 for d in dims):
            m, k = dims[0][0], dims[1][0]
            if expr.axes[m].kind == "spatial" and expr.axes[m].fused_from and expr.axes[k].kind == "reduce":
                out.append(tensor.name)
    return tuple(out)


def store_vthreads(program: RProgram, device: DeviceSpec, runs: bool = False) -> tuple[tuple[str, int], ...]:
    """Virtual threads that make a GPU program's register-tile write-back coalesced, for a
    program whose construction set none: along the output's contiguous axis `v`, a thread's r
    elements are interleaved across the block's threads along `v` (Gensor's setVthread with V =
    r), so that each of the template's scalar stores (TVM writes the register tile back one
    element at a time) has a warp's lanes on consecutive elements, whole 32 B sectors, rather
    than r elements apart (a 64K x 1024 output of 8 x 8 register tiles was written at 470 GB/s
    of the H200's 4.25 TB/s so). Where a warp is laid out in rows of 8 lanes (`warp_lanes`) and
    the tiles allow (`runs`: `_whole_runs`), in runs of `VECTOR_RUN` instead (V = r / 4, none
    for r = 4): each run is one 16-byte load of B from shared memory and, where the plan stores
    vectors (`GpuPlan.vector_stores`), one 16-byte store, 8 lanes' runs a whole 128 B row. Only
    where `_whole_runs` holds: r > 1, at least two threads along `v`, every input reading `v`
    reading it as its contiguous axis (`streams`) or not at all (matmul's B[k, j]: a lane's
    fragment reads from shared memory become consecutive across the warp, conflict-free; not a
    conv's windowed input), on CUDA cores (not tensor-core fragments, not a cross-thread
    reduction, whose block writes one output) and blocks that tile the output exactly; else
    none."""
    if not _whole_runs(program, device, 1):
        return ()
    v = vector_axis(program.expr)
    reg = program.register_tile[v]
    if runs:
        return ((program.expr.axes[v].name, reg // VECTOR_RUN),) if reg > VECTOR_RUN else ()
    return ((program.expr.axes[v].name, reg),)


def _whole_runs(program: RProgram, device: DeviceSpec, run: int = VECTOR_RUN) -> bool:
    """Whether a GPU program's write-back can be cut into runs of `run` elements along the
    output's contiguous axis `v`, each a whole run of every thread's register tile, all starting
    at multiples of `run` (so that a 16-byte store is aligned): `store_vthreads`'s conditions,
    with r and v's extent multiples of `run`."""
    expr = program.expr
    v = _streamed_row(expr, device)
    if v is None:
        return False
    reg, block = program.register_tile[v], program.unit_tile[v]
    if reg <= 1 or block % reg or block // reg < 2 or reg % run or expr.axes[v].extent % run:
        return False
    # guarded tails: r replicated bodies made ptxas spill (M0's 96-row blocks, sm_90a, V = 8);
    # runs of 4 replicate the body r / 4 times, and a tail along another axis guards whole runs
    guarded = [a for a in expr.spatial if expr.axes[a].extent % program.unit_tile[a]]
    return not guarded if run < VECTOR_RUN else v not in guarded


def _streamed_row(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The output's contiguous axis v where the CUDA-core templates may lay a warp and its
    write-back along it (`warp_lanes`, `_whole_runs`): a spatial axis every input reads as its
    contiguous one or not at all (`streams`), on CUDA cores (not tensor-core fragments, not a
    cross-thread reduction, whose block writes one output); else None."""
    if not device.lanes_are_threads or mma_axes(expr, device) is not None or cross_thread_axis(expr, device) is not None:
        return None
    v = vector_axis(expr)
    if v is None or expr.axes[v].kind != "spatial" or not all(streams(t, v) for t in expr.inputs):
        return None
    return v


def loop_nest_key(program: RProgram, device: DeviceSpec) -> tuple:
    """What of `program`'s tiles its loop nest depends on: two programs with the same key (and
    virtual threads) compile to one kernel, so a construction emits it once
    (`construct.policy.Policy.emit`). On a CPU, an L1 tile that holds a single register tile
    along every spatial axis runs its K-steps right around the register tile's (in
    `codegen/cpu._loop_order`'s `R(n-2) S(n-1) R(n-1)`, `S(n-1)` has one iteration), so its
    reduction extents only split one loop in two and are left out of the key (None). They stay
    where the plan says they decide something: direct stores after the whole reduction in the
    L1 tile (another loop order), panels packed at the L1 tile, and which inputs are packed
    (`panels._panel_pays` reads the L1 tile's span). GPU programs: their tiles. (Evidence that
    such L1 tiles compile to one kernel: docs/evidence.md#loop-nest-key.)"""
    tiles = program.tiles
    expr = program.expr
    if not device.runs_on_cpu or len(tiles) < 3 or any(tiles[1][a] != tiles[0][a] for a in expr.spatial):
        return tiles
    plan = cpu_plan(program, device)
    if plan.direct_stores or (plan.packed and plan.pack_layer == 1):
        return tiles
    reduce = set(expr.reduce)
    l1 = tuple(None if a in reduce else extent for a, extent in enumerate(tiles[1]))
    return (tiles[0], l1, *tiles[2:], plan.packed)


def describe(plan: Plan, program: RProgram) -> str:
    """The plan in words, for the Candidates table and the Kernel page
    ("A, B packed in 6x16 panels, lanes along j, tails padded, accumulators: registers")."""
    expr = program.expr
    axis = lambda a: expr.axes[a].name  # noqa: E731
    if isinstance(plan, GpuPlan):
        parts = ["tensor cores" if plan.mma_axes else "CUDA cores"]
        parts.append(f"{', '.join(plan.staged)} staged in shared memory" if plan.staged else "nothing staged")
        if plan.kmajor:
            parts.append(f"{', '.join(plan.kmajor)} k-major")
        if plan.pipelined:
            parts.append("double-buffered" + (" through registers" if plan.register_prefetch else " (cp.async)"))
        if plan.cross_thread_axis is not None:
            parts.append(f"threads across {axis(plan.cross_thread_axis)}")
        if plan.split > 1:
            parts.append(f"split-K x{plan.split}")
        if plan.vthreads:
            parts.append("vthreads " + ", ".join(f"{a}x{v}" for a, v in plan.vthreads))
        if plan.warp_lanes:
            parts.append("warps of " + " x ".join(f"{n} {a}" for a, n in plan.warp_lanes) + " lanes")
        if plan.vector_stores:
            parts.append(f"outputs stored {VECTOR_RUN} at a time")
        return ", ".join(parts)
    reg = program.register_tile
    shape = "x".join(str(reg[a]) for a in expr.spatial) or "1"
    if plan.path == SCALAR:
        parts = ["scalar row" + (" (a guarded tail)" if plan.guarded_row else "")]
    elif plan.path == LANES:
        parts = [f"lanes along the reduction {axis(plan.vector_axis)}"]
    elif plan.path == FILTERS:
        parts = [f"filters {axis(plan.vector_axis)} as lanes"]
        if plan.padded_filters:
            parts.append("filters padded")
    else:
        parts = [f"lanes along {axis(plan.vector_axis)}"]
    if program.in_place and not plan.packed:
        parts.insert(0, "inputs read in place, not padded")
    if plan.packed:
        ahead = f" ({', '.join(plan.prepacked)} once, before the calls)" if plan.prepacked else ""
        rows = f" ({', '.join(plan.transposed_in_panels)} from its rows as stored)" if plan.transposed_in_panels else ""
        parts.insert(0, f"{', '.join(plan.packed)} packed in {shape} panels{ahead}{rows}")
    first = [name for name in expr.transposed if name not in plan.transposed_in_panels]
    if first:
        parts.append(f"{', '.join(first)} copied transposed before the loop nest")
    if plan.padded_tails:
        edges = ", ".join(expr.axes[a].name for a in plan.edge_axes)
        parts.append("tails padded" + (f" but {edges}'s, whose edge tiles split off, guarded" if edges else ""))
    elif plan.split_edges:
        parts.append("edge tiles split off" + (
            ", guarded" if plan.path == FILTERS else ", their whole vectors vectorised" if plan.edge_vectors
            else ", in whole vectors" if plan.edge_in_vectors else ", scalar"))
    if plan.split_others:  # never beside padded tails
        parts.append(("the outputs' " if plan.split_edges else "") + "edge tiles split off, guarded")
    elif not (plan.padded_tails or plan.split_edges) and any(
            expr.axes[a].extent % program.unit_tile[a] for a in plan.guarded_axes(expr)):
        parts.append("tails guarded")
    if plan.staged_padding and padded_inputs(expr):
        parts.append("border copied per " + {PAD_STEP: "reduction step", 1: "L1 tile"}.get(plan.pad_level, "unit tile"))
    if plan.accumulators:
        parts.append(f"accumulators: {plan.accumulators}" + (", stack-allocated" if plan.stack_accumulators else ""))
    if plan.split > 1:
        parts.append(f"split-K x{plan.split} over the cores, the parts summed on one")
    return ", ".join(parts)
