"""A GPU pack: the top-K kernels of suites, built here, to be run on a GPU machine without TVM.

The format (the manifest, the kernels' files, the runner) is the contract in
docs/gpu.md; docs/gpu.md says how a pack travels and comes back. For each workload the
construction's top-K (as `workbench construct` makes it: roller policy) is built by the CUDA
templates (`codegen.build.build_kernel`, in a worker process: a compiler crash fails that
candidate only), its launches read off TVM's lowering (`gpu.launch`), and its CUDA source
compiled here by nvcc to PTX and by ptxas to a cubin for the device's architecture
(`codegen.nvcc`; an architecture this nvcc dropped gets the oldest newer one it has, and the
manifest says which). A candidate that fails anywhere is in the manifest with `"ok": false` and
its one-line error, without files. Everything is written into a staging directory renamed to
`out` at the end, so a failed pack leaves nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from workbench.codegen import nvcc
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.errors import UserError, first_line
from workbench.gpu.reference import reference
from workbench.gpu.sample_gemms import SAMPLE_GEMMS, sample_gemms
from workbench.hardware.spec import DeviceSpec
from workbench.hardware.write import spec_summary
from workbench.workers import Worker
from workbench.workload import Workload, load_suite

FORMAT = 1
MANIFEST = "manifest.json"
RUNNER = Path(__file__).resolve().parent / "runner.py"  # copied into the pack as `run.py`
MAX_PACK_BYTES = 48 * 2**20  # what the GPU machine's copy takes (docs/gpu.md)
POLICY = "roller"
# nvcc processes at once: one per core up to 4 (a large unrolled kernel takes nvcc seconds, the
# build of the next candidate in the worker about one)
NVCC_JOBS = max(1, min(os.cpu_count() or 1, 4))
# One candidate's build and the lowering its launches are read from, in the worker. TVM takes
# 13 s to build the fp16 4096^3 matmul's WMMA kernel with a 128 x 256 block tile on an idle core,
# and the build and lowering of two of those went past `workers.BUILD_TIMEOUT_S` (60 s) on a
# loaded 2-core machine; a pack is built offline, once, and a hung compiler still ends.
BUILD_TIMEOUT_S = 300.0
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class PackResult:
    """A pack written: where, its manifest, its size in bytes and how long it took."""

    path: Path
    manifest: dict
    bytes: int
    seconds: float

    @property
    def candidates(self) -> int:
        return sum(len(w["candidates"]) for w in self.manifest["workloads"])


def pack_workloads(suites: Sequence[str], workloads: Sequence[str]) -> list[tuple[str, str, Workload]]:
    """(suite, id, workload) of every workload of `suites` (a suite name, a suite TOML path, or
    `sample-gemms`) and of `workloads` (`SUITE:ID`), in order, each once; UserError for an
    unknown one or for none at all."""
    chosen: list[tuple[str, str, Workload]] = []
    for name in suites:
        suite_name, entries = (SAMPLE_GEMMS, sample_gemms()) if name == SAMPLE_GEMMS else load_suite(name)
        chosen += [(suite_name, w.label.split(":", 1)[1], w) for w in entries]
    for ref in workloads:
        suite, _, wid = ref.rpartition(":")
        suite_name, entries = (SAMPLE_GEMMS, sample_gemms()) if suite == SAMPLE_GEMMS else load_suite(suite)
        found = [w for w in entries if w.label.split(":", 1)[1] == wid]
        if not found:
            raise UserError(f"--workload {ref}: no workload {wid!r} in suite {suite_name}")
        chosen.append((suite_name, wid, found[0]))
    if not chosen:
        raise UserError("nothing to pack: give --suite or --workload")
    seen, unique = set(), []
    for suite_name, wid, w in chosen:
        if (suite_name, wid) not in seen:
            seen.add((suite_name, wid))
            unique.append((suite_name, wid, w))
    return unique


def workload_ids(chosen: Sequence[tuple[str, str, Workload]]) -> list[str]:
    """Each workload's id in the pack: its suite id, suite-qualified where two suites share it."""
    counts: dict[str, int] = {}
    for _, wid, _ in chosen:
        counts[wid] = counts.get(wid, 0) + 1
    return [wid if counts[wid] == 1 else f"{suite}/{wid}" for suite, wid, _ in chosen]


