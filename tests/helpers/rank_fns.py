"""Module-level functions that tests run on local ranks (rs.spawn needs importable functions)."""

from __future__ import annotations

import os
import time

import numpy as np

import reshard as rs

from .conformance import run_cases  # noqa: F401  (re-exported for tests)
from .oracle import pattern, placement_slice


def default_check(comm) -> bool:
    """The communicator's default for the cross-rank agreement check."""
    return comm.check


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


def pid_then_hang(comm, folder, seconds):
    """Write this rank's pid to ``folder/rank<r>`` (written whole, then renamed), then sleep."""
    path = os.path.join(folder, f"rank{comm.rank}")
    with open(path + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".part", path)
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
        kwargs[key] = make_input(value)
    fn = rs
    for part in op_name.split("."):  # "moe.dispatch"
        fn = getattr(fn, part)
    try:
        out = fn(**kwargs)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return "ok", getattr(out, "shape", None)


def unpicklable_result(comm):
    return lambda: None


def make_input(value):
    """Decode a picklable description of an input: ("array", shape[, dtype[, "masked"]]) for numpy,
    ("tensor", shape, dtype[, variant]) for torch (variant: "sparse", "meta", "grad")."""
    if isinstance(value, tuple) and value and value[0] == "ids":
        return np.asarray(value[1], dtype=np.int64)
    if not (isinstance(value, tuple) and value and value[0] in ("array", "tensor")):
        return value
    shape, dtype = value[1], value[2] if len(value) > 2 else "float32"
    if value[0] == "array":
        if dtype == "object":
            return np.empty(shape, dtype=object)
        x = (np.arange(int(np.prod(shape))) % 2).astype(dtype).reshape(shape)
        return np.ma.masked_equal(x, 0) if len(value) > 3 and value[3] == "masked" else x
    import torch

    variant = value[3] if len(value) > 3 else None
    t = (torch.arange(int(np.prod(shape))) % 3).to(getattr(torch, dtype)).reshape(shape)
    if variant == "sparse":
        return t.to_sparse()
    if variant == "meta":
        return t.to("meta")
    if variant == "grad":
        return t.requires_grad_()
    return t


def die_mid_exchange(comm, victim, how, outdir, check=True):
    """``victim`` dies (or raises) before its part of an exchange; survivors record what they
    saw (with ``check=False`` the second call is a replay that goes straight to the messages)."""
    import signal
    import time as _time

    comm.check = check
    x = np.zeros((comm.size * 1000, 64), dtype=np.float32)
    rs.all_to_all(x, 0, 1)  # everyone is connected and healthy first
    if comm.rank == victim:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "exit":
            os._exit(7)
        raise RuntimeError("user code failed")
    start = _time.monotonic()
    try:
        rs.all_to_all(x, 0, 1)
        outcome = "no error"
    except rs.ReshardError as exc:
        outcome = type(exc).__name__
    with open(os.path.join(outdir, f"rank{comm.rank}"), "w") as f:
        f.write(f"{outcome} {_time.monotonic() - start:.1f}")
    return outcome


def soak(comm, count, seed=0):
    """``count`` random collectives, each checked against numpy; returns (wrong, fd growth, RSS growth MiB)."""
    import psutil

    from .oracle import balanced, starts, take

    rng = np.random.default_rng(seed)  # same seed everywhere: every rank draws the same ops
    proc = psutil.Process()
    wrong, fds0, rss0 = 0, None, None
    for i in range(count):
        if i == count // 10:  # after warm-up
            fds0, rss0 = proc.num_fds(), proc.memory_info().rss
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(v) for v in rng.integers(0, 9, size=ndim))
        full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        d = int(rng.integers(0, ndim))
        e = int(rng.integers(0, ndim))
        sizes = balanced(shape[d], comm.size)
        mine = take(full, d, starts(sizes)[comm.rank], starts(sizes)[comm.rank] + sizes[comm.rank])
        kind = int(rng.integers(0, 3))
        if kind == 0:
            out = rs.redistribute(mine, rs.Shard(d), rs.Shard(e))
            esz = balanced(shape[e], comm.size)
            want = take(full, e, starts(esz)[comm.rank], starts(esz)[comm.rank] + esz[comm.rank])
        elif kind == 1:
            out, want = rs.all_gather(mine, d), full
        else:
            out = rs.reduce_scatter(full, d)
            want = take(full, d, starts(sizes)[comm.rank], starts(sizes)[comm.rank] + sizes[comm.rank]) * comm.size
        wrong += int(not (out.shape == want.shape and np.array_equal(out, want)))
    return wrong, proc.num_fds() - fds0, (proc.memory_info().rss - rss0) / 2**20


