"""One profile session: build the candidates in parallel worker processes, check and time them
with a runner, store everything, and compare predicted with measured.

This is the function every face calls (CLI `workbench profile`, dashboard, widgets); long runs
report through a `progress` callback, always called in the caller's thread.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from workbench.construct.space import Options
from workbench.construct.step import Candidate
from workbench.errors import UserError, first_line
from workbench.hardware.spec import DeviceSpec
from workbench.profile.compare import Comparison, compare
from workbench.profile.diagnose import Diagnosis, diagnose
from workbench.profile.local import LocalRunner, measure_library
from workbench.profile.noise import indistinguishable, within_noise
from workbench.profile.provenance import BUSY_LOAD, collect
from workbench.profile.runner import BuiltCandidate, Measurement, Runner, Timing, best_measured
from workbench.profile.store import RunStore
from workbench.versions import versions
from workbench.workers import BUILD_TIMEOUT_S, Worker, WorkerPool, fan_out, thread_env

RUNNERS = ("local", "rpc", "fake")
# Each build worker holds its own TVM (a few hundred MB): more than this buys little.
MAX_BUILD_JOBS = 8


@dataclass(frozen=True)
class ProgressEvent:
    """`phase` "build" or "measure": `done` of `total` candidates finished, the last being `rank`;
    a "measure" event carries that candidate's `measurement` (a face can draw it as it arrives)."""

    phase: str
    done: int
    total: int
    rank: int
    message: str
    measurement: Measurement | None = None


Progress = Callable[[ProgressEvent], None]


@dataclass(frozen=True)
class ProfileResult:
    """What a profile session found: one measurement per candidate and the comparison."""

    workload: str
    device: str
    policy: str
    runner: str
    candidates: tuple[Candidate, ...]
    measurements: tuple[Measurement, ...]  # one per candidate, in rank order
    comparison: Comparison
    run_id: int | None  # the run's id in the store (None when not stored)
    seconds: float  # wall time of the whole session
    load: float | None = None  # this machine's 1-minute load average when the session started
    cores: int = 1  # this machine's logical CPUs

    @property
    def best(self) -> Measurement | None:
        return best_measured(self.measurements)

    def load_note(self) -> str:
        """A sentence when other work was keeping this machine's cores busy as the session started
        (local runs only: its times are then slowed by an unknown amount); "" otherwise."""
        if self.runner != "local" or self.load is None or self.load < BUSY_LOAD * self.cores:
            return ""
        return (f"the machine was busy: load average {self.load:.1f} on {self.cores} cores when profiling started, "
                f"so these times may be inflated; profile again on a quiet machine before trusting them")

    @property
    def diagnoses(self) -> dict[int, Diagnosis]:
        """rank -> the diagnosis of each correct, timed kernel (its best repeat against the roofs)."""
        from workbench.rtile.model.common import peak_gflops, stays_in_llc

        return {c.rank: diagnose(c.estimate, c.device, peak_gflops(c.expr, c.device), m.best_seconds,
                                 stays_in_llc(c.expr, c.device))
                for c, m in zip(self.candidates, self.measurements) if m.ok}

    @property
    def indistinguishable(self) -> tuple[int, ...]:
        """Ranks of correct kernels the repeats cannot tell apart from the fastest by median
        (`profile.noise`): their order is noise, not measurement."""
        return indistinguishable({m.rank: m.seconds for m in self.measurements if m.ok})

    @property
    def within_noise_of_best(self) -> tuple[int, ...]:
        """Ranks of correct kernels the repeats cannot tell apart from the measured best (the
        fastest best repeat, `comparison.best_predicted_rank`), the best included; () without one.
        The comparison's statistics stay the plain values: this says which of them noise decides."""
        best = self.comparison.best_predicted_rank
        return within_noise({m.rank: m.seconds for m in self.measurements if m.ok}, best) if best else ()

    def best_note(self) -> str:
        """Where the measured best was predicted, with the ranks within noise of it where there are
        others: `measured best at predicted rank 3 (ranks 3, 7 within noise of it)`."""
        best = self.comparison.best_predicted_rank
        if best is None:
            return "no correct kernel"
        tied = self.within_noise_of_best
        noise = f" (ranks {', '.join(map(str, tied))} within noise of it)" if len(tied) > 1 else ""
        return f"measured best at predicted rank {best}{noise}"

    def noise_note(self) -> str:
        """A sentence when noise hides the order of the fastest kernels ("" when it does not)."""
        tied = self.indistinguishable
        if not tied:
            return ""
        fastest = min((m for m in self.measurements if m.ok), key=lambda m: (m.median_seconds, m.rank))
        level = min(m.interval.level for m in self.measurements if m.ok and m.rank in tied + (fastest.rank,))
        others = ", ".join(f"#{r}" for r in tied)
        return (f"noise: the fastest by median, #{fastest.rank}, cannot be told apart from {others} (their "
                f"{level:.0%} intervals for the median overlap); take more repeats or a quieter machine "
                f"before trusting their order")

    def to_dict(self) -> dict:
        """The JSON document of `workbench profile --json`."""
        best, diagnoses = self.best, self.diagnoses
        return {
            "workload": self.workload,
            "device": self.device,
            "policy": self.policy,
            "runner": self.runner,
            "run_id": self.run_id,
            "profile_seconds": self.seconds,
            "candidates": [c.to_dict(m) | {"diagnosis": d.to_dict() if (d := diagnoses.get(c.rank)) else None}
                           for c, m in zip(self.candidates, self.measurements)],
            "best_seconds": best.best_seconds if best else None,
            "load_average_at_start": self.load,
            "cores": self.cores,
            "indistinguishable_from_best": list(self.indistinguishable),
            "within_noise_of_best": list(self.within_noise_of_best),
            **self.comparison.to_dict(),
        }


