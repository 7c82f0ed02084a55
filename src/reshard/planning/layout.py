"""Placements and the balanced sharding rule. Pure: imports no engine and no array library.

A *placement* says how one tensor is laid out over the ``size`` ranks of a communicator:

* ``Shard(d)``: split along dim ``d`` by the balanced rule; rank ``r`` holds piece ``r``.
* ``Replicate()``: every rank holds the whole tensor.
* ``Partial(op)``: every rank holds a tensor of the full shape; the logical tensor is the
  reduction (``op``) of all of them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument

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


class Layout(tuple):
    """One placement per mesh dim, with an order other than the mesh's in which two or more mesh
    dims split a tensor dim: ``order`` pairs (tensor dim, mesh dims outermost first), ascending by
    tensor dim. Made by ``with_order``, which gives a plain tuple where every order is the mesh's;
    so a layout in the default order IS its placements tuple. Printed as the ``Spec`` it is."""

    order: tuple[tuple[int, tuple[int, ...]], ...]  # in the instance's dict: a tuple subclass has no slots

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Layout):
            return tuple.__eq__(self, other) and self.order == other.order
        if isinstance(other, tuple):
            return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((tuple(self), self.order))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return with_order, (tuple(self), self.order)

    def __repr__(self) -> str:
        return repr(spec_of(self))


def split_by(placements: Sequence[Placement], dim: int) -> tuple[int, ...]:
    """The mesh dims that split tensor dim ``dim`` (counted from the front), outermost first."""
    if type(placements) is Layout:
        for d, dims in placements.order:
            if d == dim:
                return dims
    return tuple(m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == dim)


def orders_of(placements: Sequence[Placement]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The non-default orders of ``placements`` (empty for a plain tuple)."""
    return placements.order if type(placements) is Layout else ()


def with_order(placements: Sequence[Placement], order: Any = ()) -> tuple[Placement, ...]:
    """``placements`` with the tensor dims' split orders ``order`` ((dim, mesh dims outermost
    first) pairs, or a dict): a plain tuple where each order is the mesh's, else a ``Layout``.
    Each order must list exactly the mesh dims whose placement is ``Shard(dim)``."""
    placements = tuple(placements)
    items = sorted((order.items() if isinstance(order, dict) else order), key=lambda kv: kv[0])
    kept = []
    for d, dims in items:
        dims = tuple(int(m) for m in dims)
        plain = tuple(m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == d)
        if sorted(dims) != list(plain) or len(set(dims)) != len(dims):
            raise InvalidArgument(f"tensor dim {d} is split by mesh dims {list(plain)}, not by {list(dims)}")
        if dims != plain:
            kept.append((int(d), dims))
    if not kept:
        return placements
    out = Layout(placements)
    out.order = tuple(kept)
    return out


def map_placements(placements: Sequence[Placement], fn: Any) -> tuple[Placement, ...]:
    """``fn`` applied to each placement, the split orders kept (``fn`` must not change which
    tensor dim a Shard splits except by counting it from the front)."""
    out = tuple(fn(p) for p in placements)
    order = orders_of(placements)
    return with_order(out, order) if order else out


def normalize_placements(placements: Sequence[Placement], ndim: int, name: str = "Shard dim") -> tuple[Placement, ...]:
    """``placements`` with each Shard's dim counted from the front (orders kept)."""
    return map_placements(placements, lambda p: Shard(normalize_dim(p.dim, ndim, name)) if isinstance(p, Shard) else p)


