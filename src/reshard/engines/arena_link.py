"""Exchanges on one host by reading in place: each rank copies its boxes straight out of its
peers' sources, which lie in their shared arenas (``engines.arena``), into its own result.

A link joins the ranks of one group when every rank shares memory with every other (one host,
``RESHARD_SHM`` and ``RESHARD_ARENA`` on everywhere, x86-64's store order for the notes); it
is made once per group, collectively, at the first exchange that uses it. Per exchange, each
rank posts a *note* to each peer that reads from it (where its source lies in its arena, its
length, which exchange), each reader copies its boxes out and *acknowledges*; a rank returns
only once every reader has, so no source is changed, freed or returned while a peer still
reads it. A source not in the arena is first copied into it (then each byte moves twice, as on
the engine's own path). The notes are cache lines in a small memory file of each rank's own,
as ``shm_notes`` writes them: the number last, read first.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import settings
from ..errors import CommTimeout, MismatchError, RankFailed
from . import arena as arena_mod
from .shm import enabled_here, host_key, open_peer_file
from .shm_notes import LINE_WORDS, Poll, alive, spins_for, usable_here

_HEAD = 64  # the notes file's first line: its token


def exchange_tag(*parts: Any) -> int:
    """A number both sides of an exchange compute alike from what they planned (shapes, boxes):
    a reader that finds another in a note was planned differently and reads nothing."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class ArenaLink:
    """The notes between the ranks of one group and the peers' arenas, mapped read-only."""

    def __init__(self, rank: int, size: int, mine: np.ndarray, lines: dict[int, np.ndarray], arena_fds: dict[int, int],
                 pids: dict[int, int], files: list[int], timeout: float) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.mine, self.lines, self.arena_fds, self.pids, self.files = mine, lines, arena_fds, pids, files
        self.views: dict[int, np.ndarray] = {}  # peer -> its arena, mapped read-only on first read
        self.sent = [0] * size
        self.got = [0] * size
        self.spins = spins_for(size)
        self.min_bytes = settings.read("RESHARD_ARENA_MIN_BYTES")  # the largest of the group's, once opened

    @classmethod
    def open(cls, rank: int, size: int, allgather_bytes: Callable[[np.ndarray], np.ndarray],
             timeout: float) -> ArenaLink | None:
        """Collective over the group: the link, or None on every rank unless every rank can
        read every other's arena and notes."""
        if size < 2:
            return None
        where = arena_mod.arena() if enabled_here() and arena_mod.enabled() and usable_here() else None
        card = np.zeros(10, dtype=np.int64)
        fd, area = -1, None
        if where is not None:
            try:
                fd = os.memfd_create("reshard-notes", os.MFD_CLOEXEC)
                nbytes = _HEAD + 2 * size * LINE_WORDS * 8
                os.ftruncate(fd, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
                area = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                token = os.urandom(16)
                area[:16] = token
                card[:] = [1, host_key(), os.getpid(), where.fd, *np.frombuffer(where.token, dtype=np.int64),
                           fd, *np.frombuffer(token, dtype=np.int64), settings.read("RESHARD_ARENA_MIN_BYTES")]
            except OSError:
                if fd >= 0:
                    os.close(fd)
                fd, area = -1, None
        cards = allgather_bytes(card.view(np.uint8)).view(np.int64).reshape(size, 10)
        arena_fds, note_fds, lines = {}, {}, {}
        if not cards[:, 0].all():  # a rank offers none: no second round
            if fd >= 0:
                os.close(fd)
            return None
        if card[0]:
            for q in range(size):
                if q == rank or not cards[q, 0] or cards[q, 1] != card[1]:
                    continue
                afd = open_peer_file(int(cards[q, 2]), int(cards[q, 3]), cards[q, 4:6])
                nfd = open_peer_file(int(cards[q, 2]), int(cards[q, 6]), cards[q, 7:9])
                if afd is not None:
                    arena_fds[q] = afd
                if nfd is not None:
                    note_fds[q] = nfd
        reached = np.array([len(arena_fds) == size - 1 and len(note_fds) == size - 1], dtype=np.uint8)
        if not allgather_bytes(reached).all():
            for f in [*arena_fds.values(), *note_fds.values(), *([fd] if fd >= 0 else [])]:
                os.close(f)
            return None
        nbytes = _HEAD + 2 * size * LINE_WORDS * 8
        for q, nfd in note_fds.items():
            lines[q] = np.frombuffer(mmap.mmap(nfd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.int64)[_HEAD // 8:]
        mine = np.frombuffer(area, dtype=np.int64)[_HEAD // 8:]
        pids = {q: int(cards[q, 2]) for q in range(size) if q != rank}
        link = cls(rank, size, mine, lines, arena_fds, pids, [fd, *note_fds.values()], timeout)
        link.min_bytes = int(cards[:, 9].max())
        return link

    # -- one exchange ----------------------------------------------------------------------

    def source(self, peer: int, offset: int, nbytes: int) -> np.ndarray | str:
        """``nbytes`` at ``offset`` of ``peer``'s arena (uint8, read-only), or why not."""
        view = self.views.get(peer)
        if view is None:
            try:
                size = os.fstat(self.arena_fds[peer]).st_size
                view = self.views[peer] = np.frombuffer(
                    mmap.mmap(self.arena_fds[peer], size, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.uint8)
            except OSError as exc:
                return f"mapping its arena failed ({exc.strerror})"
        if offset < 0 or offset + nbytes > view.size:
            return f"its note points past its arena ({offset} + {nbytes} > {view.size})"
        return view[offset : offset + nbytes]

    def post(self, source: tuple[int, int], readers: dict[int, tuple[int, int, int]]) -> None:
        """Post ``source`` (offset, bytes in this rank's arena; bytes -1: it could not be
        placed there) to every peer of ``readers`` (peer -> (tag, start, extent): what that
        peer needs to find its part). Both sides of a pair compute the tag alike from what
        they planned (``exchange_tag``); ``settle`` follows."""
        mine = self.mine
        offset, nbytes = source
        for q, (tag, start, extent) in readers.items():
            seq = self.sent[q] = self.sent[q] + 1
            at = q * LINE_WORDS
            mine[at + 1 : at + 6] = (offset, nbytes, tag, start, extent)
            mine[at] = seq  # last: a peer that reads this number finds the rest beside it

    def settle(self, readers: dict[int, tuple[int, int, int]], writers: dict[int, int],
               read: Callable[[int, np.ndarray, int, int], str | None], what: str) -> None:
        """For each peer of ``writers`` (peer -> tag), once its note comes, ``read(peer, its
        source as uint8, start, extent)`` (a reason when it cannot) and acknowledge; return
        once every peer of ``readers`` (``post``'s) has acknowledged this rank's note."""
        mine, size, me = self.mine, self.size, self.rank
        waiting, unacked = dict(writers), set(readers)
        failed: str | None = None
        poll = Poll(self.timeout, self.spins)
        while waiting or unacked:
            for q in list(waiting):
                line, at = self.lines[q], me * LINE_WORDS
                if line[at] != self.got[q] + 1:
                    continue
                self.got[q] += 1
                want = waiting.pop(q)
                got_offset, got_bytes, got_tag, start, extent = (int(v) for v in line[at + 1 : at + 6])
                if got_bytes < 0:
                    why = f"rank {q}'s arena is full (RESHARD_ARENA_BYTES): its input could not be placed there"
                elif got_tag != want:
                    why = f"rank {q} planned this exchange differently (its shapes or layouts differ)"
                else:
                    src = self.source(q, got_offset, got_bytes)
                    why = f"rank {q}: {src}" if isinstance(src, str) else read(q, src, start, extent)
                ack = (size + q) * LINE_WORDS
                mine[ack + 1] = 0 if why is None else 1
                mine[ack] = self.got[q]
                failed = failed or why
            for q in list(unacked):
                line, at = self.lines[q], (size + me) * LINE_WORDS
                if line[at] == self.sent[q]:
                    unacked.discard(q)
                    if line[at + 1]:
                        failed = failed or f"rank {q} could not read this rank's input"
            if waiting or unacked:
                if poll.pause():
                    dead = sorted(q for q in set(waiting) | unacked if not alive(self.pids.get(q)))
                    if dead:
                        raise RankFailed(f"rank {me}: {what}: rank(s) {', '.join(map(str, dead))} gone "
                                         "(their process ended)", dict.fromkeys(dead, "its process ended"))
                if poll.expired():
                    raise CommTimeout(f"rank {me}: {what}: waited more than {self.timeout:g} s for rank(s) "
                                      f"{', '.join(map(str, sorted(set(waiting) | unacked)))} "
                                      "(a rank never reached this collective)")
        if failed is not None:
            raise MismatchError(f"rank {me}: {what}: {failed}")

    def close(self) -> None:
        self.views.clear()
        self.lines.clear()
        for f in [*self.files, *self.arena_fds.values()]:
            if f >= 0:
                os.close(f)
        self.files, self.arena_fds = [], {}


def close_links(links: dict[str, Any] | None) -> None:
    """Close the link an engine holds (``arena_links``), if it made one."""
    link = links.pop("link", None) if links else None
    if link:
        link.close()
