"""What a call on many tensors must spend per tensor in Python before any byte moves, against
what one tensor of the same bytes spends, in one process (no ranks, no engine).

    python benchmarks/per_tensor_floor.py [--tensors 256] [--kib 4] [--repeats 7] [--json FILE]

For ``--tensors`` float32 tensors of ``--kib`` KiB each, the operations a list call cannot
skip, each timed alone (median of ``--repeats`` timings of 2,000 calls, in µs):

* ``the key``: the tensors' shapes and dtypes as a tuple, looked up in a dict (a replay must
  know the call is the one it planned);
* ``result views``: one result per tensor, a view of one stacked array;
* ``inputs joined``: the tensors copied end to end into one touched array (what a pack or a
  join from separate tensors costs), beside ``one copy``, the same bytes copied as one array;
* ``addresses`` (with mpi4py): each tensor's address, for a datatype that reads the tensors
  where they lie;
* ``contiguity``: each tensor's C-contiguity flag (such a datatype needs it).

The floor of the list's extra work on gloo is the key, the views and the join beyond one copy;
on MPI the key, the views, the addresses and the contiguity. Printed beside it: the extra a
list may take under a target of ``--target`` times one tensor's call, for a given time of that
call (``--one-ms``, measured by ``many_tensors.py``).
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import timeit

import numpy as np


def median_us(fn, repeats: int, number: int = 2000) -> float:
    return statistics.median(timeit.timeit(fn, number=number) / number * 1e6 for _ in range(repeats))


def measure(tensors: int, kib: int, repeats: int) -> dict[str, float]:
    rows = kib * 1024 // 4 // 32
    xs = [np.random.default_rng(i).standard_normal((rows, 32)).astype(np.float32) for i in range(tensors)]
    whole = np.concatenate(xs)
    into = np.zeros_like(whole)
    stacked = np.empty((tensors, rows, 32), np.float32)
    shape_of, dtype_of = operator.attrgetter("shape"), operator.attrgetter("dtype")
    plans = {(tuple(map(dtype_of, xs)), tuple(map(shape_of, xs))): 1}
    out = {
        "the key": median_us(lambda: plans.get((tuple(map(dtype_of, xs)), tuple(map(shape_of, xs)))), repeats),
        "result views": median_us(lambda: list(stacked), repeats),
        "inputs joined": median_us(lambda: np.concatenate(xs, out=into), repeats),
        "one copy": median_us(lambda: np.copyto(into, whole), repeats),
        "contiguity": median_us(lambda: all([x.flags.c_contiguous for x in xs]), repeats),
    }
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return out
    import reshard as rs

    comm = rs.init("mpi")  # MPI as a process of its own, which leaves nothing behind at exit
    from mpi4py import MPI

    out["addresses"] = median_us(lambda: list(map(MPI.Get_address, xs)), repeats)
    comm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--kib", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target", type=float, default=1.3)
    parser.add_argument("--one-ms", type=float, nargs="*", default=[0.19, 0.65],
                        help="one tensor's call (ms) to set the list's allowance against")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    us = measure(args.tensors, args.kib, args.repeats)
    for name, value in us.items():
        print(f"{name:14s} {value:7.1f} µs  ({value / args.tensors * 1e3:5.0f} ns a tensor)")
    floors = {"gloo": us["the key"] + us["result views"] + us["inputs joined"] - us["one copy"]}
    if "addresses" in us:
        floors["MPI"] = us["the key"] + us["result views"] + us["addresses"] + us["contiguity"]
    for engine, floor in floors.items():
        print(f"floor of the list's extra work, {engine}: {floor:.1f} µs a rank")
    for one in args.one_ms:
        print(f"a list within {args.target}x of a {one} ms call may take {(args.target - 1) * one * 1e3:.0f} µs more")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "us": us, "floors_us": floors}, f, indent=2)


if __name__ == "__main__":
    main()
