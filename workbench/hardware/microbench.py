"""Calibration's micro-benchmarks (`Probe`) and how they are run (`measure`): small TVM-built
kernels on all of a spec's `compute_units` cores at once through TVM's parallel runtime:

- streaming read: every core sums its own working set into 16 vector accumulators, over and over
  (the loop is repeated inside the kernel, so launch overhead does not count). A working set of
  half a cache layer's per-core capacity measures that layer, half the last-level cache
  (`DeviceSpec.llc_bytes`, the L3 the cores share) split over the cores and halvings of it
  measure `llc_gbps` at the largest the cores hold (`calibrate.held_llc`);
  256 MiB in all, far beyond it, measures DRAM, quick or not (`calibrate.DRAM_WORKING_SET`): a
  last-level cache of more than a few tens of MiB would inflate DRAM.
- register-resident FMA: every core updates 12 vector accumulators with `a = a * c + d` (LLVM
  contracts it to one FMA), no memory traffic at all. This is the ALU roof that Roller's model
  divides FLOPs by, rather than a BLAS sgemm, which also measures the library's blocking and the
  caches (on the development machine both reached the same ~270 GFLOP/s).
- register micro-kernels (Vortex's level 0, measured once per device by its hybrid analyzer;
  the levels above stay analytical): every core runs C[r, n] += A[r, k] * B[k, n] with the r x n
  output in vector accumulators, vectorised along n, rows and vectors unrolled, over packed
  panels of A and B that fit half of L1 (the shape of the CPU template's micro-kernel), repeated
  inside the kernel. One per register tile the CPU alignment can produce on the spec's ISA:
  1 to 4 vectors wide, every row count whose registers fit the micro-kernel's register budget
  (`calibrate.micro_kernel_shapes`), in float32 and float64, in MICRO_ROUNDS rounds over all of
  them. The rTile model divides a program's compute by the measured rate of the micro-kernel its
  register tile runs, where there is one.
- kernel launch: an empty parallel kernel (each core adds one to one vector) called over and over
  from Python, as `models.execute` calls a model's kernels: the time of one call is what the
  spec's `launch_overhead_us` prices per kernel (the call through TVM's runtime and the fork and
  join of its thread pool), measured in microseconds.

Each measurement keeps the best of several runs (noise only slows a run). The kernels run in a
spawned process: TVM sizes its thread pool once per process from TVM_NUM_THREADS (and otherwise
assumes hyper-threading and uses half the logical CPUs), so the child is started with it set to
the spec's cores (capped at this machine's CPUs).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from multiprocessing import get_context

from workbench.hardware.spec import DeviceSpec
from workbench.repetitions import sized_count

# Spawning the child, importing TVM and compiling both kernels: about a second (2-core machine).
STARTUP_S = 1.0
# The share of the budget left after STARTUP_S that the micro-kernels get together, when there
# are any: 26 float32 and 26 float64 shapes on AVX2 then measure for about 0.37 s each.
MICRO_KERNEL_SHARE = 2 / 3
MIN_SLOT_S = 0.05
# The micro-kernels are measured in this many interleaved rounds, each with a share of its time
# slot, and keep their best round: measured one after another, a change in the host's speed
# (its neighbours, its clock) landed on a run of neighbouring shapes (evidence:
# docs/evidence.md#calibrate-micro-rounds).
MICRO_ROUNDS = 4
# The stream probe's label for the last-level cache (not a layer of the spec: `DeviceSpec.llc_gbps`).
LLC = "LLC"
# The stream probe's label for one core's read from DRAM, run apart on one thread
# (`DeviceSpec.core_dram_gbps`).
ONE_CORE_DRAM = "DRAM, one core"
# Vector accumulators of the streaming read: enough independent chains to hide 4-cycle add
# latency on two pipes (4 x 2 = 8) with margin; its loads fold into the adds, so all 16 of AVX2's
# registers may hold sums.
ACCUMULATORS = 16
# Vector accumulators of the FMA probe: 12 chains cover latency x pipes of x86 cores (4-5 cycles x
# 2 pipes = 8-10), and with the multiplier and the addend they take 14 of AVX2's 16 ymm. 16 of
# them spilled to the stack on AVX2 and measured 86 GFLOP/s where the 6 x 16 micro-kernel ran
# at 205 (2-core EPYC).
FMA_ACCUMULATORS = 12
MIN_RUNS = 3
# Before its first probe the child runs empty parallel kernels for this long (startup transients
# of a fresh process and its thread pool: on a 16-core Intel Xeon under KVM, the first probe of
# three of four fresh processes, an L1 read, ran 1,000x slow through its whole slot, where the
# next process read L1 at 1,858 GB/s; evidence: docs/evidence.md#calibrate-warm-up).
WARM_UP_S = 0.2
RUNS_PER_SLOT = 8  # each timed call lasts about 1/8 of a measurement's time slot

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Probe:
    """One micro-benchmark: a streaming read of `bytes_per_core` per core for layer `label`
    (kind "stream"), the FMA kernel in dtype `label` (kind "fma"), the register micro-kernel
    of `rows` x `cols` accumulators of `dtype` over panels of `depth` reduction steps (kind
    "micro", label "float32 6x16"), or an empty kernel's call (kind and label "launch")."""

    kind: str  # "stream" | "fma" | "micro" | "launch"
    label: str  # layer name (stream), dtype (fma) or "<dtype> <rows>x<cols>" (micro)
    bytes_per_core: int = 0
    dtype: str = ""  # micro only, as are the three below
    rows: int = 0
    cols: int = 0
    depth: int = 0


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    value: float  # GB/s (stream), GFLOP/s (fma, micro; the whole device) or us a call (launch), the best run
    runs: int
    threads: int


