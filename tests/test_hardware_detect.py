import os
import platform
from dataclasses import replace
from pathlib import Path

import pytest

from workbench.hardware.detect import (
    DEFAULT_CPU_LAUNCH_US,
    DEFAULT_FMA,
    count_cpu_list,
    detect_local_cpu,
    fma_facts,
    parse_cache_size,
    parse_caches,
    parse_cpuinfo,
    parse_l1_ways,
    parse_meminfo,
    prefetch_facts,
)
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.write import spec_to_toml

AVX512_COMMON = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma bmi1 avx2 bmi2 avx512f avx512dq avx512cd avx512bw avx512vl"

# (cpuinfo, caches as (level, type, size, shared_cpu_list), max clock in kHz or None)
MACHINES = {
    "sapphire-rapids": (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        f"cpu MHz\t\t: 2000.000\nflags\t\t: {AVX512_COMMON} avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\n",
        [("1", "Data", "48K", "0,56"), ("1", "Instruction", "32K", "0,56"), ("2", "Unified", "2048K", "0,56"),
         ("3", "Unified", "107520K", "0-111")],
        3800000,
    ),
    "cascade-lake": (
        "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Gold 6248\ncpu MHz\t\t: 2500.000\n"
        f"flags\t\t: {AVX512_COMMON} avx512_vnni\n",
        [("1", "Data", "32K", "0"), ("2", "Unified", "1024K", "0")],
        None,
    ),
    "skylake-sp": (
        f"vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Platinum 8180\nflags\t\t: {AVX512_COMMON}\n",
        [("1", "Data", "32K", "0"), ("2", "Unified", "1024K", "0")],
        2500000,
    ),
    "zen4": (
        "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9654 96-Core Processor\ncpu MHz\t\t: 2400.000\n"
        f"flags\t\t: {AVX512_COMMON} avx512_bf16 avx512_vnni avx512_vbmi2 gfni\n",
        # one CCX: 32 MiB of L3 over 8 cores
        [("1", "Data", "32K", "0"), ("2", "Unified", "1024K", "0"), ("3", "Unified", "32768K", "0-7")],
        None,
    ),
    "haswell": (
        "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 60\nmodel name\t: Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz\ncpu MHz\t\t: 3400.000\n"
        "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma bmi1 avx2 bmi2\n",
        [("1", "Data", "32K", "0-1"), ("2", "Unified", "256K", "0-1")],
        None,
    ),
    "neoverse-n1": (
        "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\n",
        [("1", "Data", "64K", "0"), ("1", "Instruction", "64K", "0"), ("2", "Unified", "1024K", "0")],
        3000000,
    ),
    "unknown-arm": (
        "Features\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xabc\n",
        [("1", "Data", "32K", "0"), ("2", "Unified", "2M", "0-3")],
        None,
    ),
}

# name: (fp32 lanes, LLVM mcpu, L1 bytes, L2 bytes per core, GHz, vendor); caches shared only by
# SMT siblings (the CPUs sharing the L1d) stay whole, a cluster L2 is split over its cores.
EXPECTED = {
    "sapphire-rapids": (16, "sapphirerapids", 48 * 1024, 2048 * 1024, 3.8, "intel"),
    "cascade-lake": (16, "cascadelake", 32 * 1024, 1024 * 1024, 2.5, "intel"),
    "skylake-sp": (16, "skylake-avx512", 32 * 1024, 1024 * 1024, 2.5, "intel"),
    "zen4": (16, "znver4", 32 * 1024, 1024 * 1024, 2.4, "amd"),
    "haswell": (8, "haswell", 32 * 1024, 256 * 1024, 3.4, "intel"),
    "neoverse-n1": (4, "neoverse-n1", 64 * 1024, 1024 * 1024, 3.0, "arm"),
    "unknown-arm": (4, "generic", 32 * 1024, 512 * 1024, 2.0, "arm"),
}
# name: (FMA latency in cycles, full-width vector FMAs per cycle), from the vendors' optimization
# manuals: Golden Cove, Skylake-SP and Cascade Lake 4 x 2 (two 512-bit units), Zen 4 4 x 1 (a
# zmm FMA on two 256-bit pipes), Haswell 5 x 2, Neoverse N1 4 x 2; an unknown core the default.
EXPECTED_FMA = {
    "sapphire-rapids": (4, 2), "cascade-lake": (4, 2), "skylake-sp": (4, 2), "zen4": (4, 1),
    "haswell": (5, 2), "neoverse-n1": (4, 2), "unknown-arm": (DEFAULT_FMA.latency_cycles, DEFAULT_FMA.pipes),
}


