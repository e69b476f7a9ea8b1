"""rProgram: one rTile per memory layer plus the scale-out grid (Roller §3.2, Figure 6).

Layers are listed top (registers) first; each tile is a multiple of the one before it; the last
tile is the unit tile (one SM's thread block / one core's work item) and `grid` counts unit tiles
over the spatial axes. `cached[l]` is False where the program does not stage data in layer l
(Roller: operators without reuse build the top tile only and load straight from the bottom).
`vthreads` pairs a spatial axis with the virtual threads a GPU thread's tile is split into
(Gensor's setVthread). `split` > 1 (split-K) deals the steps of one reduce axis
(`split_axis`) over that many blocks per unit tile (on a CPU, that many cores), whose partial
sums a second pass adds; `grid` then counts every block launched (every work item a core
takes), `split` per spatial unit tile. `in_place` (CPU) reads the inputs as stored where the
unit tile leaves tails that the template would otherwise pad by copying them into panels: the
row's edges split off instead (`rtile.panels.reads_in_place`). A program carries its
expression, so the model and codegen need nothing beside it and the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Sequence

from workbench.frozen import hash_once
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.axes import cross_thread_axis, is_micro_kernel_layer, mma_axes, tile_lanes
from workbench.rtile.registers import micro_kernel_registers
from workbench.rtile.traffic import TileCalculus, bank_padding, calculus
from workbench.rtile.wmma_shared import wmma_shared_bytes

Tile = tuple[int, ...]


@hash_once
@dataclass(frozen=True)
class RProgram:
    axes: tuple[str, ...]
    layers: tuple[str, ...]
    tiles: tuple[Tile, ...]
    padding: tuple[tuple[int, ...], ...]  # per layer, per tensor: storage padding (elements)
    cached: tuple[bool, ...]
    grid: int
    eps: float
    expr: TensorExpr = field(repr=False)  # as constructed (after axis fusion)
    vthreads: tuple[tuple[str, int], ...] = ()  # (spatial axis, V > 1) of a GPU thread's tile
    split: int = 1  # blocks (cores) sharing one unit tile's reduction (split-K); grid includes them
    in_place: bool = False  # tails left unpadded, inputs read as stored (`panels.reads_in_place`)

    @property
    def unit_tile(self) -> Tile:
        return self.tiles[-1]

    @property
    def register_tile(self) -> Tile:
        return self.tiles[0]

    def tile_dict(self, layer: int) -> dict[str, int]:
        return dict(zip(self.axes, self.tiles[layer]))

    def to_dict(self) -> dict:
        return {
            "axes": list(self.axes),
            "layers": [
                {"name": n, "tile": dict(zip(self.axes, t)), "padding": list(p), "cached": c}
                for n, t, p, c in zip(self.layers, self.tiles, self.padding, self.cached)
            ],
            "grid": self.grid,
            "eps": self.eps,
            "vthreads": dict(self.vthreads),
            # written only where set: unsplit programs (all CPU ones) keep their stored form
            **({"split": self.split} if self.split > 1 else {}),
            **({"in_place": True} if self.in_place else {}),
        }

    @classmethod
    def from_dict(cls, data: dict, expr: TensorExpr) -> "RProgram":
        """The program `to_dict` wrote, for `expr` (written beside it: `TensorExpr.to_dict`)."""
        axes = tuple(data["axes"])
        layers = data["layers"]
        return cls(
            axes=axes,
            layers=tuple(l["name"] for l in layers),
            tiles=tuple(tuple(int(l["tile"][a]) for a in axes) for l in layers),
            padding=tuple(tuple(int(p) for p in l["padding"]) for l in layers),
            cached=tuple(bool(l["cached"]) for l in layers),
            grid=int(data["grid"]),
            eps=float(data["eps"]),
            expr=expr,
            vthreads=tuple((str(a), int(v)) for a, v in data.get("vthreads", {}).items()),
            split=int(data.get("split", 1)),  # programs stored before split-K: unsplit
            in_place=data.get("in_place") is True,
        )


def storage_padding(
    calc: TileCalculus, device: DeviceSpec, layer: int, tile: Tile, upper: Tile
) -> tuple[int, ...]:
    """Bank-conflict padding of every input data tile stored at `layer` (0 where no banks)."""
    spec = device.layers[layer]
    if spec.banks <= 0 or layer == 0:
        return (0,) * len(calc.expr.tensors)
    big, small = calc.data_tiles(tile), calc.data_tiles(upper)
    out = []
    for t, tensor in enumerate(calc.expr.tensors):
        if tensor.role != "input":
            out.append(0)
            continue
        width = max(1, spec.bank_width_bytes // tensor.itemsize)
        out.append(bank_padding(big[t][-1], small[t][-1], spec.banks, width))
    return tuple(out)


def make_program(
    calc: TileCalculus, device: DeviceSpec, tiles: Sequence[Tile], cached: Sequence[bool], eps: float,
    vthreads: tuple[tuple[str, int], ...] = (),
) -> RProgram:
    """Assemble an rProgram from per-layer tiles (top first): padding and grid follow."""
    tiles = tuple(tuple(t) for t in tiles)
    ones = tuple(1 for _ in calc.extents)
    padding = tuple(
        storage_padding(calc, device, l, tiles[l], tiles[l - 1] if l else ones) for l in range(len(tiles))
    )
    return RProgram(
        axes=tuple(a.name for a in calc.expr.axes),
        layers=tuple(device.layers[l].name for l in range(len(tiles))),
        tiles=tiles,
        padding=padding,
        cached=tuple(cached),
        grid=calc.spatial_tiles(tiles[-1]),
        eps=eps,
        expr=calc.expr,
        vthreads=tuple(vthreads),
    )


def holds_output(device: DeviceSpec, layer: int) -> bool:
    """Whether a layer's tile holds the output tile: not a block-shared scratchpad
    (`DeviceSpec.is_block_shared`: partial sums accumulate in registers); every other layer does."""
    return not device.is_block_shared(layer)


def layer_footprint(calc: TileCalculus, device: DeviceSpec, layer: int, tile: Tile, padding=()) -> int:
    """Bytes one tile occupies at `layer`, in that layer's unit of capacity (`holds_output`
    says whether the output tile counts). A tensor-core fragment tile at the top layer is spread
    over the lanes of a warp, so its per-thread share is what counts. A CPU core's register tile
    is counted in whole vector registers, the micro-kernel's loads and broadcast included
    (`registers.micro_kernel_registers`): a 6 x 16 fp32 AVX2 tile takes 15 ymm = 480 B, not the
    scalar bytes of its data tiles. A block's shared tile of a program the WMMA template builds
    is what that template allocates (`wmma_shared.wmma_shared_bytes`: fragment-aligned rows, the
    staged output of a padded grid).
    """
    if is_micro_kernel_layer(device, layer):
        return micro_kernel_registers(calc.expr, device, tile) * device.register_bytes
    if device.is_block_shared(layer) and (wmma := wmma_shared_bytes(calc.expr, device, tile)) is not None:
        return wmma  # what the WMMA template allocates (rtile.wmma_shared), not bank-padded data tiles
    total = calc.footprint_bytes(tile, padding, holds_output(device, layer))
    return ceil(total / tile_lanes(calc.expr, device)) if layer == 0 else total


def layer_capacity(device: DeviceSpec, layer: int) -> int:
    """Bytes one tile may occupy at `layer`: the layer's capacity, and at the top (per-thread)
    layer no more than `registers_per_thread_cap` registers either, whichever is smaller (the
    presets and detected CPUs state the two consistently; a hand-written spec may not). On a
    CPU that is `hardware.registers.register_budget` vector registers, up to a partial register of a
    register layer whose bytes are not a whole number of vectors (which no tile can use)."""
    capacity = device.layers[layer].capacity_bytes
    if layer == 0 and device.layers[0].scope == "thread":
        return min(capacity, device.registers_per_thread_cap * device.register_bytes)
    return capacity


def footprint_at(device: DeviceSpec, program: RProgram, layer: int) -> int:
    """Footprint of a program's tile at `layer` (see `layer_footprint`)."""
    return layer_footprint(calculus(program.expr), device, layer, program.tiles[layer], program.padding[layer])


