"""An exchange as reads in place: each rank copies its boxes straight out of its same-host
peers' inputs, which lie in their shared arenas, into its result (``engines.arena_link``).

The step form for an all-to-all or an exchange of boxes where the group has a link and the
tensor is large enough (``RESHARD_ARENA_MIN_BYTES`` of it per rank; every rank decides alike).
Each byte moves once when the input is in the arena (a result of an earlier exchange, or
``rs.empty``); else it is copied there first. Results go into the arena, so the next exchange
of a chain reads them in place.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import settings
from ..engines import arena as arena_mod
from ..engines.arena_link import ArenaLink, exchange_tag
from ..planning.layout import offsets
from ..planning.plan import region_numel as box_size
from ..planning.steps import AllToAll, Box, ExchangeBoxes, with_dim
from .arrays import is_torch, numel

Array = Any
Slices = tuple[slice, ...]
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def numpy_view(a: Array) -> np.ndarray:
    """``a``'s memory as a numpy array of its shape (a dtype of the same item size where numpy
    has no twin of a torch dtype); no copy."""
    if not is_torch(a):
        return a
    t = a.detach()
    try:
        return t.numpy()
    except TypeError:
        torch = sys.modules["torch"]
        size = t.element_size()
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size)
        if as_int is None:  # 16-byte items: two int64 each
            return t.view(torch.int64).numpy().view(np.dtype((np.void, size))).reshape(tuple(t.shape))
        return t.view(as_int).numpy()


def shared_empty(shape: Sequence[int], like: Array) -> Array | None:
    """An uninitialised CPU array like ``like`` (numpy, or a torch tensor) in this process's
    arena; None where there is none or it is full."""
    if is_torch(like):
        torch = sys.modules["torch"]
        if like.device.type != "cpu":
            return None
        size = like.element_size()
        try:
            twin = torch.empty(0, dtype=like.dtype).numpy().dtype
        except TypeError:
            twin = None
        raw = arena_mod.numpy_array(shape, twin if twin is not None else _UINT.get(size, np.dtype((np.void, size))))
        if raw is None:
            return None
        if twin is not None:
            return torch.from_numpy(raw)
        flat = torch.from_numpy(raw.reshape(-1).view(np.uint8))
        return flat.view(like.dtype).reshape(tuple(shape))
    return arena_mod.numpy_array(shape, like.dtype)


_off = contextvars.ContextVar("reshard_arena_off", default=False)


@contextlib.contextmanager
def turned_off(off: bool = True) -> Iterator[None]:
    """Within: exchanges take the engine's own path and results stay out of the arena (a
    call's ``arena=False``)."""
    token = _off.set(True) if off else None
    try:
        yield
    finally:
        if token is not None:
            _off.reset(token)


def key_part() -> tuple:
    """What a replay key adds for the arena: calls with it off keep programs of their own."""
    return ("arena off",) if _off.get() else ()


def allowed(x: Array) -> bool:
    """Reads in place are for CPU arrays, where the call has not turned them off (``arena=False``)."""
    return not _off.get() and (not is_torch(x) or x.device.type == "cpu")


LINK_MIN_BYTES = 64 << 10  # the first exchange this large per rank makes the group's link (a fixed number: every rank alike)


def link_for(engine: Any, global_elements: int, itemsize: int) -> ArenaLink | None:
    """The group's link where an exchange of a tensor of ``global_elements`` reads in place,
    else None: the same answer on every rank (the plan is the same; the link, made
    collectively at the first exchange of ``LINK_MIN_BYTES`` per rank, holds the largest
    ``RESHARD_ARENA_MIN_BYTES`` of its ranks, and exists only where every rank allows it)."""
    size = engine.size
    per_rank = global_elements * itemsize // max(size, 1)
    smallest = min(LINK_MIN_BYTES, settings.read("RESHARD_ARENA_MIN_BYTES"))  # set lower: the same on every rank
    if size < 2 or per_rank < smallest or getattr(engine, "arena_links", None) is None:
        return None
    link = engine.arena_links.get("link", False)
    if link is False:
        link = engine.arena_links["link"] = ArenaLink.open(
            engine.rank, size, lambda b: engine.allgather_bytes(b, "shared arena setup"), engine.timeout)
    if link is None or per_rank < link.min_bytes:
        return None
    return link


