"""Validation of each collective's arguments on one rank: pure functions that return the
checked (canonical) arguments or raise a ``ReshardError`` saying what is wrong.

They read only this rank's input (its shape, ndim and dtype) and arguments; nothing moves.
``Call.validate`` runs one and holds its error for the agreement, so every rank raises it and
no rank computes on with placeholder values.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument, UnsupportedDType
from .execution.arrays import array_backend, dtype_name, is_torch
from .planning.host_costs import ALGORITHMS
from .planning.layout import (
    REDUCE_OPS,
    Partial,
    Placement,
    Shard,
    check_int,
    check_spec_dims,
    mesh_region,
    normalize_dim,
    normalize_placements,
    parse_placement,
    parse_placements,
)

Array = Any


def counts(values: Any, parts: int, name: str) -> tuple[int, ...]:
    """One non-negative int per rank (ints, numpy ints or a 1-D integer tensor/array)."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    try:
        sizes = [check_int(f"{name}[{i}]", s) for i, s in enumerate(values)]
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence of {parts} ints, got {values!r}") from None
    if len(sizes) != parts:
        raise InvalidArgument(f"{name} has {len(sizes)} entries; it needs one per rank ({parts})")
    if any(s < 0 for s in sizes):
        raise InvalidArgument(f"{name} has a negative entry: {sizes}")
    return tuple(sizes)


def sizes(values: Any, length: int, parts: int, name: str = "split_sizes", split: str = "the split dim") -> tuple[int, ...]:
    """``counts`` that also add up to ``length``, the length of what ``split`` names."""
    out = counts(values, parts, name)
    if sum(out) != length:
        raise InvalidArgument(f"{name} {out} sums to {sum(out)}, but {split} has length {length}")
    return out


def reducible(x: Array, op: str) -> str:
    """``op`` when values of ``x``'s dtype can be reduced with it."""
    if op not in REDUCE_OPS:
        raise InvalidArgument(f"op must be one of {REDUCE_OPS}, got {op!r}")
    is_float, is_complex, is_bool = array_backend("torch" if is_torch(x) else "numpy").dtype_info(x)
    if is_bool and op in ("sum", "avg"):
        raise UnsupportedDType(f"cannot {op} bool values (use max for 'any' or min for 'all')")
    if is_complex and op in ("max", "min"):
        raise UnsupportedDType(f"complex values have no order, so op={op!r} is undefined for {dtype_name(x)}")
    if op == "avg" and not (is_float or is_complex):
        raise UnsupportedDType(f"op='avg' needs a floating or complex dtype, got {dtype_name(x)} (use sum)")
    return op


@dataclass(frozen=True)
class AllToAllArgs:
    split_dim: int
    concat_dim: int
    split_sizes: tuple[int, ...] | None
    algorithm: str = "flat"  # "flat", "hierarchical", or "auto" where the cost model decides




def all_to_all(x: Array, size: int, split_dim: Any, concat_dim: Any, split_sizes: Any, algorithm: Any = "flat",
               hosts: Sequence[int] = ()) -> AllToAllArgs:
    s = normalize_dim(split_dim, x.ndim, "split_dim")
    c = normalize_dim(concat_dim, x.ndim, "concat_dim")
    cut = sizes(split_sizes, x.shape[s], size, split=f"split_dim {s}") if split_sizes is not None else None
    return AllToAllArgs(s, c, cut, exchange_algorithm(algorithm, hosts, s, c))