def rank_processes(root=None):
    """Live rank processes under ``root`` (default: this process): the fork server's children."""
    import psutil

    root = root or psutil.Process()
    found = []
    for p in root.children(recursive=True):
        try:
            parent = p.parent()
            if parent is not None and parent.pid != root.pid and "forkserver" in " ".join(parent.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def call_ops(comm, calls):
    """call_op for each (op_name, kwargs) in ``calls``, in order, on one communicator."""
    return [call_op(comm, op, kwargs) for op, kwargs in calls]


def late_rank(comm, late, seconds):
    """Every rank but ``late`` enters a collective; ``late`` sleeps instead."""
    if comm.rank == late:
        time.sleep(seconds)
        return "slept"
    rs.all_to_all(np.zeros((comm.size, 2)), 0, 1)
    return "exchanged"


def big_int8_exchange(comm, per_rank, concat_dim):
    """Every rank sends all of its ``per_rank`` int8 elements to rank 0 (so rank 0 receives
    pieces and a buffer past 2**31 bytes); values depend on (source rank, column), so every
    received piece is checked at many rows."""
    n, r = comm.size, comm.rank
    rows = per_rank // 1024
    x = np.empty((rows, 1024), dtype=np.int8)
    x[...] = (np.arange(1024, dtype=np.int64) + 7 * r).astype(np.int8)[None, :]
    out = rs.all_to_all(x, 0, concat_dim, split_sizes=[rows] + [0] * (n - 1), check=False)
    del x
    if r != 0:
        return out.size == 0, out.nbytes
    ok = out.shape == ((rows, 1024 * n) if concat_dim == 1 else (rows * n, 1024))
    for i in range(n):
        want = (np.arange(1024, dtype=np.int64) + 7 * i).astype(np.int8)
        piece = out[:, i * 1024 : (i + 1) * 1024] if concat_dim == 1 else out[i * rows : (i + 1) * rows]
        ok = ok and bool((piece[::4099] == want).all() and (piece[-1:] == want).all())
    return ok, out.nbytes


def page_faults_per_call(comm, nbytes, calls):
    """Minor page faults of each Shard(0)->Shard(1) call on a float32 shard of ``nbytes``,
    the result dropped before the next call (as a training step drops last step's)."""
    import resource

    import torch

    cols = 256 * comm.size
    x = torch.arange(nbytes // 4, dtype=torch.float32).reshape(-1, cols)
    faults = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = rs.redistribute(x, rs.Shard(0), rs.Shard(1))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del y
    return faults


def pack_bytes_first_call(comm, shape, one_call):
    """Bytes the first Shard(0)->Shard(1) call took beyond its result (the pack buffer), and
    whether the result was right; ``one_call``: gloo's single all_to_all_single path."""
    import torch

    comm.primitives.pairwise = not one_call
    full = pattern(shape, "float32")
    x = torch.from_numpy(rs.local_shard(full, rs.Shard(0), comm.rank, comm.size))
    out = rs.redistribute(x, rs.Shard(0), rs.Shard(1))
    stats = rs.last_exchange()
    want = placement_slice(full, ("shard", 1), comm.rank, comm.size)
    return stats.allocated_bytes - out.numel() * 4, x.numel() * 4, bool(np.array_equal(out.numpy(), want))


def user_message_beside_reshard(comm):
    """Rank 1 posts its own irecv (tag 0) from rank 0 before a reshard exchange and rank 0
    sends that message after it: the exchange must neither take nor disturb it."""
    import torch
    import torch.distributed as dist

    mine = torch.full((64,), -1.0)
    pending = dist.irecv(mine, src=0) if comm.rank == 1 else None
    x = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6) + 100 * comm.rank
    out = rs.all_to_all(x, 1, 0)
    if comm.rank == 0:
        dist.send(torch.arange(64, dtype=torch.float32), dst=1)
    if pending is not None:
        pending.wait()
    full = np.concatenate([np.arange(48, dtype=np.float32).reshape(8, 6) + 100 * r for r in range(comm.size)])
    want = full[:, 3 * comm.rank : 3 * comm.rank + 3]
    return bool(np.array_equal(out.numpy(), want)), mine.tolist()


def executed_steps(comm, shape, pairs, arrays):
    """For each (src, dst) placement pair: redistribute this rank's part of a pattern tensor
    five times (the first call; a checked replay; the first unchecked call, whose signature
    differs; its replay, which leaves a hot replay; the hot replay) and report per call the steps it ran as ``(collective, bytes_sent,
    bytes_received)`` and whether it says it replayed, whether every call's result matched
    numpy, and the last result."""
    full = pattern(shape, "float32")
    out = []
    for src, dst in pairs:
        s_pl, d_pl = rs.parse_placement(src), rs.parse_placement(dst)
        x = rs.local_shard(full, s_pl, comm.rank, comm.size)
        if isinstance(s_pl, rs.Partial) and comm.rank != 0:
            x = np.zeros_like(x)  # a partial sum whose ranks add up to the full tensor
        x = np.ascontiguousarray(x)
        if arrays == "torch":
            import torch

            x = torch.from_numpy(x)
        seen, results = [], []
        for check in (True, True, False, False, False):
            y = rs.redistribute(x, s_pl, d_pl, check=check)
            st = rs.last_exchange()
            seen.append(([(s.collective, s.bytes_sent, s.bytes_received) for s in st.steps], st.replayed))
            results.append(np.asarray(y).copy())
        if isinstance(d_pl, rs.Partial):
            ok = None if all(np.array_equal(r, results[0]) for r in results) else False  # the parent sums them
        else:
            want = placement_slice(full, ("shard", d_pl.dim) if isinstance(d_pl, rs.Shard) else ("replicate",),
                                   comm.rank, comm.size)
            ok = all(r.shape == want.shape and bool(np.array_equal(r, want)) for r in results)
        out.append((seen, ok, results[-1]))
    return out


def mismatch_on_rank_1(comm):
    """Every rank raises MismatchError: rank 1's dim 1 differs."""
    x = np.zeros((2, 4 + (comm.rank == 1)), dtype=np.float32)
    return rs.all_to_all(x, split_dim=0, concat_dim=0)


def skip_second_collective(comm, sleep_s):
    """Rank 1 skips the second collective (and idles), so the others wait in it."""
    x = np.zeros((4, 4), dtype=np.float32)
    rs.all_gather(x)
    if comm.rank == 1:
        time.sleep(sleep_s)
        return None
    rs.all_to_all(x, split_dim=0, concat_dim=1)
    return None


def exit_with_message(comm, bad_rank, message):
    """``bad_rank`` writes ``message`` to stderr and leaves with exit code 3; the others wait."""
    import sys

    if comm.rank == bad_rank:
        print(message, file=sys.stderr, flush=True)
        os._exit(3)
    comm.barrier()
    return comm.rank


def nocheck_disagreement(comm, case):
    """A collective with check=False whose ranks disagree; returns the result's shape if it ran."""
    r = comm.rank
    if case == "all_to_all":
        y = rs.all_to_all(np.zeros((2, 6 - (r == 2)), np.float32), split_dim=1, concat_dim=0, check=False)
    elif case == "reduce_scatter":  # the same bytes per piece, a different tensor
        y = rs.reduce_scatter(np.ones((4, 6) if r == 1 else (6, 4), np.float32), 0, check=False)
    elif case == "redistribute":
        g = (6, 7) if r == 1 else (6, 6)
        y = rs.redistribute(np.ones((2, g[1]), np.float32), rs.Shard(0), rs.Shard(1), global_shape=g, check=False)
    else:  # all_to_all_v: rank 1 expects two rows from rank 0, which sends one
        recv = [2] + [1] * (comm.size - 1) if r == 1 else [1] * comm.size
        y, _ = rs.all_to_all_v(np.ones((comm.size, 2), np.float32), [1] * comm.size, recv_counts=recv, check=False)
    return tuple(y.shape)


def nocheck_change_after_replay(comm, sleep_s):
    """check=False, global_shape given: two agreed calls (the second a replay), then rank 1 alone
    changes the global shape. Returns every result it got, so a wrong one would show."""
    got = []
    for step in range(3):
        cols = 7 if (step == 2 and comm.rank == 1) else 6
        g = (2 * comm.size, cols)
        x = np.ones((2, cols), np.float32)
        got.append(tuple(rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=g, check=False).shape))
    return got


