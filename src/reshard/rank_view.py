"""``reshard plan --rank R``: one rank's steps, peers and bytes, on a world or a mesh, worked
out from that rank alone (``rank_plan``): never a transfer per pair of ranks. Pure."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .layout import Placement, Replicate, mesh_region, shard_sizes, unravel
from .mesh_plan import MeshPlan
from .plan import ITEMSIZE, make_plan
from .rank_plan import ExchangeGeometry

DETAIL_MAX_PEERS = 64  # a step lists each peer's region up to this many peers


def _step(collective: str, over: str, sends: list[tuple[int, Any, int]], recvs: list[tuple[int, Any, int]],
          sums: bool) -> dict[str, Any]:
    """One step as the report gives it; ``sends``/``recvs``: (peer, region or None, bytes)."""
    sends = [s for s in sends if s[2]]
    recvs = [r for r in recvs if r[2]]
    out: dict[str, Any] = {
        "collective": collective, "over": over, "sums_values": sums,
        "sent_bytes": sum(b for _, _, b in sends), "received_bytes": sum(b for _, _, b in recvs),
        "sends_to": [p for p, _, _ in sends], "receives_from": [p for p, _, _ in recvs],
    }
    if len(sends) <= DETAIL_MAX_PEERS and len(recvs) <= DETAIL_MAX_PEERS:
        out["sends"] = [{"peer": p, "region": reg, "bytes": b} for p, reg, b in sends]
        out["receives"] = [{"peer": p, "region": reg, "bytes": b} for p, reg, b in recvs]
    return out


def _exchange(geometry: ExchangeGeometry, rank: int, item: int, collective: str, over: str) -> Callable[[], dict]:
    """Plans the rank's part now; the returned function describes it (lists for the report)."""
    mine = geometry.for_rank(rank)
    return lambda: _describe_exchange(mine, item, collective, over)


def _describe_exchange(mine: Any, item: int, collective: str, over: str) -> dict[str, Any]:
    detail = len(mine.send_peers) <= DETAIL_MAX_PEERS and len(mine.recv_peers) <= DETAIL_MAX_PEERS

    def rows(peers: Any, lo: Any, hi: Any, counts: Any) -> list[tuple[int, Any, int]]:
        regions = [[[int(a), int(b)] for a, b in zip(x, y)] for x, y in zip(lo, hi)] if detail else [None] * len(peers)
        return [(int(p), reg, int(c) * item) for p, reg, c in zip(peers, regions, counts)]

    return _step(collective, over, rows(mine.send_peers, mine.send_lo, mine.send_hi, mine.send_counts),
                 rows(mine.recv_peers, mine.recv_lo, mine.recv_hi, mine.recv_counts), False)


def _group_reduction(collective: str, over: str, group: Sequence[int], me: int, piece_counts: Sequence[int],
                     item: int) -> list[Callable[[], dict]]:
    """A reduce_scatter (and, for an all-reduce, the all-gather after it) of pieces
    ``piece_counts`` (elements, one per group position) among ``group``."""
    i = group.index(me)

    def others() -> list[tuple[int, int]]:
        return [(j, q) for j, q in enumerate(group) if q != me]

    def scatter() -> dict[str, Any]:
        return _step("reduce_scatter", over, [(q, None, piece_counts[j] * item) for j, q in others()],
                     [(q, None, piece_counts[i] * item) for _, q in others()], True)

    def gather() -> dict[str, Any]:
        return _step("all_gather", over, [(q, None, piece_counts[i] * item) for _, q in others()],
                     [(q, None, piece_counts[j] * item) for j, q in others()], False)

    return [scatter] if collective == "reduce_scatter" else [scatter, gather]


