"""THE planner: for every public collective, the typed steps (``steps``) one rank runs.

Each function takes what the agreement told every rank (the ranks' shapes, split sizes or
counts) or the global shape and layouts, and returns this rank's ``RankPlan`` in time and
memory proportional to its own pieces: a list of its peers at most, never a transfer per pair
of ranks. A world of N ranks is the mesh ``(N,)``: ``redistribute`` plans both by the same code into the
same steps (the reductions of Partial sources on their mesh dims, then one exchange, as the
engine's own all_to_all or all_gather where it is one, else as boxes). Pure: no engine, no
array library.
"""

from __future__ import annotations

from collections.abc import Sequence

from .layout import (
    Partial,
    Placement,
    Replicate,
    Shard,
    mesh_region,
    normalize_placements,
    parse_placements,
    ravel,
    shard_range,
    shard_sizes,
    split_sizes,
    unravel,
)
from .mesh_plan import MeshPlan
from .steps import (
    AllGather,
    AllToAll,
    AllToAllV,
    Box,
    ExchangeBoxes,
    Gather,
    OnMeshDim,
    RankPlan,
    ReduceScatter,
    Reorder,
    Shape,
    Step,
    with_dim,
)


def _piece(length: int, parts: int, index: int) -> int:
    a, b = shard_range(length, parts, index)
    return b - a


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def all_to_all_send(shape: Sequence[int], split_dim: int, size: int,
                    split_sizes: Sequence[int] | None = None) -> tuple[int, ...]:
    """What a rank whose input has ``shape`` sends each rank in ``all_to_all``'s plan (lengths
    along ``split_dim``): known before the agreement, so its pack may start while the records
    travel."""
    return tuple(split_sizes) if split_sizes is not None else tuple(shard_sizes(int(shape[split_dim]), size))


def all_to_all(rank: int, shapes: Sequence[Shape], split_dim: int, concat_dim: int,
               split_sizes: Sequence[int] | None = None) -> RankPlan:
    """``all_to_all`` given every rank's input shape; ``split_sizes`` (the same on every rank)
    or else each rank's balanced split of its ``split_dim``."""
    n, s, c = len(shapes), split_dim, concat_dim
    mine = tuple(int(v) for v in shapes[rank])
    send = all_to_all_send(mine, s, n, split_sizes)
    if split_sizes is not None:  # every rank cuts the same way: rank i sends split_sizes[rank]
        pieces = [send[rank]] * n
    else:
        pieces = [_piece(sh[s], n, rank) for sh in shapes]
    lengths = tuple(pieces) if s == c else tuple(int(sh[c]) for sh in shapes)
    return RankPlan("all_to_all", rank, n, (AllToAll(mine, s, c, send, with_dim(mine, s, pieces[rank]), lengths),))


def all_to_all_hierarchical(rank: int, shapes: Sequence[Shape], split_dim: int, concat_dim: int,
                            hosts: int, split_sizes: Sequence[int] | None = None) -> RankPlan:
    """``all_to_all`` in two levels over ``hosts`` hosts of ``L = N // hosts`` consecutive ranks
    (Tutel's 2-D form): the pieces reordered so that what goes to each local index is one run;
    an exchange among this host's ranks, after which local rank l holds everything its host
    sends to local rank l of every host; then one among the ranks with this local index on
    every host (one message per remote host). The result is the flat exchange's, element for
    element. With ``split_dim == concat_dim`` (``all_to_all_single``'s form) what arrived inside
    the host is put in destination-host order before it crosses, as ``all_to_all_v`` does."""
    if split_dim == concat_dim:
        return _same_dim_hierarchical(rank, shapes, split_dim, hosts, split_sizes)
    flat = all_to_all(rank, shapes, split_dim, concat_dim, split_sizes).steps[0]
    n, s, c = len(shapes), split_dim, concat_dim
    per_host = n // hosts
    host, local = divmod(rank, per_host)
    send = flat.send_sizes  # the same on every rank: the split dim agrees across ranks
    lengths = [int(sh[c]) for sh in shapes]
    order = tuple(h * per_host + le for le in range(per_host) for h in range(hosts))
    to_local = tuple(sum(send[h * per_host + le] for h in range(hosts)) for le in range(per_host))
    mine = flat.in_shape
    inside = AllToAll(mine, s, c, to_local, with_dim(mine, s, to_local[local]),
                      tuple(lengths[host * per_host + le] for le in range(per_host)))
    across = AllToAll(inside.out_shape, s, c, tuple(send[h * per_host + local] for h in range(hosts)),
                      with_dim(inside.out_shape, s, send[rank]),
                      tuple(sum(lengths[h * per_host : (h + 1) * per_host]) for h in range(hosts)))
    steps = (Reorder(s, send, order), OnMeshDim(1, "all_to_all (inside the host)", (inside,)),
             OnMeshDim(0, "all_to_all (across hosts)", (across,)))
    return RankPlan("all_to_all", rank, n, steps)


