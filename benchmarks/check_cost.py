"""What the cross-rank agreement check costs: redistribute Shard(0)->Shard(1) with the check on
and off, interleaved in the same job, median of repeats; each sample is ``--calls`` calls back to
back between barriers (per call), as a training loop makes them.
Run: .venv/bin/python benchmarks/check_cost.py [--ranks 3] [--calls 20]"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import reshard as rs


def measure(comm, sizes_bytes, repeats, calls=1):
    rows = []
    for nbytes in sizes_bytes:
        side = max(comm.size, int((nbytes * comm.size / 4) ** 0.5) // comm.size * comm.size)
        x = np.ones((side // comm.size, side), dtype=np.float32)
        times = {True: [], False: []}
        for _ in range(repeats):
            for check in (True, False):  # interleaved, so drift hits both alike
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=(side, side), check=check)
                times[check].append((time.perf_counter() - t0) / calls)
        rows.append((x.nbytes, statistics.median(times[True]), statistics.median(times[False])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=1, help="calls back to back per sample (default 1)")
    parser.add_argument("--sizes", default="64K,1M,16M", help="bytes per rank, e.g. 64K,1M")
    args = parser.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20}
    sizes = [int(v[:-1]) * units[v[-1]] if v[-1] in units else int(v) for v in args.sizes.split(",")]
    rows = rs.spawn(measure, args.ranks, args=(sizes, args.repeats, args.calls), timeout=600)[0]
    print(f"{'bytes/rank':>12} {'check on (us)':>14} {'check off (us)':>15} {'cost (us)':>10} {'ratio':>7}")
    for nbytes, on, off in rows:
        print(f"{nbytes:>12} {on * 1e6:>14.0f} {off * 1e6:>15.0f} {(on - off) * 1e6:>10.0f} {on / off:>7.3f}")


if __name__ == "__main__":
    main()
