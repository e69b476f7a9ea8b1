"""Worker processes that can be killed one at a time, and a thread fan-out around them.

`concurrent.futures.ProcessPoolExecutor` cannot stop one hung task (a future's timeout leaves the
worker running, and shutdown waits for it), and one crashed worker breaks every pending future. A
`Worker` here is one spawned process (TVM and fork do not mix) serving calls over a pipe: a call
that overruns its timeout kills that process only, a crash is reported with its exit status, and
the next call starts a fresh process. `fan_out` drives several of them from threads and hands the
results to the calling thread, so callbacks (progress bars, the store) never run elsewhere.

Profiling, export, model runs and the baselines all build and run kernels in these workers; what
such a worker needs to know of a device (`thread_env`) and how long a build or a kernel's run may
take in one (`BUILD_TIMEOUT_S`, `RUN_TIMEOUT_S`) is said here, once.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

from workbench.errors import first_line
from workbench.hardware.spec import DeviceSpec

# Starting a worker imports TVM (about a second, more on a loaded machine); this bounds it.
START_TIMEOUT_S = 120.0
# How long a worker may take to exit after it was asked to.
STOP_TIMEOUT_S = 5.0
# A build (schedule + LLVM/NVCC compile + link) takes well under a second for the catalog's
# workloads; a minute means the compiler is stuck.
BUILD_TIMEOUT_S = 60.0
# One candidate's check and timing in a worker (`profile.runner.Timing.timeout_s` by default, the
# export's check): a kernel still running after a minute is stuck, or far off every other.
RUN_TIMEOUT_S = 60.0

C = TypeVar("C")
T = TypeVar("T")
R = TypeVar("R")


def thread_env(device: DeviceSpec) -> dict[str, str]:
    """TVM_NUM_THREADS for a worker that runs `device`'s kernels: its cores, capped by this
    machine's (a spec of a bigger CPU must not oversubscribe this one); nothing for GPUs, whose
    kernels do not use the pool."""
    if not device.runs_on_cpu:
        return {}
    return {"TVM_NUM_THREADS": str(max(1, min(device.compute_units, os.cpu_count() or 1)))}


@dataclass(frozen=True)
class Outcome:
    """What a call returned, or why it did not (`error` non-empty)."""

    value: object = None
    error: str = ""


def _serve(conn, env: Mapping[str, str]) -> None:
    # Runs in the child. The environment must be set before TVM starts its thread pool, which
    # reads TVM_NUM_THREADS once; importing TVM here keeps that cost out of the first call.
    # Ctrl-C reaches the whole process group: the parent decides (and kills this worker), so
    # the worker ignores it rather than die with a traceback of its own. It was blocked since the
    # fork (`_quiet_start`); a Ctrl-C pending from then is dropped with the unblocking.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.update(env)
    # TVM's FFI imports torch whenever it is installed (for tensor exchange, which no worker
    # function uses): a large share of a worker's start and memory, paid by every build and
    # timing worker (evidence: docs/evidence.md#workers-no-torch); torch is here for the PyTorch
    # baseline, which runs in the calling process. None in sys.modules makes `import torch` fail
    # with ImportError,
    # which TVM takes for "not installed".
    sys.modules.setdefault("torch", None)
    import tvm  # noqa: F401

    try:
        conn.send("ready")
        while (message := conn.recv()) is not None:
            fn, args = message
            try:
                outcome = Outcome(fn(*args))
            except Exception as err:  # the caller records the failure; the worker keeps serving
                outcome = Outcome(error=f"{type(err).__name__}: {first_line(err)}")
            try:
                conn.send(outcome)
            except (EOFError, OSError):
                raise
            except Exception as err:  # a result that cannot be pickled
                conn.send(Outcome(error=f"{type(err).__name__}: {first_line(err)}"))
    except (EOFError, OSError):  # the parent is gone (interrupted): nobody to answer
        return


class Worker:
    """One spawned process running module-level functions one call at a time."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self._env = dict(env or {})
        self._proc = None
        self._conn = None
        self._busy = False  # inside `call`

    def call(self, fn: Callable, args: tuple, timeout_s: float) -> Outcome:
        """`fn(*args)` in the worker; a timeout or a crash comes back as `Outcome.error`. An
        exception in the caller while it waits (Ctrl-C, a signal turned into one) kills the
        worker, which is mid-call, and propagates."""
        self._busy = True
        try:
            error = self.start()
            if error:
                return Outcome(error=error)
            self._conn.send((fn, args))
            if not self._answered(timeout_s):
                self._kill()
                return Outcome(error=f"timed out after {timeout_s:g} s")
            try:
                return self._conn.recv()
            except (EOFError, OSError):
                return Outcome(error=f"worker crashed ({self._kill()})")
        except BaseException:
            self._kill()
            raise
        finally:
            self._busy = False

    def _answered(self, timeout_s: float) -> bool:
        """Wait for an answer or the end of the process, whichever comes first."""
        return bool(multiprocessing.connection.wait([self._conn, self._proc.sentinel], timeout_s))

    def close(self) -> None:
        """Stop the worker: asked to finish when idle; killed when a call is under way (in
        another thread, whose caller was interrupted), since it would not listen."""
        proc = self._proc
        if proc is None:
            return
        if not self._busy:
            try:
                self._conn.send(None)
                proc.join(STOP_TIMEOUT_S)
            except (OSError, ValueError):  # the pipe or the process is already gone
                pass
        self._kill()

    def start(self) -> str:
        """Start the process unless it runs already; "" or why it did not start (the next call
        then tries again)."""
        return self._start() if self._proc is None else ""

    def _start(self) -> str:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self._env), daemon=True)
        with _quiet_start():
            self._proc.start()
        child.close()
        try:
            if self._answered(START_TIMEOUT_S) and self._conn.recv() == "ready":
                return ""
        except (EOFError, OSError):
            pass
        return f"worker did not start ({self._kill()})"

    def _kill(self) -> str:
        """Stop the process (if alive) and forget it; returns how it ended."""
        proc, self._proc = self._proc, None
        if proc is None:  # stopped already (by `close` from another thread)
            return "stopped"
        self._conn.close()
        if proc.pid is None:  # never started
            return "not started"
        if proc.is_alive():
            proc.kill()
        proc.join(STOP_TIMEOUT_S)
        code = proc.exitcode
        if code is not None and code < 0:
            return f"signal {signal.Signals(-code).name}"
        return f"exit status {code}"


