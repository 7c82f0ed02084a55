"""``reshard bench``: reshard's collectives timed beside the baselines, in the same run.

For every size, every method runs on the same ranks, interleaved (method A, B, C, then A, B,
C again...), so a slow moment of the machine hits all of them alike. Each iteration starts
after a barrier; its time is the slowest rank's; the figure is the median over iterations.
Before timing, each method runs once and its result is checked element by element against
the values the layout says it must hold (the ``#wrong`` column), outside the timed region.

Methods (``--op all_to_all`` / ``redistribute``: Shard(0) -> Shard(1) of a float matrix):

* ``reshard``: the public op with its default cross-rank check; ``reshard-nocheck``: check=False.
* ``raw``: the engine's own all-to-all on data that is already packed (``all_to_all_single``,
  MPI ``Alltoall``), into a preallocated buffer: the engine alone.
* ``dtensor``: PyTorch DTensor's ``redistribute`` doing the same layout change (torch engines).
* ``memcpy``: every rank copying its whole buffer once, all at the same time: the floor.
* ``raw+pack`` (only when asked for): what a user would write by hand for the layout change:
  the pack (one strided copy into a buffer allocated once), then the bare call into a fresh
  result, which for Shard(0) -> Shard(1) needs no unpack.
* ``raw+round`` (only when asked for): ``raw`` after an all-reduce of two int64, the round a
  checked call adds to the exchange (its replay vote). It shows what one more round of a collective costs on
  these cores, apart from anything reshard does.
* ``raw+local`` (``--op moe``, only when asked for): ``raw`` plus the local passes no MoE
  layer can skip, written by hand with preallocated buffers. Before the exchanges, the routed
  rows are gathered in expert order; after them, each token's k results are gathered back and
  summed with its weights. It is what dispatch + combine would cost if reshard added nothing.

``busbw`` uses nccl-tests' factor for all-to-all, all-gather and reduce-scatter: (N-1)/N.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
from typing import Any

import numpy as np

from .check import count_wrong
from .rank import MOE_EXPERTS, MOE_HIDDEN, MOE_TOP_K, OPS, ROUND_INTS, bench_rank
from .report import Row, human, plot, ratios, render, write_json

__all__ = [
    "OPS", "ROUND_INTS", "MOE_HIDDEN", "MOE_EXPERTS", "MOE_TOP_K", "Row", "bench_rank", "count_wrong", "human",
    "method_unavailable", "parse_size",
    "parse_sizes", "plot", "ratios", "render", "run_bench", "write_json",
]


def parse_size(text: str) -> int:
    """Bytes of ``text``: a number with an optional K, M or G (powers of 1024) and B, at least
    a byte and at most this machine's memory (a bigger shard could not be allocated)."""
    given = text.strip()
    text = given.upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(f"{given!r} is not a size (a number of bytes, with K, M or G)") from None
    if not math.isfinite(amount):
        raise ValueError(f"{given!r} is not a finite number of bytes")
    value = int(amount * scale)
    if value < 1:
        raise ValueError(f"{given!r} is less than a byte")
    from ..engines.arena import machine_memory

    memory = machine_memory()
    if memory is not None and value > memory:
        raise ValueError(f"{given!r} is more than this machine's memory ({human(memory)}) for one rank's shard")
    return value


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """'64K..64M' (every ``factor``-fold step), or a list '1M,16M'."""
    if ".." in text:
        lo, hi = (parse_size(t) for t in text.split("..", 1))
        if hi < lo:
            raise ValueError(f"{text!r}: the end is below the start")
        if factor < 2:  # a step of 1 would never reach the end
            raise ValueError(f"the step between sizes must be at least 2, got {factor}")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def method_unavailable(method: str, op: str, engine: str, ranks: int, mesh: tuple | None = None) -> str | None:
    """Why ``method`` is not timed for this op, engine and rank count (None: it is)."""
    if mesh is not None:
        if method not in ("reshard", "reshard-nocheck", "dtensor"):
            return "a mesh run times reshard, reshard-nocheck and dtensor only"
    elif method in ("raw+pack", "raw+round") and op not in ("all_to_all", "redistribute"):
        return f"it is the Shard(0) -> Shard(1) exchange written by hand (--op redistribute or all_to_all), not --op {op}"
    elif method == "raw+local" and op != "moe":
        return "it is an MoE layer's exchanges and local passes written by hand (--op moe)"
    if method == "dtensor":
        if engine == "mpi":
            return "DTensor runs on torch.distributed (--engine gloo), not on MPI"
        if mesh is None and op not in ("all_to_all", "redistribute"):
            return f"DTensor is timed on layout changes (--op redistribute or all_to_all, or --mesh), not --op {op}"
        if mesh is None and ranks < 2:
            return "DTensor's layout change needs at least 2 ranks"
    return None


