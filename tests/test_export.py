"""Export bundles (`export_candidate`, the one path of the CLI, dashboard and widgets): the manifest
of the CLI contract with `verified` and how, a loadable library that computes what the in-process
kernel computes, a schedule script that replays to the same TVMScript, output paths refused before
anything is built, atomic writes that leave nothing behind after a failure or an interrupt, and
kernels for a machine other than this one never run here."""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import zipfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.target import codegen

from tests.helpers import device, expr, matmul
from workbench import export as export_module
from workbench import pipeline
from workbench.codegen.build import Kernel, build_kernel
from workbench.codegen.host import ISA_FLAGS, cpu_mismatch
from workbench.codegen.verify import Verification, run_kernel
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.export import (
    Check,
    KernelRejected,
    accept,
    bundle_program,
    check_here,
    check_out,
    export_candidate,
    rebuild,
    schedule_script,
)
from workbench.hardware.detect import CpuInfo, local_cpu_info
from workbench.hardware.parse import spec_from_toml_text
from workbench.models import execute
from workbench.ops.pixel_gemm import with_call_shapes
from workbench.ops.reference import random_inputs
from workbench.rtile.plan import store_vthreads
from workbench.workers import Outcome
from workbench.workload import Workload, imported_model

CPU = "local-cpu"
CASES = {
    "conv": ("conv2d", dict(N=1, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=2, pad=1)),
    "avgpool": ("avgpool", dict(N=1, C=4, H=9, W=9, K=3, stride=2, pad=1)),
    "relu": ("relu", dict(shape=(17, 11, 3))),
    "bmm": ("matmul", dict(B=2, M=20, N=33, K=7, trans_b=True)),
}


@lru_cache(maxsize=None)
def _constructed(case: str, dev: str = CPU):
    op, params = CASES[case]
    c = construct(expr(op, **params), device(dev), options=Options(topk=2))
    return c.expr, c.candidates[0]


@lru_cache(maxsize=None)
def _built(case: str):
    """The kernel built in this process (what the bundle's library must compute)."""
    fused, candidate = _constructed(case)
    kernel = build_kernel(fused, candidate.program, device(CPU))
    assert kernel.ok, kernel.error
    return fused, candidate, kernel


def _export(case: str, out, dev=CPU, **kw):
    fused, candidate = _constructed(case, dev) if isinstance(dev, str) else _constructed(case)
    spec = device(dev) if isinstance(dev, str) else dev
    return export_candidate(fused, candidate, spec, out, policy="roller", **kw)


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _foreign_cpu():
    """This machine's spec with an LLVM CPU that has an extension this CPU lacks: XOP/FMA4
    (AMD Bulldozer) and AMX/AVX512-FP16 (Intel Sapphire Rapids) are never on one CPU."""
    host = local_cpu_info()
    for mcpu in ("bdver2", "sapphirerapids"):
        target = {"kind": "llvm", "mcpu": mcpu}
        missing = cpu_mismatch(target, codegen.llvm_get_cpu_features(tvm.target.Target(target)), host)
        if missing:
            items = tuple(sorted({**dict(device(CPU).target), "mcpu": mcpu}.items()))
            return replace(device(CPU), name=f"foreign-{mcpu}", target=items), missing
    raise AssertionError("some x86 CPU lacks either XOP or AMX")


