"""The public collectives on the local shard.

Each op validates its input, runs the cross-rank agreement check (one small all-gather of
fixed-size records, which also tells every rank the others' shapes), packs into one send
buffer, moves the pieces in one round of the engine (one call; on gloo one message per
peer), and unpacks. Shapes in docstrings follow ``jax.lax``: ``N`` is the world size, ``r``
this rank, ``sizes = split_sizes or shard_sizes(x.shape[split_dim], N)``.

Copy budget (element copies outside the engine, per op):

* all_to_all on torch engines: one pack copy, unless every piece is already a run of ``x``
  (``x`` contiguous, all dims before ``split_dim`` of size 1); no unpack when the received
  pieces stacked in rank order already are the result (all dims before ``concat_dim`` of size
  1), one otherwise. So Shard(0)->Shard(1) costs one pack and no unpack, Shard(1)->Shard(0) no
  pack and one unpack. On gloo the pieces travel as one message per peer and the own piece is
  copied straight from ``x`` into the result, so the pack covers the (N-1)/N that leaves
  (``_pairwise_plan``); NCCL packs the whole shard for one ``all_to_all_single``. On MPI, contiguous inputs (up to TYPED_MAX_BYTES) take the datatype path
  (no pack, no unpack); the byte path there keeps the own piece out of the engine (copied
  straight into the result) and packs only the others, once (see ``_split_exchange``).
* all_gather / gather: none when ``dim`` is the leading dim and sizes are even; one unpack
  otherwise (uneven all_gather pads: one more).
* reduce_scatter: the pack as in all_to_all, then the rank-ordered reduction.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import _check
from .arrays import check_array, dtype_name, is_numpy, is_torch, kit_for, numel, to_torch
from .comm import Comm, current
from .errors import InvalidArgument, MismatchError, ReshardError, UnsupportedDType
from .layout import (
    REDUCE_OPS,
    Partial,
    Replicate,
    Shard,
    check_int,
    normalize_dim,
    offsets,
    parse_placement,
    shard_sizes,
)

Array = Any  # torch.Tensor or numpy.ndarray


@dataclass
class ExchangeStats:
    """What the last exchange on this process did: for tests, ``explain`` and ``bench``."""

    op: str
    pack_copies: int = 0
    unpack_copies: int = 0
    bytes_sent: int = 0  # bytes that left this rank (its own piece excluded)
    bytes_received: int = 0  # bytes that arrived from other ranks
    recv_buffer_ptr: int = 0  # where the engine wrote what it received
    metadata_exchanges: int = 0
    allocated_bytes: int = 0  # buffers and results this op allocated (its memory beyond the input)
    replayed: bool = False  # the plan of an earlier call with the same signature was reused


_last: ExchangeStats | None = None


def last_exchange() -> ExchangeStats | None:
    """Stats of the most recent collective on this process (None before the first)."""
    return _last


def _alloc(call: _Call, shape: Sequence[int], like: Array) -> Array:
    """kit.empty, counted: ``explain`` and ``bench`` report the memory an op really took."""
    call.stats.allocated_bytes += numel(shape) * call.kit.itemsize(like)
    return call.kit.empty(shape, like=like)


def _data_ptr(a: Array) -> int:
    return a.data_ptr() if is_torch(a) else a.__array_interface__["data"][0]


def _narrow(x: Array, dim: int, start: int, length: int) -> Array:
    return x[(slice(None),) * dim + (slice(start, start + length),)]


def _with_dim(shape: Sequence[int], dim: int, value: int) -> list[int]:
    out = list(shape)
    out[dim] = value
    return out


def _segments(kit: Any, flat: Array, shapes: Sequence[Sequence[int]]) -> list[Array]:
    """Views of consecutive runs of ``flat`` shaped as ``shapes``."""
    views, at = [], 0
    for shape in shapes:
        n = numel(shape)
        views.append(flat[at : at + n].reshape(tuple(shape)))
        at += n
    return views


# -- repeated calls -------------------------------------------------------------------------
#
# Training loops call the same op on the same shapes every step. The first call of a
# signature (op, arguments, input shape, dtype, device, contiguity, check) validates, checks
# and works out the exchange (piece shapes, datatypes, counts); later calls replay that plan.
# With the check on (or when the peers' shapes are needed) a replay still exchanges its record
# with every rank and compares all of them, byte for byte, with those the plan was made from:
# any change on any rank falls back to the full path with the records already in hand, so a
# replay raises exactly what the full path would.

_MISS = object()
_PLANS_MAX = 256  # signatures kept per communicator; a long run over many shapes starts over
_PLANS_BYTES = 64 << 20  # and at most this much of kept records (N records of ~N ints each)


@dataclass
class _Plan:
    record: Any  # this rank's encoded check record, or None when the call exchanged none
    gathered: bytes | None  # every rank's records, as they were when the plan was made
    run: Callable[..., Array]  # (call, x) -> result
    kit: Any
    numpy_in: bool
    detach: bool
    grad: Callable[..., Array] | None  # (call, x, out) -> out on the autograd tape


_PLAIN_TYPES = (int, str, Shard, Replicate, Partial)


def _plain(value: Any) -> Any:
    """``value`` as a key part: plain ints, strings, placements, None and tuples/lists of them
    (type included, so True and 1 differ); TypeError for anything else (no replay then)."""
    kind = type(value)
    if value is None:
        return None
    if kind in (tuple, list):
        return (kind, tuple(_plain(v) for v in value))
    if kind not in _PLAIN_TYPES or (kind is Shard and type(value.dim) is not int):
        raise TypeError(kind)
    return (kind, value)


def _signature(op: str, x: Any, check: bool, args: tuple) -> tuple | None:
    """What decides a call's plan on this rank (requires_grad last), or None (never replayed)."""
    try:
        if is_torch(x):
            return (op, _plain(args), check, type(x), x.dtype, x.device, tuple(x.shape), x.is_contiguous(), x.requires_grad)
        if is_numpy(x):
            return (op, _plain(args), check, type(x), x.dtype, x.shape, x.strides, x.flags.writeable, False)
    except (TypeError, RuntimeError):
        pass
    return None


