#!/usr/bin/env python3
"""Run a GPU pack on the machine that has the GPU: verify and time every candidate kernel
against torch, measure the machine, write one result JSON (docs: docs/gpu.md, issue 41).

Copied verbatim into each pack as `run.py` and run there:

    python3 run.py PACKDIR --out RESULT.json [--repeats N] [--warmup N] [--only KEY-substring]
                   [--budget-seconds S]
    python3 run.py --selftest          # NVRTC-compiles, launches and checks a trivial kernel

It imports only the standard library, numpy, torch and cupy (the GPU machine has no TVM and no
workbench), and those three lazily, so `--help` and the pure parts (manifest checks, shapes,
the error measure, the result and its summary) work anywhere.

Contract:
- Every candidate gets a result: `ok` is true only when its cubin (or PTX) loaded, its launches
  ran, its output matched torch's float64 reference within `TOLERANCE` with every element
  written, and it was timed; otherwise `error` says in one line why. No candidate stops the run.
- The GPU work runs in a worker process (this file, `--worker`), which reports each result as
  one JSON line as soon as it has it. A launch that leaves a sticky CUDA error (an illegal
  address poisons the context) or hangs costs only that candidate: the parent records it from
  the worker's last report and starts a new worker for the rest.
- `--budget-seconds` bounds the whole run: candidates not started by then get "out of time
  budget". The result JSON is rewritten after every result, so a run stopped from outside
  leaves what it had.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

FORMAT = 1
# Relative L2 error ||out - ref|| / ||ref|| a correct kernel stays under, by input dtype.
# float32: a sum of K products rounds K times with unit roundoff u = 2^-24 ~ 6e-8; with
# random-sign terms the errors add like a random walk, ~sqrt(K) u, about 4e-6 for K = 4608
# (conv 3x3 over 512 channels) and still ~1e-5 for K = 32768; 1e-4 leaves a factor of 10 over
# that, while one lost or doubled term of K moves the result by ~1/sqrt(K) (1.5e-2 at K = 4608).
# float16: the output alone rounds with u = 2^-11 ~ 4.9e-4 (fp32 accumulation adds little);
# 1e-2 is 20 u, and an fp16-accumulating kernel over a long K may exceed it (it is then
# reported, with its error, as not verified).
TOLERANCE = {"float32": 1e-4, "float16": 1e-2}
DEFAULT_REPEATS, DEFAULT_WARMUP, DEFAULT_BUDGET_S = 20, 3, 300.0
MIN_REPEATS = 3
# Time one kernel's (or torch's) timing may take: repeats are cut to fit it (slow kernels).
# GPU cycles a spin kernel holds the stream before each timed repeat: 200k cycles are 0.1 ms at
# the H200's 1980 MHz, past any one host dispatch (torch's Python and dispatcher: tens of us).
HOST_LEAD_CYCLES = 200_000
TIMING_BUDGET_S = 1.0
# A kernel slower than TIMING_BUDGET_S / (warm-up + MIN_REPEATS) gets what fits in this instead.
SLOW_BUDGET_S = 10.0
# Per repeat besides the kernel: the L2 flush (2 x 60 MB written at ~4 TB/s, ~30 us) and the
# launches; used only to size the repeats.
REPEAT_OVERHEAD_S = 1e-4
# Watchdog of the worker's items: a workload's setup (inputs, float64 reference) and torch's
# measurement (with cuDNN's algorithm search) each, one candidate (load, check, timing), the
# micro-benchmarks, a worker's start (importing torch and cupy, the CUDA context). An item that
# runs longer is taken as hung and its worker killed.
SETUP_TIMEOUT_S, CANDIDATE_TIMEOUT_S, MICROBENCH_TIMEOUT_S, STARTUP_TIMEOUT_S = 180.0, 60.0, 60.0, 120.0
# A worker that reported a sticky error and has not exited after this long is killed.
STICKY_GRACE_S = 10.0
# Workers that end without a new result, this many in a row, stop the run.
MAX_IDLE_WORKERS = 2
# Ratio of our best time to torch's under which a workload counts as "within 10% of torch".
WITHIN = 1.10
OPS = ("matmul", "gemv", "conv2d", "group_conv2d", "depthwise_conv2d", "avgpool", "maxpool", "relu", "add",
       "gelu", "reduce_sum", "reduce_mean")
DTYPES = ("float32", "float16", "float64", "int32", "int64")
KEY_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
# The worker's items besides candidates, in its "start" reports (a candidate key has no "/").
TORCH, MICROBENCH = "/torch", "/microbench"


# ---- the manifest -----------------------------------------------------------------------------


class ManifestError(ValueError):
    """A manifest (or a part of it) that the runner cannot run; the message says what."""


def load_manifest(packdir: str) -> dict:
    """`packdir/manifest.json`, checked by `check_manifest`; ManifestError when unusable."""
    path = os.path.join(packdir, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read {path}: {e}") from None
    check_manifest(manifest)
    return manifest


def check_manifest(manifest) -> None:
    """The pack-level fields the runner relies on: format 1, a list of workloads with unique ids
    and unique candidate keys. A workload's or candidate's own problems are theirs
    (`workload_problem`, `candidate_problem`): they fail alone."""
    if not isinstance(manifest, dict):
        raise ManifestError("manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ManifestError(f"manifest format {manifest.get('format')!r}, this runner reads format {FORMAT}")
    workloads = manifest.get("workloads")
    if not isinstance(workloads, list):
        raise ManifestError("manifest has no list of workloads")
    ids, keys = set(), set()
    for w in workloads:
        if not isinstance(w, dict) or not isinstance(w.get("id"), str):
            raise ManifestError("a workload without an id")
        if w["id"] in ids:
            raise ManifestError(f"workload id {w['id']!r} appears twice")
        ids.add(w["id"])
        for c in w.get("candidates") or ():
            key = c.get("key") if isinstance(c, dict) else None
            if not isinstance(key, str):
                raise ManifestError(f"workload {w['id']}: a candidate without a key")
            if key in keys:
                raise ManifestError(f"candidate key {key!r} appears twice")
            keys.add(key)


def reference_params(workload: dict) -> tuple[str, dict]:
    """(reference kind, its parameters): the kind is `reference.kind` (the op when absent), the
    parameters the workload's catalog `params`, then any other field of `reference` for a name
    they lack (the catalog's names and meanings win), then the catalog's defaults (matmul B=0,
    trans_a/trans_b false; dilation 1; multiplier 1)."""
    reference = workload.get("reference") or {}
    kind = reference.get("kind", workload.get("op"))
    if kind not in OPS:
        raise ManifestError(f"no torch reference for {kind!r} (known: {', '.join(OPS)})")
    p = {**{k: v for k, v in reference.items() if k != "kind"}, **(workload.get("params") or {})}
    defaults = {"matmul": {"B": 0, "trans_a": False, "trans_b": False}, "conv2d": {"dilation": 1},
                "group_conv2d": {"dilation": 1}, "depthwise_conv2d": {"multiplier": 1}}
    return kind, {**defaults.get(kind, {}), **p}


def _window_out(op: str, size: int, pad: int, window: int, stride: int) -> int:
    """floor((size + 2 pad - window) / stride) + 1 (the catalog's output extent)."""
    out = (size + 2 * pad - window) // stride + 1
    if out <= 0:
        raise ManifestError(f"{op}: a window of {window} over a padded extent of {size + 2 * pad}")
    return out


def expected_shapes(kind: str, p: dict) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """(input shapes in call order, output shape) of a catalog operator, as its builder in
    workbench/ops/catalog.py lays them out."""
    try:
        if kind == "matmul":
            lead = (p["B"],) if p["B"] else ()
            a = lead + ((p["K"], p["M"]) if p["trans_a"] else (p["M"], p["K"]))
            b = lead + ((p["N"], p["K"]) if p["trans_b"] else (p["K"], p["N"]))
            return [a, b], lead + (p["M"], p["N"])
        if kind == "gemv":
            return [(p["M"], p["K"]), (p["K"],)], (p["M"],)
        if kind in ("conv2d", "group_conv2d", "depthwise_conv2d"):
            d = p.get("dilation", 1)
            oh = _window_out(kind, p["H"], p["pad"], d * (p["KH"] - 1) + 1, p["stride"])
            ow = _window_out(kind, p["W"], p["pad"], d * (p["KW"] - 1) + 1, p["stride"])
            data = (p["N"], p["C"], p["H"], p["W"])
            if kind == "conv2d":
                return [data, (p["F"], p["C"], p["KH"], p["KW"])], (p["N"], p["F"], oh, ow)
            if kind == "group_conv2d":
                g = p["groups"]
                if p["C"] % g or p["F"] % g:
                    raise ManifestError(f"group_conv2d: C={p['C']} and F={p['F']} must be divisible by groups={g}")
                return [data, (p["F"], p["C"] // g, p["KH"], p["KW"])], (p["N"], p["F"], oh, ow)
            m = p["multiplier"]
            out = (p["N"], p["C"], oh, ow) if m == 1 else (p["N"], p["C"], m, oh, ow)
            return [data, (p["C"] * m, 1, p["KH"], p["KW"])], out
        if kind in ("avgpool", "maxpool"):
            oh = _window_out(kind, p["H"], p["pad"], p["K"], p["stride"])
            ow = _window_out(kind, p["W"], p["pad"], p["K"], p["stride"])
            return [(p["N"], p["C"], p["H"], p["W"])], (p["N"], p["C"], oh, ow)
        if kind in ("relu", "gelu", "add"):
            shape = tuple(p["shape"])
            return [shape] * (2 if kind == "add" else 1), shape
        shape, axes = tuple(p["shape"]), tuple(p["axes"])
        if len(set(axes)) != len(axes) or not axes or max(axes) >= len(shape) or min(axes) < 0:
            raise ManifestError(f"{kind}: axes {list(axes)} are not distinct dimensions of a rank-{len(shape)} shape")
        return [shape], tuple(n for d, n in enumerate(shape) if d not in axes)
    except KeyError as e:
        raise ManifestError(f"{kind}: parameter {e.args[0]} missing") from None


def workload_problem(workload: dict) -> str:
    """Why the runner cannot check this workload ("" when it can): a reference kind it does not
    know, or `args` that are not the operator's inputs then one output with the shapes its
    parameters give."""
    try:
        return _workload_problem(workload)
    except Exception as e:  # a malformed field: the workload fails, the run goes on
        return f"malformed workload: {type(e).__name__}: {e}"


def _workload_problem(workload: dict) -> str:
    try:
        kind, p = reference_params(workload)
        inputs, output = expected_shapes(kind, p)
    except ManifestError as e:
        return str(e)
    args = workload.get("args")
    if not isinstance(args, list) or not args:
        return "no args"
    for a in args:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or a.get("dtype") not in DTYPES:
            return f"arg {a!r}: needs a name and a dtype among {', '.join(DTYPES)}"
    roles = [a.get("role") for a in args]
    if roles != ["input"] * len(inputs) + ["output"]:
        return f"args' roles are {roles}, {kind} takes {len(inputs)} inputs then one output"
    for a, shape in zip(args, inputs + [output]):
        if tuple(a.get("shape", ())) != tuple(shape):
            return f"arg {a['name']} has shape {a.get('shape')}, {kind} with these params gives {list(shape)}"
    if workload.get("dtype") not in TOLERANCE:
        return f"dtype {workload.get('dtype')!r}: no tolerance for it (known: {', '.join(TOLERANCE)})"
    return ""


def launch_arguments(launch: dict, buffers: dict) -> list[tuple[str, object]]:
    """A launch's kernel arguments as ("buffer", name) or ("int32", value) in parameter order:
    names from `buffers` (the workload's args and the candidate's scratch), ints as
    `{"int": v}` (32-bit, as TVM passes shape values); ManifestError for anything else."""
    out = []
    for a in launch.get("args", ()):
        if isinstance(a, str):
            if a not in buffers:
                raise ManifestError(f"kernel {launch.get('kernel')}: argument {a!r} is neither an arg nor scratch")
            out.append(("buffer", a))
        elif isinstance(a, dict) and isinstance(a.get("int"), int) and not isinstance(a.get("int"), bool):
            if not -2**31 <= a["int"] < 2**31:
                raise ManifestError(f"kernel {launch.get('kernel')}: int argument {a['int']} is out of int32 range")
            out.append(("int32", a["int"]))
        else:
            raise ManifestError(f"kernel {launch.get('kernel')}: argument {a!r} is not a name or {{'int': n}}")
    return out


def _triple(value, what: str) -> tuple[int, int, int]:
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or not all(isinstance(v, int) and v >= 1 for v in value):
        raise ManifestError(f"{what} {value!r} is not 1 to 3 positive ints")
    return tuple(value) + (1,) * (3 - len(value))


def candidate_problem(candidate: dict, workload: dict, packdir: str) -> str:
    """Why this candidate cannot be launched ("" when it can): a missing kernel file, a launch
    without a kernel name, grid or block, a bad dynamic shared memory size, arguments that name
    nothing, scratch without a shape and dtype."""
    try:
        return _candidate_problem(candidate, workload, packdir)
    except Exception as e:  # a malformed field: the candidate fails, the run goes on
        return f"malformed candidate: {type(e).__name__}: {e}"


def _candidate_problem(candidate: dict, workload: dict, packdir: str) -> str:
    if not KEY_CHARS.match(candidate.get("key", "")):
        return f"key {candidate.get('key')!r} has characters outside [A-Za-z0-9._-]"
    files = [candidate.get(k) for k in ("cubin", "ptx") if candidate.get(k)]
    if not any(os.path.isfile(os.path.join(packdir, f)) for f in files):
        return (f"no kernel file: neither cubin {candidate.get('cubin')!r} nor ptx {candidate.get('ptx')!r} "
                "is in the pack")
    buffers = {a["name"]: a for a in workload.get("args", ())}
    for s in candidate.get("scratch") or ():
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or s.get("dtype") not in DTYPES:
            return f"scratch {s!r}: needs a name, a shape and a dtype among {', '.join(DTYPES)}"
        if not isinstance(s.get("shape"), list) or not all(isinstance(n, int) and n >= 0 for n in s["shape"]):
            return f"scratch {s['name']}: shape {s.get('shape')!r} is not a list of ints"
        if s["name"] in buffers:
            return f"scratch {s['name']} has the name of an argument"
        buffers[s["name"]] = s
    launches = candidate.get("launches")
    if not isinstance(launches, list) or not launches:
        return "no launches"
    try:
        for launch in launches:
            if not isinstance(launch.get("kernel"), str) or not launch["kernel"]:
                return f"a launch without a kernel name: {launch!r}"
            _triple(launch.get("grid"), "grid")
            if math.prod(_triple(launch.get("block"), "block")) > 1024:
                return f"kernel {launch['kernel']}: block {launch['block']} has more than 1024 threads"
            shared = launch.get("dynamic_shared_bytes", 0)
            if not isinstance(shared, int) or shared < 0:
                return f"kernel {launch['kernel']}: dynamic_shared_bytes {shared!r}"
            launch_arguments(launch, buffers)
    except ManifestError as e:
        return str(e)
    return ""


def selected(workloads: list, only: str) -> list[tuple[dict, list[dict]]]:
    """(workload, its candidates whose key contains `only`): every workload when `only` is empty
    (one without candidates still gets torch's time), else those that keep a candidate."""
    out = []
    for w in workloads:
        candidates = [c for c in w.get("candidates") or () if only in c["key"]]
        if candidates or not only:
            out.append((w, candidates))
    return out


# ---- inputs, reference, error -----------------------------------------------------------------


def input_scale(kind: str, p: dict) -> float:
    """Standard deviation of the normal inputs, so outputs are O(1) in every dtype: a sum of K
    products of two N(0, s^2) values has deviation sqrt(K) s^2, so s = K^-1/4; a sum of K
    inputs (reduce_sum) sqrt(K) s, so s = K^-1/2; means, windows and elementwise ops keep 1."""
    if kind in ("matmul", "gemv"):
        terms = p["K"]
    elif kind == "conv2d":
        terms = p["C"] * p["KH"] * p["KW"]
    elif kind == "group_conv2d":
        terms = p["C"] // p["groups"] * p["KH"] * p["KW"]
    elif kind == "depthwise_conv2d":
        terms = p["KH"] * p["KW"]
    elif kind == "reduce_sum":
        return math.prod(p["shape"][d] for d in p["axes"]) ** -0.5
    else:
        return 1.0
    return terms ** -0.25


def workload_seed(workload_id: str) -> int:
    """A seed fixed by the workload's id (reruns draw the same inputs)."""
    return zlib.crc32(workload_id.encode())


def reference_function(kind: str, p: dict):
    """(f(ops, *inputs) -> output, what torch runs): the operator in terms of `ops` (`TorchOps`
    on the GPU; any object with the same methods elsewhere), with the catalog's semantics."""
    if kind == "matmul":
        def matmul(ops, a, b):
            a = ops.swap_last(a) if p["trans_a"] else a
            return ops.matmul(a, ops.swap_last(b) if p["trans_b"] else b)
        return matmul, "torch.matmul (cuBLAS)"
    if kind == "gemv":
        return (lambda ops, a, x: ops.matmul(a, x)), "torch.matmul (cuBLAS gemv)"
    if kind in ("conv2d", "group_conv2d", "depthwise_conv2d"):
        # the catalog's kernels are torch's OIHW weights: [F, C/groups, KH, KW]; depthwise is
        # groups = C with [C*multiplier, 1, KH, KW], whose output channel c*multiplier + j is the
        # catalog's [n, c, j] (a 5-D output has the layout of torch's 4-D one)
        groups = {"conv2d": 1, "group_conv2d": p.get("groups"), "depthwise_conv2d": p.get("C")}[kind]
        dilation = p.get("dilation", 1)
        return ((lambda ops, data, kernel: ops.conv2d(data, kernel, p["stride"], p["pad"], dilation, groups)),
                f"torch.nn.functional.conv2d (cuDNN), groups={groups}")
    if kind == "avgpool":  # padding counts as zeros, every window divides by K*K
        return ((lambda ops, x: ops.avg_pool2d(x, p["K"], p["stride"], p["pad"])),
                "torch.nn.functional.avg_pool2d, count_include_pad")
    if kind == "maxpool":  # torch pads with -inf, the catalog with the lowest value: same maxima
        return (lambda ops, x: ops.max_pool2d(x, p["K"], p["stride"], p["pad"])), "torch.nn.functional.max_pool2d"
    if kind == "relu":
        return (lambda ops, x: ops.relu(x)), "torch.relu"
    if kind == "gelu":
        return (lambda ops, x: ops.gelu_tanh(x)), "torch.nn.functional.gelu, tanh form"
    if kind == "add":
        return (lambda ops, a, b: a + b), "torch add"
    axes = tuple(p["axes"])
    if kind == "reduce_sum":
        return (lambda ops, x: ops.sum(x, axes)), "torch.sum"
    return (lambda ops, x: ops.mean(x, axes)), "torch.mean"


def error_measure(out, ref, xp) -> dict:
    """Compare a kernel's output with the reference, both float64 arrays of one shape, with the
    array module `xp` (numpy, or torch for tensors on the GPU): the count of elements that are
    not finite (NaN poison left where nothing was written), rel L2 error ||out - ref|| / ||ref||
    and max |out - ref| / max |ref| (None where not finite)."""
    size = math.prod(tuple(out.shape))
    nonfinite = int(xp.sum(~xp.isfinite(out))) if size else 0
    if size == 0:
        return {"nonfinite": 0, "rel_l2_error": 0.0, "max_rel_error": 0.0}
    diff = out - ref
    ref_norm = float(xp.sqrt(xp.sum(ref * ref)))
    diff_norm = float(xp.sqrt(xp.sum(diff * diff)))
    ref_max = float(xp.max(xp.abs(ref)))
    diff_max = float(xp.max(xp.abs(diff)))

    def ratio(a, b):
        value = (0.0 if a == 0 else math.inf) if b == 0 else a / b
        return value if math.isfinite(value) else None

    return {"nonfinite": nonfinite, "rel_l2_error": ratio(diff_norm, ref_norm),
            "max_rel_error": ratio(diff_max, ref_max)}


def verdict(measure: dict, dtype: str, size: int) -> tuple[bool, str]:
    """(verified, "" or why not) from `error_measure`: every element finite and the rel L2 error
    within the dtype's tolerance; NaN never passes."""
    tol = TOLERANCE[dtype]
    if measure["nonfinite"]:
        return False, f"{measure['nonfinite']} of {size} outputs not finite (NaN poison left: unwritten, or NaN/inf)"
    err = measure["rel_l2_error"]
    if err is None or not err <= tol:
        return False, f"wrong result: rel L2 error {err if err is None else format(err, '.3g')} > {tol:g}"
    return True, ""


def plan_repeats(estimate_s: float, repeats: int, warmup: int, budget_s: float = TIMING_BUDGET_S) -> tuple[int, int]:
    """(warm-up runs, timed repeats) for a kernel that runs in about `estimate_s`: the requested
    ones, fewer repeats where they would not fit in `budget_s` (never under MIN_REPEATS); for a
    kernel too slow for that, no warm-up (its checked run was one) and as many repeats as fit in
    SLOW_BUDGET_S, at least one."""
    per_run = max(estimate_s, 0.0) + REPEAT_OVERHEAD_S
    fit = int(budget_s / per_run)
    if fit >= warmup + MIN_REPEATS:
        return warmup, min(repeats, fit - warmup)
    return 0, max(1, min(MIN_REPEATS, repeats, int(SLOW_BUDGET_S / per_run)))


# ---- the result JSON and its summary ----------------------------------------------------------


def failed(candidate: dict, error: str) -> dict:
    """A candidate's result when it did not run to the end (`error`: one line)."""
    return {"rank": candidate.get("rank"), "key": candidate["key"], "ok": False, "error": one_line(error),
            "verified": False, "max_rel_error": None, "rel_l2_error": None, "seconds": None, "samples": [],
            "predicted_seconds": candidate.get("predicted_seconds")}


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of `text`, at most `limit` characters."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else "unknown error"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def workload_entry(workload: dict, torch_result: dict | None, candidates: list[dict]) -> dict:
    """One workload of the result: the manifest's description, torch's measurement, and the
    candidates' results in rank order."""
    return {"id": workload["id"], "suite": workload.get("suite"), "op": workload.get("op"),
            "params": workload.get("params"), "dtype": workload.get("dtype"),
            "torch": torch_result or {"seconds": None, "samples": [], "what": "", "error": "not run"},
            "candidates": sorted(candidates, key=lambda c: (c.get("rank") is None, c.get("rank") or 0, c["key"]))}


def build_result(manifest: dict, machine: dict, microbench: dict, timing: dict, workloads: list[dict]) -> dict:
    """The runner's output (docs/gpu.md): the pack's identity, the machine, the
    micro-benchmarks, how times were taken, the workloads."""
    pack = {k: manifest.get(k) for k in ("device", "created", "git_commit")}
    return {"format": FORMAT, "pack": pack, "machine": machine, "microbench": microbench, "timing": timing,
            "workloads": workloads}


def write_json(path: str, value) -> None:
    """Write `value` as JSON to `path` atomically (a stopped run leaves the previous file whole).
    Non-finite floats become null: JSON has no NaN."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(_finite(value), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def format_microbench(mb: dict) -> str:
    """One line of the micro-benchmarks' numbers (what is there; errors named)."""
    units = (("sm_count", "SMs", 1, "{:.0f}"), ("l2_bytes", "MiB L2", 2**20, "{:.0f}"),
             ("dram_gbps", "GB/s DRAM", 1, "{:.0f}"), ("fp32_gflops", "TFLOP/s fp32 FMA", 1e3, "{:.1f}"),
             ("fp32_matmul_gflops", "fp32 matmul", 1e3, "{:.1f}"), ("tf32_tc_gflops", "TF32", 1e3, "{:.0f}"),
             ("fp16_tc_gflops", "fp16", 1e3, "{:.0f}"))
    parts = [f"{fmt.format(mb[k] / scale)} {label}" for k, label, scale, fmt in units
             if isinstance(mb.get(k), (int, float))]
    errors = sorted(k for k in mb if k == "error" or k.endswith("_error"))
    return "microbench: " + (", ".join(parts) or "-") + (f" (failed: {', '.join(errors)})" if errors else "")


def summary_rows(result: dict) -> list[dict]:
    """Per workload: torch's time, the best verified candidate's time (and key), their ratio,
    and how many candidates verified of how many."""
    rows = []
    for w in result["workloads"]:
        good = [c for c in w["candidates"] if c.get("ok") and c.get("seconds")]
        best = min(good, key=lambda c: c["seconds"]) if good else None
        torch_s = (w.get("torch") or {}).get("seconds")
        ratio = best["seconds"] / torch_s if best and torch_s else None
        rows.append({"id": w["id"], "op": w.get("op"), "torch_seconds": torch_s,
                     "best_seconds": best["seconds"] if best else None, "best_key": best["key"] if best else None,
                     "ratio": ratio, "verified": sum(1 for c in w["candidates"] if c.get("verified")),
                     "candidates": len(w["candidates"])})
    return rows


def within_fraction(rows: list[dict]) -> tuple[int, int]:
    """(workloads whose best verified time is within 10% of torch's, workloads torch timed): a
    workload without a verified candidate counts as not within."""
    timed = [r for r in rows if r["torch_seconds"]]
    return sum(1 for r in timed if r["ratio"] is not None and r["ratio"] <= WITHIN), len(timed)


def format_summary(result: dict) -> str:
    """The table printed at the end of a run: per workload our best / torch, verified counts,
    then the fraction within 10% of torch."""
    rows = summary_rows(result)
    lines = [format_microbench(result.get("microbench") or {})] if result.get("microbench") else []
    lines += [f"{'workload':<24} {'op':<17} {'torch us':>10} {'best us':>10} {'best/torch':>10} {'verified':>9}  best"]

    def us(s):
        return f"{s * 1e6:10.1f}" if s else f"{'-':>10}"

    for r in rows:
        ratio = f"{r['ratio']:10.2f}" if r["ratio"] is not None else f"{'-':>10}"
        lines.append(f"{r['id']:<24.24} {str(r['op']):<17.17} {us(r['torch_seconds'])} {us(r['best_seconds'])} "
                     f"{ratio} {r['verified']:>4}/{r['candidates']:<4}  {r['best_key'] or '-'}")
    within, timed = within_fraction(rows)
    share = f" ({100.0 * within / timed:.0f}%)" if timed else ""
    lines.append(f"within 10% of torch: {within}/{timed} workloads{share}; verified candidates: "
                 f"{sum(r['verified'] for r in rows)}/{sum(r['candidates'] for r in rows)}")
    return "\n".join(lines)


# ---- the host (no GPU library needed) ---------------------------------------------------------


def _command(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_lscpu(text: str) -> dict:
    """Model name and flags from `lscpu` output (empty strings when absent)."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"cpu": fields.get("Model name", "").strip(), "cpu_flags": fields.get("Flags", "").strip()}


def parse_nvidia_smi(text: str) -> dict:
    """The first GPU's line of `nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm
    --format=csv,noheader,nounits`: driver, current and maximum SM clock in MHz."""
    line = next((s for s in text.splitlines() if s.strip()), "")
    parts = [s.strip() for s in line.split(",")]
    if len(parts) != 3:
        return {}

    def mhz(s):
        try:
            return float(s)
        except ValueError:
            return None

    return {"driver": parts[0], "clock_mhz": mhz(parts[1]), "clock_max_mhz": mhz(parts[2])}


def gpu_clocks() -> dict:
    """The GPU's driver and SM clocks from nvidia-smi (empty when it is absent)."""
    if not shutil.which("nvidia-smi"):
        return {}
    return parse_nvidia_smi(_command(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                                      "--format=csv,noheader,nounits"]))


def host_info() -> dict:
    """The host's CPU (lscpu), name, and the GPU's driver and clocks (nvidia-smi), when present."""
    info = {"hostname": socket.gethostname(), "cpu": platform.processor(), "cpu_flags": "", "driver": None,
            "clock_mhz": None, "clock_max_mhz": None}
    if shutil.which("lscpu"):
        info.update({k: v for k, v in parse_lscpu(_command(["lscpu"])).items() if v})
    info.update(gpu_clocks())
    return info


# ---- the parent: workers, watchdog, result ----------------------------------------------------


class Run:
    """The parent's state: what each worker reported, merged into the result."""

    def __init__(self, manifest: dict, packdir: str, args):
        self.manifest, self.packdir, self.args = manifest, packdir, args
        self.deadline = time.time() + args.budget_seconds
        self.work = selected(manifest["workloads"], args.only)
        self.machine = host_info()
        self.microbench: dict | None = None
        self.l2_flush_bytes = None
        self.torch: dict[str, dict] = {}
        self.results: dict[str, dict] = {}  # candidate key -> result
        for w, candidates in self.work:
            problem = workload_problem(w)
            for c in candidates:
                problem_c = problem or candidate_problem(c, w, packdir)
                if problem_c:
                    self.results[c["key"]] = failed(c, f"manifest: {problem_c}")
            if problem:
                self.torch[w["id"]] = {"seconds": None, "samples": [], "what": "", "error": f"manifest: {problem}"}

    def pending(self) -> list[dict]:
        """The worker's items still to do, in order."""
        items = []
        for w, candidates in self.work:
            keys = [c["key"] for c in candidates if c["key"] not in self.results]
            if keys or w["id"] not in self.torch:
                items.append({"workload": w["id"], "torch": w["id"] not in self.torch, "keys": keys})
        return items

    def result(self) -> dict:
        timing = {"warmup": self.args.warmup, "repeats": self.args.repeats, "l2_flush_bytes": self.l2_flush_bytes,
                  "method": "CUDA events, median", "budget_seconds": self.args.budget_seconds}
        workloads = [workload_entry(w, self.torch.get(w["id"]), [self.results[c["key"]] for c in candidates
                                                               if c["key"] in self.results])
                     for w, candidates in self.work]
        return build_result(self.manifest, self.machine, self.microbench or {}, timing, workloads)

    def record(self, event: dict) -> None:
        kind = event["event"]
        if kind == "machine":
            self.machine.update({k: v for k, v in event["machine"].items() if v is not None})
            self.l2_flush_bytes = event.get("l2_flush_bytes")
        elif kind == "microbench":
            self.microbench = event["microbench"]
            # the SM clock right after the micro-benchmarks' load (at the run's start it idles)
            self.machine["clock_mhz_after_microbench"] = gpu_clocks().get("clock_mhz")
        elif kind == "torch":
            self.torch[event["workload"]] = event["torch"]
        elif kind == "candidate":
            self.results[event["candidate"]["key"]] = event["candidate"]
        elif kind == "workload_error":
            self.fail_workload(event["workload"], event["error"])

    def fail_workload(self, workload_id: str, error: str) -> None:
        """The workload's setup failed: torch and every candidate not yet done get `error`."""
        self.torch.setdefault(workload_id, {"seconds": None, "samples": [], "what": "", "error": one_line(error)})
        for w, candidates in self.work:
            if w["id"] == workload_id:
                for c in candidates:
                    self.results.setdefault(c["key"], failed(c, error))

    def fail_item(self, start: dict, error: str) -> None:
        """The worker stopped inside `start`'s item: record `error` for it."""
        if start.get("key") == MICROBENCH:
            self.microbench = {"error": one_line(error)}
        elif start.get("key") == TORCH:
            self.torch.setdefault(start["workload"], {"seconds": None, "samples": [], "what": "",
                                                      "error": one_line(error)})
        elif start.get("key"):
            candidate = next(c for w, cs in self.work for c in cs if c["key"] == start["key"])
            self.results.setdefault(candidate["key"], failed(candidate, error))
        else:
            self.fail_workload(start["workload"], f"setup: {error}")

    def out_of_time(self) -> None:
        for w, candidates in self.work:
            for c in candidates:
                self.results.setdefault(c["key"], failed(c, "out of time budget"))
            self.torch.setdefault(w["id"], {"seconds": None, "samples": [], "what": "", "error": "out of time budget"})

    def progress(self) -> tuple:
        """What has been recorded so far (a worker that changes none of it made no progress)."""
        return len(self.results), len(self.torch), self.microbench is None

    def save(self) -> None:
        write_json(self.args.out, self.result())


def run_pack(args) -> int:
    """Run the pack with workers until every candidate has a result; write and summarise."""
    manifest = load_manifest(args.packdir)
    run = Run(manifest, args.packdir, args)
    idle = 0
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp:
        number = 0
        while True:
            items = run.pending()
            if not items and run.microbench is not None:
                break
            if time.time() >= run.deadline:
                run.out_of_time()
                break
            number += 1
            before = run.progress()
            stopped = _worker(run, items, os.path.join(tmp, f"worker{number}"))
            run.save()
            idle = idle + 1 if run.progress() == before else 0
            if idle >= MAX_IDLE_WORKERS:  # e.g. torch or cupy missing, no GPU: every worker dies alike
                for w, _ in run.work:
                    run.fail_workload(w["id"], f"worker: {stopped or 'reported nothing'}")
                if run.microbench is None:
                    run.microbench = {"error": one_line(stopped or "reported nothing")}
                break
    if run.microbench is None:
        run.microbench = {"error": "not run"}
    run.save()
    print(format_summary(run.result()))
    print(f"result: {args.out}")
    return 0


def _worker(run: Run, items: list[dict], base: str) -> str | None:
    """Start a worker on `items` and follow its reports until it exits or the watchdog stops it.
    Returns None when it finished cleanly, else why it stopped; the item it stopped in gets that
    reason."""
    task = {"items": items, "repeats": run.args.repeats, "warmup": run.args.warmup, "deadline": run.deadline,
            "microbench": run.microbench is None}
    with open(base + ".task.json", "w") as f:
        json.dump(task, f)
    events_path, log_path = base + ".events", base + ".log"
    open(events_path, "w").close()
    cmd = [sys.executable, os.path.abspath(__file__), run.packdir, "--out", run.args.out,
           "--worker", base + ".task.json", "--events", events_path]
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    spawned, offset, start, reported, sticky, sticky_at = time.time(), 0, None, False, "", 0.0

    def stop(why: str) -> str:
        child.kill()
        child.wait()
        if start is not None:
            run.fail_item(start, why)
        return why

    while True:
        rc = child.poll()
        with open(events_path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset += len(complete)
        for line in complete.decode().splitlines():
            event = json.loads(line)
            reported = True
            if event["event"] == "start":
                start = event
            elif event["event"] == "sticky":
                sticky, sticky_at = event["error"], time.time()
            else:
                run.record(event)
                if event["event"] in ("candidate", "torch", "setup_done", "workload_error", "microbench"):
                    start = None
                if event["event"] in ("torch", "candidate"):
                    run.save()
        if rc is not None:
            break
        if sticky and time.time() - sticky_at > STICKY_GRACE_S:
            child.kill()
            rc = child.wait()
            break
        if not reported and time.time() - spawned > STARTUP_TIMEOUT_S:
            return stop(f"worker did not start within {STARTUP_TIMEOUT_S:.0f} s: {_log_tail(log_path)}")
        if start is not None:
            limit = {None: SETUP_TIMEOUT_S, TORCH: SETUP_TIMEOUT_S, MICROBENCH: MICROBENCH_TIMEOUT_S}.get(
                start.get("key"), CANDIDATE_TIMEOUT_S)
            if time.time() - start["t"] > limit:
                return stop(f"timed out after {limit:.0f} s (hung kernel?); worker killed")
        if time.time() > run.deadline + CANDIDATE_TIMEOUT_S:
            return stop("out of time budget (worker killed)")
        time.sleep(0.2)
    if rc == 0 and start is None:
        return None
    why = sticky or f"worker exited with code {rc}: {_log_tail(log_path)}"
    if start is not None:
        run.fail_item(start, why)
    return why


def _log_tail(path: str) -> str:
    try:
        with open(path) as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][-300:] if lines else "no output"


# ---- the worker: everything that touches the GPU ----------------------------------------------


class TorchOps:
    """The operators of `reference_function` in torch, on whatever device the tensors are."""

    def __init__(self, torch):
        self.torch = torch
        self.F = torch.nn.functional

    def swap_last(self, x):
        return x.transpose(-1, -2)

    def matmul(self, a, b):
        return self.torch.matmul(a, b)

    def conv2d(self, data, kernel, stride, pad, dilation, groups):
        return self.F.conv2d(data, kernel, stride=stride, padding=pad, dilation=dilation, groups=groups)

    def avg_pool2d(self, x, k, stride, pad):
        return self.F.avg_pool2d(x, k, stride, pad, count_include_pad=True)

    def max_pool2d(self, x, k, stride, pad):
        return self.F.max_pool2d(x, k, stride, pad)

    def relu(self, x):
        return self.torch.relu(x)

    def gelu_tanh(self, x):
        return self.F.gelu(x, approximate="tanh")

    def sum(self, x, axes):
        return x.sum(dim=axes)

    def mean(self, x, axes):
        return x.mean(dim=axes)


class Reporter:
    """The worker's side of the protocol: one JSON object per line, flushed at once."""

    def __init__(self, path: str):
        self.f = open(path, "a")

    def __call__(self, event: str, **fields) -> None:
        self.f.write(json.dumps(_finite({"event": event, **fields}), allow_nan=False) + "\n")
        self.f.flush()


class Gpu:
    """torch and cupy on device 0, sharing torch's current stream; L2 flush buffer; timing."""

    def __init__(self):
        import cupy
        import numpy
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
        self.torch, self.cupy, self.np = torch, cupy, numpy
        torch.cuda.init()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.device = torch.device("cuda", 0)
        self.ops = TorchOps(torch)
        # cupy launches on torch's stream, so kernels, torch ops and events are ordered
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        props = torch.cuda.get_device_properties(0)
        self.sm_count = props.multi_processor_count
        self.l2_bytes = getattr(props, "L2_cache_size", None) or cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
        # writing twice the L2's size evicts everything a previous repeat left in it
        self.flush_buffer = torch.empty(2 * self.l2_bytes, dtype=torch.uint8, device=self.device)
        self.flushes = 0

    def machine(self) -> dict:
        torch, cupy = self.torch, self.cupy
        rt, drv = cupy.cuda.runtime.runtimeGetVersion(), cupy.cuda.runtime.driverGetVersion()
        return {"gpu": torch.cuda.get_device_name(0), "cuda_runtime": torch.version.cuda,
                "cuda_driver_api": f"{drv // 1000}.{drv % 1000 // 10}",
                "cupy_cuda_runtime": f"{rt // 1000}.{rt % 1000 // 10}", "torch": torch.__version__,
                "cupy": cupy.__version__, "cudnn": torch.backends.cudnn.version(), "sm_count": self.sm_count,
                "l2_bytes": self.l2_bytes, "python": platform.python_version()}

    def flush(self) -> None:
        self.flushes += 1
        self.flush_buffer.fill_(self.flushes % 251)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def time(self, run, warmup: int, repeats: int) -> list[float]:
        """Seconds of `run()` per repeat, by CUDA events around it, the L2 flushed before each.
        The flush and a spin of `HOST_LEAD_CYCLES` are queued before the start event, so the GPU
        is still busy with them while the host queues the kernel: launch latency is not timed.
        (Without the spin, a torch call whose host dispatch outlasts the flush's ~30 us was timed
        with its dispatch: the same 32x128x128 matmul read 9 us in one run and 23 us in the next.)"""
        Event = self.torch.cuda.Event
        spin = getattr(self.torch.cuda, "_sleep", lambda cycles: None)  # a private torch helper: kept optional
        for _ in range(warmup):
            self.flush()
            run()
        events = [(Event(enable_timing=True), Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            self.flush()
            spin(HOST_LEAD_CYCLES)
            start.record()
            run()
            end.record()
        self.sync()
        return [start.elapsed_time(end) * 1e-3 for start, end in events]

    def timed(self, run, estimate_s: float, repeats: int, warmup: int) -> tuple[float, list[float]]:
        """(median seconds, the repeats' seconds) with repeats cut to `TIMING_BUDGET_S`."""
        w, r = plan_repeats(estimate_s, repeats, warmup)
        samples = self.time(run, w, r)
        return statistics.median(samples), samples

    def healthy(self) -> bool:
        """Whether the context still works after an error (an illegal address is sticky)."""
        try:
            self.sync()
            return float(self.torch.ones(1, device=self.device).sum().item()) == 1.0
        except Exception:
            return False

    def tensor(self, shape, dtype: str):
        return self.torch.empty(tuple(shape), dtype=getattr(self.torch, dtype), device=self.device)


FMA_KERNEL = r"""
extern "C" __global__ void fma_loop(float* out, float a, float b, int iters) {
    // 8 independent chains per thread keep every FP32 pipe busy despite the FMA latency
    float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    for (int i = 0; i < iters; ++i) {
        x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
        x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""


def microbench(gpu: Gpu) -> dict:
    """SMs and L2 from the device's properties; DRAM bandwidth of a 2 GiB device copy (bytes read
    + written); the fp32 CUDA-core rate of an FMA loop; matmul rates through torch: fp32 with
    TF32 off, TF32 and fp16 on tensor cores. Medians of a few repeats, a few seconds in all. A
    part that fails leaves its error under "<name>_error" and the others run (unless the
    context is lost)."""
    torch, np = gpu.torch, gpu.np
    out = {"sm_count": gpu.sm_count, "l2_bytes": gpu.l2_bytes}

    def dram():
        n = 1 << 29  # float32 elements: 2 GiB per buffer, over 30x the L2
        src = torch.randn(n, device=gpu.device)
        dst = torch.empty_like(src)
        return 2 * 4 * n / statistics.median(gpu.time(lambda: dst.copy_(src), 2, 10)) / 1e9

    def fma():
        kernel = gpu.cupy.RawKernel(FMA_KERNEL, "fma_loop")
        threads, blocks, iters = 256, gpu.sm_count * 8, 1 << 14  # 2048 threads per SM, ~1 ms
        sink = torch.empty(threads * blocks, device=gpu.device)
        args = (np.uint64(sink.data_ptr()), np.float32(0.999999), np.float32(1e-6), np.int32(iters))
        seconds = statistics.median(gpu.time(lambda: kernel((blocks,), (threads,), args, stream=gpu.stream), 2, 10))
        return 2 * 8 * iters * threads * blocks / seconds / 1e9

    def matmul(dtype, tf32, size=8192):
        a = torch.randn(size, size, device=gpu.device, dtype=dtype)
        b = torch.randn(size, size, device=gpu.device, dtype=dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return 2 * size**3 / statistics.median(gpu.time(lambda: torch.matmul(a, b), 2, 5)) / 1e9
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    parts = {"dram_gbps": dram, "fp32_gflops": fma,
             "fp32_matmul_gflops": lambda: matmul(torch.float32, False),
             "tf32_tc_gflops": lambda: matmul(torch.float32, True),
             "fp16_tc_gflops": lambda: matmul(torch.float16, False)}
    for name, part in parts.items():
        try:
            out[name] = part()
        except Exception as e:
            out[f"{name}_error"] = one_line(f"{type(e).__name__}: {e}")
            if not gpu.healthy():
                raise
        finally:
            torch.cuda.empty_cache()
    out["method"] = ("dram: 2 GiB device copy, read + written; fp32: FMA loop kernel (8 chains); matmuls: "
                     "torch.matmul 8192^3; medians of 5-10 repeats, L2 flushed before each")
    return out


class Workload:
    """One workload on the GPU: its inputs (and a pristine copy restored before each candidate,
    in case a kernel wrote where it should not), the float64 reference, torch's measurement."""

    def __init__(self, gpu: Gpu, w: dict):
        torch = gpu.torch
        self.gpu, self.w = gpu, w
        kind, p = reference_params(w)
        self.f, self.what = reference_function(kind, p)
        inputs = [a for a in w["args"] if a["role"] == "input"]
        self.output = next(a for a in w["args"] if a["role"] == "output")
        generator = torch.Generator(device=gpu.device)
        generator.manual_seed(workload_seed(w["id"]))
        scale = input_scale(kind, p)
        self.pristine = []
        for a in inputs:
            x = torch.randn(tuple(a["shape"]), generator=generator, device=gpu.device, dtype=torch.float32) * scale
            self.pristine.append(x.to(getattr(torch, a["dtype"])))
        self.inputs = [x.clone() for x in self.pristine]
        torch.backends.cudnn.benchmark = False  # no algorithm search for the float64 reference
        with torch.inference_mode():
            ref = self.f(gpu.ops, *(x.double() for x in self.pristine))
        self.ref = ref.reshape(tuple(self.output["shape"]))
        self.size = math.prod(self.output["shape"])

    def torch_result(self, repeats: int, warmup: int) -> dict:
        """torch's equivalent in the workload's dtype (TF32 off, cuDNN's fastest algorithm),
        checked against the reference and timed."""
        torch, gpu = self.gpu.torch, self.gpu
        torch.backends.cudnn.benchmark = True

        def run():
            return self.f(gpu.ops, *self.inputs)

        with torch.inference_mode():
            run()  # cuDNN's algorithm search
            out = run()
            check = error_measure(out.reshape(self.ref.shape).double(), self.ref, torch)
            estimate = statistics.median(gpu.time(run, 0, 1))
            seconds, samples = gpu.timed(run, estimate, repeats, warmup)
        result = {"seconds": seconds, "samples": samples, "what": f"{self.what}, TF32 off",
                  "rel_l2_error": check["rel_l2_error"]}
        verified, why = verdict(check, self.w["dtype"], self.size)
        if not verified:
            result["error"] = f"torch itself: {why}"
        return result

    def candidate(self, c: dict, packdir: str, repeats: int, warmup: int) -> dict:
        """Load, check, time one candidate (module docstring); raises on a load or launch error."""
        gpu, torch = self.gpu, self.gpu.torch
        functions, loaded_from = load_kernels(gpu, c, packdir)
        for x, p in zip(self.inputs, self.pristine):
            x.copy_(p)
        buffers = dict(zip((a["name"] for a in self.w["args"] if a["role"] == "input"), self.inputs))
        out = gpu.tensor(self.output["shape"], self.output["dtype"])
        buffers[self.output["name"]] = out
        scratch = []
        for s in c.get("scratch") or ():
            buffers[s["name"]] = gpu.tensor(s["shape"], s["dtype"])
            scratch.append(buffers[s["name"]])
        calls = []
        for launch, fn in zip(c["launches"], functions):
            args = tuple(gpu.np.uint64(buffers[v].data_ptr()) if kind == "buffer" else gpu.np.int32(v)
                         for kind, v in launch_arguments(launch, buffers))
            calls.append((fn, _triple(launch["grid"], "grid"), _triple(launch["block"], "block"),
                          launch.get("dynamic_shared_bytes", 0), args))

        def run():
            for fn, grid, block, shared, args in calls:
                fn(grid, block, args, shared_mem=shared, stream=gpu.stream)

        # NaN everywhere a launch should write, so an element no launch writes cannot pass
        for t in [out] + scratch:
            if t.is_floating_point():
                t.fill_(float("nan"))
        (estimate,) = gpu.time(run, 0, 1)
        check = error_measure(out.double(), self.ref, torch)
        verified, why = verdict(check, self.w["dtype"], self.size)
        result = {"rank": c.get("rank"), "key": c["key"], "ok": verified, "error": why, "verified": verified,
                  "max_rel_error": check["max_rel_error"], "rel_l2_error": check["rel_l2_error"], "seconds": None,
                  "samples": [], "predicted_seconds": c.get("predicted_seconds"), "loaded_from": loaded_from}
        if verified:  # a wrong kernel's time means nothing
            result["seconds"], result["samples"] = gpu.timed(run, estimate, repeats, warmup)
        return result


def load_kernels(gpu: Gpu, c: dict, packdir: str) -> tuple[list, str]:
    """The candidate's launches' functions from its cubin, else from its PTX (JIT-compiled by the
    driver), with the dynamic shared memory above the 48 KiB default allowed; and which file."""
    errors = []
    for which in ("cubin", "ptx"):
        if not c.get(which):
            continue
        path = os.path.join(packdir, c[which])
        try:
            module = gpu.cupy.RawModule(path=path)
            functions = []
            for launch in c["launches"]:
                fn = module.get_function(launch["kernel"])
                fn.kernel  # loads the module now (CuPy loads lazily), so a bad file falls back here
                shared = launch.get("dynamic_shared_bytes", 0)
                if shared > 48 * 1024:
                    fn.max_dynamic_shared_size_bytes = shared
                functions.append(fn)
            return functions, which
        except Exception as e:  # a bad file or missing symbol: try the other form
            errors.append(f"{which}: {type(e).__name__}: {one_line(str(e), 150)}")
    raise RuntimeError("cannot load: " + "; ".join(errors))


def worker_main(args) -> int:
    """The worker: machine, micro-benchmarks, then the task's items in order, each reported as
    it finishes (module docstring). Exits 3 at once after a sticky CUDA error (a broken context
    can hang the interpreter's teardown)."""
    with open(args.worker) as f:
        task = json.load(f)
    report = Reporter(args.events)
    manifest = load_manifest(args.packdir)
    by_id = {w["id"]: w for w in manifest["workloads"]}
    gpu = Gpu()
    report("machine", machine=gpu.machine(), l2_flush_bytes=gpu.flush_buffer.numel())
    if task["microbench"]:
        report("start", workload=None, key=MICROBENCH, t=time.time())
        try:
            report("microbench", microbench=microbench(gpu))
        except Exception as e:
            report("microbench", microbench={"error": one_line(f"{type(e).__name__}: {e}")})
            if not gpu.healthy():
                report("sticky", error=f"microbench: {one_line(str(e))}")
                os._exit(3)
    for item in task["items"]:
        w = by_id[item["workload"]]
        candidates = {c["key"]: c for c in w.get("candidates") or ()}
        if time.time() >= task["deadline"]:
            return 0  # the parent marks the rest "out of time budget"
        report("start", workload=w["id"], key=None, t=time.time())
        try:
            workload = Workload(gpu, w)
        except Exception as e:
            error = one_line(f"{type(e).__name__}: {e}")
            report("workload_error", workload=w["id"], error=f"setup: {error}")
            if not gpu.healthy():
                report("sticky", error=error)
                os._exit(3)
            continue
        report("setup_done", workload=w["id"])
        if item["torch"]:
            report("start", workload=w["id"], key=TORCH, t=time.time())
            try:
                torch_result = workload.torch_result(task["repeats"], task["warmup"])
            except Exception as e:
                error = one_line(f"{type(e).__name__}: {e}")
                torch_result = {"seconds": None, "samples": [], "what": workload.what, "error": error}
                if not gpu.healthy():
                    report("torch", workload=w["id"], torch=torch_result)
                    report("sticky", error=f"torch: {error}")
                    os._exit(3)
            report("torch", workload=w["id"], torch=torch_result)
        for key in item["keys"]:
            if time.time() >= task["deadline"]:
                return 0
            c = candidates[key]
            report("start", workload=w["id"], key=key, t=time.time())
            try:
                result = workload.candidate(c, args.packdir, task["repeats"], task["warmup"])
            except Exception as e:
                error = one_line(f"{type(e).__name__}: {e}")
                report("candidate", workload=w["id"], candidate=failed(c, error))
                if not gpu.healthy():
                    report("sticky", error=f"after {key}: {error}")
                    os._exit(3)
                continue
            report("candidate", workload=w["id"], candidate=result)
        del workload
        gpu.torch.cuda.empty_cache()
    return 0


# ---- self-test and command line ---------------------------------------------------------------

SELFTEST_KERNEL = r"""
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
    // staged through 64 KiB of dynamic shared memory: loading it needs the attribute above 48 KiB
    extern __shared__ float stage[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    stage[threadIdx.x + 16000] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = a * stage[threadIdx.x + 16000] + y[i];
}
"""
SELFTEST_SHARED_BYTES = 64 * 1024


def selftest() -> int:
    """Check the environment in seconds: the kernel above compiled by NVRTC (CuPy), and, where
    nvcc is on the PATH, as a cubin and as PTX for this GPU loaded the way pack kernels are
    (`load_kernels`); each launched on torch tensors by raw pointers on torch's stream and
    checked. Prints the machine; exit status 0 when every check passed."""
    gpu = Gpu()
    torch, np = gpu.torch, gpu.np
    n = 1000003
    x = torch.randn(n, device=gpu.device)
    grid, block = ((n + 255) // 256, 1, 1), (256, 1, 1)
    args = lambda y: (np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.float32(2.5), np.int32(n))  # noqa: E731

    def check(fn) -> str:
        y = torch.randn(n, device=gpu.device)
        expected = 2.5 * x.double() + y.double()
        fn(grid, block, args(y), shared_mem=SELFTEST_SHARED_BYTES, stream=gpu.stream)
        gpu.sync()
        return verdict(error_measure(y.double(), expected, torch), "float32", n)[1] or "ok"

    checks = {}
    try:
        kernel = gpu.cupy.RawKernel(SELFTEST_KERNEL, "axpy")
        kernel.max_dynamic_shared_size_bytes = SELFTEST_SHARED_BYTES
        checks["nvrtc"] = check(kernel)
    except Exception as e:
        checks["nvrtc"] = one_line(f"{type(e).__name__}: {e}")
    nvcc = shutil.which("nvcc")
    major, minor = torch.cuda.get_device_capability(0)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "axpy.cu")
        with open(source, "w") as f:
            f.write(SELFTEST_KERNEL)
        for which in ("cubin", "ptx"):
            if nvcc is None:
                checks[which] = "skipped: no nvcc on the PATH"
                continue
            path = os.path.join(tmp, f"axpy.{which}")
            built = subprocess.run([nvcc, f"-{which}", f"-arch=sm_{major}{minor}", "-o", path, source],
                                   capture_output=True, text=True, check=False)
            if built.returncode:
                checks[which] = f"nvcc failed: {one_line(built.stderr)}"
                continue
            candidate = {which: os.path.basename(path), "launches": [
                {"kernel": "axpy", "dynamic_shared_bytes": SELFTEST_SHARED_BYTES}]}
            try:
                (fn,), loaded = load_kernels(gpu, candidate, tmp)
                checks[which] = check(fn) if loaded == which else f"loaded {loaded}"
            except Exception as e:
                checks[which] = one_line(f"{type(e).__name__}: {e}")
    host = {k: v for k, v in host_info().items() if k != "cpu_flags"}
    print(json.dumps({**gpu.machine(), **host, "checks": checks}, indent=1))
    good = all(v == "ok" or v.startswith("skipped") for v in checks.values())
    print("selftest: ok" if good else "selftest: FAILED")
    return 0 if good else 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="run.py", description="Verify and time a GPU pack's kernels against torch; write one result JSON.")
    parser.add_argument("packdir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)),
                        help="the pack directory (default: this file's directory)")
    parser.add_argument("--out", default="result.json", help="result JSON path (default: result.json)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"timed repeats per kernel, fewer for slow ones (default {DEFAULT_REPEATS})")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help=f"warm-up runs (default {DEFAULT_WARMUP})")
    parser.add_argument("--only", default="", help="run only candidates whose key contains this")
    parser.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET_S,
                        help=f"time for the whole run; later candidates get 'out of time budget' "
                             f"(default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--selftest", action="store_true", help="check the GPU environment with a trivial kernel")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--events", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.budget_seconds <= 0:
        parser.error("--repeats must be >= 1, --warmup >= 0, --budget-seconds > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.selftest:
        return selftest()
    if args.worker:
        return worker_main(args)
    args.out = os.path.abspath(args.out)
    try:
        return run_pack(args)
    except ManifestError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
