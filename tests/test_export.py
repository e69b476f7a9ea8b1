"""Export bundles: the manifest of the CLI contract, a loadable library that computes what the
in-process kernel computes, a schedule script that replays to the same TVMScript, atomic writes
and refusals."""

from __future__ import annotations

import json
import runpy
import zipfile
from functools import lru_cache

import numpy as np
import pytest
import tvm

from tests.helpers import device, expr
from workbench.codegen.build import Kernel, build_kernel
from workbench.codegen.export import export_bundle, schedule_script
from workbench.codegen.verify import run_kernel
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.ops.reference import random_inputs

CPU = "local-cpu"
CASES = {
    "conv": ("conv2d", dict(N=1, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=2, pad=1)),
    "avgpool": ("avgpool", dict(N=1, C=4, H=9, W=9, K=3, stride=2, pad=1)),
    "relu": ("relu", dict(shape=(17, 11, 3))),
    "bmm": ("matmul", dict(B=2, M=20, N=33, K=7, trans_b=True)),
}


@lru_cache(maxsize=None)
def _built(case: str):
    op, params = CASES[case]
    c = construct(expr(op, **params), device(CPU))
    candidate = c.candidates[0]
    kernel = build_kernel(c.expr, candidate.program, device(CPU))
    assert kernel.ok, kernel.error
    return c.expr, candidate, kernel


def _export(case: str, out, **kw):
    fused, candidate, kernel = _built(case)
    return export_bundle(
        kernel, fused, candidate.program, device(CPU), out, policy="roller", rank=1,
        predicted_seconds=candidate.estimate.predicted_seconds, **kw,
    )


def test_manifest_follows_the_cli_contract(tmp_path):
    out = _export("conv", tmp_path / "conv", measured_seconds=1.5e-5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"workload", "device", "policy", "rank", "rprogram", "predicted_seconds", "measured_seconds",
            "entry", "args", "files", "versions"} <= set(manifest)
    assert manifest["workload"]["op"] == "conv2d" and manifest["workload"]["stride"] == 2
    assert manifest["device"] == device(CPU).name and manifest["policy"] == "roller" and manifest["rank"] == 1
    assert manifest["measured_seconds"] == 1.5e-5 and manifest["predicted_seconds"] > 0
    assert [(a["name"], a["shape"], a["role"]) for a in manifest["args"]] == [
        ("data", [1, 3, 9, 9], "input"),
        ("kernel", [4, 3, 3, 3], "input"),
        ("O", [1, 4, 5, 5], "output"),
    ]
    assert manifest["rprogram"] == _built("conv")[1].program.to_dict()
    assert set(manifest["versions"]) >= {"workbench", "tvm", "tvm_ffi", "numpy"}
    files = manifest["files"]
    assert files["kernel_source"] == "kernel.ll" and files["library"] == "kernel.so"
    for name in (files["kernel_source"], files["library"], files["schedule"], files["tvmscript"], files["assembly"]):
        assert (out / name).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv"]  # no staging directory left


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_script_replays_to_the_kernels_tvmscript(case, tmp_path):
    fused, _, kernel = _built(case)
    path = tmp_path / "schedule.py"
    path.write_text(schedule_script(kernel, fused))
    replayed = runpy.run_path(str(path))["schedule"]()
    assert replayed.mod.script() == kernel.tvmscript


def test_loaded_library_matches_the_in_process_kernel(tmp_path):
    out = _export("avgpool", tmp_path / "pool")
    fused, _, kernel = _built("avgpool")
    inputs = random_inputs(fused, seed=5)
    library = tvm.runtime.load_module(str(out / "kernel.so"))
    result = tvm.runtime.tensor(np.zeros(kernel.args[-1].shape, kernel.args[-1].dtype))
    library[kernel.entry](*(tvm.runtime.tensor(a) for a in inputs), result)
    np.testing.assert_array_equal(result.numpy(), run_kernel(kernel, inputs))


def test_failed_kernel_is_refused(tmp_path):
    fused, candidate, _ = _built("relu")
    with pytest.raises(UserError, match="failed"):
        export_bundle(Kernel(ok=False, error="schedule: no"), fused, candidate.program, device(CPU),
                      tmp_path / "x", policy="roller", rank=1, predicted_seconds=1.0)
    assert not (tmp_path / "x").exists()


def test_existing_non_empty_directory_is_refused_and_left_alone(tmp_path):
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
    assert (_export("relu", out) / "manifest.json").is_file()


def test_zip_bundle(tmp_path):
    out = _export("relu", tmp_path / "relu", zip=True)
    assert out == tmp_path / "relu.zip" and not (tmp_path / "relu").exists()
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
    assert {"manifest.json", "kernel.so", "kernel.ll", "schedule.py", "kernel_tvmscript.py"} <= names
    assert manifest["workload"]["op"] == "relu"
    assert _export("relu", tmp_path / "named.zip", zip=True) == tmp_path / "named.zip"
    with pytest.raises(UserError):
        _export("relu", tmp_path / "relu", zip=True)  # relu.zip exists now
