"""The repetition count of a timed call (`workbench.repetitions.sized_count`), against a fake call
of a fixed cost plus a cost per repetition."""

import pytest

from workbench.repetitions import MAX_COUNT, sized_count


@pytest.mark.parametrize("overhead_s", [0.0, 1e-4, 5e-3])
def test_repetitions_grow_until_a_call_outlasts_its_fixed_cost(overhead_s):
    """A probe's call costs a fixed `overhead_s` (the thread pool's wake-up) plus 1 ns a
    repetition. Its repetitions must make the call last at least half the wanted 10 ms whatever
    the overhead, so the work, not the wake-up, is what the probe divides by."""
    calls = []

    def timed(reps):
        calls.append(reps)
        return overhead_s + reps * 1e-9

    reps, seconds = sized_count(timed, 0.01, enough=0.5)
    assert seconds == timed(reps) >= 0.005 and reps * 1e-9 >= 0.005 - overhead_s
    assert reps <= 2 * 10**7  # no more than twice what 10 ms of work needs
    assert all(b >= 2 * a for a, b in zip(calls, calls[1:-1]))  # grows at least twofold a step


def test_the_count_starts_where_asked_and_returns_its_first_long_enough_call():
    """A baseline starts at its timing's `number` and keeps the sizing call as its first repeat:
    the count returned is the first that lasted the wanted time, with that call's seconds."""
    calls = []

    def timed(n):
        calls.append(n)
        return n * 1e-3

    n, seconds = sized_count(timed, 0.005, start=3)
    assert calls[0] == 3 and n == calls[-1] == 6 and seconds == pytest.approx(0.006)
    assert sized_count(timed, 0.005, start=10) == (10, pytest.approx(0.01))  # long enough at once


def test_repetitions_stop_at_the_int32_argument_limit():
    assert sized_count(lambda reps: 0.0, 1.0) == (MAX_COUNT, 0.0)  # a call too fast to time
