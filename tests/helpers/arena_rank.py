"""Rank functions for the shared arena's tests: results against numpy on the full array, with
the arena on and off, and what a peer sees when an input changes or a rank ends."""

from __future__ import annotations

import os

import numpy as np

import reshard as rs
from reshard.engines import arena as arena_mod


def in_arena(a) -> bool:
    """Whether ``a`` (numpy or a CPU torch tensor) lies in this process's arena."""
    from reshard.execution.arrays import numpy_view

    return arena_mod.locate(numpy_view(a)) is not None


def _as(engine, a):
    if engine == "mpi":
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def _np(a):
    from reshard.execution.arrays import numpy_view

    return np.array(numpy_view(a))


def changes(comm, engine, cases, mesh_shape=None):
    """Each case (global shape, dtype name, src, dst, seed): the result with the arena on,
    with it off (``arena=False``), and numpy's part of the full array, as bytes; whether each
    result lies in the arena; the steps of the call with it on; whether that result holds any
    element. On a mesh, src/dst are placement tuples or Specs."""
    mesh = rs.Mesh(mesh_shape, comm=comm) if mesh_shape is not None else None
    size = comm.size
    rows = []
    for shape, dtype, src, dst, seed in cases:
        full = (np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)
        if mesh is None:
            mine = rs.local_shard(full, src, comm.rank, size)
            on = rs.redistribute(_as(engine, mine), src, dst, comm)
            steps = [step.collective for step in rs.last_exchange().steps]
            off = rs.redistribute(_as(engine, mine), src, dst, comm, arena=False)
            want = rs.local_shard(full, dst, comm.rank, size)
        else:
            from reshard.planning.layout import mesh_region, parse_placements

            def part(placements, full=full):
                region = mesh_region(full.shape, parse_placements(placements, len(mesh_shape)), mesh.coord, mesh_shape)
                return np.ascontiguousarray(full[tuple(slice(a, b) for a, b in region)])

            on = rs.redistribute(_as(engine, part(src)), src, dst, mesh=mesh)
            steps = [step.collective for step in rs.last_exchange().steps]
            off = rs.redistribute(_as(engine, part(src)), src, dst, mesh=mesh, arena=False)
            want = part(dst)
        rows.append((_np(on).tobytes(), _np(off).tobytes(), np.ascontiguousarray(want).tobytes(), in_arena(on),
                     in_arena(off), steps, on.shape != () and np.asarray(_np(on)).size > 0))
    return rows


def chain(comm, engine, n, calls):
    """S(0) -> S(1) -> S(0) ... ``calls`` times, each input the previous result; per call: the
    result equals numpy's, it lies in the arena, and the copies it packed (0 once the input
    is an earlier result: the peers read it in place)."""
    full = np.arange(n * n, dtype=np.float32).reshape(n, n)
    x = _as(engine, rs.local_shard(full, rs.Shard(0), comm.rank, comm.size))
    layouts = [rs.Shard(0), rs.Shard(1)]
    out = []
    for k in range(calls):
        src, dst = layouts[k % 2], layouts[(k + 1) % 2]
        x = rs.redistribute(x, src, dst, comm)
        stats = rs.last_exchange()
        want = rs.local_shard(full, dst, comm.rank, comm.size)
        out.append((bool(np.array_equal(_np(x), want)), in_arena(x), stats.pack_copies, stats.unpack_copies))
    return out


def from_empty(comm, engine, n):
    """The input made by ``rs.empty``/``rs.empty_like``: no copy packed, the result right."""
    import torch

    full = np.arange(n * n, dtype=np.float32).reshape(n, n)
    mine = rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)
    x = rs.empty(mine.shape, np.float32 if engine == "mpi" else torch.float32, comm=comm)
    x[...] = _as(engine, mine)
    y = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
    first = rs.last_exchange().pack_copies
    z = rs.empty_like(mine if engine == "mpi" else torch.from_numpy(mine.copy()), comm=comm)
    z[...] = _as(engine, mine)
    rs.redistribute(z, rs.Shard(0), rs.Shard(1), comm)
    second = rs.last_exchange().pack_copies
    ordinary = _as(engine, mine.copy())
    rs.redistribute(ordinary, rs.Shard(0), rs.Shard(1), comm)
    third = rs.last_exchange().pack_copies
    return (bool(np.array_equal(_np(y), rs.local_shard(full, rs.Shard(1), comm.rank, comm.size))),
            in_arena(x), in_arena(z), first, second, third)


