"""redistribute S(0)->S(1) on gloo against the bare ``all_to_all_single`` of the same bytes:
1 MiB per rank with the check off, 16 MiB with the check on, on 2, 3 and 4 ranks.

    python benchmarks/gloo_exchange.py [--runs 5] [--out benchmarks/results/gloo-exchange.md]

Each run times, for every rank count in turn, reshard and the bare call interleaved (the
methods alternate inside ``bench.run_bench``, slowest rank, median of its iterations); the runs
go round the rank counts ``--runs`` times, so a slow moment of the machine falls on every rank
count alike. The target is met by the median of the runs' ratios (every run is printed):
at most 1.15x. The calls are written as users write them (placements made in each call).
"""

from __future__ import annotations

import argparse
import statistics

from reshard import bench

MiB = 1 << 20
LIMIT = 1.15
CASES = (("check off", MiB, "reshard-nocheck"), ("check on", 16 * MiB, "reshard"))


def _time(rows: list[bench.Row], size: int, method: str) -> float:
    return next(r.time_us for r in rows if r.size == size and r.method == method)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--out", default=None, help="write the table as markdown here")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    ratios: dict[tuple[int, str], list[float]] = {(n, case): [] for n in ranks for case, _, _ in CASES}
    for run in range(args.runs):
        for n in ranks:
            rows = bench.run_bench("gloo", n, "redistribute", [MiB, 16 * MiB], "float32",
                                   ["reshard", "reshard-nocheck", "raw"], show_progress=False)
            if any(r.wrong for r in rows):
                raise SystemExit(f"{n} ranks: wrong elements; no timing of a wrong result counts")
            for case, size, method in CASES:
                ratios[(n, case)].append(_time(rows, size, method) / _time(rows, size, "raw"))
            print(f"run {run + 1}, {n} ranks: " + ", ".join(
                f"{case} {ratios[(n, case)][-1]:.2f}x" for case, _, _ in CASES), flush=True)
    lines = ["| ranks | case | runs (reshard / bare all_to_all_single) | median | met (<= 1.15x) |",
             "|---|---|---|---|---|"]
    for n in ranks:
        for case, size, _ in CASES:
            runs = ratios[(n, case)]
            median = statistics.median(runs)
            lines.append(f"| {n} | {case}, {bench.human(size)} per rank | {', '.join(f'{v:.2f}' for v in runs)} | "
                         f"{median:.2f}x | {'yes' if median <= LIMIT else 'no'} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# redistribute S(0)->S(1) on gloo / the bare all_to_all_single\n\n"
                    f"`python benchmarks/gloo_exchange.py --runs {args.runs}`: {args.runs} runs round the rank "
                    "counts, each reshard and the bare call interleaved (slowest rank, median of its "
                    "iterations).\n\n" + table + "\n")


if __name__ == "__main__":
    main()
