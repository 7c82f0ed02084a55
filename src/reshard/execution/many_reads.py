"""Many tensors' batch read in place: its chunks joined into one block of the shared arena,
each rank copying its boxes straight out of its peers' blocks into its results
(``coalesced.ManyRun`` uses it where the engine would pack and the group shares memory); and
the joins of like tensors both routes use.

A chunk whose boxes on this rank cut only its last dim, into equal runs of a few items (the
row -> column change of many small tensors), is joined piece by piece: each run's rows of
every tensor end to end. The join then copies short runs (as the engine's pack would), and
each reader copies one long run per tensor instead of many short ones out of memory another
core just wrote. The block's header says, per chunk, where it starts and the run width (0:
joined whole), so a reader follows the writer's choice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..engines.arena_link import exchange_tag
from .arrays import RUN_ITEM_MAX_BYTES, copy_box, numpy_view

Array = Any
Box = tuple[tuple[int, int], ...]
BLOCK_ALIGN = 64  # a chunk's place in a joined block: a cache line, so the copies in and out start aligned


def box_numel(box: Box) -> int:
    """The elements of ``box`` (``((start, stop), ...)``)."""
    n = 1
    for a, b in box:
        n *= b - a
    return n


def box_slices(box: Box, origin: Box) -> tuple[slice, ...]:
    """``box`` of every tensor of a stacked chunk (its leading dim: the tensors) whose tensors
    cover ``origin``."""
    return (slice(None),) + tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


class BatchReads:
    """A batch as reads in place: where each chunk lies in this rank's joined block (after a
    header of those places), what each peer reads of it, and what this rank reads of each
    peer's block into which result."""

    def __init__(self, link: Any, batch: Any, dtypes: list[np.dtype]):
        self.link, self.batch, self.dtypes = link, batch, dtypes
        chunks = batch.chunks
        self.places, at = [], _block_aligned(16 * len(chunks))
        # a chunk whose boxes cut its last dim into equal runs is joined piece by piece (each
        # piece's rows end to end): its readers then copy long runs out of a peer's block, not
        # short ones; the copy in costs about the same
        self.widths = [_even_last_cut(chunk.step, chunk.itemsize) for chunk in chunks]
        for chunk in chunks:
            self.places.append(at)
            at += _block_aligned(len(chunk.members) * box_numel(chunk.step.held) * chunk.itemsize)
        self.nbytes = at
        self.header = np.array(self.places + self.widths, dtype=np.int64)
        sent: dict[int, list] = {}
        got: dict[int, list] = {}
        self.plan: dict[int, list] = {}  # peer -> [(chunk, its rows, the peer's held box, [(box, in the result)])]
        for c, chunk in enumerate(chunks):
            rows, step = len(chunk.members), chunk.step
            sources = dict(step.sources)
            for peer, box, _, _ in chunk.sends:
                sent.setdefault(peer, []).append((c, rows, step.held, box))
            for peer, box, _, _ in chunk.recvs:
                origin = sources[peer]
                got.setdefault(peer, []).append((c, rows, origin, box))
                moves = self.plan.setdefault(peer, [])
                if not moves or moves[-1][0] != c:
                    moves.append((c, rows, origin, []))
                moves[-1][3].append((box, box_slices(box, step.target)))
        self.readers = {q: (exchange_tag("many", tuple(v)), 0, 0) for q, v in sent.items()}
        self.writers = {p: exchange_tag("many", tuple(v)) for p, v in got.items()}
        self.own = [[(box, box_slices(box, chunk.step.target)) for box in chunk.step.kept if box_numel(box)]
                    for chunk in chunks]

    def join(self, xs: Sequence[Array]) -> tuple[Any, list[Array]]:
        """The batch's chunks joined into a new block of the arena after its header: (the block,
        each chunk's inputs stacked there); (None, []) where the arena has no room."""
        from ..engines import arena as arena_mod

        block = arena_mod.numpy_array((self.nbytes,), np.uint8)
        if block is None:
            return None, []
        block[: self.header.nbytes] = self.header.view(np.uint8)
        stacked = []
        for c, chunk in enumerate(self.batch.chunks):
            shape = (len(chunk.members), *(b - a for a, b in chunk.step.held))
            at = self.places[c]
            place = block[at : at + _numel_shape(shape) * chunk.itemsize]
            if self.widths[c]:
                stacked.append(join_pieces(chunk, xs, place, shape, self.widths[c]))
            else:
                stacked.append(join_into(chunk, xs, place, shape))
        return block, stacked

    def __call__(self, k: Any, joined: tuple[Any, list[Array]], outs: list[Array],
                 result: Any) -> tuple[bool, list[Array]]:
        """(True, []): the batch was read in place, its results in ``outs``. (False, the joined
        chunks where all were joined whole, else []): the batch takes the engine's path on every
        rank (some rank's block is not in its arena; each learns it from the notes)."""
        from ..engines import arena as arena_mod

        batch = self.batch
        block, stacked = joined
        if block is None:
            self.link.exchange(None, self.readers, self.writers, None, k.op)
            return False, []
        results: list[Any] = [None] * len(batch.chunks)
        views: list[Any] = [None] * len(batch.chunks)

        def into(c: int) -> Any:
            if views[c] is None:
                results[c] = result(k, batch.chunks[c], stacked[c], outs, shared=True)
                views[c] = numpy_view(results[c])
            return views[c]

        count = len(batch.chunks)

        def read(peer: int, raw: Any, start: int, extent: int) -> str | None:
            header = raw[: 16 * count].view(np.int64) if raw.size >= 16 * count else ()
            for c, rows, origin, moves in self.plan[peer]:
                at, width = (int(header[c]), int(header[count + c])) if len(header) else (-1, 0)
                out = into(c)
                for box, dst in moves:
                    theirs, src = piece_of(raw, at, width, rows, origin, box, self.dtypes[c])
                    if theirs is None:
                        return (f"rank {peer}'s joined inputs ({raw.size} bytes) do not hold chunk {c} "
                                f"(at {at}, runs of {width} items)")
                    copy_box(out[dst], theirs[src])
            return None

        def own() -> None:  # this rank's own boxes, out of its own block as a peer reads them
            for c, moves in enumerate(self.own):
                out = into(c)
                chunk = batch.chunks[c]
                for box, dst in moves:
                    theirs, src = piece_of(block, self.places[c], self.widths[c], len(chunk.members), chunk.step.held,
                                           box, self.dtypes[c])
                    copy_box(out[dst], theirs[src])

        if not self.link.exchange(arena_mod.locate(block), self.readers, self.writers, read, k.op, own, keep=block):
            return False, [] if any(self.widths) else stacked  # chunks joined by piece: stacked anew
        return True, []


