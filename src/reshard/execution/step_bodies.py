"""What each step does on this rank, through the engine's primitives: the bodies the executor
(``execute``) runs for the typed steps of a plan.

Copy budget (element copies outside the engine, per step):

* all_to_all: the engine's form decides (see ``engines``): at most one pack, and no unpack when
  the received pieces stacked in rank order already are the result.
* all_gather / gather: none when ``dim`` is the leading dim and sizes are even; one unpack
  otherwise (uneven all_gather pads: one more).
* reduce_scatter: one pack, then the reduction in rank order (bitwise the same on every engine).
* all_to_all_v: one engine call per segment, each writing straight into its block.
* an exchange of boxes: one message per peer and direction; a piece that is one run of the
  input or the result moves as it is, the rest through one pack and one unpack buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engines.base import CallState
from ..planning.layout import offsets, shard_sizes
from ..planning.plan import region_numel as box_size
from ..planning.steps import Box, ExchangeBoxes, Reorder
from .arrays import is_torch, numel
from .buffers import alloc, empty_result, pack_buffer
from .pieces import contiguous, data_ptr, exchange_packed, narrow, pack, segments, with_dim

Array = Any  # torch.Tensor or numpy.ndarray


def gather_core(call: CallState, x: Array, dim: int, lengths: Sequence[int], dst: int | None) -> Array | None:
    """all_gather (dst None) or gather to ``dst`` of pieces ``lengths[i]`` long along ``dim``,
    concatenated along ``dim`` in rank order."""
    arrays, n, rank, tally = call.arrays, call.size, call.rank, call.tally
    lengths = list(lengths)
    out_shape = with_dim(x.shape, dim, sum(lengths))
    recv_shapes = [with_dim(x.shape, dim, length) for length in lengths]
    src = x if arrays.is_contiguous(x) else x.contiguous() if is_torch(x) else x.copy()
    if src is not x:
        tally.packs += 1
    flat = src.reshape(-1)
    if dst is None and len(set(lengths)) == 1:
        # Equal pieces: one native all-gather, straight into the result when dim leads.
        direct = numel(out_shape[:dim]) == 1
        out = alloc(arrays, tally, out_shape, like=x)
        recv = out.reshape(-1) if direct else alloc(arrays, tally, [numel(out_shape)], like=x)
        tally.landing = data_ptr(recv)
        call.primitives.allgather(arrays.bytes_of(recv), arrays.bytes_of(flat), call.op)
        if not direct:
            for view, start in zip(segments(recv, recv_shapes), offsets(lengths)):
                arrays.copy(narrow(out, dim, start, lengths[0]), view)
            tally.unpacks += 1
        return out
    if dst is None:
        # Uneven all_gather: pad every piece to the longest, gather, then compact.
        longest = max(numel(s) for s in recv_shapes)
        padded = alloc(arrays, tally, [longest], like=x)
        padded[: flat.shape[0]] = flat
        recv = alloc(arrays, tally, [longest * n], like=x)
        call.primitives.allgather(arrays.bytes_of(recv), arrays.bytes_of(padded), call.op)
        out = alloc(arrays, tally, out_shape, like=x)
        for i, (shape, start) in enumerate(zip(recv_shapes, offsets(lengths))):
            if lengths[i]:
                piece = recv[i * longest : i * longest + numel(shape)].reshape(tuple(shape))
                arrays.copy(narrow(out, dim, start, lengths[i]), piece)
        tally.packs += 1
        tally.unpacks += 1
        return out
    send_shapes = [with_dim(x.shape, dim, lengths[rank] if j == dst else 0) for j in range(n)]
    mine = recv_shapes if rank == dst else [with_dim(x.shape, dim, 0)] * n
    out = exchange_packed(call, flat, send_shapes, mine, with_dim(x.shape, dim, sum(r[dim] for r in mine)), dim, x)
    return out if rank == dst else None


def reduce_scatter_core(call: CallState, x: Array, d: int, op: str) -> Array:
    arrays, n, rank = call.arrays, call.size, call.rank
    sizes = shard_sizes(x.shape[d], n)
    send, send_shapes = pack(call, x, d, sizes)
    piece_shape = send_shapes[rank]
    # Every rank's piece r arrives stacked [N, *piece]; the reduction runs in rank order, so
    # every engine and every run gives the same bits.
    stacked = exchange_packed(call, send, send_shapes, [piece_shape] * n, [n * piece_shape[0], *piece_shape[1:]], 0, x)
    call.tally.allocated += numel(piece_shape) * arrays.itemsize(x)  # the accumulator
    return arrays.stack_reduce(stacked.reshape((n, *piece_shape)), op)


def reorder(call: CallState, x: Array, step: Reorder) -> Array:
    """The pieces of ``x`` along ``step.dim`` in ``step.order`` (``steps.Reorder``): one copy."""
    starts = offsets(step.lengths)
    out = alloc(call.arrays, call.tally, x.shape, like=x)
    at = 0
    for piece in step.order:
        length = step.lengths[piece]
        call.arrays.copy(narrow(out, step.dim, at, length), narrow(x, step.dim, starts[piece], length))
        at += length
    call.tally.packs += 1
    return out


def exchange_rows(call: CallState, x: Array, segments_: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Array:
    """Rows of ``x`` along dim 0 out and in by each segment's counts (``steps.AllToAllV``), one
    engine call per segment, each writing straight into its block of the result."""
    xt = contiguous(call, x)
    arrays, tally = call.arrays, call.tally
    if getattr(call.primitives, "pairwise", False):
        return _rows_pairwise(call, xt, segments_)
    if len(segments_) == 1:
        send, recv = segments_[0]
        trail = list(xt.shape[1:])
        return exchange_packed(call, xt.reshape(-1), [[k, *trail] for k in send], [[k, *trail] for k in recv],
                               [sum(recv), *trail], 0, xt)
    row_bytes = numel(xt.shape[1:]) * arrays.itemsize(xt)
    out = alloc(arrays, tally, [sum(sum(r) for _, r in segments_), *xt.shape[1:]], like=xt)
    sent = received = 0
    for sends, recvs in segments_:
        s_rows, r_rows = sum(sends), sum(recvs)
        send_, recv_ = xt[sent : sent + s_rows], out[received : received + r_rows]
        call.primitives.alltoallv(arrays.bytes_of(recv_.reshape(-1)), arrays.bytes_of(send_.reshape(-1)),
                                 [c * row_bytes for c in recvs], [c * row_bytes for c in sends], call.op)
        sent, received = sent + s_rows, received + r_rows
    return out


def _rows_pairwise(call: CallState, xt: Array, segments_: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Array:
    """``exchange_rows`` as one message per peer and segment with rows to move (gloo): rows are
    runs of ``x`` and of the result, so nothing is packed, and a peer with no rows gets no
    message; the own rows are copied once the others have arrived."""
    arrays, rank, tally = call.arrays, call.rank, call.tally
    trail = list(xt.shape[1:])
    out = alloc(arrays, tally, [sum(sum(r) for _, r in segments_), *trail], like=xt)
    tally.landing = out
    sent = received = 0
    for sends, recvs in segments_:
        send_at, recv_at = [sent + o for o in offsets(sends)], [received + o for o in offsets(recvs)]
        recv_views = [(p, out[recv_at[p] : recv_at[p] + c].reshape(-1)) for p, c in enumerate(recvs) if c and p != rank]
        send_views = [(q, xt[send_at[q] : send_at[q] + c].reshape(-1)) for q, c in enumerate(sends) if c and q != rank]
        if recv_views or send_views:
            call.primitives.exchange_pairs(recv_views, send_views, call.op, tally)
        if sends[rank]:
            arrays.copy(out[recv_at[rank] : recv_at[rank] + recvs[rank]], xt[send_at[rank] : send_at[rank] + sends[rank]])
        sent, received = sent + sum(sends), received + sum(recvs)
    return out


def _slices(box: Box, origin: Box) -> tuple[slice, ...]:
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


class BoxRun:
    """An exchange of boxes (``steps.ExchangeBoxes``): one message per peer and direction. A peer's piece that is one contiguous run of the
    result is received straight into it, one that is a run of the input is sent as it is; the
    rest goes through a buffer (packed before its send, unpacked once it arrived)."""

    def __init__(self, step: ExchangeBoxes, form: Any = None) -> None:
        self.step = step
        self.form = form  # the engine's own collective for the whole exchange: (call, x, out)
        self.held, self.target = step.held, step.target
        self.out_shape = tuple(b - a for a, b in step.target)
        if form is not None:  # the form's counters and the result, recorded by the executor
            self.counts = (*form.counts, ("allocated_bytes", box_size(step.target) * form.itemsize))
            self.receives_result = True
        self.by_src: dict[int, list[Box]] = {}
        for p, box in step.recvs:  # ascending by peer, as the plan lists them
            self.by_src.setdefault(p, []).append(box)
        self.by_dst: dict[int, list[Box]] = {}
        for q, box in step.sends:
            self.by_dst.setdefault(q, []).append(box)
        self.send_counts = {q: sum(box_size(b) for b in boxes) for q, boxes in self.by_dst.items()}
        self.recv_counts = {p: sum(box_size(b) for b in boxes) for p, boxes in self.by_src.items()}

    def start(self, k: CallState, xt: Array) -> tuple[Array, Any]:
        """The result (op's identity where nothing lands) and a job that copies the kept boxes."""
        if self.form is not None:  # counted by the executor (``counts``)
            out = empty_result(k.arrays, self.out_shape, xt)
        else:
            out = alloc(k.arrays, k.tally, self.out_shape, like=xt)
        if self.step.fill_op is not None:
            out = k.arrays.full_like(out, k.arrays.identity(xt, self.step.fill_op))
        return out, (lambda: [k.arrays.copy(out[_slices(box, self.target)], xt[_slices(box, self.held)])
                              for box in self.step.kept])

    def prepare(self, k: CallState, xt: Array) -> tuple[Array, list[tuple[int, Array]]]:
        """The local work done before the exchange: the result with this rank's own part in it,
        and every packed piece (``__call__``'s ``prepared``)."""
        out, keep_own = self.start(k, xt)
        if self.form is not None:  # the engine's call moves this rank's own part too
            return out, None
        keep_own()
        return out, list(self._messages(k, xt))

    def __call__(self, k: CallState, xt: Array, prepared: Any = None) -> Array:
        if prepared is not None:
            (out, packed), keep_own = prepared, None
        else:
            (out, keep_own), packed = self.start(k, xt), None
        if self.step.moves and self.form is not None:
            self.form(k, xt, out)  # this rank's own part included, as a message to itself
        elif self.step.moves:
            self.exchange(k, xt, out, packed, keep_own)
        elif keep_own is not None:
            keep_own()
        return out

    def _messages(self, k: CallState, xt: Array) -> Any:
        """Each peer's piece, packed (where it is not a run of the input) into its own part of one buffer."""
        arrays, tally = k.arrays, k.tally
        as_is = {}
        for q, boxes in self.by_dst.items():
            view = xt[_slices(boxes[0], self.held)] if len(boxes) == 1 else None
            if view is not None and arrays.is_contiguous(view):
                as_is[q] = view.reshape(-1)
        pack, base = None, 0
        if len(as_is) < len(self.by_dst):  # the pack buffer first, before any message leaves
            pack = pack_buffer(k, sum(self.send_counts.values()), like=xt)
            tally.packs += 1
        for q, boxes in sorted(self.by_dst.items()):
            if q in as_is:
                yield q, as_is[q]
                continue
            at = base
            for box in boxes:
                n = box_size(box)
                arrays.copy(pack[at : at + n].reshape(tuple(b - a for a, b in box)), xt[_slices(box, self.held)])
                at += n
            yield q, pack[base:at]
            base = at

    def exchange(self, k: CallState, xt: Array, out: Array, packed: list | None, meanwhile: Any) -> None:
        """Receive into ``out``, send ``packed`` (or pack now, after the receives are posted);
        ``meanwhile()``, if given, runs once every send is under way (the rank's own part)."""
        arrays, tally = k.arrays, k.tally
        landing, unpack = [], []
        for p, boxes in sorted(self.by_src.items()):
            view = out[_slices(boxes[0], self.target)] if len(boxes) == 1 else None
            if view is not None and arrays.is_contiguous(view):
                landing.append((p, view.reshape(-1)))
            else:
                side = alloc(arrays, tally, [self.recv_counts[p]], like=xt)
                landing.append((p, side))
                unpack.append((side, boxes))

        def messages() -> Any:
            yield from packed if packed is not None else self._messages(k, xt)
            if meanwhile is not None:
                meanwhile()

        k.primitives.exchange_pairs([(p, arrays.bytes_of(b)) for p, b in landing],
                                   ((q, arrays.bytes_of(b)) for q, b in messages()), k.op, tally)
        for side, boxes in unpack:
            at = 0
            for box in boxes:
                n = box_size(box)
                arrays.copy(out[_slices(box, self.target)], side[at : at + n].reshape(tuple(b - a for a, b in box)))
                at += n
        if unpack:
            tally.unpacks += 1