def nocheck_shapes_needed(comm, change):
    """check=False, global_shape None (each replay needs its peers' shard lengths): two agreed
    calls (the second a replay), then a third where ``change`` says who changes the local shape:
    "alone" (rank 1, which no rank may accept) or "all" (every rank, a new signature). Returns
    (each result's shape and whether it equals the oracle) or the error's class and text."""
    got = []
    for step in range(3):
        rows = 3 if (step == 2 and change == "all") else 2
        cols = 7 if (step == 2 and change == "alone" and comm.rank == 1) else 6
        full = pattern((rows * comm.size, cols), "float32")
        x = np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)) if cols == 6 else \
            np.ones((rows, cols), np.float32)
        try:
            y = rs.redistribute(x, rs.Shard(0), rs.Shard(1), check=False)
        except rs.ReshardError as exc:
            got.append((type(exc).__name__, str(exc)))
            break
        got.append((tuple(y.shape), bool(np.array_equal(y, rs.local_shard(full, rs.Shard(1), comm.rank, comm.size)))))
    return got


def mesh_subs(comm, shape, engine_check):
    """On a mesh of ``shape``: for every mesh dim, an all_to_all and an all_gather on that dim's
    sub-communicator (check on), compared with numpy; returns (coord, sub ranks and sizes, ok)."""
    mesh = rs.Mesh(shape, comm=comm)
    report = []
    for m in range(len(shape)):
        sub = mesh.sub(m)
        members = mesh.group_of(m)
        k = sub.size
        full = pattern((k * 2, k * 3), "float32")  # one tensor per sub-group, rows sharded over it
        x = rs.local_shard(full, rs.Shard(0), sub.rank, k)
        y = rs.all_to_all(x, split_dim=1, concat_dim=0, comm=sub)
        g = rs.all_gather(x, 0, comm=sub)
        ok = bool(np.array_equal(y, rs.local_shard(full, rs.Shard(1), sub.rank, k)) and np.array_equal(g, full))
        report.append((sub.rank, sub.size, members, ok))
    return mesh.coord, report


def mesh_partial_input(full, placements, coord, mesh_shape):
    """This rank's part of ``full`` laid out as ``placements``, with non-trivial partial sums:
    over the ranks along the Partial(sum) mesh dims, the first holds full - (G-1) * 7 and the
    other G-1 hold 7 (max and min partials hold the values themselves)."""
    sums = [m for m, p in enumerate(placements) if isinstance(p, rs.Partial) and p.op == "sum"]
    whole = [rs.Replicate() if isinstance(p, rs.Partial) else p for p in placements]
    base = np.array(rs.local_shard(full, whole, coord, mesh_shape))
    if not sums:
        return base
    group = int(np.prod([mesh_shape[m] for m in sums]))
    first = all(coord[m] == 0 for m in sums)
    return base - (group - 1) * 7 if first else np.full_like(base, 7)


def mesh_pairs(comm, mesh_shape, shape, pairs, arrays):
    """redistribute on a mesh for every (src, dst) pair (each twice: the second a replay);
    returns per pair the result, the steps run and whether the replay matched."""
    mesh = rs.Mesh(mesh_shape, comm=comm)
    full = pattern(shape, "int64")
    out = []
    for src, dst in pairs:
        src, dst = rs.parse_placements(src), rs.parse_placements(dst)
        x = mesh_partial_input(full, src, mesh.coord, mesh_shape)
        if arrays == "torch":
            import torch

            x = torch.from_numpy(np.ascontiguousarray(x))
        y1 = rs.redistribute(x, src, dst, mesh=mesh)
        steps = [(s.collective, s.bytes_sent, s.bytes_received) for s in rs.last_exchange().steps]
        y2 = rs.redistribute(x, src, dst, mesh=mesh)
        same = bool(np.array_equal(np.asarray(y1), np.asarray(y2)))
        out.append((np.asarray(y1).copy(), steps, same))
    return mesh.coord, out


def dtensor_pairs(comm, mesh_shape, shape, pairs):
    """For each (src, dst): a DTensor laid out as src by torch, redistributed by reshard and by
    DTensor itself; returns whether the local shards (and the full tensors) agree."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    device_mesh = init_device_mesh("cpu", mesh_shape)
    full = torch.from_numpy(pattern(shape, "float32"))
    out = []
    for src, dst in pairs:
        src_t = [_torch_placement(p) for p in rs.parse_placements(src)]
        dst_t = [_torch_placement(p) for p in rs.parse_placements(dst)]
        dt = distribute_tensor(full, device_mesh, src_t)
        ours = rs.redistribute(dt, dst=dst_t)
        theirs = dt.redistribute(device_mesh, dst_t)
        same_local = isinstance(ours, DTensor) and tuple(ours.to_local().shape) == tuple(theirs.to_local().shape) and (
            any(type(p).__name__ == "Partial" for p in dst_t) or torch.equal(ours.to_local(), theirs.to_local()))
        same_full = torch.equal(ours.full_tensor(), theirs.full_tensor())
        out.append((src, dst, bool(same_local), bool(same_full), list(ours.placements) == list(theirs.placements)))
    return out


def _torch_placement(p):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Shard(p.dim) if isinstance(p, rs.Shard) else Partial(p.op) if isinstance(p, rs.Partial) else Replicate()


def mesh_grads(comm, mesh_shape, shape, pairs):
    """For each (src, dst) on a mesh: x.grad of sum(redistribute(x) * W) against the
    one-process answer, W restricted to x's region (a Partial read as Replicate)."""
    import torch

    mesh = rs.Mesh(mesh_shape, comm=comm)
    W = torch.from_numpy(pattern(shape, "float64")) / 7
    full = torch.from_numpy(pattern(shape, "float64"))
    ok = []
    for src, dst in pairs:
        s_pl, d_pl = rs.parse_placements(src), rs.parse_placements(dst)
        x = torch.from_numpy(mesh_partial_input(full.numpy(), s_pl, mesh.coord, mesh_shape)).requires_grad_(True)
        y = rs.redistribute(x, s_pl, d_pl, mesh=mesh)
        as_rep = lambda pl: tuple(rs.Replicate() if isinstance(p, rs.Partial) else p for p in pl)  # noqa: E731
        (y * rs.local_shard(W, as_rep(d_pl), mesh.coord, mesh_shape)).sum().backward()
        want = rs.local_shard(W, as_rep(s_pl), mesh.coord, mesh_shape)
        ok.append((src, dst, bool(torch.equal(x.grad, want))))
    return ok


def mesh_bad_input(comm, case):
    """A redistribute on a 2x2 mesh that some rank calls wrongly; returns the error class name."""
    mesh = rs.Mesh((2, 2), comm=comm)
    full = pattern((8, 8), "float32")
    src, dst = (rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0))
    x = rs.local_shard(full, src, mesh.coord, mesh.shape)
    kwargs = {}
    if case == "dst differs" and comm.rank == 3:
        dst = (rs.Replicate(), rs.Shard(0))
    elif case == "too few placements" and comm.rank == 1:
        dst = (rs.Shard(1),)
    elif case == "shard too big" and comm.rank == 2:
        x = np.zeros((5, 4), np.float32)
    elif case == "global_shape wrong" and comm.rank == 0:
        kwargs["global_shape"] = (8, 9)
    elif case == "check off, dst differs":
        kwargs["check"] = False
        if comm.rank == 3:
            dst = (rs.Replicate(), rs.Shard(0))
    try:
        rs.redistribute(x, src, dst, mesh=mesh, **kwargs)
    except rs.ReshardError as exc:
        return type(exc).__name__
    return "returned"