def make_runner(runner: str | Runner, device: DeviceSpec, tracker: str | None = None, key: str | None = None,
                pool: WorkerPool | None = None) -> Runner:
    """The runner named `runner` ("local", "rpc", "fake"), or `runner` itself if it is one.
    "rpc" checks the tracker now (UserError when it does not answer or has no server for `key`).
    The local runner measures in a warm worker of `pool` when one is given."""
    if not isinstance(runner, str):
        return runner
    if runner == "local":
        return LocalRunner(device, pool)
    if runner == "rpc":
        from workbench.profile.rpc import connect_rpc

        if not tracker:
            raise UserError("--runner rpc needs --tracker HOST:PORT and --key KEY")
        return connect_rpc(tracker, key or "")
    if runner == "fake":
        from workbench.profile.fake import FakeRunner

        return FakeRunner()
    raise UserError(f"unknown runner '{runner}' (known: {', '.join(RUNNERS)})")


def profile_candidates(
    expr,
    device: DeviceSpec,
    candidates: Sequence[Candidate],
    *,
    runner: str | Runner = "local",
    tracker: str | None = None,
    key: str | None = None,
    store: RunStore | None = None,
    workload_label: str = "",
    policy: str = "roller",
    timing: Timing = Timing(),
    jobs: int | None = None,
    build_timeout_s: float = BUILD_TIMEOUT_S,
    progress: Progress | None = None,
    pool: WorkerPool | None = None,
    run_label: str = "",
    options: Options | None = None,
) -> ProfileResult:
    """Build, verify and time `candidates` (of the constructed, i.e. axis-fused, `expr`) and
    record the run in `store` (if given) under `run_label`, with its provenance (the machine, the
    software, the construction's `options` and the `timing`: `profile.provenance`). Failures of single candidates (build error, timeout,
    crash, wrong result) are measurements with an `error`, never exceptions; bad input (unknown
    runner, unreachable tracker, empty candidate list, a local runner for kernels this machine
    cannot run) raises UserError before anything runs. With a `pool`, builds and local
    measurements run in its warm workers (TVM imported once for many sessions); without one, the
    session makes its own, so the device check, the builds and the timing share workers."""
    if pool is None:
        with WorkerPool() as own:
            return profile_candidates(expr, device, candidates, runner=runner, tracker=tracker, key=key, store=store,
                                      workload_label=workload_label, policy=policy, timing=timing, jobs=jobs,
                                      build_timeout_s=build_timeout_s, progress=progress, pool=own,
                                      run_label=run_label, options=options)
    start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # before this session adds its own
    chosen = make_runner(runner, device, tracker, key, pool)
    candidates = tuple(sorted(candidates, key=lambda c: c.rank))
    if not candidates:
        raise UserError("nothing to profile: the construction found no candidates")
    if chosen.needs_library:  # the build workers start together, not one after another on first use
        pool.warm(build_jobs(len(candidates), jobs), worker_env(device))
    if chosen.name == "local" and (reason := cannot_run_locally(device, pool)):
        raise UserError(f"cannot profile {device.name} kernels on this machine: {reason} (use the RPC runner "
                        f"with a machine that has one)")
    label = workload_label or expr_label(expr)
    run_id = None
    if store is not None:
        known = versions()
        run_id = store.start_run(workload={"label": label, **expr.workload_dict()}, device=device, policy=policy,
                                 runner=chosen.name, candidates=candidates, versions=known, label=run_label,
                                 provenance=run_provenance(expr, device, known, chosen.name, policy, options, timing,
                                                           load))
    recorder = _Recorder(store, run_id, len(candidates), progress)
    try:
        _build_and_measure(expr, device, candidates, chosen, timing, recorder, jobs, build_timeout_s, pool)
    except BaseException:  # Ctrl-C, SIGTERM, a dashboard rerun: the run is closed as cancelled
        if store is not None:
            with contextlib.suppress(Exception):  # the store's own failure must not hide this one
                store.finish_run(run_id, cancelled=True)
        raise
    if store is not None:
        store.finish_run(run_id)
    measurements = tuple(recorder.measured[c.rank] for c in candidates)
    comparison = compare(
        [c.rank for c in candidates],
        [c.predicted_seconds for c in candidates],
        [m.best_seconds if m.ok else None for m in measurements],
    )
    return ProfileResult(label, device.name, policy, chosen.name, candidates, measurements, comparison, run_id,
                         time.perf_counter() - start, load, os.cpu_count() or 1)


