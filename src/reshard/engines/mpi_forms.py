"""MPI's forms of the all-to-all.

* **Datatypes** (contiguous inputs): one subarray datatype per peer on each side, so pieces move
  straight from ``x`` into the result through ``Alltoallw``: no pack, no unpack. Where every
  piece is the same size on both sides and the exchange small, one type per side through
  ``Alltoall`` instead. Faster than
  pack + bytes at every size measured (see the performance docs).
* **Bytes** (everything else): the own piece never enters the engine (it is copied straight from
  ``x`` into the result); the others travel in one ``Alltoallv`` with the own count 0, packed
  once into the kept buffer (``PeerSend``), while the check's records are in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..execution.arrays import numel
from ..execution.buffers import alloc, scratch
from ..execution.pieces import as_run, data_ptr, narrow, swap01, unpack_others, with_dim
from ..planning.layout import offsets
from ..planning.steps import AllToAll, ExchangeBoxes
from .arena import result_array
from .base import CallState, ExchangeRun

# Byte bounds of the datatype path (a benchmark may narrow them to time the byte path).
TYPED_MIN_BYTES = 0
TYPED_MAX_BYTES = 1 << 62
# Equal pieces up to this many bytes a rank go through Alltoall (about 2 us a call lighter at
# 64 KiB); above it Open MPI's Alltoall with these types fell behind Alltoallw (16 MiB on 2
# ranks: 2.97x the bare call against 1.67x).
UNIFORM_MAX_BYTES = 64 << 10
INT_MAX = 2**31 - 1


def collapsed(shape: Sequence[int], dim: int) -> list[int]:
    """``shape`` as [before, shape[dim], after]: a subarray type with at most three dims."""
    return [numel(shape[:dim]), shape[dim], numel(shape[dim + 1 :])]


def typed_path_may_take(call: CallState, x: Any) -> bool:
    """Whether the datatype path may take this input (``typed_fits`` decides finally)."""
    nbytes = numel(x.shape) * call.arrays.itemsize(x)
    return call.arrays.is_contiguous(x) and TYPED_MIN_BYTES <= nbytes <= TYPED_MAX_BYTES


def typed_fits(call: CallState, x: Any, g: AllToAll) -> bool:
    if not typed_path_may_take(call, x):
        return False
    if numel(x.shape[: g.split_dim]) == 1 and numel(g.out_shape[: g.concat_dim]) == 1:
        return False  # pieces and result are plain runs: the byte exchange copies nothing anyway
    dims = collapsed(x.shape, g.split_dim) + collapsed(g.out_shape, g.concat_dim)
    return max(dims) <= INT_MAX


def typed_form(call: CallState, x: Any, g: AllToAll) -> ExchangeRun:
    """The datatype exchange with its types and counts worked out once."""
    engine, item = call.primitives, call.arrays.itemsize(x)
    s, c, send_sizes, recv_shapes, out_shape = g.split_dim, g.concat_dim, g.send_sizes, g.recv_shapes, g.out_shape
    send_full, recv_full = collapsed(x.shape, s), collapsed(out_shape, c)
    send_types = [
        engine.subarray(send_full, with_dim(send_full, 1, size), [0, start, 0], item)
        for size, start in zip(send_sizes, offsets(send_sizes))
    ]
    lengths = [r[c] for r in recv_shapes]
    recv_types = [
        engine.subarray(recv_full, with_dim(recv_full, 1, length), [0, start, 0], item)
        for length, start in zip(lengths, offsets(lengths))
    ]
    exchange = uniform = None
    if (s != c and len(set(send_sizes)) == 1 and len(set(lengths)) == 1 and send_sizes[0] and lengths[0]
            and numel(x.shape) * item <= UNIFORM_MAX_BYTES):
        # Equal pieces on both sides, few bytes: one type per side whose j-th element is piece j,
        # through the lighter Alltoall. Every rank must choose alike: with s != c the send sizes
        # are every rank's (its pieces stack along c) and the lengths are the ranks' extents
        # along c, so every rank sees the same two lists (and, the lengths equal, the same
        # shape of x), and non-empty pieces make non-empty boxes.
        send_piece = engine.strided_pieces(send_full, with_dim(send_full, 1, send_sizes[0]), item)
        recv_piece = engine.strided_pieces(recv_full, with_dim(recv_full, 1, lengths[0]), item)
        if send_piece is not None and recv_piece is not None:
            exchange = engine.alltoall_plan(recv_piece, send_piece, call.op)
            uniform = (recv_piece, send_piece)
    if exchange is None:
        exchange = engine.alltoallw_plan(recv_types, send_types, call.op)
    epoch, result_shape, result_bytes = engine.types_epoch, tuple(out_shape), numel(out_shape) * item

    empty = call.arrays.empty
    # numpy's allocation bound once (a replay's every microsecond shows); tensors ask their backend
    # (in the shared arena where the step took the engine's path for want of a peer's input there)
    new_numpy = functools.partial(result_array, result_shape, x.dtype) if call.arrays.name == "numpy" else None

    def through(xt: Any) -> Any | None:
        """The exchange into a new result, or None where the engine freed its types since
        (``run`` then works them out again)."""
        if engine.types_epoch != epoch:
            return None
        out = new_numpy() if new_numpy is not None else empty(result_shape, xt)
        exchange(out, xt)  # both contiguous: the datatypes address their elements
        return out

    # numpy in and out through Alltoall: the same in one frame
    exchange_new = through if uniform is None or new_numpy is None else engine.alltoall_fresh(*uniform, call.op, new_numpy, epoch)

    def run(k: CallState, xt: Any, prepared: Any = None) -> Any:
        out = exchange_new(xt)
        return typed_form(k, xt, g)(k, xt) if out is None else out

    # what every run does, recorded by the executor: the result allocated, received into
    run.counts = (("allocated_bytes", result_bytes),)  # type: ignore[attr-defined]
    run.receives_result = True  # type: ignore[attr-defined]
    return run


class PeerSend:
    """What this rank sends, cut along ``s`` into ``sizes``: ``lo()`` the pieces for ranks below
    it (one run, rank order), ``hi()`` those for ranks above. Views of ``x`` when its pieces
    already are runs of memory; else each side is packed once, on first use, into the kept
    buffer (own piece skipped), next to each other so ``adjacent`` finds them one run."""

    def __init__(self, call: CallState, x: Any, s: int, sizes: Sequence[int]):
        self.call, self.x, self.s, self.sizes = call, x, s, tuple(sizes)
        arrays, rank = call.arrays, call.rank
        self.before, self.after = numel(x.shape[:s]), numel(x.shape[s + 1 :])
        self.starts = offsets(sizes)
        own_start, own_end = self.starts[rank], self.starts[rank] + sizes[rank]
        self.runs = arrays.is_contiguous(x) and self.before == 1
        if self.runs:
            flat = x.reshape(-1)
            self.views = [flat[: own_start * self.after], flat[own_end * self.after :]]
            self.done = [True, True]
            return
        lo_count = self.before * own_start * self.after
        hi_count = self.before * (x.shape[s] - own_end) * self.after
        buf = scratch(arrays, call.tally, lo_count + hi_count, like=x)
        self.views = [buf[:lo_count], buf[lo_count:]]
        self.done = [False, False]
        self.x3 = x.reshape(self.before, x.shape[s], self.after) if arrays.is_contiguous(x) else None

    def lo(self) -> Any:
        return self._side(0, 0, self.call.rank)

    def hi(self) -> Any:
        return self._side(1, self.call.rank + 1, len(self.sizes))

    def both(self) -> PeerSend:
        self.lo()
        self.hi()
        return self

    def _side(self, which: int, first: int, last: int) -> Any:
        view = self.views[which]
        if self.done[which]:
            return view
        self.done[which] = True
        if first == last or view.shape[0] == 0:
            return view
        arrays, sizes, starts, x = self.call.arrays, self.sizes, self.starts, self.x
        k = sizes[first]
        if self.x3 is not None and all(sizes[j] == k for j in range(first, last)):
            # equal pieces: one strided copy of a [pieces, before, k, after] view
            src = self.x3[:, starts[first] : starts[last - 1] + k].reshape(self.before, last - first, k, self.after)
            arrays.copy(view.reshape(last - first, self.before, k, self.after), swap01(src))
        else:
            at = 0
            for j in range(first, last):
                shape = with_dim(x.shape, self.s, sizes[j])
                m = numel(shape)
                if m:
                    arrays.copy(view[at : at + m].reshape(tuple(shape)), narrow(x, self.s, starts[j], sizes[j]))
                at += m
        self.call.tally.packs = max(self.call.tally.packs, 1)  # both sides: one copy of x
        return view


def adjacent(call: CallState, x: Any, sent: PeerSend) -> Any:
    """The lower and higher pieces as one run (packing them together when they are not)."""
    lo, hi = sent.lo(), sent.hi()
    n_lo, n_hi = lo.shape[0], hi.shape[0]
    item = call.arrays.itemsize(x)
    if n_hi == 0:
        return lo
    if n_lo == 0:
        return hi
    if data_ptr(lo) + n_lo * item == data_ptr(hi):
        return as_run(lo, n_lo + n_hi)
    buf = scratch(call.arrays, call.tally, n_lo + n_hi, like=x)
    call.arrays.copy(buf[:n_lo], lo)
    call.arrays.copy(buf[n_lo:], hi)
    call.tally.packs += 1
    return buf


def split_form(call: CallState, x: Any, g: AllToAll) -> ExchangeRun:
    """The byte exchange: ``run(call, x, prepared=None)``, ``prepared`` the ``PeerSend`` packed early."""

    def run(k: CallState, xt: Any, prepared: PeerSend | None = None) -> Any:
        sent = prepared if prepared is not None else PeerSend(k, xt, g.split_dim, g.send_sizes)
        return split_exchange(k, xt, g, sent)

    return run


def split_exchange(call: CallState, x: Any, g: AllToAll, sent: PeerSend) -> Any:
    """Own piece copied straight from ``x``; the others in one engine call with the own count
    0, into the result itself when the stacked pieces are the result, else into a side buffer
    that is unpacked once."""
    arrays, rank, n, tally = call.arrays, call.rank, call.size, call.tally
    s, c, send_sizes, recv_shapes, out_shape = g.split_dim, g.concat_dim, g.send_sizes, g.recv_shapes, g.out_shape
    item = arrays.itemsize(x)
    send_bytes = [numel(with_dim(x.shape, s, k)) * item for k in send_sizes]
    recv_bytes = [numel(shape) * item for shape in recv_shapes]
    out = alloc(arrays, tally, out_shape, like=x)
    lengths = [shape[c] for shape in recv_shapes]
    starts = offsets(lengths)
    own_at, own_len = sum(recv_bytes[:rank]) // item, recv_bytes[rank] // item
    hi_len = sum(recv_bytes[rank + 1 :]) // item
    # Into the result itself: the higher pieces land own_len too early and are moved up
    # afterwards, in own-piece-sized steps (so no step overlaps), instead of needing a side
    # buffer: the peak stays at one pack buffer. Many tiny steps would cost more than the buffer.
    shifted = numel(out_shape[:c]) == 1 and (hi_len == 0 or own_len == 0 or hi_len <= 64 * own_len)
    if shifted:
        flat = out.reshape(-1)
        temp = flat[: own_at + hi_len]
        tally.landing = data_ptr(out)
    else:
        temp = alloc(arrays, tally, [(sum(recv_bytes) - recv_bytes[rank]) // item], like=x)
        tally.landing = data_ptr(temp)
    if n > 1:  # [lower | higher] pieces in one run on each side; own count 0
        own_out = [v if j != rank else 0 for j, v in enumerate(send_bytes)]
        own_in = [v if i != rank else 0 for i, v in enumerate(recv_bytes)]
        call.primitives.alltoallv(arrays.bytes_of(temp), arrays.bytes_of(adjacent(call, x, sent)), own_in, own_out, call.op)
    if shifted and own_len and hi_len:
        end = own_at + hi_len
        while end > own_at:
            start = max(own_at, end - own_len)
            arrays.copy(flat[start + own_len : end + own_len], flat[start:end])
            end = start
        tally.unpacks += 1
    if lengths[rank] and numel(recv_shapes[rank]):
        own_start = sum(send_sizes[:rank])
        arrays.copy(narrow(out, c, starts[rank], lengths[rank]), narrow(x, s, own_start, send_sizes[rank]))
    if not shifted:
        unpack_others(call, out, temp, recv_shapes, c)
    return out


def _rel(box: Any, origin: Any) -> tuple:
    return tuple((a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def _per_peer(call: CallState, pairs: Any, origin: Any, shape: list[int], item: int, lead: tuple = ()) -> list[Any]:
    """Each peer's boxes of ``pairs`` (relative to ``origin``, after the leading boxes ``lead``)
    as one datatype over a C-order array ``shape``; None for a peer without any."""
    boxes: dict[int, list] = {}
    for p, box in pairs:
        boxes.setdefault(p, []).append(lead + _rel(box, origin))
    return [call.primitives.boxes_type(shape, boxes[p], item) if p in boxes else None for p in range(call.size)]


def members_form(call: CallState, x: Any, step: ExchangeBoxes, rows: int) -> Any:
    """``exchange(call, members, out)``: the exchange of boxes of ``step`` for ``rows`` like
    tensors at once (``x``: one of them), in one ``Alltoallw`` straight from each tensor (no
    join): a peer's boxes of one tensor as a datatype, placed at every tensor's address per
    call; received into ``out``, the results stacked along a new leading dim (``[rows,
    *target]``). None where an extent passes ``INT_MAX`` (the same on every rank)."""
    engine, item = call.primitives, call.arrays.itemsize(x)
    held = [b - a for a, b in step.held]
    target = [rows] + [b - a for a, b in step.target]
    if max([*held, *target, 0]) > INT_MAX:
        return None
    lead = ((0, rows),)
    send_types = _per_peer(call, step.sends, step.held, held, item)
    recv_types = _per_peer(call, step.recvs, step.target, target, item, lead)
    if step.kept:  # this rank's own part: a message to itself in the same call
        send_types[call.rank] = engine.boxes_type(held, [_rel(b, step.held) for b in step.kept], item)
        recv_types[call.rank] = engine.boxes_type(target, [lead + _rel(b, step.target) for b in step.kept], item)
    exchange = engine.alltoallw_members(recv_types, send_types, call.op)
    epoch = engine.types_epoch

    def run(k: CallState, members: Sequence[Any], out: Any) -> None:
        if engine.types_epoch != epoch:  # the engine freed its types since: work them out again
            return members_form(k, members[0], step, rows)(k, members, out)
        exchange(out, members)
        return None

    return run


def boxes_form(call: CallState, x: Any, step: ExchangeBoxes) -> Any:
    """``exchange(call, x, out)`` moving every box of ``step`` in one ``Alltoallw``: each
    peer's boxes are one datatype over the input (held) on the send side and over the result
    (target) on the receive side; the boxes this rank keeps are its message to itself. None where a box's extent passes
    ``INT_MAX`` elements (the same answer on every rank: the extents come from the global
    shape), leaving the point-to-point exchange."""
    engine, item = call.primitives, call.arrays.itemsize(x)
    held = [b - a for a, b in step.held]
    target = [b - a for a, b in step.target]
    if max([*held, *target, 0]) > INT_MAX:
        return None

    send_types = _per_peer(call, step.sends, step.held, held, item)
    recv_types = _per_peer(call, step.recvs, step.target, target, item)
    if step.kept:  # this rank's own part: a message to itself in the same call (one pass, as a copy)
        send_types[call.rank] = engine.boxes_type(held, [_rel(b, step.held) for b in step.kept], item)
        recv_types[call.rank] = engine.boxes_type(target, [_rel(b, step.target) for b in step.kept], item)
    exchange = engine.alltoallw_plan(recv_types, send_types, call.op)
    epoch = engine.types_epoch

    packs = not call.arrays.is_contiguous(x)  # the datatypes address a C-order input

    def run(k: CallState, xt: Any, out: Any) -> None:
        if engine.types_epoch != epoch:  # the engine freed its types since: work them out again
            return boxes_form(k, xt, step)(k, xt, out)
        if packs:
            xt = xt.contiguous() if hasattr(xt, "contiguous") else np.ascontiguousarray(xt)
        exchange(out, xt)
        return None

    # what every run does, recorded by the executor (``step_bodies.BoxRun`` adds its result)
    run.counts = (("pack_copies", int(packs)),)  # type: ignore[attr-defined]
    run.itemsize = item  # type: ignore[attr-defined]
    return run