def grad_input_all_to_all(comm):
    """all_to_all of a tensor that requires grad: (input unchanged, still requires grad with no
    grad yet, result on the tape, result equal to numpy's answer, input's grad after backward)."""
    import torch

    x = (torch.arange(18, dtype=torch.float32).reshape(6, 3) + 100 * comm.rank).requires_grad_()
    before = x.detach().clone()
    out = rs.all_to_all(x, split_dim=1, concat_dim=0)
    # rank r receives column r of every rank's x, stacked in rank order
    want = np.concatenate([(np.arange(18, dtype=np.float32).reshape(6, 3) + 100 * i)[:, comm.rank:comm.rank + 1]
                           for i in range(comm.size)])
    untouched = bool(torch.equal(x.detach(), before)) and x.requires_grad and x.grad is None
    on_tape, right = out.requires_grad, bool(np.array_equal(out.detach().numpy(), want))
    (out * (comm.rank + 1)).sum().backward()
    # column j of x went to rank j, whose loss weighs it by j + 1
    grad_right = bool(np.array_equal(x.grad.numpy(), np.tile(np.arange(1, 4, dtype=np.float32), (6, 1))))
    return untouched, on_tape, right, grad_right


def executed_and_planned(comm, shape, pairs, mesh_shape=None):
    """For each (src, dst): the steps this rank ran (collective, bytes sent, bytes received)
    and the steps ``reshard plan --rank`` gives it, on the world or on a mesh."""
    from reshard.tools.rank_report import rank_report

    mesh = rs.Mesh(mesh_shape, comm=comm) if mesh_shape else None
    full = pattern(shape, "float32")
    out = []
    for src, dst in pairs:
        if mesh is None:
            s_pl, d_pl = rs.parse_placement(src), rs.parse_placement(dst)
            x = np.ascontiguousarray(rs.local_shard(full, s_pl, comm.rank, comm.size))
            rs.redistribute(x, s_pl, d_pl)
            planned = rank_report(shape, s_pl, d_pl, comm.rank, ranks=comm.size)
        else:
            s_pl, d_pl = rs.parse_placements(src), rs.parse_placements(dst)
            x = np.ascontiguousarray(rs.local_shard(full, s_pl, mesh.coord, mesh_shape))
            rs.redistribute(x, s_pl, d_pl, mesh=mesh)
            planned = rank_report(shape, s_pl, d_pl, comm.rank, mesh=mesh_shape)
        ran = [(s.collective, s.bytes_sent, s.bytes_received) for s in rs.last_exchange().steps]
        out.append((src, dst, ran, [(s["collective"], s["sent_bytes"], s["received_bytes"]) for s in planned["steps"]]))
    return out


def every_op_steps(comm, arrays):
    """Each public collective once, on inputs whose sizes differ per rank: what it returned and
    the steps it ran (collective, bytes out, bytes in), as ``rs.last_exchange()`` reports them."""
    n, r = comm.size, comm.rank

    def arr(a):
        a = np.ascontiguousarray(a)
        if arrays == "torch":
            import torch

            return torch.from_numpy(a)
        return a

    def steps():
        return [(s.collective, s.bytes_sent, s.bytes_received) for s in rs.last_exchange().steps]

    out = {}
    x = arr(pattern((n + 2, 3 + r), "float32") + r)
    y = rs.all_to_all(x, 0, 1)
    out["all_to_all"] = (np.asarray(y).tolist(), steps())
    sizes = [(j + 1) % 3 for j in range(n)]
    x = arr(pattern((sum(sizes), 2), "float32") + 10 * r)
    y = rs.all_to_all(x, 0, 0, split_sizes=sizes)
    out["all_to_all split_sizes"] = (np.asarray(y).tolist(), steps())
    send = [(r + j) % 3 for j in range(n)]
    x = arr(pattern((sum(send), 4), "float32") + 100 * r)
    y, got = rs.all_to_all_v(x, send)
    out["all_to_all_v"] = (np.asarray(y).tolist(), steps())
    x = arr(pattern((2, r + 1), "float32") + r)
    out["all_gather"] = (np.asarray(rs.all_gather(x, 1)).tolist(), steps())
    g = rs.gather(arr(pattern((r, 3), "float32")), 0, dst=n - 1)
    out["gather"] = (None if g is None else np.asarray(g).tolist(), steps())
    x = arr(pattern((7, 3), "float32") * (r + 1))
    out["reduce_scatter"] = (np.asarray(rs.reduce_scatter(x, 0, "max")).tolist(), steps())
    out["all_reduce"] = (np.asarray(rs.all_reduce(arr(pattern((5, 2), "float32") + r), "sum")).tolist(), steps())
    tokens = arr(pattern((6, 4), "float32") + r)
    ids = np.array([[(t + r) % (2 * n), (t * 3 + 1) % (2 * n)] for t in range(6)], dtype=np.int64)
    inputs, handle = rs.moe.dispatch(tokens, ids, 2 * n)
    dispatched = steps()
    back = rs.moe.combine(inputs, handle)
    out["moe"] = ((np.asarray(inputs).tolist(), np.asarray(back).tolist()), (dispatched, steps()),
                  (handle.segment_send, handle.segment_recv))
    return out


def mesh_exchange_copies(comm, mesh_shape, shape, src, dst):
    """One mesh redistribute and its replay: (result, pack copies, unpack copies) of each."""
    mesh = rs.Mesh(mesh_shape, comm=comm)
    full = pattern(shape, "float64")
    s_pl, d_pl = rs.parse_placements(src), rs.parse_placements(dst)
    x = mesh_partial_input(full, s_pl, mesh.coord, mesh_shape)
    out = []
    for _ in range(2):
        y = rs.redistribute(np.ascontiguousarray(x), s_pl, d_pl, mesh=mesh)
        stats = rs.last_exchange()
        out.append((np.asarray(y).tolist(), stats.pack_copies, stats.unpack_copies))
    return mesh.coord, out


