"""The CUDA path on one GPU: world size 1 on NCCL, checked, and pack bandwidth against a
device-to-device copy of the same bytes. Run it by hand on a machine with a GPU; never in CI.

    python benchmarks/gpu_check.py [--sizes 1M,16M,256M] [--json FILE]

It checks, bit for bit against a slice of the full tensor, redistribute Shard(0)->Shard(1) and
back, all_to_all_v and all_gather on CUDA tensors, then times the pack (the one strided copy
that Shard(0)->Shard(1) costs) against ``dst.copy_(src)`` of the same bytes, both on the GPU,
with CUDA events. Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist

import reshard as rs
from reshard.bench import parse_sizes
from reshard.viz import human_bytes as human


def checks(device: torch.device) -> dict[str, bool]:
    full = torch.arange(7 * 5, dtype=torch.float32, device=device).reshape(7, 5)
    out: dict[str, bool] = {}
    cols = rs.redistribute(full, rs.Shard(0), rs.Shard(1))
    out["redistribute Shard(0)->Shard(1)"] = bool(torch.equal(cols, full)) and cols.device == full.device
    rows = rs.redistribute(full.t().contiguous().t(), rs.Shard(1), rs.Shard(0))
    out["redistribute Shard(1)->Shard(0) (column-major input)"] = bool(torch.equal(rows, full))
    got, counts = rs.all_to_all_v(full, [7])
    out["all_to_all_v"] = bool(torch.equal(got, full)) and counts == [7]
    out["all_gather"] = bool(torch.equal(rs.all_gather(full), full))
    x = full.clone().requires_grad_()
    rs.redistribute(x, rs.Shard(0), rs.Shard(1)).sum().backward()
    out["backward"] = bool(torch.equal(x.grad, torch.ones_like(full)))
    return out


def pack_bandwidth(device: torch.device, nbytes: int, pieces: int = 8, reps: int = 20) -> dict[str, float]:
    """GB/s of the pack ([R, C] -> pieces x [R, C/pieces]) and of a plain device copy."""
    cols = 256 * pieces
    rows = max(1, nbytes // (4 * cols))
    x = torch.rand(rows, cols, device=device)
    packed = torch.empty(pieces, rows, cols // pieces, device=device)
    flat_src, flat_dst = x.reshape(-1), torch.empty(rows * cols, device=device)

    def timed(fn) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    t_pack = timed(lambda: packed.copy_(x.view(rows, pieces, cols // pieces).transpose(0, 1)))
    t_copy = timed(lambda: flat_dst.copy_(flat_src))
    moved = rows * cols * 4
    return {"bytes": moved, "pack_GBps": moved / t_pack / 1e9, "copy_GBps": moved / t_copy / 1e9,
            "pack_over_copy": t_pack / t_copy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,256M")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store_dir = tempfile.mkdtemp(prefix="reshard-gpu-")
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    comm = rs.init(engine="nccl")
    report = {"device": torch.cuda.get_device_name(device), "checks": checks(device), "pack": []}
    for size in parse_sizes(args.sizes):
        report["pack"].append(pack_bandwidth(device, size))
    comm.close()
    shutil.rmtree(store_dir, ignore_errors=True)
    print(f"device: {report['device']}")
    for name, ok in report["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    print(f"  {'size':>10} {'pack GB/s':>10} {'copy GB/s':>10} {'pack/copy':>10}")
    for p in report["pack"]:
        print(f"  {human(p['bytes']):>10} {p['pack_GBps']:>10.1f} {p['copy_GBps']:>10.1f} {p['pack_over_copy']:>9.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
