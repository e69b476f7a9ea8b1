"""Exact shared-memory bank conflicts of one warp: the measure behind Gensor's vThread benefit.

Shared memory is `banks` banks of `bank_width` bytes; the word at byte address `a` is word
`a // bank_width` and lives in bank `word % banks`. A warp's access is served in as many
wavefronts as the most distinct words one bank must deliver (lanes reading the same word share
one broadcast): that count is the access's *conflict degree*, 1 when conflict-free.

Which address each lane reads follows from the thread binding of the CUDA template
(codegen/cuda.py): the threads of a block are laid over the spatial axes row-major (the last axis
fastest, as `threadIdx.x` fuses them) and the first `lanes` threads form the first warp, or, where
the plan lays a warp out as a box (`rtile.plan.warp_lanes`: 4 x 8 lanes), the first warp is that
box of the block's first threads along each axis. A thread
owns a run of `tile[a]` consecutive elements along axis `a`, or, with V virtual threads on that
axis, V runs of `tile[a] / V` elements, one in each of V equal strips of the block tile (TVM's
`vthread` split). The data tile is stored row-major with its leading dimension padded against
conflicts (Roller §3.1), and the tensor's affine index turns a lane's per-axis offsets into an
address: the "thread -> (row, col)" mapping of a 2-D tile is the special case of two dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Iterable, Sequence


@dataclass(frozen=True)
class ThreadBinding:
    """How a block's threads cover its tile, per axis (reduce axes: one thread)."""

    threads: tuple[int, ...]  # threads of the block along each axis
    tile: tuple[int, ...]  # elements one thread computes along each axis (its register tile)
    vthreads: tuple[int, ...]  # virtual threads along each axis (1 = none); each divides `tile`
    warp: tuple[int, ...] = ()  # a warp's lanes along each axis (`lane_coords`); () = row-major


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


@lru_cache(maxsize=4096)
def lane_coords(threads: tuple[int, ...], lanes: int, warp: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """Per-axis thread coordinates of the first `lanes` threads (fewer if the block is smaller),
    row-major with the last axis fastest; with `warp` (lanes along each axis, their product
    `lanes`) those of the box of `warp[a]` threads along each axis, row-major within it."""
    box = warp or threads
    out = []
    for lane in range(min(lanes, prod(box), prod(threads))):
        coord, rest = [], lane
        for n in reversed(box):
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
    """Conflict degree of one access: every lane of the first warp reads its `element` (a
    lane's offset is its own part, `coord * run` per axis, plus the element's, the same for
    every lane: `axis_offset`)."""
    weights = tile.axis_weights()
    shift = sum(w * axis_offset(0, n, s, v, e)
                for w, n, s, v, e in zip(weights, binding.threads, binding.tile, binding.vthreads, element) if w)
    bases = _lane_offsets(weights, tuple(binding.threads), tuple(binding.tile), tuple(binding.vthreads), lanes,
                          tuple(binding.warp))
    return conflict_degree(((b + shift) * tile.itemsize for b in bases), banks, bank_width)


@lru_cache(maxsize=4096)
def _lane_offsets(weights, threads, tile, vthreads, lanes: int, warp=()) -> tuple[int, ...]:
    """Each lane's own part of its offset (`access_degree`), for the first warp's lanes."""
    runs = [s // v for s, v in zip(tile, vthreads)]
    return tuple(sum(w * c * r for w, c, r in zip(weights, coord, runs) if w)
                 for coord in lane_coords(threads, lanes, warp))


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
    residue of the shift modulo the bank width, at one element with that residue. The shift is a
    sum over the axes, so the elements per residue are counted axis by axis (the residues of each
    axis's part combined), not element by element: a thread's tile has up to thousands."""
    weights, size = tile.axis_weights(), tile.itemsize
    found: dict[int, tuple[int, tuple[int, ...]]] = {0: (1, ())}  # residue -> (elements, one of them)
    for w, n, s, v in zip(weights, binding.threads, binding.tile, binding.vthreads):
        part: dict[int, tuple[int, int]] = {}  # this axis's residue -> (elements, the first)
        for e in range(s) if w else range(1):
            residue = w * axis_offset(0, n, s, v, e) * size % bank_width
            count, first = part.get(residue, (0, e))
            part[residue] = (count + 1, first)
        combined: dict[int, tuple[int, tuple[int, ...]]] = {}
        for r0, (c0, element) in found.items():
            for r1, (c1, e1) in part.items():
                r = (r0 + r1) % bank_width
                count, one = combined.get(r, (0, element + (e1,)))
                combined[r] = (count + c0 * c1, one)
        found = combined
    return sum(n * access_degree(tile, binding, one, banks, bank_width, lanes) for n, one in found.values())
