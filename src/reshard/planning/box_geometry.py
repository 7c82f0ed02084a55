"""One rank's own part of a layout change on a mesh (a world of N ranks is the mesh ``(N,)``):
the peers it sends to and receives from, one box each, worked out from its own coordinate in
time and memory proportional to its own pieces. Nothing here lists a transfer per pair of
ranks or another rank's boxes, so a rank of a 65,536-rank job plans in milliseconds.

Pure: numpy is imported by the functions that vectorise over a rank's peers, never at import.

The exchange moves, from each holder ``p`` to each rank ``q`` that needs part of what ``p``
holds, the one box ``held(p) & needed(q)``, where ``p`` is the holder aligned with ``q`` (the
same coordinate on every mesh dim where the source replicates). Both ends compute that same box,
so a message is laid out identically on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .layout import Placement, split_by, unravel


@dataclass(frozen=True)
class PieceArrays:
    """One tensor dim cut under a layout, as arrays: the mesh dims that cut it (outer first),
    and each piece's ``[start, stop)`` and coordinates on those mesh dims, in coordinate order
    (which is also the order of ``start``)."""

    mesh_dims: tuple[int, ...]
    starts: Any  # int64 (K,)
    stops: Any  # int64 (K,)
    coords: Any  # int64 (K, len(mesh_dims))


def piece_arrays(length: int, placements: Sequence[Placement], dim: int, mesh_shape: Sequence[int],
                 rule: str = "balanced") -> PieceArrays:
    """``mesh_plan._pieces`` as numpy arrays, split by every mesh dim at once per level."""
    import numpy as np

    dims = split_by(placements, dim)
    starts = np.zeros(1, dtype=np.int64)
    lengths = np.full(1, length, dtype=np.int64)
    coords = np.zeros((1, 0), dtype=np.int64)
    for m in dims:
        k = int(mesh_shape[m])
        i = np.arange(k, dtype=np.int64)
        if rule == "chunk":
            step = -(-lengths // k)
            a = np.minimum(lengths[:, None], i[None, :] * step[:, None])
            b = np.minimum(lengths[:, None], a + step[:, None])
        else:
            base, extra = lengths // k, lengths % k
            a = i[None, :] * base[:, None] + np.minimum(i[None, :], extra[:, None])
            b = a + base[:, None] + (i[None, :] < extra[:, None])
        starts = (starts[:, None] + a).reshape(-1)
        lengths = (b - a).reshape(-1)
        coords = np.concatenate([np.repeat(coords, k, axis=0), np.tile(i, len(coords))[:, None]], axis=1)
    return PieceArrays(dims, starts, starts + lengths, coords)


def _strides(mesh_shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(mesh_shape):
        out.append(acc)
        acc *= int(s)
    return list(reversed(out))


def _index(pieces: PieceArrays, coord: Sequence[int], mesh_shape: Sequence[int]) -> int:
    """The position of the piece at ``coord`` (on ``pieces.mesh_dims``) in coordinate order."""
    i = 0
    for m in pieces.mesh_dims:
        i = i * int(mesh_shape[m]) + int(coord[m])
    return i


@dataclass
class RankExchange:
    """What one rank sends and receives in a box exchange: peers (ascending) with one box each,
    as arrays ``peers`` (P,), ``lo`` and ``hi`` (P, ndim)."""

    send_peers: Any
    send_lo: Any
    send_hi: Any
    recv_peers: Any
    recv_lo: Any
    recv_hi: Any

    @staticmethod
    def _counts(lo: Any, hi: Any) -> Any:
        import numpy as np

        return np.prod(hi - lo, axis=1, dtype=np.int64) if lo.shape[1] else np.ones(len(lo), dtype=np.int64)

    @property
    def send_counts(self) -> Any:
        return self._counts(self.send_lo, self.send_hi)

    @property
    def recv_counts(self) -> Any:
        return self._counts(self.recv_lo, self.recv_hi)

    def sends(self) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
        return _as_list(self.send_peers, self.send_lo, self.send_hi)

    def recvs(self) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
        return _as_list(self.recv_peers, self.recv_lo, self.recv_hi)


def _as_list(peers: Any, lo: Any, hi: Any) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    # Built column by column with zip (C loops): a 65,535-peer rank's lists take milliseconds.
    per_dim = [zip(lo[:, d].tolist(), hi[:, d].tolist()) for d in range(lo.shape[1])]
    boxes = zip(*per_dim) if per_dim else (() for _ in range(len(peers)))
    return list(zip(peers.tolist(), boxes))


class ExchangeGeometry:
    """The pieces of one Shard/Replicate -> Shard/Replicate exchange on a mesh, cut once, from
    which any rank's own sends and receives follow (``for_rank``)."""

    def __init__(self, shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int], rule: str = "balanced") -> None:
        self.shape = tuple(int(s) for s in shape)
        self.mesh_shape = tuple(int(s) for s in mesh_shape)
        self.src, self.dst = src, dst
        self.src_pieces = [piece_arrays(n, src, d, mesh_shape, rule) for d, n in enumerate(self.shape)]
        self.dst_pieces = [piece_arrays(n, dst, d, mesh_shape, rule) for d, n in enumerate(self.shape)]
        self.strides = _strides(self.mesh_shape)
        self.src_sharded = {m for p in self.src_pieces for m in p.mesh_dims}
        self.dst_sharded = {m for p in self.dst_pieces for m in p.mesh_dims}

    def coord(self, rank: int) -> tuple[int, ...]:
        return unravel(rank, self.mesh_shape)

    def _box(self, pieces: list[PieceArrays], coord: Sequence[int]) -> tuple[tuple[int, int], ...]:
        out = []
        for p in pieces:
            i = _index(p, coord, self.mesh_shape)
            out.append((int(p.starts[i]), int(p.stops[i])))
        return tuple(out)

    def held(self, rank: int) -> tuple[tuple[int, int], ...]:
        return self._box(self.src_pieces, self.coord(rank))

    def needed(self, rank: int) -> tuple[tuple[int, int], ...]:
        return self._box(self.dst_pieces, self.coord(rank))

    def _side(self, me: int, box: Sequence[tuple[int, int]], pieces: list[PieceArrays], fixed: set[int],
              free: set[int]) -> tuple[Any, Any, Any]:
        """Peers and boxes: ``box`` cut by ``pieces`` per tensor dim; a peer's coordinate is the
        piece's on the dims that cut, ``me``'s on ``fixed`` dims, every value on ``free`` dims."""
        import numpy as np

        coord = self.coord(me)
        ndim = len(self.shape)
        peers = np.array([sum(coord[m] * self.strides[m] for m in fixed if not any(m in p.mesh_dims for p in pieces))],
                         dtype=np.int64)
        lo = np.zeros((1, ndim), dtype=np.int64)
        hi = np.zeros((1, ndim), dtype=np.int64)
        for d, (p, (blo, bhi)) in enumerate(zip(pieces, box)):
            if blo >= bhi:
                return _nothing(ndim)
            first = max(int(np.searchsorted(p.starts, blo, side="right")) - 1, 0)
            last = max(int(np.searchsorted(p.starts, bhi, side="left")), first)
            a = np.maximum(p.starts[first:last], blo)  # slices: views, not copies
            b = np.minimum(p.stops[first:last], bhi)
            coords = p.coords[first:last]
            keep = a < b
            for j, m in enumerate(p.mesh_dims):
                if m in fixed:  # a piece whose coordinate here is not ``me``'s belongs to no peer
                    keep &= coords[:, j] == coord[m]
            if not keep.all():
                a, b, coords = a[keep], b[keep], coords[keep]
            if not len(a):
                return _nothing(ndim)
            contrib = np.zeros(len(a), dtype=np.int64)
            for j, m in enumerate(p.mesh_dims):
                contrib += coords[:, j] * self.strides[m]
            if len(peers) == 1:  # the first cut: no product to form yet
                peers = peers[0] + contrib
                lo, hi = np.repeat(lo, len(a), axis=0), np.repeat(hi, len(a), axis=0)
                lo[:, d], hi[:, d] = a, b
                continue
            peers = (peers[:, None] + contrib[None, :]).reshape(-1)
            lo = np.repeat(lo, len(a), axis=0)
            hi = np.repeat(hi, len(a), axis=0)
            lo[:, d] = np.tile(a, len(lo) // len(a))
            hi[:, d] = np.tile(b, len(hi) // len(a))
        for m in sorted(free):  # every coordinate: the same box goes to each
            k = self.mesh_shape[m]
            peers = (peers[:, None] + np.arange(k, dtype=np.int64)[None, :] * self.strides[m]).reshape(-1)
            lo, hi = np.repeat(lo, k, axis=0), np.repeat(hi, k, axis=0)
        mine = peers != me
        if not mine.all():
            peers, lo, hi = peers[mine], lo[mine], hi[mine]
        if len(peers) > 1 and not bool(np.all(peers[1:] > peers[:-1])):
            order = np.argsort(peers, kind="stable")
            peers, lo, hi = peers[order], lo[order], hi[order]
        return peers, lo, hi

    def for_rank(self, rank: int) -> RankExchange:
        """This rank's sends and receives (its own part excluded)."""
        all_dims = set(range(len(self.mesh_shape)))
        replicated = all_dims - self.src_sharded
        # receives: what it needs, cut by the source's pieces, from the holder aligned with it
        recv = self._side(rank, self.needed(rank), self.src_pieces, replicated, set())
        # sends: what it holds, cut by the destination's pieces, to every rank aligned with it
        # that needs a part; mesh dims the source cuts and the destination does not fan out
        send = self._side(rank, self.held(rank), self.dst_pieces, replicated, self.src_sharded - self.dst_sharded)
        return RankExchange(*send, *recv)

    def totals(self) -> tuple[Any, Any]:
        """Elements every rank sends and receives, as arrays over the ranks, without listing a
        pair: a rank receives what it needs and does not hold; it sends each element it holds
        to every rank aligned with it that needs it (O(ranks x dims), vectorised)."""
        import numpy as np

        size = 1
        for s in self.mesh_shape:
            size *= s
        coords = np.array(np.unravel_index(np.arange(size), self.mesh_shape)).T.reshape(size, len(self.mesh_shape))
        replicated = set(range(len(self.mesh_shape))) - self.src_sharded
        fan_out = 1  # the same element to every coordinate of a dim the source cuts and the destination does not
        for m in self.src_sharded - self.dst_sharded:
            fan_out *= self.mesh_shape[m]
        kept = np.ones(size, dtype=np.int64)
        needed = np.ones(size, dtype=np.int64)
        reach = np.ones(size, dtype=np.int64)
        for sp, dp in zip(self.src_pieces, self.dst_pieces):
            hs, he = _per_rank(sp, coords, self.mesh_shape)
            ns, ne = _per_rank(dp, coords, self.mesh_shape)
            kept *= np.clip(np.minimum(he, ne) - np.maximum(hs, ns), 0, None)
            needed *= ne - ns
            keys = [j for j, m in enumerate(dp.mesh_dims) if m in replicated]
            reach *= np.where(he > hs, _matching(dp, keys, hs, he, coords, self.mesh_shape), 0)
        return fan_out * reach - kept, needed - kept

    def moves(self) -> bool:
        """Whether any rank receives anything: every rank's boxes at once, as arrays (O(ranks))."""
        import numpy as np

        size = 1
        for s in self.mesh_shape:
            size *= s
        coords = np.array(np.unravel_index(np.arange(size), self.mesh_shape)).T.reshape(size, len(self.mesh_shape))
        empty = np.zeros(size, dtype=bool)
        outside = np.zeros(size, dtype=bool)
        for sp, dp in zip(self.src_pieces, self.dst_pieces):
            hs, he = _per_rank(sp, coords, self.mesh_shape)
            ns, ne = _per_rank(dp, coords, self.mesh_shape)
            empty |= ns >= ne
            outside |= (ns < hs) | (ne > he)
        return bool(np.any(outside & ~empty))


def _matching(p: PieceArrays, keys: list[int], lo: Any, hi: Any, coords: Any, mesh_shape: Sequence[int]) -> Any:
    """Per rank, the positions of ``[lo, hi)`` whose piece sits at the rank's own coordinate on
    the mesh dims ``keys`` (columns of ``p.coords``); all of them when ``keys`` is empty."""
    import numpy as np

    if not keys:
        return hi - lo
    count = len(p.starts)
    key = np.zeros(count, dtype=np.int64)
    want = np.zeros(len(coords), dtype=np.int64)
    for j in keys:
        k = int(mesh_shape[p.mesh_dims[j]])
        key = key * k + p.coords[:, j]
        want = want * k + coords[:, p.mesh_dims[j]]
    order = np.argsort(key * count + np.arange(count), kind="stable")
    ranked = (key * count + np.arange(count))[order]  # pieces grouped by key, in position order
    cum = np.concatenate([[0], np.cumsum((p.stops - p.starts)[order])])

    def upto(x: Any) -> Any:  # matching positions below x
        i = np.searchsorted(p.starts, x, side="right") - 1
        at = np.maximum(i, 0)
        whole = cum[np.searchsorted(ranked, want * count + at)] - cum[np.searchsorted(ranked, want * count)]
        inside = np.where(key[at] == want, np.clip(np.minimum(x, p.stops[at]) - p.starts[at], 0, None), 0)
        return np.where(i < 0, 0, whole + inside)

    return upto(hi) - upto(lo)


def _nothing(ndim: int) -> tuple[Any, Any, Any]:
    import numpy as np

    return np.zeros(0, np.int64), np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64)


def _per_rank(p: PieceArrays, coords: Any, mesh_shape: Sequence[int]) -> tuple[Any, Any]:
    import numpy as np

    idx = np.zeros(len(coords), dtype=np.int64)
    for m in p.mesh_dims:
        idx = idx * int(mesh_shape[m]) + coords[:, m]
    return p.starts[idx], p.stops[idx]
