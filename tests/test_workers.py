"""Worker processes: a call's result comes back, a crash and a timeout are reported with their
reason and cost only that worker, which the next call replaces; `fan_out` keeps item order and
calls back in the calling thread."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.helpers import TINY_CPU, device
from workbench.workers import Worker, WorkerPool, fan_out, thread_env


def environment(name: str) -> str:
    return os.environ.get(name, "")


def torch_loaded() -> bool:
    import sys

    return sys.modules.get("torch") is not None


def crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def fail() -> None:
    raise ValueError("bad candidate\nsecond line")


def test_a_worker_survives_errors_and_is_replaced_after_crashes_and_timeouts():
    worker = Worker({"TVM_NUM_THREADS": "3"})
    try:
        assert worker.call(environment, ("TVM_NUM_THREADS",), 30).value == "3"
        assert worker.call(fail, (), 30).error == "ValueError: bad candidate"
        assert worker.call(crash, (), 30).error == "worker crashed (signal SIGSEGV)"
        start = time.perf_counter()
        assert worker.call(time.sleep, (30,), 0.5).error == "timed out after 0.5 s"
        assert time.perf_counter() - start < 10
        assert worker.call(environment, ("TVM_NUM_THREADS",), 30).value == "3"  # a fresh process, same env
    finally:
        worker.close()


def test_a_worker_runs_tvm_without_importing_torch():
    """TVM's FFI imports torch when it can (1.4 s of a worker's start); workers keep it out."""
    worker = Worker()
    try:
        assert worker.call(torch_loaded, (), 60).value is False
    finally:
        worker.close()


def test_fan_out_keeps_order_and_calls_back_in_the_calling_thread():
    seen = []
    caller = threading.get_ident()

    def on_done(i, result):
        seen.append((i, result, threading.get_ident() == caller))

    results = fan_out([3, 1, 2, 5], ["a", "b"], lambda ctx, x: (ctx, x * 10), on_done)
    assert [r[1] for r in results] == [30, 10, 20, 50]
    assert {r[0] for r in results} <= {"a", "b"}
    assert sorted(i for i, _, _ in seen) == [0, 1, 2, 3] and all(same for _, _, same in seen)


def test_fan_out_reraises_a_failure_after_the_others_finish():
    finished = []

    def work(_ctx, x):
        if x == 2:
            raise RuntimeError("boom")
        return x

    with pytest.raises(RuntimeError, match="boom"):
        fan_out([1, 2, 3], [None, None], work, lambda i, r: finished.append(r))
    assert sorted(finished) == [1, 3]


def test_a_pool_keeps_its_workers_warm_per_environment():
    with WorkerPool() as pool:
        first = pool.workers(2)
        pids = [w.call(os.getpid, (), 60).value for w in first]
        assert pool.workers(2) == first and pool.workers(1) == first[:1]
        assert [w.call(os.getpid, (), 60).value for w in pool.workers(2)] == pids  # the same processes
        (other,) = pool.workers(1, {"TVM_NUM_THREADS": "1"})
        assert other not in first and other.call(environment, ("TVM_NUM_THREADS",), 60).value == "1"
        assert first[0].call(crash, (), 60).error == "worker crashed (signal SIGSEGV)"
        restarted = pool.workers(1)[0].call(os.getpid, (), 60).value
        assert restarted not in pids  # restarted on its next call
    for pid in (restarted, pids[1]):  # closing the pool stopped its processes
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_warm_starts_the_workers_a_later_call_finds_running():
    with WorkerPool() as pool:
        assert pool.warm(2, {"TVM_NUM_THREADS": "1"}) == ["", ""]
        workers = pool.workers(2, {"TVM_NUM_THREADS": "1"})
        pids = [w._proc.pid for w in workers]  # started by warm, before any call
        assert all(pids) and len(set(pids)) == 2 and len(pool) == 2
        assert [w.call(os.getpid, (), 60).value for w in workers] == pids  # the calls found them running
        assert pool.warm(2, {"TVM_NUM_THREADS": "1"}) == ["", ""]  # warm ones are left as they are
        assert [w.call(os.getpid, (), 60).value for w in workers] == pids


def test_threads_follow_the_device_capped_by_this_machine():
    assert thread_env(TINY_CPU) in ({"TVM_NUM_THREADS": "2"}, {"TVM_NUM_THREADS": "1"})
    assert thread_env(device("v100")) == {}
