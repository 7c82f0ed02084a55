"""Memory an op takes beyond its input: counted results and the pack buffer kept between calls.

Every path that packs, packs into one buffer kept between calls: page-faulting a fresh 16 MiB
buffer costs more than packing into it (see the performance docs).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

from .arrays import is_torch, numel
from .stats import Tally

_kept = threading.local()  # per thread: two threads may run ops on two communicators


def alloc(arrays: Any, tally: Tally, shape: Sequence[int], like: Any) -> Any:
    """``arrays.empty``, counted: ``explain`` and ``bench`` report the memory an op really took."""
    tally.allocated += numel(shape) * arrays.itemsize(like)
    return arrays.empty(shape, like=like)


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
