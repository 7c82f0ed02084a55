"""The shared arena's memory over many calls: flat after the first hundred, within twice what
is alive at once.

    python benchmarks/arena_memory.py [--engine gloo|mpi|both] [--ranks 4] [--calls 10000]
                                      [--every 100] [--json FILE]

Each rank makes ``--calls`` calls, drawn at random from S(0) <-> S(1) changes of 1, 4 and 16
MiB per rank (half of them chained: the input is the last result kept), Shard -> Replicate,
Partial -> Shard, all_to_all_v and MoE dispatch + combine, dropping each result as the next
comes (at most two alive: the chain's input and the newest). Every ``--every`` calls it
records its proportional set size (``Pss`` of ``/proc/self/smaps_rollup``) and the arena's
pages (what the system holds for its memory file). Printed: the slowest-growing and the
fastest-growing rank's numbers at call 100 and at the end, the arena's peak pages against the
most bytes its arrays held at once (``peak_live``).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import reshard as rs


def _pss_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def job(comm, engine, calls, every):
    from reshard.engines import arena as arena_mod

    size, rank = comm.size, comm.rank
    rng = np.random.default_rng(1234)  # the same draws on every rank: the calls are collective
    cols = 256 * size

    def as_in(a):
        if engine == "gloo":
            import torch

            return torch.from_numpy(a)
        return a

    inputs = {mib: as_in(np.random.default_rng(rank).standard_normal(((mib << 20) // 4 // cols, cols))
                         .astype(np.float32)) for mib in (1, 4, 16)}
    kept, samples, file_pages = None, [], []
    for k in range(calls):
        kind = rng.integers(7)
        mib = int(rng.choice([1, 4, 16]))
        x = inputs[mib]
        if kind == 0:
            out = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
        elif kind == 1:  # a chain: the last result kept goes back
            if kept is None:
                kept = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
            else:
                kept = rs.redistribute(kept, rs.Shard(1), rs.Shard(0), comm)
                kept = rs.redistribute(kept, rs.Shard(0), rs.Shard(1), comm)
            out = None
        elif kind == 2:
            out = rs.redistribute(inputs[1], rs.Shard(0), rs.Replicate(), comm)
        elif kind == 3:
            out = rs.redistribute(x, rs.Partial("sum"), rs.Shard(0), comm)
        elif kind == 4:
            n = x.shape[0]
            out, _ = rs.all_to_all_v(x, [n // size] * (size - 1) + [n - (n // size) * (size - 1)], comm)
        elif kind == 5:
            ids = np.random.default_rng(k + rank).integers(0, 8, (x.shape[0], 2))
            expert_in, handle = rs.moe.dispatch(x, as_in(ids), 8, comm)
            out = rs.moe.combine(expert_in, handle)
        else:
            kept = None
            out = rs.redistribute(x, rs.Shard(1), rs.Shard(0), comm)
        del out
        if (k + 1) % every == 0:
            where = arena_mod.arena()
            samples.append(_pss_bytes())
            file_pages.append(os.fstat(where.fd).st_blocks * 512 if where is not None else 0)
    where = arena_mod.arena()
    return {"pss": samples, "arena_bytes": file_pages, "peak_live": where.peak_live if where else 0,
            "touched_peak": where.touched_peak if where else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for engine in (("gloo", "mpi") if args.engine == "both" else (args.engine,)):
        per_rank = rs.spawn(job, args.ranks, engine, args=(engine, args.calls, args.every), timeout=3600)
        results.append({"engine": engine, "ranks": per_rank})
        mib = 1 << 20
        print(f"{engine}, {args.ranks} ranks, {args.calls} mixed calls (MiB at call {args.every} -> the end)")
        marks = sorted({0, len(per_rank[0]["pss"]) // 10, len(per_rank[0]["pss"]) // 2, len(per_rank[0]["pss"]) - 1})
        print("  at call " + ", ".join(str((m + 1) * args.every) for m in marks))
        for rank, r in enumerate(per_rank):
            pss, held = r["pss"], r["arena_bytes"]
            print(f"  rank {rank}: PSS " + " ".join(f"{pss[m] / mib:7.1f}" for m in marks)
                  + "; arena " + " ".join(f"{held[m] / mib:7.1f}" for m in marks)
                  + f"; most alive at once {r['peak_live'] / mib:.1f}, the arena's peak / that "
                  f"{max(held) / max(r['peak_live'], 1):.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
