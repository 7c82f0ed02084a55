"""Notes between same-host gloo ranks, through shared memory.

A message to a same-host peer lies in the sender's outbox (``shm.Outbox``); what the peer
needs is a *note* (where it lies, how long it is) and the sender needs an *acknowledgement*
(read; the region may be written again). Each is one cache line in the head of its writer's
outbox: line ``q`` holds the note for peer ``q``, line ``size + q`` the acknowledgement to it,
each ``(seq, ...)``, the number written last. Per pair and direction the numbers count the
messages, so a line is written again only after its reader has taken the last one (an
exchange returns once its messages are acknowledged). A gloo note would cost a round of the
engine's own messages (0.5-1 ms here); this costs a write and a read of one line. x86-64 only:
its store and load order (TSO) makes "number last, read number first" safe without fences
(``usable_here``); elsewhere the notes go as gloo messages.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import CommTimeout, RankFailed, ranks_text

LINE_WORDS = 8  # int64 words of one note or acknowledgement: a cache line each


def usable_here() -> bool:
    """Whether plain stores and loads order as the notes need (x86-64's TSO)."""
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` still runs (unknown counts as running; a zombie has ended)."""
    if pid is None:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


SPINS = 64  # looks before a wait hands its core over, where every rank has a core of its own


def cores_here() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spins_for(local_ranks: int) -> int:
    """How many times a wait looks before it hands its core to others: a few where every rank
    of this host has a core of its own; none where ranks share cores, as the rank being waited
    for may need this one (4 ranks on 2 cores: a checked 8 MiB replay took 1.11-1.13x MPI's
    bare Alltoallw without the spins, 1.15-1.19x with 64)."""
    return SPINS if local_ranks <= cores_here() else 0


class Poll:
    """The pauses of a wait on memory a peer writes: ``spins`` looks (``spins_for``), then the
    core handed to others (a peer being waited for may share it), then short sleeps once the
    wait is long; ``pause`` says when to look for peers that ended, ``expired`` when the timeout
    has passed."""

    __slots__ = ("start", "polls", "timeout", "spins")

    def __init__(self, timeout: float, spins: int = SPINS) -> None:
        self.start, self.polls, self.timeout, self.spins = time.monotonic(), 0, timeout, spins

    def pause(self) -> bool:
        """Wait a little; True now and then: the caller should check its peers are alive."""
        self.polls += 1
        if self.polls <= self.spins:
            return False
        waited = time.monotonic() - self.start
        if waited < 0.002:
            os.sched_yield()
        else:  # a long wait: spinning would take the core from the ranks being waited for
            time.sleep(min(1e-4, waited / 20))
        return self.polls % 256 == 0

    def expired(self) -> bool:
        return time.monotonic() - self.start > self.timeout


class Mailbox:
    """This rank's notes and acknowledgements to its same-host peers (``mine``: the head of
    its outbox, ``2 * size`` lines) and its peers' to it (``peers``: theirs, read-only)."""

    def __init__(self, rank: int, size: int, mine: np.ndarray, peers: dict[int, np.ndarray],
                 pids: dict[int, int], timeout: float) -> None:
        self.rank, self.size, self.mine, self.peers, self.pids, self.timeout = rank, size, mine, peers, pids, timeout
        self.spins = spins_for(len(peers) + 1)
        self.sent = [0] * size  # messages posted to each peer
        self.got = [0] * size  # messages taken from each peer

    @staticmethod
    def nbytes(size: int) -> int:
        """The bytes of a mailbox for a group of ``size`` ranks."""
        return 2 * size * LINE_WORDS * 8

    def post(self, peer: int, offset: int, nbytes: int) -> None:
        """The note for ``peer``: its message lies at ``offset`` of this rank's outbox."""
        seq = self.sent[peer] = self.sent[peer] + 1
        at = peer * LINE_WORDS
        self.mine[at + 1] = offset
        self.mine[at + 2] = nbytes
        self.mine[at] = seq  # last: a peer that reads this number finds the rest beside it

    def settle(self, incoming: Sequence[tuple[int, Any]], outgoing: Sequence[int],
               read: Callable[[int, int, Any], str | None], what: str) -> str | None:
        """Take each note of ``incoming`` (peer, contiguous uint8 tensor it fills), read its
        message with ``read(peer, offset, into)`` and acknowledge it; then wait until every
        peer of ``outgoing`` has acknowledged this rank's. Returns what went wrong, if
        anything (a length or a read that failed); raises when a peer ended or the timeout passed."""
        waiting = dict(incoming)
        unacked = set(outgoing)
        failed: str | None = None
        poll = Poll(self.timeout, self.spins)
        me, size, mine = self.rank, self.size, self.mine
        gone: set[int] = set()  # peers found ended, blamed only if one more look finds them still owing
        while waiting or unacked:
            for peer in list(waiting):
                board, at = self.peers[peer], me * LINE_WORDS
                if board[at] != self.got[peer] + 1:
                    continue
                self.got[peer] += 1
                into = waiting.pop(peer)
                offset, nbytes = int(board[at + 1]), int(board[at + 2])
                why = (f"rank {peer} sent {nbytes} bytes where {into.numel()} were expected" if nbytes != into.numel()
                       else read(peer, offset, into))
                ack = (size + peer) * LINE_WORDS
                mine[ack + 1] = 0 if why is None else 1
                mine[ack] = self.got[peer]
                failed = failed or why
            for peer in list(unacked):
                board, at = self.peers[peer], (size + me) * LINE_WORDS
                if board[at] == self.sent[peer]:
                    unacked.discard(peer)
                    if board[at + 1]:
                        failed = failed or f"rank {peer} could not read this rank's message"
            if waiting or unacked:
                owing = set(waiting) | unacked
                if gone & owing:  # ended, and its lines read again after that: nothing more will come
                    self._raise_gone(what, sorted(gone & owing))
                if poll.pause():
                    gone = {q for q in owing if not alive(self.pids.get(q))}
                if poll.expired():
                    raise CommTimeout(f"rank {me}: {what}: waited more than {self.timeout:g} s for "
                                      f"{ranks_text(owing)} "
                                      "(a rank never reached this collective)")
        return failed

    def _raise_gone(self, what: str, dead: list[int]) -> None:
        raise RankFailed(f"rank {self.rank}: {what}: {ranks_text(dead)} gone (process ended)",
                         dict.fromkeys(dead, "its process ended"))
