"""Predicted vs measured: how well the construction's ranking and times match the measurements.

Pure functions over plain numbers. Rank correlations use average ranks for ties (the usual
convention): Spearman's rho is the Pearson correlation of the ranks, Kendall's tau is tau-b,
`(concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y))` over the n0 = n(n-1)/2 pairs.
A correlation of fewer than two points, or of a constant, is undefined: NaN (None in JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

TOP_K = (1, 3, 10)


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks of `values`, ties sharing the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the 1-based rank of the last member of each tie group
    return (last - (counts - 1) / 2.0)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of paired samples (NaN when undefined)."""
    _check_pairs(x, y)
    if len(x) < 2:
        return math.nan
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / denominator) if denominator > 0 else math.nan


def kendall(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of paired samples (NaN when undefined)."""
    _check_pairs(x, y)
    n = len(x)
    if n < 2:
        return math.nan
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    upper = np.triu_indices(n, k=1)
    sx = np.sign(xs[:, None] - xs[None, :])[upper]
    sy = np.sign(ys[:, None] - ys[None, :])[upper]
    pairs = n * (n - 1) / 2
    denominator = math.sqrt((pairs - float((sx == 0).sum())) * (pairs - float((sy == 0).sum())))
    return float((sx * sy).sum() / denominator) if denominator > 0 else math.nan


def _check_pairs(x: Sequence[float], y: Sequence[float]) -> None:
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} and {len(y)}")


def geometric_mean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if len(values) else math.nan


@dataclass(frozen=True)
class Comparison:
    """Predicted vs measured over one workload's candidates that have a correct measurement.

    `best_predicted_rank` is the predicted rank of the measured-fastest candidate (None when no
    candidate measured); `error_ratio` the geometric mean of measured / predicted seconds.
    """

    n: int
    spearman: float
    kendall: float
    best_predicted_rank: int | None
    error_ratio: float

    def best_within_top(self, k: int) -> bool:
        return self.best_predicted_rank is not None and self.best_predicted_rank <= k

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "spearman": json_float(self.spearman),
            "kendall": json_float(self.kendall),
            "best_predicted_rank": self.best_predicted_rank,
            **{f"best_in_top{k}": self.best_within_top(k) for k in TOP_K},
            "error_ratio": json_float(self.error_ratio),
        }


def compare(ranks: Sequence[int], predicted: Sequence[float], measured: Sequence[float | None]) -> Comparison:
    """Compare candidates (predicted rank, predicted seconds, measured seconds or None for a
    candidate without a correct measurement); the None ones are left out of every statistic."""
    rows = [(r, p, m) for r, p, m in zip(ranks, predicted, measured) if m is not None]
    if not rows:
        return Comparison(0, math.nan, math.nan, None, math.nan)
    r, p, m = (list(column) for column in zip(*rows))
    best = min(range(len(rows)), key=lambda i: (m[i], r[i]))
    ratios = [mi / pi for mi, pi in zip(m, p) if pi > 0]
    return Comparison(len(rows), spearman(p, m), kendall(p, m), int(r[best]), geometric_mean(ratios))


@dataclass(frozen=True)
class SuiteComparison:
    """Comparisons of several workloads aggregated: mean correlations (over the workloads where
    they are defined), the fraction of workloads whose measured best is in the predicted top-k,
    and the geometric mean of the per-workload error ratios (each workload weighs the same)."""

    workloads: int
    spearman: float
    kendall: float
    best_in_top: tuple[tuple[int, float], ...]
    error_ratio: float

    def to_dict(self) -> dict:
        return {
            "workloads": self.workloads,
            "spearman": json_float(self.spearman),
            "kendall": json_float(self.kendall),
            **{f"best_in_top{k}": json_float(fraction) for k, fraction in self.best_in_top},
            "error_ratio": json_float(self.error_ratio),
        }


def aggregate(comparisons: Sequence[Comparison]) -> SuiteComparison:
    """One SuiteComparison over `comparisons` (one per workload)."""
    measured = [c for c in comparisons if c.n]
    fractions = tuple((k, sum(c.best_within_top(k) for c in measured) / len(measured) if measured else math.nan)
                      for k in TOP_K)
    return SuiteComparison(
        workloads=len(comparisons),
        spearman=nan_mean([c.spearman for c in measured]),
        kendall=nan_mean([c.kendall for c in measured]),
        best_in_top=fractions,
        error_ratio=geometric_mean([c.error_ratio for c in measured if not math.isnan(c.error_ratio)]),
    )


def nan_mean(values: Iterable[float]) -> float:
    """The mean of the defined values (NaN: an undefined statistic, left out); NaN if none is."""
    defined = [v for v in values if not math.isnan(v)]
    return math.fsum(defined) / len(defined) if defined else math.nan


def json_float(value: float) -> float | None:
    """NaN is not JSON: an undefined statistic is null."""
    return None if math.isnan(value) else value
