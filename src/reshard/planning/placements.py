"""The placements: how one tensor is laid out over the ranks of one mesh dim. Pure: imports no
engine and no array library.

* ``Shard(d)``: split along dim ``d`` by the balanced rule; rank ``r`` holds piece ``r``.
* ``Replicate()``: every rank holds the whole tensor.
* ``Partial(op)``: every rank holds a tensor of the full shape; the logical tensor is the
  reduction (``op``) of all of them.
"""

from __future__ import annotations

import operator
from typing import Any

from ..errors import InvalidArgument

MAX_TENSOR_BYTES = 2**63 - 1  # numpy, torch and the plans count a tensor's bytes in a signed 64-bit int

REDUCE_OPS = ("sum", "avg", "max", "min")


class _Interned:
    """A placement made once per value: ``Shard(0) is Shard(0)``, so that a call written with
    new placement objects each time costs a dict lookup to make and an identity test to
    compare. Immutable, equal and hashed by value, pickled by value."""

    __slots__ = ("_key",)
    _made: dict[Any, Any]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    __delattr__ = __setattr__

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is type(self) and other._key == self._key)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), self._args()

    def _args(self) -> tuple[Any, ...]:
        return ()

    @classmethod
    def _make(cls, key: Any) -> Any:
        self = object.__new__(cls)
        object.__setattr__(self, "_key", key)
        if len(cls._made) < 4096:  # a bound for callers that make placements from unbounded values
            cls._made[key] = self
        return self


class Shard(_Interned):
    """Split along ``dim`` (negative counts from the end) by the balanced rule."""

    __slots__ = ()
    __match_args__ = ("dim",)
    _made: dict[int, Shard] = {}

    def __new__(cls, dim: int) -> Shard:
        if type(dim) is int:  # the common case first: bool and numpy ints go through check_int
            made = cls._made.get(dim)
            if made is not None:
                return made
        dim = check_int("Shard.dim", dim)
        return cls._made.get(dim) or cls._make(dim)

    @property
    def dim(self) -> int:
        return self._key

    def _args(self) -> tuple[int]:
        return (self._key,)

    def __repr__(self) -> str:
        return f"Shard({self._key})"


class Replicate(_Interned):
    """Every rank holds the whole tensor."""

    __slots__ = ()
    _made: dict[None, Replicate] = {}

    def __new__(cls) -> Replicate:
        return cls._made.get(None) or cls._make(None)

    def __repr__(self) -> str:
        return "Replicate()"


class Partial(_Interned):
    """Every rank holds a full-shape tensor; the logical tensor is their reduction by ``op``."""

    __slots__ = ()
    __match_args__ = ("op",)
    _made: dict[str, Partial] = {}

    def __new__(cls, op: str = "sum") -> Partial:
        made = cls._made.get(op) if isinstance(op, str) else None
        if made is not None:
            return made
        if op not in REDUCE_OPS:
            raise InvalidArgument(f"Partial op must be one of {REDUCE_OPS}, got {op!r}")
        return cls._make(op)

    @property
    def op(self) -> str:
        return self._key

    def _args(self) -> tuple[str]:
        return (self._key,)

    def __repr__(self) -> str:
        return "Partial()" if self._key == "sum" else f"Partial({self._key!r})"


Placement = Shard | Replicate | Partial

def check_int(name: str, value: Any) -> int:
    """Return ``value`` as an int if it is a true integer; bool, float and str are rejected."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise InvalidArgument(f"{name} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None


def normalize_dim(dim: Any, ndim: int, name: str = "dim") -> int:
    """Map ``dim`` in ``[-ndim, ndim)`` to ``[0, ndim)``; anything else is an InvalidArgument."""
    dim = check_int(name, dim)
    if ndim == 0:
        raise InvalidArgument(f"{name}={dim} needs a tensor with at least one dim, got a 0-d one")
    if not -ndim <= dim < ndim:
        raise InvalidArgument(f"{name}={dim} is out of range for a {ndim}-d tensor (valid: {-ndim}..{ndim - 1})")
    return dim % ndim
