"""Where a rank is: its collective calls counted, and the one it is in now, in a small file
shared with the process that started it (``rs.spawn``), which reads it when the rank overruns
its time. Writing is one integer store into a mapped page, cheap enough for every call.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

# Op names by code; a name not listed is recorded as its family before " (" or as "a collective".
OPS = ("", "all_to_all", "all_to_all_v", "all_gather", "gather", "reduce_scatter", "all_reduce",
       "redistribute", "moe.dispatch", "moe.combine", "barrier", "a collective")
_CODE = {name: i for i, name in enumerate(OPS)}
_SLOTS = 1  # one word: the calls so far, the last op entered and the op running now (0: none)
_CODE_BITS = 8


def op_code(op: str) -> int:
    return _CODE.get(op) or _CODE.get(op.split(" (", 1)[0]) or _CODE["a collective"]


class Activity:
    """The writer, in the rank: ``enter(op)`` when a collective starts, ``leave()`` when it
    returns; each one store of one word (calls, last op, current op), as a replay counts each."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 8 * _SLOTS)
            self._map = mmap.mmap(fd, 8 * _SLOTS)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("q")
        self.calls = 0
        self._left = 0  # the word once the current call returned: its current op cleared

    def enter(self, op: str) -> None:
        self.enter_code(op_code(op))

    def enter_code(self, code: int) -> None:
        """``enter`` with the op's code (``op_code``) worked out already."""
        self.calls += 1
        left = self._left = (self.calls << 2 * _CODE_BITS) | (code << _CODE_BITS)
        self._slots[0] = left | code

    def leave(self) -> None:
        self._slots[0] = self._left


@dataclass(frozen=True)
class Seen:
    """What the parent reads: ``calls`` made, the op running now ('' if none), the last one."""

    calls: int
    current: str
    last: str

    def describe(self) -> str:
        if self.current:
            return f"it was waiting in {self.current} (its collective call {self.calls})"
        if self.calls:
            calls = "1 call" if self.calls == 1 else f"{self.calls} calls"
            return f"it was outside reshard's collectives, after {calls} (the last: {self.last})"
        return "it had not called any collective yet"


def read(path: str) -> Seen | None:
    """The rank's activity, or None when it never wrote any."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8 * _SLOTS)
    except OSError:
        return None
    if len(raw) < 8 * _SLOTS:
        return None
    word = int.from_bytes(raw[:8], "little", signed=True)
    mask = (1 << _CODE_BITS) - 1
    calls, last, current = word >> 2 * _CODE_BITS, (word >> _CODE_BITS) & mask, word & mask

    def name(code: int) -> str:
        return OPS[code] if 0 <= code < len(OPS) else "a collective"

    return Seen(calls, name(current), name(last))
