"""Rank-side functions for test_replay.py: repeated calls of one signature (the plan replay
of ops.py), what changes between them, and the oracle for each call."""

from __future__ import annotations

import numpy as np

import reshard as rs

from .oracle import all_to_all_expected, balanced, pattern, starts, take


def _a2a_input(comm, shape, c, lengths, salt, kind):
    full = pattern(shape, "float32", salt)
    r = comm.rank
    mine = np.ascontiguousarray(take(full, c, starts(lengths)[r], starts(lengths)[r] + lengths[r]))
    if kind == "torch":
        import torch

        return full, torch.from_numpy(mine)
    return full, mine


def _same(out, want) -> bool:
    got = out if isinstance(out, np.ndarray) else out.numpy()
    return got.shape == want.shape and np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def repeated_all_to_all(comm, shape, s, c, calls, kind):
    """``calls``: one entry per call, per rank: the lengths along ``c`` every rank holds (so a
    rank may change its own shard between calls). Returns per call: (correct, replayed, the
    local part of the call's signature)."""
    out = []
    for salt, lengths in enumerate(calls):
        sh = list(shape)
        sh[c] = sum(lengths)
        full, x = _a2a_input(comm, tuple(sh), c, lengths, salt, kind)
        # what the signature holds of x besides shape and dtype: numpy's strides (a zero-size
        # array's strides depend on how it was made), torch's contiguity
        layout = x.strides if isinstance(x, np.ndarray) else x.is_contiguous()
        got = rs.all_to_all(x, s, c)
        want = all_to_all_expected(full, s, c, comm.size, comm.rank, lengths, None)
        out.append((_same(got, want), rs.last_exchange().replayed, (tuple(x.shape), layout)))
    return out


def replay_stats(comm, op, kind, check, calls=3):
    """The same call ``calls`` times with new values; per call (correct, stats fields)."""
    n, r = comm.size, comm.rank
    results = []
    for salt in range(calls):
        full = pattern((4 * n + 1, 3 * n + 2), "float32", salt)
        rows = balanced(full.shape[0], n)
        mine = np.ascontiguousarray(take(full, 0, starts(rows)[r], starts(rows)[r] + rows[r]))
        x = mine
        if kind == "torch":
            import torch

            x = torch.from_numpy(mine)
        if op == "redistribute":
            got = rs.redistribute(x, rs.Shard(0), rs.Shard(1), check=check)
            cols = balanced(full.shape[1], n)
            want = take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r])
        elif op == "redistribute_global":
            got = rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=full.shape, check=check)
            cols = balanced(full.shape[1], n)
            want = take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r])
        elif op == "all_gather":
            got, want = rs.all_gather(x, 0, check=check), full
        elif op == "gather":
            got = rs.gather(x, 0, dst=n - 1, check=check)
            want = full if r == n - 1 else None
        elif op == "reduce_scatter":
            got = rs.reduce_scatter(x[: rows[-1]], dim=1, op="max", check=check)
            # every rank's first rows[-1] rows, maxed, then this rank's columns
            parts = [take(full, 0, starts(rows)[i], starts(rows)[i] + rows[-1]) for i in range(n)]
            cols = balanced(full.shape[1], n)
            want = take(np.maximum.reduce(parts), 1, starts(cols)[r], starts(cols)[r] + cols[r])
        else:
            raise ValueError(op)
        ok = (got is None) if want is None else _same(got, want)
        st = rs.last_exchange()
        results.append((ok, st.replayed, st.metadata_exchanges, st.bytes_sent, st.bytes_received))
    return results


def calls_built_per_replay(comm):
    """How many ``Call`` objects a replay builds, per kind of replay, and (correct, replayed)
    per replay; the count comes from wrapping ``Call.__init__`` in this rank process."""
    from reshard.execution import call as call_module

    built = [0]
    init = call_module.Call.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    n, r = comm.size, comm.rank
    full = pattern((4 * n + 1, 3 * n + 2), "float32", 0)
    rows, cols = balanced(full.shape[0], n), balanced(full.shape[1], n)
    x = np.ascontiguousarray(take(full, 0, starts(rows)[r], starts(rows)[r] + rows[r]))
    want = take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r])
    kinds = {"check off, global_shape given": {"global_shape": full.shape, "check": False},
             "check off, shapes learned": {"check": False}, "check on": {"check": True}}
    counts, outcomes = {}, []
    call_module.Call.__init__ = counting
    try:
        for name, kwargs in kinds.items():
            rs.redistribute(x, rs.Shard(0), rs.Shard(1), **kwargs)  # the first call makes the plan
            built[0] = 0
            got = rs.redistribute(x, rs.Shard(0), rs.Shard(1), **kwargs)
            counts[name] = built[0]
            outcomes.append((_same(got, want), rs.last_exchange().replayed))
    finally:
        call_module.Call.__init__ = init
    return counts, outcomes


