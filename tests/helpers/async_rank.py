"""Rank functions for test_async.py: started collectives (``async_op=True``) on real ranks."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import numpy as np

import reshard as rs
from reshard.execution import handles


def _blocking_and_started(comm):
    n, r = comm.size, comm.rank
    x = np.arange(6 * n * 4, dtype=np.float32).reshape(6, n * 4) + 100 * r
    calls = [
        ("all_to_all", lambda **kw: rs.all_to_all(x, 1, 0, **kw)),
        ("all_to_all_v", lambda **kw: rs.all_to_all_v(x[: 2 * n], [2] * n, **kw)),
        ("all_gather", lambda **kw: rs.all_gather(x, 0, **kw)),
        ("gather", lambda **kw: rs.gather(x, 1, dst=n - 1, **kw)),
        ("reduce_scatter", lambda **kw: rs.reduce_scatter(x, 1, "max", **kw)),
        ("all_reduce", lambda **kw: rs.all_reduce(x, **kw)),
        ("redistribute", lambda **kw: rs.redistribute(x, rs.Shard(0), rs.Shard(1), **kw)),
    ]
    return x, calls


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_same(p, q) for p, q in zip(a, b))
    if a is None or b is None:
        return a is None and b is None
    return isinstance(a, type(b)) and np.array_equal(np.asarray(a), np.asarray(b))


def many_in_flight(comm):
    """Every collective started at once (twice: the second round replays), a blocking call
    between the rounds, the handles waited in reverse order. Per call: equal to the blocking
    result; and the Python threads before the first start and after the last wait."""
    threads_before = threading.active_count()
    x, calls = _blocking_and_started(comm)
    started = [(name, fn(async_op=True)) for name, fn in calls]
    middle = rs.all_gather(x)  # blocking: runs after every call started before it
    started += [(name, fn(async_op=True)) for name, fn in calls]
    got = {}
    for name, handle in reversed(started):
        got.setdefault(name, []).append(handle.wait())
    threads_after = threading.active_count()
    blocking = {name: fn() for name, fn in calls}
    same = {name: all(_same(g, blocking[name]) for g in got[name]) for name in blocking}
    return same, _same(middle, blocking["all_gather"]), threads_before, threads_after, handles.pending()


def bad_input_started(comm, bad_rank):
    """One rank starts an all_to_all with a wrong shape: every rank's wait() raises."""
    rows = 5 if comm.rank == bad_rank else 4
    handle = rs.all_to_all(np.zeros((rows, comm.size * 2), np.float32), 0, 1, async_op=True)  # dim 0 must agree
    try:
        handle.wait()
        return "no error", ""
    except rs.ReshardError as exc:
        return type(exc).__name__, str(exc)


def different_order(comm):
    """Rank 1 starts its two collectives in the other order: the check raises on every rank."""
    x = np.ones((comm.size * 2, 3), np.float32)
    first, second = (rs.all_gather, rs.all_reduce) if comm.rank != 1 else (rs.all_reduce, rs.all_gather)
    out = []
    for handle in (first(x, async_op=True), second(x, async_op=True)):
        try:
            handle.wait()
            out.append("ok")
        except rs.ReshardError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def timed_out_wait(comm, marker):
    """Rank 0 waits 0.3 s for an all_gather rank 1 has not started (rank 1 starts it once
    rank 0's wait has run out, told by a file): CommTimeout, then the full result."""
    x = np.full((2, 3), comm.rank, np.float32)
    if comm.rank == 0:
        handle = rs.all_gather(x, async_op=True)
        try:
            handle.wait(timeout=0.3)
            first = "no timeout"
        except rs.CommTimeout as exc:
            first = str(exc)
        done_then = handle.done()
        with open(marker, "w") as f:
            f.write("go")
        return first, done_then, handle.wait(timeout=60).tolist()
    while not os.path.exists(marker):  # rank 0's wait ran out: only then does this rank join
        time.sleep(0.01)
    return None, None, rs.all_gather(x).tolist()


def never_waited(comm, finished_first=False):
    """Started calls nobody waits for: the communicator's close finishes them, with a warning
    that points at the line that started the first (``finished_first``: they are done before
    the close, which still warns)."""
    x = np.ones((2, 2), np.float32) * (comm.rank + 1)
    threads_before = threading.active_count()
    h1, h2 = rs.all_reduce(x, async_op=True), rs.all_gather(x, async_op=True)
    start_line = sys._getframe().f_lineno - 1
    while finished_first and not (h1.done() and h2.done()):
        time.sleep(0.001)  # polling the handles, not waiting for a race: done() is the condition
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        handles.close(comm)  # what comm.close() does first
    sites = [(w.filename, w.lineno, w.category.__name__) for w in seen]
    return ([str(w.message) for w in seen], h1.done(), h2.done(), float(h1.wait()[0, 0]),
            (threads_before, threading.active_count()), sites, (__file__, start_line))


