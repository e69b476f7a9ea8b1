"""Baselines for `workbench bench kernels`: the same workload run by a library or another
compiler, measured in the same run as the workbench's kernels so the comparison is a ratio.

- `numpy` (matmul, gemv): `A @ B` through numpy's BLAS. Its threads are set to the device's cores
  with `threadpoolctl` when that is installed; without it BLAS keeps the thread count it chose
  when numpy was imported (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, read only at that moment, are
  the way to change it), and the result's note says so. The note names the BLAS too: library,
  version and the kernels it chose for this CPU (`blas_description`).
- `torch` (matmul, gemv, conv2d, depthwise_conv2d, pooling, relu/add/gelu, reductions): PyTorch on
  the CPU with `torch.set_num_threads(cores)`; "torch not installed" when it cannot be imported.
  On an NVIDIA GPU device it runs on the GPU through PyTorch's CUDA build, i.e. cuBLAS and cuDNN
  (the vendor libraries Roller compares with, its section 5), in float32 as float32: TF32 off for
  both (cuDNN allows it by default, which would compare a 10-bit-mantissa product with ours), and
  `cudnn.benchmark` on so cuDNN times its algorithms and keeps its fastest. A repeat's calls are
  queued back to back and the GPU synchronised once at its end, so the host's wait is not counted
  per call. "no GPU" when torch cannot see one (a CPU-only build, or no device here).
- `onnxruntime` (matmul, gemv, conv2d, depthwise_conv2d, group_conv2d): ONNX Runtime's
  single-operator time: a one-node ONNX model of the same operator (built in memory with the
  `onnx` helper API: MatMul, Gemm for a transposed 2-D matmul, Conv with its group count) in an
  InferenceSession on the CPU execution provider, intra-op threads = the device's cores (as
  `model --run` sets them), graph optimisations at ORT's default; each timed call is one
  `session.run`, its call overhead included as a user's would be. "onnxruntime not installed"
  when `onnx` or `onnxruntime` cannot be imported.
- `metaschedule:N`: TVM MetaSchedule tuning `expr.func` with N trials for the device's target,
  then the best schedule compiled, checked and timed like a workbench kernel. It runs in a spawned
  worker whose TVM thread pool has the device's cores (as the local runner's), builds and times
  the candidates inside that worker (the stock builder and runner need `cloudpickle` and `psutil`,
  which the project does not install), and uses the `xgb` cost model when `xgboost` is
  installed, else `random` (the note says which). A worker's first tuning spends about 10 s
  importing TVM's tensor intrinsics; the worker is kept for the next workload.
- `dlight`: TVM's rule-based default GPU schedules (no tuning); GPU devices only.

Every baseline's output is checked against the numpy reference first (`verify.compare`); a wrong
one gets no time. A time is the best of `TIMING.repeat` repeats after a warm-up, each repeat
running the kernel often enough to last `TIMING.min_repeat_ms` (the local runner's defaults).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial

from workbench.codegen import targets
from workbench.errors import UserError, first_line
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.profile.runner import Timing, quiet_reference
from workbench.repetitions import sized_count

BASELINES = ("numpy", "torch", "onnxruntime", "metaschedule", "dlight")
# Every repeat, none stopped early (`Timing.settle`): a baseline's best of fewer repeats could
# only be slower, flattering the workbench's ratios to it.
TIMING = Timing(settle=0)
# After their last task, TVM's pool keeps a core busy for about 150 ms (its workers yield in a loop
# before they sleep) and ONNX Runtime's for about 40 ms, which took the core from the other
# runtime's next repeat when the two were timed in turn (evidence: docs/evidence.md#timing-in-turn);
# a baseline waits as long before its repeats (#baseline-settle).
SETTLE_S = 0.25
# MetaSchedule's measurements of its candidates only rank them: shorter than TIMING.
TUNE_NUMBER, TUNE_MIN_REPEAT_MS = 3, 20
# Worker time limit: startup and the tensor-intrinsic import, then about 1-2 s per trial (2 cores).
TUNE_TIMEOUT_BASE_S, TUNE_TIMEOUT_PER_TRIAL_S = 120.0, 5.0
BUILD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class BaselineResult:
    """One baseline's measurement of one workload; `seconds` is None when there is none (`error`
    says why). `note` records how it was measured (threads, cost model)."""

    name: str
    seconds: float | None = None
    tuning_seconds: float | None = None
    error: str = ""
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Baseline:
    """A baseline by name: `numpy`, `torch`, `onnxruntime`, `metaschedule:N` (N trials) or `dlight`."""

    name: str

    def __post_init__(self):
        kind, sep, trials = self.name.partition(":")
        if kind not in BASELINES:
            raise UserError(f"unknown baseline {self.name!r}: choose from numpy, torch, onnxruntime, metaschedule:N, dlight")
        if kind == "metaschedule" and not (trials.isdigit() and int(trials) > 0):
            raise UserError(f"baseline {self.name!r}: give MetaSchedule's trial budget, e.g. metaschedule:64")
        if kind != "metaschedule" and sep:
            raise UserError(f"baseline {self.name!r}: only metaschedule takes a ':N' budget")

    @property
    def kind(self) -> str:
        return self.name.partition(":")[0]

    @property
    def trials(self) -> int:
        return int(self.name.partition(":")[2] or 0)

    def measure(self, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
        """Run and time `expr` on this machine for `device`; failures come back as `error`.
        Returns SETTLE_S after the baseline's last call, once the threads it woke (its BLAS's,
        ONNX Runtime's, a tuning worker's TVM pool) have stopped spinning: a kernel its caller
        times next would share the cores with them (evidence: docs/evidence.md#baseline-spin)."""
        try:
            return _MEASURE[self.kind](self, expr, device)
        except Exception as err:  # a library failing on one workload is that baseline's result
            return BaselineResult(self.name, error=f"{type(err).__name__}: {first_line(err)}")
        finally:
            time.sleep(SETTLE_S)


def parse_baselines(text: str) -> tuple[Baseline, ...]:
    """`"numpy,torch,metaschedule:64"` -> Baselines (UserError naming a bad or repeated entry)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UserError("--baselines is empty: give e.g. numpy,torch,metaschedule:64")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"baseline {repeated[0]!r} is given twice")
    return tuple(Baseline(name) for name in names)


def cores(device: DeviceSpec) -> int:
    """Threads a baseline may use: the device's cores, capped by this machine's CPUs."""
    return max(1, min(device.compute_units, os.cpu_count() or 1))


def best_seconds(run: Callable[[], object], timing: Timing = TIMING, sync: Callable[[], object] = lambda: None) -> float:
    """Best mean seconds per call over `timing.repeat` repeats, each at least `min_repeat_ms`
    long (as TVM's `time_evaluator` does it); the caller has warmed `run` up. `sync` waits for
    the work `run` queued (a GPU stream), once before and once at the end of each repeat."""
    return best_seconds_in_turn((run,), timing, sync)[0]


def best_seconds_in_turn(runs: Sequence[Callable[[], object]], timing: Timing = TIMING,
                         sync: Callable[[], object] = lambda: None, settle_s: float = 0.0,
                         warm: bool = False) -> tuple[float, ...]:
    """`best_seconds` of each of `runs`, their repeats taken in turn (a repeat of each, then the
    next round). A shared host slows for seconds to minutes at a time (a 512-cube matmul 1.32 ms,
    then 1.8-1.9 ms for the next 13 s, no steal time counted: evidence:
    docs/evidence.md#timing-in-turn): timed one after the other, two runs can fall either side of
    such a change and their ratio moves by 40 %; in turn, both see it. `settle_s`: a pause before
    each run's repeats, so that the threads of the run before it have stopped spinning (a thread
    pool's workers keep a core busy for a while after their last task). `warm`: an untimed call
    of each run before each of its repeats, which brings back into the caches what the run
    before it evicted: two whole models timed in turn over one L3 (ours and ONNX Runtime's,
    ResNet-50's weights about 100 MB each) each found their weights gone at the first call of a
    repeat, and a 25 ms repeat of a 23 ms model is that call (ResNet-50 on two Xeon cores: ours
    23.6 ms alone, 27.5 in turn, 23.8 in turn in 100 ms repeats; ONNX Runtime 19.6, 21.3, 20.3:
    docs/evidence.md#models-in-turn)."""
    numbers, best = [], []
    for run in runs:  # the first repeat finds each run's number of calls (`repetitions.sized_count`)
        time.sleep(settle_s)
        if warm:
            _time_calls(run, 1, sync)
        number, elapsed = sized_count(partial(_time_calls, run, sync=sync), timing.min_repeat_ms / 1000,
                                      start=timing.number)
        numbers.append(number)
        best.append(elapsed / number)
    for _ in range(timing.repeat - 1):
        for i, (run, number) in enumerate(zip(runs, numbers)):
            time.sleep(settle_s)
            if warm:
                _time_calls(run, 1, sync)
            best[i] = min(best[i], _time_calls(run, number, sync) / number)
    return tuple(best)


def _time_calls(run: Callable[[], object], number: int, sync: Callable[[], object]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(number):
        run()
    sync()
    return time.perf_counter() - start


# ---- numpy and torch: in this process --------------------------------------------------------


def _numpy(baseline: Baseline, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
    if not device.runs_on_cpu:
        return BaselineResult(baseline.name, error=f"numpy runs on the CPU, the device is a {device.kind}")
    if expr.op not in ("matmul", "gemv"):
        return BaselineResult(baseline.name, error=f"numpy covers matmul and gemv only, not {expr.op}")
    import numpy as np

    inputs = _inputs(expr)
    p, (a, b) = _params(expr), inputs
    a = np.swapaxes(a, -1, -2) if p.get("trans_a") else a
    b = np.swapaxes(b, -1, -2) if p.get("trans_b") else b
    with _blas_threads(cores(device)) as note:
        return _checked_time(baseline.name, expr, inputs, partial(np.matmul, a, b), note)


@contextmanager
def _blas_threads(threads: int):
    if importlib.util.find_spec("threadpoolctl") is None:
        yield "threadpoolctl not installed: BLAS kept the threads it chose when numpy was imported"
        return
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield f"{blas_description(threadpool_info())} limited to {threads} threads by threadpoolctl"


# threadpoolctl's `internal_api` names as their libraries call themselves
_BLAS_NAMES = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS", "flexiblas": "FlexiBLAS"}


def blas_description(infos: list[dict]) -> str:
    """The BLAS numpy multiplies with, from threadpoolctl's `threadpool_info()`: library, version
    and the kernels it chose for this CPU ("OpenBLAS 0.3.31 (Haswell kernels)"), the one numpy
    ships where several are loaded. The kernels are what a run's figures are against: OpenBLAS
    picks them by the CPU's flags at load time, and OPENBLAS_CORETYPE (read then) overrides it,
    as AVX2 code on an AVX-512 CPU is compared with AVX2 kernels (docs/benchmarks.md)."""
    blas = [i for i in infos if i.get("user_api") == "blas"]
    own = [i for i in blas if "numpy" in str(i.get("filepath", ""))] or blas
    if not own:
        return "BLAS"
    info = own[0]
    name = _BLAS_NAMES.get(str(info.get("internal_api")), str(info.get("internal_api") or "BLAS"))
    version = f" {info['version']}" if info.get("version") else ""
    kernels = f" ({info['architecture']} kernels)" if info.get("architecture") else ""
    return f"{name}{version}{kernels}"


def _torch(baseline: Baseline, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
    if not device.runs_on_cpu and not _nvidia(device):
        return BaselineResult(baseline.name, error=f"the torch baseline runs on the CPU or an NVIDIA GPU, not on "
                                                   f"{device.name} ({device.vendor or 'no vendor'} {device.kind})")
    if importlib.util.find_spec("torch") is None:
        return BaselineResult(baseline.name, error="torch not installed")
    if expr.op not in _TORCH_OPS:
        return BaselineResult(baseline.name, error=f"no torch formulation of {expr.op}")
    import torch

    if not device.runs_on_cpu:
        return _torch_cuda(baseline, expr, torch)
    inputs = _inputs(expr)
    run = partial(_TORCH_OPS[expr.op], _params(expr), *(torch.from_numpy(a) for a in inputs))
    threads, previous = cores(device), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return _checked_time(baseline.name, expr, inputs, run, f"torch {torch.__version__} on {threads} threads")
    finally:
        torch.set_num_threads(previous)


def _nvidia(device: DeviceSpec) -> bool:
    return device.launches_thread_blocks and _target(device)["kind"] == "cuda"


def _torch_cuda(baseline: Baseline, expr: TensorExpr, torch) -> BaselineResult:
    """cuBLAS / cuDNN through PyTorch on this machine's GPU, float32 kept float32 (module docstring)."""
    if not torch.cuda.is_available():
        return BaselineResult(baseline.name, error=f"no GPU (torch {torch.__version__} sees no CUDA device)")
    inputs = _inputs(expr)
    run = partial(_TORCH_OPS[expr.op], _params(expr), *(torch.from_numpy(a).to("cuda") for a in inputs))
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    note = (f"torch {torch.__version__} on {torch.cuda.get_device_name()} (cuBLAS, cuDNN "
            f"{torch.backends.cudnn.version()}; TF32 off, cudnn.benchmark on)")
    try:
        with torch.inference_mode():
            return _checked_time(baseline.name, expr, inputs, lambda: run(), note,
                                 to_host=lambda out: out.cpu().numpy(), sync=torch.cuda.synchronize)
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved


def _torch_matmul(p, a, b):
    a = a.transpose(-1, -2) if p["trans_a"] else a
    return a @ (b.transpose(-1, -2) if p["trans_b"] else b)


def _torch_conv(p, data, kernel, groups=1):
    import torch.nn.functional as F

    return F.conv2d(data, kernel, stride=p["stride"], padding=p["pad"], dilation=p.get("dilation", 1), groups=groups)


def _torch_pool(p, data, kind):
    import torch.nn.functional as F

    if kind == "maxpool":
        return F.max_pool2d(data, p["K"], p["stride"], p["pad"])
    # count_include_pad: the catalog divides every window by K*K, padding included.
    return F.avg_pool2d(data, p["K"], p["stride"], p["pad"], count_include_pad=True)


def _torch_gelu(p, x):
    import torch.nn.functional as F

    return F.gelu(x, approximate="tanh")  # the catalog's gelu is the tanh form


_TORCH_OPS: dict[str, Callable] = {
    "matmul": _torch_matmul,
    "gemv": lambda p, a, x: a @ x,
    "conv2d": _torch_conv,
    # The catalog's [N,C,multiplier,OH,OW] output has the layout of torch's [N,C*multiplier,OH,OW].
    "depthwise_conv2d": lambda p, data, kernel: _torch_conv(p, data, kernel, groups=p["C"]),
    # the catalog's grouped kernel [F, C/groups, KH, KW] is torch's grouped weight layout
    "group_conv2d": lambda p, data, kernel: _torch_conv(p, data, kernel, groups=p["groups"]),
    "avgpool": lambda p, data: _torch_pool(p, data, "avgpool"),
    "maxpool": lambda p, data: _torch_pool(p, data, "maxpool"),
    "relu": lambda p, x: x.relu(),
    "add": lambda p, a, b: a + b,
    "gelu": _torch_gelu,
    "reduce_sum": lambda p, x: x.sum(dim=tuple(p["axes"])),
    "reduce_mean": lambda p, x: x.mean(dim=tuple(p["axes"])),
}


# ---- onnxruntime: a one-node ONNX model in this process ------------------------------------

ONNX_OPSET = 17  # Conv, MatMul and Gemm (C optional) as used here are unchanged since opset 13
ONNX_IR_VERSION = 8  # the IR version of opset 17, which every onnxruntime since 1.13 reads


def _onnxruntime(baseline: Baseline, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
    if not device.runs_on_cpu:
        return BaselineResult(baseline.name, error=f"the onnxruntime baseline runs on the CPU, the device is a {device.kind}")
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return BaselineResult(baseline.name, error="onnxruntime not installed")
    if expr.op not in _ONNX_OPS:
        return BaselineResult(baseline.name, error=f"no one-node ONNX formulation of {expr.op}")
    import onnxruntime

    threads = cores(device)
    session = onnxruntime_session(expr, threads)
    inputs = _inputs(expr)
    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    run = partial(session.run, None, feeds)
    node_type = _ONNX_OPS[expr.op](_params(expr))[0]
    note = f"onnxruntime {onnxruntime.__version__}: one {node_type} node, {threads} intra-op threads"
    return _checked_time(baseline.name, expr, inputs, run, note, to_host=lambda outs: outs[0])


def onnxruntime_session(expr: TensorExpr, threads: int):
    """An ONNX Runtime session (CPU provider, `threads` intra-op threads, one inter-op) of a
    one-node model computing `expr` from inputs x0, x1 (the catalog's input order) to y.
    Raises KeyError for an operator without a one-node formulation, ValueError for a batched
    transposed matmul (ONNX's MatMul has no transpose flags and Gemm is 2-D only)."""
    import numpy as np
    import onnxruntime
    from onnx import helper

    from workbench.ops.reference import input_shapes

    node_type, attributes = _ONNX_OPS[expr.op](_params(expr))
    shapes = input_shapes(expr)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(expr.dtype))
    graph = helper.make_graph(
        [helper.make_node(node_type, [f"x{i}" for i in range(len(shapes))], ["y"], **attributes)],
        expr.op,
        [helper.make_tensor_value_info(f"x{i}", elem, list(s)) for i, s in enumerate(shapes)],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _onnx_matmul(p: dict) -> tuple[str, dict]:
    if not (p["trans_a"] or p["trans_b"]):
        return "MatMul", {}
    if p["B"]:
        raise ValueError("no single ONNX node for a batched transposed matmul")
    return "Gemm", {"transA": int(p["trans_a"]), "transB": int(p["trans_b"])}


def _onnx_conv(p: dict, groups: int = 1) -> tuple[str, dict]:
    return "Conv", {"kernel_shape": [p["KH"], p["KW"]], "strides": [p["stride"]] * 2, "pads": [p["pad"]] * 4,
                    "dilations": [p.get("dilation", 1)] * 2, "group": groups}


_ONNX_OPS: dict[str, Callable[[dict], tuple[str, dict]]] = {
    "matmul": _onnx_matmul,
    "gemv": lambda p: ("MatMul", {}),
    "conv2d": _onnx_conv,
    # the catalog's depthwise kernel is [C*multiplier, 1, KH, KW]: ONNX's with group = C, and its
    # [N, C*multiplier, OH, OW] output the layout of the catalog's [N, C, multiplier, OH, OW]
    "depthwise_conv2d": lambda p: _onnx_conv(p, p["C"]),
    "group_conv2d": lambda p: _onnx_conv(p, p["groups"]),
}


def _params(expr: TensorExpr) -> dict:
    from workbench.ops.catalog import normalize_params

    return normalize_params(expr.op, dict(expr.params))


def _inputs(expr: TensorExpr):
    from workbench.ops.reference import random_inputs

    return random_inputs(expr, TIMING.seed)


def _checked_time(name: str, expr: TensorExpr, inputs, run: Callable, note: str, to_host: Callable = lambda out: out,
                  sync: Callable[[], object] = lambda: None) -> BaselineResult:
    """Check `run()` (on `inputs`; `to_host` brings its result to a numpy array) against the
    reference, then time it (the check is the warm-up; `sync` as `best_seconds` takes it) once
    the threads of whatever ran before it (the workbench's kernels, another baseline) sleep."""
    import numpy as np

    from workbench.codegen.verify import compare

    ref = quiet_reference(expr, inputs)
    check = compare(np.asarray(to_host(run())).reshape(ref.value.shape), ref, expr.dtype)
    if not check.correct:
        return BaselineResult(name, error=f"wrong result: {check.error}", note=note)
    time.sleep(SETTLE_S)
    return BaselineResult(name, seconds=best_seconds(run, sync=sync), note=note)


# ---- metaschedule and dlight: TVM, in a worker whose thread pool has the device's cores ------


def _metaschedule(baseline: Baseline, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
    if _gpu_missing(device):
        return BaselineResult(baseline.name, error="no GPU")
    timeout = TUNE_TIMEOUT_BASE_S + TUNE_TIMEOUT_PER_TRIAL_S * baseline.trials
    args = (baseline.name, expr, _target(device), baseline.trials, cores(device))
    return _in_worker(baseline.name, device, tune_and_time, args, timeout)


def _dlight(baseline: Baseline, expr: TensorExpr, device: DeviceSpec) -> BaselineResult:
    if not device.launches_thread_blocks:
        return BaselineResult(baseline.name, error=f"dlight schedules GPU kernels, the device is a {device.kind}")
    if _gpu_missing(device):
        return BaselineResult(baseline.name, error="no GPU")
    args = (baseline.name, expr, _target(device))
    return _in_worker(baseline.name, device, dlight_and_time, args, BUILD_TIMEOUT_S)


def _gpu_missing(device: DeviceSpec) -> bool:
    return device.launches_thread_blocks and not targets.runtime_device(_target(device)["kind"]).exist


def _target(device: DeviceSpec) -> dict:
    from workbench.codegen.build import target_dict

    return target_dict(device)


_WORKERS: dict = {}


def _in_worker(name: str, device: DeviceSpec, fn: Callable, args: tuple, timeout_s: float) -> BaselineResult:
    """`fn(*args)` in a worker kept for later calls with the same thread count."""
    from workbench.workers import Worker, thread_env

    env = thread_env(device)
    key = tuple(sorted(env.items()))
    if key not in _WORKERS:
        _WORKERS[key] = Worker(env)
    outcome = _WORKERS[key].call(fn, args, timeout_s)
    return BaselineResult(name, error=outcome.error) if outcome.error else outcome.value


@atexit.register
def _close_workers() -> None:
    for worker in _WORKERS.values():
        worker.close()
    _WORKERS.clear()


def tune_and_time(name: str, expr: TensorExpr, target: dict, trials: int, threads: int) -> BaselineResult:
    """(In the worker.) Tune `expr.func` with MetaSchedule for `trials` trials, then check and time
    the best schedule found."""
    import logging

    import tvm
    from tvm.s_tir import meta_schedule as ms

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.ERROR)  # its INFO goes to stdout
    cost_model = "xgb" if importlib.util.find_spec("xgboost") else "random"
    tvm_target, mod = tvm.target.Target(target), tvm.IRModule({"main": expr.func})
    builder, runner = _in_process_builder_and_runner()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work_dir:
        database = ms.tune_tir(
            mod=mod,
            target=tvm_target,
            work_dir=work_dir,
            max_trials_global=trials,
            num_trials_per_iter=min(trials, 64),
            builder=builder,
            runner=runner,
            cost_model=cost_model,
            # the default callbacks also delete build directories, which the in-process builder has none of
            measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.UpdateCostModel()],
            num_tuning_cores=threads,  # an int: "physical" would need psutil
        )
        sch = ms.tir_integration.compile_tir(database, mod, tvm_target)
    tuning = time.perf_counter() - start
    note = f"cost model {cost_model}" + ("" if cost_model == "xgb" else " (xgboost not installed)")
    if sch is None:
        return BaselineResult(name, tuning_seconds=tuning, error=f"no valid schedule in {trials} trials", note=note)
    return _check_and_time_module(name, expr, target, tvm.compile(sch.mod, target=tvm_target), tuning, note)


def dlight_and_time(name: str, expr: TensorExpr, target: dict) -> BaselineResult:
    """(In the worker.) Schedule `expr.func` with dlight's default GPU rules, then check and time it."""
    import tvm
    from tvm.s_tir import dlight as dl

    tvm_target = tvm.target.Target(target)
    rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    with tvm_target:
        mod = dl.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": expr.func}))
    return _check_and_time_module(name, expr, target, tvm.compile(mod, target=tvm_target), None, "dlight default rules")


def _check_and_time_module(name, expr, target, executable, tuning, note) -> BaselineResult:
    """The same check and timing as the local runner's for a workbench kernel."""
    from workbench.profile.runner import BuiltCandidate, check_and_time

    built = BuiltCandidate(rank=0, predicted_seconds=0.0, ok=True, target=json.dumps(target), args=expr.args)
    dev = targets.runtime_device(target["kind"])
    check, seconds = check_and_time(executable.jit(), built, dev, expr, TIMING)
    if not check.correct:
        return BaselineResult(name, tuning_seconds=tuning, error=f"wrong result: {check.error}", note=note)
    return BaselineResult(name, seconds=min(seconds), tuning_seconds=tuning, note=note)


def _in_process_builder_and_runner():
    """A MetaSchedule builder that compiles in this process and a runner that times the result
    here, handing the executable over in memory (the artifact path is only its key)."""
    import numpy as np
    import tvm
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.runner import PyRunner
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture

    built: dict[str, object] = {}

    @derived_object
    class InProcessBuilder(PyBuilder):
        def build(self, build_inputs):
            results = []
            for item in build_inputs:
                try:
                    executable = tvm.compile(item.mod, target=item.target)
                except Exception as err:  # a candidate that does not compile is a failed trial
                    results.append(BuilderResult(None, first_line(err)))
                    continue
                key = f"in-process:{len(built)}"
                built[key] = executable
                results.append(BuilderResult(key, None))
            return results

    @derived_object
    class InProcessRunner(PyRunner):
        def run(self, runner_inputs):
            futures = []
            rng = np.random.default_rng(TIMING.seed)
            for item in runner_inputs:
                try:
                    module = built.pop(str(item.artifact_path)).jit()
                    dev = tvm.device(str(item.device_type), 0)
                    shapes = [([int(d) for d in arg.shape], str(arg.dtype)) for arg in item.args_info]
                    args = [tvm.runtime.tensor(rng.uniform(-1, 1, s).astype(t), dev) for s, t in shapes]
                    evaluator = module.time_evaluator(
                        "main", dev, number=TUNE_NUMBER, repeat=1, min_repeat_ms=TUNE_MIN_REPEAT_MS
                    )
                    futures.append(LocalRunnerFuture(res=[float(s) for s in evaluator(*args).results]))
                except Exception as err:  # a candidate that crashes or fails is a failed trial
                    futures.append(LocalRunnerFuture(error_message=first_line(err)))
            return futures

    return InProcessBuilder(), InProcessRunner()


_MEASURE = {"numpy": _numpy, "torch": _torch, "onnxruntime": _onnxruntime, "metaschedule": _metaschedule,
            "dlight": _dlight}