class _Call:
    """One collective call on one rank: input conversion, validation, the agreement check."""

    def __init__(self, op: str, x: Any, comm: Comm | None, check: bool | None, arg_names: Sequence[str] = ()):
        self.op = op
        self.comm = current(comm)
        self.check = self.comm.check if check is None else bool(check)
        self.impl = self.comm._impl
        self.kit = self.impl.kit
        self.rank, self.size = self.comm.rank, self.comm.size
        self.numpy_in = False
        self.x = x
        self.record = _check.Record(op=op, arg_names=tuple(arg_names))
        self.error: ReshardError | None = None
        self.stats = ExchangeStats(op)
        self.overlapped: Any = None
        self.key: tuple | None = None  # the call's signature, when it can be replayed
        self.pregathered: Any = None  # records a replay already gathered (and found changed)
        self.sent_record: Any = None
        self.gathered_raw: bytes | None = None

    def replay(self, args: tuple) -> Any:
        """This call's result from the plan of an earlier call with the same signature, or
        ``_MISS``. The plan stands only while every rank's records are byte-identical to the
        ones it was made from, so the check (when on) is one exchange and one comparison; when
        they changed, the full path takes over with the records already gathered."""
        key = _signature(self.op, self.x, self.check, args)
        if key is None:
            return _MISS
        self.key = key
        plan = self.comm._plans.get(key)
        if plan is None:
            return _MISS
        if plan.record is not None:
            gathered = self.impl.start_allgather_bytes(plan.record, f"{self.op} (check)")()
            self.stats.metadata_exchanges += 1
            if gathered.tobytes() != plan.gathered:
                self.pregathered = gathered
                return _MISS
        x = self.x
        self.kit = plan.kit
        self.stats.replayed = True
        if plan.numpy_in:
            self.numpy_in = True
            x = to_torch(x)
        elif plan.detach:
            x = x.detach()
        out = plan.run(self, x)
        if plan.grad is not None and _wants_grad(self.x):
            out = plan.grad(self, self.x, out)
        return self.result(out)

    def run_and_remember(self, run: Callable[..., Array]) -> Array:
        """``run(self, self.x)``, kept for replay (ops with no autograd rule of their own)."""
        out = run(self, self.x)
        self.remember(lambda k, xt, sent=None: run(k, xt))
        return out

    def remember(self, run: Callable[..., Array], grad: Callable[..., Array] | None = None) -> None:
        """Keep what this (successful) call worked out, for the next call with its signature."""
        if self.key is None:
            return
        plans = self.comm._plans
        if len(plans) >= max(4, min(_PLANS_MAX, _PLANS_BYTES // max(1, len(self.gathered_raw or b"")))):
            plans.clear()
        x = self.x
        detach = is_torch(x) and self.key[-1]  # requires_grad
        plans[self.key] = _Plan(self.sent_record, self.gathered_raw, run, self.kit, self.numpy_in, bool(detach), grad)

    @contextlib.contextmanager
    def validating(self) -> Iterator[None]:
        """Local validation: an error is held for the check, so every rank can raise it."""
        try:
            yield
        except ReshardError as exc:
            msg = str(exc)
            if not msg.startswith(f"rank {self.rank}"):
                exc.args = (f"rank {self.rank}: {self.op}: {msg}",) + exc.args[1:]
            self.error = exc
            self.record.fail(exc)

    def take_input(self, need_dims: bool = True) -> None:
        x = self.x
        check_array(x, "x", need_dims)
        self.record.dtype = dtype_name(x)
        self.record.shape = tuple(int(s) for s in x.shape)
        if is_numpy(x) and self.kit.name == "torch":
            self.numpy_in = True
            x = to_torch(x)
        elif is_torch(x):
            self.kit = kit_for("torch")  # torch CPU tensors on MPI: the engine sees them as buffers
        if is_torch(x):
            self.record.device = x.device.type
            if x.device.type != "cpu" and self.comm.engine in ("gloo", "mpi"):
                raise InvalidArgument(
                    f"x is on {x.device}, but this communicator's engine ({self.comm.engine}) moves CPU tensors only"
                )
            if x.device.type == "cpu" and self.comm.engine == "nccl":
                raise InvalidArgument("x is on the CPU, but this communicator's engine (nccl) moves CUDA tensors only")
            if x.requires_grad:
                x = x.detach()
        else:
            self.record.device = "cpu"
        self.x = x

    def agree(
        self, free_dims: Sequence[int] = (), need_shapes: bool = True, per_rank_splits: bool = False,
        while_waiting: Any = None,
    ) -> list[tuple[int, ...]] | None:
        """Run the check (if on) or the metadata exchange (if needed); raise on any problem.

        Returns every rank's input shape, or None when neither check nor shapes were needed.
        ``while_waiting()`` (local work, e.g. the pack) runs while the records are in flight,
        unless this rank's input was already found invalid; its result is ``self.overlapped``.
        """
        if not self.check and not need_shapes:
            if self.error is not None:
                raise self.error
            if while_waiting is not None:
                self.overlapped = while_waiting()
            return None
        raw = _check.encode(self.record, self.size)
        if self.pregathered is not None:  # a replay exchanged this very record already
            finish = lambda: self.pregathered  # noqa: E731
        else:
            finish = self.impl.start_allgather_bytes(raw, f"{self.op} (check)")
            self.stats.metadata_exchanges += 1
        if while_waiting is not None and self.error is None:
            self.overlapped = while_waiting()  # local work (the pack) while the records travel
        gathered = finish()
        self.sent_record, self.gathered_raw = raw, gathered.tobytes()
        records = [_check.decode(row, self.size, self.record.arg_names) for row in gathered]
        if self.error is None and self.record.error_code:  # e.g. too many dims, found by encode
            self.error = _check.ERROR_CODES[self.record.error_code](self.record.message)
        _check.raise_errors(records, self.rank, self.error)
        if self.check:
            _check.compare(records, free_dims, per_rank_splits)
        self.records = records
        return [r.shape for r in records]

    def result(self, out: Array) -> Array:
        global _last
        _last = self.stats
        if self.numpy_in and out is not None:
            return out.numpy()
        return out


def _counts_arg(values: Any, parts: int, name: str) -> tuple[int, ...]:
    """One non-negative int per rank (ints, numpy ints or a 1-D integer tensor/array)."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    try:
        sizes = [check_int(f"{name}[{i}]", s) for i, s in enumerate(values)]
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence of {parts} ints, got {values!r}") from None
    if len(sizes) != parts:
        raise InvalidArgument(f"{name} has {len(sizes)} entries; it needs one per rank ({parts})")
    if any(s < 0 for s in sizes):
        raise InvalidArgument(f"{name} has a negative entry: {sizes}")
    return tuple(sizes)


def _sizes_arg(split_sizes: Any, length: int, parts: int, name: str = "split_sizes") -> tuple[int, ...]:
    sizes = _counts_arg(split_sizes, parts, name)
    if sum(sizes) != length:
        raise InvalidArgument(f"{name} {sizes} sums to {sum(sizes)}, but the split dim has length {length}")
    return tuple(sizes)


def _pack(call: _Call, x: Array, dim: int, sizes: Sequence[int]) -> tuple[Array, list[list[int]]]:
    """One send buffer holding ``x`` cut along ``dim`` into ``sizes``, piece j at segment j."""
    kit = call.kit
    shapes = [_with_dim(x.shape, dim, s) for s in sizes]
    if kit.is_contiguous(x) and numel(x.shape[:dim]) == 1:
        return x.reshape(-1), shapes  # the pieces already are consecutive runs of x
    # The kept buffer, not a fresh one: a fresh 1 MiB send buffer page-faulted on some calls
    # (256 faults, about 150 us, against 440 us for the whole gloo call; measured, 2 ranks).
    send = _scratch(call, numel(x.shape), like=x)
    for view, start, size in zip(_segments(kit, send, shapes), offsets(sizes), sizes):
        if size:
            kit.copy(view, _narrow(x, dim, start, size))
    call.stats.pack_copies += 1
    return send, shapes


def _exchange(
    call: _Call, send: Array, send_shapes: Sequence[Sequence[int]], recv_shapes: Sequence[Sequence[int]],
    out_shape: Sequence[int], concat_dim: int, like: Array,
) -> Array:
    """Send piece j to rank j, concatenate what arrives along ``concat_dim`` in rank order."""
    kit, rank = call.kit, call.rank
    direct = numel(out_shape[:concat_dim]) == 1
    if direct:  # received pieces, stacked in rank order, already are the result
        out = _alloc(call, out_shape, like=like)
        recv = out.reshape(-1)
    else:
        recv = _alloc(call, [sum(numel(s) for s in recv_shapes)], like=like)
    item = kit.itemsize(like)
    send_counts = [numel(s) * item for s in send_shapes]
    recv_counts = [numel(s) * item for s in recv_shapes]
    call.stats.bytes_sent += sum(send_counts) - send_counts[rank]
    call.stats.bytes_received += sum(recv_counts) - recv_counts[rank]
    call.stats.recv_buffer_ptr = _data_ptr(recv)
    call.impl.alltoallv(kit.bytes_of(recv), kit.bytes_of(send), recv_counts, send_counts, call.op)
    if direct:
        return out
    out = _alloc(call, out_shape, like=like)
    lengths = [s[concat_dim] for s in recv_shapes]
    for view, start, length in zip(_segments(kit, recv, recv_shapes), offsets(lengths), lengths):
        if length and numel(view.shape):
            kit.copy(_narrow(out, concat_dim, start, length), view)
    call.stats.unpack_copies += 1
    return out


def _split_table(
    s: int, split_sizes: Sequence[int] | None, shapes: Sequence[Sequence[int]]
) -> list[tuple[int, ...]]:
    """Every rank's split of its ``x`` along ``s``: row i is what rank i sends to each rank."""
    n = len(shapes)
    return [tuple(split_sizes) if split_sizes is not None else shard_sizes(sh[s], n) for sh in shapes]


def _all_to_all_core(
    call: _Call, x: Array, s: int, c: int, splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]],
    sent: _PeerSend | None = None,
) -> Array:
    """The exchange, given every rank's input shape and split table (no communication to learn
    them). ``sent``: this rank's send side (``_PeerSend``), when already packed (the pack
    runs while the check's exchange is in flight)."""
    return _all_to_all_plan(call, x, s, c, splits, shapes)(call, x, sent)


