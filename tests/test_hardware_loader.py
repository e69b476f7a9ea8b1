import dataclasses
import json
import os

import pytest
from helpers import user_error_in_child
from test_invariants import detected_cpus
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import UserError
from workbench.hardware import targets
from workbench.hardware.bounds import MIN_GBPS, ON_CHIP_GBPS, check_bounds
from workbench.hardware.detect import DEFAULT_CPU_LAUNCH_US
from workbench.hardware.loader import MAX_SPEC_BYTES, SPECS_DIR, list_presets, load_spec
from workbench.hardware.parse import DEFAULT_GPU_LAUNCH_US, spec_from_toml_text
from workbench.hardware.write import spec_summary, spec_to_toml

PRESETS = ("a100", "h100", "h200", "k80", "mi50", "orin-nano", "rtx4090", "v100", "xeon-avx512")
DEVICE_NUMBERS = (
    "compute_units",
    "warp_size",
    "teu_per_unit",
    "max_threads_per_block",
    "max_threads_per_unit",
    "registers_per_thread_cap",
    "registers_per_unit",
    "peak_gflops",
    "target",
    "launch_overhead_us",
)
CPU_NUMBERS = ("fma_latency_cycles", "fma_pipes")


def test_presets_are_the_documented_devices():
    assert list_presets() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_round_trips(name):
    spec = load_spec(name)
    assert spec.name == name
    again = spec_from_toml_text(spec_to_toml(spec))
    assert again == spec
    assert again.sources == spec.sources


@pytest.mark.parametrize("name", PRESETS)
def test_every_number_of_a_preset_has_a_source(name):
    spec = load_spec(name)
    sourced = dict(spec.sources)
    wanted = DEVICE_NUMBERS + (("tensor_core_gflops", "tensor_core") if spec.tensor_core_gflops else ())
    wanted += CPU_NUMBERS if spec.kind == "cpu" else ()
    assert [key for key in wanted if not sourced.get(key, "").strip()] == []
    assert spec.source.strip()
    assert all(layer.source.strip() for layer in spec.layers)


@pytest.mark.parametrize("name", PRESETS)
def test_register_layer_holds_the_register_cap(name):
    spec = load_spec(name)
    top = spec.layers[0]
    bytes_per_register = 4 if spec.kind == "gpu" else spec.warp_size * 4
    assert (top.name, top.scope) == ("registers", "thread")
    assert top.capacity_bytes == spec.registers_per_thread_cap * bytes_per_register
    assert spec.layers[-1].scope == "device"


def test_preset_targets_are_accepted_by_tvm():
    tvm = pytest.importorskip("tvm")
    for name in PRESETS:
        spec = load_spec(name)
        assert tvm.target.Target(spec.target_dict()).kind.name == dict(spec.target)["kind"]


def test_v100_uses_the_roller_artifact_numbers():
    spec = load_spec("v100")
    shared, dram = spec.layer("shared"), spec.layer("global")
    assert (spec.compute_units, spec.teu_per_unit, spec.warp_size) == (80, 4, 32)
    assert (spec.max_threads_per_block, spec.max_threads_per_unit, spec.registers_per_thread_cap) == (512, 2048, 96)
    assert (spec.peak("float32"), spec.peak("float16", tensor_core=True)) == (12480.0, 125000.0)
    assert (shared.capacity_bytes, shared.bandwidth_gbps, shared.banks, shared.bank_width_bytes) == (49152, 12080.0, 32, 4)
    assert (dram.bandwidth_gbps, dram.transaction_bytes) == (750.0, 32)
    assert spec.tensor_core_fragment == (16, 16, 16)


def test_k80_and_mi50_use_the_roller_settings():
    k80, mi50 = load_spec("k80"), load_spec("mi50")
    assert (k80.compute_units, k80.layer("shared").bank_width_bytes) == (13, 8)
    assert (mi50.warp_size, mi50.layer("global").transaction_bytes, mi50.registers_per_thread_cap) == (64, 64, 70)
    assert k80.tensor_core_gflops == () and mi50.tensor_core_gflops == ()


