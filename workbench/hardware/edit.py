"""What-if edits of a device spec: `FIELD=VALUE` by the spec file's own TOML names, applied to a
`DeviceSpec` as a new, validated spec (`apply_edits`), and one field's range of values
(`parse_sweep`, `sweep_values`).

Field names (`editable_fields` lists a spec's):

- a `[device]` number by its name: `compute_units=40`, `launch_overhead_us=2` (`device.` may lead);
- a layer's number by the layer's name: `shared.capacity_bytes=98304`, `L2.capacity_bytes=2MiB`,
  `global.bandwidth_gbps=1500`;
- a table entry by its path: `peak_gflops.float32=20000`, `tensor_core_gflops.float16=400000`,
  `micro_kernels.float32.6x16=150`, `target.mcpu=x86-64-v2`.

A value is a number, a size with a binary unit for a `*_bytes` field (`2MiB`, `48KiB`, `1GiB`),
a factor of the base value (`2x`, `0.5x`), or text for a text entry of `[target]`.

Two edits change more than their field, because the field is a count or a kind the other
numbers are per-item rates of (each derived change is listed in `EditedSpec.derived`; a field
the edits name themselves is never derived over):

- `compute_units`: the device's aggregate rates that are per unit times units scale with the
  units: peak (plain, tensor-core, micro-kernels), the bandwidth of every per-thread and per-unit
  layer, a CPU's LLC bandwidth and its DRAM bandwidth (a CPU core streams from DRAM at its own
  rate, as `hardware.detect` estimates it; a GPU's memory bandwidth belongs to its memory
  controllers, not its SMs), and a CPU target's `num-cores`. Where the spec knows one core's
  DRAM stream (`core_dram_gbps`, calibrated), fewer cores read DRAM at the lesser of what they
  stream and what all did: the memory saturates before every core streams;
- `target.mcpu` on an x86 CPU spec, between the ISAs of `X86_ISAS`: the SIMD width
  (`warp_size`), vector registers, the register layer's bytes, transaction and bandwidth, and
  the peaks (the lanes' ratio; without FMA, half on Intel cores, whose adds issue on the FMA
  ports, and two thirds on AMD's Zen (`AMD_NO_FMA`), and
  the micro-kernels scaled alike, those whose accumulators no longer fit the registers dropped.

The edited spec is the one its TOML (`hardware.write.spec_to_toml`) reads back to: every edit is
checked as the loader checks a spec file (`hardware.parse`, `hardware.bounds`), and a bad field
or value is one `UserError` line naming the field as the edit wrote it.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace

from workbench.errors import UserError
from workbench.hardware.bounds import (
    CAPACITY_BYTES, DEVICE_GBPS, DEVICE_INTS, LAYER_INTS, MAX_LATENCY_NS, MAX_PREFETCH_ROWS, MIN_GBPS,
    MIN_GFLOPS, MAX_GFLOPS, MIN_LATENCY_NS, NAME, NAME_MAX, ON_CHIP_GBPS,
)
from workbench.hardware.parse import LAYER_KEYS, MAX_LAUNCH_US, spec_from_toml_text
from workbench.hardware.spec import DeviceSpec
from workbench.hardware.write import spec_to_toml

# Binary size units of a `*_bytes` value (the KiB/MiB/GiB; case-insensitive).
SIZE_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmg]ib)", re.I)
_FACTOR = re.compile(r"([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)x", re.I)
_FIELD = re.compile(r"[A-Za-z0-9_.-]+")
_DEVICE_FLOATS = ("launch_overhead_us", "llc_gbps", "core_dram_gbps")
_LAYER_NUMBERS = tuple(k for k in LAYER_KEYS if k not in ("name", "scope", "source"))
_LAYER_FLOATS = ("bandwidth_gbps", "latency_ns")
# The points of a sweep: at least 2 (its ends), at most this many constructions per workload.
MAX_SWEEP_POINTS = 64


@dataclass(frozen=True)
class Isa:
    """An x86 SIMD level as LLVM's CPU name selects it: 32-bit lanes of a vector register,
    architectural vector registers, and whether it has FMA."""

    name: str
    lanes: int
    registers: int
    fma: bool
    flags: frozenset[str]  # /proc/cpuinfo flags a CPU needs to run its code


_SSE42 = Isa("SSE4.2", 4, 16, False, frozenset({"sse4_2"}))
_AVX = Isa("AVX", 8, 16, False, frozenset({"avx"}))
_AVX2 = Isa("AVX2+FMA", 8, 16, True, frozenset({"avx2", "fma"}))
_AVX512 = Isa("AVX-512", 16, 32, True, frozenset({"avx512f"}))
# LLVM x86 CPU names by the ISA their code uses: the generic levels (x86-64-v2 = SSE4.2, v3 =
# AVX2+FMA, v4 = AVX-512) and the names `hardware.detect` chooses (its `_X86_MCPU`); Sandy
# Bridge is AVX without FMA.
X86_ISAS = {
    "x86-64-v2": _SSE42, "nehalem": _SSE42,
    "sandybridge": _AVX, "ivybridge": _AVX,
    "x86-64-v3": _AVX2, "haswell": _AVX2, "znver1": _AVX2, "znver2": _AVX2, "znver3": _AVX2,
    "x86-64-v4": _AVX512, "skylake-avx512": _AVX512, "cascadelake": _AVX512, "icelake-server": _AVX512,
    "sapphirerapids": _AVX512, "znver4": _AVX512, "znver5": _AVX512,
}

# The flops a lane keeps without FMA on AMD's Zen, measured: its FADD pipes issue beside the FMA
# ones (family 17h-1Ah optimization guides), so a multiply and an add could run each cycle, but
# the kernels of the cpu-core suite on a Zen 3 ran 0.30-0.39x their AVX2+FMA speed as SSE4.2
# code (half the lanes) and 0.59-0.71x as AVX (sandybridge): about two thirds of the flops
# (docs/benchmarks.md, "What-if measured"; twice the instructions to dispatch per FMA).
AMD_NO_FMA = 2 / 3

# Cores (LLVM CPU names) that run a 512-bit FMA on two 256-bit pipes, one zmm FMA a cycle: Zen 4
# (AMD family 19h optimization guide; `hardware.detect` gives it one FMA pipe at 16 lanes). Its
# AVX2 or SSE code issues on both pipes, so a narrower ISA keeps its FMA lanes per cycle: AVX2
# code ran the cpu-core matmuls at 0.83-0.86x their AVX-512 speed on a 2-core Zen 4, where
# halving the peak with the lanes predicted 0.51 (docs/benchmarks.md, "What-if measured").
DOUBLE_PUMPED = frozenset({"znver4"})


@dataclass(frozen=True)
class Edit:
    """One `FIELD=VALUE`: the field as written, the value's text, and `value` resolved against
    the base spec by `apply_edits` (a factor `2x` or a size `2MiB` as the number it means)."""

    field: str
    text: str

    def __str__(self) -> str:
        return f"{self.field}={self.text}"


@dataclass(frozen=True)
class Change:
    """A field the edits changed: its name, the base value and the edited one."""

    field: str
    before: object
    after: object


@dataclass(frozen=True)
class EditedSpec:
    """A spec after edits: `spec` (named `derived_name(base, edits)`), the edits, the fields
    they set (`changes`) and the fields that follow from them (`derived`)."""

    base: DeviceSpec
    spec: DeviceSpec
    edits: tuple[Edit, ...]
    changes: tuple[Change, ...]
    derived: tuple[Change, ...]

    @property
    def toml(self) -> str:
        """The edited spec as a TOML spec file (`load_spec` reads it back to `spec`)."""
        return spec_to_toml(self.spec)


@dataclass(frozen=True)
class FieldInfo:
    """One editable field of a spec: its name for an edit, current value, kind ("int", "float",
    "text"), unit ("bytes", "GB/s", "ns", "GFLOP/s", "us", or "") and the bounds the loader
    holds it to (`hardware.bounds`; None: no numeric bound)."""

    name: str
    value: object
    kind: str
    unit: str
    low: float | None
    high: float | None


def parse_edit(text: str) -> Edit:
    """`FIELD=VALUE` as an Edit (the field is resolved against a spec by `apply_edits`);
    UserError for text without `=`, an empty side, or a field name with other characters than
    letters, digits, `_`, `.` and `-`."""
    field, sep, value = str(text).partition("=")
    field, value = field.strip(), value.strip()
    if not sep or not field or not value:
        raise UserError(f"{str(text)[:60]!r}: an edit is FIELD=VALUE, such as L2.capacity_bytes=2MiB")
    if not _FIELD.fullmatch(field):
        raise UserError(f"{field[:60]!r} is not a field name (letters, digits, '_', '.', '-')")
    return Edit(field, value)


def editable_fields(spec: DeviceSpec) -> tuple[FieldInfo, ...]:
    """Every field of `spec` an edit may name, with its value, unit and bounds, in the spec
    file's order: [device] numbers, peaks, micro-kernels, [target] entries, then each layer's."""
    out = []
    for key, (low, high) in DEVICE_INTS.items():
        unit = "bytes" if key.endswith("_bytes") else ""
        out.append(FieldInfo(key, getattr(spec, key), "int", unit, low, high))
    out.append(FieldInfo("launch_overhead_us", spec.launch_overhead_us, "float", "us", 0.0, MAX_LAUNCH_US))
    if spec.llc_bytes:  # llc_bytes itself is one of DEVICE_INTS above
        out.append(FieldInfo("llc_gbps", spec.llc_gbps, "float", "GB/s", MIN_GBPS, ON_CHIP_GBPS))
    if spec.core_dram_gbps:
        out.append(FieldInfo("core_dram_gbps", spec.core_dram_gbps, "float", "GB/s", MIN_GBPS, DEVICE_GBPS))
    if spec.prefetch_rows:
        out.append(FieldInfo("prefetch_rows", spec.prefetch_rows, "int", "rows", 1, MAX_PREFETCH_ROWS))
    for table, entries in (("peak_gflops", spec.peak_gflops), ("tensor_core_gflops", spec.tensor_core_gflops)):
        out += [FieldInfo(f"{table}.{dtype}", value, "float", "GFLOP/s", MIN_GFLOPS, MAX_GFLOPS) for dtype, value in entries]
    out += [FieldInfo(f"micro_kernels.{k.dtype}.{k.shape}", k.gflops, "float", "GFLOP/s", MIN_GFLOPS, MAX_GFLOPS)
            for k in spec.micro_kernels]
    out += [FieldInfo(f"target.{key}", value, "int" if isinstance(value, int) else "text", "", None, None)
            for key, value in spec.target if key != "kind" and isinstance(value, (str, int)) and not isinstance(value, bool)]
    for layer in spec.layers:
        out.append(FieldInfo(f"{layer.name}.capacity_bytes", layer.capacity_bytes, "int", "bytes", 1,
                             CAPACITY_BYTES[layer.scope]))
        top = DEVICE_GBPS if layer.scope == "device" else ON_CHIP_GBPS
        out.append(FieldInfo(f"{layer.name}.bandwidth_gbps", layer.bandwidth_gbps, "float", "GB/s", MIN_GBPS, top))
        out.append(FieldInfo(f"{layer.name}.latency_ns", layer.latency_ns, "float", "ns", MIN_LATENCY_NS, MAX_LATENCY_NS))
        for key, (low, high) in LAYER_INTS.items():
            out.append(FieldInfo(f"{layer.name}.{key}", getattr(layer, key), "int", "bytes" if key.endswith("_bytes") else "",
                                 low, high))
    return tuple(out)


def field_info(spec: DeviceSpec, field: str) -> FieldInfo:
    """The editable field `field` of `spec` (`device.` may lead a [device] field; a layer's name
    matches case-insensitively where no layer has it exactly); UserError naming the fields there
    are otherwise."""
    fields = {f.name: f for f in editable_fields(spec)}
    name = field[len("device."):] if field.startswith("device.") and field[len("device."):] in fields else field
    if name in fields:
        return fields[name]
    folded = [f for f in fields if f.lower() == name.lower()]
    if len(folded) == 1:
        return fields[folded[0]]
    layers = ", ".join(l.name for l in spec.layers)
    raise UserError(f"{field}: no such field of {spec.name} (a [device] number such as compute_units, a layer's field "
                    f"as LAYER.capacity_bytes with LAYER one of {layers}, peak_gflops.DTYPE, target.mcpu, ...)")


def apply_edits(base: DeviceSpec, edits: tuple[Edit, ...] | list[Edit]) -> EditedSpec:
    """`base` with `edits` applied (a later edit of the same field wins), the derived changes of
    `compute_units` and `target.mcpu` made (module docstring), renamed `derived_name(base,
    edits)`, not `calibrated`, and validated as a spec file is; UserError in one line naming the
    field otherwise."""
    edits = tuple(edits)
    values: dict[str, object] = {}
    for edit in edits:
        info = field_info(base, edit.field)
        values[info.name] = _value(edit, info)
    spec = base
    derived: dict[str, Change] = {}
    for name in ("compute_units", "target.mcpu"):  # edits with consequences first, so explicit values win
        if name in values:
            spec, more = _derive(spec, name, values[name], set(values))
            derived.update({c.field: c for c in more})
    for name, value in values.items():
        spec = _set(spec, name, value)
    # what-if numbers are not measurements of a machine, even where the base's were
    spec = replace(spec, name=derived_name(base, edits), calibrated=False,
                   source=f"{base.name} with what-if edits {' '.join(map(str, edits))}; base: {base.source}"[:2000])
    try:
        spec = spec_from_toml_text(spec_to_toml(spec), label="edited spec", check_target=False)
    except UserError as err:
        raise UserError(f"{' '.join(map(str, edits))}: {_layer_names(str(err), spec)}") from None
    changes = tuple(Change(n, field_info(base, n).value, field_info(spec, n).value) for n in values)
    kept = tuple(c for n, c in derived.items() if n not in values)
    return EditedSpec(base, spec, edits, changes, kept)


def derived_name(base: DeviceSpec, edits: tuple[Edit, ...]) -> str:
    """The edited spec's name: `BASE-FIELD-VALUE...` where that is an identifier of at most
    NAME_MAX characters, else `BASE-whatif-HASH` (the edits' first 8 hex digits of SHA-1)."""
    words = [base.name] + [f"{e.field}-{e.text}" for e in edits]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(words))
    readable = re.sub(r"([._-])[._-]+", r"\1", readable).strip("._-")
    if len(readable) <= NAME_MAX and NAME.fullmatch(readable):
        return readable
    digest = hashlib.sha1(" ".join(map(str, edits)).encode()).hexdigest()[:8]
    return f"{base.name[:NAME_MAX - 16]}-whatif-{digest}"


