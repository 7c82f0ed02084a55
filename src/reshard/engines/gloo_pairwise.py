"""gloo's form of the all-to-all: one message per peer.

Every receive is posted first, straight into the result when the received pieces are runs of
it; each piece is packed just before its send, so the next pack overlaps the bytes already
moving; the own piece never enters the engine and is copied last, while the others arrive.
Offsets and shapes are worked out once per call signature: per-call Python is a visible share
of a 1 MiB exchange (see the performance docs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..execution.arrays import numel
from ..execution.buffers import alloc, pack_buffer
from ..execution.pieces import data_ptr, narrow, unpack_others, with_dim
from ..planning.layout import offsets
from ..planning.steps import AllToAll
from .base import CallState, ExchangeRun


def pairwise_form(call: CallState, x: Any, g: AllToAll) -> ExchangeRun:
    """``run(call, x, prepared=None)`` for ``g``, as one point-to-point message per peer."""
    n, rank, arrays = call.size, call.rank, call.arrays
    s, c, send_sizes, recv_shapes, out_shape = g.split_dim, g.concat_dim, g.send_sizes, g.recv_shapes, g.out_shape
    send_shapes = [with_dim(x.shape, s, k) for k in send_sizes]
    send_counts = [numel(shape) for shape in send_shapes]
    send_starts = offsets(send_sizes)
    recv_counts = [numel(shape) for shape in recv_shapes]
    lengths = [shape[c] for shape in recv_shapes]
    out_starts = offsets(lengths)
    direct = numel(out_shape[:c]) == 1  # the pieces stacked in rank order are the result
    remote_in = sum(recv_counts) - recv_counts[rank]
    remote_out = sum(send_counts) - send_counts[rank]
    result_shape = tuple(out_shape)
    runs_in = arrays.is_contiguous(x) and numel(x.shape[:s]) == 1  # the pieces of x are runs of it
    after = numel(x.shape[s + 1 :])
    # (source, first, last) element of each receive in the landing buffer, sources in ring order
    at_in = offsets(recv_counts if direct else [0 if i == rank else m for i, m in enumerate(recv_counts)])
    receives = [(i, at_in[i], at_in[i] + recv_counts[i]) for i in ((rank - k) % n for k in range(1, n))
                if recv_counts[i]]
    # (peer, first, last) of each piece in x's elements (runs_in) or the pack buffer, and its
    # [start, length] along s; peers in ring order, as gloo's own all-to-all
    pieces, at = [], 0
    for j in ((rank + k) % n for k in range(1, n)):
        m = send_counts[j]
        if m:
            first = send_starts[j] * after if runs_in else at
            pieces.append((j, first, first + m, tuple(send_shapes[j]), send_starts[j], send_sizes[j]))
            at += 0 if runs_in else m
    own = bool(lengths[rank] and recv_counts[rank])

    def run(k: CallState, xt: Any, prepared: Any = None) -> Any:
        tally = k.tally
        out = alloc(arrays, tally, result_shape, like=xt)
        landing = out.reshape(-1) if direct else alloc(arrays, tally, [remote_in], like=xt)
        recvs = [(i, landing[a:b]) for i, a, b in receives]

        def sends() -> Iterator[tuple[int, Any]]:  # runs once the receives are posted
            source = xt.reshape(-1) if runs_in else pack_buffer(k, remote_out, like=xt)
            for j, a, b, shape, start, size in pieces:
                piece = source[a:b]
                if not runs_in:
                    arrays.copy(piece.reshape(shape), narrow(xt, s, start, size))
                yield j, piece
            if own:  # while the others' pieces arrive
                arrays.copy(narrow(out, c, out_starts[rank], lengths[rank]), narrow(xt, s, send_starts[rank], send_sizes[rank]))

        k.primitives.exchange_pairs(recvs, sends(), k.op, tally)
        if not runs_in and remote_out:
            tally.packs += 1
        if not direct:
            unpack_others(k, out, landing, recv_shapes, c)
        tally.landing = data_ptr(landing)
        return out

    return run
