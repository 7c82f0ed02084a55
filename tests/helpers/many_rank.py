"""Rank functions for many tensors in one ``redistribute`` call: each returns what it got, for
the test process to check against numpy slices of the full arrays and against separate calls."""

from __future__ import annotations

import numpy as np

import reshard as rs
from tests.helpers.oracle import pattern


def _inputs(cases, coord, mesh_shape):
    out = []
    for shape, dtype, src, _ in cases:
        full = pattern(shape, dtype)
        out.append(np.ascontiguousarray(rs.local_shard(full, src, coord, mesh_shape)))
    return out


def many_and_separate(comm, mesh_shape, cases, as_torch, repeats=2):
    """``cases``: (shape, dtype, src, dst) per tensor, src/dst one per mesh dim (a 1-tuple on a
    world); ``as_torch``: False, True or "mixed". The list call (``repeats`` times) and the separate calls on the same inputs:
    (the list's results per repeat, whether each repeat was a replay, the separate results,
    the list call's steps, its per-tensor steps)."""
    world = len(mesh_shape) == 1
    mesh = None if world else rs.Mesh(mesh_shape, comm=comm)
    coord = (comm.rank,) if world else mesh.coord
    xs = _inputs(cases, coord, mesh_shape)
    if as_torch:  # True: every input a tensor; "mixed": every other one (numpy beside torch)
        import torch

        xs = [torch.from_numpy(x) if as_torch is True or k % 2 else x for k, x in enumerate(xs)]
    srcs = [c[2][0] if world else c[2] for c in cases]
    dsts = [c[3][0] if world else c[3] for c in cases]
    runs, replayed = [], []
    for _ in range(repeats):
        ys = rs.redistribute(xs, srcs, dsts, mesh=mesh)
        stats = rs.last_exchange()
        runs.append([np.asarray(y).copy() for y in ys])
        replayed.append(stats.replayed)
    steps = [s.collective for s in stats.steps]
    per_tensor = [[s.collective for s in t.steps] for t in stats.tensors]
    separate = [np.asarray(rs.redistribute(x, s, d, mesh=mesh)).copy() for x, s, d in zip(xs, srcs, dsts)]
    return runs, replayed, separate, steps, per_tensor


def many_grads_and_started(comm, shapes):
    """Torch tensors on the tape, S(0) -> S(1) in one call: the gradients of sum(y_i * w_i)
    against those of the separate calls, and a started call's results against the blocking one."""
    import torch

    xs = [torch.from_numpy(rs.local_shard(pattern(s, "float64"), rs.Shard(0), comm.rank, comm.size).copy())
          for s in shapes]
    weights = [torch.from_numpy(pattern(s, "float64")) / 5 for s in shapes]
    grads = []
    for together in (True, False):
        leaves = [x.clone().requires_grad_(True) for x in xs]
        ys = rs.redistribute(leaves, rs.Shard(0), rs.Shard(1)) if together else [
            rs.redistribute(x, rs.Shard(0), rs.Shard(1)) for x in leaves]
        loss = sum((y * rs.local_shard(w, rs.Shard(1), comm.rank, comm.size)).sum() for y, w in zip(ys, weights))
        loss.backward()
        grads.append([leaf.grad.numpy().copy() for leaf in leaves])
    blocking = rs.redistribute(xs, rs.Shard(0), rs.Shard(1))
    started = rs.redistribute(xs, rs.Shard(0), rs.Shard(1), async_op=True).wait()
    same = all(torch.equal(a, b) for a, b in zip(blocking, started))
    return grads, same


