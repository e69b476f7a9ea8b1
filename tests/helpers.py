"""Shared test helpers: catalog expressions and device specs, built once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

from workbench.hardware.loader import load_spec
from workbench.hardware.spec import DeviceSpec, MemoryLayer
from workbench.ops import catalog
from workbench.ops.tensor_expr import TensorExpr

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "specs" / "suites"
# The fast lane (`make test-fast`, WORKBENCH_TEST_LANE=fast) runs the pure core without TVM: its
# catalog expressions come from this file, which `make fixtures` writes from real TVM builds and
# which tests/test_tensor_expr.py checks against fresh builds in every full run.
EXPR_FIXTURES = ROOT / "tests" / "fixtures" / "tensor_exprs.json"
FAST_LANE = os.environ.get("WORKBENCH_TEST_LANE") == "fast"
RECORDED: dict[str, dict] = {}  # expressions built in this session (written by `make fixtures`)
CONSTRUCT_DEVICES = ("v100", "h100", "a100", "k80", "mi50", "local-cpu")

# A 2-core CPU in the shape of the development machine, fixed here so that tests do not depend on
# the machine they run on (`local-cpu` is detected). Numbers as in specs/devices/xeon-avx512.toml
# scaled to two cores.
TINY_CPU = DeviceSpec(
    name="tiny-cpu",
    kind="cpu",
    vendor="intel",
    layers=(
        MemoryLayer("registers", "thread", 1792, 2000.0, 64, 0.3),
        MemoryLayer("L1", "unit", 32768, 400.0, 64, 1.5, ways=8),
        MemoryLayer("L2", "unit", 1048576, 200.0, 64, 5.0),
        MemoryLayer("DRAM", "device", 16 * 2**30, 20.0, 64, 80.0),
    ),
    compute_units=2,
    warp_size=16,
    teu_per_unit=1,
    max_threads_per_block=1,
    max_threads_per_unit=1,
    registers_per_thread_cap=28,
    registers_per_unit=32,
    peak_gflops=(("float32", 200.0),),
)


@cache
def device(name: str) -> DeviceSpec:
    """A preset (or `local-cpu`) by name; `tiny-cpu` is the fixed CPU above."""
    # The fast lane has no TVM to ask about targets; the full lane checks every preset's target.
    return TINY_CPU if name == TINY_CPU.name else load_spec(name, check_target=not FAST_LANE)


def _freeze(params: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def fixture_key(op: str, frozen: tuple, dtype: str) -> str:
    return json.dumps([op, dtype, [[k, list(v) if isinstance(v, tuple) else v] for k, v in frozen]])


@cache
def expr_fixtures() -> dict[str, dict]:
    return json.loads(EXPR_FIXTURES.read_text()) if EXPR_FIXTURES.exists() else {}


@cache
def _build(op: str, frozen: tuple, dtype: str):
    key = fixture_key(op, frozen, dtype)
    if FAST_LANE:
        if key not in expr_fixtures():
            raise LookupError(f"{key} is not in {EXPR_FIXTURES.name}: run `make fixtures`")
        return TensorExpr.from_dict(expr_fixtures()[key])
    built = catalog.build(op, dict(frozen), dtype)
    RECORDED[key] = built.to_dict()
    return built


def expr(op: str, dtype: str = "float32", **params):
    """The catalog operator `op` as a TensorExpr (cached: building a PrimFunc costs milliseconds)."""
    return _build(op, _freeze(params), dtype)


def matmul(m: int, n: int, k: int):
    # The fast lane takes any size (hypothesis draws them) from the plain-value twin below.
    return plain_matmul(m, n, k) if FAST_LANE else expr("matmul", M=m, N=n, K=k)


def plain_matmul(m: int, n: int, k: int) -> TensorExpr:
    """The catalog's float32 matmul `C[i,j] += A[i,k] * B[k,j]` written out as plain values (no
    TVM); tests/test_tensor_expr.py checks it equals what the catalog builds."""
    def access(name, shape, role, *dims):
        return {"name": name, "shape": list(shape), "dtype": "float32", "role": role,
                "index": [[[int(a == d) for a in "ijk"], 0] for d in dims]}

    return TensorExpr.from_dict({
        "op": "matmul",
        "params": [["B", 0], ["K", k], ["M", m], ["N", n], ["trans_a", False], ["trans_b", False]],
        "axes": [{"name": a, "extent": x, "kind": kind, "fused_from": []}
                 for a, x, kind in (("i", m, "spatial"), ("j", n, "spatial"), ("k", k, "reduce"))],
        "tensors": [access("A", (m, k), "input", "i", "k"), access("B", (k, n), "input", "k", "j"),
                    access("C", (m, n), "output", "i", "j")],
        "dtype": "float32",
        "flops": 2 * m * n * k,
        "main_block": "C",
        "args": [{"name": name, "shape": list(shape), "dtype": "float32", "role": role}
                 for name, shape, role in (("A", (m, k), "input"), ("B", (k, n), "input"), ("C", (m, n), "output"))],
        "epilogues": [],
        "pads_reduction": True,
    })


def suite_workloads(name: str) -> list[dict]:
    """The `[[workload]]` tables of specs/suites/<name>.toml."""
    with open(SUITES / f"{name}.toml", "rb") as f:
        return tomllib.load(f)["workload"]


def workload_expr(workload: dict):
    params = {k: v for k, v in workload.items() if k not in ("id", "op", "dtype")}
    return expr(workload["op"], workload.get("dtype", "float32"), **params)


def unique_workloads(*suites: str) -> list[tuple[str, dict]]:
    """(suite:id, workload) for every distinct (op, dtype, params) of the suites, first id kept."""
    seen, out = set(), []
    for suite in suites:
        for w in suite_workloads(suite):
            key = _freeze({k: v for k, v in w.items() if k != "id"})
            if key not in seen:
                seen.add(key)
                out.append((f"{suite}:{w['id']}", w))
    return out


def stat_cpu_ticks(path: str | Path, children: bool = False) -> int:
    """User + system CPU clock ticks in a /proc `stat` file (a process's or a thread's), with its
    waited-for children's where `children`. The fields after the command name, which may hold
    spaces and parentheses, are read past its last ')'."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15 if children else 13])


