"""``rs.spawn``: local ranks with one call (torch engines here; MPI in ``launch.mpi``).

Ranks are forked from a fork server that has already imported torch, so a job of several
ranks starts in well under a second instead of importing torch once per rank. The rendezvous
is a file store in a private temporary directory (no TCP listener), and gloo is bound to
loopback. Each rank's stderr comes back through a pipe (passed on as it arrives, and its last
lines kept for the report if the rank dies); each rank's current collective is readable from a
small shared file (``reshard.activity``) for the report if it overruns. Every rank is reaped
and the directory removed, whatever happens.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import settings
from ..engines.available import ENGINES, default_engine, unusable
from ..errors import InvalidArgument, MissingDependency
from ..execution import activity
from ..execution.tracebacks import public_call
from ..planning.layout import check_int
from .output import RankOutput
from .payload import main_not_imported, pack, unguarded_call_site
from .process import FAILURE_GRACE_S
from .report import RankError, job_failed


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    # The rank body, and the collectives every job calls (their first call then imports nothing).
    ctx.set_forkserver_preload(["reshard.launch.torch_rank", "reshard.ops"])
    return ctx


@public_call
def spawn(
    fn: Callable[..., Any], world_size: int, engine: str | None = None, args: Sequence[Any] = (),
    timeout: float = 60.0, check: bool = True,
) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` local ranks and return the results in rank order.

    ``fn`` may be defined anywhere: a module, a script (call ``rs.spawn`` under
    ``if __name__ == "__main__":``), a notebook, the REPL. ``timeout`` bounds the whole job and
    every wait inside it. If any rank raises, dies or overruns, raises ``RankFailed`` naming the
    ranks and why (each one's traceback, last error output, or the collective it was waiting
    in); when every rank raised the same ``ReshardError`` subclass, the exception is also an
    instance of that subclass. No rank outlives the call, nor this process where SIGTERM ends
    it during the call (the ranks are stopped first; then it ends by SIGTERM).

    ``engine``: "gloo" (torch.distributed), "nccl" or "mpi"; None takes gloo where torch is
    installed, else MPI (with a ``UserWarning`` saying so). An engine whose library is missing
    raises ``MissingDependency`` naming the extra to install. A rank of a gloo or NCCL job may
    itself start only an MPI job (its ranks are daemon processes, which may not have children).

    ``check``: the ranks' communicators' default for the cross-rank agreement check
    (``check=False`` or ``RESHARD_CHECK=0`` turns it off). Every ``RESHARD_*`` setting is read
    before any rank starts: one that cannot be read raises ``InvalidArgument`` naming it.
    """
    size = check_int("world_size", world_size)
    if size < 1:
        raise InvalidArgument(f"world_size must be >= 1, got {size}")
    if engine is None:
        engine, note = default_engine()
        if note is not None:
            warnings.warn(f"rs.spawn: {note}", UserWarning, stacklevel=3)  # the caller of public_call's wrapper
    if engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {ENGINES}, got {engine!r}")
    missing = unusable(engine)
    if missing is not None:
        raise MissingDependency(missing)
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise InvalidArgument(f"args must be a tuple or list of fn's arguments after comm, got {type(args).__name__}: "
                              f"{args!r:.60}")
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {fn!r}")
    site = unguarded_call_site()
    if site is not None:
        raise InvalidArgument(
            f"rs.spawn is called at the top level of the script ({site}); put the call under "
            f"`if __name__ == \"__main__\":` so that importing the script does not start a job"
        )
    if engine != "mpi" and mp.current_process().daemon:  # multiprocessing would fail with a bare assert
        raise InvalidArgument(
            f"rs.spawn(engine={engine!r}) cannot start ranks from a daemon process (as a rank that "
            f"rs.spawn started on gloo or NCCL is): its ranks would be its children, which a daemon "
            f"may not have; start this job with engine='mpi', or from the main process"
        )
    timeout = settings.check_seconds("timeout", timeout)
    settings.check_set()  # the ranks read the same environment: a bad setting fails here, once
    check = bool(check) and settings.read("RESHARD_CHECK")
    payload = pack(fn, tuple(args))
    with _sigterm_stops_the_job():
        if engine == "mpi":
            from .mpi import spawn_mpi

            return spawn_mpi(payload, size, timeout, check)
        return _spawn_torch(payload, size, engine, timeout, check)


class _Terminated(BaseException):
    """SIGTERM arrived while a job ran: raised so that the job's ranks are stopped and its files
    removed on the way out."""