def slot_seconds(todo: tuple[Probe, ...], budget_s: float) -> tuple[float, ...]:
    """Seconds each probe of `todo` measures for, within `budget_s` less STARTUP_S: the
    micro-kernels share MICRO_KERNEL_SHARE of it (all of it when they are alone), the other
    probes the rest; at least MIN_SLOT_S each."""
    micro = sum(p.kind == "micro" for p in todo)
    plain = len(todo) - micro
    share = (MICRO_KERNEL_SHARE if plain else 1.0) if micro else 0.0
    spend = budget_s - STARTUP_S
    return tuple(
        max(MIN_SLOT_S, spend * (share / micro if p.kind == "micro" else (1 - share) / plain)) for p in todo
    )


def measure(
    spec: DeviceSpec, todo: tuple[Probe, ...], threads: int, budget_s: float, progress: Progress | None = None
) -> tuple[ProbeResult, ...]:
    """Run `todo` in a spawned process whose TVM thread pool has `threads` threads, within about
    `budget_s` seconds; a ProbeResult each, in order."""
    target = spec.target_dict() | {"num-cores": threads}
    slots = slot_seconds(todo, budget_s)
    order = schedule(todo)
    last = {i: step for step, i in enumerate(order)}  # a probe's last round, which reports it
    best: dict[int, tuple[float, int]] = {}  # probe index -> (best value, timed runs so far)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_set_threads, initargs=(threads,)) as pool:
        pool.submit(_run_launch, target, spec.warp_size, threads, WARM_UP_S).result()
        for step, i in enumerate(order):
            probe = todo[i]
            rounds = MICRO_ROUNDS if probe.kind == "micro" else 1
            value, runs = pool.submit(run_probe, probe, target, spec.warp_size, threads, slots[i] / rounds).result()
            before, counted = best.get(i, (value, 0))
            best[i] = (max(before, value), counted + runs)  # only micro-kernels repeat: higher is better
            if progress is not None and step == last[i]:
                unit = {"stream": "GB/s", "launch": "us a call"}.get(probe.kind, "GFLOP/s")
                progress(f"{probe.label}: {best[i][0]:.1f} {unit}")
    return tuple(ProbeResult(probe, *best[i], threads) for i, probe in enumerate(todo))


def schedule(todo: tuple[Probe, ...]) -> list[int]:
    """The order `measure` runs `todo` in, by index: the probes before the first micro-kernel,
    then MICRO_ROUNDS rounds over every micro-kernel, then the rest."""
    micro = [i for i, p in enumerate(todo) if p.kind == "micro"]
    if not micro:
        return list(range(len(todo)))
    others = [i for i in range(len(todo)) if i not in micro]
    return [i for i in others if i < micro[0]] + micro * MICRO_ROUNDS + [i for i in others if i > micro[0]]


# ---- the child process -----------------------------------------------------------------------


def _set_threads(threads: int) -> None:
    # Runs before the child imports TVM, whose thread pool reads this once.
    os.environ["TVM_NUM_THREADS"] = str(threads)


