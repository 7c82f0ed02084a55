"""The public collectives on the local shard.

Each op takes its input, validates it, agrees with the other ranks (the cross-rank check: one
small all-gather of fixed-size records, which also tells every rank the others' shapes), runs
its steps through the executor and returns. Shapes in docstrings follow ``jax.lax``: ``N`` is
the world size, ``r`` this rank, ``sizes = split_sizes or shard_sizes(x.shape[split_dim], N)``.
``redistribute`` runs exactly the steps ``plan.make_plan`` returns for the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import execute
from .arrays import dtype_name
from .call import MISS, Call, one_step, wants_grad
from .comm import Comm
from .errors import InvalidArgument, MismatchError
from .layout import REDUCE_OPS, Partial, Shard, check_int, normalize_dim, parse_placement, shard_sizes
from .mesh import Mesh
from .pieces import contiguous, exchange_packed, with_dim
from .plan import make_plan
from .stats import ExchangeStats, last_exchange

__all__ = [
    "all_to_all", "all_to_all_v", "all_gather", "gather", "reduce_scatter", "all_reduce", "redistribute",
    "last_exchange", "ExchangeStats",
]

Array = Any  # torch.Tensor or numpy.ndarray


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


def all_to_all(
    x: Array, split_dim: int, concat_dim: int, comm: Comm | None = None,
    split_sizes: Sequence[int] | None = None, *, check: bool | None = None,
) -> Array:
    """Cut ``x`` along ``split_dim`` into one piece per rank, send piece j to rank j, and
    concatenate what arrives along ``concat_dim`` in rank order. Sums nothing, copies nothing
    twice: the layout exchange of the row -> column example (``all_to_all(A_rows, split_dim=1, concat_dim=0)``).

    Args:
      x: the local shard, ``[..., S, ..., C_r, ...]`` (``S`` at ``split_dim``, ``C_r`` at
        ``concat_dim``). Every dim but ``concat_dim`` must agree across ranks.
      split_dim: the dim cut into pieces (an int; negative counts from the end).
      concat_dim: the dim the received pieces are joined along; may equal ``split_dim``.
      split_sizes: how to cut ``split_dim`` (one int per rank, same on every rank); default the
        balanced rule ``shard_sizes(S, N)``.

    Returns:
      With ``split_dim != concat_dim``: ``x.shape`` with ``S -> sizes[r]`` and
      ``C_r -> sum over ranks i of C_i``. With ``split_dim == concat_dim``: that dim becomes
      ``sum over i of sizes_i[r]``. Same shapes as ``jax.lax.all_to_all(..., tiled=True)``.
      numpy in, numpy out. ``x`` is never modified.

    Copies: at most one pack and one unpack; the engine's form decides (see ``reshard.execute``).
    """
    call = Call("all_to_all", x, comm, check, ("split_dim", "concat_dim"))
    replayed = call.replay((split_dim, concat_dim, split_sizes))
    if replayed is not MISS:
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
    shapes = call.agree(free_dims=(c,), while_waiting=_pack_ahead(call, s, sizes))
    splits = execute.split_table(s, sizes, shapes)
    run = one_step("all_to_all", execute.all_to_all_run(call, call.x, s, c, splits, shapes))
    out = run(call, call.x, call.overlapped)

    def grad(k: Call, x: Array, out: Array) -> Array:
        from . import autograd

        back_splits, back_shapes = autograd.all_to_all_backward_geometry(s, c, splits, shapes)
        comm = k.comm

        def reverse(g: Array) -> Array:
            back = Call("all_to_all (backward)", g, comm, False)
            back.take_input()
            return execute.all_to_all_run(back, back.x, c, s, back_splits, back_shapes)(back, back.x)

        return autograd.attach(x, out, reverse)

    if wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad)
    return call.result(out)


def _pack_ahead(call: Call, s: int, sizes: Sequence[int] | None) -> Any:
    """The engine's pack as a job to run during the check, where its form packs first."""
    if call.error is not None:
        return None
    x = call.x
    own = tuple(sizes) if sizes is not None else shard_sizes(x.shape[s], call.size)
    return call.transport.pack_ahead(call, x, s, own)


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
      recv_counts: what this rank expects from each rank, when known (e.g. the ``send_counts`` of
        the forward exchange, for the reverse one): checked against what the ranks send it.

    Returns:
      ``(received, recv_counts)``: ``received`` is ``[sum_i send_counts_i[r], *F]`` (rank i's rows
      for this rank, in rank order) and ``recv_counts[i] = send_counts_i[r]``, so the reverse
      exchange is ``all_to_all_v(y, recv_counts, recv_counts=send_counts)``. numpy in, numpy out.

    The counts travel as one small exchange of integers (with the check's records, on or off)
    and are validated as a whole matrix: every rank raises, naming the ranks. The backward pass
    moves no counts at all.
    """
    call = Call("all_to_all_v", x, comm, check)
    n = call.size
    counts: tuple[int, ...] = ()
    claim = np.zeros(n + 1, dtype=np.int64)  # [whether recv_counts were passed, *recv_counts]
    with call.validating():
        call.take_input()
        counts = _sizes_arg(send_counts, call.x.shape[0], n, "send_counts")
        call.record.split_sizes = counts
        if recv_counts is not None:
            claim[0], claim[1:] = 1, _counts_arg(recv_counts, n, "recv_counts")
    call.agree(free_dims=(0,), per_rank_splits=True, extra=claim)
    matrix = [r.split_sizes for r in call.records]
    claims = call.extra_gathered
    wrong = [i for i in range(n) if claims[i, 0] and [int(c) for c in claims[i, 1:]] != [matrix[j][i] for j in range(n)]]
    if wrong:
        said = "; ".join(f"rank {i} expects {[int(c) for c in claims[i, 1:]]} but is sent {[matrix[j][i] for j in range(n)]}"
                         for i in wrong)
        raise MismatchError(f"all_to_all_v: recv_counts disagree with what the ranks send: {said}")
    got = [matrix[i][call.rank] for i in range(n)]
    out = _exchange_v(call, list(counts), got)
    if wants_grad(x):
        from . import autograd

        comm_, sent = call.comm, list(counts)

        def reverse(g: Array) -> Array:  # the counts are the forward's, agreed already
            back = Call("all_to_all_v (backward)", g, comm_, False)
            back.take_input()
            return _exchange_v(back, got, sent)

        out = autograd.attach(x, out, reverse)
    return call.result(out), got


def _exchange_v(call: Call, send: list[int], recv: list[int]) -> Array:
    """Rows of ``call.x`` out by ``send``, in by ``recv`` (counts every rank agreed on)."""
    xt = call.x
    trail = list(xt.shape[1:])
    started = call.stats.begin_step()
    out = exchange_packed(call, contiguous(call, xt).reshape(-1), [[k, *trail] for k in send],
                          [[k, *trail] for k in recv], [sum(recv), *trail], 0, xt)
    call.stats.end_step("all_to_all_v", started)
    return out


def all_gather(x: Array, dim: int = 0, comm: Comm | None = None, *, check: bool | None = None) -> Array:
    """Every rank ends with every rank's ``x`` concatenated along ``dim`` in rank order.

    ``x``: ``[..., L_r, ...]`` (``L_r`` at ``dim``; other dims agree across ranks).
    Returns ``[..., sum over i of L_i, ...]`` on every rank: the full tensor, replicated.
    """
    call = Call("all_gather", x, comm, check, ("dim",))
    replayed = call.replay((dim,))
    if replayed is not MISS:
        return replayed
    d = 0
    with call.validating():
        call.take_input()
        d = normalize_dim(dim, call.x.ndim, "dim")
        call.record.args = (d,)
    shapes = call.agree(free_dims=(d,))
    return call.result(call.run_and_remember(lambda k, xt: execute.gather_core(k, xt, d, shapes, None), "all_gather"))


def gather(x: Array, dim: int = 0, dst: int = 0, comm: Comm | None = None, *, check: bool | None = None) -> Array | None:
    """Rank ``dst`` ends with every rank's ``x`` concatenated along ``dim``; others get None.

    ``x``: ``[..., L_r, ...]``. Returns ``[..., sum over i of L_i, ...]`` on ``dst``, None elsewhere.
    """
    call = Call("gather", x, comm, check, ("dim", "dst"))
    replayed = call.replay((dim, dst))
    if replayed is not MISS:
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
    return call.result(call.run_and_remember(lambda k, xt: execute.gather_core(k, xt, d, shapes, root), "gather"))


def reduce_scatter(
    x: Array, dim: int = 0, op: str = "sum", comm: Comm | None = None, *, check: bool | None = None
) -> Array:
    """Reduce ``x`` over ranks with ``op`` (sum, avg, max, min), then keep this rank's shard.

    ``x``: ``[..., L, ...]``, the same shape on every rank. Returns ``[..., sizes[r], ...]``
    with ``sizes = shard_sizes(L, N)``: values summed (or maxed...) across ranks, in rank order.
    """
    call = Call("reduce_scatter", x, comm, check, ("dim", "op"))
    replayed = call.replay((dim, op))
    if replayed is not MISS:
        return replayed
    d = 0
    with call.validating():
        call.take_input()
        d = normalize_dim(dim, call.x.ndim, "dim")
        execute.check_reducible(call.arrays, call.x, op)
        call.record.args = (d, REDUCE_OPS.index(op))
    call.agree(need_shapes=False)
    return call.result(call.run_and_remember(lambda k, xt: execute.reduce_scatter_core(k, xt, d, op), "reduce_scatter"))


def all_reduce(x: Array, op: str = "sum", comm: Comm | None = None, *, check: bool | None = None) -> Array:
    """Every rank ends with the reduction (sum, avg, max, min) of all ranks' ``x``.

    ``x``: any shape, the same on every rank. Returns the same shape, bit-identical on every
    rank (a reduce_scatter, reduced in rank order, then an all_gather).
    """
    call = Call("all_reduce", x, comm, check, ("op",))
    replayed = call.replay((op,))
    if replayed is not MISS:
        return replayed
    with call.validating():
        call.take_input(need_dims=False)
        execute.check_reducible(call.arrays, call.x, op)
        call.record.args = (REDUCE_OPS.index(op),)
    call.agree(need_shapes=False)
    plan = make_plan(tuple(call.x.shape), Partial(op), "replicate", call.size, itemsize=call.arrays.itemsize(call.x))
    run = execute.plan_run(call, call.x, plan)
    out = run(call, call.x)
    call.remember(run)
    return call.result(out)


def _placement_code(p: Any, ndim: int) -> int:
    if isinstance(p, Shard):
        return 100 + normalize_dim(p.dim, ndim)
    if isinstance(p, Partial):
        return 200 + REDUCE_OPS.index(p.op)
    return 1


def redistribute(
    x: Array, src: Any = Shard(0), dst: Any = Shard(1), comm: Comm | None = None,
    global_shape: Sequence[int] | None = None, *, mesh: Mesh | None = None, check: bool | None = None,
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

    On a process mesh (``mesh=rs.Mesh(...)``), ``src`` and ``dst`` give one placement per mesh
    dim, and the change runs as the reductions of Partial sources on their mesh dims, then one
    exchange in which each rank receives only what it needs and does not hold. A PyTorch DTensor
    in gives a DTensor out (``rs.redistribute(dtensor, dst=...)``): its mesh and placements are
    the source, and its shards keep DTensor's own split rule.

    With ``global_shape=None`` the shards' lengths are learned in one small exchange of
    integers; given, no metadata moves, and with ``check=False`` a repeated call makes no
    extra round at all (the first call of a signature always agrees).
    """
    if type(x).__name__ == "DTensor" and type(x).__module__.startswith("torch.distributed"):
        from .mesh_ops import redistribute_dtensor

        return redistribute_dtensor(x, dst, check)
    if mesh is not None:
        from .mesh_ops import redistribute_mesh

        return redistribute_mesh(x, src, dst, mesh, global_shape, check)
    if isinstance(src, (tuple, list)) or isinstance(dst, (tuple, list)):
        raise InvalidArgument("src and dst are one placement per mesh dim: pass the mesh (mesh=rs.Mesh(...))")
    call = Call("redistribute", x, comm, check, ("src", "dst"))
    replayed = call.replay((src, dst, global_shape))
    if replayed is not MISS:
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
                execute.check_reducible(call.arrays, call.x, op)
            if isinstance(d_pl, Partial) and d_pl != s_pl:  # the result must reduce with dst's op
                execute.check_reducible(call.arrays, call.x, d_pl.op)
            if isinstance(d_pl, Partial) and isinstance(s_pl, Shard) and d_pl.op == "avg":
                raise InvalidArgument("Shard -> Partial('avg') cannot be exact; use Partial('sum')")
    src_shard = s_pl.dim if isinstance(s_pl, Shard) else None
    free = () if src_shard is None else (src_shard,)
    if s_pl == d_pl:
        call.agree(free_dims=free, need_shapes=False)
        call.numpy_in = False
        return call.result(x)  # the caller's own object: nothing moved, nothing copied
    needs_lengths = src_shard is not None and gshape is None
    shard_to_shard = isinstance(s_pl, Shard) and isinstance(d_pl, Shard)
    pack = _pack_ahead(call, d_pl.dim, None) if shard_to_shard else None
    shapes = call.agree(free_dims=free, need_shapes=needs_lengths, while_waiting=pack)
    if shapes is not None and src_shard is not None:
        gshape = _global_from_shapes(call, shapes, src_shard)
    if gshape is None:  # Replicate or Partial: the local tensor has the global shape
        gshape = tuple(int(m) for m in call.x.shape)
    plan = make_plan(gshape, s_pl, d_pl, call.size, dtype_name(call.x), itemsize=call.arrays.itemsize(call.x))
    run = execute.plan_run(call, call.x, plan)
    out = run(call, call.x, call.overlapped)

    def grad(k: Call, x: Array, out: Array) -> Array:
        from . import autograd

        back_src, back_dst = autograd.backward_placements(s_pl, d_pl)
        comm_, shape = k.comm, tuple(gshape)

        def reverse(g: Array) -> Array:
            if back_src == back_dst:
                return g
            return redistribute(g, back_src, back_dst, comm_, global_shape=shape, check=False)

        return autograd.attach(x, out, reverse)

    if wants_grad(x):
        out = grad(call, x, out)
    call.remember(run, grad)
    return call.result(out)


def _check_local_against_global(call: Call, gshape: tuple[int, ...], src: Any) -> None:
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


def _global_from_shapes(call: Call, shapes: Sequence[Sequence[int]], dim: int) -> tuple[int, ...]:
    lengths = [sh[dim] for sh in shapes]
    total = sum(lengths)
    want = shard_sizes(total, call.size)
    if lengths != want:
        raise MismatchError(
            f"redistribute: Shard({dim}) means the balanced split {want} of length {total}, but the "
            f"ranks hold {lengths} along dim {dim}; use all_to_all with split_sizes for other splits"
        )
    return tuple(with_dim(shapes[0], dim, total))
