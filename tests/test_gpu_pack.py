"""`workbench gpu pack` and `gpu ingest` (docs/gpu.md, the format: shared/GPU-PACK.md): a pack of
small workloads checked against the contract and against the programs it was built from, packs
for every NVIDIA preset, ptxas's verdict on roller-table1's top 5, and a result stored as runs.
No test needs a GPU; those that compile skip only where nvcc is missing."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import pytest

from workbench import cli
from workbench.codegen.cuda import block_threads
from workbench.codegen.cuda_splitk import FINAL_THREADS
from workbench.codegen.nvcc import nvcc_archs, nvcc_path
from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.gpu import pack
from workbench.gpu.ingest import RUNNER
from workbench.gpu.sample_gemms import sample_gemms
from workbench.hardware.loader import load_spec
from workbench.profile.store import RunStore, stored_rows
from workbench.workload import Workload

NO_NVCC = nvcc_path() is None
needs_nvcc = pytest.mark.skipif(NO_NVCC, reason="nvcc not found")
ELF = b"\x7fELF"
KEY = re.compile(r"^[A-Za-z0-9._-]+$")
# One workload per CUDA template the pack must carry: the plain one, split-K (two kernels and a
# scratch buffer between them: a 64 x 64 output leaves the H200's 132 SMs idle), WMMA (fp16).
TINY = """
[suite]
name = "tiny"
source = "tests/test_gpu_pack.py"

[[workload]]
id = "mm"
op = "matmul"
M = 128
K = 64
N = 128

[[workload]]
id = "splitk"
op = "matmul"
M = 64
K = 4096
N = 64

