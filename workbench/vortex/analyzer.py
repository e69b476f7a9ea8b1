"""Vortex's hybrid analyzer (ALGORITHMS.md section 3): the cost of a candidate at one value of the
dynamic extent, computed without TVM and without running anything.

Reconstruction, per candidate (an rProgram whose tiles `hierarchy` built) and value v:

1. Padding only at the outermost level: the kernel runs the dynamic axis in whole unit tiles
   (its outer tile, the parallel level), so it executes `padded_extent(v, outer)` =
   ceil(v / outer) * outer along it; every inner level divides the outer tile, so no inner
   level pads.
2. The expression at that extent (`at_extent`): the axis, every tensor dimension its index
   reaches and the flop count rewritten, as the catalog would build it.
3. The cost is the repo's hybrid model, `rtile.model.estimate`, on the program over that
   expression: level 0 (the register micro-kernel's share of peak) measured where the device
   was calibrated (`DeviceSpec.micro_kernels`), modelled otherwise; the levels above modelled
   analytically: one unit's temporal cost (compute against the loads from each memory layer)
   times the parallel waves of unit tiles over the cores / SMs (`ceil(grid / units)` rounds).
4. The model's estimate includes what the CPU template adds (`rtile.model.cpu.packing_seconds`): the
   copies of the inputs it packs into panels (`rtile.panels`), one per unit tile and K-step. They decide
   between kernels along the dynamic axis: a 6-row unit tile copies all of B for every 6 rows
   (at M = 1 the whole 7 MB B of the BERT GEMM for one row, where a 1-row kernel packs nothing),
   a taller one amortises each copy over more rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil, prod

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import Axis, KernelArg, TensorAccess, TensorExpr
from workbench.rtile.model import Estimate, estimate
from workbench.rtile.rprogram import RProgram, make_program
from workbench.rtile.traffic import calculus


@dataclass(frozen=True)
class Dynamic:
    """The dynamic extent of a workload: the catalog parameter (`M`), the expression's axis it
    sizes (`i`), and the declared upper bound of the values the offline choice covers."""

    param: str
    axis: str
    max_extent: int = 4096

    def to_dict(self) -> dict:
        return {"param": self.param, "axis": self.axis, "max_extent": self.max_extent}

    @classmethod
    def from_dict(cls, data: dict) -> "Dynamic":
        return cls(str(data["param"]), str(data["axis"]), int(data["max_extent"]))


def padded_extent(value: int, outer: int) -> int:
    """The extent a kernel whose outer tile is `outer` runs for `value`: whole outer tiles
    (integer arithmetic, exact for any size)."""
    return -(-value // outer) * outer


def at_extent(expr: TensorExpr, axis: str, value: int, param: str | None = None) -> TensorExpr:
    """`expr` with axis `axis` of extent `value` (and the catalog parameter `param` set to it):
    each tensor dimension indexed by `sum(c_a * a) + const` spans `sum(|c_a| (E_a - 1)) + 1`,
    so it changes by |c| (value - E) with the axis; a kernel argument of the same name as a
    tensor follows that tensor's dimensions. The flops scale with the iteration volume, which
    holds for the operators `catalog.DYNAMIC_PARAMS` allows (one block, the same work per point)."""
    a = expr.axis_index(axis)
    old = expr.axes[a].extent
    delta = value - old

    def reshape(shape: tuple[int, ...], access: TensorAccess) -> tuple[int, ...]:
        return tuple(s + abs(coeffs[a]) * delta for s, (coeffs, _) in zip(shape, access.index))

    tensors = tuple(replace(t, shape=reshape(t.shape, t)) for t in expr.tensors)
    by_name = {t.name: t for t in expr.tensors}
    args = tuple(
        KernelArg(g.name, reshape(g.shape, by_name[g.name]), g.dtype, g.role)
        if g.name in by_name and len(by_name[g.name].shape) == len(g.shape) else g
        for g in expr.args
    )
    axes = tuple(Axis(x.name, value, x.kind, x.fused_from) if i == a else x for i, x in enumerate(expr.axes))
    params = tuple((k, value if k == param else v) for k, v in expr.params)
    return replace(expr, axes=axes, tensors=tensors, args=args, params=params,
                   flops=max(1, expr.flops * value // old), func=None)


def outer_tile(program: RProgram, dyn: Dynamic) -> int:
    """The candidate's outer (unit) tile along the dynamic axis: what the run pads to."""
    return program.unit_tile[program.axes.index(dyn.axis)]


def program_at(program: RProgram, device: DeviceSpec, dyn: Dynamic, value: int) -> RProgram:
    """The candidate's tiles over the expression at the padded extent for `value`."""
    expr = at_extent(program.expr, dyn.axis, padded_extent(value, outer_tile(program, dyn)), dyn.param)
    return make_program(calculus(expr), device, program.tiles, program.cached, program.eps)


def cost(program: RProgram, device: DeviceSpec, dyn: Dynamic, value: int) -> Estimate:
    """The hybrid model's estimate of the candidate at `value`, its panel copies included
    (module docstring)."""
    return estimate(program_at(program, device, dyn, value), device)


