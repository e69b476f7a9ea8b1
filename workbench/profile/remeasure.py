"""A comparison's kernels measured again here, in turn (`workbench runs compare --remeasure`).

Stored runs are compared run against run (`versus`), and a shared host drifts between runs by far
more than a change worth catching: the run-to-run sd of a log time was 0.70 on a loaded host, and
a run of a workload's kernels can fall into a spell that slows everything by 40 % (evidence:
docs/evidence.md#timing-in-turn). Timed in turn, a few hundred milliseconds apart, kernels
share the spell, and the ratio of one round's times cancels it. So for each compared workload each
side's stored kernels (each run's `versus.CONTENDERS` fastest: a run's fastest few are near ties,
and which of them its drift put first says nothing of the code) are rebuilt from the store, checked
and timed one after another, round after round (`session.time_in_turns`); a program both sides
stored is built and timed once, for both. Each side's fastest here is the contender with the least
geometric mean over the rounds, and B/A is exp of the mean of the rounds' log ratios of those two,
its interval Student's t on their spread (rounds - 1 degrees of freedom); verdicts as
`versus.verdict`, with its margin and confidence. When both sides' fastest is one program the ratio
is 1 in every round: the two sides hold the same kernel.

What this compares is the programs, built by this checkout on this machine: a change in which
programs a run stored (a spec, a policy, the model's ranking) is what it confirms or refutes, not a
change in code generation between two commits (both are rebuilt by the same code), and the two
sides' kernels must run here. Runs whose devices this machine cannot run, or whose stored
programs no longer build, are not comparable, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from workbench.errors import UserError
from workbench.profile.runner import Measurement, Timing
from workbench.profile.versus import NOT_COMPARABLE, RatioInterval, Remeasured, RunsComparison, Side, \
    WorkloadComparison, t_quantile, verdict

# Each side's kernel timed 20 times, in turn with the other's: with 10, a round or two that a
# change of the host's speed split widened the t interval past 7-13 % slowdowns (2 of 7 missed on
# the Zen 4); with 20 none of 6 (docs/benchmarks.md, "Remeasured in turn").
ROUNDS = 20
MAX_ROUNDS = 100
IN_TURN = "in turn"  # the noise model of a remeasured workload (beside versus.RUNS and versus.FLOOR)

# (expression, device, candidate) per kernel, rounds -> per kernel, one Measurement per round
Measure = Callable[[Sequence[tuple], int], Sequence[Sequence[Measurement]]]
Rebuild = Callable[[int, int], tuple]  # (run id, rank) -> (expression, device, candidate)


def contenders(side: Side) -> tuple[tuple[int, int], ...]:
    """(run, rank) of the kernels the remeasure times for `side`: its runs' few fastest."""
    return side.contenders or side.kernels


def paired_interval(a: Sequence[float], b: Sequence[float], confidence: float) -> RatioInterval:
    """B / A from times taken in turn (round i: a[i], then b[i]): exp of the mean of the rounds'
    log ratios, with its Student-t interval at `confidence` (at least two rounds)."""
    d = np.log(np.asarray(b, dtype=float)) - np.log(np.asarray(a, dtype=float))
    n = len(d)
    if n < 2:
        raise ValueError(f"a paired interval needs at least two rounds, got {n}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), confidence, n, n, sd, n - 1,
                         IN_TURN)


