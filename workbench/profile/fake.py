"""A fake runner for fast tests and demos: deterministic "measurements" made from predictions.

It never opens a library (the session then skips building), so a whole profile session with it
takes milliseconds. Measured time = predicted x `scale` x a log-normal factor per candidate (the
model's error) x a small one per repeat (noise), both from a generator seeded by (seed, rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

import workbench
from workbench.profile.runner import BuiltCandidate, Measurement, Report, Timing


@dataclass(frozen=True)
class FakeRunner:
    scale: float = 2.0
    spread: float = 0.3  # sigma of the per-candidate log-normal factor
    noise: float = 0.02  # sigma of the per-repeat log-normal factor
    seed: int = 0
    incorrect: frozenset[int] = frozenset()  # ranks reported as wrong results
    name: str = "fake"
    needs_library: bool = False

    def measure(self, expr, built: Sequence[BuiltCandidate], timing: Timing, report: Report) -> None:
        for candidate in built:
            report(self.measurement(candidate, timing))

    def measurement(self, candidate: BuiltCandidate, timing: Timing) -> Measurement:
        versions = (("workbench", workbench.__version__),)
        if candidate.rank in self.incorrect:
            return Measurement(candidate.rank, self.name, correct=False, error="wrong result: fake", versions=versions)
        rng = np.random.default_rng((self.seed, candidate.rank))
        base = candidate.predicted_seconds * self.scale * rng.lognormal(0.0, self.spread)
        seconds = tuple(float(base * f) for f in rng.lognormal(0.0, self.noise, size=timing.repeat))
        return Measurement(candidate.rank, self.name, seconds, correct=True, versions=versions)
