"""Predicted vs measured: rank correlations against hand-computed values (ties included), the
top-k test, the model error ratio, and the suite aggregate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.profile.compare import Comparison, aggregate, average_ranks, compare, kendall, spearman


def test_average_ranks_share_ties():
    assert average_ranks([30, 10, 20, 20]).tolist() == [4.0, 1.0, 2.5, 2.5]
    assert average_ranks([5, 5, 5]).tolist() == [2.0, 2.0, 2.0]


def test_perfect_and_reversed_orders():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_two_swaps_by_hand():
    # d = (1, 1, 1, 1, 0): rho = 1 - 6 * 4 / (5 * 24) = 0.8; 8 concordant, 2 discordant of 10 pairs.
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
    assert spearman(x, y) == pytest.approx(0.8)
    assert kendall(x, y) == pytest.approx(0.6)


def test_ties_by_hand():
    # y ranks (1, 2.5, 2.5, 4): rho = 4.5 / sqrt(5 * 4.5); tau-b: 5 concordant, 1 tied in y,
    # so 5 / sqrt(6 * 5).
    x, y = [1, 2, 3, 4], [1, 2, 2, 3]
    assert spearman(x, y) == pytest.approx(4.5 / math.sqrt(22.5))
    assert kendall(x, y) == pytest.approx(5 / math.sqrt(30))


def test_undefined_correlations_are_nan():
    assert math.isnan(spearman([1], [2])) and math.isnan(kendall([1], [2]))
    assert math.isnan(spearman([1, 2, 3], [7, 7, 7])) and math.isnan(kendall([1, 2, 3], [7, 7, 7]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), min_size=2, max_size=30))
def test_correlations_are_bounded_and_symmetric(pairs):
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    for f in (spearman, kendall):
        value = f(x, y)
        assert math.isnan(value) or -1 - 1e-12 <= value <= 1 + 1e-12
        assert value == pytest.approx(f(y, x), nan_ok=True)


@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=20, unique=True))
def test_a_monotone_transform_keeps_rank_correlations_at_one(xs):
    ys = [v**3 + 5 for v in xs]
    assert spearman(xs, ys) == pytest.approx(1.0)
    assert kendall(xs, ys) == pytest.approx(1.0)


def test_compare_leaves_out_unmeasured_candidates():
    c = compare([1, 2, 3, 4], [1e-6, 2e-6, 3e-6, 4e-6], [8e-6, None, 2e-6, 16e-6])
    assert c.n == 3
    assert c.best_predicted_rank == 3  # the measured best was predicted third
    assert not c.best_within_top(1) and c.best_within_top(3) and c.best_within_top(10)
    # measured / predicted = 8, 2/3, 4: geometric mean (8 * 2/3 * 4) ** (1/3)
    assert c.error_ratio == pytest.approx((8 * 2 / 3 * 4) ** (1 / 3))
    assert c.spearman == pytest.approx(0.5)


def test_compare_without_measurements_is_empty_and_json_safe():
    c = compare([1, 2], [1e-6, 2e-6], [None, None])
    assert c.n == 0 and c.best_predicted_rank is None
    data = c.to_dict()
    assert data["spearman"] is None and data["error_ratio"] is None and data["best_in_top1"] is False


def test_aggregate_over_a_suite():
    a = Comparison(4, 1.0, 1.0, 1, 2.0)
    b = Comparison(4, 0.0, -0.5, 5, 8.0)
    empty = Comparison(0, math.nan, math.nan, None, math.nan)
    s = aggregate([a, b, empty])
    assert s.workloads == 3
    assert s.spearman == pytest.approx(0.5) and s.kendall == pytest.approx(0.25)
    assert dict(s.best_in_top) == {1: 0.5, 3: 0.5, 10: 1.0}
    assert s.error_ratio == pytest.approx(4.0)
    assert s.to_dict()["best_in_top10"] == 1.0