def test_cpu_preset_is_an_llvm_avx512_target():
    spec = load_spec("xeon-avx512")
    assert [layer.name for layer in spec.layers] == ["registers", "L1", "L2", "DRAM"]
    assert spec.target_dict() == {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 28}
    assert (spec.warp_size, spec.registers_per_unit, spec.layers[spec.unit_layer_index].name) == (16, 32, "L2")
    # Skylake-SP: 4-cycle FMA on two 512-bit units; every zmm register is the micro-kernel's
    assert (spec.fma_latency_cycles, spec.fma_pipes, spec.fma_accumulators) == (4, 2, 8)
    assert spec.registers_per_thread_cap == spec.registers_per_unit == 32


@pytest.mark.parametrize("name", PRESETS)
def test_fma_facts_belong_to_cpus(name):
    spec = load_spec(name)
    if spec.kind == "cpu":
        assert spec.fma_latency_cycles >= 1 and spec.fma_pipes >= 1
    else:
        assert (spec.fma_latency_cycles, spec.fma_pipes, spec.fma_accumulators) == (0, 0, 0)


def test_a_cpu_spec_without_fma_facts_gets_the_conservative_default():
    """5 cycles x 2 pipes (Haswell, Zen 2): the most accumulators a two-pipe core needs."""
    text = "\n".join(line for line in XEON_TEXT.splitlines() if not line.startswith("fma_"))
    spec = spec_from_toml_text(text, check_target=False)
    assert (spec.fma_latency_cycles, spec.fma_pipes) == (5, 2)
    assert "fma_latency_cycles = 5" in spec_to_toml(spec)  # written back, so a reload keeps them


@pytest.mark.parametrize(
    "text, old, new, message",
    [
        ("xeon", "fma_pipes = 2\n", "", "device.fma_pipes is missing (give both"),
        ("xeon", "fma_pipes = 2", "fma_pipes = 0", "device.fma_pipes must be a positive integer, got 0"),
        ("xeon", "fma_latency_cycles = 4", "fma_latency_cycles = 4.5", "device.fma_latency_cycles must be a positive integer"),
        ("v100", "fma_latency_cycles = 0", "fma_latency_cycles = 4", "describe CPU cores: 0 (or absent) on a GPU"),
        # the last-level cache: both keys or neither, positive, a CPU's only
        ("xeon", "fma_pipes = 2\n", "fma_pipes = 2\nllc_bytes = 1048576\n", "device.llc_gbps is missing (give both"),
        ("xeon", "fma_pipes = 2\n", "fma_pipes = 2\nllc_bytes = 0\nllc_gbps = 9.0\n",
         "device.llc_bytes must be a positive integer, got 0"),
        ("v100", "[device]\n", "[device]\nllc_bytes = 1048576\nllc_gbps = 9.0\n", "a GPU's L2 is device.l2_bytes"),
    ],
)
def test_broken_fma_and_llc_facts_name_the_field(text, old, new, message):
    source = {"xeon": XEON_TEXT, "v100": V100_TEXT}[text]
    assert source.count(old) == 1, old
    with pytest.raises(UserError) as info:
        spec_from_toml_text(source.replace(old, new), check_target=False)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_cpu_spec_may_state_its_last_level_cache():
    text = XEON_TEXT.replace("fma_pipes = 2\n", "fma_pipes = 2\nllc_bytes = 40370176\nllc_gbps = 180.5\n")
    spec = spec_from_toml_text(text, check_target=False)
    assert (spec.llc_bytes, spec.llc_gbps) == (40370176, 180.5)
    assert spec_from_toml_text(spec_to_toml(spec), check_target=False) == spec
    assert spec_from_toml_text(XEON_TEXT, check_target=False).llc_bytes == 0  # absent: none


def _preset_text(name: str) -> str:
    return (SPECS_DIR / f"{name}.toml").read_text()


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_states_its_launch_overhead_and_says_it_is_an_estimate(name):
    """The value is in the file itself (not the loader's default), and its source says it was
    not measured on the device: none of the presets' launches were."""
    spec = load_spec(name)
    assert "\nlaunch_overhead_us = " in _preset_text(name)
    assert 0 < spec.launch_overhead_us < 100
    assert spec.launch_seconds == pytest.approx(spec.launch_overhead_us * 1e-6)
    assert dict(spec.sources)["launch_overhead_us"].startswith("estimate, not measured on this device")


