"""Where a rank is: its collective calls counted, and the one it is in now, in a small file
shared with the process that started it (``rs.spawn``), which reads it when the rank overruns
its time. Writing is two integer stores into a mapped page, cheap enough for every call.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

# Op names by code; a name not listed is recorded as its family before " (" or as "a collective".
OPS = ("", "all_to_all", "all_to_all_v", "all_gather", "gather", "reduce_scatter", "all_reduce",
       "redistribute", "moe.dispatch", "moe.combine", "barrier", "a collective")
_CODE = {name: i for i, name in enumerate(OPS)}
_SLOTS = 3  # calls so far, the op now running (0: none), the last op entered


def op_code(op: str) -> int:
    return _CODE.get(op) or _CODE.get(op.split(" (", 1)[0]) or _CODE["a collective"]


class Activity:
    """The writer, in the rank: ``enter(op)`` when a collective starts, ``leave()`` when it returns."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 8 * _SLOTS)
            self._map = mmap.mmap(fd, 8 * _SLOTS)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("q")
        self.calls = 0

    def enter(self, op: str) -> None:
        self.enter_code(op_code(op))

    def enter_code(self, code: int) -> None:
        """``enter`` with the op's code (``op_code``) worked out already."""
        self.calls += 1
        slots = self._slots
        slots[0] = self.calls
        slots[1] = code
        slots[2] = code

    def leave(self) -> None:
        self._slots[1] = 0


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
    calls, current, last = (int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(_SLOTS))

    def name(code: int) -> str:
        return OPS[code] if 0 <= code < len(OPS) else "a collective"

    return Seen(calls, name(current), name(last))