def members_of(chunk: Any, xs: Sequence[Array]) -> list[Array]:
    first, count = chunk.members[0], len(chunk.members)
    if chunk.members[-1] - first == count - 1:  # consecutive (the usual case): one slice
        return list(xs[first : first + count])
    return [xs[i] for i in chunk.members]


def c_contiguous(members: list[Array]) -> bool:
    if type(members[0]) is np.ndarray:
        return all([m.flags.c_contiguous for m in members])
    return all([m.is_contiguous() for m in members])


def numpy_dtype(x: Array) -> np.dtype:
    """The numpy dtype whose copies move ``x``'s items (an unsigned int of its size where numpy
    has no twin of a torch dtype)."""
    return numpy_view(x.reshape(-1)[:0]).dtype


def _even_last_cut(step: Any, itemsize: int) -> int:
    """The width of the runs (items) that ``step``'s boxes on this rank (sent and kept) cut
    its held box's last dim into, where they cut only that dim, into equal runs of at most
    ``RUN_ITEM_MAX_BYTES`` bytes, over 2-D boxes and up; else 0."""
    held = step.held
    boxes = [box for _, box in step.sends if box_numel(box)] + [box for box in step.kept if box_numel(box)]
    if len(held) < 2 or len(boxes) < 2:
        return 0
    lo, hi = held[-1]
    width = boxes[0][-1][1] - boxes[0][-1][0]
    if width * itemsize > RUN_ITEM_MAX_BYTES or (hi - lo) % width:
        return 0
    starts = set()
    for box in boxes:
        (a, b) = box[-1]
        if box[:-1] != held[:-1] or b - a != width or (a - lo) % width:
            return 0
        starts.add(a)
    return width if len(starts) == len(boxes) == (hi - lo) // width else 0


