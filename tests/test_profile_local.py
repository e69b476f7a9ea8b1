"""The local runner on real kernels: a correct kernel is timed (caches flushed) with the device's
thread count and looked at again after the others, a wrong one is flagged and never timed, and a
CUDA kernel is timed where a GPU exists."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from functools import lru_cache

import pytest

from tests.helpers import TINY_CPU, device, expr, matmul
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.profile.local import LocalRunner, pool_threads, revisit_library
from workbench.profile.runner import BuiltCandidate, Measurement, Timing, best_measured
from workbench.profile.session import build_library, profile_candidates
from workbench.workers import Outcome, thread_env

FAST = Timing(repeat=3, min_repeat_ms=1, timeout_s=60)


@lru_cache(maxsize=None)
def construction(e, dev=TINY_CPU, topk: int = 2):
    return construct(e, dev, options=Options(topk=topk))


def test_a_wrong_kernel_is_flagged_and_never_best(tmp_path):
    right = construction(matmul(64, 64, 64))
    # B transposed has the same shapes at 64x64x64 but computes A @ B.T: a wrong kernel for A @ B.
    wrong = construction(expr("matmul", M=64, N=64, K=64, trans_b=True))
    built = [
        build_library(wrong.expr, wrong.candidates[0].program, TINY_CPU, 1, 1e-6, str(tmp_path / "wrong.so")),
        build_library(right.expr, right.candidates[0].program, TINY_CPU, 2, 2e-6, str(tmp_path / "right.so")),
    ]
    assert all(b.ok for b in built)
    got = []
    LocalRunner(TINY_CPU).measure(right.expr, built, replace(FAST, flush_cache=True), got.append)
    bad, first, good = sorted(got, key=lambda m: (m.rank, len(m.seconds)))
    assert bad.correct is False and bad.error.startswith("wrong result: max abs error") and bad.seconds == ()
    assert first.correct is True and first.error == "" and len(first.seconds) == 3 and first.best_seconds > 0
    # reported again after the pass, with the second look's repeats (one a round): the wrong
    # kernel gets none
    assert [m.rank for m in got] == [1, 2, 2] and good.seconds[:3] == first.seconds
    assert len(good.seconds) == 3 + FAST.revisit and min(good.seconds[3:]) > 0 and good.correct is True
    assert dict(good.versions)["threads"] == thread_env(TINY_CPU)["TVM_NUM_THREADS"]
    assert best_measured(got) in (first, good)


def test_repeats_that_do_not_settle_are_timed_one_at_a_time_up_to_the_limit(tmp_path):
    """A spread no real timing meets (three repeats equal to the nanosecond) takes every repeat:
    3 at once, then single repeats with `number` sized from the fastest so far (`check_and_time`)."""
    right = construction(matmul(64, 64, 64))
    built = build_library(right.expr, right.candidates[0].program, TINY_CPU, 1, 1e-6, str(tmp_path / "k.so"))
    got = []
    LocalRunner(TINY_CPU).measure(right.expr, [built], replace(FAST, repeat=5, settle=1e-12, revisit=0), got.append)
    assert len(got) == 1 and got[0].ok and len(got[0].seconds) == 5 and min(got[0].seconds) > 0


class ScriptedWorker:
    """Stands in for the timing worker: answers each call with the next given outcome and records
    the `best` each `measure_library` call was asked to race and each second look's (rank,
    fastest)."""

    def __init__(self, answers):
        self.answers, self.raced, self.revisited = list(answers), [], []

    def call(self, fn, args, timeout_s):
        if fn is revisit_library:
            self.revisited.append((args[0].rank, args[3]))
        else:
            self.raced.append(args[4])
        return self.answers.pop(0)

    def workers(self, n, env):  # the pool's face
        return [self]


def test_each_kernel_races_the_fastest_repeat_of_the_correct_kernels_timed_before_it():
    answers = [
        Outcome(Measurement(1, "local", (3.0, 2.0, 2.5), correct=True)),
        Outcome(Measurement(2, "local", (0.5,), correct=False, error="wrong result: x")),  # never a best
        Outcome(error="timed out after 60 s"),
        Outcome(Measurement(4, "local", (2.5, 1.5, 1.6), correct=True)),
        Outcome(Measurement(5, "local", (1.9, 1.8), correct=True)),
    ]
    worker = ScriptedWorker(answers)
    built = [BuiltCandidate(r, 1e-3, ok=True) for r in range(1, 6)]
    got = []
    LocalRunner(TINY_CPU, pool=worker).measure(None, built, replace(FAST, revisit=0), got.append)
    assert worker.raced == [None, 2.0, 2.0, 2.0, 1.5] and worker.revisited == []
    assert [m.rank for m in got] == [1, 2, 3, 4, 5] and got[2].error == "run: timed out after 60 s"


def test_each_correct_kernel_is_looked_at_again_after_all_were_timed():
    """A kernel timed while the host slowed it (rank 1 here, 2x through its repeats) gets a time
    from its second look; a kernel that fails then is reported failed, its first time dropped."""
    answers = [
        Outcome(Measurement(1, "local", (4.0, 4.1, 4.05), correct=True)),
        Outcome(Measurement(2, "local", (), correct=False, error="wrong result: x")),
        Outcome(Measurement(3, "local", (2.5, 2.4), correct=True)),
        Outcome(Measurement(4, "local", (2.2, 2.3, 2.25), correct=True)),
        Outcome((2.0,)), Outcome((2.5,)), Outcome(error="worker crashed (signal 11)"),
    ]
    worker = ScriptedWorker(answers)
    built = [BuiltCandidate(r, 1e-3, ok=True) for r in range(1, 5)]
    got = []
    LocalRunner(TINY_CPU, pool=worker).measure(None, built, replace(FAST, revisit=1), got.append)
    assert worker.revisited == [(1, 4.0), (3, 2.4), (4, 2.2)]  # in the same order, the wrong one left out
    assert [m.rank for m in got] == [1, 2, 3, 4, 4, 1, 3]
    again = {m.rank: m for m in got[4:]}
    assert again[1].seconds == (4.0, 4.1, 4.05, 2.0) and again[1].best_seconds == 2.0 and again[1].ok
    assert again[3].seconds == (2.5, 2.4, 2.5) and again[3].best_seconds == 2.4
    assert not again[4].ok and again[4].error == "run (second look): worker crashed (signal 11)"


def test_the_second_look_times_the_kernels_in_turn_round_after_round():
    """Three rounds: each round one repeat of each kernel still correct, in the construction's
    order (A, B, A, B, ...), so that a spell of the host falls on every kernel alike; a kernel
    that fails in a round is not asked again, and each other is reported once, with its repeats
    of every round."""
    answers = [
        Outcome(Measurement(1, "local", (3.0, 3.1), correct=True)),
        Outcome(Measurement(2, "local", (2.0, 2.1), correct=True)),
        Outcome(Measurement(3, "local", (5.0, 5.2), correct=True)),
        Outcome((2.9,)), Outcome((2.2,)), Outcome((5.1,)),
        Outcome((3.2,)), Outcome(error="timed out after 60 s"), Outcome((4.9,)),
        Outcome((3.05,)), Outcome((5.0,)),
    ]
    worker = ScriptedWorker(answers)
    built = [BuiltCandidate(r, 1e-3, ok=True) for r in range(1, 4)]
    got = []
    LocalRunner(TINY_CPU, pool=worker).measure(None, built, replace(FAST, revisit=3), got.append)
    assert [rank for rank, _ in worker.revisited] == [1, 2, 3, 1, 2, 3, 1, 3]
    assert all(fastest == {1: 3.0, 2: 2.0, 3: 5.0}[rank] for rank, fastest in worker.revisited)
    assert [m.rank for m in got] == [1, 2, 3, 2, 1, 3]
    assert got[3].error == "run (second look): timed out after 60 s" and not got[3].ok
    assert got[4].seconds == (3.0, 3.1, 2.9, 3.2, 3.05) and got[4].best_seconds == 2.9
    assert got[5].seconds == (5.0, 5.2, 5.1, 4.9, 5.0) and got[5].best_seconds == 4.9
    assert not worker.answers  # every scripted call was made, none more


@pytest.mark.gpu
def test_a_cuda_kernel_is_timed_on_the_local_gpu():
    tvm = pytest.importorskip("tvm")
    if not tvm.cuda(0).exist:
        pytest.skip("no CUDA GPU here")
    c = construction(matmul(256, 256, 256), device("h100"), topk=2)
    result = profile_candidates(c.expr, device("h100"), c.candidates, runner="local", timing=FAST)
    assert [m.correct for m in result.measurements] == [True, True], [m.error for m in result.measurements]
    assert all(m.best_seconds > 0 for m in result.measurements)


def test_the_kernels_pool_is_sized_to_the_device_before_it_starts(monkeypatch):
    """TVM reads TVM_NUM_THREADS once, when its pool starts: `pool_threads` sets it to the device's
    cores where the caller set none, and reports the pool's actual size either way."""
    spec = device("local-cpu")
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    pool_threads(spec)
    assert os.environ["TVM_NUM_THREADS"] == thread_env(spec)["TVM_NUM_THREADS"]
    # this process's pool may have started earlier; a fresh one starts at the device's size
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    code = ("from workbench.hardware.loader import load_spec; from workbench.profile.local import pool_threads; "
            "print(pool_threads(load_spec('local-cpu')))")
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert fresh.stdout.split()[-1] == thread_env(spec)["TVM_NUM_THREADS"], fresh.stderr
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    pool_threads(spec)
    assert os.environ["TVM_NUM_THREADS"] == "1"  # the caller's choice is kept