@pytest.mark.parametrize("text, kind, wanted", [("v100", "gpu", DEFAULT_GPU_LAUNCH_US), ("xeon", "cpu", DEFAULT_CPU_LAUNCH_US)])
def test_a_spec_written_before_the_launch_field_loads_with_a_noted_default(text, kind, wanted):
    source = {"xeon": XEON_TEXT, "v100": V100_TEXT}[text]
    old = "\n".join(line for line in source.splitlines() if not line.startswith("launch_overhead_us"))
    spec = spec_from_toml_text(old, check_target=False)
    assert spec.kind == kind and spec.launch_overhead_us == wanted
    assert dict(spec.sources)["launch_overhead_us"].startswith(f"not in the spec file: {wanted:g} us assumed")
    assert spec_from_toml_text(spec_to_toml(spec), check_target=False) == spec  # written back, kept


def test_a_zero_launch_overhead_is_allowed():
    spec = spec_from_toml_text(V100_TEXT.replace("launch_overhead_us = 5.0", "launch_overhead_us = 0"), check_target=False)
    assert spec.launch_overhead_us == 0.0 and spec.launch_seconds == 0.0


@pytest.mark.parametrize("new, message", [
    ("launch_overhead_us = -1.0", "device.launch_overhead_us must be a number >= 0, got -1.0"),
    ('launch_overhead_us = "5 us"', "device.launch_overhead_us must be a number >= 0, got '5 us'"),
    ("launch_overhead_us = true", "device.launch_overhead_us must be a number >= 0, got True"),
    ("launch_overhead_us = nan", "device.launch_overhead_us must be a number >= 0"),
    ("launch_overhead_us = 50000.0", "device.launch_overhead_us must be below 10000 us (microseconds), got 50000.0"),
])
def test_a_bad_launch_overhead_is_one_line_naming_the_field(new, message):
    assert V100_TEXT.count("launch_overhead_us = 5.0") == 1
    with pytest.raises(UserError) as info:
        spec_from_toml_text(V100_TEXT.replace("launch_overhead_us = 5.0", new), label="spec v100.toml", check_target=False)
    assert str(info.value).startswith("spec v100.toml: ") and message in str(info.value) and "\n" not in str(info.value)


def test_summary_is_json():
    summary = json.loads(json.dumps(spec_summary(load_spec("v100"))))
    assert summary["name"] == "v100" and summary["kind"] == "gpu"
    assert [layer["name"] for layer in summary["layers"]] == ["registers", "shared", "global"]
    assert summary["target"]["host"] == {"kind": "llvm"}
    assert summary["peak_gflops"]["float32"] == 12480.0


V100_TEXT = spec_to_toml(load_spec("v100"))

BROKEN = [
    ("compute_units = 80\n", "", "device.compute_units is missing"),
    ("compute_units = 80\n", "compute_units = true\n", "device.compute_units must be a positive integer, got True"),
    ("\nwarp_size = 32", '\nwarp_size = "32"', "device.warp_size must be a positive integer, got '32'"),
    ("teu_per_unit = 4", "teu_per_unit = 4.0", "device.teu_per_unit must be a positive integer, got 4.0"),
    ('kind = "gpu"', 'kind = "tpu"', "device.kind must be one of gpu, cpu, got 'tpu'"),
    ("\nwarp_size = 32", "\nwrap_size = 32", "unknown field device.wrap_size"),
    ("bandwidth_gbps = 12080.0", "bandwidth_gbps = 'fast'", "layer[1].bandwidth_gbps must be a positive number, got 'fast'"),
    ("bandwidth_gbps = 750.0", "bandwidth_gbps = nan", "layer[2].bandwidth_gbps must be a positive number"),
    ("capacity_bytes = 384", "capacity_bytes = -384", "layer[0].capacity_bytes must be a positive integer, got -384"),
    ("latency_ns = 2.6", "latency_ns = -1.0", "layer[0].latency_ns must be a number >= 0"),
    ('scope = "unit"', 'scope = "block"', "layer[1].scope must be one of thread, unit, device, got 'block'"),
    ('scope = "unit"', 'scope = "thread"', "no layer has scope 'unit'"),
    ('scope = "device"', 'scope = "unit"', "layer[2].scope must be 'device'"),
    ("capacity_bytes = 49152", "capacity_bytes = 100", "layer[1].capacity_bytes (100) must be larger than layer[0]'s"),
    ('name = "shared"', 'name = "registers"', "layer[1].name 'registers' is used by another layer"),
    ("banks = 32", "banks = 0", "layer[1].banks and layer[1].bank_width_bytes"),
    ('source = "capacity: 48 KB', 'sauce = "capacity: 48 KB', "unknown field layer[1].sauce"),
    ("float32 = 12480.0", "bfloat16 = 12480.0", "peak_gflops.float32 is missing"),
    ("float32 = 12480.0", "float32 = -1.0", "peak_gflops.float32 must be a positive number, got -1.0"),
    ("float32 = 12480.0", "fp32 = 12480.0", "peak_gflops.fp32 is not a dtype name"),
    ("fragment = [16, 16, 16]", "fragment = [16, 16]", "tensor_core.fragment must be [m, n, k]"),
    ('kind = "cuda"', 'kind = "llvm"', "target.kind 'llvm' does not fit device.kind 'gpu'"),
    ('arch = "sm_70"', 'arch = ["sm_70"]', "target.arch must be a string, number or boolean"),
    ("max_threads_per_unit = 2048", "max_threads_per_unit = 256", "device.max_threads_per_block (512) must not exceed"),
    ("\nwarp_size = 32", "\nwarp_size = = 32", "TOML syntax error"),
]