def exchange_algorithm(algorithm: Any, hosts: Sequence[int], split_dim: int, concat_dim: int) -> str:
    """The algorithm asked for, checked: ``"auto"`` stays ``"auto"`` where the two-level form
    could run (several hosts of several ranks each, laid out host by host; the cost model
    decides once every rank's shape is known) and is ``"flat"`` elsewhere."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise InvalidArgument(f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}")
    if algorithm == "flat":
        return "flat"
    if algorithm == "auto":
        if len(set(hosts)) < 2:
            return "flat"
        try:
            count, local = hosts_mesh_shape(hosts)
        except InvalidArgument:
            return "flat"
        return "auto" if local > 1 else "flat"
    hosts_mesh_shape(hosts)
    return "hierarchical"


def hosts_mesh_shape(hosts: Sequence[int]) -> tuple[int, int]:
    """``(hosts, ranks per host)`` for ranks with these host indices; ``InvalidArgument`` where
    the hosts hold different numbers of ranks or a host's ranks are not consecutive."""
    count = max(hosts) + 1
    per_host = [list(hosts).count(h) for h in range(count)]
    if len(set(per_host)) > 1:
        held = ", ".join(f"host {h}: {k}" for h, k in enumerate(per_host))
        raise InvalidArgument(f"the hosts hold different numbers of ranks ({held}); a (hosts, ranks per host) "
                              "mesh needs the same number on each")
    local = per_host[0]
    if list(hosts) != [r // local for r in range(len(hosts))]:
        raise InvalidArgument(f"the ranks of a host are not consecutive (host of each rank: {list(hosts)}); a mesh "
                              "lays ranks out row-major, so start the ranks host by host")
    return count, local


def all_to_all_v(x: Array, size: int, send_counts: Any, recv_counts: Any, algorithm: Any = "flat",
                 hosts: Any = None) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(send counts, the receive counts the caller expects or None)."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise InvalidArgument(f"algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, got {algorithm!r}")
    if hosts is not None and (algorithm == "hierarchical" or algorithm == "auto" and max(hosts) > 0):
        hosts_mesh_shape(hosts)  # the two levels need the same number of consecutive ranks per host
    sent = sizes(send_counts, x.shape[0], size, "send_counts", split="x's dim 0 (its rows)")
    return sent, (counts(recv_counts, size, "recv_counts") if recv_counts is not None else None)


def reduce_scatter(x: Array, dim: Any, op: str) -> int:
    reducible(x, op)
    return normalize_dim(dim, x.ndim, "dim")


def gather(x: Array, size: int, dim: Any, dst: Any) -> tuple[int, int]:
    d = normalize_dim(dim, x.ndim, "dim")
    root = check_int("dst", dst)
    if not 0 <= root < size:
        raise InvalidArgument(f"dst={root} is not a rank of this communicator (size {size})")
    return d, root


def crc(v: Any) -> int:
    """An argument as one integer for the agreement record: a checksum of its text."""
    return zlib.crc32(repr(v).encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class RedistributeArgs:
    src: tuple[Placement, ...]  # one per mesh dim, Shard dims normalised
    dst: tuple[Placement, ...]
    global_shape: tuple[int, ...] | None

    def code(self, mesh_shape: Sequence[int], rule: str) -> tuple[int, int, int]:
        """The arguments as three integers for the agreement record (any mesh size)."""
        return crc(self.src), crc(self.dst), crc((tuple(mesh_shape), rule))


WORLD_TUPLE = "src and dst are one placement per mesh dim: pass the mesh (mesh=rs.Mesh(...))"


def redistribute(x: Array, src: Any, dst: Any, mesh_shape: Sequence[int], coord: Sequence[int],
                 global_shape: Any, rule: str, world: bool, names: Sequence[str] | None = None) -> RedistributeArgs:
    """A change on a mesh (``world``: the communicator as the mesh ``(N,)``, with one
    placement each side rather than one per mesh dim); ``names``: the mesh dims' names, which
    a ``Spec`` may use."""
    if world:
        if isinstance(src, (tuple, list)) or isinstance(dst, (tuple, list)):
            raise InvalidArgument(WORLD_TUPLE)
        s_pl, d_pl = (parse_placement(src),), (parse_placement(dst),)
    else:
        s_pl = parse_placements(src, len(mesh_shape), names)
        d_pl = parse_placements(dst, len(mesh_shape), names)
        if len(s_pl) != len(mesh_shape) or len(d_pl) != len(mesh_shape):
            raise InvalidArgument(f"src {list(s_pl)} and dst {list(d_pl)} need one placement per mesh dim ({len(mesh_shape)})")
    nd = x.ndim
    if nd == 0 and any(isinstance(p, Shard) for p in (*s_pl, *d_pl)):
        raise InvalidArgument("x is 0-d; this op names a dim, so it needs at least one dim")
    check_spec_dims(src, nd, "src")
    check_spec_dims(dst, nd, "dst")
    s_pl = normalize_placements(s_pl, nd, "src Shard dim")
    d_pl = normalize_placements(d_pl, nd, "dst Shard dim")
    for m, (a, b) in enumerate(zip(s_pl, d_pl)):
        where = "" if world else f"mesh dim {m}: "
        if isinstance(a, Partial) and a != b:
            reducible(x, a.op)
        if isinstance(b, Partial) and a != b:  # the result must reduce with b's op
            reducible(x, b.op)
        if isinstance(b, Partial) and b.op == "avg" and isinstance(a, Shard):
            raise InvalidArgument(f"{where}Shard -> Partial('avg') cannot be exact; use Partial('sum')")
    gshape = None
    if global_shape is not None:
        gshape = tuple(check_int(f"global_shape[{i}]", g) for i, g in enumerate(global_shape))
        if len(gshape) != nd:
            raise InvalidArgument(f"global_shape {list(gshape)} has {len(gshape)} dims but x has {nd}")
        if any(g < 0 for g in gshape):
            raise InvalidArgument(f"global_shape {list(gshape)} has a negative entry")
        want = tuple(b - a for a, b in mesh_region(gshape, s_pl, coord, mesh_shape, rule))
        if want != tuple(x.shape):
            on = (f"{s_pl[0]!r} of global_shape {list(gshape)} over {mesh_shape[0]} ranks gives rank {coord[0]}" if world
                  else f"{list(s_pl)} of global_shape {list(gshape)} on mesh {list(mesh_shape)} gives the rank at "
                       f"{list(coord)}")
            raise InvalidArgument(f"x has shape {list(x.shape)}, but {on} the shape {list(want)}")
    return RedistributeArgs(s_pl, d_pl, gshape)
