"""Rank side of test_one_route: the reshard frames between the executor's entry and the engine,
recorded for every call of an op in every way it can be called."""

from __future__ import annotations

import sys
import threading

import numpy as np

import reshard as rs

ENTRY = ("execution/execute.py", "__call__")  # the executor's program: every call's way in


def _where(frame) -> tuple[str, str] | None:
    """``(module file, function)`` of a reshard frame, None for any other."""
    path = frame.f_code.co_filename.replace("\\", "/")
    if "/reshard/" not in path:
        return None
    return path.rsplit("/reshard/", 1)[1], frame.f_code.co_name


class Routes:
    """Each chain of reshard frames from the executor's entry to the first engine frame, as
    ``sys.setprofile`` sees Python calls (in every thread, the started calls' included)."""

    def __init__(self) -> None:
        self.chains: set[tuple] = set()

    def __enter__(self) -> Routes:
        sys.setprofile(self._event)
        threading.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def _event(self, frame, event, arg) -> None:
        if event != "call":
            return
        here = _where(frame)
        if here is None or not here[0].startswith("engines/"):
            return
        chain, f = [here], frame.f_back
        while f is not None:
            where = _where(f)
            if where is not None:
                if where[0].startswith("engines/"):
                    return  # inside the engine already: its outermost frame is the one recorded
                chain.append(where)
                if where == ENTRY:
                    self.chains.add(tuple(reversed(chain)))
                    return
            f = f.f_back
        # not under the executor: the check's records and votes, the setup, and a checked
        # replay's local work done while its vote travels


def _ops(comm: rs.Comm, dtensor: bool) -> dict:
    """Each op as a callable of (check, async_op)."""
    n, r = comm.size, comm.rank
    x = np.arange(4 * n * 3 * n, dtype=np.float32).reshape(4 * n, 3 * n) + 100 * r
    counts = [(r + d) % 3 + 1 for d in range(n)]
    rows = np.arange(sum(counts) * 5, dtype=np.float32).reshape(-1, 5)
    mesh = rs.Mesh((n, 1), comm=comm)
    tokens = np.arange(12 * 4, dtype=np.float32).reshape(12, 4) + r
    ids = (np.arange(12 * 2).reshape(12, 2) * 7 + r) % (2 * n)

    def moe(check, async_op):
        got = rs.moe.dispatch(tokens, ids, 2 * n, check=check, async_op=async_op)
        inputs, handle = got.wait() if async_op else got
        back = rs.moe.combine(inputs, handle, check=check, async_op=async_op)
        return back.wait() if async_op else back

    ops = {
        "redistribute": lambda check, a: rs.redistribute(x, rs.Shard(0), rs.Shard(1), check=check, async_op=a),
        "redistribute on a mesh": lambda check, a: rs.redistribute(x, (rs.Shard(0), rs.Replicate()),
                                                                   (rs.Shard(1), rs.Replicate()), mesh=mesh,
                                                                   check=check, async_op=a),
        "all_to_all": lambda check, a: rs.all_to_all(x, 1, 0, check=check, async_op=a),
        "all_gather": lambda check, a: rs.all_gather(x, check=check, async_op=a),
        "reduce_scatter": lambda check, a: rs.reduce_scatter(x, 0, check=check, async_op=a),
        "all_to_all_v": lambda check, a: rs.all_to_all_v(rows, counts, check=check, async_op=a),
        "moe dispatch and combine": moe,
    }
    if dtensor:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        device_mesh = init_device_mesh("cpu", (n,))
        dt = distribute_tensor(torch.from_numpy(np.arange(6 * n * 2 * n, dtype=np.float32).reshape(6 * n, 2 * n)),
                               device_mesh, [Shard(0)])
        ops["redistribute a DTensor"] = lambda check, a: rs.redistribute(dt, dst=[Shard(1)], check=check, async_op=a)
    return ops


def routes(comm: rs.Comm, dtensor: bool) -> dict:
    """Per op and per way of calling it (a first call, checked and unchecked replays, a started
    call): the chains recorded. Three calls each, so that replays (hot ones too) run."""
    out = {}
    for name, op in _ops(comm, dtensor).items():
        for way, check, async_op in (("checked", True, False), ("unchecked", False, False),
                                     ("started, checked", True, True), ("started, unchecked", False, True)):
            for i in range(3):
                with Routes() as seen:
                    got = op(check, async_op)
                    if async_op and hasattr(got, "wait"):
                        got.wait()
                out.setdefault(name, {})[f"{way}, call {i + 1}"] = sorted(seen.chains)
    return out
