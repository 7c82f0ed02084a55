"""``reshard explain``: Gather, AllGather, ReduceScatter, AllToAll and AllReduce run on the same
row-sharded matrix on real local ranks; every fact shown is measured from what came back.

Values are ``A[i, j] = i * cols + j + K`` with ``K = rows * cols + 1``: every element is unique
and any sum of two or more elements is larger than every single element, so "was this value
summed?" and "which global element is this?" are answered by looking at the value alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import Shard, local_shard
from .plan import describe_region

COLLECTIVES = ("gather", "all_gather", "reduce_scatter", "all_to_all", "all_reduce")


def base_matrix(shape: tuple[int, int]) -> np.ndarray:
    rows, cols = shape
    return np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) + rows * cols + 1


def explain_rank(comm: Any, shape: tuple[int, int]) -> tuple[np.ndarray, dict[str, dict]]:
    """One rank: run every collective on its row block; report outputs, bytes and allocations."""
    from . import ops
    from .errors import ReshardError

    rows = np.ascontiguousarray(local_shard(base_matrix(shape), Shard(0), comm.rank, comm.size))
    calls = {
        "gather": lambda: ops.gather(rows, 0, dst=0),
        "all_gather": lambda: ops.all_gather(rows, 0),
        "reduce_scatter": lambda: ops.reduce_scatter(rows, dim=1),  # sums the row blocks, scatters columns
        "all_to_all": lambda: ops.all_to_all(rows, split_dim=1, concat_dim=0),
        "all_reduce": lambda: ops.all_reduce(rows),
    }
    report: dict[str, dict] = {}
    for name, call in calls.items():
        try:
            out = call()
        except ReshardError as exc:
            report[name] = {"error": str(exc).splitlines()[0]}
            continue
        stats = ops.last_exchange()
        report[name] = {
            "out": out,
            "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received,
            "allocated": stats.allocated_bytes,
        }
    return rows, report


def _single_region(out: np.ndarray, full: np.ndarray) -> tuple | None:
    """The global region whose slice of ``full`` equals ``out`` exactly, if there is one."""
    if out.size == 0:
        return None
    k = full.size + 1
    idx = out.astype(np.int64) - k
    cols = full.shape[1]
    r0, r1, c0, c1 = idx.min() // cols, idx.max() // cols + 1, idx.min() % cols, idx.max() % cols + 1
    region = ((int(r0), int(r1)), (int(c0), int(c1)))
    if np.array_equal(full[r0:r1, c0:c1], out):
        return region
    return None


def analyze(shape: tuple[int, int], ins: list[np.ndarray], reports: list[dict[str, dict]]) -> dict[str, Any]:
    """The measured facts for every collective (JSON-ready)."""
    full = base_matrix(shape)
    n = len(ins)
    singles = set(full.reshape(-1).tolist())
    shard_bytes = max(x.nbytes for x in ins) or 1
    facts: dict[str, Any] = {"shape": list(shape), "ranks": n, "dtype": "float64", "collectives": {}}
    for name in COLLECTIVES:
        per_rank = [rep[name] for rep in reports]
        errors = [p.get("error") for p in per_rank if "error" in p]
        if errors:
            facts["collectives"][name] = {"error": errors[0]}
            continue
        outs = [p["out"] for p in per_rank]
        values = [v for o in outs if o is not None for v in o.reshape(-1).tolist()]
        sums = any(v not in singles for v in values)
        holds = []
        for out in outs:
            if out is None:
                holds.append({"kind": "nothing"})
                continue
            region = _single_region(out, full) if not sums else None
            if region is not None:
                holds.append({"kind": "region", "region": [list(x) for x in region], "text": describe_region(region)})
            elif sums:
                cols = _summed_columns(out, ins)
                text = f"sum of the {n} ranks' blocks, cols {cols[0]}-{cols[1] - 1}" if cols else "sums"
                holds.append({"kind": "sums", "columns": list(cols) if cols else None, "text": text})
            else:
                holds.append({"kind": "rearranged"})
        full_everywhere = all(o is not None and np.array_equal(o, full) for o in outs)
        entry = {
            "sums_values": sums,
            "every_output_element_is_one_input_element": not sums,
            "full_tensor_on_every_rank": full_everywhere,
            "full_tensor_on_some_rank": any(o is not None and np.array_equal(o, full) for o in outs),
            "result_shape_per_rank": [None if o is None else list(o.shape) for o in outs],
            "holds_per_rank": holds,
            "bytes_sent_per_rank": [p["bytes_sent"] for p in per_rank],
            "bytes_received_per_rank": [p["bytes_received"] for p in per_rank],
            "peak_memory_per_rank_in_shards": [round((ins[r].nbytes + per_rank[r]["allocated"]) / shard_bytes, 2) for r in range(n)],
        }
        if name == "all_to_all":
            entry["split_table"] = _measured_split_table(outs, ins, full)
        facts["collectives"][name] = entry
    return facts


def _summed_columns(out: np.ndarray, ins: list[np.ndarray]) -> tuple[int, int] | None:
    """If ``out`` is the elementwise sum of every rank's row block over some columns, which."""
    if len({x.shape for x in ins}) != 1:
        return None
    total = sum(ins[1:], ins[0].copy())
    width = out.shape[1]
    for c0 in range(total.shape[1] - width + 1):
        if np.array_equal(total[:, c0 : c0 + width], out):
            return (c0, c0 + width)
    return None


def _measured_split_table(outs: list[np.ndarray], ins: list[np.ndarray], full: np.ndarray) -> list[dict]:
    """Which global region each rank's piece for rank j held, read off what rank j received."""
    table = []
    lengths = [x.shape[0] for x in ins]
    for dst, out in enumerate(outs):
        start = 0
        for src, length in enumerate(lengths):
            piece = out[start : start + length]
            start += length
            region = _single_region(piece, full)
            if region is not None:
                table.append({"src_rank": src, "dst_rank": dst, "region": [list(x) for x in region], "text": describe_region(region)})
    return sorted(table, key=lambda e: (e["src_rank"], e["dst_rank"]))


def answer(facts: dict[str, Any], collective: str = "all_to_all") -> dict[str, Any]:
    """The three questions a learner asks of a collective, answered from ``facts`` alone (for any collective)."""
    f = facts["collectives"][collective]
    n = facts["ranks"]
    elements = sum(int(np.prod(s)) for s in f["result_shape_per_rank"] if s is not None)
    shapes = sorted({tuple(s) for s in f["result_shape_per_rank"] if s is not None})
    return {
        "adds_values": {"answer": f["sums_values"], "evidence": {"output_elements": elements}},
        "full_tensor_on_every_rank": {
            "answer": f["full_tensor_on_every_rank"],
            "evidence": {"result_shapes": [list(s) for s in shapes], "global_shape": facts["shape"], "ranks": n},
        },
        "cut_rule": f.get("split_table", []),
    }


def run_explain(ranks: int, shape: tuple[int, int], engine: str, timeout: float = 60.0) -> dict[str, Any]:
    from .launch import spawn

    results = spawn(explain_rank, ranks, engine=engine, args=(shape,), timeout=timeout)
    facts = analyze(shape, [r[0] for r in results], [r[1] for r in results])
    facts["engine"] = engine
    facts["answers"] = answer(facts)
    return facts