@contextlib.contextmanager
def _sigterm_stops_the_job() -> Iterator[None]:
    """Within, where SIGTERM would end this process at once (its default action, in the main
    thread): a SIGTERM stops the job's ranks and removes its directory first, then ends the
    process by SIGTERM as before (``timeout``, a scheduler's stop, ``kill``). Without it the
    ranks, or an MPI launcher in a session of its own, outlive the process. A handler the
    program set is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated()

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # the exit a SIGTERM gives, now that nothing is left
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _spawn_torch(payload: bytes, size: int, engine: str, timeout: float, check: bool) -> list[Any]:
    from . import torch_rank

    ctx = _context()
    tmp = tempfile.mkdtemp(prefix="reshard-spawn-")
    procs: list[Any] = []
    conns: list[Any] = []
    errs: list[Any] = []
    outs: list[Any] = []
    job = _Job(size)
    try:
        env = dict(os.environ)
        with main_not_imported(), _ctrl_c_after_start():
            for rank in range(size):
                recv_end, send_end = ctx.Pipe(duplex=False)
                err_end, err_send = ctx.Pipe(duplex=False)
                out_end, out_send = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=torch_rank.run, name=f"reshard-rank-{rank}", daemon=True,
                    args=(payload, rank, size, engine, tmp, timeout, check, env, send_end, err_send, out_send),
                )
                proc.start()
                for end in (send_end, err_send, out_send):
                    end.close()
                procs.append(proc)
                conns.append(recv_end)
                errs.append(err_end)
                outs.append(out_end)
        job.collect(procs, conns, errs, outs, time.monotonic() + timeout, timeout, tmp)
    except BaseException:  # Ctrl-C included: stop every rank before letting it through
        _stop(procs)
        raise
    finally:
        _stop(procs)
        job.finish_output()
        for c in conns + errs + outs:
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if job.failures:
        raise job_failed(size, job.failures, job.stopped, job.raised, job.seen, job.results)
    return [job.results[r] for r in range(size)]


class _Job:
    """What the ranks of one job have reported so far."""

    def __init__(self, size: int):
        self.size = size
        self.results: dict[int, Any] = {}
        self.failures: dict[int, str] = {}
        self.raised: dict[int, RankError] = {}
        self.stopped: list[int] = []
        self.output = RankOutput(size)
        self.seen: dict[int, activity.Seen | None] = {}
        self.streams: dict[Any, tuple[int, str]] = {}

    def collect(self, procs: list[Any], conns: list[Any], errs: list[Any], outs: list[Any], deadline: float,
                timeout: float, tmp: str) -> None:
        pending = set(range(len(procs)))
        # every rank's stderr and stdout pipe, until each reaches its end
        open_errs = self.streams = {errs[r]: (r, "stderr") for r in range(len(procs))} | {
            outs[r]: (r, "stdout") for r in range(len(procs))}
        first_failure: float | None = None
        while pending:
            until = deadline if first_failure is None else min(deadline, first_failure + FAILURE_GRACE_S)
            waitables = {conns[r]: r for r in pending} | {procs[r].sentinel: r for r in pending} | open_errs
            ready = mp.connection.wait(list(waitables), timeout=max(0.0, until - time.monotonic()))
            if not ready:
                break
            for obj in ready:
                if obj in open_errs:
                    self._pass_on(obj, open_errs)
                    continue
                rank = waitables[obj]
                if rank not in pending:
                    continue
                conn = conns[rank]
                msg = None
                if obj is conn or conn.poll():
                    try:
                        msg = pickle.loads(conn.recv_bytes())  # from our own child, over a local pipe
                    except (EOFError, OSError):
                        msg = None
                if msg is None:
                    procs[rank].join(5)
                    self._drain(errs[rank], open_errs)
                    self._drain(outs[rank], open_errs)
                    self.failures[rank] = self._death(rank, procs[rank].exitcode)
                elif msg[0] == "ok":
                    self.results[rank] = msg[1]
                else:
                    self.raised[rank] = msg[1]
                    self.failures[rank] = msg[1].text
                pending.discard(rank)
                if rank in self.failures and first_failure is None:
                    first_failure = time.monotonic()
        for err in list(open_errs):
            self._drain(err, open_errs)
        self.seen = {r: activity.read(os.path.join(tmp, f"activity-{r}")) for r in range(self.size)}
        for rank in sorted(pending):
            seen = self.seen[rank]
            where = f"; {seen.describe()}" if seen else ""
            if first_failure is not None:
                self.failures[rank] = f"rank {rank} was still running {FAILURE_GRACE_S:g} s after another rank failed{where}; stopped"
                self.stopped.append(rank)
            else:
                self.failures[rank] = f"rank {rank} did not finish within the timeout of {timeout:g} s{where}; stopped"

    def _pass_on(self, pipe: Any, open_pipes: dict[Any, tuple[int, str]]) -> None:
        """Forward what a rank wrote to stdout or stderr, whole lines at a time."""
        rank, stream = open_pipes[pipe]
        try:
            data = os.read(pipe.fileno(), 65536)
        except OSError:
            data = b""
        if not data:
            del open_pipes[pipe]
            return
        self.output.feed(rank, stream, data)

    def _drain(self, pipe: Any, open_pipes: dict[Any, tuple[int, str]]) -> None:
        while pipe in open_pipes and pipe.poll(0):
            self._pass_on(pipe, open_pipes)

    def finish_output(self) -> None:
        """What the ranks wrote until they ended, then the unfinished last lines."""
        for pipe in list(self.streams):
            try:
                self._drain(pipe, self.streams)
            except (OSError, ValueError):
                self.streams.pop(pipe, None)
        self.output.flush()

    def _death(self, rank: int, code: int | None) -> str:
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"ended with exit code {code}"
        tail = self.output.stderr_tail[rank].decode(errors="replace").strip().splitlines()[-15:]
        said = ("; the last lines it wrote to stderr:\n" + "\n".join(tail)) if tail else "; it wrote nothing to stderr"
        return f"rank {rank} {how} before reporting a result{said}"


@contextlib.contextmanager
def _ctrl_c_after_start() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) and SIGTERM while the ranks start, so that one sent then arrives once
    every rank started is known and can be stopped (else a rank half-started is left running)."""
    hold = hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if hold else None
    try:
        yield
    finally:
        if hold:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)
