"""Rank functions for the same-host shared-memory tests (rs.spawn needs importable functions)."""

from __future__ import annotations

import os

import numpy as np

import reshard as rs

from .oracle import pattern


def _peers(comm) -> list[int] | None:
    local = comm.primitives.local
    return None if local is None else sorted(local.peers)


def exchanges_through_shared_memory(comm, sizes):
    """all_to_all and a mesh change at growing then shrinking sizes (the outbox grows under
    them), each compared with numpy slices of the whole array; the peers reached through
    shared memory."""
    import torch

    n = comm.size
    wrong, replays = [], []
    for rows in sizes:
        full = pattern((rows * n, 3 * n + 1), "float32")
        x = torch.from_numpy(np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), comm.rank, n)))
        for _ in range(2):  # the second call is a replay
            y = rs.all_to_all(x, split_dim=1, concat_dim=0)
            if not np.array_equal(y.numpy(), rs.local_shard(full, rs.Shard(1), comm.rank, n)):
                wrong.append(("all_to_all", rows))
        replays.append(rs.last_exchange().replayed)
        back = rs.all_to_all(y, split_dim=0, concat_dim=1)  # contiguous pieces, copied into the outbox
        if not np.array_equal(back.numpy(), x.numpy()):
            wrong.append(("back", rows))
    return _peers(comm), wrong, replays


def settings_per_rank(comm, env_per_rank, shape):
    """A sub-communicator made after each rank set its own environment (``env_per_rank[rank]``):
    the peers each reaches through shared memory and from what size; a redistribute on it,
    compared with numpy slices."""
    import torch

    for name, value in env_per_rank.get(comm.rank, {}).items():
        os.environ[name] = value
    mesh = rs.Mesh((1, comm.size), comm=comm)
    sub = mesh.sub(1)
    full = pattern(shape, "float32")
    x = torch.from_numpy(np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), sub.rank, sub.size)))
    y = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm=sub)
    ok = np.array_equal(y.numpy(), rs.local_shard(full, rs.Shard(1), sub.rank, sub.size))
    local = sub.primitives.local
    return _peers(sub), None if local is None else local.smallest, ok


def notes_as_gloo_messages(comm, sizes):
    """On a sub-communicator made where memory notes are not offered (as off x86-64), every
    message through the outbox (RESHARD_SHM_MIN_BYTES=0) with its note sent by gloo: the
    peers, whether a mailbox was made, and the all_to_all results that differ from numpy's."""
    import torch

    from reshard.engines import shm

    shm.usable_here = lambda: False
    os.environ["RESHARD_SHM_MIN_BYTES"] = "0"
    sub = rs.Mesh((1, comm.size), comm=comm).sub(1)
    n, wrong = sub.size, []
    for rows in sizes:
        full = pattern((rows * n, 2 * n + 3), "float32")
        x = torch.from_numpy(np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), sub.rank, n)))
        for _ in range(2):
            y = rs.all_to_all(x, split_dim=1, concat_dim=0, comm=sub)
            if not np.array_equal(y.numpy(), rs.local_shard(full, rs.Shard(1), sub.rank, n)):
                wrong.append(rows)
    local = sub.primitives.local
    return _peers(sub), local is not None and local.mailbox is not None, wrong


def empty_messages(comm):
    """Messages of no bytes between same-host peers (rows of width 0, counts that are not): the
    received shapes and counts of an all_to_all_v there and back, then a rank's ordinary call."""
    n, r = comm.size, comm.rank
    x = np.zeros((2 * n + r, 0), dtype=np.float32)
    counts = [2] * n
    counts[r] += r
    got, recv_counts = rs.all_to_all_v(x, counts)
    back, _ = rs.all_to_all_v(got, recv_counts, recv_counts=counts)
    full = pattern((4 * n, 3), "float32")
    y = rs.all_to_all(np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), r, n)), split_dim=1, concat_dim=0)
    return got.shape, recv_counts, back.shape, bool(np.array_equal(y, rs.local_shard(full, rs.Shard(1), r, n)))
