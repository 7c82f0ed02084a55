"""The flat all_to_all against the two-level one on the two-host test bed.

    sudo .venv/bin/python benchmarks/two_level.py [--rate 200mbit] [--repeats 3] [--json FILE]

Two network namespaces joined by a veth pair shaped with ``tc ... tbf`` (``testbed.py``), two
gloo ranks per "host" under torchrun, the check on. For each size per rank: the row -> column
``all_to_all`` with ``algorithm="flat"``, ``"hierarchical"`` and ``"auto"``, medians of
``--repeats`` interleaved repetitions, each the slowest rank's time; with the bytes and
messages each rank sent across hosts, as ``rs.last_exchange()`` counts them. First, in the same
job, ``reshard.bench.calibrate`` fits the cost model's numbers per level (each level timed
alone, as ``reshard bench --calibrate`` does); beside each measured time is what ``reshard plan
--hosts 2 --ranks-per-host 2 --levels`` predicts from them, and the error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testbed import run_job  # noqa: E402

JOB = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    import reshard as rs
    from reshard.bench.calibrate import calibrate_job
    from reshard.planning.host_costs import Levels, two_level_table

    comm = rs.init(timeout=600)
    repeats = int(sys.argv[2])
    fitted = calibrate_job(comm)
    levels = Levels(**fitted["levels"])
    rows = {"calibration": fitted}
    for nbytes in (64 << 10, 1 << 20, 16 << 20):
        x = np.ones((nbytes // 4 // 256, 256), dtype=np.float32)
        runs = {a: (lambda a=a: rs.all_to_all(x, 0, 1, algorithm=a)) for a in ("flat", "hierarchical", "auto")}
        counted = {}
        for name, fn in runs.items():
            fn()
            st = rs.last_exchange()
            counted[name] = (st.cross_host_bytes_sent, st.cross_host_messages)
        samples = {name: [] for name in runs}
        for _ in range(repeats):
            for name, fn in runs.items():
                comm.barrier()
                start = time.perf_counter()
                fn()
                took = rs.all_reduce(np.array([time.perf_counter() - start]), op="max", check=False)[0]
                samples[name].append(float(took))
        model = two_level_table(x.nbytes, 2, comm.size // 2, levels)
        predicted = {"flat": model["flat"]["estimate_s"], "hierarchical": model["hierarchical"]["estimate_s"]}
        predicted["auto"] = min(predicted.values())
        rows[nbytes] = {name: {"seconds": statistics.median(v), "samples": v, "cross_host_bytes": counted[name][0],
                               "cross_host_messages": counted[name][1], "predicted_seconds": predicted[name]}
                        for name, v in samples.items()}
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)
    comm.close()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="the link's rate for tc tbf ('none': unshaped)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = run_job(JOB, [str(args.repeats)], None if args.rate == "none" else args.rate)
    fitted = rows.pop("calibration")
    lv = fitted["levels"]
    print(f"two hosts x 2 gloo ranks, link {args.rate} (tc tbf on both ends), check on, median of {args.repeats}, "
          "the slowest rank")
    print(f"fitted per level: inside {lv['alpha_local'] * 1e6:.1f} us/message, {lv['beta_local'] * 1e9:.4f} ns/byte; "
          f"across {lv['alpha_link'] * 1e6:.1f} us/message, {lv['beta_link'] * 1e9:.3f} ns/byte of a host link; "
          f"{lv['step'] * 1e6:.1f} us per step")
    print("\n| bytes per rank | algorithm | seconds | predicted | predicted / measured | bytes across per rank | messages across per rank |")
    print("|---|---|---|---|---|---|---|")
    for nbytes, by_algorithm in rows.items():
        for name, r in by_algorithm.items():
            print(f"| {int(nbytes):,} | {name} | {r['seconds']:.4f} | {r['predicted_seconds']:.4f} | "
                  f"{r['predicted_seconds'] / r['seconds']:.2f} | {r['cross_host_bytes']:,} | {r['cross_host_messages']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"link": args.rate, "calibration": fitted, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
