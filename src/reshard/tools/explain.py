"""``reshard explain``: Gather, AllGather, ReduceScatter, AllToAll and AllReduce run on real
local ranks; every fact shown is measured from what came back. The movement collectives start
from the row-sharded matrix A; the reduce collectives from Partial inputs, as gradients are:
every rank holds a full-size partial sum ``A + r * K``, and the tensor they stand for is the sum.

Values are ``A[i, j] = i * cols + j + K`` with ``K = rows * cols + 1``: every element is unique
and any sum of two or more elements is larger than every single element, so "was this value
summed?" and "which global element is this?" are answered by looking at the value alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..planning.layout import Shard, local_shard
from ..planning.plan import describe_region

COLLECTIVES = ("gather", "all_gather", "reduce_scatter", "all_to_all", "all_reduce")
DTYPES = ("float32", "float64", "float16", "int32", "int64")
DEFAULT_DTYPE = "float32"


def base_matrix(shape: tuple[int, int], dtype: str = DEFAULT_DTYPE) -> np.ndarray:
    rows, cols = shape
    return (np.arange(rows * cols, dtype=np.int64).reshape(rows, cols) + rows * cols + 1).astype(dtype)


def partial_input(shape: tuple[int, int], rank: int, dtype: str = DEFAULT_DTYPE) -> np.ndarray:
    """This rank's full-size partial sum: A shifted by a multiple of K, distinct per rank."""
    full = base_matrix(shape, "int64")
    return (full + rank * (full.size + 1)).astype(dtype)


def check_exact(shape: tuple[int, int], ranks: int, dtype: str) -> None:
    """``InvalidArgument`` unless ``dtype`` holds every value and every sum explain makes exactly
    (the values name the elements they came from, so none may round)."""
    size = shape[0] * shape[1]
    largest = ranks * 2 * size + (size + 1) * ranks * (ranks - 1) // 2  # the reduce collectives' largest sum
    kind = np.dtype(dtype)
    exact = (2 ** (np.finfo(kind).nmant + 1) if kind.kind == "f" else np.iinfo(kind).max)
    if largest > exact:
        raise InvalidArgument(
            f"explain: {dtype} cannot hold the values of A[{shape[0]} x {shape[1]}] summed over {ranks} ranks "
            f"exactly (the largest is {largest}, above {exact}); pick a wider --dtype")


def explain_rank(comm: Any, shape: tuple[int, int], dtype: str = DEFAULT_DTYPE) -> tuple[np.ndarray, np.ndarray, dict[str, dict]]:
    """One rank: run every collective (the movement ones on its row block, the reduce ones on
    its partial sum); report outputs, bytes and allocations."""
    from .. import ops
    from ..errors import ReshardError

    rows = np.ascontiguousarray(local_shard(base_matrix(shape, dtype), Shard(0), comm.rank, comm.size))
    partial = partial_input(shape, comm.rank, dtype)
    calls = {
        "gather": lambda: ops.gather(rows, 0, dst=0),
        "all_gather": lambda: ops.all_gather(rows, 0),
        "reduce_scatter": lambda: ops.reduce_scatter(partial, dim=1),  # the sum, scattered by columns
        "all_to_all": lambda: ops.all_to_all(rows, split_dim=1, concat_dim=0),
        "all_reduce": lambda: ops.all_reduce(partial),
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
    return rows, partial, report


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


def analyze(
    shape: tuple[int, int], rows_in: list[np.ndarray], partial_in: list[np.ndarray], reports: list[dict[str, dict]]
) -> dict[str, Any]:
    """The measured facts for every collective (JSON-ready)."""
    n = len(rows_in)
    dtype = rows_in[0].dtype
    shard_bytes = max(x.nbytes for x in rows_in) or 1
    facts: dict[str, Any] = {"shape": list(shape), "ranks": n, "dtype": dtype.name, "itemsize": dtype.itemsize,
                             "collectives": {},
                             "inputs": {"gather": "rows", "all_gather": "rows", "all_to_all": "rows",
                                        "reduce_scatter": "partial", "all_reduce": "partial"}}
    for name in COLLECTIVES:
        reduces = name in ("reduce_scatter", "all_reduce")
        ins = partial_in if reduces else rows_in
        # the tensor the inputs stand for: A, or the sum of the partial sums
        full = sum(partial_in[1:], partial_in[0].copy()) if reduces else base_matrix(shape, dtype.name)
        singles = set(v for x in ins for v in x.reshape(-1).tolist())
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
                holds.append({"kind": "sums", "columns": list(cols) if cols else None, "ranks": n})
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
            "input": "a full-size partial sum on every rank" if reduces else "the row block of A",
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
            "evidence": {"result_shapes": [list(s) for s in shapes], "global_shape": facts["shape"], "ranks": n,
                         "result_shape_per_rank": f["result_shape_per_rank"]},
        },
        "cut_rule": f.get("split_table", []),
    }


def run_explain(ranks: int, shape: tuple[int, int], engine: str, timeout: float = 60.0,
                dtype: str = DEFAULT_DTYPE) -> dict[str, Any]:
    from ..launch import spawn

    check_exact(shape, ranks, dtype)
    results = spawn(explain_rank, ranks, engine=engine, args=(shape, dtype), timeout=timeout)
    facts = analyze(shape, [r[0] for r in results], [r[1] for r in results], [r[2] for r in results])
    facts["engine"] = engine
    facts["answers"] = answer(facts)
    return facts
