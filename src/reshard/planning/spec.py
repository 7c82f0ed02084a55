"""Layouts beyond one placement per mesh dim: the order in which mesh dims split a tensor dim
(``Layout``, ``with_order``) and ``rs.Spec``, a layout by tensor dim with JAX's
``PartitionSpec`` meaning; how such a layout is printed and read. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from .placements import REDUCE_OPS, Partial, Placement, Replicate, Shard, check_int, normalize_dim


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


def without_unit_dims(layout: Sequence[Placement], mesh_shape: Sequence[int]) -> tuple[Placement, ...]:
    """``layout`` with Replicate on every mesh dim of one rank, and those dims out of its split orders."""
    if all(k > 1 for k in mesh_shape):
        return layout
    placements = [Replicate() if mesh_shape[m] == 1 else p for m, p in enumerate(layout)]
    order = [(d, tuple(m for m in dims if mesh_shape[m] > 1)) for d, dims in orders_of(layout)]
    return with_order(placements, order)


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
                raise InvalidArgument(f"Spec names mesh dim {key}, but the mesh has {ndim} dim{'' if ndim == 1 else 's'}"
                                      + (" (a world of ranks is a 1-D mesh)" if ndim == 1 else ""))
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
            if not all(isinstance(p, (Shard, Replicate, Partial)) for p in other):
                return NotImplemented
            return self.resolve(len(other)) == other
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


def layout_text(placements: Sequence[Placement]) -> str:
    """How a layout is printed: its placements in parentheses, or its Spec where an order is
    not the mesh's."""
    if orders_of(placements):
        return repr(spec_of(placements))
    return "(" + ", ".join(map(repr, placements)) + ("," if len(placements) == 1 else "") + ")"




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