def staging(shape: Sequence[int], like: Array) -> Array | None:
    """A buffer in the arena for an array an exchange will send next (MoE's packed rows), so the
    peers read it in place: where the arena is on for this call and it is large enough; else None."""
    if not allowed(like) or not arena_mod.enabled():
        return None
    itemsize = like.element_size() if is_torch(like) else like.dtype.itemsize
    if numel(shape) * itemsize < settings.read("RESHARD_ARENA_MIN_BYTES"):
        return None
    return shared_empty(shape, like)


def _slices(box: Box, origin: Box) -> Slices:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


class ArenaReads:
    """``run(call, x, prepared=None)`` for one exchange as reads in place (``prepared`` unused)."""

    def __init__(self, link: ArenaLink, out_shape: Sequence[int], fill_op: str | None,
                 own: list[tuple[Slices, Slices]], readers: dict[int, tuple[int, int, int]],
                 writers: dict[int, int], read_plan: Any, in_arena: bool = True) -> None:
        self.link, self.out_shape, self.fill_op = link, tuple(out_shape), fill_op
        self.own, self.readers, self.writers = own, readers, writers
        self.read_plan = read_plan  # (peer, start, extent) -> (its input's shape, [(in it, in the result)])
        self.in_arena = in_arena  # the result in the arena (not for a buffer the step reduces at once)
        self.receives_result = False

    def __call__(self, k: Any, xt: Array, prepared: Any = None) -> Array:
        tally, arrays = k.tally, k.arrays
        x = numpy_view(xt)
        source = arena_mod.locate(x) if self.readers else (0, 0)
        if source is None:  # one copy into the arena: the peers read it there
            staged = arena_mod.numpy_array(x.shape, x.dtype)
            if staged is None:
                source = (0, -1)
            else:
                np.copyto(staged, x)
                tally.staged += 1
                tally.allocated += staged.nbytes
                x, source = staged, arena_mod.locate(staged)
        link = self.link
        link.post(source, self.readers)  # first: the peers read while this rank copies its own part
        out = shared_empty(self.out_shape, xt) if self.in_arena else None
        if out is None:
            out = arrays.empty(self.out_shape, like=xt)
        tally.allocated += numel(self.out_shape) * arrays.itemsize(xt)
        if self.fill_op is not None:
            out = arrays.full_like(out, arrays.identity(xt, self.fill_op))
        result = numpy_view(out)
        for src, dst in self.own:
            np.copyto(result[dst], x[src])

        def read(peer: int, raw: np.ndarray, start: int, extent: int) -> str | None:
            shape, boxes = self.read_plan(peer, start, extent)
            if numel(shape) * x.itemsize != raw.size:
                return f"rank {peer}'s input is {raw.size} bytes where {numel(shape) * x.itemsize} were expected"
            theirs = raw.view(x.dtype).reshape(shape)
            for src, dst in boxes:
                np.copyto(result[dst], theirs[src])
            return None

        link.settle(self.readers, self.writers, read, k.op)
        tally.landing = out
        return out


