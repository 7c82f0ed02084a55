"""The body of one rank started by ``rs.spawn(..., engine="mpi")`` (``python -m reshard.launch.mpi_rank DIR``)."""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import traceback

# True while the parent's script is being imported here: a script that calls rs.spawn at its
# top level, without ``if __name__ == "__main__":``, would otherwise start jobs recursively.
BOOTSTRAPPING = False


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _write(tmp: str, rank: int, status: str, value: object) -> str:
    final = os.path.join(tmp, f"result-{rank}.pkl")
    with open(final + ".part", "wb") as f:
        try:
            pickle.dump((status, value), f)
        except Exception as exc:  # e.g. a return value that cannot be pickled
            f.seek(0)
            f.truncate()
            pickle.dump(("error", f"rank {rank}: could not send its return value back: {exc}"), f)
            status = "error"
    os.replace(final + ".part", final)
    return status


def _load_main(path: str | None) -> None:
    """Make the parent's script importable as ``__main__`` (functions defined in it pickle by
    that name), the way multiprocessing does: run it under the name ``__mp_main__``."""
    if not path:
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        return
    global BOOTSTRAPPING
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    BOOTSTRAPPING = True
    try:
        spec.loader.exec_module(module)
    finally:
        BOOTSTRAPPING = False
    sys.modules["__main__"] = module


def main(tmp: str) -> None:
    _die_with_parent()
    sys.modules.setdefault("reshard.launch.mpi_rank", sys.modules[__name__])  # run as -m: make it findable
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    try:
        with open(os.path.join(tmp, "payload.pkl"), "rb") as f:
            head = pickle.load(f)  # written by rs.spawn into this machine's private directory
            for entry in reversed(head["sys_path"]):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            _load_main(head["main_path"])
            payload = pickle.load(f)
    except BaseException as exc:
        _write(tmp, rank, "error", f"{type(exc).__name__} on rank {rank} while loading fn\n{traceback.format_exc()}")
        MPI.COMM_WORLD.Abort(1)

    from .. import comm as comm_mod
    from ..engines.mpi_engine import init_mpi

    os.environ["RESHARD_RANK"] = str(rank)
    comm = None
    try:
        comm = comm_mod.Comm(init_mpi(head["timeout"]), check=head["check"], timeout=head["timeout"])
        comm_mod.set_current(comm)
        status = _write(tmp, rank, "ok", payload["fn"](comm, *payload["args"]))
    except BaseException as exc:
        status = _write(tmp, rank, "error", f"{type(exc).__name__} on rank {rank}\n{traceback.format_exc()}")
    if status != "ok":
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)  # peers stop now rather than wait out their timeout
    comm.close()


if __name__ == "__main__":
    main(sys.argv[1])