@pytest.mark.parametrize("old, new, message", BROKEN, ids=[case[2][:40] for case in BROKEN])
def test_broken_spec_names_the_field(old, new, message):
    assert V100_TEXT.count(old) == 1, old
    with pytest.raises(UserError) as info:
        spec_from_toml_text(V100_TEXT.replace(old, new), label="spec v100.toml")
    text = str(info.value)
    assert text.startswith("spec v100.toml: ") and message in text
    assert "\n" not in text


def test_spec_without_layers_is_refused():
    text = V100_TEXT[: V100_TEXT.index("[[layer]]")]
    with pytest.raises(UserError, match="layer is missing"):
        spec_from_toml_text(text)


def test_error_names_the_file(tmp_path):
    path = tmp_path / "v100.toml"
    path.write_text(V100_TEXT.replace("bandwidth_gbps = 12080.0", "bandwidth_gbps = 'fast'"))
    with pytest.raises(UserError) as info:
        load_spec(path)
    assert str(info.value) == "spec v100.toml: layer[1].bandwidth_gbps must be a positive number, got 'fast'"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent.toml", "no such file"),
        (lambda d: d, r"not a regular file \(a directory\)"),
        (lambda d: _latin1(d), "not UTF-8 text"),
        (lambda d: _sparse(d / "huge.toml", MAX_SPEC_BYTES + 1), f"{MAX_SPEC_BYTES + 1:,} bytes is over the {MAX_SPEC_BYTES:,}-byte limit"),
    ],
)
def test_unreadable_spec_file(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(UserError, match=f"^spec {path}: {message}"):
        load_spec(path)


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)  # no disk or time spent
    return path


def _child_error(path) -> str:
    return user_error_in_child("workbench.hardware.loader", 'load_spec(PATH)', path)


def test_fifo_and_device_files_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    assert _child_error(fifo) == f"spec {fifo}: not a regular file (a FIFO)"
    assert _child_error("/dev/zero") == "spec /dev/zero: not a regular file (a character device)"


def _latin1(directory):
    path = directory / "latin1.toml"
    path.write_bytes(b'[device]\nname = "caf\xe9"\n')
    return path


def test_unknown_device_lists_the_choices():
    with pytest.raises(UserError, match=r"unknown device 'v1000'.*v100.*local-cpu"):
        load_spec("v1000")


def test_presets_load_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_spec("a100").compute_units == 108
    assert load_spec(SPECS_DIR / "k80.toml").name == "k80"
    assert load_spec(str(SPECS_DIR / "mi50.toml")).name == "mi50"


def test_local_cpu_is_detected():
    spec = load_spec("local-cpu")
    assert (spec.name, spec.kind, spec.calibrated) == ("local-cpu", "cpu", False)


printable = st.text(min_size=1).filter(str.strip)


@settings(max_examples=60, deadline=None)
@given(
    vendor=printable,
    source=printable,
    bandwidth=st.floats(min_value=MIN_GBPS, max_value=ON_CHIP_GBPS),
    registers=st.integers(min_value=1, max_value=49151),
    host=st.dictionaries(st.text(min_size=1), st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), printable), max_size=3),
)
def test_round_trip_is_exact(vendor, source, bandwidth, registers, host):
    v100 = load_spec("v100")
    top = dataclasses.replace(v100.layers[0], capacity_bytes=registers, bandwidth_gbps=bandwidth, source=source)
    target = tuple(sorted(dict(v100.target, host=tuple(sorted({"kind": "llvm", **host}.items()))).items()))
    spec = dataclasses.replace(
        v100, vendor=vendor, layers=(top,) + v100.layers[1:], target=target, sources=(("target", source),)
    )
    # This is about TOML quoting of any text: TVM (which refuses unknown target options such as
    # these random host keys) is left out; the target checks have tests of their own below.
    again = spec_from_toml_text(spec_to_toml(spec), check_target=False)
    assert again == spec and again.sources == spec.sources


