"""The diagnosis against the roofs, on a hand-made estimate and a fixed CPU: which roof binds at
which measured time, and what the sentence says."""

import pytest
from helpers import TINY_CPU

from workbench.profile.diagnose import LATENCY, diagnose
from workbench.rtile.model import Estimate

PEAK = 200.0  # GFLOP/s: TINY_CPU's float32 peak
DRAM = TINY_CPU.layer("DRAM").bandwidth_gbps  # 20 GB/s


def estimate(flops=2 * 10**9, dram_bytes=10**9, bottleneck="DRAM") -> Estimate:
    compute, load = flops / (PEAK * 1e9), dram_bytes / (DRAM * 1e9)
    return Estimate(flops=flops, padded_flops=flops, bytes_per_layer=(("DRAM", dram_bytes),),
                    load_seconds=(("DRAM", load),), compute_seconds=compute, threads=1, blocks_per_unit=1, waves=1,
                    occupancy=1.0, bottleneck=bottleneck, predicted_seconds=max(compute, load), footprints=(0, 0, 0))


def test_rates_and_shares_are_work_over_time_over_the_roof():
    d = diagnose(estimate(), TINY_CPU, PEAK, seconds=0.1)
    assert d.gflops == pytest.approx(20.0)  # 2 GFLOP in 0.1 s
    assert dict(d.shares) == {"compute": pytest.approx(0.1), "DRAM": pytest.approx(0.5)}  # 10 GB/s of 20
    assert d.ratio == pytest.approx(0.1 / 0.05) and d.binding == LATENCY  # no share reaches 60 %
    assert dict(d.stages) == {"compute": pytest.approx(0.01), "DRAM": pytest.approx(0.05)}


def test_the_roof_pressed_against_binds():
    memory = diagnose(estimate(), TINY_CPU, PEAK, seconds=0.06)  # 1 GB in 0.06 s: 83 % of DRAM
    assert memory.binding == "DRAM" and "DRAM bandwidth binds, as the model predicted" in memory.sentence
    assert memory.sentence.startswith("as predicted")  # 0.06 against 0.05 predicted
    compute = diagnose(estimate(flops=2 * 10**10, bottleneck="DRAM"), TINY_CPU, PEAK, seconds=0.125)
    assert dict(compute.shares)["compute"] == pytest.approx(0.8)
    assert compute.binding == "compute" and "compute binds where the model predicted DRAM bandwidth" in compute.sentence


def test_a_slow_kernel_is_blamed_on_latency_and_overhead():
    d = diagnose(estimate(), TINY_CPU, PEAK, seconds=1.0)  # 20x the prediction, 5 % of DRAM
    assert d.sentence.startswith("20x slower than predicted") and "no roof binds" in d.sentence
    assert d.to_dict()["binding"] == LATENCY and d.to_dict()["sentence"] == d.sentence
    with pytest.raises(ValueError, match="positive"):
        diagnose(estimate(), TINY_CPU, PEAK, seconds=0.0)


def test_a_cpu_panel_copy_is_a_stage_beside_the_roofs_not_one():
    """A packed CPU kernel's estimate lists its panel copies ("packing into L2") among its stages
    and bytes; the diagnosis keeps the stage and puts no roof there (L2 is a roof of its own)."""
    est = estimate()
    packed = Estimate(**{**est.__dict__, "bytes_per_layer": est.bytes_per_layer + (("packing into L2", 10**8),),
                         "load_seconds": est.load_seconds + (("packing into L2", 0.001),)})
    d = diagnose(packed, TINY_CPU, PEAK, seconds=0.1)
    assert dict(d.shares) == {"compute": pytest.approx(0.1), "DRAM": pytest.approx(0.5)}
    assert dict(d.stages)["packing into L2"] == pytest.approx(0.001)


def test_an_operator_the_last_level_cache_holds_is_judged_against_that_caches_bandwidth():
    """Where the operator stays in a CPU's last-level cache, the bottom layer's reads are a share
    of that cache's bandwidth, as the model prices them: 1 GB in 0.1 s is half of DRAM's 20 GB/s
    but a fifth of a 50 GB/s L3, and the texts say where the reads came from. A spec without an
    LLC, or an operator past it, keeps DRAM's roof."""
    from dataclasses import replace

    llc = replace(TINY_CPU, llc_bytes=64 * 1024**2, llc_gbps=50.0)
    d = diagnose(estimate(), llc, PEAK, seconds=0.1, in_llc=True)
    assert dict(d.shares)["DRAM"] == pytest.approx(0.2) and dict(d.peaks)["DRAM"] == 50.0
    assert d.llc_serves == "DRAM" and d.to_dict()["llc_serves"] == "DRAM"
    assert "DRAM (from the last-level cache) 20%" in d.peak_text
    assert "20% of DRAM (from the last-level cache) bandwidth" in d.sentence
    pressed = diagnose(estimate(), llc, PEAK, seconds=0.025, in_llc=True)  # 40 GB/s of 50
    assert pressed.peak_text.endswith("binds DRAM (from the last-level cache)")
    assert "DRAM (from the last-level cache) bandwidth binds, as the model predicted" in pressed.sentence
    for plain in (diagnose(estimate(), llc, PEAK, seconds=0.1), diagnose(estimate(), TINY_CPU, PEAK, 0.1, in_llc=True)):
        assert dict(plain.shares)["DRAM"] == pytest.approx(0.5) and plain.llc_serves == "" and "last-level" not in plain.peak_text