def replay_stats_of_ops(comm, ops, kind, check):
    """``replay_stats`` of each op in turn: op -> its calls."""
    return {op: replay_stats(comm, op, kind, check) for op in ops}


def mismatch_after_replay(comm, bad_rank, change):
    """Two good calls (the second replays), one where ``bad_rank`` changes ``change``, then a
    good one again. Returns what each call gave: 'ok', or the error class and message."""
    outcomes = []
    for step in range(4):
        x = np.ones((comm.size * 2, 6), dtype=np.float32) * comm.rank
        dims = (1, 0)
        if step == 2 and comm.rank == bad_rank:
            if change == "dtype":
                x = x.astype(np.float64)
            elif change == "shape":
                x = np.ones((comm.size * 2, 7), dtype=np.float32)
            elif change == "dims":
                dims = (0, 1)
        try:
            if step == 2 and comm.rank == bad_rank and change == "collective":
                rs.all_gather(x, 0)
            else:
                rs.all_to_all(x, *dims)
            outcomes.append(("ok", rs.last_exchange().replayed))
        except rs.ReshardError as exc:
            outcomes.append((type(exc).__name__, str(exc)))
    return outcomes


def types_freed_between_calls(comm):
    """MPI: the engine frees its cached datatypes between two calls; the second must not use
    them (it would read freed types: garbage or a crash)."""
    n, r = comm.size, comm.rank
    results = []
    for salt in range(3):
        full = pattern((2 * n, 4 * n), "float32", salt)
        x = np.ascontiguousarray(take(full, 0, 2 * r, 2 * r + 2))
        got = rs.redistribute(x, rs.Shard(0), rs.Shard(1))
        want = take(full, 1, 4 * r, 4 * r + 4)
        results.append((_same(got, want), rs.last_exchange().replayed))
        comm.primitives.free_types()
    return results


def grad_through_replay(comm):
    """The gradient of sum(w * redistribute(x)) on the second call (a replay): w's layout."""
    import torch

    n, r = comm.size, comm.rank
    grads = []
    for salt in range(2):
        full = torch.from_numpy(pattern((2 * n, 3 * n), "float32", salt))
        x = full[2 * r : 2 * r + 2].clone().requires_grad_(True)
        y = rs.redistribute(x, rs.Shard(0), rs.Shard(1))
        replayed = rs.last_exchange().replayed
        weight = torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape) + 100 * r
        (y * weight).sum().backward()
        grads.append((x.grad.numpy().copy(), weight.numpy().copy(), replayed))
    return grads


def replay_then_late(comm, late, seconds):
    """Everyone makes one call (a plan); then ``late`` sleeps (or, with seconds None, dies)
    while the others repeat it."""
    x = np.zeros((comm.size, 2))
    rs.all_to_all(x, 0, 1)
    if comm.rank == late:
        import os
        import time

        if seconds is None:
            os._exit(3)
        time.sleep(seconds)
        return "slept"
    rs.all_to_all(x, 0, 1)
    return "exchanged"


def late_voter(comm, late, vote_timeout):
    """``replay_then_late`` with the vote bounded by ``vote_timeout`` (shorter than the job's)."""
    comm.primitives.board.timeout = vote_timeout
    x = np.zeros((comm.size, 2))
    rs.all_to_all(x, 0, 1)
    rs.all_to_all(x, 0, 1, check=True)  # the plan made with its records, so that it can vote
    if comm.rank == late:
        import time

        time.sleep(600)
    rs.all_to_all(x, 0, 1, check=True)
    return "exchanged"


def vote_path(comm):
    """Whether this rank votes through shared memory, and a checked replay still agrees."""
    x = np.ones((comm.size, 4), dtype=np.float32)
    for _ in range(3):
        rs.all_to_all(x, 0, 1, check=True)
    assert rs.last_exchange().replayed
    return comm.primitives.board is not None


def toggled_check(comm):
    """comm.check flipped between calls: each setting is its own signature."""
    x = np.ones((comm.size, 3), dtype=np.float32)
    seen = []
    for check in (True, True, False, False, True):
        comm.check = check
        rs.all_to_all(x, 1, 0)
        st = rs.last_exchange()
        seen.append((st.replayed, st.metadata_exchanges))
    return seen