# ---- sweeps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """One field over `points` values from `low` to `high` (the texts as written: sizes and
    factors allowed), linear or geometric (`geometric`)."""

    field: str
    low: str
    high: str
    points: int

    def __str__(self) -> str:
        return f"{self.field}={self.low}:{self.high}:{self.points}"


def parse_sweep(text: str) -> Sweep:
    """`FIELD=LO:HI:N` as a Sweep; UserError for another form or N outside 2..MAX_SWEEP_POINTS."""
    edit = parse_edit(text)
    parts = edit.text.split(":")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise UserError(f"{edit}: a sweep is FIELD=LO:HI:N, such as L2.capacity_bytes=256KiB:8MiB:9")
    low, high, n = (p.strip() for p in parts)
    if not n.isdigit() or not 2 <= int(n) <= MAX_SWEEP_POINTS:
        raise UserError(f"{edit}: N must be an integer from 2 to {MAX_SWEEP_POINTS}, got {n[:20]!r}")
    return Sweep(edit.field, low, high, int(n))


def sweep_values(base: DeviceSpec, sweep: Sweep) -> tuple[tuple[object, ...], bool]:
    """(the values of `sweep` on `base`, whether they are spaced geometrically): geometric where
    HI/LO >= 4 (sizes and rates span octaves: L2 256 KiB .. 8 MiB), else linear; an integer
    field's values rounded, repeats dropped. UserError for a text field, LO >= HI or a value out
    of the field's bounds."""
    info = field_info(base, sweep.field)
    if info.kind == "text":
        raise UserError(f"{sweep}: {info.name} is text; a sweep takes a number field")
    low, high = (_value(Edit(sweep.field, t), info) for t in (sweep.low, sweep.high))
    if not low < high:
        raise UserError(f"{sweep}: LO must be below HI, got {low} and {high}")
    geometric = low > 0 and high / low >= 4
    n = sweep.points
    if geometric:
        raw = [low * (high / low) ** (i / (n - 1)) for i in range(n)]
    else:
        raw = [low + (high - low) * i / (n - 1) for i in range(n)]
    raw[0], raw[-1] = low, high
    values = [round(v) if info.kind == "int" else _round(v) for v in raw]
    return tuple(dict.fromkeys(values)), geometric