XEON_TEXT = spec_to_toml(load_spec("xeon-avx512"))
ORIN_TEXT = spec_to_toml(load_spec("orin-nano"))
MI50_TEXT = spec_to_toml(load_spec("mi50"))

# (spec text, old, new, what the one-line error must say). Each target here passes
# `tvm.target.Target` or names what TVM refuses; the garbage triple segfaulted export before.
BAD_TARGETS = [
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mtriple = "garbage"', "target.mtriple 'garbage' names no architecture this LLVM compiles for"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mtriple = "foo-linux-gnu"', "target.mtriple 'foo-linux-gnu'"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "garbage"', "target.mcpu 'garbage' is not a CPU this LLVM knows"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "native"', "target.mcpu 'native' is not a CPU"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "skylake-avx512"\nmtriple = "aarch64-linux-gnu"', "target.mcpu 'skylake-avx512' is not a CPU this LLVM knows for aarch64-linux-gnu"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mattr = "+garbage"', "target: TVM refuses it: Option 'mattr'"),
    (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "skylake-avx512"\nfoo = 1', "target: TVM refuses it: Unknown config option 'foo'"),
    (XEON_TEXT, "num-cores = 28", "num-cores = 0", "target.num-cores must be a positive integer, got 0"),
    (XEON_TEXT, "num-cores = 28", 'num-cores = "many"', "target: TVM refuses it: Option 'num-cores'"),
    (V100_TEXT, 'arch = "sm_70"', 'arch = "sm_garbage"', "target.arch 'sm_garbage' is not a cuda architecture"),
    (V100_TEXT, 'arch = "sm_70"', 'arch = "garbage"', "TVM refuses it: Check failed: (StartsWith(archStr, \"sm_\")) is false"),
    (MI50_TEXT, 'mcpu = "gfx906"', 'mcpu = "gfx9999"', "target.mcpu 'gfx9999' is not a rocm architecture"),
    (ORIN_TEXT, 'mcpu = "cortex-a78ae"', 'mcpu = "skylake"', "target.host.mcpu 'skylake' is not a CPU this LLVM knows for aarch64-linux-gnu"),
    (ORIN_TEXT, 'mtriple = "aarch64-linux-gnu"', 'mtriple = "garbage"', "target.host.mtriple 'garbage'"),
    (V100_TEXT, '[target.host]\nkind = "llvm"', '[target.host]\nkind = "garbage"', 'TVM refuses it: Target kind "garbage" is not defined'),
]


@pytest.mark.parametrize("text, old, new, message", BAD_TARGETS, ids=[case[2] for case in BAD_TARGETS])
def test_a_target_tvm_or_llvm_refuses_is_one_line_at_load(capfd, text, old, new, message):
    assert text.count(old) == 1, old
    targets.target_problem.cache_clear()  # so TVM and LLVM are asked here, with fd 2 captured
    with pytest.raises(UserError) as info:
        spec_from_toml_text(text.replace(old, new), label="spec bad.toml")
    assert str(info.value).startswith("spec bad.toml: ") and message in str(info.value)
    assert "\n" not in str(info.value)
    # LLVM and TVM log an unknown triple or CPU on file descriptor 2: the loader keeps them quiet.
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    "text, old, new, wanted",
    [
        (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "cortex-a78ae"\nmtriple = "aarch64-linux-gnu"',
         {"mcpu": "cortex-a78ae", "mtriple": "aarch64-linux-gnu"}),
        (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mcpu = "znver3"\nmtriple = "x86_64-linux-gnu"',
         {"mcpu": "znver3", "mtriple": "x86_64-linux-gnu"}),
        (XEON_TEXT, 'mcpu = "skylake-avx512"', 'mtriple = "riscv64-unknown-linux-gnu"', {"mtriple": "riscv64-unknown-linux-gnu"}),
        (V100_TEXT, 'arch = "sm_70"', 'arch = "sm_90a"', {"arch": "sm_90a"}),
    ],
)
def test_targets_of_other_machines_are_accepted(text, old, new, wanted):
    """LLVM knows every architecture it was built with, whatever CPU runs the loader."""
    target = spec_from_toml_text(text.replace(old, new)).target_dict()
    assert {key: target.get(key) for key in wanted} == wanted