def _same_dim_hierarchical(rank: int, shapes: Sequence[Shape], dim: int, hosts: int,
                           split_sizes: Sequence[int] | None) -> RankPlan:
    """``all_to_all_hierarchical`` with ``split_dim == concat_dim == dim``: ``p[q][d]``, the
    length along ``dim`` rank q sends rank d, is known to every rank (each cuts its own length
    by ``split_sizes`` or the balanced rule), so both levels are planned as ``all_to_all_v``'s."""
    n = len(shapes)
    per_host = n // hosts
    host, local = divmod(rank, per_host)
    p = [tuple(split_sizes) if split_sizes is not None else tuple(shard_sizes(int(sh[dim]), n)) for sh in shapes]
    mine = tuple(int(v) for v in shapes[rank])
    order = tuple(h * per_host + le for le in range(per_host) for h in range(hosts))
    sources = [host * per_host + le for le in range(per_host)]  # this host's ranks
    inside = AllToAll(mine, dim, dim, tuple(sum(p[rank][h * per_host + le] for h in range(hosts)) for le in range(per_host)),
                      with_dim(mine, dim, 0),
                      tuple(sum(p[q][h * per_host + local] for h in range(hosts)) for q in sources))
    # arrived: from each local rank, its pieces for (h, local) in host order; across wants them
    # by destination host, then by source local rank (so that they land in rank order)
    blocks = tuple(p[q][h * per_host + local] for q in sources for h in range(hosts))
    by_host = tuple(le * hosts + h for h in range(hosts) for le in range(per_host))
    across = AllToAll(inside.out_shape, dim, dim, tuple(sum(p[q][h * per_host + local] for q in sources) for h in range(hosts)),
                      with_dim(mine, dim, 0),
                      tuple(sum(p[h * per_host + le][rank] for le in range(per_host)) for h in range(hosts)))
    steps = (Reorder(dim, p[rank], order), OnMeshDim(1, "all_to_all (inside the host)", (inside,)),
             Reorder(dim, blocks, by_host), OnMeshDim(0, "all_to_all (across hosts)", (across,)))
    return RankPlan("all_to_all", rank, n, steps)


def all_to_all_v(rank: int, size: int, segments: Sequence[tuple[Sequence[int], Sequence[int]]],
                 op: str = "all_to_all_v", total_rows: int = 0) -> RankPlan:
    """Rows along dim 0: each segment's (rows to each rank, rows from each rank), in order.
    ``total_rows``: every rank's rows together, where the caller knows them alike on every
    rank (the exchange may then read in place, ``execution.arena_reads``); else 0."""
    segs = tuple((tuple(int(v) for v in a), tuple(int(v) for v in b)) for a, b in segments)
    return RankPlan(op, rank, size, (AllToAllV(segs, int(total_rows)),))


