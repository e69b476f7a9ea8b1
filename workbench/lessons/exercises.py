"""The checks of the lessons' exercises: one function per exercise, each computing the right
answer with the core (never a stored one) and returning a `Verdict` that says right or wrong and
why, with the reader's number beside the core's.

A notebook's exercise cell holds the reader's answer (a tile, an eps, an expression, a
prediction) and calls its check; the hidden solution cell below it calls the same check with the
solution. Predictions start as None ("not answered yet"), which every check reports as wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from workbench.construct.space import EPS_STEPS, Space
from workbench.fmt import duration
from workbench.ops.fusion import fuse_axes
from workbench.rtile.alignment import RULES
from workbench.rtile.rules import AlignContext
from workbench.rtile.traffic import TileCalculus, bank_padding

NOT_ANSWERED = "write your answer in the cell (it is still None), then run it again"


@dataclass(frozen=True)
class Verdict:
    """Whether an answer is right, and why (`message` gives the core's number beside the
    reader's). Shown in a notebook as one coloured line; `str()` starts with "Right" or "Not yet"."""

    correct: bool
    message: str

    def __str__(self) -> str:
        return f"{'Right' if self.correct else 'Not yet'}: {self.message}"

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython's text/plain
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colour, mark = ("#2b8a3e", "&#10004; Right") if self.correct else ("#c92a2a", "&#10008; Not yet")
        return (f'<div style="border-left: 4px solid {colour}; padding: 2px 8px; margin: 2px 0">'
                f'<b style="color: {colour}">{mark}</b>: {escape(self.message)}</div>')


def _close(answer: float, truth: float, rel: float) -> bool:
    return math.isclose(answer, truth, rel_tol=rel, abs_tol=1e-12)


def _unanswered(answer) -> Verdict | None:
    return Verdict(False, NOT_ANSWERED) if answer is None else None


def _shape_allowed(expr, device, axis: int, size: int, eps: float) -> bool:
    """The tensor-shape rule (`RULES[0]`, the one that reads `eps`) on one size."""
    ctx = AlignContext(expr, device, 1, tuple(1 for _ in expr.axes), eps)
    return RULES[0].axis_ok(ctx, axis, size)


# Lesson 1: tensor expressions and rTiles.

def best_growth(expr, tile: Sequence[int], grown: Sequence[int]) -> Verdict:
    """`grown` doubles one axis of `tile`; right when its reuse score (TileCalculus.reuse_score)
    is the best of the doublings of each axis (ties all count)."""
    calc, tile, grown = TileCalculus(expr), tuple(tile), tuple(grown)
    options = {}
    for axis, a in enumerate(expr.axes):
        if tile[axis] * 2 <= a.extent:
            option = tile[:axis] + (tile[axis] * 2,) + tile[axis + 1:]
            options[option] = (a.name, calc.reuse_score(tile, option))
    if grown not in options:
        return Verdict(False, f"grow exactly one axis of {tile} by doubling it; {grown} is not one of "
                              f"{', '.join(map(str, options))}")
    best_tile, (best_axis, best) = max(options.items(), key=lambda kv: kv[1][1])
    axis, score = options[grown]
    if _close(score, best, 1e-9):
        return Verdict(True, f"growing {axis} scores {score:.4g} bytes saved per byte of footprint, the best of "
                             f"{', '.join(f'{n} {s:.4g}' for n, s in options.values())}")
    return Verdict(False, f"growing {axis} to {grown} scores {score:.4g}; growing {best_axis} to {best_tile} scores "
                          f"{best:.4g}")


def bank_pad(predicted: int | None, n_big: int, n_small: int, banks: int, bank_width: int = 1) -> Verdict:
    """`predicted` is the padding Roller's bank rule (traffic.bank_padding) gives a stored
    leading dimension `n_big` read in pieces of `n_small`, with `banks` banks of `bank_width`
    elements."""
    if (none := _unanswered(predicted)) is not None:
        return none
    pad = bank_padding(n_big, n_small, banks, bank_width)
    row = banks * bank_width
    why = (f"pad = ({row} - {n_big} mod {row} + {bank_width} * ceil({n_small} / {bank_width})) mod {row} = {pad}, "
           f"so each row is stored as {n_big + pad} elements")
    return Verdict(predicted == pad, why if predicted == pad else f"you said {predicted}; {why}")


def smallest_eps(expr, device, axis: str, size: int, eps: float) -> Verdict:
    """`eps` is the smallest of Roller's eps steps (construct.space.EPS_STEPS) at which the
    tensor-shape rule allows `size` on `axis` of `expr` (device: a DeviceSpec)."""
    n = expr.axis_index(axis)
    extent = expr.axes[n].extent
    waste = (math.ceil(extent / size) * size - extent) / extent
    allowed = [e for e in EPS_STEPS if _shape_allowed(expr, device, n, size, e)]
    if not allowed:
        return Verdict(False, f"no eps of {EPS_STEPS} allows {size} on {axis} (extent {extent})")
    here = f"a size of {size} on {axis} = {extent} runs {math.ceil(extent / size) * size}, wasting {waste:.1%}"
    if eps == allowed[0]:
        return Verdict(True, f"{here}: eps {eps} is the first of Roller's steps {EPS_STEPS} that allows it")
    verdict = "allows it, but a smaller step does too" if eps in allowed else "refuses it"
    return Verdict(False, f"{here}: eps {eps} {verdict}; the smallest step that allows it is {allowed[0]}")


def tile_fits(expr, device, tiles: Sequence[Sequence[int]], layer: int, at_least: Sequence[int] = ()) -> Verdict:
    """The tile of layer `layer` in `tiles` (one per layer, top first) fits that layer
    (footprint, padding included, within the capacity: Space.footprint), is a multiple of the
    tile above it, and is at least `at_least` on every axis."""
    space = Space(expr, device)
    tiles = tuple(tuple(int(s) for s in t) for t in tiles)
    tile, upper = tiles[layer], tiles[layer - 1] if layer else space.ones()
    name = space.layer_names[layer]
    if any(t % u for t, u in zip(tile, upper)):
        return Verdict(False, f"{tile} is not a multiple of the tile above it, {upper}")
    if any(t < m for t, m in zip(tile, at_least)):
        return Verdict(False, f"keep the tile at least {tuple(at_least)}; {tile} is smaller")
    used, capacity = space.footprint(layer, tile, upper), space.capacity(layer)
    if used <= capacity:
        return Verdict(True, f"{tile} takes {used:,} of the {name}'s {capacity:,} B ({used / capacity:.0%})")
    return Verdict(False, f"{tile} takes {used:,} B, over the {name}'s {capacity:,} B ({used / capacity:.0%})")


# Lesson 2: Roller step by step.

def grid_rounds(candidate, device, predicted: int | None) -> Verdict:
    """`predicted` is how many rounds of unit tiles the busiest compute unit runs: the
    candidate's grid over the device's units, rounded up."""
    if (none := _unanswered(predicted)) is not None:
        return none
    grid, units = candidate.program.grid, device.compute_units
    rounds = math.ceil(grid / units)
    why = f"{grid} unit tiles over {units} units: ceil({grid} / {units}) = {rounds} rounds"
    return Verdict(predicted == rounds, why if predicted == rounds else f"you said {predicted}; {why}")


def construction_steps(construction, predicted: int | None) -> Verdict:
    """`predicted` is the number of steps the construction took (`Construction.steps`)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    steps, k = construction.steps, len(construction.candidates)
    why = f"{steps} steps, keeping the top {k} program{'s' * (k != 1)} of those it found"
    return Verdict(predicted == steps, why if predicted == steps else f"you said {predicted}; it took {why}")


# Lesson 3: the Markov chain.

def transition_probability(policy, state, action, temperature: float, predicted: float | None,
                           rel: float = 0.1) -> Verdict:
    """`predicted` is P(action | state) at `temperature` (MarkovPolicy.probability) within
    `rel` of it."""
    if (none := _unanswered(predicted)) is not None:
        return none
    p = policy.probability(state, action, temperature)
    why = f"P = {p:.3g} at T = {temperature:.3g}"
    return Verdict(_close(predicted, p, rel), why if _close(predicted, p, rel) else f"you said {predicted:.3g}; {why}")


def most_visited(stepper, layer: str, predicted: Sequence[int] | None) -> Verdict:
    """`predicted` is the tile of layer `layer` where the walk spent the largest share of its
    visits so far (MarkovPolicy.stationary, summed over the states with that tile; ties all
    count)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    nodes, shares = stepper.graph().nodes, {}
    for key, share in stepper.policy.stationary().items():
        if nodes[key].layer_name == layer:
            shares[nodes[key].tile] = shares.get(nodes[key].tile, 0.0) + share
    if not shares:
        return Verdict(False, f"the walk has visited no state in the {layer} yet")
    top = max(shares.values())
    best = sorted(t for t, share in shares.items() if share == top)
    mine = shares.get(tuple(predicted), 0.0)
    why = f"the walk spent {top:.1%} of its visits at {best[0]} in the {layer}"
    ok = tuple(predicted) in best
    return Verdict(ok, why if ok else f"{tuple(predicted)}: {mine:.1%} of the visits; {why}")


# Lesson 4: predicted against profiled.

def bottleneck(candidate, device, predicted: str | None) -> Verdict:
    """`predicted` is the stage the model says limits the candidate on `device`: "compute" or
    the name of the memory layer whose loads are slowest (Estimate.bottleneck; a CPU's packing
    copy is priced after that choice, so it is not a stage here)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    est, layers = candidate.estimate, {layer.name for layer in device.layers}
    stages = [("compute", est.compute_seconds), *((n, s) for n, s in est.load_seconds if n in layers)]
    why = "; ".join(f"{n} {duration(s)}" for n, s in stages)
    return Verdict(predicted == est.bottleneck, f"bound by {est.bottleneck}: {why}")


def dram_intensity(candidate, device, predicted: float | None, rel: float = 0.05) -> Verdict:
    """`predicted` is the candidate's arithmetic intensity on the roofline (viz.roofline):
    useful flops per byte read from the device's bottom layer, within `rel` of it."""
    if (none := _unanswered(predicted)) is not None:
        return none
    est, layer = candidate.estimate, device.layers[-1].name
    moved = dict(est.bytes_per_layer)[layer]
    truth = est.flops / moved
    why = f"{est.flops:,} flops / {moved:,} B from {layer} = {truth:.3g} flops per byte"
    return Verdict(_close(predicted, truth, rel), why if _close(predicted, truth, rel) else f"you said {predicted:.3g}; {why}")


# Lesson 5: export.

def same_as_kernel(reference: Callable[..., np.ndarray], inputs: Sequence[np.ndarray], kernel_output: np.ndarray,
                   rtol: float = 1e-4, atol: float = 1e-4) -> Verdict:
    """`reference(*inputs)`, computed in float64, equals what the exported kernel wrote
    (`kernel_output`) within the tolerances the export's check uses for float32."""
    try:
        mine = np.asarray(reference(*(np.asarray(x, dtype=np.float64) for x in inputs)))
    except Exception as err:  # the reader's expression: any error is the answer's, said in one line
        return Verdict(False, f"your expression raised {type(err).__name__}: {err}")
    if mine.shape != kernel_output.shape:
        return Verdict(False, f"your expression gives shape {mine.shape}, the kernel's output is {kernel_output.shape}")
    error = float(np.abs(mine - kernel_output).max())
    ok = bool(np.allclose(kernel_output, mine, rtol=rtol, atol=atol))
    return Verdict(ok, f"largest difference from the kernel's output {error:.2e} "
                       f"({'within' if ok else 'beyond'} rtol {rtol:g}, atol {atol:g})")


def grid_size(candidate, predicted: int | None) -> Verdict:
    """`predicted` is the number of unit tiles (the grid) of the candidate's rProgram: the
    product over the spatial axes of extent / unit tile, rounded up."""
    if (none := _unanswered(predicted)) is not None:
        return none
    program = candidate.program
    why = f"unit tile {program.unit_tile}: a grid of {program.grid} tiles"
    return Verdict(predicted == program.grid, why if predicted == program.grid else f"you said {predicted}; {why}")


# Lesson 6: irregular shapes.

def fused_extents(expr, predicted: Sequence[int] | None) -> Verdict:
    """`predicted` is the axes' extents of `expr` after axis fusion (ops.fusion.fuse_axes)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    fused = fuse_axes(expr)
    truth = tuple(a.extent for a in fused.axes)
    why = f"{tuple(a.extent for a in expr.axes)} fuses to {truth}"
    return Verdict(tuple(predicted) == truth, why if tuple(predicted) == truth else f"you said {tuple(predicted)}; {why}")


def eps_rounds(steps, predicted: int | None) -> Verdict:
    """`predicted` is how many times a construction raised eps: its `widen_eps` steps among
    `steps` (a Stepper's `steps`)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    widened = [s for s in steps if s.action.kind == "widen_eps"]
    final = widened[-1].action.eps if widened else EPS_STEPS[0]
    why = f"{len(widened)} eps rounds added, the last at eps {final}"
    return Verdict(predicted == len(widened), why if predicted == len(widened) else f"you said {predicted}; {why}")


# Lesson 7: whole models.

def wave_width(construction, wave: int, predicted: int | None) -> Verdict:
    """`predicted` is how many operators share wave `wave` of the model's co-schedule."""
    if (none := _unanswered(predicted)) is not None:
        return none
    names = [r.operator.name for r in construction.results if r.supported]
    members = [names[op] for op in construction.plan.waves[wave].ops]
    why = f"wave {wave} holds {len(members)}: {', '.join(members)}"
    return Verdict(predicted == len(members), why if predicted == len(members) else f"you said {predicted}; {why}")


def rammer_gain(construction, predicted: float | None, rel: float = 0.05) -> Verdict:
    """`predicted` is the model's Rammer gain (one kernel at a time over the co-schedule) within
    `rel`; the message splits what launches account for."""
    if (none := _unanswered(predicted)) is not None:
        return none
    plan, gain = construction.plan, construction.rammer_gain
    saved = (plan.sequential_launches - plan.launches) * plan.launch_seconds
    why = (f"gain {gain:.3g}: {duration(construction.sum_seconds)} one at a time, {duration(plan.seconds)} co-scheduled; "
           f"{plan.sequential_launches - plan.launches} fewer launches save {duration(saved)}")
    return Verdict(_close(predicted, gain, rel), why if _close(predicted, gain, rel) else f"you said {predicted:.3g}; {why}")


# Lesson 8: dynamic shapes.

def dispatcher_pick(plan, value: int, predicted: str | None) -> Verdict:
    """`predicted` is the kernel the run-time dispatcher picks at `value` (its least predicted
    time among the plan's kernels, pipeline.vortex_pick)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    ids = [k for k, _ in plan.table.kernels]
    times = {k: plan.seconds(k, value) for k in ids}
    pick = min(ids, key=lambda k: (times[k], ids.index(k)))
    why = ", ".join(f"{k} (outer {plan.outer(k)}, runs {plan.padded(k, value)}) {duration(times[k])}" for k in ids)
    return Verdict(predicted == pick, f"at {plan.dyn.param}={value} the dispatcher picks {pick}: {why}")


def padded_rows(plan, kernel: str, value: int, predicted: int | None) -> Verdict:
    """`predicted` is the extent `kernel` runs for `value`: whole outer tiles (VortexPlan.padded)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    outer, rows = plan.outer(kernel), plan.padded(kernel, value)
    why = f"{kernel}'s outer tile is {outer}: ceil({value} / {outer}) x {outer} = {rows}"
    return Verdict(predicted == rows, why if predicted == rows else f"you said {predicted}; {why}")


# Lesson 9: design a device.

def slowdown(diff, predicted: float | None, rel: float = 0.02) -> Verdict:
    """`predicted` is how many times slower the edited device runs the workload of `diff` (a
    `whatif.WorkloadDiff`): the edited top-1's predicted time over the base top-1's, within `rel`
    (2%: the lesson asks whether half the SMs is exactly 2x, and the answer is 1.91x)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    base, edited = diff.base_top.predicted_seconds, diff.edited_top.predicted_seconds
    truth = edited / base
    why = f"base {duration(base)}, edited {duration(edited)}: {truth:.3g}x slower"
    return Verdict(_close(predicted, truth, rel), why if _close(predicted, truth, rel) else f"you said {predicted:.3g}x; {why}")


def top1_changes(diff, predicted: bool | None) -> Verdict:
    """`predicted` says whether the edit of `diff` (a `whatif.WorkloadDiff`) changes the top-1
    program (`WorkloadDiff.changed`)."""
    if (none := _unanswered(predicted)) is not None:
        return none
    why = f"the top-1 {'changes' if diff.changed else 'stays'}: {diff.text}"
    return Verdict(predicted == diff.changed, why)