def test_manifest_follows_the_cli_contract_and_says_how_it_was_verified(tmp_path):
    result = _export("conv", tmp_path / "conv", measured_seconds=1.5e-5)
    out = result.path
    manifest = _manifest(out)
    assert {"workload", "device", "policy", "rank", "rprogram", "predicted_seconds", "measured_seconds",
            "entry", "args", "files", "versions", "verified", "verification"} <= set(manifest)
    assert manifest["workload"]["op"] == "conv2d" and manifest["workload"]["stride"] == 2
    assert manifest["device"] == device(CPU).name and manifest["policy"] == "roller" and manifest["rank"] == 1
    assert manifest["measured_seconds"] == 1.5e-5 and manifest["predicted_seconds"] > 0
    assert [(a["name"], a["shape"], a["role"]) for a in manifest["args"]] == [
        ("data", [1, 3, 9, 9], "input"),
        ("kernel", [4, 3, 3, 3], "input"),
        ("O", [1, 4, 5, 5], "output"),
    ]
    assert manifest["rprogram"] == _constructed("conv")[1].program.to_dict()
    assert set(manifest["versions"]) >= {"workbench", "tvm", "tvm_ffi", "numpy"}
    files = manifest["files"]
    assert files["kernel_source"] == "kernel.ll" and files["library"] == "kernel.so"
    for name in (files["kernel_source"], files["library"], files["schedule"], files["tvmscript"], files["assembly"]):
        assert (out / name).stat().st_size > 0
    # local-cpu runs here: the bundle's own library was run against numpy, within tolerance.
    v = manifest["verification"]
    assert manifest["verified"] is True and result.verified and v["ran"] is True and v["correct"] is True
    assert v["seed"] == 0 and v["error"] == "" and v["atol"] > 0 and v["rtol"] > 0 and v["max_abs_err"] >= 0
    assert "max abs error" in result.summary()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv"]  # no staging directory left


def test_gpu_bundle_is_unverified_unless_that_gpu_is_here(tmp_path):
    result = _export("relu", tmp_path / "g", dev="h100")
    manifest = _manifest(result.path)
    dev = tvm.cuda(0)
    here = dev.exist and dev.compute_version == "9.0"  # an H100 (sm_90) on this machine
    assert manifest["verified"] is here is result.verified
    if not here:
        assert manifest["verification"] == {"ran": False, "reason": manifest["verification"]["reason"]}
        assert "cuda" in manifest["verification"]["reason"] or "sm_90" in manifest["verification"]["reason"]
    assert "__global__" in (result.path / "kernel.cu").read_text()


def test_kernel_for_a_cpu_this_one_is_not_never_runs_here(tmp_path):
    foreign, missing = _foreign_cpu()
    result = _export("relu", tmp_path / "f", dev=foreign)  # in this (the test's) process: it lives on
    manifest = _manifest(result.path)
    assert manifest["verified"] is False and not result.verified
    v = manifest["verification"]
    assert v["ran"] is False and v["reason"] == missing
    # The same schedule, compiled for this CPU, was checked instead.
    host = v["host_check"]
    assert host["correct"] is True and host["target"]["mcpu"] == device(CPU).target_dict()["mcpu"]
    assert manifest["target"]["mcpu"] == foreign.target_dict()["mcpu"]


