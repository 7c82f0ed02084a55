"""Where a MoE layer's exchange time goes on the two-host test bed.

    sudo .venv/bin/python benchmarks/moe_phases.py [--rate 200mbit] [--repeats 3] [--json FILE]

The bed of ``overlap.py`` (two namespaces, a veth pair shaped with ``tc ... tbf``, 2 gloo ranks
per "host" under torchrun, the check on). Every rank runs dispatch then combine of the MoE layer
of ``overlap.py`` (4,096 tokens of 1,024 float32 per rank, top-2 of 8 experts, experts that
compute nothing) with its phases recorded (``reshard.bench.overlap.moe_phases_job``), and the
table says, per rank, what the main thread spent its time on, how much of the total the phases
account for, and how long each message between the hosts took against the link's rate.
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
    from reshard.bench.overlap import moe_phases_job

    comm = rs.init(timeout=600)
    result = moe_phases_job(comm, 4096, 1024, int(sys.argv[2]))
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    comm.close()
    """
)
RATES = {"mbit": 1e6 / 8, "gbit": 1e9 / 8, "kbit": 1e3 / 8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="the link's rate for tc tbf")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    from reshard.bench.overlap import phase_table

    unit = next(u for u in RATES if args.rate.endswith(u))
    bytes_per_s = float(args.rate.removesuffix(unit)) * RATES[unit]
    result = run_job(JOB, [str(args.repeats)], args.rate)
    result["link"] = args.rate
    print(f"two hosts x 2 gloo ranks, link {args.rate} (tc tbf on both ends), check on; the median of {args.repeats} runs")
    print(phase_table(result, bytes_per_s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
