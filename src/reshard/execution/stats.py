"""What the last collective on this process did: bytes, copies, buffers and the steps it ran.

``explain``, ``bench`` and the tests read it through ``rs.last_exchange()``; the executor fills
one ``ExchangeStats`` per call.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .arrays import data_ptr


class Tally:
    """What a step's forms did beyond moving the plan's bytes, noted as they do it: copies into
    send buffers (``packs``) and out of landing buffers (``unpacks``), bytes of memory taken
    (``allocated``), and where the engine received (``landing``: an address, or the array it
    received into). The executor records it in the call's ``ExchangeStats`` after the steps
    and starts it again; a form never writes the stats."""

    __slots__ = ("packs", "unpacks", "allocated", "landing", "staged")

    def __init__(self) -> None:
        self.packs = self.unpacks = self.allocated = 0
        self.staged = 0  # inputs copied into the shared arena for peers to read (one pack each)
        self.landing: Any = None


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
    metadata_exchanges: int = 0
    allocated_bytes: int = 0  # buffers and results this op allocated (its memory beyond the input)
    replayed: bool = False  # the plan of an earlier call with the same signature was reused
    cross_host_bytes_sent: int = 0  # of bytes_sent, those to ranks on other hosts (comm.hosts)
    cross_host_messages: int = 0  # messages to ranks on other hosts (one per step and peer)
    steps: list[ExecutedStep] = field(default_factory=list)  # in the order they ran
    tensors: list[ExchangeStats] = field(default_factory=list)  # a call on many tensors: each one's part
    _staged: int = field(default=0, repr=False, compare=False)  # of pack_copies: inputs copied into the arena
    _received_into: Any = field(default=0, repr=False, compare=False)  # an address, or a weakref to the result

    @property
    def recv_buffer_ptr(self) -> int:
        """Where the engine wrote what it received (0 where nothing was, or once a result
        received into is freed)."""
        into = self._received_into
        if type(into) is int:
            return into
        buffer = into()
        return 0 if buffer is None else data_ptr(buffer)

    @property
    def received_into(self) -> Any:
        """Where the engine wrote what it received, as noted: an address, or a weak reference
        to the result (``received_into_result``)."""
        return self._received_into

    @received_into.setter
    def received_into(self, into: Any) -> None:
        self._received_into = into

    def copy(self) -> ExchangeStats:
        """A copy with a list of steps of its own."""
        made = copy.copy(self)
        made.steps = list(self.steps)
        made.tensors = [t.copy() for t in self.tensors]
        return made

    def with_staged(self, staged: int) -> ExchangeStats:
        """A copy for a run that copied ``staged`` inputs into the shared arena where this one
        copied ``_staged`` (an input there is read in place; another is copied there first)."""
        made = self.copy()
        made.pack_copies += staged - self._staged
        made._staged = staged
        return made

    def received_at(self, address: int) -> None:
        self._received_into = address

    def received_into_result(self, result: Any) -> None:
        """The engine received straight into ``result``: noted by weak reference (the stats keep
        no result alive), its address read only when asked (numpy's costs a microsecond)."""
        self._received_into = weakref.ref(result)

    def begin_step(self) -> tuple[int, int]:
        """The byte counters now, to close a step with ``end_step``."""
        return self.bytes_sent, self.bytes_received

    def end_step(self, collective: str, started: tuple[int, int]) -> None:
        self.steps.append(ExecutedStep(collective, self.bytes_sent - started[0], self.bytes_received - started[1]))


_last: ExchangeStats | tuple | None = None  # a tuple: a hot replay's, made into stats when read


def last_exchange() -> ExchangeStats | None:
    """Stats of the most recent collective on this process (None before the first)."""
    global _last
    if type(_last) is tuple:
        template, received_into = _last
        made = template.copy()
        made._received_into = received_into
        _last = made
    return _last


def set_last_replay(template: ExchangeStats, received_into: Any) -> None:
    """The last collective was a replay that ended as ``template`` did, its result received
    into ``received_into`` (see ``ExchangeStats._received_into``): the stats are made only
    when read, so a training loop's replay allocates none."""
    global _last
    _last = (template, received_into)


def set_last(stats: ExchangeStats) -> None:
    global _last
    _last = stats
