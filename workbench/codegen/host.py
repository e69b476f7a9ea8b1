"""Can this machine run a kernel built for a given TVM target? Asked before a kernel is run here.

A CPU kernel compiled for instructions this CPU lacks dies with SIGILL, so a kernel is run only
when its target fits: same architecture, and every instruction-set extension LLVM enables for the
target's `mtriple`/`mcpu`/`mattr` is among the host's /proc/cpuinfo flags (the kernel's truth:
a hypervisor may hide extensions that the CPU model name implies). LLVM also lists tuning
features ("slow-3ops-lea", "prefer-256-bit") that are no instructions; only the extensions named
in `ISA_FLAGS` are compared. An extension missing from that table is not checked, which is why
kernels still run in a worker process: an illegal instruction there is a recorded failure. The
target `local-cpu` detection picks for this machine runs here by definition (profiling runs it).
"""

from __future__ import annotations

from workbench.codegen import targets
from workbench.hardware.detect import CpuInfo, llvm_mcpu, local_cpu_info

# LLVM feature name -> /proc/cpuinfo flag, per host ISA (Linux x86 `flags`, aarch64 `Features`).
ISA_FLAGS = {
    "x86_64": {
        "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a",
        "popcnt": "popcnt", "avx": "avx", "avx2": "avx2", "fma": "fma", "fma4": "fma4", "xop": "xop",
        "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2", "lzcnt": "abm", "movbe": "movbe", "adx": "adx",
        "aes": "aes", "pclmul": "pclmulqdq", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "gfni": "gfni",
        "sha": "sha_ni", "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
        "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
        "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
        "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
        "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
        "avx512vp2intersect": "avx512_vp2intersect", "avxvnni": "avx_vnni",
        "amx-tile": "amx_tile", "amx-bf16": "amx_bf16", "amx-int8": "amx_int8",
    },
    "aarch64": {
        "neon": "asimd", "fullfp16": "asimdhp", "dotprod": "asimddp", "i8mm": "i8mm", "bf16": "bf16",
        "sve": "sve", "sve2": "sve2", "sme": "sme",
    },
}
# First component of an LLVM triple -> the ISA name /proc/cpuinfo parsing uses.
_TRIPLE_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def target_arch(target: dict) -> str | None:
    """The ISA of a CPU target's `mtriple` (None without one: LLVM then targets the host)."""
    triple = target.get("mtriple")
    if not triple:
        return None
    arch = str(triple).split("-", 1)[0].lower()
    return _TRIPLE_ARCH.get(arch, arch)


def cpu_mismatch(target: dict, features: set[str] | None, host: CpuInfo) -> str:
    """Why a kernel for the CPU `target` (whose LLVM features are `features`) cannot run on
    `host`; "" when it can, or when the host is unknown (then running it in a worker tells)."""
    if host.isa not in ISA_FLAGS:
        return ""
    arch = target_arch(target)
    if arch is not None and arch != host.isa:
        return f"built for {arch} (mtriple {target['mtriple']}), this machine is {host.isa}"
    table = ISA_FLAGS[host.isa]
    missing = sorted(f for f in features or () if f in table and table[f] not in host.flags)
    if missing:
        return f"the target needs {', '.join(missing)}, which this CPU ({host.model_name}) lacks"
    return ""


def cannot_run_here(target: dict) -> str:
    """Why a kernel for `target` (a TVM target dict) cannot run on this machine, "" when it can.
    Queries LLVM and the GPU runtime, so call it in a worker process (a malformed target may
    crash LLVM)."""
    import tvm
    from tvm.target import codegen

    kind = target["kind"]
    if targets.target(kind).on_host:
        host = local_cpu_info()
        if _is_local(target, host):  # what `local-cpu` detection picked: profile runs it too
            return ""
        features = codegen.llvm_get_cpu_features(tvm.target.Target(target))
        return cpu_mismatch(target, set(features), host)
    dev = targets.runtime_device(kind)
    if not dev.exist:
        return f"no {kind} device on this machine"
    arch = str(target.get("arch", ""))
    here = "sm_" + str(dev.compute_version).replace(".", "") if kind == "cuda" else ""
    if arch and here and arch != here:
        return f"built for {arch}, this GPU ({dev.device_name}) is {here}"
    return ""


def _is_local(target: dict, host: CpuInfo) -> bool:
    return not ({"mattr", "mtriple"} & set(target)) and target.get("mcpu") == llvm_mcpu(host)


def host_target(target: dict) -> dict:
    """`target` retargeted to this CPU: the same kind and cores, this machine's `mcpu` and no
    `mtriple`/`mattr` (so LLVM targets the host)."""
    kept = {k: v for k, v in target.items() if k not in ("mcpu", "mattr", "mtriple")}
    return kept | {"mcpu": llvm_mcpu(local_cpu_info())}