def fft_full(case):
    """The full input array of an FFT case (the same on every rank and in the parent)."""
    rng = np.random.default_rng(case["seed"])
    shape = case["in_shape"]
    real = rng.standard_normal(shape)
    a = real if case["kind"] == "rfft" else real + 1j * rng.standard_normal(shape)
    if case["kind"] == "irfft":  # a Hermitian input: the rfftn of a real array
        a = np.fft.rfftn(rng.standard_normal(case["real_shape"]), axes=case["axes"])
    dtype = {"float64": np.float64, "float32": np.float32}[case["dtype"]]
    if np.iscomplexobj(a):
        return a.astype(np.complex128 if dtype is np.float64 else np.complex64)
    return a.astype(dtype)


def fft_cases(comm, cases):
    """Each case: this rank's piece of the transform and of the round trip, and the layout."""
    out = []
    for case in cases:
        mesh = rs.Mesh(case["mesh"], comm=comm)
        full = fft_full(case)
        src = rs.parse_placements(case["src"])
        region = rs.layout.mesh_region(full.shape, src, mesh.coord, mesh.shape)
        x = np.ascontiguousarray(full[tuple(slice(a, b) for a, b in region)])
        if case["arrays"] == "torch":
            import torch

            x = torch.from_numpy(x)
        fn = {"fft": rs.fft.fftn, "ifft": rs.fft.ifftn, "rfft": rs.fft.rfftn}.get(case["kind"])
        kw = {"axes": case["axes"], "norm": case["norm"], "dst": case["dst"]}
        if fn is None:
            y = rs.fft.irfftn(x, mesh, src, s=case["s"], **kw)
        else:
            y = fn(x, mesh, src, **kw)
        layout = rs.parse_placements(case["dst"]) if case["dst"] else rs.fft.output_layout(
            full.shape, mesh, src, case["axes"], real=case["kind"] in ("rfft", "irfft"),
            inverse=case["kind"] in ("ifft", "irfft"))
        back = None
        if case["kind"] == "fft":  # the round trip: back to the input's layout
            back = np.asarray(rs.fft.ifftn(y, mesh, layout, axes=case["axes"], norm=case["norm"], dst=src))
        out.append((mesh.coord, np.asarray(y), back, repr(layout)))  # a Layout's repr keeps its order
    return out


def fft_bad_argument(comm, bad_rank, name="norm", value="bogus"):
    """Rank ``bad_rank`` (or "every" rank) passes ``value`` as the argument ``name`` (by default
    a norm numpy does not know); the others pass valid arguments."""
    mesh = rs.Mesh((2, 2), comm=comm)
    x = np.ones((2, 3, 4), dtype=np.complex128)
    kw = {"norm": "ortho", "dst": None}
    fn = rs.fft.fftn
    if name == "s":  # irfftn of (4, 6, 4) over axes 1 and 2: lengths 6, then 6 or 7
        fn, kw["s"] = rs.fft.irfftn, (6, 7)
    if comm.rank == bad_rank or bad_rank == "every":
        kw[name] = value
    if "x" in kw:  # the input itself, by its torch dtype
        import torch

        x = torch.ones(x.shape, dtype=getattr(torch, kw.pop("x")))
    if "mesh" in kw:
        mesh = kw.pop("mesh")
    try:
        fn(x, mesh, "S(0),S(1)", **kw)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return None


def fft_irfftn_last_axis_one(comm, s=None):
    """irfftn of a (4, 6, 1) half spectrum laid out S(0), S(1) on a 2x2 mesh, with ``s`` or
    without: ("ok", this rank's piece equals numpy's) or the error's class and text."""
    mesh = rs.Mesh((2, 2), comm=comm)
    full = np.arange(24, dtype=np.complex128).reshape(4, 6, 1) * (1 + 0.5j)
    x = rs.local_shard(full, (rs.Shard(0), rs.Shard(1)), mesh.coord, (2, 2))
    try:
        y = rs.fft.irfftn(x, mesh, "S(0),S(1)", s=s, dst="S(0),S(1)")
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    want = rs.local_shard(np.fft.irfftn(full, s=s), (rs.Shard(0), rs.Shard(1)), mesh.coord, (2, 2))
    return "ok", bool(np.allclose(y, want, rtol=1e-12, atol=1e-12))


FFT_DIFFERENCES = {  # field: (the call every rank makes, what rank ``odd`` changes)
    "norm": (dict(norm="backward"), dict(norm="ortho")),
    "axes": (dict(axes=(1, 2)), dict(axes=(1,))),
    "transform": (dict(), dict(transform="ifftn")),
    "dtype": (dict(), dict(dtype=np.complex64)),
    "dst": (dict(), dict(dst="S(1)")),
    "src": (dict(src="S(0)", shape=(4, 4, 4)), dict(src="S(1)", shape=(4, 4, 4))),
    "s": (dict(transform="irfftn", s=(3, 9)), dict(transform="irfftn", s=(3, 8))),
}


def fft_different_arguments(comm, field, odd):
    """Every rank transforms its piece of a (4, 3, 5) array on a (4,) mesh (S(0): its own
    axes 1 and 2 are whole, so no layout changes unless asked); rank ``odd`` passes another
    valid value of ``field`` (``FFT_DIFFERENCES``). Returns the error this rank saw, or None."""
    common, changed = FFT_DIFFERENCES[field]
    call = dict(transform="fftn", norm="backward", axes=(1, 2), dst=None, src="S(0)", shape=(4, 3, 5),
                dtype=np.complex128, s=None)
    call.update(common)
    if comm.rank == odd:
        call.update(changed)
    mesh = rs.Mesh((4,), comm=comm)
    full = np.arange(np.prod(call["shape"]), dtype=np.float64).reshape(call["shape"]) * (1 + 0.5j)
    region = rs.layout.mesh_region(full.shape, rs.parse_placements(call["src"]), mesh.coord, mesh.shape)
    x = np.ascontiguousarray(full[tuple(slice(a, b) for a, b in region)], dtype=call["dtype"])
    fn = getattr(rs.fft, call["transform"])
    kw = dict(axes=call["axes"], dst=call["dst"], norm=call["norm"])
    try:
        fn(x, mesh, call["src"], s=call["s"], **kw) if call["transform"] == "irfftn" else fn(x, mesh, call["src"], **kw)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return None


def fft_empty_axis(comm, axes):
    """fftn of a (4, 0, 5) array on a (4,) mesh along ``axes``: the piece, or the error."""
    x = np.ones((1, 0, 5), dtype=np.complex128)
    try:
        return "ok", rs.fft.fftn(x, rs.Mesh((4,), comm=comm), "S(0)", axes=axes).shape
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)