# ---- values and setting ------------------------------------------------------------------------


def _value(edit: Edit, info: FieldInfo) -> object:
    """The edit's text as a value of the field: a number within the field's bounds (a factor of
    the base value, a binary size for a bytes field), or text for a text entry."""
    text = edit.text
    if info.kind == "text":
        if not NAME.fullmatch(text) or len(text) > NAME_MAX:
            raise UserError(f"{edit}: {info.name} must be a name of letters, digits, '.', '_' or '-', got {text[:40]!r}")
        return text
    size, factor = _SIZE.fullmatch(text), _FACTOR.fullmatch(text)
    if size is not None:
        if info.unit != "bytes":
            raise UserError(f"{edit}: {info.name} is not a size in bytes; give a plain number")
        number = float(size[1]) * SIZE_UNITS[size[2].lower()]
    elif factor is not None:
        number = float(factor[1]) * float(info.value)
    else:
        try:
            number = float(text)
        except ValueError:
            raise UserError(f"{edit}: {text[:40]!r} is not a number" + (", a size (2MiB)" if info.unit == "bytes" else "")
                            + " or a factor of the base value (2x)") from None
    if not math.isfinite(number):
        raise UserError(f"{edit}: {info.name} must be a finite number, got {text[:40]!r}")
    if info.kind == "int":
        if number != int(number):
            raise UserError(f"{edit}: {info.name} must be a whole number, got {number:g}")
        number = int(number)
    if info.low is not None and not info.low <= number <= info.high:
        side = f"at least {info.low:g}" if number < info.low else f"at most {info.high:g}"
        unit = f" {info.unit}" if info.unit else ""
        raise UserError(f"{edit}: {info.name} must be {side}{unit}, got {number:g}: no hardware has that")
    return number


