"""`bench dynamic`'s engine: DietCode's score of a program (closed form on a generated device),
the value lists, wrong results reported without a time, and one small end-to-end run on this CPU
(every result verified; no timing assertions: speed lives in docs/benchmarks.md)."""

from math import ceil, isclose

import pytest
from helpers import TINY_CPU, expr

from workbench import pipeline
from workbench.codegen.verify import Verification
from workbench.errors import UserError
from workbench.rtile.rprogram import make_program
from workbench.rtile.traffic import calculus
from workbench.vortex import compare
from workbench.vortex.analyzer import Dynamic
from workbench.vortex.dietcode import Dispatch
from workbench.workload import workload_from_args


def test_parse_values_keeps_the_order():
    assert compare.parse_values("1, 5,24,477", "--values") == (1, 5, 24, 477)


@pytest.mark.parametrize("text, message", [("0", "'0' is not a positive integer"), ("-3", "'-3' is not a positive"),
                                           ("x", "'x' is not a positive"), ("", "--values is empty"),
                                           ("1,,2", "'' is not a positive"), ("2.5", "'2.5' is not"),
                                           ("4,4", "4 is given twice")])
def test_parse_values_refuses_anything_but_positive_integers(text, message):
    with pytest.raises(UserError, match=message):
        compare.parse_values(text, "--values")


@pytest.mark.parametrize("value", [1, 8, 9, 24, 77])
def test_dietcode_score_is_throughput_times_padding_and_occupancy(value):
    """Unit tile 8 x 16 x 64 over N = 48, K = 64 on TINY_CPU's cores: padding is the useful share
    of ceil(v / 8) * 8 rows, the grid ceil(v / 8) x 3 tiles, occupancy its share of full waves."""
    template = expr("matmul", M=512, N=48, K=64)
    program = make_program(calculus(template), TINY_CPU, [(4, 16, 1), (8, 16, 16), (8, 16, 64)], [True] * 3, 0.0)
    units = TINY_CPU.compute_units
    tiles = ceil(value / 8) * 3
    expected = 5e9 * value / (ceil(value / 8) * 8) * tiles / (ceil(tiles / units) * units)
    assert isclose(compare.score(program, 5e9, Dynamic("M", "i", 512), value, units), expected)


def test_a_wrong_static_kernel_gets_no_time(monkeypatch):
    """The oracle's candidate whose output does not match numpy: None seconds and the reason."""
    import workbench.codegen.verify as verify

    e = expr("matmul", M=8, N=16, K=16)
    program = pipeline.construct(pipeline.request(e, "local-cpu", options=pipeline.Options(topk=1))).candidates[0].program
    monkeypatch.setattr(verify, "check_output", lambda *a: Verification(False, 1.0, 1.0, "max relative error 1"))
    assert compare.time_static(e, program, pipeline.load_device("local-cpu")) == (None, "wrong result: max relative error 1")


def test_a_wrong_dietcode_run_gets_no_time(monkeypatch):
    template = expr("matmul", M=16, N=48, K=64)
    program = make_program(calculus(template), TINY_CPU, [(4, 16, 1), (8, 16, 16), (8, 16, 64)], [True] * 3, 0.0)
    kernel = compare.MicroKernel("d16", 16, program, outer=8, seconds=1e-6, throughput=1e9, entry=None)
    monkeypatch.setattr(compare.vortex, "execute", lambda *a, **k: (Verification(False, 1.0, 1.0, "NaN in output"), None))
    row = compare._dietcode_at(Dispatch((16,), ("d16",)), {"d16": kernel}, Dynamic("M", "i", 64), 5)
    assert row == {"dietcode_seconds": None, "dietcode_kernel": "d16", "dietcode_correct": False,
                   "dietcode_error": "NaN in output"}


