"""MoE dispatch + combine with the tokens in the shared arena, against the engine's own path.

    python benchmarks/arena_moe.py [--engine gloo|mpi|both] [--ranks 4] [--mib 16]
                                   [--experts 8] [--top-k 2] [--runs 5] [--calls 5] [--json FILE]

Per rank, ``--mib`` MiB of float32 tokens ``[T, 1024]`` made by ``rs.empty``, each routed to
``--top-k`` of ``--experts`` experts (random, the same every call), check on; identity experts.
Two forms interleaved in each run: ``arena`` (the default: rows read in place) and ``engine
path`` (the same calls with the arena turned off for them). Each run keeps the median of each
form's calls on the slowest rank; every run is shown, then the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from many_tensors import interleaved  # the same interleaved timing (the script's folder is on the path)

import reshard as rs


def job(comm, engine, mib, experts, top_k, runs, calls):
    from reshard.execution.arena_reads import turned_off

    hidden = 1024
    tokens = (mib << 20) // 4 // hidden
    rng = np.random.default_rng(comm.rank)
    x = rs.empty((tokens, hidden), np.float32)
    x[...] = rng.standard_normal((tokens, hidden))
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    if engine == "gloo":
        import torch

        x, ids, weights = torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(weights)

    def step():
        expert_in, handle = rs.moe.dispatch(x, ids, experts, comm)
        return rs.moe.combine(expert_in, handle, weights)

    def engine_path():
        with turned_off():
            return step()

    assert np.array_equal(np.asarray(step()), np.asarray(engine_path())), "the arena's result differs"
    return interleaved({"arena": step, "engine path": engine_path}, runs, calls, before=comm.barrier)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for engine in (("gloo", "mpi") if args.engine == "both" else (args.engine,)):
        per_rank = rs.spawn(job, args.ranks, engine, args=(engine, args.mib, args.experts, args.top_k, args.runs,
                                                           args.calls), timeout=1800)
        slowest = {name: [max(r[name][k] for r in per_rank) for k in range(args.runs)] for name in per_rank[0]}
        med = {name: statistics.median(v) for name, v in slowest.items()}
        res = {"engine": engine, "runs_s": slowest, "median_s": med, "speedup": med["engine path"] / med["arena"]}
        results.append(res)
        print(f"{engine}, {args.ranks} ranks, {args.mib} MiB of tokens per rank, top-{args.top_k} of {args.experts} "
              "experts, dispatch + combine, check on (slowest rank's median of each run, ms)")
        for name, values in slowest.items():
            print(f"  {name:12s}" + " ".join(f"{v * 1e3:8.2f}" for v in values) + f"   median {med[name] * 1e3:8.2f}")
        print(f"  engine path / arena {res['speedup']:.2f} (target >= 1.3 on gloo, 1.15 on MPI)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
