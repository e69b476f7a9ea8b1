"""The offline model benchmark (`workbench bench model`): stored measurements re-predicted by the
current model, scored per machine.

A *runs file* is either a runs store (SQLite, `profile.store`) or a file `workbench runs export`
writes from one (`RunStore.dump_runs`, JSON or gzip-compressed JSON: small enough to commit as a
test fixture). Each run is read with the device spec it was measured with (calibrated bandwidths
and micro-kernels included) and each candidate at its fastest correct repeat (the time `profile`
compares).

Scoring (`score`): a workload's candidates on one machine (every stored run of it, a program
measured in several runs counted once at its fastest) are predicted afresh with
`rtile.model.estimate`; its score is Spearman(predicted, measured) and whether the measured
fastest is among the first three in predicted order (predicted seconds, then the stored rank, so
ties break as the construction ranked them). A machine's score is the mean Spearman over its
workloads where it is defined and the share of its workloads with the best in the top 3.

A candidate stored with the plan its kernel was built from (`rtile.plan`, under the program's
"plan": `RunStore.start_run` writes it) whose plan the template would now make otherwise is left
out (`WorkloadScore.stale`): its time is of a kernel this version no longer builds for it.
Candidates stored without a plan (runs recorded before plans were stored) are all scored.

Beside it, how far the measurements agree with themselves (`runs_agree`): Spearman between two
stored runs of a workload over the programs both measured, the mean over every pair of its runs.
No model can be expected to rank a workload better than its own runs rank each other: where its
programs run within the host's noise of one another, both are low.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import UserError
from workbench.fmt import signed
from workbench.hardware.spec import DeviceSpec
from workbench.profile.compare import json_float, nan_mean, spearman
from workbench.profile.store import RunStore, older_schema, read_only, read_runs_file

TOP = 3  # "best in the predicted top 3"
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class Measured:
    """A stored candidate: its construction rank, its program (`RProgram.to_dict`) and its time."""

    rank: int
    program: dict
    measured_seconds: float


@dataclass(frozen=True)
class StoredRun:
    """A profile run as the benchmark reads it: the machine, the spec it was measured with, the
    workload (`TensorExpr.workload_dict` plus its label) and its correctly measured candidates."""

    machine: str
    spec: DeviceSpec
    workload: dict
    candidates: tuple[Measured, ...]

    @property
    def label(self) -> str:
        return str(self.workload.get("label") or _describe(self.workload))


@dataclass(frozen=True)
class WorkloadScore:
    """One workload on one machine: Spearman(predicted, measured) (NaN: undefined), the measured
    fastest's place in predicted order (1-based), how many candidates were scored, how well
    its runs agree with each other (`runs_agree`; NaN with fewer than two runs to compare) and
    how many stored candidates were left out as built otherwise now (`stale`)."""

    machine: str
    workload: str
    candidates: int
    spearman: float
    best_predicted_rank: int
    runs_spearman: float = math.nan
    stale: int = 0

    @property
    def best_in_top(self) -> bool:
        return self.best_predicted_rank <= TOP

    def to_dict(self) -> dict:
        return {"workload": self.workload, "candidates": self.candidates, "spearman": json_float(self.spearman),
                "best_predicted_rank": self.best_predicted_rank, f"best_in_top{TOP}": self.best_in_top,
                "runs_spearman": json_float(self.runs_spearman), "stale": self.stale}


@dataclass(frozen=True)
class MachineScore:
    """A machine's workload scores, and the workloads the current workbench cannot rebuild (an
    operator or a parameter it no longer has), with why."""

    machine: str
    workloads: tuple[WorkloadScore, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def mean_spearman(self) -> float:
        return nan_mean(w.spearman for w in self.workloads)

    @property
    def mean_runs_spearman(self) -> float:
        return nan_mean(w.runs_spearman for w in self.workloads)

    @property
    def best_in_top_share(self) -> float:
        return sum(w.best_in_top for w in self.workloads) / len(self.workloads) if self.workloads else math.nan

    def to_dict(self) -> dict:
        return {"machine": self.machine, "workloads": len(self.workloads),
                "mean_spearman": json_float(self.mean_spearman), f"best_in_top{TOP}": json_float(self.best_in_top_share),
                "mean_runs_spearman": json_float(self.mean_runs_spearman),
                "results": [w.to_dict() for w in self.workloads],
                "skipped": [{"workload": w, "why": why} for w, why in self.skipped]}


# -- scoring (pure but for the model it calls) ------------------------------------------------------


def predicted_seconds(spec: DeviceSpec, workload: dict, program: dict) -> float | None:
    """The current model's time of `program` (`RProgram.to_dict`, with its "plan" where it was
    stored with one) for `workload` on `spec`; None where the stored plan is not the one the
    template makes of the program now (module docstring)."""
    from workbench.rtile.model import estimate
    from workbench.rtile.plan import plan_for
    from workbench.workload import stored_program

    rebuilt = stored_program(workload, program, spec)
    if "plan" in program and json.loads(json.dumps(plan_for(rebuilt, spec).to_dict(rebuilt.expr))) != program["plan"]:
        return None  # compared as stored: JSON has lists where a plan may hold tuples
    return estimate(rebuilt, spec).predicted_seconds


def score_workload(machine: str, workload: str, ranks: Sequence[int], predicted: Sequence[float],
                   measured: Sequence[float], runs_spearman: float = math.nan, stale: int = 0) -> WorkloadScore:
    """The score of one workload's candidates (module docstring) from their stored ranks and
    predicted and measured seconds."""
    order = sorted(range(len(ranks)), key=lambda i: (predicted[i], ranks[i]))
    best = min(range(len(measured)), key=lambda i: (measured[i], ranks[i]))
    return WorkloadScore(machine, workload, len(ranks), spearman(predicted, measured), order.index(best) + 1,
                         runs_spearman, stale)


def runs_agree(runs: Sequence[dict[str, float]]) -> float:
    """The mean Spearman between every two of a workload's `runs` (each its programs' measured
    seconds by program) over the programs both measured, pairs sharing fewer than three left
    out; NaN where no pair is left or none is defined."""
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            shared = [p for p in a if p in b]
            if len(shared) >= 3:
                pairs.append(spearman([a[p] for p in shared], [b[p] for p in shared]))
    return nan_mean(pairs)


def score(runs: Iterable[StoredRun]) -> tuple[MachineScore, ...]:
    """Every machine's score over `runs` (module docstring), machines and workloads in first-seen
    order. A workload with fewer than two measured candidates has nothing to rank and is left out."""
    groups: dict[tuple[str, str], dict[str, tuple[Measured, StoredRun]]] = {}
    each_run: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in runs:
        by_program = groups.setdefault((run.machine, run.label), {})
        this_run = {}
        for c in run.candidates:
            key = json.dumps(c.program, sort_keys=True)
            this_run[key] = c.measured_seconds
            if key not in by_program or c.measured_seconds < by_program[key][0].measured_seconds:
                by_program[key] = (c, run)
        each_run.setdefault((run.machine, run.label), []).append(this_run)
    machines: dict[str, list[WorkloadScore]] = {}
    skipped: dict[str, list[tuple[str, str]]] = {}
    for (machine, label), by_program in groups.items():
        scored = machines.setdefault(machine, [])
        if len(by_program) < 2:
            continue
        try:
            priced = [(c, predicted_seconds(run.spec, run.workload, c.program)) for c, run in by_program.values()]
        except (UserError, KeyError, ValueError, IndexError) as err:  # an operator or axis this version lacks
            skipped.setdefault(machine, []).append((label, f"{type(err).__name__}: {err}"))
            continue
        kept = [(c, p) for c, p in priced if p is not None]
        stale = len(priced) - len(kept)
        if len(kept) < 2:
            skipped.setdefault(machine, []).append(
                (label, f"{stale} of its {len(priced)} programs are built otherwise now (their stored plans are "
                        f"not the template's): too few left to rank"))
            continue
        scored.append(score_workload(machine, label, [c.rank for c, _ in kept], [p for _, p in kept],
                                     [c.measured_seconds for c, _ in kept], runs_agree(each_run[machine, label]),
                                     stale))
    return tuple(MachineScore(m, tuple(ws), tuple(skipped.get(m, ()))) for m, ws in machines.items())


def report_dict(scores: Sequence[MachineScore], files: Sequence[str]) -> dict:
    """The JSON document of `workbench bench model` (docs/cli.md)."""
    return {"files": list(files), "top": TOP, "machines": [s.to_dict() for s in scores]}


def report_text(scores: Sequence[MachineScore]) -> str:
    lines = []
    for s in scores:
        lines.append(f"{s.machine}: mean Spearman {signed(s.mean_spearman)}, best in predicted top {TOP} "
                     f"{sum(w.best_in_top for w in s.workloads)}/{len(s.workloads)} workloads; "
                     f"its runs agree {signed(s.mean_runs_spearman)}")
        for w in s.workloads:
            lines.append(f"  {w.workload:28s} {w.candidates:3d} candidates  spearman {signed(w.spearman):>6s}  "
                         f"best at predicted #{w.best_predicted_rank:<3d} runs agree {signed(w.runs_spearman):>6s}"
                         + (f"  ({w.stale} built otherwise now, left out)" if w.stale else ""))
        lines += [f"  {w:28s} skipped: {why}" for w, why in s.skipped]
    return "\n".join(lines) if lines else "no measured runs in these files"


# -- reading runs files -----------------------------------------------------------------------------


def machine_label(spec: DeviceSpec) -> str:
    """A machine's name: the spec's name, and for a CPU its LLVM CPU, cores and last-level cache
    where the spec names one (`local-cpu` on an AVX2 and an AVX-512 machine are different
    machines, and so are two Xeons LLVM calls `sapphirerapids` with a 300 and a 120 MiB L3)."""
    target = spec.target_dict()
    if spec.runs_on_cpu and "mcpu" in target:
        llc = f", {spec.llc_bytes / 1024**2:g} MiB LLC" if spec.llc_bytes else ""
        return f"{spec.name} ({target['mcpu']}, {spec.compute_units} cores{llc})"
    return spec.name


def load_runs(path: str | os.PathLike) -> tuple[StoredRun, ...]:
    """The runs of a runs store (SQLite) or of a `runs export` file (read through a temporary
    store, so both are read alike); a store of an older schema is read through a migrated copy,
    never rewritten. UserError names what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise UserError(f"--runs {path}: cannot read ({err.strerror})") from None
    if head == SQLITE_MAGIC:
        if not older_schema(path):
            with RunStore(path) as store:
                return store_runs(store)
        # read through a migrated copy: scoring another machine's store never rewrites it
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "runs.sqlite3"
            try:
                with closing(read_only(path)) as source, closing(sqlite3.connect(copy)) as target:
                    source.backup(target)
            except sqlite3.Error as err:
                raise UserError(f"--runs {path}: cannot read ({err})") from None
            with RunStore(copy) as store:
                return store_runs(store)
    doc = read_runs_file(path, "--runs")
    with tempfile.TemporaryDirectory() as folder, RunStore(Path(folder) / "runs.sqlite3") as store:
        store.load_runs(doc, f"--runs {path}")
        return store_runs(store)


def store_runs(store: RunStore) -> tuple[StoredRun, ...]:
    """The runs of `store` with at least one correct measurement, each named by its spec's
    `machine_label`."""
    out = []
    for run in store.runs():
        fastest: dict[int, float] = {}
        for m in store.measurements_of(run.id):
            if m.measurement.ok and m.measurement.best_seconds > 0:
                fastest[m.rank] = min(fastest.get(m.rank, math.inf), m.measurement.best_seconds)
        if not fastest:
            continue
        programs = store.programs_of(run.id)
        spec = store.device_of(run.id)
        out.append(StoredRun(machine_label(spec), spec, run.workload_dict,
                             tuple(Measured(rank, programs[rank], s) for rank, s in sorted(fastest.items()))))
    return tuple(out)


def _describe(workload: dict) -> str:
    return f"{workload.get('op')} " + ",".join(f"{k}={v}" for k, v in workload.items() if k not in ("op", "dtype"))