def all_to_all_v_hierarchical(rank: int, matrix: Sequence[Sequence[int]], hosts: int) -> RankPlan:
    """``all_to_all_v`` in two levels over ``hosts`` hosts of ``L`` consecutive ranks
    (``matrix[s][d]``: rows rank s sends rank d, known to every rank): the rows reordered so that
    what goes to each local index is one run; an exchange inside the host, after which local rank
    l holds everything its host sends to local rank l of every host; those rows reordered by
    destination host; one exchange among the ranks with this local index (one message per
    remote host). The result is the flat exchange's, row for row."""
    n = len(matrix)
    per_host = n // hosts
    host, local = divmod(rank, per_host)
    c = [[int(v) for v in row] for row in matrix]
    dest = [h * per_host + le for le in range(per_host) for h in range(hosts)]  # to local index le, host-major
    out_inside = [sum(c[rank][h * per_host + le] for h in range(hosts)) for le in range(per_host)]
    in_inside = [sum(c[host * per_host + le][h * per_host + local] for h in range(hosts)) for le in range(per_host)]
    # arrived: from each local rank le, its rows for (h, local) in host order; the across
    # exchange wants them by destination host, then by source local rank
    blocks = [c[host * per_host + le][h * per_host + local] for le in range(per_host) for h in range(hosts)]
    by_host = tuple(le * hosts + h for h in range(hosts) for le in range(per_host))
    out_across = [sum(c[host * per_host + le][h * per_host + local] for le in range(per_host)) for h in range(hosts)]
    in_across = [sum(c[h * per_host + le][rank] for le in range(per_host)) for h in range(hosts)]
    steps = (Reorder(0, tuple(c[rank]), tuple(dest)),
             OnMeshDim(1, "all_to_all_v (inside the host)", (AllToAllV(((tuple(out_inside), tuple(in_inside)),)),)),
             Reorder(0, tuple(blocks), by_host),
             OnMeshDim(0, "all_to_all_v (across hosts)", (AllToAllV(((tuple(out_across), tuple(in_across)),)),)))
    return RankPlan("all_to_all_v", rank, n, steps)


def all_gather(rank: int, shapes: Sequence[Shape], dim: int) -> RankPlan:
    lengths = tuple(int(sh[dim]) for sh in shapes)
    return RankPlan("all_gather", rank, len(shapes), (AllGather(dim, lengths, with_dim(shapes[rank], dim, sum(lengths))),))


def gather(rank: int, shapes: Sequence[Shape], dim: int, root: int) -> RankPlan:
    return RankPlan("gather", rank, len(shapes), (Gather(dim, tuple(int(sh[dim]) for sh in shapes), root),))


def reduce_scatter(rank: int, size: int, dim: int, op: str) -> RankPlan:
    return RankPlan("reduce_scatter", rank, size, (ReduceScatter(dim, op),))


def _all_reduce_steps(shape: Sequence[int], size: int, op: str) -> tuple[Step, ...]:
    """A reduce_scatter of the flattened tensor, reduced in rank order, then its all_gather."""
    lengths = tuple(shard_sizes(_numel(shape), size))
    return ReduceScatter(None, op), AllGather(None, lengths, tuple(int(s) for s in shape))


def all_reduce(rank: int, size: int, shape: Sequence[int], op: str) -> RankPlan:
    return RankPlan("all_reduce", rank, size, _all_reduce_steps(shape, size, op))


def redistribute(global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int], rank: int, rule: str = "balanced") -> RankPlan:
    """``redistribute`` of a tensor of ``global_shape`` from ``src`` to ``dst`` (one placement
    per mesh dim) on a mesh of ``mesh_shape``, as rank ``rank`` runs it; a world of N ranks is
    the mesh ``(N,)``. Shards split by ``rule`` (``balanced``, or ``chunk`` as PyTorch DTensor
    splits). The steps: each Partial source reduced on its mesh dim, then one exchange of boxes
    (``mesh_plan.MeshPlan``), which runs as the engine's own all_to_all or all_gather on one
    mesh dim's communicator where it is one (``_as_collective``)."""
    shape = tuple(int(g) for g in global_shape)
    mesh_shape = tuple(int(m) for m in mesh_shape)
    src = normalized(parse_placements(src, len(mesh_shape)), len(shape), "src Shard dim")
    dst = normalized(parse_placements(dst, len(mesh_shape)), len(shape), "dst Shard dim")
    size = _numel(mesh_shape)
    if src == dst:
        return RankPlan("redistribute", rank, size, ())
    return RankPlan("redistribute", rank, size, _mesh(MeshPlan(shape, src, dst, mesh_shape, rule), rank))


