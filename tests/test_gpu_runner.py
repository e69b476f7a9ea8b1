"""The GPU pack's runner (`workbench/gpu/runner.py`, shipped as `run.py`): what it may import, and
its parts that need no GPU (manifest checks, shapes, the torch formulation against the numpy
reference, the error measure and its tolerances, repeats, the result and its summary).

The GPU parts (loading cubins, launching, timing) run only on the GPU machine; nothing here fakes
their results."""

import ast
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.gpu import runner
from workbench.ops import reference

RUNNER = Path(runner.__file__)
ALLOWED = {"numpy", "torch", "cupy"}


def _imports(tree) -> list[tuple[str, bool]]:
    """(root module, whether imported at module level) of every import in the file."""
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "the runner is a standalone script: no relative imports"
            out.append((node.module.split(".")[0], id(node) in top))
    return out


def test_the_runner_imports_only_the_standard_library_numpy_torch_and_cupy():
    imports = _imports(ast.parse(RUNNER.read_text()))
    roots = {name for name, _ in imports}
    assert {"torch", "cupy", "numpy"} <= roots  # the walk sees the lazy imports too
    assert not {"tvm", "tvm_ffi", "workbench"} & roots
    assert roots <= set(sys.stdlib_module_names) | ALLOWED, roots - set(sys.stdlib_module_names) - ALLOWED
    # numpy, torch and cupy only inside functions: `--help` and the pure parts work without them
    assert not {name for name, top in imports if top} & ALLOWED


def test_help_works_without_numpy_torch_or_cupy():
    blocked = "import runpy, sys\nfor m in ('numpy', 'torch', 'cupy'): sys.modules[m] = None\n"
    code = blocked + f"sys.argv = ['run.py', '--help']\nrunpy.run_path({str(RUNNER)!r}, run_name='__main__')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--budget-seconds" in done.stdout and "--only" in done.stdout and "--selftest" in done.stdout


# ---- the manifest ------------------------------------------------------------------------------


def _matmul_workload(**changes):
    w = {"id": "M0", "suite": "s", "op": "matmul", "params": {"M": 4, "K": 2, "N": 8}, "dtype": "float32",
         "args": [{"name": "A", "shape": [4, 2], "dtype": "float32", "role": "input"},
                  {"name": "B", "shape": [2, 8], "dtype": "float32", "role": "input"},
                  {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}],
         "reference": {"kind": "matmul"}, "candidates": []}
    return {**w, **changes}


def _candidate(key="M0-r1", **changes):
    c = {"rank": 1, "key": key, "cubin": f"kernels/{key}.cubin", "ptx": f"kernels/{key}.ptx",
         "predicted_seconds": 1e-6, "scratch": [],
         "launches": [{"kernel": "k0", "grid": [4, 1, 1], "block": [32, 1, 1], "dynamic_shared_bytes": 0,
                       "args": ["A", "B", "C"]}]}
    return {**c, **changes}


def _pack(tmp_path, workloads, kernels=("M0-r1",)):
    (tmp_path / "kernels").mkdir()
    for key in kernels:
        (tmp_path / "kernels" / f"{key}.cubin").write_bytes(b"not a cubin")
    manifest = {"format": 1, "device": "h200", "created": "2026-11-28T18:00:00Z", "git_commit": None,
                "workloads": workloads}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_a_manifest_of_another_format_or_with_duplicate_keys_is_refused(tmp_path):
    _pack(tmp_path, [_matmul_workload(candidates=[_candidate()])])
    assert runner.load_manifest(str(tmp_path))["workloads"][0]["id"] == "M0"
    with pytest.raises(runner.ManifestError, match="format"):
        runner.check_manifest({"format": 2, "workloads": []})
    twice = [_matmul_workload(candidates=[_candidate()]), _matmul_workload(id="M1", candidates=[_candidate()])]
    with pytest.raises(runner.ManifestError, match="twice"):
        runner.check_manifest({"format": 1, "workloads": twice})
    with pytest.raises(runner.ManifestError, match="cannot read"):
        runner.load_manifest(str(tmp_path / "nowhere"))