def run_provenance(expr, device: DeviceSpec, known: dict, runner: str, policy: str, options: Options | None,
                   timing: Timing, load: float | None) -> dict:
    """What a run records of where it was made (`provenance.collect`): its options are the
    runner, the policy, the construction's options and the timing's; with them the compute roof
    of `expr` on `device` (`peak_gflops`: the MMA units' or the ALUs') and whether its
    last-level cache holds the operator (`stays_in_llc`), which a report of the run diagnoses by
    and cannot recompute without the expression."""
    from workbench.rtile.model.common import peak_gflops, stays_in_llc

    threads = thread_env(device).get("TVM_NUM_THREADS")
    chosen = {"runner": runner, "policy": policy, "peak_gflops": peak_gflops(expr, device),
              "in_llc": stays_in_llc(expr, device)}
    if options is not None:
        chosen |= {"topk": options.topk, "eps": options.eps, "max_steps": options.max_steps, "seed": options.seed}
    chosen |= {f"timing_{k}": v for k, v in asdict(timing).items()}
    return collect(device, known, chosen, int(threads) if threads else None, load)


def _build_and_measure(expr, device, candidates, chosen, timing, recorder, jobs, build_timeout_s, pool) -> None:
    with tempfile.TemporaryDirectory(prefix="workbench-profile-") as folder:
        if chosen.needs_library:
            first = chosen.preparation(expr, timing) if isinstance(chosen, LocalRunner) else None
            built = build_candidates(expr, device, candidates, folder, jobs=jobs, timeout_s=build_timeout_s,
                                     progress=recorder.notify, pool=pool, first=first)
        else:
            built = tuple(BuiltCandidate(c.rank, c.predicted_seconds, ok=True) for c in candidates)
        recorder.build_seconds = {b.rank: b.build_seconds for b in built}
        for b in built:
            if not b.ok:
                recorder(Measurement(b.rank, chosen.name, error=f"build: {b.error}"))
        chosen.measure(expr, [b for b in built if b.ok], timing, recorder)


