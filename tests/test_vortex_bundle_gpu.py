"""A Vortex bundle for a GPU preset: each chosen kernel is built through the CUDA template with a
symbolic grid (T * outer tile), its CUDA source written beside its library and, where nvcc is on
PATH, compiled to PTX with ptxas's registers and spills in the manifest. No GPU kernel runs here:
without a CUDA device the manifest says it is unverified, and `vortex run` refuses it in one line."""

import re
import shutil

import pytest

from workbench import pipeline
from workbench.cli import main
from workbench.codegen import nvcc
from workbench.errors import UserError
from workbench.vortex import bundle as vortex
from workbench.workload import workload_from_args

pytestmark = pytest.mark.tvm


def _workload(shape="M=dyn,K=64,N=64", dtype="float32"):
    return workload_from_args("matmul", shape, None, None, dtype)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("vortex-gpu") / "mm"
    return vortex.compile_bundle(_workload(), pipeline.load_device("v100"), out, max_extent=256, limit=2)


def test_sources_are_written_with_a_symbolic_grid(gpu):
    m = gpu.manifest
    assert m["device"] == "v100" and m["failed"] == [] and 1 <= len(m["kernels"]) <= 2
    for k in m["kernels"]:
        assert k["template"] == "cuda" and gpu.library(k["id"]).is_file()
        source = (gpu.path / k["source"]).read_text()
        # the number of outer tiles is the kernel's last argument (the host sizes the grid by it)
        assert re.search(r"__global__ void .*main_kernel\([^)]*, int T\)", source) and "blockIdx.x" in source


def test_the_manifest_says_whether_the_kernels_were_verified(gpu):
    m = gpu.manifest
    if vortex.gpu_here():  # a CUDA device: verified as on a CPU
        assert m["verified"] is True and "why" not in m
        assert all(c["correct"] for k in m["kernels"] for c in k["verified"])
    else:
        assert m["verified"] is False and m["why"] == "no GPU here"
        assert all("verified" not in k for k in m["kernels"])


def test_nvcc_compiles_each_kernel_to_ptx_with_a_register_report(gpu):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH (a tool-presence skip: CI has no CUDA toolkit)")
    for k in gpu.manifest["kernels"]:
        ptx = (gpu.path / k["ptx"]).read_text()
        assert ".entry main_kernel" in ptx and k["arch"].startswith("sm_")
        assert 0 < k["ptxas"]["registers"] <= 255
        assert k["ptxas"]["spill_store_bytes"] >= 0 and "nvcc" not in k


def test_without_nvcc_the_manifest_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: None)
    b = vortex.compile_bundle(_workload(), pipeline.load_device("h100"), tmp_path / "b", max_extent=128, limit=1)
    (k,) = b.manifest["kernels"]
    assert k["nvcc"] == "not found" and "ptx" not in k and (b.path / k["source"]).is_file()
    assert sorted(p.name for p in b.path.iterdir()) == sorted(
        [k["library"], k["source"], "manifest.json", "dispatch.json", "device.toml"])


def test_a_kernel_nvcc_refuses_is_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(nvcc, "nvcc_path", lambda: "/nvcc")
    monkeypatch.setattr(nvcc, "compile_ptx_many",
                        lambda sources, arch: tuple(nvcc.PtxResult(False, error="k.cu(1): error: broken") for _ in sources))
    with pytest.raises(UserError, match="no kernel built and verified; first failure: nvcc: k.cu\\(1\\): error: broken"):
        vortex.compile_bundle(_workload(), pipeline.load_device("v100"), tmp_path / "b", max_extent=128, limit=1)
    assert not (tmp_path / "b").exists()


def test_a_float16_bundle_takes_the_tensor_cores(tmp_path):
    b = vortex.compile_bundle(_workload(dtype="float16"), pipeline.load_device("a100"), tmp_path / "b",
                              max_extent=128, limit=1)
    (k,) = b.manifest["kernels"]
    assert k["template"] == "cuda-wmma" and "wmma::mma_sync" in (b.path / k["source"]).read_text()


def test_run_refuses_a_gpu_bundle_without_a_cuda_device(gpu, capsys, monkeypatch):
    monkeypatch.setattr(vortex, "gpu_here", lambda: False)
    with pytest.raises(UserError, match="its kernels are for the GPU v100, and there is no CUDA device here"):
        vortex.run(gpu, 77)
    code = main(["vortex", "run", str(gpu.path), "--shape", "M=77"])
    _, err = capsys.readouterr()
    assert code == 2 and "no CUDA device here" in err and err.count("\n") == 1


def test_compile_through_the_cli_reports_registers_or_why_not(tmp_path, capsys):
    code = main(["vortex", "compile", "--op", "matmul", "--shape", "M=dyn,K=64,N=64", "--device", "v100",
                 "--out", str(tmp_path / "b"), "--max-extent", "128"])
    out, _ = capsys.readouterr()
    head, *kernels = out.strip().splitlines()
    b = vortex.load_bundle(tmp_path / "b")
    assert code == 0 and b.table.device.name == "v100" and len(kernels) == len(b.manifest["kernels"]) >= 1
    if vortex.gpu_here():
        assert "not verified" not in head
    else:
        assert head.endswith(", not verified (no GPU here)")
    for line in kernels:  # a register report where nvcc ran, else why not
        assert re.search(r"k\d+\.ptx: \d+ registers, \d+ B spilled$", line) or line.endswith("nvcc: not found")


def test_a_kernel_that_cannot_run_on_the_gpu_present_is_a_wrong_result_not_a_crash(gpu, capsys, monkeypatch):
    def refused(library, device):
        raise RuntimeError("CUDA: no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(vortex, "gpu_here", lambda: True)
    monkeypatch.setattr(vortex, "load_kernel", refused)
    doc = vortex.run(gpu, 77)
    assert doc["correct"] is False and doc["measured_seconds"] is None and doc["shape"]["M"] == 77
    assert doc["error"] == "RuntimeError: CUDA: no kernel image is available for execution on the device"
    code = main(["vortex", "run", str(gpu.path), "--shape", "M=77"])
    out, _ = capsys.readouterr()
    assert code == 1 and "WRONG: RuntimeError: CUDA: no kernel image" in out
