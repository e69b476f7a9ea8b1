"""Kernel benchmarks over a suite: construct, profile the top-K, and time the baselines in the
same run, so every figure is a ratio measured side by side (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.hardware.spec import DeviceSpec
from workbench.profile.baselines import Baseline
from workbench.profile.compare import aggregate, geometric_mean
from workbench.profile.runner import Timing
from workbench.profile.session import profile_candidates
from workbench.profile.store import RunStore
from workbench.workload import Workload


@dataclass(frozen=True)
class KernelBench:
    """One workload's row: the workbench's best-of-top-K and each baseline, same run."""

    id: str
    construct_seconds: float
    profile_seconds: float
    best_seconds: float | None
    best_rank: int | None
    spearman: float | None
    baselines: tuple[tuple[str, dict], ...]
    comparison: object

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "construct_seconds": self.construct_seconds,
            "profile_seconds": self.profile_seconds,
            "best_seconds": self.best_seconds,
            "best_rank": self.best_rank,
            "spearman": self.spearman,
            "baselines": {name: r["seconds"] for name, r in self.baselines},
            "baseline_details": dict(self.baselines),
        }


def bench_workload(
    workload: Workload,
    device: DeviceSpec,
    *,
    policy: str,
    topk: int,
    baselines: Sequence[Baseline],
    store: RunStore | None,
    timing: Timing = Timing(),
    seed: int = 0,
) -> KernelBench:
    built = construct(workload.build(), device, policy, Options(topk=topk, seed=seed))
    result = profile_candidates(
        built.expr, device, built.candidates, store=store, workload_label=workload.describe(), policy=policy, timing=timing
    )
    best = result.best
    measured = tuple((b.name, b.measure(built.expr, device).to_dict()) for b in baselines)
    return KernelBench(
        id=workload.label.split(":", 1)[-1],
        construct_seconds=built.seconds,
        profile_seconds=result.seconds,
        best_seconds=best.best_seconds if best else None,
        best_rank=best.rank if best else None,
        spearman=result.comparison.to_dict()["spearman"],
        baselines=measured,
        comparison=result.comparison,
    )


def bench_suite(
    workloads: Sequence[Workload],
    device: DeviceSpec,
    *,
    policy: str,
    topk: int,
    baselines: Sequence[Baseline],
    store: RunStore | None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every workload, then the suite's aggregates: speed ratios to each baseline (geometric
    mean of baseline_time / workbench_time, > 1 means the workbench is faster) and the model's
    rank correlation."""
    start = time.perf_counter()
    rows = []
    for i, w in enumerate(workloads):
        if progress:
            progress(f"[{i + 1}/{len(workloads)}] {w.describe()}")
        rows.append(bench_workload(w, device, policy=policy, topk=topk, baselines=baselines, store=store))
    ratios = {}
    for b in baselines:
        pairs = [(dict(r.baselines)[b.name]["seconds"], r.best_seconds) for r in rows]
        pairs = [(base, ours) for base, ours in pairs if base and ours]
        ratios[b.name] = geometric_mean([base / ours for base, ours in pairs]) if pairs else None
    return {
        "device": device.name,
        "policy": policy,
        "topk": topk,
        "results": [r.to_dict() for r in rows],
        "speed_ratio_geomean": ratios,
        "model": aggregate([r.comparison for r in rows]).to_dict(),
        "bench_seconds": time.perf_counter() - start,
    }
