"""Cheaper frozen dataclasses: `hash_once` hashes the fields once per object, `direct_init`
builds one at half the cost.

Construction asks pure, memoised functions (`functools.lru_cache`) about the same expression,
device and program thousands of times; the key of each call hashes the whole frozen value, and
a `TensorExpr` or `DeviceSpec` is a tree of tuples and dataclasses that Python hashes afresh
every time. The hash of a frozen value never changes, so it is kept on the object after the
first call; equality is the dataclass's own, by value.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import lru_cache

_KEY = "_hash_once"


def hash_once(cls):
    """Decorate a frozen dataclass (above `@dataclass(frozen=True)`): its `__hash__` is the hash
    of the fields the dataclass would hash, computed on the first call and kept. The kept value
    is left out of pickles and copies' state, since a string's hash differs between processes
    (PYTHONHASHSEED): a worker computes its own."""
    names = tuple(f.name for f in fields(cls) if (f.compare if f.hash is None else f.hash))

    def __hash__(self) -> int:
        try:
            return self.__dict__[_KEY]
        except KeyError:
            value = hash(tuple([getattr(self, n) for n in names]))
            object.__setattr__(self, _KEY, value)
            return value

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop(_KEY, None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls


def interned(value, *extra):
    """The first-seen object equal to `value` with the same `extra` (among the last 256 asked
    about): the one object that a construction's memoised functions are keyed by. Their caches
    outlive a construction, and a key equal to a kept one but not the same object is compared
    field by field, a whole device spec's tree, at every hit: constructing a workload a second
    time in one process on a spec loaded again took 1.6x the first's time before the spec was
    interned here. `extra`: what equality leaves out but the caller keeps (a spec's `sources`),
    so that the object returned carries the caller's own."""
    return _interned(value, extra)


@lru_cache(maxsize=256)
def _interned(value, extra: tuple):
    return value  # the cache answers an equal (value, extra) with the value it kept first


def direct_init(cls):
    """Decorate a frozen dataclass (above `@dataclass(frozen=True)`): its `__init__` stores the
    fields straight into the new object's `__dict__`, where the dataclass's own sets them one
    call of `object.__setattr__` at a time (to get past the `__setattr__` that freezes it),
    about twice the cost: construction makes hundreds of thousands of actions, states, steps
    and graph nodes. The same parameters, defaults and `__post_init__`; equality, hashing,
    ordering, `repr` and pickling are the dataclass's. Fields with a default factory, or not
    in `__init__`, or keyword-only, it does not take (TypeError)."""
    params, stores, defaults = [], [], {}
    for f in fields(cls):
        if f.default_factory is not MISSING or not f.init or f.kw_only:
            raise TypeError(f"direct_init: {cls.__name__}.{f.name} is not a plain positional field")
        if f.default is MISSING:
            params.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        stores.append(f"    __direct_init_dict[{f.name!r}] = {f.name}\n")
    post = "    self.__post_init__()\n" if hasattr(cls, "__post_init__") else ""
    source = f"def __init__(self, {', '.join(params)}):\n    __direct_init_dict = self.__dict__\n{''.join(stores)}{post}"
    exec(source, defaults)  # as `dataclasses` itself writes `__init__`
    init = defaults["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls
