"""What the first call of a job costs, and where the time goes.

    python benchmarks/first_call.py [--engine gloo|mpi] [--ranks 3] [--jobs 3]

Starts ``--jobs`` jobs one after another from one process with ``rs.spawn`` and prints, for
each, the time ``rs.spawn`` took as a whole, then per rank the first ``redistribute`` of the
job (S(0) -> S(1)), its replay, the first ``all_to_all`` of another signature and its replay.
The first job pays for starting the fork server (gloo) or the MPI launcher; each later job
only for its ranks and their process group.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import reshard as rs

CALLS = ("first redistribute", "its replay", "first all_to_all (new signature)", "its replay ")


def job(comm):
    x = np.zeros((2 * comm.size, 6 * comm.size), np.float32)
    y = np.zeros((3 * comm.size, 5), np.float32)
    calls = [lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1)), lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1)),
             lambda: rs.all_to_all(y, 0, 1), lambda: rs.all_to_all(y, 0, 1)]
    took = []
    for call in calls:
        start = time.perf_counter()
        call()
        took.append(time.perf_counter() - start)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=3)
    args = parser.parse_args()
    for k in range(args.jobs):
        start = time.perf_counter()
        per_rank = rs.spawn(job, world_size=args.ranks, engine=args.engine)
        print(f"job {k + 1}: rs.spawn {time.perf_counter() - start:.3f} s")
        for name, column in zip(CALLS, zip(*per_rank)):
            print(f"  {name:34s}" + "  ".join(f"{t * 1e3:7.2f}" for t in column) + "  ms (rank 0, 1, ...)")


if __name__ == "__main__":
    main()
