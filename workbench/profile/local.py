"""The local runner: time kernels on this machine's CPU (or its CUDA GPU) in a worker process.

Timing runs in a spawned worker so that the TVM runtime's thread pool can be sized before it
starts: TVM reads TVM_NUM_THREADS once, and without it uses half the logical cores on x86 (it
assumes hyper-threading). Candidates are timed one after another, never in parallel with each
other or with builds, so they do not disturb each other's numbers. Building the next candidates
while one is timed would not keep that on a 2-core machine: the kernel's pool takes every core,
so a build would share one with the timing. After every kernel was timed, each correct one gets
a second look (`Timing.revisit` rounds, each one more repeat of each, in turn): a kernel timed
while the host slowed it gets a time from outside that spell, and kernels timed in turn share
the host's spells. Checking each kernel in its build worker as the build ends (tried for issue
14) lengthened the build phase of the cpu-core suite by more than it took from the serial one
(each build worker then computes the reference and compares on its own, beside the other's
build), so the timing worker checks, and remembers (`runner.verified`).
It draws the inputs and computes their reference while the others build (`preparation`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Sequence

from workbench.codegen import targets
from workbench.hardware.spec import DeviceSpec
from workbench.profile.runner import (
    BuiltCandidate,
    Measurement,
    Report,
    Timing,
    check_and_time,
    measurement_from_check,
    prepare_reference,
    retime,
    runtime_versions,
)
from workbench.workers import Worker, WorkerPool, thread_env


def pool_threads(device: DeviceSpec) -> int:
    """The threads of TVM's pool that runs kernels in this process: sized to `device`'s cores
    (`thread_env`) where the pool has not started yet and the caller set no TVM_NUM_THREADS; a
    pool already started keeps its size, which this reports. Without it TVM assumes
    hyper-threading and starts half the logical CPUs: one thread on a 2-core machine."""
    import tvm

    for key, value in thread_env(device).items():
        os.environ.setdefault(key, value)
    return int(tvm.get_global_func("runtime.NumThreads")())


def measure_library(built: BuiltCandidate, expr, timing: Timing, runner: str, best: float | None = None) -> Measurement:
    """Load `built.library`, check it against numpy and time it, racing `best` (the fastest repeat
    of the kernels timed before it, `runner.timed_repeats`); runs in the worker."""
    import tvm

    kind = built.target_kind
    dev = targets.runtime_device(kind)
    if not dev.exist:
        return Measurement(built.rank, runner, error=f"no {kind} device on this machine")
    module = tvm.runtime.load_module(built.library)
    check, seconds = check_and_time(module, built, dev, expr, timing, best)
    return measurement_from_check(built.rank, runner, check, seconds, runtime_versions())


def revisit_library(built: BuiltCandidate, expr, timing: Timing, fastest: float) -> tuple[float, ...]:
    """`runner.retime` of `built.library` (one more repeat), which `measure_library` checked and
    timed (`fastest`: its fastest repeat then); runs in the worker."""
    import tvm

    module = tvm.runtime.load_module(built.library)
    return retime(module, built, targets.runtime_device(built.target_kind), expr, timing, fastest)


class LocalRunner:
    """Times kernels on this machine, one at a time, in one worker process; each kernel after the
    first races the fastest repeat so far (`Timing.race`); then each correct one is reported
    again with its second look's repeats added: `Timing.revisit` rounds, each one repeat of every
    kernel still correct, in turn. A kernel whose second look fails is reported failed."""

    name = "local"
    needs_library = True

    def __init__(self, device: DeviceSpec, pool: WorkerPool | None = None):
        self.env = thread_env(device)
        self.pool = pool  # a warm worker from it, else a worker of this session's own

    def preparation(self, expr, timing: Timing) -> tuple[Worker, Callable, tuple] | None:
        """The call that draws `expr`'s inputs and computes their reference in the worker that
        will time the kernels (`runner.prepare_reference`), for the session to make while the
        other workers build: (worker, function, arguments); None without a pool, whose worker
        this runner would start only to measure."""
        if self.pool is None:
            return None
        return self.pool.workers(1, self.env)[0], prepare_reference, (expr, timing.seed)

    def measure(self, expr, built: Sequence[BuiltCandidate], timing: Timing, report: Report) -> None:
        worker = self.pool.workers(1, self.env)[0] if self.pool is not None else Worker(self.env)
        best, timed = None, []
        try:
            for candidate in built:
                outcome = worker.call(measure_library, (candidate, expr, timing, self.name, best), timing.timeout_s)
                if outcome.error:
                    report(Measurement(candidate.rank, self.name, error=f"run: {outcome.error}"))
                    continue
                measured = outcome.value
                report(measured)
                if measured.ok:
                    best = measured.best_seconds if best is None else min(best, measured.best_seconds)
                    timed.append((candidate, measured))
            looked = {candidate.rank: () for candidate, _ in timed} if timing.revisit else {}
            for _ in range(timing.revisit):
                for candidate, measured in timed:
                    if candidate.rank not in looked:
                        continue
                    args = (candidate, expr, timing, measured.best_seconds)
                    outcome = worker.call(revisit_library, args, timing.timeout_s)
                    if outcome.error:  # it ran before: failing now is the kernel's failure all the same
                        del looked[candidate.rank]
                        report(Measurement(candidate.rank, self.name, error=f"run (second look): {outcome.error}"))
                    else:
                        looked[candidate.rank] += outcome.value
            for candidate, measured in timed:
                if candidate.rank in looked:
                    report(replace(measured, seconds=measured.seconds + looked[candidate.rank]))
        finally:
            if self.pool is None:
                worker.close()
