"""L2-friendly block order for the CUDA templates (CUDA cores and WMMA): grouped ordering of a 2-D output grid.

A contraction C[.., i, j] = sum_k A[.., i, k] * B[.., k, j] tiled into a grid of Gi x Gj blocks
launches them in the order of `blockIdx.x`. Row-major (the plain fusion of the grid loops) runs
a whole row of Gj blocks before the next: A's row panel is reused from L2 by consecutive blocks,
but every row reads all of B again, from DRAM once B no longer fits in L2. Grouped ordering runs
G block rows at a time column by column: block x is

    group = x // (G * Gj),  i = group * G + x % G,  j = (x // G) % Gj

so the G blocks of one column panel of B run back to back (each B panel read once per group, Gi
/ G times in all, instead of Gi), while the group's G row panels of A stay in L2 through the
group. It is the loop split i -> (i_outer, i_inner) of extent (Gi / G, G), reordered to
(i_outer, j, i_inner) before the grid loops are fused: a permutation of the blocks whenever G
divides Gi (`group_rows` only takes such G), so every block still runs exactly once and nothing
else of the schedule changes.

The group (our choice, in the spirit of the grouped orderings of GPU GEMM libraries): the largest
divisor G of Gi whose G row panels of A (block rows x the whole reduction) fill at most half the
L2 (`DeviceSpec.l2_bytes`), the other half left to the B panels streaming through and the output.
The rTile model does not credit it: its DRAM traffic already counts every block's tiles as read
from global memory, with no L2 reuse between blocks either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class BlockGroups:
    """Grouped block order over the grid loops of axes `rows` (i) and `cols` (j): `group` block
    rows at a time (`grid_rows` / `group` groups)."""

    rows: int
    cols: int
    group: int
    grid_rows: int
    grid_cols: int


def contraction_axes(expr: TensorExpr) -> tuple[int, int] | None:
    """(i, j) of a contraction C[.., i, j] += A[.., i, k] * B[.., k, j]: the axes that alone index
    the output's last two dimensions, i read by one input and j by another, neither by both,
    with a reduction; None for any other operator (elementwise, pooling, convolutions' windows)."""
    out = expr.output
    if not expr.reduce or len(out.index) < 2 or len(expr.inputs) != 2:
        return None
    found = []
    for coeffs, const in out.index[-2:]:
        used = [a for a, c in enumerate(coeffs) if c]
        if const or len(used) != 1 or coeffs[used[0]] != 1:
            return None
        found.append(used[0])
    i, j = found
    a, b = expr.inputs
    reads = [(t.uses_axis(i), t.uses_axis(j)) for t in (a, b)]
    if sorted(reads) != [(False, True), (True, False)]:
        return None
    return i, j


def group_rows(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> BlockGroups | None:
    """The grouped order of `program`'s grid (module docstring), or None where it changes nothing
    or does not apply: not a contraction, a grid of one row or one column, an L2 that holds fewer
    than two A row panels, or a spec without `l2_bytes`."""
    axes = contraction_axes(expr)
    if axes is None or not device.l2_bytes:
        return None
    i, j = axes
    block = program.unit_tile
    rows, cols = ceil(expr.axes[i].extent / block[i]), ceil(expr.axes[j].extent / block[j])
    if rows < 2 or cols < 2:
        return None
    reader = next(t for t in expr.inputs if t.uses_axis(i))
    panel_tile = tuple(x.extent if a in expr.reduce else block[a] for a, x in enumerate(expr.axes))
    panel = prod(expr.data_tile_shape(expr.tensors.index(reader), panel_tile)) * reader.itemsize
    room = device.l2_bytes // 2 // max(1, panel)
    group = max(g for g in range(1, rows + 1) if rows % g == 0 and g <= max(1, room))
    return BlockGroups(i, j, group, rows, cols) if group > 1 else None


def grouped_position(block: int, groups: BlockGroups) -> tuple[int, int]:
    """(i, j) grid position of launch index `block` under grouped order (the loop nest
    (i_outer, j, i_inner) fused, innermost fastest)."""
    inner = block % groups.group
    j = block // groups.group % groups.grid_cols
    outer = block // (groups.group * groups.grid_cols)
    return outer * groups.group + inner, j
