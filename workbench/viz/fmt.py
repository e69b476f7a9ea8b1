"""Number formats shared by the figures and the pages: bytes, seconds, tiles."""

from __future__ import annotations

from collections.abc import Sequence

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """`1536` -> `1.5 KiB` (binary prefixes: capacities in the specs are powers of two)."""
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def micros(seconds: float | None) -> str:
    """Seconds as microseconds with three significant figures; '-' for None."""
    return "-" if seconds is None else f"{seconds * 1e6:.3g} us"


def tile_text(axes: Sequence[str], tile: Sequence[int]) -> str:
    """`i=4, j=16, k=1`: a tile per axis."""
    return ", ".join(f"{a}={t}" for a, t in zip(axes, tile))


def shape_text(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"
