"""Memory traffic Q and footprint F of an rTile (Roller §3.1, §3.3), exact from the expression.

Running the whole operator in tiles of shape T (one size per axis):
- every input tensor is loaded once per tile of the full iteration space (spatial and reduce);
  a tensor that does not depend on an axis is loaded again for each tile along it, which is
  exactly the reuse that growing that axis buys;
- the output is stored once per spatial tile (partial sums stay in the faster layer).
Tiles that overhang an axis are padded: a padded tile moves a whole data tile (Roller pads in the
upper layers), so padding waste shows up in Q.

`TileCalculus` memoises per tile: construction asks for the same tiles many times.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, prod
from typing import Sequence

from workbench.ops.tensor_expr import TensorExpr

Tile = tuple[int, ...]


def bank_padding(n_big: int, n_small: int, banks: int, bank_width: int) -> int:
    """Roller §3.1 memory-bank rule: padding (elements) of a stored leading dimension.

    A data tile with leading dimension N, read by an upper-layer tile with leading dimension n,
    is stored as N + pad with pad = (B*L - N % (B*L) + L*ceil(n/L)) % (B*L), B banks of L
    elements each, so that consecutive rows start in different banks.
    """
    if banks <= 0 or bank_width <= 0:
        return 0
    row = banks * bank_width
    return (row - n_big % row + bank_width * ceil(n_small / bank_width)) % row


class TileCalculus:
    """Q, F and data tiles of one TensorExpr, memoised per tile shape (and padding, lines)."""

    def __init__(self, expr: TensorExpr):
        self.expr = expr
        self.extents = expr.extents
        self._spatial = expr.spatial
        self._shapes: dict[Tile, tuple[tuple[int, ...], ...]] = {}
        self._traffic: dict[tuple[Tile, int, frozenset[int]], int] = {}
        self._footprints: dict[tuple, int] = {}
        self._dims = tuple(tuple(zip(t.terms, t.shape)) for t in expr.tensors)  # `data_tiles`
        self._itemsizes = tuple(t.itemsize for t in expr.tensors)

    def data_tiles(self, tile: Tile) -> tuple[tuple[int, ...], ...]:
        """Data-tile shape of every tensor (inputs then output) for one tile: per dimension
        `TensorExpr.data_tile_shape`'s bounding box, `1 + sum(|c_a| (t_a - 1))` clipped to the
        extent, written out in loops (construction asks for thousands of new tiles)."""
        shapes = self._shapes.get(tile)
        if shapes is None:
            out = []
            for dims in self._dims:
                shape = []
                for terms, extent in dims:
                    n = 1
                    for a, c in terms:
                        n += c * (tile[a] - 1)
                    shape.append(n if n < extent else extent)
                out.append(tuple(shape))
            shapes = self._shapes[tile] = tuple(out)
        return shapes

    def num_tiles(self, tile: Tile) -> int:
        n = 1
        for e, t in zip(self.extents, tile):
            n *= -(-e // t)  # ceil(e / t) in integers
        return n

    def spatial_tiles(self, tile: Tile) -> int:
        """Number of tiles over the spatial axes: the scale-out grid of a unit tile."""
        n, extents = 1, self.extents
        for a in self._spatial:
            n *= -(-extents[a] // tile[a])
        return n

    def traffic_bytes(self, tile: Tile, line: int = 0, in_lines: frozenset[int] = frozenset()) -> int:
        """Q(T): bytes moved between a layer and the one below when the op runs in tiles T;
        the inputs numbered in `in_lines` count the whole lines of `line` bytes their data
        tiles touch (`input_bytes`)."""
        key = (tile, line, in_lines)
        q = self._traffic.get(key)
        if q is None:
            shapes = self.data_tiles(tile)
            loads = self.num_tiles(tile) * sum(self.input_bytes(shapes, line, in_lines))
            stores = self.spatial_tiles(tile) * prod(shapes[-1]) * self._itemsizes[-1]
            q = self._traffic[key] = loads + stores
        return q

    def compulsory_bytes(self) -> int:
        """The operator's tensors, every one once: Q of the whole operator as one tile."""
        return self.traffic_bytes(tuple(self.extents))

    def input_bytes(self, shapes, line: int = 0, in_lines: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """Bytes of each input's data tile (`shapes` from `data_tiles`); for the inputs numbered
        in `in_lines` (with `line` > 0) the whole cache lines it touches: the tile is runs of
        contiguous elements (its innermost dimension narrower than the tensor's, with every
        dimension inside it whole), each rounded up to lines. A conv's data tile of 128
        channels x 7 rows x 1 column is 896 runs of one float: 3.5 KiB of data in 56 KiB of
        lines, more than an L1 of 48 KiB holds. (An input the CPU template streams in vectors,
        packed into panels or read along its contiguous axis, loses nothing to lines.)"""
        sizes = self._itemsizes
        if line <= 0 or not in_lines:
            return tuple([prod(shapes[t]) * sizes[t] for t in range(len(sizes) - 1)])
        out = []
        for t, (shape, tensor) in enumerate(zip(shapes, self.expr.inputs)):
            size = tensor.itemsize
            if t not in in_lines:
                out.append(prod(shape) * size)
                continue
            inner = next((d for d in reversed(range(len(shape))) if shape[d] < tensor.shape[d]), 0)
            run = prod(shape[inner:]) * size
            out.append(prod(shape[:inner]) * ceil(run / line) * line)
        return tuple(out)

    def sweep(self, tile: Tile, upper: Tile) -> tuple[Tile, Tile] | None:
        """(resident, swept): what one cache tile's walk inside the tile above it keeps and
        shares, for the CPU loop order `S R` per layer (`codegen/cpu.py`: the spatial loops in
        axis order, then the reduction loops).

        `resident` is `tile` with its reduce axes at `upper`'s sizes: everything one iteration
        of the innermost spatial loop that steps (the last spatial axis with `upper` > `tile`)
        touches, over all the reduction steps inside `upper`. `swept` is `resident` with that
        axis at `upper`'s size as well: the whole run of neighbours. Where `resident` stays in
        the layer, the next neighbour finds what it shares with the previous one there (inputs
        that ignore the axis, the halo of a window), so the layer loads `traffic_bytes(swept)`
        from below rather than `traffic_bytes(tile)`, which reloads every tile. None when no
        spatial loop steps inside `upper`."""
        step = next((a for a in reversed(self._spatial) if upper[a] > tile[a]), None)
        if step is None:
            return None
        reduce = set(self.expr.reduce)
        resident = tuple(u if a in reduce else t for a, (t, u) in enumerate(zip(tile, upper)))
        swept = resident[:step] + (upper[step],) + resident[step + 1 :]
        return resident, swept

    def accumulator_bytes(self, tile: Tile, upper: Tile, lanes: int = 1) -> int:
        """Bytes the accumulators of register tiles `tile` move when they leave the registers
        after every reduction step of the tile above them (`upper`) and come back for the next:
        a store and a load of the output tile per step after the first, per register tile.
        Roller's Q counts one store per spatial tile (partial sums stay in the faster layer),
        which holds for a GPU thread's registers over the whole K loop; the CPU template keeps a
        register tile's vector accumulators only over one L1 tile's K-steps (the loop order
        `S1 R1 | S2 R2 | registers`), so an L1 K tile of 16 on a 512-deep K moves the whole output
        through L1 31 more times. `lanes`: partial sums per output element (a micro-kernel
        vectorised along a reduce axis keeps a vector of them each: `registers.partial_sums`).
        0 without reduction steps above."""
        steps = prod(ceil(self.extents[a] / upper[a]) for a in self.expr.reduce)
        if steps <= 1:
            return 0
        out = prod(self.data_tiles(tile)[-1]) * self.expr.tensors[-1].itemsize * lanes
        return 2 * (steps - 1) * out * self.spatial_tiles(tile)

    def accumulator_reuse(self, register: Tile, tile: Tile, grown: Tile, lanes: int = 1, with_output: bool = True) -> float:
        """The accumulator trips (`accumulator_bytes` of register tiles `register`) that growing
        the tile above them from `tile` to `grown` saves, per byte of footprint it adds: the
        term a CPU cache tile over a register micro-kernel adds to Roller's reuse score, whose
        Q stores the output once per spatial tile and so sees nothing gained by growing a
        reduce axis (the same denominator as `reuse_score`, unpadded: CPU caches have no
        banks). A 512^3 matmul, 6x16x1 registers under 6x16x16 -> 6x16x32: 2 x (31 - 15) trips
        of the output (padded to 516 rows) over 1,408 B of A and B."""
        dq = self.accumulator_bytes(register, tile, lanes) - self.accumulator_bytes(register, grown, lanes)
        df = self.footprint_bytes(grown, (), with_output) - self.footprint_bytes(tile, (), with_output)
        if df <= 0:
            return float("inf") if dq > 0 else 0.0
        return dq / df

    def footprint_bytes(self, tile: Tile, padding: Sequence[int] = (), with_output: bool = True, line: int = 0,
                        in_lines: frozenset[int] = frozenset()) -> int:
        """F(T): bytes one tile occupies; `padding[t]` extra elements on tensor t's leading dim;
        without padding, the inputs numbered in `in_lines` in the whole lines of `line` bytes
        they touch (`input_bytes`)."""
        key = (tile, tuple(padding), with_output, line, in_lines)
        total = self._footprints.get(key)
        if total is not None:
            return total
        shapes = self.data_tiles(tile)
        if line > 0 and in_lines:
            out = prod(shapes[-1]) * self.expr.tensors[-1].itemsize if with_output else 0
            total = sum(self.input_bytes(shapes, line, in_lines)) + out
        else:
            count = len(shapes) if with_output else len(shapes) - 1
            total, sizes = 0, self._itemsizes
            for t in range(count):
                shape = shapes[t]
                pad = padding[t] if t < len(padding) else 0
                elems = (prod(shape[:-1]) * (shape[-1] + pad) if pad else prod(shape)) if shape else 1
                total += elems * sizes[t]
        self._footprints[key] = total
        return total

    def padded_volume(self, tile: Tile) -> int:
        """Iteration points actually computed when every axis is padded up to whole tiles."""
        return prod(ceil(e / t) * t for e, t in zip(self.extents, tile))

    def reuse_score(self, tile: Tile, grown: Tile, padding=(), grown_padding=(), with_output=True) -> float:
        """Roller's data-reuse score S = (Q(T) - Q(T')) / (F(T') - F(T)); larger is better."""
        dq = self.traffic_bytes(tile) - self.traffic_bytes(grown)
        df = self.footprint_bytes(grown, grown_padding, with_output) - self.footprint_bytes(tile, padding, with_output)
        if df <= 0:
            return float("inf") if dq > 0 else 0.0
        return dq / df


@lru_cache(maxsize=16)
def calculus(expr: TensorExpr) -> TileCalculus:
    """The one TileCalculus of `expr`, so that everything asking about the same expression
    (construction, the model, faces) shares its memo."""
    return TileCalculus(expr)
