"""Planning a layout change on an N-D mesh as boxes: pure, no engine, no array library.

Between Shard/Replicate layouts the change is one exchange in which every rank receives only
the elements it needs and does not hold, each exactly once, as boxes (products of intervals).
An element a rank needs comes from the holder nearest to it: the rank that shares its
coordinates on every mesh dim where the source replicates (itself, when it holds the element),
so the load spreads over the replicas. A rank's own boxes come from its coordinate alone
(``rank_exchange``, through ``box_geometry.ExchangeGeometry``) and the totals from vectorised
per-rank sums; only the small-mesh reports (``bytes_per_rank``, the traffic matrix) and Partial
destinations (a group's first rank receives what none of the group holds) list every rank's.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from .box_geometry import ExchangeGeometry
from .layout import (
    Placement,
    Replicate,
    Shard,
    check_int,
    check_spec_dims,
    mesh_region,
    normalize_placements,
    orders_of,
    parse_placements,
    ravel,
    shard_sizes,
    split_by,
    split_sizes,
    unravel,
    with_order,
)
from .plan import ITEMSIZE, check_shape
from .plan import Region as Box
from .plan import region_numel as box_size
from .spec import layout_text, without_unit_dims


def box_intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def box_subtract(a: Box, b: Box) -> list[Box]:
    """``a`` minus ``b`` as at most 2 x ndim disjoint boxes."""
    cut = box_intersect(a, b)
    if cut is None:
        return [a] if box_size(a) else []
    out, rest = [], list(a)
    for d, ((lo, hi), (clo, chi)) in enumerate(zip(a, cut)):
        if lo < clo:
            out.append(tuple(rest[:d]) + ((lo, clo),) + tuple(rest[d + 1 :]))
        if chi < hi:
            out.append(tuple(rest[:d]) + ((chi, hi),) + tuple(rest[d + 1 :]))
        rest[d] = (clo, chi)
    return [b for b in out if box_size(b)]


@dataclass(frozen=True)
class _Pieces:
    """How one tensor dim is cut under a layout: the mesh dims that shard it (outermost first),
    and every piece's [start, stop) with the coordinates it belongs to on those mesh dims."""

    mesh_dims: tuple[int, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]
    coords: tuple[tuple[int, ...], ...]


def _pieces(length: int, placements: Sequence[Placement], dim: int, mesh_shape: Sequence[int],
            rule: str = "balanced") -> _Pieces:
    dims = split_by(placements, dim)
    spans: list[tuple[int, int, tuple[int, ...]]] = [(0, length, ())]
    for m in dims:
        nxt = []
        for start, stop, coord in spans:
            at = start
            for k, size in enumerate(split_sizes(stop - start, mesh_shape[m], rule)):
                nxt.append((at, at + size, coord + (k,)))
                at += size
        spans = nxt
    return _Pieces(dims, tuple(s[0] for s in spans), tuple(s[1] for s in spans), tuple(s[2] for s in spans))


def _normalize(placements: Sequence[Placement], ndim: int, mesh_ndim: int, name: str) -> tuple[Placement, ...]:
    check_spec_dims(placements, ndim, name)
    placements = parse_placements(placements, mesh_ndim)  # a Spec or text as its placements
    if len(placements) != mesh_ndim:
        count = len(placements)
        raise InvalidArgument(f"{name} has {count} placement{'' if count == 1 else 's'} for a {mesh_ndim}-d mesh")
    return normalize_placements(placements, ndim, f"{name} Shard dim")


class _Transfers:
    """What follows from ``recvs(rank)`` (the boxes each rank receives, with their senders)."""

    size: int

    def recvs(self, rank: int) -> list[tuple[int, Box]]:
        raise NotImplementedError

    def sends(self, rank: int) -> list[tuple[int, Box]]:
        """(destination rank, box) for every piece ``rank`` sends (the mirror of ``recvs``)."""
        return [(q, box) for q in range(self.size) for src, box in self.recvs(q) if src == rank]

    def bytes_per_rank(self, itemsize: int) -> tuple[list[int], list[int]]:
        """(sent, received) bytes per rank, listing every rank's boxes (small meshes)."""
        sent, received = [0] * self.size, [0] * self.size
        for q in range(self.size):
            for p, box in self.recvs(q):
                n = box_size(box) * itemsize
                sent[p] += n
                received[q] += n
        return sent, received


