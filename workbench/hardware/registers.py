"""The vector registers a CPU micro-kernel may use: a fact of the spec alone, read by the CPU
alignment (`rtile.alignment`) and by calibration (`hardware.calibrate`), which measures
micro-kernels within it."""

from __future__ import annotations

from workbench.hardware.spec import DeviceSpec


def register_budget(device: DeviceSpec) -> int:
    """Vector registers a CPU micro-kernel may use: `registers_per_thread_cap`, and no more
    than the register layer holds (`rprogram.layer_capacity` in registers)."""
    return min(device.registers_per_thread_cap, device.layers[0].capacity_bytes // device.register_bytes)
