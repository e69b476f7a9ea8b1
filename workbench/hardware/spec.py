"""Hardware as data: a device is a frozen `DeviceSpec` loaded from a TOML file.

Units are in the field names. Layers are ordered from the *top* (fastest, smallest: registers,
Roller's `MemLayer(0)`) to the *bottom* (global memory / DRAM), as in Roller's Figure 8.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Mapping

from workbench.frozen import hash_once

LAYER_SCOPES = ("thread", "unit", "device")
DEVICE_KINDS = ("gpu", "cpu")


# An operator stays in a CPU's last-level cache from one run to the next when its data takes at
# most this share of it: the rest is other processes' lines, the template's panels and buffers,
# and replacement that is not a perfect LRU. First the half that `codegen.block_order` leaves of
# a GPU's L2; mm-skinny's 18.1 MB (54 % of 32 MiB) ranks as its runs do on all three committed
# CPUs with the cache's bandwidth, and 1 x 1024 x 4096 (50.0 %) ran at it (docs/model-evidence.md#layer-gbps).
LLC_FILL = 0.6


@dataclass(frozen=True)
class MemoryLayer:
    """One level of the memory hierarchy.

    `capacity_bytes` is what one tile at this layer may occupy: per thread for `scope="thread"`
    (for NVIDIA registers: Roller's conservative cap of 96 registers x 4 B), per block / per core
    for `scope="unit"`, the whole memory for `scope="device"`. `bandwidth_gbps` is the aggregate
    bandwidth of reading from this layer over the whole device (GB/s, 1e9 B/s). `ways` is a CPU
    cache's associativity (0: not stated), which `alignment.l1_set_lines` needs to tell where a
    micro-kernel's streams collide in one set.
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
    ways: int = 0


@dataclass(frozen=True)
class MicroKernel:
    """A CPU register micro-kernel measured on the device (Vortex's level 0, measured once per
    device by `workbench device detect --calibrate`): `rows` x `cols` accumulators of `dtype`,
    vectorised along the `cols`, updated by C[rows, cols] += A[rows, k] * B[k, cols] over
    L1-resident panels on every core at once; `gflops` for the whole device."""

    dtype: str
    rows: int
    cols: int  # elements along the vectorised axis (a whole number of vector registers)
    gflops: float

    @property
    def shape(self) -> str:
        """`rows`x`cols`, as the spec file's key writes it ("6x16")."""
        return f"{self.rows}x{self.cols}"

    def vectors(self, warp_size: int) -> int:
        """Vector registers its accumulators take on a core of `warp_size` fp32 lanes: rows x the
        vectors of a row, a vector holding `warp_size` x 32 bits of `dtype`."""
        lanes = max(1, warp_size * 32 // int("".join(c for c in self.dtype if c.isdigit())))
        return self.rows * -(-self.cols // lanes)


@hash_once
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
    # Roller's conservative cap (96 of 255 on NVIDIA, 70 on MI50); on CPUs the vector registers a
    # register micro-kernel may use, its input loads and broadcast included (all of them: 16 ymm
    # on AVX2, 32 zmm on AVX-512, unless a spec keeps some back)
    registers_per_thread_cap: int
    registers_per_unit: int  # 32-bit registers per SM (GPU); architectural vector registers per core (CPU)
    peak_gflops: tuple[tuple[str, float], ...]  # (dtype, GFLOP/s) on the plain ALUs
    tensor_core_gflops: tuple[tuple[str, float], ...] = ()  # (dtype, GFLOP/s) on MMA units
    tensor_core_fragment: tuple[int, int, int] = ()  # (m, n, k), e.g. (16, 16, 16)
    target: tuple[tuple[str, object], ...] = ()  # the TVM target dict, as sorted items
    source: str = ""
    calibrated: bool = False  # True when the numbers were measured on this machine
    # CPU cores: cycles from an FMA's issue to its result being usable by the next dependent FMA,
    # and vector FMAs of `register_bytes` width a core issues per cycle (Intel optimization
    # manual, AMD software optimization guides, Agner Fog's instruction tables). 0 where unknown
    # or not a CPU: GPUs hide latency with warps, not with a thread's independent accumulators.
    fma_latency_cycles: int = 0
    fma_pipes: int = 0
    # CPU register micro-kernels measured on this machine (`MicroKernel`), sorted by (dtype,
    # rows, cols); empty until calibrated. The rTile model's compute term uses the one a
    # program's register tile runs where there is one (`rtile.model.cpu_compute.compute_efficiency`).
    micro_kernels: tuple[MicroKernel, ...] = ()
    # What starting one kernel costs beyond its own run, in microseconds: a GPU kernel launch
    # (the host's launch call and the grid's start), a CPU kernel's call through TVM's runtime and
    # the fork and join of its thread pool. A model run one kernel at a time pays it per kernel;
    # Rammer's co-schedule, one rProgram, pays it once (`models.rammer`). 0 in a hand-built spec.
    launch_overhead_us: float = 0.0
    # GPU units only, 0 where the spec does not say (a CPU; a spec written before the fields):
    # the thread blocks one unit holds at once at most (32 on NVIDIA compute capability 7.0, 8.0,
    # 9.0), and the block-shared memory of one unit that its resident blocks share (96 KB on the
    # V100, against the 48 KB one block may allocate statically: the shared layer's capacity)
    max_blocks_per_unit: int = 0
    shared_bytes_per_unit: int = 0
    # the GPU's L2 cache, shared by all units (bytes; 0 where the spec does not say): what the CUDA
    # template's grouped block order sizes its groups by (`codegen.block_order`)
    l2_bytes: int = 0
    # A CPU's last-level cache (the L3), shared by its cores and not a layer Roller stages tiles
    # into: its bytes (every such cache among the spec's cores) and its streaming-read bandwidth
    # in GB/s; 0 where the spec does not say, and on a GPU (its L2 is `l2_bytes`). An operator
    # whose data fits in it is read from it, not from the bottom layer, once it has run before
    # (`rtile.model.common.layer_gbps`): each timing repeat, a model's next kernel.
    llc_bytes: int = 0
    llc_gbps: float = 0.0
    # One CPU core's streaming read from the bottom layer (DRAM), GB/s; 0 where the spec does not
    # say. A core's own misses in flight bound it, not the memory controllers: on the 2-core
    # Zen 3, one core streams about two thirds of what both do. `hardware.edit` bounds the bottom
    # layer's bandwidth by it when a what-if takes cores away; measured by `device detect
    # --calibrate`.
    core_dram_gbps: float = 0.0
    # Rows of an input one CPU core's hardware prefetchers follow at once where a walk visits
    # them a few lines each in turn (`rtile.axes.prefetch_rows`); 0 where the spec does not say,
    # which the model reads as `rtile.axes.PREFETCH_ROWS` (measured on a Xeon Emerald Rapids).
    # Detected per core (`hardware.detect`).
    prefetch_rows: int = 0
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def launch_seconds(self) -> float:
        """`launch_overhead_us` in seconds, the unit of every predicted time."""
        return self.launch_overhead_us * 1e-6

    def layer(self, name: str) -> MemoryLayer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def ceilings(self) -> tuple[tuple[str, float], ...]:
        """(name, GB/s) of each roof a roofline draws: every memory layer's bandwidth, and a CPU's
        last-level cache (`llc_gbps`) above the bottom layer where the spec names one, which
        serves the bottom layer's reads of an operator it holds."""
        roofs = tuple((layer.name, layer.bandwidth_gbps) for layer in self.layers)
        if not (self.llc_bytes and self.llc_gbps):
            return roofs
        return roofs[:-1] + (("LLC", self.llc_gbps),) + roofs[-1:]

    @cached_property  # a fact of the kind, asked on every rule check and capacity check
    def runs_on_cpu(self) -> bool:
        """Kernels run on CPU cores (an LLVM target, TVM's thread pool), not on an accelerator."""
        return self.kind == "cpu"

    @cached_property
    def launches_thread_blocks(self) -> bool:
        """Kernels launch as a grid of thread blocks (a GPU target: CUDA, ROCm)."""
        return self.kind == "gpu"

    @cached_property  # asked for on every rule check of a GPU block tile
    def unit_layer_index(self) -> int:
        """Index of the last per-unit layer: its tile is one SM's / core's work item (the grid tile)."""
        return max(i for i, layer in enumerate(self.layers) if layer.scope == "unit")

    # -- the questions construction and the rTile model ask about the device ----------------------
    # Each is a fact of the hardware (or of how the workbench's code generators drive it); the
    # answers follow from `kind` today, but callers ask the question, not the kind.

    @cached_property
    def lanes_are_threads(self) -> bool:
        """The `warp_size` lanes are threads (SIMT: a warp of 32 on NVIDIA, a wavefront of 64 on
        AMD), each with its own 32-bit registers and its own register tile, scheduled a warp at a
        time on the unit's `teu_per_unit` warp schedulers; not SIMD lanes of one vector register
        that a single core thread fills along the vectorised axis (CPU). Roller's execution-unit
        rule (§3.1) aligns to the parallel width the tile runs on: the warp, or the SIMD width."""
        return self.kind == "gpu"

    @cached_property
    def register_bytes(self) -> int:
        """Bytes of one register a thread's tile lives in: a 32-bit register per SIMT lane
        (`registers_per_unit` counts them), or a vector register of `warp_size` 32-bit lanes on
        a CPU core; `registers_per_thread_cap` counts registers of this size."""
        return 4 if self.lanes_are_threads else 4 * self.warp_size

    @cached_property
    def fma_accumulators(self) -> int:
        """Independent vector accumulators a CPU core's register micro-kernel needs to keep
        every FMA pipe busy: a reduction's FMA into one accumulator waits for the previous one
        to finish (`fma_latency_cycles`), so `fma_pipes` FMAs per cycle need latency x pipes
        chains in flight (Little's law; why BLAS's AVX2 kernel is 6 x 16 fp32 = 12 ymm
        accumulators). 0 where the spec states no FMA facts (GPUs; a hand-built spec)."""
        return self.fma_latency_cycles * self.fma_pipes if self.runs_on_cpu else 0

    @property
    def unit_shared_bytes(self) -> int:
        """Block-shared memory of one unit that its resident blocks share: `shared_bytes_per_unit`,
        or where the spec does not say, the one block's capacity of the unit layer (as if a unit
        held no more than one block's worth: the conservative reading)."""
        return self.shared_bytes_per_unit or self.layers[self.unit_layer_index].capacity_bytes

    def is_thread_block_layer(self, layer: int) -> bool:
        """Whether a tile at `layer` is one thread block's work: the last per-unit layer of a
        device that launches thread blocks. The block's threads (unit tile over register tile on
        the spatial axes) come in whole warps (Roller's execution-unit rule) and are bounded by
        `max_threads_per_block` and the unit's `registers_per_unit`; a CPU core's work item runs
        on one thread, so no such bound exists there."""
        return self.launches_thread_blocks and layer == self.unit_layer_index

    def is_block_shared(self, layer: int) -> bool:
        """Whether `layer` is a scratchpad shared by a block's threads (CUDA shared memory, AMD
        LDS): the program fills it explicitly with the inputs it stages, and the output's partial
        sums stay in the threads' registers, so the output tile takes no room there. A CPU's
        per-core caches (also scope "unit") hold whatever the core touches, the output included."""
        return self.launches_thread_blocks and self.layers[layer].scope == "unit"

    @property
    def has_occupancy_limits(self) -> bool:
        """Several thread blocks reside on one unit at once, as many as its resident threads
        (`max_threads_per_unit`), registers and block-shared memory allow (occupancy); the warps
        of all of them feed the unit's warp schedulers and one block's loads hide behind another's
        compute. A CPU core runs one work item (one task of TVM's thread pool) at a time."""
        return self.launches_thread_blocks

    @property
    def has_virtual_threads(self) -> bool:
        """A thread's register tile may be split into virtual threads (Gensor's setVthread, TVM's
        `vthread`): its work strided across the block so that one warp's reads of block-shared
        memory spread over the banks. That needs many threads reading a banked scratchpad: a
        thread block. A CPU core's single thread vectorises its tile instead."""
        return self.launches_thread_blocks

    def has_tensor_cores(self, dtype: str) -> bool:
        """Whether MMA units (NVIDIA tensor cores, AMD matrix cores) multiply `dtype`: the spec
        gives a fragment shape and a peak for the dtype. A warp issues the MMA, so only on a
        device that launches thread blocks (the CPU code generator emits no AMX / VNNI)."""
        return self.launches_thread_blocks and bool(self.tensor_core_fragment) and dtype in dict(self.tensor_core_gflops)

    def peak(self, dtype: str, tensor_core: bool = False) -> float:
        """Peak compute in GFLOP/s for `dtype`; falls back to float32 on the plain ALUs."""
        table = dict(self.tensor_core_gflops if tensor_core else self.peak_gflops)
        if dtype in table:
            return table[dtype]
        return dict(self.peak_gflops)["float32"]

    def micro_kernel(self, dtype: str, rows: int, cols: int) -> MicroKernel | None:
        """The measured micro-kernel of `rows` x `cols` accumulators of `dtype`, or None."""
        for kernel in self.micro_kernels:
            if (kernel.dtype, kernel.rows, kernel.cols) == (dtype, rows, cols):
                return kernel
        return None

    @classmethod
    def from_dict(cls, data: Mapping) -> "DeviceSpec":
        """The spec `dataclasses.asdict` wrote and JSON carried (lists for its tuples), as the runs
        store keeps it; fields this version does not have are left out, missing ones default."""
        known = {f.name for f in fields(cls)}
        values = {k: _tuples(v) for k, v in data.items() if k in known and k not in ("layers", "micro_kernels")}
        return cls(layers=tuple(MemoryLayer(**_known(MemoryLayer, l)) for l in data["layers"]),
                   micro_kernels=tuple(MicroKernel(**_known(MicroKernel, k)) for k in data.get("micro_kernels", ())),
                   **values)

    def target_dict(self) -> dict:
        """The TVM target as the dict form TVM 0.27 accepts (flag strings are refused)."""
        out = {}
        for key, value in self.target:
            out[key] = dict(value) if isinstance(value, tuple) else value
        return out


def _tuples(value):
    """JSON's lists back as the tuples they were written from."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _known(kind, data: dict) -> dict:
    names = {f.name for f in fields(kind)}
    return {k: _tuples(v) for k, v in data.items() if k in names}