class BoxExchange(_Transfers):
    """One exchange between two Shard/Replicate layouts of a tensor on a mesh."""

    def __init__(self, global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int], rule: str = "balanced"):
        self.rule = rule
        self.shape = tuple(int(s) for s in global_shape)
        self.mesh_shape = tuple(int(s) for s in mesh_shape)
        self.src = _normalize(src, len(self.shape), len(self.mesh_shape), "src")
        self.dst = _normalize(dst, len(self.shape), len(self.mesh_shape), "dst")
        for name, layout in (("src", self.src), ("dst", self.dst)):
            if not all(isinstance(p, (Shard, Replicate)) for p in layout):
                raise InvalidArgument(f"{name} {list(layout)}: a box exchange moves Shard and Replicate layouts only")
        self.size = 1
        for s in self.mesh_shape:
            self.size *= s

    @functools.cached_property
    def src_pieces(self) -> list[_Pieces]:
        """The source's cut of each tensor dim (listed: only the listed path reads it)."""
        return [_pieces(n, self.src, d, self.mesh_shape, self.rule) for d, n in enumerate(self.shape)]

    def coord(self, rank: int) -> tuple[int, ...]:
        return unravel(rank, self.mesh_shape)

    def rank(self, coord: Sequence[int]) -> int:
        return ravel(coord, self.mesh_shape)

    def held(self, rank: int) -> Box:
        return mesh_region(self.shape, self.src, self.coord(rank), self.mesh_shape, self.rule)

    def needed(self, rank: int) -> Box:
        return mesh_region(self.shape, self.dst, self.coord(rank), self.mesh_shape, self.rule)

    def recvs(self, rank: int) -> list[tuple[int, Box]]:
        """(source rank, box) for every piece ``rank`` receives: what it needs and does not hold,
        each element once, from the holder that shares its coordinates where the source replicates."""
        return self.sources(rank, box_subtract(self.needed(rank), self.held(rank)))

    def sources(self, rank: int, boxes: Sequence[Box]) -> list[tuple[int, Box]]:
        """``boxes`` (none held by ``rank``) cut by the source layout, each piece with its holder."""
        me = self.coord(rank)
        out = []
        for box in boxes:
            per_dim = []
            for (lo, hi), pieces in zip(box, self.src_pieces):
                first = bisect.bisect_right(pieces.starts, lo) - 1
                last = bisect.bisect_left(pieces.starts, hi)
                per_dim.append([(max(lo, pieces.starts[k]), min(hi, pieces.stops[k]), pieces.mesh_dims, pieces.coords[k])
                                for k in range(max(first, 0), last) if pieces.starts[k] < pieces.stops[k]])
            for combo in itertools.product(*per_dim):
                coord = list(me)  # replicated source dims: the holder aligned with this rank
                for _, _, dims, cs in combo:
                    for m, c in zip(dims, cs):
                        coord[m] = c
                piece = tuple((a, b) for a, b, _, _ in combo)
                if box_size(piece):
                    out.append((self.rank(coord), piece))
        return out

    def lower_bound(self, rank: int) -> int:
        """Elements ``rank`` needs and does not hold: no plan can receive fewer."""
        return sum(box_size(b) for b in box_subtract(self.needed(rank), self.held(rank)))


@dataclass(frozen=True)
class Reduction:
    """Partial values reduced along one mesh dim, on its sub-communicator: ``reduce_scatter``
    along tensor dim ``dim`` (toward the destination's Shard) or ``all_reduce``."""

    mesh_dim: int
    collective: str
    dim: int | None
    op: str