def run_probe(probe: Probe, target: dict, lanes: int, threads: int, slot_s: float) -> tuple[float, int]:
    """Run one probe for about `slot_s` seconds; returns (best GB/s or GFLOP/s, timed runs)."""
    import numpy as np
    import tvm

    dev = tvm.cpu()
    if probe.kind == "micro":
        return _run_micro(probe, target, lanes, threads, slot_s)
    if probe.kind == "launch":
        return _run_launch(target, lanes, threads, slot_s)
    dtype = "float32" if probe.kind == "stream" else probe.label
    width = lanes * 4 // np.dtype(dtype).itemsize * (ACCUMULATORS if probe.kind == "stream" else FMA_ACCUMULATORS)
    if probe.kind == "stream":
        rows = max(1, probe.bytes_per_core // (width * 4))
        # Written before it is read: untouched pages would all map to one zero page (a cache hit).
        args = [tvm.runtime.tensor(np.ones((threads, rows, width), dtype), dev)]
        args.append(tvm.runtime.tensor(np.zeros((threads, width), dtype), dev))
        work = threads * rows * width * 4  # bytes read per repetition
    else:
        args = [tvm.runtime.tensor(np.ones((threads, width), dtype), dev)]
        work = threads * width * 2  # flops per repetition (an FMA counts two)
    func = _kernel(probe.kind, dtype, lanes, _target_key(target))
    seconds, reps, runs = _best_seconds(lambda reps: func(*args, reps), slot_s)
    return work * reps / seconds / 1e9, runs


def _run_micro(probe: Probe, target: dict, lanes: int, threads: int, slot_s: float) -> tuple[float, int]:
    import numpy as np
    import tvm

    dev = tvm.cpu()
    rows, cols, depth, dtype = probe.rows, probe.cols, probe.depth, probe.dtype
    # Small positive inputs: the sums grow by 1e-6 per step, far from overflow, never denormal.
    args = [tvm.runtime.tensor(np.full(shape, 1e-3, dtype), dev) for shape in ((threads, depth, rows), (threads, depth, cols))]
    args.append(tvm.runtime.tensor(np.zeros((threads, rows, cols), dtype), dev))
    dtype_lanes = lanes * 4 // np.dtype(dtype).itemsize
    func = _micro_kernel(dtype, rows, cols // dtype_lanes, dtype_lanes, depth, _target_key(target))
    seconds, reps, runs = _best_seconds(lambda reps: func(*args, reps), slot_s)
    return threads * depth * rows * cols * 2 * reps / seconds / 1e9, runs


def _run_launch(target: dict, lanes: int, threads: int, slot_s: float) -> tuple[float, int]:
    """Microseconds of one call of an empty parallel kernel, called `reps` times in a row from
    Python (a model's kernels are called one after the other the same way)."""
    import numpy as np
    import tvm

    arg = tvm.runtime.tensor(np.zeros((threads, lanes), "float32"), tvm.cpu())
    func = _kernel("launch", "float32", lanes, _target_key(target))

    def calls(reps: int) -> None:
        for _ in range(reps):
            func(arg)

    seconds, reps, runs = _best_seconds(calls, slot_s)
    return seconds / reps * 1e6, runs


def _target_key(target: dict) -> tuple:
    return tuple(sorted(target.items()))


def _best_seconds(call: Callable[[int], None], slot_s: float) -> tuple[float, int, int]:
    """(best seconds of one call, repetitions per call, timed calls): the repetitions grow until
    a call lasts at least half of slot/RUNS_PER_SLOT; the sizing calls double as warm-up."""
    start = time.perf_counter()
    call(1)  # the first call also starts TVM's thread pool
    reps, _ = sized_count(lambda reps: _time_call(call, reps), slot_s / RUNS_PER_SLOT, enough=0.5)
    best, runs = math.inf, 0
    while runs < MIN_RUNS or time.perf_counter() - start < slot_s:
        best = min(best, _time_call(call, reps))
        runs += 1
    return best, reps, runs


def _time_call(call: Callable[[int], None], reps: int) -> float:
    begin = time.perf_counter()
    call(reps)
    return time.perf_counter() - begin


@cache
def _kernel(kind: str, dtype: str, lanes: int, target_key: tuple):
    import numpy as np
    import tvm

    dtype_lanes = lanes * 4 // np.dtype(dtype).itemsize
    funcs = {"stream": _stream_func, "launch": _launch_func}
    func = funcs[kind](dtype_lanes) if kind in funcs else _fma_func(dtype_lanes, dtype)
    executable = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(dict(target_key)))
    return executable.jit()["main"]


def _stream_func(lanes: int):
    from tvm.script import tirx as T

    width = lanes * ACCUMULATORS

    @T.prim_func
    def stream(a: T.handle, b: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        rows = T.int32()
        A = T.match_buffer(a, (parts, rows, width), "float32")
        B = T.match_buffer(b, (parts, width), "float32")
        for p in T.parallel(parts):
            acc = T.decl_buffer((width,), "float32", scope="local")
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    acc[u * lanes + v] = T.float32(0)
            for _r in range(reps):
                for i in range(rows):
                    for u in T.unroll(ACCUMULATORS):
                        for v in T.vectorized(lanes):
                            acc[u * lanes + v] = acc[u * lanes + v] + A[p, i, u * lanes + v]
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    B[p, u * lanes + v] = acc[u * lanes + v]

    return stream


def _launch_func(lanes: int):
    """Each of `parts` threads adds one to its own vector: next to no work, so a call's time is
    the call and the thread pool's fork and join."""
    from tvm.script import tirx as T

    @T.prim_func
    def launch(a: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        A = T.match_buffer(a, (parts, lanes), "float32")
        for p in T.parallel(parts):
            for v in T.vectorized(lanes):
                A[p, v] = A[p, v] + T.float32(1)

    return launch


def _fma_func(lanes: int, dtype: str):
    from tvm.script import tirx as T

    width = lanes * FMA_ACCUMULATORS

    @T.prim_func
    def fma(b: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        B = T.match_buffer(b, (parts, width), dtype)
        for p in T.parallel(parts):
            acc = T.decl_buffer((width,), dtype, scope="local")
            for u in T.unroll(FMA_ACCUMULATORS):
                for v in T.vectorized(lanes):
                    acc[u * lanes + v] = B[p, u * lanes + v]
            for _r in range(reps):
                for u in T.unroll(FMA_ACCUMULATORS):
                    for v in T.vectorized(lanes):
                        # Converges to 1.0 from any start: no overflow, no slow denormals.
                        acc[u * lanes + v] = acc[u * lanes + v] * T.Cast(dtype, 0.999) + T.Cast(dtype, 0.001)
            for u in T.unroll(FMA_ACCUMULATORS):
                for v in T.vectorized(lanes):
                    B[p, u * lanes + v] = acc[u * lanes + v]

    return fma


@cache
def _micro_kernel(dtype: str, rows: int, vectors: int, lanes: int, depth: int, target_key: tuple):
    import tvm

    func = _micro_func(dtype, rows, vectors, lanes, depth)
    executable = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(dict(target_key)))
    return executable.jit()["main"]


def _micro_func(dtype: str, rows: int, vectors: int, lanes: int, depth: int):
    """C[p] += A[p] x B[p] for each core p, `reps` times over the same panels: A[p] is depth x
    rows (one element broadcast per row and step), B[p] depth x (vectors x lanes) (one row of
    vectors loaded per step), the rows x vectors accumulators stay in registers, as in the CPU
    template's micro-kernel over packed panels (codegen/cpu.py)."""
    from tvm.script import tirx as T

    cols = vectors * lanes

    @T.prim_func
    def micro(a: T.handle, b: T.handle, c: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        A = T.match_buffer(a, (parts, depth, rows), dtype)
        B = T.match_buffer(b, (parts, depth, cols), dtype)
        C = T.match_buffer(c, (parts, rows, cols), dtype)
        for p in T.parallel(parts):
            acc = T.decl_buffer((rows, cols), dtype, scope="local")
            for i in T.unroll(rows):
                for u in T.unroll(vectors):
                    for v in T.vectorized(lanes):
                        acc[i, u * lanes + v] = C[p, i, u * lanes + v]
            for _r in range(reps):
                for k in range(depth):
                    for i in T.unroll(rows):
                        for u in T.unroll(vectors):
                            for v in T.vectorized(lanes):
                                acc[i, u * lanes + v] = acc[i, u * lanes + v] + A[p, k, i] * B[p, k, u * lanes + v]
            for i in T.unroll(rows):
                for u in T.unroll(vectors):
                    for v in T.vectorized(lanes):
                        C[p, i, u * lanes + v] = acc[i, u * lanes + v]

    return micro
