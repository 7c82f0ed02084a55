"""A small transformer's 256 parameters moved from one 2-D layout to another on a 2x2 mesh:
one reshard call on the list, 256 reshard calls, and DTensor's 256 redistributes.

    python benchmarks/transformer_params.py [--layers 28] [--d 64] [--runs 5] [--calls 5] [--json FILE]

The model: token and position embeddings [8 d, d], then per layer the attention weights q, k,
v, o [d, d], a gated MLP's up and gate [d, 4 d] and down [4 d, d] and two norms [d]; with 28
layers, a final norm and the output head [d, 8 d], 256 tensors. Weights go from (Shard(0), Shard(1)) (rows over the first mesh dim,
columns over the second) to (Shard(1), Shard(0)); norms from (Shard(0), Replicate()) to
(Replicate(), Shard(0)). gloo, check on, steady state (each form warmed up), every run shown
(the slowest rank's median of ``--calls`` calls), then the median of the runs. Results of
the three forms are checked equal, bit for bit, before anything is timed.
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


def job(comm, layers, d, runs, calls):
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
    got = {name: form() for name, form in forms.items()}
    for name, outs in got.items():
        assert all(torch.equal(a, b) for a, b in zip(outs, got["one call each"])), name
    times = interleaved(forms, runs, calls)
    return times, len(shapes), sum(x.numel() * 4 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
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