def test_vortex_is_the_dispatched_kernels_one_run():
    """Vortex's row takes the dispatched kernel's time (or its error) from the one run of every
    bundle kernel at that value: no second run of the same kernel."""
    from workbench.vortex.hierarchy import candidates
    from workbench.vortex.select import DispatchTable, dispatch, select

    template = expr("matmul", M=512, N=64, K=64)
    dyn = Dynamic("M", "i", 512)
    chosen = select(candidates(template, TINY_CPU, "i"), TINY_CPU, dyn, limit=3)
    table = DispatchTable(dyn, TINY_CPU, tuple((f"k{n}", p) for n, p in enumerate(chosen)))
    for value in (1, 100, 511):
        picked, predicted = dispatch(table, value)
        runs = {k: (1e-3 * (n + 1), "") for n, (k, _) in enumerate(table.kernels)}
        assert compare._vortex_at(table, runs, value) == {
            "vortex_seconds": runs[picked][0], "vortex_kernel": picked, "vortex_predicted_seconds": predicted,
            "vortex_correct": True, "vortex_error": ""}
        runs[picked] = (None, "max relative error 3")
        row = compare._vortex_at(table, runs, value)
        assert (row["vortex_seconds"], row["vortex_correct"], row["vortex_error"]) == (None, False,
                                                                                        "max relative error 3")


@pytest.mark.tvm
def test_small_benchmark_end_to_end():
    """M = dyn, K = N = 64 at 1, 20 and 33 with DietCode sampled at 16 and 32: every method
    verified and timed at every value; 20 lies within the samples, 1 and 33 outside."""
    workload = workload_from_args("matmul", "M=dyn,K=64,N=64", None, None, "float32")
    doc = compare.bench_dynamic(workload, pipeline.load_device("local-cpu"), (1, 20, 33), (16, 32), topk=2,
                                max_extent=128)
    assert doc["compile_seconds"] > 0 and doc["vortex_kernels"] and doc["dietcode"]["failed"] == []
    assert [r["value"] for r in doc["results"]] == [1, 20, 33]
    assert [r["in_samples"] for r in doc["results"]] == [False, True, False]
    kernels = doc["dietcode"]["kernels"]
    assert {k["sample"] for k in kernels.values()} <= {16, 32} and set(doc["dietcode"]["dispatch"]) == {16, 32}
    assert all(k["seconds_at_sample"] > 0 and k["throughput_flops"] > 0 for k in kernels.values())
    for r in doc["results"]:
        for method in ("vortex", "oracle", "numpy", "dietcode"):
            assert r[f"{method}_seconds"] > 0, (r["value"], method, r)
        assert r["vortex_correct"] and r["dietcode_correct"] and r["oracle_failed"] == [] and not r["numpy_error"]
        assert r["vortex_kernel"] in doc["vortex_kernels"] and r["dietcode_kernel"] in kernels
        assert set(r["vortex_kernels_seconds"]) == set(doc["vortex_kernels"])
        assert all(v > 0 for v in r["vortex_kernels_seconds"].values())
        assert 1 <= r["oracle_rank"] <= r["oracle_candidates"] <= 2
    assert all(v is not None and v > 0 for v in doc["geomean"].values()), doc["geomean"]


@pytest.mark.tvm
def test_an_expression_benchmarks_like_its_operator():
    """`--expr` with a dyn axis: Vortex, the oracle and DietCode built from the expression,
    verified and timed at every value; numpy, which covers catalog matmul and gemv only, says so."""
    workload = workload_from_args(None, "i=dyn,k=32,j=32", "C[i,j] += A[i,k] * B[k,j]", None, "float32")
    doc = compare.bench_dynamic(workload, pipeline.load_device("local-cpu"), (1, 7), (4,), topk=1, max_extent=64)
    assert [r["value"] for r in doc["results"]] == [1, 7]
    for r in doc["results"]:
        assert r["vortex_seconds"] > 0 and r["oracle_seconds"] > 0 and r["dietcode_seconds"] > 0, r
        assert r["vortex_correct"] and r["dietcode_correct"] and r["oracle_failed"] == []
        assert r["numpy_seconds"] is None and r["numpy_error"]


def test_bad_workload_or_values_fail_before_anything_is_built():
    device = pipeline.load_device("local-cpu")
    static = workload_from_args("matmul", "M=8,K=64,N=64", None, None, "float32")
    with pytest.raises(UserError, match="one dyn extent|dynamic"):
        compare.bench_dynamic(static, device, (1,), (16,))
    workload = workload_from_args("matmul", "M=dyn,K=64,N=64", None, None, "float32")
    with pytest.raises(UserError, match="--topk must be >= 1"):
        compare.bench_dynamic(workload, device, (1,), (16,), topk=0)
    with pytest.raises(UserError, match="M must be a positive integer, got 0"):
        compare.bench_dynamic(workload, device, (1, 0), (16,))