def test_loaded_library_matches_the_in_process_kernel(tmp_path):
    out = _export("avgpool", tmp_path / "pool").path
    fused, _, kernel = _built("avgpool")
    inputs = random_inputs(fused, seed=5)
    library = tvm.runtime.load_module(str(out / "kernel.so"))
    result = tvm.runtime.tensor(np.zeros(kernel.args[-1].shape, kernel.args[-1].dtype))
    library[kernel.entry](*(tvm.runtime.tensor(a) for a in inputs), result)
    np.testing.assert_array_equal(result.numpy(), run_kernel(kernel, inputs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_script_replays_to_the_kernels_tvmscript(case, tmp_path):
    fused, _, kernel = _built(case)
    path = tmp_path / "schedule.py"
    path.write_text(schedule_script(kernel, fused))
    replayed = runpy.run_path(str(path))["schedule"]()
    # the shipped kernel takes the caller's shapes where the schedule laid buffers out otherwise
    assert with_call_shapes(replayed.mod, kernel.args).script() == kernel.tvmscript
    assert ("lays buffers out along the operator's fused axes" in path.read_text()) == bool(kernel.views)


def test_kernel_that_does_not_build_is_refused_and_nothing_is_left(tmp_path):
    fused, _ = _constructed("relu")
    _, conv = _constructed("conv")  # a conv rProgram cannot schedule relu
    with pytest.raises(KernelRejected, match="did not build, nothing exported"):
        export_candidate(fused, conv, device(CPU), tmp_path / "a" / "b" / "x", policy="roller")
    assert list(tmp_path.iterdir()) == []  # neither the staging directory nor the parents made for it


def test_wrong_kernel_is_refused(tmp_path):
    # A relu library checked as gelu (same arguments) is a kernel that computes the wrong thing.
    relu, candidate, kernel = _built("relu")
    gelu = construct(expr("gelu", shape=(17, 11, 3)), device(CPU)).expr  # fused as relu is
    assert [a.shape for a in gelu.tensors] == [a.shape for a in relu.tensors]
    kernel.executable.export_library(str(tmp_path / "relu.so"))
    check = check_here(replace(kernel, executable=None), str(tmp_path / "relu.so"), gelu, candidate, device(CPU), 0)
    assert check.verification is not None and not check.verification.correct
    with pytest.raises(KernelRejected, match="gives wrong results, nothing exported"):
        accept(1, Outcome(check))
    right = check_here(replace(kernel, executable=None), str(tmp_path / "relu.so"), relu, candidate, device(CPU), 0)
    assert accept(1, Outcome(right)) is right and right.verification.correct


@pytest.mark.parametrize("outcome, message", [
    (Outcome(error="worker crashed (signal SIGILL)"), "failed when run on this machine.*SIGILL"),
    (Outcome(error="timed out after 60 s"), "failed when run on this machine.*timed out"),
    (Outcome(Check(None, "no cuda device", Verification(False, error="max abs error 0.3"), "{}")), "schedule fails its check"),
])
def test_a_crash_a_timeout_or_a_wrong_schedule_refuses_the_export(outcome, message):
    with pytest.raises(KernelRejected, match=message):
        accept(3, outcome)


def _features(target: dict) -> set[str]:
    return set(codegen.llvm_get_cpu_features(tvm.target.Target(target)))


def _host(mcpu: str) -> CpuInfo:
    """A generated x86 host: the /proc/cpuinfo flags of the extensions LLVM gives `mcpu`."""
    table = ISA_FLAGS["x86_64"]
    flags = frozenset(table[f] for f in _features({"kind": "llvm", "mcpu": mcpu}) if f in table)
    return CpuInfo(f"a {mcpu} CPU", "intel", "x86_64", flags, None)


@pytest.mark.parametrize("host, target, reason", [
    ("haswell", {"kind": "llvm"}, ""),
    ("haswell", {"kind": "llvm", "mcpu": "haswell"}, ""),
    ("skylake-avx512", {"kind": "llvm", "mcpu": "haswell"}, ""),
    ("skylake-avx512", {"kind": "llvm", "mcpu": "skylake-avx512"}, ""),
    ("haswell", {"kind": "llvm", "mcpu": "skylake-avx512"},
     "the target needs adx, aes, avx512bw, avx512cd, avx512dq, avx512f, avx512vl, which this CPU (a haswell CPU) lacks"),
    ("skylake-avx512", {"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["+avx512vnni"]},
     "the target needs avx512vnni, which this CPU (a skylake-avx512 CPU) lacks"),
    ("haswell", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
     "built for aarch64 (mtriple aarch64-linux-gnu), this machine is x86_64"),
])
def test_cpu_mismatch_names_missing_instruction_extensions_only(host, target, reason):
    # LLVM's lists also hold tuning features (prefer-256-bit, slow-3ops-lea) that differ between
    # CPUs which run the same code: those never count as missing.
    assert cpu_mismatch(target, _features(target), _host(host)) == reason


def test_cpu_mismatch_on_an_unknown_host_lets_the_worker_tell():
    host = CpuInfo("?", "unknown", "unknown", frozenset(), None)
    assert cpu_mismatch({"kind": "llvm", "mcpu": "skylake-avx512"}, {"avx512f"}, host) == ""


# -- output paths: refused before anything is built -----------------------------------------------


@pytest.fixture
def no_build(monkeypatch):
    """Any build (a worker started) fails the test: refusals must come first."""

    class Refused:
        def __init__(self, *_):
            raise AssertionError("a worker was started for a refused output path")

    monkeypatch.setattr(export_module, "Worker", Refused)


def _bad_paths(tmp_path) -> dict:
    (tmp_path / "file").write_text("mine")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    return {
        "under a regular file": (tmp_path / "file" / "x", "is not a directory"),
        "too long a name": (tmp_path / ("n" * 300) / "x", "300 bytes"),
        "too long a bundle name": (tmp_path / ("n" * 256), "256 bytes"),
        "dangling symlink": (tmp_path / "dangling", "broken symbolic link"),
        "under a dangling symlink": (tmp_path / "dangling" / "x", "broken symbolic link"),
        "a symlink": (tmp_path / "link", "symbolic link"),
        "an existing file": (tmp_path / "file", "exists"),
        # sysfs takes no new entries, root included (permission bits would not stop root).
        "a directory nobody may write": ("/sys/workbench-bundle", "cannot write in /sys"),
        "empty": ("  ", "give an output path"),
    }


@pytest.mark.parametrize("case", ["under a regular file", "too long a name", "too long a bundle name", "dangling symlink",
                                  "under a dangling symlink", "a symlink", "an existing file",
                                  "a directory nobody may write", "empty"])
def test_bad_output_path_is_refused_before_building(case, tmp_path, no_build):
    out, message = _bad_paths(tmp_path)[case]
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UserError, match=message) as err:
        _export("relu", out)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=message):
        check_out(out)
    assert sorted(os.listdir(tmp_path)) == before and not os.path.exists("/sys/workbench-bundle")


def test_existing_non_empty_directory_is_refused_and_left_alone(tmp_path, no_build):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        _export("relu", out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_empty_directory_is_filled(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert (_export("relu", out).path / "manifest.json").is_file()


def test_missing_parents_are_made(tmp_path):
    assert _export("relu", tmp_path / "a" / "b" / "c").path == tmp_path / "a" / "b" / "c"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["c"]


def test_zip_bundle(tmp_path):
    out = _export("relu", tmp_path / "relu", zip=True).path
    assert out == tmp_path / "relu.zip" and not (tmp_path / "relu").exists()
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
    assert {"manifest.json", "kernel.so", "kernel.ll", "schedule.py", "kernel_tvmscript.py"} <= names
    assert manifest["workload"]["op"] == "relu" and manifest["verified"] is True
    assert _export("relu", tmp_path / "named.zip", zip=True).path == tmp_path / "named.zip"
    with pytest.raises(UserError, match="exists"):
        _export("relu", tmp_path / "relu", zip=True)  # relu.zip exists now
    assert sorted(os.listdir(tmp_path)) == ["named.zip", "relu.zip"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_interrupt_mid_export_leaves_nothing(interrupt, tmp_path, monkeypatch):
    # In-process stand-in for Ctrl-C while the kernel is checked (tests/test_cli.py sends real
    # signals to a real `workbench export`).
    real_call = export_module.Worker.call

    def interrupted(self, fn, args, timeout_s):
        if fn is check_here:
            raise interrupt()
        return real_call(self, fn, args, timeout_s)

    monkeypatch.setattr(export_module.Worker, "call", interrupted)
    with pytest.raises(interrupt):
        _export("relu", tmp_path / "new" / "bundle")
    assert os.listdir(tmp_path) == []


def test_bundle_name_is_one_safe_file_name():
    name = export_module.bundle_name("matmul M=1,N=2 ../..", "h100", "roller", "rank1")
    assert "/" not in name and " " not in name and not name.startswith(".")
    assert len(export_module.bundle_name("x" * 500)) <= export_module.BUNDLE_NAME_CHARS
    assert export_module.bundle_name("..") == "bundle"


def test_build_apart_returns_a_failure_instead_of_raising():
    fused, _ = _constructed("relu")
    _, conv = _constructed("conv")
    failed = export_module.build_apart(fused, conv, device(CPU))
    assert not failed.ok and failed.error and failed.executable is None
    built = export_module.build_apart(*_constructed("relu"), device(CPU))
    assert built.ok and built.source and isinstance(built, Kernel)


# -- rebuilding from the manifest ------------------------------------------------------------------


def _bundle_sources(path) -> list[tuple[str, bytes]]:
    """The kernel's text files of a bundle as the manifest lists them: (file name, bytes)."""
    files = _manifest(path)["files"]
    names = [files["kernel_source"]] + ([files["assembly"]] if "assembly" in files else [])
    return [(name, (path / name).read_bytes()) for name in names]


def _rebuilt_sources(path, model=None) -> list[tuple[str, bytes]]:
    kernel = rebuild(path, model)
    assert kernel.ok, kernel.error
    assert json.loads(kernel.target) == _manifest(path)["target"]
    assert json.loads(kernel.pass_config) == _manifest(path)["pass_config"]
    return [(f"kernel.{suffix}", text.encode()) for suffix, text in kernel.sources]


@pytest.mark.parametrize("case, foreign", [("conv", False), ("relu", False), ("relu", True)])
def test_a_cpu_bundle_rebuilds_from_its_manifest_byte_for_byte(case, foreign, tmp_path):
    """conv: a padded input; relu: axes fused ([17, 11, 3] -> [561]), which the manifest's
    rProgram names and the rebuild must redo; foreign: a spec that is no preset and not this
    machine's, which only the manifest's device_spec can give back."""
    spec = _foreign_cpu()[0] if foreign else device(CPU)
    path = _export(case, tmp_path / "b", dev=spec if foreign else CPU).path
    assert spec_from_toml_text(_manifest(path)["device_spec"]) == spec
    program, rebuilt_on = bundle_program(path)
    assert program == _constructed(case)[1].program and rebuilt_on == spec
    sources = _bundle_sources(path)
    assert [name for name, _ in sources] == ["kernel.ll", "kernel.s"]
    assert _rebuilt_sources(path) == sources


def test_tbaa_names_taken_from_addresses_are_renamed_with_their_access_widths():
    """What the byte-for-byte rebuild rests on, on any CPU: AVX-512 convolutions give a buffer's
    TBAA node per vector width (`<address>.w64.b0`), named after an address of the compiling
    process, as plain nodes are."""
    from workbench.codegen.build import _stable_ir

    def ir(a, b):
        return (f'!1 = !{{!"{a}", !9, i64 0}}\n!2 = !{{!"{a}.w64.b0", !3, i64 0}}\n'
                f'!3 = !{{!"{a}.w128.b0", !4, i64 0}}\n!5 = !{{!"{b}.w16.b64", !6, i64 0}}\n')

    first, second = _stable_ir(ir("0x55e879cd30d0", "0x55e879cd4000")), _stable_ir(ir("0x55f3d4d70720", "0x55f3d4d7a000"))
    assert first == second and "0x" not in first
    assert '"tvm-tbaa-buffer-0.w128.b0"' in first and '"tvm-tbaa-buffer-1.w16.b64"' in first


@lru_cache(maxsize=None)
def _markov_gpu():
    """A Markov candidate for a V100 with virtual threads (as in tests/test_profile_session.py)
    other than those the plan interleaves a program without them by (`plan.store_vthreads`)."""
    c = construct(matmul(512, 512, 512), device("v100"), "markov", Options(topk=4))
    return c, next(x for x in c.candidates if x.program.vthreads
                   and x.program.vthreads != store_vthreads(replace(x.program, vthreads=()), c.device))


def test_a_markov_gpu_bundle_rebuilds_with_its_virtual_threads(tmp_path):
    c, cand = _markov_gpu()
    path = export_candidate(c.expr, cand, c.device, tmp_path / "gpu", policy="markov").path
    program, spec = bundle_program(path)
    assert program.vthreads == cand.program.vthreads and program == cand.program and spec == c.device
    sources = _bundle_sources(path)
    assert [name for name, _ in sources] == ["kernel.cu"]
    assert _rebuilt_sources(path) == sources


def _tampered(path, out, change) -> None:
    out.mkdir()
    manifest = _manifest(path)
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_a_tampered_manifest_rebuilds_a_different_kernel(tmp_path):
    """The comparison above can fail: another candidate's tiles, or the same program without its
    virtual threads, give another CUDA source than the bundle's."""
    c, cand = _markov_gpu()
    path = export_candidate(c.expr, cand, c.device, tmp_path / "gpu", policy="markov").path
    other = next(x for x in c.candidates if x.program.tiles != cand.program.tiles)
    _tampered(path, tmp_path / "tiles", lambda m: m.update(rprogram=other.program.to_dict()))
    _tampered(path, tmp_path / "plain", lambda m: m["rprogram"].update(vthreads={}))
    bundled = (path / "kernel.cu").read_text()
    for name in ("tiles", "plain"):
        kernel = rebuild(tmp_path / name)
        assert kernel.ok, kernel.error
        assert kernel.source and kernel.source != bundled, name


@pytest.fixture(scope="module")
def relu_bundle(tmp_path_factory):
    return _export("relu", tmp_path_factory.mktemp("relu") / "b").path


def _drop(key):
    return lambda m: m.pop(key)


@pytest.mark.parametrize("change, message", [
    (_drop("device_spec"), "no device_spec"),
    (_drop("rprogram"), "no rprogram"),
    (lambda m: m["workload"].update(op="nonesuch"), "unknown operator 'nonesuch'"),
    (lambda m: m["workload"].update(op="expr"), "workload.expr must be the expression's text"),
    (lambda m: m.update(device_spec="[device]\nname = 1\n"), "device_spec"),
    (lambda m: m["rprogram"].pop("layers"), "rprogram is malformed"),
])
def test_a_bad_manifest_is_a_user_error_naming_it(change, message, relu_bundle, tmp_path):
    _tampered(relu_bundle, tmp_path / "bad", change)
    with pytest.raises(UserError, match=message) as err:
        rebuild(tmp_path / "bad")
    assert "manifest" in str(err.value) and "\n" not in str(err.value)


def test_a_missing_or_unreadable_manifest_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        rebuild(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match="not JSON"):
        rebuild(tmp_path)
    (tmp_path / "manifest.json").write_text("[]")
    with pytest.raises(UserError, match="not a JSON object"):
        rebuild(tmp_path)


# -- an operator of a model ------------------------------------------------------------------------

MODEL = Path(__file__).resolve().parents[1] / "sample_models" / "resnet_block.onnx"


@lru_cache(maxsize=None)
def _model_operator(index: int = 0):
    """(workload, construction) of operator `index` of the sample ResNet block: a conv with its
    batch norm and ReLU fused, whose filters are a weight of every call (laid out ahead)."""
    w = Workload(model=str(MODEL), operator=index)
    return w, pipeline.construct(pipeline.request(w, CPU, "roller", pipeline.Options(topk=2)))


def test_an_operator_of_a_model_is_checked_in_a_run_of_the_model_and_rebuilds_from_that_model(tmp_path):
    w, c = _model_operator()
    result = pipeline.export(c, 1, tmp_path / "b", workload=w)
    m = _manifest(result.path)
    assert result.verified and m["verification"]["correct"]
    assert m["verification"]["method"] == export_module.MODEL_METHOD and "default lowering" in result.summary()
    assert m["model"] == {"file": MODEL.name, "sha256": hashlib.sha256(MODEL.read_bytes()).hexdigest(), "operator": 0,
                          "function": imported_model(str(MODEL)).operators[0].func_name, "dims": {}}
    assert [p["index"] for p in m["prepacked"]] == [1]  # the filters, laid out by the library's pack0
    program, _ = bundle_program(result.path, MODEL)
    assert program == c.candidate(1).program
    assert _rebuilt_sources(result.path, MODEL) == _bundle_sources(result.path)
    with pytest.raises(UserError, match="needs the model file"):
        rebuild(result.path)
    with pytest.raises(UserError, match="is not the one the kernel was built for"):
        rebuild(result.path, MODEL.parent / "mlp.onnx")


def test_an_operator_of_a_model_exported_without_its_model_is_refused_before_building(tmp_path, no_build):
    _, c = _model_operator()
    with pytest.raises(UserError, match="no numpy reference"):
        pipeline.export(c, 1, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_the_model_operators_check_can_fail(monkeypatch):
    """verify_operator compares the kernel with the default lowering's outputs: moved by 0.01 (100x
    its tolerance at these magnitudes), the same kernel is wrong."""
    w, c = _model_operator()
    model = imported_model(str(MODEL))
    kernel = build_kernel(c.expr, c.candidate(1).program, c.device)
    assert execute.verify_operator(kernel, model, 0, c.device).correct
    real = execute.operator_references

    def moved(*args):
        return {name: (call[0], tuple(o + np.float32(0.01) for o in call[1])) for name, call in real(*args).items()}

    monkeypatch.setattr(execute, "operator_references", moved)
    v = execute.verify_operator(kernel, model, 0, c.device)
    assert not v.correct and "off by up to 1.00e-02" in v.error
