"""What-if edits of a spec (`hardware.edit`): fields by their TOML names, values with units and
factors, bounds in one line naming the field, the fields an edit of units or ISA derives, the
edited spec's name and TOML, and sweeps' values."""

from dataclasses import replace

import pytest
from helpers import device

from workbench.errors import UserError
from workbench.hardware.bounds import NAME, NAME_MAX
from workbench.hardware.edit import (
    AMD_NO_FMA, X86_ISAS, Edit, apply_edits, derived_name, editable_fields, field_info, parse_edit, parse_sweep, sweep_values,
)
from workbench.hardware.parse import spec_from_toml_text


def edit(spec, *texts):
    return apply_edits(spec, [parse_edit(t) for t in texts])


@pytest.mark.parametrize("text, field, value", [
    ("L2.capacity_bytes=2MiB", "L2.capacity_bytes", 2 * 2**20),
    ("L1.capacity_bytes=48KiB", "L1.capacity_bytes", 48 * 2**10),
    ("l2.capacity_bytes=1.5mib", "L2.capacity_bytes", 3 * 2**19),  # a layer's name and the unit in any case
    ("DRAM.bandwidth_gbps=2x", "DRAM.bandwidth_gbps", 256.0),
    ("compute_units=14", "compute_units", 14),
    ("device.launch_overhead_us=2.5", "launch_overhead_us", 2.5),
    ("peak_gflops.float32=20000", "peak_gflops.float32", 20000.0),
    ("target.mcpu=cascadelake", "target.mcpu", "cascadelake"),
])
def test_an_edit_sets_the_field_it_names(text, field, value):
    done = edit(device("xeon-avx512"), text)
    assert [(c.field, c.after) for c in done.changes] == [(field, value)]
    assert field_info(done.spec, field).value == value


def test_the_edited_spec_is_named_after_its_edits_and_its_toml_reads_back_to_it():
    base = device("xeon-avx512")
    done = edit(base, "L2.capacity_bytes=2MiB", "DRAM.bandwidth_gbps=200")
    assert done.spec.name == "xeon-avx512-L2.capacity_bytes-2MiB-DRAM.bandwidth_gbps-200"
    assert spec_from_toml_text(done.toml, check_target=False) == done.spec
    assert done.spec.layer("L2").capacity_bytes == 2**21 and done.spec.layer("DRAM").bandwidth_gbps == 200.0
    assert not done.spec.calibrated  # what-if numbers measure no machine
    assert replace(done.spec, name=base.name, source=base.source, layers=base.layers) == base  # nothing else moved
    calibrated = edit(replace(base, calibrated=True), "compute_units=14").spec
    assert not calibrated.calibrated
    many = tuple(Edit("L2.latency_ns", f"{8 + i}") for i in range(12))
    name = derived_name(base, many)
    assert len(name) <= NAME_MAX and NAME.fullmatch(name) and "whatif" in name
    assert derived_name(base, many) == name != derived_name(base, many[:-1])


@pytest.mark.parametrize("text, message", [
    ("L2.capacity_bytes=0", "L2.capacity_bytes=0: L2.capacity_bytes must be at least 1"),
    ("L3.capacity_bytes=1MiB", "L3.capacity_bytes: no such field of xeon-avx512"),
    ("compute_units=1.5", "compute_units must be a whole number"),
    ("compute_units=9000", "compute_units must be at most 8192"),
    ("compute_units=2MiB", "compute_units is not a size in bytes"),
    ("warp_size=wide", "'wide' is not a number"),
    ("peak_gflops.float16=100", "peak_gflops.float16: no such field"),
    ("DRAM.bandwidth_gbps=inf", "DRAM.bandwidth_gbps must be a finite number"),
    ("target.mcpu=../x", "target.mcpu must be a name"),
    # a check across fields: the loader's, with the layer's name instead of its index
    ("L1.capacity_bytes=4MiB", "L2.capacity_bytes (1048576) must be larger than L1's (4194304)"),
    ("L2", "an edit is FIELD=VALUE"),
    ("a b=1", "is not a field name"),
])
def test_a_bad_edit_is_one_line_naming_the_field(text, message):
    with pytest.raises(UserError) as err:
        edit(device("xeon-avx512"), text)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert "layer[" not in str(err.value)


def test_every_editable_field_can_be_set_to_its_own_value():
    for name in ("xeon-avx512", "v100", "h100"):
        spec = device(name)
        names = [info.name for info in editable_fields(spec)]
        assert len(names) == len(set(names)), name
        for info in editable_fields(spec):
            done = apply_edits(spec, [Edit(info.name, str(info.value))])
            assert field_info(done.spec, info.name).value == info.value, info.name
            if info.low is not None:
                assert info.low <= info.value <= info.high, info.name


