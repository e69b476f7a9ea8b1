"""Measurement values and `best_measured`: only verified kernels with a time may be ranked."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import matmul
from workbench.errors import UserError
from workbench.ops.reference import random_inputs, reference_with_scale
from workbench.profile.runner import Measurement, Timing, best_measured, inputs_and_reference


def test_best_and_median_of_the_repeats():
    m = Measurement(1, "local", (3e-6, 1e-6, 2e-6, 10e-6), correct=True)
    assert m.best_seconds == 1e-6 and m.median_seconds == pytest.approx(2.5e-6) and m.ok
    empty = Measurement(2, "local", error="build: schedule: no")
    assert empty.best_seconds is None and empty.median_seconds is None and not empty.ok
    assert m.to_dict()["seconds"] == [3e-6, 1e-6, 2e-6, 10e-6] and m.to_dict()["correct"] is True


def test_best_measured_never_picks_incorrect_or_failed_kernels():
    wrong_but_fast = Measurement(1, "local", (1e-9,), correct=False, error="wrong result: off by 0.3")
    unchecked = Measurement(2, "local", (1e-8,), correct=None)
    errored = Measurement(3, "local", (1e-8,), correct=True, error="run: timed out after 60 s")
    slow = Measurement(4, "local", (5e-6, 4e-6), correct=True)
    fast = Measurement(5, "local", (3e-6,), correct=True)
    assert best_measured([wrong_but_fast, unchecked, errored, slow, fast]) == fast
    assert best_measured([wrong_but_fast, unchecked, errored]) is None
    assert best_measured([]) is None


def test_timing_refuses_nonsense():
    with pytest.raises(UserError, match="--repeat must be >= 1, got 0"):
        Timing(repeat=0)
    with pytest.raises(UserError, match="timeout_s > 0"):
        Timing(timeout_s=0)


def test_the_inputs_and_reference_are_those_of_the_check_and_kept_for_the_last_expression():
    a, b = matmul(8, 4, 16), matmul(4, 8, 16)
    inputs, ref = inputs_and_reference(a, 0)
    expected = reference_with_scale(a, random_inputs(a, 0))
    assert all(np.array_equal(x, y) for x, y in zip(inputs, random_inputs(a, 0)))
    assert np.array_equal(ref.value, expected.value) and np.array_equal(ref.scale, expected.scale)
    assert inputs_and_reference(a, 0)[1] is ref  # the next candidate of the session reuses them
    other_seed = inputs_and_reference(a, 1)[0]
    assert not np.array_equal(other_seed[0], inputs[0])  # another seed draws other inputs
    assert inputs_and_reference(b, 0)[1].value.shape == (4, 8)  # another expression its own
    assert inputs_and_reference(a, 0)[1] is not ref  # one entry: a is computed again after b