def _all_to_all_plan(
    call: _Call, x: Array, s: int, c: int, splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]],
) -> Callable[..., Array]:
    """The exchange for inputs like ``x``, as ``run(call, x, sent=None) -> result``."""
    n, rank = call.size, call.rank
    send_sizes = tuple(splits[rank])
    recv_shapes = [_with_dim(shapes[i], s, splits[i][rank]) for i in range(n)]
    out_shape = _with_dim(recv_shapes[0], c, sum(r[c] for r in recv_shapes))
    if _typed_exchange_fits(call, x, s, c, out_shape):
        return _typed_plan(call, x, s, c, send_sizes, recv_shapes, out_shape)
    if getattr(call.impl, "pairwise", False):
        return _pairwise_plan(call, x, s, c, send_sizes, recv_shapes, out_shape)
    if not getattr(call.impl, "split_exchange", True):
        def run_packed(k: _Call, xt: Array, sent: Any = None) -> Array:
            send, send_shapes = _pack(k, xt, s, send_sizes)
            return _exchange(k, send, send_shapes, recv_shapes, out_shape, c, xt)

        return run_packed

    def run_split(k: _Call, xt: Array, sent: _PeerSend | None = None) -> Array:
        sent = sent if sent is not None else _PeerSend(k, xt, s, send_sizes)
        return _split_exchange(k, xt, s, c, send_sizes, sent, recv_shapes, out_shape)

    return run_split


def _pairwise_plan(
    call: _Call, x: Array, s: int, c: int, send_sizes: Sequence[int], recv_shapes: Sequence[Sequence[int]],
    out_shape: Sequence[int],
) -> Callable[..., Array]:
    """The exchange as one message per peer (gloo): every receive is posted first, straight
    into the result when the received pieces are runs of it; each piece is packed just before
    its send, so the next pack overlaps the bytes already moving; the own piece never enters
    the engine and is copied last, while the others arrive. Every offset and shape is worked
    out here, once: at 1 MiB a call's Python was about a fifth of the bare exchange's time
    (60-70 of 350 us, timed inside the rank)."""
    n, rank, kit, item = call.size, call.rank, call.kit, call.kit.itemsize(x)
    send_shapes = [_with_dim(x.shape, s, k) for k in send_sizes]
    send_counts = [numel(shape) for shape in send_shapes]
    send_starts = offsets(send_sizes)
    recv_counts = [numel(shape) for shape in recv_shapes]
    lengths = [shape[c] for shape in recv_shapes]
    out_starts = offsets(lengths)
    direct = numel(out_shape[:c]) == 1  # the pieces stacked in rank order are the result
    remote_in = sum(recv_counts) - recv_counts[rank]
    remote_out = sum(send_counts) - send_counts[rank]
    result_shape = tuple(out_shape)
    runs_in = kit.is_contiguous(x) and numel(x.shape[:s]) == 1  # the pieces of x are runs of it
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

    def run(k: _Call, xt: Array, sent: Any = None) -> Array:
        out = _alloc(k, result_shape, like=xt)
        landing = out.reshape(-1) if direct else _alloc(k, [remote_in], like=xt)
        recvs = [(i, landing[a:b]) for i, a, b in receives]

        def sends() -> Iterator[tuple[int, Array]]:  # runs once the receives are posted
            source = xt.reshape(-1) if runs_in else _scratch(k, remote_out, like=xt)
            for j, a, b, shape, start, size in pieces:
                piece = source[a:b]
                if not runs_in:
                    kit.copy(piece.reshape(shape), _narrow(xt, s, start, size))
                yield j, piece
            if own:  # while the others' pieces arrive
                kit.copy(_narrow(out, c, out_starts[rank], lengths[rank]), _narrow(xt, s, send_starts[rank], send_sizes[rank]))

        k.impl.exchange_pairs(recvs, sends(), k.op)
        stats = k.stats
        if not runs_in and remote_out:
            stats.pack_copies += 1
        if not direct:
            _unpack_others(k, out, landing, recv_shapes, c)
        stats.recv_buffer_ptr = _data_ptr(landing)
        stats.bytes_sent += remote_out * item
        stats.bytes_received += remote_in * item
        return out

    return run


def _uses_typed_path(call: _Call, x: Array) -> bool:
    """Whether the MPI datatype path may take this input (decided finally by _typed_exchange_fits)."""
    nbytes = numel(x.shape) * call.kit.itemsize(x)
    return hasattr(call.impl, "subarray") and call.kit.is_contiguous(x) and TYPED_MIN_BYTES <= nbytes <= TYPED_MAX_BYTES