def input_changed_after(comm, engine, n):
    """Each rank overwrites its input right after the call returns and then changes its
    result in place and passes it on: the peers' results hold the values of the time of
    each call."""
    full = np.arange(n * n, dtype=np.float32).reshape(n, n)
    x = rs.empty((n // comm.size, n), np.float32)
    x[...] = rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)
    x = _as(engine, x) if engine != "mpi" else x
    y = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
    x[...] = _as(engine, np.full(x.shape, -1, np.float32))  # after the call: no peer may see it
    comm.barrier()
    first = bool(np.array_equal(_np(y), rs.local_shard(full, rs.Shard(1), comm.rank, comm.size)))
    y *= 2  # in place: the next call moves the new values
    z = rs.redistribute(y, rs.Shard(1), rs.Shard(0), comm)
    second = bool(np.array_equal(_np(z), 2 * rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)))
    return first, second, in_arena(y)


def outlives(comm, engine, n):
    """A result stays right after many more blocks are taken from the arena and after the
    communicator is closed."""
    full = np.arange(n * n, dtype=np.float32).reshape(n, n)
    y = rs.redistribute(_as(engine, rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)), rs.Shard(0),
                        rs.Shard(1), comm)
    want = rs.local_shard(full, rs.Shard(1), comm.rank, comm.size)
    more = [rs.empty((1 << 20,), np.uint8) for _ in range(64)]  # 64 MiB more of the arena
    for i, block in enumerate(more):
        block[:] = i % 251
    after_growth = bool(np.array_equal(_np(y), want))
    comm.close()
    return after_growth, bool(np.array_equal(_np(y), want)), in_arena(y)


def dies_while_read(comm, victim, outdir, n):
    """``victim`` ends its process where its peers wait on it in an exchange that reads in
    place (a replay with the check off goes straight to the exchange); each survivor writes
    what it raised."""
    comm.check = False
    x = rs.empty((n // comm.size, n), np.float32)
    x[...] = comm.rank
    rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm, (n, n))  # the link is made and used once
    if comm.rank == victim:
        os._exit(7)
    try:
        rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm, (n, n))
        outcome = "no error"
    except rs.ReshardError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(outdir, f"rank{comm.rank}"), "w") as f:
        f.write(outcome)
    return outcome


def transforms(comm, engine, shape):
    """fftn, ifftn and rfftn of one array on a 2x2 mesh (pencils): each result's bytes and
    whether it lies in the arena."""
    mesh = rs.Mesh((2, 2), comm=comm)
    rng = np.random.default_rng(7)
    full = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    src = (rs.Shard(0), rs.Shard(1))
    from reshard.planning.layout import mesh_region

    region = mesh_region(full.shape, src, mesh.coord, (2, 2))
    mine = np.ascontiguousarray(full[tuple(slice(a, b) for a, b in region)])
    out = []
    for result in (rs.fft.fftn(mine, mesh, src), rs.fft.ifftn(mine, mesh, src), rs.fft.rfftn(mine.real.copy(), mesh, src)):
        out.append((np.asarray(result).tobytes(), in_arena(result)))
    return out


def rows(comm, engine, tokens, hidden, experts, top_k, seed):
    """all_to_all_v, then MoE dispatch and combine (weights given), of random rows: each
    result's bytes and whether it lies in the arena; the combined rows against numpy's sum of
    each token's weighted rows (the experts are identities)."""
    rng = np.random.default_rng(seed + comm.rank)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    counts = rng.multinomial(tokens, [1 / comm.size] * comm.size)
    moved, _ = rs.all_to_all_v(_as(engine, x), [int(c) for c in counts], comm)
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int64)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    expert_in, handle = rs.moe.dispatch(_as(engine, x), _as(engine, ids), experts, comm)
    back = rs.moe.combine(expert_in, handle, _as(engine, weights))
    want = (x[:, None, :] * weights[:, :, None]).sum(axis=1)
    return [(_np(moved).tobytes(), in_arena(moved)), (_np(expert_in).tobytes(), in_arena(expert_in)),
            (_np(back).tobytes(), bool(np.allclose(_np(back), want, rtol=1e-5, atol=1e-5)))]


