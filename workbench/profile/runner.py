"""The runner interface and its values: a built candidate goes in, a `Measurement` comes out.

A runner gets the candidates that built (each a library file) and reports one `Measurement` per
candidate through a callback as soon as it has it, so a long run can be shown and stored as it
goes. Every kernel is run once on `random_inputs` and compared with the numpy reference before it
is timed: an incorrect kernel is never timed, and `best_measured` never picks it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from math import ceil
from typing import Callable, Protocol, Sequence

import numpy as np

from workbench.codegen import targets
from workbench.codegen.build import ENTRY, KernelArg, Prepacked, laid_out_args
from workbench.errors import UserError
from workbench.profile.noise import (
    RACE,
    RACE_MIN_REPEATS,
    SETTLE,
    SETTLE_MIN_REPEATS,
    MedianInterval,
    median_interval,
    outpaced,
    settled,
)
from workbench.versions import versions
from workbench.workers import RUN_TIMEOUT_S

Report = Callable[["Measurement"], None]
# `evaluator_repeats` sizes a repeat to this much more than min_repeat_ms, so that runs a little
# faster than the fastest seen so far do not drop a repeat below it (TVM would then discard it
# and time again with 1.618x the runs).
REPEAT_MARGIN = 1.1
# The probe that sizes a kernel's first repeat runs it for at least this long (TVM's own growth
# of `number` from one run): a single run after the check pays the runtime's thread pool waking
# up, and repeats sized from it come out short (evidence: docs/evidence.md#runner-probe-ms).
PROBE_MS = 1
# Rounds of the second look (`Timing.revisit`), after the session timed every kernel once: each
# round times each correct kernel once more, one after another in turn. A shared 2-core host now
# and then gives a kernel one core's speed for seconds, through all its repeats, which agree, so
# the timing settles (11 x 760 x 1109's first three kernels at 139-153 us in one run, 71-76 in
# the next); timed in turn, kernels share the host's spells. With one round, under a hog of one
# core for 1 s in every 4, 14 of 120 kernels were recorded over 1.2x their quiet time without it,
# none with it. With four rounds, two `random:12` runs of each workload's top 10 agreed at
# Spearman 0.80 and 0.81 where one round's agreed at 0.64 and 0.76 (a kernel's time from one run
# to the next: 1.6 and 1.5 % against 3.8 and 2.1 %), for 10-30 % more profile time
# (docs/evidence.md#runner-revisit).
REVISIT = 4


@dataclass(frozen=True)
class Timing:
    """How a kernel is timed: TVM's `time_evaluator` runs it `number` times per repeat (more while
    a repeat is shorter than `min_repeat_ms`) and reports the mean of each of up to `repeat`
    repeats: with `settle` > 0 the timing stops after 3 repeats (`noise.SETTLE_MIN_REPEATS`) or
    any later one once the repeats agree within `settle` (`noise.settled`), and takes all
    `repeat` while they do not; `settle` = 0 always takes `repeat`. With `race` > 0, a kernel
    timed after others stops after 2 repeats (`noise.RACE_MIN_REPEATS`) when even the faster of
    them is more than `race` slower than their fastest repeat (`noise.outpaced`; later repeats
    could only lower its fastest): it cannot be the best, and its `seconds` say how many repeats
    it got. `revisit`: rounds of a second look after every kernel of the session was timed,
    each round one more repeat of each correct kernel, in turn (`LocalRunner.measure`; 0:
    none). `flush_cache` flushes the CPU caches before each repeat (TVM's
    `cache_flush_cpu_non_first_arg`, which leaves the first argument warm). `timeout_s` bounds
    one candidate's check and timing.
    """

    repeat: int = 5
    number: int = 1
    # 25 ms a repeat: a third less profile time than 50 ms, and two runs' measurements agree as
    # well as with 50 ms (evidence: docs/evidence.md#runner-min-repeat-ms).
    min_repeat_ms: int = 25
    flush_cache: bool = False
    timeout_s: float = RUN_TIMEOUT_S
    seed: int = 0  # seed of the verification inputs (`random_inputs`)
    settle: float = SETTLE
    race: float = RACE
    revisit: int = REVISIT

    def __post_init__(self):
        for name in ("repeat", "number"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.min_repeat_ms < 0 or self.timeout_s <= 0 or self.settle < 0 or self.race < 0 or self.revisit < 0:
            raise UserError(f"timing needs min_repeat_ms >= 0, timeout_s > 0, settle >= 0, race >= 0 and revisit >= 0, "
                            f"got {self.min_repeat_ms}, {self.timeout_s}, {self.settle}, {self.race} and {self.revisit}")


@dataclass(frozen=True)
class BuiltCandidate:
    """A candidate after the build: a library file (`tvm.runtime.load_module`-able) or an error."""

    rank: int
    predicted_seconds: float
    ok: bool
    error: str = ""
    library: str = ""  # path of the exported shared library
    target: str = ""  # the TVM target dict as JSON
    entry: str = ENTRY
    args: tuple[KernelArg, ...] = ()
    build_seconds: float = 0.0
    prepacked: tuple[Prepacked, ...] = ()  # arguments the kernel takes laid out (`codegen.build.Prepacked`)

    @property
    def target_kind(self) -> str:
        return json.loads(self.target)["kind"] if self.target else ""


@dataclass(frozen=True)
class Measurement:
    """One candidate's result on one runner.

    `seconds` holds one value per repeat (each the mean over that repeat's runs); `correct` is
    None when the kernel was not checked (build failure, no such device here, timeout before the
    check). `error` says why there is no time. `versions` names what produced the numbers:
    package versions and the runtime's thread count.
    """

    rank: int
    runner: str
    seconds: tuple[float, ...] = ()
    correct: bool | None = None
    error: str = ""
    build_seconds: float = 0.0
    created_at: float = field(default_factory=time.time)
    versions: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """True for a verified kernel with a time: the only kind that may be ranked."""
        return self.correct is True and not self.error and bool(self.seconds)

    @property
    def best_seconds(self) -> float | None:
        return min(self.seconds) if self.seconds else None

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def interval(self) -> MedianInterval | None:
        """Where the true median lies (`profile.noise`); None without repeats."""
        return median_interval(self.seconds)

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "runner": self.runner,
            "seconds": list(self.seconds),
            "best_seconds": self.best_seconds,
            "median_seconds": self.median_seconds,
            "correct": self.correct,
            "error": self.error,
            "build_seconds": self.build_seconds,
            "created_at": self.created_at,
            "versions": dict(self.versions),
        }


class Runner(Protocol):
    """Times built candidates. `needs_library` False means the runner never opens the library
    (the fake runner), so the session skips building."""

    name: str
    needs_library: bool

    def measure(self, expr, built: Sequence[BuiltCandidate], timing: Timing, report: Report) -> None:
        """Call `report` once per candidate of `built` (any order), in the caller's thread; a
        runner may report a candidate again (the local runner's second look, `Timing.revisit`),
        which replaces its first report."""


def best_measured(measurements: Sequence[Measurement]) -> Measurement | None:
    """The fastest measurement that is correct and has a time (None if there is none)."""
    usable = [m for m in measurements if m.ok]
    return min(usable, key=lambda m: (m.best_seconds, m.rank)) if usable else None


def check_and_time(module, built: BuiltCandidate, dev, expr, timing: Timing, best: float | None = None):
    """Run `built`'s entry of `module` on `dev` (local or remote) against the numpy reference,
    then time it (`timed_repeats`: `best` the fastest repeat of the kernels timed before it).

    Returns `(Verification, seconds)`; `seconds` is empty when the result is wrong. The checking
    run doubles as the warm-up before timing.
    """
    inputs, ref = inputs_and_reference(expr, timing.seed)
    args = _first_run(module, built, dev, inputs)
    check = verified(args[-1].numpy(), expr, ref, timing.seed)
    if not check.correct:
        return check, ()
    return check, timed_repeats(_evaluator(module, built, dev, args, timing), timing, best)


def retime(module, built: BuiltCandidate, dev, expr, timing: Timing, fastest: float) -> tuple[float, ...]:
    """One more repeat of a kernel `check_and_time` checked and timed (`fastest`: its fastest
    repeat then), after one run that warms the caches as the check did."""
    args = _first_run(module, built, dev, inputs_and_reference(expr, timing.seed)[0])
    return tuple(_evaluator(module, built, dev, args, timing)(1, fastest))


def _first_run(module, built: BuiltCandidate, dev, inputs) -> tuple:
    """The arguments of `built`'s entry on `dev` (`inputs` laid out as the kernel reads them, and
    a zeroed output), after one run of the entry on them."""
    import tvm

    arrays = laid_out_args(module, built.prepacked, [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs], dev)
    out_arg = built.args[-1]
    args = (*arrays, tvm.runtime.tensor(np.zeros(out_arg.shape, dtype=out_arg.dtype), dev))
    module[built.entry](*args)
    dev.sync()
    return args


def _evaluator(module, built: BuiltCandidate, dev, args: Sequence, timing: Timing):
    """`evaluator_repeats` of `built`'s entry, the caches flushed where `timing` asks and the
    kernel runs on the host."""
    flush = timing.flush_cache and targets.target(built.target_kind).on_host
    return evaluator_repeats(module, built.entry, dev, args, timing, flush)


def evaluator_repeats(module, entry: str, dev, args: Sequence, timing: Timing, flush: bool = False):
    """`run(n, fastest)` for `timed_repeats`: `n` repeats of `module[entry](*args)` on `dev` by
    TVM's `time_evaluator` (`flush`: the CPU caches flushed before each, all but the first arg)."""

    preproc = "cache_flush_cpu_non_first_arg" if flush else ""

    def run(repeats: int, fastest: float | None) -> list[float]:
        # `number` is sized so that a repeat is one run of >= min_repeat_ms, from the fastest
        # repeat so far, else from a probe of >= PROBE_MS (after the check run, so warm), with
        # `REPEAT_MARGIN` to spare. TVM's own sizing discards every run short of
        # min_repeat_ms and grows `number` by 1.618x at least, so a `number` a little short
        # costs a third of the time again (evidence: docs/evidence.md#runner-repeat-sizing).
        if fastest is None:
            probe = module.time_evaluator(entry, dev, number=1, repeat=1, min_repeat_ms=PROBE_MS, f_preproc=preproc)
            fastest = float(probe(*args).results[0])
        number = timing.number
        if fastest > 0:
            number = max(number, ceil(REPEAT_MARGIN * timing.min_repeat_ms / 1e3 / fastest))
        evaluator = module.time_evaluator(
            entry, dev, number=number, repeat=repeats, min_repeat_ms=timing.min_repeat_ms, f_preproc=preproc,
        )
        return [float(s) for s in evaluator(*args).results]

    return run


def timed_repeats(run: Callable[[int, float | None], Sequence[float]], timing: Timing,
                  best: float | None = None) -> tuple[float, ...]:
    """The repeats of one kernel's timing: `run(n, fastest)` times `n` more repeats (`fastest`
    the fastest so far, None before the first). All `timing.repeat` at once without `settle`
    and without a race (`best` None or `timing.race` 0); otherwise `SETTLE_MIN_REPEATS` first
    (`RACE_MIN_REPEATS` in a race), then one at a time until the repeats are `settled` or
    `outpaced` by `best` (`profile.noise`) or `timing.repeat` were taken."""
    racing = best is not None and timing.race > 0
    if not timing.settle and not racing:
        return tuple(run(timing.repeat, None))
    seconds = list(run(min(timing.repeat, RACE_MIN_REPEATS if racing else SETTLE_MIN_REPEATS), None))
    while (len(seconds) < timing.repeat and not settled(seconds, timing.settle)
           and not outpaced(seconds, best, timing.race)):
        seconds += run(1, min(seconds))
    return tuple(seconds)


def verified(out, expr, ref, seed: int):
    """`codegen.verify.compare` of `out` with `ref` (the reference of `expr`'s inputs drawn with
    `seed`), remembered by the output's bytes for the last expression: candidates that compute
    the same bits (every correct elementwise kernel, whatever its tiling) get the verification
    of the first without its float64 pass again (a digest costs a small share of that pass:
    docs/evidence.md#runner-verified).
    `compare` is a function of the output, the reference and the dtype alone, so the remembered
    answer is the one it would give."""
    from workbench.codegen.verify import compare

    known = _verifications(expr, seed)
    key = hashlib.blake2b(np.ascontiguousarray(out).view(np.uint8)).digest()
    if key not in known:
        known[key] = compare(out, ref, expr.dtype)  # `check_output`, with the reference computed once
    return known[key]


@functools.lru_cache(maxsize=1)
def _verifications(expr, seed: int) -> dict:
    """Output digest -> Verification for the last expression and seed (`verified`)."""
    return {}


@functools.lru_cache(maxsize=1)
def inputs_and_reference(expr, seed: int):
    """`random_inputs(expr, seed)` and their float64 reference (`quiet_reference`), kept for
    the last expression: a session checks all its candidates on the same inputs, and drawing
    them and computing the reference took up to 0.4 s each per candidate (gemv-4096's inputs,
    mm-1024's reference on a loaded 2-core EPYC). One entry, so a worker serving a whole suite
    holds one workload's arrays at a time. Callers only read the arrays."""
    from workbench.ops.reference import random_inputs

    inputs = random_inputs(expr, seed)
    return inputs, quiet_reference(expr, inputs)


def prepare_reference(expr, seed: int) -> None:
    """Draw `expr`'s inputs and compute their reference now (`inputs_and_reference`, which keeps
    them), so that the first kernel checked in this process finds them ready: a worker that will
    time the kernels does this while the others build them. Returns nothing: the arrays stay."""
    inputs_and_reference(expr, seed)


def quiet_reference(expr, inputs):
    """`reference_with_scale` on one BLAS thread, for a caller that times a kernel right after:
    after a multi-threaded call OpenBLAS's threads spin on the cores for tens of milliseconds,
    and the kernel timed next (each workload's rank 1) would share the cores with them
    (evidence: docs/evidence.md#runner-quiet-reference)."""
    from threadpoolctl import threadpool_limits

    from workbench.ops.reference import reference_with_scale

    with threadpool_limits(limits=1, user_api="blas"):
        return reference_with_scale(expr, inputs)


def measurement_from_check(rank: int, runner: str, check, seconds, versions) -> Measurement:
    """The Measurement of a `check_and_time` result."""
    error = "" if check.correct else f"wrong result: {check.error}"
    return Measurement(rank, runner, tuple(seconds), correct=check.correct, error=error, versions=versions)


def runtime_versions() -> tuple[tuple[str, str], ...]:
    """Package versions and the TVM runtime's thread count of this process."""
    import tvm

    return tuple(sorted(versions().items())) + (("threads", str(tvm.runtime.num_threads())),)