class MeshPlan(_Transfers):
    """Every step of one layout change on a mesh: the reductions of Partial sources on their
    mesh dims, then one exchange of boxes (the minimum), then the local fill of Partial
    destinations. Pure; each rank's part is worked out from its coordinate."""

    def __init__(self, global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int], rule: str = "balanced"):
        from .layout import Partial

        shape = tuple(int(s) for s in global_shape)
        mesh_shape = tuple(int(s) for s in mesh_shape)
        src = _normalize(src, len(shape), len(mesh_shape), "src")
        dst = _normalize(dst, len(shape), len(mesh_shape), "dst")
        self.shape, self.mesh_shape, self.src, self.dst = shape, mesh_shape, src, dst
        # planned without the mesh dims of one rank: a Shard there splits nothing and a Partial
        # there is already whole, so they take no step (the layouts as given stay for reports)
        src, dst = without_unit_dims(src, mesh_shape), without_unit_dims(dst, mesh_shape)
        mid = list(src)
        order = dict(orders_of(src))
        self.reductions: list[Reduction] = []
        for m, p in enumerate(src):
            if not isinstance(p, Partial) or dst[m] == p:
                continue
            d = dst[m].dim if isinstance(dst[m], Shard) else None
            later = any(isinstance(q, Shard) and q.dim == d for q in src[m + 1 :])
            if d is not None and not later and rule == "balanced":  # reduce_scatter splits balanced
                self.reductions.append(Reduction(m, "reduce_scatter", d, p.op))
                # it splits the piece a rank holds: mesh dim m becomes the innermost split of d
                order[d] = split_by(with_order(mid, order), d) + (m,)
                mid[m] = Shard(d)
            else:
                self.reductions.append(Reduction(m, "all_reduce", None, p.op))
                mid[m] = Replicate()
        # Partial kept as it is moves like a replica: each rank keeps its own partial values.
        self.kept_partial = tuple(m for m, p in enumerate(src) if isinstance(p, Partial) and dst[m] == p)
        # Destinations that become Partial(op) from Shard/Replicate: a rank keeps what it holds of
        # its group's region and holds op's identity elsewhere; for sum only the first rank of the
        # group that holds an element keeps it (a copy on two ranks would count twice).
        self.owned_dims = tuple(m for m, p in enumerate(dst) if isinstance(p, Partial) and not isinstance(mid[m], Partial)
                                and m not in self.kept_partial and p.op != "avg")
        as_moved = with_order([Replicate() if isinstance(p, Partial) else p for p in mid], order)
        target = with_order([Replicate() if isinstance(p, Partial) else p for p in dst], orders_of(dst))
        self.mid = as_moved
        self.exchange = BoxExchange(shape, as_moved, target, mesh_shape, rule)
        self.size = self.exchange.size
        ops = {dst[m].op for m in self.owned_dims}
        if len(ops) > 1:
            raise InvalidArgument(f"dst {list(dst)}: Partial mesh dims with different ops cannot be filled at once")
        self.fill_op = ops.pop() if ops else None

    def _group(self, rank: int) -> list[int]:
        """The ranks that differ from ``rank`` only on the owned Partial dims, in coordinate order."""
        me = self.exchange.coord(rank)
        out = []
        for combo in itertools.product(*(range(self.mesh_shape[m]) for m in self.owned_dims)):
            c = list(me)
            for m, k in zip(self.owned_dims, combo):
                c[m] = k
            out.append(self.exchange.rank(c))
        return out

    def target(self, rank: int) -> Box:
        """The region ``rank``'s result covers (a Partial destination's covers its whole group's)."""
        return self.exchange.needed(rank)

    def kept(self, rank: int) -> list[Box]:
        """Boxes of ``rank``'s own data that stay in its result."""
        held, target = self.exchange.held(rank), self.target(rank)
        mine = box_intersect(held, target)
        if mine is None:
            return []
        boxes = [mine]
        for other in self._group(rank) if self.owned_dims and self.fill_op == "sum" else []:
            if other == rank:
                break
            boxes = [piece for b in boxes for piece in box_subtract(b, self.exchange.held(other))]
        return boxes

    def missing(self, rank: int) -> list[Box]:
        """Boxes ``rank`` must receive: what it needs and does not hold (with Partial
        destinations, only the first of the group receives what none of the group holds)."""
        target = self.target(rank)
        if not self.owned_dims:
            return box_subtract(target, self.exchange.held(rank))
        group = self._group(rank)
        if group[0] != rank:
            return []
        boxes = [target]
        for other in group:
            boxes = [piece for b in boxes for piece in box_subtract(b, self.exchange.held(other))]
        return boxes

    def recvs(self, rank: int) -> list[tuple[int, Box]]:
        return self.exchange.sources(rank, self.missing(rank))

    @functools.cached_property
    def geometry(self) -> ExchangeGeometry | None:
        """The per-rank form of the exchange (None with Partial destinations, which take the
        listed form: their group's first rank receives what none of the group holds)."""
        if self.owned_dims:
            return None
        return ExchangeGeometry(self.shape, self.mid, self.exchange.dst, self.mesh_shape, self.exchange.rule)

    def rank_exchange(self, rank: int) -> tuple[list[tuple[int, Box]], list[tuple[int, Box]]]:
        """(sends, receives) of ``rank`` as (peer, box) lists, ascending by peer: from its own
        coordinate alone, except with Partial destinations (every rank's boxes are listed)."""
        if self.geometry is not None:
            mine = self.geometry.for_rank(rank)
            return mine.sends(), mine.recvs()
        return self.sends(rank), self.recvs(rank)

    @functools.cached_property
    def collective(self) -> tuple[int, str] | None:
        """``(m, name)`` where the exchange is one collective on mesh dim ``m``'s communicator:
        only mesh dim ``m`` changes, from Shard(a) to Shard(b) (``all_to_all``) or to Replicate
        (``all_gather``), and no other mesh dim splits a or b, so the pieces are the rule's
        split of the whole length. It moves the same elements as the boxes (each one a rank
        needs and lacks, once), on the engine's own collective. None where it is not one."""
        src, dst = self.exchange.src, self.exchange.dst
        changed = [m for m in range(len(src)) if src[m] != dst[m]]
        if self.fill_op is not None or len(changed) != 1 or orders_of(src) != orders_of(dst):
            return None
        m = changed[0]
        a, b = src[m], dst[m]

        def alone(d: int) -> bool:
            return not any(isinstance(p, Shard) and p.dim == d for j, p in enumerate(src) if j != m)

        if not isinstance(a, Shard) or not alone(a.dim):
            return None
        if isinstance(b, Shard) and alone(b.dim):
            return m, "all_to_all"
        if isinstance(b, Replicate):
            return m, "all_gather"
        return None

    def _held_covers_target(self) -> bool:
        """True where every rank already holds its whole target (so nothing moves): along each
        tensor dim, the mesh dims that split it in the source are the first of those that split
        it in the destination, in order (a Replicate becoming a Shard, a Shard split further).
        Worked out from the layouts alone, without the per-rank geometry."""
        src, dst = self.exchange.src, self.exchange.dst
        for d in range(len(self.shape)):
            cut, into = split_by(src, d), split_by(dst, d)
            if cut != into[: len(cut)]:
                return False
        return True

    def local_work(self) -> bool:
        """Whether a rank's result is more than its input as it stands after the reductions
        (a Partial destination's fill, or a layout that keeps only part of what a rank holds)."""
        return self.fill_op is not None or self.exchange.src != self.exchange.dst

    def gathers_only(self) -> bool:
        """Whether the exchange only gathers, as an all_gather does: every rank's result covers
        all it holds, since each tensor dim's destination splits are the outermost of its
        source's (dropping inner splits replicates; any other change gives pieces away: an
        all_to_all). From the layouts alone: the same name for every shape."""
        src, dst = self.exchange.src, self.exchange.dst  # planned without mesh dims of one rank
        for d in range(len(self.shape)):
            kept = split_by(dst, d)
            if split_by(src, d)[: len(kept)] != kept:
                return False
        return True

    def moves(self) -> bool:
        """Whether the exchange moves anything on any rank (every rank takes the same steps)."""
        if self._held_covers_target():
            return False
        if self.geometry is not None:
            return self.geometry.moves()
        return any(self.recvs(q) for q in range(self.size))



