"""The MPI engine through mpi4py. Imports no torch: numpy buffers, or torch CPU tensors seen
through the buffer protocol (``tensor.numpy()`` is a view, so nothing is copied in or out).

Three things MPI does not give us for free, and how this file gets them:

* **Bounded waits.** MPI has no timeout. The small check all-gather, which every op runs
  before any data moves, is non-blocking and polled against the communicator's timeout, so a
  rank that never arrives turns into ``CommTimeout`` on the others instead of a hang. Once the
  check has passed every rank is inside the same exchange, which then runs blocking (a rank
  that dies there makes mpirun end the job, and ``rs.spawn`` reports ``RankFailed``).
* **Errors as exceptions.** The communicator is duplicated with ``ERRORS_RETURN``, so an MPI
  error surfaces as ``RankFailed`` naming the rank, not an abort from deep inside the library.
* **Large counts.** Open MPI 5 has no MPI-4 ``_c`` (large-count) calls and ``Alltoallv`` takes
  ``int`` counts and displacements, so a piece of 2**31 bytes or more, or one that starts past
  2**31, travels as one ``hindexed`` datatype of <= 1 GiB blocks whose 64-bit displacements are
  carried by the type itself (``Alltoallw`` with count 1 and displacement 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import WORLD, CommTimeout, RankFailed, RankNames
from ..execution.arrays import array_backend
from ..planning.steps import AllToAll, ExchangeBoxes
from .arena_link import close_links
from .base import CallState, ExchangeRun
from .mpi_forms import PeerSend, boxes_form, members_form, split_form, typed_fits, typed_form, typed_path_may_take
from .shm import VoteBoard
from .shm_notes import Poll

INT_MAX = 2**31 - 1
PAIR_TAG = 0x5253  # reshard's point-to-point messages, apart from a user's
_BLOCK = 1 << 30  # bytes per hindexed block: comfortably below INT_MAX


def as_buffer(a: Any) -> Any:
    """A contiguous CPU array or tensor as an MPI buffer (no copy). A torch tensor is taken
    by address: cheaper than a numpy view of its bytes, which small messages feel."""
    if isinstance(a, np.ndarray):
        return a
    if a.is_contiguous():
        return MPI.buffer.fromaddress(a.data_ptr(), a.numel() * a.element_size())
    return a.numpy()  # not reached by ops (they pass contiguous buffers); kept for safety


class MPIEngine:
    arrays_name = "numpy"
    name = "mpi"
    rank_names: RankNames = WORLD  # how messages name its ranks (``name_ranks``)

    def __init__(self, mpi_comm: Any, timeout: float, owns: bool):
        self.mpi_comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.timeout = timeout
        self.owns = owns
        self.arrays = array_backend("numpy")
        self.concurrent_groups = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._types: dict[tuple, Any] = {}
        self.types_epoch = 0  # bumped whenever cached types are freed: plans holding them are stale
        self._board: Any = None  # the vote's VoteBoard, or False where none can be (made at the first vote)
        self.arena_links: dict[str, Any] = {}  # {"link": the group's arena link (execution.arena_reads), at first use}

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except MPI.Exception as exc:
            raise self._failed(what, exc) from exc

    def _failed(self, what: str, exc: Any) -> RankFailed:
        text = exc.Get_error_string().strip().splitlines()[0]
        return RankFailed(f"{self.rank_names.one(self.rank)}: {what} failed in MPI ({text})")

    def _wait(self, req: Any, what: str) -> None:
        """Poll ``req`` until done or the timeout, pausing as ``shm_notes.Poll`` does (a few
        spins, then the core handed to others, which a rank being waited for may need, then short sleeps)."""
        poll = Poll(self.timeout, self._board.spins) if self._board else Poll(self.timeout)
        while not req.Test():
            if poll.expired():
                raise CommTimeout(
                    f"{self.rank_names.one(self.rank)}: {what} waited more than {self.timeout:g} s for its peers "
                    f"(a rank never reached this collective)"
                )
            poll.pause()

    # -- the primitives ops use -------------------------------------------------------------

    def alltoallv(
        self, recv: Any, send: Any, recv_counts: Sequence[int], send_counts: Sequence[int], what: str
    ) -> None:
        """Send ``send[segment j]`` to rank j; receive rank i's segment into ``recv[segment i]``.

        Both buffers are 1-D uint8 (numpy or torch CPU); segments are consecutive, sized by the
        byte counts. Runs as ``Alltoallw`` (as fast as ``Alltoallv``) so that every rank may describe its own side freely: bytes, a
        large-count type, or the subarray types of ``alltoallw`` on a peer, and the calls match.
        """
        sends = [_byte_piece(d, c) for d, c in zip(_displs(send_counts), send_counts)]
        recvs = [_byte_piece(d, c) for d, c in zip(_displs(recv_counts), recv_counts)]
        try:
            with self._guard(what):
                self._alltoallw(as_buffer(recv), as_buffer(send), sends, recvs)
        finally:
            _free([t for _, _, t in sends + recvs])

    def start_allgather_bytes(self, send: Any, what: str) -> Callable[[], np.ndarray]:
        """``allgather_bytes`` started; call the result to wait (bounded by the timeout)."""
        src = np.ascontiguousarray(send, dtype=np.uint8)
        out = np.empty((self.size, src.size), dtype=np.uint8)
        with self._guard(what):
            req = self.mpi_comm.Iallgather([src, MPI.BYTE], [out, MPI.BYTE])

        def finish() -> np.ndarray:
            with self._guard(what):
                self._wait(req, what)
            return out

        return finish

    def send_buffer(self, count: int, like: Any) -> None:
        """None: MPI moves same-host messages through shared memory itself."""
        return None

    def vote_board(self) -> VoteBoard | None:
        """Collective on first use (every rank votes at the same call): the check's vote through
        shared memory where every rank of this communicator shares a host with every other, so
        a vote is a write and a read of memory (``shm.VoteBoard``); else None (the all-reduce)."""
        if self._board is None:
            self._board = VoteBoard.in_memfd(self.rank, self.size, lambda b: self.allgather_bytes(b, "the vote's board"),
                                             self.timeout) or False
        return self._board or None

    def start_allreduce_max(self, values: Any, what: str) -> Callable[[], np.ndarray]:
        """``allreduce_max`` started; call the result to wait (bounded by the timeout)."""
        board = self.vote_board() if np.size(values) == 2 else None
        if board is not None:
            return board.start(values)
        src = np.array(values, dtype=np.int64)
        out = np.empty_like(src)
        with self._guard(what):
            req = self.mpi_comm.Iallreduce([src, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)

        def finish() -> np.ndarray:
            with self._guard(what):
                self._wait(req, what)
            return out

        return finish

    def allreduce_max(self, values: Any, what: str) -> np.ndarray:
        """numpy int64 [k] -> numpy int64 [k], the elementwise max over ranks (the replay vote)."""
        return self.start_allreduce_max(values, what)()

    def alltoallw_plan(
        self, recv_types: Sequence[Any], send_types: Sequence[Any], what: str
    ) -> Callable[[Any, Any], None]:
        """MPI's ``Alltoallw`` with one datatype per peer on each side (from ``subarray``; None
        for nothing: no pack, no unpack), its argument lists built once: ``run(recv, send)``
        per call.

        The types must stay alive while ``run`` is used: check ``types_epoch`` (it changes
        when this engine frees its cached types)."""
        def side(types: Sequence[Any]) -> tuple[tuple[list, list], list]:
            return _layout([(0, 0, MPI.BYTE) if t is None else (1, 0, t) for t in types])

        (s_layout, s_types), (r_layout, r_types) = side(send_types), side(recv_types)
        alltoallw = self.mpi_comm.Alltoallw

        def run(recv: Any, send: Any) -> None:
            if type(send) is not np.ndarray:  # checked here: a call saved on every replay
                send, recv = as_buffer(send), as_buffer(recv)
            try:
                alltoallw([send, s_layout, s_types], [recv, r_layout, r_types])
            except MPI.Exception as exc:
                raise self._failed(what, exc) from exc

        return run

    def alltoallw_members(
        self, recv_types: Sequence[Any], send_types: Sequence[Any], what: str
    ) -> Callable[[Any, Sequence[Any]], None]:
        """``Alltoallw`` sending from several like arrays at once: ``run(recv, members)`` sends
        peer j ``send_types[j]`` (a datatype over one member) of every member in order, as one
        hindexed type over the members' places relative to the first (kept while the next call's
        members lie alike, as a training step's parameters do; else made again); receives as
        ``alltoallw_plan``. Members: C-contiguous numpy arrays or CPU tensors, all alike."""
        (r_layout, r_types) = _layout([(0, 0, MPI.BYTE) if t is None else (1, 0, t) for t in recv_types])
        s_layout = ([0 if t is None else 1 for t in send_types], [0] * len(send_types))
        alltoallw, address = self.mpi_comm.Alltoallw, MPI.Get_address
        kept: list = [None, None, []]  # the addresses and displacements the types were made for, the types

        def run(recv: Any, members: Sequence[Any]) -> None:
            first = members[0]
            if type(first) is np.ndarray:
                at = list(map(address, members))
            else:
                at = [m.data_ptr() for m in members]
                first, recv = as_buffer(first), as_buffer(recv)
            if at != kept[0]:  # the members lie elsewhere: their places relative to the first may not
                base = at[0]
                displs = [a - base for a in at]
                if displs != kept[1]:
                    key = ("members", id(kept))  # in the cache, so free_types frees them too
                    _free(kept[2])
                    kept[1], kept[2] = None, []
                    self._types.pop(key, None)
                    kept[2] = [MPI.BYTE if t is None else t.Create_hindexed_block(1, displs).Commit()
                               for t in send_types]
                    kept[1] = displs
                    self._types[key] = _Owned(kept[2])
                kept[0] = at
            try:
                alltoallw([first, s_layout, kept[2]], [recv, r_layout, r_types])
            except MPI.Exception as exc:
                raise self._failed(what, exc) from exc

        return run

    def alltoall_plan(self, recv_type: Any, send_type: Any, what: str) -> Callable[[Any, Any], None]:
        """``Alltoall`` of one element of ``send_type`` to each peer (peer j's piece at j times
        its extent) and one of ``recv_type`` from each: equal pieces on both sides, the lighter
        call (about 2 us a call less than ``Alltoallw`` with the same pieces at 64 KiB). The
        types must stay alive while ``run`` is used (``types_epoch``, as ``alltoallw_plan``)."""
        alltoall = self.mpi_comm.Alltoall

        def run(recv: Any, send: Any) -> None:
            if type(send) is not np.ndarray:
                send, recv = as_buffer(send), as_buffer(recv)
            try:
                alltoall([send, 1, send_type], [recv, 1, recv_type])
            except MPI.Exception as exc:
                raise self._failed(what, exc) from exc

        return run

    def alltoall_fresh(self, recv_type: Any, send_type: Any, what: str, new_recv: Callable[[], np.ndarray],
                       epoch: int) -> Callable[[np.ndarray], np.ndarray | None]:
        """``alltoall_plan`` from a numpy ``send`` into a new result from ``new_recv()``:
        ``run(send)`` returns it, or None where this engine freed its types since ``epoch``.
        One Python frame between a replay and MPI (each one shows at 64 KiB)."""
        alltoall = self.mpi_comm.Alltoall

        def run(send: np.ndarray) -> np.ndarray | None:
            if self.types_epoch != epoch:
                return None
            recv = new_recv()
            try:
                alltoall([send, 1, send_type], [recv, 1, recv_type])
            except MPI.Exception as exc:
                raise self._failed(what, exc) from exc
            return recv

        return run

    def strided_pieces(self, shape: Sequence[int], sub: Sequence[int], itemsize: int) -> Any:
        """The box ``sub`` at the start of a C-order array ``shape``, its extent cut to the box's
        length along dim 1 (``sub[1] * shape[2]`` items): element j of it is the j-th of equal
        boxes side by side along dim 1. Cached as ``subarray``'s types are; None for an empty box."""
        key = ("pieces", tuple(shape), tuple(sub), itemsize)
        if key not in self._types:
            whole = self.subarray(shape, sub, [0] * len(shape), itemsize)
            self._types[key] = None if whole is None else whole.Create_resized(0, sub[1] * shape[2] * itemsize).Commit()
        return self._types[key]

    def _alltoallw(self, rbuf: np.ndarray, sbuf: np.ndarray, sends: Sequence[tuple], recvs: Sequence[tuple]) -> None:
        self.mpi_comm.Alltoallw([sbuf, *_layout(sends)], [rbuf, *_layout(recvs)])

    def allgather(self, recv: Any, send: Any, what: str) -> None:
        """Every rank's ``send`` (equal byte lengths), stacked in rank order into ``recv``."""
        rbuf, sbuf = as_buffer(recv), as_buffer(send)
        with self._guard(what):
            if sbuf.nbytes * self.size <= INT_MAX:
                self.mpi_comm.Allgather([sbuf, MPI.BYTE], [rbuf, MPI.BYTE])
                return
            # Large: every peer reads the same send bytes (send displacements may overlap).
            length = sbuf.nbytes
            sends = [_byte_piece(0, length)] * self.size
            recvs = [_byte_piece(i * length, length) for i in range(self.size)]
            try:
                self._alltoallw(rbuf, sbuf, sends, recvs)
            finally:
                _free(list({id(t): t for _, _, t in sends + recvs}.values()))

    def allgather_bytes(self, send: Any, what: str) -> np.ndarray:
        """numpy uint8 [L] -> numpy uint8 [size, L]; the check records. Bounded by the timeout."""
        src = np.ascontiguousarray(send, dtype=np.uint8)
        out = np.empty((self.size, src.size), dtype=np.uint8)
        with self._guard(what):
            req = self.mpi_comm.Iallgather([src, MPI.BYTE], [out, MPI.BYTE])
            self._wait(req, what)
        return out

    def subarray(self, shape: Sequence[int], sub: Sequence[int], starts: Sequence[int], itemsize: int) -> Any:
        """A committed datatype for the box ``sub`` at ``starts`` of a C-order array ``shape``
        (None for an empty box), cached: the same exchange reuses its types every call."""
        key = (tuple(shape), tuple(sub), tuple(starts), itemsize)
        t = self._types.get(key)
        if t is None and key not in self._types:
            if 0 in sub:
                t = None
            else:
                elem = MPI.BYTE.Create_contiguous(itemsize)
                t = elem.Create_subarray(list(shape), list(sub), list(starts), order=MPI.ORDER_C).Commit()
                elem.Free()
            if len(self._types) > 4096:  # a long run over many shapes: start again
                self.free_types()
            self._types[key] = t
        return t

    def boxes_type(self, shape: Sequence[int], boxes: Sequence[Any], itemsize: int) -> Any:
        """One committed datatype for several boxes (each ``((start, stop), ...)``) of a C-order
        array ``shape``, in the order given: a struct of their subarray types, cached."""
        parts = [self.subarray(shape, [b - a for a, b in box], [a for a, _ in box], itemsize) for box in boxes]
        parts = [t for t in parts if t is not None]
        if len(parts) <= 1:
            return parts[0] if parts else None
        key = ("struct", tuple(shape), tuple(tuple(box) for box in boxes), itemsize)
        if key not in self._types:
            self._types[key] = MPI.Datatype.Create_struct([1] * len(parts), [0] * len(parts), parts).Commit()
        return self._types[key]

    def boxes_form(self, call: CallState, x: Any, step: ExchangeBoxes) -> Callable[..., None] | None:
        """The exchange of boxes as one ``Alltoallw``, each peer's boxes one datatype on each
        side: nothing packed, nothing unpacked (see ``mpi_forms.boxes_form``)."""
        return boxes_form(call, x, step)

    def members_form(self, call: CallState, x: Any, step: ExchangeBoxes, rows: int) -> Callable[..., None] | None:
        """The exchange of boxes for ``rows`` like tensors at once, straight from each (see
        ``mpi_forms.members_form``)."""
        return members_form(call, x, step, rows)

    def all_to_all_form(self, call: CallState, x: Any, geometry: AllToAll) -> ExchangeRun:
        """Subarray datatypes where they fit (no pack, no unpack), else the byte exchange."""
        if typed_fits(call, x, geometry):
            return typed_form(call, x, geometry)
        return split_form(call, x, geometry)

    def prepare_send(self, call: CallState, x: Any, split_dim: int, send_sizes: Sequence[int]) -> Callable[[], Any] | None:
        if typed_path_may_take(call, x):
            return None
        return lambda: PeerSend(call, x, split_dim, send_sizes).both()

    def exchange_pairs(self, recvs: Any, sends: Any, what: str, tally: Any = None) -> None:
        """Point-to-point messages: receive each ``(peer, buffer)`` of ``recvs``; send each one
        ``sends`` yields, as it yields it. Buffers are contiguous 1-D arrays or CPU tensors; at
        most one message per pair of ranks and direction, of exactly the receiver's length."""
        comm = self.mpi_comm
        with self._guard(what):
            # MPI counts are ints: a message past 2**31 bytes travels as 1 GiB parts, in order
            reqs = [comm.Irecv([part, MPI.BYTE], source=peer, tag=PAIR_TAG) for peer, buf in recvs for part in _parts(buf)]
            for peer, buf in sends:
                reqs += [comm.Isend([part, MPI.BYTE], dest=peer, tag=PAIR_TAG) for part in _parts(buf)]
            MPI.Request.Waitall(reqs)

    def subgroup(self, groups: Sequence[Sequence[int]]) -> MPIEngine:
        """Collective: this rank's communicator among ``groups`` (disjoint, covering), by Split."""
        color = next(i for i, members in enumerate(groups) if self.rank in members)
        key = list(groups[color]).index(self.rank)
        with self._guard("Split"):
            sub = self.mpi_comm.Split(color, key)
        sub.Set_errhandler(MPI.ERRORS_RETURN)
        return MPIEngine(sub, self.timeout, owns=True)

    def name_ranks(self, names: RankNames) -> None:
        """Name this group's ranks in messages as ``names`` does (a mesh dim's: world ranks)."""
        self.rank_names = names
        if self._board:
            self._board.rank_names = names

    def barrier(self) -> None:
        with self._guard("barrier"):
            req = self.mpi_comm.Ibarrier()
            self._wait(req, "barrier")

    def free_types(self) -> None:
        """Free every cached datatype; plans made with them see ``types_epoch`` change."""
        _free([u for t in self._types.values() if t is not None for u in (t if isinstance(t, _Owned) else [t])])
        self._types.clear()
        self.types_epoch += 1

    def close(self) -> None:
        self.free_types()
        if self._board:
            self._board.close()
        self._board = None
        close_links(self.arena_links)
        if self.owns and self.mpi_comm != MPI.COMM_NULL:
            with contextlib.suppress(MPI.Exception):
                self.mpi_comm.Free()
            self.mpi_comm = MPI.COMM_NULL