[[workload]]
id = "mm-fp16"
op = "matmul"
dtype = "float16"
M = 64
K = 64
N = 64
"""
TOPK = 2


def run_cli(*argv: str, capsys) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def packed(tiny_suite, tmp_path_factory) -> tuple[Path, dict]:
    """The tiny suite packed on h200 at top 2 by the command, and its --json document."""
    out = tmp_path_factory.mktemp("packs") / "tiny"
    status = cli.main(["gpu", "pack", "--suite", str(tiny_suite), "--device", "h200", "--topk", str(TOPK),
                       "--out", str(out), "--json"])
    assert status == 0
    return out, json.loads((out / pack.MANIFEST).read_text())


@lru_cache(maxsize=None)
def construction(op: str, params: tuple, dtype: str, device: str, topk: int):
    w = Workload.from_dict({"op": op, "dtype": dtype, **dict(params)})
    return Stepper(w.build(), load_spec(device), pack.POLICY, Options(topk=topk)).finish()


def construction_of(w: dict, device: str = "h200", topk: int = TOPK):
    params = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in w["params"].items()))
    return construction(w["op"], params, w["dtype"], device, topk)


def test_the_manifest_follows_the_contract(packed):
    path, m = packed
    assert m["format"] == 1 and m["device"] == "h200" and m["topk"] == TOPK and m["suites"] == ["tiny"]
    assert m["spec_arch"] == load_spec("h200").target_dict()["arch"] == "sm_90a"
    assert m["arch"] == "sm_90a"  # nvcc 12 and 13 both have sm_90 (and without nvcc, nothing is compiled)
    assert m["spec"]["name"] == "h200" and m["spec"]["compute_units"] == 132 and m["spec"]["l2_bytes"] > 0
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", m["created"])
    for key in ("workbench_version", "tvm_version"):
        assert isinstance(m[key], str) and m[key]
    assert [w["id"] for w in m["workloads"]] == ["mm", "splitk", "mm-fp16"]
    for w in m["workloads"]:
        assert w["suite"] == "tiny" and w["op"] == "matmul"
        names = [a["name"] for a in w["args"]]
        assert [a["role"] for a in w["args"]] == ["input", "input", "output"] and names == ["A", "B", "C"]
        p = w["params"]
        assert p["B"] == 0 and p["trans_a"] is False and p["trans_b"] is False  # defaults filled
        assert w["flops"] == 2 * p["M"] * p["N"] * p["K"]
        itemsize = 2 if w["dtype"] == "float16" else 4
        assert w["min_bytes"] == itemsize * (p["M"] * p["K"] + p["K"] * p["N"] + p["M"] * p["N"])
        assert w["reference"] == w["reference"] | {"kind": "matmul", "inputs": ["A", "B"], "output": "C",
                                                   "trans_a": False, "trans_b": False}
        assert [c["rank"] for c in w["candidates"]] == list(range(1, TOPK + 1))
        for c in w["candidates"]:
            assert c["key"] == f"{w['id']}-r{c['rank']}" and KEY.match(c["key"])
            assert c["predicted_seconds"] > 0 and c["bound"] and c["plan"]
            assert c["tiles"]["grid"] >= 1 and [l["name"] for l in c["tiles"]["layers"]] == ["registers", "shared"]


@needs_nvcc
def test_every_candidate_is_compiled_with_its_files(packed):
    path, m = packed
    for w in m["workloads"]:
        for c in w["candidates"]:
            assert c["ok"], f"{c['key']}: {c['error']}"
            cubin, ptx = path / c["cubin"], path / c["ptx"]
            assert c["cubin"] == f"kernels/{c['key']}.cubin" and c["ptx"] == f"kernels/{c['key']}.ptx"
            assert cubin.read_bytes()[:4] == ELF
            text = ptx.read_text()
            assert f".target {m['arch']}" in text
            for launch in c["launches"]:
                assert f".entry {launch['kernel']}(" in text
                assert launch["ptxas"]["spill_store_bytes"] == 0
            report = c["ptxas"]
            assert 0 < report["registers"] <= 255 and report["shared_bytes"] <= 48 * 1024
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    keys = [c["key"] for w in m["workloads"] for c in w["candidates"]]
    expected = ["manifest.json"] + [f"kernels/{k}.{s}" for k in keys for s in ("cubin", "ptx")]
    expected += ["run.py"] if pack.RUNNER.exists() else []
    assert files == sorted(expected)
    if pack.RUNNER.exists():
        assert (path / "run.py").read_bytes() == pack.RUNNER.read_bytes()


@needs_nvcc
def test_launches_are_the_programs(packed):
    """Grid and block as the program and its template say, arguments from the workload's
    arguments and the scratch, scratch only where split-K needs it."""
    _, m = packed
    device = load_spec("h200")
    templates = set()
    for w in m["workloads"]:
        built = construction_of(w)
        args = {a["name"] for a in w["args"]}
        for c in w["candidates"]:
            cand = built.candidates[c["rank"] - 1]
            assert cand.predicted_seconds == c["predicted_seconds"]
            assert c["tiles"]["layers"] == [{"name": l["name"], "tile": l["tile"]} for l in cand.to_dict()["layers"]]
            program, launches = cand.program, c["launches"]
            templates.add(c["template"])
            first = launches[0]
            assert first["grid"][0] * first["grid"][1] * first["grid"][2] == program.grid == c["tiles"]["grid"]
            threads = math.prod(first["block"])
            ratio = block_threads(built.expr, program, device)
            assert threads == (device.warp_size * ratio if c["template"] == "cuda-wmma" else ratio)
            assert all(l["dynamic_shared_bytes"] == 0 for l in launches)  # the templates stage statically
            scratch = {s["name"]: s for s in c["scratch"]}
            for launch in launches:
                assert set(launch["args"]) <= args | set(scratch)
            if c["template"] == "cuda-splitk":
                (rf,) = scratch.values()
                outputs = w["params"]["M"] * w["params"]["N"]
                assert rf["shape"] == [program.split * outputs] and rf["dtype"] == "float32"
                assert len(launches) == 2 and launches[0]["args"][-1] == rf["name"] and "C" not in launches[0]["args"]
                final = launches[1]
                assert final["block"] == [FINAL_THREADS, 1, 1] and final["grid"] == [outputs // FINAL_THREADS, 1, 1]
                assert set(final["args"]) == {"C", rf["name"]}
            else:
                assert not scratch and len(launches) == 1 and launches[0]["args"] == ["A", "B", "C"]
    assert templates == {"cuda", "cuda-splitk", "cuda-wmma"}


def test_the_pack_is_small_and_its_json_says_so(packed, tiny_suite, tmp_path, capsys):
    path, m = packed
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert size < 2**20  # six small kernels; roller-table1 at top 5 is checked below
    # the command refuses a directory that holds something, and leaves it as it was
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    status, _, err = run_cli("gpu", "pack", "--suite", str(tiny_suite), "--device", "h200", "--out",
                             str(tmp_path / "full"), capsys=capsys)
    assert status == 2 and "not an empty directory" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["x"]
    status, _, err = run_cli("gpu", "pack", "--suite", "tiny-missing", "--device", "h200", "--out",
                             str(tmp_path / "new"), capsys=capsys)
    assert status == 2 and "tiny-missing" in err and not (tmp_path / "new").exists()
    status, _, err = run_cli("gpu", "pack", "--suite", str(tiny_suite), "--device", "xeon-avx512", "--out",
                             str(tmp_path / "new"), capsys=capsys)
    assert status == 2 and "GPU" in err and not (tmp_path / "new").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_a_failed_candidate_is_recorded_without_files(tmp_path):
    """A build or compile failure is the candidate's, in one line; the pack goes on."""
    built = construction("matmul", (("K", 64), ("M", 128), ("N", 128)), "float32", "h200", 1)
    cand = built.candidates[0]
    (tmp_path / "kernels").mkdir()
    entry = pack._candidate_entry(cand, "mm-r1", {"ok": False, "error": "schedule: no rule"}, None, tmp_path)
    assert entry["ok"] is False and entry["error"] == "schedule: no rule" and "cubin" not in entry
    done = {"ok": True, "template": "cuda", "source": "", "build_seconds": 0.1, "launches": [], "scratch": []}
    from workbench.codegen.nvcc import PtxResult

    entry = pack._candidate_entry(cand, "mm-r1", done, PtxResult(False, error="ptxas: too many resources"), tmp_path)
    assert entry["ok"] is False and entry["error"] == "nvcc: ptxas: too many resources"
    assert entry["predicted_seconds"] == cand.predicted_seconds and not list((tmp_path / "kernels").iterdir())


