"""The shared arena: this process's CPU arrays that its same-host peers can read in place.

One arena per process, shared by all its communicators, meshes and sub-communicators: an
anonymous memory file (``memfd``) of the cap's size (``RESHARD_ARENA_BYTES``), sparse, mapped
once here and, read-only, once by each peer that reads from it (``engines.arena_link``). Pages
are taken as arrays are written; a freed block is kept for reuse while the blocks alive and
kept stay within the most ever alive at once (or 64 MiB), so after each free the arena holds
at most that; beyond it, the excess pages go back to the system (``MADV_REMOVE`` punches them
out of the file). Nothing is named in the file system; only
processes of the same user that may read this process's ``/proc`` entries can open it.

An array here is an ordinary numpy array (or a CPU torch tensor over one): its block goes back
to the arena when the last view of it is gone. It cannot be resized in place; pickling and
``share_memory_()`` give ordinary copies. A forked child sees the parent's arena arrays as
private copies (written pages are its own, never the parent's peers') and allocates from an
arena of its own.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import ctypes
import math
import mmap
import os
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import settings
from .shared_pages import map_file

PAGE = mmap.PAGESIZE
HEAD_BYTES = PAGE  # the file's first page: its token (who may read it), never an array
TOKEN_BYTES = 16
KEEP_WARM_BYTES = 64 << 20  # free blocks kept touched (no page faults on reuse) at least up to this
# a block of a huge page or more starts on one and fills whole ones, so where the kernel gives
# shared memory huge pages (``shared_pages``) no two blocks share one and a block's pages go back whole
HUGE = 2 << 20
_ALIGN = 64


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_cap() -> int:
    """Half of this machine's memory (the cap when ``RESHARD_ARENA_BYTES`` is unset)."""
    memory = machine_memory()
    return memory // 2 if memory is not None else 8 << 30


def supported() -> str | None:
    """Why no arena can be made on this machine (None: it can)."""
    if not hasattr(os, "memfd_create"):
        return "this system has no anonymous memory files (memfd_create: Linux only)"
    if not os.path.isdir("/proc/self/fd"):
        return "no /proc file system: peers could not open the arena"
    if not hasattr(mmap, "MADV_REMOVE"):
        return "this system cannot return a file's pages (MADV_REMOVE)"
    return None