# -- the pack buffer and MPI's byte path ------------------------------------------------------
#
# Every path that packs, packs into one buffer kept between calls (page-faulting a fresh
# 16 MiB buffer costs more than packing into it, measured). MPI's byte path (inputs the
# datatype path does not take) keeps the own piece out of the engine: it is copied straight
# from x into the result, and the other pieces travel in one variable all-to-all with the own
# count 0 (``_split_exchange``).

_scratch_local = threading.local()  # per thread: two threads may run ops on two communicators


def _scratch(call: _Call, count: int, like: Array) -> Array:
    """A 1-D buffer of ``count`` elements like ``like``, reused across calls (not zeroed)."""
    item = call.kit.itemsize(like)
    nbytes = count * item
    key = (call.kit.name, getattr(like, "device", None))
    _scratch_cache = _scratch_local.__dict__.setdefault("buffers", {})
    cached = _scratch_cache.get(key)
    if cached is None or cached.shape[0] < nbytes:
        if is_torch(like):
            cached = sys.modules["torch"].empty(max(nbytes, 64), dtype=sys.modules["torch"].uint8, device=like.device)
        else:
            import numpy as np

            cached = np.empty(max(nbytes, 64), dtype=np.uint8)
        _scratch_cache[key] = cached
        call.stats.allocated_bytes += cached.shape[0]
    return cached[:nbytes].view(like.dtype)


def release_buffers() -> None:
    """Drop this thread's pack buffers kept between calls (at most one shard per device);
    ``Comm.close()`` calls it."""
    _scratch_local.__dict__.pop("buffers", None)


class _PeerSend:
    """What this rank sends, cut along ``s`` into ``sizes``: ``lo()`` the pieces for ranks below
    it (one run, rank order), ``hi()`` those for ranks above. Views of ``x`` when its pieces
    already are runs of memory; else each side is packed once, on first use, into the kept
    buffer (own piece skipped), next to each other so ``_adjacent`` finds them one run."""

    def __init__(self, call: _Call, x: Array, s: int, sizes: Sequence[int]):
        self.call, self.x, self.s, self.sizes = call, x, s, tuple(sizes)
        kit, rank = call.kit, call.rank
        self.before, self.after = numel(x.shape[:s]), numel(x.shape[s + 1 :])
        self.starts = offsets(sizes)
        own_start, own_end = self.starts[rank], self.starts[rank] + sizes[rank]
        self.runs = kit.is_contiguous(x) and self.before == 1
        if self.runs:
            flat = x.reshape(-1)
            self.views = [flat[: own_start * self.after], flat[own_end * self.after :]]
            self.done = [True, True]
            return
        lo_count = self.before * own_start * self.after
        hi_count = self.before * (x.shape[s] - own_end) * self.after
        buf = _scratch(call, lo_count + hi_count, like=x)
        self.views = [buf[:lo_count], buf[lo_count:]]
        self.done = [False, False]
        self.x3 = x.reshape(self.before, x.shape[s], self.after) if kit.is_contiguous(x) else None

    def lo(self) -> Array:
        return self._side(0, 0, self.call.rank)

    def hi(self) -> Array:
        return self._side(1, self.call.rank + 1, len(self.sizes))

    def both(self) -> _PeerSend:
        self.lo()
        self.hi()
        return self

    def _side(self, which: int, first: int, last: int) -> Array:
        view = self.views[which]
        if self.done[which]:
            return view
        self.done[which] = True
        if first == last or view.shape[0] == 0:
            return view
        kit, sizes, starts, x = self.call.kit, self.sizes, self.starts, self.x
        k = sizes[first]
        if self.x3 is not None and all(sizes[j] == k for j in range(first, last)):
            # equal pieces: one strided copy of a [pieces, before, k, after] view
            src = self.x3[:, starts[first] : starts[last - 1] + k].reshape(self.before, last - first, k, self.after)
            kit.copy(view.reshape(last - first, self.before, k, self.after), _swap01(src))
        else:
            at = 0
            for j in range(first, last):
                shape = _with_dim(x.shape, self.s, sizes[j])
                m = numel(shape)
                if m:
                    kit.copy(view[at : at + m].reshape(tuple(shape)), _narrow(x, self.s, starts[j], sizes[j]))
                at += m
        self.call.stats.pack_copies = max(self.call.stats.pack_copies, 1)  # both sides: one copy of x
        return view


def _adjacent(call: _Call, x: Array, sent: _PeerSend) -> Array:
    """The lower and higher pieces as one run (packing them together when they are not)."""
    lo, hi = sent.lo(), sent.hi()
    n_lo, n_hi = lo.shape[0], hi.shape[0]
    item = call.kit.itemsize(x)
    if n_hi == 0:
        return lo
    if n_lo == 0:
        return hi
    if _data_ptr(lo) + n_lo * item == _data_ptr(hi):
        return _as_run(lo, n_lo + n_hi)
    buf = _scratch(call, n_lo + n_hi, like=x)
    call.kit.copy(buf[:n_lo], lo)
    call.kit.copy(buf[n_lo:], hi)
    call.stats.pack_copies += 1
    return buf


def _as_run(first: Array, count: int) -> Array:
    """The ``count`` elements starting at ``first[0]`` (they are known to be one run)."""
    if is_torch(first):
        return first.as_strided((count,), (1,))
    import numpy as np

    return np.lib.stride_tricks.as_strided(first, shape=(count,), strides=(first.itemsize,), writeable=False)


def _swap01(a: Array) -> Array:
    return a.transpose(0, 1) if is_torch(a) else a.swapaxes(0, 1)


