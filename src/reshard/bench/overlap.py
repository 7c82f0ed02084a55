"""What a started call buys: compute done while the bytes travel.

``overlap_job(comm, ...)`` runs on every rank (local ranks from ``reshard bench --overlap``, or
torchrun's ranks on the two-host test bed of ``benchmarks/overlap.py``) and times, each as the
slowest rank's seconds, median of ``repeats`` interleaved repetitions:

* an ``all_to_all`` of ``nbytes`` per rank and a matrix multiply sized to take about as long as
  the exchange: reshard's blocking call then the multiply; reshard's started call
  (``async_op=True``), the multiply, then ``wait()``; torch's own
  ``all_to_all_single(async_op=True)`` the same way (the bare engine beside it);
* a MoE layer step through ``rs.moe.pipeline`` (``nbytes`` of ``hidden`` float32 rows per rank,
  top-2 of 8 experts) whose experts are sized so that they compute about as long as the layer's
  exchanges take (``moe_layer_job``), with 1 part and each of ``chunk_counts``; the hidden
  fraction of each is the time saved over one part divided by the smaller of exchange and
  compute (1 - 1/k at best with k equal parts); and one step's timeline.
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


def overlap_job(comm: Any, nbytes: int = 16 << 20, repeats: int = 3, chunk_counts: tuple[int, ...] = (2, 4, 8),
                hidden: int = 1024, moe: bool = True) -> dict[str, Any]:
    """The timings above; the MoE layer's tokens per rank: ``nbytes`` of ``hidden`` float32 rows."""
    import torch

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
    for fn in jobs.values():  # warm: plans made, buffers touched
        fn()
    samples: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(repeats):
        for name, fn in jobs.items():
            samples[name].append(_timed(comm, fn))
    result = {"seconds": {k: statistics.median(v) for k, v in samples.items()}, "samples": samples,
              "multiplies": count, "bytes_per_rank": x.numel() * 4, "ranks": n, "repeats": repeats}
    if moe:
        result["moe"] = moe_layer_job(comm, tokens, hidden, repeats, chunk_counts)
    return result


def _layer_inputs(comm: Any, tokens: int, hidden: int) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(comm.rank)
    tok = torch.randn(tokens, hidden, generator=gen)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(tokens)])
    return tok, ids, torch.full((tokens, 2), 0.5)