# Rounds of `time_in_turns`: each side timed this many times, in turns with the others.
TURNS = 5


def time_in_turns(sides: Sequence[tuple[object, DeviceSpec, Candidate]], timing: Timing = Timing(),
                  rounds: int = TURNS, pool: WorkerPool | None = None) -> tuple[tuple[Measurement, ...], ...]:
    """Each side (expression, device, candidate) built once, then checked and timed here in
    turns, `rounds` times over: A, B, A, B, ... on the local runner, each side in a worker of
    its own device's threads. One measurement per side and round (a failed build or check:
    one failed measurement). A shared host drifts by tens of per cent from one minute to the
    next (docs/benchmarks.md, "Same code, two runs"); timed in turns a few seconds apart, the
    sides share the drift, and the ratios of one round's times cancel it."""
    if pool is None:
        with WorkerPool() as own:
            return time_in_turns(sides, timing, rounds, own)
    with tempfile.TemporaryDirectory(prefix="workbench-turns-") as folder:
        built = []
        for i, (expr, device, candidate) in enumerate(sides):
            (Path(folder) / str(i)).mkdir()
            built.append(build_candidates(expr, device, (candidate,), Path(folder) / str(i), pool=pool)[0])
        workers = [pool.workers(1, worker_env(device))[0] for _, device, _ in sides]
        out: list[list[Measurement]] = [[] for _ in sides]
        for _ in range(rounds):
            for i, ((expr, _, _), b, worker) in enumerate(zip(sides, built, workers)):
                if not b.ok:
                    out[i].append(Measurement(b.rank, "local", error=f"build: {b.error}"))
                    continue
                outcome = worker.call(measure_library, (b, expr, timing, "local", None), timing.timeout_s)
                out[i].append(outcome.value if not outcome.error else Measurement(b.rank, "local", error=f"run: {outcome.error}"))
    return tuple(tuple(m) for m in out)


def cannot_run_locally(device: DeviceSpec, pool: WorkerPool | None = None) -> str:
    """Why kernels for `device` cannot run on this machine ("" when they can): a GPU that is not
    here, or a CPU whose instructions this one lacks (`codegen.host`). Asked in a worker process,
    as LLVM may crash on a malformed target; a worker that cannot tell answers "" (the kernels'
    own runs in a worker then tell)."""
    from workbench.codegen.host import cannot_run_here

    env = worker_env(device)
    worker = pool.workers(1, env)[0] if pool is not None else Worker(env)
    try:
        outcome = worker.call(cannot_run_here, (device.target_dict(),), BUILD_TIMEOUT_S)
    finally:
        if pool is None:
            worker.close()
    return "" if outcome.error else outcome.value


def worker_env(device: DeviceSpec) -> dict[str, str]:
    """The environment of every worker a session uses for `device`: the local runner's
    (`workers.thread_env`), so that in a `WorkerPool` the worker that times kernels is
    one that already checked the device and built candidates, warm, instead of a further
    process paying its own TVM import. A build's output does not depend on TVM_NUM_THREADS (it
    sizes the runtime's thread pool that runs kernels)."""
    return thread_env(device)


class _Recorder:
    """The runners' report callback: attaches build times, stores, and reports progress. A
    candidate reported again (the local runner's second look) replaces its measurement, here and
    in the store, without a progress event: the faces drew it when it first arrived."""

    def __init__(self, store: RunStore | None, run_id: int | None, total: int, progress: Progress | None):
        self.store, self.run_id, self.total = store, run_id, total
        self.notify = progress or (lambda event: None)
        self.build_seconds: dict[int, float] = {}
        self.measured: dict[int, Measurement] = {}

    def __call__(self, m: Measurement) -> None:
        m = replace(m, build_seconds=self.build_seconds.get(m.rank, 0.0))
        again = m.rank in self.measured
        self.measured[m.rank] = m
        if self.store is not None:
            (self.store.replace_measurement if again else self.store.add_measurement)(self.run_id, m)
        if again:
            return
        outcome = f"{m.best_seconds * 1e6:.2f} us" if m.ok else m.error or "not checked"
        self.notify(ProgressEvent("measure", len(self.measured), self.total, m.rank, outcome, m))