class _Block:
    """The owner of one block: the numpy arrays over it keep it alive (their ``base``); once
    the last is gone, its finalizer hands the block back."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": shape, "typestr": dtype.str,
                                    "descr": dtype.descr, "version": 3}


class Arena:
    """One process's shared memory for arrays: ``take(nbytes)`` gives a block's offset,
    ``give(offset)`` takes it back; ``array(shape, dtype)`` an array over a fresh block."""

    def __init__(self, cap: int | None = None) -> None:
        why = supported()
        if why is not None:
            raise OSError(why)
        cap = settings.read("RESHARD_ARENA_BYTES") if cap is None else cap
        cap = default_cap() if cap is None else cap
        self.cap = max(-(-cap // PAGE) * PAGE, HEAD_BYTES + PAGE)
        self.fd = os.memfd_create("reshard-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.cap)  # sparse: no page is taken until written
        self.map = map_file(self.fd, self.cap, writable=True)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.token = os.urandom(TOKEN_BYTES)
        self.map[:TOKEN_BYTES] = self.token
        self.pid = os.getpid()
        self.inherited = False  # a forked child's copy: never written through, never allocated from
        self.lock = threading.RLock()
        self.top = HEAD_BYTES  # nothing past here was ever handed out
        self.cold: list[tuple[int, int]] = []  # free (offset, length), pages punched out, sorted, merged
        self.warm: list[tuple[int, int]] = []  # free (offset, length) whose pages are kept, sorted, merged
        self.warm_bytes = 0
        self.blocks: dict[int, int] = {}  # offset -> length of every block handed out
        self.starts: list[int] = []  # the offsets of ``blocks``, sorted: ``where`` bisects them
        self.live = 0  # bytes of the blocks handed out
        self.peak_live = 0
        self.touched_peak = 0  # the furthest ``top`` went: the file's largest size in use
        self.warned = False

    # -- blocks ----------------------------------------------------------------------------

    def take(self, nbytes: int) -> int | None:
        """The offset of a free block of at least ``nbytes`` (whole pages; whole huge pages from
        one huge page up, starting on one), or None past the cap: the best-fitting warm range
        first (no page to fault), then a returned one, then fresh space."""
        length = max(-(-nbytes // PAGE) * PAGE, PAGE)
        align = HUGE if length >= HUGE else PAGE
        length = -(-length // align) * align
        with self.lock:
            if self.inherited:
                return None
            offset = _best_fit(self.warm, length, align)
            if offset is not None:
                self.warm_bytes -= length
            else:
                offset = _best_fit(self.cold, length, align)
                if offset is None:
                    start = -(-self.top // align) * align
                    if start + length > self.cap:
                        return None
                    if start > self.top:  # the space skipped to reach a huge page: free, never touched
                        _insert(self.cold, self.top, start - self.top)
                    offset, self.top = start, start + length
                    self.touched_peak = max(self.touched_peak, self.top)
            self.blocks[offset] = length
            bisect.insort(self.starts, offset)
            self.live += length
            self.peak_live = max(self.peak_live, self.live)
            return offset

    def give(self, offset: int) -> None:
        """Take back the block at ``offset``: kept warm (its pages touched, so reusing it faults
        no page here or in the peers that read it) while the blocks alive and kept warm stay
        within the most ever alive at once (or ``KEEP_WARM_BYTES``); past that, the excess goes
        back to the system from the ends of the largest warm ranges."""
        with self.lock:
            if self.inherited or os.getpid() != self.pid:
                return
            length = self.blocks.pop(offset, None)
            if length is None:
                return
            del self.starts[bisect.bisect_left(self.starts, offset)]
            self.live -= length
            _insert(self.warm, offset, length)
            self.warm_bytes += length
            # only the excess goes back, from the largest ranges' ends: the pages held then stay
            # at the limit from call to call instead of dropping by a whole range and refaulting
            excess = self.live + self.warm_bytes - max(self.peak_live, KEEP_WARM_BYTES)
            while excess > 0 and self.warm:
                largest = max(range(len(self.warm)), key=lambda i: self.warm[i][1])
                start, size = self.warm[largest]
                cut = min(size, excess)
                if cut == size:
                    del self.warm[largest]
                else:
                    self.warm[largest] = (start, size - cut)
                self.warm_bytes -= cut
                excess -= cut
                self._punch(start + size - cut, cut)

    def _punch(self, offset: int, length: int) -> None:
        """The block's pages back to the system; its range joins the cold free list (merged)."""
        try:
            self.map.madvise(mmap.MADV_REMOVE, offset, length)
        except OSError:
            pass  # the pages stay taken; the range is still free for reuse
        _insert(self.cold, offset, length)
        if self.cold and sum(self.cold[-1]) == self.top:  # the end of the used range comes back
            self.top = self.cold.pop()[0]

    def array(self, shape: Sequence[int], dtype: Any) -> np.ndarray | None:
        """A C-order numpy array of ``shape`` and ``dtype`` in a fresh block (not zeroed), or None
        past the cap."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        offset = self.take(nbytes)
        if offset is None:
            return None
        owner = _Block(self.base + offset, shape, dtype)
        weakref.finalize(owner, self.give, offset)
        return np.asarray(owner)

    def where(self, address: int, nbytes: int) -> int | None:
        """The file offset of ``[address, address + nbytes)`` when it lies in one live block here."""
        offset = address - self.base
        if offset < HEAD_BYTES or offset + nbytes > self.top or self.inherited:
            return None
        with self.lock:
            starts = self.starts
            i = bisect.bisect_right(starts, offset) - 1
            if i < 0 or offset + nbytes > starts[i] + self.blocks[starts[i]]:
                return None
        return offset

    def used_bytes(self) -> int:
        """Bytes of the file's pages in use or kept warm (what the system counts for it)."""
        return self.live + self.warm_bytes

    def private_in_child(self) -> None:
        """In a forked child: the parent's file mapped again at the same address, copy-on-write,
        so this process's writes never reach what the parent's peers read."""
        self.inherited = True
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        map_fixed = 0x10
        got = libc.mmap(self.base, self.cap, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | map_fixed, self.fd, 0)
        if got != self.base:  # cannot happen with MAP_FIXED unless the call failed: read-only is the safe side
            libc.mprotect(ctypes.c_void_p(self.base), ctypes.c_size_t(self.cap), mmap.PROT_READ)