def piece_of(raw: Any, at: int, width: int, rows: int, origin: Box, box: Box,
             dtype: np.dtype) -> tuple[Any, tuple[slice, ...]]:
    """Where ``box`` lies in a peer's joined chunk (``raw``: its block's bytes; the chunk at
    byte ``at``, joined whole or, with ``width``, piece by piece): (the stacked piece or chunk
    that holds it, ``box``'s slices there); (None, ()) where the block cannot hold it."""
    shape = [rows, *(b - a for a, b in origin)]
    nbytes = _numel_shape(shape) * dtype.itemsize
    if at < 0 or at + nbytes > raw.size or (width and (width < 1 or shape[-1] % width)):
        return None, ()
    if not width or not shape[-1]:
        return raw[at : at + nbytes].view(dtype).reshape(shape), box_slices(box, origin)
    lo, pieces = origin[-1][0], shape[-1] // width
    q = min(max(box[-1][0] - lo, 0) // width, pieces - 1)  # an empty box at the end: the last piece's
    first = box[-1][0] - lo - q * width
    if first < 0 or first + box[-1][1] - box[-1][0] > width:
        return None, ()
    piece = nbytes // pieces
    shape[-1] = width
    inner = ((q * width + lo, q * width + lo + width),)
    return (raw[at + q * piece : at + (q + 1) * piece].view(dtype).reshape(shape),
            box_slices(box, origin[:-1] + inner))


def _block_aligned(n: int) -> int:
    return -(-n // BLOCK_ALIGN) * BLOCK_ALIGN


def _numel_shape(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def join_into(chunk: Any, xs: Sequence[Array], place: Any, shape: tuple[int, ...]) -> Array:
    """The chunk's inputs joined end to end into ``place`` (uint8 numpy bytes of the block),
    as one array of the inputs' kind of ``shape`` (a new leading dim): one copy."""
    members = members_of(chunk, xs)
    first = members[0]
    if type(first).__module__ == "numpy":
        return fill(place.view(first.dtype).reshape(shape), members)
    import torch

    return fill(torch.from_numpy(place).view(first.dtype).view(shape), members)


def join_pieces(chunk: Any, xs: Sequence[Array], place: Any, shape: tuple[int, ...], width: int) -> Array:
    """The chunk's inputs joined into ``place`` piece by piece: the runs of ``width`` items
    along the last dim, each piece (all members' rows of it) end to end. Returns the block as
    an array of the inputs' kind, ``[pieces, *shape[:-1], width]``."""
    members = members_of(chunk, xs)
    first = members[0]
    if type(first) is not np.ndarray:
        members = [numpy_view(m) for m in members]
    pieces = shape[-1] // width
    lead = _numel_shape(shape[:-1])
    # joined whole first, then every run moved to its piece as one item: numpy moves items of
    # a run's size faster than it joins many arrays into a strided place (0.85x the time)
    joined = fill(np.empty(shape, members[0].dtype), members)
    run = np.dtype((np.void, width * chunk.itemsize))
    np.copyto(place.view(run).reshape((pieces, lead)), joined.reshape((lead, shape[-1])).view(run).T)
    by_piece = place.view(numpy_dtype(first)).reshape((pieces, *shape[:-1], width))
    if type(first).__module__ == "numpy":
        return by_piece.view(first.dtype)
    import torch

    return torch.from_numpy(by_piece).view(first.dtype)


def fill(out: Array, members: list[Array]) -> Array:
    """``out`` (C-ordered, ``[len(members), *shape]``) holding ``members`` in order: one copy."""
    if type(out).__module__ == "numpy":
        if out.ndim > 1:
            np.concatenate(members, out=out.reshape((out.shape[0] * out.shape[1], *out.shape[2:])))
        else:
            out[...] = members
        return out
    import torch

    if out.dim() > 1:
        torch.cat(members, out=out.view((out.shape[0] * out.shape[1], *out.shape[2:])))
    else:
        torch.stack(members, out=out)
    return out
