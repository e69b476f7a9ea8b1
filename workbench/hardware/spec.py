"""Hardware as data: a device is a frozen `DeviceSpec` loaded from a TOML file.

Units are in the field names. Layers are ordered from the *top* (fastest, smallest: registers,
Roller's `MemLayer(0)`) to the *bottom* (global memory / DRAM), as in Roller's Figure 8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LAYER_SCOPES = ("thread", "unit", "device")
DEVICE_KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class MemoryLayer:
    """One level of the memory hierarchy.

    `capacity_bytes` is what one tile at this layer may occupy: per thread for `scope="thread"`
    (for NVIDIA registers: Roller's conservative cap of 96 registers x 4 B), per block / per core
    for `scope="unit"`, the whole memory for `scope="device"`. `bandwidth_gbps` is the aggregate
    bandwidth of reading from this layer over the whole device (GB/s, 1e9 B/s).
    """

    name: str
    scope: str
    capacity_bytes: int
    bandwidth_gbps: float
    transaction_bytes: int
    latency_ns: float
    banks: int = 0
    bank_width_bytes: int = 0
    source: str = ""


@dataclass(frozen=True)
class DeviceSpec:
    """A device the workbench constructs for. Every number has a `source` in its TOML file."""

    name: str
    kind: str  # "gpu" | "cpu"
    vendor: str
    layers: tuple[MemoryLayer, ...]
    compute_units: int  # SMs / CUs on GPUs, cores on CPUs
    warp_size: int  # threads per warp (GPU); 32-bit SIMD lanes of one vector register (CPU)
    teu_per_unit: int  # warp schedulers per SM (GPU); 1 on CPUs
    max_threads_per_block: int  # the construction policy's cap (Roller: 512); 1 on CPUs
    max_threads_per_unit: int  # resident threads per SM; 1 on CPUs
    registers_per_thread_cap: int  # Roller's conservative cap (96 on NVIDIA, 70 on MI50)
    registers_per_unit: int  # 32-bit registers per SM (GPU); vector registers per core (CPU)
    peak_gflops: tuple[tuple[str, float], ...]  # (dtype, GFLOP/s) on the plain ALUs
    tensor_core_gflops: tuple[tuple[str, float], ...] = ()  # (dtype, GFLOP/s) on MMA units
    tensor_core_fragment: tuple[int, int, int] = ()  # (m, n, k), e.g. (16, 16, 16)
    target: tuple[tuple[str, object], ...] = ()  # the TVM target dict, as sorted items
    source: str = ""
    calibrated: bool = False  # True when the numbers were measured on this machine
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def layer(self, name: str) -> MemoryLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @property
    def runs_on_cpu(self) -> bool:
        """Kernels run on CPU cores (an LLVM target, TVM's thread pool), not on an accelerator."""
        return self.kind == "cpu"

    @property
    def launches_thread_blocks(self) -> bool:
        """Kernels launch as a grid of thread blocks (a GPU target: CUDA, ROCm)."""
        return self.kind == "gpu"

    @property
    def unit_layer_index(self) -> int:
        """Index of the last per-unit layer: its tile is one SM's / core's work item (the grid tile)."""
        return max(i for i, layer in enumerate(self.layers) if layer.scope == "unit")

    def peak(self, dtype: str, tensor_core: bool = False) -> float:
        """Peak compute in GFLOP/s for `dtype`; falls back to float32 on the plain ALUs."""
        table = dict(self.tensor_core_gflops if tensor_core else self.peak_gflops)
        if dtype in table:
            return table[dtype]
        return dict(self.peak_gflops)["float32"]

    def target_dict(self) -> dict:
        """The TVM target as the dict form TVM 0.27 accepts (flag strings are refused)."""
        out = {}
        for key, value in self.target:
            out[key] = dict(value) if isinstance(value, tuple) else value
        return out
