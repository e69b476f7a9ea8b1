"""The median's interval: its coverage in closed form and by simulation, and which candidates
the repeats cannot tell from the fastest."""

import numpy as np
import pytest

from workbench.profile.noise import (
    RACE_MIN_REPEATS, SETTLE_MIN_REPEATS, MedianInterval, coverage, indistinguishable, median_interval, outpaced,
    settled, within_noise,
)


@pytest.mark.parametrize("n, k, expected", [
    (5, 1, 1 - 2 / 32),  # [min, max] of 5: misses only when all 5 fall on one side
    (6, 1, 1 - 2 / 64),
    (6, 2, 1 - 2 * (1 + 6) / 64),
    (10, 2, 1 - 2 * (1 + 10) / 1024),
    (10, 3, 1 - 2 * (1 + 10 + 45) / 1024),
])
def test_coverage_is_the_binomial_closed_form(n, k, expected):
    assert coverage(n, k) == pytest.approx(expected)


def test_the_interval_is_the_narrowest_reaching_the_level():
    ten = [float(v) for v in range(1, 11)]  # 10 repeats: k = 2 reaches 97.9 %, k = 3 only 89 %
    assert median_interval(ten) == MedianInterval(2.0, 9.0, pytest.approx(1 - 22 / 1024))
    five = [5.0, 1.0, 4.0, 2.0, 3.0]  # too few for 95 %: [min, max] at its own 93.75 %
    assert median_interval(five) == MedianInterval(1.0, 5.0, 0.9375)
    assert median_interval([2.0]) == MedianInterval(2.0, 2.0, 0.0) and median_interval([]) is None


def test_the_stated_coverage_holds_for_skewed_timing_noise():
    """Log-normal repeats (a run is slowed, never sped up): the interval covers the true median
    as often as it says, within the simulation's own error (3 sigma of 4000 draws: 1.2 %)."""
    rng = np.random.default_rng(0)
    for n in (5, 10):
        draws = rng.lognormal(0.0, 0.3, size=(4000, n))
        hits = [iv.low <= 1.0 <= iv.high for iv in map(median_interval, draws)]  # true median exp(0) = 1
        level = median_interval(draws[0]).level
        assert abs(np.mean(hits) - level) < 3 * np.sqrt(level * (1 - level) / 4000)


def test_candidates_whose_intervals_overlap_the_fastest_are_indistinguishable():
    seconds = {
        1: [1.00, 1.01, 1.02, 1.03, 1.04],
        2: [1.03, 1.05, 1.06, 1.07, 1.08],  # overlaps rank 1's [1.00, 1.04]
        3: [1.20, 1.21, 1.22, 1.23, 1.24],  # clearly slower
        4: [],  # failed: no repeats
    }
    assert indistinguishable(seconds) == (2,)
    assert indistinguishable({1: [1.0, 1.1], 3: [2.0, 2.1]}) == ()
    assert indistinguishable({1: [1.0]}) == ()


def test_within_noise_of_a_rank_are_the_ranks_whose_intervals_overlap_its_own():
    seconds = {
        1: [3.0, 3.1, 3.2, 3.3, 3.4],  # slower by median, but its fastest repeats reach rank 3's slowest
        2: [5.0, 5.1, 5.2, 5.3, 5.4],  # clearly slower
        3: [1.0, 1.05, 1.5, 2.0, 3.05],  # the fastest repeat, and a wide spread
        4: [1.1, 1.2, 2.5, 2.6, 2.7],
        5: [],  # failed: no repeats
    }
    assert within_noise(seconds, 3) == (1, 3, 4)
    assert within_noise(seconds, 2) == (2,)
    assert within_noise(seconds, 5) == () and within_noise(seconds, 9) == ()


def test_repeats_settle_once_at_least_three_agree_within_the_spread():
    assert SETTLE_MIN_REPEATS == 3 and coverage(3, 1) == 0.75  # [min, max] of 3 covers the median 3 times in 4
    assert settled([1.0, 1.009, 1.004], 0.01)  # max - min = 0.9 % of the min
    assert not settled([1.0, 1.011, 1.004], 0.01)  # 1.1 %
    assert not settled([1.0, 1.0], 0.01)  # two repeats agreeing is a coin's toss
    assert settled([1.0, 1.0], 0.01, least=2)
    assert not settled([1.0, 1.0, 1.0], 0.0)  # no spread asks for every repeat
    assert not settled([], 0.01, least=0)


def test_from_six_repeats_the_settling_spread_is_the_median_intervals_not_the_extremes():
    """Six repeats: the 95 % interval is [x(1), x(6)] (coverage(6, 2) is 78 %); ten: [x(2), x(9)],
    so one slowed repeat no longer keeps a timing from settling."""
    six = [1.0, 1.001, 1.002, 1.003, 1.004, 1.5]
    assert not settled(six, 0.01)
    ten = [0.999, 1.0, 1.001, 1.002, 1.003, 1.004, 1.005, 1.006, 1.007, 1.5]
    assert median_interval(ten) == MedianInterval(1.0, 1.007, pytest.approx(1 - 22 / 1024))
    assert settled(ten, 0.01)


def test_a_timing_is_outpaced_once_its_fastest_repeat_is_the_margin_slower_than_the_best():
    assert outpaced([1.3, 1.25], best=1.0, margin=0.2)  # 1.25 > 1.2: cannot be the best
    assert not outpaced([1.3, 1.2], best=1.0, margin=0.2)  # at the bound: not clearly slower
    assert not outpaced([1.5, 1.1], best=1.0, margin=0.2)  # one repeat within the margin is enough
    assert not outpaced([1.5], best=1.0, margin=0.2)  # fewer than RACE_MIN_REPEATS
    assert RACE_MIN_REPEATS == 2 and outpaced([1.5], best=1.0, margin=0.2, least=1)
    assert not outpaced([1.5, 1.5], best=None, margin=0.2)  # the first kernel timed has nothing to race
    assert not outpaced([1.5, 1.5], best=1.0, margin=0.0)  # margin 0 asks for every repeat