def _set(spec: DeviceSpec, name: str, value: object) -> DeviceSpec:
    """`spec` with the field `name` (an `editable_fields` name) set to `value`."""
    head, _, rest = name.partition(".")
    if not rest:
        return replace(spec, **{name: value})
    if head in ("peak_gflops", "tensor_core_gflops"):
        return replace(spec, **{head: tuple((d, value if d == rest else v) for d, v in getattr(spec, head))})
    if head == "micro_kernels":
        dtype, shape = rest.split(".")
        return replace(spec, micro_kernels=tuple(replace(k, gflops=value) if (k.dtype, k.shape) == (dtype, shape) else k
                                                 for k in spec.micro_kernels))
    if head == "target":
        return replace(spec, target=tuple((k, value if k == rest else v) for k, v in spec.target))
    return replace(spec, layers=tuple(replace(l, **{rest: value}) if l.name == head else l for l in spec.layers))


def _derive(spec: DeviceSpec, name: str, value, explicit: set[str]) -> tuple[DeviceSpec, tuple[Change, ...]]:
    """The fields that follow from `name` = `value` (module docstring), those in `explicit`
    left to their own edits; returns the spec with them set and what changed."""
    if name == "compute_units":
        ratio, changes = value / spec.compute_units, {}
        changes.update(_scaled_peaks(spec, ratio))
        for layer in spec.layers:
            if layer.scope != "device" or spec.runs_on_cpu:
                changes[f"{layer.name}.bandwidth_gbps"] = _round(layer.bandwidth_gbps * ratio)
        bottom = spec.layers[-1]
        if spec.core_dram_gbps and ratio < 1:  # fewer cores stream at most what each one can
            changes[f"{bottom.name}.bandwidth_gbps"] = _round(min(bottom.bandwidth_gbps, value * spec.core_dram_gbps))
        if spec.llc_gbps:
            changes["llc_gbps"] = _round(spec.llc_gbps * ratio)
        if "num-cores" in dict(spec.target):
            changes["target.num-cores"] = value
    else:
        changes = _isa_changes(spec, value)
    out, done = spec, []
    for field, after in changes.items():
        if field in explicit:
            continue
        if field == "micro_kernels":
            before = tuple(f"{k.dtype}.{k.shape}={k.gflops:g}" for k in out.micro_kernels)
            out = replace(out, micro_kernels=after)
            done.append(Change(field, before, tuple(f"{k.dtype}.{k.shape}={k.gflops:g}" for k in after)))
            continue
        before = field_info(out, field).value
        if before != after:
            out = _set(out, field, after)
            done.append(Change(field, before, after))
    return out, tuple(done)


