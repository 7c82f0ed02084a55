"""Planning without ranks: for (global shape, src, dst, world size) say which collective runs,
who sends which slice to whom, the traffic matrix, bytes per rank and memory per rank.

Pure: imports no engine, and numpy only in the functions that make the tables (each step's
pairs as arrays, ``CollectiveStep.pairs``), so ``reshard plan`` starts fast. The regions are global
``[start, stop)`` per dim; the op layer follows the same rules.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from .layout import (
    Partial,
    Placement,
    Replicate,
    Shard,
    check_int,
    check_spec_dims,
    local_region,
    normalize_dim,
    offsets,
    parse_placement,
    shard_sizes,
)
from .placements import MAX_TENSOR_BYTES

ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}

Region = tuple[tuple[int, int], ...]


def region_numel(region: Region) -> int:
    n = 1
    for start, stop in region:
        n *= max(0, stop - start)
    return n


def intersect(a: Region, b: Region) -> Region:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo = a0 if a0 > b0 else b0
        hi = a1 if a1 < b1 else b1
        out.append((lo, hi if hi > lo else lo))
    return tuple(out)


def leading_trivial(shape: Sequence[int], dim: int) -> bool:
    """True when every dim before ``dim`` has size 1, or the shape holds no element: slices
    along ``dim`` are contiguous runs (an empty one needs no copy)."""
    return 0 in shape or math.prod(shape[:dim]) == 1


@dataclass(frozen=True)
class Transfer:
    """``src`` sends the global ``region`` to ``dst`` (``src == dst``: kept locally, no traffic)."""

    src: int
    dst: int
    region: Region
    nbytes: int


@dataclass(frozen=True)
class CollectiveStep:
    """One collective of a whole-world plan, as ``reshard plan`` reports it (a rank runs the typed
    steps of ``planning.steps`` that the planner makes; this says what moves between every pair).

    ``all_to_all``: cut along ``split_dim``, concatenate along ``concat_dim``. ``all_gather`` and
    ``reduce_scatter``: along ``dim`` (None: the tensor flattened, as ``all_reduce`` runs them),
    reducing with ``op``. ``local``: no traffic; ``action`` is ``slice`` (keep this rank's
    Shard(``dim``) of a replicated tensor), ``to_partial`` (a full tensor as Partial(``op``))
    or ``embed`` (this rank's Shard(``dim``) placed in a tensor of the global shape, the rest
    the identity of ``op``).

    What moves is asked per pair: ``region(s, d)`` is what rank ``s`` sends rank ``d`` (None:
    nothing), so a rank lists its own transfers in O(ranks) (``for_rank``) and nothing at run
    time lists every pair; ``transfers`` lists them all, for small plans and pictures.
    """

    collective: str
    region: Callable[[int, int], Region | None] = field(compare=False, repr=False)
    size: int = 1
    itemsize: int = 1
    sums_values: bool = False
    split_dim: int | None = None
    concat_dim: int | None = None
    dim: int | None = None
    op: str | None = None
    action: str | None = None
    keep_empty: bool = True  # list pairs that move nothing (a rank's own part always is)
    # what ``region`` computes, as per-rank boxes for the tables (``pairs``): (how, a, b) with
    # how "meet" (a[s] ∩ b[d]), "from" (a[s]), "to" (b[d]) or "own" (a[r] ∩ b[r], r to itself)
    boxes: tuple[str, Sequence[Region] | None, Sequence[Region] | None] | None = field(
        default=None, compare=False, repr=False)

    def _transfer(self, s: int, d: int) -> Transfer | None:
        reg = self.region(s, d)
        if reg is None:
            return None
        t = Transfer(s, d, reg, region_numel(reg) * self.itemsize)
        return t if self.keep_empty or t.nbytes or s == d else None

    @functools.cached_property
    def transfers(self) -> tuple[Transfer, ...]:
        """Every pair's transfer, listed once (for reports and pictures: O(ranks^2))."""
        pairs = ((r, r) for r in range(self.size)) if self.collective == "local" else (
            (s, d) for s in range(self.size) for d in range(self.size))
        return tuple(t for t in (self._transfer(s, d) for s, d in pairs) if t is not None)

    def for_rank(self, rank: int) -> tuple[list[Transfer], list[Transfer]]:
        """(what ``rank`` sends, what it receives) in this step, its own part excluded."""
        if self.collective == "local":
            return [], []
        sends = [t for t in (self._transfer(rank, d) for d in range(self.size) if d != rank) if t is not None]
        recvs = [t for t in (self._transfer(s, rank) for s in range(self.size) if s != rank) if t is not None]
        return sends, recvs

    @property
    def participants(self) -> tuple[int, ...]:
        """The ranks that send or receive in this step (all that hold a piece, for ``local``)."""
        table = self.pairs
        return tuple(sorted(set(table.src.tolist()) | set(table.dst.tolist())))

    @functools.cached_property
    def pairs(self) -> PairTable:
        """Every pair's transfer as arrays, in ``transfers``' order: what the tables are made
        from (one numpy expression per step, where ``transfers`` makes an object per pair)."""
        import numpy as np

        how, a, b = self.boxes  # make_plan gives every step its boxes
        n, ndim = self.size, len((a if a is not None else b)[0])
        if how == "own":
            src = dst = np.arange(n, dtype=np.int64)
        else:
            src, dst = (g.ravel() for g in np.meshgrid(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64),
                                                       indexing="ij"))
        box_a = np.array(a, dtype=np.int64).reshape(n, ndim, 2) if a is not None else None
        box_b = np.array(b, dtype=np.int64).reshape(n, ndim, 2) if b is not None else None
        if how == "from":
            lo, hi = box_a[src, :, 0], box_a[src, :, 1]
        elif how == "to":
            lo, hi = box_b[dst, :, 0], box_b[dst, :, 1]
        else:  # "meet" and "own": the intersection, empty ranges kept at their start
            lo = np.maximum(box_a[src, :, 0], box_b[dst, :, 0])
            hi = np.minimum(box_a[src, :, 1], box_b[dst, :, 1])
            hi = np.maximum(hi, lo)
        nbytes = np.prod(np.maximum(hi - lo, 0), axis=1) * self.itemsize
        if not self.keep_empty:
            keep = (nbytes > 0) | (src == dst)
            src, dst, lo, hi, nbytes = src[keep], dst[keep], lo[keep], hi[keep], nbytes[keep]
        return PairTable(src, dst, lo, hi, nbytes)