def many_bad(comm, case):
    """One bad input among many: the error's class and text on this rank."""
    xs = [np.zeros((4, 6), np.float32) for _ in range(3)]
    src, dst = rs.Shard(0), rs.Shard(1)
    if case == "dtype on rank 1" and comm.rank == 1:
        xs[2] = xs[2].astype(np.float64)
    if case == "bad dim on rank 0":
        dst = [rs.Shard(1), rs.Shard(5) if comm.rank == 0 else rs.Shard(1), rs.Shard(1)]
    if case == "Spec past the dims on rank 2":
        dst = [rs.Shard(1), rs.Shard(1), rs.Spec(None, None, 0) if comm.rank == 2 else rs.Shard(1)]
    if case == "count on rank 1" and comm.rank == 1:
        xs = xs[:2]
    if case.startswith("middle tensor missing on rank 1"):
        xs[2] = np.zeros((8, 3), np.float32)
        if comm.rank == 1:
            del xs[1]
    if case == "one tensor on rank 1" and comm.rank == 1:
        xs = xs[0]
    if case.startswith("empty list on rank 1") and comm.rank == 1:
        xs = []
    if case == "layout on rank 1":
        src = [rs.Shard(0), rs.Shard(1) if comm.rank == 1 else rs.Shard(0), rs.Shard(0)]
    gshape = None
    if case == "global_shape differs on one rank":
        gshape = [(12, 6), (12 + (comm.rank == 2), 6), (12, 6)]
    if case == "not an array on rank 0" and comm.rank == 0:
        xs[1] = None
    if case == "placements tuple on a world":
        src = [(rs.Shard(0),)] * 3
    if case == "src list length":
        src = [rs.Shard(0), rs.Shard(0)]
    if case in ("unsplit dim on rank 2", "replicated shape on rank 2") and comm.rank == 2:
        xs[1] = np.zeros((4, 7), np.float32)
    if case == "replicated shape on rank 2":
        src, dst = rs.Replicate(), rs.Shard(0)
    try:
        rs.redistribute(xs, src, dst, global_shape=gshape, check=False if case.endswith("check off") else None)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def many_dtensors(comm):
    """DTensors in one call against DTensor's own redistribute of each; tensors of two meshes refused."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    device_mesh = init_device_mesh("cpu", (2, 2))
    fulls = [torch.from_numpy(pattern(s, "float32")) for s in ((8, 6), (5, 7), (3, 4, 2))]
    srcs = [[Shard(0), Shard(1)], [Shard(1), Replicate()], [Replicate(), Shard(2)]]
    dsts = [[Shard(1), Shard(0)], [Shard(0), Shard(0)], [Shard(0), Replicate()]]
    dts = [distribute_tensor(f, device_mesh, s) for f, s in zip(fulls, srcs)]
    ours = rs.redistribute(dts, dst=dsts)
    out = [(torch.equal(o.to_local(), d.redistribute(device_mesh, p).to_local()), torch.equal(o.full_tensor(), f),
            list(o.placements) == p) for o, d, p, f in zip(ours, dts, dsts, fulls)]
    other = init_device_mesh("cpu", (4,))
    mixed = [dts[0], distribute_tensor(fulls[1], other, [Shard(0)])]
    try:
        rs.redistribute(mixed, dst=[Replicate(), Replicate()])
        refused = "ok"
    except rs.ReshardError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return out, refused


def one_placement_list_for_all(comm):
    """One layout for every tensor written as a list of placements, one per mesh dim (as DTensor
    writes them): DTensors and plain tensors on a 2x2 mesh, two and three tensors (two: as many
    as mesh dims). Per tensor: (local equal to the oracle, placements or type as given); then
    what a list of three layouts for two tensors raises."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tests.helpers.oracle import balanced, starts

    def piece(full, placements, coord):  # each tensor dim split by one mesh dim at most
        index = [slice(None)] * full.ndim
        for m, p in enumerate(placements):
            if isinstance(p, rs.Shard):
                sizes = balanced(full.shape[p.dim], 2)
                index[p.dim] = slice(starts(sizes)[coord[m]], starts(sizes)[coord[m]] + sizes[coord[m]])
        return full[tuple(index)]

    device_mesh = init_device_mesh("cpu", (2, 2))
    fulls = [torch.from_numpy(pattern(s, "float32")) for s in ((8, 6), (5, 7), (6, 3))]
    out = []
    for count in (2, 3):
        dts = [distribute_tensor(f, device_mesh, [Shard(1), Shard(0)]) for f in fulls[:count]]
        moved = rs.redistribute(dts, dst=[Shard(0), Replicate()])
        out += [(torch.equal(o.to_local(), distribute_tensor(f, device_mesh, [Shard(0), Replicate()]).to_local()),
                 list(o.placements) == [Shard(0), Replicate()]) for o, f in zip(moved, fulls)]
    mesh = rs.Mesh((2, 2))
    src, dst = [rs.Shard(1), rs.Shard(0)], [rs.Shard(0), rs.Replicate()]
    for count in (2, 3):
        xs = [np.ascontiguousarray(piece(f.numpy(), src, mesh.coord)) for f in fulls[:count]]
        moved = rs.redistribute(xs, src, dst, mesh=mesh)
        out += [(np.array_equal(o, piece(f.numpy(), dst, mesh.coord)),
                 type(o) is np.ndarray) for o, f in zip(moved, fulls)]
    try:
        rs.redistribute(xs[:2], src, [dst, dst, dst], mesh=mesh)
        refused = "ok"
    except rs.ReshardError as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return out, refused


