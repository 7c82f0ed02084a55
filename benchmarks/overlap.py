"""Compute hidden behind a transfer that waits on a link: started calls on the two-host test bed.

    sudo .venv/bin/python benchmarks/overlap.py [--rate 200mbit] [--repeats 3] [--ranks-per-host 2]
                                                 [--json FILE] [--timeline PNG]

Two network namespaces joined by a veth pair shaped with ``tc ... tbf`` (``testbed.py``), two
gloo ranks per "host" under torchrun (``--ranks-per-host``), the check on. Runs ``reshard.bench.overlap.overlap_job``:
an all_to_all of 16 MiB per rank with a matrix multiply of about the transfer's time, blocking
then multiply against started, multiply, wait (torch's own ``all_to_all_single(async_op=True)``
beside it), and a MoE layer step (4,096 tokens of 1,024 float32 per rank, top-2 of 8 experts)
whose experts are sized in the run to compute about as long as its exchanges take, through
``rs.moe.pipeline`` in 1, 2, 4 and 8 parts, and one 4-part step's timeline. On this two-core
machine the exchange keeps both cores busy without a link to wait on, so there is nothing to
hide compute behind: the shaped link is what makes the measurement mean something.
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
    import json, sys
    import reshard as rs
    from reshard.bench.overlap import overlap_job

    comm = rs.init(timeout=600)
    result = overlap_job(comm, 16 << 20, int(sys.argv[2]))
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    comm.close()
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="the link's rate for tc tbf ('none': unshaped)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks-per-host", type=int, default=2,
                        help="gloo ranks on each host (1: each rank has a core of its own on a two-core machine)")
    parser.add_argument("--timeline", metavar="PNG", help="draw one 4-part MoE step's timeline to this PNG")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    from reshard.bench.overlap import overlap_table, write_timeline

    result = run_job(JOB, [str(args.repeats)], None if args.rate == "none" else args.rate,
                     ranks_per_host=args.ranks_per_host)
    result["link"] = args.rate
    result["ranks_per_host"] = args.ranks_per_host
    print(f"two hosts x {args.ranks_per_host} gloo ranks, link {args.rate} (tc tbf on both ends), check on")
    print(overlap_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.timeline:
        write_timeline(args.timeline, result["moe"], f"two hosts x {args.ranks_per_host} gloo ranks, link {args.rate}")
        print(f"wrote {args.timeline}")


if __name__ == "__main__":
    main()