def _split_exchange(
    call: _Call, x: Array, s: int, c: int, send_sizes: Sequence[int], sent: _PeerSend,
    recv_shapes: Sequence[Sequence[int]], out_shape: Sequence[int],
) -> Array:
    """Own piece copied straight from ``x``; the others in one engine call with the own count
    0, into the result itself when the stacked pieces are the result, else into a side buffer
    that is unpacked once."""
    kit, rank, n = call.kit, call.rank, call.size
    item = kit.itemsize(x)
    send_bytes = [numel(_with_dim(x.shape, s, k)) * item for k in send_sizes]
    recv_bytes = [numel(shape) * item for shape in recv_shapes]
    out = _alloc(call, out_shape, like=x)
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
        call.stats.recv_buffer_ptr = _data_ptr(out)
    else:
        temp = _alloc(call, [(sum(recv_bytes) - recv_bytes[rank]) // item], like=x)
        call.stats.recv_buffer_ptr = _data_ptr(temp)
    call.stats.bytes_sent += sum(send_bytes) - send_bytes[rank]
    call.stats.bytes_received += sum(recv_bytes) - recv_bytes[rank]
    if n > 1:  # [lower | higher] pieces in one run on each side; own count 0
        own_out = [v if j != rank else 0 for j, v in enumerate(send_bytes)]
        own_in = [v if i != rank else 0 for i, v in enumerate(recv_bytes)]
        call.impl.alltoallv(kit.bytes_of(temp), kit.bytes_of(_adjacent(call, x, sent)), own_in, own_out, call.op)
    if shifted and own_len and hi_len:
        end = own_at + hi_len
        while end > own_at:
            start = max(own_at, end - own_len)
            kit.copy(flat[start + own_len : end + own_len], flat[start:end])
            end = start
        call.stats.unpack_copies += 1
    if lengths[rank] and numel(recv_shapes[rank]):
        own_start = sum(send_sizes[:rank])
        kit.copy(_narrow(out, c, starts[rank], lengths[rank]), _narrow(x, s, own_start, send_sizes[rank]))
    if not shifted:
        _unpack_others(call, out, temp, recv_shapes, c)
    return out


def _unpack_others(call: _Call, out: Array, side: Array, recv_shapes: Sequence[Sequence[int]], c: int) -> None:
    """Copy the other ranks' pieces, consecutive in rank order in the 1-D ``side`` buffer (the
    own piece absent), into their places along ``c`` in ``out``."""
    kit, rank = call.kit, call.rank
    lengths = [shape[c] for shape in recv_shapes]
    starts = offsets(lengths)
    others = [i for i in range(call.size) if i != rank]
    for view, i in zip(_segments(kit, side, [recv_shapes[i] for i in others]), others):
        if lengths[i] and numel(view.shape):
            kit.copy(_narrow(out, c, starts[i], lengths[i]), view)
    call.stats.unpack_copies += 1


# The MPI engine's datatype path moves pieces straight from ``x`` into the result: one
# subarray datatype per peer on each side, so neither a pack nor an unpack buffer exists.
# Measured faster than pack + byte exchange at every size up to 16 MiB per rank; the bounds
# come from ``reshard bench --engine mpi`` (benchmarks/RESULTS.md).
TYPED_MIN_BYTES = int(os.environ.get("RESHARD_MPI_TYPED_MIN_BYTES", "0"))
# No upper bound by default. The datatype path once looked erratic above 16 MiB (4 ranks,
# 64 MiB: 47-425 ms per call against 10-19 ms raw); the cause was page faults in torch's fresh
# result buffers, not the datatypes (arrays.TorchKit.empty). With results reusing kept memory
# it is steady and faster than pack + bytes at 64 MiB too (4 ranks 19.5 vs 32.2 ms, worst
# of 12 iterations 23.6 vs 42.6 ms). The variable stays for measuring the byte path.
TYPED_MAX_BYTES = int(os.environ.get("RESHARD_MPI_TYPED_MAX_BYTES", str(1 << 62)))
_INT_MAX = 2**31 - 1


def _collapsed(shape: Sequence[int], dim: int) -> list[int]:
    """``shape`` as [before, shape[dim], after]: a subarray type with at most three dims."""
    return [numel(shape[:dim]), shape[dim], numel(shape[dim + 1 :])]


def _typed_exchange_fits(call: _Call, x: Array, s: int, c: int, out_shape: Sequence[int]) -> bool:
    if not _uses_typed_path(call, x):
        return False
    if numel(x.shape[:s]) == 1 and numel(out_shape[:c]) == 1:
        return False  # pieces and result are plain runs: the byte exchange copies nothing anyway
    dims = _collapsed(x.shape, s) + _collapsed(out_shape, c)
    return max(dims) <= _INT_MAX


def _typed_plan(
    call: _Call, x: Array, s: int, c: int, send_sizes: Sequence[int], recv_shapes: Sequence[Sequence[int]],
    out_shape: Sequence[int],
) -> Callable[..., Array]:
    """The datatype exchange with its types and counts worked out once."""
    impl, rank, item = call.impl, call.rank, call.kit.itemsize(x)
    send_full, recv_full = _collapsed(x.shape, s), _collapsed(out_shape, c)
    send_types = [
        impl.subarray(send_full, _with_dim(send_full, 1, size), [0, start, 0], item)
        for size, start in zip(send_sizes, offsets(send_sizes))
    ]
    lengths = [r[c] for r in recv_shapes]
    recv_types = [
        impl.subarray(recv_full, _with_dim(recv_full, 1, length), [0, start, 0], item)
        for length, start in zip(lengths, offsets(lengths))
    ]
    send_bytes = [numel(_with_dim(x.shape, s, size)) * item for size in send_sizes]
    recv_bytes = [numel(r) * item for r in recv_shapes]
    bytes_out, bytes_in = sum(send_bytes) - send_bytes[rank], sum(recv_bytes) - recv_bytes[rank]
    exchange = impl.alltoallw_plan(recv_types, send_types, call.op)
    epoch, result_shape, result_bytes = impl.types_epoch, tuple(out_shape), numel(out_shape) * item

    def run(k: _Call, xt: Array, sent: Any = None) -> Array:
        if impl.types_epoch != epoch:  # the engine freed its types since: work them out again
            return _typed_plan(k, xt, s, c, send_sizes, recv_shapes, out_shape)(k, xt)
        out = k.kit.empty(result_shape, like=xt)
        stats = k.stats
        stats.allocated_bytes += result_bytes
        stats.bytes_sent += bytes_out
        stats.bytes_received += bytes_in
        stats.recv_buffer_ptr = _data_ptr(out)
        exchange(out, xt)  # both contiguous: the datatypes address their elements
        return out

    return run


def all_to_all(
    x: Array, split_dim: int, concat_dim: int, comm: Comm | None = None,
    split_sizes: Sequence[int] | None = None, *, check: bool | None = None,
) -> Array:
    """Cut ``x`` along ``split_dim`` into one piece per rank, send piece j to rank j, and
    concatenate what arrives along ``concat_dim`` in rank order. Sums nothing, copies nothing
    twice: the layout exchange of the card (``all_to_all(A_rows, split_dim=1, concat_dim=0)``).

    Args:
      x: the local shard, ``[..., S, ..., C_r, ...]`` (``S`` at ``split_dim``, ``C_r`` at
        ``concat_dim``). Every dim but ``concat_dim`` must agree across ranks.
      split_dim, concat_dim: ints, negative counts from the end; may be equal.
      split_sizes: how to cut ``split_dim`` (one int per rank, same on every rank); default the
        balanced rule ``shard_sizes(S, N)``.

    Returns:
      With ``split_dim != concat_dim``: ``x.shape`` with ``S -> sizes[r]`` and
      ``C_r -> sum over ranks i of C_i``. With ``split_dim == concat_dim``: that dim becomes
      ``sum over i of sizes_i[r]``. Same shapes as ``jax.lax.all_to_all(..., tiled=True)``.
      numpy in, numpy out. ``x`` is never modified.

    Copies: one pack unless ``split_dim`` is effectively leading; one unpack unless
    ``concat_dim`` is effectively leading (see the module docstring).
    """
    call = _Call("all_to_all", x, comm, check, ("split_dim", "concat_dim"))
    replayed = call.replay((split_dim, concat_dim, split_sizes))
    if replayed is not _MISS:
        return replayed
    s = c = 0
    sizes = None
    with call.validating():
        call.take_input()
        nd = call.x.ndim
        s = normalize_dim(split_dim, nd, "split_dim")
        c = normalize_dim(concat_dim, nd, "concat_dim")
        call.record.args = (s, c)
        if split_sizes is not None:
            sizes = _sizes_arg(split_sizes, call.x.shape[s], call.size)
            call.record.split_sizes = sizes
    shapes = call.agree(free_dims=(c,), while_waiting=_pack_while_waiting(call, s, sizes))
    splits = _split_table(s, sizes, shapes)
    run = _all_to_all_plan(call, call.x, s, c, splits, shapes)
    out = run(call, call.x, call.overlapped)

    def grad(k: _Call, x: Array, out: Array) -> Array:
        from . import autograd

        return autograd.attach_all_to_all(x, out, k.comm, s, c, splits, shapes)

    if _wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad)
    return call.result(out)


def _pack_while_waiting(call: _Call, s: int, sizes: Sequence[int] | None) -> Any:
    """The pack as a job to run during the check, where the byte path will need one."""
    x = call.x
    if call.error is not None or _uses_typed_path(call, x) or not getattr(call.impl, "split_exchange", True):
        return None
    own = tuple(sizes) if sizes is not None else shard_sizes(x.shape[s], call.size)
    return lambda: _PeerSend(call, x, s, own).both()


def _wants_grad(x: Any) -> bool:
    """A torch tensor on the autograd tape: the result gets a backward (the reverse exchange)."""
    return is_torch(x) and x.requires_grad and sys.modules["torch"].is_grad_enabled()


def all_to_all_v(
    x: Array, send_counts: Sequence[int], comm: Comm | None = None, *,
    recv_counts: Sequence[int] | None = None, check: bool | None = None,
) -> tuple[Array, list[int]]:
    """Variable-size AllToAll along dim 0: rows ``[sum(send_counts[:j]), +send_counts[j])`` of
    ``x`` go to rank j; what arrives is concatenated in rank order.

    Args:
      x: ``[T, *F]`` with ``T == sum(send_counts)``; ``F`` (any trailing dims, maybe none)
        and the dtype agree across ranks. Zero counts are fine.
      send_counts: one int per rank.
      recv_counts: this rank's receive counts when already known (e.g. the ``recv_counts`` of the
        forward exchange, for the reverse one): with ``check=False`` no count exchange runs at all.

    Returns:
      ``(received, recv_counts)``: ``received`` is ``[sum_i send_counts_i[r], *F]`` (rank i's rows
      for this rank, in rank order) and ``recv_counts[i] = send_counts_i[r]``, so the reverse
      exchange is ``all_to_all_v(y, recv_counts, recv_counts=send_counts)``. numpy in, numpy out.

    The counts travel as one small exchange of integers (inside the check's exchange when the
    check is on) and are validated as a whole matrix: every rank raises, naming the ranks.
    """
    call = _Call("all_to_all_v", x, comm, check)
    counts: tuple[int, ...] = ()
    known = None
    with call.validating():
        call.take_input()
        counts = _sizes_arg(send_counts, call.x.shape[0], call.size, "send_counts")
        call.record.split_sizes = counts
        if recv_counts is not None:
            known = _counts_arg(recv_counts, call.size, "recv_counts")
    if known is not None and not call.check and call.error is None:
        matrix = None
    else:
        call.agree(free_dims=(0,), per_rank_splits=True)
        matrix = [r.split_sizes for r in call.records]
    rank, n = call.rank, call.size
    got = list(known) if matrix is None else [matrix[i][rank] for i in range(n)]
    if matrix is not None and known is not None and tuple(known) != tuple(got):
        raise MismatchError(
            f"rank {rank}: all_to_all_v: recv_counts {list(known)} were passed, but the ranks send this "
            f"rank {got} (send_counts per rank: {[list(m) for m in matrix]})"
        )
    trail = list(call.x.shape[1:])
    xt = call.x
    src = xt if call.kit.is_contiguous(xt) else _contiguous(call, xt)
    out = _exchange(call, src.reshape(-1), [[k, *trail] for k in counts], [[k, *trail] for k in got],
                    [sum(got), *trail], 0, xt)
    if _wants_grad(x):
        from . import autograd

        out = autograd.attach_all_to_all_v(x, out, call.comm, list(counts), got)
    return call.result(out), got


def _contiguous(call: _Call, x: Array) -> Array:
    call.stats.pack_copies += 1
    call.stats.allocated_bytes += numel(x.shape) * call.kit.itemsize(x)
    return x.contiguous() if is_torch(x) else x.copy()


def _gather_core(call: _Call, x: Array, dim: int, shapes: Sequence[Sequence[int]], dst: int | None) -> Array | None:
    """all_gather (dst None) or gather to ``dst``, concatenating along ``dim`` in rank order."""
    kit, n, rank = call.kit, call.size, call.rank
    lengths = [sh[dim] for sh in shapes]
    out_shape = _with_dim(x.shape, dim, sum(lengths))
    recv_shapes = [_with_dim(x.shape, dim, length) for length in lengths]
    src = x if kit.is_contiguous(x) else x.contiguous() if is_torch(x) else x.copy()
    if src is not x:
        call.stats.pack_copies += 1
    flat = src.reshape(-1)
    if dst is None and len(set(lengths)) == 1:
        # Equal pieces: one native all-gather, straight into the result when dim leads.
        direct = numel(out_shape[:dim]) == 1
        out = _alloc(call, out_shape, like=x)
        recv = out.reshape(-1) if direct else _alloc(call, [numel(out_shape)], like=x)
        call.stats.recv_buffer_ptr = _data_ptr(recv)
        nbytes = numel(x.shape) * kit.itemsize(x)
        call.stats.bytes_sent += nbytes * (n - 1)
        call.stats.bytes_received += nbytes * (n - 1)
        call.impl.allgather(kit.bytes_of(recv), kit.bytes_of(flat), call.op)
        if not direct:
            for view, start in zip(_segments(kit, recv, recv_shapes), offsets(lengths)):
                kit.copy(_narrow(out, dim, start, lengths[0]), view)
            call.stats.unpack_copies += 1
        return out
    if dst is None:
        # Uneven all_gather: pad every piece to the longest, gather, then compact.
        longest = max(numel(s) for s in recv_shapes)
        padded = _alloc(call, [longest], like=x)
        padded[: flat.shape[0]] = flat
        recv = _alloc(call, [longest * n], like=x)
        item = kit.itemsize(x)
        call.stats.bytes_sent += numel(x.shape) * item * (n - 1)
        call.stats.bytes_received += sum(numel(s) for i, s in enumerate(recv_shapes) if i != rank) * item
        call.impl.allgather(kit.bytes_of(recv), kit.bytes_of(padded), call.op)
        out = _alloc(call, out_shape, like=x)
        for i, (shape, start) in enumerate(zip(recv_shapes, offsets(lengths))):
            if lengths[i]:
                piece = recv[i * longest : i * longest + numel(shape)].reshape(tuple(shape))
                kit.copy(_narrow(out, dim, start, lengths[i]), piece)
        call.stats.pack_copies += 1
        call.stats.unpack_copies += 1
        return out
    send_shapes = [_with_dim(x.shape, dim, lengths[rank] if j == dst else 0) for j in range(n)]
    mine = recv_shapes if rank == dst else [_with_dim(x.shape, dim, 0)] * n
    out = _exchange(call, flat, send_shapes, mine, _with_dim(x.shape, dim, sum(r[dim] for r in mine)), dim, x)
    return out if rank == dst else None


def all_gather(x: Array, dim: int = 0, comm: Comm | None = None, *, check: bool | None = None) -> Array:
    """Every rank ends with every rank's ``x`` concatenated along ``dim`` in rank order.

    ``x``: ``[..., L_r, ...]`` (``L_r`` at ``dim``; other dims agree across ranks).
    Returns ``[..., sum over i of L_i, ...]`` on every rank: the full tensor, replicated.
    """
    call = _Call("all_gather", x, comm, check, ("dim",))
    replayed = call.replay((dim,))
    if replayed is not _MISS:
        return replayed
    d = 0
    with call.validating():
        call.take_input()
        d = normalize_dim(dim, call.x.ndim, "dim")
        call.record.args = (d,)
    shapes = call.agree(free_dims=(d,))
    return call.result(call.run_and_remember(lambda k, xt: _gather_core(k, xt, d, shapes, None)))


def gather(x: Array, dim: int = 0, dst: int = 0, comm: Comm | None = None, *, check: bool | None = None) -> Array | None:
    """Rank ``dst`` ends with every rank's ``x`` concatenated along ``dim``; others get None.

    ``x``: ``[..., L_r, ...]``. Returns ``[..., sum over i of L_i, ...]`` on ``dst``, None elsewhere.
    """
    call = _Call("gather", x, comm, check, ("dim", "dst"))
    replayed = call.replay((dim, dst))
    if replayed is not _MISS:
        return replayed
    d = root = 0
    with call.validating():
        call.take_input()
        d = normalize_dim(dim, call.x.ndim, "dim")
        root = check_int("dst", dst)
        call.record.args = (d, root)
        if not 0 <= root < call.size:
            raise InvalidArgument(f"dst={root} is not a rank of this communicator (size {call.size})")
    shapes = call.agree(free_dims=(d,))
    return call.result(call.run_and_remember(lambda k, xt: _gather_core(k, xt, d, shapes, root)))


def _check_reducible(kit: Any, x: Array, op: str) -> None:
    if op not in REDUCE_OPS:
        raise InvalidArgument(f"op must be one of {REDUCE_OPS}, got {op!r}")
    is_float, is_complex, is_bool = kit.dtype_info(x)
    if is_bool and op in ("sum", "avg"):
        raise UnsupportedDType(f"cannot {op} bool values (use max for 'any' or min for 'all')")
    if is_complex and op in ("max", "min"):
        raise UnsupportedDType(f"complex values have no order, so op={op!r} is undefined for {dtype_name(x)}")
    if op == "avg" and not (is_float or is_complex):
        raise UnsupportedDType(f"op='avg' needs a floating or complex dtype, got {dtype_name(x)} (use sum)")


def _reduce_scatter_core(call: _Call, x: Array, d: int, op: str) -> Array:
    kit, n, rank = call.kit, call.size, call.rank
    sizes = shard_sizes(x.shape[d], n)
    send, send_shapes = _pack(call, x, d, sizes)
    piece_shape = send_shapes[rank]
    # Every rank's piece r arrives stacked [N, *piece]; the reduction runs in rank order, so
    # every engine and every run gives the same bits.
    stacked = _exchange(call, send, send_shapes, [piece_shape] * n, [n * piece_shape[0], *piece_shape[1:]], 0, x)
    call.stats.allocated_bytes += numel(piece_shape) * kit.itemsize(x)  # the accumulator
    return kit.stack_reduce(stacked.reshape((n, *piece_shape)), op)


def reduce_scatter(
    x: Array, dim: int = 0, op: str = "sum", comm: Comm | None = None, *, check: bool | None = None
) -> Array:
    """Reduce ``x`` over ranks with ``op`` (sum, avg, max, min), then keep this rank's shard.

    ``x``: ``[..., L, ...]``, the same shape on every rank. Returns ``[..., sizes[r], ...]``
    with ``sizes = shard_sizes(L, N)``: values summed (or maxed...) across ranks, in rank order.
    """
    call = _Call("reduce_scatter", x, comm, check, ("dim", "op"))
    replayed = call.replay((dim, op))
    if replayed is not _MISS:
        return replayed
    d = 0
    with call.validating():
        call.take_input()
        d = normalize_dim(dim, call.x.ndim, "dim")
        _check_reducible(call.kit, call.x, op)
        call.record.args = (d, REDUCE_OPS.index(op))
    call.agree(need_shapes=False)
    return call.result(call.run_and_remember(lambda k, xt: _reduce_scatter_core(k, xt, d, op)))


def _all_reduce_core(call: _Call, x: Array, op: str) -> Array:
    flat = x.reshape(-1)
    mine = _reduce_scatter_core(call, flat, 0, op)
    lengths = shard_sizes(flat.shape[0], call.size)
    full = _gather_core(call, mine, 0, [(length,) for length in lengths], None)
    return full.reshape(tuple(x.shape))


def all_reduce(x: Array, op: str = "sum", comm: Comm | None = None, *, check: bool | None = None) -> Array:
    """Every rank ends with the reduction (sum, avg, max, min) of all ranks' ``x``.

    ``x``: any shape, the same on every rank. Returns the same shape, bit-identical on every
    rank (a reduce_scatter, reduced in rank order, then an all_gather).
    """
    call = _Call("all_reduce", x, comm, check, ("op",))
    replayed = call.replay((op,))
    if replayed is not _MISS:
        return replayed
    with call.validating():
        call.take_input(need_dims=False)
        _check_reducible(call.kit, call.x, op)
        call.record.args = (REDUCE_OPS.index(op),)
    call.agree(need_shapes=False)
    return call.result(call.run_and_remember(lambda k, xt: _all_reduce_core(k, xt, op)))


def _placement_code(p: Any, ndim: int) -> int:
    if isinstance(p, Shard):
        return 100 + normalize_dim(p.dim, ndim)
    if isinstance(p, Partial):
        return 200 + REDUCE_OPS.index(p.op)
    return 1


def redistribute(
    x: Array, src: Any = Shard(0), dst: Any = Shard(1), comm: Comm | None = None,
    global_shape: Sequence[int] | None = None, *, check: bool | None = None,
) -> Array:
    """Change the layout of a distributed tensor from placement ``src`` to ``dst``.

    ``x`` is this rank's part of a logical tensor of ``global_shape`` laid out as ``src``
    (Shard(i) by the balanced rule, Replicate(), Partial(op)). Returns this rank's part under
    ``dst``. The collective used:

    ============================  ==============================================
    Shard(i) -> Shard(j), i != j  all_to_all(split_dim=j, concat_dim=i)
    Shard(i) -> Replicate()       all_gather(dim=i)
    Partial -> Shard(j)           reduce_scatter(dim=j)
    Partial -> Replicate()        all_reduce
    Replicate -> Shard(j)         local slice, no traffic
    Replicate/Shard -> Partial    no traffic (outputs reduce to the full tensor)
    same -> same                  nothing (``x`` itself is returned)
    ============================  ==============================================

    With ``global_shape=None`` the shards' lengths are learned in one small exchange of
    integers; given, no metadata moves (and ``check=False`` then makes no extra round at all).
    """
    call = _Call("redistribute", x, comm, check, ("src", "dst"))
    replayed = call.replay((src, dst, global_shape))
    if replayed is not _MISS:
        return replayed
    s_pl = d_pl = None
    gshape: tuple[int, ...] | None = None
    with call.validating():
        s_pl, d_pl = parse_placement(src), parse_placement(dst)
        call.take_input(need_dims=isinstance(s_pl, Shard) or isinstance(d_pl, Shard))
        nd = call.x.ndim
        call.record.args = (_placement_code(s_pl, nd), _placement_code(d_pl, nd))
        if isinstance(s_pl, Shard):
            s_pl = Shard(normalize_dim(s_pl.dim, nd, "src Shard dim"))
        if isinstance(d_pl, Shard):
            d_pl = Shard(normalize_dim(d_pl.dim, nd, "dst Shard dim"))
        if global_shape is not None:
            gshape = tuple(check_int(f"global_shape[{i}]", g) for i, g in enumerate(global_shape))
            call.record.global_shape = gshape
            _check_local_against_global(call, gshape, s_pl)
        if isinstance(s_pl, Partial) or isinstance(d_pl, Partial) and d_pl != s_pl:
            op = s_pl.op if isinstance(s_pl, Partial) else d_pl.op
            if isinstance(s_pl, Partial) and not (isinstance(d_pl, Partial) and d_pl == s_pl):
                _check_reducible(call.kit, call.x, op)
            if isinstance(d_pl, Partial) and isinstance(s_pl, Shard) and d_pl.op == "avg":
                raise InvalidArgument("Shard -> Partial('avg') cannot be exact; use Partial('sum')")
    if call.error is not None and not call.check:
        raise call.error
    src_shard = s_pl.dim if isinstance(s_pl, Shard) else None
    free = () if src_shard is None else (src_shard,)
    if s_pl == d_pl:
        call.agree(free_dims=free, need_shapes=False)
        call.numpy_in = False
        return call.result(x)  # the caller's own object: nothing moved, nothing copied
    needs_lengths = src_shard is not None and gshape is None
    shard_to_shard = isinstance(s_pl, Shard) and isinstance(d_pl, Shard)
    pack = _pack_while_waiting(call, d_pl.dim, None) if shard_to_shard else None
    shapes = call.agree(free_dims=free, need_shapes=needs_lengths, while_waiting=pack)
    n = call.size
    if src_shard is not None:
        if shapes is not None:
            gshape = _global_from_shapes(call, shapes, src_shard)
        shapes = [tuple(_with_dim(gshape, src_shard, k)) for k in shard_sizes(gshape[src_shard], n)]
    run = _redistribute_plan(call, s_pl, d_pl, shapes, gshape)
    out = run(call, call.x, call.overlapped)

    def grad(k: _Call, x: Array, out: Array) -> Array:
        from . import autograd

        return autograd.attach_redistribute(x, out, k.comm, s_pl, d_pl, gshape)

    if _wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad)
    return call.result(out)