def test_fewer_units_scale_the_rates_that_are_per_unit():
    cpu = device("xeon-avx512")
    done = edit(cpu, "compute_units=7")  # a quarter of the cores
    spec = done.spec
    assert spec.compute_units == 7 and dict(spec.target)["num-cores"] == 7
    assert dict(spec.peak_gflops)["float32"] == pytest.approx(dict(cpu.peak_gflops)["float32"] / 4, rel=1e-5)
    for before, after in zip(cpu.layers, spec.layers):  # a CPU core streams DRAM at its own rate too
        assert after.bandwidth_gbps == pytest.approx(before.bandwidth_gbps / 4, rel=1e-5)
        assert after.capacity_bytes == before.capacity_bytes
    assert {c.field for c in done.derived} >= {"peak_gflops.float32", "L1.bandwidth_gbps", "target.num-cores"}
    gpu = device("v100")
    half = edit(gpu, "compute_units=40").spec
    assert half.layer("global").bandwidth_gbps == gpu.layer("global").bandwidth_gbps  # the memory controllers'
    assert half.layer("shared").bandwidth_gbps == pytest.approx(gpu.layer("shared").bandwidth_gbps * 40 / 80, rel=1e-5)
    assert dict(half.tensor_core_gflops)["float16"] == pytest.approx(dict(gpu.tensor_core_gflops)["float16"] / 2, rel=1e-5)


def test_fewer_cores_read_dram_at_most_at_their_own_streams():
    """Where the spec knows one core's DRAM stream (`core_dram_gbps`), n fewer cores read DRAM
    at min(n x that, all cores' bandwidth): the memory saturates before every core streams. More
    cores, or no such figure, scale it with the cores as before."""
    cpu = replace(device("xeon-avx512"), core_dram_gbps=12.0)  # 28 cores, DRAM 100 GB/s
    dram = cpu.layers[-1].bandwidth_gbps
    for cores, expected in ((1, 12.0), (4, 48.0), (14, min(dram, 14 * 12.0)), (28, dram)):
        assert edit(cpu, f"compute_units={cores}").spec.layers[-1].bandwidth_gbps == pytest.approx(expected), cores
    assert edit(cpu, "compute_units=56").spec.layers[-1].bandwidth_gbps == pytest.approx(2 * dram)
    assert edit(replace(cpu, core_dram_gbps=0.0), "compute_units=1").spec.layers[-1].bandwidth_gbps == pytest.approx(dram / 28)
    assert edit(cpu, "core_dram_gbps=6").spec.core_dram_gbps == 6.0  # editable, and written back
    assert "core_dram_gbps = 6.0" in edit(cpu, "core_dram_gbps=6").toml


def test_the_rows_the_prefetchers_follow_are_editable_where_the_spec_says():
    """`prefetch_rows` (a Zen 3's 16, detected) is an edit's field where the spec gives it, and
    written back; a spec without it (the model's default) has no such field to edit."""
    cpu = device("xeon-avx512")
    zen3 = replace(cpu, prefetch_rows=16)
    done = edit(zen3, "prefetch_rows=48")
    assert done.spec.prefetch_rows == 48 and "prefetch_rows = 48" in done.toml
    with pytest.raises(UserError):
        edit(zen3, "prefetch_rows=0")
    with pytest.raises(UserError):
        edit(cpu, "prefetch_rows=16")


def test_a_field_the_edits_name_is_never_derived_over():
    done = edit(device("xeon-avx512"), "peak_gflops.float32=1000", "compute_units=14")
    assert dict(done.spec.peak_gflops)["float32"] == 1000.0
    assert "peak_gflops.float32" not in {c.field for c in done.derived}


def test_a_narrower_isa_sets_the_vector_width_registers_and_peak():
    cpu = device("xeon-avx512")  # Intel, AVX-512 with FMA
    avx2 = edit(cpu, "target.mcpu=haswell").spec
    assert (avx2.warp_size, avx2.registers_per_unit) == (8, 16)
    assert avx2.layers[0].capacity_bytes == 16 * 32 and avx2.layers[0].transaction_bytes == 32
    assert dict(avx2.peak_gflops)["float32"] == pytest.approx(dict(cpu.peak_gflops)["float32"] / 2, rel=1e-5)
    sse = edit(cpu, "target.mcpu=x86-64-v2").spec  # a quarter of the lanes, and no FMA: Intel's adds share its ports
    assert sse.warp_size == 4
    assert dict(sse.peak_gflops)["float32"] == pytest.approx(dict(cpu.peak_gflops)["float32"] / 8, rel=1e-5)
    amd = replace(cpu, vendor="amd")  # Zen keeps two thirds of a lane's flops without FMA (measured)
    assert dict(edit(amd, "target.mcpu=x86-64-v2").spec.peak_gflops)["float32"] == pytest.approx(
        dict(cpu.peak_gflops)["float32"] / 4 * AMD_NO_FMA, rel=1e-5)
    back = edit(edit(amd, "target.mcpu=x86-64-v2").spec, "target.mcpu=skylake-avx512").spec
    assert dict(back.peak_gflops)["float32"] == pytest.approx(dict(cpu.peak_gflops)["float32"], rel=1e-5)
    assert set(X86_ISAS.values()) >= {X86_ISAS["haswell"], X86_ISAS["x86-64-v2"]}


