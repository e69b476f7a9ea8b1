"""A `DeviceSpec` written out: as the TOML text `hardware.parse` reads back to an equal spec
(`spec_to_toml`), and as a JSON-friendly summary (`spec_summary`)."""

from __future__ import annotations

import re

from workbench.hardware.parse import (
    CORE_DRAM_KEY, DEVICE_FMA, DEVICE_INTS, DEVICE_LLC, DEVICE_OCCUPANCY, LAUNCH_KEY, LAYER_KEYS, PREFETCH_KEY,
)
from workbench.hardware.spec import DeviceSpec

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def spec_to_toml(spec: DeviceSpec) -> str:
    """The spec as TOML text that `spec_from_toml_text` reads back to an equal spec."""
    device = [("name", spec.name), ("kind", spec.kind), ("vendor", spec.vendor), ("source", spec.source)]
    device += [(key, getattr(spec, key)) for key in DEVICE_INTS + DEVICE_FMA + DEVICE_OCCUPANCY + (LAUNCH_KEY,)]
    if spec.llc_bytes:
        device += [(key, getattr(spec, key)) for key in DEVICE_LLC]
    if spec.core_dram_gbps:
        device += [(CORE_DRAM_KEY, spec.core_dram_gbps)]
    if spec.prefetch_rows:
        device += [(PREFETCH_KEY, spec.prefetch_rows)]
    device += [("calibrated", spec.calibrated)]
    parts = [_section("[device]", device)]
    if spec.sources:
        parts.append(_section("[sources]", spec.sources))
    parts.append(_section("[peak_gflops]", spec.peak_gflops))
    if spec.tensor_core_gflops:
        parts.append(_section("[tensor_core_gflops]", spec.tensor_core_gflops))
        parts.append(_section("[tensor_core]", [("fragment", spec.tensor_core_fragment)]))
    for dtype, kernels in _micro_kernel_tables(spec).items():
        parts.append(_section(f"[micro_kernels.{dtype}]", kernels.items()))
    scalars = [(k, v) for k, v in spec.target if not isinstance(v, tuple)]
    parts.append(_section("[target]", scalars))
    parts += [_section(f"[target.{_key(k)}]", v) for k, v in spec.target if isinstance(v, tuple)]
    for layer in spec.layers:
        parts.append(_section("[[layer]]", [(key, getattr(layer, key)) for key in LAYER_KEYS]))
    return "\n".join(parts)


def _micro_kernel_tables(spec: DeviceSpec) -> dict[str, dict[str, float]]:
    """dtype -> {"6x16": GFLOP/s}, the spec file's [micro_kernels.<dtype>] tables."""
    tables: dict[str, dict[str, float]] = {}
    for kernel in spec.micro_kernels:
        tables.setdefault(kernel.dtype, {})[kernel.shape] = kernel.gflops
    return tables


def _section(header: str, items) -> str:
    lines = [header] + [f"{_key(key)} = {_value(value)}" for key, value in items]
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        # repr() of a finite float is a valid TOML float and reads back to the same float.
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    return "[" + ", ".join(_value(item) for item in value) + "]"


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ---- summary ---------------------------------------------------------------------------------


def spec_summary(spec: DeviceSpec) -> dict:
    """A JSON-friendly overview of a spec, for `workbench devices --json` and the UI."""
    return {
        "name": spec.name,
        "kind": spec.kind,
        "vendor": spec.vendor,
        "compute_units": spec.compute_units,
        "warp_size": spec.warp_size,
        "fma_latency_cycles": spec.fma_latency_cycles,
        "fma_pipes": spec.fma_pipes,
        "launch_overhead_us": spec.launch_overhead_us,
        "llc_bytes": spec.llc_bytes,
        "llc_gbps": spec.llc_gbps,
        "core_dram_gbps": spec.core_dram_gbps,
        "prefetch_rows": spec.prefetch_rows,
        "calibrated": spec.calibrated,
        "layers": [
            {
                "name": layer.name,
                "scope": layer.scope,
                "capacity_bytes": layer.capacity_bytes,
                "bandwidth_gbps": layer.bandwidth_gbps,
                "transaction_bytes": layer.transaction_bytes,
                "latency_ns": layer.latency_ns,
            }
            for layer in spec.layers
        ],
        "peak_gflops": dict(spec.peak_gflops),
        "tensor_core_gflops": dict(spec.tensor_core_gflops),
        "micro_kernels": _micro_kernel_tables(spec),
        "target": spec.target_dict(),
        "source": spec.source,
    }