def build_candidates(
    expr,
    device: DeviceSpec,
    candidates: Sequence[Candidate],
    folder: str | os.PathLike,
    *,
    jobs: int | None = None,
    timeout_s: float = BUILD_TIMEOUT_S,
    progress: Progress | None = None,
    pool: WorkerPool | None = None,
    first: tuple[Worker, Callable, tuple] | None = None,
) -> tuple[BuiltCandidate, ...]:
    """Build every candidate into a library in `folder`, `jobs` at a time in spawned worker
    processes (warm ones of `pool` when given); a build that fails, crashes or overruns
    `timeout_s` is a BuiltCandidate with `ok=False` and the reason.

    `first` (worker, function, arguments) is a call that worker makes before it takes a build,
    its outcome unused: the local runner's inputs and reference (`LocalRunner.preparation`),
    computed in the worker that will time the kernels while the others build. Computed after
    the builds instead, they would hold both cores' work up behind one (evidence:
    docs/evidence.md#session-first-call). A `first`
    for a worker that builds nothing here is left out (the runner computes them as it measures)."""
    tasks = [
        (expr, c.program, device, c.rank, c.predicted_seconds, str(Path(folder) / f"candidate-{c.rank:03d}.so"))
        for c in candidates
    ]
    n = build_jobs(len(tasks), jobs)
    env = worker_env(device)
    workers = pool.workers(n, env) if pool is not None else [Worker(env) for _ in range(n)]
    notify = progress or (lambda event: None)
    done = []

    early = {id(first[0]): first[1:]} if first is not None else {}

    def work(worker: Worker, task: tuple) -> BuiltCandidate:
        if (call := early.pop(id(worker), None)) is not None:  # once, by the thread of that worker
            worker.call(*call, timeout_s)
        outcome = worker.call(build_library, task, timeout_s)
        return outcome.value if not outcome.error else BuiltCandidate(task[3], task[4], ok=False, error=outcome.error)

    def on_built(_i: int, b: BuiltCandidate) -> None:
        done.append(b)
        notify(ProgressEvent("build", len(done), len(tasks), b.rank, "built" if b.ok else f"build failed: {b.error}"))

    try:
        return tuple(fan_out(tasks, workers, work, on_built))
    finally:
        if pool is None:
            for worker in workers:
                worker.close()


def build_jobs(candidates: int, jobs: int | None = None) -> int:
    """How many build workers `candidates` builds use: `jobs`, by default one per logical CPU up
    to MAX_BUILD_JOBS, never more than there are candidates, at least one."""
    return max(1, min(jobs or min(os.cpu_count() or 1, MAX_BUILD_JOBS), candidates))


def build_library(expr, program, device: DeviceSpec, rank: int, predicted: float, path: str) -> BuiltCandidate:
    """Build one candidate and export its library to `path` (runs in a build worker)."""
    from workbench.codegen.build import build_kernel

    kernel = build_kernel(expr, program, device, sources=False)  # only the library is kept
    if not kernel.ok:
        return BuiltCandidate(rank, predicted, ok=False, error=kernel.error, build_seconds=kernel.build_seconds)
    start = time.perf_counter()
    try:
        kernel.executable.export_library(path)
    except Exception as err:  # linking needs a host compiler; TVM reports its failure variously
        return BuiltCandidate(rank, predicted, ok=False, error=f"export: {first_line(err)}",
                              build_seconds=kernel.build_seconds)
    return BuiltCandidate(rank, predicted, ok=True, library=path, target=kernel.target, entry=kernel.entry,
                          args=kernel.args, build_seconds=kernel.build_seconds + time.perf_counter() - start,
                          prepacked=kernel.prepacked)


def expr_label(expr) -> str:
    """A workload label from the expression's parameters, as `Workload.describe` writes them."""
    params = ",".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in expr.params)
    return f"{expr.op} {params}".strip()
