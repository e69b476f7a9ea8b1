"""A grouped convolution with its groups as a dimension of every tensor, for CPUs.

After `tensor_expr.split_div_mod` a grouped conv's axes are (n, g, f, y, x, c, r, s): the group g
and the filter f within it, but its tensors still index one channel dimension with both, the
output and the filters `g * F/G + f`, the data `g * C/G + c`. No axis then indexes the output's
channels alone, so the CPU template finds no filter axis to run its lanes along
(`rtile.axes.filter_axis`) and the nest runs scalar: AlexNet's two-group 5x5 conv (256 filters
over 26 x 26) ran 18x ONNX Runtime's time so, ShuffleNet's grouped 1x1 convs 2x. Split every
such dimension in two, `[.., G, F/G, ..]` and `[.., G, C/G, ..]`, and each dimension is one
axis again: the data is read as (n, g, c, y + r, x + s), the filters as (g, f, c, r, s), the
output as (n, g, f, y, x). The group is then a spatial axis like a batch, f the filter axis, and
a pointwise grouped conv a batched GEMM over its pixels (`ops.pixel_gemm` applies on top).

Row-major buffers need no copy for it: (.., C, ..) *is* (.., G, C/G, ..). `group_view`
rewrites the PrimFunc (TensorIR `transform_layout` on every buffer with such a dimension, the
producers' and epilogues' channel iterators split alike with `transform_block_layout`, so a
padding copy, a bias or a ReLU follow the same channels), and `pixel_gemm.with_call_shapes`
gives the compiled kernel the caller's buffers back, over the same memory.
"""

from __future__ import annotations

from dataclasses import replace

from workbench.ops.tensor_expr import SPATIAL, TensorAccess, TensorExpr

# A split: dimension `dim` of a tensor, indexed by `group * k + inner`, becomes (group, inner).
Split = tuple[int, int, int, int]  # (dim, group axis, inner axis, k)


def group_view(expr: TensorExpr) -> TensorExpr | None:
    """The group view of `expr` (module docstring), None where no output dimension mixes a
    group with a channel, or TVM cannot re-lay out one of its blocks (then it is constructed
    as it is). A pure function of the expression; where `expr` has a PrimFunc, the view carries
    the rewritten one, and its `args` stay the caller's."""
    splits = _splits(expr)
    if splits is None:
        return None
    view = replace(expr, tensors=tuple(_split_tensor(t, s) for t, s in zip(expr.tensors, splits)))
    if expr.func is None:
        return view
    try:
        return replace(view, func=_rewrite(expr.func, expr.main_block))
    except Exception:  # a block TVM cannot re-lay out (a proof it cannot make): no view
        return None


def _splits(expr: TensorExpr) -> tuple[tuple[Split, ...], ...] | None:
    """Per tensor, its dimensions indexed by a spatial group axis times k plus an axis of
    extent k (offset 0); None unless the expression reduces, has no fused axis, and both its
    output and one of its inputs have such a dimension."""
    if not expr.reduce or any(a.fused_from for a in expr.axes):
        return None
    found = tuple(tuple(s for d in range(len(t.index)) if (s := _digit_pair(expr, t, d)) is not None)
                  for t in expr.tensors)
    if not found[-1] or not any(found[:-1]):
        return None
    return found


def _digit_pair(expr: TensorExpr, tensor: TensorAccess, dim: int) -> Split | None:
    coeffs, const = tensor.index[dim]
    found = _group_and_inner(coeffs, const, [a.extent for a in expr.axes])
    if found is None or expr.axes[found[0]].kind != SPATIAL:
        return None
    group, inner = found
    k = coeffs[group]
    return (dim, group, inner, k) if tensor.shape[dim] % k == 0 else None


def _group_and_inner(coeffs, const: int, extents) -> tuple[int, int] | None:
    """(group, inner) where the index `coeffs . axes + const` is `group * k + inner` with k the
    inner axis's extent (the two digits of one split axis); else None."""
    used = [a for a, c in enumerate(coeffs) if c]
    if const or len(used) != 2:
        return None
    inner = next((a for a in used if coeffs[a] == 1), None)
    group = next((a for a in used if a != inner), None)
    if inner is None or group is None or coeffs[group] != extents[inner]:
        return None
    return group, inner


