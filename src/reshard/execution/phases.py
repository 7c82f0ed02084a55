"""Where one rank's time goes, when someone asks: spans of named phases (the check, each exchange,
the packs and sums around them, each message between hosts from posted to done), with the
thread that ran them. Off by default: a phase costs one global read when nobody listens.

    with phases.listening() as spans:
        ...                    # dispatch, combine
    # spans: [(name, thread name, start, end, bytes)], time.perf_counter() seconds

Used by ``reshard.bench.overlap.moe_phases_job`` to account for a MoE step's time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

Span = tuple[str, str, float, float, int]
T = TypeVar("T")

_spans: list[Span] | None = None  # where spans go while someone listens
_lock = threading.Lock()


@contextlib.contextmanager
def listening() -> Iterator[list[Span]]:
    """Collect every span recorded on any thread of this process until the block ends."""
    global _spans
    spans: list[Span] = []
    _spans = spans
    try:
        yield spans
    finally:
        _spans = None


def on() -> bool:
    return _spans is not None


def note(name: str, start: float, end: float, nbytes: int = 0) -> None:
    """A span measured by the caller (``time.perf_counter()`` seconds)."""
    spans = _spans
    if spans is not None:
        with _lock:
            spans.append((name, threading.current_thread().name, start, end, nbytes))


@contextlib.contextmanager
def phase(name: str, nbytes: int = 0) -> Iterator[None]:
    """The block as one span (nothing is recorded when nobody listens)."""
    if _spans is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        note(name, start, time.perf_counter(), nbytes)


def timed(name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A function whose every call is one span ``name`` while someone listens."""
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def timed_fn(*args: Any, **kwargs: Any) -> T:
            if _spans is None:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                note(name, start, time.perf_counter())

        return timed_fn

    return wrap