def redistribute_with_a_bad_mesh_on_one_rank(comm, bad_rank, how):
    """Every rank but ``bad_rank`` redistributes on a 2x2 mesh; that one passes something that
    is not a mesh (``how="not a mesh"``) or none with the mesh's placements (``how="none"``).
    Returns the error each rank saw, or None."""
    mesh = rs.Mesh((2, 2), comm=comm)
    x = np.ones((2, 2, 4))
    if comm.rank == bad_rank:
        mesh = None if how == "none" else how
    try:
        rs.redistribute(x, [rs.Shard(0), rs.Shard(1)], [rs.Shard(1), rs.Shard(0)], mesh=mesh)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return None


def bad_comm_on_one_rank(comm, op, replay_first):
    """Rank 2 passes ``op`` a string as its communicator, the others none (the process's);
    with ``replay_first``, two good calls make and replay the plan before. Returns the error
    each rank saw, or None."""
    x = np.ones((6, 6), np.float32)
    calls = {
        "all_to_all": lambda c: rs.all_to_all(x, 0, 1, comm=c),
        "all_to_all_v": lambda c: rs.all_to_all_v(x, [2, 2, 2], comm=c),
        "all_reduce": lambda c: rs.all_reduce(x, comm=c),
        "redistribute": lambda c: rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm=c, global_shape=(18, 6)),
        "moe.dispatch": lambda c: rs.moe.dispatch(x, np.zeros(6, np.int64), num_experts=3, comm=c),
        "async all_to_all": lambda c: rs.all_to_all(x, 0, 1, comm=c, async_op=True).wait(),
    }
    try:
        if replay_first:
            calls[op](None)
            calls[op](None)
        calls[op]("not a comm" if comm.rank == 2 else None)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return None


def fft_scipy_backend(comm):
    """fftn with backend='scipy': the piece, or the error where scipy is not installed."""
    mesh = rs.Mesh((4,), comm=comm)
    full = np.arange(4 * 6 * 5, dtype=np.float64).reshape(4, 6, 5) + 0.5j
    x = np.ascontiguousarray(full[comm.rank : comm.rank + 1])
    try:
        return "ok", np.asarray(rs.fft.fftn(x, mesh, "S(0)", backend="scipy")), rs.fft.output_layout(full.shape, mesh, "S(0)")
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc), None


def two_level_against_flat(comm, cases):
    """Per case (shape, split_dim, concat_dim): all_to_all hierarchical (twice: the second a
    replay) equal to flat; the steps it ran; and on torch the same gradient both ways."""
    import torch

    n, r = comm.size, comm.rank
    out = []
    for shape, s, c in cases:
        mine = [*shape[:c], max(0, shape[c] - r), *shape[c + 1:]]
        x = (np.arange(int(np.prod(mine)), dtype=np.float32) + 1000 * r).reshape(mine)
        flat = rs.all_to_all(x, s, c, algorithm="flat")
        same = all(np.array_equal(rs.all_to_all(x, s, c, algorithm="hierarchical"), flat) for _ in range(2))
        ran = [step.collective for step in rs.last_exchange().steps]
        grads = []
        for algorithm in ("flat", "hierarchical"):
            xt = torch.from_numpy(x.copy()).requires_grad_(True)
            y = rs.all_to_all(xt, s, c, algorithm=algorithm)
            (y * torch.arange(float(y.numel())).reshape(y.shape)).sum().backward()
            grads.append(xt.grad)
        out.append((same, ran, torch.equal(*grads)))
    errors = []
    for kwargs in ({"algorithm": "fastest"},):
        try:
            rs.all_to_all(np.zeros((2 * n, 2), np.float32), **{"split_dim": 0, "concat_dim": 1, **kwargs})
            errors.append("no error")
        except rs.ReshardError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return out, errors


def return_early(comm, early_rank, path):
    """``early_rank`` returns after one collective; the others go on to a second, which it
    never joins. It writes when it returned to ``path``."""
    x = np.zeros((comm.size, 6), np.float32)
    rs.all_gather(x)
    if comm.rank == early_rank:
        with open(path, "w") as f:
            f.write(repr(time.time()))
        return "returned"
    return rs.redistribute(x, rs.Shard(0), rs.Shard(1)).shape


def dtensor_given_src(comm, src_by_rank):
    """A row-sharded DTensor redistributed to columns with ``src_by_rank[rank]`` passed as src
    (None: left out): the result's local shard, or the error's class and message."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    device_mesh = init_device_mesh("cpu", (comm.size,))
    full = torch.from_numpy(pattern((6, 4), "float32"))
    dt = distribute_tensor(full, device_mesh, [Shard(0)])
    src = src_by_rank[comm.rank]
    try:
        out = rs.redistribute(dt, dst=rs.Shard(1)) if src is None else rs.redistribute(dt, src, rs.Shard(1))
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return "ok", out.to_local().numpy()


def dtensor_spec_past_dims(comm):
    """A Spec that splits a dim the DTensor lacks, as dst of one DTensor and of the second of a
    list: each call's error class and message on this rank."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    device_mesh = init_device_mesh("cpu", (2, 2))
    dt = distribute_tensor(torch.zeros(4, 6), device_mesh, [Shard(0), Shard(1)])
    out = []
    for call in (lambda: rs.redistribute(dt, dst=rs.Spec(None, None, (0, 1))),
                 lambda: rs.redistribute([dt, dt], dst=[rs.Spec(0), rs.Spec(None, None, (1, 0))])):
        try:
            call()
            out.append(("ok", ""))
        except rs.ReshardError as exc:
            out.append((type(exc).__name__, str(exc)))
    return out


def warnings_from_read_only_inputs(comm):
    """Every collective (and MoE's dispatch and combine) on read-only numpy inputs, twice each
    (first call and replay): the warnings raised meanwhile, as text."""
    import warnings

    def ro(a):
        a = np.array(a)
        a.setflags(write=False)
        return a

    rows = ro(np.arange(comm.size * 2 * 6, dtype=np.float32).reshape(comm.size * 2, 6))
    ids = ro(np.arange(8).reshape(4, 2) % (2 * comm.size))
    tokens = ro(np.ones((4, 3), np.float32))
    calls = [lambda: rs.redistribute(rows, rs.Shard(0), rs.Shard(1)), lambda: rs.all_to_all(rows, 0, 1),
             lambda: rs.all_gather(rows), lambda: rs.reduce_scatter(rows, dim=0), lambda: rs.all_reduce(rows),
             lambda: rs.gather(rows), lambda: rs.all_to_all_v(rows, [2] * comm.size),
             lambda: rs.moe.combine(*rs.moe.dispatch(tokens, ids, num_experts=2 * comm.size)),
             lambda: rs.redistribute(rows, (rs.Shard(0),), (rs.Replicate(),), mesh=rs.Mesh((comm.size,)))]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for call in calls:
            call()
            call()
    return [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in seen]


