"""Exchanges read in place from the shared arena, against the copy floor and the engine's own
all-to-all.

    python benchmarks/arena.py [--engine gloo|mpi|both] [--ranks 2,3,4] [--mib 16,64]
                               [--runs 5] [--calls 8] [--warm 0] [--json FILE]

Per rank, a float32 shard of ``--mib`` MiB, S(0) -> S(1), check on, the calls written as users
write them (new placement objects every call), every form warmed up first. Forms, interleaved
within each run (a barrier before each form's calls, so every rank runs it at once):

* ``floor``: ``np.copyto`` of the rank's shard into an already-touched buffer of its size: the
  least any exchange that leaves each byte in a new place can cost;
* ``rs.empty input``: the input made by ``rs.empty``; the peers read it in place;
* ``ordinary input``: the input in ordinary memory (the user's own array): copied into the
  arena first, then read there;
* ``arena off``: the same call with ``arena=False`` (the engine's own path: two copies);
* ``engine all-to-all``: MPI's ``Alltoall`` / gloo's ``all_to_all_single`` on already packed
  bytes of the shard's size;
* ``back and forth``: S(0) -> S(1) -> S(0) ... ten calls, each input the previous result, the
  first input ordinary memory (no ``rs.empty`` in user code); the time of calls 2 to 10.

Each run keeps the median of each form's calls on the slowest rank; every run is shown, then
the median of the runs and the ratios the targets name. ``--warm N``: N untimed calls of each
form before its timed ones in every run (``back and forth``: N untimed chains), so the medians
are of calls in steady state; on a machine whose memory takes a few calls to come back to speed
for a new working set, the first calls of a form after the others are slower, the floor's too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import reshard as rs


def job(comm, engine, mib, runs, calls, warm):
    size, rank = comm.size, comm.rank
    cols = 1024 * size
    rows = (mib << 20) // 4 // cols
    shape = (rows * size, cols)
    mine = np.random.default_rng(rank).standard_normal((rows, cols)).astype(np.float32)
    if engine == "gloo":
        import torch
        import torch.distributed as dist

        def as_in(a):
            return torch.from_numpy(a)

        send = torch.from_numpy(mine.reshape(-1).view(np.uint8).copy())
        recv = torch.empty_like(send)

        def engine_all_to_all():
            dist.all_to_all_single(recv, send, group=comm.group)
    else:
        from mpi4py import MPI

        def as_in(a):
            return a

        send = mine.reshape(-1).view(np.uint8).copy()
        recv = np.empty_like(send)

        def engine_all_to_all():
            comm.mpi_comm.Alltoall([send, MPI.BYTE], [recv, MPI.BYTE])

    x = rs.empty(mine.shape, np.float32)
    x[...] = mine
    x = as_in(x)
    ordinary = as_in(mine.copy())
    want = rs.redistribute(as_in(mine.copy()), rs.Shard(0), rs.Shard(1), comm, arena=False)
    got = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
    assert np.array_equal(np.asarray(got), np.asarray(want)), "the arena's result differs from the engine's"
    floor_src, floor_dst = mine.copy(), np.ones_like(mine)

    def back_and_forth():
        y, took = ordinary, []
        layouts = [rs.Shard(0), rs.Shard(1)]
        for k in range(10):
            start = time.perf_counter()
            y = rs.redistribute(y, layouts[k % 2], layouts[(k + 1) % 2], comm, shape)
            took.append(time.perf_counter() - start)
        return took[1:]

    forms = {
        "floor": lambda: np.copyto(floor_dst, floor_src),
        "rs.empty input": lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm, shape),
        "ordinary input": lambda: rs.redistribute(ordinary, rs.Shard(0), rs.Shard(1), comm, shape),
        "arena off": lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm, shape, arena=False),
        "engine all-to-all": engine_all_to_all,
    }
    for form in forms.values():
        form()
        form()
    back_and_forth()
    times: dict[str, list[float]] = {name: [] for name in [*forms, "back and forth"]}
    for _ in range(runs):
        for name, form in forms.items():
            comm.barrier()
            for _ in range(warm):
                form()
            took = []
            for _ in range(calls):
                start = time.perf_counter()
                form()
                took.append(time.perf_counter() - start)
            times[name].append(statistics.median(took))
        comm.barrier()
        for _ in range(warm):
            back_and_forth()
        times["back and forth"].append(statistics.median(back_and_forth()))
    return times


def measure(engine: str, ranks: int, mib: int, runs: int, calls: int, warm: int = 0) -> dict:
    per_rank = rs.spawn(job, world_size=ranks, engine=engine, args=(engine, mib, runs, calls, warm), timeout=1800)
    forms = list(per_rank[0])
    slowest = {name: [max(r[name][k] for r in per_rank) for k in range(runs)] for name in forms}
    med = {name: statistics.median(v) for name, v in slowest.items()}
    return {"engine": engine, "ranks": ranks, "mib_per_rank": mib, "runs_s": slowest, "median_s": med,
            "empty_over_floor": med["rs.empty input"] / med["floor"],
            "empty_over_engine": med["rs.empty input"] / med["engine all-to-all"],
            "back_and_forth_over_floor": med["back and forth"] / med["floor"],
            "arena_off_over_empty": med["arena off"] / med["rs.empty input"],
            "ordinary_over_arena_off": med["ordinary input"] / med["arena off"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--mib", default="16,64")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--warm", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for engine in (("gloo", "mpi") if args.engine == "both" else (args.engine,)):
        for mib in (int(m) for m in args.mib.split(",")):
            for ranks in (int(r) for r in args.ranks.split(",")):
                res = measure(engine, ranks, mib, args.runs, args.calls, args.warm)
                results.append(res)
                print(f"{engine}, {ranks} ranks, {mib} MiB per rank, S(0) -> S(1), check on "
                      "(slowest rank's median of each run, ms)")
                for name, values in res["runs_s"].items():
                    print(f"  {name:18s}" + " ".join(f"{v * 1e3:8.2f}" for v in values)
                          + f"   median {res['median_s'][name] * 1e3:8.2f}")
                print(f"  rs.empty input / floor {res['empty_over_floor']:.2f} (target <= 1.2); "
                      f"/ engine all-to-all {res['empty_over_engine']:.2f} (target <= 1 at 64 MiB); "
                      f"back and forth / floor {res['back_and_forth_over_floor']:.2f} (target <= 1.25); "
                      f"arena off / rs.empty input {res['arena_off_over_empty']:.2f}; ordinary input / arena off "
                      f"{res['ordinary_over_arena_off']:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
