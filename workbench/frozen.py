"""`hash_once`: a frozen dataclass that hashes its fields once per object.

Construction asks pure, memoised functions (`functools.lru_cache`) about the same expression,
device and program thousands of times; the key of each call hashes the whole frozen value, and
a `TensorExpr` or `DeviceSpec` is a tree of tuples and dataclasses that Python hashes afresh
every time. The hash of a frozen value never changes, so it is kept on the object after the
first call; equality is the dataclass's own, by value.
"""

from __future__ import annotations

from dataclasses import fields

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
            value = hash(tuple(getattr(self, n) for n in names))
            object.__setattr__(self, _KEY, value)
            return value

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop(_KEY, None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls
