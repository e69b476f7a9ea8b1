"""A device spec's TOML text parsed and validated into a `DeviceSpec`, every problem a `UserError`
naming the bad field (`spec_from_toml_text`); the field names the writer (`hardware.write`)
shares. The schema is in `specs/devices/README.md`."""

from __future__ import annotations

import math
import re
import sys

from workbench.errors import UserError
from workbench.hardware.bounds import MICRO_KERNEL_SLACK, check_bounds
from workbench.hardware.detect import DEFAULT_CPU_LAUNCH_US, DEFAULT_FMA
from workbench.hardware.spec import DEVICE_KINDS, LAYER_SCOPES, DeviceSpec, MemoryLayer, MicroKernel
from workbench.hardware.targets import target_problem

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEVICE_INTS = (
    "compute_units",
    "warp_size",
    "teu_per_unit",
    "max_threads_per_block",
    "max_threads_per_unit",
    "registers_per_thread_cap",
    "registers_per_unit",
)
# FMA facts of a CPU core (0 on GPUs). A CPU spec without them gets DEFAULT_FMA (5 cycles x 2
# pipes): more accumulators than a core needs cost registers, never FMA throughput.
DEVICE_FMA = ("fma_latency_cycles", "fma_pipes")
# What one kernel launch costs (microseconds). Optional, so that spec files written before the
# field load: without it a GPU gets DEFAULT_GPU_LAUNCH_US, a CPU detect's DEFAULT_CPU_LAUNCH_US, and
# [sources] says it was assumed. A launch of 10 ms or more is a unit mistake, not a device.
LAUNCH_KEY = "launch_overhead_us"
MAX_LAUNCH_US = 10_000.0
# A CUDA or ROCm kernel launch as commonly measured with back-to-back empty kernels: a few
# microseconds (about 2-5 us on recent NVIDIA drivers, more on older GPUs and AMD's HIP); an
# estimate for a spec that does not say.
DEFAULT_GPU_LAUNCH_US = 5.0
# Occupancy limits of a GPU unit (`DeviceSpec.max_blocks_per_unit`, `shared_bytes_per_unit`) and
# the GPU's L2 (`l2_bytes`). Optional, so that spec files written before the fields load: absent,
# a unit has no stated block limit, its shared memory is read as one block's
# (`DeviceSpec.unit_shared_bytes`) and the CUDA template keeps row-major block order. 0 on a CPU.
DEVICE_OCCUPANCY = ("max_blocks_per_unit", "shared_bytes_per_unit", "l2_bytes")
# A CPU's last-level cache (`DeviceSpec.llc_bytes`, `llc_gbps`). Optional, so that spec files
# written before the fields load: absent, the rTile model reads everything below the last cache
# layer from the bottom layer. Both or neither, 0 on a GPU.
DEVICE_LLC = ("llc_bytes", "llc_gbps")
# One CPU core's streaming read from DRAM (`DeviceSpec.core_dram_gbps`). Optional: absent (0), a
# what-if with fewer cores scales the bottom layer's bandwidth with them. A CPU's only.
CORE_DRAM_KEY = "core_dram_gbps"
# Rows a CPU core's prefetchers follow at once (`DeviceSpec.prefetch_rows`). Optional: absent (0),
# the model assumes `rtile.axes.PREFETCH_ROWS`. A CPU's only.
PREFETCH_KEY = "prefetch_rows"
_DEVICE_KEYS = (
    ("name", "kind", "vendor", "source", "calibrated", LAUNCH_KEY) + DEVICE_INTS + DEVICE_FMA + DEVICE_OCCUPANCY
    + DEVICE_LLC + (CORE_DRAM_KEY, PREFETCH_KEY)
)
LAYER_KEYS = (
    "name",
    "scope",
    "capacity_bytes",
    "bandwidth_gbps",
    "transaction_bytes",
    "latency_ns",
    "banks",
    "bank_width_bytes",
    "ways",
    "source",
)
_SOURCE_KEYS = DEVICE_INTS + DEVICE_FMA + DEVICE_OCCUPANCY + DEVICE_LLC + (
    CORE_DRAM_KEY, PREFETCH_KEY, LAUNCH_KEY, "peak_gflops", "tensor_core_gflops", "tensor_core", "target", "micro_kernels"
)
_TABLES = ("device", "sources", "peak_gflops", "tensor_core_gflops", "tensor_core", "micro_kernels", "target", "layer")
_DTYPE = re.compile(r"(u?int|float|bfloat)[0-9]+")
_TILE_SHAPE = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)")  # a micro-kernel's rows x columns: "6x16"
_MISSING = object()


