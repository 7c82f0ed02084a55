"""Mixture-of-Experts dispatch and combine: the row -> column exchange with variable sizes.

Experts sit in contiguous blocks: with ``E`` experts on ``N`` ranks, rank ``d`` holds experts
``d*L .. d*L+L-1`` (``L = E // N``). A (token, slot) pair routed to expert ``e`` travels to rank
``e // L`` and comes back after the expert has run. Forward, dispatch and combine are each ``L``
variable exchanges, one per local expert index, each writing straight into its expert's block;
backward, each is the reverse (autograd on torch).

Copies per call (rows of ``H`` elements): dispatch gathers the routed rows once into the send
buffer, ordered so that each exchange's rows are one run; what arrives already is expert-major
(no reorder). combine's exchanges bring the rows back in that same send order; it then gathers
(or, with drops, scatters) them into ``[T, k, H]`` and sums over ``k``. Routing indices are
computed with numpy on every rank from one exchange of per-expert counts, so no index ever
crosses the wire.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import validate
from ..comm import Comm
from ..errors import InvalidArgument, UnsupportedDType
from ..execution import arena_reads, execute, handles, phases
from ..execution.arrays import is_numpy, is_torch
from ..execution.call import Call, run_started, wants_grad
from ..execution.tracebacks import public_call
from ..mesh import Mesh
from ..planning.layout import check_int, offsets, shard_sizes
from . import host_routes, sums, two_level
from .rows import exchange_segments, index_for, may_overlap, take_rows

__all__ = ["MoEHandle", "dispatch", "combine", "pipeline"]

Array = Any


@dataclass
class MoEHandle:
    """What combine needs to send expert outputs home, and what dispatch decided.

    ``tokens_per_expert[l]``: rows of ``expert_inputs`` for this rank's l-th expert (global id
    ``rank * L + l``). ``dropped``: int64 ``[D, 2]`` of (token, slot) pairs that exceeded the
    capacity (slot is the column of ``expert_ids``). ``kept``: bool ``[T, k]``.
    ``send_counts`` / ``recv_counts``: rows this rank sent to / received from each rank.
    ``counts``: int64 ``[N, E]``, rows each rank routed to each expert before any drop.
    """

    tokens_per_expert: list[int]
    dropped: np.ndarray
    kept: np.ndarray
    send_counts: list[int]
    recv_counts: list[int]
    counts: np.ndarray
    num_experts: int
    top_k: int
    num_tokens: int
    comm: Comm = field(repr=False)
    send_rows: np.ndarray = field(repr=False)  # pair index (t * k + slot) of each sent row, in send order
    # rows of each exchange (one per local expert index l): to each rank / from each rank
    segment_send: list[list[int]] = field(repr=False)
    segment_recv: list[list[int]] = field(repr=False)
    slot_rows: np.ndarray | None = field(default=None, repr=False)  # dropless: returned row of each (token, slot)
    algorithm: str = "flat"  # the path dispatch took: "flat" or "hierarchical"
    hosts: host_routes.HostRoutes | None = field(default=None, repr=False)  # the hierarchical path's routes
    total_rows: int = field(default=0, repr=False)  # every rank's sent rows together (the same on every rank)


# The records hold capacity None as -1 and the algorithm as its index: a disagreement names them.
ARG_TEXT = {"capacity": lambda v: "None" if v < 0 else str(v), "algorithm": lambda i: repr(validate.ALGORITHMS[i])}


def _check_dispatch(x: Array, n: int, num_experts: Any, capacity: Any, expert_ids: Any, algorithm: Any = "flat",
                    hosts: Any = None) -> tuple[int, int | None, np.ndarray]:
    """(experts, capacity, expert ids as int64 ``[T, k]``), checked: a pure function."""
    if not isinstance(algorithm, str) or algorithm not in validate.ALGORITHMS:
        raise InvalidArgument(f"algorithm must be one of {', '.join(map(repr, validate.ALGORITHMS))}, got {algorithm!r}")
    if hosts is not None and (algorithm == "hierarchical" or algorithm == "auto" and max(hosts) > 0):
        validate.hosts_mesh_shape(hosts)  # the two levels need the same number of consecutive ranks per host
    experts = check_int("num_experts", num_experts)
    if experts < 1 or experts % n:
        raise InvalidArgument(
            f"num_experts={experts} must be a positive multiple of the world size {n}: experts sit "
            f"in equal contiguous blocks (expert e on rank e // (E // {n}))"
        )
    cap = None
    if capacity is not None:
        cap = check_int("capacity", capacity)
        if cap < 0:
            raise InvalidArgument(f"capacity must be >= 0 or None, got {cap}")
    return experts, cap, _validate_ids(expert_ids, x.shape[0], experts)


def _check_combine(x: Array, handle: MoEHandle, weights: Any, like: Any) -> int:
    """The top-k of ``handle`` when ``x`` and ``weights`` fit it: a pure function."""
    rows_expected = sum(handle.tokens_per_expert)
    if x.shape[0] != rows_expected:
        raise InvalidArgument(
            f"expert_outputs has {x.shape[0]} row{'' if x.shape[0] == 1 else 's'}, but dispatch gave this rank "
            f"{rows_expected} (tokens_per_expert {handle.tokens_per_expert})"
        )
    if weights is not None:
        shape = tuple(int(s) for s in weights.shape)
        want = (handle.num_tokens, handle.top_k)
        if shape != want and not (handle.top_k == 1 and shape == (handle.num_tokens,)):
            raise InvalidArgument(f"weights has shape {list(shape)}; dispatch routed {list(want)} (tokens, slots)")
        if type(weights).__module__.split(".")[0] != type(like).__module__.split(".")[0]:
            raise InvalidArgument("weights and expert_outputs must both be torch tensors or both numpy arrays")
    return handle.top_k


def _validate_ids(expert_ids: Any, num_tokens: int, num_experts: int) -> np.ndarray:
    if is_torch(expert_ids):
        if expert_ids.dtype.is_floating_point or expert_ids.dtype.is_complex or str(expert_ids.dtype) == "torch.bool":
            raise UnsupportedDType(f"expert_ids must hold integers, got {expert_ids.dtype}")
        ids = expert_ids.detach().cpu().numpy()
    elif is_numpy(expert_ids):
        if expert_ids.dtype.kind not in "iu":
            raise UnsupportedDType(f"expert_ids must hold integers, got {expert_ids.dtype}")
        ids = expert_ids
    else:
        raise InvalidArgument(f"expert_ids must be a numpy array or torch tensor, got {type(expert_ids).__name__}")
    if ids.ndim not in (1, 2) or ids.shape[0] != num_tokens or (ids.ndim == 2 and ids.shape[1] < 1):
        raise InvalidArgument(
            f"expert_ids has shape {list(ids.shape)}; it must be [T] or [T, k] with T = {num_tokens} (the tokens' rows)"
        )
    ids = ids.astype(np.int64)
    ids = ids[:, None] if ids.ndim == 1 else ids
    bad = (ids < 0) | (ids >= num_experts)
    if bad.any():
        t, j = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidArgument(
            f"expert_ids[{t}, {j}] = {int(ids[t, j])} is not an expert: ids must lie in [0, {num_experts})"
            f" ({int(bad.sum())} out of range)"
        )
    return ids


def _kept_counts(counts: np.ndarray, capacity: int | None) -> np.ndarray:
    """Rows of each rank kept for each expert: ``capacity`` per expert, filled in rank order."""
    if capacity is None:
        return counts
    before = np.cumsum(counts, axis=0) - counts  # rows of lower ranks for the same expert
    return np.clip(capacity - before, 0, counts)


@public_call
def dispatch(
    tokens: Array, expert_ids: Array, num_experts: int, comm: Comm | None = None,
    capacity: int | None = None, *, check: bool | None = None, async_op: bool = False, algorithm: str = "auto",
) -> tuple[Array, MoEHandle]:
    """Send each (token, slot) pair to the rank holding its expert.

    Args:
      tokens: ``[T, *F]`` (usually ``[T, H]``); ``F`` and the dtype agree across ranks.
      expert_ids: ints ``[T]`` (top-1) or ``[T, k]`` (top-k), each in ``[0, num_experts)``.
      num_experts: ``E``, a multiple of the world size ``N``; rank ``e // (E // N)`` holds expert e.
      capacity: None for dropless; else at most ``capacity`` rows per expert, kept in order of
        (source rank, token, slot) and the rest reported in ``handle.dropped``.
      algorithm: ``"flat"`` (each pair travels straight to its expert's rank),
        ``"hierarchical"`` (over ``comm.hosts``: each token crosses once to every host holding
        one of its experts and is copied to them there; see ``reshard.moe.host_routes``) or ``"auto"``
        (flat on one host; across hosts, whichever ``reshard.planning.host_costs`` estimates faster for
        the bytes this batch puts on the busiest host link). The same ``expert_inputs`` either way.

    Returns:
      ``(expert_inputs, handle)``: ``expert_inputs`` is ``[sum(handle.tokens_per_expert), *F]``,
      rows grouped by local expert, then by source rank in rank order, then by token order (a
      token routed to two experts of this rank appears once in each group). numpy in, numpy out.
      Differentiable on torch (backward: the reverse exchange, summing a token's slots).
      With ``async_op=True``: a ``Handle`` whose ``wait()`` returns that pair.
    """
    if async_op:
        return run_started("moe.dispatch", lambda: dispatch(tokens, expert_ids, num_experts, comm, capacity,
                                                              check=check, algorithm=algorithm), comm)
    return _dispatch(tokens, expert_ids, num_experts, comm, capacity, check, None, algorithm)


def _routes(expert_of_pair: np.ndarray, routable: np.ndarray, counts: np.ndarray, cap: int | None, rank: int,
            per_rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This rank's pairs in send order: ``(send_rows, dropped_pairs, kept_counts)``. Pairs are
    sorted by (local expert index, destination rank, token, slot), so that what goes out in
    each exchange is one run; the first ``kept_counts[rank, e]`` of each expert's run are sent,
    the rest dropped, as are pairs not ``routable``. ``counts``: ``[N, E]`` routable pairs."""
    n = counts.shape[0]
    kept_counts = _kept_counts(counts, cap)
    local_index, owner = np.divmod(expert_of_pair, per_rank)[1], expert_of_pair // per_rank
    order = np.argsort(local_index * n + owner, kind="stable")
    order = order[routable[order]]
    by_run = counts[rank].reshape(n, per_rank).T.reshape(-1)  # runs in (l, rank) order
    kept_by_run = kept_counts[rank].reshape(n, per_rank).T.reshape(-1)
    run_start = np.cumsum(by_run) - by_run
    position_in_run = np.arange(order.size) - np.repeat(run_start, by_run)
    keep = position_in_run < np.repeat(kept_by_run, by_run)
    dropped = np.sort(np.concatenate([order[~keep], np.flatnonzero(~routable)]))
    return order[keep], dropped, kept_counts


def _routed_counts(call: Call, expert_of_pair: np.ndarray, routable: np.ndarray, experts: int, what: str) -> np.ndarray:
    """``[N, E]``: every rank's routable pairs per expert, from one all-gather of integers."""
    return _gathered(call, np.bincount(expert_of_pair[routable], minlength=experts).astype(np.int64)[:experts], what)


def _gathered(call: Call, own: np.ndarray, what: str) -> np.ndarray:
    """``[N, len(own)]``: every rank's int64 ``own``, from one all-gather."""
    with phases.phase(what):
        gathered = call.primitives.allgather_bytes(np.ascontiguousarray(own, dtype=np.int64).view(np.uint8), what)
    call.checks += 1
    return gathered.view(np.int64).reshape(call.size, own.size)


def _dispatch(tokens: Array, expert_ids: Array, num_experts: int, comm: Comm | None, capacity: int | None,
              check: bool | None, routable: np.ndarray | None, algorithm: str = "auto") -> tuple[Array, MoEHandle]:
    """``dispatch``; ``routable`` (bool ``[T * k]``, or None for all) marks the pairs that may
    travel: the others are dropped before any count (a pipeline's chunk, whose drops were
    decided on the whole batch)."""
    call = Call("moe.dispatch", tokens, comm, check, ("num_experts", "top_k", "capacity", "algorithm"),
                input_name="tokens")
    comm_ = call.comm
    n, rank = call.size, call.rank
    checked = call.validate(_check_dispatch, n, num_experts, capacity, expert_ids, algorithm, comm_.hosts)
    if checked is not None:
        experts, cap, ids = checked
        call.record.args = (experts, ids.shape[1], -1 if cap is None else cap, validate.ALGORITHMS.index(algorithm))
    call.arg_text = ARG_TEXT
    # The records first, check on or off (their sizes agree whatever the input: the counts'
    # do only once num_experts does), then every rank's count per expert.
    call.agree(free_dims=(0,), need_shapes=False)  # raises on every rank if any rank's input is wrong
    experts, cap, ids = checked
    per_rank = experts // n
    num_tokens, top_k = ids.shape
    expert_of_pair = ids.reshape(-1)
    if routable is None:
        routable = np.ones(expert_of_pair.size, dtype=bool)
    counts = _routed_counts(call, expert_of_pair, routable, experts, "moe.dispatch (counts)")
    send_rows, dropped_pairs, kept_counts = _routes(expert_of_pair, routable, counts, cap, rank, per_rank)
    kept = np.ones(num_tokens * top_k, dtype=bool)
    kept[dropped_pairs] = False
    hosts_count = max(comm_.hosts) + 1
    if algorithm != "flat" and hosts_count > 1 or algorithm == "hierarchical":
        mesh_shape = validate.hosts_mesh_shape(comm_.hosts)
        on_host = host_routes.host_rows(ids, kept.reshape(num_tokens, top_k), per_rank * mesh_shape[1], mesh_shape[0])
        rows_to_host = _gathered(call, on_host.sum(axis=0).astype(np.int64), "moe.dispatch (rows per host)")
        if algorithm == "hierarchical" or host_routes.cheaper(kept_counts, rows_to_host, mesh_shape, per_rank,
                                                          host_routes.row_bytes(tokens)):
            algorithm = "hierarchical"
        else:
            algorithm = "flat"
    send_counts = [int(v) for v in kept_counts[rank].reshape(n, per_rank).sum(axis=1)]

    # Receiver side: exchange l brings every rank's rows for this rank's l-th expert, in rank
    # order, straight into that expert's block: the result is expert-major with no reorder.
    mine = kept_counts[:, rank * per_rank : (rank + 1) * per_rank]  # [N, L]
    recv_counts = [int(v) for v in mine.sum(axis=1)]
    segment_send = [[int(kept_counts[rank, j * per_rank + le]) for j in range(n)] for le in range(per_rank)]
    segment_recv = [[int(mine[i, le]) for i in range(n)] for le in range(per_rank)]

    if algorithm == "hierarchical":
        expert_inputs, routes = two_level.dispatch(comm_, tokens, ids, kept.reshape(num_tokens, top_k),
                                                       kept_counts, rows_to_host, mesh_shape, per_rank)
        execute.report_as("moe.dispatch", call)
        return expert_inputs, MoEHandle(
            tokens_per_expert=[int(v) for v in mine.sum(axis=0)],
            dropped=np.stack(np.divmod(dropped_pairs, top_k), axis=1).astype(np.int64).reshape(-1, 2),
            kept=kept.reshape(num_tokens, top_k), send_counts=send_counts, recv_counts=recv_counts, counts=counts,
            num_experts=experts, top_k=top_k, num_tokens=num_tokens, comm=comm_, send_rows=send_rows,
            segment_send=segment_send, segment_recv=segment_recv, algorithm="hierarchical", hosts=routes,
            total_rows=int(kept_counts.sum()))
    routed = send_rows // top_k  # the token of each row sent, in the exchange's order
    on_tape = wants_grad(tokens)
    if on_tape:  # the gather and the exchange, each with its backward
        expert_inputs = exchange_segments(comm_, take_rows(tokens, routed), segment_send, segment_recv,
                                          "moe.dispatch (exchange)", int(kept_counts.sum()))
    else:  # the exchange takes the routed rows: read in place, peers copy them straight out of the tokens
        with arena_reads.rows_taken(arena_reads.RowsTaken(routed, take_rows)):
            expert_inputs = exchange_segments(comm_, tokens, segment_send, segment_recv, "moe.dispatch (exchange)",
                                              int(kept_counts.sum()))
    execute.report_as("moe.dispatch", call, packs=int(on_tape and len(routed) > 0))
    handle = MoEHandle(
        tokens_per_expert=[int(v) for v in mine.sum(axis=0)],
        dropped=np.stack(np.divmod(dropped_pairs, top_k), axis=1).astype(np.int64).reshape(-1, 2),
        kept=kept.reshape(num_tokens, top_k),
        send_counts=send_counts, recv_counts=recv_counts, counts=counts, num_experts=experts, top_k=top_k,
        num_tokens=num_tokens, comm=comm_, send_rows=send_rows, segment_send=segment_send,
        segment_recv=segment_recv,
        slot_rows=np.argsort(send_rows, kind="stable") if dropped_pairs.size == 0 else None,
        total_rows=int(kept_counts.sum()),
    )
    return expert_inputs, handle


@public_call
def combine(expert_outputs: Array, handle: MoEHandle, weights: Array | None = None, *, check: bool | None = None,
            async_op: bool = False) -> Array:
    """Send expert outputs back to their tokens and sum each token's slots.

    Args:
      expert_outputs: ``[sum(handle.tokens_per_expert), *F']``, rows in ``expert_inputs`` order.
      weights: None, or ``[T, k]`` (``[T]`` for top-1) gate weights of the dispatching rank.

    Returns:
      ``[T, *F']`` in the original token order: ``sum over slots j of weights[t, j] * out(t, j)``
      (weights None: the plain sum; top-1 without weights: the row itself). Dropped pairs
      contribute zero. With identity experts and weights that sum to one (within 4k ulps) the
      input comes back bit for bit (see ``sums.sum_slots``). Differentiable on torch (with respect
      to the outputs and the weights). With ``async_op=True``: a ``Handle`` whose ``wait()``
      returns that.
    """
    if not isinstance(handle, MoEHandle):
        raise InvalidArgument(f"handle must be the MoEHandle returned by dispatch, got {type(handle).__name__}")
    if async_op:
        return run_started("moe.combine", lambda: combine(expert_outputs, handle, weights, check=check), handle.comm)
    comm_ = handle.comm
    call = Call("moe.combine", expert_outputs, comm_, check, ("top_k",), input_name="expert_outputs")
    call.record.args = (handle.top_k,)
    call.validate(_check_combine, handle, weights, expert_outputs)
    call.agree(free_dims=(0,), need_shapes=False)  # check on or off: a disagreement never moves data
    if handle.hosts is not None:
        out = two_level.combine(expert_outputs, handle.hosts, handle.num_tokens, handle.top_k, weights)
        execute.report_as("moe.combine", call)
        return out
    # the reverse exchanges: each expert's block goes home, arriving in dispatch's send order;
    # read in place and off the tape, each row lands straight in its (token, slot) place instead
    placed = None
    if handle.slot_rows is not None and not wants_grad(expert_outputs):
        placed = arena_reads.RowsPlaced(handle.send_rows)
    with arena_reads.rows_placed(placed):
        back = exchange_segments(comm_, expert_outputs, handle.segment_recv, handle.segment_send,
                                 "moe.combine (exchange)", handle.total_rows)
    num_tokens, top_k = handle.num_tokens, handle.top_k
    trail = tuple(back.shape[1:])
    if placed is not None and placed.done:
        slots = back
    elif handle.slot_rows is not None:  # dropless: every (token, slot) has its row, so gather
        slots = take_rows(back, handle.slot_rows)
    elif is_torch(back):
        slots = back.new_zeros((num_tokens * top_k, *trail))
        slots.index_copy_(0, index_for(back, handle.send_rows), back)
    else:
        slots = np.zeros((num_tokens * top_k, *trail), dtype=back.dtype)
        slots[handle.send_rows] = back
    # the rows put in (token, slot) order after the exchange: an unpack, where any arrived
    execute.report_as("moe.combine", call, unpacks=int(slots is not back and back.shape[0] > 0))
    return sums.sum_slots(slots.reshape(num_tokens, top_k, *trail), weights, handle.kept)


@public_call
def pipeline(
    tokens: Array, expert_ids: Array, experts: Sequence[Callable[[Array], Array]], weights: Array | None = None, *,
    chunks: int = 1, capacity: int | None = None, comm: Comm | None = None, check: bool | None = None,
    algorithm: str = "auto", timeline: list | None = None,
) -> Array:
    """A MoE layer's dispatch, expert compute and combine, with the tokens in ``chunks`` parts so
    that the exchanges of one part overlap the expert compute of another.

    Args:
      tokens: ``[T, *F]``, as ``dispatch``'s.
      expert_ids: ints ``[T]`` or ``[T, k]``, each in ``[0, E)`` with ``E = len(experts) * N``.
      experts: one callable per local expert (this rank's ``L = len(experts)``, the same on every
        rank): takes that expert's rows ``[R, *F]`` (``R`` may be 0) and returns ``[R, *F']``.
      weights: None or ``[T, k]`` gate weights, as ``combine``'s.
      chunks: how many parts the tokens are cut into (the same on every rank; ``T`` need not
        divide: the parts follow the balanced rule).
      capacity: as ``dispatch``'s, applied to the whole batch: the same pairs are dropped
        whatever ``chunks`` is.
      algorithm: as ``dispatch``'s, for each part.
      timeline: None, or a list to which this rank appends one ``(what, part, start, end)`` per
        dispatch, expert pass and combine (``what`` "dispatch", "experts" or "combine";
        ``time.perf_counter()`` seconds, an exchange from when its worker began it).

    Returns:
      ``[T, *F']``: ``combine`` of the experts' outputs, as the one-part path gives it. Each
      part's rows meet the same expert in the same way, so with experts that treat rows
      independently the result equals ``chunks=1`` bit for bit (a BLAS matrix multiply may round
      a row differently in a batch of another size). Differentiable on torch like dispatch and
      combine.

    The exchanges run started (``async_op=True``): every part's dispatch is started at once, and
    each part's combine as soon as its experts have run. Where the engine allows two groups at
    once (gloo; MPI with ``THREAD_MULTIPLE``) and nothing is on the autograd tape, the combines
    run on a communicator of the pipeline's own (made once per communicator, on every rank at the
    same call), on a worker of their own: a part's combine travels while a later part's dispatch
    does. Elsewhere they follow the dispatches on one worker.
    """
    call = Call("moe.pipeline", tokens, comm, check, ("num_experts", "top_k", "capacity", "chunks", "algorithm"),
                input_name="tokens")
    comm_ = call.comm
    checked = call.validate(_check_pipeline, call.size, experts, chunks, capacity, expert_ids, algorithm,
                            comm_.hosts)
    if checked is not None:
        num_experts, cap, ids, parts = checked
        call.record.args = (num_experts, ids.shape[1], -1 if cap is None else cap, parts,
                            validate.ALGORITHMS.index(algorithm))
    call.arg_text = ARG_TEXT
    call.agree(free_dims=(0,), need_shapes=False)  # raises on every rank if any rank's input is wrong
    num_experts, cap, ids, parts = checked
    pairs = ids.reshape(-1)
    routable = np.ones(pairs.size, dtype=bool)
    if cap is not None:  # the drops of the whole batch, decided once
        counts = _routed_counts(call, pairs, routable, num_experts, "moe.pipeline (counts)")
        routable[_routes(pairs, routable, counts, cap, call.rank, num_experts // call.size)[1]] = False
    execute.finish(call, None)
    top_k = ids.shape[1]
    bounds = offsets(shard_sizes(ids.shape[0], parts)) + [ids.shape[0]]
    lane = _combine_lane(comm_, algorithm) if parts > 1 and may_overlap(comm_, tokens) else None  # before any is started
    started = [
        run_started("moe.dispatch", _timed(timeline, "dispatch", part, lambda a=a, b=b: _dispatch(
            tokens[a:b], ids[a:b], num_experts, comm_, None, check, routable[a * top_k : b * top_k], algorithm)), comm_)
        for part, (a, b) in enumerate(zip(bounds, bounds[1:]))
    ]
    combined = []
    for part, ((a, b), handle) in enumerate(zip(zip(bounds, bounds[1:]), started)):
        expert_inputs, routed = handle.wait()
        outputs = _timed(timeline, "experts", part, lambda x=expert_inputs, r=routed: _run_experts(
            experts, x, r.tokens_per_expert))()
        w = None if weights is None else weights[a:b]
        on = routed if lane is None else _on_lane(routed, lane)
        combined.append(run_started("moe.combine", _timed(timeline, "combine", part,
                                                          lambda o=outputs, h=on, w=w: combine(o, h, w, check=check)),
                                    on.comm, lane=lane))
    return _concat([h.wait() for h in combined])


def _timed(timeline: list | None, what: str, part: int, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run``, noting its start and end in ``timeline`` where one is given."""
    if timeline is None:
        return run

    def noted() -> Any:
        start = time.perf_counter()
        try:
            return run()
        finally:
            timeline.append((what, part, start, time.perf_counter()))

    return noted


def _combine_lane(comm: Comm, algorithm: str) -> Comm:
    """The pipeline's own communicator over ``comm``'s ranks, for its combines: made at the first
    pipeline that needs it (a collective: every rank's first such call), closed with ``comm``.
    Its host mesh's sub-communicators are made here too, never on a worker: at the first
    pipeline that may take the two-level path (several hosts, or ``"hierarchical"`` asked for
    on one), the same call on every rank since ``algorithm`` agrees."""
    if comm.pipeline_lane is None:
        handles.settle()  # a collective: after the calls started before it
        lane = Comm(comm.primitives.subgroup([list(range(comm.size))]), check=comm.check, timeout=comm.timeout,
                    hosts=comm.hosts)
        lane.activity = comm.activity
        comm.children.append(lane)
        comm.pipeline_lane = lane
    lane = comm.pipeline_lane
    if lane.hosts_mesh is None and (max(comm.hosts) > 0 or algorithm == "hierarchical"):
        handles.settle()
        lane.hosts_mesh = Mesh.from_hosts(lane)  # the two-level path's exchanges, on the lane's own sub-communicators
        lane.hosts_mesh.sub(0), lane.hosts_mesh.sub(1)
    return lane


def _on_lane(routed: MoEHandle, lane: Comm) -> MoEHandle:
    """``routed`` with its exchanges on ``lane`` (the same ranks in the same order)."""
    hosts = None if routed.hosts is None else dataclasses.replace(routed.hosts, mesh=lane.hosts_mesh)
    return dataclasses.replace(routed, comm=lane, hosts=hosts)


def _check_pipeline(x: Array, n: int, experts: Any, chunks: Any, capacity: Any, expert_ids: Any,
                    algorithm: Any = "flat", hosts: Any = None) -> tuple[int, int | None, np.ndarray, int]:
    """(experts E, capacity, expert ids ``[T, k]``, chunks), checked: a pure function."""
    if isinstance(experts, (str, bytes)) or not hasattr(experts, "__len__") or len(experts) == 0 \
            or not all(callable(e) for e in experts):
        raise InvalidArgument("experts must be a non-empty list of callables, one per local expert")
    parts = check_int("chunks", chunks)
    if parts < 1:
        raise InvalidArgument(f"chunks must be >= 1, got {parts}")
    return (*_check_dispatch(x, n, len(experts) * n, capacity, expert_ids, algorithm, hosts), parts)


def _run_experts(experts: Sequence[Callable[[Array], Array]], inputs: Array, tokens_per_expert: list[int]) -> Array:
    """Each local expert on its block of rows (``inputs`` is expert-major), the outputs in order."""
    outs, at = [], 0
    for expert, rows in zip(experts, tokens_per_expert):
        outs.append(expert(inputs[at : at + rows]))
        at += rows
    return _concat(outs)


def _concat(parts: list[Array]) -> Array:
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)
