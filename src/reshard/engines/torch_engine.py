"""The torch.distributed engine (gloo for CPU tensors, NCCL for CUDA tensors)."""

from __future__ import annotations

import contextlib
import datetime
import gc
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import WORLD, CommTimeout, RankFailed, RankNames
from ..execution import phases
from ..execution.arrays import array_backend
from ..execution.pieces import exchange_packed, pack
from ..planning.steps import AllToAll
from .arena_link import close_links
from .base import CallState, ExchangeRun
from .gloo_pairwise import pairwise_form
from .shm import LocalPeers, VoteBoard
from .shm_notes import usable_here

# torch 2.13 names the one-tensor all-gather all_gather_single and warns on the older name
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_TIMEOUT_WORDS = ("timed out", "timeout", "time out", "deadline")
# reshard's point-to-point messages carry their own tag, so a user's isend/irecv on the same
# group (tag 0 by default) never matches one of ours.
PAIR_TAG = 0x5253
NOTE_TAG = PAIR_TAG + 1  # same-host peers: where a message lies in the sender's outbox
ACK_TAG = PAIR_TAG + 2  # and that the receiver has read it


_ENGINE_FAILURES = (RuntimeError, ConnectionError, OSError)


def as_bytes(buf: Any) -> Any:
    """A contiguous 1-D tensor's bytes, as a uint8 view. A tensor of one element counts as
    contiguous whatever its stride, and torch views bytes only through a stride of 1: such a
    one gets that stride (the same memory)."""
    if buf.numel() <= 1 and buf.stride(-1) != 1:
        buf = buf.as_strided((buf.numel(),), (1,))
    return buf.view(torch.uint8)


def engine_error(exc: BaseException, what: str, rank: int | str, timeout: float) -> CommTimeout | RankFailed:
    """The engine's error as a CommTimeout / RankFailed that says what happened (``rank``: the
    rank's number, or its name as ``RankNames`` gives it)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    me = rank if isinstance(rank, str) else f"rank {rank}"
    if any(w in text.lower() for w in _TIMEOUT_WORDS):
        return CommTimeout(f"{me}: {what} waited more than {timeout:g} s for its peers ({text})")
    return RankFailed(f"{me}: {what} failed because a peer rank died or disconnected ({text})")


@contextlib.contextmanager
def engine_errors(what: str, rank: int | str, timeout: float) -> Iterator[None]:
    """Turn the engine's RuntimeErrors into CommTimeout / RankFailed that say what happened."""
    try:
        yield
    except _ENGINE_FAILURES as exc:
        raise engine_error(exc, what, rank, timeout) from exc