Step = CollectiveStep  # the name it had; ``planning.steps.Step`` is a rank's typed step, another thing


@dataclass(frozen=True)
class PairTable:
    """A step's transfers as arrays: ``src``, ``dst`` and ``nbytes`` ``[P]`` int64, the regions'
    ``lo`` and ``hi`` ``[P, ndim]`` (global ``[lo, hi)`` per dim)."""

    src: Any
    dst: Any
    lo: Any
    hi: Any
    nbytes: Any

    def moved(self) -> Any:
        """bool ``[P]``: the pairs between two ranks (a rank's own part is no traffic)."""
        return self.src != self.dst


@dataclass
class Plan:
    global_shape: tuple[int, ...]
    src: Placement
    dst: Placement
    size: int
    dtype: str
    collective: str
    steps: list[CollectiveStep] = field(default_factory=list)
    pack_copies: int = 0
    unpack_copies: int = 0
    itemsize_override: int | None = None

    @property
    def itemsize(self) -> int:
        return self.itemsize_override or ITEMSIZE[self.dtype]

    @property
    def transfers(self) -> list[Transfer]:
        return [t for step in self.steps for t in step.transfers]

    @property
    def traffic_matrix(self) -> list[list[int]]:
        """``[i][j]``: bytes rank i sends to rank j; the diagonal is what a rank keeps (no traffic)."""
        import numpy as np

        m = np.zeros((self.size, self.size), dtype=np.int64)
        for step in self.steps:
            table = step.pairs
            np.add.at(m, (table.src, table.dst), table.nbytes)
        return m.tolist()

    def step_bytes(self, step: CollectiveStep) -> tuple[list[int], list[int]]:
        """(bytes sent, bytes received) per rank in one step, own pieces excluded."""
        return self._per_rank([step], "src"), self._per_rank([step], "dst")

    def _per_rank(self, steps: Sequence[CollectiveStep], end: str) -> list[int]:
        """Bytes per rank that leave it (end="src") or arrive at it (end="dst"), own pieces excluded."""
        import numpy as np

        out = np.zeros(self.size, dtype=np.int64)
        for step in steps:
            table = step.pairs
            moved = table.moved()
            np.add.at(out, getattr(table, end)[moved], table.nbytes[moved])  # integers: exact at any size
        return out.tolist()

    @property
    def bytes_sent_per_rank(self) -> list[int]:
        return self._per_rank(self.steps, "src")

    @property
    def bytes_received_per_rank(self) -> list[int]:
        return self._per_rank(self.steps, "dst")

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent_per_rank)

    def local_bytes(self, placement: Placement, rank: int) -> int:
        return region_numel(local_region(self.global_shape, placement, rank, self.size)) * self.itemsize

    def memory_per_rank(self) -> list[dict[str, int]]:
        """Bytes held before, at the peak during, and after, per rank (input + output + buffers)."""
        import numpy as np

        received_all = np.zeros(self.size, dtype=np.int64)  # a rank's own part counted too
        for step in self.steps:
            table = step.pairs
            np.add.at(received_all, table.dst, table.nbytes)
        out = []
        for r in range(self.size):
            before = self.local_bytes(self.src, r)
            after = self.local_bytes(self.dst, r)
            received = int(received_all[r])
            extra = before * self.pack_copies + (received if self.unpack_copies else 0)
            if self.collective in ("reduce_scatter", "all_reduce"):
                extra = before * self.pack_copies + received
            peak = before + (after if self.collective != "none" else 0) + extra
            out.append({"before": before, "peak": peak, "after": after})
        return out