def test_a_double_pumped_core_keeps_its_fma_lanes_in_narrower_code():
    """Zen 4 runs a zmm FMA on its two 256-bit pipes (one FMA pipe at 16 lanes): its AVX2 code
    issues on both, the same lanes a cycle; SSE4.2 half of them and no FMA; back to znver4, one
    pipe again. A core with 512-bit pipes (the Xeon) halves its peak with the lanes."""
    xeon = device("xeon-avx512")
    zen4 = replace(xeon, vendor="amd", fma_pipes=1, target=tuple(
        (k, "znver4" if k == "mcpu" else v) for k, v in xeon.target))
    peak = dict(zen4.peak_gflops)["float32"]
    avx2 = edit(zen4, "target.mcpu=x86-64-v3").spec
    assert (avx2.warp_size, avx2.fma_pipes) == (8, 2) and dict(avx2.peak_gflops)["float32"] == pytest.approx(peak)
    sse = edit(zen4, "target.mcpu=x86-64-v2").spec
    assert sse.fma_pipes == 2 and dict(sse.peak_gflops)["float32"] == pytest.approx(peak / 2 * AMD_NO_FMA, rel=1e-5)
    back = edit(avx2, "target.mcpu=znver4").spec
    assert back.fma_pipes == 1 and dict(back.peak_gflops)["float32"] == pytest.approx(peak)
    assert edit(xeon, "target.mcpu=x86-64-v3").spec.fma_pipes == xeon.fma_pipes


def test_an_isa_edit_maps_each_micro_kernel_to_the_same_vectors_at_the_new_width():
    from workbench.hardware.spec import MicroKernel

    cpu = replace(device("xeon-avx512"), micro_kernels=(MicroKernel("float32", 6, 32, 2000.0),
                                                        MicroKernel("float32", 14, 32, 2500.0)))
    done = edit(cpu, "target.mcpu=haswell")  # 6 x 2 zmm -> 6 x 2 ymm; 14 x 2 = 28 ymm no longer fit 16
    assert done.spec.micro_kernels == (MicroKernel("float32", 6, 16, 1000.0),)
    # a calibrated AVX2 Zen's float64 3 x 12 is 9 ymm; as SSE4.2 code 3 x 6, still 9 (2 doubles an
    # xmm): the loader's own check of the edited spec passes, at half the lanes and AMD_NO_FMA
    zen = replace(done.spec, vendor="amd", micro_kernels=(MicroKernel("float64", 3, 12, 90.0),
                                                          MicroKernel("float32", 6, 16, 200.0)))
    sse = edit(zen, "target.mcpu=x86-64-v2").spec
    kernels = {(k.dtype, k.rows, k.cols): k.gflops for k in sse.micro_kernels}
    assert kernels == {("float64", 3, 6): pytest.approx(45.0 * AMD_NO_FMA, rel=1e-5),
                       ("float32", 6, 8): pytest.approx(100.0 * AMD_NO_FMA, rel=1e-5)}
    assert sorted(k.vectors(sse.warp_size) for k in sse.micro_kernels) == [9, 12]


def test_a_sweep_is_geometric_over_octaves_and_linear_otherwise():
    spec = device("xeon-avx512")
    values, geometric = sweep_values(spec, parse_sweep("L2.capacity_bytes=256KiB:8MiB:6"))
    assert geometric and values == tuple(2**18 * 2**i for i in range(6))
    values, geometric = sweep_values(spec, parse_sweep("DRAM.bandwidth_gbps=1x:2x:5"))
    assert not geometric and values == (128.0, 160.0, 192.0, 224.0, 256.0)
    values, _ = sweep_values(spec, parse_sweep("compute_units=1:3:5"))  # whole numbers, repeats dropped
    assert values == (1, 2, 3)


@pytest.mark.parametrize("text, message", [
    ("L2.capacity_bytes=8MiB:256KiB:4", "LO must be below HI"),
    ("L2.capacity_bytes=1:2", "a sweep is FIELD=LO:HI:N"),
    ("L2.capacity_bytes=1:2:1", "N must be an integer from 2 to 64"),
    ("target.mcpu=a:b:3", "target.mcpu is text"),
    ("compute_units=0:4:3", "compute_units must be at least 1"),
])
def test_a_bad_sweep_is_one_line(text, message):
    with pytest.raises(UserError, match=message):
        sweep_values(device("xeon-avx512"), parse_sweep(text))
