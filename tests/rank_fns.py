"""Module-level functions that tests run on local ranks (rs.spawn needs importable functions)."""

from __future__ import annotations

import os
import time

import numpy as np

import reshard as rs
from conformance import run_cases  # noqa: F401  (re-exported for tests)
from oracle import pattern, placement_slice


def identity(comm, value=None):
    return (comm.rank, comm.size, comm.engine, value)


def copies(comm, shape, src, dst):
    import torch

    full = torch.from_numpy(pattern(shape, "float32"))
    x = rs.local_shard(full, rs.parse_placement(src), comm.rank, comm.size).contiguous()
    out = rs.redistribute(x, src, dst)
    stats = rs.last_exchange()
    want = torch.from_numpy(np.ascontiguousarray(placement_slice(pattern(shape, "float32"), ("shard", rs.parse_placement(dst).dim), comm.rank, comm.size)))
    return stats, out.data_ptr(), bool(torch.equal(out, want))


def raise_on(comm, bad_rank):
    if comm.rank == bad_rank:
        raise ValueError(f"boom from rank {comm.rank}")
    comm.barrier()  # the others wait in a collective: they must not hang
    return comm.rank


def exit_on(comm, bad_rank):
    if comm.rank == bad_rank:
        os._exit(3)
    x = np.zeros((comm.size * 2, 4), dtype=np.float32)
    rs.all_to_all(x, 0, 1)
    return comm.rank


def hang(comm, seconds):
    time.sleep(seconds)
    return comm.rank


def listening(comm):
    """This rank's listening TCP sockets (address, port) after one exchange."""
    import psutil

    rs.all_to_all(np.zeros((comm.size, 2)), 0, 1)
    conns = psutil.Process().net_connections(kind="inet")
    return [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]


def call_op(comm, op_name, per_rank_kwargs):
    """Call rs.<op_name>(**kwargs for this rank); return ('ok', shape) or (error class, message)."""
    kwargs = dict(per_rank_kwargs[comm.rank] if isinstance(per_rank_kwargs, list) else per_rank_kwargs)
    for key, value in list(kwargs.items()):
        if isinstance(value, tuple) and value and value[0] == "array":
            kwargs[key] = (np.arange(int(np.prod(value[1]))) % 2).astype(value[2] if len(value) > 2 else "float32").reshape(value[1])
    try:
        out = getattr(rs, op_name)(**kwargs)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return "ok", getattr(out, "shape", None)


def unpicklable_result(comm):
    return lambda: None