def _split_tensor(tensor: TensorAccess, splits: tuple[Split, ...]) -> TensorAccess:
    if not splits:
        return tensor
    at = {s[0]: s for s in splits}
    shape, index = [], []
    for d, (size, (coeffs, const)) in enumerate(zip(tensor.shape, tensor.index)):
        if d not in at:
            shape.append(size)
            index.append((coeffs, const))
            continue
        _, group, inner, k = at[d]
        shape += [size // k, k]
        index += [(tuple(int(a == group) for a in range(len(coeffs))), 0),
                  (tuple(int(a == inner) for a in range(len(coeffs))), 0)]
    return replace(tensor, shape=tuple(shape), index=tuple(index))


def _rewrite(func, main_block: str):
    """`func` with every buffer dimension the main block indexes `g * k + inner` split in two,
    and the same split carried to the blocks before and after it (through the iterators that
    index those dimensions alone)."""
    import tvm
    from tvm import s_tir
    from tvm.tirx import IndexMap

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    handles = list(sch.get_child_blocks(sch.get_sblock("root")))
    blocks = {str(sch.get(h).name_hint): h for h in handles}
    main = sch.get(blocks[main_block])
    variables = [iv.var for iv in main.iter_vars]
    extents = [int(iv.dom.extent) for iv in main.iter_vars]
    # buffer name -> {dim: k}, first from the main block's own indices
    dims: dict[str, dict[int, int]] = {}
    for region in list(main.reads) + list(main.writes):
        for d, r in enumerate(region.region):
            k = _group_factor(r.min, variables, extents)
            if k:
                dims.setdefault(str(region.source.name), {})[d] = k
    # then through the other blocks: an iterator indexing a split dimension alone is split too,
    # and so is every other dimension it indexes alone
    iters: dict[str, dict[int, int]] = {}
    changed = True
    while changed:
        changed = False
        for name, handle in blocks.items():
            if name == main_block:
                continue
            block = sch.get(handle)
            own = [iv.var for iv in block.iter_vars]
            # (buffer, dimension, the iterator indexing it alone or None)
            regions = [(str(r.source.name), d, next((i for i, v in enumerate(own) if v.same_as(x.min)), None))
                       for r in list(block.reads) + list(block.writes) for d, x in enumerate(r.region)]
            for buffer, d, at in regions:
                k = dims.get(buffer, {}).get(d)
                if at is not None and k and iters.setdefault(name, {}).get(at) != k:
                    iters[name][at], changed = k, True
            for buffer, d, at in regions:
                k = iters.get(name, {}).get(at) if at is not None else None
                if k and dims.setdefault(buffer, {}).get(d) != k:
                    dims[buffer][d], changed = k, True
    # the iterators first: the buffers' split indices then simplify within the new iterators' ranges
    for name, found in iters.items():
        handle = blocks[name]
        n = len(sch.get(handle).iter_vars)
        dtype = str(sch.get(handle).iter_vars[0].var.ty)
        sch.transform_block_layout(handle, IndexMap.from_func(_split_map(found), ndim=n, index_dtype=dtype))
    done = set()
    for handle in handles:
        block = sch.get(handle)
        for kind, regions in (("read", block.reads), ("write", block.writes)):
            for i, region in enumerate(regions):
                name = str(region.source.name)
                if name in done or name not in dims:
                    continue
                dtype = str(region.region[0].min.ty) if region.region else "int64"
                split = IndexMap.from_func(_split_map(dims[name]), ndim=len(region.source.shape), index_dtype=dtype)
                sch.transform_layout(handle, (kind, i), split)
                done.add(name)
    return sch.mod["main"]


def _group_factor(index, variables, extents) -> int:
    """k where `index` is `g * k + inner` over two of `variables`, inner's extent k; else 0."""
    from tvm.sym import detect_linear_equation

    coeffs = detect_linear_equation(index, variables)
    if len(coeffs) != len(variables) + 1:
        return 0
    values = [int(c) for c in coeffs]
    found = _group_and_inner(values[:-1], values[-1], extents)
    return values[found[0]] if found is not None else 0


def _split_map(splits: dict[int, int]):
    """The index map splitting positions `splits` (position -> k) into (x // k, x % k)."""
    def index_map(*i):
        out = []
        for p, x in enumerate(i):
            out += [x // splits[p], x % splits[p]] if p in splits else [x]
        return tuple(out)
    return index_map
