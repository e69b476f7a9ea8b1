"""Shape validation shared by the catalog, the expression language and the CLI's `--shape`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from math import prod

from workbench.errors import UserError

# TVM indexes buffers with int32 unless told otherwise, so a tensor with more elements than the
# largest int32 would wrap its flat index.
MAX_ELEMENTS = 2**31 - 1
# Floating types only: the references are computed in numpy float64 and the operators divide
# (avgpool, reduce_mean) or call transcendental functions (gelu, expressions).
DTYPES = ("float16", "float32", "float64")

_INT = re.compile(r"[0-9]+")
_INTS = re.compile(r"[0-9]+(x[0-9]+)+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_elements(name: str, shape: Sequence[int]) -> None:
    """Refuse a tensor whose element count TVM's int32 indexing cannot address."""
    count = prod(shape)
    if count > MAX_ELEMENTS:
        dims = "x".join(str(d) for d in shape)
        raise UserError(
            f"tensor {name} has shape {dims} = {count} elements, over the limit of {MAX_ELEMENTS} (int32 indexing)"
        )


def check_dtype(dtype: str) -> None:
    """Refuse a dtype the operators and references do not support."""
    if dtype not in DTYPES:
        raise UserError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")


def parse_kv(text: str) -> dict[str, int | tuple[int, ...] | bool]:
    """Parse `--shape K=V,K=V`: V is a non-negative integer, `AxBxC` (a tuple) or true/false.

    Zero is let through here because some parameters take it (pad=0, axes=0); the catalog and
    the expression language say which must be positive.
    """
    out: dict[str, int | tuple[int, ...] | bool] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise UserError(f"--shape: empty entry in {text!r}; write K=V,K=V")
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not _NAME.fullmatch(key):
            raise UserError(f"--shape: {item!r} is not of the form NAME=VALUE")
        if key in out:
            raise UserError(f"--shape: {key} is given twice")
        out[key] = _parse_value(item, key, value)
    return out


def _parse_value(item: str, key: str, value: str) -> int | tuple[int, ...] | bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if _INT.fullmatch(value):
        return _int(item, key, value)
    if _INTS.fullmatch(value):
        return tuple(_int(item, key, v) for v in value.split("x"))
    if re.fullmatch(r"-[0-9]+", value):
        raise UserError(f"--shape: {item!r}: {key} must be a positive integer")
    raise UserError(f"--shape: {item!r}: {key} must be an integer, a list AxBxC or true/false")


def _int(item: str, key: str, digits: str) -> int:
    # Python refuses to convert more than 4300 digits; far fewer already exceed every limit here.
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(MAX_ELEMENTS)):
        shown = item if len(item) <= 40 else item[:37] + "..."
        raise UserError(f"--shape: {shown!r}: {key} is too large (at most {MAX_ELEMENTS})")
    return int(digits)
