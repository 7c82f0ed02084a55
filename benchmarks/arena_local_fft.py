"""The FFT's local transforms on arrays in the shared arena against the same transforms on
ordinary arrays, in one process.

    python benchmarks/arena_local_fft.py [--n 128] [--ranks 4] [--runs 5] [--calls 15] [--json FILE]

One rank's slab of an n^3 complex128 array cut over ``--ranks`` ranks (``[n / ranks, n, n]``:
8 MiB at the defaults), transformed along each whole axis with numpy's FFT and ``out=`` as
reshard's FFT calls it (``fftn`` over axes (1, 2), then ``fft`` over axis 0 of the transposed
slab ``[n, n / ranks, n]``). Forms, interleaved within each run: input and output in ordinary
memory (numpy's own arrays, touched before timing), and input and output in the arena
(``rs.empty``, touched before timing). Each run keeps the median of ``--calls`` calls; every
run is shown, then the median of the runs and arena / ordinary. Whether shared memory gets huge
pages here (``reshard doctor``) is printed with them: it is the difference this measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import reshard as rs
from reshard.engines.shared_pages import huge_pages_allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n, part = args.n, args.n // args.ranks
    rng = np.random.default_rng(0)
    steps = {"fftn over axes (1, 2)": ((part, n, n), (1, 2)), "fft over axis 0": ((n, part, n), (0,))}
    arrays = {}
    for step, (shape, _) in steps.items():
        values = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex128)
        arena_in, arena_out = rs.empty(shape, np.complex128), rs.empty(shape, np.complex128)
        arena_in[...] = values
        arena_out[...] = 0
        arrays[step] = {"ordinary": (values.copy(), np.zeros(shape, np.complex128)), "arena": (arena_in, arena_out)}
    times: dict[str, dict[str, list[float]]] = {step: {"ordinary": [], "arena": []} for step in steps}
    for _ in range(args.runs):
        for step, (_, axes) in steps.items():
            for form, (src, out) in arrays[step].items():
                took = []
                for _ in range(args.calls):
                    start = time.perf_counter()
                    np.fft.fftn(src, axes=axes, out=out)
                    took.append(time.perf_counter() - start)
                times[step][form].append(statistics.median(took))
    huge, why = huge_pages_allowed()
    print(f"one rank's {n}^3 complex128 slab over {args.ranks} ranks; huge pages for shared memory: "
          f"{'yes' if huge else 'no'} ({why}); median of {args.calls} calls per run, ms")
    summary = {}
    for step in steps:
        med = {form: statistics.median(v) for form, v in times[step].items()}
        summary[step] = {"runs_s": times[step], "median_s": med, "arena_over_ordinary": med["arena"] / med["ordinary"]}
        print(f"  {step}")
        for form, values in times[step].items():
            print(f"    {form:9s}" + " ".join(f"{v * 1e3:7.2f}" for v in values) + f"   median {med[form] * 1e3:7.2f}")
        print(f"    arena / ordinary {med['arena'] / med['ordinary']:.3f} (target <= 1.05)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "huge_pages": huge, "setting": why, "steps": summary}, f, indent=2)


if __name__ == "__main__":
    main()
