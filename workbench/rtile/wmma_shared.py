"""Shared memory one block of the WMMA template (`codegen.cuda_mma`) allocates: what the
construction counts at the shared layer for a program that template builds. Pure: no TVM.

Roller's footprint of a shared tile is its input data tiles with bank padding
(`rprogram.storage_padding`). The WMMA template allocates other buffers:
- each input tile with its rows padded to an odd number of 16-byte groups (`row_alignment`:
  a WMMA fragment load reads 8 rows of 16 bytes at a time), A stored as [.., i, k] whatever its
  global layout (its copy transposes a `[.., k, i]` A), B in its own layout;
- where the output is padded (an extent its block tile does not divide), the block's output
  tile in shared memory too, rows padded the same way: the accumulators are stored there and
  copied out under a guard. TVM 0.27 gives it its own allocation next to the input tiles (a
  float16 matmul 4096^3 in 128 x 192 x 16 blocks on the A100: 2 x (128 x 24 + 16 x 200) x 2 B
  double-buffered inputs + 128 x 200 x 2 B output = 76,288 B, `gpu_resources` of the lowered
  kernel), 2.5x the 12 KiB of bank-padded input tiles the footprint counted before.
Pipelining doubles the input tiles (`rtile.staging`, STAGES x this footprint; the output's share
is counted twice there, which only errs towards not pipelining).
"""

from __future__ import annotations

from math import prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import mma_axes

# A WMMA load reads its fragment 8 rows of 16 bytes at a time; a row stride of an odd number of
# 16-byte groups puts those 8 rows in 8 different 16-byte groups of the 128-byte bank row (and
# keeps every row 16-byte aligned, as `load_matrix_sync`'s ldm and vector copies need).
BANK_GROUP_BYTES = 16


def row_alignment(itemsize: int) -> tuple[int, int]:
    """`storage_align` (factor, offset): rows an odd number of 16-byte groups long."""
    group = BANK_GROUP_BYTES // itemsize
    return 2 * group, group


def aligned_row(row: int, itemsize: int) -> int:
    """Elements one shared row of `row` elements takes under `row_alignment`: TVM's
    `storage_align` rounds the stride up to the next value that is `offset` modulo `factor`."""
    factor, offset = row_alignment(itemsize)
    return row + (offset - row) % factor


def takes_wmma(expr: TensorExpr, device: DeviceSpec) -> bool:
    """Whether the WMMA template takes `expr` on `device` (the expression's side of
    `cuda_mma.unsupported`, which also needs the program to stage its inputs in shared memory
    and warp tiles of whole fragments): tensor cores apply, a cuda target, float16 tensors, no
    fused axes, every tensor indexed by plain axes."""
    if mma_axes(expr, device) is None or device.target_dict().get("kind") != "cuda":
        return False
    if any(t.dtype != "float16" for t in expr.tensors) or any(a.fused_from for a in expr.axes):
        return False
    return all(plain_dims(t) is not None for t in expr.tensors)


def plain_dims(access) -> tuple[int, ...] | None:
    """The axis indexing each dimension, when each is one axis with coefficient 1 and no offset."""
    out = []
    for coeffs, const in access.index:
        used = [a for a, c in enumerate(coeffs) if c]
        if const or len(used) != 1 or coeffs[used[0]] != 1:
            return None
        out.append(used[0])
    return tuple(out)


def wmma_shared_bytes(expr: TensorExpr, device: DeviceSpec, tile) -> int | None:
    """Shared bytes one block of block tile `tile` allocates in the WMMA template, single
    buffered (module docstring); None where the template does not take `expr` (`takes_wmma`)."""
    if not takes_wmma(expr, device):
        return None
    i, j, k = mma_axes(expr, device)
    total = 0
    for t in expr.inputs:
        dims = plain_dims(t)
        row = k if t.uses_axis(i) else dims[-1]  # A's copy stores [.., i, k]
        total += _rows_bytes(dims, row, tile, t.itemsize)
    if any(expr.axes[a].extent % tile[a] for a in expr.spatial):  # pad_einsum grows the output
        out = expr.output
        total += _rows_bytes(plain_dims(out), j, tile, out.itemsize)
    return total


def _rows_bytes(dims: tuple[int, ...], row: int, tile, itemsize: int) -> int:
    """Bytes of a block tile over axes `dims` stored as rows along axis `row`, rows aligned."""
    rows = prod(tile[d] for d in dims if d != row)
    return rows * aligned_row(tile[row], itemsize) * itemsize