# Sapphire Rapids: 105 MiB of L3 over 112 CPUs, 56 cores with their SMT siblings; 4 of them.
# Zen 4: a CCX's 32 MiB over its 8 cores (no SMT sibling in this tree); 4 of them. The others
# name no L3 in sysfs: no LLC, and the model reads the bottom layer's bandwidth.
EXPECTED_LLC = {"sapphire-rapids": 107520 * 1024 // 56 * 4, "zen4": 32768 * 1024 // 8 * 4}


def reloaded(spec, isa: str):
    """The spec written as TOML and read back. A spec of a CPU of another architecture than this
    host's names its LLVM triple, as one written for another machine must: the loader checks
    `mcpu` against the host's triple otherwise."""
    if isa != platform.machine():
        triple = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}[isa]
        spec = replace(spec, target=tuple(sorted(dict(spec.target, mtriple=triple).items())))
    return spec, spec_from_toml_text(spec_to_toml(spec))


def fake_machine(root: Path, cpuinfo: str, caches, max_khz) -> tuple[str, str]:
    proc, cpu0 = root / "proc", root / "sys" / "devices" / "system" / "cpu" / "cpu0"
    proc.mkdir(parents=True)
    (proc / "cpuinfo").write_text(cpuinfo)
    (proc / "meminfo").write_text("MemTotal:       16384000 kB\nMemFree:         1000 kB\n")
    for i, (level, kind, size, shared) in enumerate(caches):
        index = cpu0 / "cache" / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (index / name).write_text(value + "\n")
    if max_khz:
        (cpu0 / "cpufreq").mkdir(parents=True)
        (cpu0 / "cpufreq" / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    return str(root / "sys"), str(proc)


@pytest.mark.tvm  # reads a spec back through the loader, which asks TVM about its target
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_detection_on_fake_trees(tmp_path, machine):
    sysfs, proc = fake_machine(tmp_path, *MACHINES[machine])
    lanes, mcpu, l1, l2, ghz, vendor = EXPECTED[machine]
    spec = detect_local_cpu(sysfs_root=sysfs, proc_root=proc, cores=4)
    registers = 16 if lanes == 8 else 32
    assert (spec.name, spec.kind, spec.vendor, spec.calibrated) == ("local-cpu", "cpu", vendor, False)
    assert (spec.warp_size, spec.compute_units, spec.registers_per_unit) == (lanes, 4, registers)
    assert spec.target_dict() == {"kind": "llvm", "mcpu": mcpu, "num-cores": 4}
    assert [layer.name for layer in spec.layers] == ["registers", "L1", "L2", "DRAM"]
    # Every vector register is the micro-kernel's: its loads and broadcast count in its footprint.
    assert spec.registers_per_thread_cap == registers
    assert spec.layer("registers").capacity_bytes == registers * lanes * 4
    assert (spec.layer("L1").capacity_bytes, spec.layer("L2").capacity_bytes) == (l1, l2)
    assert spec.layer("DRAM").capacity_bytes == 16384000 * 1024
    latency, pipes = EXPECTED_FMA[machine]
    assert (spec.fma_latency_cycles, spec.fma_pipes, spec.fma_accumulators) == (latency, pipes, latency * pipes)
    assert {"fma_latency_cycles", "fma_pipes"} <= set(dict(spec.sources))
    # the launch is a stated constant until calibration measures it, and its source says so
    assert spec.launch_overhead_us == DEFAULT_CPU_LAUNCH_US
    assert dict(spec.sources)["launch_overhead_us"].startswith("estimate, not measured here")
    # Peak estimate: cores x GHz x lanes x 2 (FMA) x FMA pipes.
    assert spec.peak("float32") == pytest.approx(4 * ghz * lanes * 2 * pipes, rel=1e-3)
    # the last-level cache: each core's share of the L3 (SMT siblings one core) x the spec's cores
    assert spec.llc_bytes == EXPECTED_LLC.get(machine, 0)
    assert (spec.llc_gbps > 0) == (machine in EXPECTED_LLC) == ("llc_gbps" in dict(spec.sources))
    written, read = reloaded(spec, parse_cpuinfo(MACHINES[machine][0]).isa)
    assert read == written


def test_smt_siblings_count_as_one_core(tmp_path, monkeypatch):
    # The fake Sapphire Rapids pairs CPU 0 with its SMT sibling 56 (a shared L1d).
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    sysfs, proc = fake_machine(tmp_path, *MACHINES["sapphire-rapids"])
    spec = detect_local_cpu(sysfs_root=sysfs, proc_root=proc)
    assert (spec.compute_units, spec.target_dict()["num-cores"]) == (4, 4)
    assert spec.layer("L1").capacity_bytes == 48 * 1024


@pytest.mark.tvm  # reads a spec back through the loader, which asks TVM about its target
def test_detected_mcpu_names_are_known_to_llvm():
    codegen = pytest.importorskip("tvm.target.codegen")
    for machine, (_, mcpu, *_rest) in EXPECTED.items():
        triple = "aarch64-linux-gnu" if "arm" in machine or "neoverse" in machine else "x86_64-linux-gnu"
        assert codegen.llvm_is_valid_cpu(mcpu, triple), mcpu


@pytest.mark.tvm  # reads a spec back through the loader, which asks TVM about its target
def test_missing_files_fall_back_to_labelled_assumptions(tmp_path):
    spec = detect_local_cpu(sysfs_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"), cores=2)
    assert (spec.warp_size, dict(spec.target)["mcpu"]) == (4, "generic")
    assert (spec.layer("L1").capacity_bytes, spec.layer("L2").capacity_bytes) == (32 * 1024, 1024 * 1024)
    assert "assumed" in spec.layer("L2").source and "assumed" in spec.layer("DRAM").source
    assert "2 GHz assumed" in dict(spec.sources)["peak_gflops"]
    assert spec_from_toml_text(spec_to_toml(spec)) == spec


@pytest.mark.tvm  # reads a spec back through the loader, which asks TVM about its target
def test_detection_on_this_machine():
    spec = detect_local_cpu()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert spec.name == "local-cpu" and 1 <= spec.compute_units <= cpus
    assert dict(spec.target)["mcpu"] not in ("", "native")
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text()).flags if Path("/proc/cpuinfo").exists() else set()
    # AVX-512: 16 lanes in 32 registers; AVX / AVX2: 8 lanes in 16; SSE or NEON: 4 lanes.
    lanes = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    assert spec.warp_size == lanes and spec.registers_per_unit in (16, 32)
    # the register tile's room: the registers not kept free, each one vector of fp32 lanes
    assert spec.layer("registers").capacity_bytes == spec.registers_per_thread_cap * lanes * 4 > 0
    assert spec_from_toml_text(spec_to_toml(spec)) == spec


@pytest.mark.parametrize(
    "text, size",
    [("48K", 48 * 1024), ("1024K\n", 1024 * 1024), ("32M", 32 * 1024**2), ("512", 512), ("1G", 1024**3)],
)
def test_parse_cache_size(text, size):
    assert parse_cache_size(text) == size


def test_parse_cache_size_refuses_junk():
    with pytest.raises(ValueError):
        parse_cache_size("lots")


@pytest.mark.parametrize("text, count", [("0", 1), ("0-3", 4), ("0-3,8,10-11\n", 7), ("0,56", 2), ("", 1)])
def test_count_cpu_list(text, count):
    assert count_cpu_list(text) == count


def test_parse_cpuinfo_keeps_the_first_processor():
    info = parse_cpuinfo(MACHINES["sapphire-rapids"][0])
    assert (info.isa, info.vendor, info.mhz) == ("x86_64", "intel", 2000.0)
    assert info.model_name == "Intel(R) Xeon(R) Platinum 8480+" and "amx_tile" in info.flags
    arm = parse_cpuinfo(MACHINES["neoverse-n1"][0])
    assert (arm.isa, arm.vendor, arm.part, arm.mhz) == ("aarch64", "arm", "0xd0c", None)


@pytest.mark.parametrize(
    "vendor, family, model, facts",
    [
        ("AuthenticAMD", 23, 1, (5, 1)),  # Zen (EPYC 7001): ymm FMAs split over 128-bit pipes
        ("AuthenticAMD", 23, 49, (5, 2)),  # Zen 2 (EPYC 7002, model 31h)
        ("AuthenticAMD", 25, 1, (4, 2)),  # Zen 3 (EPYC 7003, model 01h)
        ("AuthenticAMD", 25, 17, (4, 1)),  # Zen 4 (EPYC 9004, model 11h)
        ("GenuineIntel", 6, 85, (4, 2)),  # Skylake-SP / Cascade Lake
        ("GenuineIntel", 6, 126, (4, 1)),  # Ice Lake client (7Eh): one 512-bit FMA
        ("GenuineIntel", 6, 63, (5, 2)),  # Haswell-EP
        ("GenuineIntel", 6, 1, (5, 2)),  # a model not in the table: the default
        ("GenuineIntel", 6, 167, (4, 2, "amx_tile")),  # AMX under a hypervisor's model number
        ("AuthenticAMD", 99, 1, (5, 2)),  # a family not in the table: the default
    ],
)
def test_fma_facts_from_vendor_family_and_model(vendor, family, model, facts):
    """Facts by family and model; an Intel core with AMX by that flag, whatever model it reports."""
    flags = " ".join(("avx2 fma", *facts[2:]))
    info = parse_cpuinfo(f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: {flags}\n")
    assert (info.family, info.model) == (family, model)
    found = fma_facts(info)
    assert (found.latency_cycles, found.pipes) == facts[:2] and found.source


@pytest.mark.parametrize(
    "vendor, family, model, rows",
    [
        ("AuthenticAMD", 25, 1, 16),  # Zen 3 (EPYC 7003, model 01h): measured
        ("AuthenticAMD", 25, 33, 16),  # Zen 3 client (model 21h)
        ("AuthenticAMD", 25, 17, 0),  # Zen 4 (EPYC 9004): left out (capping its walks did not pay)
        ("AuthenticAMD", 26, 2, 0),  # Zen 5
        ("GenuineIntel", 6, 207, 0),  # Emerald Rapids: the default is its measurement
    ],
)
def test_prefetch_rows_from_vendor_family_and_model(vendor, family, model, rows, tmp_path):
    """`DeviceSpec.prefetch_rows` of the cores measured (`detect._AMD_PREFETCH_ROWS`), with where
    it comes from in the spec's sources and written to its TOML; 0 (not stated) elsewhere."""
    info = parse_cpuinfo(f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: avx2 fma\n")
    found, source = prefetch_facts(info)
    assert found == rows and bool(source) == bool(rows)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                                  f"model name\t: a CPU\nflags\t\t: avx avx2 fma\n")
    spec = detect_local_cpu(sysfs_root=str(tmp_path / "sys"), proc_root=str(proc), cores=2)
    assert spec.prefetch_rows == rows and (dict(spec.sources).get("prefetch_rows") == (source or None))
    assert spec_from_toml_text(spec_to_toml(spec), check_target=False) == spec  # the target: TVM's, not asked here
    assert ("prefetch_rows = " in spec_to_toml(spec)) == bool(rows)


def test_parse_meminfo():
    assert parse_meminfo("MemTotal:   2048 kB\n") == 2048 * 1024
    assert parse_meminfo("nothing here") is None


def test_parse_l1_ways_reads_the_data_cache_only():
    """sysfs's ways_of_associativity of the L1 data cache (the Zen 5's 12, not its L1i's 8);
    0 where sysfs leaves it out."""
    zen5 = [("1", "Data", "12\n"), ("1", "Instruction", "8\n"), ("2", "Unified", "16\n")]
    assert parse_l1_ways(zen5) == 12
    assert parse_l1_ways(zen5[1:]) == 0 and parse_l1_ways([("1", "Data", "")]) == 0


@pytest.mark.tvm  # reads a spec back through the loader, which asks TVM about its target
def test_detection_reads_the_l1_ways(tmp_path):
    sysfs, proc = fake_machine(tmp_path, *MACHINES["sapphire-rapids"])
    plain = detect_local_cpu(sysfs_root=sysfs, proc_root=proc, cores=4)
    assert plain.layer("L1").ways == 0 and "associativity not in sysfs" in plain.layer("L1").source
    for index in (Path(sysfs) / "devices" / "system" / "cpu" / "cpu0" / "cache").glob("index*"):
        level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
        (index / "ways_of_associativity").write_text("12\n" if (level, kind) == ("1", "Data") else "16\n")
    spec = detect_local_cpu(sysfs_root=sysfs, proc_root=proc, cores=4)
    assert [layer.ways for layer in spec.layers] == [0, 12, 0, 0] and "12-way (sysfs)" in spec.layer("L1").source
    assert spec_from_toml_text(spec_to_toml(spec)) == spec


def test_parse_caches_gives_each_core_its_share_and_the_last_level_apart():
    """A 2-vCPU Zen 5 VM: 48 KiB L1d and 1 MiB L2 per core, a 32 MiB L3 the two share; the
    instruction cache is not data. The last level is the highest one beyond L2."""
    vm = [("1", "Data", "48K", "0"), ("1", "Instruction", "32K", "0"), ("2", "Unified", "1024K", "0"),
          ("3", "Unified", "32768K", "0-1")]
    assert parse_caches(vm) == {"L1": 48 * 1024, "L2": 1024 * 1024, "LLC": 16 * 1024**2}
    assert parse_caches(vm[:3]) == {"L1": 48 * 1024, "L2": 1024 * 1024}  # no L3: no LLC
    assert parse_caches(vm + [("4", "Unified", "128M", "0-7")])["LLC"] == 16 * 1024**2  # an L4 over 8 cores
