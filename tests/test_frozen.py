"""`frozen.direct_init`: a frozen dataclass built by it is the value the dataclass builds."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, dataclass, field, replace

import pytest

from helpers import device, matmul

from workbench.construct.space import Action, Kind, Space
from workbench.frozen import direct_init, interned


@dataclass(frozen=True, order=True)
class Plain:
    a: int
    b: tuple = ()
    c: float = 0.5


@direct_init
@dataclass(frozen=True, order=True)
class Direct:
    a: int
    b: tuple = ()
    c: float = 0.5


def test_direct_init_builds_the_dataclass_value():
    for args, kwargs in (((1,), {}), ((1, (2, 3)), {}), ((1,), {"c": 2.0}), ((), {"a": 4, "b": (5,)})):
        plain, direct = Plain(*args, **kwargs), Direct(*args, **kwargs)
        assert (direct.a, direct.b, direct.c) == (plain.a, plain.b, plain.c)
        assert repr(direct) == repr(plain).replace("Plain", "Direct")
        assert hash(direct) == hash(Direct(*args, **kwargs)) and direct == Direct(*args, **kwargs)
    assert Direct(1) < Direct(2) and replace(Direct(1), c=3.0) == Direct(1, (), 3.0)
    assert pickle.loads(pickle.dumps(Direct(1, (2,)))) == Direct(1, (2,))
    with pytest.raises(FrozenInstanceError):
        Direct(1).a = 2
    with pytest.raises(TypeError):
        Direct()


def test_direct_init_runs_post_init():
    assert Action("grow", 0, 1, 16).kind is Kind.GROW  # `Action.__post_init__` reads the kind


def test_direct_init_refuses_fields_it_does_not_take():
    @dataclass(frozen=True)
    class Factory:
        a: tuple = field(default_factory=tuple)

    with pytest.raises(TypeError):
        direct_init(Factory)


def test_interned_returns_the_first_equal_object_with_the_same_extra():
    first, again = Plain(1, (2, 3)), Plain(1, (2, 3))
    assert again == first and again is not first
    assert interned(first, "x") is first
    assert interned(again, "x") is first
    assert interned(again, "y") is again  # what equality leaves out is kept apart
    assert interned(Plain(2), "x") == Plain(2)


def test_a_space_keys_its_caches_by_one_device_object():
    # a second construction on an equal spec loaded again (a notebook asking by name) finds the
    # memoised answers by identity, not by comparing the specs' trees; a spec whose provenance
    # differs keeps its own
    spec = device("tiny-cpu")
    again = replace(spec)
    assert again is not spec
    assert Space(matmul(64, 48, 32), again).device is Space(matmul(64, 48, 32), spec).device
    elsewhere = replace(spec, sources=(("name", "a test"),))
    assert Space(matmul(64, 48, 32), elsewhere).device.sources == (("name", "a test"),)
