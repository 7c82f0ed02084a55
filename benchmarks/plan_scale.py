"""Planning at scale: one rank's part of a layout change on a large world or mesh, and the
totals `reshard plan` prints without --rank. Planning is pure computation, so the figures are
absolute times on this machine (median of repeats) and tracemalloc's peak for one rank's plan.

    python benchmarks/plan_scale.py [--repeats 7] [--json FILE]

Beside them, what listing a transfer for every pair of ranks would cost each rank instead (a
quadratic plan), against the plan a rank makes at run time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import tracemalloc

from reshard.planning import planner
from reshard.planning.layout import Shard
from reshard.planning.mesh_plan import plan_summary
from reshard.planning.plan import make_plan
from reshard.tools.rank_report import rank_report

CASES = [  # (what, shape, src, dst, world size or mesh, limit in ms)
    ("S(0)->S(1), 65,536 ranks", (65_536 * 3 + 5, 65_536 * 2 + 7), Shard(0), Shard(1), 65_536, 50.0),
    ("(S0,S1)->(S1,S0), 256x256 mesh", (256 * 40 + 3, 256 * 24 + 1), (Shard(0), Shard(1)), (Shard(1), Shard(0)),
     (256, 256), 50.0),
    ("S(0)->S(1), 1,024 ranks", (1_024 * 3 + 5, 1_024 * 2 + 7), Shard(0), Shard(1), 1_024, 5.0),
    ("(S0,S1)->(S1,S0), 32x32 mesh", (32 * 40 + 3, 32 * 24 + 1), (Shard(0), Shard(1)), (Shard(1), Shard(0)),
     (32, 32), 5.0),
]
MEMORY_LIMIT_MB = 50.0


def one_rank(shape, src, dst, where, rank):
    kw = {"mesh": where} if isinstance(where, tuple) else {"ranks": where}
    return rank_report(shape, src, dst, rank, **kw)


REPORT = ["plan", "--shape", "8192x8192", "--dtype", "bfloat16", "--ranks", "64", "--json"]
SMALL = ["plan", "--shape", "6x6", "--ranks", "3"]


def report_processes(repeats: int) -> list[dict]:
    """``reshard plan`` for 64 ranks with every pair's table, as a fresh process, beside the 6x6
    example's (the start-up every command pays), alternated: medians of ``max(repeats, 11)``."""
    runs: dict[str, list[float]] = {"report": [], "small": []}
    for _ in range(max(repeats, 11)):
        for name, argv in (("report", REPORT), ("small", SMALL)):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "reshard", *argv], check=True, stdout=subprocess.DEVNULL)
            runs[name].append((time.perf_counter() - started) * 1e3)
    return [{"case": "reshard plan, 64 ranks, --json (a fresh process)",
             "process_ms_median": statistics.median(runs["report"]), "runs_ms": runs["report"],
             "baseline_ms_median": statistics.median(runs["small"]), "limit_ms": 300.0}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = []
    for what, shape, src, dst, where, limit in CASES:
        size = where if isinstance(where, int) else where[0] * where[1]
        ranks = [0, size // 3, size - 1]
        seconds = [one_rank(shape, src, dst, where, ranks[i % 3])["plan_seconds"] for i in range(args.repeats)]
        tracemalloc.start()
        one_rank(shape, src, dst, where, ranks[1])
        peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        rows.append({"case": what, "plan_ms_median": statistics.median(seconds) * 1e3,
                     "plan_ms_max": max(seconds) * 1e3, "limit_ms": limit, "peak_mb": peak,
                     "limit_mb": MEMORY_LIMIT_MB})
    for n in (65_536,):
        started = time.perf_counter()
        plan_summary((n * 3 + 5, n * 2 + 7), (Shard(0),), (Shard(1),), (n,), 4)
        rows.append({"case": f"totals without --rank, {n:,} ranks", "plan_ms_median": (time.perf_counter() - started) * 1e3,
                     "limit_ms": 1000.0})
    for n in (256, 512, 1_024):
        shape = (n * 3 + 5, n * 2 + 7)
        started = time.perf_counter()
        planner.redistribute(shape, (Shard(0),), (Shard(1),), (n,), n // 3)
        made = time.perf_counter() - started
        started = time.perf_counter()
        listed = len(make_plan(shape, "row", "col", n).steps[0].transfers)
        every_pair = time.perf_counter() - started
        rows.append({"case": f"world of {n:,}: the plan a rank runs", "plan_ms_median": made * 1e3,
                     "every_pair_ms": every_pair * 1e3, "pairs": listed})
    rows.extend(report_processes(args.repeats))
    for row in rows:
        if "process_ms_median" in row:
            print(f"{row['case']:<58} {row['process_ms_median']:9.0f} ms, the 6x6 example's process "
                  f"{row['baseline_ms_median']:.0f} ms: +{row['process_ms_median'] - row['baseline_ms_median']:.0f} ms "
                  f"(limit {row['limit_ms']:g} ms in all); every run: {', '.join(f'{v:.0f}' for v in row['runs_ms'])}")
            continue
        limits = [f"{row['plan_ms_median']:9.2f} ms" + (f" (limit {row['limit_ms']:g})" if "limit_ms" in row else "")]
        if "peak_mb" in row:
            limits.append(f"{row['peak_mb']:.1f} MB (limit {row['limit_mb']:g})")
        if "every_pair_ms" in row:
            limits.append(f"listing all {row['pairs']:,} pairs instead: {row['every_pair_ms']:.0f} ms")
        print(f"{row['case']:<58} " + ", ".join(limits))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
