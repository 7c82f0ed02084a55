"""Point-to-point messages between ranks on one host through shared memory.

Over loopback TCP a message is copied twice by the kernel (into the socket, out of it) and
costs a wake-up per chunk; through shared memory it is one copy. Each rank keeps an *outbox*:
an anonymous memory file (``memfd``) its packs are written into. A peer on the same host opens
that file once, read-only, through ``/proc/<pid>/fd/<fd>``, and reads a message out of it
straight into its destination; the engine's own small messages say where the message lies and
when it has been read. Nothing is named in the file system, so nothing is left behind when a
rank ends, however it ends; only processes of the same user (allowed to read the rank's
``/proc`` entries) can open the outbox. ``RESHARD_SHM=0`` on any rank turns it off for its pairs.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import settings
from ..errors import WORLD, CommTimeout, RankFailed, RankNames, ranks_text
from .shared_pages import map_file
from .shm_notes import Mailbox, Poll, alive, spins_for, usable_here

_ALIGN = 64  # every message starts on a cache line
# Where notes go as gloo messages, a smaller message goes by gloo's own path: its one hop
# beats a note and a copy (performance docs). RESHARD_SHM_MIN_BYTES sets it for every rank.
NOTES_BY_GLOO_MIN_BYTES = 1 << 20
_TOKEN_BYTES = 16
# The outbox's first two cache lines: the token, the vote board's two slots of (seq, v0, v1),
# then the host leader's two result slots of (seq, v0, v1, note): what it learned of the vote.
_BOARD_BYTES = 192
BOARD_WORDS = _BOARD_BYTES // 8  # int64 words of one rank's board
_CLOSED_AT = 16  # the board's word that its rank sets when it closes: it will never vote again
# A leader's notes, carried in its hosts' all-reduce (by max: the surest wins) and handed to its
# host: what it found of rank (note & _WHO) - 1 of its host, or that its all-reduce failed.
_WHO = 0xFFFFFFFF
_SILENT = 1 << 32  # never voted within the leader's share of the timeout
_CLOSED = 1 << 33  # closed its communicator (its job returned) without voting
_GONE = 1 << 34  # its process ended
_LEADERS_FAILED = 1 << 35  # the all-reduce among the leaders raised (not carried across)
_LEADERS_SILENT = 1 << 36  # the all-reduce among the leaders ran out of time (not carried across)
# Across hosts, a leader waits this share of the timeout for its host's votes, so that a rank that
# never voted is still named to the other hosts while their leaders wait in the all-reduce.
LEADER_WAIT_SHARE = 0.75
LEADER_GRACE = 5.0  # seconds a host's other ranks wait past the timeout for its leader's note


def enabled_here() -> bool:
    """Shared memory is offered by this rank (Linux memfd, not turned off)."""
    return settings.read("RESHARD_SHM") and hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def smallest_here(notes_in_memory: bool | None = None) -> int:
    """The smallest message this rank sends through shared memory: ``RESHARD_SHM_MIN_BYTES``,
    else every message where the notes go through shared memory too (``shm_notes``), else
    1 MiB (below it, a gloo note and a copy cost more than gloo's own message)."""
    smallest = settings.read("RESHARD_SHM_MIN_BYTES")
    if smallest is not None:
        return smallest
    return 0 if (usable_here() if notes_in_memory is None else notes_in_memory) else NOTES_BY_GLOO_MIN_BYTES


def host_key() -> int:
    """Ranks with the same key may share memory: the same boot of the same machine, in the same
    process and network namespaces (a network namespace of its own counts as another host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts = [f.read().strip()]
    except OSError:
        parts = [""]
    for ns in ("pid", "net", "ipc"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            parts.append("")
    return int.from_bytes(hashlib.blake2b("/".join(parts).encode(), digest_size=8).digest(), "little") >> 1


class Outbox:
    """This rank's messages to its same-host peers: a memory file that grows, handed out in
    regions from a cursor that goes back to 0 once an exchange is over. Its first ``head``
    bytes are the board's lines (token, vote) and the mailbox's (``shm_notes``), never a message."""

    def __init__(self, capacity: int = mmap.PAGESIZE, head: int = _BOARD_BYTES) -> None:
        import torch

        self._torch = torch
        self.head = -(-head // _ALIGN) * _ALIGN
        capacity = max(capacity, self.head)
        self.fd = os.memfd_create("reshard-outbox", os.MFD_CLOEXEC)
        self.capacity = 0
        self.maps: list[tuple[int, int, Any]] = []  # (address, length, tensor): every mapping stays valid
        self.cursor = 0
        self.high_water = 0  # the furthest any exchange has written: the memory in use
        self.unreported = 0  # the new high-water mark, not yet counted in a call's tally
        self._grow(capacity)
        self.token = np.frombuffer(os.urandom(_TOKEN_BYTES), dtype=np.int64).copy()
        self.view(0, _TOKEN_BYTES).numpy()[:] = self.token.view(np.uint8)

    def _grow(self, need: int) -> None:
        size = max(need, 2 * self.capacity)
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        os.ftruncate(self.fd, size)
        mapped = map_file(self.fd, size, writable=True)
        tensor = self._torch.frombuffer(mapped, dtype=self._torch.uint8)
        self.maps.append((tensor.data_ptr(), size, tensor))
        self.capacity = size

    def count_again(self) -> None:
        """The next exchange counts all the outbox it uses as allocated, as if it grew it
        (``reshard bench`` measures every method's memory alike, whichever ran first)."""
        self.high_water = self.head

    def view(self, offset: int, nbytes: int) -> Any:
        """uint8 tensor over ``[offset, offset + nbytes)`` of the file (the newest mapping)."""
        return self.maps[-1][2][offset : offset + nbytes]

    def take(self, nbytes: int) -> Any:
        """A fresh region of ``nbytes`` for this exchange's messages."""
        offset = -(-max(self.cursor, self.head) // _ALIGN) * _ALIGN  # the head holds the board and mailbox
        if offset + nbytes > self.capacity:
            self._grow(offset + nbytes)
        self.cursor = offset + nbytes
        if self.cursor > self.high_water:  # counted as ``scratch`` counts: all of it, when it grows
            self.unreported = self.cursor - self.head  # the head's lines are the file's own
            self.high_water = self.cursor
        return self.view(offset, nbytes)

    def offset_of(self, buf: Any) -> int | None:
        """Where ``buf`` (contiguous uint8) lies in the file, or None when it is not in the outbox."""
        start = buf.data_ptr()
        for address, length, _ in self.maps:
            if address <= start and start + buf.numel() <= address + length:
                return start - address
        return None

    def place(self, buf: Any) -> int:
        """The file offset of ``buf``'s bytes: where they are, or where they were copied to."""
        offset = self.offset_of(buf)
        if offset is None:
            region = self.take(buf.numel())
            region.copy_(buf)
            offset = self.offset_of(region)
        return offset

    def close(self) -> None:
        self.maps.clear()  # the mappings go with their last tensor
        os.close(self.fd)


class LocalPeers:
    """The ranks of one group that this rank reaches through shared memory, and their outboxes
    opened read-only."""

    def __init__(self, outbox: Outbox, peer_fds: dict[int, int], smallest: dict[int, int] | None = None,
                 pids: dict[int, int] | None = None, mailbox: Mailbox | None = None) -> None:
        self.outbox = outbox
        self.mailbox = mailbox  # the notes through shared memory, or None (then they go as gloo messages)
        self.pids = pids or {}  # peer -> its process, to tell a dead peer from a slow one
        self.peer_fds = peer_fds
        self.peers = frozenset(peer_fds)
        self.views: dict[int, np.ndarray] = {}  # peer -> its outbox, mapped read-only
        # peer -> the smallest message that goes this way: the larger of the pair's settings
        self.smallest = smallest if smallest is not None else dict.fromkeys(peer_fds, smallest_here())

    @classmethod
    def open(cls, rank: int, size: int, allgather_bytes: Callable[[np.ndarray], np.ndarray],
             timeout: float = 300.0) -> LocalPeers | None:
        """Collective over the group: find the same-host peers whose outbox this rank can read
        and that can read this rank's (both ways, or the pair keeps to the engine's own path)."""
        offer = enabled_here() and size > 1
        notes_here = usable_here()
        smallest = smallest_here(notes_here)
        outbox = None
        if offer:
            try:
                outbox = Outbox(head=_BOARD_BYTES + (Mailbox.nbytes(size) if notes_here else 0))
            except OSError:
                offer = False
        card = np.zeros(7, dtype=np.int64)
        if outbox is not None:
            card[:] = [1, host_key(), os.getpid(), outbox.fd, *outbox.token, smallest]
        cards = allgather_bytes(card.view(np.uint8)).view(np.int64)
        fds: dict[int, int] = {}
        for q in range(size):
            if q != rank and offer and cards[q, 0] == 1 and cards[q, 1] == card[1]:
                fd = open_peer_file(int(cards[q, 2]), int(cards[q, 3]), cards[q, 4:6])
                if fd is not None:
                    fds[q] = fd
        can_read = np.zeros(size, dtype=np.uint8)
        can_read[list(fds)] = 1
        reads = allgather_bytes(np.packbits(can_read)).reshape(size, -1)
        both = {q: fd for q, fd in fds.items() if np.unpackbits(reads[q])[rank]}
        for q, fd in fds.items():
            if q not in both:
                os.close(fd)
        if not both:
            if outbox is not None:
                outbox.close()
            return None
        pids = {q: int(cards[q, 2]) for q in both}
        mailbox = None
        if notes_here:  # the mailbox follows the board in every outbox's head (same host: same rule)
            area = _BOARD_BYTES + Mailbox.nbytes(size)
            mine = outbox.maps[0][2][_BOARD_BYTES:area].numpy().view(np.int64)
            theirs = {q: np.frombuffer(mmap.mmap(fd, area, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.int64)[BOARD_WORDS:]
                      for q, fd in both.items()}
            mailbox = Mailbox(rank, size, mine, theirs, pids, timeout)
        return cls(outbox, both, {q: max(smallest, int(cards[q, 6])) for q in both}, pids, mailbox)

    def reaches(self, peer: int, nbytes: int) -> bool:
        """This message goes through shared memory (both sides decide alike: same rule, same length)."""
        smallest = self.smallest.get(peer)
        return smallest is not None and nbytes >= smallest

    def read(self, peer: int, offset: int, into: Any) -> str | None:
        """Copy ``into.numel()`` bytes at ``offset`` of ``peer``'s outbox into ``into``
        (contiguous uint8); a reason when the region is not there."""
        n = into.numel()
        if n == 0:
            return None
        mapped = self.views.get(peer)
        if mapped is None or offset + n > mapped.size:
            try:
                size = os.fstat(self.peer_fds[peer]).st_size
                if offset + n > size:
                    return f"its shared memory holds {size} bytes, not the {n} at offset {offset}"
                # mapped once and kept: a read is then a plain copy, with no page faults
                area = map_file(self.peer_fds[peer], size, writable=False)
            except OSError as exc:
                return f"mapping its shared memory failed ({exc.strerror})"
            mapped = self.views[peer] = np.frombuffer(area, dtype=np.uint8)
        np.copyto(into.numpy(), mapped[offset : offset + n])
        return None

    def close(self) -> None:
        self.views.clear()  # the mappings go with their last view
        for fd in self.peer_fds.values():
            os.close(fd)
        self.peer_fds = {}
        self.outbox.close()


class VoteBoard:
    """The replay vote (an elementwise max of two int64) through shared memory: each rank
    writes its vote into its own outbox's first cache line and reads its peers' from theirs.
    A vote is numbered; slot ``seq % 2`` holds it, so a rank one vote ahead never overwrites
    what a slower peer still reads (it cannot get two ahead: the next vote waits for that
    peer). The number is written after the values and read before them, which x86-64's store
    and load order makes safe; elsewhere the engine's own all-reduce votes (``shm_notes.usable_here``).

    On one host every rank reads every peer's vote. Across hosts (``across`` given) the host's
    lowest rank, its leader, reads its host's votes, takes the all-reduce ``across`` with the
    other hosts' leaders, and writes the result into its board, where its host's ranks read it
    (``two_level``; ``across`` is given to the leader):
    one small exchange among one rank per host instead of one among all."""

    rank_names: RankNames = WORLD  # how messages name the ranks (the engine's ``name_ranks``)

    def __init__(self, mine: np.ndarray, peers: dict[int, np.ndarray], pids: dict[int, int], rank: int, timeout: float,
                 two_level: bool = False, across: Callable[[np.ndarray], np.ndarray] | None = None,
                 leaders: Sequence[int] = ()) -> None:
        """``mine``: this rank's board (int64, ``_BOARD_BYTES`` of shared memory, written only
        here); ``peers``: each same-host peer's, read-only; ``pids``: their processes;
        ``leaders``: every host's lowest rank (two levels)."""
        self.rank, self.timeout, self.two_level, self.across = rank, timeout, two_level, across
        self.leaders = list(leaders)
        self.mine, self.peers, self.pids = mine, peers, pids
        self.leader = min(rank, *peers)
        self.spins = spins_for(len(peers) + 1)
        self.seq = 0
        self.files: list[int] = []  # descriptors the board holds open (its own memory file, its peers')

    @classmethod
    def in_outboxes(cls, local: LocalPeers, rank: int, timeout: float, two_level: bool = False,
                    across: Callable[[np.ndarray], np.ndarray] | None = None, leaders: Sequence[int] = ()) -> VoteBoard:
        """The board in the first lines of this rank's outbox and of its peers' (gloo)."""
        mine = local.outbox.maps[0][2][:_BOARD_BYTES].numpy().view(np.int64)
        peers = {q: np.frombuffer(mmap.mmap(fd, _BOARD_BYTES, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.int64)
                 for q, fd in local.peer_fds.items()}
        return cls(mine, peers, dict(local.pids), rank, timeout, two_level, across, leaders)

    @classmethod
    def in_memfd(cls, rank: int, size: int, allgather_bytes: Callable[[np.ndarray], np.ndarray],
                 timeout: float) -> VoteBoard | None:
        """Collective: a board in a memory file of this rank's own, its peers' opened read-only
        as outboxes are (numpy only: the MPI engine's); None unless every rank reaches every
        other on one host."""
        if size < 2:  # alone: the vote is this rank's own
            return None
        offer = enabled_here() and usable_here()
        card = np.zeros(6, dtype=np.int64)
        fd, area = -1, None
        if offer:
            try:
                fd = os.memfd_create("reshard-vote", os.MFD_CLOEXEC)
                os.ftruncate(fd, mmap.PAGESIZE)
                area = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError:
                offer = False
        mine = np.frombuffer(area, dtype=np.int64, count=BOARD_WORDS) if area is not None else None
        if offer:
            mine[:2] = np.frombuffer(os.urandom(_TOKEN_BYTES), dtype=np.int64)
            card[:] = [1, host_key(), os.getpid(), fd, *mine[:2]]
        cards = allgather_bytes(card.view(np.uint8)).view(np.int64).reshape(size, 6)
        peers, fds = {}, []
        if offer:
            for q in range(size):
                if q != rank and cards[q, 0] == 1 and cards[q, 1] == card[1]:
                    qfd = open_peer_file(int(cards[q, 2]), int(cards[q, 3]), cards[q, 4:6])
                    if qfd is not None:
                        fds.append(qfd)
                        peers[q] = np.frombuffer(mmap.mmap(qfd, _BOARD_BYTES, mmap.MAP_SHARED, mmap.PROT_READ),
                                                 dtype=np.int64)
        everyone = np.array([len(peers) == size - 1], dtype=np.uint8)
        if not allgather_bytes(everyone).all():
            for qfd in fds:
                os.close(qfd)
            if fd >= 0:
                os.close(fd)
            return None
        board = cls(mine, peers, {q: int(cards[q, 2]) for q in peers}, rank, timeout)
        board.files = [fd, *fds]  # closed with the board
        return board


    def start(self, values: Any) -> Callable[[], np.ndarray]:
        """Write this rank's vote; the result waits for every peer's (bounded by the timeout)."""
        self.seq += 1
        seq, at = self.seq, 2 + 3 * (self.seq % 2)
        vote = np.asarray(values, dtype=np.int64)
        self.mine[at + 1 : at + 3] = vote
        self.mine[at] = seq  # last: a peer that reads this number finds the values beside it

        def finish() -> np.ndarray:
            if not self.two_level:
                best = vote.copy()
                for board in self._wait_for(self.peers, at, seq):
                    np.maximum(best, board[at + 1 : at + 3], out=best)
                return best
            res = 8 + 4 * (seq % 2)
            if self.rank != self.leader:
                leader = {self.leader: self.peers[self.leader]}
                try:
                    board = next(iter(self._wait_for(leader, res, seq)))
                except CommTimeout:
                    self._raise_local_silence(at, seq)
                    # every rank of this host voted: the leader waits on the other hosts, bounded
                    # by its own timeout, and then hands over what it learned
                    try:
                        board = next(iter(self._wait_for(leader, res, seq, within=LEADER_GRACE)))
                    except CommTimeout:
                        raise CommTimeout(f"{self.rank_names.one(self.rank)}: the check's vote had no result within "
                                          f"{self.timeout + LEADER_GRACE:g} s from rank {self.leader}, this host's "
                                          "lowest, which waits on the other hosts' lowest ranks") from None
                result, note = board[res + 1 : res + 3].copy(), int(board[res + 3])
                self._raise_noted(note)
                return result
            # The host's leader: its host's votes, then the other hosts' through their leaders.
            # A local rank found gone, closed or silent is noted in the leaders' all-reduce, so
            # every host names it.
            best, noted = vote.copy(), []
            for board in self._wait_for(self.peers, at, seq, noted, self.timeout * LEADER_WAIT_SHARE):
                np.maximum(best, board[at + 1 : at + 3], out=best)
            note = noted[0] | (noted[1] + 1) if noted else 0
            try:
                reduced = np.asarray(self.across(np.array([*best, note], dtype=np.int64)), dtype=np.int64)
            except CommTimeout:
                self._publish(res, seq, best, _LEADERS_SILENT)  # its host's ranks learn why no result comes
                self._raise_noted(_LEADERS_SILENT)
            except Exception:
                self._publish(res, seq, best, _LEADERS_FAILED)
                raise
            self._publish(res, seq, reduced[:2], int(reduced[2]))
            self._raise_noted(int(reduced[2]))
            return reduced[:2].copy()

        return finish

    def _publish(self, res: int, seq: int, values: np.ndarray, note: int) -> None:
        """The leader's result for its host: the values and the note, then (last) the number."""
        self.mine[res + 1 : res + 3] = values
        self.mine[res + 3] = note
        self.mine[res] = seq

    def _raise_noted(self, note: int) -> None:
        """The error a leader's note stands for, on this rank (nothing for no note)."""
        who, seen = (note & _WHO) - 1, "seen by the lowest rank of its host"
        if note & _LEADERS_SILENT:
            others = [q for q in self.leaders if q != self.leader]
            named = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {ranks_text(others, word=False)}"
            raise CommTimeout(f"{self.rank_names.one(self.rank)}: the check's vote among the hosts' lowest ranks "
                              f"({', '.join(map(str, self.leaders))}) ran out of time (seen by rank {self.leader}, "
                              f"this host's lowest): {named} never reached this collective, or a rank of its host "
                              "never voted")
        if note & _LEADERS_FAILED:
            raise RankFailed(f"{self.rank_names.one(self.rank)}: the check's vote among the hosts' lowest ranks failed "
                             f"(seen by rank {self.leader}, this host's lowest): a rank of another host may have ended")
        if note & _GONE:
            raise RankFailed(f"{self.rank_names.one(self.rank)}: the check's vote found {self.rank_names.one(who)} gone (its process ended; {seen})",
                             {who: "its process ended"})
        if note & _CLOSED:
            raise RankFailed(f"{self.rank_names.one(self.rank)}: {self.rank_names.one(who)} closed the communicator (its job returned) without "
                             f"joining this collective ({seen})", {who: "closed the communicator"})
        if note & _SILENT:
            raise CommTimeout(f"{self.rank_names.one(self.rank)}: the check's vote waited more than "
                              f"{self.timeout * LEADER_WAIT_SHARE:g} s for {self.rank_names.one(who)} (a rank never reached this "
                              f"collective; {seen})")

    def _wait_for(self, boards: dict[int, np.ndarray], at: int, seq: int, noted: list[int] | None = None,
                  within: float | None = None) -> list[np.ndarray]:
        """Each of ``boards`` once its slot at ``at`` carries ``seq``; bounded by ``within``
        seconds (the timeout where not given). A peer whose process ended or that closed its
        board is named at once; with ``noted`` given (a host's leader), what was found of the
        lowest such peer (or, at the bound, of the lowest silent one) goes there instead, as
        ``[kind, rank]``, and the wait ends with the boards ready so far."""
        waiting, ready = dict(boards), []
        poll = Poll(self.timeout if within is None else within, self.spins)
        while waiting:
            for q, board in list(waiting.items()):
                if board[at] == seq:
                    ready.append(board)
                    del waiting[q]
            if waiting:
                if poll.pause():  # now and then: a peer that ended will never vote
                    dead = sorted(q for q in waiting if not alive(self.pids.get(q)))
                    closed = sorted(q for q in waiting if self._closed(q))
                    # a peer may have voted and then returned since its slot was read: its vote,
                    # written before it ended or closed, is read again before it is blamed
                    for q in {*dead, *closed}:
                        if waiting[q][at] == seq:
                            ready.append(waiting.pop(q))
                    dead = [q for q in dead if q in waiting]
                    closed = [q for q in closed if q in waiting]
                    if (dead or closed) and noted is not None:
                        noted.extend([_GONE, dead[0]] if dead else [_CLOSED, closed[0]])
                        return ready
                    if dead:
                        raise RankFailed(f"{self.rank_names.one(self.rank)}: the check's vote found {self.rank_names.many(dead)} gone "
                                         "(process ended)",
                                         dict.fromkeys(dead, "its process ended"))
                    if closed:
                        raise RankFailed(f"{self.rank_names.one(self.rank)}: {self.rank_names.many(closed)} closed "
                                         "the communicator (their job returned) without joining this collective",
                                         dict.fromkeys(closed, "closed the communicator"))
                if poll.expired():
                    if noted is not None:
                        noted.extend([_SILENT, min(waiting)])
                        return ready
                    raise CommTimeout(
                        f"{self.rank_names.one(self.rank)}: the check's vote waited more than {poll.timeout:g} s for "
                        f"{self.rank_names.many(waiting)} (a rank never reached this collective)")
        return ready

    def _raise_local_silence(self, at: int, seq: int) -> None:
        """After the host's lowest rank handed over no result in time: ``CommTimeout`` naming the
        ranks of this host that never voted, where there are any (their boards are read here too);
        else nothing (the leader voted and waits on the other hosts)."""
        silent = sorted(q for q, board in self.peers.items() if board[at] < seq)  # a slot holds seq or seq - 2
        if silent:
            raise CommTimeout(f"{self.rank_names.one(self.rank)}: the check's vote waited more than {self.timeout:g} s for "
                              f"{self.rank_names.many(silent)} (a rank never reached this collective)")

    def _closed(self, peer: int) -> bool:
        """Whether ``peer`` closed its board (a same-host peer's; one across hosts is not seen)."""
        board = self.peers.get(peer)
        return board is not None and board.size > _CLOSED_AT and bool(board[_CLOSED_AT])

    def close(self) -> None:
        """Say to the peers that this rank will not vote again, then let go of the boards: a
        peer still waiting for this rank's vote fails at once instead of at its timeout."""
        if self.mine is not None and self.mine.size > _CLOSED_AT:
            self.mine[_CLOSED_AT] = 1
        self.peers.clear()
        for fd in getattr(self, "files", ()):
            os.close(fd)
        self.files = []


def open_peer_file(pid: int, fd: int, token: np.ndarray) -> int | None:
    """A read-only descriptor of another process's outbox, when it is one (regular file, the
    token it announced at its start), else None."""
    try:
        mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(mine).st_mode) and os.pread(mine, _TOKEN_BYTES, 0) == token.tobytes():
            return mine
    except OSError:
        pass
    os.close(mine)
    return None