@pytest.mark.parametrize("device", ["h100", "a100", "v100"])
def test_every_nvidia_preset_packs(device, tiny_suite, tmp_path, capsys):
    """h200 is packed above; v100's sm_70 is gone from nvcc 13: its pack holds code for the
    oldest architecture this nvcc has (the manifest says which)."""
    status, out, _ = run_cli("gpu", "pack", "--workload", f"{tiny_suite}:mm", "--device", device, "--topk", "1",
                             "--out", str(tmp_path / device), "--json", capsys=capsys)
    assert status == 0
    doc = json.loads(out)
    m = json.loads((tmp_path / device / pack.MANIFEST).read_text())
    spec_arch = load_spec(device).target_dict()["arch"]
    assert m["device"] == device and m["spec_arch"] == spec_arch and doc["arch"] == m["arch"]
    (c,) = m["workloads"][0]["candidates"]
    if NO_NVCC:
        assert not c["ok"] and "nvcc" in c["error"] and doc["failed"] == [{"key": "mm-r1", "error": c["error"]}]
        return
    assert c["ok"], c["error"]
    base = re.sub(r"[af]$", "", spec_arch)
    assert m["arch"] == spec_arch if base in nvcc_archs() else m["arch"] == min(
        (a for a in nvcc_archs() if int(a[3:]) >= int(base[3:])), key=lambda a: int(a[3:]))
    assert f".target {m['arch']}" in (tmp_path / device / c["ptx"]).read_text()


