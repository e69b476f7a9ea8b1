"""`workbench whatif`: the JSON contract of docs/cli.md, sweeps, the edited spec written as TOML,
`--measure` on this CPU, and one-line errors with exit code 2."""

import json
import statistics

import pytest

from workbench.cli import main
from workbench.hardware.loader import load_spec
from workbench.profile.session import TURNS


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_set_gives_each_workload_both_top_ones(capsys, tmp_path):
    spec = tmp_path / "edited.toml"
    code, out, _ = run(capsys, "whatif", "--device", "v100", "--set", "shared.capacity_bytes=96KiB",
                       "--set", "global.bandwidth_gbps=2x", "--suite", "roller-table1", "--topk", "3",
                       "--out", str(spec), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["device"] == "v100" and doc["edits"] == ["shared.capacity_bytes=96KiB", "global.bandwidth_gbps=2x"]
    assert [c["field"] for c in doc["changes"]] == ["shared.capacity_bytes", "global.bandwidth_gbps"]
    assert doc["changes"][0]["after"] == 98304 and doc["topk"] == 3
    assert len(doc["results"]) > 1
    for entry in doc["results"]:
        for side in ("base", "edited"):
            assert {"tiles", "grid", "predicted_seconds", "bound"} <= set(entry[side])
            assert entry[side]["predicted_seconds"] > 0 and entry[side]["grid"] >= 1
        assert isinstance(entry["changed"], bool)
        assert entry["diverges_at_step"] is None or entry["diverges_at_step"] >= 1
        if entry["diverges_at_step"] is None:
            assert entry["base"]["tiles"] == entry["edited"]["tiles"]
        assert entry["predicted_speedup"] == pytest.approx(entry["base"]["predicted_seconds"]
                                                           / entry["edited"]["predicted_seconds"])
        assert 1 <= len(entry["edited_topk"]) <= 3
    written = load_spec(spec, check_target=False)
    assert written.name == doc["edited_device"] and written.layer("shared").capacity_bytes == 98304


def test_text_says_what_changed(capsys):
    code, out, _ = run(capsys, "whatif", "--device", "xeon-avx512", "--set", "compute_units=1",
                       "--workload", "cpu-core:mm-512")
    assert code == 0
    assert "derived: peak_gflops.float32 3046.4 -> 108.8" in out
    assert "cpu-core:mm-512" in out and "slower" in out and "geomean predicted speed-up" in out


def test_sweep_reports_the_curve_and_the_change_points(capsys):
    code, out, _ = run(capsys, "whatif", "--device", "xeon-avx512", "--sweep", "L2.capacity_bytes=256KiB:4MiB:5",
                       "--workload", "cpu-core:mm-1024", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["field"] == "L2.capacity_bytes" and doc["spacing"] == "geometric"
    assert doc["values"] == [2**18, 2**19, 2**20, 2**21, 2**22]
    (entry,) = doc["results"]
    assert entry["workload"] == "cpu-core:mm-1024" and len(entry["predicted_seconds"]) == 5
    for change in entry["changes"]:  # each change point: the top-1 differs from the value's before
        i = doc["values"].index(change["value"])
        assert change["previous"] == doc["values"][i - 1] and change["from"]["tiles"] == entry["top1"][i - 1]
        assert change["to"]["tiles"] == entry["top1"][i] != entry["top1"][i - 1]
    code, text, _ = run(capsys, "whatif", "--device", "xeon-avx512", "--sweep", "L2.capacity_bytes=256KiB:4MiB:5",
                        "--workload", "cpu-core:mm-1024")
    assert code == 0 and "geometric" in text and "cpu-core:mm-1024" in text


@pytest.mark.parametrize("argv, message", [
    (("--set", "L9.capacity_bytes=1", "--workload", "cpu-core:mm-512"), "L9.capacity_bytes: no such field"),
    (("--set", "L2.capacity_bytes=-1", "--workload", "cpu-core:mm-512"), "L2.capacity_bytes must be at least 1"),
    (("--set", "compute_units=0", "--workload", "cpu-core:mm-512"), "compute_units must be at least 1"),
    (("--set", "L2.capacity_bytes", "--workload", "cpu-core:mm-512"), "an edit is FIELD=VALUE"),
    (("--workload", "cpu-core:mm-512"), "give --set FIELD=VALUE"),
    (("--set", "compute_units=2", "--sweep", "compute_units=1:4:4", "--workload", "cpu-core:mm-512"), "give --set"),
    (("--set", "compute_units=2"), "give one of --workload"),
    (("--sweep", "compute_units=1:4:1", "--suite", "cpu-core"), "N must be an integer from 2 to 64"),
    (("--sweep", "compute_units=1:4:4", "--suite", "cpu-core", "--measure"), "--measure takes --set edits"),
    # a CPU LLVM does not know is refused as a spec file naming it is, not compared by name alone
    (("--set", "target.mcpu=znver44", "--workload", "cpu-core:mm-512"),
     "target.mcpu=znver44: target.mcpu 'znver44' is not a CPU this LLVM knows"),
    (("--base-set", "target.mcpu=haswel", "--set", "compute_units=2", "--workload", "cpu-core:mm-512"),
     "target.mcpu=haswel: target.mcpu 'haswel' is not a CPU this LLVM knows"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "whatif", "--device", "xeon-avx512", *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_base_set_edits_the_base_before_the_comparison(capsys):
    """AVX2 code against SSE4.2 on an AVX-512 spec: the base is the spec narrowed by --base-set
    (named after that edit, listed as base_edits), the same construction a plain --set of it
    gives, and the edit applies on top of it."""
    argv = ("--workload", "cpu-core:mm-512", "--json")
    code, out, err = run(capsys, "whatif", "--device", "xeon-avx512", "--base-set", "target.mcpu=x86-64-v3",
                         "--set", "target.mcpu=x86-64-v2", *argv)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["device"] == "xeon-avx512-target.mcpu-x86-64-v3" and doc["base_edits"] == ["target.mcpu=x86-64-v3"]
    assert doc["base_changes"] == [{"field": "target.mcpu", "before": "skylake-avx512", "after": "x86-64-v3"}]
    assert doc["edits"] == ["target.mcpu=x86-64-v2"] and doc["changes"][0]["before"] == "x86-64-v3"
    (entry,) = doc["results"]
    assert entry["predicted_speedup"] < 1  # half the lanes and no FMA
    code, out, _ = run(capsys, "whatif", "--device", "xeon-avx512", "--set", "target.mcpu=x86-64-v3", *argv)
    assert code == 0 and json.loads(out)["results"][0]["edited"] == entry["base"]
    code, out, _ = run(capsys, "whatif", "--device", "local-cpu", "--set", "target.mcpu=x86-64-v2", *argv)
    assert code == 0 and json.loads(out)["base_edits"] == []


def test_measure_needs_this_machine(capsys):
    code, _, err = run(capsys, "whatif", "--device", "v100", "--set", "compute_units=1", "--workload", "cpu-core:mm-512",
                       "--measure")
    assert code == 2 and "give --device local-cpu" in err and err.count("\n") == 1
    code, _, err = run(capsys, "whatif", "--device", "local-cpu", "--set", "L2.capacity_bytes=2x",
                       "--workload", "cpu-core:mm-512", "--measure")
    assert code == 2 and "L2.capacity_bytes=" in err and "not realisable on this machine" in err and err.count("\n") == 1
    # a --base-set is held to the same: an edit this CPU can make real, from local-cpu
    code, _, err = run(capsys, "whatif", "--device", "local-cpu", "--base-set", "L2.capacity_bytes=2x",
                       "--set", "compute_units=1", "--workload", "cpu-core:mm-512", "--measure")
    assert code == 2 and "L2.capacity_bytes=" in err and "not realisable on this machine" in err and err.count("\n") == 1
    code, _, err = run(capsys, "whatif", "--device", "v100", "--base-set", "compute_units=1", "--set", "compute_units=1",
                       "--workload", "cpu-core:mm-512", "--measure")
    assert code == 2 and "give --device local-cpu" in err and err.count("\n") == 1


@pytest.mark.parametrize("edits", [("--set", "compute_units=1"),
                                   ("--base-set", "target.mcpu=x86-64-v3", "--set", "target.mcpu=x86-64-v2")],
                         ids=["one-core", "avx2-to-sse4.2"])
def test_measure_times_both_top_ones_here(capsys, tmp_path, edits):
    """One core against all, and (on any x86 CPU with AVX2) AVX2 code against SSE4.2 code."""
    suite = tmp_path / "tiny.toml"
    suite.write_text('[suite]\nname = "tiny"\nsource = "a test"\n\n'
                     '[[workload]]\nid = "mm"\nop = "matmul"\ndtype = "float32"\nM = 64\nK = 64\nN = 64\n')
    code, out, err = run(capsys, "whatif", "--device", "local-cpu", *edits,
                         "--workload", f"{suite}:mm", "--topk", "2", "--measure", "--repeat", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    (entry,) = doc["results"]
    assert entry["measure_error"] == ""
    for key in ("predicted_speedup", "measured_speedup", "base_measured_seconds", "edited_measured_seconds"):
        assert entry[key] > 0, key
    # timed in turns: one time per side and round, the speed-up the median of the rounds' ratios
    base, edited = entry["base_measured_rounds"], entry["edited_measured_rounds"]
    assert len(base) == len(edited) == TURNS
    assert entry["measured_speedup"] == pytest.approx(statistics.median(b / e for b, e in zip(base, edited)))
    assert entry["base_measured_seconds"] == pytest.approx(statistics.median(base))
    assert doc["measured_within_tolerance"]["measured"] == 1
