"""What a started call buys: compute done while the bytes travel.

``overlap_job(comm, ...)`` runs on every rank (local ranks from ``reshard bench --overlap``, or
torchrun's ranks on the two-host test bed of ``benchmarks/overlap.py``) and times, each as the
slowest rank's seconds, median of ``repeats`` interleaved repetitions:

* an ``all_to_all`` of ``nbytes`` per rank and a matrix multiply sized to take about as long as
  the exchange: reshard's blocking call then the multiply; reshard's started call
  (``async_op=True``), the multiply, then ``wait()``; torch's own
  ``all_to_all_single(async_op=True)`` the same way (the bare engine beside it);
* a MoE layer step through ``rs.moe.pipeline`` (``nbytes`` of ``hidden`` float32 rows per rank,
  top-2 of 8 experts, each expert one ``hidden x hidden`` matrix multiply) with ``chunks=1``
  and ``chunks=chunks``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _slowest(comm: Any, seconds: float) -> float:
    from .. import ops

    return float(ops.all_reduce(np.array([seconds]), op="max", comm=comm, check=False)[0])


def _timed(comm: Any, fn: Callable[[], Any]) -> float:
    comm.barrier()
    start = time.perf_counter()
    fn()
    return _slowest(comm, time.perf_counter() - start)


def overlap_job(comm: Any, nbytes: int = 16 << 20, repeats: int = 3, chunks: int = 4, hidden: int = 1024,
                moe: bool = True) -> dict[str, Any]:
    """The timings above; the MoE layer's tokens per rank: ``nbytes`` of ``hidden`` float32 rows."""
    import torch

    from .. import moe as rs_moe
    from .. import ops

    n = comm.size
    tokens = max(8, nbytes // 4 // hidden)
    rows = max(n, nbytes // 4 // 1024 // n * n)
    x = torch.randn(rows, 1024)
    received = torch.empty_like(x)

    def exchange() -> Any:
        return ops.all_to_all(x, 0, 0, comm=comm)

    # the multiply: as many 1024 x 1024 products as take about the exchange's time, all ranks at once
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    exchange()
    transfer = statistics.median(_timed(comm, exchange) for _ in range(3))
    one = statistics.median(_timed(comm, lambda: torch.mm(a, b)) for _ in range(5))
    count = max(1, round(transfer / one))

    def multiply() -> None:
        for _ in range(count):
            torch.mm(a, b)

    def blocking() -> None:
        exchange()
        multiply()

    def started() -> None:
        handle = ops.all_to_all(x, 0, 0, comm=comm, async_op=True)
        multiply()
        handle.wait()

    def torch_started() -> None:
        import torch.distributed as dist

        work = dist.all_to_all_single(received, x, group=comm.group, async_op=True)
        multiply()
        work.wait()

    jobs: dict[str, Callable[[], Any]] = {
        "all_to_all alone": exchange, "multiply alone": multiply,
        "reshard all_to_all, then multiply": blocking, "reshard all_to_all started, multiply, wait": started,
    }
    if comm.engine != "mpi":  # the bare engine's own started call
        jobs["torch all_to_all_single started, multiply, wait"] = torch_started
    if moe:
        experts_per_rank = 8 // n
        gen = torch.Generator().manual_seed(comm.rank)
        tok = torch.randn(tokens, hidden, generator=gen)
        ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(tokens)])
        weights = torch.full((tokens, 2), 0.5)
        mats = [torch.randn(hidden, hidden, generator=gen) for _ in range(experts_per_rank)]
        experts = [lambda rows, m=m: rows @ m for m in mats]
        # the rows an expert gets on average: 2 slots of every rank's tokens, spread over 8 experts
        blocks = [torch.randn(tokens * 2 * n // 8, hidden, generator=gen) for _ in mats]
        jobs["MoE experts alone"] = lambda: [b @ m for b, m in zip(blocks, mats)]
        same = [lambda rows: rows] * experts_per_rank
        jobs["MoE layer, experts that compute nothing"] = lambda: rs_moe.pipeline(tok, ids, same, weights, chunks=1,
                                                                                 comm=comm)
        jobs["MoE layer, chunks=1"] = lambda: rs_moe.pipeline(tok, ids, experts, weights, chunks=1, comm=comm)
        jobs[f"MoE layer, chunks={chunks}"] = lambda: rs_moe.pipeline(tok, ids, experts, weights, chunks=chunks,
                                                                      comm=comm)
    for fn in jobs.values():  # warm: plans made, buffers touched
        fn()
    samples: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(repeats):
        for name, fn in jobs.items():
            samples[name].append(_timed(comm, fn))
    return {"seconds": {k: statistics.median(v) for k, v in samples.items()}, "samples": samples,
            "multiplies": count, "bytes_per_rank": x.numel() * 4, "ranks": n, "repeats": repeats,
            "tokens": tokens, "hidden": hidden, "chunks": chunks}


def overlap_table(result: dict[str, Any]) -> str:
    """The measured times and the two speed-ups, as a Markdown table."""
    s = result["seconds"]
    lines = [f"{result['ranks']} {result.get('engine', 'gloo')} ranks, all_to_all of {result['bytes_per_rank'] / 2**20:.0f} MiB per rank, "
             f"the multiply {result['multiplies']} products of 1024 x 1024; median of {result['repeats']} "
             "interleaved repetitions, the slowest rank's time", "", "| what | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in s.items()]
    lines.append("")
    ratio = s["reshard all_to_all, then multiply"] / s["reshard all_to_all started, multiply, wait"]
    lines.append(f"started all_to_all: {ratio:.2f}x faster than the blocking call and the multiply one after the other")
    key = f"MoE layer, chunks={result['chunks']}"
    if key in s:
        lines.append(f"MoE layer: chunks={result['chunks']} {s['MoE layer, chunks=1'] / s[key]:.2f}x faster than chunks=1")
    return "\n".join(lines)