@pytest.mark.slow
@needs_nvcc
def test_roller_table1_top5_compiles_without_spills(tmp_path):
    """The issue's acceptance: every kernel of roller-table1's top 5 on the h200 compiles, ptxas
    spills nothing and the shared memory fits a block; the pack stays under 48 MiB."""
    chosen = pack.pack_workloads(["roller-table1"], [])
    result = pack.write_pack(chosen, load_spec("h200"), 5, tmp_path / "pack")
    assert result.bytes < pack.MAX_PACK_BYTES
    limit = load_spec("h200").target_dict()["max_shared_memory_per_block"]
    assert len(result.manifest["workloads"]) == 18
    for w in result.manifest["workloads"]:
        assert 1 <= len(w["candidates"]) <= 5, w["id"]  # R2's space holds one program
        for c in w["candidates"]:
            assert c["ok"], f"{c['key']}: {c['error']}"
            assert c["ptxas"]["spill_store_bytes"] == c["ptxas"]["spill_load_bytes"] == 0, c["key"]
            assert c["ptxas"]["shared_bytes"] <= limit, c["key"]


def test_sample_gemms_are_the_models_gemms():
    by_id = {w.label.split(":", 1)[1]: (dict(w.params), w.dtype) for w in sample_gemms()}
    shapes = {(p["B"], p["M"], p["K"], p["N"], dtype) for p, dtype in by_id.values()}
    assert len(shapes) == len(by_id)  # each shape once
    assert (0, 32, 128, 128, "float32") in shapes  # bert_layer's projections, [1,32,128] x [128,128]
    assert (2, 32, 64, 32, "float32") in shapes  # its attention scores, batched over 2 heads
    assert (0, 8, 128, 10, "float32") in shapes  # mlp's last Gemm, its transB weight made plain
    assert (0, 1, 128, 256, "float32") in shapes  # mlp_dynamic, its symbolic batch and seq bound to 1
    assert {dtype for _, dtype in by_id.values()} == {"float32", "float16"}
    assert pack.pack_workloads(["sample-gemms"], [])[0][0] == "sample-gemms"


# -- ingest --------------------------------------------------------------------------------------


def handmade_result(device: str = "h200") -> dict:
    """A runner's result for two small workloads, as run.py writes one (GPU-PACK.md)."""
    workloads = []
    for wid, params in (("mm", {"M": 128, "K": 64, "N": 128}), ("mm2", {"M": 64, "K": 128, "N": 64})):
        params = params | {"B": 0, "trans_a": False, "trans_b": False}
        built = construction_of({"op": "matmul", "params": params, "dtype": "float32"}, device, 3)
        candidates = []
        for cand in built.candidates:
            ok = cand.rank != 2
            seconds = 1e-5 * cand.rank
            candidates.append({"rank": cand.rank, "key": f"{wid}-r{cand.rank}", "ok": ok,
                               "error": "" if ok else "CUDA_ERROR_LAUNCH_FAILED: launch failed\nsecond line",
                               "verified": ok, "max_rel_error": 1e-7, "rel_l2_error": 1e-8,
                               "seconds": seconds if ok else None,
                               "samples": [seconds * f for f in (1.0, 0.9, 1.2)] if ok else [],
                               "predicted_seconds": cand.predicted_seconds})
        workloads.append({"id": wid, "suite": "tiny", "op": "matmul", "params": params, "dtype": "float32",
                          "torch": {"seconds": 2e-5, "samples": [2e-5] * 3, "what": "torch.matmul (cuBLAS), TF32 off"},
                          "candidates": candidates})
    return {"format": 1, "pack": {"device": device, "created": "2026-11-28T18:00:00Z", "git_commit": "abc"},
            "machine": {"gpu": "NVIDIA H200", "driver": "570.1", "cuda_runtime": "12.8", "torch": "2.6",
                        "cupy": "13.4"},
            "microbench": {}, "timing": {"warmup": 3, "repeats": 3, "l2_flush_bytes": 2**27,
                                         "method": "CUDA events, median"},
            "workloads": workloads}