def collectives_loaded(comm):
    """Whether the modules a first collective needs were loaded before the job ran."""
    import sys

    return all(name in sys.modules for name in ("reshard.ops", "reshard.redistribution", "reshard.execution.execute", "reshard.planning.planner"))


def spec_pairs(comm, cases, by_name):
    """For each (mesh shape, shape, src entries, dst entries, src piece): the piece
    ``redistribute`` gives between two Specs (by mesh dim name or number) on that mesh of the
    job's ranks; returned for the caller to check."""
    meshes = {}
    out = []
    for mesh_shape, shape, src, dst, piece in cases:
        mesh = meshes.get(mesh_shape)
        if mesh is None:
            mesh = meshes[mesh_shape] = rs.Mesh(mesh_shape, names=("a", "b"), comm=comm)

        def spec(entries):
            def one(e):
                if e is None:
                    return None
                named = [n if by_name else ("a", "b").index(n) for n in (e if isinstance(e, list) else [e])]
                return tuple(named) if isinstance(e, list) else named[0]

            return rs.Spec(*[one(e) for e in entries])

        x = np.ascontiguousarray(piece)
        out.append(rs.redistribute(x, spec(src), spec(dst), mesh=mesh, global_shape=shape))
    return out


def ordered_pairs(comm, mesh_shape, cases):
    """For each (shape, src Spec, dst Spec): this rank's input cut from the full pattern (a
    Partial source: the values on the first rank of each group, zeros elsewhere), moved by
    ``redistribute`` with the global shape learned from the ranks; the results returned."""
    mesh = rs.Mesh(mesh_shape, comm=comm)
    out = []
    for shape, src, dst in cases:
        full = pattern(shape, "int64")
        x = np.ascontiguousarray(rs.local_shard(full, src, mesh.coord, mesh_shape))
        out.append(rs.redistribute(x, src, dst, mesh=mesh))
    return out


def dtensor_ordered(comm, shape):
    """DTensors whose dim 0 is split by mesh dim 1 first (``_StridedShard``), in and out of
    ``redistribute``: [(what, local equal, full equal, placements equal)] against DTensor's own
    redistribute, distribute_tensor and full_tensor."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    device_mesh = init_device_mesh("cpu", (2, 2))
    full = torch.from_numpy(pattern(shape, "float32"))
    strided = [_StridedShard(0, split_factor=2), Shard(0)]
    out = []
    even = all(n % 4 == 0 for n in shape[:1])
    if even:  # DTensor itself distributes _StridedShard over even lengths only
        dt = distribute_tensor(full, device_mesh, strided)
        for dst in ([Shard(1), Shard(0)], [Replicate(), Shard(1)], [Shard(0), Shard(0)]):
            ours, theirs = rs.redistribute(dt, dst=dst), dt.redistribute(device_mesh, dst)
            out.append((f"in {dst}", torch.equal(ours.to_local(), theirs.to_local()),
                        torch.equal(ours.full_tensor(), full), list(ours.placements) == list(theirs.placements)))
        want = distribute_tensor(full, device_mesh, strided)
    plain = distribute_tensor(full, device_mesh, [Shard(1), Replicate()])
    ours = rs.redistribute(plain, dst=rs.Spec((1, 0), None))
    out.append(("out Spec((1, 0), None)", torch.equal(ours.to_local(), want.to_local()) if even else None,
                torch.equal(ours.full_tensor(), full), list(ours.placements) == strided))
    back = rs.redistribute(ours, dst=[Shard(1), Replicate()])  # its order read back from _StridedShard
    out.append(("back", torch.equal(back.to_local(), plain.to_local()), torch.equal(back.full_tensor(), full), True))
    return out


def world_specs(comm, shape):
    """``redistribute`` on the world with Specs (objects and text) for src and dst: each rank's
    piece of every change among S(0), S(1) and R, as numpy arrays."""
    full = pattern(shape, "float64")
    specs = {"S(0)": rs.Spec(0, None), "S(1)": "Spec(None, 0)", "R": rs.Spec(None, None)}
    out = {}
    for a, src in specs.items():
        for b, dst in specs.items():
            x = np.ascontiguousarray(rs.local_shard(full, src, comm.rank, comm.size))
            out[(a, b)] = np.asarray(rs.redistribute(x, src, dst))
    return out


def dtensor_own_placements(comm, shape):
    """A DTensor's ``src`` and ``dst`` written in DTensor's own placements, ``_StridedShard``
    included: [(what, local equal, full equal, placements equal)] against DTensor's own
    ``redistribute`` and ``distribute_tensor`` (local None where DTensor cannot distribute it)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    device_mesh = init_device_mesh("cpu", (2, 2))
    full = torch.from_numpy(pattern(shape, "float64"))
    strided = [_StridedShard(0, split_factor=2), Shard(0)]
    even = shape[0] % 4 == 0  # DTensor itself distributes _StridedShard over even lengths only
    out = []
    plain = distribute_tensor(full, device_mesh, [Shard(1), Replicate()])
    ours = rs.redistribute(plain, dst=strided)
    want = distribute_tensor(full, device_mesh, strided).to_local() if even else None
    out.append(("dst strided", None if want is None else torch.equal(ours.to_local(), want),
                torch.equal(ours.full_tensor(), full), list(ours.placements) == strided))
    back = rs.redistribute(ours, src=list(ours.placements), dst=[Shard(1), Replicate()])
    out.append(("src its own placements", torch.equal(back.to_local(), plain.to_local()),
                torch.equal(back.full_tensor(), full), list(back.placements) == [Shard(1), Replicate()]))
    many = rs.redistribute([plain, plain.redistribute(device_mesh, [Replicate(), Shard(0)])], dst=strided)
    out += [("list dst strided", None if want is None else torch.equal(o.to_local(), want),
             torch.equal(o.full_tensor(), full), list(o.placements) == strided) for o in many]
    return out


def arguments_that_differ(comm, case, check):
    """A redistribute whose arguments differ on one rank: the error's class and text."""
    x = np.zeros((4, 4), np.float32)
    src, dst, kwargs = rs.Shard(0), rs.Shard(1), {}
    if case == "dst on rank 0" and comm.rank == 0:
        dst = rs.Shard(0)  # src == dst there: nothing to move on that rank alone
    if case == "global_shape on rank 0" and comm.rank == 0:
        kwargs["global_shape"] = (16, 4)
    if case == "mesh dst on rank 3":
        mesh = rs.Mesh((2, 2))
        src, dst = (rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0)) if comm.rank != 3 else rs.Spec(None, (1, 0))
        kwargs["mesh"] = mesh
    try:
        rs.redistribute(x, src, dst, check=check, **kwargs)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return "returned", ""


