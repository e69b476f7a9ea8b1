"""Which parameters of the space matter: parameter importance and slices over stored measurements.

A *trial* is one correct, timed measurement of one candidate in one run of a (workload, device),
with the parameters of the candidate's rProgram: its tile extent per memory layer and axis
("L1.i", "registers.j"), its grid ("grid") and, on GPUs, its virtual threads per axis
("vthreads.i", 1 where the program has none). The time of a trial is its best repeat, the time the
Runs page and the best-so-far curve use.

Importance is measured on log(time) (a tile that halves the time matters as much at 10 us as at
10 ms) and is *marginal*: each parameter is looked at alone, as the correlation ratio of its
groups (trials that share its value). Two parameters that only matter together (an interaction)
show up weaker than they are, and two that always change together (the tiles of one axis at two
layers) share the credit. It says how much of the spread of the measured candidates a parameter
accounts for, not what would happen if it were changed alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from workbench.profile.store import RunRecord, RunStore

GRID = "grid"
VTHREADS = "vthreads"


@dataclass(frozen=True)
class Trial:
    """One correct measurement of candidate `rank` of run `run_id`: its parameters and best time."""

    run_id: int
    rank: int
    params: tuple[tuple[str, int], ...]  # (name, value), in the program's layer and axis order
    seconds: float

    def value(self, parameter: str) -> int | None:
        return dict(self.params).get(parameter)


@dataclass(frozen=True)
class Importance:
    """How much of the variance of log(time) one parameter's groups account for.

    `eta_squared` = SS_between / SS_total (the squared correlation ratio), in [0, 1]; it grows with
    the number of groups even for a parameter unrelated to the time (n distinct values over n
    trials give 1), so `adjusted` (epsilon squared) charges each group its degree of freedom:
    1 - (SS_within / (n - k)) / (SS_total / (n - 1)), clipped at 0; None when every trial has its
    own value (n = k: nothing is left to tell signal from chance)."""

    parameter: str
    eta_squared: float
    adjusted: float | None
    groups: int  # k: distinct values of the parameter among the trials
    trials: int  # n

    def to_dict(self) -> dict:
        return {"parameter": self.parameter, "eta_squared": self.eta_squared, "adjusted": self.adjusted,
                "groups": self.groups, "trials": self.trials}


def parameters(program: Mapping) -> tuple[tuple[str, int], ...]:
    """The parameters of an rProgram in its `RProgram.to_dict` form: `layer.axis` per layer and
    axis, `grid`, and `vthreads.axis` per axis where the program has virtual threads."""
    axes = list(program["axes"])
    params = [(f"{layer['name']}.{axis}", int(layer["tile"][axis])) for layer in program["layers"] for axis in axes]
    params.append((GRID, int(program["grid"])))
    vthreads = program.get("vthreads") or {}
    params += [(f"{VTHREADS}.{axis}", int(vthreads.get(axis, 1))) for axis in axes if vthreads]
    return tuple(params)


def varied(trials: Sequence[Trial]) -> tuple[str, ...]:
    """The parameters every trial has and that take more than one value among them, in the first
    trial's order (a parameter the space never varied says nothing about the time)."""
    if not trials:
        return ()
    common = [name for name, _ in trials[0].params if all(t.value(name) is not None for t in trials)]
    return tuple(name for name in common if len({t.value(name) for t in trials}) > 1)


def importance(trials: Sequence[Trial]) -> tuple[Importance, ...]:
    """The importance of every varied parameter, most important first (by `adjusted`, then
    `eta_squared`, then name); () when fewer than two trials or when every time is the same
    (nothing to explain)."""
    if len(trials) < 2:
        return ()
    logs = [math.log(t.seconds) for t in trials]
    mean = math.fsum(logs) / len(logs)
    total = math.fsum((y - mean) ** 2 for y in logs)
    # Times equal up to rounding: relative to the values themselves, not to 0.
    if total <= 1e-24 * max(1.0, math.fsum(y * y for y in logs)):
        return ()
    found = []
    for name in varied(trials):
        groups: dict[int, list[float]] = {}
        for t, y in zip(trials, logs):
            groups.setdefault(t.value(name), []).append(y)
        within = math.fsum(math.fsum((y - math.fsum(ys) / len(ys)) ** 2 for y in ys) for ys in groups.values())
        n, k = len(logs), len(groups)
        eta = min(1.0, max(0.0, 1.0 - within / total))
        adjusted = max(0.0, 1.0 - (within / (n - k)) / (total / (n - 1))) if n > k else None
        found.append(Importance(name, eta, adjusted, k, n))
    return tuple(sorted(found, key=lambda i: (-(i.adjusted if i.adjusted is not None else -1.0), -i.eta_squared,
                                              i.parameter)))


@dataclass(frozen=True)
class SlicePoint:
    """One trial on the slice of `parameter`: its value and time."""

    value: int
    seconds: float
    run_id: int
    rank: int


def slice_points(trials: Iterable[Trial], parameter: str) -> tuple[SlicePoint, ...]:
    """The trials that have `parameter`, as (value, time) points ordered by value then time."""
    points = [SlicePoint(v, t.seconds, t.run_id, t.rank) for t in trials if (v := t.value(parameter)) is not None]
    return tuple(sorted(points, key=lambda p: (p.value, p.seconds, p.run_id, p.rank)))


def stored_trials(store: RunStore, runs: Iterable[RunRecord]) -> tuple[Trial, ...]:
    """The trials of `runs` (records of `store`, meant to be of one workload and device): every
    correct, timed measurement with its candidate's parameters, by run then rank."""
    trials = []
    for run in runs:
        programs = store.programs_of(run.id)
        for m in store.measurements_of(run.id):
            if m.measurement.ok and m.rank in programs:
                trials.append(Trial(run.id, m.rank, parameters(programs[m.rank]), m.measurement.best_seconds))
    return tuple(trials)
