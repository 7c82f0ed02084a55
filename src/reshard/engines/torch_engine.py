"""torch.distributed adapter (gloo for CPU tensors, NCCL for CUDA tensors)."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..arrays import array_backend
from ..errors import CommTimeout, RankFailed
from ..pieces import exchange_packed, pack
from .base import AllToAllGeometry, CallState, ExchangeRun
from .gloo_pairwise import pairwise_form

_TIMEOUT_WORDS = ("timed out", "timeout", "time out", "deadline")
# reshard's point-to-point messages carry their own tag, so a user's isend/irecv on the same
# group (tag 0 by default) never matches one of ours.
PAIR_TAG = 0x5253


_ENGINE_FAILURES = (RuntimeError, ConnectionError, OSError)


def engine_error(exc: BaseException, what: str, rank: int, timeout: float) -> CommTimeout | RankFailed:
    """The engine's error as a CommTimeout / RankFailed that says what happened."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(w in text.lower() for w in _TIMEOUT_WORDS):
        return CommTimeout(f"rank {rank}: {what} waited more than {timeout:g} s for its peers ({text})")
    return RankFailed(f"rank {rank}: {what} failed because a peer rank died or disconnected ({text})")


@contextlib.contextmanager
def engine_errors(what: str, rank: int, timeout: float) -> Iterator[None]:
    """Turn the engine's RuntimeErrors into CommTimeout / RankFailed that say what happened."""
    try:
        yield
    except _ENGINE_FAILURES as exc:
        raise engine_error(exc, what, rank, timeout) from exc


class TorchEngine:
    arrays_name = "torch"

    def __init__(self, group: Any, rank: int, size: int, name: str, timeout: float, owns_group: bool):
        self.group = group
        self.rank = rank
        self.size = size
        self.name = name
        self.timeout = timeout
        self.owns_group = owns_group
        self.arrays = array_backend("torch")
        # gloo: all_to_all as one message per peer (engines.gloo_pairwise), faster than one
        # all_to_all_single after a full pack at every size measured (performance docs).
        # RESHARD_GLOO_PAIRWISE=0, or setting this to False, takes the one-call form.
        self.pairwise = name == "gloo" and os.environ.get("RESHARD_GLOO_PAIRWISE", "1") != "0"
        self.scratch_dir: str | None = None  # a private rendezvous directory to remove on close

    def _guard(self, what: str):
        return engine_errors(what, self.rank, self.timeout)

    def all_to_all_form(self, call: CallState, x: Any, geometry: AllToAllGeometry) -> ExchangeRun:
        """gloo: one message per peer; NCCL (or gloo with ``pairwise`` off): pack, one
        ``all_to_all_single``, unpack where the pieces are not runs of the result."""
        if self.pairwise:
            return pairwise_form(call, x, geometry)
        g = geometry

        def run_packed(k: CallState, xt: Any, sent: Any = None) -> Any:
            send, send_shapes = pack(k, xt, g.split_dim, g.send_sizes)
            return exchange_packed(k, send, send_shapes, g.recv_shapes, g.out_shape, g.concat_dim, xt)

        return run_packed

    def pack_ahead(self, call: CallState, x: Any, split_dim: int, send_sizes: Sequence[int]) -> Callable[[], Any] | None:
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
        self, recvs: Sequence[tuple[int, torch.Tensor]], sends: Iterable[tuple[int, torch.Tensor]], what: str
    ) -> None:
        """Point-to-point messages: receive each ``(peer, buffer)`` of ``recvs``; send each one
        that ``sends`` yields, as it yields it (the caller's pack of the next piece runs while
        this one moves). Buffers are contiguous 1-D tensors (any dtype: gloo moves their bytes);
        at most one message per pair of ranks and direction, of exactly the byte length its
        receiver expects. Peers are ranks of this engine's group. The group's own ``recv`` and
        ``send`` are called directly (``dist.irecv``/``isend`` look the group up per message)."""
        group = self.group
        try:  # no context manager here: this path is per call, and entering one is not free
            works = [group.recv([buf], peer, PAIR_TAG) for peer, buf in recvs]
            for peer, buf in sends:
                works.append(group.send([buf], peer, PAIR_TAG))
            for work in works:
                work.wait()
        except _ENGINE_FAILURES as exc:
            raise engine_error(exc, what, self.rank, self.timeout) from exc

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
            dist.all_gather_single(recv, send, group=self.group)

    def allgather_bytes(self, send: Any, what: str) -> Any:
        """numpy uint8 [L] -> numpy uint8 [size, L]; used for the small check records."""
        import numpy as np

        device = "cuda" if self.name == "nccl" else "cpu"
        src = torch.from_numpy(np.ascontiguousarray(send)).to(device)
        out = torch.empty(self.size * src.numel(), dtype=torch.uint8, device=device)
        self.allgather(out, src, what)
        return out.cpu().numpy().reshape(self.size, -1)

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
        return TorchEngine(group, rank, size, self.name, self.timeout, owns_group=False)

    def barrier(self) -> None:
        with self._guard("barrier"):
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Collective: wait for every rank, then tear the group down.

        Tearing down while a peer still talks to this rank aborts gloo ("terminate called
        without an active exception"), so the barrier comes first.
        """
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
    return TorchEngine(dist.group.WORLD, dist.get_rank(), dist.get_world_size(), name, timeout, owns)
