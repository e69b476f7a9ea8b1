"""Convolution as implicit GEMM on the CUDA cores: the schedule of a conv's GEMM view.

The construction tiles a conv on a GPU in its implicit-GEMM view (`ops.gemm_view`: M = N*OH*OW,
N = F, K = C*KH*KW). This template realises such a program without a new compute definition:
TensorIR's `reindex` gives the conv block's two reads and its write buffers indexed by the
block's own iterators (the read of `pad` becomes the im2col buffer [n, h, w, c, r, s]),
`transform_layout` lays them out as A[K, M] (k-major, unpadded: `rtile.plan.kmajor_inputs`),
B[K, N] and O[M, N], and `transform_block_layout` turns the 7-axis block into an (m, n, k)
matmul block (the reindex copy blocks too, so each of them iterates over a rectangle of its
matrix). From there the steps are the matmul template's
(`codegen.cuda`): every axis split into (grid, threads, register tile) or (shared steps,
register steps, register tile), grid and threads fused and bound, partial sums in registers.

The gather is the A reindex block itself, moved to shared memory and computed at the innermost
shared-step loop by the whole block (cooperative fetch); the `pad` block inlines into it, so the
padding is a predicate on the load and the input is read straight from the kernel's argument.
B's reindex block is staged the same way. The accumulator is the O reindex buffer in `local`
scope; its copy block writes the NCHW output from registers and absorbs the epilogues (bias,
relu, as ONNX import fuses them). Copy order: A is copied with m innermost (consecutive threads
take consecutive output pixels, i.e. consecutive input columns at stride 1, into consecutive
words of a shared row), B with k innermost (the weight's contiguous c, r, s); B's shared rows
are padded as the program's `padding` says (the footprint the model counted). Those column-wise
stores into shared memory may conflict where the padding does not spread them: the model does
not price that (docs/architecture.md).
"""

from __future__ import annotations

from workbench.codegen.common import (
    epilogue_names,
    inline_epilogues,
    new_schedule,
    primitive,
    producer_names,
)
from workbench.codegen.cuda import (
    _bank_alignment,
    _depth,
    _unroll_below,
    block_threads,
    check_gpu_program,
    fuse_threads,
    lane_program,
    pipeline_shared_copies,
    prefetch_in_registers,
    split_levels,
    within_block_limits,
)
from workbench.codegen.template import ScheduleError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.gemm_view import GemmView, view_of
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.plan import GpuPlan, gpu_plan
from workbench.rtile.rprogram import RProgram


def schedule_implicit_gemm(expr: TensorExpr, program: RProgram, device: DeviceSpec):
    """A `tvm.s_tir.Schedule` realising `program` (tiles over a GEMM-view expression's m, n, k);
    None when `expr` is no GEMM view (`ops.gemm_view.view_of`); ScheduleError when it cannot."""
    view = view_of(expr)
    if view is None:
        return None
    check_gpu_program(expr, program)
    program = lane_program(expr, program, device)
    threads = block_threads(expr, program, device)
    return within_block_limits(threads, lambda: gemm_schedule(view, program, device), device)


def gemm_schedule(view: GemmView, program: RProgram, device: DeviceSpec):
    """The schedule of `program` (already split over a warp's lanes) over the conv of `view`."""
    expr = view.expr
    sch = new_schedule(expr)
    producers, epilogues = producer_names(sch, expr), epilogue_names(sch, expr)
    main = sch.get_sblock(expr.main_block)
    plan = gpu_plan(program, device)
    a_copy, b_copy, writeback = _as_gemm(sch, main, view, plan.kmajor)
    grid_thread, steps, register = _tile(sch, main, expr, program, plan)
    primitive("keep the accumulator in registers", sch.set_scope, main, 0, "local")
    primitive("write back per thread", sch.reverse_compute_at, writeback, grid_thread)
    inline_epilogues(sch, epilogues)
    for t, copy in ((view.image, a_copy), (view.weight, b_copy)):
        primitive("stage a tile", sch.set_scope, copy, 0, "shared")
        primitive("stage a tile", sch.compute_at, copy, steps)
        kmajor = expr.tensors[t].name in plan.kmajor  # its rows: one k, unpadded
        align = None if kmajor else _bank_alignment(expr, program, device, t, expr.tensors[t].shape)
        _cooperative(sch, copy, steps, block_threads(expr, program, device), align, swap=not kmajor)
    if plan.pipelined:  # one reduce axis (k): its step loop is the one pipelined
        prefetch = plan.register_prefetch
        for copy in (a_copy, b_copy) if prefetch else ():
            prefetch_in_registers(sch, copy)
        pipeline_shared_copies(sch, steps, 2, prefetch)
    for name in reversed(producers):  # `pad` folds into the gather
        primitive(f"inline producer {name}", sch.compute_inline, sch.get_sblock(name))
    for loop in register:
        sch.unroll(loop)
    init = primitive("decompose the reduction", sch.decompose_reduction, main, steps)
    for block in (init, writeback):
        _unroll_below(sch, block, grid_thread)
    return sch


