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
# benchmarks print ratios to 2 digits, so 1 % is below what they resolve (evidence:
# docs/evidence.md#noise-settle).
SETTLE = 0.01
# Fewest repeats a timing stops at: [min, max] of 3 covers the median 75 % of the time
# (`coverage(3, 1)`), of 2 only 50 %, a coin's toss.
SETTLE_MIN_REPEATS = 3
# A candidate stops being timed once the fastest of its first repeats is this share slower than
# the fastest repeat of any candidate timed before it in the session (`outpaced`): it cannot be
# the best. Since a repeat is only ever slowed down, the stop is wrong only when every repeat it
# got was slowed by more than this. On the quiet 2-core EPYC's stored cpu-core runs (06:17, 07:07,
# 10:14: 184 kernels with 5 repeats), the faster of the first two repeats was within 12 % of the
# other three's fastest for 181 (median 0.5 %, 95th percentile 7 %); the other three were slowed
# 1.8-1.9x through all their repeats, which no margin short of 2x would catch. 20 % is above the
# 12 %; replayed on those runs, the rule stops 34 of 195 kernels after 2 repeats (94 of 953
# repeats) and moves no workload's best-of-5. A stopped kernel is still >= 1.2x the best, so its
# place in the measured order (Spearman) is not noise's.
RACE = 0.2
# Repeats a timing takes before it may be stopped as outpaced: the first alone was more than 20 %
# slower than the later ones' fastest in 22 of those 184 timings.
RACE_MIN_REPEATS = 2


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


def outpaced(seconds: Sequence[float], best: float | None, margin: float, least: int = RACE_MIN_REPEATS) -> bool:
    """Whether a timing may stop because its kernel cannot be the fastest: at least `least`
    repeats, and even the fastest of them more than `margin` slower than `best` (the fastest
    repeat of the kernels timed before it). False without a `best` or for `margin` <= 0."""
    if best is None or margin <= 0 or len(seconds) < max(least, 1):
        return False
    return min(seconds) > best * (1.0 + margin)