def all_to_all_reads(link: ArenaLink, rank: int, g: AllToAll) -> ArenaReads:
    """``g`` (this rank's all-to-all) as reads: from peer p, its piece along ``split_dim``
    (at the start and of the extent p's note gives), into p's run along ``concat_dim``."""
    s, c = g.split_dim, g.concat_dim
    send_starts, out_starts = offsets(g.send_sizes), offsets(g.recv_lengths)
    n = len(g.send_sizes)
    full = (slice(None),) * len(g.in_shape)

    def cut(dim: int, start: int, length: int) -> Slices:
        return tuple(slice(start, start + length) if d == dim else slice(None) for d in range(len(full)))

    def pair_tag(piece_shape: Sequence[int]) -> int:
        return exchange_tag("all_to_all", s, c, tuple(piece_shape))

    sent = [with_dim(g.in_shape, s, k) for k in g.send_sizes]
    readers = {j: (pair_tag(sent[j]), send_starts[j], g.in_shape[s]) for j in range(n) if j != rank and numel(sent[j])}
    recv_shapes = g.recv_shapes
    writers = {p: pair_tag(recv_shapes[p]) for p in range(n) if p != rank and numel(recv_shapes[p])}
    own = []
    if g.send_sizes[rank] and numel(recv_shapes[rank]):
        own.append((cut(s, send_starts[rank], g.send_sizes[rank]), cut(c, out_starts[rank], g.recv_lengths[rank])))

    def read_plan(p: int, start: int, extent: int) -> tuple[tuple[int, ...], list[tuple[Slices, Slices]]]:
        piece = recv_shapes[p]
        shape = with_dim(with_dim(piece, c, g.recv_lengths[p]), s, extent) if s != c else with_dim(piece, s, extent)
        return tuple(shape), [(cut(s, start, piece[s]), cut(c, out_starts[p], g.recv_lengths[p]))]

    return ArenaReads(link, g.out_shape, None, own, readers, writers, read_plan)


def boxes_reads(link: ArenaLink, step: ExchangeBoxes) -> ArenaReads:
    """An exchange of boxes as reads: each box out of the peer's input (it covers the box the
    plan's ``sources`` names) into this rank's result."""
    held, target = step.held, step.target
    sources = dict(step.sources)
    by_dst: dict[int, list[Box]] = {}
    for q, box in step.sends:
        by_dst.setdefault(q, []).append(box)
    by_src: dict[int, list[Box]] = {}
    for p, box in step.recvs:
        by_src.setdefault(p, []).append(box)
    readers = {q: (exchange_tag("boxes", held, tuple(boxes)), 0, 0) for q, boxes in by_dst.items()}
    writers = {p: exchange_tag("boxes", sources[p], tuple(boxes)) for p, boxes in by_src.items()}
    own = [(_slices(box, held), _slices(box, target)) for box in step.kept if box_size(box)]

    def read_plan(p: int, start: int, extent: int) -> tuple[tuple[int, ...], list[tuple[Slices, Slices]]]:
        origin = sources[p]
        return tuple(b - a for a, b in origin), [(_slices(box, origin), _slices(box, target)) for box in by_src[p]]

    return ArenaReads(link, tuple(b - a for a, b in target), step.fill_op, own, readers, writers, read_plan)



def _cut(ndim: int, dim: int, start: int, length: int) -> Slices:
    return tuple(slice(start, start + length) if d == dim else slice(None) for d in range(ndim))


def gather_reads(link: ArenaLink, rank: int, in_shape: Sequence[int], dim: int, lengths: Sequence[int]) -> ArenaReads:
    """all_gather along ``dim`` as reads: every peer's whole input into its run of the result."""
    ndim, starts = len(in_shape), offsets(lengths)
    pieces = [with_dim(in_shape, dim, k) for k in lengths]
    full = (slice(None),) * ndim

    def tag(piece: Sequence[int]) -> int:
        return exchange_tag("all_gather", dim, tuple(piece))

    readers = {q: (tag(pieces[rank]), 0, lengths[rank]) for q in range(len(lengths)) if q != rank and numel(pieces[rank])}
    writers = {p: tag(pieces[p]) for p in range(len(lengths)) if p != rank and numel(pieces[p])}
    own = [(full, _cut(ndim, dim, starts[rank], lengths[rank]))] if numel(pieces[rank]) else []

    def read_plan(p: int, start: int, extent: int) -> tuple[tuple[int, ...], list[tuple[Slices, Slices]]]:
        return tuple(pieces[p]), [(full, _cut(ndim, dim, starts[p], lengths[p]))]

    return ArenaReads(link, with_dim(in_shape, dim, sum(lengths)), None, own, readers, writers, read_plan)


