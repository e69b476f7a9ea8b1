"""How far a measured time can be trusted: a distribution-free interval for the median of the
repeats, and which candidates cannot be told apart from the fastest one.

Timing noise on a shared machine is skewed (a repeat is only ever slowed down) and far from
normal, so no mean +- t * sd: the interval is between two order statistics of the repeats, whose
coverage of the true median follows from the binomial distribution alone (each repeat falls
below the median with probability 1/2). With n repeats, [x(k), x(n-k+1)] covers the median with
probability 1 - 2 P(Bin(n, 1/2) <= k - 1); the widest such interval, [min, max], reaches
1 - 2^(1-n): 87.5 % for 4 repeats, 93.75 % for 5, 96.9 % for 6.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Sequence

LEVEL = 0.95  # the coverage asked for; fewer than 6 repeats cannot reach it and say so
# A timing may stop once its repeats agree within this share of the fastest (`settled`): the
# benchmarks print ratios to 2 digits, so 1 % is below what they resolve. On the quiet 2-core
# EPYC's stored cpu-core runs (06:17 and 07:07, 5 repeats of >= 50 ms per kernel), the rule
# stops 8 and 11 of 65 kernels at 3 repeats, moves none of their bests by more than 0.44 % and
# no workload's best-of-5; at 2 % it would stop 27 but move a best-of-5 by 1.8 %.
SETTLE = 0.01
# Fewest repeats a timing stops at: [min, max] of 3 covers the median 75 % of the time
# (`coverage(3, 1)`), of 2 only 50 %, a coin's toss.
SETTLE_MIN_REPEATS = 3


@dataclass(frozen=True)
class MedianInterval:
    low: float
    high: float
    level: float  # the probability that [low, high] covers the true median

    def overlaps(self, other: "MedianInterval") -> bool:
        return self.low <= other.high and other.low <= self.high


def coverage(n: int, k: int) -> float:
    """Probability that [x(k), x(n-k+1)] of n repeats covers the median (1-based k <= n/2 + 1)."""
    below = sum(comb(n, i) for i in range(k)) / 2**n  # P(Bin(n, 1/2) <= k - 1)
    return 1.0 - 2.0 * below


def median_interval(seconds: Sequence[float], level: float = LEVEL) -> MedianInterval | None:
    """The narrowest order-statistic interval of `seconds` covering the median with at least
    `level`, or [min, max] with its own (lower) coverage when the repeats are too few; None
    without repeats."""
    x = sorted(seconds)
    n = len(x)
    if not n:
        return None
    k = 1  # [min, max]: the widest interval
    while k + 1 <= (n + 1) // 2 and coverage(n, k + 1) >= level:
        k += 1
    return MedianInterval(x[k - 1], x[n - k], coverage(n, k) if n > 1 else 0.0)


def within_noise(seconds_by_rank: dict[int, Sequence[float]], rank: int, level: float = LEVEL) -> tuple[int, ...]:
    """Ranks whose median interval overlaps that of `rank`, `rank` itself included, sorted: the
    candidates the measurements cannot tell apart from it; () when `rank` has no repeats."""
    intervals = {r: median_interval(s, level) for r, s in seconds_by_rank.items() if s}
    if rank not in intervals:
        return ()
    return tuple(sorted(r for r, iv in intervals.items() if iv.overlaps(intervals[rank])))


def indistinguishable(seconds_by_rank: dict[int, Sequence[float]], level: float = LEVEL) -> tuple[int, ...]:
    """Ranks whose median interval overlaps the fastest candidate's (by median), the fastest
    excluded: the measurements cannot tell them from the best."""
    medians = {r: sorted(s)[(len(s) - 1) // 2] for r, s in seconds_by_rank.items() if s}
    if not medians:
        return ()
    best = min(medians, key=lambda r: (medians[r], r))
    return tuple(r for r in within_noise(seconds_by_rank, best, level) if r != best)


def settled(seconds: Sequence[float], spread: float, least: int = SETTLE_MIN_REPEATS) -> bool:
    """Whether the repeats so far pin the time down: at least `least` of them, and their median
    interval (`median_interval`; [min, max] below 6 repeats) no wider than `spread` times its low
    end. False for `spread` <= 0, which asks for every repeat. Since a repeat is only ever slowed
    down, repeats that agree have each met the machine's floor for the kernel; more would cost
    their time for a shift below `spread`, while ones that disagree go on to the limit."""
    if spread <= 0 or len(seconds) < max(least, 1):
        return False
    interval = median_interval(seconds)
    return interval.high - interval.low <= spread * interval.low
