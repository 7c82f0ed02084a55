"""Placements and the balanced sharding rule. Pure: imports no engine and no array library.

A *placement* says how one tensor is laid out over the ``size`` ranks of a communicator:

* ``Shard(d)``: split along dim ``d`` by the balanced rule; rank ``r`` holds piece ``r``.
* ``Replicate()``: every rank holds the whole tensor.
* ``Partial(op)``: every rank holds a tensor of the full shape; the logical tensor is the
  reduction (``op``) of all of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from .placements import REDUCE_OPS, Partial, Placement, Replicate, Shard, check_int, normalize_dim
from .spec import (
    Layout,
    Spec,
    map_placements,
    normalize_placements,
    orders_of,
    parse_spec,
    spec_of,
    split_by,
    with_order,
)

__all__ = [  # the placements and layouts are read from here too
    "REDUCE_OPS", "Partial", "Placement", "Replicate", "Shard", "check_int", "normalize_dim", "Layout", "Spec",
    "check_spec_dims", "map_placements", "normalize_placements", "orders_of", "split_by", "spec_of", "with_order",
]

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


def _array_of(full: Any) -> Any:
    """``full`` as an array: itself where it has a shape and dims, a nested list or tuple as a
    numpy array; anything else is refused, named."""
    if hasattr(full, "shape") and hasattr(full, "ndim"):
        return full
    if isinstance(full, (list, tuple)):
        import numpy as np

        try:
            array = np.asarray(full)
        except ValueError as exc:  # ragged nesting
            raise InvalidArgument(f"local_shard: full is a nested list numpy cannot make an array of ({exc})") from None
        if array.dtype != object:
            return array
    raise InvalidArgument(f"local_shard: full must be an array (numpy, torch or a nested list of numbers), "
                          f"got {type(full).__name__}")


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
    if _spec_text(spec):
        return parse_spec(spec).resolve(mesh_ndim, names)
    if isinstance(spec, str):
        parts = [p for p in re.split(r",(?![^(]*\))", _unwrapped(spec)) if p.strip()]
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


def _spec_text(spec: Any) -> bool:
    """Whether ``spec`` is a Spec as text (``"Spec((1, 0), None)"``)."""
    return isinstance(spec, str) and spec.lstrip()[:5].lower() == "spec("


def check_spec_dims(value: Any, ndim: int, name: str) -> None:
    """Refuse a ``Spec`` (object or text) that splits a tensor dim the tensor lacks, naming the
    Spec as written: once resolved, only the ``Shard`` it became could be named. Text that is no
    Spec passes: reading it as a layout names what is wrong, where it is read."""
    try:
        spec = parse_spec(value) if _spec_text(value) else value
    except InvalidArgument:
        return
    if isinstance(spec, Spec) and len(spec.entries) > ndim:
        dims = f" (dims 0..{ndim - 1})" if ndim else ""
        raise InvalidArgument(f"{name} {spec!r} splits tensor dim {len(spec.entries) - 1}, "
                              f"but the tensor is {ndim}-d{dims}")


def _unwrapped(text: str) -> str:
    """``text`` without brackets around the whole of it: ``(Shard(0), Shard(1))`` as printed,
    or ``[S(0), S(1)]``, reads as ``Shard(0), Shard(1)``."""
    text = text.strip()
    if len(text) < 2 or text[0] + text[-1] not in ("()", "[]"):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0 and i < len(text) - 1:
            return text  # the first bracket closes before the end: "(S(0)), (S(1))" is not wrapped
    return text[1:-1]


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


def torch_layout(placements: Sequence[Any], mesh_shape: tuple[int, ...], shard_order: Any = ()) -> tuple:
    """DTensor's placements (one per mesh dim) as our layout, with the order in which mesh dims
    split a tensor dim read from ``_StridedShard`` split factors (or from ``shard_order``)."""
    plain, factors = [], {}
    for m, p in enumerate(placements):
        if _strided(p):
            plain.append(Shard(int(p.dim)))
            factors[m] = int(p.split_factor)
        else:
            plain.append(parse_placements([p])[0])
    if not factors:
        return with_order(plain, [(int(e.tensor_dim), tuple(int(m) for m in e.mesh_dims)) for e in shard_order])
    order: dict[int, list[int]] = {}
    for m in reversed(range(len(plain))):  # DTensor's decoding: each split factor places its mesh dim
        p = plain[m]
        if not isinstance(p, Shard):
            continue
        dims = order.setdefault(p.dim, [])
        want = factors.get(m, 1)
        for at in range(len(dims) + 1):
            if math.prod(mesh_shape[j] for j in dims[:at]) == want:
                dims.insert(at, m)
                break
        else:
            raise InvalidArgument(f"the placements {list(placements)} on mesh {list(mesh_shape)} name no "
                                  "order of mesh dims: a _StridedShard's split factor must be the product of the sizes "
                                  "of the mesh dims that split its tensor dim before it")
    return with_order(plain, {d: tuple(dims) for d, dims in order.items()})


def _strided(p: Any) -> bool:
    return type(p).__name__ == "_StridedShard" and type(p).__module__.startswith("torch.")


def dtensor_placements(value: Any, mesh_shape: tuple[int, ...], names: Sequence[str], ndim: int | None = None,
                       name: str = "dst") -> tuple:
    """A layout given for a DTensor: ours (placements, a Spec, text) or DTensor's own placements,
    ``_StridedShard`` included (as a DTensor's ``placements`` reads); ``ndim``: the tensor's
    dims, which a Spec (called ``name`` in errors) may not pass."""
    if ndim is not None:
        check_spec_dims(value, ndim, name)
    if isinstance(value, (list, tuple)) and any(map(_strided, value)):
        if len(value) != len(mesh_shape):
            raise InvalidArgument(f"placements must be a sequence with one placement per mesh dim "
                                  f"({len(mesh_shape)}), got {list(value)}")
        return torch_layout(value, mesh_shape)
    return parse_placements(value, len(mesh_shape), names)


def is_placement(p: Any) -> bool:
    """A placement object: ours, or DTensor's (``_StridedShard`` included)."""
    if isinstance(p, (Shard, Replicate, Partial)):
        return True
    return type(p).__module__.startswith("torch.") and type(p).__name__ in ("Shard", "Replicate", "Partial", "_StridedShard")


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
    """What a rank holds of ``full`` (numpy array, torch tensor or nested list) under ``placement``.

    1-D world: ``local_shard(full, placement, rank, size)``. On a mesh:
    ``local_shard(full, placements, coord, mesh_shape)``, one placement per mesh dim, or a
    ``Spec`` by mesh dim number (a tensor dim split by several mesh dims in its order).

    ``Shard(d)``: a view of ``full`` sliced along ``d`` by the balanced rule (nested on a mesh,
    earlier mesh dims first). ``Replicate()``: no cut. ``Partial(op)``: for ``sum``, the rank at
    coordinate 0 of that mesh dim holds the values and the others zeros (they sum to ``full``);
    for ``avg``, ``max`` and ``min`` every rank holds them.
    """
    full = _array_of(full)
    on_mesh = isinstance(size, (tuple, list)) or isinstance(rank, (tuple, list))
    if isinstance(placement, (tuple, list)) or on_mesh:  # a Spec with a rank and a size: the world, a 1-D mesh
        return _local_shard_mesh(full, placement, rank, size)
    rank = check_int("rank", rank)
    size = check_int("size", size)
    if size < 1 or not 0 <= rank < size:
        raise InvalidArgument(f"rank must be in [0, size), got rank={rank}, size={size}")
    check_spec_dims(placement, full.ndim, "placement")
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
    check_spec_dims(placements, full.ndim, "placements")
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



_SHARD_RE = re.compile(r"^\s*(?:Shard|S)\s*\(\s*(?:dim\s*=\s*)?(-?\d+)\s*\)\s*$", re.IGNORECASE)
_PARTIAL_RE = re.compile(r"^\s*(?:Partial|P)\s*\(\s*(?:op\s*=\s*)?['\"]?(\w*)['\"]?\s*\)\s*$", re.IGNORECASE)


def parse_placement(spec: Any) -> Placement:
    """A placement from itself or from text: ``Shard(1)``, ``row``/``rows`` (Shard(0)),
    ``col``/``cols`` (Shard(1)), ``replicate``/``Replicate()``, ``partial``/``Partial(max)``."""
    if isinstance(spec, (Shard, Replicate, Partial)):
        return spec
    if isinstance(spec, Spec) or _spec_text(spec):
        # the world is a 1-D mesh: a Spec on it names mesh dim 0 at most, one placement
        return (parse_spec(spec) if isinstance(spec, str) else spec).resolve(1)[0]
    if not isinstance(spec, str):
        raise InvalidArgument(f"a placement must be Shard(d), Replicate(), Partial(op) or a Spec, got {spec!r}")
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
        f"cannot read placement {spec!r}: use row, col, replicate, partial, Shard(d), Partial(op) or Spec(...)"
    )
