"""What the cross-rank agreement check costs: redistribute Shard(0)->Shard(1) with the check on
and off, interleaved in the same job, median of repeats. Run: .venv/bin/python benchmarks/check_cost.py"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import reshard as rs


def measure(comm, sizes_bytes, repeats):
    rows = []
    for nbytes in sizes_bytes:
        side = max(comm.size, int((nbytes * comm.size / 4) ** 0.5) // comm.size * comm.size)
        x = np.ones((side // comm.size, side), dtype=np.float32)
        times = {True: [], False: []}
        for _ in range(repeats):
            for check in (True, False):  # interleaved, so drift hits both alike
                comm.barrier()
                t0 = time.perf_counter()
                rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=(side, side), check=check)
                times[check].append(time.perf_counter() - t0)
        rows.append((x.nbytes, statistics.median(times[True]), statistics.median(times[False])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    sizes = [64 << 10, 1 << 20, 16 << 20]
    rows = rs.spawn(measure, args.ranks, args=(sizes, args.repeats), timeout=600)[0]
    print(f"{'bytes/rank':>12} {'check on (us)':>14} {'check off (us)':>15} {'cost (us)':>10} {'ratio':>7}")
    for nbytes, on, off in rows:
        print(f"{nbytes:>12} {on * 1e6:>14.0f} {off * 1e6:>15.0f} {(on - off) * 1e6:>10.0f} {on / off:>7.3f}")


if __name__ == "__main__":
    main()
