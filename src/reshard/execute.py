"""The executor: runs a plan's steps on this rank, each through the engine's primitives or its
form of the all-to-all, filling the call's ``ExchangeStats`` (one ``ExecutedStep`` a step).

Copy budget (element copies outside the engine, per step):

* all_to_all: the engine's form decides (see ``engines``): at most one pack, and no unpack when
  the received pieces stacked in rank order already are the result.
* all_gather / gather: none when ``dim`` is the leading dim and sizes are even; one unpack
  otherwise (uneven all_gather pads: one more).
* reduce_scatter: one pack, then the reduction in rank order (bitwise the same on every engine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .arrays import dtype_name, is_torch, numel
from .buffers import alloc
from .engines.base import AllToAllGeometry, CallState, ExchangeRun
from .errors import InvalidArgument, UnsupportedDType
from .layout import REDUCE_OPS, offsets, shard_sizes
from .pieces import data_ptr, exchange_packed, narrow, pack, segments, with_dim
from .plan import Plan, Step

Array = Any  # torch.Tensor or numpy.ndarray


def split_table(s: int, split_sizes: Sequence[int] | None, shapes: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Every rank's split of its ``x`` along ``s``: row i is what rank i sends to each rank."""
    n = len(shapes)
    return [tuple(split_sizes) if split_sizes is not None else tuple(shard_sizes(sh[s], n)) for sh in shapes]


def all_to_all_geometry(
    rank: int, s: int, c: int, splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]]
) -> AllToAllGeometry:
    """This rank's all-to-all, given every rank's input shape and split table."""
    n = len(shapes)
    recv_shapes = tuple(tuple(with_dim(shapes[i], s, splits[i][rank])) for i in range(n))
    out_shape = tuple(with_dim(recv_shapes[0], c, sum(r[c] for r in recv_shapes)))
    return AllToAllGeometry(tuple(shapes[rank]), s, c, tuple(splits[rank]), recv_shapes, out_shape)


def all_to_all_run(
    call: CallState, x: Array, s: int, c: int, splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]],
) -> ExchangeRun:
    """The engine's form of this all-to-all for inputs like ``x``: ``run(call, x, sent=None)``."""
    return call.transport.all_to_all_form(call, x, all_to_all_geometry(call.rank, s, c, splits, shapes))


def gather_core(call: CallState, x: Array, dim: int, shapes: Sequence[Sequence[int]], dst: int | None) -> Array | None:
    """all_gather (dst None) or gather to ``dst``, concatenating along ``dim`` in rank order."""
    arrays, n, rank, stats = call.arrays, call.size, call.rank, call.stats
    lengths = [sh[dim] for sh in shapes]
    out_shape = with_dim(x.shape, dim, sum(lengths))
    recv_shapes = [with_dim(x.shape, dim, length) for length in lengths]
    src = x if arrays.is_contiguous(x) else x.contiguous() if is_torch(x) else x.copy()
    if src is not x:
        stats.pack_copies += 1
    flat = src.reshape(-1)
    if dst is None and len(set(lengths)) == 1:
        # Equal pieces: one native all-gather, straight into the result when dim leads.
        direct = numel(out_shape[:dim]) == 1
        out = alloc(arrays, stats, out_shape, like=x)
        recv = out.reshape(-1) if direct else alloc(arrays, stats, [numel(out_shape)], like=x)
        stats.recv_buffer_ptr = data_ptr(recv)
        nbytes = numel(x.shape) * arrays.itemsize(x)
        stats.bytes_sent += nbytes * (n - 1)
        stats.bytes_received += nbytes * (n - 1)
        call.transport.allgather(arrays.bytes_of(recv), arrays.bytes_of(flat), call.op)
        if not direct:
            for view, start in zip(segments(recv, recv_shapes), offsets(lengths)):
                arrays.copy(narrow(out, dim, start, lengths[0]), view)
            stats.unpack_copies += 1
        return out
    if dst is None:
        # Uneven all_gather: pad every piece to the longest, gather, then compact.
        longest = max(numel(s) for s in recv_shapes)
        padded = alloc(arrays, stats, [longest], like=x)
        padded[: flat.shape[0]] = flat
        recv = alloc(arrays, stats, [longest * n], like=x)
        item = arrays.itemsize(x)
        stats.bytes_sent += numel(x.shape) * item * (n - 1)
        stats.bytes_received += sum(numel(s) for i, s in enumerate(recv_shapes) if i != rank) * item
        call.transport.allgather(arrays.bytes_of(recv), arrays.bytes_of(padded), call.op)
        out = alloc(arrays, stats, out_shape, like=x)
        for i, (shape, start) in enumerate(zip(recv_shapes, offsets(lengths))):
            if lengths[i]:
                piece = recv[i * longest : i * longest + numel(shape)].reshape(tuple(shape))
                arrays.copy(narrow(out, dim, start, lengths[i]), piece)
        stats.pack_copies += 1
        stats.unpack_copies += 1
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
    call.stats.allocated_bytes += numel(piece_shape) * arrays.itemsize(x)  # the accumulator
    return arrays.stack_reduce(stacked.reshape((n, *piece_shape)), op)


