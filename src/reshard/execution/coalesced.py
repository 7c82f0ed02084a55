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

Where the engine would pack (gloo), the group shares memory (``engines.arena_link``) and a
batch is large enough, the batch is read in place instead (``many_reads.BatchReads``): its
chunks joined into one block of the shared arena, each rank copying its boxes straight out of
its peers' blocks. On MPI each chunk goes in one ``Alltoallw`` straight from its tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..planning.steps import ExchangeBoxes
from . import arena_reads
from .buffers import pack_buffer, shared_empty
from .execute import PlanRun
from .many_reads import BatchReads, box_numel, box_slices, c_contiguous, fill, members_of, numpy_dtype
from .stats import ExchangeStats, ExecutedStep

Array = Any
Box = tuple[tuple[int, int], ...]
ALIGN = 16
MIN_BATCH_BYTES = 4 << 20  # small tensors always share one batch


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
                    n = rows * box_numel(box) * chunk.itemsize
                    if peer == rank or not n:
                        continue
                    at = sizes.get(peer, 0)
                    table.append((peer, box, at, n))
                    sizes[peer] = at + _aligned(n)
        self.send_peers, self.recv_peers = sorted(self.send_sizes), sorted(self.recv_sizes)
        # what the batch does as a whole: an all_gather where every chunk only gathers
        self.collective = "all_gather" if all(c.step.collective == "all_gather" for c in chunks) else "all_to_all"
        self.send_at = _starts(self.send_peers, self.send_sizes)
        self.recv_at = _starts(self.recv_peers, self.recv_sizes)
        self.send_total, self.recv_total = sum(self.send_sizes.values()), sum(self.recv_sizes.values())
        self.sent = sum(n for c in chunks for _, _, _, n in c.sends)
        self.received = sum(n for c in chunks for _, _, _, n in c.recvs)
        self.reads: BatchReads | None = None  # the batch as reads in place, where the group shares memory


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
                    b.reads = BatchReads(link, b, [numpy_dtype(xs[c.members[0]]) for c in b.chunks])
        self.tensor_stats = [ExchangeStats("redistribute") for _ in parts]
        for b in self.batches:
            for chunk in b.chunks:
                rows = len(chunk.members)
                sent = sum(n for _, _, _, n in chunk.sends) // rows
                received = sum(n for _, _, _, n in chunk.recvs) // rows
                for i in chunk.members:
                    mine = self.tensor_stats[i]
                    mine.bytes_sent, mine.bytes_received = sent, received
                    mine.steps = [ExecutedStep(chunk.step.collective, sent, received)]

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
        members = members_of(chunk, xs)
        first = members[0]
        shape = (len(members), *first.shape)
        # into a new C-ordered array: concatenating F-ordered inputs alone would give F order
        out = np.empty(shape, first.dtype) if type(first).__module__ == "numpy" else first.new_empty(shape)
        return fill(out, members)

    def _keep(self, k: Any, chunk: _Chunk, stacked: Array, outs: list[Array]) -> Array:
        """The chunk's results, as one stacked array (of the inputs' kind) with what this rank
        keeps of its own in it."""
        out = self._result(k, chunk, stacked, outs)
        step = chunk.step
        for box in step.kept:
            out[box_slices(box, step.target)] = stacked[box_slices(box, step.held)]
        return out

    def _result(self, k: Any, chunk: _Chunk, stacked: Array, outs: list[Array], shared: bool = False) -> Array:
        """The chunk's results: one new stacked array of the inputs' kind (in the shared arena
        with ``shared``, where it has room), each tensor's a view."""
        step = chunk.step
        shape = (len(chunk.members), *(b - a for a, b in step.target))
        out = shared_empty(shape, stacked) if shared else None
        if out is None:
            out = np.empty(shape, dtype=stacked.dtype) if type(stacked).__module__ == "numpy" else stacked.new_empty(shape)
        k.stats.allocated_bytes += len(chunk.members) * box_numel(step.target) * chunk.itemsize
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
                stats.allocated_bytes += batch.reads.nbytes
                stats.bytes_sent += batch.sent
                stats.bytes_received += batch.received
                stats.pack_copies += 1  # the join: the one copy before the peers read
                stats.steps.append(ExecutedStep(batch.collective, batch.sent, batch.received))
                return
        if self.forms:  # one Alltoallw per chunk into its results, straight from each tensor or from them joined
            for c, chunk in enumerate(batch.chunks):
                started = stats.begin_step()
                gather = self.gathers.get(id(chunk))
                members = members_of(chunk, xs)
                if gather is not None and c_contiguous(members):
                    gather(k, members, self._result(k, chunk, members[0], outs))
                else:
                    stacked = ready[c] if ready else self._stack(chunk, xs)
                    self.forms[id(chunk)](k, stacked, self._result(k, chunk, stacked, outs))
                stats.bytes_sent += sum(n for _, _, _, n in chunk.sends)
                stats.bytes_received += sum(n for _, _, _, n in chunk.recvs)
                stats.end_step(chunk.step.collective, started)
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
                piece[...] = stacked[box_slices(box, held)]
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
                out[box_slices(box, target)] = piece
        stats.bytes_sent += batch.sent
        stats.bytes_received += batch.received
        stats.pack_copies += bool(batch.send_peers)
        stats.unpack_copies += bool(batch.recv_peers)
        stats.steps.append(ExecutedStep(batch.collective, batch.sent, batch.received))


def _bytes(count: int, numpy_in: bool) -> Array:
    """A new 1-D uint8 buffer of the inputs' kind."""
    if numpy_in:
        import numpy as np

        return np.empty(count, dtype=np.uint8)
    import torch

    return torch.empty(count, dtype=torch.uint8)