def exchange_boxes(global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                   mesh_shape: Sequence[int], rank: int, rule: str = "balanced") -> ExchangeBoxes | None:
    """The change as one exchange of boxes on the whole mesh, for a call that moves many
    tensors in one exchange: where no value is reduced or filled (Shard/Replicate, and Partial
    kept as it is, on both sides); None otherwise (the tensor then takes ``redistribute``'s plan)."""
    shape = tuple(int(g) for g in global_shape)
    mesh_shape = tuple(int(m) for m in mesh_shape)
    plan = MeshPlan(shape, normalized(src, len(shape)), normalized(dst, len(shape)), mesh_shape, rule)
    if plan.reductions or plan.owned_dims or plan.fill_op is not None:
        return None
    moves = plan.moves()
    sends, recvs = plan.rank_exchange(rank) if moves else ([], [])
    return ExchangeBoxes(plan.exchange.held(rank), plan.target(rank), tuple(sends), tuple(recvs), tuple(plan.kept(rank)),
                         None, moves, _sources(plan, recvs), shape, plan.gathers_only())


def first_send(local_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
               mesh_shape: Sequence[int], rule: str = "balanced") -> tuple[int, tuple[int, ...]] | None:
    """(split dim, lengths sent to each rank) of the all_to_all a world's ``redistribute``
    plan starts with, from this rank's own piece alone (so its pack may start while the
    records travel, before the global shape is agreed); None where the plan starts otherwise."""
    if len(mesh_shape) != 1:
        return None
    src, dst = normalized(src, len(local_shape)), normalized(dst, len(local_shape))
    a, b = src[0], dst[0]
    if not (isinstance(a, Shard) and isinstance(b, Shard)) or a.dim == b.dim:
        return None
    # dst's dim is whole on every rank: the split of its length is the plan's (``_as_collective``)
    return b.dim, tuple(split_sizes(int(local_shape[b.dim]), int(mesh_shape[0]), rule))


def normalized(placements: Sequence[Placement], ndim: int, name: str = "Shard dim") -> tuple[Placement, ...]:
    """The placements with each Shard's dim counted from the front (``name`` says which, if out of range)."""
    return normalize_placements(placements, ndim, name)


