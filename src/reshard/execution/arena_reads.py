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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .. import settings
from ..engines import arena as arena_mod
from ..engines.arena_link import ArenaLink, exchange_tag
from ..planning.layout import offsets
from ..planning.plan import region_numel as box_size
from ..planning.steps import AllToAll, Box, ExchangeBoxes, with_dim
from .arrays import copy_box, is_torch, numel, numpy_view
from .buffers import shared_empty

Array = Any
Slices = tuple[slice, ...]


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


class RowsPlaced:
    """Where an exchange of rows read in place puts each row it receives: received row ``i``
    (in the order the exchange would stack them) goes to row ``rows[i]`` of the result, so the
    caller's own reordering copy is saved. ``done`` says whether the exchange did it (it did
    not where it took the engine's path)."""

    __slots__ = ("rows", "done")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows, self.done = rows, False


_placed: contextvars.ContextVar[RowsPlaced | None] = contextvars.ContextVar("reshard_rows_placed", default=None)


@contextlib.contextmanager
def _within(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def rows_placed(placed: RowsPlaced | None) -> contextlib.AbstractContextManager[None]:
    """Within: the exchange of rows reads in place puts its rows where ``placed`` says."""
    return _within(_placed, placed)


class RowsTaken:
    """What an exchange of rows sends where its caller did not gather the rows: row ``i`` of
    what it sends is row ``index[i]`` of the array it is given (MoE's tokens, by route). Read in
    place, each peer copies its rows straight out of that array by the index, which the sender
    puts beside it in its arena, so the gather and the exchange's copy are one copy. Elsewhere
    ``gather(x, index)`` makes the rows first (the caller's own gather)."""

    __slots__ = ("index", "gather")

    def __init__(self, index: np.ndarray, gather: Callable[[Array, np.ndarray], Array]) -> None:
        self.index, self.gather = index, gather


_taken: contextvars.ContextVar[RowsTaken | None] = contextvars.ContextVar("reshard_rows_taken", default=None)


def rows_taken(taken: RowsTaken | None) -> contextlib.AbstractContextManager[None]:
    """Within: the exchange of rows sends its input's rows that ``taken`` names."""
    return _within(_taken, taken)


def taken_rows(k: Any, xt: Array) -> Array:
    """The rows an exchange of rows sends: ``xt``, or within ``rows_taken`` its rows by the
    index, gathered now (one pack copy in the call's tally)."""
    taken = _taken.get()
    if taken is None:
        return xt
    if not len(taken.index):
        return xt[:0]
    k.tally.packs += 1
    return taken.gather(xt, taken.index)


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


def engine_path(k: Any, xt: Array, inner: Any, prepared: Any) -> Array:
    """The step on the engine's own path (``inner``, its form), its result in the arena so that
    the next exchange of a chain reads it in place. Its copies are counted apart
    (``tally.staged``: a hot replay that reads in place next time reports its own), with the
    counts its form declares."""
    tally = k.tally
    packs = tally.packs
    with arena_mod.results_here():
        out = inner(k, xt, prepared)
    for field, value in getattr(inner, "counts", ()):
        if field == "pack_copies":
            tally.packs += value
        elif field == "allocated_bytes":
            tally.allocated += value
    tally.staged += tally.packs - packs
    tally.packs = packs
    if getattr(inner, "receives_result", False):
        tally.landing = out
    return out


class ArenaReads:
    """``run(call, x, prepared=None)`` for one exchange as reads in place where every rank's
    input lies in its arena; else the step's own form (``inner``), which gets ``prepared``."""

    def __init__(self, link: ArenaLink, out_shape: Sequence[int], fill_op: str | None,
                 own: list[tuple[Slices, Slices]], readers: dict[int, tuple[int, int, int]],
                 writers: dict[int, int], read_plan: Any, inner: Any, in_arena: bool = True,
                 finish: Any = None) -> None:
        self.link, self.out_shape, self.fill_op = link, tuple(out_shape), fill_op
        self.own, self.readers, self.writers = own, readers, writers
        self.read_plan = read_plan  # (peer, start, extent) -> (its input's shape, [(in it, in the result)])
        self.inner = inner
        self.in_arena = in_arena  # the result in the arena (not for a buffer the step reduces at once)
        self.finish = finish  # (call, what was read) -> the step's result, on the reads' path only
        self.receives_result = False

    def __call__(self, k: Any, xt: Array, prepared: Any = None) -> Array:
        tally, arrays = k.tally, k.arrays
        x = numpy_view(xt)
        source = arena_mod.locate(x)
        out = result = None
        if source is not None:
            out = shared_empty(self.out_shape, xt) if self.in_arena else None
            if out is None:
                out = arrays.empty(self.out_shape, like=xt)
            if self.fill_op is not None:
                out = arrays.full_like(out, arrays.identity(xt, self.fill_op))
            result = numpy_view(out)

        def read(peer: int, raw: np.ndarray, start: int, extent: int) -> str | None:
            shape, boxes = self.read_plan(peer, start, extent)
            if numel(shape) * x.itemsize != raw.size:
                return f"rank {peer}'s input is {raw.size} bytes where {numel(shape) * x.itemsize} were expected"
            theirs = raw.view(x.dtype).reshape(shape)
            for src, dst in boxes:
                copy_box(result[dst], theirs[src])
            return None

        def own() -> None:
            for src, dst in self.own:
                copy_box(result[dst], x[src])

        if not self.link.exchange(source, self.readers, self.writers, read, k.op, own):
            return engine_path(k, xt, self.inner, prepared)
        tally.allocated += numel(self.out_shape) * arrays.itemsize(xt)
        tally.landing = out
        return out if self.finish is None else self.finish(k, out)


def all_to_all_reads(link: ArenaLink, rank: int, g: AllToAll, inner: Any) -> ArenaReads:
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

    return ArenaReads(link, g.out_shape, None, own, readers, writers, read_plan, inner)


def boxes_reads(link: ArenaLink, step: ExchangeBoxes, inner: Any) -> ArenaReads:
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

    return ArenaReads(link, tuple(b - a for a, b in target), step.fill_op, own, readers, writers, read_plan, inner)



def _cut(ndim: int, dim: int, start: int, length: int) -> Slices:
    return tuple(slice(start, start + length) if d == dim else slice(None) for d in range(ndim))


def gather_reads(link: ArenaLink, rank: int, in_shape: Sequence[int], dim: int, lengths: Sequence[int],
                 inner: Any) -> ArenaReads:
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

    return ArenaReads(link, with_dim(in_shape, dim, sum(lengths)), None, own, readers, writers, read_plan, inner)


def scatter_reads(link: ArenaLink, rank: int, size: int, in_shape: Sequence[int], dim: int,
                  inner: Any, finish: Any) -> ArenaReads:
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

    return ArenaReads(link, (size, *pieces[rank]), None, own, readers, writers, read_plan, inner, in_arena=False,
                      finish=finish)


class RowsReads:
    """``run(call, x, prepared=None)`` for an exchange of rows (``steps.AllToAllV``) as reads in
    place where every rank's rows lie in its arena: per segment, each rank copies its rows out
    of every peer's input (at the row the peer's note gives, or by the peer's index where its
    rows are taken, ``rows_taken``) into its block of the result, one round of notes per
    segment; else the step's own form (``inner``) on the rows."""

    def __init__(self, link: ArenaLink, rank: int, segments: Sequence[tuple[Sequence[int], Sequence[int]]],
                 inner: Any) -> None:
        self.link, self.rank, self.segments, self.inner = link, rank, segments, inner
        self.lends = any(c for sends, _ in segments for q, c in enumerate(sends) if q != rank)  # peers read from it
        self.receives_result = False

    def __call__(self, k: Any, xt: Array, prepared: Any = None) -> Array:
        tally, arrays, rank, link, lends = k.tally, k.arrays, self.rank, self.link, self.lends
        x = numpy_view(xt)
        # where no peer reads from this rank, its input is ready wherever it lies
        source = arena_mod.locate(x) if lends else (0, 0)
        taken, index_at = _taken.get(), None
        if taken is not None and lends and source is not None:  # the index beside the rows it names
            index_at = link.index_for(taken.index)
        if taken is not None and lends and index_at is None:  # gathered now, as the caller would have
            xt = taken_rows(k, xt)
            x, taken = numpy_view(xt), None
            source = arena_mod.locate(x)
        trail = tuple(x.shape[1:])
        row_bytes = numel(trail) * x.itemsize
        rows = sum(sum(recv) for _, recv in self.segments)
        out = result = None
        placed = _placed.get()
        if placed is not None and len(placed.rows) != rows:
            placed = None
        if source is not None:
            out = shared_empty((rows, *trail), xt)
            if out is None:
                out = arrays.empty((rows, *trail), like=xt)
            result = numpy_view(out)
        dest = placed.rows if placed is not None else None

        def put(at: int, count: int, rows_: np.ndarray, which: np.ndarray | None = None) -> None:
            """Received rows ``at .. at + count`` (``rows_``, or its rows ``which``) into the
            result: in order, or where ``placed`` says."""
            if dest is None and which is not None:
                np.take(rows_, which, axis=0, out=result[at : at + count], mode="clip")  # bounds checked
            elif dest is None:
                result[at : at + count] = rows_
            else:
                result[dest[at : at + count]] = rows_ if which is None else rows_[which]

        sent = received = 0
        for seg, (sends, recvs) in enumerate(self.segments):
            send_at = [sent + o for o in offsets(sends)]
            recv_at = [received + o for o in offsets(recvs)]
            readers = {q: (exchange_tag("rows", seg, c, trail), send_at[q], x.shape[0])
                       for q, c in enumerate(sends) if c and q != rank}
            writers = {p: exchange_tag("rows", seg, c, trail) for p, c in enumerate(recvs) if c and p != rank}

            def read(p: int, raw: np.ndarray, start: int, extent: int, recv_at: list[int] = recv_at,
                     recvs: Sequence[int] = recvs, index: np.ndarray | None = None) -> str | None:
                count = recvs[p]
                if raw.size != extent * row_bytes or index is None and start + count > extent:
                    return f"rank {p}'s rows do not fit its input ({raw.size} bytes, {extent} rows)"
                theirs = raw.view(x.dtype).reshape((extent, *trail))
                if index is None:
                    put(recv_at[p], count, theirs[start : start + count])
                    return None
                named = index.view(np.int64)
                which = named[start : start + count]
                if len(which) != count or count and not 0 <= int(which.min()) <= int(which.max()) < extent:
                    return f"rank {p}'s index names rows outside its input ({extent} rows)"
                put(recv_at[p], count, theirs, which)
                return None

            def own(send_at: list[int] = send_at, recv_at: list[int] = recv_at, sends: Sequence[int] = sends,
                    recvs: Sequence[int] = recvs) -> None:
                if not sends[rank]:
                    return
                if taken is None:
                    put(recv_at[rank], recvs[rank], x[send_at[rank] : send_at[rank] + sends[rank]])
                else:
                    put(recv_at[rank], recvs[rank], x, taken.index[send_at[rank] : send_at[rank] + sends[rank]])

            # the same answer every segment
            if not link.exchange(source, readers, writers, read, k.op, own, index=index_at):
                return engine_path(k, xt if taken is None else taken_rows(k, xt), self.inner, prepared)
            sent, received = sent + sum(sends), received + sum(recvs)
        if placed is not None:
            placed.done = True
        tally.allocated += rows * row_bytes
        tally.landing = out
        return out
