"""Memory an op takes beyond its input: counted results and the pack buffer kept between calls.

Every path that packs, packs into one buffer kept between calls: page-faulting a fresh 16 MiB
buffer costs more than packing into it (see the performance docs).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..engines import arena as arena_mod
from . import handles
from .arrays import is_torch, numel
from .stats import Tally

_kept = threading.local()  # per thread: two threads may run ops on two communicators


def drop_thread_buffers() -> None:
    """Forget the buffers this thread kept (a worker thread that runs out of calls)."""
    _kept.__dict__.clear()


handles.AT_THREAD_END.append(drop_thread_buffers)


def alloc(arrays: Any, tally: Tally, shape: Sequence[int], like: Any) -> Any:
    """``arrays.empty``, counted: ``explain`` and ``bench`` report the memory an op really took.
    In the shared arena within ``arena.results_here`` (an exchange on the engine's path whose
    result the next exchange of a chain reads in place)."""
    tally.allocated += numel(shape) * arrays.itemsize(like)
    if arena_mod.results_wanted():
        out = shared_empty(shape, like)
        if out is not None:
            return out
    return arrays.empty(shape, like=like)


_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def shared_empty(shape: Sequence[int], like: Any) -> Any | None:
    """An uninitialised CPU array like ``like`` (numpy, or a torch tensor) in this process's
    arena; None where there is none or it is full."""
    import numpy as np

    if is_torch(like):
        torch = sys.modules["torch"]
        if like.device.type != "cpu":
            return None
        size = like.element_size()
        try:
            twin = torch.empty(0, dtype=like.dtype).numpy().dtype
        except TypeError:
            twin = None
        raw = arena_mod.numpy_array(shape, twin if twin is not None else _UINT.get(size, np.dtype((np.void, size))))
        if raw is None:
            return None
        if twin is not None:
            return torch.from_numpy(raw)
        flat = torch.from_numpy(raw.reshape(-1).view(np.uint8))
        return flat.view(like.dtype).reshape(tuple(shape))
    return arena_mod.numpy_array(shape, like.dtype)


def scratch(arrays: Any, tally: Tally, count: int, like: Any) -> Any:
    """A 1-D buffer of ``count`` elements like ``like``, reused across calls (not zeroed)."""
    nbytes = count * arrays.itemsize(like)
    key = (arrays.name, getattr(like, "device", None))
    cache = _kept.__dict__.setdefault("buffers", {})
    cached = cache.get(key)
    if cached is None or cached.shape[0] < nbytes:
        if is_torch(like):
            torch = sys.modules["torch"]
            cached = torch.empty(max(nbytes, 64), dtype=torch.uint8, device=like.device)
        else:
            import numpy as np

            cached = np.empty(max(nbytes, 64), dtype=np.uint8)
        cache[key] = cached
        tally.allocated += cached.shape[0]
    return cached[:nbytes].view(like.dtype)


def pack_buffer(call: Any, count: int, like: Any) -> Any:
    """The pack buffer of one exchange: in the engine's outbox where it has one (same-host
    peers read the pieces from there), else ``scratch``."""
    buf = call.primitives.send_buffer(count, like)
    return scratch(call.arrays, call.tally, count, like) if buf is None else buf


def release_buffers() -> None:
    """Drop this thread's pack buffers kept between calls (at most one shard per device);
    ``Comm.close()`` calls it."""
    _kept.__dict__.pop("buffers", None)


def empty_result(arrays: Any, shape: Sequence[int], like: Any) -> Any:
    """``arrays.empty`` for a result the executor counts itself: in the shared arena within
    ``arena.results_here``, as ``alloc`` does."""
    if arena_mod.results_wanted():
        out = shared_empty(shape, like)
        if out is not None:
            return out
    return arrays.empty(shape, like=like)