def spec_from_toml_text(text: str, label: str = "spec", *, check_target: bool = True) -> DeviceSpec:
    """Parse and validate a spec; every problem raises `UserError` as `"<label>: <field> ..."`."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{label}: TOML syntax error: {err}") from None
    try:
        return _spec_from_doc(doc, check_target)
    except UserError as err:
        raise UserError(f"{label}: {err}") from None


def _spec_from_doc(doc: dict, check_target: bool) -> DeviceSpec:
    _check_keys(doc, _TABLES, "")
    device = _table(doc, "device")
    _check_keys(device, _DEVICE_KEYS, "device.")
    ints = {key: _int(device.get(key, _MISSING), f"device.{key}") for key in DEVICE_INTS}
    ints.update(_fma(device))
    ints.update(_occupancy(device))
    llc = _llc(device)
    peak = _gflops(doc, "peak_gflops", required=True)
    tensor_core = _gflops(doc, "tensor_core_gflops", required=False)
    launch_us, launch_note = _launch(device)
    sources = _sources(doc)
    if launch_note and LAUNCH_KEY not in dict(sources):
        sources = tuple(sorted(sources + ((LAUNCH_KEY, launch_note),)))
    spec = DeviceSpec(
        name=_text(device.get("name", _MISSING), "device.name"),
        kind=_choice(device.get("kind", _MISSING), DEVICE_KINDS, "device.kind"),
        vendor=_text(device.get("vendor", _MISSING), "device.vendor"),
        layers=_layers(doc.get("layer", _MISSING)),
        peak_gflops=peak,
        tensor_core_gflops=tensor_core,
        tensor_core_fragment=_fragment(doc, bool(tensor_core)),
        target=_target(doc),
        source=_text(device.get("source", _MISSING), "device.source"),
        calibrated=_bool(device.get("calibrated", False), "device.calibrated"),
        sources=sources,
        micro_kernels=_micro_kernels(doc),
        launch_overhead_us=launch_us,
        **ints,
        **llc,
        core_dram_gbps=_core_dram(device),
        prefetch_rows=_prefetch_rows(device),
    )
    check_bounds(spec)
    _check_consistency(spec)
    problem = target_problem(spec.target) if check_target else ""
    if problem:
        raise UserError(problem)
    return spec


def _fma(device: dict) -> dict[str, int]:
    """fma_latency_cycles and fma_pipes: both positive on a CPU (DEFAULT_FMA where neither is
    given), both 0 or absent on a GPU (warps hide its latency, not a thread's accumulators)."""
    cpu = device.get("kind") == "cpu"
    given = [key for key in DEVICE_FMA if key in device]
    if not given:
        return {"fma_latency_cycles": DEFAULT_FMA.latency_cycles if cpu else 0, "fma_pipes": DEFAULT_FMA.pipes if cpu else 0}
    if len(given) == 1:
        missing = next(key for key in DEVICE_FMA if key not in device)
        raise UserError(f"device.{missing} is missing (give both fma_latency_cycles and fma_pipes, or neither)")
    values = {key: _int(device[key], f"device.{key}", minimum=1 if cpu else 0) for key in DEVICE_FMA}
    if not cpu and any(values.values()):
        raise UserError("device.fma_latency_cycles and device.fma_pipes describe CPU cores: 0 (or absent) on a GPU")
    return values


def _occupancy(device: dict) -> dict[str, int]:
    """max_blocks_per_unit, shared_bytes_per_unit and l2_bytes: integers >= 0 (0 or absent: not
    stated), 0 on a CPU, whose core runs one work item at a time and has no block-shared memory
    (its caches are layers)."""
    values = {key: _int(device.get(key, 0), f"device.{key}", minimum=0) for key in DEVICE_OCCUPANCY}
    given = [key for key, value in values.items() if value]
    if device.get("kind") == "cpu" and given:
        raise UserError(f"device.{given[0]} describes a GPU: 0 (or absent) on a CPU")
    return values


def _llc(device: dict) -> dict:
    """llc_bytes (an integer) and llc_gbps (a number), both > 0 or both absent; a CPU's only."""
    given = [key for key in DEVICE_LLC if key in device]
    if not given:
        return {"llc_bytes": 0, "llc_gbps": 0.0}
    if len(given) == 1:
        missing = next(key for key in DEVICE_LLC if key not in device)
        raise UserError(f"device.{missing} is missing (give both llc_bytes and llc_gbps, or neither)")
    if device.get("kind") != "cpu":
        raise UserError("device.llc_bytes and device.llc_gbps describe a CPU's last-level cache: a GPU's L2 is "
                        "device.l2_bytes")
    return {"llc_bytes": _int(device["llc_bytes"], "device.llc_bytes"),
            "llc_gbps": _number(device["llc_gbps"], "device.llc_gbps")}


def _core_dram(device: dict) -> float:
    """core_dram_gbps (a number > 0, a CPU's only), or 0.0 where absent."""
    if CORE_DRAM_KEY not in device:
        return 0.0
    if device.get("kind") != "cpu":
        raise UserError(f"device.{CORE_DRAM_KEY} is one CPU core's DRAM stream: a CPU's only")
    return _number(device[CORE_DRAM_KEY], f"device.{CORE_DRAM_KEY}")


def _prefetch_rows(device: dict) -> int:
    """prefetch_rows (an integer > 0, a CPU's only), or 0 where absent."""
    if PREFETCH_KEY not in device:
        return 0
    if device.get("kind") != "cpu":
        raise UserError(f"device.{PREFETCH_KEY} is what a CPU core's prefetchers follow: a CPU's only")
    return _int(device[PREFETCH_KEY], f"device.{PREFETCH_KEY}", minimum=1)


def _launch(device: dict) -> tuple[float, str]:
    """device.launch_overhead_us, a number in [0, MAX_LAUNCH_US); absent (a spec written before
    the field): the default for the device's kind and a note saying it was assumed."""
    if LAUNCH_KEY not in device:
        gpu = device.get("kind") == "gpu"
        default = DEFAULT_GPU_LAUNCH_US if gpu else DEFAULT_CPU_LAUNCH_US
        what = "a GPU kernel launch as commonly measured" if gpu else "a TVM CPU kernel's call and thread pool fork/join"
        return default, f"not in the spec file: {default:g} us assumed ({what}; an estimate)"
    value = _number(device[LAUNCH_KEY], f"device.{LAUNCH_KEY}", positive=False)
    if value >= MAX_LAUNCH_US:
        raise UserError(f"device.{LAUNCH_KEY} must be below {MAX_LAUNCH_US:g} us (microseconds), got {device[LAUNCH_KEY]!r}")
    return value, ""


def _check_consistency(spec: DeviceSpec) -> None:
    if spec.max_threads_per_block > spec.max_threads_per_unit:
        raise UserError(
            f"device.max_threads_per_block ({spec.max_threads_per_block}) must not exceed "
            f"device.max_threads_per_unit ({spec.max_threads_per_unit})"
        )
    if spec.registers_per_thread_cap > spec.registers_per_unit:
        raise UserError("device.registers_per_thread_cap must not exceed device.registers_per_unit")
    if spec.max_blocks_per_unit > spec.max_threads_per_unit:
        raise UserError(
            f"device.max_blocks_per_unit ({spec.max_blocks_per_unit}) must not exceed "
            f"device.max_threads_per_unit ({spec.max_threads_per_unit}): a block has at least one thread"
        )
    block_shared = spec.layers[spec.unit_layer_index].capacity_bytes
    if spec.shared_bytes_per_unit and spec.shared_bytes_per_unit < block_shared:
        raise UserError(
            f"device.shared_bytes_per_unit ({spec.shared_bytes_per_unit}) must not be below the unit layer's "
            f"capacity_bytes ({block_shared}): one block's shared memory is part of its unit's"
        )
    target_kind = dict(spec.target)["kind"]
    if spec.runs_on_cpu != (target_kind == "llvm"):
        raise UserError(f"target.kind {target_kind!r} does not fit device.kind {spec.kind!r}")
    if spec.micro_kernels and not spec.runs_on_cpu:
        raise UserError("micro_kernels are CPU register micro-kernels: not on a GPU spec")
    for kernel in spec.micro_kernels:
        # the same bound calibration refuses a measurement by (calibrate.impossible)
        peak = spec.peak(kernel.dtype)
        if kernel.gflops > peak * MICRO_KERNEL_SLACK:
            raise UserError(
                f"micro_kernels.{kernel.dtype}.{kernel.shape} ({kernel.gflops:g} GFLOP/s) is faster than "
                f"the {kernel.dtype} peak ({peak:g} GFLOP/s) x {MICRO_KERNEL_SLACK:g}: no kernel beats the FMA peak"
            )


def _layers(raw: object) -> tuple[MemoryLayer, ...]:
    if raw is _MISSING:
        raise UserError("layer is missing: give [[layer]] tables from registers down to DRAM")
    if not isinstance(raw, list) or len(raw) < 2:
        raise UserError("layer must be at least two [[layer]] tables (a 'unit' and a 'device' one)")
    layers = tuple(_layer(item, i) for i, item in enumerate(raw))
    _check_hierarchy(layers)
    return layers


def _layer(raw: object, i: int) -> MemoryLayer:
    where = f"layer[{i}]"
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a table")
    _check_keys(raw, LAYER_KEYS, f"{where}.")
    banks = _int(raw.get("banks", 0), f"{where}.banks", minimum=0)
    bank_width = _int(raw.get("bank_width_bytes", 0), f"{where}.bank_width_bytes", minimum=0)
    if (banks == 0) != (bank_width == 0):
        raise UserError(f"{where}.banks and {where}.bank_width_bytes must both be 0 or both positive")
    return MemoryLayer(
        name=_text(raw.get("name", _MISSING), f"{where}.name"),
        scope=_choice(raw.get("scope", _MISSING), LAYER_SCOPES, f"{where}.scope"),
        capacity_bytes=_int(raw.get("capacity_bytes", _MISSING), f"{where}.capacity_bytes"),
        bandwidth_gbps=_number(raw.get("bandwidth_gbps", _MISSING), f"{where}.bandwidth_gbps"),
        transaction_bytes=_int(raw.get("transaction_bytes", _MISSING), f"{where}.transaction_bytes"),
        latency_ns=_number(raw.get("latency_ns", _MISSING), f"{where}.latency_ns", positive=False),
        banks=banks,
        bank_width_bytes=bank_width,
        source=_text(raw.get("source", _MISSING), f"{where}.source"),
        ways=_int(raw.get("ways", 0), f"{where}.ways", minimum=0),
    )


def _check_hierarchy(layers: tuple[MemoryLayer, ...]) -> None:
    """Top (smallest, per thread) to bottom (the device's memory), as Roller's MemLayer(0..L)."""
    names = [layer.name for layer in layers]
    for i, (upper, lower) in enumerate(zip(layers, layers[1:]), start=1):
        if lower.name in names[:i]:
            raise UserError(f"layer[{i}].name {lower.name!r} is used by another layer")
        if lower.capacity_bytes <= upper.capacity_bytes:
            raise UserError(
                f"layer[{i}].capacity_bytes ({lower.capacity_bytes}) must be larger than "
                f"layer[{i - 1}]'s ({upper.capacity_bytes}): layers go top (smallest) to bottom"
            )
        if LAYER_SCOPES.index(lower.scope) < LAYER_SCOPES.index(upper.scope):
            raise UserError(
                f"layer[{i}].scope {lower.scope!r} cannot sit below a {upper.scope!r} layer: "
                "scopes go thread, unit, device from top to bottom"
            )
    bottom = len(layers) - 1
    if layers[bottom].scope != "device":
        raise UserError(f"layer[{bottom}].scope must be 'device' (the bottom layer), got {layers[bottom].scope!r}")
    if sum(layer.scope == "device" for layer in layers) > 1:
        raise UserError("only the bottom layer may have scope 'device'")
    if not any(layer.scope == "unit" for layer in layers):
        raise UserError("no layer has scope 'unit' (shared memory on GPUs, a per-core cache on CPUs)")


def _gflops(doc: dict, key: str, required: bool) -> tuple[tuple[str, float], ...]:
    table = doc.get(key, _MISSING)
    if table is _MISSING and not required:
        return ()
    table = _table(doc, key)
    for dtype in table:
        if not _DTYPE.fullmatch(dtype):
            raise UserError(f"{key}.{dtype} is not a dtype name (float32, float16, int8, ...)")
    if required and "float32" not in table:
        raise UserError(f"{key}.float32 is missing")
    return tuple(sorted((dtype, _number(v, f"{key}.{dtype}")) for dtype, v in table.items()))


def _micro_kernels(doc: dict) -> tuple[MicroKernel, ...]:
    """[micro_kernels.<dtype>] tables of "<rows>x<cols>" = GFLOP/s, sorted by (dtype, rows, cols)."""
    if "micro_kernels" not in doc:
        return ()
    kernels = []
    for dtype, table in _table(doc, "micro_kernels").items():
        if not _DTYPE.fullmatch(dtype):
            raise UserError(f"micro_kernels.{dtype} is not a dtype name (float32, float64, ...)")
        if not isinstance(table, dict):
            raise UserError(f"micro_kernels.{dtype} must be a table of \"<rows>x<columns>\" = GFLOP/s, got {table!r}")
        for shape, value in table.items():
            match = _TILE_SHAPE.fullmatch(shape)
            if match is None:
                raise UserError(f"micro_kernels.{dtype}.{shape} is not a register tile <rows>x<columns> (such as 6x16)")
            gflops = _number(value, f"micro_kernels.{dtype}.{shape}")
            kernels.append(MicroKernel(dtype, int(match[1]), int(match[2]), gflops))
    return tuple(sorted(kernels, key=lambda k: (k.dtype, k.rows, k.cols)))


def _fragment(doc: dict, has_tensor_cores: bool) -> tuple[int, ...]:
    table = doc.get("tensor_core", _MISSING)
    if table is _MISSING and not has_tensor_cores:
        return ()
    if not has_tensor_cores:
        raise UserError("tensor_core is given but tensor_core_gflops is not")
    table = _table(doc, "tensor_core")
    _check_keys(table, ("fragment",), "tensor_core.")
    raw = table.get("fragment", _MISSING)
    if raw is _MISSING:
        raise UserError("tensor_core.fragment is missing")
    if not isinstance(raw, list) or len(raw) != 3:
        raise UserError(f"tensor_core.fragment must be [m, n, k], got {raw!r}")
    return tuple(_int(v, f"tensor_core.fragment[{i}]") for i, v in enumerate(raw))


def _target(doc: dict) -> tuple[tuple[str, object], ...]:
    table = _table(doc, "target")
    _text(table.get("kind", _MISSING), "target.kind")
    items = []
    for key, value in table.items():
        if isinstance(value, dict):
            for sub_key, sub_value in value.items():
                _scalar(sub_value, f"target.{key}.{sub_key}")
            value = tuple(sorted(value.items()))
        else:
            _scalar(value, f"target.{key}")
        items.append((key, value))
    return tuple(sorted(items))


def _sources(doc: dict) -> tuple[tuple[str, str], ...]:
    table = doc.get("sources", _MISSING)
    if table is _MISSING:
        return ()
    table = _table(doc, "sources")
    _check_keys(table, _SOURCE_KEYS, "sources.")
    return tuple(sorted((key, _text(value, f"sources.{key}")) for key, value in table.items()))


# ---- field checks: each raises UserError naming the field -----------------------------------


def _table(doc: dict, key: str) -> dict:
    value = doc.get(key, _MISSING)
    if value is _MISSING:
        raise UserError(f"{key} is missing")
    if not isinstance(value, dict):
        raise UserError(f"{key} must be a table, got {value!r}")
    return value


def _check_keys(table: dict, allowed: tuple[str, ...], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise UserError(f"unknown field {prefix}{key} (known: {', '.join(allowed)})")


def _missing(value: object, field: str) -> None:
    if value is _MISSING:
        raise UserError(f"{field} is missing")


def _int(value: object, field: str, minimum: int = 1) -> int:
    _missing(value, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UserError(f"{field} must be {wanted}, got {value!r}")
    return value


def _number(value: object, field: str, positive: bool = True) -> float:
    _missing(value, field)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        wanted = "a positive number" if positive else "a number >= 0"
        raise UserError(f"{field} must be {wanted}, got {value!r}")
    return float(value)


def _text(value: object, field: str) -> str:
    _missing(value, field)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{field} must be a non-empty string, got {value!r}")
    return value


def _choice(value: object, choices: tuple[str, ...], field: str) -> str:
    _missing(value, field)
    if value not in choices:
        raise UserError(f"{field} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{field} must be true or false, got {value!r}")
    return value


def _scalar(value: object, field: str) -> None:
    if not isinstance(value, (str, int, float, bool)):
        raise UserError(f"{field} must be a string, number or boolean, got {value!r}")