def _as_gemm(sch, main, view: GemmView, kmajor=()):
    """Re-lay the conv block out as the GEMM of `view`: (A copy, B copy, write-back) blocks; A
    as [K, M] where its name is in `kmajor` (the plan's)."""
    from tvm.tirx import IndexMap

    iter_vars = sch.get(main).iter_vars
    names = [str(iv.var.name).removeprefix("v_") for iv in iter_vars]
    extents = {name: int(iv.dom.extent) for name, iv in zip(names, iter_vars)}
    dtype = str(iter_vars[0].var.ty)
    groups = view.groups()
    reads = {view.image: "km" if view.expr.tensors[view.image].name in kmajor else "mk", view.weight: "kn"}
    weight = str(sch.get(main).reads[view.weight].source.name)
    if weight != view.expr.inputs[view.weight].name:  # the block reads its inputs in call order
        raise ScheduleError(f"block {view.expr.main_block} reads {weight} where the weight is expected")
    dims = {}  # buffer role -> the block iterators its reindex buffer is indexed by, in order
    for t in (0, 1):
        dims[t] = [n for n in names if _uses(sch.get(main).reads[t], n, iter_vars, names)]
    dims["out"] = [n for n in names if _uses(sch.get(main).writes[0], n, iter_vars, names)]

    def index_map(over, order):
        def fn(*index):
            value = dict(zip(over, index))
            out = []
            for g in order:
                flat = 0
                for name in groups[g]:  # an iterator a buffer's index drops has extent 1
                    flat = flat * extents[name] + value.get(name, 0)
                out.append(flat)
            return tuple(out)

        return IndexMap.from_func(fn, ndim=len(over), index_dtype=dtype)

    copies = {}
    for t in (0, 1):
        copies[t] = primitive("reindex an input", sch.reindex, main, ("read", t))
    writeback = primitive("reindex the output", sch.reindex, main, ("write", 0))
    for t in (0, 1):
        layout = index_map(dims[t], reads[t])
        primitive("lay an input out as a matrix", sch.transform_layout, main, ("read", t), layout)
        primitive("iterate the gather over the matrix", sch.transform_block_layout, copies[t], layout)
    layout = index_map(dims["out"], "mn")
    primitive("lay the output out as a matrix", sch.transform_layout, main, ("write", 0), layout)
    primitive("iterate the write-back over the matrix", sch.transform_block_layout, writeback, layout)
    primitive("fuse the conv block into (m, n, k)", sch.transform_block_layout, main, index_map(names, "mnk"))
    return copies[view.image], copies[view.weight], writeback


def _uses(region, name: str, iter_vars, names) -> bool:
    """Whether a buffer region of the conv block is indexed by the iterator called `name` as
    `reindex` sees it: a plain iterator index is kept whatever its extent, a compound one is
    simplified under the iterators' ranges first (a 1x1 window's `yy + ry`, ry of extent 1, is
    `yy`: that input's reindex buffer has no ry dimension, the weight's has)."""
    import tvm_ffi
    from tvm.sym import Analyzer
    from tvm.tirx import Var

    analyzer = Analyzer()
    for iv in iter_vars:
        analyzer.bind(iv.var, iv.dom)
    var = iter_vars[names.index(name)].var
    hits = []
    for rng in region.region:
        index = rng.min if isinstance(rng.min, Var) else analyzer.simplify(rng.min)
        tvm_ffi.structural_walk(index, (Var, lambda v: hits.append(v) if v.same_as(var) else None))
    return bool(hits)


def _tile(sch, main, expr: TensorExpr, program: RProgram, plan: GpuPlan):
    """Split m, n, k by their chains (m and n by the plan's virtual threads, the threads fused
    by its warp lanes); returns (thread loop, innermost shared step, register loops). Order:
    grid m, n; [vthreads;] threads m, n; k steps; k register steps; register tiles k, m, n
    (Roller's order, as `codegen.cuda` tiles a matmul)."""
    m, n, k = split_levels(sch, sch.get_loops(main), expr, program, dict(plan.vthreads))
    virtual = [*m[1:-2], *n[1:-2]]
    order = [m[0], n[0], *virtual, m[-2], n[-2], k[0], k[1], k[2], m[-1], n[-1]]
    sch.reorder(*order)
    names = [expr.axes[a].name for a in expr.spatial]
    grid, thread = sch.fuse(m[0], n[0]), fuse_threads(sch, [m[-2], n[-2]], names, plan.warp_lanes)
    sch.bind(grid, "blockIdx.x")
    if virtual:
        sch.bind(sch.fuse(*virtual), "vthread.x")
    sch.bind(thread, "threadIdx.x")
    return thread, k[0], (k[2], m[-1], n[-1])


def _cooperative(sch, copy, anchor, threads: int, align, swap: bool) -> None:
    """All threads of the block copy the staged tile, the input's contiguous dimension innermost
    (A: m, consecutive output pixels, row by row where it is stored [k, m], else column by
    column; B[k, n]: k, the weight's contiguous c, r, s, column by column: the two loops
    swapped, `swap`), fused, split over the threads; the shared rows padded as the program says
    (`align`: `codegen.cuda._bank_alignment`'s storage_align, None when unpadded). A unit loop
    `compute_at` dropped leaves one loop, copied as it is."""
    loops = sch.get_loops(copy)[_depth(sch, copy, anchor) :]
    if len(loops) == 2 and swap:
        loops = loops[::-1]
        sch.reorder(*loops)
    elif not loops:
        loops = [sch.add_unit_loop(copy)]
    if align is not None:
        sch.storage_align(copy, 0, 0, *align)
    _, thread = sch.split(sch.fuse(*loops), factors=[None, threads])
    sch.bind(thread, "threadIdx.x")

