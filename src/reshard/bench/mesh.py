"""``reshard bench --mesh``: a layout change on a process mesh, reshard beside PyTorch DTensor
on the same mesh. Besides time, each method's bytes sent per rank: reshard's from its own
counters, DTensor's counted from the functional collectives it issues (a dispatch mode that
reads each collective's input size and group)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def mesh_shape_for(nbytes: int, itemsize: int, src: tuple, mesh_shape: tuple) -> tuple[int, int]:
    """A square-ish global matrix whose shards under ``src`` hold about ``nbytes`` each,
    every dim a multiple of every mesh dim (so DTensor's split rule and the balanced one agree)."""
    from ..planning.layout import Shard

    split = math.prod(mesh_shape[m] for m, p in enumerate(src) if isinstance(p, Shard))
    unit = math.lcm(*mesh_shape) * math.prod(mesh_shape)
    side = max(unit, int(math.sqrt(nbytes / itemsize * split)) // unit * unit)
    return side, side


class SentBytes:
    """Bytes this rank sends in the functional collectives run inside the block (DTensor's)."""

    def __init__(self) -> None:
        self.sent = 0

    def __enter__(self) -> SentBytes:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self
        ops = torch.ops._c10d_functional

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                packet = func._overloadpacket
                if packet in (ops.all_gather_into_tensor,):
                    counter.sent += args[0].numel() * args[0].element_size() * (int(args[1]) - 1)
                elif packet in (ops.reduce_scatter_tensor,):
                    k = int(args[2])
                    counter.sent += args[0].numel() * args[0].element_size() * (k - 1) // k
                elif packet in (ops.all_to_all_single,):
                    nbytes, splits = args[0].numel() * args[0].element_size(), args[2]
                    rows = args[0].shape[0] or 1
                    counter.sent += nbytes - (nbytes // rows) * (min(splits) if splits else 0)
                elif packet in (ops.all_reduce,):
                    counter.sent += 2 * args[0].numel() * args[0].element_size()  # an upper bound: 2 (k-1)/k
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def mesh_methods(case: Any, nbytes: int, wanted: list[str], mesh_shape: tuple, src: tuple,
                 dst: tuple) -> tuple[dict[str, tuple[Any, Any]], dict[str, int]]:
    """method -> (run, verify) for the change src -> dst on a mesh, and the bytes DTensor sends
    (reshard's come from its counters on the first run)."""
    import torch

    from .. import ops
    from ..mesh import Mesh
    from ..planning.layout import Partial, Replicate, local_shard
    from .check import count_wrong

    comm = case.comm
    mesh = Mesh(mesh_shape, comm=comm)
    shape = mesh_shape_for(nbytes, case.np_dtype.itemsize, src, mesh_shape)
    full = (np.arange(shape[0] * shape[1]) % 251).astype(case.np_dtype).reshape(shape)
    x = torch.from_numpy(np.ascontiguousarray(local_shard(full, src, mesh.coord, mesh_shape)))
    want = np.asarray(local_shard(full, dst, mesh.coord, mesh_shape))
    methods: dict[str, tuple[Any, Any]] = {}
    sent: dict[str, int] = {}

    def ours(check: bool | None) -> Any:
        return ops.redistribute(x, src, dst, mesh=mesh, global_shape=shape, check=check)

    methods["reshard"] = (lambda: ours(None), lambda out: count_wrong(out, want))
    methods["reshard-nocheck"] = (lambda: ours(False), lambda out: count_wrong(out, want))
    if "dtensor" in wanted and comm.engine != "mpi":
        import logging

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Partial as TorchPartial

        from ..redistribution import torch_placements

        logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
        device_mesh = init_device_mesh("cpu", mesh_shape)
        # DTensor's own placements, a split order as its _StridedShard
        as_torch = [p for p in torch_placements(dst, mesh_shape) if not isinstance(p, TorchPartial)]
        dt = DTensor.from_local(x, device_mesh, torch_placements(src, mesh_shape),
                                run_check=False, shape=shape, stride=(shape[1], 1))
        if len(as_torch) == len(dst) and all(not isinstance(p, Partial) for p in src):
            def theirs() -> Any:
                return dt.redistribute(device_mesh, as_torch).to_local()

            with SentBytes() as counted:
                theirs()
            methods["dtensor"] = (theirs, lambda out: count_wrong(out, want))
            sent["dtensor"] = counted.sent
    del Replicate
    return {m: v for m, v in methods.items() if m in wanted}, sent