def _on_mesh_dim(mesh_shape: Shape, m: int, name: str, steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """``steps`` among the ranks that differ only on mesh dim ``m``: on a 1-D mesh (a world),
    the world's own steps."""
    return steps if len(mesh_shape) == 1 else (OnMeshDim(m, name, steps),)


def _mesh(plan: MeshPlan, rank: int) -> tuple[Step, ...]:
    """A layout change: each Partial source reduced on its mesh dim, then one exchange."""
    coord = unravel(rank, plan.mesh_shape)
    local = [b - a for a, b in mesh_region(plan.shape, plan.src, coord, plan.mesh_shape, plan.exchange.rule)]
    steps: list[Step] = []
    for red in plan.reductions:
        k = plan.mesh_shape[red.mesh_dim]
        if red.collective == "reduce_scatter":
            steps += _on_mesh_dim(plan.mesh_shape, red.mesh_dim, "reduce_scatter", (ReduceScatter(red.dim, red.op),))
            local[red.dim] = _piece(local[red.dim], k, coord[red.mesh_dim])
        else:
            steps += _on_mesh_dim(plan.mesh_shape, red.mesh_dim, "all_reduce", _all_reduce_steps(local, k, red.op))
    typed = _as_collective(plan, coord, tuple(local))  # also when every piece is empty: the same steps
    if typed is not None:
        return (*steps, *typed)
    moves = plan.moves()
    if moves or plan.local_work():  # the same answer on every rank: every rank takes the step
        sends, recvs = plan.rank_exchange(rank) if moves else ([], [])
        steps.append(ExchangeBoxes(plan.exchange.held(rank), plan.target(rank), tuple(sends), tuple(recvs),
                                   tuple(plan.kept(rank)), plan.fill_op, moves, _sources(plan, recvs), plan.shape,
                                   plan.gathers_only()))
    return tuple(steps)


def _sources(plan: MeshPlan, recvs: Sequence[tuple[int, Box]]) -> tuple[tuple[int, Box], ...]:
    """(peer, the box its input covers) for each peer ``recvs`` names: where a reader finds its
    boxes in the peer's input (``execution.arena_reads``)."""
    return tuple((p, plan.exchange.held(p)) for p in sorted({p for p, _ in recvs}))


def _as_collective(plan: MeshPlan, coord: Sequence[int], local: Shape) -> tuple[Step, ...] | None:
    """The exchange as the engine's all_to_all or all_gather on one mesh dim's communicator,
    where it is one (``MeshPlan.collective``); else None."""
    if plan.collective is None:
        return None
    m, name = plan.collective
    a, b = plan.exchange.src[m], plan.exchange.dst[m]
    k, i, rule = plan.mesh_shape[m], coord[m], plan.exchange.rule
    along_a = tuple(split_sizes(plan.shape[a.dim], k, rule))
    if name == "all_to_all":
        send = tuple(split_sizes(plan.shape[b.dim], k, rule))
        step: Step = AllToAll(local, b.dim, a.dim, send, with_dim(local, b.dim, send[i]), along_a)
    else:
        step = AllGather(a.dim, along_a, with_dim(local, a.dim, plan.shape[a.dim]))
    return _on_mesh_dim(plan.mesh_shape, m, name, (step,))


def backward_placements(src: Placement, dst: Placement) -> tuple[Placement, Placement]:
    """The gradient's layout change for ``src -> dst``: ``dst -> src`` with Partial read as
    Replicate (the gradient of a sum with respect to each addend is the whole gradient)."""
    back_src = Replicate() if isinstance(dst, Partial) else dst
    back_dst = Replicate() if isinstance(src, Partial) else src
    return back_src, back_dst


def rank_traffic(plan: RankPlan, in_shape: Sequence[int], mesh_shape: Sequence[int] | None = None
                 ) -> list[tuple[str, dict[int, int], dict[int, int]]]:
    """Per step of ``plan`` (rank ``plan.rank``, input of ``in_shape``): (collective, elements
    sent to each peer, elements received from each peer), own part excluded, peers as world
    ranks. What the executor moves, worked out from the plan alone."""
    return [(step.collective, sent, received) for step, _, sent, received in walk(plan, in_shape, mesh_shape)]


def walk(plan: RankPlan, in_shape: Sequence[int], mesh_shape: Sequence[int] | None = None
         ) -> list[tuple[Step, Shape, dict[int, int], dict[int, int]]]:
    """Per step of ``plan``: (the step, the shape of its input, elements sent to and received
    from each peer as in ``rank_traffic``)."""
    out = []
    shape = tuple(int(s) for s in in_shape)
    coord = unravel(plan.rank, mesh_shape) if mesh_shape is not None else (plan.rank,)
    for step in plan.steps:
        before = shape
        if isinstance(step, OnMeshDim):
            k = mesh_shape[step.mesh_dim]
            group = [_with_coord(coord, step.mesh_dim, i, mesh_shape) for i in range(k)]
            sent: dict[int, int] = {}
            received: dict[int, int] = {}
            for sub in step.steps:
                a, b, shape = _one(sub, coord[step.mesh_dim], k, shape)
                for p, v in a.items():
                    sent[group[p]] = sent.get(group[p], 0) + v
                for p, v in b.items():
                    received[group[p]] = received.get(group[p], 0) + v
            out.append((step, before, sent, received))
        else:
            a, b, shape = _one(step, plan.rank, plan.size, shape)
            out.append((step, before, a, b))
    return out


def _with_coord(coord: Sequence[int], m: int, value: int, mesh_shape: Sequence[int]) -> int:
    c = list(coord)
    c[m] = value
    return ravel(c, mesh_shape)


def _one(step: Step, rank: int, n: int, shape: Shape) -> tuple[dict[int, int], dict[int, int], Shape]:
    """(sent per peer, received per peer, output shape) of one step on a communicator of ``n``."""
    def others(values: Sequence[int]) -> dict[int, int]:
        return {p: int(v) for p, v in enumerate(values) if p != rank and v}

    if isinstance(step, AllToAll):
        rest = _numel(with_dim(step.in_shape, step.split_dim, 1))
        rest_in = _numel(with_dim(step.recv_base, step.concat_dim, 1))
        return (others([k * rest for k in step.send_sizes]), others([k * rest_in for k in step.recv_lengths]),
                step.out_shape)
    if isinstance(step, AllToAllV):
        row = _numel(shape[1:])
        send = [sum(seg[0][p] for seg in step.segments) * row for p in range(n)]
        recv = [sum(seg[1][p] for seg in step.segments) * row for p in range(n)]
        return others(send), others(recv), (sum(sum(seg[1]) for seg in step.segments), *shape[1:])
    if isinstance(step, (AllGather, Gather)):
        dim = 0 if step.dim is None else step.dim
        flat = (_numel(shape),) if step.dim is None else shape
        rest = _numel(with_dim(flat, dim, 1))  # elements per unit of length (known where this rank's piece is empty)
        pieces = [k * rest for k in step.lengths]
        if isinstance(step, Gather):
            to = {step.root: pieces[rank]} if step.root != rank and pieces[rank] else {}
            return to, (others(pieces) if rank == step.root else {}), with_dim(shape, dim, sum(step.lengths))
        out = step.shape if step.shape is not None else with_dim(shape, dim, sum(step.lengths))
        return others([pieces[rank]] * n), others(pieces), out
    if isinstance(step, ReduceScatter):
        flat = (_numel(shape),) if step.dim is None else shape
        dim = 0 if step.dim is None else step.dim
        rest = _numel(with_dim(flat, dim, 1))
        sizes = shard_sizes(flat[dim], n)
        return others([k * rest for k in sizes]), others([sizes[rank] * rest] * n), with_dim(flat, dim, sizes[rank])
    if isinstance(step, ExchangeBoxes):
        def per_peer(pairs: Sequence[tuple[int, tuple]]) -> dict[int, int]:
            acc: dict[int, int] = {}
            for p, box in pairs:
                acc[p] = acc.get(p, 0) + _numel([b - a for a, b in box])
            return {p: v for p, v in acc.items() if v}

        return per_peer(step.sends), per_peer(step.recvs), tuple(b - a for a, b in step.target)
    if isinstance(step, Reorder):
        return {}, {}, shape
    raise TypeError(f"not a step: {step!r}")


def cross_host_traffic(traffic: Sequence[tuple[str, dict[int, int], dict[int, int]]], rank: int,
                       hosts: Sequence[int]) -> tuple[int, int]:
    """(elements, messages) ``rank`` sends to ranks on other hosts over a plan whose
    ``rank_traffic`` is ``traffic`` (``hosts[q]``: rank q's host): a message is one step's part
    for one peer."""
    mine, elements, messages = hosts[rank], 0, 0
    for _, sent, _ in traffic:
        for peer, count in sent.items():
            if hosts[peer] != mine:
                elements += count
                messages += 1
    return elements, messages