def key_of(workload_id: str, rank: int) -> str:
    """The candidate's file key `<id>-r<rank>` in [A-Za-z0-9._-] (docs/gpu.md)."""
    return f"{_KEY_UNSAFE.sub('_', workload_id)}-r{rank}"


def write_pack(chosen: Sequence[tuple[str, str, Workload]], device: DeviceSpec, topk: int, out: str | Path, *,
               progress: Callable[[str], None] | None = None, jobs: int | None = None) -> PackResult:
    """Build the pack of `chosen` (`pack_workloads`) on the GPU `device` at top-`topk` into the
    new directory `out`: a `PackResult`. Candidates are built one after another in one worker
    while nvcc compiles those built before, `jobs` (default NVCC_JOBS) at a time. UserError for
    a CPU device, an `out` that exists and is not an empty directory, or a pack over
    MAX_PACK_BYTES (nothing is left then)."""
    if device.runs_on_cpu:
        raise UserError(f"a GPU pack needs a GPU device, got {device.name} ({device.kind})")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    arch = device.target_dict().get("arch", "")
    compiled_arch = nvcc.ptx_arch(arch) if arch else ""
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would travel with the pack
        (staging / "kernels").mkdir()
        worker, compiler = Worker(), ThreadPoolExecutor(max_workers=jobs or NVCC_JOBS)
        try:
            built = []
            for (suite_name, _, w), wid in zip(chosen, workload_ids(chosen)):
                if progress:
                    progress(f"{wid}: constructing and building top-{topk}")
                built.append(_build_workload(w, suite_name, wid, device, topk, compiled_arch, worker, compiler))
            entries = [entry | {"candidates": [
                _candidate_entry(cand, key, done, compiled.result() if compiled else None, staging)
                for cand, key, done, compiled in candidates]} for entry, candidates in built]
        finally:
            compiler.shutdown(cancel_futures=True)  # on Ctrl-C, the queued compiles do not run
            worker.close()
        suites = list(dict.fromkeys(s for s, _, _ in chosen))  # their names, in order
        manifest = _manifest(device, arch, compiled_arch, suites, topk, entries)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if RUNNER.exists():
            shutil.copyfile(RUNNER, staging / "run.py")
        size = _tree_bytes(staging)
        if size > MAX_PACK_BYTES:
            raise UserError(f"the pack is {size / 2**20:.1f} MiB, over {MAX_PACK_BYTES // 2**20} MiB: "
                            "pack fewer workloads or a smaller --topk")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PackResult(out, manifest, size, time.perf_counter() - start)


def _build_workload(w: Workload, suite_name: str, wid: str, device: DeviceSpec, topk: int, arch: str,
                    worker: Worker, compiler: ThreadPoolExecutor) -> tuple[dict, list]:
    """The workload's manifest entry without its candidates, and (candidate, key, what the build
    gave, the future of its nvcc result or None) per candidate."""
    expr = w.build()
    construction = Stepper(expr, device, POLICY, Options(topk=topk)).finish()
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in expr.params}
    entry = {
        "id": wid,
        "suite": suite_name,
        "op": expr.op,
        "params": params,
        "dtype": expr.dtype,
        "flops": expr.flops,
        "min_bytes": sum(_nbytes(a.shape, a.dtype) for a in expr.args),  # each read once, the output written once
        "args": [a.to_dict() for a in expr.args],
        "reference": reference(expr.op, params, expr.args),
        "construct_seconds": construction.seconds,
    }
    candidates = []
    for cand in construction.candidates:
        outcome = worker.call(build_candidate, (construction.expr, cand.program, device), BUILD_TIMEOUT_S)
        done = outcome.value if not outcome.error else {"ok": False, "error": f"build: {outcome.error}"}
        compiled = compiler.submit(nvcc.compile_ptx, done["source"], arch) if done["ok"] else None
        candidates.append((cand, key_of(wid, cand.rank), done, compiled))
    return entry, candidates