class TorchEngine:
    arrays_name = "torch"
    rank_names: RankNames = WORLD  # how messages name its ranks (``name_ranks``)

    def __init__(self, group: Any, rank: int, size: int, name: str, timeout: float, owns_group: bool):
        self.group = group
        self.rank = rank
        self.size = size
        self.name = name
        # gloo's groups are independent TCP pairs; NCCL's deadlock when two ranks launch two
        # communicators' kernels in different orders
        self.concurrent_groups = name == "gloo"
        self.timeout = timeout
        self.owns_group = owns_group
        self.arrays = array_backend("torch")
        # gloo: all_to_all as one message per peer (engines.gloo_pairwise), faster than one
        # all_to_all_single after a full pack at every size measured (performance docs).
        # Setting this to False takes the one-call form (a benchmark compares the two).
        self.pairwise = name == "gloo"
        self._helper: Any = None  # the thread that runs the replay vote while the rank packs
        self.scratch_dir: str | None = None  # a private rendezvous directory to remove on close
        self.local: LocalPeers | None = None  # same-host peers reached through shared memory
        self.board: VoteBoard | None = None  # the vote through shared memory, where every rank shares it
        # gloo on CPU: {"link": the group's arena link (execution.arena_reads), made at first use}
        self.arena_links: dict[str, Any] | None = {} if name == "gloo" else None

    def open_local_peers(self) -> TorchEngine:
        """Collective: find the peers on this host that messages reach through shared memory
        (gloo only; NCCL moves device memory its own way)."""
        if self.name == "gloo":
            with self._guard("shared memory setup"):
                self.local = LocalPeers.open(self.rank, self.size, lambda b: self.allgather_bytes(b, "shared memory setup"),
                                             self.timeout)
                self._open_board()
        return self

    def _open_board(self) -> None:
        """Collective: the vote through shared memory where the ranks fall into hosts whose ranks
        all share memory (every rank agrees on every host's lowest rank and size); across
        several hosts, their lowest ranks take the all-reduce for their hosts."""
        if self.size == 1:
            return
        local = self.local
        ready = local is not None and usable_here()
        card = np.array([ready, min(self.rank, *local.peers) if ready else -1, len(local.peers) + 1 if ready else 0],
                        dtype=np.int64)
        cards = self.allgather_bytes(card.view(np.uint8), "shared memory setup").view(np.int64).reshape(self.size, 3)
        leaders = sorted({int(q) for q in cards[:, 1]})
        if not cards[:, 0].all() or any((cards[:, 1] == cards[q, 1]).sum() != cards[q, 2] for q in range(self.size)):
            return  # some rank has no board, or the hosts' memberships disagree: the all-reduce votes
        if len(leaders) == 1:
            self.board = VoteBoard.in_outboxes(local, self.rank, self.timeout)
            return
        with self._guard("new_group"):  # every rank takes part in making the leaders' group
            ranks = [dist.get_global_rank(self.group, r) for r in leaders] if self.group is not dist.group.WORLD else leaders
            group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=self.timeout))

        what = f"the check's vote among the hosts' lowest ranks ({', '.join(map(str, leaders))})"

        def across(values: np.ndarray) -> np.ndarray:
            buf = torch.from_numpy(np.array(values, dtype=np.int64))
            with self._guard(what):
                dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
            return buf.numpy()

        self.board = VoteBoard.in_outboxes(local, self.rank, self.timeout, True, across if self.rank in leaders else None,
                                          leaders)

    def send_buffer(self, count: int, like: Any) -> Any:
        """A 1-D buffer of ``count`` elements like ``like`` for the packed messages of the next
        exchange, in the outbox same-host peers read from; None where there is none (use
        ``scratch``). Asked for before any message of that exchange is sent."""
        if self.local is None:
            return None
        outbox = self.local.outbox
        outbox.cursor = 0
        return outbox.take(count * like.element_size()).view(like.dtype)  # its growth: counted by the exchange

    def _guard(self, what: str):
        return engine_errors(what, self.rank_names.one(self.rank), self.timeout)

    def all_to_all_form(self, call: CallState, x: Any, geometry: AllToAll) -> ExchangeRun:
        """gloo: one message per peer; NCCL (or gloo with ``pairwise`` off): pack, one
        ``all_to_all_single``, unpack where the pieces are not runs of the result."""
        if self.pairwise:
            return pairwise_form(call, x, geometry)
        g = geometry

        def run_packed(k: CallState, xt: Any, prepared: Any = None) -> Any:
            send, send_shapes = pack(k, xt, g.split_dim, g.send_sizes)
            return exchange_packed(k, send, send_shapes, g.recv_shapes, g.out_shape, g.concat_dim, xt)

        return run_packed

    def prepare_send(self, call: CallState, x: Any, split_dim: int, send_sizes: Sequence[int]) -> Callable[[], Any] | None:
        return None  # each form packs as it sends

    def alltoallv(
        self, recv: torch.Tensor, send: torch.Tensor, recv_counts: Sequence[int], send_counts: Sequence[int], what: str
    ) -> None:
        """Send ``send[segment j]`` to rank j; receive rank i's segment into ``recv[segment i]``.

        Both buffers are 1-D uint8; segments are consecutive, sized by the byte counts.
        """
        with self._guard(what):
            dist.all_to_all_single(
                recv, send, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts), group=self.group
            )

    def exchange_pairs(
        self, recvs: Sequence[tuple[int, torch.Tensor]], sends: Iterable[tuple[int, torch.Tensor]], what: str,
        tally: Any = None,
    ) -> None:
        """Point-to-point messages: receive each ``(peer, buffer)`` of ``recvs``; send each one
        that ``sends`` yields, as it yields it (the caller's pack of the next piece runs while
        this one moves). Buffers are contiguous 1-D tensors (any dtype: gloo moves their bytes);
        at most one message per pair of ranks and direction, of exactly the byte length its
        receiver expects. Peers are ranks of this engine's group. The group's own ``recv`` and
        ``send`` are called directly (``dist.irecv``/``isend`` look the group up per message).

        A same-host peer (``engines.shm``) gets a note instead: where the message lies in this
        rank's outbox (a buffer from ``send_buffer`` lies there already; any other is copied
        in; the outbox's growth is counted in ``tally``). It reads the bytes straight into its
        buffer and acknowledges; this returns once every peer has. The notes and their
        acknowledgements go through shared memory too where they can (``shm_notes``), else
        as gloo messages."""
        group = self.group
        local = self.local
        mailbox = local.mailbox if local is not None else None
        try:  # no context manager here: this path is per call, and entering one is not free
            works, notes, acks, incoming, outgoing = [], [], [], [], []
            labels: list | None = [] if phases.on() else None  # (index in works, name, bytes, posted) per message
            for peer, buf in recvs:
                if local is not None and local.reaches(peer, buf.numel() * buf.element_size()):
                    if mailbox is not None:
                        incoming.append((peer, as_bytes(buf)))
                        continue
                    note = torch.empty(2, dtype=torch.int64)
                    notes.append((peer, as_bytes(buf), note, group.recv([note], peer, NOTE_TAG)))
                else:
                    works.append(group.recv([buf], peer, PAIR_TAG))
                    if labels is not None:
                        labels.append((len(works) - 1, f"message from rank {peer}",
                                       buf.numel() * buf.element_size(), time.perf_counter()))
            for peer, buf in sends:
                if local is not None and local.reaches(peer, buf.numel() * buf.element_size()):
                    # where the message lies in the outbox; the peer reads it and says so
                    raw = as_bytes(buf)
                    offset = local.outbox.place(raw) if raw.numel() else 0  # an empty message lies nowhere
                    if mailbox is not None:
                        mailbox.post(peer, offset, raw.numel())
                        outgoing.append(peer)
                        continue
                    note = torch.tensor([offset, raw.numel()], dtype=torch.int64)
                    works.append(group.send([note], peer, NOTE_TAG))
                    ack = torch.empty(2, dtype=torch.int64)
                    acks.append((peer, ack, group.recv([ack], peer, ACK_TAG)))
                else:
                    works.append(group.send([buf], peer, PAIR_TAG))
                    if labels is not None:
                        labels.append((len(works) - 1, f"message to rank {peer}",
                                       buf.numel() * buf.element_size(), time.perf_counter()))
            failed = mailbox.settle(incoming, outgoing, local.read, what) if incoming or outgoing else None
            for peer, buf, note, work in notes:
                work.wait()
                offset, nbytes = note.tolist()
                why = (f"rank {peer} sent {nbytes} bytes where {buf.numel()} were expected" if nbytes != buf.numel()
                       else local.read(peer, offset, buf))
                works.append(group.send([torch.tensor([0 if why is None else 1, 0], dtype=torch.int64)], peer, ACK_TAG))
                failed = failed or why
            # Every peer has read this rank's messages before it returns: the outbox may be
            # written again, and no message of this exchange is left unread when a rank ends.
            for peer, ack, work in acks:
                work.wait()
                if ack[0].item():
                    failed = failed or f"rank {peer} could not read this rank's message"
            if labels is not None:  # each message from posted to done, for the phase accounting
                for at, name, nbytes, posted in labels:
                    works[at].wait()
                    phases.note(name, posted, time.perf_counter(), nbytes)
                waited = {at for at, *_ in labels}  # a gloo work waited twice waits forever
                works = [work for at, work in enumerate(works) if at not in waited]
            for work in works:
                work.wait()
        except _ENGINE_FAILURES as exc:
            raise engine_error(exc, what, self.rank_names.one(self.rank), self.timeout) from exc
        finally:
            if local is not None:
                local.outbox.cursor = 0
                if tally is not None:  # the outbox grew for this exchange: all of it, as ``scratch`` counts
                    tally.allocated += local.outbox.unreported
                    local.outbox.unreported = 0
        if failed is not None:
            raise RankFailed(f"{self.rank_names.one(self.rank)}: {what}: {failed}")

    def start_allgather_bytes(self, send: Any, what: str) -> Callable[[], Any]:
        """``allgather_bytes``, run now: the result is ready when this returns.

        Synchronous on purpose: with ``async_op=True`` gloo ranks under torchrun across hosts
        sometimes aborted at teardown (docs/performance.md, "Engines").
        """
        done = self.allgather_bytes(send, what)
        return lambda: done

    def allgather(self, recv: torch.Tensor, send: torch.Tensor, what: str) -> None:
        """Every rank's ``send`` (equal byte lengths), stacked in rank order into ``recv``."""
        with self._guard(what):
            ALL_GATHER_SINGLE(recv, send, group=self.group)

    def allgather_bytes(self, send: Any, what: str) -> Any:
        """numpy uint8 [L] -> numpy uint8 [size, L]; used for the small check records."""
        device = "cuda" if self.name == "nccl" else "cpu"
        src = torch.from_numpy(np.ascontiguousarray(send)).to(device)
        out = torch.empty(self.size * src.numel(), dtype=torch.uint8, device=device)
        self.allgather(out, src, what)
        return out.cpu().numpy().reshape(self.size, -1)

    def start_allreduce_max(self, values: Any, what: str) -> Callable[[], Any]:
        """``allreduce_max`` begun on a helper thread (gloo); calling the result waits for it.

        A thread, not ``async_op=True`` (see ``start_allgather_bytes``): the call is the same
        synchronous one, and no collective starts on this group before it returns.
        """
        if self.board is not None and np.size(values) == 2:
            return self.board.start(values)
        if self.name == "nccl":  # a CUDA device is chosen per thread: keep to the caller's
            done = self.allreduce_max(values, what)
            return lambda: done
        if self._helper is None:
            from concurrent.futures import ThreadPoolExecutor

            self._helper = ThreadPoolExecutor(1, thread_name_prefix="reshard-vote")
        return self._helper.submit(self.allreduce_max, values, what).result

    def allreduce_max(self, values: Any, what: str) -> Any:
        """numpy int64 [k] -> numpy int64 [k], the elementwise max over ranks (the replay vote)."""
        if self.board is not None and np.size(values) == 2:
            return self.board.start(values)()
        device = "cuda" if self.name == "nccl" else "cpu"
        buf = torch.from_numpy(np.array(values, dtype=np.int64)).to(device)
        with self._guard(what):
            dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.group)
        return buf.cpu().numpy()

    def subgroup(self, groups: Sequence[Sequence[int]]) -> TorchEngine:
        """Collective: one process group per list of ``groups`` (disjoint ranks of this group,
        covering it); returns this rank's. Every rank creates every group, in the same order,
        as ``torch.distributed.new_group`` requires."""
        mine = None
        with self._guard("new_group"):
            for members in groups:
                ranks = [dist.get_global_rank(self.group, r) for r in members] if self.group is not dist.group.WORLD else list(members)
                g = dist.new_group(ranks, timeout=datetime.timedelta(seconds=self.timeout))
                if self.rank in members:
                    mine = (g, list(members).index(self.rank), len(members))
        group, rank, size = mine
        return TorchEngine(group, rank, size, self.name, self.timeout, owns_group=False).open_local_peers()

    def name_ranks(self, names: RankNames) -> None:
        """Name this group's ranks in messages as ``names`` does (a mesh dim's: world ranks)."""
        self.rank_names = names
        if self.board is not None:
            self.board.rank_names = names

    def barrier(self) -> None:
        with self._guard("barrier"):
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Collective: wait for every rank, then tear the group down.

        Tearing down while a peer still talks to this rank aborts gloo ("terminate called
        without an active exception"), so the barrier comes first.
        """
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.local is not None:
            self.local.close()
            self.local = None
        close_links(self.arena_links)
        if self.owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier(group=self.group)
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            # Our reference would keep the C++ group (and gloo's threads) alive until the
            # interpreter tears down, where destroying it aborted ranks under torchrun about
            # once in ten runs on busy cores ("terminate called without an active exception",
            # after every rank had finished). Drop it now, while Python is fully alive.
            self.group = None
            gc.collect()
        if self.scratch_dir:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)


def init_torch(
    backend: str, rank: int, size: int, timeout: float, *, store: Any = None, init_method: str | None = None
) -> TorchEngine:
    """Create the default process group (or reuse the user's) and wrap it."""
    owns = False
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout)}
        if store is not None:
            kwargs["store"] = store
        else:
            kwargs["init_method"] = init_method or "env://"
        with engine_errors("init", rank, timeout):
            dist.init_process_group(backend, rank=rank, world_size=size, **kwargs)
        owns = True
    name = "nccl" if "nccl" in dist.get_backend() else "gloo"
    return TorchEngine(dist.group.WORLD, dist.get_rank(), dist.get_world_size(), name, timeout, owns).open_local_peers()