def _parts(buf: Any) -> list[Any]:
    """``buf``'s bytes as MPI buffers of at most ``_BLOCK`` bytes each."""
    whole = as_buffer(buf)
    view = memoryview(whole).cast("B") if not isinstance(whole, np.ndarray) else whole.reshape(-1).view(np.uint8)
    return [view[at : at + _BLOCK] for at in range(0, len(view), _BLOCK)] or [view]


def _layout(pieces: Sequence[tuple]) -> tuple[tuple[list, list], list]:
    """(count, displacement, type) per peer -> mpi4py's ((counts, displacements), types)."""
    counts, displs, types = zip(*pieces)
    return (list(counts), list(displs)), list(types)


def _displs(counts: Sequence[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out or [0]


def _byte_piece(displ: int, count: int) -> tuple[int, int, Any]:
    """(count, displacement, type) for ``count`` bytes at byte offset ``displ``. Past INT_MAX,
    one hindexed type of <= 1 GiB blocks carries the 64-bit offsets itself (count 1, displ 0)."""
    if count == 0:
        return 0, 0, MPI.BYTE
    if displ + count <= INT_MAX:
        return count, displ, MPI.BYTE
    lengths, starts = [], []
    for at in range(0, count, _BLOCK):
        lengths.append(min(_BLOCK, count - at))
        starts.append(displ + at)
    return 1, 0, MPI.BYTE.Create_hindexed(lengths, starts).Commit()


class _Owned(list):
    """Several committed types held under one cache key (freed together by ``free_types``)."""


def _free(types: Sequence[Any]) -> None:
    for t in types:
        if t is not None and t != MPI.BYTE:
            with contextlib.suppress(MPI.Exception):
                t.Free()


def init_mpi(timeout: float, mpi_comm: Any = None) -> MPIEngine:
    """Wrap ``mpi_comm`` (default a duplicate of COMM_WORLD) with errors returned, not fatal."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    dup = base.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    return MPIEngine(dup, timeout, owns=True)
