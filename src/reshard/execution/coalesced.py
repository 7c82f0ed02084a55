"""Many tensors' layout changes as one program on this rank: every tensor's exchange of boxes
travels in the same messages, one per peer and direction, so a call on 256 small tensors
costs about what one call on their bytes costs.

Each tensor is one of three parts: ``same`` (its layout does not change: the input is the
result), ``boxes`` (a change that reduces nothing: its boxes join the shared exchange) or
``own`` (Partial values reduced or filled: its own plan, run in the same call). Tensors of
``boxes`` with the same local shape, dtype, layouts and global shape form a group whose boxes
are the same on this rank: the group is stacked along a new leading dim and moves as one
tensor, so packing costs a copy per peer and group, not per tensor. The shared exchange runs
in batches of groups (a big group cut into chunks) whose global bytes add up to at most the
largest tensor's (4 MiB at least; the same on every rank): its buffers (the inputs joined, the
pack, the receive buffer) grow with a batch, not with the whole list. In each message a chunk's piece starts at a multiple of
16 bytes: both ends work out the same offsets from the same boxes.

Where the group shares memory (``engines.arena_link``) and a batch is large enough, its chunks
are joined into one block of the shared arena and each rank copies its boxes straight out of
its peers' blocks into its results: one copy to join, one to move, one round of notes per
batch. The block starts with the offset of each chunk in it (the ranks' blocks differ in size
where shapes are uneven), so a reader finds every chunk without asking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engines.arena_link import exchange_tag
from ..planning.steps import ExchangeBoxes
from . import arena_reads
from .buffers import pack_buffer, shared_empty
from .execute import PlanRun
from .stats import ExchangeStats, ExecutedStep

Array = Any
Box = tuple[tuple[int, int], ...]
ALIGN = 16
BLOCK_ALIGN = 64  # a chunk's place in a joined block: a cache line, so the copies in and out start aligned
MIN_BATCH_BYTES = 4 << 20  # small tensors always share one batch


def _numel(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def _slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return (slice(None),) + tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Part:
    """One tensor's part of the call on this rank."""

    kind: str  # "same", "boxes" or "own"
    step: ExchangeBoxes | None = None  # kind "boxes"
    run: PlanRun | None = None  # kind "own"
    global_bytes: int = 0
    group: Any = None  # kind "boxes": what tensors of one group share (local shape, dtype, boxes)


@dataclass
class _Chunk:
    """Tensors of one group moved together: stacked, they are one tensor of ``len(members)``
    more rows along a new leading dim."""

    members: list[int]
    step: ExchangeBoxes
    itemsize: int
    sends: list[tuple[int, Box, int, int]] = field(default_factory=list)  # (peer, box, offset, bytes)
    recvs: list[tuple[int, Box, int, int]] = field(default_factory=list)


class _Batch:
    """Chunks exchanged together: per peer, each chunk's piece at a fixed byte offset of one message."""

    def __init__(self, chunks: list[_Chunk], rank: int):
        self.chunks = chunks
        self.send_sizes: dict[int, int] = {}
        self.recv_sizes: dict[int, int] = {}
        for chunk in chunks:
            rows = len(chunk.members)
            for pairs, table, sizes in ((chunk.step.sends, chunk.sends, self.send_sizes),
                                        (chunk.step.recvs, chunk.recvs, self.recv_sizes)):
                for peer, box in pairs:
                    n = rows * _numel(box) * chunk.itemsize
                    if peer == rank or not n:
                        continue
                    at = sizes.get(peer, 0)
                    table.append((peer, box, at, n))
                    sizes[peer] = at + _aligned(n)
        self.send_peers, self.recv_peers = sorted(self.send_sizes), sorted(self.recv_sizes)
        self.send_at = _starts(self.send_peers, self.send_sizes)
        self.recv_at = _starts(self.recv_peers, self.recv_sizes)
        self.send_total, self.recv_total = sum(self.send_sizes.values()), sum(self.recv_sizes.values())
        self.sent = sum(n for c in chunks for _, _, _, n in c.sends)
        self.received = sum(n for c in chunks for _, _, _, n in c.recvs)
        self.reads: _Reads | None = None  # the batch as reads in place, where the group shares memory


