"""MoE dispatch + combine across two hosts: flat against the two-level path that sends each
token across once, on the two-host test bed.

    sudo .venv/bin/python benchmarks/moe_hosts.py [--rate 200mbit] [--repeats 3] [--json FILE]

Two network namespaces joined by a veth pair shaped with ``tc ... tbf`` (``testbed.py``), two
gloo ranks per "host" under torchrun, the check on. 8 experts (2 per rank), 4,096 tokens of
1,024 float32 per rank (16 MiB), random routing (k distinct experts per token, the same seed on
every run); for top-2 and top-4: ``rs.moe.dispatch`` then ``rs.moe.combine`` with gate weights,
``algorithm="flat"`` and ``"hierarchical"`` interleaved, medians of ``--repeats`` repetitions,
each the slowest rank's time. Beside them: the bytes each rank sent across hosts (as
``rs.last_exchange()`` counts them, dispatch + combine) and the link's own counter.
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
    import json, os, statistics, sys, time
    import numpy as np
    import reshard as rs

    comm = rs.init(timeout=600)
    repeats = int(sys.argv[2])
    dev = os.environ["GLOO_SOCKET_IFNAME"]
    def sent_on_link():
        with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
            return int(f.read())
    rng = np.random.default_rng(comm.rank)
    tokens = rng.standard_normal((4096, 1024)).astype(np.float32)
    rows = {}
    for k in (2, 4):
        ids = np.argsort(rng.random((4096, 8)), axis=1)[:, :k]  # k distinct experts per token
        weights = rng.random((4096, k)).astype(np.float32)
        def layer(algorithm):
            inputs, handle = rs.moe.dispatch(tokens, ids, 8, algorithm=algorithm)
            across = rs.last_exchange().cross_host_bytes_sent
            out = rs.moe.combine(inputs, handle, weights)
            return out, across + rs.last_exchange().cross_host_bytes_sent
        counted, results = {}, {}
        for a in ("flat", "hierarchical"):  # planned and connected first; bytes as counted and on the link
            layer(a)
            comm.barrier()
            before = sent_on_link()
            results[a], counted[a] = layer(a)
            comm.barrier()
            counted[a] = (counted[a], sent_on_link() - before)
        err = float(np.abs(results["flat"] - results["hierarchical"]).max() / np.abs(results["flat"]).max())
        samples = {a: [] for a in counted}
        for _ in range(repeats):
            for a in samples:
                comm.barrier()
                start = time.perf_counter()
                layer(a)
                took = rs.all_reduce(np.array([time.perf_counter() - start]), op="max", check=False)[0]
                samples[a].append(float(took))
        host_sent = rs.all_gather(np.array([[counted[a][0] for a in counted]]), check=False)
        rows[k] = {a: {"seconds": statistics.median(v), "samples": v,
                       "cross_host_bytes_per_rank": counted[a][0],
                       "host_link_bytes_counted": int(host_sent[[q for q in range(comm.size)
                                                                  if comm.hosts[q] == comm.host], i].sum()),
                       "host_link_bytes_measured": counted[a][1]}
                   for i, (a, v) in enumerate(samples.items())}
        rows[k]["largest_difference_over_largest_value"] = err
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
    print(f"two hosts x 2 gloo ranks, link {args.rate} (tc tbf on both ends), 8 experts, 4,096 x 1,024 float32 "
          f"tokens per rank, check on, median of {args.repeats}, the slowest rank\n")
    print("| top-k | algorithm | dispatch + combine (s) | flat / this | bytes across per rank | "
          "host 0's link: counted / measured |")
    print("|---|---|---|---|---|---|")
    for k, by in rows.items():
        flat = by["flat"]["seconds"]
        for a in ("flat", "hierarchical"):
            r = by[a]
            print(f"| {k} | {a} | {r['seconds']:.3f} | {flat / r['seconds']:.2f}x | {r['cross_host_bytes_per_rank']:,} | "
                  f"{r['host_link_bytes_counted']:,} / {r['host_link_bytes_measured']:,} |")
        print(f"| {k} | largest difference over largest value | {by['largest_difference_over_largest_value']:.1e} | | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"link": args.rate, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
