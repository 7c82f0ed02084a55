"""Planning a layout change on an N-D mesh as boxes: pure, no engine, no array library.

Between Shard/Replicate layouts the change is one exchange in which every rank receives only
the elements it needs and does not hold, each exactly once, as boxes (products of intervals).
An element a rank needs comes from the holder nearest to it: the rank that shares its
coordinates on every mesh dim where the source replicates (itself, when it holds the element),
so the load spreads over the replicas. Nothing here enumerates rank pairs: a rank's boxes are
worked out from its own coordinate, and the totals come from per-rank sums.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidArgument
from .layout import Placement, Replicate, Shard, mesh_region, normalize_dim, shard_sizes

Box = tuple[tuple[int, int], ...]


def box_size(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def box_intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def box_subtract(a: Box, b: Box) -> list[Box]:
    """``a`` minus ``b`` as at most 2 x ndim disjoint boxes."""
    cut = box_intersect(a, b)
    if cut is None:
        return [a] if box_size(a) else []
    out, rest = [], list(a)
    for d, ((lo, hi), (clo, chi)) in enumerate(zip(a, cut)):
        if lo < clo:
            out.append(tuple(rest[:d]) + ((lo, clo),) + tuple(rest[d + 1 :]))
        if chi < hi:
            out.append(tuple(rest[:d]) + ((chi, hi),) + tuple(rest[d + 1 :]))
        rest[d] = (clo, chi)
    return [b for b in out if box_size(b)]


@dataclass(frozen=True)
class _Pieces:
    """How one tensor dim is cut under a layout: the mesh dims that shard it (in mesh order),
    and every piece's [start, stop) with the coordinates it belongs to on those mesh dims."""

    mesh_dims: tuple[int, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    coords: tuple[tuple[int, ...], ...]


def _pieces(length: int, placements: Sequence[Placement], dim: int, mesh_shape: Sequence[int]) -> _Pieces:
    dims = tuple(m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == dim)
    spans: list[tuple[int, int, tuple[int, ...]]] = [(0, length, ())]
    for m in dims:
        nxt = []
        for start, stop, coord in spans:
            at = start
            for k, size in enumerate(shard_sizes(stop - start, mesh_shape[m])):
                nxt.append((at, at + size, coord + (k,)))
                at += size
        spans = nxt
    return _Pieces(dims, tuple(s[0] for s in spans), tuple(s[1] for s in spans), tuple(s[2] for s in spans))


def _normalize(placements: Sequence[Placement], ndim: int, mesh_ndim: int, name: str) -> tuple[Placement, ...]:
    if len(placements) != mesh_ndim:
        raise InvalidArgument(f"{name} has {len(placements)} placements for a {mesh_ndim}-d mesh")
    out = []
    for p in placements:
        out.append(Shard(normalize_dim(p.dim, ndim, f"{name} Shard dim")) if isinstance(p, Shard) else p)
    return tuple(out)


class BoxExchange:
    """One exchange between two Shard/Replicate layouts of a tensor on a mesh."""

    def __init__(self, global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int]):
        self.shape = tuple(int(s) for s in global_shape)
        self.mesh_shape = tuple(int(s) for s in mesh_shape)
        self.src = _normalize(src, len(self.shape), len(self.mesh_shape), "src")
        self.dst = _normalize(dst, len(self.shape), len(self.mesh_shape), "dst")
        for name, layout in (("src", self.src), ("dst", self.dst)):
            if not all(isinstance(p, (Shard, Replicate)) for p in layout):
                raise InvalidArgument(f"{name} {list(layout)}: a box exchange moves Shard and Replicate layouts only")
        self.src_pieces = [_pieces(n, self.src, d, self.mesh_shape) for d, n in enumerate(self.shape)]
        self.size = 1
        for s in self.mesh_shape:
            self.size *= s

    def coord(self, rank: int) -> tuple[int, ...]:
        out = []
        for s in reversed(self.mesh_shape):
            rank, c = divmod(rank, s)
            out.append(c)
        return tuple(reversed(out))

    def rank(self, coord: Sequence[int]) -> int:
        r = 0
        for c, s in zip(coord, self.mesh_shape):
            r = r * s + c
        return r

    def held(self, rank: int) -> Box:
        return mesh_region(self.shape, self.src, self.coord(rank), self.mesh_shape)

    def needed(self, rank: int) -> Box:
        return mesh_region(self.shape, self.dst, self.coord(rank), self.mesh_shape)

    def recvs(self, rank: int) -> list[tuple[int, Box]]:
        """(source rank, box) for every piece ``rank`` receives: what it needs and does not hold,
        each element once, from the holder that shares its coordinates where the source replicates."""
        me = self.coord(rank)
        out = []
        for box in box_subtract(self.needed(rank), self.held(rank)):
            per_dim = []
            for (lo, hi), pieces in zip(box, self.src_pieces):
                first = bisect.bisect_right(pieces.starts, lo) - 1
                last = bisect.bisect_left(pieces.starts, hi)
                per_dim.append([(max(lo, pieces.starts[k]), min(hi, pieces.stops[k]), pieces.mesh_dims, pieces.coords[k])
                                for k in range(max(first, 0), last) if pieces.starts[k] < pieces.stops[k]])
            for combo in itertools.product(*per_dim):
                coord = list(me)  # replicated source dims: the holder aligned with this rank
                for _, _, dims, cs in combo:
                    for m, c in zip(dims, cs):
                        coord[m] = c
                piece = tuple((a, b) for a, b, _, _ in combo)
                if box_size(piece):
                    out.append((self.rank(coord), piece))
        return out

    def sends(self, rank: int) -> list[tuple[int, Box]]:
        """(destination rank, box) for every piece ``rank`` sends (the mirror of ``recvs``)."""
        return [(q, box) for q in range(self.size) for src, box in self.recvs(q) if src == rank]

    def bytes_per_rank(self, itemsize: int) -> tuple[list[int], list[int]]:
        """(sent, received) bytes per rank."""
        sent, received = [0] * self.size, [0] * self.size
        for q in range(self.size):
            for p, box in self.recvs(q):
                n = box_size(box) * itemsize
                sent[p] += n
                received[q] += n
        return sent, received

    def lower_bound(self, rank: int) -> int:
        """Elements ``rank`` needs and does not hold: no plan can receive fewer."""
        return sum(box_size(b) for b in box_subtract(self.needed(rank), self.held(rank)))