def exchange_totals(global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                    mesh_shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """Elements each rank sends and receives in the ``BoxExchange`` of a Shard/Replicate change,
    without listing a single pair (``ExchangeGeometry.totals``: vectorised over the ranks)."""
    ex = BoxExchange(global_shape, src, dst, mesh_shape)  # checks and normalises the placements
    sent, received = ExchangeGeometry(ex.shape, ex.src, ex.dst, ex.mesh_shape, ex.rule).totals()
    return sent.tolist(), received.tolist()


def _orders_report(plan: MeshPlan) -> dict:
    """A layout whose tensor dim is split by mesh dims in an order other than the mesh's is
    also given as its ``Spec`` (the placements alone do not say the order)."""
    return {f"{side}_spec": layout_text(layout) for side, layout in (("src", plan.src), ("dst", plan.dst))
            if orders_of(layout)}


ENUMERATE_MAX_RANKS = 4096  # Partial destinations are summed up rank by rank below this


def _reduction_bytes(plan: MeshPlan, red: Reduction, rank: int, local: Sequence[int]) -> tuple[int, int]:
    """Elements ``rank`` sends and receives in one reduction on its mesh dim's sub-group."""
    k, c = plan.mesh_shape[red.mesh_dim], plan.exchange.coord(rank)[red.mesh_dim]
    total = 1
    for s in local:
        total *= s
    if red.collective == "reduce_scatter":
        rest = total // local[red.dim] if local[red.dim] else 0
        own = shard_sizes(local[red.dim], k)[c] * rest
        return total - own, own * (k - 1)
    own = shard_sizes(total, k)[c]
    return (total - own) + own * (k - 1), own * (k - 1) + (total - own)


def plan_summary(global_shape: Sequence[int], src: Sequence[Placement], dst: Sequence[Placement],
                 mesh_shape: Sequence[int], itemsize: int) -> dict:
    """Everything ``reshard plan --mesh`` prints: the steps, bytes per rank in each, the lower
    bound of the exchange, and the traffic matrix when the mesh is small. Exact at any size."""
    plan = MeshPlan(global_shape, src, dst, mesh_shape)
    size = plan.size
    steps = []
    local = [tuple(b - a for a, b in mesh_region(plan.shape, plan.src, plan.exchange.coord(r), plan.mesh_shape))
             for r in range(size)] if plan.reductions else []
    for red in plan.reductions:
        sent, received = [0] * size, [0] * size
        for r in range(size):
            sent[r], received[r] = _reduction_bytes(plan, red, r, local[r])
            local[r] = tuple(shard_sizes(local[r][red.dim], plan.mesh_shape[red.mesh_dim])[plan.exchange.coord(r)[red.mesh_dim]]
                             if d == red.dim else s for d, s in enumerate(local[r])) if red.collective == "reduce_scatter" else local[r]
        steps.append({"collective": red.collective, "over": f"mesh dim {red.mesh_dim}", "sums_values": True,
                      "bytes_sent_per_rank": [v * itemsize for v in sent],
                      "bytes_received_per_rank": [v * itemsize for v in received]})
    if plan.owned_dims:
        if size > ENUMERATE_MAX_RANKS:
            raise InvalidArgument(f"a Partial destination on {size} ranks: plans of up to {ENUMERATE_MAX_RANKS} ranks")
        sent, received = plan.bytes_per_rank(1)
        bound = sum(received)
    else:
        sent, received = exchange_totals(plan.shape, plan.mid, plan.exchange.dst, plan.mesh_shape)
        bound = sum(plan.exchange.lower_bound(r) for r in range(size)) if size <= ENUMERATE_MAX_RANKS else sum(received)
    if plan.collective is not None:  # one collective on one mesh dim (the planner's choice too)
        m, name = plan.collective
        steps.append({"collective": name, "over": f"mesh dim {m}", "sums_values": False,
                      "bytes_sent_per_rank": [v * itemsize for v in sent],
                      "bytes_received_per_rank": [v * itemsize for v in received]})
    elif any(sent):
        steps.append({"collective": "all_gather" if plan.gathers_only() else "all_to_all", "over": "the whole mesh",
                      "sums_values": False,
                      "bytes_sent_per_rank": [v * itemsize for v in sent],
                      "bytes_received_per_rank": [v * itemsize for v in received]})
    elif plan.local_work():  # each rank keeps part of what it holds, or fills a Partial result
        steps.append({"collective": "local", "over": "this rank", "sums_values": False,
                      "bytes_sent_per_rank": [0] * size, "bytes_received_per_rank": [0] * size})
    report = {
        "mesh": list(plan.mesh_shape), "global_shape": list(plan.shape), "src": [repr(p) for p in plan.src],
        "dst": [repr(p) for p in plan.dst], **_orders_report(plan), "ranks": size, "steps": steps,
        "exchange_bytes_total": sum(sent) * itemsize, "exchange_lower_bound_bytes": bound * itemsize,
    }
    if size <= 16 and any(sent):
        matrix = [[0] * size for _ in range(size)]
        for q in range(size):
            for p, box in plan.recvs(q):
                matrix[p][q] += box_size(box) * itemsize
        report["traffic_matrix"] = matrix
    return report


def mesh_plan(global_shape: Sequence[int], src: Any, dst: Any, mesh_shape: Sequence[int], dtype: str = "float32",
              itemsize: int | None = None) -> dict:
    """The plan of a layout change on a mesh, as ``reshard plan --mesh ... --json`` gives it:
    its steps with the bytes each rank sends and receives, the exchange's bytes beside their
    lower bound, and the traffic matrix where the mesh is small. ``src``/``dst``: one placement
    per mesh dim (objects or text like ``"S(0),S(1)"``) or an ``rs.Spec`` by mesh dim number; an
    order other than the mesh's adds ``src_spec``/``dst_spec``. Pure: nothing is started
    (``rs.mesh_plan``)."""
    if itemsize is None and dtype not in ITEMSIZE:
        raise InvalidArgument(f"unknown dtype {dtype!r}; known: {', '.join(ITEMSIZE)}")
    mesh = tuple(check_int("mesh_shape", v) for v in mesh_shape)
    if not mesh or min(mesh) < 1:
        raise InvalidArgument(f"mesh_shape needs at least one dim, each at least 1, got {mesh}")
    shape = check_shape(global_shape)
    check_spec_dims(src, len(shape), "src")
    check_spec_dims(dst, len(shape), "dst")
    if isinstance(src, str):
        src = parse_placements(src, len(mesh))
    if isinstance(dst, str):
        dst = parse_placements(dst, len(mesh))
    report = plan_summary(shape, src, dst, mesh, itemsize if itemsize is not None else ITEMSIZE[dtype])
    report["dtype"] = dtype
    return report