def _routed_oracle(size, rank, cases_rng_seed, tokens, hidden, experts, top_k, dtype):
    """Every rank's tokens and expert ids as rank ``r`` draws them (seed + r), and the rows this
    rank's experts get: for each of its experts in order, every rank's rows routed to it in
    rank order, each rank's in (token, slot) order."""
    drawn = []
    for r in range(size):
        rng = np.random.default_rng(cases_rng_seed + r)
        x = rng.standard_normal((tokens[r], hidden)).astype(dtype)
        ids = np.array([rng.permutation(experts)[:top_k] for _ in range(tokens[r])]).reshape(tokens[r], top_k)
        drawn.append((x, ids.astype(np.int64), rng.random((tokens[r], top_k)).astype(dtype)))
    per_rank = experts // size
    want = [drawn[r][0][np.nonzero(drawn[r][1] == e)[0]]
            for e in range(rank * per_rank, (rank + 1) * per_rank) for r in range(size)]
    return drawn[rank], np.concatenate(want) if want else np.zeros((0, hidden), dtype)


def taken_tokens(comm, engine, cases):
    """MoE dispatch and combine where the tokens lie in the arena (``rs.empty``) on the ranks
    ``in_arena`` names, per case (tokens per rank, hidden, experts, top_k, capacity, dtype,
    seed, in_arena): the expert inputs' bytes, numpy's rows for them (no capacity: every
    pair kept), the dispatch's pack copies and whether a "pack rows" phase ran, whether the
    combined rows equal numpy's weighted sums, whether the tokens are unchanged, the rows
    sent to each rank, and the combine's unpack copies with whether every pair was kept."""
    from reshard.execution import phases

    out = []
    for tokens, hidden, experts, top_k, capacity, dtype, seed, in_arena in cases:
        (mine, ids, weights), want = _routed_oracle(comm.size, comm.rank, seed, tokens, hidden, experts, top_k, dtype)
        x = mine.copy()
        if comm.rank in in_arena:
            x = rs.empty(mine.shape, mine.dtype)
            x[...] = mine
        with phases.listening() as spans:
            expert_in, handle = rs.moe.dispatch(_as(engine, x), _as(engine, ids), experts, comm, capacity=capacity)
        packs = rs.last_exchange().pack_copies
        back = _np(rs.moe.combine(expert_in, handle, _as(engine, weights)))
        unpacks = (rs.last_exchange().unpack_copies, bool(np.all(handle.kept)))
        summed = (mine[:, None, :] * weights[:, :, None] * handle.kept[:, :, None]).sum(axis=1)
        out.append((_np(expert_in).tobytes(), None if capacity is not None else want.tobytes(), packs,
                    any(name == "pack rows" for name, *_ in spans),
                    bool(np.allclose(back, summed.reshape(back.shape), rtol=1e-5, atol=1e-5)),
                    bool(np.array_equal(x, mine)), [int(c) for c in handle.send_counts], unpacks))
    return out


def started_and_grads(comm, n):
    """A started call with the arena on and off, and a gradient through an exchange that reads
    in place: (on's result in the arena, off's not, both right, the gradient right)."""
    import torch

    full = np.arange(n * n, dtype=np.float32).reshape(n, n)
    mine = rs.local_shard(full, rs.Shard(0), comm.rank, comm.size)
    want = rs.local_shard(full, rs.Shard(1), comm.rank, comm.size)
    on = rs.redistribute(torch.from_numpy(mine.copy()), rs.Shard(0), rs.Shard(1), comm, async_op=True).wait()
    off = rs.redistribute(torch.from_numpy(mine.copy()), rs.Shard(0), rs.Shard(1), comm, async_op=True,
                          arena=False).wait()
    x = torch.from_numpy(mine.copy()).requires_grad_()
    y = rs.redistribute(x, rs.Shard(0), rs.Shard(1), comm)
    weight = torch.from_numpy(want * 3 + 1)
    (y * weight).sum().backward()
    grad_want = rs.local_shard(full * 3 + 1, rs.Shard(0), comm.rank, comm.size)
    return (in_arena(on), in_arena(off), bool(np.array_equal(_np(on), want) and np.array_equal(_np(off), want)),
            in_arena(y), bool(np.array_equal(x.grad.numpy(), grad_want)))