def started_then_dies(comm, victim, outdir):
    """``victim`` exits while the others' started all_to_all is pending: their wait() raises."""
    x = np.zeros((comm.size * 1000, 64), np.float32)
    rs.all_to_all(x, 0, 1)  # everyone connected and healthy first
    if comm.rank == victim:
        os._exit(7)
    start = time.monotonic()
    handle = rs.all_to_all(x, 0, 1, async_op=True)
    try:
        handle.wait()
        outcome = "no error"
    except rs.ReshardError as exc:
        outcome = type(exc).__name__
    with open(os.path.join(outdir, f"rank{comm.rank}"), "w") as f:
        f.write(f"{outcome} {time.monotonic() - start:.1f}")
    return outcome


def gradient_through_a_started_call(comm):
    """all_to_all started on a tensor that requires grad: the same gradient as the blocking call."""
    import torch

    n = comm.size
    base = torch.arange(4.0 * n * 3).reshape(4, n * 3) + comm.rank
    grads = []
    for started in (False, True):
        x = base.clone().requires_grad_(True)
        y = rs.all_to_all(x, 1, 0, async_op=True).wait() if started else rs.all_to_all(x, 1, 0)
        (y * torch.arange(float(y.numel())).reshape(y.shape)).sum().backward()
        grads.append(x.grad.clone())
    return torch.equal(grads[0], grads[1]), bool(grads[1].abs().sum() > 0)


def last_exchange_is_the_last_finished(comm):
    x = np.ones((comm.size * 2, 4), np.float32)
    handle = rs.all_gather(x, async_op=True)
    handle.wait()
    gathered = rs.last_exchange().op
    rs.all_reduce(x)
    return gathered, rs.last_exchange().op


def started_mixed_list(comm):
    """A started list call holding a torch tensor and a numpy Partial (moved as torch, its own
    reduction beside the exchange) on a 2x2 mesh, waited for; whether the results are numpy's."""
    import torch

    mesh = rs.Mesh((2, 2), comm=comm)
    summed = np.arange(4 * 4 * 11, dtype=np.float64).reshape(4, 4, 11)
    mine = summed if mesh.coord[1] == 0 else np.zeros_like(summed)
    ids = torch.arange(4, dtype=torch.int8)[2 * mesh.coord[1] : 2 * mesh.coord[1] + 2]
    src = [rs.Spec(None, 0, partial=1), rs.Spec(1)]
    dst = [rs.Spec(None, None, (1, 0)), rs.Spec(0)]
    got = rs.redistribute([mine, ids], src, dst, mesh=mesh, async_op=True).wait()
    full = np.concatenate([summed, summed], axis=1)  # the global array: mesh dim 0 splits dim 1
    want = rs.local_shard(full, rs.Spec(None, None, (1, 0)), mesh.coord, (2, 2))
    return bool(np.array_equal(np.asarray(got[0]), want) and got[1].tolist() == [2 * mesh.coord[0], 2 * mesh.coord[0] + 1])


def calls_while_torch_is_imported(comm):
    """A numpy call made while torch is half-imported (as a started call's worker can be, while the
    caller imports torch): made from an import hook that fires once ``torch`` is in
    ``sys.modules`` but before it defines ``Tensor``. Returns (torch absent before, whether the
    hook fired with torch half-made, the call's result or its error, its numpy oracle)."""
    import importlib.abc

    absent = "torch" not in sys.modules
    x = np.arange(2 * 3 * comm.size, dtype=np.float32).reshape(2, 3 * comm.size) + 100 * comm.rank
    seen: list = []

    class DuringTorchImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch._tensor" and not seen:
                half_made = "torch" in sys.modules and not hasattr(sys.modules["torch"], "Tensor")
                try:
                    got = rs.all_to_all(x, split_dim=1, concat_dim=0).tolist()
                except Exception as e:  # the fault under test: said, not raised into torch's import
                    got = f"{type(e).__name__}: {e}"
                seen.append((half_made, got))
            return None

    hook = DuringTorchImport()
    sys.meta_path.insert(0, hook)
    try:
        import torch  # noqa: F401
    finally:
        sys.meta_path.remove(hook)
    full = np.concatenate([np.arange(2 * 3 * comm.size, dtype=np.float32).reshape(2, 3 * comm.size) + 100 * r
                           for r in range(comm.size)])
    want = full[:, 3 * comm.rank:3 * comm.rank + 3].tolist()
    half_made, got = seen[0] if seen else (False, None)
    return absent, half_made, got, want