def test_ingest_stores_runs_as_profile_does(tmp_path, capsys):
    result = tmp_path / "RESULT.json"
    result.write_text(json.dumps(handmade_result()))
    db = tmp_path / "runs.sqlite3"
    status, out, _ = run_cli("gpu", "ingest", str(result), "--db", str(db), "--json", capsys=capsys)
    assert status == 0
    doc = json.loads(out)
    assert [w["label"] for w in doc["workloads"]] == ["tiny:mm", "tiny:mm2"]
    assert all(w["run_id"] is not None and w["candidates"] == 3 for w in doc["workloads"])
    first = doc["workloads"][0]
    assert first["best_seconds"] == 1e-5 and first["torch_seconds"] == 2e-5 and first["speed_vs_torch"] == 2.0
    with RunStore(db) as store:
        runs = store.runs(device="h200")
        assert [r.workload for r in runs] == ["tiny:mm", "tiny:mm2"]
        run = runs[0]
        assert (run.runner, run.policy, run.topk, run.status) == (RUNNER, "roller", 3, "finished")
        assert dict(run.params) == {"M": 128, "K": 64, "N": 128, "B": 0, "trans_a": False, "trans_b": False}
        versions = dict(run.versions)
        assert versions["gpu"] == "NVIDIA H200" and versions["baseline_torch_seconds"] == repr(2e-5)
        measured = {m.rank: m for m in store.measurements_of(run.id)}
        assert measured[1].measurement.ok and measured[1].measurement.best_seconds == pytest.approx(0.9e-5)
        assert measured[1].measurement.median_seconds == pytest.approx(1e-5)
        failed = measured[2].measurement
        assert not failed.ok and failed.correct is False and failed.error == "CUDA_ERROR_LAUNCH_FAILED: launch failed"
        built = construction_of({"op": "matmul", "params": dict(run.params), "dtype": "float32"}, "h200", 3)
        assert measured[3].predicted_seconds == built.candidates[2].predicted_seconds
        first = built.candidates[0]
        assert store.programs_of(run.id)[1] == first.program.to_dict() | {"plan": first.plan.to_dict(first.expr)}
        rows = stored_rows(store, "h200")  # what `runs fit` fits on: the correct, timed candidates
        assert sorted((r.workload, r.rank) for r in rows) == [("tiny:mm", 1), ("tiny:mm", 3), ("tiny:mm2", 1),
                                                              ("tiny:mm2", 3)]


def test_ingest_skips_a_workload_the_construction_no_longer_gives(tmp_path, capsys):
    doc = handmade_result()
    doc["workloads"][1]["candidates"][0]["predicted_seconds"] *= 1.5
    result = tmp_path / "RESULT.json"
    result.write_text(json.dumps(doc))
    db = tmp_path / "runs.sqlite3"
    status, out, _ = run_cli("gpu", "ingest", str(result), "--db", str(db), "--json", capsys=capsys)
    assert status == 0
    second = json.loads(out)["workloads"][1]
    assert second["run_id"] is None and "construction changed" in second["reason"]
    with RunStore(db) as store:
        assert [r.workload for r in store.runs()] == ["tiny:mm"]


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{\"format\": 1,", "not JSON"),
    ("[1, 2]", "not a GPU runner result"),
    ("{\"format\": 2, \"pack\": {\"device\": \"h200\"}, \"workloads\": []}", "not a GPU runner result"),
    ("{\"format\": 1, \"workloads\": []}", "\"pack\""),
    ("{\"format\": 1, \"pack\": {\"device\": \"h200\"}, \"workloads\": [{\"id\": \"x\"}]}", "workload 0 needs"),
    ("{\"format\": 1, \"pack\": {\"device\": \"nope\"}, \"workloads\": []}", "nope"),
])
def test_ingest_refuses_bad_input_in_one_line(content, message, tmp_path, capsys):
    result = tmp_path / "RESULT.json"
    if content is not None:
        result.write_text(content)
    db = tmp_path / "runs.sqlite3"
    status, out, err = run_cli("gpu", "ingest", str(result), "--db", str(db), capsys=capsys)
    assert status == 2 and not out
    assert err.startswith("workbench: error: ") and message in err and len(err.strip().splitlines()) == 1
    if db.exists():
        with RunStore(db) as store:
            assert not store.runs()