def collective_input(rank: int, shape, seed: int):
    """Rank ``rank``'s float64 input for a gradient case: halves, so every sum is exact."""
    return np.random.default_rng(seed * 64 + rank).integers(-8, 8, size=shape).astype(np.float64) / 2


def loss_weights(rank: int, shape):
    """The weights of rank ``rank``'s loss ``sum(w * y)``: its result's gradient."""
    return (rank + 1) + np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) / 4


def gathered_and_summed_gradients(comm, cases):
    """Each case ``(op, shape, dim, reduce_op, seed, async_op)``: x (this rank's input, requiring
    grad) through the op twice (a first call and its replay), each result's loss
    ``sum(loss_weights * y)`` taken backward; returns per case both calls' x.grad, or None where
    the result is not on the tape."""
    import torch

    out = []
    for op, shapes, dim, reduce_op, seed, async_op in cases:
        grads = []
        for _ in range(2):
            x = torch.from_numpy(collective_input(comm.rank, shapes[comm.rank], seed)).requires_grad_()
            if op == "all_gather":
                y = rs.all_gather(x, dim, async_op=async_op)
            elif op == "reduce_scatter":
                y = rs.reduce_scatter(x, dim, reduce_op, async_op=async_op)
            else:
                y = rs.all_reduce(x, reduce_op, async_op=async_op)
            y = y.wait() if async_op else y
            if not y.requires_grad:
                grads.append(None)
                continue
            (torch.from_numpy(loss_weights(comm.rank, tuple(y.shape))) * y).sum().backward()
            grads.append(x.grad.numpy().copy())
        out.append(grads)
    return out


def rows_to_columns_in_dtype(comm, dtype, bad_rank=None):
    """The row -> column all_to_all of a 4 x 6 matrix held in numpy ``dtype`` (on ``bad_rank``
    only, where given, float32 elsewhere); returns (error class, message) or the result's dtype
    and whether it equals numpy's columns."""
    full = np.arange(4 * 6, dtype=np.float64).reshape(4, 6)
    rows = full[2 * comm.rank: 2 * comm.rank + 2]
    x = rows.astype(dtype if bad_rank in (None, comm.rank) else np.float32)
    try:
        got = rs.all_to_all(x, split_dim=1, concat_dim=0)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)
    return got.dtype.str, bool(np.array_equal(got.astype(np.float64), full[:, 3 * comm.rank: 3 * comm.rank + 3]))


def lazy_conjugates_move_their_values(comm):
    """Each op on a complex tensor, then on its lazy conjugate (``x.conj()``, a replay of the
    same signature) and on the lazy negation ``x.conj().imag``; for each, whether the result
    equals the op on the same values held plainly (``resolve_conj``/``resolve_neg``)."""
    import torch

    n, r = comm.size, comm.rank
    base = torch.arange(4 * 3 * n, dtype=torch.float64).reshape(4, 3 * n) + 100 * r
    z = (base + 1j * (base + 0.5)).to(torch.complex128)
    ops = {
        "all_to_all": lambda t: rs.all_to_all(t, 1, 0),
        "all_gather": lambda t: rs.all_gather(t, 1),
        "all_reduce": lambda t: rs.all_reduce(t),
        "all_to_all_v": lambda t: rs.all_to_all_v(t, [4 // n + (1 if j < 4 % n else 0) for j in range(n)])[0],
        "redistribute": lambda t: rs.redistribute(t, rs.Shard(0), rs.Shard(1)),
        "list": lambda t: rs.redistribute([t, t], rs.Shard(0), rs.Shard(1))[0],
        "started": lambda t: rs.all_to_all(t, 1, 0, async_op=True).wait(),
    }
    out = {}
    for name, op in ops.items():
        ok = []
        for lazy in (z, z.conj(), z.conj().imag):
            got = op(lazy)
            want = op(lazy.resolve_conj().resolve_neg().clone())
            ok.append(bool(torch.equal(got.resolve_conj().resolve_neg(), want)))
        out[name] = ok
    return out


def raises_a_long_message(comm, rank=1, lines=500):
    """Rank ``rank`` raises a ValueError whose message has ``lines`` numbered lines; the others
    wait for it in a collective."""
    if comm.rank == rank:
        raise ValueError("\n".join(f"message line {i}" for i in range(lines)))
    rs.all_reduce(np.ones(2))


def spawns_a_job(comm, engine):
    """This rank starts a job of two ranks of its own on ``engine``; their ranks, or the error."""
    try:
        return rs.spawn(_own_rank, 2, engine, timeout=60)
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)


def _own_rank(comm):
    return comm.rank


def traceback_files(comm):
    """The files in the tracebacks of errors reshard's calls raise on this rank (a bad argument,
    shapes the check finds unbalanced, a started call, the FFT, a mesh), by default and with
    ``RESHARD_TRACEBACK=1``: {(call, setting): [file, ...] or None where nothing was raised}."""
    import traceback

    x = np.ones((4, 6) if comm.rank != 1 else (5, 6), np.float32)
    calls = {
        "dim out of range": lambda: rs.all_to_all(np.ones((4, 4)), 0, 5),
        "shapes unbalanced": lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1)),
        "started call": lambda: rs.redistribute(x, rs.Shard(0), rs.Shard(1), async_op=True).wait(),
        "fft": lambda: rs.fft.fftn(np.ones((2, 2), complex), rs.Mesh((comm.size,), comm=comm), "S(0)", norm="bogus"),
        "mesh": lambda: rs.Mesh((comm.size + 1,), comm=comm),
    }
    out = {}
    for full in ("0", "1"):
        os.environ["RESHARD_TRACEBACK"] = full
        for name, call in calls.items():
            try:
                call()
                out[name, full] = None
            except rs.ReshardError as exc:
                out[name, full] = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    del os.environ["RESHARD_TRACEBACK"]
    return out


def on_a_mesh_dim(comm, case):
    """A bad input on a mesh built over a 2x2 mesh's "tp" communicator: the error's text here."""
    mesh = rs.Mesh((2, 2), ("dp", "tp"))
    tp = rs.Mesh((2,), ("tp",), comm=mesh.sub("tp"))
    x = np.zeros((4, 4), np.float64 if case == "dtype on world rank 2" and comm.rank == 2 else np.float32)
    dst = rs.Shard(5) if case == "bad dim on world rank 3" and comm.rank == 3 else rs.Shard(1)
    try:
        rs.redistribute(x, rs.Shard(0), dst, mesh=tp)
    except rs.ReshardError as exc:
        return str(exc)
    return "ok"


def different_collectives(comm):
    """Rank 0 calls all_to_all where the others call all_gather."""
    x = np.zeros((comm.size, 4), np.float32)
    if comm.rank == 0:
        return rs.all_to_all(x, 1, 0)
    return rs.all_gather(x)
