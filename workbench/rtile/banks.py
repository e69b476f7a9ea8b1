"""Exact shared-memory bank conflicts of one warp: the measure behind Gensor's vThread benefit.

Shared memory is `banks` banks of `bank_width` bytes; the word at byte address `a` is word
`a // bank_width` and lives in bank `word % banks`. A warp's access is served in as many
wavefronts as the most distinct words one bank must deliver (lanes reading the same word share
one broadcast): that count is the access's *conflict degree*, 1 when conflict-free.

Which address each lane reads follows from the thread binding of the CUDA template
(codegen/cuda.py): the threads of a block are laid over the spatial axes row-major (the last axis
fastest, as `threadIdx.x` fuses them) and the first `lanes` threads form the first warp. A thread
owns a run of `tile[a]` consecutive elements along axis `a`, or, with V virtual threads on that
axis, V runs of `tile[a] / V` elements, one in each of V equal strips of the block tile (TVM's
`vthread` split). The data tile is stored row-major with its leading dimension padded against
conflicts (Roller §3.1), and the tensor's affine index turns a lane's per-axis offsets into an
address: the "thread -> (row, col)" mapping of a 2-D tile is the special case of two dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import prod
from typing import Iterable, Sequence


@dataclass(frozen=True)
class ThreadBinding:
    """How a block's threads cover its tile, per axis (reduce axes: one thread)."""

    threads: tuple[int, ...]  # threads of the block along each axis
    tile: tuple[int, ...]  # elements one thread computes along each axis (its register tile)
    vthreads: tuple[int, ...]  # virtual threads along each axis (1 = none); each divides `tile`


@dataclass(frozen=True)
class StoredTile:
    """A data tile in shared memory: per tensor dimension the coefficient of every axis (the
    tensor's affine index) and the stride in elements; `strides[-2]` is the leading-dimension
    length including the bank padding."""

    coeffs: tuple[tuple[int, ...], ...]
    strides: tuple[int, ...]
    itemsize: int

    def axis_weights(self) -> tuple[int, ...]:
        """Elements the address moves per step along each axis (the index is affine)."""
        n_axes = len(self.coeffs[0]) if self.coeffs else 0
        return tuple(sum(c[a] * s for c, s in zip(self.coeffs, self.strides)) for a in range(n_axes))


def stored_tile(coeffs: Sequence[Sequence[int]], shape: Sequence[int], pad: int, itemsize: int) -> StoredTile:
    """The row-major layout of a data tile of `shape` whose last dimension is padded by `pad`."""
    strides, step = [], 1
    for d in reversed(range(len(shape))):
        strides.append(step)
        step *= shape[d] + (pad if d == len(shape) - 1 else 0)
    return StoredTile(tuple(tuple(c) for c in coeffs), tuple(reversed(strides)), itemsize)


def axis_offset(coord: int, threads: int, size: int, vthreads: int, element: int) -> int:
    """Offset in the block tile, along one axis, of a thread's `element`-th element: thread
    `coord` of `threads` owns run `coord` of each of the `vthreads` strips (runs of size / V)."""
    run = size // vthreads
    return (element // run) * threads * run + coord * run + element % run


def lane_coords(threads: Sequence[int], lanes: int) -> tuple[tuple[int, ...], ...]:
    """Per-axis thread coordinates of the first `lanes` threads (fewer if the block is smaller),
    row-major with the last axis fastest."""
    out = []
    for lane in range(min(lanes, prod(threads))):
        coord, rest = [], lane
        for n in reversed(threads):
            coord.append(rest % n)
            rest //= n
        out.append(tuple(reversed(coord)))
    return tuple(out)


def conflict_degree(addresses: Iterable[int], banks: int, bank_width: int) -> int:
    """The most distinct bank words any one bank serves for these byte addresses."""
    per_bank: dict[int, set[int]] = {}
    for address in addresses:
        word = address // bank_width
        per_bank.setdefault(word % banks, set()).add(word)
    return max((len(words) for words in per_bank.values()), default=0)


def access_degree(tile: StoredTile, binding: ThreadBinding, element: Sequence[int], banks: int, bank_width: int, lanes: int = 32) -> int:
    """Conflict degree of one access: every lane of the first warp reads its `element`."""
    weights = tile.axis_weights()
    addresses = []
    for coord in lane_coords(binding.threads, lanes):
        offset = sum(
            w * axis_offset(c, n, s, v, e)
            for w, c, n, s, v, e in zip(weights, coord, binding.threads, binding.tile, binding.vthreads, element)
            if w
        )
        addresses.append(offset * tile.itemsize)
    return conflict_degree(addresses, banks, bank_width)


def requests(tile: StoredTile, binding: ThreadBinding) -> int:
    """Shared-memory load requests a warp issues for its threads' part of the tile: one per
    element a thread reads (axes the tensor ignores add none); `wavefronts` is at least this."""
    return prod(s for w, s in zip(tile.axis_weights(), binding.tile) if w)


def wavefronts(tile: StoredTile, binding: ThreadBinding, banks: int, bank_width: int, lanes: int = 32) -> int:
    """Shared-memory wavefronts the first warp needs to read its threads' part of the tile: the
    sum of the conflict degree over a thread's elements (axes the tensor ignores add nothing).

    A lane's offset along an axis is `coord * run` plus a part that depends on the element only
    (`axis_offset`), so moving to another element shifts every lane's address by the same amount;
    a shift by whole bank words only renames the banks. The degree is therefore computed once per
    residue of the shift modulo the bank width, at the first element with that residue."""
    weights = tile.axis_weights()
    ranges = [range(s) if w else range(1) for w, s in zip(weights, binding.tile)]
    first: dict[int, tuple[int, ...]] = {}
    count: dict[int, int] = {}
    for element in product(*ranges):
        shift = sum(w * axis_offset(0, n, s, v, e) for w, n, s, v, e in zip(weights, binding.threads, binding.tile, binding.vthreads, element) if w)
        residue = shift * tile.itemsize % bank_width
        first.setdefault(residue, element)
        count[residue] = count.get(residue, 0) + 1
    return sum(n * access_degree(tile, binding, first[r], banks, bank_width, lanes) for r, n in count.items())
