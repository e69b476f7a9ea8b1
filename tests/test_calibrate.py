"""Calibration: one quick real run on this machine (shared by the tests that need one), the pure
parts on hand-made results, and `load_spec("local-cpu")` picking up a calibrated file."""

from __future__ import annotations

import pytest

from workbench.errors import UserError
from workbench.hardware.calibrate import (
    Probe,
    ProbeResult,
    apply_measurements,
    calibrate,
    calibrated_spec_path,
    impossible,
    probes,
)
from workbench.hardware.detect import detect_local_cpu
from workbench.hardware.loader import load_spec, spec_from_toml_text, spec_to_toml


@pytest.fixture(scope="module")
def calibrated():
    lines = []
    spec = calibrate(detect_local_cpu(), quick=True, progress=lines.append)
    return spec, lines


def test_quick_calibration_measures_positive_ordered_numbers(calibrated):
    spec, lines = calibrated
    bandwidth = {layer.name: layer.bandwidth_gbps for layer in spec.layers}
    assert all(value > 0 for value in bandwidth.values())
    # L1 streams at hundreds of GB/s, DRAM at tens: a factor of 2 cannot flake.
    assert bandwidth["L1"] > 2 * bandwidth["DRAM"]
    assert dict(spec.peak_gflops)["float32"] > 0
    assert dict(spec.peak_gflops)["float64"] > 0
    assert [line.split(":")[0] for line in lines] == ["L1", "L2", "DRAM", "float32", "float64"]


def test_calibrated_spec_says_what_was_measured(calibrated):
    spec, _ = calibrated
    assert spec.calibrated
    assert "measured by workbench calibrate" in spec.source
    assert all("measured" in layer.source for layer in spec.layers)
    assert "measured" in dict(spec.sources)["peak_gflops"]
    registers = spec.layer("registers")
    # derived: float32 FMA rate / 2 FMAs x 3 operands x 4 B. Both are stored rounded to 0.1 (the
    # peak before the x6, the bandwidth after it), so they agree to 6 x 0.05 + 0.05 = 0.35.
    assert registers.bandwidth_gbps == pytest.approx(dict(spec.peak_gflops)["float32"] * 6, abs=0.35)
    assert registers.capacity_bytes == detect_local_cpu().layer("registers").capacity_bytes


def test_calibrated_spec_round_trips_through_toml(calibrated):
    spec, _ = calibrated
    assert spec_from_toml_text(spec_to_toml(spec)) == spec


def _results(spec, **changed):
    values = {"L1": 500.0, "L2": 200.0, "DRAM": 40.0, "float32": 300.0, "float64": 150.0} | changed
    return tuple(ProbeResult(p, values[p.label], runs=5, threads=2) for p in probes(spec, threads=2))


def test_plausible_results_pass_the_sanity_check():
    spec = load_spec("xeon-avx512")
    assert impossible(_results(spec)) == []
    assert impossible(_results(spec, L2=570.0)) == []  # within the slack of L1's 500 GB/s: noise


@pytest.mark.parametrize("changed, message", [
    ({"float32": 9.0, "float64": 31.0}, "float32 peak 9.0 GFLOP/s below float64 31.0 GFLOP/s"),
    ({"L2": 600.0}, "L2 read at 600.0 GB/s, faster than L1 above it at 500.0 GB/s"),
    ({"DRAM": 250.0}, "DRAM read at 250.0 GB/s, faster than L2 above it at 200.0 GB/s"),
])
def test_impossible_results_are_named(changed, message):
    assert impossible(_results(load_spec("xeon-avx512"), **changed)) == [message]


def test_calibration_measures_again_then_refuses_impossible_results(monkeypatch):
    import workbench.hardware.calibrate as calibration

    spec = load_spec("xeon-avx512")
    calls = []

    def busy(spec, todo, threads, budget, progress=None):
        calls.append(todo)
        return _results(spec, float32=9.0, float64=31.0)

    monkeypatch.setattr(calibration, "measure", busy)
    lines = []
    with pytest.raises(UserError, match="calibration refused, nothing stored: float32 peak 9.0 GFLOP/s below float64"):
        calibrate(spec, progress=lines.append)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert lines == ["impossible results (float32 peak 9.0 GFLOP/s below float64 31.0 GFLOP/s): measuring again"]


def test_calibration_keeps_a_plausible_second_measurement(monkeypatch):
    import workbench.hardware.calibrate as calibration

    spec = load_spec("xeon-avx512")
    answers = [_results(spec, float32=9.0, float64=31.0), _results(spec)]
    monkeypatch.setattr(calibration, "measure", lambda *args, **kw: answers.pop(0))
    assert dict(calibrate(spec).peak_gflops) == {"float32": 300.0, "float64": 150.0} and answers == []


def test_apply_measurements_replaces_bandwidths_and_peaks():
    spec = load_spec("xeon-avx512")
    out = apply_measurements(spec, _results(spec), "2026-01-02")
    assert [layer.bandwidth_gbps for layer in out.layers] == [1800.0, 500.0, 200.0, 40.0]
    assert dict(out.peak_gflops) == {"float32": 300.0, "float64": 150.0}
    assert "on 2026-01-02" in out.layer("L2").source and "best of 5 runs" in out.layer("L2").source
    assert out.layer("L2").capacity_bytes == spec.layer("L2").capacity_bytes
    assert (out.name, out.target, out.calibrated) == (spec.name, spec.target, True)


def test_probes_size_working_sets_from_the_layers():
    spec = load_spec("xeon-avx512")
    by_label = {p.label: p for p in probes(spec, threads=28)}
    assert by_label["L1"] == Probe("stream", "L1", 16 * 1024)  # half of 32 KiB per core
    assert by_label["L2"].bytes_per_core == 512 * 1024
    assert by_label["DRAM"].bytes_per_core == 256 * 1024**2 // 28  # 256 MiB over all cores
    assert probes(spec, threads=28, quick=True)[2].bytes_per_core < by_label["DRAM"].bytes_per_core
    assert [(p.kind, p.label) for p in probes(spec, threads=28)][2:] == [
        ("stream", "DRAM"),
        ("fma", "float32"),
        ("fma", "float64"),
    ]


def test_gpu_specs_are_refused_without_a_gpu():
    with pytest.raises(UserError, match="no GPU present to calibrate v100"):
        calibrate(load_spec("v100"), quick=True)


def test_calibrated_path_follows_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert calibrated_spec_path() == tmp_path / "tile-workbench" / "local-cpu.toml"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    assert calibrated_spec_path().parts[-4:] == (".local", "share", "tile-workbench", "local-cpu.toml")


def test_load_spec_local_cpu_uses_the_calibrated_file(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert not load_spec("local-cpu").calibrated
    detected = detect_local_cpu()
    spec = apply_measurements(detected, _results(detected), "2026-01-02")
    path = calibrated_spec_path()
    path.parent.mkdir(parents=True)
    path.write_text(spec_to_toml(spec))
    loaded = load_spec("local-cpu")
    assert loaded.calibrated and loaded.layer("DRAM").bandwidth_gbps == 40.0


def test_load_spec_local_cpu_ignores_a_file_of_another_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    detected = detect_local_cpu()
    other = detect_local_cpu(cores=detected.compute_units + 1)
    path = calibrated_spec_path()
    path.parent.mkdir(parents=True)
    path.write_text(spec_to_toml(apply_measurements(other, _results(other), "2026-01-02")))
    assert load_spec("local-cpu") == detected


def test_a_budget_must_be_positive():
    with pytest.raises(UserError, match="budget must be positive"):
        calibrate(detect_local_cpu(), budget_seconds=0)
