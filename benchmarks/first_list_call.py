"""A one-shot job's first list call against its replays: a 55-tensor model on a 2x2 mesh.

    python benchmarks/first_list_call.py [--engine gloo|mpi] [--runs 5] [--replays 20] [--global-shape] [--json FILE]

Each run is a job of its own (``rs.spawn``, 4 ranks, check on), so nothing is planned before its
first call: the model's parameters (embeddings, 5 layers of attention and MLP weights, norms and
the head; 55 float32 tensors, the weights from (Shard(0), Shard(1)) to (Shard(1), Shard(0)), the
norms from (Shard(0), Replicate()) to (Replicate(), Shard(0))) move in one ``rs.redistribute``
call, then ``--replays`` more calls written as users write them (new placement objects each
call). Printed per run: the slowest rank's first call, its CPU time (the main thread's), the
median replay and their ratio; then the median ratio of the runs. ``--global-shape`` passes
every tensor's global shape, so the first call skips the exchange of local shapes. Results are
checked against numpy's slices of the full tensors, bit for bit, before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import reshard as rs


def model_shapes(d: int = 64, layers: int = 5) -> list[tuple[int, ...]]:
    """Token and position embeddings, per layer q, k, v, o, up, gate, down and two norms, a final
    norm and the head (2 + 9 * layers + 2 tensors: 49 for 5 layers), then adapter projections
    [d, d] up to 55 tensors."""
    shapes: list[tuple[int, ...]] = [(8 * d, d), (8 * d, d)]
    for _ in range(layers):
        shapes += [(d, d)] * 4 + [(d, 4 * d), (d, 4 * d), (4 * d, d), (d,), (d,)]
    shapes += [(d,), (d, 8 * d)]
    return shapes + [(d, d)] * (55 - len(shapes))


def layouts(shapes: list[tuple[int, ...]]) -> tuple[list, list]:
    src = [(rs.Shard(0), rs.Shard(1)) if len(s) == 2 else (rs.Shard(0), rs.Replicate()) for s in shapes]
    dst = [(rs.Shard(1), rs.Shard(0)) if len(s) == 2 else (rs.Replicate(), rs.Shard(0)) for s in shapes]
    return src, dst


def job(comm: rs.Comm, replays: int, given: bool) -> tuple[float, float, list[float]]:
    mesh = rs.Mesh((2, 2), ("dp", "tp"))
    shapes = model_shapes()
    src, dst = layouts(shapes)
    fulls = [np.random.default_rng(k).standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]
    xs = [np.ascontiguousarray(rs.local_shard(f, p, mesh.coord, mesh.shape)) for f, p in zip(fulls, src)]
    gshapes = [f.shape for f in fulls] if given else None
    rs.all_reduce(np.zeros(1, np.float32))  # every rank starts the first call together
    start, cpu = time.perf_counter(), time.thread_time()
    outs = rs.redistribute(xs, src, dst, mesh=mesh, global_shape=gshapes)
    first, first_cpu = time.perf_counter() - start, time.thread_time() - cpu
    for out, full, p in zip(outs, fulls, dst):
        assert np.array_equal(out, rs.local_shard(full, p, mesh.coord, mesh.shape)), "a result differs from numpy's"
    took = []
    for _ in range(replays):
        src_now, dst_now = layouts(shapes)  # new placement objects, as a user's loop makes them
        start = time.perf_counter()
        rs.redistribute(xs, src_now, dst_now, mesh=mesh, global_shape=gshapes)
        took.append(time.perf_counter() - start)
    return first, first_cpu, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--global-shape", action="store_true", help="pass every tensor's global shape")
    parser.add_argument("--json", help="write the runs here")
    args = parser.parse_args()
    print(f"first list call of 55 tensors on a 2x2 mesh, 4 {args.engine} ranks, check on"
          f"{', global shapes given' if args.global_shape else ''}")
    rows = []
    for k in range(args.runs):
        per_rank = rs.spawn(job, world_size=4, engine=args.engine, args=(args.replays, args.global_shape))
        first = max(r[0] for r in per_rank)
        cpu = max(r[1] for r in per_rank)
        replay = max(statistics.median(r[2]) for r in per_rank)
        rows.append({"first_ms": first * 1e3, "first_cpu_ms": cpu * 1e3, "replay_ms": replay * 1e3,
                     "ratio": first / replay})
        print(f"  run {k + 1}: first {first * 1e3:7.2f} ms (CPU {cpu * 1e3:6.2f} ms)  replay {replay * 1e3:6.2f} ms"
              f"  first / replay {first / replay:5.2f}")
    ratio = statistics.median(r["ratio"] for r in rows)
    each = ", ".join(f"{r['ratio']:.2f}" for r in rows)
    print(f"median first / replay: {ratio:.2f} (runs: {each})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": args.engine, "global_shape": args.global_shape, "runs": rows,
                       "median_ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