class _Reads:
    """A batch as reads in place: where each chunk lies in this rank's joined block (after a
    header of those places), what each peer reads of it, and what this rank reads of each
    peer's block into which result."""

    def __init__(self, link: Any, batch: _Batch, dtypes: list[np.dtype]):
        self.link, self.batch, self.dtypes = link, batch, dtypes
        chunks = batch.chunks
        self.places, at = [], _block_aligned(8 * len(chunks))
        for chunk in chunks:
            self.places.append(at)
            at += _block_aligned(len(chunk.members) * _numel(chunk.step.held) * chunk.itemsize)
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
                moves[-1][3].append((_slices(box, origin), _slices(box, step.target)))
        self.readers = {q: (exchange_tag("many", tuple(v)), 0, 0) for q, v in sent.items()}
        self.writers = {p: exchange_tag("many", tuple(v)) for p, v in got.items()}
        self.own = [[(_slices(box, chunk.step.held), _slices(box, chunk.step.target)) for box in chunk.step.kept
                     if _numel(box)] for chunk in chunks]

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
            stacked.append(_join(chunk, xs, block[at : at + _numel_shape(shape) * chunk.itemsize], shape))
        return block, stacked

    def __call__(self, k: Any, joined: tuple[Any, list[Array]], outs: list[Array],
                 result: Any) -> tuple[bool, list[Array]]:
        """(True, []): the batch was read in place, its results in ``outs``. (False, the joined
        chunks, if any): the batch takes the engine's path on every rank (some rank's block is
        not in its arena; each learns it from the notes)."""
        from ..engines import arena as arena_mod

        batch, stats = self.batch, k.stats
        block, stacked = joined
        if block is None:
            self.link.exchange(None, self.readers, self.writers, None, k.op)
            return False, []
        mine = [arena_reads.numpy_view(s) for s in stacked]
        results: list[Any] = [None] * len(batch.chunks)
        views: list[Any] = [None] * len(batch.chunks)

        def into(c: int) -> Any:
            if views[c] is None:
                results[c] = result(k, batch.chunks[c], stacked[c], outs, shared=True)
                views[c] = arena_reads.numpy_view(results[c])
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
                    np.copyto(out[dst], theirs[src])
            return None

        def own() -> None:
            for c, moves in enumerate(self.own):
                out = into(c)
                for src, dst in moves:
                    np.copyto(out[dst], mine[c][src])

        if not self.link.exchange(arena_mod.locate(block), self.readers, self.writers, read, k.op, own, keep=block):
            return False, stacked
        stats.allocated_bytes += self.nbytes
        stats.bytes_sent += batch.sent
        stats.bytes_received += batch.received
        stats.pack_copies += 1  # the join: the one copy before the peers read
        stats.steps.append(ExecutedStep("all_to_all", batch.sent, batch.received))
        return True, []


def _members(chunk: _Chunk, xs: Sequence[Array]) -> list[Array]:
    first, count = chunk.members[0], len(chunk.members)
    if chunk.members[-1] - first == count - 1:  # consecutive (the usual case): one slice
        return list(xs[first : first + count])
    return [xs[i] for i in chunk.members]


def _c_contiguous(members: list[Array]) -> bool:
    if type(members[0]) is np.ndarray:
        return all([m.flags.c_contiguous for m in members])
    return all([m.is_contiguous() for m in members])


def _numpy_dtype(x: Array) -> np.dtype:
    """The numpy dtype whose copies move ``x``'s items (an unsigned int of its size where numpy
    has no twin of a torch dtype)."""
    return arena_reads.numpy_view(x.reshape(-1)[:0]).dtype


