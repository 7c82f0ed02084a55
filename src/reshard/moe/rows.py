"""Rows for MoE: gathers along dim 0, and variable exchanges of row segments (run now, or
started on a second thread so that an exchange on one communicator overlaps work and an
exchange on another)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..comm import Comm
from ..execution import execute, phases
from ..execution.arena_reads import staging
from ..execution.arrays import array_backend, is_torch
from ..execution.call import Call
from ..execution.stats import ExchangeStats
from ..planning import planner

Array = Any


def index_for(like: Array, idx: np.ndarray) -> Any:
    """``idx`` in the form that indexes ``like`` (a torch index tensor for tensors)."""
    if is_torch(like):
        import torch

        return torch.from_numpy(idx).to(like.device)
    return idx


@phases.timed("pack rows")
def take_rows(a: Array, idx: np.ndarray) -> Array:
    """``a[idx]`` along dim 0, with ``index_select`` (advanced indexing walks element by element,
    several times slower). Off the autograd tape the rows land in the shared arena where the
    exchange that sends them reads in place (``arena_reads.staging``), else in a buffer from the
    array backend, which reuses freed memory instead of page-faulting a fresh one."""
    shape = (len(idx), *a.shape[1:])
    if is_torch(a):
        import torch

        index = index_for(a, idx)
        if torch.is_grad_enabled() and a.requires_grad:
            return torch.index_select(a, 0, index)
        out = staging(shape, a)
        if out is None:
            out = array_backend("torch").empty(shape, like=a)
        return torch.index_select(a, 0, index, out=out)
    out = staging(shape, a)
    # mode="clip": with out= and the default "raise", numpy copies through a buffer (the indices are valid)
    return np.take(a, idx, axis=0) if out is None else np.take(a, idx, axis=0, out=out, mode="clip")


def exchange_segments(
    comm: Comm, x: Array, segment_send: list[list[int]], segment_recv: list[list[int]], what: str,
    total_rows: int = 0,
) -> Array:
    """One exchange per segment: ``x`` is ``[sum of all sends, *F]``, segment l's rows in rank
    order (``segment_send[l][j]`` rows for rank j); the result is ``[sum of all receives, *F]``,
    segment l's rows from every rank in rank order, each exchange writing straight into its
    block. Returns numpy for numpy; on the autograd tape the backward is the plan back.
    ``total_rows``: every rank's rows together, where every rank knows them alike (else 0)."""
    call = Call(what, x, comm, False)
    call.take_input()
    plan = planner.all_to_all_v(call.rank, call.size, list(zip(segment_send, segment_recv)), op=what,
                                total_rows=total_rows)
    return execute.run(call, x, plan, backward=lambda: plan.reverse())


def may_overlap(comm: Comm, x: Array) -> bool:
    """Whether an exchange on a sub-communicator of ``comm`` may run on a second thread while
    this one exchanges on another: the engine allows two groups at once, and ``x`` is neither on
    the autograd tape nor made in inference mode (both switches belong to each thread)."""
    return bool(comm.primitives.concurrent_groups) and not (is_torch(x) and (x.requires_grad or x.is_inference()))


class Started:
    """An exchange ``start_rows`` began: calling it finishes it and gives (result, its stats).
    Used as a context manager, it is abandoned (``abandon``) where the block raises."""

    def __init__(self, finish: Callable[[], tuple[Array, ExchangeStats]], thread: threading.Thread | None = None,
                 timeout: float = 0.0) -> None:
        self._finish, self._thread, self._timeout = finish, thread, timeout

    def __call__(self) -> tuple[Array, ExchangeStats]:
        return self._finish()

    def __enter__(self) -> Started:
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is not None:
            self.abandon()

    def abandon(self) -> None:
        """Where the caller's own work raised before finishing this: wait for the exchange's
        thread to end (its exchange is bounded by the timeout), so that none is left running
        behind the error. One blocked in an engine that cannot time out (MPI's blocking
        exchange) is left after the timeout."""
        if self._thread is not None:
            self._thread.join(self._timeout + 5.0)


def start_rows(comm: Comm, x: Array, send: Sequence[int], recv: Sequence[int], what: str, overlap: bool
               ) -> Started:
    """``all_to_all_v`` of ``x``'s rows on ``comm`` (one segment), begun now; calling the result
    finishes it and gives (result, its stats). With ``overlap`` the exchange runs on a thread
    of its own (its call is made here, so it is ordered after the calls started before it);
    else it has run by the time this returns."""
    call = Call(what, x, comm, False)
    call.take_input()
    plan = planner.all_to_all_v(call.rank, call.size, [(list(send), list(recv))], op=what)
    if not overlap:
        out = execute.run(call, x, plan, backward=lambda: plan.reverse())
        return Started(lambda: (out, call.stats))
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["out"] = execute.run(call, x, plan, backward=lambda: plan.reverse())
        except BaseException as e:  # raised where it is finished, on the caller's thread
            done["error"] = e

    thread = threading.Thread(target=run, name=f"reshard {what}", daemon=True)
    thread.start()

    def finish() -> tuple[Array, ExchangeStats]:
        thread.join()
        if "error" in done:
            raise done["error"]
        return done["out"], call.stats

    return Started(finish, thread, comm.timeout)
