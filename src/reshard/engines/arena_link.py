"""Exchanges on one host by reading in place: each rank copies its boxes straight out of its
peers' sources, which lie in their shared arenas (``engines.arena``), into its own result.

A link joins the ranks of one group when every rank shares memory with every other (one host,
``RESHARD_SHM`` and ``RESHARD_ARENA`` on everywhere, x86-64's store order for the notes); it
is made once per group, collectively, at the first exchange that uses it. Per exchange, each
rank posts a *note* to every peer (where its input lies in its arena, or that it does not,
and what the peer needs to find its part); where every input lies in an arena, each reader
copies its boxes out and *acknowledges*, and a rank returns only once every peer has, so no
input is changed, freed or returned while a peer still reads it. Where one does not, every rank
sees it in the same notes and the exchange takes the engine's own path (its result still in
the arena, so the next exchange of a chain reads in place). The notes are cache lines in a
small memory file of each rank's own, as ``shm_notes`` writes them: the number last, read first.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import settings
from ..errors import CommTimeout, MismatchError, RankFailed, ReshardError, ranks_text
from . import arena as arena_mod
from .shared_pages import map_file
from .shm import enabled_here, host_key, open_peer_file
from .shm_notes import LINE_WORDS, Poll, alive, spins_for, usable_here

_HEAD = 64  # the notes file's first line: its token
# per peer: two note lines (exchange k's note in line k % 2, so a rank may post the next note
# before a peer that went the engine's way took this one) and one acknowledgement line
LINES = 3


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
        self.count = 0  # exchanges on this link (the same sequence on every rank)
        self.got = [0] * size  # the last note taken from each peer
        self.peers = [q for q in range(size) if q != rank]
        self.spins = spins_for(size)
        self.min_bytes = settings.read("RESHARD_ARENA_MIN_BYTES")  # the largest of the group's, once opened
        self.kept: list[tuple[int, Any]] = []  # (exchange, source) read by peers that may not have acknowledged yet
        self.index: np.ndarray | None = None  # the int64 index exchanges post (``index_for``), kept for the next

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
                nbytes = _HEAD + LINES * size * LINE_WORDS * 8
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
        nbytes = _HEAD + LINES * size * LINE_WORDS * 8
        for q, nfd in note_fds.items():
            lines[q] = np.frombuffer(mmap.mmap(nfd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.int64)[_HEAD // 8:]
        mine = np.frombuffer(area, dtype=np.int64)[_HEAD // 8:]
        pids = {q: int(cards[q, 2]) for q in range(size) if q != rank}
        link = cls(rank, size, mine, lines, arena_fds, pids, [fd, *note_fds.values()], timeout)
        link.min_bytes = int(cards[:, 9].max())
        return link

    def index_for(self, index: np.ndarray) -> tuple[int, int] | None:
        """``index`` copied into this rank's arena for ``exchange(index=)``: (offset, bytes), or
        None past the arena's cap. One block, kept from exchange to exchange (the link's
        exchanges run one at a time and each waits for its readers), so that a small block
        taken and freed every call does not split the ranges the large results reuse."""
        count = len(index)
        if self.index is None or len(self.index) < count:
            self.index = None  # the old block back to the arena before the larger one is taken
            self.index = arena_mod.numpy_array((max(count + count // 4, 1024),), np.int64)  # room to vary
            if self.index is None:
                return None
        self.index[:count] = index
        return arena_mod.locate(self.index[:count])

    # -- one exchange ----------------------------------------------------------------------

    def source(self, peer: int, offset: int, nbytes: int) -> np.ndarray | str:
        """``nbytes`` at ``offset`` of ``peer``'s arena (uint8, read-only), or why not."""
        view = self.views.get(peer)
        if view is None:
            try:
                size = os.fstat(self.arena_fds[peer]).st_size
                view = self.views[peer] = np.frombuffer(
                    map_file(self.arena_fds[peer], size, writable=False), dtype=np.uint8)
            except OSError as exc:
                return f"mapping its arena failed ({exc.strerror})"
        if offset < 0 or offset + nbytes > view.size:
            return f"its note points past its arena ({offset} + {nbytes} > {view.size})"
        return view[offset : offset + nbytes]

    def exchange(self, source: tuple[int, int] | None, readers: dict[int, tuple[int, int, int]],
                 writers: dict[int, int], read: Callable[[int, np.ndarray, int, int], str | None],
                 what: str, meanwhile: Callable[[], None] | None = None, keep: Any = None,
                 index: tuple[int, int] | None = None) -> bool:
        """One exchange, read in place if every rank's input lies in its arena. Post ``source``
        (offset and bytes in this rank's arena, or None: not there) to every peer, with what a
        peer of ``readers`` (peer -> (tag, start, extent)) needs to find its part. Without a
        source, return False at once: the exchange takes the engine's path on every rank (each
        learns it from this note). With one, take every peer's note: where every note has a
        source, for each peer of ``writers`` (peer -> tag) ``read(peer, its source as uint8,
        start, extent)`` (a reason when it cannot), acknowledge, run ``meanwhile()`` (this
        rank's own part) and return True once every peer has acknowledged this rank's note (no
        rank returns, changes or frees its input while a peer still reads it); else
        acknowledge and return False. Both sides of a pair compute the tag alike from what
        they planned (``exchange_tag``).

        ``keep``: the source is this link's own (no caller sees it again), so return without
        waiting for the acknowledgements: ``keep`` (what owns the source's memory) is held
        until every peer has acknowledged, which a later exchange waits for anyway before it
        writes its note. A reader that fails raises on its own rank only.

        ``index``: (offset, bytes) of an int64 array in this rank's arena whose entries name the
        source's rows that it sends, in order (MoE's routed tokens, never gathered): a peer's
        ``start`` then counts entries of it, and ``read`` gets the peer's index as a keyword
        (``index=``, uint8) where its note has one."""
        mine, size, me, lines, got = self.mine, self.size, self.rank, self.lines, self.got
        self.count += 1
        k = self.count
        peers = self.peers
        poll = Poll(self.timeout, self.spins)
        # the notes of the last exchange that this rank did not wait for (it went the engine's way)
        behind = {q for q in peers if got[q] < k - 1}
        if behind:
            self._wait(poll, behind, what, lambda q: lines[q][self._note(me, k - 1)] == k - 1)
            for q in behind:
                got[q] = k - 1
                self._ack(q, 0)
        # note k goes in the line that held note k - 2: its reader must have taken that one
        ack_at = (2 * size + me) * LINE_WORDS
        self._wait(poll, {q for q in peers if lines[q][ack_at] < k - 2}, what, lambda q: lines[q][ack_at] >= k - 2)
        if self.kept:  # sources of exchanges every peer has acknowledged go back
            self.kept = [(j, obj) for j, obj in self.kept if j > k - 2]
        offset, nbytes = source if source is not None else (0, -1)
        index_at, index_bytes = index if index is not None else (0, -1)
        for q in peers:
            tag, start, extent = readers.get(q, (0, 0, 0))
            at = self._note(q, k)
            mine[at + 1 : at + 8] = (offset, nbytes, tag, start, extent, index_at, index_bytes)
            mine[at] = k  # last: a peer that reads this number finds the rest beside it
        if source is None:
            return False
        self._wait(poll, set(peers), what, lambda q: lines[q][self._note(me, k)] == k)
        notes = {}
        for q in peers:
            got[q] = k
            at = self._note(me, k)
            notes[q] = tuple(int(v) for v in lines[q][at + 1 : at + 8])
        reading = all(note[1] >= 0 for note in notes.values())
        failed: str | None = None
        for q in peers:
            why = None
            if reading and q in writers:
                got_offset, got_bytes, got_tag, start, extent, index_at, index_bytes = notes[q]
                if got_tag != writers[q]:
                    why = f"rank {q} planned this exchange differently (its shapes or layouts differ)"
                else:
                    why = self._read(q, read, (got_offset, got_bytes), start, extent,
                                     (index_at, index_bytes) if index_bytes >= 0 else None)
            self._ack(q, 0 if why is None else 1)
            failed = failed or why
        if reading:
            if meanwhile is not None and failed is None:
                meanwhile()
            if keep is not None and failed is None:
                self.kept.append((k, keep))
                return True
            self._wait(poll, set(peers), what, lambda q: lines[q][ack_at] >= k)
            bad = [q for q in peers if lines[q][ack_at + 1]]
            if bad and failed is None:
                failed = f"rank {bad[0]} could not read this rank's input"
        if failed is not None:
            raise MismatchError(f"rank {me}: {what}: {failed}")
        return reading

    def _read(self, peer: int, read: Callable[..., str | None], source: tuple[int, int], start: int, extent: int,
              index: tuple[int, int] | None) -> str | None:
        """``read`` on ``peer``'s source (and index, where its note has one), or why not."""
        src = self.source(peer, *source)
        if isinstance(src, str):
            return f"rank {peer}: {src}"
        if index is None:
            return read(peer, src, start, extent)
        rows = self.source(peer, *index)
        if isinstance(rows, str):
            return f"rank {peer}: {rows}"
        return read(peer, src, start, extent, index=rows)

    def _note(self, peer: int, k: int) -> int:
        """Where exchange ``k``'s note to ``peer`` lies in its writer's lines."""
        return (2 * peer + k % 2) * LINE_WORDS

    def _ack(self, peer: int, failed: int) -> None:
        """Acknowledge ``peer``'s notes up to the last taken (``failed``: its input could not be read)."""
        at = (2 * self.size + peer) * LINE_WORDS
        self.mine[at + 1] = failed
        self.mine[at] = self.got[peer]

    def _wait(self, poll: Poll, waiting: set[int], what: str, ready: Callable[[int], bool]) -> None:
        """Until ``ready(q)`` for every peer of ``waiting``: a peer whose process ended is named
        (``RankFailed``), and the timeout bounds it (``CommTimeout``)."""
        while waiting:
            waiting = {q for q in waiting if not ready(q)}
            if not waiting:
                return
            if poll.pause():
                # a peer that wrote and then ended since it was read is not blamed: read it again
                dead = sorted(q for q in waiting if not alive(self.pids.get(q)) and not ready(q))
                if dead:
                    raise RankFailed(f"rank {self.rank}: {what}: {ranks_text(dead)} gone (process ended)",
                                     dict.fromkeys(dead, "its process ended"))
            if poll.expired():
                raise CommTimeout(f"rank {self.rank}: {what}: waited more than {self.timeout:g} s for "
                                  f"{ranks_text(waiting)} (a rank never reached this collective)")

    def close(self) -> None:
        if self.kept:  # peers may still read the last sources: wait a little for them, not for the dead
            ack_at = (2 * self.size + self.rank) * LINE_WORDS
            last = self.kept[-1][0]
            try:
                self._wait(Poll(min(self.timeout, 5.0), 0), set(self.peers), "closing",
                           lambda q: self.lines[q][ack_at] >= last)
            except ReshardError:
                pass
            self.kept = []
        self.views.clear()
        self.lines.clear()
        self.index = None
        for f in [*self.files, *self.arena_fds.values()]:
            if f >= 0:
                os.close(f)
        self.files, self.arena_fds = [], {}


def close_links(links: dict[str, Any] | None) -> None:
    """Close the link an engine holds (``arena_links``), if it made one."""
    link = links.pop("link", None) if links else None
    if link:
        link.close()
