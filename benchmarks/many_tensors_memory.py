"""The peak memory of many tensors in one call against one call each.

    python benchmarks/many_tensors_memory.py [--engine gloo|mpi|both] [--tensors 256] [--kib 4]
                                             [--ranks 4] [--calls 10] [--json FILE]

Per rank, ``--tensors`` float32 tensors of ``--kib`` KiB, S(0) -> S(1), check on, in steady
state (each form called three times first, as a training loop's later steps are). Each form
runs in a job of its own, ``--calls`` calls, each call's results kept until the next call's
are made (``ys = redistribute(...)``). Per rank, three measures of what a call takes beyond
the memory held just before it (the previous results included):

- ``arena``: the most bytes the shared arena's blocks held at once, less what they held before
  (the list's joined blocks on gloo, up to two alive while peers may still read the last, and
  results placed there). Exact, counted by the arena.
- ``PSS``: the proportional set size's largest rise, sampled after each call (shared pages
  counted once over the ranks that map them; what lives only inside a call is missed).
- ``peak RSS``: the resident set's peak (``VmHWM``, reset through ``/proc/self/clear_refs``)
  less the resident set before. A page of a peer's arena this rank read counts here as well as
  in the peer's: an upper bound.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

import reshard as rs


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _pss() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def job(comm, form, tensors, kib, calls):
    from reshard.engines import arena as arena_mod

    rows = kib * 1024 // 4 // 32
    rng = np.random.default_rng(comm.rank)
    xs = [rng.standard_normal((rows, 32)).astype(np.float32) for _ in range(tensors)]
    if form == "one call":
        def call():
            return rs.redistribute(xs, rs.Shard(0), rs.Shard(1))
    else:
        def call():
            return [rs.redistribute(x, rs.Shard(0), rs.Shard(1)) for x in xs]
    ys = None
    for _ in range(3):
        ys = call()
    where = arena_mod.arena()
    if where is not None:
        where.peak_live = where.live  # its most alive at once counts from here
    arena_before = where.live if where is not None else 0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from here
    before, pss_before, pss_peak = _status("VmRSS"), _pss(), 0
    for _ in range(calls):
        ys = call()
        pss_peak = max(pss_peak, _pss())
    peak = _status("VmHWM")
    return {"peak RSS": peak - before, "PSS": pss_peak - pss_before,
            "arena": (where.peak_live - arena_before) if where is not None else 0,
            "results_bytes": sum(y.nbytes for y in ys)}


MEASURES = ("arena", "PSS", "peak RSS")


def measure(engine: str, args: argparse.Namespace) -> dict:
    out = {"engine": engine}
    for form in ("one call", "separate calls"):
        per_rank = rs.spawn(job, world_size=args.ranks, engine=engine,
                            args=(form, args.tensors, args.kib, args.calls), timeout=600)
        out[form] = {m: [r[m] for r in per_rank] for m in MEASURES}
        out[form]["results_bytes"] = per_rank[0]["results_bytes"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi", "both"), default="both")
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--kib", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for engine in (("gloo", "mpi") if args.engine == "both" else (args.engine,)):
        res = measure(engine, args)
        results.append(res)
        print(f"{engine}: {args.tensors} float32 tensors of {args.kib} KiB per rank, {args.ranks} ranks, S(0) -> S(1): "
              f"memory beyond what was held before, per rank (KiB); results {res['one call']['results_bytes'] >> 10} "
              "KiB per call")
        for measure_name in MEASURES:
            for form in ("one call", "separate calls"):
                extra = res[form][measure_name]
                print(f"  {measure_name:9s} {form:15s}" + " ".join(f"{v >> 10:8d}" for v in extra)
                      + f"   median {int(statistics.median(extra)) >> 10:8d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