# -- measured register micro-kernels (issue 14): [micro_kernels.<dtype>] "<rows>x<cols>" = GFLOP/s


def _with_micro_kernels():
    from workbench.hardware.spec import MicroKernel

    kernels = (MicroKernel("float32", 1, 16, 60.5), MicroKernel("float32", 14, 32, 1800.0), MicroKernel("float64", 6, 32, 950.25))
    spec = load_spec("xeon-avx512")
    return dataclasses.replace(spec, micro_kernels=kernels, sources=tuple(sorted(spec.sources + (("micro_kernels", "measured"),))))


def test_micro_kernels_round_trip_through_toml():
    spec = _with_micro_kernels()
    text = spec_to_toml(spec)
    assert "[micro_kernels.float32]\n1x16 = 60.5\n14x32 = 1800.0\n" in text
    assert "[micro_kernels.float64]\n6x32 = 950.25\n" in text
    again = spec_from_toml_text(text)
    assert again == spec and again.sources == spec.sources
    assert again.micro_kernel("float32", 14, 32).gflops == 1800.0 and again.micro_kernel("float32", 14, 16) is None
    assert json.loads(json.dumps(spec_summary(again)))["micro_kernels"] == {
        "float32": {"1x16": 60.5, "14x32": 1800.0}, "float64": {"6x32": 950.25}
    }


MICRO_TEXT = spec_to_toml(_with_micro_kernels())
BROKEN_MICRO = [
    ("1x16 = 60.5", "1x16 = 'fast'", "micro_kernels.float32.1x16 must be a positive number, got 'fast'"),
    ("1x16 = 60.5", "1x16 = 0", "micro_kernels.float32.1x16 must be a positive number, got 0"),
    ("1x16 = 60.5", "1by16 = 60.5", "micro_kernels.float32.1by16 is not a register tile <rows>x<columns> (such as 6x16)"),
    ("1x16 = 60.5", "0x16 = 60.5", "micro_kernels.float32.0x16 is not a register tile"),
    ("[micro_kernels.float64]", "[micro_kernels.fp64]", "micro_kernels.fp64 is not a dtype name"),
    ("1x16 = 60.5", "1x16 = 3400.0", "micro_kernels.float32.1x16 (3400 GFLOP/s) is faster than the float32 peak (3046.4 GFLOP/s) x 1.1"),
    ("[micro_kernels.float64]\n6x32 = 950.25", "[micro_kernels]\nfloat64 = 5", "micro_kernels.float64 must be a table"),
]