def check_reducible(arrays: Any, x: Array, op: str) -> None:
    if op not in REDUCE_OPS:
        raise InvalidArgument(f"op must be one of {REDUCE_OPS}, got {op!r}")
    is_float, is_complex, is_bool = arrays.dtype_info(x)
    if is_bool and op in ("sum", "avg"):
        raise UnsupportedDType(f"cannot {op} bool values (use max for 'any' or min for 'all')")
    if is_complex and op in ("max", "min"):
        raise UnsupportedDType(f"complex values have no order, so op={op!r} is undefined for {dtype_name(x)}")
    if op == "avg" and not (is_float or is_complex):
        raise UnsupportedDType(f"op='avg' needs a floating or complex dtype, got {dtype_name(x)} (use sum)")


def to_partial(call: CallState, full: Array, op: str) -> Array:
    """Replicated -> Partial(op): for sum, rank 0 keeps the values and the others hold zeros."""
    if op == "sum" and call.rank != 0:
        return call.arrays.zeros(full.shape, like=full)
    return full.clone() if is_torch(full) else full.copy()


def _local_step(step: Step, plan: Plan) -> Callable[[CallState, Array], Array]:
    n = plan.size
    if step.action == "slice":  # Replicate -> Shard: this rank's block, copied
        def keep(k: CallState, xt: Array) -> Array:
            sizes = shard_sizes(xt.shape[step.dim], n)
            view = narrow(xt, step.dim, sum(sizes[: k.rank]), sizes[k.rank])
            return view.clone() if is_torch(view) else view.copy()

        return keep
    if step.action == "to_partial":
        return lambda k, xt: to_partial(k, xt, step.op)

    def embed(k: CallState, xt: Array) -> Array:  # Shard -> Partial: the shard in a full tensor
        out = k.arrays.full_like(alloc(k.arrays, k.stats, plan.global_shape, like=xt), k.arrays.identity(xt, step.op))
        start = sum(shard_sizes(plan.global_shape[step.dim], n)[: k.rank])
        k.arrays.copy(narrow(out, step.dim, start, xt.shape[step.dim]), xt)
        return out

    return embed


def step_run(call: CallState, x: Array, step: Step, plan: Plan) -> ExchangeRun:
    """``run(call, x, sent=None)`` for one step of ``plan`` (``x``: the step's input)."""
    n, shape = plan.size, plan.global_shape
    if step.collective == "all_to_all":
        shapes = _shard_shapes(shape, step.concat_dim, n)
        return all_to_all_run(call, x, step.split_dim, step.concat_dim, split_table(step.split_dim, None, shapes), shapes)
    if step.collective == "all_gather" and step.dim is not None:
        shapes = _shard_shapes(shape, step.dim, n)
        return lambda k, xt, sent=None: gather_core(k, xt, step.dim, shapes, None)
    if step.collective == "all_gather":  # the flattened tensor, as all_reduce gathers it
        lengths = shard_sizes(numel(shape), n)
        return lambda k, xt, sent=None: gather_core(k, xt, 0, [(m,) for m in lengths], None).reshape(shape)
    if step.collective == "reduce_scatter" and step.dim is not None:
        return lambda k, xt, sent=None: reduce_scatter_core(k, xt, step.dim, step.op)
    if step.collective == "reduce_scatter":
        return lambda k, xt, sent=None: reduce_scatter_core(k, xt.reshape(-1), 0, step.op)
    local = _local_step(step, plan)
    return lambda k, xt, sent=None: local(k, xt)


def plan_run(call: CallState, x: Array, plan: Plan) -> ExchangeRun:
    """``run(call, x, sent=None)`` running every step of ``plan`` in order, each recorded in
    ``call.stats.steps``. ``sent`` (what the engine packed ahead) goes to the first step."""
    runs = [(step.collective, step_run(call, x, step, plan)) for step in plan.steps]

    def run(k: CallState, xt: Array, sent: Any = None) -> Array:
        stats = k.stats
        for name, step in runs:
            started = stats.begin_step()
            xt = step(k, xt, sent)
            sent = None
            stats.end_step(name, started)
        return xt

    return run


def _shard_shapes(shape: Sequence[int], dim: int, n: int) -> list[tuple[int, ...]]:
    return [tuple(with_dim(shape, dim, m)) for m in shard_sizes(shape[dim], n)]
