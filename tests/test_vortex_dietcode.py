"""DietCode's cost model and selection against hand-computed cases."""

import pytest

from workbench.vortex import dietcode


def test_padding_penalty_is_the_useful_share_of_the_padded_shape():
    # 77 rows in tiles of 16 pad to 80; 768 columns in tiles of 64 need no padding
    assert dietcode.padding_penalty((77, 768), (16, 64)) == pytest.approx(77 / 80)
    assert dietcode.padding_penalty((5, 7), (4, 4)) == pytest.approx((5 / 8) * (7 / 8))
    assert dietcode.padding_penalty((64, 64), (16, 32)) == 1.0


def test_occupancy_penalty_is_the_busy_share_of_the_waves():
    # ceil(77/16) * ceil(768/64) = 5 * 12 = 60 tiles on 8 units: 8 waves, the last holds 4
    assert dietcode.grid((77, 768), (16, 64)) == 60
    assert dietcode.occupancy_penalty((77, 768), (16, 64), 8) == pytest.approx(60 / 64)
    assert dietcode.occupancy_penalty((16, 64), (16, 64), 80) == pytest.approx(1 / 80)
    assert dietcode.occupancy_penalty((64, 64), (16, 16), 16) == 1.0


def test_adapted_score_multiplies_throughput_by_both_penalties():
    score = dietcode.adapted_score(100.0, (77, 768), (16, 64), 8)
    assert score == pytest.approx(100.0 * (77 / 80) * (60 / 64))


def test_greedy_cover_adds_the_kernel_that_raises_the_covered_sum_most():
    scores = {"a": [10, 0, 0], "b": [6, 6, 0], "c": [0, 5, 9]}
    # alone: a 10, b 12, c 14 -> c; then a adds 10 (10+5+9=24), b adds 6 (6+6+9=21) -> a
    assert dietcode.greedy_cover(scores, 1) == ("c",)
    assert dietcode.greedy_cover(scores, 2) == ("c", "a")
    assert dietcode.greedy_cover(scores, 5) == ("c", "a", "b")
    with pytest.raises(ValueError):
        dietcode.greedy_cover(scores, 0)


def test_dispatch_takes_the_nearest_sample_and_extrapolates_outside():
    scores = {"small": [1, 9, 5], "large": [9, 1, 6]}  # at samples 256, 128, 192
    dispatch = dietcode.train([256, 128, 192], scores, k=2)
    assert dispatch.samples == (128, 192, 256)
    assert dispatch.choices == ("small", "large", "large")
    assert dispatch.select(1) == "small"  # far below the samples: the lowest sample's choice
    assert dispatch.select(160) == "small"  # half-way ties go to the lower sample
    assert dispatch.select(161) == "large"
    assert dispatch.select(4096) == "large"


def test_train_refuses_scores_that_do_not_match_the_samples():
    with pytest.raises(ValueError):
        dietcode.train([1, 2], {"a": [1.0]}, k=1)
    with pytest.raises(ValueError):
        dietcode.train([], {"a": []}, k=1)