def scatter_reads(link: ArenaLink, rank: int, size: int, in_shape: Sequence[int], dim: int) -> ArenaReads:
    """The exchange of reduce_scatter along ``dim`` as reads: piece ``rank`` (balanced) of every
    rank's input, stacked in rank order ``[size, *piece]``, for the reduction that follows."""
    from ..planning.layout import shard_sizes

    ndim = len(in_shape)
    sizes = shard_sizes(in_shape[dim], size)
    starts = offsets(sizes)
    pieces = [with_dim(in_shape, dim, k) for k in sizes]

    def tag(piece: Sequence[int]) -> int:
        return exchange_tag("reduce_scatter", dim, tuple(in_shape), tuple(piece))

    def into(p: int) -> Slices:
        return (slice(p, p + 1),) + (slice(None),) * ndim

    readers = {q: (tag(pieces[q]), starts[q], in_shape[dim]) for q in range(size) if q != rank and numel(pieces[q])}
    writers = {p: tag(pieces[rank]) for p in range(size) if p != rank and numel(pieces[rank])}
    mine = _cut(ndim, dim, starts[rank], sizes[rank])
    own = [(mine, into(rank))] if numel(pieces[rank]) else []

    def read_plan(p: int, start: int, extent: int) -> tuple[tuple[int, ...], list[tuple[Slices, Slices]]]:
        return tuple(in_shape), [(mine, into(p))]

    return ArenaReads(link, (size, *pieces[rank]), None, own, readers, writers, read_plan, in_arena=False)


class RowsReads:
    """``run(call, x, prepared=None)`` for an exchange of rows (``steps.AllToAllV``) as reads in
    place: per segment, each rank copies its rows out of every peer's input (at the row the
    peer's note gives) into its block of the result, one round of notes per segment."""

    def __init__(self, link: ArenaLink, rank: int, segments: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        self.link, self.rank, self.segments = link, rank, segments
        self.receives_result = False

    def __call__(self, k: Any, xt: Array, prepared: Any = None) -> Array:
        tally, arrays, rank, link = k.tally, k.arrays, self.rank, self.link
        x = numpy_view(xt)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
            tally.packs += 1
        trail = tuple(x.shape[1:])
        row_bytes = numel(trail) * x.itemsize
        reads_any = any(any(s for j, s in enumerate(send) if j != rank) for send, _ in self.segments)
        source = arena_mod.locate(x) if reads_any else (0, 0)
        if source is None:
            staged = arena_mod.numpy_array(x.shape, x.dtype)
            if staged is None:
                source = (0, -1)
            else:
                np.copyto(staged, x)
                tally.staged += 1
                tally.allocated += staged.nbytes
                x, source = staged, arena_mod.locate(staged)
        rows = sum(sum(recv) for _, recv in self.segments)
        out = shared_empty((rows, *trail), xt)
        if out is None:
            out = arrays.empty((rows, *trail), like=xt)
        tally.allocated += rows * row_bytes
        result = numpy_view(out)
        sent = received = 0
        for seg, (sends, recvs) in enumerate(self.segments):
            send_at = [sent + o for o in offsets(sends)]
            recv_at = [received + o for o in offsets(recvs)]
            readers = {q: (exchange_tag("rows", seg, c, trail), send_at[q], x.shape[0])
                       for q, c in enumerate(sends) if c and q != rank}
            writers = {p: exchange_tag("rows", seg, c, trail) for p, c in enumerate(recvs) if c and p != rank}
            link.post(source, readers)
            if sends[rank]:
                result[recv_at[rank] : recv_at[rank] + recvs[rank]] = x[send_at[rank] : send_at[rank] + sends[rank]]

            def read(p: int, raw: np.ndarray, start: int, extent: int, recv_at: list[int] = recv_at,
                     recvs: Sequence[int] = recvs) -> str | None:
                if raw.size != extent * row_bytes or start + recvs[p] > extent:
                    return f"rank {p}'s rows do not fit its input ({raw.size} bytes, {extent} rows)"
                theirs = raw.view(x.dtype).reshape((extent, *trail))
                result[recv_at[p] : recv_at[p] + recvs[p]] = theirs[start : start + recvs[p]]
                return None

            link.settle(readers, writers, read, k.op)
            sent, received = sent + sum(sends), received + sum(recvs)
        tally.landing = out
        return out
