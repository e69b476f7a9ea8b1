"""What hardware can be: the range of every number of a `DeviceSpec`, and names as identifiers.

A spec file is user input: `bandwidth_gbps = 1e30` or `name = "../.."` parse as TOML and as
types, and would then feed the model predictions of 1e-30 s or a name that reads as a path.
`check_bounds` refuses, in one line naming the spec file's field, a number no device of the
kind the workbench constructs for (CPUs, GPUs) has or will soon have, and a name that is not an
identifier. Each bound sits well beyond (5x or more) the largest device of 2024-2025 it is
measured against (the comments say which), so that it catches unit slips and nonsense, never a
real device. The parser checks types and signs first (`hardware.parse`).
"""

from __future__ import annotations

import re

from workbench.errors import UserError
from workbench.hardware.spec import DeviceSpec

# A micro-kernel is the FMA probe's work plus loads and broadcasts on the same cores, so it can at
# most match the measured FMA peak; more than 10 % above it is noise no best-of-N run shows
# (repeated FMA probes agree within a few per cent). The spec loader and calibration refuse it.
MICRO_KERNEL_SLACK = 1.1

# Device and layer names: letters and digits, single '.', '_' or '-' between them ("local-cpu",
# "xeon-avx512", "L1"), at most 64 characters: never a path ("../..", "a/b"), never blank.
NAME = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
NAME_MAX = 64

# Bandwidths in GB/s, the spec's unit. The bottom layer (DRAM, HBM): at most 100 TB/s. The fastest
# memory attached to one device is HBM3e at 8 TB/s (NVIDIA B200, AMD MI355X datasheets), 12x below.
DEVICE_GBPS = 1e5
# On-chip layers (registers, shared memory, caches) and a CPU's LLC, aggregated over the device:
# at most 10 PB/s. The largest preset's is the RTX 4090's register operand bandwidth, 495 TB/s
# (128 SMs x 128 lanes x 3 operands x 4 B x 2.52 GHz), 20x below.
ON_CHIP_GBPS = 1e7
# Rows a core's prefetchers follow at once: at most 1024, well above the streams any core's
# prefetchers track (16-64 measured on x86 cores, `rtile.axes.PREFETCH_ROWS`).
MAX_PREFETCH_ROWS = 1024
# Slowest bandwidth of any layer: 0.1 GB/s, below single-channel PC100 SDRAM (0.8 GB/s, 1998).
MIN_GBPS = 0.1
# Latencies: at least 0.1 ns, one cycle at 10 GHz (no processor clocks above about 6 GHz), at
# most 100 us (DRAM and HBM take 80-600 ns, memory across CXL or NVLink-C2C about 1 us).
MIN_LATENCY_NS, MAX_LATENCY_NS = 0.1, 1e5
# Capacity of one tile at a layer, by scope. A thread's registers: at most 64 KiB (NVIDIA: 255 x
# 4 B = 1 KiB; AMD CDNA: 512 VGPRs + 512 AGPRs x 4 B = 4 KiB; Intel AMX's 8 tiles: 8 KiB). A unit's
# (a block's shared memory, a core's cache): at most 1 GiB (the largest, IBM Telum II's 36 MB L2
# per core; an H100 SM's 228 KB). The device's memory: at most 2^48 B (256 TiB), the virtual
# address space of a process under 4-level paging on x86-64 and AArch64.
CAPACITY_BYTES = {"thread": 64 * 2**10, "unit": 2**30, "device": 2**48}
MAX_TRANSACTION_BYTES = 4096  # a page; sectors and lines are 32-128 B, a vector register up to 256 B (SVE)
# Peak compute of one device: at most 100 PFLOP/s, 5x a B200's sparse FP4 tensor-core peak of 20
# PFLOP/s (the GB200 NVL72's 1440 PFLOP/s over its 72 GPUs); at least 0.1 GFLOP/s, one scalar FMA
# a cycle at 50 MHz: any core that runs TVM's kernels does more.
MIN_GFLOPS, MAX_GFLOPS = 0.1, 1e8
# A GPU L2 of at most 4 GiB (16x MI300X's 256 MB Infinity Cache); a CPU LLC of at most 64 GiB
# (28x a two-socket EPYC 9684X's 2 x 1152 MB of 3D V-Cache).
MAX_L2_BYTES, MAX_LLC_BYTES = 2**32, 2**36
# A kernel launch: 0 (not counted) or at least 10 ns; a call through TVM's packed-function
# interface alone takes tens of ns. (At most 10 ms: `hardware.parse`'s MAX_LAUNCH_US.)
MIN_LAUNCH_US = 0.01
MAX_FRAGMENT = 256  # an MMA fragment's m, n, k: Hopper's wgmma reaches n = 256, AMD's MFMA 32x32x16

