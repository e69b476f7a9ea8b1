"""How many times to repeat a timed call so that its time is the work's, not its fixed cost's:
one loop shared by the calibration's probes (`hardware.microbench`) and the baselines
(`profile.baselines`).

A call of n repetitions costs a fixed part (waking a thread pool, a Python call) plus n times
the work. Scaling n once by wanted / measured undershoots while the fixed part outweighs the
work, so the count is grown again, at least twofold a step, until a call lasts long enough (two
fixed steps measured a 16-core Xeon's float32 FMA peak at 0.1 GFLOP/s:
docs/evidence.md#calibrate-sizing).
"""

from __future__ import annotations

import math
from collections.abc import Callable

# The most repetitions asked for: a probe's count is an int32 kernel argument. Growing at least
# twofold a step, the loop reaches it from 1 in 31 steps, so a call too fast to time ends there.
MAX_COUNT = 2**31 - 1


def sized_count(timed: Callable[[int], float], wanted_s: float, start: int = 1,
                enough: float = 1.0) -> tuple[int, float]:
    """(count, seconds): the first count, from `start`, for which `timed(count)` (the seconds of
    one call of `count` repetitions) lasts at least `enough` x `wanted_s`, and that call's
    seconds (a first measurement the caller may keep); at most MAX_COUNT. Each step scales the
    count by wanted / measured, at least twofold."""
    count = start
    while True:
        seconds = timed(count)
        if seconds >= enough * wanted_s or count >= MAX_COUNT:
            return count, seconds
        count = min(MAX_COUNT, max(2 * count, math.ceil(count * wanted_s / max(seconds, 1e-7))))
