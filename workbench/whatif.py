"""What-if hardware: a workload constructed on a base device and on an edited one
(`hardware.edit`), side by side (`compare`, `compare_suite`), and one field swept over a range
(`sweep`). Pure: constructions in, frozen values out; nothing is built or run here (the CLI's
`--measure` does that through the front door, `pipeline.whatif_measure`).

For each workload: the top-K under both specs, whether the top-1 program changed, the first
construction step where the two walks differ (a `Stepper` position: `seek(n)` shows that step
on both; the contract's `diverges_at_step` where the top-1 changed), and what changed in words
("L2 tile grows 128 -> 256 along j: the bigger L2 holds it; now bound by compute (was DRAM)"). A construction is kept per (expression, spec, policy,
options) for the process (`construction`), so a base spec is constructed once however many
edits and sweep points are compared with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from workbench.construct.space import Options
from workbench.construct.step import Candidate
from workbench.construct.stepper import Construction, Stepper
from workbench.errors import UserError
from workbench.fmt import duration
from workbench.hardware.edit import X86_ISAS, Edit, EditedSpec, Sweep, apply_edits, sweep_values
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr

# Constructions kept for the process: a suite of 13 workloads swept over 8 points and its base is
# 13 x 9 = 117. One holds its top-K, graph and walk: 0.5 MB (mm-512 on a 2-core AVX2 CPU, 325
# steps) to 2.5 MB (the same with a 2 MiB L2, 1811 steps), so at most about 300 MB in all.
CACHED_CONSTRUCTIONS = 128


@dataclass(frozen=True)
class Walk:
    """A finished construction and its steps as (action, state key) pairs: what tells two
    walks apart (a step's note carries predicted times, which every rate edit changes)."""

    construction: Construction
    steps: tuple[tuple, ...]


@lru_cache(maxsize=CACHED_CONSTRUCTIONS)
def construction(expr: TensorExpr, spec: DeviceSpec, policy: str = "roller", options: Options = Options()) -> Walk:
    """The construction of `expr` on `spec` by `policy` with `options`, and its walk (kept for
    the process: the same arguments give the same object)."""
    stepper = Stepper(expr, spec, policy, options)
    done = stepper.finish()
    return Walk(done, tuple((s.action, None if s.state is None else s.state.key) for s in stepper.steps))


@dataclass(frozen=True)
class TopOne:
    """A construction's best predicted program, as the what-if diff shows it: the tile of each
    memory layer (layer, ((axis, size), ...)), the grid, the predicted seconds and the bound
    (`Estimate.bottleneck`: "compute" or the layer whose loads are slowest)."""

    tiles: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    grid: int
    predicted_seconds: float
    bound: str
    vthreads: tuple[tuple[str, int], ...] = ()
    split: int = 1
    footprints: tuple[int, ...] = ()  # bytes each layer's tile occupies (`Estimate.footprints`)

    @classmethod
    def of(cls, candidate: Candidate) -> "TopOne":
        p = candidate.program
        tiles = tuple((name, tuple(zip(p.axes, tile))) for name, tile in zip(p.layers, p.tiles))
        return cls(tiles, p.grid, candidate.predicted_seconds, candidate.estimate.bottleneck, p.vthreads, p.split,
                   tuple(candidate.estimate.footprints))

    @property
    def program_key(self) -> tuple:
        """What makes two top-1 programs the same program: tiles, grid, virtual threads, split."""
        return (self.tiles, self.grid, self.vthreads, self.split)

    def to_dict(self) -> dict:
        data = {"tiles": {layer: dict(tile) for layer, tile in self.tiles}, "grid": self.grid,
                "predicted_seconds": self.predicted_seconds, "bound": self.bound,
                "footprint_bytes": {layer: b for (layer, _), b in zip(self.tiles, self.footprints)}}
        if self.vthreads:
            data["vthreads"] = dict(self.vthreads)
        if self.split > 1:
            data["split"] = self.split
        return data


@dataclass(frozen=True)
class WorkloadDiff:
    """One workload on the base and the edited spec: both constructions (their top-K, graphs),
    both top-1s, the first step (1-based, a `Stepper` position) where the two walks differ
    (`walks_part_at`: None when they are the same step for step), and the difference in words."""

    label: str
    base: Construction
    edited: Construction
    base_top: TopOne
    edited_top: TopOne
    walks_part_at: int | None
    explanation: tuple[str, ...]

    @property
    def changed(self) -> bool:
        """The top-1 program differs (its tiles, grid, virtual threads or split)."""
        return self.base_top.program_key != self.edited_top.program_key

    @property
    def diverges_at_step(self) -> int | None:
        """Where the construction of the changed top-1 leaves the base's walk: `walks_part_at`
        when the top-1 program changed, None when it did not (the walks may still part on the way
        to the same program; the contract's `diverges_at_step` is null when unchanged)."""
        return self.walks_part_at if self.changed else None

    @property
    def predicted_speedup(self) -> float:
        """Base predicted seconds / edited predicted seconds (> 1: the edited device is faster)."""
        return self.base_top.predicted_seconds / self.edited_top.predicted_seconds

    @property
    def text(self) -> str:
        return "; ".join(self.explanation)

    def to_dict(self) -> dict:
        """The JSON entry of `workbench whatif` (docs/cli.md)."""
        return {"workload": self.label, "base": self.base_top.to_dict(), "edited": self.edited_top.to_dict(),
                "changed": self.changed, "diverges_at_step": self.diverges_at_step,
                "predicted_speedup": self.predicted_speedup, "explanation": self.text,
                "base_topk": [TopOne.of(c).to_dict() for c in self.base.candidates],
                "edited_topk": [TopOne.of(c).to_dict() for c in self.edited.candidates]}


@dataclass(frozen=True)
class SuiteDiff:
    """Every workload of a suite (or one) compared: the edited spec and one diff per workload."""

    edited: EditedSpec
    results: tuple[WorkloadDiff, ...]

    @property
    def geomean_speedup(self) -> float:
        """The geometric mean of the workloads' predicted speed-ups."""
        return math.exp(sum(math.log(r.predicted_speedup) for r in self.results) / len(self.results))


def compare(label: str, expr: TensorExpr, edited: EditedSpec, policy: str = "roller",
            options: Options = Options()) -> WorkloadDiff:
    """`expr` (named `label`) constructed on `edited.base` and on `edited.spec`, compared.
    UserError where either construction finds no program."""
    a = construction(expr, edited.base, policy, options)
    b = construction(expr, edited.spec, policy, options)
    for walk, spec in ((a, edited.base), (b, edited.spec)):
        if not walk.construction.candidates:
            raise UserError(f"{label}: no program constructed on {spec.name}")
    base_top, edited_top = TopOne.of(a.construction.candidates[0]), TopOne.of(b.construction.candidates[0])
    return WorkloadDiff(label, a.construction, b.construction, base_top, edited_top, divergence(a.steps, b.steps),
                        explain(base_top, edited_top, edited))


def compare_suite(workloads: Sequence[tuple[str, TensorExpr]], edited: EditedSpec, policy: str = "roller",
                  options: Options = Options()) -> SuiteDiff:
    """Each (label, expression) of `workloads` compared on the base and the edited spec."""
    return SuiteDiff(edited, tuple(compare(label, expr, edited, policy, options) for label, expr in workloads))


def divergence(a: Sequence, b: Sequence) -> int | None:
    """The first position (1-based) where two walks' steps differ, a walk that stops early
    differing at the step it lacks; None for equal walks."""
    for i, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def explain(base: TopOne, edited: TopOne, spec: EditedSpec) -> tuple[str, ...]:
    """What changed from the base top-1 to the edited one, in words: each layer's tile that grew
    or shrank along an axis (and why, where the edit changed that layer's capacity and the tile's
    bytes moved with it), the grid, the bound and the predicted time."""
    words = []
    capacities = {l.name: (l.capacity_bytes, e.capacity_bytes) for l, e in zip(spec.base.layers, spec.spec.layers)}
    for at, ((layer, before), (_, after)) in enumerate(zip(base.tiles, edited.tiles)):
        moves = [(axis, x, y) for (axis, x), (_, y) in zip(before, after) if x != y]
        if not moves:
            continue
        text = ", ".join(f"{'grows' if y > x else 'shrinks'} {x} -> {y} along {axis}" for axis, x, y in moves)
        old_cap, new_cap = capacities.get(layer, (0, 0))
        old_bytes, new_bytes = (t.footprints[at] if at < len(t.footprints) else 0 for t in (base, edited))
        why = (f": the bigger {layer} holds it" if new_cap > old_cap and new_bytes > old_bytes else
               f": the smaller {layer} no longer holds the old one" if new_cap < old_cap and old_bytes > new_cap else "")
        words.append(f"{layer} tile {text}{why}")
    if edited.vthreads != base.vthreads:
        words.append(f"virtual threads {_pairs(base.vthreads)} -> {_pairs(edited.vthreads)}")
    if edited.split != base.split:
        words.append(f"split-K {base.split} -> {edited.split}")
    if edited.grid != base.grid:
        units = (spec.base.compute_units, spec.spec.compute_units)
        words.append(f"grid {base.grid} -> {edited.grid}" + (f" for {units[1]} units (was {units[0]})"
                                                              if units[0] != units[1] else ""))
    if not words:
        words.append("same program")
    words.append(f"now bound by {edited.bound} (was {base.bound})" if edited.bound != base.bound
                 else f"still bound by {edited.bound}")
    ratio = base.predicted_seconds / edited.predicted_seconds
    how = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    words.append(f"predicted {duration(base.predicted_seconds)} -> {duration(edited.predicted_seconds)} ({how})")
    return tuple(words)


def _pairs(vthreads) -> str:
    return ", ".join(f"{a}x{v}" for a, v in vthreads) or "none"


# ---- sweeps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepCurve:
    """One workload over a sweep's values: the top-1 at each value, and the change points:
    the indices of the values whose top-1 program differs from the value's before."""

    label: str
    tops: tuple[TopOne, ...]
    changes: tuple[int, ...]

    @property
    def predicted_seconds(self) -> tuple[float, ...]:
        return tuple(t.predicted_seconds for t in self.tops)


@dataclass(frozen=True)
class SweepResult:
    """A field swept over `values` (geometric or linear spacing) from the base spec: one
    `SweepCurve` per workload, and the edited spec of each value."""

    base: DeviceSpec
    sweep: Sweep
    values: tuple[object, ...]
    geometric: bool
    specs: tuple[EditedSpec, ...]
    curves: tuple[SweepCurve, ...]

    def to_dict(self) -> dict:
        """The JSON document of `workbench whatif --sweep` (docs/cli.md)."""
        return {"device": self.base.name, "field": self.specs[0].changes[0].field, "values": list(self.values),
                "spacing": "geometric" if self.geometric else "linear",
                "base_value": self.specs[0].changes[0].before,
                "results": [{"workload": c.label, "predicted_seconds": list(c.predicted_seconds),
                             "bound": [t.bound for t in c.tops],
                             "top1": [t.to_dict()["tiles"] for t in c.tops],
                             "changes": [{"value": self.values[i], "previous": self.values[i - 1],
                                          "from": c.tops[i - 1].to_dict(), "to": c.tops[i].to_dict()}
                                         for i in c.changes]}
                            for c in self.curves]}


def sweep(workloads: Sequence[tuple[str, TensorExpr]], base: DeviceSpec, field_sweep: Sweep, policy: str = "roller",
          options: Options = Options()) -> SweepResult:
    """Each (label, expression) of `workloads` constructed on `base` with `field_sweep`'s field at
    each of its values (`hardware.edit.sweep_values`); UserError for a bad sweep or a value the
    spec refuses, naming the field."""
    values, geometric = sweep_values(base, field_sweep)
    specs = tuple(apply_edits(base, (Edit(field_sweep.field, _text(v)),)) for v in values)
    curves = []
    for label, expr in workloads:
        tops = []
        for edited in specs:
            c = construction(expr, edited.spec, policy, options).construction
            if not c.candidates:
                raise UserError(f"{label}: no program constructed on {edited.spec.name}")
            tops.append(TopOne.of(c.candidates[0]))
        changes = tuple(i for i in range(1, len(tops)) if tops[i].program_key != tops[i - 1].program_key)
        curves.append(SweepCurve(label, tuple(tops), changes))
    return SweepResult(base, field_sweep, values, geometric, specs, tuple(curves))


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


# ---- what this machine can make real -----------------------------------------------------------


def unrealisable(edited: EditedSpec, local_name: str, base_edit: EditedSpec | None = None) -> str:
    """Why `--measure` cannot make `edited` real on this machine ("" when it can): the base must
    be this machine's CPU (`local_name`, the `local-cpu` spec), or that CPU with `base_edit`
    (`--base-set`, whose `spec` is `edited`'s base) realisable the same way, and every edit one
    of fewer cores (`compute_units`, run with that many threads) or a narrower x86 ISA
    (`target.mcpu` of `X86_ISAS` with no more lanes and FMA only where the base has it: code
    this CPU runs)."""
    if base_edit is not None:
        return unrealisable(base_edit, local_name) or _unrealisable_changes(edited)
    base = edited.base
    if base.name != local_name or not base.runs_on_cpu:
        return f"--measure runs the kernels on this machine: give --device {local_name}, not {base.name}"
    return _unrealisable_changes(edited)


def _unrealisable_changes(edited: EditedSpec) -> str:
    """The first of `edited`'s changes that is not fewer cores or a narrower ISA than its base
    (`unrealisable`), "" when there is none."""
    base = edited.base
    allowed = f"compute_units up to {base.compute_units}, target.mcpu of a narrower ISA ({_narrower(base)})"
    for change in edited.changes:
        if change.field == "compute_units" and 1 <= change.after <= base.compute_units:
            continue
        if change.field == "target.mcpu" and change.after in _narrower_isas(base):
            continue
        return f"{change.field}={change.after}: not realisable on this machine (--measure takes {allowed})"
    return ""


def _narrower_isas(base: DeviceSpec) -> tuple[str, ...]:
    own = X86_ISAS.get(str(dict(base.target).get("mcpu")))
    if own is None:
        return ()
    return tuple(name for name, isa in X86_ISAS.items()
                 if isa.lanes <= own.lanes and (own.fma or not isa.fma) and isa.registers <= own.registers)


def _narrower(base: DeviceSpec) -> str:
    first = {}  # one name per ISA: the generic level where there is one (X86_ISAS lists it first)
    for name in _narrower_isas(base):
        first.setdefault(X86_ISAS[name], name)
    return ", ".join(f"{n} = {isa.name}" for isa, n in first.items()) or "none: the target's mcpu is not an x86 ISA the workbench knows"
