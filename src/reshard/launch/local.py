"""``rs.spawn``: local ranks with one call (torch engines here; MPI in ``launch.mpi``).

Ranks are forked from a fork server that has already imported torch, so a job of several
ranks starts in well under a second instead of importing torch once per rank. The rendezvous
is a file store in a private temporary directory (no TCP listener), and gloo is bound to
loopback. Every rank is reaped and the directory removed, whatever happens.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgument, RankFailed
from ..layout import check_int
from .settings import ENGINES, FAILURE_GRACE_S


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["reshard.launch.torch_rank"])
    return ctx


def _describe(failures: dict[int, str], stopped: Sequence[int], size: int) -> str:
    causes = {r: t for r, t in failures.items() if r not in stopped}
    lines = [f"{len(causes)} of {size} ranks failed: " + ", ".join(f"rank {r}" for r in sorted(causes))]
    if stopped:
        lines[0] += f" (stopped afterwards: {', '.join(f'rank {r}' for r in sorted(stopped))})"
    for r in sorted(causes):
        lines.append(f"--- rank {r} ---\n{causes[r].rstrip()}")
    return "\n".join(lines)


def spawn(
    fn: Callable[..., Any], world_size: int, engine: str = "gloo", args: Sequence[Any] = (),
    timeout: float = 60.0, check: bool = True,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` local ranks and return the results in rank order.

    ``fn`` must be importable by name (a module-level function). ``timeout`` bounds the whole
    job and every wait inside it. If any rank raises, dies or overruns, raises ``RankFailed``
    naming the ranks with their tracebacks; no rank outlives the call.
    """
    size = check_int("world_size", world_size)
    if size < 1:
        raise InvalidArgument(f"world_size must be >= 1, got {size}")
    if engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {ENGINES}, got {engine!r}")
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {fn!r}")
    timeout = float(timeout)
    bootstrapping = sys.modules.get("reshard.launch.mpi_rank")
    if bootstrapping is not None and bootstrapping.BOOTSTRAPPING:
        raise InvalidArgument(
            "rs.spawn was called while a rank was importing the main script: protect the call with "
            "`if __name__ == \"__main__\":`"
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise InvalidArgument(
            f"fn must be importable by name in the rank processes (a module-level function), "
            f"but {fn!r} cannot be pickled: {exc}"
        ) from None
    if engine == "mpi":
        from .mpi import spawn_mpi

        return spawn_mpi(fn, size, tuple(args), timeout, check)
    from . import torch_rank

    ctx = _context()
    tmp = tempfile.mkdtemp(prefix="reshard-spawn-")
    procs: list[Any] = []
    conns: list[Any] = []
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    stopped: list[int] = []
    try:
        env = dict(os.environ)
        for rank in range(size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=torch_rank.run, name=f"reshard-rank-{rank}", daemon=True,
                args=(fn, tuple(args), rank, size, engine, os.path.join(tmp, "store"), timeout, check, env, send_end),
            )
            proc.start()
            send_end.close()
            procs.append(proc)
            conns.append(recv_end)
        _collect(procs, conns, results, failures, stopped, time.monotonic() + timeout, timeout)
    except BaseException:  # Ctrl-C included: stop every rank before letting it through
        _stop(procs)
        raise
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        raise RankFailed(_describe(failures, stopped, size), failures)
    return [results[r] for r in range(size)]


def _collect(
    procs: list[Any], conns: list[Any], results: dict[int, Any], failures: dict[int, str],
    stopped: list[int], deadline: float, timeout: float,
) -> None:
    pending = set(range(len(procs)))
    first_failure: float | None = None
    while pending:
        until = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE_S)
        waitables = {conns[r]: r for r in pending} | {procs[r].sentinel: r for r in pending}
        ready = mp.connection.wait(list(waitables), timeout=max(0.0, until - time.monotonic()))
        if not ready:
            break
        for obj in ready:
            rank = waitables[obj]
            if rank not in pending:
                continue
            conn = conns[rank]
            if obj is conn or conn.poll():
                try:
                    msg = pickle.loads(conn.recv_bytes())  # from our own child, over a local pipe
                except (EOFError, OSError):
                    msg = None
            else:
                msg = None
            if msg is None:
                procs[rank].join(5)
                code = procs[rank].exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                failures[rank] = f"rank {rank} died without reporting ({how})"
            elif msg[0] == "ok":
                results[rank] = msg[1]
            else:
                failures[rank] = msg[2]
            pending.discard(rank)
            if rank in failures and first_failure is None:
                first_failure = time.monotonic()
    for rank in sorted(pending):
        if first_failure is not None:
            failures[rank] = f"rank {rank} was still running {FAILURE_GRACE_S:g} s after another rank failed; stopped"
            stopped.append(rank)
        else:
            failures[rank] = f"rank {rank} did not finish within the timeout of {timeout:g} s; stopped"


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)