def _joined(collective: str, over: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps that run as one (a mesh dim's all-reduce: its reduce_scatter and all_gather)."""
    return {"collective": collective, "over": over, "sums_values": True,
            "sent_bytes": sum(p["sent_bytes"] for p in parts), "received_bytes": sum(p["received_bytes"] for p in parts),
            "sends_to": sorted({q for p in parts for q in p["sends_to"]}),
            "receives_from": sorted({q for p in parts for q in p["receives_from"]})}


def world_steps(shape: Sequence[int], src: Placement, dst: Placement, size: int, rank: int,
                item: int) -> list[Callable[[], dict]]:
    """The steps a world's ``redistribute`` runs, as ``rank`` takes part in them (each planned,
    and described when called)."""
    plan = make_plan(shape, src, dst, size, itemsize=item)
    src, dst, steps = plan.src, plan.dst, []
    numel = 1
    for s in plan.global_shape:
        numel *= s
    world = range(size)
    for step in plan.steps:
        if step.collective == "all_to_all":
            geometry = ExchangeGeometry(plan.global_shape, (src,), (dst,), (size,))
            steps.append(_exchange(geometry, rank, item, "all_to_all", "the world"))
        elif step.collective == "all_gather" and step.dim is not None:
            geometry = ExchangeGeometry(plan.global_shape, (src,), (Replicate(),), (size,))
            steps.append(_exchange(geometry, rank, item, "all_gather", "the world"))
        elif step.collective == "reduce_scatter" and step.dim is not None:
            rest = numel // plan.global_shape[step.dim] if plan.global_shape[step.dim] else 0
            counts = [n * rest for n in shard_sizes(plan.global_shape[step.dim], size)]
            steps += _group_reduction("reduce_scatter", "the world", world, rank, counts, item)
        elif step.collective == "reduce_scatter":  # an all-reduce: the flattened tensor scattered, ...
            steps += _group_reduction("all_reduce", "the world", world, rank, shard_sizes(numel, size), item)
        elif step.collective == "local":
            steps.append(lambda action=step.action: _step("local", "this rank", [], [], False) | {"action": action})
        # ... then gathered: the flat all_gather is the second half of the all-reduce above
    return steps


def mesh_steps(shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement], mesh_shape: Sequence[int],
               rank: int, item: int) -> list[Callable[[], dict]]:
    """The steps of a mesh ``redistribute``, as ``rank`` takes part in them (each planned, and
    described when called)."""
    plan = MeshPlan(shape, src, dst, mesh_shape)
    coord = plan.exchange.coord(rank)
    local = [b - a for a, b in mesh_region(plan.shape, plan.src, coord, plan.mesh_shape)]
    steps: list[dict] = []
    for red in plan.reductions:
        m, k = red.mesh_dim, plan.mesh_shape[red.mesh_dim]
        group = [plan.exchange.rank(coord[:m] + (c,) + coord[m + 1 :]) for c in range(k)]
        total = 1
        for s in local:
            total *= s
        if red.collective == "reduce_scatter":
            rest = total // local[red.dim] if local[red.dim] else 0
            sizes = shard_sizes(local[red.dim], k)
            steps += _group_reduction("reduce_scatter", f"mesh dim {m}", group, rank, [n * rest for n in sizes], item)
            local[red.dim] = sizes[coord[m]]
        else:
            halves = _group_reduction("all_reduce", f"mesh dim {m}", group, rank, shard_sizes(total, k), item)
            steps.append(lambda halves=halves, m=m: _joined("all_reduce", f"mesh dim {m}", [h() for h in halves]))
    if plan.moves():
        if plan.geometry is not None:
            steps.append(_exchange(plan.geometry, rank, item, "all_to_all", "the whole mesh"))
        else:
            sends, recvs = plan.rank_exchange(rank)
            steps.append(lambda: _step("all_to_all", "the whole mesh", _rows(sends, item), _rows(recvs, item), False))
    return steps  # a Partial destination's fill with the op's identity is local work, not a step


def _rows(pairs: list, item: int) -> list[tuple[int, Any, int]]:
    return [(q, [list(b) for b in box], _numel(box) * item) for q, box in pairs]


def _numel(box: Any) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def rank_report(shape: Sequence[int], src: Any, dst: Any, rank: int, dtype: str = "float32", *,
                ranks: int | None = None, mesh: Sequence[int] | None = None) -> dict[str, Any]:
    """Everything ``reshard plan --rank`` prints, with ``plan_seconds``: the planning alone."""
    import numpy  # noqa: F401  (loaded before the clock starts: a process pays it once, not per plan)

    item = ITEMSIZE[dtype]
    started = time.perf_counter()
    if mesh is None:
        steps = world_steps(shape, src, dst, int(ranks), rank, item)
        where: dict[str, Any] = {"ranks": int(ranks)}
    else:
        steps = mesh_steps(shape, src, dst, mesh, rank, item)
        size = 1
        for s in mesh:
            size *= s
        where = {"mesh": list(mesh), "ranks": size, "coord": list(unravel(rank, mesh))}
    seconds = time.perf_counter() - started
    steps = [describe() for describe in steps]
    peers = sorted({p for st in steps for p in (*st["sends_to"], *st["receives_from"])})
    names = (lambda p: repr(p)) if mesh is None else (lambda ps: [repr(p) for p in ps])
    return {
        "rank": rank, **where, "global_shape": list(shape), "dtype": dtype, "src": names(src), "dst": names(dst),
        "steps": steps, "sent_bytes": sum(s["sent_bytes"] for s in steps),
        "received_bytes": sum(s["received_bytes"] for s in steps), "peers": peers, "plan_seconds": seconds,
    }

