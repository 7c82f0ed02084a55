"""Many small tensors in one call against one call each and against one tensor of their bytes.

    python benchmarks/many_tensors.py [--engine gloo|mpi|both] [--tensors 256] [--kib 4]
                                      [--ranks 4] [--runs 5] [--calls 20] [--json FILE]

Per rank, ``--tensors`` float32 tensors of ``--kib`` KiB, S(0) -> S(1), check on, steady
state (each form warmed up first), the calls written as users write them (new placement
objects every call). Three forms, interleaved within each run: ``one call`` (the list in one
``redistribute``), ``separate calls`` (one ``redistribute`` per tensor) and ``one tensor``
(one ``redistribute`` of a single tensor holding the same bytes). Each run times ``--calls``
calls of each form and keeps the median of the slowest rank's; every run is shown, then the
median of the runs and the ratios the targets name: separate / one call (at least 10) and one
call / one tensor (at most 1.3). The list's results are checked against the separate calls,
bit for bit, before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

import reshard as rs


def job(comm, tensors, kib, runs, calls):
    rows = kib * 1024 // 4 // 32  # each tensor [rows, 32] float32 per rank
    rng = np.random.default_rng(comm.rank)
    xs = [rng.standard_normal((rows, 32)).astype(np.float32) for _ in range(tensors)]
    big = np.concatenate(xs, axis=0)  # the same bytes as one tensor: S(0) over [tensors * rows * ranks, 32]
    together = rs.redistribute(xs, rs.Shard(0), rs.Shard(1))
    separate = [rs.redistribute(x, rs.Shard(0), rs.Shard(1)) for x in xs]
    assert all(np.array_equal(a, b) for a, b in zip(together, separate)), "the list differs from the separate calls"
    forms = {
        "one call": lambda: rs.redistribute(xs, rs.Shard(0), rs.Shard(1)),
        "separate calls": lambda: [rs.redistribute(x, rs.Shard(0), rs.Shard(1)) for x in xs],
        "one tensor": lambda: rs.redistribute(big, rs.Shard(0), rs.Shard(1)),
    }
    return interleaved(forms, runs, calls)


def interleaved(forms: dict, runs: int, calls: int, before: Any = None) -> dict[str, list[float]]:
    """Each form warmed up (planned and replayed once), then ``runs`` rounds in which each form
    in turn takes ``calls`` calls: per form, the median seconds of each round. ``before()``, if
    given, runs before each form's calls (a barrier: every rank starts them at once)."""
    for form in forms.values():
        form()
        form()
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(runs):
        for name, form in forms.items():
            if before is not None:
                before()
            took = []
            for _ in range(calls):
                start = time.perf_counter()
                form()
                took.append(time.perf_counter() - start)
            times[name].append(statistics.median(took))
    return times


def measure(engine: str, args: argparse.Namespace) -> dict:
    per_rank = rs.spawn(job, world_size=args.ranks, engine=engine,
                        args=(args.tensors, args.kib, args.runs, args.calls), timeout=1800)
    forms = list(per_rank[0])
    runs = {name: [max(r[name][k] for r in per_rank) for k in range(args.runs)] for name in forms}
    med = {name: statistics.median(v) for name, v in runs.items()}
    return {"engine": engine, "runs_s": runs, "median_s": med,
            "separate_over_one_call": med["separate calls"] / med["one call"],
            "one_call_over_one_tensor": med["one call"] / med["one tensor"],
            "per_run_separate_over_one_call": [s / o for s, o in zip(runs["separate calls"], runs["one call"])],
            "per_run_one_call_over_one_tensor": [o / t for o, t in zip(runs["one call"], runs["one tensor"])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--kib", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for engine in (("gloo", "mpi") if args.engine == "both" else (args.engine,)):
        res = measure(engine, args)
        results.append(res)
        print(f"{engine}: {args.tensors} float32 tensors of {args.kib} KiB per rank, {args.ranks} ranks, S(0) -> S(1), "
              "check on (slowest rank's median of each run, ms)")
        for name, values in res["runs_s"].items():
            print(f"  {name:15s}" + " ".join(f"{v * 1e3:8.3f}" for v in values)
                  + f"   median {res['median_s'][name] * 1e3:8.3f}")
        print("  separate / one call   " + " ".join(f"{v:6.2f}" for v in res["per_run_separate_over_one_call"])
              + f"   median of runs' medians {res['separate_over_one_call']:.2f} (target >= 10)")
        print("  one call / one tensor " + " ".join(f"{v:6.2f}" for v in res["per_run_one_call_over_one_tensor"])
              + f"   median of runs' medians {res['one_call_over_one_tensor']:.2f} (target <= 1.3)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