def test_a_workload_whose_args_do_not_match_its_operator_is_reported():
    assert runner.workload_problem(_matmul_workload()) == ""
    args = _matmul_workload()["args"]
    wrong_shape = [args[0], {**args[1], "shape": [8, 2]}, args[2]]
    assert "arg B has shape [8, 2]" in runner.workload_problem(_matmul_workload(args=wrong_shape))
    assert "roles" in runner.workload_problem(_matmul_workload(args=args[:2]))
    assert "no torch reference" in runner.workload_problem(_matmul_workload(reference={"kind": "softmax"}))
    assert "dtype" in runner.workload_problem(_matmul_workload(dtype="bfloat16"))
    # the reference's fields fill in what the params lack, never change what they give
    normalized = {"M": 4, "K": 2, "N": 8, "B": 0, "trans_a": False, "trans_b": False}
    other = {"kind": "matmul", "trans_b": True, "M": 7}
    assert runner.workload_problem(_matmul_workload(params=normalized, reference=other)) == ""
    moved = _matmul_workload(params={}, reference={"kind": "matmul", "M": 4, "K": 2, "N": 8})
    assert runner.workload_problem(moved) == ""
    assert "parameter M missing" in runner.workload_problem(_matmul_workload(params={"K": 2, "N": 8}))


def test_a_candidate_that_cannot_be_launched_is_reported(tmp_path):
    _pack(tmp_path, [])
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "M0-r1.ptx").write_text("// ptx")  # the PTX alone is enough
    w = _matmul_workload()
    assert runner.candidate_problem(_candidate(), w, str(tmp_path)) == ""
    assert "no kernel file" in runner.candidate_problem(_candidate("M0-r2"), w, str(tmp_path))
    launch = _candidate()["launches"][0]
    cases = {
        "neither an arg nor scratch": [{**launch, "args": ["A", "B", "C_rf"]}],
        "more than 1024 threads": [{**launch, "block": [64, 32, 1]}],
        "grid": [{**launch, "grid": [0, 1, 1]}],
        "int32 range": [{**launch, "args": ["A", "B", "C", {"int": 2**31}]}],
    }
    for message, launches in cases.items():
        assert message in runner.candidate_problem(_candidate(launches=launches), w, str(tmp_path))
    split = _candidate(scratch=[{"name": "C_rf", "shape": [2, 4, 8], "dtype": "float32"}],
                       launches=[{**launch, "args": ["A", "B", "C_rf"]},
                                 {**launch, "kernel": "k1", "args": ["C_rf", "C"]}])
    assert runner.candidate_problem(split, w, str(tmp_path)) == ""
    clash = _candidate(scratch=[{"name": "C", "shape": [1], "dtype": "float32"}])
    assert "name of an argument" in runner.candidate_problem(clash, w, str(tmp_path))
    assert "characters" in runner.candidate_problem(_candidate("M0/r1"), w, str(tmp_path))


def test_launch_arguments_keep_the_parameter_order_and_pass_ints_as_int32():
    launch = {"kernel": "k", "args": ["C", {"int": 7}, "A"]}
    assert runner.launch_arguments(launch, {"A": 0, "C": 0}) == [("buffer", "C"), ("int32", 7), ("buffer", "A")]
    with pytest.raises(runner.ManifestError):
        runner.launch_arguments({"kernel": "k", "args": [{"int": True}]}, {})


def test_only_keeps_the_workloads_with_a_matching_candidate():
    workloads = [_matmul_workload(candidates=[_candidate("M0-r1"), _candidate("M0-r2")]),
                 _matmul_workload(id="M1", candidates=[_candidate("M1-r1")]), _matmul_workload(id="M2")]
    assert [(w["id"], len(c)) for w, c in runner.selected(workloads, "")] == [("M0", 2), ("M1", 1), ("M2", 0)]
    assert [(w["id"], [x["key"] for x in c]) for w, c in runner.selected(workloads, "r2")] == [("M0", ["M0-r2"])]


# ---- shapes and the torch formulation, against the catalog and its numpy reference ------------

