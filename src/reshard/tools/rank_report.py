"""``reshard plan --rank R``: one rank's steps, peers and bytes, on a world or a mesh: the
planner's own ``RankPlan`` for that rank (the steps its run executes), described. Pure."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..planning import planner
from ..planning.layout import (
    Placement,
    Shard,
    mesh_region,
    orders_of,
    parse_placement,
    parse_placements,
    shard_range,
    unravel,
)
from ..planning.plan import ITEMSIZE
from ..planning.spec import layout_text
from ..planning.steps import AllGather, AllToAll, ExchangeBoxes, OnMeshDim, ReduceScatter, Step

DETAIL_MAX_PEERS = 64  # a step lists each peer's region up to this many peers

Region = list[list[int]]


def _step(step: Step, over: str, sent: dict[int, int], received: dict[int, int], item: int,
          regions: Any = None) -> dict[str, Any]:
    """One step as the report gives it; ``regions(peer, sending)`` gives the global region moved
    to or from a peer where the step knows it (else None)."""
    out: dict[str, Any] = {
        "collective": step.collective, "over": over,
        "sums_values": isinstance(step, ReduceScatter) or (
            isinstance(step, OnMeshDim) and any(isinstance(s, ReduceScatter) for s in step.steps)),
        "sent_bytes": sum(sent.values()) * item, "received_bytes": sum(received.values()) * item,
        "sends_to": sorted(sent), "receives_from": sorted(received),
    }
    if len(sent) <= DETAIL_MAX_PEERS and len(received) <= DETAIL_MAX_PEERS:
        if isinstance(step, ExchangeBoxes):  # one row per box (a peer may send several)
            out["sends"] = _boxes(step.sends, item)
            out["receives"] = _boxes(step.recvs, item)
        else:
            out["sends"] = [{"peer": p, "region": regions(p, True) if regions else None, "bytes": sent[p] * item}
                            for p in sorted(sent)]
            out["receives"] = [{"peer": p, "region": regions(p, False) if regions else None, "bytes": received[p] * item}
                               for p in sorted(received)]
    return out


def _boxes(pairs: Sequence[tuple[int, Any]], item: int) -> list[dict[str, Any]]:
    rows = []
    for p, box in pairs:
        n = 1
        for a, b in box:
            n *= max(0, b - a)
        if n:
            rows.append({"peer": p, "region": [list(b) for b in box], "bytes": n * item})
    return rows


def _world_regions(shape: Sequence[int], src: Placement, step: Step, rank: int, n: int) -> Any:
    """The global region a world step moves between ``rank`` and a peer (shards and gathers)."""
    def held(r: int) -> Region:
        region = [[0, int(s)] for s in shape]
        if isinstance(src, Shard):
            region[src.dim] = list(shard_range(shape[src.dim], n, r))
        return region

    if isinstance(step, AllToAll):
        def cut(p: int, sending: bool) -> Region:
            region = held(rank if sending else p)
            region[step.split_dim] = list(shard_range(shape[step.split_dim], n, p if sending else rank))
            return region

        return cut
    if isinstance(step, AllGather) and step.dim is not None:
        return lambda p, sending: held(rank if sending else p)
    return None


def hosts_rank_report(shape: Sequence[int], rank: int, hosts: int, per_host: int, dtype: str = "float32"
                      ) -> dict[str, Any]:
    """``reshard plan --hosts H --ranks-per-host L --rank R``: rank R's part of the row -> column
    all_to_all in two levels (``planner.all_to_all_hierarchical``, what
    ``rs.all_to_all(..., algorithm="hierarchical")`` runs), with ``plan_seconds``."""
    import numpy  # noqa: F401  (loaded before the clock starts)

    item = ITEMSIZE[dtype]
    shape = tuple(int(s) for s in shape)
    n, mesh_shape = hosts * per_host, (hosts, per_host)
    rows = [b - a for a, b in (shard_range(shape[0], n, r) for r in range(n))]
    started = time.perf_counter()
    plan = planner.all_to_all_hierarchical(rank, [(r, *shape[1:]) for r in rows], 1, 0, hosts)
    seconds = time.perf_counter() - started
    steps = []
    for step, (_, sent, received) in zip(plan.steps, planner.rank_traffic(plan, (rows[rank], *shape[1:]), mesh_shape)):
        over = "this rank"
        if isinstance(step, OnMeshDim):
            over = (f"the {per_host} ranks of host {rank // per_host}" if step.mesh_dim == 1
                    else f"local rank {rank % per_host} of each of the {hosts} hosts")
        steps.append(_step(step, over, sent, received, item))
    return {
        "rank": rank, "ranks": n, "hosts": hosts, "ranks_per_host": per_host, "host": rank // per_host,
        "global_shape": list(shape), "dtype": dtype, "src": "Shard(0)", "dst": "Shard(1)", "algorithm": "hierarchical",
        "steps": steps, "sent_bytes": sum(s["sent_bytes"] for s in steps),
        "received_bytes": sum(s["received_bytes"] for s in steps),
        "peers": sorted({p for st in steps for p in (*st["sends_to"], *st["receives_from"])}), "plan_seconds": seconds,
    }


def rank_report(shape: Sequence[int], src: Any, dst: Any, rank: int, dtype: str = "float32", *,
                ranks: int | None = None, mesh: Sequence[int] | None = None) -> dict[str, Any]:
    """Everything ``reshard plan --rank`` prints, with ``plan_seconds``: the planning alone."""
    import numpy  # noqa: F401  (loaded before the clock starts: a process pays it once, not per plan)

    item = ITEMSIZE[dtype]
    shape = tuple(int(s) for s in shape)
    world = mesh is None
    mesh_shape = (int(ranks),) if world else tuple(int(m) for m in mesh)
    src_t = (parse_placement(src),) if world else parse_placements(src, len(mesh_shape))
    dst_t = (parse_placement(dst),) if world else parse_placements(dst, len(mesh_shape))
    started = time.perf_counter()
    plan = planner.redistribute(shape, src_t, dst_t, mesh_shape, rank)
    seconds = time.perf_counter() - started
    src_t = planner.normalized(src_t, len(shape))
    coord = unravel(rank, mesh_shape)
    in_shape = tuple(b - a for a, b in mesh_region(shape, src_t, coord, mesh_shape))
    steps = []
    for step, (_, sent, received) in zip(plan.steps, planner.rank_traffic(plan, in_shape, mesh_shape)):
        if isinstance(step, OnMeshDim):
            over = f"mesh dim {step.mesh_dim}"
        elif isinstance(step, ExchangeBoxes) and not step.moves:
            over = "this rank"
        else:
            over = "the world" if world else "the whole mesh"
        regions = _world_regions(shape, src_t[0], step, rank, mesh_shape[0]) if world else None
        steps.append(_step(step, over, sent, received, item, regions))
    peers = sorted({p for st in steps for p in (*st["sends_to"], *st["receives_from"])})
    names = (lambda ps: repr(ps[0])) if world else (lambda ps: layout_text(ps) if orders_of(ps) else [repr(p) for p in ps])
    where: dict[str, Any] = {"ranks": mesh_shape[0]} if world else {
        "mesh": list(mesh_shape), "ranks": plan.size, "coord": list(coord)}
    return {
        "rank": rank, **where, "global_shape": list(shape), "dtype": dtype, "src": names(src_t), "dst": names(planner.normalized(dst_t, len(shape))),
        "steps": steps, "sent_bytes": sum(s["sent_bytes"] for s in steps),
        "received_bytes": sum(s["received_bytes"] for s in steps), "peers": peers, "plan_seconds": seconds,
    }