def build_candidate(expr, program, device: DeviceSpec) -> dict:
    """Runs in a build worker: the candidate's CUDA source, template and launches as plain data,
    or `ok` False and the one-line error."""
    from workbench.codegen.build import build_kernel, pass_config, target_dict
    from workbench.codegen.rules import apply_rules
    from workbench.gpu.launch import lower_launches

    kernel = build_kernel(expr, program, device)
    if not kernel.ok:
        return {"ok": False, "error": kernel.error}
    try:
        _, sch = apply_rules(expr, program, device)
        launches, scratch = lower_launches(sch.mod, target_dict(device), pass_config(program, device),
                                           tuple(a.name for a in kernel.args))
    except Exception as err:  # TVM raises many error types; each is this candidate's failure
        return {"ok": False, "error": f"launch: {first_line(err)}"}
    missing = [l.kernel for l in launches if not re.search(rf"\b{re.escape(l.kernel)}\s*\(", kernel.source)]
    if missing:
        return {"ok": False, "error": f"launch: kernel {missing[0]} is not in the CUDA source"}
    return {"ok": True, "template": kernel.template, "source": kernel.source, "build_seconds": kernel.build_seconds,
            "launches": [l.to_dict() for l in launches], "scratch": [s.to_dict() for s in scratch]}


def _candidate_entry(cand, key: str, done: dict, compiled, folder: Path) -> dict:
    program = cand.program
    entry = {
        "rank": cand.rank,
        "key": key,
        "ok": False,
        "error": "",
        "template": done.get("template", ""),
        "plan": cand.plan_text,
        "tiles": {"grid": program.grid, "split": program.split,  # as `construct --json` shows them
                  "layers": [{"name": name, "tile": program.tile_dict(l)} for l, name in enumerate(program.layers)],
                  "vthreads": dict(program.vthreads)},
        "predicted_seconds": cand.predicted_seconds,
        "bound": cand.estimate.bottleneck,
        "launches": [],
        "scratch": [],
    }
    if not done["ok"]:
        return entry | {"error": done["error"]}
    entry |= {"launches": done["launches"], "scratch": done["scratch"],
              "build_seconds": done["build_seconds"]}
    if not compiled.ok or not compiled.cubin:
        return entry | {"error": f"nvcc: {compiled.error or 'no cubin'}"}
    reports = dict(compiled.kernels)
    for launch in entry["launches"]:
        if launch["kernel"] in reports:
            launch["ptxas"] = _ptxas_dict(reports[launch["kernel"]])
    (folder / "kernels" / f"{key}.cubin").write_bytes(compiled.cubin)
    (folder / "kernels" / f"{key}.ptx").write_text(compiled.ptx)
    return entry | {"ok": True, "cubin": f"kernels/{key}.cubin", "ptx": f"kernels/{key}.ptx",
                    "ptxas": _ptxas_dict(compiled.ptxas_report) if compiled.ptxas_report else None}


def _ptxas_dict(report) -> dict:
    return {"registers": report.registers, "spill_store_bytes": report.spill_store_bytes,
            "spill_load_bytes": report.spill_load_bytes, "stack_bytes": report.stack_bytes,
            "shared_bytes": report.shared_bytes}


def _nbytes(shape, dtype: str) -> int:
    from math import prod

    from workbench.ops.tensor_expr import DTYPE_BYTES

    return prod(shape) * DTYPE_BYTES[dtype]


def _manifest(device: DeviceSpec, spec_arch: str, arch: str, suites: Sequence[str], topk: int, entries: list) -> dict:
    from workbench.versions import versions

    found = versions()
    spec = spec_summary(device) | {"l2_bytes": device.l2_bytes, "max_blocks_per_unit": device.max_blocks_per_unit,
                                   "shared_bytes_per_unit": device.shared_bytes_per_unit,
                                   "max_threads_per_unit": device.max_threads_per_unit,
                                   "registers_per_unit": device.registers_per_unit}
    return {
        "format": FORMAT,
        "device": device.name,
        "arch": arch,
        "spec_arch": spec_arch,  # the spec's target arch; `arch` differs where nvcc dropped it (v100: sm_70)
        "spec": spec,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "workbench_version": found["workbench"],
        "git_commit": _git_commit(),
        "tvm_version": found["tvm"],
        "nvcc": _nvcc_version(),
        "policy": POLICY,
        "suites": list(suites),
        "topk": topk,
        "workloads": entries,
    }


def _git_commit() -> str | None:
    """The commit of the workbench's checkout, or None outside one (an installed package)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _nvcc_version() -> str | None:
    path = nvcc.nvcc_path()
    if path is None:
        return None
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    found = re.search(r"release [^\n]*", done.stdout)
    return found.group(0) if found else None


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
