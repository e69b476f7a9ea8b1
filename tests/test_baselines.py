"""Baselines: parsing, numpy and MetaSchedule on small real workloads, the skips and refusals."""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import numpy as np
import pytest
from helpers import stat_cpu_ticks

from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.ops import catalog
from workbench.profile import baselines
from workbench.profile.baselines import Baseline, BaselineResult, best_seconds, parse_baselines
from workbench.profile.runner import Timing


@pytest.fixture(scope="module")
def cpu():
    return load_spec("local-cpu")


def _matmul(n=64, **flags):
    return catalog.build("matmul", {"M": n, "N": n, "K": n, **flags}, "float32")


def test_parse_baselines_reads_a_list():
    parsed = parse_baselines(" numpy, torch,onnxruntime,metaschedule:64,dlight ")
    assert [b.name for b in parsed] == ["numpy", "torch", "onnxruntime", "metaschedule:64", "dlight"]
    assert (parsed[3].kind, parsed[3].trials, parsed[0].trials) == ("metaschedule", 64, 0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("numpy,tvm", "unknown baseline 'tvm'"),
        ("metaschedule", "trial budget"),
        ("metaschedule:0", "trial budget"),
        ("metaschedule:many", "trial budget"),
        ("numpy:3", "only metaschedule takes"),
        (" , ", "empty"),
        ("numpy,numpy", "'numpy' is given twice"),
    ],
)
def test_parse_baselines_names_the_bad_entry(text, message):
    with pytest.raises(UserError, match=message):
        parse_baselines(text)


@pytest.mark.parametrize(
    "expr", [_matmul(), _matmul(trans_a=True, trans_b=True), catalog.build("gemv", {"M": 96, "K": 80})]
)
def test_numpy_times_matmul_and_gemv(cpu, expr):
    result = Baseline("numpy").measure(expr, cpu)
    assert result.error == "" and result.seconds > 0 and result.tuning_seconds is None
    assert "threads" in result.note


def test_numpy_names_the_blas_it_multiplies_with(cpu):
    """The note names the library threadpoolctl finds behind numpy (this environment's wheel
    ships OpenBLAS), as `blas_description` writes it."""
    pytest.importorskip("threadpoolctl")
    from threadpoolctl import threadpool_info

    note = Baseline("numpy").measure(_matmul(8), cpu).note
    assert note.startswith(baselines.blas_description(threadpool_info()) + " limited to")
    assert not note.startswith("BLAS limited")  # a library was found and named


def test_blas_description_prefers_numpys_own_and_names_its_kernels():
    scipy = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.21", "architecture": "Zen",
             "filepath": "/site-packages/scipy.libs/libopenblas.so"}
    ours = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.31", "architecture": "Haswell",
            "filepath": "/site-packages/numpy.libs/libscipy_openblas64_.so"}
    openmp = {"user_api": "openmp", "internal_api": "openmp", "version": None, "filepath": "/lib/libgomp.so"}
    assert baselines.blas_description([openmp, scipy, ours]) == "OpenBLAS 0.3.31 (Haswell kernels)"
    assert baselines.blas_description([scipy]) == "OpenBLAS 0.3.21 (Zen kernels)"
    mkl = {"user_api": "blas", "internal_api": "mkl", "version": "2024.1", "filepath": "/x/numpy/libmkl_rt.so"}
    assert baselines.blas_description([mkl]) == "MKL 2024.1"
    assert baselines.blas_description([openmp]) == "BLAS"


def _other_threads_ticks() -> int:
    """CPU clock ticks (user + system) this process's threads but the calling one have used."""
    own = str(threading.get_native_id())
    return sum(stat_cpu_ticks(f"/proc/self/task/{tid}/stat") for tid in os.listdir("/proc/self/task") if tid != own)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads' CPU times are read from Linux's /proc")
def test_a_baseline_returns_once_its_threads_have_stopped_spinning(cpu):
    """After its last call a multi-threaded BLAS keeps its threads spinning (OpenBLAS for 2^28
    cycles, about 0.1 s), on the cores the caller's next kernel is timed on: `measure` returns
    only after they sleep. In the 0.2 s after it, the other threads use at most a tick of CPU,
    where a spinning one uses 10 or more (a core for 0.1 s, at 100 ticks a second)."""
    Baseline("numpy").measure(_matmul(256), cpu)
    before = _other_threads_ticks()
    time.sleep(0.2)
    assert _other_threads_ticks() - before <= 1


