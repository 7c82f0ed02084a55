"""Layout changes of narrow tensors, whose pieces are short runs of bytes, against the copy floor.

    python benchmarks/short_runs.py [--engine gloo|mpi|both] [--ranks 4] [--mib 4]
                                    [--runs-bytes 8,16,32,64] [--runs 5] [--calls 10] [--json FILE]

Per rank, a float32 shard of ``--mib`` MiB, S(0) -> S(1), check on, its width chosen so that
each piece's rows are runs of ``--runs-bytes`` bytes (8 bytes: two floats per row and peer),
the calls written as users write them (new placement objects every call). Forms, interleaved
within each run, a barrier before each form's calls:

* ``floor``: ``np.copyto`` of the rank's shard into an already-touched buffer of its size;
* ``numpy``, ``torch``: ``redistribute`` of a numpy array / a CPU torch tensor with ``arena=False``
  (the engine's path: the pieces packed, sent, unpacked);
* ``numpy, arena``: a numpy array from ``rs.empty``, read in place by the peers.

Each run keeps the median of each form's calls on the slowest rank; every run is shown, then
the median of the runs and each form over the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
from many_tensors import interleaved  # the same interleaved timing (the script's folder is on the path)

import reshard as rs


def job(comm, mib, run_bytes, runs, calls):
    import torch

    cols = run_bytes // 4 * comm.size
    rows = (mib << 20) // (4 * cols)
    x = np.random.default_rng(comm.rank).standard_normal((rows, cols)).astype(np.float32)
    xt = torch.from_numpy(x.copy())
    shared = rs.empty((rows, cols), np.float32)
    shared[...] = x
    floor_out = np.empty_like(x)
    expected = rs.redistribute(x, rs.Shard(0), rs.Shard(1), arena=False)
    for got in (rs.redistribute(xt, rs.Shard(0), rs.Shard(1), arena=False).numpy(),
                rs.redistribute(shared, rs.Shard(0), rs.Shard(1))):
        assert got.tobytes() == expected.tobytes(), "the forms differ"
    forms = {
        "floor": lambda: np.copyto(floor_out, x),
        "numpy": lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1), arena=False),
        "torch": lambda: rs.redistribute(xt, rs.Shard(0), rs.Shard(1), arena=False),
        "numpy, arena": lambda: rs.redistribute(shared, rs.Shard(0), rs.Shard(1)),
    }
    return (rows, cols), interleaved(forms, runs, calls, before=comm.barrier)


def measure(engine: str, run_bytes: int, args: argparse.Namespace) -> dict:
    per_rank = rs.spawn(job, world_size=args.ranks, engine=engine, args=(args.mib, run_bytes, args.runs, args.calls),
                        timeout=1800)
    shape = per_rank[0][0]
    forms = list(per_rank[0][1])
    runs = {name: [max(r[1][name][k] for r in per_rank) for k in range(args.runs)] for name in forms}
    med = {name: statistics.median(v) for name, v in runs.items()}
    return {"engine": engine, "run_bytes": run_bytes, "shape": shape, "runs_s": runs, "median_s": med,
            "over_floor": {name: med[name] / med["floor"] for name in forms}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--runs-bytes", default="8,16,32,64")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engines = ["gloo", "mpi"] if args.engine == "both" else [args.engine]
    results = []
    for engine in engines:
        for run_bytes in (int(v) for v in args.runs_bytes.split(",")):
            res = measure(engine, run_bytes, args)
            results.append(res)
            print(f"{engine}: float32 {res['shape'][0]} x {res['shape'][1]} per rank ({args.mib} MiB), {args.ranks} ranks, "
                  f"S(0) -> S(1), runs of {run_bytes} bytes, check on (slowest rank's median of each run, ms)")
            for name, values in res["runs_s"].items():
                shown = " ".join(f"{v * 1e3:8.3f}" for v in values)
                print(f"  {name:13s} {shown}   median {res['median_s'][name] * 1e3:8.3f}   "
                      f"over floor {res['over_floor'][name]:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