def check_shape(global_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(global_shape, str) or not hasattr(global_shape, "__iter__"):
        raise InvalidArgument(f"global_shape is a sequence of ints, got {global_shape!r}")
    shape = tuple(check_int(f"global_shape[{i}]", s) for i, s in enumerate(global_shape))
    if any(s < 0 for s in shape):
        raise InvalidArgument(f"global_shape {list(shape)} has a negative entry")
    return shape


def _normalize(value: Placement | str, ndim: int, name: str) -> Placement:
    check_spec_dims(value, ndim, name)
    p = parse_placement(value)
    return Shard(normalize_dim(p.dim, ndim, f"{name} Shard dim")) if isinstance(p, Shard) else p


def make_plan(
    global_shape: Sequence[int], src: Placement | str, dst: Placement | str, size: int, dtype: str = "float32",
    itemsize: int | None = None,
) -> Plan:
    """The steps ``redistribute`` runs for a tensor of ``global_shape`` over ``size`` ranks.

    ``itemsize`` gives the bytes per element of a dtype the table here does not name.
    """
    shape = check_shape(global_shape)
    if isinstance(size, (tuple, list)) and len(size) != 1:
        raise InvalidArgument(f"size is a world's number of ranks, got the mesh shape {tuple(size)}: plan a mesh with "
                              "rs.mesh_plan(global_shape, src, dst, mesh_shape)")
    size = check_int("size", size[0] if isinstance(size, (tuple, list)) else size)
    if size < 1:
        raise InvalidArgument(f"size must be >= 1, got {size}")
    if itemsize is None and dtype not in ITEMSIZE:
        raise InvalidArgument(f"unknown dtype {dtype!r}; known: {', '.join(ITEMSIZE)}")
    src_p = _normalize(src, len(shape), "src")
    dst_p = _normalize(dst, len(shape), "dst")
    item = check_int("itemsize", itemsize) if itemsize is not None else ITEMSIZE[dtype]
    if item < 1:
        raise InvalidArgument(f"itemsize is the bytes of one element, at least 1, got {item}")
    if (nbytes := math.prod(shape) * item) > MAX_TENSOR_BYTES:  # the pair tables count bytes in int64
        raise InvalidArgument(f"global_shape {list(shape)} holds {nbytes:.3g} bytes, more than a plan counts (8 EiB)")
    plan = Plan(shape, src_p, dst_p, size, dtype, "none", itemsize_override=itemsize)

    held: dict[tuple[Placement, int], Region] = {}  # each rank's region, made once: a report asks per pair

    def region(p: Placement, r: int) -> Region:
        got = held.get((p, r))
        if got is None:
            got = held[(p, r)] = local_region(shape, p, r, size)
        return got

    def step(collective: str, pair: Callable[[int, int], Region | None], **kw: Any) -> CollectiveStep:
        return CollectiveStep(collective, pair, size, item, **kw)

    def boxes(p: Placement) -> list[Region]:
        return [region(p, r) for r in range(size)]

    if src_p == dst_p or size == 1:  # one rank holds the whole tensor under every layout: nothing runs
        return plan
    if isinstance(src_p, Shard) and isinstance(dst_p, Shard):
        plan.collective = "all_to_all"
        plan.steps.append(step("all_to_all", lambda s, d: intersect(region(src_p, s), region(dst_p, d)),
                               split_dim=dst_p.dim, concat_dim=src_p.dim, keep_empty=False,
                               boxes=("meet", boxes(src_p), boxes(dst_p))))
        in_shape = [b - a for a, b in region(src_p, 0)]
        out_shape = [b - a for a, b in region(dst_p, 0)]
        plan.pack_copies = 0 if leading_trivial(in_shape, dst_p.dim) else 1
        plan.unpack_copies = 0 if leading_trivial(out_shape, src_p.dim) else 1
    elif isinstance(src_p, Shard) and isinstance(dst_p, Replicate):
        plan.collective = "all_gather"
        plan.steps.append(step("all_gather", lambda s, d: region(src_p, s), dim=src_p.dim, boxes=("from", boxes(src_p), None)))
        plan.unpack_copies = 0 if leading_trivial(shape, src_p.dim) else 1
    elif isinstance(src_p, Partial) and isinstance(dst_p, Shard):
        plan.collective = "reduce_scatter"
        plan.steps.append(step("reduce_scatter", lambda s, d: region(dst_p, d), sums_values=True, dim=dst_p.dim,
                               op=src_p.op, boxes=("to", None, boxes(dst_p))))
        plan.pack_copies = 0 if leading_trivial(shape, dst_p.dim) else 1
    elif isinstance(src_p, Partial):
        plan.collective = "all_reduce"
        total = region_numel(tuple((0, s) for s in shape))
        sizes = shard_sizes(total, size)
        starts = offsets(sizes)

        def piece(r: int) -> Region:
            return ((starts[r], starts[r] + sizes[r]),)

        pieces = [piece(r) for r in range(size)]
        plan.steps.append(step("reduce_scatter", lambda s, d: piece(d), sums_values=True, op=src_p.op,
                               boxes=("to", None, pieces)))
        plan.steps.append(step("all_gather", lambda s, d: piece(s), boxes=("from", pieces, None)))
        if isinstance(dst_p, Partial):  # reduced, then held again as a partial sum of dst's op
            whole = tuple((0, n) for n in shape)
            plan.steps.append(step("local", lambda s, d: whole, action="to_partial", op=dst_p.op,
                                   boxes=("own", [whole] * size, [whole] * size)))
    else:  # Replicate -> Shard / Partial, Shard -> Partial: each rank keeps what it needs
        plan.collective = "local"

        def keep(s: int, d: int) -> Region:
            return intersect(region(src_p, s), region(dst_p, s))

        own = ("own", boxes(src_p), boxes(dst_p))
        if isinstance(dst_p, Shard):
            plan.steps.append(step("local", keep, action="slice", dim=dst_p.dim, boxes=own))
        elif isinstance(src_p, Replicate):
            plan.steps.append(step("local", keep, action="to_partial", op=dst_p.op, boxes=own))
        else:
            plan.steps.append(step("local", keep, action="embed", dim=src_p.dim, op=dst_p.op, boxes=own))
    return plan


REGION_WORDS = {  # (plural, singular) per axis of a matrix; a 1-D region; an empty range
    "en": {"rows": ("rows", "row"), "cols": ("cols", "col"), "elements": ("elements", "element"), "none": "none",
           "dim": "dim"},
    "ko": {"rows": ("행", "행"), "cols": ("열", "열"), "elements": ("원소", "원소"), "none": "없음", "dim": "차원"},
}


def describe_region(region: Region, lang: str = "en") -> str:
    """A region in words: 'rows 0-5, cols 0-1' (inclusive) for 2-D, 'dim 2 3-4' beyond."""
    words = REGION_WORDS.get(lang, REGION_WORDS["en"])
    if len(region) == 2:
        names = [words["rows"], words["cols"]]
    elif len(region) == 1:
        names = [words["elements"]]
    else:
        names = [(f"{words['dim']} {d}", f"{words['dim']} {d}") for d in range(len(region))]
    parts = []
    for (plural, single), (a, b) in zip(names, region):
        if b - a == 1:
            parts.append(f"{single} {a}")
        else:
            parts.append(f"{plural} {a}-{b - 1}" if b > a else f"{plural} {words['none']}")
    return ", ".join(parts)


def summarize_matrix(matrix: list[list[int]], limit: int = 8) -> dict:
    """A traffic matrix as it is when small, else its shape of non-zeros and min/max per entry."""
    n = len(matrix)
    off = [matrix[i][j] for i in range(n) for j in range(n) if i != j]
    nonzero = [v for v in off if v]
    summary = {
        "ranks": n,
        "nonzero_pairs": len(nonzero),
        "min_pair_bytes": min(nonzero) if nonzero else 0,
        "max_pair_bytes": max(nonzero) if nonzero else 0,
    }
    if n <= limit:
        summary["matrix"] = matrix
    return summary


SPLIT_TABLE_ROWS = 4096  # the transfers ``reshard plan --json`` lists; past them it says the table is cut


def plan_report(plan: Plan) -> dict:
    """Everything ``reshard plan --json`` prints."""
    split_table, rows = [], 0
    for step in plan.steps:
        table = step.pairs
        rows += len(table.src)
        room = SPLIT_TABLE_ROWS - len(split_table)
        bounds = zip(table.lo[:room].tolist(), table.hi[:room].tolist())
        split_table += [{"src_rank": s, "dst_rank": d, "region": [[a, b] for a, b in zip(lo, hi)], "bytes": nbytes,
                         "step": step.collective}
                        for s, d, (lo, hi), nbytes in zip(table.src[:room].tolist(), table.dst[:room].tolist(), bounds,
                                                          table.nbytes[:room].tolist())]
    return {
        "global_shape": list(plan.global_shape),
        "dtype": plan.dtype,
        "ranks": plan.size,
        "src": repr(plan.src),
        "dst": repr(plan.dst),
        "collective": plan.collective,
        "steps": [_step_report(plan, step) for step in plan.steps],
        "sums_values": any(s.sums_values for s in plan.steps),
        "pack_copies": plan.pack_copies,
        "unpack_copies": plan.unpack_copies,
        "bytes_sent_per_rank": plan.bytes_sent_per_rank,
        "bytes_received_per_rank": plan.bytes_received_per_rank,
        "total_bytes": plan.total_bytes,
        "memory_per_rank": plan.memory_per_rank(),
        "traffic_matrix": summarize_matrix(plan.traffic_matrix, limit=16),
        "split_table": split_table,
        "split_table_truncated": rows > SPLIT_TABLE_ROWS,
    }


def report_json(report: dict) -> str:
    """``json.dumps(report, indent=2)``, character for character, with the split table's rows
    written from one template each (json's indented encoder, written in Python, took most of
    ``reshard plan --json``'s time on thousands of rows)."""
    import json

    rows = report.get("split_table")
    if not rows:
        return json.dumps(report, indent=2)
    marker = "\x00split table\x00"
    text = json.dumps({**report, "split_table": marker}, indent=2)
    body = ",\n".join(_row_json(row) for row in rows)
    return text.replace(json.dumps(marker), "[\n" + body + "\n  ]", 1)


def _row_json(row: dict) -> str:
    import json

    region = ",\n".join(f"        [\n          {a},\n          {b}\n        ]" for a, b in row["region"])
    region = f"[\n{region}\n      ]" if row["region"] else "[]"
    return (f'    {{\n      "src_rank": {row["src_rank"]},\n      "dst_rank": {row["dst_rank"]},\n      "region": {region},\n'
            f'      "bytes": {row["bytes"]},\n      "step": {json.dumps(row["step"])}\n    }}')


def _step_report(plan: Plan, step: CollectiveStep) -> dict:
    sent, received = plan.step_bytes(step)
    return {
        "collective": step.collective,
        "participants": len(step.participants),
        "sums_values": step.sums_values,
        "bytes_sent_per_rank": sent,
        "bytes_received_per_rank": received,
    }


def estimate_seconds(plan: Plan, alpha: float, beta: float) -> float:
    """Alpha-beta model: per step, the busiest rank pays alpha per peer it talks to plus beta
    per byte it sends or receives (whichever is larger); steps add up."""
    import numpy as np

    total = 0.0
    for step in plan.steps:
        sent, received = plan.step_bytes(step)
        table = step.pairs
        talks = table.moved() & (table.nbytes > 0)
        linked = np.zeros((plan.size, plan.size), dtype=bool)
        linked[table.src[talks], table.dst[talks]] = True
        peers = (linked | linked.T).sum(axis=1).tolist()  # a peer counted once, whichever way bytes go
        total += max(alpha * peers[r] + beta * max(sent[r], received[r]) for r in range(plan.size))
    return total
