"""The body of one local rank started by rs.spawn (runs inside the child process)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
from typing import Any

import torch  # noqa: F401  (preloaded in the fork server so every rank starts without importing it)
import torch.distributed  # noqa: F401

from .payload import unpack
from .process import KEEP_FREED_BYTES, TOP_PAD_BYTES
from .report import encode, rank_error


def keep_freed_memory() -> None:
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, KEEP_FREED_BYTES)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, KEEP_FREED_BYTES)  # M_MMAP_THRESHOLD
        libc.mallopt(-2, TOP_PAD_BYTES)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


def threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if its parent (the fork server) goes away."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def run(
    payload: bytes, rank: int, size: int, engine: str, tmp: str, timeout: float, check: bool,
    env: dict[str, str], conn: Any, err_conn: Any, out_conn: Any,
) -> None:
    _die_with_parent()
    if hasattr(signal, "pthread_sigmask"):  # a fork server started while rs.spawn held Ctrl-C holds it too
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.dup2(err_conn.fileno(), 2)  # this rank's stderr and stdout go back to rs.spawn, which
    os.dup2(out_conn.fileno(), 1)  # passes them on a whole line at a time
    err_conn.close()
    out_conn.close()
    sys.stdout.reconfigure(line_buffering=True)  # a pipe now: lines go out as they are printed
    faulthandler.enable()  # a crash leaves its traceback there too
    os.environ.clear()
    os.environ.update(env)
    # Bind gloo to loopback: local ranks must never listen on a network interface.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["RESHARD_RANK"] = str(rank)
    os.environ["RESHARD_WORLD_SIZE"] = str(size)
    if "OMP_NUM_THREADS" not in env:
        # As torchrun does: ranks share the cores, so each gets its share of intra-op threads
        # (every rank's OpenMP pool spinning on every core slows copies many times over).
        torch.set_num_threads(threads_per_rank(size))
    keep_freed_memory()
    from .. import comm as comm_mod
    from ..engines.torch_engine import init_torch
    from ..execution import handles
    from ..execution.activity import Activity

    comm = None
    ok = False
    try:
        fn, args = unpack(pickle.loads(payload))  # from rs.spawn in our parent, through the fork server
        import torch.distributed as dist

        store = dist.FileStore(os.path.join(tmp, "store"), size)
        primitives = init_torch("nccl" if engine == "nccl" else "gloo", rank, size, timeout, store=store)
        comm = comm_mod.Comm(primitives, check=check, timeout=timeout)
        comm.activity = Activity(os.path.join(tmp, f"activity-{rank}"))
        comm_mod.set_current(comm)
        result = fn(comm, *args)
        handles.close(comm)  # calls started and never waited for: finished, with the warning, while output flows
        _, data = encode("ok", result, rank)
        ok = True
    except BaseException as exc:  # everything goes back to the parent, with its traceback
        _, data = encode("error", rank_error(exc, rank), rank)
    # Plain pickle, by value: multiprocessing's own pickler would hand tensors over as
    # shared-memory file descriptors, which vanish when this rank exits before the parent
    # has picked them up.
    try:
        conn.send_bytes(data)
    finally:
        conn.close()
    if comm is not None and ok:
        comm.close()
    # A failed rank leaves without a goodbye: its peers see the connection drop and fail fast.