CASES = [
    ("matmul", {"M": 3, "K": 5, "N": 4}),
    ("matmul", {"M": 3, "K": 5, "N": 4, "B": 2, "trans_a": True, "trans_b": True}),
    ("gemv", {"M": 3, "K": 5}),
    ("conv2d", {"N": 2, "C": 3, "H": 7, "W": 6, "F": 4, "KH": 3, "KW": 2, "stride": 2, "pad": 1, "dilation": 2}),
    ("group_conv2d", {"N": 1, "C": 4, "H": 6, "W": 5, "F": 6, "KH": 3, "KW": 3, "stride": 1, "pad": 1, "groups": 2}),
    ("depthwise_conv2d", {"N": 2, "C": 3, "H": 6, "W": 6, "KH": 3, "KW": 3, "stride": 2, "pad": 1}),
    ("depthwise_conv2d", {"N": 1, "C": 3, "H": 5, "W": 5, "KH": 1, "KW": 1, "stride": 1, "pad": 0, "multiplier": 4}),
    ("avgpool", {"N": 2, "C": 3, "H": 7, "W": 7, "K": 3, "stride": 2, "pad": 1}),
    ("maxpool", {"N": 2, "C": 3, "H": 7, "W": 7, "K": 3, "stride": 2, "pad": 1}),
    ("relu", {"shape": (2, 3, 4)}),
    ("gelu", {"shape": (2, 3, 4)}),
    ("add", {"shape": (2, 3, 4)}),
    ("reduce_sum", {"shape": (2, 3, 4), "axes": (1,)}),
    ("reduce_mean", {"shape": (2, 3, 4, 5), "axes": (2, 3)}),
]


class NumpyOps:
    """torch's operators as torch documents them, in numpy, so `reference_function`'s
    translation (groups, padding, count_include_pad, transposes, output layouts) can be checked
    against the catalog's own numpy reference without torch."""

    swap_last = staticmethod(lambda x: np.swapaxes(x, -1, -2))
    matmul = staticmethod(np.matmul)
    relu = staticmethod(lambda x: np.maximum(x, 0.0))
    sum = staticmethod(lambda x, axes: x.sum(axis=axes))
    mean = staticmethod(lambda x, axes: x.mean(axis=axes))

    @staticmethod
    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))

    @staticmethod
    def _windows(x, kh, kw, stride, dilation, oh, ow):
        for r in range(kh):
            for s in range(kw):
                y0, x0 = r * dilation, s * dilation
                yield r, s, x[:, :, y0 : y0 + stride * (oh - 1) + 1 : stride, x0 : x0 + stride * (ow - 1) + 1 : stride]

    def conv2d(self, data, kernel, stride, pad, dilation, groups):
        # weight [F, C/groups, KH, KW]; output channels g*F/groups.. read input channels g*C/groups..
        (n, c, h, w), (f, cg, kh, kw) = data.shape, kernel.shape
        oh, ow = ((size + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for size, k in ((h, kh), (w, kw)))
        x = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out, fg = np.zeros((n, f, oh, ow)), f // groups
        for g in range(groups):
            for r, s, patch in self._windows(x[:, g * cg : (g + 1) * cg], kh, kw, stride, dilation, oh, ow):
                weights = kernel[g * fg : (g + 1) * fg, :, r, s]
                out[:, g * fg : (g + 1) * fg] += np.einsum("nchw,fc->nfhw", patch, weights)
        return out

    def _pool(self, x, k, stride, pad, fill, combine):
        oh, ow = ((size + 2 * pad - k) // stride + 1 for size in x.shape[2:])
        padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
        return combine([patch for _, _, patch in self._windows(padded, k, k, stride, 1, oh, ow)])

    def avg_pool2d(self, x, k, stride, pad):  # count_include_pad: every window divides by k*k
        return self._pool(x, k, stride, pad, 0.0, lambda ps: sum(ps) / (k * k))

    def max_pool2d(self, x, k, stride, pad):
        return self._pool(x, k, stride, pad, -np.inf, lambda ps: np.maximum.reduce(ps))


@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_the_torch_formulation_computes_the_catalog_reference(kind, params):
    kind, p = runner.reference_params({"op": kind, "params": params})
    inputs, output = runner.expected_shapes(kind, p)
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=shape).astype(np.float32) for shape in inputs]
    expr = SimpleNamespace(op=kind, params=params, dtype="float32",
                           args=[SimpleNamespace(shape=s, role="input") for s in inputs])
    expected = reference.reference(expr, arrays)
    f, what = runner.reference_function(kind, p)
    got = np.asarray(f(NumpyOps(), *(a.astype(np.float64) for a in arrays))).reshape(output)
    assert expected.shape == output
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert what