class WorkerPool:
    """Workers kept warm across profile sessions (a benchmark over a suite): each pays its TVM
    import once instead of once per session. A worker that hung or crashed is restarted by its
    next call, as any `Worker` is. Use it as a context manager, or `close()` it."""

    def __init__(self):
        self._workers: dict[tuple, list[Worker]] = {}

    def workers(self, n: int, env: Mapping[str, str] | None = None) -> list[Worker]:
        """`n` workers with environment `env` (started on their first call)."""
        have = self._workers.setdefault(tuple(sorted((env or {}).items())), [])
        while len(have) < n:
            have.append(Worker(env))
        return have[:n]

    def warm(self, n: int, env: Mapping[str, str] | None = None) -> list[str]:
        """Start `n` workers with environment `env` at once, one thread each: their TVM imports
        overlap instead of queueing behind each other's first calls (evidence:
        docs/evidence.md#workers-warm). Returns each worker's start
        error ("" when it runs); a worker that failed is started again by its next call."""
        workers = self.workers(n, env)
        errors = [""] * len(workers)

        def start(i: int) -> None:
            errors[i] = workers[i].start()

        threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in range(len(workers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return errors

    def __len__(self) -> int:
        """Workers in the pool, all environments."""
        return sum(len(workers) for workers in self._workers.values())

    def close(self) -> None:
        for workers in self._workers.values():
            for worker in workers:
                worker.close()
        self._workers.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def _quiet_start():
    """Hold SIGINT and SIGTERM while a worker process starts. A start interrupted halfway leaves
    a child that never gets its pipe's first message and dies with a traceback of its own; so in
    the main thread (the only one Python delivers signals to) a signal is recorded and delivered
    once the start is done. SIGINT is also blocked in the starting thread across the fork: the
    child inherits that thread's mask and keeps a Ctrl-C typed at the terminal (sent to the whole
    process group) pending until `_serve` ignores it, instead of dying of it while it imports."""
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in held}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])


def fan_out(
    items: Sequence[T],
    contexts: Sequence[C],
    work: Callable[[C, T], R],
    on_done: Callable[[int, R], None],
) -> list[R]:
    """`work(context, item)` for every item, one thread per context taking the next free item;
    `on_done(index, result)` runs in the calling thread as results arrive. Returns the results in
    item order; an exception in `work` is re-raised once the other threads are done."""
    if items and not contexts:
        raise ValueError("fan_out needs at least one context")
    todo: queue.Queue = queue.Queue()
    for i in range(len(items)):
        todo.put(i)
    done: queue.Queue = queue.Queue()
    stop = threading.Event()

    def drive(context):
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, work(context, items[i]), None))
            except BaseException as err:  # handed to the caller; never lost in a thread
                done.put((i, None, err))

    threads = [threading.Thread(target=drive, args=(c,), daemon=True) for c in contexts[: len(items)]]
    for thread in threads:
        thread.start()
    try:
        return _collect(len(items), done, threads, on_done)
    finally:
        stop.set()  # after an interrupt in the caller, the threads take no further item


def _collect(n: int, done: queue.Queue, threads, on_done) -> list:
    results: list = [None] * n
    failure = None
    for _ in range(n):
        i, result, err = done.get()
        failure = failure or err
        if err is None:
            results[i] = result
            on_done(i, result)
    for thread in threads:
        thread.join()
    if failure is not None:
        raise failure
    return results