def _redistribute_plan(
    call: _Call, s_pl: Any, d_pl: Any, shapes: Sequence[Sequence[int]] | None, gshape: tuple[int, ...] | None
) -> Callable[..., Array]:
    """``run(call, x, sent=None)`` for one placement change, everything known worked out."""
    if isinstance(s_pl, Shard) and isinstance(d_pl, Shard):
        return _all_to_all_plan(call, call.x, d_pl.dim, s_pl.dim, _split_table(d_pl.dim, None, shapes), shapes)

    def run(k: _Call, xt: Array, sent: Any = None) -> Array:
        n, rank = k.size, k.rank
        if isinstance(s_pl, Shard) and isinstance(d_pl, Replicate):
            return _gather_core(k, xt, s_pl.dim, shapes, None)
        if isinstance(s_pl, Partial) and isinstance(d_pl, Shard):
            return _reduce_scatter_core(k, xt, d_pl.dim, s_pl.op)
        if isinstance(s_pl, Partial):
            out = _all_reduce_core(k, xt, s_pl.op)
            return _to_partial(k, out, d_pl.op) if isinstance(d_pl, Partial) else out
        if isinstance(s_pl, Replicate) and isinstance(d_pl, Shard):
            sizes = shard_sizes(xt.shape[d_pl.dim], n)
            view = _narrow(xt, d_pl.dim, sum(sizes[:rank]), sizes[rank])
            return view.clone() if is_torch(view) else view.copy()
        if isinstance(s_pl, Replicate):  # -> Partial
            return _to_partial(k, xt, d_pl.op)
        # Shard(i) -> Partial: embed this rank's shard in a tensor of the global shape
        lo, hi = k.kit.lowest_highest(xt)
        fill = {"sum": 0, "max": lo, "min": hi}[d_pl.op]
        out = k.kit.full_like(_alloc(k, gshape, like=xt), fill)
        start = sum(shard_sizes(gshape[s_pl.dim], n)[:rank])
        k.kit.copy(_narrow(out, s_pl.dim, start, xt.shape[s_pl.dim]), xt)
        return out

    return run


