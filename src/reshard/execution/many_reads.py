"""Many tensors' batch read in place: its chunks joined into one block of the shared arena,
each rank copying its boxes straight out of its peers' blocks into its results
(``coalesced.ManyRun`` uses it where the engine would pack and the group shares memory); and
the joins of like tensors both routes use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..engines.arena_link import exchange_tag
from .arrays import copy_box, numpy_view

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
        self.places, at = [], _block_aligned(8 * len(chunks))
        for chunk in chunks:
            self.places.append(at)
            at += _block_aligned(len(chunk.members) * box_numel(chunk.step.held) * chunk.itemsize)
        self.nbytes = at
        self.header = np.array(self.places, dtype=np.int64)
        sent: dict[int, list] = {}
        got: dict[int, list] = {}
        self.plan: dict[int, list] = {}  # peer -> [(chunk, its block's shape, bytes, [(in it, in the result)])]
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
                    shape = (rows, *(b - a for a, b in origin))
                    moves.append((c, shape, _numel_shape(shape) * chunk.itemsize, []))
                moves[-1][3].append((box_slices(box, origin), box_slices(box, step.target)))
        self.readers = {q: (exchange_tag("many", tuple(v)), 0, 0) for q, v in sent.items()}
        self.writers = {p: exchange_tag("many", tuple(v)) for p, v in got.items()}
        self.own = [[(box_slices(box, chunk.step.held), box_slices(box, chunk.step.target)) for box in chunk.step.kept
                     if box_numel(box)] for chunk in chunks]

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
            stacked.append(join_into(chunk, xs, block[at : at + _numel_shape(shape) * chunk.itemsize], shape))
        return block, stacked

    def __call__(self, k: Any, joined: tuple[Any, list[Array]], outs: list[Array],
                 result: Any) -> tuple[bool, list[Array]]:
        """(True, []): the batch was read in place, its results in ``outs``. (False, the joined
        chunks, if any): the batch takes the engine's path on every rank (some rank's block is
        not in its arena; each learns it from the notes)."""
        from ..engines import arena as arena_mod

        batch = self.batch
        block, stacked = joined
        if block is None:
            self.link.exchange(None, self.readers, self.writers, None, k.op)
            return False, []
        mine = [numpy_view(s) for s in stacked]
        results: list[Any] = [None] * len(batch.chunks)
        views: list[Any] = [None] * len(batch.chunks)

        def into(c: int) -> Any:
            if views[c] is None:
                results[c] = result(k, batch.chunks[c], stacked[c], outs, shared=True)
                views[c] = numpy_view(results[c])
            return views[c]

        def read(peer: int, raw: Any, start: int, extent: int) -> str | None:
            places = raw[: 8 * len(batch.chunks)].view(np.int64) if raw.size >= 8 * len(batch.chunks) else ()
            for c, shape, nbytes, moves in self.plan[peer]:
                at = int(places[c]) if len(places) else -1
                if at < 0 or at + nbytes > raw.size:
                    return f"rank {peer}'s joined inputs ({raw.size} bytes) do not hold chunk {c} ({nbytes} bytes)"
                theirs = raw[at : at + nbytes].view(self.dtypes[c]).reshape(shape)
                out = into(c)
                for src, dst in moves:
                    copy_box(out[dst], theirs[src])
            return None

        def own() -> None:
            for c, moves in enumerate(self.own):
                out = into(c)
                for src, dst in moves:
                    copy_box(out[dst], mine[c][src])

        if not self.link.exchange(arena_mod.locate(block), self.readers, self.writers, read, k.op, own, keep=block):
            return False, stacked
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