def test_ptxas_reports_each_kernel_of_a_file():
    """Split-K's file holds two kernels: each gets its own report, the file the most registers
    and shared memory of either and the spills of both."""
    from workbench.codegen import nvcc

    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel_1' for 'sm_90a'
ptxas info    : Function properties for main_kernel_1
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'
ptxas info    : Function properties for main_kernel
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem
"""
    kernels = dict(nvcc._kernel_reports(text))
    assert kernels["main_kernel_1"] == nvcc.PtxasReport(8, 8, 4, 0, 0)
    assert kernels["main_kernel"] == nvcc.PtxasReport(40, 0, 0, 16, 512)
    assert nvcc._total(list(kernels.items())) == nvcc.PtxasReport(40, 8, 4, 16, 512)


def test_workloads_are_named_once_and_keys_are_file_names(tiny_suite):
    chosen = pack.pack_workloads([str(tiny_suite), "roller-table1"], [f"{tiny_suite}:mm", "roller-table1:M0"])
    assert [(s, wid) for s, wid, _ in chosen][:4] == [("tiny", "mm"), ("tiny", "splitk"), ("tiny", "mm-fp16"),
                                                      ("roller-table1", "M0")]
    assert len(chosen) == 3 + 18  # the --workload entries were in the suites already
    twice = [("a", "M0", None), ("b", "M0", None), ("b", "x", None)]
    assert pack.workload_ids(twice) == ["a/M0", "b/M0", "x"]
    assert pack.key_of("a/M0", 3) == "a_M0-r3" and KEY.match(pack.key_of("s p/ä:1", 1))
    from workbench.errors import UserError

    with pytest.raises(UserError, match="no workload 'nope'"):
        pack.pack_workloads([], ["roller-table1:nope"])
    with pytest.raises(UserError, match="nothing to pack"):
        pack.pack_workloads([], [])


@pytest.mark.parametrize("op, params, expected", [
    ("conv2d", {"N": 1, "C": 4, "H": 8, "W": 8, "F": 8, "KH": 3, "KW": 3, "stride": 2, "pad": 1, "dilation": 1},
     {"inputs": ["data", "kernel"], "output": "O", "stride": 2, "padding": 1, "groups": 1,
      "output_shape": [1, 8, 4, 4]}),
    ("depthwise_conv2d", {"N": 1, "C": 4, "H": 8, "W": 8, "KH": 3, "KW": 3, "stride": 1, "pad": 1, "multiplier": 2},
     {"groups": 4, "output_shape": [1, 4, 2, 8, 8]}),
    ("avgpool", {"N": 1, "C": 4, "H": 8, "W": 8, "K": 2, "stride": 2, "pad": 0},
     {"inputs": ["data"], "kernel_size": 2, "stride": 2, "padding": 0, "count_include_pad": True}),
    ("reduce_mean", {"shape": (2, 8, 3, 3), "axes": (2, 3)}, {"inputs": ["X"], "output": "Y", "dims": [2, 3]}),
    ("relu", {"shape": (4, 8)}, {"inputs": ["X"], "output": "Y"}),
])
def test_the_reference_names_the_torch_call(op, params, expected):
    from workbench.gpu.reference import reference
    from workbench.ops import catalog

    expr = catalog.build(op, params)
    ref = reference(op, dict(expr.params), expr.args)
    assert ref["kind"] == op and ref["torch"] and ref == ref | expected