def _stats_fields(result):
    """What a replay's stats say, and where it received: "result" where the stats hold the
    result itself (a weak reference), "address" where they hold an address (of the result or
    of a buffer freed since, whose memory the result may reuse: comparing would be chance)."""
    import weakref

    st = rs.last_exchange()
    ptr = 0 if result is None else (result.ctypes.data if isinstance(result, np.ndarray) else result.data_ptr())
    into = st.received_into
    if type(into) is weakref.ref:
        where = "result" if st.recv_buffer_ptr == ptr else "another array"
    else:
        where = "address" if into else None
    return (st.op, st.replayed, st.bytes_sent, st.bytes_received, st.allocated_bytes, st.pack_copies,
            st.unpack_copies, st.metadata_exchanges, tuple(st.steps), where)


def hot_replays(comm, kind, calls=4, check=False):
    """Each op that needs nothing from its peers on an unchecked replay, ``calls`` times with
    new values: per op, per call (correct, stats fields, the replay states and calls built).
    A replay state (``hot_replay.ReplayState``) or a ``Call`` is built on the way to a plan but
    not on the hot way, which runs the replay made last time (checked: after the vote);
    counted by wrapping their ``__init__`` here."""
    from reshard.execution import call, hot_replay

    n, r = comm.size, comm.rank
    made = [0]
    inits = {cls: cls.__init__ for cls in (hot_replay.ReplayState, call.Call)}

    def counting(init):
        def counted(self, *args, **kwargs):
            made[0] += 1
            init(self, *args, **kwargs)
        return counted

    mesh = rs.Mesh((n, 1))
    out: dict[str, list] = {}
    for cls, init in inits.items():
        cls.__init__ = counting(init)
    try:
        for op in ("redistribute", "mesh redistribute", "reduce_scatter", "all_reduce"):
            out[op] = []
            for salt in range(calls):
                full = pattern((4 * n + 1, 3 * n + 2), "float32", salt)
                rows, cols = balanced(full.shape[0], n), balanced(full.shape[1], n)
                mine = np.ascontiguousarray(take(full, 0, starts(rows)[r], starts(rows)[r] + rows[r]))
                x = mine
                if kind == "torch":
                    import torch

                    x = torch.from_numpy(mine)
                mine_cols = take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r])
                made[0] = 0
                if op == "redistribute":
                    got = rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=full.shape, check=check)
                    want = mine_cols
                elif op == "mesh redistribute":
                    got = rs.redistribute(x, [rs.Shard(0), rs.Replicate()], [rs.Shard(1), rs.Replicate()],
                                          global_shape=full.shape, mesh=mesh, check=check)
                    want = mine_cols
                elif op == "reduce_scatter":
                    got = rs.reduce_scatter(x[: rows[-1]], dim=1, op="max", check=check)
                    parts = [take(full, 0, starts(rows)[i], starts(rows)[i] + rows[-1]) for i in range(n)]
                    want = take(np.maximum.reduce(parts), 1, starts(cols)[r], starts(cols)[r] + cols[r])
                else:
                    got = rs.all_reduce(x[: rows[-1]], op="max", check=check)
                    want = np.maximum.reduce([take(full, 0, starts(rows)[i], starts(rows)[i] + rows[-1])
                                              for i in range(n)])
                built = made[0]
                out[op].append((_same(got, want), _stats_fields(got), built))
    finally:
        for cls, init in inits.items():
            cls.__init__ = init
    return out


