"""A small transformer's 256 parameters moved from one 2-D layout to another on a 2x2 mesh:
one reshard call on the list, 256 reshard calls, and DTensor's 256 redistributes.

    python benchmarks/transformer_params.py [--layers 28] [--d 64] [--runs 5] [--calls 5] [--first] [--json FILE]

The model: token and position embeddings [8 d, d], then per layer the attention weights q, k,
v, o [d, d], a gated MLP's up and gate [d, 4 d] and down [4 d, d] and two norms [d]; with 28
layers, a final norm and the output head [d, 8 d], 256 tensors. Weights go from (Shard(0), Shard(1)) (rows over the first mesh dim,
columns over the second) to (Shard(1), Shard(0)); norms from (Shard(0), Replicate()) to
(Replicate(), Shard(0)). gloo, check on, steady state (each form warmed up), every run shown
(the slowest rank's median of ``--calls`` calls), then the median of the runs. Results of
the three forms are checked equal, bit for bit, before anything is timed.
With ``--first``, each form's first call instead, each in a job of its own (nothing planned
yet), the forms alternated ``--runs`` times.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from many_tensors import interleaved  # the same interleaved timing (the script's folder is on the path)

import reshard as rs


def model_shapes(layers: int, d: int) -> list[tuple[int, ...]]:
    shapes = [(8 * d, d), (8 * d, d)]
    for _ in range(layers):
        shapes += [(d, d)] * 4 + [(d, 4 * d), (d, 4 * d), (4 * d, d), (d,), (d,)]
    return shapes + [(d,), (d, 8 * d)]


def _forms(layers, d):
    """The three forms on this rank's parameters: {name: a call}, the parameters, their shapes,
    the device mesh and reshard's mesh of it."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS

    device_mesh = init_device_mesh("cpu", (2, 2))
    mesh = rs.Mesh.from_torch(device_mesh)
    shapes = model_shapes(layers, d)
    src = [(rs.Shard(0), rs.Shard(1)) if len(s) == 2 else (rs.Shard(0), rs.Replicate()) for s in shapes]
    dst = [(rs.Shard(1), rs.Shard(0)) if len(s) == 2 else (rs.Replicate(), rs.Shard(0)) for s in shapes]
    fulls = [torch.from_numpy(np.random.default_rng(k).standard_normal(s).astype(np.float32)) for k, s in enumerate(shapes)]
    xs = [rs.local_shard(f, p, mesh.coord, mesh.shape).contiguous() for f, p in zip(fulls, src)]
    as_torch = [[TS(p.dim) if isinstance(p, rs.Shard) else TR() for p in layout] for layout in dst]
    dts = [DTensor.from_local(x, device_mesh, [TS(p.dim) if isinstance(p, rs.Shard) else TR() for p in s],
                              run_check=False, shape=f.shape, stride=f.stride()) for x, s, f in zip(xs, src, fulls)]
    forms = {
        "one call": lambda: rs.redistribute(xs, src, dst, mesh=mesh),
        "one call each": lambda: [rs.redistribute(x, s, t, mesh=mesh) for x, s, t in zip(xs, src, dst)],
        "DTensor, one each": lambda: [dt.redistribute(device_mesh, p).to_local() for dt, p in zip(dts, as_torch)],
    }
    return forms, xs, shapes, device_mesh, mesh


def job(comm, layers, d, runs, calls):
    import torch

    forms, xs, shapes, _, _ = _forms(layers, d)
    got = {name: form() for name, form in forms.items()}
    for name, outs in got.items():
        assert all(torch.equal(a, b) for a, b in zip(outs, got["one call each"])), name
    times = interleaved(forms, runs, calls)
    return times, len(shapes), sum(x.numel() * 4 for x in xs)


def first_job(comm, layers, d, name):
    """The first call of the form ``name`` in a job of its own (nothing planned yet), after one
    small change of another shape by reshard and by DTensor (connections made, caches warm)."""
    import time

    import torch
    from torch.distributed.tensor import Shard as TS
    from torch.distributed.tensor import distribute_tensor

    forms, _, _, device_mesh, mesh = _forms(layers, d)
    rs.redistribute(np.zeros((6, 6), np.float32), (rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0)), mesh=mesh)
    small = distribute_tensor(torch.zeros(6, 6), device_mesh, [TS(0), TS(1)])
    small.redistribute(small.device_mesh, [TS(1), TS(0)]).to_local()
    comm.barrier()
    start = time.perf_counter()
    forms[name]()
    return time.perf_counter() - start


def first_calls(args: argparse.Namespace) -> dict[str, list[float]]:
    """Each form's first call, each in a job of its own, the forms alternated ``--runs`` times:
    per form, the slowest rank's seconds of each run."""
    names = ["one call", "one call each", "DTensor, one each"]
    runs: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.runs):
        for name in names:
            runs[name].append(max(rs.spawn(first_job, world_size=4, args=(args.layers, args.d, name), timeout=1800)))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--first", action="store_true",
                        help="time each form's first call (a job of its own each) instead of its steady state")
    args = parser.parse_args()
    if args.first:
        first = first_calls(args)
        print("first call of each form, each in a job of its own, 4 ranks on a 2x2 mesh, gloo, check on (ms)")
        for name, values in first.items():
            print(f"  {name:20s}" + " ".join(f"{v * 1e3:9.1f}" for v in values)
                  + f"   median {statistics.median(values) * 1e3:9.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "first_call_s": first}, f, indent=2)
        return
    per_rank = rs.spawn(job, world_size=4, args=(args.layers, args.d, args.runs, args.calls), timeout=1800)
    count, nbytes = per_rank[0][1], per_rank[0][2]
    runs = {name: [max(r[0][name][k] for r in per_rank) for k in range(args.runs)] for name in per_rank[0][0]}
    med = {name: statistics.median(v) for name, v in runs.items()}
    print(f"{count} parameters, {nbytes / 1024:.0f} KiB per rank, 2x2 mesh, gloo, check on "
          "(slowest rank's median of each run, ms)")
    for name, values in runs.items():
        print(f"  {name:20s}" + " ".join(f"{v * 1e3:8.2f}" for v in values) + f"   median {med[name] * 1e3:8.2f}")
    print(f"  one call each / one call {med['one call each'] / med['one call']:.1f}; "
          f"DTensor / one call {med['DTensor, one each'] / med['one call']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "parameters": count, "bytes_per_rank": nbytes, "runs_s": runs,
                       "median_s": med}, f, indent=2)


if __name__ == "__main__":
    main()
