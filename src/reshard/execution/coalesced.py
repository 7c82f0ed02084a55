"""Many tensors' layout changes as one program on this rank: every tensor's exchange of boxes
travels in the same messages, one per peer and direction, so a call on 256 small tensors
costs about what one call on their bytes costs.

Each tensor is one of three parts: ``same`` (its layout does not change: the input is the
result), ``boxes`` (a change that reduces nothing: its boxes join the shared exchange) or
``own`` (Partial values reduced or filled: its own plan, run in the same call). The shared
exchange runs in batches of consecutive tensors whose global bytes add up to at most the
largest one's (the same on every rank), so its buffers never exceed what the largest
tensor's own call would take. In each message a tensor's piece starts at a multiple of 16
bytes: both ends work out the same offsets from the same boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..planning.steps import ExchangeBoxes
from .execute import PlanRun
from .stats import ExchangeStats

Array = Any
Box = tuple[tuple[int, int], ...]
ALIGN = 16
MIN_BATCH_BYTES = 4 << 20  # small tensors always share one batch


def _numel(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def _slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Part:
    """One tensor's part of the call on this rank."""

    kind: str  # "same", "boxes" or "own"
    step: ExchangeBoxes | None = None  # kind "boxes"
    run: PlanRun | None = None  # kind "own"
    global_bytes: int = 0


class _Batch:
    """Consecutive ``boxes`` tensors exchanged together: per peer, each tensor's pieces at
    fixed byte offsets of one message."""

    def __init__(self, members: list[int], parts: Sequence[Part], itemsizes: Sequence[int], rank: int):
        self.members = members
        self.sends: dict[int, list[tuple[int, Box, int, int]]] = {}  # peer -> (tensor, box, offset, bytes)
        self.recvs: dict[int, list[tuple[int, Box, int, int]]] = {}
        self.send_sizes: dict[int, int] = {}
        self.recv_sizes: dict[int, int] = {}
        for side, table, sizes in (("sends", self.sends, self.send_sizes), ("recvs", self.recvs, self.recv_sizes)):
            for i in members:
                for peer, box in getattr(parts[i].step, side):
                    n = _numel(box) * itemsizes[i]
                    if peer == rank or not n:
                        continue
                    at = sizes.get(peer, 0)
                    table.setdefault(peer, []).append((i, box, at, n))
                    sizes[peer] = at + _aligned(n)
        self.send_total = sum(self.send_sizes.values())
        self.recv_total = sum(self.recv_sizes.values())


class ManyRun:
    """The program of one call on many tensors; calling it on the (converted, detached)
    inputs returns their results, recording the call's stats and each tensor's."""

    def __init__(self, parts: list[Part], itemsizes: list[int], rank: int):
        self.parts = parts
        self.itemsizes = itemsizes
        self.rank = rank
        moving = [i for i, p in enumerate(parts) if p.kind == "boxes" and p.step.moves]
        cap = max([MIN_BATCH_BYTES] + [parts[i].global_bytes for i in moving])
        self.batches: list[_Batch] = []
        group: list[int] = []
        total = 0
        for i in moving:
            if group and total + parts[i].global_bytes > cap:
                self.batches.append(_Batch(group, parts, itemsizes, rank))
                group, total = [], 0
            group.append(i)
            total += parts[i].global_bytes
        if group:
            self.batches.append(_Batch(group, parts, itemsizes, rank))

    def __call__(self, k: Any, xs: Sequence[Array]) -> list[Array]:
        arrays, stats, tally = k.arrays, k.stats, k.tally
        outs: list[Array] = [None] * len(xs)
        per_tensor = [ExchangeStats(k.op) for _ in xs]
        for i, (part, x) in enumerate(zip(self.parts, xs)):
            if part.kind == "same":
                outs[i] = x
            elif part.kind == "boxes":  # the result, with what this rank keeps of its own
                step = part.step
                out = arrays.empty(tuple(b - a for a, b in step.target), like=x)
                for box in step.kept:
                    arrays.copy(out[_slices(box, step.target)], x[_slices(box, step.held)])
                outs[i] = out
                stats.allocated_bytes += _numel(step.target) * self.itemsizes[i]
        for batch in self.batches:
            self._exchange(k, batch, xs, outs, per_tensor)
        for i, part in enumerate(self.parts):
            if part.kind == "own":  # its own steps, recorded in the call's stats as they run
                before = (stats.bytes_sent, stats.bytes_received, len(stats.steps))
                outs[i] = part.run(k, xs[i])
                mine = per_tensor[i]
                mine.bytes_sent, mine.bytes_received = stats.bytes_sent - before[0], stats.bytes_received - before[1]
                mine.steps = stats.steps[before[2]:]
        stats.tensors = per_tensor
        tally.packs = tally.unpacks = tally.allocated = 0
        tally.landing = None
        stats.metadata_exchanges = k.checks
        stats.replayed = k.replaying
        return outs

    def _exchange(self, k: Any, batch: _Batch, xs: Sequence[Array], outs: list[Array],
                  per_tensor: list[ExchangeStats]) -> None:
        """One message per peer and direction: the batch's pieces packed, exchanged, unpacked."""
        arrays, stats = k.arrays, k.stats
        send = _bytes(arrays, batch.send_total)
        recv = _bytes(arrays, batch.recv_total)
        stats.allocated_bytes += batch.send_total + batch.recv_total
        started = stats.begin_step()
        send_views, recv_views = [], []
        at = 0
        for peer in sorted(batch.sends):
            for i, box, offset, n in batch.sends[peer]:
                x = xs[i]
                piece = send[at + offset : at + offset + n].view(x.dtype).reshape(tuple(b - a for a, b in box))
                arrays.copy(piece, x[_slices(box, self.parts[i].step.held)])
                per_tensor[i].bytes_sent += n
            send_views.append((peer, send[at : at + batch.send_sizes[peer]]))
            at += batch.send_sizes[peer]
        at = 0
        for peer in sorted(batch.recvs):
            recv_views.append((peer, recv[at : at + batch.recv_sizes[peer]]))
            at += batch.recv_sizes[peer]
        k.primitives.exchange_pairs(recv_views, send_views, k.op, k.tally)
        at = 0
        for peer in sorted(batch.recvs):
            for i, box, offset, n in batch.recvs[peer]:
                out, step = outs[i], self.parts[i].step
                piece = recv[at + offset : at + offset + n].view(out.dtype).reshape(tuple(b - a for a, b in box))
                arrays.copy(out[_slices(box, step.target)], piece)
                per_tensor[i].bytes_received += n
            at += batch.recv_sizes[peer]
        stats.bytes_sent += sum(n for table in batch.sends.values() for _, _, _, n in table)
        stats.bytes_received += sum(n for table in batch.recvs.values() for _, _, _, n in table)
        stats.pack_copies += bool(batch.sends)
        stats.unpack_copies += bool(batch.recvs)
        stats.end_step("all_to_all", started)
        for i in batch.members:
            per_tensor[i].steps.append(stats.steps[-1]._replace(bytes_sent=per_tensor[i].bytes_sent,
                                                                 bytes_received=per_tensor[i].bytes_received))


def _bytes(arrays: Any, count: int) -> Array:
    """A new 1-D uint8 buffer of the backend's kind."""
    if arrays.name == "torch":
        return arrays.torch.empty(count, dtype=arrays.torch.uint8)
    import numpy as np

    return np.empty(count, dtype=np.uint8)
