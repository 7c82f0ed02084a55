"""The body of one rank started by ``rs.spawn(..., engine="mpi")`` (``python -m reshard.launch.mpi_rank DIR``)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import time


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _write(tmp: str, rank: int, status: str, value: object) -> str:
    from .report import encode

    final = os.path.join(tmp, f"result-{rank}.pkl")
    status, data = encode(status, value, rank)
    with open(final + ".part", "wb") as f:
        f.write(data)
    os.replace(final + ".part", final)
    return status


def _all_failed(world: object, seconds: float = 1.0) -> bool:
    """Whether every rank reaches this point (all failed) within ``seconds``: then each exits on
    its own and reports; else the peers still in a collective are stopped with MPI_Abort."""
    req = world.Ibarrier()
    deadline = time.monotonic() + seconds
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def main(tmp: str) -> None:
    _die_with_parent()
    rank_env = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK") or os.environ.get("PMI_RANK")
    if rank_env is not None:  # this rank's stdout and stderr into files of its own, which rs.spawn passes on
        for stream, target in (("stdout", 1), ("stderr", 2)):
            fd = os.open(os.path.join(tmp, f"{stream}-{rank_env}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=True)
    sys.modules.setdefault("reshard.launch.mpi_rank", sys.modules[__name__])  # run as -m: make it findable
    faulthandler.enable()
    from mpi4py import MPI

    from .payload import unpack
    from .report import rank_error

    rank = MPI.COMM_WORLD.Get_rank()
    try:
        with open(os.path.join(tmp, "payload.pkl"), "rb") as f:
            head = pickle.load(f)  # written by rs.spawn into this machine's private directory
            for entry in reversed(head["sys_path"]):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            fn, args = unpack(pickle.load(f))
    except BaseException as exc:
        _write(tmp, rank, "error", rank_error(exc, rank, " while loading fn"))
        MPI.COMM_WORLD.Abort(1)

    from .. import comm as comm_mod
    from ..engines.mpi_engine import init_mpi
    from ..execution import handles
    from ..execution.activity import Activity

    os.environ["RESHARD_RANK"] = str(rank)
    comm = None
    try:
        comm = comm_mod.Comm(init_mpi(head["timeout"]), check=head["check"], timeout=head["timeout"])
        comm.activity = Activity(os.path.join(tmp, f"activity-{rank}"))
        comm_mod.set_current(comm)
        result = fn(comm, *args)
        handles.close(comm)  # calls started and never waited for: finished, with the warning, before reporting
        status = _write(tmp, rank, "ok", result)
    except BaseException as exc:
        status = _write(tmp, rank, "error", rank_error(exc, rank))
    if status != "ok":
        sys.stderr.flush()
        if not _all_failed(MPI.COMM_WORLD):
            MPI.COMM_WORLD.Abort(1)  # peers stop now rather than wait out their timeout
        sys.exit(0)  # every rank failed and reported: nothing for the launcher to add
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1])
