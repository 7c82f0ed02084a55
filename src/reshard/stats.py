"""What the last collective on this process did: bytes, copies, buffers and the steps it ran.

``explain``, ``bench`` and the tests read it through ``rs.last_exchange()``; the executor fills
one ``ExchangeStats`` per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ExecutedStep(NamedTuple):
    """One step as this rank ran it: the collective and the bytes that left and arrived."""

    collective: str
    bytes_sent: int
    bytes_received: int


@dataclass
class ExchangeStats:
    """What the last exchange on this process did: for tests, ``explain`` and ``bench``."""

    op: str
    pack_copies: int = 0
    unpack_copies: int = 0
    bytes_sent: int = 0  # bytes that left this rank (its own piece excluded)
    bytes_received: int = 0  # bytes that arrived from other ranks
    recv_buffer_ptr: int = 0  # where the engine wrote what it received
    metadata_exchanges: int = 0
    allocated_bytes: int = 0  # buffers and results this op allocated (its memory beyond the input)
    replayed: bool = False  # the plan of an earlier call with the same signature was reused
    steps: list[ExecutedStep] = field(default_factory=list)  # in the order they ran

    def begin_step(self) -> tuple[int, int]:
        """The byte counters now, to close a step with ``end_step``."""
        return self.bytes_sent, self.bytes_received

    def end_step(self, collective: str, started: tuple[int, int]) -> None:
        self.steps.append(ExecutedStep(collective, self.bytes_sent - started[0], self.bytes_received - started[1]))


_last: ExchangeStats | None = None


def last_exchange() -> ExchangeStats | None:
    """Stats of the most recent collective on this process (None before the first)."""
    return _last


def set_last(stats: ExchangeStats) -> None:
    global _last
    _last = stats
