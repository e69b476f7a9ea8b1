"""Kernel benchmarks over a suite: construct, profile the top-K, and time the baselines in the
same run, so every figure is a ratio measured side by side (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from workbench import pipeline
from workbench.hardware.spec import DeviceSpec
from workbench.profile.baselines import Baseline
from workbench.profile.compare import aggregate, compare, geometric_mean
from workbench.profile.runner import Timing
from workbench.profile.store import RunStore
from workbench.vortex.compare import bench_dynamic, parse_values
from workbench.workers import WorkerPool
from workbench.workload import Workload

# `workbench bench dynamic` runs Vortex's comparison (workbench/vortex/compare.py) from here too, so
# every `bench` subcommand has one home.
__all__ = ["KernelBench", "bench_workload", "bench_suite", "bench_dynamic", "parse_values"]

NO_CANDIDATES = "the construction found no candidates"


@dataclass(frozen=True)
class KernelBench:
    """One workload's row: the workbench's best-of-top-K per policy and each baseline, same run.
    The first policy is the row's main result; the others are measured right after it.
    `rank1_seconds` is the first policy's predicted-best kernel's time (None when it failed);
    `error` says why the first policy has nothing to time (a construction without candidates).
    `tied`: the first policy's ranks its repeats cannot tell apart from its measured best, the
    best included (`ProfileResult.within_noise_of_best`)."""

    id: str
    policy: str
    construct_seconds: float
    profile_seconds: float
    best_seconds: float | None
    best_rank: int | None
    spearman: float | None
    baselines: tuple[tuple[str, dict], ...]
    comparison: object
    others: tuple[tuple[str, dict], ...] = ()  # (policy, its best_seconds / best_rank / ...)
    baseline_seconds: float = 0.0  # wall time of timing the baselines: the comparison's, not ours
    rank1_seconds: float | None = None
    workload: tuple[tuple[str, object], ...] = ()  # the workload as `TensorExpr.workload_dict()` has it
    error: str = ""
    tied: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        base = {name: r["seconds"] for name, r in self.baselines}
        return {
            "id": self.id,
            "workload": dict(self.workload),
            "policy": self.policy,
            "construct_seconds": self.construct_seconds,
            "profile_seconds": self.profile_seconds,
            "baseline_seconds": self.baseline_seconds,
            "best_seconds": self.best_seconds,
            "best_rank": self.best_rank,
            "rank1_seconds": self.rank1_seconds,
            "error": self.error,
            "spearman": self.spearman,
            "within_noise_of_best": list(self.tied),
            "baselines": base,
            "speed_ratio": {name: _ratio(t, self.best_seconds) for name, t in base.items()},
            "rank1_speed_ratio": {name: _ratio(t, self.rank1_seconds) for name, t in base.items()},
            "baseline_details": dict(self.baselines),
            "policies": dict(self.others),
        }


def _profile_policy(workload, device, policy, topk, store, timing, seed, pool, label):
    """(construction, its ProfileResult, or None when it has no candidate: the suite goes on)."""
    built = pipeline.construct(pipeline.request(workload, device, policy, pipeline.Options(topk=topk, seed=seed)))
    if not built.candidates:
        return built, None
    built, _ = pipeline.rank_by_correction(built, store)  # where the device's correction earned it
    return built, pipeline.profile(built, label=workload.describe(), store=store, timing=timing, pool=pool,
                                   run_label=label)


def bench_workload(
    workload: Workload,
    device: DeviceSpec,
    *,
    policies: Sequence[str],
    topk: int,
    baselines: Sequence[Baseline],
    store: RunStore | None,
    timing: Timing = Timing(),
    seed: int = 0,
    pool: WorkerPool | None = None,
    label: str = "",
) -> KernelBench:
    """One workload's row, its runs stored under `label`; builds and runs in `pool`'s warm
    workers when given."""
    runs = [(p, *_profile_policy(workload, device, p, topk, store, timing, seed, pool, label)) for p in policies]
    policy, built, result = runs[0]
    best = result.best if result else None
    rank1 = next((m for m in result.measurements if m.rank == 1 and m.ok), None) if result else None
    comparison = result.comparison if result else compare((), (), ())  # no measurement: left out of the model's
    start = time.perf_counter()
    measured = tuple((b.name, b.measure(built.expr, device).to_dict()) for b in baselines)
    baseline_seconds = time.perf_counter() - start
    others = tuple(
        (p, {"best_seconds": r.best.best_seconds if r and r.best else None,
             "best_rank": r.best.rank if r and r.best else None, "construct_seconds": c.seconds,
             "spearman": r.comparison.to_dict()["spearman"] if r else None, "error": "" if r else NO_CANDIDATES})
        for p, c, r in runs
    )
    return KernelBench(
        id=workload.label.split(":", 1)[-1],
        policy=policy,
        construct_seconds=built.seconds,
        profile_seconds=result.seconds if result else 0.0,
        best_seconds=best.best_seconds if best else None,
        best_rank=best.rank if best else None,
        spearman=comparison.to_dict()["spearman"],
        baselines=measured,
        comparison=comparison,
        others=others,
        baseline_seconds=baseline_seconds,
        rank1_seconds=rank1.best_seconds if rank1 else None,
        workload=tuple(built.expr.workload_dict().items()),
        error="" if result else NO_CANDIDATES,
        tied=result.within_noise_of_best if result else (),
    )


# The top K the noise-aware count reads (`tied_share`): the acceptance's "best in the predicted top 3".
TIED_TOP = 3


def tied_in_top(best_rank: int, tied: Sequence[int], k: int = TIED_TOP) -> bool:
    """Whether the predicted top `k` holds the measured best (at `best_rank`) or a kernel its
    repeats cannot tell apart from it (`tied`, the best included where it had repeats)."""
    return min(tied or (best_rank,)) <= k


def tied_share(rows: Sequence[KernelBench], k: int = TIED_TOP) -> float | None:
    """The share of the measured workloads whose predicted top `k` holds the measured best or a
    kernel its repeats cannot tell apart from it (`tied_in_top`): the model's misses that are a
    measured difference, not a tie the repeats leave open. None when none was measured."""
    measured = [r for r in rows if r.best_rank is not None]
    if not measured:
        return None
    return sum(tied_in_top(r.best_rank, r.tied, k) for r in measured) / len(measured)


def _ratio(reference: float | None, ours: float | None) -> float | None:
    """reference_time / workbench_time (> 1: the workbench is faster); None without both."""
    return reference / ours if reference and ours else None


def _geomean_speedup(pairs) -> float | None:
    """Geometric mean of reference_time / workbench_time over pairs where both exist."""
    pairs = [(ref, ours) for ref, ours in pairs if ref and ours]
    return geometric_mean([ref / ours for ref, ours in pairs]) if pairs else None


def bench_suite(
    workloads: Sequence[Workload],
    device: DeviceSpec,
    *,
    policies: Sequence[str],
    topk: int,
    baselines: Sequence[Baseline],
    store: RunStore | None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    label: str = "",
) -> dict:
    """Every workload (a Markov walk seeded with `seed`; its runs stored under `label`), then the suite's aggregates: speed
    ratios of the first policy to each baseline (geometric mean of baseline_time /
    workbench_time, > 1 means the workbench is faster) for its best of the top K
    (`speed_ratio_geomean`) and its rank 1 alone (`rank1_speed_ratio_geomean`), of every other
    policy to the first, and the model's rank correlation.
    `workbench_seconds` is the suite's wall time less the baselines' timing: ours alone, worker
    starts and imports on the way included, which the rows' construct + profile seconds miss."""
    start = time.perf_counter()
    rows = []
    with WorkerPool() as pool:  # TVM imported once per worker for the whole suite, not per workload
        for i, w in enumerate(workloads):
            if progress:
                progress(f"[{i + 1}/{len(workloads)}] {w.describe()}")
            rows.append(bench_workload(w, device, policies=policies, topk=topk, baselines=baselines, store=store,
                                       seed=seed, pool=pool, label=label))
    seconds = time.perf_counter() - start
    ratios = {b.name: _geomean_speedup((dict(r.baselines)[b.name]["seconds"], r.best_seconds) for r in rows) for b in baselines}
    rank1 = {b.name: _geomean_speedup((dict(r.baselines)[b.name]["seconds"], r.rank1_seconds) for r in rows)
             for b in baselines}
    versus = {
        f"{p}/{policies[0]}": _geomean_speedup((r.best_seconds, dict(r.others)[p]["best_seconds"]) for r in rows)
        for p in policies[1:]
    }
    return {
        "device": device.name,
        "policy": policies[0],
        "policies": list(policies),
        "topk": topk,
        "results": [r.to_dict() for r in rows],
        "speed_ratio_geomean": ratios,
        "rank1_speed_ratio_geomean": rank1,
        "policy_speed_ratio_geomean": versus,
        "model": aggregate([r.comparison for r in rows]).to_dict()
        | {f"best_in_top{TIED_TOP}_within_noise": tied_share(rows)},
        "bench_seconds": seconds,
        "workbench_seconds": seconds - sum(r.baseline_seconds for r in rows),
        "construct_profile_seconds": sum(r.construct_seconds + r.profile_seconds for r in rows),
    }
