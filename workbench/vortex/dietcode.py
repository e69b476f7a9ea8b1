"""DietCode's sample-driven selection (MLSys'22), the baseline Vortex is measured against.

DietCode tunes shape-generic micro-kernels on a list of sample shapes and, at run time, picks a
kernel for a shape with a classifier trained on those samples. Its cost model (formulas from its
public code, /work/shared/design/ALGORITHMS.md section 4) scales a micro-kernel's measured
throughput by two penalties for a concrete shape:

    padding_penalty   = prod(extent / ceil_to(extent, tile))   useful share of the padded work
    grid              = prod(ceil(extent / tile))              tiles to run
    occupancy_penalty = grid / ceil_to(grid, units)            share of the last wave that is busy
    adapted score     = throughput x padding_penalty x occupancy_penalty

(`ceil_to(x, step)`, rounding up to whole steps, is `analyzer.padded_extent`.)

Selection keeps `k` kernels by a greedy cover of the samples (each step adds the kernel that most
raises the sum over samples of the best score among those kept), and dispatch classifies a shape
by the nearest sample (a one-feature decision tree with a split half-way between neighbouring
samples), returning the kernel that scored best there. Outside the samples that choice is an
extrapolation: this is what the benchmark shows beside Vortex's sample-free choice.

Pure: plain numbers and tuples in, plain values out.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from math import ceil, prod
from typing import Mapping, Sequence

from workbench.vortex.analyzer import padded_extent

# The sample list of Vortex's DietCode comparison (Table 6): the BERT GEMM's M sampled in [128, 256).
DEFAULT_SAMPLES = (128, 160, 192, 224)


def padding_penalty(extents: Sequence[int], tile: Sequence[int]) -> float:
    """Useful share of the work once every extent is padded to whole tiles (1.0: no padding)."""
    return prod(e / padded_extent(e, t) for e, t in zip(extents, tile))


def grid(extents: Sequence[int], tile: Sequence[int]) -> int:
    return prod(ceil(e / t) for e, t in zip(extents, tile))


def occupancy_penalty(extents: Sequence[int], tile: Sequence[int], units: int) -> float:
    """Busy share of the waves of `grid` tiles over `units` (1.0: the last wave is full)."""
    g = grid(extents, tile)
    return g / padded_extent(g, units)


def adapted_score(throughput: float, extents: Sequence[int], tile: Sequence[int], units: int) -> float:
    """DietCode's predicted useful throughput of a micro-kernel on a concrete shape."""
    return throughput * padding_penalty(extents, tile) * occupancy_penalty(extents, tile, units)


def greedy_cover(scores: Mapping[str, Sequence[float]], k: int) -> tuple[str, ...]:
    """`k` kernels (fewer if fewer exist) chosen greedily to maximise the sum over samples of the
    best score among the kernels kept; `scores[kernel][i]` is the score at sample i. Ties go to
    the kernel listed first, so the result is deterministic."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    kept: list[str] = []
    best = None
    for _ in range(min(k, len(scores))):
        def total(name: str) -> float:
            row = scores[name]
            return sum(row) if best is None else sum(max(a, b) for a, b in zip(best, row))

        name = max((n for n in scores if n not in kept), key=total)
        kept.append(name)
        row = scores[name]
        best = list(row) if best is None else [max(a, b) for a, b in zip(best, row)]
    return tuple(kept)


@dataclass(frozen=True)
class Dispatch:
    """DietCode's run-time choice: sorted sample values and the kernel chosen at each."""

    samples: tuple[int, ...]
    choices: tuple[str, ...]

    def select(self, value: int) -> str:
        """The kernel of the sample nearest to `value` (the lower sample on a tie)."""
        i = bisect_left(self.samples, value)
        if i == len(self.samples) or (i > 0 and value - self.samples[i - 1] <= self.samples[i] - value):
            i -= 1
        return self.choices[i]


def train(samples: Sequence[int], scores: Mapping[str, Sequence[float]], k: int) -> Dispatch:
    """Keep `k` kernels by the greedy cover, then label each sample with its best kept kernel."""
    if not samples or any(len(row) != len(samples) for row in scores.values()):
        raise ValueError("every kernel needs one score per sample")
    order = sorted(range(len(samples)), key=lambda i: samples[i])
    kept = greedy_cover(scores, k)
    choices = tuple(max(kept, key=lambda n: scores[n][i]) for i in order)
    return Dispatch(tuple(int(samples[i]) for i in order), choices)
