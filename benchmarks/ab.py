"""Two source trees side by side on the benchmark tables: before and after a change.

    python benchmarks/ab.py OLD_SRC NEW_SRC [--repeats 2] [--json FILE]

Runs each `reshard bench` of the set below with the package taken from OLD_SRC, then from
NEW_SRC (each a tree's `src` folder, put first on PYTHONPATH), alternating, ``--repeats`` times
each, so drift on the machine hits both trees alike. Prints, per point (bench, size, method),
the median time of each tree over its repeats, the spread of the repeats, and new / old. A
point is marked worse when the new median is more than 10% above the old one and beyond the
noise: the new tree's fastest repeat is slower than the old tree's slowest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHES = [  # (name, arguments of `reshard bench`)
    *[(f"gloo redistribute {n}", ["--engine", "gloo", "--ranks", str(n), "--op", "redistribute", "--sizes", "64K..16M",
                                  "--methods", "reshard,reshard-nocheck,raw"]) for n in (2, 3, 4)],
    *[(f"mpi redistribute {n}", ["--engine", "mpi", "--ranks", str(n), "--op", "redistribute", "--sizes", "64K..16M",
                                 "--methods", "reshard,reshard-nocheck,raw"]) for n in (2, 3, 4)],
    ("gloo all_to_all 4", ["--engine", "gloo", "--ranks", "4", "--op", "all_to_all", "--sizes", "64K,1M,16M",
                           "--methods", "reshard,reshard-nocheck,raw"]),
    ("mpi all_to_all 4", ["--engine", "mpi", "--ranks", "4", "--op", "all_to_all", "--sizes", "64K,1M,16M",
                          "--methods", "reshard,reshard-nocheck,raw"]),
    ("gloo moe 4", ["--engine", "gloo", "--ranks", "4", "--op", "moe", "--sizes", "16M", "--methods", "reshard,reshard-nocheck"]),
    ("mpi moe 4", ["--engine", "mpi", "--ranks", "4", "--op", "moe", "--sizes", "16M", "--methods", "reshard,reshard-nocheck"]),
    ("gloo all_gather 4", ["--engine", "gloo", "--ranks", "4", "--op", "all_gather", "--sizes", "1M,16M",
                           "--methods", "reshard,raw"]),
    ("gloo reduce_scatter 4", ["--engine", "gloo", "--ranks", "4", "--op", "reduce_scatter", "--sizes", "1M,16M",
                               "--methods", "reshard,raw"]),
    *[(f"gloo mesh 2x2 {src}->{dst}", ["--engine", "gloo", "--mesh", "2x2", "--src", src, "--dst", dst, "--sizes", "1M,16M",
                                       "--methods", "reshard,reshard-nocheck"])
      for src, dst in (("S(0),S(1)", "S(1),S(0)"), ("S(0),R", "S(1),R"), ("S(0),S(0)", "S(1),S(1)"))],
]


def run_bench(src: str, args: list[str], out: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "reshard.cli", "bench", *args, "--json", str(out), "--no-color"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--only", help="run only the benches whose name contains this")
    args = parser.parse_args()
    trees = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    times: dict[tuple, dict[str, list[float]]] = {}
    benches = [b for b in BENCHES if not args.only or args.only in b[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, bench_args in benches:
                for tree in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                    rows = run_bench(trees[tree], bench_args, Path(tmp) / "out.json")
                    for row in rows:
                        key = (name, row["size"], row["method"])
                        times.setdefault(key, {"old": [], "new": []})[tree].append(row["time_us"])
                print(f"repeat {rep + 1}: {name} done", file=sys.stderr, flush=True)
    rows, worse = [], 0
    print("| bench | size | method | old (us), median [min-max] | new (us), median [min-max] | new / old | |")
    print("|---|---|---|---|---|---|---|")
    for (name, size, method), t in times.items():
        old, new = statistics.median(t["old"]), statistics.median(t["new"])
        flag = new > 1.10 * old and min(t["new"]) > max(t["old"])
        worse += flag
        rows.append({"bench": name, "size": size, "method": method, "old_us": t["old"], "new_us": t["new"],
                     "ratio": new / old, "worse": flag})
        print(f"| {name} | {size:,} | {method} | {old:,.0f} [{min(t['old']):,.0f}-{max(t['old']):,.0f}] | "
              f"{new:,.0f} [{min(t['new']):,.0f}-{max(t['new']):,.0f}] | {new / old:.2f} | {'worse' if flag else ''} |")
    print(f"\n{len(rows)} points, {worse} worse by more than 10% beyond the repeats' spread")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
