"""Helpers every template shares, against closed forms and brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.codegen.common import _tile_is_box


def _brute_force_box(tile: int, extents: list[int]) -> bool:
    """Enumerate the t-aligned intervals (the last one cut at the end) and compare each with the
    box its mixed-radix digits span."""
    total = 1
    for e in extents:
        total *= e

    def digits(x):
        out = []
        for e in reversed(extents):
            out.append(x % e)
            x //= e
        return out[::-1]

    for start in range(0, total, tile):
        first, last = digits(start), digits(min(start + tile, total) - 1)
        # the box the interval spans: digits above the first that differs fixed, that one a
        # range, those below it whole; at least the interval's length, equal only for a box
        box = 1
        k = next((d for d in range(len(extents)) if first[d] != last[d]), len(extents))
        for d in range(len(extents)):
            box *= 1 if d < k else (last[d] - first[d] + 1 if d == k else extents[d])
        if box != min(start + tile, total) - start:
            return False
    return True


def test_a_tile_of_fused_rows_is_a_box_on_whole_rows_or_within_a_row():
    assert not _tile_is_box(12, [3, 7])  # rows 7-13 straddle two rows of 7
    assert _tile_is_box(14, [3, 7]) and _tile_is_box(7, [3, 7]) and _tile_is_box(1, [3, 7])
    assert _tile_is_box(16, [5, 4, 4])  # whole 4 x 4 planes
    assert not _tile_is_box(8, [3, 3, 4])  # two rows of 4 straddle a 3 x 4 plane


@settings(max_examples=400)
@given(st.integers(1, 40), st.lists(st.integers(1, 9), min_size=1, max_size=3))
def test_the_closed_form_agrees_with_enumeration(tile, extents):
    assert _tile_is_box(tile, extents) == _brute_force_box(tile, extents)