def moe_layer_job(comm: Any, tokens: int, hidden: int = 1024, repeats: int = 3, chunk_counts: tuple[int, ...] = (2, 4, 8),
                  timeline_chunks: int = 4) -> dict[str, Any]:
    """A MoE layer (``tokens`` rows of ``hidden`` float32 per rank, top-2 of 8 experts) whose
    experts cost about what its exchanges cost, sized here from measurements alone: the
    exchanges of a one-part step (dispatch and combine, experts that compute nothing) against
    one expert pass (a ``hidden x hidden`` multiply) over the rows a rank receives; each expert is
    that many multiplies deep. Then the layer with 1 and each of ``chunk_counts`` parts, interleaved,
    and one step of ``timeline_chunks`` parts with its timeline (every rank's, from rank 0)."""
    import torch

    from .. import moe as rs_moe
    from .. import ops

    n = comm.size
    tok, ids, weights = _layer_inputs(comm, tokens, hidden)
    per_rank = 8 // n
    gen = torch.Generator().manual_seed(100 + comm.rank)
    mats = [torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5 for _ in range(per_rank)]
    same = [lambda rows: rows] * per_rank

    def layer(experts: list, parts: int, timeline: list | None = None) -> Any:
        return rs_moe.pipeline(tok, ids, experts, weights, chunks=parts, comm=comm, timeline=timeline)

    layer(same, 1)
    exchange = statistics.median(_timed(comm, lambda: layer(same, 1)) for _ in range(3))
    inputs, handle = rs_moe.dispatch(tok, ids, 8, comm=comm)
    blocks = list(torch.split(inputs, handle.tokens_per_expert))
    rs_moe.combine(inputs, handle, weights)

    def experts_of(depth: int) -> list:
        def expert(rows: Any, m: Any) -> Any:
            for _ in range(depth):
                rows = rows @ m
            return rows

        return [lambda rows, m=m: expert(rows, m) for m in mats]

    def compute(depth: int) -> float:
        run = experts_of(depth)
        return statistics.median(_timed(comm, lambda: [e(b) for e, b in zip(run, blocks)]) for _ in range(3))

    one_pass = compute(1)
    depth = max(1, round(exchange / one_pass))
    computed = compute(depth)
    if not 0.8 <= computed / exchange <= 1.25:  # the passes did not add up linearly: once more, from this depth
        depth = max(1, round(depth * exchange / computed))
        computed = compute(depth)
    experts = experts_of(depth)
    counts = (1, *chunk_counts)
    for parts in counts:
        layer(experts, parts)  # warm: plans made, the pipeline's communicator too
    samples: dict[int, list[float]] = {parts: [] for parts in counts}
    for _ in range(repeats):
        for parts in counts:
            samples[parts].append(_timed(comm, lambda parts=parts: layer(experts, parts)))
    comm.barrier()
    records: list = []
    start = time.perf_counter()
    layer(experts, timeline_chunks, records)
    kinds = ("dispatch", "experts", "combine")
    mine = np.array([[kinds.index(what), part, a - start, b - start] for what, part, a, b in sorted(records)],
                    dtype=np.float64)
    everyone = ops.all_gather(mine[None], 0, comm=comm, check=False)
    seconds = {parts: statistics.median(v) for parts, v in samples.items()}
    smaller = min(exchange, computed)
    return {"tokens": tokens, "hidden": hidden, "exchange_s": exchange, "one_pass_s": one_pass, "depth": depth,
            "compute_s": computed, "seconds": {str(k): v for k, v in seconds.items()},
            "samples": {str(k): v for k, v in samples.items()},
            "speedup": {str(k): seconds[1] / seconds[k] for k in chunk_counts},
            "hidden_fraction": {str(k): (seconds[1] - seconds[k]) / smaller for k in chunk_counts},
            "timeline": {"chunks": timeline_chunks, "kinds": list(kinds), "ranks": np.asarray(everyone).tolist()}}


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
    if "moe" in result:
        lines += ["", moe_layer_table(result["moe"], result["repeats"])]
    return "\n".join(lines)


def moe_layer_table(moe: dict[str, Any], repeats: int) -> str:
    """The MoE layer's sizing, its times per part count (every run), speed-ups and hidden fractions."""
    ratio = moe["compute_s"] / moe["exchange_s"]
    lines = [f"MoE layer: {moe['tokens']:,} tokens of {moe['hidden']} float32 per rank, top-2 of 8 experts. Sized here: "
             f"the exchanges of one part take {moe['exchange_s']:.3f} s, one expert pass over a rank's rows "
             f"{moe['one_pass_s']:.3f} s, so each expert is {moe['depth']} multiplies deep and computes "
             f"{moe['compute_s']:.3f} s ({ratio:.2f}x the exchanges)", "",
             f"| parts | seconds, median of {repeats} | every run | speed-up over 1 part | hidden fraction (ideal 1 - 1/k) |",
             "|---|---|---|---|---|"]
    for parts, t in moe["seconds"].items():
        runs = ", ".join(f"{v:.3f}" for v in moe["samples"][parts])
        if parts == "1":
            lines.append(f"| 1 | {t:.3f} | {runs} | | |")
        else:
            ideal = 1 - 1 / int(parts)
            lines.append(f"| {parts} | {t:.3f} | {runs} | {moe['speedup'][parts]:.2f}x | "
                         f"{moe['hidden_fraction'][parts]:.2f} ({ideal:.2f}) |")
    return "\n".join(lines)


def write_timeline(path: str, moe: dict[str, Any], where: str) -> None:
    """The timeline of ``moe_layer_job``'s step as a PNG."""
    from ..viz.timeline import draw_timeline

    tl = moe["timeline"]
    draw_timeline(path, tl["ranks"], tl["kinds"],
                  f"One MoE layer step in {tl['chunks']} parts on {where}\n{moe['tokens']:,} tokens of "
                  f"{moe['hidden']} float32 per rank, top-2 of 8 experts, each {moe['depth']} multiplies deep")


