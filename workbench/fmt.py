"""Number formats shared by every layer that shows a quantity (the construction's notes, the model
reports, the figures, the pages, the widgets, the CLI): times, sizes, rates, tiles.

Every quantity is shown with its unit chosen by magnitude and three significant figures (a kernel
engineer compares times across six orders of magnitude: `107 ms` and `1.87 us`, never `107427.73`
in a column headed "us" or `1.97e+03 us`). Missing or non-finite values are shown as "-".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

FIGURES = 3  # significant figures of every shown quantity
MISSING = "-"
# (unit, seconds per unit), largest first: a time takes the largest unit it is at least 1 of.
TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# Decimal prefixes for counts and rates, as the specs and datasheets give them (GB/s, GFLOP/s).
_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0))


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def significant(value: float, figures: int = FIGURES) -> str:
    """`value` to `figures` significant figures, never in exponent form, without trailing zeros
    (1234.5 -> `1230`, 0.012345 -> `0.0123`, 2.0 -> `2`)."""
    if value == 0:
        return "0"
    digits = figures - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, digits)
    if rounded and math.floor(math.log10(abs(rounded))) != math.floor(math.log10(abs(value))):
        digits -= 1  # 9.996 rounds up to 10.0: one decimal fewer
    text = f"{rounded:.{max(0, digits)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def time_unit(seconds: float) -> tuple[str, float]:
    """(unit, seconds per unit) that shows `seconds` as 1 to 999 (ns for anything smaller)."""
    for unit, scale in TIME_UNITS:
        if abs(seconds) >= scale:
            return unit, scale
    return TIME_UNITS[-1]


def duration(seconds: float | None) -> str:
    """`0.00187` -> `1.87 ms`, `0.10742773` -> `107 ms`, `2.5e-8` -> `25 ns`; "-" when unknown."""
    if not _known(seconds):
        return MISSING
    unit, scale = time_unit(seconds)
    if abs(float(significant(seconds / scale))) >= 1000 and scale < TIME_UNITS[0][1]:
        unit, scale = time_unit(seconds * 1.001)  # 999.6 us rounds to 1000 us: show 1 ms
    return f"{significant(seconds / scale)} {unit}"


def table_time_unit(seconds: Iterable[float | None]) -> tuple[str, float]:
    """One unit for a column (or table) of times: the unit of their median, so most values read
    1 to 999 and the others stay plain numbers (`%.3g` without exponents in the dashboard)."""
    known = sorted(abs(s) for s in seconds if _known(s) and s)
    return time_unit(known[len(known) // 2]) if known else ("us", 1e-6)


def signed(value: float | None) -> str:
    """A correlation or score with its sign, two decimals (`+0.55`, `-0.07`); "-" when undefined."""
    return f"{value:+.2f}" if _known(value) else MISSING


def whole(n: int) -> str:
    """A count as it is (`2048`, `12544`: tile sizes and grids are exact) up to five digits, with
    a decimal prefix beyond (`1.25 M`)."""
    return str(n) if abs(n) < 100_000 else prefixed(n, "")


def human_bytes(n: float | None) -> str:
    """`2048` -> `2 KiB`, `1536` -> `1.5 KiB`, `100` -> `100 B` (binary prefixes: capacities in
    the specs are powers of two)."""
    if not _known(n):
        return MISSING
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{significant(value)} {_BYTE_UNITS[unit]}"


def prefixed(value: float | None, unit: str) -> str:
    """A count or rate with a decimal prefix: `prefixed(1.23e12, "FLOP/s")` -> `1.23 TFLOP/s`,
    `prefixed(2.5e10, "B/s")` -> `25 GB/s`, `prefixed(268435456, "FLOP")` -> `268 MFLOP`."""
    if not _known(value):
        return MISSING
    for prefix, scale in _PREFIXES:
        if abs(value) >= scale:
            return f"{significant(value / scale)} {prefix}{unit}"
    return f"{significant(value)} {unit}"


def gflops(value: float | None) -> str:
    """GFLOP/s given as GFLOP/s (the roofline's unit): `31.2` -> `31.2 GFLOP/s`, `1500` -> `1.5 TFLOP/s`."""
    return prefixed(None if value is None else value * 1e9, "FLOP/s")


def gbps(value: float | None) -> str:
    """GB/s given as GB/s: `25.6` -> `25.6 GB/s`, `2039` -> `2.04 TB/s`."""
    return prefixed(None if value is None else value * 1e9, "B/s")


def tile_text(axes: Sequence[str], tile: Sequence[int]) -> str:
    """`i=4, j=16, k=1`: a tile per axis."""
    return ", ".join(f"{a}={t}" for a, t in zip(axes, tile))


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def time_columns(rows: Sequence[dict], suffix: str = " us") -> tuple[list[dict], tuple[str, ...]]:
    """`rows` with every column named `<what> us` (microseconds, as `pipeline.candidate_rows`
    gives them) rescaled to one unit for the whole table, the unit of the columns' median time
    (`table_time_unit`), and renamed `<what> (<unit>)`; and the renamed columns, in order."""
    timed = [k for k in dict.fromkeys(k for r in rows for k in r) if k.endswith(suffix)]
    unit, scale = table_time_unit(r[k] * 1e-6 for r in rows for k in timed if r.get(k) is not None)
    names = {k: f"{k[: -len(suffix)]} ({unit})" for k in timed}
    out = [{names.get(k, k): (v * 1e-6 / scale if k in names and v is not None else v) for k, v in r.items()} for r in rows]
    return out, tuple(names.values())


def estimate_parts(estimate) -> tuple[str, str]:
    """An `Estimate`'s measured and modelled parts (Vortex's hybrid analyzer: `Estimate.measured`,
    `.modelled`, a phrase each) as two texts, the phrases joined by "; ", or words saying so where
    a list is empty (nothing is measured on a spec that was never calibrated)."""
    measured = "; ".join(estimate.measured) or "nothing (the device spec is not calibrated)"
    modelled = "; ".join(estimate.modelled) or "nothing"
    return measured, modelled


def micro_kernel_grid(kernels: Sequence, dtype: str) -> list[dict]:
    """The measured micro-kernels of `dtype` (`MicroKernel`s: rows, cols, gflops) as a grid: a
    row per row count, a column per column count (`16 cols`), GFLOP/s with three figures in each
    cell, "-" where that shape was not measured."""
    mine = [k for k in kernels if k.dtype == dtype]
    measured = {(k.rows, k.cols): k.gflops for k in mine}
    columns = sorted({k.cols for k in mine})
    def cell(rows: int, cols: int) -> str:
        return significant(measured[rows, cols]) if (rows, cols) in measured else MISSING

    return [{"rows": rows, **{f"{cols} cols": cell(rows, cols) for cols in columns}} for rows in sorted({k.rows for k in mine})]


def progress_text(event) -> str:
    """A profile session's `ProgressEvent` in a line: `measure 3/10: #4 107 ms` (the measured time
    in its unit), or the event's own message (`built`, `wrong result: ...`)."""
    m = event.measurement
    outcome = duration(m.best_seconds) if m is not None and m.ok else event.message
    return f"{event.phase} {event.done}/{event.total}: #{event.rank} {outcome}"


def target_text(target: str) -> str:
    """A TVM target given as JSON (`Kernel.target`) in words: `{"kind": "llvm", "mcpu": "haswell"}`
    -> `llvm, mcpu haswell` (no dictionary text in the pages)."""
    try:
        fields = json.loads(target)
    except ValueError:
        return target
    if not isinstance(fields, dict):
        return str(fields)
    kind = fields.pop("kind", "")
    words = [f"{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in fields.items()]
    return ", ".join([str(kind)] * bool(kind) + words)
