"""The body of one local rank started by rs.spawn (runs inside the child process)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401  (preloaded in the fork server so every rank starts without importing it)
import torch.distributed  # noqa: F401


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if its parent (the fork server) goes away."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def run(
    fn: Callable[..., Any], args: tuple, rank: int, size: int, engine: str, store_path: str,
    timeout: float, check: bool, env: dict[str, str], conn: Any,
) -> None:
    _die_with_parent()
    os.environ.clear()
    os.environ.update(env)
    # Bind gloo to loopback: local ranks must never listen on a network interface.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["RESHARD_RANK"] = str(rank)
    os.environ["RESHARD_WORLD_SIZE"] = str(size)
    from . import comm as comm_mod
    from .engines.torch_engine import init_torch

    comm = None
    ok = False
    try:
        import torch.distributed as dist

        store = dist.FileStore(store_path, size)
        impl = init_torch("nccl" if engine == "nccl" else "gloo", rank, size, timeout, store=store)
        comm = comm_mod.Comm(impl, check=check, timeout=timeout)
        comm_mod.set_current(comm)
        payload: tuple = ("ok", fn(comm, *args))
        ok = True
    except BaseException as exc:  # everything goes back to the parent, with its traceback
        payload = ("error", type(exc).__name__, traceback.format_exc())
    try:
        conn.send(payload)
    except Exception as exc:  # e.g. a return value that cannot be pickled
        conn.send(("error", type(exc).__name__, f"rank {rank}: could not send its return value back: {exc}"))
    finally:
        conn.close()
    if comm is not None and ok:
        comm.close()
    # A failed rank leaves without a goodbye: its peers see the connection drop and fail fast.