@pytest.mark.tvm
@pytest.mark.parametrize("kind,params", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_expected_shapes_are_the_catalog_kernels_arguments(kind, params):
    from workbench.ops import catalog

    expr = catalog.build(kind, params)
    inputs, output = runner.expected_shapes(*runner.reference_params({"op": kind, "params": params}))
    assert [tuple(a.shape) for a in expr.args] == [tuple(s) for s in inputs] + [tuple(output)]
    assert [a.role for a in expr.args] == ["input"] * len(inputs) + ["output"]


def test_inputs_are_scaled_so_a_long_sum_stays_near_one():
    assert runner.input_scale("matmul", {"K": 4096}) == pytest.approx(4096**-0.25)
    assert runner.input_scale("conv2d", {"C": 64, "KH": 3, "KW": 3}) == pytest.approx(576**-0.25)
    assert runner.input_scale("group_conv2d", {"C": 64, "groups": 4, "KH": 3, "KW": 3}) == pytest.approx(144**-0.25)
    assert runner.input_scale("reduce_sum", {"shape": (4, 100, 9), "axes": (1, 2)}) == pytest.approx(900**-0.5)
    assert runner.input_scale("relu", {"shape": (3,)}) == 1.0
    assert runner.workload_seed("M0") == runner.workload_seed("M0") != runner.workload_seed("M1")


# ---- the error measure and the tolerances ------------------------------------------------------


def _check(out, ref, dtype="float32"):
    return runner.verdict(runner.error_measure(out, ref, np), dtype, out.size)


def test_fp32_accumulation_passes_and_a_lost_term_does_not():
    # a float32 GEMM with K = 4608 (conv 3x3 over 512 channels) against its float64 result
    rng = np.random.default_rng(1)
    k = 4608
    a = rng.normal(size=(64, k)).astype(np.float32)
    b = rng.normal(size=(k, 48)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fp32 = np.zeros((64, 48), dtype=np.float32)
    for i in range(k):  # one rounding per term, as a kernel's accumulator does
        fp32 += np.outer(a[:, i], b[i])
    measure = runner.error_measure(fp32.astype(np.float64), ref, np)
    assert 0 < measure["rel_l2_error"] < runner.TOLERANCE["float32"] / 10
    assert _check(fp32.astype(np.float64), ref) == (True, "")
    lost = fp32 - np.outer(a[:, 7], b[7])  # one term of 4608 missing everywhere
    verified, why = _check(lost.astype(np.float64), ref)
    assert not verified and "rel L2 error" in why


def test_fp16_inputs_with_an_fp16_output_pass_the_fp16_tolerance_only():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(32, 1024)).astype(np.float16)
    b = rng.normal(size=(1024, 32)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16).astype(np.float64)
    assert _check(out, ref, "float16") == (True, "")
    assert not _check(out, ref, "float32")[0]  # the output's fp16 rounding alone is above 1e-4


def test_an_unwritten_element_never_passes():
    ref = np.arange(1.0, 13.0).reshape(3, 4)
    out = ref.copy()
    out[2, 3] = np.nan
    measure = runner.error_measure(out, ref, np)
    assert measure["nonfinite"] == 1 and measure["rel_l2_error"] is None
    verified, why = runner.verdict(measure, "float32", out.size)
    assert not verified and "1 of 12 outputs not finite" in why
    assert not _check(np.full((3, 4), np.inf), ref)[0]


def test_the_error_measure_is_the_relative_l2_and_max_error():
    ref = np.array([3.0, 4.0])
    measure = runner.error_measure(np.array([3.0, 4.5]), ref, np)
    assert measure["rel_l2_error"] == pytest.approx(0.5 / 5.0)
    assert measure["max_rel_error"] == pytest.approx(0.5 / 4.0)
    assert runner.error_measure(np.zeros(2), np.zeros(2), np)["rel_l2_error"] == 0.0
    assert runner.error_measure(np.ones(2), np.zeros(2), np)["rel_l2_error"] is None


def test_repeats_shrink_for_slow_kernels_but_stay_measured():
    assert runner.plan_repeats(1e-5, 20, 3) == (3, 20)
    warmup, repeats = runner.plan_repeats(0.1, 20, 3)  # 1 s buys 9 runs of 0.1 s
    assert warmup == 3 and repeats == 6
    assert runner.plan_repeats(0.5, 20, 3) == (0, 3)  # slow: what fits in SLOW_BUDGET_S
    assert runner.plan_repeats(8.0, 20, 3) == (0, 1)
    assert runner.plan_repeats(1e-5, 2, 0) == (0, 2)


# ---- the result and its summary ----------------------------------------------------------------


def _result(manifest):
    def cand(key, rank, seconds, ok=True):
        c = runner.failed({"key": key, "rank": rank, "predicted_seconds": 1e-3}, "wrong result")
        return {**c, "ok": True, "error": "", "verified": True, "seconds": seconds} if ok else c

    def torch(seconds):
        return {"seconds": seconds, "samples": [seconds], "what": "torch.matmul (cuBLAS), TF32 off"}

    workloads = [
        runner.workload_entry({"id": "M0", "op": "matmul"}, torch(1.0e-3),
                              [cand("M0-r2", 2, 1.05e-3), cand("M0-r1", 1, 2e-3)]),
        runner.workload_entry({"id": "M1", "op": "matmul"}, torch(1.0e-3), [cand("M1-r1", 1, 1.5e-3)]),
        runner.workload_entry({"id": "C0", "op": "conv2d"}, torch(2.0e-3), [cand("C0-r1", 1, None, ok=False)]),
        runner.workload_entry({"id": "E0", "op": "relu"}, None, []),
    ]
    return runner.build_result(manifest, {"gpu": "?"}, {}, {"warmup": 3, "repeats": 20}, workloads)


def test_the_summary_counts_workloads_within_ten_percent_of_torch():
    result = _result({"device": "h200", "created": "x", "git_commit": None})
    rows = runner.summary_rows(result)
    assert [r["best_key"] for r in rows] == ["M0-r2", "M1-r1", None, None]
    assert rows[0]["ratio"] == pytest.approx(1.05) and rows[0]["verified"] == 2
    assert runner.within_fraction(rows) == (1, 3)  # E0 has no torch time; C0 no verified candidate
    table = runner.format_summary(result)
    assert "within 10% of torch: 1/3 workloads (33%)" in table
    assert "verified candidates: 3/4" in table
    assert [c["key"] for c in result["workloads"][0]["candidates"]] == ["M0-r1", "M0-r2"]  # rank order


def test_the_result_json_has_the_contract_fields_and_no_nan(tmp_path):
    result = _result({"device": "h200", "created": "x", "git_commit": "abc", "spec": {"big": 1}})
    result["workloads"][0]["candidates"][0]["rel_l2_error"] = float("nan")
    path = tmp_path / "result.json"
    runner.write_json(str(path), result)
    back = json.loads(path.read_text())
    assert back["format"] == 1 and back["pack"] == {"device": "h200", "created": "x", "git_commit": "abc"}
    assert set(back) == {"format", "pack", "machine", "microbench", "timing", "workloads"}
    cand = back["workloads"][0]["candidates"][0]
    assert cand["rel_l2_error"] is None
    assert {"rank", "key", "ok", "error", "verified", "max_rel_error", "rel_l2_error", "seconds", "samples",
            "predicted_seconds"} <= set(cand)
    assert set(back["workloads"][0]) == {"id", "suite", "op", "params", "dtype", "torch", "candidates"}


def test_the_microbench_line_shows_what_was_measured_and_names_what_failed():
    line = runner.format_microbench({"sm_count": 132, "l2_bytes": 60 * 2**20, "dram_gbps": 4100.0,
                                     "fp16_tc_gflops_error": "RuntimeError: x"})
    assert line == "microbench: 132 SMs, 60 MiB L2, 4100 GB/s DRAM (failed: fp16_tc_gflops_error)"


def test_host_tools_output_is_parsed():
    assert runner.parse_nvidia_smi("580.65.06, 1980, 1980\n") == {
        "driver": "580.65.06", "clock_mhz": 1980.0, "clock_max_mhz": 1980.0}
    assert runner.parse_nvidia_smi("") == {}
    lscpu = "Architecture: x86_64\nModel name:   AMD EPYC 9654 96-Core Processor\nFlags: fpu avx2 avx512f\n"
    assert runner.parse_lscpu(lscpu) == {"cpu": "AMD EPYC 9654 96-Core Processor", "cpu_flags": "fpu avx2 avx512f"}


def test_a_run_without_a_usable_gpu_gives_every_candidate_an_error(tmp_path):
    # Here the worker cannot start (no cupy, torch or GPU); on a GPU machine these files are not
    # cubins. Either way every candidate ends with ok false and a reason, and the JSON is written.
    pack = tmp_path / "pack"
    pack.mkdir()
    _pack(pack, [_matmul_workload(candidates=[_candidate("M0-r1"), _candidate("M0-r2")])])
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(RUNNER), str(pack), "--out", str(out), "--budget-seconds", "120"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    (workload,) = result["workloads"]
    by_key = {c["key"]: c for c in workload["candidates"]}
    assert by_key["M0-r2"]["error"].startswith("manifest: no kernel file")
    assert not by_key["M0-r1"]["ok"] and by_key["M0-r1"]["error"]
    assert "within 10% of torch" in done.stdout.splitlines()[-2]