def remeasure(comparison: RunsComparison, rebuild: Rebuild, rounds: int = ROUNDS, timing: Timing = Timing(),
              measure: Measure | None = None, cannot_run: Callable[[object], str] | None = None,
              progress: Callable[[str], None] | None = None) -> RunsComparison:
    """`comparison` with each workload both sides measured re-decided from the sides' fastest
    stored kernels timed here in turn, `rounds` times each (module docstring). `rebuild(run, rank)` gives a
    stored kernel's (expression, device, candidate), UserError when it cannot
    (`pipeline.stored_kernel`: the workload's expression needs `workload.py`, a room above this
    one). `measure` and `cannot_run` default to the local runner's (`session.time_in_turns`,
    `session.cannot_run_locally`); tests pass deterministic ones. A workload whose kernels cannot
    be rebuilt, run here or verified is not comparable, with the reason."""
    if not 2 <= rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be 2 to {MAX_ROUNDS}, got {rounds}")
    if measure is None or cannot_run is None:
        from workbench.profile.session import cannot_run_locally, time_in_turns
        from workbench.workers import WorkerPool

        with WorkerPool() as pool:
            return remeasure(comparison, rebuild, rounds, timing,
                             measure or (lambda sides, n: time_in_turns(sides, timing, n, pool)),
                             cannot_run or (lambda spec: cannot_run_locally(spec, pool)), progress)
    notify = progress or (lambda text: None)
    rows = []
    for i, w in enumerate(comparison.workloads):
        if w.a is None or w.b is None:
            rows.append(w)
            continue
        notify(f"remeasure {i + 1}/{len(comparison.workloads)}: {w.workload}")
        rows.append(_remeasured(w, rebuild, rounds, comparison.confidence, comparison.margin, measure, cannot_run))
    return replace(comparison, workloads=tuple(rows), rounds=rounds)


def _remeasured(w: WorkloadComparison, rebuild: Rebuild, rounds: int, confidence: float, margin: float,
                measure: Measure, cannot_run: Callable[[object], str]) -> WorkloadComparison:
    kernels = contenders(w.a), contenders(w.b)
    programs: list[tuple] = []  # distinct (expression, device, candidate), each timed once
    where: list[list[int]] = [[], []]  # per side, its contenders' indices into `programs`
    for side, stored in zip(where, kernels):
        for run, rank in stored:
            try:
                built = rebuild(run, rank)
            except UserError as err:
                return _not_comparable(w, f"cannot rebuild: {err}")
            key = (built[2].program, built[1])  # the same schedule of the same expression on the same spec
            found = next((i for i, p in enumerate(programs) if (p[2].program, p[1]) == key), None)
            if found is None:
                programs.append(built)
                found = len(programs) - 1
            side.append(found)
    for spec in dict.fromkeys(spec for _, spec, _ in programs):
        problem = cannot_run(spec)
        if problem:
            return _not_comparable(w, f"cannot run {spec.name}'s kernels here: {problem}")
    measured = measure(programs, rounds)
    for name, side, stored in zip("AB", where, kernels):
        for i, (run, rank) in zip(side, stored):
            failed = next((m for m in measured[i] if not m.ok), None)
            if failed is not None:
                return _not_comparable(w, f"{name}'s kernel (run {run}, rank {rank}) failed here: {failed.error}")
    rounds_of = [tuple(m.median_seconds for m in ms) for ms in measured]
    geomean = [math.exp(float(np.mean(np.log(t)))) for t in rounds_of]
    fastest = [min(range(len(side)), key=lambda k: (geomean[side[k]], k)) for side in where]
    a, b = (rounds_of[side[k]] for side, k in zip(where, fastest))
    interval = paired_interval(a, b, confidence)
    v, why = verdict(interval, margin)
    same = where[0][fastest[0]] == where[1][fastest[1]]
    if same:
        why = "both sides' fastest here is the same program"
    tried = [tuple((run, rank, geomean[i]) for i, (run, rank) in zip(side, stored)) for side, stored in zip(where, kernels)]
    chosen = [stored[k] for stored, k in zip(kernels, fastest)]
    return replace(w, interval=interval, verdict=v, why=why,
                   remeasured=Remeasured(chosen[0], chosen[1], a, b, tried[0], tried[1], same))


def _not_comparable(w: WorkloadComparison, why: str) -> WorkloadComparison:
    return replace(w, interval=None, verdict=NOT_COMPARABLE, why=why)