def hot_replay_refusals(comm):
    """After hot replays, calls whose arguments equal the last ones by value but not by kind
    (a bool or a float for an int), a placement list changed in place, new input, and freed
    datatypes (MPI). Per call: 'ok' and whether the result is right, or the error's class."""
    n, r = comm.size, comm.rank
    full = pattern((2 * n, 4 * n, 1), "float32", 3)  # a length-1 dim: True equals it
    x = np.ascontiguousarray(take(full, 0, 2 * r, 2 * r + 2))
    cols = take(full, 1, 4 * r, 4 * r + 4)
    mesh = rs.Mesh((n, 1))
    dst = [rs.Shard(1), rs.Replicate()]
    outcomes = []

    def attempt(name, fn, want):
        try:
            got = fn()
            outcomes.append((name, "ok", _same(got, want)))
        except Exception as exc:  # any error at all is an outcome the test names
            outcomes.append((name, type(exc).__name__, str(exc)))

    world = lambda shape: rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=shape, check=False)  # noqa: E731
    for i in range(3):
        attempt(f"world {i}", lambda: world((2 * n, 4 * n, 1)), cols)
    attempt("a float in global_shape", lambda: world((2.0 * n, 4 * n, 1)), cols)
    attempt("a bool in global_shape", lambda: world((2 * n, 4 * n, True)), cols)
    attempt("world again", lambda: world((2 * n, 4 * n, 1)), cols)
    attempt("global_shape as an array", lambda: world(np.array((2 * n, 4 * n, 1))), cols)  # == cannot say
    on_mesh = lambda: rs.redistribute(x, [rs.Shard(0), rs.Replicate()], dst, global_shape=full.shape,  # noqa: E731
                                      mesh=mesh, check=False)
    for i in range(3):
        attempt(f"mesh {i}", on_mesh, cols)
    dst[0] = rs.Replicate()  # the same list, now asking for the whole tensor
    attempt("mesh, dst changed in place", on_mesh, full)
    y = x[:, ::-1]  # a view of other strides: a new signature
    attempt("strided input", lambda: rs.redistribute(y, rs.Shard(0), rs.Shard(1), global_shape=full.shape,
                                                     check=False), take(full[:, ::-1], 1, 4 * r, 4 * r + 4))
    mesh_strided = lambda: rs.redistribute(y, [rs.Shard(0), rs.Replicate()], [rs.Shard(1), rs.Replicate()],  # noqa: E731
                                           global_shape=full.shape, mesh=mesh, check=False)
    for i in range(3):  # hot from the second call on: the input is not contiguous, the same each time
        attempt(f"mesh, strided input {i}", mesh_strided, take(full[:, ::-1], 1, 4 * r, 4 * r + 4))
    if comm.engine == "mpi":
        comm.primitives.free_types()
        attempt("world after freed types", lambda: world((2 * n, 4 * n, 1)), cols)
        for i in range(2):  # the hot mesh exchange held the freed types: it works them out again
            attempt(f"mesh after freed types {i}", on_mesh, full)
    return outcomes


def alternating_hot_replays(comm):
    """A loop alternating two signatures (a change and its way back), unchecked: per call
    (correct, replay states built). Both stay hot: neither pushes the other out."""
    from reshard.execution import hot_replay

    n, r = comm.size, comm.rank
    full = pattern((3 * n + 1, 2 * n + 3), "float32", 5)
    rows, cols = balanced(full.shape[0], n), balanced(full.shape[1], n)
    x = np.ascontiguousarray(take(full, 0, starts(rows)[r], starts(rows)[r] + rows[r]))
    y = np.ascontiguousarray(take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r]))
    made = [0]
    init = hot_replay.ReplayState.__init__

    def counting(self, *args, **kwargs):
        made[0] += 1
        init(self, *args, **kwargs)

    hot_replay.ReplayState.__init__ = counting
    outcomes = []
    try:
        for _ in range(5):
            made[0] = 0
            forth = rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=full.shape, check=False)
            back = rs.redistribute(y, rs.Shard(1), rs.Shard(0), global_shape=full.shape, check=False)
            outcomes.append((_same(forth, y), _same(back, x), made[0]))
    finally:
        hot_replay.ReplayState.__init__ = init
    return outcomes


def hot_replay_cases(comm):
    """Every hot-replay case in one job: ``hot_replays`` for numpy and torch input, the
    alternating loop, then the refusals (last: on MPI they free the engine's datatypes)."""
    return {"numpy": hot_replays(comm, "numpy"), "torch": hot_replays(comm, "torch"),
            "numpy, checked": hot_replays(comm, "numpy", check=True),
            "alternating": alternating_hot_replays(comm), "refusals": hot_replay_refusals(comm)}


def after_stale_votes(comm):
    """Rank 0 holds votes that a checked hot replay cast for a call that then raised before its
    full path took them (set here as such a call leaves them); the next checked call must still
    cast its own vote. Returns whether its result equals numpy's."""
    shape = (comm.size * 3, comm.size * 2)
    full = pattern(shape, "float64", salt=5)
    rows, cols = balanced(shape[0], comm.size), balanced(shape[1], comm.size)
    r = comm.rank
    x = np.ascontiguousarray(take(full, 0, starts(rows)[r], starts(rows)[r] + rows[r]))
    if comm.rank == 0:
        comm.replay_cache.votes = ("redistribute", np.array([12345, -12345], dtype=np.int64))
    y = rs.redistribute(x, rs.Shard(0), rs.Shard(1))
    want = take(full, 1, starts(cols)[r], starts(cols)[r] + cols[r])
    return bool(_same(y, want))
