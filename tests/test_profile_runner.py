"""Measurement values and `best_measured`: only verified kernels with a time may be ranked."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

from tests.helpers import matmul
from workbench.codegen import verify
from workbench.errors import UserError
from workbench.ops.reference import random_inputs, reference_with_scale
from workbench.profile.runner import (
    PROBE_MS, REPEAT_MARGIN, Measurement, Timing, best_measured, evaluator_repeats, inputs_and_reference,
    quiet_reference, timed_repeats, verified,
)


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
    with pytest.raises(UserError, match="settle >= 0"):
        Timing(settle=-0.01)
    with pytest.raises(UserError, match="revisit >= 0"):
        Timing(revisit=-1)


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


class ScriptedRepeats:
    """A `run` for `timed_repeats` that hands out given repeat times and records each call."""

    def __init__(self, seconds):
        self.seconds, self.calls = list(seconds), []

    def __call__(self, repeats, fastest):
        self.calls.append((repeats, fastest))
        taken, self.seconds = self.seconds[:repeats], self.seconds[repeats:]
        return taken


def test_repeats_that_agree_stop_at_three():
    run = ScriptedRepeats([2.0e-3, 2.01e-3, 2.005e-3, 9.0, 9.0])
    assert timed_repeats(run, Timing(repeat=5, settle=0.01)) == (2.0e-3, 2.01e-3, 2.005e-3)
    assert run.calls == [(3, None)]


def test_repeats_that_disagree_go_on_one_at_a_time_until_they_settle_or_reach_the_limit():
    run = ScriptedRepeats([1.0, 1.2, 1.0, 1.01, 1.1, 1.0])  # [min, max] 20 % wide until the limit
    assert timed_repeats(run, Timing(repeat=5, settle=0.01)) == (1.0, 1.2, 1.0, 1.01, 1.1)
    assert run.calls == [(3, None), (1, 1.0), (1, 1.0)]  # later repeats sized from the fastest so far
    run = ScriptedRepeats([1.0, 1.2, 1.0] + [1.0] * 7)  # 10 allowed: from 9 repeats the 95 % interval
    assert timed_repeats(run, Timing(repeat=10, settle=0.01)) == (1.0, 1.2) + (1.0,) * 7  # is [x(2), x(8)]
    assert len(run.calls) == 1 + 6


def test_without_settle_or_with_few_repeats_every_repeat_is_taken_at_once():
    run = ScriptedRepeats([1.0] * 5)
    assert timed_repeats(run, Timing(repeat=5, settle=0)) == (1.0,) * 5 and run.calls == [(5, None)]
    run = ScriptedRepeats([1.0, 2.0])
    assert timed_repeats(run, Timing(repeat=2)) == (1.0, 2.0) and run.calls == [(2, None)]


def test_a_kernel_outpaced_by_an_earlier_one_stops_after_two_repeats():
    """Racing `best` (the fastest repeat of the kernels timed before): 2 repeats first, and a
    kernel whose faster one is more than `race` slower stops there; one within it is timed as
    without a race."""
    run = ScriptedRepeats([1.3, 1.25, 9.0, 9.0, 9.0])
    assert timed_repeats(run, Timing(repeat=5, race=0.2), best=1.0) == (1.3, 1.25) and run.calls == [(2, None)]
    run = ScriptedRepeats([1.3, 1.15, 1.2, 1.16, 1.14])  # 1.15 is within 20 % of 1.0: every repeat
    assert timed_repeats(run, Timing(repeat=5, race=0.2), best=1.0) == (1.3, 1.15, 1.2, 1.16, 1.14)
    assert run.calls == [(2, None), (1, 1.15), (1, 1.15), (1, 1.15)]
    run = ScriptedRepeats([1.0, 1.001, 1.002, 9.0])  # not outpaced, settled at three as without a race
    assert timed_repeats(run, Timing(repeat=5, race=0.2), best=0.99) == (1.0, 1.001, 1.002)
    run = ScriptedRepeats([1.3, 1.25, 1.3, 1.3, 1.3])  # settle = 0 with a race: every repeat unless outpaced
    assert timed_repeats(run, Timing(repeat=5, settle=0, race=0.2), best=1.0) == (1.3, 1.25)


def test_without_a_best_or_with_race_0_a_timing_is_not_raced():
    slow = [1.3, 1.25, 1.3, 1.3, 1.3]
    run = ScriptedRepeats(slow)  # the first kernel of a session
    assert timed_repeats(run, Timing(repeat=5, race=0.2), best=None) == tuple(slow) and run.calls[0] == (3, None)
    run = ScriptedRepeats(slow)
    assert timed_repeats(run, Timing(repeat=5, race=0), best=1.0) == tuple(slow) and run.calls[0] == (3, None)
    with pytest.raises(UserError, match="race >= 0"):
        Timing(race=-0.1)


def test_an_output_already_verified_is_not_compared_again(monkeypatch):
    """`verified` remembers `compare`'s answer by the output's bytes: the same bits give the same
    Verification without a second pass, other bits (a wrong kernel after a right one) their own."""
    calls, compare = [], verify.compare

    def counting(out, ref, dtype):
        calls.append(out.copy())
        return compare(out, ref, dtype)

    monkeypatch.setattr(verify, "compare", counting)
    expr = matmul(8, 4, 16)
    ref = inputs_and_reference(expr, 0)[1]
    right = ref.value.astype(np.float32)
    first = verified(right, expr, ref, 0)
    assert first.correct and verified(right.copy(), expr, ref, 0) is first and len(calls) == 1
    wrong = right.copy()
    wrong.flat[5] += 1.0
    assert not verified(wrong, expr, ref, 0).correct and len(calls) == 2
    other = matmul(4, 8, 16)  # another expression forgets the first's answers
    other_ref = inputs_and_reference(other, 0)[1]
    assert verified(other_ref.value.astype(np.float32), other, other_ref, 0).correct
    assert verified(right, expr, ref, 0) is not first and len(calls) == 4


def test_the_reference_before_a_timing_runs_on_one_blas_thread(monkeypatch):
    """`quiet_reference` computes the reference with BLAS on one thread (OpenBLAS's threads spin
    after a multi-threaded call, on the cores the next kernel is timed on) and gives it unchanged."""
    from threadpoolctl import threadpool_info

    import workbench.ops.reference as reference

    seen = []

    def recording(expr, inputs):
        seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        return reference_with_scale(expr, inputs)

    e = matmul(16, 8, 32)
    inputs = random_inputs(e, 0)
    monkeypatch.setattr(reference, "reference_with_scale", recording)
    got = quiet_reference(e, inputs)
    assert seen == [{1}]
    assert np.array_equal(got.value, reference_with_scale(e, inputs).value)


class FakeModule:
    """A module whose `time_evaluator` records its arguments and reports `per_run` seconds."""

    def __init__(self, per_run: float):
        self.per_run, self.calls = per_run, []

    def time_evaluator(self, entry, dev, number, repeat, min_repeat_ms, f_preproc=""):
        self.calls.append((number, repeat, min_repeat_ms))
        return lambda *args: type("Result", (), {"results": [self.per_run] * repeat})()


def test_a_repeat_is_sized_from_a_probing_run_then_from_the_fastest_repeat():
    """A probe of PROBE_MS (TVM grows its runs from one) times the kernel warm; each repeat
    then holds REPEAT_MARGIN x min_repeat_ms of runs, from the probe first and from the fastest
    repeat after, so TVM never discards a short repeat and grows `number` by 1.618x."""
    module = FakeModule(0.58e-3)
    run = evaluator_repeats(module, "main", None, (), Timing(min_repeat_ms=25))
    assert run(3, None) == [0.58e-3] * 3
    assert module.calls == [(1, 1, PROBE_MS), (ceil(REPEAT_MARGIN * 25e-3 / 0.58e-3), 3, 25)]
    run(1, 0.5e-3)
    assert module.calls[-1] == (ceil(REPEAT_MARGIN * 25e-3 / 0.5e-3), 1, 25)
    slow = FakeModule(0.2)  # a run longer than the minimum: one run a repeat
    evaluator_repeats(slow, "main", None, (), Timing(min_repeat_ms=25, number=2))(2, None)
    assert slow.calls[-1] == (2, 2, 25)
