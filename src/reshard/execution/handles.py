"""Asynchronous collectives: ``async_op=True`` starts a collective and returns a ``Handle``.

A rank's collectives must run in the same order on every rank, so the started ones run one
after another, in the order they were started, on one worker thread of the process: the caller
goes on (computing, starting more) while the worker exchanges. Inside reshard, calls on a
communicator of their own (the MoE pipeline's combines) may run on a second worker, a *lane*
of that communicator: the order holds within each communicator, so two exchanges travel at once. The engines release the
interpreter while they move bytes (gloo's C++, MPI's C calls), so a matrix multiply on the
caller's thread runs while the bytes travel. A blocking call, a barrier or a communicator's
close first waits for every started call to finish, so the order stays the order of the
calls. The worker thread exists only while started calls are pending: it ends when the last
one finishes, and ``wait()`` of the last one returns after it has ended.

What a started call raises (bad input found by the cross-rank check, a peer that died, a
timeout) is raised by ``wait()``, on every rank as the blocking call would raise it there.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..errors import CommTimeout, InvalidArgument
from .tracebacks import PACKAGE_DIR, public_call

# what a worker thread runs as it runs out of calls, in the thread: the layers above that keep
# per-thread data (``buffers``) register how to free it
AT_THREAD_END: list[Callable[[], None]] = []


class Handle:
    """A started collective: ``wait(timeout=None)`` returns exactly what the blocking call
    returns (or raises what it raises); ``done()`` says, without blocking, whether it finished."""

    def __init__(self, op: str, rank: int, future: Future, worker: _Worker | None = None):
        self.op, self.rank = op, rank
        self._future = future
        self.worker = worker if worker is not None else _WORKER  # the worker that runs it
        self.waited = False
        self.site = _caller_site()  # the job's line that started it, for the warning if never waited for

    def done(self) -> bool:
        return self._future.done()

    @public_call
    def wait(self, timeout: float | None = None) -> Any:
        """The call's result. ``timeout`` (seconds; None waits as long as the call's own
        bounded waits take): raises ``CommTimeout`` naming the op if it runs out first; the
        call goes on, and a later ``wait()`` may still return its result."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0):
            raise InvalidArgument(f"rank {self.rank}: {self.op}: wait(timeout=) takes seconds >= 0 or None, got {timeout!r}")
        try:
            result = self._future.result(timeout)
        except FutureTimeout:
            raise CommTimeout(f"rank {self.rank}: {self.op}: wait(timeout={timeout}) ran out before the call "
                              "finished; it goes on, and a later wait() may still return it") from None
        finally:
            if self._future.done():
                self.waited = True
                self.worker.join_if_idle()
        return result

    def __repr__(self) -> str:
        return f"Handle({self.op!r}, {'done' if self.done() else 'pending'})"


