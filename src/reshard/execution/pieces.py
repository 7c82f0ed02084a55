"""Cutting an array into pieces, packing them into one buffer, and unpacking what arrives.

Shared by every engine's exchange form and by the gather and reduce collectives; each function
takes the call it runs in (``engines.base.CallState``) for its array backend, counters and engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..planning.layout import offsets
from .arrays import data_ptr, is_torch, numel
from .buffers import alloc, scratch

Array = Any  # torch.Tensor or numpy.ndarray


def narrow(x: Array, dim: int, start: int, length: int) -> Array:
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def with_dim(shape: Sequence[int], dim: int, value: int) -> list[int]:
    out = list(shape)
    out[dim] = value
    return out


def segments(flat: Array, shapes: Sequence[Sequence[int]]) -> list[Array]:
    """Views of consecutive runs of ``flat`` shaped as ``shapes``."""
    views, at = [], 0
    for shape in shapes:
        n = numel(shape)
        views.append(flat[at : at + n].reshape(tuple(shape)))
        at += n
    return views


def swap01(a: Array) -> Array:
    return a.transpose(0, 1) if is_torch(a) else a.swapaxes(0, 1)


def as_run(first: Array, count: int) -> Array:
    """The ``count`` elements starting at ``first[0]`` (they are known to be one run)."""
    if is_torch(first):
        return first.as_strided((count,), (1,))
    import numpy as np

    return np.lib.stride_tricks.as_strided(first, shape=(count,), strides=(first.itemsize,), writeable=False)


def contiguous(call: Any, x: Array) -> Array:
    """``x`` as one run of memory, counted as a pack copy when that takes one."""
    if call.arrays.is_contiguous(x):
        return x
    call.tally.packs += 1
    call.tally.allocated += numel(x.shape) * call.arrays.itemsize(x)
    return x.contiguous() if is_torch(x) else x.copy()


def pack(call: Any, x: Array, dim: int, sizes: Sequence[int]) -> tuple[Array, list[list[int]]]:
    """One send buffer holding ``x`` cut along ``dim`` into ``sizes``, piece j at segment j."""
    arrays = call.arrays
    shapes = [with_dim(x.shape, dim, s) for s in sizes]
    if arrays.is_contiguous(x) and numel(x.shape[:dim]) == 1:
        return x.reshape(-1), shapes  # the pieces already are consecutive runs of x
    # The kept buffer, not a fresh one: a fresh 1 MiB send buffer page-faulted on some calls.
    send = scratch(arrays, call.tally, numel(x.shape), like=x)
    for view, start, size in zip(segments(send, shapes), offsets(sizes), sizes):
        if size:
            arrays.copy(view, narrow(x, dim, start, size))
    call.tally.packs += 1
    return send, shapes


def exchange_packed(
    call: Any, send: Array, send_shapes: Sequence[Sequence[int]], recv_shapes: Sequence[Sequence[int]],
    out_shape: Sequence[int], concat_dim: int, like: Array,
) -> Array:
    """Send segment j of the packed ``send`` to rank j in one engine call; concatenate what
    arrives along ``concat_dim`` in rank order."""
    arrays, tally = call.arrays, call.tally
    direct = numel(out_shape[:concat_dim]) == 1
    if direct:  # received pieces, stacked in rank order, already are the result
        out = alloc(arrays, tally, out_shape, like=like)
        recv = out.reshape(-1)
    else:
        recv = alloc(arrays, tally, [sum(numel(s) for s in recv_shapes)], like=like)
    item = arrays.itemsize(like)
    send_counts = [numel(s) * item for s in send_shapes]
    recv_counts = [numel(s) * item for s in recv_shapes]
    tally.landing = data_ptr(recv)
    call.primitives.alltoallv(arrays.bytes_of(recv), arrays.bytes_of(send), recv_counts, send_counts, call.op)
    if direct:
        return out
    out = alloc(arrays, tally, out_shape, like=like)
    lengths = [s[concat_dim] for s in recv_shapes]
    for view, start, length in zip(segments(recv, recv_shapes), offsets(lengths), lengths):
        if length and numel(view.shape):
            arrays.copy(narrow(out, concat_dim, start, length), view)
    tally.unpacks += 1
    return out


def unpack_others(call: Any, out: Array, side: Array, recv_shapes: Sequence[Sequence[int]], c: int) -> None:
    """Copy the other ranks' pieces, consecutive in rank order in the 1-D ``side`` buffer (the
    own piece absent), into their places along ``c`` in ``out``."""
    arrays, rank = call.arrays, call.rank
    lengths = [shape[c] for shape in recv_shapes]
    starts = offsets(lengths)
    others = [i for i in range(call.size) if i != rank]
    for view, i in zip(segments(side, [recv_shapes[i] for i in others]), others):
        if lengths[i] and numel(view.shape):
            arrays.copy(narrow(out, c, starts[i], lengths[i]), view)
    call.tally.unpacks += 1