def run_bench(engine: str, ranks: int, op: str, sizes: list[int], dtype: str, methods: list[str],
              iters: int = 0, warmup: int = 2, timeout: float = 1800.0, show_progress: bool = True,
              numpy_arrays: bool = False, mesh: tuple | None = None, src: str | None = None,
              dst: str | None = None) -> list[Row]:
    from ..launch import spawn

    if op == "moe" and MOE_EXPERTS % ranks:
        raise ValueError(f"--op moe uses {MOE_EXPERTS} experts, so --ranks must divide {MOE_EXPERTS}")
    methods = [m for m in methods if method_unavailable(m, op, engine, ranks, mesh) is None]
    tmp = tempfile.mkdtemp(prefix="reshard-bench-")
    progress_path = os.path.join(tmp, "progress")
    open(progress_path, "w").close()
    config = dict(op=op, sizes=sizes, dtype=dtype, methods=methods, iters=iters, warmup=warmup,
                  progress=progress_path, numpy=numpy_arrays, mesh=mesh, src=src, dst=dst)
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            box["per_rank"] = spawn(bench_rank, ranks, engine=engine, args=(config,), timeout=timeout)
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    try:
        _follow(worker, progress_path, len(sizes), show_progress, f"{op} on {ranks} ranks ({engine})")
    finally:
        worker.join()
        try:
            os.remove(progress_path)
            os.rmdir(tmp)
        except OSError:
            pass
    if "error" in box:
        raise box["error"]
    return _rows(box["per_rank"], ranks, op, dtype)


def _follow(worker: threading.Thread, path: str, total: int, show: bool, label: str) -> None:
    if not show:
        while worker.is_alive():
            worker.join(0.2)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} sizes"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(label, total=total)
        while worker.is_alive():
            worker.join(0.2)
            with open(path) as f:
                bar.update(task, completed=sum(1 for _ in f))


def _rows(per_rank: list[dict], n: int, op: str, dtype: str) -> list[Row]:
    rows: list[Row] = []
    itemsize = np.dtype(dtype).itemsize
    for k, entry in enumerate(per_rank[0]["sizes"]):
        size = entry["size"]
        for method in entry["times"]:
            per_iter = np.max([r["sizes"][k]["times"][method] for r in per_rank], axis=0)
            t = float(statistics.median(per_iter))
            moved = size
            if op == "moe":  # dispatch + combine move the routed rows there and back
                moved = 2 * max(r["sizes"][k]["moe_rows"] for r in per_rank) * MOE_HIDDEN * itemsize
            algbw = moved / t / 1e9
            factor = 1.0 if method == "memcpy" else (n - 1) / n
            extras = [r["sizes"][k]["extra"].get(method, -1) for r in per_rank]
            sent = [r["sizes"][k].get("sent", {}).get(method, -1) for r in per_rank]
            rows.append(Row(size=size, count=entry["count"], dtype=dtype, method=method, time_us=t * 1e6,
                            algbw=algbw, busbw=algbw * factor,
                            wrong=sum(r["sizes"][k]["wrong"].get(method, 0) for r in per_rank),
                            extra_bytes=max(extras), samples=[float(v) for v in per_iter], sent_bytes=max(sent)))
    return rows