def user_error_in_child(module: str, call: str, path, timeout: int = 120) -> str:
    """The UserError message of `module.call(path)` run in a child process with a time limit
    (empty when it raises none): should a regression block on a FIFO, read /dev/zero without end
    or construct a huge tensor for hours, the test fails instead of hanging."""
    name = call.split("(")[0]
    code = (
        f"import sys\nfrom workbench.errors import UserError\nfrom {module} import {name}\n"
        f"try:\n    {call.replace('PATH', 'sys.argv[1]')}\nexcept UserError as err:\n    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.strip()


def fake_runs_store(path, runs, sizes=(32, 48), topk: int = 3):
    """A runs store at `path` holding, per (run label, FakeRunner) of `runs`, one fake-profiled run
    per matmul size of `sizes` on TINY_CPU (workload label `mm-N`), stored under that run label;
    returns the store's path."""
    from workbench.construct.space import Options
    from workbench.construct.stepper import construct
    from workbench.profile.runner import Timing
    from workbench.profile.session import profile_candidates
    from workbench.profile.store import RunStore

    with RunStore(path) as store:
        for label, runner in runs:
            for n in sizes:
                c = construct(matmul(n, n, n), TINY_CPU, options=Options(topk=topk))
                profile_candidates(c.expr, TINY_CPU, c.candidates, runner=runner, store=store, workload_label=f"mm-{n}",
                                   run_label=label, options=c.options, timing=Timing(repeat=7))
    return path


def built_view_kernels(expr, topk: int = 3) -> list:
    """The kernels of `expr`'s top `topk` on the local CPU, constructed over its view (a conv as a
    GEMM: `ops.pixel_gemm`, `ops.window_gemm`), each asserted to build, to take the caller's
    buffers and to match numpy; with the construction's candidates, in order."""
    from workbench.codegen.build import build_kernel
    from workbench.codegen.verify import verify
    from workbench.construct.space import Options
    from workbench.construct.stepper import construct

    dev = device("local-cpu")
    built = []
    for cand in construct(expr, dev, options=Options(topk=topk)).candidates:
        kernel = build_kernel(cand.program.expr, cand.program, dev)
        assert kernel.ok, kernel.error
        assert [a.shape for a in kernel.args] == [a.shape for a in expr.args]
        result = verify(kernel, cand.program.expr)
        assert result.correct, result
        built.append((cand, kernel))
    return built