def waves(grid: int, slots: int) -> int:
    return ceil(grid / max(slots, 1))


def split_axis(expr: TensorExpr, device: DeviceSpec) -> int | None:
    """The reduce axis a split-K program deals over blocks (a CPU's over cores), or None where
    `expr` is not split on `device`: operators without a reduce axis, tensor-core contractions
    (their WMMA template keeps one block per output tile), operators whose axes were fused (the
    partial-sum buffer is laid out over the expression's own axes) and, on a CPU, operators
    with blocks after the main one (`codegen.cpu` folds an epilogue into the accumulators'
    write-back and runs row passes per unit tile, which for a split program would act on each
    part's partial sums). A cross-thread reduction
    splits the axis its threads run along (`cross_thread_axis`), every other operator its
    outermost reduce axis (the outermost shared-step loop; a CPU's loop over the unit tile's
    K-steps)."""
    if not expr.reduce or mma_axes(expr, device) is not None:
        return None
    if any(axis.fused_from for axis in expr.axes):
        return None
    if device.runs_on_cpu and (expr.epilogues or expr.row_passes):
        return None
    across = cross_thread_axis(expr, device)
    return expr.reduce[0] if across is None else across


# Fewest of the unit tile's K-steps a CPU split program's part walks. A part keeps the unit tile
# the scale-up sized for one core's whole reduction and pays that tile's accumulator buffer and
# panels once per part; of 15 splits timed against the unsplit rank 1 on two Zen 4 cores (each
# construction's rank 1; docs/model-evidence.md#cpu-split-parts), the 10 whose parts walked 10
# steps or more ran 1.00-2.3x as fast, the 5 of 1-4 steps 0.71-1.02x (907 x 397 x 17 in parts of
# one step: 223 us against 158).
CPU_MIN_PART_STEPS = 8