def moe_phases_job(comm: Any, tokens: int, hidden: int = 1024, repeats: int = 3) -> dict[str, Any]:
    """Where the time of a MoE layer's exchanges goes: dispatch then combine (experts that compute
    nothing) on this rank's main thread, ``repeats`` times, each with every phase recorded
    (``reshard.execution.phases``): the checks, the small exchanges, each exchange of rows, the
    packs, joins and sums, the waits for rows on their way across, and on the thread of the
    exchange across the hosts, each message from posted to done. Every rank's spans, on rank 0."""
    import json

    from .. import moe as rs_moe
    from ..execution import phases

    tok, ids, weights = _layer_inputs(comm, tokens, hidden)
    inputs, handle = rs_moe.dispatch(tok, ids, 8, comm=comm)  # warm: plans, buffers, the host mesh
    rs_moe.combine(inputs, handle, weights)
    runs = []
    for _ in range(repeats):
        comm.barrier()
        with phases.listening() as spans:
            start = time.perf_counter()
            inputs, handle = rs_moe.dispatch(tok, ids, 8, comm=comm)
            rs_moe.combine(inputs, handle, weights)
            end = time.perf_counter()
        runs.append({"start": start, "end": end, "spans": spans, "algorithm": handle.algorithm})
    mine = np.frombuffer(json.dumps(runs).encode(), dtype=np.uint8)  # JSON: nothing unpickled
    sizes = comm.primitives.allgather_bytes(np.array([mine.size], dtype=np.int64).view(np.uint8), "phases (sizes)")
    longest = int(sizes.view(np.int64).max())
    padded = np.zeros(longest, dtype=np.uint8)
    padded[: mine.size] = mine
    everyone = comm.primitives.allgather_bytes(padded, "phases")
    lengths = sizes.view(np.int64).reshape(-1)
    return {"tokens": tokens, "hidden": hidden, "hosts": list(comm.hosts),
            "ranks": [json.loads(bytes(everyone[r][: int(lengths[r])]).decode()) for r in range(comm.size)]}


def phase_table(result: dict[str, Any], link_bytes_per_s: float | None = None) -> str:
    """Per rank, the median run's phases on the main thread (each span not inside another, added
    up against the measured total), and the messages between hosts against the link's rate: a
    host's ranks send theirs at once, so a message's share is the bytes its host sends that way
    in that exchange over the rate."""
    lines = []
    medians = [sorted(runs, key=lambda u: u["end"] - u["start"])[len(runs) // 2] for runs in result["ranks"]]
    hosts = result.get("hosts", list(range(len(medians))))
    host_bytes: dict[tuple[int, str], int] = {}  # (host, exchange) -> bytes its ranks send across
    for r, run in enumerate(medians):
        for name, thread, _, _, nbytes in run["spans"]:
            if name.startswith("message to") and thread != "MainThread":
                host_bytes[hosts[r], thread] = host_bytes.get((hosts[r], thread), 0) + nbytes
    for r, run in enumerate(medians):
        total = run["end"] - run["start"]
        main = sorted((s for s in run["spans"] if s[1] == "MainThread"), key=lambda s: (s[2], -s[3]))
        top, reach = [], -1.0
        for span in main:  # the spans not inside another: they do not overlap
            if span[3] > reach:
                top.append(span)
                reach = span[3]
        by_name: dict[str, float] = {}
        for name, _, a, b, _ in top:
            by_name[name] = by_name.get(name, 0.0) + (b - a)
        accounted = sum(by_name.values())
        lines += ["", f"rank {r}: dispatch + combine ({run['algorithm']}) took {total:.3f} s; the phases on its main thread "
                  f"add up to {accounted:.3f} s ({accounted / total:.0%})", "", "| phase (main thread) | seconds |", "|---|---|"]
        lines += [f"| {name} | {t:.3f} |" for name, t in sorted(by_name.items(), key=lambda kv: -kv[1])]
        wire = [s for s in run["spans"] if s[0].startswith("message to") and s[4] > 0 and s[1] != "MainThread"]
        if wire:
            lines += ["", "| message to the other host (its own thread) | bytes | seconds posted -> done |"
                      + (" its host's bytes that way at the link's rate |" if link_bytes_per_s else ""),
                      "|---|---|---|" + ("---|" if link_bytes_per_s else "")]
            for name, thread, a, b, nbytes in wire:
                rate = f" {host_bytes[hosts[r], thread] / link_bytes_per_s:.3f} |" if link_bytes_per_s else ""
                lines.append(f"| {thread.removeprefix('reshard ')}: {name} | {nbytes:,} | {b - a:.3f} |{rate}")
    return "\n".join(lines)