def _to_partial(call: _Call, full: Array, op: str) -> Array:
    """Replicated -> Partial(op): for sum, rank 0 keeps the values and the others hold zeros."""
    if op == "sum" and call.rank != 0:
        return call.kit.zeros(full.shape, like=full)
    return full.clone() if is_torch(full) else full.copy()


def _check_local_against_global(call: _Call, gshape: tuple[int, ...], src: Any) -> None:
    x = call.x
    if len(gshape) != x.ndim:
        raise InvalidArgument(f"global_shape {list(gshape)} has {len(gshape)} dims but x has {x.ndim}")
    if any(g < 0 for g in gshape):
        raise InvalidArgument(f"global_shape {list(gshape)} has a negative entry")
    expected = list(gshape)
    if isinstance(src, Shard):
        expected[src.dim] = shard_sizes(gshape[src.dim], call.size)[call.rank]
    if list(x.shape) != expected:
        raise InvalidArgument(
            f"x has shape {list(x.shape)}, but {src!r} of global_shape {list(gshape)} over "
            f"{call.size} ranks gives rank {call.rank} the shape {expected}"
        )


def _global_from_shapes(call: _Call, shapes: Sequence[Sequence[int]], dim: int) -> tuple[int, ...]:
    lengths = [sh[dim] for sh in shapes]
    total = sum(lengths)
    want = shard_sizes(total, call.size)
    if lengths != want:
        raise MismatchError(
            f"redistribute: Shard({dim}) means the balanced split {want} of length {total}, but the "
            f"ranks hold {lengths} along dim {dim}; use all_to_all with split_sizes for other splits"
        )
    return tuple(_with_dim(shapes[0], dim, total))
