"""Dynamic shapes (Vortex): the lower envelope is the dispatcher, the step curves the page draws
are the analyzer's prices at every value, and the figure draws what it is given."""

from __future__ import annotations

from functools import cache

import pytest
from helpers import TINY_CPU

from workbench import pipeline
from workbench.errors import UserError
from workbench.viz.dynamic import ENVELOPE, SAMPLES, MeasuredPoint, dynamic_figure, lower_envelope
from workbench.workload import Workload

MAX = 200  # small: every value 1..MAX is checked against the analyzer


@cache
def plan(op: str = "matmul") -> pipeline.VortexPlan:
    params = (("K", 64), ("M", "dyn"), ("N", 64)) if op == "matmul" else (("K", 256), ("M", "dyn"))
    return pipeline.vortex_plan(Workload(op=op, params=params), TINY_CPU, MAX)


def curves(p: pipeline.VortexPlan) -> dict[str, tuple[float, ...]]:
    return {k: row for (k, _), row in zip(p.table.kernels, p.curves)}


def test_lower_envelope_takes_the_least_time_and_the_first_kernel_on_a_tie():
    seconds, kernels = lower_envelope({"a": [3.0, 1.0, 2.0, 5.0], "b": [2.0, 4.0, 2.0, 1.0], "c": [9.0, 1.0, 7.0, 6.0]})
    assert seconds == [2.0, 1.0, 2.0, 1.0]
    assert kernels == ["b", "a", "a", "b"]  # value 1: a and c tie, value 2: a and b tie; a is listed first
    assert lower_envelope({}) == ([], [])


@pytest.mark.parametrize("op", ["matmul", "gemv"])
def test_the_envelope_is_what_the_dispatcher_picks_at_every_value(op):
    p = plan(op)
    seconds, kernels = lower_envelope(curves(p))
    ends = [*p.values[1:], MAX + 1]
    for start, end, kernel, time in zip(p.values, ends, kernels, seconds):
        for value in range(start, end):  # each step covers the values up to the next one
            assert pipeline.vortex_pick(p, value) == (kernel, pytest.approx(time, rel=1e-12)), (op, value)


def test_the_step_curves_are_each_kernels_price_at_every_value():
    p = plan()
    assert p.values[0] == 1 and p.values[-1] == MAX and list(p.values) == sorted(set(p.values))
    for (kernel, _), row in zip(p.table.kernels, p.curves):
        outer = p.outer(kernel)
        assert {outer, outer + 1} <= set(p.values)  # where its padded extent steps up
        steps = dict(zip(p.values, row))
        current = None
        for value in range(1, MAX + 1):
            current = steps.get(value, current)
            assert p.seconds(kernel, value) == current, (kernel, value)


def test_plan_and_pick_refuse_bad_input_in_one_line():
    with pytest.raises(UserError, match="one dynamic extent per workload, got K, M"):
        pipeline.vortex_plan(Workload(op="matmul", params=(("K", "dyn"), ("M", "dyn"), ("N", 8))), TINY_CPU, 64)
    with pytest.raises(UserError, match="no dynamic extent"):
        pipeline.vortex_plan(Workload(op="matmul", params=(("K", 8), ("M", 8), ("N", 8))), TINY_CPU, 64)
    with pytest.raises(UserError, match="positive integer, got 0"):
        pipeline.vortex_plan(Workload(op="gemv", params=(("K", 8), ("M", "dyn"))), TINY_CPU, 0)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UserError, match=f"M must be a positive integer, got {bad!r}"):
            pipeline.vortex_pick(plan(), bad)


def test_figure_draws_steps_the_envelope_samples_measured_runs_and_the_pick():
    times = {"k0": [1e-3, 2e-3, 4e-3], "k1": [3e-3, 3e-3, 3e-3]}
    measured = [MeasuredPoint(1, "k0", 1.5e-3, True), MeasuredPoint(150, "k1", None, False)]
    fig = dynamic_figure([1, 64, 129], times, "M", samples=(128, 160, 9999), measured=measured, picked=(100, "k0", 2e-3))
    by_name = {t.name: t for t in fig.data}
    for k in times:
        assert list(by_name[k].y) == times[k] and by_name[k].line.shape == "hv"
    envelope = by_name[ENVELOPE]
    assert list(envelope.y) == [1e-3, 2e-3, 3e-3] and list(envelope.customdata) == ["k0", "k0", "k1"]
    assert list(by_name[SAMPLES].x) == [128]  # 160 and 9999 lie beyond the last value drawn
    assert list(by_name[SAMPLES].y) == [2e-3]  # on the envelope's step from 64 to 128
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 1
    ok, wrong = by_name["measured"], by_name["measured: WRONG result"]
    assert list(ok.x) == [1] and list(ok.y) == [1.5e-3] and ok.marker.symbol == "circle"
    assert list(wrong.x) == [150] and list(wrong.y) == [3e-3] and wrong.marker.symbol == "x"
    star = by_name["picked at M=100: k0"]
    assert list(star.x) == [100] and list(star.y) == [2e-3] and star.marker.symbol == "star"
    assert ok.marker.color[0] == star.marker.color == by_name["k0"].line.color
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log" and fig.layout.xaxis.title.text == "M"


def test_figure_without_runs_or_pick_has_only_curves_envelope_and_samples():
    fig = dynamic_figure([1, 10], {"k0": [1e-6, 2e-6]}, "B", samples=(5,))
    assert [t.name for t in fig.data] == ["k0", ENVELOPE, SAMPLES]