class Spec:
    """A layout by tensor dim, JAX's ``PartitionSpec`` meaning: for each tensor dim, ``None`` or
    the mesh dims that split it, outermost first, by name (where a ``Mesh`` is given) or number.

    ``Spec(("b", "a"), None)`` on a 2x2 mesh (a, b): rows split by b, then each half by a, so the
    device at (a, b) = (0, 1) holds rows 4-5 of 8 (``Spec(("a", "b"), None)`` gives it rows 2-3).
    ``partial``: the mesh dims whose ranks hold values to be reduced, as one dim, a sequence
    (``"sum"``) or a dict of dim -> op. Mesh dims named nowhere replicate.

    Interchangeable with placements: ``Spec(("a", "b"), None)`` on a mesh (a, b) is
    ``(Shard(0), Shard(0))``; a Spec by numbers in the default order equals the placements tuple
    it resolves to and hashes as the one on the smallest mesh it names
    (``Spec(0, 1) == (Shard(0), Shard(1))``). ``resolve(mesh)`` gives the placements (a plain
    tuple, or a ``Layout`` carrying a non-default order).
    """

    __slots__ = ("entries", "partial")

    def __init__(self, *entries: Any, partial: Any = None) -> None:
        canon = []
        for i, e in enumerate(entries):
            if e is None:
                canon.append(())
            elif isinstance(e, (tuple, list)):
                canon.append(tuple(_mesh_dim_key(f"Spec entry {i}", v) for v in e))
            else:
                canon.append((_mesh_dim_key(f"Spec entry {i}", e),))
        while canon and not canon[-1]:
            canon.pop()
        if partial is None:
            part: tuple[tuple[Any, str], ...] = ()
        elif isinstance(partial, dict):
            part = tuple((_mesh_dim_key("partial", k), str(v)) for k, v in partial.items())
        elif isinstance(partial, (tuple, list)):
            part = tuple((_mesh_dim_key("partial", k), "sum") for k in partial)
        else:
            part = ((_mesh_dim_key("partial", partial), "sum"),)
        for _, op in part:
            if op not in REDUCE_OPS:
                raise InvalidArgument(f"Spec partial op must be one of {REDUCE_OPS}, got {op!r}")
        named = [k for e in canon for k in e] + [k for k, _ in part]
        dup = sorted({repr(k) for k in named if named.count(k) > 1})
        if dup:
            raise InvalidArgument(f"Spec names mesh dim {', '.join(dup)} more than once; each mesh dim splits one tensor dim")
        object.__setattr__(self, "entries", tuple(canon))
        object.__setattr__(self, "partial", tuple(sorted(part, key=repr)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Spec is immutable")

    def resolve(self, mesh: Any = None, names: Sequence[str] | None = None) -> tuple[Placement, ...]:
        """The placements on a mesh: ``mesh`` an ``rs.Mesh``, a mesh shape or a number of mesh
        dims (None: the smallest mesh the Spec names, by number); ``names`` the mesh dims' names
        where ``mesh`` is not a Mesh."""
        if hasattr(mesh, "shape") and hasattr(mesh, "names"):
            ndim, names = len(mesh.shape), tuple(mesh.names)
        elif mesh is None:
            ndim = self._smallest()
        elif isinstance(mesh, (tuple, list)):
            ndim = len(mesh)
        else:
            ndim = check_int("mesh dims", mesh)

        def number(key: Any) -> int:
            if isinstance(key, str):
                if names is None or key not in names:
                    where = f"the mesh's dims are {list(names)}" if names is not None else "no mesh names its dims here"
                    raise InvalidArgument(f"Spec names mesh dim {key!r}, but {where}; use mesh dim numbers or an rs.Mesh")
                return list(names).index(key)
            if not 0 <= key < ndim:
                raise InvalidArgument(f"Spec names mesh dim {key}, but the mesh has {ndim} dims")
            return key

        out: list[Placement] = [Replicate()] * ndim
        order = []
        for d, dims in enumerate(self.entries):
            ms = tuple(number(k) for k in dims)
            for m in ms:
                out[m] = Shard(d)
            if len(ms) > 1:
                order.append((d, ms))
        for k, op in self.partial:
            out[number(k)] = Partial(op)
        return with_order(out, order)

    def _smallest(self) -> int:
        keys = [k for e in self.entries for k in e] + [k for k, _ in self.partial]
        if any(isinstance(k, str) for k in keys):
            raise InvalidArgument(f"{self!r} names mesh dims by name: resolve it on an rs.Mesh or with names=")
        return max(keys, default=0) + 1

    def _by_number(self) -> bool:
        return not any(isinstance(k, str) for e in self.entries for k in e) and \
            not any(isinstance(k, str) for k, _ in self.partial)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Spec):
            return self.entries == other.entries and self.partial == other.partial
        if isinstance(other, tuple) and self._by_number() and len(other) >= self._smallest():
            try:
                return self.resolve(len(other)) == parse_placements(other)
            except InvalidArgument:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        if self._by_number():
            return hash(self.resolve())
        return hash(("Spec", self.entries, self.partial))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _spec_from, (self.entries, self.partial)

    def __repr__(self) -> str:
        def one(e: tuple) -> str:
            if not e:
                return "None"
            return repr(e[0]) if len(e) == 1 else "(" + ", ".join(map(repr, e)) + ")"

        parts = [one(e) for e in self.entries]
        if self.partial:
            ops = {op for _, op in self.partial}
            keys = [k for k, _ in self.partial]
            if ops == {"sum"}:
                parts.append("partial=" + (repr(keys[0]) if len(keys) == 1 else repr(tuple(keys))))
            else:
                parts.append("partial={" + ", ".join(f"{k!r}: {op!r}" for k, op in self.partial) + "}")
        return "Spec(" + ", ".join(parts) + ")"


def _spec_from(entries: tuple, partial: tuple) -> Spec:
    return Spec(*entries, partial=dict(partial) if partial else None)


def _mesh_dim_key(where: str, value: Any) -> Any:
    if isinstance(value, str):
        return value
    try:
        m = check_int(where, value)
    except InvalidArgument:
        raise InvalidArgument(f"{where}: a mesh dim is a name or a number, got {value!r}") from None
    if m < 0:
        raise InvalidArgument(f"{where}: mesh dim numbers start at 0, got {m}")
    return m


def spec_of(placements: Sequence[Placement]) -> Spec:
    """The ``Spec`` (by mesh dim number) of one placement per mesh dim, orders included."""
    orders = dict(orders_of(placements))
    ndim = max((p.dim + 1 for p in placements if isinstance(p, Shard) and p.dim >= 0), default=0)
    entries: list[Any] = []
    for d in range(ndim):
        dims = orders.get(d) or tuple(m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == d)
        entries.append(None if not dims else dims[0] if len(dims) == 1 else dims)
    partial = {m: p.op for m, p in enumerate(placements) if isinstance(p, Partial)}
    return Spec(*entries, partial=partial or None)


def layout_text(placements: Sequence[Placement], parens: bool = True) -> str:
    """How a layout is printed: its placements (in parentheses unless ``parens`` is False), or
    its Spec where an order is not the mesh's."""
    if orders_of(placements):
        return repr(spec_of(placements))
    if not parens:
        return ", ".join(map(repr, placements))
    return "(" + ", ".join(map(repr, placements)) + ("," if len(placements) == 1 else "") + ")"


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


def shard_sizes(length: int, parts: int) -> list[int]:
    """Balanced split of ``length`` into ``parts``: the first ``length % parts`` get one more.

    >>> shard_sizes(7, 3)
    [3, 2, 2]
    >>> shard_sizes(2, 4)
    [1, 1, 0, 0]
    """
    length = check_int("length", length)
    parts = check_int("parts", parts)
    if length < 0:
        raise InvalidArgument(f"length must be >= 0, got {length}")
    if parts < 1:
        raise InvalidArgument(f"parts must be >= 1, got {parts}")
    base, extra = divmod(length, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def offsets(sizes: Sequence[int]) -> list[int]:
    """Start offset of each piece: the exclusive prefix sum of ``sizes``."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


def split_sizes(length: int, parts: int, rule: str = "balanced") -> list[int]:
    """Piece sizes under ``rule``: ``balanced`` (the first ``length % parts`` get one more) or
    ``chunk`` (torch.chunk's, which PyTorch DTensor uses: pieces of ``ceil(length / parts)``,
    the last ones shorter or empty)."""
    if rule == "balanced":
        return shard_sizes(length, parts)
    step = -(-length // parts) if parts else 0
    return [max(0, min(step, length - i * step)) for i in range(parts)]


def shard_range(length: int, parts: int, index: int, rule: str = "balanced") -> tuple[int, int]:
    """``[start, stop)`` of piece ``index`` under ``rule`` (O(1): no list of sizes)."""
    if rule == "chunk":
        step = -(-length // parts)
        start = min(length, index * step)
        return start, min(length, start + step)
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def local_shape(global_shape: Sequence[int], placement: Placement, rank: int, size: int) -> tuple[int, ...]:
    """Shape of what ``rank`` holds of a tensor of ``global_shape`` under ``placement``."""
    shape = list(global_shape)
    if isinstance(placement, Shard):
        d = normalize_dim(placement.dim, len(shape), "Shard.dim")
        shape[d] = shard_sizes(shape[d], size)[rank]
    return tuple(shape)


def local_region(global_shape: Sequence[int], placement: Placement, rank: int, size: int) -> tuple[tuple[int, int], ...]:
    """Per dim ``[start, stop)`` of the global region that ``rank`` holds under ``placement``."""
    region = [(0, n) for n in global_shape]
    if isinstance(placement, Shard):
        d = normalize_dim(placement.dim, len(region), "Shard.dim")
        region[d] = shard_range(global_shape[d], size, rank)
    return tuple(region)


def _zeros_like(full: Any) -> Any:
    module = type(full).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.zeros_like(full)
    import numpy as np

    return np.zeros_like(full)


def parse_placements(spec: Any, mesh_ndim: int | None = None, names: Sequence[str] | None = None) -> tuple[Placement, ...]:
    """One placement per mesh dim, from a sequence of placements, a ``Spec`` (resolved on a mesh
    of ``mesh_ndim`` dims named ``names``; None: the smallest it names) or text such as
    ``"S(0),S(1)"`` or ``"Spec((1, 0), None)"`` (torch's ``Shard``/``Replicate``/``Partial`` are
    read too)."""
    if isinstance(spec, str) and _SPEC_RE.match(spec):
        return parse_spec(spec).resolve(mesh_ndim, names)
    if isinstance(spec, str):
        parts = [p for p in re.split(r",(?![^(]*\))", spec) if p.strip()]
        return tuple(parse_placement(p) for p in parts)
    if isinstance(spec, (Shard, Replicate, Partial)):
        return (spec,)
    if type(spec) is Layout:
        return spec
    if isinstance(spec, Spec):
        return spec.resolve(mesh_ndim, names)
    try:
        items = list(spec)
    except TypeError:
        raise InvalidArgument(f"placements must be a sequence with one placement per mesh dim, got {spec!r}") from None
    return tuple(parse_placement(_from_torch(p)) for p in items)


def _from_torch(p: Any) -> Any:
    """torch.distributed.tensor's Shard/Replicate/Partial as ours (by name: no torch import)."""
    kind = type(p).__name__
    if type(p).__module__.startswith("torch.") and kind in ("Shard", "Replicate", "Partial"):
        if kind == "Shard":
            return Shard(int(p.dim))
        if kind == "Replicate":
            return Replicate()
        return Partial(str(getattr(p, "reduce_op", "sum")))
    return p



def unravel(rank: int, shape: Sequence[int]) -> tuple[int, ...]:
    """``rank``'s coordinate on a row-major mesh of ``shape`` (as ``np.unravel_index``)."""
    coord = []
    for size in reversed(shape):
        rank, c = divmod(rank, int(size))
        coord.append(c)
    return tuple(reversed(coord))


def ravel(coord: Sequence[int], shape: Sequence[int]) -> int:
    """The rank at ``coord`` of a row-major mesh of ``shape`` (as ``np.ravel_multi_index``)."""
    rank = 0
    for c, size in zip(coord, shape):
        rank = rank * int(size) + int(c)
    return rank


def mesh_region(global_shape: Sequence[int], placements: Sequence[Placement], coord: Sequence[int],
                mesh_shape: Sequence[int], rule: str = "balanced") -> tuple[tuple[int, int], ...]:
    """Per dim ``[start, stop)`` of what the rank at ``coord`` of a mesh holds.

    A tensor dim sharded by several mesh dims is split by the outermost first, then each piece
    by the next, each split by the balanced rule: the earlier mesh dim first (DTensor's default
    order) unless the layout gives another order (a ``Layout``, from a ``Spec``). Replicate and
    Partial mesh dims do not cut.
    """
    region = [(0, int(n)) for n in global_shape]
    orders = dict(orders_of(placements))
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            d = normalize_dim(p.dim, len(region), "Shard.dim")
            if d in orders:
                continue
            start, stop = region[d]
            a, b = shard_range(stop - start, int(mesh_shape[m]), int(coord[m]), rule)
            region[d] = (start + a, start + b)
    for d, dims in orders.items():
        start, stop = region[d]
        for m in dims:
            a, b = shard_range(stop - start, int(mesh_shape[m]), int(coord[m]), rule)
            start, stop = start + a, start + b
        region[d] = (start, stop)
    return tuple(region)


def global_shape_of(shapes: Sequence[Sequence[int]], placements: Sequence[Placement], mesh_shape: Sequence[int],
                    rule: str = "balanced") -> tuple[tuple[int, ...], int | None]:
    """The global shape whose pieces under ``placements`` are every rank's ``shapes[r]`` (rank
    order on a row-major mesh), and the first rank whose piece does not follow ``rule`` (None
    where every rank's does). Along a sharded dim the length is the sum over the ranks at
    coordinate 0 of every mesh dim that does not split it."""
    ndim = len(shapes[0])
    coords = [unravel(r, mesh_shape) for r in range(len(shapes))]
    gshape = [int(v) for v in shapes[0]]
    for d in range(ndim):
        dims = [m for m, p in enumerate(placements) if isinstance(p, Shard) and normalize_dim(p.dim, ndim, "Shard.dim") == d]
        if dims:
            gshape[d] = sum(int(shape[d]) for shape, coord in zip(shapes, coords)
                            if all(coord[m] == 0 for m in range(len(mesh_shape)) if m not in dims))
    for r, (shape, coord) in enumerate(zip(shapes, coords)):
        want = tuple(b - a for a, b in mesh_region(gshape, placements, coord, mesh_shape, rule))
        if tuple(int(v) for v in shape) != want:
            return tuple(gshape), r
    return tuple(gshape), None


def local_shard(full: Any, placement: Any, rank: Any, size: Any) -> Any:
    """What a rank holds of ``full`` (numpy array or torch tensor) under ``placement``.

    1-D world: ``local_shard(full, placement, rank, size)``. On a mesh:
    ``local_shard(full, placements, coord, mesh_shape)``, one placement per mesh dim, or a
    ``Spec`` by mesh dim number (a tensor dim split by several mesh dims in its order).

    ``Shard(d)``: a view of ``full`` sliced along ``d`` by the balanced rule (nested on a mesh,
    earlier mesh dims first). ``Replicate()``: no cut. ``Partial(op)``: for ``sum``, the rank at
    coordinate 0 of that mesh dim holds the values and the others zeros (they sum to ``full``);
    for ``avg``, ``max`` and ``min`` every rank holds them.
    """
    if isinstance(placement, (tuple, list, Spec)) or isinstance(size, (tuple, list)) or isinstance(rank, (tuple, list)):
        return _local_shard_mesh(full, placement, rank, size)
    rank = check_int("rank", rank)
    size = check_int("size", size)
    if size < 1 or not 0 <= rank < size:
        raise InvalidArgument(f"rank must be in [0, size), got rank={rank}, size={size}")
    placement = parse_placement(placement)
    if isinstance(placement, Shard):
        d = normalize_dim(placement.dim, full.ndim, "Shard.dim")
        start, stop = shard_range(full.shape[d], size, rank)
        return full[(slice(None),) * d + (slice(start, stop),)]
    if isinstance(placement, Partial) and placement.op == "sum" and rank != 0:
        return _zeros_like(full)
    return full


def _local_shard_mesh(full: Any, placements: Any, coord: Any, mesh_shape: Any) -> Any:
    try:
        coord = tuple(check_int(f"coord[{i}]", c) for i, c in enumerate(coord))
        mesh_shape = tuple(check_int(f"mesh_shape[{i}]", s) for i, s in enumerate(mesh_shape))
    except TypeError:
        raise InvalidArgument(f"on a mesh, coord and mesh_shape are sequences, got {coord!r} and {mesh_shape!r}") from None
    placements = parse_placements(placements, len(mesh_shape))
    if not len(placements) == len(coord) == len(mesh_shape):
        raise InvalidArgument(f"{len(placements)} placements, coordinate {list(coord)} and mesh shape {list(mesh_shape)} "
                              "must have one entry per mesh dim")
    if any(s < 1 for s in mesh_shape) or any(not 0 <= c < s for c, s in zip(coord, mesh_shape)):
        raise InvalidArgument(f"coordinate {list(coord)} is not on a mesh of shape {list(mesh_shape)}")
    region = mesh_region(full.shape, placements, coord, mesh_shape)
    view = full[tuple(slice(a, b) for a, b in region)]
    zero = any(isinstance(p, Partial) and p.op == "sum" and c != 0 for p, c in zip(placements, coord))
    return _zeros_like(view) if zero else view


_SPEC_RE = re.compile(r"^\s*Spec\s*\(", re.IGNORECASE)


def parse_spec(text: str) -> Spec:
    """A ``Spec`` from its printed form, e.g. ``"Spec((1, 0), None)"`` or
    ``"Spec(('b', 'a'), None, partial=2)"``: literals only, nothing is evaluated."""
    import ast

    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.lower() == "spec"):
            raise ValueError
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        if set(kwargs) - {"partial"}:
            raise ValueError
    except (SyntaxError, ValueError):
        raise InvalidArgument(f"cannot read {text!r}: write a Spec as Spec((1, 0), None) or Spec(0, 1, partial=2), "
                              "one entry per tensor dim") from None
    return Spec(*args, **kwargs)


_SHARD_RE = re.compile(r"^\s*(?:Shard|S)\s*\(\s*(-?\d+)\s*\)\s*$", re.IGNORECASE)
_PARTIAL_RE = re.compile(r"^\s*(?:Partial|P)\s*\(\s*(?:op\s*=\s*)?['\"]?(\w*)['\"]?\s*\)\s*$", re.IGNORECASE)


def parse_placement(spec: Any) -> Placement:
    """A placement from itself or from text: ``Shard(1)``, ``row``/``rows`` (Shard(0)),
    ``col``/``cols`` (Shard(1)), ``replicate``/``Replicate()``, ``partial``/``Partial(max)``."""
    if isinstance(spec, (Shard, Replicate, Partial)):
        return spec
    if not isinstance(spec, str):
        raise InvalidArgument(f"a placement must be Shard(d), Replicate() or Partial(op), got {spec!r}")
    text = spec.strip()
    lowered = text.lower()
    if lowered in ("row", "rows"):
        return Shard(0)
    if lowered in ("col", "cols", "column", "columns"):
        return Shard(1)
    if lowered in ("replicate", "replicate()", "r"):
        return Replicate()
    if lowered in ("partial", "p"):
        return Partial()
    if m := _SHARD_RE.match(text):
        return Shard(int(m.group(1)))
    if m := _PARTIAL_RE.match(text):
        return Partial(m.group(1) or "sum")
    raise InvalidArgument(
        f"cannot read placement {spec!r}: use row, col, replicate, partial, Shard(d) or Partial(op)"
    )
