"""The quick calibration that runs by itself the first time this machine's CPU profiles here
(`hardware.calibrate.first_use_due`, `calibrate_first_use`; `pipeline.calibrate_first_use`, the
CLI's one line), on a fake measurement: no test calibrates this machine by accident."""

import argparse
import os

import pytest

from test_calibrate import _results
from workbench import cli, pipeline
from workbench.errors import UserError
from workbench.hardware import calibrate
from workbench.hardware.calibrated import apply_measurements, calibrated_spec_path
from workbench.hardware.detect import detect_local_cpu
from workbench.hardware.loader import load_spec
from workbench.hardware.microbench import STARTUP_S, WARM_UP_S, slot_seconds


@pytest.fixture
def fake_calibration(monkeypatch):
    """Auto-calibration on, and `calibrate` replaced by hand-made plausible results; the calls
    it got are in the list returned."""
    monkeypatch.setenv(calibrate.AUTO_CALIBRATE_ENV, "1")
    calls = []

    def fake(spec, *, quick=False, progress=None, budget_seconds=0.0):
        calls.append(quick)
        return apply_measurements(spec, _results(spec, quick=True), "2026-01-02")

    monkeypatch.setattr(calibrate, "calibrate", fake)
    return calls


def test_the_first_profile_calibrates_once_and_local_cpu_loads_it(fake_calibration):
    lines = []
    note = pipeline.calibrate_first_use(lines.append)
    assert fake_calibration == [True]  # the quick calibration
    [announced] = lines
    assert announced.startswith("calibrating this CPU once (about ") and announced.endswith(" s)...")
    assert str(calibrated_spec_path()) in note
    assert load_spec("local-cpu").calibrated
    assert pipeline.calibrate_first_use(lines.append) == "" and lines == [announced]  # once
    assert fake_calibration == [True]


def test_quick_seconds_is_the_budget_the_builds_and_the_warm_ups():
    spec = detect_local_cpu()
    threads = max(1, min(spec.compute_units, os.cpu_count() or 1))
    todo = calibrate.probes(spec, threads, quick=True)
    seconds = calibrate.QUICK_BUDGET_S + calibrate.BUILD_SECONDS_PER_PROBE * len(todo) + WARM_UP_S
    if threads > 1:  # one core's DRAM read, in a process of its own: its start and warm-up, DRAM's slot, its build
        dram = max(i for i, p in enumerate(todo) if p.kind == "stream")
        seconds += (STARTUP_S + WARM_UP_S + slot_seconds(todo, calibrate.QUICK_BUDGET_S)[dram]
                    + calibrate.BUILD_SECONDS_PER_PROBE)
    assert calibrate.quick_seconds(spec) == pytest.approx(seconds)


def test_a_refused_calibration_is_said_recorded_and_not_retried_by_itself(monkeypatch, fake_calibration):
    def refuse(spec, **kwargs):
        fake_calibration.append("refused")
        raise UserError("calibration refused, nothing stored: L2 read at 600.0 GB/s, faster than L1 "
                        "(is another program using the CPU? run it again on a quiet machine)")

    monkeypatch.setattr(calibrate, "calibrate", refuse)
    note = pipeline.calibrate_first_use()
    assert note.startswith("calibration refused, nothing stored: L2 read at 600.0 GB/s, faster than L1 (is another "
                           "program using the CPU? run it again on a quiet machine); profiling with the detected spec")
    assert calibrate.refusal_path().is_file() and not calibrated_spec_path().exists()
    assert not load_spec("local-cpu").calibrated
    assert pipeline.calibrate_first_use() == "" and fake_calibration == ["refused"]
    # an explicit calibration that succeeds forgets the refusal
    calibrate.store_calibrated(apply_measurements(detect_local_cpu(), _results(detect_local_cpu(), quick=True), "2026-01-03"))
    assert not calibrate.refusal_path().exists() and load_spec("local-cpu").calibrated


def test_the_variable_turns_it_off(monkeypatch, fake_calibration):
    monkeypatch.setenv(calibrate.AUTO_CALIBRATE_ENV, "0")
    assert pipeline.calibrate_first_use() == "" and fake_calibration == []


def test_only_this_machine_uncalibrated_is_due(fake_calibration):
    detected = detect_local_cpu()
    assert calibrate.first_use_due(detected)
    assert not calibrate.first_use_due(apply_measurements(detected, _results(detected, quick=True), "2026-01-02"))
    assert not calibrate.first_use_due(load_spec("xeon-avx512"))  # a preset, uncalibrated: not this machine
    assert not calibrate.first_use_due(load_spec("v100"))


@pytest.mark.parametrize("device, runner, calibrates", [
    ("local-cpu", "local", True), ("xeon-avx512", "local", False), ("local-cpu", "rpc", False)])
def test_the_cli_says_so_in_one_line_for_a_local_profile_only(device, runner, calibrates, fake_calibration, capsys):
    cli._calibrate_first_use(argparse.Namespace(device=device, runner=runner))
    err = capsys.readouterr().err.splitlines()
    if calibrates:
        assert err[0].startswith("calibrating this CPU once (about ") and err[1].startswith("calibrated this CPU (quick)")
        assert len(err) == 2
    else:
        assert err == [] and fake_calibration == []


def test_whatif_measure_calibrates_before_it_edits(fake_calibration, capsys):
    # the edit here cannot be made real (a bigger L2): one line, exit 2, after the calibration,
    # since the base and the edited spec derive from the calibrated one
    code = cli.main(["whatif", "--device", "local-cpu", "--set", "L2.capacity_bytes=2x",
                     "--workload", "cpu-core:relu", "--measure"])
    err = capsys.readouterr().err
    assert code == 2 and fake_calibration == [True] and "calibrated this CPU (quick)" in err
    assert cli.main(["whatif", "--device", "local-cpu", "--set", "L2.capacity_bytes=2x",
                     "--workload", "cpu-core:relu"]) == 0
    assert fake_calibration == [True]  # once


def test_the_dashboard_says_so_in_one_line_the_first_time_this_machine_is_chosen(fake_calibration):
    from test_app import app

    at = app()  # the Workload page opens on this machine
    assert not at.exception, at.exception
    said = [c.value for c in at.caption if c.value.startswith("calibrated this CPU (quick)")]
    assert len(said) == 1 and fake_calibration == [True]
    assert any("calibrated (" in c.value for c in at.caption)  # the device caption: local-cpu as loaded now
    at.run()
    assert fake_calibration == [True]  # once
    assert not any(c.value.startswith("calibrated this CPU (quick)") for c in at.caption)


def test_a_calibration_that_fails_outright_never_stops_the_profile(monkeypatch, fake_calibration):
    def crash(spec, **kwargs):
        raise RuntimeError("LLVM exploded\nsecond line")

    monkeypatch.setattr(calibrate, "calibrate", crash)
    assert pipeline.calibrate_first_use().startswith("calibration failed: RuntimeError: LLVM exploded; profiling with")
    assert calibrate.refusal_path().read_text() == "calibration failed: RuntimeError: LLVM exploded\n"