def _best_fit(ranges: list[tuple[int, int]], length: int, align: int = PAGE) -> int | None:
    """Take ``length`` bytes starting on a multiple of ``align`` from the smallest of ``ranges``
    (sorted free (offset, length)) that holds them; their offset, or None where none does. What
    the range keeps before and after them stays in ``ranges``."""
    best = None
    for i, (offset, size) in enumerate(ranges):
        skip = -offset % align
        if size - skip >= length and (best is None or size < ranges[best][1]):
            best = i
            if size == length:
                break
    if best is None:
        return None
    offset, size = ranges[best]
    start = offset + (-offset % align)
    kept = [(offset, start - offset), (start + length, offset + size - start - length)]
    ranges[best : best + 1] = [(o, n) for o, n in kept if n > 0]
    return start


def _insert(ranges: list[tuple[int, int]], offset: int, length: int) -> None:
    """Add the free range to ``ranges`` (sorted by offset), merged with its neighbours."""
    i = bisect.bisect(ranges, (offset, length))
    if i < len(ranges) and offset + length == ranges[i][0]:
        length += ranges.pop(i)[1]
    if i > 0 and sum(ranges[i - 1]) == offset:
        offset, length = ranges[i - 1][0], ranges[i - 1][1] + length
        ranges.pop(i - 1)
        i -= 1
    ranges.insert(i, (offset, length))


_state: dict[str, Any] = {"arena": None, "failed": None}
_lock = threading.Lock()


def arena() -> Arena | None:
    """This process's arena, made on first use; None where none can be made."""
    current = _state["arena"]
    if current is not None and not current.inherited:
        return current
    with _lock:
        current = _state["arena"]
        if current is not None and not current.inherited:
            return current
        if _state["failed"] is not None:
            return None
        try:
            _state["arena"] = Arena()
        except OSError as exc:
            _state["failed"] = str(exc)
            return None
        return _state["arena"]


def why_not() -> str | None:
    """Why this process has no arena (None: it has one, or can make one)."""
    return _state["failed"] if _state["failed"] is not None else supported()


def _after_fork_in_child() -> None:
    parent = _state["arena"]
    if parent is not None:
        parent.private_in_child()
    _state["arena"] = None  # the child's own, made on its first use
    _state["parent"] = parent  # kept: its mapping backs the arrays the child inherited


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def enabled() -> bool:
    """Results go into the arena by default (``RESHARD_ARENA``; off with ``RESHARD_SHM=0``)."""
    return settings.read("RESHARD_ARENA") and settings.read("RESHARD_SHM")


def numpy_array(shape: Sequence[int], dtype: Any) -> np.ndarray | None:
    """A numpy array in this process's arena, or None (no arena, or past its cap: warned once)."""
    where = arena()
    if where is None:
        return None
    out = where.array(shape, dtype)
    if out is None and not where.warned:
        where.warned = True
        warnings.warn(f"reshard's shared arena is full ({where.cap:,} bytes, RESHARD_ARENA_BYTES): "
                      "further results come from ordinary memory", ResourceWarning, stacklevel=3)
    return out


def locate(a: np.ndarray) -> tuple[int, int] | None:
    """(file offset, bytes) of a C-contiguous numpy array lying in this process's arena, else None."""
    where = _state["arena"]
    if where is None or where.inherited or not a.flags.c_contiguous:
        return None
    offset = where.where(a.__array_interface__["data"][0], a.nbytes)
    return None if offset is None else (offset, a.nbytes)


_results_here = contextvars.ContextVar("reshard_results_in_arena", default=False)


@contextlib.contextmanager
def results_here() -> Iterator[None]:
    """Within: the results an exchange's forms allocate lie in the arena (an exchange that
    took the engine's path, so that the next exchange of a chain reads its result in place)."""
    token = _results_here.set(True)
    try:
        yield
    finally:
        _results_here.reset(token)


def results_wanted() -> bool:
    return _results_here.get()


def result_array(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)``, in the arena within ``results_here`` (where it has room)."""
    if _results_here.get():
        out = numpy_array(shape, dtype)
        if out is not None:
            return out
    return np.empty(shape, dtype)