class _Worker:
    """A worker thread and its queue of started calls: the process's own, or a lane's."""

    def __init__(self, name: str = "reshard-async") -> None:
        self.name = name
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.queue: deque[tuple[Future, Callable[[], Any], Any]] = deque()
        self.active = 0  # calls started and not finished (queued or running)
        self.thread: threading.Thread | None = None
        self.ended: threading.Thread | None = None  # the last thread that ran out of calls
        self.unwaited: list[Handle] = []

    def submit(self, op: str, rank: int, run: Callable[[], Any], comm: Any) -> Handle:
        future: Future = Future()
        handle = Handle(op, rank, future, self)
        with self.lock:
            self.unwaited = [h for h in self.unwaited if not h.waited]
            self.unwaited.append(handle)
            self.queue.append((future, run, comm))
            self.active += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self.thread.start()
        return handle

    def _loop(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    # what this thread kept (torch buffers among it) goes now, not as the thread
                    # ends: freeing a tensor lets go of the GIL, and a thread that cannot take it
                    # back because the interpreter is finishing aborts the process
                    for free in AT_THREAD_END:
                        free()
                    self.thread, self.ended = None, threading.current_thread()
                    self.idle.notify_all()
                    return
                future, run, _ = self.queue.popleft()
            try:
                result = run()
            except BaseException as exc:  # the caller's wait() raises it
                with self.lock:
                    self.active -= 1
                future.set_exception(exc)
            else:
                with self.lock:
                    self.active -= 1
                future.set_result(result)

    def on_worker(self) -> bool:
        return threading.current_thread() is self.thread

    def settle(self) -> None:
        """Wait until every started call has finished and the thread has ended (a blocking call
        runs after the calls started before it); nothing to do on a worker itself (its calls
        are ordered by its queue, and a lane's communicator is its own)."""
        if self.active == 0 and self.thread is None:
            return
        if _on_a_worker():
            return
        with self.lock:
            while self.active or self.thread is not None:
                self.idle.wait()
            ended = self.ended
        _join(ended)

    def join_if_idle(self) -> None:
        """After a wait(): where nothing else is pending, let the thread end before returning,
        so a program that waited for all it started holds no thread of ours."""
        ended = None
        with self.lock:
            if self.active == 0 and not self.on_worker():
                while self.thread is not None:
                    self.idle.wait()
                ended = self.ended
        _join(ended)

    def close(self, comm: Any) -> None:
        """A communicator closes: calls it started and nobody waited for are finished first,
        with a warning (cancelling them on some ranks only would leave the others hanging)."""
        with self.lock:
            never = [h for h in self.unwaited if not h.waited]
        if never:  # whether or not it has finished by now: the same warning on every rank
            calls = "1 started call" if len(never) == 1 else f"{len(never)} started calls"
            filename, line = never[0].site
            warnings.warn_explicit(
                f"the communicator closes with {calls} never waited for "
                f"({', '.join(h.op for h in never)}, the first started here): call .wait() on each handle",
                RuntimeWarning, filename, line)
        self.settle()
        with self.lock:
            self.unwaited = [h for h in self.unwaited if not h.waited and not h.done()]


def _join(thread: threading.Thread | None) -> None:
    """Until ``thread`` (one that ran out of calls) has ended, its thread-local data freed: a
    process that exits while a thread of ours still frees its state can abort."""
    if thread is not None and thread is not threading.current_thread():
        thread.join()


_WORKER = _Worker()
_LANES: dict[int, _Worker] = {}  # id of a lane's communicator -> its worker
_LANES_LOCK = threading.Lock()


def _workers() -> list[_Worker]:
    with _LANES_LOCK:
        return [_WORKER, *_LANES.values()]


def _on_a_worker() -> bool:
    return any(w.on_worker() for w in _workers())


def _caller_site() -> tuple[str, int]:
    """(file, line) of the innermost frame outside reshard: the job's call."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):  # imported by absolute path
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def submit(op: str, rank: int, run: Callable[[], Any], comm: Any, lane: Any = None) -> Handle:
    """``run()`` (the blocking call, on ``comm``) started: its ``Handle``. On the process's
    worker, or, with ``lane`` (a communicator no other started call uses), on that lane's own
    worker, so that it travels while the process's worker exchanges on another communicator."""
    if lane is None:
        return _WORKER.submit(op, rank, run, comm)
    with _LANES_LOCK:
        worker = _LANES.get(id(lane))
        if worker is None:
            worker = _LANES[id(lane)] = _Worker(f"reshard-lane-{len(_LANES) + 1}")
    return worker.submit(op, rank, run, comm)


def settle() -> None:
    """Called by every blocking call, barrier and close: wait for the calls started before it."""
    for worker in _workers():
        if worker.active or worker.thread is not None:
            worker.settle()


def close(comm: Any) -> None:
    for worker in _workers():
        worker.close(comm)
    with _LANES_LOCK:
        _LANES.clear()


def pending() -> int:
    """Started calls not finished yet (queued or running), on every worker (every call asks:
    one attribute read where no lane was ever made)."""
    if not _LANES:
        return _WORKER.active
    return sum(w.active for w in _workers())