def many_lists(comm, engine, mesh_shape, lists, calls, as_torch=False):
    """``many`` for each ``(cases, layouts)`` of ``lists`` in turn, in one job."""
    return [many(comm, engine, mesh_shape, cases, calls, as_torch, None, layouts) for cases, layouts in lists]


def many(comm, engine, mesh_shape, cases, calls, as_torch=False, tiny_arena_on=None, layouts="contiguous"):
    """Lists of tensors in one call, ``calls`` times, each call on new inputs (the values of
    the full arrays salted by the call's number). ``cases``: (shape, dtype name, src, dst) per
    tensor (src/dst one placement on a world, a tuple or Spec on a mesh). ``layouts``:
    "contiguous", "views" (every other input a transposed view's transpose: not C-contiguous)
    or "twice" (the first tensor passed again at the end). ``tiny_arena_on``: this rank's
    arena is made too small for any block (its inputs cannot be joined there).

    Per call: (each result's bytes, numpy's part of each full array as bytes, whether each
    result lies in the arena); and the warnings this rank saw."""
    import warnings

    from tests.helpers.oracle import pattern

    if tiny_arena_on == comm.rank:
        arena_mod._state["arena"] = arena_mod.Arena(cap=arena_mod.HEAD_BYTES + 4096)
    world = len(mesh_shape) == 1
    mesh = None if world else rs.Mesh(mesh_shape, comm=comm)
    coord = (comm.rank,) if world else mesh.coord
    if layouts == "twice":
        cases = [*cases, cases[0]]
    srcs = [c[2] for c in cases]
    dsts = [c[3] for c in cases]
    out = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for call in range(calls):
            fulls = [pattern(shape, dtype, salt=call) for shape, dtype, _, _ in cases]
            xs = []
            for k, (full, src) in enumerate(zip(fulls, srcs)):
                mine = np.ascontiguousarray(rs.local_shard(full, src, coord, mesh_shape))
                if layouts == "views" and k % 2 and mine.ndim >= 2:
                    mine = np.ascontiguousarray(mine.T).T  # the same values, F-ordered
                xs.append(mine)
            if layouts == "twice":
                xs[-1] = xs[0]
            if as_torch:
                import torch

                xs = [torch.from_numpy(x) for x in xs]
            ys = rs.redistribute(xs, srcs, dsts, mesh=mesh)
            wants = [np.ascontiguousarray(rs.local_shard(full, dst, coord, mesh_shape)) for full, dst in zip(fulls, dsts)]
            out.append(([_np(y).tobytes() for y in ys], [w.tobytes() for w in wants], [in_arena(y) for y in ys]))
    return out, [str(w.message) for w in seen]


def many_peak(comm, tensors, shape, calls):
    """``tensors`` float32 tensors of global ``shape``, S(0) -> S(1) in one call, ``calls`` times
    (a replay after the first), the last results kept until the next are made: the most bytes
    the arena's blocks held at once beyond what they held before the calls, and the bytes of
    one call's results on this rank."""
    rows = shape[0] // comm.size
    xs = [np.full((rows, shape[1]), k, np.float32) for k in range(tensors)]
    ys = rs.redistribute(xs, rs.Shard(0), rs.Shard(1))
    where = arena_mod.arena()
    before = where.live
    where.peak_live = where.live
    for _ in range(calls):
        ys = rs.redistribute(xs, rs.Shard(0), rs.Shard(1))
    right = all(np.all(np.asarray(_np(y)) == k) for k, y in enumerate(ys))
    return where.peak_live - before, sum(_np(y).nbytes for y in ys), right