def _scaled_peaks(spec: DeviceSpec, ratio: float) -> dict[str, object]:
    changes: dict[str, object] = {f"peak_gflops.{d}": _round(v * ratio) for d, v in spec.peak_gflops}
    changes |= {f"tensor_core_gflops.{d}": _round(v * ratio) for d, v in spec.tensor_core_gflops}
    if spec.micro_kernels:
        changes["micro_kernels"] = tuple(replace(k, gflops=_round(k.gflops * ratio)) for k in spec.micro_kernels)
    return changes


def _isa_changes(spec: DeviceSpec, mcpu: str) -> dict[str, object]:
    """The fields an x86 CPU spec's ISA sets, moving from its target's mcpu to `mcpu`; none
    where either is not in X86_ISAS (another architecture, a GPU: the edit sets the name only)."""
    old, new = X86_ISAS.get(str(dict(spec.target).get("mcpu"))), X86_ISAS.get(mcpu)
    if not spec.runs_on_cpu or old is None or new is None or old == new:
        return {}
    old_mcpu = str(dict(spec.target).get("mcpu"))
    without = AMD_NO_FMA if spec.vendor == "amd" else 0.5
    fma = 1.0 if new.fma == old.fma else without if old.fma else 1 / without
    pipes = _fma_pipes(spec.fma_pipes, old_mcpu, mcpu, old, new)
    ratio = new.lanes * pipes / (old.lanes * spec.fma_pipes) * fma
    kept_back = spec.registers_per_unit - spec.registers_per_thread_cap  # registers a spec keeps from micro-kernels
    cap = max(1, new.registers - kept_back)
    changes: dict[str, object] = {"warp_size": new.lanes, "registers_per_unit": new.registers,
                                  "registers_per_thread_cap": cap}
    if pipes != spec.fma_pipes:
        changes["fma_pipes"] = pipes
    changes |= {k: v for k, v in _scaled_peaks(spec, ratio).items() if k != "micro_kernels"}
    top = spec.layers[0]
    if top.scope == "thread":  # the vector registers: their bytes, one register a transaction, operands per cycle
        vector = 4 * new.lanes
        changes[f"{top.name}.capacity_bytes"] = cap * vector
        changes[f"{top.name}.bandwidth_gbps"] = _round(top.bandwidth_gbps * ratio)
        if top.transaction_bytes == 4 * old.lanes:
            changes[f"{top.name}.transaction_bytes"] = vector
    if spec.micro_kernels:
        # A measured kernel becomes the one of the same rows x vectors at the new width: the same
        # accumulators, loads and broadcasts per FMA, so the same share of the FMA pipes (6x16 on
        # AVX2 is 6x8 on SSE4.2: twelve accumulators each), at the lanes' and FMA's ratio of its
        # flops; those whose accumulators no longer fit the registers are dropped.
        kernels = (replace(k, cols=k.cols * new.lanes // old.lanes, gflops=_round(k.gflops * ratio))
                   for k in spec.micro_kernels if k.cols * new.lanes % old.lanes == 0)
        changes["micro_kernels"] = tuple(k for k in kernels if k.vectors(new.lanes) <= new.registers)
    return changes


def _fma_pipes(pipes: int, old_mcpu: str, new_mcpu: str, old: Isa, new: Isa) -> int:
    """The FMA pipes of a core whose code moves from ISA `old` to `new`: the same, but on a core
    that runs its AVX-512 FMAs double-pumped (`DOUBLE_PUMPED`), narrower code issues on both
    halves, twice the pipes, and moving back to its AVX-512 halves them again."""
    if old_mcpu in DOUBLE_PUMPED and old.lanes == 16 and new.lanes < 16:
        return pipes * 2
    if new_mcpu in DOUBLE_PUMPED and new.lanes == 16 and old.lanes < 16:
        return max(1, pipes // 2)
    return pipes


def _round(value: float) -> float:
    """A derived rate to 6 significant digits: the TOML stays readable, the model unaffected."""
    return float(f"{value:.6g}")


def _layer_names(message: str, spec: DeviceSpec) -> str:
    """The loader's `layer[i].field` (and `layer[i]'s`) in a message as `NAME.field`, the way an
    edit names it."""
    return re.sub(r"layer\[(\d+)\](\.|'s)", lambda m: f"{spec.layers[int(m[1])].name}{m[2]}"
                  if int(m[1]) < len(spec.layers) else m[0], message.removeprefix("edited spec: "))