def _block_aligned(n: int) -> int:
    return -(-n // BLOCK_ALIGN) * BLOCK_ALIGN


def _numel_shape(shape: Sequence[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def _join(chunk: _Chunk, xs: Sequence[Array], place: Any, shape: tuple[int, ...]) -> Array:
    """The chunk's inputs joined end to end into ``place`` (uint8 numpy bytes of the block),
    as one array of the inputs' kind of ``shape`` (a new leading dim): one copy."""
    members = _members(chunk, xs)
    first = members[0]
    if type(first).__module__ == "numpy":
        return _fill(place.view(first.dtype).reshape(shape), members)
    import torch

    return _fill(torch.from_numpy(place).view(first.dtype).view(shape), members)


def _fill(out: Array, members: list[Array]) -> Array:
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


def _starts(peers: list[int], sizes: dict[int, int]) -> dict[int, int]:
    out, at = {}, 0
    for p in peers:
        out[p] = at
        at += sizes[p]
    return out


class ManyRun:
    """The program of one call on many tensors; calling it on the (converted, detached)
    inputs returns their results, recording the call's stats (and each tensor's, the same
    every run: worked out here)."""

    def __init__(self, parts: list[Part], itemsizes: list[int], rank: int, call: Any = None, xs: Sequence[Array] = ()):
        self.parts = parts
        self.rank = rank
        groups: dict[Any, list[int]] = {}
        for i, p in enumerate(parts):
            if p.kind == "boxes":
                groups.setdefault(p.group, []).append(i)
        self.local_groups: list[_Chunk] = []  # nothing moves anywhere: what each rank keeps
        moving: list[_Chunk] = []
        cap = max([MIN_BATCH_BYTES] + [p.global_bytes for p in parts if p.kind == "boxes"])
        for members in groups.values():
            step = parts[members[0]].step
            per = max(1, cap // max(1, parts[members[0]].global_bytes))
            for k in range(0, len(members), per):
                chunk = _Chunk(members[k : k + per], step, itemsizes[members[0]])
                (moving if step.moves else self.local_groups).append(chunk)
        self.batches: list[_Batch] = []
        batch: list[_Chunk] = []
        total = 0
        for chunk in moving:
            size = sum(parts[i].global_bytes for i in chunk.members)
            if batch and total + size > cap:
                self.batches.append(_Batch(batch, rank))
                batch, total = [], 0
            batch.append(chunk)
            total += size
        if batch:
            self.batches.append(_Batch(batch, rank))
        # An engine that moves boxes by datatypes (MPI's Alltoallw) takes each chunk stacked as it
        # is: nothing packed or unpacked, its own part moved in the same call
        self.forms: dict[int, Any] = {}
        self.gathers: dict[int, Any] = {}  # the same exchange straight from each tensor, no join (MPI)
        maker = getattr(call.primitives, "boxes_form", None) if call is not None else None
        for b in self.batches if maker is not None else ():
            for chunk in b.chunks:
                rows = ((0, len(chunk.members)),)
                s = chunk.step
                stacked_step = ExchangeBoxes(rows + s.held, rows + s.target, tuple((p, rows + box) for p, box in s.sends),
                                             tuple((p, rows + box) for p, box in s.recvs),
                                             tuple(rows + box for box in s.kept), None, True)
                like = xs[chunk.members[0]]
                proto = call.arrays.empty((len(chunk.members), *(hi - lo for lo, hi in s.held)), like=like)
                form = maker(call, proto, stacked_step)
                if form is None:
                    self.forms.clear()
                    self.gathers.clear()
                    break
                self.forms[id(chunk)] = form
                gather = getattr(call.primitives, "members_form", None)
                direct = gather(call, like, s, len(chunk.members)) if gather is not None else None
                if direct is not None:  # straight from each tensor where all are C-contiguous: no join
                    self.gathers[id(chunk)] = direct
        self.same = [i for i, p in enumerate(parts) if p.kind == "same"]
        self.own = [i for i, p in enumerate(parts) if p.kind == "own"]
        # Where the engine would pack and unpack (no form for boxes) and the group shares memory,
        # a large enough batch is read in place instead (the same answer on every rank: the
        # batch's global bytes decide, and the link is made collectively). MPI's form moves the
        # chunks by datatypes, nothing packed: reads in place measured slower there.
        x0 = xs[0] if xs else None
        if call is not None and x0 is not None and not self.forms and arena_reads.allowed(x0):
            for b in self.batches:
                nbytes = sum(parts[i].global_bytes for chunk in b.chunks for i in chunk.members)
                link = arena_reads.link_for(call.primitives, nbytes, 1)
                if link is not None:
                    b.reads = _Reads(link, b, [_numpy_dtype(xs[c.members[0]]) for c in b.chunks])
        self.tensor_stats = [ExchangeStats("redistribute") for _ in parts]
        for b in self.batches:
            for chunk in b.chunks:
                rows = len(chunk.members)
                sent = sum(n for _, _, _, n in chunk.sends) // rows
                received = sum(n for _, _, _, n in chunk.recvs) // rows
                for i in chunk.members:
                    mine = self.tensor_stats[i]
                    mine.bytes_sent, mine.bytes_received = sent, received
                    mine.steps = [ExecutedStep("all_to_all", sent, received)]

    def prepare(self, k: Any, xs: Sequence[Array]) -> list[tuple[Any, list[Array]]]:
        """The first batch's chunks joined (the call's local work before any exchange; a replay
        does it while its check travels): (its block in the arena or None, each chunk stacked).
        Only the first: a batch's buffers are alive one at a time."""
        return [self._joined(b, xs) for b in self.batches[:1]]

    def _joined(self, batch: _Batch, xs: Sequence[Array]) -> tuple[Any, list[Array]]:
        if batch.reads is not None:
            return batch.reads.join(xs)
        return None, [] if self.gathers else [self._stack(c, xs) for c in batch.chunks]

    def __call__(self, k: Any, xs: Sequence[Array], prepared: Any = None) -> list[Array]:
        stats = k.stats
        outs: list[Array] = [None] * len(xs)
        for i in self.same:
            outs[i] = xs[i]
        for chunk in self.local_groups:
            self._keep(k, chunk, self._stack(chunk, xs), outs)
        for b, batch in enumerate(self.batches):
            joined = prepared[b] if prepared is not None and b < len(prepared) else self._joined(batch, xs)
            self._exchange(k, batch, xs, outs, joined)
        for i in self.own:  # its own steps, recorded in the call's stats as they run
            before = (stats.bytes_sent, stats.bytes_received, len(stats.steps))
            outs[i] = self.parts[i].run(k, xs[i])
            mine = self.tensor_stats[i]
            mine.bytes_sent, mine.bytes_received = stats.bytes_sent - before[0], stats.bytes_received - before[1]
            mine.steps = stats.steps[before[2]:]
        stats.tensors = self.tensor_stats
        tally = k.tally
        tally.packs = tally.unpacks = tally.allocated = 0
        tally.landing = None
        stats.metadata_exchanges = k.checks
        stats.replayed = k.replaying
        return outs

    @staticmethod
    def _stack(chunk: _Chunk, xs: Sequence[Array]) -> Array:
        """The chunk's inputs as one array (of their kind) with a new leading dim: one copy,
        joined end to end (numpy's and torch's ``stack`` cost more per array)."""
        members = _members(chunk, xs)
        first = members[0]
        shape = (len(members), *first.shape)
        # into a new C-ordered array: concatenating F-ordered inputs alone would give F order
        out = np.empty(shape, first.dtype) if type(first).__module__ == "numpy" else first.new_empty(shape)
        return _fill(out, members)

    def _keep(self, k: Any, chunk: _Chunk, stacked: Array, outs: list[Array]) -> Array:
        """The chunk's results, as one stacked array (of the inputs' kind) with what this rank
        keeps of its own in it."""
        out = self._result(k, chunk, stacked, outs)
        step = chunk.step
        for box in step.kept:
            out[_slices(box, step.target)] = stacked[_slices(box, step.held)]
        return out

    def _result(self, k: Any, chunk: _Chunk, stacked: Array, outs: list[Array], shared: bool = False) -> Array:
        """The chunk's results: one new stacked array of the inputs' kind (in the shared arena
        with ``shared``, where it has room), each tensor's a view."""
        step = chunk.step
        shape = (len(chunk.members), *(b - a for a, b in step.target))
        out = shared_empty(shape, stacked) if shared else None
        if out is None:
            out = np.empty(shape, dtype=stacked.dtype) if type(stacked).__module__ == "numpy" else stacked.new_empty(shape)
        k.stats.allocated_bytes += len(chunk.members) * _numel(step.target) * chunk.itemsize
        first, count = chunk.members[0], len(chunk.members)
        if chunk.members[-1] - first == count - 1:  # consecutive tensors (the usual case): one slice
            outs[first : first + count] = list(out)
        else:
            for i, one in zip(chunk.members, out):
                outs[i] = one
        return out

    def _exchange(self, k: Any, batch: _Batch, xs: Sequence[Array], outs: list[Array],
                  joined: tuple[Any, list[Array]]) -> None:
        """The batch read in place where it can be (``batch.reads``), else one message per peer
        and direction: its pieces packed, exchanged, unpacked. ``joined``: the chunks stacked
        already (``prepare``), if they are."""
        arrays, stats = k.arrays, k.stats
        ready = joined[1]
        if batch.reads is not None:
            done, ready = batch.reads(k, joined, outs, self._result)
            if done:
                return
        if self.forms:  # one Alltoallw per chunk into its results, straight from each tensor or from them joined
            for c, chunk in enumerate(batch.chunks):
                started = stats.begin_step()
                gather = self.gathers.get(id(chunk))
                members = _members(chunk, xs)
                if gather is not None and _c_contiguous(members):
                    gather(k, members, self._result(k, chunk, members[0], outs))
                else:
                    stacked = ready[c] if ready else self._stack(chunk, xs)
                    self.forms[id(chunk)](k, stacked, self._result(k, chunk, stacked, outs))
                stats.bytes_sent += sum(n for _, _, _, n in chunk.sends)
                stats.bytes_received += sum(n for _, _, _, n in chunk.recvs)
                stats.end_step("all_to_all", started)
            return
        numpy_in = type(xs[batch.chunks[0].members[0]]).__module__ == "numpy"
        proto = _bytes(0, arrays.name != "torch")
        # the pack lands in the engine's outbox where it has one: same-host peers read it there
        send_ = pack_buffer(k, batch.send_total, proto) if batch.send_total else proto
        recv_ = _bytes(batch.recv_total, arrays.name != "torch")
        stats.allocated_bytes += batch.recv_total
        as_numpy = numpy_in and arrays.name == "torch"  # numpy's own views of the same bytes
        send, recv = (send_.numpy(), recv_.numpy()) if as_numpy else (send_, recv_)
        results = []
        for c, chunk in enumerate(batch.chunks):
            stacked = ready[c] if ready else self._stack(chunk, xs)
            results.append(self._keep(k, chunk, stacked, outs))
            rows, held = len(chunk.members), chunk.step.held
            for peer, box, offset, n in chunk.sends:
                at = batch.send_at[peer] + offset
                piece = send[at : at + n].view(stacked.dtype).reshape((rows, *(b - a for a, b in box)))
                piece[...] = stacked[_slices(box, held)]
        if getattr(k.primitives, "pairwise", False):  # gloo: a message per peer (same-host peers read the outbox)
            sends = [(p, send_[batch.send_at[p] : batch.send_at[p] + batch.send_sizes[p]]) for p in batch.send_peers]
            recvs = [(p, recv_[batch.recv_at[p] : batch.recv_at[p] + batch.recv_sizes[p]]) for p in batch.recv_peers]
            k.primitives.exchange_pairs(recvs, sends, k.op, k.tally)
        else:  # the engine's own all-to-all of bytes (MPI: one Alltoallw), segments in rank order
            k.primitives.alltoallv(recv_, send_[: batch.send_total], [batch.recv_sizes.get(p, 0) for p in range(k.size)],
                                   [batch.send_sizes.get(p, 0) for p in range(k.size)], k.op)
        for chunk, out in zip(batch.chunks, results):
            rows, target = len(chunk.members), chunk.step.target
            for peer, box, offset, n in chunk.recvs:
                at = batch.recv_at[peer] + offset
                piece = recv[at : at + n].view(out.dtype).reshape((rows, *(b - a for a, b in box)))
                out[_slices(box, target)] = piece
        stats.bytes_sent += batch.sent
        stats.bytes_received += batch.received
        stats.pack_copies += bool(batch.send_peers)
        stats.unpack_copies += bool(batch.recv_peers)
        stats.steps.append(ExecutedStep("all_to_all", batch.sent, batch.received))


def _bytes(count: int, numpy_in: bool) -> Array:
    """A new 1-D uint8 buffer of the inputs' kind."""
    if numpy_in:
        import numpy as np

        return np.empty(count, dtype=np.uint8)
    import torch

    return torch.empty(count, dtype=torch.uint8)