def planned_once(comm, cases, copies):
    """Each of ``cases`` (shape, dtype, src, dst on a world) ``copies`` times in one list call,
    the planner's functions counted (the real ones run): (how many times each was called, each
    result equal to numpy's part of the full array)."""
    from reshard.planning import planner

    calls = {"exchange_boxes": 0, "redistribute": 0}
    real = {name: getattr(planner, name) for name in calls}

    def counted(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return real[name](*args, **kwargs)
        return call

    xs, srcs, dsts, fulls = [], [], [], []
    for shape, dtype, src, dst in cases * copies:
        full = pattern(shape, dtype)
        xs.append(np.ascontiguousarray(rs.local_shard(full, src, comm.rank, comm.size)))
        srcs.append(src)
        dsts.append(dst)
        fulls.append(full)
    try:
        for name in calls:
            setattr(planner, name, counted(name))
        ys = rs.redistribute(xs, srcs, dsts)
    finally:
        for name, fn in real.items():
            setattr(planner, name, fn)
    same = [np.array_equal(y, rs.local_shard(f, d, comm.rank, comm.size)) for y, f, d in zip(ys, fulls, dsts)]
    return calls, same


def lists_without_torch(comm):
    """Lists of numpy arrays where torch cannot be imported: on the world (first call, replay,
    a started call, a Partial among them) and on a 1x2 mesh. (each result equal to numpy's
    part of the full array, whether torch was loaded)."""
    import sys

    S, R, P = rs.Shard, rs.Replicate, rs.Partial
    cases = [((8, 6), "float32", S(0), S(1)), ((5, 3), "int64", S(1), R()), ((6, 4), "float64", P(), S(0))]
    fulls = [pattern(shape, dtype) for shape, dtype, _, _ in cases]
    xs = [np.ascontiguousarray(rs.local_shard(f, src, comm.rank, comm.size)) for f, (_, _, src, _) in zip(fulls, cases)]
    srcs, dsts = [c[2] for c in cases], [c[3] for c in cases]
    # a Partial's local_shard is the whole array on rank 0 and zeros elsewhere: the sum is the array
    wants = [rs.local_shard(f, d, comm.rank, comm.size) for f, d in zip(fulls, dsts)]
    same = []
    for started in (False, False, True):
        ys = rs.redistribute(xs, srcs, dsts, async_op=started)
        ys = ys.wait() if started else ys
        same += [np.array_equal(y, w) for y, w in zip(ys, wants)]
    mesh = rs.Mesh((1, comm.size), comm=comm)
    ys = rs.redistribute(xs[:2], [(R(), S(0)), (R(), S(1))], [(R(), S(1)), (R(), R())], mesh=mesh)
    same += [np.array_equal(ys[0], wants[0]), np.array_equal(ys[1], fulls[1])]
    return same, "torch" in sys.modules
