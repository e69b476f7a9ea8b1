"""The spec of this machine's CPU: the only place in the workbench that reads the OS.

`detect_local_cpu` reads `/proc/cpuinfo`, `/proc/meminfo` and the cache and frequency files under
`/sys`; everything else here is a pure function of file contents, so tests run on fake trees.
Bandwidths and peak compute of an uncalibrated CPU are estimates from the core count, clock and
SIMD width (each source string says which assumption it makes); calibration replaces them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from workbench.hardware.spec import DeviceSpec, MemoryLayer

LOCAL_CPU_NAME = "local-cpu"

# LLVM CPU names for x86, most specific first: (mcpu, vendor or None for any, flags it needs).
# TVM refuses mcpu="native", so the name has to be chosen here.
_X86_MCPU = (
    ("sapphirerapids", "intel", {"avx512f", "amx_tile", "avx512_bf16"}),
    ("icelake-server", "intel", {"avx512f", "avx512_vbmi2", "avx512_vnni", "gfni"}),
    ("cascadelake", "intel", {"avx512f", "avx512_vnni"}),
    ("znver5", "amd", {"avx512f", "avx512_vp2intersect", "avx512_bf16"}),
    ("znver4", "amd", {"avx512f", "avx512_bf16", "avx512_vnni"}),
    ("skylake-avx512", None, {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("haswell", None, {"avx2", "fma", "bmi2"}),
    ("sandybridge", None, {"avx"}),
    ("x86-64-v2", None, {"sse4_2", "popcnt"}),
)
# ARM "CPU part" numbers (MIDR) of cores LLVM has a tuned name for.
_ARM_PARTS = {
    "0xd08": "cortex-a72",
    "0xd0c": "neoverse-n1",
    "0xd40": "neoverse-v1",
    "0xd41": "cortex-a78",
    "0xd42": "cortex-a78ae",
    "0xd49": "neoverse-n2",
    "0xd4f": "neoverse-v2",
}
_ARM_IMPLEMENTERS = {"0x41": "arm", "0x48": "hisilicon", "0x4e": "nvidia", "0x61": "apple", "0xc0": "ampere"}
_X86_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}

# Fallbacks when a file is missing (containers, odd kernels); the sources say when they are used.
_DEFAULT_MHZ = 2000.0
_DEFAULT_CACHES = {"L1": 32 * 1024, "L2": 1024 * 1024}
_DEFAULT_MEMORY = 8 * 1024**3

# Per-core estimates for an uncalibrated CPU (cycles and bytes per cycle of recent x86 / ARM
# server cores): two vector loads per cycle from L1, 32 B/cycle from L2, about 10 GB/s of DRAM
# streaming per core; latencies of 5 (L1) and 14 (L2) cycles and about 90 ns for DRAM.
_L1_LOADS_PER_CYCLE = 2
_L2_BYTES_PER_CYCLE = 32
_DRAM_GBPS_PER_CORE = 10.0
# A core's streaming reads from the shared L3, for a spec not yet calibrated: half of what it reads
# from its L2, on the low side. 2 Zen 5 cores at ~4 GHz, 8 MiB each: calibrated at 224-232 GB/s
# (28-29 B per cycle each), 130-145 GB/s while another process kept the machine busy (16-18 B).
_LLC_BYTES_PER_CYCLE = 16
_CYCLES = {"L1": 5, "L2": 14}
_DRAM_LATENCY_NS = 90.0
_CACHE_LINE = 64


@dataclass(frozen=True)
class FmaFacts:
    """A core's vector FMA: latency (cycles until a dependent FMA may use the result) and pipes
    (FMAs of the full detected vector width issued per cycle), with where the numbers come from."""

    latency_cycles: int
    pipes: int
    source: str


_INTEL_MANUAL = "Intel 64 and IA-32 Architectures Optimization Reference Manual"
_AGNER = "Agner Fog, Instruction tables"
# Intel cores by (cpu family, models) as /proc/cpuinfo gives them.
_INTEL_FMA = (
    (6, (0x3C, 0x3F, 0x45, 0x46, 0x3D, 0x47, 0x4F, 0x56),
     FmaFacts(5, 2, f"Haswell / Broadwell: 5-cycle FMA on ports 0 and 1 ({_INTEL_MANUAL}; {_AGNER})")),
    (6, (0x4E, 0x5E, 0x8E, 0x9E, 0xA5, 0xA6),
     FmaFacts(4, 2, f"Skylake to Comet Lake client: 4-cycle FMA on ports 0 and 1 ({_INTEL_MANUAL}; {_AGNER})")),
    (6, (0x55,),
     FmaFacts(4, 2, f"Skylake-SP / Cascade Lake: 4-cycle FMA, two 512-bit FMA units on Gold 6xxx and "
              f"Platinum (one on Silver and Bronze, which cpuinfo does not tell apart) ({_INTEL_MANUAL})")),
    (6, (0x6A, 0x6C, 0x8F, 0xCF, 0xAD, 0xAE),
     FmaFacts(4, 2, f"Ice Lake-SP / Sapphire, Emerald, Granite Rapids: 4-cycle FMA, two 512-bit FMA units ({_INTEL_MANUAL})")),
    (6, (0x7D, 0x7E, 0x8C, 0x8D),
     FmaFacts(4, 1, f"Ice Lake / Tiger Lake client: 4-cycle FMA, one 512-bit FMA (ports 0+1 fused) ({_INTEL_MANUAL}; {_AGNER})")),
    (6, (0x97, 0x9A, 0xB7, 0xBA, 0xBF),
     FmaFacts(4, 2, f"Alder Lake / Raptor Lake P-cores: 4-cycle FMA on ports 0 and 1 ({_INTEL_MANUAL})")),
)
# AMX (the amx_tile flag) exists only on Intel's server cores from Sapphire Rapids on, whose FMA is
# the row above's; it names them where a hypervisor reports another model (a 2-core Xeon guest
# with AMX and a 480 MiB L3 reported family 6 model 0xA7, Rocket Lake's number).
_INTEL_AMX_FMA = FmaFacts(4, 2, f"an Intel server core with AMX (amx_tile: Sapphire Rapids or later): 4-cycle FMA, "
                                f"two 512-bit FMA units ({_INTEL_MANUAL})")
# Zen 3's (cpu family, model ranges) as /proc/cpuinfo gives them: EPYC 7003 (01h), Ryzen 5000 (21h,
# 50h) and their kin.
_ZEN3 = (0x19, ((0x00, 0x0F), (0x20, 0x5F)))
# AMD cores by (cpu family, model ranges): AMD Software Optimization Guides for family 17h
# (Zen, Zen 2), 19h (Zen 3, Zen 4) and 1Ah (Zen 5).
_AMD_FMA = (
    (0x17, ((0x00, 0x2F),), FmaFacts(5, 1, "Zen / Zen+ (family 17h): 5-cycle FMA; 256-bit FMAs split over the two "
                                          f"128-bit pipes, one ymm FMA per cycle (AMD family 17h optimization guide; {_AGNER})")),
    (0x17, ((0x30, 0xFF),), FmaFacts(5, 2, "Zen 2 (family 17h): 5-cycle FMA, two 256-bit FMA pipes "
                                          f"(AMD family 17h models 30h+ optimization guide; {_AGNER})")),
    (*_ZEN3, FmaFacts(4, 2, f"Zen 3 (family 19h): 4-cycle FMA, two 256-bit FMA pipes (AMD family 19h "
                            f"optimization guide; {_AGNER})")),
    (0x19, ((0x10, 0x1F), (0x60, 0xAF)), FmaFacts(4, 1, "Zen 4 (family 19h): 4-cycle FMA; 512-bit FMAs on two 256-bit "
                                                       "pipes, one zmm FMA per cycle (AMD family 19h optimization guide)")),
    (0x1A, ((0x00, 0xFF),), FmaFacts(4, 2, "Zen 5 (family 1Ah): 4-cycle FMA, two 512-bit FMA pipes "
                                          "(AMD family 1Ah optimization guide)")),
)
# Rows of an input a core's hardware prefetchers follow at once where a walk visits each a few
# lines in turn (`DeviceSpec.prefetch_rows`), by AMD (cpu family, model ranges), measured: cores
# not listed leave it 0, which the model reads as `rtile.axes.PREFETCH_ROWS` (48, measured on the
# Xeon Emerald Rapids; the Zen 5 followed 64 rows of 8 lines). On the 2-core Zen 3 (family 19h
# model 1), 3 x 1417 x 4355 in 3 x 24 register tiles walking 8, 16, 20, 24, 32, 48 and 109 of B's
# rows ran 1.07, 1.27, 2.27, 3.43, 3.71, 3.65 and 4.45 ms (evidence:
# docs/model-evidence.md#prefetch-rows). A Zen 4 follows 16 rows as well (3 x 16 register tiles,
# 16 and 20 rows: 1.35 and 1.88 ms), but is left out: with its walks capped at 16 rows (and
# two-line visits counted as walks), nine of twelve few-row matmuls whose rank 1 moved ran
# slower on one core, up to 1.9x (the same evidence, "A Zen 4's walk").
_AMD_PREFETCH_ROWS = (
    (*_ZEN3, (16, "Zen 3 (family 19h): 16 rows, measured on a 2-core EPYC (docs/model-evidence.md#prefetch-rows)")),
)
# ARM cores by "CPU part": Arm Neoverse software optimization guides (FMLA, ASIMD).
_ARM_FMA = {
    "0xd0c": FmaFacts(4, 2, "Neoverse N1: 4-cycle FMLA, two 128-bit pipes (Arm Neoverse N1 software optimization guide)"),
    "0xd49": FmaFacts(4, 2, "Neoverse N2: 4-cycle FMLA, two 128-bit pipes (Arm Neoverse N2 software optimization guide)"),
    "0xd40": FmaFacts(4, 4, "Neoverse V1: 4-cycle FMLA, four 128-bit pipes (Arm Neoverse V1 software optimization guide)"),
    "0xd4f": FmaFacts(4, 4, "Neoverse V2: 4-cycle FMLA, four 128-bit pipes (Arm Neoverse V2 software optimization guide)"),
}
# Unknown cores: 5 cycles x 2 pipes, the most accumulators any core above needs with two pipes
# (Haswell, Zen 2). More accumulators than a core needs cost registers, never FMA throughput.
DEFAULT_FMA = FmaFacts(5, 2, "core not in the workbench's table: 5-cycle FMA x 2 pipes assumed (Haswell, Zen 2)")

# A CPU kernel's launch: a call through TVM's runtime and the fork and join of its thread pool
# over the cores. On the 2-core development machine (AMD EPYC, TVM 0.27, the pool sized to the
# cores) an empty parallel kernel called from Python took 1.3 us a call (0.9 us inside TVM's
# time_evaluator, which leaves out Python's call); a pool over more cores forks and joins more
# threads, so the detected spec assumes 2 us, an estimate until `device detect --calibrate`
# measures this machine (`calibrate`, probe "launch").
DEFAULT_CPU_LAUNCH_US = 2.0
DEFAULT_CPU_LAUNCH_SOURCE = (f"estimate, not measured here: {DEFAULT_CPU_LAUNCH_US:g} us, a TVM kernel's call and its "
                             "thread pool's fork and join (an empty parallel kernel took 1.3 us on a 2-core EPYC); "
                             "`workbench device detect --calibrate` measures it")


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the first processor."""

    model_name: str
    vendor: str  # "intel", "amd", "arm", ... or "unknown"
    isa: str  # "x86_64", "aarch64" or "unknown"
    flags: frozenset[str]
    mhz: float | None  # the clock cpuinfo reports (x86 only)
    part: str = ""  # ARM "CPU part", e.g. "0xd0c"
    family: int | None = None  # x86 "cpu family"
    model: int | None = None  # x86 "model"


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse /proc/cpuinfo; the first value of each key wins (that is the first processor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    if "flags" in fields:
        isa, flags = "x86_64", fields["flags"]
        vendor = _X86_VENDORS.get(fields.get("vendor_id", ""), "unknown")
    elif "Features" in fields:
        isa, flags = "aarch64", fields["Features"]
        vendor = _ARM_IMPLEMENTERS.get(fields.get("CPU implementer", "").lower(), "unknown")
    else:
        isa, flags, vendor = "unknown", "", "unknown"
    part = fields.get("CPU part", "").lower()
    model = fields.get("model name") or fields.get("Hardware") or f"{vendor} {isa} CPU {part}".strip()
    mhz = float(fields["cpu MHz"]) if _is_number(fields.get("cpu MHz", "")) else None
    family, number = (int(fields[k]) if fields.get(k, "").isdigit() else None for k in ("cpu family", "model"))
    return CpuInfo(model, vendor, isa, frozenset(flags.split()), mhz, part, family, number)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def simd_lanes(info: CpuInfo) -> int:
    """32-bit lanes of one vector register: AVX-512 16, AVX/AVX2 8, SSE and NEON 4."""
    if "avx512f" in info.flags:
        return 16
    if "avx" in info.flags:
        return 8
    return 4


def vector_registers(info: CpuInfo) -> int:
    """Architectural vector registers: 32 zmm with AVX-512 and 32 v-registers on aarch64, else 16."""
    return 32 if "avx512f" in info.flags or info.isa == "aarch64" else 16


def fma_facts(info: CpuInfo) -> FmaFacts:
    """FMA latency and pipes of the core /proc/cpuinfo names (vendor, family and model on x86,
    AMX on Intel, the CPU part on ARM), or `DEFAULT_FMA` for a core not in the table."""
    if info.isa == "aarch64":
        return _ARM_FMA.get(info.part, DEFAULT_FMA)
    if info.vendor == "intel":
        if "amx_tile" in info.flags:
            return _INTEL_AMX_FMA
        for family, models, facts in _INTEL_FMA:
            if info.family == family and info.model in models:
                return facts
    return _amd_facts(info, _AMD_FMA) or DEFAULT_FMA


def _amd_facts(info: CpuInfo, table):
    """The facts of `table` ((cpu family, model ranges, facts), ...) for the AMD core /proc/cpuinfo
    names, or None."""
    if info.vendor == "amd" and info.model is not None:
        for family, ranges, facts in table:
            if info.family == family and any(lo <= info.model <= hi for lo, hi in ranges):
                return facts
    return None


def prefetch_facts(info: CpuInfo) -> tuple[int, str]:
    """(rows its prefetchers follow at once, where that comes from) of the core /proc/cpuinfo
    names (`_AMD_PREFETCH_ROWS`), or (0, "") for a core not measured."""
    return _amd_facts(info, _AMD_PREFETCH_ROWS) or (0, "")


def llvm_mcpu(info: CpuInfo) -> str:
    """The LLVM CPU name for TVM's `mcpu` (TVM refuses "native")."""
    if info.isa == "aarch64":
        return _ARM_PARTS.get(info.part, "generic")
    if info.isa != "x86_64":
        return "generic"
    for mcpu, vendor, needs in _X86_MCPU:
        if vendor in (None, info.vendor) and needs <= info.flags:
            return mcpu
    return "x86-64"


def parse_cache_size(text: str) -> int:
    """A sysfs cache size ("48K", "1024K", "32M", "512") in bytes."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise ValueError(f"not a cache size: {text!r}")
    return int(digits) * scale


def count_cpu_list(text: str) -> int:
    """Number of CPUs in a sysfs CPU list such as "0-3,8,10-11"."""
    count = 0
    for part in text.strip().split(","):
        if "-" in part:
            first, last = part.split("-")
            count += int(last) - int(first) + 1
        elif part:
            count += 1
    return max(count, 1)


def smt_threads(entries: list[tuple[str, str, str, str]]) -> int:
    """Hardware threads per core: the CPUs sharing the L1 data cache (SMT siblings), else 1."""
    for level, kind, _size, shared in entries:
        if level.strip() == "1" and kind.strip() == "Data" and shared.strip():
            return count_cpu_list(shared)
    return 1


def parse_caches(entries: list[tuple[str, str, str, str]]) -> dict[str, int]:
    """Per-core data-cache bytes by level ("L1", "L2", and "LLC" for the last level beyond L2,
    the L3) from sysfs (level, type, size, shared list).

    A cache shared by several cores counts with one core's share, since one core's tile must fit;
    SMT siblings of one core do not split it (the spec's unit is a core, not a hardware thread).
    """
    smt = smt_threads(entries)
    caches: dict[str, int] = {}
    last = 2
    for level, kind, size, shared in entries:
        if not (size.strip() and kind.strip() in ("Data", "Unified") and level.strip().isdigit()):
            continue
        cores_sharing = max(1, count_cpu_list(shared or "0") // smt)
        share, n = parse_cache_size(size) // cores_sharing, int(level.strip())
        if n in (1, 2):
            caches[f"L{n}"] = share
        elif n > last:
            caches["LLC"], last = share, n
    return caches


def parse_l1_ways(entries: list[tuple[str, str, str]]) -> int:
    """The L1 data cache's associativity from sysfs (level, type, ways_of_associativity); 0 where
    sysfs does not say (some hypervisors leave it out, or report 0 for fully associative)."""
    for level, kind, ways in entries:
        if level.strip() == "1" and kind.strip() == "Data" and ways.strip().isdigit():
            return int(ways.strip())
    return 0


def parse_meminfo(text: str) -> int | None:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def build_local_spec(
    info: CpuInfo,
    cores: int,
    caches: dict[str, int],
    memory_bytes: int | None,
    max_mhz: float | None,
    l1_ways: int = 0,
) -> DeviceSpec:
    """The `local-cpu` spec from parsed facts (pure); unmeasured numbers are labelled estimates."""
    if max_mhz:
        mhz, clock = max_mhz, "max clock from sysfs cpufreq"
    elif info.mhz:
        mhz, clock = info.mhz, "clock from /proc/cpuinfo"
    else:
        mhz, clock = _DEFAULT_MHZ, "clock unknown, 2 GHz assumed"
    ghz = mhz / 1000
    lanes = simd_lanes(info)
    registers = vector_registers(info)
    fma = fma_facts(info)
    per_cycle = f"{cores} cores x {ghz:.3g} GHz ({clock})"
    peak = cores * ghz * lanes * 2 * fma.pipes
    mcpu = llvm_mcpu(info)
    prefetch_rows, prefetch_source = prefetch_facts(info)
    return DeviceSpec(
        name=LOCAL_CPU_NAME,
        kind="cpu",
        vendor=info.vendor,
        layers=_estimated_layers(cores, ghz, lanes, registers, fma, caches, memory_bytes, per_cycle, l1_ways),
        compute_units=cores,
        warp_size=lanes,
        teu_per_unit=1,
        max_threads_per_block=1,
        max_threads_per_unit=1,
        registers_per_thread_cap=registers,
        registers_per_unit=registers,
        peak_gflops=(("float32", round(peak, 1)), ("float64", round(peak / 2, 1))),
        target=(("kind", "llvm"), ("mcpu", mcpu), ("num-cores", cores)),
        source=f"detected on this machine: {info.model_name} ({info.isa}); "
        "bandwidths and peak are uncalibrated estimates",
        calibrated=False,
        fma_latency_cycles=fma.latency_cycles,
        fma_pipes=fma.pipes,
        launch_overhead_us=DEFAULT_CPU_LAUNCH_US,
        # every core's share of the last-level cache: what the spec's cores hold between them
        llc_bytes=caches.get("LLC", 0) * cores,
        llc_gbps=round(cores * ghz * _LLC_BYTES_PER_CYCLE, 1) if "LLC" in caches else 0.0,
        prefetch_rows=prefetch_rows,
        sources=tuple(sorted(_device_sources(info, registers, fma, per_cycle, mcpu) + _llc_sources(caches, cores, per_cycle)
                             + ((("prefetch_rows", prefetch_source),) if prefetch_rows else ()))),
    )


def _estimated_layers(cores, ghz, lanes, registers, fma, caches, memory_bytes, per_cycle, l1_ways=0):
    vector = lanes * 4
    l1, l2 = (caches.get(level, _DEFAULT_CACHES[level]) for level in ("L1", "L2"))
    found = {level: "from sysfs" if level in caches else "not in sysfs, assumed" for level in ("L1", "L2")}
    memory_from = "MemTotal of /proc/meminfo" if memory_bytes else "not in /proc/meminfo, 8 GiB assumed"
    estimate = f"uncalibrated estimate: {per_cycle}"
    return (
        MemoryLayer(
            name="registers", scope="thread", capacity_bytes=registers * vector,
            bandwidth_gbps=round(cores * ghz * fma.pipes * 3 * vector, 1),
            transaction_bytes=vector, latency_ns=round(fma.latency_cycles / ghz, 2),
            source=f"{registers} vector registers x {vector} B (a micro-kernel's loads and broadcast "
            f"counted in its footprint); {estimate} x {fma.pipes} FMA pipes x 3 operands x {vector} B; "
            f"{fma.latency_cycles}-cycle FMA latency",
        ),
        MemoryLayer(
            name="L1", scope="unit", capacity_bytes=l1,
            bandwidth_gbps=round(cores * ghz * _L1_LOADS_PER_CYCLE * vector, 1),
            transaction_bytes=_CACHE_LINE, latency_ns=round(_CYCLES["L1"] / ghz, 2), ways=l1_ways,
            source=f"L1d per core {found['L1']}; {estimate} x {_L1_LOADS_PER_CYCLE} loads x "
            f"{vector} B per cycle; ~5 cycles latency; 64 B lines; "
            + (f"{l1_ways}-way (sysfs)" if l1_ways else "associativity not in sysfs"),
        ),
        MemoryLayer(
            name="L2", scope="unit", capacity_bytes=l2,
            bandwidth_gbps=round(cores * ghz * _L2_BYTES_PER_CYCLE, 1),
            transaction_bytes=_CACHE_LINE, latency_ns=round(_CYCLES["L2"] / ghz, 2),
            source=f"L2 per core (a shared L2 split over its cores) {found['L2']}; {estimate} x "
            f"{_L2_BYTES_PER_CYCLE} B per cycle; ~14 cycles latency; 64 B lines",
        ),
        MemoryLayer(
            name="DRAM", scope="device", capacity_bytes=memory_bytes or _DEFAULT_MEMORY,
            bandwidth_gbps=round(cores * _DRAM_GBPS_PER_CORE, 1),
            transaction_bytes=_CACHE_LINE, latency_ns=_DRAM_LATENCY_NS,
            source=f"capacity: {memory_from}; uncalibrated estimate: {cores} cores x "
            f"{_DRAM_GBPS_PER_CORE} GB/s per core; ~90 ns latency; 64 B lines",
        ),
    )


def _llc_sources(caches: dict[str, int], cores: int, per_cycle: str) -> tuple[tuple[str, str], ...]:
    if "LLC" not in caches:
        return ()
    return (
        ("llc_bytes", f"last-level (L3) cache from sysfs: one core's share ({caches['LLC'] // 1024} KiB) x {cores} cores"),
        ("llc_gbps", f"uncalibrated estimate: {per_cycle} x {_LLC_BYTES_PER_CYCLE} B per cycle"),
    )


def _device_sources(info: CpuInfo, registers: int, fma: FmaFacts, per_cycle: str, mcpu: str):
    simd = next((f for f in ("avx512f", "avx", "asimd") if f in info.flags), "no wide SIMD flag")
    one_per_core = "1 on CPUs: a core runs one work item at a time"
    return (
        ("compute_units", "physical cores among the CPUs this process may run on (sched_getaffinity; "
         "SMT siblings sharing an L1d counted once)"),
        ("fma_latency_cycles", fma.source),
        ("fma_pipes", fma.source),
        ("launch_overhead_us", DEFAULT_CPU_LAUNCH_SOURCE),
        ("max_threads_per_block", one_per_core),
        ("max_threads_per_unit", one_per_core),
        ("peak_gflops", f"uncalibrated estimate: {per_cycle} x fp32 lanes x 2 (FMA) x "
         f"{fma.pipes} FMA pipes; float64 has half the lanes"),
        ("registers_per_thread_cap", f"all {registers} vector registers: a register micro-kernel's "
         "input loads and broadcast are counted in its footprint"),
        ("registers_per_unit", f"architectural vector registers of {info.isa} ({simd})"),
        ("target", f"mcpu {mcpu!r} chosen from the /proc/cpuinfo vendor and flags (TVM refuses "
         "'native'); num-cores = compute_units"),
        ("teu_per_unit", one_per_core),
        ("warp_size", f"fp32 lanes of one vector register ({simd} in /proc/cpuinfo)"),
    )


def detect_local_cpu(sysfs_root: str = "/sys", proc_root: str = "/proc", cores: int | None = None) -> DeviceSpec:
    """The spec of this machine's CPU, named `local-cpu` (uncalibrated: `calibrated=False`).

    `cores` defaults to the physical cores this process may run on (its CPU affinity, SMT
    siblings counted once). The roots exist so tests can point detection at fake trees.
    """
    proc, cpu0 = Path(proc_root), Path(sysfs_root) / "devices" / "system" / "cpu" / "cpu0"
    info = local_cpu_info(proc_root)
    names = ("level", "type", "size", "shared_cpu_list", "ways_of_associativity")
    files = [[_read(index / name) for name in names] for index in sorted((cpu0 / "cache").glob("index*"))]
    entries = [tuple(f[:4]) for f in files]
    ways = [(f[0], f[1], f[4]) for f in files]
    khz = _read(cpu0 / "cpufreq" / "cpuinfo_max_freq").strip()
    return build_local_spec(
        info,
        cores or max(1, _usable_cpus() // smt_threads(entries)),
        parse_caches(entries),
        parse_meminfo(_read(proc / "meminfo")),
        int(khz) / 1000 if khz.isdigit() else None,
        parse_l1_ways(ways),
    )


def local_cpu_info(proc_root: str = "/proc") -> CpuInfo:
    """What /proc/cpuinfo says about this machine's CPU (isa "unknown" where there is none)."""
    return parse_cpuinfo(_read(Path(proc_root) / "cpuinfo"))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