# Device integers: (low, high). The high bound and where it comes from:
DEVICE_INTS = {
    # Linux's largest NR_CPUS (CONFIG_NR_CPUS up to 8192 on x86-64): a CPU's cores; far above any
    # GPU's SMs or CUs (MI300X: 304)
    "compute_units": (1, 8192),
    # a warp (NVIDIA 32, AMD 64) or a CPU vector register's 32-bit lanes (AVX-512 16, SVE's
    # largest 2048-bit vector 64)
    "warp_size": (1, 128),
    "teu_per_unit": (1, 64),  # warp schedulers per SM or SIMDs per CU: 4 on NVIDIA and AMD
    # CUDA and HIP launch at most 1024 threads per block on every architecture
    "max_threads_per_block": (1, 1024),
    # resident threads: 2048 per SM (NVIDIA compute capability 7.0-9.0), 2560 per CU (MI50)
    "max_threads_per_unit": (1, 4096),
    # registers per thread: NVIDIA 255, AMD CDNA 512 (+512 AGPRs); a CPU's 32 vector registers
    "registers_per_thread_cap": (1, 1024),
    # 32-bit registers per SM (NVIDIA 65536) or CU (CDNA3: 512 KB = 131072); a core's 32
    "registers_per_unit": (1, 2**20),
    # FMA latency (3-6 cycles on every x86 and Arm core) and vector FMA pipes (at most 4, Apple's
    # P-cores); 0 on a GPU
    "fma_latency_cycles": (0, 32),
    "fma_pipes": (0, 8),
    # resident blocks per SM (16-32 on NVIDIA; 0: not stated): a block has a thread at least,
    # so as many as resident threads (the loader also checks it against max_threads_per_unit)
    "max_blocks_per_unit": (0, 4096),
    "shared_bytes_per_unit": (0, CAPACITY_BYTES["unit"]),
    "l2_bytes": (0, MAX_L2_BYTES),
    "llc_bytes": (0, MAX_LLC_BYTES),
}
# Layer integers (besides capacity_bytes, by scope): (low, high).
LAYER_INTS = {
    "transaction_bytes": (1, MAX_TRANSACTION_BYTES),
    "banks": (0, 256),  # shared memory: 32 banks on NVIDIA and AMD
    "bank_width_bytes": (0, 64),  # 4 B (8 B on Kepler)
    "ways": (0, 256),  # cache associativity: 8-24 ways on CPUs
}


def check_bounds(spec: DeviceSpec) -> None:
    """Refuse, as a UserError naming the spec file's field, a name that is not an identifier or a
    number outside the range hardware has (the module's constants say where each comes from)."""
    _name(spec.name, "device.name")
    for key, (low, high) in DEVICE_INTS.items():
        _within(getattr(spec, key), low, high, f"device.{key}")
    if spec.launch_overhead_us:
        _within(spec.launch_overhead_us, MIN_LAUNCH_US, float("inf"), "device.launch_overhead_us", " us")
    if spec.llc_gbps:
        _within(spec.llc_gbps, MIN_GBPS, ON_CHIP_GBPS, "device.llc_gbps", " GB/s")
    if spec.core_dram_gbps:
        _within(spec.core_dram_gbps, MIN_GBPS, DEVICE_GBPS, "device.core_dram_gbps", " GB/s")
    if spec.prefetch_rows:
        _within(spec.prefetch_rows, 1, MAX_PREFETCH_ROWS, "device.prefetch_rows")
    for i, layer in enumerate(spec.layers):
        where = f"layer[{i}]"
        _name(layer.name, f"{where}.name")
        _within(layer.capacity_bytes, 1, CAPACITY_BYTES[layer.scope], f"{where}.capacity_bytes",
                f" bytes at scope {layer.scope!r}")
        top = DEVICE_GBPS if layer.scope == "device" else ON_CHIP_GBPS
        _within(layer.bandwidth_gbps, MIN_GBPS, top, f"{where}.bandwidth_gbps", " GB/s")
        _within(layer.latency_ns, MIN_LATENCY_NS, MAX_LATENCY_NS, f"{where}.latency_ns", " ns")
        for key, (low, high) in LAYER_INTS.items():
            _within(getattr(layer, key), low, high, f"{where}.{key}")
    for table, key in ((spec.peak_gflops, "peak_gflops"), (spec.tensor_core_gflops, "tensor_core_gflops")):
        for dtype, gflops in table:
            _within(gflops, MIN_GFLOPS, MAX_GFLOPS, f"{key}.{dtype}", " GFLOP/s")
    for i, size in enumerate(spec.tensor_core_fragment):
        _within(size, 1, MAX_FRAGMENT, f"tensor_core.fragment[{i}]")
    for kernel in spec.micro_kernels:
        # its accumulators live in the core's vector registers: rows x the vectors of a row
        vectors = kernel.vectors(spec.warp_size)
        if vectors > spec.registers_per_unit:
            raise UserError(f"micro_kernels.{kernel.dtype}.{kernel.shape}: {vectors} vector accumulators do not fit "
                            f"in device.registers_per_unit ({spec.registers_per_unit})")


def _name(value: str, field: str) -> None:
    if len(value) > NAME_MAX or not NAME.fullmatch(value):
        raise UserError(f"{field} must be an identifier of letters, digits and single '.', '_' or '-' between them "
                        f"(at most {NAME_MAX} characters), got {value[:NAME_MAX]!r}")


def _within(value: float, low: float, high: float, field: str, unit: str = "") -> None:
    if not low <= value <= high:
        side = f"at least {_number(low)}" if value < low else f"at most {_number(high)}"
        raise UserError(f"{field} must be {side}{unit}, got {_number(value)}: no hardware has that")


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