def split_counts(program: RProgram, device: DeviceSpec) -> tuple[int, ...]:
    """The splits a program may take, smallest first: S > 1 parts of ceil(steps / S') whole
    shared-memory steps of its `split_axis` each for some S' (`split_steps`), so every block but
    the last walks whole steps and a vector copy's alignment along the axis holds; the last part
    takes the rest (a predicate on the split), its tail step guarded as in the unsplit program.
    A cross-thread reduction takes only S dividing its steps, over an extent its tile divides
    (no predicate at all): TVM 0.27 lowers the rfactor block of a reduce loop bound to threads
    under a predicate as a plain loop, every thread then writing its own partial sum
    (`codegen.cuda_splitk` refuses it). On a CPU only parts of CPU_MIN_PART_STEPS steps or more.
    Empty where the program cannot be split (or is split already)."""
    axis = split_axis(program.expr, device)
    if axis is None or program.split != 1:
        return ()
    extent, step = program.expr.axes[axis].extent, program.unit_tile[axis]
    steps = ceil(extent / step)
    if axis == cross_thread_axis(program.expr, device):
        return tuple(s for s in range(2, steps + 1) if steps % s == 0) if extent % step == 0 else ()
    least = CPU_MIN_PART_STEPS if device.runs_on_cpu else 1
    return tuple(sorted({ceil(steps / ceil(steps / s)) for s in range(2, steps // least + 1)}))


def split_steps(program: RProgram, axis: int) -> int:
    """Shared-memory steps of `axis` each part of a split program walks (the last part fewer)."""
    steps = ceil(program.expr.axes[axis].extent / program.unit_tile[axis])
    return ceil(steps / program.split)