@pytest.mark.parametrize("old, new, message", BROKEN_MICRO, ids=[case[2][:50] for case in BROKEN_MICRO])
def test_broken_micro_kernels_name_the_key(old, new, message):
    assert MICRO_TEXT.count(old) == 1, old
    with pytest.raises(UserError) as info:
        spec_from_toml_text(MICRO_TEXT.replace(old, new), label="spec x.toml", check_target=False)
    assert str(info.value).startswith("spec x.toml: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_micro_kernels_belong_to_cpus():
    text = V100_TEXT + "\n[micro_kernels.float32]\n1x16 = 60.5\n"
    with pytest.raises(UserError, match="micro_kernels are CPU register micro-kernels: not on a GPU spec"):
        spec_from_toml_text(text, check_target=False)


# -- what hardware can be (issue 36): every number within a physical range, names identifiers


BEYOND = [
    (V100_TEXT, "bandwidth_gbps = 750.0", "bandwidth_gbps = 1e30", "layer[2].bandwidth_gbps must be at most 100000 GB/s, got 1e+30"),
    (V100_TEXT, "bandwidth_gbps = 12080.0", "bandwidth_gbps = 2e7", "layer[1].bandwidth_gbps must be at most 1e+07 GB/s"),
    (V100_TEXT, "bandwidth_gbps = 750.0", "bandwidth_gbps = 1e-9", "layer[2].bandwidth_gbps must be at least 0.1 GB/s"),
    (V100_TEXT, "latency_ns = 400.0", "latency_ns = 0.01", "layer[2].latency_ns must be at least 0.1 ns, got 0.01"),
    (V100_TEXT, "latency_ns = 400.0", "latency_ns = 0", "layer[2].latency_ns must be at least 0.1 ns, got 0"),
    (V100_TEXT, "latency_ns = 400.0", "latency_ns = 1e9", "layer[2].latency_ns must be at most 100000 ns"),
    (V100_TEXT, "capacity_bytes = 17179869184", "capacity_bytes = 1180591620717411303424",
     "layer[2].capacity_bytes must be at most 281474976710656 bytes at scope 'device'"),
    (V100_TEXT, "transaction_bytes = 32", "transaction_bytes = 1048576", "layer[2].transaction_bytes must be at most 4096"),
    (V100_TEXT, "banks = 32", "banks = 100000", "layer[1].banks must be at most 256"),
    (V100_TEXT, "compute_units = 80\n", "compute_units = 1000000\n", "device.compute_units must be at most 8192, got 1000000"),
    (V100_TEXT, "\nwarp_size = 32", "\nwarp_size = 4096", "device.warp_size must be at most 128"),
    (V100_TEXT, "max_threads_per_block = 512", "max_threads_per_block = 4096", "device.max_threads_per_block must be at most 1024"),
    (V100_TEXT, "registers_per_unit = 65536", "registers_per_unit = 4294967296", "device.registers_per_unit must be at most 1048576"),
    (V100_TEXT, "l2_bytes = 6291456", "l2_bytes = 1099511627776", "device.l2_bytes must be at most 4294967296"),
    (V100_TEXT, "float32 = 12480.0", "float32 = 1e12", "peak_gflops.float32 must be at most 1e+08 GFLOP/s, got 1e+12"),
    (V100_TEXT, "float32 = 12480.0", "float32 = 1e-5", "peak_gflops.float32 must be at least 0.1 GFLOP/s"),
    (V100_TEXT, "float16 = 125000.0", "float16 = 1e15", "tensor_core_gflops.float16 must be at most 1e+08 GFLOP/s"),
    (V100_TEXT, "fragment = [16, 16, 16]", "fragment = [16, 16, 100000]", "tensor_core.fragment[2] must be at most 256"),
    (V100_TEXT, "launch_overhead_us = 5.0", "launch_overhead_us = 5e-6", "device.launch_overhead_us must be at least 0.01 us"),
    (XEON_TEXT, "fma_latency_cycles = 4", "fma_latency_cycles = 1000", "device.fma_latency_cycles must be at most 32"),
    (XEON_TEXT, "fma_pipes = 2\n", "fma_pipes = 2\nllc_bytes = 1048576\nllc_gbps = 1e12\n", "device.llc_gbps must be at most 1e+07 GB/s"),
    (XEON_TEXT, "ways = 8", "ways = 100000", "layer[1].ways must be at most 256"),
    (XEON_TEXT, "fma_pipes = 2\n", "fma_pipes = 2\nprefetch_rows = 100000\n", "device.prefetch_rows must be at most 1024"),
    (XEON_TEXT, "fma_pipes = 2\n", "fma_pipes = 2\nprefetch_rows = 0\n", "device.prefetch_rows must be"),
    (V100_TEXT, "compute_units = 80\n", "compute_units = 80\nprefetch_rows = 16\n",
     "device.prefetch_rows is what a CPU core's prefetchers follow: a CPU's only"),
    (V100_TEXT, 'name = "v100"', 'name = "../.."', "device.name must be an identifier of letters, digits and single '.', "
                                                   "'_' or '-' between them (at most 64 characters), got '../..'"),
    (V100_TEXT, 'name = "v100"', 'name = "specs/v100"', "device.name must be an identifier"),
    (V100_TEXT, 'name = "v100"', 'name = "v100 "', "device.name must be an identifier"),
    (V100_TEXT, 'name = "v100"', f'name = "{"v" * 65}"', "device.name must be an identifier"),
    (V100_TEXT, 'name = "shared"', 'name = "../shared"', "layer[1].name must be an identifier"),
    (MICRO_TEXT, "14x32 = 1800.0", "140x32 = 1800.0", "micro_kernels.float32.140x32: 280 vector accumulators do not fit "
                                                      "in device.registers_per_unit (32)"),
]


@pytest.mark.parametrize("text, old, new, message", BEYOND, ids=[case[3][:50] for case in BEYOND])
def test_a_number_no_hardware_has_or_a_name_that_is_a_path_is_refused(text, old, new, message):
    assert text.count(old) == 1, old
    with pytest.raises(UserError) as info:
        spec_from_toml_text(text.replace(old, new), label="spec x.toml", check_target=False)
    assert str(info.value).startswith(f"spec x.toml: {message}") and "\n" not in str(info.value)


def test_presets_detected_and_generated_specs_are_within_the_bounds():
    """The bounds catch nonsense, never a device: every preset (loaded above), the spec detected
    for this CPU, and the tests' hand-built CPUs and GPU."""
    from helpers import TINY_CPU
    from test_fuzz_kernels import CPUS
    from test_hardware_spec import TINY_GPU

    from workbench.hardware.detect import detect_local_cpu

    for spec in (detect_local_cpu(), TINY_CPU, TINY_GPU, *CPUS, *map(load_spec, PRESETS)):
        check_bounds(spec)
    detected = detect_local_cpu()
    assert spec_from_toml_text(spec_to_toml(detected), check_target=False) == detected


@settings(max_examples=100, deadline=None)
@given(spec=detected_cpus())
def test_every_spec_detection_builds_is_within_the_bounds(spec):
    """Any SIMD class, core count (up to 128), clock and caches `device detect` may meet."""
    check_bounds(spec)


# Every number a spec states, as a path to it in the DeviceSpec: (kind of spec, field as the
# error names it, getter, setter). Capacities only of the bottom layer: an absurd capacity above
# it is refused first by the hierarchy (each layer larger than the one above), naming the next.
def _layer_field(i: int, key: str):
    def get(spec):
        return getattr(spec.layers[i], key)

    def put(spec, value):
        layers = list(spec.layers)
        layers[i] = dataclasses.replace(layers[i], **{key: value})
        return dataclasses.replace(spec, layers=tuple(layers))

    return f"layer[{i}].{key}", get, put


def _table_field(table: str, dtype: str):
    def put(spec, value):
        return dataclasses.replace(spec, **{table: tuple((d, value if d == dtype else v) for d, v in getattr(spec, table))})

    return f"{table}.{dtype}", lambda spec: dict(getattr(spec, table))[dtype], put


def _device_field(key: str):
    return f"device.{key}", lambda spec: getattr(spec, key), lambda spec, value: dataclasses.replace(spec, **{key: value})


def _numbers(spec) -> list:
    from workbench.hardware.bounds import DEVICE_INTS

    fields = [_device_field(key) for key in DEVICE_INTS if getattr(spec, key)]
    fields += [_device_field(key) for key in ("launch_overhead_us", "llc_gbps") if getattr(spec, key)]
    for i, layer in enumerate(spec.layers):
        keys = ("bandwidth_gbps", "latency_ns", "transaction_bytes", "banks", "bank_width_bytes", "ways")
        fields += [_layer_field(i, key) for key in keys if getattr(layer, key)]
    fields.append(_layer_field(len(spec.layers) - 1, "capacity_bytes"))
    fields += [_table_field("peak_gflops", d) for d, _ in spec.peak_gflops]
    fields += [_table_field("tensor_core_gflops", d) for d, _ in spec.tensor_core_gflops]
    return fields


@st.composite
def _absurd(draw):
    """A preset or this CPU's detected spec with one number scaled by 10^8 to 10^30 (a float, also
    down by as much): far past any unit slip, never a device (the smallest float a spec here
    states, a 1.6 ns latency, and the largest, 989500 GFLOP/s, both land outside the bounds)."""
    spec = draw(st.sampled_from(("v100", "h200", "mi50", "xeon-avx512", "local-cpu")))
    spec = load_spec(spec, check_target=False)
    name, get, put = draw(st.sampled_from(_numbers(spec)))
    value, scale = get(spec), 10 ** draw(st.integers(8, 30))
    if isinstance(value, float) and draw(st.booleans()):
        return name, put(spec, value / scale)
    return name, put(spec, value * scale if isinstance(value, int) else value * float(scale))


@settings(max_examples=150, deadline=None)
@given(case=_absurd())
def test_a_spec_field_at_an_absurd_magnitude_is_refused_naming_it(case):
    name, spec = case
    with pytest.raises(UserError) as info:
        spec_from_toml_text(spec_to_toml(spec), label="spec x.toml", check_target=False)
    assert str(info.value).startswith(f"spec x.toml: {name} must be ") and "\n" not in str(info.value)