def test_numpy_refuses_other_operators(cpu):
    relu = catalog.build("relu", {"shape": (8, 8)})
    result = Baseline("numpy").measure(relu, cpu)
    assert result.seconds is None and "matmul and gemv only" in result.error


def test_a_wrong_result_gets_no_time():
    expr = _matmul(8)
    inputs = baselines._inputs(expr)
    result = baselines._checked_time("numpy", expr, inputs, lambda: np.zeros((8, 8), "float32"), "")
    assert result.seconds is None and result.error.startswith("wrong result")


def test_torch_skips_cleanly_without_torch(cpu, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(baselines.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    assert Baseline("torch").measure(_matmul(), cpu) == BaselineResult("torch", error="torch not installed")


def test_torch_runs_a_convolution_when_installed(cpu):
    pytest.importorskip("torch")
    conv = catalog.build("conv2d", {"N": 1, "C": 8, "H": 14, "W": 14, "F": 16, "KH": 3, "KW": 3, "stride": 2, "pad": 1})
    result = Baseline("torch").measure(conv, cpu)
    assert result.error == "" and result.seconds > 0


def test_torch_runs_a_grouped_convolution_when_installed(cpu):
    """Checked against the catalog's reference: the grouped kernel layouts agree."""
    pytest.importorskip("torch")
    conv = catalog.build("group_conv2d", {"N": 1, "C": 8, "H": 10, "W": 10, "F": 12, "KH": 3, "KW": 3,
                                          "stride": 1, "pad": 1, "groups": 4})
    result = Baseline("torch").measure(conv, cpu)
    assert result.error == "" and result.seconds > 0


def test_gpu_baselines_need_a_gpu(cpu):
    assert "GPU kernels" in Baseline("dlight").measure(_matmul(), cpu).error
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    v100 = load_spec("v100")
    for name in ("dlight", "metaschedule:4"):
        assert Baseline(name).measure(_matmul(), v100) == BaselineResult(name, error="no GPU")


def test_a_baseline_is_timed_only_after_the_threads_before_it_had_time_to_sleep(monkeypatch, cpu):
    """The workbench's kernels (TVM's pool) or another baseline spin on the cores for up to
    ~150 ms after their last call: a baseline checks its result, waits SETTLE_S, then times,
    and waits SETTLE_S again before it returns, for its own threads."""
    events = []
    monkeypatch.setattr(baselines.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setattr(baselines, "best_seconds", lambda run, **kw: events.append(("timed",)) or 1e-3)
    result = Baseline("numpy").measure(_matmul(), cpu)
    settle = ("sleep", baselines.SETTLE_S)
    assert result.seconds == 1e-3 and events == [settle, ("timed",), settle]
    assert baselines.SETTLE_S >= 0.15


def test_best_seconds_repeats_until_a_repeat_is_long_enough(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(baselines.time, "perf_counter", lambda: clock[0])

    def run():  # every call takes 1 ms of the fake clock
        clock[0] += 0.001

    calls_before = clock[0]
    seconds = best_seconds(run, Timing(repeat=3, number=1, min_repeat_ms=5))
    assert seconds == pytest.approx(0.001)
    # 1 call (too short) -> 5 calls per repeat, the fewest that last 5 ms; then 2 more repeats of 5
    assert round((clock[0] - calls_before) / 0.001) == 1 + 5 + 5 + 5


def test_best_seconds_waits_for_queued_work_once_per_repeat(monkeypatch):
    """A GPU call returns before its work is done: `sync` (the stream's wait) ends every repeat,
    so the queued milliseconds are counted, and it is not called once per call."""
    clock, queued, syncs = [0.0], [0.0], [0]
    monkeypatch.setattr(baselines.time, "perf_counter", lambda: clock[0])

    def run():  # queues 1 ms of work, takes 10 us of the host's time
        clock[0] += 1e-5
        queued[0] += 0.001

    def sync():
        clock[0] += queued[0]
        queued[0] = 0.0
        syncs[0] += 1

    seconds = best_seconds(run, Timing(repeat=3, number=1, min_repeat_ms=5), sync=sync)
    assert seconds == pytest.approx(0.00101)
    assert syncs[0] == 2 * 4  # before and after each of the 4 repeats (the first one too short)


def test_runs_timed_in_turn_share_the_machine_s_slow_spell(monkeypatch):
    """The host slows 1.5x after 16 ms and stays slow: timed one after the
    other, the second run sees only the slow machine and the ratio is off by 1.5x; in turn, each
    run's best repeat comes from the same (fast) first round, so the ratio is the true 2x."""
    clock = [0.0]
    monkeypatch.setattr(baselines.time, "perf_counter", lambda: clock[0])

    def work(ms):
        def run():
            clock[0] += ms * 1e-3 * (1.5 if clock[0] >= 0.016 else 1.0)
        return run

    timing = Timing(repeat=3, number=1, min_repeat_ms=5)
    clock[0] = 0.0
    apart = best_seconds(work(1), timing), best_seconds(work(2), timing)
    assert apart[1] / apart[0] == pytest.approx(3.0)
    clock[0] = 0.0
    fast, slow = baselines.best_seconds_in_turn((work(1), work(2)), timing)
    assert (fast, slow) == (pytest.approx(0.001), pytest.approx(0.002))
    assert slow / fast == pytest.approx(2.0)


def test_each_run_in_turn_waits_for_the_one_before_it_to_settle(monkeypatch):
    """Every repeat of each run starts after `settle_s` of sleep (the other runtime's thread pool
    spinning down), and the sleep is not timed."""
    clock, events = [0.0], []
    monkeypatch.setattr(baselines.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(baselines.time, "sleep", lambda s: (events.append(("sleep", s)), clock.__setitem__(0, clock[0] + s)))

    def work(name):
        def run():
            events.append(name)
            clock[0] += 0.01
        return run

    best = baselines.best_seconds_in_turn((work("a"), work("b")), Timing(repeat=3, number=1, min_repeat_ms=5),
                                          settle_s=0.25)
    assert best == (pytest.approx(0.01), pytest.approx(0.01))
    assert events == [("sleep", 0.25), "a", ("sleep", 0.25), "b"] * 3


def test_runs_in_turn_warmed_are_timed_as_they_run_back_to_back(monkeypatch):
    """With `warm`, each repeat of each run starts with an untimed call: a run whose first call
    after the other's is slow (its data evicted, 20 ms against 2) is timed at its steady 2 ms,
    where one repeat of a single call times the slow one."""
    clock, last, calls = [0.0], [None], []
    monkeypatch.setattr(baselines.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(baselines.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    def work(name):
        def run():
            clock[0] += 0.002 if last[0] == name else 0.02
            last[0] = name
            calls.append(name)
        return run

    timing = Timing(repeat=3, number=1, min_repeat_ms=1)
    assert baselines.best_seconds_in_turn((work("a"), work("b")), timing) == (pytest.approx(0.02),) * 2
    calls.clear()
    assert baselines.best_seconds_in_turn((work("a"), work("b")), timing, warm=True) == (pytest.approx(0.002),) * 2
    assert calls == ["a", "a", "b", "b"] * 3


def test_torch_on_a_gpu_device_needs_an_nvidia_gpu_torch_can_see():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = Baseline("torch").measure(_matmul(), load_spec("v100"))
    assert result == BaselineResult("torch", error=f"no GPU (torch {torch.__version__} sees no CUDA device)")
    amd = Baseline("torch").measure(_matmul(), load_spec("mi50"))
    assert amd.error == "the torch baseline runs on the CPU or an NVIDIA GPU, not on mi50 (amd gpu)"


def test_torch_on_a_gpu_checks_in_float32_without_tf32_and_restores_the_flags():
    """The CUDA path's steps on a stand-in for torch's CUDA build (tensors stay on the CPU): the
    result is checked, TF32 is off and cudnn.benchmark on while it runs, the flags come back
    afterwards, and the timing waits for the stream."""
    import types

    torch = pytest.importorskip("torch")
    seen, syncs = [], [0]

    class Tensor:  # torch.from_numpy(a).to("cuda") keeps the real CPU tensor
        def __init__(self, t):
            self.t = t

        def to(self, where):
            assert where == "cuda"
            return self.t

    def synchronize():
        syncs[0] += 1
        seen.append((shim.backends.cuda.matmul.allow_tf32, shim.backends.cudnn.allow_tf32, shim.backends.cudnn.benchmark))

    shim = types.SimpleNamespace(
        __version__="shim", inference_mode=torch.inference_mode, from_numpy=lambda a: Tensor(torch.from_numpy(a)),
        cuda=types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda: "Stand-in", synchronize=synchronize),
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
                                       cudnn=types.SimpleNamespace(allow_tf32=True, benchmark=False, version=lambda: 91)))
    conv = catalog.build("conv2d", {"N": 1, "C": 8, "H": 14, "W": 14, "F": 16, "KH": 3, "KW": 3, "stride": 2, "pad": 1})
    result = baselines._torch_cuda(Baseline("torch"), conv, shim)
    assert result.error == "" and result.seconds > 0
    assert result.note == "torch shim on Stand-in (cuBLAS, cuDNN 91; TF32 off, cudnn.benchmark on)"
    assert syncs[0] >= 2 and set(seen) == {(False, False, True)}
    assert (shim.backends.cuda.matmul.allow_tf32, shim.backends.cudnn.allow_tf32, shim.backends.cudnn.benchmark) == \
        (True, True, False)


@pytest.mark.slow
def test_metaschedule_tunes_checks_and_times_a_small_matmul(cpu):
    # About 15 s on 2 cores: 10 s of it is the worker importing TVM's tensor intrinsics.
    result = Baseline("metaschedule:4").measure(_matmul(), cpu)
    assert result.error == "", result.error
    assert result.seconds > 0 and result.tuning_seconds > 0
    assert "cost model" in result.note


_ONNX_CASES = [
    # odd sizes, channels not multiples of 8, stride 2 with padding: the random-conv kind of shape
    catalog.build("conv2d", {"N": 2, "C": 5, "H": 11, "W": 9, "F": 7, "KH": 3, "KW": 3, "stride": 2, "pad": 1}),
    catalog.build("conv2d", {"N": 1, "C": 3, "H": 13, "W": 13, "F": 6, "KH": 7, "KW": 7, "stride": 1, "pad": 2,
                             "dilation": 1}),
    catalog.build("depthwise_conv2d", {"N": 1, "C": 6, "H": 9, "W": 9, "KH": 3, "KW": 3, "stride": 1, "pad": 1,
                                       "multiplier": 2}),
    catalog.build("group_conv2d", {"N": 1, "C": 6, "H": 9, "W": 7, "F": 4, "KH": 5, "KW": 5, "stride": 1, "pad": 2,
                                   "groups": 2}),
    _matmul(13, trans_a=True, trans_b=True),
    catalog.build("matmul", {"M": 7, "N": 5, "K": 9, "B": 3}),
    catalog.build("gemv", {"M": 17, "K": 11}),
]


@pytest.mark.parametrize("expr", _ONNX_CASES, ids=lambda e: e.op)
def test_onnxruntime_single_operator_matches_the_numpy_reference(expr):
    pytest.importorskip("onnxruntime")
    from workbench.ops.reference import random_inputs
    from workbench.profile.runner import quiet_reference

    inputs = random_inputs(expr, 3)
    (out,) = baselines.onnxruntime_session(expr, threads=1).run(None, {f"x{i}": a for i, a in enumerate(inputs)})
    ref = quiet_reference(expr, inputs).value
    assert out.size == ref.size
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


def test_onnxruntime_times_a_small_convolution(cpu):
    pytest.importorskip("onnxruntime")
    result = Baseline("onnxruntime").measure(_ONNX_CASES[0], cpu)
    assert result.error == "" and result.seconds > 0
    assert "one Conv node" in result.note and f"{baselines.cores(cpu)} intra-op threads" in result.note


def test_onnxruntime_refuses_what_one_node_cannot_say(cpu):
    relu = catalog.build("relu", {"shape": (8, 8)})
    assert "no one-node ONNX formulation of relu" in Baseline("onnxruntime").measure(relu, cpu).error
    batched = catalog.build("matmul", {"M": 4, "N": 4, "K": 4, "B": 2, "trans_a": True})
    assert "batched transposed matmul" in Baseline("onnxruntime").measure(batched, cpu).error
    assert "runs on the CPU" in Baseline("onnxruntime").measure(_ONNX_CASES[0], load_spec("v100")).error
